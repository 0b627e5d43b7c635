//! Verbs QPs that no id owns: two hosts connect RC QPs themselves, as `ibv_rc_pingpong` does,
//! by moving them RESET → INIT → RTR → RTS with each other's QP number and GID.

use std::net::Ipv4Addr;
use std::time::Duration;

use cm_core::{
    AddressVector, CmError, GlobalRoute, QpAttrMask as M, QpCaps, QpHandle, QpType, VerbsQpAttr,
    VerbsQpState, WcOpcode, WcStatus, WorkCompletion,
};
use cm_sim::{SimFabric, SimHost};

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";
const SECOND: Duration = Duration::from_secs(1);

const INIT: M = M::STATE
    .union(M::PKEY_INDEX)
    .union(M::PORT)
    .union(M::ACCESS_FLAGS);
const RTR: M = M::STATE
    .union(M::AV)
    .union(M::PATH_MTU)
    .union(M::DEST_QPN)
    .union(M::RQ_PSN)
    .union(M::MAX_DEST_RD_ATOMIC)
    .union(M::MIN_RNR_TIMER);
const RTS: M = M::STATE
    .union(M::TIMEOUT)
    .union(M::RETRY_CNT)
    .union(M::RNR_RETRY)
    .union(M::SQ_PSN)
    .union(M::MAX_QP_RD_ATOMIC);

fn gid(ip: &str) -> [u8; 16] {
    ip.parse::<Ipv4Addr>().unwrap().to_ipv6_mapped().octets()
}

fn fabric() -> (SimFabric, SimHost, SimHost) {
    let f = SimFabric::builder().seed(7).host(A).host(B).build();
    let (a, b) = (f.host(0), f.host(1));
    (f, a, b)
}

fn init(host: &mut SimHost, qp: QpHandle) {
    let attr = VerbsQpAttr {
        qp_state: VerbsQpState::Init,
        port_num: 1,
        ..VerbsQpAttr::default()
    };
    host.verbs_modify_qp(qp, &attr, INIT).unwrap();
}

fn rtr_attr(dest_qp_num: u32, peer_ip: &str) -> VerbsQpAttr {
    VerbsQpAttr {
        qp_state: VerbsQpState::Rtr,
        path_mtu: 3,
        dest_qp_num,
        rq_psn: 0x10,
        max_dest_rd_atomic: 1,
        min_rnr_timer: 12,
        ah_attr: AddressVector {
            grh: Some(GlobalRoute {
                dgid: gid(peer_ip),
                sgid_index: 1,
                hop_limit: 1,
                ..GlobalRoute::default()
            }),
            port_num: 1,
            ..AddressVector::default()
        },
        ..VerbsQpAttr::default()
    }
}

fn rts_attr() -> VerbsQpAttr {
    VerbsQpAttr {
        qp_state: VerbsQpState::Rts,
        timeout: 14,
        retry_cnt: 7,
        rnr_retry: 7,
        sq_psn: 0x10,
        max_rd_atomic: 1,
        ..VerbsQpAttr::default()
    }
}

/// INIT, RTR towards `peer` on `peer_ip`, RTS.
fn connect(host: &mut SimHost, qp: QpHandle, peer: u32, peer_ip: &str) {
    init(host, qp);
    host.verbs_modify_qp(qp, &rtr_attr(peer, peer_ip), RTR).unwrap();
    host.verbs_modify_qp(qp, &rts_attr(), RTS).unwrap();
}

/// Two RC QPs, one on each host, connected to each other.
fn pair() -> (SimFabric, SimHost, SimHost, QpHandle, QpHandle) {
    let (f, mut a, mut b) = fabric();
    let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let (qb, _) = b.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let (na, nb) = (a.verbs_qp_num(qa).unwrap(), b.verbs_qp_num(qb).unwrap());
    connect(&mut a, qa, nb, B);
    connect(&mut b, qb, na, A);
    (f, a, b, qa, qb)
}

fn poll_one(host: &mut SimHost, qp: QpHandle) -> WorkCompletion {
    let mut out = Vec::new();
    let n = host.verbs_poll_cq(qp, &mut out, 1, SECOND * 60).unwrap();
    assert_eq!(n, 1, "a completion within the bound");
    out.pop().unwrap()
}

