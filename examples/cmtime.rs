//! rdma-core's `cmtime` benchmark, written once against [`CmBackend`].
//!
//! N connections from a client to a listener, each step run for all connections at once and
//! timed the way cmtime (v44) times it: the whole step (`total ms`), the slowest and fastest
//! single connection (`max ms`, `min us`) and `total / N` (`us / conn`). The server accepts every
//! request and, on `DISCONNECTED`, disconnects and destroys its id, as cmtime's server threads do.
//!
//! On the simulator both ends run in this process on one thread, on the raw trait, so that a seed
//! gives one trace. On hardware the server runs on a thread of its own with its own backend while
//! the client runs on the main thread, as rdma-core's cmtime runs its server and client
//! concurrently, so the two tables compare step by step. `--role server` runs the server alone
//! (it serves `--connections` connections, then exits) and `--role client` the client alone, each
//! interoperating with rdma-core's `cmtime` as the other end.
//!
//! ```text
//! cargo run --release --example cmtime                          # simulator, 1000 connections
//! cargo run --release --example cmtime -- --connections 100000 --seed 7
//! cargo run --release --features hw --example cmtime -- --backend hw --bind 10.0.0.1 --server 10.0.0.1
//! cargo run --release --features hw --example cmtime -- --backend hw --role server --bind 10.0.0.1
//! cargo run --release --features hw --example cmtime -- --backend hw --role client --bind 10.0.0.1 --server 10.0.0.1
//! ```
//!
//! The last lines are `seed: S`, `trace-hash: <hex>` (simulator only) and `connections/s: <n>`.
//! `--help` lists the options; the command line is parsed and checked in `cmtime/cli.rs`.

use std::io::Write;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use cm::api::{ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps};
use cm::sim::SimFabric;

// pub(crate): the recorded-hash test (tests/recorded_hashes.rs) includes this file and builds
// its options with the same parser.
#[path = "cmtime/cli.rs"]
pub(crate) mod cli;
#[path = "cmtime/times.rs"]
mod times;

use cli::{Backend, Options, Outputs};
use times::{us, Conns, Times};

const STEPS: [&str; 8] = [
    "create id",
    "bind addr",
    "resolve addr",
    "resolve route",
    "create qp",
    "connect",
    "disconnect",
    "destroy",
];
const BIND: usize = 1;

/// How long the one thread waits on the client's channel when neither side has an event
/// queued: short, so the server side is pumped again soon (on the simulator this bounds how far
/// virtual time runs ahead of a request the server has not retrieved yet; the least message
/// latency is 5 us).
const IDLE_WAIT: Duration = Duration::from_micros(5);

/// How long the client waits on its channel when its server runs elsewhere (another thread or
/// process): a wait that ends as soon as an event arrives, so only a bound.
const REMOTE_WAIT: Duration = Duration::from_millis(100);

/// Prints cmtime v44's table.
fn show_perf(t: &Times, n: usize, bound: bool) {
    println!("step              total ms     max ms     min us  us / conn");
    for (i, name) in STEPS.iter().enumerate() {
        if i == BIND && !bound {
            continue;
        }
        let (max, min) = t.extremes[i].unwrap_or((0.0, 0.0));
        let total = match t.step[i] {
            (Some(a), Some(b)) => us(a, b),
            _ => 0.0,
        };
        println!(
            "{:<13}: {:>11.2}{:>11.2}{:>11.2}{:>11.2}",
            name,
            total / 1000.0,
            max / 1000.0,
            min,
            total / n as f64
        );
    }
}

/// The server side: accepts every request; on DISCONNECTED disconnects and destroys the child.
struct Server {
    ch: ChannelHandle,
    listener: IdHandle,
    /// Children accepted and not yet destroyed.
    children: usize,
    /// Requests accepted so far.
    accepted: usize,
    /// Whether a `DISCONNECTED` child is only disconnected (its DREP sent) when the event is
    /// handled, and torn down by [`Server::teardown`] once the events queued with it were
    /// answered too: a peer's disconnect then waits for no other child's teardown, as with
    /// rdma-core's cmtime, whose server hands teardown to a worker thread.
    defer_teardown: bool,
    /// Children disconnected and waiting for [`Server::teardown`].
    disconnected: Vec<IdHandle>,
}

