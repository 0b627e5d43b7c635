//! Helpers the tests that run C programs share.

use std::io::Read;
use std::process::{Child, ExitStatus};
use std::time::{Duration, Instant};

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
