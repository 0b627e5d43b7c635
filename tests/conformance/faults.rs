//! Fault injection, swarm testing and replay (simulator only: a real fabric cannot be told to
//! lose a message, crash a host or remove a device on cue).
//!
//! A small but complete application — a server that accepts and echoes, clients that connect,
//! exchange a message and disconnect, both handling every error event — runs under fault
//! schedules. Invariants: every event is legal for its id's state; every posted work request
//! completes exactly once; no id is left waiting for something that never comes (after the
//! fabric has run out of timers); every event is acked; teardown leaves nothing alive; no panic
//! and no hang (every loop is bounded in steps and virtual time).
//!
//! On failure the run prints `CM_SIM_SEED=<seed>`, the fault schedule, and the path of a file
//! holding the failing run's trace.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{
    ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, IdHandle, IdMachine, IdState, PortSpace,
    QpCaps, QpState, WcStatus,
};
use cm::sim::{Fault, FaultAt, FaultSchedule, MsgKind, SimFabric, SimHost, Swarm, TraceMode};
use proptest::prelude::*;
use proptest::strategy::ValueTree;
use proptest::test_runner::{Config, RngAlgorithm, TestError, TestRng, TestRunner};

const SERVER: u16 = 0;
const CLIENT: u16 = 1;
/// How long the application opens connections and strikes faults.
const HORIZON: Duration = Duration::from_secs(30);
const MESSAGE: &[u8] = b"ping";

/// A bug planted in the application, to show the invariants catch it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Bug {
    None,
    /// Forgets to ack an event on the error path (ADDR_ERROR, ROUTE_ERROR, REJECTED,
    /// UNREACHABLE, CONNECT_ERROR), then destroys the id: librdmacm would hang there.
    ForgetAckOnError,
}

/// The application's record of one id.
struct Tracked {
    host: u16,
    m: IdMachine,
    outstanding: BTreeSet<u64>,
    retries: u32,
    /// Held events the buggy application never acks.
    leaked: Vec<cm::api::CmEvent>,
    /// Client: connected since (virtual time), until it disconnects.
    established_at: Option<Duration>,
}

struct App {
    fabric: SimFabric,
    hosts: [SimHost; 2],
    channels: [Option<ChannelHandle>; 2],
    incarnation: [u32; 2],
    listener: Option<IdHandle>,
    ids: BTreeMap<IdHandle, Tracked>,
    next_wr: u64,
    opened: usize,
    bug: Bug,
}

/// Why a run failed.
#[derive(Debug)]
struct Failure(String);

macro_rules! check {
    ($cond:expr, $($arg:tt)*) => {
        if !$cond {
            return Err(Failure(format!($($arg)*)));
        }
    };
}

fn server_addr() -> SocketAddr {
    "10.0.0.1:7471".parse().unwrap()
}

impl App {
    fn new(seed: u64, schedule: &FaultSchedule, bug: Bug) -> App {
        let fabric = SimFabric::builder()
            .seed(seed)
            .host("10.0.0.1")
            .host("10.0.0.2")
            // Linux 6.12's RoCE packet lifetime: 4.6 s a try, 512 ms of timewait.
            .cm_timeouts(20, 16)
            .faults(schedule.clone())
            .build();
        let hosts = [fabric.host(0), fabric.host(1)];
        App {
            fabric,
            hosts,
            channels: [None, None],
            incarnation: [0, 0],
            listener: None,
            ids: BTreeMap::new(),
            next_wr: 0,
            opened: 0,
            bug,
        }
    }

    fn b(&mut self, host: u16) -> &mut SimHost {
        &mut self.hosts[host as usize]
    }

    /// A process restarts with its host: it forgets everything it had and starts over.
    fn notice_crashes(&mut self) {
        for host in [SERVER, CLIENT] {
            let now = self.fabric.host_incarnation(host as usize);
            if now != self.incarnation[host as usize] {
                self.incarnation[host as usize] = now;
                self.channels[host as usize] = None;
                self.ids.retain(|_, t| t.host != host);
                if host == SERVER {
                    self.listener = None;
                }
            }
        }
    }

