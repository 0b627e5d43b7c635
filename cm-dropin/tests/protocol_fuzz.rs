//! A protocol fuzzer for `cmsim-daemon`, which must take every byte a client sends as hostile.
//!
//! One daemon; beside a well-behaved program pair, hostile clients attack it. The pair is two
//! processes of the wire protocol written here (no Debian package needed, so it always runs):
//! a server that listens and accepts, and a client that is a new process each round, resolves,
//! connects, exchanges sends and receives, has the server RDMA WRITE into and READ back from
//! its registered buffer (two entries each, in regions of the server's own), disconnects and
//! tears down. With Debian's rdmacm-utils installed a `cmtime` pair (100 connections) runs
//! beside them too.
//!
//! The hostile clients, from worker threads, each client its own connections, are drawn from:
//! - silent ones, which connect and close without a word;
//! - ones whose first datagram is junk: empty, random, of `MAX_DATAGRAM` bytes and larger, a
//!   hello cut short, with junk strings, without its version or naming another process,
//!   `AttachChannel` / `AttachCompChannel` with made-up and foreign tokens, `ProbeListener`
//!   with junk, a hello for a host the fabric lacks, or any other request;
//! - attached ones (a proper hello; now and then one naming another pid or another protocol
//!   version, which must be refused) that send random requests with random, truncated,
//!   extended and corrupted bodies, handles of their own, made up, destroyed, or taken from
//!   other processes (hostile ones and the pair), in any order (acks before events, destroys
//!   twice, posts without QPs, RDMA with random keys, addresses, entries and lengths, regions
//!   past the end of the address space or with access verbs refuses), attach channel sockets
//!   (their own and others'), read events or leave them unread, and close mid-stream after a
//!   burst of unread requests;
//! - connected pairs, two hostile processes that first connect properly (so the data path's
//!   requests meet a QP that can send and READ) and then fuzz the data path the same way;
//! - floods: one request carrying large bytes, repeated, to find what the daemon keeps.
//!
//! Checks: every request of an attached client but an ack is answered within `REPLY_WITHIN`
//! with a status that is an errno or 0, and with a reply that decodes; an ack (never answered)
//! is followed by a request whose answer must be the next datagram, so an answered ack shows;
//! a request naming another process's handle, or one destroyed before, is refused, as is an
//! RDMA request whose entries lie outside the caller's regions; truncated requests fail; the
//! first-message-only requests, empty datagrams and unknown ops are `EPROTO`; a region past
//! the end of the address space or with remote write or atomic access but no local write, and
//! RDMA of more than 64 entries or more than a message, are `EINVAL`; a hello naming another
//! pid is `EPERM`, one of another protocol version (or none) `EPROTONOSUPPORT`; a refused
//! first message is answered at most once and then closed; the pair completes every round
//! within `PAIR_ROUND_WITHIN` and sees its bytes intact (cmtime reports no error); the daemon
//! is alive throughout, answers a fresh hello at the end, returns to its starting fd count
//! once every client has gone, grows its RSS by less than the bounds below, never prints
//! "panicked", and ends on SIGTERM with exit 128 + 15.
//!
//! Bound: 2 phases x `WORKERS` (4) workers x `CLIENTS` (150) clients, 1 200 in all, an
//! attached client or connected pair at most `MESSAGES` (200) requests, a flood at most 200:
//! 64 000 to 69 000 requests, measured at 14 to 17 s in a debug build on 2 cores over 6 seeds,
//! cmtime included, with the never-reading client's test (6 s) beside it in the same run
//! (scripts/test-all's step says so). Every wait has its bound (`REPLY_WITHIN` and the like),
//! so a hang fails the test instead of stopping it; connects never wait, as the daemon's
//! listen backlog (1024) is far above the connections this test makes at once.
//!
//! Seeded: `CMSIM_FUZZ_SEED` (decimal or 0x-hex; default `DEFAULT_SEED`) fixes every worker's
//! clients and messages; how they interleave with each other, with the pair and with the
//! daemon's wall clock does not follow from it. A failure prints the seed and the line that
//! reruns it.
//!
//! A client that never reads its replies is the test beside it,
//! `a_client_that_never_reads_its_replies_does_not_stall_the_others`: the daemon's replies
//! never block it, so the others are served meanwhile, and it cuts such a client off after
//! 5 s. The fuzzer's own bursts leave replies of any size unread.
//!
//! The test process's memory: the daemon checks a hello's pid against the kernel's, so every
//! process attached here is this one, and every hostile region and RDMA target is this
//! process's memory, read and written by the daemon (`process_vm_readv`/`writev`). So every
//! region a hostile client registers lies inside a scratch buffer of its own, above 2^63
//! (never user memory), in the null page, or is empty; every RDMA WRITE aims there, and every
//! READ's entries (where its bytes land) too; only what is read (a WRITE's entries, a READ's
//! remote address) may be anywhere. Random bytes are never sent as a `RegMr`, `RdmaWrite`,
//! `RdmaWriteImm` or `RdmaRead` request, and such a request is never corrupted.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io::ErrorKind;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use cm_dropin::proto::{
    Dec, Enc, Op, WireEvent, WireWc, CHAN_ATTACHED, CHAN_COMP, CHAN_EVENT, MAX_MESSAGE, PROTOCOL_VERSION,
};
use cm_dropin::sock::{self, Interest, SeqConn, MAX_DATAGRAM};
use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

const DAEMON: &str = env!("CARGO_BIN_EXE_cmsim-daemon");
const RUN: &str = env!("CARGO_BIN_EXE_cmsim-run");
const SERVER: &str = "10.0.0.1";
const CLIENT: &str = "10.0.0.2";

const DEFAULT_SEED: u64 = 0x00c0_ffee;
const PHASES: usize = 2;
const WORKERS: usize = 4;
const CLIENTS: usize = 150;
const MESSAGES: u64 = 200;

/// The pair's listener; cmtime's is 7471 and udaddy's 7174. Hostile clients bind none of
/// these, nor the connected pairs' ports (10000 to 17999), and connect to the pair's now and
/// then (its server refuses them).
const PAIR_PORT: u16 = 7600;
const PAIR_MESSAGES: u64 = 4;
const PAIR_BUF: usize = 4096;
const MIN_PAIR_ROUNDS: u64 = 3;
/// The pair's client tells its requests from foreign ones by this private data.
const PAIR_MAGIC: &[u8] = b"fuzz-pair";

/// The longest a request may wait for its reply, an event for its channel, a first message
/// for its answer or end: far beyond what the daemon takes (milliseconds), so only a hang
/// reaches it.
const REPLY_WITHIN: Duration = Duration::from_secs(10);
const EVENT_WITHIN: Duration = Duration::from_secs(10);
const PAIR_ROUND_WITHIN: Duration = Duration::from_secs(30);

/// The daemon's fds once everyone has gone: at most this many more than before anyone came.
const FD_MARGIN: usize = 2;
/// RSS growth over the second phase (as much work as the first, after it), measured at 250
/// to 600 KiB (the simulator's trace of the pair's connections, tables at their largest):
/// a leak of 110 bytes a request (39 000 a phase), or of a hundredth of what the floods
/// send, exceeds it. The
/// daemon runs with glibc's malloc told to map blocks of 16 KiB and more on their own, so
/// that what the floods and large requests held for a moment goes back at once and the RSS
/// follows what the daemon still holds.
const PHASE_RSS_GROWTH_KIB: u64 = 4 * 1024;
/// RSS growth over the whole run, the first phase's warm-up included (measured: 1.5 to 2 MiB over 20 seeds).
const TOTAL_RSS_GROWTH_KIB: u64 = 16 * 1024;

/// The buffer hostile regions and RDMA WRITEs aim at (and the only memory of this process
/// they may name).
const SCRATCH_LEN: u64 = 1 << 20;
/// Addresses from here up are never user memory on x86-64 or AArch64.
const HIGH: u64 = 1 << 63;

const TCP: u32 = 0x0106;
const EV_ADDR_RESOLVED: u32 = 0;
const EV_ROUTE_RESOLVED: u32 = 2;
const EV_CONNECT_REQUEST: u32 = 4;
const EV_ESTABLISHED: u32 = 9;
const EV_DISCONNECTED: u32 = 10;
const WC_RDMA_WRITE: u32 = 1;
const WC_RDMA_READ: u32 = 2;
const WC_RECV: u32 = 128;
const ACCESS_ALL: u32 = 1 | 2 | 4;

// The connected pairs' ports stay within 10000..18000.
const _: () = assert!(PHASES * 4000 <= 8000 && WORKERS <= 4 && CLIENTS <= 1000);

fn seed() -> u64 {
    match std::env::var("CMSIM_FUZZ_SEED") {
        Err(_) => DEFAULT_SEED,
        Ok(s) => {
            let s = s.trim();
            let parsed = match s.strip_prefix("0x") {
                Some(hex) => u64::from_str_radix(hex, 16),
                None => s.parse(),
            };
            parsed.unwrap_or_else(|_| panic!("CMSIM_FUZZ_SEED={s:?}: want a number"))
        }
    }
}

fn reproduce(seed: u64) -> String {
    format!("CMSIM_FUZZ_SEED={seed} cargo test -p cm-dropin --test protocol_fuzz -- --ignored --nocapture")
}

// ---------------------------------------------------------------------------------------------
// The daemon.

struct Daemon {
    child: Option<Child>,
    socket: PathBuf,
    err: PathBuf,
    pid: u32,
}

