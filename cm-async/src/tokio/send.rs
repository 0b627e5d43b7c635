//! `Send` handles for tokio's multi-threaded runtime: connections that move between tasks.
//!
//! The layer's own objects ([`Cm`], [`Listener`](crate::Listener),
//! [`Connection`](crate::Connection)) share their channel's driver through `Rc` and borrow
//! its state without a lock, which is what keeps the simulator fast and deterministic. A
//! tokio server that accepts on one task and hands each connection to a pool of workers needs
//! handles that are `Send` instead. [`CmThread`] gives them: one thread of its own runs a
//! current-thread tokio runtime and a `LocalSet` that own the backends and the layer's objects,
//! and [`SendCm`], [`SendListener`], [`SendRequest`] and [`SendConnection`] are `Send + Sync`
//! handles to them. Each operation is a message to that thread; the thread runs it as a local
//! task and sends the result back. Everything else about the objects (the release order,
//! acking, timeouts, [`Closed`]) is the layer's, unchanged.
//!
//! Why a thread and messages rather than a lock around the driver: the lock (and a
//! cross-thread wake-up on every completion) would sit on the simulator's path too, and
//! the simulator's determinism would then depend on which worker thread ran what. Here only
//! the tokio path pays, one channel send and one reply per operation, and the driver stays
//! single-threaded, as a device's completion handling is anyway. One `CmThread` drives every
//! channel made on it; for more than one core's worth of completions, start one per core.
//!
//! Cancelling is safe: dropping an operation's future before its reply tells the thread,
//! which drops the operation there at its next poll (a `recv` cancelled so takes no message).
//! Dropping a handle releases its object on the thread as dropping the object would (a
//! dropped connection is torn down at once, its peer sees `DISCONNECTED`). The thread ends
//! when the last handle made on it (and the `CmThread` itself) is gone.
//!
//! ```no_run
//! # #[cfg(feature = "hw")] {
//! use cm_async::tokio::{CmThread, SendConnection};
//! use cm_async::ConnOptions;
//! use cm_hw::HwBackend;
//!
//! async fn worker(conn: SendConnection<HwBackend>) {
//!     while let Ok(msg) = conn.recv().await {
//!         if conn.send(&msg).await.is_err() {
//!             break;
//!         }
//!     }
//!     let _ = conn.disconnect().await;
//! }
//!
//! # async fn serve() -> cm_async::Result<()> {
//! let thread = CmThread::start()?;
//! let cm = thread.cm(|_| HwBackend::new()).await?;
//! let listener = cm.listen("10.0.0.1:7471".parse().unwrap(), ConnOptions::default()).await?;
//! loop {
//!     let (conn, _hello) = listener.accept().await?;
//!     tokio::spawn(worker(conn)); // any worker thread of the multi-threaded runtime
//! }
//! # }
//! # }
//! ```

use std::any::Any;
use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::{poll_fn, Future};
use std::marker::PhantomData;
use std::net::SocketAddr;
use std::pin::pin;
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use cm_core::CmBackend;
use tokio::sync::{mpsc, oneshot};

use super::{Readiness, TokioRuntime};
use crate::conn::{Closed, Cm, ConnOptions, Connection, Listener, Request};
use crate::error::{Error, Result};

/// Work for the driver thread: run inside its `LocalSet`, where it may spawn local tasks.
type Job = Box<dyn FnOnce() + Send>;

/// The key of the thread's own state in [`OBJECTS`].
const STATE: u64 = 0;

thread_local! {
    /// The objects the handles name, on their driver thread, by key. Keys are never reused,
    /// so a stale key names nothing.
    static OBJECTS: RefCell<HashMap<u64, Rc<dyn Any>>> = RefCell::new(HashMap::new());
    static NEXT_KEY: Cell<u64> = const { Cell::new(STATE + 1) };
}

/// Keeps `object` on this (the driver) thread; its key.
fn keep<T: 'static>(object: T) -> u64 {
    let key = NEXT_KEY.with(|k| {
        let key = k.get();
        k.set(key + 1);
        key
    });
    OBJECTS.with(|o| o.borrow_mut().insert(key, Rc::new(object)));
    key
}

