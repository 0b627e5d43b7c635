//! `cmsim-daemon` as a command: what it refuses before it serves anyone (bad arguments, a
//! socket path it must not take), each with a one-line message and exit status 2, and the
//! socket it makes reachable only as asked. No rdma-core program is needed.

use std::io::Read;
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::path::PathBuf;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");

/// A path of this test's own under the temporary directory, with nothing there.
fn scratch(name: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!("cmsim-daemon-{name}-{}", std::process::id()));
    let _ = std::fs::remove_file(&p);
    p
}

fn spawn(args: &[&str]) -> Child {
    Command::new(DAEMON)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-daemon")
}

/// Waits at most 30 s for `child` to exit; its status and stderr.
fn finish(mut child: Child) -> (ExitStatus, String) {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut err = String::new();
            child
                .stderr
                .take()
                .expect("piped")
                .read_to_string(&mut err)
                .expect("read stderr");
            return (status, err);
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            panic!("cmsim-daemon did not exit within 30 s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Ends `daemon` with `signal`, which it must take as a stop (exit 128 + the signal); its stderr.
#[track_caller]
fn stop(daemon: Child, signal: libc::c_int) -> String {
    // SAFETY: kill has no memory arguments; the pid is our own child's, not yet reaped.
    assert_eq!(unsafe { libc::kill(daemon.id() as libc::pid_t, signal) }, 0);
    let (status, err) = finish(daemon);
    assert_eq!(status.code(), Some(128 + signal), "signal {signal}: {err}");
    err
}

/// Runs the daemon with `args`, which it must refuse: exit 2 and one line naming `about`.
#[track_caller]
fn refused(args: &[&str], about: &str) -> String {
    let (status, err) = finish(spawn(args));
    assert_eq!(status.code(), Some(2), "{args:?}: {err}");
    assert_eq!(err.lines().count(), 1, "one line for {args:?}: {err}");
    assert!(err.contains(about), "{args:?}: {err:?} does not name {about:?}");
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Waits until `path` is a socket (the daemon listens).
fn wait_for_socket(path: &std::path::Path) {
    let deadline = Instant::now() + Duration::from_secs(10);
    while !std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket()) {
        assert!(Instant::now() < deadline, "no socket at {}", path.display());
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
fn hosts_the_fabric_cannot_have_are_a_usage_error_not_a_panic() {
    let socket = scratch("hosts");
    let s = socket.to_str().expect("utf-8 path");
    refused(&["--socket", s, "--host", "notanip"], "notanip");
    refused(
        &["--socket", s, "--host", "10.0.0.1", "--host", "10.0.0.1"],
        "10.0.0.1",
    );
    refused(&["--socket", s, "--host", "127.0.0.1"], "127.0.0.1");
    refused(
        &["--socket", s, "--host", "10.0.0.1", "--fault", "0:crash 3"],
        "host 3",
    );
    refused(
        &["--socket", s, "--host", "10.0.0.1", "--socket-mode", "999"],
        "--socket-mode",
    );
    assert!(std::fs::symlink_metadata(&socket).is_err(), "nothing was made");
}

#[test]
fn a_socket_path_holding_a_file_is_refused_and_the_file_kept() {
    let path = scratch("file");
    std::fs::write(&path, b"somebody's data").expect("write");
    let p = path.to_str().expect("utf-8 path");
    refused(&["--socket", p, "--host", "10.0.0.1"], "not a socket");
    assert_eq!(std::fs::read(&path).expect("still there"), b"somebody's data");
    let _ = std::fs::remove_file(&path);
}

#[test]
fn a_second_daemon_on_a_running_ones_socket_is_refused_and_the_first_keeps_it() {
    let path = scratch("second");
    let p = path.to_str().expect("utf-8 path");
    let first = spawn(&["--socket", p, "--host", "10.0.0.1", "--max-seconds", "5"]);
    wait_for_socket(&path);
    refused(&["--socket", p, "--host", "10.0.0.1"], "already");
    assert!(
        std::fs::symlink_metadata(&path).is_ok_and(|m| m.file_type().is_socket()),
        "the first daemon's socket is still there"
    );
    // The first daemon ends at its own time limit (exit 3) and removes its socket then.
    let (status, err) = finish(first);
    assert_eq!(status.code(), Some(3), "{err}");
    assert!(std::fs::symlink_metadata(&path).is_err(), "removed at exit");
}

#[test]
fn the_socket_is_reachable_only_by_its_owner_unless_a_mode_is_asked_for() {
    for (mode, want) in [(None, 0o600), (Some("660"), 0o660)] {
        let path = scratch(&format!("mode-{want:o}"));
        let p = path.to_str().expect("utf-8 path");
        let mut args = vec!["--socket", p, "--host", "10.0.0.1", "--max-seconds", "2"];
        if let Some(m) = mode {
            args.extend(["--socket-mode", m]);
        }
        // Whatever the umask the daemon starts with.
        let daemon = Command::new("sh")
            .arg("-c")
            .arg("umask 000; exec \"$@\"")
            .arg("sh")
            .arg(DAEMON)
            .args(&args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cmsim-daemon under umask 000");
        wait_for_socket(&path);
        let got = std::fs::symlink_metadata(&path)
            .expect("the socket")
            .permissions()
            .mode()
            & 0o777;
        assert_eq!(got, want, "mode {mode:?}");
        let (status, err) = finish(daemon);
        assert_eq!(status.code(), Some(3), "{err}");
    }
}

/// A process attached to the daemon at `socket` on host `host`, by the wire protocol's hello.
fn attach(socket: &std::path::Path, host: &str) -> cm_dropin::sock::SeqConn {
    attach_with_token(socket, host).0
}

/// A request and its status (and the reply's rest), answered within 10 s.
#[track_caller]
fn ask(conn: &cm_dropin::sock::SeqConn, req: &cm_dropin::proto::Enc) -> (i32, Vec<u8>) {
    use std::os::fd::AsRawFd;
    conn.send(&req.0).expect("send");
    let ready =
        cm_dropin::sock::poll(&[(conn.as_raw_fd(), cm_dropin::sock::Interest::Read)], 10_000).expect("poll");
    assert!(
        ready[0].readable || ready[0].closed,
        "no answer within 10 s to op {:?}",
        cm_dropin::proto::Dec::new(&req.0).u32()
    );
    let mut buf = Vec::new();
    assert!(conn.recv(&mut buf).expect("reply"), "the daemon answers");
    let status = cm_dropin::proto::Dec::new(&buf).i32().expect("status");
    (status, buf[4..].to_vec())
}

#[test]
fn a_region_past_the_end_of_the_address_space_is_refused_and_the_daemon_goes_on() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, path) = one_host("regmr", "3");
    let conn = attach(&path, "10.0.0.1");
    let reg = |addr: u64, len: u64| {
        let mut e = Enc::op(Op::RegMr);
        e.u64(addr).u64(len).u32(7);
        e
    };
    assert_eq!(ask(&conn, &reg(u64::MAX - 15, 64)).0, libc::EINVAL);
    assert_eq!(ask(&conn, &reg(u64::MAX, 1)).0, libc::EINVAL);
    let (status, rest) = ask(&conn, &reg(0x1000, 64));
    assert_eq!(status, 0, "a region that fits is registered");
    let key = u32::from_le_bytes(rest[..4].try_into().expect("a key"));
    assert_ne!(key, 0);
    drop(conn);
    let (status, err) = finish(daemon);
    assert_eq!(status.code(), Some(3), "it ran to its limit: {err}");
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn a_trace_file_that_cannot_be_written_is_refused_before_anyone_attaches() {
    let socket = scratch("trace-dir");
    let s = socket.to_str().expect("utf-8 path");
    refused(
        &[
            "--socket",
            s,
            "--host",
            "10.0.0.1",
            "--trace",
            "/nonexistent/dir/trace.txt",
        ],
        "/nonexistent/dir/trace.txt",
    );
    refused(
        &[
            "--socket",
            s,
            "--host",
            "10.0.0.1",
            "--trace-mermaid",
            "/nonexistent/dir/t.mmd",
        ],
        "/nonexistent/dir/t.mmd",
    );
    assert!(std::fs::symlink_metadata(&socket).is_err(), "no socket was made");
}

#[test]
fn sigint_and_sigterm_end_the_daemon_with_its_trace_written_and_its_socket_removed() {
    for (signal, name) in [(libc::SIGINT, "int"), (libc::SIGTERM, "term")] {
        let path = scratch(&format!("signal-{name}"));
        let trace = scratch(&format!("signal-{name}.trace"));
        let (p, t) = (path.to_str().expect("utf-8"), trace.to_str().expect("utf-8"));
        let daemon = spawn(&[
            "--socket",
            p,
            "--host",
            "10.0.0.1",
            "--max-seconds",
            "60",
            "--trace",
            t,
        ]);
        wait_for_socket(&path);
        // Something in the trace: a process that attaches and leaves.
        drop(attach(&path, "10.0.0.1"));
        let err = stop(daemon, signal);
        assert!(err.contains("stopped by signal"), "{name}: {err}");
        assert!(
            std::fs::symlink_metadata(&path).is_err(),
            "{name}: the socket is removed"
        );
        let written = std::fs::read_to_string(&trace).expect("the trace was written");
        assert!(
            written.ends_with('\n'),
            "{name}: a complete trace file: {written:?}"
        );
        let _ = std::fs::remove_file(&trace);
    }
}

#[test]
fn an_empty_message_is_answered_as_malformed_and_its_process_stays_attached() {
    use cm_dropin::proto::{Enc, Op};
    let path = scratch("empty");
    let p = path.to_str().expect("utf-8 path");
    let daemon = spawn(&[
        "--socket",
        p,
        "--host",
        "10.0.0.1",
        "--processes",
        "1",
        "--max-seconds",
        "20",
    ]);
    wait_for_socket(&path);
    let conn = attach(&path, "10.0.0.1");
    assert_eq!(ask(&conn, &Enc(Vec::new())).0, libc::EPROTO);
    let mut reg = Enc::op(Op::RegMr);
    reg.u64(0x1000).u64(64).u32(7);
    assert_eq!(ask(&conn, &reg).0, 0, "still attached: served");
    drop(conn);
    // --processes 1: the daemon ends once its one process has gone, and only then.
    let (status, err) = finish(daemon);
    assert_eq!(status.code(), Some(0), "{err}");
    assert_eq!(err.matches("attached as host").count(), 1, "{err}");
}

#[test]
fn silent_connections_are_closed_in_time_and_cannot_crowd_out_a_program() {
    let (daemon, path) = one_host("silent", "30");
    // More connections that never say a word than the daemon keeps.
    let silent: Vec<_> = (0..300)
        .map(|_| cm_dropin::sock::SeqConn::connect(&path).expect("connect"))
        .collect();
    let started = Instant::now();
    drop(attach(&path, "10.0.0.1"));
    // The first silent one is closed by the daemon: its recv sees the end, within the 5 s
    // allowed for a first message and a margin.
    use std::os::fd::AsRawFd;
    // Past the daemon's 128 the oldest went at once, as the others came.
    let first = cm_dropin::sock::poll(&[(silent[0].as_raw_fd(), cm_dropin::sock::Interest::Read)], 2_000)
        .expect("poll");
    assert!(
        first[0].closed || first[0].readable,
        "the oldest silent one is closed at once"
    );
    assert!(started.elapsed() < Duration::from_secs(3));
    let ready = cm_dropin::sock::poll(
        &[(silent[299].as_raw_fd(), cm_dropin::sock::Interest::Read)],
        15_000,
    )
    .expect("poll");
    assert!(ready[0].readable || ready[0].closed, "closed within 15 s");
    let mut buf = Vec::new();
    assert!(!silent[299].recv(&mut buf).expect("recv"), "closed, not answered");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_secs(4),
        "not before its time: {waited:?}"
    );
    assert!(waited < Duration::from_secs(15), "{waited:?}");
    drop(silent);
    stop(daemon, libc::SIGTERM);
}

/// [`attach`], with the process token the hello's answer names.
fn attach_with_token(socket: &std::path::Path, host: &str) -> (cm_dropin::sock::SeqConn, u64) {
    attach_named(socket, host, "daemon-test")
}

/// [`attach_with_token`] under the program name `name` (the daemon's messages show it).
fn attach_named(socket: &std::path::Path, host: &str, name: &str) -> (cm_dropin::sock::SeqConn, u64) {
    use cm_dropin::proto::{Dec, Enc};
    let conn = cm_dropin::sock::SeqConn::connect(socket).expect("connect");
    conn.send(&Enc::hello(std::process::id(), host, name).0)
        .expect("hello");
    let mut buf = Vec::new();
    assert!(conn.recv(&mut buf).expect("hello's answer"));
    let mut d = Dec::new(&buf);
    assert_eq!(d.i32(), Ok(0), "attached");
    (conn, d.u64().expect("the process's token"))
}

#[test]
fn only_the_process_an_event_went_to_may_ack_it_and_tokens_cannot_be_guessed() {
    use cm_dropin::proto::{Dec, Enc, Op, CHAN_ATTACHED, CHAN_EVENT};
    use std::os::fd::AsRawFd;
    let (daemon, path) = one_host("ack", "30");
    let (a, a_token) = attach_with_token(&path, "10.0.0.1");
    let (b, b_token) = attach_named(&path, "10.0.0.1", "other");
    // Successive processes' tokens are not neighbours: the low 36 bits are random (this fails
    // by chance once in 2^36 runs).
    assert_ne!(
        b_token.wrapping_sub(a_token),
        1 << 36,
        "{a_token:#x} {b_token:#x}"
    );
    assert_ne!(b_token.wrapping_sub(a_token), 1, "{a_token:#x} {b_token:#x}");

    let one = |conn: &cm_dropin::sock::SeqConn, e: &Enc| {
        let (status, rest) = ask(conn, e);
        assert_eq!(status, 0, "{:?}", Dec::new(&e.0).u32());
        u64::from_le_bytes(rest[..8].try_into().expect("a token"))
    };
    let ch = one(&a, &Enc::op(Op::CreateChannel));
    let sock = cm_dropin::sock::SeqConn::connect(&path).expect("connect the channel");
    let mut attach = Enc::op(Op::AttachChannel);
    attach.u64(a_token).u64(ch);
    sock.send(&attach.0).expect("attach");
    let mut buf = Vec::new();
    assert!(sock.recv(&mut buf).expect("attached"));
    assert_eq!(buf, [CHAN_ATTACHED]);
    let mut create = Enc::op(Op::CreateId);
    create.u64(ch).u32(0x0106);
    let id = one(&a, &create);
    let mut resolve = Enc::op(Op::ResolveAddr);
    resolve
        .u64(id)
        .addr(None)
        .addr(Some("10.0.0.1:7471".parse().expect("address")))
        .u32(1000);
    assert_eq!(ask(&a, &resolve).0, 0);
    let ready =
        cm_dropin::sock::poll(&[(sock.as_raw_fd(), cm_dropin::sock::Interest::Read)], 10_000).expect("poll");
    assert!(ready[0].readable, "ADDR_RESOLVED within 10 s");
    assert!(sock.recv(&mut buf).expect("the event"));
    let mut d = Dec::new(&buf);
    assert_eq!(d.u8(), Ok(CHAN_EVENT));
    let n = d.event().expect("an event").event_no;
    // Acks are not answered; a request after each makes sure the daemon has taken it.
    let mut ack = Enc::op(Op::AckEvent);
    ack.u64(n);
    let acked = |conn: &cm_dropin::sock::SeqConn| {
        conn.send(&ack.0).expect("ack");
        assert_eq!(ask(conn, &Enc::op(Op::CreateChannel)).0, 0);
    };
    acked(&b); // another process's: refused
    acked(&a); // the owner's: taken, as the event was still outstanding
    acked(&a); // once: refused
    drop((a, b, sock));
    let err = stop(daemon, libc::SIGTERM);
    let refused = |who: &str| {
        err.lines()
            .filter(|l| {
                l.contains(&format!("{who}["))
                    && l.ends_with("acked already")
                    && l.contains(&format!("event {n} "))
            })
            .count()
    };
    assert_eq!(refused("other"), 1, "{err}");
    assert_eq!(refused("daemon-test"), 1, "{err}");
}

/// The daemon's open fds, from /proc.
fn open_fds(daemon: &Child) -> usize {
    std::fs::read_dir(format!("/proc/{}/fd", daemon.id()))
        .expect("the daemon's /proc entry")
        .count()
}

#[test]
fn a_hello_that_names_another_process_is_refused() {
    use cm_dropin::proto::{Dec, Enc};
    let (daemon, path) = one_host("forged-pid", "30");
    // init, and the daemon itself (whose heap holds other programs' messages).
    for pid in [1, daemon.id()] {
        let conn = cm_dropin::sock::SeqConn::connect(&path).expect("connect");
        conn.send(&Enc::hello(pid, "10.0.0.1", "forger").0)
            .expect("hello");
        let mut buf = Vec::new();
        assert!(conn.recv(&mut buf).expect("an answer"));
        assert_eq!(Dec::new(&buf).i32(), Ok(libc::EPERM), "a hello naming pid {pid}");
    }
    // The truth is welcome.
    let (conn, _) = attach_with_token(&path, "10.0.0.1");
    drop(conn);
    let err = stop(daemon, libc::SIGTERM);
    assert!(
        err.contains("hello refused: it says pid 1, the kernel says pid"),
        "{err}"
    );
}

/// Not a test of its own: the other process that [`a_channel_attach_from_another_process_is_refused_though_it_names_the_tokens`]
/// needs, run as this test binary with `CMSIM_FORGE_ATTACH=socket,proc,channel`. Prints
/// `attached` when the daemon took the attach, `refused` when it closed the connection.
#[test]
#[ignore = "a helper process of another test"]
fn forged_attach_helper() {
    use cm_dropin::proto::{Enc, Op};
    let Ok(spec) = std::env::var("CMSIM_FORGE_ATTACH") else {
        return;
    };
    let parts: Vec<&str> = spec.split(',').collect();
    let conn = cm_dropin::sock::SeqConn::connect(std::path::Path::new(parts[0])).expect("connect");
    let mut attach = Enc::op(Op::AttachChannel);
    attach
        .u64(parts[1].parse().expect("proc"))
        .u64(parts[2].parse().expect("channel"));
    conn.send(&attach.0).expect("attach");
    let mut buf = Vec::new();
    match conn.recv(&mut buf) {
        Ok(true) => println!("attached"),
        _ => println!("refused"),
    }
}

#[test]
fn a_channel_attach_from_another_process_is_refused_though_it_names_the_tokens() {
    use cm_dropin::proto::{Enc, Op, CHAN_ATTACHED};
    let (daemon, path) = one_host("forged-attach", "30");
    let (conn, proc) = attach_with_token(&path, "10.0.0.1");
    let (status, rest) = ask(&conn, &Enc::op(Op::CreateChannel));
    assert_eq!(status, 0);
    let ch = u64::from_le_bytes(rest[..8].try_into().expect("a token"));
    // Another process that knows both tokens (leaked, or guessed against the odds).
    let out = Command::new(std::env::current_exe().expect("this test binary"))
        .args([
            "--exact",
            "forged_attach_helper",
            "--ignored",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("CMSIM_FORGE_ATTACH", format!("{},{proc},{ch}", path.display()))
        .output()
        .expect("run the helper");
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(said.contains("refused"), "{said}");
    // The channel is still its owner's to attach.
    let sock = cm_dropin::sock::SeqConn::connect(&path).expect("connect the channel");
    let mut attach = Enc::op(Op::AttachChannel);
    attach.u64(proc).u64(ch);
    sock.send(&attach.0).expect("attach");
    let mut buf = Vec::new();
    assert!(sock.recv(&mut buf).expect("attached"));
    assert_eq!(buf, [CHAN_ATTACHED]);
    drop((conn, sock));
    let err = stop(daemon, libc::SIGTERM);
    assert!(err.contains("a channel attach for daemon-test"), "{err}");
}

#[test]
fn a_client_that_never_reads_its_replies_is_cut_off_and_the_others_are_served_meanwhile() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, path) = one_host("never-reads", "60");
    let (flooder, _) = attach_with_token(&path, "10.0.0.1");
    // Requests (each answered EINVAL) until the socket takes no more: the daemon has stopped
    // reading them, since their replies have nowhere to go.
    let mut query = Enc::op(Op::QueryAddrs);
    query.u64(0);
    let mut sent = 0;
    let mut full_since: Option<Instant> = None;
    let flooding = Instant::now();
    // Until the socket has stayed full for half a second.
    while full_since.is_none_or(|t| t.elapsed() < Duration::from_millis(500)) {
        assert!(
            flooding.elapsed() < Duration::from_secs(10),
            "the daemon kept reading requests it could not answer ({sent})"
        );
        if flooder.try_send(&query.0).is_ok() {
            sent += 1;
            full_since = None;
        } else {
            full_since.get_or_insert_with(Instant::now);
            std::thread::sleep(Duration::from_millis(5));
        }
    }
    // Everyone else is served meanwhile, promptly.
    let started = Instant::now();
    let (other, _) = attach_with_token(&path, "10.0.0.1");
    assert_eq!(ask(&other, &Enc::op(Op::CreateChannel)).0, 0);
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // And the flooder, not reading for longer than the daemon waits (5 s), is cut off: after
    // the replies that fitted, its socket ends.
    std::thread::sleep(Duration::from_secs(6));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut buf = Vec::new();
    let mut replies = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "not cut off within 20 s ({replies} replies read of {sent} requests)"
        );
        let ready = cm_dropin::sock::poll(
            &[(
                std::os::fd::AsRawFd::as_raw_fd(&flooder),
                cm_dropin::sock::Interest::Read,
            )],
            1000,
        )
        .expect("poll");
        if !ready[0].readable && !ready[0].closed {
            continue;
        }
        if !flooder.recv(&mut buf).unwrap_or(false) {
            break;
        }
        replies += 1;
    }
    assert!(replies < sent, "{replies} of {sent} answered before the cut");
    assert_eq!(ask(&other, &Enc::op(Op::CreateChannel)).0, 0, "the others go on");
    drop(other);
    let err = stop(daemon, libc::SIGTERM);
    assert!(err.contains("has not read its replies"), "{err}");
}

#[test]
fn destroyed_channels_give_their_sockets_back() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, path) = one_host("channel-fds", "60");
    let (conn, proc) = attach_with_token(&path, "10.0.0.1");
    let before = open_fds(&daemon);
    for _ in 0..2_000 {
        let (ch, sock) = open_channel(&path, &conn, proc);
        let mut destroy = Enc::op(Op::DestroyChannel);
        destroy.u64(ch);
        assert_eq!(ask(&conn, &destroy).0, 0);
        // As the library does once the daemon has agreed.
        drop(sock);
    }
    // The daemon lets its end go once it sees the program's close (its next loop turn).
    let deadline = Instant::now() + Duration::from_secs(5);
    while open_fds(&daemon) > before + 2 {
        assert!(
            Instant::now() < deadline,
            "{} fds after 2 000 channels, {before} before",
            open_fds(&daemon)
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    drop(conn);
    stop(daemon, libc::SIGTERM);
}

#[test]
fn a_daemon_out_of_fds_makes_room_for_a_program_from_its_silent_connections() {
    let path = scratch("out-of-fds");
    let p = path.to_str().expect("utf-8 path");
    // 48 fds in all, hard limit too, so the daemon cannot raise it.
    let daemon = Command::new("sh")
        .args(["-c", "ulimit -n 48 && exec \"$0\" \"$@\"", DAEMON])
        .args(["--socket", p, "--host", "10.0.0.1", "--max-seconds", "60"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-daemon under ulimit");
    wait_for_socket(&path);
    // More connections that say nothing than the daemon has fds for (the listen backlog takes
    // what it has not accepted).
    let silent: Vec<_> = (0..80)
        .filter_map(|_| cm_dropin::sock::SeqConn::connect(&path).ok())
        .collect();
    assert!(silent.len() >= 48, "{} connected", silent.len());
    std::thread::sleep(Duration::from_millis(300));
    let started = Instant::now();
    let (conn, _) = attach_with_token(&path, "10.0.0.1");
    // Well before the 5 s after which silent connections are closed anyway.
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    drop((conn, silent));
    let err = stop(daemon, libc::SIGTERM);
    assert!(err.contains("accept: "), "{err}");
}

#[test]
fn a_hello_of_another_protocol_version_is_refused_with_its_own_errno() {
    use cm_dropin::proto::{Dec, Enc, Op, PROTOCOL_VERSION};
    let (daemon, path) = one_host("version", "30");
    let mut old = Enc::op(Op::Hello);
    old.u32(std::process::id()).bytes(b"10.0.0.1").bytes(b"old");
    let mut newer = Enc::op(Op::Hello);
    newer
        .u32(std::process::id())
        .bytes(b"10.0.0.1")
        .bytes(b"newer")
        .u32(PROTOCOL_VERSION + 1);
    for hello in [old, newer] {
        let conn = cm_dropin::sock::SeqConn::connect(&path).expect("connect");
        conn.send(&hello.0).expect("hello");
        let mut buf = Vec::new();
        assert!(conn.recv(&mut buf).expect("an answer"));
        assert_eq!(Dec::new(&buf).i32(), Ok(libc::EPROTONOSUPPORT));
    }
    let (conn, _) = attach_with_token(&path, "10.0.0.1");
    drop(conn);
    let err = stop(daemon, libc::SIGTERM);
    assert!(err.contains("it speaks protocol (none), this daemon"), "{err}");
    assert!(
        err.contains(&format!(
            "it speaks protocol {}, this daemon {PROTOCOL_VERSION}",
            PROTOCOL_VERSION + 1
        )),
        "{err}"
    );
}

/// A daemon of one host, 10.0.0.1, listening at a socket of the test `name`'s under the
/// temporary directory, that gives up after `max_seconds`; and the socket's path.
fn one_host(name: &str, max_seconds: &str) -> (Child, PathBuf) {
    let path = scratch(name);
    let p = path.to_str().expect("utf-8 path");
    let daemon = spawn(&["--socket", p, "--host", "10.0.0.1", "--max-seconds", max_seconds]);
    wait_for_socket(&path);
    (daemon, path)
}

/// [`one_host`], with a process attached to it.
fn one_host_daemon(name: &str) -> (Child, cm_dropin::sock::SeqConn) {
    let (daemon, path) = one_host(name, "120");
    let conn = attach(&path, "10.0.0.1");
    (daemon, conn)
}

/// The token a request that must succeed answers with.
#[track_caller]
fn token_of(conn: &cm_dropin::sock::SeqConn, e: &cm_dropin::proto::Enc) -> u64 {
    let (status, rest) = ask(conn, e);
    assert_eq!(status, 0, "{:?}", cm_dropin::proto::Dec::new(&e.0).u32());
    u64::from_le_bytes(rest[..8].try_into().expect("a token"))
}

/// `MULTICAST_JOIN` and `MULTICAST_ERROR` (`enum rdma_cm_event_type`).
const MULTICAST_JOIN: u32 = 12;
const MULTICAST_ERROR: u32 = 13;

/// A datagram id of `conn`'s process on channel `ch`, bound to `ip`, with a UD QP on a CQ of its
/// own and `recvs` receives of 2 KiB posted: (id, cq).
fn ud_id(conn: &cm_dropin::sock::SeqConn, ch: u64, ip: &str, recvs: u64) -> (u64, u64) {
    use cm_dropin::proto::{Enc, Op};
    let mut create = Enc::op(Op::CreateId);
    create.u64(ch).u32(0x0111);
    let id = token_of(conn, &create);
    let mut bind = Enc::op(Op::BindAddr);
    bind.u64(id)
        .addr(Some(format!("{ip}:0").parse().expect("address")));
    assert_eq!(ask(conn, &bind).0, 0);
    let mut cq = Enc::op(Op::CreateCq);
    cq.u32(64).u64(0);
    let cq = token_of(conn, &cq);
    let mut caps = cm_core::QpCaps::new();
    (caps.max_send_wr, caps.max_recv_wr) = (16, 16);
    let qp = cm_dropin::request::Request::CreateQp {
        id,
        caps,
        send_cq: cq,
        recv_cq: cq,
        sq_sig_all: true,
        qp_type: 4, // IBV_QPT_UD
        srq: 0,
    };
    assert_eq!(ask(conn, &qp.encode()).0, 0);
    for wr_id in 0..recvs {
        let mut e = Enc::op(Op::PostRecv);
        e.u64(id).u64(wr_id).u32(2048);
        assert_eq!(ask(conn, &e).0, 0);
    }
    (id, cq)
}

/// Joins `group` and reads the join's event from `sock`, acked: (event, status, its datagram
/// destination).
#[track_caller]
fn join_group(
    conn: &cm_dropin::sock::SeqConn,
    sock: &cm_dropin::sock::SeqConn,
    id: u64,
    group: std::net::SocketAddr,
) -> (u32, i32, Option<cm_core::UdParam>) {
    use cm_dropin::proto::{Dec, Enc, Op, CHAN_EVENT};
    let mut join = Enc::op(Op::JoinMcast);
    join.u64(id).addr(Some(group));
    assert_eq!(ask(conn, &join).0, 0, "join {group}");
    let buf = next_datagram(sock);
    let mut d = Dec::new(&buf);
    assert_eq!(d.u8(), Ok(CHAN_EVENT));
    let ev = d.event().expect("an event");
    assert_eq!(ev.id, id);
    let mut ack = Enc::op(Op::AckEvent);
    ack.u64(ev.event_no);
    conn.send(&ack.0).expect("ack");
    (ev.event, ev.status, ev.ud)
}

/// Leaves `group`: the status.
fn leave_group(conn: &cm_dropin::sock::SeqConn, id: u64, group: std::net::SocketAddr) -> i32 {
    use cm_dropin::proto::{Enc, Op};
    let mut leave = Enc::op(Op::LeaveMcast);
    leave.u64(id).addr(Some(group));
    ask(conn, &leave).0
}

/// Group `i`: 239.x.y.z.
fn group(i: u32) -> std::net::SocketAddr {
    std::net::SocketAddr::new(std::net::IpAddr::from((0xEF00_0000 | i).to_be_bytes()), 0)
}

#[test]
fn memberships_left_or_of_destroyed_ids_are_forgotten_so_a_device_keeps_its_8192_groups() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, path) = one_host("groups", "120");
    let (conn, proc) = attach_with_token(&path, "10.0.0.1");
    let (ch, sock) = open_channel(&path, &conn, proc);
    let (id, _) = ud_id(&conn, ch, "10.0.0.1", 0);
    // Leaves of groups never joined are refused and make no entry; joins are left again, and
    // ids that joined are destroyed: more of each than the device holds groups.
    for i in 0..9_000 {
        assert_eq!(leave_group(&conn, id, group(i)), libc::EADDRNOTAVAIL);
    }
    for i in 9_000..18_000 {
        assert_eq!(
            join_group(&conn, &sock, id, group(i)).0,
            MULTICAST_JOIN,
            "join {i}"
        );
        assert_eq!(leave_group(&conn, id, group(i)), 0);
    }
    let mut create = Enc::op(Op::CreateId);
    create.u64(ch).u32(0x0111);
    let mut bind = Enc::op(Op::BindAddr);
    for i in 18_000..18_100 {
        let gone = token_of(&conn, &create);
        bind.0.truncate(4);
        bind.u64(gone).addr(Some("10.0.0.1:0".parse().expect("address")));
        assert_eq!(ask(&conn, &bind).0, 0);
        assert_eq!(join_group(&conn, &sock, gone, group(i)).0, MULTICAST_JOIN);
        let mut destroy = Enc::op(Op::DestroyId);
        destroy.u64(gone);
        assert_eq!(ask(&conn, &destroy).0, 0);
    }
    // None of them is kept: a full device's worth of groups can still be attached, and no
    // more (rxe's ENOMEM from ibv_attach_mcast, which librdmacm reports with status -1).
    for i in 20_000..20_000 + 8_192 {
        assert_eq!(
            join_group(&conn, &sock, id, group(i)).0,
            MULTICAST_JOIN,
            "join {i}"
        );
    }
    let (event, status, _) = join_group(&conn, &sock, id, group(30_000));
    assert_eq!((event, status), (MULTICAST_ERROR, -1), "past rxe's 8 192 groups");
    drop((conn, sock));
    stop(daemon, libc::SIGTERM);
}

#[test]
fn a_group_takes_at_most_rxes_56_qps_and_must_be_a_multicast_address() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, path) = one_host("group-attach", "120");
    let (conn, proc) = attach_with_token(&path, "10.0.0.1");
    let (ch, sock) = open_channel(&path, &conn, proc);
    let (id, _) = ud_id(&conn, ch, "10.0.0.1", 0);
    let mut no_group = Enc::op(Op::JoinMcast);
    no_group.u64(id).addr(None);
    assert_eq!(ask(&conn, &no_group).0, libc::EINVAL, "no address");
    let mut unicast = Enc::op(Op::JoinMcast);
    unicast.u64(id).addr(Some("10.0.0.2:0".parse().expect("address")));
    assert_eq!(ask(&conn, &unicast).0, libc::EINVAL, "a unicast address");
    let g = group(0x010203);
    for n in 0..56 {
        let (member, _) = ud_id(&conn, ch, "10.0.0.1", 0);
        let (event, _, dest) = join_group(&conn, &sock, member, g);
        assert_eq!(event, MULTICAST_JOIN, "member {n}");
        let dest = dest.expect("the group's destination");
        assert_eq!((dest.qp_num, dest.ah_attr.dest_ip()), (0x00FF_FFFF, Some(g.ip())));
    }
    let (event, status, _) = join_group(&conn, &sock, id, g);
    assert_eq!((event, status), (MULTICAST_ERROR, -1), "a 57th QP");
    drop((conn, sock));
    stop(daemon, libc::SIGTERM);
}

