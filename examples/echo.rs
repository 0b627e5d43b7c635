//! An echo server and N clients, written once over any backend and runtime.
//!
//! ```text
//! cargo run --release --example echo                                  # simulator, 10 clients x 10 messages
//! cargo run --release --example echo -- --clients 100 --messages 100 --loss 200 --crash-server 5
//! ```
//!
//! On a device (Soft-RoCE or a NIC), on tokio's multi-threaded runtime, the server and the
//! clients in one process, each side with its own event channel:
//!
//! ```text
//! cargo run --release --features hw --example echo -- --backend hw --server 10.0.0.1 --clients 100 --messages 100
//! ```
//!
//! With `--handoff` (hardware only) the same echo runs on `Send` handles (`cm::app::tokio::CmThread`):
//! the server accepts on one task and hands each connection to a worker `tokio::spawn`ed on
//! the multi-threaded runtime, and each client is a `tokio::spawn`ed task too; no `LocalSet`.
//!
//! Prints each client's result, then `seed:` and `trace-hash:`. Options: `--clients N`,
//! `--messages M`, `--seed S` (or `CM_SIM_SEED`), `--loss PER_MILLE` (CM messages lost between
//! the server and every client), `--crash-server SECS` (the server host crashes then, and
//! restarts a second later), `--trace FILE`.

/// The application: everything below is generic over the backend and the runtime.
pub mod app {
    use std::net::SocketAddr;
    use std::time::Duration;

    use cm::app::{Cm, ConnOptions, Error, Runtime};
    use cm::CmBackend;

    /// Serves echo on `addr` until dropped: every connection in a task of its own.
    pub async fn server<B: CmBackend + 'static, R: Runtime>(
        cm: Cm<B, R>,
        addr: SocketAddr,
    ) -> Result<(), Error> {
        let listener = cm.listen(addr, ConnOptions::default())?;
        loop {
            let (conn, _hello) = listener.accept().await?;
            drop(cm.runtime().spawn(async move {
                while let Ok(msg) = conn.recv().await {
                    if conn.send(&msg).await.is_err() {
                        break;
                    }
                }
                // Whatever the peer sent after its last echo is reported here; echo drops it.
                let _ = conn.disconnect().await;
            }));
        }
    }

    /// What one client is to do.
    #[derive(Clone, Debug)]
    pub struct Plan {
        /// The server's address.
        pub server: SocketAddr,
        /// The client's number (part of each message).
        pub client: u32,
        /// Messages per connection.
        pub messages: u32,
        /// New connections tried after a transient failure.
        pub retries: u32,
        /// Bound on each send and each receive.
        pub op_timeout: Duration,
    }

    /// What one client achieved.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Report {
        /// Messages sent and echoed intact on the connection that finished.
        pub echoed: u32,
        /// Connections tried.
        pub attempts: u32,
    }

    /// A message that came back different from what was sent.
    #[derive(Clone, Debug, PartialEq, Eq)]
    pub struct Corrupted {
        /// What was sent.
        pub sent: Vec<u8>,
        /// What came back.
        pub got: Vec<u8>,
    }

    /// Connects, sends `plan.messages` messages checking each echo, disconnects; on a transient
    /// failure starts over on a new connection, at most `plan.retries` times.
    pub async fn client<B: CmBackend + 'static, R: Runtime>(
        cm: Cm<B, R>,
        plan: Plan,
    ) -> Result<Report, Error> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match session(&cm, &plan).await {
                Ok(echoed) => return Ok(Report { echoed, attempts }),
                Err(e) if e.is_transient() && attempts <= plan.retries => {
                    cm.runtime().sleep(Duration::from_millis(100) * attempts).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn session<B: CmBackend + 'static, R: Runtime>(cm: &Cm<B, R>, plan: &Plan) -> Result<u32, Error> {
        let rt = cm.runtime();
        let opts = ConnOptions {
            private_data: format!("client {}", plan.client).into_bytes(),
            ..ConnOptions::default()
        };
        let conn = cm.connect(plan.server, &opts).await?;
        for i in 0..plan.messages {
            let msg = format!("client {} message {i}", plan.client).into_bytes();
            rt.timeout(plan.op_timeout, conn.send(&msg)).await??;
            let got = rt.timeout(plan.op_timeout, conn.recv()).await??;
            assert_eq!(
                got,
                msg,
                "{:?}",
                Corrupted {
                    sent: msg.clone(),
                    got: got.clone()
                }
            );
        }
        let closed = conn.disconnect().await?;
        assert!(closed.unread.is_empty(), "echoes nobody asked for: {closed:?}");
        Ok(plan.messages)
    }
}