impl Server {
    /// Creates the listener on `addr` (backlog 0: the system's maximum, as cmtime).
    fn listen<B: CmBackend>(b: &mut B, addr: SocketAddr) -> Result<Server, CmError> {
        let ch = b.create_event_channel()?;
        let listener = b.create_id(ch, PortSpace::Tcp)?;
        b.bind_addr(listener, addr)?;
        b.listen(listener, 0)?;
        Ok(Server {
            ch,
            listener,
            children: 0,
            accepted: 0,
            defer_teardown: false,
            disconnected: Vec::new(),
        })
    }

    /// Destroys the children [`Server::handle`] left disconnected (with `defer_teardown`).
    #[cfg(feature = "hw")]
    fn teardown<B: CmBackend>(&mut self, b: &mut B) -> Result<(), CmError> {
        for id in std::mem::take(&mut self.disconnected) {
            b.destroy_qp(id)?;
            b.destroy_id(id)?;
            self.children -= 1;
        }
        Ok(())
    }

    /// Handles every event queued now; whether there was one.
    fn pump<B: CmBackend>(&mut self, b: &mut B) -> Result<bool, CmError> {
        let mut progressed = false;
        while let Some(ev) = b.get_cm_event(self.ch, Duration::ZERO)? {
            progressed = true;
            self.handle(b, ev)?;
        }
        Ok(progressed)
    }

    fn handle<B: CmBackend>(&mut self, b: &mut B, ev: cm::api::CmEvent) -> Result<(), CmError> {
        let (ty, id, status) = (ev.event(), ev.id(), ev.status());
        b.ack_cm_event(ev)?;
        match ty {
            CmEventType::ConnectRequest => {
                b.create_qp(id, qp_caps())?;
                b.accept(id, &ConnParam::new())?;
                self.children += 1;
                self.accepted += 1;
            }
            CmEventType::Established | CmEventType::TimewaitExit => {}
            CmEventType::Disconnected if self.defer_teardown => {
                b.disconnect(id)?;
                self.disconnected.push(id);
            }
            CmEventType::Disconnected => {
                b.disconnect(id)?;
                b.destroy_qp(id)?;
                b.destroy_id(id)?;
                self.children -= 1;
            }
            other => eprintln!("server: unexpected {other} (status {status}) on {id}"),
        }
        Ok(())
    }

    /// Destroys the listener and its channel (events still queued for destroyed children die
    /// with them).
    fn close<B: CmBackend>(self, b: &mut B) -> Result<(), CmError> {
        b.destroy_id(self.listener)?;
        b.destroy_event_channel(self.ch)
    }
}

/// The server side when it runs on its own (a thread, or `--role server`): serves `n`
/// connections, until each was accepted and torn down, or `stop` is raised, or 600 s passed.
/// `ready` is called once the listener listens. Returns how many it accepted.
#[cfg(feature = "hw")]
fn serve<B: CmBackend>(
    b: &mut B,
    addr: SocketAddr,
    n: usize,
    stop: &std::sync::atomic::AtomicBool,
    ready: impl FnOnce(),
) -> Result<usize, CmError> {
    let mut server = Server::listen(b, addr)?;
    server.defer_teardown = true;
    ready();
    let limit = Instant::now() + Duration::from_secs(600);
    while server.accepted < n || server.children > 0 {
        if stop.load(std::sync::atomic::Ordering::Relaxed) || Instant::now() > limit {
            return Err(timed_out(cm::api::Call::GetCmEvent));
        }
        // Blocks until an event arrives (bounded, to look at `stop` now and then), then
        // answers every event queued behind it before tearing down the disconnected.
        if let Some(ev) = b.get_cm_event(server.ch, REMOTE_WAIT)? {
            server.handle(b, ev)?;
            server.pump(b)?;
        }
        server.teardown(b)?;
    }
    let accepted = server.accepted;
    server.close(b)?;
    Ok(accepted)
}

