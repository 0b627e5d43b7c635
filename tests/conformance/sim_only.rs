//! Simulator-only tests. Each needs a control real hardware does not have — a seed, virtual
//! time, the trace, or a scale no NIC reaches — and says which in its comment. The hardware
//! runner does not include this file.

use std::time::Duration;

use cm::api::{
    errno, Call, CmBackend, CmError, CmEventType, ConnParam, IdHandle, IdState, PortSpace, QpCaps, QpState,
    WcStatus,
};
use cm::sim::{SeedSource, SimFabric, SimHost, TraceMode, SEED_ENV};

use crate::support::*;

/// A channel and a listener on `addr`.
fn listening(server: &mut SimHost, addr: std::net::SocketAddr) -> (cm::api::ChannelHandle, IdHandle) {
    let ch = server.create_event_channel().unwrap();
    let listener = server.create_id(ch, PortSpace::Tcp).unwrap();
    server.bind_addr(listener, addr).unwrap();
    server.listen(listener, 0).unwrap();
    (ch, listener)
}

/// `n` clients connect to one listener, all ids of a side on one channel; both sides drive
/// every event until every id reached TIMEWAIT_EXIT, then tear down. Returns the order in which
/// the client saw its events (event, id).
fn storm(fabric: &SimFabric, n: usize) -> Vec<(CmEventType, u32)> {
    let (mut server, mut client) = (fabric.host(0), fabric.host(1));
    let addr = "10.0.0.1:7471".parse().unwrap();
    let (sch, listener) = listening(&mut server, addr);
    let cch = client.create_event_channel().unwrap();
    let ids: Vec<IdHandle> = (0..n)
        .map(|_| client.create_id(cch, PortSpace::Tcp).unwrap())
        .collect();
    for &id in &ids {
        client.resolve_addr(id, None, addr, WAIT).unwrap();
    }
    let mut seen = Vec::new();
    let mut children = Vec::new();
    let mut timewait_exits = 0;
    while timewait_exits < 2 * n {
        let mut progressed = false;
        while let Some(ev) = next_event(&mut client, cch, Duration::ZERO) {
            progressed = true;
            seen.push((ev.event, ev.id.index()));
            match ev.event {
                CmEventType::AddrResolved => client.resolve_route(ev.id, WAIT).unwrap(),
                CmEventType::RouteResolved => {
                    client.create_qp(ev.id, QpCaps::new()).unwrap();
                    client.connect(ev.id, &ConnParam::new()).unwrap();
                }
                CmEventType::Established => client.disconnect(ev.id).unwrap(),
                CmEventType::Disconnected => {}
                CmEventType::TimewaitExit => timewait_exits += 1,
                other => panic!("client got {other}"),
            }
        }
        while let Some(ev) = next_event(&mut server, sch, Duration::ZERO) {
            progressed = true;
            match ev.event {
                CmEventType::ConnectRequest => {
                    server.create_qp(ev.id, QpCaps::new()).unwrap();
                    server.accept(ev.id, &ConnParam::new()).unwrap();
                    children.push(ev.id);
                }
                CmEventType::Established => {}
                CmEventType::Disconnected => server.disconnect(ev.id).unwrap(),
                CmEventType::TimewaitExit => timewait_exits += 1,
                other => panic!("server got {other}"),
            }
        }
        if !progressed {
            // Nothing queued: let virtual time run to the next thing that happens.
            let before = fabric.now();
            fabric.advance(Duration::from_millis(1));
            assert!(fabric.now() > before);
        }
    }
    for (b, ids, ch) in [(&mut client, ids, cch), (&mut server, children, sch)] {
        for id in ids {
            b.destroy_qp(id).unwrap();
            b.destroy_id(id).unwrap();
        }
        if b.index() == 0 {
            b.destroy_id(listener).unwrap();
        }
        b.destroy_event_channel(ch).unwrap();
    }
    assert!(
        fabric.live_resources().is_clean(),
        "{:?}",
        fabric.live_resources()
    );
    seen
}

