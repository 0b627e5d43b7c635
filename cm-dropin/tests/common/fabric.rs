//! A fabric daemon of a test's own, and programs started on its hosts through `cmsim-run`.
//! Included (`#[path]`) beside `common` by the tests that use it, each using a part of it.
#![allow(dead_code)]

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::common::{wait, Output};

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");
const RUN: &str = env!("CARGO_BIN_EXE_cmsim-run");

/// A running `cmsim-daemon` with the given hosts, its own socket, killed when dropped.
pub(crate) struct Fabric {
    socket: PathBuf,
    daemon: Option<Child>,
}

impl Fabric {
    /// Starts a daemon named `name` (its socket's name) with `hosts` (host 0 first) that exits
    /// once `processes` programs attached and left, or after 60 s.
    pub(crate) fn start(name: &str, hosts: &[&str], processes: usize) -> Fabric {
        Fabric::start_with(name, hosts, processes, &[])
    }

    /// [`start`](Fabric::start) with more daemon arguments (faults, say).
    pub(crate) fn start_with(name: &str, hosts: &[&str], processes: usize, extra: &[&str]) -> Fabric {
        let (socket, daemon) = start_daemon(name, hosts, processes, 60, extra);
        Fabric {
            socket,
            daemon: Some(daemon),
        }
    }

    /// The daemon's socket, for [`spawn_on`] with a listener to wait for.
    #[allow(dead_code)]
    pub(crate) fn socket(&self) -> &Path {
        &self.socket
    }

    /// Starts `program` on the simulated host `host`.
    pub(crate) fn spawn(&self, host: &str, program: &[&str]) -> Child {
        spawn_on(&self.socket, host, None, program)
    }

    /// Runs `program` on `host` to its end (at most 30 s).
    pub(crate) fn run(&self, host: &str, program: &[&str]) -> Output {
        wait(self.spawn(host, program), Duration::from_secs(30), program[0])
    }

    /// Kills the daemon (whatever its programs did) and returns what it printed.
    pub(crate) fn stop(mut self) -> Output {
        let mut d = self.daemon.take().expect("daemon running");
        let _ = d.kill();
        wait(d, Duration::from_secs(10), "cmsim-daemon")
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

/// Starts a daemon of its own for test `name` on `hosts` (host 0 first), seed 7, ending once
/// `processes` programs attached and left (or after `max_seconds`): its socket, once it exists,
/// and the daemon.
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

/// Starts `program` under `cmsim-run` on `host` of the daemon at `socket`, its stdin, stdout
/// and stderr piped; `listener`: wait for a listener at that address first.
pub(crate) fn spawn_on(socket: &Path, host: &str, listener: Option<&str>, program: &[&str]) -> Child {
    let mut cmd = Command::new(RUN);
    if let Some(l) = listener {
        cmd.args(["--wait-for-listener", l]);
    }
    cmd.arg("--socket")
        .arg(socket)
        .args(["--host", host, "--"])
        .args(program)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run")
}

/// A compiled C program, removed when dropped.
pub(crate) struct Program(PathBuf);

impl Program {
    /// Its path, as an argument.
    pub(crate) fn path(&self) -> String {
        self.0.to_string_lossy().into_owned()
    }
}

impl Drop for Program {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.0);
    }
}

/// Compiles `tests/c/<name>.c` with the libraries `libs` (`-l` names), a file of this call's
/// own (tests running at once each compile theirs); None (with a message saying why the test
/// is skipped) when there is no C compiler or no headers.
pub(crate) fn compile_c(name: &str, libs: &[&str]) -> Option<Program> {
    use std::sync::atomic::{AtomicUsize, Ordering};
    static BUILT: AtomicUsize = AtomicUsize::new(0);
    let n = BUILT.fetch_add(1, Ordering::Relaxed);
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = std::env::temp_dir().join(format!("cmsim-{name}-{}-{n}", std::process::id()));
    let status = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .args(libs.iter().map(|l| format!("-l{l}")))
        .status();
    match status {
        Ok(s) if s.success() => Some(Program(out)),
        _ => {
            eprintln!(
                "skipped: cannot compile {} (needs cc, libibverbs-dev)",
                src.display()
            );
            None
        }
    }
}
