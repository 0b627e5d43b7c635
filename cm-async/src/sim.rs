//! The deterministic executor: hosts are async closures on a [`SimFabric`], tasks run in an
//! order drawn from the seed, and time is the fabric's virtual time, moved on only when every
//! task waits.

use std::cell::{Cell, RefCell};
use std::fmt;
use std::future::Future;
use std::net::IpAddr;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::pin::Pin;
use std::rc::{Rc, Weak};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll, Wake, Waker};
use std::time::Duration;

use cm_core::ChannelHandle;
use cm_sim::{SimFabric, SimHost, SimTime, Step};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::conn::Cm;
use crate::driver::Shared;
use crate::error::Result;
use crate::runtime::{joinable, Delivering, JoinHandle, Runtime, Sink};

type BoxFuture<T> = Pin<Box<dyn Future<Output = T>>>;
/// A host's closure: given its runtime, its backend and where its output lands, the task to
/// run (the closure makes the host's [`HostCtx`], of the type its host was defined with).
type HostFn<T> = Rc<dyn Fn(SimRuntime, SimHost, Output<T>) -> BoxFuture<()>>;
/// Where a host closure's output lands, once it returns.
type Output<T> = Rc<RefCell<Option<Landed<T>>>>;

/// What a host's closure left when it returned.
enum Landed<T> {
    /// The value, of the run's output type.
    Value(T),
    /// A host of its own type: the value went to its [`HostResult`].
    Elsewhere,
}

/// Why a simulated run failed. `Display` ends with the seed to reproduce it and the trace file.
#[derive(Debug)]
pub struct SimFailure {
    /// What went wrong.
    pub kind: FailureKind,
    /// The fabric's seed: run again with `CM_SIM_SEED=<seed>`.
    pub seed: u64,
    /// The trace of the failed run, when it could be written.
    pub trace: Option<PathBuf>,
}

/// What made a run fail.
#[derive(Debug)]
pub enum FailureKind {
    /// A task panicked.
    Panic {
        /// The task.
        task: String,
        /// The panic's message.
        message: String,
    },
    /// Virtual time would pass the run's deadline before every client finished.
    Deadline {
        /// The deadline.
        deadline: SimTime,
        /// The tasks still waiting.
        waiting: Vec<String>,
    },
    /// Every task waits and nothing is scheduled: nothing can ever wake them.
    Deadlock {
        /// When.
        at: SimTime,
        /// The tasks waiting.
        waiting: Vec<String>,
    },
    /// Tasks kept running while virtual time stood still, for [`Sim::livelock_after`] polls:
    /// a task that wakes itself for ever (a spin on a condition nothing will change) would
    /// otherwise hold the run at one instant, and its test, for ever.
    Livelock {
        /// The instant time stood still at.
        at: SimTime,
        /// How many task polls it stood still for: the bound.
        steps: u64,
        /// The tasks polled in the last of those steps (up to [`LIVELOCK_SAMPLE`] of them), in
        /// the order they first ran there: the ones that kept running.
        running: Vec<String>,
    },
}

/// How many of a livelock's last steps [`FailureKind::Livelock`] names the tasks of.
pub const LIVELOCK_SAMPLE: u64 = 1024;

impl fmt::Display for SimFailure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.kind {
            FailureKind::Panic { task, message } => write!(f, "task {task} panicked: {message}")?,
            FailureKind::Deadline { deadline, waiting } => write!(
                f,
                "virtual deadline {deadline} passed; still waiting: {}",
                waiting.join(", ")
            )?,
            FailureKind::Deadlock { at, waiting } => write!(
                f,
                "deadlock at {at}: every task waits and no timer is armed; waiting: {}",
                waiting.join(", ")
            )?,
            FailureKind::Livelock { at, steps, running } => write!(
                f,
                "livelock at {at}: {steps} task polls without virtual time moving; still running: {} \
                 (Sim::livelock_after raises the bound for long work at one instant)",
                running.join(", ")
            )?,
        }
        write!(f, "; reproduce with {}={}", cm_sim::SEED_ENV, self.seed)?;
        if let Some(t) = &self.trace {
            write!(f, "; trace: {}", t.display())?;
        }
        Ok(())
    }
}

impl std::error::Error for SimFailure {}

/// How a host ended the run.
#[derive(Debug, PartialEq, Eq)]
pub enum HostOutcome<T> {
    /// Its closure returned this (in its last incarnation).
    Finished(T),
    /// A server host still running when every client had finished.
    Running,
    /// The host was down when the run ended.
    Crashed,
    /// Nothing ran on the host.
    Idle,
    /// The host was defined with [`Sim::server_with`] or [`Sim::client_with`]: its outcome,
    /// of its own type, is read from the [`HostResult`] those returned. (A [`HostResult`]'s
    /// outcome is never this.)
    Typed,
}

/// The output type of the [`HostCtx`] of a host defined with [`Sim::server`] or
/// [`Sim::client`]: no value of it exists, so such a host has nothing to
/// [`report`](HostCtx::report) (its outcome is one of the run's, of the run's type).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Untyped {}

/// How a host of its own type ended, once the run did.
#[derive(Clone, Copy)]
enum End {
    Finished,
    Running,
    Crashed,
    Idle,
}

/// What a host of its own type shares with its [`HostResult`] and its contexts.
struct TypedState<U> {
    /// What its closure returned, in the last incarnation that returned.
    finished: RefCell<Option<U>>,
    /// The last value [`HostCtx::report`] was given, in any incarnation.
    reported: RefCell<Option<U>>,
    /// Set when the run ends without failing (or at once, to `Idle`, when a later definition
    /// for the same host replaced this one).
    end: Cell<Option<End>>,
}

/// The outcome of a host defined with its own output type `U` ([`Sim::server_with`],
/// [`Sim::client_with`]), read after [`Sim::run`] returned `Ok`; and the last value the host
/// [reported](HostCtx::report), read at any time.
///
/// The outcome means what the run's [`HostOutcome`]s mean: `Finished(v)` when its closure
/// returned `v` (in the last incarnation that returned), `Running` when it was still running
/// when every client had finished, `Crashed` when its host was down when the run ended, and
/// `Idle` when nothing of it ran (a later definition for the same host replaced it). A server
/// that loops for ever ends `Running`: what it did is what it last reported.
///
/// ```
/// use cm_async::sim::{HostOutcome, Sim};
/// use cm_sim::SimFabric;
///
/// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").host("10.0.0.2").build();
/// // The run's type is the client's: the server's is its own.
/// let mut sim: Sim<&str> = Sim::new(fabric);
/// let server = sim.server_with(0, |ctx| async move {
///     let mut rounds = 0u32;
///     loop {
///         cm_async::Runtime::sleep(ctx.runtime(), std::time::Duration::from_millis(1)).await;
///         rounds += 1;
///         ctx.report(rounds);
///     }
/// });
/// sim.client(1, |ctx| async move {
///     cm_async::Runtime::sleep(ctx.runtime(), std::time::Duration::from_micros(3500)).await;
///     "done"
/// });
/// let outcomes = sim.run().expect("the run succeeds");
/// assert_eq!(outcomes[0], HostOutcome::Typed);
/// assert_eq!(outcomes[1], HostOutcome::Finished("done"));
/// assert_eq!(server.reported(), Some(3));
/// assert_eq!(server.into_outcome(), Some(HostOutcome::Running));
/// ```
pub struct HostResult<U> {
    state: Rc<TypedState<U>>,
}

impl<U: fmt::Debug> fmt::Debug for HostResult<U> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HostResult")
            .field("finished", &self.state.finished.borrow())
            .field("reported", &self.state.reported.borrow())
            .field("ended", &self.state.end.get().is_some())
            .finish()
    }
}

impl<U> HostResult<U> {
    /// The host's outcome: `None` until a run that defined it returned `Ok` (before the run,
    /// or when the run failed), except for a definition replaced by a later one for the same
    /// host, which is `Idle` at once. Never [`HostOutcome::Typed`].
    pub fn into_outcome(self) -> Option<HostOutcome<U>> {
        Some(match self.state.end.get()? {
            End::Finished => HostOutcome::Finished(self.state.finished.borrow_mut().take()?),
            End::Running => HostOutcome::Running,
            End::Crashed => HostOutcome::Crashed,
            End::Idle => HostOutcome::Idle,
        })
    }

