//! Errors and reports that say what happened, on the simulator: a timeout names the operation
//! it cut short, whether the layer's own bound or a `timeout` around the call fired it; a
//! disconnect says whether its DREQ was answered and reports every receive it flushed; a send
//! is bounded only by a timeout around it.

use std::net::SocketAddr;
use std::time::Duration;

use cm_async::sim::{FailureKind, HostOutcome, Sim};
use cm_async::{Closed, ConnOptions, Elapsed, Error, ImmWrite, Runtime};
use cm_core::errno::ETIMEDOUT;
use cm_core::{Access, RemoteMr, WcOpcode, WcStatus};
use cm_sim::{Fault, FaultSchedule, MsgKind, SimFabric};

fn at() -> SocketAddr {
    "10.0.0.1:7471".parse().unwrap()
}

fn fabric(seed: u64) -> SimFabric {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build()
}

/// The operation a timed-out future was waiting in; `why` says why it cannot have finished.
fn cut_short<T>(r: Result<T, Elapsed>, why: &str) -> Elapsed {
    match r {
        Err(e) => e,
        Ok(_) => panic!("finished within its timeout, although {why}"),
    }
}

fn finished<T: std::fmt::Debug>(o: HostOutcome<T>) -> T {
    match o {
        HostOutcome::Finished(v) => v,
        other => panic!("did not finish: {other:?}"),
    }
}

/// A server that accepts connections with `opts`, keeps each open without a word (and gives
/// each the key of a 64-byte region in the accept), until the run ends.
fn silent_server(sim: &mut Sim<cm_async::Result<Vec<&'static str>>>, opts: ConnOptions) {
    sim.server(0, move |ctx| {
        let opts = opts.clone();
        async move {
            let cm = ctx.cm()?;
            let listener = cm.listen(at(), opts)?;
            let region = listener.register(64, Access::ALL)?;
            let mut held = Vec::new();
            loop {
                let req = listener.request().await?;
                held.push(req.accept_with_private_data(&region.remote().to_bytes())?);
            }
        }
    });
}

