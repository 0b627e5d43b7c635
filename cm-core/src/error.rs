//! The one error enum every backend returns.
//!
//! Each variant knows the errno librdmacm would give ([`CmError::errno`]). Where librdmacm would
//! not give one at all — it blocks forever (destroying an id with unacked events), dereferences
//! NULL (destroying a QP that is not there, accepting without a QP) or silently leaks (destroying
//! an id that still has a QP) — the backends refuse the call with a variant of its own, change
//! nothing, and report the errno named in the variant's docs.

use std::fmt;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use crate::event::{CmEvent, CmEventType};
use crate::handle::HandleKind;
use crate::state::{IdState, QpState};

/// Raw errno values used by this crate (Linux numbering, as librdmacm reports them).
pub mod errno {
    /// No such file or directory: unknown id.
    pub const ENOENT: i32 = 2;
    /// Bad file descriptor: unknown event channel.
    pub const EBADF: i32 = 9;
    /// Out of memory / queue full.
    pub const ENOMEM: i32 = 12;
    /// Resource busy.
    pub const EBUSY: i32 = 16;
    /// No such device.
    pub const ENODEV: i32 = 19;
    /// Invalid argument.
    pub const EINVAL: i32 = 22;
    /// Function not implemented.
    pub const ENOSYS: i32 = 38;
    /// No data available (librdmacm's short write).
    pub const ENODATA: i32 = 61;
    /// Operation not supported.
    pub const EOPNOTSUPP: i32 = 95;
    /// Address already in use.
    pub const EADDRINUSE: i32 = 98;
    /// Cannot assign requested address.
    pub const EADDRNOTAVAIL: i32 = 99;
    /// Network is unreachable.
    pub const ENETUNREACH: i32 = 101;
    /// Connection timed out.
    pub const ETIMEDOUT: i32 = 110;
    /// Connection refused.
    pub const ECONNREFUSED: i32 = 111;
    /// No route to host.
    pub const EHOSTUNREACH: i32 = 113;
}

/// The librdmacm call (or verbs call of the data path) an error is about.
///
/// `#[non_exhaustive]`: the trait gains calls as it covers more of librdmacm.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
#[allow(missing_docs)] // one variant per call, named after it
pub enum Call {
    CreateEventChannel,
    DestroyEventChannel,
    CreateId,
    DestroyId,
    BindAddr,
    ResolveAddr,
    ResolveRoute,
    CreateQp,
    DestroyQp,
    Listen,
    Connect,
    Accept,
    Reject,
    Disconnect,
    GetCmEvent,
    AckCmEvent,
    GetLocalAddr,
    GetPeerAddr,
    PostSend,
    PostRecv,
    PollCq,
    InitQpAttr,
    Establish,
    SetOption,
    MigrateId,
    GetRequest,
    GetAddrInfo,
    CreateEp,
    JoinMulticast,
    LeaveMulticast,
    RegMr,
    DeregMr,
    ReadMr,
    WriteMr,
    CreateSrq,
    DestroySrq,
    ModifySrq,
    PostSrqRecv,
    GetAsyncEvent,
    VerbsCreateQp,
    ModifyQp,
    QueryQp,
    VerbsDestroyQp,
    QuerySrq,
}

