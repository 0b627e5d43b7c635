//! The programs' own kernel sockets between simulated hosts (what `ibv_rc_pingpong`, perftest
//! and qperf keep beside RDMA): `tests/c/side.c` on two hosts of a fabric, through
//! `cmsim-run`, meets at the simulated addresses over TCP and UDP and sees simulated
//! addresses in every address it reads; what the kernel answers (a refused connect, an address
//! that is not the host's) stays the kernel's answer.
//!
//! qperf, unmodified, measures TCP and UDP between two hosts the same way.
//!
//! Each test skips with a message when the C program cannot be compiled or qperf is not
//! installed (`apt-get install qperf`; `scripts/test-all` installs it). Every wait is bounded:
//! the C program gives up after 20 s (alarm) and a hung program is killed.

use std::process::Child;
use std::time::Duration;

mod common;
#[path = "common/fabric.rs"]
mod fabric;
use common::{wait, Output};
use fabric::{compile_c, Fabric};

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";
const C6: &str = "fd00::3";

fn finish(child: Child, what: &str) -> Output {
    let o = wait(child, Duration::from_secs(30), what);
    assert!(o.status.success(), "{what} failed: {}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.is_empty(), "{what} stderr: {}", o.stderr);
    o
}

/// The address after `prefix` on the first line that starts with it.
fn after<'a>(out: &'a str, prefix: &str) -> &'a str {
    out.lines()
        .find_map(|l| l.strip_prefix(prefix))
        .unwrap_or_else(|| panic!("no line {prefix:?} in\n{out}"))
}

/// A TCP server on `server_host` bound to `bind`, and a client on `client_host` connecting to
/// `target`: the server's and the client's output.
fn tcp_pair(
    prog: &str,
    name: &str,
    server_host: &str,
    bind: &str,
    client_host: &str,
    target: &str,
    port: u16,
) -> (Output, Output) {
    let fabric = Fabric::start(name, &[A, B, C6], 2);
    let port = port.to_string();
    let server = fabric.spawn(server_host, &[prog, "tcp-server", bind, &port]);
    let client = fabric.spawn(client_host, &[prog, "tcp-client", target, &port]);
    let c = finish(client, "client");
    let s = finish(server, "server");
    fabric.stop();
    (s, c)
}

#[test]
fn a_tcp_client_on_one_host_reaches_a_server_bound_to_another_hosts_address_and_both_see_simulated_addresses()
{
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let (s, c) = tcp_pair(&prog.path(), "side-tcp", A, A, B, A, 17101);
    assert_eq!(after(&s.stdout, "listening "), "10.0.0.1:17101");
    let client_local = after(&c.stdout, "client local ");
    let (local, peer) = client_local.split_once(" peer ").expect("two addresses");
    assert!(local.starts_with("10.0.0.2:"), "{}", c.stdout);
    assert_eq!(peer, "10.0.0.1:17101");
    assert_eq!(
        after(&s.stdout, "accepted "),
        local,
        "accept's address is the client's"
    );
    assert_eq!(
        after(&s.stdout, "server local "),
        format!("10.0.0.1:17101 peer {local}")
    );
    assert_eq!(after(&c.stdout, "got "), "pong");
}

#[test]
fn a_server_bound_to_inaddr_any_is_reached_at_its_hosts_simulated_address() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let (s, c) = tcp_pair(&prog.path(), "side-any", A, "any", B, A, 17102);
    // Bound to the host's loopback address, read as the kernel says for INADDR_ANY.
    assert_eq!(after(&s.stdout, "listening "), "0.0.0.0:17102");
    // The accepted connection's own address is the host's, as on a real host.
    assert!(
        after(&s.stdout, "server local ").starts_with("10.0.0.1:17102 peer 10.0.0.2:"),
        "{}",
        s.stdout
    );
    assert!(
        after(&s.stdout, "accepted ").starts_with("10.0.0.2:"),
        "{}",
        s.stdout
    );
    assert_eq!(after(&c.stdout, "got "), "pong");
}