    /// [`into_outcome`](Self::into_outcome), keeping the handle.
    pub fn outcome(&self) -> Option<HostOutcome<U>>
    where
        U: Clone,
    {
        Some(match self.state.end.get()? {
            End::Finished => HostOutcome::Finished(self.state.finished.borrow().clone()?),
            End::Running => HostOutcome::Running,
            End::Crashed => HostOutcome::Crashed,
            End::Idle => HostOutcome::Idle,
        })
    }

    /// The last value the host gave [`HostCtx::report`], in whichever incarnation (a restarted
    /// host's earlier reports stay until it reports again); `None` when it gave none. Readable
    /// during the run too, and after a failed one.
    pub fn reported(&self) -> Option<U>
    where
        U: Clone,
    {
        self.state.reported.borrow().clone()
    }

    /// [`reported`](Self::reported), taken out of the handle: for values that are not `Clone`.
    pub fn take_reported(&self) -> Option<U> {
        self.state.reported.borrow_mut().take()
    }
}

/// Ends a host of its own type when the run does: object-safe, so that the executor, which
/// knows only the run's type, keeps one per typed host.
trait TypedEnd {
    /// Records how the run ended for the host: `up` says whether its host was up.
    fn end(&self, up: bool);
    /// Records that nothing of the host will run.
    fn idle(&self);
}

impl<U> TypedEnd for TypedState<U> {
    fn end(&self, up: bool) {
        let how = if self.finished.borrow().is_some() {
            End::Finished
        } else if !up {
            End::Crashed
        } else {
            End::Running
        };
        self.end.set(Some(how));
    }

    fn idle(&self) {
        self.end.set(Some(End::Idle));
    }
}

/// A typed host's output: its value to its state, and a mark to the executor's cell that it
/// returned.
struct TypedSink<T, U> {
    out: Output<T>,
    state: Rc<TypedState<U>>,
}

impl<T, U> Sink<U> for TypedSink<T, U> {
    fn put(&mut self, value: U) {
        *self.state.finished.borrow_mut() = Some(value);
        *self.out.borrow_mut() = Some(Landed::Elsewhere);
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Server,
    Client,
}

struct HostDef<T> {
    kind: Kind,
    run: HostFn<T>,
    /// A host of its own type: its state, ended with the run.
    typed: Option<Rc<dyn TypedEnd>>,
}

/// A task's name, made into text only for reports: `<host address>#main` or `#task<n>`.
#[derive(Clone, Copy, PartialEq, Eq)]
enum TaskName {
    Main,
    Spawned(u64),
}

/// A task as the core knows it; its future is the executor's ([`Executor::futs`]).
struct Task {
    host: usize,
    name: TaskName,
}

struct TaskWaker {
    id: usize,
    ready: Arc<Woken>,
    /// 0 while the slot's task was not woken since the executor last took the woken tasks;
    /// otherwise the number of the first wake since then, which orders the tasks woken.
    woke: AtomicU64,
}

/// Which tasks were woken since the executor last took them, and in what order (each slot's
/// [`TaskWaker::woke`]). A `Waker` must be `Send` and `Sync`; the first 63 slots are marked in
/// a bit mask, which takes no lock, the others in a locked list, which the mask's last bit
/// says is not empty: whether any task was woken is one load. The executor takes them
/// together, ordered by their wakes' numbers: the order in which they were woken.
struct Woken {
    /// The number the next wake gets (from 1).
    next: AtomicU64,
    /// Bit `i` < 63: slot `i` was woken; bit 63 ([`HIGH`]): `high` has some.
    low: AtomicU64,
    /// Slots from 63 up that were woken (possibly twice: the executor skips the repeats).
    high: Mutex<Vec<usize>>,
}

/// The bit of [`Woken::low`] that stands for the locked list, and the first slot put there.
const HIGH: u32 = 63;

impl Default for Woken {
    fn default() -> Self {
        Woken {
            next: AtomicU64::new(1),
            low: AtomicU64::new(0),
            high: Mutex::new(Vec::new()),
        }
    }
}

impl Wake for TaskWaker {
    fn wake(self: Arc<Self>) {
        self.wake_by_ref();
    }

    fn wake_by_ref(self: &Arc<Self>) {
        if self.woke.load(Ordering::Acquire) != 0 {
            // Woken already and not taken yet: it keeps its place.
            return;
        }
        let n = self.ready.next.fetch_add(1, Ordering::Relaxed);
        self.woke.store(n, Ordering::Release);
        if self.id < HIGH as usize {
            self.ready.low.fetch_or(1 << self.id, Ordering::Release);
        } else {
            self.wake_high();
        }
    }
}

impl TaskWaker {
    /// The locked list's part of a wake, out of line: with the lock inlined, every wake saved
    /// and restored the registers it needs.
    #[cold]
    #[inline(never)]
    fn wake_high(&self) {
        self.ready
            .high
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(self.id);
        self.ready.low.fetch_or(1 << HIGH, Ordering::Release);
    }
}

/// The sleeps armed, earliest first by (time, arming order).
///
/// Nearly every timer is a bound that is cancelled long before it fires (`connect` and
/// `disconnect` arm one each), and a bound is armed at now plus the same duration as the one
/// before it: it goes at the back of the queue, and it is the front when it is cancelled,
/// where it leaves in one step. A timer cancelled elsewhere in the queue leaves its entry
/// behind without its waker, dropped when it comes to the front or when such entries
/// outnumber the live ones. The front entry is never a cancelled one.
///
/// The queue is a vector read from `head` on, emptied whenever its last entry leaves: with
/// one bound armed at a time, arming is a push and cancelling a clear. (Before, the wakers
/// were in slots apart from a `VecDeque` of entries, with a free list of slots: each arm and
/// each cancel wrote both, and every pop from the deque wrapped its index.)
#[derive(Default)]
struct Timers {
    /// From `head` on: `(time, sequence number, waker)` of each timer armed and not yet
    /// dropped from here, in firing order; the waker is `None` once cancelled. Before
    /// `head`: entries gone, without their wakers.
    queue: Vec<(u64, u64, Option<Waker>)>,
    head: usize,
    seq: u64,
    /// How many entries from `head` on are cancelled ones.
    dead: usize,
    /// The front entry's time: asked at every step, and kept here it is one load.
    earliest: Option<u64>,
}

/// An armed timer: its time and sequence number (which no other timer gets), its place in
/// the queue's order.
#[derive(Clone, Copy)]
struct TimerKey {
    at: u64,
    seq: u64,
}

impl Timers {
    fn arm(&mut self, at: u64, waker: Waker) -> TimerKey {
        let seq = self.seq;
        self.seq += 1;
        match self.queue.last() {
            Some(&(last, _, _)) if last > at => {
                // Among equal times the earlier armed fires first: after them.
                let i = self.head + self.queue[self.head..].partition_point(|&(t, _, _)| t <= at);
                self.queue.insert(i, (at, seq, Some(waker)));
            }
            _ => self.queue.push((at, seq, Some(waker))),
        }
        if self.earliest.is_none_or(|e| at < e) {
            self.earliest = Some(at);
        }
        TimerKey { at, seq }
    }

    /// How many entries are queued (cancelled ones not dropped yet included).
    #[cfg(test)]
    fn len(&self) -> usize {
        self.queue.len() - self.head
    }

    /// Whether `key`'s timer is the front one (nearly always, when asked).
    #[inline]
    fn is_front(&self, key: TimerKey) -> bool {
        self.queue
            .get(self.head)
            .is_some_and(|&(_, seq, _)| seq == key.seq)
    }

