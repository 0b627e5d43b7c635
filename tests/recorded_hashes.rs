//! The trace hashes recorded for fixed seeds, checked. A trace hash covers every event the
//! simulator delivers (instant, host, id, event, status), so these pin its model: a refactor or
//! a speed-up that changes any event, its time or the order of events due at one instant moves
//! one of them. A deliberate model change updates the hashes here together with BENCHMARKS.md,
//! which names the old and the new ones, and the CHANGELOG says why. The model under faults
//! changed once (the IB CM's retries, duplicates, MRA and late REJ made Linux 6.1's): the five
//! fault runs below were recorded again then; the fault-free ones kept their hashes.
//!
//! The runs are the ones the docs quote: `cmtime` (examples/cmtime.rs, on the raw trait) and the
//! `echo` application (examples/echo.rs, on the async layer), each included here as its
//! example builds it.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/cmtime.rs"]
mod cmtime;

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/echo.rs"]
mod echo;

use std::time::Duration;

/// `cmtime --connections N --seed S`'s trace hash.
fn cmtime_hash(connections: usize, seed: u64) -> u64 {
    let args = [
        "cmtime".to_string(),
        format!("--connections={connections}"),
        format!("--seed={seed}"),
    ];
    let o = match cmtime::cli::parse(args.iter().map(String::as_str), false) {
        Ok(cmtime::cli::Parsed::Run(o)) => o,
        other => panic!("{args:?}: {other:?}"),
    };
    let (_, hash) = cmtime::sim_run(&o).unwrap_or_else(|e| panic!("{args:?}: {e}"));
    hash
}

/// `echo --seed S [--clients C --messages M --loss L --crash-server T]`'s trace hash.
fn echo_hash(seed: u64, clients: u32, messages: u32, loss: u16, crash_server: Option<u64>) -> u64 {
    let args = echo::Args {
        clients,
        messages,
        seed: Some(seed),
        loss,
        crash_server: crash_server.map(Duration::from_secs),
        trace: None,
        backend: "sim".into(),
        server: None,
        handoff: false,
    };
    let fabric = echo::fabric(&args);
    echo::run_sim(&fabric, &args).unwrap_or_else(|f| panic!("{args:?}: {f}"));
    fabric.trace_hash()
}

#[test]
fn cmtime_runs_keep_their_recorded_trace_hashes() {
    for (connections, seed, recorded) in [
        (1_000, 7, 0x719f9ca330b3e309_u64),
        (1_000, 8, 0xbef195684ac7e802),
        (100_000, 7, 0x5e43b58628adb73e),
        (100_000, 8, 0x30b6d9c765d3fc11),
    ] {
        let hash = cmtime_hash(connections, seed);
        assert_eq!(
            hash, recorded,
            "cmtime --connections {connections} --seed {seed}: trace hash {hash:016x}, recorded {recorded:016x}"
        );
    }
}

#[test]
fn echo_runs_keep_their_recorded_trace_hashes() {
    // (seed, clients, messages, loss per mille, server crash at s): echo's defaults are 10
    // clients, 10 messages, no loss, no crash.
    let runs: [(u64, u32, u32, u16, Option<u64>, u64); 9] = [
        (1, 10, 10, 200, Some(2), 0x7a4fc9a766b43986),
        (2, 10, 10, 200, Some(2), 0x670ea813c693a65c),
        (3, 10, 10, 200, Some(2), 0xc1cb34ee8cad73d0),
        (4, 10, 10, 0, None, 0x8dfc1d731d87fd5a),
        (5, 10, 10, 0, None, 0xe63a5ef76542ae90),
        (6, 10, 10, 0, None, 0xdcea75d953a9e6db),
        (7, 10, 10, 0, None, 0x6363a730ea9b52b3),
        (8, 20, 5, 100, None, 0x52d7bc5d9ee0e50c),
        (9, 20, 5, 100, None, 0x976dab8d977db3ca),
    ];
    for (seed, clients, messages, loss, crash, recorded) in runs {
        let hash = echo_hash(seed, clients, messages, loss, crash);
        assert_eq!(
            hash, recorded,
            "echo --seed {seed} --clients {clients} --messages {messages} --loss {loss} \
             --crash-server {crash:?}: trace hash {hash:016x}, recorded {recorded:016x}"
        );
    }
}