#[test]
fn servers_on_two_hosts_listen_on_one_port_and_each_client_reaches_the_other_host() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let prog = prog.path();
    let fabric = Fabric::start("side-port", &[A, B], 4);
    let servers = [A, B].map(|h| fabric.spawn(h, &[&prog, "tcp-server", "any", "17103"]));
    let clients = [(B, A), (A, B)].map(|(from, to)| fabric.spawn(from, &[&prog, "tcp-client", to, "17103"]));
    let [ca, cb] = clients.map(|c| finish(c, "client"));
    let [sa, sb] = servers.map(|s| finish(s, "server"));
    fabric.stop();
    assert!(
        after(&ca.stdout, "client local ").ends_with(" peer 10.0.0.1:17103"),
        "{}",
        ca.stdout
    );
    assert!(
        after(&cb.stdout, "client local ").ends_with(" peer 10.0.0.2:17103"),
        "{}",
        cb.stdout
    );
    assert!(
        after(&sa.stdout, "accepted ").starts_with("10.0.0.2:"),
        "{}",
        sa.stdout
    );
    assert!(
        after(&sb.stdout, "accepted ").starts_with("10.0.0.1:"),
        "{}",
        sb.stdout
    );
}

fn udp_pair(name: &str, client_mode: &str, port: &str) {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let prog = prog.path();
    let fabric = Fabric::start(name, &[A, B], 2);
    let server = fabric.spawn(A, &[&prog, "udp-server", A, port]);
    let client = fabric.spawn(B, &[&prog, client_mode, A, port]);
    let c = finish(client, "udp client");
    let s = finish(server, "udp server");
    fabric.stop();
    assert_eq!(after(&s.stdout, "bound "), format!("10.0.0.1:{port}"));
    let from = after(&s.stdout, "datagram from ");
    assert!(from.starts_with("10.0.0.2:"), "{}", s.stdout);
    assert_eq!(after(&c.stdout, "answer from "), format!("10.0.0.1:{port}"));
    // The unbound client was bound to its own host before its first datagram.
    assert_eq!(after(&c.stdout, "client local "), from);
}

#[test]
fn a_udp_datagram_and_its_answer_carry_the_simulated_addresses() {
    udp_pair("side-udp", "udp-client", "17104");
}

#[test]
fn datagrams_sent_with_sendmmsg_and_received_with_recvmmsg_carry_the_simulated_addresses() {
    udp_pair("side-mmsg", "udp-mmsg-client", "17109");
}

#[test]
fn an_ipv6_host_is_reached_from_a_dual_stack_socket_through_its_simulated_address() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let (s, c) = tcp_pair(&prog.path(), "side-v6", C6, "any6", B, C6, 17105);
    assert_eq!(after(&s.stdout, "listening "), "[::]:17105");
    assert!(
        after(&s.stdout, "server local ").starts_with("[fd00::3]:17105 peer "),
        "{}",
        s.stdout
    );
    let client_local = after(&c.stdout, "client local ");
    let (local, peer) = client_local.split_once(" peer ").expect("two addresses");
    // An IPv4 host seen from an AF_INET6 socket: its v4-mapped address.
    assert!(local.starts_with("[::ffff:10.0.0.2]:"), "{}", c.stdout);
    assert_eq!(peer, "[fd00::3]:17105");
    assert_eq!(after(&s.stdout, "accepted "), local);
}

#[test]
fn the_kernels_answers_stay_refused_connect_and_another_hosts_address_and_v6only_are_said() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let prog = prog.path();
    let fabric = Fabric::start("side-refused", &[A, B, C6], 3);
    let refused = fabric.run(B, &[&prog, "refused", A, "17106"]);
    assert_eq!(refused.stdout, "connect: ECONNREFUSED\n", "{}", refused.stderr);
    assert!(refused.stderr.is_empty(), "{}", refused.stderr);
    let other = fabric.run(B, &[&prog, "bind", A, "17106"]);
    assert_eq!(other.stdout, "bind: EADDRNOTAVAIL\n", "{}", other.stderr);
    assert!(other.stderr.is_empty(), "{}", other.stderr);
    let v6only = fabric.run(C6, &[&prog, "bind-v6only", C6, "17106"]);
    assert_eq!(v6only.stdout, "bind: EADDRNOTAVAIL\n", "{}", v6only.stderr);
    assert!(v6only.stderr.contains("IPV6_V6ONLY"), "{}", v6only.stderr);
    fabric.stop();
}

#[test]
fn addresses_that_are_not_simulated_pass_through_untouched() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    // The machine's other loopback addresses are one for all hosts: the pair meets there as
    // without the drop-in, and sees them.
    let (s, c) = tcp_pair(&prog.path(), "side-lo", A, "127.0.0.2", B, "127.0.0.2", 17107);
    assert_eq!(after(&s.stdout, "listening "), "127.0.0.2:17107");
    // The kernel's own source for an unbound socket (127.0.0.1), not a host's.
    assert!(
        after(&s.stdout, "accepted ").starts_with("127.0.0.1:"),
        "{}",
        s.stdout
    );
    assert!(
        after(&c.stdout, "client local ").ends_with(" peer 127.0.0.2:17107"),
        "{}",
        c.stdout
    );
}