impl Call {
    /// The C function's name.
    pub const fn name(self) -> &'static str {
        match self {
            Call::CreateEventChannel => "rdma_create_event_channel",
            Call::DestroyEventChannel => "rdma_destroy_event_channel",
            Call::CreateId => "rdma_create_id",
            Call::DestroyId => "rdma_destroy_id",
            Call::BindAddr => "rdma_bind_addr",
            Call::ResolveAddr => "rdma_resolve_addr",
            Call::ResolveRoute => "rdma_resolve_route",
            Call::CreateQp => "rdma_create_qp",
            Call::DestroyQp => "rdma_destroy_qp",
            Call::Listen => "rdma_listen",
            Call::Connect => "rdma_connect",
            Call::Accept => "rdma_accept",
            Call::Reject => "rdma_reject",
            Call::Disconnect => "rdma_disconnect",
            Call::GetCmEvent => "rdma_get_cm_event",
            Call::AckCmEvent => "rdma_ack_cm_event",
            Call::GetLocalAddr => "rdma_get_local_addr",
            Call::GetPeerAddr => "rdma_get_peer_addr",
            Call::PostSend => "ibv_post_send",
            Call::PostRecv => "ibv_post_recv",
            Call::PollCq => "ibv_poll_cq",
            Call::InitQpAttr => "rdma_init_qp_attr",
            Call::Establish => "rdma_establish",
            Call::SetOption => "rdma_set_option",
            Call::MigrateId => "rdma_migrate_id",
            Call::GetRequest => "rdma_get_request",
            Call::GetAddrInfo => "rdma_getaddrinfo",
            Call::CreateEp => "rdma_create_ep",
            Call::JoinMulticast => "rdma_join_multicast",
            Call::LeaveMulticast => "rdma_leave_multicast",
            Call::RegMr => "ibv_reg_mr",
            Call::DeregMr => "ibv_dereg_mr",
            // Not verbs calls: a region's bytes are the backend's, read and written through it.
            Call::ReadMr => "read_mr",
            Call::WriteMr => "write_mr",
            Call::CreateSrq => "ibv_create_srq",
            Call::DestroySrq => "ibv_destroy_srq",
            Call::ModifySrq => "ibv_modify_srq",
            Call::PostSrqRecv => "ibv_post_srq_recv",
            Call::GetAsyncEvent => "ibv_get_async_event",
            Call::VerbsCreateQp => "ibv_create_qp",
            Call::ModifyQp => "ibv_modify_qp",
            Call::QueryQp => "ibv_query_qp",
            Call::VerbsDestroyQp => "ibv_destroy_qp",
            Call::QuerySrq => "ibv_query_srq",
        }
    }
}

impl fmt::Display for Call {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Every error a [`CmBackend`](crate::CmBackend) returns.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CmError {
    /// The handle was never issued by this backend, belongs to another backend instance, or its
    /// object was destroyed. librdmacm: `ENOENT` for ids (a use after free in user space),
    /// `EBADF` for channels.
    #[error("{call}: unknown {kind} (never created here, destroyed, or from another backend)")]
    UnknownHandle {
        /// The call.
        call: Call,
        /// Channel, id, memory region or SRQ.
        kind: HandleKind,
    },

    /// The id is not in a state where the call is legal. librdmacm: `EINVAL` from the kernel,
    /// or a crash where librdmacm dereferences state the id does not have yet.
    #[error("{call} on an id in state {state} (needs {expected})")]
    WrongState {
        /// The call.
        call: Call,
        /// The id's state when the call was made.
        state: IdState,
        /// What the call needs.
        expected: &'static str,
    },

    /// `rdma_destroy_id` on an id that still has a QP. librdmacm would free the id and leak the
    /// QP, its CQs and possibly the PD; refused here with `EBUSY`.
    #[error("rdma_destroy_id with a QP still attached: call rdma_destroy_qp first")]
    QpAttached,

    /// `rdma_destroy_qp` while the QP is attached to multicast groups. The kernel refuses to
    /// destroy it (`EBUSY`, measured on rxe) but librdmacm ignores that, forgets the QP and
    /// leaks it with its CQ; refused here with `EBUSY`: leave the groups first.
    #[error("rdma_destroy_qp with the QP attached to {groups} multicast group(s): leave them first")]
    QpInGroups {
        /// How many groups the QP is attached to.
        groups: u32,
    },

    /// `rdma_destroy_id`, or `rdma_destroy_event_channel`, while events were retrieved and not
    /// acked. librdmacm would block forever in `rdma_destroy_id`; refused here with `EBUSY`.
    #[error("{call} with {count} event(s) retrieved and not acked: ack them first (librdmacm would block forever)")]
    UnackedEvents {
        /// The call.
        call: Call,
        /// How many events are outstanding.
        count: u32,
    },

    /// `rdma_destroy_event_channel` while ids still use the channel. librdmacm closes the fd,
    /// the kernel destroys the ids and their user-space structures leak; refused here with `EBUSY`.
    #[error("rdma_destroy_event_channel with {ids} id(s) still on the channel: destroy them first")]
    ChannelBusy {
        /// How many ids still use the channel.
        ids: u32,
    },

