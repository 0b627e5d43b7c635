//! The id and QP state machines, as pure code: no I/O, no clock, no allocation.
//!
//! [`IdMachine`] holds everything about one id that decides whether a call is legal: the kernel
//! state of `enum rdma_cm_state`, the role (active, passive child, listener), how far the
//! connection handshake has got, whether the id has a device and a QP (and the QP's state), and
//! how many of its events were retrieved but not acked. Every backend keeps one per id and asks it
//! before acting, so both backends refuse the same misuse with the same [`CmError`].
//!
//! Each call method returns the machine *after* the call, or the error; it never changes `self`.
//! A backend performs the call's real work only when the check passed, and stores the returned
//! machine only when the work succeeded:
//!
//! ```
//! use cm_core::{IdMachine, IdState, PortSpace};
//!
//! let id = IdMachine::new(PortSpace::Tcp);
//! let bound = id.bind_addr(false).unwrap();
//! assert_eq!(bound.state(), IdState::AddrBound);
//! // Connecting before the route is resolved is refused, and names the call and the state.
//! let err = bound.connect(0).unwrap_err();
//! assert_eq!(err.to_string(), "rdma_connect on an id in state RDMA_CM_ADDR_BOUND \
//!     (needs RDMA_CM_ROUTE_RESOLVED (ROUTE_RESOLVED retrieved))");
//! ```
//!
//! State follows what the application has *observed* (the crate docs state the rule, for
//! rustdoc readers).

use std::fmt;

use crate::error::{Call, CmError};
use crate::event::CmEventType;
use crate::types::{PortSpace, PrivateDataSlot};

/// `enum rdma_cm_state` of the kernel's `cma.c`.
///
/// `#[non_exhaustive]`: newer kernels add states (`ADDRINFO_QUERY`, `ADDRINFO_RESOLVED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum IdState {
    /// Created, nothing bound.
    Idle,
    /// Address resolution in progress.
    AddrQuery,
    /// Address resolved; the id has a device.
    AddrResolved,
    /// Route resolution in progress.
    RouteQuery,
    /// Route resolved; ready to connect.
    RouteResolved,
    /// Connecting, connected, or a connection attempt failed (the kernel keeps `CONNECT` after
    /// `REJECTED` and `UNREACHABLE`: a new id is needed to try again).
    Connect,
    /// Disconnected (`DISCONNECTED` was delivered).
    Disconnect,
    /// Bound to a local address.
    AddrBound,
    /// Listening.
    Listen,
    /// The device went away; only destroy is legal.
    DeviceRemoval,
    /// Being destroyed.
    Destroying,
}

impl IdState {
    /// The kernel's `RDMA_CM_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            IdState::Idle => "RDMA_CM_IDLE",
            IdState::AddrQuery => "RDMA_CM_ADDR_QUERY",
            IdState::AddrResolved => "RDMA_CM_ADDR_RESOLVED",
            IdState::RouteQuery => "RDMA_CM_ROUTE_QUERY",
            IdState::RouteResolved => "RDMA_CM_ROUTE_RESOLVED",
            IdState::Connect => "RDMA_CM_CONNECT",
            IdState::Disconnect => "RDMA_CM_DISCONNECT",
            IdState::AddrBound => "RDMA_CM_ADDR_BOUND",
            IdState::Listen => "RDMA_CM_LISTEN",
            IdState::DeviceRemoval => "RDMA_CM_DEVICE_REMOVAL",
            IdState::Destroying => "RDMA_CM_DESTROYING",
        }
    }
}

impl fmt::Display for IdState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// `enum ibv_qp_state`, the states a CM-managed QP goes through.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum QpState {
    /// Just created by verbs; `rdma_create_qp` moves it on at once.
    Reset,
    /// Initialised: receives may be posted.
    Init,
    /// Ready to receive.
    Rtr,
    /// Ready to send.
    Rts,
    /// Error: every posted and every newly posted work request completes with `WR_FLUSH_ERR`.
    Err,
}

impl QpState {
    /// The `IBV_QPS_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            QpState::Reset => "IBV_QPS_RESET",
            QpState::Init => "IBV_QPS_INIT",
            QpState::Rtr => "IBV_QPS_RTR",
            QpState::Rts => "IBV_QPS_RTS",
            QpState::Err => "IBV_QPS_ERR",
        }
    }

    /// Whether `ibv_modify_qp` may move a QP from `self` to `to` (the IB spec's RC transitions;
    /// any state may go to RESET or ERR, and ERR leaves only to RESET).
    pub const fn can_modify_to(self, to: QpState) -> bool {
        use QpState::*;
        matches!(
            (self, to),
            (_, Reset) | (_, Err) | (Reset, Init) | (Init, Init) | (Init, Rtr) | (Rtr, Rts) | (Rts, Rts)
        )
    }

    /// Whether a send may be posted (RTS; in ERR it is accepted and completes flushed).
    pub const fn can_post_send(self) -> bool {
        matches!(self, QpState::Rts | QpState::Err)
    }

    /// Whether a receive may be posted (any state but RESET; in ERR it completes flushed).
    pub const fn can_post_recv(self) -> bool {
        !matches!(self, QpState::Reset)
    }
}

