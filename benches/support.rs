//! What the benches share: a server and a client end over any [`CmBackend`], with a listener,
//! and the steps of one connection's life, each written once for every backend.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cm::api::{ChannelHandle, CmBackend, CmEventType, ConnParam, IdHandle, LiveResources, PortSpace, QpCaps};
use cm::sim::{SimFabric, TraceMode};
use cm::SimHost;

/// How long a step waits for an event that must come (virtual time on the simulator, so the
/// bound costs nothing there; on hardware it is long enough for Soft-RoCE under emulation).
pub(crate) const WAIT: Duration = Duration::from_secs(10);

/// Connections one simulated client address carries: it has 28 232 ephemeral ports, like
/// Linux, so 100 000 live connections need several addresses.
pub(crate) const PER_ADDRESS: usize = 20_000;

/// The seed of every simulated bench: the figures then come from the same run each time.
pub(crate) const SEED: u64 = 1;

/// One connection: the client's id and the server's child id.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Conn {
    pub(crate) client: IdHandle,
    pub(crate) child: IdHandle,
}

/// A server end with a listener and a client end, each with one event channel for all its ids.
pub(crate) struct Bed<B: CmBackend> {
    pub(crate) server: B,
    pub(crate) client: B,
    pub(crate) sch: ChannelHandle,
    pub(crate) cch: ChannelHandle,
    listener: IdHandle,
    dst: SocketAddr,
    /// Client source addresses: live connection `k` binds to `sources[k / PER_ADDRESS]`, the
    /// connections a bench measures to the last one, so they never run short of ports.
    sources: Vec<IpAddr>,
    live: Vec<Conn>,
    /// The simulator's fabric, for its virtual clock; `None` on hardware.
    pub(crate) fabric: Option<SimFabric>,
}

/// The next event on `ch`, which must be `ty`; acked. Returns the event's id.
#[track_caller]
pub(crate) fn expect<B: CmBackend>(b: &mut B, ch: ChannelHandle, ty: CmEventType) -> IdHandle {
    let got = b.get_cm_event(ch, WAIT);
    let id = match &got {
        Ok(Some(ev)) if ev.event() == ty => ev.id(),
        Ok(Some(ev)) => panic!("expected {ty}, got {ev}"),
        Ok(None) => panic!("expected {ty}, got nothing within {WAIT:?}"),
        Err(e) => panic!("rdma_get_cm_event: {e}"),
    };
    if let Ok(Some(ev)) = got {
        b.ack_cm_event(ev).expect("rdma_ack_cm_event");
    }
    id
}

/// A simulated bed able to hold `max_live` live connections besides the measured ones: two
/// hosts, the client with one address per [`PER_ADDRESS`] connections plus one.
pub(crate) fn sim_bed(max_live: usize) -> Bed<SimHost> {
    let addrs: Vec<String> = (0..=max_live.div_ceil(PER_ADDRESS))
        .map(|i| format!("10.0.1.{}", i + 1))
        .collect();
    let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
    // Only the hash: the full trace of a million lifecycles would be the biggest thing alive.
    let fabric = SimFabric::builder()
        .seed(SEED)
        .host("10.0.0.1")
        .host_with_addrs(&refs)
        .trace(TraceMode::HashOnly)
        .build();
    let sources = addrs.iter().map(|a| a.parse().expect("address")).collect();
    let dst = "10.0.0.1:7471".parse().expect("address");
    Bed::new(fabric.host(0), fabric.host(1), dst, sources, Some(fabric))
}

impl<B: CmBackend> Bed<B> {
    /// Creates both channels and a listener on `dst`.
    pub(crate) fn new(
        mut server: B,
        mut client: B,
        dst: SocketAddr,
        sources: Vec<IpAddr>,
        fabric: Option<SimFabric>,
    ) -> Self {
        assert!(!sources.is_empty(), "the client needs a source address");
        let sch = server.create_event_channel().expect("server channel");
        let listener = server.create_id(sch, PortSpace::Tcp).expect("listener id");
        server.bind_addr(listener, dst).expect("bind listener");
        server.listen(listener, 0).expect("listen");
        let cch = client.create_event_channel().expect("client channel");
        Bed {
            server,
            client,
            sch,
            cch,
            listener,
            dst,
            sources,
            live: Vec::new(),
            fabric,
        }
    }

    /// Where the listener listens.
    pub(crate) fn dst(&self) -> SocketAddr {
        self.dst
    }

    /// The source address of the connections a bench measures.
    pub(crate) fn src(&self) -> SocketAddr {
        SocketAddr::new(*self.sources.last().expect("checked in new"), 0)
    }

    /// What both ends hold, less queued events (which die with their ids whenever they do).
    pub(crate) fn held(&self) -> [LiveResources; 2] {
        [self.server.live_resources(), self.client.live_resources()].map(|l| LiveResources {
            queued_events: 0,
            ..l
        })
    }