impl Daemon {
    fn start(name: &str) -> Daemon {
        let base = std::env::temp_dir().join(format!("cmsim-fuzz-{name}-{}", std::process::id()));
        let socket = base.with_extension("sock");
        let err = base.with_extension("err");
        let _ = std::fs::remove_file(&socket);
        // stderr to a file: a line per process attached and detached would fill a pipe nobody
        // reads while the fuzz runs.
        let child = Command::new(DAEMON)
            // glibc's malloc: blocks of 16 KiB and more mapped and unmapped each on their
            // own, and the heap's free top returned, so that the RSS follows what the daemon
            // holds rather than the largest burst it once served.
            .env("MALLOC_MMAP_THRESHOLD_", "16384")
            .env("MALLOC_TRIM_THRESHOLD_", "131072")
            .arg("--socket")
            .arg(&socket)
            .args(["--host", SERVER, "--host", CLIENT, "--max-seconds", "300"])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&err).expect("the daemon's stderr file"))
            .spawn()
            .expect("start cmsim-daemon");
        let pid = child.id();
        let d = Daemon {
            child: Some(child),
            socket,
            err,
            pid,
        };
        let deadline = Instant::now() + Duration::from_secs(10);
        use std::os::unix::fs::FileTypeExt;
        while !std::fs::symlink_metadata(&d.socket).is_ok_and(|m| m.file_type().is_socket()) {
            assert!(Instant::now() < deadline, "no socket at {}", d.socket.display());
            std::thread::sleep(Duration::from_millis(10));
        }
        d
    }

    /// Whether the daemon still runs (its exit status otherwise).
    fn exited(&mut self) -> Option<std::process::ExitStatus> {
        self.child.as_mut().and_then(|c| c.try_wait().ok().flatten())
    }

    fn fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid)).map_or(usize::MAX, |d| d.count())
    }

    fn rss_kib(&self) -> u64 {
        let status = std::fs::read_to_string(format!("/proc/{}/status", self.pid)).unwrap_or_default();
        status
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(&self.err).unwrap_or_default()
    }

    /// The last `n` lines of its stderr.
    fn stderr_tail(&self, n: usize) -> String {
        let err = self.stderr();
        let lines: Vec<&str> = err.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Sends SIGTERM and waits at most 30 s: the exit code.
    fn terminate(&mut self) -> Option<i32> {
        // SAFETY: kill has no memory arguments; the pid is our child's, not yet reaped.
        unsafe { libc::kill(self.pid as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.exited() {
                self.child = None;
                return status.code();
            }
            if Instant::now() > deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
        let _ = std::fs::remove_file(&self.socket);
        let _ = std::fs::remove_file(&self.err);
    }
}

// ---------------------------------------------------------------------------------------------
// Bounded sends and receives.

enum Sent {
    Yes,
    /// The datagram is larger than a socket buffer can take (`EMSGSIZE`): nothing was sent.
    TooBig,
    /// The daemon closed the connection.
    Gone,
}

fn send_within(conn: &SeqConn, msg: &[u8], within: Duration) -> Result<Sent, String> {
    let deadline = Instant::now() + within;
    loop {
        match conn.try_send(msg) {
            Ok(()) => return Ok(Sent::Yes),
            Err(e) if e.raw_os_error() == Some(libc::EMSGSIZE) => return Ok(Sent::TooBig),
            Err(e) if matches!(e.kind(), ErrorKind::BrokenPipe | ErrorKind::ConnectionReset) => {
                return Ok(Sent::Gone)
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(format!(
                        "a send of {} bytes could not proceed within {within:?}: the daemon reads nothing",
                        msg.len()
                    ));
                }
                sock::poll(&[(conn.as_raw_fd(), Interest::Write)], millis(left))
                    .map_err(|e| format!("poll: {e}"))?;
            }
            Err(e) => return Err(format!("send: {e}")),
        }
    }
}

enum Got {
    Msg(Vec<u8>),
    Closed,
    Nothing,
}

fn recv_within(conn: &SeqConn, within: Duration) -> Result<Got, String> {
    let deadline = Instant::now() + within;
    let mut buf = Vec::new();
    loop {
        match sock::recv_fd(conn.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT) {
            Ok(true) => return Ok(Got::Msg(buf)),
            Ok(false) => return Ok(Got::Closed),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return Ok(Got::Closed),
            Err(e) if e.kind() == ErrorKind::WouldBlock => {}
            Err(e) => return Err(format!("recv: {e}")),
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Ok(Got::Nothing);
        }
        sock::poll(&[(conn.as_raw_fd(), Interest::Read)], millis(left)).map_err(|e| format!("poll: {e}"))?;
    }
}

fn millis(d: Duration) -> i32 {
    d.as_millis().clamp(1, i32::MAX as u128) as i32
}

/// One request and its reply.
fn exchange(conn: &SeqConn, msg: &[u8], within: Duration) -> Result<Vec<u8>, String> {
    match send_within(conn, msg, within)? {
        Sent::Yes => {}
        Sent::TooBig => return Err("too big to send".into()),
        Sent::Gone => return Err("the daemon closed the connection".into()),
    }
    match recv_within(conn, within)? {
        Got::Msg(b) => Ok(b),
        Got::Closed => Err("the daemon closed the connection instead of answering".into()),
        Got::Nothing => Err(format!("no answer within {within:?}: the daemon hangs")),
    }
}

/// A request, for messages: its op and its first bytes.
fn describe(msg: &[u8]) -> String {
    let op = match Dec::new(msg).u32() {
        Ok(v) => Op::from_u32(v).map_or(format!("op {v}"), |op| format!("{op:?}")),
        Err(_) => "no op".to_string(),
    };
    let head: String = msg.iter().take(40).map(|b| format!("{b:02x}")).collect();
    format!(
        "{op} ({} bytes: {head}{})",
        msg.len(),
        if msg.len() > 40 { "..." } else { "" }
    )
}

// ---------------------------------------------------------------------------------------------
// A process of the wire protocol.

struct Proc {
    ctrl: SeqConn,
    token: u64,
}

fn hello_within(path: &Path, host: &str, pid: u32, argv0: &str, within: Duration) -> Result<Proc, String> {
    let ctrl = SeqConn::connect(path).map_err(|e| format!("connect: {e}"))?;
    let e = Enc::hello(pid, host, argv0);
    let reply = exchange(&ctrl, &e.0, within).map_err(|m| format!("hello as {host:?}: {m}"))?;
    let mut d = Dec::new(&reply);
    match d.i32() {
        Ok(0) => {}
        other => return Err(format!("hello as {host:?}: status {other:?}")),
    }
    let token = d.u64().map_err(|_| "hello's answer has no token".to_string())?;
    Ok(Proc { ctrl, token })
}

fn hello(path: &Path, host: &str, pid: u32, argv0: &str) -> Result<Proc, String> {
    hello_within(path, host, pid, argv0, REPLY_WITHIN)
}

impl Proc {
    fn ask(&self, e: &Enc) -> Result<(i32, Vec<u8>), String> {
        let r = exchange(&self.ctrl, &e.0, REPLY_WITHIN).map_err(|m| format!("{}: {m}", describe(&e.0)))?;
        let status = Dec::new(&r)
            .i32()
            .map_err(|_| format!("{}: a reply of {} bytes", describe(&e.0), r.len()))?;
        Ok((status, r[4..].to_vec()))
    }

    fn call(&self, e: &Enc) -> Result<Vec<u8>, String> {
        match self.ask(e)? {
            (0, rest) => Ok(rest),
            (s, _) => Err(format!("{}: errno {s}", describe(&e.0))),
        }
    }

    fn call_u64(&self, e: &Enc) -> Result<u64, String> {
        let rest = self.call(e)?;
        Dec::new(&rest)
            .u64()
            .map_err(|_| format!("{}: no token in its reply", describe(&e.0)))
    }

    /// A request that is not answered (an ack): sent, nothing awaited.
    fn tell(&self, e: &Enc) -> Result<(), String> {
        match send_within(&self.ctrl, &e.0, REPLY_WITHIN)? {
            Sent::Yes => Ok(()),
            Sent::TooBig => Err(format!("{}: too big to send", describe(&e.0))),
            Sent::Gone => Err(format!("{}: the daemon closed the connection", describe(&e.0))),
        }
    }

    fn call_u32(&self, e: &Enc) -> Result<u32, String> {
        let rest = self.call(e)?;
        Dec::new(&rest)
            .u32()
            .map_err(|_| format!("{}: no key in its reply", describe(&e.0)))
    }
}

/// An event channel with its socket.
struct Chan {
    sock: SeqConn,
    token: u64,
}

/// A connection that says `op` (an attach) first: the socket if the daemon attached it.
fn attach_socket(path: &Path, op: Op, proc: u64, channel: u64) -> Result<Option<SeqConn>, String> {
    let sock = SeqConn::connect(path).map_err(|e| format!("connect: {e}"))?;
    let mut e = Enc::op(op);
    e.u64(proc).u64(channel);
    if !matches!(send_within(&sock, &e.0, REPLY_WITHIN)?, Sent::Yes) {
        return Ok(None);
    }
    match recv_within(&sock, REPLY_WITHIN)? {
        Got::Msg(b) if b == [CHAN_ATTACHED] => Ok(Some(sock)),
        Got::Msg(b) => Err(format!(
            "{op:?}: answered {b:?}, neither CHAN_ATTACHED nor the end"
        )),
        Got::Closed => Ok(None),
        Got::Nothing => Err(format!(
            "{op:?}: neither attached nor closed within {REPLY_WITHIN:?}"
        )),
    }
}

fn open_channel(p: &Proc, path: &Path) -> Result<Chan, String> {
    let token = p.call_u64(&Enc::op(Op::CreateChannel))?;
    let sock = attach_socket(path, Op::AttachChannel, p.token, token)?
        .ok_or("AttachChannel of its own new channel was refused")?;
    Ok(Chan { sock, token })
}

fn decode_event(b: &[u8]) -> Result<WireEvent, String> {
    let mut d = Dec::new(b);
    match d.u8() {
        Ok(CHAN_EVENT) => d.event().map_err(|_| format!("a malformed event datagram {b:?}")),
        _ => Err(format!("a channel datagram that is not an event: {b:?}")),
    }
}

/// The next event `want` (for `id`, if given) on `ch` within `within`, every event read acked;
/// `refuse`: connection requests whose private data does not start with [`PAIR_MAGIC`] (the
/// simulator pads it, as the IB CM does) are rejected (the pair's
/// server). `None` when none came in time.
fn next_event(
    p: &Proc,
    ch: &Chan,
    want: u32,
    id: Option<u64>,
    within: Duration,
    refuse: bool,
) -> Result<Option<WireEvent>, String> {
    let deadline = Instant::now() + within;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let b = match recv_within(&ch.sock, left)? {
            Got::Msg(b) => b,
            Got::Closed => return Err("the daemon closed an event channel".into()),
            Got::Nothing => return Ok(None),
        };
        let ev = decode_event(&b)?;
        // Not answered: the next request's answer follows.
        let mut ack = Enc::op(Op::AckEvent);
        ack.u64(ev.event_no);
        p.tell(&ack)?;
        if refuse
            && ev.event == EV_CONNECT_REQUEST
            && !ev.param.private_data.as_slice().starts_with(PAIR_MAGIC)
        {
            // Someone else's: refused, and the id the request made is given back.
            let mut r = Enc::op(Op::Reject);
            r.u64(ev.id).bytes(b"");
            p.ask(&r)?;
            let mut d = Enc::op(Op::DestroyId);
            d.u64(ev.id);
            p.ask(&d)?;
            continue;
        }
        if ev.event == want && id.is_none_or(|i| i == ev.id) {
            return Ok(Some(ev));
        }
        // ADDR_ERROR, ROUTE_ERROR, CONNECT_ERROR, UNREACHABLE, REJECTED of the id waited for.
        if matches!(ev.event, 1 | 3 | 6 | 7 | 8) && id == Some(ev.id) {
            return Err(format!("waiting for event {want}, got {ev:?}"));
        }
    }
}

fn expect_event(p: &Proc, ch: &Chan, want: u32, id: Option<u64>, refuse: bool) -> Result<WireEvent, String> {
    next_event(p, ch, want, id, EVENT_WITHIN, refuse)?
        .ok_or_else(|| format!("no event {want} for id {id:?} within {EVENT_WITHIN:?}"))
}

/// A QP for `id` on `cq`: up to 4 entries a send (the pair's RDMA takes 2).
fn create_qp(id: u64, cq: u64) -> Enc {
    let mut e = Enc::op(Op::CreateQp);
    e.u64(id)
        .u32(16)
        .u32(16)
        .u32(4)
        .u32(1)
        .u32(0)
        .u64(cq)
        .u64(cq)
        .u8(1)
        .u32(2)
        .u64(0);
    e
}

fn conn_param(private_data: &[u8]) -> cm_core::ConnParam {
    cm_core::ConnParam {
        responder_resources: 1,
        initiator_depth: 1,
        retry_count: 7,
        rnr_retry_count: 7,
        ..cm_core::ConnParam::ZERO
    }
    .with_private_data(private_data)
}

/// Connection parameters as the wire lays them out, with private data of any length (the
/// library's own encoder keeps at most what `struct rdma_conn_param` can hold).
fn raw_param(e: &mut Enc, private_data: &[u8], fields: [u8; 6], qp_num: u32) {
    e.bytes(private_data);
    for b in fields {
        e.u8(b);
    }
    e.u32(qp_num);
}

fn post_recv(p: &Proc, id: u64, wr_id: u64) -> Result<(), String> {
    let mut e = Enc::op(Op::PostRecv);
    e.u64(id).u64(wr_id).u32(PAIR_BUF as u32);
    p.call(&e).map(drop)
}

fn post_send(p: &Proc, id: u64, wr_id: u64, data: &[u8]) -> Result<(), String> {
    let mut e = Enc::op(Op::PostSend);
    e.u64(id).u64(wr_id).u8(1).bytes(data);
    p.call(&e).map(drop)
}

fn simple(p: &Proc, op: Op, token: u64) -> Result<(), String> {
    let mut e = Enc::op(op);
    e.u64(token);
    p.call(&e).map(drop)
}