    /// (Re)creates what a host's process needs, once the host is up.
    fn start(&mut self, host: u16) -> Result<(), Failure> {
        if self.channels[host as usize].is_some() || !self.fabric.host_is_up(host as usize) {
            return Ok(());
        }
        let ch = match self.b(host).create_event_channel() {
            Ok(ch) => ch,
            Err(CmError::NoRdmaDevice) => return Ok(()),
            Err(e) => return Err(Failure(format!("create_event_channel: {e}"))),
        };
        self.channels[host as usize] = Some(ch);
        if host == SERVER {
            let l = self
                .b(SERVER)
                .create_id(ch, PortSpace::Tcp)
                .map_err(|e| Failure(e.to_string()))?;
            let bound = self.b(SERVER).bind_addr(l, server_addr());
            self.ids.insert(l, Tracked::new(SERVER, PortSpace::Tcp));
            match bound {
                Ok(()) => {
                    self.track_call(l, |m| m.bind_addr(false))?;
                    self.b(SERVER)
                        .listen(l, 0)
                        .map_err(|e| Failure(format!("listen: {e}")))?;
                    self.track_call(l, IdMachine::listen)?;
                    self.listener = Some(l);
                }
                // No device right now (removed): try again later with a new id.
                Err(CmError::Os { .. } | CmError::AddrNotAvailable { .. }) => {
                    self.b(SERVER).destroy_id(l).map_err(|e| Failure(e.to_string()))?;
                    self.ids.remove(&l);
                    self.channels[SERVER as usize] = None;
                    self.b(SERVER)
                        .destroy_event_channel(ch)
                        .map_err(|e| Failure(e.to_string()))?;
                }
                Err(e) => return Err(Failure(format!("bind: {e}"))),
            }
        }
        Ok(())
    }

    fn track_call(
        &mut self,
        id: IdHandle,
        step: impl FnOnce(&IdMachine) -> Result<IdMachine, CmError>,
    ) -> Result<(), Failure> {
        let t = self.ids.get_mut(&id).expect("tracked");
        t.m =
            step(&t.m).map_err(|e| Failure(format!("the application made an illegal call on {id}: {e}")))?;
        Ok(())
    }

    /// Opens one client connection.
    fn open(&mut self) -> Result<(), Failure> {
        let Some(ch) = self.channels[CLIENT as usize] else {
            return Ok(());
        };
        let id = self
            .b(CLIENT)
            .create_id(ch, PortSpace::Tcp)
            .map_err(|e| Failure(e.to_string()))?;
        self.ids.insert(id, Tracked::new(CLIENT, PortSpace::Tcp));
        self.opened += 1;
        self.resolve(id)
    }

    fn resolve(&mut self, id: IdHandle) -> Result<(), Failure> {
        match self
            .b(CLIENT)
            .resolve_addr(id, None, server_addr(), Duration::from_millis(500))
        {
            Ok(()) => self.track_call(id, IdMachine::resolve_addr),
            // The device is gone: the id cannot do anything more.
            Err(CmError::AddrNotAvailable { .. } | CmError::Os { .. }) => self.release(CLIENT, id),
            Err(e) => Err(Failure(format!("resolve_addr: {e}"))),
        }
    }

    fn post(&mut self, host: u16, id: IdHandle, send: bool) -> Result<(), Failure> {
        self.next_wr += 1;
        let wr = self.next_wr;
        // Every fourth client posts a receive too short for the server's message: a local
        // length error that moves both QPs to ERR (an application bug the fabric must survive).
        let len = if host == CLIENT && self.opened % 4 == 0 {
            2
        } else {
            64
        };
        // Every fifth client posts no receive: the server's send finds none, and gives up under
        // a receiver-not-ready retry limit (or is flushed by the disconnect).
        if host == CLIENT && !send && self.opened % 5 == 1 {
            return Ok(());
        }
        let r = if send {
            self.b(host).post_send(id, wr, MESSAGE)
        } else {
            self.b(host).post_recv(id, wr, len)
        };
        match r {
            Ok(()) => {
                self.ids.get_mut(&id).expect("tracked").outstanding.insert(wr);
                Ok(())
            }
            Err(CmError::WrongQpState { .. } | CmError::QueueFull { .. }) => Ok(()),
            Err(e) => Err(Failure(format!("post on {id}: {e}"))),
        }
    }

    /// Collects completions of `id`: each must be one the application posted, once. Returns
    /// how many, and whether one was a receive.
    fn poll(&mut self, host: u16, id: IdHandle, wait: Duration) -> Result<usize, Failure> {
        self.poll_recv(host, id, wait).map(|(n, _)| n)
    }

