//! The fuzzer under `cargo test`: a few hundred sequences, and proof that its checks find,
//! minimise and replay a planted bug.

use cm_core::{WcOpcode, WcStatus};
use cm_fuzz::{
    check_seed, describe, minimise, replay_command, run_campaign, run_once, Campaign, Check, Found, KnownSet,
    Op, RunOptions, Scenario,
};

/// Every input family the fuzzer has, minus the ones reaching known defects (`cm_fuzz::Known`)
/// that the simulator does not fix yet: a failure here is a new defect (or a fixed one come
/// back).
fn without_known() -> KnownSet {
    KnownSet::parse("all").unwrap()
}

#[test]
fn a_few_hundred_sequences_pass_every_check_outside_the_known_defects() {
    let campaign = Campaign {
        seqs: 300,
        skip: without_known(),
        ..Campaign::default()
    };
    let report = run_campaign(&campaign);
    let text: Vec<String> = report.found.iter().map(|f| describe(f, campaign.skip)).collect();
    assert!(report.is_clean(), "{}", text.join("\n"));
    assert_eq!(report.stats.sequences, 300);
    assert!(report.stats.calls >= 300 * 20, "{}", report.stats);
    // The sequences get past the resolution steps: connections are made and torn down.
    let count = |name: &str| {
        report
            .stats
            .event_counts()
            .find(|(t, _)| t.name() == name)
            .unwrap()
            .1
    };
    for name in [
        "RDMA_CM_EVENT_CONNECT_REQUEST",
        "RDMA_CM_EVENT_ESTABLISHED",
        "RDMA_CM_EVENT_REJECTED",
        // External QPs: connected without a backend QP.
        "RDMA_CM_EVENT_CONNECT_RESPONSE",
    ] {
        assert!(count(name) > 0, "no {name} in 300 sequences:\n{}", report.stats);
    }
}

#[test]
fn a_seed_expands_to_the_same_scenario_and_the_same_run() {
    for seed in [1, 77, 4096] {
        assert_eq!(
            Scenario::generate(seed, KnownSet::NONE),
            Scenario::generate(seed, KnownSet::NONE)
        );
        let (a, b) = (
            check_seed(seed, without_known()),
            check_seed(seed, without_known()),
        );
        assert_eq!(a.digest, b.digest, "seed {seed}");
        assert_eq!(a.stats, b.stats, "seed {seed}");
    }
    assert_ne!(
        Scenario::generate(1, KnownSet::NONE).ops,
        Scenario::generate(2, KnownSet::NONE).ops
    );
}

#[test]
fn sequences_have_twenty_to_two_hundred_calls_covering_every_trait_call() {
    let mut names = std::collections::BTreeSet::new();
    for seed in 0..200 {
        let s = Scenario::generate(seed, KnownSet::NONE);
        assert!(
            (20..=200).contains(&s.ops.len()),
            "seed {seed}: {} calls",
            s.ops.len()
        );
        for op in &s.ops {
            let text = op.to_string();
            let call = text.split_whitespace().find(|w| w.contains('(')).unwrap_or(&text);
            names.insert(call.split('(').next().unwrap().to_string());
        }
    }
    for call in [
        "create_event_channel",
        "destroy_event_channel",
        "create_id",
        "destroy_id",
        "bind_addr",
        "resolve_addr",
        "resolve_route",
        "create_qp",
        "destroy_qp",
        "listen",
        "connect",
        "accept",
        "reject",
        "disconnect",
        "get_cm_event",
        "try_get_cm_event",
        "ack_cm_event",
        "get_local_addr",
        "get_peer_addr",
        "post_send",
        "post_recv",
        "poll_cq",
        "try_poll_cq",
        "id_machine",
        "live_resources",
        "inject",
        "advance",
        "run_until_idle",
        "reg_mr",
        "mr_info",
        "dereg_mr",
        "read_mr",
        "write_mr",
        "post_send_wr",
        "create_srq",
        "destroy_srq",
        "post_srq_recv",
        "arm_srq_limit",
        "create_qp_on_srq",
        "get_async_event",
    ] {
        assert!(names.contains(call), "no {call} in 200 scenarios: {names:?}");
    }
}

#[test]
fn leaving_a_family_out_removes_its_inputs() {
    let skip = KnownSet::parse("device-removal,wrong-host-ack").unwrap();
    for seed in 0..300 {
        let s = Scenario::generate(seed, skip);
        for op in &s.ops {
            assert!(
                !matches!(op, Op::AckHeld { on: Some(_), .. }),
                "seed {seed}: {op}"
            );
            assert!(!op.to_string().contains("remove device"), "seed {seed}: {op}");
        }
        for f in &s.fabrics {
            assert!(!f.faults.to_string().contains("remove device"), "seed {seed}");
        }
    }
    assert!(KnownSet::parse("no-such-family").is_err());
}

