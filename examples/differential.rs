//! The differential suite: every call of the trait in every state the id machine knows, made on
//! the raw librdmacm (the machine's check bypassed), compared with the machine's verdict and with
//! the simulator's answer.
//!
//! For each (state, call) pair the program drives a fresh id into the state and makes the call,
//! recording the return (0 or the errno), the QP's state before and after, and the events that
//! follow for the id. Three columns result:
//!
//! * **librdmacm** — the call made through `cm_hw::HwBackend::raw_call` in a child process of
//!   its own under a time bound, so that a hang or a crash is a table entry rather than the end
//!   of the run. Calls that would crash, hang or leak in librdmacm are not made; the table says
//!   why (`not issued: ...`).
//! * **machine** — what `IdMachine` answers for the id as the backend tracks it.
//! * **simulator** — the same drive and call on `cm-sim`, through the trait (guarded, as users
//!   call it).
//!
//! A pair *differs* when librdmacm's return or resulting QP state is not the machine's, or the
//! simulator's return is not the machine's. A difference fails the run unless it is on the list of
//! known departures (`tests/differential-departures.txt`), each entry with its reason; an entry
//! that matched nothing fails the run too, so the list cannot go stale. States whose outcome
//! depends on timing (a call while a resolution is in flight) run five times and are reported
//! with each outcome's count. Probes of one state run concurrently; states that take the IB CM's
//! retries to reach (UNREACHABLE) start first and are collected last.
//!
//! ```text
//! cargo run --example differential                        # simulator and machine only (no device)
//! cargo run --features differential --example differential -- --hw --addr 10.0.0.1 \
//!     --remove-device rxe0:veth0 \    # also the device-removal state, last (deletes and re-adds rxe0)
//!     --silent-peer 10.0.0.253:veth0  # also UNREACHABLE (a permanent neighbour entry for the
//!                                     # address to nobody's MAC, removed afterwards)
//! ```
//!
//! UNREACHABLE is reached by connecting to the silent peer: its address resolves, the request
//! goes out and nobody answers, so the IB CM gives up after its retries (74 s). A listener that
//! retrieves the request and never answers does not do: its CM answers the retried request with
//! an MRA, which stretches the wait by about a minute each time.
//!
//! The table goes to stdout between `--- differential table` and `--- end of table`, then one
//! line `differential: ...` with the counts. Exit code 0 when nothing unlisted differs, 1
//! otherwise, 2 for a bad option.

// Without the `differential` feature only the simulator's column is built: the code that runs
// and reads back the librdmacm probes is then unused.
#![cfg_attr(not(feature = "differential"), allow(dead_code))]

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use cm::api::{
    errno, AhAttr, Call, ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, IdHandle, IdMachine,
    IdOption, Invocation, PortSpace, QpCaps, QpState, UdParam, UDP_QKEY,
};
use cm::sim::{SimFabric, SimHost};

/// The list of known departures, checked in next to the tests that check it against the README.
const DEPARTURES: &str = include_str!("../tests/differential-departures.txt");

/// The TOS byte the `set_tos` probe sets (DSCP AF11, any value the kernel takes).
const PROBE_TOS: u8 = 0x28;

/// The ACK timeout the `set_ack_timeout` probe sets (rdma-core's default exponent, 4.096 us x
/// 2^14, within the 5-bit range).
const PROBE_ACK_TIMEOUT: u8 = 14;

/// The destination of the `post_send_to` probe: the listener's address on the UDP port space's
/// Q_Key, QP 1 (a number no connected QP is given).
fn probe_dest(addr: SocketAddr) -> UdParam {
    UdParam {
        qp_num: 1,
        qkey: UDP_QKEY,
        ah_attr: AhAttr::for_ip(addr.ip()),
    }
}

/// The group the multicast probes join and leave: an administratively scoped group (RFC 2365)
/// of the suite address's family, so the kernel resolves it on the same device.
fn probe_group(addr: SocketAddr) -> SocketAddr {
    let ip: IpAddr = match addr {
        SocketAddr::V4(_) => [239, 1, 2, 3].into(),
        SocketAddr::V6(_) => [0xff15, 0, 0, 0, 0, 0, 0x0102, 0x0304].into(),
    };
    SocketAddr::new(ip, 0)
}

/// How many times a timing-dependent state is probed.
const TIMING_RUNS: usize = 5;

/// The states probed, each the state of the id the call is made on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum St {
    Idle,
    Bound,
    AddrQuery,
    AddrResolved,
    RouteQuery,
    RouteResolved,
    RouteResolvedQp,
    Listen,
    Connecting,
    Requested,
    RequestedQp,
    Accepted,
    EstablishedActive,
    EstablishedPassive,
    Rejected,
    Unreachable,
    DisconnectedActive,
    DisconnectedPassive,
    /// An established active id whose device went away (`DEVICE_REMOVAL` retrieved); last.
    DeviceRemoval,
}

const STATES: [St; 19] = [
    St::Idle,
    St::Bound,
    St::AddrQuery,
    St::AddrResolved,
    St::RouteQuery,
    St::RouteResolved,
    St::RouteResolvedQp,
    St::Listen,
    St::Connecting,
    St::Requested,
    St::RequestedQp,
    St::Accepted,
    St::EstablishedActive,
    St::EstablishedPassive,
    St::Rejected,
    St::Unreachable,
    St::DisconnectedActive,
    St::DisconnectedPassive,
    St::DeviceRemoval,
];

impl St {
    fn name(self) -> &'static str {
        match self {
            St::Idle => "idle",
            St::Bound => "bound",
            St::AddrQuery => "addr-query",
            St::AddrResolved => "addr-resolved",
            St::RouteQuery => "route-query",
            St::RouteResolved => "route-resolved",
            St::RouteResolvedQp => "route-resolved+qp",
            St::Listen => "listen",
            St::Connecting => "connecting",
            St::Requested => "requested",
            St::RequestedQp => "requested+qp",
            St::Accepted => "accepted",
            St::EstablishedActive => "established-active",
            St::EstablishedPassive => "established-passive",
            St::Rejected => "rejected",
            St::Unreachable => "unreachable",
            St::DisconnectedActive => "disconnected-active",
            St::DisconnectedPassive => "disconnected-passive",
            St::DeviceRemoval => "device-removal",
        }
    }

    fn parse(s: &str) -> Option<St> {
        STATES.into_iter().find(|st| st.name() == s)
    }

    /// Whether the call races an operation in flight (the kernel may or may not have finished it).
    fn timing(self) -> bool {
        matches!(self, St::AddrQuery | St::RouteQuery)
    }

    /// Whether reaching the state takes the IB CM's retries (about a minute on rxe).
    fn slow(self) -> bool {
        matches!(self, St::Unreachable)
    }
}