/// The same echo on `Send` handles: connections that move between tasks of tokio's
/// multi-threaded runtime.
#[cfg(feature = "hw")]
pub mod handoff {
    use std::time::Duration;

    use cm::app::tokio::{SendCm, SendConnection, SendListener};
    use cm::app::{ConnOptions, Error};
    use cm::CmBackend;

    use super::app::{Plan, Report};

    /// Accepts on `listener` until dropped, each connection served by a worker of its own
    /// on whichever thread the runtime picks.
    pub async fn server<B: CmBackend + 'static>(listener: SendListener<B>) -> Result<(), Error> {
        loop {
            let (conn, _hello) = listener.accept().await?;
            tokio::spawn(serve(conn));
        }
    }

    async fn serve<B: CmBackend + 'static>(conn: SendConnection<B>) {
        while let Ok(msg) = conn.recv().await {
            if conn.send(&msg).await.is_err() {
                break;
            }
        }
        let _ = conn.disconnect().await;
    }

    /// One client as `app::client` is: a session, tried again after a transient failure.
    pub async fn client<B: CmBackend + 'static>(cm: &SendCm<B>, plan: Plan) -> Result<Report, Error> {
        let mut attempts = 0;
        loop {
            attempts += 1;
            match session(cm, &plan).await {
                Ok(echoed) => return Ok(Report { echoed, attempts }),
                Err(e) if e.is_transient() && attempts <= plan.retries => {
                    tokio::time::sleep(Duration::from_millis(100) * attempts).await;
                }
                Err(e) => return Err(e),
            }
        }
    }

    async fn session<B: CmBackend + 'static>(cm: &SendCm<B>, plan: &Plan) -> Result<u32, Error> {
        let timed = |op| Error::TimedOut { op };
        let opts = ConnOptions {
            private_data: format!("client {}", plan.client).into_bytes(),
            ..ConnOptions::default()
        };
        let conn = cm.connect(plan.server, &opts).await?;
        for i in 0..plan.messages {
            let msg = format!("client {} message {i}", plan.client).into_bytes();
            tokio::time::timeout(plan.op_timeout, conn.send(&msg))
                .await
                .map_err(|_| timed("send"))??;
            let got = tokio::time::timeout(plan.op_timeout, conn.recv())
                .await
                .map_err(|_| timed("recv"))??;
            assert_eq!(got, msg, "an echo came back different");
        }
        let closed = conn.disconnect().await?;
        assert!(closed.unread.is_empty(), "echoes nobody asked for: {closed:?}");
        Ok(plan.messages)
    }
}

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use cm::app::sim::{HostOutcome, Sim};
use cm::sim::{Fault, FaultSchedule, SimFabric};