/// The usual two-host test bed on `fabric` (whose seed a test chose).
fn bed_on(fabric: &SimFabric) -> Bed<SimHost> {
    Bed::new(
        fabric.host(0),
        fabric.host(1),
        "10.0.0.1".parse().unwrap(),
        "10.0.0.2".parse().unwrap(),
        "10.0.0.99".parse().unwrap(),
        7000,
        fabric.repro_line(),
    )
}

fn two_hosts(seed: u64) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build()
}

/// Needs seeds and the trace.
#[test]
fn same_seed_and_calls_give_the_same_trace_byte_for_byte() {
    for seed in [0, 1, 0xDEAD_BEEF] {
        let (a, b) = (two_hosts(seed), two_hosts(seed));
        assert_eq!(storm(&a, 20), storm(&b, 20));
        assert_eq!(a.trace_lines(), b.trace_lines(), "{}", a.repro_line());
        assert_eq!(a.trace_hash(), b.trace_hash());
        assert_eq!(a.now(), b.now());
        assert!(a.trace_len() > 20 * 10);
    }
}

/// Needs seeds: the interleaving of different ids' events on one channel follows the seed.
#[test]
fn different_seeds_explore_different_interleavings() {
    let orders: std::collections::BTreeSet<Vec<(CmEventType, u32)>> =
        (0..8).map(|seed| storm(&two_hosts(seed), 10)).collect();
    assert!(
        orders.len() >= 6,
        "only {} distinct orders from 8 seeds",
        orders.len()
    );
    let hashes: std::collections::BTreeSet<u64> = (0..8)
        .map(|seed| {
            let f = two_hosts(seed);
            storm(&f, 10);
            f.trace_hash()
        })
        .collect();
    assert_eq!(hashes.len(), 8);
}

/// Needs the trace: one line per event and message, with virtual time, host, id, what, status.
#[test]
fn trace_lines_name_time_host_id_event_and_status() {
    let fabric = two_hosts(3);
    let mut bed = bed_on(&fabric);
    let conn = establish(&mut bed);
    let (client_id, child) = (conn.client.id, conn.child);
    teardown(&mut bed, conn);
    let lines = fabric.trace_lines();
    let has = |needle: &str| lines.iter().any(|l| l.contains(needle));
    let client_id = format!("10.0.0.2 id#{} ", client_id.index());
    let child = format!("10.0.0.1 id#{} ", child.index());
    assert!(
        has(&format!("{client_id}RDMA_CM_EVENT_ADDR_RESOLVED status=0")),
        "{lines:#?}"
    );
    assert!(has(&format!("{client_id}sent REQ to 10.0.0.1")));
    assert!(
        has(&format!("{child}RDMA_CM_EVENT_CONNECT_REQUEST status=0")),
        "{lines:#?}"
    );
    assert!(has("RDMA_CM_EVENT_ESTABLISHED status=0"));
    assert!(has("sent DREQ") && has("sent DREP") && has("sent RTU"));
    let first = &lines[0];
    let time: f64 = first.split(' ').next().unwrap().parse().expect("time in seconds");
    assert!(time > 0.0);
    let times: Vec<f64> = lines
        .iter()
        .map(|l| l.split(' ').next().unwrap().parse().unwrap())
        .collect();
    assert!(times.windows(2).all(|w| w[0] <= w[1]), "trace in time order");
}

