//! The contract every RDMA connection-management backend fulfils.
//!
//! * [`CmBackend`]: librdmacm's calls (`rdma_create_id`, `rdma_resolve_addr`, `rdma_connect`,
//!   `rdma_disconnect`, `rdma_get_cm_event`, ...), one method each, plus a small data path
//!   (`post_send`, `post_recv`, `poll_cq`) to observe the flush a disconnect causes, and the
//!   one-sided operations over registered memory ([`Access`], [`SendWr`], [`SrqCaps`],
//!   [`AsyncEvent`]).
//! * Types that mirror librdmacm: [`CmEventType`] with rdma-core's numbers and names,
//!   [`PortSpace`], [`CmEvent`], [`ConnParam`], [`QpCaps`], [`WorkCompletion`] with
//!   [`WcStatus`] numbered like `ibv_wc_status`.
//! * One error enum, [`CmError`], shared by every backend; each variant knows its errno.
//! * The id and QP state machines ([`IdMachine`], [`IdState`], [`QpState`]) as pure code: every
//!   backend checks calls against them, so misuse is answered alike everywhere.
//!
//! Backends: `cm-sim` (deterministic, in memory) and `cm-hw` (the real librdmacm).
//!
//! # Design rules
//!
//! * **State is what the application has observed.** An [`IdMachine`] moves when a call
//!   succeeds and when an event is *retrieved* ([`IdMachine::on_event`]), not when the kernel
//!   generates the event. librdmacm checks against the kernel state instead, so a
//!   `rdma_resolve_route` issued after the kernel resolved the address but before the
//!   application retrieved `ADDR_RESOLVED` may succeed or fail there depending on timing; here
//!   it always fails. This removes a race and makes every backend answer alike.
//! * **A call is checked before it acts.** Each call method of [`IdMachine`] returns the
//!   machine *after* the call, or the error, and never changes `self`: a backend does the real
//!   work only when the check passed and stores the new machine only when the work succeeded.
//! * **Misuse that would hang, crash or leak in librdmacm is a typed error**
//!   ([`CmError::is_guarded_misuse`]): destroying an id with unacked events or a QP, acking an
//!   event twice, calls that would dereference NULL.
//! * **Handles are values.** A destroyed, unknown or foreign handle is
//!   [`CmError::UnknownHandle`], never a use after free.
//! * **Every event is acked exactly once.** [`CmEvent`] is neither `Clone` nor `Copy` and
//!   [`CmBackend::ack_cm_event`] takes it by value; one dropped unacked stays counted against
//!   its id, as in librdmacm.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod async_event;
/// What only backends need: constructors that forge handles and events. Hidden from the docs
/// because applications only ever receive these values.
#[doc(hidden)]
pub mod backend;
mod datagram;
mod error;
mod event;
mod external;
mod handle;
mod invocation;
mod memory;
mod multicast;
mod options;
mod slab;
mod srq;
mod state;
mod types;
mod verbs_qp;
mod work_request;
mod wr_pool;

pub use async_event::AsyncEvent;
pub use backend::{CmBackend, Result};
pub use datagram::{
    gid_ip, grh, grh_source, link_local_gid, port_eui64, AhAttr, UdParam, UdSender, GRH_LEN, UDP_QKEY,
};
pub use error::{errno, errno_text, Call, CmError, ReturnedEvent};
pub use event::{CmEvent, CmEventType, ConnParam, PrivateData, MAX_PRIVATE_DATA};
pub use external::{
    AddressVector, GlobalRoute, QpAttr, QpAttrMask, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ,
    ACCESS_REMOTE_WRITE, MTU_1024,
};
pub use handle::{ChannelHandle, HandleKind, IdHandle, MrHandle, QpHandle, SrqHandle};
pub use invocation::{Invocation, Outcome};
pub use memory::{check_range, Access, MrInfo, RemoteAddr, RemoteMr, Sge};
pub use multicast::{group_ud_param, MULTICAST_QPN};
pub use options::{getaddrinfo, AddrHints, AddrInfo, IdOption, SyncId, CREATE_EP_TIMEOUT};
pub use srq::{check_srq_limit, SrqCaps};
pub use state::{ConnPhase, IdMachine, IdState, IllegalEvent, QpState, Role};
pub use types::{LiveResources, PortSpace, PrivateDataSlot, QpCaps, WcOpcode, WcStatus, WorkCompletion};
pub use verbs_qp::{QpType, VerbsLimits, VerbsQp, VerbsQpAttr, VerbsQpState};
pub use work_request::{check_local_sge, LocalRegion, SendOp, SendWr, ATOMIC_LEN};

/// The README's examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
