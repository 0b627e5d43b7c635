//! Verbs QPs no id owns, through the drop-in: C programs that make their QPs with
//! `ibv_create_qp` and move them with `ibv_modify_qp`, as `ibv_rc_pingpong` and perftest do,
//! and an rdma_cm pair that connects such QPs with `rdma_init_qp_attr` and `rdma_establish`, as
//! rdma-core v52's cmtime does. Every wait is bounded; a test skips (with a message) where no C
//! compiler or rdma-core headers are installed.

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Child, ChildStdout};
use std::sync::mpsc;
use std::time::Duration;

mod common;
use common::{wait, Output};
#[path = "common/fabric.rs"]
mod fabric;
use fabric::{compile_c, spawn_on as spawn, start_daemon};

const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";
const LIMIT: Duration = Duration::from_secs(60);

/// The lines of `out`, as they come, on a channel.
fn lines(out: ChildStdout) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The first line of `rx` within the bound; panics with what the program said otherwise.
fn first_line(rx: &mpsc::Receiver<String>, child: Child, what: &str) -> (String, Child) {
    match rx.recv_timeout(Duration::from_secs(30)) {
        Ok(l) => (l, child),
        Err(_) => {
            let o = wait(child, Duration::from_secs(10), what);
            panic!("{what} printed no line: {}{}", o.stdout, o.stderr);
        }
    }
}

/// Waits for `child` (whose stdout `rx` carries), then its stdout's lines.
fn finish(child: Child, rx: mpsc::Receiver<String>, what: &str) -> (Output, Vec<String>) {
    let o = wait(child, LIMIT, what);
    (o, rx.try_iter().collect())
}

/// What a relayed pair left: each one's first line, exit and later lines, and the daemon's exit.
struct Relayed {
    server_line: String,
    client_line: String,
    server: (Output, Vec<String>),
    client: (Output, Vec<String>),
    daemon: Output,
}

/// Runs `server` and `client` on a fabric of their own, each telling its QP with its first line
/// on stdout and learning the other's on stdin, the test relaying the two lines as
/// `ibv_rc_pingpong`'s TCP connection would.
fn relayed(name: &str, server: &[&str], client: &[&str]) -> Relayed {
    let (socket, daemon) = start_daemon(name, &[SERVER, CLIENT], 2, 120, &[]);
    let mut server = spawn(&socket, SERVER, None, server);
    let mut client = spawn(&socket, CLIENT, None, client);
    let (srx, crx) = (
        lines(server.stdout.take().expect("piped")),
        lines(client.stdout.take().expect("piped")),
    );
    let (server_line, mut server) = first_line(&srx, server, "server");
    let (client_line, mut client) = first_line(&crx, client, "client");
    writeln!(server.stdin.as_mut().expect("piped"), "{client_line}").expect("tell the server");
    writeln!(client.stdin.as_mut().expect("piped"), "{server_line}").expect("tell the client");
    let server = finish(server, srx, "server");
    let client = finish(client, crx, "client");
    let daemon = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    Relayed {
        server_line,
        client_line,
        server,
        client,
        daemon,
    }
}

