//! `cmsim-run`: runs one unmodified librdmacm program on a simulated host of a running
//! `cmsim-daemon`.
//!
//! It lays the drop-in library out in its own directory (`<target>/cmsim/lib`, holding
//! `libibverbs.so.1` and `librdmacm.so.1`, one file under two names), then executes the program
//! with `LD_LIBRARY_PATH` pointing there, `CMSIM_SOCKET` and `CMSIM_HOST` set.
//!
//! The library is also preloaded (`LD_PRELOAD`), so that its socket calls come before libc's
//! whatever order the program names its libraries in: a program's own TCP and UDP sockets
//! between simulated hosts meet on loopback addresses (see `cm_dropin::sockets`), which the
//! daemon's host list, asked for here and handed on in `CMSIM_HOSTS` and `CMSIM_LOOPBACK`,
//! assigns.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use cm_dropin::proto;
use cm_dropin::proto::Dec;
use cm_dropin::request::{FabricHosts, Opening};
use cm_dropin::sock::SeqConn;

const USAGE: &str = "\
usage: cmsim-run [--socket PATH] --host IP [--lib-dir DIR] -- PROGRAM [ARGS...]
  --socket PATH   the daemon's socket (default: $CMSIM_SOCKET)
  --host IP       the simulated host the program runs on (one of the daemon's --host)
  --lib-dir DIR   where to put librdmacm.so.1 / libibverbs.so.1 (default: <target>/cmsim/lib)
  --print-lib-dir lay the libraries out, print their directory and exit
  --wait-for-listener ADDR:PORT
                  first wait (at most 30 s) until some program listens there on the fabric";

/// The cdylib cargo built next to this binary: `cargo build` puts it beside the binaries,
/// `cargo test` refreshes only the copy in `deps/`, so the newer of the two is the current one.
fn built_library() -> Result<PathBuf, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let dir = exe.parent().ok_or("binary without a directory")?;
    let candidates = [
        dir.join("libcm_dropin.so"),
        dir.join("deps").join("libcm_dropin.so"),
    ];
    candidates
        .iter()
        .filter_map(|p| Some((std::fs::metadata(p).ok()?.modified().ok()?, p)))
        .max()
        .map(|(_, p)| p.clone())
        .ok_or_else(|| {
            format!(
                "{} not found: build it with `cargo build -p cm-dropin`",
                candidates[0].display()
            )
        })
}

/// Copies the library in (when it changed) under both sonames; returns the directory.
fn lay_out(lib_dir: Option<PathBuf>) -> Result<PathBuf, String> {
    let lib = built_library()?;
    let dir = match lib_dir {
        Some(d) => d,
        None => {
            // <target>/<profile>/cmsim-run → <target>/cmsim/<profile>/lib
            let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
            let profile_dir = exe.parent().ok_or("no profile dir")?;
            let target = profile_dir.parent().ok_or("no target dir")?;
            let profile = profile_dir.file_name().ok_or("no profile name")?;
            target.join("cmsim").join(profile).join("lib")
        }
    };
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let verbs = dir.join("libibverbs.so.1");
    let fresh = match (std::fs::metadata(&lib), std::fs::metadata(&verbs)) {
        (Ok(src), Ok(dst)) => src.modified().ok() > dst.modified().ok() || src.len() != dst.len(),
        _ => true,
    };
    if fresh {
        // Copy then rename, so a program starting meanwhile never maps a half-written file.
        let tmp = dir.join(format!(".libibverbs.so.1.{}", std::process::id()));
        std::fs::copy(&lib, &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &verbs).map_err(|e| format!("{}: {e}", verbs.display()))?;
    }
    let rdmacm = dir.join("librdmacm.so.1");
    if std::fs::read_link(&rdmacm).ok().as_deref() != Some(Path::new("libibverbs.so.1")) {
        // A link, not a copy: the loader maps one file once, so both sonames share one state.
        // Made under a name of this process's own and renamed over the old one, so runs laying
        // the directory out at once (tests in parallel) never meet each other's half-made link.
        let tmp = dir.join(format!(".librdmacm.so.1.{}", std::process::id()));
        let _ = std::fs::remove_file(&tmp);
        std::os::unix::fs::symlink("libibverbs.so.1", &tmp).map_err(|e| format!("{}: {e}", tmp.display()))?;
        std::fs::rename(&tmp, &rdmacm).map_err(|e| format!("{}: {e}", rdmacm.display()))?;
    }
    Ok(dir)
}