#[test]
fn a_timeout_around_an_operation_names_that_operation_in_elapsed_and_in_the_error() {
    let f = fabric(1);
    let mut sim: Sim<cm_async::Result<Vec<&'static str>>> = Sim::new(f.clone());
    silent_server(&mut sim, ConnOptions::default());
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let rt = cm.runtime().clone();
        let short = Duration::from_millis(1);
        let mut named = Vec::new();
        let listener = cm.listen("10.0.0.2:7000".parse().unwrap(), ConnOptions::default())?;
        let e = cut_short(rt.timeout(short, listener.accept()).await, "nobody connects");
        named.push(e.op());
        let e = cut_short(rt.timeout(short, listener.request()).await, "nobody connects");
        named.push(e.op());
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        // Through `?` as applications write it: the error names the operation too.
        let recv: cm_async::Result<Vec<u8>> = async { rt.timeout(short, conn.recv()).await? }.await;
        assert_eq!(recv, Err(Error::TimedOut { op: "recv" }));
        assert_eq!(recv.unwrap_err().to_string(), "recv timed out");
        let e = cut_short(rt.timeout(short, conn.recv_imm()).await, "the server is silent");
        named.push(e.op());
        assert_eq!(e.to_string(), "recv_imm timed out");
        Ok(named)
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished(out.remove(1)), Ok(vec!["accept", "request", "recv_imm"]));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_timeout_on_one_sided_work_across_a_partition_names_the_operation() {
    let f = fabric(2);
    let mut sim: Sim<cm_async::Result<Vec<&'static str>>> = Sim::new(f.clone());
    silent_server(&mut sim, ConnOptions::default());
    let fab = f.clone();
    sim.client(1, move |ctx| {
        let fab = fab.clone();
        async move {
            let cm = ctx.cm()?;
            let rt = cm.runtime().clone();
            let conn = cm.connect(at(), &ConnOptions::default()).await?;
            let table = RemoteMr::from_bytes(conn.peer_private_data()).expect("the server's key");
            let mine = conn.register(64, Access::LOCAL_WRITE)?;
            // Cut off, each request waits for the transport's retries (seconds): a timeout of
            // a millisecond cuts it short while it still waits.
            fab.inject(Fault::Partition { a: 0, b: 1 });
            let short = Duration::from_millis(1);
            let mut named = Vec::new();
            let r = rt.timeout(short, conn.read(&mine, 0, 8, table.start())).await;
            named.push(cut_short(r, "cut off").op());
            let r = rt.timeout(short, conn.write(&mine, 0, 8, table.start())).await;
            named.push(cut_short(r, "cut off").op());
            let r = rt
                .timeout(short, conn.write_with_imm(&mine, 0, 8, table.start(), 7))
                .await;
            named.push(cut_short(r, "cut off").op());
            let r = rt
                .timeout(short, conn.compare_swap(&mine, 8, table.start(), 0, 1))
                .await;
            named.push(cut_short(r, "cut off").op());
            let r = rt
                .timeout(short, conn.fetch_add(&mine, 8, table.start(), 1))
                .await;
            named.push(cut_short(r, "cut off").op());
            drop(mine);
            drop(conn);
            Ok(named)
        }
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        finished(out.remove(1)),
        Ok(vec![
            "read",
            "write",
            "write_with_imm",
            "compare_swap",
            "fetch_add"
        ])
    );
}

#[test]
fn a_timeout_names_the_operation_still_waiting_not_one_that_finished_before() {
    let f = fabric(3);
    let mut sim: Sim<cm_async::Result<Vec<&'static str>>> = Sim::new(f.clone());
    silent_server(&mut sim, ConnOptions::default());
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let rt = cm.runtime().clone();
        let mut named = Vec::new();
        // The connect waits (for its events) and finishes; then the future sleeps, which is
        // no operation of the layer.
        let r = rt
            .timeout(Duration::from_secs(1), async {
                let conn = cm.connect(at(), &ConnOptions::default()).await;
                rt.sleep(Duration::from_secs(5)).await;
                conn
            })
            .await;
        let e = cut_short(r, "the sleep outlasts the timeout");
        named.push(e.op());
        assert_eq!(Error::from(e), Error::TimedOut { op: "operation" });
        // Nested: the outer timeout fires while the inner one's recv waits, and names it.
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        let r = rt
            .timeout(
                Duration::from_millis(1),
                rt.timeout(Duration::from_secs(5), conn.recv()),
            )
            .await;
        named.push(cut_short(r, "the outer bound is the shorter").op());
        // A sequence: the send finishes (the server's receives are posted), the recv waits.
        let r = rt
            .timeout(Duration::from_millis(1), async {
                conn.send(b"hello").await?;
                conn.recv().await
            })
            .await;
        named.push(cut_short(r, "the server never answers").op());
        Ok(named)
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished(out.remove(1)), Ok(vec!["operation", "recv", "recv"]));
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_disconnect_cut_off_from_its_peer_times_out_as_disconnect() {
    let f = fabric(4);
    let mut sim: Sim<cm_async::Result<Vec<&'static str>>> = Sim::new(f.clone());
    silent_server(&mut sim, ConnOptions::default());
    let fab = f.clone();
    sim.client(1, move |ctx| {
        let fab = fab.clone();
        async move {
            let cm = ctx.cm()?;
            let opts = ConnOptions {
                disconnect_timeout: Duration::from_secs(1),
                ..ConnOptions::default()
            };
            let conn = cm.connect(at(), &opts).await?;
            fab.inject(Fault::Partition { a: 0, b: 1 });
            let r = conn.disconnect().await;
            assert_eq!(r, Err(Error::TimedOut { op: "disconnect" }));
            Ok(Vec::new())
        }
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(finished(out.remove(1)), Ok(Vec::new()));
}

#[test]
fn a_disconnect_whose_dreq_goes_unanswered_says_so_and_an_answered_one_does_not() {
    // The first DREQ from the client reaches the server; every one after it is lost.
    let faults = FaultSchedule::new().with(
        Duration::ZERO,
        Fault::Drop {
            from: 1,
            to: 0,
            msg: MsgKind::Dreq,
            skip: 1,
            count: u32::MAX,
        },
    );
    let f = SimFabric::builder()
        .seed(5)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .faults(faults)
        .build();
    let mut sim: Sim<cm_async::Result<Vec<Closed>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(at(), ConnOptions::default())?;
        let (conn, _) = listener.accept().await?;
        let r = conn.recv().await;
        assert_eq!(r, Err(Error::Disconnected { status: 0 }));
        let passive = conn.disconnect().await?;
        assert!(!passive.dreq_timed_out, "the peer's DREQ ended it: {passive:?}");
        // The second connection's DREQ never arrives: it stays open here.
        let (_kept, _) = listener.accept().await?;
        std::future::pending::<()>().await;
        unreachable!()
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let mut closed = Vec::new();
        for _ in 0..2 {
            let conn = cm.connect(at(), &ConnOptions::default()).await?;
            closed.push(conn.disconnect().await?);
        }
        Ok(closed)
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    let closed = finished(out.remove(1)).expect("both disconnects return Ok");
    assert!(!closed[0].dreq_timed_out, "answered: {:?}", closed[0]);
    assert_eq!(closed[0].status, 0);
    assert!(closed[1].dreq_timed_out, "unanswered: {:?}", closed[1]);
    assert_eq!(closed[1].status, -ETIMEDOUT);
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_disconnect_reports_every_receive_it_flushed_in_posting_order() {
    let f = fabric(6);
    let mut sim: Sim<cm_async::Result<Vec<Closed>>> = Sim::new(f.clone());
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let opts = ConnOptions {
            recv_depth: 3,
            ..ConnOptions::default()
        };
        let listener = cm.listen(at(), opts)?;
        let (conn, _) = listener.accept().await?;
        conn.send(b"one").await?;
        conn.send(b"two").await?;
        assert!(matches!(conn.recv().await, Err(Error::Disconnected { .. })));
        let closed = conn.disconnect().await?;
        // Nothing ever came: the three receives posted at the accept are all flushed.
        assert_eq!(closed.flushed_recvs.len(), 3, "{closed:?}");
        std::future::pending::<()>().await;
        unreachable!()
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let opts = ConnOptions {
            recv_depth: 6,
            ..ConnOptions::default()
        };
        let conn = cm.connect(at(), &opts).await?;
        // Each receive taken is posted again: six stay posted.
        assert_eq!(conn.recv().await?, b"one");
        assert_eq!(conn.recv().await?, b"two");
        Ok(vec![conn.disconnect().await?])
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    let closed = finished(out.remove(1)).expect("the client finishes").remove(0);
    assert_eq!(closed.flushed_recvs.len(), 6, "{closed:?}");
    assert!(closed
        .flushed_recvs
        .iter()
        .all(|wc| wc.status == WcStatus::WrFlushErr && wc.opcode == WcOpcode::Recv));
    let ids: Vec<u64> = closed.flushed_recvs.iter().map(|wc| wc.wr_id).collect();
    assert!(ids.windows(2).all(|w| w[0] < w[1]), "posting order: {ids:?}");
    assert!(closed.unread.is_empty() && closed.unreported_sends.is_empty());
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_disconnect_reports_writes_with_immediate_nobody_took() {
    let f = fabric(7);
    let mut sim: Sim<cm_async::Result<Vec<Closed>>> = Sim::new(f.clone());
    sim.client(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(at(), ConnOptions::default())?;
        let region = listener.register(64, Access::ALL)?;
        let conn = listener
            .request()
            .await?
            .accept_with_private_data(&region.remote().to_bytes())?;
        // A message, not the writes before it: `recv` leaves their completions where they are.
        assert_eq!(conn.recv().await?, b"done");
        Ok(vec![conn.disconnect().await?])
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        let table = RemoteMr::from_bytes(conn.peer_private_data()).expect("the server's key");
        let mine = conn.register(64, Access::LOCAL_WRITE)?;
        // The data path has no latency and the RTU has: without the wait the server would get
        // "done" and disconnect before its side is established, where a disconnect sends no
        // DREQ (the kernel's too) and waits for a `DISCONNECTED` that never comes.
        cm.runtime().sleep(Duration::from_millis(1)).await;
        conn.write_with_imm(&mine, 0, 4, table.start(), 1).await?;
        conn.write_with_imm(&mine, 0, 8, table.start(), 2).await?;
        conn.send(b"done").await?;
        drop(mine);
        assert!(matches!(conn.recv().await, Err(Error::Disconnected { .. })));
        Ok(vec![conn.disconnect().await?])
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    let server = finished(out.remove(0)).expect("the server finishes").remove(0);
    assert_eq!(
        server.unread_imms,
        vec![ImmWrite { imm: 1, len: 4 }, ImmWrite { imm: 2, len: 8 }]
    );
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

/// A server whose connections post no receives: a send to one finds none, and with
/// librdmacm's default RNR retry count (7: for ever) waits for one for ever.
fn server_without_receives(sim: &mut Sim<cm_async::Result<Vec<Closed>>>) {
    sim.server(0, |ctx| async move {
        let cm = ctx.cm()?;
        let opts = ConnOptions {
            recv_depth: 0,
            ..ConnOptions::default()
        };
        let listener = cm.listen(at(), opts)?;
        let mut held = Vec::new();
        loop {
            held.push(listener.accept().await?.0);
        }
    });
}

#[test]
fn a_send_the_peer_never_receives_waits_for_ever_unless_bounded() {
    let f = fabric(8);
    let mut sim: Sim<cm_async::Result<Vec<Closed>>> = Sim::new(f.clone()).deadline(Duration::from_secs(600));
    server_without_receives(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        conn.send(b"anyone?").await?;
        Ok(Vec::new())
    });
    let failure = sim.run().expect_err("the send never completes");
    assert!(
        matches!(
            failure.kind,
            FailureKind::Deadline { .. } | FailureKind::Deadlock { .. }
        ),
        "{failure}"
    );
    assert!(failure.to_string().contains("10.0.0.2#main"), "{failure}");
}

#[test]
fn a_send_bounded_by_a_timeout_fails_as_send_and_its_request_is_reported_at_disconnect() {
    let f = fabric(9);
    let mut sim: Sim<cm_async::Result<Vec<Closed>>> = Sim::new(f.clone());
    server_without_receives(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let rt = cm.runtime().clone();
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        let sent: cm_async::Result<()> =
            async { rt.timeout(Duration::from_secs(5), conn.send(b"anyone?")).await? }.await;
        assert_eq!(sent, Err(Error::TimedOut { op: "send" }));
        Ok(vec![conn.disconnect().await?])
    });
    let mut out = sim.run().unwrap_or_else(|e| panic!("{e}"));
    let closed = finished(out.remove(1)).expect("the client finishes").remove(0);
    // The send stayed posted when its future was dropped: the disconnect flushed it.
    assert_eq!(closed.unreported_sends.len(), 1, "{closed:?}");
    assert_eq!(closed.unreported_sends[0].status, WcStatus::WrFlushErr);
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn an_elapsed_made_without_an_operation_reads_as_one_unnamed() {
    // What a runtime that overrides `timeout` itself reports.
    let e = Elapsed::default();
    assert_eq!(e.op(), "operation");
    assert_eq!(Error::from(e), Error::TimedOut { op: "operation" });
    assert_eq!(e.to_string(), "operation timed out");
}
