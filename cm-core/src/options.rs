//! Per-id options (`rdma_set_option`), synchronous ids (librdmacm's NULL-channel mode), and the
//! `rdma_getaddrinfo` / `rdma_create_ep` helpers built on them.
//!
//! * [`IdOption`] is one `RDMA_OPTION_ID_*` value with its type; [`CmBackend::set_option`] sets
//!   it, and [`IdMachine::set_option`](crate::IdMachine::set_option) says in which states the
//!   kernel takes it.
//! * [`SyncId`] is an id on a private channel whose calls wait for their own event, as
//!   librdmacm's ids created without a channel do; it works on every backend, because it is
//!   written against the trait.
//! * [`getaddrinfo`] turns a node and service into [`AddrInfo`]s, and [`SyncId::create_ep`]
//!   makes a synchronous id from one, resolved (active) or bound (passive).

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::time::Duration;

use crate::backend::{CmBackend, Result};
use crate::error::{Call, CmError};
use crate::event::{CmEvent, CmEventType, ConnParam};
use crate::handle::{ChannelHandle, IdHandle};
use crate::types::{PortSpace, QpCaps};

/// One `RDMA_OPTION_ID_*` option with its value, for [`CmBackend::set_option`].
///
/// The states in which the kernel accepts each (checked by
/// [`IdMachine::set_option`](crate::IdMachine::set_option), `EINVAL` otherwise):
///
/// | option | accepted |
/// |---|---|
/// | [`Tos`](IdOption::Tos) | in every state (it is used at route resolution and listen) |
/// | [`ReuseAddr`](IdOption::ReuseAddr)`(true)` | in every state but listening |
/// | [`ReuseAddr`](IdOption::ReuseAddr)`(false)` | only before the id is bound (idle) |
/// | [`AfOnly`](IdOption::AfOnly) | idle or bound |
/// | [`AckTimeout`](IdOption::AckTimeout) | ids of a reliable-connected port space (TCP, IB) only, values 0 to 31 |
///
/// ```
/// use cm_core::{IdOption, IdMachine, PortSpace};
///
/// let idle = IdMachine::new(PortSpace::Tcp);
/// assert!(idle.set_option(IdOption::ReuseAddr(false)).is_ok());
/// let listening = idle.listen().unwrap();
/// assert!(listening.set_option(IdOption::ReuseAddr(true)).is_err());
/// assert!(IdMachine::new(PortSpace::Udp).set_option(IdOption::AckTimeout(14)).is_err());
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum IdOption {
    /// `RDMA_OPTION_ID_TOS`: the type of service of the id's traffic (the IP header's TOS byte
    /// on RoCE, the path's traffic class on IB).
    Tos(u8),
    /// `RDMA_OPTION_ID_REUSEADDR`: the id may share its address and port with other ids that
    /// set it too (a listener still needs its address and port to itself).
    ReuseAddr(bool),
    /// `RDMA_OPTION_ID_AFONLY`: an IPv6 id binds IPv6 only, so a wildcard `[::]` bind leaves
    /// the same port free for IPv4 and an IPv6 wildcard listener takes no IPv4 requests. Without
    /// it IPv4 ids are AF-only and IPv6 ids are not (Linux's `bindv6only` 0).
    AfOnly(bool),
    /// `RDMA_OPTION_ID_ACK_TIMEOUT`: the QP's local ACK timeout, 4.096 us x 2^t; set before
    /// route resolution it also sets the path's packet lifetime to t - 1, which lengthens the IB
    /// CM's response timeouts.
    AckTimeout(u8),
}

impl IdOption {
    /// The largest [`AckTimeout`](IdOption::AckTimeout) value: the QP attribute is 5 bits.
    pub const MAX_ACK_TIMEOUT: u8 = 31;

    /// librdmacm's `RDMA_OPTION_ID_*` number (level `RDMA_OPTION_ID`, 0).
    pub const fn optname(self) -> i32 {
        match self {
            IdOption::Tos(_) => 0,
            IdOption::ReuseAddr(_) => 1,
            IdOption::AfOnly(_) => 2,
            IdOption::AckTimeout(_) => 3,
        }
    }

