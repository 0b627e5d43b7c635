//! The trace as a Mermaid sequence diagram: one participant per host, an arrow per CM message
//! and per one-sided request sent (a cross for a lost one), a note per event, per fault and per
//! other step of a one-sided request, with virtual times.
//!
//! Paste the text into any Mermaid renderer (GitHub renders ```` ```mermaid ```` blocks) to see
//! who sent what and when.

use std::fmt::Write;
use std::net::IpAddr;

use crate::trace::{RdmaStep, TraceRecord, TraceWhat};

/// Renders `records` of a fabric whose hosts have the first addresses `hosts`.
pub(crate) fn render(records: &[TraceRecord], hosts: &[IpAddr]) -> String {
    let mut out = String::from("sequenceDiagram\n");
    for (i, ip) in hosts.iter().enumerate() {
        let _ = writeln!(out, "    participant h{i} as {ip}");
    }
    let id = |r: &TraceRecord| {
        if r.id == u32::MAX {
            "-".to_string()
        } else {
            format!("id#{}", r.id)
        }
    };
    for r in records {
        let t = r.time.since_start().as_secs_f64() * 1e3;
        let _ = match r.what {
            TraceWhat::Sent { msg, to } => writeln!(
                out,
                "    h{}->>h{to}: {} {} (t={t:.3} ms)",
                r.host,
                msg.name(),
                id(r)
            ),
            TraceWhat::Lost { msg, to } => writeln!(
                out,
                "    h{}-xh{to}: {} {} lost (t={t:.3} ms)",
                r.host,
                msg.name(),
                id(r)
            ),
            TraceWhat::Event(ev) => {
                writeln!(
                    out,
                    "    Note over h{}: {} {ev} status={} (t={t:.3} ms)",
                    r.host,
                    id(r),
                    r.status
                )
            }
            TraceWhat::Fault(kind) => writeln!(out, "    Note over h{}: fault: {kind} (t={t:.3} ms)", r.host),
            TraceWhat::Rdma {
                op,
                step: step @ (RdmaStep::Sent | RdmaStep::Lost),
                peer,
            } => writeln!(
                out,
                "    h{}{}h{peer}: {} {} (t={t:.3} ms)",
                r.host,
                if step == RdmaStep::Sent { "->>" } else { "-x" },
                op.name(),
                id(r)
            ),
            TraceWhat::Rdma { op, step, .. } => writeln!(
                out,
                "    Note over h{}: {} {} {} status={} (t={t:.3} ms)",
                r.host,
                id(r),
                op.name(),
                step.name(),
                r.status
            ),
        };
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::time::SimTime;
    use crate::trace::MsgKind;
    use cm_core::CmEventType;

    #[test]
    fn messages_events_and_faults_become_diagram_lines() {
        let hosts: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let at = |ns| SimTime::from_nanos(ns);
        let records = [
            TraceRecord {
                time: at(1_000),
                host: 1,
                id: 3,
                what: TraceWhat::Sent {
                    msg: MsgKind::Req,
                    to: 0,
                },
                status: 0,
            },
            TraceRecord {
                time: at(2_000),
                host: 1,
                id: 3,
                what: TraceWhat::Lost {
                    msg: MsgKind::Dreq,
                    to: 0,
                },
                status: 0,
            },
            TraceRecord {
                time: at(3_000),
                host: 0,
                id: 4,
                what: TraceWhat::Event(CmEventType::ConnectRequest),
                status: 0,
            },
            TraceRecord {
                time: at(4_000),
                host: 0,
                id: u32::MAX,
                what: TraceWhat::Fault("crash"),
                status: 0,
            },
        ];
        let rdma = |host, step| TraceRecord {
            time: at(5_000),
            host,
            id: 3,
            what: TraceWhat::Rdma {
                op: crate::trace::RdmaOp::Read,
                step,
                peer: 1 - host,
            },
            status: 0,
        };
        let text = render(&records, &hosts);
        let one_sided = render(
            &[
                rdma(1, RdmaStep::Sent),
                rdma(0, RdmaStep::Lost),
                rdma(1, RdmaStep::Completed),
            ],
            &hosts,
        );
        assert!(
            one_sided.ends_with(
                "    h1->>h0: RDMA_READ id#3 (t=0.005 ms)\n    h0-xh1: RDMA_READ id#3 (t=0.005 ms)\n    \
                 Note over h1: id#3 RDMA_READ completed status=0 (t=0.005 ms)\n"
            ),
            "{one_sided}"
        );
        assert_eq!(
            text,
            "sequenceDiagram\n    participant h0 as 10.0.0.1\n    participant h1 as 10.0.0.2\n    \
             h1->>h0: REQ id#3 (t=0.001 ms)\n    h1-xh0: DREQ id#3 lost (t=0.002 ms)\n    \
             Note over h0: id#4 RDMA_CM_EVENT_CONNECT_REQUEST status=0 (t=0.003 ms)\n    \
             Note over h0: fault: crash (t=0.004 ms)\n"
        );
    }
}