/// The object `key` names, shared with the operations under way on it.
fn lookup<T: 'static>(key: u64) -> Result<Rc<T>> {
    OBJECTS
        .with(|o| o.borrow().get(&key).cloned())
        .and_then(|object| object.downcast::<T>().ok())
        .ok_or(Error::DriverGone)
}

/// Releases the thread's hold on `key`'s object (outside the table's borrow: releasing a
/// connection runs its teardown).
fn forget(key: u64) -> Option<Rc<dyn Any>> {
    OBJECTS.with(|o| o.borrow_mut().remove(&key))
}

/// Takes `key`'s object out of the table to consume it. Operations whose callers gave up
/// may still hold it for a poll (they end when they see their reply channel closed); the
/// wait for them is bounded.
async fn take<T: 'static>(key: u64) -> Result<T> {
    let object = forget(key)
        .and_then(|o| o.downcast::<T>().ok())
        .ok_or(Error::DriverGone)?;
    let mut object = object;
    for _ in 0..5_000 {
        match Rc::try_unwrap(object) {
            Ok(owned) => return Ok(owned),
            Err(shared) => object = shared,
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
    }
    Err(Error::DriverGone)
}

/// The way to a driver thread: its job queue.
#[derive(Clone)]
struct Line {
    jobs: mpsc::UnboundedSender<Job>,
}

impl Line {
    fn post(&self, job: Job) -> bool {
        self.jobs.send(job).is_ok()
    }

    /// Runs `op` as a local task on the driver thread and waits for its result. Dropping the
    /// returned future drops `op` there at its next poll.
    async fn call<T, F, Fut>(&self, op: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce() -> Fut + Send + 'static,
        Fut: Future<Output = Result<T>> + 'static,
    {
        let (reply, answer) = oneshot::channel();
        let posted = self.post(Box::new(move || {
            tokio::task::spawn_local(run_for(reply, op));
        }));
        if !posted {
            return Err(Error::DriverGone);
        }
        answer.await.unwrap_or(Err(Error::DriverGone))
    }

    /// A handle's drop: its object released on the thread.
    fn release(&self, key: u64) {
        self.post(Box::new(move || drop(forget(key))));
    }
}

/// `op`'s result into `reply`, unless the caller drops its end first.
async fn run_for<T, F, Fut>(mut reply: oneshot::Sender<Result<T>>, op: F)
where
    F: FnOnce() -> Fut,
    Fut: Future<Output = Result<T>>,
{
    let mut fut = pin!(op());
    let done = poll_fn(|cx| {
        if let Poll::Ready(r) = fut.as_mut().poll(cx) {
            return Poll::Ready(Some(r));
        }
        if reply.poll_closed(cx).is_ready() {
            return Poll::Ready(None);
        }
        Poll::Pending
    })
    .await;
    if let Some(r) = done {
        // A caller that left between the result and now drops it: a handle in it releases
        // its object.
        let _ = reply.send(r);
    }
}

/// A thread that drives event channels for [`Send`] handles, with a state `S` of the
/// caller's on it (what its backends are made from; `()` for most).
///
/// ```
/// let thread = cm_async::tokio::CmThread::start_with(|| 40).unwrap();
/// let rt = tokio::runtime::Runtime::new().unwrap();
/// let answer = rt.block_on(thread.run(|n: &i32| {
///     let n = *n;
///     async move { n + 2 }
/// }));
/// assert_eq!(answer.unwrap(), 42);
/// ```
pub struct CmThread<S: 'static = ()> {
    line: Line,
    _state: PhantomData<fn() -> S>,
}

impl CmThread<()> {
    /// Starts a driver thread without a state of its own.
    ///
    /// # Errors
    /// When the thread or its runtime cannot be started ([`Error::DriverGone`]).
    pub fn start() -> Result<CmThread<()>> {
        CmThread::start_with(|| ())
    }
}

