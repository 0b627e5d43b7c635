//! One-sided RDMA as rxe showed it in the lab, on both backends: regions, RDMA WRITE (with and
//! without an immediate), READ, compare-and-swap, fetch-and-add, unsignalled work, a bad remote
//! key (what each side sees), a shared receive queue feeding two connections with its limit
//! event, RNR retries counted from the peer's accept. Each test prints what the backend did
//! (`rxe: ...` lines), so that a lab run records rxe's behaviour next to the verdict, and the
//! simulator is held to the same.

use cm::api::{
    Access, AsyncEvent, Call, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdHandle, MrHandle,
    PortSpace, QpCaps, QpState, RemoteMr, SendOp, SendWr, Sge, SrqCaps, WcOpcode, WcStatus, WorkCompletion,
};

use crate::support::*;

/// A region of `len` bytes on `id`'s device with every access flag, and what a peer needs.
fn remote_region<B: CmBackend>(b: &mut B, id: IdHandle, len: usize) -> (MrHandle, RemoteMr) {
    let mr = b.reg_mr(id, len, Access::ALL).expect("reg_mr");
    let info = b.mr_info(mr).expect("mr_info");
    (mr, info.remote())
}

/// On `conn`: a region of `target_len` bytes with every access on the server's side (and
/// what the client needs of it), and one of `local_len` bytes the client's NIC may write.
fn regions<B: CmBackend>(
    bed: &mut Bed<B>,
    conn: &Conn,
    target_len: usize,
    local_len: usize,
) -> (MrHandle, RemoteMr, MrHandle) {
    let (target, remote) = remote_region(&mut bed.server, conn.child, target_len);
    let local = bed
        .client
        .reg_mr(conn.client.id, local_len, Access::LOCAL_WRITE)
        .expect("reg_mr");
    (target, remote, local)
}

/// Deregisters the client's `local` and the server's `target` region, then tears `conn` down.
fn release<B: CmBackend>(bed: &mut Bed<B>, conn: Conn, local: MrHandle, target: MrHandle) {
    bed.client.dereg_mr(local).unwrap();
    bed.server.dereg_mr(target).unwrap();
    teardown(bed, conn);
}

/// The single completion of `id`'s next work, within the wait.
#[track_caller]
fn one<B: CmBackend>(b: &mut B, id: IdHandle) -> WorkCompletion {
    let mut got = completions(b, id, 1);
    assert_eq!(got.len(), 1, "one completion within {WAIT:?}");
    got.remove(0)
}

fn read_u64<B: CmBackend>(b: &B, mr: MrHandle, offset: u64) -> u64 {
    let mut v = [0; 8];
    b.read_mr(mr, offset, &mut v).expect("read_mr");
    u64::from_ne_bytes(v)
}

#[test]
fn a_region_is_zeroed_backend_memory_that_outlives_its_id() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let b = &mut bed.server;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    assert_err(
        b.reg_mr(id, 64, Access::ALL),
        CmError::NoDevice { call: Call::RegMr },
    );
    b.bind_addr(id, addr).unwrap();
    assert!(matches!(
        b.reg_mr(id, 64, Access::REMOTE_WRITE),
        Err(CmError::InvalidArgument {
            call: Call::RegMr,
            ..
        })
    ));
    assert!(matches!(
        b.reg_mr(id, 0, Access::ALL),
        Err(CmError::InvalidArgument {
            call: Call::RegMr,
            ..
        })
    ));
    let mr = b.reg_mr(id, 10_000, Access::ALL).unwrap();
    let info = b.mr_info(mr).unwrap();
    println!(
        "rxe: region of 10000 bytes at {:#x}, lkey {:#x}, rkey {:#x}",
        info.addr, info.lkey, info.rkey
    );
    assert_eq!((info.len, info.access), (10_000, Access::ALL));
    assert_eq!(info.addr % 4096, 0, "page-aligned");
    let local = b.reg_mr(id, 64, Access::NONE).unwrap();
    let local_info = b.mr_info(local).unwrap();
    println!(
        "rxe: a region without remote access has rkey {:#x}",
        local_info.rkey
    );
    let mut bytes = [0xAAu8; 16];
    b.read_mr(mr, 9_984, &mut bytes).unwrap();
    assert_eq!(bytes, [0; 16], "zeroed");
    b.write_mr(mr, 100, b"hello, region").unwrap();
    assert!(matches!(
        b.read_mr(mr, 9_990, &mut bytes),
        Err(CmError::InvalidArgument {
            call: Call::ReadMr,
            ..
        })
    ));
    assert_eq!(b.live_resources().mrs, 2);
    // The id goes; the regions stay usable (their PD holds the device).
    b.destroy_id(id).unwrap();
    b.destroy_event_channel(ch).unwrap();
    let mut back = [0u8; 13];
    b.read_mr(mr, 100, &mut back).unwrap();
    assert_eq!(&back, b"hello, region");
    b.dereg_mr(mr).unwrap();
    b.dereg_mr(local).unwrap();
    assert_err(
        b.mr_info(mr),
        CmError::UnknownHandle {
            call: Call::RegMr,
            kind: HandleKind::Mr,
        },
    );
    assert_err(
        b.dereg_mr(mr),
        CmError::UnknownHandle {
            call: Call::DeregMr,
            kind: HandleKind::Mr,
        },
    );
    assert_clean(&bed);
}