/// Polls `cq` until a completion of `opcode` arrives (others are kept in `backlog`); every
/// completion must have succeeded.
fn poll_for(p: &Proc, cq: u64, backlog: &mut VecDeque<WireWc>, opcode: u32) -> Result<WireWc, String> {
    let deadline = Instant::now() + EVENT_WITHIN;
    loop {
        if let Some(i) = backlog.iter().position(|w| w.opcode == opcode) {
            return Ok(backlog.remove(i).expect("found above"));
        }
        let mut e = Enc::op(Op::PollCq);
        e.u64(cq).u32(16);
        let rest = p.call(&e)?;
        let mut d = Dec::new(&rest);
        let n = d.u32().map_err(|_| "PollCq: no count".to_string())?;
        for _ in 0..n {
            let wc = d.wc().map_err(|_| "PollCq: a malformed completion".to_string())?;
            if wc.status != 0 {
                return Err(format!("a completion failed: {wc:?}"));
            }
            backlog.push_back(wc);
        }
        if n == 0 {
            if Instant::now() > deadline {
                return Err(format!("no completion {opcode} within {EVENT_WITHIN:?}"));
            }
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

/// Registers `at` (memory of this process, which every process here is) with `access`: its key.
fn reg_mr(p: &Proc, at: &[u8], access: u32) -> Result<u32, String> {
    let mut e = Enc::op(Op::RegMr);
    e.u64(at.as_ptr() as u64).u64(at.len() as u64).u32(access);
    p.call_u32(&e)
}

/// An RDMA WRITE or READ on QP `id`, signaled: the caller's `entries` (address, length, lkey),
/// the peer's region `rkey` at `remote`.
fn rdma(op: Op, id: u64, wr_id: u64, remote: u64, rkey: u32, entries: &[(u64, u32, u32)]) -> Enc {
    let mut e = Enc::op(op);
    e.u64(id)
        .u64(wr_id)
        .u8(1)
        .u64(remote)
        .u32(rkey)
        .u32(entries.len() as u32);
    for &(addr, len, lkey) in entries {
        e.u64(addr).u32(len).u32(lkey);
    }
    e
}

/// The bytes of `buf`, read volatile: the daemon writes them from outside, behind the
/// compiler's back.
fn read_back(buf: &[u8]) -> Vec<u8> {
    // SAFETY: every index is within `buf`, which is alive and initialised.
    (0..buf.len())
        .map(|i| unsafe { std::ptr::read_volatile(buf.as_ptr().add(i)) })
        .collect()
}

/// What the server writes into the client's buffer in `round`.
fn pattern(round: u64, len: usize) -> Vec<u8> {
    (0..len).map(|i| (i as u64 * 31 + round * 7 + 1) as u8).collect()
}

fn pair_addr() -> SocketAddr {
    SocketAddr::new(SERVER.parse().expect("an address"), PAIR_PORT)
}

// ---------------------------------------------------------------------------------------------
// Handles: who made them, for the hostile clients to misuse.

#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
enum Kind {
    Proc,
    Channel,
    CompChannel,
    Id,
    Cq,
    Event,
    Key,
    /// A verbs QP (`ibv_create_qp`).
    Qp,
    /// A shared receive queue (`ibv_create_srq`).
    Srq,
}

struct Ctx {
    path: PathBuf,
    seed: u64,
    /// This process's pid: the only one a hello may name.
    pid: u32,
    /// The daemon's, which a hostile hello names now and then (its heap holds everyone's
    /// messages).
    daemon_pid: u32,
    /// The scratch buffer's address.
    scratch: u64,
    /// Handles by kind, with the process that made them.
    pool: Mutex<HashMap<Kind, Vec<(u64, u64)>>>,
}

const POOL_CAP: usize = 512;

impl Ctx {
    fn share(&self, kind: Kind, owner: u64, value: u64) {
        let mut pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let v = pool.entry(kind).or_default();
        if v.len() < POOL_CAP {
            v.push((owner, value));
        } else {
            v[(value as usize ^ owner as usize) % POOL_CAP] = (owner, value);
        }
    }

    /// Some handle of `kind` another process made.
    fn foreign(&self, kind: Kind, me: u64, pick: u64) -> Option<u64> {
        let pool = self.pool.lock().unwrap_or_else(|e| e.into_inner());
        let v = pool.get(&kind)?;
        (0..4)
            .map(|i| v[(pick as usize).wrapping_add(i * 7919) % v.len()])
            .find(|(owner, _)| *owner != me)
            .map(|(_, value)| value)
    }
}

// ---------------------------------------------------------------------------------------------
// The well-behaved pair.

/// The pair's server: says on `listening` when it listens, serves a round per connection
/// request its client makes (refusing others), and ends when the client is done.
fn pair_server(
    ctx: &Ctx,
    client_done: &AtomicBool,
    listening: std::sync::mpsc::Sender<()>,
) -> Result<u64, String> {
    let p = hello(&ctx.path, SERVER, ctx.pid, "fuzz-pair-server")?;
    ctx.share(Kind::Proc, p.token, p.token);
    let ch = open_channel(&p, &ctx.path)?;
    ctx.share(Kind::Channel, p.token, ch.token);
    let mut e = Enc::op(Op::CreateId);
    e.u64(ch.token).u32(TCP);
    let listener = p.call_u64(&e)?;
    ctx.share(Kind::Id, p.token, listener);
    let mut e = Enc::op(Op::BindAddr);
    e.u64(listener).addr(Some(pair_addr()));
    p.call(&e)?;
    let mut e = Enc::op(Op::Listen);
    e.u64(listener).i32(8);
    p.call(&e)?;
    let _ = listening.send(());
    let mut rounds = 0;
    loop {
        let ev = match next_event(
            &p,
            &ch,
            EV_CONNECT_REQUEST,
            None,
            Duration::from_millis(200),
            true,
        )? {
            Some(ev) => ev,
            None if client_done.load(Ordering::SeqCst) => return Ok(rounds),
            None => continue,
        };
        pair_server_round(ctx, &p, &ch, ev.id, rounds).map_err(|e| format!("server, round {rounds}: {e}"))?;
        rounds += 1;
    }
}

fn pair_server_round(ctx: &Ctx, p: &Proc, ch: &Chan, child: u64, round: u64) -> Result<(), String> {
    ctx.share(Kind::Id, p.token, child);
    let mut e = Enc::op(Op::CreateCq);
    e.u32(64).u64(0);
    let cq = p.call_u64(&e)?;
    ctx.share(Kind::Cq, p.token, cq);
    p.call(&create_qp(child, cq))?;
    for wr in 0..4 {
        post_recv(p, child, wr)?;
    }
    let mut e = Enc::op(Op::Accept);
    e.u64(child).param(&conn_param(b""));
    p.call(&e)?;
    expect_event(p, ch, EV_ESTABLISHED, Some(child), true)?;
    let mut backlog = VecDeque::new();
    for m in 0..PAIR_MESSAGES {
        let wc = poll_for(p, cq, &mut backlog, WC_RECV)?;
        let want = format!("ping {round} {m}");
        if wc.data != want.as_bytes() {
            return Err(format!(
                "received {:?}, not {want:?}",
                String::from_utf8_lossy(&wc.data)
            ));
        }
        post_recv(p, child, 10 + m)?;
        post_send(p, child, 20 + m, format!("pong {round} {m}").as_bytes())?;
    }
    // The client's buffer: WRITE a pattern into it, READ it back.
    let wc = poll_for(p, cq, &mut backlog, WC_RECV)?;
    let text = String::from_utf8_lossy(&wc.data).into_owned();
    let f: Vec<u64> = text
        .strip_prefix("rdma ")
        .map(|t| t.split(' ').filter_map(|w| w.parse().ok()).collect())
        .unwrap_or_default();
    let &[addr, key, len, r] = f.as_slice() else {
        return Err(format!("not an rdma message: {text:?}"));
    };
    if r != round {
        return Err(format!("the client is in round {r}, the server in {round}"));
    }
    let len = len as usize;
    if !(3..=PAIR_BUF).contains(&len) {
        return Err(format!("a buffer of {len} bytes"));
    }
    // The WRITE's source and the READ's landing place: regions of the server's own, two
    // entries each, the READ's in the other order (its first third lands at the end).
    let data = pattern(round, len);
    let source = std::hint::black_box(data.clone());
    let landing = vec![0u8; len];
    let src_key = reg_mr(p, &source, 0)?;
    // LOCAL_WRITE: the NIC writes a READ's bytes into it.
    let land_key = reg_mr(p, &landing, 1)?;
    ctx.share(Kind::Key, p.token, src_key.into());
    ctx.share(Kind::Key, p.token, land_key.into());
    let first = len / 3;
    let (s, l) = (source.as_ptr() as u64, landing.as_ptr() as u64);
    let write = [
        (s, first as u32, src_key),
        (s + first as u64, (len - first) as u32, src_key),
    ];
    p.call(&rdma(Op::RdmaWrite, child, 30, addr, key as u32, &write))?;
    let wc = poll_for(p, cq, &mut backlog, WC_RDMA_WRITE)?;
    if wc.wr_id != 30 {
        return Err(format!("the WRITE's completion is {wc:?}"));
    }
    let read = [
        (l + (len - first) as u64, first as u32, land_key),
        (l, (len - first) as u32, land_key),
    ];
    p.call(&rdma(Op::RdmaRead, child, 31, addr, key as u32, &read))?;
    let wc = poll_for(p, cq, &mut backlog, WC_RDMA_READ)?;
    if wc.wr_id != 31 || wc.byte_len != len as u32 {
        return Err(format!("the READ's completion is {wc:?}, of {len} bytes"));
    }
    // The simulator wrote them from the daemon before queueing the completion.
    let want: Vec<u8> = data[first..].iter().chain(&data[..first]).copied().collect();
    let got = read_back(&landing);
    if got != want {
        return Err(format!(
            "the RDMA READ of what was written: {} of {len} bytes alike",
            got.iter().zip(&want).filter(|(a, b)| a == b).count()
        ));
    }
    for k in [src_key, land_key] {
        let mut e = Enc::op(Op::DeregMr);
        e.u32(k);
        p.call(&e)?;
    }
    drop((source, landing));
    post_send(p, child, 40, b"done")?;
    expect_event(p, ch, EV_DISCONNECTED, Some(child), true)?;
    let mut e = Enc::op(Op::Disconnect);
    e.u64(child);
    p.ask(&e)?;
    simple(p, Op::DestroyQp, child)?;
    simple(p, Op::DestroyId, child)?;
    simple(p, Op::DestroyCq, cq)
}

fn pair_client(ctx: &Ctx, hostile_done: &AtomicBool) -> Result<(u64, Duration), String> {
    let mut buf = vec![0u8; PAIR_BUF];
    let mut rounds = 0;
    let mut slowest = Duration::ZERO;
    while rounds < MIN_PAIR_ROUNDS || !hostile_done.load(Ordering::SeqCst) {
        let started = Instant::now();
        pair_client_round(ctx, rounds, &mut buf).map_err(|e| format!("client, round {rounds}: {e}"))?;
        let took = started.elapsed();
        if took > PAIR_ROUND_WITHIN {
            return Err(format!(
                "client, round {rounds}: took {took:?}, more than {PAIR_ROUND_WITHIN:?}"
            ));
        }
        slowest = slowest.max(took);
        rounds += 1;
    }
    Ok((rounds, slowest))
}

fn pair_client_round(ctx: &Ctx, round: u64, buf: &mut [u8]) -> Result<(), String> {
    let p = hello(&ctx.path, CLIENT, ctx.pid, "fuzz-pair-client")?;
    ctx.share(Kind::Proc, p.token, p.token);
    let ch = open_channel(&p, &ctx.path)?;
    ctx.share(Kind::Channel, p.token, ch.token);
    let mut e = Enc::op(Op::CreateId);
    e.u64(ch.token).u32(TCP);
    let id = p.call_u64(&e)?;
    ctx.share(Kind::Id, p.token, id);
    let mut e = Enc::op(Op::ResolveAddr);
    e.u64(id).addr(None).addr(Some(pair_addr())).u32(2000);
    p.call(&e)?;
    expect_event(&p, &ch, EV_ADDR_RESOLVED, Some(id), false)?;
    let mut e = Enc::op(Op::ResolveRoute);
    e.u64(id).u32(2000);
    p.call(&e)?;
    expect_event(&p, &ch, EV_ROUTE_RESOLVED, Some(id), false)?;
    let mut e = Enc::op(Op::CreateCq);
    e.u32(64).u64(0);
    let cq = p.call_u64(&e)?;
    ctx.share(Kind::Cq, p.token, cq);
    p.call(&create_qp(id, cq))?;
    for wr in 0..4 {
        post_recv(&p, id, wr)?;
    }
    buf.fill(0);
    let addr = buf.as_ptr() as u64;
    let key = reg_mr(&p, buf, ACCESS_ALL)?;
    ctx.share(Kind::Key, p.token, key.into());
    let mut e = Enc::op(Op::Connect);
    e.u64(id).param(&conn_param(PAIR_MAGIC));
    p.call(&e)?;
    let ev = expect_event(&p, &ch, EV_ESTABLISHED, Some(id), false)?;
    ctx.share(Kind::Event, p.token, ev.event_no);
    let mut backlog = VecDeque::new();
    for m in 0..PAIR_MESSAGES {
        post_send(&p, id, 10 + m, format!("ping {round} {m}").as_bytes())?;
        let wc = poll_for(&p, cq, &mut backlog, WC_RECV)?;
        let want = format!("pong {round} {m}");
        if wc.data != want.as_bytes() {
            return Err(format!(
                "received {:?}, not {want:?}",
                String::from_utf8_lossy(&wc.data)
            ));
        }
        post_recv(&p, id, 20 + m)?;
    }
    let msg = format!("rdma {addr} {key} {} {round}", buf.len());
    post_send(&p, id, 30, msg.as_bytes())?;
    let wc = poll_for(&p, cq, &mut backlog, WC_RECV)?;
    if wc.data != b"done" {
        return Err(format!(
            "received {:?}, not \"done\"",
            String::from_utf8_lossy(&wc.data)
        ));
    }
    // The daemon wrote the buffer from outside, as a NIC would.
    if read_back(buf) != pattern(round, buf.len()) {
        return Err("the RDMA WRITE's bytes are not in the buffer".into());
    }
    simple(&p, Op::Disconnect, id)?;
    expect_event(&p, &ch, EV_DISCONNECTED, Some(id), false)?;
    simple(&p, Op::DestroyQp, id)?;
    simple(&p, Op::DestroyId, id)?;
    let mut e = Enc::op(Op::DeregMr);
    e.u32(key);
    p.call(&e)?;
    simple(&p, Op::DestroyCq, cq)?;
    simple(&p, Op::DestroyChannel, ch.token)
}

// ---------------------------------------------------------------------------------------------
// cmtime beside the fuzzer, when rdmacm-utils is installed.

struct Cmtime {
    server: Child,
    client: Child,
}

fn cmtime_start(socket: &Path) -> Option<Cmtime> {
    if !Path::new("/usr/bin/cmtime").exists() {
        println!("protocol fuzz: no cmtime pair beside it: /usr/bin/cmtime is not installed (apt-get install rdmacm-utils)");
        return None;
    }
    let run = |host: &str, wait: bool, args: &[&str]| {
        let mut cmd = Command::new(RUN);
        if wait {
            cmd.args(["--wait-for-listener", "10.0.0.1:7471"]);
        }
        cmd.arg("--socket")
            .arg(socket)
            .args(["--host", host, "--", "cmtime"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start cmsim-run")
    };
    let server = run(SERVER, false, &["-b", SERVER, "-c", "100"]);
    let client = run(CLIENT, true, &["-s", SERVER, "-b", CLIENT, "-c", "100"]);
    Some(Cmtime { server, client })
}

/// Waits for cmtime's client (at most 90 s more), stops the server: what went wrong, if anything.
fn cmtime_finish(mut c: Cmtime) -> Result<(), String> {
    use std::io::Read;
    let deadline = Instant::now() + Duration::from_secs(90);
    let status = loop {
        if let Some(s) = c.client.try_wait().map_err(|e| e.to_string())? {
            break Some(s);
        }
        if Instant::now() > deadline {
            let _ = c.client.kill();
            let _ = c.client.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let _ = c.server.kill();
    let _ = c.server.wait();
    let (mut out, mut err) = (String::new(), String::new());
    if let Some(mut o) = c.client.stdout.take() {
        let _ = o.read_to_string(&mut out);
    }
    if let Some(mut e) = c.client.stderr.take() {
        let _ = e.read_to_string(&mut err);
    }
    match status {
        None => Err("cmtime's client did not finish within 90 s of the fuzz".into()),
        Some(s) if !s.success() => Err(format!("cmtime's client failed ({s}): {out}\n{err}")),
        Some(_)
            if out.contains("error") || !err.is_empty() || !out.lines().any(|l| l.starts_with("connect")) =>
        {
            Err(format!("cmtime's client reported trouble:\n{out}\n{err}"))
        }
        Some(_) => Ok(()),
    }
}

// ---------------------------------------------------------------------------------------------
// The hostile clients.

#[derive(Default, Debug)]
struct Stats {
    clients: [usize; 5],
    requests: usize,
    answered_ok: usize,
    /// RDMA WRITEs and READs served (posted to the simulator).
    rdma_served: usize,
    acks: usize,
    too_big: usize,
    first_messages: usize,
    attaches: usize,
    events: usize,
    bursts: usize,
}

impl Stats {
    fn add(&mut self, o: &Stats) {
        for (a, b) in self.clients.iter_mut().zip(o.clients) {
            *a += b;
        }
        self.requests += o.requests;
        self.answered_ok += o.answered_ok;
        self.rdma_served += o.rdma_served;
        self.acks += o.acks;
        self.too_big += o.too_big;
        self.first_messages += o.first_messages;
        self.attaches += o.attaches;
        self.events += o.events;
        self.bursts += o.bursts;
    }
}

const ROLES: [&str; 5] = [
    "silent",
    "junk first message",
    "attached",
    "connected pair",
    "flood",
];

struct Gen<'a> {
    rng: ChaCha8Rng,
    ctx: &'a Ctx,
}

impl Gen<'_> {
    fn below(&mut self, n: u64) -> u64 {
        if n == 0 {
            0
        } else {
            self.rng.next_u64() % n
        }
    }

    fn chance(&mut self, percent: u64) -> bool {
        self.below(100) < percent
    }

    fn pick<T: Copy>(&mut self, xs: &[T]) -> T {
        xs[self.below(xs.len() as u64) as usize]
    }

    /// `n` bytes: random for the first 4 KiB, a random byte repeated after.
    fn noise(&mut self, n: usize) -> Vec<u8> {
        let mut v = vec![0u8; n.min(4096)];
        self.rng.fill_bytes(&mut v);
        v.resize(n, self.rng.next_u32() as u8);
        v
    }

    /// A length: mostly small, sometimes a GID's, sometimes up to `max`.
    fn len(&mut self, max: usize) -> usize {
        let n = match self.below(100) {
            0..30 => self.below(17) as usize,
            30..55 => 16,
            55..80 => 17 + self.below(1008) as usize,
            80..93 => 1025 + self.below(64 * 1024) as usize,
            _ => 64 * 1024 + self.below(MAX_DATAGRAM as u64) as usize,
        };
        n.min(max)
    }

    /// Length-prefixed bytes; now and then the prefix lies.
    fn blob(&mut self, e: &mut Enc, max: usize) {
        let n = self.len(max);
        let data = self.noise(n);
        if self.chance(4) {
            e.u32(n as u32 + 1 + self.below(1000) as u32);
            e.0.extend_from_slice(&data);
        } else {
            e.bytes(&data);
        }
    }

    /// A hello's host and pid: mostly this process's, now and then another's (refused).
    fn identity(&mut self) -> (&'static str, u32) {
        let host = self.pick(&[SERVER, CLIENT, SERVER, CLIENT, ""]);
        let pid = if self.chance(85) {
            self.ctx.pid
        } else {
            self.other_pid()
        };
        (host, pid)
    }

    /// A pid for a hello that need not attach: this process's half the time.
    fn pid(&mut self) -> u32 {
        if self.chance(50) {
            self.ctx.pid
        } else {
            self.other_pid()
        }
    }

    /// A pid not this process's: none, init, the daemon, one of no process.
    fn other_pid(&mut self) -> u32 {
        let big = 0x4000_0000 + self.below(0x3fff_ffff) as u32;
        let near = self.ctx.pid.wrapping_add(1 + self.below(3) as u32);
        self.pick(&[0, 1, self.ctx.daemon_pid, near, u32::MAX, big])
    }

    /// A port no well-behaved program here binds.
    fn port(&mut self) -> u16 {
        match self.below(4) {
            0 => 0,
            1 => self.below(1024) as u16,
            2 => 18_000 + self.below(14_768) as u16,
            _ => 61_000 + self.below(4536) as u16,
        }
    }

    fn ip(&mut self) -> IpAddr {
        match self.below(12) {
            0 | 1 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, 1)),
            2 | 3 => IpAddr::V4(Ipv4Addr::new(10, 0, 0, 2)),
            4 => IpAddr::V4(Ipv4Addr::UNSPECIFIED),
            5 => IpAddr::V4(Ipv4Addr::LOCALHOST),
            6 => IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1)),
            7 => IpAddr::V4(Ipv4Addr::from(self.rng.next_u32())),
            8 => IpAddr::V6(Ipv6Addr::UNSPECIFIED),
            9 => IpAddr::V6(Ipv4Addr::new(10, 0, 0, 1).to_ipv6_mapped()),
            10 => IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
            _ => {
                let mut o = [0u8; 16];
                self.rng.fill_bytes(&mut o);
                IpAddr::V6(Ipv6Addr::from(o))
            }
        }
    }

    /// An address field: an address, none, or a malformed one.
    fn addr(&mut self, e: &mut Enc) {
        match self.below(100) {
            0..8 => {
                e.addr(None);
            }
            8..12 => {
                let tag = self.pick(&[1u8, 2, 3, 5, 7, 255]);
                e.u8(tag);
                let n = self.below(20) as usize;
                let junk = self.noise(n);
                e.0.extend_from_slice(&junk);
            }
            12..15 => {
                e.u8(4).u8(10);
            }
            _ => {
                let a = SocketAddr::new(self.ip(), self.port());
                e.addr(Some(a));
            }
        }
    }

    /// A destination: now and then the pair's listener, whose server refuses strangers.
    fn dst(&mut self, e: &mut Enc) {
        if self.chance(4) {
            e.addr(Some(pair_addr()));
        } else {
            self.addr(e);
        }
    }

    fn u32_edge(&mut self) -> u32 {
        match self.below(8) {
            0 => 0,
            1 => 1,
            2 => 16,
            3 => 16_384,
            4 => 16_385,
            5 => u32::MAX,
            6 => i32::MAX as u32 + 1,
            _ => self.rng.next_u32(),
        }
    }

    /// A handle of `kind` for a field that names one of the caller's own: the caller's (its
    /// own or made up, then anything goes) or another process's or a destroyed one (then the
    /// request must be refused, and `refuse` is set).
    fn handle(&mut self, c: &Mine, kind: Kind, refuse: &mut bool) -> u64 {
        if let Some((id, _)) = c.focus.as_ref().filter(|_| kind == Kind::Id) {
            if self.chance(60) {
                return *id;
            }
        }
        let r = self.below(100);
        let live = c.live.get(&kind).map_or(&[][..], Vec::as_slice);
        if r < 50 && !live.is_empty() {
            return self.pick(live);
        }
        if r < 72 {
            let pick = self.rng.next_u64();
            if let Some(v) = self.ctx.foreign(kind, c.token, pick) {
                if !c.is_live(kind, v) {
                    *refuse = true;
                }
                return v;
            }
        }
        let dead = c.dead.get(&kind).map_or(&[][..], Vec::as_slice);
        if r < 82 && !dead.is_empty() {
            let v = self.pick(dead);
            if !c.is_live(kind, v) {
                *refuse = true;
            }
            return v;
        }
        let v = match self.below(8) {
            0 => 0,
            1 => 1,
            2 => u64::MAX,
            3 => self.rng.next_u64(),
            4 => self.below(1 << 24),
            5 => (self.below(1 << 20) << 36) | self.below(1 << 36),
            6 => live.first().map_or(2, |v| v.wrapping_add(1)),
            _ => u64::from(self.rng.next_u32()),
        };
        if kind == Kind::Key {
            v & 0xffff_ffff
        } else {
            v
        }
    }

    /// A key for the remote side of an RDMA request: anyone's.
    fn rkey(&mut self, c: &Mine) -> u32 {
        let mut ignored = false;
        if let Some((_, keys)) = c.focus.as_ref().filter(|_| self.chance(60)) {
            return self.pick(keys);
        }
        if self.chance(30) {
            if let Some(v) = self.ctx.foreign(Kind::Key, c.token, self.rng.next_u64()) {
                return v as u32;
            }
        }
        self.handle(c, Kind::Key, &mut ignored) as u32
    }

    /// A region to register: inside the scratch buffer, above 2^63, in the null page, empty,
    /// or running past the end of the address space (refused).
    fn region(&mut self) -> (u64, u64) {
        let s = self.ctx.scratch;
        match self.below(9) {
            0 | 1 => {
                let a = self.below(SCRATCH_LEN);
                (s + a, self.below(SCRATCH_LEN - a + 1))
            }
            2 => (s, SCRATCH_LEN),
            3 => (HIGH + self.below(1 << 40), self.rng.next_u64() >> self.below(64)),
            4 => (u64::MAX - self.below(4096), 4097 + self.below(1 << 20)),
            5 => (self.below(4096), self.below(4096)),
            6 => (self.rng.next_u64(), 0),
            7 => (u64::MAX, 1),
            _ => (s + SCRATCH_LEN, 0),
        }
    }

    /// Where an RDMA WRITE of `len` bytes aims: inside the scratch buffer, above 2^63, in the
    /// null page (short writes only), or past the end of the address space.
    fn write_addr(&mut self, len: u64) -> u64 {
        let s = self.ctx.scratch;
        match self.below(6) {
            0 | 1 => s + self.below(SCRATCH_LEN - len + 1),
            2 => s,
            3 => HIGH + self.below(1 << 40),
            4 => u64::MAX - self.below(len + 1),
            _ if len <= 4096 => self.below(4096),
            _ => HIGH,
        }
    }

    /// An RDMA request's local entries (address, length, lkey): mostly inside one of the
    /// caller's regions (its own key, or anyone's: the address decides), now and then where
    /// a READ may land (see `write_addr`) or, for a WRITE, whose entries are only read,
    /// anywhere.
    fn entries(&mut self, c: &Mine, read: bool) -> Vec<(u64, u32, u32)> {
        let n = match self.below(20) {
            0 => 0,
            1 => 64,
            2..6 => 2 + self.below(4),
            _ => 1,
        };
        let lens: &[u32] = if n == 64 {
            &[0, 1, 8, 64, 2048]
        } else {
            &[0, 1, 8, 64, 4096, 65_536, MAX_MESSAGE, MAX_MESSAGE + 1]
        };
        (0..n)
            .map(|_| {
                let len = self.pick(lens);
                let region = (!c.regions.is_empty() && self.chance(75)).then(|| self.pick(&c.regions));
                match region {
                    Some((key, base, size)) => {
                        let len = u64::from(len).min(size);
                        let at = base + self.below(size - len + 1);
                        let lkey = if self.chance(85) { key } else { self.rkey(c) };
                        (at, len as u32, lkey)
                    }
                    None => {
                        let at = if read {
                            self.write_addr(len.into())
                        } else {
                            self.read_addr()
                        };
                        (at, len, self.rkey(c))
                    }
                }
            })
            .collect()
    }

    fn read_addr(&mut self) -> u64 {
        if self.chance(20) {
            self.rng.next_u64()
        } else {
            self.write_addr(0)
        }
    }

    /// A request for `op` with fields drawn for client `c`, then perhaps cut short, extended,
    /// corrupted or sent under another op number.
    fn request(&mut self, c: &Mine, op: Op) -> Req {
        let mut refuse = false;
        let mut expect = Expect::Any;
        let mut e = Enc::op(op);
        let room = MAX_DATAGRAM - 128;
        match op {
            Op::Hello => {
                e.u32(self.pid());
                self.blob(&mut e, 64);
                self.blob(&mut e, 64);
                expect = Expect::Eproto;
            }
            Op::AttachChannel | Op::AttachCompChannel => {
                e.u64(c.token);
                let k = if op == Op::AttachChannel {
                    Kind::Channel
                } else {
                    Kind::CompChannel
                };
                let mut ignored = false;
                e.u64(self.handle(c, k, &mut ignored));
                expect = Expect::Eproto;
            }
            Op::ProbeListener => {
                self.addr(&mut e);
                expect = Expect::Eproto;
            }
            Op::FabricHosts => expect = Expect::Eproto,
            Op::CreateChannel | Op::CreateCompChannel => {}
            Op::DestroyChannel => {
                e.u64(self.handle(c, Kind::Channel, &mut refuse));
            }
            Op::DestroyCompChannel => {
                e.u64(self.handle(c, Kind::CompChannel, &mut refuse));
            }
            Op::CreateId => {
                e.u64(self.handle(c, Kind::Channel, &mut refuse));
                let wild = self.rng.next_u32();
                let ps = self.pick(&[TCP, TCP, 0x0111, 0x0002, 0x013f, 0, wild]);
                e.u32(ps);
            }
            Op::DestroyId | Op::DestroyQp | Op::Disconnect | Op::QueryAddrs => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
            }
            Op::BindAddr => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                self.addr(&mut e);
            }
            Op::ResolveAddr => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                self.addr(&mut e);
                self.dst(&mut e);
                let wild = self.rng.next_u32();
                let ms = self.pick(&[0, 1, 100, 2000, u32::MAX, wild]);
                e.u32(ms);
            }
            Op::ResolveRoute => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                let ms = self.pick(&[0, 1, 2000, u32::MAX]);
                e.u32(ms);
            }
            Op::CreateQp => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                for _ in 0..5 {
                    let v = if self.chance(50) {
                        self.pick(&[1, 4, 16])
                    } else {
                        self.u32_edge()
                    };
                    e.u32(v);
                }
                for _ in 0..2 {
                    let cq = if self.chance(15) {
                        0
                    } else {
                        self.handle(c, Kind::Cq, &mut refuse)
                    };
                    e.u64(cq);
                }
                e.u8(self.rng.next_u32() as u8);
                let wild = self.rng.next_u32();
                let t = self.pick(&[2, 2, 4, 3, wild]);
                e.u32(t);
                let srq = if self.chance(70) {
                    0
                } else {
                    self.handle(c, Kind::Srq, &mut refuse)
                };
                e.u64(srq);
            }
            Op::Listen => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                let b = self.pick(&[-1, 0, 1, 8, i32::MAX, i32::MIN]);
                e.i32(b);
            }
            Op::Connect | Op::Accept => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                let pd = self.len(room);
                let pd = self.noise(pd.min(4096));
                let mut b = [0u8; 6];
                self.rng.fill_bytes(&mut b);
                let qp_num = self.rng.next_u32();
                raw_param(&mut e, &pd, b, qp_num);
            }
            Op::Reject => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                self.blob(&mut e, room);
            }
            Op::AckEvent => {
                e.u64(self.handle(c, Kind::Event, &mut refuse));
            }
            Op::CreateCq => {
                e.u32(self.u32_edge());
                let ch = if self.chance(60) {
                    0
                } else {
                    self.handle(c, Kind::CompChannel, &mut refuse)
                };
                e.u64(ch);
            }
            Op::DestroyCq | Op::ReqNotifyCq => {
                e.u64(self.handle(c, Kind::Cq, &mut refuse));
            }
            Op::PollCq => {
                e.u64(self.handle(c, Kind::Cq, &mut refuse));
                let wild = self.rng.next_u32();
                let max = self.pick(&[0, 1, 16, u32::MAX, wild]);
                e.u32(max);
            }
            Op::PostSend => {
                let kind = if self.chance(30) { Kind::Qp } else { Kind::Id };
                e.u64(self.handle(c, kind, &mut refuse));
                e.u64(self.rng.next_u64()).u8(self.rng.next_u32() as u8);
                let n = if self.chance(10) {
                    MAX_MESSAGE as usize + self.below(2) as usize
                } else {
                    self.len(room)
                };
                let data = self.noise(n);
                e.bytes(&data);
            }
            Op::PostRecv => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                e.u64(self.rng.next_u64());
                let len = self.pick(&[0, 1, 4096, MAX_MESSAGE, MAX_MESSAGE + 1, u32::MAX]);
                e.u32(len);
            }
            Op::RegMr => {
                let (addr, len) = self.region();
                let wild = self.rng.next_u32();
                let access = self.pick(&[0, 1, 2, 4, 5, 6, 7, 7, 8, 9, 15, u32::MAX, wild]);
                e.u64(addr).u64(len).u32(access);
                // verbs' refusals: past the end of the address space; remote write or atomic
                // without local write (bits past the four are ignored).
                let remote_writes = access & 0b1010 != 0;
                if addr.checked_add(len).is_none() || (remote_writes && access & 1 == 0) {
                    expect = Expect::Errno(libc::EINVAL);
                }
            }
            Op::DeregMr => {
                e.u32(self.handle(c, Kind::Key, &mut refuse) as u32);
            }
            Op::RdmaWrite | Op::RdmaRead | Op::RdmaWriteImm => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                e.u64(self.rng.next_u64()).u8(self.rng.next_u32() as u8);
                let entries = self.entries(c, op == Op::RdmaRead);
                let total: u64 = entries.iter().map(|&(_, len, _)| u64::from(len)).sum();
                // Where a WRITE lands must be the scratch buffer's (or nobody's memory); a
                // READ's remote side is only read.
                let remote = if c.focus.is_some() && self.chance(60) {
                    let len = total.min(SCRATCH_LEN);
                    self.ctx.scratch + self.below(SCRATCH_LEN - len + 1)
                } else if op != Op::RdmaRead {
                    self.write_addr(total.min(SCRATCH_LEN))
                } else {
                    self.read_addr()
                };
                let key = self.rkey(c);
                e.u64(remote).u32(key);
                if op == Op::RdmaWriteImm {
                    e.u32(self.rng.next_u32());
                }
                let n = match self.below(30) {
                    // More entries than any QP takes, with as many as the datagram holds.
                    0 => 65 + self.below(200) as u32,
                    1 => {
                        let wild = self.rng.next_u32() | 65;
                        self.pick(&[u32::MAX, 1 << 31, wild])
                    }
                    // Fewer entries than the count says: malformed.
                    2 => entries.len() as u32 + 1,
                    _ => entries.len() as u32,
                };
                e.u32(n);
                for &(addr, len, lkey) in &entries {
                    e.u64(addr).u32(len).u32(lkey);
                }
                if n > 64 || (n as usize == entries.len() && total > u64::from(MAX_MESSAGE)) {
                    expect = Expect::Errno(libc::EINVAL);
                } else if !entries.iter().all(|&(addr, len, _)| c.holds(addr, len)) {
                    // An entry outside every region of the caller's.
                    refuse = true;
                }
                if n > 64 {
                    // The count is refused before the entries are read (which name nobody's
                    // memory, should they be taken).
                    for _ in entries.len()..n.min(300) as usize {
                        e.u64(HIGH + self.below(1 << 40)).u32(self.rng.next_u32()).u32(0);
                    }
                }
            }
            Op::Atomic => {
                e.u8(self.rng.next_u32() as u8);
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                e.u64(self.rng.next_u64()).u8(self.rng.next_u32() as u8);
                // Both ends are written: the target at the peer (the scratch buffer's or
                // nobody's memory), and the old value into the local entry.
                let remote = if c.focus.is_some() && self.chance(60) {
                    self.ctx.scratch + self.below(SCRATCH_LEN - 8 + 1)
                } else {
                    self.write_addr(8)
                };
                let key = self.rkey(c);
                e.u64(remote)
                    .u32(key)
                    .u64(self.rng.next_u64())
                    .u64(self.rng.next_u64());
                let entry = self
                    .entries(c, true)
                    .first()
                    .copied()
                    .unwrap_or_else(|| (self.write_addr(8), 8, 0));
                e.u64(entry.0).u32(entry.1).u32(entry.2);
                if !c.holds(entry.0, entry.1) {
                    refuse = true;
                }
            }
            Op::PostSendImm => {
                let kind = if self.chance(30) { Kind::Qp } else { Kind::Id };
                e.u64(self.handle(c, kind, &mut refuse));
                e.u64(self.rng.next_u64())
                    .u8(self.rng.next_u32() as u8)
                    .u32(self.rng.next_u32());
                let entries = self.entries(c, false);
                let total: u64 = entries.iter().map(|&(_, len, _)| u64::from(len)).sum();
                let n = match self.below(30) {
                    0 => 65 + self.below(200) as u32,
                    // Fewer entries than the count says: malformed.
                    1 => entries.len() as u32 + 1,
                    _ => entries.len() as u32,
                };
                e.u32(n);
                for &(addr, len, lkey) in &entries {
                    e.u64(addr).u32(len).u32(lkey);
                }
                if n > 64 || (n as usize == entries.len() && total > u64::from(MAX_MESSAGE)) {
                    expect = Expect::Errno(libc::EINVAL);
                } else if !entries.iter().all(|&(addr, len, _)| c.holds(addr, len)) {
                    refuse = true;
                }
            }
            Op::PostSendUd => {
                let kind = if self.chance(30) { Kind::Qp } else { Kind::Id };
                e.u64(self.handle(c, kind, &mut refuse));
                e.u64(self.rng.next_u64()).u8(self.rng.next_u32() as u8);
                let mut ignored = false;
                let qpn = match self.below(5) {
                    0 => cm_dropin::proto::MCAST_QPN,
                    1 => self.handle(c, Kind::Id, &mut ignored) as u32,
                    4 => self.handle(c, Kind::Qp, &mut ignored) as u32,
                    2 => self.below(1 << 24) as u32,
                    _ => self.rng.next_u32(),
                };
                let qkey = if self.chance(50) {
                    0x0123_4567
                } else {
                    self.rng.next_u32()
                };
                let group = std::net::IpAddr::from((0xE000_0000 | self.below(1 << 28) as u32).to_be_bytes());
                let mut ah = cm_core::AhAttr::for_ip(if self.chance(50) { group } else { self.ip() });
                if self.chance(25) {
                    ah.sgid_index = self.rng.next_u32() as u8;
                    ah.is_global = self.chance(50);
                }
                let dest = cm_core::UdParam {
                    qp_num: qpn,
                    qkey,
                    ah_attr: ah,
                };
                e.ud_param(&dest)
                    .u8(self.rng.next_u32() as u8)
                    .u32(self.rng.next_u32());
                self.blob(&mut e, room);
            }
            Op::VerbsCreateQp => {
                for _ in 0..5 {
                    let v = if self.chance(50) {
                        self.pick(&[1, 4, 16])
                    } else {
                        self.u32_edge()
                    };
                    e.u32(v);
                }
                for _ in 0..2 {
                    let cq = if self.chance(10) {
                        0
                    } else {
                        self.handle(c, Kind::Cq, &mut refuse)
                    };
                    e.u64(cq);
                }
                e.u8(self.rng.next_u32() as u8);
                let wild = self.rng.next_u32();
                let t = self.pick(&[2, 2, 2, 4, 3, wild]);
                e.u32(t);
                let srq = if self.chance(60) {
                    0
                } else {
                    self.handle(c, Kind::Srq, &mut refuse)
                };
                e.u64(srq);
            }
            Op::CreateSrq => {
                for _ in 0..3 {
                    let v = if self.chance(50) {
                        self.pick(&[0, 1, 8, 500])
                    } else {
                        self.u32_edge()
                    };
                    e.u32(v);
                }
            }
            Op::ModifySrq => {
                e.u64(self.handle(c, Kind::Srq, &mut refuse));
                let wild = self.rng.next_u32();
                let mask = self.pick(&[0, 1, 2, 3, wild]);
                e.u32(mask);
                e.u32(self.u32_edge()).u32(self.u32_edge());
            }
            Op::QuerySrq | Op::DestroySrq => {
                e.u64(self.handle(c, Kind::Srq, &mut refuse));
            }
            Op::PostSrqRecv => {
                e.u64(self.handle(c, Kind::Srq, &mut refuse));
                e.u64(self.rng.next_u64());
                let len = self.pick(&[0, 1, 4096, MAX_MESSAGE, MAX_MESSAGE + 1, u32::MAX]);
                e.u32(len);
            }
            Op::ModifyQp => {
                e.u64(self.handle(c, Kind::Qp, &mut refuse));
                let wild = self.rng.next_u32();
                let mask = self.pick(&[1, 0x39, 0x1f_ffff, 0x12_1381, 0x3_2e01, wild]);
                e.u32(mask);
                for _ in 0..2 {
                    let wild = self.rng.next_u32();
                    let s = self.pick(&[0, 1, 2, 3, 4, 5, 6, 7, wild]);
                    e.u32(s);
                }
                e.u8(self.rng.next_u32() as u8);
                for _ in 0..6 {
                    e.u32(self.u32_edge());
                }
                let mut ignored = false;
                let qpn = self.handle(c, Kind::Qp, &mut ignored);
                e.u32(qpn as u32);
                for _ in 0..2 {
                    let mut ah = cm_core::AhAttr::for_ip(self.ip());
                    if self.chance(30) {
                        ah.sgid_index = self.rng.next_u32() as u8;
                        ah.is_global = self.chance(50);
                        ah.port_num = self.rng.next_u32() as u8;
                    }
                    e.ah_attr(&ah);
                }
                e.u16(self.rng.next_u32() as u16).u16(self.rng.next_u32() as u16);
                for _ in 0..11 {
                    let v = self.pick(&[0, 1, 7, 14, 31, 32, 128, 255]);
                    e.u8(v as u8);
                }
                e.u32(self.u32_edge());
            }
            Op::QueryQp | Op::VerbsDestroyQp => {
                e.u64(self.handle(c, Kind::Qp, &mut refuse));
            }
            Op::QpPostRecv => {
                e.u64(self.handle(c, Kind::Qp, &mut refuse));
                e.u64(self.rng.next_u64());
                let len = self.pick(&[0, 1, 4096, MAX_MESSAGE, MAX_MESSAGE + 1, u32::MAX]);
                e.u32(len);
            }
            Op::InitQpAttr => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                let wild = self.rng.next_u32();
                let s = self.pick(&[1, 2, 3, 0, 4, 6, 7, wild]);
                e.u32(s);
            }
            Op::Establish => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
            }
            Op::MigrateId => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                e.u64(self.handle(c, Kind::Channel, &mut refuse));
            }
            Op::JoinMcast | Op::LeaveMcast => {
                e.u64(self.handle(c, Kind::Id, &mut refuse));
                if self.chance(50) {
                    let group =
                        std::net::IpAddr::from((0xE000_0000 | self.below(1 << 28) as u32).to_be_bytes());
                    e.addr(Some(SocketAddr::new(group, 0)));
                } else {
                    self.addr(&mut e);
                }
            }
        }
        let mut req = Req {
            msg: e.0,
            op,
            intact: true,
            truncated: false,
            refuse,
            expect,
        };
        self.mutate(&mut req);
        req
    }

    fn mutate(&mut self, req: &mut Req) {
        let memory = names_memory(req.op);
        match self.below(100) {
            0..10 => {
                let cut = self.below(req.msg.len() as u64) as usize;
                req.msg.truncate(cut);
                req.truncated = true;
                // Cut before its op ends, any request is malformed.
                if cut < 4 {
                    req.expect = Expect::Eproto;
                }
            }
            10..18 => {
                let n = 1 + self.below(64) as usize;
                let junk = self.noise(n);
                req.msg.extend_from_slice(&junk);
            }
            // A request that names memory is never corrupted: its region or target stays one
            // of those drawn above.
            18..25 if !memory && req.msg.len() > 4 => {
                for _ in 0..1 + self.below(4) {
                    let i = 4 + self.below(req.msg.len() as u64 - 4) as usize;
                    req.msg[i] = self.rng.next_u32() as u8;
                }
                req.intact = false;
            }
            25..30 if !memory => {
                let v = self.other_op();
                req.msg[..4].copy_from_slice(&v.to_le_bytes());
                req.intact = false;
                req.expect = match Op::from_u32(v) {
                    None
                    | Some(
                        Op::Hello
                        | Op::AttachChannel
                        | Op::ProbeListener
                        | Op::AttachCompChannel
                        | Op::FabricHosts,
                    ) => Expect::Eproto,
                    Some(_) => Expect::Any,
                };
            }
            _ => {}
        }
    }

    /// An op number for a body that is not its own: unknown, or any op but those that name
    /// memory.
    fn other_op(&mut self) -> u32 {
        loop {
            let v = match self.below(4) {
                0 => self.pick(&[0, 36, 37, 255, 0x100, u32::MAX]),
                _ => 1 + self.below(35) as u32,
            };
            if !Op::from_u32(v).is_some_and(names_memory) {
                return v;
            }
        }
    }

    /// `n` bytes that are not a request naming memory.
    fn junk(&mut self, n: usize) -> Vec<u8> {
        let mut v = self.noise(n);
        if v.len() >= 4 {
            let op = u32::from_le_bytes(v[..4].try_into().expect("4 bytes"));
            if Op::from_u32(op).is_some_and(names_memory) {
                v[..4].copy_from_slice(&0u32.to_le_bytes());
            }
        }
        v
    }
}