    fn poll_recv(&mut self, host: u16, id: IdHandle, wait: Duration) -> Result<(usize, bool), Failure> {
        let mut out = Vec::new();
        match self.b(host).poll_cq(id, &mut out, 64, wait) {
            Ok(_) | Err(CmError::NoQp { .. }) => {}
            Err(e) => return Err(Failure(format!("poll_cq on {id}: {e}"))),
        }
        let t = self.ids.get_mut(&id).expect("tracked");
        for wc in &out {
            check!(
                t.outstanding.remove(&wc.wr_id),
                "completion {:?} on {} was never posted or came twice",
                wc,
                id
            );
            check!(
                matches!(
                    wc.status,
                    WcStatus::Success
                        | WcStatus::WrFlushErr
                        | WcStatus::RnrRetryExcErr
                        | WcStatus::RetryExcErr
                        | WcStatus::LocLenErr
                        | WcStatus::RemInvReqErr
                ),
                "unexpected completion {:?}",
                wc
            );
        }
        let received = out.iter().any(|wc| wc.opcode == cm::api::WcOpcode::Recv);
        Ok((out.len(), received))
    }

    /// A connected client waits for the server's message (or a second of virtual time), then
    /// disconnects.
    fn progress_clients(&mut self) -> Result<(), Failure> {
        let now = self.fabric.now().since_start();
        let waiting: Vec<(IdHandle, Duration)> = self
            .ids
            .iter()
            .filter(|(_, t)| t.host == CLIENT)
            .filter_map(|(id, t)| t.established_at.map(|at| (*id, at)))
            .collect();
        for (id, since) in waiting {
            let (_, received) = self.poll_recv(CLIENT, id, Duration::ZERO)?;
            if received || now >= since + Duration::from_secs(1) {
                self.ids.get_mut(&id).expect("tracked").established_at = None;
                self.b(CLIENT)
                    .disconnect(id)
                    .map_err(|e| Failure(format!("disconnect: {e}")))?;
                self.track_call(id, IdMachine::disconnect)?;
            }
        }
        Ok(())
    }

    /// Destroys an id the way a careful application does: QP first (after collecting its
    /// completions), then the id.
    fn release(&mut self, host: u16, id: IdHandle) -> Result<(), Failure> {
        if self
            .b(host)
            .id_machine(id)
            .map(|m| m.qp().is_some())
            .unwrap_or(false)
        {
            self.poll(host, id, Duration::ZERO)?;
            self.b(host)
                .destroy_qp(id)
                .map_err(|e| Failure(format!("destroy_qp {id}: {e}")))?;
            self.ids.get_mut(&id).expect("tracked").outstanding.clear();
        }
        match self.b(host).destroy_id(id) {
            Ok(()) => {
                self.ids.remove(&id);
                Ok(())
            }
            Err(e) => Err(Failure(format!("destroy_id {id}: {e} (an event was not acked)"))),
        }
    }

    /// Retrieves and handles every queued event of `host`; returns how many.
    fn pump(&mut self, host: u16) -> Result<usize, Failure> {
        let Some(ch) = self.channels[host as usize] else {
            return Ok(0);
        };
        let mut n = 0;
        loop {
            let ev = match self.b(host).get_cm_event(ch, Duration::ZERO) {
                Ok(Some(ev)) => ev,
                Ok(None) => return Ok(n),
                Err(e) => return Err(Failure(format!("get_cm_event: {e}"))),
            };
            n += 1;
            let (ty, id, status, counted) = (ev.event(), ev.id(), ev.status(), ev.counted_id());
            let Some(t) = self.ids.get_mut(&counted) else {
                return Err(Failure(format!(
                    "{ty} for {counted}, which the application does not know"
                )));
            };
            t.m =
                t.m.on_event(ty)
                    .map_err(|illegal| Failure(format!("illegal event: {illegal} (status {status})")))?;
            let error_path = matches!(
                ty,
                CmEventType::AddrError
                    | CmEventType::RouteError
                    | CmEventType::Rejected
                    | CmEventType::Unreachable
                    | CmEventType::ConnectError
            );
            if self.bug == Bug::ForgetAckOnError && error_path {
                t.leaked.push(ev);
            } else {
                self.b(host)
                    .ack_cm_event(ev)
                    .map_err(|e| Failure(e.to_string()))?;
                self.ids.get_mut(&counted).expect("tracked").m =
                    self.ids[&counted].m.on_ack().expect("counted");
            }
            self.handle(host, ty, id, status)?;
        }
    }