fn timed_out(call: cm::api::Call) -> CmError {
    CmError::Os {
        call,
        errno: cm::api::errno::ETIMEDOUT,
    }
}

fn qp_caps() -> QpCaps {
    QpCaps {
        max_send_wr: 1,
        max_recv_wr: 1,
        max_send_sge: 1,
        max_recv_sge: 1,
        max_inline_data: 0,
        max_message_size: 64,
    }
}

/// The server when it shares the client's thread: its backend and its state.
type Local<'a, B> = Option<(&'a mut B, Server)>;

/// Drives the client (and the server, when it shares this thread) until `remaining` connections
/// completed the step. The client's `handle` gets each client event and returns whether it
/// completed one connection's step.
fn run_step<B: CmBackend>(
    local: &mut Local<'_, B>,
    client_b: &mut B,
    cch: ChannelHandle,
    mut remaining: usize,
    mut handle: impl FnMut(&mut B, CmEventType, IdHandle, i32) -> Result<bool, CmError>,
) -> Result<(), CmError> {
    let limit = Instant::now() + Duration::from_secs(600);
    // With the server elsewhere, nothing but the client's channel needs this thread.
    let idle_wait = if local.is_some() { IDLE_WAIT } else { REMOTE_WAIT };
    while remaining > 0 {
        let mut progressed = match local {
            Some((server_b, server)) => server.pump(&mut **server_b)?,
            None => false,
        };
        while let Some(ev) = client_b.get_cm_event(cch, Duration::ZERO)? {
            progressed = true;
            let (ty, id, status) = (ev.event(), ev.id(), ev.status());
            client_b.ack_cm_event(ev)?;
            if handle(client_b, ty, id, status)? {
                remaining -= 1;
            }
        }
        if !progressed {
            // Nothing queued on either side: wait a little on the client's channel (on the
            // simulator this moves virtual time to the next thing that happens).
            if let Some(ev) = client_b.get_cm_event(cch, idle_wait)? {
                let (ty, id, status) = (ev.event(), ev.id(), ev.status());
                client_b.ack_cm_event(ev)?;
                if handle(client_b, ty, id, status)? {
                    remaining -= 1;
                }
            }
        }
        if Instant::now() > limit {
            return Err(timed_out(cm::api::Call::GetCmEvent));
        }
    }
    Ok(())
}