/// Polls `cq` until it has given `n` completions or `within` has passed: what it gave.
fn poll_for(
    conn: &cm_dropin::sock::SeqConn,
    cq: u64,
    n: usize,
    within: std::time::Duration,
) -> Vec<cm_dropin::proto::WireWc> {
    use cm_dropin::proto::{Dec, Enc, Op};
    let deadline = std::time::Instant::now() + within;
    let mut got = Vec::new();
    while got.len() < n && std::time::Instant::now() < deadline {
        let mut e = Enc::op(Op::PollCq);
        e.u64(cq).u32(16);
        let (status, rest) = ask(conn, &e);
        assert_eq!(status, 0);
        let mut d = Dec::new(&rest);
        for _ in 0..d.u32().expect("a count") {
            got.push(d.wc().expect("a completion"));
        }
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    got
}

#[test]
fn group_datagrams_go_through_the_simulator_its_loopback_and_its_lossy_link() {
    use cm_dropin::proto::{Enc, Op};
    let path = scratch("mcast-loss");
    let p = path.to_str().expect("utf-8 path");
    // Everything between hosts 0 and 1 is lost; host 2's links are clean.
    let daemon = spawn(&[
        "--socket",
        p,
        "--host",
        "10.0.0.1",
        "--host",
        "10.0.0.2",
        "--host",
        "10.0.0.3",
        "--max-seconds",
        "60",
        "--fault",
        "0:loss 0 1 1000",
    ]);
    wait_for_socket(&path);
    let g = group(0x0a0b0c);
    let mut sides = Vec::new();
    for ip in ["10.0.0.1", "10.0.0.2", "10.0.0.3"] {
        let (conn, proc) = attach_with_token(&path, ip);
        let (ch, sock) = open_channel(&path, &conn, proc);
        let (id, cq) = ud_id(&conn, ch, ip, 4);
        let (event, _, dest) = join_group(&conn, &sock, id, g);
        assert_eq!(event, MULTICAST_JOIN);
        sides.push((conn, sock, id, cq, dest.expect("the group's destination")));
    }
    let (conn0, _, id0, cq0, dest) = &sides[0];
    let mut e = Enc::op(Op::PostSendUd);
    e.u64(*id0)
        .u64(100)
        .u8(1)
        .ud_param(dest)
        .u8(1)
        .u32(0x1234_5678)
        .bytes(b"from host 0");
    assert_eq!(ask(conn0, &e).0, 0);
    let long = std::time::Duration::from_secs(10);
    // Host 0 gets its send's completion and its own datagram back (rxe loops group sends back
    // to members on the sending device); host 2 gets it over the clean link. Each is behind
    // the 40 bytes of the GRH, whose IPv4 header names the sender.
    let own = poll_for(conn0, *cq0, 2, long);
    assert_eq!(own.len(), 2, "{own:?}");
    assert_eq!(
        (own[0].wr_id, own[0].opcode, own[0].byte_len),
        (100, 0, 11),
        "the send"
    );
    let (conn2, _, _, cq2, _) = &sides[2];
    let other = poll_for(conn2, *cq2, 1, long);
    assert_eq!(other.len(), 1, "{other:?}");
    for wc in [&own[1], &other[0]] {
        assert_eq!((wc.opcode, wc.byte_len as usize), (128, 40 + 11), "{wc:?}");
        assert_eq!(wc.data[20], 0x45, "an IPv4 header in the GRH's last 20 bytes");
        assert_eq!(wc.data[32..36], [10, 0, 0, 1], "the sender's address");
        assert_eq!(&wc.data[40..], b"from host 0");
        assert_eq!((wc.imm_data, wc.wc_flags), (0x1234_5678, 3), "GRH and WITH_IMM");
    }
    // Host 1 never gets it: the link lost it (host 2 has had its copy; a second more is given).
    let (conn1, _, _, cq1, _) = &sides[1];
    let lost = poll_for(conn1, *cq1, 1, std::time::Duration::from_secs(1));
    assert!(lost.is_empty(), "{lost:?}");
    drop(sides);
    stop(daemon, libc::SIGTERM);
}

#[test]
fn a_ud_qp_takes_no_more_receives_than_its_queue_holds() {
    use cm_dropin::proto::{Enc, Op};
    let (daemon, conn) = one_host_daemon("ud-recvs");
    let one = |e: &Enc| {
        let (status, rest) = ask(&conn, e);
        assert_eq!(status, 0, "{:?}", cm_dropin::proto::Dec::new(&e.0).u32());
        rest
    };
    let token = |e: &Enc| token_of(&conn, e);
    let ch = token(&Enc::op(Op::CreateChannel));
    let mut create = Enc::op(Op::CreateId);
    create.u64(ch).u32(0x0111);
    let id = token(&create);
    let mut bind = Enc::op(Op::BindAddr);
    bind.u64(id).addr(Some("10.0.0.1:0".parse().expect("address")));
    one(&bind);
    let mut cq = Enc::op(Op::CreateCq);
    cq.u32(16).u64(0);
    let cq = token(&cq);
    let mut qp = Enc::op(Op::CreateQp);
    qp.u64(id)
        .u32(4)
        .u32(4)
        .u32(1)
        .u32(1)
        .u32(0)
        .u64(cq)
        .u64(cq)
        .u8(1)
        .u32(4) // IBV_QPT_UD
        .u64(0); // no SRQ
    let caps = one(&qp);
    let max_recv_wr = u32::from_le_bytes(caps[4..8].try_into().expect("max_recv_wr"));
    assert!(max_recv_wr >= 4, "{max_recv_wr}");
    let post = |wr_id: u64| {
        let mut e = Enc::op(Op::PostRecv);
        e.u64(id).u64(wr_id).u32(2048);
        ask(&conn, &e).0
    };
    for wr_id in 0..u64::from(max_recv_wr) {
        assert_eq!(post(wr_id), 0, "receive {wr_id}");
    }
    assert_eq!(post(99), libc::ENOMEM, "one past the queue's {max_recv_wr}");
    drop(conn);
    stop(daemon, libc::SIGTERM);
}

#[test]
fn a_hello_cut_short_is_refused_as_malformed() {
    use cm_dropin::proto::{Dec, Enc};
    let (daemon, path) = one_host("short-hello", "30");
    let whole = Enc::hello(std::process::id(), "10.0.0.1", "short");
    // The op and the pid, then the op, pid and half the host's length.
    for cut in [8, 10] {
        let conn = cm_dropin::sock::SeqConn::connect(&path).expect("connect");
        conn.send(&whole.0[..cut]).expect("hello");
        let mut buf = Vec::new();
        assert!(conn.recv(&mut buf).expect("an answer"));
        assert_eq!(Dec::new(&buf).i32(), Ok(libc::EPROTO), "a hello of {cut} bytes");
    }
    drop(attach(&path, "10.0.0.1"));
    let err = stop(daemon, libc::SIGTERM);
    assert!(err.contains("a malformed hello refused"), "{err}");
}

/// A channel of the process `token` on `conn`, with its socket attached.
fn open_channel(
    socket: &std::path::Path,
    conn: &cm_dropin::sock::SeqConn,
    token: u64,
) -> (u64, cm_dropin::sock::SeqConn) {
    use cm_dropin::proto::{Enc, Op, CHAN_ATTACHED};
    let (status, rest) = ask(conn, &Enc::op(Op::CreateChannel));
    assert_eq!(status, 0);
    let ch = u64::from_le_bytes(rest[..8].try_into().expect("a token"));
    let sock = cm_dropin::sock::SeqConn::connect(socket).expect("connect the channel");
    let mut attach = Enc::op(Op::AttachChannel);
    attach.u64(token).u64(ch);
    sock.send(&attach.0).expect("attach");
    assert_eq!(next_datagram(&sock), [CHAN_ATTACHED]);
    (ch, sock)
}

/// The next datagram on `sock`, within 10 s.
#[track_caller]
fn next_datagram(sock: &cm_dropin::sock::SeqConn) -> Vec<u8> {
    use std::os::fd::AsRawFd;
    let ready =
        cm_dropin::sock::poll(&[(sock.as_raw_fd(), cm_dropin::sock::Interest::Read)], 10_000).expect("poll");
    assert!(ready[0].readable, "a datagram within 10 s");
    let mut buf = Vec::new();
    assert!(sock.recv(&mut buf).expect("recv"));
    buf
}

/// The next event on channel socket `sock`, which must be `want`; acked on `conn`.
#[track_caller]
fn expect_event(
    conn: &cm_dropin::sock::SeqConn,
    sock: &cm_dropin::sock::SeqConn,
    want: u32,
) -> cm_dropin::proto::WireEvent {
    use cm_dropin::proto::{Dec, Enc, Op, CHAN_EVENT};
    let buf = next_datagram(sock);
    let mut d = Dec::new(&buf);
    assert_eq!(d.u8(), Ok(CHAN_EVENT));
    let ev = d.event().expect("an event");
    assert_eq!(ev.event, want, "{ev:?}");
    // Acks are not answered.
    let mut ack = Enc::op(Op::AckEvent);
    ack.u64(ev.event_no);
    conn.send(&ack.0).expect("ack");
    ev
}

/// Two processes, on hosts 10.0.0.1 and 10.0.0.2, with a connection between them: each one's
/// control connection and connected id, and the channel sockets, which must stay open.
fn connected_pair(
    socket: &std::path::Path,
    port: u16,
) -> (
    (cm_dropin::sock::SeqConn, u64),
    (cm_dropin::sock::SeqConn, u64),
    Vec<cm_dropin::sock::SeqConn>,
) {
    use cm_dropin::proto::{Enc, Op};
    let one = |conn: &cm_dropin::sock::SeqConn, e: &Enc| {
        let (status, rest) = ask(conn, e);
        assert_eq!(status, 0, "{:?}", cm_dropin::proto::Dec::new(&e.0).u32());
        rest
    };
    let token = |conn: &cm_dropin::sock::SeqConn, e: &Enc| {
        u64::from_le_bytes(one(conn, e)[..8].try_into().expect("a token"))
    };
    let qp = |conn: &cm_dropin::sock::SeqConn, id: u64| {
        let mut cq = Enc::op(Op::CreateCq);
        cq.u32(16).u64(0);
        let cq = token(conn, &cq);
        let mut e = Enc::op(Op::CreateQp);
        e.u64(id)
            .u32(16)
            .u32(16)
            .u32(1)
            .u32(1)
            .u32(0)
            .u64(cq)
            .u64(cq)
            .u8(1)
            .u32(2)
            .u64(0);
        one(conn, &e);
    };
    // One READ in flight each way, as rping asks.
    let param = cm_core::ConnParam {
        retry_count: 7,
        rnr_retry_count: 7,
        responder_resources: 1,
        initiator_depth: 1,
        ..cm_core::ConnParam::ZERO
    };
    let addr: std::net::SocketAddr = format!("10.0.0.1:{port}").parse().expect("address");
    let (server, s_token) = attach_with_token(socket, "10.0.0.1");
    let (client, c_token) = attach_with_token(socket, "10.0.0.2");
    let (s_ch, s_sock) = open_channel(socket, &server, s_token);
    let (c_ch, c_sock) = open_channel(socket, &client, c_token);
    let mut create = Enc::op(Op::CreateId);
    create.u64(s_ch).u32(0x0106);
    let listener = token(&server, &create);
    let mut bind = Enc::op(Op::BindAddr);
    bind.u64(listener).addr(Some(addr));
    one(&server, &bind);
    let mut listen = Enc::op(Op::Listen);
    listen.u64(listener).i32(1);
    one(&server, &listen);
    let mut create = Enc::op(Op::CreateId);
    create.u64(c_ch).u32(0x0106);
    let id = token(&client, &create);
    let mut resolve = Enc::op(Op::ResolveAddr);
    resolve.u64(id).addr(None).addr(Some(addr)).u32(1000);
    one(&client, &resolve);
    expect_event(&client, &c_sock, 0);
    let mut route = Enc::op(Op::ResolveRoute);
    route.u64(id).u32(1000);
    one(&client, &route);
    expect_event(&client, &c_sock, 2);
    qp(&client, id);
    let mut connect = Enc::op(Op::Connect);
    connect.u64(id).param(&param);
    one(&client, &connect);
    let child = expect_event(&server, &s_sock, 4).id;
    qp(&server, child);
    let mut accept = Enc::op(Op::Accept);
    accept.u64(child).param(&param);
    one(&server, &accept);
    expect_event(&client, &c_sock, 9);
    expect_event(&server, &s_sock, 9);
    ((server, child), (client, id), vec![s_sock, c_sock])
}

#[test]
fn an_rdma_read_longer_than_a_message_is_refused_where_it_went_unanswered() {
    use cm_dropin::proto::{Enc, Op, MAX_MESSAGE};
    let path = scratch("long-read");
    let p = path.to_str().expect("utf-8 path");
    let daemon = spawn(&[
        "--socket",
        p,
        "--host",
        "10.0.0.1",
        "--host",
        "10.0.0.2",
        "--max-seconds",
        "60",
    ]);
    wait_for_socket(&path);
    let ((server, child), (client, _), _channels) = connected_pair(&path, 7900);
    // The client's memory, which the simulator reads as a NIC would (this process's pid is in
    // the hello), and the server's, where the READ lands.
    let memory: Vec<u8> = (0..2 * MAX_MESSAGE as usize).map(|i| (i % 251) as u8).collect();
    let landing = vec![0u8; 2 * MAX_MESSAGE as usize];
    let register = |conn: &cm_dropin::sock::SeqConn, at: &[u8], access: u32| {
        let mut reg = Enc::op(Op::RegMr);
        reg.u64(at.as_ptr() as u64).u64(at.len() as u64).u32(access);
        let (status, rest) = ask(conn, &reg);
        assert_eq!(status, 0);
        u32::from_le_bytes(rest[..4].try_into().expect("a key"))
    };
    let key = register(&client, &memory, 1 | 4);
    let local = register(&server, &landing, 1);
    let read = |len: u32| {
        let mut e = Enc::op(Op::RdmaRead);
        e.u64(child)
            .u64(1)
            .u8(1)
            .u64(memory.as_ptr() as u64)
            .u32(key)
            .u32(1)
            .u64(landing.as_ptr() as u64)
            .u32(len)
            .u32(local);
        ask(&server, &e)
    };
    assert_eq!(read(MAX_MESSAGE).0, 0, "a READ of a whole message");
    // The simulator writes the bytes into this process's memory, from the daemon.
    let deadline = Instant::now() + Duration::from_secs(10);
    let landed = || {
        // SAFETY: `landing` is alive and its bytes initialised; they are read volatile since
        // another process writes them behind the compiler's back.
        (0..MAX_MESSAGE as usize)
            .all(|i| unsafe { std::ptr::read_volatile(landing.as_ptr().add(i)) } == memory[i])
    };
    while !landed() {
        assert!(Instant::now() < deadline, "the READ's bytes within 10 s");
        std::thread::sleep(Duration::from_millis(10));
    }
    for len in [MAX_MESSAGE + 1, 2 * MAX_MESSAGE, u32::MAX] {
        assert_eq!(
            read(len).0,
            libc::EINVAL,
            "a READ of {len} bytes is refused, and answered"
        );
    }
    assert_eq!(read(16).0, 0, "and the daemon goes on");
    drop((server, client));
    stop(daemon, libc::SIGTERM);
}

#[test]
fn a_hello_sent_the_moment_its_connection_is_accepted_is_served() {
    use cm_dropin::proto::{Dec, Enc};
    // The kernel names a datagram's sender (SCM_CREDENTIALS) only when the receiving socket
    // asked for it as the datagram was sent: a hello that came between the daemon's accept
    // and its asking read as pid 0's, and was refused as naming another process. Hellos sent
    // at spread moments after connecting meet that window now and then (13 to 24 of 3 000
    // did, on 2 cores).
    let path = scratch("hello-at-accept");
    let p = path.to_str().expect("utf-8 path");
    // Its stderr to a file: two lines a process would fill a pipe read only at the end.
    let log = scratch("hello-at-accept.err");
    let mut daemon = Command::new(DAEMON)
        .args(["--socket", p, "--host", "10.0.0.1", "--max-seconds", "60"])
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).expect("the daemon's stderr file"))
        .spawn()
        .expect("start cmsim-daemon");
    wait_for_socket(&path);
    let hello = Enc::hello(std::process::id(), "10.0.0.1", "eager");
    let mut refused = 0;
    const HELLOS: u64 = 3_000;
    for i in 0..HELLOS {
        let conn = cm_dropin::sock::SeqConn::connect(&path).expect("connect");
        let after = Instant::now() + Duration::from_nanos(i % 100 * 1_000);
        while Instant::now() < after {
            std::hint::spin_loop();
        }
        conn.send(&hello.0).expect("hello");
        let ready = cm_dropin::sock::poll(
            &[(
                std::os::fd::AsRawFd::as_raw_fd(&conn),
                cm_dropin::sock::Interest::Read,
            )],
            10_000,
        )
        .expect("poll");
        assert!(ready[0].readable, "hello {i} answered within 10 s");
        let mut buf = Vec::new();
        assert!(conn.recv(&mut buf).expect("an answer"), "answered");
        if Dec::new(&buf).i32() != Ok(0) {
            refused += 1;
        }
    }
    // SAFETY: kill has no memory arguments; the pid is our own child's, not yet reaped.
    let killed = unsafe { libc::kill(daemon.id() as libc::pid_t, libc::SIGTERM) };
    assert_eq!(killed, 0);
    let deadline = Instant::now() + Duration::from_secs(30);
    let status = loop {
        if let Some(status) = daemon.try_wait().expect("try_wait") {
            break status;
        }
        if Instant::now() > deadline {
            let _ = daemon.kill();
            panic!("cmsim-daemon did not exit within 30 s of SIGTERM");
        }
        std::thread::sleep(Duration::from_millis(10));
    };
    let err = std::fs::read_to_string(&log).expect("the daemon's stderr");
    let _ = std::fs::remove_file(&log);
    let said: Vec<&str> = err.lines().filter(|l| l.contains("refused")).take(3).collect();
    assert_eq!(refused, 0, "{refused} of {HELLOS} hellos refused: {said:?}");
    assert_eq!(status.code(), Some(128 + libc::SIGTERM), "{err}");
}

