//! A full connection lifecycle through the async layer (`cm::app`) on the simulator's
//! executor, beside the same lifecycle on the raw trait (`lifecycle/sim` in `benches/cm.rs`,
//! measured again here so that both come from one run).
//!
//! ```text
//! cargo bench --bench app                        # both, with criterion
//! cargo bench --bench app -- profile app N       # N lifecycles through the layer (for callgrind)
//! cargo bench --bench app -- profile raw N       # N lifecycles on the raw trait (for callgrind)
//! cargo bench --bench app -- ratio K N           # K rounds of N raw, then N through the layer
//! ```
//!
//! `ratio` alternates the two within each round, so that a burst of load elsewhere on the
//! machine slows one round of both rather than all the rounds of one; it prints each round's
//! ratio (layer / raw, per lifecycle) and their median.
//!
//! The `profile` runs print the fabric's trace hash and virtual time, so that a change to the
//! layer or its executor can be checked to leave the simulated run as it was.
//!
//! The layer's lifecycle: `Cm::connect` (id, address and route resolution, QP, connect,
//! `ESTABLISHED`), the server's `Listener::accept` in its accept loop, a task per connection
//! whose `recv` sees `DISCONNECTED` and disconnects in turn, the client's
//! `Connection::disconnect` (to its `DISCONNECTED`), both QPs and ids released. Receive
//! buffers are not posted (`recv_depth: 0`), so the layer does the raw lifecycle's calls and
//! what it costs on top is the layer itself: tasks, wakers, mailboxes, the executor's polling.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use criterion::{BenchmarkId, Criterion, Throughput};

use cm::app::sim::{HostOutcome, Sim};
use cm::app::{ConnOptions, Runtime};
use cm::sim::{SimFabric, TraceMode};

#[allow(dead_code)] // what only the other benches need
mod support;

/// `iters` lifecycles through the layer, timed from the first call to the last release.
fn app_lifecycles(iters: u64) -> Duration {
    app_run(iters).0
}

/// `iters` lifecycles through the layer: the time they took and the fabric they ran on.
fn app_run(iters: u64) -> (Duration, SimFabric) {
    let fabric = SimFabric::builder()
        .seed(support::SEED)
        .host("10.0.0.1")
        .host("10.0.1.1")
        .trace(TraceMode::HashOnly)
        .build();
    let server: SocketAddr = "10.0.0.1:7471".parse().expect("address");
    let opts = ConnOptions {
        recv_depth: 0,
        ..ConnOptions::default()
    };
    let mut sim: Sim<Result<u64, cm::app::Error>> = Sim::new(fabric.clone()).deadline(Duration::MAX);
    let server_opts = opts.clone();
    sim.server(0, move |ctx| {
        let opts = server_opts.clone();
        async move {
            let cm = ctx.cm()?;
            let listener = cm.listen(server, opts)?;
            loop {
                let (conn, _) = listener.accept().await?;
                drop(cm.runtime().spawn(async move {
                    let _ = conn.recv().await;
                    let _ = conn.disconnect().await;
                }));
            }
        }
    });
    sim.client(1, move |ctx| {
        let opts = opts.clone();
        async move {
            let cm = ctx.cm()?;
            for _ in 0..iters {
                let conn = cm.connect(server, &opts).await?;
                conn.disconnect().await?;
            }
            Ok(iters)
        }
    });
    let start = Instant::now();
    let out = sim.run().unwrap_or_else(|f| panic!("{f}"));
    let took = start.elapsed();
    assert!(
        matches!(out[1], HostOutcome::Finished(Ok(n)) if n == iters),
        "{:?}",
        out[1]
    );
    assert!(
        fabric.live_resources().is_clean(),
        "{:?}",
        fabric.live_resources()
    );
    (took, fabric)
}

/// `n` lifecycles of one kind, without criterion, for an instruction count of each.
fn profile(kind: &str, n: u64) -> Result<(), String> {
    let (took, fabric) = match kind {
        "app" => app_run(n),
        "raw" => {
            let mut bed = support::sim_bed(0);
            let took = bed.timed_lifecycles(n);
            let fabric = bed.fabric.clone().expect("a simulated bed has its fabric");
            bed.finish();
            (took, fabric)
        }
        other => return Err(format!("unknown kind {other} (app or raw)")),
    };
    println!(
        "{n} {kind} lifecycles: {:.1} ns each; trace-hash: {:016x}; virtual time: {}",
        took.as_secs_f64() * 1e9 / n as f64,
        fabric.trace_hash(),
        fabric.now()
    );
    Ok(())
}

fn benches(c: &mut Criterion) {
    let mut g = c.benchmark_group("lifecycle_app");
    g.throughput(Throughput::Elements(1));
    let mut bed = support::sim_bed(0);
    g.bench_function(BenchmarkId::new("raw-sim", "tcp"), |b| {
        b.iter_custom(|iters| bed.timed_lifecycles(iters));
    });
    bed.finish();
    g.bench_function(BenchmarkId::new("app-sim", "tcp"), |b| {
        b.iter_custom(app_lifecycles)
    });
    g.finish();
}

/// `rounds` rounds of `n` raw lifecycles then `n` through the layer; prints each round's ratio
/// and the median.
fn ratio(rounds: usize, n: u64) -> Result<(), String> {
    if rounds == 0 || n == 0 {
        return Err("ratio needs at least one round of at least one lifecycle".into());
    }
    let mut bed = support::sim_bed(0);
    let mut ratios = Vec::with_capacity(rounds);
    for round in 1..=rounds {
        let raw = bed.timed_lifecycles(n);
        let app = app_lifecycles(n);
        let r = app.as_secs_f64() / raw.as_secs_f64();
        println!(
            "round {round}: raw {:.0} ns, layer {:.0} ns per lifecycle: {r:.2}x",
            raw.as_secs_f64() * 1e9 / n as f64,
            app.as_secs_f64() * 1e9 / n as f64
        );
        ratios.push(r);
    }
    bed.finish();
    ratios.sort_by(f64::total_cmp);
    println!("median ratio of {rounds} rounds: {:.2}x", ratios[rounds / 2]);
    Ok(())
}

fn main() -> std::process::ExitCode {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let number = |n: &String| -> Result<u64, String> {
        n.replace('_', "")
            .parse()
            .map_err(|_| format!("not a number: {n}"))
    };
    let mode = args.first().map(String::as_str);
    if matches!(mode, Some("profile" | "ratio")) {
        let run = match (mode, &args[1..]) {
            (Some("profile"), [kind, n]) => number(n).and_then(|n| profile(kind, n)),
            (Some("profile"), _) => Err("profile needs a kind (app or raw) and a count".into()),
            (_, [k, n]) => number(k).and_then(|k| number(n).and_then(|n| ratio(k as usize, n))),
            _ => Err("ratio needs a number of rounds and a count".into()),
        };
        return match run {
            Ok(()) => std::process::ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("app: {e}");
                std::process::ExitCode::FAILURE
            }
        };
    }
    let mut c = Criterion::default().configure_from_args();
    benches(&mut c);
    c.final_summary();
    std::process::ExitCode::SUCCESS
}
