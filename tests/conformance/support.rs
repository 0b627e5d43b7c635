//! Helpers shared by every conformance test, generic over the backend.
//!
//! A runner (`tests/runners/<backend>.rs`) provides a module `bed` with:
//! `type Backend: CmBackend`, `fn new_bed() -> Option<Bed<Backend>>` (None: skip, after printing
//! why), `fn seeded_bed(u64) -> Option<Bed<Backend>>`, `fn prop_wait(u8) -> Duration` and
//! `fn prop_cases() -> u32` for the property tests.

#![allow(dead_code)] // each test file uses a different subset

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cm::api::{
    ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps,
    WorkCompletion,
};

/// How long a test waits for an event that must come. Virtual time on the simulator; on
/// hardware long enough for Soft-RoCE under emulation.
pub const WAIT: Duration = Duration::from_secs(10);
/// How long a test waits to show that an event does *not* come.
pub const QUIET: Duration = Duration::from_millis(300);

/// Two backends (server and client side) and their addresses.
pub struct Bed<B: CmBackend> {
    pub server: B,
    pub client: B,
    pub server_ip: IpAddr,
    pub client_ip: IpAddr,
    /// An address no host answers for (resolution must time out).
    pub unreachable_ip: IpAddr,
    first_port: u16,
    next_port: u16,
    /// Printed if the test fails (the simulator's `reproduce with CM_SIM_SEED=...` line).
    pub repro: String,
}

impl<B: CmBackend> Bed<B> {
    pub fn new(
        server: B,
        client: B,
        server_ip: IpAddr,
        client_ip: IpAddr,
        unreachable_ip: IpAddr,
        first_port: u16,
        repro: String,
    ) -> Self {
        Bed {
            server,
            client,
            server_ip,
            client_ip,
            unreachable_ip,
            first_port,
            next_port: first_port,
            repro,
        }
    }

    /// The first port of this bed's range (property tests bind base + 1..=3).
    pub fn base_port(&self) -> u16 {
        self.first_port
    }

    /// A port no other test of this process uses.
    pub fn port(&mut self) -> u16 {
        self.next_port += 1;
        self.next_port
    }

    pub fn server_addr(&mut self) -> SocketAddr {
        let port = self.port();
        SocketAddr::new(self.server_ip, port)
    }
}

impl<B: CmBackend> Drop for Bed<B> {
    fn drop(&mut self) {
        if std::thread::panicking() && !self.repro.is_empty() {
            eprintln!("{}", self.repro);
        }
    }
}

/// What a test needs of an event after acking it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Seen {
    pub event: CmEventType,
    pub id: IdHandle,
    pub listen_id: Option<IdHandle>,
    pub status: i32,
    pub private_data: Vec<u8>,
    pub param: ConnParam,
}

impl Seen {
    fn of(ev: &CmEvent) -> Self {
        Seen {
            event: ev.event(),
            id: ev.id(),
            listen_id: ev.listen_id(),
            status: ev.status(),
            private_data: ev.private_data().to_vec(),
            param: *ev.param(),
        }
    }
}

/// The next event on `ch` within `timeout`, acked.
pub fn next_event<B: CmBackend>(b: &mut B, ch: ChannelHandle, timeout: Duration) -> Option<Seen> {
    let ev = b.get_cm_event(ch, timeout).expect("rdma_get_cm_event")?;
    let seen = Seen::of(&ev);
    b.ack_cm_event(ev).expect("rdma_ack_cm_event");
    Some(seen)
}

/// The next event on `ch`, which must be `ty`; acked.
#[track_caller]
pub fn expect<B: CmBackend>(b: &mut B, ch: ChannelHandle, ty: CmEventType) -> Seen {
    match next_event(b, ch, WAIT) {
        Some(seen) if seen.event == ty => seen,
        Some(seen) => panic!(
            "expected {ty}, got {} (status {}) on {}",
            seen.event, seen.status, seen.id
        ),
        None => panic!("expected {ty}, got nothing within {WAIT:?}"),
    }
}

/// No event on `ch` for a while.
#[track_caller]
pub fn expect_quiet<B: CmBackend>(b: &mut B, ch: ChannelHandle) {
    if let Some(seen) = next_event(b, ch, QUIET) {
        panic!(
            "expected no event, got {} (status {}) on {}",
            seen.event, seen.status, seen.id
        );
    }
}

/// A listening id on the server.
pub struct Server {
    pub ch: ChannelHandle,
    pub listener: IdHandle,
    pub addr: SocketAddr,
}