    /// A fresh client id.
    pub(crate) fn new_id(&mut self) -> IdHandle {
        self.client
            .create_id(self.cch, PortSpace::Tcp)
            .expect("rdma_create_id")
    }

    /// Resolves address and route of `id` from `src`; both events retrieved and acked.
    pub(crate) fn resolve(&mut self, id: IdHandle, src: SocketAddr) {
        let (b, ch) = (&mut self.client, self.cch);
        b.resolve_addr(id, Some(src), self.dst, WAIT)
            .expect("rdma_resolve_addr");
        assert_eq!(expect(b, ch, CmEventType::AddrResolved), id);
        b.resolve_route(id, WAIT).expect("rdma_resolve_route");
        assert_eq!(expect(b, ch, CmEventType::RouteResolved), id);
    }

    /// A resolved client id with a QP, ready to connect.
    pub(crate) fn ready(&mut self, src: SocketAddr) -> IdHandle {
        let id = self.new_id();
        self.resolve(id, src);
        self.client.create_qp(id, QpCaps::new()).expect("rdma_create_qp");
        id
    }

    /// Connects a ready id: the server gets the request, gives the child a QP and accepts;
    /// returns once both ends retrieved `ESTABLISHED`.
    pub(crate) fn connect(&mut self, id: IdHandle) -> Conn {
        self.client.connect(id, &ConnParam::new()).expect("rdma_connect");
        let child = expect(&mut self.server, self.sch, CmEventType::ConnectRequest);
        self.server
            .create_qp(child, QpCaps::new())
            .expect("rdma_create_qp (child)");
        self.server.accept(child, &ConnParam::new()).expect("rdma_accept");
        assert_eq!(expect(&mut self.client, self.cch, CmEventType::Established), id);
        assert_eq!(
            expect(&mut self.server, self.sch, CmEventType::Established),
            child
        );
        Conn { client: id, child }
    }

    /// Disconnects the client first, then the server, until both ends retrieved
    /// `DISCONNECTED`; then destroys both QPs and both ids.
    pub(crate) fn disconnect(&mut self, c: Conn) {
        self.client
            .disconnect(c.client)
            .expect("rdma_disconnect (client)");
        assert_eq!(
            expect(&mut self.server, self.sch, CmEventType::Disconnected),
            c.child
        );
        self.server.disconnect(c.child).expect("rdma_disconnect (server)");
        assert_eq!(
            expect(&mut self.client, self.cch, CmEventType::Disconnected),
            c.client
        );
        for (b, id) in [(&mut self.client, c.client), (&mut self.server, c.child)] {
            b.destroy_qp(id).expect("rdma_destroy_qp");
            b.destroy_id(id).expect("rdma_destroy_id");
        }
    }

    /// One connection's whole life, from `rdma_create_id` to `rdma_destroy_id` on both ends.
    pub(crate) fn lifecycle(&mut self) {
        let src = self.src();
        let id = self.ready(src);
        let conn = self.connect(id);
        self.disconnect(conn);
    }

    /// Opens `n` more connections and leaves them established.
    pub(crate) fn add_live(&mut self, n: usize) {
        self.live.reserve(n);
        for _ in 0..n {
            let k = self.live.len();
            let ip = *self
                .sources
                .get(k / PER_ADDRESS)
                .expect("a source address per 20 000 live");
            let id = self.ready(SocketAddr::new(ip, 0));
            let conn = self.connect(id);
            self.live.push(conn);
        }
    }

    /// How many connections are held open.
    pub(crate) fn live(&self) -> usize {
        self.live.len()
    }

    /// Virtual time one lifecycle takes, averaged over `n` (simulator only).
    pub(crate) fn virtual_lifecycle(&mut self, n: u32) -> Option<Duration> {
        let now = |b: &Self| b.fabric.as_ref().map(|f| f.now().since_start());
        let start = now(self)?;
        for _ in 0..n {
            self.lifecycle();
        }
        Some((now(self)? - start) / n)
    }

    /// `iters` lifecycles, timed; checks that they left nothing behind.
    pub(crate) fn timed_lifecycles(&mut self, iters: u64) -> Duration {
        let before = self.held();
        let start = Instant::now();
        for _ in 0..iters {
            self.lifecycle();
        }
        let took = start.elapsed();
        assert_eq!(self.held(), before, "a lifecycle left something alive");
        took
    }

    /// Closes the live connections, destroys the listener and both channels, and checks that
    /// nothing is left alive on either end.
    pub(crate) fn finish(mut self) {
        for conn in std::mem::take(&mut self.live) {
            self.disconnect(conn);
        }
        self.server.destroy_id(self.listener).expect("destroy listener");
        self.server
            .destroy_event_channel(self.sch)
            .expect("destroy server channel");
        self.client
            .destroy_event_channel(self.cch)
            .expect("destroy client channel");
        for (end, b) in [("server", &self.server), ("client", &self.client)] {
            let live = b.live_resources();
            assert!(live.is_clean(), "the {end} still holds {live:?}");
        }
        if let Some(f) = &self.fabric {
            assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
        }
    }
}
