//! Criterion benches of connection management, written once over [`CmBackend`] and registered
//! for every backend at hand, side by side in one group per measurement: `<group>/sim/<param>`
//! and `<group>/hw/<param>`.
//!
//! ```text
//! cargo bench --bench cm                                            # the simulator
//! CM_HW_ADDR=10.0.0.1 cargo bench --features hw --bench cm -- hw    # hardware entries only
//! ```
//!
//! The hardware entries exist with the `hw` feature, and only when a device answers
//! (`cm::hw::probe`) and `CM_HW_ADDR` names the address of an interface with an RDMA device;
//! otherwise one line says why they are skipped. Hardware uses smaller connection counts than
//! the simulator (10 and 100 live connections, 100 ids on a channel): a Soft-RoCE device in a
//! small VM holds far fewer. `rdma_round_trip` times one RDMA READ or WRITE and its completion
//! (64 B and 64 KiB) on both.
//!
//! Each entry sets its bed up (listener, channels, live connections) on first use, outside the
//! timed part, and tears it down afterwards, checking that nothing is left alive. Multi-call
//! steps are timed with `iter_custom`; what a step needs first (say, the resolved ids a connect
//! starts from) is prepared in untimed chunks around the timed calls.

use std::hint::black_box;
use std::time::{Duration, Instant};

use criterion::measurement::WallTime;
use criterion::{BenchmarkGroup, BenchmarkId, Criterion, Throughput};

use cm::api::{Access, CmBackend, CmEventType, PortSpace, SendOp, SendWr, Sge, WcStatus};

mod support;

use support::{expect, sim_bed, Bed, WAIT};

/// Ids or connections prepared per chunk around a timed step.
const CHUNK: u64 = 64;

/// What one entry measures; [`Measure::run`] times `iters` of it on any backend.
#[derive(Clone, Copy, Debug)]
enum Measure {
    /// `rdma_create_id` + `rdma_destroy_id`.
    CreateDestroyId,
    /// `rdma_resolve_addr` to `ADDR_RESOLVED`, then `rdma_resolve_route` to `ROUTE_RESOLVED`.
    Resolve,
    /// `rdma_connect` on a resolved id with a QP to `ESTABLISHED` retrieved on both ends (the
    /// server's `CONNECT_REQUEST`, its child's QP and `rdma_accept` included).
    Connect,
    /// `rdma_disconnect` on the client to `DISCONNECTED` retrieved on both ends, then both QPs
    /// and ids destroyed.
    Disconnect,
    /// One connection's whole life: client id, resolve, QPs, connect and accept, `ESTABLISHED`
    /// on both ends, disconnect, `DISCONNECTED` on both ends, QPs and ids destroyed, every
    /// event acked.
    Lifecycle,
    /// This many ids on one channel each ask for an event at once, twice (address, then
    /// route): retrieving and acking the events.
    Events(usize),
    /// One RDMA READ (`read`) or WRITE of `len` bytes against the peer's region on an
    /// established connection: posted, and its completion polled (a round trip). The
    /// connection and both regions are made before timing and torn down after.
    Rdma { read: bool, len: u32 },
}

impl Measure {
    fn run<B: CmBackend>(self, bed: &mut Bed<B>, iters: u64) -> Duration {
        let before = bed.held();
        let took = match self {
            Measure::CreateDestroyId => create_destroy_id(bed, iters),
            Measure::Resolve => {
                let src = bed.src();
                chunked(
                    bed,
                    iters,
                    Bed::new_id,
                    |bed, id| {
                        bed.resolve(id, src);
                        id
                    },
                    |bed, id| bed.client.destroy_id(id).expect("rdma_destroy_id"),
                )
            }
            Measure::Connect => {
                let src = bed.src();
                chunked(
                    bed,
                    iters,
                    |bed| bed.ready(src),
                    |bed, id| bed.connect(id),
                    Bed::disconnect,
                )
            }
            Measure::Disconnect => {
                let src = bed.src();
                chunked(
                    bed,
                    iters,
                    |bed| {
                        let id = bed.ready(src);
                        bed.connect(id)
                    },
                    |bed, conn| bed.disconnect(conn),
                    |_, ()| {},
                )
            }
            Measure::Lifecycle => bed.timed_lifecycles(iters),
            Measure::Events(ids) => event_delivery(bed, ids, iters),
            Measure::Rdma { read, len } => rdma_round_trips(bed, read, len, iters),
        };
        assert_eq!(bed.held(), before, "{self:?} left something alive");
        took
    }
}

fn create_destroy_id<B: CmBackend>(bed: &mut Bed<B>, iters: u64) -> Duration {
    let start = Instant::now();
    for _ in 0..iters {
        let id = bed
            .client
            .create_id(bed.cch, PortSpace::Tcp)
            .expect("rdma_create_id");
        bed.client.destroy_id(black_box(id)).expect("rdma_destroy_id");
    }
    start.elapsed()
}