    fn handle(&mut self, host: u16, ty: CmEventType, id: IdHandle, status: i32) -> Result<(), Failure> {
        use CmEventType::*;
        match (host, ty) {
            (SERVER, ConnectRequest) => {
                self.ids.insert(id, Tracked::new_child(SERVER));
                match self.b(SERVER).create_qp(id, QpCaps::new()) {
                    Ok(_) => self.track_call(id, IdMachine::create_qp)?,
                    Err(_) => return self.release(SERVER, id),
                }
                self.post(SERVER, id, false)?;
                match self.b(SERVER).accept(id, &ConnParam::new()) {
                    Ok(()) => self.track_call(id, |m| m.accept(0))?,
                    Err(CmError::Os { .. }) => self.release(SERVER, id)?,
                    Err(e) => return Err(Failure(format!("accept: {e}"))),
                }
            }
            (SERVER, Established) => self.post(SERVER, id, true)?,
            (_, Disconnected) => {
                self.b(host)
                    .disconnect(id)
                    .map_err(|e| Failure(format!("disconnect: {e}")))?;
                self.track_call(id, IdMachine::disconnect)?;
                self.release(host, id)?;
            }
            (CLIENT, AddrResolved) => {
                self.b(CLIENT)
                    .resolve_route(id, Duration::from_millis(500))
                    .map_err(|e| Failure(e.to_string()))?;
                self.track_call(id, IdMachine::resolve_route)?;
            }
            (CLIENT, AddrError) | (CLIENT, RouteError) if self.ids[&id].retries < 2 => {
                self.ids.get_mut(&id).expect("tracked").retries += 1;
                if ty == AddrError {
                    self.resolve(id)?;
                } else {
                    self.b(CLIENT)
                        .resolve_route(id, Duration::from_millis(500))
                        .map_err(|e| Failure(e.to_string()))?;
                    self.track_call(id, IdMachine::resolve_route)?;
                }
            }
            (CLIENT, RouteResolved) => {
                match self.b(CLIENT).create_qp(id, QpCaps::new()) {
                    Ok(_) => self.track_call(id, IdMachine::create_qp)?,
                    Err(_) => return self.release(CLIENT, id),
                }
                self.post(CLIENT, id, false)?;
                self.b(CLIENT)
                    .connect(id, &ConnParam::new())
                    .map_err(|e| Failure(format!("connect: {e}")))?;
                self.track_call(id, |m| m.connect(0))?;
            }
            (CLIENT, Established) => {
                self.post(CLIENT, id, true)?;
                self.ids.get_mut(&id).expect("tracked").established_at =
                    Some(self.fabric.now().since_start());
            }
            (_, DeviceRemoval) | (_, AddrError | RouteError | Rejected | Unreachable | ConnectError) => {
                if self.listener == Some(id) {
                    self.listener = None;
                }
                self.release(host, id)?;
            }
            (_, TimewaitExit | AddrChange | ConnectResponse) => {}
            (h, other) => {
                return Err(Failure(format!(
                    "host {h} got an unexpected {other} (status {status})"
                )))
            }
        }
        Ok(())
    }