/// Whether a request of `op` names memory of this process the daemon will write: a region to
/// register, or RDMA (a WRITE's target, a READ's entries, both ends of an atomic). Such a request is only ever sent as
/// drawn (perhaps cut short or extended), never made of random bytes.
fn names_memory(op: Op) -> bool {
    matches!(
        op,
        Op::RegMr | Op::RdmaWrite | Op::RdmaRead | Op::RdmaWriteImm | Op::Atomic
    )
}

/// Whether the daemon answers a datagram: all but acks (whose op is all it needs to see)
/// are.
fn answered(msg: &[u8]) -> bool {
    msg.get(..4) != Some(&(Op::AckEvent as u32).to_le_bytes()[..])
}

#[derive(Clone, Copy, Debug, PartialEq)]
enum Expect {
    Any,
    Eproto,
    Errno(i32),
}

struct Req {
    msg: Vec<u8>,
    op: Op,
    /// Sent as drawn, but perhaps cut short or extended: the checks of its fields hold.
    intact: bool,
    truncated: bool,
    /// A field that must name the sender's own names another's or a destroyed one.
    refuse: bool,
    expect: Expect,
}

/// What a hostile process knows it holds, and what it destroyed.
struct Mine {
    token: u64,
    live: HashMap<Kind, Vec<u64>>,
    dead: HashMap<Kind, Vec<u64>>,
    /// A connected pair's: its connected id and the pair's regions' keys, which its
    /// requests name more often than others.
    focus: Option<(u64, Vec<u32>)>,
    /// Its registered regions: key, address, length.
    regions: Vec<(u32, u64, u64)>,
}

