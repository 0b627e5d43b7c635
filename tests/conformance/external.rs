//! External QPs on every backend: connect and accept without a backend QP, naming the
//! application's own QP number; `init_qp_attr` for each transition; `establish`. The QP numbers
//! here name no real QP: the CM does not look (the hardware runner's `external_hw` drives real
//! QPs through the same calls).

use cm::api::{
    Call, CmBackend, CmError, CmEventType, ConnParam, PortSpace, QpAttrMask, QpCaps, QpState,
    ACCESS_REMOTE_WRITE,
};

use crate::support::*;

/// The numbers the two sides' external QPs claim.
const CLIENT_QPN: u32 = 0x00AB_C123;
const SERVER_QPN: u32 = 0x0012_3ABC;

/// A connection whose both sides use external QPs, up to the client's `CONNECT_RESPONSE`
/// (retrieved and acked) and the server's accept.
fn responded<B: CmBackend>(bed: &mut Bed<B>) -> Conn {
    let server = listen(bed, 0);
    let client = resolved_client(bed, server.addr, false);
    bed.client
        .connect(client.id, &ConnParam::new().with_qp_num(CLIENT_QPN))
        .expect("connect without a backend QP");
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    assert_eq!(
        req.param.qp_num, CLIENT_QPN,
        "the REQ carries the external QP's number"
    );
    bed.server
        .accept(req.id, &ConnParam::new().with_qp_num(SERVER_QPN))
        .expect("accept without a backend QP");
    let rep = expect(&mut bed.client, client.ch, CmEventType::ConnectResponse);
    assert_eq!(
        rep.param.qp_num, SERVER_QPN,
        "the REP carries the external QP's number"
    );
    Conn {
        server,
        client,
        child: req.id,
    }
}

/// Ends an established external-QP connection and destroys everything (no QP to destroy).
fn external_teardown<B: CmBackend>(bed: &mut Bed<B>, conn: Conn) {
    bed.client.disconnect(conn.client.id).expect("client disconnect");
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    bed.server.disconnect(conn.child).expect("server disconnect");
    expect(&mut bed.client, conn.client.ch, CmEventType::Disconnected);
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(bed);
}

#[test]
fn an_external_qp_connect_gets_connect_response_and_establish_makes_the_peer_established() {
    let mut bed = bed!();
    let conn = responded(&mut bed);
    bed.client.establish(conn.client.id).expect("establish");
    expect(&mut bed.server, conn.server.ch, CmEventType::Established);
    expect_quiet(&mut bed.client, conn.client.ch);
    let m = bed.client.id_machine(conn.client.id).unwrap();
    assert_eq!((m.qp(), m.is_external()), (None, true));
    external_teardown(&mut bed, conn);
}

