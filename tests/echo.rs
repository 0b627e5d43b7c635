//! The echo application (`examples/echo.rs`) on the simulator under generated fault schedules:
//! every client completes or gets a typed error, no echo is lost silently, duplicated or
//! corrupted (the client checks each one and that nothing unasked-for is left at disconnect),
//! nothing is alive after teardown, no task outlives the virtual deadline, and the same seed
//! gives the same trace.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/echo.rs"]
mod echo;

use std::time::Duration;

use cm::app::Error;
use cm::sim::{Fault, FaultSchedule, SimFabric};
use proptest::prelude::*;

const CLIENTS: u32 = 3;
const MESSAGES: u32 = 4;

fn args(seed: u64) -> echo::Args {
    echo::Args {
        clients: CLIENTS,
        messages: MESSAGES,
        seed: Some(seed),
        loss: 0,
        crash_server: None,
        trace: None,
        backend: "sim".into(),
    }
}

#[test]
fn without_faults_every_client_gets_every_echo() {
    let a = args(1);
    let fabric = echo::fabric(&a);
    let results = echo::run_sim(&fabric, &a).unwrap_or_else(|f| panic!("{f}"));
    for r in &results {
        assert_eq!(r.as_ref().map(|r| r.echoed), Ok(MESSAGES), "{r:?}");
    }
    assert!(fabric.live_resources().is_clean(), "{:?}", fabric.live_resources());
}

#[test]
fn loss_and_a_server_crash_are_survived_by_retrying() {
    let a = echo::Args {
        clients: 10,
        loss: 200,
        crash_server: Some(Duration::from_secs(2)),
        ..args(5)
    };
    let fabric = echo::fabric(&a);
    let results = echo::run_sim(&fabric, &a).unwrap_or_else(|f| panic!("{f}"));
    assert!(results.iter().all(|r| r.as_ref().is_ok_and(|r| r.echoed == a.messages)), "{results:?}");
    assert!(results.iter().any(|r| r.as_ref().is_ok_and(|r| r.attempts > 1)), "nobody had to retry: {results:?}");
    assert!(fabric.live_resources().is_clean());
}

/// One fault of a generated schedule; hosts: 0 the server, 1..=CLIENTS the clients.
fn fault() -> impl Strategy<Value = (Duration, Fault)> {
    let client = 1..=CLIENTS as u16;
    let at = (0u64..400).prop_map(Duration::from_micros);
    prop_oneof![
        (client.clone(), 50u16..600).prop_map(|(b, p)| (Duration::ZERO, Fault::Loss { a: 0, b, per_mille: p })),
        (at.clone(), client.clone()).prop_map(|(t, b)| (t, Fault::Partition { a: 0, b })),
        (at.clone(), client.clone()).prop_map(|(t, b)| (t, Fault::Heal { a: 0, b })),
        at.clone().prop_map(|t| (t, Fault::Crash { host: 0 })),
        at.clone().prop_map(|t| (t, Fault::Restart { host: 0 })),
        (client.clone(), 1u64..50).prop_map(|(b, ms)| (
            Duration::ZERO,
            Fault::Delay { a: 0, b, min: Duration::ZERO, max: Duration::from_millis(ms) }
        )),
        (at.clone(), client.clone()).prop_map(|(t, host)| (t, Fault::FailAddrResolution { host, status: -113, count: 1 })),
        (at.clone(), client.clone()).prop_map(|(t, host)| (t, Fault::FailRouteResolution { host, status: -110, count: 1 })),
        (at.clone(), client.clone()).prop_map(|(t, host)| (t, Fault::AddrChange { host })),
        (at.clone(), client.clone()).prop_map(|(t, host)| (t, Fault::RemoveDevice { host })),
        (at, 0u32..2).prop_map(|(t, backlog)| (t, Fault::Backlog { host: 0, backlog })),
    ]
}

/// Runs echo under `faults`; the trace hash, after checking every property.
fn check(seed: u64, faults: &[(Duration, Fault)]) -> u64 {
    let mut schedule = FaultSchedule::new();
    for (t, f) in faults {
        schedule = schedule.with(*t, f.clone());
    }
    let mut b = SimFabric::builder().seed(seed).host("10.0.0.1");
    for c in 0..CLIENTS {
        b = b.host(&format!("10.0.0.{}", c + 2));
    }
    let fabric = b.faults(schedule).build();
    let a = args(seed);
    // A panic in a task (a corrupted or duplicated echo) or a passed deadline fails the run.
    let results = echo::run_sim(&fabric, &a).unwrap_or_else(|f| panic!("{f}"));
    for (c, r) in results.iter().enumerate() {
        match r {
            Ok(rep) => assert_eq!(rep.echoed, MESSAGES, "client {c}"),
            Err(Error::Cm(e)) => assert!(!e.is_guarded_misuse(), "client {c} misused the API: {e}"),
            Err(_) => {}
        }
    }
    assert!(
        fabric.live_resources().is_clean(),
        "left alive: {:?}; {}",
        fabric.live_resources(),
        fabric.repro_line()
    );
    fabric.trace_hash()
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn echo_under_generated_faults_completes_or_fails_typed_and_leaves_nothing(
        seed in any::<u64>(),
        faults in prop::collection::vec(fault(), 0..5),
    ) {
        let first = check(seed, &faults);
        let again = check(seed, &faults);
        prop_assert_eq!(first, again, "same seed, different trace");
    }
}
