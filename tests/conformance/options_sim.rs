//! The per-id options on the simulator only: what the options change in time and in the port
//! table, which needs virtual time, faults, or hosts with several address families. The hardware
//! runner does not include this file.

use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{errno, CmBackend, CmEventType, ConnParam, IdOption, PortSpace, QpCaps, SyncId, WcStatus};
use cm::sim::{Fault, SimFabric, SimHost};

use crate::support::*;

/// Needs the simulator: on rxe (Linux 6.1, rdma-core v44) a request queued before its listener
/// moves is lost (README item 19), where the kernel's `ucma_migrate_id` means to move it.
#[test]
fn a_migrated_listener_gets_its_waiting_requests_on_the_new_channel() {
    let fabric = fabric(9);
    let mut bed = Bed::new(
        fabric.host(0),
        fabric.host(1),
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.99".parse().unwrap(),
        7000,
        fabric.repro_line(),
    );
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let_time_pass(&mut bed.server);
    let new = bed.server.create_event_channel().unwrap();
    bed.server.migrate_id(server.listener, new).unwrap();
    let req = expect(&mut bed.server, new, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(server.listener));
    expect_quiet(&mut bed.server, server.ch);
    bed.server.reject(req.id, &[]).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Rejected);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[req.id, server.listener], new);
    bed.server.destroy_event_channel(server.ch).unwrap();
    assert_clean(&bed);
}

fn fabric(seed: u64) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host_with_addrs(["10.0.0.1", "fd00::1"])
        .host_with_addrs(["10.0.0.2", "fd00::2"])
        .build()
}

/// Connects host 1 to a listener on host 0 that retrieves the request and never answers;
/// `option` is set on the client's id before or after route resolution. Returns how long after
/// `connect` the client's UNREACHABLE came.
fn unanswered_connect(option: Option<(IdOption, bool)>) -> Duration {
    let fabric = fabric(3);
    let (mut server, mut client) = (fabric.host(0), fabric.host(1));
    let addr: SocketAddr = "10.0.0.1:7471".parse().unwrap();
    let sch = server.create_event_channel().unwrap();
    let listener = server.create_id(sch, PortSpace::Tcp).unwrap();
    server.bind_addr(listener, addr).unwrap();
    server.listen(listener, 0).unwrap();
    let cch = client.create_event_channel().unwrap();
    let id = client.create_id(cch, PortSpace::Tcp).unwrap();
    let set = |client: &mut SimHost, before: bool| {
        if let Some((opt, b)) = option {
            if b == before {
                client.set_option(id, opt).unwrap();
            }
        }
    };
    set(&mut client, true);
    client.resolve_addr(id, None, addr, WAIT).unwrap();
    expect(&mut client, cch, CmEventType::AddrResolved);
    client.resolve_route(id, WAIT).unwrap();
    expect(&mut client, cch, CmEventType::RouteResolved);
    set(&mut client, false);
    client.create_qp(id, QpCaps::new()).unwrap();
    let start = fabric.now().since_start();
    client.connect(id, &ConnParam::new()).unwrap();
    let req = expect(&mut server, sch, CmEventType::ConnectRequest);
    let ev = next_event(&mut client, cch, Duration::from_secs(1200)).expect("UNREACHABLE in time");
    assert_eq!(
        (ev.event, ev.status),
        (CmEventType::Unreachable, -errno::ETIMEDOUT)
    );
    let waited = fabric.now().since_start() - start;
    server.destroy_id(req.id).unwrap();
    destroy_all(&mut server, &[listener], sch);
    destroy_all(&mut client, &[id], cch);
    waited
}

