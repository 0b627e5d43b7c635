//! Turning a seed into a scenario: two fabrics (hosts, configuration, fault schedule) and a list
//! of calls with deliberately hostile arguments.

use std::fmt;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};
use std::ops::RangeInclusive;
use std::sync::OnceLock;
use std::time::Duration;

use cm_core::{
    Access, AhAttr, CmEventType, ConnParam, IdOption, Invocation, PortSpace, QpCaps, QpState, SrqCaps,
    UdParam,
};
use cm_sim::{Fault, FaultSchedule, SimConfig, TraceMode};
use rand_chacha::ChaCha8Rng;
use rand_core::{RngCore, SeedableRng};

mod onesided;

use onesided::DeviceLimits;
pub use onesided::{KeySel, OffSel, RegionSel, RemoteSel, SgeSel, WrOp, WrSel};

/// Families of inputs that reach a simulator defect already known (the ones
/// [`likely_known`](crate::likely_known) names in a report). The default generates every
/// family; `--allow-known` leaves the named ones out so a campaign can measure everything else
/// while the fixes are pending.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Known {
    /// `SimConfig` values the builder's setters refuse but `SimBuilder::config` takes unchecked
    /// (`cm_retries` >= 256 or `u32::MAX`, an inverted ephemeral range, `max_backlog` 0).
    Config,
    /// A latency range or `Delay` fault ending at `Duration::MAX` (division by zero).
    DurationMax,
    /// `resolve_addr` / `resolve_route` timeouts of `Duration::MAX`, which drive the virtual
    /// clock to its end (arithmetic overflow).
    ClockOverflow,
    /// `RemoveDevice` faults (events generated after `DEVICE_REMOVAL` that the state machine
    /// calls illegal).
    DeviceRemoval,
    /// Acking a retrieved event on another host or fabric (the failed ack consumes it).
    WrongHostAck,
    /// Acking a forged `cm_event` that names a live id of the host (accepted).
    ForgedAck,
    /// Host addresses a builder should refuse with an error: loopback, unspecified.
    HostAddr,
}

impl Known {
    /// Every family.
    pub const ALL: [Known; 7] = [
        Known::Config,
        Known::DurationMax,
        Known::ClockOverflow,
        Known::DeviceRemoval,
        Known::WrongHostAck,
        Known::ForgedAck,
        Known::HostAddr,
    ];

    /// The name `--allow-known` takes.
    pub const fn name(self) -> &'static str {
        match self {
            Known::Config => "config",
            Known::DurationMax => "duration-max",
            Known::ClockOverflow => "clock-overflow",
            Known::DeviceRemoval => "device-removal",
            Known::WrongHostAck => "wrong-host-ack",
            Known::ForgedAck => "forged-ack",
            Known::HostAddr => "host-addr",
        }
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

/// A set of [`Known`] families left out of generation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct KnownSet(u8);

impl KnownSet {
    /// Nothing left out: every input family is generated (the default).
    pub const NONE: KnownSet = KnownSet(0);

    /// Parses `all` or a comma-separated list of family names.
    pub fn parse(text: &str) -> Result<KnownSet, String> {
        let mut set = KnownSet::NONE;
        for name in text.split(',').map(str::trim).filter(|n| !n.is_empty()) {
            if name == "all" {
                Known::ALL.iter().for_each(|k| set.0 |= k.bit());
                continue;
            }
            let k = Known::ALL
                .iter()
                .find(|k| k.name() == name)
                .ok_or_else(|| format!("unknown defect family {name:?}; known: all, {}", Self::names()))?;
            set.0 |= k.bit();
        }
        Ok(set)
    }

    fn names() -> String {
        Known::ALL.map(Known::name).join(", ")
    }

    /// Whether `k` is left out.
    pub const fn skips(self, k: Known) -> bool {
        self.0 & k.bit() != 0
    }

    /// Whether nothing is left out.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }
}

impl fmt::Display for KnownSet {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let names: Vec<&str> = Known::ALL
            .iter()
            .filter(|k| self.skips(**k))
            .map(|k| k.name())
            .collect();
        f.write_str(&names.join(","))
    }
}

/// A host of one of the two fabrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct HostSel {
    /// Fabric 0 or 1.
    pub fabric: u8,
    /// Host number on it.
    pub host: u8,
}

impl fmt::Display for HostSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "f{}h{}", self.fabric, self.host)
    }
}

/// Which backend issued a forged handle's owner tag.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Owner {
    /// The real tag of a host: the handle passes the owner check and meets the slab.
    Host(HostSel),
    /// A tag no backend ever gets (0, or one at the top of the range the counter never reaches).
    Never(u32),
}

/// A handle argument: one the run has seen, or a forged one.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleRef {
    /// The `n`-th most recent handle of this kind the calling host was given (live or not).
    Own(u16),
    /// The `n`-th most recent handle of this kind any host of either fabric was given.
    Any(u16),
    /// `backend::id_handle` / `backend::channel_handle` with made-up parts.
    Forged {
        /// Owner tag.
        owner: Owner,
        /// Slot index.
        index: u32,
        /// Generation.
        generation: u32,
    },
}

impl fmt::Display for HandleRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            HandleRef::Own(n) => write!(f, "own[-{n}]"),
            HandleRef::Any(n) => write!(f, "any[-{n}]"),
            HandleRef::Forged {
                owner: Owner::Host(h),
                index,
                generation,
            } => write!(f, "forged({h}:{index}.{generation})"),
            HandleRef::Forged {
                owner: Owner::Never(t),
                index,
                generation,
            } => write!(f, "forged(tag {t}:{index}.{generation})"),
        }
    }
}

/// An IP address argument, named relative to the fabric of the calling host.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum IpSel {
    /// Address `which` of host `host` on the caller's fabric.
    Host {
        /// Host number (taken modulo the host count).
        host: u8,
        /// Which of its addresses (modulo their count).
        which: u8,
    },
    /// The first address of a host of the other fabric: nobody here has it.
    OtherFabric(u8),
    /// Literal address.
    Literal(IpAddr),
}

/// A socket address argument.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AddrSel {
    /// The IP.
    pub ip: IpSel,
    /// The port (0 asks for an ephemeral one).
    pub port: u16,
}

/// Connection parameters for connect / accept, as drawn.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
struct ParamSel {
    /// Private data length (may exceed every limit).
    private_len: usize,
    /// `responder_resources`.
    responder_resources: u8,
    /// `initiator_depth`.
    initiator_depth: u8,
    /// `retry_count`.
    retry_count: u8,
    /// `rnr_retry_count`.
    rnr_retry_count: u8,
    /// `flow_control`.
    flow_control: u8,
    /// `srq`.
    srq: bool,
    /// `qp_num`.
    qp_num: u32,
}

