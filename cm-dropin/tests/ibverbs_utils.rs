//! Device discovery on the drop-in: Debian's ibverbs-utils (`ibv_devices`, `ibv_devinfo`),
//! unmodified, and `tests/c/devices.c`, on a fabric host, print and get the simulated device as
//! they would rxe's.
//!
//! Each test skips with a message when its program is not installed (`apt-get install
//! ibverbs-utils`; `scripts/test-all` installs it) or cannot be compiled. Every wait is
//! bounded: a hung program is killed and the test fails.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");
const RUN: &str = env!("CARGO_BIN_EXE_cmsim-run");
const HOST: &str = "10.0.0.1";

fn installed(program: &str) -> bool {
    let found = Path::new("/usr/bin").join(program).exists();
    if !found {
        eprintln!("skipped: /usr/bin/{program} is not installed (apt-get install ibverbs-utils)");
    }
    found
}

mod common;
use common::Output;

/// Waits for `child` at most 30 s; kills it and panics past that.
fn wait(child: Child, what: &str) -> Output {
    common::wait(child, Duration::from_secs(30), what)
}

/// Runs `program` on host 10.0.0.1 of a fabric of its own (one host, one process).
fn on_fabric(name: &str, program: &[&str]) -> Output {
    let socket = std::env::temp_dir().join(format!("cmsim-{name}-{}.sock", std::process::id()));
    let daemon = Command::new(DAEMON)
        .arg("--socket")
        .arg(&socket)
        .args([
            "--host",
            HOST,
            "--seed",
            "7",
            "--max-seconds",
            "60",
            "--processes",
            "1",
        ])
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
    let child = Command::new(RUN)
        .arg("--socket")
        .arg(&socket)
        .args(["--host", HOST, "--"])
        .args(program)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("start cmsim-run");
    let out = wait(child, program[0]);
    let d = wait(daemon, "cmsim-daemon");
    let _ = std::fs::remove_file(&socket);
    assert!(d.status.success(), "daemon: {}", d.stderr);
    out
}

/// The value `ibv_devinfo` prints after `key:` (tabs between), from the first line with it.
fn field<'a>(out: &'a str, key: &str) -> Option<&'a str> {
    out.lines()
        .find_map(|l| l.trim_start().strip_prefix(&format!("{key}:")))
        .map(str::trim)
}

#[test]
fn ibv_devices_lists_the_simulated_device_and_its_node_guid() {
    if !installed("ibv_devices") {
        return;
    }
    let o = on_fabric("ibv-devices", &["ibv_devices"]);
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.is_empty(), "stderr: {}", o.stderr);
    // The GUID is the EUI-64 of the MAC 02:00:0a:00:00:01 the host's address gives.
    let row: Vec<&str> = o
        .stdout
        .lines()
        .nth(2)
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(row, ["cmsim0", "00000afffe000001"], "{}", o.stdout);
}

#[test]
fn ibv_devinfo_shows_an_active_roce_port_as_on_rxe() {
    if !installed("ibv_devinfo") {
        return;
    }
    let o = on_fabric("ibv-devinfo", &["ibv_devinfo"]);
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.is_empty(), "stderr: {}", o.stderr);
    let s = &o.stdout;
    for (key, want) in [
        ("hca_id", "cmsim0"),
        ("transport", "InfiniBand (0)"),
        ("fw_ver", "0.0.0"),
        ("node_guid", "0000:0aff:fe00:0001"),
        ("vendor_id", "0xffffff"),
        ("phys_port_cnt", "1"),
        ("state", "PORT_ACTIVE (4)"),
        ("max_mtu", "4096 (5)"),
        ("active_mtu", "1024 (3)"),
        ("link_layer", "Ethernet"),
    ] {
        assert_eq!(field(s, key), Some(want), "{key} in\n{s}");
    }
    // rxe has no board_id; a verbose-only line must not show.
    assert!(
        field(s, "board_id").is_none() && field(s, "max_qp").is_none(),
        "{s}"
    );
}

#[test]
fn ibv_devinfo_verbose_shows_rxes_limits_and_the_gid_table_with_the_hosts_ipv4_address() {
    if !installed("ibv_devinfo") {
        return;
    }
    let o = on_fabric("ibv-devinfo-v", &["ibv_devinfo", "-v"]);
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert!(o.stderr.is_empty(), "stderr: {}", o.stderr);
    let s = &o.stdout;
    for (key, want) in [
        ("max_qp", "1048560"),
        ("max_qp_wr", "16384"),
        ("max_sge", "32"),
        ("max_cqe", "32767"),
        ("max_mr_size", "0x40000000"),
        ("page_size_cap", "0xfffff000"),
        ("max_pkeys", "64"),
        ("max_srq", "917503"),
        ("max_srq_wr", "1048576"),
        ("max_srq_sge", "27"),
        ("atomic_cap", "ATOMIC_NONE (0)"),
        ("max_msg_sz", "0x20000"),
        ("port_cap_flags", "0x00010000"),
        ("gid_tbl_len", "1024"),
        ("pkey_tbl_len", "1"),
        ("phys_state", "LINK_UP (5)"),
        ("GID[  0]", "fe80::aff:fe00:1, RoCE v2"),
        ("GID[  1]", "::ffff:10.0.0.1, RoCE v2"),
    ] {
        assert_eq!(field(s, key), Some(want), "{key} in\n{s}");
    }
    assert!(!s.contains("GID[  2]"), "only two GIDs: {s}");
}

/// Compiles `tests/c/<name>.c` against the installed rdma-core headers; None (with a message)
/// when there is no C compiler or no headers.
fn compile_c(name: &str) -> Option<PathBuf> {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join(format!("tests/c/{name}.c"));
    let out = std::env::temp_dir().join(format!("cmsim-{name}-{}", std::process::id()));
    let status = Command::new("cc")
        .args(["-Wall", "-Werror", "-o"])
        .arg(&out)
        .arg(&src)
        .arg("-libverbs")
        .status();
    match status {
        Ok(s) if s.success() => Some(out),
        _ => {
            eprintln!(
                "skipped: cannot compile {} (needs cc, libibverbs-dev)",
                src.display()
            );
            None
        }
    }
}

#[test]
fn a_c_program_lists_opens_and_queries_the_device_and_gets_libibverbs_errors() {
    let Some(prog) = compile_c("devices") else {
        return;
    };
    let path = prog.to_string_lossy().into_owned();
    let o = on_fabric("devices-c", &[&path, HOST]);
    let _ = std::fs::remove_file(&prog);
    assert_eq!(o.stdout, "devices: ok\n", "{}", o.stderr);
    assert!(o.status.success());
    // The one refusal says why; the served calls say nothing.
    let refusal = "cmsim: ibv_reg_mr_iova with an iova (0x1000) other than the region's address (0x";
    assert!(
        o.stderr.lines().count() == 1
            && o.stderr.starts_with(refusal)
            && o.stderr.ends_with(") is not supported: EINVAL\n"),
        "stderr: {}",
        o.stderr
    );
}