#[test]
fn localhost_is_each_hosts_own_and_reaches_its_wildcard_listener() {
    // libfabric's name server listens on INADDR_ANY and is woken by a connection to
    // localhost from its own process, as on a real host.
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let prog = prog.path();
    let (s, c) = tcp_pair(&prog, "side-localhost", A, "any", A, "127.0.0.1", 17109);
    assert_eq!(after(&s.stdout, "listening "), "0.0.0.0:17109");
    assert_eq!(after(&c.stdout, "got "), "pong");
    let (s6, c6) = tcp_pair(&prog, "side-localhost6", A, "any6", A, "::1", 17110);
    assert_eq!(after(&s6.stdout, "listening "), "[::]:17110");
    assert_eq!(after(&c6.stdout, "got "), "pong");
    // Another host's localhost is its own, where nothing listens.
    let fabric = Fabric::start("side-localhost-apart", &[A, B, C6], 2);
    let mut server = fabric.spawn(A, &[&prog, "tcp-server", "any", "17111"]);
    // Its first line says it listens (side.c exits within 20 s whatever happens, so the read
    // ends).
    let mut listening = String::new();
    let mut out = std::io::BufReader::new(server.stdout.take().expect("piped"));
    std::io::BufRead::read_line(&mut out, &mut listening).expect("read the server's stdout");
    assert_eq!(listening, "listening 0.0.0.0:17111\n");
    let refused = fabric.run(B, &[&prog, "refused", "127.0.0.1", "17111"]);
    // The server is then reached at its host's address, and ends.
    let client = fabric.run(B, &[&prog, "tcp-client", A, "17111"]);
    let s = finish(server, "server");
    fabric.stop();
    assert_eq!(refused.stdout, "connect: ECONNREFUSED\n", "{}", refused.stderr);
    assert_eq!(after(&client.stdout, "got "), "pong", "{}", client.stderr);
    assert!(s.status.success(), "{}", s.stderr);
}

#[test]
fn a_dual_stack_server_bound_to_in6addr_any_is_reached_by_an_ipv4_client_as_on_a_real_host() {
    // ibv_rc_pingpong's server: getaddrinfo(NULL, port, AI_PASSIVE) gives :: first.
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let (s, c) = tcp_pair(&prog.path(), "side-dual", A, "any6", B, A, 17108);
    assert_eq!(after(&s.stdout, "listening "), "[::]:17108");
    let client_local = after(&c.stdout, "client local ");
    let (local, peer) = client_local.split_once(" peer ").expect("two addresses");
    assert_eq!(peer, "10.0.0.1:17108");
    let port = local.strip_prefix("10.0.0.2:").expect("the client's host");
    assert_eq!(after(&s.stdout, "accepted "), format!("[::ffff:10.0.0.2]:{port}"));
    assert_eq!(
        after(&s.stdout, "server local "),
        format!("[::ffff:10.0.0.1]:17108 peer [::ffff:10.0.0.2]:{port}")
    );
}

#[test]
fn qperf_measures_tcp_and_udp_between_two_simulated_hosts() {
    let qperf = "/usr/bin/qperf";
    if !std::path::Path::new(qperf).exists() {
        eprintln!("skipped: {qperf} is not installed (apt-get install qperf)");
        return;
    }
    let fabric = Fabric::start("side-qperf", &[A, B], 2);
    // qperf's server serves until it is stopped, on every address of its host.
    let mut server = fabric.spawn(A, &[qperf]);
    let client = fabric.spawn(
        B,
        &[
            qperf,
            "--wait_server",
            "10",
            "-t",
            "1",
            A,
            "tcp_bw",
            "tcp_lat",
            "udp_lat",
        ],
    );
    let c = wait(client, Duration::from_secs(40), "qperf client");
    let _ = server.kill();
    let s = wait(server, Duration::from_secs(10), "qperf server");
    fabric.stop();
    assert!(
        c.status.success(),
        "{}\n{}\nserver: {}",
        c.stdout,
        c.stderr,
        s.stderr
    );
    for test in ["tcp_bw:", "tcp_lat:", "udp_lat:"] {
        assert!(c.stdout.lines().any(|l| l == test), "{test} in {}", c.stdout);
    }
    assert!(
        c.stdout.contains("bw  =") && c.stdout.contains("latency  ="),
        "{}",
        c.stdout
    );
    assert!(
        c.stderr.is_empty() && s.stderr.is_empty(),
        "{}\nserver: {}",
        c.stderr,
        s.stderr
    );
}

