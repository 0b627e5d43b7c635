//! RDMA connection management (the librdmacm API) behind one trait, with a deterministic
//! simulator and a hardware backend.
//!
//! * [`core`]: the [`CmBackend`] trait, librdmacm's types, the shared [`CmError`] and the
//!   id/QP state machine.
//! * [`sim`]: the seeded in-memory fabric ([`SimFabric`]), for property tests without hardware.
//! * `hw` (feature `hw`): the same trait over the real librdmacm (`cm_hw::HwBackend`).
//!
//! ```
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
//! # Ok::<(), cm::CmError>(())
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

pub use cm_async as app;
pub use cm_core as core;
pub use cm_sim as sim;

#[cfg(feature = "hw")]
pub use cm_hw as hw;

pub use cm_core::{
    ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, IdState, PortSpace, QpCaps,
    QpState, WcStatus, WorkCompletion,
};
pub use cm_sim::{SimFabric, SimHost};

/// The README's Rust examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