    /// `ibv_destroy_srq` while QPs still take their receives from it (the kernel: `EBUSY`).
    #[error("ibv_destroy_srq with {qps} QP(s) still on the SRQ: destroy them first")]
    SrqBusy {
        /// How many QPs use it.
        qps: u32,
    },

    /// `rdma_create_qp` on an id that already has one (librdmacm: `EINVAL`).
    #[error("rdma_create_qp: the id already has a QP (one QP per id)")]
    QpExists,

    /// The call needs a QP on the id and there is none. librdmacm: `EINVAL` for connect;
    /// a NULL dereference for `rdma_destroy_qp` and `rdma_accept`; refused here with `EINVAL`.
    #[error("{call}: the id has no QP")]
    NoQp {
        /// The call.
        call: Call,
    },

    /// The id's connection uses an external QP (connected or accepted without a backend QP,
    /// with the application's own QP number): a backend QP would be one the peer never heard
    /// of, so `rdma_create_qp` is refused with `EINVAL` (librdmacm would create it and drive it
    /// to RTR/RTS against the peer's QP, a connection that never carries data).
    #[error("{call}: the id's connection uses an external QP (connected or accepted with the application's own QP number)")]
    ExternalQp {
        /// The call.
        call: Call,
    },

    /// The call is for ids without a backend QP (external QPs) and the id has one: librdmacm's
    /// `rdma_establish` fails with `EINVAL`.
    #[error("{call}: the id has a backend-owned QP; only ids connected with an external QP call it")]
    BackendQp {
        /// The call.
        call: Call,
    },

    /// The call needs the id to be bound to an RDMA device and it is not (librdmacm would pass
    /// a NULL protection domain on, or dereference a NULL device); refused with `EINVAL`.
    #[error(
        "{call}: the id is not bound to an RDMA device yet (bind to a local address or resolve one first)"
    )]
    NoDevice {
        /// The call.
        call: Call,
    },

    /// The QP is not in a state where the work request may be posted (verbs: `EINVAL`).
    #[error("{call} on a QP in state {state}")]
    WrongQpState {
        /// The call.
        call: Call,
        /// The QP's state.
        state: QpState,
    },

    /// Private data longer than the port space allows for this call (librdmacm: `EINVAL`).
    #[error("{call}: {len} bytes of private data, at most {max} allowed")]
    PrivateDataTooLong {
        /// The call.
        call: Call,
        /// The length given.
        len: usize,
        /// The limit.
        max: usize,
    },

    /// The address and port are already bound by another id (`EADDRINUSE`).
    #[error("{call}: address already in use")]
    AddrInUse {
        /// The call.
        call: Call,
    },

    /// The address is not local, or the port conflicts with a wildcard bind, or no ephemeral
    /// port is free (`EADDRNOTAVAIL`).
    #[error("{call}: address not available")]
    AddrNotAvailable {
        /// The call.
        call: Call,
    },

    /// An argument is invalid (`EINVAL`).
    #[error("{call}: invalid argument: {reason}")]
    InvalidArgument {
        /// The call.
        call: Call,
        /// What is wrong with it.
        reason: &'static str,
    },

    /// A work queue is full (verbs: `ENOMEM`).
    #[error("{call}: work queue full ({outstanding} outstanding)")]
    QueueFull {
        /// The call.
        call: Call,
        /// Work requests outstanding.
        outstanding: u32,
    },

    /// The event was not handed out by this backend or was already acked (librdmacm: a double
    /// free; refused here with `EINVAL`).
    #[error("rdma_ack_cm_event: the event is not outstanding on this backend")]
    EventNotOutstanding,

    /// The event belongs to another backend (another host, fabric or process): the ack is
    /// refused and the event is handed back in the error, so the caller can still ack it where
    /// it came from ([`ReturnedEvent::take`]). `EINVAL`, like [`CmError::EventNotOutstanding`].
    #[error("rdma_ack_cm_event: {0} was handed out by another backend; it is given back in this error, ack it there")]
    ForeignEvent(ReturnedEvent),

    /// The (simulated) host crashed: its process and everything it had are gone until it
    /// restarts (`ENODEV`, what a process sees when its device disappears).
    #[error("{call}: the host crashed at virtual time {}.{:09} s; its ids, channels and QPs are gone", .at.as_secs(), .at.subsec_nanos())]
    HostCrashed {
        /// The call.
        call: Call,
        /// When it crashed, in virtual time since the fabric was built.
        at: Duration,
    },

    /// There is no RDMA device on this machine (`ENODEV`).
    #[error("no RDMA device: load a driver or add a software device, e.g. `rdma link add rxe0 type rxe netdev <interface>` (Soft-RoCE)")]
    NoRdmaDevice,

    /// A call on a synchronous id ([`SyncId`](crate::SyncId)) got its event, and the event
    /// reports a failure: what librdmacm's synchronous mode turns into `-1` with errno
    /// `ECONNREFUSED` for `REJECTED`, else the status (negated when negative).
    #[error("{call}: {event} with status {status}")]
    EventFailed {
        /// The call.
        call: Call,
        /// The event that came.
        event: CmEventType,
        /// Its status.
        status: i32,
    },

    /// A call on a synchronous id ([`SyncId`](crate::SyncId)) got no event within the id's
    /// bound (`ETIMEDOUT`; librdmacm would wait for ever).
    #[error("{call}: no event within {} ms", .waited.as_millis())]
    EventTimeout {
        /// The call.
        call: Call,
        /// How long it waited.
        waited: Duration,
    },

    /// librdmacm or verbs failed with this errno.
    #[error("{call}: {}", errno_text(*.errno))]
    Os {
        /// The call.
        call: Call,
        /// The errno.
        errno: i32,
    },
}