/// The calls made in each state: every call the machine decides on.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Op {
    BindAddr,
    ResolveAddr,
    ResolveRoute,
    Listen,
    CreateQp,
    DestroyQp,
    Connect,
    Accept,
    Reject,
    Disconnect,
    DestroyId,
    PostSend,
    PostRecv,
    /// `init_qp_attr` for RTR, the transition that needs the peer's answer.
    InitQpAttrRtr,
    Establish,
    /// `post_send_to` a datagram destination (every probed id is RC: see `HwBackend::raw_call`).
    PostSendTo,
    /// `set_option` of each `IdOption`; REUSEADDR both ways, as the kernel takes enabling it in
    /// other states than disabling it.
    SetTos,
    SetReuseAddr,
    SetReuseAddrOff,
    SetAfOnly,
    SetAckTimeout,
    /// `migrate_id` to a fresh channel of the same backend.
    MigrateId,
    /// `join_multicast` of the probe's group; a join that went through is left again once the
    /// events that followed are acked.
    JoinMulticast,
    /// `leave_multicast` of the probe's group, which the id never joined.
    LeaveMulticast,
}

const OPS: [Op; 24] = [
    Op::BindAddr,
    Op::ResolveAddr,
    Op::ResolveRoute,
    Op::Listen,
    Op::CreateQp,
    Op::DestroyQp,
    Op::Connect,
    Op::Accept,
    Op::Reject,
    Op::Disconnect,
    Op::DestroyId,
    Op::PostSend,
    Op::PostRecv,
    Op::InitQpAttrRtr,
    Op::Establish,
    Op::PostSendTo,
    Op::SetTos,
    Op::SetReuseAddr,
    Op::SetReuseAddrOff,
    Op::SetAfOnly,
    Op::SetAckTimeout,
    Op::MigrateId,
    Op::JoinMulticast,
    Op::LeaveMulticast,
];

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::BindAddr => "bind_addr",
            Op::ResolveAddr => "resolve_addr",
            Op::ResolveRoute => "resolve_route",
            Op::Listen => "listen",
            Op::CreateQp => "create_qp",
            Op::DestroyQp => "destroy_qp",
            Op::Connect => "connect",
            Op::Accept => "accept",
            Op::Reject => "reject",
            Op::Disconnect => "disconnect",
            Op::DestroyId => "destroy_id",
            Op::PostSend => "post_send",
            Op::PostRecv => "post_recv",
            Op::InitQpAttrRtr => "init_qp_attr_rtr",
            Op::Establish => "establish",
            Op::PostSendTo => "post_send_to",
            Op::SetTos => "set_tos",
            Op::SetReuseAddr => "set_reuseaddr",
            Op::SetReuseAddrOff => "set_reuseaddr_off",
            Op::SetAfOnly => "set_afonly",
            Op::SetAckTimeout => "set_ack_timeout",
            Op::MigrateId => "migrate_id",
            Op::JoinMulticast => "join_multicast",
            Op::LeaveMulticast => "leave_multicast",
        }
    }

    fn parse(s: &str) -> Option<Op> {
        OPS.into_iter().find(|op| op.name() == s)
    }

    /// The option a `set_option` probe sets.
    fn option(self) -> Option<IdOption> {
        match self {
            Op::SetTos => Some(IdOption::Tos(PROBE_TOS)),
            Op::SetReuseAddr => Some(IdOption::ReuseAddr(true)),
            Op::SetReuseAddrOff => Some(IdOption::ReuseAddr(false)),
            Op::SetAfOnly => Some(IdOption::AfOnly(true)),
            Op::SetAckTimeout => Some(IdOption::AckTimeout(PROBE_ACK_TIMEOUT)),
            _ => None,
        }
    }

    /// The call the probe makes on `id`: `addr` is the address it binds, resolves, sends to
    /// or takes its group's family from, `t` its wait, `spare` the channel a migration moves
    /// the id to.
    fn call<Id, Ch>(self, id: Id, addr: SocketAddr, t: Duration, spare: Ch) -> Invocation<Id, Ch> {
        use Invocation as I;
        match self {
            Op::BindAddr => I::BindAddr { id, addr },
            Op::ResolveAddr => I::ResolveAddr {
                id,
                src: None,
                dst: addr,
                timeout: t,
            },
            Op::ResolveRoute => I::ResolveRoute { id, timeout: t },
            Op::Listen => I::Listen { id, backlog: 8 },
            Op::CreateQp => I::CreateQp {
                id,
                caps: QpCaps::new(),
            },
            Op::DestroyQp => I::DestroyQp { id },
            Op::Connect => I::Connect {
                id,
                param: ConnParam::new(),
            },
            Op::Accept => I::Accept {
                id,
                param: ConnParam::new(),
            },
            Op::Reject => I::Reject {
                id,
                private_data: Vec::new(),
            },
            Op::Disconnect => I::Disconnect { id },
            Op::DestroyId => I::DestroyId { id },
            Op::PostSend => I::PostSend {
                id,
                wr_id: 1,
                data: b"probe".to_vec(),
            },
            Op::PostRecv => I::PostRecv {
                id,
                wr_id: 1,
                len: 64,
            },
            Op::InitQpAttrRtr => I::InitQpAttr {
                id,
                qp_state: QpState::Rtr,
            },
            Op::Establish => I::Establish { id },
            Op::PostSendTo => I::PostSendTo {
                id,
                wr_id: 1,
                dest: probe_dest(addr),
                data: b"probe".to_vec(),
            },
            Op::SetTos | Op::SetReuseAddr | Op::SetReuseAddrOff | Op::SetAfOnly | Op::SetAckTimeout => {
                I::SetOption {
                    id,
                    option: self.option().expect("a set_option probe"),
                }
            }
            Op::MigrateId => I::MigrateId { id, channel: spare },
            Op::JoinMulticast => I::JoinMulticast {
                id,
                group: probe_group(addr),
            },
            Op::LeaveMulticast => I::LeaveMulticast {
                id,
                group: probe_group(addr),
            },
        }
    }

    /// The machine's verdict for the call (at `addr`) on an id in `m`: the return and the QP's
    /// state after.
    fn verdict(self, m: &IdMachine, addr: SocketAddr) -> (Rc, Option<QpState>) {
        let step = match self {
            // Memberships are the backend's, not the machine's: a group the id never joined is
            // not there to leave, in any state.
            Op::LeaveMulticast => Err(CmError::AddrNotAvailable {
                call: Call::LeaveMulticast,
            }),
            _ => self
                .call((), addr, Duration::ZERO, ())
                .check(m)
                .map(|next| next.unwrap_or(*m)),
        };
        match step {
            Ok(next) => (Rc::Ok, next.qp()),
            Err(e) => (Rc::Errno(e.errno()), m.qp()),
        }
    }
}

/// A call's return.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rc {
    Ok,
    Errno(i32),
    NotIssued(String),
    /// The child did not finish in its bound.
    Hang,
    /// The child died without a result (a signal, or a failed drive).
    Died(String),
}

