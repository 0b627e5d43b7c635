//! The layer on the simulator: typed errors, cancellation, teardown on drop, flush reports,
//! and the executor's crash, deadlock, deadline and panic handling.

use std::cell::Cell;
use std::net::SocketAddr;
use std::rc::Rc;
use std::time::Duration;

use cm_async::sim::{FailureKind, HostOutcome, Sim};
use cm_async::{ConnOptions, Error, Runtime};
use cm_core::errno::ETIMEDOUT;
use cm_sim::{Fault, FaultSchedule, SimFabric};

const SERVER: &str = "10.0.0.1:7471";

fn server_addr() -> SocketAddr {
    SERVER.parse().unwrap()
}

fn fabric(seed: u64) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build()
}

fn fabric_with(seed: u64, faults: FaultSchedule) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .faults(faults)
        .build()
}

/// A server that echoes one connection after another.
fn echo_server(sim: &mut Sim<cm_async::Result<Vec<u8>>>) {
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(server_addr(), ConnOptions::default())?;
        loop {
            let (conn, _) = listener.accept().await?;
            drop(cm.runtime().spawn(async move {
                while let Ok(m) = conn.recv().await {
                    if conn.send(&m).await.is_err() {
                        break;
                    }
                }
                let _ = conn.disconnect().await;
            }));
        }
    });
}

fn client_result<T: std::fmt::Debug>(mut outcomes: Vec<HostOutcome<T>>) -> T {
    match outcomes.remove(1) {
        HostOutcome::Finished(v) => v,
        other => panic!("client did not finish: {other:?}"),
    }
}

#[test]
fn connect_without_listener_is_rejected_with_status_8() {
    let f = fabric(1);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.connect(server_addr(), &ConnOptions::default())
            .await
            .map(|_| Vec::new())
    });
    let r = client_result(sim.run().unwrap());
    assert!(matches!(r, Err(Error::Rejected { status: 8, .. })), "{r:?}");
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn rejected_request_carries_the_servers_private_data() {
    let f = fabric(2);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(server_addr(), ConnOptions::default())?;
        loop {
            let req = listener.request().await?;
            assert!(req.private_data().starts_with(b"let me in"));
            req.reject(b"go away")?;
        }
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let opts = ConnOptions {
            private_data: b"let me in".to_vec(),
            ..ConnOptions::default()
        };
        cm.connect(server_addr(), &opts).await.map(|_| Vec::new())
    });
    match client_result(sim.run().unwrap()) {
        Err(Error::Rejected { status, private_data }) => {
            assert_eq!(status, 28);
            assert!(private_data.starts_with(b"go away"), "{private_data:?}");
        }
        other => panic!("expected REJECTED, got {other:?}"),
    }
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn address_nobody_has_is_addr_error_with_etimedout() {
    let f = fabric(3);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.connect("10.9.9.9:1".parse().unwrap(), &ConnOptions::default())
            .await
            .map(|_| Vec::new())
    });
    let r = client_result(sim.run().unwrap());
    assert_eq!(r, Err(Error::AddrError { status: -ETIMEDOUT }));
    assert!(f.live_resources().is_clean());
}

#[test]
fn failed_route_resolution_is_route_error() {
    let faults = FaultSchedule::new().with(
        Duration::ZERO,
        Fault::FailRouteResolution {
            host: 1,
            status: -ETIMEDOUT,
            count: 1,
        },
    );
    let f = fabric_with(4, faults);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.connect(server_addr(), &ConnOptions::default())
            .await
            .map(|_| Vec::new())
    });
    let r = client_result(sim.run().unwrap());
    assert_eq!(r, Err(Error::RouteError { status: -ETIMEDOUT }));
    assert!(f.live_resources().is_clean());
}

#[test]
fn partitioned_server_is_unreachable() {
    let faults = FaultSchedule::new().with(Duration::ZERO, Fault::Partition { a: 0, b: 1 });
    let f = fabric_with(5, faults);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.connect(server_addr(), &ConnOptions::default())
            .await
            .map(|_| Vec::new())
    });
    let r = client_result(sim.run().unwrap());
    assert_eq!(r, Err(Error::Unreachable { status: -ETIMEDOUT }));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn connect_timeout_is_typed_and_leaves_nothing() {
    let faults = FaultSchedule::new().with(Duration::ZERO, Fault::Partition { a: 0, b: 1 });
    let f = fabric_with(6, faults);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let opts = ConnOptions {
            connect_timeout: Duration::from_millis(500),
            ..ConnOptions::default()
        };
        let r = cm.connect(server_addr(), &opts).await.map(|_| Vec::new());
        assert_eq!(
            cm.runtime().now(),
            Duration::from_millis(500),
            "the timeout is virtual"
        );
        r
    });
    let r = client_result(sim.run().unwrap());
    assert_eq!(r, Err(Error::TimedOut { op: "connect" }));
    assert!(f.live_resources().is_clean());
}

