//! One-sided RDMA on every backend: memory regions, RDMA WRITE (with an immediate or without),
//! READ, compare-and-swap and fetch-and-add over scatter/gather lists, signalled and not,
//! fenced, the errors a responder's NIC answers (rxe on Linux 6.1 is the reference: see
//! README's one-sided model), the refusals at posting, and shared receive queues with their
//! limit event.

use cm::api::{
    Access, AsyncEvent, Call, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdHandle, MrHandle,
    MrInfo, QpCaps, QpState, RemoteAddr, SendOp, SendWr, Sge, SrqCaps, WcOpcode, WcStatus, WorkCompletion,
};

use crate::support::*;

/// A region of `len` bytes on `id`'s device, and what it is known by.
fn region<B: CmBackend>(b: &mut B, id: IdHandle, len: usize, access: Access) -> (MrHandle, MrInfo) {
    let mr = b.reg_mr(id, len, access).expect("reg_mr");
    let info = b.mr_info(mr).expect("mr_info");
    assert_eq!(
        (info.len, info.access),
        (len as u64, access),
        "the region is what was asked"
    );
    (mr, info)
}

fn bytes<B: CmBackend>(b: &B, mr: MrHandle, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    b.read_mr(mr, offset, &mut out).expect("read_mr");
    out
}

fn u64_at<B: CmBackend>(b: &B, mr: MrHandle, offset: u64) -> u64 {
    u64::from_ne_bytes(bytes(b, mr, offset, 8).try_into().unwrap())
}

/// `(wr_id, opcode, status)` of each completion.
fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcOpcode, WcStatus)> {
    wcs.iter().map(|wc| (wc.wr_id, wc.opcode, wc.status)).collect()
}

/// One completion of `id`'s CQ, which must come.
#[track_caller]
fn one<B: CmBackend>(b: &mut B, id: IdHandle) -> WorkCompletion {
    let mut got = completions(b, id, 1);
    assert_eq!(got.len(), 1, "one completion within {WAIT:?}");
    got.remove(0)
}

/// No completion on `id`'s CQ for a while.
#[track_caller]
fn no_completion<B: CmBackend>(b: &mut B, id: IdHandle) {
    let mut out = Vec::new();
    let n = b.poll_cq(id, &mut out, 4, QUIET).expect("poll_cq");
    assert_eq!(n, 0, "expected no completion, got {:?}", summary(&out));
}

/// The server's region of `len` bytes with every access, and the remote address of its start.
fn server_region<B: CmBackend>(bed: &mut Bed<B>, conn: &Conn, len: usize) -> (MrHandle, RemoteAddr) {
    let (mr, info) = region(&mut bed.server, conn.child, len, Access::ALL);
    (mr, info.remote().start())
}

/// A second connection from the client backend to `conn`'s server.
fn second_connection<B: CmBackend>(bed: &mut Bed<B>, conn: &Conn) -> (Client, IdHandle) {
    let client = resolved_client(bed, conn.server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).expect("connect");
    let req = expect(&mut bed.server, conn.server.ch, CmEventType::ConnectRequest);
    bed.server.create_qp(req.id, QpCaps::new()).expect("create_qp");
    bed.server.accept(req.id, &ConnParam::new()).expect("accept");
    expect(&mut bed.client, client.ch, CmEventType::Established);
    expect(&mut bed.server, conn.server.ch, CmEventType::Established);
    (client, req.id)
}

/// QPs whose work requests take two scatter/gather entries.
fn two_entries() -> QpCaps {
    QpCaps {
        max_send_sge: 2,
        max_recv_sge: 2,
        ..QpCaps::new()
    }
}

/// Deregisters `mrs` on `b`.
fn dereg<B: CmBackend>(b: &mut B, mrs: &[MrHandle]) {
    for &mr in mrs {
        b.dereg_mr(mr).expect("dereg_mr");
    }
}

