//! With the `tracing` feature, calls and events each leave a record
//! (`cargo test -p cm-hw --features tracing`; without the feature this file is empty). The event
//! needs an RDMA device and `CM_HW_ADDR`, as the other hardware tests; without them it prints
//! `skipped: ...` and passes.
#![cfg(feature = "tracing")]

use std::fmt::{self, Write as _};
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use cm_core::{CmBackend, CmError, PortSpace};
use cm_hw::HwBackend;
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
fn a_call_is_recorded_with_its_arguments_and_result_device_or_not() {
    let mut hw = HwBackend::new().expect("a backend needs no device");
    let lines = captured(|| {
        // Without a device this is refused, and the refusal is recorded as the result.
        if let Ok(ch) = hw.create_event_channel() {
            let _ = hw.create_id(ch, PortSpace::Tcp);
        }
    });
    assert!(has(&lines, &["span create_event_channel"]), "{lines:#?}");
    assert!(has(&lines, &["event DEBUG", "return="]), "{lines:#?}");
}

#[test]
fn a_retrieved_event_is_recorded_with_its_id_type_and_status() {
    match cm_hw::probe() {
        Ok(()) => {}
        Err(CmError::NoRdmaDevice) => {
            eprintln!("skipped: a_retrieved_event_is_recorded: no RDMA device");
            return;
        }
        Err(e) => panic!("probe: {e}"),
    }
    let Ok(addr) = std::env::var("CM_HW_ADDR") else {
        eprintln!("skipped: a_retrieved_event_is_recorded: set CM_HW_ADDR to the RDMA device's IP address");
        return;
    };
    let dst = SocketAddr::new(addr.parse().expect("CM_HW_ADDR is an IP address"), 7471);
    let mut hw = HwBackend::new().expect("backend");
    let lines = captured(|| {
        let ch = hw.create_event_channel().expect("channel");
        let id = hw.create_id(ch, PortSpace::Tcp).expect("id");
        let t = Duration::from_secs(10);
        hw.resolve_addr(id, None, dst, t).expect("resolve");
        let ev = hw.get_cm_event(ch, t).expect("wait").expect("an event");
        hw.ack_cm_event(ev).expect("ack");
        hw.destroy_id(id).expect("destroy id");
        hw.destroy_event_channel(ch).expect("destroy channel");
    });
    assert!(
        has(&lines, &["message=event", "ADDR_RESOLVED", "status=0"]),
        "{lines:#?}"
    );
}
