//! An API fuzzer for the simulator: seeded random sequences of every `CmBackend` call, on 2–3
//! hosts of two fabrics, with hostile arguments and faults, each checked for panics, hangs,
//! implausible errors, illegal events, leaks after teardown and non-determinism.
//!
//! A seed expands into a [`Scenario`]: two fabrics (hosts, a random `SimConfig`, a random fault
//! schedule) and 20 to 200 calls, among them foreign, stale and forged handles and events,
//! `Duration::ZERO` and `MAX`, empty and oversize private data, QP capabilities 0 and
//! `u32::MAX`, backlog extremes, port 0, IPv6, addresses no host has and faults injected
//! mid-run. [`check_seed`] runs it twice and checks it; a failure is minimised
//! ([`minimise`]) and printed with the command that replays it ([`Failure`], [`replay_command`]).
//!
//! ```
//! use cm_fuzz::{run_campaign, Campaign, KnownSet};
//!
//! let report = run_campaign(&Campaign {
//!     seqs: 20,
//!     skip: KnownSet::parse("all").unwrap(),
//!     ..Campaign::default()
//! });
//! assert_eq!(report.stats.sequences, 20);
//! assert!(report.stats.calls >= 20 * 20);
//! ```
#![forbid(unsafe_code)]
#![deny(missing_docs)]

mod exec;
mod gen;
mod stats;

use std::fmt::Write as _;
use std::io::Write as _;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use exec::{run_checked, run_once, Check, Failure, RunOptions, RunResult, DEFAULT_WALL_LIMIT};
pub use gen::{
    AddrSel, FabricSpec, FuzzCall, HandleRef, HostSel, IpSel, KeySel, Known, KnownSet, OffSel, Op, Owner,
    RegionSel, RemoteSel, Scenario, SgeSel, WrOp, WrSel,
};
pub use stats::{error_kind, Stats};

/// Runs the scenario of `seed` twice and checks it.
pub fn check_seed(seed: u64, skip: KnownSet) -> RunResult {
    let scenario = Scenario::generate(seed, skip);
    let mut r = run_checked(&scenario);
    r.stats.sequences = 1;
    r
}

/// A smaller version of a failing scenario that still fails the same way.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Minimised {
    /// Indices of the calls kept, ascending.
    pub keep: Vec<usize>,
    /// Builder faults left out: (fabric, index in its schedule).
    pub drop_faults: Vec<(u8, usize)>,
    /// The failure the minimised scenario gives.
    pub failure: Failure,
    /// How many runs minimising took.
    pub runs: usize,
}

/// Runs `keep` / `drop_faults` of `scenario` (twice for a determinism failure); the failure,
/// if any.
fn reproduce(scenario: &Scenario, opts: &RunOptions<'_>, check: Check) -> Option<Failure> {
    let first = run_once(scenario, opts);
    if first.failure.is_some() || check != Check::Determinism {
        return first.failure;
    }
    let second = run_once(scenario, opts);
    (second.digest != first.digest).then(|| Failure {
        check: Check::Determinism,
        signature: "two runs of one seed differ".into(),
        detail: format!("digests {:016x} and {:016x}", first.digest, second.digest),
        at: None,
    })
}

/// Delta-debugs the call list of `scenario` (then its builder faults) while it still fails with
/// `failure`'s signature, within `max_runs` runs. `base` carries the options the failure was
/// found with (its `keep`, `drop_faults` and `log` are ignored).
pub fn minimise(scenario: &Scenario, failure: &Failure, max_runs: usize, base: &RunOptions<'_>) -> Minimised {
    let runs = std::cell::Cell::new(0);
    let mut best = failure.clone();
    let still_fails = |keep: &[usize], drop: &[(u8, usize)], best: &mut Failure| {
        runs.set(runs.get() + 1);
        let opts = RunOptions {
            keep: Some(keep),
            drop_faults: drop,
            log: false,
            ..*base
        };
        match reproduce(scenario, &opts, failure.check) {
            Some(f) if f.signature == failure.signature => {
                *best = f;
                true
            }
            _ => false,
        }
    };
    // Calls after the failing one cannot matter.
    let end = failure.at.map_or(scenario.ops.len(), |i| i + 1);
    let mut keep: Vec<usize> = (0..end).collect();
    if !still_fails(&keep, &[], &mut best) {
        keep = (0..scenario.ops.len()).collect();
    }
    let mut granularity = 2;
    while keep.len() >= 2 && runs.get() < max_runs {
        let chunk = keep.len().div_ceil(granularity);
        let mut reduced = false;
        let mut start = 0;
        while start < keep.len() && runs.get() < max_runs {
            let candidate: Vec<usize> = keep[..start]
                .iter()
                .chain(&keep[(start + chunk).min(keep.len())..])
                .copied()
                .collect();
            if still_fails(&candidate, &[], &mut best) {
                keep = candidate;
                granularity = (granularity - 1).max(2);
                reduced = true;
                break;
            }
            start += chunk;
        }
        if !reduced {
            if granularity >= keep.len() {
                break;
            }
            granularity = (granularity * 2).min(keep.len());
        }
    }
    if keep.len() == 1 && runs.get() < max_runs && still_fails(&[], &[], &mut best) {
        keep.clear();
    }
    let mut drop_faults = Vec::new();
    for (f, spec) in scenario.fabrics.iter().enumerate() {
        for i in 0..spec.faults.faults.len() {
            if runs.get() >= max_runs {
                break;
            }
            drop_faults.push((f as u8, i));
            if !still_fails(&keep, &drop_faults, &mut best) {
                drop_faults.pop();
            }
        }
    }
    Minimised {
        keep,
        drop_faults,
        failure: best,
        runs: runs.get(),
    }
}

