//! One-sided RDMA on the simulator only: what needs virtual time (a request and its response
//! each take the data path's latency; a fence waits a round trip), faults (partitions,
//! crashes, lossy links, a deregistration raced against work in flight) and generated
//! operation sequences checked against a model of the peer's memory. The hardware runner does
//! not include this file.

use std::time::Duration;

use cm::api::{
    Access, AsyncEvent, CmBackend, CmEventType, ConnParam, IdHandle, MrHandle, QpCaps, QpState, RemoteAddr,
    SendOp, SendWr, Sge, SrqCaps, WcStatus, WorkCompletion,
};
use cm::sim::{Fault, SimFabric, SimHost};
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

use crate::support::*;

/// The one-way latency of every message and packet in these tests.
const LATENCY: Duration = Duration::from_micros(10);
/// Longer than a request's transport retries: (7 + 1) local ACK timeouts of 2.1 s.
const RETRIES: Duration = Duration::from_secs(60);

/// A two-host bed whose every message takes exactly [`LATENCY`].
fn fixed_bed(seed: u64) -> (SimFabric, Bed<SimHost>) {
    let fabric = SimFabric::builder()
        .seed(seed)
        .latency(LATENCY..=LATENCY)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build();
    let repro = fabric.repro_line();
    let bed = Bed::new(
        fabric.host(0),
        fabric.host(1),
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.99".parse().unwrap(),
        7470,
        repro,
    );
    (fabric, bed)
}

fn now(fabric: &SimFabric) -> Duration {
    fabric.now().since_start()
}

fn region(b: &mut SimHost, id: IdHandle, len: usize, access: Access) -> (MrHandle, RemoteAddr) {
    let mr = b.reg_mr(id, len, access).expect("reg_mr");
    (mr, b.mr_info(mr).unwrap().remote().start())
}

fn u64_at(b: &SimHost, mr: MrHandle, offset: u64) -> u64 {
    let mut v = [0; 8];
    b.read_mr(mr, offset, &mut v).unwrap();
    u64::from_ne_bytes(v)
}

/// Completions of `id` until `n` came or `wait` of virtual time passed.
fn poll_for(b: &mut SimHost, id: IdHandle, n: usize, wait: Duration) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        if b.poll_cq(id, &mut out, n, wait).unwrap() == 0 {
            break;
        }
    }
    out
}

fn statuses(wcs: &[WorkCompletion]) -> Vec<(u64, WcStatus)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.status)).collect()
}

// Virtual time: a READ's response comes a round trip after it was posted.
#[test]
fn a_read_completes_one_round_trip_after_it_is_posted() {
    let (fabric, mut bed) = fixed_bed(1);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (dst, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
    let sge = [Sge::new(dst, 0, 8)];
    let posted = now(&fabric);
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &sge))
        .unwrap();
    let mut out = Vec::new();
    assert_eq!(
        bed.client.try_poll_cq(conn.client.id, &mut out, 1).unwrap(),
        0,
        "not at once"
    );
    let wc = poll_for(&mut bed.client, conn.client.id, 1, WAIT);
    assert_eq!(statuses(&wc), [(1, WcStatus::Success)]);
    assert_eq!(now(&fabric) - posted, 2 * LATENCY);
    bed.client.dereg_mr(dst).unwrap();
    bed.server.dereg_mr(table).unwrap();
    teardown(&mut bed, conn);
}

// Virtual time: requests pipeline; a fenced one waits for the READ before it to complete.
#[test]
fn requests_pipeline_and_a_fence_waits_for_earlier_reads() {
    for fence in [false, true] {
        let (fabric, mut bed) = fixed_bed(2);
        let conn = establish(&mut bed);
        let (table, remote) = region(&mut bed.server, conn.child, 16, Access::ALL);
        let (mine, _) = region(&mut bed.client, conn.client.id, 16, Access::LOCAL_WRITE);
        let (r, w) = ([Sge::new(mine, 0, 8)], [Sge::new(mine, 8, 8)]);
        let posted = now(&fabric);
        bed.client
            .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &r))
            .unwrap();
        let write = SendWr::new(2, SendOp::Write { remote, imm: None }, &w);
        let write = if fence { write.fenced() } else { write };
        bed.client.post_send_wr(conn.client.id, &write).unwrap();
        let got = poll_for(&mut bed.client, conn.client.id, 2, WAIT);
        assert_eq!(statuses(&got), [(1, WcStatus::Success), (2, WcStatus::Success)]);
        let rounds = if fence { 2 } else { 1 };
        assert_eq!(now(&fabric) - posted, rounds * 2 * LATENCY, "fence {fence}");
        bed.client.dereg_mr(mine).unwrap();
        bed.server.dereg_mr(table).unwrap();
        teardown(&mut bed, conn);
    }
}

