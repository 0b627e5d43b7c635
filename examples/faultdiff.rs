//! The fault-differential suite: connections through chosen IB CM message losses, on the
//! simulator and on Soft-RoCE, compared.
//!
//! Each pattern (`faultdiff/patterns.rs`) loses some CM messages of one kind one way (the first,
//! the first two, every one), or cuts the link for a while, and lets the two ends of one
//! connection act on their events by a few rules (accept, disconnect a second after
//! `ESTABLISHED`, destroy after `TIMEWAIT_EXIT`...). A run records every event either end
//! retrieved (with its status and its time after the connect), the outcome of every act, and the
//! CM messages on the wire by way and kind, each transmission counted: first sends, retries and
//! answers to duplicates.
//!
//! * On the simulator the losses are [`Fault::Drop`](cm::sim::Fault::Drop) rules, in virtual
//!   time; each pattern's record must be what the pattern's table says Linux 6.1's IB CM does
//!   (`expect`, `wire`), the times within 5 ms.
//! * With `--hw` (feature `hw`, the lab's pair topology: rxe0 on 10.0.K.1, rxe1 on 10.0.K.2) the
//!   same pattern runs on pair K, K its place in the table, all patterns at once; the losses are
//!   nft rules in the lab's `ip cm_fault` table, which also counts the messages. The rxe record
//!   must be the simulator's: the same events with the same statuses in the same order at each
//!   end, the same outcomes, the same messages, and each event's time within 0.5 s + 10 % of the
//!   simulator's (TCG's emulated CPUs delay the handling of what the kernel's timers start).
//!
//! A pattern whose rxe record differs fails the run unless `tests/faultdiff-departures.txt`
//! lists it with its reason; a listed pattern that does not differ fails it too.
//!
//! ```text
//! cargo run --example faultdiff                                 # the simulator against the table
//! cargo run --release --features hw --example faultdiff -- --hw # in the lab's pair group
//! ```
//!
//! The last line is `faultdiff: P patterns, S same, L listed, U unlisted differences, T stale
//! entries` (with `--hw`) or `faultdiff: P patterns on the simulator, M off the table`. Exit code
//! 0 when nothing is unlisted or off, 1 otherwise, 2 for a bad option.

use std::fmt::Write as _;
use std::process::ExitCode;
use std::time::Duration;

#[path = "faultdiff/patterns.rs"]
mod patterns;
#[path = "faultdiff/run.rs"]
mod run;

use patterns::{Dir, End, Pattern, KINDS, PATTERNS};
use run::Record;

/// Known departures: one `pattern | reason` line each.
#[cfg_attr(not(feature = "hw"), allow(dead_code))]
const DEPARTURES: &str = include_str!("../tests/faultdiff-departures.txt");

/// The seed of the simulator's runs (each pattern on a fabric of its own).
const SEED: u64 = 1;

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}

fn end_name(end: End) -> &'static str {
    match end {
        End::Client => "client",
        End::Server => "server",
    }
}

fn dir_name(dir: Dir) -> &'static str {
    match dir {
        Dir::ToServer => "c->s",
        Dir::ToClient => "s->c",
    }
}

/// A record's events and messages, a line each.
fn describe(r: &Record) -> String {
    let mut s = String::new();
    if let Some(e) = &r.error {
        let _ = writeln!(s, "    error: {e}");
    }
    for &(end, n, ev, status, at) in &r.seen {
        let _ = writeln!(
            s,
            "    {:6} id {n} {ev} status {status} at {:.0} ms",
            end_name(end),
            ms(at)
        );
    }
    for &(end, n, act, errno) in r.acts.iter().filter(|a| a.3 != 0) {
        let _ = writeln!(s, "    {:6} id {n} {act:?} failed: errno {errno}", end_name(end));
    }
    let wire: Vec<String> = r
        .wire
        .iter()
        .map(|(&(dir, msg), n)| format!("{} {} {n}", dir_name(dir), msg.name()))
        .collect();
    let _ = writeln!(s, "    wire: {}", wire.join(", "));
    s
}