    /// librdmacm's name of the option.
    pub const fn name(self) -> &'static str {
        match self {
            IdOption::Tos(_) => "RDMA_OPTION_ID_TOS",
            IdOption::ReuseAddr(_) => "RDMA_OPTION_ID_REUSEADDR",
            IdOption::AfOnly(_) => "RDMA_OPTION_ID_AFONLY",
            IdOption::AckTimeout(_) => "RDMA_OPTION_ID_ACK_TIMEOUT",
        }
    }

    /// The local ACK timeout an [`AckTimeout`](IdOption::AckTimeout) value stands for:
    /// 4.096 us x 2^t.
    ///
    /// ```
    /// assert_eq!(cm_core::IdOption::ack_timeout(19).as_micros(), 2_147_483);
    /// ```
    pub const fn ack_timeout(t: u8) -> Duration {
        let shift = if t > Self::MAX_ACK_TIMEOUT {
            Self::MAX_ACK_TIMEOUT
        } else {
            t
        };
        Duration::from_nanos(4_096u64 << shift)
    }
}

impl fmt::Display for IdOption {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            IdOption::Tos(v) | IdOption::AckTimeout(v) => write!(f, "{}={v}", self.name()),
            IdOption::ReuseAddr(v) | IdOption::AfOnly(v) => write!(f, "{}={}", self.name(), u8::from(v)),
        }
    }
}

/// The bound [`SyncId::create_ep`] resolves the address and the route within, as librdmacm's
/// `rdma_create_ep` does (2000 ms each).
pub const CREATE_EP_TIMEOUT: Duration = Duration::from_millis(2000);

/// An id in librdmacm's synchronous mode: an id on a private event channel of its own, whose
/// calls that produce an event wait for that event, keep it ([`event`](SyncId::event)), and
/// turn a failure into an error ([`CmError::EventFailed`]).
///
/// librdmacm does this for ids created with a NULL channel (`ucma_complete`): the event is kept
/// in `id->event` until the next call's event replaces it (acking it) or the id is destroyed.
/// Unlike librdmacm, every wait here is bounded by the id's [`wait`](SyncId::wait) bound
/// ([`CmError::EventTimeout`] when it passes; the event may still come and is then the next
/// call's).
///
/// A `SyncId` does not hold its backend: every method takes it, so one backend can drive many
/// ids. [`destroy`](SyncId::destroy) releases everything (`rdma_destroy_ep`); a `SyncId`
/// dropped without it leaves its id, channel and kept event in the backend.
///
/// ```
/// use std::time::Duration;
/// use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, Result, SyncId};
///
/// /// Resolves `server` synchronously and connects: each call returns when its event came.
/// fn connect<B: CmBackend>(b: &mut B, server: std::net::SocketAddr) -> Result<SyncId> {
///     let mut id = SyncId::create(b, PortSpace::Tcp, Duration::from_secs(5))?;
///     id.resolve_addr(b, None, server, Duration::from_secs(2))?;
///     assert_eq!(id.event().map(|e| e.event()), Some(CmEventType::AddrResolved));
///     id.resolve_route(b, Duration::from_secs(2))?;
///     id.create_qp(b, cm_core::QpCaps::new())?;
///     id.connect(b, &ConnParam::new())?;      // ESTABLISHED, or EventFailed (ECONNREFUSED, ...)
///     Ok(id)
/// }
/// ```
#[derive(Debug)]
pub struct SyncId {
    id: IdHandle,
    channel: ChannelHandle,
    event: Option<CmEvent>,
    wait: Duration,
    /// What `rdma_create_ep` recorded on a passive id: each child from
    /// [`get_request`](SyncId::get_request) gets a QP with these capabilities.
    child_qp: Option<QpCaps>,
}