#[test]
fn write_read_compare_swap_and_fetch_add_reach_the_peers_region() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 4096, 4096);
    let id = conn.client.id;

    // WRITE: 64 bytes from the client's region to the server's.
    let pattern: Vec<u8> = (0..64).collect();
    bed.client.write_mr(local, 0, &pattern).unwrap();
    let sge = [Sge::new(local, 0, 64)];
    let write = SendOp::Write {
        remote: remote.start(),
        imm: None,
    };
    bed.client.post_send_wr(id, &SendWr::new(1, write, &sge)).unwrap();
    let wc = one(&mut bed.client, id);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (1, WcStatus::Success, WcOpcode::RdmaWrite, 0)
    );
    let mut landed = vec![0; 64];
    bed.server.read_mr(target, 0, &mut landed).unwrap();
    assert_eq!(landed, pattern);

    // READ: 32 bytes of the server's region, gathered into two entries.
    bed.server.write_mr(target, 1000, &[7; 32]).unwrap();
    let read = SendOp::Read {
        remote: remote.at(1000).unwrap(),
    };
    // The QP was made with one entry per request (QpCaps::new): two are refused at post.
    let two = [Sge::new(local, 200, 16), Sge::new(local, 300, 16)];
    assert!(matches!(
        bed.client.post_send_wr(id, &SendWr::new(2, read, &two)),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    let into = [Sge::new(local, 200, 32)];
    bed.client.post_send_wr(id, &SendWr::new(2, read, &into)).unwrap();
    let wc = one(&mut bed.client, id);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (2, WcStatus::Success, WcOpcode::RdmaRead, 32)
    );
    let mut got = [0u8; 32];
    bed.client.read_mr(local, 200, &mut got).unwrap();
    assert_eq!(got, [7; 32]);

    // Atomics on the server's u64 at 2048.
    bed.server.write_mr(target, 2048, &5u64.to_ne_bytes()).unwrap();
    let old = [Sge::new(local, 512, 8)];
    let at = remote.at(2048).unwrap();
    let cas = |compare, swap| SendOp::CompareSwap {
        remote: at,
        compare,
        swap,
    };
    bed.client
        .post_send_wr(id, &SendWr::new(3, cas(5, 9), &old))
        .unwrap();
    let wc = one(&mut bed.client, id);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (3, WcStatus::Success, WcOpcode::CompSwap, 8)
    );
    assert_eq!(read_u64(&bed.client, local, 512), 5, "the old value comes back");
    assert_eq!(read_u64(&bed.server, target, 2048), 9, "swapped");
    bed.client
        .post_send_wr(id, &SendWr::new(4, cas(5, 1), &old))
        .unwrap();
    assert_eq!(one(&mut bed.client, id).status, WcStatus::Success);
    assert_eq!(read_u64(&bed.client, local, 512), 9);
    assert_eq!(read_u64(&bed.server, target, 2048), 9, "no swap: 9 is not 5");
    // A fenced fetch-and-add: it waits for the CAS before it (nothing is in flight here, but
    // the flag must reach verbs without a refusal).
    let add = SendOp::FetchAdd { remote: at, add: 3 };
    bed.client
        .post_send_wr(id, &SendWr::new(5, add, &old).fenced())
        .unwrap();
    let wc = one(&mut bed.client, id);
    assert_eq!(
        (wc.wr_id, wc.status, wc.opcode, wc.byte_len),
        (5, WcStatus::Success, WcOpcode::FetchAdd, 8)
    );
    assert_eq!(read_u64(&bed.client, local, 512), 9);
    assert_eq!(read_u64(&bed.server, target, 2048), 12);

    // A READ and a WRITE posted back to back complete in posting order.
    let read = SendOp::Read {
        remote: remote.at(1000).unwrap(),
    };
    let into = [Sge::new(local, 600, 16)];
    bed.client
        .post_send_wr(id, &SendWr::new(10, read, &into))
        .unwrap();
    let from = [Sge::new(local, 0, 16)];
    bed.client
        .post_send_wr(id, &SendWr::new(11, write, &from))
        .unwrap();
    let both = completions(&mut bed.client, id, 2);
    let order: Vec<_> = both.iter().map(|wc| (wc.wr_id, wc.opcode, wc.status)).collect();
    assert_eq!(
        order,
        [
            (10, WcOpcode::RdmaRead, WcStatus::Success),
            (11, WcOpcode::RdmaWrite, WcStatus::Success)
        ]
    );

    // Refused before verbs: an unaligned atomic, a destination without LOCAL_WRITE.
    let odd = SendOp::FetchAdd {
        remote: remote.at(2049).unwrap(),
        add: 1,
    };
    assert!(matches!(
        bed.client.post_send_wr(id, &SendWr::new(6, odd, &old)),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    let ro = bed.client.reg_mr(id, 8, Access::NONE).unwrap();
    let into_ro = [Sge::new(ro, 0, 8)];
    assert!(matches!(
        bed.client.post_send_wr(id, &SendWr::new(7, add, &into_ro)),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    bed.client.dereg_mr(ro).unwrap();
    release(&mut bed, conn, local, target);
}

#[test]
fn write_with_immediate_takes_the_peers_receive_and_send_with_immediate_carries_bytes() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 4096, 4096);
    bed.client.write_mr(local, 0, &[0x5A; 100]).unwrap();
    bed.server.post_recv(conn.child, 77, 16).unwrap();
    let sge = [Sge::new(local, 0, 100)];
    let op = SendOp::Write {
        remote: remote.at(8).unwrap(),
        imm: Some(0xDEAD_BEEF),
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, op, &sge))
        .unwrap();
    let sent = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (sent.status, sent.opcode, sent.imm_data),
        (WcStatus::Success, WcOpcode::RdmaWrite, None)
    );
    let got = one(&mut bed.server, conn.child);
    println!(
        "rxe: WRITE_WITH_IMM of 100 bytes into a 16-byte receive: {} {} byte_len {} imm {:x?}",
        got.status, got.opcode, got.byte_len, got.imm_data
    );
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len, got.imm_data),
        (
            77,
            WcStatus::Success,
            WcOpcode::RecvRdmaWithImm,
            100,
            Some(0xDEAD_BEEF)
        )
    );
    assert!(got.data.is_empty(), "the bytes went to the region");
    let mut landed = [0u8; 100];
    bed.server.read_mr(target, 8, &mut landed).unwrap();
    assert_eq!(landed, [0x5A; 100]);

    // SEND_WITH_IMM from a region: a normal receive, with the immediate.
    bed.server.post_recv(conn.child, 78, 64).unwrap();
    bed.client.write_mr(local, 0, b"ping").unwrap();
    let sge = [Sge::new(local, 0, 4)];
    let send = SendOp::Send { imm: Some(42) };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(2, send, &sge))
        .unwrap();
    assert_eq!(one(&mut bed.client, conn.client.id).opcode, WcOpcode::Send);
    let got = one(&mut bed.server, conn.child);
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len, got.imm_data),
        (78, WcStatus::Success, WcOpcode::Recv, 4, Some(42))
    );
    assert_eq!(got.data, b"ping");
    release(&mut bed, conn, local, target);
}