/// Asks the daemon every 10 ms whether something listens at `addr`, for at most 30 s.
fn wait_for_listener(socket: &Path, addr: SocketAddr) -> Result<(), String> {
    let start = Instant::now();
    let deadline = start + Duration::from_secs(30);
    let mut said = false;
    loop {
        let answer = probe(socket, addr);
        if !said && !matches!(answer, Ok(true)) && start.elapsed() >= Duration::from_secs(5) {
            // Said once a wait is longer than a server takes to start, so that a wait for one
            // that never comes is not silent (and a program's own stderr stays its own).
            eprintln!("cmsim-run: still waiting after 5 s (at most 30 s) until something listens at {addr}");
            said = true;
        }
        match answer {
            Ok(true) => return Ok(()),
            Ok(false) if Instant::now() > deadline => {
                return Err(format!("nothing listens at {addr} after 30 s"))
            }
            Err(e) if Instant::now() > deadline => return Err(e),
            // A daemon still starting (or busy) answers the next probe.
            Ok(false) | Err(_) => std::thread::sleep(Duration::from_millis(10)),
        }
    }
}

fn probe(socket: &Path, addr: SocketAddr) -> Result<bool, String> {
    let conn = SeqConn::connect(socket).map_err(|e| format!("{}: {e}", socket.display()))?;
    let e = Opening::ProbeListener { addr: Some(addr) }.encode();
    conn.send(&e.0).map_err(|e| format!("probe: {e}"))?;
    let mut buf = Vec::new();
    if !conn.recv(&mut buf).map_err(|e| format!("probe: {e}"))? {
        return Err("the daemon closed the probe".into());
    }
    let mut d = Dec::new(&buf);
    Ok(d.i32() == Ok(0) && d.u8() == Ok(1))
}

/// The daemon's hosts and the loopback block their sockets use: `Ok(None)` when no daemon
/// listens at `socket` (the program's first call says so, as it always has).
fn fabric_hosts(socket: &Path) -> Result<Option<FabricHosts>, String> {
    let Ok(conn) = SeqConn::connect(socket) else {
        return Ok(None);
    };
    conn.send(&Opening::FabricHosts.encode().0)
        .map_err(|e| format!("asking for the hosts: {e}"))?;
    let mut buf = Vec::new();
    if !conn
        .recv(&mut buf)
        .map_err(|e| format!("asking for the hosts: {e}"))?
    {
        return Err("the daemon closed the connection (another build's daemon?)".into());
    }
    FabricHosts::decode(&buf)
        .map(Some)
        .map_err(|e| format!("the daemon's host list: errno {e}"))
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut socket = std::env::var_os("CMSIM_SOCKET").map(PathBuf::from);
    let mut host = None;
    let mut lib_dir = None;
    let mut print_only = false;
    let mut wait_for = None;
    let mut program = Vec::new();
    while let Some(a) = args.next() {
        match a.as_str() {
            "--socket" => socket = args.next().map(PathBuf::from),
            "--host" => host = args.next(),
            "--lib-dir" => lib_dir = args.next().map(PathBuf::from),
            "--print-lib-dir" => print_only = true,
            "--wait-for-listener" => wait_for = args.next(),
            "--" => {
                program.extend(args.by_ref());
            }
            "-h" | "--help" => {
                println!("{USAGE}");
                return;
            }
            _ => {
                program.push(a);
                program.extend(args.by_ref());
            }
        }
    }
    let dir = match lay_out(lib_dir) {
        Ok(d) => d,
        Err(e) => {
            eprintln!("cmsim-run: {e}");
            std::process::exit(2);
        }
    };
    if print_only {
        println!("{}", dir.display());
        return;
    }
    let (Some(socket), Some(first)) = (socket, program.first()) else {
        eprintln!("{USAGE}");
        std::process::exit(2);
    };
    if let Some(addr) = wait_for {
        let Ok(addr) = addr.parse::<SocketAddr>() else {
            eprintln!("cmsim-run: --wait-for-listener wants ADDR:PORT, got {addr}");
            std::process::exit(2);
        };
        if let Err(e) = wait_for_listener(&socket, addr) {
            eprintln!("cmsim-run: {e}");
            std::process::exit(2);
        }
    }
    let mut cmd = Command::new(first);
    cmd.args(&program[1..]);
    let ld = match std::env::var("LD_LIBRARY_PATH") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", dir.display()),
        _ => dir.display().to_string(),
    };
    let lib = dir.join("libibverbs.so.1");
    let preload = match std::env::var("LD_PRELOAD") {
        Ok(old) if !old.is_empty() => format!("{}:{old}", lib.display()),
        _ => lib.display().to_string(),
    };
    match fabric_hosts(&socket) {
        Ok(None) => {}
        Ok(Some(f)) => {
            let hosts: Vec<String> = f.hosts.iter().map(|h| h.to_string()).collect();
            cmd.env(proto::HOSTS_ENV, hosts.join(","))
                .env(proto::LOOPBACK_ENV, f.loopback.to_string());
        }
        // The program still runs: its RDMA calls say what is wrong with the daemon.
        Err(e) => eprintln!("cmsim-run: {e}: the program's own sockets stay unmapped"),
    }
    cmd.env("LD_LIBRARY_PATH", ld)
        .env("LD_PRELOAD", preload)
        .env("CMSIM_SOCKET", &socket);
    if let Some(h) = host {
        cmd.env("CMSIM_HOST", h);
    }
    let err = cmd.exec();
    eprintln!("cmsim-run: {first}: {err}");
    std::process::exit(127);
}