/// Whether this build checks integer overflow (debug builds, and the `fuzz` profile that
/// `scripts/test-all` defines through the environment): the virtual clock's overflow is a
/// silent wrap without it.
pub fn overflow_checks() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| {
        exec::panics_quietly(|| {
            let x = std::hint::black_box(u8::MAX);
            std::hint::black_box(x + 1);
        })
    })
}

/// The cargo command that builds and runs cm-fuzz the way this process was built: release,
/// with overflow checks when this build has them.
pub fn cargo_command() -> &'static str {
    if overflow_checks() {
        "CARGO_PROFILE_FUZZ_INHERITS=release CARGO_PROFILE_FUZZ_OVERFLOW_CHECKS=true cargo run --profile fuzz -p cm-fuzz --"
    } else {
        "cargo run --release -p cm-fuzz --"
    }
}

/// The command that replays `seed` (restricted to a minimised call list when given).
pub fn replay_command(seed: u64, skip: KnownSet, min: Option<&Minimised>) -> String {
    let mut cmd = format!("{} --replay {seed}", cargo_command());
    if !skip.is_empty() {
        let _ = write!(cmd, " --allow-known {skip}");
    }
    if let Some(m) = min {
        let keep: Vec<String> = m.keep.iter().map(ToString::to_string).collect();
        let _ = write!(cmd, " --keep '{}'", keep.join(","));
        if !m.drop_faults.is_empty() {
            let drops: Vec<String> = m.drop_faults.iter().map(|(f, i)| format!("{f}:{i}")).collect();
            let _ = write!(cmd, " --drop-faults {}", drops.join(","));
        }
    }
    cmd
}

/// Which known defect a failure signature most likely is, named by the input family
/// `--allow-known` leaves out for it (for the report; the campaign reports every failure either
/// way).
pub fn likely_known(failure: &Failure) -> Option<&'static str> {
    let s = &failure.signature;
    let d = &failure.detail;
    if s.contains("generated an illegal event") {
        return Some("device-removal: events after device removal");
    }
    if d.contains("divide by zero") || d.contains("remainder with a divisor of zero") {
        return Some("duration-max or config: division by zero (a Duration::MAX range, or cm_retries)");
    }
    if d.contains("overflow") {
        return Some(
            "clock-overflow or config: arithmetic overflow (the virtual clock, or the configuration)",
        );
    }
    if failure.check == Check::ForgedAckAccepted {
        return Some("forged-ack: a forged event ack accepted");
    }
    if failure.check == Check::GenuineAckRefused
        || (failure.check == Check::Teardown && s.contains("unacked"))
    {
        return Some(
            "wrong-host-ack or forged-ack: an ack on the wrong host consumes the event, or a forged ack took its place",
        );
    }
    if d.contains("must be a unicast address") {
        return Some("host-addr: host(\"127.0.0.1\") panics");
    }
    None
}

/// A campaign: which seeds, how to split them, what to leave out.
#[derive(Clone, Debug)]
pub struct Campaign {
    /// First seed of the range.
    pub seed_start: u64,
    /// Seeds in the range (over all shards).
    pub seqs: u64,
    /// This shard's number and the shard count: runs the seeds `s` of the range with
    /// `(s - seed_start) % count == number`.
    pub shard: (u64, u64),
    /// Input families left out.
    pub skip: KnownSet,
    /// Wall-clock limit per sequence before the watchdog reports a hang and exits.
    pub wall_limit: Duration,
    /// Distinct failures to minimise (the rest are counted).
    pub minimise: usize,
    /// Runs each minimisation may take.
    pub minimise_runs: usize,
    /// Print progress lines on stderr.
    pub progress: bool,
}