#[test]
fn unsignalled_work_completes_silently_and_frees_its_slot_with_the_next_signalled_one() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 4096, 4096);
    let id = conn.client.id;
    let depth = QpCaps::new().max_send_wr;
    for round in 0..2u64 {
        for i in 0..u64::from(depth) {
            bed.client
                .write_mr(local, i * 8, &(round * 100 + i).to_ne_bytes())
                .unwrap();
            let sge = [Sge::new(local, i * 8, 8)];
            let op = SendOp::Write {
                remote: remote.at(i * 8).unwrap(),
                imm: None,
            };
            let wr = SendWr::new(round * 100 + i, op, &sge);
            let last = i + 1 == u64::from(depth);
            let wr = if last { wr } else { wr.unsignaled() };
            bed.client.post_send_wr(id, &wr).unwrap();
        }
        let sge = [Sge::new(local, 0, 8)];
        let op = SendOp::Write {
            remote: remote.start(),
            imm: None,
        };
        assert_err(
            bed.client
                .post_send_wr(id, &SendWr::new(999, op, &sge).unsignaled()),
            CmError::QueueFull {
                call: Call::PostSend,
                outstanding: depth,
            },
        );
        let mut got = Vec::new();
        bed.client.poll_cq(id, &mut got, 16, WAIT).unwrap();
        // Anything else would come within the quiet wait.
        bed.client.poll_cq(id, &mut got, 16, QUIET).unwrap();
        let ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
        assert_eq!(
            ids,
            [round * 100 + u64::from(depth) - 1],
            "only the signalled one"
        );
        for i in 0..u64::from(depth) {
            assert_eq!(read_u64(&bed.server, target, i * 8), round * 100 + i);
        }
    }
    release(&mut bed, conn, local, target);
}

