//! The fabric: hosts, ids, channels, the discrete-event queue and the IB CM protocol.
//!
//! Two layers of state per id, as in the real stack:
//! * the [`IdMachine`] is what the application has observed (it moves when calls succeed and
//!   when events are *retrieved*) and is what calls are checked against;
//! * the [`Exchange`] is the IB CM's view (it moves when messages arrive and timers fire) and
//!   decides which messages are sent and which events are generated. It is a pure machine
//!   (`crate::exchange`); the fabric carries its effects out as the exchange names them
//!   (`Fabric::transition`).
//!
//! Events are queued on the channel when generated, in virtual-time order, and transformed on
//! retrieval where librdmacm transforms them (the kernel's `CONNECT_RESPONSE` becomes
//! `ESTABLISHED` after the QP reaches RTS and the RTU is sent, or `CONNECT_ERROR`). Events of
//! a destroyed id are skipped lazily when they reach the head of the queue, so destroy never
//! scans a queue.

use std::cell::RefCell;
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::net::{IpAddr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::rc::Rc;
use std::time::Duration;

use cm_core::{
    errno, Call, ChannelHandle, CmError, CmEvent, CmEventType, ConnParam, HandleKind, IdHandle, IdMachine,
    LiveResources, PortSpace, PrivateData, PrivateDataSlot, QpCaps, QpState, WcOpcode, WcStatus,
    WorkCompletion, MAX_PRIVATE_DATA,
};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::builder::{Seed, SimBuilder, SimConfig, SEED_ENV};
use crate::exchange::timeouts::Waits;
use crate::exchange::{reason, Carry, CmTimer, Effect, Effector, Exchange, Input, Params, To};
use crate::faults::{Fault, FaultSchedule, FaultStats};
use crate::fifo::Fifo;
use crate::host::SimHost;
use crate::ports::{BindError, Ports};
use crate::qp::{Landing, Qp};
use crate::sched::{Lane, Queue};
use crate::slab::{Pool, Slab, SlotRef};
use crate::time::{nanos, SimTime};
use crate::timers::IdTimers;
use crate::trace::{MsgKind, Trace, TraceRecord, TraceWhat};

mod calls;
mod clock;
mod data;
mod datagram;
mod dispatch;
mod external;
mod handle;
mod memory;
mod multicast;
mod onesided;
mod options;
mod retrieve;
mod srq;
mod storage;
mod strike;
mod time_control;
mod verbs;
mod wire;

use self::clock::*;
pub use self::handle::SimFabric;
pub use self::memory::RegionMemory;
use self::storage::*;
pub use self::time_control::Step;
use self::wire::*;

/// Parameters of events that carry none: `ConnParam::ZERO`, built field by field. Written as
/// the constant, the whole 280 bytes were cleared by a `memset` for every such event (a
/// constant's bytes are zeros or undefined), where the fields are a few stores.
#[inline]
fn no_param() -> ConnParam {
    ConnParam {
        private_data: PrivateData::default(),
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: false,
        qp_num: 0,
    }
}

const NO_PAYLOAD: u32 = u32::MAX;

pub(crate) struct Fabric {
    seed: Seed,
    cfg: SimConfig,
    /// `cfg.latency` in nanoseconds, converted once: every message draws from it, and the
    /// conversion from `Duration` (through `u128`) cost more than the draw.
    latency_nanos: (u64, u64),
    now: SimTime,
    rng: ChaCha8Rng,
    hosts: Vec<Host>,
    ids: Slab<IdSlot>,
    channels: Slab<Channel>,
    sched: Queue<Action>,
    /// Cancelled timers still in `sched`. Most timers are cancelled (every answered REQ, REP
    /// and DREQ cancels a timeout a minute away), so without removing them the queue grows with
    /// every connection ever made, and each push and pop with it.
    stale_timers: usize,
    /// The latest time of a cancelled timer removed from `sched`: running until idle moves the
    /// clock to it, as popping the timer would, so that the sweep never changes virtual time.
    removed_until: SimTime,
    payloads: Pool<Payload>,
    ports: Ports,
    trace: Trace,
    next_qpn: u32,
    /// Events handed out and not acked, on every host.
    outstanding: Slab<Outstanding>,
    /// `links[a * hosts + b]`: what faults did to messages from host `a` to host `b`.
    links: Vec<Link>,
    /// Every fault scheduled or injected, in that order (actions refer to them by index).
    faults: Vec<Fault>,
    /// Whether a fault ever touched a link or a host's reachability: until then no message
    /// needs the checks (they cost a fault-free run several percent).
    links_faulted: bool,
    stats: FaultStats,
    /// [`Fault::Drop`] rules struck so far (most runs have none).
    drops: Vec<DropRule>,
    /// What the IB CM waits for an id on the default path, worked out once.
    waits: Waits,
    /// `cfg.cm_retries`, as the exchange counts them.
    cm_retries: u8,
    /// Ids connected or accepted with an external QP (the application's own), and what their
    /// exchange agreed on; no other id has an entry.
    external: BTreeMap<SlotRef, self::external::ExternalQp>,
    /// UD QPs and datagrams in flight, made with the first UD QP (RC runs never have it).
    datagrams: Option<Box<datagram::Datagrams>>,
    /// Events ever queued on any channel: an executor that saw this count before and has
    /// retrieved everything since knows no channel has an event without asking each one.
    events_queued: u64,
    /// What ids set with `rdma_set_option` (most never do).
    id_options: options::OptionTable,
    /// Multicast memberships, made with the first join (RC runs never have it).
    multicast: Option<Box<multicast::Multicast>>,
    /// Memory regions, made with the first registration.
    regions: Option<Box<memory::Regions>>,
    /// Shared receive queues and their events, made with the first SRQ.
    srqs: Option<Box<srq::Srqs>>,
    /// One-sided requests and answers in flight, made with the first request, with the
    /// random stream they draw from.
    rdma: Option<Box<onesided::Wire>>,
    /// Verbs QPs no id owns, made with the first one.
    verbs: Option<Box<verbs::VerbsQps>>,
}

type R<T> = Result<T, CmError>;

impl Fabric {
    fn new(seed: Seed, hosts: Vec<Vec<IpAddr>>, cfg: SimConfig) -> Self {
        let ports = Ports::new(hosts.len(), cfg.ephemeral_ports.clone());
        let trace = Trace::new(cfg.trace);
        Fabric {
            seed,
            latency_nanos: (nanos(*cfg.latency.start()), nanos(*cfg.latency.end())),
            now: SimTime::ZERO,
            rng: ChaCha8Rng::seed_from_u64(seed.value),
            links: vec![Link::default(); hosts.len() * hosts.len()],
            hosts: hosts.into_iter().map(Host::new).collect(),
            faults: Vec::new(),
            links_faulted: false,
            stats: FaultStats::default(),
            drops: Vec::new(),
            waits: cfg.exponents().waits(cfg.packet_lifetime),
            cm_retries: cfg.cm_retries.min(15) as u8,
            events_queued: 0,
            ids: Slab::new(),
            channels: Slab::new(),
            sched: Queue::new(),
            stale_timers: 0,
            removed_until: SimTime::ZERO,
            payloads: Pool::new(),
            ports,
            trace,
            next_qpn: 0x11,
            outstanding: Slab::new(),
            external: BTreeMap::new(),
            datagrams: None,
            id_options: options::OptionTable::default(),
            multicast: None,
            regions: None,
            srqs: None,
            rdma: None,
            verbs: None,
            cfg,
        }
    }
}
