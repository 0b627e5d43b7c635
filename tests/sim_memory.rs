//! Memory per connection at scale, as peak RSS: 100 000 connections opened the way cmtime opens
//! them (each step issued for every connection, then its events drained), so the queues' peaks
//! count as well as what an established connection keeps.
//!
//! A test binary of its own with one test: the process's peak RSS then belongs to this test
//! alone. Linux only (`/proc/self/status`).

use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{ChannelHandle, CmBackend, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps};
use cm::sim::{SimFabric, SimHost, TraceMode};

/// Connections opened.
const N: usize = 100_000;

/// Peak RSS growth allowed per connection, both ends, QPs included, trace in hash-only mode,
/// this test's own list of ids (12 bytes a connection) included. The bound sits just above the
/// current reading (in BENCHMARKS.md; earlier readings in docs/benchmarks-history.md): it leaves
/// room for the allocator, whose placement of the growing slab moves the reading from run to
/// run, not for a new 16-byte field in every id (32 B per connection).
const MAX_BYTES_PER_CONNECTION: f64 = 835.0;

const WAIT: Duration = Duration::from_secs(10);

/// `VmRSS` and `VmHWM` in KiB.
fn rss_hwm_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("no {name} in /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// Runs both ends on this thread until `done` says so: each end's handler gets every event of
/// its channel (acked); when neither has one, the client waits a little, which moves virtual
/// time on. Panics if virtual time passes ten minutes.
fn run_until(
    fabric: &SimFabric,
    (server, sch): (&mut SimHost, ChannelHandle),
    (client, cch): (&mut SimHost, ChannelHandle),
    mut on_server: impl FnMut(&mut SimHost, CmEventType, IdHandle),
    mut on_client: impl FnMut(&mut SimHost, CmEventType, IdHandle),
    mut done: impl FnMut() -> bool,
) {
    let handle = |b: &mut SimHost,
                  ch: ChannelHandle,
                  wait: Duration,
                  f: &mut dyn FnMut(&mut SimHost, CmEventType, IdHandle)| {
        let Some(ev) = b.get_cm_event(ch, wait).expect("get_cm_event") else {
            return false;
        };
        let (ty, id) = (ev.event(), ev.id());
        b.ack_cm_event(ev).expect("ack");
        f(b, ty, id);
        true
    };
    while !done() {
        assert!(fabric.now().since_start() < Duration::from_secs(600), "stuck");
        let mut progressed = false;
        while handle(server, sch, Duration::ZERO, &mut on_server) {
            progressed = true;
        }
        while handle(client, cch, Duration::ZERO, &mut on_client) {
            progressed = true;
        }
        if !progressed {
            handle(client, cch, Duration::from_micros(5), &mut on_client);
        }
    }
}

#[test]
fn a_hundred_thousand_connections_fit_in_the_recorded_memory_per_connection() {
    // One client address per 20 000 connections: each has 28 232 ephemeral ports.
    let client_addrs: Vec<String> = (0..N.div_ceil(20_000))
        .map(|i| format!("10.0.1.{}", i + 1))
        .collect();
    let client_refs: Vec<&str> = client_addrs.iter().map(String::as_str).collect();
    let fabric = SimFabric::builder()
        .seed(7)
        .host("10.0.0.1")
        .host_with_addrs(&client_refs)
        .max_backlog(N as u32)
        .trace(TraceMode::HashOnly)
        .build();
    let (mut server, mut client) = (fabric.host(0), fabric.host(1));
    let dst: SocketAddr = "10.0.0.1:7471".parse().unwrap();
    let sch = server.create_event_channel().unwrap();
    let listener = server.create_id(sch, PortSpace::Tcp).unwrap();
    server.bind_addr(listener, dst).unwrap();
    server.listen(listener, 0).unwrap();
    let cch = client.create_event_channel().unwrap();

    let (rss_before, _) = rss_hwm_kib();
    let mut ids = Vec::with_capacity(N);
    for n in 0..N {
        let id = client.create_id(cch, PortSpace::Tcp).unwrap();
        let src = SocketAddr::new(client_addrs[n / 20_000].parse().unwrap(), 0);
        client.resolve_addr(id, Some(src), dst, WAIT).unwrap();
        ids.push(id);
    }
    let established = std::cell::Cell::new(0);
    run_until(
        &fabric,
        (&mut server, sch),
        (&mut client, cch),
        |s, ty, id| match ty {
            CmEventType::ConnectRequest => {
                s.create_qp(id, QpCaps::new()).unwrap();
                s.accept(id, &ConnParam::new()).unwrap();
            }
            CmEventType::Established => established.set(established.get() + 1),
            other => panic!("server: {other} on {id:?}"),
        },
        |c, ty, id| match ty {
            CmEventType::AddrResolved => c.resolve_route(id, WAIT).unwrap(),
            CmEventType::RouteResolved => {
                c.create_qp(id, QpCaps::new()).unwrap();
                c.connect(id, &ConnParam::new()).unwrap();
            }
            CmEventType::Established => established.set(established.get() + 1),
            other => panic!("client: {other} on {id:?}"),
        },
        || established.get() == 2 * N,
    );
    let (_, hwm) = rss_hwm_kib();
    let live = fabric.live_resources();
    assert_eq!((live.ids, live.qps), (2 * N + 1, 2 * N));

    let per_connection = hwm.saturating_sub(rss_before) as f64 * 1024.0 / N as f64;
    println!("peak RSS growth: {per_connection:.0} B per connection");
    assert!(
        per_connection <= MAX_BYTES_PER_CONNECTION,
        "{N} connections took {per_connection:.0} B each at the peak, past the {MAX_BYTES_PER_CONNECTION} B recorded"
    );
    // The bound is not loose enough to pass with nothing measured.
    assert!(
        per_connection > 100.0,
        "implausibly little memory measured: {per_connection:.0} B"
    );

    for &id in &ids {
        client.disconnect(id).unwrap();
    }
    let gone = std::cell::Cell::new(0);
    run_until(
        &fabric,
        (&mut server, sch),
        (&mut client, cch),
        |s, ty, id| {
            if ty == CmEventType::Disconnected {
                s.disconnect(id).unwrap();
                s.destroy_qp(id).unwrap();
                s.destroy_id(id).unwrap();
                gone.set(gone.get() + 1);
            }
        },
        |c, ty, id| {
            if ty == CmEventType::Disconnected {
                c.destroy_qp(id).unwrap();
                c.destroy_id(id).unwrap();
                gone.set(gone.get() + 1);
            }
        },
        || gone.get() == 2 * N,
    );
    server.destroy_id(listener).unwrap();
    server.destroy_event_channel(sch).unwrap();
    // Ids destroyed with TIMEWAIT_EXIT still queued: the events die with them.
    client.destroy_event_channel(cch).unwrap();
    assert!(
        fabric.live_resources().is_clean(),
        "{:?}",
        fabric.live_resources()
    );
}