#[test]
fn init_qp_attr_gives_each_side_the_peers_qp_number_and_one_psn_per_direction() {
    let mut bed = bed!();
    let conn = responded(&mut bed);
    let (c, s) = (conn.client.id, conn.child);
    for (b, id) in [(&mut bed.client, c), (&mut bed.server, s)] {
        let init = b.init_qp_attr(id, QpState::Init).expect("INIT");
        let want = QpAttrMask::STATE | QpAttrMask::ACCESS_FLAGS | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
        assert!(init.mask.contains(want), "INIT mask {}", init.mask);
        assert!(init.qp_access_flags & ACCESS_REMOTE_WRITE != 0);
        assert!(init.port_num >= 1);
    }
    let rtr_mask = QpAttrMask::STATE
        | QpAttrMask::AV
        | QpAttrMask::PATH_MTU
        | QpAttrMask::DEST_QPN
        | QpAttrMask::RQ_PSN
        | QpAttrMask::MAX_DEST_RD_ATOMIC
        | QpAttrMask::MIN_RNR_TIMER;
    let rts_mask = QpAttrMask::STATE
        | QpAttrMask::SQ_PSN
        | QpAttrMask::TIMEOUT
        | QpAttrMask::RETRY_CNT
        | QpAttrMask::RNR_RETRY
        | QpAttrMask::MAX_QP_RD_ATOMIC;
    let c_rtr = bed.client.init_qp_attr(c, QpState::Rtr).expect("client RTR");
    let c_rts = bed.client.init_qp_attr(c, QpState::Rts).expect("client RTS");
    let s_rtr = bed.server.init_qp_attr(s, QpState::Rtr).expect("server RTR");
    let s_rts = bed.server.init_qp_attr(s, QpState::Rts).expect("server RTS");
    for (what, attr, mask) in [
        ("client RTR", c_rtr, rtr_mask),
        ("server RTR", s_rtr, rtr_mask),
        ("client RTS", c_rts, rts_mask),
        ("server RTS", s_rts, rts_mask),
    ] {
        // Exactly what rxe answers (Linux 6.1, read in the lab).
        assert_eq!(attr.mask, mask, "{what} mask {}", attr.mask);
        assert_eq!(
            attr.qp_state,
            Some(if mask == rtr_mask {
                QpState::Rtr
            } else {
                QpState::Rts
            })
        );
    }
    assert_eq!(c_rtr.dest_qp_num, SERVER_QPN);
    assert_eq!(s_rtr.dest_qp_num, CLIENT_QPN);
    assert!(
        c_rtr.ah_attr.grh.is_some() && s_rtr.ah_attr.grh.is_some(),
        "RoCE address vectors are global"
    );
    assert!((1..=5).contains(&c_rtr.path_mtu), "an ibv_mtu");
    assert_eq!(
        c_rts.sq_psn, s_rtr.rq_psn,
        "what the client sends first is what the server expects"
    );
    assert_eq!(s_rts.sq_psn, c_rtr.rq_psn, "and the other way round");
    bed.client.establish(c).expect("establish");
    expect(&mut bed.server, conn.server.ch, CmEventType::Established);
    let after = bed
        .server
        .init_qp_attr(s, QpState::Rts)
        .expect("RTS once established");
    assert_eq!(after.sq_psn, s_rts.sq_psn);
    external_teardown(&mut bed, conn);
}

#[test]
fn the_passive_sides_psns_are_fixed_before_accept_and_pair_with_the_active_sides() {
    // The child's PSNs are what the REQ brought and what the child drew when it was made, so a
    // QP moved to RTS before `accept` (as `accept`'s docs say) starts from the right PSN.
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, false);
    bed.client
        .connect(client.id, &ConnParam::new().with_qp_num(CLIENT_QPN))
        .expect("connect without a backend QP");
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    let child = req.id;
    let s_rtr = bed
        .server
        .init_qp_attr(child, QpState::Rtr)
        .expect("server RTR before accept");
    let s_rts = bed
        .server
        .init_qp_attr(child, QpState::Rts)
        .expect("server RTS before accept");
    bed.server
        .accept(child, &ConnParam::new().with_qp_num(SERVER_QPN))
        .expect("accept without a backend QP");
    let accepted = (
        bed.server
            .init_qp_attr(child, QpState::Rtr)
            .expect("server RTR after accept"),
        bed.server
            .init_qp_attr(child, QpState::Rts)
            .expect("server RTS after accept"),
    );
    assert_eq!(
        (accepted.0.rq_psn, accepted.1.sq_psn),
        (s_rtr.rq_psn, s_rts.sq_psn),
        "accept moves neither of the child's PSNs"
    );
    expect(&mut bed.client, client.ch, CmEventType::ConnectResponse);
    let c_rtr = bed
        .client
        .init_qp_attr(client.id, QpState::Rtr)
        .expect("client RTR");
    let c_rts = bed
        .client
        .init_qp_attr(client.id, QpState::Rts)
        .expect("client RTS");
    assert_eq!(
        c_rts.sq_psn, s_rtr.rq_psn,
        "the client sends from the PSN the child expects"
    );
    assert_eq!(
        s_rts.sq_psn, c_rtr.rq_psn,
        "the child sends from the PSN the client expects"
    );
    for psn in [c_rtr.rq_psn, c_rts.sq_psn] {
        assert!(psn <= 0x00FF_FFFF, "a PSN has 24 bits: {psn:#x}");
    }
    bed.client.establish(client.id).expect("establish");
    expect(&mut bed.server, server.ch, CmEventType::Established);
    let established = bed
        .server
        .init_qp_attr(child, QpState::Rts)
        .expect("server RTS established");
    assert_eq!(established.sq_psn, s_rts.sq_psn, "nor does the RTU");
    external_teardown(
        &mut bed,
        Conn {
            server,
            client,
            child,
        },
    );
}

