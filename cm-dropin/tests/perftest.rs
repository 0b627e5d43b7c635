//! Debian 12's perftest, unmodified, between two simulated hosts: the server on 10.0.0.1, the
//! client told `10.0.0.1`, both over perftest's own TCP exchange of QP numbers, keys and
//! addresses, and over rdma_cm (`-R`). Each run is 100 iterations of 4096 bytes (8 for the
//! atomics); the result
//! row each program prints is checked (the size and count asked, a positive bandwidth or
//! ordered latencies). Every wait is bounded; a test skips (with a message) where perftest is
//! not installed (`apt-get install perftest`).

use std::path::Path;
use std::process::Child;
use std::time::{Duration, Instant};

mod common;
use common::{wait, Output};
#[path = "common/fabric.rs"]
mod fabric;
use fabric::{spawn_on as spawn, start_daemon};

const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";
const LIMIT: Duration = Duration::from_secs(60);
const ITERS: &str = "100";
const SIZE: &str = "4096";

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

/// A TCP (or rdma_cm) port for this test process's `n`th pair: tests of several runs may
/// overlap.
fn port(n: u16) -> u16 {
    21_000 + (std::process::id() % 1_000) as u16 * 24 + n
}

/// Runs `program` with `extra` options as server and client; `rdma_cm`: with `-R`, the client
/// waiting for the server's rdma_cm listener rather than its TCP socket. `None` (with a
/// message) when perftest is not installed.
///
/// With `-R`, perftest 4.5's server listens a second time, anew, for the data connection once
/// the exchange is done, and a client quicker than that finds no listener (`REJECTED; error: 8`,
/// or over UD `UNREACHABLE; error: 1`): its retry then reuses the ids it destroyed, so it fails. That race is perftest's
/// own (a fabric has it too); a pair that lost it is run again, at most twice more.
fn perftest(program: &str, port: u16, rdma_cm: bool, extra: &[&str]) -> Option<(Output, Output)> {
    let path = format!("/usr/bin/{program}");
    if !Path::new(&path).exists() {
        eprintln!("skipped: {path} is not installed (apt-get install perftest)");
        return None;
    }
    let name = format!("{program}{}", if rdma_cm { "-R" } else { "" });
    for attempt in 1..=3 {
        match pair(&name, program, port, rdma_cm, extra) {
            Ok(r) => return Some(r),
            Err(lost) if attempt < 3 => eprintln!("{name}: lost perftest's race, again: {lost}"),
            Err(lost) => panic!("{lost}"),
        }
    }
    unreachable!("the last attempt returns or panics")
}