#[test]
fn a_partition_of_the_simulated_fabric_does_not_cut_the_programs_own_sockets() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let prog = prog.path();
    // Hosts 0 and 1 are partitioned from the start: RDMA between them would fail, the side
    // channel is the machine's loopback and is outside the fabric.
    let fabric = Fabric::start_with("side-partition", &[A, B], 2, &["--fault", "0:partition 0 1"]);
    let server = fabric.spawn(A, &[&prog, "tcp-server", A, "17110"]);
    let client = fabric.spawn(B, &[&prog, "tcp-client", A, "17110"]);
    let c = finish(client, "client");
    finish(server, "server");
    fabric.stop();
    assert_eq!(after(&c.stdout, "got "), "pong");
}

/// One test's results as qperf prints them: (name, value, unit) per line.
type Rows = Vec<(String, f64, String)>;

/// The `name = value unit` lines of each test's section of qperf's output (`name:` on a line
/// of its own, its results indented below), values without their thousands' commas.
fn qperf_sections(out: &str) -> Vec<(String, Rows)> {
    let mut sections: Vec<(String, Rows)> = Vec::new();
    for line in out.lines() {
        if let Some(name) = line.strip_suffix(':').filter(|n| !n.starts_with(' ')) {
            sections.push((name.to_string(), Vec::new()));
        } else if let (Some((_, rows)), Some((key, rest))) = (sections.last_mut(), line.split_once('=')) {
            let mut words = rest.split_whitespace();
            let value = words.next().and_then(|v| v.replace(',', "").parse::<f64>().ok());
            if let Some(value) = value {
                let unit = words.next().unwrap_or("").to_string();
                rows.push((key.trim().to_string(), value, unit));
            }
        }
    }
    sections
}

/// Runs qperf's server on host A and `args` on host B (the client, told A's address): the
/// client's and the server's output once the client is done.
fn qperf_pair(name: &str, args: &[&str]) -> Option<(Output, Output)> {
    let qperf = "/usr/bin/qperf";
    if !std::path::Path::new(qperf).exists() {
        eprintln!("skipped: {qperf} is not installed (apt-get install qperf)");
        return None;
    }
    let fabric = Fabric::start(name, &[A, B], 2);
    // The server forks a process of its own for each test, which makes the test's QP.
    let mut server = fabric.spawn(A, &[qperf]);
    let mut client_args = vec![qperf, "--wait_server", "10", "-t", "1"];
    client_args.extend_from_slice(args);
    let client = fabric.spawn(B, &client_args);
    let c = wait(client, Duration::from_secs(60), "qperf client");
    let _ = server.kill();
    let s = wait(server, Duration::from_secs(10), "qperf server");
    fabric.stop();
    Some((c, s))
}

/// The value of `key` in a section's rows, in `unit`s scaled by the unit qperf chose.
fn row(rows: &[(String, f64, String)], key: &str) -> (f64, String) {
    rows.iter()
        .find(|(k, _, _)| k == key)
        .map(|(_, v, u)| (*v, u.clone()))
        .unwrap_or_else(|| panic!("no {key} in {rows:?}"))
}

fn micros(value: f64, unit: &str) -> f64 {
    match unit {
        "ns" => value / 1000.0,
        "us" => value,
        "ms" => value * 1000.0,
        "sec" => value * 1e6,
        other => panic!("latency unit {other}"),
    }
}

fn per_second(value: f64, unit: &str) -> f64 {
    match unit {
        "/sec" => value,
        "K/sec" => value * 1e3,
        "M/sec" => value * 1e6,
        other => panic!("rate unit {other}"),
    }
}