/// Runs `timed` on chunks of `prepare`d items, then `clean`s up; only `timed` is timed.
fn chunked<B: CmBackend, T, U>(
    bed: &mut Bed<B>,
    iters: u64,
    mut prepare: impl FnMut(&mut Bed<B>) -> T,
    mut timed: impl FnMut(&mut Bed<B>, T) -> U,
    mut clean: impl FnMut(&mut Bed<B>, U),
) -> Duration {
    let mut total = Duration::ZERO;
    let mut left = iters;
    while left > 0 {
        let n = left.min(CHUNK);
        left -= n;
        let items: Vec<T> = (0..n).map(|_| prepare(bed)).collect();
        let start = Instant::now();
        let done: Vec<U> = items.into_iter().map(|item| timed(bed, item)).collect();
        total += start.elapsed();
        for item in done {
            clean(bed, item);
        }
    }
    total
}

fn event_delivery<B: CmBackend>(bed: &mut Bed<B>, ids: usize, iters: u64) -> Duration {
    let (src, dst) = (bed.src(), bed.dst());
    let mut total = Duration::ZERO;
    let mut handles = Vec::with_capacity(ids);
    for _ in 0..iters {
        handles.extend((0..ids).map(|_| bed.new_id()));
        for ty in [CmEventType::AddrResolved, CmEventType::RouteResolved] {
            for &id in &handles {
                let asked = if ty == CmEventType::AddrResolved {
                    bed.client.resolve_addr(id, Some(src), dst, WAIT)
                } else {
                    bed.client.resolve_route(id, WAIT)
                };
                asked.expect("resolve");
            }
            let start = Instant::now();
            for _ in 0..ids {
                black_box(expect(&mut bed.client, bed.cch, ty));
            }
            total += start.elapsed();
        }
        for id in handles.drain(..) {
            bed.client.destroy_id(id).expect("rdma_destroy_id");
        }
    }
    total
}

fn rdma_round_trips<B: CmBackend>(bed: &mut Bed<B>, read: bool, len: u32, iters: u64) -> Duration {
    let src = bed.src();
    let id = bed.ready(src);
    let conn = bed.connect(id);
    let table = bed
        .server
        .reg_mr(conn.child, len as usize, Access::ALL)
        .expect("ibv_reg_mr (server)");
    let remote = bed.server.mr_info(table).expect("mr_info").remote().start();
    let local = bed
        .client
        .reg_mr(conn.client, len as usize, Access::LOCAL_WRITE)
        .expect("ibv_reg_mr (client)");
    let sge = [Sge::new(local, 0, len)];
    let op = if read {
        SendOp::Read { remote }
    } else {
        SendOp::Write { remote, imm: None }
    };
    let mut wcs = Vec::with_capacity(1);
    let start = Instant::now();
    for wr_id in 0..iters {
        bed.client
            .post_send_wr(conn.client, &SendWr::new(wr_id, op, &sge))
            .expect("ibv_post_send");
        wcs.clear();
        let n = bed
            .client
            .poll_cq(conn.client, &mut wcs, 1, WAIT)
            .expect("ibv_poll_cq");
        assert!(n == 1 && wcs[0].status == WcStatus::Success, "{wcs:?}");
        black_box(&wcs);
    }
    let took = start.elapsed();
    bed.client.dereg_mr(local).expect("ibv_dereg_mr (client)");
    bed.server.dereg_mr(table).expect("ibv_dereg_mr (server)");
    bed.disconnect(conn);
    took
}

// ---- registration -------------------------------------------------------------------------

/// One entry of a group.
struct Entry {
    /// The parameter shown in the id: `tcp` (the port space), live connections or ids.
    param: String,
    /// Connections opened before timing starts, kept open throughout.
    live: usize,
    measure: Measure,
}

impl Entry {
    fn tcp(measure: Measure) -> Self {
        Entry {
            param: "tcp".into(),
            live: 0,
            measure,
        }
    }

    fn throughput(&self) -> Throughput {
        match self.measure {
            Measure::Events(ids) => Throughput::Elements(2 * ids as u64),
            _ => Throughput::Elements(1),
        }
    }
}

/// Registers `e` as `group/backend/param`. The bed is made on first use (criterion calls
/// nothing for a filtered-out entry, so a filter skips the setup too) and finished after.
fn register<B: CmBackend>(
    g: &mut BenchmarkGroup<'_, WallTime>,
    backend: &str,
    e: &Entry,
    make: impl Fn(usize) -> Bed<B>,
) {
    let mut bed: Option<Bed<B>> = None;
    g.throughput(e.throughput());
    g.bench_function(BenchmarkId::new(backend, &e.param), |b| {
        let bed = bed.get_or_insert_with(|| {
            let mut bed = make(e.live);
            bed.add_live(e.live);
            if matches!(e.measure, Measure::Lifecycle) {
                report_virtual_time(&mut bed);
            }
            bed
        });
        b.iter_custom(|iters| e.measure.run(bed, iters));
    });
    if let Some(bed) = bed {
        bed.finish();
    }
}