/// The client's steps, with the server on `server_b` interleaved on this thread when given
/// (None: the server runs elsewhere and listens on `--server`).
fn cmtime<B: CmBackend>(
    server_b: Option<&mut B>,
    client_b: &mut B,
    o: &Options,
    sources: &[IpAddr],
) -> Result<Times, CmError> {
    let n = o.connections;
    let dst = SocketAddr::new(o.server, o.port);
    let mut local: Local<'_, B> = match server_b {
        Some(b) => {
            let server = Server::listen(b, dst)?;
            Some((b, server))
        }
        None => None,
    };
    let cch = client_b.create_event_channel()?;
    let mut t = Times::new();
    let mut conns = Conns::with_capacity(n);

    t.begin(0);
    for _ in 0..n {
        let started = t.now();
        let id = client_b.create_id(cch, PortSpace::Tcp)?;
        conns.push(id, started);
        conns.stop(id, 0, &mut t);
    }
    t.end(0);

    let src = |c: usize| cli::source(sources, c);
    if let Some(bind) = o.bind {
        t.begin(BIND);
        for c in 0..conns.len() {
            let id = conns.start(c, t.now());
            client_b.bind_addr(id, src(c).unwrap_or(SocketAddr::new(bind, 0)))?;
            conns.stop(id, BIND, &mut t);
        }
        t.end(BIND);
    }

    // resolve addr / resolve route: asynchronous, retried after an error like cmtime does.
    for (step, route) in [(2, false), (3, true)] {
        t.begin(step);
        let mut retries = vec![o.retries; n];
        for c in 0..n {
            let id = conns.start(c, t.now());
            if route {
                client_b.resolve_route(id, o.timeout)?;
            } else {
                client_b.resolve_addr(id, if o.bind.is_some() { None } else { src(c) }, dst, o.timeout)?;
            }
        }
        let (ok, err) = if route {
            (CmEventType::RouteResolved, CmEventType::RouteError)
        } else {
            (CmEventType::AddrResolved, CmEventType::AddrError)
        };
        let timeout = o.timeout;
        run_step(&mut local, client_b, cch, n, |b, ty, id, status| {
            if ty == ok {
                conns.stop_later(id, t.now());
                return Ok(true);
            }
            let c = conns.of(id).conn as usize;
            if ty == err && retries[c] > 0 {
                retries[c] -= 1;
                if route {
                    b.resolve_route(id, timeout)?
                } else {
                    b.resolve_addr(id, None, dst, timeout)?
                }
                return Ok(false);
            }
            eprintln!("client: {ty} (status {status}) on {id} while resolving");
            Err(CmError::Os {
                call: cm::api::Call::GetCmEvent,
                errno: -status,
            })
        })?;
        t.end(step);
        conns.settle(step, &mut t);
    }

    t.begin(4);
    for c in 0..n {
        let id = conns.start(c, t.now());
        client_b.create_qp(id, qp_caps())?;
        conns.stop(id, 4, &mut t);
    }
    t.end(4);

    t.begin(5);
    for c in 0..n {
        let id = conns.start(c, t.now());
        client_b.connect(id, &ConnParam::new())?;
    }
    run_step(&mut local, client_b, cch, n, |_, ty, id, status| {
        if ty == CmEventType::Established {
            conns.stop_later(id, t.now());
            return Ok(true);
        }
        eprintln!("client: {ty} (status {status}) on {id} while connecting");
        Err(CmError::Os {
            call: cm::api::Call::Connect,
            errno: cm::api::errno::ECONNREFUSED,
        })
    })?;
    t.end(5);
    conns.settle(5, &mut t);

    t.begin(6);
    for c in 0..n {
        let id = conns.start(c, t.now());
        client_b.disconnect(id)?;
    }
    run_step(&mut local, client_b, cch, n, |b, ty, id, status| match ty {
        CmEventType::Disconnected => {
            b.destroy_qp(id)?;
            conns.stop_later(id, t.now());
            Ok(true)
        }
        CmEventType::TimewaitExit => Ok(false),
        _ => {
            eprintln!("client: {ty} (status {status}) on {id} while disconnecting");
            Ok(false)
        }
    })?;
    t.end(6);
    conns.settle(6, &mut t);

    t.begin(7);
    for c in 0..n {
        let id = conns.start(c, t.now());
        client_b.destroy_id(id)?;
        conns.stop(id, 7, &mut t);
    }
    t.end(7);

    if let Some((server_b, mut server)) = local {
        // The server destroys each child when it sees DISCONNECTED; wait for the last ones.
        let limit = Instant::now() + Duration::from_secs(60);
        while server.children > 0 && Instant::now() < limit {
            if !server.pump(server_b)? {
                let _ = client_b
                    .get_cm_event(cch, IDLE_WAIT)?
                    .map(|ev| client_b.ack_cm_event(ev));
            }
        }
        // TIMEWAIT_EXIT events may still be queued for destroyed ids; they die with them.
        server.close(server_b)?;
    }
    client_b.destroy_event_channel(cch)?;
    Ok(t)
}

fn total_us(t: &Times) -> f64 {
    match (t.step[0].0, t.step[7].1) {
        (Some(a), Some(b)) => us(a, b),
        _ => f64::NAN,
    }
}

/// Rounds of `--scale`; the median is reported.
const SCALE_ROUNDS: usize = 5;

/// `VmRSS` and `VmHWM` (the peak) of this process, in KiB.
fn rss_hwm_kib() -> Result<(u64, u64), String> {
    let status =
        std::fs::read_to_string("/proc/self/status").map_err(|e| format!("/proc/self/status: {e}"))?;
    let field = |name: &str| -> Result<u64, String> {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .ok_or_else(|| format!("no {name} in /proc/self/status"))
    };
    Ok((field("VmRSS:")?, field("VmHWM:")?))
}