fn errno_name(e: i32) -> String {
    let name = match e {
        1 => "EPERM",
        6 => "ENXIO",
        errno::ENOENT => "ENOENT",
        errno::EBADF => "EBADF",
        11 => "EAGAIN",
        errno::ENOMEM => "ENOMEM",
        errno::EBUSY => "EBUSY",
        17 => "EEXIST",
        errno::ENODEV => "ENODEV",
        errno::EINVAL => "EINVAL",
        errno::ENOSYS => "ENOSYS",
        errno::ENODATA => "ENODATA",
        71 => "EPROTO",
        errno::EOPNOTSUPP => "EOPNOTSUPP",
        errno::EADDRINUSE => "EADDRINUSE",
        errno::EADDRNOTAVAIL => "EADDRNOTAVAIL",
        errno::ENETUNREACH => "ENETUNREACH",
        106 => "EISCONN",
        107 => "ENOTCONN",
        errno::ETIMEDOUT => "ETIMEDOUT",
        errno::ECONNREFUSED => "ECONNREFUSED",
        errno::EHOSTUNREACH => "EHOSTUNREACH",
        114 => "EALREADY",
        _ => return format!("errno{e}"),
    };
    name.to_string()
}

fn errno_from_name(s: &str) -> Option<i32> {
    if let Some(n) = s.strip_prefix("errno") {
        return n.parse().ok();
    }
    (1..200).find(|&e| errno_name(e) == s)
}

impl fmt::Display for Rc {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Rc::Ok => f.write_str("ok"),
            Rc::Errno(e) => f.write_str(&errno_name(*e)),
            Rc::NotIssued(why) => write!(f, "not issued ({why})"),
            Rc::Hang => f.write_str("hang"),
            Rc::Died(why) => write!(f, "died ({why})"),
        }
    }
}

/// What one probe saw.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct Outcome {
    rc: Rc,
    qp_before: Option<QpState>,
    qp_after: Option<QpState>,
    /// The events that followed for the id (`peer:` for the other end's).
    events: Vec<String>,
}

fn qp_name(q: Option<QpState>) -> &'static str {
    match q {
        None => "-",
        Some(QpState::Reset) => "RESET",
        Some(QpState::Init) => "INIT",
        Some(QpState::Rtr) => "RTR",
        Some(QpState::Rts) => "RTS",
        Some(QpState::Err) => "ERR",
    }
}

fn qp_parse(s: &str) -> Option<QpState> {
    match s {
        "RESET" => Some(QpState::Reset),
        "INIT" => Some(QpState::Init),
        "RTR" => Some(QpState::Rtr),
        "RTS" => Some(QpState::Rts),
        "ERR" => Some(QpState::Err),
        _ => None,
    }
}

impl Outcome {
    /// The return and the QP transition, as the table shows them.
    fn short(&self) -> String {
        let mut s = self.rc.to_string();
        if self.qp_before != self.qp_after {
            s += &format!(" qp {}->{}", qp_name(self.qp_before), qp_name(self.qp_after));
        }
        s
    }

    /// One line for the parent to read back from a child.
    fn encode(&self) -> String {
        let rc = match &self.rc {
            Rc::Ok => "ok".to_string(),
            Rc::Errno(e) => errno_name(*e),
            Rc::NotIssued(why) => format!("not-issued:{}", why.replace(' ', "~")),
            Rc::Hang => "hang".to_string(),
            Rc::Died(why) => format!("died:{}", why.replace(' ', "~")),
        };
        format!(
            "probe-result rc={rc} qp={}>{} events={}",
            qp_name(self.qp_before),
            qp_name(self.qp_after),
            if self.events.is_empty() {
                "-".to_string()
            } else {
                self.events.join(",")
            }
        )
    }

    fn decode(line: &str) -> Option<Outcome> {
        let rest = line.strip_prefix("probe-result ")?;
        let mut rc = None;
        let mut qp = None;
        let mut events = Vec::new();
        for field in rest.split(' ') {
            let (k, v) = field.split_once('=')?;
            match k {
                "rc" => {
                    rc = Some(match v {
                        "ok" => Rc::Ok,
                        "hang" => Rc::Hang,
                        v if v.starts_with("not-issued:") => Rc::NotIssued(v[11..].replace('~', " ")),
                        v if v.starts_with("died:") => Rc::Died(v[5..].replace('~', " ")),
                        v => Rc::Errno(errno_from_name(v)?),
                    })
                }
                "qp" => {
                    let (a, b) = v.split_once('>')?;
                    qp = Some((qp_parse(a), qp_parse(b)));
                }
                "events" if v != "-" => events = v.split(',').map(str::to_string).collect(),
                _ => {}
            }
        }
        let (qp_before, qp_after) = qp?;
        Some(Outcome {
            rc: rc?,
            qp_before,
            qp_after,
            events,
        })
    }
}

// ------------------------------------------------------------------------------------------------
// Driving an id into a state, generic over the backend

/// How long the drive waits for one event; the IB CM's retries need far longer for UNREACHABLE.
#[derive(Clone, Copy)]
struct Waits {
    event: Duration,
    unreachable: Duration,
    /// How long events are collected after the call.
    after: Duration,
}

/// Where a probe's id lives once driven.
struct Target {
    /// The id the call is made on is the server backend's (a child or the listener).
    on_server: bool,
    id: IdHandle,
    ch: ChannelHandle,
    /// The other end's channel, whose events are recorded as `peer:`.
    peer_ch: Option<ChannelHandle>,
}

fn expect<B: CmBackend>(
    b: &mut B,
    ch: ChannelHandle,
    ty: CmEventType,
    t: Duration,
) -> Result<IdHandle, String> {
    let ev = b
        .get_cm_event(ch, t)
        .map_err(|e| format!("waiting for {ty}: {e}"))?
        .ok_or_else(|| format!("no {ty} within {t:?}"))?;
    let (got, id) = (ev.event(), ev.id());
    b.ack_cm_event(ev).map_err(|e| format!("ack: {e}"))?;
    if got != ty {
        return Err(format!("expected {ty}, got {got}"));
    }
    Ok(id)
}

/// Where a probe's ids go.
#[derive(Clone, Copy)]
struct Addrs {
    /// The server's listener, for every state that needs a peer.
    listener: SocketAddr,
    /// The client's own address.
    local: IpAddr,
    /// An address that resolves but whose CM never answers: UNREACHABLE's peer. A live
    /// listener's CM would answer the retried request with an MRA, which stretches the active
    /// side's wait past many minutes; a request nobody receives times out after the IB CM's
    /// retries.
    silent: SocketAddr,
}

