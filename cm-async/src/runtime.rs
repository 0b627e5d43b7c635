//! The small runtime interface application code is generic over: spawn, sleep, timeout, now.

use std::cell::RefCell;
use std::future::{poll_fn, Future};
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::{Context, Poll, Waker};
use std::time::Duration;

/// Spawning and time, as application code sees them. Two implementations: the simulator's
/// deterministic executor ([`SimRuntime`](crate::sim::SimRuntime), virtual time) and tokio
/// (`TokioRuntime`, feature `tokio`).
///
/// `spawn` takes futures that need not be `Send`: connections share their event channel's
/// driver through `Rc` (see the crate docs for why), so tasks stay on the thread that made them.
pub trait Runtime: Clone + 'static {
    /// Runs `fut` as a task of its own; its output comes back through the handle.
    fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static;

    /// Completes `duration` from now.
    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + 'static;

    /// Time since the runtime started (virtual on the simulator).
    fn now(&self) -> Duration;

    /// `fut`'s output, or [`Elapsed`] when `duration` passes first (then `fut` is dropped,
    /// which cancels it).
    ///
    /// The [`Elapsed`] names the layer's operation `fut` was waiting in when the time passed
    /// ([`Elapsed::op`]: `"recv"`, `"send"`, `"accept"`, ...), and so does the
    /// [`Error::TimedOut`](crate::Error::TimedOut) it converts into:
    ///
    /// ```
    /// # use cm_async::{Connection, Error, Runtime};
    /// # async fn f<B: cm_core::CmBackend + 'static, R: Runtime>(rt: R, conn: Connection<B, R>) {
    /// let r: Result<Vec<u8>, Error> = async {
    ///     Ok(rt.timeout(std::time::Duration::from_secs(5), conn.recv()).await??)
    /// }
    /// .await;
    /// if let Err(Error::TimedOut { op }) = r {
    ///     assert_eq!(op, "recv");
    /// }
    /// # }
    /// ```
    fn timeout<F: Future>(
        &self,
        duration: Duration,
        fut: F,
    ) -> impl Future<Output = Result<F::Output, Elapsed>> {
        let sleep = self.sleep(duration);
        async move {
            let mut fut = pin!(fut);
            let mut sleep = pin!(sleep);
            poll_fn(|cx| {
                // Whatever a wait outside this timeout noted is not this future's: put aside,
                // and put back unless something inside noted its own (which an enclosing
                // timeout should then see, as it waits in the same operation).
                let outside = WAITING_IN.replace(None);
                let polled = fut.as_mut().poll(cx);
                let inside = WAITING_IN.get();
                if inside.is_none() {
                    WAITING_IN.set(outside);
                }
                if let Poll::Ready(v) = polled {
                    return Poll::Ready(Ok(v));
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(Elapsed { op: inside })),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        }
    }
}

thread_local! {
    /// The layer operation whose wait last returned `Pending` on this thread. A timeout clears
    /// it before polling its future and reads it after, to name what it cut short: a future
    /// knows nothing of the timeout around it, and the layer's waits cannot reach the timeout
    /// but through the thread both run on (tasks never move between threads).
    static WAITING_IN: std::cell::Cell<Option<&'static str>> = const { std::cell::Cell::new(None) };
}

/// Notes that the wait of layer operation `op` is about to return `Pending`, for a
/// [`Runtime::timeout`] around it to name it.
#[inline]
pub(crate) fn waiting_in(op: &'static str) {
    WAITING_IN.set(Some(op));
}

/// A timeout passed first. It names the layer operation the future was waiting in, when it
/// was waiting in one. A runtime that overrides [`Runtime::timeout`] without that knowledge
/// reports `Elapsed::default()` (the operation unnamed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Elapsed {
    op: Option<&'static str>,
}

impl Elapsed {
    /// The layer operation the future was waiting in when its time passed (`"connect"`,
    /// `"accept"`, `"request"`, `"send"`, `"recv"`, `"recv_imm"`, `"read"`, `"write"`,
    /// `"write_with_imm"`, `"compare_swap"`, `"fetch_add"`, `"disconnect"`), or `"operation"`
    /// when it waited in none (on a sleep, a join handle, another library's future).
    pub fn op(&self) -> &'static str {
        self.op.unwrap_or("operation")
    }
}

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} timed out", self.op())
    }
}

impl std::error::Error for Elapsed {}

pub(crate) struct Slot<T> {
    value: Option<T>,
    finished: bool,
    waker: Option<Waker>,
}

/// The output of a spawned task: `Some(output)`, or `None` when the task was dropped before it
/// finished (its host crashed, or the run ended). Dropping the handle detaches the task.
#[must_use = "dropping a JoinHandle detaches the task; await it to get its output"]
pub struct JoinHandle<T> {
    slot: Rc<RefCell<Slot<T>>>,
}

/// Wraps `fut` so that its output lands in the returned handle; runtimes spawn the wrapper.
pub(crate) fn joinable<F>(fut: F) -> (Joined<F>, JoinHandle<F::Output>)
where
    F: Future + 'static,
    F::Output: 'static,
{
    let slot = Rc::new(RefCell::new(Slot {
        value: None,
        finished: false,
        waker: None,
    }));
    let task = Delivering::new(fut, Finish(slot.clone()));
    (task, JoinHandle { slot })
}

/// Where a finished future's output is put: a spawned task's join slot, or a host task's
/// output cell.
pub(crate) trait Sink<T> {
    fn put(&mut self, value: T);
}

pin_project_lite::pin_project! {
    /// A future and where its output goes, polled as one task. A struct rather than an `async`
    /// block: the block would keep the future twice (captured, then awaited), each a copy of the
    /// whole future per spawn, and be one state machine more to go through at every poll.
    pub(crate) struct Delivering<F, S> {
        #[pin]
        fut: F,
        sink: S,
    }
}

impl<F, S> Delivering<F, S> {
    pub(crate) fn new(fut: F, sink: S) -> Self {
        Delivering { fut, sink }
    }
}

impl<F: Future, S: Sink<F::Output>> Future for Delivering<F, S> {
    type Output = ();

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let this = self.project();
        match this.fut.poll(cx) {
            Poll::Ready(v) => {
                this.sink.put(v);
                Poll::Ready(())
            }
            Poll::Pending => Poll::Pending,
        }
    }
}

/// A spawned future whose output lands in its [`JoinHandle`].
pub(crate) type Joined<F> = Delivering<F, Finish<<F as Future>::Output>>;

impl<T> Sink<T> for Finish<T> {
    fn put(&mut self, value: T) {
        self.0.borrow_mut().value = Some(value);
    }
}

/// Marks the task finished and wakes the joiner when the task ends or is dropped.
pub(crate) struct Finish<T>(Rc<RefCell<Slot<T>>>);

impl<T> Drop for Finish<T> {
    fn drop(&mut self) {
        let waker = {
            let mut s = self.0.borrow_mut();
            s.finished = true;
            s.waker.take()
        };
        if let Some(w) = waker {
            w.wake();
        }
    }
}

impl<T> Future for JoinHandle<T> {
    type Output = Option<T>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<T>> {
        let mut s = self.slot.borrow_mut();
        if s.finished {
            return Poll::Ready(s.value.take());
        }
        s.waker = Some(cx.waker().clone());
        Poll::Pending
    }
}
