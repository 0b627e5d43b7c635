//! Multicast on the UDP port space, on every backend: `MULTICAST_JOIN` and what it reports, a
//! group send reaching the members and only them, leaving, and the misuse of both calls.

use std::net::{IpAddr, SocketAddr};

use cm::api::{
    Call, ChannelHandle, CmBackend, CmError, CmEventType, IdHandle, IdState, PortSpace, QpCaps, QpState,
    UdParam, WcOpcode, WcStatus, WorkCompletion, MULTICAST_QPN, UDP_QKEY,
};

use crate::support::*;

/// A group of its own per test (tests run in parallel on one device in the lab), of the
/// family of the bed's addresses: an IPv6 id joined to an IPv4 group is accepted by the kernel
/// but gets none of its datagrams on rxe.
fn group(bed: &mut Bed<impl CmBackend>) -> SocketAddr {
    let port = bed.port();
    group_of(bed.server_ip, 7, port)
}

/// Group `n`.`low` in `ip`'s family: 239.n.x.y or ff0e::239:n:low.
fn group_of(ip: IpAddr, n: u8, low: u16) -> SocketAddr {
    let group = match ip {
        IpAddr::V4(_) => IpAddr::from([239, n, (low >> 8) as u8, low as u8]),
        IpAddr::V6(_) => IpAddr::from([0xff0e, 0, 0, 0, 0, 0x239, u16::from(n), low]),
    };
    SocketAddr::new(group, 0)
}

/// A datagram id bound to `ip`, without a QP.
fn bound_udp<B: CmBackend>(b: &mut B, ch: ChannelHandle, ip: IpAddr) -> IdHandle {
    let id = b.create_id(ch, PortSpace::Udp).expect("create_id");
    b.bind_addr(id, SocketAddr::new(ip, 0)).expect("bind");
    id
}

/// A datagram id bound to `ip` with a UD QP and `recvs` receives of 64 bytes posted.
fn bound_ud<B: CmBackend>(b: &mut B, ch: ChannelHandle, ip: IpAddr, recvs: u64) -> IdHandle {
    let id = bound_udp(b, ch, ip);
    b.create_qp(id, QpCaps::new()).expect("create_qp");
    for wr in 0..recvs {
        b.post_recv(id, wr, 64).expect("post_recv");
    }
    id
}

/// Joins `group` and retrieves the `MULTICAST_JOIN`, acked; its destination.
fn join<B: CmBackend>(b: &mut B, ch: ChannelHandle, id: IdHandle, group: SocketAddr) -> UdParam {
    b.join_multicast(id, group).expect("join_multicast");
    let ev = b
        .get_cm_event(ch, WAIT)
        .expect("get_cm_event")
        .expect("MULTICAST_JOIN");
    assert_eq!(ev.event(), CmEventType::MulticastJoin, "status {}", ev.status());
    assert_eq!(ev.id(), id);
    let dest = *ev.ud_param().expect("MULTICAST_JOIN reports the group");
    b.ack_cm_event(ev).expect("ack");
    dest
}

/// The datagrams that arrive on `id` within `timeout`, as their payloads.
fn received<B: CmBackend>(
    b: &mut B,
    id: IdHandle,
    want: usize,
    timeout: std::time::Duration,
) -> Vec<Vec<u8>> {
    let mut wcs: Vec<WorkCompletion> = Vec::new();
    let deadline = std::time::Instant::now() + timeout;
    while wcs.len() < want && std::time::Instant::now() < deadline {
        let more = want - wcs.len();
        b.poll_cq(id, &mut wcs, more, QUIET).expect("poll_cq");
    }
    wcs.into_iter().map(|wc| wc.data).collect()
}