impl ParamSel {
    /// The parameters the call is made with.
    fn conn(self) -> ConnParam {
        let mut c = ConnParam::new().with_private_data(pattern(Fill::Param, self.private_len));
        c.responder_resources = self.responder_resources;
        c.initiator_depth = self.initiator_depth;
        c.retry_count = self.retry_count;
        c.rnr_retry_count = self.rnr_retry_count;
        c.flow_control = self.flow_control;
        c.srq = self.srq;
        c.qp_num = self.qp_num;
        c
    }
}

/// A librdmacm call as the fuzzer stores it: ids and channels named relative to the calling
/// host, payloads lent from the generator's static fill patterns (`pattern`).
pub type FuzzCall = Invocation<HandleRef, HandleRef, &'static [u8]>;

/// The longest payload a call is generated with (a SEND one past a MiB).
const LONGEST_PAYLOAD: usize = (1 << 20) + 1;

/// The byte a payload is made of: each kind of call has its own, so that a payload delivered
/// elsewhere shows where it came from.
#[derive(Clone, Copy)]
enum Fill {
    /// SEND messages.
    Send = 0x3C,
    /// Reject private data and datagrams.
    Reject = 0x5A,
    /// Connect and accept private data.
    Param = 0xA5,
}

/// `len` bytes of `fill` (`len` at most [`LONGEST_PAYLOAD`]), made once per fill and lent to
/// every call: scenarios hold many calls, some with a MiB of payload each.
fn pattern(fill: Fill, len: usize) -> &'static [u8] {
    static BUFFERS: [OnceLock<Vec<u8>>; 3] = [OnceLock::new(), OnceLock::new(), OnceLock::new()];
    let slot = match fill {
        Fill::Send => 0,
        Fill::Reject => 1,
        Fill::Param => 2,
    };
    &BUFFERS[slot].get_or_init(|| vec![fill as u8; LONGEST_PAYLOAD])[..len]
}

/// `rdma_reject`'s private data of `len` bytes.
fn reject_data(len: usize) -> &'static [u8] {
    pattern(Fill::Reject, len)
}

/// A SEND's message of `len` bytes.
fn send_data(len: usize) -> &'static [u8] {
    pattern(Fill::Send, len)
}

/// A datagram's payload of `len` bytes.
fn datagram_data(len: usize) -> &'static [u8] {
    pattern(Fill::Reject, len)
}

/// Group `n` of [`GROUPS`] as a socket address.
pub(crate) fn group_addr(n: usize) -> SocketAddr {
    let ip: IpAddr = GROUPS[n].parse().expect("a valid address");
    SocketAddr::new(ip, 0)
}

/// The first address of host `h` on the caller's fabric, port `port`.
const fn host_addr(h: HostSel, port: u16) -> AddrSel {
    AddrSel {
        ip: IpSel::Host {
            host: h.host,
            which: 0,
        },
        port,
    }
}

/// The librdmacm call `call` made on host `h`.
pub(crate) const fn call(h: HostSel, call: FuzzCall) -> Op {
    Op::Call { h, call }
}

/// Resolves an address argument for a call made on `fabric`, whose hosts' addresses are
/// `hosts`.
fn resolve(hosts: &[Vec<Vec<IpAddr>>; 2], fabric: u8, a: AddrSel) -> SocketAddr {
    let ip = match a.ip {
        IpSel::Host { host, which } => {
            let hosts = &hosts[fabric as usize];
            let ips = &hosts[host as usize % hosts.len()];
            ips[which as usize % ips.len()]
        }
        IpSel::OtherFabric(host) => {
            let hosts = &hosts[1 - fabric as usize];
            hosts[host as usize % hosts.len()][0]
        }
        IpSel::Literal(ip) => ip,
    };
    SocketAddr::new(ip, a.port)
}

/// One call of the sequence. Every `CmBackend` method has one, plus the fabric-level calls
/// (`inject`, `advance`, `run_until_idle`): the librdmacm calls that [`Invocation`] covers are
/// [`Op::Call`]; what is the fuzzer's own is here beside it: retrieving events and acking them
/// (held, on another host, forged), polling completions, the checks' looks (`id_machine`,
/// `live_resources`), memory regions and shared receive queues, and the fabric's calls.
#[derive(Clone, Debug, PartialEq, Eq)]
#[allow(missing_docs)] // fields are the call's arguments, named after the trait's parameters
pub enum Op {
    /// A librdmacm call on host `h`: its ids and channels are named relative to `h`, its
    /// other arguments are the values it is made with.
    Call {
        h: HostSel,
        call: FuzzCall,
    },
    /// `get_cm_event`; `ack` acks the event at once on the same host, else it is held.
    GetCmEvent {
        h: HostSel,
        ch: HandleRef,
        timeout: Duration,
        ack: bool,
    },
    TryGetCmEvent {
        h: HostSel,
        ch: HandleRef,
        ack: bool,
    },
    /// `take_cm_event`: retrieve, read, ack in one call.
    TakeCmEvent {
        h: HostSel,
        ch: HandleRef,
    },
    /// Acks the `n`-th most recent held event on host `on`, or on its own host when `None`.
    AckHeld {
        on: Option<HostSel>,
        n: u16,
    },
    /// Acks an event made with `backend::cm_event`, never handed out by a backend.
    AckForged {
        h: HostSel,
        id: HandleRef,
        listen_id: Option<HandleRef>,
        event: CmEventType,
        status: i32,
        token: u64,
    },
    PollCq {
        h: HostSel,
        id: HandleRef,
        max: usize,
        timeout: Duration,
    },
    TryPollCq {
        h: HostSel,
        id: HandleRef,
        max: usize,
    },
    IdMachine {
        h: HostSel,
        id: HandleRef,
    },
    LiveResources {
        h: HostSel,
    },
    /// `SimFabric::inject` on fabric `fabric`.
    Inject {
        fabric: u8,
        fault: Fault,
    },
    /// `SimFabric::advance`.
    Advance {
        fabric: u8,
        by: Duration,
    },
    /// `SimFabric::run_until_idle`.
    RunUntilIdle {
        fabric: u8,
    },
    RegMr {
        h: HostSel,
        id: HandleRef,
        len: usize,
        access: Access,
    },
    MrInfo {
        h: HostSel,
        mr: HandleRef,
    },
    DeregMr {
        h: HostSel,
        mr: HandleRef,
    },
    /// `read_mr` of `len` bytes at `at` of the region.
    ReadMr {
        h: HostSel,
        mr: HandleRef,
        at: OffSel,
        len: usize,
    },
    /// `write_mr` of `len` bytes at `at` of the region.
    WriteMr {
        h: HostSel,
        mr: HandleRef,
        at: OffSel,
        len: usize,
    },
    PostSendWr {
        h: HostSel,
        id: HandleRef,
        wr: WrSel,
    },
    CreateSrq {
        h: HostSel,
        id: HandleRef,
        caps: SrqCaps,
    },
    DestroySrq {
        h: HostSel,
        srq: HandleRef,
    },
    PostSrqRecv {
        h: HostSel,
        srq: HandleRef,
        wr_id: u64,
        len: u32,
    },
    ArmSrqLimit {
        h: HostSel,
        srq: HandleRef,
        limit: u32,
    },
    CreateQpOnSrq {
        h: HostSel,
        id: HandleRef,
        caps: QpCaps,
        srq: HandleRef,
    },
    GetAsyncEvent {
        h: HostSel,
        timeout: Duration,
    },
}