#[test]
fn dropping_connect_halfway_releases_its_id_and_qp() {
    let f = fabric(7);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    echo_server(&mut sim);
    let host = f.host(1);
    sim.client(1, move |ctx| {
        let host = host.clone();
        async move {
            let cm = ctx.cm()?;
            let rt = cm.runtime().clone();
            // Each bound stops the connect at a different step (resolution, request, reply).
            for us in [1, 30, 60, 90, 120, 150, 200] {
                let r = rt
                    .timeout(
                        Duration::from_micros(us),
                        cm.connect(server_addr(), &ConnOptions::default()),
                    )
                    .await;
                if let Ok(conn) = r {
                    drop(conn?);
                }
                use cm_core::CmBackend;
                let live = host.live_resources();
                assert_eq!(
                    (live.ids, live.qps, live.unacked_events),
                    (0, 0, 0),
                    "after {us} us: {live:?}"
                );
            }
            let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
            conn.send(b"still works").await?;
            let echo = conn.recv().await?;
            conn.disconnect().await?;
            Ok(echo)
        }
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok(b"still works".to_vec()));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn dropping_accept_halfway_and_dropping_a_request_leave_nothing() {
    let f = fabric(8);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    let server = f.host(0);
    sim.server(0, move |ctx| {
        let server = server.clone();
        async move {
            let cm = ctx.cm()?;
            let rt = cm.runtime().clone();
            let listener = cm.listen(server_addr(), ConnOptions::default())?;
            // Cancelled while waiting: nothing was taken, nothing is held.
            assert!(rt
                .timeout(Duration::from_millis(1), listener.accept())
                .await
                .is_err());
            // The first request is dropped unanswered: the client sees REJECTED.
            drop(listener.request().await?);
            use cm_core::CmBackend;
            let live = server.live_resources();
            assert_eq!((live.ids, live.qps, live.unacked_events), (1, 0, 0), "{live:?}");
            let (conn, _) = listener.accept().await?;
            let m = conn.recv().await?;
            conn.send(&m).await?;
            let _ = conn.disconnect().await;
            std::future::pending::<()>().await;
            unreachable!()
        }
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.runtime().sleep(Duration::from_millis(2)).await;
        let first = cm.connect(server_addr(), &ConnOptions::default()).await;
        assert!(
            matches!(first, Err(Error::Rejected { status: 28, .. })),
            "{:?}",
            first.err()
        );
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        conn.send(b"second").await?;
        let m = conn.recv().await?;
        conn.disconnect().await?;
        Ok(m)
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok(b"second".to_vec()));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn dropping_a_live_connection_disconnects_the_peer_and_leaks_nothing() {
    let f = fabric(9);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(server_addr(), ConnOptions::default())?;
        let (conn, _) = listener.accept().await?;
        let r = conn.recv().await;
        assert!(matches!(r, Err(Error::Disconnected { status: 0 })), "{r:?}");
        conn.disconnect().await?;
        Ok(Vec::new())
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        drop(conn);
        assert_eq!(cm.live_resources().ids, 0);
        Ok(Vec::new())
    });
    sim.run().unwrap();
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn disconnect_reports_messages_nobody_received() {
    let f = fabric(10);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(server_addr(), ConnOptions::default())?;
        let (conn, _) = listener.accept().await?;
        conn.send(b"one").await?;
        conn.send(b"two").await?;
        let r = conn.recv().await;
        assert!(matches!(r, Err(Error::Disconnected { .. })), "{r:?}");
        let closed = conn.disconnect().await?;
        assert!(closed.unread.is_empty() && closed.unreported_sends.is_empty());
        std::future::pending::<()>().await;
        unreachable!()
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        cm.runtime().sleep(Duration::from_millis(10)).await;
        let closed = conn.disconnect().await?;
        assert_eq!(closed.unread, vec![b"one".to_vec(), b"two".to_vec()]);
        assert_eq!(closed.status, 0);
        Ok(Vec::new())
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok(Vec::new()));
    assert!(f.live_resources().is_clean());
}

#[test]
fn one_channel_serves_many_connections_of_many_tasks() {
    let f = fabric(11);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let handles: Vec<_> = (0..8u8)
            .map(|i| {
                let cm = cm.clone();
                cm.runtime().clone().spawn(async move {
                    let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
                    for j in 0..5u8 {
                        conn.send(&[i, j]).await?;
                        assert_eq!(conn.recv().await?, vec![i, j]);
                    }
                    conn.disconnect().await?;
                    Ok::<u8, Error>(i)
                })
            })
            .collect();
        let mut done = Vec::new();
        for h in handles {
            done.push(h.await.expect("task finished")?);
        }
        Ok(done)
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok((0..8).collect::<Vec<u8>>()));
    assert!(f.live_resources().is_clean());
}

#[test]
fn crashed_host_stops_its_tasks_and_runs_its_closure_again_after_restart() {
    let faults = FaultSchedule::new()
        .with(Duration::from_secs(1), Fault::Crash { host: 0 })
        .with(Duration::from_secs(2), Fault::Restart { host: 0 });
    let f = fabric_with(12, faults);
    let runs = Rc::new(Cell::new(0));
    let spawned_ended = Rc::new(Cell::new(false));
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    let (r2, s2) = (runs.clone(), spawned_ended.clone());
    sim.server(0, move |ctx| {
        r2.set(r2.get() + 1);
        let s2 = s2.clone();
        async move {
            let cm = ctx.cm()?;
            let rt = cm.runtime().clone();
            let listener = cm.listen(server_addr(), ConnOptions::default())?;
            let bg = rt.spawn(rt.sleep(Duration::from_secs(100)));
            drop(rt.spawn(async move {
                // The crash drops the sleeping task: its handle says so.
                s2.set(bg.await.is_none());
            }));
            loop {
                let (conn, _) = listener.accept().await?;
                let m = conn.recv().await?;
                conn.send(&m).await?;
                let _ = conn.disconnect().await;
            }
        }
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        cm.runtime().sleep(Duration::from_secs(3)).await;
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        conn.send(b"after restart").await?;
        let m = conn.recv().await?;
        conn.disconnect().await?;
        Ok(m)
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok(b"after restart".to_vec()));
    assert_eq!(runs.get(), 2);
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn every_task_waiting_without_a_timer_is_a_deadlock_naming_them_and_the_seed() {
    let f = fabric(13);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(server_addr(), ConnOptions::default())?;
        let (conn, _) = listener.accept().await?;
        std::future::pending::<()>().await;
        drop(conn);
        unreachable!()
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(server_addr(), &ConnOptions::default()).await?;
        conn.recv().await // the server never sends
    });
    let failure = sim.run().unwrap_err();
    let FailureKind::Deadlock { waiting, .. } = &failure.kind else {
        panic!("expected a deadlock, got {failure}")
    };
    assert!(waiting.contains(&"10.0.0.2#main".to_string()), "{waiting:?}");
    let text = failure.to_string();
    assert!(text.contains("CM_SIM_SEED=13"), "{text}");
    assert!(failure.trace.as_ref().is_some_and(|p| p.exists()), "{text}");
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn passing_the_virtual_deadline_fails_the_run() {
    let f = fabric(14);
    let mut sim: Sim<()> = Sim::new(f).deadline(Duration::from_secs(10));
    sim.client(1, |ctx| async move {
        ctx.runtime().sleep(Duration::from_secs(11)).await
    });
    let failure = sim.run().unwrap_err();
    assert!(matches!(failure.kind, FailureKind::Deadline { .. }), "{failure}");
    assert!(failure.to_string().contains("CM_SIM_SEED=14"));
}

#[test]
fn a_panicking_task_fails_the_run_with_seed_and_trace() {
    let f = fabric(15);
    let mut sim: Sim<()> = Sim::new(f);
    sim.client(1, |ctx| async move {
        ctx.runtime().sleep(Duration::from_millis(1)).await;
        panic!("boom");
    });
    let failure = sim.run().unwrap_err();
    match &failure.kind {
        FailureKind::Panic { task, message } => {
            assert_eq!(task, "10.0.0.2#main");
            assert_eq!(message, "boom");
        }
        other => panic!("expected a panic, got {other:?}"),
    }
    assert!(failure.to_string().contains("CM_SIM_SEED=15"));
}

#[test]
fn sleeps_and_timeouts_run_in_virtual_time() {
    let f = fabric(16);
    let mut sim: Sim<Duration> = Sim::new(f.clone());
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        rt.sleep(Duration::from_secs(3600 - 1)).await;
        let t = rt
            .timeout(Duration::from_millis(5), std::future::pending::<()>())
            .await;
        assert!(t.is_err());
        rt.now()
    });
    let out = sim.run().unwrap();
    assert_eq!(
        out[1],
        HostOutcome::Finished(Duration::from_secs(3599) + Duration::from_millis(5))
    );
}