pub fn listen<B: CmBackend>(bed: &mut Bed<B>, backlog: i32) -> Server {
    let addr = bed.server_addr();
    let b = &mut bed.server;
    let ch = b.create_event_channel().expect("channel");
    let listener = b.create_id(ch, PortSpace::Tcp).expect("create_id");
    b.bind_addr(listener, addr).expect("bind");
    b.listen(listener, backlog).expect("listen");
    Server { ch, listener, addr }
}

/// A client id resolved up to ROUTE_RESOLVED, optionally with a QP.
pub struct Client {
    pub ch: ChannelHandle,
    pub id: IdHandle,
}

pub fn resolved_client<B: CmBackend>(bed: &mut Bed<B>, dst: SocketAddr, with_qp: bool) -> Client {
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let ch = b.create_event_channel().expect("channel");
    let id = b.create_id(ch, PortSpace::Tcp).expect("create_id");
    b.resolve_addr(id, Some(src), dst, WAIT).expect("resolve_addr");
    expect(b, ch, CmEventType::AddrResolved);
    b.resolve_route(id, WAIT).expect("resolve_route");
    expect(b, ch, CmEventType::RouteResolved);
    if with_qp {
        b.create_qp(id, QpCaps::new()).expect("create_qp");
    }
    Client { ch, id }
}

/// An established connection.
pub struct Conn {
    pub server: Server,
    pub client: Client,
    /// The server's child id.
    pub child: IdHandle,
}

pub fn establish<B: CmBackend>(bed: &mut Bed<B>) -> Conn {
    establish_with_caps(bed, QpCaps::new())
}

/// [`establish`] with QPs of `caps` on both sides.
pub fn establish_with_caps<B: CmBackend>(bed: &mut Bed<B>, caps: QpCaps) -> Conn {
    let server = listen(bed, 0);
    let client = resolved_client(bed, server.addr, false);
    bed.client.create_qp(client.id, caps).expect("create_qp");
    bed.client.connect(client.id, &ConnParam::new()).expect("connect");
    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    let child = req.id;
    bed.server.create_qp(child, caps).expect("create_qp (server)");
    bed.server.accept(child, &ConnParam::new()).expect("accept");
    expect(&mut bed.client, client.ch, CmEventType::Established);
    expect(&mut bed.server, server.ch, CmEventType::Established);
    Conn {
        server,
        client,
        child,
    }
}

/// Destroys whatever QP and id are given, then the channel; every event must be acked already.
pub fn destroy_all<B: CmBackend>(b: &mut B, ids: &[IdHandle], ch: ChannelHandle) {
    for &id in ids {
        if b.id_machine(id).expect("live id").qp().is_some() {
            b.destroy_qp(id).expect("destroy_qp");
        }
        b.destroy_id(id).expect("destroy_id");
    }
    b.destroy_event_channel(ch).expect("destroy_event_channel");
}

/// Disconnects both sides of `conn` in the documented order and tears everything down.
pub fn teardown<B: CmBackend>(bed: &mut Bed<B>, conn: Conn) {
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

/// Nothing left alive on either side.
#[track_caller]
pub fn assert_clean<B: CmBackend>(bed: &Bed<B>) {
    for (side, b) in [("server", &bed.server), ("client", &bed.client)] {
        let live = b.live_resources();
        assert!(live.is_clean(), "{side} still holds {live:?}");
    }
}

/// Lets messages in flight arrive and timers of the next moments fire, without retrieving
/// anything: waits on a fresh, empty channel.
pub fn let_time_pass<B: CmBackend>(b: &mut B) {
    let ch = b.create_event_channel().expect("channel");
    assert!(b.get_cm_event(ch, QUIET).expect("get_cm_event").is_none());
    b.destroy_event_channel(ch).expect("destroy channel");
}

/// Polls `id`'s CQ until `n` completions arrived (or the wait ran out). At most `n` polls: each
/// that is not the last brings at least one, so a backend that miscounts cannot spin it forever.
pub fn completions<B: CmBackend>(b: &mut B, id: IdHandle, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    for _ in 0..n {
        let want = n - out.len();
        let got = b.poll_cq(id, &mut out, want, WAIT).expect("poll_cq");
        if got == 0 || out.len() >= n {
            break;
        }
    }
    out
}

/// Asserts `result` is the error `want`.
#[track_caller]
pub fn assert_err<T: std::fmt::Debug>(result: Result<T, CmError>, want: CmError) {
    match result {
        Err(e) => assert_eq!(e, want, "wrong error: {e}"),
        Ok(v) => panic!("expected {want}, got Ok({v:?})"),
    }
}
