//! A remote counter: one server's 8 bytes, incremented by several clients with RDMA
//! fetch-and-add, written once over any backend and runtime.
//!
//! ```text
//! cargo run --release --example counter                                  # simulator, 4 clients x 100 adds
//! cargo run --release --example counter -- --clients 8 --adds 1000 --seed 3
//! cargo run --release --features hw --example counter -- --backend hw --server 10.0.0.1
//! ```
//!
//! The server registers the counter (`LOCAL_WRITE | REMOTE_ATOMIC | REMOTE_READ`) and hands its
//! address and key to each client in the accept's private data; the clients add 1 again and
//! again, each learning the value its add replaced. The server's CPU takes no part in the
//! adds. At the end the counter must hold `clients x adds`, and the values the adds replaced
//! must be exactly `0..clients x adds`, each seen by one add: the NIC serialised them. Prints
//! `counter: V (want W)`, then `clients: N ok, M failed` (the line the lab reads), `seed:` and
//! `trace-hash:` on the simulator.

/// The application: everything below is generic over the backend and the runtime.
pub mod app {
    use std::net::SocketAddr;

    use cm::app::{Cm, ConnOptions, Error, Runtime};
    use cm::{Access, CmBackend, RemoteMr};

    /// What a connection sends when its adds are done.
    const DONE: &[u8] = b"done";

    /// Serves the counter on `addr` to `clients` connections; returns its value once every
    /// one of them said it is done.
    pub async fn server<B: CmBackend + 'static, R: Runtime>(
        cm: Cm<B, R>,
        addr: SocketAddr,
        clients: u32,
    ) -> Result<u64, Error> {
        let listener = cm.listen(addr, ConnOptions::default())?;
        let counter = listener.register(
            8,
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC | Access::REMOTE_READ,
        )?;
        let key = counter.remote().to_bytes();
        let mut done = Vec::new();
        for _ in 0..clients {
            let conn = listener.request().await?.accept_with_private_data(&key)?;
            done.push(cm.runtime().spawn(async move {
                let said = conn.recv().await;
                let _ = conn.disconnect().await;
                match said {
                    Ok(m) if m == DONE => Ok(()),
                    Ok(other) => panic!("a client said {other:?}"),
                    Err(e) => Err(e),
                }
            }));
        }
        for d in done {
            // A task dropped before it finished (the run ended) said nothing.
            d.await.unwrap_or(Err(Error::TimedOut {
                op: "a client's done",
            }))?;
        }
        counter.read_u64(0)
    }

    /// Connects to the counter at `at` and adds 1 to it `adds` times; returns the value each
    /// add replaced.
    pub async fn client<B: CmBackend + 'static, R: Runtime>(
        cm: Cm<B, R>,
        at: SocketAddr,
        adds: u32,
    ) -> Result<Vec<u64>, Error> {
        let conn = cm.connect(at, &ConnOptions::default()).await?;
        let counter = RemoteMr::from_bytes(conn.peer_private_data())
            .expect("the accept's private data names the counter")
            .start();
        let old = conn.register(8, Access::LOCAL_WRITE)?;
        let mut seen = Vec::with_capacity(adds as usize);
        for _ in 0..adds {
            seen.push(conn.fetch_add(&old, 0, counter, 1).await?);
        }
        drop(old);
        conn.send(DONE).await?;
        conn.disconnect().await?;
        Ok(seen)
    }

    /// Whether the server's final `value` and what each client's adds replaced show every add
    /// counted once: the message to print when not.
    pub fn check(value: u64, seen: &[Vec<u64>]) -> Result<(), String> {
        let mut all: Vec<u64> = seen.iter().flatten().copied().collect();
        let want = all.len() as u64;
        if value != want {
            return Err(format!("the counter holds {value}, {want} adds were made"));
        }
        all.sort_unstable();
        if all.iter().copied().ne(0..want) {
            return Err("two adds saw the same value, or one saw a value no add left".into());
        }
        Ok(())
    }
}

use std::net::SocketAddr;
use std::process::ExitCode;
use std::time::Duration;

use cm::app::sim::{HostOutcome, Sim};
use cm::sim::SimFabric;

struct Args {
    clients: u32,
    adds: u32,
    seed: Option<u64>,
    backend: String,
    server: Option<String>,
}

fn parse_args() -> Result<Args, String> {
    let mut a = Args {
        clients: 4,
        adds: 100,
        seed: None,
        backend: "sim".into(),
        server: None,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        let mut val = || it.next().ok_or(format!("{flag} needs a value"));
        let bad = |e: std::num::ParseIntError| e.to_string();
        match flag.as_str() {
            "--clients" => a.clients = val()?.parse().map_err(bad)?,
            "--adds" => a.adds = val()?.parse().map_err(bad)?,
            "--seed" => a.seed = Some(cm::sim::parse_seed(&val()?).ok_or("bad seed")?),
            "--backend" => a.backend = val()?,
            "--server" => a.server = Some(val()?),
            _ => return Err(format!("unknown option {flag}")),
        }
    }
    if a.clients == 0 {
        return Err("--clients must be at least 1".into());
    }
    Ok(a)
}

