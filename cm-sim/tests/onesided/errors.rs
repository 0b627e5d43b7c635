//! Every refusal: what rxe answers at post, what the responder refuses and which QPs go to ERR,
//! local errors when a work request reaches a region gone since its post, and flushes.

use std::time::Duration;

use cm_core::{
    Access, Call, CmBackend, CmError, ConnParam, HandleKind, QpAttrMask, QpState, RemoteAddr, SendOp, SendWr,
    Sge, VerbsQpAttr, VerbsQpState, WcOpcode, WcStatus,
};
use cm_sim::Fault;

use crate::support::*;

/// A WRITE of 8 bytes from a fresh region of `p.a` to `to`, then a READ queued behind it
/// (pipelined: it leaves before the WRITE's answer comes back), and a receive on each side.
/// Returns the completions of both sides once the first failed.
fn refused_write_then_read(
    p: &mut Pair,
    to: RemoteAddr,
) -> (Vec<cm_core::WorkCompletion>, Vec<cm_core::WorkCompletion>) {
    let src = p.a_mr(8, Access::LOCAL_WRITE);
    let sge = [Sge::new(src, 0, 8)];
    p.a.post_recv(p.a_id, 50, 8).unwrap();
    p.b.post_recv(p.b_id, 60, 8).unwrap();
    p.post_a(&write(1, to, &sge));
    p.post_a(&read(2, to, &sge));
    let a = p.poll_a(3);
    let b = p.poll_b(1);
    (a, b)
}

/// The requester's QP failed with `status` on its first request: it and the rest of its work
/// flushed, its peer's QP in ERR with its receive flushed.
fn assert_both_failed(
    p: &Pair,
    a: &[cm_core::WorkCompletion],
    b: &[cm_core::WorkCompletion],
    status: WcStatus,
) {
    assert_eq!(
        summary(a),
        [
            (1, WcOpcode::RdmaWrite, status, 0),
            (50, WcOpcode::Recv, WcStatus::WrFlushErr, 0),
            (2, WcOpcode::RdmaRead, WcStatus::WrFlushErr, 0),
        ]
    );
    assert_eq!(summary(b), [(60, WcOpcode::Recv, WcStatus::WrFlushErr, 0)]);
    assert_eq!(p.qp_a(), Some(QpState::Err));
    assert_eq!(p.qp_b(), Some(QpState::Err));
}