impl<S: 'static> CmThread<S> {
    /// Starts a driver thread (named `cm-driver`) whose state is `init()`, made on that
    /// thread: it need not be `Send` (a simulated fabric, for one).
    ///
    /// # Errors
    /// When the thread or its runtime cannot be started ([`Error::DriverGone`]).
    pub fn start_with<I>(init: I) -> Result<CmThread<S>>
    where
        I: FnOnce() -> S + Send + 'static,
    {
        let (jobs, mut queue) = mpsc::unbounded_channel::<Job>();
        let (started, start) = std::sync::mpsc::channel();
        std::thread::Builder::new()
            .name("cm-driver".into())
            .spawn(move || {
                let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                    return;
                };
                let local = tokio::task::LocalSet::new();
                local.block_on(&rt, async move {
                    OBJECTS.with(|o| o.borrow_mut().insert(STATE, Rc::new(init())));
                    let _ = started.send(());
                    while let Some(job) = queue.recv().await {
                        job();
                    }
                    // Every handle is gone: the objects go, then the state they were made of
                    // (the objects' teardown may still need it).
                    let objects: Vec<(u64, Rc<dyn Any>)> = OBJECTS.with(|o| o.borrow_mut().drain().collect());
                    let (state, objects): (Vec<_>, Vec<_>) =
                        objects.into_iter().partition(|(k, _)| *k == STATE);
                    drop(objects);
                    tokio::task::yield_now().await;
                    drop(state);
                });
            })
            .map_err(|_| Error::DriverGone)?;
        start
            .recv_timeout(Duration::from_secs(30))
            .map_err(|_| Error::DriverGone)?;
        Ok(CmThread {
            line: Line { jobs },
            _state: PhantomData,
        })
    }

    /// An event channel on the backend `make` builds from the thread's state, on the thread
    /// ([`TokioRuntime::cm`] there).
    ///
    /// # Errors
    /// `make`'s error, the channel's ([`TokioRuntime::cm`]), or [`Error::DriverGone`].
    pub async fn cm<B, F>(&self, make: F) -> Result<SendCm<B>>
    where
        B: Readiness + 'static,
        F: FnOnce(&S) -> cm_core::Result<B> + Send + 'static,
    {
        let line = self.line.clone();
        self.line
            .call(move || async move {
                let state = lookup::<S>(STATE)?;
                let cm = TokioRuntime::new().cm(make(&state)?)?;
                Ok(SendCm {
                    slot: Slot::new(line, keep(cm)),
                    _backend: PhantomData,
                })
            })
            .await
    }

    /// Runs `f` on the thread, with its state, and returns what its future gives: a way to
    /// reach what is not `Send` there (spawn a local task, read the state).
    ///
    /// # Errors
    /// [`Error::DriverGone`].
    pub async fn run<T, F, Fut>(&self, f: F) -> Result<T>
    where
        T: Send + 'static,
        F: FnOnce(&S) -> Fut + Send + 'static,
        Fut: Future<Output = T> + 'static,
    {
        self.line
            .call(move || async move {
                let state = lookup::<S>(STATE)?;
                Ok(f(&state).await)
            })
            .await
    }
}

/// A handle's claim on its object: released on the thread when the handle goes.
struct Slot {
    line: Line,
    key: u64,
}

impl Slot {
    fn new(line: Line, key: u64) -> Slot {
        Slot { line, key }
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        self.line.release(self.key);
    }
}

/// A [`Cm`] on a [`CmThread`], as a `Send + Sync` handle.
pub struct SendCm<B> {
    slot: Slot,
    _backend: PhantomData<fn() -> B>,
}