    /// Where `key`'s entry is past the front, if it is still there: out of line, as a timer
    /// cancelled or polled while others fire before it is rare.
    #[cold]
    #[inline(never)]
    fn find_behind(&self, key: TimerKey) -> Option<usize> {
        let i = self.head + self.queue[self.head..].partition_point(|&(t, s, _)| (t, s) < (key.at, key.seq));
        match self.queue.get(i) {
            Some(&(_, seq, _)) if seq == key.seq => Some(i),
            _ => None,
        }
    }

    fn waker_mut(&mut self, key: TimerKey) -> Option<&mut Waker> {
        let i = if self.is_front(key) {
            self.head
        } else {
            self.find_behind(key)?
        };
        self.queue[i].2.as_mut()
    }

    fn cancel(&mut self, key: TimerKey) -> Option<Waker> {
        if self.is_front(key) {
            // The earliest, cancelled (nearly every cancel: a connection's bound is the only
            // timer armed): its entry leaves now.
            return self.pop_front();
        }
        let i = self.find_behind(key)?;
        let waker = self.queue[i].2.take()?;
        self.dead += 1;
        if self.dead > 64 && self.dead > 4 * (self.len_live()) {
            self.queue.drain(..self.head);
            self.head = 0;
            self.queue.retain(|(_, _, w)| w.is_some());
            self.dead = 0;
        }
        Some(waker)
    }

    /// How many armed timers are queued.
    fn len_live(&self) -> usize {
        self.queue.len() - self.head - self.dead
    }

    /// Drops the front entry, and the cancelled ones that come to the front after it.
    #[inline]
    fn pop_front(&mut self) -> Option<Waker> {
        if self.head + 1 == self.queue.len() {
            // The only entry (nearly always: one bound at a time): the queue empties.
            let (_, _, waker) = self.queue.pop()?;
            if self.head != 0 {
                self.queue.clear();
                self.head = 0;
            }
            self.earliest = None;
            return waker;
        }
        self.pop_front_of_many()
    }

    /// [`pop_front`](Self::pop_front) when other entries stay.
    #[inline(never)]
    fn pop_front_of_many(&mut self) -> Option<Waker> {
        let waker = self.queue.get_mut(self.head)?.2.take();
        self.head += 1;
        while self.dead > 0 && self.queue.get(self.head).is_some_and(|(_, _, w)| w.is_none()) {
            self.head += 1;
            self.dead -= 1;
        }
        if self.head == self.queue.len() {
            self.queue.clear();
            self.head = 0;
            self.earliest = None;
        } else {
            if self.head > 64 && self.head * 2 > self.queue.len() {
                self.queue.drain(..self.head);
                self.head = 0;
            }
            self.earliest = Some(self.queue[self.head].0);
        }
        waker
    }

    /// The time of the earliest armed timer.
    #[inline]
    fn earliest(&self) -> Option<u64> {
        self.earliest
    }

    /// Disarms and returns the earliest timer due at `now` or before.
    fn pop_due(&mut self, now: u64) -> Option<Waker> {
        if self.earliest()? > now {
            return None;
        }
        self.pop_front()
    }
}

impl<T> Sink<T> for Output<T> {
    fn put(&mut self, value: T) {
        *self.borrow_mut() = Some(Landed::Value(value));
    }
}

/// A channel's driver as the executor knows it.
struct Pump {
    host: usize,
    ch: ChannelHandle,
    sh: Weak<Shared<SimHost>>,
}

/// What tasks share with the executor.
struct Core {
    fabric: SimFabric,
    tasks: RefCell<Vec<Option<Task>>>,
    free: RefCell<Vec<usize>>,
    ready: Arc<Woken>,
    /// `wakers[i]`: the waker of slot `i` of `tasks`.
    wakers: RefCell<Vec<Waker>>,
    /// `task_wakers[i]`: what `wakers[i]` wakes, for the executor to read and clear `woke`.
    task_wakers: RefCell<Vec<Arc<TaskWaker>>>,
    timers: RefCell<Timers>,
    /// Every channel's driver on the fabric (each host's backend is a `SimHost`), with its
    /// host's number and its channel, so that a pass can tell without the driver whether the
    /// fabric has an event for it.
    pumps: RefCell<Vec<Pump>>,
    /// Set by a driver that got work besides events (shared by all of them).
    poke: Rc<Cell<bool>>,
    spawned: Cell<u64>,
    /// The futures of the tasks spawned since the executor last adopted them, by slot.
    new_futs: RefCell<Vec<(usize, BoxFuture<()>)>>,
    /// Whether `new_futs` has any (a flag: it is asked before every poll).
    any_new: Cell<bool>,
}

impl Core {
    fn spawn(&self, host: usize, name: TaskName, fut: BoxFuture<()>) {
        let slot = self.free.borrow_mut().pop();
        let mut tasks = self.tasks.borrow_mut();
        let id = slot.unwrap_or(tasks.len());
        // A slot's waker is made once and serves every task the slot holds: a waker left
        // behind by an earlier task of the slot wakes whatever task is there, as a new waker
        // with the same slot number would.
        {
            let mut wakers = self.wakers.borrow_mut();
            if id == wakers.len() {
                let tw = Arc::new(TaskWaker {
                    id,
                    ready: self.ready.clone(),
                    woke: AtomicU64::new(0),
                });
                self.task_wakers.borrow_mut().push(tw.clone());
                wakers.push(Waker::from(tw));
            }
            wakers[id].wake_by_ref();
        }
        self.new_futs.borrow_mut().push((id, fut));
        self.any_new.set(true);
        let task = Task { host, name };
        if id == tasks.len() {
            tasks.push(Some(task));
        } else {
            tasks[id] = Some(task);
        }
    }

    fn now(&self) -> u64 {
        self.fabric.now().as_nanos()
    }

    fn name(&self, task: &Task) -> String {
        let addr = self.fabric.host_addrs(task.host)[0];
        match task.name {
            TaskName::Main => format!("{addr}#main"),
            TaskName::Spawned(n) => format!("{addr}#task{n}"),
        }
    }
}

/// The simulator's [`Runtime`]: tasks on the executor of one host, sleeping in virtual time.
#[derive(Clone)]
pub struct SimRuntime {
    core: Rc<Core>,
    host: usize,
}

impl fmt::Debug for SimRuntime {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("SimRuntime").field("host", &self.host).finish()
    }
}

impl SimRuntime {
    /// An event channel on `host`, driven by this executor.
    pub fn cm(&self, host: SimHost) -> Result<Cm<SimHost, SimRuntime>> {
        let cm = Cm::new(host, self.clone())?;
        let ch = cm.sh.st.borrow().ch;
        cm.sh.set_poke(self.core.poke.clone());
        self.core.pumps.borrow_mut().push(Pump {
            host: self.host,
            ch,
            sh: Rc::downgrade(&cm.sh),
        });
        Ok(cm)
    }
}

impl Runtime for SimRuntime {
    fn spawn<F>(&self, fut: F) -> JoinHandle<F::Output>
    where
        F: Future + 'static,
        F::Output: 'static,
    {
        let (task, handle) = joinable(fut);
        let n = self.core.spawned.get() + 1;
        self.core.spawned.set(n);
        self.core.spawn(self.host, TaskName::Spawned(n), Box::pin(task));
        handle
    }

    fn sleep(&self, duration: Duration) -> impl Future<Output = ()> + 'static {
        let at = self.core.fabric.now() + duration;
        Sleep {
            core: self.core.clone(),
            at: at.as_nanos(),
            key: None,
        }
    }

    fn now(&self) -> Duration {
        self.core.fabric.elapsed()
    }
}

struct Sleep {
    core: Rc<Core>,
    at: u64,
    key: Option<TimerKey>,
}

impl Future for Sleep {
    type Output = ();

    #[inline]
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        let Some(k) = self.key else {
            return self.arm(cx);
        };
        // Armed: its timer is still there until it is due (the executor takes every due timer
        // as soon as it moves time on, before any task runs), so the clock need not be read.
        // This, the usual poll (a bound looked at by each wait after the first), is small
        // enough to go inline into the waits; the arming is a call.
        let mut timers = self.core.timers.borrow_mut();
        if let Some(w) = timers.waker_mut(k) {
            if !w.will_wake(cx.waker()) {
                *w = cx.waker().clone();
            }
            return Poll::Pending;
        }
        drop(timers);
        self.key = None;
        Poll::Ready(())
    }
}