/// Needs virtual time: the IB CM's timeouts run for minutes.
#[test]
fn ack_timeout_set_before_route_resolution_changes_the_ib_cm_response_timeouts() {
    // What an unanswered, retrieved request waits on Linux 6.1 for a path's packet lifetime:
    // the first try 2 x lifetime + the response timeout, each of the 15 retries after the MRA
    // the MRA's service timeout plus the active side's lifetime + 1 (IBA exponents, each
    // 2^(t - 8) ms).
    let ms = |t: u64| 1u64 << t.saturating_sub(8);
    let waits =
        |lifetime: u64| Duration::from_millis(2 * ms(lifetime) + ms(20) + 15 * (ms(24) + ms(lifetime + 1)));
    // The MRA restarts the timer where it arrives: one round trip of messages after the retry
    // that drew it, well under a millisecond.
    let about = |waited: Duration, want: Duration, what: &str| {
        assert!(
            waited >= want && waited - want < Duration::from_millis(1),
            "{what}: {waited:?}, want {want:?}"
        );
    };
    let default = unanswered_connect(None);
    about(default, waits(18), "RoCE's lifetime on 6.1 is 18");
    for t in [1u8, 14, 20] {
        let before = unanswered_connect(Some((IdOption::AckTimeout(t), true)));
        // The path's packet lifetime becomes t - 1: shorter tries below 19, longer above.
        about(before, waits(u64::from(t) - 1), &format!("ACK_TIMEOUT {t}"));
        let after = unanswered_connect(Some((IdOption::AckTimeout(t), false)));
        assert_eq!(
            after, default,
            "set after route resolution, the path keeps its lifetime"
        );
    }
    // 0 leaves the kernel's default (`cma_resolve_iboe_route` takes a set, non-zero timeout).
    assert_eq!(unanswered_connect(Some((IdOption::AckTimeout(0), true))), default);
    let tos = unanswered_connect(Some((IdOption::Tos(0x10), true)));
    assert_eq!(tos, default, "TOS changes no timing");
}

/// Needs a crash (a fault) and virtual time to run out the transport's retries.
#[test]
fn ack_timeout_is_the_local_ack_timeout_of_sends_to_a_vanished_peer() {
    for t in [None, Some(10u8)] {
        let fabric = fabric(4);
        let mut bed = Bed::new(
            fabric.host(0),
            fabric.host(1),
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.99".parse().unwrap(),
            7000,
            fabric.repro_line(),
        );
        let conn = establish(&mut bed);
        if let Some(t) = t {
            // Taken after the connection too: the kernel applies it at the QP's next transition,
            // the simulator to the next retry it arms.
            bed.client
                .set_option(conn.client.id, IdOption::AckTimeout(t))
                .unwrap();
        }
        fabric.inject(Fault::Crash { host: 0 });
        let c = &mut bed.client;
        let start = fabric.now().since_start();
        c.post_send(conn.client.id, 1, b"hello").unwrap();
        let mut wcs = Vec::new();
        c.poll_cq(conn.client.id, &mut wcs, 1, Duration::from_secs(60))
            .unwrap();
        assert_eq!(
            wcs.first().map(|w| w.status),
            Some(WcStatus::RetryExcErr),
            "{t:?}"
        );
        let per_try = t.map_or(fabric.config().ack_timeout, IdOption::ack_timeout);
        // ConnParam::new() asks for 7 retries: 8 tries.
        assert_eq!(fabric.now().since_start() - start, per_try * 8, "{t:?}");
    }
}