#[test]
fn two_hosts_ping_pong_over_standalone_rc_qps() {
    let (_f, mut a, mut b, qa, qb) = pair();
    assert_eq!(a.verbs_query_qp(qa).unwrap().state(), VerbsQpState::Rts);
    for round in 0..5u64 {
        b.verbs_post_recv(qb, 100 + round, 64).unwrap();
        a.verbs_post_recv(qa, 200 + round, 64).unwrap();
        let ping = format!("ping {round}");
        a.verbs_post_send(qa, round, ping.as_bytes()).unwrap();
        let got = poll_one(&mut b, qb);
        assert_eq!(
            (got.wr_id, got.opcode, got.status, got.data.as_slice()),
            (100 + round, WcOpcode::Recv, WcStatus::Success, ping.as_bytes())
        );
        let sent = poll_one(&mut a, qa);
        assert_eq!((sent.wr_id, sent.status), (round, WcStatus::Success));
        let pong = format!("pong {round}");
        b.verbs_post_send(qb, round, pong.as_bytes()).unwrap();
        let got = poll_one(&mut a, qa);
        assert_eq!((got.wr_id, got.data.as_slice()), (200 + round, pong.as_bytes()));
        assert_eq!(poll_one(&mut b, qb).status, WcStatus::Success);
    }
    assert_eq!(a.fabric().live_resources().qps, 2);
    a.verbs_destroy_qp(qa).unwrap();
    b.verbs_destroy_qp(qb).unwrap();
    assert_eq!(a.fabric().live_resources().qps, 0);
    assert_eq!(a.fabric().live_resources().ids, 0, "a verbs QP is no id");
}

#[test]
fn a_transition_without_a_required_attribute_is_refused_and_changes_nothing() {
    let (_f, mut a, _b) = fabric();
    let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let rtr = rtr_attr(0x99, B);
    let err = a.verbs_modify_qp(qa, &rtr, RTR).unwrap_err();
    assert_eq!(err.errno(), 22, "RESET to RTR: {err}");
    init(&mut a, qa);
    let err = a.verbs_modify_qp(qa, &rtr, RTR.without(M::DEST_QPN)).unwrap_err();
    assert_eq!(err.errno(), 22, "no DEST_QPN: {err}");
    let no_grh = VerbsQpAttr {
        ah_attr: AddressVector {
            port_num: 1,
            ..AddressVector::default()
        },
        ..rtr
    };
    assert_eq!(a.verbs_modify_qp(qa, &no_grh, RTR).unwrap_err().errno(), 22);
    assert_eq!(a.verbs_query_qp(qa).unwrap().state(), VerbsQpState::Init);
    // Posting a send in INIT is refused; a receive is taken.
    assert!(a.verbs_post_send(qa, 1, b"x").is_err());
    a.verbs_post_recv(qa, 2, 8).unwrap();
}

#[test]
fn a_send_before_the_peer_is_rtr_is_lost_and_ends_retry_exceeded() {
    let (f, mut a, mut b) = fabric();
    let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let (qb, _) = b.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let (na, nb) = (a.verbs_qp_num(qa).unwrap(), b.verbs_qp_num(qb).unwrap());
    connect(&mut a, qa, nb, B);
    // The peer is in INIT: it drops what arrives, and nothing is acknowledged.
    init(&mut b, qb);
    b.verbs_post_recv(qb, 9, 64).unwrap();
    let before = f.now();
    a.verbs_post_send(qa, 1, b"early").unwrap();
    a.verbs_post_send(qa, 2, b"later").unwrap();
    let wc = poll_one(&mut a, qa);
    assert_eq!((wc.wr_id, wc.status), (1, WcStatus::RetryExcErr));
    let waited = f.now().since_start() - before.since_start();
    // Eight tries of 4.096 µs · 2^14 each.
    assert!(waited >= Duration::from_nanos(8 * (4096 << 14)), "{waited:?}");
    let wc = poll_one(&mut a, qa);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::WrFlushErr));
    assert_eq!(a.verbs_query_qp(qa).unwrap().state(), VerbsQpState::Err);
    // The peer's receive is still posted: nothing reached it.
    let mut out = Vec::new();
    assert_eq!(b.verbs_poll_cq(qb, &mut out, 1, Duration::ZERO).unwrap(), 0);
    let _ = na;
}

#[test]
fn a_send_to_a_qp_number_nobody_has_ends_retry_exceeded() {
    let (_f, mut a, _b) = fabric();
    let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    connect(&mut a, qa, 0x00AB_CDEF, B);
    a.verbs_post_send(qa, 5, b"to nobody").unwrap();
    assert_eq!(poll_one(&mut a, qa).status, WcStatus::RetryExcErr);
}

