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
