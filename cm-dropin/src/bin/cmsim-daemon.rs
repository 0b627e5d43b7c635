//! `cmsim-daemon`: owns one simulated fabric and serves every process that loads the drop-in
//! librdmacm / libibverbs over a Unix socket.
//!
//! Wall-clock mode: the fabric's virtual clock follows the daemon's wall clock, and events are
//! forwarded to the processes' channel sockets as soon as they are due. One simulated host per
//! address given with `--host`; each process names its host with `CMSIM_HOST`.

use std::collections::{HashMap, HashSet, VecDeque};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, RawFd};
use std::path::PathBuf;
use std::sync::atomic::{AtomicI32, Ordering};
use std::time::{Duration, Instant};

use cm_core::{
    Access, ChannelHandle, CmBackend, CmError, CmEvent, ConnParam, IdHandle, MrHandle, QpAttr, QpAttrMask,
    QpCaps, QpHandle, QpType, RemoteAddr, SendOp, SendWr, Sge, SrqCaps, SrqHandle, VerbsQpAttr, WcOpcode,
    WcStatus, WorkCompletion, GRH_LEN,
};
use cm_core::{Invocation, Outcome};
use cm_dropin::proto::{self, Dec, Enc, Op, WireEvent, WireWc};
use cm_dropin::request::{FabricHosts, Opening, Request, Welcome};
use cm_dropin::sock::{self, Interest, ProcessFd, Received, SeqConn, SeqListener};
use cm_sim::{Fault, FaultSchedule, MsgKind, RegionMemory, SimFabric, SimHost};