/// Drives a fresh id into `st`, with a server (listener) on `server` at `a.listener` where the
/// state needs a peer.
fn drive<B: CmBackend>(server: &mut B, client: &mut B, st: St, a: Addrs, w: Waits) -> Result<Target, String> {
    let e = |what: &'static str| move |err: CmError| format!("{what}: {err}");
    let t = w.event;
    let (addr, local) = (a.listener, a.local);
    let cch = client.create_event_channel().map_err(e("client channel"))?;
    let id = client.create_id(cch, PortSpace::Tcp).map_err(e("create_id"))?;
    let client_target = |peer_ch| Target {
        on_server: false,
        id,
        ch: cch,
        peer_ch,
    };
    match st {
        St::Idle => return Ok(client_target(None)),
        St::Bound => {
            client
                .bind_addr(id, SocketAddr::new(local, 0))
                .map_err(e("bind_addr"))?;
            return Ok(client_target(None));
        }
        St::Listen => {
            client
                .bind_addr(id, SocketAddr::new(local, addr.port()))
                .map_err(e("bind_addr"))?;
            client.listen(id, 8).map_err(e("listen"))?;
            return Ok(client_target(None));
        }
        St::Unreachable => {
            client
                .resolve_addr(id, None, a.silent, t)
                .map_err(e("resolve_addr"))?;
            expect(client, cch, CmEventType::AddrResolved, t)?;
            client.resolve_route(id, t).map_err(e("resolve_route"))?;
            expect(client, cch, CmEventType::RouteResolved, t)?;
            client.create_qp(id, QpCaps::new()).map_err(e("create_qp"))?;
            client.connect(id, &ConnParam::new()).map_err(e("connect"))?;
            expect(client, cch, CmEventType::Unreachable, w.unreachable)?;
            return Ok(client_target(None));
        }
        _ => {}
    }
    // Everything else resolves towards a listener on `addr`.
    let sch = server.create_event_channel().map_err(e("server channel"))?;
    let listener = server.create_id(sch, PortSpace::Tcp).map_err(e("listener"))?;
    server.bind_addr(listener, addr).map_err(e("listener bind"))?;
    server.listen(listener, 8).map_err(e("listen"))?;
    client
        .resolve_addr(id, None, addr, t)
        .map_err(e("resolve_addr"))?;
    if st == St::AddrQuery {
        return Ok(client_target(Some(sch)));
    }
    expect(client, cch, CmEventType::AddrResolved, t)?;
    if st == St::AddrResolved {
        return Ok(client_target(Some(sch)));
    }
    client.resolve_route(id, t).map_err(e("resolve_route"))?;
    if st == St::RouteQuery {
        return Ok(client_target(Some(sch)));
    }
    expect(client, cch, CmEventType::RouteResolved, t)?;
    if st == St::RouteResolved {
        return Ok(client_target(Some(sch)));
    }
    client.create_qp(id, QpCaps::new()).map_err(e("create_qp"))?;
    if st == St::RouteResolvedQp {
        return Ok(client_target(Some(sch)));
    }
    client.connect(id, &ConnParam::new()).map_err(e("connect"))?;
    if st == St::Connecting {
        return Ok(client_target(Some(sch)));
    }
    let child = expect(server, sch, CmEventType::ConnectRequest, t)?;
    let child_target = Target {
        on_server: true,
        id: child,
        ch: sch,
        peer_ch: Some(cch),
    };
    match st {
        St::Requested => return Ok(child_target),
        St::Rejected => {
            server.reject(child, b"").map_err(e("reject"))?;
            expect(client, cch, CmEventType::Rejected, t)?;
            return Ok(client_target(Some(sch)));
        }
        _ => {}
    }
    server
        .create_qp(child, QpCaps::new())
        .map_err(e("child create_qp"))?;
    if st == St::RequestedQp {
        return Ok(child_target);
    }
    server.accept(child, &ConnParam::new()).map_err(e("accept"))?;
    if st == St::Accepted {
        return Ok(child_target);
    }
    expect(client, cch, CmEventType::Established, t)?;
    expect(server, sch, CmEventType::Established, t)?;
    match st {
        St::EstablishedActive | St::DeviceRemoval => return Ok(client_target(Some(sch))),
        St::EstablishedPassive => return Ok(child_target),
        _ => {}
    }
    client.disconnect(id).map_err(e("disconnect"))?;
    expect(server, sch, CmEventType::Disconnected, t)?;
    if st == St::DisconnectedPassive {
        return Ok(child_target);
    }
    server.disconnect(child).map_err(e("child disconnect"))?;
    expect(client, cch, CmEventType::Disconnected, t)?;
    debug_assert_eq!(st, St::DisconnectedActive);
    Ok(client_target(Some(sch)))
}

/// A backend the probe can make a call on: guarded (the simulator) or raw (librdmacm).
trait Probed: CmBackend {
    fn issue(&mut self, call: &Invocation) -> Rc;
    fn qp(&self, id: IdHandle) -> Option<QpState>;
    /// Lets time pass without an event (the simulator's clock runs only in its waits).
    fn pause(&mut self, ch: ChannelHandle, t: Duration) -> Option<cm::CmEvent>;
}

fn rc_of(r: Result<(), CmError>) -> Rc {
    match r {
        Ok(()) => Rc::Ok,
        Err(e) => Rc::Errno(e.errno()),
    }
}

impl Probed for SimHost {
    fn issue(&mut self, call: &Invocation) -> Rc {
        rc_of(call.invoke(self).map(|_| ()))
    }

    fn qp(&self, id: IdHandle) -> Option<QpState> {
        self.id_machine(id).ok().and_then(|m| m.qp())
    }

    fn pause(&mut self, ch: ChannelHandle, t: Duration) -> Option<cm::CmEvent> {
        self.get_cm_event(ch, t).ok().flatten()
    }
}

#[cfg(feature = "differential")]
impl Probed for cm::hw::HwBackend {
    fn issue(&mut self, call: &Invocation) -> Rc {
        use cm::hw::RawOutcome;
        match self.raw_call(call) {
            RawOutcome::Ok => Rc::Ok,
            RawOutcome::Failed(e) => Rc::Errno(e),
            RawOutcome::NotIssued(why) => Rc::NotIssued(why.to_string()),
        }
    }

    fn qp(&self, id: IdHandle) -> Option<QpState> {
        self.raw_qp_state(id)
    }

    fn pause(&mut self, ch: ChannelHandle, t: Duration) -> Option<cm::CmEvent> {
        self.get_cm_event(ch, t).ok().flatten()
    }
}