#[test]
fn a_bad_rkey_fails_the_write_with_remote_access_error_and_puts_both_qps_in_err() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 4096, 4096);
    bed.server.post_recv(conn.child, 10, 64).unwrap();
    let sge = [Sge::new(local, 0, 64)];
    let mut bad = remote.start();
    bad.rkey ^= 0x00FF_FF00;
    let op = SendOp::Write {
        remote: bad,
        imm: None,
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, op, &sge))
        .unwrap();
    let failed = one(&mut bed.client, conn.client.id);
    let responder = completions(&mut bed.server, conn.child, 1);
    println!(
        "rxe: WRITE with a bad rkey: requester {} {} byte_len {}; responder {:?}",
        failed.status,
        failed.opcode,
        failed.byte_len,
        responder
            .iter()
            .map(|wc| (wc.wr_id, wc.status, wc.opcode))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        (failed.wr_id, failed.status, failed.opcode, failed.byte_len),
        (1, WcStatus::RemAccessErr, WcOpcode::RdmaWrite, 0)
    );
    assert_eq!(
        bed.client.id_machine(conn.client.id).unwrap().qp(),
        Some(QpState::Err)
    );
    // The responder went to ERR too: its posted receive is flushed.
    assert_eq!(responder.len(), 1, "the responder's receive completes");
    assert_eq!(
        (responder[0].wr_id, responder[0].status, responder[0].opcode),
        (10, WcStatus::WrFlushErr, WcOpcode::Recv)
    );
    let mut untouched = [1u8; 64];
    bed.server.read_mr(target, 0, &mut untouched).unwrap();
    assert_eq!(untouched, [0; 64], "nothing was written");
    // Work posted after the failure is flushed, with its own opcode.
    let read = SendOp::Read {
        remote: remote.start(),
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(2, read, &sge))
        .unwrap();
    let flushed = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (flushed.wr_id, flushed.status, flushed.opcode),
        (2, WcStatus::WrFlushErr, WcOpcode::RdmaRead)
    );
    release(&mut bed, conn, local, target);
}

#[test]
fn a_write_with_immediate_and_a_bad_rkey_fails_the_receive_it_took() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 64, 64);
    bed.server.post_recv(conn.child, 20, 64).unwrap();
    bed.server.post_recv(conn.child, 21, 64).unwrap();
    let sge = [Sge::new(local, 0, 8)];
    // The region is 64 bytes: 8 bytes at 60 run past its end.
    let op = SendOp::Write {
        remote: remote.at(60).unwrap(),
        imm: Some(1),
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, op, &sge))
        .unwrap();
    let failed = one(&mut bed.client, conn.client.id);
    let responder = completions(&mut bed.server, conn.child, 2);
    println!(
        "rxe: WRITE_WITH_IMM past the region's end: requester {} {}; responder {:?}",
        failed.status,
        failed.opcode,
        responder
            .iter()
            .map(|wc| (wc.wr_id, wc.status, wc.opcode, wc.byte_len))
            .collect::<Vec<_>>()
    );
    assert_eq!(
        (failed.status, failed.opcode),
        (WcStatus::RemAccessErr, WcOpcode::RdmaWrite)
    );
    let seen: Vec<_> = responder
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.opcode, wc.byte_len))
        .collect();
    assert_eq!(
        seen,
        [
            (20, WcStatus::RemAccessErr, WcOpcode::Recv, 0),
            (21, WcStatus::WrFlushErr, WcOpcode::Recv, 0)
        ],
        "the receive the WRITE took fails, the next is flushed"
    );
    release(&mut bed, conn, local, target);
}