#[test]
fn a_verbs_rc_ping_pong_exchanges_qp_numbers_out_of_band_and_its_messages_arrive() {
    let Some(program) = compile_c("vpingpong", &["rdmacm", "ibverbs"]) else {
        return;
    };
    let prog = program.path();
    let r = relayed("vpingpong", &[&prog, "server", "20"], &[&prog, "client", "20"]);
    let (sline, cline) = (&r.server_line, &r.client_line);
    for line in [sline, cline] {
        assert!(
            line.starts_with("QP ") && line.contains(" PSN ") && line.contains(" GID "),
            "{line}"
        );
    }
    // The GIDs are the hosts' IPv4 addresses mapped into IPv6.
    assert!(sline.ends_with("00000000000000000000ffff0a000001"), "{sline}");
    assert!(cline.ends_with("00000000000000000000ffff0a000002"), "{cline}");
    assert_ne!(sline[3..9], cline[3..9], "two QP numbers");
    let ((s, s_out), (c, c_out)) = (&r.server, &r.client);
    assert_eq!(s_out, &["vpingpong: ok 20"], "server: {}", s.stderr);
    assert_eq!(c_out, &["vpingpong: ok 20"], "client: {}", c.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(r.daemon.status.success(), "daemon: {}", r.daemon.stderr);
}

#[test]
fn ud_verbs_qps_exchange_datagrams_through_address_handles() {
    let Some(program) = compile_c("vud", &["rdmacm", "ibverbs"]) else {
        return;
    };
    let prog = program.path();
    let r = relayed("vud", &[&prog, "server"], &[&prog, "client"]);
    let ((s, s_out), (c, c_out)) = (&r.server, &r.client);
    assert_eq!(s_out, &["vud: ok"], "server: {} {}", r.server_line, s.stderr);
    assert_eq!(c_out, &["vud: ok"], "client: {} {}", r.client_line, c.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(r.daemon.status.success(), "daemon: {}", r.daemon.stderr);
}

#[test]
fn a_peer_that_never_connects_its_qp_makes_the_send_end_retry_exceeded() {
    let Some(program) = compile_c("vpingpong", &["rdmacm", "ibverbs"]) else {
        return;
    };
    let prog = program.path();
    let (socket, daemon) = start_daemon("vpingpong-lost", &[SERVER, CLIENT], 1, 120, &[]);
    let mut client = spawn(&socket, CLIENT, None, &[&prog, "client", "1"]);
    let crx = lines(client.stdout.take().expect("piped"));
    let (_, mut client) = first_line(&crx, client, "client");
    // A QP number nobody has on the server's host.
    writeln!(
        client.stdin.as_mut().expect("piped"),
        "QP 00abcd PSN 000001 GID 00000000000000000000ffff0a000001"
    )
    .expect("tell the client");
    let (c, c_out) = finish(client, crx, "client");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert_eq!(
        c_out,
        ["vpingpong: completion transport retry counter exceeded for wr 2"],
        "client: {}",
        c.stderr
    );
    assert!(!c.status.success());
    assert!(d.status.success(), "daemon: {}", d.stderr);
}

#[test]
fn two_verbs_qps_drain_one_srq_and_its_refusals_are_rxes() {
    let Some(program) = compile_c("vsrq", &["ibverbs"]) else {
        return;
    };
    let (socket, daemon) = start_daemon("vsrq", &[SERVER], 1, 120, &[]);
    let child = spawn(&socket, SERVER, None, &[&program.path()]);
    let o = wait(child, LIMIT, "vsrq");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert_eq!(o.stdout.trim_end(), "vsrq: ok", "stderr: {}", o.stderr);
    assert!(o.status.success());
    // Each EOPNOTSUPP says why on stderr.
    for refused in [
        "ibv_create_srq: an srq_limit (asynchronous events) is not supported on the simulator (EOPNOTSUPP)",
        "ibv_modify_srq: resizing an SRQ or arming its limit (asynchronous events) is not supported",
    ] {
        assert!(o.stderr.contains(refused), "{refused} in: {}", o.stderr);
    }
    assert!(d.status.success(), "daemon: {}", d.stderr);
}

#[test]
fn an_rdma_cm_pair_connects_its_own_qps_with_init_qp_attr_and_establish() {
    let Some(program) = compile_c("extqp", &["rdmacm", "ibverbs"]) else {
        return;
    };
    let prog = program.path();
    let (socket, daemon) = start_daemon("extqp", &[SERVER, CLIENT], 2, 120, &[]);
    let server = spawn(&socket, SERVER, None, &[&prog, "server", SERVER]);
    let client = spawn(&socket, CLIENT, Some("10.0.0.1:7471"), &[&prog, "client", SERVER]);
    let c = wait(client, LIMIT, "client");
    let s = wait(server, LIMIT, "server");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert_eq!(c.stdout, "extqp: ok\n", "client: {}", c.stderr);
    assert_eq!(s.stdout, "extqp: ok\n", "server: {}", s.stderr);
    assert!(c.status.success() && s.status.success());
    assert!(d.status.success(), "daemon: {}", d.stderr);
}

#[test]
fn rping_with_its_own_qp_pings_with_rdma_read_and_write_and_validates_the_data() {
    if !Path::new("/usr/bin/rping").exists() {
        eprintln!("skipped: /usr/bin/rping is not installed (apt-get install rdmacm-utils)");
        return;
    }
    // `-q`: rping makes its QP with ibv_create_qp, moves it with rdma_init_qp_attr and
    // ibv_modify_qp, and names it in conn_param.qp_num; the server RDMA READs the client's
    // ping and WRITEs it back, which -V checks every time.
    let trace = std::env::temp_dir().join(format!("cmsim-rping-q-{}.trace", std::process::id()));
    let trace_arg = trace.to_str().expect("utf-8 path");
    let (socket, daemon) = start_daemon("rping-q", &[SERVER, CLIENT], 2, 120, &["--trace", trace_arg]);
    let common = ["-q", "-a", SERVER, "-p", "7471", "-C", "20", "-S", "1000", "-v"];
    let server_args: Vec<&str> = ["rping", "-s"].into_iter().chain(common).collect();
    let client_args: Vec<&str> = ["rping", "-c", "-V"].into_iter().chain(common).collect();
    let server = spawn(&socket, SERVER, None, &server_args);
    let client = spawn(&socket, CLIENT, Some("10.0.0.1:7471"), &client_args);
    let c = wait(client, LIMIT, "rping client");
    let s = wait(server, LIMIT, "rping server");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert!(c.status.success(), "client: {}\n{}", c.stdout, c.stderr);
    assert!(s.status.success(), "server: {}\n{}", s.stdout, s.stderr);
    assert!(d.status.success(), "daemon: {}", d.stderr);
    let pings: Vec<&str> = c
        .stdout
        .lines()
        .filter(|l| l.starts_with("ping data: rdma-ping-"))
        .collect();
    assert_eq!(pings.len(), 20, "{}", c.stdout);
    assert!(
        pings[19].starts_with("ping data: rdma-ping-19: TUVWXYZ"),
        "{}",
        pings[19]
    );
    assert!(
        !c.stderr.contains("mismatch") && !c.stdout.contains("mismatch"),
        "{}",
        c.stderr
    );
    // The READs and WRITEs went through the simulator, between the two verbs QPs.
    let lines = std::fs::read_to_string(&trace).expect("the trace");
    let _ = std::fs::remove_file(&trace);
    for op in ["RDMA_READ", "RDMA_WRITE"] {
        let step = format!("{op} completed with {CLIENT} status=0");
        let n = lines
            .lines()
            .filter(|l| l.contains(&format!(" {SERVER} ")) && l.ends_with(&step))
            .count();
        assert_eq!(n, 20, "{step}:\n{lines}");
    }
}

/// Whether something listens on TCP `port` of this machine (`/proc/net/tcp`, state 0A).
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

/// Runs Debian's `program` (`ibv_rc_pingpong` or `ibv_ud_pingpong`), unmodified, as server on
/// one simulated host and client on the other. Their QP numbers, PSNs and GIDs go over their
/// own TCP connection, the client told the server's simulated address (the drop-in puts each
/// simulated host's sockets on a loopback address of its own); the QPs, and every message, are
/// the simulator's.
fn debian_pingpong(program: &str, port: u16, extra: &[&str]) -> Option<(Output, Output)> {
    let path = format!("/usr/bin/{program}");
    if !Path::new(&path).exists() {
        eprintln!("skipped: {path} is not installed (apt-get install ibverbs-utils)");
        return None;
    }
    // Two tests run ibv_rc_pingpong at once: the port tells their daemons' sockets apart.
    let (socket, daemon) = start_daemon(&format!("{program}-{port}"), &[SERVER, CLIENT], 2, 120, &[]);
    let port = port.to_string();
    let args: Vec<&str> = ["-g", "1", "-n", "200", "-p", &port]
        .into_iter()
        .chain(extra.iter().copied())
        .collect();
    let server_args: Vec<&str> = std::iter::once(program).chain(args.iter().copied()).collect();
    let server = spawn(&socket, SERVER, None, &server_args);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while !tcp_listening(port.parse().expect("a port")) {
        assert!(
            std::time::Instant::now() < deadline,
            "{program} did not listen on {port}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    let client_args: Vec<&str> = std::iter::once(program)
        .chain(args.iter().copied())
        .chain([SERVER])
        .collect();
    let client = spawn(&socket, CLIENT, None, &client_args);
    let c = wait(client, LIMIT, "client");
    let s = wait(server, LIMIT, "server");
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert!(d.status.success(), "daemon: {}", d.stderr);
    Some((s, c))
}

/// A TCP port for this test process's `n`th pair: tests of several runs may overlap.
fn port(n: u16) -> u16 {
    20_000 + (std::process::id() % 10_000) as u16 * 3 + n
}

#[test]
fn debians_ibv_rc_pingpong_runs_200_round_trips_over_standalone_rc_qps() {
    let Some((s, c)) = debian_pingpong("ibv_rc_pingpong", port(0), &[]) else {
        return;
    };
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("200 iters in"), "{who}: {}", o.stdout);
    }
    assert!(s.stdout.contains("GID ::ffff:10.0.0.1"), "{}", s.stdout);
    assert!(c.stdout.contains("remote address: LID 0x0000"), "{}", c.stdout);
}

#[test]
fn debians_ibv_ud_pingpong_runs_200_round_trips_over_standalone_ud_qps() {
    let Some((s, c)) = debian_pingpong("ibv_ud_pingpong", port(1), &[]) else {
        return;
    };
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("200 iters in"), "{who}: {}", o.stdout);
    }
}

