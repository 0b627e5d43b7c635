//! Scenario tests: one per behaviour of the connection lifecycle, with exact event sequences,
//! statuses and errnos. The same file runs on every backend.

use std::net::SocketAddr;

use cm::api::{
    errno, CmBackend, CmError, CmEventType, ConnParam, IdState, PortSpace, QpCaps, QpState, WcOpcode,
    WcStatus,
};

use crate::support::*;

#[test]
fn bind_reports_addr_in_use_not_available_and_wrong_state() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let b = &mut bed.server;
    let ch = b.create_event_channel().unwrap();
    let first = b.create_id(ch, PortSpace::Tcp).unwrap();
    let second = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.bind_addr(first, addr).unwrap();
    assert_eq!(b.get_local_addr(first).unwrap(), Some(addr));
    let err = b.bind_addr(second, addr).unwrap_err();
    assert_eq!(
        (err.clone(), err.errno()),
        (
            CmError::AddrInUse {
                call: cm::api::Call::BindAddr
            },
            errno::EADDRINUSE
        )
    );
    // The wildcard of the address's family (the hardware runner runs on IPv4 and on IPv6).
    let any: std::net::IpAddr = if addr.is_ipv4() {
        std::net::Ipv4Addr::UNSPECIFIED.into()
    } else {
        std::net::Ipv6Addr::UNSPECIFIED.into()
    };
    let wildcard = SocketAddr::new(any, addr.port());
    let err = b.bind_addr(second, wildcard).unwrap_err();
    assert_eq!(
        err.errno(),
        errno::EADDRNOTAVAIL,
        "wildcard on a port bound to an address: {err}"
    );
    // An address no local interface has (on a fresh id: the kernel remembers the device of an
    // id's earlier failed bind and then answers ENODEV instead).
    let third = b.create_id(ch, PortSpace::Tcp).unwrap();
    let not_local = SocketAddr::new(bed.unreachable_ip, 0);
    assert_eq!(
        bed.server.bind_addr(third, not_local).unwrap_err().errno(),
        errno::EADDRNOTAVAIL
    );
    let b = &mut bed.server;
    let err = b.bind_addr(first, addr).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::WrongState {
                state: IdState::AddrBound,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), errno::EINVAL);
    // Port 0 picks a free port.
    b.bind_addr(second, SocketAddr::new(addr.ip(), 0)).unwrap();
    let picked = b.get_local_addr(second).unwrap().unwrap();
    assert_ne!(picked.port(), 0);
    destroy_all(b, &[first, second, third], ch);
    assert_clean(&bed);
}