#[test]
fn a_send_waits_for_the_peers_receive_and_lands_once_it_is_posted() {
    let (_f, mut a, mut b, qa, qb) = pair();
    a.verbs_post_send(qa, 1, b"patient").unwrap();
    let mut out = Vec::new();
    assert_eq!(
        a.verbs_poll_cq(qa, &mut out, 1, SECOND).unwrap(),
        0,
        "RNR retries for ever"
    );
    b.verbs_post_recv(qb, 2, 64).unwrap();
    assert_eq!(poll_one(&mut b, qb).data, b"patient");
    assert_eq!(poll_one(&mut a, qa).status, WcStatus::Success);
}

#[test]
fn moving_to_err_flushes_what_was_posted_and_reset_makes_it_new() {
    let (_f, mut a, mut b, qa, qb) = pair();
    for wr_id in 0..3 {
        b.verbs_post_recv(qb, wr_id, 16).unwrap();
    }
    let err = VerbsQpAttr {
        qp_state: VerbsQpState::Err,
        ..VerbsQpAttr::default()
    };
    b.verbs_modify_qp(qb, &err, M::STATE).unwrap();
    let mut out = Vec::new();
    b.verbs_poll_cq(qb, &mut out, 8, SECOND).unwrap();
    let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.status)).collect();
    assert_eq!(got, [0, 1, 2].map(|i| (i, WcStatus::WrFlushErr)));
    // A receive posted in ERR completes flushed at once.
    b.verbs_post_recv(qb, 7, 16).unwrap();
    assert_eq!(poll_one(&mut b, qb).status, WcStatus::WrFlushErr);
    // ERR leaves only for RESET; from there the QP connects again.
    assert!(b.verbs_modify_qp(qb, &rts_attr(), M::STATE).is_err());
    let reset = VerbsQpAttr {
        qp_state: VerbsQpState::Reset,
        ..VerbsQpAttr::default()
    };
    b.verbs_modify_qp(qb, &reset, M::STATE).unwrap();
    let q = b.verbs_query_qp(qb).unwrap();
    assert_eq!((q.state(), q.attr_mask()), (VerbsQpState::Reset, M::EMPTY));
    connect(&mut b, qb, a.verbs_qp_num(qa).unwrap(), A);
    b.verbs_post_recv(qb, 8, 16).unwrap();
    a.verbs_post_send(qa, 9, b"again").unwrap();
    assert_eq!(poll_one(&mut b, qb).data, b"again");
}

#[test]
fn a_qp_handle_is_only_its_hosts() {
    let (_f, mut a, mut b) = fabric();
    let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    assert!(matches!(b.verbs_query_qp(qa), Err(CmError::UnknownHandle { .. })));
    assert!(b.verbs_post_recv(qa, 1, 8).is_err());
    a.verbs_destroy_qp(qa).unwrap();
    assert!(a.verbs_destroy_qp(qa).is_err(), "destroyed");
}

/// A UD QP in RTS with Q_Key `qkey`.
fn ud_qp(host: &mut SimHost, qkey: u32) -> QpHandle {
    let (qp, _) = host.verbs_create_qp(QpType::Ud, QpCaps::new()).unwrap();
    let init = VerbsQpAttr {
        qp_state: VerbsQpState::Init,
        port_num: 1,
        qkey,
        ..VerbsQpAttr::default()
    };
    // ACCESS_FLAGS is RC's: a UD QP's INIT takes the Q_Key instead.
    assert_eq!(host.verbs_modify_qp(qp, &init, INIT).unwrap_err().errno(), 22);
    host.verbs_modify_qp(qp, &init, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY)
        .unwrap();
    let rtr = VerbsQpAttr {
        qp_state: VerbsQpState::Rtr,
        ..VerbsQpAttr::default()
    };
    host.verbs_modify_qp(qp, &rtr, M::STATE).unwrap();
    let rts = VerbsQpAttr {
        qp_state: VerbsQpState::Rts,
        sq_psn: 5,
        ..VerbsQpAttr::default()
    };
    host.verbs_modify_qp(qp, &rts, M::STATE | M::SQ_PSN).unwrap();
    qp
}