#[test]
fn a_key_that_names_no_region_is_a_remote_access_error_and_both_qps_fail() {
    let mut p = connect(20);
    let dst = p.b_mr(8, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    let bad = RemoteAddr {
        addr: info.addr,
        rkey: info.rkey ^ 0x100,
    };
    let (a, b) = refused_write_then_read(&mut p, bad);
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
    assert_eq!(p.fabric.fault_stats().remote_access_errors, 1);
    let steps = p.rdma_steps();
    assert!(
        steps.contains(&(0, "executed", "RDMA_WRITE", WcStatus::RemAccessErr as i32)),
        "{steps:?}"
    );
    // The READ reached a responder in ERR, which dropped it without a word.
    assert!(steps.contains(&(0, "dropped", "RDMA_READ", 0)), "{steps:?}");
    // Answers after the flush change nothing.
    p.fabric.run_until_idle();
    nothing_more(&mut p.a, p.a_id, Duration::ZERO);
}

#[test]
fn a_key_of_a_deregistered_region_is_a_remote_access_error() {
    let mut p = connect(21);
    let dst = p.b_mr(8, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    p.b.dereg_mr(dst).unwrap();
    // A new region in the same slot has a new key (the generation moved on) and address.
    let again = p.b_mr(8, Access::ALL);
    let again_info = p.b.mr_info(again).unwrap();
    assert_ne!(again_info.rkey, info.rkey);
    assert_ne!(again_info.addr, info.addr);
    let (a, b) = refused_write_then_read(&mut p, info.remote().start());
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
    assert_eq!(read_mr(&p.b, again, 0, 8), [0; 8], "nothing written anywhere");
}

#[test]
fn a_region_without_the_remote_flag_refuses_that_operation() {
    let cases = [
        // (region access, the operation refused)
        (Access::LOCAL_WRITE | Access::REMOTE_READ, "write"),
        (Access::LOCAL_WRITE | Access::REMOTE_WRITE, "read"),
        (
            Access::LOCAL_WRITE | Access::REMOTE_WRITE | Access::REMOTE_READ,
            "atomic",
        ),
    ];
    for (seed, (access, op)) in cases.into_iter().enumerate() {
        let mut p = connect(22 + seed as u64);
        let dst = p.b_mr(8, access);
        let info = p.b.mr_info(dst).unwrap();
        let local = p.a_mr(8, Access::LOCAL_WRITE);
        let sge = [Sge::new(local, 0, 8)];
        let to = info.remote().start();
        let wr = match op {
            "write" => write(1, to, &sge),
            "read" => read(1, to, &sge),
            _ => SendWr::new(1, SendOp::FetchAdd { remote: to, add: 1 }, &sge),
        };
        p.post_a(&wr);
        let a = p.poll_a(1);
        assert_eq!(
            (a[0].status, a[0].opcode, a[0].byte_len),
            (WcStatus::RemAccessErr, wr.op.wc_opcode(), 0),
            "{op}"
        );
        assert_eq!(p.qp_b(), Some(QpState::Err), "{op}");
    }
}

#[test]
fn a_region_registered_without_remote_access_has_key_zero_which_names_nothing() {
    let mut p = connect(25);
    let private = p.b_mr(8, Access::LOCAL_WRITE);
    let info = p.b.mr_info(private).unwrap();
    assert_eq!(info.rkey, 0);
    assert_ne!(info.lkey, 0);
    let (a, b) = refused_write_then_read(&mut p, info.remote().start());
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
}

#[test]
fn a_key_of_a_region_on_another_host_is_not_the_responders() {
    let mut p = connect(26);
    // The requester's own region: its key means nothing on the responder's device.
    let mine = p.a_mr(8, Access::ALL);
    let info = p.a.mr_info(mine).unwrap();
    let (a, b) = refused_write_then_read(&mut p, info.remote().start());
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
}

#[test]
fn a_range_past_the_region_is_refused_whole_and_writes_nothing() {
    let mut p = connect(27);
    let dst = p.b_mr(16, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    // 8 bytes at offset 12 of 16: the first four would fit.
    let to = remote(&info, 12);
    let (a, b) = refused_write_then_read(&mut p, to);
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
    assert_eq!(read_mr(&p.b, dst, 0, 16), [0; 16]);
    // Before the region too.
    let mut p = connect(28);
    let dst = p.b_mr(16, Access::ALL);
    let info = p.b.mr_info(dst).unwrap();
    let before = RemoteAddr {
        addr: info.addr - 4,
        rkey: info.rkey,
    };
    let (a, b) = refused_write_then_read(&mut p, before);
    assert_both_failed(&p, &a, &b, WcStatus::RemAccessErr);
}

#[test]
fn a_write_with_immediate_and_a_bad_key_fails_the_receive_it_took_and_both_qps() {
    let mut p = connect(29);
    let src = p.a_mr(4, Access::NONE);
    p.b.post_recv(p.b_id, 70, 8).unwrap();
    p.b.post_recv(p.b_id, 71, 8).unwrap();
    let sge = [Sge::new(src, 0, 4)];
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote: RemoteAddr {
                addr: 0x1000,
                rkey: 0x4242,
            },
            imm: Some(5),
        },
        &sge,
    );
    p.post_a(&wr);
    let a = p.poll_a(1);
    assert_eq!(summary(&a), [(1, WcOpcode::RdmaWrite, WcStatus::RemAccessErr, 0)]);
    let b = p.poll_b(2);
    // The receive's own opcode and nothing else, as rxe clears a failed completion.
    assert_eq!(
        summary(&b),
        [
            (70, WcOpcode::Recv, WcStatus::RemAccessErr, 0),
            (71, WcOpcode::Recv, WcStatus::WrFlushErr, 0)
        ]
    );
    assert_eq!(b[0].imm_data, None);
    assert_eq!((p.qp_a(), p.qp_b()), (Some(QpState::Err), Some(QpState::Err)));
    assert_eq!(p.fabric.fault_stats().remote_access_errors, 1);
}

#[test]
fn a_write_with_immediate_without_a_receive_waits_and_gives_up_under_an_rnr_limit() {
    let mut p = connect(30);
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote: RemoteAddr { addr: 0, rkey: 0 },
            imm: Some(5),
        },
        &[],
    );
    p.post_a(&wr);
    // Receiver-not-ready retries are infinite by default: it waits, whatever its key.
    nothing_more(&mut p.a, p.a_id, Duration::from_secs(30));
    assert_eq!(p.qp_a(), Some(QpState::Rts));
    let mut p = connect(31);
    p.fabric.inject(Fault::RnrRetries { host: 1, retries: 2 });
    p.post_a(&wr);
    let a = p.poll_a(1);
    assert_eq!(
        summary(&a),
        [(1, WcOpcode::RdmaWrite, WcStatus::RnrRetryExcErr, 0)]
    );
    assert_eq!((p.qp_a(), p.qp_b()), (Some(QpState::Err), Some(QpState::Rts)));
    let steps = p.rdma_steps();
    assert_eq!(
        steps,
        [(
            1,
            "completed",
            "RDMA_WRITE_WITH_IMM",
            WcStatus::RnrRetryExcErr as i32
        )]
    );
}