impl SyncId {
    /// `rdma_create_id` with a NULL channel: a private channel and an id on it. Every wait of
    /// the id lasts at most `wait`.
    ///
    /// # Errors
    /// Those of [`CmBackend::create_event_channel`] and [`CmBackend::create_id`].
    pub fn create<B: CmBackend + ?Sized>(b: &mut B, ps: PortSpace, wait: Duration) -> Result<SyncId> {
        let channel = b.create_event_channel()?;
        match b.create_id(channel, ps) {
            Ok(id) => Ok(SyncId {
                id,
                channel,
                event: None,
                wait,
                child_qp: None,
            }),
            Err(e) => {
                // A fresh channel with no id on it is always destroyed.
                let _ = b.destroy_event_channel(channel);
                Err(e)
            }
        }
    }

    /// `rdma_create_ep`: a synchronous id from `info` ([`getaddrinfo`]). A passive one is bound
    /// to [`AddrInfo::src`] and not listening yet; `qp` is then recorded for the children
    /// [`get_request`](SyncId::get_request) hands out. An active one has its address and route
    /// resolved (each within [`CREATE_EP_TIMEOUT`]) and, with `qp`, a QP. On any failure what
    /// was made is destroyed again.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] for an active `info` without a destination; those of the
    /// calls made ([`SyncId::resolve_addr`]'s [`CmError::EventFailed`] for `ADDR_ERROR`, ...).
    pub fn create_ep<B: CmBackend + ?Sized>(
        b: &mut B,
        info: &AddrInfo,
        qp: Option<QpCaps>,
        wait: Duration,
    ) -> Result<SyncId> {
        if !info.passive && info.dst.is_none() {
            return Err(CmError::InvalidArgument {
                call: Call::CreateEp,
                reason: "an active endpoint needs a destination address",
            });
        }
        let mut id = SyncId::create(b, info.port_space, wait)?;
        let made = if info.passive {
            id.child_qp = qp;
            match info.src {
                Some(src) => id.bind_addr(b, src),
                None => Ok(()),
            }
        } else {
            let dst = info.dst.expect("checked");
            id.resolve_addr(b, info.src, dst, CREATE_EP_TIMEOUT)
                .and_then(|()| id.resolve_route(b, CREATE_EP_TIMEOUT))
                .and_then(|()| match qp {
                    Some(caps) => id.create_qp(b, caps).map(drop),
                    None => Ok(()),
                })
        };
        match made {
            Ok(()) => Ok(id),
            Err(e) => {
                // The id's own failure is the one reported; its teardown cannot fail in a way
                // the caller could act on.
                let _ = id.destroy(b);
                Err(e)
            }
        }
    }

    /// The id, for the calls that produce no event (`get_local_addr`, `post_send`, ...).
    pub const fn id(&self) -> IdHandle {
        self.id
    }

    /// The id's private channel.
    pub const fn channel(&self) -> ChannelHandle {
        self.channel
    }

    /// The event the last waiting call got (`id->event` in librdmacm), kept until the next one.
    pub const fn event(&self) -> Option<&CmEvent> {
        self.event.as_ref()
    }

    /// How long each call waits for its event at most.
    pub const fn wait(&self) -> Duration {
        self.wait
    }

    /// Changes how long each call waits for its event at most.
    pub fn set_wait(&mut self, wait: Duration) {
        self.wait = wait;
    }

    /// Acks the kept event, if any (librdmacm does it before each wait and on destroy).
    fn ack_kept<B: CmBackend + ?Sized>(&mut self, b: &mut B) -> Result<()> {
        match self.event.take() {
            Some(ev) => b.ack_cm_event(ev),
            None => Ok(()),
        }
    }

    /// `ucma_complete`: waits for the id's next event, keeps it, and turns a failure status into
    /// an error.
    fn complete<B: CmBackend + ?Sized>(&mut self, b: &mut B, call: Call) -> Result<()> {
        self.ack_kept(b)?;
        let Some(ev) = b.get_cm_event(self.channel, self.wait)? else {
            return Err(CmError::EventTimeout {
                call,
                waited: self.wait,
            });
        };
        let (event, status) = (ev.event(), ev.status());
        self.event = Some(ev);
        if status != 0 || event == CmEventType::Rejected {
            return Err(CmError::EventFailed { call, event, status });
        }
        Ok(())
    }