const USAGE: &str = "\
usage: cmsim-daemon --socket PATH --host IP [--host IP ...] [options]
  --socket-mode MODE     the socket file's permission bits, octal (default 600: only this
                         user's programs may attach); PATH must not exist, or be the socket
                         of a daemon that is gone
  --seed N               simulator seed (default: CM_SIM_SEED or drawn)
  --cm-timeouts R,L      the IB CM's response timeout and packet lifetime, IBA exponents
                         (4.096 us x 2^t; Linux 6.1's 20,18: 6.1 s a try, 16 tries; 12,8:
                         18 ms a try)
  --fault AT:SPEC        strike a fault AT ms after start (repeatable), SPEC one of
                         partition A B | heal A B | loss A B PER_MILLE | delay A B MIN_MS MAX_MS |
                         crash H | restart H | remove-device H | restore-device H | addr-change H |
                         drop KIND A B SKIP COUNT|all (KIND a CM message: REQ REP RTU REJ MRA DREQ
                         DREP, from A to B; of those sent from AT on, retries included, let SKIP
                         through and lose COUNT)
                         (hosts are numbered from 0 in --host order; B may be * for every
                         other host)
  --faults FILE          the same, one AT:SPEC per line (# comments)
  --processes N          exit once N processes have attached and all have gone
  --max-seconds S        give up (exit 3) after S seconds of wall time (default 600)
  --trace FILE           write the trace, one line per record
  --trace-mermaid FILE   write the trace as a Mermaid sequence diagram
On exit prints seed: and trace-hash: lines on stdout.";

/// The loopback /24 whose `.1 + i` stands for host `i` on the programs' own sockets: one of
/// 254 × 256 blocks (`127.1.0.0` to `127.254.255.0`), chosen by this daemon's pid so that
/// daemons running at once (tests in parallel) almost never share one, and never `127.0.0.0/24`
/// (the machine's own `127.0.0.1`).
fn loopback_block(pid: u32) -> std::net::Ipv4Addr {
    let v = pid % (254 * 256);
    std::net::Ipv4Addr::new(127, (1 + v / 256) as u8, (v % 256) as u8, 0)
}

struct Options {
    socket: PathBuf,
    socket_mode: u32,
    hosts: Vec<String>,
    seed: Option<u64>,
    cm_timeouts: Option<(u8, u8)>,
    faults: FaultSchedule,
    processes: Option<usize>,
    max_wall: Duration,
    trace: Option<PathBuf>,
    trace_mermaid: Option<PathBuf>,
}

fn parse_fault(line: &str) -> Result<(Duration, Fault), String> {
    let (at, spec) = line
        .split_once(':')
        .ok_or_else(|| format!("fault `{line}`: want AT_MS:SPEC"))?;
    let at = Duration::from_millis(
        at.trim()
            .parse()
            .map_err(|_| format!("fault `{line}`: bad time"))?,
    );
    let words: Vec<&str> = spec.split_whitespace().collect();
    let num = |i: usize| -> Result<u64, String> {
        words
            .get(i)
            .and_then(|w| w.parse().ok())
            .ok_or_else(|| format!("fault `{line}`: argument {i} missing or not a number"))
    };
    let h = |i: usize| {
        num(i).and_then(|v| {
            u16::try_from(v)
                .ok()
                .filter(|&h| h != Fault::ALL_HOSTS)
                .ok_or_else(|| format!("fault `{line}`: host {v} out of range"))
        })
    };
    // A link's far end may be `*`: every other host.
    let peer = |i: usize| match words.get(i) {
        Some(&"*") => Ok(Fault::ALL_HOSTS),
        _ => h(i),
    };
    let fault = match words.first().copied() {
        Some("partition") => Fault::Partition {
            a: h(1)?,
            b: peer(2)?,
        },
        Some("heal") => Fault::Heal {
            a: h(1)?,
            b: peer(2)?,
        },
        Some("loss") => Fault::Loss {
            a: h(1)?,
            b: peer(2)?,
            per_mille: u16::try_from(num(3)?)
                .map_err(|_| format!("fault `{line}`: per mille out of range"))?,
        },
        Some("delay") => Fault::Delay {
            a: h(1)?,
            b: peer(2)?,
            min: Duration::from_millis(num(3)?),
            max: Duration::from_millis(num(4)?),
        },
        Some("crash") => Fault::Crash { host: h(1)? },
        Some("restart") => Fault::Restart { host: h(1)? },
        Some("remove-device") => Fault::RemoveDevice { host: h(1)? },
        Some("restore-device") => Fault::RestoreDevice { host: h(1)? },
        Some("addr-change") => Fault::AddrChange { host: h(1)? },
        Some("drop") => {
            let msg = match words.get(1).map(|w| w.to_ascii_uppercase()).as_deref() {
                Some("REQ") => MsgKind::Req,
                Some("REP") => MsgKind::Rep,
                Some("RTU") => MsgKind::Rtu,
                Some("REJ") => MsgKind::Rej,
                Some("MRA") => MsgKind::Mra,
                Some("DREQ") => MsgKind::Dreq,
                Some("DREP") => MsgKind::Drep,
                _ => {
                    return Err(format!(
                        "fault `{line}`: drop wants a kind: REQ REP RTU REJ MRA DREQ DREP"
                    ))
                }
            };
            let count = match words.get(5) {
                Some(&"all") => u32::MAX,
                _ => u32::try_from(num(5)?).map_err(|_| format!("fault `{line}`: count out of range"))?,
            };
            Fault::Drop {
                msg,
                from: h(2)?,
                to: peer(3)?,
                skip: u32::try_from(num(4)?).map_err(|_| format!("fault `{line}`: skip out of range"))?,
                count,
            }
        }
        _ => return Err(format!("fault `{line}`: unknown kind")),
    };
    Ok((at, fault))
}

fn parse_args() -> Result<Options, String> {
    let mut o = Options {
        socket: PathBuf::new(),
        socket_mode: 0o600,
        hosts: Vec::new(),
        seed: None,
        cm_timeouts: None,
        faults: FaultSchedule::new(),
        processes: None,
        max_wall: Duration::from_secs(600),
        trace: None,
        trace_mermaid: None,
    };
    let mut args = std::env::args().skip(1);
    while let Some(a) = args.next() {
        let mut val = || args.next().ok_or_else(|| format!("{a} needs a value"));
        match a.as_str() {
            "--socket" => o.socket = PathBuf::from(val()?),
            "--socket-mode" => {
                let v = val()?;
                o.socket_mode = u32::from_str_radix(&v, 8)
                    .ok()
                    .filter(|&m| m <= 0o777)
                    .ok_or_else(|| {
                        format!("bad --socket-mode {v:?}: want octal permission bits, e.g. 600")
                    })?;
            }
            "--host" => o.hosts.push(val()?),
            "--seed" => o.seed = Some(cm_sim::parse_seed(&val()?).ok_or("bad --seed")?),
            "--cm-timeouts" => {
                let v = val()?;
                let bad = || format!("bad --cm-timeouts {v:?}: want RESPONSE,LIFETIME, each 0 to 31");
                let (r, l) = v.split_once(',').ok_or_else(bad)?;
                let exp = |t: &str| t.trim().parse::<u8>().ok().filter(|&t| t <= 31);
                o.cm_timeouts = Some((exp(r).ok_or_else(bad)?, exp(l).ok_or_else(bad)?));
            }
            "--fault" => {
                let (at, f) = parse_fault(&val()?)?;
                o.faults = std::mem::take(&mut o.faults).with(at, f);
            }
            "--faults" => {
                let path = val()?;
                let text = std::fs::read_to_string(&path).map_err(|e| format!("{path}: {e}"))?;
                for line in text
                    .lines()
                    .map(str::trim)
                    .filter(|l| !l.is_empty() && !l.starts_with('#'))
                {
                    let (at, f) = parse_fault(line)?;
                    o.faults = std::mem::take(&mut o.faults).with(at, f);
                }
            }
            "--processes" => o.processes = Some(val()?.parse().map_err(|_| "bad --processes")?),
            "--max-seconds" => {
                o.max_wall = Duration::from_secs(val()?.parse().map_err(|_| "bad --max-seconds")?)
            }
            "--trace" => o.trace = Some(PathBuf::from(val()?)),
            "--trace-mermaid" => o.trace_mermaid = Some(PathBuf::from(val()?)),
            "-h" | "--help" => return Err(USAGE.to_string()),
            _ => return Err(format!("unknown option {a}\n{USAGE}")),
        }
    }
    if o.socket.as_os_str().is_empty() || o.hosts.is_empty() {
        return Err(USAGE.to_string());
    }
    Ok(o)
}

/// One attached process.
struct Proc {
    ctrl: SeqConn,
    /// The process's pid as the kernel named it when it connected, for reading and writing its
    /// registered memory. Every request is checked to come from it.
    pid: u32,
    /// The process itself: readable once it exits, even while a forked child still holds the
    /// control socket, and never another process that later gets the same pid. Shared with
    /// the simulator's view of its regions.
    pidfd: std::rc::Rc<ProcessFd>,
    host: SimHost,
    name: String,
    ids: HashSet<u64>,
    /// Its verbs QPs (`ibv_create_qp`).
    qps: HashSet<u64>,
    channels: HashSet<u64>,
    /// The daemon's ends of destroyed channels, kept until the program's end closes: a
    /// thread still blocked reading a destroyed channel keeps blocking, as on librdmacm,
    /// instead of reading the end (cmtime's event thread does this at exit).
    closed: Vec<SeqConn>,
    /// A reply the socket had no room for, and since when: the process is not served again
    /// until it has read it, and is cut off when it has not within [`REPLY_READ_WITHIN`].
    unsent: Option<(Vec<u8>, Instant)>,
}

struct IdEntry {
    proc: u64,
    handle: IdHandle,
    host: usize,
    has_qp: bool,
    /// The QP's completion queues (daemon tokens; 0 for none).
    send_cq: u64,
    recv_cq: u64,
    /// `sq_sig_all`: every send completes visibly.
    sq_sig_all: bool,
    /// Per posted send, in order: whether its success is reported (`IBV_SEND_SIGNALED`), and
    /// its length, the `byte_len` of its successful completion as rxe reports it (the
    /// simulator's completion counts received bytes only).
    sends: VecDeque<(bool, u32)>,
    /// A UD QP: its receives hold the GRH before the payload.
    ud: bool,
}

/// A verbs QP no id owns (`ibv_create_qp`), named by its token, which is also the number the
/// process sees (`ibv_qp.qp_num`) and gives its peer.
struct VerbsQpEntry {
    proc: u64,
    handle: QpHandle,
    /// The simulator's number of the QP, which a peer's RTR names it by there.
    sim_qpn: u32,
    send_cq: u64,
    recv_cq: u64,
    sq_sig_all: bool,
    /// As [`IdEntry::sends`].
    sends: VecDeque<(bool, u32)>,
    /// The QP number its RTR names, as the process gave it (what `ibv_query_qp` reports).
    dest: u32,
    /// A UD QP: its receives hold the GRH before the payload.
    ud: bool,
}

/// Verbs QPs one process may have at once: each holds the daemon's and the simulator's memory.
const MAX_VERBS_QPS: usize = 4096;

/// A shared receive queue (`ibv_create_srq`) of a process's, named by its token.
struct SrqEntry {
    proc: u64,
    handle: SrqHandle,
}

/// SRQs one process may have at once.
const MAX_SRQS: usize = 1024;
/// `IBV_SRQ_MAX_WR` and `IBV_SRQ_LIMIT` of `enum ibv_srq_attr_mask`.
const IBV_SRQ_MAX_WR: u32 = 1;
const IBV_SRQ_LIMIT: u32 = 2;

/// A completion queue: the QPs that report into it and the completions not polled yet.
struct CqEntry {
    proc: u64,
    qps: Vec<u64>,
    ready: VecDeque<WireWc>,
    /// Its completion channel (0: none).
    channel: u64,
    /// `ibv_req_notify_cq` was called and no event has been raised since.
    armed: bool,
    /// A completion arrived since the CQ was last armed.
    fresh: bool,
}

/// A registered memory region: what an rkey lets a peer read or write.
struct MrEntry {
    proc: u64,
    addr: u64,
    len: u64,
    access: u32,
    /// The region as the simulator knows it, once a work request has needed it (registering
    /// takes an id bound to the device, which `ibv_reg_mr` does not have): its handle, the
    /// address the simulator gave it and its rkey there.
    sim: Option<(MrHandle, u64, u32)>,
}

/// A program's registered memory as the simulator reads and writes it for RDMA READ and
/// WRITE: the process's own bytes, reached as a NIC reaches them, without a thread of its
/// (`process_vm_readv`/`writev`), and never once the process has exited (its pid may be
/// another's by then).
struct ProcessMemory {
    pid: u32,
    pidfd: std::rc::Rc<ProcessFd>,
    addr: u64,
    len: u64,
}

impl RegionMemory for ProcessMemory {
    fn len(&self) -> u64 {
        self.len
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        // Memory the process unmapped (or a process gone) reads as zeros: the simulator's
        // model has no local protection error to report it with.
        match (
            self.pidfd.exited(),
            sock::read_process(self.pid, self.addr + offset, out.len()),
        ) {
            (false, Ok(bytes)) => out.copy_from_slice(&bytes),
            _ => out.fill(0),
        }
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        if !self.pidfd.exited() {
            let _ = sock::write_process(self.pid, self.addr + offset, data);
        }
    }
}

/// A remote address no region has: `REM_ACCESS_ERR` at any peer (the simulator's keys are
/// never 0).
const NOWHERE: RemoteAddr = RemoteAddr { addr: 0, rkey: 0 };
const IBV_QPT_UD: u32 = 4;
const IBV_WC_GRH: u32 = 1;
const IBV_WC_WITH_IMM: u32 = 2;

/// How long a connection may take to say its first message (a program's hello, a channel's
/// attach, a probe): the library sends it right after connecting.
const FIRST_MESSAGE_WITHIN: Duration = Duration::from_secs(5);
/// Connections that have not said their first message yet, at most: past it the oldest is
/// closed, so idle connections cannot crowd out programs.
const MAX_SILENT: usize = 128;
/// How long a reply may wait for its process to read it. The library reads each reply as
/// soon as it has sent the request, so only a process that stopped reading (a hostile client,
/// or one stopped with requests it never waits for) gets here; it is cut off so that its
/// socket and state are not held for ever.
const REPLY_READ_WITHIN: Duration = Duration::from_secs(5);

/// A completion channel: a socket the daemon writes one datagram per completion event into.
struct CompChan {
    proc: u64,
    sock: Option<SeqConn>,
    pending: VecDeque<Vec<u8>>,
}

struct ChanEntry {
    proc: u64,
    handle: ChannelHandle,
    sock: Option<SeqConn>,
    /// Datagrams the socket had no room for yet, in order.
    pending: VecDeque<Vec<u8>>,
}

struct Daemon {
    fabric: SimFabric,
    listener: SeqListener,
    /// Connections accepted but not yet identified by their first datagram, with when they
    /// came.
    fresh: Vec<(SeqConn, Instant)>,
    procs: HashMap<u64, Proc>,
    ids: HashMap<u64, IdEntry>,
    /// Verbs QPs, by token (drawn with ids' tokens: one namespace of QP numbers).
    vqps: HashMap<u64, VerbsQpEntry>,
    /// The simulator's numbers of verbs QPs → their tokens, for the senders of datagrams.
    vqp_by_sim: HashMap<u32, u64>,
    /// Shared receive queues, by token.
    srqs: HashMap<u64, SrqEntry>,
    id_tokens: HashMap<(usize, IdHandle), u64>,
    channels: HashMap<u64, ChanEntry>,
    cqs: HashMap<u64, CqEntry>,
    comp_channels: HashMap<u64, CompChan>,
    /// Registered memory by key (lkey = rkey).
    mrs: HashMap<u32, MrEntry>,
    next_key: u32,
    /// Connecting and accepting ids with a QP, by (their local address, their peer's): a
    /// peer's event then names the QP with the daemon's number, the one `ibv_qp.qp_num` shows
    /// and UD sends are routed by (the simulator numbers QPs its own way).
    endpoints: HashMap<(SocketAddr, SocketAddr), u64>,
    /// Listening ids (token → bound address), for the wrapper's probe.
    listening: HashMap<u64, SocketAddr>,
    /// Events forwarded and not acked yet: number → (the token they count against, event).
    /// Events handed out and not acked: the process they went to, the id they count against,
    /// the event.
    events: HashMap<u64, (u64, u64, CmEvent)>,
    /// Per counted id token, its forwarded and unacked events.
    outstanding: HashMap<u64, HashSet<u64>>,
    next_token: u64,
    next_id: u64,
    /// Seeded from the operating system: tokens are not part of the simulation, whose seed
    /// stays the run's alone.
    token_rng: rand_chacha::ChaCha8Rng,
    started: Instant,
    attached_total: usize,
    /// An fd held in reserve: given up when the daemon has no other, to accept and close a
    /// connection it has no room for.
    spare_fd: Option<std::fs::File>,
    /// Running out of fds has been said on stderr (once: it may recur on every accept).
    said_out_of_fds: bool,
    /// `CMSIM_DEBUG` set: log every forwarded event and every request.
    debug: bool,
}

/// Sends queued datagrams while the socket has room.
fn flush(sock: &Option<SeqConn>, pending: &mut VecDeque<Vec<u8>>) {
    let Some(sock) = sock else { return };
    while let Some(d) = pending.front() {
        match sock.try_send(d) {
            Ok(()) => {
                pending.pop_front();
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => break,
            Err(_) => {
                // The process is going away; its control socket's close cleans up.
                pending.clear();
                break;
            }
        }
    }
}

fn errno_of(e: &CmError) -> i32 {
    e.errno()
}

/// What `rdma_init_qp_attr` answers, as `struct ibv_qp_attr` holds it.
fn verbs_attr_of(a: &QpAttr) -> VerbsQpAttr {
    let state = a
        .qp_state
        .map(cm_dropin::request::verbs_state_of)
        .unwrap_or_default();
    VerbsQpAttr {
        qp_state: state,
        cur_qp_state: state,
        pkey_index: a.pkey_index,
        port_num: a.port_num,
        qp_access_flags: a.qp_access_flags,
        path_mtu: a.path_mtu,
        dest_qp_num: a.dest_qp_num,
        rq_psn: a.rq_psn,
        sq_psn: a.sq_psn,
        timeout: a.timeout,
        retry_cnt: a.retry_cnt,
        rnr_retry: a.rnr_retry,
        max_rd_atomic: a.max_rd_atomic,
        max_dest_rd_atomic: a.max_dest_rd_atomic,
        min_rnr_timer: a.min_rnr_timer,
        qkey: a.qkey,
        ah_attr: a.ah_attr,
        ..VerbsQpAttr::default()
    }
}

/// Puts the 40 bytes rxe puts ahead of a UD payload in front of a received datagram's bytes
/// (the sender at `from`, this QP at `local`), and names the sending QP.
fn with_grh(wire: &mut WireWc, from: Option<IpAddr>, local: Option<IpAddr>, src_qp: u32) {
    // The simulator does not say which group a group's datagram came by: the header names the
    // receiving QP's address.
    let mut data = match from {
        Some(addr) => cm_core::grh(addr, local, wire.data.len()).to_vec(),
        None => vec![0; GRH_LEN],
    };
    data.extend_from_slice(&wire.data);
    wire.data = data;
    wire.byte_len = wire.data.len() as u32;
    wire.src_qp = src_qp;
    wire.wc_flags |= IBV_WC_GRH;
}

/// A completion of QP `t` as the process sees it, and the CQ it goes to (`cqs`: the
/// QP's send and receive CQs): a send's length from `sends` (what was posted, in order), a
/// successful unsignaled send dropped (`None`).
fn wire_wc(
    t: u64,
    wc: WorkCompletion,
    sends: &mut VecDeque<(bool, u32)>,
    cqs: (u64, u64),
) -> Option<(u64, WireWc)> {
    let mut byte_len = wc.byte_len;
    if wc.opcode == WcOpcode::Send {
        let (visible, len) = sends.pop_front().unwrap_or((true, 0));
        if !visible && wc.status == WcStatus::Success {
            return None;
        }
        if wc.status == WcStatus::Success {
            byte_len = len;
        }
    }
    let requester = !matches!(wc.opcode, WcOpcode::Recv | WcOpcode::RecvRdmaWithImm);
    let target = if requester { cqs.0 } else { cqs.1 };
    Some((
        target,
        WireWc {
            wr_id: wc.wr_id,
            id: t,
            status: wc.status as u32,
            opcode: wc.opcode as u32,
            byte_len,
            imm_data: wc.imm_data.unwrap_or(0),
            wc_flags: if wc.imm_data.is_some() { IBV_WC_WITH_IMM } else { 0 },
            data: wc.data,
            ..WireWc::default()
        },
    ))
}

/// A one-sided operation a connected QP carries out at its peer's memory, the NIC's work.
#[derive(Clone, Copy)]
enum OneSided {
    /// `IBV_WR_RDMA_WRITE`, or `IBV_WR_RDMA_WRITE_WITH_IMM` with its immediate.
    Write { imm: Option<u32> },
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap { compare: u64, swap: u64 },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd { add: u64 },
}

impl OneSided {
    /// The simulator's operation at `remote`.
    fn op(self, remote: RemoteAddr) -> SendOp {
        match self {
            OneSided::Write { imm } => SendOp::Write { remote, imm },
            OneSided::Read => SendOp::Read { remote },
            OneSided::CompareSwap { compare, swap } => SendOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            OneSided::FetchAdd { add } => SendOp::FetchAdd { remote, add },
        }
    }
}

impl Daemon {
    /// An id's token, which is also its QP's number (`qp_num`, 24 bits on the wire): counted.
    /// Ids are checked against their owner on every use, so knowing another's number is not
    /// reaching it.
    fn id_token(&mut self) -> u64 {
        // Past 2^24 ids the count comes round: 0 and ids still alive are skipped.
        loop {
            self.next_id = (self.next_id + 1) & 0x00FF_FFFF;
            if self.next_id != 0
                && !self.ids.contains_key(&self.next_id)
                && !self.vqps.contains_key(&self.next_id)
            {
                return self.next_id;
            }
        }
    }

    /// A new name for a process, channel, CQ or event: unguessable, so that a process cannot
    /// name another's (each is also checked against its owner). The high 28
    /// bits count, so that tokens sort in the order they were made (the loop serves processes
    /// and channels in that order, as before, for the first 2^28 tokens); the low 36 are
    /// random: 2^36 requests to hit one by chance.
    fn token(&mut self) -> u64 {
        use rand_chacha::rand_core::RngCore;
        self.next_token = self.next_token.wrapping_add(1);
        (self.next_token << 36) | (self.token_rng.next_u64() & ((1 << 36) - 1))
    }

    fn sync_clock(&mut self) {
        let wall = self.started.elapsed();
        let now = self.fabric.now().since_start();
        if wall > now {
            self.fabric.advance(wall - now);
        }
    }

    fn free_key(&mut self) -> Option<u32> {
        next_free_key(&mut self.next_key, |k| self.mrs.contains_key(&k), self.mrs.len())
    }

    fn id_of(&self, proc: u64, token: u64) -> Result<(IdHandle, SimHost), i32> {
        match self.ids.get(&token) {
            Some(e) if e.proc == proc => Ok((e.handle, self.procs[&proc].host.clone())),
            _ => Err(libc::EINVAL),
        }
    }

    /// The caller's verbs QP `t`.
    fn vqp_of(&self, proc: u64, t: u64) -> Result<(QpHandle, SimHost), i32> {
        match self.vqps.get(&t) {
            Some(e) if e.proc == proc => Ok((e.handle, self.procs[&proc].host.clone())),
            _ => Err(libc::EINVAL),
        }
    }

    fn handle_request(&mut self, proc: u64, msg: &[u8]) -> Vec<u8> {
        let mut reply = Enc::default();
        reply.i32(0);
        let status = match self.serve(proc, msg, &mut reply) {
            Ok(()) => return reply.0,
            Err(errno) => errno,
        };
        let mut e = Enc::default();
        e.i32(status);
        e.0
    }

    /// One request: decoded, then served by what it is.
    fn serve(&mut self, proc: u64, msg: &[u8], reply: &mut Enc) -> Result<(), i32> {
        match Request::decode(msg)? {
            Request::Cm(call) => self.serve_cm(proc, call, reply),
            Request::CreateQp {
                id,
                caps,
                send_cq,
                recv_cq,
                sq_sig_all,
                qp_type,
                srq,
            } => {
                let srq = match srq {
                    0 => None,
                    t => Some(self.srq_of(proc, t)?.0),
                };
                self.create_qp(
                    proc,
                    id,
                    caps,
                    (send_cq, recv_cq),
                    sq_sig_all,
                    qp_type,
                    srq,
                    reply,
                )
            }
            Request::PostSend {
                id,
                wr_id,
                signaled,
                data,
            } if self.vqps.contains_key(&id) => self.verbs_post_send(proc, id, wr_id, signaled, &data),
            Request::PostSend {
                id,
                wr_id,
                signaled,
                data,
            } => self.post_send(proc, id, wr_id, signaled, &data),
            Request::VerbsCreateQp {
                caps,
                send_cq,
                recv_cq,
                sq_sig_all,
                qp_type,
                srq,
            } => {
                let srq = match srq {
                    0 => None,
                    t => Some(self.srq_of(proc, t)?.0),
                };
                self.verbs_create_qp(proc, caps, (send_cq, recv_cq), sq_sig_all, qp_type, srq, reply)
            }
            Request::CreateSrq {
                max_wr,
                max_sge,
                srq_limit,
            } => self.create_srq(proc, max_wr, max_sge, srq_limit, reply),
            Request::ModifySrq {
                srq,
                mask,
                max_wr,
                srq_limit,
            } => self.modify_srq(proc, srq, mask, max_wr, srq_limit),
            Request::QuerySrq { srq } => {
                let (handle, host) = self.srq_of(proc, srq)?;
                let caps = host.query_srq(handle).map_err(|e| errno_of(&e))?;
                reply.u32(caps.max_wr).u32(caps.max_sge).u32(caps.srq_limit);
                Ok(())
            }
            Request::DestroySrq { srq } => {
                let (handle, mut host) = self.srq_of(proc, srq)?;
                host.destroy_srq(handle).map_err(|e| errno_of(&e))?;
                self.srqs.remove(&srq);
                Ok(())
            }
            Request::PostSrqRecv { srq, wr_id, len } => {
                let (handle, mut host) = self.srq_of(proc, srq)?;
                // No message is longer than the simulated port's max_msg_sz: a longer buffer
                // is as good as one of that size.
                host.post_srq_recv(handle, wr_id, len.min(proto::MAX_MESSAGE))
                    .map_err(|e| errno_of(&e))
            }
            Request::ModifyQp { qp, mask, attr } if self.ids.contains_key(&qp) => {
                self.id_modify_qp(proc, qp, mask, &attr)
            }
            Request::ModifyQp { qp, mask, attr } => self.verbs_modify_qp(proc, qp, mask, attr),
            Request::QueryQp { qp } => {
                let (handle, host) = self.vqp_of(proc, qp)?;
                let m = host.verbs_query_qp(handle).map_err(|e| errno_of(&e))?;
                let mut attr = m.attr();
                attr.dest_qp_num = self.vqps[&qp].dest;
                reply.u32(m.attr_mask().bits()).verbs_attr(&attr);
                Ok(())
            }
            Request::VerbsDestroyQp { qp } => {
                let (handle, mut host) = self.vqp_of(proc, qp)?;
                host.verbs_destroy_qp(handle).map_err(|e| errno_of(&e))?;
                self.vqp_gone(qp);
                Ok(())
            }
            Request::QpPostRecv { qp, wr_id, len } => {
                let (handle, mut host) = self.vqp_of(proc, qp)?;
                // The GRH is the daemon's to put in front, as for an id's UD QP.
                let len = if self.vqps[&qp].ud {
                    len.saturating_sub(GRH_LEN as u32)
                } else {
                    len
                };
                host.verbs_post_recv(handle, wr_id, len).map_err(|e| errno_of(&e))
            }
            Request::PostSendUd {
                id,
                wr_id,
                signaled,
                mut dest,
                imm,
                data,
            } if self.vqps.contains_key(&id) => {
                if data.len() > proto::MAX_MESSAGE as usize {
                    return Err(libc::EINVAL);
                }
                let (handle, mut host) = self.vqp_of(proc, id)?;
                // A verbs QP is named by its token; another number is the simulator's (an id's
                // UD QP, a group's).
                if let Some(e) = self.vqps.get(&u64::from(dest.qp_num)) {
                    dest.qp_num = e.sim_qpn;
                }
                host.verbs_post_send_to(handle, wr_id, &dest, &data, imm)
                    .map_err(|e| errno_of(&e))?;
                let e = self.vqps.get_mut(&id).expect("checked above");
                let visible = signaled || e.sq_sig_all;
                e.sends.push_back((visible, data.len() as u32));
                Ok(())
            }
            Request::PostSendUd {
                id,
                wr_id,
                signaled,
                dest,
                imm,
                data,
            } => self.post_send_ud(proc, id, wr_id, signaled, &dest, imm, &data),
            Request::Rdma {
                write,
                imm,
                id,
                wr_id,
                signaled,
                remote_addr,
                rkey,
                sges,
            } => self.post_rdma(
                proc,
                id,
                wr_id,
                signaled,
                if write {
                    OneSided::Write { imm }
                } else {
                    OneSided::Read
                },
                RemoteAddr {
                    addr: remote_addr,
                    rkey,
                },
                &sges,
            ),
            Request::PostSendImm {
                id,
                wr_id,
                signaled,
                imm,
                sges,
            } => self.post_send_imm(proc, id, wr_id, signaled, imm, &sges),
            Request::Atomic {
                cmp_swap,
                id,
                wr_id,
                signaled,
                remote_addr,
                rkey,
                compare_add,
                swap,
                sge,
            } => {
                let kind = if cmp_swap {
                    OneSided::CompareSwap {
                        compare: compare_add,
                        swap,
                    }
                } else {
                    OneSided::FetchAdd { add: compare_add }
                };
                let remote = RemoteAddr {
                    addr: remote_addr,
                    rkey,
                };
                self.post_rdma(proc, id, wr_id, signaled, kind, remote, &[sge])
            }
            Request::QueryAddrs { id } => {
                let (id, mut host) = self.id_of(proc, id)?;
                let local = host.get_local_addr(id).map_err(|e| errno_of(&e))?;
                let peer = host.get_peer_addr(id).map_err(|e| errno_of(&e))?;
                reply.addr(local).addr(peer);
                Ok(())
            }
            // Served without a reply, in `serve_process`.
            Request::AckEvent { .. } => Err(libc::EPROTO),
            Request::CreateCq { cqe, channel } => {
                // The library refuses these first; a client that sends them anyway is told so.
                if cqe == 0 || cqe > proto::MAX_CQE {
                    return Err(libc::EINVAL);
                }
                if channel != 0 && self.comp_channels.get(&channel).is_none_or(|c| c.proc != proc) {
                    return Err(libc::EINVAL);
                }
                let t = self.token();
                self.cqs.insert(
                    t,
                    CqEntry {
                        proc,
                        qps: Vec::new(),
                        ready: VecDeque::new(),
                        channel,
                        armed: false,
                        fresh: false,
                    },
                );
                reply.u64(t);
                Ok(())
            }
            Request::DestroyCq { cq: t } => {
                match self.cqs.get(&t) {
                    Some(c) if c.proc == proc && c.qps.is_empty() => {
                        self.cqs.remove(&t);
                        Ok(())
                    }
                    // verbs refuses to destroy a CQ a QP still uses.
                    Some(c) if c.proc == proc => Err(libc::EBUSY),
                    _ => Err(libc::EINVAL),
                }
            }
            Request::PollCq { cq: t, max } => {
                let max = max as usize;
                if self.cqs.get(&t).is_none_or(|c| c.proc != proc) {
                    return Err(libc::EINVAL);
                }
                self.collect_completions(t);
                let c = self.cqs.get_mut(&t).expect("checked above");
                let mut out = Enc::default();
                let mut n = 0u32;
                let mut size = 0;
                while (n as usize) < max {
                    let Some(wc) = c.ready.front() else { break };
                    // One reply is one datagram: stop before it would outgrow one.
                    if n > 0 && size + wc.data.len() + 64 > sock::MAX_DATAGRAM / 2 {
                        break;
                    }
                    let wc = c.ready.pop_front().expect("front checked");
                    size += wc.data.len() + 64;
                    out.wc(&wc);
                    n += 1;
                }
                reply.u32(n);
                reply.0.extend_from_slice(&out.0);
                // Completions left for the next reply are in the CQ already: the library asks
                // again at once, as one poll on a NIC would have returned them.
                reply.u8(u8::from(!c.ready.is_empty() && (n as usize) < max));
                Ok(())
            }
            Request::ReqNotifyCq { cq: t } => {
                if self.cqs.get(&t).is_none_or(|c| c.proc != proc) {
                    return Err(libc::EINVAL);
                }
                // What the simulator completed before the call is not an event: only what
                // arrives from now on is (the caller polls once more after arming).
                self.collect_completions(t);
                let c = self.cqs.get_mut(&t).expect("checked above");
                c.armed = true;
                c.fresh = false;
                Ok(())
            }
            Request::CreateCompChannel => {
                let t = self.token();
                self.comp_channels.insert(
                    t,
                    CompChan {
                        proc,
                        sock: None,
                        pending: VecDeque::new(),
                    },
                );
                reply.u64(t);
                Ok(())
            }
            Request::DestroyCompChannel { channel: t } => {
                match self.comp_channels.get(&t) {
                    Some(c) if c.proc == proc => {
                        // verbs refuses while a CQ still reports into the channel.
                        if self.cqs.values().any(|cq| cq.channel == t) {
                            return Err(libc::EBUSY);
                        }
                        if let Some(sock) = self.comp_channels.remove(&t).and_then(|c| c.sock) {
                            self.procs
                                .get_mut(&proc)
                                .expect("caller exists")
                                .closed
                                .push(sock);
                        }
                        Ok(())
                    }
                    _ => Err(libc::EINVAL),
                }
            }
            Request::RegMr { addr, len, access } => {
                if addr.checked_add(len).is_none() {
                    // A range past the end of the address space: verbs' EINVAL, before any
                    // later access could add past it.
                    return Err(libc::EINVAL);
                }
                // verbs' own refusals: remote write or atomic without local write.
                Access::from_bits(access & Access::ALL.bits())
                    .ok_or(libc::EINVAL)?
                    .check()
                    .map_err(|_| libc::EINVAL)?;
                let key = self.free_key().ok_or(libc::ENOMEM)?;
                self.mrs.insert(
                    key,
                    MrEntry {
                        proc,
                        addr,
                        len,
                        access,
                        sim: None,
                    },
                );
                reply.u32(key);
                Ok(())
            }
            Request::DeregMr { key } => match self.mrs.get(&key) {
                Some(m) if m.proc == proc => {
                    self.forget_region(key);
                    Ok(())
                }
                _ => Err(libc::EINVAL),
            },
        }
    }

    /// A librdmacm call: its tokens become the caller's handles (anyone else's are refused),
    /// the simulator makes it, and the daemon records what it made.
    fn serve_cm(&mut self, proc: u64, call: Invocation<u64, u64>, reply: &mut Enc) -> Result<(), i32> {
        let call = match call {
            // The simulator's datagram receive holds the payload alone; the GRH is the
            // daemon's to put in front (a buffer too short for it holds no payload).
            Invocation::PostRecv { id, wr_id, len } if self.ids.get(&id).is_some_and(|e| e.ud) => {
                Invocation::PostRecv {
                    id,
                    wr_id,
                    len: len.saturating_sub(GRH_LEN as u32),
                }
            }
            call => call,
        };
        let made = call.clone().map_handles(
            |t| self.id_of(proc, t).map(|(id, _)| id),
            |t| self.channel_of(proc, t),
        )?;
        let mut host = self.procs[&proc].host.clone();
        if let Invocation::DestroyId { id } = made {
            let t = *call.id().expect("an id call");
            // Events still in the channel socket were never seen by the application: the
            // library drops them, so they are given back here for it.
            self.ack_outstanding(t);
            // librdmacm destroys an id whose QP is still there (the kernel reclaims the QP
            // when the process closes its device); the simulator refuses that, so the QP goes
            // first here.
            if self.ids.get(&t).is_some_and(|e| e.has_qp) {
                host.destroy_qp(id).map_err(|e| errno_of(&e))?;
                self.qp_gone(t);
            }
        }
        let outcome = made.invoke(&mut host).map_err(|e| errno_of(&e))?;
        match (call, outcome) {
            (Invocation::CreateEventChannel, Outcome::Channel(handle)) => {
                let t = self.token();
                self.channels.insert(
                    t,
                    ChanEntry {
                        proc,
                        handle,
                        sock: None,
                        pending: VecDeque::new(),
                    },
                );
                self.procs
                    .get_mut(&proc)
                    .expect("caller exists")
                    .channels
                    .insert(t);
                reply.u64(t);
            }
            (Invocation::DestroyEventChannel { channel: t }, _) => {
                // The daemon's end goes when the program's does (watched in the loop): a
                // program that makes and destroys channels all its life must not use up the
                // daemon's fds.
                let p = self.procs.get_mut(&proc).expect("caller exists");
                if let Some(sock) = self.channels.remove(&t).and_then(|c| c.sock) {
                    p.closed.push(sock);
                }
                p.channels.remove(&t);
            }
            (Invocation::CreateId { .. }, Outcome::Id(id)) => {
                let t = self.register_id(proc, host.index(), id);
                reply.u64(t);
            }
            (Invocation::DestroyId { id: t }, _) => self.forget_id(t),
            (Invocation::InitQpAttr { .. }, Outcome::QpAttr(a)) => {
                reply.u32(a.mask.bits()).verbs_attr(&verbs_attr_of(&a));
            }
            (Invocation::DestroyQp { id: t }, _) => self.qp_gone(t),
            (Invocation::Listen { id: t, .. }, _) => {
                if let Some(Ok(Some(addr))) = self.ids.get(&t).map(|e| host.get_local_addr(e.handle)) {
                    self.listening.insert(t, addr);
                }
            }
            (Invocation::Connect { id: t, .. } | Invocation::Accept { id: t, .. }, _) => {
                if let Some(e) = self.ids.get(&t).filter(|e| e.has_qp) {
                    if let (Ok(Some(local)), Ok(Some(peer))) =
                        (host.get_local_addr(e.handle), host.get_peer_addr(e.handle))
                    {
                        self.endpoints.insert((local, peer), t);
                    }
                }
            }
            _ => {}
        }
        Ok(())
    }

    /// The caller's event channel `t`.
    fn channel_of(&self, proc: u64, t: u64) -> Result<ChannelHandle, i32> {
        match self.channels.get(&t) {
            Some(c) if c.proc == proc => Ok(c.handle),
            _ => Err(libc::EINVAL),
        }
    }

    /// `rdma_create_qp`, with the CQs it reports into, taking its receives from `srq` if it
    /// names one.
    #[allow(clippy::too_many_arguments)]
    fn create_qp(
        &mut self,
        proc: u64,
        t: u64,
        mut caps: QpCaps,
        (send_cq, recv_cq): (u64, u64),
        sq_sig_all: bool,
        qp_type: u32,
        srq: Option<SrqHandle>,
        reply: &mut Enc,
    ) -> Result<(), i32> {
        caps.max_message_size = proto::MAX_MESSAGE;
        let ud = qp_type == IBV_QPT_UD;
        for cq in [send_cq, recv_cq] {
            if cq != 0 && self.cqs.get(&cq).is_none_or(|c| c.proc != proc) {
                return Err(libc::EINVAL);
            }
        }
        let (id, mut host) = self.id_of(proc, t)?;
        // librdmacm moves the QP as its id's port space says: a QP of the other kind
        // cannot be made ready.
        let datagram = host.id_machine(id).is_ok_and(|m| !m.port_space().is_connected());
        if ud != datagram {
            return Err(libc::EINVAL);
        }
        let got = match srq {
            Some(srq) => host.create_qp_on_srq(id, caps, srq),
            None => host.create_qp(id, caps),
        }
        .map_err(|e| errno_of(&e))?;
        // Datagrams are addressed by the simulator's numbers; a connected QP is named
        // by its id token, unique fabric-wide, which the peers' events carry.
        let qp_num = match host.qp_num(id) {
            Ok(Some(n)) if ud => n,
            _ => t as u32,
        };
        if let Some(e) = self.ids.get_mut(&t) {
            e.has_qp = true;
            e.send_cq = send_cq;
            e.recv_cq = recv_cq;
            e.sq_sig_all = sq_sig_all;
            e.sends.clear();
            e.ud = ud;
        }
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cqs.get_mut(&cq) {
                if !c.qps.contains(&t) {
                    c.qps.push(t);
                }
            }
        }
        reply
            .u32(got.max_send_wr)
            .u32(got.max_recv_wr)
            .u32(got.max_send_sge)
            .u32(got.max_recv_sge)
            .u32(got.max_inline_data)
            .u32(qp_num);
        Ok(())
    }

    fn post_send(&mut self, proc: u64, t: u64, wr_id: u64, signaled: bool, data: &[u8]) -> Result<(), i32> {
        if data.len() > proto::MAX_MESSAGE as usize {
            return Err(libc::EINVAL);
        }
        let (id, mut host) = self.id_of(proc, t)?;
        host.post_send(id, wr_id, data).map_err(|e| errno_of(&e))?;
        self.sent(t, signaled, data.len());
        Ok(())
    }

    /// The caller's SRQ `t`.
    fn srq_of(&self, proc: u64, t: u64) -> Result<(SrqHandle, SimHost), i32> {
        match self.srqs.get(&t) {
            Some(e) if e.proc == proc => Ok((e.handle, self.procs[&proc].host.clone())),
            _ => Err(libc::EINVAL),
        }
    }

    /// `ibv_create_srq`, by rxe's rules (`rxe_srq_chk_init`): `max_wr` 1 up to the device's
    /// `max_srq_wr`, `max_sge` up to its `max_srq_sge` (0 is raised to 1). A limit armed at
    /// creation is refused with `EOPNOTSUPP` once the rest passes: its event would come by
    /// `ibv_get_async_event`, which the drop-in does not serve.
    fn create_srq(
        &mut self,
        proc: u64,
        max_wr: u32,
        max_sge: u32,
        srq_limit: u32,
        reply: &mut Enc,
    ) -> Result<(), i32> {
        let p = self.procs.get(&proc).ok_or(libc::EINVAL)?;
        if self.srqs.values().filter(|e| e.proc == proc).count() >= MAX_SRQS {
            return Err(libc::ENOMEM);
        }
        let mut host = p.host.clone();
        let caps = SrqCaps {
            max_wr,
            max_sge: max_sge.max(1),
            srq_limit,
            max_message_size: proto::MAX_MESSAGE,
        };
        let handle = host.verbs_create_srq(caps).map_err(|e| errno_of(&e))?;
        if srq_limit != 0 {
            let _ = host.destroy_srq(handle);
            return Err(libc::EOPNOTSUPP);
        }
        let t = self.token();
        self.srqs.insert(t, SrqEntry { proc, handle });
        reply.u64(t).u32(caps.max_wr).u32(caps.max_sge);
        Ok(())
    }

    /// `ibv_modify_srq`, checked as rxe checks it (`rxe_srq_chk_attr`: `EINVAL`). What passes
    /// is refused with `EOPNOTSUPP` unless it only disarms the limit: the simulator does not
    /// resize an SRQ (the device does not claim `IBV_DEVICE_SRQ_RESIZE`), and an armed limit's
    /// event would come by `ibv_get_async_event`, which the drop-in does not serve.
    fn modify_srq(&mut self, proc: u64, t: u64, mask: u32, max_wr: u32, srq_limit: u32) -> Result<(), i32> {
        let (handle, mut host) = self.srq_of(proc, t)?;
        let now = host.query_srq(handle).map_err(|e| errno_of(&e))?;
        let max_srq_wr = cm_sim::SimConfig::default().max_srq_wr;
        if mask & IBV_SRQ_MAX_WR != 0
            && (max_wr > max_srq_wr || max_wr == 0 || (now.srq_limit != 0 && max_wr < now.srq_limit))
        {
            return Err(libc::EINVAL);
        }
        if mask & IBV_SRQ_LIMIT != 0 && (srq_limit > max_srq_wr || srq_limit > now.max_wr) {
            return Err(libc::EINVAL);
        }
        if mask & IBV_SRQ_MAX_WR != 0 || (mask & IBV_SRQ_LIMIT != 0 && srq_limit != 0) {
            return Err(libc::EOPNOTSUPP);
        }
        if mask & IBV_SRQ_LIMIT != 0 {
            host.arm_srq_limit(handle, 0).map_err(|e| errno_of(&e))?;
        }
        Ok(())
    }

    /// `ibv_create_qp`: a verbs QP on the caller's host, reporting into its CQs, taking its
    /// receives from `srq` if it names one.
    #[allow(clippy::too_many_arguments)]
    fn verbs_create_qp(
        &mut self,
        proc: u64,
        mut caps: QpCaps,
        (send_cq, recv_cq): (u64, u64),
        sq_sig_all: bool,
        qp_type: u32,
        srq: Option<SrqHandle>,
        reply: &mut Enc,
    ) -> Result<(), i32> {
        caps.max_message_size = proto::MAX_MESSAGE;
        // verbs needs both CQs, of the caller's.
        for cq in [send_cq, recv_cq] {
            if self.cqs.get(&cq).is_none_or(|c| c.proc != proc) {
                return Err(libc::EINVAL);
            }
        }
        let ty = QpType::from_raw(qp_type).ok_or(libc::EINVAL)?;
        let p = self.procs.get(&proc).ok_or(libc::EINVAL)?;
        if p.qps.len() >= MAX_VERBS_QPS {
            return Err(libc::ENOMEM);
        }
        let mut host = p.host.clone();
        let (handle, got) = match srq {
            Some(srq) => host.verbs_create_qp_on_srq(ty, caps, srq),
            None => host.verbs_create_qp(ty, caps),
        }
        .map_err(|e| errno_of(&e))?;
        let sim_qpn = host.verbs_qp_num(handle).map_err(|e| errno_of(&e))?;
        let t = self.id_token();
        self.vqps.insert(
            t,
            VerbsQpEntry {
                proc,
                handle,
                sim_qpn,
                send_cq,
                recv_cq,
                sq_sig_all,
                sends: VecDeque::new(),
                dest: 0,
                ud: ty == QpType::Ud,
            },
        );
        self.vqp_by_sim.insert(sim_qpn, t);
        self.procs.get_mut(&proc).expect("looked up above").qps.insert(t);
        for cq in [send_cq, recv_cq] {
            if let Some(c) = self.cqs.get_mut(&cq) {
                if !c.qps.contains(&t) {
                    c.qps.push(t);
                }
            }
        }
        reply.caps(&got).u32(t as u32);
        Ok(())
    }

    /// `ibv_modify_qp`: a destination is named by the number the process saw, which the
    /// simulator knows by its own (a number no QP has is one nobody answers).
    fn verbs_modify_qp(&mut self, proc: u64, t: u64, mask: u32, mut attr: VerbsQpAttr) -> Result<(), i32> {
        let (handle, mut host) = self.vqp_of(proc, t)?;
        let mask = QpAttrMask::from_bits(mask);
        let named = attr.dest_qp_num;
        if mask.contains(QpAttrMask::DEST_QPN) {
            attr.dest_qp_num = self.vqps.get(&u64::from(named)).map_or(0, |e| e.sim_qpn);
        }
        if let Err(e) = host.verbs_modify_qp(handle, &attr, mask) {
            if self.debug {
                // Why the kernel's rules refuse it, which the errno alone does not say.
                eprintln!("cmsim-daemon: ibv_modify_qp of QP {t:#x} (mask {mask}): {e}");
            }
            return Err(errno_of(&e));
        }
        let e = self.vqps.get_mut(&t).expect("checked above");
        if mask.contains(QpAttrMask::DEST_QPN) {
            e.dest = named & 0x00FF_FFFF;
        }
        if attr.qp_state == cm_core::VerbsQpState::Reset && mask.contains(QpAttrMask::STATE) {
            e.dest = 0;
        }
        Ok(())
    }

    /// `ibv_modify_qp` of the QP `rdma_create_qp` gave id `t`, which librdmacm's CM moves
    /// ([`SimHost::modify_id_qp`]): a modify that keeps its state (RTS → RTS with
    /// `IBV_QP_MIN_RNR_TIMER`, as qperf's server makes once connected) is made, one that
    /// would move it is refused with `ENOSYS` (the library says so on stderr).
    fn id_modify_qp(&mut self, proc: u64, t: u64, mask: u32, attr: &VerbsQpAttr) -> Result<(), i32> {
        let (id, mut host) = self.id_of(proc, t)?;
        let mask = QpAttrMask::from_bits(mask);
        host.modify_id_qp(id, attr, mask).map_err(|e| {
            if self.debug {
                eprintln!("cmsim-daemon: ibv_modify_qp of id {t:#x}'s QP (mask {mask}): {e}");
            }
            errno_of(&e)
        })
    }

    fn verbs_post_send(
        &mut self,
        proc: u64,
        t: u64,
        wr_id: u64,
        signaled: bool,
        data: &[u8],
    ) -> Result<(), i32> {
        if data.len() > proto::MAX_MESSAGE as usize {
            return Err(libc::EINVAL);
        }
        let (handle, mut host) = self.vqp_of(proc, t)?;
        host.verbs_post_send(handle, wr_id, data)
            .map_err(|e| errno_of(&e))?;
        let e = self.vqps.get_mut(&t).expect("checked above");
        let visible = signaled || e.sq_sig_all;
        e.sends.push_back((visible, data.len() as u32));
        Ok(())
    }

    /// Forgets a destroyed verbs QP, its CQ memberships and unpolled completions.
    fn vqp_gone(&mut self, t: u64) {
        let Some(e) = self.vqps.remove(&t) else { return };
        self.vqp_by_sim.remove(&e.sim_qpn);
        if let Some(p) = self.procs.get_mut(&e.proc) {
            p.qps.remove(&t);
        }
        for cq in [e.send_cq, e.recv_cq] {
            if let Some(c) = self.cqs.get_mut(&cq) {
                c.qps.retain(|q| *q != t);
                c.ready.retain(|wc| wc.id != t);
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn post_send_ud(
        &mut self,
        proc: u64,
        t: u64,
        wr_id: u64,
        signaled: bool,
        dest: &cm_core::UdParam,
        imm: Option<u32>,
        data: &[u8],
    ) -> Result<(), i32> {
        if data.len() > proto::MAX_MESSAGE as usize {
            return Err(libc::EINVAL);
        }
        let (id, mut host) = self.id_of(proc, t)?;
        match imm {
            None => host.post_send_to(id, wr_id, dest, data),
            Some(imm) => host.post_send_to_with_imm(id, wr_id, dest, data, imm),
        }
        .map_err(|e| errno_of(&e))?;
        self.sent(t, signaled, data.len());
        Ok(())
    }

    /// A send of `len` bytes was posted on `t`: whether its success is reported, and the
    /// length it reports.
    fn sent(&mut self, t: u64, signaled: bool, len: usize) {
        if let Some(e) = self.ids.get_mut(&t) {
            let visible = signaled || e.sq_sig_all;
            e.sends.push_back((visible, len as u32));
        }
    }

    /// An RDMA WRITE or READ of the caller's registered memory (`local`: address, length,
    /// lkey) to or from `remote` at the QP's peer, carried out by the simulator.
    #[allow(clippy::too_many_arguments)]
    fn post_rdma(
        &mut self,
        proc: u64,
        t: u64,
        wr_id: u64,
        signaled: bool,
        kind: OneSided,
        remote: RemoteAddr,
        local: &[(u64, u32, u32)],
    ) -> Result<(), i32> {
        // The port's max_msg_sz, as the library checks before sending (a client that
        // does not is refused here).
        let total: u64 = local.iter().map(|&(_, len, _)| u64::from(len)).sum();
        if total > u64::from(proto::MAX_MESSAGE) {
            return Err(libc::EINVAL);
        }
        if self.vqps.contains_key(&t) {
            return self.post_rdma_verbs(proc, t, wr_id, signaled, kind, remote, local);
        }
        let (id, mut host) = self.id_of(proc, t)?;
        let sq_sig_all = match self.ids.get(&t) {
            Some(e) if e.has_qp && !e.ud => e.sq_sig_all,
            _ => return Err(libc::EINVAL),
        };
        let sges = self.local_sges(proc, local, Some(id))?;
        let op = kind.op(self.remote_of(t, id, remote.rkey, remote.addr));
        let mut wr = SendWr::new(wr_id, op, &sges);
        wr.signaled = signaled || sq_sig_all;
        host.post_send_wr(id, &wr).map_err(|e| errno_of(&e))
    }

    /// An `IBV_WR_SEND_WITH_IMM` of the caller's registered memory (`local`: address, length,
    /// lkey) on connected QP `t` (an id's or a verbs one), gathered by the simulator. Its
    /// completion is filtered and sized as a [`PostSend`](Request::PostSend)'s, in the same
    /// order on the QP's send queue, so the simulator reports every one.
    fn post_send_imm(
        &mut self,
        proc: u64,
        t: u64,
        wr_id: u64,
        signaled: bool,
        imm: u32,
        local: &[(u64, u32, u32)],
    ) -> Result<(), i32> {
        let total: u64 = local.iter().map(|&(_, len, _)| u64::from(len)).sum();
        if total > u64::from(proto::MAX_MESSAGE) {
            return Err(libc::EINVAL);
        }
        let via = if self.vqps.contains_key(&t) {
            if self.vqps[&t].ud {
                return Err(libc::EINVAL);
            }
            None
        } else {
            let (id, _) = self.id_of(proc, t)?;
            match self.ids.get(&t) {
                Some(e) if e.has_qp && !e.ud => Some(id),
                _ => return Err(libc::EINVAL),
            }
        };
        let sges = self.local_sges(proc, local, via)?;
        let wr = SendWr::new(wr_id, SendOp::Send { imm: Some(imm) }, &sges);
        match via {
            Some(id) => {
                let (_, mut host) = self.id_of(proc, t)?;
                host.post_send_wr(id, &wr).map_err(|e| errno_of(&e))?;
                self.sent(t, signaled, total as usize);
            }
            None => {
                let (handle, mut host) = self.vqp_of(proc, t)?;
                host.verbs_post_send_wr(handle, &wr).map_err(|e| errno_of(&e))?;
                let e = self.vqps.get_mut(&t).expect("checked above");
                let visible = signaled || e.sq_sig_all;
                e.sends.push_back((visible, total as u32));
            }
        }
        Ok(())
    }

    /// [`post_rdma`](Self::post_rdma) on verbs QP `t`: the remote region is one of the
    /// process whose QP `t`'s RTR names.
    #[allow(clippy::too_many_arguments)]
    fn post_rdma_verbs(
        &mut self,
        proc: u64,
        t: u64,
        wr_id: u64,
        signaled: bool,
        kind: OneSided,
        remote: RemoteAddr,
        local: &[(u64, u32, u32)],
    ) -> Result<(), i32> {
        let (handle, mut host) = self.vqp_of(proc, t)?;
        let (sq_sig_all, dest) = {
            let e = &self.vqps[&t];
            (e.sq_sig_all, u64::from(e.dest))
        };
        let sges = self.local_sges(proc, local, None)?;
        let owner = self.vqps.get(&dest).map(|e| e.proc);
        let remote = match (owner, self.mrs.get(&remote.rkey)) {
            (Some(owner), Some(m)) if m.proc == owner => {
                let base = m.addr;
                match self.sim_region(remote.rkey, owner, None) {
                    Some((_, sim_addr, sim_rkey)) => RemoteAddr {
                        addr: sim_addr.wrapping_add(remote.addr.wrapping_sub(base)),
                        rkey: sim_rkey,
                    },
                    None => NOWHERE,
                }
            }
            _ => NOWHERE,
        };
        let op = kind.op(remote);
        let mut wr = SendWr::new(wr_id, op, &sges);
        wr.signaled = signaled || sq_sig_all;
        host.verbs_post_send_wr(handle, &wr).map_err(|e| errno_of(&e))
    }

    /// Moves every completion the simulator has for the QPs of `cq` into their CQs' queues:
    /// sends to the send CQ (successful unsignaled ones dropped), receives to the receive CQ.
    fn collect_completions(&mut self, cq: u64) {
        let qps = self.cqs.get(&cq).map(|c| c.qps.clone()).unwrap_or_default();
        let mut wcs = Vec::new();
        for t in qps {
            if self.vqps.contains_key(&t) {
                self.collect_verbs_completions(t);
                continue;
            }
            let Some(e) = self.ids.get(&t) else { continue };
            let Some(p) = self.procs.get(&e.proc) else {
                continue;
            };
            let mut host = p.host.clone();
            wcs.clear();
            if host.try_poll_cq(e.handle, &mut wcs, usize::MAX).is_err() {
                continue;
            }
            for wc in wcs.drain(..) {
                let e = self.ids.get_mut(&t).expect("looked up above");
                let (ud, handle) = (e.ud, e.handle);
                let sender = wc.sender.filter(|_| ud && wc.status == WcStatus::Success);
                let Some((target, mut wire)) = wire_wc(t, wc, &mut e.sends, (e.send_cq, e.recv_cq)) else {
                    continue;
                };
                if let Some(from) = sender {
                    let local = host.get_local_addr(handle).ok().flatten().map(|a| a.ip());
                    with_grh(&mut wire, from.addr, local, from.qp_num);
                }
                if let Some(c) = self.cqs.get_mut(&target) {
                    c.fresh = true;
                    c.ready.push_back(wire);
                }
            }
        }
    }

    /// Moves verbs QP `t`'s completions into its CQs, as
    /// [`collect_completions`](Self::collect_completions) does an id's.
    fn collect_verbs_completions(&mut self, t: u64) {
        let Some(e) = self.vqps.get(&t) else { return };
        let Some(p) = self.procs.get(&e.proc) else { return };
        let mut host = p.host.clone();
        let mut wcs: Vec<WorkCompletion> = Vec::new();
        if host
            .verbs_poll_cq(e.handle, &mut wcs, usize::MAX, Duration::ZERO)
            .is_err()
        {
            return;
        }
        let local = Some(host.addr());
        for wc in wcs {
            let e = self.vqps.get_mut(&t).expect("looked up above");
            let sender = wc.sender.filter(|_| e.ud && wc.status == WcStatus::Success);
            let Some((target, mut wire)) = wire_wc(t, wc, &mut e.sends, (e.send_cq, e.recv_cq)) else {
                continue;
            };
            if let Some(from) = sender {
                // A verbs QP is named by its token, as its process sees it.
                let src_qp = self
                    .vqp_by_sim
                    .get(&from.qp_num)
                    .map_or(from.qp_num, |&t| t as u32);
                with_grh(&mut wire, from.addr, local, src_qp);
            }
            if let Some(c) = self.cqs.get_mut(&target) {
                c.fresh = true;
                c.ready.push_back(wire);
            }
        }
    }

    /// The simulator's entries for the caller's memory `local` (address, length, lkey), each
    /// inside one of the caller's regions, registered on the device of id `via` (`None`: the
    /// host's device, as a verbs QP's); `EINVAL` for memory no region of the caller's holds.
    fn local_sges(
        &mut self,
        proc: u64,
        local: &[(u64, u32, u32)],
        via: Option<IdHandle>,
    ) -> Result<Vec<Sge>, i32> {
        let mut sges = Vec::with_capacity(local.len());
        for &(addr, len, lkey) in local {
            let key = self.local_key(proc, addr, len, lkey).ok_or(libc::EINVAL)?;
            let base = self.mrs[&key].addr;
            let (handle, _, _) = self.sim_region(key, proc, via).ok_or(libc::EINVAL)?;
            sges.push(Sge::new(handle, addr - base, len));
        }
        Ok(sges)
    }

    /// The key of process `proc`'s region that holds `len` bytes at `addr` for a local entry:
    /// the one `lkey` names, or, for inline data (whose `lkey` verbs ignores), any of its
    /// regions that holds them.
    fn local_key(&self, proc: u64, addr: u64, len: u32, lkey: u32) -> Option<u32> {
        let holds = |m: &MrEntry| {
            m.proc == proc
                && addr >= m.addr
                && addr
                    .checked_add(u64::from(len))
                    .is_some_and(|end| end <= m.addr.saturating_add(m.len))
        };
        if self.mrs.get(&lkey).is_some_and(holds) {
            return Some(lkey);
        }
        let mut keys: Vec<u32> = self
            .mrs
            .iter()
            .filter(|(_, m)| holds(m))
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        keys.first().copied()
    }

    /// The simulator's handle, address and rkey for region `key` of process `owner`,
    /// registering it on first use through `via`, an id of that process (bound to the device
    /// of its host, as registering needs), or on the host's device itself (`None`: for verbs
    /// QPs, which no id names).
    fn sim_region(&mut self, key: u32, owner: u64, via: Option<IdHandle>) -> Option<(MrHandle, u64, u32)> {
        let m = self.mrs.get(&key).filter(|m| m.proc == owner)?;
        if let Some(known) = m.sim {
            return Some(known);
        }
        let p = self.procs.get(&owner)?;
        let mut host = p.host.clone();
        let access = Access::from_bits(m.access & Access::ALL.bits())?;
        let memory = ProcessMemory {
            pid: p.pid,
            pidfd: p.pidfd.clone(),
            addr: m.addr,
            len: m.len,
        };
        let handle = match via {
            Some(id) => host.reg_mr_with(id, Box::new(memory), access),
            None => host.device_reg_mr_with(Box::new(memory), access),
        }
        .ok()?;
        let info = host.mr_info(handle).ok()?;
        let known = (handle, info.addr, info.rkey);
        self.mrs.get_mut(&key)?.sim = Some(known);
        Some(known)
    }

    /// Where a READ or WRITE on QP `t` goes in the simulator: the region `rkey` names at the
    /// QP's connected peer, at `remote_addr`'s offset in it. A key of anyone else's (or of
    /// nobody's) names nothing there, so the peer's NIC answers `REM_ACCESS_ERR`, and an
    /// address before the region's start wraps to one past every region's end.
    fn remote_of(&mut self, t: u64, id: IdHandle, rkey: u32, remote_addr: u64) -> RemoteAddr {
        let Some(mut host) = self
            .ids
            .get(&t)
            .and_then(|e| self.procs.get(&e.proc))
            .map(|p| p.host.clone())
        else {
            return NOWHERE;
        };
        let peer = host
            .get_local_addr(id)
            .ok()
            .flatten()
            .zip(host.get_peer_addr(id).ok().flatten())
            .and_then(|(l, p)| self.endpoints.get(&(p, l)))
            .and_then(|peer| self.ids.get(peer))
            .map(|e| (e.proc, e.handle));
        let Some((owner, peer_id)) = peer else {
            return NOWHERE;
        };
        let Some(base) = self.mrs.get(&rkey).filter(|m| m.proc == owner).map(|m| m.addr) else {
            return NOWHERE;
        };
        match self.sim_region(rkey, owner, Some(peer_id)) {
            Some((_, sim_addr, sim_rkey)) => RemoteAddr {
                addr: sim_addr.wrapping_add(remote_addr.wrapping_sub(base)),
                rkey: sim_rkey,
            },
            None => NOWHERE,
        }
    }

    /// Drops region `key`, from the simulator too.
    fn forget_region(&mut self, key: u32) {
        let Some(m) = self.mrs.remove(&key) else { return };
        if let (Some((handle, _, _)), Some(p)) = (m.sim, self.procs.get(&m.proc)) {
            let _ = p.host.clone().dereg_mr(handle);
        }
    }

    /// Forgets a destroyed QP's CQ memberships (its unpolled completions go with it).
    fn qp_gone(&mut self, t: u64) {
        let Some(e) = self.ids.get_mut(&t) else { return };
        e.has_qp = false;
        e.sends.clear();
        for cq in [std::mem::take(&mut e.send_cq), std::mem::take(&mut e.recv_cq)] {
            if let Some(c) = self.cqs.get_mut(&cq) {
                c.qps.retain(|q| *q != t);
                c.ready.retain(|wc| wc.id != t);
            }
        }
    }

    fn register_id(&mut self, proc: u64, host: usize, id: IdHandle) -> u64 {
        let t = self.id_token();
        self.ids.insert(
            t,
            IdEntry {
                proc,
                handle: id,
                host,
                has_qp: false,
                send_cq: 0,
                recv_cq: 0,
                sq_sig_all: true,
                sends: VecDeque::new(),
                ud: false,
            },
        );
        self.id_tokens.insert((host, id), t);
        if let Some(p) = self.procs.get_mut(&proc) {
            p.ids.insert(t);
        }
        t
    }

    fn forget_id(&mut self, t: u64) {
        self.listening.remove(&t);
        self.endpoints.retain(|_, v| *v != t);
        if let Some(e) = self.ids.remove(&t) {
            self.id_tokens.remove(&(e.host, e.handle));
            if let Some(p) = self.procs.get_mut(&e.proc) {
                p.ids.remove(&t);
            }
        }
        self.outstanding.remove(&t);
    }

    fn ack_event(&mut self, proc: u64, n: u64) -> Result<(), i32> {
        // Only the process the event went to may ack it: another's ack is refused and leaves
        // the event outstanding.
        if self.events.get(&n).is_none_or(|&(to, _, _)| to != proc) {
            return Err(libc::EINVAL);
        }
        let Some((_, counted, ev)) = self.events.remove(&n) else {
            return Err(libc::EINVAL);
        };
        if let Some(set) = self.outstanding.get_mut(&counted) {
            set.remove(&n);
        }
        let Some(e) = self.ids.get(&counted) else {
            return Ok(());
        };
        let Some(p) = self.procs.get(&e.proc) else {
            return Ok(());
        };
        let mut host = p.host.clone();
        // A crashed host has forgotten the event with the id: nothing is left to give back.
        let _ = host.ack_cm_event(ev);
        Ok(())
    }

    fn ack_outstanding(&mut self, t: u64) {
        let nos: Vec<u64> = self
            .outstanding
            .get(&t)
            .map(|s| s.iter().copied().collect())
            .unwrap_or_default();
        let mut nos = nos;
        nos.sort_unstable();
        for n in nos {
            // The daemon acks on the owner's behalf (its id or process is going).
            if let Some(&(to, _, _)) = self.events.get(&n) {
                let _ = self.ack_event(to, n);
            }
        }
    }

    /// Raises one event on the channel of every armed CQ that got a completion.
    fn pump_completion_events(&mut self) {
        let mut armed: Vec<u64> = self
            .cqs
            .iter()
            .filter(|(_, c)| c.armed && c.channel != 0)
            .map(|(t, _)| *t)
            .collect();
        armed.sort_unstable();
        for cq in armed {
            self.collect_completions(cq);
            let c = self.cqs.get_mut(&cq).expect("listed above");
            if !c.fresh {
                continue;
            }
            c.armed = false;
            c.fresh = false;
            let channel = c.channel;
            let mut e = Enc::default();
            e.u8(proto::CHAN_COMP).u64(cq);
            if let Some(ch) = self.comp_channels.get_mut(&channel) {
                ch.pending.push_back(e.0);
                flush(&ch.sock, &mut ch.pending);
            }
        }
    }

    /// Moves due events from the simulator into the channel sockets that have room.
    fn pump_events(&mut self) {
        let chans: Vec<u64> = self.channels.keys().copied().collect();
        for ct in chans {
            self.flush_pending(ct);
            while let Some(c) = self.channels.get(&ct) {
                if c.sock.is_none() || !c.pending.is_empty() {
                    break;
                }
                let (proc, handle) = (c.proc, c.handle);
                let Some(p) = self.procs.get(&proc) else { break };
                let mut host = p.host.clone();
                let ev = match host.try_get_cm_event(handle) {
                    Ok(Some(ev)) => ev,
                    _ => break,
                };
                let dgram = self.wire_event(proc, &mut host, ev);
                let c = self.channels.get_mut(&ct).expect("channel checked above");
                c.pending.push_back(dgram);
                self.flush_pending(ct);
            }
        }
    }

    fn flush_pending(&mut self, ct: u64) {
        if let Some(c) = self.channels.get_mut(&ct) {
            flush(&c.sock, &mut c.pending);
        }
    }

    fn wire_event(&mut self, proc: u64, host: &mut SimHost, ev: CmEvent) -> Vec<u8> {
        let hi = host.index();
        let id_token = match self.id_tokens.get(&(hi, ev.id())) {
            Some(&t) => t,
            // A CONNECT_REQUEST's child id is new: it belongs to the listener's process.
            None => self.register_id(proc, hi, ev.id()),
        };
        let listen_token = ev
            .listen_id()
            .and_then(|l| self.id_tokens.get(&(hi, l)).copied())
            .unwrap_or(0);
        let counted = self
            .id_tokens
            .get(&(hi, ev.counted_id()))
            .copied()
            .unwrap_or(id_token);
        let p = ev.param();
        let mut param = ConnParam {
            private_data: cm_core::PrivateData::new(ev.private_data()),
            ..*p
        };
        let local = host.get_local_addr(ev.id()).ok().flatten();
        let peer = host.get_peer_addr(ev.id()).ok().flatten();
        if matches!(
            ev.event(),
            cm_core::CmEventType::ConnectRequest
                | cm_core::CmEventType::ConnectResponse
                | cm_core::CmEventType::Established
        ) {
            if let Some(&remote) = local.zip(peer).and_then(|(l, p)| self.endpoints.get(&(p, l))) {
                param.qp_num = remote as u32;
            }
        }
        let n = self.token();
        let wire = WireEvent {
            event_no: n,
            id: id_token,
            listen_id: listen_token,
            event: ev.event().raw(),
            status: ev.status(),
            param,
            local,
            peer,
            ud: ev.ud_param().copied(),
        };
        if self.debug {
            eprintln!(
                "cmsim-daemon: -> {} {:?}",
                self.procs.get(&proc).map_or("?", |p| p.name.as_str()),
                wire
            );
        }
        self.outstanding.entry(counted).or_default().insert(n);
        self.events.insert(n, (proc, counted, ev));
        let mut e = Enc::default();
        e.event(&wire);
        e.0
    }

    /// Gives back everything a process held, as the kernel does when a process dies.
    fn detach(&mut self, proc: u64) {
        // The process stays registered until its ids are gone: acking their events needs it.
        let Some(p) = self.procs.get(&proc) else { return };
        let mut host = p.host.clone();
        let mut ids: Vec<u64> = p.ids.iter().copied().collect();
        ids.sort_unstable();
        for t in &ids {
            self.ack_outstanding(*t);
        }
        for t in ids {
            if let Some(e) = self.ids.get(&t) {
                let (handle, has_qp) = (e.handle, e.has_qp);
                if has_qp {
                    let _ = host.destroy_qp(handle);
                }
                let _ = host.destroy_id(handle);
            }
            self.forget_id(t);
        }
        let mut qps: Vec<u64> = self
            .procs
            .get(&proc)
            .map(|p| p.qps.iter().copied().collect())
            .unwrap_or_default();
        qps.sort_unstable();
        for t in qps {
            if let Some(e) = self.vqps.get(&t) {
                let _ = host.verbs_destroy_qp(e.handle);
            }
            self.vqp_gone(t);
        }
        // Its QPs are gone: nothing holds its SRQs now.
        let mut srqs: Vec<u64> = self
            .srqs
            .iter()
            .filter(|(_, e)| e.proc == proc)
            .map(|(t, _)| *t)
            .collect();
        srqs.sort_unstable();
        for t in srqs {
            if let Some(e) = self.srqs.remove(&t) {
                let _ = host.destroy_srq(e.handle);
            }
        }
        self.cqs.retain(|_, c| c.proc != proc);
        let mut keys: Vec<u32> = self
            .mrs
            .iter()
            .filter(|(_, m)| m.proc == proc)
            .map(|(k, _)| *k)
            .collect();
        keys.sort_unstable();
        for key in keys {
            self.forget_region(key);
        }
        self.comp_channels.retain(|_, c| c.proc != proc);
        let Some(p) = self.procs.remove(&proc) else { return };
        let mut chans: Vec<u64> = p.channels.iter().copied().collect();
        chans.sort_unstable();
        for ct in chans {
            if let Some(c) = self.channels.remove(&ct) {
                let _ = host.destroy_event_channel(c.handle);
            }
        }
        eprintln!("cmsim-daemon: {} detached", p.name);
    }

    /// Checks a hello's stated pid against the kernel's word: the process that connected
    /// (`SO_PEERCRED`) and the one that sent the hello (`SCM_CREDENTIALS`) must both be it,
    /// so no process can have the daemon act on (and reach the memory of) another. Returns the
    /// process's pidfd, or the errno the hello is refused with.
    fn check_hello(
        &mut self,
        conn: &SeqConn,
        stated: u32,
        sender: Option<u32>,
        name: &str,
    ) -> Result<ProcessFd, i32> {
        let connected = sock::peer(conn.as_raw_fd()).map(|p| p.pid).ok();
        if connected != Some(stated) || sender != Some(stated) {
            eprintln!(
                "cmsim-daemon: {name}: hello refused: it says pid {stated}, the kernel says pid {} connected and pid {} sent it",
                connected.map_or("?".into(), |p| p.to_string()),
                sender.map_or("?".into(), |p| p.to_string()),
            );
            return Err(libc::EPERM);
        }
        let mut opened = ProcessFd::open(stated);
        if matches!(&opened, Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)))
            && !self.fresh.is_empty()
        {
            // Out of fds: a program is worth more than the oldest connection that said nothing.
            self.fresh.remove(0);
            opened = ProcessFd::open(stated);
        }
        opened.map_err(|e| {
            eprintln!("cmsim-daemon: {name}: hello refused: pidfd_open: {e}");
            if e.raw_os_error() == Some(libc::ESRCH) {
                libc::ESRCH
            } else {
                libc::EAGAIN
            }
        })
    }

    fn on_fresh(&mut self, conn: SeqConn) {
        let mut buf = Vec::new();
        let sender = match sock::recv_from(conn.as_raw_fd(), &mut buf, 0) {
            Ok(Received::Message { sender }) => sender,
            _ => return,
        };
        let refuse = |errno: i32| {
            let mut e = Enc::default();
            e.i32(errno);
            let _ = conn.try_send(&e.0);
        };
        match Opening::decode(&buf) {
            Ok(Opening::Hello {
                pid,
                host,
                argv0,
                version,
            }) => {
                let name = format!("{}[{pid}]@{host}", String::from_utf8_lossy(&argv0));
                if version != Some(proto::PROTOCOL_VERSION) {
                    eprintln!(
                        "cmsim-daemon: {name}: hello refused: it speaks protocol {}, this daemon {}",
                        version.map_or("(none)".into(), |v| v.to_string()),
                        proto::PROTOCOL_VERSION
                    );
                    refuse(libc::EPROTONOSUPPORT);
                    return;
                }
                let pidfd = match self.check_hello(&conn, pid, sender, &name) {
                    Ok(fd) => fd,
                    Err(errno) => {
                        refuse(errno);
                        return;
                    }
                };
                let sim_host = if host.is_empty() {
                    Some(self.fabric.host(0))
                } else {
                    host.parse::<IpAddr>()
                        .ok()
                        .and_then(|ip| self.fabric.host_by_addr(ip))
                };
                let Some(h) = sim_host else {
                    eprintln!("cmsim-daemon: {name}: no simulated host has address {host}");
                    refuse(libc::ENODEV);
                    return;
                };
                let t = self.token();
                let welcome = Welcome {
                    proc: t,
                    host_index: h.index() as u32,
                    host_addr: h.addr(),
                    daemon_pid: std::process::id(),
                };
                if conn.try_send(&welcome.encode().0).is_ok() {
                    eprintln!("cmsim-daemon: {name} attached as host {}", h.index());
                    self.procs.insert(
                        t,
                        Proc {
                            ctrl: conn,
                            pid,
                            pidfd: std::rc::Rc::new(pidfd),
                            host: h,
                            name,
                            ids: HashSet::new(),
                            qps: HashSet::new(),
                            channels: HashSet::new(),
                            closed: Vec::new(),
                            unsent: None,
                        },
                    );
                    self.attached_total += 1;
                }
            }
            Ok(Opening::ProbeListener { addr }) => {
                let found = addr.is_some_and(|w| {
                    self.listening
                        .values()
                        .any(|l| l.port() == w.port() && (l.ip() == w.ip() || l.ip().is_unspecified()))
                });
                let mut e = Enc::default();
                e.i32(0).u8(found as u8);
                let _ = conn.try_send(&e.0);
            }
            Ok(Opening::FabricHosts) => {
                let reply = FabricHosts {
                    loopback: loopback_block(std::process::id()),
                    hosts: (0..self.fabric.host_count())
                        .map(|i| self.fabric.host(i).addr())
                        .collect(),
                };
                let _ = conn.try_send(&reply.encode().0);
            }
            Ok(Opening::AttachCompChannel { proc, channel }) => {
                if !self.sent_by_owner(proc, sender) {
                    return;
                }
                if let Some(c) = self.comp_channels.get_mut(&channel) {
                    if c.proc == proc && c.sock.is_none() {
                        let mut e = Enc::default();
                        e.u8(proto::CHAN_ATTACHED);
                        if conn.try_send(&e.0).is_ok() {
                            c.sock = Some(conn);
                            flush(&c.sock, &mut c.pending);
                        }
                    }
                }
            }
            Ok(Opening::AttachChannel { proc, channel }) => {
                if !self.sent_by_owner(proc, sender) {
                    return;
                }
                if let Some(c) = self.channels.get_mut(&channel) {
                    if c.proc == proc && c.sock.is_none() {
                        let mut e = Enc::default();
                        e.u8(proto::CHAN_ATTACHED);
                        if conn.try_send(&e.0).is_ok() {
                            c.sock = Some(conn);
                        }
                    }
                }
            }
            Err(_) if buf.first_chunk::<4>().map(|b| u32::from_le_bytes(*b)) == Some(Op::Hello as u32) => {
                // Cut short, or a host that is not text: not a hello to guess at.
                eprintln!("cmsim-daemon: a malformed hello refused");
                refuse(libc::EPROTO);
            }
            Err(_) => {}
        }
    }

    /// Whether a datagram naming process `proc` came from that process (a channel socket's
    /// attach): a token learnt another way does not let a process take over another's channel.
    fn sent_by_owner(&self, proc: u64, sender: Option<u32>) -> bool {
        match self.procs.get(&proc) {
            Some(p) if sender == Some(p.pid) => true,
            Some(p) => {
                eprintln!(
                    "cmsim-daemon: a channel attach for {} from pid {} refused",
                    p.name,
                    sender.map_or("?".into(), |s| s.to_string())
                );
                false
            }
            None => false,
        }
    }

    /// Accepts a connection. When the daemon has no fd left, the oldest connection that has
    /// not said its first message makes room (or, with none, the new one is closed at once,
    /// so the listener does not stay readable and spin the loop).
    fn accept(&mut self) {
        match self.listener.accept() {
            Ok(c) => {
                // The kernel's pid with every request (see `check_hello` and
                // `serve_process`): taken over from the listener, and asked for again here
                // should a kernel not pass it on.
                if sock::pass_credentials(c.as_raw_fd()).is_err() {
                    return;
                }
                if self.fresh.len() >= MAX_SILENT {
                    self.fresh.remove(0);
                }
                self.fresh.push((c, Instant::now()));
            }
            Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                if !self.fresh.is_empty() {
                    self.fresh.remove(0);
                } else {
                    self.spare_fd = None;
                    if let Ok(c) = self.listener.accept() {
                        drop(c);
                    }
                    self.spare_fd = std::fs::File::open("/dev/null").ok();
                }
                if !self.said_out_of_fds {
                    eprintln!("cmsim-daemon: accept: {e}; the oldest silent connection (or the new one) is closed to make room");
                    self.said_out_of_fds = true;
                }
            }
            Err(_) => {}
        }
    }

    /// Serves what process `p` has queued, so one slow poll round does not serialise a
    /// multi-threaded caller, until its socket has no room for a reply: then it waits (only
    /// this process does) until it reads.
    fn serve_process(&mut self, p: u64, buf: &mut Vec<u8>) {
        while let Some(proc) = self.procs.get(&p) {
            if proc.unsent.is_some() {
                return;
            }
            let sender = match sock::recv_from(proc.ctrl.as_raw_fd(), buf, libc::MSG_DONTWAIT) {
                Ok(Received::Message { sender }) => sender,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Ok(Received::End) | Err(_) => {
                    self.detach(p);
                    return;
                }
            };
            if sender != Some(proc.pid) {
                // A forked child writing on its parent's socket (the library attaches a child
                // as a process of its own, so only a program that bypasses it gets here): it
                // is not its parent. Not answered either: the answer would be read by the
                // parent as the reply to its own next request.
                eprintln!(
                    "cmsim-daemon: a request on {}'s socket from pid {} refused",
                    proc.name,
                    sender.map_or("?".into(), |s| s.to_string())
                );
                continue;
            }
            if Dec::new(buf).u32().ok() == Some(Op::AckEvent as u32) {
                // Acks are not answered: the library does not wait a round trip for them.
                let mut d = Dec::new(buf);
                let _ = d.u32();
                let refused = match d.u64() {
                    Ok(n) => self.ack_event(p, n).err().map(|_| n.to_string()),
                    Err(_) => Some("(malformed)".to_string()),
                };
                if let (Some(n), Some(proc)) = (refused, self.procs.get(&p)) {
                    eprintln!(
                        "cmsim-daemon: {}: ack of event {n} refused: not an event it was given, or acked already",
                        proc.name
                    );
                }
                continue;
            }
            let mut reply = self.handle_request(p, buf);
            if self.debug {
                let op = Dec::new(buf).u32().ok().and_then(Op::from_u32);
                let status = Dec::new(&reply).i32().unwrap_or(-1);
                eprintln!(
                    "cmsim-daemon: <- {} {op:?} = {status}",
                    self.procs.get(&p).map_or("?", |p| p.name.as_str())
                );
            }
            if reply.len() > sock::MAX_DATAGRAM {
                // Never a reply the caller cannot receive: it would wait for it for ever.
                let mut e = Enc::default();
                e.i32(libc::EMSGSIZE);
                reply = e.0;
            }
            let Some(proc) = self.procs.get_mut(&p) else {
                return;
            };
            match proc.ctrl.try_send(&reply) {
                Ok(()) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    proc.unsent = Some((reply, Instant::now()));
                    return;
                }
                Err(_) => {
                    self.detach(p);
                    return;
                }
            }
        }
    }

    /// Sends process `p`'s waiting reply if its socket has room now.
    fn send_unsent(&mut self, p: u64) {
        let Some(proc) = self.procs.get_mut(&p) else {
            return;
        };
        let Some((reply, _)) = &proc.unsent else { return };
        match proc.ctrl.try_send(reply) {
            Ok(()) => proc.unsent = None,
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
            Err(_) => self.detach(p),
        }
    }

    fn run(&mut self, opts: &Options) -> i32 {
        let mut buf = Vec::new();
        loop {
            let signal = STOP_SIGNAL.load(Ordering::Relaxed);
            if signal != 0 {
                eprintln!(
                    "cmsim-daemon: stopped by signal {signal}; {} still attached",
                    self.procs.len()
                );
                return 128 + signal;
            }
            if let Some(n) = opts.processes {
                if self.attached_total >= n && self.procs.is_empty() {
                    return 0;
                }
            }
            if self.started.elapsed() > opts.max_wall {
                eprintln!("cmsim-daemon: gave up after {:?}; still attached:", opts.max_wall);
                for p in self.procs.values() {
                    eprintln!("  {}", p.name);
                }
                return 3;
            }
            // What to watch, in a fixed order: listener, fresh, control sockets, channel sockets.
            let mut fds: Vec<(RawFd, Interest)> = vec![(self.listener.as_raw_fd(), Interest::Read)];
            // Silent too long: closed (the peer reads the end).
            self.fresh
                .retain(|(_, since)| since.elapsed() < FIRST_MESSAGE_WITHIN);
            let nfresh = self.fresh.len();
            fds.extend(self.fresh.iter().map(|(c, _)| (c.as_raw_fd(), Interest::Read)));
            // A process that has not read its reply for too long is cut off.
            let stalled: Vec<u64> = self
                .procs
                .iter()
                .filter(|(_, p)| {
                    p.unsent
                        .as_ref()
                        .is_some_and(|(_, since)| since.elapsed() >= REPLY_READ_WITHIN)
                })
                .map(|(t, _)| *t)
                .collect();
            for p in stalled {
                eprintln!(
                    "cmsim-daemon: {} has not read its replies for {REPLY_READ_WITHIN:?}: cut off",
                    self.procs[&p].name
                );
                self.detach(p);
            }
            let mut procs: Vec<u64> = self.procs.keys().copied().collect();
            procs.sort_unstable();
            // A process with a reply waiting is watched for room, not for more requests.
            fds.extend(procs.iter().map(|p| {
                let waiting = self.procs[p].unsent.is_some();
                (
                    self.procs[p].ctrl.as_raw_fd(),
                    if waiting { Interest::Write } else { Interest::Read },
                )
            }));
            fds.extend(
                procs
                    .iter()
                    .map(|p| (self.procs[p].pidfd.as_raw_fd(), Interest::Read)),
            );
            let closed: Vec<(u64, usize)> = procs
                .iter()
                .flat_map(|p| (0..self.procs[p].closed.len()).map(move |i| (*p, i)))
                .collect();
            fds.extend(
                closed
                    .iter()
                    .map(|(p, i)| (self.procs[p].closed[*i].as_raw_fd(), Interest::HangUp)),
            );
            let mut chans: Vec<u64> = self
                .channels
                .iter()
                .filter(|(_, c)| !c.pending.is_empty())
                .map(|(t, _)| *t)
                .collect();
            chans.sort_unstable();
            fds.extend(chans.iter().filter_map(|t| {
                self.channels[t]
                    .sock
                    .as_ref()
                    .map(|s| (s.as_raw_fd(), Interest::Write))
            }));
            // (Channel sockets are only ever written: their ends in the programs say nothing
            // after the attach, and whatever they send is never read, nor waited for.)
            // The fabric has timers (CM timeouts, timewait) this loop cannot see: a short tick
            // keeps the virtual clock close to the wall clock.
            let ready = match sock::poll(&fds, 1) {
                Ok(r) => r,
                Err(e) => {
                    eprintln!("cmsim-daemon: poll: {e}");
                    return 2;
                }
            };
            self.sync_clock();
            let fresh_ready: Vec<bool> = ready[1..1 + nfresh]
                .iter()
                .map(|r| r.readable || r.closed)
                .collect();
            // The ready ones leave `fresh` first: the others stay in it while these are
            // served, as the connections to close should the daemon run out of fds.
            let mut spoken = Vec::new();
            for (i, entry) in std::mem::take(&mut self.fresh).into_iter().enumerate() {
                if fresh_ready.get(i).copied().unwrap_or(false) {
                    spoken.push(entry.0);
                } else {
                    self.fresh.push(entry);
                }
            }
            for c in spoken {
                self.on_fresh(c);
            }
            if ready[0].readable {
                self.accept();
            }
            let nprocs = procs.len();
            // Destroyed channels whose program end has closed: their sockets go (highest index
            // first, so the others keep theirs).
            let base = 1 + nfresh + 2 * nprocs;
            for (k, (p, i)) in closed.iter().enumerate().rev() {
                if ready[base + k].closed {
                    if let Some(proc) = self.procs.get_mut(p) {
                        proc.closed.swap_remove(*i);
                    }
                }
            }
            for (i, p) in procs.iter().enumerate() {
                // The process exited: gone at once, whoever still holds its socket (a forked
                // child), so its regions are no longer anyone's to reach.
                let exited = ready[1 + nfresh + nprocs + i];
                if exited.readable || exited.closed {
                    self.detach(*p);
                    continue;
                }
                let r = ready[1 + nfresh + i];
                if r.writable {
                    self.send_unsent(*p);
                }
                if r.readable || r.closed || r.writable {
                    self.serve_process(*p, &mut buf);
                }
            }
            self.pump_events();
            self.pump_completion_events();
        }
    }
}