/// Drives an id into `st`, makes `op` on it, and records what follows. Also returns the
/// machine's verdict for the call, taken from the backend's machine just before it.
fn probe<B: Probed>(
    server: &mut B,
    client: &mut B,
    st: St,
    op: Op,
    addrs: Addrs,
    w: Waits,
    remove_device: &mut dyn FnMut() -> Result<(), String>,
) -> Result<(Outcome, (Rc, Option<QpState>)), String> {
    let (addr, local) = (addrs.listener, addrs.local);
    let target = drive(server, client, st, addrs, w)?;
    let (b, peer) = if target.on_server {
        (&mut *server, &mut *client)
    } else {
        (&mut *client, &mut *server)
    };
    if st == St::DeviceRemoval {
        remove_device()?;
        // The id's DEVICE_REMOVAL, past whatever else the removal brought; all acked.
        let deadline = std::time::Instant::now() + w.event;
        loop {
            let ev = b
                .get_cm_event(target.ch, w.event)
                .map_err(|e| format!("waiting for DEVICE_REMOVAL: {e}"))?
                .ok_or("no DEVICE_REMOVAL")?;
            let hit = ev.id() == target.id && ev.event() == CmEventType::DeviceRemoval;
            b.ack_cm_event(ev).map_err(|e| format!("ack: {e}"))?;
            if hit {
                break;
            }
            if std::time::Instant::now() >= deadline {
                return Err("no DEVICE_REMOVAL in time".into());
            }
        }
    }
    // A bind needs an address of its own (the port 0 picks one); the rest aim at the listener.
    let call_addr = match op {
        Op::BindAddr => SocketAddr::new(if target.on_server { addr.ip() } else { local }, 0),
        _ => addr,
    };
    let machine = b.id_machine(target.id).map_err(|e| format!("id_machine: {e}"))?;
    let verdict = op.verdict(&machine, call_addr);
    let qp_before = b.qp(target.id);
    // The channel migrate_id moves the id to; made for every probe so that each drives the
    // same resources.
    let spare = b
        .create_event_channel()
        .map_err(|e| format!("spare channel: {e}"))?;
    let rc = b.issue(&op.call(target.id, call_addr, w.event, spare));
    // A migrated id's events arrive on the spare channel.
    let id_ch = if rc == Rc::Ok && op == Op::MigrateId {
        spare
    } else {
        target.ch
    };
    let qp_after = if rc == Rc::Ok && op == Op::DestroyId {
        None
    } else {
        b.qp(target.id)
    };
    // Events that follow, on both ends, within the window; each acked at once.
    let mut events = Vec::new();
    let slice = w.after / 4;
    for _ in 0..4 {
        while let Some(ev) = b.pause(id_ch, slice) {
            if ev.id() == target.id || ev.counted_id() == target.id {
                events.push(ev.event().name().trim_start_matches("RDMA_CM_EVENT_").to_string());
            }
            let _ = b.ack_cm_event(ev);
        }
        if let Some(pch) = target.peer_ch {
            while let Some(ev) = peer.pause(pch, Duration::ZERO) {
                events.push(format!(
                    "peer:{}",
                    ev.event().name().trim_start_matches("RDMA_CM_EVENT_")
                ));
                let _ = peer.ack_cm_event(ev);
            }
        }
    }
    // The kernel is left without the membership: the join's events were acked above, so
    // librdmacm's leave does not wait.
    if rc == Rc::Ok && op == Op::JoinMulticast {
        match b.issue(&Op::LeaveMulticast.call(target.id, call_addr, w.event, spare)) {
            Rc::Ok => {}
            other => return Err(format!("leave after the join: {other}")),
        }
    }
    Ok((
        Outcome {
            rc,
            qp_before,
            qp_after,
            events,
        },
        verdict,
    ))
}

// ------------------------------------------------------------------------------------------------
// The simulator's column

fn sim_probe(st: St, op: Op) -> Result<(Outcome, (Rc, Option<QpState>)), String> {
    let fabric = SimFabric::builder()
        .seed(15)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .host("10.0.0.3")
        .build();
    // Host 2 is UNREACHABLE's silent peer: its address resolves, and no CM message from the
    // client (host 1) reaches it, as a request to an address with nobody's MAC on rxe.
    fabric.inject(cm::sim::Fault::Partition { a: 1, b: 2 });
    let (mut server, mut client) = (fabric.host(0), fabric.host(1));
    let w = Waits {
        event: Duration::from_secs(2),
        unreachable: Duration::from_secs(300),
        after: Duration::from_millis(400),
    };
    let local = "10.0.0.2".parse().unwrap();
    // The client's host (1) loses its device.
    let mut remove = || {
        fabric.inject(cm::sim::Fault::RemoveDevice { host: 1 });
        Ok(())
    };
    probe(
        &mut server,
        &mut client,
        st,
        op,
        Addrs {
            listener: "10.0.0.1:7471".parse().unwrap(),
            local,
            silent: "10.0.0.3:7471".parse().unwrap(),
        },
        w,
        &mut remove,
    )
}

// ------------------------------------------------------------------------------------------------
// The librdmacm column: each probe in a child process

#[cfg(feature = "differential")]
mod hw {
    use std::io::{BufRead, BufReader, Write};
    use std::process::{Child, Command, Stdio};
    use std::sync::mpsc::{self, Receiver};
    use std::time::Instant;

    use super::*;

    pub(super) const WAITS: Waits = Waits {
        event: Duration::from_secs(10),
        // The IB CM sends the request 16 times (CMA_MAX_CM_RETRIES 15), each time waiting
        // 4.1 s (CMA_CM_RESPONSE_TIMEOUT 20) plus twice RoCE's packet lifetime (2 x 0.26 s):
        // UNREACHABLE 74 s after the connect.
        unreachable: Duration::from_secs(120),
        after: Duration::from_millis(800),
    };

    /// The child: `runs` probes of one pair on the hardware backend, one after the other (each
    /// on ports of its own), each result on stdout as soon as it is known.
    pub(super) fn child(st: St, op: Op, addr: SocketAddr, silent: IpAddr, runs: usize) -> ExitCode {
        let backends = cm::hw::HwBackend::new().and_then(|s| Ok((s, cm::hw::HwBackend::new()?)));
        let (mut server, mut client) = match backends {
            Ok(b) => b,
            Err(e) => {
                println!("probe-error backend: {e}");
                return ExitCode::FAILURE;
            }
        };
        for run in 0..runs {
            let addr = SocketAddr::new(addr.ip(), addr.port() + 2 * run as u16);
            // The parent removes the device once every probe of the state is ready, and says so
            // with a line on stdin.
            let mut remove = || {
                println!("probe-ready");
                let _ = std::io::stdout().flush();
                let mut line = String::new();
                match std::io::stdin().read_line(&mut line) {
                    Ok(n) if n > 0 => Ok(()),
                    _ => Err("the parent did not remove the device".to_string()),
                }
            };
            match probe(
                &mut server,
                &mut client,
                st,
                op,
                Addrs {
                    listener: addr,
                    local: addr.ip(),
                    silent: SocketAddr::new(silent, addr.port()),
                },
                WAITS,
                &mut remove,
            ) {
                Ok((outcome, _)) => println!("{}", outcome.encode()),
                Err(e) => println!("probe-error {e}"),
            }
            let _ = std::io::stdout().flush();
        }
        // The kernel releases every id and QP with the process; the backends' own teardown could
        // block on the state a probe left behind on purpose (the parent does not wait for it).
        std::process::exit(0)
    }

    pub(super) struct Running {
        pub(super) st: St,
        pub(super) op: Op,
        runs: usize,
        child: Child,
        lines: Receiver<String>,
        /// Lines read while waiting for `probe-ready`, handed to `finish`.
        early: Vec<String>,
        deadline: Instant,
    }

    impl Running {
        /// Waits until the probe is ready for the device removal (false: it failed or ran out
        /// of time first; `finish` then reports why).
        pub(super) fn ready(&mut self, until: Instant) -> bool {
            loop {
                let now = Instant::now();
                if now >= until {
                    return false;
                }
                match self.lines.recv_timeout(until - now) {
                    Ok(line) if line == "probe-ready" => return true,
                    Ok(line) => self.early.push(line),
                    Err(_) => return false,
                }
            }
        }

        /// Tells a ready probe that the device is gone.
        pub(super) fn go(&mut self) {
            if let Some(stdin) = self.child.stdin.as_mut() {
                let _ = stdin.write_all(b"go\n").and_then(|()| stdin.flush());
            }
        }
    }