    /// [`CmBackend::bind_addr`] (no event; returns at once).
    ///
    /// # Errors
    /// Those of [`CmBackend::bind_addr`].
    pub fn bind_addr<B: CmBackend + ?Sized>(&mut self, b: &mut B, addr: SocketAddr) -> Result<()> {
        b.bind_addr(self.id, addr)
    }

    /// [`CmBackend::resolve_addr`], returning once `ADDR_RESOLVED` or `ADDR_ERROR` came.
    ///
    /// # Errors
    /// Those of [`CmBackend::resolve_addr`]; [`CmError::EventFailed`] for `ADDR_ERROR`;
    /// [`CmError::EventTimeout`] when no event came within the id's bound.
    pub fn resolve_addr<B: CmBackend + ?Sized>(
        &mut self,
        b: &mut B,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        b.resolve_addr(self.id, src, dst, timeout)?;
        self.complete(b, Call::ResolveAddr)
    }

    /// [`CmBackend::resolve_route`], returning once `ROUTE_RESOLVED` or `ROUTE_ERROR` came.
    ///
    /// # Errors
    /// Those of [`CmBackend::resolve_route`]; [`CmError::EventFailed`] for `ROUTE_ERROR`;
    /// [`CmError::EventTimeout`] when no event came within the id's bound.
    pub fn resolve_route<B: CmBackend + ?Sized>(&mut self, b: &mut B, timeout: Duration) -> Result<()> {
        b.resolve_route(self.id, timeout)?;
        self.complete(b, Call::ResolveRoute)
    }

    /// [`CmBackend::create_qp`] (no event).
    ///
    /// # Errors
    /// Those of [`CmBackend::create_qp`].
    pub fn create_qp<B: CmBackend + ?Sized>(&mut self, b: &mut B, caps: QpCaps) -> Result<QpCaps> {
        b.create_qp(self.id, caps)
    }

    /// [`CmBackend::listen`] (no event; requests are taken with
    /// [`get_request`](SyncId::get_request)).
    ///
    /// # Errors
    /// Those of [`CmBackend::listen`].
    pub fn listen<B: CmBackend + ?Sized>(&mut self, b: &mut B, backlog: i32) -> Result<()> {
        b.listen(self.id, backlog)
    }

    /// `rdma_get_request`: waits for the next connection request on this listener and returns
    /// its child, itself synchronous (moved to a private channel of its own with
    /// [`CmBackend::migrate_id`]) and keeping the `CONNECT_REQUEST` (its private data) until
    /// its next call. A child of an id from [`create_ep`](SyncId::create_ep) with QP
    /// capabilities gets a QP.
    ///
    /// # Errors
    /// [`CmError::WrongState`] on an id that is not listening; [`CmError::EventTimeout`] when no
    /// request came within the bound; [`CmError::EventFailed`] for a failure event;
    /// [`CmError::InvalidArgument`] when the next event is no request (it is kept, as
    /// librdmacm keeps it in `listen->event`).
    pub fn get_request<B: CmBackend + ?Sized>(&mut self, b: &mut B) -> Result<SyncId> {
        let m = b.id_machine(self.id)?;
        if m.state() != crate::IdState::Listen {
            return Err(CmError::WrongState {
                call: Call::GetRequest,
                state: m.state(),
                expected: "RDMA_CM_LISTEN",
            });
        }
        self.complete(b, Call::GetRequest)?;
        let ev = self.event.take().expect("complete keeps the event");
        if ev.event() != CmEventType::ConnectRequest {
            self.event = Some(ev);
            return Err(CmError::InvalidArgument {
                call: Call::GetRequest,
                reason: "the listener's next event is not CONNECT_REQUEST",
            });
        }
        let child_id = ev.id();
        let mut child = SyncId {
            id: child_id,
            channel: self.channel,
            event: Some(ev),
            wait: self.wait,
            child_qp: None,
        };
        let moved = b
            .create_event_channel()
            .and_then(|ch| match b.migrate_id(child_id, ch) {
                Ok(()) => {
                    child.channel = ch;
                    Ok(())
                }
                Err(e) => {
                    let _ = b.destroy_event_channel(ch);
                    Err(e)
                }
            });
        let qp = match (moved, self.child_qp) {
            (Ok(()), Some(caps)) => b.create_qp(child_id, caps).map(drop),
            (moved, _) => moved,
        };
        match qp {
            Ok(()) => Ok(child),
            Err(e) => {
                // As librdmacm does when the child cannot be set up: the request is refused.
                let _ = b.reject(child_id, &[]);
                if child.channel == self.channel {
                    // Not moved: the child stays on the listener's channel, so its teardown
                    // must leave that channel alone.
                    let _ = child.ack_kept(b);
                    let _ = b.destroy_id(child_id);
                } else {
                    let _ = child.destroy(b);
                }
                Err(e)
            }
        }
    }