#[test]
fn a_region_holds_what_is_written_and_refuses_ranges_outside_it() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (mr, info) = region(&mut bed.client, conn.client.id, 64, Access::LOCAL_WRITE);
    assert_eq!(
        bytes(&bed.client, mr, 0, 64),
        vec![0; 64],
        "a new region is zeroed"
    );
    assert_eq!(info.addr % 8, 0, "aligned for atomics");
    bed.client.write_mr(mr, 60, b"tail").unwrap();
    bed.client.write_mr(mr, 0, b"head").unwrap();
    assert_eq!(bytes(&bed.client, mr, 60, 4), b"tail");
    assert_eq!(bytes(&bed.client, mr, 0, 4), b"head");
    assert_eq!(bytes(&bed.client, mr, 64, 0), b"", "an empty range at the end");
    let outside = CmError::InvalidArgument {
        call: Call::WriteMr,
        reason: "range outside the memory region",
    };
    assert_err(bed.client.write_mr(mr, 61, b"tail"), outside);
    let mut buf = [0; 2];
    assert_err(
        bed.client.read_mr(mr, 63, &mut buf),
        CmError::InvalidArgument {
            call: Call::ReadMr,
            reason: "range outside the memory region",
        },
    );
    assert_err(
        bed.client.read_mr(mr, u64::MAX, &mut buf),
        CmError::InvalidArgument {
            call: Call::ReadMr,
            reason: "range outside the memory region",
        },
    );
    assert_eq!(bed.client.live_resources().mrs, 1);
    bed.client.dereg_mr(mr).unwrap();
    let gone = CmError::UnknownHandle {
        call: Call::DeregMr,
        kind: HandleKind::Mr,
    };
    assert_err(bed.client.dereg_mr(mr), gone);
    assert_err(
        bed.client.read_mr(mr, 0, &mut buf),
        CmError::UnknownHandle {
            call: Call::ReadMr,
            kind: HandleKind::Mr,
        },
    );
    assert_err(
        bed.client.mr_info(mr),
        CmError::UnknownHandle {
            call: Call::RegMr,
            kind: HandleKind::Mr,
        },
    );
    assert_eq!(bed.client.live_resources().mrs, 0);
    teardown(&mut bed, conn);
}

#[test]
fn registration_needs_a_device_a_length_and_local_write_for_remote_writes() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, cm::api::PortSpace::Tcp).unwrap();
    assert_err(
        b.reg_mr(id, 64, Access::LOCAL_WRITE),
        CmError::NoDevice { call: Call::RegMr },
    );
    b.bind_addr(id, std::net::SocketAddr::new(bed.client_ip, 0))
        .unwrap();
    assert_err(
        b.reg_mr(id, 64, Access::REMOTE_WRITE),
        CmError::InvalidArgument {
            call: Call::RegMr,
            reason: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
        },
    );
    assert!(matches!(
        b.reg_mr(id, 0, Access::LOCAL_WRITE),
        Err(CmError::InvalidArgument {
            call: Call::RegMr,
            ..
        })
    ));
    // The region belongs to the device, not the id: it outlives the id it was made through.
    let mr = b.reg_mr(id, 16, Access::NONE).unwrap();
    b.destroy_id(id).unwrap();
    b.write_mr(mr, 0, b"still here").unwrap();
    assert_eq!(bytes(b, mr, 0, 10), b"still here");
    b.dereg_mr(mr).unwrap();
    b.destroy_event_channel(ch).unwrap();
    assert_clean(&bed);
}

#[test]
fn regions_of_another_backend_and_forged_ones_are_unknown() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (theirs, _) = region(&mut bed.server, conn.child, 8, Access::LOCAL_WRITE);
    let forged = cm::api::backend::mr_handle(theirs.owner(), theirs.index() + 7, 0);
    for mr in [theirs, forged] {
        assert_err(
            bed.client.write_mr(mr, 0, b"x"),
            CmError::UnknownHandle {
                call: Call::WriteMr,
                kind: HandleKind::Mr,
            },
        );
        let sge = [Sge::new(mr, 0, 1)];
        let wr = SendWr::new(1, SendOp::Send { imm: None }, &sge);
        assert_err(
            bed.client.post_send_wr(conn.client.id, &wr),
            CmError::UnknownHandle {
                call: Call::PostSend,
                kind: HandleKind::Mr,
            },
        );
    }
    no_completion(&mut bed.client, conn.client.id);
    dereg(&mut bed.server, &[theirs]);
    teardown(&mut bed, conn);
}

