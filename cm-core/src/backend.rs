//! The `CmBackend` trait, and what only implementations of it need.
//!
//! The trait and [`Result`] are re-exported at the crate root for applications. The rest of this
//! module is hidden from the docs: constructors that forge handles and events. Applications get
//! handles and events from a backend and never need to make them; backends (and the misuse
//! suite and fuzzers, which forge stale and foreign ones on purpose) do. It also holds the
//! storage every backend builds on, so that the backends cannot drift apart: the generational
//! [`Slab`](crate::slab::Slab) their handles index, and a QP's [`WrPool`](crate::wr_pool::WrPool) with
//! the [`post_gate`](crate::wr_pool::post_gate) that decides
//! whether a work request is refused, posted or completed flushed.

use std::net::SocketAddr;
use std::time::Duration;

use crate::async_event::AsyncEvent;
use crate::datagram::UdParam;
use crate::error::{CmError, ReturnedEvent};
use crate::event::{CmEvent, CmEventType, ConnParam};
use crate::external::QpAttr;
use crate::handle::{ChannelHandle, IdHandle, MrHandle, QpHandle, SrqHandle};
use crate::memory::{Access, MrInfo};
use crate::options::IdOption;
use crate::srq::SrqCaps;
use crate::state::{IdMachine, QpState};
use crate::types::{LiveResources, PortSpace, QpCaps, WorkCompletion};
use crate::work_request::SendWr;

/// Result of every backend call.
pub type Result<T, E = CmError> = std::result::Result<T, E>;

/// librdmacm's connection-management calls, one method per call, named after it without the
/// `rdma_` prefix, plus the small data path needed to watch a disconnect flush a QP.
///
/// Implementations: the deterministic simulator (`cm-sim`) and the hardware backend over the
/// real librdmacm (`cm-hw`). Both check every call against the same [`IdMachine`] first, so
/// misuse gets the same [`CmError`] from both, including the misuse that librdmacm itself turns
/// into a hang, a crash or a leak.
///
/// # Errors
///
/// Each method's `# Errors` names the refusals particular to it. Besides those, any call may
/// fail with:
/// * [`CmError::UnknownHandle`]: a handle never issued by this backend, issued by another
///   backend instance, or naming something destroyed since;
/// * [`CmError::WrongState`]: the id's [`IdMachine`] does not allow the call in its state
///   (after `DEVICE_REMOVAL` only `destroy_id` is legal);
/// * [`CmError::HostCrashed`] (simulator): the host crashed and has not restarted;
/// * [`CmError::Os`] (hardware): librdmacm or libibverbs answered with an errno the backend
///   did not refuse the call for beforehand.
///
/// Handles are plain values: a destroyed, unknown or foreign handle is an error
/// ([`CmError::UnknownHandle`]), never undefined behaviour. Nothing here blocks without a bound:
/// [`get_cm_event`](CmBackend::get_cm_event) and [`poll_cq`](CmBackend::poll_cq) take a timeout.
///
/// A whole connection, written once for every backend:
///
/// ```
/// use std::time::Duration;
/// use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, QpCaps, Result};
///
/// /// Waits for the next event on `ch` and checks its type; acks it and returns its id.
/// fn expect<B: CmBackend>(b: &mut B, ch: cm_core::ChannelHandle, ty: CmEventType)
///     -> Result<cm_core::IdHandle>
/// {
///     let ev = b.get_cm_event(ch, Duration::from_secs(5))?.expect("event within 5 s");
///     assert_eq!(ev.event(), ty, "{ev}");
///     let id = ev.id();
///     b.ack_cm_event(ev)?;
///     Ok(id)
/// }
///
/// fn one_connection<B: CmBackend>(server: &mut B, client: &mut B,
///     server_addr: std::net::SocketAddr) -> Result<()>
/// {
///     let t = Duration::from_secs(2);
///     let sch = server.create_event_channel()?;
///     let listener = server.create_id(sch, PortSpace::Tcp)?;
///     server.bind_addr(listener, server_addr)?;
///     server.listen(listener, 8)?;
///
///     let cch = client.create_event_channel()?;
///     let id = client.create_id(cch, PortSpace::Tcp)?;
///     client.resolve_addr(id, None, server_addr, t)?;
///     expect(client, cch, CmEventType::AddrResolved)?;
///     client.resolve_route(id, t)?;
///     expect(client, cch, CmEventType::RouteResolved)?;
///     client.create_qp(id, QpCaps::new())?;
///     client.connect(id, &ConnParam::new().with_private_data(b"hi"))?;
///
///     let child = expect(server, sch, CmEventType::ConnectRequest)?;
///     server.create_qp(child, QpCaps::new())?;
///     server.accept(child, &ConnParam::new())?;
///     expect(client, cch, CmEventType::Established)?;
///     expect(server, sch, CmEventType::Established)?;
///
///     client.disconnect(id)?;
///     expect(server, sch, CmEventType::Disconnected)?;
///     server.disconnect(child)?;
///     expect(client, cch, CmEventType::Disconnected)?;
///
///     for (b, id) in [(&mut *client, id), (&mut *server, child)] {
///         b.destroy_qp(id)?;
///         b.destroy_id(id)?;
///     }
///     server.destroy_id(listener)?;
///     client.destroy_event_channel(cch)?;
///     server.destroy_event_channel(sch)?;
///     Ok(())
/// }
/// ```
pub trait CmBackend {
    /// `rdma_create_event_channel`: a channel events are retrieved from.
    ///
    /// # Errors
    /// [`CmError::NoRdmaDevice`] on a machine without RDMA devices.
    fn create_event_channel(&mut self) -> Result<ChannelHandle>;