#[test]
fn multicast_join_reports_the_groups_qpn_qkey_and_gid() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 0);
    s.join_multicast(id, g).expect("join_multicast");
    let ev = s
        .get_cm_event(ch, WAIT)
        .expect("get_cm_event")
        .expect("MULTICAST_JOIN");
    assert_eq!(ev.event(), CmEventType::MulticastJoin);
    assert_eq!(ev.status(), 0);
    let dest = *ev.ud_param().expect("the group");
    assert_eq!((dest.qp_num, dest.qkey), (MULTICAST_QPN, UDP_QKEY));
    assert_eq!(dest.ah_attr.dest_ip(), Some(g.ip()));
    assert_eq!(ev.param().qp_num, MULTICAST_QPN);
    s.ack_cm_event(ev).expect("ack");
    // Joining changes nothing of the id's state.
    assert_eq!(s.id_machine(id).expect("live").state(), IdState::AddrBound);
    s.leave_multicast(id, g).expect("leave");
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn a_datagram_sent_to_the_group_reaches_every_member_and_no_other_qp() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    let a = bound_ud(&mut bed.server, sch, sip, 2);
    let b = bound_ud(&mut bed.client, cch, cip, 2);
    let outsider = bound_ud(&mut bed.server, sch, sip, 2);
    // The sender joins without posting receives: whether a group send comes back to the
    // sending QP is left open.
    let sender = bound_ud(&mut bed.client, cch, cip, 0);
    join(&mut bed.server, sch, a, g);
    join(&mut bed.client, cch, b, g);
    let dest = join(&mut bed.client, cch, sender, g);
    bed.client
        .post_send_to(sender, 9, &dest, b"to the group")
        .expect("post_send_to");
    let mut sent = Vec::new();
    bed.client.poll_cq(sender, &mut sent, 1, WAIT).expect("poll_cq");
    assert_eq!(sent.len(), 1, "the send completes");
    assert_eq!(
        received(&mut bed.server, a, 1, WAIT),
        vec![b"to the group".to_vec()]
    );
    assert_eq!(
        received(&mut bed.client, b, 1, WAIT),
        vec![b"to the group".to_vec()]
    );
    assert!(
        received(&mut bed.server, outsider, 1, QUIET).is_empty(),
        "a QP that did not join gets nothing"
    );
    bed.server.leave_multicast(a, g).expect("leave");
    bed.client.leave_multicast(b, g).expect("leave");
    bed.client.leave_multicast(sender, g).expect("leave");
    destroy_all(&mut bed.server, &[a, outsider], sch);
    destroy_all(&mut bed.client, &[b, sender], cch);
    assert_clean(&bed);
}

#[test]
fn a_qp_that_did_not_join_sends_to_the_group_with_what_the_join_reported_or_group_ud_param() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    let member = bound_ud(&mut bed.server, sch, sip, 2);
    let outsider = bound_ud(&mut bed.client, cch, cip, 0);
    let dest = join(&mut bed.server, sch, member, g);
    assert_eq!(
        cm::group_ud_param(g.ip()),
        dest,
        "group_ud_param is what the join reports"
    );
    for (wr, payload, to) in [
        (1, b"as joined", dest),
        (2, b"as helped", cm::group_ud_param(g.ip())),
    ] {
        bed.client
            .post_send_to(outsider, wr, &to, payload)
            .expect("post_send_to");
        let mut sent = Vec::new();
        bed.client.poll_cq(outsider, &mut sent, 1, WAIT).expect("poll_cq");
        let sent: Vec<_> = sent.iter().map(|wc| (wc.wr_id, wc.status)).collect();
        assert_eq!(
            sent,
            [(wr, WcStatus::Success)],
            "membership is not needed to send"
        );
        assert_eq!(received(&mut bed.server, member, 1, WAIT), vec![payload.to_vec()]);
    }
    assert_eq!(bed.client.id_machine(outsider).unwrap().qp(), Some(QpState::Rts));
    bed.server.leave_multicast(member, g).expect("leave");
    destroy_all(&mut bed.server, &[member], sch);
    destroy_all(&mut bed.client, &[outsider], cch);
    assert_clean(&bed);
}