impl CmError {
    /// The errno librdmacm would give (or, where it would hang or crash, the one the variant's
    /// docs name).
    pub const fn errno(&self) -> i32 {
        use errno::*;
        match self {
            CmError::UnknownHandle {
                kind: HandleKind::Channel,
                ..
            } => EBADF,
            CmError::UnknownHandle {
                kind: HandleKind::Id, ..
            } => ENOENT,
            // verbs would use freed memory; the kernel answers a stale handle with EINVAL.
            CmError::UnknownHandle {
                kind: HandleKind::Mr | HandleKind::Srq | HandleKind::Qp,
                ..
            } => EINVAL,
            CmError::WrongState { .. } => EINVAL,
            CmError::QpAttached => EBUSY,
            CmError::QpInGroups { .. } => EBUSY,
            CmError::UnackedEvents { .. } => EBUSY,
            CmError::ChannelBusy { .. } => EBUSY,
            CmError::SrqBusy { .. } => EBUSY,
            CmError::QpExists => EINVAL,
            CmError::NoQp { .. } => EINVAL,
            CmError::NoDevice { .. } => EINVAL,
            CmError::ExternalQp { .. } => EINVAL,
            CmError::BackendQp { .. } => EINVAL,
            CmError::WrongQpState { .. } => EINVAL,
            CmError::PrivateDataTooLong { .. } => EINVAL,
            CmError::AddrInUse { .. } => EADDRINUSE,
            CmError::AddrNotAvailable { .. } => EADDRNOTAVAIL,
            CmError::InvalidArgument { .. } => EINVAL,
            CmError::QueueFull { .. } => ENOMEM,
            CmError::EventNotOutstanding => EINVAL,
            CmError::ForeignEvent(_) => EINVAL,
            CmError::HostCrashed { .. } => ENODEV,
            CmError::NoRdmaDevice => ENODEV,
            CmError::EventFailed { event, status, .. } => {
                if matches!(event, CmEventType::Rejected) {
                    ECONNREFUSED
                } else if *status < 0 {
                    status.saturating_neg()
                } else {
                    *status
                }
            }
            CmError::EventTimeout { .. } => ETIMEDOUT,
            CmError::Os { errno, .. } => *errno,
        }
    }