/// Needs a host with an IPv4 and an IPv6 address.
#[test]
fn an_afonly_ipv6_wildcard_listener_takes_no_ipv4_requests() {
    for afonly in [false, true] {
        let fabric = fabric(6);
        let (mut s, mut c) = (fabric.host(0), fabric.host(1));
        let sch = s.create_event_channel().unwrap();
        let l = s.create_id(sch, PortSpace::Tcp).unwrap();
        s.set_option(l, IdOption::AfOnly(afonly)).unwrap();
        s.bind_addr(l, "[::]:7471".parse().unwrap()).unwrap();
        s.listen(l, 0).unwrap();
        let cch = c.create_event_channel().unwrap();
        let mut ids = Vec::new();
        for dst in ["[fd00::1]:7471", "10.0.0.1:7471"] {
            let id = c.create_id(cch, PortSpace::Tcp).unwrap();
            c.resolve_addr(id, None, dst.parse().unwrap(), WAIT).unwrap();
            expect(&mut c, cch, CmEventType::AddrResolved);
            c.resolve_route(id, WAIT).unwrap();
            expect(&mut c, cch, CmEventType::RouteResolved);
            c.create_qp(id, QpCaps::new()).unwrap();
            c.connect(id, &ConnParam::new()).unwrap();
            let v4 = dst.starts_with("10.");
            if v4 && afonly {
                // No listener for IPv4 on that port: the IB CM's "invalid service ID".
                let rej = expect(&mut c, cch, CmEventType::Rejected);
                assert_eq!(rej.status, 8);
            } else {
                let req = expect(&mut s, sch, CmEventType::ConnectRequest);
                s.reject(req.id, &[]).unwrap();
                expect(&mut c, cch, CmEventType::Rejected);
                s.destroy_id(req.id).unwrap();
            }
            ids.push(id);
        }
        destroy_all(&mut c, &ids, cch);
        destroy_all(&mut s, &[l], sch);
    }
}

/// Needs the simulator's getter: the kernel does not report an id's TOS back.
#[test]
fn tos_is_recorded_per_id() {
    let fabric = fabric(7);
    let mut s = fabric.host(0);
    let ch = s.create_event_channel().unwrap();
    let (a, b) = (
        s.create_id(ch, PortSpace::Tcp).unwrap(),
        s.create_id(ch, PortSpace::Udp).unwrap(),
    );
    s.set_option(a, IdOption::Tos(0xb8)).unwrap();
    assert_eq!((s.tos(a).unwrap(), s.tos(b).unwrap()), (Some(0xb8), None));
    destroy_all(&mut s, &[a, b], ch);
    assert!(s.live_resources().is_clean());
}

/// Needs virtual time: the id's TIMEWAIT_EXIT comes after the simulator's timewait.
#[test]
fn a_synchronous_disconnect_after_the_peers_returns_with_the_next_event_timewait_exit() {
    let fabric = fabric(8);
    let mut bed = Bed::new(
        fabric.host(0),
        fabric.host(1),
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.99".parse().unwrap(),
        7000,
        fabric.repro_line(),
    );
    let server = listen(&mut bed, 0);
    let (s, c) = (&mut bed.server, &mut bed.client);
    let mut id = SyncId::create(c, PortSpace::Tcp, WAIT).unwrap();
    id.resolve_addr(c, None, server.addr, WAIT).unwrap();
    id.resolve_route(c, WAIT).unwrap();
    id.create_qp(c, QpCaps::new()).unwrap();
    // The synchronous connect cannot wait here for an accept on the same thread: start it by
    // hand, accept, then take the outcome as its next event.
    c.connect(id.id(), &ConnParam::new()).unwrap();
    let child = expect(s, server.ch, CmEventType::ConnectRequest).id;
    s.create_qp(child, QpCaps::new()).unwrap();
    s.accept(child, &ConnParam::new()).unwrap();
    assert_eq!(id.next_event(c).unwrap(), CmEventType::Established);
    expect(s, server.ch, CmEventType::Established);
    s.disconnect(child).unwrap();
    assert_eq!(id.next_event(c).unwrap(), CmEventType::Disconnected);
    id.disconnect(c).unwrap();
    assert_eq!(id.event().map(|e| e.event()), Some(CmEventType::TimewaitExit));
    expect(s, server.ch, CmEventType::Disconnected);
    expect(s, server.ch, CmEventType::TimewaitExit);
    id.destroy(c).map_err(|(_, e)| e).unwrap();
    destroy_all(s, &[child, server.listener], server.ch);
    assert_clean(&bed);
}
