//! The `CmBackend` trait: librdmacm's calls, one method each.

use std::net::SocketAddr;
use std::time::Duration;

use crate::error::CmError;
use crate::event::{CmEvent, ConnParam};
use crate::handle::{ChannelHandle, IdHandle};
use crate::state::IdMachine;
use crate::types::{LiveResources, PortSpace, QpCaps, WorkCompletion};

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
    /// `rdma_create_event_channel`: a channel events are retrieved from. Fails with
    /// [`CmError::NoRdmaDevice`] on a machine without RDMA devices.
    fn create_event_channel(&mut self) -> Result<ChannelHandle>;

    /// `rdma_destroy_event_channel`. Refused while ids still use the channel
    /// ([`CmError::ChannelBusy`]) or events retrieved from it are unacked.
    fn destroy_event_channel(&mut self, channel: ChannelHandle) -> Result<()>;

    /// `rdma_create_id` on `channel` (asynchronous mode) in port space `ps`.
    fn create_id(&mut self, channel: ChannelHandle, ps: PortSpace) -> Result<IdHandle>;

    /// `rdma_destroy_id`: cancels the id's outstanding work and discards its unretrieved events;
    /// a connected peer sees `DISCONNECTED`. Refused while the id has a QP
    /// ([`CmError::QpAttached`]) or unacked events ([`CmError::UnackedEvents`]).
    fn destroy_id(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_bind_addr`: binds to a local address; port 0 picks a free port.
    fn bind_addr(&mut self, id: IdHandle, addr: SocketAddr) -> Result<()>;

    /// `rdma_resolve_addr`: `ADDR_RESOLVED` or `ADDR_ERROR` follows. `src` binds first when given.
    fn resolve_addr(
        &mut self,
        id: IdHandle,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()>;

    /// `rdma_resolve_route`: `ROUTE_RESOLVED` or `ROUTE_ERROR` follows.
    fn resolve_route(&mut self, id: IdHandle, timeout: Duration) -> Result<()>;

    /// `rdma_create_qp` with backend-owned protection domain, completion queue and message
    /// buffers; returns the capabilities granted.
    fn create_qp(&mut self, id: IdHandle, caps: QpCaps) -> Result<QpCaps>;

    /// `rdma_destroy_qp`. Completions not polled yet are lost with the QP's completion queue.
    fn destroy_qp(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_listen`; a `backlog` of 0 or less means the system maximum.
    fn listen(&mut self, id: IdHandle, backlog: i32) -> Result<()>;

    /// `rdma_connect`: the peer's listener gets `CONNECT_REQUEST`; this id then gets
    /// `ESTABLISHED`, `REJECTED`, `UNREACHABLE` or `CONNECT_ERROR`.
    fn connect(&mut self, id: IdHandle, param: &ConnParam) -> Result<()>;

    /// `rdma_accept` on a child id from `CONNECT_REQUEST`; both sides then get `ESTABLISHED`.
    fn accept(&mut self, id: IdHandle, param: &ConnParam) -> Result<()>;

    /// `rdma_reject` on a child id from `CONNECT_REQUEST`; the peer gets `REJECTED` (status 28)
    /// with `private_data`. The child must still be destroyed.
    fn reject(&mut self, id: IdHandle, private_data: &[u8]) -> Result<()>;

    /// `rdma_disconnect`: the QP goes to ERR (posted work requests flush), the peer gets
    /// `DISCONNECTED`, and this id gets it when the peer disconnects too or the DREQ times out.
    fn disconnect(&mut self, id: IdHandle) -> Result<()>;

    /// `rdma_get_cm_event`, waiting at most `timeout`; `Ok(None)` when no event came in time.
    fn get_cm_event(&mut self, channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>>;

    /// Non-blocking [`get_cm_event`](CmBackend::get_cm_event): the next queued event, or
    /// `Ok(None)` at once when none is queued. A simulator runs only what is due at its current
    /// virtual instant and never moves its clock; the hardware backend reads the non-blocking
    /// channel fd once. Event loops (the async layer) wait for readiness elsewhere and call this.
    fn try_get_cm_event(&mut self, channel: ChannelHandle) -> Result<Option<CmEvent>> {
        self.get_cm_event(channel, Duration::ZERO)
    }

    /// `rdma_ack_cm_event`: gives the event back. An event of another backend is refused with
    /// [`CmError::ForeignEvent`], which hands it back so it can still be acked where it came
    /// from; one this backend never handed out with this id, type and token (forged, or
    /// rebuilt with [`CmEvent::new`]) with [`CmError::EventNotOutstanding`].
    fn ack_cm_event(&mut self, event: CmEvent) -> Result<()>;

    /// `rdma_get_local_addr`: the bound local address, if any.
    fn get_local_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;

    /// `rdma_get_peer_addr`: the destination or connected peer address, if any.
    fn get_peer_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;

    /// `ibv_post_send` of `data` on the id's QP (signalled; one completion per request).
    fn post_send(&mut self, id: IdHandle, wr_id: u64, data: &[u8]) -> Result<()>;

    /// `ibv_post_recv` of a buffer of `len` bytes on the id's QP.
    fn post_recv(&mut self, id: IdHandle, wr_id: u64, len: u32) -> Result<()>;

    /// `ibv_poll_cq` on the id's completion queue: appends up to `max` completions to `out`,
    /// waiting at most `timeout` for the first; returns how many were appended.
    fn poll_cq(
        &mut self,
        id: IdHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize>;

    /// Non-blocking [`poll_cq`](CmBackend::poll_cq): appends up to `max` completions that are
    /// already there and returns at once (never moves a simulator's clock).
    fn try_poll_cq(&mut self, id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        self.poll_cq(id, out, max, Duration::ZERO)
    }

    /// The id's legality state as this backend tracks it.
    fn id_machine(&self, id: IdHandle) -> Result<IdMachine>;

    /// What this backend still holds (channels, ids, QPs, unacked and queued events).
    fn live_resources(&self) -> LiveResources;
}