impl Sleep {
    /// The first poll: ready when the time has come, else the timer is armed.
    #[inline(never)]
    fn arm(&mut self, cx: &mut Context<'_>) -> Poll<()> {
        if self.core.now() >= self.at {
            return Poll::Ready(());
        }
        let key = self.core.timers.borrow_mut().arm(self.at, cx.waker().clone());
        self.key = Some(key);
        Poll::Pending
    }
}

impl Drop for Sleep {
    fn drop(&mut self) {
        if let Some(k) = self.key.take() {
            // Outside the borrow: dropping a waker may run arbitrary code.
            let waker = self.core.timers.borrow_mut().cancel(k);
            drop(waker);
        }
    }
}

/// What a host's closure gets: its backend, its runtime, and a way to open event channels.
///
/// `U` is the output type of a host defined with [`Sim::server_with`] or [`Sim::client_with`],
/// which may [`report`](Self::report) values of it; a host of [`Sim::server`] or
/// [`Sim::client`] gets a `HostCtx<Untyped>` (plain `HostCtx`), which has none to report.
pub struct HostCtx<U = Untyped> {
    rt: SimRuntime,
    host: SimHost,
    /// A host of its own type: where its reports go.
    state: Option<Rc<TypedState<U>>>,
}

impl<U> HostCtx<U> {
    /// Records `value` as the host's result so far, replacing the one reported before: after
    /// the run, [`HostResult::reported`] gives the last one. For a server that serves until
    /// the run ends (its outcome is then `Running`, without a value): report what it did, as
    /// it does it. The value is kept as given; reporting costs a store, and dropping the value
    /// it replaces.
    ///
    /// ```
    /// use cm_async::sim::Sim;
    /// use cm_async::Runtime;
    /// use std::time::Duration;
    ///
    /// let fabric = cm_sim::SimFabric::builder().seed(2).host("10.0.0.1").build();
    /// let mut sim: Sim<()> = Sim::new(fabric);
    /// let client = sim.client_with(0, |ctx| async move {
    ///     ctx.report(String::from("halfway"));
    ///     ctx.runtime().sleep(Duration::from_millis(1)).await;
    ///     String::from("done")
    /// });
    /// sim.run().expect("the run succeeds");
    /// assert_eq!(client.reported().as_deref(), Some("halfway"));
    /// assert_eq!(client.into_outcome(), Some(cm_async::sim::HostOutcome::Finished("done".into())));
    /// ```
    pub fn report(&self, value: U) {
        if let Some(state) = &self.state {
            let old = state.reported.replace(Some(value));
            // Outside the borrow: dropping the value may run arbitrary code.
            drop(old);
        }
    }

    /// The host's runtime.
    pub fn runtime(&self) -> &SimRuntime {
        &self.rt
    }

    /// The host's raw backend.
    pub fn backend(&self) -> SimHost {
        self.host.clone()
    }

    /// The host's first address.
    pub fn addr(&self) -> IpAddr {
        self.host.addr()
    }

    /// A new event channel on this host, driven by the executor.
    pub fn cm(&self) -> Result<Cm<SimHost, SimRuntime>> {
        self.rt.cm(self.host.clone())
    }
}

/// A deterministic run of async hosts on a fabric, in the manner of turmoil and madsim.
///
/// [`server`](Sim::server) hosts run until the run ends; [`client`](Sim::client) hosts are
/// what the run waits for. A host that crashes loses its tasks (their objects drop against a
/// device that is gone); when it restarts, its closure runs again. The run ends when every
/// client has finished, then drops what is left and runs the fabric until it is idle.
///
/// Every host's closure returns a `T`, and [`run`](Sim::run) gives each host's
/// [`HostOutcome<T>`]; [`server_with`](Sim::server_with) and [`client_with`](Sim::client_with)
/// define hosts whose closures return types of their own, read from their [`HostResult`]s.
///
/// ```
/// use std::time::Duration;
/// use cm_async::sim::{HostOutcome, Sim};
/// use cm_async::{ConnOptions, Runtime};
/// use cm_sim::SimFabric;
///
/// let fabric = SimFabric::builder().seed(3).host("10.0.0.1").host("10.0.0.2").build();
/// let server_addr = "10.0.0.1:7471".parse().unwrap();
/// let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(fabric.clone());
/// sim.server(0, move |ctx| async move {
///     let cm = ctx.cm()?;
///     let listener = cm.listen(server_addr, ConnOptions::default())?;
///     loop {
///         let (conn, _) = listener.accept().await?;
///         let msg = conn.recv().await?;
///         conn.send(&msg).await?;
///         conn.disconnect().await?;
///     }
/// });
/// sim.client(1, move |ctx| async move {
///     let cm = ctx.cm()?;
///     cm.runtime().sleep(Duration::from_millis(1)).await;
///     let conn = cm.connect(server_addr, &ConnOptions::default()).await?;
///     conn.send(b"ping").await?;
///     let echo = conn.recv().await?;
///     conn.disconnect().await?;
///     Ok(echo)
/// });
/// let outcomes = sim.run().expect("the run succeeds");
/// assert_eq!(outcomes[1], HostOutcome::Finished(Ok(b"ping".to_vec())));
/// assert!(fabric.live_resources().is_clean());
/// ```
pub struct Sim<T> {
    fabric: SimFabric,
    hosts: Vec<Option<HostDef<T>>>,
    deadline: Duration,
    livelock_after: u64,
}

/// [`Sim::livelock_after`]'s default: a million polls at one instant is far beyond what the
/// layer's own work takes there (a connection's set-up or teardown moves time: CM messages have
/// a latency), and a spinning task reaches it in well under a second.
pub const DEFAULT_LIVELOCK_STEPS: u64 = 1_000_000;