    /// Runs the application until `HORIZON`, then lets every timer run out, then checks that
    /// nothing is stuck, tears down and checks that nothing is left.
    fn run(&mut self, connections: usize) -> Result<(), Failure> {
        let mut steps = 0u64;
        let stagger = HORIZON / (connections as u32 + 1);
        while self.fabric.now().since_start() < HORIZON {
            steps += 1;
            check!(
                steps < 1_000_000,
                "no progress: the application loop ran a million times"
            );
            self.notice_crashes();
            self.start(SERVER)?;
            self.start(CLIENT)?;
            let due = (self.fabric.now().since_start().as_nanos() / stagger.as_nanos().max(1)) as usize;
            while self.opened < connections.min(due) && self.channels[CLIENT as usize].is_some() {
                self.open()?;
            }
            let n = self.pump(SERVER)? + self.pump(CLIENT)?;
            self.progress_clients()?;
            if n == 0 {
                self.fabric.advance(Duration::from_millis(5));
            }
        }
        // Quiesce: every operation started must end (an event, or a timeout's event).
        for _ in 0..10_000 {
            self.notice_crashes();
            self.progress_clients()?;
            let n = self.pump(SERVER)? + self.pump(CLIENT)?;
            if n == 0 {
                let before = self.fabric.now();
                self.fabric.run_until_idle();
                self.notice_crashes();
                if self.pump(SERVER)? + self.pump(CLIENT)? == 0 && self.fabric.now() == before {
                    break;
                }
            }
        }
        for (id, t) in &self.ids {
            let waiting = match t.m.state() {
                IdState::AddrQuery | IdState::RouteQuery => true,
                IdState::Connect => matches!(
                    t.m.phase(),
                    cm::api::ConnPhase::Connecting | cm::api::ConnPhase::Accepted
                ),
                _ => false,
            };
            check!(
                !waiting,
                "{id} is still waiting in {} ({:?}) after every timer ran out",
                t.m.state(),
                t.m.phase()
            );
        }
        // Every posted work request on a QP in ERR has completed.
        let with_qp: Vec<(IdHandle, u16)> = self.ids.iter().map(|(id, t)| (*id, t.host)).collect();
        for (id, host) in with_qp {
            if self.b(host).id_machine(id).ok().and_then(|m| m.qp()) == Some(QpState::Err) {
                self.poll(host, id, Duration::from_secs(1))?;
                let left = &self.ids[&id].outstanding;
                check!(
                    left.is_empty(),
                    "{id}: posted work requests {left:?} never completed on a QP in ERR"
                );
            }
        }
        // Every event acked: what librdmacm's destroy would hang on.
        for host in [SERVER, CLIENT] {
            let live = self.b(host).live_resources();
            check!(
                live.unacked_events == 0,
                "host {host} holds {} event(s) retrieved and never acked",
                live.unacked_events
            );
        }
        // Teardown.
        let ids: Vec<(IdHandle, u16)> = self.ids.iter().map(|(id, t)| (*id, t.host)).collect();
        for (id, host) in ids {
            self.release(host, id)?;
        }
        for host in [SERVER, CLIENT] {
            if let Some(ch) = self.channels[host as usize].take() {
                self.b(host)
                    .destroy_event_channel(ch)
                    .map_err(|e| Failure(format!("destroy_event_channel: {e}")))?;
            }
        }
        let live = self.fabric.live_resources();
        check!(live.is_clean(), "teardown left {live:?}");
        Ok(())
    }
}

impl Tracked {
    fn new(host: u16, ps: PortSpace) -> Self {
        Tracked {
            host,
            m: IdMachine::new(ps),
            outstanding: BTreeSet::new(),
            retries: 0,
            leaked: Vec::new(),
            established_at: None,
        }
    }

    fn new_child(host: u16) -> Self {
        Tracked {
            m: IdMachine::new_child(PortSpace::Tcp),
            ..Tracked::new(host, PortSpace::Tcp)
        }
    }
}

/// Runs the application; on failure prints the seed and schedule, writes the trace to a file
/// and says where.
fn run_app(seed: u64, schedule: &FaultSchedule, connections: usize, bug: Bug) -> Result<SimFabric, String> {
    let mut app = App::new(seed, schedule, bug);
    let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| app.run(connections)));
    let why = match result {
        Ok(Ok(())) => return Ok(app.fabric),
        Ok(Err(Failure(why))) => why,
        Err(panic) => format!(
            "panicked: {}",
            panic.downcast_ref::<String>().cloned().unwrap_or_else(|| {
                panic
                    .downcast_ref::<&str>()
                    .map(|s| s.to_string())
                    .unwrap_or_default()
            })
        ),
    };
    let trace = app
        .fabric
        .write_trace_file(&format!("faults-{seed}"))
        .map_err(|e| e.to_string())?;
    Err(format!(
        "{why}\n  CM_SIM_SEED={seed}\n  faults: {schedule}\n  trace written to {}",
        trace.display()
    ))
}

