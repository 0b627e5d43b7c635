//! Running a scenario against the simulator and checking every answer.

use std::cell::RefCell;
use std::collections::{HashMap, HashSet};
use std::convert::Infallible;
use std::fmt;
use std::hash::{DefaultHasher, Hash, Hasher};
use std::panic::{self, AssertUnwindSafe};
use std::sync::Once;
use std::time::Duration;

use cm_core::{
    errno, Call, ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, Invocation,
    LiveResources, MrHandle, Outcome, SrqHandle, WorkCompletion,
};
use cm_sim::{ConfigError, SimFabric, SimHost};

use crate::gen::{group_addr, FabricSpec, FuzzCall, HandleRef, HostSel, Op, Owner, Scenario};
use crate::stats::Stats;

mod onesided;

use onesided::{RegionRec, SrqRec};

/// Which check a sequence failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum Check {
    /// The simulator (or the harness around it) panicked.
    Panic,
    /// An error with an errno outside the set librdmacm and verbs give.
    Errno,
    /// An error naming another call than the one made, a kind the call cannot give, or an
    /// answer that contradicts itself (`poll_cq` counting other completions than it appended).
    ErrorCall,
    /// An event for an id the application had destroyed or for an id of another host, or a
    /// destroyed id's handle issued again.
    EventId,
    /// An event whose status does not fit its type.
    EventStatus,
    /// `ack_cm_event` accepted an event the backend never handed out.
    ForgedAckAccepted,
    /// `ack_cm_event` refused an event retrieved on that host (and incarnation), never acked.
    GenuineAckRefused,
    /// The per-host `live_resources` do not add up to the fabric's.
    LiveAccounting,
    /// After destroying everything, acking everything and running the timers out, something is
    /// still alive.
    Teardown,
    /// The same seed ran twice gave different traces or answers.
    Determinism,
    /// A deregistered or destroyed handle, or another host's region or SRQ, was accepted; or
    /// a handle was issued twice.
    WrongHandleAccepted,
    /// A region's description (`mr_info`) contradicts its registration or changed while it
    /// lived, a live region was refused, or its address overlaps an earlier region's.
    Region,
    /// A work completion whose status, byte count, bytes or immediate do not fit its opcode.
    Completion,
    /// An asynchronous event the simulator does not make, or for an SRQ that is not the
    /// host's live one.
    AsyncEvent,
}

impl Check {
    /// Short name for reports.
    pub const fn name(self) -> &'static str {
        match self {
            Check::Panic => "panic",
            Check::Errno => "errno",
            Check::ErrorCall => "error-call",
            Check::EventId => "event-id",
            Check::EventStatus => "event-status",
            Check::ForgedAckAccepted => "forged-ack-accepted",
            Check::GenuineAckRefused => "genuine-ack-refused",
            Check::LiveAccounting => "live-accounting",
            Check::Teardown => "teardown",
            Check::Determinism => "determinism",
            Check::WrongHandleAccepted => "wrong-handle-accepted",
            Check::Region => "region",
            Check::Completion => "completion",
            Check::AsyncEvent => "async-event",
        }
    }
}

impl fmt::Display for Check {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A failed check.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Failure {
    /// Which check.
    pub check: Check,
    /// What makes two failures the same one: the panic's location and message shape, or the
    /// check's own key (minimisation keeps the failure with the same signature).
    pub signature: String,
    /// What happened, in full.
    pub detail: String,
    /// The call (index into the scenario's calls) it happened at; `None` for teardown and
    /// determinism.
    pub at: Option<usize>,
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.at {
            Some(i) => write!(f, "[{}] at call {i}: {}", self.check, self.detail),
            None => write!(f, "[{}] {}", self.check, self.detail),
        }
    }
}

/// What one run gives back.
pub struct RunResult {
    /// The first failed check, if any.
    pub failure: Option<Failure>,
    /// Hash of every answer and both fabrics' trace hashes: equal for equal runs.
    pub digest: u64,
    /// Counts of calls, events and errors.
    pub stats: Stats,
    /// One line per call with its answer, when asked for.
    pub log: Vec<String>,
}

thread_local! {
    static CAPTURE: RefCell<Option<Option<(String, String)>>> = const { RefCell::new(None) };
}

/// Installs (once) a panic hook that, on threads running a sequence, records the panic's
/// message and location instead of printing them; elsewhere the previous hook runs.
fn install_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            let captured = CAPTURE.with(|c| {
                let mut c = c.borrow_mut();
                match c.as_mut() {
                    Some(slot) => {
                        let msg = info
                            .payload()
                            .downcast_ref::<&str>()
                            .map(|s| s.to_string())
                            .or_else(|| info.payload().downcast_ref::<String>().cloned())
                            .unwrap_or_else(|| "(non-string panic payload)".into());
                        let loc = info.location().map_or_else(
                            || "unknown location".into(),
                            |l| format!("{}:{}", l.file(), l.line()),
                        );
                        *slot = Some((msg, loc));
                        true
                    }
                    None => false,
                }
            });
            if !captured {
                previous(info);
            }
        }));
    });
}

