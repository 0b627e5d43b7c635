//! With the `tracing` feature, calls, events and faults each leave a record
//! (`cargo test -p cm-sim --features tracing`; without the feature this file is empty).
#![cfg(feature = "tracing")]

use std::fmt::{self, Write as _};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_core::{CmBackend, PortSpace};
use cm_sim::{Fault, SimFabric};
use tracing::field::{Field, Visit};
use tracing::span::{Attributes, Id, Record};
use tracing::{Event, Metadata, Subscriber};

/// Keeps every span and event as one line: `span NAME k=v ...` or `event LEVEL k=v ...`.
#[derive(Clone, Default)]
struct Capture {
    lines: Arc<Mutex<Vec<String>>>,
    next_id: Arc<AtomicU64>,
}

struct Line(String);

impl Visit for Line {
    fn record_debug(&mut self, field: &Field, value: &dyn fmt::Debug) {
        let _ = write!(self.0, " {}={:?}", field.name(), value);
    }
}

impl Capture {
    fn push(&self, line: Line) {
        self.lines.lock().expect("capture lock").push(line.0);
    }

    fn lines(&self) -> Vec<String> {
        self.lines.lock().expect("capture lock").clone()
    }
}

impl Subscriber for Capture {
    fn enabled(&self, _: &Metadata<'_>) -> bool {
        true
    }
    fn new_span(&self, span: &Attributes<'_>) -> Id {
        let mut line = Line(format!("span {}", span.metadata().name()));
        span.record(&mut line);
        self.push(line);
        Id::from_u64(self.next_id.fetch_add(1, Ordering::Relaxed) + 1)
    }
    fn record(&self, _: &Id, values: &Record<'_>) {
        let mut line = Line("record".into());
        values.record(&mut line);
        self.push(line);
    }
    fn record_follows_from(&self, _: &Id, _: &Id) {}
    fn event(&self, event: &Event<'_>) {
        let mut line = Line(format!("event {}", event.metadata().level()));
        event.record(&mut line);
        self.push(line);
    }
    fn enter(&self, _: &Id) {}
    fn exit(&self, _: &Id) {}
}

fn captured(run: impl FnOnce()) -> Vec<String> {
    let capture = Capture::default();
    tracing::subscriber::with_default(capture.clone(), run);
    capture.lines()
}

fn has(lines: &[String], needles: &[&str]) -> bool {
    lines.iter().any(|l| needles.iter().all(|n| l.contains(n)))
}

#[test]
fn a_call_is_recorded_with_its_arguments_host_and_result() {
    let fabric = SimFabric::builder()
        .seed(1)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build();
    let mut host = fabric.host(1);
    let lines = captured(|| {
        let ch = host.create_event_channel().expect("channel");
        host.create_id(ch, PortSpace::Tcp).expect("id");
        // A refused call is recorded with its error.
        let _ = host.destroy_event_channel(ch);
    });
    assert!(has(&lines, &["span create_id", "ps=Tcp", "host=1"]), "{lines:#?}");
    assert!(has(&lines, &["event DEBUG", "return=Ok("]), "{lines:#?}");
    assert!(
        has(&lines, &["span destroy_event_channel", "host=1"]),
        "{lines:#?}"
    );
    assert!(has(&lines, &["event DEBUG", "return=Err("]), "{lines:#?}");
}

#[test]
fn a_retrieved_event_is_recorded_with_its_id_type_and_status() {
    let fabric = SimFabric::builder()
        .seed(2)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build();
    let mut client = fabric.host(1);
    let lines = captured(|| {
        let ch = client.create_event_channel().expect("channel");
        let id = client.create_id(ch, PortSpace::Tcp).expect("id");
        let t = Duration::from_secs(2);
        client
            .resolve_addr(id, None, "10.0.0.1:7471".parse().expect("addr"), t)
            .expect("resolve");
        let ev = client.get_cm_event(ch, t).expect("wait").expect("an event");
        client.ack_cm_event(ev).expect("ack");
    });
    assert!(
        has(&lines, &["message=event", "ADDR_RESOLVED", "status=0", "host=1"]),
        "{lines:#?}"
    );
}

#[test]
fn a_fault_is_recorded_when_it_strikes_injected_or_scheduled() {
    let lines = captured(|| {
        let faults =
            cm_sim::FaultSchedule::new().with(Duration::from_millis(1), Fault::AddrChange { host: 0 });
        let fabric = SimFabric::builder()
            .seed(3)
            .host("10.0.0.1")
            .host("10.0.0.2")
            .faults(faults)
            .build();
        fabric.inject(Fault::Crash { host: 1 });
        // Waiting moves virtual time past the scheduled fault.
        let mut server = fabric.host(0);
        let ch = server.create_event_channel().expect("channel");
        let _ = server.get_cm_event(ch, Duration::from_millis(5)).expect("wait");
    });
    assert!(
        has(
            &lines,
            &["event INFO", "message=fault", "fault=\"crash\"", "host=1"]
        ),
        "{lines:#?}"
    );
    assert!(
        has(
            &lines,
            &["event INFO", "message=fault", "fault=\"addr-change\"", "host=0"]
        ),
        "{lines:#?}"
    );
}