#[test]
fn posting_refuses_what_verbs_refuses_and_leaves_the_qp_as_it_was() {
    let mut p = connect(32);
    let local = p.a_mr(16, Access::NONE);
    let writable = p.a_mr(16, Access::LOCAL_WRITE);
    let peer = p.b_mr(16, Access::ALL);
    let to = p.b.mr_info(peer).unwrap().remote().start();
    let invalid = |r: cm_core::Result<()>| match r {
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            reason,
        }) => reason,
        other => panic!("not refused: {other:?}"),
    };
    let unknown = CmError::UnknownHandle {
        call: Call::PostSend,
        kind: HandleKind::Mr,
    };
    // A handle of the peer's host, a forged one and a deregistered one.
    let gone = p.a_mr(8, Access::NONE);
    p.a.dereg_mr(gone).unwrap();
    let forged = cm_core::backend::mr_handle(p.a_id.owner(), 77, 0);
    for mr in [peer, forged, gone] {
        let sge = [Sge::new(mr, 0, 8)];
        assert_eq!(
            p.a.post_send_wr(p.a_id, &write(1, to, &sge)),
            Err(unknown.clone()),
            "{mr}"
        );
    }
    let past = [Sge::new(local, 12, 8)];
    assert_eq!(
        invalid(p.a.post_send_wr(p.a_id, &write(1, to, &past))),
        "scatter/gather entry outside its memory region"
    );
    let ro = [Sge::new(local, 0, 8)];
    assert_eq!(
        invalid(p.a.post_send_wr(p.a_id, &read(1, to, &ro))),
        "a READ's or atomic's destination needs LOCAL_WRITE"
    );
    let eight = [Sge::new(writable, 0, 8)];
    let unaligned = RemoteAddr {
        addr: to.addr + 4,
        ..to
    };
    let add = SendWr::new(
        1,
        SendOp::FetchAdd {
            remote: unaligned,
            add: 1,
        },
        &eight,
    );
    assert_eq!(
        invalid(p.a.post_send_wr(p.a_id, &add)),
        "an atomic's remote address must be 8-byte aligned"
    );
    let four = [Sge::new(writable, 0, 4)];
    let add = SendWr::new(1, SendOp::FetchAdd { remote: to, add: 1 }, &four);
    assert_eq!(
        invalid(p.a.post_send_wr(p.a_id, &add)),
        "an atomic needs one scatter/gather entry of 8 bytes"
    );
    let five = [Sge::new(writable, 0, 1); 5];
    assert_eq!(
        invalid(p.a.post_send_wr(p.a_id, &write(1, to, &five))),
        "more scatter/gather entries than max_send_sge"
    );
    assert_eq!(p.qp_a(), Some(QpState::Rts));
    assert_eq!(p.a.post_send_wr(p.a_id, &write(2, to, &eight)), Ok(()));
    assert_eq!(
        summary(&p.poll_a(1)),
        [(2, WcOpcode::RdmaWrite, WcStatus::Success, 0)]
    );
}

