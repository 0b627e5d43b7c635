//! Hosts with output types of their own (`Sim::server_with`, `Sim::client_with`): their
//! outcomes read from their handles after the run, and what a server that runs until the run
//! ends reported.

use std::net::SocketAddr;
use std::time::Duration;

use cm_async::sim::{FailureKind, HostOutcome, HostResult, Sim};
use cm_async::{ConnOptions, Runtime};
use cm_sim::{Fault, FaultSchedule, SimFabric};

fn server_addr() -> SocketAddr {
    "10.0.0.1:7471".parse().unwrap()
}

fn fabric(seed: u64, faults: FaultSchedule) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .host("10.0.0.3")
        .faults(faults)
        .build()
}

/// An echo server counting the connections it served, reporting the count after each.
fn counting_echo_server<T: 'static>(sim: &mut Sim<T>) -> HostResult<usize> {
    sim.server_with(0, |ctx| async move {
        let Ok(cm) = ctx.cm() else { return 0 };
        let Ok(listener) = cm.listen(server_addr(), ConnOptions::default()) else {
            return 0;
        };
        let mut served = 0;
        ctx.report(served);
        loop {
            let Ok((conn, _)) = listener.accept().await else {
                return served;
            };
            if let Ok(m) = conn.recv().await {
                let _ = conn.send(&m).await;
            }
            let _ = conn.disconnect().await;
            served += 1;
            ctx.report(served);
        }
    })
}

/// Connects `n` times after `after`, sending `msg` and collecting the echoes.
async fn echo_client<U>(
    ctx: cm_async::sim::HostCtx<U>,
    after: Duration,
    n: usize,
    msg: &[u8],
) -> cm_async::Result<Vec<u8>> {
    let cm = ctx.cm()?;
    cm.runtime().sleep(after).await;
    let mut all = Vec::new();
    for _ in 0..n {
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        conn.send(msg).await?;
        all.extend(conn.recv().await?);
        conn.disconnect().await?;
    }
    Ok(all)
}

#[test]
fn a_counting_server_and_a_byte_client_each_have_their_own_type_in_one_run() {
    let f = fabric(21, FaultSchedule::new());
    // The run's own type is the plain client's: neither typed host needs a value of it.
    let mut sim: Sim<u8> = Sim::new(f.clone());
    let served = counting_echo_server(&mut sim);
    let bytes = sim.client_with(1, |ctx| async move {
        echo_client(ctx, Duration::from_millis(1), 3, b"ab")
            .await
            .expect("the echoes come back")
    });
    sim.client(2, |ctx| async move {
        echo_client(ctx, Duration::from_millis(2), 1, b"c")
            .await
            .map_or(0, |v| v.len() as u8)
    });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        outcomes,
        vec![HostOutcome::Typed, HostOutcome::Typed, HostOutcome::Finished(1)]
    );
    assert_eq!(
        bytes.into_outcome(),
        Some(HostOutcome::Finished(b"ababab".to_vec()))
    );
    assert_eq!(served.reported(), Some(4), "three connections and one");
    assert_eq!(served.into_outcome(), Some(HostOutcome::Running));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_typed_server_whose_closure_returns_is_finished_with_its_value() {
    let mut sim: Sim<()> = Sim::new(fabric(22, FaultSchedule::new()));
    let server = sim.server_with(0, |ctx| async move {
        ctx.runtime().sleep(Duration::from_millis(1)).await;
        ctx.report("not yet");
        "returned"
    });
    sim.client(1, |ctx| async move {
        ctx.runtime().sleep(Duration::from_millis(5)).await;
    });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcomes[0], HostOutcome::Typed);
    assert_eq!(outcomes[1], HostOutcome::Finished(()));
    assert_eq!(server.outcome(), Some(HostOutcome::Finished("returned")));
    assert_eq!(
        server.reported(),
        Some("not yet"),
        "a report is kept apart from the value"
    );
}

#[test]
fn a_typed_server_down_when_the_run_ends_is_crashed_and_keeps_its_last_report() {
    let faults = FaultSchedule::new().with(Duration::from_secs(1), Fault::Crash { host: 0 });
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(fabric(23, faults));
    let served = counting_echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        let echoes = echo_client(ctx, Duration::from_millis(1), 2, b"x").await?;
        // Past the crash, and it has nothing more to ask of the server.
        rt.sleep(Duration::from_secs(2)).await;
        Ok(echoes)
    });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcomes[0], HostOutcome::Typed);
    assert_eq!(outcomes[1], HostOutcome::Finished(Ok(b"xx".to_vec())));
    assert_eq!(served.take_reported(), Some(2));
    assert_eq!(served.take_reported(), None, "taken");
    assert_eq!(served.into_outcome(), Some(HostOutcome::Crashed));
}