// Virtual time: a send posted after a WRITE reaches the peer after the WRITE did.
#[test]
fn a_send_after_a_write_finds_the_write_done_when_it_lands() {
    let (_fabric, mut bed) = fixed_bed(3);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (src, _) = region(&mut bed.client, conn.client.id, 8, Access::NONE);
    bed.client.write_mr(src, 0, b"written!").unwrap();
    bed.server.post_recv(conn.child, 9, 16).unwrap();
    let sge = [Sge::new(src, 0, 8)];
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(1, SendOp::Write { remote, imm: None }, &sge),
        )
        .unwrap();
    bed.client.post_send(conn.client.id, 2, b"done").unwrap();
    // The server sees the receive complete; by then the write is in its region.
    let got = poll_for(&mut bed.server, conn.child, 1, WAIT);
    assert_eq!(statuses(&got), [(9, WcStatus::Success)]);
    let mut seen = [0; 8];
    bed.server.read_mr(table, 0, &mut seen).unwrap();
    assert_eq!(&seen, b"written!");
    let sent = poll_for(&mut bed.client, conn.client.id, 2, WAIT);
    assert_eq!(statuses(&sent), [(1, WcStatus::Success), (2, WcStatus::Success)]);
    bed.client.dereg_mr(src).unwrap();
    bed.server.dereg_mr(table).unwrap();
    teardown(&mut bed, conn);
}

/// Posts a READ and a WRITE to the server's region, then runs `fault` and returns the client's
/// completions (all that come within the retries) and how long the first took.
fn under_fault(
    seed: u64,
    fault: impl FnOnce(&SimFabric),
) -> (Vec<WorkCompletion>, Duration, Bed<SimHost>, Conn) {
    let (fabric, mut bed) = fixed_bed(seed);
    let conn = establish(&mut bed);
    let (_table, remote) = region(&mut bed.server, conn.child, 16, Access::ALL);
    let (mine, _) = region(&mut bed.client, conn.client.id, 16, Access::LOCAL_WRITE);
    fault(&fabric);
    let posted = now(&fabric);
    let (r, w) = ([Sge::new(mine, 0, 8)], [Sge::new(mine, 8, 8)]);
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &r))
        .unwrap();
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(2, SendOp::Write { remote, imm: None }, &w),
        )
        .unwrap();
    let first = poll_for(&mut bed.client, conn.client.id, 1, RETRIES);
    let took = now(&fabric) - posted;
    let mut all = first;
    all.extend(poll_for(&mut bed.client, conn.client.id, 1, WAIT));
    (all, took, bed, conn)
}

// Faults: nothing crosses a partition; the transport's retries run out.
#[test]
fn a_partition_fails_the_first_request_with_retries_exceeded_and_flushes_the_rest() {
    let (got, took, bed, _conn) = under_fault(4, |f| f.inject(Fault::Partition { a: 0, b: 1 }));
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    let ack_timeout = bed.client.fabric().config().ack_timeout;
    assert_eq!(took, 8 * ack_timeout, "(retry_count 7 + 1) local ACK timeouts");
    assert_eq!(bed.client.fabric().fault_stats().onesided_retries_exceeded, 1);
}

// Faults: a partition healed before the retries run out costs time, not the request.
#[test]
fn a_partition_healed_in_time_lets_a_retry_through() {
    let (fabric, mut bed) = fixed_bed(5);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (src, _) = region(&mut bed.client, conn.client.id, 8, Access::NONE);
    bed.client.write_mr(src, 0, &7u64.to_ne_bytes()).unwrap();
    fabric.inject(Fault::Partition { a: 0, b: 1 });
    let sge = [Sge::new(src, 0, 8)];
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(1, SendOp::Write { remote, imm: None }, &sge),
        )
        .unwrap();
    fabric.advance(Duration::from_secs(3));
    fabric.inject(Fault::Heal { a: 0, b: 1 });
    let got = poll_for(&mut bed.client, conn.client.id, 1, RETRIES);
    assert_eq!(statuses(&got), [(1, WcStatus::Success)]);
    assert_eq!(u64_at(&bed.server, table, 0), 7);
    bed.client.dereg_mr(src).unwrap();
    bed.server.dereg_mr(table).unwrap();
    teardown(&mut bed, conn);
}