    pub(super) fn spawn(
        st: St,
        op: Op,
        addr: SocketAddr,
        silent: IpAddr,
        runs: usize,
        suite_deadline: Instant,
    ) -> Running {
        let exe = std::env::current_exe().expect("own path");
        let bound = if st.slow() {
            WAITS.unreachable + Duration::from_secs(30)
        } else {
            Duration::from_secs(30) * runs as u32
        };
        let mut child = Command::new(exe)
            .args(["--child", st.name(), op.name(), "--addr", &addr.to_string()])
            .args(["--runs", &runs.to_string(), "--silent", &silent.to_string()])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn a probe");
        // Read on a thread of its own: a child whose exit hangs in the kernel has still told
        // its results, and the parent must not wait for the exit to read them.
        let (tx, lines) = mpsc::channel();
        let out = child.stdout.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Running {
            st,
            op,
            runs,
            child,
            lines,
            early: Vec::new(),
            deadline: (Instant::now() + bound).min(suite_deadline),
        }
    }

    fn bare(rc: Rc) -> Outcome {
        Outcome {
            rc,
            qp_before: None,
            qp_after: None,
            events: Vec::new(),
        }
    }

    /// Collects the probe's results within its bound; what did not come is a hang (the child
    /// still running) or a death (the child gone). The child is killed either way.
    pub(super) fn finish(mut r: Running) -> Vec<Outcome> {
        let mut results = Vec::new();
        let mut early = std::mem::take(&mut r.early).into_iter();
        while results.len() < r.runs {
            let now = Instant::now();
            if now >= r.deadline {
                break;
            }
            let next = match early.next() {
                Some(line) => Ok(line),
                None => r
                    .lines
                    .recv_timeout((r.deadline - now).min(Duration::from_millis(200))),
            };
            match next {
                Ok(line) => {
                    if let Some(o) = Outcome::decode(&line) {
                        results.push(o);
                    } else if let Some(e) = line.strip_prefix("probe-error ") {
                        results.push(bare(Rc::Died(format!("drive failed: {e}"))));
                    }
                }
                Err(mpsc::RecvTimeoutError::Timeout) => {}
                Err(mpsc::RecvTimeoutError::Disconnected) => {
                    // Output closed: the child exited or died; say how.
                    let why = match r.child.wait() {
                        Ok(status) => {
                            use std::os::unix::process::ExitStatusExt;
                            match status.signal() {
                                Some(sig) => format!("signal {sig}"),
                                None => format!("exit {}", status.code().unwrap_or(-1)),
                            }
                        }
                        Err(e) => format!("wait: {e}"),
                    };
                    while results.len() < r.runs {
                        results.push(bare(Rc::Died(why.clone())));
                    }
                }
            }
        }
        while results.len() < r.runs {
            results.push(bare(Rc::Hang));
        }
        // Killed without waiting: an exit stuck in the kernel must not hold the suite up.
        let _ = r.child.kill();
        for o in &results {
            eprintln!("differential: {} {}: {}", r.st.name(), r.op.name(), o.short());
        }
        results
    }
}

// ------------------------------------------------------------------------------------------------
// The table

/// One known departure: a (state, call) pair whose column differs from the machine, and why.
struct Departure {
    state: String,
    op: String,
    column: String,
    outcome: String,
    reason: String,
    used: std::cell::Cell<bool>,
}

fn departures() -> Vec<Departure> {
    DEPARTURES
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .map(|l| {
            let (key, reason) = l.split_once('|').expect("`state call column outcome | reason`");
            let f: Vec<&str> = key.split_whitespace().collect();
            assert_eq!(f.len(), 4, "`state call column outcome | reason`: {l}");
            Departure {
                state: f[0].to_string(),
                op: f[1].to_string(),
                column: f[2].to_string(),
                outcome: f[3].to_string(),
                reason: reason.trim().to_string(),
                used: std::cell::Cell::new(false),
            }
        })
        .collect()
}

fn listed<'a>(list: &'a [Departure], st: St, op: Op, column: &str, o: &Outcome) -> Option<&'a Departure> {
    let rc = o.rc.to_string();
    let rc = rc.split(' ').next().unwrap_or_default();
    let d = list.iter().find(|d| {
        (d.state == "*" || d.state == st.name())
            && (d.op == "*" || d.op == op.name())
            && d.column == column
            && (d.outcome == "*" || d.outcome == rc)
    })?;
    d.used.set(true);
    Some(d)
}

struct Row {
    st: St,
    op: Op,
    machine: (Rc, Option<QpState>),
    sim: Outcome,
    /// Each distinct librdmacm outcome with its count (one entry but for timing states).
    hw: Vec<(Outcome, usize)>,
}

fn machine_text(m: &(Rc, Option<QpState>), before: Option<QpState>) -> String {
    let o = Outcome {
        rc: m.0.clone(),
        qp_before: before,
        qp_after: m.1,
        events: Vec::new(),
    };
    o.short()
}

/// Whether a column's outcome agrees with the machine (return and QP state after).
fn agrees(o: &Outcome, m: &(Rc, Option<QpState>), compare_qp: bool) -> bool {
    match o.rc {
        Rc::NotIssued(_) => true,
        _ => o.rc == m.0 && (!compare_qp || o.qp_after == m.1),
    }
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut hw_addr: Option<IpAddr> = None;
    let mut hw = false;
    let mut removal: Option<String> = None;
    let mut silent: Option<(IpAddr, String)> = None;
    let mut i = 0;
    let bad = |msg: String| {
        eprintln!(
            "differential: {msg} (options: --hw, --addr IP, --remove-device LINK:NETDEV, \
             --silent-peer IP:NETDEV)"
        );
        ExitCode::from(2)
    };
    while i < args.len() {
        match args[i].as_str() {
            "--hw" => hw = true,
            "--remove-device" => {
                i += 1;
                match args.get(i) {
                    Some(spec) if spec.contains(':') => removal = Some(spec.clone()),
                    _ => return bad("--remove-device needs LINK:NETDEV (rxe0:veth0)".into()),
                }
            }
            "--silent-peer" => {
                i += 1;
                let spec = args.get(i).and_then(|s| s.split_once(':'));
                match spec.and_then(|(ip, dev)| Some((ip.parse().ok()?, dev.to_string()))) {
                    Some(peer) => silent = Some(peer),
                    None => return bad("--silent-peer needs IP:NETDEV (10.0.0.253:veth0)".into()),
                }
            }
            "--addr" => {
                i += 1;
                let Some(a) = args.get(i).and_then(|a| a.split(':').next()?.parse().ok()) else {
                    return bad("--addr needs an IP address".into());
                };
                hw_addr = Some(a);
            }
            #[cfg(feature = "differential")]
            "--child" => {
                let (Some(st), Some(op)) = (
                    args.get(i + 1).and_then(|s| St::parse(s)),
                    args.get(i + 2).and_then(|s| Op::parse(s)),
                ) else {
                    return bad("--child STATE CALL".into());
                };
                let Some(addr) = args.get(i + 4).and_then(|a| a.parse().ok()) else {
                    return bad("--child needs --addr IP:PORT".into());
                };
                let runs = args.get(i + 6).and_then(|n| n.parse().ok()).unwrap_or(1);
                let Some(silent) = args.get(i + 8).and_then(|a| a.parse().ok()) else {
                    return bad("--child needs --silent IP".into());
                };
                return hw::child(st, op, addr, silent, runs);
            }
            other => return bad(format!("unknown option {other}")),
        }
        i += 1;
    }
    if hw && cfg!(not(feature = "differential")) {
        return bad("--hw needs the build with --features differential".into());
    }
    let hw_addr = match (
        hw,
        hw_addr.or_else(|| std::env::var("CM_HW_ADDR").ok()?.parse().ok()),
    ) {
        (false, _) => None,
        (true, Some(a)) => Some(a),
        (true, None) => return bad("--hw needs --addr IP or CM_HW_ADDR".into()),
    };
    run(hw_addr, removal.as_deref(), silent)
}