/// Nanoseconds this thread has run on a CPU (the first field of `/proc/thread-self/schedstat`):
/// on a machine shared with other work, wall-clock time counts their time slices too. The
/// kernel brings the figure up to date at scheduler ticks (4 ms here), so only spans much
/// longer than that are measured by it: see [`CPU_SPAN_NS`].
fn thread_cpu_ns() -> Result<u64, String> {
    let path = "/proc/thread-self/schedstat";
    let stat = std::fs::read_to_string(path).map_err(|e| format!("{path}: {e}"))?;
    stat.split_whitespace()
        .next()
        .and_then(|v| v.parse().ok())
        .ok_or_else(|| format!("{path}: no CPU time in {stat:?}"))
}

/// CPU time over which `--scale` measures each CPU rate: a run shorter than this (1 000
/// connections take a few milliseconds) is repeated until the runs add up to it.
const CPU_SPAN_NS: u64 = 250_000_000;

/// One simulated run's figures for `--scale`.
struct ScaleRun {
    /// Connections per second of wall-clock time, timed as cmtime's table times them.
    rate: f64,
    /// Connections per second of this thread's CPU time, fabric set-up included, over runs
    /// repeated for at least [`CPU_SPAN_NS`].
    cpu_rate: f64,
    hash: u64,
}

/// One simulated cmtime run of `o` on a fresh fabric, without its table: the step times and
/// the trace hash.
pub(crate) fn sim_run(o: &Options) -> Result<(Times, u64), String> {
    let (fabric, sources) = cli::sim_fabric(o).map_err(|e| e.to_string())?;
    // One host serves both ends when the client binds the server's address.
    let (mut server, mut client) = (fabric.host(0), fabric.host(fabric.host_count() - 1));
    let t = cmtime(Some(&mut server), &mut client, o, &sources)
        .map_err(|e| format!("{e}\n{}", fabric.repro_line()))?;
    Ok((t, fabric.trace_hash()))
}

/// One simulated cmtime run of `n` connections (repeated for its CPU rate), without its table.
fn scale_run(o: &Options, n: usize) -> Result<ScaleRun, String> {
    let o = Options {
        connections: n,
        ..o.clone()
    };
    let run = || sim_run(&o);
    let cpu_start = thread_cpu_ns()?;
    let (t, hash) = run()?;
    let mut runs = 1;
    let mut cpu = thread_cpu_ns()?.saturating_sub(cpu_start);
    while cpu < CPU_SPAN_NS {
        run()?;
        runs += 1;
        cpu = thread_cpu_ns()?.saturating_sub(cpu_start);
    }
    Ok(ScaleRun {
        rate: n as f64 / (total_us(&t) / 1e6),
        cpu_rate: (runs * n) as f64 / (cpu as f64 / 1e9),
        hash,
    })
}