/// A client connection to `listener`'s address whose server side is a child on `srq`.
fn connect_on_srq<B: CmBackend>(
    bed: &mut Bed<B>,
    server: &Server,
    srq: cm::api::SrqHandle,
) -> (Client, IdHandle) {
    let client = resolved_client(bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    let granted = bed.server.create_qp_on_srq(req.id, QpCaps::new(), srq).unwrap();
    assert_eq!(granted.max_recv_wr, 0, "no receive queue of its own");
    bed.server.accept(req.id, &ConnParam::new()).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Established);
    expect(&mut bed.server, server.ch, CmEventType::Established);
    (client, req.id)
}

#[test]
fn an_srq_feeds_two_connections_and_reports_its_limit_once() {
    let mut bed = bed!();
    let server = listen(&mut bed, 4);
    let caps = SrqCaps {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
        max_message_size: 256,
    };
    let srq = bed.server.create_srq(server.listener, caps).unwrap();
    for wr in 0..4 {
        bed.server.post_srq_recv(srq, 100 + wr, 256).unwrap();
    }
    assert!(matches!(
        bed.server.post_srq_recv(srq, 1, 257),
        Err(CmError::InvalidArgument {
            call: Call::PostSrqRecv,
            ..
        })
    ));
    assert!(matches!(
        bed.server.arm_srq_limit(srq, 9),
        Err(CmError::InvalidArgument {
            call: Call::ModifySrq,
            ..
        })
    ));
    bed.server.arm_srq_limit(srq, 3).unwrap();
    let (a, child_a) = connect_on_srq(&mut bed, &server, srq);
    let (b, child_b) = connect_on_srq(&mut bed, &server, srq);
    assert!(matches!(
        bed.server.post_recv(child_a, 1, 64),
        Err(CmError::InvalidArgument {
            call: Call::PostRecv,
            ..
        })
    ));
    assert_err(bed.server.destroy_srq(srq), CmError::SrqBusy { qps: 2 });

    // One receive taken leaves 3 posted: not below the limit.
    bed.client.post_send(a.id, 1, b"to a").unwrap();
    let got = one(&mut bed.server, child_a);
    assert_eq!(
        (got.status, got.opcode, got.data.as_slice()),
        (WcStatus::Success, WcOpcode::Recv, &b"to a"[..])
    );
    assert_eq!(
        got.wr_id, 100,
        "the SRQ's first receive: it hands them out in posting order"
    );
    assert_eq!(bed.server.get_async_event(QUIET).unwrap(), None);

    // The second leaves 2: the limit event, for the server's backend even when the client's
    // backend (which shares the device's async fd) looks first.
    bed.client.post_send(b.id, 2, b"to b").unwrap();
    let got = one(&mut bed.server, child_b);
    assert_eq!(
        (got.status, got.data.as_slice()),
        (WcStatus::Success, &b"to b"[..])
    );
    assert_eq!(
        bed.client.get_async_event(QUIET).unwrap(),
        None,
        "not the client's"
    );
    let event = bed.server.get_async_event(WAIT).unwrap();
    println!("rxe: after 2 of 4 receives taken with the limit at 3: {event:?}");
    assert_eq!(event, Some(AsyncEvent::SrqLimitReached { srq }));

    // Disarmed: a third receive taken raises nothing.
    bed.client.post_send(a.id, 3, b"again").unwrap();
    let got = one(&mut bed.server, child_a);
    assert_eq!((got.wr_id, got.status), (102, WcStatus::Success));
    assert_eq!(bed.server.get_async_event(QUIET).unwrap(), None);
    for (id, n) in [(a.id, 2), (b.id, 1)] {
        let sent = completions(&mut bed.client, id, n);
        assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
    }

    // A QP on the SRQ going to ERR flushes none of the SRQ's receives: the other connection
    // still takes the last one.
    bed.client.disconnect(a.id).unwrap();
    expect(&mut bed.server, server.ch, CmEventType::Disconnected);
    bed.server.disconnect(child_a).unwrap();
    expect(&mut bed.client, a.ch, CmEventType::Disconnected);
    let mut after_err = Vec::new();
    bed.server.poll_cq(child_a, &mut after_err, 4, QUIET).unwrap();
    println!(
        "rxe: a QP on the SRQ after its disconnect completes {:?}",
        after_err
            .iter()
            .map(|wc| (wc.wr_id, wc.status))
            .collect::<Vec<_>>()
    );
    assert!(after_err.is_empty(), "no SRQ receive flushed on the QP in ERR");
    bed.client.post_send(b.id, 4, b"last").unwrap();
    let got = one(&mut bed.server, child_b);
    assert_eq!(
        (got.wr_id, got.status, got.data.as_slice()),
        (103, WcStatus::Success, &b"last"[..])
    );
    assert_eq!(one(&mut bed.client, b.id).status, WcStatus::Success);
    destroy_all(&mut bed.client, &[a.id], a.ch);
    bed.server.destroy_qp(child_a).unwrap();
    bed.server.destroy_id(child_a).unwrap();
    bed.client.disconnect(b.id).unwrap();
    expect(&mut bed.server, server.ch, CmEventType::Disconnected);
    bed.server.disconnect(child_b).unwrap();
    expect(&mut bed.client, b.ch, CmEventType::Disconnected);
    destroy_all(&mut bed.client, &[b.id], b.ch);
    bed.server.destroy_qp(child_b).unwrap();
    bed.server.destroy_id(child_b).unwrap();
    // With receives still posted, the SRQ goes (they go with it).
    bed.server.post_srq_recv(srq, 104, 8).unwrap();
    bed.server.destroy_srq(srq).unwrap();
    assert_err(
        bed.server.post_srq_recv(srq, 1, 8),
        CmError::UnknownHandle {
            call: Call::PostSrqRecv,
            kind: HandleKind::Srq,
        },
    );
    destroy_all(&mut bed.server, &[server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn a_read_with_the_rkey_of_a_deregistered_region_fails_at_the_peer() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 4096, 64);
    bed.server.dereg_mr(target).unwrap();
    let sge = [Sge::new(local, 0, 64)];
    let read = SendOp::Read {
        remote: remote.start(),
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, read, &sge))
        .unwrap();
    let failed = one(&mut bed.client, conn.client.id);
    println!(
        "rxe: READ with a deregistered region's rkey: {} {}",
        failed.status, failed.opcode
    );
    assert_eq!(
        (failed.status, failed.opcode),
        (WcStatus::RemAccessErr, WcOpcode::RdmaRead)
    );
    // A zero-length READ skips the key check, but the QP is in ERR by now: flushed.
    let none: [Sge; 0] = [];
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(2, read, &none))
        .unwrap();
    assert_eq!(one(&mut bed.client, conn.client.id).status, WcStatus::WrFlushErr);
    bed.client.dereg_mr(local).unwrap();
    teardown(&mut bed, conn);
}