/// Where the simulator's record departs from the pattern's table (empty: nowhere).
fn off_the_table(p: &Pattern, r: &Record) -> Vec<String> {
    let mut off = Vec::new();
    if let Some(e) = &r.error {
        off.push(format!("error: {e}"));
    }
    let got: Vec<_> = r.seen.iter().map(|s| (s.0, s.1, s.2, s.3)).collect();
    let want: Vec<_> = p.expect.iter().map(|s| (s.0, s.1, s.2, s.3)).collect();
    if got != want {
        off.push(format!("events {got:?}, the table says {want:?}"));
    } else {
        for (s, e) in r.seen.iter().zip(p.expect) {
            let (at, want) = (ms(s.4), e.4 as f64);
            if (at - want).abs() > 5.0 {
                off.push(format!(
                    "{} id {} {} at {at:.3} ms, the table says {want} ms",
                    end_name(s.0),
                    s.1,
                    s.2
                ));
            }
        }
    }
    for dir in [Dir::ToServer, Dir::ToClient] {
        for msg in KINDS {
            let got = r.wire.get(&(dir, msg)).copied().unwrap_or(0);
            let want = p
                .wire
                .iter()
                .find(|w| w.0 == dir && w.1 == msg)
                .map_or(0, |w| w.2);
            if got != want {
                off.push(format!(
                    "{} {}: {got} sent, the table says {want}",
                    dir_name(dir),
                    msg.name()
                ));
            }
        }
    }
    if let Some(a) = r.acts.iter().find(|a| a.3 != 0) {
        off.push(format!(
            "{} id {} {:?} failed with errno {}",
            end_name(a.0),
            a.1,
            a.2,
            a.3
        ));
    }
    off
}

/// Runs every pattern on the simulator; the patterns off the table, with why (the host test
/// `tests/faultdiff.rs` checks there is none).
#[allow(dead_code)]
pub(crate) fn simulator_off_the_table() -> Vec<(&'static str, Vec<String>)> {
    PATTERNS
        .iter()
        .map(|p| (p.name, off_the_table(p, &run::run_sim(p, SEED))))
        .filter(|(_, off)| !off.is_empty())
        .collect()
}

/// How far apart a device's time may be from the simulator's: 0.5 s plus 10 %.
fn tolerance(sim: Duration) -> Duration {
    Duration::from_millis(500) + sim / 10
}

/// Where the device's record differs from the simulator's (empty: nowhere).
#[cfg_attr(not(feature = "hw"), allow(dead_code))]
fn differences(sim: &Record, hw: &Record) -> Vec<String> {
    let mut d = Vec::new();
    if let Some(e) = &hw.error {
        d.push(format!("rxe run: {e}"));
    }
    for end in [End::Client, End::Server] {
        let of = |r: &Record| -> Vec<_> { r.seen.iter().filter(|s| s.0 == end).copied().collect() };
        let (s, h) = (of(sim), of(hw));
        let key = |v: &[(End, u8, cm::api::CmEventType, i32, Duration)]| -> Vec<_> {
            v.iter().map(|x| (x.1, x.2, x.3)).collect()
        };
        if key(&s) != key(&h) {
            d.push(format!(
                "{} events: simulator {:?}, rxe {:?}",
                end_name(end),
                key(&s),
                key(&h)
            ));
            continue;
        }
        for (a, b) in s.iter().zip(&h) {
            let gap = b.4.abs_diff(a.4);
            if gap > tolerance(a.4) {
                d.push(format!(
                    "{} id {} {}: rxe at {:.0} ms, simulator at {:.0} ms",
                    end_name(end),
                    a.1,
                    a.2,
                    ms(b.4),
                    ms(a.4)
                ));
            }
        }
    }
    if sim.acts != hw.acts {
        d.push(format!("acts: simulator {:?}, rxe {:?}", sim.acts, hw.acts));
    }
    if sim.wire != hw.wire {
        let all: std::collections::BTreeSet<_> = sim.wire.keys().chain(hw.wire.keys()).collect();
        for key in all {
            let (a, b) = (
                sim.wire.get(key).copied().unwrap_or(0),
                hw.wire.get(key).copied().unwrap_or(0),
            );
            if a != b {
                d.push(format!(
                    "{} {}: simulator {a}, rxe {b}",
                    dir_name(key.0),
                    key.1.name()
                ));
            }
        }
    }
    d
}

/// The departures list: pattern names with their reasons.
#[cfg_attr(not(feature = "hw"), allow(dead_code))]
fn departures() -> Vec<(&'static str, &'static str)> {
    DEPARTURES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (name, reason) = l.split_once('|').unwrap_or((l, ""));
            (name.trim(), reason.trim())
        })
        .collect()
}