#[test]
fn ud_verbs_qps_exchange_datagrams_that_carry_the_receivers_qkey() {
    use cm_core::{AhAttr, UdParam};
    let (_f, mut a, mut b) = fabric();
    let qa = ud_qp(&mut a, 0x1111);
    let qb = ud_qp(&mut b, 0x2222);
    let nb = b.verbs_qp_num(qb).unwrap();
    let to_b = |qkey| UdParam {
        qp_num: nb,
        qkey,
        ah_attr: AhAttr::for_ip(B.parse().unwrap()),
    };
    b.verbs_post_recv(qb, 1, 256).unwrap();
    // Another Q_Key than the receiver's: dropped there (the send still completes).
    a.verbs_post_send_to(qa, 7, &to_b(0x1111), b"wrong key", None)
        .unwrap();
    a.verbs_post_send_to(qa, 8, &to_b(0x2222), b"right key", Some(42))
        .unwrap();
    let got = poll_one(&mut b, qb);
    assert_eq!(
        (got.wr_id, got.status, got.data.as_slice(), got.imm_data),
        (1, WcStatus::Success, &b"right key"[..], Some(42))
    );
    let from = got.sender.expect("a datagram names its sender");
    assert_eq!(from.qp_num, a.verbs_qp_num(qa).unwrap());
    for wr_id in [7, 8] {
        assert_eq!(poll_one(&mut a, qa).wr_id, wr_id);
    }
    let mut out = Vec::new();
    assert_eq!(b.verbs_poll_cq(qb, &mut out, 1, Duration::ZERO).unwrap(), 0);
    // An RC QP's number is no UD destination.
    let (rc, _) = b.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    let to_rc = UdParam {
        qp_num: b.verbs_qp_num(rc).unwrap(),
        ..to_b(0x2222)
    };
    a.verbs_post_send_to(qa, 9, &to_rc, b"x", None).unwrap();
    assert_eq!(poll_one(&mut a, qa).status, WcStatus::Success);
}

#[test]
fn the_same_calls_give_the_same_trace() {
    let run = || {
        let (f, mut a, mut b, qa, qb) = pair();
        b.verbs_post_recv(qb, 1, 8).unwrap();
        a.verbs_post_send(qa, 2, b"abc").unwrap();
        poll_one(&mut b, qb);
        f.trace_hash()
    };
    assert_eq!(run(), run());
}

/// Bytes a test registers and then looks at.
#[derive(Clone, Default)]
struct Shared(std::rc::Rc<std::cell::RefCell<Vec<u8>>>);

impl cm_sim::RegionMemory for Shared {
    fn len(&self) -> u64 {
        self.0.borrow().len() as u64
    }
    fn read(&self, offset: u64, out: &mut [u8]) {
        let at = offset as usize;
        out.copy_from_slice(&self.0.borrow()[at..at + out.len()]);
    }
    fn write(&mut self, offset: u64, data: &[u8]) {
        let at = offset as usize;
        self.0.borrow_mut()[at..at + data.len()].copy_from_slice(data);
    }
}

fn region(host: &mut SimHost, bytes: &[u8]) -> (Shared, cm_core::MrHandle) {
    let mem = Shared(std::rc::Rc::new(std::cell::RefCell::new(bytes.to_vec())));
    let access = cm_core::Access::LOCAL_WRITE | cm_core::Access::REMOTE_READ | cm_core::Access::REMOTE_WRITE;
    let mr = host.device_reg_mr_with(Box::new(mem.clone()), access).unwrap();
    (mem, mr)
}