#[test]
fn a_group_send_from_a_source_gid_of_the_other_family_fails_the_send_and_the_qp() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    let member = bound_ud(&mut bed.server, sch, sip, 2);
    let sender = bound_ud(&mut bed.client, cch, cip, 1);
    let mut dest = join(&mut bed.server, sch, member, g);
    // GID 0 is the port's IPv6 link-local GID, on rxe and in the simulator; the group is IPv4.
    dest.ah_attr.sgid_index = 0;
    bed.client
        .post_send_to(sender, 7, &dest, b"from the wrong GID")
        .expect("the address handle is made: the send fails on the QP");
    let mut wcs = Vec::new();
    bed.client.poll_cq(sender, &mut wcs, 1, WAIT).expect("poll_cq");
    let first: Vec<_> = wcs.iter().map(|wc| (wc.wr_id, wc.status, wc.opcode)).collect();
    assert_eq!(first, [(7, WcStatus::LocQpOpErr, WcOpcode::Send)]);
    // What the QP held and what is posted after are flushed (rxe: the posted receive first).
    bed.client
        .post_send_to(sender, 8, &cm::group_ud_param(g.ip()), b"after")
        .expect("post_send_to on a QP in ERR");
    assert_eq!(bed.client.id_machine(sender).unwrap().qp(), Some(QpState::Err));
    let rest: Vec<_> = completions(&mut bed.client, sender, 2)
        .iter()
        .map(|wc| (wc.wr_id, wc.status, wc.opcode))
        .collect();
    assert_eq!(
        rest,
        [
            (0, WcStatus::WrFlushErr, WcOpcode::Recv),
            (8, WcStatus::WrFlushErr, WcOpcode::Send)
        ]
    );
    assert!(
        received(&mut bed.server, member, 1, QUIET).is_empty(),
        "nothing reached the group"
    );
    bed.server.leave_multicast(member, g).expect("leave");
    destroy_all(&mut bed.server, &[member], sch);
    destroy_all(&mut bed.client, &[sender], cch);
    assert_clean(&bed);
}

#[test]
fn a_member_that_left_gets_no_more_of_the_groups_datagrams() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    let member = bound_ud(&mut bed.server, sch, sip, 2);
    let sender = bound_ud(&mut bed.client, cch, cip, 0);
    join(&mut bed.server, sch, member, g);
    let dest = join(&mut bed.client, cch, sender, g);
    bed.server.leave_multicast(member, g).expect("leave");
    bed.client
        .post_send_to(sender, 1, &dest, b"after leaving")
        .expect("post_send_to");
    assert!(received(&mut bed.server, member, 1, QUIET).is_empty());
    assert_eq!(
        bed.server.leave_multicast(member, g),
        Err(CmError::AddrNotAvailable {
            call: Call::LeaveMulticast
        }),
        "a group left is no longer joined"
    );
    bed.client.leave_multicast(sender, g).expect("leave");
    destroy_all(&mut bed.server, &[member], sch);
    destroy_all(&mut bed.client, &[sender], cch);
    assert_clean(&bed);
}

#[test]
fn a_join_without_a_qp_attaches_none_created_later() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    let late = bound_udp(&mut bed.server, sch, sip);
    // librdmacm attaches the id's QP when it hands out MULTICAST_JOIN, and there is none yet.
    join(&mut bed.server, sch, late, g);
    bed.server.create_qp(late, QpCaps::new()).expect("create_qp");
    bed.server.post_recv(late, 1, 64).expect("post_recv");
    let sender = bound_ud(&mut bed.client, cch, cip, 0);
    let dest = join(&mut bed.client, cch, sender, g);
    bed.client
        .post_send_to(sender, 1, &dest, b"unattached")
        .expect("post_send_to");
    assert!(received(&mut bed.server, late, 1, QUIET).is_empty());
    bed.server.leave_multicast(late, g).expect("leave");
    bed.client.leave_multicast(sender, g).expect("leave");
    destroy_all(&mut bed.server, &[late], sch);
    destroy_all(&mut bed.client, &[sender], cch);
    assert_clean(&bed);
}