impl fmt::Display for QpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// What an id is used for; decided by the first call that commits it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Role {
    /// Not committed yet.
    Unassigned,
    /// Makes outgoing connections (`rdma_connect`).
    Active,
    /// A child id made for an incoming request (`CONNECT_REQUEST`).
    Passive,
    /// Listens (`rdma_listen`).
    Listener,
}

/// How far the connection handshake of an id in `RDMA_CM_CONNECT`/`DISCONNECT` has got, as
/// the application has observed it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ConnPhase {
    /// No connection attempt.
    None,
    /// Active: `rdma_connect` sent the request; no answer retrieved yet.
    Connecting,
    /// Active without a QP: `CONNECT_RESPONSE` retrieved.
    Responded,
    /// Passive: `CONNECT_REQUEST` retrieved; neither accepted nor rejected.
    Requested,
    /// Passive: accepted; `ESTABLISHED` not retrieved yet.
    Accepted,
    /// Passive: rejected.
    Rejected,
    /// `ESTABLISHED` retrieved.
    Established,
    /// `REJECTED`, `UNREACHABLE` or `CONNECT_ERROR` retrieved.
    Failed,
}

/// Why an event is not legal for an id in its current state (the backend or the test that
/// found it has a bug).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IllegalEvent {
    /// The event.
    pub event: CmEventType,
    /// The id's state.
    pub state: IdState,
    /// The id's handshake phase.
    pub phase: ConnPhase,
}

impl fmt::Display for IllegalEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} is not legal for an id in {} ({:?})",
            self.event, self.state, self.phase
        )
    }
}

impl std::error::Error for IllegalEvent {}

/// The legality state of one id and its QP: which calls and events are legal in which state.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct IdMachine {
    state: IdState,
    ps: PortSpace,
    role: Role,
    phase: ConnPhase,
    device: bool,
    qp: Option<QpState>,
    unacked: u32,
    /// The device went away ([`device_removed`](IdMachine::device_removed)) and the
    /// `DEVICE_REMOVAL` event announcing it has not been retrieved yet.
    removal_pending: bool,
    /// The id connected or accepted with the application's own QP (no backend QP).
    external: bool,
    /// The id's QP takes its receives from a shared receive queue.
    srq: bool,
}

type Step = Result<IdMachine, CmError>;

impl IdMachine {
    /// A new id (`rdma_create_id`): `RDMA_CM_IDLE`, no device, no QP.
    pub const fn new(ps: PortSpace) -> Self {
        IdMachine {
            state: IdState::Idle,
            ps,
            role: Role::Unassigned,
            phase: ConnPhase::None,
            device: false,
            qp: None,
            unacked: 0,
            removal_pending: false,
            external: false,
            srq: false,
        }
    }

    /// The child id a retrieved `CONNECT_REQUEST` hands out: `RDMA_CM_CONNECT`, bound to the
    /// listener's device, waiting for accept or reject.
    pub const fn new_child(ps: PortSpace) -> Self {
        IdMachine {
            state: IdState::Connect,
            ps,
            role: Role::Passive,
            phase: ConnPhase::Requested,
            device: true,
            qp: None,
            unacked: 0,
            removal_pending: false,
            external: false,
            srq: false,
        }
    }

    /// The machine a backend keeps beside a verbs QP that no id owns
    /// ([`VerbsQp`](crate::VerbsQp)), so that the data path's checks (the post gates, which
    /// QPs may send and receive) read it as they read an id's: an idle id of `ps` whose QP is
    /// in `qp`, the data path's view of the verbs state
    /// ([`VerbsQpState::data_path`](crate::VerbsQpState::data_path)). No CM call takes it.
    pub const fn for_verbs_qp(ps: PortSpace, qp: QpState) -> Self {
        IdMachine {
            qp: Some(qp),
            device: true,
            ..IdMachine::new(ps)
        }
    }

    /// [`for_verbs_qp`](Self::for_verbs_qp) of a verbs QP made with `ibv_qp_init_attr.srq`:
    /// it takes its receives from the shared receive queue, so posting on the QP itself is
    /// refused (rxe's `post_recv`: `EINVAL`).
    pub const fn for_verbs_qp_on_srq(ps: PortSpace, qp: QpState) -> Self {
        IdMachine {
            srq: true,
            ..IdMachine::for_verbs_qp(ps, qp)
        }
    }

    /// The kernel state.
    pub const fn state(&self) -> IdState {
        self.state
    }

    /// The port space.
    pub const fn port_space(&self) -> PortSpace {
        self.ps
    }

    /// The role.
    pub const fn role(&self) -> Role {
        self.role
    }

    /// The handshake phase.
    pub const fn phase(&self) -> ConnPhase {
        self.phase
    }

    /// Whether the id is bound to a device.
    pub const fn has_device(&self) -> bool {
        self.device
    }