/// Prints the verdict; the exit code.
fn report(
    value: Result<u64, String>,
    seen: Vec<Result<Vec<u64>, String>>,
    clients: u32,
    adds: u32,
) -> ExitCode {
    let failed = seen.iter().filter(|r| r.is_err()).count();
    for (c, r) in seen.iter().enumerate() {
        if let Err(e) = r {
            println!("client {c}: {e}");
        }
    }
    let verdict = match (&value, failed) {
        (Ok(v), 0) => {
            let ok: Vec<Vec<u64>> = seen.into_iter().map(|r| r.expect("none failed")).collect();
            println!("counter: {v} (want {})", u64::from(clients) * u64::from(adds));
            app::check(*v, &ok)
        }
        (Err(e), _) => Err(format!("server: {e}")),
        (Ok(_), _) => Err("clients failed".into()),
    };
    let bad = failed + usize::from(verdict.is_err() && failed == 0);
    if let Err(e) = &verdict {
        println!("counter: {e}");
    }
    println!(
        "clients: {} ok, {bad} failed",
        clients as usize - bad.min(clients as usize)
    );
    if verdict.is_ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

fn run_sim(args: &Args) -> ExitCode {
    let mut b = SimFabric::builder().host("10.0.0.1");
    for c in 0..args.clients {
        b = b.host(format!("10.0.{}.{}", 1 + (c + 2) / 250, (c + 2) % 250 + 1).as_str());
    }
    if let Some(seed) = args.seed {
        b = b.seed(seed);
    }
    let fabric = b.build();
    let at: SocketAddr = "10.0.0.1:7471".parse().expect("address");
    let (clients, adds) = (args.clients, args.adds);
    // The server is run as a client host too: the run waits for its count.
    let mut sim = Sim::new(fabric.clone()).deadline(Duration::from_secs(600));
    sim.client(0, move |ctx| async move {
        app::server(ctx.cm()?, at, clients).await.map(|v| vec![v])
    });
    for c in 0..clients {
        sim.client(c as usize + 1, move |ctx| async move {
            app::client(ctx.cm()?, at, adds).await
        });
    }
    let outcomes = match sim.run() {
        Ok(o) => o,
        Err(failure) => {
            eprintln!("counter: {failure}");
            return ExitCode::FAILURE;
        }
    };
    let mut results = outcomes.into_iter().map(|o| match o {
        HostOutcome::Finished(r) => r.map_err(|e| e.to_string()),
        other => Err(format!("did not finish: {other:?}")),
    });
    let value = results.next().expect("the server").map(|v| v[0]);
    let code = report(value, results.collect(), clients, adds);
    println!("virtual-time: {}", fabric.now());
    println!("seed: {}", fabric.seed());
    println!("trace-hash: {:016x}", fabric.trace_hash());
    code
}

/// The counter on the RDMA device, on tokio: server and clients in one process, each side
/// with its own event channel.
#[cfg(feature = "hw")]
fn run_hw(args: &Args) -> ExitCode {
    use cm::app::tokio::TokioRuntime;
    use cm::hw::HwBackend;

    let Some(server) = &args.server else {
        eprintln!("counter: --backend hw needs --server ADDR (an address of the RDMA device)");
        return ExitCode::from(2);
    };
    let at: SocketAddr = match server.parse().or_else(|_| format!("{server}:7472").parse()) {
        Ok(a) => a,
        Err(e) => {
            eprintln!("counter: --server {server}: {e}");
            return ExitCode::from(2);
        }
    };
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("tokio runtime");
    let local = tokio::task::LocalSet::new();
    let (clients, adds) = (args.clients, args.adds);
    let run = local.block_on(&rt, async {
        let tr = TokioRuntime::new();
        let server_cm = tr.cm(HwBackend::new()?)?;
        let client_cm = tr.cm(HwBackend::new()?)?;
        let srv = tokio::task::spawn_local(app::server(server_cm, at, clients));
        let tasks: Vec<_> = (0..clients)
            .map(|_| tokio::task::spawn_local(app::client(client_cm.clone(), at, adds)))
            .collect();
        let mut seen = Vec::new();
        for t in tasks {
            seen.push(t.await.expect("client task").map_err(|e| e.to_string()));
        }
        let value = srv.await.expect("server task").map_err(|e| e.to_string());
        Ok::<_, cm::app::Error>((value, seen))
    });
    match run {
        Ok((value, seen)) => report(value, seen, clients, adds),
        Err(e) => {
            eprintln!("counter: {e}");
            ExitCode::FAILURE
        }
    }
}

#[cfg(not(feature = "hw"))]
fn run_hw(_: &Args) -> ExitCode {
    eprintln!("counter: --backend hw needs the hardware backend: cargo run --release --features hw --example counter -- --backend hw ...");
    ExitCode::from(2)
}

fn main() -> ExitCode {
    let args = match parse_args() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("counter: {e}");
            return ExitCode::from(2);
        }
    };
    match args.backend.as_str() {
        "sim" => run_sim(&args),
        "hw" => run_hw(&args),
        other => {
            eprintln!("counter: unknown backend {other} (sim or hw)");
            ExitCode::from(2)
        }
    }
}