#[test]
fn resolve_addr_and_route_deliver_their_events() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, false);
    let m = bed.client.id_machine(client.id).unwrap();
    assert_eq!(m.state(), IdState::RouteResolved);
    assert!(m.has_device());
    assert_eq!(bed.client.get_peer_addr(client.id).unwrap(), Some(dst));
    assert_eq!(
        bed.client.get_local_addr(client.id).unwrap().map(|a| a.ip()),
        Some(bed.client_ip)
    );
    destroy_all(&mut bed.client, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn resolve_addr_to_an_address_nobody_has_times_out() {
    let mut bed = bed!();
    let dst = SocketAddr::new(bed.unreachable_ip, 7471);
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.resolve_addr(id, Some(src), dst, std::time::Duration::from_millis(500))
        .unwrap();
    let ev = expect(b, ch, CmEventType::AddrError);
    assert_eq!(ev.status, -errno::ETIMEDOUT);
    // Back in ADDR_BOUND: resolution may be retried.
    assert_eq!(b.id_machine(id).unwrap().state(), IdState::AddrBound);
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn create_qp_puts_the_qp_in_init() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, false);
    let b = &mut bed.client;
    let caps = b.create_qp(client.id, QpCaps::new()).unwrap();
    assert!(caps.max_send_wr >= QpCaps::new().max_send_wr && caps.max_recv_wr >= QpCaps::new().max_recv_wr);
    assert_eq!(b.id_machine(client.id).unwrap().qp(), Some(QpState::Init));
    assert_eq!(b.live_resources().qps, 1);
    destroy_all(b, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn connect_accept_establishes_active_side_first() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client
        .connect(client.id, &ConnParam::new().with_private_data(b"hello"))
        .unwrap();

    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(server.listener));
    assert_ne!(req.id, server.listener, "the request comes with a new child id");
    assert_eq!(req.status, 0);
    assert_eq!(
        req.private_data.len(),
        56,
        "connect private data is padded to 56 bytes"
    );
    assert_eq!(&req.private_data[..5], b"hello");
    assert!(req.private_data[5..].iter().all(|&b| b == 0));
    let child = req.id;
    assert_eq!(bed.server.id_machine(child).unwrap().state(), IdState::Connect);

    bed.server.create_qp(child, QpCaps::new()).unwrap();
    bed.server
        .accept(child, &ConnParam::new().with_private_data(b"welcome"))
        .unwrap();
    assert_eq!(bed.server.id_machine(child).unwrap().qp(), Some(QpState::Rts));
    // The passive side's ESTABLISHED needs the RTU, which librdmacm sends when the active side
    // retrieves its own ESTABLISHED: nothing can arrive on the server before that.
    expect_quiet(&mut bed.server, server.ch);
    let est = expect(&mut bed.client, client.ch, CmEventType::Established);
    assert_eq!(est.status, 0);
    assert_eq!(
        est.private_data.len(),
        196,
        "accept private data is padded to 196 bytes"
    );
    assert_eq!(&est.private_data[..7], b"welcome");
    assert_eq!(bed.client.id_machine(client.id).unwrap().qp(), Some(QpState::Rts));
    let est = expect(&mut bed.server, server.ch, CmEventType::Established);
    assert_eq!(est.id, child);
    assert!(est.private_data.is_empty());
    teardown(
        &mut bed,
        Conn {
            server,
            client,
            child,
        },
    );
}

#[test]
fn reject_delivers_rejected_with_status_28_and_private_data() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let child = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest).id;
    bed.server.reject(child, b"connection rejected").unwrap();
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 28);
    assert_eq!(
        rej.private_data.len(),
        148,
        "reject private data is padded to 148 bytes"
    );
    assert_eq!(&rej.private_data[..19], b"connection rejected");
    // librdmacm moves the QP to ERR on REJECTED; the id stays in CONNECT and cannot reconnect.
    let m = bed.client.id_machine(client.id).unwrap();
    assert_eq!((m.state(), m.qp()), (IdState::Connect, Some(QpState::Err)));
    assert!(matches!(
        bed.client.connect(client.id, &ConnParam::new()),
        Err(CmError::WrongState { .. })
    ));
    // A rejected child gets no events; it must still be destroyed.
    expect_quiet(&mut bed.server, server.ch);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn take_cm_event_reads_each_event_once_and_leaves_it_acked() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    let s = &mut bed.server;
    assert!(
        s.take_cm_event(server.ch, |_| ()).unwrap().is_none(),
        "nothing queued: None at once"
    );
    bed.client
        .connect(client.id, &ConnParam::new().with_private_data(b"take me"))
        .unwrap();
    let s = &mut bed.server;
    let mut got = None;
    for _ in 0..50 {
        got = s
            .take_cm_event(server.ch, |ev| {
                (ev.event(), ev.id(), ev.listen_id(), ev.private_data().to_vec())
            })
            .unwrap();
        if got.is_some() {
            break;
        }
        let_time_pass(s);
    }
    let (ty, child, listen_id, data) = got.expect("CONNECT_REQUEST within 50 waits");
    assert_eq!(
        (ty, listen_id),
        (CmEventType::ConnectRequest, Some(server.listener))
    );
    assert_eq!(&data[..7], b"take me");
    // Acked on the way out: nothing counts against the listener, nothing is left to take.
    assert_eq!(s.id_machine(server.listener).unwrap().unacked(), 0);
    assert_eq!(s.live_resources().unacked_events, 0);
    assert!(s.take_cm_event(server.ch, |_| ()).unwrap().is_none());
    s.reject(child, &[]).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Rejected);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_err(
        bed.server.take_cm_event(server.ch, |_| ()),
        CmError::UnknownHandle {
            call: cm::api::Call::GetCmEvent,
            kind: cm::api::HandleKind::Channel,
        },
    );
    assert_clean(&bed);
}