#[test]
fn rdma_write_gathers_its_entries_into_the_peers_region() {
    let mut bed = bed!();
    let conn = establish_with_caps(&mut bed, two_entries());
    let (table, remote) = server_region(&mut bed, &conn, 64);
    let (src, _) = region(&mut bed.client, conn.client.id, 32, Access::NONE);
    bed.client.write_mr(src, 0, b"hello, ").unwrap();
    bed.client.write_mr(src, 16, b"world").unwrap();
    let sge = [Sge::new(src, 0, 7), Sge::new(src, 16, 5)];
    let at = RemoteAddr {
        addr: remote.addr + 8,
        ..remote
    };
    let wr = SendWr::new(
        7,
        SendOp::Write {
            remote: at,
            imm: None,
        },
        &sge,
    );
    bed.client.post_send_wr(conn.client.id, &wr).unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (7, WcOpcode::RdmaWrite, WcStatus::Success)
    );
    assert_eq!(bytes(&bed.server, table, 8, 12), b"hello, world");
    assert_eq!(
        bytes(&bed.server, table, 0, 8),
        vec![0; 8],
        "nothing before the target"
    );
    no_completion(&mut bed.server, conn.child);
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn rdma_read_scatters_the_peers_bytes_into_local_entries() {
    let mut bed = bed!();
    let conn = establish_with_caps(&mut bed, two_entries());
    let (table, remote) = server_region(&mut bed, &conn, 64);
    bed.server.write_mr(table, 4, b"0123456789").unwrap();
    let (dst, _) = region(&mut bed.client, conn.client.id, 32, Access::LOCAL_WRITE);
    let sge = [Sge::new(dst, 20, 4), Sge::new(dst, 0, 6)];
    let at = RemoteAddr {
        addr: remote.addr + 4,
        ..remote
    };
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(3, SendOp::Read { remote: at }, &sge))
        .unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (3, WcOpcode::RdmaRead, WcStatus::Success, 10)
    );
    assert_eq!(bytes(&bed.client, dst, 20, 4), b"0123");
    assert_eq!(bytes(&bed.client, dst, 0, 6), b"456789");
    dereg(&mut bed.client, &[dst]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn write_with_immediate_takes_a_receive_and_reports_the_immediate_and_length() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 64);
    let (src, _) = region(&mut bed.client, conn.client.id, 16, Access::NONE);
    bed.client.write_mr(src, 0, b"entry 42").unwrap();
    bed.server.post_recv(conn.child, 90, 0).unwrap();
    let sge = [Sge::new(src, 0, 8)];
    let wr = SendWr::new(
        5,
        SendOp::Write {
            remote,
            imm: Some(0xC0FFEE),
        },
        &sge,
    );
    bed.client.post_send_wr(conn.client.id, &wr).unwrap();
    let got = one(&mut bed.server, conn.child);
    assert_eq!(
        (got.wr_id, got.opcode, got.status, got.byte_len, got.imm_data),
        (
            90,
            WcOpcode::RecvRdmaWithImm,
            WcStatus::Success,
            8,
            Some(0xC0FFEE)
        )
    );
    assert!(
        got.data.is_empty(),
        "the bytes went to the region, not the receive"
    );
    assert_eq!(bytes(&bed.server, table, 0, 8), b"entry 42");
    let sent = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (sent.wr_id, sent.opcode, sent.status),
        (5, WcOpcode::RdmaWrite, WcStatus::Success)
    );
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn a_send_from_a_region_lands_in_a_receive_with_its_immediate() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (src, _) = region(&mut bed.client, conn.client.id, 16, Access::NONE);
    bed.client.write_mr(src, 0, b"gathered").unwrap();
    bed.server.post_recv(conn.child, 1, 64).unwrap();
    bed.server.post_recv(conn.child, 2, 64).unwrap();
    let sge = [Sge::new(src, 0, 8)];
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(10, SendOp::Send { imm: Some(7) }, &sge),
        )
        .unwrap();
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(11, SendOp::Send { imm: None }, &sge[..0]),
        )
        .unwrap();
    let got = completions(&mut bed.server, conn.child, 2);
    let seen: Vec<_> = got
        .iter()
        .map(|wc| {
            (
                wc.wr_id,
                wc.opcode,
                wc.status,
                wc.byte_len,
                wc.data.clone(),
                wc.imm_data,
            )
        })
        .collect();
    assert_eq!(
        seen,
        [
            (
                1,
                WcOpcode::Recv,
                WcStatus::Success,
                8,
                b"gathered".to_vec(),
                Some(7)
            ),
            (2, WcOpcode::Recv, WcStatus::Success, 0, Vec::new(), None),
        ]
    );
    let sent = completions(&mut bed.client, conn.client.id, 2);
    assert_eq!(
        summary(&sent),
        [
            (10, WcOpcode::Send, WcStatus::Success),
            (11, WcOpcode::Send, WcStatus::Success)
        ]
    );
    dereg(&mut bed.client, &[src]);
    teardown(&mut bed, conn);
}

#[test]
fn compare_and_swap_swaps_only_on_a_match_and_returns_the_old_value() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (lock, remote) = server_region(&mut bed, &conn, 16);
    bed.server.write_mr(lock, 8, &5u64.to_ne_bytes()).unwrap();
    let at = RemoteAddr {
        addr: remote.addr + 8,
        ..remote
    };
    let (old, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
    let sge = [Sge::new(old, 0, 8)];
    let cas = |wr_id, compare, swap| {
        SendWr::new(
            wr_id,
            SendOp::CompareSwap {
                remote: at,
                compare,
                swap,
            },
            &sge,
        )
    };
    bed.client.post_send_wr(conn.client.id, &cas(1, 4, 9)).unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status, wc.byte_len),
        (1, WcOpcode::CompSwap, WcStatus::Success, 8)
    );
    assert_eq!(u64_at(&bed.client, old, 0), 5, "the value found");
    assert_eq!(u64_at(&bed.server, lock, 8), 5, "no match, no swap");
    bed.client.post_send_wr(conn.client.id, &cas(2, 5, 9)).unwrap();
    assert_eq!(one(&mut bed.client, conn.client.id).status, WcStatus::Success);
    assert_eq!(u64_at(&bed.client, old, 0), 5);
    assert_eq!(u64_at(&bed.server, lock, 8), 9, "a match swaps");
    dereg(&mut bed.client, &[old]);
    dereg(&mut bed.server, &[lock]);
    teardown(&mut bed, conn);
}

