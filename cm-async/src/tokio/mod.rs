//! The tokio runtime (feature `tokio`): tasks on a `LocalSet`, tokio's timers, and the
//! backend's event-channel and CQ fds watched through `AsyncFd`.

use std::any::Any;
use std::collections::BTreeMap;
use std::future::{poll_fn, Future};
use std::os::fd::{AsRawFd, BorrowedFd, OwnedFd, RawFd};
use std::rc::{Rc, Weak};
use std::task::{Context, Poll};
use std::time::Duration;

use cm_core::{ChannelHandle, CmBackend, IdHandle};
use tokio::io::unix::AsyncFd;
use tokio::io::Interest;

use crate::conn::Cm;
use crate::driver::{Registrations, Shared};
use crate::error::Result;
use crate::runtime::{joinable, JoinHandle, Runtime};

mod send;
pub use send::{CmThread, SendCm, SendConnection, SendListener, SendRequest};

/// A backend with file descriptors to wait on: the event channel's (readable when
/// `try_get_cm_event` has an event) and each QP's completion channel (readable after
/// `try_poll_cq` returned 0 and a completion arrived since).
pub trait Readiness: CmBackend {
    /// The event channel's fd.
    fn channel_fd(&self, channel: ChannelHandle) -> cm_core::Result<BorrowedFd<'_>>;
    /// The fd of the completion channel of `id`'s QP.
    fn cq_fd(&self, id: IdHandle) -> cm_core::Result<BorrowedFd<'_>>;
}

#[cfg(feature = "hw")]
impl Readiness for cm_hw::HwBackend {
    fn channel_fd(&self, channel: ChannelHandle) -> cm_core::Result<BorrowedFd<'_>> {
        cm_hw::HwBackend::channel_fd(self, channel)
    }

    fn cq_fd(&self, id: IdHandle) -> cm_core::Result<BorrowedFd<'_>> {
        cm_hw::HwBackend::cq_fd(self, id)
    }
}

/// A duplicate of a backend fd, owned by its registration.
struct Fd(OwnedFd);

impl AsRawFd for Fd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Registers a duplicate of `fd` with tokio's reactor.
///
/// tokio 1.54 deprecated its safe constructors because a caller could close the fd while it is
/// registered; here the registration owns its duplicate, so the fd stays open exactly as long
/// as the registration, which is the condition the unsafe replacement asks for (and `unsafe` is
/// kept out of this crate).
#[allow(deprecated)]
fn register(fd: BorrowedFd<'_>) -> std::io::Result<AsyncFd<Fd>> {
    AsyncFd::with_interest(Fd(fd.try_clone_to_owned()?), Interest::READABLE)
}

#[derive(Default)]
struct TokioRegs {
    channel: Option<AsyncFd<Fd>>,
    cqs: BTreeMap<IdHandle, AsyncFd<Fd>>,
}

impl Registrations for TokioRegs {
    fn forget(&mut self, id: IdHandle) {
        self.cqs.remove(&id);
    }

    fn as_any_mut(&mut self) -> &mut dyn Any {
        self
    }
}

/// tokio as the layer's [`Runtime`]. Tasks are spawned with `tokio::task::spawn_local`, so
/// everything runs inside a `tokio::task::LocalSet` (which runs inside a multi-threaded runtime
/// too, on the thread that drives it); see the crate docs for why. Spread load over threads
/// with one `LocalSet` and one backend per thread: the hardware backend is `Send`.
///
/// ```
/// use std::time::Duration;
/// use cm_async::{tokio::TokioRuntime, Runtime};
///
/// let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build().unwrap();
/// let local = tokio::task::LocalSet::new();
/// let answer = local.block_on(&rt, async {
///     let tr = TokioRuntime::new();
///     let task = tr.spawn(async { 6 * 7 });
///     let late = tr.timeout(Duration::from_millis(1), tr.sleep(Duration::from_secs(5))).await;
///     assert!(late.is_err());
///     task.await
/// });
/// assert_eq!(answer, Some(42));
/// ```
#[derive(Clone, Debug)]
pub struct TokioRuntime {
    start: tokio::time::Instant,
}