impl Op {
    /// Whether it is the QP an application step makes or the receive it posts on it (left out
    /// where the application brings its own QP).
    fn is_qp_setup(&self) -> bool {
        matches!(
            self,
            Op::Call {
                call: Invocation::CreateQp { .. } | Invocation::PostRecv { .. },
                ..
            }
        )
    }
}

/// The groups the fuzzer joins, leaves and sends to (a send to QP `0xFFFFFF` goes to the
/// first); the last is a unicast address, which joins refuse.
pub(crate) const GROUPS: [&str; 3] = ["239.1.1.1", "ff0e::1", "10.0.0.1"];

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        // Debug of the variant is exact and complete; handles read better in their own form.
        match self {
            Op::Call { h, call } => write!(f, "{h} {}", Shown(call)),
            Op::GetCmEvent { h, ch, timeout, ack } => {
                write!(f, "{h} get_cm_event({ch}, {timeout:?}){}", ack_note(*ack))
            }
            Op::TryGetCmEvent { h, ch, ack } => write!(f, "{h} try_get_cm_event({ch}){}", ack_note(*ack)),
            Op::TakeCmEvent { h, ch } => write!(f, "{h} take_cm_event({ch})"),
            Op::AckHeld { on: Some(h), n } => write!(f, "{h} ack_cm_event(held[-{n}]) (maybe not its host)"),
            Op::AckHeld { on: None, n } => write!(f, "ack_cm_event(held[-{n}]) on its own host"),
            Op::AckForged {
                h,
                id,
                listen_id,
                event,
                status,
                token,
            } => write!(
                f,
                "{h} ack_cm_event(cm_event({id}, {listen_id:?}, {event}, {status}, .., token {token}))"
            ),
            Op::PollCq { h, id, max, timeout } => write!(f, "{h} poll_cq({id}, max {max}, {timeout:?})"),
            Op::TryPollCq { h, id, max } => write!(f, "{h} try_poll_cq({id}, max {max})"),
            Op::IdMachine { h, id } => write!(f, "{h} id_machine({id})"),
            Op::LiveResources { h } => write!(f, "{h} live_resources()"),
            Op::Inject { fabric, fault } => write!(f, "f{fabric} inject({fault})"),
            Op::Advance { fabric, by } => write!(f, "f{fabric} advance({by:?})"),
            Op::RunUntilIdle { fabric } => write!(f, "f{fabric} run_until_idle()"),
            Op::RegMr { h, id, len, access } => write!(f, "{h} reg_mr({id}, {len} bytes, {access})"),
            Op::MrInfo { h, mr } => write!(f, "{h} mr_info({mr})"),
            Op::DeregMr { h, mr } => write!(f, "{h} dereg_mr({mr})"),
            Op::ReadMr { h, mr, at, len } => write!(f, "{h} read_mr({mr}, {at}, {len} bytes)"),
            Op::WriteMr { h, mr, at, len } => write!(f, "{h} write_mr({mr}, {at}, {len} bytes)"),
            Op::PostSendWr { h, id, wr } => write!(f, "{h} post_send_wr({id}, {wr})"),
            Op::CreateSrq { h, id, caps } => write!(f, "{h} create_srq({id}, {caps:?})"),
            Op::DestroySrq { h, srq } => write!(f, "{h} destroy_srq({srq})"),
            Op::PostSrqRecv { h, srq, wr_id, len } => write!(f, "{h} post_srq_recv({srq}, {wr_id}, {len})"),
            Op::ArmSrqLimit { h, srq, limit } => write!(f, "{h} arm_srq_limit({srq}, {limit})"),
            Op::CreateQpOnSrq { h, id, caps, srq } => {
                write!(f, "{h} create_qp_on_srq({id}, {caps:?}, {srq})")
            }
            Op::GetAsyncEvent { h, timeout } => write!(f, "{h} get_async_event({timeout:?})"),
        }
    }
}

fn ack_note(ack: bool) -> &'static str {
    if ack {
        " + ack"
    } else {
        " (held)"
    }
}

/// A call as the log shows it: the trait method's name, handles in their own form, private
/// data and payloads by their length.
struct Shown<'a>(&'a FuzzCall);

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        use Invocation as I;
        match self.0 {
            I::CreateEventChannel => write!(f, "create_event_channel()"),
            I::DestroyEventChannel { channel } => write!(f, "destroy_event_channel({channel})"),
            I::CreateId { channel, ps } => write!(f, "create_id({channel}, {ps})"),
            I::DestroyId { id } => write!(f, "destroy_id({id})"),
            I::BindAddr { id, addr } => write!(f, "bind_addr({id}, {addr})"),
            I::ResolveAddr {
                id,
                src,
                dst,
                timeout,
            } => write!(f, "resolve_addr({id}, {src:?}, {dst}, {timeout:?})"),
            I::ResolveRoute { id, timeout } => write!(f, "resolve_route({id}, {timeout:?})"),
            I::CreateQp { id, caps } => write!(f, "create_qp({id}, {caps:?})"),
            I::DestroyQp { id } => write!(f, "destroy_qp({id})"),
            I::Listen { id, backlog } => write!(f, "listen({id}, {backlog})"),
            I::Connect { id, param } => write!(f, "connect({id}, {})", ShownParam(param)),
            I::Accept { id, param } => write!(f, "accept({id}, {})", ShownParam(param)),
            I::Reject { id, private_data } => write!(f, "reject({id}, {} bytes)", private_data.len()),
            I::Disconnect { id } => write!(f, "disconnect({id})"),
            I::Establish { id } => write!(f, "establish({id})"),
            I::InitQpAttr { id, qp_state } => write!(f, "init_qp_attr({id}, {qp_state})"),
            I::SetOption { id, option } => write!(f, "set_option({id}, {option})"),
            I::MigrateId { id, channel } => write!(f, "migrate_id({id}, {channel})"),
            I::GetLocalAddr { id } => write!(f, "get_local_addr({id})"),
            I::GetPeerAddr { id } => write!(f, "get_peer_addr({id})"),
            I::PostSend { id, wr_id, data } => write!(f, "post_send({id}, {wr_id}, {} bytes)", data.len()),
            I::PostRecv { id, wr_id, len } => write!(f, "post_recv({id}, {wr_id}, {len})"),
            I::PostSendTo {
                id,
                wr_id,
                dest,
                data,
            } => {
                let gid = Ipv6Addr::from(dest.ah_attr.dgid);
                let to = gid.to_ipv4_mapped().map_or(IpAddr::V6(gid), IpAddr::V4);
                write!(
                    f,
                    "post_send_to({id}, {wr_id}, qp {:#x} qkey {:#x} at {to}, {} bytes)",
                    dest.qp_num,
                    dest.qkey,
                    data.len()
                )
            }
            I::JoinMulticast { id, group } => write!(f, "join_multicast({id}, {})", group.ip()),
            I::LeaveMulticast { id, group } => write!(f, "leave_multicast({id}, {})", group.ip()),
        }
    }
}

