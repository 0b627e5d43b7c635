//! A seeded, deterministic, in-memory RDMA connection-management fabric implementing
//! [`CmBackend`](cm_core::CmBackend).
//!
//! Hosts with IP addresses share one fabric; each host is a backend ([`SimHost`]). The fabric
//! models librdmacm's asynchronous events with their statuses, the IB CM exchange underneath
//! (REQ/REP/RTU, MRA, REJ, DREQ/DREP, retries and duplicates, timewait, by Linux 6.1's rules),
//! the QP error state and the flush of posted work requests on disconnect, and answers every
//! misuse with the typed error the hardware backend gives too. Time is virtual; randomness comes from one ChaCha8 generator seeded from
//! the builder, `CM_SIM_SEED`, or a recorded random draw: same seed and calls, same run, byte
//! for byte ([`SimFabric::trace_hash`]).
//!
//! ```
//! use std::time::Duration;
//! use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, QpCaps};
//! use cm_sim::SimFabric;
//!
//! let fabric = SimFabric::builder().seed(1).host("10.0.0.1").host("10.0.0.2").build();
//! let (mut server, mut client) = (fabric.host(0), fabric.host(1));
//! let t = Duration::from_secs(1);
//!
//! let sch = server.create_event_channel()?;
//! let listener = server.create_id(sch, PortSpace::Tcp)?;
//! server.bind_addr(listener, "10.0.0.1:7471".parse().unwrap())?;
//! server.listen(listener, 0)?;
//!
//! let cch = client.create_event_channel()?;
//! let id = client.create_id(cch, PortSpace::Tcp)?;
//! client.resolve_addr(id, None, "10.0.0.1:7471".parse().unwrap(), t)?;
//! let ev = client.get_cm_event(cch, t)?.unwrap();
//! assert_eq!(ev.event(), CmEventType::AddrResolved);
//! client.ack_cm_event(ev)?;
//! // Misuse is an error, not a hang: the id still has a QP...
//! client.create_qp(id, QpCaps::new())?;
//! assert_eq!(client.destroy_id(id).unwrap_err(), cm_core::CmError::QpAttached);
//! # Ok::<(), cm_core::CmError>(())
//! ```
//!
//! # Faults
//!
//! A [`FaultSchedule`] lists [`Fault`]s and the virtual time each strikes at; give it to
//! [`SimBuilder::faults`], or strike one at once with [`SimFabric::inject`]. Hosts are numbered
//! in the order the builder added them; a link fault names all of a host's links with
//! [`Fault::ALL_HOSTS`].
//!
//! What each fault does, with the events and statuses librdmacm gives for it:
//!
//! | fault | what the application sees |
//! |---|---|
//! | [`Fault::Partition`] / [`Fault::Loss`] / [`Fault::Drop`] | CM messages between the hosts are lost (a drop rule: chosen ones of a kind, each transmission counted). As Linux 6.1's IB CM does, REQ, REP and DREQ are sent again on their own timers until answered, however the message or its answer was lost (6.144 s apart on the active side, 4.096 s on the passive side, 16 tries), and each duplicate is answered by its receiver's state: a lost REP or RTU is made up by the REP's retry, a lost DREP by the DREQ's retry (the DREP again from timewait, or from the peer's host when its id is gone). When every try is lost: `UNREACHABLE` (`-ETIMEDOUT`) for a request or reply, `DISCONNECTED` (`-ETIMEDOUT`) for a disconnect. Across a partition a send completes with `RETRY_EXC_ERR` after (`retry_count` + 1) local ACK timeouts, the QP goes to ERR and the rest flush |
//! | [`Fault::Delay`] | slower CM messages; events of different ids reorder, each id's own stay in order |
//! | [`Fault::Crash`] | the host's ids, channels and QPs vanish; its calls answer [`CmError::HostCrashed`](cm_core::CmError::HostCrashed) (`ENODEV`, with the time of the crash) until it restarts. Its peers are told nothing: their CM messages to it go unanswered (`UNREACHABLE` / `DISCONNECTED` with `-ETIMEDOUT` after the retries), and a send to it completes with `RETRY_EXC_ERR` after (`retry_count` + 1) local ACK timeouts, the QP goes to ERR and the rest flush |
//! | [`Fault::Restart`] | the crashed host comes back, empty (handles of before the crash are unknown): a peer's REQ retry is a new request there, its DREQ for an old connection is answered with a DREP |
//! | [`Fault::RemoveDevice`] | `DEVICE_REMOVAL` on every id of the host that has a device; from the removal on (before the event is retrieved too) only destroy is legal; events not retrieved yet are discarded; a listener bound to the device stops listening; QPs go to ERR and flush when the event is retrieved |
//! | [`Fault::AddrChange`] | `ADDR_CHANGE` on every id of the host that has a device |
//! | [`Fault::FailAddrResolution`] / [`Fault::FailRouteResolution`] | `ADDR_ERROR` / `ROUTE_ERROR` with the given status for the next resolutions |
//! | [`Fault::Backlog`] | the host's listeners hold at most that many unretrieved requests; more are dropped without an answer, and the requester's next try may find room |
//! | [`Fault::RnrRetries`] | a send that finds no receive posted gives up after that many receiver-not-ready retries: `RNR_RETRY_EXC_ERR`, the QP goes to ERR and flushes |
//!
//! # Where the simulator departs from librdmacm
//! See the project README's list; the main points: calls are checked against the state the
//! application has observed (retrieved events), not the kernel's; misuse that would hang or crash
//! is refused; the data path has no latency and sends wait for a posted receive indefinitely
//! (infinite RNR retries); simultaneous disconnects answer each other's DREQ at once.
#![forbid(unsafe_code)]
#![deny(missing_docs)]

/// Its statements with the `tracing` feature; nothing at all without it (so the records'
/// arguments are neither evaluated nor compiled). Defined before the modules that use it.
#[cfg(feature = "tracing")]
macro_rules! traced {
    ($($body:tt)*) => { $($body)* };
}
#[cfg(not(feature = "tracing"))]
macro_rules! traced {
    ($($body:tt)*) => {};
}

mod builder;
mod exchange;
mod fabric;
mod faults;
mod fifo;
mod host;
mod mermaid;
mod ports;
mod qp;
mod rdma;
mod sched;
mod slab;
mod time;
mod timers;
mod trace;

pub use builder::{parse_seed, ConfigError, HostAddr, Seed, SeedSource, SimBuilder, SimConfig, SEED_ENV};
pub use fabric::{RegionMemory, SimFabric, Step};
pub use faults::{Fault, FaultAt, FaultSchedule, FaultStats, Swarm};
pub use host::SimHost;
pub use time::SimTime;
pub use trace::{MsgKind, RdmaOp, RdmaStep, TraceMode, TraceRecord, TraceWhat};

/// The README's examples, compiled and run as doc tests so they stay true.
#[doc = include_str!("../README.md")]
#[cfg(doctest)]
pub struct ReadmeDoctests;