#[test]
fn rdma_write_with_immediate_and_read_work_between_standalone_qps() {
    use cm_core::{CmBackend, RemoteAddr, SendOp, SendWr, Sge};
    let (_f, mut a, mut b, qa, qb) = pair();
    let (_, src) = region(&mut a, b"written by a");
    let (sink, dst) = region(&mut b, &[0; 12]);
    let (landing, land) = region(&mut a, &[0; 12]);
    let info = b.mr_info(dst).unwrap();
    let remote = RemoteAddr {
        addr: info.addr,
        rkey: info.rkey,
    };
    // A WRITE with an immediate takes a receive at the peer and says the immediate there.
    b.verbs_post_recv(qb, 40, 0).unwrap();
    let sges = [Sge::new(src, 0, 12)];
    let write = SendWr::new(
        1,
        SendOp::Write {
            remote,
            imm: Some(0xfeed),
        },
        &sges,
    );
    a.verbs_post_send_wr(qa, &write).unwrap();
    let got = poll_one(&mut b, qb);
    assert_eq!(
        (got.wr_id, got.opcode, got.imm_data, got.byte_len),
        (40, WcOpcode::RecvRdmaWithImm, Some(0xfeed), 12)
    );
    assert_eq!(&sink.0.borrow()[..], b"written by a");
    assert_eq!(poll_one(&mut a, qa).opcode, WcOpcode::RdmaWrite);
    // A READ brings the bytes back into a's landing region.
    let sges = [Sge::new(land, 0, 12)];
    a.verbs_post_send_wr(qa, &SendWr::new(2, SendOp::Read { remote }, &sges))
        .unwrap();
    let wc = poll_one(&mut a, qa);
    assert_eq!(
        (wc.wr_id, wc.opcode, wc.status),
        (2, WcOpcode::RdmaRead, WcStatus::Success)
    );
    assert_eq!(&landing.0.borrow()[..], b"written by a");
    // A key nobody has: the peer answers REMOTE_ACCESS_ERR and both QPs go to ERR.
    let bad = RemoteAddr { addr: 0, rkey: 0 };
    a.verbs_post_send_wr(qa, &SendWr::new(3, SendOp::Read { remote: bad }, &sges))
        .unwrap();
    assert_eq!(poll_one(&mut a, qa).status, WcStatus::RemAccessErr);
    assert_eq!(a.verbs_query_qp(qa).unwrap().state(), VerbsQpState::Err);
    assert_eq!(
        b.verbs_query_qp(qb).unwrap().state(),
        VerbsQpState::Err,
        "the responder's too"
    );
}

#[test]
fn a_partition_between_standalone_qps_ends_a_send_retry_exceeded() {
    let (f, mut a, mut b, qa, qb) = pair();
    f.inject(cm_sim::Fault::Partition { a: 0, b: 1 });
    b.verbs_post_recv(qb, 1, 8).unwrap();
    a.verbs_post_send(qa, 2, b"cut off").unwrap();
    let wc = poll_one(&mut a, qa);
    assert_eq!((wc.wr_id, wc.status), (2, WcStatus::RetryExcErr));
    assert_eq!(a.verbs_query_qp(qa).unwrap().state(), VerbsQpState::Err);
    let mut out = Vec::new();
    assert_eq!(b.verbs_poll_cq(qb, &mut out, 1, Duration::ZERO).unwrap(), 0);
}

#[test]
fn a_crashed_hosts_qps_are_gone_and_its_peer_sends_into_nothing() {
    let (f, mut a, b, qa, qb) = pair();
    f.inject(cm_sim::Fault::Crash { host: 1 });
    assert!(b.verbs_query_qp(qb).is_err(), "gone with the host");
    a.verbs_post_send(qa, 2, b"anyone?").unwrap();
    assert_eq!(poll_one(&mut a, qa).status, WcStatus::RetryExcErr);
    assert_eq!(f.live_resources().qps, 1);
}

/// The attributes `init_qp_attr` answered, as `ibv_modify_qp` takes them.
fn verbs_attr_of(a: &cm_core::QpAttr, state: VerbsQpState) -> VerbsQpAttr {
    VerbsQpAttr {
        qp_state: state,
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        qp_access_flags: a.qp_access_flags,
        path_mtu: a.path_mtu,
        dest_qp_num: a.dest_qp_num,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        qkey: a.qkey,
        ah_attr: a.ah_attr,
        ..VerbsQpAttr::default()
    }
}

/// Moves `qp` to `state` with what `init_qp_attr` answers for `id`.
fn follow_cm(
    host: &mut SimHost,
    id: cm_core::IdHandle,
    qp: QpHandle,
    state: cm_core::QpState,
    verbs: VerbsQpState,
) {
    use cm_core::CmBackend;
    let a = host.init_qp_attr(id, state).unwrap();
    host.verbs_modify_qp(qp, &verbs_attr_of(&a, verbs), a.mask)
        .unwrap();
}