/// Connection parameters as the log shows them: private data by its length.
struct ShownParam<'a>(&'a ConnParam);

impl fmt::Display for ShownParam<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let p = self.0;
        write!(
            f,
            "{} bytes, resources {}/{}, retries {}/{}, flow control {}, srq {}, qp {:#x}",
            p.private_data.len(),
            p.responder_resources,
            p.initiator_depth,
            p.retry_count,
            p.rnr_retry_count,
            p.flow_control,
            p.srq,
            p.qp_num
        )
    }
}

/// One fabric of the scenario.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricSpec {
    /// The fabric's own seed.
    pub seed: u64,
    /// Each host's addresses.
    pub hosts: Vec<Vec<IpAddr>>,
    /// The configuration given to `SimBuilder::config`.
    pub config: SimConfig,
    /// Faults given to the builder.
    pub faults: FaultSchedule,
}

/// Everything one seed expands into.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Scenario {
    /// The seed.
    pub seed: u64,
    /// The two fabrics.
    pub fabrics: [FabricSpec; 2],
    /// The calls, in order.
    pub ops: Vec<Op>,
}

/// The generator's random source: ChaCha8 with small helpers (no `rand` dependency).
pub(crate) struct Gen {
    rng: ChaCha8Rng,
    /// The one-sided calls' stream, swapped in by [`Gen::side`].
    side: ChaCha8Rng,
    skip: KnownSet,
    /// The server and client hosts of the scenario's application steps.
    cast: (HostSel, HostSel),
    /// The server and client of the last application step made.
    pair: (HostSel, HostSel),
    /// Each fabric's device limits, once its configuration is drawn.
    limits: [DeviceLimits; 2],
    /// Each fabric's hosts' addresses, once drawn: address arguments are resolved against them.
    addrs: [Vec<Vec<IpAddr>>; 2],
}

/// Mixed into the seed of the one-sided calls' stream.
const ONESIDED_STREAM: u64 = 0x6f6e_6573_6964_6564;

impl Gen {
    /// Runs `f` with the one-sided stream in place of the main one: the one-sided calls and
    /// the device limits they aim at draw from it, so a seed's other calls are what they were
    /// before the one-sided calls existed.
    fn side<T>(&mut self, f: impl FnOnce(&mut Gen) -> T) -> T {
        std::mem::swap(&mut self.rng, &mut self.side);
        let out = f(self);
        std::mem::swap(&mut self.rng, &mut self.side);
        out
    }

    fn below(&mut self, n: u64) -> u64 {
        self.rng.next_u64() % n.max(1)
    }

    fn chance(&mut self, per_mille: u64) -> bool {
        self.below(1000) < per_mille
    }

    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len() as u64) as usize]
    }

    /// Small numbers most of the time: recent handles are the interesting ones.
    fn recent(&mut self) -> u16 {
        match self.below(10) {
            0..=5 => 0,
            6 | 7 => 1,
            8 => 2 + self.below(3) as u16,
            _ => self.below(64) as u16,
        }
    }

    fn duration(&mut self) -> Duration {
        self.pick(&[
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(20),
            Duration::from_millis(1),
            Duration::from_millis(100),
            Duration::from_secs(2),
            Duration::from_secs(5),
            Duration::from_secs(70),
            Duration::from_secs(3600),
            Duration::MAX,
        ])
    }

    /// A wait: long waits let timers fire, zero waits only look.
    fn wait(&mut self) -> Duration {
        match self.below(10) {
            0..=2 => Duration::ZERO,
            3..=6 => Duration::from_millis(10),
            7 => Duration::from_secs(5),
            8 => Duration::from_secs(100),
            _ => self.duration(),
        }
    }

    fn resolve_timeout(&mut self) -> Duration {
        let d = if self.chance(700) {
            Duration::from_millis(self.pick(&[100, 2000]))
        } else {
            self.duration()
        };
        if d == Duration::MAX && self.skip.skips(Known::ClockOverflow) {
            return Duration::from_secs(86_400);
        }
        d
    }
}

const PORTS: [u16; 3] = [7471, 7472, 0];

impl Gen {
    pub(crate) fn new(seed: u64, skip: KnownSet) -> Gen {
        let h0 = HostSel { fabric: 0, host: 0 };
        Gen {
            rng: ChaCha8Rng::seed_from_u64(seed),
            side: ChaCha8Rng::seed_from_u64(seed ^ ONESIDED_STREAM),
            skip,
            cast: (h0, h0),
            pair: (h0, h0),
            limits: [DeviceLimits::default(); 2],
            addrs: [Vec::new(), Vec::new()],
        }
    }

    fn port(&mut self) -> u16 {
        match self.below(20) {
            0..=16 => self.pick(&PORTS),
            17 => u16::MAX,
            _ => self.below(65536) as u16,
        }
    }