#[test]
fn a_restarted_typed_server_runs_again_and_reports_from_its_new_incarnation() {
    let faults = FaultSchedule::new()
        .with(Duration::from_secs(1), Fault::Crash { host: 0 })
        .with(Duration::from_secs(2), Fault::Restart { host: 0 });
    let f = fabric(24, faults);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    let served = counting_echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        let cm = ctx.cm()?;
        rt.sleep(Duration::from_millis(1)).await;
        let mut all = Vec::new();
        for (at, msg) in [(Duration::ZERO, b"before"), (Duration::from_secs(3), b"after!")] {
            rt.sleep(at).await;
            let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
            conn.send(msg).await?;
            all.extend(conn.recv().await?);
            conn.disconnect().await?;
        }
        Ok(all)
    });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(outcomes[1], HostOutcome::Finished(Ok(b"beforeafter!".to_vec())));
    // The new incarnation counted from 0 again: one connection since the restart.
    assert_eq!(served.reported(), Some(1));
    assert_eq!(served.into_outcome(), Some(HostOutcome::Running));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_typed_definition_replaced_for_the_same_host_is_idle_and_never_runs() {
    let mut sim: Sim<u32> = Sim::new(fabric(25, FaultSchedule::new()));
    let replaced: HostResult<()> = sim.client_with(0, |_ctx| async { panic!("a replaced definition ran") });
    assert!(replaced.outcome().is_none());
    sim.client(0, |_ctx| async { 5 });
    assert!(
        matches!(replaced.outcome(), Some(HostOutcome::Idle)),
        "idle as soon as it is replaced"
    );
    // Host 2 has no definition: idle, as before.
    let third = sim.client_with(2, |_ctx| async { 'z' });
    let plain_over_typed = sim.client_with(1, |_ctx| async { 1.5f64 });
    sim.client(1, |_ctx| async { 6 });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        outcomes,
        vec![
            HostOutcome::Finished(5),
            HostOutcome::Finished(6),
            HostOutcome::Typed
        ]
    );
    assert!(matches!(replaced.into_outcome(), Some(HostOutcome::Idle)));
    assert!(matches!(plain_over_typed.into_outcome(), Some(HostOutcome::Idle)));
    assert_eq!(third.into_outcome(), Some(HostOutcome::Finished('z')));
}

#[test]
fn an_undefined_host_among_typed_ones_is_idle_in_the_runs_outcomes() {
    let mut sim: Sim<()> = Sim::new(fabric(26, FaultSchedule::new()));
    let last = sim.client_with(2, |_ctx| async { 3u8 });
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        outcomes,
        vec![HostOutcome::Idle, HostOutcome::Idle, HostOutcome::Typed]
    );
    assert_eq!(last.into_outcome(), Some(HostOutcome::Finished(3)));
}

#[test]
fn a_failed_run_leaves_typed_hosts_without_an_outcome_but_with_their_reports() {
    let mut sim: Sim<()> = Sim::new(fabric(27, FaultSchedule::new())).deadline(Duration::from_secs(1));
    let server = sim.server_with(0, |ctx| async move {
        for tick in 1u64.. {
            ctx.runtime().sleep(Duration::from_millis(100)).await;
            ctx.report(tick);
        }
        unreachable!()
    });
    let client = sim.client_with(1, |ctx| async move {
        ctx.report("started");
        ctx.runtime().sleep(Duration::from_secs(10)).await;
        "never"
    });
    let failure = sim.run().expect_err("the deadline passes first");
    assert!(matches!(failure.kind, FailureKind::Deadline { .. }), "{failure}");
    assert_eq!(server.reported(), Some(10), "ten ticks in the second");
    assert_eq!(client.reported(), Some("started"));
    assert_eq!(server.into_outcome(), None);
    assert_eq!(client.into_outcome(), None);
}

#[test]
fn a_typed_host_before_its_run_has_no_outcome() {
    let mut sim: Sim<()> = Sim::new(fabric(28, FaultSchedule::new()));
    let client = sim.client_with(1, |_ctx| async { 1u8 });
    assert_eq!(client.outcome(), None);
    assert_eq!(client.reported(), None);
    sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(client.outcome(), Some(HostOutcome::Finished(1)));
}

#[test]
fn a_panicking_typed_client_fails_the_run_as_a_plain_one_does() {
    let mut sim: Sim<()> = Sim::new(fabric(29, FaultSchedule::new()));
    let client = sim.client_with(1, |ctx| async move {
        ctx.runtime().sleep(Duration::from_millis(1)).await;
        if ctx.addr().is_ipv4() {
            panic!("typed client gave up");
        }
        0u8
    });
    let failure = sim.run().expect_err("the panic fails the run");
    match &failure.kind {
        FailureKind::Panic { task, message } => {
            assert_eq!(task, "10.0.0.2#main");
            assert_eq!(message, "typed client gave up");
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(client.into_outcome(), None);
}

/// The echo run of `a_counting_server_...`, its hosts plain or typed: the trace hash.
fn echo_trace(typed: bool) -> (u64, Vec<u8>) {
    let f = fabric(30, FaultSchedule::new());
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    if typed {
        drop(counting_echo_server(&mut sim));
    } else {
        sim.server(0, |ctx| async move {
            let cm = ctx.cm()?;
            let listener = cm.listen(server_addr(), ConnOptions::default())?;
            loop {
                let Ok((conn, _)) = listener.accept().await else {
                    return Ok(Vec::new());
                };
                if let Ok(m) = conn.recv().await {
                    let _ = conn.send(&m).await;
                }
                let _ = conn.disconnect().await;
            }
        });
    }
    for (host, msg) in [(1, b"one"), (2, b"two")] {
        sim.client(host, move |ctx| async move {
            echo_client(ctx, Duration::from_millis(1), 3, msg).await
        });
    }
    let outcomes = sim.run().unwrap_or_else(|e| panic!("{e}"));
    let mut bytes = Vec::new();
    for o in outcomes.into_iter().skip(1) {
        match o {
            HostOutcome::Finished(Ok(v)) => bytes.extend(v),
            other => panic!("{other:?}"),
        }
    }
    (f.trace_hash(), bytes)
}

#[test]
fn a_typed_host_runs_in_the_same_seeded_order_as_a_plain_one() {
    let plain = echo_trace(false);
    let typed = echo_trace(true);
    assert_eq!(plain.1, b"oneoneonetwotwotwo");
    assert_eq!(plain, typed, "the same events at the same instants");
}