impl<B: CmBackend + 'static> SendCm<B> {
    /// [`Cm::listen`] on the thread.
    ///
    /// # Errors
    /// As [`Cm::listen`]'s, or [`Error::DriverGone`].
    pub async fn listen(&self, addr: SocketAddr, opts: ConnOptions) -> Result<SendListener<B>> {
        let (line, key) = (self.slot.line.clone(), self.slot.key);
        self.slot
            .line
            .call(move || async move {
                let listener = lookup::<Cm<B, TokioRuntime>>(key)?.listen(addr, opts)?;
                Ok(SendListener {
                    slot: Slot::new(line, keep(listener)),
                    _backend: PhantomData,
                })
            })
            .await
    }

    /// [`Cm::connect`] on the thread.
    ///
    /// # Errors
    /// As [`Cm::connect`]'s, or [`Error::DriverGone`].
    pub async fn connect(&self, dst: SocketAddr, opts: &ConnOptions) -> Result<SendConnection<B>> {
        let (line, key, opts) = (self.slot.line.clone(), self.slot.key, opts.clone());
        self.slot
            .line
            .call(move || async move {
                let cm = lookup::<Cm<B, TokioRuntime>>(key)?;
                let conn = cm.connect(dst, &opts).await?;
                Ok(SendConnection::kept(line, conn))
            })
            .await
    }
}

/// A [`Listener`] on a [`CmThread`], as a `Send + Sync` handle: tasks on any thread may
/// accept on it at once.
pub struct SendListener<B> {
    slot: Slot,
    _backend: PhantomData<fn() -> B>,
}

impl<B: CmBackend + 'static> SendListener<B> {
    /// [`Listener::accept`] on the thread: the connection, and the private data the peer
    /// sent with its request.
    ///
    /// # Errors
    /// As [`Listener::accept`]'s, or [`Error::DriverGone`].
    pub async fn accept(&self) -> Result<(SendConnection<B>, Vec<u8>)> {
        let (line, key) = (self.slot.line.clone(), self.slot.key);
        self.slot
            .line
            .call(move || async move {
                let (conn, hello) = lookup::<Listener<B, TokioRuntime>>(key)?.accept().await?;
                Ok((SendConnection::kept(line, conn), hello))
            })
            .await
    }

    /// [`Listener::request`] on the thread: the next request, to accept or reject.
    ///
    /// # Errors
    /// As [`Listener::request`]'s, or [`Error::DriverGone`].
    pub async fn request(&self) -> Result<SendRequest<B>> {
        let (line, key) = (self.slot.line.clone(), self.slot.key);
        self.slot
            .line
            .call(move || async move {
                let request = lookup::<Listener<B, TokioRuntime>>(key)?.request().await?;
                let private_data = request.private_data().to_vec();
                let peer_addr = request.peer_addr()?;
                Ok(SendRequest {
                    slot: Slot::new(line, keep(request)),
                    private_data,
                    peer_addr,
                    _backend: PhantomData,
                })
            })
            .await
    }

    /// The address it listens on ([`Listener::local_addr`]).
    ///
    /// # Errors
    /// As [`Listener::local_addr`]'s, or [`Error::DriverGone`].
    pub async fn local_addr(&self) -> Result<Option<SocketAddr>> {
        let key = self.slot.key;
        self.slot
            .line
            .call(move || async move { lookup::<Listener<B, TokioRuntime>>(key)?.local_addr() })
            .await
    }
}

/// A [`Request`] on a [`CmThread`], as a `Send + Sync` handle. Dropping it rejects the
/// request, as dropping a [`Request`] does.
pub struct SendRequest<B> {
    slot: Slot,
    private_data: Vec<u8>,
    peer_addr: Option<SocketAddr>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: CmBackend + 'static> SendRequest<B> {
    /// The private data the peer sent with its request.
    pub fn private_data(&self) -> &[u8] {
        &self.private_data
    }

    /// The peer's address, as the request reported it.
    pub fn peer_addr(&self) -> Option<SocketAddr> {
        self.peer_addr
    }

    /// [`Request::accept`] on the thread.
    ///
    /// # Errors
    /// As [`Request::accept`]'s, or [`Error::DriverGone`].
    pub async fn accept(self) -> Result<SendConnection<B>> {
        self.accept_with_private_data(&[]).await
    }