    fn ip(&mut self) -> IpSel {
        match self.below(20) {
            0..=14 => IpSel::Host {
                host: self.below(3) as u8,
                which: if self.chance(800) { 0 } else { 1 },
            },
            15 => IpSel::OtherFabric(self.below(3) as u8),
            _ => IpSel::Literal(self.pick(&[
                IpAddr::V4(Ipv4Addr::new(10, 9, 9, 9)),
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::BROADCAST),
                IpAddr::V4(Ipv4Addr::new(224, 0, 0, 1)),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
                IpAddr::V6(Ipv6Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::new(0xfd00, 9, 0, 0, 0, 0, 0, 9)),
                IpAddr::V6(Ipv6Addr::new(0xfe80, 0, 0, 0, 0, 0, 0, 1)),
            ])),
        }
    }

    /// The address `a` names for a call made on `h`.
    fn at(&self, h: HostSel, a: AddrSel) -> SocketAddr {
        resolve(&self.addrs, h.fabric, a)
    }

    /// Where a datagram to QP `qp_num` goes: the first address of host `to` of the first
    /// fabric (a host it lacks: an address no host has, whose datagrams go nowhere), or the
    /// first group for the multicast QP number.
    fn datagram_dest(&self, to: usize, qp_num: u32, qkey: u32) -> UdParam {
        let ip = if qp_num == cm_core::MULTICAST_QPN {
            group_addr(0).ip()
        } else {
            self.addrs[0]
                .get(to)
                .map_or(IpAddr::from([10, 9, 9, 9]), |ips| ips[0])
        };
        UdParam {
            qp_num,
            qkey,
            ah_attr: AhAttr::for_ip(ip),
        }
    }

    fn addr(&mut self) -> AddrSel {
        AddrSel {
            ip: self.ip(),
            port: self.port(),
        }
    }

    fn host_on(&mut self, fabric: u8, hosts: &[usize; 2]) -> HostSel {
        HostSel {
            fabric,
            host: self.below(hosts[fabric as usize] as u64) as u8,
        }
    }

    fn any_host(&mut self, hosts: &[usize; 2]) -> HostSel {
        // Fabric 1 is the foreign one: there mostly to be someone else's handles and events.
        let fabric = u8::from(self.chance(150));
        self.host_on(fabric, hosts)
    }

    fn handle(&mut self, hosts: &[usize; 2]) -> HandleRef {
        match self.below(100) {
            0..=84 => HandleRef::Own(self.recent()),
            85..=92 => HandleRef::Any(self.recent()),
            _ => {
                let owner = if self.chance(700) {
                    Owner::Host(self.any_host(hosts))
                } else {
                    Owner::Never(self.pick(&[0, u32::MAX, u32::MAX - 1, 0xF000_0000]))
                };
                HandleRef::Forged {
                    owner,
                    index: self.pick(&[0, 1, 2, 3, 5, 1000, u32::MAX]),
                    generation: self.pick(&[0, 1, 2, u32::MAX]),
                }
            }
        }
    }

    fn private_len(&mut self) -> usize {
        if self.chance(600) {
            return self.below(8) as usize;
        }
        self.pick(&[
            0, 55, 56, 57, 135, 136, 137, 147, 148, 149, 179, 180, 181, 195, 196, 197, 255, 256, 257, 4096,
        ])
    }

    fn param(&mut self) -> ParamSel {
        if self.chance(600) {
            return ParamSel {
                private_len: self.private_len(),
                responder_resources: 0xFF,
                initiator_depth: 0xFF,
                retry_count: 7,
                rnr_retry_count: 7,
                flow_control: 0,
                srq: false,
                qp_num: 0,
            };
        }
        ParamSel {
            private_len: self.private_len(),
            responder_resources: self.pick(&[0, 1, 16, 128, 129, 0xFE, 0xFF]),
            initiator_depth: self.pick(&[0, 1, 16, 128, 129, 0xFE, 0xFF]),
            retry_count: self.pick(&[0, 1, 7, 8, 0xFF]),
            rnr_retry_count: self.pick(&[0, 1, 6, 7, 8, 0xFF]),
            flow_control: self.pick(&[0, 1, 0xFF]),
            srq: self.chance(100),
            qp_num: self.pick(&[0, 1, 0x00FF_FFFF, u32::MAX]),
        }
    }

    /// What an application passes: librdmacm's defaults with a little private data, mostly.
    fn step_param(&mut self) -> ParamSel {
        let mut p = self.param();
        if self.chance(850) {
            p = ParamSel {
                private_len: self.below(16) as usize,
                responder_resources: 0xFF,
                initiator_depth: 0xFF,
                retry_count: 7,
                rnr_retry_count: 7,
                flow_control: 0,
                srq: false,
                qp_num: 0,
            };
        }
        p
    }

    fn caps(&mut self) -> QpCaps {
        if self.chance(700) {
            return QpCaps::new();
        }
        let mut c = QpCaps::new();
        let wr = [0, 1, 2, 16, 16384, 16385, u32::MAX];
        c.max_send_wr = self.pick(&wr);
        c.max_recv_wr = self.pick(&wr);
        c.max_send_sge = self.pick(&[0, 1, 30, u32::MAX]);
        c.max_recv_sge = self.pick(&[0, 1, 30, u32::MAX]);
        c.max_inline_data = self.pick(&[0, 64, u32::MAX]);
        c.max_message_size = self.pick(&[0, 1, 16, 4096, 1 << 20, (1 << 20) + 1, u32::MAX]);
        c
    }

    fn fault(&mut self, hosts: usize) -> Fault {
        let h = |g: &mut Gen| g.below(hosts as u64) as u16;
        loop {
            let fault = match self.below(13) {
                0 => Fault::Partition {
                    a: h(self),
                    b: h(self),
                },
                1 => Fault::Heal {
                    a: h(self),
                    b: h(self),
                },
                2 => Fault::Loss {
                    a: h(self),
                    b: h(self),
                    per_mille: self.pick(&[0, 1, 200, 500, 1000, u16::MAX]),
                },
                3 => {
                    let spans = [
                        Duration::ZERO,
                        Duration::from_micros(10),
                        Duration::from_millis(5),
                        Duration::from_secs(10),
                        Duration::MAX,
                    ];
                    let (min, max) = (self.pick(&spans), self.pick(&spans));
                    if (min == Duration::MAX || max == Duration::MAX) && self.skip.skips(Known::DurationMax) {
                        continue;
                    }
                    Fault::Delay {
                        a: h(self),
                        b: h(self),
                        min,
                        max,
                    }
                }
                4 => Fault::Crash { host: h(self) },
                5 => Fault::Restart { host: h(self) },
                6 => {
                    if self.skip.skips(Known::DeviceRemoval) {
                        continue;
                    }
                    Fault::RemoveDevice { host: h(self) }
                }
                7 => Fault::RestoreDevice { host: h(self) },
                8 => Fault::AddrChange { host: h(self) },
                9 => Fault::FailAddrResolution {
                    host: h(self),
                    status: self.pick(&[-101, -110, -113, -19]),
                    count: self.pick(&[0, 1, 2, u32::MAX]),
                },
                10 => Fault::FailRouteResolution {
                    host: h(self),
                    status: self.pick(&[-101, -110, -113, -19]),
                    count: self.pick(&[0, 1, 2, u32::MAX]),
                },
                11 => Fault::Backlog {
                    host: h(self),
                    backlog: self.pick(&[0, 1, 2, u32::MAX]),
                },
                _ => Fault::RnrRetries {
                    host: h(self),
                    retries: self.pick(&[0, 1, 6, 7, u8::MAX]),
                },
            };
            return fault;
        }
    }

    fn config(&mut self) -> SimConfig {
        let mut c = SimConfig {
            trace: TraceMode::HashOnly,
            ..SimConfig::default()
        };
        if self.chance(600) {
            return c;
        }
        let lat = [
            Duration::ZERO,
            Duration::from_nanos(1),
            Duration::from_micros(5),
            Duration::from_micros(50),
            Duration::from_millis(3),
            Duration::from_secs(1),
        ];
        let (a, b) = (self.pick(&lat), self.pick(&lat));
        c.latency = a.min(b)..=a.max(b);
        if self.chance(30) && !self.skip.skips(Known::DurationMax) {
            c.latency = a..=Duration::MAX;
        }
        // The IB CM's exponents, from the shortest (a millisecond a term) to the longest (2^23
        // ms), the kernel's among them.
        c.cm_response_timeout = self.pick(&[0, 8, 12, 20, 31]);
        c.packet_lifetime = self.pick(&[0, 8, 16, 18, 31]);
        c.ca_ack_delay = self.pick(&[0, 15, 31]);
        c.mra_service_timeout = self.pick(&[0, 10, 24]);
        c.cm_retries = self.pick(&[0, 1, 3, 15]);
        c.max_backlog = self.pick(&[1, 2, 1024]);
        c.ephemeral_ports = match self.below(4) {
            0 => 40000..=40002,
            1 => 1..=1,
            2 => 65535..=65535,
            _ => 32768..=60999,
        };
        c.max_rd_atomic = self.pick(&[0, 1, 16, 128, 255]);
        // Mostly room for the application steps' QPs (16 work requests, 4 KiB messages); a
        // device limit of u32::MAX lets drawn capabilities reach two queues whose sum overflows
        // (in the place of a second 16384: the same draws, so a seed keeps its calls).
        c.max_qp_wr = self.pick(&[1, 16, 64, 16384, u32::MAX]);
        c.max_message_size = self.pick(&[1, 4096, 4096, 1 << 20, 1 << 20]);
        c.rnr_timer = self.pick(&[Duration::ZERO, Duration::from_millis(1), c.rnr_timer]);
        if self.chance(100) && !self.skip.skips(Known::Config) {
            match self.below(5) {
                0 => c.cm_retries = self.pick(&[255, 256, 1000, u32::MAX]),
                1 => c.ephemeral_ports = RangeInclusive::new(50000, 40000),
                2 => c.max_backlog = 0,
                3 => c.packet_lifetime = self.pick(&[32, 255]),
                _ => c.ephemeral_ports = 0..=0,
            }
        }
        c
    }

    fn fabric(&mut self, fabric: u8, hosts: usize) -> FabricSpec {
        let mut addrs = Vec::with_capacity(hosts);
        for i in 0..hosts {
            let mut ips = vec![IpAddr::V4(Ipv4Addr::new(10, fabric, 0, i as u8 + 1))];
            match self.below(4) {
                0 => ips.push(IpAddr::V6(Ipv6Addr::new(
                    0xfd00,
                    u16::from(fabric),
                    0,
                    0,
                    0,
                    0,
                    0,
                    i as u16 + 1,
                ))),
                1 => ips.push(IpAddr::V4(Ipv4Addr::new(10, fabric, 1, i as u8 + 1))),
                _ => {}
            }
            addrs.push(ips);
        }
        if self.chance(5) && !self.skip.skips(Known::HostAddr) {
            let bad = self.pick(&[
                IpAddr::V4(Ipv4Addr::LOCALHOST),
                IpAddr::V4(Ipv4Addr::UNSPECIFIED),
                IpAddr::V6(Ipv6Addr::LOCALHOST),
            ]);
            let last = addrs.len() - 1;
            addrs[last].push(bad);
        }
        let mut faults = FaultSchedule::new();
        if self.chance(500) {
            for _ in 0..=self.below(4) {
                let at = self.pick(&[
                    Duration::ZERO,
                    Duration::from_micros(30),
                    Duration::from_millis(5),
                    Duration::from_secs(3),
                    Duration::from_secs(60),
                ]);
                faults = faults.with(at, self.fault(hosts));
            }
        }
        // The seed is drawn before the configuration, as it always was.
        let seed = self.rng.next_u64();
        let mut config = self.config();
        self.side(|g| g.device_limits(fabric, &mut config));
        FabricSpec {
            seed,
            hosts: addrs,
            config,
            faults,
        }
    }

    fn op(&mut self, hosts: &[usize; 2]) -> Op {
        use Invocation as I;
        let h = self.any_host(hosts);
        let id = self.handle(hosts);
        match self.below(1000) {
            0..=39 => call(h, I::CreateEventChannel),
            40..=59 => call(
                h,
                I::DestroyEventChannel {
                    channel: self.handle(hosts),
                },
            ),
            60..=139 => call(
                h,
                I::CreateId {
                    channel: self.handle(hosts),
                    ps: if self.chance(750) {
                        PortSpace::Tcp
                    } else {
                        self.pick(&PortSpace::ALL)
                    },
                },
            ),
            140..=169 => call(h, I::DestroyId { id }),
            170..=219 => {
                let addr = self.addr();
                call(
                    h,
                    I::BindAddr {
                        id,
                        addr: self.at(h, addr),
                    },
                )
            }
            220..=289 => {
                let src = if self.chance(150) { Some(self.addr()) } else { None };
                let dst = self.addr();
                call(
                    h,
                    I::ResolveAddr {
                        id,
                        src: src.map(|a| self.at(h, a)),
                        dst: self.at(h, dst),
                        timeout: self.resolve_timeout(),
                    },
                )
            }
            290..=339 => call(
                h,
                I::ResolveRoute {
                    id,
                    timeout: self.resolve_timeout(),
                },
            ),
            340..=389 => call(
                h,
                I::CreateQp {
                    id,
                    caps: self.caps(),
                },
            ),
            390..=409 => call(h, I::DestroyQp { id }),
            410..=449 => call(
                h,
                I::Listen {
                    id,
                    backlog: self.pick(&[0, 1, 2, 8, -1, i32::MIN, i32::MAX]),
                },
            ),
            450..=499 => call(
                h,
                I::Connect {
                    id,
                    param: self.param().conn(),
                },
            ),
            500..=539 => call(
                h,
                I::Accept {
                    id,
                    param: self.param().conn(),
                },
            ),
            540..=554 => call(
                h,
                I::Reject {
                    id,
                    private_data: reject_data(self.private_len()),
                },
            ),
            555..=584 => call(h, I::Disconnect { id }),
            585..=694 => Op::GetCmEvent {
                h,
                ch: self.handle(hosts),
                timeout: self.wait(),
                ack: self.chance(850),
            },
            695..=699 => call(
                h,
                I::SetOption {
                    id,
                    option: match self.below(4) {
                        0 => IdOption::Tos(self.pick(&[0, 0x10, 0xff])),
                        1 => IdOption::ReuseAddr(self.chance(500)),
                        2 => IdOption::AfOnly(self.chance(500)),
                        _ => IdOption::AckTimeout(self.pick(&[0, 1, 14, 31, 32, 255])),
                    },
                },
            ),
            700..=704 => call(
                h,
                I::MigrateId {
                    id,
                    channel: self.handle(hosts),
                },
            ),
            705..=724 => Op::TryGetCmEvent {
                h,
                ch: self.handle(hosts),
                ack: self.chance(850),
            },
            725..=739 => Op::TakeCmEvent {
                h,
                ch: self.handle(hosts),
            },
            740..=769 => {
                let on =
                    (self.chance(100) && !self.skip.skips(Known::WrongHostAck)).then(|| self.any_host(hosts));
                Op::AckHeld { on, n: self.recent() }
            }
            770..=784 => {
                let mut id = id;
                let mut listen_id = if self.chance(300) {
                    Some(self.handle(hosts))
                } else {
                    None
                };
                if self.skip.skips(Known::ForgedAck) {
                    // Only forged events that name no id of the host (as the event's id or, for
                    // CONNECT_REQUEST, its listener): those are refused today.
                    let never = HandleRef::Forged {
                        owner: Owner::Never(0),
                        index: 0,
                        generation: 0,
                    };
                    id = never;
                    listen_id = listen_id.map(|_| never);
                }
                Op::AckForged {
                    h,
                    id,
                    listen_id,
                    event: self.pick(&CmEventType::ALL),
                    status: self.pick(&[0, -110, 28, i32::MIN]),
                    token: self.pick(&[0, 1, 2, 3, u64::MAX]),
                }
            }
            785..=799 => call(h, I::GetLocalAddr { id }),
            800..=814 => call(h, I::GetPeerAddr { id }),
            815..=839 => call(
                h,
                I::PostSend {
                    wr_id: self.below(4),
                    data: send_data(self.pick(&[0, 1, 64, 4096, 4097, 1 << 20, (1 << 20) + 1])),
                    id,
                },
            ),
            846..=847 => call(
                h,
                I::JoinMulticast {
                    id,
                    group: group_addr(self.below(GROUPS.len() as u64) as usize),
                },
            ),
            848..=849 => call(
                h,
                I::LeaveMulticast {
                    id,
                    group: group_addr(self.below(GROUPS.len() as u64) as usize),
                },
            ),
            840..=845 => {
                let wr_id = self.below(4);
                let len = self.pick(&[0, 1, 64, 1024, 1025, 4096, 4097]);
                let to = self.below(3) as usize;
                let qp_num = self.pick(&[0x11, 0x12, 0x13, 0x14, 0x00FF_FFFF, u32::MAX]);
                let qkey = self.pick(&[cm_core::UDP_QKEY, 0]);
                call(
                    h,
                    I::PostSendTo {
                        id,
                        wr_id,
                        dest: self.datagram_dest(to, qp_num, qkey),
                        data: datagram_data(len),
                    },
                )
            }
            850..=884 => call(
                h,
                I::PostRecv {
                    wr_id: self.below(4),
                    len: self.pick(&[0, 1, 64, 4096, 4097, 1 << 20, u32::MAX]),
                    id,
                },
            ),
            885..=914 => Op::PollCq {
                h,
                id,
                max: self.pick(&[0, 1, 4, 64, usize::MAX]),
                timeout: self.wait(),
            },
            915..=934 => Op::TryPollCq {
                h,
                id,
                max: self.pick(&[0, 1, 64, usize::MAX]),
            },
            935..=939 => Op::IdMachine { h, id },
            940..=944 => {
                if self.chance(500) {
                    call(h, I::Establish { id })
                } else {
                    call(
                        h,
                        I::InitQpAttr {
                            id,
                            qp_state: self.pick(&[
                                QpState::Init,
                                QpState::Rtr,
                                QpState::Rts,
                                QpState::Reset,
                                QpState::Err,
                            ]),
                        },
                    )
                }
            }
            945..=949 => Op::LiveResources { h },
            950..=969 => {
                let fabric = u8::from(self.chance(200));
                Op::Inject {
                    fabric,
                    fault: self.fault(hosts[fabric as usize]),
                }
            }
            970..=989 => Op::Advance {
                fabric: u8::from(self.chance(200)),
                by: self.wait(),
            },
            _ => Op::RunUntilIdle {
                fabric: u8::from(self.chance(200)),
            },
        }
    }
}

