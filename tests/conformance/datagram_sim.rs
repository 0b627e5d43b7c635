//! Simulator-only datagram tests: each needs a control real hardware does not have (a seed, a
//! `Loss` fault with an exact rate, virtual time) and says which. The hardware runner does not
//! include this file.

use cm::api::{CmBackend, WcStatus};
use cm::sim::{Fault, SimFabric};

use crate::datagram::{sidr, teardown_sidr};
use crate::support::*;

/// A bed on a fabric the test keeps a handle to (for faults).
fn bed_on(fabric: &SimFabric) -> Bed<cm::SimHost> {
    Bed::new(
        fabric.host(0),
        fabric.host(1),
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.99".parse().unwrap(),
        7600,
        fabric.repro_line(),
    )
}

fn fabric(seed: u64) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build()
}

/// `n` datagrams `0..n` (one byte each, its number) from the client; what the server received,
/// in arrival order.
fn send_numbered(bed: &mut Bed<cm::SimHost>, s: &crate::datagram::Sidr, n: u8) -> Vec<u8> {
    for i in 0..n {
        bed.client
            .post_send_to(s.client, u64::from(i), &s.dest, &[i])
            .unwrap();
    }
    let sent = completions(&mut bed.client, s.client, usize::from(n));
    assert!(
        sent.iter().all(|wc| wc.status == WcStatus::Success),
        "UD sends complete as they leave"
    );
    let got = completions(&mut bed.server, s.child, usize::from(n));
    got.iter().map(|wc| wc.data[0]).collect()
}

// Needs: a seed, and a latency drawn per datagram (virtual time).
#[test]
fn datagrams_arrive_in_a_seeded_order_that_is_not_the_sending_order() {
    let run = |seed| {
        let fabric = fabric(seed);
        let mut bed = bed_on(&fabric);
        let s = sidr(&mut bed, 16, 8);
        let order = send_numbered(&mut bed, &s, 16);
        teardown_sidr(&mut bed, s);
        assert_clean(&bed);
        order
    };
    let order = run(11);
    let mut sorted = order.clone();
    sorted.sort_unstable();
    assert_eq!(sorted, (0..16).collect::<Vec<u8>>(), "each datagram arrives once");
    assert_ne!(
        order, sorted,
        "UD guarantees no order, and the model uses that freedom"
    );
    assert_eq!(run(11), order, "the same seed gives the same order");
}