/// Needs virtual time: the DREQ retries take over a minute on a real fabric.
#[test]
fn initiator_gets_disconnected_with_etimedout_when_the_peer_never_answers() {
    let fabric = two_hosts(11);
    let mut bed = bed_on(&fabric);
    let conn = establish(&mut bed);
    let start = fabric.now();
    bed.client.disconnect(conn.client.id).unwrap();
    // The server sees DISCONNECTED and then does nothing at all.
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    let d = next_event(&mut bed.client, conn.client.ch, Duration::from_secs(600)).expect("DISCONNECTED");
    assert_eq!((d.event, d.status), (CmEventType::Disconnected, -110));
    let waited = fabric.now().since_start() - start.since_start();
    // The DREQ is sent 16 times, 6.144 s apart; the peer, in DREQ_RCVD, counts each copy and
    // says nothing.
    let cfg = fabric.config();
    assert_eq!(waited, cfg.active_response_timeout() * (cfg.cm_retries + 1));
    assert_eq!(waited, Duration::from_millis(16 * 6_144));
    let t = next_event(&mut bed.client, conn.client.ch, Duration::from_secs(600)).expect("TIMEWAIT_EXIT");
    assert_eq!(t.event, CmEventType::TimewaitExit);
    // The silent peer never reaches timewait.
    assert!(next_event(&mut bed.server, conn.server.ch, Duration::from_secs(600)).is_none());
    bed.server.disconnect(conn.child).unwrap();
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

/// Needs virtual time: an unaccepted request times out after the IB CM's retries, which the
/// passive side's MRA stretched to over a minute each.
#[test]
fn a_request_nobody_accepts_is_unreachable_after_the_mra_stretched_tries() {
    let fabric = two_hosts(5);
    let mut bed = bed_on(&fabric);
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    let start = fabric.now().since_start();
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let child = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest).id;
    let u = next_event(&mut bed.client, client.ch, Duration::from_secs(1100)).expect("UNREACHABLE");
    assert_eq!((u.event, u.status), (CmEventType::Unreachable, -110));
    // The first try waits 6.144 s; its retry draws the MRA rdma_cm deferred, and each of the
    // 15 retries then waits the MRA's service timeout, 65.536 s, plus 2.048 s, counted from the
    // MRA's arrival (one round trip of messages after the retry, under a millisecond).
    let cfg = fabric.config();
    let waited = fabric.now().since_start() - start;
    let want = cfg.active_response_timeout() + cfg.mra_response_timeout() * cfg.cm_retries;
    assert_eq!(want, Duration::from_millis(6_144 + 15 * 67_584));
    assert!(
        waited >= want && waited - want < Duration::from_millis(1),
        "{waited:?}"
    );
    let stats = fabric.fault_stats();
    assert_eq!((stats.mras, stats.duplicates), (15, 15), "{stats:?}");
    // The active side sends no REJ when it gives up: the child still holds the request, and
    // its accept goes out to an id that no longer answers, so its own tries run out.
    let_time_pass(&mut bed.server);
    bed.server.create_qp(child, QpCaps::new()).unwrap();
    bed.server.accept(child, &ConnParam::new()).unwrap();
    let accepted = fabric.now().since_start();
    let u = next_event(&mut bed.server, server.ch, Duration::from_secs(100)).expect("UNREACHABLE");
    assert_eq!((u.event, u.status), (CmEventType::Unreachable, -110));
    assert_eq!(
        fabric.now().since_start() - accepted,
        cfg.passive_response_timeout() * (cfg.cm_retries + 1)
    );
    bed.server.destroy_qp(child).unwrap();
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_clean(&bed);
}

/// Needs the seed source: `CM_SIM_SEED` picks the seed when the builder has none.
#[test]
fn the_seed_comes_from_the_environment_and_is_reported() {
    let previous = std::env::var(SEED_ENV).ok();
    std::env::set_var(SEED_ENV, "0x1234");
    let fabric = SimFabric::builder().host("10.0.0.1").build();
    match previous {
        Some(v) => std::env::set_var(SEED_ENV, v),
        None => std::env::remove_var(SEED_ENV),
    }
    assert_eq!(fabric.seed(), 0x1234);
    assert_eq!(fabric.seed_info().source, SeedSource::Environment);
    assert_eq!(fabric.repro_line(), "reproduce with CM_SIM_SEED=4660");
    let drawn = SimFabric::builder().seed(9).host("10.0.0.1").build();
    assert_eq!(drawn.seed_info().source, SeedSource::Builder);
}

