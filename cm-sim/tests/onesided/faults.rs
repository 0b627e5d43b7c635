//! Faults: partitions, crashes, device removal and lossy links, with one-sided requests or
//! their answers on the wire.

use std::time::Duration;

use cm_core::{Access, CmBackend, ConnParam, QpState, SendOp, SendWr, Sge, WcOpcode, WcStatus};
use cm_sim::Fault;

use crate::support::*;

/// Short ACK timeouts and a known retry count, so that giving up takes a known time.
const ACK: Duration = Duration::from_millis(10);
const RETRIES: u8 = 3;

fn pair(seed: u64) -> Pair {
    let client = ConnParam {
        retry_count: RETRIES,
        ..ConnParam::new()
    };
    connect_with(
        builder(seed).ack_timeout(ACK),
        Setup {
            client,
            ..Setup::default()
        },
    )
}

/// Regions on both sides: the requester's 16 bytes, the responder's 16 and what addresses
/// them.
struct Regions {
    src: cm_core::MrHandle,
    dst: cm_core::MrHandle,
    to: cm_core::MrInfo,
}

fn regions(p: &mut Pair) -> Regions {
    let dst = p.b_mr(16, Access::ALL);
    let to = p.b.mr_info(dst).unwrap();
    let src = p.a_mr(16, Access::LOCAL_WRITE);
    p.a.write_mr(src, 0, b"applied!").unwrap();
    Regions { src, dst, to }
}

/// A WRITE and a READ behind it to the responder's region.
fn write_and_read(p: &mut Pair, r: &Regions) {
    p.post_a(&write(1, remote(&r.to, 0), &[Sge::new(r.src, 0, 8)]));
    p.post_a(&read(2, remote(&r.to, 8), &[Sge::new(r.src, 8, 8)]));
}

/// The requester gave up on its first request after its retries, at `(RETRIES + 1) * ACK`
/// after it left, and flushed the second.
fn assert_gave_up(p: &mut Pair, sent_at: Duration) {
    let wcs = p.poll_a(2);
    assert_eq!(
        summary(&wcs),
        [
            (1, WcOpcode::RdmaWrite, WcStatus::RetryExcErr, 0),
            (2, WcOpcode::RdmaRead, WcStatus::WrFlushErr, 0)
        ]
    );
    let took = p.fabric.now().since_start() - sent_at;
    assert_eq!(took, ACK * (u32::from(RETRIES) + 1), "gave up after every retry");
    assert_eq!(p.qp_a(), Some(QpState::Err));
    let stats = p.fabric.fault_stats();
    assert_eq!(
        (stats.onesided_retries, stats.onesided_retries_exceeded),
        (u64::from(RETRIES), 1)
    );
}

#[test]
fn across_a_partition_a_request_gives_up_after_its_retries_and_the_rest_flush() {
    let mut p = pair(90);
    let r = regions(&mut p);
    p.fabric.inject(Fault::Partition { a: 0, b: 1 });
    let sent_at = p.fabric.now().since_start();
    write_and_read(&mut p, &r);
    assert_gave_up(&mut p, sent_at);
    let lost = p.rdma_steps().iter().filter(|s| s.1 == "lost").count();
    // Each try of each request: the first tries and RETRIES more of both.
    assert_eq!(lost, 2 * (usize::from(RETRIES) + 1));
}

#[test]
fn a_partition_that_heals_in_time_costs_retries_and_nothing_else() {
    let mut p = pair(91);
    let r = regions(&mut p);
    p.fabric.inject(Fault::Partition { a: 0, b: 1 });
    write_and_read(&mut p, &r);
    // The tries at 10 and 20 ms are lost too; the one at 30 ms gets through.
    p.fabric.advance(Duration::from_millis(25));
    p.fabric.inject(Fault::Heal { a: 0, b: 1 });
    let wcs = p.poll_a(2);
    assert!(wcs.iter().all(|w| w.status == WcStatus::Success), "{wcs:?}");
    let stats = p.fabric.fault_stats();
    assert_eq!((stats.onesided_retries, stats.onesided_retries_exceeded), (3, 0));
    assert_eq!(p.qp_a(), Some(QpState::Rts));
}

#[test]
fn a_crashed_responder_answers_nothing_and_the_request_gives_up() {
    let mut p = pair(92);
    let r = regions(&mut p);
    p.fabric.inject(Fault::Crash { host: 0 });
    let sent_at = p.fabric.now().since_start();
    write_and_read(&mut p, &r);
    assert_gave_up(&mut p, sent_at);
}

#[test]
fn a_responder_whose_device_went_answers_nothing_and_the_request_gives_up() {
    let mut p = pair(93);
    let r = regions(&mut p);
    p.fabric.inject(Fault::RemoveDevice { host: 0 });
    let sent_at = p.fabric.now().since_start();
    write_and_read(&mut p, &r);
    assert_gave_up(&mut p, sent_at);
}

