//! Every operation's success path: what each completion reports, what lands where, and that
//! it takes virtual time (a round trip of two drawn latencies, for one-sided requests).

use std::time::Duration;

use cm_core::{Access, CmBackend, SendOp, SendWr, Sge, WcOpcode, WcStatus};

use crate::support::*;

#[test]
fn a_write_lands_in_the_peer_region_after_a_round_trip_and_completes_with_no_bytes() {
    let mut p = connect(1);
    let src = p.a_mr(16, Access::NONE);
    p.a.write_mr(src, 0, b"hello, world!!!!").unwrap();
    let dst = p.b_mr(64, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    let sge = [Sge::new(src, 0, 16)];
    let t0 = p.fabric.now();
    p.post_a(&write(7, remote(&info, 8), &sge));
    let wcs = p.poll_a(1);
    assert_eq!(summary(&wcs), [(7, WcOpcode::RdmaWrite, WcStatus::Success, 0)]);
    let took = p.fabric.now().since_start() - t0.since_start();
    // Two one-way trips of 10-20 us each.
    assert!(
        took >= Duration::from_micros(20) && took <= Duration::from_micros(40),
        "{took:?}"
    );
    assert_eq!(read_mr(&p.b, dst, 8, 16), b"hello, world!!!!");
    assert_eq!(read_mr(&p.b, dst, 0, 8), [0; 8], "nothing before the address");
    assert!(wcs[0].data.is_empty() && wcs[0].imm_data.is_none());
    let steps = p.rdma_steps();
    assert_eq!(
        steps,
        [
            (1, "sent", "RDMA_WRITE", 0),
            (0, "executed", "RDMA_WRITE", 0),
            (1, "completed", "RDMA_WRITE", 0)
        ]
    );
}

#[test]
fn a_read_scatters_the_peer_bytes_over_several_entries_and_reports_their_length() {
    let mut p = connect(2);
    let table = p.b_mr(32, Access::LOCAL_WRITE | Access::REMOTE_READ);
    p.b.write_mr(table, 0, b"0123456789abcdefghijklmnopqrstuv")
        .unwrap();
    let info = p.b.mr_info(table).unwrap();
    let x = p.a_mr(8, Access::LOCAL_WRITE);
    let y = p.a_mr(8, Access::LOCAL_WRITE);
    // Three entries over two regions, one of them empty.
    let sges = [Sge::new(x, 4, 4), Sge::new(y, 0, 0), Sge::new(y, 2, 6)];
    p.post_a(&read(3, remote(&info, 10), &sges));
    let wcs = p.poll_a(1);
    assert_eq!(summary(&wcs), [(3, WcOpcode::RdmaRead, WcStatus::Success, 10)]);
    assert_eq!(read_mr(&p.a, x, 0, 8), b"\0\0\0\0abcd");
    assert_eq!(read_mr(&p.a, y, 0, 8), b"\0\0efghij");
}

#[test]
fn a_write_gathers_several_entries_in_order() {
    let mut p = connect(3);
    let x = p.a_mr(4, Access::NONE);
    let y = p.a_mr(4, Access::LOCAL_WRITE);
    p.a.write_mr(x, 0, b"abcd").unwrap();
    p.a.write_mr(y, 0, b"wxyz").unwrap();
    let dst = p.b_mr(8, Access::LOCAL_WRITE | Access::REMOTE_WRITE);
    let info = p.b.mr_info(dst).unwrap();
    let sges = [Sge::new(y, 2, 2), Sge::new(x, 0, 3), Sge::new(y, 0, 1)];
    p.post_a(&write(1, info.remote().start(), &sges));
    assert_eq!(p.poll_a(1)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&p.b, dst, 0, 8), b"yzabcw\0\0");
}

