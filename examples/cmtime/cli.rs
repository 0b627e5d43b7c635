//! cmtime's command line: parsed by clap, then checked as a whole before anything runs, so that
//! every mistake is one line on stderr and exit code 2, never a panic or a failure after the run.
//!
//! A module of its own (included by `examples/cmtime.rs` and by `tests/runners/cmtime_cli.rs`
//! with `#[path]`) because an integration test cannot run an example's binary: the test checks
//! a table of flag combinations against these functions instead.

use std::fs::File;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Parser, ValueEnum};
use cm::sim::{SimFabric, TraceMode};

/// Connections one simulated client address can carry (its ephemeral ports, with room to spare).
pub(crate) const PER_ADDRESS: usize = 20_000;

/// The most connections one run opens: every connection costs the table a few hundred bytes
/// and the simulator its ids and QPs, so a typo (`-c 1000000000`) is refused up front instead of
/// ending in an allocation failure.
pub(crate) const MAX_CONNECTIONS: u64 = 1_000_000;

/// The simulated server's address and the client's when no `--server` / `--bind` is given.
const SIM_SERVER: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1));
const SIM_CLIENT: IpAddr = IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2));

/// Which implementation of the trait runs the benchmark.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Backend {
    /// The deterministic simulator.
    Sim,
    /// librdmacm on a real device (build with `--features hw`).
    Hw,
}

/// Which ends of the benchmark this process runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq, ValueEnum)]
pub(crate) enum Role {
    /// Server and client (concurrently on hardware, interleaved on one thread on the simulator).
    Both,
    /// The server alone, like rdma-core's `cmtime` without `-s`: serves N connections, then exits.
    Server,
    /// The client alone, like rdma-core's `cmtime -s ADDR`, against another cmtime's server.
    Client,
}

/// rdma-core's cmtime written against the CmBackend trait: times each step of N connections.
#[derive(Parser, Debug)]
#[command(
    name = "cmtime",
    after_help = "rdma-core's short options (-s -b -c -p -r -t) mean what they mean there.\n\
                  Examples:\n  cmtime -c 100000 --seed 7\n  \
                  cmtime --backend hw -b 10.0.0.1 -s 10.0.0.1\n  \
                  cmtime --backend hw --role server -b 10.0.0.1"
)]
struct Args {
    /// Which implementation of the trait runs the benchmark
    #[arg(long, value_enum, default_value_t = Backend::Sim)]
    backend: Backend,
    /// Which ends this process runs (server and client alone: hw only)
    #[arg(long, value_enum, default_value_t = Role::Both)]
    role: Role,
    /// Connections to open
    #[arg(short = 'c', long, value_name = "N", default_value_t = 1000,
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONNECTIONS))]
    connections: u64,
    /// Simulator only: the seed, decimal or 0x-hex [default: CM_SIM_SEED, else drawn and printed]
    #[arg(long, value_name = "S", value_parser = parse_seed)]
    seed: Option<u64>,
    /// Client address (the server's listen address with --role server). Simulator default
    /// 10.0.0.2; past 20000 connections the simulated client gets extra addresses 10.255.x.y
    #[arg(short = 'b', long, value_name = "ADDR")]
    bind: Option<IpAddr>,
    /// Server address (needed with --backend hw unless --role server); simulator default 10.0.0.1
    #[arg(short = 's', long, value_name = "ADDR")]
    server: Option<IpAddr>,
    /// Server port
    #[arg(short = 'p', long, value_name = "P", default_value_t = 7471,
          value_parser = clap::value_parser!(u16).range(1..))]
    port: u16,
    /// Resolve timeout in milliseconds
    #[arg(short = 't', long, value_name = "MS", default_value_t = 2000,
          value_parser = clap::value_parser!(u32).range(1..))]
    timeout: u32,
    /// Resolve retries after ADDR_ERROR / ROUTE_ERROR
    #[arg(short = 'r', long, value_name = "R", default_value_t = 2)]
    retries: u32,
    /// Simulator only: write the trace, one line per event and CM message, to FILE
    #[arg(long, value_name = "FILE")]
    trace: Option<PathBuf>,
    /// Simulator only: write the trace as a Mermaid sequence diagram to FILE
    #[arg(long, value_name = "FILE")]
    trace_mermaid: Option<PathBuf>,
    /// Simulator only: after a warm-up, 5 rounds of a run of each count (e.g.
    /// 1000,100000,1000000); prints each count's median connections/s, its slowdown against the
    /// first count, and the peak RSS per connection of the largest
    #[arg(long, value_name = "N,M,..", value_delimiter = ',',
          value_parser = clap::value_parser!(u64).range(1..=MAX_CONNECTIONS))]
    scale: Option<Vec<u64>>,
}