fn simulator_only() -> ExitCode {
    let mut off_patterns = 0;
    for p in PATTERNS {
        let r = run::run_sim(p, SEED);
        let off = off_the_table(p, &r);
        let verdict = if off.is_empty() {
            "as the table says"
        } else {
            "OFF THE TABLE"
        };
        println!("{} ({}): {verdict}", p.name, p.about);
        print!("{}", describe(&r));
        for o in &off {
            println!("    off: {o}");
        }
        off_patterns += usize::from(!off.is_empty());
    }
    println!(
        "faultdiff: {} patterns on the simulator, {off_patterns} off the table",
        PATTERNS.len()
    );
    if off_patterns == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

#[cfg(feature = "hw")]
fn with_device(only: &[String]) -> ExitCode {
    let picked: Vec<(usize, &Pattern)> = PATTERNS
        .iter()
        .enumerate()
        .filter(|(_, p)| only.is_empty() || only.iter().any(|n| n == p.name))
        .collect();
    // All at once, each on its own pair: the longest pattern bounds the run. Their clocks
    // start together, once every pattern is set up.
    let ready = std::sync::Arc::new(std::sync::Barrier::new(picked.len()));
    let handles: Vec<_> = picked
        .iter()
        .map(|&(k, p)| {
            let ready = ready.clone();
            (p, std::thread::spawn(move || run::run_hw(p, k, &ready)))
        })
        .collect();
    let listed = departures();
    let (mut same, mut listed_diff, mut unlisted, mut stale) = (0, 0, 0, 0);
    println!("--- faultdiff table");
    for (p, h) in handles {
        let sim = run::run_sim(p, SEED);
        let hw = h.join().unwrap_or_else(|_| Record {
            error: Some("the pattern's thread panicked".into()),
            ..Record::default()
        });
        let diffs = differences(&sim, &hw);
        let off = off_the_table(p, &sim);
        let reason = listed.iter().find(|(n, _)| *n == p.name).map(|(_, r)| *r);
        let verdict = match (diffs.is_empty(), reason) {
            (true, None) => {
                same += 1;
                "same".to_string()
            }
            (true, Some(_)) => {
                stale += 1;
                "same, but listed: a stale entry".to_string()
            }
            (false, Some(r)) => {
                listed_diff += 1;
                format!("differs, listed: {r}")
            }
            (false, None) => {
                unlisted += 1;
                "DIFFERENT".to_string()
            }
        };
        println!("{}: {verdict} ({})", p.name, p.about);
        println!("  simulator:");
        print!("{}", describe(&sim));
        println!("  rxe:");
        print!("{}", describe(&hw));
        for d in &diffs {
            println!("  difference: {d}");
        }
        for o in &off {
            println!("  simulator off the table: {o}");
        }
        // The simulator off its table is a difference no list can excuse.
        unlisted += usize::from(!off.is_empty());
    }
    println!("--- end of table");
    for (n, _) in listed
        .iter()
        .filter(|(n, _)| !PATTERNS.iter().any(|p| p.name == *n))
    {
        println!("stale entry: no pattern {n}");
        stale += 1;
    }
    println!(
        "faultdiff: {} patterns, {same} same, {listed_diff} listed, {unlisted} unlisted differences, {stale} stale entries",
        picked.len()
    );
    if unlisted == 0 && stale == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut hw = false;
    let mut only = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--hw" => hw = true,
            "--only" => match it.next() {
                Some(list) => only.extend(list.split(',').map(str::to_string)),
                None => {
                    eprintln!("faultdiff: --only needs a comma-separated list of patterns");
                    return ExitCode::from(2);
                }
            },
            "--list" => {
                for (k, p) in PATTERNS.iter().enumerate() {
                    println!("{k} {}: {}", p.name, p.about);
                }
                return ExitCode::SUCCESS;
            }
            "-h" | "--help" => {
                println!("usage: faultdiff [--list] [--hw [--only PATTERN,...]]");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("faultdiff: unknown option {other} (--help)");
                return ExitCode::from(2);
            }
        }
    }
    if let Some(n) = only
        .iter()
        .find(|n| !PATTERNS.iter().any(|p| p.name == n.as_str()))
    {
        eprintln!("faultdiff: no pattern {n} (--list)");
        return ExitCode::from(2);
    }
    if !hw {
        return simulator_only();
    }
    #[cfg(feature = "hw")]
    return with_device(&only);
    #[cfg(not(feature = "hw"))]
    {
        eprintln!(
            "faultdiff: --hw needs the hw feature (cargo run --features hw --example faultdiff -- --hw)"
        );
        ExitCode::from(2)
    }
}