#[test]
fn reads_and_atomics_need_the_initiator_depth_the_peer_granted() {
    // The server answers no READs: the client's initiator depth is what it granted, 0.
    let server = ConnParam {
        responder_resources: 0,
        ..ConnParam::new()
    };
    let mut p = connect_with(
        builder(33),
        Setup {
            server,
            ..Setup::default()
        },
    );
    let local = p.a_mr(8, Access::LOCAL_WRITE);
    let peer = p.b_mr(8, Access::ALL);
    let to = p.b.mr_info(peer).unwrap().remote().start();
    let sge = [Sge::new(local, 0, 8)];
    let refused = p.a.post_send_wr(p.a_id, &read(1, to, &sge));
    assert!(
        matches!(
            refused,
            Err(CmError::InvalidArgument {
                reason: "RDMA READ and atomics need an initiator depth above 0",
                ..
            })
        ),
        "{refused:?}"
    );
    // Writes need none.
    p.post_a(&write(2, to, &sge));
    assert_eq!(p.poll_a(1)[0].status, WcStatus::Success);
    // The other way round, the client granted the default: the server may read from it.
    let mine = p.a_mr(8, Access::ALL);
    p.a.write_mr(mine, 0, b"clientsd").unwrap();
    let from = p.a.mr_info(mine).unwrap().remote().start();
    let dst = p.b_mr(8, Access::LOCAL_WRITE);
    p.b.post_send_wr(p.b_id, &read(3, from, &[Sge::new(dst, 0, 8)]))
        .unwrap();
    assert_eq!(p.poll_b(1)[0].status, WcStatus::Success);
    assert_eq!(read_mr(&p.b, dst, 0, 8), b"clientsd");
}

#[test]
fn one_sided_operations_need_a_connected_qp() {
    let fabric = builder(34).build();
    let mut h = fabric.host(0);
    let ch = h.create_event_channel().unwrap();
    let id = h.create_id(ch, cm_core::PortSpace::Udp).unwrap();
    h.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap();
    h.create_qp(id, cm_core::QpCaps::new()).unwrap();
    let mr = h.reg_mr(id, 8, Access::LOCAL_WRITE).unwrap();
    let to = RemoteAddr { addr: 0, rkey: 0 };
    let r = h.post_send_wr(id, &read(1, to, &[Sge::new(mr, 0, 8)]));
    assert!(
        matches!(
            r,
            Err(CmError::InvalidArgument {
                reason: "RDMA READ, WRITE and atomics need a connected (RC) QP",
                ..
            })
        ),
        "{r:?}"
    );
}

