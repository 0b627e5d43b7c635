//! `SimFabric::step` is the fused form of `next_deadline` then `advance_to`: driven by one or the
//! other through the same connections, losses, crashes and restarts, two fabrics of one seed
//! must be at the same time with the same trace after every step.

use std::net::SocketAddr;
use std::time::Duration;

use cm_core::{CmBackend, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps};
use cm_sim::{Fault, FaultSchedule, SimFabric, SimTime, Step};

const SERVER: &str = "10.0.0.1:7471";
const CLIENTS: usize = 3;
/// Connections each client makes, one after the other.
const ROUNDS: usize = 6;

fn fabric(seed: u64) -> SimFabric {
    let faults = FaultSchedule::new()
        .with(
            Duration::ZERO,
            Fault::Loss {
                a: 0,
                b: 1,
                per_mille: 300,
            },
        )
        .with(Duration::from_millis(3), Fault::Crash { host: 0 })
        .with(Duration::from_millis(4), Fault::Restart { host: 0 });
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .host("10.0.0.3")
        .host("10.0.0.4")
        .latency(Duration::from_micros(1)..=Duration::from_micros(40))
        .faults(faults)
        .build()
}

/// A client's state: its channel and, while it has one, its id.
struct Client {
    host: usize,
    ch: cm_core::ChannelHandle,
    id: Option<IdHandle>,
    rounds: usize,
}

/// Reacts to every event the fabric has queued, the same way on every fabric (errors are
/// ignored: a crashed server fails calls, a lost message fails a connection, and the client
/// starts its next round either way).
struct App {
    fabric: SimFabric,
    server_ch: Option<cm_core::ChannelHandle>,
    server_incarnation: u32,
    clients: Vec<Client>,
}

impl App {
    fn new(fabric: SimFabric) -> Self {
        let mut app = App {
            fabric: fabric.clone(),
            server_ch: None,
            server_incarnation: u32::MAX,
            clients: Vec::new(),
        };
        for host in 1..=CLIENTS {
            let ch = fabric.host(host).create_event_channel().expect("channel");
            let mut c = Client {
                host,
                ch,
                id: None,
                rounds: 0,
            };
            Self::start_round(&fabric, &mut c);
            app.clients.push(c);
        }
        app
    }

    fn start_round(fabric: &SimFabric, c: &mut Client) {
        if c.rounds == ROUNDS {
            return;
        }
        c.rounds += 1;
        let mut h = fabric.host(c.host);
        let id = h.create_id(c.ch, PortSpace::Tcp).expect("create_id");
        c.id = Some(id);
        let dst: SocketAddr = SERVER.parse().expect("address");
        if h.resolve_addr(id, None, dst, Duration::from_millis(2)).is_err() {
            Self::end_round(fabric, c);
        }
    }

    fn end_round(fabric: &SimFabric, c: &mut Client) {
        if let Some(id) = c.id.take() {
            let mut h = fabric.host(c.host);
            let _ = h.destroy_qp(id);
            let _ = h.destroy_id(id);
        }
        Self::start_round(fabric, c);
    }

    /// A server that listens again after each restart.
    fn serve(&mut self) {
        let f = self.fabric.clone();
        if !f.host_is_up(0) || f.host_incarnation(0) == self.server_incarnation {
            return;
        }
        self.server_incarnation = f.host_incarnation(0);
        let mut h = f.host(0);
        let ch = h.create_event_channel().expect("channel");
        let listener = h.create_id(ch, PortSpace::Tcp).expect("create_id");
        h.bind_addr(listener, SERVER.parse().expect("address"))
            .expect("bind");
        h.listen(listener, 16).expect("listen");
        self.server_ch = Some(ch);
    }