/// Whether `f` panics, without printing the panic.
pub(crate) fn panics_quietly(f: impl FnOnce()) -> bool {
    install_hook();
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let panicked = panic::catch_unwind(AssertUnwindSafe(f)).is_err();
    CAPTURE.with(|c| *c.borrow_mut() = None);
    panicked
}

/// Digits replaced by `#`: two panics at one place with different numbers are one failure.
fn shape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut last_digit = false;
    for c in text.chars().take(160) {
        if c.is_ascii_digit() {
            if !last_digit {
                out.push('#');
            }
            last_digit = true;
        } else {
            out.push(c);
            last_digit = false;
        }
    }
    out
}

/// How to run a scenario.
#[derive(Clone, Copy, Debug, Default)]
pub struct RunOptions<'a> {
    /// Only the calls with these indices, ascending (all when `None`).
    pub keep: Option<&'a [usize]>,
    /// Builder faults left out: (fabric, index in its schedule).
    pub drop_faults: &'a [(u8, usize)],
    /// Record each call with its answer in [`RunResult::log`].
    pub log: bool,
    /// A planted application bug, to show the checks find and minimise one: teardown drops the
    /// events it holds instead of acking them.
    pub forget_held_events: bool,
    /// Another planted bug: teardown leaves every memory region registered and every SRQ made.
    pub keep_regions: bool,
}

/// Runs `scenario` once as `opts` say. Panics are caught and reported as a failure.
pub fn run_once(scenario: &Scenario, opts: &RunOptions<'_>) -> RunResult {
    install_hook();
    CAPTURE.with(|c| *c.borrow_mut() = Some(None));
    let mut world = None;
    let outcome = panic::catch_unwind(AssertUnwindSafe(|| {
        let w = world.insert(World::new(scenario, opts)?);
        Ok::<_, ConfigError>(w.run(opts.keep))
    }));
    let captured = CAPTURE.with(|c| c.borrow_mut().take()).flatten();
    let (failure, stats, log, digest) = match outcome {
        Ok(Ok(failure)) => {
            let w = world.take().expect("world built");
            (failure, w.stats, w.log, w.digest.finish())
        }
        Ok(Err(refused)) => {
            // A configuration `try_build` refuses is a typed answer, not a failure; the run has
            // nothing else to do. Its text goes into the digest so that replays compare it.
            let text = refused.to_string();
            let failure = text.is_empty().then(|| Failure {
                check: Check::Panic,
                signature: "configuration refused without a reason".into(),
                detail: format!("try_build refused a configuration with an empty message: {refused:?}"),
                at: None,
            });
            let mut digest = DefaultHasher::new();
            text.hash(&mut digest);
            let stats = Stats {
                sequences: 1,
                configs_refused: 1,
                ..Stats::default()
            };
            (
                failure,
                stats,
                vec![format!("configuration refused: {text}")],
                digest.finish(),
            )
        }
        Err(_) => {
            let (msg, loc) = captured.unwrap_or_else(|| ("(panic not captured)".into(), "?".into()));
            let (at, stats, log) = match world.take() {
                Some(w) => (w.current, w.stats, w.log),
                None => (None, Stats::default(), Vec::new()),
            };
            let failure = Failure {
                check: Check::Panic,
                signature: format!("panic at {loc}: {}", shape(msg.lines().next().unwrap_or(""))),
                detail: format!("panicked at {loc}: {msg}"),
                at,
            };
            (Some(failure), stats, log, 0)
        }
    };
    RunResult {
        failure,
        digest,
        stats,
        log,
    }
}

/// An event retrieved and not acked yet.
struct Held {
    from: HostSel,
    incarnation: u32,
    event: CmEvent,
}

struct World<'a> {
    scenario: &'a Scenario,
    fabrics: [SimFabric; 2],
    hosts: [Vec<SimHost>; 2],
    /// Handles each host was given, oldest first (never removed: stale ones are good input).
    chans: [Vec<Vec<ChannelHandle>>; 2],
    ids: [Vec<Vec<IdHandle>>; 2],
    all_chans: Vec<ChannelHandle>,
    all_ids: Vec<IdHandle>,
    /// Ids destroyed by a successful `destroy_id` (or gone with a crash): no event may name them.
    dead_ids: HashSet<IdHandle>,
    held: Vec<Held>,
    /// Each host's owner tag, once a handle showed it.
    tags: [Vec<Option<u32>>; 2],
    /// Regions each host registered, oldest first (never removed), and what the run knows of
    /// each.
    mrs: [Vec<Vec<MrHandle>>; 2],
    all_mrs: Vec<MrHandle>,
    regions: HashMap<MrHandle, RegionRec>,
    /// SRQs each host made, oldest first, and what the run knows of each.
    srqs: [Vec<Vec<SrqHandle>>; 2],
    all_srqs: Vec<SrqHandle>,
    srq_recs: HashMap<SrqHandle, SrqRec>,
    stats: Stats,
    digest: DefaultHasher,
    log: Vec<String>,
    logging: bool,
    forget_held: bool,
    keep_regions: bool,
    current: Option<usize>,
}

type Checked = Result<(), Failure>;

