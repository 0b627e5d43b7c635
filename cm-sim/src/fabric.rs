//! The fabric: hosts, ids, channels, the discrete-event queue and the IB CM protocol.
//!
//! Two layers of state per id, as in the real stack:
//! * the [`IdMachine`] is what the application has observed (it moves when calls succeed and
//!   when events are *retrieved*) and is what calls are checked against;
//! * [`Wire`] is the IB CM's view (it moves when messages arrive and timers fire) and decides
//!   which messages are sent and which events are generated.
//!
//! Events are queued on the channel when generated, in virtual-time order, and transformed on
//! retrieval where librdmacm transforms them (the kernel's `CONNECT_RESPONSE` becomes
//! `ESTABLISHED` after the QP reaches RTS and the RTU is sent, or `CONNECT_ERROR`). Events of
//! a destroyed id are skipped lazily when they reach the head of the queue, so destroy never
//! scans a queue.

use std::cell::RefCell;
use std::collections::VecDeque;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::rc::Rc;
use std::time::Duration;

use cm_core::{
    errno, next_backend_tag, Call, ChannelHandle, CmError, CmEvent, CmEventType, ConnParam, HandleKind,
    IdHandle, IdMachine, LiveResources, PortSpace, PrivateData, PrivateDataSlot, QpCaps, QpState,
    ReturnedEvent, WcOpcode, WcStatus, WorkCompletion, MAX_PRIVATE_DATA,
};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::builder::{Seed, SimBuilder, SimConfig, SEED_ENV};
use crate::faults::{Fault, FaultSchedule, FaultStats};
use crate::host::SimHost;
use crate::ports::{BindError, Ports};
use crate::qp::{Landing, Qp};
use crate::sched::{Lane, Queue};
use crate::slab::{Pool, Slab, SlotRef};
use crate::time::{nanos, SimTime};
use crate::trace::{MsgKind, Trace, TraceRecord, TraceWhat};

mod clock;

/// IB CM reject reasons the simulator sends.
mod reason {
    /// `IB_CM_REJ_TIMEOUT`: the active side gave up (or was destroyed) while its REQ was out.
    pub(super) const TIMEOUT: i32 = 1;
    /// `IB_CM_REJ_INVALID_SERVICE_ID`: no listener on that port.
    pub(super) const INVALID_SERVICE_ID: i32 = 8;
    /// `IB_CM_REJ_CONSUMER_DEFINED`: `rdma_reject`, a destroyed peer, or a full backlog.
    pub(super) const CONSUMER_DEFINED: i32 = 28;
    /// SIDR REP status `IB_SIDR_UNSUPPORTED`: no listener (datagram port spaces).
    pub(super) const SIDR_UNSUPPORTED: i32 = 1;
    /// SIDR REP status `IB_SIDR_REJECT`: `rdma_reject` (datagram port spaces).
    pub(super) const SIDR_REJECT: i32 = 2;
}

/// Parameters of events that carry none.
const NO_PARAM: ConnParam = ConnParam::ZERO;

const NO_PAYLOAD: u32 = u32::MAX;

/// The IB CM's view of an id's connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Wire {
    /// No exchange.
    Idle,
    /// Active: REQ sent, waiting for REP or REJ.
    ReqSent,
    /// Active: REP arrived; the RTU goes out when the application retrieves the event.
    RepRcvd,
    /// Passive: REQ arrived, not accepted.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// DREQ received, not answered yet.
    DreqRcvd,
    /// Disconnect complete; `TIMEWAIT_EXIT` pending.
    TimeWait,
    /// Nothing more will happen on the wire.
    Closed,
}

struct Listener {
    backlog: u32,
    /// Children whose `CONNECT_REQUEST` is queued and not retrieved, in queue order.
    pending: VecDeque<SlotRef>,
}

struct IdSlot {
    host: u16,
    channel: SlotRef,
    m: IdMachine,
    local: Option<SocketAddr>,
    peer: Option<SocketAddr>,
    port_bound: bool,
    wire: Wire,
    remote: SlotRef,
    /// Bumped whenever pending timers of the id must stop counting.
    epoch: u32,
    /// Timers of the current epoch still in the queue.
    timers: u32,
    /// Events queued on the channel and not retrieved.
    queued: u32,
    /// When the last message to this id arrives: messages to one id are delivered in order.
    last_arrival: u64,
    disconnected: bool,
    connect_error: bool,
    /// Status of the `ADDR_ERROR` / `ROUTE_ERROR` a pending resolution timer delivers.
    pending_status: i32,
    /// The connection's transport retries (the REQ's `retry_count`, both sides use it): how
    /// many times an unacknowledged send is sent again before it fails.
    retry_count: u8,
    /// The peer's QP went away without a word on the wire (its host crashed or its device was
    /// removed): nothing sent to it will be acknowledged.
    peer_lost: bool,
    /// Whether the application knows the id (false for a child until its request is retrieved).
    visible: bool,
    qp: Option<Qp>,
    listener: Option<Box<Listener>>,
}

struct Channel {
    host: u16,
    queue: VecDeque<Queued>,
    ids: u32,
}

#[derive(Clone, Copy)]
struct Queued {
    id: SlotRef,
    listen: SlotRef,
    event: CmEventType,
    status: i32,
    payload: u32,
}

/// What a REQ, REP or REJ carries: connection parameters as the receiver sees them, and a
/// REQ's destination.
struct Payload {
    wire: WireParam,
    private_data: WirePrivateData,
    dst: Option<SocketAddr>,
}

/// An event handed out and not acked yet; its slab reference is the event's token.
struct Outstanding {
    host: u16,
    /// The id it counts against (the listener for `CONNECT_REQUEST`).
    counted: SlotRef,
    id: IdHandle,
    event: CmEventType,
}

fn token_of(r: SlotRef) -> u64 {
    (u64::from(r.generation) << 32) | u64::from(r.index)
}

fn token_ref(token: u64) -> SlotRef {
    SlotRef {
        index: token as u32,
        generation: (token >> 32) as u32,
    }
}

/// An event retrieved, before it becomes the [`CmEvent`] handed out.
struct Taken {
    id: IdHandle,
    listen_id: Option<IdHandle>,
    event: CmEventType,
    status: i32,
    payload: Option<Payload>,
    token: u64,
}

/// [`ConnParam`] without its private data.
#[derive(Clone, Copy)]
struct WireParam {
    responder_resources: u8,
    initiator_depth: u8,
    flow_control: u8,
    retry_count: u8,
    rnr_retry_count: u8,
    srq: bool,
    qp_num: u32,
}

/// Private data zero-padded to `len` bytes, as the IB CM puts it on the wire. Only the bytes up
/// to the last non-zero one are kept (none, usually) and the padding is rebuilt on retrieval,
/// so a message carries no copy of a 256-byte buffer.
struct WirePrivateData {
    len: u16,
    bytes: Box<[u8]>,
}

impl WirePrivateData {
    /// `given` padded to `len`, which must hold it (the id's machine checked the length).
    fn new(given: &[u8], len: usize) -> Self {
        assert!(
            given.len() <= len && len <= MAX_PRIVATE_DATA,
            "private data longer than its slot"
        );
        let used = given.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
        WirePrivateData {
            len: len as u16,
            bytes: given[..used].into(),
        }
    }

    fn to_private_data(&self) -> PrivateData {
        const ZEROS: [u8; MAX_PRIVATE_DATA] = [0; MAX_PRIVATE_DATA];
        let len = usize::from(self.len);
        if self.bytes.is_empty() {
            return PrivateData::new(&ZEROS[..len]);
        }
        let mut padded = ZEROS;
        padded[..self.bytes.len()].copy_from_slice(&self.bytes);
        PrivateData::new(&padded[..len])
    }
}

impl Payload {
    fn conn_param(&self) -> ConnParam {
        let w = self.wire;
        ConnParam {
            private_data: self.private_data.to_private_data(),
            responder_resources: w.responder_resources,
            initiator_depth: w.initiator_depth,
            flow_control: w.flow_control,
            retry_count: w.retry_count,
            rnr_retry_count: w.rnr_retry_count,
            srq: w.srq,
            qp_num: w.qp_num,
        }
    }
}

/// Parameters of events that carry none, on the wire (REJ).
const NO_WIRE_PARAM: WireParam = WireParam {
    responder_resources: 0,
    initiator_depth: 0,
    flow_control: 0,
    retry_count: 0,
    rnr_retry_count: 0,
    srq: false,
    qp_num: 0,
};

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum TimerKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    ReqTimeout,
    RepTimeout,
    DreqTimeout,
    TimewaitExit,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Req {
        host: u16,
        from: SlotRef,
        payload: u32,
        attempt: u8,
    },
    /// The IB CM sends a lost REQ again.
    ResendReq {
        host: u16,
        from: SlotRef,
        payload: u32,
        attempt: u8,
    },
    /// The IB CM sends a lost REP or DREQ again.
    Resend {
        kind: MsgKind,
        to: SlotRef,
        from: SlotRef,
        status: i32,
        payload: u32,
        attempt: u8,
    },
    /// Fault number `n` of the fabric's list strikes.
    Fault(u32),
    /// A send has found no receive for as long as the receiver-not-ready retries allow.
    Rnr { id: SlotRef, sends_done: u64 },
    /// A send has gone unacknowledged (peer crashed, partitioned or gone) for as long as the
    /// transport retries allow.
    TransportRetry { id: SlotRef, sends_done: u64 },
    Msg {
        kind: MsgKind,
        to: SlotRef,
        from: SlotRef,
        status: i32,
        payload: u32,
    },
    Timer {
        id: SlotRef,
        epoch: u32,
        kind: TimerKind,
    },
}

#[derive(Default, Clone, Copy)]
struct HostCounts {
    channels: usize,
    ids: usize,
    qps: usize,
    unacked: usize,
    queued: usize,
}

struct Host {
    addrs: Vec<IpAddr>,
    tag: u32,
    counts: HostCounts,
    /// Not crashed.
    up: bool,
    /// Bumped by every crash: the application's handles of an earlier incarnation are gone.
    incarnation: u32,
    /// When it last crashed (virtual nanoseconds), for the errors its calls answer while down.
    crashed_at: u64,
    /// The RDMA device is registered.
    device: bool,
    /// Injected resolution failures still to come: (status, how many).
    fail_addr: (i32, u32),
    fail_route: (i32, u32),
    /// Cap on every listener's backlog.
    backlog_cap: u32,
    /// Receiver-not-ready retries before a send gives up (`None`: for ever).
    rnr_retries: Option<u8>,
}