#[test]
fn a_zero_length_write_needs_no_valid_key() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let none: [Sge; 0] = [];
    let op = SendOp::Write {
        remote: cm::api::RemoteAddr {
            addr: 0xdead_0000,
            rkey: 0x4242,
        },
        imm: None,
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, op, &none))
        .unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    println!(
        "rxe: zero-length WRITE with a made-up key: {} byte_len {}",
        wc.status, wc.byte_len
    );
    assert_eq!(
        (wc.status, wc.opcode, wc.byte_len),
        (WcStatus::Success, WcOpcode::RdmaWrite, 0)
    );
    teardown(&mut bed, conn);
}

/// A connection whose sides connect and accept with `client` and `server`.
fn establish_with<B: CmBackend>(
    bed: &mut Bed<B>,
    client_param: &ConnParam,
    server_param: &ConnParam,
) -> Conn {
    let server = listen(bed, 0);
    let client = resolved_client(bed, server.addr, true);
    bed.client.connect(client.id, client_param).expect("connect");
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    bed.server
        .create_qp(req.id, QpCaps::new())
        .expect("create_qp (server)");
    bed.server.accept(req.id, server_param).expect("accept");
    expect(&mut bed.client, client.ch, CmEventType::Established);
    expect(&mut bed.server, server.ch, CmEventType::Established);
    Conn {
        server,
        client,
        child: req.id,
    }
}