#[test]
fn a_write_applied_before_its_answer_was_cut_off_stays_applied() {
    let mut p = pair(94);
    let r = regions(&mut p);
    let sent_at = p.fabric.now().since_start();
    write_and_read(&mut p, &r);
    // The requests left; before they arrive (10-20 us), the link goes: they still land (their
    // fate was the link's when they left), and their answers are lost.
    p.fabric.advance(Duration::from_micros(5));
    p.fabric.inject(Fault::Partition { a: 0, b: 1 });
    assert_gave_up(&mut p, sent_at);
    assert_eq!(read_mr(&p.b, r.dst, 0, 8), b"applied!");
    assert_eq!(p.qp_b(), Some(QpState::Rts), "the responder knows nothing of it");
    let steps = p.rdma_steps();
    assert!(steps.contains(&(0, "executed", "RDMA_WRITE", 0)), "{steps:?}");
    assert!(
        steps.contains(&(0, "replayed", "RDMA_WRITE", 0)) || steps.contains(&(1, "lost", "RDMA_WRITE", 0))
    );
}

#[test]
fn on_a_lossy_link_every_request_completes_once_in_order_and_atomics_are_not_applied_twice() {
    for seed in 95..99 {
        let client = ConnParam {
            retry_count: 7,
            ..ConnParam::new()
        };
        let mut p = connect_with(
            builder(seed).ack_timeout(ACK),
            Setup {
                client,
                ..Setup::default()
            },
        );
        p.fabric.inject(Fault::Loss {
            a: 0,
            b: 1,
            per_mille: 250,
        });
        let counter = p.b_mr(8, Access::ALL);
        let table = p.b_mr(64, Access::ALL);
        let to_counter = p.b.mr_info(counter).unwrap().remote().start();
        let to_table = p.b.mr_info(table).unwrap();
        let local = p.a_mr(8 * 16, Access::LOCAL_WRITE);
        let mut posted = Vec::new();
        for round in 0..4u64 {
            for i in round * 4..round * 4 + 4 {
                let sge = [Sge::new(local, i * 8, 8)];
                let wr = match i % 3 {
                    0 => SendWr::new(
                        i,
                        SendOp::FetchAdd {
                            remote: to_counter,
                            add: 1,
                        },
                        &sge,
                    ),
                    1 => write(i, remote(&to_table, (i % 8) * 8), &sge),
                    _ => read(i, remote(&to_table, (i % 8) * 8), &sge),
                };
                posted.push((i, wr.op.wc_opcode()));
                p.post_a(&wr);
            }
            let wcs = p.poll_a(4);
            let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.opcode)).collect();
            assert_eq!(got, posted[(round * 4) as usize..], "seed {seed}: in order");
            assert!(
                wcs.iter().all(|w| w.status == WcStatus::Success),
                "seed {seed}: {wcs:?}"
            );
        }
        let adds = (0..16).filter(|i| i % 3 == 0).count() as u64;
        assert_eq!(read_mr(&p.b, counter, 0, 8), adds.to_ne_bytes(), "seed {seed}");
        let mut olds: Vec<u64> = (0..16u64)
            .filter(|i| i % 3 == 0)
            .map(|i| u64::from_ne_bytes(read_mr(&p.a, local, i * 8, 8).try_into().unwrap()))
            .collect();
        olds.sort_unstable();
        assert_eq!(olds, (0..adds).collect::<Vec<_>>(), "seed {seed}");
        assert!(
            p.fabric.fault_stats().onesided_retries > 0,
            "seed {seed}: the loss cost retries"
        );
    }
}

#[test]
fn more_losses_in_a_row_than_the_retry_count_give_up() {
    let client = ConnParam {
        retry_count: 0,
        ..ConnParam::new()
    };
    let mut p = connect_with(
        builder(99).ack_timeout(ACK),
        Setup {
            client,
            ..Setup::default()
        },
    );
    let r = regions(&mut p);
    p.fabric.inject(Fault::Loss {
        a: 0,
        b: 1,
        per_mille: 1000,
    });
    let sent_at = p.fabric.now().since_start();
    write_and_read(&mut p, &r);
    let wcs = p.poll_a(2);
    assert_eq!(wcs[0].status, WcStatus::RetryExcErr);
    assert_eq!(p.fabric.now().since_start() - sent_at, ACK, "no retry at all");
}

#[test]
fn a_requester_that_crashes_with_requests_in_flight_leaves_its_peer_alone() {
    let mut p = pair(100);
    let r = regions(&mut p);
    write_and_read(&mut p, &r);
    p.fabric.inject(Fault::Crash { host: 1 });
    p.fabric.run_until_idle();
    assert_eq!(p.qp_b(), Some(QpState::Rts));
    let steps = p.rdma_steps();
    assert_eq!(steps.iter().filter(|s| s.1 == "executed").count(), 2, "{steps:?}");
    assert_eq!(
        steps.iter().filter(|s| s.1 == "completed").count(),
        0,
        "{steps:?}"
    );
}

#[test]
fn destroying_the_requesters_qp_drops_its_requests_and_their_answers() {
    let mut p = pair(101);
    let r = regions(&mut p);
    write_and_read(&mut p, &r);
    p.a.disconnect(p.a_id).unwrap();
    p.a.destroy_qp(p.a_id).unwrap();
    p.fabric.run_until_idle();
    assert_eq!(p.a.live_resources().qps, 0);
    let steps = p.rdma_steps();
    assert_eq!(
        steps.iter().filter(|s| s.1 == "completed").count(),
        0,
        "{steps:?}"
    );
}