impl Host {
    fn new(addrs: Vec<IpAddr>) -> Self {
        Host {
            addrs,
            tag: next_backend_tag(),
            counts: HostCounts::default(),
            up: true,
            incarnation: 0,
            crashed_at: 0,
            device: true,
            fail_addr: (0, 0),
            fail_route: (0, 0),
            backlog_cap: u32::MAX,
            rnr_retries: None,
        }
    }

    /// Whether CM messages can reach or leave the host.
    fn reachable(&self) -> bool {
        self.up && self.device
    }
}

/// The state of the link between two hosts, as faults leave it.
#[derive(Clone, Copy, Default)]
struct Link {
    partitioned: bool,
    loss_per_mille: u16,
    /// Extra latency range in nanoseconds (0..=0: none).
    delay: (u64, u64),
}

pub(crate) struct Fabric {
    seed: Seed,
    cfg: SimConfig,
    now: u64,
    rng: ChaCha8Rng,
    hosts: Vec<Host>,
    ids: Slab<IdSlot>,
    channels: Slab<Channel>,
    sched: Queue<Action>,
    /// Cancelled timers still in `sched`. Most timers are cancelled (every answered REQ, REP
    /// and DREQ cancels a timeout a minute away), so without removing them the queue grows with
    /// every connection ever made, and each push and pop with it.
    stale_timers: usize,
    /// The latest time of a cancelled timer removed from `sched`: running until idle used to
    /// pop such timers and move the clock to them, and still does.
    removed_until: u64,
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
}

type R<T> = Result<T, CmError>;

/// A value drawn uniformly from `lo..=hi` (`lo <= hi`). The range `0..=u64::MAX` (a range
/// ending at `Duration::MAX`) has no width that fits a `u64`: every value is in it.
fn draw_between(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    match (hi - lo).checked_add(1) {
        Some(width) => lo + rng.next_u64() % width,
        None => rng.next_u64(),
    }
}

impl Fabric {
    fn new(seed: Seed, hosts: Vec<Vec<IpAddr>>, cfg: SimConfig) -> Self {
        let ports = Ports::new(hosts.len(), cfg.ephemeral_ports.clone());
        let trace = Trace::new(cfg.trace);
        Fabric {
            seed,
            now: 0,
            rng: ChaCha8Rng::seed_from_u64(seed.value),
            links: vec![Link::default(); hosts.len() * hosts.len()],
            hosts: hosts.into_iter().map(Host::new).collect(),
            faults: Vec::new(),
            links_faulted: false,
            stats: FaultStats::default(),
            ids: Slab::new(),
            channels: Slab::new(),
            sched: Queue::new(),
            stale_timers: 0,
            removed_until: 0,
            payloads: Pool::new(),
            ports,
            trace,
            next_qpn: 0x11,
            outstanding: Slab::new(),
            cfg,
        }
    }

    // ---- handles -------------------------------------------------------------------------

    /// Host number `index`, for the fabric's public accessors.
    fn host_at(&self, index: usize) -> &Host {
        let n = self.hosts.len();
        self.hosts
            .get(index)
            .unwrap_or_else(|| panic!("no host {index}: the fabric has {n}"))
    }

    pub(crate) fn tag(&self, host: u16) -> u32 {
        self.hosts[host as usize].tag
    }

    /// Refuses every call of a crashed host, saying so (its handles are gone with it).
    fn host_up(&self, host: u16, call: Call) -> R<()> {
        let h = &self.hosts[host as usize];
        if h.up {
            return Ok(());
        }
        Err(CmError::HostCrashed {
            call,
            at: Duration::from_nanos(h.crashed_at),
        })
    }