#[test]
fn a_planted_forgotten_ack_is_found_minimised_and_replayed() {
    let planted = RunOptions {
        forget_held_events: true,
        ..RunOptions::default()
    };
    // The first seed whose sequence ends holding an event: teardown then leaves it unacked.
    let (scenario, failure) = (0..500)
        .find_map(|seed| {
            let s = Scenario::generate(seed, without_known());
            let failure = run_once(&s, &planted).failure?;
            Some((s, failure))
        })
        .expect("some seed of 500 holds an event at the end");
    assert_eq!(failure.check, Check::Teardown, "{failure}");
    assert!(failure.signature.contains("unacked"), "{failure}");
    assert!(
        run_once(&scenario, &RunOptions::default()).failure.is_none(),
        "without the planted bug seed {} passes",
        scenario.seed
    );

    let m = minimise(&scenario, &failure, 2000, &planted);
    // What is left is an application that retrieves an event and keeps it: a channel, an id,
    // something that makes an event, the retrieval; nothing else is needed.
    assert!(m.keep.len() <= 6, "minimised to {:?}", m.keep);
    assert!(m.keep.len() < scenario.ops.len());
    let again = run_once(
        &scenario,
        &RunOptions {
            keep: Some(&m.keep),
            drop_faults: &m.drop_faults,
            ..planted
        },
    );
    assert_eq!(
        again.failure.map(|f| f.signature),
        Some(failure.signature.clone())
    );
    assert!(m.keep.iter().any(|&i| matches!(
        scenario.ops[i],
        Op::GetCmEvent { ack: false, .. } | Op::TryGetCmEvent { ack: false, .. }
    )));

    let cmd = replay_command(scenario.seed, without_known(), Some(&m));
    assert!(cmd.contains(&format!("--replay {}", scenario.seed)), "{cmd}");
    assert!(cmd.contains("--keep"), "{cmd}");
    let text = describe(
        &Found {
            seed: scenario.seed,
            failure,
            count: 1,
            minimised: Some(m),
        },
        without_known(),
    );
    assert!(text.contains("minimised") && text.contains("replay:"), "{text}");
}

#[test]
fn a_planted_region_leak_is_found_and_minimised_to_a_registration() {
    let planted = RunOptions {
        keep_regions: true,
        ..RunOptions::default()
    };
    let (scenario, failure) = (0..500)
        .find_map(|seed| {
            let s = Scenario::generate(seed, without_known());
            let failure = run_once(&s, &planted).failure?;
            Some((s, failure))
        })
        .expect("some seed of 500 registers a region or makes an SRQ");
    assert_eq!(failure.check, Check::Teardown, "{failure}");
    assert!(
        failure.signature.contains("mrs") || failure.signature.contains("srqs"),
        "{failure}"
    );
    assert!(run_once(&scenario, &RunOptions::default()).failure.is_none());
    let m = minimise(&scenario, &failure, 2000, &planted);
    // A channel, an id on a device (bound or resolved), the registration.
    assert!(m.keep.len() <= 6, "minimised to {:?}", m.keep);
    assert!(
        m.keep
            .iter()
            .any(|&i| matches!(scenario.ops[i], Op::RegMr { .. } | Op::CreateSrq { .. })),
        "{:?}",
        m.keep
    );
}

#[test]
fn one_sided_work_reaches_the_responder_and_completes_every_way() {
    let report = run_campaign(&Campaign {
        seqs: 600,
        skip: without_known(),
        ..Campaign::default()
    });
    assert!(report.is_clean());
    let succeeded = |op: WcOpcode| {
        report
            .stats
            .opcode_counts()
            .find(|&(o, _, _)| o == op)
            .map_or(0, |(_, _, ok)| ok)
    };
    for op in [
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::RecvRdmaWithImm,
    ] {
        assert!(
            succeeded(op) > 0,
            "no {op} succeeded in 600 sequences:\n{}",
            report.stats
        );
    }
    let status = |s: WcStatus| report.stats.completions[s.raw() as usize];
    // The responder refused keys, and the requester flushed what followed.
    assert!(status(WcStatus::RemAccessErr) > 0, "{}", report.stats);
    assert!(status(WcStatus::WrFlushErr) > 0, "{}", report.stats);
    let error = |kind: &str| {
        report
            .stats
            .error_counts()
            .find(|&(k, _)| k == kind)
            .map_or(0, |(_, n)| n)
    };
    assert!(error("SrqBusy") > 0, "{}", report.stats);
}

#[test]
fn shards_split_the_seed_range_and_summarise_as_json_lines() {
    let mut total = 0;
    for k in 0..3 {
        let c = Campaign {
            seed_start: 1000,
            seqs: 31,
            shard: (k, 3),
            skip: without_known(),
            ..Campaign::default()
        };
        let r = run_campaign(&c);
        total += r.stats.sequences;
        let line = cm_fuzz::json_summary(&c, &r);
        assert!(
            line.starts_with('{') && line.ends_with('}') && !line.contains('\n'),
            "{line}"
        );
        assert!(line.contains(&format!("\"shard\":\"{k}/3\"")), "{line}");
        assert!(line.contains("\"clean\":true"), "{line}");
        assert!(line.contains("\"RDMA_CM_EVENT_ADDR_RESOLVED\":"), "{line}");
    }
    assert_eq!(total, 31);
}

#[test]
fn the_watchdog_names_the_seed_and_ends_a_run_that_hangs() {
    const CHILD: &str = "CM_FUZZ_WATCHDOG_CHILD";
    let wait = std::time::Duration::from_secs(30);
    if std::env::var_os(CHILD).is_some() {
        // Stands in for a simulator that never returns; the watchdog must end the process.
        cm_fuzz::watched(42, std::time::Duration::from_secs(1), KnownSet::NONE, || {
            std::thread::sleep(wait)
        });
        panic!("the watchdog let a {wait:?} run finish");
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "the_watchdog_names_the_seed_and_ends_a_run_that_hangs",
            "--nocapture",
            "--test-threads=1",
        ])
        .env(CHILD, "1")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(3), "{err}");
    assert!(err.contains("HANG: seed 42"), "{err}");
    assert!(err.contains("--replay 42"), "{err}");
}
