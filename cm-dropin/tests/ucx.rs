//! Debian 12's UCX 1.13 (`ucx-utils`, `libucx0`), unmodified, on the simulator through the
//! drop-in: `ucx_info -d` lists the simulated device with UCX's verbs transports, and
//! `ucx_perftest` runs between two simulated hosts over them.
//!
//! UCX's IB component lists a device of `ibv_get_device_list` only when its node
//! `/dev/infiniband/<dev_name>` is a character device the process may read and write (`stat`,
//! `access`), which the drop-in answers for the simulated device on a simulated host; it then
//! opens it (`ibv_open_device`, `ibv_query_device_ex`, `ibv_query_port`, the GID table), makes
//! the context's `async_fd` non-blocking and watches it, and registers memory. libmlx5's
//! `mlx5dv_is_supported` says the device is not its own, so UCX takes its plain verbs
//! transports: `rc_verbs` and `ud_verbs` on `cmsim0:1`.
//!
//! `ucx_perftest`'s server (on `10.0.0.1`, given no address) and client (given `10.0.0.1`)
//! swap their addresses over perftest's own TCP socket, which the drop-in carries between the
//! simulated hosts; the transports' QPs and messages go through the simulator.
//!
//! UCX 1.13's `ud_verbs` takes a RoCE datagram's address family from the completion's `sl`,
//! which mlx5 sets and rxe leaves 0; on rxe, as here, every RoCE v2 datagram over IPv4 is then
//! taken for IPv6 and dropped by its destination-GID check (later UCX reads the family from
//! the GRH instead: openucx/ucx pull request 10209, 2024). The
//! runs over `ud_verbs`, and UCP's wireup, which uses it as its auxiliary transport, turn
//! that check off (`UCX_UD_VERBS_ETH_DGID_CHECK=n`), as UCX on rxe needs.
//!
//! Each test skips with a message when UCX's programs are not installed (`apt-get install
//! ucx-utils`; `scripts/test-all` installs it). Every run is bounded (60 s).

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

mod common;
#[path = "common/fabric.rs"]
mod fabric;
use common::{wait, Output};
use fabric::{spawn_on, start_daemon, Fabric};

const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";
const LIMIT: Duration = Duration::from_secs(60);
const ITERS: &str = "100";
/// UCX on rxe: the datagrams' address family is not in the completion (see above).
const NO_DGID_CHECK: &str = "UCX_UD_VERBS_ETH_DGID_CHECK=n";

/// `/usr/bin/<program>`, or None with the package that brings it named.
fn installed(program: &str) -> Option<String> {
    let path = format!("/usr/bin/{program}");
    if Path::new(&path).exists() {
        Some(path)
    } else {
        eprintln!("skipped: {path} is not installed (apt-get install ucx-utils)");
        None
    }
}

/// Whether something listens on TCP `port` of this machine (`/proc/net/tcp`, state 0A): the
/// server's exchange socket, on its simulated host's loopback address.
fn tcp_listening(port: u16) -> bool {
    let want = format!(":{port:04X}");
    ["/proc/net/tcp", "/proc/net/tcp6"].iter().any(|f| {
        std::fs::read_to_string(f).is_ok_and(|t| {
            t.lines().skip(1).any(|l| {
                let cols: Vec<&str> = l.split_whitespace().collect();
                cols.len() > 3 && cols[1].ends_with(&want) && cols[3] == "0A"
            })
        })
    })
}

/// A TCP port for this test process's `n`th pair: tests of several runs may overlap.
fn port(n: u16) -> u16 {
    23_000 + (std::process::id() % 1_000) as u16 * 8 + n
}