impl<T: 'static> Sim<T> {
    /// A run on `fabric`, with a virtual deadline of one hour, failing as a livelock after
    /// [`DEFAULT_LIVELOCK_STEPS`] polls without virtual time moving.
    pub fn new(fabric: SimFabric) -> Self {
        Sim {
            fabric,
            hosts: Vec::new(),
            deadline: Duration::from_secs(3600),
            livelock_after: DEFAULT_LIVELOCK_STEPS,
        }
    }

    /// Fails the run ([`FailureKind::Livelock`], naming the tasks that kept running) once
    /// tasks have been polled `steps` times (at least 1) with virtual time standing still;
    /// the count starts again whenever it moves. Time moves only when every task waits, so a
    /// task that never waits (it wakes itself, or spins on a condition without a sleep) holds
    /// the run at one instant: without the bound the run, and the test around it, would never
    /// end. The two-sided data path has no latency (the README's departure 9): a run that
    /// exchanges very many messages at one instant may need a higher bound (`u64::MAX`: none).
    pub fn livelock_after(mut self, steps: u64) -> Self {
        self.livelock_after = steps.max(1);
        self
    }

    /// Fails the run when virtual time would pass `deadline` before every client finished.
    pub fn deadline(mut self, deadline: Duration) -> Self {
        self.deadline = deadline;
        self
    }

    /// Runs `f` on host number `index` for the whole run, again after each restart.
    pub fn server<F, Fut>(&mut self, index: usize, f: F)
    where
        F: Fn(HostCtx) -> Fut + 'static,
        Fut: Future<Output = T> + 'static,
    {
        self.define(index, Kind::Server, f);
    }

    /// Runs `f` on host number `index`; the run ends when every client has finished. A client
    /// whose host crashes runs again from the start when the host restarts.
    pub fn client<F, Fut>(&mut self, index: usize, f: F)
    where
        F: Fn(HostCtx) -> Fut + 'static,
        Fut: Future<Output = T> + 'static,
    {
        self.define(index, Kind::Client, f);
    }

    /// [`server`](Self::server) with an output type of its own, `U`: the run's outcome for
    /// the host is [`HostOutcome::Typed`], and its own is read from the returned
    /// [`HostResult`] after the run, with the last value it [reported](HostCtx::report)
    /// (what a server that runs until the run ends did, such as how many connections it
    /// served). A server whose closure returns is `Finished` with what it returned.
    ///
    /// ```
    /// use cm_async::sim::{HostCtx, HostOutcome, Sim};
    /// use cm_async::{ConnOptions, Runtime};
    /// use cm_sim::SimFabric;
    ///
    /// let fabric = SimFabric::builder().seed(5).host("10.0.0.1").host("10.0.0.2").build();
    /// let at = "10.0.0.1:7471".parse().unwrap();
    /// let mut sim: Sim<cm_async::Result<()>> = Sim::new(fabric);
    /// // Counts the connections it served; its errors are its own too.
    /// let served = sim.server_with(0, move |ctx: HostCtx<cm_async::Result<usize>>| async move {
    ///     let cm = ctx.cm()?;
    ///     let listener = cm.listen(at, ConnOptions::default())?;
    ///     let mut n = 0usize;
    ///     loop {
    ///         let (conn, _) = listener.accept().await?;
    ///         conn.disconnect().await?;
    ///         n += 1;
    ///         ctx.report(Ok(n));
    ///     }
    /// });
    /// sim.client(1, move |ctx| async move {
    ///     let cm = ctx.cm()?;
    ///     cm.runtime().sleep(std::time::Duration::from_millis(1)).await;
    ///     for _ in 0..2 {
    ///         let conn = cm.connect(at, &ConnOptions::default()).await?;
    ///         conn.disconnect().await?;
    ///     }
    ///     Ok(())
    /// });
    /// let outcomes = sim.run().expect("the run succeeds");
    /// assert_eq!(outcomes[0], HostOutcome::Typed);
    /// assert!(matches!(outcomes[1], HostOutcome::Finished(Ok(()))));
    /// assert!(matches!(served.reported(), Some(Ok(2))));
    /// assert!(matches!(served.into_outcome(), Some(HostOutcome::Running)));
    /// ```
    pub fn server_with<U, F, Fut>(&mut self, index: usize, f: F) -> HostResult<U>
    where
        U: 'static,
        F: Fn(HostCtx<U>) -> Fut + 'static,
        Fut: Future<Output = U> + 'static,
    {
        self.define_typed(index, Kind::Server, f)
    }

    /// [`client`](Self::client) with an output type of its own, `U`: the run waits for it as
    /// for every client; the run's outcome for the host is [`HostOutcome::Typed`], and what it
    /// returned is read from the returned [`HostResult`] after the run.
    ///
    /// ```
    /// use cm_async::sim::{HostOutcome, Sim};
    /// use cm_sim::SimFabric;
    ///
    /// let fabric = SimFabric::builder().seed(4).host("10.0.0.1").host("10.0.0.2").build();
    /// let mut sim: Sim<u32> = Sim::new(fabric);
    /// let bytes = sim.client_with(0, |_ctx| async { b"ping".to_vec() });
    /// sim.client(1, |_ctx| async { 7 });
    /// let outcomes = sim.run().expect("the run succeeds");
    /// assert_eq!(outcomes, vec![HostOutcome::Typed, HostOutcome::Finished(7)]);
    /// assert_eq!(bytes.into_outcome(), Some(HostOutcome::Finished(b"ping".to_vec())));
    /// ```
    pub fn client_with<U, F, Fut>(&mut self, index: usize, f: F) -> HostResult<U>
    where
        U: 'static,
        F: Fn(HostCtx<U>) -> Fut + 'static,
        Fut: Future<Output = U> + 'static,
    {
        self.define_typed(index, Kind::Client, f)
    }

    fn define<F, Fut>(&mut self, index: usize, kind: Kind, f: F)
    where
        F: Fn(HostCtx) -> Fut + 'static,
        Fut: Future<Output = T> + 'static,
    {
        // The closure's future inline in the task's one box: boxed on its own, each poll of a
        // host's task went through two boxes and two calls through a vtable.
        let run: HostFn<T> = Rc::new(move |rt, host, out| {
            let ctx = HostCtx {
                rt,
                host,
                state: None,
            };
            Box::pin(Delivering::new(f(ctx), out))
        });
        self.put_def(
            index,
            HostDef {
                kind,
                run,
                typed: None,
            },
        );
    }

    fn define_typed<U, F, Fut>(&mut self, index: usize, kind: Kind, f: F) -> HostResult<U>
    where
        U: 'static,
        F: Fn(HostCtx<U>) -> Fut + 'static,
        Fut: Future<Output = U> + 'static,
    {
        let state = Rc::new(TypedState {
            finished: RefCell::new(None),
            reported: RefCell::new(None),
            end: Cell::new(None),
        });
        let st = state.clone();
        // As in `define`: one box per incarnation, the sink beside the future.
        let run: HostFn<T> = Rc::new(move |rt, host, out| {
            let ctx = HostCtx {
                rt,
                host,
                state: Some(st.clone()),
            };
            let sink = TypedSink {
                out,
                state: st.clone(),
            };
            Box::pin(Delivering::new(f(ctx), sink))
        });
        let typed: Rc<dyn TypedEnd> = state.clone();
        self.put_def(
            index,
            HostDef {
                kind,
                run,
                typed: Some(typed),
            },
        );
        HostResult { state }
    }

    /// Makes `def` host `index`'s, in place of any definition before it (a typed one is then
    /// `Idle`: nothing of it will run).
    fn put_def(&mut self, index: usize, def: HostDef<T>) {
        let _ = self.fabric.host(index);
        if self.hosts.len() <= index {
            self.hosts.resize_with(index + 1, || None);
        }
        if let Some(typed) = self.hosts[index].replace(def).and_then(|d| d.typed) {
            typed.idle();
        }
    }

    /// Runs until every client has finished; each host's outcome, by host number.
    pub fn run(self) -> std::result::Result<Vec<HostOutcome<T>>, SimFailure> {
        Executor::new(self).run()
    }
}

struct Executor<T> {
    core: Rc<Core>,
    defs: Vec<Option<HostDef<T>>>,
    deadline: u64,
    /// [`Sim::livelock_after`].
    livelock_after: u64,
    /// Polls since virtual time last moved.
    still_steps: u64,
    /// Past this many still steps, the tasks polled are noted in `busy`.
    busy_from: u64,
    /// The tasks polled in the last still steps before the bound, each once, in order.
    busy: Vec<(usize, TaskName)>,
    /// Virtual time when it last moved (ns).
    still_at: u64,
    rng: ChaCha8Rng,
    /// Per host: the incarnation its closure runs in, and where its output lands.
    running: Vec<Option<(u32, Output<T>)>>,
    outcomes: Vec<Option<Landed<T>>>,
    /// The fabric's crash and restart counts when hosts were last reaped and started.
    crashes_seen: (u64, u64),
    /// [`SimFabric::events_queued`] at the last pass over the drivers.
    events_seen: u64,
    /// A host crashed or restarted since the last pass: every channel is asked.
    force_pump: bool,
    /// A task ended or was dropped since outputs were last collected.
    ended: Cell<bool>,
    /// The ready tasks, in the order they were woken (a task drawn leaves by `swap_remove`):
    /// the seeded draw picks among them.
    ready: Vec<usize>,
    /// The woken tasks being taken, with their wakes' numbers (kept for its allocation).
    batch: Vec<(u64, usize)>,
    /// A copy of [`Core::wakers`], lent to polls without borrowing the core's.
    wakers: Vec<Waker>,
    /// A copy of [`Core::task_wakers`], kept as long as `wakers`, read without borrowing the
    /// core's.
    task_wakers: Vec<Arc<TaskWaker>>,
    /// [`Core::ready`], held here too: it is looked at before and after every poll, and
    /// through the core it would be one load more each time.
    woken: Arc<Woken>,
    /// `futs[i]`: the future of the task in slot `i` of [`Core::tasks`]. Held by the executor
    /// rather than in the core's tasks, so that a poll reaches it without a borrow and without
    /// taking it out and putting it back (the tasks were borrowed twice per poll for that);
    /// what a task spawns waits in [`Core::new_futs`] until adopted.
    futs: Vec<Option<BoxFuture<()>>>,
}