/// `--scale`: how connections/s holds up as the count grows, measured in one process so the
/// ratios come from one stretch of the machine's load. Rounds interleave the counts, so a
/// burst of load elsewhere slows one run of each rather than every run of one.
fn run_scale(o: &Options, sizes: &[usize]) -> Result<(), String> {
    let o = Options {
        seed: Some(o.seed.unwrap_or(7)),
        trace: None,
        mermaid: None,
        ..o.clone()
    };
    let (rss_before, _) = rss_hwm_kib()?;
    // Warm-up: one run of each count, not counted (allocator, caches, page tables).
    let mut hashes = Vec::new();
    for &n in sizes {
        hashes.push(scale_run(&o, n)?.hash);
    }
    let mut rates = vec![Vec::new(); sizes.len()];
    let mut cpu_rates = vec![Vec::new(); sizes.len()];
    for _ in 0..SCALE_ROUNDS {
        for (i, &n) in sizes.iter().enumerate() {
            let run = scale_run(&o, n)?;
            if run.hash != hashes[i] {
                return Err(format!(
                    "{n} connections: trace hash {:016x}, then {:016x}: not deterministic",
                    hashes[i], run.hash
                ));
            }
            rates[i].push(run.rate);
            cpu_rates[i].push(run.cpu_rate);
        }
    }
    let (_, hwm) = rss_hwm_kib()?;
    let median = |r: &mut Vec<f64>| {
        r.sort_by(f64::total_cmp);
        r[SCALE_ROUNDS / 2]
    };
    println!("seed: {}", o.seed.unwrap_or(7));
    println!(
        "{:>11} {:>14} {:>9}  {:<18} connections/s of each round",
        "connections", "median conn/s", "slowdown", "trace-hash"
    );
    let mut first = None;
    for ((n, r), hash) in sizes.iter().zip(&rates).zip(&hashes) {
        let rounds = r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ");
        let median = median(&mut r.clone());
        let slowdown = *first.get_or_insert(median) / median;
        println!("{n:>11} {median:>14.0} {slowdown:>8.2}x  {hash:016x}   {rounds}");
    }
    // The same runs per second of CPU time: what the load of other processes disturbs least.
    println!(
        "{:>11} {:>14} {:>9}  CPU connections/s of each round",
        "connections", "median CPU c/s", "slowdown"
    );
    let mut first = None;
    for (n, r) in sizes.iter().zip(&cpu_rates) {
        let rounds = r.iter().map(|x| format!("{x:.0}")).collect::<Vec<_>>().join(" ");
        let median = median(&mut r.clone());
        let slowdown = *first.get_or_insert(median) / median;
        println!("{n:>11} {median:>14.0} {slowdown:>8.2}x  {rounds}");
    }
    let largest = sizes.iter().copied().max().unwrap_or(1) as f64;
    println!(
        "peak RSS: {} KiB, {:.0} B per connection of the largest run ({:.0} B above the RSS before the first run)",
        hwm,
        hwm as f64 * 1024.0 / largest,
        hwm.saturating_sub(rss_before) as f64 * 1024.0 / largest
    );
    Ok(())
}

fn run_sim(o: &Options, fabric: SimFabric, sources: &[IpAddr], outputs: Outputs) -> Result<(), String> {
    // One host serves both ends when the client binds the server's address.
    let one_host = fabric.host_count() == 1;
    let (mut server, mut client_b) = if one_host {
        (fabric.host(0), fabric.host(0))
    } else {
        (fabric.host(0), fabric.host(1))
    };
    let t = cmtime(Some(&mut server), &mut client_b, o, sources)
        .map_err(|e| format!("{e}\n{}", fabric.repro_line()))?;
    show_perf(&t, o.connections, o.bind.is_some());
    let write = |out: Option<(std::path::PathBuf, std::fs::File)>, text: String| match out {
        Some((path, mut file)) => file
            .write_all(text.as_bytes())
            .map_err(|e| format!("{}: {e}", path.display())),
        None => Ok(()),
    };
    write(outputs.trace, fabric.trace_lines().join("\n") + "\n")?;
    write(outputs.mermaid, fabric.trace_mermaid())?;
    println!("virtual time: {:.6} s", fabric.now().since_start().as_secs_f64());
    println!("seed: {}", fabric.seed());
    println!("trace-hash: {:016x}", fabric.trace_hash());
    println!(
        "connections/s: {:.0}",
        o.connections as f64 / (total_us(&t) / 1e6)
    );
    Ok(())
}

