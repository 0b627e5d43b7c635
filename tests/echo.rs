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
        server: None,
        handoff: false,
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
    assert!(
        fabric.live_resources().is_clean(),
        "{:?}",
        fabric.live_resources()
    );
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
    assert!(
        results
            .iter()
            .all(|r| r.as_ref().is_ok_and(|r| r.echoed == a.messages)),
        "{results:?}"
    );
    assert!(
        results.iter().any(|r| r.as_ref().is_ok_and(|r| r.attempts > 1)),
        "nobody had to retry: {results:?}"
    );
    assert!(fabric.live_resources().is_clean());
}

/// The echo application with 10 clients, 20 % CM loss and the server's host crashing at 2 s
/// and back at 3 s: the echo server destroys its child right after answering a disconnect, so
/// when that DREP is lost the DREQ's next try meets no id. As on a fabric, the server's host
/// answers it (cm_issue_drep), rather than the client waiting out its 68.7 s and ending in -110.
#[test]
fn a_lost_drep_to_a_destroyed_peer_is_answered_by_its_host_not_timed_out() {
    let (mut answered, mut client_disconnects) = (0, 0);
    for seed in 0..20 {
        let a = echo::Args {
            clients: 10,
            loss: 200,
            crash_server: Some(Duration::from_secs(2)),
            ..args(seed)
        };
        let fabric = echo::fabric(&a);
        echo::run_sim(&fabric, &a).unwrap_or_else(|f| panic!("{f}"));
        for r in fabric.trace_records() {
            if r.host != 0 && r.what == cm::sim::TraceWhat::Event(cm::api::CmEventType::Disconnected) {
                client_disconnects += 1;
                assert_eq!(r.status, 0, "seed {seed}: {r:?}");
            }
        }
        answered += fabric.fault_stats().dreps_without_id;
    }
    assert!(
        client_disconnects >= 200,
        "{client_disconnects} client disconnects"
    );
    assert!(answered > 0, "no DREQ met a destroyed id in 20 seeds");
}