/// Needs a scale no NIC reaches: 100 000 connections live at once on one fabric.
#[test]
fn a_hundred_thousand_live_connections() {
    const N: usize = 100_000;
    // One client address per 20 000 connections: each address has 28 232 ephemeral ports.
    let client_addrs: Vec<String> = (0..N.div_ceil(20_000))
        .map(|i| format!("10.0.1.{}", i + 1))
        .collect();
    let client_refs: Vec<&str> = client_addrs.iter().map(String::as_str).collect();
    let fabric = SimFabric::builder()
        .seed(100)
        .host("10.0.0.1")
        .host_with_addrs(&client_refs)
        .trace(TraceMode::HashOnly)
        .build();
    let (mut server, mut client): (SimHost, SimHost) = (fabric.host(0), fabric.host(1));
    let addr = "10.0.0.1:7471".parse().unwrap();
    let (sch, listener) = listening(&mut server, addr);
    let cch = client.create_event_channel().unwrap();
    let mut pairs = Vec::with_capacity(N);
    for n in 0..N {
        let id = client.create_id(cch, PortSpace::Tcp).unwrap();
        let src = std::net::SocketAddr::new(client_addrs[n / 20_000].parse().unwrap(), 0);
        client.resolve_addr(id, Some(src), addr, WAIT).unwrap();
        expect(&mut client, cch, CmEventType::AddrResolved);
        client.resolve_route(id, WAIT).unwrap();
        expect(&mut client, cch, CmEventType::RouteResolved);
        client.create_qp(id, QpCaps::new()).unwrap();
        client.connect(id, &ConnParam::new()).unwrap();
        let child = expect(&mut server, sch, CmEventType::ConnectRequest).id;
        server.create_qp(child, QpCaps::new()).unwrap();
        server.accept(child, &ConnParam::new()).unwrap();
        expect(&mut client, cch, CmEventType::Established);
        expect(&mut server, sch, CmEventType::Established);
        pairs.push((id, child));
    }
    let live = fabric.live_resources();
    assert_eq!((live.ids, live.qps), (2 * N + 1, 2 * N));
    for (id, child) in pairs {
        client.disconnect(id).unwrap();
        expect(&mut server, sch, CmEventType::Disconnected);
        server.disconnect(child).unwrap();
        expect(&mut client, cch, CmEventType::Disconnected);
        client.destroy_qp(id).unwrap();
        client.destroy_id(id).unwrap();
        server.destroy_qp(child).unwrap();
        server.destroy_id(child).unwrap();
    }
    server.destroy_id(listener).unwrap();
    server.destroy_event_channel(sch).unwrap();
    client.destroy_event_channel(cch).unwrap();
    assert!(fabric.live_resources().is_clean());
}

/// Every event still to come on `ch` (acked), waiting out every timer.
fn last_events(b: &mut SimHost, ch: cm::api::ChannelHandle) -> Vec<CmEventType> {
    let mut seen = Vec::new();
    while let Some(ev) = next_event(b, ch, Duration::from_secs(600)) {
        seen.push(ev.event);
    }
    seen
}