fn parse_seed(text: &str) -> Result<u64, String> {
    cm::sim::parse_seed(text).ok_or_else(|| "not a decimal or 0x-hex 64-bit seed".to_owned())
}

/// A run's options, checked as a whole.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    pub(crate) backend: Backend,
    pub(crate) role: Role,
    pub(crate) connections: usize,
    pub(crate) seed: Option<u64>,
    pub(crate) bind: Option<IpAddr>,
    /// Where the client connects to, and where the server listens (with `--role server`:
    /// `--bind`, else `--server`, else every address, as rdma-core's server without `-b`).
    pub(crate) server: IpAddr,
    pub(crate) port: u16,
    pub(crate) timeout: Duration,
    pub(crate) retries: u32,
    pub(crate) trace: Option<PathBuf>,
    pub(crate) mermaid: Option<PathBuf>,
    /// `--scale`: the connection counts to compare.
    pub(crate) scale: Option<Vec<usize>>,
}

/// What the command line asks for.
#[derive(Debug)]
pub(crate) enum Parsed {
    /// A run.
    Run(Options),
    /// `--help`: print it on stdout and exit 0.
    Help(clap::Error),
}

/// Parses `args` (the program name first) for a build with (`hw_built`) or without the
/// hardware backend. The error is one line, for stderr and exit code 2.
pub(crate) fn parse<I, T>(args: I, hw_built: bool) -> Result<Parsed, String>
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let a = match Args::try_parse_from(args) {
        Ok(a) => a,
        Err(e) if e.kind() == clap::error::ErrorKind::DisplayHelp => return Ok(Parsed::Help(e)),
        Err(e) => return Err(one_line(&e)),
    };
    check(a, hw_built).map(Parsed::Run)
}

/// clap's message without its usage block and tips: the first line, which names the flag and
/// what is wrong with it.
fn one_line(e: &clap::Error) -> String {
    let text = e.render().to_string();
    let first = text.lines().next().unwrap_or("bad arguments");
    let first = first.strip_prefix("error: ").unwrap_or(first);
    format!("{first} (cmtime --help lists the options)")
}

fn check(a: Args, hw_built: bool) -> Result<Options, String> {
    let connections = usize::try_from(a.connections).map_err(|_| "--connections: too many".to_owned())?;
    let server = match a.backend {
        Backend::Sim => {
            if a.role != Role::Both {
                return Err("--role server|client needs --backend hw (the simulator runs both ends)".into());
            }
            a.server.unwrap_or(SIM_SERVER)
        }
        Backend::Hw => {
            if !hw_built {
                return Err("this build has no hardware backend: rebuild with `--features hw`".into());
            }
            let sim_only = [
                ("--seed", a.seed.is_some()),
                ("--trace", a.trace.is_some()),
                ("--trace-mermaid", a.trace_mermaid.is_some()),
                ("--scale", a.scale.is_some()),
            ];
            if let Some((flag, _)) = sim_only.iter().find(|(_, given)| *given) {
                return Err(format!("{flag} is for the simulator only, not --backend hw"));
            }
            match (a.role, a.server) {
                (Role::Server, _) => a.bind.or(a.server).unwrap_or(IpAddr::V4(Ipv4Addr::UNSPECIFIED)),
                (_, Some(server)) => server,
                (_, None) => {
                    return Err("--backend hw needs --server ADDR (-s), the listener's address".into())
                }
            }
        }
    };
    if let (Some(t), Some(m)) = (&a.trace, &a.trace_mermaid) {
        if t == m {
            return Err(format!("--trace and --trace-mermaid both name {}", t.display()));
        }
    }
    Ok(Options {
        backend: a.backend,
        role: a.role,
        connections,
        seed: a.seed,
        bind: a.bind,
        server,
        port: a.port,
        timeout: Duration::from_millis(a.timeout.into()),
        retries: a.retries,
        trace: a.trace,
        mermaid: a.trace_mermaid,
        // Each count was checked against MAX_CONNECTIONS, which fits a usize.
        scale: a.scale.map(|v| v.into_iter().map(|n| n as usize).collect()),
    })
}