/// One run of the pair on a daemon of its own: both outputs; what went wrong where the client
/// lost perftest's `-R` race; a panic with both sides' output on any other failure.
fn pair(
    name: &str,
    program: &str,
    port: u16,
    rdma_cm: bool,
    extra: &[&str],
) -> Result<(Output, Output), String> {
    // Several runs of one program may be under way at once: the port tells their sockets apart.
    let (socket, daemon) = start_daemon(&format!("pt-{name}-{port}"), &[SERVER, CLIENT], 2, 120, &[]);
    let port_s = port.to_string();
    let mut args: Vec<&str> = vec![program, "-n", ITERS, "-p", &port_s];
    args.extend_from_slice(extra);
    if rdma_cm {
        args.push("-R");
    }
    let server = spawn(&socket, SERVER, None, &args);
    let listener = format!("{SERVER}:{port}");
    let client_listener = if rdma_cm {
        Some(listener.as_str())
    } else {
        let deadline = Instant::now() + Duration::from_secs(20);
        while !tcp_listening(port) {
            assert!(Instant::now() < deadline, "{program} did not listen on {port}");
            std::thread::sleep(Duration::from_millis(20));
        }
        None
    };
    args.push(SERVER);
    let client = spawn(&socket, CLIENT, client_listener, &args);
    // A side past the bound is killed, and both sides' output shown: where a run stops.
    let (c, s, late) = match (within(client, LIMIT), within(server, Duration::from_secs(10))) {
        (Ok(c), Ok(s)) => (c, s, false),
        (c, s) => (c.unwrap_or_else(|o| o), s.unwrap_or_else(|o| o), true),
    };
    let d = wait(daemon, Duration::from_secs(30), "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    // No listener: a REJ of reason 8 (invalid service ID) for RC, a SIDR REP of status 1 for UD.
    let lost = rdma_cm
        && (c.stderr.contains("RDMA_CM_EVENT_REJECTED; error: 8")
            || c.stderr.contains("RDMA_CM_EVENT_UNREACHABLE; error: 1."));
    let failed = late || !c.status.success() || !s.status.success();
    if failed || !d.status.success() {
        let what = if late {
            "a side did not finish within its bound"
        } else {
            "a side failed"
        };
        let report = format!(
            "{name}: {what}\nclient ({}): {}\n{}\nserver ({}): {}\n{}\ndaemon: {}",
            c.status, c.stdout, c.stderr, s.status, s.stdout, s.stderr, d.stderr
        );
        if lost {
            return Err(report);
        }
        panic!("{report}");
    }
    Ok((s, c))
}

/// `child`'s output once it exits within `limit`; else it is killed and its output so far is
/// the error.
fn within(mut child: Child, limit: Duration) -> Result<Output, Output> {
    let deadline = Instant::now() + limit;
    while child.try_wait().expect("try_wait").is_none() {
        if Instant::now() > deadline {
            let _ = child.kill();
            return Err(wait(child, Duration::from_secs(10), "a killed side"));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok(wait(child, Duration::from_secs(10), "a finished side"))
}

/// The numbers of the result row of `out`: the one that starts with the size and iteration
/// count asked for (`bytes`, `ITERS`).
fn row(out: &str, bytes: &str) -> Option<Vec<f64>> {
    out.lines().find_map(|l| {
        let cols: Vec<&str> = l.split_whitespace().collect();
        if cols.len() < 4 || cols[0] != bytes || cols[1] != ITERS {
            return None;
        }
        cols.iter().map(|c| c.parse().ok()).collect()
    })
}

/// A bandwidth test's row: bytes, iterations, peak and average MB/s, Mpps; the average and the
/// message rate are positive.
fn check_bw(o: &Output, bytes: &str, who: &str) {
    let r = row(&o.stdout, bytes).unwrap_or_else(|| panic!("{who}: no result row:\n{}", o.stdout));
    assert_eq!(r.len(), 5, "{who}: {r:?}");
    assert!(r[3] > 0.0 && r[4] > 0.0, "{who}: {r:?}\n{}", o.stdout);
}

/// A latency test's row: bytes, iterations, then min, max, typical, average, stdev and the
/// percentiles in µs: min ≤ average ≤ max, min > 0.
fn check_lat(o: &Output, bytes: &str, who: &str) {
    let r = row(&o.stdout, bytes).unwrap_or_else(|| panic!("{who}: no result row:\n{}", o.stdout));
    assert!(r.len() >= 7, "{who}: {r:?}");
    let (min, max, avg) = (r[2], r[3], r[5]);
    assert!(
        min > 0.0 && min <= avg && avg <= max,
        "{who}: {r:?}\n{}",
        o.stdout
    );
}

/// Both exchanges of a bandwidth test, each side's row checked.
fn bw(program: &str, n: u16) {
    bw_with(program, n, SIZE, &[]);
}

/// [`bw`] of `size` bytes with `extra` options.
fn bw_with(program: &str, n: u16, size: &str, extra: &[&str]) {
    let mut args = vec!["-s", size];
    args.extend_from_slice(extra);
    for rdma_cm in [false, true] {
        let Some((s, c)) = perftest(program, port(n + rdma_cm as u16), rdma_cm, &args) else {
            return;
        };
        check_bw(&c, size, &format!("{program} {extra:?} client (-R: {rdma_cm})"));
        check_bw(&s, size, &format!("{program} {extra:?} server (-R: {rdma_cm})"));
    }
}

/// Both exchanges of a latency test; `server_reports`: whether the server prints a row too
/// (`ib_read_lat`'s does not: only the client reads).
fn lat(program: &str, n: u16, server_reports: bool) {
    lat_with(program, n, server_reports, SIZE, &[]);
}

/// [`lat`] of `size` bytes with `extra` options.
fn lat_with(program: &str, n: u16, server_reports: bool, size: &str, extra: &[&str]) {
    let mut args = vec!["-s", size];
    args.extend_from_slice(extra);
    for rdma_cm in [false, true] {
        let Some((s, c)) = perftest(program, port(n + rdma_cm as u16), rdma_cm, &args) else {
            return;
        };
        check_lat(&c, size, &format!("{program} {extra:?} client (-R: {rdma_cm})"));
        if server_reports {
            check_lat(&s, size, &format!("{program} {extra:?} server (-R: {rdma_cm})"));
        }
    }
}

#[test]
fn ib_send_bw_sends_100_messages_of_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    bw("ib_send_bw", 0);
}

#[test]
fn ib_write_bw_writes_100_times_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    bw("ib_write_bw", 2);
}

#[test]
fn ib_read_bw_reads_100_times_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    bw("ib_read_bw", 4);
}

#[test]
fn ib_atomic_bw_runs_100_fetch_and_adds_and_100_compare_and_swaps_over_tcp_and_rdma_cm_exchanges() {
    // Atomics are 8 bytes: perftest refuses -s for them.
    for (atomic, n) in [("FETCH_AND_ADD", 12), ("CMP_AND_SWAP", 14)] {
        for rdma_cm in [false, true] {
            let Some((s, c)) = perftest("ib_atomic_bw", port(n + rdma_cm as u16), rdma_cm, &["-A", atomic])
            else {
                return;
            };
            check_bw(
                &c,
                "8",
                &format!("ib_atomic_bw -A {atomic} client (-R: {rdma_cm})"),
            );
            check_bw(
                &s,
                "8",
                &format!("ib_atomic_bw -A {atomic} server (-R: {rdma_cm})"),
            );
        }
    }
}

#[test]
fn ib_send_lat_measures_100_ping_pongs_of_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    lat("ib_send_lat", 6, true);
}

#[test]
fn ib_write_lat_measures_100_write_ping_pongs_of_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    lat("ib_write_lat", 8, true);
}

#[test]
fn ib_read_lat_measures_100_reads_of_4096_bytes_over_tcp_and_rdma_cm_exchanges() {
    lat("ib_read_lat", 10, false);
}

#[test]
fn ib_send_bw_and_ib_send_lat_run_over_ud_qps_over_tcp_and_rdma_cm_exchanges() {
    // A UD message fits the port's active MTU (1024, as on rxe): perftest refuses more.
    bw_with("ib_send_bw", 16, "1024", &["-c", "UD"]);
    lat_with("ib_send_lat", 18, true, "1024", &["-c", "UD"]);
}

#[test]
fn ib_send_bw_waiting_on_completion_events_sends_100_messages_over_tcp_and_rdma_cm_exchanges() {
    bw_with("ib_send_bw", 20, SIZE, &["-e"]);
}
