//! Ordering: completions in posting order, requests executed in posting order, a two-sided
//! send after one-sided work, the fence, the initiator depth, and atomics from two clients on
//! one counter.

use std::time::Duration;

use cm_core::{Access, CmBackend, ConnParam, SendOp, SendWr, Sge, WcOpcode, WcStatus};

use crate::support::*;

/// The index in the trace of the first one-sided record matching (host, step, op).
fn at(steps: &[(u16, &str, &str, i32)], host: u16, step: &str, op: &str, nth: usize) -> usize {
    steps
        .iter()
        .enumerate()
        .filter(|(_, s)| s.0 == host && s.1 == step && s.2 == op)
        .nth(nth)
        .unwrap_or_else(|| panic!("no {op} {step} #{nth} on host {host}: {steps:?}"))
        .0
}

#[test]
fn completions_come_in_posting_order_whatever_each_operation_waits_for() {
    for seed in 40..48 {
        let mut p = connect(seed);
        let table = p.b_mr(256, Access::ALL);
        let to = p.b.mr_info(table).unwrap();
        let local = p.a_mr(256, Access::LOCAL_WRITE);
        for i in 0..4 {
            p.b.post_recv(p.b_id, 100 + i, 64).unwrap();
        }
        let kinds = [
            WcOpcode::RdmaWrite,
            WcOpcode::RdmaRead,
            WcOpcode::Send,
            WcOpcode::FetchAdd,
            WcOpcode::RdmaWrite,
            WcOpcode::Send,
            WcOpcode::RdmaRead,
            WcOpcode::CompSwap,
        ];
        for (i, kind) in kinds.iter().enumerate() {
            let off = i as u64 * 8;
            let sge = [Sge::new(local, off, 8)];
            let dest = remote(&to, off);
            let wr = match kind {
                WcOpcode::RdmaWrite => write(i as u64, dest, &sge),
                WcOpcode::RdmaRead => read(i as u64, dest, &sge),
                WcOpcode::Send => SendWr::new(i as u64, SendOp::Send { imm: None }, &sge),
                WcOpcode::FetchAdd => SendWr::new(i as u64, SendOp::FetchAdd { remote: dest, add: 1 }, &sge),
                _ => SendWr::new(
                    i as u64,
                    SendOp::CompareSwap {
                        remote: dest,
                        compare: 0,
                        swap: 1,
                    },
                    &sge,
                ),
            };
            p.post_a(&wr);
        }
        let wcs = p.poll_a(kinds.len());
        let got: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
        let want: Vec<_> = kinds
            .iter()
            .enumerate()
            .map(|(i, k)| (i as u64, *k, WcStatus::Success))
            .collect();
        assert_eq!(got, want, "seed {seed}");
    }
}

#[test]
fn requests_execute_at_the_responder_in_posting_order() {
    // Latencies are drawn per packet: without ordering, later writes would overtake earlier
    // ones. The last write's bytes must be what is left.
    for seed in 48..56 {
        let mut p = connect_with(
            builder(seed).latency(Duration::from_micros(1)..=Duration::from_micros(500)),
            Setup::default(),
        );
        let dst = p.b_mr(8, Access::ALL);
        let to = p.b.mr_info(dst).unwrap().remote().start();
        let src = p.a_mr(8 * 16, Access::NONE);
        for i in 0..16u64 {
            p.a.write_mr(src, i * 8, &i.to_ne_bytes()).unwrap();
            p.post_a(&write(i, to, &[Sge::new(src, i * 8, 8)]));
        }
        p.poll_a(16);
        assert_eq!(read_mr(&p.b, dst, 0, 8), 15u64.to_ne_bytes(), "seed {seed}");
        let executed: Vec<_> = p.rdma_steps().into_iter().filter(|s| s.1 == "executed").collect();
        assert_eq!(executed.len(), 16);
    }
}

#[test]
fn a_send_after_a_read_waits_for_the_read_to_complete() {
    let mut p = connect(56);
    let table = p.b_mr(8, Access::ALL);
    let to = p.b.mr_info(table).unwrap().remote().start();
    let local = p.a_mr(8, Access::LOCAL_WRITE);
    let sge = [Sge::new(local, 0, 8)];
    p.b.post_recv(p.b_id, 1, 8).unwrap();
    p.post_a(&read(1, to, &sge));
    p.post_a(&SendWr::new(2, SendOp::Send { imm: None }, &sge));
    p.poll_a(2);
    let steps = p.rdma_steps();
    assert!(
        at(&steps, 1, "completed", "RDMA_READ", 0) < at(&steps, 1, "sent", "SEND", 0),
        "{steps:?}"
    );
}

