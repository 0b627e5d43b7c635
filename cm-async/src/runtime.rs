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
                if let Poll::Ready(v) = fut.as_mut().poll(cx) {
                    return Poll::Ready(Ok(v));
                }
                match sleep.as_mut().poll(cx) {
                    Poll::Ready(()) => Poll::Ready(Err(Elapsed)),
                    Poll::Pending => Poll::Pending,
                }
            })
            .await
        }
    }
}

/// A timeout passed first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Elapsed;

impl std::fmt::Display for Elapsed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("timed out")
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
    /// block: the block kept the future twice (captured, then awaited), each a copy of the whole
    /// future per spawn, and was one state machine more to go through at every poll.
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