#[test]
fn connect_to_a_port_without_listener_is_rejected_with_status_8() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 8, "IB_CM_REJ_INVALID_SERVICE_ID");
    destroy_all(&mut bed.client, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn disconnect_flushes_posted_work_and_disconnects_both_sides() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let c = &mut bed.client;
    // Receives and a send with no receive on the other side stay posted until the flush.
    c.post_recv(conn.client.id, 1, 64).unwrap();
    c.post_recv(conn.client.id, 2, 64).unwrap();
    c.post_send(conn.client.id, 3, b"never received").unwrap();
    c.post_recv(conn.client.id, 4, 64).unwrap();
    c.disconnect(conn.client.id).unwrap();
    assert_eq!(
        c.id_machine(conn.client.id).unwrap().qp(),
        Some(QpState::Err),
        "QP to ERR at once"
    );
    let flushed = completions(c, conn.client.id, 4);
    assert!(
        flushed.iter().all(|wc| wc.status == WcStatus::WrFlushErr),
        "{flushed:?}"
    );
    // Every posted work request completes once, flushed, in posting order within its queue
    // (providers differ in how they interleave the two queues: rxe flushes receives first).
    let of = |op| {
        flushed
            .iter()
            .filter(|wc| wc.opcode == op)
            .map(|wc| wc.wr_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(WcOpcode::Recv), [1, 2, 4]);
    assert_eq!(of(WcOpcode::Send), [3]);
    let mut more = Vec::new();
    assert_eq!(
        c.poll_cq(conn.client.id, &mut more, 8, QUIET).unwrap(),
        0,
        "exactly once"
    );
    // Posting in ERR completes at once, flushed.
    c.post_recv(conn.client.id, 5, 64).unwrap();
    let late = completions(c, conn.client.id, 1);
    assert_eq!((late[0].wr_id, late[0].status), (5, WcStatus::WrFlushErr));

    // The peer learns at once; the initiator only when the peer disconnects too.
    let d = expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    assert_eq!((d.id, d.status), (conn.child, 0));
    expect_quiet(&mut bed.client, conn.client.ch);
    assert_eq!(
        bed.server.id_machine(conn.child).unwrap().qp(),
        Some(QpState::Rts),
        "receiving DREQ leaves the QP"
    );
    bed.server.disconnect(conn.child).unwrap();
    let d = expect(&mut bed.client, conn.client.ch, CmEventType::Disconnected);
    assert_eq!(d.status, 0);
    assert_eq!(
        bed.client.id_machine(conn.client.id).unwrap().state(),
        IdState::Disconnect
    );
    // A second disconnect is harmless.
    bed.client.disconnect(conn.client.id).unwrap();
    // TIMEWAIT_EXIT follows on both sides.
    expect(&mut bed.client, conn.client.ch, CmEventType::TimewaitExit);
    expect(&mut bed.server, conn.server.ch, CmEventType::TimewaitExit);
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

#[test]
fn initiator_is_disconnected_when_the_peer_destroys_its_id() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    bed.client.disconnect(conn.client.id).unwrap();
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    // The peer destroys instead of disconnecting: its IB CM answers the DREQ.
    bed.server.destroy_qp(conn.child).unwrap();
    bed.server.destroy_id(conn.child).unwrap();
    let d = expect(&mut bed.client, conn.client.ch, CmEventType::Disconnected);
    assert_eq!(d.status, 0);
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(&mut bed.server, &[conn.server.listener], conn.server.ch);
    assert_clean(&bed);
}

#[test]
fn destroying_a_connected_id_disconnects_the_peer() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    bed.client.destroy_qp(conn.client.id).unwrap();
    bed.client.destroy_id(conn.client.id).unwrap();
    let d = expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    assert_eq!((d.id, d.status), (conn.child, 0));
    bed.client.destroy_event_channel(conn.client.ch).unwrap();
    bed.server.disconnect(conn.child).unwrap();
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

#[test]
fn destroy_cancels_outstanding_work_and_discards_unretrieved_events() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let a = b.create_id(ch, PortSpace::Tcp).unwrap();
    let keep = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.resolve_addr(a, Some(src), dst, WAIT).unwrap();
    b.destroy_id(a).unwrap();
    b.resolve_addr(keep, Some(src), dst, WAIT).unwrap();
    // Only the surviving id's event ever arrives.
    let ev = expect(b, ch, CmEventType::AddrResolved);
    assert_eq!(ev.id, keep);
    expect_quiet(b, ch);
    // An event already queued is discarded with its id.
    b.resolve_route(keep, WAIT).unwrap();
    let_time_pass(b);
    assert_eq!(b.live_resources().unacked_events, 0);
    b.destroy_id(keep).unwrap();
    expect_quiet(b, ch);
    assert_eq!(b.live_resources().queued_events, 0);
    b.destroy_event_channel(ch).unwrap();
    assert_clean(&bed);
}