/// The signal (SIGINT or SIGTERM) that asked the daemon to stop, 0 while none has: the loop
/// sees it within its 1 ms tick and the daemon then ends as at any other end, writing its trace
/// and removing its socket.
static STOP_SIGNAL: AtomicI32 = AtomicI32::new(0);

extern "C" fn on_stop_signal(signal: libc::c_int) {
    STOP_SIGNAL.store(signal, Ordering::Relaxed);
}

/// A generator seeded from the kernel's randomness (`/dev/urandom`).
fn token_rng() -> rand_chacha::ChaCha8Rng {
    use rand_chacha::rand_core::SeedableRng;
    let mut seed = [0u8; 32];
    match std::fs::File::open("/dev/urandom").and_then(|mut f| io::Read::read_exact(&mut f, &mut seed)) {
        Ok(()) => rand_chacha::ChaCha8Rng::from_seed(seed),
        Err(e) => {
            eprintln!("cmsim-daemon: /dev/urandom: {e}");
            std::process::exit(2);
        }
    }
}

fn catch_stop_signals() {
    for signal in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: the handler only stores to an atomic, which is async-signal-safe, and lives
        // for the whole program; `signal` replaces no handler anything else relies on.
        unsafe {
            libc::signal(
                signal,
                on_stop_signal as extern "C" fn(libc::c_int) as libc::sighandler_t,
            )
        };
    }
}