#[test]
fn fetch_and_add_from_two_connections_counts_every_increment_once() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (second, second_child) = second_connection(&mut bed, &conn);
    let (counter, remote) = server_region(&mut bed, &conn, 8);
    bed.server.write_mr(counter, 0, &100u64.to_ne_bytes()).unwrap();
    let ids = [conn.client.id, second.id];
    let olds = ids.map(|id| region(&mut bed.client, id, 8, Access::LOCAL_WRITE).0);
    const ROUNDS: u64 = 10;
    let mut seen = Vec::new();
    for round in 0..ROUNDS {
        // Both connections have an increment in flight at once.
        for (k, (&id, &old)) in ids.iter().zip(&olds).enumerate() {
            let sge = [Sge::new(old, 0, 8)];
            let wr = SendWr::new(round * 2 + k as u64, SendOp::FetchAdd { remote, add: 1 }, &sge);
            bed.client.post_send_wr(id, &wr).unwrap();
        }
        for (&id, &old) in ids.iter().zip(&olds) {
            let wc = one(&mut bed.client, id);
            assert_eq!((wc.opcode, wc.status), (WcOpcode::FetchAdd, WcStatus::Success));
            seen.push(u64_at(&bed.client, old, 0));
        }
    }
    assert_eq!(u64_at(&bed.server, counter, 0), 100 + 2 * ROUNDS);
    seen.sort_unstable();
    let want: Vec<u64> = (100..100 + 2 * ROUNDS).collect();
    assert_eq!(seen, want, "each increment saw a value of its own");
    dereg(&mut bed.client, &olds);
    dereg(&mut bed.server, &[counter]);
    bed.client.disconnect(second.id).unwrap();
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    bed.server.disconnect(second_child).unwrap();
    expect(&mut bed.client, second.ch, CmEventType::Disconnected);
    destroy_all(&mut bed.client, &[second.id], second.ch);
    bed.server.destroy_qp(second_child).unwrap();
    bed.server.destroy_id(second_child).unwrap();
    teardown(&mut bed, conn);
}