#[test]
fn connect_request_counts_against_the_listener() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let s = &mut bed.server;
    let ev = s.get_cm_event(server.ch, WAIT).unwrap().expect("CONNECT_REQUEST");
    assert_eq!(ev.event(), CmEventType::ConnectRequest);
    let child = ev.id();
    // Unacked, the request blocks the listener's destroy (librdmacm would hang), not the child's.
    assert_eq!(s.id_machine(server.listener).unwrap().unacked(), 1);
    assert_eq!(s.id_machine(child).unwrap().unacked(), 0);
    assert_err(
        s.destroy_id(server.listener),
        CmError::UnackedEvents {
            call: cm::api::Call::DestroyId,
            count: 1,
        },
    );
    assert_eq!(s.live_resources().unacked_events, 1);
    s.destroy_id(child).unwrap();
    s.ack_cm_event(ev).unwrap();
    s.destroy_id(server.listener).unwrap();
    s.destroy_event_channel(server.ch).unwrap();
    // The client learns that its request was refused when the child went away.
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 28);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn send_lands_in_the_peer_receive_with_its_length() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    bed.server.post_recv(conn.child, 10, 128).unwrap();
    bed.client
        .post_send(conn.client.id, 20, b"ping over rdma")
        .unwrap();
    let sent = completions(&mut bed.client, conn.client.id, 1);
    // The length is the receiver's to count: a send's byte_len is 0 on both backends (verbs
    // leaves it undefined for sends).
    assert_eq!(
        (sent[0].wr_id, sent[0].opcode, sent[0].status, sent[0].byte_len),
        (20, WcOpcode::Send, WcStatus::Success, 0)
    );
    let got = completions(&mut bed.server, conn.child, 1);
    assert_eq!(
        (got[0].wr_id, got[0].opcode, got[0].status),
        (10, WcOpcode::Recv, WcStatus::Success)
    );
    assert_eq!(got[0].byte_len, 14);
    assert_eq!(got[0].data, b"ping over rdma");
    // A send waits for the receive that is posted after it.
    bed.client.post_send(conn.client.id, 21, b"later").unwrap();
    bed.server.post_recv(conn.child, 11, 128).unwrap();
    let got = completions(&mut bed.server, conn.child, 1);
    assert_eq!((got[0].wr_id, got[0].data.as_slice()), (11, &b"later"[..]));
    assert_eq!(completions(&mut bed.client, conn.client.id, 1)[0].wr_id, 21);
    teardown(&mut bed, conn);
}