    /// [`CmBackend::connect`], returning once `ESTABLISHED` (or a failure) came.
    ///
    /// # Errors
    /// Those of [`CmBackend::connect`]; [`CmError::EventFailed`] for `REJECTED`
    /// (errno `ECONNREFUSED`), `UNREACHABLE`, `CONNECT_ERROR`; [`CmError::EventTimeout`].
    pub fn connect<B: CmBackend + ?Sized>(&mut self, b: &mut B, param: &ConnParam) -> Result<()> {
        b.connect(self.id, param)?;
        self.complete(b, Call::Connect)
    }

    /// [`CmBackend::accept`]; on a connected port space it returns once `ESTABLISHED` (or a
    /// failure) came, on a datagram one at once, as librdmacm does.
    ///
    /// # Errors
    /// Those of [`CmBackend::accept`]; [`CmError::EventFailed`]; [`CmError::EventTimeout`].
    pub fn accept<B: CmBackend + ?Sized>(&mut self, b: &mut B, param: &ConnParam) -> Result<()> {
        b.accept(self.id, param)?;
        if b.id_machine(self.id)?.port_space().is_connected() {
            self.complete(b, Call::Accept)
        } else {
            Ok(())
        }
    }

    /// [`CmBackend::reject`] (no event; returns at once).
    ///
    /// # Errors
    /// Those of [`CmBackend::reject`].
    pub fn reject<B: CmBackend + ?Sized>(&mut self, b: &mut B, private_data: &[u8]) -> Result<()> {
        b.reject(self.id, private_data)
    }

    /// [`CmBackend::disconnect`], returning once this id's `DISCONNECTED` came (the peer
    /// answered, or the IB CM gave up).
    ///
    /// # Errors
    /// Those of [`CmBackend::disconnect`]; [`CmError::EventTimeout`].
    pub fn disconnect<B: CmBackend + ?Sized>(&mut self, b: &mut B) -> Result<()> {
        b.disconnect(self.id)?;
        self.complete(b, Call::Disconnect)
    }

    /// [`CmBackend::set_option`] (no event).
    ///
    /// # Errors
    /// Those of [`CmBackend::set_option`].
    pub fn set_option<B: CmBackend + ?Sized>(&mut self, b: &mut B, option: IdOption) -> Result<()> {
        b.set_option(self.id, option)
    }

    /// Waits for the id's next event whatever it is (a `DISCONNECTED` the peer started, ...),
    /// keeps it and returns its type.
    ///
    /// # Errors
    /// [`CmError::EventFailed`] for a failure; [`CmError::EventTimeout`] when none came in time.
    pub fn next_event<B: CmBackend + ?Sized>(&mut self, b: &mut B) -> Result<CmEventType> {
        self.complete(b, Call::GetCmEvent)?;
        Ok(self.event.as_ref().expect("complete keeps the event").event())
    }