    /// Whether this error is a misuse that librdmacm itself would turn into a hang, a crash or
    /// a leak rather than an errno.
    pub const fn is_guarded_misuse(&self) -> bool {
        matches!(
            self,
            CmError::QpAttached
                | CmError::QpInGroups { .. }
                | CmError::UnackedEvents { .. }
                | CmError::ChannelBusy { .. }
                | CmError::EventNotOutstanding
                | CmError::ForeignEvent(_)
                | CmError::NoDevice { .. }
                | CmError::ExternalQp { .. }
                | CmError::NoQp {
                    call: Call::DestroyQp | Call::Accept
                }
        )
    }
}

/// An event handed back by a refused ack ([`CmError::ForeignEvent`]).
///
/// The error is `Clone`, the event is not: every clone of the error shares one cell, so the
/// event can be taken out exactly once and the "ack at most once" guarantee holds.
#[derive(Clone)]
pub struct ReturnedEvent(Arc<Mutex<Option<CmEvent>>>);

impl ReturnedEvent {
    pub(crate) fn new(event: CmEvent) -> Self {
        ReturnedEvent(Arc::new(Mutex::new(Some(event))))
    }

    /// The event, the first time it is asked for (from any clone of the error); `None` after.
    ///
    /// ```
    /// use cm_core::{CmBackend, CmError};
    /// # fn ack_where_it_belongs<B: CmBackend>(wrong: &mut B, right: &mut B, ev: cm_core::CmEvent) -> cm_core::Result<()> {
    /// match wrong.ack_cm_event(ev) {
    ///     Err(CmError::ForeignEvent(back)) => right.ack_cm_event(back.take().expect("first take")),
    ///     other => other,
    /// }
    /// # }
    /// ```
    pub fn take(&self) -> Option<CmEvent> {
        self.0.lock().unwrap_or_else(PoisonError::into_inner).take()
    }
}

impl PartialEq for ReturnedEvent {
    /// Equal when they share the cell: the same refusal.
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for ReturnedEvent {}

impl fmt::Debug for ReturnedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(ev) => write!(f, "ReturnedEvent({ev:?})"),
            None => f.write_str("ReturnedEvent(taken)"),
        }
    }
}

impl fmt::Display for ReturnedEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &*self.0.lock().unwrap_or_else(PoisonError::into_inner) {
            Some(ev) => write!(f, "{ev}"),
            None => f.write_str("an event (taken back since)"),
        }
    }
}

/// The symbolic name (`ETIMEDOUT`) of an errno value librdmacm returns, if this crate knows it.
pub(crate) fn errno_name(errno: i32) -> Option<&'static str> {
    let text = errno_text_known(errno)?;
    let open = text.rfind('(')?;
    text.get(open + 1..text.len() - 1)
}

/// A short text for the errno values librdmacm returns (no libc needed).
pub fn errno_text(errno: i32) -> String {
    errno_text_known(errno).map_or_else(|| format!("errno {errno}"), str::to_owned)
}

fn errno_text_known(errno: i32) -> Option<&'static str> {
    use errno::*;
    let text = match errno {
        ENOENT => "no such id (ENOENT)",
        EBADF => "bad file descriptor (EBADF)",
        ENOMEM => "out of memory (ENOMEM)",
        EBUSY => "resource busy (EBUSY)",
        ENODEV => "no such device (ENODEV)",
        EINVAL => "invalid argument (EINVAL)",
        ENOSYS => "function not implemented (ENOSYS)",
        ENODATA => "no data available (ENODATA)",
        EOPNOTSUPP => "operation not supported (EOPNOTSUPP)",
        EADDRINUSE => "address already in use (EADDRINUSE)",
        EADDRNOTAVAIL => "cannot assign requested address (EADDRNOTAVAIL)",
        ENETUNREACH => "network is unreachable (ENETUNREACH)",
        ETIMEDOUT => "connection timed out (ETIMEDOUT)",
        ECONNREFUSED => "connection refused (ECONNREFUSED)",
        EHOSTUNREACH => "no route to host (EHOSTUNREACH)",
        _ => return None,
    };
    Some(text)
}