    fn id_ref(&self, host: u16, id: IdHandle, call: Call) -> R<SlotRef> {
        self.host_up(host, call)?;
        let r = SlotRef {
            index: id.index(),
            generation: id.generation(),
        };
        match self.ids.get(r) {
            Some(slot) if id.owner() == self.tag(host) && slot.host == host && slot.visible => Ok(r),
            _ => Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Id,
            }),
        }
    }

    fn channel_ref(&self, host: u16, ch: ChannelHandle, call: Call) -> R<SlotRef> {
        self.host_up(host, call)?;
        let r = SlotRef {
            index: ch.index(),
            generation: ch.generation(),
        };
        match self.channels.get(r) {
            Some(c) if ch.owner() == self.tag(host) && c.host == host => Ok(r),
            _ => Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Channel,
            }),
        }
    }

    fn id_handle(&self, r: SlotRef) -> IdHandle {
        let host = self.ids.get(r).map_or(0, |s| s.host);
        IdHandle::new(self.tag(host), r.index, r.generation)
    }

    fn slot(&mut self, r: SlotRef) -> &mut IdSlot {
        self.ids.get_mut(r).expect("cm-sim: live id expected")
    }

    // ---- time, randomness, scheduling -----------------------------------------------------

    fn latency(&mut self) -> u64 {
        let lo = nanos(*self.cfg.latency.start());
        let hi = nanos(*self.cfg.latency.end());
        if hi <= lo {
            return lo;
        }
        draw_between(&mut self.rng, lo, hi)
    }

    fn schedule(&mut self, time: u64, action: Action) {
        self.sched.push(time, action, Lane::Heap);
    }

    fn timer(&mut self, id: SlotRef, after: u64, kind: TimerKind) {
        let s = self.slot(id);
        s.timers += 1;
        let epoch = s.epoch;
        // Timeouts of one configured length expire in the order they are set, so each length
        // gets a FIFO lane and stays out of the heap (a lane must see one length only; a push
        // out of order falls back to the heap).
        let lane = match kind {
            TimerKind::ReqTimeout | TimerKind::RepTimeout | TimerKind::DreqTimeout => Lane::Fifo(0),
            TimerKind::TimewaitExit => Lane::Fifo(1),
            TimerKind::AddrResolved
            | TimerKind::AddrError
            | TimerKind::RouteResolved
            | TimerKind::RouteError => Lane::Heap,
        };
        let time = self.now.saturating_add(after);
        self.sched.push(time, Action::Timer { id, epoch, kind }, lane);
    }

    /// Cancels the id's pending timers.
    fn cancel_timers(&mut self, id: SlotRef) {
        let s = self.slot(id);
        s.epoch = s.epoch.wrapping_add(1);
        let cancelled = std::mem::take(&mut s.timers);
        self.timers_cancelled(cancelled);
    }

    /// Counts `n` queued timers as stale; once they are half the queue, removes them all, which
    /// costs O(1) per timer over time and keeps the queue at most twice what is live.
    fn timers_cancelled(&mut self, n: u32) {
        self.stale_timers += n as usize;
        if self.stale_timers < 64 || self.stale_timers * 2 < self.sched.len() {
            return;
        }
        let ids = &self.ids;
        let mut removed_until = self.removed_until;
        self.sched.retain(|time, action| match *action {
            Action::Timer { id, epoch, .. } if ids.get(id).is_none_or(|slot| slot.epoch != epoch) => {
                removed_until = removed_until.max(time);
                false
            }
            _ => true,
        });
        self.removed_until = removed_until;
        self.stale_timers = 0;
    }

    /// Runs scheduled actions up to `deadline` (virtual nanoseconds), stopping early as soon as
    /// `done` holds. Returns whether `done` held.
    fn run_until(&mut self, deadline: u64, done: &dyn Fn(&Fabric) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.sched.pop_due(deadline) {
                Some((time, action)) => {
                    self.now = self.now.max(time);
                    self.dispatch(action);
                }
                None => {
                    self.now = self.now.max(if deadline == u64::MAX {
                        self.removed_until
                    } else {
                        deadline
                    });
                    return false;
                }
            }
        }
    }

    fn deadline(&self, timeout: Duration) -> u64 {
        self.now.saturating_add(nanos(timeout))
    }

    // ---- trace and events -----------------------------------------------------------------

    fn trace_event(&mut self, id: SlotRef, event: CmEventType, status: i32) {
        let host = self.ids.get(id).map_or(u16::MAX, |s| s.host);
        self.trace.record(TraceRecord {
            time: SimTime::from_nanos(self.now),
            host,
            id: id.index,
            what: TraceWhat::Event(event),
            status,
        });
    }

    /// Queues an event for `id` on its channel. `CONNECT_REQUEST`s carry the listener too.
    fn queue_event(&mut self, id: SlotRef, listen: SlotRef, event: CmEventType, status: i32, payload: u32) {
        // The kernel's CONNECT_RESPONSE is traced when librdmacm turns it into what the
        // application sees (on retrieval).
        if event != CmEventType::ConnectResponse {
            self.trace_event(id, event, status);
        }
        let slot = self.slot(id);
        slot.queued += 1;
        let (host, channel) = (slot.host, slot.channel);
        self.hosts[host as usize].counts.queued += 1;
        let ch = self
            .channels
            .get_mut(channel)
            .expect("cm-sim: an id's channel outlives it");
        ch.queue.push_back(Queued {
            id,
            listen,
            event,
            status,
            payload,
        });
    }

    fn new_payload(&mut self, payload: Payload) -> u32 {
        self.payloads.insert(payload)
    }

    /// A REJ's payload: its private data, zero-padded to the 148 bytes the receiver sees.
    fn rej_payload(&mut self, data: &[u8]) -> u32 {
        let len = PortSpace::Tcp.private_data_limit(PrivateDataSlot::Reject);
        self.new_payload(Payload {
            wire: NO_WIRE_PARAM,
            private_data: WirePrivateData::new(data, len),
            dst: None,
        })
    }

    fn take_payload(&mut self, payload: u32) -> Option<Payload> {
        if payload == NO_PAYLOAD {
            return None;
        }
        self.payloads.take(payload)
    }

    // ---- wire -----------------------------------------------------------------------------

    fn trace_send(&mut self, from_host: u16, from: SlotRef, msg: MsgKind, to_host: u16, status: i32) {
        self.trace.record(TraceRecord {
            time: SimTime::from_nanos(self.now),
            host: from_host,
            id: from.index,
            what: TraceWhat::Sent { msg, to: to_host },
            status,
        });
    }

    fn trace_lost(&mut self, from_host: u16, from: SlotRef, msg: MsgKind, to_host: u16) {
        self.stats.messages_lost += 1;
        self.trace.record(TraceRecord {
            time: SimTime::from_nanos(self.now),
            host: from_host,
            id: from.index,
            what: TraceWhat::Lost { msg, to: to_host },
            status: 0,
        });
    }

    /// Whether a message from host `a` to host `b` is lost now (draws only when a loss fault
    /// is on, so runs without faults draw exactly what they always did).
    fn lost(&mut self, a: u16, b: u16) -> bool {
        if !self.links_faulted {
            return false;
        }
        let n = self.hosts.len();
        let (Some(ha), Some(hb)) = (self.hosts.get(a as usize), self.hosts.get(b as usize)) else {
            return false;
        };
        if !ha.reachable() || !hb.reachable() {
            return true;
        }
        let link = self.links[a as usize * n + b as usize];
        link.partitioned
            || (link.loss_per_mille > 0 && self.rng.next_u64() % 1000 < u64::from(link.loss_per_mille))
    }

    /// Extra latency a delay fault adds between hosts `a` and `b`.
    fn extra_delay(&mut self, a: u16, b: u16) -> u64 {
        if !self.links_faulted {
            return 0;
        }
        let n = self.hosts.len();
        let Some(link) = self.links.get(a as usize * n + b as usize) else {
            return 0;
        };
        let (lo, hi) = link.delay;
        if hi == 0 {
            return 0;
        }
        self.stats.messages_delayed += 1;
        draw_between(&mut self.rng, lo, hi)
    }

    /// The IB CM retransmits REQs, REPs and DREQs until answered; RTUs, REJs and DREPs are
    /// sent once.
    fn retried(kind: MsgKind) -> bool {
        matches!(kind, MsgKind::Req | MsgKind::Rep | MsgKind::Dreq)
    }

    /// Sends an IB CM message from `from` to the id `to` (which may be gone: then it is lost).
    fn send(&mut self, from: SlotRef, to: SlotRef, kind: MsgKind, status: i32, payload: u32) {
        self.send_attempt(from, to, kind, status, payload, 0);
    }

    fn send_attempt(
        &mut self,
        from: SlotRef,
        to: SlotRef,
        kind: MsgKind,
        status: i32,
        payload: u32,
        attempt: u8,
    ) {
        let from_host = self.ids.get(from).map_or(u16::MAX, |s| s.host);
        let lat = self.latency();
        let Some(to_host) = self.ids.get(to).map(|d| d.host) else {
            self.take_payload(payload);
            return;
        };
        if self.lost(from_host, to_host) {
            self.trace_lost(from_host, from, kind, to_host);
            if Self::retried(kind) && u32::from(attempt) < self.cfg.cm_retries {
                let again = self.now.saturating_add(nanos(self.cfg.cm_response_timeout()));
                let attempt = attempt + 1;
                self.schedule(
                    again,
                    Action::Resend {
                        kind,
                        to,
                        from,
                        status,
                        payload,
                        attempt,
                    },
                );
            } else {
                self.take_payload(payload);
            }
            return;
        }
        let extra = self.extra_delay(from_host, to_host);
        let dest = self.ids.get_mut(to).expect("checked");
        let arrival = self
            .now
            .saturating_add(lat)
            .saturating_add(extra)
            .max(dest.last_arrival);
        dest.last_arrival = arrival;
        self.trace_send(from_host, from, kind, to_host, status);
        self.schedule(
            arrival,
            Action::Msg {
                kind,
                to,
                from,
                status,
                payload,
            },
        );
    }

    /// Sends the REQ of `from` to the host that owns its destination.
    fn send_req(&mut self, from: SlotRef, to_host: u16, payload: u32, attempt: u8) {
        let from_host = self.ids.get(from).map_or(u16::MAX, |s| s.host);
        let lat = self.latency();
        if self.lost(from_host, to_host) {
            self.trace_lost(from_host, from, MsgKind::Req, to_host);
            self.resend_req_later(from, to_host, payload, attempt);
            return;
        }
        let extra = self.extra_delay(from_host, to_host);
        self.trace_send(from_host, from, MsgKind::Req, to_host, 0);
        self.schedule(
            self.now.saturating_add(lat).saturating_add(extra),
            Action::Req {
                host: to_host,
                from,
                payload,
                attempt,
            },
        );
    }

    /// A REQ got no answer (lost, or dropped by a full backlog): the sender's IB CM sends it
    /// again after its response timeout, until its retries run out.
    fn resend_req_later(&mut self, from: SlotRef, to_host: u16, payload: u32, attempt: u8) {
        if u32::from(attempt) < self.cfg.cm_retries {
            let again = self.now.saturating_add(nanos(self.cfg.cm_response_timeout()));
            let attempt = attempt + 1;
            self.schedule(
                again,
                Action::ResendReq {
                    host: to_host,
                    from,
                    payload,
                    attempt,
                },
            );
        } else {
            self.take_payload(payload);
        }
    }

    fn host_of_ip(&self, ip: IpAddr) -> Option<u16> {
        self.hosts
            .iter()
            .position(|h| h.addrs.contains(&ip))
            .map(|i| i as u16)
    }

    // ---- dispatch -------------------------------------------------------------------------

    fn dispatch(&mut self, action: Action) {
        match action {
            Action::Req {
                host,
                from,
                payload,
                attempt,
            } => self.on_req(host, from, payload, attempt),
            Action::ResendReq {
                host,
                from,
                payload,
                attempt,
            } => {
                if self.ids.get(from).is_some_and(|s| s.wire == Wire::ReqSent) {
                    self.stats.messages_resent += 1;
                    self.send_req(from, host, payload, attempt);
                } else {
                    self.take_payload(payload);
                }
            }
            Action::Resend {
                kind,
                to,
                from,
                status,
                payload,
                attempt,
            } => {
                let waiting = match kind {
                    MsgKind::Rep => Wire::RepSent,
                    _ => Wire::DreqSent,
                };
                if self.ids.get(from).is_some_and(|s| s.wire == waiting) {
                    self.stats.messages_resent += 1;
                    self.send_attempt(from, to, kind, status, payload, attempt);
                } else {
                    self.take_payload(payload);
                }
            }
            Action::Fault(n) => {
                let fault = self.faults[n as usize].clone();
                self.strike(&fault);
            }
            Action::Rnr { id, sends_done } => self.on_rnr(id, sends_done),
            Action::TransportRetry { id, sends_done } => self.on_transport_retry(id, sends_done),
            Action::Msg {
                kind,
                to,
                from,
                status,
                payload,
            } => {
                if self.ids.contains(to) {
                    self.on_msg(kind, to, from, status, payload);
                } else {
                    self.take_payload(payload);
                }
            }
            Action::Timer { id, epoch, kind } => match self.ids.get_mut(id) {
                Some(s) if s.epoch == epoch => {
                    s.timers -= 1;
                    self.on_timer(id, kind);
                }
                // Saturating: a timer of an id dropped without `release` was never counted.
                _ => self.stale_timers = self.stale_timers.saturating_sub(1),
            },
        }
    }

    fn on_timer(&mut self, id: SlotRef, kind: TimerKind) {
        match kind {
            TimerKind::AddrResolved => {
                // A wildcard-bound id takes the host's address of the destination's family.
                let slot = self.slot(id);
                let host = slot.host as usize;
                if let Some(local) = slot.local.filter(|l| l.ip().is_unspecified()) {
                    let ip = self.hosts[host]
                        .addrs
                        .iter()
                        .copied()
                        .find(|a| a.is_ipv4() == local.is_ipv4());
                    if let Some(ip) = ip {
                        self.slot(id).local = Some(SocketAddr::new(ip, local.port()));
                    }
                }
                self.queue_event(id, SlotRef::NONE, CmEventType::AddrResolved, 0, NO_PAYLOAD);
            }
            TimerKind::AddrError => {
                let status = self.slot(id).pending_status;
                self.queue_event(id, SlotRef::NONE, CmEventType::AddrError, status, NO_PAYLOAD)
            }
            TimerKind::RouteResolved => {
                self.queue_event(id, SlotRef::NONE, CmEventType::RouteResolved, 0, NO_PAYLOAD)
            }
            TimerKind::RouteError => {
                let status = self.slot(id).pending_status;
                self.queue_event(id, SlotRef::NONE, CmEventType::RouteError, status, NO_PAYLOAD)
            }
            TimerKind::ReqTimeout => {
                if self.slot(id).wire == Wire::ReqSent {
                    self.stats.req_timeouts += 1;
                    self.slot(id).wire = Wire::Closed;
                    let remote = self.slot(id).remote;
                    if !remote.is_none() {
                        let pd = self.rej_payload(&[]);
                        self.send(id, remote, MsgKind::Rej, reason::TIMEOUT, pd);
                    }
                    self.unreachable(id);
                }
            }
            TimerKind::RepTimeout => {
                if self.slot(id).wire == Wire::RepSent {
                    self.stats.rep_timeouts += 1;
                    self.slot(id).wire = Wire::Closed;
                    self.unreachable(id);
                }
            }
            TimerKind::DreqTimeout => {
                if self.slot(id).wire == Wire::DreqSent {
                    self.stats.dreq_timeouts += 1;
                    self.enter_timewait(id);
                    self.deliver_disconnected(id, -errno::ETIMEDOUT);
                }
            }
            TimerKind::TimewaitExit => {
                if self.slot(id).wire == Wire::TimeWait {
                    self.slot(id).wire = Wire::Closed;
                    if self.slot(id).disconnected {
                        self.queue_event(id, SlotRef::NONE, CmEventType::TimewaitExit, 0, NO_PAYLOAD);
                    }
                }
            }
        }
    }

    /// The IB CM gave up on an unanswered REQ or REP.
    fn unreachable(&mut self, id: SlotRef) {
        self.queue_event(
            id,
            SlotRef::NONE,
            CmEventType::Unreachable,
            -errno::ETIMEDOUT,
            NO_PAYLOAD,
        );
    }

    fn enter_timewait(&mut self, id: SlotRef) {
        self.cancel_timers(id);
        self.slot(id).wire = Wire::TimeWait;
        let tw = nanos(self.cfg.timewait);
        self.timer(id, tw, TimerKind::TimewaitExit);
    }

    /// `DISCONNECTED`, at most once per id (the kernel's CONNECT -> DISCONNECT exchange).
    fn deliver_disconnected(&mut self, id: SlotRef, status: i32) {
        if !self.slot(id).disconnected {
            self.slot(id).disconnected = true;
            self.queue_event(id, SlotRef::NONE, CmEventType::Disconnected, status, NO_PAYLOAD);
        }
    }

    fn on_req(&mut self, host: u16, from: SlotRef, payload: u32, attempt: u8) {
        let Some(active) = self.ids.get(from) else {
            self.take_payload(payload);
            return;
        };
        // A host that crashed or lost its device while the REQ flew does not answer.
        if active.wire != Wire::ReqSent || !self.hosts[host as usize].reachable() {
            self.take_payload(payload);
            return;
        }
        let ps = active.m.port_space();
        let src = active.local;
        let dst = self
            .payloads
            .get(payload)
            .and_then(|p| p.dst)
            .expect("REQ carries its destination");
        let retry_count = self.payloads.get(payload).map_or(0, |p| p.wire.retry_count);
        let listener = self.ports.listener(host, ps, dst.ip(), dst.port());
        let refuse = |no_listener: bool| match (ps.is_connected(), no_listener) {
            (true, true) => reason::INVALID_SERVICE_ID,
            (true, false) => reason::CONSUMER_DEFINED,
            (false, true) => reason::SIDR_UNSUPPORTED,
            (false, false) => reason::SIDR_REJECT,
        };
        let Some(listener) = listener else {
            self.take_payload(payload);
            self.reply_without_id(host, from, refuse(true));
            return;
        };
        let l = self.ids.get(listener).expect("listening ids are bound and alive");
        let channel = l.channel;
        let cap = self.hosts[host as usize].backlog_cap;
        let full = l
            .listener
            .as_ref()
            .is_none_or(|ls| ls.pending.len() as u32 >= ls.backlog.min(cap));
        if full {
            // The kernel drops a request its listener has no room for, without an answer; the
            // sender's IB CM sends it again after its response timeout, until it gives up.
            self.stats.backlog_drops += 1;
            self.resend_req_later(from, host, payload, attempt);
            return;
        }
        let child = self.ids.insert(IdSlot {
            host,
            channel,
            m: IdMachine::new_child(ps),
            local: Some(dst),
            peer: src,
            port_bound: false,
            wire: Wire::ReqRcvd,
            remote: from,
            epoch: 0,
            timers: 0,
            queued: 0,
            last_arrival: 0,
            disconnected: false,
            connect_error: false,
            pending_status: 0,
            retry_count,
            peer_lost: false,
            visible: false,
            qp: None,
            listener: None,
        });
        self.hosts[host as usize].counts.ids += 1;
        self.channels.get_mut(channel).expect("listener's channel").ids += 1;
        self.slot(listener)
            .listener
            .as_mut()
            .expect("listener state")
            .pending
            .push_back(child);
        // The MRA/REP tells the active side who answers; the simulator links them at once.
        self.slot(from).remote = child;
        self.queue_event(child, listener, CmEventType::ConnectRequest, 0, payload);
    }

    /// A REJ (or SIDR REP with an error status) from a host with no id to answer for.
    fn reply_without_id(&mut self, host: u16, to: SlotRef, status: i32) {
        let lat = self.latency();
        let Some(to_host) = self.ids.get(to).map(|d| d.host) else {
            return;
        };
        if self.lost(host, to_host) {
            self.trace_lost(host, SlotRef::NONE, MsgKind::Rej, to_host);
            return;
        }
        let extra = self.extra_delay(host, to_host);
        let dest = self.ids.get_mut(to).expect("checked");
        let arrival = self
            .now
            .saturating_add(lat)
            .saturating_add(extra)
            .max(dest.last_arrival);
        dest.last_arrival = arrival;
        self.trace_send(host, SlotRef::NONE, MsgKind::Rej, to_host, status);
        let pd = self.rej_payload(&[]);
        self.schedule(
            arrival,
            Action::Msg {
                kind: MsgKind::Rej,
                to,
                from: SlotRef::NONE,
                status,
                payload: pd,
            },
        );
    }

    fn on_msg(&mut self, kind: MsgKind, to: SlotRef, from: SlotRef, status: i32, payload: u32) {
        let wire = self.slot(to).wire;
        let connected = self.slot(to).m.port_space().is_connected();
        match (kind, wire) {
            (MsgKind::Rep, Wire::ReqSent) => {
                self.cancel_timers(to);
                let s = self.slot(to);
                s.wire = if connected { Wire::RepRcvd } else { Wire::Closed };
                s.remote = from;
                self.queue_event(to, SlotRef::NONE, CmEventType::ConnectResponse, 0, payload);
                return;
            }
            (MsgKind::Rtu, Wire::RepSent) => {
                self.cancel_timers(to);
                self.slot(to).wire = Wire::Established;
                self.queue_event(to, SlotRef::NONE, CmEventType::Established, 0, NO_PAYLOAD);
            }
            (MsgKind::Rej, Wire::ReqSent | Wire::RepRcvd | Wire::RepSent | Wire::ReqRcvd) => {
                self.cancel_timers(to);
                self.slot(to).wire = Wire::Closed;
                // A child that was not accepted gets no events (the kernel drops them).
                if wire != Wire::ReqRcvd {
                    let event = if connected {
                        CmEventType::Rejected
                    } else {
                        CmEventType::Unreachable
                    };
                    let payload = if connected {
                        payload
                    } else {
                        self.take_payload(payload);
                        NO_PAYLOAD
                    };
                    self.queue_event(to, SlotRef::NONE, event, status, payload);
                    return;
                }
            }
            (MsgKind::Dreq, Wire::Established | Wire::RepSent) => {
                self.cancel_timers(to);
                self.slot(to).wire = Wire::DreqRcvd;
                self.deliver_disconnected(to, 0);
            }
            (MsgKind::Dreq, Wire::DreqSent) => {
                // Both sides disconnected at once: each answers the other's DREQ.
                self.enter_timewait(to);
                self.deliver_disconnected(to, 0);
                self.send(to, from, MsgKind::Drep, 0, NO_PAYLOAD);
            }
            (MsgKind::Drep, Wire::DreqSent) => {
                self.enter_timewait(to);
                self.deliver_disconnected(to, 0);
            }
            _ => {}
        }
        self.take_payload(payload);
    }

    // ---- retrieval ------------------------------------------------------------------------

    fn pop_event(&mut self, ch: SlotRef) -> Option<Taken> {
        loop {
            let q = self.channels.get_mut(ch)?.queue.pop_front()?;
            let alive = self.ids.contains(q.id) && (q.listen.is_none() || self.ids.contains(q.listen));
            if !alive {
                // Its id was destroyed: the kernel discarded the event then.
                self.take_payload(q.payload);
                continue;
            }
            let host = self.slot(q.id).host;
            self.slot(q.id).queued -= 1;
            self.hosts[host as usize].counts.queued -= 1;
            let payload = self.take_payload(q.payload);
            if let Some(ev) = self.retrieve(q, payload) {
                self.hosts[host as usize].counts.unacked += 1;
                return Some(ev);
            }
        }
    }

    /// librdmacm's processing of one event in `rdma_get_cm_event`; `None` when it swallows it.
    fn retrieve(&mut self, q: Queued, payload: Option<Payload>) -> Option<Taken> {
        let mut event = q.event;
        let mut status = q.status;
        let mut listen_id = None;
        let counted = match event {
            CmEventType::ConnectRequest => {
                let listener = q.listen;
                let child = self.slot(q.id);
                child.visible = true;
                let popped = self
                    .slot(listener)
                    .listener
                    .as_mut()
                    .and_then(|l| l.pending.pop_front());
                debug_assert_eq!(popped, Some(q.id), "requests are retrieved in queue order");
                listen_id = Some(self.id_handle(listener));
                listener
            }
            CmEventType::ConnectResponse => {
                let slot = self.slot(q.id);
                event = slot.m.connect_response_outcome();
                // A REJ that arrived meanwhile makes librdmacm's RTU fail.
                if event == CmEventType::Established
                    && slot.wire == Wire::Closed
                    && slot.m.port_space().is_connected()
                {
                    event = CmEventType::ConnectError;
                }
                match event {
                    CmEventType::Established if slot.m.port_space().is_connected() => {
                        slot.wire = Wire::Established;
                        let remote = slot.remote;
                        self.send(q.id, remote, MsgKind::Rtu, 0, NO_PAYLOAD);
                    }
                    CmEventType::ConnectError => {
                        status = -1;
                        slot.connect_error = true;
                    }
                    _ => {}
                }
                self.trace_event(q.id, event, status);
                q.id
            }
            CmEventType::Rejected | CmEventType::Disconnected if self.slot(q.id).connect_error => {
                return None
            }
            _ => q.id,
        };
        let slot = self.slot(counted);
        let next = slot.m.on_event(event).unwrap_or_else(|illegal| {
            panic!(
                "cm-sim bug: generated an illegal event: {illegal}; reproduce with {SEED_ENV}={}",
                self.seed.value
            )
        });
        self.set_machine(counted, next);
        let id = self.id_handle(q.id);
        let host = self.slot(counted).host;
        let token = token_of(self.outstanding.insert(Outstanding {
            host,
            counted,
            id,
            event,
        }));
        Some(Taken {
            id,
            listen_id,
            event,
            status,
            payload,
            token,
        })
    }

    /// Stores a new machine for `id`, flushing the QP if it just went to ERR.
    fn set_machine(&mut self, id: SlotRef, next: IdMachine) {
        let slot = self.slot(id);
        let before = slot.m.qp();
        slot.m = next;
        if before != Some(QpState::Err) && next.qp() == Some(QpState::Err) {
            if let Some(qp) = slot.qp.as_mut() {
                qp.flush();
            }
        }
        if before != Some(QpState::Rts) && next.qp() == Some(QpState::Rts) {
            // Sends that waited for this QP (or were posted on it before it was ready) can go.
            let remote = slot.remote;
            self.deliver_sends(id);
            self.deliver_sends(remote);
        }
    }

    // ---- data path ------------------------------------------------------------------------

    /// Lands `sender`'s pending sends in its peer's posted receives while both allow it.
    /// Sends wait (as under receiver-not-ready retries, which are infinite by default) while
    /// the peer has no receive posted or its QP is not ready to receive.
    fn deliver_sends(&mut self, sender: SlotRef) {
        loop {
            let Some(s) = self.ids.get(sender) else { return };
            let remote = s.remote;
            let sender_ready =
                s.m.qp() == Some(QpState::Rts) && s.qp.as_ref().is_some_and(|q| q.has_pending_send());
            let receiver_ready = self.ids.get(remote).is_some_and(|r| {
                matches!(r.m.qp(), Some(QpState::Rtr | QpState::Rts))
                    && r.qp.as_ref().is_some_and(|q| q.has_recv())
            });
            if !sender_ready {
                return;
            }
            if self.path_broken(sender) {
                self.arm_transport_retry(sender);
                return;
            }
            if !receiver_ready {
                self.arm_rnr(sender);
                return;
            }
            let send = self
                .slot(sender)
                .qp
                .as_mut()
                .and_then(|q| q.pop_send())
                .expect("checked");
            let landing = self
                .slot(remote)
                .qp
                .as_mut()
                .and_then(|q| q.land(&send))
                .expect("checked");
            match landing {
                Landing::Delivered => {
                    self.slot(sender)
                        .qp
                        .as_mut()
                        .expect("checked")
                        .complete_send(send, WcStatus::Success);
                }
                Landing::TooLong => {
                    self.stats.length_errors += 1;
                    self.slot(sender)
                        .qp
                        .as_mut()
                        .expect("checked")
                        .complete_send(send, WcStatus::RemInvReqErr);
                    for id in [remote, sender] {
                        let next = self.slot(id).m.qp_error();
                        self.set_machine(id, next);
                    }
                    return;
                }
            }
        }
    }

    /// The send at the head of `sender`'s queue found no receive: under a receiver-not-ready
    /// retry limit, it gives up once the retries have run out (if it is still waiting then).
    fn arm_rnr(&mut self, sender: SlotRef) {
        let host = self.slot(sender).host;
        let Some(retries) = self.hosts[host as usize].rnr_retries else {
            return;
        };
        let timer = nanos(self.cfg.rnr_timer);
        let Some(qp) = self.slot(sender).qp.as_mut() else {
            return;
        };
        if qp.rnr_armed {
            return;
        }
        qp.rnr_armed = true;
        let sends_done = qp.sends_done;
        let at = self
            .now
            .saturating_add(timer.saturating_mul(u64::from(retries) + 1));
        self.schedule(
            at,
            Action::Rnr {
                id: sender,
                sends_done,
            },
        );
    }

    /// Whether nothing `sender` sends can be acknowledged: its peer vanished with a crashed
    /// host or a removed device, either host is unreachable, or the link between them is
    /// partitioned. (A peer that destroyed its id told the IB CM; its sends still wait, as
    /// README's departures say.)
    fn path_broken(&self, sender: SlotRef) -> bool {
        if !self.links_faulted {
            return false;
        }
        let Some(s) = self.ids.get(sender) else {
            return false;
        };
        if s.peer_lost {
            return true;
        }
        let Some(r) = self.ids.get(s.remote) else {
            return false;
        };
        let (a, b) = (s.host as usize, r.host as usize);
        let n = self.hosts.len();
        !self.hosts[a].reachable() || !self.hosts[b].reachable() || self.links[a * n + b].partitioned
    }

    /// The send at the head of `sender`'s queue goes unacknowledged: the transport sends it
    /// again every local ACK timeout, `retry_count` times, then gives up.
    fn arm_transport_retry(&mut self, sender: SlotRef) {
        let per_try = nanos(self.cfg.ack_timeout);
        let tries = u64::from(self.slot(sender).retry_count) + 1;
        let Some(qp) = self.slot(sender).qp.as_mut() else {
            return;
        };
        if qp.retry_armed {
            return;
        }
        qp.retry_armed = true;
        let sends_done = qp.sends_done;
        let at = self.now.saturating_add(per_try.saturating_mul(tries));
        self.schedule(
            at,
            Action::TransportRetry {
                id: sender,
                sends_done,
            },
        );
    }

    fn on_transport_retry(&mut self, id: SlotRef, sends_done: u64) {
        let Some(slot) = self.ids.get_mut(id) else { return };
        let rts = slot.m.qp() == Some(QpState::Rts);
        let Some(qp) = slot.qp.as_mut() else { return };
        if !rts || !qp.retry_armed || qp.sends_done != sends_done || !qp.has_pending_send() {
            return;
        }
        qp.retry_armed = false;
        if !self.path_broken(id) {
            // The path healed in time: one of the retries gets through.
            self.deliver_sends(id);
            return;
        }
        let qp = self.slot(id).qp.as_mut().expect("checked");
        let send = qp.pop_send().expect("checked");
        qp.complete_send(send, WcStatus::RetryExcErr);
        self.stats.transport_retries_exceeded += 1;
        let next = self.slot(id).m.qp_error();
        self.set_machine(id, next);
    }

    /// After a fault that may have cut paths: sends already waiting (for a receive, say) learn
    /// that their peer no longer answers. Fault path only: scans every id.
    fn recheck_waiting_sends(&mut self) {
        for r in self.ids.refs() {
            if self
                .ids
                .get(r)
                .and_then(|s| s.qp.as_ref())
                .is_some_and(|q| q.has_pending_send())
            {
                self.deliver_sends(r);
            }
        }
    }

    fn on_rnr(&mut self, id: SlotRef, sends_done: u64) {
        let Some(slot) = self.ids.get_mut(id) else { return };
        let rts = slot.m.qp() == Some(QpState::Rts);
        let Some(qp) = slot.qp.as_mut() else { return };
        if !rts || !qp.rnr_armed || qp.sends_done != sends_done || !qp.has_pending_send() {
            return;
        }
        let send = qp.pop_send().expect("checked");
        qp.complete_send(send, WcStatus::RnrRetryExcErr);
        self.stats.rnr_retries_exceeded += 1;
        let next = self.slot(id).m.qp_error();
        self.set_machine(id, next);
    }

    // ---- faults ---------------------------------------------------------------------------

    fn check_fault(&self, fault: &Fault) {
        let n = self.hosts.len();
        for h in fault.hosts() {
            assert!(
                (h as usize) < n,
                "fault `{fault}` names host {h}, the fabric has {n}"
            );
        }
    }

    fn trace_fault(&mut self, host: u16, fault: &Fault) {
        self.trace.record(TraceRecord {
            time: SimTime::from_nanos(self.now),
            host,
            id: u32::MAX,
            what: TraceWhat::Fault(fault.kind()),
            status: 0,
        });
    }

    fn set_link(&mut self, a: u16, b: u16, change: impl Fn(&mut Link)) {
        let n = self.hosts.len();
        change(&mut self.links[a as usize * n + b as usize]);
        change(&mut self.links[b as usize * n + a as usize]);
    }

    /// Ids living on `host`, the application's and those it does not know yet.
    fn ids_on(&self, host: u16) -> Vec<SlotRef> {
        self.ids
            .refs()
            .into_iter()
            .filter(|r| self.ids.get(*r).is_some_and(|s| s.host == host))
            .collect()
    }

    /// `r`'s connection ends without a word on the wire: its peer learns only that nothing it
    /// sends is acknowledged.
    fn lose_peer_of(&mut self, r: SlotRef) {
        let remote = self.slot(r).remote;
        if let Some(peer) = self.ids.get_mut(remote) {
            if peer.remote == r {
                peer.peer_lost = true;
            }
        }
    }

    /// Drops an id without a word on the wire: the end of every destroy, and all of it when
    /// the id's host crashed or its device went.
    fn vanish(&mut self, r: SlotRef) {
        let s = self.slot(r);
        let (host, ps, channel, queued, timers) = (s.host, s.m.port_space(), s.channel, s.queued, s.timers);
        let bound = s.local.filter(|_| s.port_bound);
        self.ids.discard(r);
        self.timers_cancelled(timers);
        if let Some(local) = bound {
            self.ports.unbind(host, ps, local.port(), r);
        }
        let counts = &mut self.hosts[host as usize].counts;
        counts.ids -= 1;
        counts.queued -= queued as usize;
        if let Some(c) = self.channels.get_mut(channel) {
            c.ids -= 1;
        }
    }

    /// Strikes `fault` now.
    fn strike(&mut self, fault: &Fault) {
        let first_host = fault.hosts()[0];
        if matches!(
            fault,
            Fault::Partition { .. }
                | Fault::Loss { .. }
                | Fault::Delay { .. }
                | Fault::Crash { .. }
                | Fault::RemoveDevice { .. }
        ) {
            self.links_faulted = true;
        }
        self.trace_fault(first_host, fault);
        match *fault {
            Fault::Partition { a, b } => {
                self.stats.partitions += 1;
                self.set_link(a, b, |l| l.partitioned = true);
                self.recheck_waiting_sends();
            }
            Fault::Heal { a, b } => self.set_link(a, b, |l| l.partitioned = false),
            Fault::Loss { a, b, per_mille } => {
                self.set_link(a, b, |l| l.loss_per_mille = per_mille.min(1000))
            }
            Fault::Delay { a, b, min, max } => {
                let (lo, hi) = (nanos(min.min(max)), nanos(min.max(max)));
                self.set_link(a, b, |l| l.delay = (lo, hi));
            }
            Fault::Crash { host } => {
                self.crash(host);
                self.recheck_waiting_sends();
            }
            Fault::Restart { host } => {
                let h = &mut self.hosts[host as usize];
                if !h.up {
                    // Back with nothing, faults on it forgotten; the tag stays (handles of the
                    // old incarnation are unknown anyway: their slots are gone).
                    *h = Host {
                        incarnation: h.incarnation,
                        tag: h.tag,
                        ..Host::new(std::mem::take(&mut h.addrs))
                    };
                    self.stats.restarts += 1;
                }
            }
            Fault::RemoveDevice { host } => {
                self.remove_device(host);
                self.recheck_waiting_sends();
            }
            Fault::RestoreDevice { host } => self.hosts[host as usize].device = true,
            Fault::AddrChange { host } => {
                for r in self.ids_on(host) {
                    let s = self.slot(r);
                    let waiting_child = s.m.phase() == cm_core::ConnPhase::Requested;
                    let live = !matches!(
                        s.m.state(),
                        cm_core::IdState::DeviceRemoval | cm_core::IdState::Destroying
                    );
                    if s.visible && s.m.has_device() && live && !waiting_child {
                        self.stats.addr_changes += 1;
                        self.queue_event(r, SlotRef::NONE, CmEventType::AddrChange, 0, NO_PAYLOAD);
                    }
                }
            }
            Fault::FailAddrResolution { host, status, count } => {
                self.hosts[host as usize].fail_addr = (status, count)
            }
            Fault::FailRouteResolution { host, status, count } => {
                self.hosts[host as usize].fail_route = (status, count)
            }
            Fault::Backlog { host, backlog } => self.hosts[host as usize].backlog_cap = backlog,
            Fault::RnrRetries { host, retries } => {
                self.hosts[host as usize].rnr_retries = (retries < 7).then_some(retries);
            }
        }
    }

    /// The host goes down: its ids, channels and QPs vanish, nothing is said on the wire.
    fn crash(&mut self, host: u16) {
        if !self.hosts[host as usize].up {
            return;
        }
        self.stats.crashes += 1;
        let h = &mut self.hosts[host as usize];
        h.up = false;
        h.crashed_at = self.now;
        h.incarnation += 1;
        for r in self.ids_on(host) {
            self.lose_peer_of(r);
            self.vanish(r);
        }
        for o in self.outstanding.refs() {
            if self.outstanding.get(o).is_some_and(|x| x.host == host) {
                self.outstanding.discard(o);
            }
        }
        for ch in self.channels.refs() {
            if self.channels.get(ch).is_some_and(|c| c.host == host) {
                let c = self.channels.remove(ch).expect("live");
                for q in c.queue {
                    self.take_payload(q.payload);
                }
            }
        }
        self.hosts[host as usize].counts = HostCounts::default();
    }

    /// Discards every event queued on `host`'s channels and not retrieved, but the
    /// `DEVICE_REMOVAL`s of an earlier removal: what the device's removal leaves of them could
    /// follow `DEVICE_REMOVAL` (an `ADDR_RESOLVED` with an `ADDR_ERROR` after it, say), which no
    /// id may see.
    fn discard_queued_events(&mut self, host: u16) {
        for ch in self.channels.refs() {
            let Some(c) = self.channels.get_mut(ch).filter(|c| c.host == host) else {
                continue;
            };
            let queue = std::mem::take(&mut c.queue);
            let mut kept = VecDeque::new();
            for q in queue {
                let Some(slot) = self.ids.get_mut(q.id) else {
                    // Its id was destroyed, and its events uncounted then.
                    self.take_payload(q.payload);
                    continue;
                };
                if q.event == CmEventType::DeviceRemoval {
                    kept.push_back(q);
                    continue;
                }
                slot.queued -= 1;
                self.hosts[host as usize].counts.queued -= 1;
                self.take_payload(q.payload);
            }
            self.channels.get_mut(ch).expect("live").queue = kept;
        }
    }

    /// The host's device is unregistered: `DEVICE_REMOVAL` on each id bound to it, after which
    /// it takes no call but destroy; events not retrieved yet are discarded; a listener bound to
    /// the device stops listening; connections end without a word on the wire.
    fn remove_device(&mut self, host: u16) {
        if !self.hosts[host as usize].device {
            return;
        }
        self.stats.device_removals += 1;
        self.hosts[host as usize].device = false;
        self.discard_queued_events(host);
        for r in self.ids_on(host) {
            let s = self.slot(r);
            if !s.visible {
                // A request nobody retrieved yet: its child goes with the device.
                if let Some(listener) = self.ids.refs().into_iter().find(|l| {
                    self.ids
                        .get(*l)
                        .and_then(|x| x.listener.as_ref())
                        .is_some_and(|x| x.pending.contains(&r))
                }) {
                    self.slot(listener)
                        .listener
                        .as_mut()
                        .expect("listener")
                        .pending
                        .retain(|c| *c != r);
                }
                self.vanish(r);
                continue;
            }
            let (state, phase, device) = (s.m.state(), s.m.phase(), s.m.has_device());
            if matches!(
                state,
                cm_core::IdState::DeviceRemoval | cm_core::IdState::Destroying
            ) {
                continue;
            }
            self.cancel_timers(r);
            self.lose_peer_of(r);
            let s = self.slot(r);
            s.wire = Wire::Closed;
            if state == cm_core::IdState::AddrQuery && !device {
                // Resolving from a wildcard bind: the resolution fails instead.
                s.pending_status = -errno::ENODEV;
                self.queue_event(
                    r,
                    SlotRef::NONE,
                    CmEventType::AddrError,
                    -errno::ENODEV,
                    NO_PAYLOAD,
                );
            } else if device && phase != cm_core::ConnPhase::Requested {
                // A child not accepted yet gets no event (the kernel drops them), only a dead id.
                s.m = s.m.device_removed();
                if s.listener.take().is_some() {
                    let (ps, port) = (s.m.port_space(), s.local.map_or(0, |l| l.port()));
                    self.ports.set_listening(host, ps, port, r, false);
                }
                self.queue_event(r, SlotRef::NONE, CmEventType::DeviceRemoval, 0, NO_PAYLOAD);
            }
        }
    }

    // ---- calls ----------------------------------------------------------------------------

    pub(crate) fn create_event_channel(&mut self, host: u16) -> R<ChannelHandle> {
        self.host_up(host, Call::CreateEventChannel)?;
        let r = self.channels.insert(Channel {
            host,
            queue: VecDeque::new(),
            ids: 0,
        });
        self.hosts[host as usize].counts.channels += 1;
        Ok(ChannelHandle::new(self.tag(host), r.index, r.generation))
    }

    pub(crate) fn destroy_event_channel(&mut self, host: u16, ch: ChannelHandle) -> R<()> {
        let r = self.channel_ref(host, ch, Call::DestroyEventChannel)?;
        let c = self.channels.get(r).expect("checked");
        if c.ids > 0 {
            return Err(CmError::ChannelBusy { ids: c.ids });
        }
        let c = self.channels.remove(r).expect("checked");
        for q in c.queue {
            self.take_payload(q.payload);
        }
        self.hosts[host as usize].counts.channels -= 1;
        Ok(())
    }

    pub(crate) fn create_id(&mut self, host: u16, ch: ChannelHandle, ps: PortSpace) -> R<IdHandle> {
        let channel = self.channel_ref(host, ch, Call::CreateId)?;
        let r = self.ids.insert(IdSlot {
            host,
            channel,
            m: IdMachine::new(ps),
            local: None,
            peer: None,
            port_bound: false,
            wire: Wire::Idle,
            remote: SlotRef::NONE,
            epoch: 0,
            timers: 0,
            queued: 0,
            last_arrival: 0,
            disconnected: false,
            connect_error: false,
            pending_status: 0,
            retry_count: 0,
            peer_lost: false,
            visible: true,
            qp: None,
            listener: None,
        });
        self.channels.get_mut(channel).expect("checked").ids += 1;
        self.hosts[host as usize].counts.ids += 1;
        Ok(IdHandle::new(self.tag(host), r.index, r.generation))
    }

    pub(crate) fn destroy_id(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::DestroyId)?;
        self.slot(r).m.destroy()?;
        let children = self
            .slot(r)
            .listener
            .take()
            .map(|l| l.pending)
            .unwrap_or_default();
        for child in children {
            self.release(child);
        }
        self.release(r);
        Ok(())
    }

    /// What the kernel does when an id goes away: tell the peer, free the port, drop the id
    /// and (lazily) its queued events.
    fn release(&mut self, r: SlotRef) {
        let remote = self.slot(r).remote;
        let connected = self.slot(r).m.port_space().is_connected();
        let rej = if connected {
            reason::CONSUMER_DEFINED
        } else {
            reason::SIDR_REJECT
        };
        match self.slot(r).wire {
            Wire::ReqSent if !remote.is_none() => {
                let pd = self.rej_payload(&[]);
                self.send(r, remote, MsgKind::Rej, reason::TIMEOUT, pd);
            }
            Wire::ReqRcvd | Wire::RepRcvd | Wire::RepSent => {
                let pd = self.rej_payload(&[]);
                self.send(r, remote, MsgKind::Rej, rej, pd);
            }
            Wire::Established => self.send(r, remote, MsgKind::Dreq, 0, NO_PAYLOAD),
            Wire::DreqRcvd => self.send(r, remote, MsgKind::Drep, 0, NO_PAYLOAD),
            _ => {}
        }
        self.vanish(r);
    }

    fn bind_port(&mut self, host: u16, r: SlotRef, addr: SocketAddr, call: Call) -> R<()> {
        let ip = addr.ip();
        let wildcard = ip.is_unspecified();
        if !wildcard && !self.hosts[host as usize].addrs.contains(&ip) {
            return Err(CmError::AddrNotAvailable { call });
        }
        if !wildcard && !self.hosts[host as usize].device {
            // The address is local but no RDMA device carries it (removed).
            return Err(CmError::Os {
                call,
                errno: errno::ENODEV,
            });
        }
        let ps = self.slot(r).m.port_space();
        let port = self
            .ports
            .bind(host, ps, (!wildcard).then_some(ip), addr.port(), r)
            .map_err(|e| match e {
                BindError::InUse => CmError::AddrInUse { call },
                BindError::NotAvailable => CmError::AddrNotAvailable { call },
            })?;
        let slot = self.slot(r);
        slot.local = Some(SocketAddr::new(ip, port));
        slot.port_bound = true;
        Ok(())
    }

    pub(crate) fn bind_addr(&mut self, host: u16, id: IdHandle, addr: SocketAddr) -> R<()> {
        let r = self.id_ref(host, id, Call::BindAddr)?;
        let next = self.slot(r).m.bind_addr(addr.ip().is_unspecified())?;
        self.bind_port(host, r, addr, Call::BindAddr)?;
        self.slot(r).m = next;
        Ok(())
    }

    pub(crate) fn resolve_addr(
        &mut self,
        host: u16,
        id: IdHandle,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> R<()> {
        let call = Call::ResolveAddr;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.resolve_addr()?;
        let v4 = dst.is_ipv4();
        let family_mismatch =
            src.is_some_and(|s| s.is_ipv4() != v4) || self.slot(r).local.is_some_and(|l| l.is_ipv4() != v4);
        if family_mismatch {
            return Err(CmError::InvalidArgument {
                call,
                reason: "source and destination address families differ",
            });
        }
        let own = self.hosts[host as usize]
            .addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == v4);
        // Loopback and wildcard destinations resolve to this host, as the kernel resolves them
        // to the first local device.
        let target = if dst.ip().is_unspecified() || dst.ip().is_loopback() {
            own.ok_or(CmError::AddrNotAvailable { call })?
        } else {
            dst.ip()
        };
        if self.slot(r).m.state() == cm_core::IdState::Idle {
            let src = match src {
                Some(s) => s,
                None => SocketAddr::new(own.ok_or(CmError::AddrNotAvailable { call })?, 0),
            };
            self.bind_port(host, r, src, call)?;
        }
        let reachable = self
            .host_of_ip(target)
            .is_some_and(|h| self.hosts[h as usize].reachable());
        let slot = self.slot(r);
        slot.peer = Some(SocketAddr::new(target, dst.port()));
        slot.m = next;
        self.cancel_timers(r);
        let h = &mut self.hosts[host as usize];
        if h.fail_addr.1 > 0 {
            h.fail_addr.1 -= 1;
            let status = h.fail_addr.0;
            self.stats.addr_errors += 1;
            self.slot(r).pending_status = status;
            let lat = self.latency();
            self.timer(r, lat, TimerKind::AddrError);
        } else if !h.device {
            self.slot(r).pending_status = -errno::ENODEV;
            let lat = self.latency();
            self.timer(r, lat, TimerKind::AddrError);
        } else if reachable {
            let lat = self.latency();
            self.timer(r, lat, TimerKind::AddrResolved);
        } else {
            // Neighbour resolution gets no answer until the caller's timeout.
            self.slot(r).pending_status = -errno::ETIMEDOUT;
            self.timer(r, nanos(timeout), TimerKind::AddrError);
        }
        Ok(())
    }

    pub(crate) fn resolve_route(&mut self, host: u16, id: IdHandle, _timeout: Duration) -> R<()> {
        // RoCE (what rxe is) resolves routes from a work item without a path query, so the
        // timeout, which bounds only the IB SA query, never applies.
        let r = self.id_ref(host, id, Call::ResolveRoute)?;
        let next = self.slot(r).m.resolve_route()?;
        self.slot(r).m = next;
        let lat = self.latency();
        let h = &mut self.hosts[host as usize];
        if h.fail_route.1 > 0 {
            h.fail_route.1 -= 1;
            let status = h.fail_route.0;
            self.stats.route_errors += 1;
            self.slot(r).pending_status = status;
            self.timer(r, lat, TimerKind::RouteError);
        } else {
            self.timer(r, lat, TimerKind::RouteResolved);
        }
        Ok(())
    }

    pub(crate) fn create_qp(&mut self, host: u16, id: IdHandle, caps: QpCaps) -> R<QpCaps> {
        let call = Call::CreateQp;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.create_qp()?;
        let slot = self.slot(r);
        let cm_exchange_over = !matches!(
            slot.wire,
            Wire::Idle | Wire::ReqSent | Wire::RepRcvd | Wire::ReqRcvd | Wire::RepSent | Wire::Established
        );
        if slot.m.port_space().is_connected() && cm_exchange_over {
            // The peer ended the exchange before the application saw it (e.g. a child whose
            // requester went away): the kernel has no QP attributes to give.
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let max_wr = self.cfg.max_qp_wr;
        caps.check(max_wr, self.cfg.max_message_size)?;
        if caps.max_send_sge > self.cfg.max_sge || caps.max_recv_sge > self.cfg.max_sge {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_send_sge / max_recv_sge above the device's max_sge",
            });
        }
        if caps.max_inline_data > self.cfg.max_inline_data {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_inline_data above the device maximum",
            });
        }
        let qpn = self.next_qpn;
        self.next_qpn = (self.next_qpn + 1) & 0x00FF_FFFF;
        let slot = self.slot(r);
        slot.qp = Some(Qp::new(qpn, caps));
        slot.m = next;
        self.hosts[host as usize].counts.qps += 1;
        Ok(caps)
    }

    pub(crate) fn destroy_qp(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::DestroyQp)?;
        let next = self.slot(r).m.destroy_qp()?;
        let slot = self.slot(r);
        slot.qp = None;
        slot.m = next;
        self.hosts[host as usize].counts.qps -= 1;
        Ok(())
    }

    pub(crate) fn listen(&mut self, host: u16, id: IdHandle, backlog: i32) -> R<()> {
        let r = self.id_ref(host, id, Call::Listen)?;
        let next = self.slot(r).m.listen()?;
        if !self.slot(r).port_bound {
            self.bind_port(host, r, SocketAddr::from(([0, 0, 0, 0], 0)), Call::Listen)?;
        }
        let max = self.cfg.max_backlog;
        let backlog = if backlog <= 0 || backlog as u32 > max {
            max
        } else {
            backlog as u32
        };
        let slot = self.slot(r);
        let (ps, port) = (slot.m.port_space(), slot.local.expect("bound").port());
        slot.listener = Some(Box::new(Listener {
            backlog,
            pending: VecDeque::new(),
        }));
        slot.m = next;
        self.ports.set_listening(host, ps, port, r, true);
        Ok(())
    }

    fn check_resources(&self, call: Call, param: &ConnParam) -> R<(u8, u8)> {
        let max = self.cfg.max_rd_atomic;
        let resolve = |v: u8| {
            if v == 0xFF {
                Ok(max)
            } else if v > max {
                Err(())
            } else {
                Ok(v)
            }
        };
        match (resolve(param.responder_resources), resolve(param.initiator_depth)) {
            (Ok(rr), Ok(id)) => Ok((rr, id)),
            _ => Err(CmError::InvalidArgument {
                call,
                reason: "responder_resources / initiator_depth above the device maximum",
            }),
        }
    }

    pub(crate) fn connect(&mut self, host: u16, id: IdHandle, param: &ConnParam) -> R<()> {
        let call = Call::Connect;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.connect(param.private_data.len())?;
        let (rr, depth) = self.check_resources(call, param)?;
        let slot = self.slot(r);
        let ps = slot.m.port_space();
        let dst = slot.peer.expect("a resolved id has a destination");
        let qp_num = slot.qp.as_ref().map_or(param.qp_num & 0x00FF_FFFF, |q| q.qpn);
        // The receiver sees the request from its own point of view: our initiator depth is
        // its responder resources and the other way round.
        let wire = WireParam {
            responder_resources: depth,
            initiator_depth: rr,
            flow_control: param.flow_control,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            qp_num,
        };
        let private_data = WirePrivateData::new(
            param.private_data.as_slice(),
            ps.private_data_limit(PrivateDataSlot::Connect),
        );
        slot.m = next;
        slot.wire = Wire::ReqSent;
        slot.remote = SlotRef::NONE;
        slot.retry_count = wire.retry_count;
        self.cancel_timers(r);
        let timeout = nanos(self.cfg.cm_timeout);
        self.timer(r, timeout, TimerKind::ReqTimeout);
        let payload = self.new_payload(Payload {
            wire,
            private_data,
            dst: Some(dst),
        });
        match self.host_of_ip(dst.ip()) {
            Some(to_host) => self.send_req(r, to_host, payload, 0),
            None => {
                self.latency();
                self.take_payload(payload);
            }
        }
        Ok(())
    }

    pub(crate) fn accept(&mut self, host: u16, id: IdHandle, param: &ConnParam) -> R<()> {
        let call = Call::Accept;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.accept(param.private_data.len())?;
        let (rr, depth) = self.check_resources(call, param)?;
        if self.slot(r).wire != Wire::ReqRcvd {
            // The request is gone (the active side gave up or was destroyed): the kernel
            // refuses, and librdmacm moves the QP to ERR after its RTR/RTS transitions.
            let failed = self.slot(r).m.qp_error();
            self.set_machine(r, failed);
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let slot = self.slot(r);
        let ps = slot.m.port_space();
        let remote = slot.remote;
        let qp_num = slot.qp.as_ref().map_or(0, |q| q.qpn);
        let wire = WireParam {
            responder_resources: depth,
            initiator_depth: rr,
            flow_control: param.flow_control,
            retry_count: 0,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            qp_num,
        };
        let private_data = WirePrivateData::new(
            param.private_data.as_slice(),
            ps.private_data_limit(PrivateDataSlot::Accept),
        );
        self.set_machine(r, next);
        self.cancel_timers(r);
        if ps.is_connected() {
            self.slot(r).wire = Wire::RepSent;
            let timeout = nanos(self.cfg.cm_timeout);
            self.timer(r, timeout, TimerKind::RepTimeout);
        } else {
            self.slot(r).wire = Wire::Closed;
        }
        let payload = self.new_payload(Payload {
            wire,
            private_data,
            dst: None,
        });
        self.send(r, remote, MsgKind::Rep, 0, payload);
        Ok(())
    }

    pub(crate) fn reject(&mut self, host: u16, id: IdHandle, private_data: &[u8]) -> R<()> {
        let call = Call::Reject;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.reject(private_data.len())?;
        if self.slot(r).wire != Wire::ReqRcvd {
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let slot = self.slot(r);
        let ps = slot.m.port_space();
        let remote = slot.remote;
        slot.m = next;
        slot.wire = Wire::Closed;
        let (status, payload) = if ps.is_connected() {
            (reason::CONSUMER_DEFINED, self.rej_payload(private_data))
        } else {
            (reason::SIDR_REJECT, NO_PAYLOAD)
        };
        self.send(r, remote, MsgKind::Rej, status, payload);
        Ok(())
    }

    pub(crate) fn disconnect(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::Disconnect)?;
        let next = self.slot(r).m.disconnect()?;
        self.set_machine(r, next);
        let remote = self.slot(r).remote;
        match self.slot(r).wire {
            Wire::Established => {
                self.slot(r).wire = Wire::DreqSent;
                self.cancel_timers(r);
                let timeout = nanos(self.cfg.cm_timeout);
                self.timer(r, timeout, TimerKind::DreqTimeout);
                self.send(r, remote, MsgKind::Dreq, 0, NO_PAYLOAD);
            }
            Wire::DreqRcvd => {
                self.enter_timewait(r);
                self.send(r, remote, MsgKind::Drep, 0, NO_PAYLOAD);
            }
            // Not established on the wire: the IB CM has neither a DREQ nor a DREP to send,
            // and the kernel still returns 0.
            _ => {}
        }
        Ok(())
    }

    pub(crate) fn get_cm_event(
        &mut self,
        host: u16,
        ch: ChannelHandle,
        timeout: Duration,
    ) -> R<Option<CmEvent>> {
        let r = self.channel_ref(host, ch, Call::GetCmEvent)?;
        let deadline = self.deadline(timeout);
        loop {
            if let Some(t) = self.pop_event(r) {
                // Built in what is returned, one return per kind of parameters: an event is
                // over 300 bytes and every copy of it showed in profiles.
                let Some(p) = t.payload else {
                    return Ok(Some(CmEvent::new(
                        t.id,
                        t.listen_id,
                        t.event,
                        t.status,
                        NO_PARAM,
                        t.token,
                    )));
                };
                return Ok(Some(CmEvent::new(
                    t.id,
                    t.listen_id,
                    t.event,
                    t.status,
                    p.conn_param(),
                    t.token,
                )));
            }
            let has_event = |f: &Fabric| f.channels.get(r).is_some_and(|c| !c.queue.is_empty());
            if !self.run_until(deadline, &has_event) {
                return Ok(None);
            }
        }
    }

    pub(crate) fn ack_cm_event(&mut self, host: u16, event: CmEvent) -> R<()> {
        if event.counted_id().owner() != self.tag(host) {
            // Another host's, fabric's or backend's: refused, and handed back so that the id
            // it counts against can still be acked and destroyed where it lives.
            return Err(CmError::ForeignEvent(ReturnedEvent::new(event)));
        }
        self.host_up(host, Call::AckCmEvent)?;
        let r = token_ref(event.token());
        let counted = match self.outstanding.get(r) {
            Some(o) if o.host == host && o.id == event.id() && o.event == event.event() => o.counted,
            _ => return Err(CmError::EventNotOutstanding),
        };
        let next = self.slot(counted).m.on_ack()?;
        self.outstanding.discard(r);
        self.slot(counted).m = next;
        self.hosts[host as usize].counts.unacked -= 1;
        Ok(())
    }

    pub(crate) fn get_local_addr(&mut self, host: u16, id: IdHandle) -> R<Option<SocketAddr>> {
        let r = self.id_ref(host, id, Call::GetLocalAddr)?;
        Ok(self.slot(r).local)
    }

    pub(crate) fn get_peer_addr(&mut self, host: u16, id: IdHandle) -> R<Option<SocketAddr>> {
        let r = self.id_ref(host, id, Call::GetPeerAddr)?;
        Ok(self.slot(r).peer)
    }

    fn qp_for(&mut self, host: u16, id: IdHandle, call: Call) -> R<SlotRef> {
        let r = self.id_ref(host, id, call)?;
        if self.slot(r).qp.is_none() {
            return Err(CmError::NoQp { call });
        }
        Ok(r)
    }

    pub(crate) fn post_send(&mut self, host: u16, id: IdHandle, wr_id: u64, data: &[u8]) -> R<()> {
        let call = Call::PostSend;
        let r = self.qp_for(host, id, call)?;
        self.slot(r).m.post_send()?;
        let in_err = self.slot(r).m.qp() == Some(QpState::Err);
        let qp = self.slot(r).qp.as_mut().expect("checked");
        qp.caps.check_length(WcOpcode::Send, data.len())?;
        if qp.send_slots() >= qp.caps.max_send_wr {
            return Err(CmError::QueueFull {
                call,
                outstanding: qp.send_slots(),
            });
        }
        if in_err {
            qp.push_flushed(wr_id, WcOpcode::Send);
        } else {
            qp.push_send(wr_id, data);
            self.deliver_sends(r);
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, host: u16, id: IdHandle, wr_id: u64, len: u32) -> R<()> {
        let call = Call::PostRecv;
        let r = self.qp_for(host, id, call)?;
        self.slot(r).m.post_recv()?;
        let in_err = self.slot(r).m.qp() == Some(QpState::Err);
        let qp = self.slot(r).qp.as_mut().expect("checked");
        qp.caps.check_length(WcOpcode::Recv, len as usize)?;
        if qp.recv_slots() >= qp.caps.max_recv_wr {
            return Err(CmError::QueueFull {
                call,
                outstanding: qp.recv_slots(),
            });
        }
        if in_err {
            qp.push_flushed(wr_id, WcOpcode::Recv);
        } else {
            qp.push_recv(wr_id, len);
            let remote = self.slot(r).remote;
            self.deliver_sends(remote);
        }
        Ok(())
    }

    pub(crate) fn poll_cq(
        &mut self,
        host: u16,
        id: IdHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> R<usize> {
        let r = self.qp_for(host, id, Call::PollCq)?;
        let deadline = self.deadline(timeout);
        let ready = |f: &Fabric| {
            f.ids
                .get(r)
                .and_then(|s| s.qp.as_ref())
                .is_none_or(|q| !q.cq_is_empty())
        };
        self.run_until(deadline, &ready);
        Ok(self
            .ids
            .get_mut(r)
            .and_then(|s| s.qp.as_mut())
            .map_or(0, |q| q.poll(out, max)))
    }

    pub(crate) fn id_machine(&self, host: u16, id: IdHandle) -> R<IdMachine> {
        let r = SlotRef {
            index: id.index(),
            generation: id.generation(),
        };
        self.id_ref(host, id, Call::GetLocalAddr)?;
        Ok(self.ids.get(r).expect("checked").m)
    }

    pub(crate) fn live_resources(&self, host: Option<u16>) -> LiveResources {
        let mut total = LiveResources::default();
        for (i, h) in self.hosts.iter().enumerate() {
            if host.is_none_or(|only| only as usize == i) {
                total.channels += h.counts.channels;
                total.ids += h.counts.ids;
                total.qps += h.counts.qps;
                total.unacked_events += h.counts.unacked;
                total.queued_events += h.counts.queued;
            }
        }
        total
    }
}

/// A simulated fabric: hosts with addresses, joined by a network with seeded latencies,
/// running in virtual time. Cloning gives another handle to the same fabric.
///
/// Get a [`SimHost`] per host with [`host`](SimFabric::host); each implements
/// [`CmBackend`](cm_core::CmBackend) for the ids and channels of that host. Virtual time moves
/// only when a call waits ([`get_cm_event`](cm_core::CmBackend::get_cm_event) and
/// [`poll_cq`](cm_core::CmBackend::poll_cq) with a timeout) or when the fabric is driven
/// ([`advance`](SimFabric::advance), [`run_until_idle`](SimFabric::run_until_idle)). A run is
/// a pure function of the seed and the calls made.
#[derive(Clone)]
pub struct SimFabric {
    inner: Rc<RefCell<Fabric>>,
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fab = self.inner.borrow();
        f.debug_struct("SimFabric")
            .field("seed", &fab.seed.value)
            .field("now", &SimTime::from_nanos(fab.now))
            .field("hosts", &fab.hosts.iter().map(|h| &h.addrs).collect::<Vec<_>>())
            .finish()
    }
}

impl SimFabric {
    /// A builder.
    pub fn builder() -> SimBuilder {
        SimBuilder::new()
    }

    pub(crate) fn new(seed: Seed, hosts: Vec<Vec<IpAddr>>, cfg: SimConfig) -> Self {
        SimFabric {
            inner: Rc::new(RefCell::new(Fabric::new(seed, hosts, cfg))),
        }
    }

    pub(crate) fn inner(&self) -> &Rc<RefCell<Fabric>> {
        &self.inner
    }

    /// The backend for host number `index` (in the order the builder added them).
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host(&self, index: usize) -> SimHost {
        let hosts = self.inner.borrow().hosts.len();
        assert!(index < hosts, "no host {index}: the fabric has {hosts}");
        SimHost::new(self.clone(), index as u16)
    }

    /// How many hosts the fabric has (numbered from 0).
    pub fn host_count(&self) -> usize {
        self.inner.borrow().hosts.len()
    }

    /// The backend for the host that owns `addr`.
    pub fn host_by_addr(&self, addr: IpAddr) -> Option<SimHost> {
        let index = self.inner.borrow().host_of_ip(addr)?;
        Some(SimHost::new(self.clone(), index))
    }

    /// The addresses of host number `index`.
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_addrs(&self, index: usize) -> Vec<IpAddr> {
        self.inner.borrow().host_at(index).addrs.clone()
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.inner.borrow().seed.value
    }

    /// The seed and where it came from.
    pub fn seed_info(&self) -> Seed {
        self.inner.borrow().seed
    }

    /// `reproduce with CM_SIM_SEED=<seed>`: what to print when a run fails.
    pub fn repro_line(&self) -> String {
        format!("reproduce with {SEED_ENV}={}", self.seed())
    }

    /// The configuration.
    pub fn config(&self) -> SimConfig {
        self.inner.borrow().cfg.clone()
    }

    /// Current virtual time.
    pub fn now(&self) -> SimTime {
        SimTime::from_nanos(self.inner.borrow().now)
    }

    /// Runs everything due within `duration` of virtual time and moves the clock on by it.
    pub fn advance(&self, duration: Duration) {
        let mut fab = self.inner.borrow_mut();
        let deadline = fab.deadline(duration);
        fab.run_until(deadline, &|_| false);
    }

    /// Runs until nothing is scheduled (pending timers included: timewaits, DREQ timeouts);
    /// returns the time reached.
    pub fn run_until_idle(&self) -> SimTime {
        let mut fab = self.inner.borrow_mut();
        fab.run_until(u64::MAX, &|_| false);
        SimTime::from_nanos(fab.now)
    }

    /// Resources alive on the whole fabric.
    pub fn live_resources(&self) -> LiveResources {
        self.inner.borrow().live_resources(None)
    }

    /// The trace's stable hash.
    pub fn trace_hash(&self) -> u64 {
        self.inner.borrow().trace.hash()
    }

    /// How many records the trace has (kept or not).
    pub fn trace_len(&self) -> u64 {
        self.inner.borrow().trace.count()
    }

    /// The kept trace records (empty with [`TraceMode::HashOnly`](crate::TraceMode::HashOnly)).
    pub fn trace_records(&self) -> Vec<TraceRecord> {
        self.inner.borrow().trace.records().to_vec()
    }

    /// The kept trace as text, one line per record.
    pub fn trace_lines(&self) -> Vec<String> {
        let fab = self.inner.borrow();
        let hosts: Vec<IpAddr> = fab.hosts.iter().map(|h| h.addrs[0]).collect();
        fab.trace
            .records()
            .iter()
            .map(|r| Trace::line(r, &hosts).to_string())
            .collect()
    }

    /// Schedules the faults of `schedule` at their times.
    ///
    /// # Panics
    /// If a fault names a host the fabric does not have.
    pub(crate) fn schedule_faults(&self, schedule: FaultSchedule) {
        let mut fab = self.inner.borrow_mut();
        for fa in schedule.faults {
            fab.check_fault(&fa.fault);
            let n = u32::try_from(fab.faults.len()).expect("fault count");
            fab.faults.push(fa.fault);
            let at = nanos(fa.at);
            fab.schedule(at, Action::Fault(n));
        }
    }

    /// Strikes `fault` now (see [`Fault`] for what each does).
    ///
    /// # Panics
    /// If the fault names a host the fabric does not have.
    pub fn inject(&self, fault: Fault) {
        let mut fab = self.inner.borrow_mut();
        fab.check_fault(&fault);
        fab.faults.push(fault.clone());
        fab.strike(&fault);
    }

    /// How often each fault path fired so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.inner.borrow().stats
    }

    /// Whether host number `index` is up (not crashed).
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_is_up(&self, index: usize) -> bool {
        self.inner.borrow().host_at(index).up
    }

    /// How many times host number `index` has crashed: an application on it must forget every
    /// handle of an earlier incarnation.
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_incarnation(&self, index: usize) -> u32 {
        self.inner.borrow().host_at(index).incarnation
    }

    /// Writes the kept trace, one line per record, to `<dir>/<label>.trace`, where `dir` is
    /// `CM_SIM_TRACE_DIR` or else `cm-sim-traces` in the system's temporary directory; returns
    /// the path. For failing runs: print the path with the seed.
    pub fn write_trace_file(&self, label: &str) -> std::io::Result<std::path::PathBuf> {
        let dir = std::env::var_os("CM_SIM_TRACE_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("cm-sim-traces"));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{label}.trace"));
        let mut text = self.trace_lines().join("\n");
        text.push('\n');
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The kept trace as a Mermaid sequence diagram (see [`TraceMode`](crate::TraceMode)): a
    /// participant per host, an arrow per CM message, a note per event.
    pub fn trace_mermaid(&self) -> String {
        let fab = self.inner.borrow();
        let hosts: Vec<IpAddr> = fab.hosts.iter().map(|h| h.addrs[0]).collect();
        crate::mermaid::render(fab.trace.records(), &hosts)
    }
}