#[test]
fn a_read_is_refused_at_post_when_the_peer_accepted_no_responder_resources() {
    let mut bed = bed!();
    let none = ConnParam {
        responder_resources: 0,
        ..ConnParam::new()
    };
    let conn = establish_with(&mut bed, &ConnParam::new(), &none);
    let (target, remote, local) = regions(&mut bed, &conn, 64, 64);
    let sge = [Sge::new(local, 0, 8)];
    // The REP's responder resources (0) became the client QP's max_rd_atomic: a READ or an
    // atomic could never be sent (rxe would hold it and everything after it).
    for op in [
        SendOp::Read {
            remote: remote.start(),
        },
        SendOp::FetchAdd {
            remote: remote.start(),
            add: 1,
        },
    ] {
        match bed.client.post_send_wr(conn.client.id, &SendWr::new(1, op, &sge)) {
            Err(e) => assert_eq!(
                e,
                CmError::InvalidArgument {
                    call: Call::PostSend,
                    reason: "RDMA READ and atomics need an initiator depth above 0",
                }
            ),
            Ok(()) => {
                let wc = one(&mut bed.client, conn.client.id);
                panic!(
                    "rxe: the client QP had an initiator depth after all; {} completed {} {}",
                    op.name(),
                    wc.status,
                    wc.opcode
                );
            }
        }
    }
    // A WRITE needs no depth.
    let write = SendOp::Write {
        remote: remote.start(),
        imm: None,
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(2, write, &sge))
        .unwrap();
    assert_eq!(one(&mut bed.client, conn.client.id).status, WcStatus::Success);
    release(&mut bed, conn, local, target);
}

#[test]
fn a_write_with_immediate_waits_for_a_receive_and_fails_when_its_rnr_retries_run_out() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (target, remote, local) = regions(&mut bed, &conn, 64, 64);
    let sge = [Sge::new(local, 0, 8)];
    let op = SendOp::Write {
        remote: remote.start(),
        imm: Some(9),
    };
    // Seven RNR retries mean forever: it waits, as a SEND does, until a receive is posted.
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, op, &sge))
        .unwrap();
    let mut early = Vec::new();
    bed.client.poll_cq(conn.client.id, &mut early, 1, QUIET).unwrap();
    assert!(early.is_empty(), "no receive at the peer: not complete yet");
    bed.server.post_recv(conn.child, 5, 0).unwrap();
    let got = one(&mut bed.server, conn.child);
    assert_eq!(
        (got.wr_id, got.status, got.opcode, got.byte_len, got.imm_data),
        (5, WcStatus::Success, WcOpcode::RecvRdmaWithImm, 8, Some(9))
    );
    assert_eq!(one(&mut bed.client, conn.client.id).status, WcStatus::Success);
    release(&mut bed, conn, local, target);

    // One RNR retry: the requester gives up. Its QP's count is the one the peer sent in the
    // REP (the IB CM sets the active side's `rnr_retry` from the REP, the passive side's from
    // the REQ): the server's accept parameter. Measured: the client's own connect parameter of 1
    // left its WRITE retrying past 10 s.
    let once = ConnParam {
        rnr_retry_count: 1,
        ..ConnParam::new()
    };
    let conn = establish_with(&mut bed, &ConnParam::new(), &once);
    let (target, remote, local) = regions(&mut bed, &conn, 64, 64);
    let sge = [Sge::new(local, 0, 8)];
    let op = SendOp::Write {
        remote: remote.start(),
        imm: Some(9),
    };
    let start = std::time::Instant::now();
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(2, op, &sge))
        .unwrap();
    let failed = one(&mut bed.client, conn.client.id);
    println!(
        "rxe: WRITE_WITH_IMM without a receive, rnr_retry_count 1: {} {} after {} ms",
        failed.status,
        failed.opcode,
        start.elapsed().as_millis()
    );
    assert_eq!(
        (failed.status, failed.opcode),
        (WcStatus::RnrRetryExcErr, WcOpcode::RdmaWrite)
    );
    let mut landed = [1u8; 8];
    bed.server.read_mr(target, 0, &mut landed).unwrap();
    assert_eq!(landed, [0; 8], "nothing of the refused WRITE was placed");
    release(&mut bed, conn, local, target);
}

