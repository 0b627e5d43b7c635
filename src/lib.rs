//! RDMA connection management (the librdmacm API) behind one trait, with a deterministic
//! simulator and a hardware backend, and an async application layer over both.
//!
//! # Write an application
//!
//! [`app`] (the `cm-async` crate): owned listeners and connections, typed errors, and a small
//! [`Runtime`](app::Runtime) (spawn, sleep, timeout, now) with a deterministic executor in the
//! simulator's virtual time ([`app::sim::Sim`]) and tokio (feature `tokio`). The same code runs
//! on both:
//!
//! ```
//! use std::net::SocketAddr;
//! use cm::app::{Cm, ConnOptions, Error, Runtime};
//! use cm::CmBackend;
//!
//! async fn echo_once<B: CmBackend + 'static, R: Runtime>(cm: Cm<B, R>, at: SocketAddr) -> Result<(), Error> {
//!     let listener = cm.listen(at, ConnOptions::default())?;
//!     let (conn, _hello) = listener.accept().await?;
//!     let msg = conn.recv().await?;
//!     conn.send(&msg).await?;
//!     conn.disconnect().await?;
//!     Ok(())
//! }
//!
//! async fn ping<B: CmBackend + 'static, R: Runtime>(cm: Cm<B, R>, to: SocketAddr) -> Result<Vec<u8>, Error> {
//!     let conn = cm.connect(to, &ConnOptions::default()).await?;
//!     conn.send(b"ping").await?;
//!     let echo = conn.recv().await?;
//!     conn.disconnect().await?;
//!     Ok(echo)
//! }
//!
//! let fabric = cm::SimFabric::builder().seed(7).host("10.0.0.1").host("10.0.0.2").build();
//! let at: SocketAddr = "10.0.0.1:7471".parse().unwrap();
//! let mut sim = cm::app::sim::Sim::new(fabric.clone());
//! sim.server(0, move |host| async move { echo_once(host.cm()?, at).await.map(|()| Vec::new()) });
//! sim.client(1, move |host| async move { ping(host.cm()?, at).await });
//! let outcomes = sim.run().unwrap_or_else(|failure| panic!("{failure}"));
//! assert_eq!(outcomes[1], cm::app::sim::HostOutcome::Finished(Ok(b"ping".to_vec())));
//! assert!(fabric.live_resources().is_clean());
//! ```
//!
//! `examples/echo.rs` is a whole program (N clients, retries, faults, `--backend hw`).
//!
//! # The layers underneath
//!
//! * [`api`] (the `cm-core` crate): the [`CmBackend`] trait, librdmacm's types, the shared
//!   [`CmError`] and the id/QP state machine. It is not called `core`, which would shadow the
//!   standard `core` crate in code that says `use cm::*`.
//! * `sim` (default feature `sim`): the seeded in-memory fabric ([`SimFabric`], [`SimHost`]), for
//!   tests without hardware.
//! * `hw` (feature `hw`): the same trait over the real librdmacm (`cm::HwBackend`, present
//!   with the feature); needs the rdma-core development packages and libclang to build.
//!
//! A hardware-only user turns the simulator off: `cm = { version = "0.1", default-features =
//! false, features = ["hw"] }`.
//!
//! Errors convert into [`std::io::Error`] with the kind of their errno, for code that speaks
//! `io::Result`.
//!
//! ```
//! # #[cfg(feature = "sim")]
//! # fn main() -> Result<(), cm::CmError> {
//! use std::time::Duration;
//! use cm::{CmBackend, CmEventType, PortSpace, SimFabric};
//!
//! let fabric = SimFabric::builder().seed(7).host("10.0.0.1").host("10.0.0.2").build();
//! let mut client = fabric.host(1);
//! let ch = client.create_event_channel()?;
//! let id = client.create_id(ch, PortSpace::Tcp)?;
//! client.resolve_addr(id, None, "10.0.0.1:7471".parse().unwrap(), Duration::from_secs(2))?;
//! let ev = client.get_cm_event(ch, Duration::from_secs(2))?.expect("an event");
//! assert_eq!(ev.event(), CmEventType::AddrResolved);
//! client.ack_cm_event(ev)?;
//! client.destroy_id(id)?;
//! client.destroy_event_channel(ch)?;
//! assert!(client.live_resources().is_clean());
//! # Ok(())
//! # }
//! # #[cfg(not(feature = "sim"))]
//! # fn main() {}
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]
// docs.rs builds with `--cfg docsrs` on nightly: show which feature each item needs.
#![cfg_attr(docsrs, feature(doc_cfg))]

pub use cm_async as app;
pub use cm_core as api;

/// The deterministic simulator (`cm-sim`).
#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub use cm_sim as sim;

/// The hardware backend over librdmacm (`cm-hw`).
#[cfg(feature = "hw")]
#[cfg_attr(docsrs, doc(cfg(feature = "hw")))]
pub use cm_hw as hw;

pub use cm_core::{AhAttr, UdParam, UdSender, GRH_LEN, UDP_QKEY};
// Multicast groups.
pub use cm_core::{group_ud_param, MULTICAST_QPN};
pub use cm_core::{
    ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, IdState, LiveResources,
    PortSpace, PrivateData, QpCaps, QpState, Result, WcOpcode, WcStatus, WorkCompletion,
};
// One-sided RDMA: memory regions, work requests over them, shared receive queues.
pub use cm_core::{
    Access, AsyncEvent, MrHandle, MrInfo, RemoteAddr, RemoteMr, SendOp, SendWr, Sge, SrqCaps, SrqHandle,
};
// External QPs (the application's own QP; the connection managed here).
pub use cm_core::{AddressVector, GlobalRoute, QpAttr, QpAttrMask};
// Options, synchronous ids, getaddrinfo and create_ep.
pub use cm_core::{getaddrinfo, AddrHints, AddrInfo, IdOption, SyncId, CREATE_EP_TIMEOUT};

#[cfg(feature = "sim")]
#[cfg_attr(docsrs, doc(cfg(feature = "sim")))]
pub use cm_sim::{SimFabric, SimHost};

#[cfg(feature = "hw")]
#[cfg_attr(docsrs, doc(cfg(feature = "hw")))]
pub use cm_hw::HwBackend;

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(all(doctest, feature = "sim"))]
pub struct ReadmeDoctests;