#[test]
fn a_verbs_qp_is_its_processes_alone_and_every_request_on_it_from_another_is_refused() {
    use cm_core::{QpCaps, VerbsQpAttr, VerbsQpState};
    use cm_dropin::request::Request;
    let (daemon, path) = one_host("verbs-qp-owner", "120");
    let mine = attach(&path, "10.0.0.1");
    let theirs = attach(&path, "10.0.0.1");
    let cq = token_of(&mine, &Request::CreateCq { cqe: 8, channel: 0 }.encode());
    let their_cq = token_of(&theirs, &Request::CreateCq { cqe: 8, channel: 0 }.encode());
    let create = |cq| Request::VerbsCreateQp {
        caps: QpCaps::new(),
        send_cq: cq,
        recv_cq: cq,
        sq_sig_all: true,
        qp_type: 2,
        srq: 0,
    };
    // Another process's CQ is no CQ of the caller's.
    assert_eq!(ask(&mine, &create(their_cq).encode()).0, libc::EINVAL);
    let (status, rest) = ask(&mine, &create(cq).encode());
    assert_eq!(status, 0);
    let qp = u64::from(u32::from_le_bytes(rest[20..24].try_into().expect("qp_num")));
    let init = VerbsQpAttr {
        qp_state: VerbsQpState::Init,
        port_num: 1,
        ..VerbsQpAttr::default()
    };
    let modify = Request::ModifyQp {
        qp,
        mask: 0x39,
        attr: init,
    };
    let requests = [
        modify.clone(),
        Request::QueryQp { qp },
        Request::QpPostRecv { qp, wr_id: 1, len: 8 },
        Request::PostSend {
            id: qp,
            wr_id: 2,
            signaled: true,
            data: vec![1],
        },
        Request::VerbsDestroyQp { qp },
    ];
    for req in &requests {
        assert_eq!(
            ask(&theirs, &req.encode()).0,
            libc::EINVAL,
            "{req:?} from another process"
        );
    }
    // The owner's are served, and the QP is gone once destroyed.
    assert_eq!(ask(&mine, &modify.encode()).0, 0);
    let (status, rest) = ask(&mine, &Request::QueryQp { qp }.encode());
    assert_eq!(status, 0);
    assert_eq!(
        u32::from_le_bytes(rest[4..8].try_into().expect("state")),
        1,
        "INIT"
    );
    // A CQ a QP reports into is busy.
    assert_eq!(ask(&mine, &Request::DestroyCq { cq }.encode()).0, libc::EBUSY);
    assert_eq!(ask(&mine, &Request::VerbsDestroyQp { qp }.encode()).0, 0);
    assert_eq!(ask(&mine, &Request::QueryQp { qp }.encode()).0, libc::EINVAL);
    assert_eq!(ask(&mine, &Request::DestroyCq { cq }.encode()).0, 0);
    drop((mine, theirs));
    let _ = stop(daemon, libc::SIGTERM);
}

