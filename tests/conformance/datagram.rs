//! Datagrams on the UDP port space, on every backend: the SIDR lookup's result in
//! `ESTABLISHED`, datagrams both ways naming their sender, and what UD does with a datagram no
//! receive waits for.

use std::net::SocketAddr;

use cm::api::{
    Call, ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps, UdParam,
    WcOpcode, WcStatus, UDP_QKEY,
};

use crate::support::*;

/// A SIDR lookup answered: the server's listener and child (with a UD QP), the client's id (with
/// a UD QP) and the destination its `ESTABLISHED` reported.
pub struct Sidr {
    pub server_ch: ChannelHandle,
    pub listener: IdHandle,
    pub child: IdHandle,
    pub client_ch: ChannelHandle,
    pub client: IdHandle,
    pub dest: UdParam,
    pub server_addr: SocketAddr,
}

/// Runs the lookup as rdma-core's `udaddy` does; the server posts `server_recvs` receives of
/// `recv_len` bytes before it accepts.
pub fn sidr<B: CmBackend>(bed: &mut Bed<B>, server_recvs: u64, recv_len: u32) -> Sidr {
    let server_addr = bed.server_addr();
    let s = &mut bed.server;
    let server_ch = s.create_event_channel().expect("channel");
    let listener = s.create_id(server_ch, PortSpace::Udp).expect("create_id");
    s.bind_addr(listener, server_addr).expect("bind");
    s.listen(listener, 0).expect("listen");

    let src = SocketAddr::new(bed.client_ip, 0);
    let c = &mut bed.client;
    let client_ch = c.create_event_channel().expect("channel");
    let client = c.create_id(client_ch, PortSpace::Udp).expect("create_id");
    c.resolve_addr(client, Some(src), server_addr, WAIT)
        .expect("resolve_addr");
    expect(c, client_ch, CmEventType::AddrResolved);
    c.resolve_route(client, WAIT).expect("resolve_route");
    expect(c, client_ch, CmEventType::RouteResolved);
    c.create_qp(client, QpCaps::new()).expect("create_qp (client)");
    c.connect(client, &ConnParam::new()).expect("connect");

    let req = expect(&mut bed.server, server_ch, CmEventType::ConnectRequest);
    let child = req.id;
    bed.server
        .create_qp(child, QpCaps::new())
        .expect("create_qp (server)");
    for wr in 0..server_recvs {
        bed.server.post_recv(child, wr, recv_len).expect("post_recv");
    }
    bed.server.accept(child, &ConnParam::new()).expect("accept");

    let ev = bed
        .client
        .get_cm_event(client_ch, WAIT)
        .expect("get_cm_event")
        .expect("ESTABLISHED");
    assert_eq!(ev.event(), CmEventType::Established, "status {}", ev.status());
    let dest = *ev
        .ud_param()
        .expect("a SIDR reply reports the server's UD parameters");
    assert_eq!(ev.param().qp_num, dest.qp_num);
    bed.client.ack_cm_event(ev).expect("ack");
    Sidr {
        server_ch,
        listener,
        child,
        client_ch,
        client,
        dest,
        server_addr,
    }
}

pub fn teardown_sidr<B: CmBackend>(bed: &mut Bed<B>, s: Sidr) {
    destroy_all(&mut bed.client, &[s.client], s.client_ch);
    destroy_all(&mut bed.server, &[s.child, s.listener], s.server_ch);
}

#[test]
fn a_sidr_reply_reports_the_servers_qp_qkey_and_address_in_established() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 0, 0);
    assert_eq!(s.dest.qkey, UDP_QKEY);
    assert_eq!(s.dest.ah_attr.dest_ip(), Some(s.server_addr.ip()));
    assert!(s.dest.qp_num > 0 && s.dest.qp_num <= 0x00FF_FFFF);
    // The passive side of SIDR gets no ESTABLISHED: its accept was the whole answer.
    expect_quiet(&mut bed.server, s.server_ch);
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

#[test]
fn datagrams_reach_the_server_naming_their_sender_and_its_reply_comes_back() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 1, 64);
    bed.client.post_recv(s.client, 10, 64).unwrap();
    bed.client.post_send_to(s.client, 1, &s.dest, b"ping").unwrap();
    let sent = completions(&mut bed.client, s.client, 1);
    assert_eq!(
        (sent[0].wr_id, sent[0].opcode, sent[0].status),
        (1, WcOpcode::Send, WcStatus::Success)
    );

    let got = completions(&mut bed.server, s.child, 1);
    assert_eq!((got[0].wr_id, got[0].status), (0, WcStatus::Success));
    assert_eq!(
        (got[0].byte_len, got[0].data.as_slice()),
        (4, &b"ping"[..]),
        "the GRH is not shown"
    );
    let sender = got[0].sender.expect("a datagram names its sender");
    assert_eq!(sender.addr, Some(bed.client_ip));
    assert_ne!(
        sender.qp_num, s.dest.qp_num,
        "the sender is the client's QP, not the server's"
    );

    bed.server
        .post_send_to(s.child, 2, &sender.reply_to(), b"pong")
        .unwrap();
    let back: Vec<_> = completions(&mut bed.client, s.client, 1);
    assert_eq!((back[0].wr_id, back[0].data.as_slice()), (10, &b"pong"[..]));
    let from = back[0].sender.expect("the reply names its sender");
    assert_eq!(
        (from.qp_num, from.addr),
        (s.dest.qp_num, Some(s.server_addr.ip()))
    );
    let server_sent = completions(&mut bed.server, s.child, 1);
    assert_eq!(
        (server_sent[0].wr_id, server_sent[0].status),
        (2, WcStatus::Success)
    );
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