fn fault() -> impl Strategy<Value = Fault> {
    let host = 0u16..2;
    prop_oneof![
        Just(Fault::Partition { a: 0, b: 1 }),
        Just(Fault::Heal { a: 0, b: 1 }),
        (1u16..=1000).prop_map(|per_mille| Fault::Loss {
            a: 0,
            b: 1,
            per_mille
        }),
        (0u64..5_000).prop_map(|us| Fault::Delay {
            a: 0,
            b: 1,
            min: Duration::ZERO,
            max: Duration::from_micros(us)
        }),
        host.clone().prop_map(|host| Fault::Crash { host }),
        host.clone().prop_map(|host| Fault::Restart { host }),
        host.clone().prop_map(|host| Fault::RemoveDevice { host }),
        host.clone().prop_map(|host| Fault::RestoreDevice { host }),
        host.clone().prop_map(|host| Fault::AddrChange { host }),
        (
            host.clone(),
            prop::sample::select(vec![-110, -101, -113]),
            1u32..4
        )
            .prop_map(|(host, status, count)| Fault::FailAddrResolution { host, status, count }),
        (host.clone(), 1u32..4).prop_map(|(host, count)| Fault::FailRouteResolution {
            host,
            status: -110,
            count
        }),
        (host.clone(), 0u32..3).prop_map(|(host, backlog)| Fault::Backlog { host, backlog }),
        (host.clone(), 0u8..7).prop_map(|(host, retries)| Fault::RnrRetries { host, retries }),
        (
            host,
            prop::sample::select(MsgKind::ALL.to_vec()),
            0u32..3,
            prop::sample::select(vec![1, 2, u32::MAX])
        )
            .prop_map(|(from, msg, skip, count)| Fault::Drop {
                from,
                to: 1 - from,
                msg,
                skip,
                count
            }),
    ]
}

fn schedule() -> impl Strategy<Value = FaultSchedule> {
    prop::collection::vec((0u64..HORIZON.as_millis() as u64, fault()), 0..6).prop_map(|faults| {
        FaultSchedule {
            faults: faults
                .into_iter()
                .map(|(ms, fault)| FaultAt {
                    at: Duration::from_millis(ms),
                    fault,
                })
                .collect(),
        }
    })
}