#[test]
fn ids_connected_with_standalone_qps_move_them_by_init_qp_attr_and_exchange_messages() {
    use cm_core::{CmBackend, CmEventType, ConnParam, PortSpace, QpState};
    let (_f, mut server, mut client) = fabric();
    let t = SECOND * 2;
    let sch = server.create_event_channel().unwrap();
    let listener = server.create_id(sch, PortSpace::Tcp).unwrap();
    server
        .bind_addr(listener, "10.0.0.1:7471".parse().unwrap())
        .unwrap();
    server.listen(listener, 0).unwrap();
    let cch = client.create_event_channel().unwrap();
    let id = client.create_id(cch, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(id, None, "10.0.0.1:7471".parse().unwrap(), t)
        .unwrap();
    let ev = client.get_cm_event(cch, t).unwrap().unwrap();
    client.ack_cm_event(ev).unwrap();
    client.resolve_route(id, t).unwrap();
    let ev = client.get_cm_event(cch, t).unwrap().unwrap();
    client.ack_cm_event(ev).unwrap();

    let (cq, _) = client.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    follow_cm(&mut client, id, cq, QpState::Init, VerbsQpState::Init);
    client.verbs_post_recv(cq, 1, 64).unwrap();
    let param = ConnParam::new().with_qp_num(client.verbs_qp_num(cq).unwrap());
    client.connect(id, &param).unwrap();

    let req = server.get_cm_event(sch, t).unwrap().unwrap();
    assert_eq!(req.event(), CmEventType::ConnectRequest);
    let child = req.id();
    server.ack_cm_event(req).unwrap();
    let (sq, _) = server.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
    follow_cm(&mut server, child, sq, QpState::Init, VerbsQpState::Init);
    server.verbs_post_recv(sq, 2, 64).unwrap();
    follow_cm(&mut server, child, sq, QpState::Rtr, VerbsQpState::Rtr);
    follow_cm(&mut server, child, sq, QpState::Rts, VerbsQpState::Rts);
    let param = ConnParam::new().with_qp_num(server.verbs_qp_num(sq).unwrap());
    server.accept(child, &param).unwrap();

    let rep = client.get_cm_event(cch, t).unwrap().unwrap();
    assert_eq!(rep.event(), CmEventType::ConnectResponse);
    client.ack_cm_event(rep).unwrap();
    follow_cm(&mut client, id, cq, QpState::Rtr, VerbsQpState::Rtr);
    follow_cm(&mut client, id, cq, QpState::Rts, VerbsQpState::Rts);
    client.establish(id).unwrap();
    let est = server.get_cm_event(sch, t).unwrap().unwrap();
    assert_eq!(est.event(), CmEventType::Established);
    server.ack_cm_event(est).unwrap();
    // The PSNs pair: what one side sends from is what the other expects.
    let (c, s) = (
        client.verbs_query_qp(cq).unwrap().attr(),
        server.verbs_query_qp(sq).unwrap().attr(),
    );
    assert_eq!((c.sq_psn, c.rq_psn), (s.rq_psn, s.sq_psn));

    client.verbs_post_send(cq, 3, b"hello").unwrap();
    assert_eq!(poll_one(&mut server, sq).data, b"hello");
    assert_eq!(poll_one(&mut client, cq).wr_id, 3, "the send completes");
    server.verbs_post_send(sq, 4, b"world").unwrap();
    assert_eq!(poll_one(&mut client, cq).data, b"world");
    assert_eq!(poll_one(&mut server, sq).wr_id, 4);
}

/// Host A's QPs `qa1`, `qa2`, each connected to one of host B's, `qb1` and `qb2`, which take
/// their receives from B's SRQ `srq`.
struct SrqPair {
    _f: SimFabric,
    a: SimHost,
    b: SimHost,
    qa: [QpHandle; 2],
    qb: [QpHandle; 2],
    srq: cm_core::SrqHandle,
}

fn srq_pair() -> SrqPair {
    let (f, mut a, mut b) = fabric();
    let srq = b.verbs_create_srq(cm_core::SrqCaps::new()).unwrap();
    let mut qa = Vec::new();
    let mut qb = Vec::new();
    for _ in 0..2 {
        let (x, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new()).unwrap();
        let (y, granted) = b.verbs_create_qp_on_srq(QpType::Rc, QpCaps::new(), srq).unwrap();
        assert_eq!(
            (granted.max_recv_wr, granted.max_recv_sge),
            (0, 0),
            "no receive queue of its own"
        );
        let (nx, ny) = (a.verbs_qp_num(x).unwrap(), b.verbs_qp_num(y).unwrap());
        connect(&mut a, x, ny, B);
        connect(&mut b, y, nx, A);
        qa.push(x);
        qb.push(y);
    }
    SrqPair {
        _f: f,
        a,
        b,
        qa: [qa[0], qa[1]],
        qb: [qb[0], qb[1]],
        srq,
    }
}

#[test]
fn verbs_qps_on_one_srq_take_its_receives_in_posting_order_and_complete_on_their_own_cq() {
    use cm_core::CmBackend;
    let SrqPair {
        mut a,
        mut b,
        qa,
        qb,
        srq,
        ..
    } = srq_pair();
    for wr_id in 1..=4 {
        b.post_srq_recv(srq, wr_id, 64).unwrap();
    }
    // Whichever QP a message lands on takes the SRQ's oldest receive.
    let order = [
        (0usize, b"one".as_slice()),
        (1, b"two"),
        (0, b"three"),
        (1, b"four"),
    ];
    let mut mine = Vec::new();
    for (i, (side, msg)) in order.into_iter().enumerate() {
        a.verbs_post_send(qa[side], 10 + i as u64, msg).unwrap();
        let wc = poll_one(&mut b, qb[side]);
        assert_eq!(
            (wc.wr_id, wc.status, wc.opcode, wc.data.as_slice()),
            (i as u64 + 1, WcStatus::Success, WcOpcode::Recv, msg),
            "message {i} on QP {side}"
        );
        assert_eq!(poll_one(&mut a, qa[side]).status, WcStatus::Success);
        mine.push(side);
    }
    // Nothing shows on the other QP's queue.
    let mut out = Vec::new();
    for q in qb {
        assert_eq!(b.verbs_poll_cq(q, &mut out, 4, Duration::ZERO).unwrap(), 0);
    }
    // The SRQ is empty now: a fifth message waits (receiver not ready) until one is posted.
    a.verbs_post_send(qa[1], 20, b"five").unwrap();
    assert_eq!(b.verbs_poll_cq(qb[1], &mut out, 1, SECOND).unwrap(), 0);
    b.post_srq_recv(srq, 5, 64).unwrap();
    assert_eq!(poll_one(&mut b, qb[1]).wr_id, 5);
}

#[test]
fn a_verbs_qp_on_an_srq_refuses_receives_of_its_own() {
    let SrqPair { mut b, qb, .. } = srq_pair();
    let e = b.verbs_post_recv(qb[0], 1, 64).unwrap_err();
    assert_eq!(e.errno(), 22, "rxe's post_recv on a QP with an SRQ: EINVAL ({e})");
}

#[test]
fn an_srq_is_busy_while_a_verbs_qp_uses_it() {
    use cm_core::CmBackend;
    let SrqPair { mut b, qb, srq, .. } = srq_pair();
    let busy = b.destroy_srq(srq).unwrap_err();
    assert!(matches!(busy, CmError::SrqBusy { qps: 2 }), "{busy:?}");
    assert_eq!(busy.errno(), 16, "EBUSY");
    b.verbs_destroy_qp(qb[0]).unwrap();
    assert!(matches!(b.destroy_srq(srq), Err(CmError::SrqBusy { qps: 1 })));
    b.verbs_destroy_qp(qb[1]).unwrap();
    b.destroy_srq(srq).unwrap();
    assert!(matches!(b.query_srq(srq), Err(CmError::UnknownHandle { .. })));
    let late = b.verbs_create_qp_on_srq(QpType::Rc, QpCaps::new(), srq);
    assert!(matches!(late, Err(CmError::UnknownHandle { .. })), "{late:?}");
}

#[test]
fn a_verbs_qp_on_an_srq_going_to_err_flushes_its_own_queues_not_the_srqs_receives() {
    use cm_core::CmBackend;
    let SrqPair {
        mut a,
        mut b,
        qa,
        qb,
        srq,
        ..
    } = srq_pair();
    for wr_id in 1..=2 {
        b.post_srq_recv(srq, wr_id, 64).unwrap();
    }
    // A send of qb[0]'s own, waiting for a receive A never posts, is flushed with it.
    b.verbs_post_send(qb[0], 9, b"unanswered").unwrap();
    let err = VerbsQpAttr {
        qp_state: VerbsQpState::Err,
        ..VerbsQpAttr::default()
    };
    b.verbs_modify_qp(qb[0], &err, M::STATE).unwrap();
    let mut out = Vec::new();
    b.verbs_poll_cq(qb[0], &mut out, 8, SECOND).unwrap();
    let got: Vec<_> = out.iter().map(|w| (w.wr_id, w.opcode, w.status)).collect();
    assert_eq!(
        got,
        [(9, WcOpcode::Send, WcStatus::WrFlushErr)],
        "rxe flushes only its own queue"
    );
    // Both receives are still the SRQ's, for the QP that lives on.
    for (i, msg) in [b"still".as_slice(), b"there"].into_iter().enumerate() {
        a.verbs_post_send(qa[1], 30 + i as u64, msg).unwrap();
        let wc = poll_one(&mut b, qb[1]);
        assert_eq!((wc.wr_id, wc.data.as_slice()), (i as u64 + 1, msg));
    }
}

#[test]
fn a_verbs_srq_is_checked_against_the_device_and_queried_with_its_limit() {
    use cm_core::{CmBackend, SrqCaps};
    let (_f, mut a, _b) = fabric();
    let max = cm_sim::SimConfig::default().max_srq_wr;
    let too_many = SrqCaps {
        max_wr: max + 1,
        ..SrqCaps::new()
    };
    assert_eq!(a.verbs_create_srq(too_many).unwrap_err().errno(), 22);
    let no_room = SrqCaps {
        max_wr: 0,
        ..SrqCaps::new()
    };
    assert_eq!(a.verbs_create_srq(no_room).unwrap_err().errno(), 22);
    let srq = a.verbs_create_srq(SrqCaps::new().with_limit(2)).unwrap();
    assert_eq!(a.query_srq(srq).unwrap(), SrqCaps::new().with_limit(2));
    // A UD QP on it is refused: its receives would need room for the GRH.
    let ud = a.verbs_create_qp_on_srq(QpType::Ud, QpCaps::new(), srq);
    assert_eq!(ud.unwrap_err().errno(), 22);
    // The limit fires once when a receive taken leaves fewer than it posted, and disarms.
    a.arm_srq_limit(srq, 64).unwrap();
    assert_eq!(a.query_srq(srq).unwrap().srq_limit, 64);
    assert_eq!(a.arm_srq_limit(srq, 65).unwrap_err().errno(), 22, "above max_wr");
    a.destroy_srq(srq).unwrap();
}

#[test]
fn the_srq_limit_of_a_verbs_srq_raises_its_event_when_a_verbs_qp_takes_a_receive() {
    use cm_core::{AsyncEvent, CmBackend};
    let SrqPair {
        mut a,
        mut b,
        qa,
        qb,
        srq,
        ..
    } = srq_pair();
    for wr_id in 1..=3 {
        b.post_srq_recv(srq, wr_id, 64).unwrap();
    }
    b.arm_srq_limit(srq, 3).unwrap();
    a.verbs_post_send(qa[0], 1, b"x").unwrap();
    assert_eq!(poll_one(&mut b, qb[0]).wr_id, 1);
    assert_eq!(
        b.get_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::SrqLimitReached { srq })
    );
    assert_eq!(b.query_srq(srq).unwrap().srq_limit, 0, "disarmed");
}