impl Mine {
    fn new(token: u64) -> Mine {
        Mine {
            token,
            live: HashMap::new(),
            dead: HashMap::new(),
            focus: None,
            regions: Vec::new(),
        }
    }

    fn is_live(&self, kind: Kind, v: u64) -> bool {
        self.live.get(&kind).is_some_and(|l| l.contains(&v))
    }

    /// Whether `len` bytes at `addr` lie in one of its regions.
    fn holds(&self, addr: u64, len: u32) -> bool {
        self.regions.iter().any(|&(_, base, size)| {
            addr >= base && addr.checked_add(len.into()).is_some_and(|end| end <= base + size)
        })
    }

    fn add(&mut self, ctx: &Ctx, kind: Kind, v: u64) {
        if !self.is_live(kind, v) {
            self.live.entry(kind).or_default().push(v);
            ctx.share(kind, self.token, v);
        }
    }

    fn gone(&mut self, kind: Kind, v: u64) {
        if let Some(l) = self.live.get_mut(&kind) {
            l.retain(|x| *x != v);
        }
        if kind == Kind::Key {
            self.regions.retain(|&(k, _, _)| u64::from(k) != v);
        }
        self.dead.entry(kind).or_default().push(v);
    }
}

/// A hostile process: its control connection, its handles, its channel sockets.
struct Client {
    p: Proc,
    m: Mine,
    /// Channels (of both kinds) whose socket has been attached.
    attached: HashSet<u64>,
    socks: Vec<SeqConn>,
}