/// The newest handle of the calling host: what a well-behaved application passes next.
const NEWEST: HandleRef = HandleRef::Own(0);

/// The QP number application steps with an external QP give (the server's is one more).
const EXTERNAL_QPN: u32 = 0x00AB_C123;

impl Gen {
    /// A step of an ordinary application (listen, connect, accept, exchange, disconnect,
    /// release), so sequences reach connected states; [`Gen::blocks`] then garbles some calls.
    fn block(&mut self, kind: u64, hosts: &[usize; 2]) -> Vec<Op> {
        let place = if self.chance(800) {
            // The scenario's own cast, so that steps generated apart fit together.
            (0, self.cast.0, self.cast.1, 7471)
        } else {
            let fabric = u8::from(self.chance(100));
            (
                fabric,
                self.host_on(fabric, hosts),
                self.host_on(fabric, hosts),
                self.pick(&[7471, 7472]),
            )
        };
        self.block_at(kind, place)
    }

    /// The step of `kind` on `fabric` between `server` and `client`, listening on `port`.
    fn block_at(
        &mut self,
        kind: u64,
        (fabric, server, client, port): (u8, HostSel, HostSel, u16),
    ) -> Vec<Op> {
        use Invocation as I;
        self.pair = (server, client);
        let ps = if self.chance(850) {
            PortSpace::Tcp
        } else {
            self.pick(&PortSpace::ALL)
        };
        let wait = Duration::from_secs(5);
        let get = |h: HostSel| Op::GetCmEvent {
            h,
            ch: NEWEST,
            timeout: wait,
            ack: true,
        };
        match kind {
            0 => vec![
                call(server, I::CreateEventChannel),
                call(server, I::CreateId { channel: NEWEST, ps }),
                call(
                    server,
                    I::BindAddr {
                        id: NEWEST,
                        addr: self.at(server, host_addr(server, port)),
                    },
                ),
                call(
                    server,
                    I::Listen {
                        id: NEWEST,
                        backlog: self.pick(&[0, 1, 8]),
                    },
                ),
            ],
            1 | 2 => {
                // Some applications bring their own QP (an external QP): no backend QP, its
                // number in the parameters.
                let external = self.chance(150);
                let mut ops = vec![
                    call(client, I::CreateEventChannel),
                    call(client, I::CreateId { channel: NEWEST, ps }),
                    call(
                        client,
                        I::ResolveAddr {
                            id: NEWEST,
                            src: None,
                            // The server's address as seen from the client's fabric.
                            dst: self.at(client, host_addr(server, port)),
                            timeout: Duration::from_secs(2),
                        },
                    ),
                    get(client),
                    call(
                        client,
                        I::ResolveRoute {
                            id: NEWEST,
                            timeout: Duration::from_secs(2),
                        },
                    ),
                    get(client),
                    call(
                        client,
                        I::CreateQp {
                            id: NEWEST,
                            caps: QpCaps::new(),
                        },
                    ),
                    call(
                        client,
                        I::PostRecv {
                            id: NEWEST,
                            wr_id: 1,
                            len: 4096,
                        },
                    ),
                    call(
                        client,
                        I::Connect {
                            id: NEWEST,
                            param: self.step_param().conn(),
                        },
                    ),
                ];
                if external {
                    ops.retain(|op| !op.is_qp_setup());
                    if let Some(Op::Call {
                        call: I::Connect { param, .. },
                        ..
                    }) = ops.last_mut()
                    {
                        param.qp_num = EXTERNAL_QPN;
                    }
                }
                ops
            }
            3 => {
                let external = self.chance(150);
                let mut ops = vec![
                    get(server),
                    call(
                        server,
                        I::CreateQp {
                            id: NEWEST,
                            caps: QpCaps::new(),
                        },
                    ),
                    call(
                        server,
                        I::PostRecv {
                            id: NEWEST,
                            wr_id: 2,
                            len: 4096,
                        },
                    ),
                ];
                ops.push(if self.chance(850) {
                    call(
                        server,
                        I::Accept {
                            id: NEWEST,
                            param: self.step_param().conn(),
                        },
                    )
                } else {
                    call(
                        server,
                        I::Reject {
                            id: NEWEST,
                            private_data: reject_data(self.private_len()),
                        },
                    )
                });
                ops.push(get(client));
                if external {
                    ops.retain(|op| !op.is_qp_setup());
                    if let Some(Op::Call {
                        call: I::Accept { param, .. },
                        ..
                    }) = ops.iter_mut().find(|op| {
                        matches!(
                            op,
                            Op::Call {
                                call: I::Accept { .. },
                                ..
                            }
                        )
                    }) {
                        param.qp_num = EXTERNAL_QPN + 1;
                    }
                    // After CONNECT_RESPONSE the application's QP is ready: the RTU goes out.
                    ops.push(call(
                        client,
                        I::InitQpAttr {
                            id: NEWEST,
                            qp_state: QpState::Rtr,
                        },
                    ));
                    ops.push(call(client, I::Establish { id: NEWEST }));
                }
                ops.push(get(server));
                ops
            }
            4 => vec![
                call(
                    client,
                    I::PostSend {
                        id: NEWEST,
                        wr_id: 3,
                        data: send_data(self.pick(&[0, 64, 4096])),
                    },
                ),
                Op::PollCq {
                    h: client,
                    id: NEWEST,
                    max: 4,
                    timeout: Duration::from_secs(1),
                },
                Op::PollCq {
                    h: server,
                    id: NEWEST,
                    max: 4,
                    timeout: Duration::from_secs(1),
                },
            ],
            5 => vec![
                call(client, I::Disconnect { id: NEWEST }),
                get(server),
                call(server, I::Disconnect { id: NEWEST }),
                get(client),
                Op::PollCq {
                    h: client,
                    id: NEWEST,
                    max: 8,
                    timeout: Duration::ZERO,
                },
            ],
            6 => vec![
                call(client, I::DestroyQp { id: NEWEST }),
                call(client, I::DestroyId { id: NEWEST }),
                call(client, I::DestroyEventChannel { channel: NEWEST }),
            ],
            _ => vec![
                get(client),
                get(server),
                Op::Advance {
                    fabric,
                    by: self.wait(),
                },
            ],
        }
    }