    fn react(&mut self) {
        self.serve();
        let f = self.fabric.clone();
        if let Some(ch) = self.server_ch {
            let mut h = f.host(0);
            while let Ok(Some(ev)) = h.try_get_cm_event(ch) {
                let (kind, id) = (ev.event(), ev.id());
                let _ = h.ack_cm_event(ev);
                match kind {
                    CmEventType::ConnectRequest => {
                        let accepted =
                            h.create_qp(id, QpCaps::new()).is_ok() && h.accept(id, &ConnParam::new()).is_ok();
                        if !accepted {
                            let _ = h.destroy_qp(id);
                            let _ = h.destroy_id(id);
                        }
                    }
                    CmEventType::Disconnected => {
                        let _ = h.disconnect(id);
                        let _ = h.destroy_qp(id);
                        let _ = h.destroy_id(id);
                    }
                    _ => {}
                }
            }
        }
        for c in &mut self.clients {
            let mut h = f.host(c.host);
            while let Ok(Some(ev)) = h.try_get_cm_event(c.ch) {
                let kind = ev.event();
                let _ = h.ack_cm_event(ev);
                let Some(id) = c.id else { continue };
                let ok = match kind {
                    CmEventType::AddrResolved => h.resolve_route(id, Duration::from_millis(2)).is_ok(),
                    CmEventType::RouteResolved => {
                        h.create_qp(id, QpCaps::new()).is_ok() && h.connect(id, &ConnParam::new()).is_ok()
                    }
                    CmEventType::Established => h.disconnect(id).is_ok(),
                    // Disconnected, or the connection failed: this round is over.
                    _ => false,
                };
                if !ok {
                    Self::end_round(&f, c);
                }
            }
        }
    }
}

/// An executor's own timer now and then, as the async layer's sleeps are: every third step
/// while the fabric has something scheduled, one 5 µs after the current time.
fn wake_at(fabric: &SimFabric, step: usize) -> Option<SimTime> {
    (step % 3 == 0 && fabric.next_deadline().is_some()).then(|| fabric.now() + Duration::from_micros(5))
}

#[test]
fn step_runs_and_reports_what_next_deadline_then_advance_to_do() {
    for seed in [1, 2, 3] {
        let (fused, reference) = (fabric(seed), fabric(seed));
        let (mut a, mut b) = (App::new(fused.clone()), App::new(reference.clone()));
        let limit = SimTime::from_nanos(Duration::from_secs(3600).as_nanos() as u64);
        let mut steps = 0;
        loop {
            a.react();
            b.react();
            let wake = wake_at(&fused, steps);
            assert_eq!(wake, wake_at(&reference, steps));
            let step = fused.step(wake, limit);
            let next = match (reference.next_deadline(), wake) {
                (Some(x), Some(y)) => Some(x.min(y)),
                (x, y) => x.or(y),
            };
            match step {
                Step::Moved {
                    now,
                    crashes_and_restarts,
                } => {
                    let next = next.expect("the reference has somewhere to go");
                    reference.advance_to(next);
                    assert_eq!(now, reference.now(), "seed {seed}, step {steps}");
                    assert_eq!(fused.events_queued(), reference.events_queued());
                    assert_eq!(crashes_and_restarts, reference.crashes_and_restarts());
                    assert_eq!(
                        fused.trace_hash(),
                        reference.trace_hash(),
                        "seed {seed}, step {steps}"
                    );
                }
                Step::Idle { now } => {
                    assert_eq!(next, None, "seed {seed}: the reference has more to run");
                    assert_eq!(now, reference.now());
                    break;
                }
                Step::PastLimit { next: n } => panic!("seed {seed}: an hour of virtual time passed ({n})"),
            }
            steps += 1;
            assert!(steps < 1_000_000, "seed {seed}: no end in sight");
        }
        assert_eq!(
            fused.crashes_and_restarts(),
            (1, 1),
            "seed {seed}: the crash and restart struck"
        );
        assert!(
            a.clients.iter().all(|c| c.rounds == ROUNDS && c.id.is_none()),
            "seed {seed}: every client made its rounds"
        );
        assert_eq!(fused.trace_hash(), reference.trace_hash());
    }
}

#[test]
fn step_stops_at_the_limit_without_running_anything() {
    let f = fabric(4);
    let mut app = App::new(f.clone());
    app.react();
    let before = (f.now(), f.trace_hash(), f.events_queued());
    let next = f.next_deadline().expect("resolutions are scheduled");
    let limit = SimTime::from_nanos(next.as_nanos() - 1);
    assert_eq!(f.step(None, limit), Step::PastLimit { next });
    assert_eq!(f.step(Some(next), limit), Step::PastLimit { next });
    assert_eq!((f.now(), f.trace_hash(), f.events_queued()), before);
}