    /// The QP's state, if the id has one.
    pub const fn qp(&self) -> Option<QpState> {
        self.qp
    }

    /// Events retrieved and not acked that count against this id.
    pub const fn unacked(&self) -> u32 {
        self.unacked
    }

    /// Whether the id connected or accepted with an external QP (the application's own, named
    /// by [`ConnParam::qp_num`](crate::ConnParam::qp_num)) instead of a backend QP.
    pub const fn is_external(&self) -> bool {
        self.external
    }

    /// Whether the id's QP takes its receives from a shared receive queue
    /// ([`create_qp_on_srq`](Self::create_qp_on_srq)).
    pub const fn uses_srq(&self) -> bool {
        self.srq
    }

    /// Whether `connect` or `accept` with `param` uses an external QP: a connected port space,
    /// no backend QP on the id, and a QP number in `param`. Backends then call
    /// [`connect_external`](Self::connect_external) or [`accept_external`](Self::accept_external).
    pub const fn uses_external_qp(&self, param: &crate::ConnParam) -> bool {
        self.ps.is_connected() && self.qp.is_none() && param.qp_num != 0
    }

    fn wrong(&self, call: Call, expected: &'static str) -> CmError {
        CmError::WrongState {
            call,
            state: self.state,
            expected,
        }
    }

    fn alive(&self, call: Call) -> Result<(), CmError> {
        match self.state {
            IdState::DeviceRemoval | IdState::Destroying => {
                Err(self.wrong(call, "a live device (after DEVICE_REMOVAL only destroy is legal)"))
            }
            _ => Ok(()),
        }
    }

    fn check_private_data(&self, call: Call, slot: PrivateDataSlot, len: usize) -> Result<(), CmError> {
        let max = self.ps.private_data_limit(slot);
        if len > max {
            return Err(CmError::PrivateDataTooLong { call, len, max });
        }
        Ok(())
    }

    /// `rdma_bind_addr`; `wildcard` when the address is `0.0.0.0`/`::` (no device is bound then).
    pub fn bind_addr(&self, wildcard: bool) -> Step {
        if self.state != IdState::Idle {
            return Err(self.wrong(Call::BindAddr, "RDMA_CM_IDLE"));
        }
        Ok(IdMachine {
            state: IdState::AddrBound,
            device: !wildcard,
            ..*self
        })
    }

    /// `rdma_resolve_addr` (binds implicitly from `RDMA_CM_IDLE`).
    pub fn resolve_addr(&self) -> Step {
        if !matches!(self.state, IdState::Idle | IdState::AddrBound) {
            return Err(self.wrong(Call::ResolveAddr, "RDMA_CM_IDLE or RDMA_CM_ADDR_BOUND"));
        }
        Ok(IdMachine {
            state: IdState::AddrQuery,
            role: Role::Active,
            ..*self
        })
    }

    /// `rdma_resolve_route`. librdmacm dereferences the id's device unconditionally here, so an
    /// id without one would crash it; the state check refuses that first.
    pub fn resolve_route(&self) -> Step {
        if self.state != IdState::AddrResolved {
            return Err(self.wrong(
                Call::ResolveRoute,
                "RDMA_CM_ADDR_RESOLVED (ADDR_RESOLVED retrieved)",
            ));
        }
        if !self.device {
            return Err(CmError::NoDevice {
                call: Call::ResolveRoute,
            });
        }
        Ok(IdMachine {
            state: IdState::RouteQuery,
            ..*self
        })
    }

    /// `rdma_listen` (binds implicitly from `RDMA_CM_IDLE`).
    pub fn listen(&self) -> Step {
        if !matches!(self.state, IdState::Idle | IdState::AddrBound) {
            return Err(self.wrong(Call::Listen, "RDMA_CM_IDLE or RDMA_CM_ADDR_BOUND"));
        }
        Ok(IdMachine {
            state: IdState::Listen,
            role: Role::Listener,
            ..*self
        })
    }

    /// `rdma_create_qp`: connected port spaces get a QP in INIT (it reaches RTR/RTS during the
    /// handshake); datagram port spaces get one in RTS at once, as librdmacm does.
    pub fn create_qp(&self) -> Step {
        self.alive(Call::CreateQp)?;
        if self.external {
            return Err(CmError::ExternalQp { call: Call::CreateQp });
        }
        // librdmacm takes the QP's INIT attributes from the kernel, whose IB CM gives them for a
        // connected id only while its connection is being made or is up (EINVAL on a listener,
        // after a failed attempt, after a disconnect). Datagram ids take them without the CM.
        let cm_gives_attributes = match self.state {
            IdState::Listen | IdState::Disconnect => false,
            IdState::Connect => matches!(
                self.phase,
                ConnPhase::Connecting
                    | ConnPhase::Responded
                    | ConnPhase::Requested
                    | ConnPhase::Accepted
                    | ConnPhase::Established
            ),
            _ => true,
        };
        if self.ps.is_connected() && !cm_gives_attributes {
            return Err(self.wrong(
                Call::CreateQp,
                "an id that is not listening and whose connection has not ended",
            ));
        }
        if !self.device {
            return Err(CmError::NoDevice { call: Call::CreateQp });
        }
        if self.qp.is_some() {
            return Err(CmError::QpExists);
        }
        let qp = if self.ps.is_connected() {
            QpState::Init
        } else {
            QpState::Rts
        };
        Ok(IdMachine {
            qp: Some(qp),
            ..*self
        })
    }