#[test]
fn unsignalled_requests_complete_silently_and_free_their_slots() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let depth = u64::from(QpCaps::new().max_send_wr);
    let (table, remote) = server_region(&mut bed, &conn, 8 * depth as usize);
    let (src, _) = region(&mut bed.client, conn.client.id, 8 * depth as usize, Access::NONE);
    // Twice the queue's depth of writes, the last of each queue's worth signalled: the
    // unsignalled ones must have given their slots back for the second round to be posted.
    for round in 0..2u64 {
        for k in 0..depth {
            bed.client
                .write_mr(src, 8 * k, &(round * 100 + k).to_ne_bytes())
                .unwrap();
            let sge = [Sge::new(src, 8 * k, 8)];
            let at = RemoteAddr {
                addr: remote.addr + 8 * k,
                ..remote
            };
            let wr = SendWr::new(
                round * 100 + k,
                SendOp::Write {
                    remote: at,
                    imm: None,
                },
                &sge,
            );
            let wr = if k + 1 == depth { wr } else { wr.unsignaled() };
            bed.client.post_send_wr(conn.client.id, &wr).unwrap();
        }
        let wc = one(&mut bed.client, conn.client.id);
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status),
            (round * 100 + depth - 1, WcOpcode::RdmaWrite, WcStatus::Success),
            "only the signalled write completes visibly"
        );
        for k in 0..depth {
            assert_eq!(u64_at(&bed.server, table, 8 * k), round * 100 + k);
        }
    }
    no_completion(&mut bed.client, conn.client.id);
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn completions_come_in_posting_order_across_operations() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 32);
    let (mine, _) = region(&mut bed.client, conn.client.id, 32, Access::LOCAL_WRITE);
    bed.server.post_recv(conn.child, 50, 64).unwrap();
    let at = |off: u64| RemoteAddr {
        addr: remote.addr + off,
        ..remote
    };
    let s = |off, len| [Sge::new(mine, off, len)];
    let (w, r, f, snd) = (s(0, 8), s(8, 8), s(16, 8), s(24, 8));
    let wrs = [
        SendWr::new(1, SendOp::Read { remote: at(16) }, &r),
        SendWr::new(
            2,
            SendOp::Write {
                remote: at(0),
                imm: None,
            },
            &w,
        ),
        SendWr::new(3, SendOp::Send { imm: None }, &snd),
        SendWr::new(
            4,
            SendOp::FetchAdd {
                remote: at(8),
                add: 3,
            },
            &f,
        ),
        SendWr::new(
            5,
            SendOp::Write {
                remote: at(24),
                imm: None,
            },
            &w,
        ),
    ];
    for wr in &wrs {
        bed.client.post_send_wr(conn.client.id, wr).unwrap();
    }
    let got = completions(&mut bed.client, conn.client.id, wrs.len());
    assert_eq!(
        summary(&got),
        [
            (1, WcOpcode::RdmaRead, WcStatus::Success),
            (2, WcOpcode::RdmaWrite, WcStatus::Success),
            (3, WcOpcode::Send, WcStatus::Success),
            (4, WcOpcode::FetchAdd, WcStatus::Success),
            (5, WcOpcode::RdmaWrite, WcStatus::Success),
        ]
    );
    assert_eq!(u64_at(&bed.server, table, 8), 3);
    assert_eq!(one(&mut bed.server, conn.child).wr_id, 50);
    dereg(&mut bed.client, &[mine]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn a_fenced_write_after_a_read_of_the_same_bytes_leaves_the_read_the_old_value() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 8);
    bed.server.write_mr(table, 0, b"old old!").unwrap();
    let (mine, _) = region(&mut bed.client, conn.client.id, 16, Access::LOCAL_WRITE);
    bed.client.write_mr(mine, 8, b"new new!").unwrap();
    let read = [Sge::new(mine, 0, 8)];
    let write = [Sge::new(mine, 8, 8)];
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &read))
        .unwrap();
    let fenced = SendWr::new(2, SendOp::Write { remote, imm: None }, &write).fenced();
    bed.client.post_send_wr(conn.client.id, &fenced).unwrap();
    let got = completions(&mut bed.client, conn.client.id, 2);
    assert_eq!(
        summary(&got),
        [
            (1, WcOpcode::RdmaRead, WcStatus::Success),
            (2, WcOpcode::RdmaWrite, WcStatus::Success)
        ]
    );
    assert_eq!(bytes(&bed.client, mine, 0, 8), b"old old!");
    assert_eq!(bytes(&bed.server, table, 0, 8), b"new new!");
    dereg(&mut bed.client, &[mine]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

/// After a remote error both QPs are in ERR: what each still holds, or is posted, flushes.
#[track_caller]
fn both_sides_failed<B: CmBackend>(bed: &mut Bed<B>, conn: &Conn, server_recv: u64) {
    let flushed = one(&mut bed.server, conn.child);
    assert_eq!(
        (flushed.wr_id, flushed.status),
        (server_recv, WcStatus::WrFlushErr),
        "the responder's QP went to ERR too (rxe's class C error)"
    );
    bed.client.post_recv(conn.client.id, 77, 8).unwrap();
    let late = one(&mut bed.client, conn.client.id);
    assert_eq!((late.wr_id, late.status), (77, WcStatus::WrFlushErr));
    for (b, id) in [(&bed.server, conn.child), (&bed.client, conn.client.id)] {
        assert_eq!(b.id_machine(id).unwrap().qp(), Some(QpState::Err));
    }
}

#[test]
fn a_bad_remote_key_fails_with_remote_access_error_and_moves_both_qps_to_err() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 8);
    bed.server.post_recv(conn.child, 60, 8).unwrap();
    let (src, _) = region(&mut bed.client, conn.client.id, 8, Access::NONE);
    let sge = [Sge::new(src, 0, 8)];
    let bad = RemoteAddr {
        rkey: remote.rkey ^ 0x5500,
        ..remote
    };
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote: bad,
                    imm: None,
                },
                &sge,
            ),
        )
        .unwrap();
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(2, SendOp::Write { remote, imm: None }, &sge).unsignaled(),
        )
        .unwrap();
    let got = completions(&mut bed.client, conn.client.id, 2);
    assert_eq!(
        summary(&got),
        [
            (1, WcOpcode::RdmaWrite, WcStatus::RemAccessErr),
            (2, WcOpcode::RdmaWrite, WcStatus::WrFlushErr)
        ],
        "the failed request, then the rest flushed (unsignalled or not)"
    );
    assert_eq!(bytes(&bed.server, table, 0, 8), vec![0; 8], "nothing was written");
    both_sides_failed(&mut bed, &conn, 60);
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn a_range_past_the_peers_region_writes_nothing_and_fails() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 16);
    bed.server.post_recv(conn.child, 61, 8).unwrap();
    let (src, _) = region(&mut bed.client, conn.client.id, 16, Access::NONE);
    bed.client.write_mr(src, 0, &[0xAB; 16]).unwrap();
    let sge = [Sge::new(src, 0, 16)];
    let past = RemoteAddr {
        addr: remote.addr + 8,
        ..remote
    };
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote: past,
                    imm: None,
                },
                &sge,
            ),
        )
        .unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RemAccessErr));
    assert_eq!(
        bytes(&bed.server, table, 0, 16),
        vec![0; 16],
        "not even the part that fits"
    );
    both_sides_failed(&mut bed, &conn, 61);
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn an_operation_the_peers_region_does_not_grant_fails_with_remote_access_error() {
    // Each operation against a region registered with every access but its own.
    let cases = [
        (
            Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_ATOMIC,
            "write",
        ),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_ATOMIC,
            "read",
        ),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            "atomic",
        ),
    ];
    for (access, what) in cases {
        let mut bed = bed!();
        let conn = establish(&mut bed);
        let (table, info) = region(&mut bed.server, conn.child, 8, access);
        let remote = info.remote().start();
        bed.server.post_recv(conn.child, 62, 8).unwrap();
        let (mine, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
        let sge = [Sge::new(mine, 0, 8)];
        let op = match what {
            "write" => SendOp::Write { remote, imm: None },
            "read" => SendOp::Read { remote },
            _ => SendOp::FetchAdd { remote, add: 1 },
        };
        bed.client
            .post_send_wr(conn.client.id, &SendWr::new(1, op, &sge))
            .unwrap();
        let wc = one(&mut bed.client, conn.client.id);
        assert_eq!(
            (wc.wr_id, wc.status),
            (1, WcStatus::RemAccessErr),
            "{what} on {access}"
        );
        assert_eq!(bytes(&bed.server, table, 0, 8), vec![0; 8], "{what}: untouched");
        both_sides_failed(&mut bed, &conn, 62);
        dereg(&mut bed.client, &[mine]);
        dereg(&mut bed.server, &[table]);
        teardown(&mut bed, conn);
    }
}