/// `child`'s output once it exits within `limit`; else it is killed and its output so far is
/// the error.
fn within(mut child: Child, limit: Duration) -> Result<Output, Output> {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(wait(child, Duration::from_secs(10), "a killed ucx_perftest"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(wait(child, Duration::from_secs(10), "ucx_perftest"))
}

/// Runs `ucx_perftest` with `args` (and the variables `env`) as server on one simulated host
/// and client on another, on test port `n`: the client's output, after checking that both
/// sides succeeded within their bounds. None (with a message) when UCX is not installed.
fn perftest(n: u16, env: &[&str], args: &[&str]) -> Option<Output> {
    let prog = installed("ucx_perftest")?;
    let port = port(n);
    let port_s = port.to_string();
    let (socket, daemon) = start_daemon(&format!("ucx-{n}-{port}"), &[SERVER, CLIENT], 2, 120, &[]);
    // `env` runs the program with the variables, under the drop-in as cmsim-run set it up.
    let mut cmd: Vec<&str> = vec!["env"];
    cmd.extend_from_slice(env);
    cmd.extend_from_slice(&[&prog, "-n", ITERS, "-p", &port_s]);
    cmd.extend_from_slice(args);
    let server = spawn_on(&socket, SERVER, None, &cmd);
    let deadline = Instant::now() + Duration::from_secs(20);
    while !tcp_listening(port) {
        assert!(Instant::now() < deadline, "ucx_perftest did not listen on {port}");
        std::thread::sleep(Duration::from_millis(20));
    }
    cmd.push(SERVER);
    let client = spawn_on(&socket, CLIENT, None, &cmd);
    let (c, s, late) = match (within(client, LIMIT), within(server, Duration::from_secs(10))) {
        (Ok(c), Ok(s)) => (c, s, false),
        (c, s) => (c.unwrap_or_else(|o| o), s.unwrap_or_else(|o| o), true),
    };
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert!(
        !late && c.status.success() && s.status.success(),
        "ucx_perftest {args:?}: {}\nclient ({}): {}\n{}\nserver ({}): {}\n{}\ndaemon: {}",
        if late {
            "a side did not finish within its bound"
        } else {
            "a side failed"
        },
        c.status,
        c.stdout,
        c.stderr,
        s.status,
        s.stdout,
        s.stderr,
        d.stderr
    );
    assert!(
        s.stdout.contains(&format!("Accepted connection from {CLIENT}:")),
        "the server sees the client's simulated address: {}",
        s.stdout
    );
    for o in [&c, &s] {
        assert!(!o.stderr.contains("UCX  ERROR"), "{}", o.stderr);
    }
    Some(c)
}

/// The numbers of the client's `Final:` row: iterations, latency (50th percentile, average,
/// overall, µs), bandwidth (average, overall, MB/s), message rate (average, overall).
fn final_row(o: &Output) -> [f64; 8] {
    let line = o
        .stdout
        .lines()
        .find_map(|l| l.trim().strip_prefix("Final:"))
        .unwrap_or_else(|| panic!("no Final: row\n{}\n{}", o.stdout, o.stderr));
    let v: Vec<f64> = line
        .split_whitespace()
        .map(|x| x.parse().unwrap_or_else(|_| panic!("{x:?} in {line:?}")))
        .collect();
    v.try_into().unwrap_or_else(|v| panic!("8 numbers, got {v:?}"))
}

/// A latency test's row: all iterations, positive latencies, and latency × rate ≈ 1 s.
fn check_lat(o: &Output) {
    let r = final_row(o);
    assert_eq!(r[0], 100.0, "{}", o.stdout);
    assert!(r[1] > 0.0 && r[2] > 0.0 && r[3] > 0.0, "{}", o.stdout);
    let product = r[2] * r[6] / 1e6;
    assert!(
        (0.9..1.1).contains(&product),
        "latency × rate {product}: {}",
        o.stdout
    );
}

/// A bandwidth test's row: all iterations, a positive bandwidth and message rate.
fn check_bw(o: &Output) {
    let r = final_row(o);
    assert_eq!(r[0], 100.0, "{}", o.stdout);
    assert!(r[4] > 0.0 && r[5] > 0.0 && r[6] > 0.0, "{}", o.stdout);
}

#[test]
fn ucx_info_d_lists_the_simulated_device_cmsim0_1_with_rc_verbs_and_ud_verbs() {
    let Some(prog) = installed("ucx_info") else {
        return;
    };
    let fabric = Fabric::start("ucx-info", &[SERVER], 1);
    let o = fabric.run(SERVER, &[&prog, "-d"]);
    fabric.stop();
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    let lines: Vec<&str> = o.stdout.lines().map(str::trim).collect();
    assert!(
        lines.contains(&"# Memory domain: cmsim0"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
    assert!(
        !o.stdout.contains("failed to open memory domain cmsim0"),
        "{}",
        o.stdout
    );
    for tl in ["rc_verbs", "ud_verbs"] {
        let at = lines
            .iter()
            .position(|l| *l == format!("#      Transport: {tl}").trim())
            .unwrap_or_else(|| panic!("no {tl}: {}\n{}", o.stdout, o.stderr));
        assert_eq!(
            lines.get(at + 1),
            Some(&"#         Device: cmsim0:1"),
            "{}",
            o.stdout
        );
    }
    // librdmacm's connection manager is there too, over the drop-in's rdma_cm.
    assert!(lines.contains(&"# Connection manager: rdmacm"), "{}", o.stdout);
    // The only IB device is the simulated one.
    assert!(
        lines
            .iter()
            .filter_map(|l| l.strip_prefix("#         Device: "))
            .all(|d| !d.contains(':') || d == "cmsim0:1"),
        "{}",
        o.stdout
    );
    assert!(!o.stderr.contains("cmsim:"), "no refusal: {}", o.stderr);
}

#[test]
fn ucx_perftest_put_lat_runs_100_uct_rdma_writes_over_rc_verbs_between_two_hosts() {
    let Some(c) = perftest(0, &[], &["-t", "put_lat", "-d", "cmsim0:1", "-x", "rc_verbs"]) else {
        return;
    };
    check_lat(&c);
}

#[test]
fn ucx_perftest_put_bw_runs_100_uct_rdma_writes_over_rc_verbs_between_two_hosts() {
    let Some(c) = perftest(1, &[], &["-t", "put_bw", "-d", "cmsim0:1", "-x", "rc_verbs"]) else {
        return;
    };
    check_bw(&c);
}

#[test]
fn ucx_perftest_am_lat_runs_100_uct_active_messages_over_ud_verbs_between_two_hosts() {
    let Some(c) = perftest(
        2,
        &[NO_DGID_CHECK],
        &["-t", "am_lat", "-d", "cmsim0:1", "-x", "ud_verbs"],
    ) else {
        return;
    };
    check_lat(&c);
}

#[test]
fn ucx_perftest_tag_lat_runs_100_ucp_tagged_messages_over_rc_verbs_between_two_hosts() {
    // `rc_v`: rc_verbs for the data, ud_verbs as UCP's auxiliary transport for its wireup.
    let Some(c) = perftest(3, &["UCX_TLS=rc_v", NO_DGID_CHECK], &["-t", "tag_lat"]) else {
        return;
    };
    check_lat(&c);
}

#[test]
fn ucx_perftest_ucp_put_bw_runs_100_ucp_puts_over_rc_verbs_between_two_hosts() {
    let Some(c) = perftest(4, &["UCX_TLS=rc_v", NO_DGID_CHECK], &["-t", "ucp_put_bw"]) else {
        return;
    };
    check_bw(&c);
}

/// `io_demo` (ucx-utils): a UCP client and server that connect by socket address, which UCP
/// does through a connection manager; pinned to UCX's `rdmacm` one
/// (`UCX_SOCKADDR_TLS_PRIORITY=rdmacm`), it goes over the drop-in's rdma_cm. That CM makes a
/// UD QP of its own on `id->pd` for the QP number it hands the peer (rc_verbs then carries
/// the data): 100 writes, their data checked (`-q`).
#[test]
fn io_demo_connects_over_ucxs_rdmacm_connection_manager_and_checks_100_writes() {
    let Some(prog) = installed("io_demo") else {
        return;
    };
    let port = port(5);
    let port_s = port.to_string();
    let (socket, daemon) = start_daemon(&format!("ucx-io-{port}"), &[SERVER, CLIENT], 2, 120, &[]);
    let mut cmd: Vec<&str> = vec![
        "env",
        "UCX_SOCKADDR_TLS_PRIORITY=rdmacm",
        "UCX_TLS=rc_v",
        NO_DGID_CHECK,
        &prog,
        "-p",
        &port_s,
        "-i",
        "100",
        "-o",
        "write",
        "-q",
    ];
    let server = spawn_on(&socket, SERVER, None, &cmd);
    cmd.push(SERVER);
    // The server listens with an rdma_cm id on its port: the client waits for that listener.
    let listener = format!("{SERVER}:{port}");
    let client = spawn_on(&socket, CLIENT, Some(&listener), &cmd);
    let c = within(client, LIMIT)
        .unwrap_or_else(|o| panic!("io_demo's client did not finish: {}\n{}", o.stdout, o.stderr));
    // The server serves until it is stopped.
    let mut server = server;
    let _ = server.kill();
    let s = wait(server, Duration::from_secs(10), "io_demo's server");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    let all = format!(
        "client ({}): {}\n{}\nserver: {}\n{}\ndaemon: {}",
        c.status, c.stdout, c.stderr, s.stdout, s.stderr, d.stderr
    );
    assert!(c.status.success(), "{all}");
    // io_demo logs to stdout; UCX's own messages go to stderr.
    let log = format!("{}{}", c.stdout, c.stderr);
    assert!(log.contains("Connected to server [0] 10.0.0.1"), "{all}");
    // Each report counts the writes of its interval to the server: 100 in all.
    let writes: u64 = log
        .lines()
        .filter(|l| l.contains("[DEMO] total min:"))
        .filter_map(|l| {
            let w = l.split(" | ").find(|p| p.starts_with("write "))?;
            assert!(w.contains("(10.0.0.1)"), "{l}");
            w.rsplit_once("total:")?.1.trim().parse::<u64>().ok()
        })
        .sum();
    assert_eq!(writes, 100, "{all}");
    assert!(log.contains("Client exit with status 'OK'"), "{all}");
    assert!(!log.contains("UCX  ERROR"), "{all}");
    let server_log = format!("{}{}", s.stdout, s.stderr);
    assert!(
        server_log.contains(&format!("local address {SERVER}:{port} remote address {CLIENT}:")),
        "the server sees the client's simulated address: {all}"
    );
}