    /// `rdma_create_qp` with `attr.srq` set: as [`create_qp`](Self::create_qp), and the QP
    /// takes its receives from the SRQ (posting receives on the QP itself is refused).
    pub fn create_qp_on_srq(&self) -> Step {
        let m = self.create_qp()?;
        Ok(IdMachine { srq: true, ..m })
    }

    /// `rdma_destroy_qp` (librdmacm passes a NULL QP to verbs when there is none).
    pub fn destroy_qp(&self) -> Step {
        if self.qp.is_none() {
            return Err(CmError::NoQp {
                call: Call::DestroyQp,
            });
        }
        Ok(IdMachine {
            qp: None,
            srq: false,
            ..*self
        })
    }

    /// `rdma_connect` with `private_data_len` bytes of private data and no external QP:
    /// connected port spaces need a backend QP on the id (for an external one see
    /// [`connect_external`](Self::connect_external)).
    pub fn connect(&self, private_data_len: usize) -> Step {
        if self.state != IdState::RouteResolved {
            return Err(self.wrong(Call::Connect, "RDMA_CM_ROUTE_RESOLVED (ROUTE_RESOLVED retrieved)"));
        }
        if self.ps.is_connected() && self.qp.is_none() {
            return Err(CmError::NoQp { call: Call::Connect });
        }
        self.connect_checked(private_data_len)
    }

    /// `rdma_connect` without a backend QP, with the application's own QP number in the
    /// parameters: the REQ carries that number and the id later gets `CONNECT_RESPONSE`, after
    /// which the application moves its QP to RTR and RTS and calls
    /// [`establish`](Self::establish).
    ///
    /// ```
    /// use cm_core::{CmEventType, ConnPhase, IdMachine, PortSpace};
    ///
    /// let m = IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap();
    /// let m = m.on_event(CmEventType::AddrResolved).unwrap().on_ack().unwrap();
    /// let m = m.resolve_route().unwrap().on_event(CmEventType::RouteResolved).unwrap();
    /// let m = m.on_ack().unwrap().connect_external(0).unwrap();
    /// assert_eq!(m.connect_response_outcome(), CmEventType::ConnectResponse);
    /// let m = m.on_event(CmEventType::ConnectResponse).unwrap().on_ack().unwrap();
    /// assert_eq!(m.establish().unwrap().phase(), ConnPhase::Established);
    /// ```
    pub fn connect_external(&self, private_data_len: usize) -> Step {
        if self.qp.is_some() {
            return Err(CmError::BackendQp { call: Call::Connect });
        }
        let next = self.connect_checked(private_data_len)?;
        Ok(IdMachine {
            external: self.ps.is_connected(),
            ..next
        })
    }

    fn connect_checked(&self, private_data_len: usize) -> Step {
        if self.state != IdState::RouteResolved {
            return Err(self.wrong(Call::Connect, "RDMA_CM_ROUTE_RESOLVED (ROUTE_RESOLVED retrieved)"));
        }
        self.check_private_data(Call::Connect, PrivateDataSlot::Connect, private_data_len)?;
        Ok(IdMachine {
            state: IdState::Connect,
            role: Role::Active,
            phase: ConnPhase::Connecting,
            ..*self
        })
    }

    /// `rdma_accept` without a backend QP, with the application's own QP number in the
    /// parameters (it should be in RTS already, moved there with the attributes of
    /// `init_qp_attr`); `ESTABLISHED` follows the RTU as usual.
    pub fn accept_external(&self, private_data_len: usize) -> Step {
        self.pending_request(Call::Accept)?;
        if self.qp.is_some() {
            return Err(CmError::BackendQp { call: Call::Accept });
        }
        self.check_private_data(Call::Accept, PrivateDataSlot::Accept, private_data_len)?;
        Ok(IdMachine {
            phase: ConnPhase::Accepted,
            external: self.ps.is_connected(),
            ..*self
        })
    }

    /// `rdma_establish`: the active side of an external-QP connection, after `CONNECT_RESPONSE`
    /// was retrieved, sends the RTU; the peer then gets `ESTABLISHED`, this id no event.
    ///
    /// Refused with [`CmError::BackendQp`] when the id has a backend QP (librdmacm: `EINVAL`),
    /// and with [`CmError::WrongState`] anywhere else than after `CONNECT_RESPONSE`: on an
    /// unanswered child the kernel would fail the RTU and then *reject* the request.
    pub fn establish(&self) -> Step {
        self.alive(Call::Establish)?;
        if self.qp.is_some() {
            return Err(CmError::BackendQp {
                call: Call::Establish,
            });
        }
        // Only an active id in RDMA_CM_CONNECT retrieves CONNECT_RESPONSE, and such an id leaves
        // RDMA_CM_CONNECT only for DEVICE_REMOVAL or destroying, which `alive` refused: the
        // phase alone says the state and the role.
        if self.phase != ConnPhase::Responded {
            return Err(self.wrong(
                Call::Establish,
                "RDMA_CM_CONNECT with CONNECT_RESPONSE retrieved (an active id without a backend QP)",
            ));
        }
        Ok(IdMachine {
            phase: ConnPhase::Established,
            ..*self
        })
    }