#[test]
fn establish_before_connect_response_is_retrieved_is_refused_and_changes_nothing() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, false);
    bed.client
        .connect(client.id, &ConnParam::new().with_qp_num(CLIENT_QPN))
        .unwrap();
    assert!(matches!(
        bed.client.establish(client.id),
        Err(CmError::WrongState {
            call: Call::Establish,
            ..
        })
    ));
    assert!(
        matches!(
            bed.client.init_qp_attr(client.id, QpState::Rtr),
            Err(CmError::WrongState {
                call: Call::InitQpAttr,
                ..
            })
        ),
        "no remote QP number before the REP is retrieved"
    );
    bed.client
        .init_qp_attr(client.id, QpState::Init)
        .expect("INIT while connecting");
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    assert!(
        matches!(bed.server.establish(req.id), Err(CmError::WrongState { .. })),
        "establish on an unanswered child would make the kernel reject it"
    );
    bed.server
        .accept(req.id, &ConnParam::new().with_qp_num(SERVER_QPN))
        .unwrap();
    expect(&mut bed.client, client.ch, CmEventType::ConnectResponse);
    bed.client.establish(client.id).unwrap();
    expect(&mut bed.server, server.ch, CmEventType::Established);
    assert!(
        matches!(bed.client.establish(client.id), Err(CmError::WrongState { .. })),
        "a second establish"
    );
    external_teardown(
        &mut bed,
        Conn {
            server,
            client,
            child: req.id,
        },
    );
}

#[test]
fn mixing_a_backend_qp_with_external_mode_is_refused() {
    let mut bed = bed!();
    // An id connected with an external QP gets no backend QP afterwards.
    let conn = responded(&mut bed);
    assert_err(
        bed.client.create_qp(conn.client.id, QpCaps::new()),
        CmError::ExternalQp { call: Call::CreateQp },
    );
    assert_err(
        bed.server.create_qp(conn.child, QpCaps::new()),
        CmError::ExternalQp { call: Call::CreateQp },
    );
    bed.client.establish(conn.client.id).unwrap();
    expect(&mut bed.server, conn.server.ch, CmEventType::Established);
    external_teardown(&mut bed, conn);
    // An id with a backend QP has nothing to establish.
    let conn = establish(&mut bed);
    assert_err(
        bed.client.establish(conn.client.id),
        CmError::BackendQp {
            call: Call::Establish,
        },
    );
    teardown(&mut bed, conn);
}

#[test]
fn init_qp_attr_without_a_device_or_for_reset_is_refused() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    assert_err(
        b.init_qp_attr(id, QpState::Init),
        CmError::NoDevice {
            call: Call::InitQpAttr,
        },
    );
    let ip = bed.client_ip;
    let b = &mut bed.client;
    b.bind_addr(id, std::net::SocketAddr::new(ip, 0)).unwrap();
    for state in [QpState::Reset, QpState::Err] {
        assert!(matches!(
            b.init_qp_attr(id, state),
            Err(CmError::InvalidArgument {
                call: Call::InitQpAttr,
                ..
            })
        ));
    }
    // Before any exchange the kernel answers the INIT attributes, granting no remote access.
    let init = b.init_qp_attr(id, QpState::Init).unwrap();
    assert!(init
        .mask
        .contains(QpAttrMask::STATE | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS));
    assert_eq!(init.qp_access_flags, 0);
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn connecting_without_a_qp_or_a_qp_number_is_still_refused() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, false);
    assert_err(
        bed.client.connect(client.id, &ConnParam::new()),
        CmError::NoQp { call: Call::Connect },
    );
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn establish_after_the_peer_went_away_fails_and_rejected_follows() {
    let mut bed = bed!();
    let conn = responded(&mut bed);
    // The accepted child goes before the RTU: its IB CM rejects the connection.
    bed.server
        .destroy_id(conn.child)
        .expect("destroy the accepted child");
    let_time_pass(&mut bed.client);
    assert_err(
        bed.client.establish(conn.client.id),
        CmError::Os {
            call: Call::Establish,
            errno: cm::api::errno::EINVAL,
        },
    );
    let rej = expect(&mut bed.client, conn.client.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 28, "consumer defined");
    assert!(matches!(
        bed.client.init_qp_attr(conn.client.id, QpState::Rtr),
        Err(CmError::WrongState { .. })
    ));
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(&mut bed.server, &[conn.server.listener], conn.server.ch);
    assert_clean(&bed);
}