fn fail(check: Check, signature: impl Into<String>, detail: impl Into<String>, at: Option<usize>) -> Checked {
    Err(Failure {
        check,
        signature: signature.into(),
        detail: detail.into(),
        at,
    })
}

/// Every errno librdmacm and verbs answer these calls with (524 is the kernel's `ENOTSUPP`,
/// which `rdma_join_multicast` passes on for an IPv6 group on RoCEv2; `ENODATA` is
/// `ibv_create_ah`'s for a source GID index with no GID).
const PLAUSIBLE_ERRNOS: [i32; 15] = [
    errno::ENOENT,
    errno::EBADF,
    errno::ENOMEM,
    errno::EBUSY,
    errno::ENODEV,
    errno::ENODATA,
    errno::EINVAL,
    errno::EOPNOTSUPP,
    errno::EADDRINUSE,
    errno::EADDRNOTAVAIL,
    errno::ENETUNREACH,
    errno::ETIMEDOUT,
    errno::ECONNREFUSED,
    errno::EHOSTUNREACH,
    524,
];

/// The call an error names, when its variant names one.
pub(crate) fn error_call(e: &CmError) -> Option<Call> {
    match e {
        CmError::UnknownHandle { call, .. }
        | CmError::WrongState { call, .. }
        | CmError::UnackedEvents { call, .. }
        | CmError::NoQp { call }
        | CmError::NoDevice { call }
        | CmError::ExternalQp { call }
        | CmError::BackendQp { call }
        | CmError::WrongQpState { call, .. }
        | CmError::PrivateDataTooLong { call, .. }
        | CmError::AddrInUse { call }
        | CmError::AddrNotAvailable { call }
        | CmError::InvalidArgument { call, .. }
        | CmError::QueueFull { call, .. }
        | CmError::Os { call, .. } => Some(*call),
        _ => None,
    }
}

/// The call an operation is, for matching against the call its errors name.
fn op_call(op: &Op) -> Option<Call> {
    Some(match op {
        Op::Call { call, .. } => call.call(),
        Op::GetCmEvent { .. } | Op::TryGetCmEvent { .. } | Op::TakeCmEvent { .. } => Call::GetCmEvent,
        Op::AckHeld { .. } | Op::AckForged { .. } => Call::AckCmEvent,
        Op::PollCq { .. } | Op::TryPollCq { .. } => Call::PollCq,
        Op::IdMachine { .. }
        | Op::LiveResources { .. }
        | Op::Inject { .. }
        | Op::Advance { .. }
        | Op::RunUntilIdle { .. } => return None,
        Op::RegMr { .. }
        | Op::MrInfo { .. }
        | Op::DeregMr { .. }
        | Op::ReadMr { .. }
        | Op::WriteMr { .. }
        | Op::PostSendWr { .. }
        | Op::CreateSrq { .. }
        | Op::DestroySrq { .. }
        | Op::PostSrqRecv { .. }
        | Op::ArmSrqLimit { .. }
        | Op::CreateQpOnSrq { .. }
        | Op::GetAsyncEvent { .. } => return onesided::onesided_call(op),
    })
}

/// Whether `e` is an answer `call` can give at all.
fn error_fits_call(e: &CmError, call: Call) -> bool {
    if let Some(named) = error_call(e) {
        // An explicit source address makes resolve_addr bind first, and bind's errors are its.
        return named == call || (call == Call::ResolveAddr && named == Call::BindAddr);
    }
    match e {
        CmError::QpAttached => call == Call::DestroyId,
        CmError::QpInGroups { .. } => call == Call::DestroyQp,
        CmError::ChannelBusy { .. } => call == Call::DestroyEventChannel,
        CmError::QpExists => call == Call::CreateQp,
        CmError::EventNotOutstanding => call == Call::AckCmEvent,
        _ => true,
    }
}

/// Whether `status` fits an event of type `ty` (statuses the simulator's fault model and
/// librdmacm give: 0, a negative errno, an IB CM reject reason or SIDR status).
fn status_fits(ty: CmEventType, status: i32) -> bool {
    match ty {
        CmEventType::AddrResolved
        | CmEventType::RouteResolved
        | CmEventType::ConnectRequest
        | CmEventType::Established
        | CmEventType::AddrChange
        | CmEventType::TimewaitExit
        | CmEventType::DeviceRemoval
        | CmEventType::ConnectResponse => status == 0,
        CmEventType::AddrError | CmEventType::RouteError | CmEventType::ConnectError => status < 0,
        CmEventType::Rejected => status > 0,
        CmEventType::Unreachable => status == -errno::ETIMEDOUT || status > 0,
        CmEventType::Disconnected => status == 0 || status == -errno::ETIMEDOUT,
        // The simulator's joins always succeed (no SA to refuse them).
        CmEventType::MulticastJoin => status == 0,
        // It never makes up events of a newer librdmacm, nor loses a group.
        _ => false,
    }
}

fn build(spec: &FabricSpec, drop: impl Fn(usize) -> bool) -> Result<SimFabric, ConfigError> {
    let mut b = SimFabric::builder().seed(spec.seed).config(spec.config.clone());
    for addrs in &spec.hosts {
        let texts: Vec<String> = addrs.iter().map(ToString::to_string).collect();
        let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
        b = b.host_with_addrs(&refs);
    }
    let mut faults = spec.faults.clone();
    let mut i = 0;
    faults.faults.retain(|_| {
        i += 1;
        !drop(i - 1)
    });
    b.faults(faults).try_build()
}

