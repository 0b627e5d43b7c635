//! `cm-fuzz`: runs seeded random call sequences against the simulator and checks them.
//!
//! Quick mode (no options) runs 20 000 sequences; see `--help` for long campaigns, shards and
//! replays.

use std::process::ExitCode;
use std::time::Duration;

use cm_fuzz::{
    describe, json_summary, replay_command, run_campaign, run_checked, run_once, Campaign, KnownSet,
    RunOptions, Scenario,
};

const USAGE: &str = "\
usage: cm-fuzz [options]
  (no options)            quick mode: seeds 0..20000, every check, every input family
  --seqs N                how many seeds the campaign covers (over all shards)
  --seed-start S          first seed (decimal or 0x hex)
  --shard K/N             run only seeds S+K, S+K+N, S+K+2N, ... (K from 0 to N-1)
  --json                  print one JSON line with the summary instead of text
  --allow-known LIST      leave out input families that reach a known defect:
                          all, or a comma list of config, duration-max, clock-overflow,
                          device-removal, wrong-host-ack, forged-ack, host-addr
  --wall-limit SECS       wall-clock seconds one sequence may take before it counts as a hang
                          (the watchdog prints the seed and exits with status 3); default 60
  --minimise N            distinct failures to minimise (default 16)
  --progress              progress lines on stderr
  --replay SEED           run one seed, printing every call and its answer
    --keep LIST           with --replay: only these call indices (a minimised failure's list)
    --drop-faults LIST    with --replay: leave out builder faults FABRIC:INDEX,...
exit status: 0 clean, 1 a check failed, 2 bad usage, 3 a sequence hung";

fn parse_u64(flag: &str, v: Option<String>) -> Result<u64, String> {
    let v = v.ok_or_else(|| format!("{flag} needs a value"))?;
    cm_sim::parse_seed(&v).ok_or_else(|| format!("{flag}: not a number: {v:?}"))
}

fn parse_list(v: &str) -> Result<Vec<usize>, String> {
    v.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| p.trim().parse().map_err(|_| format!("not a call index: {p:?}")))
        .collect()
}

fn parse_drops(v: &str) -> Result<Vec<(u8, usize)>, String> {
    v.split(',')
        .filter(|p| !p.trim().is_empty())
        .map(|p| {
            let (f, i) = p
                .split_once(':')
                .ok_or_else(|| format!("not FABRIC:INDEX: {p:?}"))?;
            Ok((
                f.trim().parse().map_err(|_| format!("bad fabric in {p:?}"))?,
                i.trim().parse().map_err(|_| format!("bad index in {p:?}"))?,
            ))
        })
        .collect()
}

struct Args {
    campaign: Campaign,
    json: bool,
    replay: Option<u64>,
    keep: Option<Vec<usize>>,
    drop_faults: Vec<(u8, usize)>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        campaign: Campaign::default(),
        json: false,
        replay: None,
        keep: None,
        drop_faults: Vec::new(),
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match flag.as_str() {
            "--seqs" => a.campaign.seqs = parse_u64(&flag, it.next())?,
            "--seed-start" => a.campaign.seed_start = parse_u64(&flag, it.next())?,
            "--shard" => {
                let v = it.next().ok_or("--shard needs K/N")?;
                let (k, n) = v
                    .split_once('/')
                    .ok_or_else(|| format!("--shard: not K/N: {v:?}"))?;
                let (k, n): (u64, u64) = (
                    k.parse().map_err(|_| format!("--shard: bad K in {v:?}"))?,
                    n.parse().map_err(|_| format!("--shard: bad N in {v:?}"))?,
                );
                if n == 0 || k >= n {
                    return Err(format!("--shard {v}: need 0 <= K < N"));
                }
                a.campaign.shard = (k, n);
            }
            "--json" => a.json = true,
            "--allow-known" => {
                a.campaign.skip = KnownSet::parse(&it.next().ok_or("--allow-known needs a list")?)?
            }
            "--wall-limit" => {
                a.campaign.wall_limit = Duration::from_secs(parse_u64(&flag, it.next())?.max(1))
            }
            "--minimise" => a.campaign.minimise = parse_u64(&flag, it.next())? as usize,
            "--progress" => a.campaign.progress = true,
            "--replay" => a.replay = Some(parse_u64(&flag, it.next())?),
            "--keep" => a.keep = Some(parse_list(&it.next().ok_or("--keep needs a list")?)?),
            "--drop-faults" => a.drop_faults = parse_drops(&it.next().ok_or("--drop-faults needs a list")?)?,
            "-h" | "--help" => {
                println!("{USAGE}");
                std::process::exit(0);
            }
            other => return Err(format!("unknown option {other}")),
        }
    }
    Ok(a)
}

fn replay(seed: u64, a: &Args) -> ExitCode {
    let skip = a.campaign.skip;
    let scenario = Scenario::generate(seed, skip);
    let mut keep = a.keep.clone();
    if let Some(k) = keep.as_mut() {
        k.sort_unstable();
        k.dedup();
    }
    println!("seed {seed}: {} calls", scenario.ops.len());
    for (f, spec) in scenario.fabrics.iter().enumerate() {
        println!("fabric {f}: seed {} hosts {:?}", spec.seed, spec.hosts);
        println!("  config {:?}", spec.config);
        println!("  builder faults: {}", spec.faults);
    }
    let r = run_once(
        &scenario,
        &RunOptions {
            keep: keep.as_deref(),
            drop_faults: &a.drop_faults,
            log: true,
            ..RunOptions::default()
        },
    );
    for line in &r.log {
        println!("{line}");
    }
    // The full determinism check only applies to the whole scenario.
    let failure = if keep.is_none() && a.drop_faults.is_empty() && r.failure.is_none() {
        run_checked(&scenario).failure
    } else {
        r.failure
    };
    match failure {
        Some(f) => {
            println!("FAILED: {f}");
            if let Some(k) = cm_fuzz::likely_known(&f) {
                println!("likely known defect: {k}");
            }
            ExitCode::from(1)
        }
        None => {
            println!("passed every check ({})", replay_command(seed, skip, None));
            ExitCode::SUCCESS
        }
    }
}

fn main() -> ExitCode {
    let a = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("cm-fuzz: {e}\n{USAGE}");
            return ExitCode::from(2);
        }
    };
    if let Some(seed) = a.replay {
        return cm_fuzz::watched(seed, a.campaign.wall_limit, a.campaign.skip, || replay(seed, &a));
    }
    let c = &a.campaign;
    let report = run_campaign(c);
    if a.json {
        println!("{}", json_summary(c, &report));
    } else {
        for found in &report.found {
            println!("{}", describe(found, c.skip));
        }
        print!("{}", report.stats);
        let known = if c.skip.is_empty() {
            String::new()
        } else {
            format!(" (leaving out known-defect families: {})", c.skip)
        };
        println!(
            "cm-fuzz: seeds {}..{} shard {}/{}{known}: {} sequences, {} calls in {:.1?}: {}",
            c.seed_start,
            c.seed_start.wrapping_add(c.seqs),
            c.shard.0,
            c.shard.1,
            report.stats.sequences,
            report.stats.calls,
            report.elapsed,
            if report.is_clean() {
                "clean".to_string()
            } else {
                format!(
                    "{} sequences FAILED, {} distinct failures",
                    report.failed,
                    report.found.len()
                )
            }
        );
    }
    if report.is_clean() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