/// The output files, opened (created or truncated) before the run so that an unwritable path
/// fails at once instead of after the whole run.
#[derive(Debug)]
pub(crate) struct Outputs {
    pub(crate) trace: Option<(PathBuf, File)>,
    pub(crate) mermaid: Option<(PathBuf, File)>,
}

/// Opens every output file `o` names; the error is one line naming the file.
pub(crate) fn open_outputs(o: &Options) -> Result<Outputs, String> {
    let open = |path: &Option<PathBuf>| -> Result<Option<(PathBuf, File)>, String> {
        path.as_deref()
            .map(|p: &Path| {
                File::create(p)
                    .map(|f| (p.to_owned(), f))
                    .map_err(|e| format!("{}: {e}", p.display()))
            })
            .transpose()
    };
    Ok(Outputs {
        trace: open(&o.trace)?,
        mermaid: open(&o.mermaid)?,
    })
}

/// The simulated client's addresses: `client` first, then as many extra ones (10.255.x.y) as
/// `connections` need ephemeral ports for, none of them the server's or the client's own.
pub(crate) fn sim_client_addrs(client: IpAddr, server: IpAddr, connections: usize) -> Vec<IpAddr> {
    let extra = connections.div_ceil(PER_ADDRESS).saturating_sub(1);
    let mut addrs = Vec::with_capacity(extra + 1);
    addrs.push(client);
    // MAX_CONNECTIONS keeps `extra` far below the 64 000 addresses this range has.
    let candidates =
        (1u32..).map(|i| IpAddr::V4(Ipv4Addr::new(10, 255, (i / 250) as u8, (i % 250 + 1) as u8)));
    addrs.extend(candidates.filter(|a| *a != client && *a != server).take(extra));
    addrs
}

/// The address connection number `c` binds to (or resolves from) among `sources`: the
/// simulator has one per [`PER_ADDRESS`] connections; on hardware every connection binds to the
/// one `--bind` address, as rdma-core's `cmtime -b` does.
pub(crate) fn source(sources: &[IpAddr], c: usize) -> Option<SocketAddr> {
    sources
        .get(c / PER_ADDRESS)
        .or(sources.last())
        .map(|ip| SocketAddr::new(*ip, 0))
}

/// The fabric `o` asks for, with the client's addresses; a bad option (`--bind 127.0.0.1`,
/// `CM_SIM_SEED=abc`) is an error to report, not a panic.
pub(crate) fn sim_fabric(o: &Options) -> Result<(SimFabric, Vec<IpAddr>), cm::sim::ConfigError> {
    let client = o.bind.unwrap_or(SIM_CLIENT);
    // cmtime listens with backlog 0 (the system maximum) and its server keeps up with the
    // requests from another thread; this one-thread version retrieves them between waits, so
    // the simulated net.rdma_ucm.max_backlog is raised to hold a whole burst.
    let backlog = u32::try_from(o.connections).unwrap_or(u32::MAX).max(1024);
    let mut builder =
        SimFabric::builder()
            .max_backlog(backlog)
            .trace(if o.trace.is_some() || o.mermaid.is_some() {
                TraceMode::Full
            } else {
                TraceMode::HashOnly
            });
    if let Some(seed) = o.seed {
        builder = builder.seed(seed);
    }
    let client_addrs = sim_client_addrs(client, o.server, o.connections);
    // One host serves both ends when the client binds the server's address.
    builder = if o.server == client {
        builder.host_with_addrs(client_addrs.iter().copied())
    } else {
        builder
            .host(o.server)
            .host_with_addrs(client_addrs.iter().copied())
    };
    Ok((builder.try_build()?, client_addrs))
}