impl Default for Campaign {
    fn default() -> Self {
        Campaign {
            seed_start: 0,
            seqs: 20_000,
            shard: (0, 1),
            skip: KnownSet::NONE,
            wall_limit: DEFAULT_WALL_LIMIT,
            minimise: 16,
            minimise_runs: 4000,
            progress: false,
        }
    }
}

/// One distinct failure found by a campaign.
#[derive(Clone, Debug)]
pub struct Found {
    /// The first seed that gave it.
    pub seed: u64,
    /// Its failure.
    pub failure: Failure,
    /// How many seeds gave it.
    pub count: u64,
    /// The minimised scenario, when minimised.
    pub minimised: Option<Minimised>,
}

/// What a campaign saw.
#[derive(Clone, Debug)]
pub struct Report {
    /// Counts over every sequence run.
    pub stats: Stats,
    /// Distinct failures by signature, in the order found.
    pub found: Vec<Found>,
    /// Sequences that failed.
    pub failed: u64,
    /// Wall-clock time.
    pub elapsed: Duration,
}

impl Report {
    /// Whether every sequence passed every check.
    pub fn is_clean(&self) -> bool {
        self.found.is_empty()
    }
}

/// What the watchdog watches: the seed in progress and since when.
struct Watch {
    epoch: Instant,
    seed: AtomicU64,
    since_ms: AtomicU64,
    active: AtomicBool,
}

fn watch() -> &'static Watch {
    static WATCH: OnceLock<Watch> = OnceLock::new();
    WATCH.get_or_init(|| Watch {
        epoch: Instant::now(),
        seed: AtomicU64::new(0),
        since_ms: AtomicU64::new(0),
        active: AtomicBool::new(false),
    })
}

/// Starts (once per process) the thread that ends the process, naming the seed and the replay
/// command, when one sequence runs longer than `limit` on the wall clock: a hang in the
/// simulator cannot be caught any other way.
fn start_watchdog(limit: Duration, skip: KnownSet) {
    static STARTED: OnceLock<()> = OnceLock::new();
    STARTED.get_or_init(|| {
        let w = watch();
        std::thread::Builder::new()
            .name("cm-fuzz-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(Duration::from_millis(200));
                let now = w.epoch.elapsed().as_millis() as u64;
                let since = w.since_ms.load(Ordering::SeqCst);
                if w.active.load(Ordering::SeqCst) && now.saturating_sub(since) > limit.as_millis() as u64 {
                    let seed = w.seed.load(Ordering::SeqCst);
                    eprintln!(
                        "cm-fuzz: HANG: seed {seed} ran longer than {limit:?} of wall-clock time\n  replay: {}",
                        replay_command(seed, skip, None)
                    );
                    let _ = std::io::stderr().flush();
                    std::process::exit(3);
                }
            })
            .expect("watchdog thread");
    });
}