/// The echo run's settings, from the command line.
#[derive(Clone, Debug)]
pub struct Args {
    /// Number of clients.
    pub clients: u32,
    /// Messages per client.
    pub messages: u32,
    /// Seed (`None`: `CM_SIM_SEED` or a drawn one).
    pub seed: Option<u64>,
    /// Per mille of CM messages lost between the server and each client.
    pub loss: u16,
    /// When the server host crashes (it restarts a second later).
    pub crash_server: Option<Duration>,
    /// Where to write the trace.
    pub trace: Option<String>,
    /// `sim` or `hw`.
    pub backend: String,
    /// Hardware: the address the server listens on (port 7471 unless given).
    pub server: Option<String>,
    /// Hardware: run on `Send` handles, connections handed to spawned workers.
    pub handoff: bool,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        clients: 10,
        messages: 10,
        seed: None,
        loss: 0,
        crash_server: None,
        trace: None,
        backend: "sim".into(),
        server: None,
        handoff: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let bad = |e: std::num::ParseIntError| e.to_string();
        match flag.as_str() {
            "--clients" => a.clients = val()?.parse().map_err(bad)?,
            "--messages" => a.messages = val()?.parse().map_err(bad)?,
            "--seed" => a.seed = Some(cm::sim::parse_seed(&val()?).ok_or("bad seed")?),
            "--loss" => a.loss = val()?.parse().map_err(bad)?,
            "--crash-server" => a.crash_server = Some(Duration::from_secs(val()?.parse().map_err(bad)?)),
            "--trace" => a.trace = Some(val()?),
            "--backend" => a.backend = val()?,
            "--server" => a.server = Some(val()?),
            "--handoff" => a.handoff = true,
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    Ok(a)
}

/// The simulated fabric for `args`: host 0 the server, hosts 1..=N the clients.
pub fn fabric(args: &Args) -> SimFabric {
    let mut b = SimFabric::builder().host("10.0.0.1");
    for c in 0..args.clients {
        b = b.host(format!("10.0.{}.{}", 1 + (c + 2) / 250, (c + 2) % 250 + 1).as_str());
    }
    if let Some(seed) = args.seed {
        b = b.seed(seed);
    }
    let mut faults = FaultSchedule::new();
    for c in 0..args.clients as u16 {
        if args.loss > 0 {
            faults = faults.with(
                Duration::ZERO,
                Fault::Loss {
                    a: 0,
                    b: c + 1,
                    per_mille: args.loss,
                },
            );
        }
    }
    if let Some(at) = args.crash_server {
        faults = faults
            .with(at, Fault::Crash { host: 0 })
            .with(at + Duration::from_secs(1), Fault::Restart { host: 0 });
    }
    // Full traces: a failing run writes its trace file for the report.
    b.faults(faults).build()
}

/// Runs the echo application on `fabric`; each client's result by client number.
pub fn run_sim(
    fabric: &SimFabric,
    args: &Args,
) -> Result<Vec<Result<app::Report, cm::app::Error>>, cm::app::sim::SimFailure> {
    let server: SocketAddr = "10.0.0.1:7471".parse().expect("address");
    let mut sim = Sim::new(fabric.clone()).deadline(Duration::from_secs(600));
    sim.server(0, move |ctx| async move {
        app::server(ctx.cm()?, server).await?;
        Ok(app::Report {
            echoed: 0,
            attempts: 0,
        })
    });
    for c in 0..args.clients {
        let plan = app::Plan {
            server,
            client: c,
            messages: args.messages,
            retries: 5,
            op_timeout: Duration::from_secs(30),
        };
        sim.client(c as usize + 1, move |ctx| {
            let plan = plan.clone();
            async move { app::client(ctx.cm()?, plan).await }
        });
    }
    let outcomes = sim.run()?;
    Ok(outcomes
        .into_iter()
        .skip(1)
        .map(|o| match o {
            HostOutcome::Finished(r) => r,
            other => panic!("a client that did not finish: {other:?}"),
        })
        .collect())
}

#[allow(dead_code)]
fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("echo: {e}");
            return ExitCode::from(2);
        }
    };
    match args.backend.as_str() {
        "sim" => {}
        "hw" => return run_hw(&args),
        other => {
            eprintln!("echo: unknown backend {other} (sim or hw)");
            return ExitCode::from(2);
        }
    }
    let fabric = fabric(&args);
    let results = match run_sim(&fabric, &args) {
        Ok(r) => r,
        Err(failure) => {
            eprintln!("echo: {failure}");
            return ExitCode::FAILURE;
        }
    };
    let mut failed = 0;
    for (c, r) in results.iter().enumerate() {
        match r {
            Ok(rep) => println!("client {c}: {} echoed, {} attempt(s)", rep.echoed, rep.attempts),
            Err(e) => {
                failed += 1;
                println!("client {c}: {e}");
            }
        }
    }
    if let Some(path) = &args.trace {
        if let Err(e) = std::fs::write(path, fabric.trace_lines().join("\n") + "\n") {
            eprintln!("echo: {path}: {e}");
        }
    }
    println!("clients: {} ok, {failed} failed", results.len() - failed);
    println!("virtual-time: {}", fabric.now());
    println!("seed: {}", fabric.seed());
    println!("trace-hash: {:016x}", fabric.trace_hash());
    ExitCode::SUCCESS
}

