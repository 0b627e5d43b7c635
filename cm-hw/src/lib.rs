//! The hardware backend of [`cm_core::CmBackend`]: the real librdmacm (rdma-core) through
//! `rdma-sys`, with every call checked first so that misuse gets the same typed
//! [`CmError`] as from the simulator instead of a hang, a crash or a leak.
//!
//! [`HwBackend`] is the backend; [`probe`] tells whether an RDMA device answers at all.
//!
//! What the checks buy, compared with calling librdmacm directly:
//!
//! * `destroy_id` with an event retrieved and not acked is refused
//!   ([`CmError::UnackedEvents`]) instead of blocking forever in `rdma_destroy_id`;
//! * `destroy_id` with a QP attached is refused ([`CmError::QpAttached`]) instead of leaking the
//!   QP and its CQs; `destroy_event_channel` with ids still on it ([`CmError::ChannelBusy`])
//!   instead of leaking them and leaving them on a closed fd;
//! * `destroy_qp` without a QP, `accept` without a QP and `resolve_route` without a device are
//!   refused instead of crashing librdmacm on a NULL pointer;
//! * destroyed, unknown and foreign handles are [`CmError::UnknownHandle`], never a use after free;
//! * [`get_cm_event`](cm_core::CmBackend::get_cm_event) and
//!   [`poll_cq`](cm_core::CmBackend::poll_cq) take a timeout: nothing blocks without a bound.
//!
//! The backend needs an RDMA device to do anything beyond that checking. Without one (no RDMA
//! driver loaded, or a kernel without RDMA) the first channel fails with
//! [`CmError::NoRdmaDevice`]; Soft-RoCE turns any Ethernet interface into one, see the crate's
//! README.
//!
//! # Example
//!
//! A server and a client in one process, on the address in `CM_HW_ADDR` (the address of an
//! interface that carries an RDMA device):
//!
//! ```no_run
//! use std::time::Duration;
//! use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, QpCaps};
//! use cm_hw::HwBackend;
//!
//! fn main() -> Result<(), Box<dyn std::error::Error>> {
//!     cm_hw::probe()?; // NoRdmaDevice here says how to add a Soft-RoCE device
//!     let addr: std::net::SocketAddr = format!("{}:7471", std::env::var("CM_HW_ADDR")?).parse()?;
//!     let t = Duration::from_secs(5);
//!     let mut hw = HwBackend::new()?;
//!
//!     let ch = hw.create_event_channel()?;
//!     let listener = hw.create_id(ch, PortSpace::Tcp)?;
//!     hw.bind_addr(listener, addr)?;
//!     hw.listen(listener, 8)?;
//!
//!     let client = hw.create_id(ch, PortSpace::Tcp)?;
//!     hw.resolve_addr(client, None, addr, t)?;
//!     let ev = hw.get_cm_event(ch, t)?.expect("ADDR_RESOLVED within 5 s");
//!     assert_eq!(ev.event(), CmEventType::AddrResolved);
//!     hw.ack_cm_event(ev)?;
//!     hw.resolve_route(client, t)?;
//!     let ev = hw.get_cm_event(ch, t)?.expect("ROUTE_RESOLVED within 5 s");
//!     hw.ack_cm_event(ev)?;
//!     hw.create_qp(client, QpCaps::new())?;
//!     hw.connect(client, &ConnParam::new().with_private_data(b"hello"))?;
//!
//!     let req = hw.get_cm_event(ch, t)?.expect("CONNECT_REQUEST within 5 s");
//!     assert_eq!(req.event(), CmEventType::ConnectRequest);
//!     let child = req.id();
//!     hw.ack_cm_event(req)?;
//!     hw.create_qp(child, QpCaps::new())?;
//!     hw.accept(child, &ConnParam::new())?;
//!     // ... ESTABLISHED on both ids, post_send / post_recv / poll_cq, disconnect ...
//!
//!     // Misuse is refused, not a hang: the client still has its QP.
//!     assert!(hw.destroy_id(client).is_err());
//!     Ok(()) // dropping the backend releases everything in librdmacm's order
//! }
//! ```
#![deny(missing_docs)]
// Every `unsafe` lives in `sys`, where each block states why it is sound; the rest of the crate
// cannot add one without this lint saying so.
#![deny(unsafe_code)]

mod backend;
mod convert;
mod guard;
mod onesided;
mod pool;
#[allow(unsafe_code)]
mod sys;

#[cfg(feature = "differential")]
#[doc(hidden)]
pub use backend::differential::RawOutcome;
pub use backend::{HwBackend, MAX_MESSAGE_SIZE, MAX_MR_SIZE, MAX_QP_BUFFER_BYTES};
/// rdma-core's C API (the `rdma-sys` bindings this crate is built on), for the types of
/// [`RawId`]: an application that drives its own QPs calls verbs through it or another crate.
pub use rdma_sys as ffi;
pub use sys::RawId;

use std::os::fd::{AsRawFd, BorrowedFd};
use std::time::Duration;

use cm_core::{Call, CmError};

/// Whether an RDMA device answers: creates an event channel and destroys it again.
///
/// `Err(CmError::NoRdmaDevice)` when librdmacm finds no RDMA device (`ENODEV`); its message
/// says how to add a Soft-RoCE one. Other failures are [`CmError::Os`] with the errno.
pub fn probe() -> Result<(), CmError> {
    let channel = sys::Channel::create().map_err(|e| convert::os_error(Call::CreateEventChannel, e))?;
    // A fresh channel has no ids, so this is not refused.
    let _ = channel.destroy();
    Ok(())
}

/// Waits at most `timeout` (rounded up to whole milliseconds) for `fd` to turn readable, with
/// `poll(2)`: the simplest event loop over [`HwBackend::channel_fd`] or [`HwBackend::cq_fd`].
/// `Ok(true)` when readable (or in error, which the next read reports), `Ok(false)` when the time
/// ran out; an error of kind `Interrupted` when a signal cut the wait short.
///
/// ```no_run
/// use std::time::Duration;
/// use cm_core::CmBackend;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let mut hw = cm_hw::HwBackend::new()?;
/// let ch = hw.create_event_channel()?;
/// // ... ids on `ch` resolve, listen or connect ...
/// if cm_hw::wait_readable(hw.channel_fd(ch)?, Duration::from_secs(1))? {
///     while let Some(event) = hw.try_get_cm_event(ch)? {
///         println!("{event}");
///         hw.ack_cm_event(event)?;
///     }
/// }
/// # Ok(()) }
/// ```
pub fn wait_readable(fd: BorrowedFd<'_>, timeout: Duration) -> std::io::Result<bool> {
    sys::poll_readable(fd.as_raw_fd(), convert::millis_ceil(timeout))
        .map_err(std::io::Error::from_raw_os_error)
}

/// Raises this process's soft limit on open file descriptors (`RLIMIT_NOFILE`) to its hard limit
/// and returns the new soft limit.
///
/// Every QP of [`HwBackend`] holds one file descriptor, its CQ's completion channel (see
/// [`HwBackend::cq_fd`]), besides the device's own. With the usual soft limit of 1024 a process
/// runs out of descriptors near a thousand QPs, where the hard limit (often 4096 or more) would
/// allow more: a program that opens many connections calls this first.
///
/// ```no_run
/// let limit = cm_hw::raise_fd_limit()?;
/// println!("up to {limit} open files");
/// # Ok::<(), std::io::Error>(())
/// ```
pub fn raise_fd_limit() -> std::io::Result<u64> {
    sys::raise_nofile_limit().map_err(std::io::Error::from_raw_os_error)
}