impl<'a> World<'a> {
    /// The scenario's world, or the builder's refusal of one of its configurations.
    fn new(scenario: &'a Scenario, opts: &RunOptions<'_>) -> Result<World<'a>, ConfigError> {
        let drop_faults = opts.drop_faults;
        let f0 = build(&scenario.fabrics[0], |i| drop_faults.contains(&(0, i)))?;
        let f1 = build(&scenario.fabrics[1], |i| drop_faults.contains(&(1, i)))?;
        let counts = scenario.host_counts();
        let hosts = [
            (0..counts[0]).map(|h| f0.host(h)).collect(),
            (0..counts[1]).map(|h| f1.host(h)).collect(),
        ];
        Ok(World {
            scenario,
            fabrics: [f0, f1],
            hosts,
            chans: [vec![Vec::new(); counts[0]], vec![Vec::new(); counts[1]]],
            ids: [vec![Vec::new(); counts[0]], vec![Vec::new(); counts[1]]],
            all_chans: Vec::new(),
            all_ids: Vec::new(),
            dead_ids: HashSet::new(),
            held: Vec::new(),
            tags: [vec![None; counts[0]], vec![None; counts[1]]],
            mrs: [vec![Vec::new(); counts[0]], vec![Vec::new(); counts[1]]],
            all_mrs: Vec::new(),
            regions: HashMap::new(),
            srqs: [vec![Vec::new(); counts[0]], vec![Vec::new(); counts[1]]],
            all_srqs: Vec::new(),
            srq_recs: HashMap::new(),
            stats: Stats::default(),
            digest: DefaultHasher::new(),
            log: Vec::new(),
            logging: opts.log,
            forget_held: opts.forget_held_events,
            keep_regions: opts.keep_regions,
            current: None,
        })
    }

    fn run(&mut self, keep: Option<&[usize]>) -> Option<Failure> {
        let ops = &self.scenario.ops;
        for (i, op) in ops.iter().enumerate() {
            if keep.is_some_and(|k| k.binary_search(&i).is_err()) {
                continue;
            }
            self.current = Some(i);
            self.stats.calls += 1;
            if let Err(f) = self.step(i, op) {
                return Some(f);
            }
        }
        self.current = None;
        if let Err(f) = self.teardown() {
            return Some(f);
        }
        for fabric in &self.fabrics {
            fabric.trace_hash().hash(&mut self.digest);
        }
        None
    }

    fn note(&mut self, i: usize, op: &Op, answer: impl FnOnce() -> String) {
        if self.logging {
            self.log.push(format!("{i:4}: {op} -> {}", answer()));
        }
    }

    fn host(&self, h: HostSel) -> SimHost {
        self.hosts[h.fabric as usize][h.host as usize].clone()
    }

    fn learn_tag(&mut self, h: HostSel, owner: u32) {
        self.tags[h.fabric as usize][h.host as usize].get_or_insert(owner);
    }

    fn pick<T: Copy>(
        own: &[T],
        all: &[T],
        r: HandleRef,
        forged: impl Fn(u32, u32, u32) -> T,
        tag: impl Fn(Owner) -> u32,
    ) -> T {
        let nth_recent = |list: &[T], n: u16| {
            list.get(list.len().checked_sub(1 + n as usize % list.len().max(1))?)
                .copied()
        };
        let forge_default = || forged(0, 0, 0);
        match r {
            HandleRef::Own(n) => nth_recent(own, n).unwrap_or_else(forge_default),
            HandleRef::Any(n) => nth_recent(all, n).unwrap_or_else(forge_default),
            HandleRef::Forged {
                owner,
                index,
                generation,
            } => forged(tag(owner), index, generation),
        }
    }

    fn owner_tag(&self, o: Owner) -> u32 {
        match o {
            // A host that issued nothing yet has an unknown tag; one that no backend has stands in.
            Owner::Host(h) => self
                .tags
                .get(h.fabric as usize)
                .and_then(|t| t.get(h.host as usize % t.len().max(1)))
                .copied()
                .flatten()
                .unwrap_or(u32::MAX - 2),
            Owner::Never(t) => t,
        }
    }

    fn id(&self, h: HostSel, r: HandleRef) -> IdHandle {
        let own = &self.ids[h.fabric as usize][h.host as usize];
        Self::pick(own, &self.all_ids, r, cm_core::backend::id_handle, |o| {
            self.owner_tag(o)
        })
    }

    fn chan(&self, h: HostSel, r: HandleRef) -> ChannelHandle {
        let own = &self.chans[h.fabric as usize][h.host as usize];
        Self::pick(own, &self.all_chans, r, cm_core::backend::channel_handle, |o| {
            self.owner_tag(o)
        })
    }

    /// Checks an error answer and counts it.
    fn check_err(&mut self, i: usize, op: &Op, e: &CmError) -> Checked {
        self.stats.error(e);
        let n = e.errno();
        std::mem::discriminant(e).hash(&mut self.digest);
        n.hash(&mut self.digest);
        if !PLAUSIBLE_ERRNOS.contains(&n) {
            return fail(
                Check::Errno,
                format!("errno {n} from {}", crate::stats::error_kind(e)),
                format!("{op} answered {e:?} with errno {n}, not one librdmacm gives"),
                Some(i),
            );
        }
        if e.to_string().is_empty() {
            return fail(
                Check::Errno,
                "empty message",
                format!("{op} answered {e:?} with an empty message"),
                Some(i),
            );
        }
        let fits = match onesided::onesided_error_fits(op, e) {
            Some(fits) => fits,
            None => op_call(op).is_none_or(|call| error_fits_call(e, call)),
        };
        if let (false, Some(call)) = (fits, op_call(op)) {
            return fail(
                Check::ErrorCall,
                format!("{} from {}", crate::stats::error_kind(e), call.name()),
                format!("{op} answered {e:?} ({e}), which is not about {}", call.name()),
                Some(i),
            );
        }
        Ok(())
    }

    /// The checks of a retrieved event, however it was retrieved; counts it and learns the id
    /// a `CONNECT_REQUEST` brings.
    fn check_event(&mut self, i: usize, op: &Op, h: HostSel, ev: &Seen) -> Checked {
        let ty = ev.ty;
        self.stats.event(ty);
        (ty.raw(), ev.status, ev.private_len).hash(&mut self.digest);
        if !status_fits(ty, ev.status) {
            return fail(
                Check::EventStatus,
                format!("{ty} status"),
                format!("{op} gave {ev} with status {}", ev.status),
                Some(i),
            );
        }
        if self.dead_ids.contains(&ev.id) || ev.listen.is_some_and(|l| self.dead_ids.contains(&l)) {
            return fail(
                Check::EventId,
                format!("{ty} for a destroyed id"),
                format!("{op} gave {ev} for an id already destroyed"),
                Some(i),
            );
        }
        let (f, hh) = (h.fabric as usize, h.host as usize);
        let own = &self.ids[f][hh];
        if ty == CmEventType::ConnectRequest {
            match ev.listen {
                Some(l) if own.contains(&l) => {}
                _ => {
                    return fail(
                        Check::EventId,
                        "CONNECT_REQUEST without a listener of the host",
                        format!("{op} gave {ev} whose listener is not an id of {h}"),
                        Some(i),
                    )
                }
            }
            self.learn_tag(h, ev.id.owner());
            self.ids[f][hh].push(ev.id);
            self.all_ids.push(ev.id);
        } else if !own.contains(&ev.id) {
            return fail(
                Check::EventId,
                format!("{ty} for an id not of the host"),
                format!("{op} gave {ev} for an id {h} never had"),
                Some(i),
            );
        }
        Ok(())
    }

    /// Checks a retrieved event and files it (acked at once or held).
    fn got_event(&mut self, i: usize, op: &Op, h: HostSel, ev: CmEvent, ack: bool) -> Checked {
        let ty = ev.event();
        self.check_event(i, op, h, &Seen::of(&ev))?;
        if ack {
            let text = format!("{ev}");
            match self.host(h).ack_cm_event(ev) {
                Ok(()) => {}
                Err(e) => {
                    return fail(
                        Check::GenuineAckRefused,
                        format!("ack of {ty} right after retrieval"),
                        format!("{op}: acking {text} at once on its own host failed: {e:?}"),
                        Some(i),
                    )
                }
            }
        } else {
            let incarnation = self.fabrics[h.fabric as usize].host_incarnation(h.host as usize);
            self.held.push(Held {
                from: h,
                incarnation,
                event: ev,
            });
        }
        Ok(())
    }

    fn unit(&mut self, i: usize, op: &Op, r: cm_core::Result<()>) -> Checked {
        self.unit_noting(i, op, r, String::new)
    }

    /// [`unit`](Self::unit), with `more` after the answer in the log.
    fn unit_noting(
        &mut self,
        i: usize,
        op: &Op,
        r: cm_core::Result<()>,
        more: impl FnOnce() -> String,
    ) -> Checked {
        self.note(i, op, || format!("{r:?}{}", more()));
        match r {
            Ok(()) => {
                0u8.hash(&mut self.digest);
                Ok(())
            }
            Err(e) => self.check_err(i, op, &e),
        }
    }

    fn step(&mut self, i: usize, op: &Op) -> Checked {
        match *op {
            Op::Call { h, ref call } => self.step_call(i, op, h, call),
            Op::GetCmEvent { h, ch, timeout, ack } => {
                let ch = self.chan(h, ch);
                let r = self.host(h).get_cm_event(ch, timeout);
                self.event_answer(i, op, h, r, ack)
            }
            Op::TryGetCmEvent { h, ch, ack } => {
                let ch = self.chan(h, ch);
                let r = self.host(h).try_get_cm_event(ch);
                self.event_answer(i, op, h, r, ack)
            }
            Op::TakeCmEvent { h, ch } => {
                let ch = self.chan(h, ch);
                // Whether `read` ran: an error after it is the ack's.
                let read = std::cell::Cell::new(false);
                let r = self.host(h).take_cm_event(ch, |ev| {
                    read.set(true);
                    Seen::of(ev)
                });
                self.taken_answer(i, op, h, r, read.get())
            }
            Op::AckHeld { on, n } => {
                if self.held.is_empty() {
                    self.note(i, op, || "no event held".into());
                    return Ok(());
                }
                let k = self.held.len() - 1 - n as usize % self.held.len();
                let held = self.held.remove(k);
                let target = on.unwrap_or(held.from);
                let text = held.event.to_string();
                let r = self.host(target).ack_cm_event(held.event);
                if let Err(CmError::ForeignEvent(back)) = &r {
                    // Refused as another host's: the event comes back and is still held.
                    let event = back.take().expect("a refused event is handed back once");
                    self.held.push(Held { event, ..held });
                }
                let own_and_alive = target == held.from
                    && self.fabrics[target.fabric as usize].host_incarnation(target.host as usize)
                        == held.incarnation;
                if let (Err(e), true) = (&r, own_and_alive) {
                    return fail(
                        Check::GenuineAckRefused,
                        format!("ack refused: {}", crate::stats::error_kind(e)),
                        format!("{op}: acking {text}, retrieved on {target} and never acked, failed: {e:?}"),
                        Some(i),
                    );
                }
                self.unit(i, op, r)
            }
            Op::AckForged {
                h,
                id,
                listen_id,
                event,
                status,
                token,
            } => {
                let id = self.id(h, id);
                let listen = listen_id.map(|l| self.id(h, l));
                let forged = cm_core::backend::cm_event(id, listen, event, status, ConnParam::ZERO, token);
                let text = forged.to_string();
                let r = self.host(h).ack_cm_event(forged);
                if r.is_ok() {
                    self.note(i, op, || "Ok(())".into());
                    return fail(
                        Check::ForgedAckAccepted,
                        "forged event accepted",
                        format!("{op}: {h} accepted the ack of {text}, an event made with cm_core::backend::cm_event"),
                        Some(i),
                    );
                }
                self.unit(i, op, r)
            }
            Op::PollCq { h, id, max, timeout } => {
                let id = self.id(h, id);
                let mut out = Vec::new();
                let r = self.host(h).poll_cq(id, &mut out, max, timeout);
                self.completions(i, op, r, &out, max)
            }
            Op::TryPollCq { h, id, max } => {
                let id = self.id(h, id);
                let mut out = Vec::new();
                let r = self.host(h).try_poll_cq(id, &mut out, max);
                self.completions(i, op, r, &out, max)
            }
            Op::IdMachine { h, id } => {
                let id = self.id(h, id);
                let r = self.host(h).id_machine(id);
                self.note(i, op, || format!("{r:?}"));
                match r {
                    Ok(m) => {
                        format!("{m:?}").hash(&mut self.digest);
                        Ok(())
                    }
                    Err(e) => self.check_err(i, op, &e),
                }
            }
            Op::LiveResources { h } => {
                let live = self.host(h).live_resources();
                self.note(i, op, || format!("{live:?}"));
                live.hash(&mut self.digest);
                self.check_accounting(h.fabric as usize, Some(i))
            }
            Op::Inject { fabric, ref fault } => {
                self.note(i, op, || "done".into());
                self.fabrics[fabric as usize].inject(fault.clone());
                Ok(())
            }
            Op::Advance { fabric, by } => {
                self.note(i, op, || "done".into());
                self.fabrics[fabric as usize].advance(by);
                Ok(())
            }
            Op::RunUntilIdle { fabric } => {
                let t = self.fabrics[fabric as usize].run_until_idle();
                self.note(i, op, || format!("{t:?}"));
                Ok(())
            }
            Op::RegMr { .. }
            | Op::MrInfo { .. }
            | Op::DeregMr { .. }
            | Op::ReadMr { .. }
            | Op::WriteMr { .. }
            | Op::PostSendWr { .. }
            | Op::CreateSrq { .. }
            | Op::DestroySrq { .. }
            | Op::PostSrqRecv { .. }
            | Op::ArmSrqLimit { .. }
            | Op::CreateQpOnSrq { .. }
            | Op::GetAsyncEvent { .. } => self.step_onesided(i, op),
        }
    }

    /// A librdmacm call: its handles looked up on `h`, made there, its answer checked and what
    /// it made (a channel, an id) filed as the host's.
    fn step_call(&mut self, i: usize, op: &Op, h: HostSel, call: &FuzzCall) -> Checked {
        let made = call
            .clone()
            .map_handles(|r| Ok::<_, Infallible>(self.id(h, r)), |r| Ok(self.chan(h, r)));
        let made = match made {
            Ok(made) => made,
            Err(never) => match never {},
        };
        let r = made.invoke_lent(&mut self.host(h));
        match r {
            Ok(Outcome::Channel(ch)) => {
                self.note(i, op, || format!("{:?}", Ok::<_, CmError>(ch)));
                self.learn_tag(h, ch.owner());
                self.chans[h.fabric as usize][h.host as usize].push(ch);
                self.all_chans.push(ch);
                Ok(())
            }
            Ok(Outcome::Id(id)) => {
                self.note(i, op, || format!("{:?}", Ok::<_, CmError>(id)));
                if self.dead_ids.remove(&id) {
                    // A slot's generation wrapped: a stale handle now names a new id.
                    return fail(
                        Check::EventId,
                        "create_id reissued a destroyed handle",
                        format!("{op} gave {id:?}, a handle already used and destroyed"),
                        Some(i),
                    );
                }
                self.learn_tag(h, id.owner());
                self.ids[h.fabric as usize][h.host as usize].push(id);
                self.all_ids.push(id);
                Ok(())
            }
            r => {
                match &r {
                    Ok(Outcome::QpAttr(attr)) => format!("{attr:?}").hash(&mut self.digest),
                    Ok(Outcome::Addr(a)) => a.hash(&mut self.digest),
                    Ok(_) => {
                        if let Invocation::DestroyId { id } = &made {
                            self.dead_ids.insert(*id);
                        }
                    }
                    Err(_) => {}
                }
                self.unit(i, op, r.map(|_| ()))
            }
        }
    }

    fn event_answer(
        &mut self,
        i: usize,
        op: &Op,
        h: HostSel,
        r: cm_core::Result<Option<CmEvent>>,
        ack: bool,
    ) -> Checked {
        self.note(i, op, || match &r {
            Ok(Some(ev)) => format!("Ok({ev})"),
            other => format!("{other:?}"),
        });
        match r {
            Ok(Some(ev)) => self.got_event(i, op, h, ev, ack),
            Ok(None) => {
                1u8.hash(&mut self.digest);
                Ok(())
            }
            Err(e) => self.check_err(i, op, &e),
        }
    }

    /// The answer of `take_cm_event`: the event was acked inside the call, so only the checks
    /// of a retrieved event apply, and an error after `read` ran is the ack of a genuine event
    /// refused.
    fn taken_answer(
        &mut self,
        i: usize,
        op: &Op,
        h: HostSel,
        r: cm_core::Result<Option<Seen>>,
        read: bool,
    ) -> Checked {
        self.note(i, op, || match &r {
            Ok(Some(ev)) => format!("Ok({ev})"),
            other => format!("{other:?}"),
        });
        match r {
            Ok(Some(ev)) => self.check_event(i, op, h, &ev),
            Ok(None) => {
                1u8.hash(&mut self.digest);
                Ok(())
            }
            Err(e) if read => fail(
                Check::GenuineAckRefused,
                "ack inside take_cm_event",
                format!("{op}: the ack of the event it had just read failed: {e:?}"),
                Some(i),
            ),
            Err(e) => self.check_err(i, op, &e),
        }
    }

    fn completions(
        &mut self,
        i: usize,
        op: &Op,
        r: cm_core::Result<usize>,
        out: &[WorkCompletion],
        max: usize,
    ) -> Checked {
        self.note(i, op, || format!("{r:?} {out:?}"));
        match r {
            Ok(n) => {
                if n != out.len() || n > max {
                    return fail(
                        Check::ErrorCall,
                        "poll_cq count",
                        format!("{op} returned {n} but appended {} (max {max})", out.len()),
                        Some(i),
                    );
                }
                for wc in out {
                    (wc.wr_id, wc.status as u32, wc.byte_len).hash(&mut self.digest);
                    (wc.opcode, wc.imm_data, &wc.data).hash(&mut self.digest);
                    self.stats.completion(wc.status, wc.opcode);
                    if let Some(why) = onesided::completion_misfit(wc) {
                        return fail(
                            Check::Completion,
                            why.clone(),
                            format!("{op} gave {wc:?}: {why}"),
                            Some(i),
                        );
                    }
                }
                Ok(())
            }
            Err(e) => self.check_err(i, op, &e),
        }
    }

    fn check_accounting(&self, f: usize, at: Option<usize>) -> Checked {
        let mut sum = LiveResources::default();
        for host in &self.hosts[f] {
            let l = host.live_resources();
            sum.channels += l.channels;
            sum.ids += l.ids;
            sum.qps += l.qps;
            sum.unacked_events += l.unacked_events;
            sum.queued_events += l.queued_events;
            sum.mrs += l.mrs;
            sum.srqs += l.srqs;
        }
        let whole = self.fabrics[f].live_resources();
        if sum != whole {
            return fail(
                Check::LiveAccounting,
                "per-host live_resources differ from the fabric's",
                format!("fabric {f}: hosts add up to {sum:?}, the fabric says {whole:?}"),
                at,
            );
        }
        Ok(())
    }

    /// Acks every held event on its own host, destroys every QP, id and channel, runs every
    /// timer out, and repeats while that brings new events; then nothing may be left alive.
    fn teardown(&mut self) -> Checked {
        for f in 0..2 {
            for round in 0..6 {
                self.fabrics[f].run_until_idle();
                self.release(f)?;
                if round > 0 && self.fabrics[f].live_resources() == LiveResources::default() {
                    break;
                }
            }
            self.fabrics[f].run_until_idle();
            self.check_accounting(f, None)?;
            let live = self.fabrics[f].live_resources();
            if !live.is_clean() || live.queued_events != 0 {
                return fail(
                    Check::Teardown,
                    format!(
                        "left alive:{}{}{}{}{}{}{}",
                        if live.channels > 0 { " channels" } else { "" },
                        if live.ids > 0 { " ids" } else { "" },
                        if live.qps > 0 { " qps" } else { "" },
                        if live.unacked_events > 0 { " unacked" } else { "" },
                        if live.queued_events > 0 { " queued" } else { "" },
                        if live.mrs > 0 { " mrs" } else { "" },
                        if live.srqs > 0 { " srqs" } else { "" },
                    ),
                    format!("fabric {f} after teardown: {live:?}"),
                    None,
                );
            }
        }
        Ok(())
    }

    fn release(&mut self, f: usize) -> Checked {
        let mut held: Vec<Held> = std::mem::take(&mut self.held);
        if self.forget_held {
            // The planted bug: the events are dropped, still counted against their ids.
            held.clear();
        }
        for h in held {
            if h.from.fabric as usize != f {
                self.held.push(h);
                continue;
            }
            let text = h.event.to_string();
            let alive = self.fabrics[f].host_incarnation(h.from.host as usize) == h.incarnation;
            if let (Err(e), true) = (self.host(h.from).ack_cm_event(h.event), alive) {
                return fail(
                    Check::GenuineAckRefused,
                    format!("teardown ack refused: {}", crate::stats::error_kind(&e)),
                    format!(
                        "teardown: acking {text} on {}, where it was retrieved, failed: {e:?}",
                        h.from
                    ),
                    None,
                );
            }
        }
        for host in 0..self.hosts[f].len() {
            let hs = HostSel {
                fabric: f as u8,
                host: host as u8,
            };
            let b = self.host(hs);
            let chans = self.chans[f][host].clone();
            for &ch in &chans {
                // Bounded: a channel holds finitely many events once the timers have run out.
                for _ in 0..100_000 {
                    match b.clone().try_get_cm_event(ch) {
                        Ok(Some(ev)) => {
                            self.got_event(
                                usize::MAX,
                                &Op::TryGetCmEvent {
                                    h: hs,
                                    ch: HandleRef::Own(0),
                                    ack: true,
                                },
                                hs,
                                ev,
                                true,
                            )
                            .map_err(|mut fl| {
                                fl.at = None;
                                fl.detail = format!("teardown: {}", fl.detail);
                                fl
                            })?;
                        }
                        _ => break,
                    }
                }
            }
            let ids = self.ids[f][host].clone();
            for &id in ids.iter().rev() {
                let mut b = b.clone();
                // A QP still in a group cannot be destroyed (`QpInGroups`): leave every group
                // the sequence may have joined first (a group not joined is refused, harmlessly).
                for n in 0..crate::gen::GROUPS.len() {
                    let _ = b.leave_multicast(id, group_addr(n));
                }
                let _ = b.destroy_qp(id);
                if b.destroy_id(id).is_ok() {
                    self.dead_ids.insert(id);
                }
            }
            // After the QPs: a QP keeps its SRQ busy.
            self.release_onesided(f, host, self.keep_regions)?;
            for &ch in &chans {
                let _ = b.clone().destroy_event_channel(ch);
            }
        }
        Ok(())
    }
}