    /// Whether the kernel has an IB CM exchange for the id, from which `rdma_init_qp_attr`
    /// answers (a child, or an active id once it connected); without one it answers the INIT
    /// attributes whatever state is asked for.
    pub const fn has_cm_exchange(&self) -> bool {
        matches!(self.state, IdState::Connect | IdState::Disconnect)
    }

    /// `rdma_init_qp_attr` for `qp_state` (INIT, RTR or RTS): legal once the id has a device,
    /// while the kernel can answer. Connected port spaces: before `connect` (the INIT
    /// attributes); on a connecting active id INIT only (the kernel's IB CM has no remote QP
    /// number or PSN before the REP: `EINVAL`); on a child from its `CONNECT_REQUEST` and on an
    /// active id from `CONNECT_RESPONSE` or `ESTABLISHED` every state. Refused on a listener
    /// (its IB CM id listens), after a failed, rejected or ended connection (the IB CM id
    /// left the exchange: `EINVAL`), and for RESET and ERR, which the kernel gives no
    /// attributes for.
    pub fn init_qp_attr(&self, qp_state: QpState) -> Result<(), CmError> {
        const CALL: Call = Call::InitQpAttr;
        self.alive(CALL)?;
        if !matches!(qp_state, QpState::Init | QpState::Rtr | QpState::Rts) {
            return Err(CmError::InvalidArgument {
                call: CALL,
                reason: "rdma_init_qp_attr gives attributes for INIT, RTR and RTS only",
            });
        }
        if !self.device {
            return Err(CmError::NoDevice { call: CALL });
        }
        if !self.ps.is_connected() {
            return Ok(());
        }
        let ok = match self.state {
            IdState::Listen | IdState::Disconnect => false,
            IdState::Connect => match self.phase {
                ConnPhase::Connecting => qp_state == QpState::Init,
                ConnPhase::Requested
                | ConnPhase::Accepted
                | ConnPhase::Responded
                | ConnPhase::Established => true,
                ConnPhase::None | ConnPhase::Rejected | ConnPhase::Failed => false,
            },
            _ => true,
        };
        if !ok {
            return Err(self.wrong(
                CALL,
                "a device, and no listen, or a connection in progress or up (RTR/RTS: the peer's answer retrieved)",
            ));
        }
        Ok(())
    }

    fn pending_request(&self, call: Call) -> Result<(), CmError> {
        if self.role != Role::Passive || self.state != IdState::Connect || self.phase != ConnPhase::Requested
        {
            return Err(self.wrong(
                call,
                "a child id from CONNECT_REQUEST, not yet accepted or rejected",
            ));
        }
        Ok(())
    }

    /// `rdma_accept` with `private_data_len` bytes of private data; moves the QP to RTS.
    // `#[inline]`: the simulator calls it for every accepted connection from another crate,
    // which without the attribute cannot inline it in builds without LTO.
    #[inline]
    pub fn accept(&self, private_data_len: usize) -> Step {
        self.pending_request(Call::Accept)?;
        let Some(qp) = self.qp else {
            return Err(CmError::NoQp { call: Call::Accept });
        };
        if self.ps.is_connected() && !qp.can_modify_to(QpState::Rtr) {
            // librdmacm's RTR transition fails with EINVAL (e.g. the QP went to ERR through a
            // disconnect before the accept).
            return Err(CmError::WrongQpState {
                call: Call::Accept,
                state: qp,
            });
        }
        self.check_private_data(Call::Accept, PrivateDataSlot::Accept, private_data_len)?;
        Ok(IdMachine {
            phase: ConnPhase::Accepted,
            qp: Some(QpState::Rts),
            ..*self
        })
    }

    /// `rdma_reject` with `private_data_len` bytes of private data.
    pub fn reject(&self, private_data_len: usize) -> Step {
        self.pending_request(Call::Reject)?;
        self.check_private_data(Call::Reject, PrivateDataSlot::Reject, private_data_len)?;
        Ok(IdMachine {
            phase: ConnPhase::Rejected,
            ..*self
        })
    }

