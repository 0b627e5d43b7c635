//! rdma-core's own programs (Debian's rdmacm-utils), unmodified, against the drop-in libraries
//! and a fabric daemon: server and client as separate processes, as on a real fabric.
//!
//! Each test skips with a message when the program is not installed (`apt-get install
//! rdmacm-utils`; `scripts/test-all` installs it). Every wait is bounded: a hung program is
//! killed and the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");
const RUN: &str = env!("CARGO_BIN_EXE_cmsim-run");
const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";

fn installed(program: &str) -> bool {
    let found = Path::new("/usr/bin").join(program).exists();
    if !found {
        eprintln!("skipped: /usr/bin/{program} is not installed (apt-get install rdmacm-utils)");
    }
    found
}

mod common;
use common::{wait, Output};

/// A daemon for one test: two hosts, its own socket, gone when the test ends.
struct Fabric {
    socket: PathBuf,
    daemon: Option<Child>,
}

impl Fabric {
    fn start(name: &str, processes: usize, extra: &[&str]) -> Fabric {
        let socket = std::env::temp_dir().join(format!("cmsim-{name}-{}.sock", std::process::id()));
        let daemon = Command::new(DAEMON)
            .arg("--socket")
            .arg(&socket)
            .args([
                "--host",
                SERVER,
                "--host",
                CLIENT,
                "--seed",
                "7",
                "--max-seconds",
                "120",
            ])
            .args(["--processes", &processes.to_string()])
            .args(extra)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cmsim-daemon");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !socket.exists() {
            assert!(
                Instant::now() < deadline,
                "the daemon did not create {}",
                socket.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
        Fabric {
            socket,
            daemon: Some(daemon),
        }
    }

    /// Starts `program` on `host`; a client (any host but the server's) starts only once the
    /// server listens on port 7471 (every test uses it; rping is told so with `-p`), as a
    /// person starting the pair by hand would wait.
    fn spawn(&self, host: &str, program: &[&str]) -> Child {
        self.spawn_with_port(host, 7471, program)
    }

    /// [`spawn`](Fabric::spawn) for a pair that uses another port (udaddy's is fixed: 7174).
    fn spawn_with_port(&self, host: &str, port: u16, program: &[&str]) -> Child {
        let mut cmd = Command::new(RUN);
        if host != SERVER {
            cmd.args(["--wait-for-listener", &format!("{SERVER}:{port}")]);
        }
        cmd.arg("--socket")
            .arg(&self.socket)
            .args(["--host", host, "--"])
            .args(program)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cmsim-run")
    }

    /// Waits for the daemon to exit (it does once its processes are gone).
    fn finish(mut self) -> Output {
        wait(
            self.daemon.take().expect("daemon running"),
            Duration::from_secs(30),
            "cmsim-daemon",
        )
    }
}

impl Drop for Fabric {
    fn drop(&mut self) {
        if let Some(mut d) = self.daemon.take() {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
    }
}

/// Kills a server that, like cmtime's, serves until it is stopped.
fn stop(mut server: Child) -> Output {
    let _ = server.kill();
    wait(server, Duration::from_secs(10), "server")
}

fn cmtime_pair(connections: usize) {
    if !installed("cmtime") {
        return;
    }
    let fabric = Fabric::start(&format!("cmtime{connections}"), 2, &[]);
    let n = connections.to_string();
    let server = fabric.spawn(SERVER, &["cmtime", "-b", SERVER, "-c", &n]);
    let client = fabric.spawn(CLIENT, &["cmtime", "-s", SERVER, "-b", CLIENT, "-c", &n]);
    let out = wait(client, Duration::from_secs(90), "cmtime client");
    let server_out = stop(server);
    assert!(
        out.status.success(),
        "client failed: {}\n{}\nserver: {}",
        out.stdout,
        out.stderr,
        server_out.stderr
    );
    for step in [
        "create id",
        "bind addr",
        "resolve addr",
        "resolve route",
        "create qp",
        "connect",
        "disconnect",
        "destroy",
    ] {
        assert!(
            out.stdout.lines().any(|l| l.starts_with(step)),
            "no `{step}` row in\n{}",
            out.stdout
        );
    }
    assert!(!out.stdout.contains("error"), "errors in\n{}", out.stdout);
    assert!(out.stderr.is_empty(), "client stderr: {}", out.stderr);
    let daemon = fabric.finish();
    assert!(daemon.status.success(), "daemon: {}", daemon.stderr);
    assert!(
        daemon.stdout.lines().any(|l| l.starts_with("trace-hash: ")),
        "{}",
        daemon.stdout
    );
}

#[test]
fn cmtime_client_and_server_complete_100_connections() {
    cmtime_pair(100);
}

#[test]
fn cmtime_client_and_server_complete_1000_connections() {
    cmtime_pair(1000);
}

#[test]
fn a_partition_during_connect_makes_cmtime_report_unreachable() {
    if !installed("cmtime") {
        return;
    }
    // Every REQ is lost; with 16 tries of 18 ms each connect gives up as UNREACHABLE, -ETIMEDOUT.
    let fabric = Fabric::start(
        "partition",
        2,
        &["--cm-timeouts", "12,8", "--fault", "0:partition 0 1"],
    );
    let server = fabric.spawn(SERVER, &["cmtime", "-b", SERVER, "-c", "4"]);
    let client = fabric.spawn(CLIENT, &["cmtime", "-s", SERVER, "-b", CLIENT, "-c", "4"]);
    let out = wait(client, Duration::from_secs(60), "cmtime client");
    let server_out = stop(server);
    let unreachable = out
        .stdout
        .lines()
        .filter(|l| *l == "event: RDMA_CM_EVENT_UNREACHABLE, error: -110")
        .count();
    assert_eq!(unreachable, 4, "client output:\n{}\n{}", out.stdout, out.stderr);
    // cmtime reports the failed connections and still exits 0, as it does on rxe.
    assert!(out.status.success(), "{:?}", out.status);
    assert!(out.stderr.is_empty(), "client stderr: {}", out.stderr);
    assert!(
        server_out.stdout.is_empty(),
        "the server saw something: {}",
        server_out.stdout
    );
    assert!(fabric.finish().status.success());
}

/// Tests start programs in parallel, and each `cmsim-run` lays the libraries out: runs meeting
/// in one fresh directory must all succeed and leave the two sonames in place (CI once saw
/// `librdmacm.so.1: File exists` when two made the link at once).
#[test]
fn runs_laying_the_libraries_out_at_once_all_succeed() {
    for round in 0..30 {
        let dir = std::env::temp_dir().join(format!("cmsim-layout-{}-{round}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        let runs: Vec<Child> = (0..32)
            .map(|_| {
                Command::new(RUN)
                    .arg("--lib-dir")
                    .arg(&dir)
                    .arg("--print-lib-dir")
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("start cmsim-run")
            })
            .collect();
        for child in runs {
            let out = wait(child, Duration::from_secs(30), "cmsim-run --print-lib-dir");
            assert!(out.status.success(), "round {round}: {}", out.stderr);
            assert_eq!(out.stdout.trim(), dir.display().to_string());
        }
        assert_eq!(
            std::fs::read_link(dir.join("librdmacm.so.1")).expect("librdmacm.so.1 is a link"),
            Path::new("libibverbs.so.1")
        );
        assert!(
            std::fs::metadata(dir.join("libibverbs.so.1"))
                .expect("libibverbs.so.1")
                .len()
                > 0
        );
        let leftovers: Vec<_> = std::fs::read_dir(&dir)
            .expect("read the directory")
            .filter_map(|e| e.ok())
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .filter(|n| n.starts_with('.'))
            .collect();
        assert!(leftovers.is_empty(), "temporary files left: {leftovers:?}");
        let _ = std::fs::remove_dir_all(&dir);
    }
}

/// A host the fabric does not have: the program's own "no RDMA devices" is explained by a line
/// naming the address; a wait for a listener that takes longer than a server's start says so.
#[test]
fn a_host_not_on_the_fabric_and_a_wait_for_a_listener_are_said_on_stderr() {
    if !installed("cmtime") {
        return;
    }
    let fabric = Fabric::start("nohost", 1, &[]);
    let child = Command::new(RUN)
        .arg("--socket")
        .arg(&fabric.socket)
        .args(["--host", "10.9.9.9", "--", "cmtime", "-b", "10.9.9.9"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    let out = wait(child, Duration::from_secs(30), "cmtime on a missing host");
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("no simulated host with address \"10.9.9.9\""),
        "stderr: {}",
        out.stderr
    );
    let err = std::env::temp_dir().join(format!("cmsim-wait-{}.err", std::process::id()));
    let mut waiting = Command::new(RUN)
        .arg("--socket")
        .arg(&fabric.socket)
        .args([
            "--host",
            CLIENT,
            "--wait-for-listener",
            "10.0.0.1:7999",
            "--",
            "true",
        ])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).expect("stderr file"))
        .spawn()
        .expect("start cmsim-run");
    let deadline = Instant::now() + Duration::from_secs(15);
    let said = loop {
        let text = std::fs::read_to_string(&err).unwrap_or_default();
        if text.contains("waiting") || Instant::now() > deadline {
            break text;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = waiting.kill();
    let _ = waiting.wait();
    let _ = std::fs::remove_file(&err);
    assert!(
        said.contains("still waiting after 5 s (at most 30 s) until something listens at 10.0.0.1:7999"),
        "stderr: {said}"
    );
}

#[test]
fn a_program_without_a_daemon_fails_with_a_message() {
    if !installed("cmtime") {
        return;
    }
    let child = Command::new(RUN)
        .args([
            "--socket",
            "/nonexistent/cmsim.sock",
            "--host",
            SERVER,
            "--",
            "cmtime",
            "-b",
            SERVER,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    let out = wait(child, Duration::from_secs(30), "cmtime");
    assert!(!out.status.success());
    assert!(
        out.stderr.contains("cannot reach the fabric daemon"),
        "stderr: {}",
        out.stderr
    );
}

/// Runs a server and a client that both finish on their own; returns (server, client, daemon).
fn finishing_pair(name: &str, server: &[&str], client: &[&str], extra: &[&str]) -> (Output, Output, Output) {
    let fabric = Fabric::start(name, 2, extra);
    let s = fabric.spawn(SERVER, server);
    let c = fabric.spawn(CLIENT, client);
    let c = wait(c, Duration::from_secs(60), client[0]);
    let s = wait(s, Duration::from_secs(30), server[0]);
    let d = fabric.finish();
    (s, c, d)
}

#[test]
fn ucmatose_exchanges_messages_and_disconnects() {
    if !installed("ucmatose") {
        return;
    }
    let (s, c, d) = finishing_pair(
        "ucmatose",
        &["ucmatose", "-b", SERVER, "-c", "4", "-C", "20", "-S", "2000"],
        // -t sets the type of service with rdma_set_option.
        &[
            "ucmatose", "-s", SERVER, "-b", CLIENT, "-c", "4", "-C", "20", "-S", "2000", "-t", "32",
        ],
        &[],
    );
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("data transfers complete"),
            "{who}: {}",
            o.stdout
        );
        assert!(o.stdout.contains("return status 0"), "{who}: {}", o.stdout);
        assert!(o.stderr.is_empty(), "{who} stderr: {}", o.stderr);
    }
    assert!(s.stdout.contains("disconnected"), "{}", s.stdout);
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn ucmatose_m_migrates_its_ids_to_a_new_event_channel_and_completes() {
    if !installed("ucmatose") {
        return;
    }
    // -m: after the data transfers each side moves its ids to a new channel (rdma_migrate_id)
    // and takes the disconnect there.
    let (s, c, d) = finishing_pair(
        "migrate",
        &["ucmatose", "-b", SERVER, "-C", "1", "-m"],
        &["ucmatose", "-s", SERVER, "-b", CLIENT, "-C", "1", "-m"],
        &[],
    );
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("migrating to new event channel") && o.stdout.contains("return status 0"),
            "{who}: {}",
            o.stdout
        );
        assert!(o.stderr.is_empty(), "{who} stderr: {}", o.stderr);
    }
    assert!(s.stdout.contains("disconnected"), "{}", s.stdout);
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn an_unsupported_call_fails_with_enosys_and_a_message_not_a_crash() {
    if !installed("rstream") {
        return;
    }
    // rstream's first call is rsocket: rsockets are not served. It does not get as far as
    // the daemon, which goes when the fabric is dropped.
    let fabric = Fabric::start("enosys", 1, &[]);
    let s = fabric.spawn(SERVER, &["rstream", "-b", SERVER]);
    let o = wait(s, Duration::from_secs(30), "rstream");
    drop(fabric);
    assert!(
        o.stderr
            .contains("rsocket is not supported on the simulator (ENOSYS)"),
        "{}",
        o.stderr
    );
    assert!(o.stderr.contains("Function not implemented"), "{}", o.stderr);
    // The program reports the failure through its own error path and exits.
    assert!(o.status.code().is_some(), "died of a signal: {:?}", o.status);
}

#[test]
fn rdma_server_and_rdma_client_exchange_a_message_over_synchronous_endpoints() {
    if !installed("rdma_server") || !installed("rdma_client") {
        return;
    }
    // rdma_getaddrinfo, rdma_create_ep (passive and active), rdma_get_request, the blocking
    // connect/accept, ibv_query_qp, inline sends and rdma_get_{send,recv}_comp, which wait on
    // the completion channel.
    let (s, c, d) = finishing_pair(
        "rdmaserver",
        &["rdma_server", "-s", SERVER],
        &["rdma_client", "-s", SERVER],
        &[],
    );
    assert!(s.status.success(), "server: {}\n{}", s.stdout, s.stderr);
    assert!(c.status.success(), "client: {}\n{}", c.stdout, c.stderr);
    assert_eq!(s.stdout, "rdma_server: start\nrdma_server: end 0\n");
    assert_eq!(c.stdout, "rdma_client: start\nrdma_client: end 0\n");
    assert!(
        s.stderr.is_empty() && c.stderr.is_empty(),
        "{}{}",
        s.stderr,
        c.stderr
    );
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn rdma_client_without_a_server_reports_the_rejection() {
    if !installed("rdma_client") {
        return;
    }
    // No listener on the server's host: the synchronous connect fails with ECONNREFUSED.
    let fabric = Fabric::start("noserver", 1, &[]);
    let c = Command::new(RUN)
        .arg("--socket")
        .arg(&fabric.socket)
        .args(["--host", CLIENT, "--", "rdma_client", "-s", SERVER])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    let c = wait(c, Duration::from_secs(30), "rdma_client");
    assert!(c.stdout.contains("rdma_client: end -1"), "{}", c.stdout);
    assert!(
        c.stderr.contains("rdma_connect: Connection refused"),
        "{}",
        c.stderr
    );
    assert!(fabric.finish().status.success());
}

#[test]
fn a_fault_schedule_file_partitions_rdma_client_from_its_server() {
    if !installed("rdma_server") || !installed("rdma_client") {
        return;
    }
    let schedule = std::env::temp_dir().join(format!("cmsim-faults-{}.txt", std::process::id()));
    std::fs::write(
        &schedule,
        "# the hosts cannot reach each other from the start\n0: partition 0 1\n",
    )
    .expect("write the schedule");
    let schedule_arg = schedule.to_string_lossy().into_owned();
    let fabric = Fabric::start(
        "schedule",
        2,
        &["--cm-timeouts", "11,8", "--faults", &schedule_arg],
    );
    let server = fabric.spawn(SERVER, &["rdma_server", "-s", SERVER]);
    let client = fabric.spawn(CLIENT, &["rdma_client", "-s", SERVER]);
    let c = wait(client, Duration::from_secs(30), "rdma_client");
    let s = stop(server);
    let _ = std::fs::remove_file(&schedule);
    // Every REQ is lost: the blocking connect ends with UNREACHABLE, -ETIMEDOUT.
    assert!(
        c.stderr.contains("rdma_connect: Connection timed out"),
        "{}",
        c.stderr
    );
    assert!(c.stdout.contains("rdma_client: end -1"), "{}", c.stdout);
    assert_eq!(c.status.code(), Some(255), "rdma_client returns -1 from main");
    // The server blocks in rdma_get_request until it is killed (its buffered output is lost).
    assert!(s.stderr.is_empty(), "server: {}", s.stderr);
    assert!(fabric.finish().status.success());
}

/// Compiles `tests/c/<name>.c` against the installed rdma-core headers into a file of its own;
/// None (with a message) when there is no C compiler or no headers.
fn compile_c(name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    // Tests run in parallel and several compile the same program: each gets its own file.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("cmsim-{name}-{}-{n}", std::process::id()));
    let status = Command::new("cc")
        .arg("-Wall")
        .arg("-Werror")
        .arg("-o")
        .arg(&out)
        .arg(&src)
        .args(["-lrdmacm", "-libverbs"])
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!(
                "skipped: cannot compile {} (needs cc, librdmacm-dev, libibverbs-dev)",
                src.display()
            );
            None
        }
    }
}

#[test]
fn rdma_getaddrinfo_follows_cm_cores_rules_and_resolves_names_through_the_system() {
    let Some(prog) = compile_c("addrinfo") else {
        return;
    };
    let prog = prog.to_string_lossy().into_owned();
    let out = run_without_daemon(&[&prog]);
    let _ = std::fs::remove_file(&prog);
    assert_eq!(out.stdout, "ok\n", "{}", out.stderr);
    assert!(out.status.success());
}

#[test]
fn sent_bytes_arrive_intact_across_sge_boundaries_with_their_immediate_and_unsignaled_sends_stay_silent() {
    let Some(echo) = compile_c("echo") else {
        return;
    };
    let echo = echo.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair(
        "echo",
        &[&echo, "server", SERVER],
        &[&echo, "client", SERVER],
        &[],
    );
    let _ = std::fs::remove_file(&echo);
    assert_eq!(s.stdout, "server: ok\n", "{}", s.stderr);
    assert_eq!(c.stdout, "client: ok\n", "{}", c.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn an_srq_made_with_rdma_create_srq_serves_the_ids_qp_and_rdma_post_recv() {
    let Some(prog) = compile_c("cmsrq") else {
        return;
    };
    let prog = prog.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair(
        "cmsrq",
        &[&prog, "server", SERVER],
        &[&prog, "client", SERVER],
        &[],
    );
    let _ = std::fs::remove_file(&prog);
    assert_eq!(s.stdout, "server: ok\n", "{}", s.stderr);
    assert_eq!(c.stdout, "client: ok\n", "{}", c.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn fetch_and_add_and_compare_and_swap_read_the_old_value_and_update_the_peers_memory() {
    let Some(prog) = compile_c("atomic") else {
        return;
    };
    let prog = prog.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair(
        "atomic",
        &[&prog, "server", SERVER],
        &[&prog, "client", SERVER],
        &[],
    );
    let _ = std::fs::remove_file(&prog);
    assert_eq!(s.stdout, "server: ok\n", "{}", s.stderr);
    assert_eq!(c.stdout, "client: ok\n", "{}", c.stderr);
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn a_ud_qp_of_rdma_create_qp_reports_its_own_qp_number_in_completions_and_a_destroyed_id_is_einval() {
    let Some(prog) = compile_c("udqpn") else {
        return;
    };
    let prog = prog.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair(
        "udqpn",
        &[&prog, "server", SERVER],
        &[&prog, "client", SERVER],
        &[],
    );
    let _ = std::fs::remove_file(&prog);
    assert_eq!(s.stdout, "udqpn server: ok\n", "{}", s.stderr);
    assert_eq!(c.stdout, "udqpn client: ok\n", "{}", c.stderr);
    assert!(
        c.stderr
            .contains("cmsim: an rdma_cm_id that is not live (destroyed already?) was passed: EINVAL"),
        "{}",
        c.stderr
    );
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn messages_up_to_max_msg_sz_arrive_whole_one_byte_more_is_einval_and_a_foreign_rkey_is_rem_access_err() {
    let Some(sizes) = compile_c("sizes") else {
        return;
    };
    let sizes = sizes.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair(
        "sizes",
        &[&sizes, "server", SERVER],
        &[&sizes, "client", SERVER],
        &[],
    );
    let _ = std::fs::remove_file(&sizes);
    assert_eq!(c.stdout, "client: ok\n", "{}", c.stderr);
    assert_eq!(s.stdout, "server: ok\n", "{}", s.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(d.status.success(), "{}", d.stderr);
}

/// Runs `tests/c/fork.c` in `mode` on a fabric of its own; the program's output, the
/// daemon's, and the parent's and child's pids as it printed them.
fn fork_run(mode: &str) -> Option<(Output, Output, u32, u32)> {
    let fork = compile_c("fork")?;
    let fork = fork.to_string_lossy().into_owned();
    let fabric = Fabric::start(&format!("fork-{mode}"), 2, &[]);
    let run = fabric.spawn(SERVER, &[&fork, mode, SERVER]);
    let out = wait(run, Duration::from_secs(30), "fork");
    let daemon = fabric.finish();
    let _ = std::fs::remove_file(&fork);
    let pid = |who: &str| {
        out.stdout
            .lines()
            .find_map(|l| l.strip_prefix(who)?.strip_prefix(' ')?.parse::<u32>().ok())
            .unwrap_or_else(|| panic!("no `{who} PID` line in\n{}\n{}", out.stdout, out.stderr))
    };
    let (parent, child) = (pid("parent"), pid("child"));
    Some((out, daemon, parent, child))
}

#[test]
fn a_forked_child_is_a_process_of_its_own_and_cannot_act_on_its_parents_socket() {
    let Some((out, daemon, parent, child)) = fork_run("child-calls") else {
        return;
    };
    assert!(out.stdout.contains("child: ok"), "{}\n{}", out.stdout, out.stderr);
    assert!(
        out.stdout.contains("parent: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(
        out.stderr.contains(&format!(
            "process {child}, forked from {parent}, attaches to the fabric"
        )),
        "{}",
        out.stderr
    );
    assert!(
        daemon
            .stderr
            .contains(&format!("[{parent}]@{SERVER}'s socket from pid {child} refused")),
        "{}",
        daemon.stderr
    );
    assert!(daemon.status.success(), "{}", daemon.stderr);
}

#[test]
fn a_program_whose_name_is_not_utf8_attaches_under_its_name_shown_lossily() {
    let Some(fork) = compile_c("fork") else {
        return;
    };
    let fork = fork.to_string_lossy().into_owned();
    let fabric = Fabric::start("argv0", 2, &[]);
    // argv[0] is the byte 0xff and "fork": what a program may be called, though not UTF-8.
    let script = format!("exec -a \"$(printf '\\377')fork\" \"$0\" child-calls {SERVER}");
    let run = fabric.spawn(SERVER, &["bash", "-c", &script, &fork]);
    let out = wait(run, Duration::from_secs(30), "fork");
    let daemon = fabric.finish();
    let _ = std::fs::remove_file(&fork);
    assert!(
        out.stdout.contains("parent: ok"),
        "{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(daemon.stderr.contains("\u{fffd}fork["), "{}", daemon.stderr);
    assert!(daemon.status.success(), "{}", daemon.stderr);
}

#[test]
fn a_parent_that_exits_is_detached_at_once_though_its_child_holds_its_sockets() {
    let Some((out, daemon, parent, child)) = fork_run("parent-exits") else {
        return;
    };
    assert!(out.stdout.contains("child: ok"), "{}\n{}", out.stdout, out.stderr);
    let at = |what: String| {
        daemon
            .stderr
            .find(&what)
            .unwrap_or_else(|| panic!("no `{what}` in\n{}", daemon.stderr))
    };
    // Before its child (which slept a second holding the sockets) attached: the exit itself
    // was seen, not the last socket's close, so its region was revoked then.
    assert!(
        at(format!("[{parent}]@{SERVER} detached")) < at(format!("[{child}]@{SERVER} attached")),
        "{}",
        daemon.stderr
    );
    assert!(daemon.status.success(), "{}", daemon.stderr);
}

/// Sends `signal` to the program `child` runs (cmsim-run executes it, so the pid is its).
fn signal(child: &Child, signal: libc::c_int) {
    // SAFETY: kill has no memory arguments; the pid is our own child's, not yet reaped.
    assert_eq!(unsafe { libc::kill(child.id() as libc::pid_t, signal) }, 0);
}

/// The state letter of `child`'s process (`/proc/PID/stat`: R, S, T, Z...).
fn state(child: &Child) -> char {
    // Stopping takes effect at the next return to user space; a moment is enough.
    std::thread::sleep(Duration::from_millis(50));
    let stat = std::fs::read_to_string(format!("/proc/{}/stat", child.id())).expect("stat");
    let after_name = &stat[stat.rfind(')').expect("(comm)") + 1..];
    after_name.trim_start().chars().next().expect("a state")
}

/// A process of the test's own on the fabric at `socket`: attaches and makes a channel, which
/// must take less than `within`.
fn served_within(socket: &Path, within: Duration) {
    use cm_dropin::proto::{Dec, Enc, Op};
    let started = Instant::now();
    let conn = cm_dropin::sock::SeqConn::connect(socket).expect("connect");
    conn.send(&Enc::hello(std::process::id(), SERVER, "bystander").0)
        .expect("hello");
    let mut buf = Vec::new();
    assert!(conn.recv(&mut buf).expect("hello's answer"));
    assert_eq!(Dec::new(&buf).i32(), Ok(0));
    conn.send(&Enc::op(Op::CreateChannel).0).expect("request");
    assert!(conn.recv(&mut buf).expect("reply"));
    assert_eq!(Dec::new(&buf).i32(), Ok(0));
    assert!(started.elapsed() < within, "served in {:?}", started.elapsed());
}

#[test]
fn a_program_stopped_mid_run_holds_up_no_one_and_finishes_when_continued() {
    if !installed("cmtime") {
        return;
    }
    let fabric = Fabric::start("stopped", 3, &[]);
    // 5 000 connections: several seconds in a debug build, so the stop comes mid-run.
    let server = fabric.spawn(SERVER, &["cmtime", "-b", SERVER, "-c", "5000"]);
    let client = fabric.spawn(CLIENT, &["cmtime", "-s", SERVER, "-b", CLIENT, "-c", "5000"]);
    std::thread::sleep(Duration::from_millis(500));
    signal(&client, libc::SIGSTOP);
    if state(&client) != 'T' {
        let out = wait(client, Duration::from_secs(5), "cmtime client");
        panic!("not stopped mid-run: {}\n{}", out.stdout, out.stderr);
    }
    served_within(&fabric.socket, Duration::from_secs(2));
    // Longer than the daemon waits for a reply to be read: a stopped program has at most one
    // reply per thread waiting, which its socket holds, so it is not taken for one that
    // stopped reading.
    std::thread::sleep(Duration::from_secs(6));
    signal(&client, libc::SIGCONT);
    let out = wait(client, Duration::from_secs(90), "cmtime client");
    let server_out = stop(server);
    assert!(
        out.status.success(),
        "client: {}\n{}\nserver: {}",
        out.stdout,
        out.stderr,
        server_out.stderr
    );
    assert!(
        out.stdout.lines().any(|l| l.starts_with("connect")),
        "{}",
        out.stdout
    );
    let daemon = fabric.finish();
    assert!(!daemon.stderr.contains("cut off"), "{}", daemon.stderr);
    assert!(daemon.status.success(), "{}", daemon.stderr);
}

#[test]
fn a_program_killed_mid_run_is_detached_and_the_fabric_goes_on() {
    if !installed("cmtime") {
        return;
    }
    // Both pairs and the bystander.
    let fabric = Fabric::start("killed", 5, &[]);
    let server = fabric.spawn(SERVER, &["cmtime", "-b", SERVER, "-c", "5000"]);
    let client = fabric.spawn(CLIENT, &["cmtime", "-s", SERVER, "-b", CLIENT, "-c", "5000"]);
    std::thread::sleep(Duration::from_millis(500));
    let server_pid = server.id();
    assert!(
        matches!(state(&server), 'S' | 'R'),
        "killed mid-run, not finished already"
    );
    signal(&server, libc::SIGKILL);
    let _ = wait(server, Duration::from_secs(10), "killed server");
    served_within(&fabric.socket, Duration::from_secs(2));
    let _ = stop(client);
    // A second pair on the same fabric, after the first's ends.
    let server = fabric.spawn(SERVER, &["cmtime", "-b", SERVER, "-c", "20"]);
    let client = fabric.spawn(CLIENT, &["cmtime", "-s", SERVER, "-b", CLIENT, "-c", "20"]);
    let out = wait(client, Duration::from_secs(60), "second cmtime client");
    let _ = stop(server);
    assert!(out.status.success(), "{}\n{}", out.stdout, out.stderr);
    let daemon = fabric.finish();
    assert!(
        daemon
            .stderr
            .contains(&format!("cmtime[{server_pid}]@{SERVER} detached")),
        "{}",
        daemon.stderr
    );
    assert!(!daemon.stderr.contains("panicked"), "{}", daemon.stderr);
}

#[test]
fn rping_pings_with_rdma_read_and_write_and_validates_the_data() {
    if !installed("rping") {
        return;
    }
    // The server RDMA READs the client's ping buffer and RDMA WRITEs it back into the client's
    // sink; -V makes the client compare the two every time. The completion channel and its
    // thread carry every completion, and the disconnect's flush ends that thread.
    let trace = std::env::temp_dir().join(format!("cmsim-rping-{}.trace", std::process::id()));
    let (s, c, d) = finishing_pair(
        "rping",
        &[
            "rping", "-s", "-a", SERVER, "-p", "7471", "-C", "20", "-S", "1000", "-v",
        ],
        &[
            "rping", "-c", "-a", SERVER, "-p", "7471", "-C", "20", "-S", "1000", "-V", "-v",
        ],
        &["--trace", trace.to_str().expect("utf-8 path")],
    );
    assert!(c.status.success(), "client: {}\n{}", c.stdout, c.stderr);
    // Carried out by the simulator, in its trace: each READ and WRITE sent, executed at the
    // peer and completed.
    let lines = std::fs::read_to_string(&trace).expect("the trace");
    let _ = std::fs::remove_file(&trace);
    for op in ["RDMA_READ", "RDMA_WRITE"] {
        for step in [
            format!("{SERVER} id#2 {op} sent to {CLIENT} status=0"),
            format!("{CLIENT} id#1 {op} executed from {SERVER} status=0"),
            format!("{SERVER} id#2 {op} completed with {CLIENT} status=0"),
        ] {
            let n = lines.lines().filter(|l| l.ends_with(&step)).count();
            assert_eq!(n, 20, "{step}:\n{lines}");
        }
    }
    assert!(s.status.success(), "server: {}\n{}", s.stdout, s.stderr);
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
    let read = s
        .stdout
        .lines()
        .filter(|l| l.starts_with("server ping data: rdma-ping-"))
        .count();
    assert_eq!(read, 20, "the server read every ping: {}", s.stdout);
    assert!(
        !c.stderr.contains("mismatch") && !c.stdout.contains("mismatch"),
        "{}",
        c.stderr
    );
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn a_partition_under_rping_fails_its_rdma_with_retry_exceeded_as_on_a_fabric() {
    if !installed("rping") {
        return;
    }
    // RDMA READ and WRITE are the simulator's: a partition 8 s in (rping pings without end)
    // makes the operation in flight exhaust its transport retries: the server's READ or WRITE,
    // or the client's SEND, whichever side was working when it struck (the other waits for
    // a message for ever, as on a fabric). The 8 s leave room for the pair to connect first
    // on a loaded machine.
    let fabric = Fabric::start("rping-partition", 2, &["--fault", "8000:partition 0 1"]);
    let mut server = fabric.spawn(SERVER, &["rping", "-s", "-a", SERVER, "-p", "7471", "-S", "1000"]);
    let mut client = fabric.spawn(
        CLIENT,
        &["rping", "-c", "-a", SERVER, "-p", "7471", "-S", "1000", "-V"],
    );
    let deadline = Instant::now() + Duration::from_secs(90);
    let (failed, waiting) = loop {
        assert!(Instant::now() < deadline, "neither rping ended within 90 s");
        if server.try_wait().expect("try_wait").is_some() {
            break (server, client);
        }
        if client.try_wait().expect("try_wait").is_some() {
            break (client, server);
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let out = wait(failed, Duration::from_secs(10), "the rping that failed");
    let _ = stop(waiting);
    assert!(
        out.stdout.contains("cq completion failed status 12")
            || out.stderr.contains("cq completion failed status 12"),
        "IBV_WC_RETRY_EXC_ERR expected:\n{}\n{}",
        out.stdout,
        out.stderr
    );
    assert!(!out.status.success());
}

#[test]
fn channel_fds_are_readable_exactly_when_an_event_is_queued() {
    let Some(fds) = compile_c("fds") else {
        return;
    };
    let fds = fds.to_string_lossy().into_owned();
    let (s, c, d) = finishing_pair("fds", &[&fds, "server", SERVER], &[&fds, "client", SERVER], &[]);
    let _ = std::fs::remove_file(&fds);
    assert_eq!(s.stdout, "server: ok\n", "{}", s.stderr);
    assert_eq!(c.stdout, "client: ok\n", "{}", c.stderr);
    assert!(s.status.success() && c.status.success());
    assert!(d.status.success(), "{}", d.stderr);
}

#[test]
fn removing_the_servers_device_under_a_running_rping_ends_the_server_with_an_error() {
    if !installed("rping") {
        return;
    }
    // rping without -C pings until something fails; the server's device goes away after 1.5 s
    // (while connected, or still listening on a slow machine: both report the removal).
    let fabric = Fabric::start("removal", 2, &["--fault", "1500:remove-device 0"]);
    let server = fabric.spawn(SERVER, &["rping", "-s", "-a", SERVER, "-p", "7471"]);
    let client = fabric.spawn(CLIENT, &["rping", "-c", "-a", SERVER, "-p", "7471"]);
    let s = wait(server, Duration::from_secs(30), "rping server");
    let _ = stop(client);
    assert!(
        s.stderr.contains("cma detected device removal!!!!"),
        "{}",
        s.stderr
    );
    assert_eq!(s.status.code(), Some(255), "rping returns -1: {}", s.stderr);
}

#[test]
fn udaddy_exchanges_datagrams_over_ud_qps() {
    if !installed("udaddy") {
        return;
    }
    // The UDP port space's SIDR exchange gives the client the server's QP number and Q_Key in
    // ESTABLISHED's param.ud; the server answers each datagram's sender (ibv_create_ah_from_wc,
    // the sender's QP number in imm_data); receive buffers start with the 40-byte GRH.
    let fabric = Fabric::start("udaddy", 2, &[]);
    let server = fabric.spawn_with_port(SERVER, 7174, &["udaddy", "-b", SERVER, "-c", "3", "-C", "10"]);
    let client = fabric.spawn_with_port(
        CLIENT,
        7174,
        &["udaddy", "-s", SERVER, "-b", CLIENT, "-c", "3", "-C", "10"],
    );
    let c = wait(client, Duration::from_secs(60), "udaddy client");
    let s = wait(server, Duration::from_secs(30), "udaddy server");
    for (who, o) in [("server", &s), ("client", &c)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout.contains("data transfers complete"),
            "{who}: {}",
            o.stdout
        );
        assert!(o.stdout.contains("return status 0"), "{who}: {}", o.stdout);
        assert!(o.stderr.is_empty(), "{who} stderr: {}", o.stderr);
    }
    assert!(fabric.finish().status.success());
}

#[test]
fn mckey_sends_to_a_multicast_group_and_the_member_receives() {
    if !installed("mckey") {
        return;
    }
    // Both join 224.0.0.1 (MULTICAST_JOIN with the group's GID, QPN 0xFFFFFF and Q_Key); the
    // sender waits 3 s after joining (mckey's own pause), so the receiver, started first, has
    // joined and posted its receives by then.
    let fabric = Fabric::start("mckey", 2, &[]);
    let receiver = fabric.spawn(SERVER, &["mckey", "-m", "224.0.0.1", "-b", SERVER, "-C", "10"]);
    let sender = Command::new(RUN)
        .arg("--socket")
        .arg(&fabric.socket)
        .args([
            "--host",
            CLIENT,
            "--",
            "mckey",
            "-m",
            "224.0.0.1",
            "-b",
            CLIENT,
            "-s",
            "-C",
            "10",
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    let s = wait(sender, Duration::from_secs(60), "mckey sender");
    let r = wait(receiver, Duration::from_secs(60), "mckey receiver");
    for (who, o) in [("receiver", &r), ("sender", &s)] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        assert!(
            o.stdout
                .contains("mckey: joined dgid: ::ffff:224.0.0.1 mlid 0x0 sl 0"),
            "{who}: {}",
            o.stdout
        );
        assert!(
            o.stdout.contains("data transfers complete"),
            "{who}: {}",
            o.stdout
        );
        assert!(o.stderr.is_empty(), "{who} stderr: {}", o.stderr);
    }
    assert!(r.stdout.contains("receiving data transfers"), "{}", r.stdout);
    assert!(fabric.finish().status.success());
}

/// Runs `program` on `SERVER` with no daemon behind the socket.
fn run_without_daemon(program: &[&str]) -> Output {
    let child = Command::new(RUN)
        .args(["--socket", "/nonexistent/cmsim.sock", "--host", SERVER, "--"])
        .args(program)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    wait(child, Duration::from_secs(30), program[0])
}

#[test]
fn refused_calls_answer_the_error_of_their_c_return_type_and_name_themselves_on_stderr() {
    let Some(symbols) = compile_c("symbols") else {
        return;
    };
    let symbols = symbols.to_string_lossy().into_owned();
    let o = run_without_daemon(&[&symbols, "refused"]);
    let _ = std::fs::remove_file(&symbols);
    assert_eq!(o.stdout, "refused: ok\n", "{}", o.stderr);
    assert!(o.status.success());
    // In the order symbols.c calls them: one line each, and nothing else.
    let enosys = [
        "rbind",
        "rgetpeername",
        "rselect",
        "riounmap",
        "rdma_notify",
        "rdma_reject_ece",
        "rdma_set_local_ece",
        "ibv_get_async_event",
        "ibv_read_sysfs_file",
        "rrecv",
        "rsend",
        "rread",
        "rreadv",
        "rrecvfrom",
        "rrecvmsg",
        "rsendto",
        "rsendmsg",
        "rwrite",
        "rwritev",
        "riomap",
        "riowrite",
        "ibv_attach_mcast",
        "ibv_resize_cq",
    ];
    let enosys_after = [
        "ibv_resolve_eth_l2_from_gid",
        "ibv_rereg_mr",
        "ibv_import_pd",
        "ibv_get_sysfs_path",
        "ibv_query_qp_data_in_order",
        "ibv_ack_async_event",
        "ibv_unimport_pd",
    ];
    let want: Vec<String> = enosys
        .iter()
        .map(|n| format!("cmsim: {n} is not supported on the simulator (ENOSYS)"))
        .chain(std::iter::once(
            "cmsim: ibv_query_ece is not supported on the simulator (EOPNOTSUPP)".to_string(),
        ))
        .chain(
            enosys_after
                .iter()
                .map(|n| format!("cmsim: {n} is not supported on the simulator (ENOSYS)")),
        )
        .collect();
    let got: Vec<&str> = o.stderr.lines().collect();
    assert_eq!(got, want, "stderr: {}", o.stderr);
}

#[test]
fn served_names_rates_and_struct_copies_give_rdma_core_v44s_values() {
    let Some(symbols) = compile_c("symbols") else {
        return;
    };
    let symbols = symbols.to_string_lossy().into_owned();
    let served = run_without_daemon(&[&symbols, "served"]);
    let dropin = run_without_daemon(&[&symbols, "dump"]);
    assert_eq!(served.stdout, "served: ok\n", "{}", served.stderr);
    assert!(served.status.success());
    // Served calls say nothing; rdma_get_devices without a daemon says why it has no device.
    assert!(
        served
            .stderr
            .starts_with("cmsim: cannot reach the fabric daemon at /nonexistent/cmsim.sock")
            && served.stderr.lines().count() == 1,
        "stderr: {}",
        served.stderr
    );
    assert!(dropin.status.success(), "{}", dropin.stderr);
    assert!(dropin.stderr.is_empty(), "{}", dropin.stderr);
    let v44 = std::fs::canonicalize("/usr/lib/x86_64-linux-gnu/libibverbs.so.1")
        .is_ok_and(|p| p.to_string_lossy().ends_with(".44.0"));
    if !v44 {
        let _ = std::fs::remove_file(&symbols);
        eprintln!("skipped the comparison: rdma-core v44's libibverbs.so.1 is not installed");
        return;
    }
    // The same program on rdma-core's own libraries, which it was linked against.
    let native = Command::new(&symbols)
        .arg("dump")
        .env_remove("LD_LIBRARY_PATH")
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start symbols");
    let native = wait(native, Duration::from_secs(30), "symbols dump");
    let _ = std::fs::remove_file(&symbols);
    assert!(native.status.success(), "{}", native.stderr);
    assert!(native.stdout.lines().count() > 100, "{}", native.stdout);
    let diff: Vec<(&str, &str)> = native
        .stdout
        .lines()
        .zip(dropin.stdout.lines())
        .filter(|(n, d)| n != d)
        .collect();
    assert!(
        diff.is_empty() && native.stdout.lines().count() == dropin.stdout.lines().count(),
        "rdma-core and the drop-in differ (rdma-core, drop-in): {diff:#?}"
    );
}

#[test]
fn a_program_on_a_fabric_host_gets_the_simulated_device_and_its_ids_ports() {
    let Some(symbols) = compile_c("symbols") else {
        return;
    };
    let symbols = symbols.to_string_lossy().into_owned();
    let fabric = Fabric::start("symbols", 1, &[]);
    let o = wait(
        fabric.spawn(SERVER, &[&symbols, "devices", SERVER]),
        Duration::from_secs(30),
        "symbols devices",
    );
    let _ = std::fs::remove_file(&symbols);
    assert_eq!(o.stdout, "devices: ok\n", "{}", o.stderr);
    assert!(o.status.success());
    assert!(o.stderr.is_empty(), "stderr: {}", o.stderr);
    assert!(fabric.finish().status.success());
}