impl Client {
    fn new(ctx: &Ctx, p: Proc) -> Client {
        ctx.share(Kind::Proc, p.token, p.token);
        Client {
            m: Mine::new(p.token),
            p,
            attached: HashSet::new(),
            socks: Vec::new(),
        }
    }

    fn add(&mut self, ctx: &Ctx, kind: Kind, v: u64) {
        self.m.add(ctx, kind, v);
    }

    /// A region it registered.
    fn region(&mut self, ctx: &Ctx, key: u32, addr: u64, len: u64) {
        self.add(ctx, Kind::Key, key.into());
        self.m.regions.push((key, addr, len));
    }
}

/// Sends `req` on `c`'s control connection and checks the answer; learns what it made or
/// destroyed.
fn send_request(ctx: &Ctx, c: &mut Client, req: &Req, st: &mut Stats) -> Result<(), String> {
    st.requests += 1;
    let what = describe(&req.msg);
    match send_within(&c.p.ctrl, &req.msg, REPLY_WITHIN)? {
        Sent::Yes => {}
        Sent::TooBig => {
            st.too_big += 1;
            return Ok(());
        }
        Sent::Gone => {
            return Err(format!(
                "the daemon closed an attached client's connection (before {what})"
            ))
        }
    }
    if !answered(&req.msg) {
        return after_ack(ctx, c, req, st);
    }
    let reply = match recv_within(&c.p.ctrl, REPLY_WITHIN)? {
        Got::Msg(b) => b,
        Got::Closed => {
            return Err(format!(
                "the daemon closed the connection instead of answering {what}"
            ))
        }
        Got::Nothing => {
            return Err(format!(
                "no answer within {REPLY_WITHIN:?} to {what}: the daemon hangs"
            ))
        }
    };
    let mut d = Dec::new(&reply);
    let status = d
        .i32()
        .map_err(|_| format!("{what}: a reply of {} bytes", reply.len()))?;
    if !(0..4096).contains(&status) {
        return Err(format!("{what}: status {status}, not an errno"));
    }
    if status == 0 {
        st.answered_ok += 1;
    }
    if req.truncated && status == 0 {
        return Err(format!("{what}: cut short, and still served"));
    }
    if req.intact && req.refuse && status == 0 {
        return Err(format!(
            "{what}: names another process's handle, or a destroyed one, and was served"
        ));
    }
    match req.expect {
        Expect::Eproto if status != libc::EPROTO => {
            return Err(format!("{what}: status {status}, not EPROTO"))
        }
        Expect::Errno(want) if req.intact && !req.truncated && status != want => {
            return Err(format!("{what}: status {status}, not {want}"))
        }
        _ => {}
    }
    if status != 0 {
        return Ok(());
    }
    // Served: the reply decodes as that of the op sent (drawn or not), and what it made or
    // ended is known (a corrupted request may have named any handle).
    let Some(sent) = Dec::new(&req.msg).u32().ok().and_then(Op::from_u32) else {
        return Ok(());
    };
    // The handle a destroy named (a key is a u32: the low half of a u64 read there).
    let named = || {
        let mut b = [0u8; 8];
        let body = &req.msg[4..];
        let n = body.len().min(8);
        b[..n].copy_from_slice(&body[..n]);
        u64::from_le_bytes(b)
    };
    let bad = |_| format!("{what}: a reply that does not decode: {reply:?}");
    match sent {
        Op::CreateChannel => c.add(ctx, Kind::Channel, d.u64().map_err(bad)?),
        Op::CreateCompChannel => c.add(ctx, Kind::CompChannel, d.u64().map_err(bad)?),
        Op::CreateId => c.add(ctx, Kind::Id, d.u64().map_err(bad)?),
        Op::CreateCq => c.add(ctx, Kind::Cq, d.u64().map_err(bad)?),
        Op::RegMr => {
            let key = d.u32().map_err(bad)?;
            let mut body = Dec::new(&req.msg[4..]);
            let (addr, len) = body
                .u64()
                .and_then(|a| Ok((a, body.u64()?)))
                .map_err(|_| format!("{what}: served, though it names no region"))?;
            c.region(ctx, key, addr, len);
        }
        Op::CreateQp => {
            for _ in 0..6 {
                d.u32().map_err(bad)?;
            }
        }
        Op::VerbsCreateQp => {
            for _ in 0..5 {
                d.u32().map_err(bad)?;
            }
            c.add(ctx, Kind::Qp, d.u32().map_err(bad)?.into());
        }
        Op::QueryQp | Op::InitQpAttr => {
            d.u32().map_err(bad)?;
            d.verbs_attr().map_err(bad)?;
        }
        Op::VerbsDestroyQp => c.m.gone(Kind::Qp, named()),
        Op::CreateSrq => {
            c.add(ctx, Kind::Srq, d.u64().map_err(bad)?);
            d.u32().map_err(bad)?;
            d.u32().map_err(bad)?;
        }
        Op::QuerySrq => {
            for _ in 0..3 {
                d.u32().map_err(bad)?;
            }
        }
        Op::DestroySrq => c.m.gone(Kind::Srq, named()),
        Op::PollCq => {
            for _ in 0..d.u32().map_err(bad)? {
                d.wc().map_err(bad)?;
            }
        }
        Op::QueryAddrs => {
            d.addr().map_err(bad)?;
            d.addr().map_err(bad)?;
        }
        Op::RdmaWrite | Op::RdmaRead | Op::RdmaWriteImm | Op::Atomic => st.rdma_served += 1,
        Op::DestroyChannel => c.m.gone(Kind::Channel, named()),
        Op::DestroyCompChannel => c.m.gone(Kind::CompChannel, named()),
        Op::DestroyId => c.m.gone(Kind::Id, named()),
        Op::DestroyCq => c.m.gone(Kind::Cq, named()),
        Op::DeregMr => c.m.gone(Kind::Key, named() & 0xffff_ffff),
        _ => {}
    }
    Ok(())
}

/// After an ack, which is not answered: a request whose answer must be the next datagram (a
/// new completion channel's token, 12 bytes, where an answer to the ack would be a status
/// alone), so that the daemon has taken the ack, and not answered it, before the client goes
/// on.
fn after_ack(ctx: &Ctx, c: &mut Client, req: &Req, st: &mut Stats) -> Result<(), String> {
    st.acks += 1;
    let what = describe(&req.msg);
    let reply = exchange(&c.p.ctrl, &Enc::op(Op::CreateCompChannel).0, REPLY_WITHIN)
        .map_err(|m| format!("the request after the ack {what}: {m}"))?;
    let mut d = Dec::new(&reply);
    match (d.i32(), d.u64()) {
        (Ok(0), Ok(t)) if reply.len() == 12 => c.add(ctx, Kind::CompChannel, t),
        _ => {
            return Err(format!(
                "the ack {what} was answered, or the request after it answered {reply:?}"
            ))
        }
    }
    // Taken or refused, an ack as drawn names an event not to ack again.
    if req.intact && !req.truncated {
        if let Some(n) = req.msg.get(4..12) {
            c.m.gone(Kind::Event, u64::from_le_bytes(n.try_into().expect("8 bytes")));
        }
    }
    Ok(())
}

/// A hostile hello: the attached client, or `None` when the daemon refused it, as it must
/// refuse a hello without this protocol's version (`EPROTONOSUPPORT`) or naming a pid not
/// the sender's (`EPERM`), and then closed the connection.
fn hostile_hello(g: &mut Gen, host: &str, pid: u32) -> Result<Option<Client>, String> {
    let conn = SeqConn::connect(&g.ctx.path).map_err(|e| format!("connect: {e}"))?;
    let mut e = Enc::op(Op::Hello);
    e.u32(pid).bytes(host.as_bytes());
    if g.chance(20) {
        let n = g.below(300) as usize;
        let argv0 = g.noise(n);
        e.bytes(&argv0);
    } else {
        e.bytes(b"fuzz-hostile");
    }
    let version = match g.below(40) {
        0 => None,
        1 => Some(g.pick(&[0, 1, 2, 3, PROTOCOL_VERSION + 1, u32::MAX])),
        _ => Some(PROTOCOL_VERSION),
    };
    if let Some(v) = version {
        e.u32(v);
        // Bytes after the version are not read.
        if g.chance(10) {
            let n = 1 + g.below(32) as usize;
            let junk = g.noise(n);
            e.0.extend_from_slice(&junk);
        }
    }
    let want = if version != Some(PROTOCOL_VERSION) {
        libc::EPROTONOSUPPORT
    } else if pid != g.ctx.pid {
        libc::EPERM
    } else {
        0
    };
    let what = format!("a hello as {host:?}, pid {pid}, version {version:?}");
    let reply = exchange(&conn, &e.0, REPLY_WITHIN).map_err(|m| format!("{what}: {m}"))?;
    let mut d = Dec::new(&reply);
    match d.i32() {
        Ok(s) if s == want && s != 0 => {
            // Refused: answered once, then closed.
            return match recv_within(&conn, REPLY_WITHIN)? {
                Got::Closed => Ok(None),
                Got::Nothing => Err(format!("{what}: refused, then the connection kept open")),
                Got::Msg(b) => Err(format!("{what}: refused, then answered again: {b:?}")),
            };
        }
        Ok(0) if want == 0 => {}
        other => return Err(format!("{what}: status {other:?}, not {want}")),
    }
    let token = d.u64().map_err(|_| "hello's answer has no token".to_string())?;
    Ok(Some(Client::new(g.ctx, Proc { ctrl: conn, token })))
}

/// Ops an attached client draws, weighted; the handle-making ones come more often.
const ALL_OPS: [(Op, u64); 52] = [
    (Op::Hello, 1),
    (Op::CreateChannel, 4),
    (Op::DestroyChannel, 1),
    (Op::AttachChannel, 1),
    (Op::CreateId, 5),
    (Op::DestroyId, 2),
    (Op::BindAddr, 3),
    (Op::ResolveAddr, 3),
    (Op::ResolveRoute, 2),
    (Op::CreateQp, 3),
    (Op::DestroyQp, 2),
    (Op::Listen, 2),
    (Op::Connect, 2),
    (Op::Accept, 2),
    (Op::Reject, 1),
    (Op::Disconnect, 2),
    (Op::AckEvent, 3),
    (Op::QueryAddrs, 1),
    (Op::CreateCq, 4),
    (Op::DestroyCq, 2),
    (Op::PollCq, 3),
    (Op::PostSend, 3),
    (Op::PostRecv, 3),
    (Op::ProbeListener, 1),
    (Op::CreateCompChannel, 2),
    (Op::DestroyCompChannel, 1),
    (Op::AttachCompChannel, 1),
    (Op::ReqNotifyCq, 2),
    (Op::RegMr, 4),
    (Op::DeregMr, 2),
    (Op::RdmaWrite, 3),
    (Op::RdmaRead, 3),
    (Op::PostSendUd, 2),
    (Op::JoinMcast, 2),
    (Op::LeaveMcast, 2),
    (Op::FabricHosts, 1),
    (Op::VerbsCreateQp, 3),
    (Op::ModifyQp, 3),
    (Op::QueryQp, 1),
    (Op::VerbsDestroyQp, 1),
    (Op::QpPostRecv, 2),
    (Op::InitQpAttr, 2),
    (Op::Establish, 1),
    (Op::PostSendImm, 2),
    (Op::Atomic, 2),
    (Op::RdmaWriteImm, 2),
    (Op::CreateSrq, 2),
    (Op::ModifySrq, 1),
    (Op::QuerySrq, 1),
    (Op::DestroySrq, 1),
    (Op::PostSrqRecv, 2),
    (Op::MigrateId, 1),
];

/// The data path, for connected pairs (which disconnect, or not, at the end).
const DATA_OPS: [(Op, u64); 14] = [
    (Op::PostSend, 5),
    (Op::PostSendImm, 2),
    (Op::Atomic, 3),
    (Op::PostRecv, 5),
    (Op::PollCq, 5),
    (Op::RegMr, 4),
    (Op::DeregMr, 2),
    (Op::RdmaWrite, 6),
    (Op::RdmaRead, 6),
    (Op::RdmaWriteImm, 2),
    (Op::ReqNotifyCq, 2),
    (Op::AckEvent, 2),
    (Op::QueryAddrs, 1),
    (Op::CreateCq, 1),
];

fn draw_op(g: &mut Gen, ops: &[(Op, u64)]) -> Op {
    let total: u64 = ops.iter().map(|(_, w)| w).sum();
    let mut r = g.below(total);
    for &(op, w) in ops {
        if r < w {
            return op;
        }
        r -= w;
    }
    ops[0].0
}

/// One step of an attached client: a request, or something done with its channel sockets.
fn step(g: &mut Gen, c: &mut Client, ops: &[(Op, u64)], st: &mut Stats) -> Result<(), String> {
    let ctx = g.ctx;
    match g.below(100) {
        0..3 => {
            let req = Req {
                msg: Vec::new(),
                op: Op::Hello,
                intact: false,
                truncated: true,
                refuse: false,
                expect: Expect::Eproto,
            };
            send_request(ctx, c, &req, st)
        }
        3..5 => {
            // The largest datagram the daemon reads, or larger (the kernel may refuse it).
            let n = MAX_DATAGRAM
                + if g.chance(50) {
                    0
                } else {
                    1 + g.below(64 * 1024) as usize
                };
            let req = Req {
                msg: g.junk(n),
                op: Op::Hello,
                intact: false,
                truncated: false,
                refuse: false,
                expect: Expect::Any,
            };
            send_request(ctx, c, &req, st)
        }
        5..9 => attach_step(g, c, st),
        9..14 => drain(ctx, c, st),
        14..16 => {
            if let Some(i) = (!c.socks.is_empty()).then(|| g.below(c.socks.len() as u64) as usize) {
                if g.chance(50) {
                    // Nothing reads a channel socket's far end: sent and forgotten.
                    let n = 1 + g.below(64) as usize;
                    let junk = g.junk(n);
                    let _ = c.socks[i].try_send(&junk);
                } else {
                    c.socks.swap_remove(i);
                }
            }
            Ok(())
        }
        _ => {
            let op = draw_op(g, ops);
            let req = g.request(&c.m, op);
            send_request(ctx, c, &req, st)
        }
    }
}