#[test]
fn an_srq_is_its_processes_alone_and_every_request_on_it_from_another_is_refused() {
    use cm_core::QpCaps;
    use cm_dropin::request::Request;
    let (daemon, path) = one_host("srq-owner", "120");
    let mine = attach(&path, "10.0.0.1");
    let theirs = attach(&path, "10.0.0.1");
    let create = Request::CreateSrq {
        max_wr: 8,
        max_sge: 1,
        srq_limit: 0,
    };
    let (status, rest) = ask(&mine, &create.encode());
    assert_eq!(status, 0);
    let srq = u64::from_le_bytes(rest[..8].try_into().expect("token"));
    let granted = (
        u32::from_le_bytes(rest[8..12].try_into().expect("max_wr")),
        u32::from_le_bytes(rest[12..16].try_into().expect("max_sge")),
    );
    assert_eq!(granted, (8, 1));
    let their_cq = token_of(&theirs, &Request::CreateCq { cqe: 8, channel: 0 }.encode());
    let requests = [
        Request::QuerySrq { srq },
        Request::ModifySrq {
            srq,
            mask: 2,
            max_wr: 0,
            srq_limit: 0,
        },
        Request::PostSrqRecv {
            srq,
            wr_id: 1,
            len: 8,
        },
        Request::DestroySrq { srq },
        // A QP of theirs on my SRQ.
        Request::VerbsCreateQp {
            caps: QpCaps::new(),
            send_cq: their_cq,
            recv_cq: their_cq,
            sq_sig_all: false,
            qp_type: 2,
            srq,
        },
    ];
    for req in &requests {
        assert_eq!(
            ask(&theirs, &req.encode()).0,
            libc::EINVAL,
            "{req:?} from another process"
        );
    }
    // The owner's are served; a QP on the SRQ makes it busy.
    let recv = Request::PostSrqRecv {
        srq,
        wr_id: 1,
        len: u32::MAX,
    };
    assert_eq!(
        ask(&mine, &recv.encode()).0,
        0,
        "a long buffer is one of max_msg_sz"
    );
    let cq = token_of(&mine, &Request::CreateCq { cqe: 8, channel: 0 }.encode());
    let on_srq = Request::VerbsCreateQp {
        caps: QpCaps::new(),
        send_cq: cq,
        recv_cq: cq,
        sq_sig_all: false,
        qp_type: 2,
        srq,
    };
    let (status, rest) = ask(&mine, &on_srq.encode());
    assert_eq!(status, 0);
    let qp = u64::from(u32::from_le_bytes(rest[20..24].try_into().expect("qp_num")));
    assert_eq!(u32::from_le_bytes(rest[4..8].try_into().expect("max_recv_wr")), 0);
    assert_eq!(ask(&mine, &Request::DestroySrq { srq }.encode()).0, libc::EBUSY);
    assert_eq!(ask(&mine, &Request::VerbsDestroyQp { qp }.encode()).0, 0);
    assert_eq!(ask(&mine, &Request::DestroySrq { srq }.encode()).0, 0);
    assert_eq!(ask(&mine, &Request::QuerySrq { srq }.encode()).0, libc::EINVAL);
    drop((mine, theirs));
    let _ = stop(daemon, libc::SIGTERM);
}