#[test]
fn each_accepted_connection_sees_exactly_its_own_requests_private_data() {
    // The driver copies private data into buffers that earlier connections held: a reused
    // buffer must carry nothing of what it held before.
    let f = fabric(21);
    // Per accepted connection: the private data `accept` returned, and what the connection keeps.
    type Seen = Vec<(Vec<u8>, Vec<u8>)>;
    let seen: Rc<std::cell::RefCell<Seen>> = Rc::default();
    let log = seen.clone();
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.server(0, move |ctx| {
        let log = log.clone();
        async move {
            let cm = ctx.cm()?;
            let listener = cm.listen(server_addr(), ConnOptions::default())?;
            loop {
                let (conn, data) = listener.accept().await?;
                log.borrow_mut().push((data, conn.peer_private_data().to_vec()));
                drop(cm.runtime().spawn(async move {
                    let _ = conn.recv().await;
                    let _ = conn.disconnect().await;
                }));
            }
        }
    });
    let sent: [&[u8]; 4] = [b"a longer request", b"one", b"", b"three"];
    sim.client(1, move |ctx| async move {
        let cm = ctx.cm()?;
        for data in sent {
            let opts = ConnOptions {
                private_data: data.to_vec(),
                ..ConnOptions::default()
            };
            let conn = cm.connect(server_addr(), &opts).await?;
            conn.disconnect().await?;
        }
        Ok(Vec::new())
    });
    assert_eq!(client_result(sim.run().unwrap()), Ok(Vec::new()));
    let seen = seen.borrow();
    assert_eq!(seen.len(), sent.len());
    for ((returned, kept), data) in seen.iter().zip(sent) {
        // The IB CM pads a request's private data with zeros to 56 bytes.
        let mut want = data.to_vec();
        want.resize(56, 0);
        assert_eq!(returned, &want);
        assert_eq!(kept, &want);
    }
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

/// A future that is never ready and wakes its task at once: it never waits.
fn spin() -> impl std::future::Future<Output = ()> {
    std::future::poll_fn(|cx| {
        cx.waker().wake_by_ref();
        std::task::Poll::Pending
    })
}

#[test]
fn a_task_that_wakes_itself_for_ever_fails_the_run_as_a_livelock_naming_it_and_the_seed() {
    let f = fabric(17);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone()).livelock_after(10_000);
    // Waiting, not running: the server must not be named.
    echo_server(&mut sim);
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        rt.sleep(Duration::from_millis(3)).await;
        spin().await;
        Ok(Vec::new())
    });
    let failure = sim.run().unwrap_err();
    let FailureKind::Livelock { at, steps, running } = &failure.kind else {
        panic!("expected a livelock, got {failure}")
    };
    assert_eq!(*steps, 10_000);
    assert_eq!(*running, vec!["10.0.0.2#main".to_string()]);
    assert_eq!(at.as_nanos(), 3_000_000, "time stood still where the spin began");
    let text = failure.to_string();
    assert!(text.contains("livelock"), "{text}");
    assert!(text.contains("10.0.0.2#main"), "{text}");
    assert!(text.contains("CM_SIM_SEED=17"), "{text}");
    assert!(failure.trace.as_ref().is_some_and(|p| p.exists()), "{text}");
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_livelock_names_every_task_that_kept_running_and_none_that_waited() {
    let f = fabric(18);
    let mut sim: Sim<()> = Sim::new(f).livelock_after(5_000);
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        let a = rt.spawn(spin());
        let b = rt.spawn(spin());
        // Waits for them, never running again.
        a.await;
        b.await;
    });
    sim.client(0, |ctx| async move {
        ctx.runtime().sleep(Duration::from_secs(1)).await
    });
    let failure = sim.run().unwrap_err();
    let FailureKind::Livelock { mut running, .. } = failure.kind else {
        panic!("expected a livelock, got {failure}")
    };
    running.sort();
    assert_eq!(running, vec!["10.0.0.2#task1", "10.0.0.2#task2"]);
}