// Faults: a crashed peer never answers.
#[test]
fn a_crashed_peer_leaves_the_request_to_exceed_its_retries() {
    let (got, took, bed, conn) = under_fault(6, |f| f.inject(Fault::Crash { host: 0 }));
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(took, 8 * bed.client.fabric().config().ack_timeout);
    assert_eq!(
        bed.client.id_machine(conn.client.id).unwrap().qp(),
        Some(QpState::Err)
    );
}

// Faults: the peer's device removed with requests on the wire.
#[test]
fn a_removed_peer_device_leaves_the_request_to_exceed_its_retries() {
    let (got, _, _bed, _conn) = under_fault(7, |f| f.inject(Fault::RemoveDevice { host: 0 }));
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
}

// Faults: a lossy link costs retries; the transport hides the losses.
#[test]
fn a_lossy_link_slows_one_sided_work_and_loses_none_of_it() {
    let mut took = Vec::new();
    for per_mille in [0, 300] {
        let (fabric, mut bed) = fixed_bed(8);
        let conn = establish(&mut bed);
        let (counter, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
        let (old, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
        fabric.inject(Fault::Loss {
            a: 0,
            b: 1,
            per_mille,
        });
        let start = now(&fabric);
        let sge = [Sge::new(old, 0, 8)];
        for i in 0..50u64 {
            bed.client
                .post_send_wr(
                    conn.client.id,
                    &SendWr::new(i, SendOp::FetchAdd { remote, add: 1 }, &sge),
                )
                .unwrap();
            let wc = poll_for(&mut bed.client, conn.client.id, 1, RETRIES);
            assert_eq!(statuses(&wc), [(i, WcStatus::Success)], "loss {per_mille}");
            assert_eq!(u64_at(&bed.client, old, 0), i, "each add saw the one before");
        }
        assert_eq!(u64_at(&bed.server, counter, 0), 50);
        took.push(now(&fabric) - start);
        fabric.inject(Fault::Loss {
            a: 0,
            b: 1,
            per_mille: 0,
        });
        bed.client.dereg_mr(old).unwrap();
        bed.server.dereg_mr(counter).unwrap();
        teardown(&mut bed, conn);
    }
    assert_eq!(took[0], 50 * 2 * LATENCY);
    assert!(took[1] > took[0], "losses cost ACK timeouts: {took:?}");
}

// Faults: a link that loses everything exceeds the retries.
#[test]
fn a_link_that_loses_every_packet_exceeds_the_retries() {
    let (got, took, bed, _conn) = under_fault(9, |f| {
        f.inject(Fault::Loss {
            a: 0,
            b: 1,
            per_mille: 1000,
        })
    });
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)]
    );
    assert_eq!(took, 8 * bed.client.fabric().config().ack_timeout);
}

// Virtual time: a disconnect right after posting catches the requests on the wire.
#[test]
fn a_disconnect_flushes_the_requests_in_flight() {
    let (_fabric, mut bed) = fixed_bed(10);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (mine, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
    let sge = [Sge::new(mine, 0, 8)];
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &sge))
        .unwrap();
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(2, SendOp::FetchAdd { remote, add: 1 }, &sge),
        )
        .unwrap();
    bed.client.disconnect(conn.client.id).unwrap();
    let got = poll_for(&mut bed.client, conn.client.id, 2, WAIT);
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::WrFlushErr), (2, WcStatus::WrFlushErr)]
    );
    assert!(got.iter().all(|wc| wc.byte_len == 0));
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    bed.server.disconnect(conn.child).unwrap();
    expect(&mut bed.client, conn.client.ch, CmEventType::Disconnected);
    bed.client.dereg_mr(mine).unwrap();
    bed.server.dereg_mr(table).unwrap();
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