#[test]
fn a_datagram_finding_no_receive_is_dropped_while_its_send_completes() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 0, 0);
    bed.client.post_send_to(s.client, 1, &s.dest, b"lost").unwrap();
    let sent = completions(&mut bed.client, s.client, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success));
    let_time_pass(&mut bed.server);
    // The receive posted now takes the next datagram, not the dropped one.
    bed.server.post_recv(s.child, 7, 64).unwrap();
    bed.client.post_send_to(s.client, 2, &s.dest, b"kept").unwrap();
    let got = completions(&mut bed.server, s.child, 1);
    assert_eq!((got[0].wr_id, got[0].data.as_slice()), (7, &b"kept"[..]));
    let mut more = Vec::new();
    assert_eq!(bed.server.poll_cq(s.child, &mut more, 1, QUIET).unwrap(), 0);
    completions(&mut bed.client, s.client, 1);
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

#[test]
fn post_send_to_is_refused_on_a_connected_qp_and_post_send_on_a_datagram_qp() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 0, 0);
    assert!(matches!(
        bed.client.post_send(s.client, 1, b"no destination"),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    let conn = establish(&mut bed);
    assert!(matches!(
        bed.client.post_send_to(conn.client.id, 1, &s.dest, b"connected"),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    teardown_sidr(&mut bed, s);
    teardown(&mut bed, conn);
}

#[test]
fn a_datagram_from_a_source_gid_of_the_other_family_or_of_none_is_refused_and_the_qp_sends_on() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 1, 64);
    // rxe's table, and the simulator's: the IPv6 link-local GID at 0, the IPv4 address at 1;
    // nothing at 9.
    let other_family = if bed.server_ip.is_ipv4() { 0 } else { 1 };
    for (sgid_index, errno) in [
        (other_family, cm::api::errno::EINVAL),
        (9, cm::api::errno::ENODATA),
    ] {
        let mut dest = s.dest;
        dest.ah_attr.sgid_index = sgid_index;
        assert_err(
            bed.client.post_send_to(s.client, 1, &dest, b"x"),
            CmError::Os {
                call: Call::PostSend,
                errno,
            },
        );
    }
    assert_eq!(
        bed.client.id_machine(s.client).unwrap().qp(),
        Some(cm::QpState::Rts),
        "no address handle, nothing posted"
    );
    bed.client.post_send_to(s.client, 2, &s.dest, b"ok").unwrap();
    let sent = completions(&mut bed.client, s.client, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (2, WcStatus::Success));
    let got = completions(&mut bed.server, s.child, 1);
    assert_eq!(
        got[0].data, b"ok",
        "only the datagram with a fitting source GID left"
    );
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

#[test]
fn post_send_to_without_a_qp_is_refused() {
    let mut bed = bed!();
    let ch = bed.client.create_event_channel().unwrap();
    let id = bed.client.create_id(ch, PortSpace::Udp).unwrap();
    let dest = UdParam {
        qp_num: 1,
        qkey: UDP_QKEY,
        ah_attr: cm::AhAttr::for_ip(bed.server_ip),
    };
    assert_err(
        bed.client.post_send_to(id, 1, &dest, b"x"),
        CmError::NoQp { call: Call::PostSend },
    );
    destroy_all(&mut bed.client, &[id], ch);
}

#[test]
fn a_datagram_longer_than_the_receive_buffer_fails_the_receive_and_the_receivers_qp() {
    let mut bed = bed!();
    let s = sidr(&mut bed, 2, 4);
    bed.client
        .post_send_to(s.client, 1, &s.dest, b"too long")
        .unwrap();
    let got = completions(&mut bed.server, s.child, 2);
    let statuses: Vec<_> = got.iter().map(|wc| (wc.wr_id, wc.status)).collect();
    // The simulator says LOC_LEN_ERR, rxe on Linux 6.1 LOC_QP_OP_ERR (measured in the lab); the
    // receive behind it is flushed with the QP.
    assert!(
        matches!(
            statuses.as_slice(),
            [
                (0, WcStatus::LocLenErr | WcStatus::LocQpOpErr),
                (1, WcStatus::WrFlushErr)
            ]
        ),
        "{statuses:?}"
    );
    assert_eq!(
        bed.server.id_machine(s.child).unwrap().qp(),
        Some(cm::QpState::Err)
    );
    // The sender is told nothing: its datagram left.
    let sent = completions(&mut bed.client, s.client, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (1, WcStatus::Success));
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}