/// Needs a device removal (a fault) struck between two calls.
#[test]
fn work_started_before_device_removal_is_retrieved_gives_no_event_after_it() {
    let fabric = two_hosts(11);
    let mut bed = bed_on(&fabric);
    let dst = bed.server_addr();
    // (b, c): resolve_route after the removal, before DEVICE_REMOVAL is retrieved.
    let client = resolved_client(&mut bed, dst, false);
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
    let c = &mut bed.client;
    let err = c.resolve_route(client.id, WAIT).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::WrongState {
                state: IdState::DeviceRemoval,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(last_events(c, client.ch), [CmEventType::DeviceRemoval]);
    // (a): ADDR_RESOLVED already queued when the device goes.
    fabric.inject(cm::sim::Fault::RestoreDevice { host: 1 });
    let resolving = c.create_id(client.ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(resolving, None, dst, WAIT).unwrap();
    fabric.advance(Duration::from_secs(1));
    assert_eq!(c.live_resources().queued_events, 1, "ADDR_RESOLVED is queued");
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
    assert_eq!(last_events(c, client.ch), [CmEventType::AddrError]);
    destroy_all(c, &[client.id, resolving], client.ch);
    assert_clean(&bed);
}

/// Needs device removals and a restore (faults) struck before the application looks.
#[test]
fn a_device_removed_twice_before_the_event_is_retrieved_announces_it_once() {
    let fabric = two_hosts(19);
    let mut bed = bed_on(&fabric);
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, true);
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
    fabric.inject(cm::sim::Fault::RestoreDevice { host: 1 });
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
    let c = &mut bed.client;
    assert_eq!(last_events(c, client.ch), [CmEventType::DeviceRemoval]);
    assert_eq!(c.id_machine(client.id).unwrap().qp(), Some(QpState::Err));
    destroy_all(c, &[client.id], client.ch);
    assert_clean(&bed);
}

/// Needs a device removal (a fault) struck between two calls.
#[test]
fn a_datagram_connect_after_device_removal_is_refused() {
    let fabric = two_hosts(12);
    let mut bed = bed_on(&fabric);
    let dst = bed.server_addr();
    let c = &mut bed.client;
    let ch = c.create_event_channel().unwrap();
    let id = c.create_id(ch, PortSpace::Udp).unwrap();
    c.resolve_addr(id, Some(std::net::SocketAddr::new(bed.client_ip, 0)), dst, WAIT)
        .unwrap();
    expect(c, ch, CmEventType::AddrResolved);
    c.resolve_route(id, WAIT).unwrap();
    expect(c, ch, CmEventType::RouteResolved);
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
    assert!(c.connect(id, &ConnParam::new()).is_err());
    assert_eq!(last_events(c, ch), [CmEventType::DeviceRemoval]);
    destroy_all(c, &[id], ch);
    assert_clean(&bed);
}

/// Needs a device removal and restore (faults).
#[test]
fn a_listener_that_saw_device_removal_no_longer_listens_after_restore() {
    let fabric = two_hosts(13);
    let mut bed = bed_on(&fabric);
    let server = listen(&mut bed, 0);
    fabric.inject(cm::sim::Fault::RemoveDevice { host: 0 });
    expect(&mut bed.server, server.ch, CmEventType::DeviceRemoval);
    fabric.inject(cm::sim::Fault::RestoreDevice { host: 0 });
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(rej.status, 8, "no listener: IB_CM_REJ_INVALID_SERVICE_ID");
    assert!(last_events(&mut bed.server, server.ch).is_empty());
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[server.listener], server.ch);
    assert_clean(&bed);
}