    /// Application steps with some calls replaced by random ones, or left out.
    fn blocks(&mut self, kind: u64, hosts: &[usize; 2], ops: &mut Vec<Op>) {
        let mut block = self.block(kind, hosts);
        let before = self.side(|g| g.story_tweaks(kind, &mut block));
        for (op, before) in block.into_iter().zip(before) {
            ops.extend(before);
            match self.below(100) {
                0..=5 => ops.push(self.op(hosts)),
                6..=8 => {}
                _ => ops.push(op),
            }
        }
        if kind == 3 {
            // The connection is accepted: one-sided work on it, sometimes.
            let pair = self.pair;
            self.side(|g| {
                if g.story_here() {
                    g.story(pair, hosts, ops);
                }
            });
        }
    }
}

impl Scenario {
    /// The scenario `seed` expands into, leaving out the families in `skip`.
    pub fn generate(seed: u64, skip: KnownSet) -> Scenario {
        let mut g = Gen::new(seed, skip);
        let hosts = [2 + g.below(2) as usize, 2 + g.below(2) as usize];
        let fabrics = [g.fabric(0, hosts[0]), g.fabric(1, hosts[1])];
        g.addrs = [fabrics[0].hosts.clone(), fabrics[1].hosts.clone()];
        g.cast = (g.host_on(0, &hosts), g.host_on(0, &hosts));
        let calls = 20 + g.below(181) as usize;
        // Some sequences are pure noise, most mix application steps with noise.
        let guided = g.below(10);
        let mut ops = Vec::with_capacity(calls + 16);
        // Steps mostly come in an application's order: listen, connect, accept, exchange,
        // disconnect, release, drain.
        const STORY: [u64; 7] = [0, 1, 3, 4, 5, 6, 7];
        let mut next = 0;
        if g.chance(700) {
            // Every host starts with a channel and an id, so even noise meets live handles.
            for (f, &n) in hosts.iter().enumerate() {
                for host in 0..n as u8 {
                    let h = HostSel {
                        fabric: f as u8,
                        host,
                    };
                    ops.push(call(h, Invocation::CreateEventChannel));
                    ops.push(call(
                        h,
                        Invocation::CreateId {
                            channel: NEWEST,
                            ps: PortSpace::Tcp,
                        },
                    ));
                }
            }
        }
        if g.side(Gen::prologue_here) {
            g.side(|g| g.prologue(&hosts, &mut ops));
        }
        while ops.len() < calls {
            if g.side(Gen::noise_here) {
                ops.push(g.side(|g| g.onesided_op(&hosts)));
            }
            if g.below(10) < guided {
                let kind = if g.chance(800) {
                    next += 1;
                    STORY[(next - 1) % STORY.len()]
                } else {
                    g.below(8)
                };
                g.blocks(kind, &hosts, &mut ops);
            } else {
                ops.push(g.op(&hosts));
            }
        }
        ops.truncate(calls);
        Scenario { seed, fabrics, ops }
    }

    /// Host counts of the two fabrics.
    pub fn host_counts(&self) -> [usize; 2] {
        [self.fabrics[0].hosts.len(), self.fabrics[1].hosts.len()]
    }
}