impl Default for TokioRuntime {
    fn default() -> Self {
        Self::new()
    }
}

impl TokioRuntime {
    /// A runtime whose clock starts now. Use it inside a `LocalSet` on a tokio runtime with
    /// time and I/O enabled.
    pub fn new() -> Self {
        TokioRuntime {
            start: tokio::time::Instant::now(),
        }
    }

    /// An event channel on `backend`, driven by a local task that waits on its fds.
    ///
    /// # Panics
    /// Outside a `LocalSet` on a tokio runtime with I/O enabled.
    pub fn cm<B: Readiness + 'static>(&self, backend: B) -> Result<Cm<B, TokioRuntime>> {
        let cm = Cm::new(backend, self.clone())?;
        {
            let mut st = cm.sh.st.borrow_mut();
            let channel =
                register(st.b.channel_fd(st.ch)?).map_err(|e| os_error(cm_core::Call::GetCmEvent, &e))?;
            st.regs = Some(Box::new(TokioRegs {
                channel: Some(channel),
                cqs: BTreeMap::new(),
            }));
        }
        tokio::task::spawn_local(drive(Rc::downgrade(&cm.sh)));
        Ok(cm)
    }
}

/// The channel's driver: pumps whenever the channel's fd or a watched CQ's fd turns readable,
/// and whenever a task starts waiting on a CQ. Ends when the channel is gone.
async fn drive<B: Readiness + 'static>(sh: Weak<Shared<B>>) {
    poll_fn(|cx| {
        let Some(sh) = sh.upgrade() else {
            return Poll::Ready(());
        };
        loop {
            sh.pump(true);
            if !poll_fds(&sh, cx) {
                return Poll::Pending;
            }
        }
    })
    .await
}

/// Registers the fds of the CQs tasks wait on and polls every fd; whether one was readable
/// (its readiness is then cleared and the caller pumps again).
fn poll_fds<B: Readiness>(sh: &Shared<B>, cx: &mut Context<'_>) -> bool {
    let mut st = sh.st.borrow_mut();
    st.driver = Some(cx.waker().clone());
    let watched: Vec<IdHandle> = st.watched().collect();
    let st = &mut *st;
    let Some(regs) = st.regs.as_mut() else {
        return false;
    };
    let Some(regs) = regs.as_any_mut().downcast_mut::<TokioRegs>() else {
        return false;
    };
    let mut failure = None;
    for id in watched {
        if let std::collections::btree_map::Entry::Vacant(v) = regs.cqs.entry(id) {
            // An id without a QP any more is being released, which wakes its waiters.
            if let Ok(fd) = st.b.cq_fd(id) {
                match register(fd) {
                    Ok(a) => {
                        v.insert(a);
                    }
                    Err(e) => failure = Some(os_error(cm_core::Call::PollCq, &e)),
                }
            }
        }
    }
    if let Some(e) = failure {
        st.fail(e);
        return false;
    }
    let mut readable = false;
    let fds = regs.channel.iter().chain(regs.cqs.values());
    for a in fds {
        if let Poll::Ready(Ok(mut guard)) = a.poll_read_ready(cx) {
            guard.clear_ready();
            readable = true;
        }
    }
    readable
}

fn os_error(call: cm_core::Call, e: &std::io::Error) -> cm_core::CmError {
    cm_core::CmError::Os {
        call,
        errno: e.raw_os_error().unwrap_or(0),
    }
}

impl Runtime for TokioRuntime {
    fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let (task, handle) = joinable(fut);
        tokio::task::spawn_local(task);
        handle
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + 'static {
        tokio::time::sleep(duration)
    }

    fn now(&self) -> Duration {
        self.start.elapsed()
    }
}