/// Needs virtual time's far end.
#[test]
fn the_clock_stops_at_the_end_of_virtual_time_instead_of_wrapping() {
    let fabric = two_hosts(14);
    let mut bed = bed_on(&fabric);
    let (dst, nobody) = (bed.server_addr(), bed.unreachable_ip);
    let c = &mut bed.client;
    let ch = c.create_event_channel().unwrap();
    let lost = c.create_id(ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(lost, None, std::net::SocketAddr::new(nobody, 1), Duration::MAX)
        .unwrap();
    let ev = next_event(c, ch, Duration::MAX).expect("ADDR_ERROR at the end of time");
    assert_eq!((ev.event, ev.status), (CmEventType::AddrError, -errno::ETIMEDOUT));
    assert_eq!(fabric.now().as_nanos(), u64::MAX);
    // Nothing is scheduled in the past: messages and timers set now are all due at this last
    // instant, so the REQ's timeout (set first) fires before the REQ lands.
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let ev = expect(&mut bed.client, client.ch, CmEventType::Unreachable);
    assert_eq!(ev.status, -errno::ETIMEDOUT);
    assert_eq!(fabric.now().as_nanos(), u64::MAX);
    let _ = dst;
}

/// Needs the builder's latency range and an injected delay.
#[test]
fn latency_and_delay_ranges_ending_at_duration_max_work() {
    let fabric = SimFabric::builder()
        .seed(15)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .latency(Duration::ZERO..=Duration::MAX)
        .build();
    fabric.inject(cm::sim::Fault::Delay {
        a: 0,
        b: 1,
        min: Duration::ZERO,
        max: Duration::MAX,
    });
    let mut bed = bed_on(&fabric);
    let server = listen(&mut bed, 0);
    let c = &mut bed.client;
    let ch = c.create_event_channel().unwrap();
    let id = c.create_id(ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(id, None, server.addr, WAIT).unwrap();
    let ev = next_event(c, ch, Duration::MAX).expect("ADDR_RESOLVED");
    assert_eq!(ev.event, CmEventType::AddrResolved);
    c.resolve_route(id, WAIT).unwrap();
    assert_eq!(
        next_event(c, ch, Duration::MAX).map(|e| e.event),
        Some(CmEventType::RouteResolved)
    );
    c.create_qp(id, QpCaps::new()).unwrap();
    c.connect(id, &ConnParam::new()).unwrap();
    let req = next_event(&mut bed.server, server.ch, Duration::MAX);
    assert!(fabric.fault_stats().messages_delayed > 0);
    assert!(req.is_none_or(|r| r.event == CmEventType::ConnectRequest));
}

/// Needs a crash (a fault) and virtual time.
#[test]
fn a_crashed_hosts_calls_say_it_crashed_and_when() {
    let fabric = two_hosts(16);
    let mut c = fabric.host(1);
    let ch = c.create_event_channel().unwrap();
    fabric.advance(Duration::from_millis(1500));
    fabric.inject(cm::sim::Fault::Crash { host: 1 });
    let crashed = |call| CmError::HostCrashed {
        call,
        at: Duration::from_millis(1500),
    };
    assert_err(c.create_event_channel(), crashed(Call::CreateEventChannel));
    assert_err(c.get_cm_event(ch, WAIT), crashed(Call::GetCmEvent));
    let err = c.create_id(ch, PortSpace::Tcp).unwrap_err();
    assert_eq!(err.errno(), errno::ENODEV);
    assert!(
        err.to_string().contains("crashed at virtual time 1.500000000 s"),
        "{err}"
    );
    fabric.inject(cm::sim::Fault::Restart { host: 1 });
    assert!(matches!(
        c.get_cm_event(ch, WAIT),
        Err(CmError::UnknownHandle { .. })
    ));
    let fresh = c.create_event_channel().unwrap();
    c.destroy_event_channel(fresh).unwrap();
}

/// How the peer of an established connection stops answering.
#[derive(Clone, Copy, Debug)]
enum Silence {
    Crash,
    Partition,
    RemoveDevice,
}

/// Needs crashes, partitions and device removals (faults) and virtual time to run out the
/// transport's retries.
#[test]
fn a_send_to_a_crashed_partitioned_or_removed_peer_fails_after_the_transport_retries() {
    for silence in [Silence::Crash, Silence::Partition, Silence::RemoveDevice] {
        // The first send is posted before the peer goes silent (it waits for a receive the
        // peer never posted) or after.
        for posted_before in [false, true] {
            let fabric = two_hosts(17);
            let mut bed = bed_on(&fabric);
            let conn = establish(&mut bed);
            if posted_before {
                bed.client.post_send(conn.client.id, 1, b"hello").unwrap();
            }
            match silence {
                Silence::Crash => fabric.inject(cm::sim::Fault::Crash { host: 0 }),
                Silence::Partition => fabric.inject(cm::sim::Fault::Partition { a: 0, b: 1 }),
                Silence::RemoveDevice => {
                    // The peer's application destroys its id at once; the device is back later.
                    fabric.inject(cm::sim::Fault::RemoveDevice { host: 0 });
                    let s = &mut bed.server;
                    expect(s, conn.server.ch, CmEventType::DeviceRemoval);
                    s.destroy_qp(conn.child).unwrap();
                    s.destroy_id(conn.child).unwrap();
                    fabric.inject(cm::sim::Fault::RestoreDevice { host: 0 });
                }
            }
            let c = &mut bed.client;
            let start = fabric.now();
            if !posted_before {
                c.post_send(conn.client.id, 1, b"hello").unwrap();
            }
            c.post_send(conn.client.id, 2, b"again").unwrap();
            let mut wcs = Vec::new();
            // Two polls at most: a poll that miscounts must not spin the test.
            for _ in 0..2 {
                if wcs.len() >= 2
                    || c.poll_cq(conn.client.id, &mut wcs, 2, Duration::from_secs(60))
                        .unwrap()
                        == 0
                {
                    break;
                }
            }
            let statuses: Vec<_> = wcs.iter().map(|w| (w.wr_id, w.status)).collect();
            let case = format!("{silence:?}, posted before: {posted_before}");
            assert_eq!(
                statuses,
                [(1, WcStatus::RetryExcErr), (2, WcStatus::WrFlushErr)],
                "{case}"
            );
            // ConnParam::new() asks for 7 retries: 8 tries, each an ACK timeout long.
            let waited = fabric.now().since_start() - start.since_start();
            assert_eq!(waited, fabric.config().ack_timeout * 8, "{case}");
            assert_eq!(c.id_machine(conn.client.id).unwrap().qp(), Some(QpState::Err));
            assert_eq!(fabric.fault_stats().transport_retries_exceeded, 1, "{case}");
        }
    }
}

/// The simulated device's maxima are configuration (rxe's by default).
#[test]
fn qp_capabilities_above_the_device_maxima_are_refused_with_einval() {
    let fabric = two_hosts(18);
    let mut bed = bed_on(&fabric);
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, false);
    let cfg = fabric.config();
    let over = [
        QpCaps {
            max_send_wr: u32::MAX,
            ..QpCaps::new()
        },
        QpCaps {
            max_recv_wr: cfg.max_qp_wr + 1,
            ..QpCaps::new()
        },
        QpCaps {
            max_send_sge: cfg.max_sge + 1,
            ..QpCaps::new()
        },
        QpCaps {
            max_recv_sge: u32::MAX,
            ..QpCaps::new()
        },
        QpCaps {
            max_inline_data: cfg.max_inline_data + 1,
            ..QpCaps::new()
        },
        QpCaps {
            max_message_size: u32::MAX,
            ..QpCaps::new()
        },
    ];
    for caps in over {
        let err = bed.client.create_qp(client.id, caps).unwrap_err();
        assert_eq!(err.errno(), errno::EINVAL, "{caps:?}: {err}");
    }
    let most = QpCaps {
        max_send_wr: cfg.max_qp_wr,
        max_recv_wr: cfg.max_qp_wr,
        max_send_sge: cfg.max_sge,
        max_recv_sge: cfg.max_sge,
        max_inline_data: cfg.max_inline_data,
        max_message_size: cfg.max_message_size,
    };
    assert_eq!(bed.client.create_qp(client.id, most), Ok(most));
    destroy_all(&mut bed.client, &[client.id], client.ch);
}

/// Needs a device limit no NIC has: with `max_qp_wr` at `u32::MAX` each queue passes its own
/// check and the two together overflow the QP's slot numbering, which must be refused, not
/// panic in `post_recv`.
#[test]
fn queues_whose_work_requests_together_overflow_a_u32_are_refused_like_the_hardware_backend() {
    let config = cm::sim::SimConfig {
        max_qp_wr: u32::MAX,
        ..cm::sim::SimConfig::default()
    };
    let fabric = SimFabric::builder()
        .seed(18)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .config(config)
        .build();
    let mut bed = bed_on(&fabric);
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, false);
    let overflowing = QpCaps {
        max_send_wr: 16,
        max_recv_wr: u32::MAX,
        ..QpCaps::new()
    };
    assert_err(
        bed.client.create_qp(client.id, overflowing),
        CmError::InvalidArgument {
            call: Call::CreateQp,
            reason: "max_send_wr + max_recv_wr overflows",
        },
    );
    assert_eq!(
        bed.client.id_machine(client.id).unwrap().qp(),
        None,
        "a refused create_qp makes no QP"
    );
    // The most that fits: both queues usable.
    let largest = QpCaps {
        max_recv_wr: u32::MAX - 16,
        ..overflowing
    };
    assert_eq!(bed.client.create_qp(client.id, largest), Ok(largest));
    bed.client.post_recv(client.id, 1, 64).expect("post_recv");
    destroy_all(&mut bed.client, &[client.id], client.ch);
}

