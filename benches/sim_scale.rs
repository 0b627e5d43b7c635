//! The simulator at scale, measured without criterion: full connection lifecycles per second
//! with N connections live, and memory per live connection.
//!
//! ```text
//! cargo bench --bench sim_scale                     # both tables
//! cargo bench --bench sim_scale -- rate [N ...]     # lifecycles/s with N live (10 1000 100000)
//! cargo bench --bench sim_scale -- memory [N ...]   # peak RSS growth per live connection
//! cargo bench --bench sim_scale -- profile N K      # K lifecycles with N live (for callgrind)
//! ```
//!
//! A lifecycle is the one the `cm` bench times (`Bed::lifecycle`): client id, resolve address and
//! route, QPs, connect and accept, `ESTABLISHED` on both ends, disconnect, `DISCONNECTED` on
//! both ends, QPs and ids destroyed, every event acked. Memory is read from
//! `/proc/self/status` (`VmHWM`, `VmRSS`) before and after opening the N connections, each N in
//! a fresh process so one N's freed memory cannot hide the next one's growth.
//!
//! Run without `--bench` (as `cargo test --benches` does) it only checks that a few hundred
//! lifecycles work.

use std::process::{Command, ExitCode};
use std::time::{Duration, Instant};

#[allow(dead_code)] // what only the `cm` bench needs
mod support;

use support::sim_bed;

/// Live connections the rate table is measured with.
const RATE_N: [usize; 3] = [10, 1_000, 100_000];
/// Live connections the memory table is measured with.
const MEMORY_N: [usize; 3] = [1_000, 10_000, 100_000];
/// Lifecycles run before timing, so the scheduler reaches its steady state.
const WARM_UP: u64 = 20_000;
/// Timed rounds per N; the median is reported.
const ROUNDS: usize = 5;
/// Lifecycles per round.
const PER_ROUND: u64 = 200_000;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let benching = args.iter().any(|a| a == "--bench");
    let args: Vec<&str> = args
        .iter()
        .map(String::as_str)
        .filter(|a| !a.starts_with("--"))
        .collect();
    let numbers = |from: usize, default: &[usize]| -> Result<Vec<usize>, String> {
        if args.len() <= from {
            return Ok(default.to_vec());
        }
        args[from..]
            .iter()
            .map(|a| {
                a.replace('_', "")
                    .parse()
                    .map_err(|_| format!("not a number: {a}"))
            })
            .collect()
    };
    let result = match args.first().copied() {
        None if !benching => {
            smoke();
            Ok(())
        }
        None => {
            rate(&RATE_N);
            memory(&MEMORY_N)
        }
        Some("rate") => numbers(1, &RATE_N).map(|n| rate(&n)),
        Some("memory") => numbers(1, &MEMORY_N).and_then(|n| memory(&n)),
        Some("one-memory") => numbers(1, &[]).map(|n| one_memory(n[0])),
        Some("profile") => numbers(1, &[]).and_then(|n| match n[..] {
            [live, k] => {
                profile(live, k as u64);
                Ok(())
            }
            _ => Err("profile needs N (live) and K (lifecycles)".into()),
        }),
        Some(other) => Err(format!("unknown mode {other} (rate, memory or profile)")),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("sim_scale: {e}");
            ExitCode::FAILURE
        }
    }
}

fn smoke() {
    let mut bed = sim_bed(100);
    bed.add_live(100);
    bed.timed_lifecycles(500);
    bed.finish();
    println!("sim_scale: smoke run passed (run with `cargo bench --bench sim_scale` to measure)");
}

fn rate(lives: &[usize]) {
    println!("lifecycles with N connections live (median of {ROUNDS} rounds of {PER_ROUND})");
    println!(
        "{:>8} {:>12} {:>13} {:>12} {:>9}",
        "N", "setup conn/s", "ns/lifecycle", "lifecycles/s", "vs first"
    );
    let mut first = None;
    for &n in lives {
        let mut bed = sim_bed(n);
        let start = Instant::now();
        bed.add_live(n);
        let setup = n as f64 / start.elapsed().as_secs_f64();
        bed.timed_lifecycles(WARM_UP);
        let mut rounds: Vec<Duration> = (0..ROUNDS).map(|_| bed.timed_lifecycles(PER_ROUND)).collect();
        rounds.sort();
        let ns = rounds[ROUNDS / 2].as_secs_f64() * 1e9 / PER_ROUND as f64;
        let ratio = ns / *first.get_or_insert(ns);
        println!("{n:>8} {setup:>12.0} {ns:>13.1} {:>12.0} {ratio:>8.2}x", 1e9 / ns);
        bed.finish();
    }
}

/// `VmRSS` and `VmHWM` of this process, in KiB.
fn rss_hwm() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").expect("/proc/self/status");
    let field = |name: &str| -> u64 {
        status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap_or_else(|| panic!("{name} missing from /proc/self/status"))
    };
    (field("VmRSS:"), field("VmHWM:"))
}

/// In a fresh process: opens `n` connections and prints `n rss0 hwm0 rss1 hwm1` (KiB).
fn one_memory(n: usize) {
    let mut bed = sim_bed(n);
    let (rss0, hwm0) = rss_hwm();
    bed.add_live(n);
    let (rss1, hwm1) = rss_hwm();
    println!("{n} {rss0} {hwm0} {rss1} {hwm1}");
    bed.finish();
}

fn memory(lives: &[usize]) -> Result<(), String> {
    let exe = std::env::current_exe().map_err(|e| e.to_string())?;
    println!("memory per established connection (both ends), each N in a fresh process");
    println!(
        "{:>8} {:>12} {:>12} {:>14} {:>14}",
        "N", "VmHWM +KiB", "VmRSS +KiB", "peak B/conn", "RSS B/conn"
    );
    for &n in lives {
        let out = Command::new(&exe)
            .args(["one-memory", &n.to_string()])
            .output()
            .map_err(|e| e.to_string())?;
        if !out.status.success() {
            return Err(format!(
                "one-memory {n}: {}",
                String::from_utf8_lossy(&out.stderr)
            ));
        }
        let text = String::from_utf8_lossy(&out.stdout);
        let v: Vec<u64> = text.split_whitespace().filter_map(|w| w.parse().ok()).collect();
        let [_, rss0, hwm0, rss1, hwm1] = v[..] else {
            return Err(format!("one-memory {n} printed {text:?}"));
        };
        let per = |kib: u64| kib as f64 * 1024.0 / n as f64;
        println!(
            "{n:>8} {:>12} {:>12} {:>14.0} {:>14.0}",
            hwm1 - hwm0,
            rss1 - rss0,
            per(hwm1 - hwm0),
            per(rss1 - rss0)
        );
    }
    println!("(includes the bench's own list of live handles: 24 B per connection)");
    Ok(())
}

fn profile(live: usize, k: u64) {
    let mut bed = sim_bed(live);
    bed.add_live(live);
    let took = bed.timed_lifecycles(k);
    println!(
        "{k} lifecycles with {live} live: {:.1} ns each",
        took.as_secs_f64() * 1e9 / k as f64
    );
    bed.finish();
}