fn run(hw_addr: Option<IpAddr>, removal: Option<&str>, silent: Option<(IpAddr, String)>) -> ExitCode {
    let started = std::time::Instant::now();
    let list = departures();
    let mut rows = Vec::new();
    let mut drive_failures = Vec::new();
    for st in STATES {
        for op in OPS {
            match sim_probe(st, op) {
                Ok((sim, machine)) => rows.push(Row {
                    st,
                    op,
                    machine,
                    sim,
                    hw: Vec::new(),
                }),
                Err(e) => drive_failures.push(format!("simulator {} {}: {e}", st.name(), op.name())),
            }
        }
    }
    if let Some(ip) = hw_addr {
        if let Err(e) = hw_probe() {
            eprintln!("differential: --hw without a device: {e}");
            return ExitCode::FAILURE;
        }
        hw_column(ip, removal, silent, &mut rows);
    }
    let hw_ran = hw_addr.is_some();

    println!(
        "--- differential table ({} backend columns)",
        if hw_ran {
            "librdmacm, machine, simulator"
        } else {
            "machine, simulator"
        }
    );
    println!(
        "{:<21} {:<13} {:<34} {:<24} {:<24} verdict",
        "state", "call", "librdmacm", "machine", "simulator"
    );
    let (mut agree, mut departs, mut unlisted, mut not_issued, mut timing) = (0, 0, 0, 0, 0);
    let mut problems = Vec::new();
    for row in &rows {
        let m = &row.machine;
        let mut verdicts = Vec::new();
        let mut ok = true;
        if !agrees(&row.sim, m, true) {
            match listed(&list, row.st, row.op, "simulator", &row.sim) {
                Some(d) => verdicts.push(format!("departure (simulator): {}", d.reason)),
                None => {
                    ok = false;
                    problems.push(format!(
                        "{} {}: simulator {} / machine {}",
                        row.st.name(),
                        row.op.name(),
                        row.sim.short(),
                        machine_text(m, row.sim.qp_before)
                    ));
                }
            }
        }
        // Device removal runs only where the program may remove and restore the device.
        let mut hw_text = if row.hw.is_empty() {
            "(not run)".to_string()
        } else {
            String::new()
        };
        for (o, n) in &row.hw {
            if !hw_text.is_empty() {
                hw_text += " / ";
            }
            hw_text += &o.short();
            if row.st.timing() {
                hw_text += &format!(" x{n}");
            }
            if matches!(o.rc, Rc::NotIssued(_)) {
                not_issued += 1;
            }
            if agrees(o, m, true) {
                continue;
            }
            match listed(&list, row.st, row.op, "librdmacm", o) {
                Some(d) => verdicts.push(format!("departure: {}", d.reason)),
                None => {
                    ok = false;
                    problems.push(format!(
                        "{} {}: librdmacm {} / machine {}",
                        row.st.name(),
                        row.op.name(),
                        o.short(),
                        machine_text(m, row.sim.qp_before)
                    ));
                }
            }
        }
        if row.st.timing() && hw_ran {
            timing += 1;
            verdicts.push(format!("timing-dependent, {TIMING_RUNS} runs"));
        }
        let listed_any = verdicts.iter().any(|v| v.starts_with("departure"));
        match (ok, listed_any) {
            (false, _) => unlisted += 1,
            (true, true) => departs += 1,
            (true, false) => agree += 1,
        }
        let verdict = if ok {
            if verdicts.is_empty() {
                "agree".to_string()
            } else {
                verdicts.join("; ")
            }
        } else {
            "DIFFERS (not listed)".to_string()
        };
        println!(
            "{:<21} {:<13} {:<34} {:<24} {:<24} {}",
            row.st.name(),
            row.op.name(),
            hw_text,
            machine_text(m, row.sim.qp_before),
            row.sim.short(),
            verdict
        );
        let events: Vec<String> = row
            .hw
            .iter()
            .filter(|(o, _)| !o.events.is_empty())
            .map(|(o, _)| format!("librdmacm: {}", o.events.join(" ")))
            .chain((!row.sim.events.is_empty()).then(|| format!("simulator: {}", row.sim.events.join(" "))))
            .collect();
        if !events.is_empty() {
            println!("{:<35}events {}", "", events.join(" | "));
        }
    }
    println!("--- end of table");
    let stale: Vec<&Departure> = list
        .iter()
        // An entry for a timing-dependent state may match no run of this one.
        .filter(|d| !d.used.get() && !St::parse(&d.state).is_some_and(St::timing))
        .filter(|d| hw_ran || d.column == "simulator")
        .collect();
    for p in &problems {
        println!("differs: {p}");
    }
    for d in &stale {
        println!(
            "stale departure (matched nothing): {} {} {} {} | {}",
            d.state, d.op, d.column, d.outcome, d.reason
        );
    }
    for f in &drive_failures {
        println!("drive failed: {f}");
    }
    println!(
        "differential: {} pairs ({} states x {} calls), {agree} agree, {departs} known departures, \
         {unlisted} unlisted differences, {not_issued} not issued, {timing} timing-dependent, \
         {} stale list entries, {} drive failures; {}; {:.1}s",
        rows.len(),
        STATES.len(),
        OPS.len(),
        stale.len(),
        drive_failures.len(),
        if hw_ran {
            "librdmacm measured"
        } else {
            "librdmacm not run (no --hw)"
        },
        started.elapsed().as_secs_f64()
    );
    if unlisted == 0 && stale.is_empty() && drive_failures.is_empty() {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// `rdma link delete LINK` of `LINK:NETDEV`, started (it may wait for the probes to let go).
#[cfg(feature = "differential")]
fn remove_device(spec: &str) -> std::io::Result<std::process::Child> {
    let link = spec.split(':').next().unwrap_or(spec);
    std::process::Command::new("rdma")
        .args(["link", "delete", link])
        .spawn()
}

/// A MAC that no interface has (locally administered): frames to it leave and are never taken.
#[cfg(feature = "differential")]
const NOBODYS_MAC: &str = "02:00:00:00:15:fe";

/// Makes `peer` a silent peer: a permanent neighbour entry on `dev` to nobody's MAC, so that the
/// address resolves at once and a connection request to it goes out and is never answered.
#[cfg(feature = "differential")]
fn silence(peer: IpAddr, dev: &str) -> Result<(), String> {
    let peer = peer.to_string();
    let args = [
        "neigh",
        "replace",
        &peer,
        "lladdr",
        NOBODYS_MAC,
        "dev",
        dev,
        "nud",
        "permanent",
    ];
    ip(&args)
}

/// Removes the neighbour entry of [`silence`].
#[cfg(feature = "differential")]
fn unsilence(peer: IpAddr, dev: &str) {
    if let Err(e) = ip(&["neigh", "del", &peer.to_string(), "dev", dev]) {
        eprintln!("differential: the silent peer's neighbour entry stays: {e}");
    }
}

/// Runs iproute2's `ip` within 10 s.
#[cfg(feature = "differential")]
fn ip(args: &[&str]) -> Result<(), String> {
    let mut child = std::process::Command::new("ip")
        .args(args)
        .spawn()
        .map_err(|e| format!("ip {}: {e}", args.join(" ")))?;
    if !wait_bounded(&mut child, std::time::Instant::now() + Duration::from_secs(10)) {
        return Err(format!("ip {}: no exit within 10 s", args.join(" ")));
    }
    match child.wait() {
        Ok(status) if status.success() => Ok(()),
        Ok(status) => Err(format!("ip {}: {status}", args.join(" "))),
        Err(e) => Err(format!("ip {}: {e}", args.join(" "))),
    }
}

/// `rdma link add LINK type rxe netdev NETDEV`, waited for within 30 s.
#[cfg(feature = "differential")]
fn restore_device(spec: &str) {
    let Some((link, netdev)) = spec.split_once(':') else {
        return;
    };
    let added = std::process::Command::new("rdma")
        .args(["link", "add", link, "type", "rxe", "netdev", netdev])
        .spawn()
        .map(|mut c| wait_bounded(&mut c, std::time::Instant::now() + Duration::from_secs(30)));
    eprintln!("differential: rdma link add {link}: {added:?}");
}

/// Waits for `child` until `until`; false (and the child killed) when it did not end in time.
#[cfg(feature = "differential")]
fn wait_bounded(child: &mut std::process::Child, until: std::time::Instant) -> bool {
    while std::time::Instant::now() < until {
        if let Ok(Some(_)) = child.try_wait() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let _ = child.kill();
    false
}

#[cfg(feature = "differential")]
fn hw_probe() -> Result<(), CmError> {
    cm::hw::probe()
}

#[cfg(not(feature = "differential"))]
fn hw_probe() -> Result<(), CmError> {
    unreachable!("--hw is refused without the differential feature");
}

#[cfg(not(feature = "differential"))]
fn hw_column(_ip: IpAddr, _removal: Option<&str>, _silent: Option<(IpAddr, String)>, _rows: &mut [Row]) {
    unreachable!("--hw is refused without the differential feature");
}

#[cfg(feature = "differential")]
fn hw_column(ip: IpAddr, removal: Option<&str>, silent: Option<(IpAddr, String)>, rows: &mut [Row]) {
    use std::collections::BTreeMap;
    // UNREACHABLE needs the silent peer; without one its rows stay "(not run)".
    let silent = silent.and_then(|(peer, dev)| match silence(peer, &dev) {
        Ok(()) => Some((peer, dev)),
        Err(e) => {
            eprintln!("differential: no silent peer, UNREACHABLE not probed: {e}");
            None
        }
    });
    let silent_ip = silent.as_ref().map(|(peer, _)| *peer);
    // One port range per probe: concurrent probes must not share a listener's address.
    let port = |si: usize, oi: usize, run: usize| 20000 + (si * OPS.len() + oi) as u16 * 16 + run as u16 * 2;
    // Everything within the suite's bound, so that the table is printed whatever hangs.
    let suite_deadline = std::time::Instant::now() + Duration::from_secs(210);
    let spawn_state = |si: usize, st: St| {
        let runs = if st.timing() { TIMING_RUNS } else { 1 };
        OPS.into_iter()
            .enumerate()
            .map(|(oi, op)| {
                let addr = SocketAddr::new(ip, port(si, oi, 0));
                hw::spawn(st, op, addr, silent_ip.unwrap_or(ip), runs, suite_deadline)
            })
            .collect::<Vec<_>>()
    };
    let mut results: BTreeMap<(St, Op), Vec<Outcome>> = BTreeMap::new();
    // The slow states first, collected last: their retries run while the others are probed.
    let slow_started = std::time::Instant::now();
    let slow: Vec<hw::Running> = STATES
        .into_iter()
        .enumerate()
        .filter(|(_, st)| st.slow() && silent_ip.is_some())
        .flat_map(|(si, st)| spawn_state(si, st))
        .collect();
    for (si, st) in STATES
        .into_iter()
        .enumerate()
        .filter(|(_, st)| !st.slow() && *st != St::DeviceRemoval)
    {
        let t = std::time::Instant::now();
        for r in spawn_state(si, st) {
            let key = (r.st, r.op);
            results.entry(key).or_default().extend(hw::finish(r));
        }
        eprintln!(
            "differential: {} probed in {:.1}s",
            st.name(),
            t.elapsed().as_secs_f64()
        );
    }
    let slow_probes = slow.len();
    for r in slow {
        let key = (r.st, r.op);
        results.entry(key).or_default().extend(hw::finish(r));
    }
    if slow_probes > 0 {
        eprintln!(
            "differential: slow states probed in {:.1}s (started first)",
            slow_started.elapsed().as_secs_f64()
        );
    }
    if let Some((peer, dev)) = &silent {
        unsilence(*peer, dev);
    }
    // Device removal last: it takes the device from every probe at once.
    if let Some(link) = removal {
        let si = STATES
            .iter()
            .position(|&s| s == St::DeviceRemoval)
            .expect("listed");
        let removal_deadline = std::time::Instant::now() + Duration::from_secs(60);
        let mut probes = spawn_state(si, St::DeviceRemoval);
        let ready_until = std::time::Instant::now() + Duration::from_secs(30);
        let ready = probes
            .iter_mut()
            .map(|r| r.ready(ready_until))
            .filter(|&ready| ready)
            .count();
        eprintln!("differential: {ready} of {} removal probes ready", probes.len());
        match remove_device(link) {
            Ok(mut delete) => {
                std::thread::sleep(Duration::from_millis(500));
                for r in &mut probes {
                    r.go();
                }
                for r in probes {
                    let key = (r.st, r.op);
                    results.entry(key).or_default().extend(hw::finish(r));
                }
                // The probes have exited or been killed: the removal can finish, and the device
                // comes back for whatever runs next.
                let ended = wait_bounded(&mut delete, removal_deadline);
                eprintln!(
                    "differential: rdma link delete {}",
                    if ended { "finished" } else { "still running" }
                );
                restore_device(link);
            }
            Err(e) => eprintln!("differential: device removal not run: {e}"),
        }
    }
    for row in rows {
        let Some(outcomes) = results.remove(&(row.st, row.op)) else {
            continue;
        };
        let mut counted: BTreeMap<Outcome, usize> = BTreeMap::new();
        for o in outcomes {
            *counted.entry(o).or_default() += 1;
        }
        // Merge runs whose return and QP agree but whose events differ.
        let mut merged: Vec<(Outcome, usize)> = Vec::new();
        for (o, n) in counted {
            match merged.iter_mut().find(|(m, _)| m.short() == o.short()) {
                Some((_, total)) => *total += n,
                None => merged.push((o, n)),
            }
        }
        row.hw = merged;
    }
}