/// Needs virtual time: `poll_cq` returns at once when a completion is ready, and otherwise
/// waits exactly its timeout (no completion comes) and returns none.
#[test]
fn poll_cq_returns_at_once_with_a_completion_and_waits_its_timeout_without_one() {
    let fabric = two_hosts(11);
    let mut bed = bed_on(&fabric);
    let conn = establish(&mut bed);
    let wait = Duration::from_millis(250);
    let mut out = Vec::new();
    let before = fabric.now().since_start();
    assert_eq!(bed.client.poll_cq(conn.client.id, &mut out, 4, wait).unwrap(), 0);
    assert_eq!(
        fabric.now().since_start() - before,
        wait,
        "waited the whole timeout"
    );
    assert!(out.is_empty());
    bed.client.disconnect(conn.client.id).unwrap();
    bed.client.post_recv(conn.client.id, 7, 64).unwrap();
    let before = fabric.now().since_start();
    assert_eq!(bed.client.poll_cq(conn.client.id, &mut out, 4, wait).unwrap(), 1);
    assert_eq!(
        fabric.now().since_start(),
        before,
        "a flushed completion is ready at once"
    );
    assert_eq!((out[0].wr_id, out[0].status), (7, WcStatus::WrFlushErr));
    expect(&mut bed.server, conn.server.ch, CmEventType::Disconnected);
    bed.server.disconnect(conn.child).unwrap();
    expect(&mut bed.client, conn.client.ch, CmEventType::Disconnected);
    destroy_all(&mut bed.client, &[conn.client.id], conn.client.ch);
    destroy_all(
        &mut bed.server,
        &[conn.child, conn.server.listener],
        conn.server.ch,
    );
    assert_clean(&bed);
}