#[test]
fn debians_ibv_rc_pingpong_waits_on_completion_events_with_100_kb_messages() {
    // -e: each round waits in ibv_get_cq_event, re-arms and polls once for two completions,
    // more than one reply of the daemon's holds at this size.
    let Some((s, c)) = debian_pingpong("ibv_rc_pingpong", port(2), &["-e", "-s", "100000"]) else {
        return;
    };
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(o.stdout.contains("40000000 bytes in"), "{who}: {}", o.stdout);
    }
}

/// N and S of the line of `out` (an `ibv_*_pingpong`'s) that reads `"N bytes in S seconds
/// = ..."` (`unit` "bytes") or `"N iters in S seconds = ..."` (`unit` "iters").
fn summary(out: &str, unit: &str) -> Option<(u64, f64)> {
    out.lines().find_map(|l| {
        let mut w = l.split_whitespace();
        let n = w.next()?.parse().ok()?;
        (w.next()? == unit && w.next()? == "in").then_some(())?;
        let secs = w.next()?.parse().ok()?;
        (w.next()? == "seconds").then_some((n, secs))
    })
}

/// The QP numbers `out` lists after `which` (`"local"` or `"remote"`) address lines.
fn qpns<'a>(out: &'a str, which: &str) -> Vec<&'a str> {
    let head = format!("{which} address:");
    out.lines()
        .filter_map(|l| l.trim_start().strip_prefix(&head))
        .filter_map(|l| l.split("QPN ").nth(1)?.split(',').next())
        .collect()
}