fn config(cases: u32) -> Config {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

proptest! {
    #![proptest_config(config(256))]

    /// Generated fault schedules: the invariants hold under any of them.
    #[test]
    fn the_application_survives_generated_fault_schedules(seed in any::<u64>(), schedule in schedule(), connections in 1usize..8) {
        if let Err(report) = run_app(seed, &schedule, connections, Bug::None) {
            return Err(TestCaseError::fail(report));
        }
    }
}

/// Swarm mode: a seed alone picks which faults are on and their rates; the configuration is
/// printed so the seed reproduces it.
#[test]
fn swarm_seeds_keep_the_invariants() {
    let seeds: u64 = std::env::var("CM_SIM_SWARM_SEEDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(64);
    for seed in 0..seeds {
        let swarm = Swarm::from_seed(seed, 2, HORIZON);
        println!("{swarm}");
        if let Err(report) = run_app(seed, &swarm.schedule, 6, Bug::None) {
            panic!("swarm seed {seed} failed: {report}\n{swarm}");
        }
    }
}

/// The planted bug — an application that forgets to ack events on its error path — is found,
/// and shrinks to a single fault.
#[test]
fn a_planted_forgotten_ack_is_found_and_shrunk() {
    // A fixed generator: the search, and so what it shrinks to, is the same on every run.
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 256,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    let result = runner.run(&(any::<u64>(), schedule()), |(seed, schedule)| {
        run_app(seed, &schedule, 3, Bug::ForgetAckOnError)
            .map(|_| ())
            .map_err(TestCaseError::fail)
    });
    match result {
        Err(TestError::Fail(report, (seed, minimal))) => {
            let report = report.message().to_string();
            assert!(report.contains(&format!("CM_SIM_SEED={seed}")), "{report}");
            assert!(report.contains("trace written to"), "{report}");
            assert!(
                report.contains("never acked") || report.contains("not acked"),
                "{report}"
            );
            assert_eq!(minimal.faults.len(), 1, "shrinks to one fault: {minimal}");
            // The same bug on a healthy fabric goes unnoticed: the faults are what find it.
            assert!(run_app(seed, &FaultSchedule::new(), 3, Bug::ForgetAckOnError).is_ok());
        }
        other => panic!("the planted bug was not found: {other:?}"),
    }
}

/// Every fault path fired across a run of generated schedules and swarm seeds.
#[test]
fn every_fault_path_fires() {
    let mut fired: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut record = |fabric: &SimFabric| {
        for (path, n) in fabric.fault_stats().paths() {
            *fired.entry(path).or_default() += n;
        }
    };
    for seed in 0..48 {
        let swarm = Swarm::from_seed(seed, 2, HORIZON);
        record(&run_app(seed, &swarm.schedule, 6, Bug::None).expect("swarm run"));
    }
    let mut runner = TestRunner::new_with_rng(
        Config {
            cases: 96,
            failure_persistence: None,
            ..Config::default()
        },
        TestRng::deterministic_rng(RngAlgorithm::ChaCha),
    );
    for _ in 0..96 {
        let (seed, schedule) = (any::<u64>(), schedule())
            .new_tree(&mut runner)
            .expect("generate")
            .current();
        record(&run_app(seed, &schedule, 6, Bug::None).expect("generated run"));
    }
    let missing: Vec<&&str> = fired.iter().filter(|(_, n)| **n == 0).map(|(p, _)| p).collect();
    assert!(
        missing.is_empty(),
        "fault paths that never fired: {missing:?} (all: {fired:?})"
    );
}

/// Selected seeds run twice give the same trace, faults and all.
#[test]
fn fault_runs_are_deterministic() {
    for seed in [1, 2, 3, 42, 1234] {
        let swarm = Swarm::from_seed(seed, 2, HORIZON);
        let a = run_app(seed, &swarm.schedule, 6, Bug::None).expect("run");
        let b = run_app(seed, &swarm.schedule, 6, Bug::None).expect("run");
        assert_eq!(a.trace_hash(), b.trace_hash(), "seed {seed}");
        assert_eq!(a.trace_lines(), b.trace_lines());
    }
}

/// The trace renders as a Mermaid sequence diagram: who sent what, when, what was lost.
#[test]
fn the_trace_renders_as_a_sequence_diagram() {
    let schedule = FaultSchedule::new().with(
        Duration::ZERO,
        Fault::Loss {
            a: 0,
            b: 1,
            per_mille: 300,
        },
    );
    let fabric = run_app(5, &schedule, 2, Bug::None).expect("run");
    let mermaid = fabric.trace_mermaid();
    assert!(mermaid.starts_with("sequenceDiagram\n"), "{mermaid}");
    assert!(mermaid.contains("participant h0 as 10.0.0.1"));
    assert!(mermaid.contains("participant h1 as 10.0.0.2"));
    assert!(mermaid.contains("h1->>h0: REQ"), "{mermaid}");
    assert!(mermaid.contains("RDMA_CM_EVENT_ESTABLISHED"));
    assert!(
        mermaid.contains("-x"),
        "lost messages are drawn as lost: {mermaid}"
    );
}

/// Partition: a request sent across it is sent again and, when the partition never heals,
/// ends in UNREACHABLE -ETIMEDOUT.
#[test]
fn a_partition_makes_requests_unreachable() {
    let fabric = SimFabric::builder()
        .seed(3)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .trace(TraceMode::Full)
        .build();
    let (mut server, mut client) = (fabric.host(0), fabric.host(1));
    let sch = server.create_event_channel().unwrap();
    let l = server.create_id(sch, PortSpace::Tcp).unwrap();
    server.bind_addr(l, server_addr()).unwrap();
    server.listen(l, 0).unwrap();
    let cch = client.create_event_channel().unwrap();
    let id = client.create_id(cch, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(id, None, server_addr(), Duration::from_secs(1))
        .unwrap();
    let ev = client.get_cm_event(cch, Duration::from_secs(1)).unwrap().unwrap();
    client.ack_cm_event(ev).unwrap();
    client.resolve_route(id, Duration::from_secs(1)).unwrap();
    let ev = client.get_cm_event(cch, Duration::from_secs(1)).unwrap().unwrap();
    client.ack_cm_event(ev).unwrap();
    client.create_qp(id, QpCaps::new()).unwrap();
    fabric.inject(Fault::Partition { a: 0, b: 1 });
    let start = fabric.now();
    client.connect(id, &ConnParam::new()).unwrap();
    let ev = client
        .get_cm_event(cch, Duration::from_secs(600))
        .unwrap()
        .expect("UNREACHABLE");
    assert_eq!((ev.event(), ev.status()), (CmEventType::Unreachable, -110));
    client.ack_cm_event(ev).unwrap();
    let waited = fabric.now().since_start() - start.since_start();
    assert_eq!(waited, fabric.config().req_timeout(), "16 tries, 6.144 s apart");
    assert!(
        server.get_cm_event(sch, Duration::ZERO).unwrap().is_none(),
        "nothing crossed the partition"
    );
    let stats = fabric.fault_stats();
    assert_eq!(
        stats.messages_lost,
        u64::from(fabric.config().cm_retries) + 1,
        "every try of the REQ was lost"
    );
    assert!(fabric.trace_lines().iter().any(|l| l.contains("lost REQ")));
}