#[test]
fn leaving_a_group_not_joined_is_refused_with_eaddrnotavail() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 0);
    let err = s.leave_multicast(id, g).unwrap_err();
    assert_eq!(
        err,
        CmError::AddrNotAvailable {
            call: Call::LeaveMulticast
        }
    );
    assert_eq!(err.errno(), cm::api::errno::EADDRNOTAVAIL);
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn an_ipv6_group_is_refused_with_enotsupp_as_rocev2_refuses_it() {
    let mut bed = bed!();
    let port = bed.port();
    let v6 = group_of(IpAddr::from([0u16, 0, 0, 0, 0, 0, 0, 1]), 9, port);
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 0);
    let err = s.join_multicast(id, v6).unwrap_err();
    assert_eq!(
        err,
        CmError::Os {
            call: Call::JoinMulticast,
            errno: ENOTSUPP
        }
    );
    assert_eq!(
        s.leave_multicast(id, v6).unwrap_err(),
        CmError::AddrNotAvailable {
            call: Call::LeaveMulticast
        },
        "a refused join leaves no membership behind"
    );
    join(s, ch, id, g);
    s.leave_multicast(id, g).expect("leave");
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

/// The kernel's `ENOTSUPP` (not `ENOTSUP`): what `rdma_join_multicast` gives for an IPv6 group
/// on RoCEv2, passed to user space as it is.
const ENOTSUPP: i32 = 524;

#[test]
fn leaving_while_the_join_event_is_unacked_is_refused_instead_of_blocking() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 0);
    s.join_multicast(id, g).expect("join_multicast");
    let ev = s
        .get_cm_event(ch, WAIT)
        .expect("get_cm_event")
        .expect("MULTICAST_JOIN");
    assert_eq!(
        s.leave_multicast(id, g),
        Err(CmError::UnackedEvents {
            call: Call::LeaveMulticast,
            count: 1
        })
    );
    s.ack_cm_event(ev).expect("ack");
    s.leave_multicast(id, g).expect("leave after the ack");
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn a_join_left_before_its_event_was_retrieved_reports_nothing() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 0);
    s.join_multicast(id, g).expect("join_multicast");
    s.leave_multicast(id, g).expect("leave");
    expect_quiet(s, ch);
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn join_needs_a_datagram_id_bound_to_a_device_and_a_multicast_group_joined_once() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let idle = s.create_id(ch, PortSpace::Udp).expect("create_id");
    let wrong = |state| CmError::WrongState {
        call: Call::JoinMulticast,
        state,
        expected: "a datagram id bound to a device (RDMA_CM_ADDR_BOUND or RDMA_CM_ADDR_RESOLVED)",
    };
    assert_eq!(s.join_multicast(idle, g), Err(wrong(IdState::Idle)));
    let tcp = s.create_id(ch, PortSpace::Tcp).expect("create_id");
    s.bind_addr(tcp, SocketAddr::new(ip, 0)).expect("bind");
    assert_eq!(s.join_multicast(tcp, g), Err(wrong(IdState::AddrBound)));
    let id = bound_ud(s, ch, ip, 0);
    let unicast = SocketAddr::new(ip, 0);
    let err = s.join_multicast(id, unicast).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::InvalidArgument {
                call: Call::JoinMulticast,
                ..
            }
        ),
        "{err:?}"
    );
    join(s, ch, id, g);
    assert_eq!(
        s.join_multicast(id, g),
        Err(CmError::AddrInUse {
            call: Call::JoinMulticast
        })
    );
    s.leave_multicast(id, g).expect("leave");
    expect_quiet(s, ch);
    destroy_all(s, &[idle, tcp, id], ch);
    assert_clean(&bed);
}