    /// `rdma_destroy_event_channel`.
    ///
    /// # Errors
    /// [`CmError::ChannelBusy`] while ids still use the channel; [`CmError::UnackedEvents`]
    /// while events retrieved from it are not acked.
    fn destroy_event_channel(&mut self, channel: ChannelHandle) -> Result<()>;

    /// `rdma_create_id` on `channel` (asynchronous mode) in port space `ps`.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for a channel this backend does not know.
    fn create_id(&mut self, channel: ChannelHandle, ps: PortSpace) -> Result<IdHandle>;

    /// `rdma_destroy_id`: cancels the id's outstanding work and discards its unretrieved events;
    /// a connected peer sees `DISCONNECTED`.
    ///
    /// # Errors
    /// [`CmError::QpAttached`] while the id has a QP (librdmacm would leak it);
    /// [`CmError::UnackedEvents`] while events counted against the id are not acked (librdmacm
    /// would block forever).
    fn destroy_id(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_bind_addr`: binds to a local address; port 0 picks a free port.
    ///
    /// # Errors
    /// [`CmError::AddrInUse`] when another id holds the address and port;
    /// [`CmError::AddrNotAvailable`] when the address is not local, the port conflicts with a
    /// wildcard bind or no ephemeral port is free; [`CmError::WrongState`] on an id already
    /// bound.
    fn bind_addr(&mut self, id: IdHandle, addr: SocketAddr) -> Result<()>;

    /// `rdma_resolve_addr`: `ADDR_RESOLVED` or `ADDR_ERROR` follows. `src` binds first when given.
    ///
    /// # Errors
    /// Those of [`bind_addr`](CmBackend::bind_addr) for the bind to `src` (or the implicit
    /// one); [`CmError::InvalidArgument`] when `src` and `dst` are of different families;
    /// [`CmError::WrongState`] unless the id is idle or bound. A destination that cannot be
    /// reached is no error here: it arrives as `ADDR_ERROR`.
    fn resolve_addr(
        &mut self,
        id: IdHandle,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()>;

    /// `rdma_resolve_route`: `ROUTE_RESOLVED` or `ROUTE_ERROR` follows.
    ///
    /// # Errors
    /// [`CmError::WrongState`] unless the address is resolved.
    fn resolve_route(&mut self, id: IdHandle, timeout: Duration) -> Result<()>;

    /// `rdma_create_qp` with backend-owned protection domain, completion queue and message
    /// buffers; returns the capabilities granted.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] before the id has a device (bound or resolved);
    /// [`CmError::QpExists`] when the id has one; [`CmError::InvalidArgument`] for
    /// capabilities the device cannot grant (more work requests than `max_qp_wr`, too large a
    /// buffer, ...).
    fn create_qp(&mut self, id: IdHandle, caps: QpCaps) -> Result<QpCaps>;

    /// `rdma_destroy_qp`. Completions not polled yet are lost with the QP's completion queue.
    ///
    /// # Errors
    /// [`CmError::NoQp`] when the id has no QP (librdmacm would dereference NULL);
    /// [`CmError::QpInGroups`] while the QP is attached to multicast groups (leave them first).
    fn destroy_qp(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_listen`; a `backlog` of 0 or less means the system maximum.
    ///
    /// # Errors
    /// [`CmError::WrongState`] unless the id is bound; [`CmError::AddrInUse`] when another id
    /// listens on the same address and port.
    fn listen(&mut self, id: IdHandle, backlog: i32) -> Result<()>;

    /// `rdma_connect`: the peer's listener gets `CONNECT_REQUEST`; this id then gets
    /// `ESTABLISHED`, `REJECTED`, `UNREACHABLE` or `CONNECT_ERROR`. Without a backend QP on a
    /// connected port space, `param.qp_num` names the application's own QP (an external QP,
    /// [`ConnParam::with_qp_num`]): then `CONNECT_RESPONSE` comes instead of `ESTABLISHED`, and
    /// [`establish`](CmBackend::establish) finishes the handshake.
    ///
    /// # Errors
    /// [`CmError::NoQp`] on a connected port space without a backend QP or a QP number;
    /// [`CmError::WrongState`] unless the route is resolved; [`CmError::PrivateDataTooLong`]
    /// beyond the port space's limit (56 bytes on TCP); [`CmError::InvalidArgument`] for
    /// resources above the device's maximum. A peer that refuses or does not answer is no
    /// error here: it arrives as an event.
    fn connect(&mut self, id: IdHandle, param: &ConnParam) -> Result<()>;

    /// `rdma_accept` on a child id from `CONNECT_REQUEST`; both sides then get `ESTABLISHED`.
    /// Without a backend QP, `param.qp_num` names the application's own QP (already in RTS with
    /// the attributes of [`init_qp_attr`](CmBackend::init_qp_attr)).
    ///
    /// # Errors
    /// [`CmError::WrongState`] on an id that is not a child waiting for an answer;
    /// [`CmError::NoQp`] on a connected port space's child without a QP or a QP number
    /// (librdmacm would dereference NULL); [`CmError::PrivateDataTooLong`] beyond the port space's limit.
    fn accept(&mut self, id: IdHandle, param: &ConnParam) -> Result<()>;

    /// `rdma_reject` on a child id from `CONNECT_REQUEST`; the peer gets `REJECTED` (status 28)
    /// with `private_data`. The child must still be destroyed.
    ///
    /// # Errors
    /// [`CmError::WrongState`] on an id that is not a child waiting for an answer;
    /// [`CmError::PrivateDataTooLong`] beyond the port space's limit.
    fn reject(&mut self, id: IdHandle, private_data: &[u8]) -> Result<()>;

    /// `rdma_init_qp_attr`: the attributes and mask for moving the application's own QP (an
    /// external QP, see [`QpAttr`]) to `qp_state` (INIT, RTR or RTS) for this id's connection:
    /// the remote QP number and PSNs come from the CM exchange. The backend's own QPs are moved
    /// by the backend; asking for their attributes is harmless.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] before the id has a device; [`CmError::InvalidArgument`] for
    /// RESET or ERR; [`CmError::WrongState`] where [`IdMachine::init_qp_attr`] says the kernel
    /// has nothing to give (a listener, RTR/RTS before the peer's answer was retrieved, an ended
    /// connection); [`CmError::Os`] `EINVAL` when the exchange ended before the application
    /// saw it (say, the peer went away).
    fn init_qp_attr(&mut self, id: IdHandle, qp_state: QpState) -> Result<QpAttr>;

    /// `rdma_establish`: after `CONNECT_RESPONSE` on an id connected with an external QP
    /// ([`ConnParam::with_qp_num`]) and once the application moved its QP to RTS, sends the
    /// RTU; the peer gets `ESTABLISHED`, this id no further event.
    ///
    /// # Errors
    /// [`CmError::BackendQp`] when the id has a backend QP; [`CmError::WrongState`] unless
    /// `CONNECT_RESPONSE` was retrieved on an active id; [`CmError::Os`] `EINVAL` when the peer
    /// ended the exchange meanwhile (its `REJECTED` or `UNREACHABLE` is then on the way).
    fn establish(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_disconnect`: the QP goes to ERR (posted work requests flush), the peer gets
    /// `DISCONNECTED`, and this id gets it when the peer disconnects too or the DREQ times out.
    ///
    /// # Errors
    /// [`CmError::WrongState`] on an id that is neither connected nor connecting.
    fn disconnect(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_get_cm_event`, waiting at most `timeout`; `Ok(None)` when no event came in time.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for a channel this backend does not know. A timeout is not
    /// an error.
    fn get_cm_event(&mut self, channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>>;

    /// Non-blocking [`get_cm_event`](CmBackend::get_cm_event): the next queued event, or
    /// `Ok(None)` at once when none is queued. A simulator runs only what is due at its current
    /// virtual instant and never moves its clock; the hardware backend reads the non-blocking
    /// channel fd once. Event loops (the async layer) wait for readiness elsewhere and call this.
    fn try_get_cm_event(&mut self, channel: ChannelHandle) -> Result<Option<CmEvent>> {
        self.get_cm_event(channel, Duration::ZERO)
    }

    /// [`try_get_cm_event`](CmBackend::try_get_cm_event), then `read` on the event, then
    /// [`ack_cm_event`](CmBackend::ack_cm_event): for event loops that ack every event as soon
    /// as they have read what they need of it. `Ok(None)` at once when nothing is queued;
    /// `read` cannot keep the event (it is acked by the time this returns), so a backend may
    /// hand it one that never enters its table of outstanding events. The simulator does: no
    /// token, no 300-byte copies of the event out and back in. Any other backend gets this
    /// default, the two calls librdmacm has.
    ///
    /// # Errors
    /// As [`try_get_cm_event`](CmBackend::try_get_cm_event); after `read` has run, as
    /// [`ack_cm_event`](CmBackend::ack_cm_event) (`read`'s output is then lost: a caller that
    /// must know whether it ran records that in `read`).
    fn take_cm_event<T>(
        &mut self,
        channel: ChannelHandle,
        read: impl FnOnce(&CmEvent) -> T,
    ) -> Result<Option<T>>
    where
        Self: Sized,
    {
        let Some(event) = self.try_get_cm_event(channel)? else {
            return Ok(None);
        };
        let out = read(&event);
        self.ack_cm_event(event)?;
        Ok(Some(out))
    }

    /// `rdma_ack_cm_event`: gives the event back. An event of another backend is refused with
    /// [`CmError::ForeignEvent`], which hands it back so it can still be acked where it came
    /// from.
    ///
    /// # Errors
    /// [`CmError::ForeignEvent`] for an event of another backend (handed back in the error);
    /// [`CmError::EventNotOutstanding`] for one this backend never handed out with this id,
    /// type and token (forged).
    fn ack_cm_event(&mut self, event: CmEvent) -> Result<()>;

    /// `rdma_set_option` at level `RDMA_OPTION_ID`: sets `option` on the id (see [`IdOption`]
    /// for what each does and when the kernel takes it).
    ///
    /// # Errors
    /// [`CmError::WrongState`] where the kernel refuses the option in the id's state (enabling
    /// `REUSEADDR` on a listener, disabling it or setting `AFONLY` once bound or resolving);
    /// [`CmError::InvalidArgument`] for `ACK_TIMEOUT` on a datagram id or above 31.
    fn set_option(&mut self, id: IdHandle, option: IdOption) -> Result<()>;

    /// `rdma_migrate_id`: moves the id to `channel`; its events not retrieved yet move with it,
    /// after those already queued there. A listener's later requests arrive on `channel`.
    ///
    /// # Errors
    /// [`CmError::UnackedEvents`] while events retrieved for the id are not acked (librdmacm
    /// would block until they are); [`CmError::UnknownHandle`] for an unknown id or channel.
    fn migrate_id(&mut self, id: IdHandle, channel: ChannelHandle) -> Result<()>;

    /// `rdma_get_local_addr`: the bound local address, if any.
    ///
    /// # Errors
    /// Only those every call shares (an unbound id is `Ok(None)`).
    fn get_local_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;

    /// `rdma_get_peer_addr`: the destination or connected peer address, if any.
    ///
    /// # Errors
    /// Only those every call shares (an id without a destination is `Ok(None)`).
    fn get_peer_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;

    /// `ibv_post_send` of `data` on the id's QP (signalled; one completion per request).
    ///
    /// # Errors
    /// [`CmError::NoQp`] without a QP; [`CmError::WrongQpState`] before the QP may send (RTS);
    /// [`CmError::QueueFull`] with `max_send_wr` requests outstanding;
    /// [`CmError::InvalidArgument`] for data longer than the QP's message size.
    fn post_send(&mut self, id: IdHandle, wr_id: u64, data: &[u8]) -> Result<()>;

    /// `ibv_post_recv` of a buffer of `len` bytes on the id's QP.
    ///
    /// # Errors
    /// [`CmError::NoQp`] without a QP; [`CmError::WrongQpState`] on a QP still in RESET;
    /// [`CmError::QueueFull`] with `max_recv_wr` requests outstanding;
    /// [`CmError::InvalidArgument`] for a length over the QP's message size.
    fn post_recv(&mut self, id: IdHandle, wr_id: u64, len: u32) -> Result<()>;

    /// `ibv_poll_cq` on the id's completion queue: appends up to `max` completions to `out`,
    /// waiting at most `timeout` for the first; returns how many were appended.
    ///
    /// # Errors
    /// [`CmError::NoQp`] when the id has no QP. A timeout is not an error (`Ok(0)`).
    fn poll_cq(
        &mut self,
        id: IdHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize>;

    /// Non-blocking [`poll_cq`](CmBackend::poll_cq): appends up to `max` completions that are
    /// already there and returns at once (never moves a simulator's clock).
    ///
    /// # Errors
    /// Those of [`poll_cq`](CmBackend::poll_cq).
    fn try_poll_cq(&mut self, id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        self.poll_cq(id, out, max, Duration::ZERO)
    }

    /// `ibv_post_send` of one datagram to `dest` on the id's UD QP (UDP port space; signalled,
    /// one completion). `dest` is the [`UdParam`] of the active side's `ESTABLISHED`, or a
    /// received datagram's [`UdSender::reply_to`](crate::UdSender::reply_to). Datagrams are
    /// unreliable: the send completes once it left, whether or not a receive took it (none
    /// posted, a datagram over the path MTU, a lossy link: it is dropped silently; one longer
    /// than the receive buffer fails that receive and moves the receiver's QP to ERR, as rxe
    /// does), and datagrams may arrive in any order. On hardware the send carries the
    /// sender's QP number as immediate data, which rdma-core's `udaddy` replies to.
    ///
    /// A SIDR lookup and one datagram, generic over the backend (the conformance suite runs it on
    /// the simulator and on rxe):
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, QpCaps};
    ///
    /// fn datagram<B: CmBackend>(server: &mut B, client: &mut B) -> cm_core::Result<()> {
    /// let t = Duration::from_secs(1);
    /// let sch = server.create_event_channel()?;
    /// let listener = server.create_id(sch, PortSpace::Udp)?;
    /// server.bind_addr(listener, "10.0.0.1:7174".parse().unwrap())?;
    /// server.listen(listener, 0)?;
    ///
    /// let cch = client.create_event_channel()?;
    /// let id = client.create_id(cch, PortSpace::Udp)?;
    /// client.resolve_addr(id, None, "10.0.0.1:7174".parse().unwrap(), t)?;
    /// let resolved = client.get_cm_event(cch, t)?.expect("ADDR_RESOLVED");
    /// client.ack_cm_event(resolved)?;
    /// client.resolve_route(id, t)?;
    /// let routed = client.get_cm_event(cch, t)?.expect("ROUTE_RESOLVED");
    /// client.ack_cm_event(routed)?;
    /// client.create_qp(id, QpCaps::new())?;
    /// client.connect(id, &ConnParam::new())?;                     // the SIDR request
    ///
    /// let req = server.get_cm_event(sch, t)?.unwrap();
    /// let child = req.id();
    /// server.ack_cm_event(req)?;
    /// server.create_qp(child, QpCaps::new())?;
    /// server.post_recv(child, 1, 64)?;
    /// server.accept(child, &ConnParam::new())?;                   // the SIDR reply, with its QP
    ///
    /// let est = client.get_cm_event(cch, t)?.unwrap();
    /// assert_eq!(est.event(), CmEventType::Established);
    /// let dest = *est.ud_param().expect("the server's QP");
    /// client.ack_cm_event(est)?;
    /// client.post_send_to(id, 7, &dest, b"hello")?;
    ///
    /// let mut wcs = Vec::new();
    /// server.poll_cq(child, &mut wcs, 1, t)?;
    /// assert_eq!(wcs[0].data, b"hello");
    /// let sender = wcs[0].sender.expect("a datagram names its sender");
    /// assert_eq!(sender.addr, client.get_local_addr(id)?.map(|a| a.ip()));
    /// Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`CmError::NoQp`] without a QP; [`CmError::InvalidArgument`] on a connected (RC) QP (use
    /// [`post_send`](CmBackend::post_send)) and for data longer than the QP's message size;
    /// [`CmError::QueueFull`] with `max_send_wr` requests outstanding. A send on a QP in ERR is
    /// accepted and completes with `WR_FLUSH_ERR`, as on connected QPs.
    fn post_send_to(&mut self, id: IdHandle, wr_id: u64, dest: &UdParam, data: &[u8]) -> Result<()>;

    /// `ibv_reg_mr` on the protection domain of the id's device (librdmacm's `id->pd`, which
    /// every id on the device shares): `len` zeroed bytes that the backend owns, registered with
    /// `access`. The region outlives the id: any QP on the same device may use it, and it stays
    /// until [`dereg_mr`](CmBackend::dereg_mr). Its bytes are read and written through the
    /// backend ([`read_mr`](CmBackend::read_mr), [`write_mr`](CmBackend::write_mr)); what a
    /// peer needs to address it is [`MrInfo::remote`].
    ///
    /// One-sided operations on a connection, generic over the backend (the conformance suite
    /// runs this on the simulator and on rxe):
    ///
    /// ```
    /// use cm_core::{Access, CmBackend, IdHandle, RemoteMr, SendOp, SendWr, Sge, WcOpcode, WcStatus};
    ///
    /// /// Adds 1 to the peer's counter at `counter` and returns the value it had.
    /// fn increment<B: CmBackend>(b: &mut B, id: IdHandle, counter: RemoteMr) -> cm_core::Result<u64> {
    ///     let old = b.reg_mr(id, 8, Access::LOCAL_WRITE)?;
    ///     let sge = [Sge::new(old, 0, 8)];
    ///     b.post_send_wr(id, &SendWr::new(1, SendOp::FetchAdd { remote: counter.start(), add: 1 }, &sge))?;
    ///     let mut wcs = Vec::new();
    ///     b.poll_cq(id, &mut wcs, 1, std::time::Duration::from_secs(5))?;
    ///     assert_eq!((wcs[0].opcode, wcs[0].status), (WcOpcode::FetchAdd, WcStatus::Success));
    ///     let mut value = [0; 8];
    ///     b.read_mr(old, 0, &mut value)?;
    ///     b.dereg_mr(old)?;
    ///     Ok(u64::from_ne_bytes(value))
    /// }
    /// ```
    ///
    /// # Errors
    /// [`CmError::NoDevice`] before the id is bound to a device; [`CmError::InvalidArgument`] for
    /// flags [`Access::check`] refuses or a length of 0 or above the backend's largest region.
    fn reg_mr(&mut self, id: IdHandle, len: usize, access: Access) -> Result<MrHandle>;

    /// The region's address, length, keys and access (`struct ibv_mr`'s fields).
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for a region this backend does not know (deregistered).
    fn mr_info(&self, mr: MrHandle) -> Result<MrInfo>;

    /// `ibv_dereg_mr`, then the region's memory is freed. Work that names it and has not
    /// reached it yet fails when it does, as on rxe (which deregisters a region with work in
    /// flight): a local entry with `LOC_PROT_ERR`, a peer's access with `REM_ACCESS_ERR`.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for a region this backend does not know.
    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()>;

    /// Copies `out.len()` bytes at `offset` of the region into `out`.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for an unknown region; [`CmError::InvalidArgument`] for a
    /// range outside it.
    fn read_mr(&self, mr: MrHandle, offset: u64, out: &mut [u8]) -> Result<()>;

    /// Copies `data` to `offset` of the region.
    ///
    /// # Errors
    /// As [`read_mr`](CmBackend::read_mr).
    fn write_mr(&mut self, mr: MrHandle, offset: u64, data: &[u8]) -> Result<()>;

    /// `ibv_post_send` of one work request over registered memory on the id's QP: a SEND, an
    /// RDMA WRITE (with an immediate or without), an RDMA READ or an atomic ([`SendOp`](crate::SendOp)),
    /// signalled or not, fenced or not ([`SendWr`]). The send queue completes in posting order;
    /// the peer's NIC checks the remote key and range, and a bad one fails the request with
    /// `REM_ACCESS_ERR` and moves the QP to ERR (the rest of its work flushes).
    ///
    /// # Errors
    /// Those of [`post_send`](CmBackend::post_send) (no QP, not yet RTS, a full queue); then
    /// [`CmError::InvalidArgument`] for a one-sided operation on a UD QP
    /// ([`IdMachine::post_send_wr`]), for what [`SendWr::check`] refuses (too many entries, a
    /// misshapen or unaligned atomic, too long a message, a READ or atomic without initiator
    /// depth) and what [`check_local_sge`](crate::check_local_sge) refuses of each entry (a region
    /// of another device, past its end, a destination without `LOCAL_WRITE`);
    /// [`CmError::UnknownHandle`] for an entry naming an unknown region.
    fn post_send_wr(&mut self, id: IdHandle, wr: &SendWr<'_>) -> Result<()>;

    /// `ibv_create_srq` on the protection domain of the id's device: a shared receive queue
    /// with backend-owned buffers of `caps.max_message_size` bytes; QPs made with
    /// [`create_qp_on_srq`](CmBackend::create_qp_on_srq) take their receives from it, and
    /// complete them on their own completion queues.
    ///
    /// # Errors
    /// [`CmError::NoDevice`] before the id is bound to a device; [`CmError::InvalidArgument`] for
    /// what [`SrqCaps::check`] refuses against the device.
    fn create_srq(&mut self, id: IdHandle, caps: SrqCaps) -> Result<SrqHandle>;

    /// `ibv_destroy_srq`. Receives still posted on it are lost with it.
    ///
    /// # Errors
    /// [`CmError::SrqBusy`] while QPs use it; [`CmError::UnknownHandle`] for an unknown SRQ.
    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<()>;

    /// `ibv_post_srq_recv` of a buffer of `len` bytes: the next message to any QP on the SRQ
    /// takes it, and completes on that QP's completion queue.
    ///
    /// # Errors
    /// [`CmError::QueueFull`] with `max_wr` receives outstanding (posted, or taken and not
    /// polled yet); [`CmError::InvalidArgument`] for a length over the SRQ's message size.
    fn post_srq_recv(&mut self, srq: SrqHandle, wr_id: u64, len: u32) -> Result<()>;

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: arms the limit at `limit` (0 disarms it). When a
    /// receive taken leaves fewer than `limit` posted, [`AsyncEvent::SrqLimitReached`] follows
    /// once and the limit disarms.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] for a limit above the SRQ's `max_wr`.
    fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()>;

    /// `rdma_create_qp` with `attr.srq = srq`: as [`create_qp`](CmBackend::create_qp), and the
    /// QP takes its receives from `srq` (its own receive queue is not used: `caps.max_recv_wr`
    /// is checked and ignored, and [`post_recv`](CmBackend::post_recv) on it is refused).
    ///
    /// # Errors
    /// Those of [`create_qp`](CmBackend::create_qp); [`CmError::UnknownHandle`] for an unknown
    /// SRQ; [`CmError::InvalidArgument`] for an SRQ of another device.
    fn create_qp_on_srq(&mut self, id: IdHandle, caps: QpCaps, srq: SrqHandle) -> Result<QpCaps>;

    /// `ibv_get_async_event` on every device this backend has opened, waiting at most
    /// `timeout`; `Ok(None)` when none came in time. The event is acked before it is returned.
    ///
    /// # Errors
    /// Only those every call shares. A timeout is not an error.
    fn get_async_event(&mut self, timeout: Duration) -> Result<Option<AsyncEvent>>;

    /// `rdma_join_multicast(id, group, NULL)`: asks for membership of the multicast group
    /// `group` (the port is ignored, as the kernel ignores it). `MULTICAST_JOIN` follows on the
    /// id's channel, its [`CmEvent::ud_param`](crate::CmEvent::ud_param) the group's
    /// destination ([`group_ud_param`](crate::group_ud_param): QP number
    /// [`MULTICAST_QPN`](crate::MULTICAST_QPN), the UDP Q_Key, the group's GID), or
    /// `MULTICAST_ERROR` when the group cannot be joined. Retrieving `MULTICAST_JOIN` attaches
    /// the id's QP, if it has one then (librdmacm attaches it there), so that datagrams sent to
    /// the group reach it.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, CmEventType, PortSpace, QpCaps};
    ///
    /// fn member<B: CmBackend>(b: &mut B) -> cm_core::Result<()> {
    /// let t = Duration::from_secs(1);
    /// let ch = b.create_event_channel()?;
    /// let id = b.create_id(ch, PortSpace::Udp)?;
    /// b.bind_addr(id, "10.0.0.1:0".parse().unwrap())?;
    /// b.create_qp(id, QpCaps::new())?;
    /// b.post_recv(id, 1, 64)?;
    /// let group = "239.1.2.3:0".parse().unwrap();
    /// b.join_multicast(id, group)?;
    /// let joined = b.get_cm_event(ch, t)?.expect("MULTICAST_JOIN");
    /// assert_eq!(joined.event(), CmEventType::MulticastJoin);
    /// let dest = *joined.ud_param().expect("the group");
    /// b.ack_cm_event(joined)?;
    /// b.post_send_to(id, 2, &dest, b"to all")?;    // reaches this member too
    /// b.leave_multicast(id, group)?;
    /// Ok(())
    /// }
    /// ```
    ///
    /// # Errors
    /// [`CmError::WrongState`] unless the id is of a datagram port space, bound to a device and
    /// in `ADDR_BOUND` or `ADDR_RESOLVED` (kernel: `EINVAL`); [`CmError::InvalidArgument`] for a
    /// group that is not a multicast address; [`CmError::AddrInUse`] for a group the id has
    /// joined already (refused on both backends; the kernel would make a second membership).
    fn join_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()>;

    /// `rdma_leave_multicast(id, group)`: ends the membership. The QP is detached at once and
    /// receives no more of the group's datagrams; a `MULTICAST_JOIN` or `MULTICAST_ERROR` of
    /// the group still queued is discarded (the kernel drops it). librdmacm then waits until
    /// every event of the group that was retrieved has been acked; that wait would never end
    /// for the caller's own unacked event, so it is refused instead. Destroying the id leaves
    /// its groups, as the kernel does.
    ///
    /// # Errors
    /// [`CmError::AddrNotAvailable`] for a group the id has not joined (librdmacm:
    /// `EADDRNOTAVAIL`); [`CmError::UnackedEvents`] while the group's `MULTICAST_JOIN` (or
    /// `MULTICAST_ERROR`) is retrieved and not acked.
    fn leave_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()>;

    /// The id's legality state as this backend tracks it.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`] for an id this backend does not know.
    fn id_machine(&self, id: IdHandle) -> Result<IdMachine>;

    /// What this backend still holds (channels, ids, QPs, unacked and queued events).
    fn live_resources(&self) -> LiveResources;
}

pub use crate::handle::next_backend_tag;
pub use crate::slab::{Slab, SlotRef};
pub use crate::wr_pool::{datagram_gate, post_gate, send_wr_gate, Admission, SlotUse, WrPool};

/// Makes an id handle: slot `index` at `generation` in the backend tagged `owner`.
pub const fn id_handle(owner: u32, index: u32, generation: u32) -> IdHandle {
    IdHandle::new(owner, index, generation)
}

/// Makes a memory-region handle: slot `index` at `generation` in the backend tagged `owner`.
pub const fn mr_handle(owner: u32, index: u32, generation: u32) -> MrHandle {
    MrHandle::new(owner, index, generation)
}

/// Makes a shared-receive-queue handle: slot `index` at `generation` in the backend tagged
/// `owner`.
pub const fn srq_handle(owner: u32, index: u32, generation: u32) -> SrqHandle {
    SrqHandle::new(owner, index, generation)
}

/// Makes a verbs QP handle: slot `index` at `generation` in the backend tagged `owner`.
pub const fn qp_handle(owner: u32, index: u32, generation: u32) -> QpHandle {
    QpHandle::new(owner, index, generation)
}

/// Makes a channel handle: slot `index` at `generation` in the backend tagged `owner`.
pub const fn channel_handle(owner: u32, index: u32, generation: u32) -> ChannelHandle {
    ChannelHandle::new(owner, index, generation)
}

/// Makes an event. `token` is the backend's own bookkeeping value; it checks the token again
/// when the event is acked.
pub const fn cm_event(
    id: IdHandle,
    listen_id: Option<IdHandle>,
    event: CmEventType,
    status: i32,
    param: ConnParam,
    token: u64,
) -> CmEvent {
    CmEvent::new(id, listen_id, event, status, param, token)
}

/// The same event reporting `ud` as its datagram destination ([`CmEvent::ud_param`]).
pub fn with_ud_param(mut event: CmEvent, ud: UdParam) -> CmEvent {
    event.set_ud_param(ud);
    event
}

/// Wraps an event a backend refuses to ack for [`CmError::ForeignEvent`].
pub fn returned_event(event: CmEvent) -> ReturnedEvent {
    ReturnedEvent::new(event)
}