#[cfg(feature = "hw")]
fn run_hw(o: &Options) -> Result<(), String> {
    use std::sync::atomic::{AtomicBool, Ordering};
    use std::sync::{mpsc, Arc};

    use cli::Role;
    use cm::hw::HwBackend;

    let new_backend = || HwBackend::new().map_err(|e| e.to_string());
    // Each QP holds a file descriptor (its completion channel); with both ends in this process,
    // 1000 connections are 2000 QPs, past the usual soft limit of 1024.
    if let Err(e) = cm::hw::raise_fd_limit() {
        eprintln!("cmtime: could not raise the open-file limit: {e}");
    }
    if o.role == Role::Server {
        // Like rdma-core's server, it listens on the -b address.
        let addr = SocketAddr::new(o.server, o.port);
        let mut b = new_backend()?;
        let never = AtomicBool::new(false);
        let accepted = serve(&mut b, addr, o.connections, &never, || {
            println!("server: listening on {addr}")
        })
        .map_err(|e| format!("server: {e}"))?;
        println!("server: {accepted} connections accepted and torn down");
        return Ok(());
    }
    let server_thread = if o.role == Role::Both {
        // The server gets a backend of its own and runs concurrently on its own thread, as
        // rdma-core's cmtime server does; the client starts once it listens.
        let mut b = new_backend()?;
        let addr = SocketAddr::new(o.server, o.port);
        let n = o.connections;
        let stop = Arc::new(AtomicBool::new(false));
        let (ready_tx, ready_rx) = mpsc::channel();
        let thread_stop = Arc::clone(&stop);
        let handle = std::thread::Builder::new()
            .name("cmtime-server".into())
            .spawn(move || {
                serve(&mut b, addr, n, &thread_stop, || {
                    // The main thread stops waiting after 30 s; a send after that finds no receiver.
                    let _ = ready_tx.send(());
                })
            })
            .map_err(|e| format!("server thread: {e}"))?;
        if ready_rx.recv_timeout(Duration::from_secs(30)).is_err() {
            stop.store(true, Ordering::Relaxed);
            let why = match handle.join() {
                Ok(Err(e)) => e.to_string(),
                _ => "not listening within 30 s".into(),
            };
            return Err(format!("server: {why}"));
        }
        Some((handle, stop))
    } else {
        None
    };
    let mut client = new_backend()?;
    let sources: Vec<IpAddr> = o.bind.into_iter().collect();
    let result = cmtime(None, &mut client, o, &sources);
    if let Some((handle, stop)) = server_thread {
        if result.is_err() {
            stop.store(true, Ordering::Relaxed);
        }
        match handle.join() {
            Ok(Ok(_)) => {}
            Ok(Err(e)) if result.is_ok() => return Err(format!("server: {e}")),
            // The client's failure may well be the server's doing: say both.
            Ok(Err(e)) => eprintln!("cmtime: server: {e}"),
            Err(_) => return Err("server thread panicked".into()),
        }
    }
    let t = result.map_err(|e| e.to_string())?;
    show_perf(&t, o.connections, o.bind.is_some());
    println!(
        "connections/s: {:.0}",
        o.connections as f64 / (total_us(&t) / 1e6)
    );
    Ok(())
}

#[cfg(not(feature = "hw"))]
fn run_hw(_: &Options) -> Result<(), String> {
    // `cli::parse` refuses `--backend hw` in a build without it.
    Err("this build has no hardware backend: rebuild with `--features hw`".into())
}

fn main() -> ExitCode {
    let o = match cli::parse(std::env::args_os(), cfg!(feature = "hw")) {
        Ok(cli::Parsed::Run(o)) => o,
        Ok(cli::Parsed::Help(help)) => {
            // clap prints help on stdout; a closed stdout is no reason to fail.
            let _ = help.print();
            return ExitCode::SUCCESS;
        }
        Err(msg) => {
            eprintln!("cmtime: {msg}");
            return ExitCode::from(2);
        }
    };
    let result = match o.backend {
        Backend::Sim if o.scale.is_some() => run_scale(&o, o.scale.as_deref().unwrap_or_default()),
        Backend::Sim => {
            // A bad simulator set-up (`--bind 127.0.0.1`, `CM_SIM_SEED=abc`) is a usage error,
            // found before any output file is created.
            let (fabric, sources) = match cli::sim_fabric(&o) {
                Ok(built) => built,
                Err(e) => {
                    eprintln!("cmtime: {e}");
                    return ExitCode::from(2);
                }
            };
            // Output files are opened before the run: a path that cannot be written fails now.
            match cli::open_outputs(&o) {
                Ok(outputs) => run_sim(&o, fabric, &sources, outputs),
                Err(msg) => {
                    eprintln!("cmtime: {msg}");
                    return ExitCode::from(2);
                }
            }
        }
        // `cli::parse` refuses the simulator's output files with the hardware backend.
        Backend::Hw => run_hw(&o),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("cmtime: {e}");
            ExitCode::FAILURE
        }
    }
}
