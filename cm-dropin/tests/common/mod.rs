//! Helpers the tests that run C programs share.

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");

/// Starts a daemon of its own for test `name` on `hosts`, seed 7, ending after `processes`
/// programs detached (or `max_seconds`): its socket, once it exists, and the daemon.
pub(crate) fn start_daemon(
    name: &str,
    hosts: &[&str],
    processes: usize,
    max_seconds: u32,
    extra: &[&str],
) -> (PathBuf, Child) {
    let socket = std::env::temp_dir().join(format!("cmsim-{name}-{}.sock", std::process::id()));
    let mut cmd = Command::new(DAEMON);
    cmd.arg("--socket").arg(&socket);
    for h in hosts {
        cmd.args(["--host", h]);
    }
    let daemon = cmd
        .args(["--seed", "7", "--max-seconds", &max_seconds.to_string()])
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
    (socket, daemon)
}

/// Compiles `tests/c/<name>.c` against the installed rdma-core headers and libraries; `None`
/// (with a message) when there is no C compiler or no headers.
pub(crate) fn compile_c(name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/c")
        .join(format!("{name}.c"));
    // Tests run in parallel and several compile the same program: each gets its own file.
    static BUILDS: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
    let n = BUILDS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let out = std::env::temp_dir().join(format!("cmsim-{name}-{}-{n}", std::process::id()));
    let status = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
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

/// What a finished program printed, and how it ended.
pub(crate) struct Output {
    /// How it ended.
    pub(crate) status: ExitStatus,
    /// What it printed on stdout.
    pub(crate) stdout: String,
    /// What it printed on stderr.
    pub(crate) stderr: String,
}

/// Waits for `child` at most `limit`; kills it and panics past that.
pub(crate) fn wait(mut child: Child, limit: Duration, what: &str) -> Output {
    let deadline = Instant::now() + limit;
    loop {
        if let Some(status) = child.try_wait().expect("try_wait") {
            let mut stdout = String::new();
            let mut stderr = String::new();
            if let Some(mut o) = child.stdout.take() {
                o.read_to_string(&mut stdout).expect("read stdout");
            }
            if let Some(mut e) = child.stderr.take() {
                e.read_to_string(&mut stderr).expect("read stderr");
            }
            return Output {
                status,
                stdout,
                stderr,
            };
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what} did not finish within {limit:?}");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