/// Connects from `client` (channel `cch`) to `dst`, where `server` listens with channel `sch`
/// and accepts whatever request arrives; returns the client's outcome (event, status).
fn connect_outcome(
    client: &mut SimHost,
    cch: cm::api::ChannelHandle,
    server: &mut SimHost,
    sch: cm::api::ChannelHandle,
    dst: std::net::SocketAddr,
) -> (CmEventType, i32) {
    let id = client.create_id(cch, PortSpace::Tcp).unwrap();
    client.resolve_addr(id, None, dst, WAIT).unwrap();
    expect(client, cch, CmEventType::AddrResolved);
    client.resolve_route(id, WAIT).unwrap();
    expect(client, cch, CmEventType::RouteResolved);
    client.create_qp(id, QpCaps::new()).unwrap();
    client.connect(id, &ConnParam::new()).unwrap();
    if let Some(request) = next_event(server, sch, QUIET) {
        assert_eq!(request.event, CmEventType::ConnectRequest);
        server.create_qp(request.id, QpCaps::new()).unwrap();
        server.accept(request.id, &ConnParam::new()).unwrap();
    }
    let outcome = next_event(client, cch, Duration::from_secs(600)).expect("connect's outcome");
    (outcome.event, outcome.status)
}

/// Needs faults: one partition naming all of a host's links, healed the same way.
#[test]
fn a_partition_of_all_hosts_cuts_one_host_off_from_every_peer_and_no_other_pair() {
    let fabric = SimFabric::builder()
        .seed(5)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .host("10.0.0.3")
        .build();
    let (mut cut, mut client, mut other) = (fabric.host(0), fabric.host(1), fabric.host(2));
    let (cut_addr, other_addr) = ("10.0.0.1:7471".parse().unwrap(), "10.0.0.3:7471".parse().unwrap());
    let (cut_ch, _) = listening(&mut cut, cut_addr);
    let (other_ch, _) = listening(&mut other, other_addr);
    let cch = client.create_event_channel().unwrap();

    fabric.inject(cm::sim::Fault::Partition {
        a: 0,
        b: cm::sim::Fault::ALL_HOSTS,
    });
    assert_eq!(
        connect_outcome(&mut client, cch, &mut cut, cut_ch, cut_addr),
        (CmEventType::Unreachable, -errno::ETIMEDOUT)
    );
    assert_eq!(
        connect_outcome(&mut client, cch, &mut other, other_ch, other_addr),
        (CmEventType::Established, 0),
        "hosts 1 and 2 are not partitioned"
    );

    fabric.inject(cm::sim::Fault::Heal {
        a: 0,
        b: cm::sim::Fault::ALL_HOSTS,
    });
    assert_eq!(
        connect_outcome(&mut client, cch, &mut cut, cut_ch, cut_addr),
        (CmEventType::Established, 0)
    );
}