#[test]
fn a_source_deregistered_before_its_write_leaves_fails_it_locally_and_the_peer_stays() {
    let mut p = connect(35);
    let src = p.a_mr(8, Access::NONE);
    let dst = p.b_mr(8, Access::ALL);
    let to = p.b.mr_info(dst).unwrap().remote().start();
    let keep = p.a_mr(8, Access::NONE);
    // A send waits for a receive; the WRITE behind it waits for the send.
    p.post_a(&SendWr::new(
        1,
        SendOp::Send { imm: None },
        &[Sge::new(keep, 0, 8)],
    ));
    p.post_a(&write(2, to, &[Sge::new(src, 0, 8)]));
    p.post_a(&write(3, to, &[Sge::new(keep, 0, 8)]));
    p.a.dereg_mr(src).unwrap();
    p.b.post_recv(p.b_id, 9, 8).unwrap();
    let a = p.poll_a(3);
    assert_eq!(
        summary(&a),
        [
            (1, WcOpcode::Send, WcStatus::Success, 0),
            (2, WcOpcode::RdmaWrite, WcStatus::LocQpOpErr, 0),
            (3, WcOpcode::RdmaWrite, WcStatus::WrFlushErr, 0)
        ]
    );
    assert_eq!((p.qp_a(), p.qp_b()), (Some(QpState::Err), Some(QpState::Rts)));
    // A send over a region deregistered while it waited fails the same way.
    let mut p = connect(36);
    let src = p.a_mr(8, Access::NONE);
    p.post_a(&SendWr::new(
        1,
        SendOp::Send { imm: Some(1) },
        &[Sge::new(src, 0, 8)],
    ));
    p.a.dereg_mr(src).unwrap();
    p.b.post_recv(p.b_id, 9, 8).unwrap();
    assert_eq!(
        summary(&p.poll_a(1)),
        [(1, WcOpcode::Send, WcStatus::LocQpOpErr, 0)]
    );
    nothing_more(&mut p.b, p.b_id, Duration::from_millis(1));
    assert_eq!(p.qp_b(), Some(QpState::Rts));
}

#[test]
fn a_destination_deregistered_while_its_read_is_on_the_wire_fails_when_the_answer_comes() {
    let mut p = connect(37);
    let counter = p.b_mr(8, Access::ALL);
    let to = p.b.mr_info(counter).unwrap().remote().start();
    let dst = p.a_mr(8, Access::LOCAL_WRITE);
    p.post_a(&SendWr::new(
        1,
        SendOp::FetchAdd { remote: to, add: 3 },
        &[Sge::new(dst, 0, 8)],
    ));
    p.a.dereg_mr(dst).unwrap();
    assert_eq!(
        summary(&p.poll_a(1)),
        [(1, WcOpcode::FetchAdd, WcStatus::LocProtErr, 0)]
    );
    // The responder executed it and is fine.
    assert_eq!(read_mr(&p.b, counter, 0, 8), 3u64.to_ne_bytes());
    assert_eq!((p.qp_a(), p.qp_b()), (Some(QpState::Err), Some(QpState::Rts)));
}

#[test]
fn a_region_deregistered_at_the_responder_while_a_request_flies_refuses_it() {
    let mut p = connect(38);
    let dst = p.b_mr(8, Access::ALL);
    let to = p.b.mr_info(dst).unwrap().remote().start();
    let src = p.a_mr(8, Access::NONE);
    p.post_a(&write(1, to, &[Sge::new(src, 0, 8)]));
    assert_eq!(
        p.b.dereg_mr(dst),
        Ok(()),
        "deregistration never waits for work in flight"
    );
    assert_eq!(
        p.b.dereg_mr(dst),
        Err(CmError::UnknownHandle {
            call: Call::DeregMr,
            kind: HandleKind::Mr
        })
    );
    assert_eq!(
        summary(&p.poll_a(1)),
        [(1, WcOpcode::RdmaWrite, WcStatus::RemAccessErr, 0)]
    );
    assert_eq!(p.qp_b(), Some(QpState::Err));
}