    /// `rdma_destroy_ep`: acks the kept event, destroys the QP if there is one, the id and the
    /// private channel.
    ///
    /// # Errors
    /// Those of the calls made; on an error the rest is not destroyed and `self` is handed
    /// back with it, to try again (for example after acking events of the id retrieved
    /// elsewhere).
    #[allow(clippy::result_large_err)]
    pub fn destroy<B: CmBackend + ?Sized>(mut self, b: &mut B) -> std::result::Result<(), (SyncId, CmError)> {
        let step = |s: &mut SyncId, b: &mut B| -> Result<()> {
            s.ack_kept(b)?;
            if b.id_machine(s.id)?.qp().is_some() {
                b.destroy_qp(s.id)?;
            }
            b.destroy_id(s.id)?;
            b.destroy_event_channel(s.channel)
        };
        match step(&mut self, b) {
            Ok(()) => Ok(()),
            Err(CmError::UnknownHandle { .. }) if b.id_machine(self.id).is_err() => {
                // The id is gone already (a step before succeeded): only the channel is left.
                b.destroy_event_channel(self.channel).map_err(|e| (self, e))
            }
            Err(e) => Err((self, e)),
        }
    }
}

/// Hints for [`getaddrinfo`] (`struct rdma_addrinfo` hints).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrHints {
    /// `RAI_PASSIVE`: the node is the local address to listen on (none: the wildcard).
    pub passive: bool,
    /// `ai_port_space` (TCP unless given).
    pub port_space: PortSpace,
    /// `ai_family`: only addresses of this family (`AF_INET` false, `AF_INET6` true), or any.
    pub ipv6: Option<bool>,
}

impl Default for AddrHints {
    fn default() -> Self {
        AddrHints {
            passive: false,
            port_space: PortSpace::Tcp,
            ipv6: None,
        }
    }
}

/// One answer of [`getaddrinfo`] (`struct rdma_addrinfo`): addresses and a port space, what
/// [`SyncId::create_ep`] needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AddrInfo {
    /// `RAI_PASSIVE` was asked for: `src` is the address to listen on.
    pub passive: bool,
    /// The port space the id gets.
    pub port_space: PortSpace,
    /// `ai_src_addr`: where to bind (passive) or resolve from (active), if anywhere.
    pub src: Option<SocketAddr>,
    /// `ai_dst_addr`: the peer (active only).
    pub dst: Option<SocketAddr>,
}

