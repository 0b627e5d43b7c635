//! The contract every RDMA connection-management backend fulfils.
//!
//! * [`CmBackend`]: librdmacm's calls (`rdma_create_id`, `rdma_resolve_addr`, `rdma_connect`,
//!   `rdma_disconnect`, `rdma_get_cm_event`, ...), one method each, plus a small data path
//!   (`post_send`, `post_recv`, `poll_cq`) to observe the flush a disconnect causes.
//! * Types that mirror librdmacm: [`CmEventType`] with rdma-core's numbers and names,
//!   [`PortSpace`], [`CmEvent`], [`ConnParam`], [`QpCaps`], [`WorkCompletion`] with
//!   [`WcStatus`] numbered like `ibv_wc_status`.
//! * One error enum, [`CmError`], shared by every backend; each variant knows its errno.
//! * The id and QP state machines ([`IdMachine`], [`IdState`], [`QpState`]) as pure code: every
//!   backend checks calls against them, so misuse is answered alike everywhere.
//!
//! Backends: `cm-sim` (deterministic, in memory) and `cm-hw` (the real librdmacm).
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod backend;
mod error;
mod event;
mod handle;
mod state;
mod types;

pub use backend::{CmBackend, Result};
pub use error::{errno, errno_text, Call, CmError, ReturnedEvent};
pub use event::{CmEvent, CmEventType, ConnParam, PrivateData, MAX_PRIVATE_DATA};
pub use handle::{next_backend_tag, ChannelHandle, HandleKind, IdHandle};
pub use state::{ConnPhase, IdMachine, IdState, IllegalEvent, QpState, Role};
pub use types::{LiveResources, PortSpace, PrivateDataSlot, QpCaps, WcOpcode, WcStatus, WorkCompletion};

/// The README's examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