    /// [`Request::accept_with_private_data`] on the thread.
    ///
    /// # Errors
    /// As [`Request::accept_with_private_data`]'s, or [`Error::DriverGone`].
    pub async fn accept_with_private_data(self, private_data: &[u8]) -> Result<SendConnection<B>> {
        let (line, key, data) = (self.slot.line.clone(), self.slot.key, private_data.to_vec());
        self.slot
            .line
            .call(move || async move {
                let request = take::<Request<B, TokioRuntime>>(key).await?;
                Ok(SendConnection::kept(
                    line,
                    request.accept_with_private_data(&data)?,
                ))
            })
            .await
    }

    /// [`Request::reject`] on the thread.
    ///
    /// # Errors
    /// As [`Request::reject`]'s, or [`Error::DriverGone`].
    pub async fn reject(self, private_data: &[u8]) -> Result<()> {
        let (key, data) = (self.slot.key, private_data.to_vec());
        self.slot
            .line
            .call(move || async move { take::<Request<B, TokioRuntime>>(key).await?.reject(&data) })
            .await
    }
}

/// A [`Connection`] on a [`CmThread`], as a `Send + Sync` handle: it moves to, and is used
/// from, any task of a multi-threaded runtime. Dropping it tears the connection down at once,
/// as dropping a [`Connection`] does; [`disconnect`](SendConnection::disconnect) ends it
/// gracefully and reports what was still posted.
///
/// Messaging (send, receive, disconnect) goes through the handle; one-sided RDMA needs
/// [`Region`](crate::Region)s, which stay on the thread with their connection: do it there
/// with [`CmThread::run`] and the layer's own objects.
pub struct SendConnection<B> {
    slot: Slot,
    peer_data: Vec<u8>,
    _backend: PhantomData<fn() -> B>,
}

impl<B: CmBackend + 'static> SendConnection<B> {
    /// Keeps `conn` on the (driver) thread it was made on; its handle.
    fn kept(line: Line, conn: Connection<B, TokioRuntime>) -> SendConnection<B> {
        let peer_data = conn.peer_private_data().to_vec();
        SendConnection {
            slot: Slot::new(line, keep(conn)),
            peer_data,
            _backend: PhantomData,
        }
    }

    /// The private data the peer sent when the connection was made.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// [`Connection::peer_addr`] on the thread.
    ///
    /// # Errors
    /// As [`Connection::peer_addr`]'s, or [`Error::DriverGone`].
    pub async fn peer_addr(&self) -> Result<Option<SocketAddr>> {
        let key = self.slot.key;
        self.slot
            .line
            .call(move || async move { lookup::<Connection<B, TokioRuntime>>(key)?.peer_addr() })
            .await
    }

    /// [`Connection::send`] on the thread; bounded as it is (see there).
    ///
    /// # Errors
    /// As [`Connection::send`]'s, or [`Error::DriverGone`].
    pub async fn send(&self, data: &[u8]) -> Result<()> {
        let (key, data) = (self.slot.key, data.to_vec());
        self.slot
            .line
            .call(move || async move { lookup::<Connection<B, TokioRuntime>>(key)?.send(&data).await })
            .await
    }

    /// [`Connection::recv`] on the thread: the next message. Cancelled (its future dropped),
    /// it takes none.
    ///
    /// # Errors
    /// As [`Connection::recv`]'s, or [`Error::DriverGone`].
    pub async fn recv(&self) -> Result<Vec<u8>> {
        let key = self.slot.key;
        self.slot
            .line
            .call(move || async move { lookup::<Connection<B, TokioRuntime>>(key)?.recv().await })
            .await
    }

    /// [`Connection::disconnect`] on the thread: what was still on the connection, and how
    /// the goodbye went.
    ///
    /// # Errors
    /// As [`Connection::disconnect`]'s, or [`Error::DriverGone`].
    pub async fn disconnect(self) -> Result<Closed> {
        let key = self.slot.key;
        self.slot
            .line
            .call(move || async move { take::<Connection<B, TokioRuntime>>(key).await?.disconnect().await })
            .await
    }
}