// Virtual time: a READ's destination deregistered before its response arrives.
#[test]
fn a_read_whose_destination_is_deregistered_in_flight_fails_with_local_protection_error() {
    let (_fabric, mut bed) = fixed_bed(11);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (dst, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
    let sge = [Sge::new(dst, 0, 8)];
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &sge))
        .unwrap();
    bed.client.dereg_mr(dst).unwrap();
    let got = poll_for(&mut bed.client, conn.client.id, 1, WAIT);
    assert_eq!(statuses(&got), [(1, WcStatus::LocProtErr)]);
    assert_eq!(
        bed.client.id_machine(conn.client.id).unwrap().qp(),
        Some(QpState::Err)
    );
    bed.server.dereg_mr(table).unwrap();
    teardown(&mut bed, conn);
}

// Virtual time: a WRITE queued behind a send that waits for a receive, its source
// deregistered meanwhile, fails when it starts.
#[test]
fn a_queued_write_whose_source_is_deregistered_fails_with_local_qp_operation_error() {
    let (_fabric, mut bed) = fixed_bed(12);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
    let (src, _) = region(&mut bed.client, conn.client.id, 8, Access::NONE);
    bed.client.post_send(conn.client.id, 1, b"waits").unwrap();
    let sge = [Sge::new(src, 0, 8)];
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(2, SendOp::Write { remote, imm: None }, &sge),
        )
        .unwrap();
    bed.client.dereg_mr(src).unwrap();
    let mut out = Vec::new();
    assert_eq!(bed.client.poll_cq(conn.client.id, &mut out, 2, QUIET).unwrap(), 0);
    bed.server.post_recv(conn.child, 3, 64).unwrap();
    let got = poll_for(&mut bed.client, conn.client.id, 2, WAIT);
    assert_eq!(
        statuses(&got),
        [(1, WcStatus::Success), (2, WcStatus::LocQpOpErr)]
    );
    bed.server.dereg_mr(table).unwrap();
    teardown(&mut bed, conn);
}

// The trace: one-sided work appears in it, and the same seed gives the same run.
#[test]
fn one_sided_work_is_traced_and_the_same_seed_gives_the_same_trace() {
    let run = |seed: u64| {
        let fabric = SimFabric::builder()
            .seed(seed)
            .host("10.0.0.1")
            .host("10.0.0.2")
            .build();
        let mut bed = Bed::new(
            fabric.host(0),
            fabric.host(1),
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.99".parse().unwrap(),
            7470,
            fabric.repro_line(),
        );
        let conn = establish(&mut bed);
        let before = fabric.trace_len();
        let (table, remote) = region(&mut bed.server, conn.child, 8, Access::ALL);
        let (mine, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
        let sge = [Sge::new(mine, 0, 8)];
        for i in 0..4 {
            let op = if i % 2 == 0 {
                SendOp::FetchAdd { remote, add: 1 }
            } else {
                SendOp::Read { remote }
            };
            bed.client
                .post_send_wr(conn.client.id, &SendWr::new(i, op, &sge))
                .unwrap();
        }
        assert_eq!(poll_for(&mut bed.client, conn.client.id, 4, WAIT).len(), 4);
        assert!(fabric.trace_len() > before, "one-sided work is traced");
        bed.client.dereg_mr(mine).unwrap();
        bed.server.dereg_mr(table).unwrap();
        teardown(&mut bed, conn);
        (fabric.trace_hash(), fabric.now())
    };
    assert_eq!(run(21), run(21));
    assert_ne!(run(21).0, run(22).0, "the latency draws differ");
}

/// One generated operation of the property test.
#[derive(Clone, Debug)]
enum Op {
    Write {
        at: u8,
        value: u8,
        bad_key: bool,
    },
    Read {
        at: u8,
    },
    Add {
        slot: u8,
        add: u8,
    },
    Swap {
        slot: u8,
        compare: u8,
        swap: u8,
    },
    /// Lets `ms` of virtual time pass.
    Wait {
        ms: u8,
    },
    Partition,
    Heal,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u8..=8, any::<u8>(), prop::bool::weighted(0.05))
            .prop_map(|(at, value, bad_key)| Op::Write { at, value, bad_key }),
        3 => (0u8..=8).prop_map(|at| Op::Read { at }),
        3 => (0u8..2, 1u8..4).prop_map(|(slot, add)| Op::Add { slot, add }),
        2 => (0u8..2, 0u8..4, any::<u8>()).prop_map(|(slot, compare, swap)| Op::Swap { slot, compare, swap }),
        2 => (0u8..50).prop_map(|ms| Op::Wait { ms }),
        1 => Just(Op::Partition),
        1 => Just(Op::Heal),
    ]
}