#[test]
fn a_deregistered_regions_key_is_refused_by_the_peer() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 8);
    bed.server.dereg_mr(table).unwrap();
    // A new region must not answer for the old key.
    let (fresh, _) = server_region(&mut bed, &conn, 8);
    bed.server.post_recv(conn.child, 63, 8).unwrap();
    let (dst, _) = region(&mut bed.client, conn.client.id, 8, Access::LOCAL_WRITE);
    let sge = [Sge::new(dst, 0, 8)];
    bed.client
        .post_send_wr(conn.client.id, &SendWr::new(1, SendOp::Read { remote }, &sge))
        .unwrap();
    let wc = one(&mut bed.client, conn.client.id);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (1, WcOpcode::RdmaRead, WcStatus::RemAccessErr)
    );
    both_sides_failed(&mut bed, &conn, 63);
    dereg(&mut bed.client, &[dst]);
    dereg(&mut bed.server, &[fresh]);
    teardown(&mut bed, conn);
}

#[test]
fn zero_length_reads_and_writes_succeed_whatever_the_key() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let nowhere = RemoteAddr {
        addr: 0xdead_0000,
        rkey: 0x1234_5678,
    };
    let wrs = [
        SendWr::new(
            1,
            SendOp::Write {
                remote: nowhere,
                imm: None,
            },
            &[],
        ),
        SendWr::new(2, SendOp::Read { remote: nowhere }, &[]),
    ];
    for wr in &wrs {
        bed.client.post_send_wr(conn.client.id, wr).unwrap();
    }
    let got = completions(&mut bed.client, conn.client.id, 2);
    assert_eq!(
        summary(&got),
        [
            (1, WcOpcode::RdmaWrite, WcStatus::Success),
            (2, WcOpcode::RdmaRead, WcStatus::Success)
        ]
    );
    assert_eq!(got[1].byte_len, 0);
    teardown(&mut bed, conn);
}

#[test]
fn write_with_immediate_and_a_bad_key_fails_the_receive_it_took() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (src, _) = region(&mut bed.client, conn.client.id, 8, Access::NONE);
    bed.server.post_recv(conn.child, 64, 8).unwrap();
    bed.server.post_recv(conn.child, 65, 8).unwrap();
    let sge = [Sge::new(src, 0, 8)];
    let bogus = RemoteAddr {
        addr: 0x1000,
        rkey: 0x77,
    };
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(
                1,
                SendOp::Write {
                    remote: bogus,
                    imm: Some(1),
                },
                &sge,
            ),
        )
        .unwrap();
    assert_eq!(
        one(&mut bed.client, conn.client.id).status,
        WcStatus::RemAccessErr
    );
    let got = completions(&mut bed.server, conn.child, 2);
    assert_eq!(
        got.iter().map(|wc| (wc.wr_id, wc.status)).collect::<Vec<_>>(),
        [(64, WcStatus::RemAccessErr), (65, WcStatus::WrFlushErr)],
        "the receive the write took fails, the next is flushed"
    );
    dereg(&mut bed.client, &[src]);
    teardown(&mut bed, conn);
}