#[test]
fn qperf_runs_its_rc_tests_over_rdma_cm_between_two_simulated_hosts() {
    let tests = [
        "rc_bw",
        "rc_lat",
        "rc_rdma_read_bw",
        "rc_rdma_write_bw",
        "rc_rdma_write_lat",
    ];
    let mut args = vec!["-cm1", "-vvs", A];
    args.extend_from_slice(&tests);
    let Some((c, s)) = qperf_pair("side-qperf-rc", &args) else {
        return;
    };
    assert!(
        c.status.success() && c.stderr.is_empty(),
        "{}\n{}\nserver: {}",
        c.stdout,
        c.stderr,
        s.stderr
    );
    // qperf 0.4.11's server ends each test with rdma_destroy_qp and rdma_destroy_id of its
    // listening id and rdma_destroy_event_channel of a channel its connection's id is still
    // on; the drop-in refuses those (librdmacm would dereference the listener's NULL QP).
    // Nothing else may be said: no call of the tests' is refused.
    for line in s.stderr.lines() {
        assert!(
            line == "cmsim: rdma_destroy_qp: invalid argument (EINVAL)"
                || line == "cmsim: rdma_destroy_event_channel: resource busy (EBUSY)",
            "server: {}",
            s.stderr
        );
    }
    let sections = qperf_sections(&c.stdout);
    let names: Vec<&str> = sections.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, tests, "{}", c.stdout);
    for (name, rows) in &sections {
        if name.ends_with("_bw") {
            let (bw, unit) = row(rows, "bw");
            assert!(bw > 0.0 && unit.ends_with("B/sec"), "{name}: {rows:?}");
            // The client counts what it posted, the server what it received: every message
            // received is 64 KiB, and none is received that was not sent.
            let (sent, _) = row(rows, "send_msgs");
            let (received, _) = row(rows, "recv_msgs");
            assert!(received > 0.0 && received <= sent, "{name}: {rows:?}");
        } else {
            let (latency, unit) = row(rows, "latency");
            let (rate, rate_unit) = row(rows, "msg_rate");
            let latency = micros(latency, &unit);
            // A ping-pong: one message each way at a time, so the latency is the time of one,
            // the inverse of the rate qperf counted them at (its figures have 3 digits).
            let product = latency * per_second(rate, &rate_unit) / 1e6;
            assert!(
                latency > 0.0 && (0.95..1.05).contains(&product),
                "{name}: {rows:?}"
            );
            let (sent, _) = row(rows, "loc_send_msgs");
            let (received, _) = row(rows, "loc_recv_msgs");
            let (peer_received, _) = row(rows, "rem_recv_msgs");
            assert!(
                sent > 0.0 && sent - received <= 1.0 && peer_received <= sent,
                "{name}: {rows:?}"
            );
        }
    }
}

#[test]
fn qperfs_tests_without_rdma_cm_give_address_vectors_without_a_grh_which_roce_refuses() {
    // Without -cm1 qperf addresses its peer by a LID, without a GRH: its RC QP's move to RTR
    // and its UD address handle, which Linux's ib core refuses on a RoCE port
    // (rdma_check_ah_attr: EINVAL), on rxe too.
    for (test, said_then) in [
        ("rc_lat", "failed to modify QP to RTR: Invalid argument"),
        ("ud_lat", "failed to create address handle: Invalid argument"),
    ] {
        let Some((c, s)) = qperf_pair(&format!("side-qperf-{test}"), &[A, test]) else {
            return;
        };
        assert!(!c.status.success(), "{}\n{}", c.stdout, c.stderr);
        let said = format!("{}{}{}", c.stdout, c.stderr, s.stdout);
        assert!(said.contains(said_then), "{said}\nserver: {}", s.stderr);
    }
}

#[test]
fn getifaddrs_lists_the_simulated_hosts_interface_and_not_the_machines() {
    let Some(prog) = compile_c("side", &[]) else {
        return;
    };
    let fabric = Fabric::start("side-ifaddrs", &[A, B, C6], 2);
    let b = fabric.run(B, &[&prog.path(), "ifaddrs", "any", "0"]);
    let c6 = fabric.run(C6, &[&prog.path(), "ifaddrs", "any", "0"]);
    fabric.stop();
    // IFF_UP | IFF_LOOPBACK | IFF_RUNNING, and IFF_UP | IFF_BROADCAST | IFF_RUNNING |
    // IFF_MULTICAST; IPv4 entries first, then IPv6, as glibc orders them.
    let lo6 = "ifaddr lo 49 [::1]:0 [ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff]:0 -";
    assert_eq!(
        b.stdout.lines().collect::<Vec<_>>(),
        [
            "ifaddr lo 49 127.0.0.1:0 255.0.0.0:0 -",
            "ifaddr cmsim0 1043 10.0.0.2:0 255.255.255.0:0 10.0.0.255:0",
            lo6,
        ],
        "{}",
        b.stderr
    );
    assert_eq!(
        c6.stdout.lines().collect::<Vec<_>>(),
        [
            "ifaddr lo 49 127.0.0.1:0 255.0.0.0:0 -",
            lo6,
            &format!("ifaddr cmsim0 1043 [{C6}]:0 [ffff:ffff:ffff:ffff::]:0 -"),
        ],
        "{}",
        c6.stderr
    );
}