/// The responder's region: 16 bytes of data (8-byte writes and reads at offsets 0..=8) and two
/// 8-byte counters after them for the atomics.
const DATA: u64 = 16;
const REGION: usize = DATA as usize + 16;

// Generated operations and faults against a model of the peer's memory: every request
// completes exactly once and in posting order; after the first failure the rest is flushed;
// successful reads see what the model holds; the peer's memory ends as the model says (unless
// a request exceeded its retries: a write whose answer was lost may have happened or not).
#[test]
fn generated_one_sided_work_matches_a_model_of_the_peers_memory() {
    let mut runner = TestRunner::new(Config {
        cases: crate::bed::prop_cases(),
        ..Config::default()
    });
    runner
        .run(
            &(any::<u64>(), prop::collection::vec(op(), 1..40)),
            |(seed, ops)| {
                run_model(seed, &ops);
                Ok(())
            },
        )
        .unwrap();
}

fn run_model(seed: u64, ops: &[Op]) {
    let (fabric, mut bed) = fixed_bed(seed);
    let conn = establish(&mut bed);
    let (table, remote) = region(&mut bed.server, conn.child, REGION, Access::ALL);
    let (mine, _) = region(
        &mut bed.client,
        conn.client.id,
        8 * ops.len().max(1),
        Access::LOCAL_WRITE,
    );
    let id = conn.client.id;
    // What each posted request expects if it succeeds.
    #[derive(Debug)]
    enum Want {
        Write { at: u64, value: u8 },
        Read { at: u64 },
        Atomic,
        RemoteError,
    }
    let mut posted: Vec<(u64, Want)> = Vec::new();
    let mut model = vec![0u8; REGION];
    let mut failed = false;
    let mut uncertain = false;
    let mut check =
        |bed: &mut Bed<SimHost>, posted: &mut Vec<(u64, Want)>, model: &mut Vec<u8>, wait: Duration| {
            let want = posted.len();
            let got = poll_for(&mut bed.client, id, want, wait);
            for wc in &got {
                let (wr_id, want) = posted.remove(0);
                assert_eq!(wc.wr_id, wr_id, "in posting order");
                if failed {
                    assert_eq!(
                        wc.status,
                        WcStatus::WrFlushErr,
                        "after a failure everything is flushed"
                    );
                    continue;
                }
                match (wc.status, &want) {
                    (WcStatus::Success, Want::Write { at, value }) => {
                        model[*at as usize..*at as usize + 8].fill(*value);
                    }
                    (WcStatus::Success, Want::Read { at }) => {
                        let mut seen = [0; 8];
                        bed.client.read_mr(mine, 8 * wr_id, &mut seen).unwrap();
                        if !uncertain {
                            assert_eq!(&seen[..], &model[*at as usize..*at as usize + 8], "read {wr_id}");
                        }
                    }
                    (WcStatus::Success, Want::Atomic) => {}
                    (WcStatus::RemAccessErr, Want::RemoteError) => failed = true,
                    (WcStatus::RetryExcErr, _) => {
                        failed = true;
                        uncertain = true;
                    }
                    (status, want) => panic!("request {wr_id} ({want:?}) completed {status}"),
                }
            }
        };
    for (i, op) in ops.iter().enumerate() {
        let wr_id = i as u64;
        let sge = [Sge::new(mine, 8 * wr_id, 8)];
        let at = |x: u8| RemoteAddr {
            addr: remote.addr + u64::from(x),
            ..remote
        };
        let (send_op, want) = match *op {
            Op::Write {
                at: off,
                value,
                bad_key,
            } => {
                bed.client.write_mr(mine, 8 * wr_id, &[value; 8]).unwrap();
                let target = if bad_key {
                    RemoteAddr {
                        rkey: remote.rkey ^ 0x100,
                        ..at(off)
                    }
                } else {
                    at(off)
                };
                let want = if bad_key {
                    Want::RemoteError
                } else {
                    Want::Write {
                        at: u64::from(off),
                        value,
                    }
                };
                (
                    SendOp::Write {
                        remote: target,
                        imm: None,
                    },
                    want,
                )
            }
            Op::Read { at: off } => (
                SendOp::Read { remote: at(off) },
                Want::Read { at: u64::from(off) },
            ),
            Op::Add { slot, add } => (
                SendOp::FetchAdd {
                    remote: at(DATA as u8 + 8 * slot),
                    add: u64::from(add),
                },
                Want::Atomic,
            ),
            Op::Swap { slot, compare, swap } => (
                SendOp::CompareSwap {
                    remote: at(DATA as u8 + 8 * slot),
                    compare: u64::from(compare),
                    swap: u64::from(swap),
                },
                Want::Atomic,
            ),
            Op::Wait { ms } => {
                fabric.advance(Duration::from_millis(u64::from(ms)));
                continue;
            }
            Op::Partition => {
                fabric.inject(Fault::Partition { a: 0, b: 1 });
                continue;
            }
            Op::Heal => {
                fabric.inject(Fault::Heal { a: 0, b: 1 });
                continue;
            }
        };
        if posted.len() as u32 == cm::api::QpCaps::new().max_send_wr {
            // A full send queue: wait for its completions (under a partition, the retries).
            check(&mut bed, &mut posted, &mut model, RETRIES);
        }
        bed.client
            .post_send_wr(id, &SendWr::new(wr_id, send_op, &sge))
            .unwrap();
        posted.push((wr_id, want));
        if i % 3 == 2 {
            check(&mut bed, &mut posted, &mut model, Duration::ZERO);
        }
    }
    fabric.inject(Fault::Heal { a: 0, b: 1 });
    check(&mut bed, &mut posted, &mut model, RETRIES);
    assert!(posted.is_empty(), "every request completed: {posted:?} left");
    if !uncertain {
        let mut end = vec![0; DATA as usize];
        bed.server.read_mr(table, 0, &mut end).unwrap();
        assert_eq!(end, model[..DATA as usize], "the peer's memory is the model's");
    }
    bed.client.dereg_mr(mine).unwrap();
    bed.server.dereg_mr(table).unwrap();
    bed.client.disconnect(id).unwrap();
    let _ = poll_for(&mut bed.client, id, usize::MAX, Duration::ZERO);
    let until = Duration::from_secs(120);
    while next_event(&mut bed.server, conn.server.ch, until)
        .is_some_and(|e| e.event != CmEventType::Disconnected)
    {}
    bed.server.disconnect(conn.child).ok();
    while next_event(&mut bed.client, conn.client.ch, until)
        .is_some_and(|e| e.event != CmEventType::Disconnected)
    {}
    destroy_all(&mut bed.client, &[id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

/// Found by cm-fuzz's teardown (which reads every asynchronous event left): the simulator
/// handed out `SRQ_LIMIT_REACHED` for an SRQ destroyed before the event was read. The kernel
/// drops an SRQ's unread events when it is destroyed (`uverbs_free_srq` ->
/// `ib_uverbs_release_uevent`), so no verbs application can read one.
#[test]
fn a_destroyed_srq_takes_its_unread_limit_event_with_it() {
    let (_fabric, mut bed) = fixed_bed(1);
    let server = listen(&mut bed, 0);
    let srq = bed
        .server
        .create_srq(server.listener, SrqCaps::new().with_limit(1))
        .expect("create_srq");
    // Two SRQs of the host, each with its limit crossed: only the destroyed one's event goes.
    let other = bed
        .server
        .create_srq(server.listener, SrqCaps::new().with_limit(1))
        .expect("create_srq");
    bed.server.post_srq_recv(srq, 100, 64).unwrap();
    bed.server.post_srq_recv(other, 200, 64).unwrap();
    let mut conns = Vec::new();
    for on in [srq, other] {
        let client = resolved_client(&mut bed, server.addr, true);
        bed.client.connect(client.id, &ConnParam::new()).unwrap();
        let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
        bed.server.create_qp_on_srq(req.id, QpCaps::new(), on).unwrap();
        bed.server.accept(req.id, &ConnParam::new()).unwrap();
        expect(&mut bed.client, client.ch, CmEventType::Established);
        expect(&mut bed.server, server.ch, CmEventType::Established);
        bed.client.post_send(client.id, 1, b"x").unwrap();
        assert_eq!(poll_for(&mut bed.server, req.id, 1, WAIT).len(), 1);
        conns.push(req.id);
    }
    bed.server.destroy_qp(conns[0]).unwrap();
    bed.server.destroy_srq(srq).unwrap();
    assert_eq!(
        bed.server.get_async_event(WAIT).unwrap(),
        Some(AsyncEvent::SrqLimitReached { srq: other })
    );
    assert_eq!(bed.server.get_async_event(QUIET).unwrap(), None);
}