#[test]
fn a_disconnect_flushes_requests_in_flight_in_order_and_ignores_their_answers() {
    let mut p = connect(39);
    let dst = p.b_mr(64, Access::ALL);
    let to = p.b.mr_info(dst).unwrap();
    let local = p.a_mr(64, Access::LOCAL_WRITE);
    let sge = [Sge::new(local, 0, 8)];
    p.post_a(&write(1, remote(&to, 0), &sge));
    p.post_a(&read(2, remote(&to, 8), &sge));
    let cas = SendWr::new(
        3,
        SendOp::CompareSwap {
            remote: remote(&to, 16),
            compare: 0,
            swap: 1,
        },
        &sge,
    );
    p.post_a(&cas);
    p.post_a(&SendWr::new(4, SendOp::Send { imm: None }, &sge));
    p.a.disconnect(p.a_id).unwrap();
    let a = p.poll_a(4);
    assert_eq!(
        summary(&a),
        [
            (1, WcOpcode::RdmaWrite, WcStatus::WrFlushErr, 0),
            (2, WcOpcode::RdmaRead, WcStatus::WrFlushErr, 0),
            (3, WcOpcode::CompSwap, WcStatus::WrFlushErr, 0),
            (4, WcOpcode::Send, WcStatus::WrFlushErr, 0)
        ]
    );
    p.fabric.run_until_idle();
    nothing_more(&mut p.a, p.a_id, Duration::ZERO);
    // Posted on the QP in ERR: flushed at once, with its own opcode.
    p.post_a(&read(5, remote(&to, 0), &sge));
    assert_eq!(
        summary(&p.poll_a(1)),
        [(5, WcOpcode::RdmaRead, WcStatus::WrFlushErr, 0)]
    );
    let completed = p.rdma_steps().iter().filter(|s| s.1 == "completed").count();
    assert_eq!(completed, 0, "flushes are not traced");
}

#[test]
fn the_receivers_minimum_rnr_timer_is_what_a_send_without_a_receive_waits_before_each_retry() {
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote: RemoteAddr { addr: 0, rkey: 0 },
            imm: Some(5),
        },
        &[],
    );
    // How long the write waits before giving up after 2 retries, with the responder's
    // QP moved RTS -> RTS with `timer` as its minimum RNR timer (or left at the CM's 0).
    let gives_up_after = |timer: Option<u8>| {
        let mut p = connect(32);
        if let Some(timer) = timer {
            let attr = VerbsQpAttr {
                min_rnr_timer: timer,
                ..VerbsQpAttr::default()
            };
            p.b.modify_id_qp(p.b_id, &attr, QpAttrMask::MIN_RNR_TIMER)
                .unwrap();
        }
        p.fabric.inject(Fault::RnrRetries { host: 1, retries: 2 });
        let start = p.fabric.now();
        p.post_a(&wr);
        let a = p.poll_a(1);
        assert_eq!(
            summary(&a),
            [(1, WcOpcode::RdmaWrite, WcStatus::RnrRetryExcErr, 0)]
        );
        Duration::from_nanos(p.fabric.now().as_nanos() - start.as_nanos())
    };
    // 0 is 655.36 ms a retry; 1 is 10 us, 14 is 1.28 ms (IBA table 45, rxe's rnrnak_usec).
    let waited = gives_up_after(None);
    assert!(waited >= Duration::from_micros(2 * 655_360), "{waited:?}");
    let waited = gives_up_after(Some(1));
    assert!(
        waited >= Duration::from_micros(20) && waited < Duration::from_millis(1),
        "{waited:?}"
    );
    let waited = gives_up_after(Some(14));
    assert!(
        waited >= Duration::from_micros(2 * 1280) && waited < Duration::from_millis(10),
        "{waited:?}"
    );
}

#[test]
fn a_modify_of_an_ids_qp_takes_what_its_state_allows_and_leaves_moving_it_to_the_cm() {
    let mut p = connect(33);
    let attr = VerbsQpAttr {
        qp_state: VerbsQpState::Err,
        qkey: 7,
        ..VerbsQpAttr::default()
    };
    // RTS -> ERR is the CM's to make (rdma_disconnect), not this call's.
    let err = p.a.modify_id_qp(p.a_id, &attr, QpAttrMask::STATE).unwrap_err();
    assert_eq!(err.errno(), cm_core::errno::ENOSYS, "{err}");
    // RTS -> RTS of an RC QP takes no Q_Key: EINVAL, as the kernel's table says.
    let err = p.a.modify_id_qp(p.a_id, &attr, QpAttrMask::QKEY).unwrap_err();
    assert_eq!(err.errno(), 22, "{err}");
    assert_eq!(p.qp_a(), Some(QpState::Rts));
    // A listener has no QP.
    let err =
        p.b.modify_id_qp(p.listener, &attr, QpAttrMask::MIN_RNR_TIMER)
            .unwrap_err();
    assert_eq!(err.errno(), 22, "{err}");
}