#[test]
fn a_write_with_immediate_takes_a_receive_that_reports_its_length_and_immediate() {
    let mut p = connect(4);
    let src = p.a_mr(5, Access::NONE);
    p.a.write_mr(src, 0, b"12345").unwrap();
    let dst = p.b_mr(16, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    p.b.post_recv(p.b_id, 40, 2).unwrap();
    let sge = [Sge::new(src, 0, 5)];
    let wr = SendWr::new(
        9,
        SendOp::Write {
            remote: remote(&info, 3),
            imm: Some(0xCAFE),
        },
        &sge,
    );
    p.post_a(&wr);
    let a = p.poll_a(1);
    assert_eq!(summary(&a), [(9, WcOpcode::RdmaWrite, WcStatus::Success, 0)]);
    let b = p.poll_b(1);
    // The receive's own buffer (2 bytes) is not where the data goes: the region is.
    assert_eq!(
        summary(&b),
        [(40, WcOpcode::RecvRdmaWithImm, WcStatus::Success, 5)]
    );
    assert_eq!(b[0].imm_data, Some(0xCAFE));
    assert!(b[0].data.is_empty());
    assert_eq!(read_mr(&p.b, dst, 3, 5), b"12345");
}

#[test]
fn a_zero_length_write_with_immediate_still_takes_a_receive() {
    let mut p = connect(5);
    p.b.post_recv(p.b_id, 1, 8).unwrap();
    // No region anywhere: any key will do at length zero.
    let wr = SendWr::new(
        2,
        SendOp::Write {
            remote: cm_core::RemoteAddr {
                addr: 0xDEAD,
                rkey: 0xBAD,
            },
            imm: Some(7),
        },
        &[],
    );
    p.post_a(&wr);
    assert_eq!(p.poll_a(1)[0].status, WcStatus::Success);
    let b = p.poll_b(1);
    assert_eq!(
        summary(&b),
        [(1, WcOpcode::RecvRdmaWithImm, WcStatus::Success, 0)]
    );
    assert_eq!(b[0].imm_data, Some(7));
}

#[test]
fn sends_over_regions_land_in_receives_with_and_without_an_immediate() {
    let mut p = connect(6);
    let src = p.a_mr(8, Access::NONE);
    p.a.write_mr(src, 0, b"ping" as &[u8]).unwrap();
    p.a.write_mr(src, 4, b"pong").unwrap();
    p.b.post_recv(p.b_id, 10, 16).unwrap();
    p.b.post_recv(p.b_id, 11, 16).unwrap();
    let first = [Sge::new(src, 0, 4)];
    let both = [Sge::new(src, 4, 4), Sge::new(src, 0, 4)];
    p.post_a(&SendWr::new(1, SendOp::Send { imm: None }, &first));
    p.post_a(&SendWr::new(2, SendOp::Send { imm: Some(99) }, &both));
    let a = p.poll_a(2);
    assert_eq!(
        summary(&a),
        [
            (1, WcOpcode::Send, WcStatus::Success, 0),
            (2, WcOpcode::Send, WcStatus::Success, 0)
        ]
    );
    let b = p.poll_b(2);
    assert_eq!(
        summary(&b),
        [
            (10, WcOpcode::Recv, WcStatus::Success, 4),
            (11, WcOpcode::Recv, WcStatus::Success, 8)
        ]
    );
    assert_eq!((b[0].data.as_slice(), b[0].imm_data), (&b"ping"[..], None));
    assert_eq!(
        (b[1].data.as_slice(), b[1].imm_data),
        (&b"pongping"[..], Some(99))
    );
    let steps = p.rdma_steps();
    assert_eq!(steps.len(), 6, "sent, executed, completed each: {steps:?}");
}

#[test]
fn compare_and_swap_swaps_only_on_equality_and_returns_the_old_value() {
    let mut p = connect(7);
    let lock = p.b_mr(16, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    p.b.write_mr(lock, 8, &5u64.to_ne_bytes()).unwrap();
    let info = p.b.mr_info(lock).unwrap();
    let old = p.a_mr(8, Access::LOCAL_WRITE);
    let sge = [Sge::new(old, 0, 8)];
    let cas = |wr_id, compare, swap| {
        SendWr::new(
            wr_id,
            SendOp::CompareSwap {
                remote: remote(&info, 8),
                compare,
                swap,
            },
            &sge,
        )
    };
    let value = |h: &cm_sim::SimHost, mr| u64::from_ne_bytes(read_mr(h, mr, 0, 8).try_into().unwrap());
    p.post_a(&cas(1, 4, 100));
    assert_eq!(
        summary(&p.poll_a(1)),
        [(1, WcOpcode::CompSwap, WcStatus::Success, 8)]
    );
    assert_eq!(value(&p.a, old), 5, "the value found");
    assert_eq!(
        u64::from_ne_bytes(read_mr(&p.b, lock, 8, 8).try_into().unwrap()),
        5,
        "unequal: unchanged"
    );
    p.post_a(&cas(2, 5, 100));
    p.poll_a(1);
    assert_eq!(value(&p.a, old), 5);
    assert_eq!(
        u64::from_ne_bytes(read_mr(&p.b, lock, 8, 8).try_into().unwrap()),
        100
    );
}

#[test]
fn fetch_and_add_adds_wrapping_and_returns_the_old_value() {
    let mut p = connect(8);
    let counter = p.b_mr(8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC);
    p.b.write_mr(counter, 0, &(u64::MAX - 1).to_ne_bytes()).unwrap();
    let info = p.b.mr_info(counter).unwrap();
    let old = p.a_mr(8, Access::LOCAL_WRITE);
    let sge = [Sge::new(old, 0, 8)];
    for (i, want_old) in [(1, u64::MAX - 1), (2, 2)] {
        let add = SendWr::new(
            i,
            SendOp::FetchAdd {
                remote: info.remote().start(),
                add: 4,
            },
            &sge,
        );
        p.post_a(&add);
        assert_eq!(
            summary(&p.poll_a(1)),
            [(i, WcOpcode::FetchAdd, WcStatus::Success, 8)]
        );
        assert_eq!(
            u64::from_ne_bytes(read_mr(&p.a, old, 0, 8).try_into().unwrap()),
            want_old
        );
    }
    assert_eq!(
        u64::from_ne_bytes(read_mr(&p.b, counter, 0, 8).try_into().unwrap()),
        6
    );
}

#[test]
fn a_zero_length_read_or_write_needs_no_valid_key() {
    let mut p = connect(9);
    let bogus = cm_core::RemoteAddr {
        addr: 1,
        rkey: 0x1234_5678,
    };
    p.post_a(&read(1, bogus, &[]));
    p.post_a(&write(2, bogus, &[]));
    assert_eq!(
        summary(&p.poll_a(2)),
        [
            (1, WcOpcode::RdmaRead, WcStatus::Success, 0),
            (2, WcOpcode::RdmaWrite, WcStatus::Success, 0)
        ]
    );
}

#[test]
fn unsignalled_successes_complete_silently_and_free_their_slots_when_polled() {
    let caps = cm_core::QpCaps {
        max_send_wr: 4,
        ..Setup::default().caps
    };
    let mut p = connect_with(
        builder(10),
        Setup {
            caps,
            ..Setup::default()
        },
    );
    let src = p.a_mr(8, Access::LOCAL_WRITE);
    let dst = p.b_mr(8, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    let sge = [Sge::new(src, 0, 8)];
    for i in 0..3 {
        p.post_a(&write(i, info.remote().start(), &sge).unsignaled());
    }
    p.post_a(&read(3, info.remote().start(), &sge));
    assert_eq!(p.a.id_machine(p.a_id).unwrap().qp(), Some(cm_core::QpState::Rts));
    // Four held: the queue is full until a poll frees them.
    let full = p.a.post_send_wr(p.a_id, &write(4, info.remote().start(), &sge));
    assert!(
        matches!(full, Err(cm_core::CmError::QueueFull { outstanding: 4, .. })),
        "{full:?}"
    );
    let wcs = p.poll_a(1);
    assert_eq!(summary(&wcs), [(3, WcOpcode::RdmaRead, WcStatus::Success, 8)]);
    for i in 4..8 {
        p.post_a(&write(i, info.remote().start(), &sge).unsignaled());
    }
    // Nothing to hand out: a poll waits its whole timeout, then frees them.
    let before = p.fabric.now();
    nothing_more(&mut p.a, p.a_id, Duration::from_millis(1));
    assert!(p.fabric.now() > before);
    p.post_a(&write(8, info.remote().start(), &sge));
    assert_eq!(p.poll_a(1)[0].wr_id, 8);
}

#[test]
fn one_sided_work_leaves_the_trace_of_runs_without_it_alone() {
    // Two identical connections, one with a WRITE after it: the trace up to the WRITE is the
    // same, record for record (the one-sided stream draws nothing from the fabric's).
    let plain = connect(11);
    let mut used = connect(11);
    let before: Vec<_> = plain.fabric.trace_lines();
    let src = used.a_mr(8, Access::NONE);
    let dst = used.b_mr(8, Access::ALL);
    let info = used.b.mr_info(dst).unwrap();
    used.post_a(&write(1, info.remote().start(), &[Sge::new(src, 0, 8)]));
    used.poll_a(1);
    let after = used.fabric.trace_lines();
    assert_eq!(after[..before.len()], before[..]);
    assert_eq!(after.len(), before.len() + 3);
    assert_ne!(plain.fabric.trace_hash(), used.fabric.trace_hash());
}

#[test]
fn the_same_seed_gives_the_same_run_with_one_sided_work() {
    let run = |seed| {
        let mut p = connect(seed);
        let src = p.a_mr(64, Access::LOCAL_WRITE);
        let dst = p.b_mr(64, Access::ALL);
        let info = p.b.mr_info(dst).unwrap();
        let sge = [Sge::new(src, 0, 8)];
        for i in 0..8 {
            p.post_a(&write(i, remote(&info, i * 8), &sge));
            p.post_a(&read(100 + i, remote(&info, i * 8), &sge));
        }
        p.poll_a(16);
        (p.fabric.trace_hash(), p.fabric.now())
    };
    assert_eq!(run(12), run(12));
    assert_ne!(run(12).0, run(13).0, "latencies are drawn");
}