/// Runs the scenario twice and compares the runs; returns the first run's result with a
/// determinism failure when they differ.
pub fn run_checked(scenario: &Scenario) -> RunResult {
    let opts = RunOptions::default();
    let first = run_once(scenario, &opts);
    if first.failure.is_some() {
        return first;
    }
    let second = run_once(scenario, &opts);
    let mut result = first;
    if let Some(f) = second.failure {
        result.failure = Some(Failure {
            detail: format!("the first run passed, the second failed: {}", f.detail),
            ..f
        });
    } else if second.digest != result.digest {
        result.failure = Some(Failure {
            check: Check::Determinism,
            signature: "two runs of one seed differ".into(),
            detail: format!(
                "two runs of seed {} gave different traces or answers ({:016x} then {:016x})",
                scenario.seed, result.digest, second.digest
            ),
            at: None,
        });
    }
    result
}

/// How long each run may take on the wall clock before the watchdog gives up on it.
pub const DEFAULT_WALL_LIMIT: Duration = Duration::from_secs(60);

/// What the checks read of a retrieved event, taken while it is at hand: `take_cm_event` lends
/// the event only to its `read`.
#[derive(Debug)]
struct Seen {
    ty: CmEventType,
    status: i32,
    private_len: usize,
    id: IdHandle,
    listen: Option<IdHandle>,
}

impl Seen {
    fn of(ev: &CmEvent) -> Self {
        Seen {
            ty: ev.event(),
            status: ev.status(),
            private_len: ev.private_data().len(),
            id: ev.id(),
            listen: ev.listen_id(),
        }
    }
}

impl fmt::Display for Seen {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} on {} (status {}, {} bytes of private data",
            self.ty, self.id, self.status, self.private_len
        )?;
        match self.listen {
            Some(l) => write!(f, ", listener {l})"),
            None => write!(f, ")"),
        }
    }
}