#[test]
fn pipelined_fetch_adds_execute_in_posting_order_and_a_long_write_is_not_capped_at_8_mib() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let id = conn.client.id;
    let (counter, remote) = remote_region(&mut bed.server, conn.child, 8);
    let local = bed.client.reg_mr(id, 16 * 8, Access::LOCAL_WRITE).unwrap();
    let depth = QpCaps::new().max_send_wr;
    for i in 0..u64::from(depth) {
        let old = [Sge::new(local, i * 8, 8)];
        let add = SendOp::FetchAdd {
            remote: remote.start(),
            add: 1,
        };
        bed.client.post_send_wr(id, &SendWr::new(i, add, &old)).unwrap();
    }
    let got = completions(&mut bed.client, id, depth as usize);
    let ids: Vec<u64> = got.iter().map(|wc| wc.wr_id).collect();
    assert_eq!(ids, (0..u64::from(depth)).collect::<Vec<_>>());
    assert!(got
        .iter()
        .all(|wc| (wc.status, wc.byte_len) == (WcStatus::Success, 8)));
    let olds: Vec<u64> = (0..u64::from(depth))
        .map(|i| read_u64(&bed.client, local, i * 8))
        .collect();
    assert_eq!(
        olds,
        (0..u64::from(depth)).collect::<Vec<_>>(),
        "one at a time, in order"
    );
    assert_eq!(read_u64(&bed.server, counter, 0), u64::from(depth));
    bed.client.dereg_mr(local).unwrap();
    bed.server.dereg_mr(counter).unwrap();

    // 9 MiB in one WRITE: past the port's max_msg_sz of 8 MiB, which rxe does not enforce.
    const LONG: usize = 9 << 20;
    let (target, remote) = remote_region(&mut bed.server, conn.child, LONG);
    let source = bed.client.reg_mr(id, LONG, Access::NONE).unwrap();
    bed.client.write_mr(source, (LONG - 4) as u64, b"tail").unwrap();
    let sge = [Sge::new(source, 0, LONG as u32)];
    let write = SendOp::Write {
        remote: remote.start(),
        imm: None,
    };
    let start = std::time::Instant::now();
    bed.client
        .post_send_wr(id, &SendWr::new(99, write, &sge))
        .unwrap();
    let wc = one(&mut bed.client, id);
    println!(
        "rxe: a 9 MiB WRITE: {} after {} ms",
        wc.status,
        start.elapsed().as_millis()
    );
    assert_eq!(wc.status, WcStatus::Success);
    let mut tail = [0u8; 4];
    bed.server.read_mr(target, (LONG - 4) as u64, &mut tail).unwrap();
    assert_eq!(&tail, b"tail");
    bed.client.dereg_mr(source).unwrap();
    bed.server.dereg_mr(target).unwrap();
    teardown(&mut bed, conn);
}

#[test]
fn dropping_backends_with_regions_an_srq_and_a_qp_on_it_releases_them_without_hanging() {
    let mut bed = bed!();
    let server = listen(&mut bed, 1);
    let srq = bed.server.create_srq(server.listener, SrqCaps::new()).unwrap();
    bed.server.post_srq_recv(srq, 1, 64).unwrap();
    let (client, child) = connect_on_srq(&mut bed, &server, srq);
    let (_target, remote) = remote_region(&mut bed.server, child, 4096);
    let local = bed.client.reg_mr(client.id, 64, Access::LOCAL_WRITE).unwrap();
    // Work in flight on both sides: an unpolled receive completion on the SRQ QP, an
    // unpolled WRITE completion on the client.
    bed.client.post_send(client.id, 2, b"unpolled").unwrap();
    let sge = [Sge::new(local, 0, 8)];
    let write = SendOp::Write {
        remote: remote.start(),
        imm: None,
    };
    bed.client
        .post_send_wr(client.id, &SendWr::new(3, write, &sge))
        .unwrap();
    let_time_pass(&mut bed.server);
    let live = bed.server.live_resources();
    assert_eq!((live.mrs, live.srqs, live.qps), (1, 1, 1));
    // QPs go first, then the SRQ, then the regions, then the PDs: each release finds nothing
    // still using what it frees.
    drop(bed);
    let mut again = bed!();
    let conn = establish(&mut again);
    teardown(&mut again, conn);
}