/// On the simulator: the virtual time a lifecycle takes, which is what the latency model
/// says a connection costs (independent of how fast the simulator runs it).
fn report_virtual_time<B: CmBackend>(bed: &mut Bed<B>) {
    let Some(latency) = bed.fabric.as_ref().map(|f| f.config().latency) else {
        return;
    };
    if let Some(t) = bed.virtual_lifecycle(1000) {
        eprintln!(
            "sim: a lifecycle takes {:.1} us of virtual time on average ({} live; one-way \
             latency {:?}..={:?})",
            t.as_secs_f64() * 1e6,
            bed.live(),
            latency.start(),
            latency.end()
        );
    }
}

/// One group: the simulator's entries, then the hardware's when a device answers.
fn group(c: &mut Criterion, name: &str, sim: &[Entry], on_hw: &[Entry]) {
    let mut g = c.benchmark_group(name);
    for e in sim {
        register(&mut g, "sim", e, sim_bed);
    }
    hw::register(&mut g, on_hw);
    g.finish();
}

fn benches(c: &mut Criterion) {
    use Measure::*;
    for (name, m) in [
        ("create_destroy_id", CreateDestroyId),
        ("resolve_addr_route", Resolve),
        ("connect_established", Connect),
        ("disconnect_teardown", Disconnect),
        ("lifecycle", Lifecycle),
    ] {
        group(c, name, &[Entry::tcp(m)], &[Entry::tcp(m)]);
    }
    let ids = |n: &[usize]| -> Vec<Entry> {
        n.iter()
            .map(|&n| Entry {
                param: n.to_string(),
                live: 0,
                measure: Events(n),
            })
            .collect()
    };
    group(c, "event_delivery", &ids(&[100, 1_000]), &ids(&[100]));
    let live = |n: &[usize]| -> Vec<Entry> {
        n.iter()
            .map(|&n| Entry {
                param: n.to_string(),
                live: n,
                measure: Lifecycle,
            })
            .collect()
    };
    group(
        c,
        "lifecycle_live",
        &live(&[10, 1_000, 100_000]),
        &live(&[10, 100]),
    );
    let rdma: Vec<Entry> = [(true, 64), (false, 64), (true, 65_536), (false, 65_536)]
        .into_iter()
        .map(|(read, len)| Entry {
            param: format!("{}/{len}", if read { "read" } else { "write" }),
            live: 0,
            measure: Rdma { read, len },
        })
        .collect();
    group(c, "rdma_round_trip", &rdma, &rdma);
}

#[cfg(feature = "hw")]
mod hw {
    //! The hardware entries: `cm::hw::HwBackend` on the address in `CM_HW_ADDR`.

    use std::net::{IpAddr, SocketAddr};
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::sync::OnceLock;

    use criterion::measurement::WallTime;
    use criterion::BenchmarkGroup;

    use cm::hw::HwBackend;

    use super::{Bed, Entry};

    /// The address to run on, or `None` after saying once why the hw entries are skipped.
    fn addr() -> Option<IpAddr> {
        static ADDR: OnceLock<Option<IpAddr>> = OnceLock::new();
        *ADDR.get_or_init(|| {
            let found = match (std::env::var("CM_HW_ADDR"), cm::hw::probe()) {
                (_, Err(e)) => Err(format!("no RDMA device answers ({e})")),
                (Err(_), Ok(())) => Err("CM_HW_ADDR is not set (the address of an RDMA interface)".into()),
                (Ok(text), Ok(())) => text
                    .parse::<IpAddr>()
                    .map_err(|_| format!("CM_HW_ADDR={text:?} is not an IP address")),
            };
            match found {
                Ok(ip) => {
                    eprintln!("cm bench: hw entries run on {ip}");
                    Some(ip)
                }
                Err(why) => {
                    eprintln!("cm bench: hw entries skipped: {why}");
                    None
                }
            }
        })
    }

    pub(super) fn announce() {
        let _ = addr();
    }

    /// A bed on its own listening port (each entry's listener is gone before the next starts,
    /// but a fresh port keeps a slow teardown from turning into `EADDRINUSE`).
    fn bed(ip: IpAddr) -> Bed<HwBackend> {
        static PORT: AtomicU16 = AtomicU16::new(7471);
        let port = PORT.fetch_add(1, Ordering::Relaxed);
        let end = || HwBackend::new().expect("HwBackend::new");
        Bed::new(end(), end(), SocketAddr::new(ip, port), vec![ip], None)
    }

    pub(super) fn register(g: &mut BenchmarkGroup<'_, WallTime>, entries: &[Entry]) {
        let Some(ip) = addr() else { return };
        for e in entries {
            super::register(g, "hw", e, |_| bed(ip));
        }
    }
}

#[cfg(not(feature = "hw"))]
mod hw {
    //! Without the `hw` feature there are no hardware entries.

    use criterion::measurement::WallTime;
    use criterion::BenchmarkGroup;

    use super::Entry;

    pub(super) fn announce() {
        eprintln!("cm bench: hw entries skipped: built without the `hw` feature (cargo bench --features hw)");
    }

    pub(super) fn register(_: &mut BenchmarkGroup<'_, WallTime>, _: &[Entry]) {}
}

fn main() {
    hw::announce();
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
}