#[test]
fn a_fenced_request_waits_for_the_reads_before_it_and_an_unfenced_one_does_not() {
    for fence in [false, true] {
        let mut p = connect(57);
        let table = p.b_mr(16, Access::ALL);
        let to = p.b.mr_info(table).unwrap();
        let local = p.a_mr(16, Access::LOCAL_WRITE);
        p.post_a(&read(1, remote(&to, 0), &[Sge::new(local, 0, 8)]));
        let sge = [Sge::new(local, 8, 8)];
        let w = write(2, remote(&to, 8), &sge);
        p.post_a(&if fence { w.fenced() } else { w });
        p.poll_a(2);
        let steps = p.rdma_steps();
        let read_done = at(&steps, 1, "completed", "RDMA_READ", 0);
        let write_sent = at(&steps, 1, "sent", "RDMA_WRITE", 0);
        assert_eq!(write_sent > read_done, fence, "fence={fence}: {steps:?}");
    }
    // A fence does not wait for earlier writes.
    let mut p = connect(58);
    let table = p.b_mr(16, Access::ALL);
    let to = p.b.mr_info(table).unwrap();
    let local = p.a_mr(16, Access::LOCAL_WRITE);
    p.post_a(&write(1, remote(&to, 0), &[Sge::new(local, 0, 8)]));
    p.post_a(&read(2, remote(&to, 8), &[Sge::new(local, 8, 8)]).fenced());
    p.poll_a(2);
    let steps = p.rdma_steps();
    assert!(at(&steps, 1, "sent", "RDMA_READ", 0) < at(&steps, 1, "completed", "RDMA_WRITE", 0));
}

#[test]
fn reads_and_atomics_in_flight_stay_within_the_initiator_depth_rounded_up_to_a_power_of_two() {
    for (granted, in_flight) in [(1u8, 1usize), (3, 4)] {
        let server = ConnParam {
            responder_resources: granted,
            ..ConnParam::new()
        };
        let mut p = connect_with(
            builder(59),
            Setup {
                server,
                ..Setup::default()
            },
        );
        let table = p.b_mr(64, Access::ALL);
        let to = p.b.mr_info(table).unwrap();
        let local = p.a_mr(64, Access::LOCAL_WRITE);
        for i in 0..6u64 {
            p.post_a(&read(i, remote(&to, i * 8), &[Sge::new(local, i * 8, 8)]));
        }
        p.poll_a(6);
        let steps = p.rdma_steps();
        // The (in_flight + 1)th READ leaves only after the first completed.
        assert!(
            at(&steps, 1, "sent", "RDMA_READ", in_flight) > at(&steps, 1, "completed", "RDMA_READ", 0),
            "depth {granted}: {steps:?}"
        );
        assert!(
            at(&steps, 1, "sent", "RDMA_READ", in_flight - 1) < at(&steps, 1, "completed", "RDMA_READ", 0),
            "depth {granted}: {steps:?}"
        );
    }
}

#[test]
fn fetch_and_add_from_two_clients_on_one_counter_loses_no_increment() {
    let fabric = builder(60).host("10.0.0.3").build();
    // Two connections to the server: hosts 1 and 2.
    let (mut p, _) = connect_on(fabric.clone(), Setup::default());
    let counter =
        p.b.reg_mr(p.listener, 8, Access::LOCAL_WRITE | Access::REMOTE_ATOMIC)
            .unwrap();
    let to = p.b.mr_info(counter).unwrap().remote().start();
    let mut c = fabric.host(2);
    let cch = c.create_event_channel().unwrap();
    let cid = c.create_id(cch, cm_core::PortSpace::Tcp).unwrap();
    c.resolve_addr(cid, None, SERVER.parse().unwrap(), WAIT).unwrap();
    expect(&mut c, cch, cm_core::CmEventType::AddrResolved);
    c.resolve_route(cid, WAIT).unwrap();
    expect(&mut c, cch, cm_core::CmEventType::RouteResolved);
    c.create_qp(cid, Setup::default().caps).unwrap();
    c.connect(cid, &ConnParam::new()).unwrap();
    let child = expect(&mut p.b, p.b_ch, cm_core::CmEventType::ConnectRequest);
    p.b.create_qp(child, Setup::default().caps).unwrap();
    p.b.accept(child, &ConnParam::new()).unwrap();
    expect(&mut c, cch, cm_core::CmEventType::Established);
    expect(&mut p.b, p.b_ch, cm_core::CmEventType::Established);
    const N: u64 = 40;
    let mine = p.a_mr(8 * N as usize, Access::LOCAL_WRITE);
    let theirs = c.reg_mr(cid, 8 * N as usize, Access::LOCAL_WRITE).unwrap();
    let add = SendOp::FetchAdd { remote: to, add: 1 };
    // Interleaved posts, eight in flight on each client at a time.
    for round in 0..N / 8 {
        for i in round * 8..round * 8 + 8 {
            let (ours, others) = ([Sge::new(mine, i * 8, 8)], [Sge::new(theirs, i * 8, 8)]);
            p.a.post_send_wr(p.a_id, &SendWr::new(i, add, &ours)).unwrap();
            c.post_send_wr(cid, &SendWr::new(i, add, &others)).unwrap();
        }
        let a = p.poll_a(8);
        let other = poll(&mut c, cid, 8);
        assert!(a.iter().chain(&other).all(|w| w.status == WcStatus::Success));
    }
    assert_eq!(read_mr(&p.b, counter, 0, 8), (2 * N).to_ne_bytes());
    let mut olds: Vec<u64> = Vec::new();
    for (h, mr) in [(&p.a, mine), (&c, theirs)] {
        for i in 0..N {
            olds.push(u64::from_ne_bytes(read_mr(h, mr, i * 8, 8).try_into().unwrap()));
        }
    }
    olds.sort_unstable();
    assert_eq!(olds, (0..2 * N).collect::<Vec<_>>(), "every old value once");
}
