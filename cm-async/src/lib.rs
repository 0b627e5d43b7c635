//! Applications, not only calls: an async layer over any [`CmBackend`](cm_core::CmBackend)
//! with owned objects, and two runtimes that run the same application code.
//!
//! * [`Cm`]: one event channel and its driver. [`Cm::listen`] gives a [`Listener`];
//!   [`Listener::accept`] (or [`Listener::request`], then [`Request::accept`] /
//!   [`Request::reject`]) and [`Cm::connect`] give [`Connection`]s, which
//!   [`send`](Connection::send), [`recv`](Connection::recv) and
//!   [`disconnect`](Connection::disconnect), and with [`Region`]s registered on their device,
//!   [`read`](Connection::read), [`write`](Connection::write),
//!   [`write_with_imm`](Connection::write_with_imm), [`compare_swap`](Connection::compare_swap)
//!   and [`fetch_add`](Connection::fetch_add) the peer's memory.
//! * Ownership enforces librdmacm's release order: a connection releases its QP, then its
//!   id; the channel goes when the last object made from it goes. Events are acked by the
//!   channel's driver as it hands what they say (type, status, private data) to the mailbox
//!   of the id they are for, so an id never waits on an unacked event to be destroyed. Dropping a connection, a
//!   request, a listener, or a `connect`/`accept` future halfway, releases what it holds at once
//!   (a connected peer sees `DISCONNECTED`), without blocking.
//! * Every failure is an [`Error`]: `ADDR_ERROR`, `ROUTE_ERROR`, `REJECTED` (with the peer's
//!   private data), `UNREACHABLE`, `CONNECT_ERROR`, `DISCONNECTED`, a failed completion, a
//!   timeout, or the backend's own [`CmError`](cm_core::CmError).
//! * [`Runtime`]: spawn, sleep, timeout, now. [`sim::SimRuntime`] runs on the deterministic
//!   executor [`sim::Sim`] in the fabric's virtual time; `tokio::TokioRuntime` (feature
//!   `tokio`) runs on tokio, waiting on the backend's fds (`tokio::Readiness`, implemented for
//!   `cm_hw::HwBackend` with feature `hw`).
//!
//! # An echo, written once
//!
//! ```
//! use std::net::SocketAddr;
//! use cm_async::{Cm, ConnOptions, Error, Runtime};
//! use cm_core::CmBackend;
//!
//! async fn serve<B: CmBackend + 'static, R: Runtime>(cm: Cm<B, R>, at: SocketAddr) -> Result<(), Error> {
//!     let listener = cm.listen(at, ConnOptions::default())?;
//!     loop {
//!         let (conn, _hello) = listener.accept().await?;
//!         drop(cm.runtime().spawn(async move {
//!             while let Ok(msg) = conn.recv().await {
//!                 if conn.send(&msg).await.is_err() {
//!                     break;
//!                 }
//!             }
//!             let _ = conn.disconnect().await;
//!         }));
//!     }
//! }
//!
//! async fn ping<B: CmBackend + 'static, R: Runtime>(cm: Cm<B, R>, to: SocketAddr) -> Result<Vec<u8>, Error> {
//!     let conn = cm.connect(to, &ConnOptions::default()).await?;
//!     conn.send(b"ping").await?;
//!     let echo = cm.runtime().timeout(std::time::Duration::from_secs(5), conn.recv()).await??;
//!     conn.disconnect().await?;
//!     Ok(echo)
//! }
//!
//! // On the simulator: hosts are async closures, time is virtual, the run is a function of
//! // the seed.
//! let fabric = cm_sim::SimFabric::builder().seed(9).host("10.0.0.1").host("10.0.0.2").build();
//! let at: SocketAddr = "10.0.0.1:7471".parse().unwrap();
//! let mut sim = cm_async::sim::Sim::new(fabric.clone());
//! sim.server(0, move |ctx| async move { serve(ctx.cm()?, at).await.map(|()| Vec::new()) });
//! sim.client(1, move |ctx| async move { ping(ctx.cm()?, at).await });
//! let outcomes = sim.run().unwrap_or_else(|failure| panic!("{failure}"));
//! assert_eq!(outcomes[1], cm_async::sim::HostOutcome::Finished(Ok(b"ping".to_vec())));
//! assert!(fabric.live_resources().is_clean());
//! ```
//!
//! On tokio the same two functions run with `TokioRuntime::new().cm(backend)` in a
//! `tokio::task::LocalSet` (see `examples/echo.rs`, `--backend hw`).
//!
//! # `Send`, threads, and where tasks run
//!
//! tokio's multi-threaded `spawn` wants `Send` futures; the simulator's `SimHost` is `Rc`-based
//! and single-threaded on purpose, and the raw trait's speed (`lifecycle/sim`) must not pay for
//! locks. The layer therefore shares a channel's driver between its objects with `Rc` and
//! `RefCell` (never borrowed across an `.await`), and [`Runtime::spawn`] takes futures that need
//! not be `Send`: [`Cm`], [`Listener`], [`Request`] and [`Connection`] are not `Send`. There
//! are two ways to use them on tokio:
//!
//! * **`Send` handles** (`tokio::CmThread`, feature `tokio`): a thread of its own owns the
//!   backends and the objects, and `SendCm`, `SendListener`, `SendRequest` and
//!   `SendConnection` are `Send + Sync` handles whose operations are messages to it. A server
//!   accepts on one task and hands each connection to `tokio::spawn`ed workers on any thread,
//!   without a `LocalSet` (`tests/echo.rs` does, on the multi-threaded runtime). Each operation
//!   costs a channel send and a reply on top of the layer's own work.
//! * **In a `LocalSet`**: `TokioRuntime::cm` in a `tokio::task::LocalSet`, tasks spawned with
//!   `spawn_local`, on the thread that drives the set (the fds are watched by tokio's reactor
//!   on whichever thread). No message passing; for more cores, one `LocalSet`, backend and `Cm`
//!   per thread on one multi-threaded runtime (`tests/echo.rs` runs three such threads at once).
//!   The hardware backend is `Send`, so it can be made on one thread and moved to another
//!   before its channel is opened.
//!
//! Why not a driver owning the backend behind a lock, with every object `Send`: the lock and a
//! cross-thread wake-up would then sit on every call of the simulator too, and the simulator's
//! determinism would depend on a multi-threaded scheduler. With the thread and its messages,
//! only the tokio path pays, and the application code over [`Cm`] stays generic over backend
//! and runtime, without `cfg`.
//!
//! # The simulator's executor
//!
//! [`sim::Sim`] polls ready tasks in an order drawn from the fabric's seed; when every task
//! waits, it lets each channel's driver take what the fabric has ([`Cm::pump`]): only when an
//! event was queued since the last pass
//! ([`SimFabric::events_queued`](cm_sim::SimFabric::events_queued)), and then only the channels
//! of hosts that have events queued
//! ([`queued_events_on`](cm_sim::SimFabric::queued_events_on)) and that have one
//! ([`may_have_event`](cm_sim::SimFabric::may_have_event)), and the CQs a task waits on that
//! have a completion ([`may_have_completion`](cm_sim::SimFabric::may_have_completion)). When
//! that wakes nobody it moves virtual time to the earlier of the fabric's next scheduled action
//! ([`SimFabric::next_deadline`](cm_sim::SimFabric::next_deadline)) and the earliest sleep, in
//! one call ([`SimFabric::step`](cm_sim::SimFabric::step)).
//! Nothing scheduled and no sleep: a deadlock, reported with the waiting tasks and the seed. A
//! panic or a passed virtual deadline fails the run the same way, with the trace file's path,
//! and so do tasks that keep running while virtual time stands still (a livelock: a million
//! polls by default, [`sim::Sim::livelock_after`]), reported with the tasks that kept running.
#![deny(missing_docs)]
#![cfg_attr(docsrs, feature(doc_cfg))]
#![forbid(unsafe_code)]
// Without a runtime feature only the runtime-independent types remain; the task plumbing both
// runtimes share is then unused.
#![cfg_attr(not(any(feature = "sim", feature = "tokio")), allow(dead_code))]

mod conn;
mod driver;
mod error;
mod region;
mod runtime;
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub mod sim;
#[cfg(feature = "tokio")]
#[cfg_attr(docsrs, doc(cfg(feature = "tokio")))]
pub mod tokio;

pub use conn::{Closed, Cm, ConnOptions, Connection, ImmWrite, Listener, Request};
pub use error::{Error, Result};
pub use region::Region;
pub use runtime::{Elapsed, JoinHandle, Runtime};