/// Runs Debian's `ibv_srq_pingpong` with `extra` on the simulator and checks what both sides
/// print: `qps` QPs each side, the peer's numbers as it made them, and the summary of 200
/// iterations of `size`-byte messages both ways.
fn srq_pingpong(n: u16, extra: &[&str], qps: usize, size: u64) {
    let Some((s, c)) = debian_pingpong("ibv_srq_pingpong", port(n), extra) else {
        return;
    };
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        let (local, remote) = (qpns(&o.stdout, "local"), qpns(&o.stdout, "remote"));
        assert_eq!((local.len(), remote.len()), (qps, qps), "{who}: {}", o.stdout);
        let (bytes, secs) = summary(&o.stdout, "bytes").unwrap_or_else(|| panic!("{who}: {}", o.stdout));
        assert_eq!(bytes, 2 * 200 * size, "{who}: {}", o.stdout);
        assert!(secs >= 0.0, "{who}: {}", o.stdout);
        let (iters, _) = summary(&o.stdout, "iters").unwrap_or_else(|| panic!("{who}: {}", o.stdout));
        assert_eq!(iters, 200, "{who}: {}", o.stdout);
        // What it says when a completion names a QP it lacks or carries other bytes.
        for bad in ["Couldn't", "invalid data", "Failed status", "unknown"] {
            assert!(
                !o.stdout.contains(bad) && !o.stderr.contains(bad),
                "{who}: {}{}",
                o.stdout,
                o.stderr
            );
        }
    }
    // Each side's QPs are the ones the other connected to.
    assert_eq!(qpns(&s.stdout, "local"), qpns(&c.stdout, "remote"));
    assert_eq!(qpns(&c.stdout, "local"), qpns(&s.stdout, "remote"));
    assert!(s.stdout.contains("GID ::ffff:10.0.0.1"), "{}", s.stdout);
    assert!(c.stdout.contains("GID ::ffff:10.0.0.2"), "{}", c.stdout);
}

#[test]
fn debians_ibv_srq_pingpong_runs_16_qps_on_one_shared_receive_queue_for_200_iterations() {
    // Its default: 16 RC QPs each side, all taking their receives from one SRQ of 500, whose
    // completions it sorts back to their QPs by qp_num (an unknown one ends the run).
    srq_pingpong(3, &[], 16, 4096);
}

#[test]
fn debians_ibv_srq_pingpong_runs_4_qps_on_a_shallow_srq_with_completion_events() {
    // -r 8: the SRQ runs nearly dry and is refilled as its receives complete; -e: it sleeps
    // on completion events; -c: its own check of the buffer (too weak to see bytes landing in
    // the wrong buffer: two_verbs_qps_drain_one_srq_and_its_refusals_are_rxes checks those).
    srq_pingpong(4, &["-q", "4", "-r", "8", "-s", "1000", "-c", "-e"], 4, 1000);
}