/// Runs `f` for `seed` under the watchdog (see [`Campaign::wall_limit`]).
pub fn watched<T>(seed: u64, limit: Duration, skip: KnownSet, f: impl FnOnce() -> T) -> T {
    start_watchdog(limit, skip);
    let w = watch();
    w.seed.store(seed, Ordering::SeqCst);
    w.since_ms
        .store(w.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
    w.active.store(true, Ordering::SeqCst);
    let out = f();
    w.active.store(false, Ordering::SeqCst);
    out
}

/// Runs a campaign; failures are collected by signature, the first of each minimised.
pub fn run_campaign(c: &Campaign) -> Report {
    let started = Instant::now();
    start_watchdog(c.wall_limit, c.skip);
    let w = watch();
    let (k, n) = c.shard;
    let mut stats = Stats::default();
    let mut found: Vec<Found> = Vec::new();
    let mut failed = 0;
    let mut offset = k;
    let mut last_progress = Instant::now();
    while offset < c.seqs {
        let seed = c.seed_start.wrapping_add(offset);
        offset += n.max(1);
        w.seed.store(seed, Ordering::SeqCst);
        w.since_ms
            .store(w.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
        w.active.store(true, Ordering::SeqCst);
        let r = check_seed(seed, c.skip);
        w.active.store(false, Ordering::SeqCst);
        stats.merge(&r.stats);
        if let Some(failure) = r.failure {
            failed += 1;
            match found
                .iter_mut()
                .find(|f| f.failure.signature == failure.signature)
            {
                Some(f) => f.count += 1,
                None => {
                    let minimised = (found.len() < c.minimise).then(|| {
                        w.since_ms
                            .store(w.epoch.elapsed().as_millis() as u64, Ordering::SeqCst);
                        minimise(
                            &Scenario::generate(seed, c.skip),
                            &failure,
                            c.minimise_runs,
                            &RunOptions::default(),
                        )
                    });
                    if c.progress {
                        eprintln!("cm-fuzz: seed {seed}: new failure {failure}");
                    }
                    found.push(Found {
                        seed,
                        failure,
                        count: 1,
                        minimised,
                    });
                }
            }
        }
        if c.progress && last_progress.elapsed() > Duration::from_secs(10) {
            last_progress = Instant::now();
            eprintln!(
                "cm-fuzz: {} sequences, {} calls, {} failed, {:.0?}",
                stats.sequences,
                stats.calls,
                failed,
                started.elapsed()
            );
        }
    }
    Report {
        stats,
        found,
        failed,
        elapsed: started.elapsed(),
    }
}

/// The full text of a failure: seed, check, fabrics, the minimised call list with each call's
/// answer, and the replay command.
pub fn describe(found: &Found, skip: KnownSet) -> String {
    let scenario = Scenario::generate(found.seed, skip);
    let mut s = String::new();
    let _ = writeln!(
        s,
        "FAILED seed {} ({} seed(s) with this failure): {}",
        found.seed, found.count, found.failure
    );
    if let Some(k) = likely_known(&found.failure) {
        let _ = writeln!(s, "  likely known defect: {k}");
    }
    for (f, spec) in scenario.fabrics.iter().enumerate() {
        let _ = writeln!(s, "  fabric {f}: seed {} hosts {:?}", spec.seed, spec.hosts);
        let _ = writeln!(s, "    config {:?}", spec.config);
        let _ = writeln!(s, "    builder faults: {}", spec.faults);
    }
    match &found.minimised {
        Some(m) => {
            let _ = writeln!(
                s,
                "  minimised ({} runs) to {} of {} calls{}: {}",
                m.runs,
                m.keep.len(),
                scenario.ops.len(),
                if m.drop_faults.is_empty() {
                    String::new()
                } else {
                    format!(", without builder faults {:?}", m.drop_faults)
                },
                m.failure
            );
            let r = run_once(
                &scenario,
                &RunOptions {
                    keep: Some(&m.keep),
                    drop_faults: &m.drop_faults,
                    log: true,
                    ..RunOptions::default()
                },
            );
            for line in &r.log {
                let _ = writeln!(s, "    {line}");
            }
            let _ = writeln!(s, "  replay: {}", replay_command(found.seed, skip, Some(m)));
        }
        None => {
            let _ = writeln!(s, "  replay: {}", replay_command(found.seed, skip, None));
        }
    }
    s
}

/// Escapes `text` for a JSON string.
pub fn json_string(text: &str) -> String {
    let mut out = String::with_capacity(text.len() + 2);
    out.push('"');
    for c in text.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            c if (c as u32) < 0x20 => {
                let _ = write!(out, "\\u{:04x}", c as u32);
            }
            c => out.push(c),
        }
    }
    out.push('"');
    out
}

/// The campaign's summary as one JSON line (what a CI matrix, Slurm array or indexed job
/// collects per shard).
pub fn json_summary(c: &Campaign, r: &Report) -> String {
    let failures: Vec<String> = r
        .found
        .iter()
        .map(|f| {
            format!(
                "{{\"check\":{},\"signature\":{},\"seed\":{},\"count\":{},\"replay\":{}}}",
                json_string(f.failure.check.name()),
                json_string(&f.failure.signature),
                f.seed,
                f.count,
                json_string(&replay_command(f.seed, c.skip, f.minimised.as_ref()))
            )
        })
        .collect();
    format!(
        "{{\"shard\":\"{}/{}\",\"seed_start\":{},\"seqs\":{},\"allow_known\":{},\"clean\":{},\"failed\":{},\"elapsed_s\":{:.3},{},\"failures\":[{}]}}",
        c.shard.0,
        c.shard.1,
        c.seed_start,
        c.seqs,
        json_string(&c.skip.to_string()),
        r.is_clean(),
        r.failed,
        r.elapsed.as_secs_f64(),
        r.stats.json_members(),
        failures.join(",")
    )
}