/// One fault of a generated schedule; hosts: 0 the server, 1..=CLIENTS the clients.
fn fault() -> impl Strategy<Value = (Duration, Fault)> {
    let client = 1..=CLIENTS as u16;
    let at = (0u64..400).prop_map(Duration::from_micros);
    prop_oneof![
        (client.clone(), 50u16..600).prop_map(|(b, p)| (
            Duration::ZERO,
            Fault::Loss {
                a: 0,
                b,
                per_mille: p
            }
        )),
        (at.clone(), client.clone()).prop_map(|(t, b)| (t, Fault::Partition { a: 0, b })),
        (at.clone(), client.clone()).prop_map(|(t, b)| (t, Fault::Heal { a: 0, b })),
        at.clone().prop_map(|t| (t, Fault::Crash { host: 0 })),
        at.clone().prop_map(|t| (t, Fault::Restart { host: 0 })),
        (client.clone(), 1u64..50).prop_map(|(b, ms)| (
            Duration::ZERO,
            Fault::Delay {
                a: 0,
                b,
                min: Duration::ZERO,
                max: Duration::from_millis(ms)
            }
        )),
        (at.clone(), client.clone()).prop_map(|(t, host)| (
            t,
            Fault::FailAddrResolution {
                host,
                status: -113,
                count: 1
            }
        )),
        (at.clone(), client.clone()).prop_map(|(t, host)| (
            t,
            Fault::FailRouteResolution {
                host,
                status: -110,
                count: 1
            }
        )),
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
        b = b.host(format!("10.0.0.{}", c + 2));
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

/// The same application on tokio's multi-threaded runtime. Without an RDMA device the backend
/// is the simulator behind stand-in fds: a ticker task moves the fabric's clock on in real time
/// and makes every fd readable after each tick, which is what the channel and CQ fds of a real
/// device do when something arrives. The layer's tokio driver (`AsyncFd` on those fds, pumping
/// on readiness) and the tokio runtime are exercised for real.
mod on_tokio {
    use std::io::Write;
    use std::net::SocketAddr;
    use std::os::fd::{AsFd, BorrowedFd};
    use std::os::unix::net::UnixStream;
    use std::rc::Rc;
    use std::time::Duration;

    use cm::api::{
        Access, AsyncEvent, ChannelHandle, CmBackend, CmEvent, ConnParam, IdHandle, IdMachine, IdOption,
        LiveResources, MrHandle, MrInfo, PortSpace, QpAttr, QpCaps, QpState, Result, SendWr, SrqCaps,
        SrqHandle, UdParam, WorkCompletion,
    };
    use cm::app::tokio::{Readiness, TokioRuntime};
    use cm::sim::{SimFabric, SimHost};

    use super::echo;

    /// One socket pair standing in for every channel and CQ fd: the driver registers a
    /// duplicate per fd, and a byte written makes all of them readable at once.
    struct StandIn {
        reader: UnixStream,
        writer: UnixStream,
    }

    impl StandIn {
        fn new() -> Self {
            let (reader, writer) = UnixStream::pair().expect("socketpair");
            reader.set_nonblocking(true).expect("non-blocking");
            writer.set_nonblocking(true).expect("non-blocking");
            StandIn { reader, writer }
        }

        fn tick(&self) {
            let _ = (&self.writer).write(&[1]);
        }
    }

    struct Ticking {
        host: SimHost,
        fds: Rc<StandIn>,
    }

    macro_rules! forward {
        ($($name:ident(&mut self $(, $arg:ident: $ty:ty)*) -> $ret:ty;)*) => {
            $(fn $name(&mut self $(, $arg: $ty)*) -> $ret { self.host.$name($($arg),*) })*
        };
    }

    impl CmBackend for Ticking {
        forward! {
            create_event_channel(&mut self) -> Result<ChannelHandle>;
            destroy_event_channel(&mut self, ch: ChannelHandle) -> Result<()>;
            create_id(&mut self, ch: ChannelHandle, ps: PortSpace) -> Result<IdHandle>;
            destroy_id(&mut self, id: IdHandle) -> Result<()>;
            bind_addr(&mut self, id: IdHandle, a: SocketAddr) -> Result<()>;
            resolve_addr(&mut self, id: IdHandle, s: Option<SocketAddr>, d: SocketAddr, t: Duration) -> Result<()>;
            resolve_route(&mut self, id: IdHandle, t: Duration) -> Result<()>;
            create_qp(&mut self, id: IdHandle, caps: QpCaps) -> Result<QpCaps>;
            destroy_qp(&mut self, id: IdHandle) -> Result<()>;
            listen(&mut self, id: IdHandle, backlog: i32) -> Result<()>;
            connect(&mut self, id: IdHandle, p: &ConnParam) -> Result<()>;
            accept(&mut self, id: IdHandle, p: &ConnParam) -> Result<()>;
            reject(&mut self, id: IdHandle, d: &[u8]) -> Result<()>;
            init_qp_attr(&mut self, id: IdHandle, s: QpState) -> Result<QpAttr>;
            establish(&mut self, id: IdHandle) -> Result<()>;
            disconnect(&mut self, id: IdHandle) -> Result<()>;
            get_cm_event(&mut self, ch: ChannelHandle, t: Duration) -> Result<Option<CmEvent>>;
            try_get_cm_event(&mut self, ch: ChannelHandle) -> Result<Option<CmEvent>>;
            ack_cm_event(&mut self, ev: CmEvent) -> Result<()>;
            set_option(&mut self, id: IdHandle, o: IdOption) -> Result<()>;
            migrate_id(&mut self, id: IdHandle, ch: ChannelHandle) -> Result<()>;
            get_local_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;
            get_peer_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>>;
            post_send(&mut self, id: IdHandle, wr: u64, d: &[u8]) -> Result<()>;
            post_recv(&mut self, id: IdHandle, wr: u64, len: u32) -> Result<()>;
            poll_cq(&mut self, id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize, t: Duration) -> Result<usize>;
            try_poll_cq(&mut self, id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize>;
            post_send_to(&mut self, id: IdHandle, wr: u64, dest: &UdParam, d: &[u8]) -> Result<()>;
            join_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()>;
            leave_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()>;
            reg_mr(&mut self, id: IdHandle, len: usize, access: Access) -> Result<MrHandle>;
            dereg_mr(&mut self, mr: MrHandle) -> Result<()>;
            write_mr(&mut self, mr: MrHandle, offset: u64, data: &[u8]) -> Result<()>;
            post_send_wr(&mut self, id: IdHandle, wr: &SendWr<'_>) -> Result<()>;
            create_srq(&mut self, id: IdHandle, caps: SrqCaps) -> Result<SrqHandle>;
            destroy_srq(&mut self, srq: SrqHandle) -> Result<()>;
            post_srq_recv(&mut self, srq: SrqHandle, wr: u64, len: u32) -> Result<()>;
            arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()>;
            create_qp_on_srq(&mut self, id: IdHandle, caps: QpCaps, srq: SrqHandle) -> Result<QpCaps>;
            get_async_event(&mut self, t: Duration) -> Result<Option<AsyncEvent>>;
        }

        fn mr_info(&self, mr: MrHandle) -> Result<MrInfo> {
            self.host.mr_info(mr)
        }

        fn read_mr(&self, mr: MrHandle, offset: u64, out: &mut [u8]) -> Result<()> {
            self.host.read_mr(mr, offset, out)
        }

        fn id_machine(&self, id: IdHandle) -> Result<IdMachine> {
            self.host.id_machine(id)
        }

        fn live_resources(&self) -> LiveResources {
            self.host.live_resources()
        }
    }

    impl Readiness for Ticking {
        fn channel_fd(&self, ch: ChannelHandle) -> Result<BorrowedFd<'_>> {
            let _ = ch;
            Ok(self.fds.reader.as_fd())
        }

        fn cq_fd(&self, id: IdHandle) -> Result<BorrowedFd<'_>> {
            let _ = id;
            Ok(self.fds.reader.as_fd())
        }
    }

    /// Runs echo (a server and two clients on a fabric of its own, seeded `seed`) in a
    /// `LocalSet` on the calling thread, with `rt`'s worker threads running the reactor and the
    /// timers; asserts every echo came back and nothing is left alive.
    fn echo_in_local_set(rt: &tokio::runtime::Handle, seed: u64) {
        let fabric = SimFabric::builder()
            .seed(seed)
            .host("10.0.0.1")
            .host("10.0.0.2")
            .host("10.0.0.3")
            .build();
        let server: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let local = tokio::task::LocalSet::new();
        let results = rt.block_on(local.run_until(async {
            let tr = TokioRuntime::new();
            let fds = Rc::new(StandIn::new());
            let backend = |i: usize| Ticking {
                host: fabric.host(i),
                fds: fds.clone(),
            };
            let server_cm = tr.cm(backend(0)).expect("channel");
            let ticker = {
                let (fabric, fds) = (fabric.clone(), fds.clone());
                tokio::task::spawn_local(async move {
                    loop {
                        tokio::time::sleep(Duration::from_micros(100)).await;
                        fabric.advance(Duration::from_millis(1));
                        fds.tick();
                    }
                })
            };
            let srv = tokio::task::spawn_local(echo::app::server(server_cm, server));
            let mut clients = Vec::new();
            for c in 1..=2u32 {
                let cm = tr.cm(backend(c as usize)).expect("channel");
                let plan = echo::app::Plan {
                    server,
                    client: c,
                    messages: 20,
                    retries: 3,
                    op_timeout: Duration::from_secs(10),
                };
                clients.push(tokio::task::spawn_local(echo::app::client(cm, plan)));
            }
            let mut results = Vec::new();
            for c in clients {
                results.push(
                    tokio::time::timeout(Duration::from_secs(60), c)
                        .await
                        .expect("bounded")
                        .expect("joined"),
                );
            }
            srv.abort();
            let _ = srv.await;
            tokio::task::yield_now().await;
            ticker.abort();
            results
        }));
        for r in &results {
            assert_eq!(r.as_ref().map(|r| r.echoed), Ok(20), "seed {seed}: {r:?}");
        }
        drop(local);
        assert!(
            fabric.live_resources().is_clean(),
            "seed {seed}: {:?}",
            fabric.live_resources()
        );
    }

    type State = (SimFabric, Rc<StandIn>);

    /// A `CmThread` whose state is a three-host fabric seeded `seed` and its stand-in fds.
    fn ticking_thread(seed: u64) -> cm::app::tokio::CmThread<State> {
        cm::app::tokio::CmThread::start_with(move || {
            let fabric = SimFabric::builder()
                .seed(seed)
                .host("10.0.0.1")
                .host("10.0.0.2")
                .host("10.0.0.3")
                .build();
            (fabric, Rc::new(StandIn::new()))
        })
        .expect("driver thread")
    }

    /// Host `host`'s backend, made on the thread from its state.
    fn backend(host: usize) -> impl FnOnce(&State) -> Result<Ticking> + Send + 'static {
        move |(fabric, fds): &State| {
            Ok(Ticking {
                host: fabric.host(host),
                fds: fds.clone(),
            })
        }
    }

    /// The fabric's clock, moved on in real time on the thread that owns it.
    async fn start_ticker(thread: &cm::app::tokio::CmThread<State>) {
        thread
            .run(|(fabric, fds): &State| {
                let (fabric, fds) = (fabric.clone(), fds.clone());
                async move {
                    tokio::task::spawn_local(async move {
                        loop {
                            tokio::time::sleep(Duration::from_micros(100)).await;
                            fabric.advance(Duration::from_millis(1));
                            fds.tick();
                        }
                    });
                }
            })
            .await
            .expect("ticker");
    }

    /// A `recv` on a `Send` connection cut short by a timeout takes no message: the next one
    /// gets what the peer sends after it.
    #[test]
    fn a_send_connections_recv_cancelled_by_a_timeout_takes_no_message() {
        use cm::app::ConnOptions;
        let thread = ticking_thread(43);
        let server: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let rt = multi_threaded_runtime(2);
        rt.block_on(async {
            start_ticker(&thread).await;
            let server_cm = thread.cm(backend(0)).await.expect("server channel");
            let client_cm = thread.cm(backend(1)).await.expect("client channel");
            let listener = server_cm
                .listen(server, ConnOptions::default())
                .await
                .expect("listen");
            let (timed_out, go) = tokio::sync::oneshot::channel();
            let served = tokio::spawn(async move {
                let (conn, _) = listener.accept().await.expect("accept");
                let cut = tokio::time::timeout(Duration::from_millis(50), conn.recv()).await;
                assert!(cut.is_err(), "nothing was sent yet: {cut:?}");
                timed_out.send(()).expect("client waits");
                let got = tokio::time::timeout(Duration::from_secs(20), conn.recv())
                    .await
                    .expect("bounded")
                    .expect("message");
                conn.send(b"ok").await.expect("reply");
                let ended = conn.recv().await;
                assert!(
                    matches!(ended, Err(cm::app::Error::Disconnected { .. })),
                    "{ended:?}"
                );
                let closed = conn.disconnect().await;
                (got, closed.map(|c| c.unread.len()))
            });
            let conn = client_cm
                .connect(server, &ConnOptions::default())
                .await
                .expect("connect");
            go.await.expect("server timed out");
            conn.send(b"after the timeout").await.expect("send");
            let reply = tokio::time::timeout(Duration::from_secs(20), conn.recv()).await;
            assert_eq!(reply.expect("bounded").expect("reply"), b"ok");
            conn.disconnect().await.expect("client disconnect");
            let (got, closed) = tokio::time::timeout(Duration::from_secs(30), served)
                .await
                .expect("bounded")
                .expect("server");
            assert_eq!(got, b"after the timeout");
            assert_eq!(closed.expect("closed"), 0);
        });
    }

    /// What a tokio server does with `Send` connections: one task accepts, and each
    /// connection is handed to a worker `tokio::spawn`ed on the multi-threaded runtime, no
    /// `LocalSet` anywhere. The fabric, its stand-in fds and every backend live on the
    /// `CmThread`, made there from its state.
    #[test]
    fn send_connections_are_accepted_on_one_task_and_served_by_spawned_workers() {
        use cm::app::tokio::SendConnection;
        use cm::app::ConnOptions;
        use std::sync::Arc;

        fn send_and_sync<T: Send + Sync>(_: &T) {}
        let thread = ticking_thread(41);
        let server: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let rt = multi_threaded_runtime(2);
        const CONNECTIONS: usize = 4;
        const MESSAGES: usize = 10;
        rt.block_on(async {
            start_ticker(&thread).await;
            let server_cm = thread.cm(backend(0)).await.expect("server channel");
            let listener = server_cm
                .listen(server, ConnOptions::default())
                .await
                .expect("listen");
            send_and_sync(&listener);
            let acceptor = tokio::spawn(async move {
                let mut workers = Vec::new();
                for _ in 0..CONNECTIONS {
                    let (conn, hello): (SendConnection<Ticking>, Vec<u8>) =
                        listener.accept().await.expect("accept");
                    send_and_sync(&conn);
                    workers.push(tokio::spawn(async move {
                        let on = std::thread::current().name().map(str::to_owned);
                        let mut echoed = 0;
                        while let Ok(msg) = conn.recv().await {
                            conn.send(&msg).await.expect("echo");
                            echoed += 1;
                        }
                        let closed = conn.disconnect().await.expect("closed");
                        (hello[0], echoed, on, closed.unread.len())
                    }));
                }
                let mut served = Vec::new();
                for w in workers {
                    served.push(w.await.expect("worker"));
                }
                served
            });
            let mut cms = Vec::new();
            for host in [1usize, 2] {
                cms.push(Arc::new(thread.cm(backend(host)).await.expect("client channel")));
            }
            let mut tasks = Vec::new();
            for (n, cm) in cms.into_iter().cycle().take(CONNECTIONS).enumerate() {
                tasks.push(tokio::spawn(async move {
                    let opts = ConnOptions {
                        private_data: vec![n as u8],
                        ..ConnOptions::default()
                    };
                    let conn = cm.connect(server, &opts).await.expect("connect");
                    for i in 0..MESSAGES {
                        let msg = format!("{n}:{i}").into_bytes();
                        conn.send(&msg).await.expect("send");
                        let echo = tokio::time::timeout(Duration::from_secs(20), conn.recv())
                            .await
                            .expect("bounded")
                            .expect("echo");
                        assert_eq!(echo, msg);
                    }
                    conn.disconnect().await.expect("disconnect");
                }));
            }
            for t in tasks {
                tokio::time::timeout(Duration::from_secs(60), t)
                    .await
                    .expect("bounded")
                    .expect("client");
            }
            let mut served = tokio::time::timeout(Duration::from_secs(30), acceptor)
                .await
                .expect("bounded")
                .expect("acceptor");
            served.sort();
            for (n, (hello, echoed, on, unread)) in served.into_iter().enumerate() {
                assert_eq!((hello as usize, echoed, unread), (n, MESSAGES, 0));
                assert_ne!(
                    on.as_deref(),
                    Some("cm-driver"),
                    "workers run on the runtime's threads"
                );
            }
        });
        let clean = rt.block_on(async {
            for _ in 0..500 {
                let live = thread
                    .run(|(fabric, _): &State| {
                        let live = fabric.live_resources();
                        async move { live }
                    })
                    .await
                    .expect("state");
                if live.is_clean() {
                    return Ok(());
                }
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            Err(thread
                .run(|(fabric, _): &State| {
                    let live = format!("{:?}", fabric.live_resources());
                    async move { live }
                })
                .await)
        });
        assert_eq!(clean, Ok(()), "everything released once the handles are gone");
    }

    fn multi_threaded_runtime(workers: usize) -> tokio::runtime::Runtime {
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(workers)
            .enable_all()
            .build()
            .unwrap()
    }

    #[test]
    fn echo_runs_unchanged_on_tokio_multi_threaded_runtime() {
        let rt = multi_threaded_runtime(2);
        echo_in_local_set(rt.handle(), 21);
    }

    /// The crate docs' recipe for more than one core: one multi-threaded runtime, and per
    /// thread a `LocalSet` with its own backend and `Cm`. Three threads run echo at once on one
    /// runtime; each thread's connections stay on it while the runtime's shared reactor and
    /// timers, on its worker threads, wake them.
    #[test]
    fn per_thread_channels_share_one_multi_threaded_runtime() {
        let rt = std::sync::Arc::new(multi_threaded_runtime(2));
        let threads: Vec<_> = (0..3u64)
            .map(|i| {
                let rt = rt.clone();
                std::thread::Builder::new()
                    .name(format!("echo-{i}"))
                    .spawn(move || echo_in_local_set(rt.handle(), 30 + i))
                    .expect("thread")
            })
            .collect();
        for t in threads {
            if let Err(panic) = t.join() {
                std::panic::resume_unwind(panic);
            }
        }
    }
}