/// Attaches a socket to a channel: its own (attached), another's or a made-up one (refused).
fn attach_step(g: &mut Gen, c: &mut Client, st: &mut Stats) -> Result<(), String> {
    let comp = g.chance(40);
    let (op, kind) = if comp {
        (Op::AttachCompChannel, Kind::CompChannel)
    } else {
        (Op::AttachChannel, Kind::Channel)
    };
    let mut foreign_proc = false;
    let proc = if g.chance(75) {
        c.p.token
    } else {
        let mut ignored = false;
        let v = g.handle(&c.m, Kind::Proc, &mut ignored);
        foreign_proc = v != c.p.token;
        v
    };
    // With another's token, a channel of its own or a made-up one: never another's, so that
    // no client attaches what a third one made (tokens that match are enough for that),
    // and every client knows which of its channels are free.
    let mut ignored = false;
    let mut ch = match c.m.live.get(&kind).filter(|l| foreign_proc && !l.is_empty()) {
        Some(l) if g.chance(70) => g.pick(l),
        _ if foreign_proc => g.rng.next_u64(),
        _ => g.handle(&c.m, kind, &mut ignored),
    };
    if g.chance(10) {
        // A channel of the other kind.
        let other = if comp { Kind::Channel } else { Kind::CompChannel };
        let mut ignored = false;
        ch = g.handle(&c.m, other, &mut ignored);
    }
    let ours_and_free = c.m.is_live(kind, ch) && !c.attached.contains(&ch);
    let got = attach_socket(&g.ctx.path, op, proc, ch)?;
    st.attaches += 1;
    // With its own token, exactly its own free channels are attached; with another's, none
    // of its own is.
    match got {
        Some(_) if foreign_proc && c.m.is_live(kind, ch) => {
            return Err(format!(
                "{op:?} of its own channel {ch:#x} with another process's token was attached"
            ));
        }
        Some(_) if !foreign_proc && !ours_and_free => {
            return Err(format!(
                "{op:?} of {ch:#x}, not a free channel of its own, was attached"
            ));
        }
        None if !foreign_proc && ours_and_free => {
            return Err(format!("{op:?} of its own free channel {ch:#x} was refused"));
        }
        Some(sock) => {
            c.attached.insert(ch);
            c.socks.push(sock);
        }
        None => {}
    }
    Ok(())
}

/// Reads what the channel sockets hold: events (their numbers and new ids are the client's)
/// and completion events.
fn drain(ctx: &Ctx, c: &mut Client, st: &mut Stats) -> Result<(), String> {
    let mut found = Vec::new();
    let mut closed = Vec::new();
    for (i, s) in c.socks.iter().enumerate() {
        for _ in 0..64 {
            match recv_within(s, Duration::ZERO)? {
                Got::Msg(b) if b.first() == Some(&CHAN_COMP) => {
                    if b.len() != 9 {
                        return Err(format!("a malformed completion event {b:?}"));
                    }
                }
                Got::Msg(b) => found.push(decode_event(&b)?),
                Got::Closed => {
                    closed.push(i);
                    break;
                }
                Got::Nothing => break,
            }
        }
    }
    for i in closed.into_iter().rev() {
        c.socks.swap_remove(i);
    }
    for ev in found {
        st.events += 1;
        c.add(ctx, Kind::Event, ev.event_no);
        c.add(ctx, Kind::Id, ev.id);
    }
    Ok(())
}

/// A client that says nothing, for a moment or not at all.
fn silent(g: &mut Gen) -> Result<(), String> {
    let conn = SeqConn::connect(&g.ctx.path).map_err(|e| format!("connect: {e}"))?;
    std::thread::sleep(Duration::from_millis(g.below(100)));
    drop(conn);
    Ok(())
}

/// A client whose first datagram is not what the daemon wants: answered at most once, then
/// closed (or attached, when it happens to be a hello that fits).
fn junk_first(g: &mut Gen, st: &mut Stats) -> Result<(), String> {
    let conn = SeqConn::connect(&g.ctx.path).map_err(|e| format!("connect: {e}"))?;
    let kind = g.below(12);
    let msg = match kind {
        0 => Vec::new(),
        1 => {
            let n = 1 + g.below(64) as usize;
            g.junk(n)
        }
        2 => g.junk(MAX_DATAGRAM),
        3 => {
            let n = MAX_DATAGRAM + 1 + g.below(64 * 1024) as usize;
            g.junk(n)
        }
        4 | 5 => {
            let mut e = Enc::op(Op::Hello);
            e.u32(g.pid());
            if kind == 4 {
                e.bytes(SERVER.as_bytes())
                    .bytes(b"fuzz-cut-short")
                    .u32(PROTOCOL_VERSION);
                let cut = g.below(e.0.len() as u64) as usize;
                e.0.truncate(cut);
            } else {
                g.blob(&mut e, 4096);
                g.blob(&mut e, 4096);
                if g.chance(50) {
                    e.u32(PROTOCOL_VERSION);
                }
            }
            e.0
        }
        6 | 7 => {
            let op = if kind == 6 {
                Op::AttachChannel
            } else {
                Op::AttachCompChannel
            };
            let mut e = Enc::op(op);
            // Another's process token or another's channel, not both (see attach_step).
            let pick = g.rng.next_u64();
            let take_proc = g.chance(50);
            let proc = g
                .ctx
                .foreign(Kind::Proc, 0, pick)
                .filter(|_| take_proc)
                .unwrap_or_else(|| g.rng.next_u64());
            let k = if kind == 6 {
                Kind::Channel
            } else {
                Kind::CompChannel
            };
            let pick = g.rng.next_u64();
            let ch = g
                .ctx
                .foreign(k, 0, pick)
                .filter(|_| !take_proc)
                .unwrap_or_else(|| g.rng.next_u64());
            e.u64(proc).u64(ch);
            if g.chance(20) {
                let cut = g.below(e.0.len() as u64) as usize;
                e.0.truncate(cut);
            }
            e.0
        }
        8 => {
            let mut e = Enc::op(Op::ProbeListener);
            g.addr(&mut e);
            if g.chance(30) {
                let n = g.below(40) as usize;
                let junk = g.noise(n);
                e.0.extend_from_slice(&junk);
            }
            e.0
        }
        9 => Enc::hello(g.pid(), "10.9.9.9", "fuzz-no-such-host").0,
        10 => {
            // A hello, from a client that is gone before it is answered.
            let (host, pid) = g.identity();
            let e = Enc::hello(pid, host, "fuzz-gone");
            let _ = send_within(&conn, &e.0, REPLY_WITHIN)?;
            st.first_messages += 1;
            return Ok(());
        }
        _ => {
            // Any request, as if attached.
            let op = draw_op(g, &ALL_OPS);
            g.request(&Mine::new(0), op).msg
        }
    };
    st.first_messages += 1;
    let what = describe(&msg);
    let first = Dec::new(&msg).u32().ok().and_then(Op::from_u32);
    match send_within(&conn, &msg, REPLY_WITHIN)? {
        Sent::Yes => {}
        Sent::TooBig | Sent::Gone => return Ok(()),
    }
    let reply = match recv_within(&conn, REPLY_WITHIN)? {
        Got::Closed => return Ok(()),
        Got::Nothing => {
            return Err(format!(
                "a first message {what} was neither answered nor closed within {REPLY_WITHIN:?}"
            ))
        }
        Got::Msg(b) => b,
    };
    // Answered: a hello (attached, or refused), a probe's answer, or an attach.
    let status = Dec::new(&reply).i32();
    // A hello as built (a host the fabric lacks) is refused for its pid first, then its host.
    let hello_refusal = (kind == 9).then(|| match Dec::new(&msg[4..]).u32() {
        Ok(pid) if pid == g.ctx.pid => libc::ENODEV,
        _ => libc::EPERM,
    });
    match first {
        Some(Op::Hello) if hello_refusal.is_some_and(|want| status != Ok(want)) => {
            return Err(format!(
                "a first message {what} was answered {status:?}, not {hello_refusal:?}"
            ))
        }
        Some(Op::Hello) if status == Ok(0) => return Ok(()),
        // Refused: cut short or not text (EPROTO), another's pid, another version, no such host.
        Some(Op::Hello)
            if matches!(
                status,
                Ok(libc::EPROTO | libc::ENODEV | libc::EPERM | libc::EPROTONOSUPPORT)
            ) => {}
        Some(Op::ProbeListener) if reply.len() == 5 && status == Ok(0) && reply[4] <= 1 => {}
        Some(Op::FabricHosts) if cm_dropin::request::FabricHosts::decode(&reply).is_ok() => {}
        Some(Op::AttachChannel | Op::AttachCompChannel) if reply == [CHAN_ATTACHED] => {
            return Err(format!(
                "{what}, whose tokens are not one process's, was attached"
            ))
        }
        _ => return Err(format!("a first message {what} was answered {reply:?}")),
    }
    match recv_within(&conn, REPLY_WITHIN)? {
        Got::Closed => Ok(()),
        Got::Nothing => Err(format!(
            "answered a first message {what}, then kept the connection open"
        )),
        Got::Msg(b) => Err(format!("answered a first message {what} twice: {reply:?}, {b:?}")),
    }
}

/// A hello, then random requests; perhaps a burst of them unread before it is gone.
fn attached(g: &mut Gen, st: &mut Stats) -> Result<(), String> {
    let (host, pid) = g.identity();
    let Some(mut c) = hostile_hello(g, host, pid)? else {
        return Ok(());
    };
    let n = 1 + g.below(MESSAGES);
    let burst_at = g.chance(20).then(|| g.below(n));
    for i in 0..n {
        if Some(i) == burst_at {
            return burst(g, &mut c, &ALL_OPS, st);
        }
        step(g, &mut c, &ALL_OPS, st)?;
    }
    Ok(())
}

/// Up to 32 requests sent and never read, then the client is gone. Their replies (polls'
/// included, of any size) wait for a reader that has gone: the daemon's replies never block
/// it, and a reply nobody reads is given up with its process.
fn burst(g: &mut Gen, c: &mut Client, ops: &[(Op, u64)], st: &mut Stats) -> Result<(), String> {
    st.bursts += 1;
    for _ in 0..1 + g.below(32) {
        let op = draw_op(g, ops);
        let req = g.request(&c.m, op);
        st.requests += 1;
        if matches!(send_within(&c.p.ctrl, &req.msg, REPLY_WITHIN)?, Sent::Gone) {
            return Err("the daemon closed an attached client's connection during a burst".into());
        }
    }
    Ok(())
}

/// Two hostile processes connect properly, then fuzz the data path; the connection ends
/// with a disconnect or with the processes gone.
fn connected(g: &mut Gen, st: &mut Stats, port: u16) -> Result<(), String> {
    let ctx = g.ctx;
    let (Some(mut a), Some(mut b)) = (
        hostile_hello(g, SERVER, ctx.pid)?,
        hostile_hello(g, CLIENT, ctx.pid)?,
    ) else {
        return Ok(());
    };
    let a_ch = open_channel(&a.p, &ctx.path)?;
    let b_ch = open_channel(&b.p, &ctx.path)?;
    for (c, ch) in [(&mut a, &a_ch), (&mut b, &b_ch)] {
        c.add(ctx, Kind::Channel, ch.token);
        c.attached.insert(ch.token);
    }
    let addr = SocketAddr::new(SERVER.parse().expect("an address"), port);
    let mut e = Enc::op(Op::CreateId);
    e.u64(a_ch.token).u32(TCP);
    let listener = a.p.call_u64(&e)?;
    a.add(ctx, Kind::Id, listener);
    let mut e = Enc::op(Op::BindAddr);
    e.u64(listener).addr(Some(addr));
    a.p.call(&e)?;
    let mut e = Enc::op(Op::Listen);
    e.u64(listener).i32(4);
    a.p.call(&e)?;
    let mut e = Enc::op(Op::CreateId);
    e.u64(b_ch.token).u32(TCP);
    let bid = b.p.call_u64(&e)?;
    b.add(ctx, Kind::Id, bid);
    let mut e = Enc::op(Op::ResolveAddr);
    e.u64(bid).addr(None).addr(Some(addr)).u32(2000);
    b.p.call(&e)?;
    expect_event(&b.p, &b_ch, EV_ADDR_RESOLVED, Some(bid), false)?;
    let mut e = Enc::op(Op::ResolveRoute);
    e.u64(bid).u32(2000);
    b.p.call(&e)?;
    expect_event(&b.p, &b_ch, EV_ROUTE_RESOLVED, Some(bid), false)?;
    let mut e = Enc::op(Op::CreateCq);
    e.u32(64).u64(0);
    let bcq = b.p.call_u64(&e)?;
    b.add(ctx, Kind::Cq, bcq);
    b.p.call(&create_qp(bid, bcq))?;
    let mut e = Enc::op(Op::Connect);
    e.u64(bid).param(&conn_param(b"fuzz-hostile"));
    b.p.call(&e)?;
    let req = expect_event(&a.p, &a_ch, EV_CONNECT_REQUEST, None, false)?;
    let child = req.id;
    a.add(ctx, Kind::Id, child);
    let mut e = Enc::op(Op::CreateCq);
    e.u32(64).u64(0);
    let acq = a.p.call_u64(&e)?;
    a.add(ctx, Kind::Cq, acq);
    a.p.call(&create_qp(child, acq))?;
    let mut e = Enc::op(Op::Accept);
    e.u64(child).param(&conn_param(b""));
    a.p.call(&e)?;
    expect_event(&b.p, &b_ch, EV_ESTABLISHED, Some(bid), false)?;
    expect_event(&a.p, &a_ch, EV_ESTABLISHED, Some(child), false)?;
    a.socks.push(a_ch.sock);
    b.socks.push(b_ch.sock);
    // Regions both may READ and WRITE: all of the scratch buffer, and a part of it.
    let mut keys = Vec::new();
    for (c, off) in [(&mut a, 0), (&mut b, g.below(SCRATCH_LEN / 2))] {
        let (addr, len) = (ctx.scratch + off, SCRATCH_LEN - off);
        let mut e = Enc::op(Op::RegMr);
        e.u64(addr).u64(len).u32(ACCESS_ALL);
        let key = c.p.call_u32(&e)?;
        c.region(ctx, key, addr, len);
        keys.push(key);
    }
    a.m.focus = Some((child, keys.clone()));
    b.m.focus = Some((bid, keys));
    let n = 1 + g.below(MESSAGES);
    let burst_at = g.chance(15).then(|| g.below(n));
    for i in 0..n {
        let c = if g.chance(50) { &mut a } else { &mut b };
        if Some(i) == burst_at {
            return burst(g, c, &DATA_OPS, st);
        }
        step(g, c, &DATA_OPS, st)?;
    }
    if g.chance(50) {
        for (c, id) in [(&a, child), (&b, bid)] {
            let mut e = Enc::op(Op::Disconnect);
            e.u64(id);
            c.p.ask(&e)?;
        }
    }
    Ok(())
}