#[test]
fn posting_refuses_what_verbs_would_refuse_and_what_would_fail_locally() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, 16);
    let (ro, _) = region(&mut bed.client, conn.client.id, 16, Access::NONE);
    let (rw, _) = region(&mut bed.client, conn.client.id, 16, Access::LOCAL_WRITE);
    let id = conn.client.id;
    let refused = |reason| CmError::InvalidArgument {
        call: Call::PostSend,
        reason,
    };
    let odd = RemoteAddr {
        addr: remote.addr + 4,
        ..remote
    };
    let eight = [Sge::new(rw, 0, 8)];
    let four = [Sge::new(rw, 0, 4)];
    let read_only = [Sge::new(ro, 0, 8)];
    let past_end = [Sge::new(rw, 12, 8)];
    let cases: Vec<(SendWr<'_>, CmError)> = vec![
        (
            SendWr::new(1, SendOp::FetchAdd { remote: odd, add: 1 }, &eight),
            refused("an atomic's remote address must be 8-byte aligned"),
        ),
        (
            SendWr::new(
                2,
                SendOp::CompareSwap {
                    remote,
                    compare: 0,
                    swap: 1,
                },
                &four,
            ),
            refused("an atomic needs one scatter/gather entry of 8 bytes"),
        ),
        (
            SendWr::new(3, SendOp::Read { remote }, &read_only),
            refused("a READ's or atomic's destination needs LOCAL_WRITE"),
        ),
        (
            SendWr::new(4, SendOp::Write { remote, imm: None }, &past_end),
            refused("scatter/gather entry outside its memory region"),
        ),
    ];
    for (wr, want) in &cases {
        assert_err(bed.client.post_send_wr(id, wr), want.clone());
    }
    let many = vec![Sge::new(rw, 0, 1); QpCaps::new().max_send_sge as usize + 1];
    assert_err(
        bed.client
            .post_send_wr(id, &SendWr::new(5, SendOp::Write { remote, imm: None }, &many)),
        refused("more scatter/gather entries than max_send_sge"),
    );
    // Nothing was posted, and the QP is as it was: the next request goes through.
    no_completion(&mut bed.client, id);
    bed.client
        .post_send_wr(id, &SendWr::new(6, SendOp::FetchAdd { remote, add: 2 }, &eight))
        .unwrap();
    assert_eq!(one(&mut bed.client, id).status, WcStatus::Success);
    dereg(&mut bed.client, &[ro, rw]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn a_message_longer_than_the_ports_max_msg_sz_is_carried_whole() {
    // rxe reports 8 MiB as the port's max_msg_sz and does not enforce it.
    const LEN: usize = 9 << 20;
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let (table, remote) = server_region(&mut bed, &conn, LEN);
    let (src, _) = region(&mut bed.client, conn.client.id, LEN, Access::NONE);
    bed.client.write_mr(src, LEN as u64 - 4, b"last").unwrap();
    let sge = [Sge::new(src, 0, LEN as u32)];
    bed.client
        .post_send_wr(
            conn.client.id,
            &SendWr::new(1, SendOp::Write { remote, imm: None }, &sge),
        )
        .unwrap();
    assert_eq!(one(&mut bed.client, conn.client.id).status, WcStatus::Success);
    assert_eq!(bytes(&bed.server, table, LEN as u64 - 4, 4), b"last");
    dereg(&mut bed.client, &[src]);
    dereg(&mut bed.server, &[table]);
    teardown(&mut bed, conn);
}

#[test]
fn a_shared_receive_queue_serves_several_connections_and_reports_its_limit() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let caps = SrqCaps::new().with_limit(3);
    // The listener is bound to the server's address, so it has the device the SRQ goes on.
    let srq = bed.server.create_srq(server.listener, caps).expect("create_srq");
    for wr in 0..4 {
        bed.server.post_srq_recv(srq, 100 + wr, 64).unwrap();
    }
    let mut conns = Vec::new();
    for _ in 0..2 {
        let client = resolved_client(&mut bed, server.addr, true);
        bed.client.connect(client.id, &ConnParam::new()).unwrap();
        let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
        bed.server
            .create_qp_on_srq(req.id, QpCaps::new(), srq)
            .expect("create_qp_on_srq");
        assert!(bed.server.id_machine(req.id).unwrap().uses_srq());
        bed.server.accept(req.id, &ConnParam::new()).unwrap();
        expect(&mut bed.client, client.ch, CmEventType::Established);
        expect(&mut bed.server, server.ch, CmEventType::Established);
        conns.push((client, req.id));
    }
    assert_err(
        bed.server.post_recv(conns[0].1, 1, 64),
        CmError::InvalidArgument {
            call: Call::PostRecv,
            reason: "the QP takes its receives from a shared receive queue: post them there",
        },
    );
    assert_err(bed.server.destroy_srq(srq), CmError::SrqBusy { qps: 2 });
    assert!(
        bed.server.get_async_event(QUIET).unwrap().is_none(),
        "posting fires no limit"
    );
    bed.client.post_send(conns[0].0.id, 1, b"first").unwrap();
    let a = one(&mut bed.server, conns[0].1);
    assert_eq!(
        (a.wr_id, a.data.as_slice()),
        (100, &b"first"[..]),
        "the SRQ's oldest receive"
    );
    assert!(
        bed.server.get_async_event(QUIET).unwrap().is_none(),
        "3 left: not below 3"
    );
    bed.client.post_send(conns[1].0.id, 2, b"second").unwrap();
    let b = one(&mut bed.server, conns[1].1);
    assert_eq!((b.wr_id, b.data.as_slice()), (101, &b"second"[..]));
    assert_eq!(
        bed.server.get_async_event(WAIT).unwrap(),
        Some(AsyncEvent::SrqLimitReached { srq }),
        "2 left, below the limit of 3"
    );
    bed.client.post_send(conns[0].0.id, 3, b"third").unwrap();
    assert_eq!(one(&mut bed.server, conns[0].1).wr_id, 102);
    assert!(
        bed.server.get_async_event(QUIET).unwrap().is_none(),
        "the limit disarmed itself"
    );
    bed.server.arm_srq_limit(srq, 2).unwrap();
    bed.client.post_send(conns[1].0.id, 4, b"fourth").unwrap();
    assert_eq!(one(&mut bed.server, conns[1].1).wr_id, 103);
    assert_eq!(
        bed.server.get_async_event(WAIT).unwrap(),
        Some(AsyncEvent::SrqLimitReached { srq })
    );
    assert!(matches!(
        bed.server.arm_srq_limit(srq, caps.max_wr + 1),
        Err(CmError::InvalidArgument {
            call: Call::ModifySrq,
            ..
        })
    ));
    for (i, (client, _)) in conns.iter().enumerate() {
        let sent = one(&mut bed.client, client.id);
        assert_eq!(sent.status, WcStatus::Success, "connection {i}'s sends");
        let sent = one(&mut bed.client, client.id);
        assert_eq!(sent.status, WcStatus::Success, "connection {i}'s sends");
    }
    for (client, child) in conns {
        bed.client.disconnect(client.id).unwrap();
        expect(&mut bed.server, server.ch, CmEventType::Disconnected);
        bed.server.disconnect(child).unwrap();
        expect(&mut bed.client, client.ch, CmEventType::Disconnected);
        destroy_all(&mut bed.client, &[client.id], client.ch);
        bed.server.destroy_qp(child).unwrap();
        bed.server.destroy_id(child).unwrap();
    }
    assert_eq!(bed.server.live_resources().srqs, 1);
    bed.server.destroy_srq(srq).unwrap();
    assert_err(
        bed.server.destroy_srq(srq),
        CmError::UnknownHandle {
            call: Call::DestroySrq,
            kind: HandleKind::Srq,
        },
    );
    destroy_all(&mut bed.server, &[server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn a_shared_receive_queue_is_checked_against_the_device_and_its_depth() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let b = &mut bed.server;
    assert!(matches!(
        b.create_srq(
            server.listener,
            SrqCaps {
                max_wr: 0,
                ..SrqCaps::new()
            }
        ),
        Err(CmError::InvalidArgument {
            call: Call::CreateSrq,
            ..
        })
    ));
    assert!(matches!(
        b.create_srq(server.listener, SrqCaps::new().with_limit(65)),
        Err(CmError::InvalidArgument {
            call: Call::CreateSrq,
            ..
        })
    ));
    let ch = b.create_event_channel().unwrap();
    let unbound = b.create_id(ch, cm::api::PortSpace::Tcp).unwrap();
    assert_err(
        b.create_srq(unbound, SrqCaps::new()),
        CmError::NoDevice {
            call: Call::CreateSrq,
        },
    );
    let srq = b
        .create_srq(
            server.listener,
            SrqCaps {
                max_wr: 2,
                ..SrqCaps::new()
            },
        )
        .unwrap();
    assert!(matches!(
        b.post_srq_recv(srq, 3, 4097),
        Err(CmError::InvalidArgument {
            call: Call::PostSrqRecv,
            ..
        })
    ));
    b.post_srq_recv(srq, 1, 64).unwrap();
    b.post_srq_recv(srq, 2, 64).unwrap();
    assert_err(
        b.post_srq_recv(srq, 3, 64),
        CmError::QueueFull {
            call: Call::PostSrqRecv,
            outstanding: 2,
        },
    );
    b.destroy_srq(srq).unwrap();
    b.destroy_id(unbound).unwrap();
    b.destroy_event_channel(ch).unwrap();
    destroy_all(&mut bed.server, &[server.listener], server.ch);
    assert_clean(&bed);
}