impl CmError {
    /// The [`std::io::ErrorKind`] of [`errno`](Self::errno), by Linux numbering (the one librdmacm
    /// reports in) whatever the host, so the answer does not depend on the platform's libc.
    pub const fn io_error_kind(&self) -> std::io::ErrorKind {
        use errno::*;
        use std::io::ErrorKind as K;
        match self.errno() {
            ENOENT => K::NotFound,
            ENOMEM => K::OutOfMemory,
            EBUSY => K::ResourceBusy,
            EINVAL | EBADF => K::InvalidInput,
            ENOSYS | EOPNOTSUPP => K::Unsupported,
            EADDRINUSE => K::AddrInUse,
            EADDRNOTAVAIL => K::AddrNotAvailable,
            ENETUNREACH => K::NetworkUnreachable,
            EHOSTUNREACH => K::HostUnreachable,
            ETIMEDOUT => K::TimedOut,
            ECONNREFUSED => K::ConnectionRefused,
            _ => K::Other,
        }
    }
}

/// An `io::Error` whose kind follows the errno ([`CmError::io_error_kind`]) and which carries the
/// `CmError` itself, so its message and [`CmError::errno`] stay reachable through
/// [`std::io::Error::get_ref`].
///
/// ```
/// use std::io;
/// use cm_core::{Call, CmError};
///
/// let err = CmError::AddrInUse { call: Call::BindAddr };
/// let io: io::Error = err.clone().into();
/// assert_eq!(io.kind(), io::ErrorKind::AddrInUse);
/// assert_eq!(io.to_string(), err.to_string());
/// assert_eq!(io.get_ref().and_then(|e| e.downcast_ref::<CmError>()), Some(&err));
/// ```
impl From<CmError> for std::io::Error {
    fn from(err: CmError) -> Self {
        std::io::Error::new(err.io_error_kind(), err)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn io_errors_take_their_kind_from_the_errno_and_keep_the_cm_error() {
        use std::io::ErrorKind as K;
        let cases = [
            (CmError::AddrInUse { call: Call::BindAddr }, K::AddrInUse),
            (
                CmError::AddrNotAvailable {
                    call: Call::ResolveAddr,
                },
                K::AddrNotAvailable,
            ),
            (CmError::QpAttached, K::ResourceBusy),
            (CmError::EventNotOutstanding, K::InvalidInput),
            (
                CmError::Os {
                    call: Call::Connect,
                    errno: errno::ETIMEDOUT,
                },
                K::TimedOut,
            ),
            (
                CmError::Os {
                    call: Call::Connect,
                    errno: errno::ECONNREFUSED,
                },
                K::ConnectionRefused,
            ),
            (
                CmError::Os {
                    call: Call::ResolveAddr,
                    errno: errno::EHOSTUNREACH,
                },
                K::HostUnreachable,
            ),
            (
                CmError::Os {
                    call: Call::Connect,
                    errno: 4242,
                },
                K::Other,
            ),
        ];
        for (err, kind) in cases {
            let io = std::io::Error::from(err.clone());
            assert_eq!(io.kind(), kind, "{err}");
            assert_eq!(io.to_string(), err.to_string());
            let inner = io.into_inner().expect("the CmError is kept");
            let back = inner.downcast::<CmError>().expect("it is a CmError");
            assert_eq!(back.errno(), err.errno());
            assert_eq!(*back, err);
        }
    }

    #[test]
    fn every_variant_knows_its_errno() {
        use errno::*;
        let cases = [
            (
                CmError::UnknownHandle {
                    call: Call::DestroyId,
                    kind: HandleKind::Id,
                },
                ENOENT,
            ),
            (
                CmError::UnknownHandle {
                    call: Call::GetCmEvent,
                    kind: HandleKind::Channel,
                },
                EBADF,
            ),
            (
                CmError::WrongState {
                    call: Call::Connect,
                    state: IdState::Idle,
                    expected: "RDMA_CM_ROUTE_RESOLVED",
                },
                EINVAL,
            ),
            (CmError::QpAttached, EBUSY),
            (CmError::QpInGroups { groups: 1 }, EBUSY),
            (
                CmError::UnackedEvents {
                    call: Call::DestroyId,
                    count: 2,
                },
                EBUSY,
            ),
            (CmError::ChannelBusy { ids: 1 }, EBUSY),
            (CmError::SrqBusy { qps: 2 }, EBUSY),
            (
                CmError::UnknownHandle {
                    call: Call::DeregMr,
                    kind: HandleKind::Mr,
                },
                EINVAL,
            ),
            (
                CmError::UnknownHandle {
                    call: Call::DestroySrq,
                    kind: HandleKind::Srq,
                },
                EINVAL,
            ),
            (CmError::QpExists, EINVAL),
            (CmError::NoQp { call: Call::Accept }, EINVAL),
            (CmError::NoDevice { call: Call::CreateQp }, EINVAL),
            (
                CmError::WrongQpState {
                    call: Call::PostSend,
                    state: QpState::Init,
                },
                EINVAL,
            ),
            (
                CmError::PrivateDataTooLong {
                    call: Call::Connect,
                    len: 57,
                    max: 56,
                },
                EINVAL,
            ),
            (CmError::AddrInUse { call: Call::BindAddr }, EADDRINUSE),
            (CmError::AddrNotAvailable { call: Call::BindAddr }, EADDRNOTAVAIL),
            (
                CmError::InvalidArgument {
                    call: Call::BindAddr,
                    reason: "x",
                },
                EINVAL,
            ),
            (
                CmError::QueueFull {
                    call: Call::PostSend,
                    outstanding: 16,
                },
                ENOMEM,
            ),
            (CmError::EventNotOutstanding, EINVAL),
            (CmError::NoRdmaDevice, ENODEV),
            (
                CmError::HostCrashed {
                    call: Call::CreateId,
                    at: Duration::from_secs(1),
                },
                ENODEV,
            ),
            (
                CmError::Os {
                    call: Call::Connect,
                    errno: ETIMEDOUT,
                },
                ETIMEDOUT,
            ),
        ];
        for (err, want) in cases {
            assert_eq!(err.errno(), want, "{err}");
        }
    }

    #[test]
    fn a_foreign_event_error_gives_the_event_back_once_across_clones() {
        use crate::event::{CmEventType, ConnParam};
        use crate::handle::IdHandle;
        let ev = CmEvent::new(
            IdHandle::new(1, 2, 3),
            None,
            CmEventType::AddrResolved,
            0,
            ConnParam::ZERO,
            9,
        );
        let err = CmError::ForeignEvent(ReturnedEvent::new(ev));
        let copy = err.clone();
        assert_eq!(err, copy);
        assert_eq!(err.errno(), errno::EINVAL);
        assert!(err.to_string().contains("RDMA_CM_EVENT_ADDR_RESOLVED"), "{err}");
        let (CmError::ForeignEvent(a), CmError::ForeignEvent(b)) = (err, copy) else {
            unreachable!("built as ForeignEvent")
        };
        let back = a.take().expect("the event comes back");
        assert_eq!((back.token(), back.event()), (9, CmEventType::AddrResolved));
        assert!(
            b.take().is_none(),
            "a clone of the error cannot hand it out twice"
        );
    }

    #[test]
    fn messages_name_the_call_state_and_count() {
        let e = CmError::WrongState {
            call: Call::Connect,
            state: IdState::AddrResolved,
            expected: "RDMA_CM_ROUTE_RESOLVED",
        };
        assert_eq!(
            e.to_string(),
            "rdma_connect on an id in state RDMA_CM_ADDR_RESOLVED (needs RDMA_CM_ROUTE_RESOLVED)"
        );
        let e = CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 3,
        };
        assert!(e.to_string().contains("3 event(s)"));
        assert!(CmError::NoRdmaDevice
            .to_string()
            .contains("rdma link add rxe0 type rxe netdev"));
        assert!(e.is_guarded_misuse());
        let crashed = CmError::HostCrashed {
            call: Call::GetCmEvent,
            at: Duration::from_millis(1500),
        };
        assert_eq!(
            crashed.to_string(),
            "rdma_get_cm_event: the host crashed at virtual time 1.500000000 s; its ids, channels and QPs are gone"
        );
        assert!(!CmError::AddrInUse { call: Call::BindAddr }.is_guarded_misuse());
    }
}