#[test]
fn qp_state_rules_on_the_data_path() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, true);
    let b = &mut bed.client;
    // INIT: receives may be posted, sends may not.
    b.post_recv(client.id, 1, 64).unwrap();
    assert_err(
        b.post_send(client.id, 2, b"x"),
        CmError::WrongQpState {
            call: cm::api::Call::PostSend,
            state: QpState::Init,
        },
    );
    let too_long = QpCaps::new().max_message_size + 1;
    assert_eq!(
        b.post_recv(client.id, 3, too_long).unwrap_err().errno(),
        errno::EINVAL
    );
    for wr in 0..QpCaps::new().max_recv_wr - 1 {
        b.post_recv(client.id, 100 + u64::from(wr), 64).unwrap();
    }
    assert!(matches!(
        b.post_recv(client.id, 4, 64),
        Err(CmError::QueueFull { .. })
    ));
    b.destroy_qp(client.id).unwrap();
    assert_err(
        b.post_recv(client.id, 5, 64),
        CmError::NoQp {
            call: cm::api::Call::PostRecv,
        },
    );
    destroy_all(b, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn private_data_longer_than_the_port_space_allows_is_refused() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    assert_err(
        bed.client
            .connect(client.id, &ConnParam::new().with_private_data(&[7; 57])),
        CmError::PrivateDataTooLong {
            call: cm::api::Call::Connect,
            len: 57,
            max: 56,
        },
    );
    bed.client
        .connect(client.id, &ConnParam::new().with_private_data(&[7; 56]))
        .unwrap();
    let child = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest).id;
    let s = &mut bed.server;
    s.create_qp(child, QpCaps::new()).unwrap();
    assert_err(
        s.accept(child, &ConnParam::new().with_private_data(&[1; 197])),
        CmError::PrivateDataTooLong {
            call: cm::api::Call::Accept,
            len: 197,
            max: 196,
        },
    );
    assert_err(
        s.reject(child, &[1; 149]),
        CmError::PrivateDataTooLong {
            call: cm::api::Call::Reject,
            len: 149,
            max: 148,
        },
    );
    s.reject(child, &[1; 148]).unwrap();
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(rej.private_data, vec![1; 148]);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn a_full_backlog_drops_requests_until_there_is_room() {
    let mut bed = bed!();
    let server = listen(&mut bed, 1);
    let first = resolved_client(&mut bed, server.addr, true);
    let second = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(first.id, &ConnParam::new()).unwrap();
    let_time_pass(&mut bed.server);
    // The first request is queued, unretrieved: the backlog of 1 is full, so the kernel drops
    // the second one without an answer and the client's IB CM retransmits it later.
    bed.client.connect(second.id, &ConnParam::new()).unwrap();
    let_time_pass(&mut bed.server);
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    expect_quiet(&mut bed.client, second.ch);
    bed.server.reject(req.id, &[]).unwrap();
    expect(&mut bed.client, first.ch, CmEventType::Rejected);
    // Now there is room: the retransmitted request gets in.
    let again = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    bed.server.reject(again.id, &[]).unwrap();
    let rej = expect(&mut bed.client, second.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 28);
    destroy_all(&mut bed.client, &[first.id], first.ch);
    destroy_all(&mut bed.client, &[second.id], second.ch);
    destroy_all(&mut bed.server, &[req.id, again.id, server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn datagram_port_space_resolves_a_service_without_a_connection() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let s = &mut bed.server;
    let sch = s.create_event_channel().unwrap();
    let listener = s.create_id(sch, PortSpace::Udp).unwrap();
    s.bind_addr(listener, addr).unwrap();
    s.listen(listener, 0).unwrap();
    let c = &mut bed.client;
    let cch = c.create_event_channel().unwrap();
    let id = c.create_id(cch, PortSpace::Udp).unwrap();
    c.resolve_addr(id, Some(src), addr, WAIT).unwrap();
    expect(c, cch, CmEventType::AddrResolved);
    c.resolve_route(id, WAIT).unwrap();
    expect(c, cch, CmEventType::RouteResolved);
    c.create_qp(id, QpCaps::new()).unwrap();
    assert_eq!(
        c.id_machine(id).unwrap().qp(),
        Some(QpState::Rts),
        "UD QPs are ready at once"
    );
    c.connect(id, &ConnParam::new().with_private_data(b"sidr"))
        .unwrap();
    let req = expect(&mut bed.server, sch, CmEventType::ConnectRequest);
    assert_eq!(req.private_data.len(), 180);
    let s = &mut bed.server;
    s.create_qp(req.id, QpCaps::new()).unwrap();
    s.accept(req.id, &ConnParam::new()).unwrap();
    let est = expect(&mut bed.client, cch, CmEventType::Established);
    assert_eq!(est.private_data.len(), 136);
    // The passive side gets nothing more.
    expect_quiet(&mut bed.server, sch);
    destroy_all(&mut bed.client, &[id], cch);
    destroy_all(&mut bed.server, &[req.id, listener], sch);
    assert_clean(&bed);
}