/// One request carrying large bytes, repeated with new bytes each time: whatever the daemon
/// keeps of them shows in its RSS.
fn flood(g: &mut Gen, st: &mut Stats) -> Result<(), String> {
    let ctx = g.ctx;
    let host = g.pick(&[SERVER, CLIENT]);
    let Some(mut c) = hostile_hello(g, host, ctx.pid)? else {
        return Ok(());
    };
    let ch = c.p.call_u64(&Enc::op(Op::CreateChannel))?;
    c.add(ctx, Kind::Channel, ch);
    let mut e = Enc::op(Op::CreateId);
    e.u64(ch).u32(TCP);
    let id = c.p.call_u64(&e)?;
    c.add(ctx, Kind::Id, id);
    let op = g.pick(&[
        Op::JoinMcast,
        Op::LeaveMcast,
        Op::PostSend,
        Op::Reject,
        Op::Connect,
        Op::Accept,
        Op::PostSendUd,
    ]);
    let size = 16 * 1024 + g.below(170 * 1024) as usize;
    for _ in 0..50 + g.below(150) {
        let mut e = Enc::op(op);
        e.u64(id);
        let data = g.noise(size);
        match op {
            Op::PostSend => {
                e.u64(1).u8(1).bytes(&data);
            }
            Op::Connect | Op::Accept => {
                raw_param(&mut e, &data, [0; 6], 0);
            }
            Op::PostSendUd => {
                let dest = cm_core::UdParam {
                    qp_num: g.below(1 << 24) as u32,
                    qkey: 0x0123_4567,
                    ah_attr: cm_core::AhAttr::for_ip(g.ip()),
                };
                e.u64(1).u8(1).ud_param(&dest).u8(0).u32(0).bytes(&data);
            }
            _ => {
                e.bytes(&data);
            }
        }
        let req = Req {
            msg: e.0,
            op,
            intact: true,
            truncated: false,
            refuse: false,
            expect: Expect::Any,
        };
        send_request(ctx, &mut c, &req, st)?;
    }
    Ok(())
}

fn worker(ctx: &Ctx, phase: usize, w: usize) -> Result<Stats, String> {
    let mut st = Stats::default();
    for i in 0..CLIENTS {
        // Each client draws from a stream of its own: what it does first, and its role, follow
        // from the seed whatever the clients before it met.
        let mut rng = ChaCha8Rng::seed_from_u64(ctx.seed);
        rng.set_stream(((phase * WORKERS + w) * CLIENTS + i) as u64);
        let mut g = Gen { rng, ctx };
        let role = match g.below(100) {
            0..8 => 0,
            8..26 => 1,
            26..74 => 2,
            74..92 => 3,
            _ => 4,
        };
        let r = match role {
            0 => silent(&mut g),
            1 => junk_first(&mut g, &mut st),
            2 => attached(&mut g, &mut st),
            3 => connected(&mut g, &mut st, (10_000 + phase * 4000 + w * 1000 + i) as u16),
            _ => flood(&mut g, &mut st),
        };
        r.map_err(|e| format!("phase {phase}, worker {w}, client {i} ({}): {e}", ROLES[role]))?;
        st.clients[role] += 1;
    }
    Ok(st)
}

// ---------------------------------------------------------------------------------------------

#[test]
#[ignore = "the protocol fuzz (about 20 s): scripts/test-all runs it in a step of its own, \
            cargo test -p cm-dropin --test protocol_fuzz -- --ignored"]
fn hostile_clients_beside_a_program_pair_neither_crash_nor_stall_nor_leak_the_daemon() {
    let seed = seed();
    println!("protocol fuzz: seed {seed}; rerun with {}", reproduce(seed));
    let started = Instant::now();
    let mut daemon = Daemon::start("main");
    let (fd0, rss0) = (daemon.fds(), daemon.rss_kib());
    let scratch = vec![0u8; SCRATCH_LEN as usize];
    let ctx = Arc::new(Ctx {
        path: daemon.socket.clone(),
        seed,
        pid: std::process::id(),
        daemon_pid: daemon.pid,
        scratch: scratch.as_ptr() as u64,
        pool: Mutex::new(HashMap::new()),
    });
    let hostile_done = Arc::new(AtomicBool::new(false));
    let client_done = Arc::new(AtomicBool::new(false));
    let (listening, listens) = std::sync::mpsc::channel();
    let server = {
        let (ctx, done) = (ctx.clone(), client_done.clone());
        std::thread::spawn(move || pair_server(&ctx, &done, listening))
    };
    if listens.recv_timeout(Duration::from_secs(10)).is_err() {
        panic!("the pair's server does not listen: {:?}", server.join());
    }
    let client = {
        let (ctx, done, hostile) = (ctx.clone(), client_done.clone(), hostile_done.clone());
        std::thread::spawn(move || {
            let r = pair_client(&ctx, &hostile);
            done.store(true, Ordering::SeqCst);
            r
        })
    };
    let cmtime = cmtime_start(&daemon.socket);
    let mut failures = Vec::new();
    let mut stats = Stats::default();
    let mut rss = vec![rss0];
    for phase in 0..PHASES {
        let workers: Vec<_> = (0..WORKERS)
            .map(|w| {
                let ctx = ctx.clone();
                std::thread::spawn(move || worker(&ctx, phase, w))
            })
            .collect();
        for h in workers {
            match h.join() {
                Ok(Ok(s)) => stats.add(&s),
                Ok(Err(e)) => failures.push(e),
                Err(_) => failures.push(format!("phase {phase}: a worker panicked")),
            }
        }
        if let Some(status) = daemon.exited() {
            failures.push(format!("the daemon exited during phase {phase}: {status}"));
            break;
        }
        // Every hostile client of the phase has closed: a moment for the daemon to see it.
        std::thread::sleep(Duration::from_millis(300));
        rss.push(daemon.rss_kib());
    }
    hostile_done.store(true, Ordering::SeqCst);
    let mut pair = String::new();
    match client.join() {
        Ok(Ok((rounds, slowest))) => pair = format!("{rounds} rounds, the slowest {slowest:?}"),
        Ok(Err(e)) => failures.push(format!("the pair's {e}")),
        Err(_) => failures.push("the pair's client panicked".into()),
    }
    match server.join() {
        Ok(Ok(_)) => {}
        Ok(Err(e)) => failures.push(format!("the pair's {e}")),
        Err(_) => failures.push("the pair's server panicked".into()),
    }
    let cmtime_said = match cmtime.map(cmtime_finish) {
        None => "not installed",
        Some(Ok(())) => "100 connections, clean",
        Some(Err(e)) => {
            failures.push(e);
            "failed"
        }
    };
    // A program coming now is served.
    match hello(&daemon.socket, SERVER, ctx.pid, "fuzz-after").and_then(|p| {
        let mut e = Enc::op(Op::RegMr);
        e.u64(HIGH).u64(64).u32(0);
        p.call_u32(&e)
    }) {
        Ok(_) => {}
        Err(e) => failures.push(format!("after the fuzz, a fresh program: {e}")),
    }
    drop(scratch);
    // Everyone has gone: the fds come back (the daemon closes a connection's last moments
    // after its peer's).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut fds = daemon.fds();
    while fds > fd0 + FD_MARGIN && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
        fds = daemon.fds();
    }
    // Within the margin; and every one back, if they come within a second more.
    let exact = Instant::now() + Duration::from_secs(1);
    while fds > fd0 && Instant::now() < exact {
        std::thread::sleep(Duration::from_millis(50));
        fds = daemon.fds();
    }
    if fds > fd0 + FD_MARGIN {
        failures.push(format!("the daemon holds {fds} fds, {fd0} before the fuzz"));
    }
    let rss_end = daemon.rss_kib();
    rss.push(rss_end);
    let phase_growth = rss[PHASES].saturating_sub(rss[PHASES - 1]);
    if phase_growth >= PHASE_RSS_GROWTH_KIB {
        failures.push(format!(
            "the daemon's RSS grew by {phase_growth} KiB over the second phase (bound {PHASE_RSS_GROWTH_KIB} KiB): {rss:?}"
        ));
    }
    if rss_end.saturating_sub(rss0) >= TOTAL_RSS_GROWTH_KIB {
        failures.push(format!(
            "the daemon's RSS grew from {rss0} to {rss_end} KiB (bound {TOTAL_RSS_GROWTH_KIB} KiB more)"
        ));
    }
    let tail = daemon.stderr_tail(30);
    let code = daemon.terminate();
    if code != Some(128 + libc::SIGTERM) {
        failures.push(format!("SIGTERM ended the daemon with {code:?}, not 143"));
    }
    let err = daemon.stderr();
    if let Some(line) = err.lines().find(|l| l.contains("panicked")) {
        failures.push(format!("the daemon panicked: {line}"));
    }
    println!(
        "protocol fuzz: seed {seed}: {} clients ({}), {} requests ({} served, {} of them RDMA, {} acks, {} too big to send), \
         {} first messages, {} attaches, {} events read, {} bursts unread; pair: {pair}; cmtime: {cmtime_said}; \
         daemon fds {fd0} -> {fds}, RSS KiB {rss:?}; {:.1} s",
        stats.clients.iter().sum::<usize>(),
        ROLES
            .iter()
            .zip(stats.clients)
            .map(|(r, n)| format!("{n} {r}"))
            .collect::<Vec<_>>()
            .join(", "),
        stats.requests,
        stats.answered_ok,
        stats.rdma_served,
        stats.acks,
        stats.too_big,
        stats.first_messages,
        stats.attaches,
        stats.events,
        stats.bursts,
        started.elapsed().as_secs_f64(),
    );
    assert!(
        failures.is_empty(),
        "protocol fuzz, seed {seed}: {} failure(s):\n- {}\nthe daemon's last stderr lines:\n{tail}\nrerun with: {}",
        failures.len(),
        failures.join("\n- "),
        reproduce(seed)
    );
}

#[test]
#[ignore = "beside the protocol fuzz (about 6 s, while the fuzz runs): scripts/test-all runs both \
            in a step of their own, cargo test -p cm-dropin --test protocol_fuzz -- --ignored"]
fn a_client_that_never_reads_its_replies_does_not_stall_the_others() {
    let mut daemon = Daemon::start("never-reads");
    let pid = std::process::id();
    let hog = hello(&daemon.socket, SERVER, pid, "fuzz-never-reads").expect("attach");
    // Requests the daemon answers EINVAL, as many as it takes in (at most 20 000), none read:
    // its replies fill the socket, it keeps the one that did not fit and reads no more.
    let mut e = Enc::op(Op::DestroyId);
    e.u64(0xdead);
    let mut sent = 0;
    let deadline = Instant::now() + Duration::from_secs(10);
    while sent < 20_000 && Instant::now() < deadline {
        match hog.ctrl.try_send(&e.0) {
            Ok(()) => sent += 1,
            Err(err) if err.kind() == ErrorKind::WouldBlock => {
                let ready = sock::poll(&[(hog.ctrl.as_raw_fd(), Interest::Write)], 200).expect("poll");
                if !ready[0].writable {
                    break;
                }
            }
            Err(err) => panic!("send: {err}"),
        }
    }
    // Another program attaches meanwhile: served at once, well before the daemon gives up
    // on the hog (5 s).
    let flooded = Instant::now();
    let other = hello_within(
        &daemon.socket,
        CLIENT,
        pid,
        "fuzz-bystander",
        Duration::from_secs(3),
    )
    .and_then(|p| p.call_u64(&Enc::op(Op::CreateChannel)).map(|_| p));
    let served_in = flooded.elapsed();
    // The hog, not reading for longer than the daemon waits, is cut off: after the replies
    // that fitted, its socket ends.
    std::thread::sleep(Duration::from_secs(6));
    let deadline = Instant::now() + Duration::from_secs(20);
    let mut replies = 0;
    let cut = loop {
        let left = deadline.saturating_duration_since(Instant::now());
        match recv_within(&hog.ctrl, left) {
            Ok(Got::Msg(_)) => replies += 1,
            Ok(Got::Closed) => break Ok(()),
            Ok(Got::Nothing) => break Err(format!("not cut off within 26 s ({replies} replies read)")),
            Err(e) => break Err(e),
        }
    };
    // And the others go on.
    let after = other
        .as_ref()
        .map_err(Clone::clone)
        .and_then(|p| p.call_u64(&Enc::op(Op::CreateChannel)));
    let other = other.map(drop);
    drop(hog);
    let code = daemon.terminate();
    let err = daemon.stderr();
    assert_eq!(
        other,
        Ok(()),
        "with {sent} requests unread by their sender, a second program was not served"
    );
    assert!(
        served_in < Duration::from_secs(3),
        "the second program was served after {served_in:?}"
    );
    assert_eq!(cut, Ok(()), "{err}");
    assert!(replies < sent, "{replies} of {sent} answered before the cut");
    assert!(after.is_ok(), "after the cut: {after:?}");
    assert!(
        err.contains("fuzz-never-reads") && err.contains("has not read its replies"),
        "{err}"
    );
    assert_eq!(code, Some(128 + libc::SIGTERM), "{err}");
    assert!(!err.contains("panicked"), "{err}");
}