#[test]
fn a_ud_datagram_to_the_peers_link_local_gid_reaches_it() {
    // libfabric's verbs provider addresses its datagrams to the peer's GID 0, the port's IPv6
    // link-local GID, with source GID 0.
    use cm_core::{link_local_gid, AhAttr, UdParam};
    let (_f, mut a, mut b) = fabric();
    let qa = ud_qp(&mut a, 0x1111);
    let qb = ud_qp(&mut b, 0x1111);
    let to = |ip: &str| UdParam {
        qp_num: b.verbs_qp_num(qb).unwrap(),
        qkey: 0x1111,
        ah_attr: AhAttr::for_ip(std::net::IpAddr::V6(link_local_gid(ip.parse().unwrap()).into())),
    };
    let (to_b, to_nobody) = (to(B), to("10.0.0.9"));
    assert_eq!(to_b.ah_attr.sgid_index, 0);
    b.verbs_post_recv(qb, 1, 64).unwrap();
    // A link-local GID of no host's goes nowhere (the send completes).
    a.verbs_post_send_to(qa, 2, &to_nobody, b"lost", None).unwrap();
    a.verbs_post_send_to(qa, 3, &to_b, b"link-local", None).unwrap();
    let got = poll_one(&mut b, qb);
    assert_eq!((got.wr_id, got.data.as_slice()), (1, &b"link-local"[..]));
    for wr_id in [2, 3] {
        assert_eq!(poll_one(&mut a, qa).status, WcStatus::Success, "{wr_id}");
    }
}
