//! Debian 12's fio 3.33, unmodified, with its `rdma` I/O engine between two simulated hosts
//! through the drop-in: the server (`rw=read`, no `hostname`) listens on rdma_cm, the client
//! (`rw=write`, `hostname=` the server's address) connects, and each of its I/Os is one RDMA
//! WRITE or READ (`verb=write`, `verb=read`) of the server's registered buffers, whose
//! addresses and keys the two exchange in SENDs first.
//!
//! Each test skips with a message when fio is not installed (`apt-get install fio`;
//! `scripts/test-all` installs it).

use std::time::Duration;

mod common;
#[path = "common/fabric.rs"]
mod fabric;
use common::wait;
use fabric::Fabric;

const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";

/// `/usr/bin/fio`, or None with the package named.
fn fio() -> Option<&'static str> {
    let path = "/usr/bin/fio";
    if std::path::Path::new(path).exists() {
        Some(path)
    } else {
        eprintln!("skipped: {path} is not installed (apt-get install fio)");
        None
    }
}

/// A port for this test process's `n`th pair: tests of several runs may overlap.
fn port(n: u16) -> String {
    (24_000 + (std::process::id() % 1_000) as u16 * 4 + n).to_string()
}

/// What fio reported of one job: its error, the I/Os issued per direction (`issued rwts:
/// total=R,W,T,S`) and the bytes moved (`io=`) by its run status line.
#[derive(Debug, PartialEq)]
struct Job {
    err: String,
    issued: Vec<u64>,
    io: Option<String>,
}

fn job(out: &str) -> Job {
    let err = out
        .lines()
        .find_map(|l| l.split_once(": (groupid=0, jobs=1): err=").map(|(_, e)| e))
        .map(|e| e.split(':').next().unwrap_or("").trim().to_string())
        .unwrap_or_else(|| "no job line".into());
    let issued = out
        .lines()
        .find_map(|l| l.trim().strip_prefix("issued rwts: total="))
        .map(|t| {
            t.split_whitespace()
                .next()
                .unwrap_or("")
                .split(',')
                .filter_map(|n| n.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    let io = out
        .lines()
        .find_map(|l| l.split_once(" io=").map(|(_, r)| r))
        .map(|r| r.split_whitespace().next().unwrap_or("").to_string());
    Job { err, issued, io }
}

fn as_str(v: &[String]) -> Vec<&str> {
    v.iter().map(String::as_str).collect()
}

/// Runs fio's rdma engine with `verb` between the two hosts, `size` bytes in `bs` blocks, the
/// client keeping `depth` I/Os in flight: the server's and the client's output.
fn pair(n: u16, verb: &str, bs: &str, size: &str, depth: &str) -> Option<(String, String)> {
    let fio = fio()?;
    let port = port(n);
    let fabric = Fabric::start(&format!("fio-{verb}-{port}"), &[SERVER, CLIENT], 2);
    let common = |name: &str| {
        vec![
            format!("--name={name}"),
            "--ioengine=rdma".into(),
            format!("--port={port}"),
            format!("--bs={bs}"),
            format!("--size={size}"),
        ]
    };
    let mut server = common("server");
    server.extend(["--rw=read".into(), "--iodepth=1".into()]);
    let mut client = common("client");
    client.extend([
        format!("--hostname={SERVER}"),
        format!("--verb={verb}"),
        "--rw=write".into(),
        format!("--iodepth={depth}"),
    ]);
    let argv = |args: &[String]| -> Vec<String> {
        std::iter::once(fio.to_string())
            .chain(args.iter().cloned())
            .collect()
    };
    let (server, client) = (argv(&server), argv(&client));
    let s = fabric.spawn(SERVER, &as_str(&server));
    let c = fabric::spawn_on(
        fabric.socket(),
        CLIENT,
        Some(&format!("{SERVER}:{port}")),
        &as_str(&client),
    );
    let c = wait(c, Duration::from_secs(60), "fio client");
    let s = wait(s, Duration::from_secs(20), "fio server");
    let d = fabric.stop();
    assert!(
        c.status.success() && s.status.success(),
        "client: {}\n{}\nserver: {}\n{}\ndaemon: {}",
        c.stdout,
        c.stderr,
        s.stdout,
        s.stderr,
        d.stderr
    );
    Some((s.stdout, c.stdout))
}

#[test]
fn fio_rdma_engine_writes_256_blocks_of_4_kib_into_the_servers_memory() {
    let Some((s, c)) = pair(0, "write", "4k", "1m", "16") else {
        return;
    };
    let client = job(&c);
    assert_eq!(
        client,
        Job {
            err: "0".into(),
            issued: vec![0, 256, 0, 0],
            io: Some("1024KiB".into()),
        },
        "{c}"
    );
    // The server's one "read" is its wait for the client's last message.
    assert_eq!(job(&s).err, "0", "{s}");
}

#[test]
fn fio_rdma_engine_reads_64_blocks_of_64_kib_from_the_servers_memory() {
    let Some((s, c)) = pair(1, "read", "64k", "4m", "8") else {
        return;
    };
    let client = job(&c);
    assert_eq!(
        client,
        Job {
            err: "0".into(),
            issued: vec![0, 64, 0, 0],
            io: Some("4096KiB".into()),
        },
        "{c}"
    );
    assert_eq!(job(&s).err, "0", "{s}");
}