#[test]
fn the_livelock_bound_holds_by_default_and_ends_a_spinning_run_in_bounded_time() {
    let f = fabric(19);
    let mut sim: Sim<()> = Sim::new(f);
    sim.client(1, |_ctx| spin());
    let failure = sim.run().unwrap_err();
    assert!(
        matches!(
            failure.kind,
            FailureKind::Livelock {
                steps: cm_async::sim::DEFAULT_LIVELOCK_STEPS,
                ..
            }
        ),
        "{failure}"
    );
}

#[test]
fn polls_count_towards_a_livelock_only_while_virtual_time_stands_still() {
    let f = fabric(20);
    // Ten times the bound's polls in all, but time moves between every few of them.
    let mut sim: Sim<u32> = Sim::new(f).livelock_after(100);
    sim.client(1, |ctx| async move {
        let rt = ctx.runtime().clone();
        let mut yields = 0;
        for _ in 0..1_000 {
            for _ in 0..50 {
                let mut once = false;
                std::future::poll_fn(|cx| {
                    if std::mem::replace(&mut once, true) {
                        return std::task::Poll::Ready(());
                    }
                    cx.waker().wake_by_ref();
                    std::task::Poll::Pending
                })
                .await;
                yields += 1;
            }
            rt.sleep(Duration::from_micros(1)).await;
        }
        yields
    });
    let out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(out[1], HostOutcome::Finished(50_000));
}