#[test]
fn a_qp_attached_to_a_group_is_not_destroyed_until_the_group_is_left() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let id = bound_ud(s, ch, ip, 1);
    join(s, ch, id, g);
    // The kernel refuses (EBUSY, measured on rxe) and librdmacm would leak the QP regardless.
    let err = s.destroy_qp(id).unwrap_err();
    assert_eq!(
        (err.clone(), err.errno()),
        (CmError::QpInGroups { groups: 1 }, cm::api::errno::EBUSY)
    );
    assert!(err.is_guarded_misuse());
    s.leave_multicast(id, g).expect("leave");
    s.destroy_qp(id).expect("destroy_qp once detached");
    destroy_all(s, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn destroying_an_id_leaves_its_groups() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let (sip, cip) = (bed.server_ip, bed.client_ip);
    let sch = bed.server.create_event_channel().expect("channel");
    let cch = bed.client.create_event_channel().expect("channel");
    // Joined without a QP (nothing attached), and a second join whose event is still queued:
    // both memberships go with the id, the queued event too.
    let gone = bound_udp(&mut bed.server, sch, sip);
    join(&mut bed.server, sch, gone, g);
    let other = group_of(sip, 8, 1);
    bed.server.join_multicast(gone, other).expect("join_multicast");
    bed.server
        .destroy_id(gone)
        .expect("destroy_id with groups joined");
    expect_quiet(&mut bed.server, sch);
    // The group still works for those who stay.
    let member = bound_ud(&mut bed.server, sch, sip, 1);
    join(&mut bed.server, sch, member, g);
    let sender = bound_ud(&mut bed.client, cch, cip, 0);
    let dest = join(&mut bed.client, cch, sender, g);
    bed.client
        .post_send_to(sender, 1, &dest, b"still here")
        .expect("post_send_to");
    assert_eq!(
        received(&mut bed.server, member, 1, WAIT),
        vec![b"still here".to_vec()]
    );
    bed.server.leave_multicast(member, g).expect("leave");
    bed.client.leave_multicast(sender, g).expect("leave");
    destroy_all(&mut bed.server, &[member], sch);
    destroy_all(&mut bed.client, &[sender], cch);
    assert_clean(&bed);
}

#[test]
fn a_group_attaches_at_most_rxes_56_qps_and_the_57th_join_reports_multicast_error() {
    let mut bed = bed!();
    let g = group(&mut bed);
    let ip = bed.server_ip;
    let s = &mut bed.server;
    let ch = s.create_event_channel().expect("channel");
    let members: Vec<IdHandle> = (0..56)
        .map(|_| {
            let id = bound_ud(s, ch, ip, 0);
            join(s, ch, id, g);
            id
        })
        .collect();
    // The kernel joins it; librdmacm's ibv_attach_mcast is refused (ENOMEM) and it reports the
    // join as MULTICAST_ERROR with rdma_seterrno's -1.
    let extra = bound_ud(s, ch, ip, 0);
    s.join_multicast(extra, g).expect("join_multicast");
    let ev = s.get_cm_event(ch, WAIT).expect("get_cm_event").expect("an event");
    assert_eq!(
        (ev.event(), ev.status(), ev.id()),
        (CmEventType::MulticastError, -1, extra)
    );
    s.ack_cm_event(ev).expect("ack");
    // Not attached: its QP goes while it is still in the group, which an attached one cannot.
    s.destroy_qp(extra).expect("destroy_qp of the QP left unattached");
    assert!(matches!(
        s.destroy_qp(members[0]),
        Err(CmError::QpInGroups { groups: 1 })
    ));
    // A member that leaves makes room for another.
    s.leave_multicast(members[0], g).expect("leave");
    let another = bound_ud(s, ch, ip, 0);
    join(s, ch, another, g);
    for &id in members.iter().chain([&another]) {
        if id != members[0] {
            s.leave_multicast(id, g).expect("leave");
        }
    }
    s.leave_multicast(extra, g)
        .expect("leave the group joined unattached");
    let mut all = members.clone();
    all.extend([extra, another]);
    destroy_all(s, &all, ch);
    assert_clean(&bed);
}