// Needs: a Loss fault with an exact rate.
#[test]
fn a_lossy_link_drops_datagrams_and_a_clean_one_drops_none() {
    let fabric = fabric(5);
    let mut bed = bed_on(&fabric);
    let s = sidr(&mut bed, 16, 8);
    assert_eq!(send_numbered(&mut bed, &s, 8).len(), 8);
    for wr in 16..24 {
        bed.server.post_recv(s.child, wr, 8).unwrap();
    }
    fabric.inject(Fault::Loss {
        a: 1,
        b: 0,
        per_mille: 500,
    });
    let got = send_numbered(&mut bed, &s, 16);
    assert!(
        !got.is_empty() && got.len() < 16,
        "half the datagrams lost on average, got {} of 16",
        got.len()
    );
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

// Needs: virtual time (the drop is shown by a receive that stays posted) and the simulator's MTU.
#[test]
fn a_datagram_longer_than_the_path_mtu_is_dropped_though_the_buffer_would_hold_it() {
    let fabric = fabric(3);
    let mut bed = bed_on(&fabric);
    let s = sidr(&mut bed, 1, 4096);
    // Over the path MTU (1024, rxe's on a 1500-byte link).
    bed.client.post_send_to(s.client, 1, &s.dest, &[7; 1025]).unwrap();
    let mut none = Vec::new();
    assert_eq!(bed.server.poll_cq(s.child, &mut none, 1, QUIET).unwrap(), 0);
    bed.client.post_send_to(s.client, 2, &s.dest, &[8; 1024]).unwrap();
    let got = completions(&mut bed.server, s.child, 1);
    assert_eq!((got[0].wr_id, got[0].byte_len), (0, 1024));
    let sent = completions(&mut bed.client, s.client, 2);
    assert!(sent.iter().all(|wc| wc.status == WcStatus::Success));
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

// Needs: the simulator's own call (the trait sends no immediate data, as rdma_post_ud_send).
#[test]
fn a_datagram_sent_with_immediate_data_reports_it_and_its_sender_to_the_receiver() {
    let fabric = fabric(9);
    let mut bed = bed_on(&fabric);
    let s = sidr(&mut bed, 2, 64);
    let own_qpn = bed
        .client
        .qp_num(s.client)
        .unwrap()
        .expect("the client holds a QP");
    bed.client
        .post_send_to_with_imm(s.client, 1, &s.dest, b"imm", own_qpn.to_be())
        .unwrap();
    bed.client.post_send_to(s.client, 2, &s.dest, b"none").unwrap();
    let mut got = completions(&mut bed.server, s.child, 2);
    got.sort_by_key(|wc| wc.data.len());
    assert_eq!(
        (got[0].data.as_slice(), got[0].imm_data),
        (&b"imm"[..], Some(own_qpn.to_be()))
    );
    assert_eq!((got[1].data.as_slice(), got[1].imm_data), (&b"none"[..], None));
    assert!(got.iter().all(|wc| wc.sender.map(|u| u.qp_num) == Some(own_qpn)));
    assert_eq!(
        bed.server.qp_num(s.child).unwrap(),
        Some(s.dest.qp_num),
        "what the SIDR reply named"
    );
    teardown_sidr(&mut bed, s);
    assert_clean(&bed);
}

// Needs: rxe's 8 192 groups a device attaches, which the lab does not spend its time filling.
#[test]
fn a_device_attaches_at_most_rxes_8192_groups_and_a_left_one_frees_its_place() {
    use cm::api::{CmEventType, PortSpace, QpCaps};
    let fabric = fabric(4);
    let mut host = fabric.host(0);
    let ch = host.create_event_channel().unwrap();
    let id = host.create_id(ch, PortSpace::Udp).unwrap();
    host.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap();
    host.create_qp(id, QpCaps::new()).unwrap();
    let group =
        |i: u32| std::net::SocketAddr::new(std::net::IpAddr::from((0xEF00_0000 | i).to_be_bytes()), 0);
    let join = |host: &mut cm::SimHost, i: u32| {
        host.join_multicast(id, group(i)).unwrap();
        let ev = host.get_cm_event(ch, WAIT).unwrap().expect("the join's event");
        let seen = (ev.event(), ev.status());
        host.ack_cm_event(ev).unwrap();
        seen
    };
    for i in 0..8192 {
        assert_eq!(join(&mut host, i), (CmEventType::MulticastJoin, 0), "group {i}");
    }
    assert_eq!(
        join(&mut host, 8192),
        (CmEventType::MulticastError, -1),
        "one past rxe's 8 192"
    );
    // Left, the refused group and an attached one free their places.
    host.leave_multicast(id, group(8192)).unwrap();
    host.leave_multicast(id, group(0)).unwrap();
    assert_eq!(join(&mut host, 9000), (CmEventType::MulticastJoin, 0));
    for i in (1..8192).chain([9000]) {
        host.leave_multicast(id, group(i)).unwrap();
    }
    host.destroy_qp(id).unwrap();
    host.destroy_id(id).unwrap();
    host.destroy_event_channel(ch).unwrap();
}

// Needs: a host crash and restart (Fault::Crash, Fault::Restart).
#[test]
fn a_crashed_hosts_memberships_go_with_it_and_an_unrelated_destroy_keeps_them() {
    use cm::api::{CmEventType, IdHandle, PortSpace, QpCaps};
    let fabric = fabric(5);
    let group: std::net::SocketAddr = "239.1.2.3:0".parse().unwrap();
    // `n` datagram ids with QPs on `host`, each joining the group: the events they got.
    let join_many = |host: &mut cm::SimHost, ch, n: usize| -> Vec<(IdHandle, CmEventType, i32)> {
        (0..n)
            .map(|_| {
                let id = host.create_id(ch, PortSpace::Udp).unwrap();
                host.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap();
                host.create_qp(id, QpCaps::new()).unwrap();
                host.join_multicast(id, group).unwrap();
                let ev = host.get_cm_event(ch, WAIT).unwrap().expect("the join's event");
                let seen = (id, ev.event(), ev.status());
                host.ack_cm_event(ev).unwrap();
                seen
            })
            .collect()
    };
    let mut host = fabric.host(0);
    let ch = host.create_event_channel().unwrap();
    let joined = join_many(&mut host, ch, 56);
    assert!(joined
        .iter()
        .all(|j| (j.1, j.2) == (CmEventType::MulticastJoin, 0)));
    // An id that never joined goes: the 56 stay attached, and a 57th is refused.
    let other = host.create_id(ch, PortSpace::Udp).unwrap();
    host.destroy_id(other).unwrap();
    let refused = join_many(&mut host, ch, 1);
    assert_eq!((refused[0].1, refused[0].2), (CmEventType::MulticastError, -1));
    // The host crashes with its 57 members: back, its device has the group's 56 places again.
    fabric.inject(Fault::Crash { host: 0 });
    fabric.inject(Fault::Restart { host: 0 });
    let mut host = fabric.host(0);
    let ch = host.create_event_channel().unwrap();
    let again = join_many(&mut host, ch, 57);
    let events: Vec<_> = again.iter().map(|j| (j.1, j.2)).collect();
    assert!(
        events[..56].iter().all(|e| *e == (CmEventType::MulticastJoin, 0)),
        "{events:?}"
    );
    assert_eq!(events[56], (CmEventType::MulticastError, -1));
    for (id, _, _) in &again {
        host.leave_multicast(*id, group).unwrap();
        host.destroy_qp(*id).unwrap();
        host.destroy_id(*id).unwrap();
    }
    host.destroy_event_channel(ch).unwrap();
}