    /// `rdma_disconnect`: legal once the id has a connection attempt (`CONNECT` or
    /// `DISCONNECT`), any number of times, and on a listener bound to a device (nothing to end:
    /// a no-op, as in the kernel); moves the QP to ERR. librdmacm also moves the QP to
    /// ERR when it then fails with `EINVAL` on an id that never connected; here that call is
    /// refused before anything changes.
    pub fn disconnect(&self) -> Step {
        // A listener bound to a device has a CM id: the kernel finds no connection to end and
        // returns 0 (measured on rxe by the differential suite). Without a device librdmacm
        // fails with EINVAL before the kernel is asked.
        let listener_on_device = self.state == IdState::Listen && self.device;
        if !matches!(self.state, IdState::Connect | IdState::Disconnect) && !listener_on_device {
            return Err(self.wrong(
                Call::Disconnect,
                "RDMA_CM_CONNECT or RDMA_CM_DISCONNECT (a connection attempt), or a listener on a device",
            ));
        }
        Ok(IdMachine {
            qp: self.qp.map(|_| QpState::Err),
            ..*self
        })
    }

    /// Whether `rdma_disconnect` on this id reaches the wire (sends a DREQ or answers one):
    /// only once the connection has been established from the application's point of view.
    pub const fn disconnect_reaches_wire(&self) -> bool {
        matches!(self.phase, ConnPhase::Established)
    }

    /// `rdma_destroy_id`: refused while a QP is attached or events are unacked (librdmacm would
    /// leak the QP, or block forever).
    pub fn destroy(&self) -> Step {
        if self.qp.is_some() {
            return Err(CmError::QpAttached);
        }
        if self.unacked > 0 {
            return Err(CmError::UnackedEvents {
                call: Call::DestroyId,
                count: self.unacked,
            });
        }
        Ok(IdMachine {
            state: IdState::Destroying,
            ..*self
        })
    }