/// The key after `last` that no live region has (`taken`, `live` of them; 0 is never a key),
/// and `last` moved to it: after 2^32 registrations the counter comes round, and a key still
/// in use must not name a second region. `None` when every key is taken.
fn next_free_key(last: &mut u32, taken: impl Fn(u32) -> bool, live: usize) -> Option<u32> {
    if live >= u32::MAX as usize {
        return None;
    }
    loop {
        *last = last.wrapping_add(1).max(1);
        if !taken(*last) {
            return Some(*last);
        }
    }
}

fn main() {
    let opts = match parse_args() {
        Ok(o) => o,
        Err(msg) => {
            eprintln!("{msg}");
            std::process::exit(2);
        }
    };
    let mut b = SimFabric::builder();
    for h in &opts.hosts {
        b = b.host(h);
    }
    if let Some(s) = opts.seed {
        b = b.seed(s);
    }
    if let Some((response, lifetime)) = opts.cm_timeouts {
        b = b.cm_timeouts(response, lifetime);
    }
    if !opts.faults.is_empty() {
        b = b.faults(opts.faults.clone());
    }
    let fabric = match b.try_build() {
        Ok(f) => f,
        Err(e) => {
            eprintln!("cmsim-daemon: {e}");
            std::process::exit(2);
        }
    };
    // The trace files are made now: one that cannot be written is said before anyone attaches,
    // not after the run.
    for path in [&opts.trace, &opts.trace_mermaid].into_iter().flatten() {
        if let Err(e) = std::fs::File::create(path) {
            eprintln!("cmsim-daemon: {}: {e}", path.display());
            std::process::exit(2);
        }
    }
    catch_stop_signals();
    sock::raise_fd_limit();
    // The kernel's pid with every datagram, asked for on the listener: each connection takes
    // it over as it is accepted, so the first datagrams are named too. Asked for only once
    // accepted, a hello sent between the accept and the asking read as pid 0's and was
    // refused as naming another process.
    let listener = match SeqListener::bind(&opts.socket, opts.socket_mode)
        .and_then(|l| sock::pass_credentials(l.as_raw_fd()).map(|()| l))
    {
        Ok(l) => l,
        Err(e) => {
            eprintln!("cmsim-daemon: {}: {e}", opts.socket.display());
            std::process::exit(2);
        }
    };
    eprintln!(
        "cmsim-daemon: listening on {} ({})",
        opts.socket.display(),
        fabric.repro_line()
    );
    let mut d = Daemon {
        fabric,
        listener,
        fresh: Vec::new(),
        procs: HashMap::new(),
        ids: HashMap::new(),
        vqps: HashMap::new(),
        vqp_by_sim: HashMap::new(),
        srqs: HashMap::new(),
        id_tokens: HashMap::new(),
        channels: HashMap::new(),
        cqs: HashMap::new(),
        comp_channels: HashMap::new(),
        mrs: HashMap::new(),
        next_key: 0,
        listening: HashMap::new(),
        endpoints: HashMap::new(),
        events: HashMap::new(),
        outstanding: HashMap::new(),
        next_token: 0,
        next_id: 0,
        token_rng: token_rng(),
        started: Instant::now(),
        attached_total: 0,
        spare_fd: std::fs::File::open("/dev/null").ok(),
        said_out_of_fds: false,
        debug: std::env::var_os("CMSIM_DEBUG").is_some(),
    };
    let mut code = d.run(&opts);
    let _ = std::fs::remove_file(&opts.socket);
    // A run whose trace was asked for and lost did not succeed.
    let written = |path: &PathBuf, text: String| match std::fs::write(path, text) {
        Ok(()) => true,
        Err(e) => {
            eprintln!("cmsim-daemon: {}: {e}", path.display());
            false
        }
    };
    if let Some(path) = &opts.trace {
        if !written(path, d.fabric.trace_lines().join("\n") + "\n") {
            code = code.max(1);
        }
    }
    if let Some(path) = &opts.trace_mermaid {
        if !written(path, d.fabric.trace_mermaid()) {
            code = code.max(1);
        }
    }
    println!("seed: {}", d.fabric.seed());
    println!("trace-hash: {:016x}", d.fabric.trace_hash());
    std::process::exit(code);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loopback_blocks_stay_off_127_0_and_differ_for_nearby_pids() {
        let blocks: std::collections::HashSet<_> = (0..65_024).map(loopback_block).collect();
        assert_eq!(blocks.len(), 65_024);
        assert!(blocks.iter().all(|b| {
            let o = b.octets();
            o[0] == 127 && o[1] != 0 && o[1] != 255 && o[3] == 0
        }));
        assert_eq!(loopback_block(u32::MAX), loopback_block(u32::MAX % 65_024));
    }

    #[test]
    fn region_keys_skip_zero_and_live_keys_when_the_counter_comes_round() {
        let mut last = u32::MAX - 1;
        let live = [u32::MAX, 1, 2];
        let taken = |k| live.contains(&k);
        assert_eq!(next_free_key(&mut last, taken, live.len()), Some(3));
        assert_eq!(last, 3);
        assert_eq!(next_free_key(&mut last, taken, live.len()), Some(4));
        assert_eq!(next_free_key(&mut last, |_| true, u32::MAX as usize), None);
    }

    #[test]
    fn a_link_fault_to_star_names_every_other_host() {
        assert_eq!(
            parse_fault("5:partition 2 *"),
            Ok((
                Duration::from_millis(5),
                Fault::Partition {
                    a: 2,
                    b: Fault::ALL_HOSTS
                }
            ))
        );
        assert_eq!(
            parse_fault("0:loss 0 * 300"),
            Ok((
                Duration::ZERO,
                Fault::Loss {
                    a: 0,
                    b: Fault::ALL_HOSTS,
                    per_mille: 300
                }
            ))
        );
        assert!(parse_fault("0:crash *").is_err(), "a host fault names one host");
        assert!(
            parse_fault("0:partition * 1").is_err(),
            "the first end is one host"
        );
    }

    #[test]
    fn a_drop_names_a_kind_a_way_and_which_of_its_messages_go() {
        assert_eq!(
            parse_fault("100:drop DREP 1 0 0 1"),
            Ok((
                Duration::from_millis(100),
                Fault::Drop {
                    msg: MsgKind::Drep,
                    from: 1,
                    to: 0,
                    skip: 0,
                    count: 1
                }
            ))
        );
        assert_eq!(
            parse_fault("0:drop req 0 * 2 all").map(|(_, f)| f),
            Ok(Fault::Drop {
                msg: MsgKind::Req,
                from: 0,
                to: Fault::ALL_HOSTS,
                skip: 2,
                count: u32::MAX
            })
        );
        for bad in [
            "0:drop LAP 0 1 0 1",
            "0:drop REQ 0 1 0",
            "0:drop REQ 0 1 -1 1",
            "0:drop REQ * 1 0 1",
        ] {
            assert!(parse_fault(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn out_of_range_numbers_are_refused_not_wrapped() {
        assert!(parse_fault("0:crash 65536").is_err());
        assert!(
            parse_fault("0:crash 65535").is_err(),
            "65535 is the all-hosts marker"
        );
        assert!(parse_fault("0:loss 0 1 70000").is_err());
    }

    #[test]
    fn fault_lines_parse_into_their_faults_and_times() {
        assert_eq!(
            parse_fault("0:partition 0 1"),
            Ok((Duration::ZERO, Fault::Partition { a: 0, b: 1 }))
        );
        assert_eq!(
            parse_fault("250: loss 1 0 200"),
            Ok((
                Duration::from_millis(250),
                Fault::Loss {
                    a: 1,
                    b: 0,
                    per_mille: 200
                }
            ))
        );
        assert_eq!(
            parse_fault("10:delay 0 1 5 9"),
            Ok((
                Duration::from_millis(10),
                Fault::Delay {
                    a: 0,
                    b: 1,
                    min: Duration::from_millis(5),
                    max: Duration::from_millis(9)
                }
            ))
        );
        assert_eq!(
            parse_fault("3:crash 1"),
            Ok((Duration::from_millis(3), Fault::Crash { host: 1 }))
        );
        assert_eq!(
            parse_fault("4:remove-device 0"),
            Ok((Duration::from_millis(4), Fault::RemoveDevice { host: 0 }))
        );
    }

    #[test]
    fn malformed_fault_lines_are_refused_with_the_line() {
        for bad in [
            "partition 0 1",
            "x:crash 1",
            "0:crash",
            "0:explode 1",
            "0:loss 0 1 many",
        ] {
            let err = parse_fault(bad).unwrap_err();
            assert!(err.contains(bad), "{err}");
        }
    }
}