/// `rdma_getaddrinfo` for numeric addresses: `node` (an IPv4 or IPv6 literal; none: the
/// wildcard for a passive lookup) and `service` (a port number; none: 0) become the
/// [`AddrInfo`] of the hints' port space: the source of a passive lookup, the destination of an
/// active one.
///
/// Host names are refused rather than resolved: name resolution has no bound the caller
/// controls, and the simulator has no resolver (a departure from librdmacm, which asks
/// `getaddrinfo(3)`).
///
/// ```
/// use cm_core::{getaddrinfo, AddrHints, PortSpace};
///
/// let active = getaddrinfo(Some("10.0.0.1"), Some("7471"), &AddrHints::default()).unwrap();
/// assert_eq!(active[0].dst, Some("10.0.0.1:7471".parse().unwrap()));
/// let passive = AddrHints { passive: true, port_space: PortSpace::Udp, ipv6: None };
/// let listen = getaddrinfo(None, Some("7471"), &passive).unwrap();
/// assert_eq!(listen[0].src, Some("0.0.0.0:7471".parse().unwrap()));
/// ```
///
/// # Errors
/// [`CmError::InvalidArgument`] with neither node nor service, a node that is not an address
/// literal, a service that is not a port number, or a node of another family than the hints
/// ask for.
pub fn getaddrinfo(node: Option<&str>, service: Option<&str>, hints: &AddrHints) -> Result<Vec<AddrInfo>> {
    let bad = |reason| CmError::InvalidArgument {
        call: Call::GetAddrInfo,
        reason,
    };
    if node.is_none() && service.is_none() {
        return Err(bad("neither a node nor a service"));
    }
    let port = match service {
        Some(s) => s
            .parse::<u16>()
            .map_err(|_| bad("the service is not a port number"))?,
        None => 0,
    };
    let ip = match node {
        Some(n) => n
            .trim_start_matches('[')
            .trim_end_matches(']')
            .parse::<IpAddr>()
            .map_err(|_| bad("the node is not a numeric address (host names are not resolved)"))?,
        None if !hints.passive => IpAddr::V4(Ipv4Addr::LOCALHOST),
        None if hints.ipv6 == Some(true) => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
        None => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
    };
    if hints.ipv6.is_some_and(|v6| v6 != ip.is_ipv6()) {
        return Err(bad("the node's family is not the one the hints ask for"));
    }
    let addr = SocketAddr::new(ip, port);
    Ok(vec![AddrInfo {
        passive: hints.passive,
        port_space: hints.port_space,
        src: hints.passive.then_some(addr),
        dst: (!hints.passive).then_some(addr),
    }])
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::error::errno;

    #[test]
    fn option_numbers_and_names_are_librdmacms() {
        let all = [
            (IdOption::Tos(0), 0, "RDMA_OPTION_ID_TOS"),
            (IdOption::ReuseAddr(true), 1, "RDMA_OPTION_ID_REUSEADDR"),
            (IdOption::AfOnly(true), 2, "RDMA_OPTION_ID_AFONLY"),
            (IdOption::AckTimeout(14), 3, "RDMA_OPTION_ID_ACK_TIMEOUT"),
        ];
        for (opt, n, name) in all {
            assert_eq!((opt.optname(), opt.name()), (n, name));
        }
        assert_eq!(IdOption::AfOnly(true).to_string(), "RDMA_OPTION_ID_AFONLY=1");
    }

    #[test]
    fn ack_timeout_doubles_per_step_and_stops_at_the_fields_width() {
        assert_eq!(IdOption::ack_timeout(0), Duration::from_nanos(4_096));
        assert_eq!(IdOption::ack_timeout(10), Duration::from_nanos(4_096 << 10));
        assert_eq!(IdOption::ack_timeout(200), IdOption::ack_timeout(31));
    }

    #[test]
    fn getaddrinfo_fills_the_source_when_passive_and_the_destination_otherwise() {
        let v6 = getaddrinfo(Some("[fd00::1]"), Some("7471"), &AddrHints::default()).unwrap();
        assert_eq!(v6[0].dst, Some("[fd00::1]:7471".parse().unwrap()));
        assert_eq!(v6[0].src, None);
        let hints = AddrHints {
            passive: true,
            ipv6: Some(true),
            ..AddrHints::default()
        };
        let any6 = getaddrinfo(None, Some("1"), &hints).unwrap();
        assert_eq!(any6[0].src, Some("[::]:1".parse().unwrap()));
        assert!(any6[0].passive);
    }

    #[test]
    fn getaddrinfo_refuses_names_bad_ports_nothing_and_the_wrong_family() {
        let h = AddrHints::default();
        for (node, service) in [
            (Some("example.org"), Some("1")),
            (Some("10.0.0.1"), Some("http")),
            (Some("10.0.0.1"), Some("65536")),
            (None, None),
        ] {
            let err = getaddrinfo(node, service, &h).unwrap_err();
            assert_eq!(err.errno(), errno::EINVAL, "{node:?} {service:?}: {err}");
        }
        let v4_only = AddrHints {
            ipv6: Some(false),
            ..h
        };
        assert!(getaddrinfo(Some("::1"), None, &v4_only).is_err());
    }

    #[test]
    fn failure_events_carry_librdmacms_errno() {
        let failed = |event, status| CmError::EventFailed {
            call: Call::Connect,
            event,
            status,
        };
        assert_eq!(failed(CmEventType::Rejected, 28).errno(), errno::ECONNREFUSED);
        assert_eq!(failed(CmEventType::Unreachable, -110).errno(), errno::ETIMEDOUT);
        assert_eq!(failed(CmEventType::Unreachable, 2).errno(), 2);
        let timeout = CmError::EventTimeout {
            call: Call::ResolveAddr,
            waited: Duration::from_secs(1),
        };
        assert_eq!(timeout.errno(), errno::ETIMEDOUT);
    }
}