    /// `ibv_post_send` on the id's QP.
    pub fn post_send(&self) -> Result<(), CmError> {
        match self.qp {
            None => Err(CmError::NoQp { call: Call::PostSend }),
            // A UD send needs an address handle and remote QP number per work request, which
            // the trait's data path does not carry (verbs providers would dereference none).
            Some(_) if !self.ps.is_connected() => Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "sends on datagram (UD) QPs need an address handle, which post_send does not carry",
            }),
            Some(qp) if !qp.can_post_send() => Err(CmError::WrongQpState {
                call: Call::PostSend,
                state: qp,
            }),
            Some(_) => Ok(()),
        }
    }

    /// `ibv_post_send` of a work request over memory regions ([`SendWr`](crate::SendWr)) with
    /// operation `op`: a QP that may send, as [`post_send`](Self::post_send); the one-sided
    /// operations (RDMA READ, WRITE, atomics) only on a connected (RC) QP, since UD QPs have
    /// none (verbs: `EINVAL`). A SEND over regions on a UD QP needs an address handle, which
    /// only [`post_send_to`](Self::post_send_to)'s datagrams carry.
    pub fn post_send_wr(&self, op: &crate::SendOp) -> Result<(), CmError> {
        if self.qp.is_some() && !self.ps.is_connected() && !matches!(op, crate::SendOp::Send { .. }) {
            return Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "RDMA READ, WRITE and atomics need a connected (RC) QP",
            });
        }
        self.post_send()
    }

    /// `ibv_reg_mr` on the protection domain of the id's device (librdmacm's `id->pd`,
    /// shared by every id on the device): the id must be bound to a device.
    pub fn reg_mr(&self) -> Result<(), CmError> {
        self.on_device(Call::RegMr)
    }

    /// `ibv_create_srq` on the protection domain of the id's device, as
    /// [`reg_mr`](Self::reg_mr).
    pub fn create_srq(&self) -> Result<(), CmError> {
        self.on_device(Call::CreateSrq)
    }

    fn on_device(&self, call: Call) -> Result<(), CmError> {
        self.alive(call)?;
        if !self.device {
            return Err(CmError::NoDevice { call });
        }
        Ok(())
    }

    /// `ibv_post_send` of a datagram (a UD work request with an address handle) on the id's
    /// QP: only datagram port spaces have UD QPs; a connected QP has no use for a destination
    /// (verbs ignore `wr.ud` on RC, so the call is refused rather than silently misrouted).
    pub fn post_send_to(&self) -> Result<(), CmError> {
        match self.qp {
            None => Err(CmError::NoQp { call: Call::PostSend }),
            Some(_) if self.ps.is_connected() => Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "post_send_to needs a datagram (UD) QP; connected QPs send with post_send",
            }),
            Some(qp) if !qp.can_post_send() => Err(CmError::WrongQpState {
                call: Call::PostSend,
                state: qp,
            }),
            Some(_) => Ok(()),
        }
    }

    /// `rdma_join_multicast`: the kernel takes it on a datagram id bound to a device, in
    /// `RDMA_CM_ADDR_BOUND` or `RDMA_CM_ADDR_RESOLVED` (`EINVAL` otherwise, as for a connected
    /// port space, whose QPs cannot be attached). Nothing changes in the machine: membership is
    /// the backend's, and the `MULTICAST_JOIN` that follows leaves the state as it is.
    pub fn join_multicast(&self) -> Result<(), CmError> {
        let call = Call::JoinMulticast;
        self.alive(call)?;
        let expected = "a datagram id bound to a device (RDMA_CM_ADDR_BOUND or RDMA_CM_ADDR_RESOLVED)";
        if self.ps.is_connected()
            || !self.device
            || !matches!(self.state, IdState::AddrBound | IdState::AddrResolved)
        {
            return Err(self.wrong(call, expected));
        }
        Ok(())
    }

    /// `ibv_post_recv` on the id's QP. A QP on a shared receive queue has no receive queue of
    /// its own (rxe: `EINVAL`); its receives are posted on the SRQ.
    pub fn post_recv(&self) -> Result<(), CmError> {
        match self.qp {
            None => Err(CmError::NoQp { call: Call::PostRecv }),
            Some(_) if self.srq => Err(CmError::InvalidArgument {
                call: Call::PostRecv,
                reason: "the QP takes its receives from a shared receive queue: post them there",
            }),
            Some(qp) if !qp.can_post_recv() => Err(CmError::WrongQpState {
                call: Call::PostRecv,
                state: qp,
            }),
            Some(_) => Ok(()),
        }
    }

    /// The QP went to ERR on its own (a fatal completion error on the data path).
    pub fn qp_error(&self) -> IdMachine {
        IdMachine {
            qp: self.qp.map(|_| QpState::Err),
            ..*self
        }
    }

    /// What librdmacm turns the kernel's `CONNECT_RESPONSE` into for this id when it is
    /// retrieved: `CONNECT_RESPONSE` without a QP, `ESTABLISHED` when the QP can go to RTR and
    /// RTS, `CONNECT_ERROR` when it cannot (say, a disconnect moved it to ERR first).
    pub fn connect_response_outcome(&self) -> CmEventType {
        if !self.ps.is_connected() {
            // A SIDR reply needs no QP transition: UD QPs are ready from creation.
            return CmEventType::Established;
        }
        match self.qp {
            None => CmEventType::ConnectResponse,
            Some(qp) if qp.can_modify_to(QpState::Rtr) => CmEventType::Established,
            Some(_) => CmEventType::ConnectError,
        }
    }

    /// The id's device was unregistered: the kernel moves the id to `RDMA_CM_DEVICE_REMOVAL` at
    /// once and refuses every call but destroy from then on, even before the application
    /// retrieves the `DEVICE_REMOVAL` event, which is then the one event still legal (it moves
    /// the QP to ERR). A backend that sees the removal when it happens calls this, so work started
    /// in that window cannot produce events after `DEVICE_REMOVAL`. Unchanged for an id already
    /// removed or being destroyed.
    ///
    /// ```
    /// use cm_core::{CmEventType, IdMachine, IdState, PortSpace};
    ///
    /// let id = IdMachine::new(PortSpace::Tcp).bind_addr(false).unwrap().device_removed();
    /// assert_eq!(id.state(), IdState::DeviceRemoval);
    /// assert!(id.listen().is_err(), "refused before DEVICE_REMOVAL is retrieved");
    /// let id = id.on_event(CmEventType::DeviceRemoval).unwrap();
    /// assert!(id.check_event(CmEventType::DeviceRemoval).is_err(), "announced once");
    /// ```
    pub fn device_removed(&self) -> IdMachine {
        if matches!(self.state, IdState::DeviceRemoval | IdState::Destroying) {
            return *self;
        }
        IdMachine {
            state: IdState::DeviceRemoval,
            removal_pending: true,
            ..*self
        }
    }

    /// Checks that `event` may be delivered to this id now, without changing anything.
    pub fn check_event(&self, event: CmEventType) -> Result<(), IllegalEvent> {
        self.on_event(event).map(|_| ())
    }

    /// The machine after `event` was retrieved for this id (the id the event counts against:
    /// the listener for `CONNECT_REQUEST`). Counts the event as unacked.
    // Called across the crate boundary for every event a simulator hands out.
    #[inline]
    pub fn on_event(&self, event: CmEventType) -> Result<IdMachine, IllegalEvent> {
        use CmEventType::*;
        use ConnPhase as P;
        let illegal = IllegalEvent {
            event,
            state: self.state,
            phase: self.phase,
        };
        let s = self.state;
        let mut next = IdMachine {
            unacked: self.unacked + 1,
            ..*self
        };
        let active = self.role == Role::Active;
        let passive = self.role == Role::Passive;
        if self.removal_pending {
            // After the removal only its announcement can come.
            if event != DeviceRemoval {
                return Err(illegal);
            }
            next.removal_pending = false;
            next.qp = self.qp.map(|_| QpState::Err);
            return Ok(next);
        }
        match event {
            AddrResolved if s == IdState::AddrQuery => {
                next.state = IdState::AddrResolved;
                next.device = true;
            }
            AddrError if s == IdState::AddrQuery => next.state = IdState::AddrBound,
            RouteResolved if s == IdState::RouteQuery => next.state = IdState::RouteResolved,
            RouteError if s == IdState::RouteQuery => next.state = IdState::AddrResolved,
            ConnectRequest if s == IdState::Listen => {}
            ConnectResponse
                if s == IdState::Connect && active && self.phase == P::Connecting && self.qp.is_none() =>
            {
                next.phase = P::Responded;
            }
            Established
                if s == IdState::Connect
                    && active
                    && self.phase == P::Connecting
                    && !self.ps.is_connected() =>
            {
                next.phase = P::Established;
            }
            Established if s == IdState::Connect && active && self.phase == P::Connecting => {
                if !matches!(self.qp, Some(qp) if qp.can_modify_to(QpState::Rtr)) {
                    return Err(illegal);
                }
                next.phase = P::Established;
                next.qp = Some(QpState::Rts);
            }
            Established if s == IdState::Connect && passive && self.phase == P::Accepted => {
                next.phase = P::Established
            }
            ConnectError if s == IdState::Connect && active && self.phase == P::Connecting => {
                next.phase = P::Failed;
                next.qp = self.qp.map(|_| QpState::Err);
            }
            // A REJ can also end an established connection: the kernel's IB CM takes one in
            // ESTABLISHED (a peer that destroyed its child before the RTU reached it), and
            // rdma_cm, still in RDMA_CM_CONNECT, reports it.
            Rejected | Unreachable
                if s == IdState::Connect
                    && ((active && matches!(self.phase, P::Connecting | P::Responded))
                        || (passive && self.phase == P::Accepted)
                        || (event == Rejected && self.phase == P::Established)) =>
            {
                next.phase = P::Failed;
                if event == Rejected {
                    // librdmacm moves the QP to ERR when it hands out REJECTED.
                    next.qp = self.qp.map(|_| QpState::Err);
                }
            }
            Disconnected if s == IdState::Connect && matches!(self.phase, P::Established | P::Accepted) => {
                next.state = IdState::Disconnect;
            }
            TimewaitExit if s == IdState::Disconnect => {}
            DeviceRemoval if !matches!(s, IdState::DeviceRemoval | IdState::Destroying) => {
                next.state = IdState::DeviceRemoval;
                // The device is gone: nothing posted will ever complete normally.
                next.qp = self.qp.map(|_| QpState::Err);
            }
            AddrChange if self.device && s != IdState::Destroying => {}
            // A join may be answered after the id moved on (a route resolved meanwhile); the
            // group's events change nothing but the count.
            MulticastJoin | MulticastError
                if self.device
                    && !self.ps.is_connected()
                    && !matches!(s, IdState::DeviceRemoval | IdState::Destroying) => {}
            _ => return Err(illegal),
        }
        Ok(next)
    }

    /// The machine after an event that [`on_event`](Self::on_event) refused was delivered
    /// anyway (a backend never hides a real event): counted as unacked, nothing else changes.
    pub fn count_event(&self) -> IdMachine {
        IdMachine {
            unacked: self.unacked + 1,
            ..*self
        }
    }

    /// `rdma_set_option` with `option`: whether the kernel takes it in this state (see
    /// [`IdOption`](crate::IdOption)'s table). Options change no state the machine tracks.
    pub fn set_option(&self, option: crate::IdOption) -> Result<(), CmError> {
        use crate::IdOption;
        let call = Call::SetOption;
        self.alive(call)?;
        match option {
            IdOption::Tos(_) => Ok(()),
            IdOption::ReuseAddr(true) if self.state == IdState::Listen => {
                Err(self.wrong(call, "any state but RDMA_CM_LISTEN to enable REUSEADDR"))
            }
            IdOption::ReuseAddr(false) if self.state != IdState::Idle => {
                Err(self.wrong(call, "RDMA_CM_IDLE to disable REUSEADDR"))
            }
            IdOption::ReuseAddr(_) => Ok(()),
            IdOption::AfOnly(_) if matches!(self.state, IdState::Idle | IdState::AddrBound) => Ok(()),
            IdOption::AfOnly(_) => Err(self.wrong(call, "RDMA_CM_IDLE or RDMA_CM_ADDR_BOUND")),
            IdOption::AckTimeout(_) if !self.ps.is_connected() => Err(CmError::InvalidArgument {
                call,
                reason: "ACK_TIMEOUT needs a reliable-connected (RC) id",
            }),
            IdOption::AckTimeout(t) if t > IdOption::MAX_ACK_TIMEOUT => Err(CmError::InvalidArgument {
                call,
                reason: "ACK_TIMEOUT above 31 (the QP attribute has 5 bits)",
            }),
            IdOption::AckTimeout(_) => Ok(()),
        }
    }

    /// `rdma_migrate_id`: refused while events counted against the id are retrieved and not
    /// acked, where librdmacm would block until they are.
    pub fn migrate(&self) -> Result<(), CmError> {
        self.alive(Call::MigrateId)?;
        if self.unacked > 0 {
            return Err(CmError::UnackedEvents {
                call: Call::MigrateId,
                count: self.unacked,
            });
        }
        Ok(())
    }

    /// The machine after one of its events was acked.
    pub fn on_ack(&self) -> Step {
        if self.unacked == 0 {
            return Err(CmError::EventNotOutstanding);
        }
        Ok(IdMachine {
            unacked: self.unacked - 1,
            ..*self
        })
    }
}

#[cfg(test)]
mod tests;