impl<T: 'static> Executor<T> {
    fn new(sim: Sim<T>) -> Self {
        let seed = sim.fabric.seed();
        let start = sim.fabric.now().as_nanos();
        let n = sim.hosts.len();
        let woken = Arc::new(Woken::default());
        Executor {
            core: Rc::new(Core {
                fabric: sim.fabric,
                tasks: RefCell::new(Vec::new()),
                free: RefCell::new(Vec::new()),
                ready: woken.clone(),
                wakers: RefCell::new(Vec::new()),
                task_wakers: RefCell::new(Vec::new()),
                timers: RefCell::new(Timers::default()),
                pumps: RefCell::new(Vec::new()),
                poke: Rc::new(Cell::new(false)),
                spawned: Cell::new(0),
                new_futs: RefCell::new(Vec::new()),
                any_new: Cell::new(false),
            }),
            defs: sim.hosts,
            deadline: sim.deadline.as_nanos().try_into().unwrap_or(u64::MAX),
            livelock_after: sim.livelock_after,
            still_steps: 0,
            busy_from: sim.livelock_after.saturating_sub(LIVELOCK_SAMPLE),
            busy: Vec::new(),
            still_at: start,
            // A stream of its own, so that task order does not shift the fabric's draws.
            rng: ChaCha8Rng::seed_from_u64(seed ^ 0x7a5c_0de5_eed0_0001),
            running: (0..n).map(|_| None).collect(),
            outcomes: (0..n).map(|_| None).collect(),
            crashes_seen: (u64::MAX, u64::MAX),
            events_seen: u64::MAX,
            force_pump: true,
            ended: Cell::new(true),
            ready: Vec::new(),
            batch: Vec::new(),
            wakers: Vec::new(),
            task_wakers: Vec::new(),
            woken,
            futs: Vec::new(),
        }
    }

    fn start_hosts(&mut self) {
        let fabric = self.core.fabric.clone();
        for i in 0..self.defs.len() {
            let Some(def) = &self.defs[i] else { continue };
            if !fabric.host_is_up(i) {
                continue;
            }
            let inc = fabric.host_incarnation(i);
            if self.running[i].as_ref().is_some_and(|(k, _)| *k == inc) {
                continue;
            }
            if def.kind == Kind::Client && self.outcomes[i].is_some() {
                continue;
            }
            let out = Rc::new(RefCell::new(None));
            self.running[i] = Some((inc, out.clone()));
            let rt = SimRuntime {
                core: self.core.clone(),
                host: i,
            };
            let task = (def.run)(rt, fabric.host(i), out);
            self.core.spawn(i, TaskName::Main, task);
        }
    }

    /// Stops the tasks of hosts that crashed since their closure started.
    fn reap_crashed(&mut self) {
        let fabric = self.core.fabric.clone();
        for i in 0..self.running.len() {
            let Some((inc, _)) = &self.running[i] else {
                continue;
            };
            if fabric.host_is_up(i) && fabric.host_incarnation(i) == *inc {
                continue;
            }
            self.running[i] = None;
            self.kill(|host| host == i);
        }
    }

    /// Drops the tasks `which` selects, outside every borrow: their objects release on drop.
    fn kill(&mut self, which: impl Fn(usize) -> bool) {
        self.adopt_spawned();
        let mut doomed = Vec::new();
        {
            let mut tasks = self.core.tasks.borrow_mut();
            for (id, slot) in tasks.iter_mut().enumerate() {
                if slot.as_ref().is_some_and(|t| which(t.host)) {
                    let fut = self.futs.get_mut(id).and_then(Option::take);
                    doomed.push((fut, slot.take()));
                    self.core.free.borrow_mut().push(id);
                }
            }
        }
        self.ended.set(true);
        drop(doomed);
    }

    fn collect_outputs(&mut self) {
        for i in 0..self.running.len() {
            if let Some((_, out)) = &self.running[i] {
                if let Some(v) = out.borrow_mut().take() {
                    self.outcomes[i] = Some(v);
                }
            }
        }
    }

    fn clients_done(&self) -> bool {
        let mut any_client = false;
        for (i, def) in self.defs.iter().enumerate() {
            match def {
                Some(d) if d.kind == Kind::Client => {
                    any_client = true;
                    if self.outcomes[i].is_none() {
                        return false;
                    }
                }
                _ => {}
            }
        }
        any_client || self.core.tasks.borrow().iter().all(Option::is_none)
    }

    fn waiting(&self) -> Vec<String> {
        self.core
            .tasks
            .borrow()
            .iter()
            .flatten()
            .map(|t| self.core.name(t))
            .collect()
    }

    fn fail(&mut self, kind: FailureKind) -> SimFailure {
        self.kill(|_| true);
        let seed = self.core.fabric.seed();
        SimFailure {
            kind,
            seed,
            trace: self
                .core
                .fabric
                .write_trace_file(&format!("cm-async-seed-{seed}"))
                .ok(),
        }
    }

    /// Appends the tasks woken since the last call to the ready list, each once, in the order
    /// they were first woken.
    #[inline]
    fn take_woken(&mut self) {
        let w = &self.woken;
        if w.low.load(Ordering::Acquire) != 0 {
            self.take_woken_now();
        }
    }

    #[inline(never)]
    fn take_woken_now(&mut self) {
        let w = &self.woken;
        let bits = w.low.swap(0, Ordering::AcqRel);
        // A slot's number is cleared before the slot is taken, so that a wake racing with
        // this one (another thread's) is either seen here or marks the slot again.
        if bits & bits.wrapping_sub(1) == 0 && bits >> HIGH == 0 {
            // One task woken (nearly always), not in the list: nothing to order. Its waker is
            // in the executor's copy (it was polled or spawned, and spawning wakes it) unless
            // it was spawned since the copy was last extended.
            let id = bits.trailing_zeros() as usize;
            if bits == 0 {
                return;
            }
            let n = match self.task_wakers.get(id) {
                Some(tw) => tw.woke.swap(0, Ordering::AcqRel),
                None => self.core.task_wakers.borrow()[id].woke.swap(0, Ordering::AcqRel),
            };
            if n != 0 && !self.ready.contains(&id) {
                self.ready.push(id);
            }
            return;
        }
        self.take_woken_batch(bits & !(1 << HIGH), bits >> HIGH != 0);
    }

    /// [`take_woken_now`](Self::take_woken_now) when more than one task was woken: ordered by
    /// their wakes' numbers.
    #[inline(never)]
    fn take_woken_batch(&mut self, mut bits: u64, high: bool) {
        let w = &self.core.ready;
        let tws = self.core.task_wakers.borrow();
        let batch = &mut self.batch;
        let mut take = |id: usize| {
            let n = tws[id].woke.swap(0, Ordering::AcqRel);
            if n != 0 {
                batch.push((n, id));
            }
        };
        while bits != 0 {
            take(bits.trailing_zeros() as usize);
            bits &= bits - 1;
        }
        if high {
            let mut high = w.high.lock().unwrap_or_else(|p| p.into_inner());
            for id in high.drain(..) {
                take(id);
            }
        }
        batch.sort_unstable();
        for &(_, id) in batch.iter() {
            if !self.ready.contains(&id) {
                self.ready.push(id);
            }
        }
        batch.clear();
    }

    /// Moves the futures of the tasks spawned since the last call into [`Executor::futs`].
    #[inline]
    fn adopt_spawned(&mut self) {
        if self.core.any_new.replace(false) {
            self.adopt_spawned_now();
        }
    }

    #[inline(never)]
    fn adopt_spawned_now(&mut self) {
        // Each slot is in the list once (a task is adopted before it can be polled, so before
        // its slot can be freed and taken again): the order they are taken in does not matter.
        let mut new = self.core.new_futs.borrow_mut();
        while let Some((id, fut)) = new.pop() {
            match self.futs.get_mut(id) {
                Some(place) => *place = Some(fut),
                None => {
                    self.futs.resize_with(id, || None);
                    self.futs.push(Some(fut));
                }
            }
        }
    }

    /// Notes that task `id` is about to be polled late in a stretch of still time; `Err` with
    /// the livelock, instead of the poll, once the stretch would pass the bound. Out of line: a run reaches it only
    /// when time stands still for nearly the whole bound.
    #[cold]
    #[inline(never)]
    fn note_busy(&mut self, id: usize) -> std::result::Result<(), SimFailure> {
        let task = self.core.tasks.borrow()[id].as_ref().map(|t| (t.host, t.name));
        if let Some((host, name)) = task {
            let seen = |&(h, n): &(usize, TaskName)| h == host && n == name;
            if !self.busy.iter().any(seen) {
                self.busy.push((host, name));
            }
        }
        if self.still_steps <= self.livelock_after {
            return Ok(());
        }
        let running = self
            .busy
            .iter()
            .map(|&(host, name)| self.core.name(&Task { host, name }))
            .collect();
        Err(self.fail(FailureKind::Livelock {
            at: self.core.fabric.now(),
            steps: self.livelock_after,
            running,
        }))
    }

    /// Polls one ready task; `Err` with the failure when it panicked.
    fn poll_one(&mut self, id: usize) -> std::result::Result<(), SimFailure> {
        // The future stays in its place while it runs: what it spawns waits in the core's
        // list, and its slot is taken until it ends. The slot's waker is lent from the
        // executor's copy of the wakers.
        self.adopt_spawned();
        let Some(fut) = self.futs.get_mut(id).and_then(Option::as_mut) else {
            return Ok(());
        };
        let mut cx = Context::from_waker(&self.wakers[id]);
        match catch_unwind(AssertUnwindSafe(|| fut.as_mut().poll(&mut cx))) {
            Ok(Poll::Pending) => Ok(()),
            Ok(Poll::Ready(())) => {
                let fut = self.futs[id].take();
                self.core.tasks.borrow_mut()[id] = None;
                self.core.free.borrow_mut().push(id);
                self.ended.set(true);
                // Outside the borrows: dropping the future may run arbitrary code.
                drop(fut);
                Ok(())
            }
            Err(payload) => {
                let message = payload
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .or_else(|| payload.downcast_ref::<String>().cloned())
                    .unwrap_or_else(|| "(not a string)".into());
                let fut = self.futs[id].take();
                let task = self.core.tasks.borrow_mut()[id].take();
                let name = task.as_ref().map_or_else(String::new, |t| self.core.name(t));
                self.core.free.borrow_mut().push(id);
                drop(fut);
                Err(self.fail(FailureKind::Panic { task: name, message }))
            }
        }
    }

    /// Makes the executor's copy of the wakers cover slot `id`.
    #[inline]
    fn mirror_wakers(&mut self, id: usize) {
        if id >= self.wakers.len() {
            let all = self.core.wakers.borrow();
            self.wakers.extend_from_slice(&all[self.wakers.len()..]);
            let all = self.core.task_wakers.borrow();
            self.task_wakers.extend_from_slice(&all[self.task_wakers.len()..]);
        }
    }

    /// Lets every channel's driver take what the fabric has for it.
    fn pump_all(&mut self) {
        // Asking a channel or a CQ that has nothing is most of what an idle step would cost.
        // Every driver retrieves until its channel is empty, so when no event was queued
        // anywhere since the last pass (and no host went down or came back, which can fail a
        // channel), no channel has one; otherwise the fabric says which channels have
        // something, and only those are asked. CQs are asked only when watched and non-empty.
        let queued = self.core.fabric.events_queued();
        let events_new = queued != self.events_seen || self.force_pump;
        // Cleared before the drivers run: what they leave (a CQ still watched) sets it again.
        let other = self.core.poke.replace(false);
        if !events_new && !other {
            return;
        }
        self.events_seen = queued;
        self.force_pump = false;
        let fabric = &self.core.fabric;
        // The host's count first: it is 0 for most hosts at most steps, and cheaper to read
        // than a channel's queue. A host whose only channel is this one (the driver is alive,
        // so its channel is open) has an event on it when it has one at all.
        let event_ready = |host: usize, ch| {
            fabric.queued_events_on(host) > 0
                && (fabric.channels_on(host) == 1 || fabric.may_have_event(host, ch))
        };
        // Borrowed for the whole pass: a driver's pump runs no task, so nothing registers a
        // channel meanwhile.
        let mut pumps = self.core.pumps.borrow_mut();
        let mut i = 0;
        while let Some(p) = pumps.get(i) {
            // How many events the host has, read once: when this is its only channel, they
            // are all this channel's, and the driver takes that many without asking again.
            let (events, known) = match events_new.then(|| fabric.queued_events_on(p.host)) {
                None | Some(0) => (false, 0),
                Some(n) if fabric.channels_on(p.host) == 1 => (true, n),
                Some(_) => (fabric.may_have_event(p.host, p.ch), 0),
            };
            if !events && !other {
                i += 1;
                continue;
            }
            let Some(pump) = p.sh.upgrade() else {
                pumps.remove(i);
                continue;
            };
            i += 1;
            if events || pump.has_other_work() {
                let pumped = pump.pump_where(
                    events,
                    known,
                    |b: &SimHost, ch| event_ready(b.index(), ch),
                    |b, id| fabric.may_have_completion(b.index(), id),
                );
                if pumped.more {
                    self.core.poke.set(true);
                }
            }
        }
    }

    fn run(mut self) -> std::result::Result<Vec<HostOutcome<T>>, SimFailure> {
        self.start_hosts();
        // The woken tasks are taken after whatever may wake one (a poll, a pass over the
        // drivers, timers fired, hosts reaped or started), and only then: looking again where
        // nothing ran in between cost a load and a branch at every step.
        self.take_woken();
        loop {
            while !self.ready.is_empty() {
                // Drawn even with one task ready, so that the stream stays the same; the
                // division (tens of cycles) only when there is a choice.
                let r = self.rng.next_u64();
                let n = self.ready.len();
                let i = if n == 1 { 0 } else { (r % n as u64) as usize };
                let id = self.ready.swap_remove(i);
                self.still_steps += 1;
                if self.still_steps > self.busy_from {
                    self.note_busy(id)?;
                }
                self.mirror_wakers(id);
                self.poll_one(id)?;
                self.take_woken();
            }
            // Outputs change only when a task ends: the hosts' slots are looked at only then.
            if self.ended.replace(false) {
                self.collect_outputs();
                if self.clients_done() {
                    break;
                }
            }
            self.pump_all();
            self.take_woken();
            if !self.ready.is_empty() {
                continue;
            }
            let timer = self.core.timers.borrow().earliest();
            // One call moves the fabric to the earlier of its next instant and the next timer,
            // and tells what the executor asks after every step.
            let limit = SimTime::from_nanos(self.deadline);
            let (now, crashes_and_restarts) =
                match self.core.fabric.step(timer.map(SimTime::from_nanos), limit) {
                    Step::Moved {
                        now,
                        crashes_and_restarts,
                    } => (now.as_nanos(), crashes_and_restarts),
                    Step::Idle { now: at } => {
                        let waiting = self.waiting();
                        return Err(self.fail(FailureKind::Deadlock { at, waiting }));
                    }
                    Step::PastLimit { .. } => {
                        let waiting = self.waiting();
                        return Err(self.fail(FailureKind::Deadline {
                            deadline: limit,
                            waiting,
                        }));
                    }
                };
            if now != self.still_at {
                self.still_at = now;
                self.still_steps = 0;
                self.busy.clear();
            }
            // The timers did not change since `timer` was read (no task ran): none is due
            // unless that one is.
            if timer.is_some_and(|t| t <= now) {
                while let Some(waker) = {
                    let mut timers = self.core.timers.borrow_mut();
                    timers.pop_due(now)
                } {
                    waker.wake();
                }
                self.take_woken();
            }
            // Hosts go down or come back only by a crash or a restart: without one since the
            // last step, every host is as it was and there is nothing to reap or start.
            if crashes_and_restarts != self.crashes_seen {
                self.crashes_seen = crashes_and_restarts;
                self.force_pump = true;
                self.reap_crashed();
                self.start_hosts();
                self.take_woken();
            }
        }
        self.kill(|_| true);
        self.core.pumps.borrow_mut().clear();
        self.core.fabric.run_until_idle();
        let fabric = self.core.fabric.clone();
        for (i, def) in self.defs.iter().enumerate() {
            if let Some(typed) = def.as_ref().and_then(|d| d.typed.as_ref()) {
                typed.end(fabric.host_is_up(i));
            }
        }
        Ok(self
            .outcomes
            .into_iter()
            .enumerate()
            .map(|(i, out)| match out {
                _ if self.defs[i].as_ref().is_some_and(|d| d.typed.is_some()) => HostOutcome::Typed,
                Some(Landed::Value(v)) => HostOutcome::Finished(v),
                // Only a typed host's closure leaves no value, and those are answered above.
                Some(Landed::Elsewhere) => HostOutcome::Typed,
                None if self.defs[i].is_none() => HostOutcome::Idle,
                None if !fabric.host_is_up(i) => HostOutcome::Crashed,
                None => HostOutcome::Running,
            })
            .collect())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A waker that records its number in `log` when woken.
    struct Tagged {
        n: u32,
        log: Arc<Mutex<Vec<u32>>>,
    }

    impl Wake for Tagged {
        fn wake(self: Arc<Self>) {
            self.log.lock().expect("log").push(self.n);
        }
    }

    fn tagged(n: u32, log: &Arc<Mutex<Vec<u32>>>) -> Waker {
        Waker::from(Arc::new(Tagged { n, log: log.clone() }))
    }

    #[test]
    fn a_simulated_connection_is_small_enough_to_move_without_a_memcpy_call() {
        // `connect` returns it and `disconnect` takes it by value; past 128 bytes each of
        // those moves is a call to `memcpy`.
        assert!(std::mem::size_of::<crate::Connection<SimHost, SimRuntime>>() <= 128);
    }

    #[test]
    fn woken_tasks_are_taken_once_each_in_waking_order_across_mask_and_list() {
        let fabric = SimFabric::builder().seed(1).host("10.0.0.1").build();
        let mut ex = Executor::<()>::new(Sim::new(fabric));
        for _ in 0..70 {
            ex.core
                .spawn(0, TaskName::Main, Box::pin(std::future::pending::<()>()));
        }
        ex.take_woken();
        assert_eq!(ex.ready, (0..70).collect::<Vec<_>>(), "spawned in slot order");
        ex.ready.clear();
        let wakers = ex.core.wakers.borrow().clone();
        for id in [66, 3, 65, 3, 0, 66, 64] {
            wakers[id].wake_by_ref();
        }
        ex.take_woken();
        assert_eq!(ex.ready, vec![66, 3, 65, 0, 64]);
        wakers[5].wake_by_ref();
        wakers[3].wake_by_ref();
        ex.take_woken();
        assert_eq!(
            ex.ready,
            vec![66, 3, 65, 0, 64, 5],
            "a task already ready keeps its place"
        );
        // Slot 63 is the list's first (the mask's last bit says the list has some), alone
        // and among others.
        ex.ready.clear();
        wakers[63].wake_by_ref();
        ex.take_woken();
        assert_eq!(ex.ready, vec![63]);
        ex.ready.clear();
        for id in [62, 63, 1] {
            wakers[id].wake_by_ref();
        }
        ex.take_woken();
        assert_eq!(ex.ready, vec![62, 63, 1]);
        ex.ready.clear();
        wakers[62].wake_by_ref();
        ex.take_woken();
        assert_eq!(ex.ready, vec![62], "the list's bit was cleared with the take");
    }

    #[test]
    fn timers_fire_by_time_then_arming_order_and_cancelled_ones_never() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut t = Timers::default();
        t.arm(30, tagged(1, &log));
        let gone = t.arm(10, tagged(2, &log));
        t.arm(20, tagged(3, &log));
        t.arm(20, tagged(4, &log));
        assert_eq!(t.earliest(), Some(10));
        assert!(t.cancel(gone).is_some());
        assert!(t.cancel(gone).is_none(), "a key cancels once");
        assert_eq!(t.earliest(), Some(20));
        assert!(t.pop_due(19).is_none());
        while let Some(w) = t.pop_due(25) {
            w.wake();
        }
        assert_eq!(*log.lock().expect("log"), vec![3, 4]);
        assert_eq!(t.earliest(), Some(30));
        t.arm(5, tagged(5, &log));
        assert_eq!(t.earliest(), Some(5), "an earlier timer armed later comes first");
        while let Some(w) = t.pop_due(u64::MAX) {
            w.wake();
        }
        assert_eq!(*log.lock().expect("log"), vec![3, 4, 5, 1]);
        assert_eq!(t.earliest(), None);
    }

    #[test]
    fn cancelled_timers_do_not_pile_up_in_the_queue() {
        let mut t = Timers::default();
        // An earlier timer in front, so that the cancelled ones are never the front.
        let first = t.arm(1, Waker::noop().clone());
        let keep = t.arm(u64::MAX, Waker::noop().clone());
        for i in 0..10_000 {
            let k = t.arm(1_000_000 + i, Waker::noop().clone());
            t.cancel(k);
        }
        assert!(t.len() <= 2 + 65, "{} entries for two live timers", t.len());
        assert_eq!(t.earliest(), Some(1));
        assert!(t.cancel(first).is_some());
        assert_eq!(
            t.earliest(),
            Some(u64::MAX),
            "the cancelled ones behind it left too"
        );
        assert!(t.cancel(keep).is_some());
        assert_eq!(t.earliest(), None);
        assert_eq!(t.len(), 0);
    }

    #[test]
    fn cancelling_the_earliest_timer_leaves_no_entry_behind_and_the_next_one_earliest() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut t = Timers::default();
        let only = t.arm(10, tagged(1, &log));
        assert!(t.cancel(only).is_some());
        assert_eq!(t.len(), 0, "the cancelled front entry leaves at once");
        assert_eq!(t.earliest(), None);
        let first = t.arm(10, tagged(2, &log));
        t.arm(20, tagged(3, &log));
        t.arm(20, tagged(4, &log));
        assert_eq!(t.earliest(), Some(10));
        assert!(t.cancel(first).is_some());
        assert_eq!(t.earliest(), Some(20));
        while let Some(w) = t.pop_due(20) {
            w.wake();
        }
        assert_eq!(*log.lock().expect("log"), vec![3, 4]);
        assert_eq!(t.earliest(), None);
    }

    #[test]
    fn a_cancelled_timers_key_does_not_answer_for_a_timer_armed_at_the_same_time() {
        let mut t = Timers::default();
        let old = t.arm(10, Waker::noop().clone());
        t.cancel(old);
        let new = t.arm(10, Waker::noop().clone());
        assert!(t.waker_mut(old).is_none());
        assert!(t.cancel(old).is_none());
        assert_eq!(t.earliest(), Some(10));
        assert!(t.waker_mut(new).is_some());
        assert!(t.cancel(new).is_some());
        assert_eq!(t.earliest(), None);
    }

    #[test]
    fn a_timer_behind_the_front_is_found_by_its_key_and_cancelled_there() {
        let log = Arc::new(Mutex::new(Vec::new()));
        let mut t = Timers::default();
        t.arm(10, tagged(1, &log));
        let mid = t.arm(20, tagged(2, &log));
        t.arm(20, tagged(3, &log));
        t.arm(15, tagged(4, &log));
        assert!(t.waker_mut(mid).is_some());
        assert!(t.cancel(mid).is_some());
        assert!(t.waker_mut(mid).is_none(), "a cancelled entry has no waker");
        assert!(t.cancel(mid).is_none());
        while let Some(w) = t.pop_due(u64::MAX) {
            w.wake();
        }
        assert_eq!(*log.lock().expect("log"), vec![1, 4, 3]);
        assert_eq!(t.len(), 0, "the cancelled entry left with the others");
    }
}