/// Runs echo on the RDMA device: the application code above, on tokio.
#[cfg(feature = "hw")]
fn run_hw(args: &Args) -> ExitCode {
    let Some(server) = &args.server else {
        eprintln!("echo: --backend hw needs --server ADDR (an address of the RDMA device)");
        return ExitCode::from(2);
    };
    let server: SocketAddr = match server.parse().or_else(|_| format!("{server}:7471").parse()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("echo: --server {server}: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let run = if args.handoff {
        rt.block_on(run_handoff(args, server))
    } else {
        run_local(&rt, args, server)
    };
    let results = match run {
        Ok(r) => r,
        Err(e) => {
            eprintln!("echo: {e}");
            return ExitCode::FAILURE;
        }
    };
    let failed = results.iter().filter(|r| r.is_err()).count();
    for (c, r) in results.iter().enumerate() {
        match r {
            Ok(rep) => println!("client {c}: {} echoed, {} attempt(s)", rep.echoed, rep.attempts),
            Err(e) => println!("client {c}: {e}"),
        }
    }
    println!("clients: {} ok, {failed} failed", results.len() - failed);
    if failed > 0 {
        ExitCode::FAILURE
    } else {
        ExitCode::SUCCESS
    }
}

#[cfg(feature = "hw")]
type ClientResults = Result<Vec<Result<app::Report, cm::app::Error>>, cm::app::Error>;

/// Echo on `Send` handles: one `CmThread` drives the server's channel and the clients' one;
/// every task is `tokio::spawn`ed.
#[cfg(feature = "hw")]
async fn run_handoff(args: &Args, server: SocketAddr) -> ClientResults {
    use cm::app::tokio::CmThread;
    use cm::app::ConnOptions;
    use cm::hw::HwBackend;
    use std::sync::Arc;

    let thread = CmThread::start()?;
    let server_cm = thread.cm(|_| HwBackend::new()).await?;
    let client_cm = Arc::new(thread.cm(|_| HwBackend::new()).await?);
    let listener = server_cm.listen(server, ConnOptions::default()).await?;
    let srv = tokio::spawn(handoff::server(listener));
    let clients: Vec<_> = (0..args.clients)
        .map(|c| {
            let plan = app::Plan {
                server,
                client: c,
                messages: args.messages,
                retries: 5,
                op_timeout: Duration::from_secs(30),
            };
            let cm = client_cm.clone();
            tokio::spawn(async move { handoff::client(&cm, plan).await })
        })
        .collect();
    let mut results = Vec::new();
    for c in clients {
        results.push(c.await.expect("client task"));
    }
    srv.abort();
    let _ = srv.await;
    Ok(results)
}

/// Echo in a `LocalSet`: the application code above, generic over backend and runtime.
#[cfg(feature = "hw")]
fn run_local(rt: &tokio::runtime::Runtime, args: &Args, server: SocketAddr) -> ClientResults {
    use cm::app::tokio::TokioRuntime;
    use cm::hw::HwBackend;

    let local = tokio::task::LocalSet::new();
    local.block_on(rt, async {
        let tr = TokioRuntime::new();
        let server_cm = tr.cm(HwBackend::new()?)?;
        let client_cm = tr.cm(HwBackend::new()?)?;
        let srv = tokio::task::spawn_local(app::server(server_cm, server));
        // Every client on one event channel: the driver hands each event to its connection.
        let clients: Vec<_> = (0..args.clients)
            .map(|c| {
                let plan = app::Plan {
                    server,
                    client: c,
                    messages: args.messages,
                    retries: 5,
                    op_timeout: Duration::from_secs(30),
                };
                tokio::task::spawn_local(app::client(client_cm.clone(), plan))
            })
            .collect();
        let mut results = Vec::new();
        for c in clients {
            results.push(c.await.expect("client task"));
        }
        srv.abort();
        let _ = srv.await;
        Ok::<_, cm::app::Error>(results)
    })
}

#[cfg(not(feature = "hw"))]
fn run_hw(_: &Args) -> ExitCode {
    eprintln!("echo: --backend hw needs the hardware backend: cargo run --release --features hw --example echo -- --backend hw ...");
    ExitCode::from(2)
}
