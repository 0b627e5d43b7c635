//! Property tests: random call sequences over several ids on two hosts, including misuse and
//! early destroys, checked against cm-core's state machine as the reference model.
//!
//! Invariants, after every step:
//! * no panic, and every call's result equals the model's (errors the model cannot know about —
//!   an address already in use, a request whose sender went away — are allowed only for the
//!   calls where they can happen, and then nothing may change);
//! * every event is legal for its id's state as the model has it, and the backend's view of
//!   every id equals the model's;
//! * every completion belongs to a posted work request and arrives once; on a QP in ERR every
//!   posted request completes;
//! * after all events are acked, destroy_qp then destroy_id always succeed, and nothing is
//!   left alive.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{
    errno, Call, ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, HandleKind, IdHandle,
    IdMachine, Invocation, Outcome, PortSpace, QpCaps, QpState, WcStatus,
};
use proptest::prelude::*;
use proptest::sample::Index;

use crate::support::Bed;

/// Which id an op applies to: with `aim`, one of the ids the model says the call is legal for
/// (when there is one), so sequences get far into the lifecycle; otherwise any id, dead ones
/// included, so misuse is exercised too.
#[derive(Clone, Debug)]
enum Pick {
    Random {
        index: Index,
        aim: bool,
    },
    /// An id chosen by [`Op::Drive`].
    Exact(usize),
}

/// A librdmacm call on the id a [`Pick`] chooses, with the arguments it is made with.
type IdCall = Invocation<Pick, ()>;

/// One step of a case. The calls whose arguments exist only on the bed (its addresses and
/// ports, its waits, the work request numbers the run hands out) are named by what the step
/// makes of them; every call goes through [`Run::call`].
#[derive(Clone, Debug)]
enum Op {
    CreateId {
        side: bool,
        datagram: bool,
    },
    /// A call on the id its `Invocation` picks.
    Call(Box<IdCall>),
    /// `bind_addr` to the id's host at port base + `port` (0: an ephemeral port, 4: the
    /// wildcard of the bed's family at base + 3).
    Bind {
        id: Pick,
        port: u8,
    },
    /// `resolve_addr` to base + `port` of the server, the client or an address nobody has.
    ResolveAddr {
        id: Pick,
        to_server: bool,
        port: u8,
        unreachable: bool,
    },
    /// `resolve_route` with the bed's wait.
    ResolveRoute {
        id: Pick,
    },
    Foreign {
        id: Pick,
    },
    GetEvent {
        side: bool,
        wait: u8,
        ack: bool,
    },
    AckHeld {
        which: Index,
    },
    /// `post_send` of `len` bytes, numbered by the run.
    PostSend {
        id: Pick,
        len: u8,
    },
    /// `post_recv` of `len` bytes, numbered by the run.
    PostRecv {
        id: Pick,
        len: u8,
    },
    PollCq {
        id: Pick,
    },
    /// The next sensible call for a live id, chosen from its state (see [`Run::drive`]).
    Drive {
        which: Index,
        choice: u8,
    },
}

fn on_id(call: IdCall) -> Op {
    Op::Call(Box::new(call))
}

fn create_qp(id: Pick) -> Op {
    on_id(Invocation::CreateQp {
        id,
        caps: QpCaps::new(),
    })
}

fn destroy_qp(id: Pick) -> Op {
    on_id(Invocation::DestroyQp { id })
}

fn listen(id: Pick, backlog: u8) -> Op {
    on_id(Invocation::Listen {
        id,
        backlog: i32::from(backlog),
    })
}

fn connect(id: Pick, pdata: u8) -> Op {
    on_id(Invocation::Connect {
        id,
        param: ConnParam::new().with_private_data(&vec![0xC0; usize::from(pdata)]),
    })
}

fn accept(id: Pick, pdata: u8) -> Op {
    on_id(Invocation::Accept {
        id,
        param: ConnParam::new().with_private_data(&vec![0xA0; usize::from(pdata)]),
    })
}

fn reject(id: Pick, pdata: u8) -> Op {
    on_id(Invocation::Reject {
        id,
        private_data: vec![0x5E; usize::from(pdata)],
    })
}

fn disconnect(id: Pick) -> Op {
    on_id(Invocation::Disconnect { id })
}

fn destroy_id(id: Pick) -> Op {
    on_id(Invocation::DestroyId { id })
}

/// Whether an aimed pick may choose an id in state `m` for `call`: the machine allows the call
/// (with no private data, whose length is the call's own business), and a listen aims at bound
/// ids only.
fn aims(call: &IdCall, m: &IdMachine) -> bool {
    let mut bare = call.clone();
    match &mut bare {
        Invocation::Connect { param, .. } | Invocation::Accept { param, .. } => {
            param.private_data = ConnParam::new().private_data;
        }
        Invocation::Reject { private_data, .. } => private_data.clear(),
        Invocation::Listen { .. } if m.state() != cm::api::IdState::AddrBound => return false,
        _ => {}
    }
    bare.check(m).is_ok()
}

fn pick(aim: f64) -> impl Strategy<Value = Pick> {
    (any::<Index>(), prop::bool::weighted(aim)).prop_map(|(index, aim)| Pick::Random { index, aim })
}

fn op() -> impl Strategy<Value = Op> {
    let id = || pick(0.5);
    prop_oneof![
        3 => (any::<bool>(), prop::bool::weighted(0.1)).prop_map(|(side, datagram)| Op::CreateId { side, datagram }),
        2 => (id(), 0u8..5).prop_map(|(id, port)| Op::Bind { id, port }),
        3 => (id(), any::<bool>(), 1u8..4, prop::bool::weighted(0.1))
            .prop_map(|(id, to_server, port, unreachable)| Op::ResolveAddr { id, to_server, port, unreachable }),
        3 => id().prop_map(|id| Op::ResolveRoute { id }),
        3 => id().prop_map(create_qp),
        1 => id().prop_map(destroy_qp),
        2 => (id(), 0u8..3).prop_map(|(id, backlog)| listen(id, backlog)),
        3 => (id(), 0u8..60).prop_map(|(id, pdata)| connect(id, pdata)),
        3 => (id(), 0u8..200).prop_map(|(id, pdata)| accept(id, pdata)),
        1 => (id(), 0u8..150).prop_map(|(id, pdata)| reject(id, pdata)),
        2 => id().prop_map(disconnect),
        2 => id().prop_map(destroy_id),
        1 => id().prop_map(|id| Op::Foreign { id }),
        8 => (any::<bool>(), 0u8..4, prop::bool::weighted(0.85)).prop_map(|(side, wait, ack)| Op::GetEvent { side, wait, ack }),
        2 => any::<Index>().prop_map(|which| Op::AckHeld { which }),
        2 => (id(), 0u8..=64).prop_map(|(id, len)| Op::PostSend { id, len }),
        2 => (id(), 64u8..=128).prop_map(|(id, len)| Op::PostRecv { id, len }),
        2 => id().prop_map(|id| Op::PollCq { id }),
    ]
}

/// The test's own record of one id.
struct ModelId {
    side: usize,
    handle: IdHandle,
    m: IdMachine,
    alive: bool,
    /// Work requests posted and not completed yet.
    outstanding: BTreeSet<u64>,
    /// Bound to its host's address at base + 1 (where drivers send their connections).
    on_port1: bool,
}

struct Run<'a, B: CmBackend> {
    bed: &'a mut Bed<B>,
    channels: [cm::api::ChannelHandle; 2],
    ids: Vec<ModelId>,
    held: Vec<(usize, CmEvent)>,
    next_wr: u64,
    log: Vec<String>,
}

/// Errors the model cannot predict, and the calls that may return them.
fn environmental(call: Call, err: &CmError) -> bool {
    match err {
        CmError::AddrInUse { .. } | CmError::AddrNotAvailable { .. } => {
            matches!(call, Call::BindAddr | Call::ResolveAddr | Call::Listen)
        }
        CmError::Os { errno: e, .. } => {
            *e == errno::EINVAL && matches!(call, Call::Accept | Call::Reject | Call::CreateQp)
        }
        CmError::QueueFull { .. } => matches!(call, Call::PostSend | Call::PostRecv),
        _ => false,
    }
}

impl<B: CmBackend> Run<'_, B> {
    fn backend(&mut self, side: usize) -> &mut B {
        if side == 0 {
            &mut self.bed.server
        } else {
            &mut self.bed.client
        }
    }

    fn pick(&self, pick: &Pick, legal: impl Fn(&IdMachine) -> bool) -> Option<usize> {
        let (index, aim) = match pick {
            Pick::Exact(i) => return Some(*i),
            Pick::Random { index, aim } => (index, *aim),
        };
        if aim {
            let candidates: Vec<usize> = (0..self.ids.len())
                .filter(|&i| self.ids[i].alive && legal(&self.ids[i].m))
                .collect();
            if !candidates.is_empty() {
                return Some(candidates[index.index(candidates.len())]);
            }
        }
        (!self.ids.is_empty()).then(|| index.index(self.ids.len()))
    }

    fn check_view(&mut self, i: usize) -> Result<(), TestCaseError> {
        let (side, handle, alive, want) = (
            self.ids[i].side,
            self.ids[i].handle,
            self.ids[i].alive,
            self.ids[i].m,
        );
        if !alive {
            return Ok(());
        }
        let got = self.backend(side).id_machine(handle);
        prop_assert_eq!(
            got,
            Ok(want),
            "backend's view of {} differs from the model",
            handle
        );
        Ok(())
    }

    /// Makes `call` on the id of the model's index it names and checks it against the model
    /// (the machine's own verdict, [`Invocation::check`]); whether it succeeded.
    fn call(&mut self, call: Invocation<usize, ()>) -> Result<bool, TestCaseError> {
        let i = *call.id().expect("the calls made are on an id");
        let (side, handle, alive) = (self.ids[i].side, self.ids[i].handle, self.ids[i].alive);
        let name = call.call();
        let had_qp = self.ids[i].m.qp().is_some() && alive;
        let made: Invocation<IdHandle, ChannelHandle> = call
            .map_handles(|_| Ok(handle), |()| Err("the calls on an id take no channel"))
            .map_err(TestCaseError::fail)?;
        let got = made.invoke(self.backend(side)).map(|_: Outcome| ());
        self.log.push(format!("{name} {handle} -> {got:?}"));
        if name == Call::DestroyQp && had_qp {
            // Completions not polled are lost with the QP.
            self.ids[i].outstanding.clear();
        }
        let succeeded = got.is_ok();
        if !alive {
            let unknown = Err(CmError::UnknownHandle {
                call: name,
                kind: HandleKind::Id,
            });
            prop_assert_eq!(got, unknown, "use after destroy");
            return Ok(false);
        }
        let m = self.ids[i].m;
        let want = made.check(&m).map(|next| next.unwrap_or(m));
        match (want, got) {
            (Ok(next), Ok(())) => {
                if name == Call::DestroyId {
                    self.ids[i].alive = false;
                    return Ok(true);
                }
                self.ids[i].m = next;
            }
            (Ok(_), Err(e)) if environmental(name, &e) => {
                if name == Call::Accept {
                    // librdmacm moved the QP through RTR/RTS and then to ERR.
                    self.ids[i].m = self.ids[i].m.qp_error();
                }
            }
            (want, got) => prop_assert_eq!(got, want.map(|_| ()), "{} on {}", name, handle),
        }
        self.check_view(i)?;
        Ok(succeeded)
    }

    fn step(&mut self, op: &Op, waits: &dyn Fn(u8) -> Duration) -> Result<(), TestCaseError> {
        let server_ip = self.bed.server_ip;
        let client_ip = self.bed.client_ip;
        let unreachable = self.bed.unreachable_ip;
        let base = self.bed.base_port();
        match *op {
            Op::CreateId { side, datagram } => {
                let side = usize::from(side);
                let ps = if datagram { PortSpace::Udp } else { PortSpace::Tcp };
                let ch = self.channels[side];
                let handle = self
                    .backend(side)
                    .create_id(ch, ps)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                self.ids.push(ModelId {
                    side,
                    handle,
                    m: IdMachine::new(ps),
                    alive: true,
                    outstanding: BTreeSet::new(),
                    on_port1: false,
                });
            }
            Op::Bind { ref id, port } => {
                let Some(i) = self.pick(id, |m| m.bind_addr(false).is_ok()) else {
                    return Ok(());
                };
                let ip = if self.ids[i].side == 0 {
                    server_ip
                } else {
                    client_ip
                };
                let addr = match port {
                    0 => SocketAddr::new(ip, 0),
                    // The wildcard of the bed's family (the hardware runner runs on both).
                    4 if ip.is_ipv4() => SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), base + 3),
                    4 => SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), base + 3),
                    p => SocketAddr::new(ip, base + u16::from(p)),
                };
                if self.call(Invocation::BindAddr { id: i, addr })? {
                    self.ids[i].on_port1 = port == 1;
                }
            }
            Op::ResolveAddr {
                ref id,
                to_server,
                port,
                unreachable: far,
            } => {
                let Some(i) = self.pick(id, |m| m.resolve_addr().is_ok()) else {
                    return Ok(());
                };
                let ip = match (far, to_server) {
                    (true, _) => unreachable,
                    (false, true) => server_ip,
                    (false, false) => client_ip,
                };
                let dst = SocketAddr::new(ip, base + u16::from(port));
                let call = Invocation::ResolveAddr {
                    id: i,
                    src: None,
                    dst,
                    timeout: waits(1),
                };
                self.call(call)?;
            }
            Op::ResolveRoute { ref id } => {
                let Some(i) = self.pick(id, |m| m.resolve_route().is_ok()) else {
                    return Ok(());
                };
                let timeout = waits(2);
                self.call(Invocation::ResolveRoute { id: i, timeout })?;
            }
            Op::Call(ref call) => {
                let pick = call.id().expect("the generated calls are on an id");
                let Some(i) = self.pick(pick, |m| aims(call, m)) else {
                    return Ok(());
                };
                let call = call
                    .clone()
                    .map_handles(|_| Ok::<_, std::convert::Infallible>(i), Ok)
                    .unwrap_or_else(|never| match never {});
                self.call(call)?;
            }
            Op::Foreign { ref id } => {
                let Some(i) = self.pick(id, |_| true) else {
                    return Ok(());
                };
                let (other, handle) = (1 - self.ids[i].side, self.ids[i].handle);
                let got = self.backend(other).destroy_id(handle);
                prop_assert_eq!(
                    got,
                    Err(CmError::UnknownHandle {
                        call: Call::DestroyId,
                        kind: HandleKind::Id
                    })
                );
                self.check_view(i)?;
            }
            Op::GetEvent { side, wait, ack } => self.get_event(usize::from(side), waits(wait), ack)?,
            Op::AckHeld { ref which } => {
                if !self.held.is_empty() {
                    let (side, ev) = self.held.remove(which.index(self.held.len()));
                    self.ack(side, ev)?;
                }
            }
            Op::PostSend { ref id, len } => {
                let Some(i) = self.pick(id, |m| m.post_send().is_ok()) else {
                    return Ok(());
                };
                self.next_wr += 1;
                let wr = self.next_wr;
                let data = vec![0xDA; usize::from(len)];
                if self.call(Invocation::PostSend {
                    id: i,
                    wr_id: wr,
                    data,
                })? {
                    self.ids[i].outstanding.insert(wr);
                }
            }
            Op::PostRecv { ref id, len } => {
                let Some(i) = self.pick(id, |m| m.post_recv().is_ok()) else {
                    return Ok(());
                };
                self.next_wr += 1;
                let wr = self.next_wr;
                let len = u32::from(len);
                if self.call(Invocation::PostRecv {
                    id: i,
                    wr_id: wr,
                    len,
                })? {
                    self.ids[i].outstanding.insert(wr);
                }
            }
            Op::PollCq { ref id } => {
                let Some(i) = self.pick(id, |m| m.qp().is_some()) else {
                    return Ok(());
                };
                self.poll(i, waits(0))?;
            }
            Op::Drive { ref which, choice } => {
                let live: Vec<usize> = (0..self.ids.len()).filter(|&i| self.ids[i].alive).collect();
                if live.is_empty() {
                    return self.step(
                        &Op::CreateId {
                            side: choice % 2 == 0,
                            datagram: false,
                        },
                        waits,
                    );
                }
                // Mostly drive an id that can make progress rather than one that waits.
                let busy: Vec<usize> = live
                    .iter()
                    .copied()
                    .filter(|&i| !matches!(self.drive(i, choice), Op::GetEvent { .. }))
                    .collect();
                let pool = if choice & 0xC0 != 0 && !busy.is_empty() {
                    &busy
                } else {
                    &live
                };
                let i = pool[which.index(pool.len())];
                let op = self.drive(i, choice);
                return self.step(&op, waits);
            }
        }
        Ok(())
    }

    /// What a well-behaved application would do next with id `i`, varied by `choice`.
    fn drive(&self, i: usize, choice: u8) -> Op {
        use cm::api::{ConnPhase as P, IdState as S, Role};
        let m = self.ids[i].m;
        let id = || Pick::Exact(i);
        let side = self.ids[i].side == 1;
        let wait = Op::GetEvent {
            side,
            wait: 1 + choice % 3,
            ack: true,
        };
        let release = if m.qp().is_some() {
            destroy_qp(id())
        } else {
            destroy_id(id())
        };
        // Connect where a listener waits, when there is one.
        let listening = |s: usize| {
            self.ids
                .iter()
                .any(|o| o.alive && o.side == s && o.on_port1 && o.m.state() == S::Listen)
        };
        let to_server = if listening(0) || listening(1) {
            listening(0) && (choice % 4 < 3 || !listening(1))
        } else {
            choice % 2 == 0
        };
        let port1_taken = self
            .ids
            .iter()
            .any(|o| o.alive && o.side == self.ids[i].side && o.on_port1);
        match (m.state(), m.role(), m.phase()) {
            (S::Idle, _, _) if choice % 3 == 0 && !port1_taken => Op::Bind { id: id(), port: 1 },
            (S::AddrBound, _, _) if self.ids[i].on_port1 => listen(id(), 0),
            (S::Idle | S::AddrBound, _, _) => Op::ResolveAddr {
                id: id(),
                to_server,
                port: 1,
                unreachable: choice == 255,
            },
            (S::AddrResolved, _, _) => Op::ResolveRoute { id: id() },
            (S::RouteResolved, _, _) if m.qp().is_none() => create_qp(id()),
            (S::RouteResolved, _, _) => connect(id(), choice % 57),
            (S::Connect, Role::Passive, P::Requested) if m.qp().is_none() => create_qp(id()),
            (S::Connect, Role::Passive, P::Requested) if choice % 8 == 0 => reject(id(), choice % 149),
            (S::Connect, Role::Passive, P::Requested) => accept(id(), choice % 197),
            (S::Connect, _, P::Established) => match choice % 5 {
                0 | 1 => disconnect(id()),
                2 => Op::PostSend {
                    id: id(),
                    len: choice % 65,
                },
                3 => Op::PostRecv {
                    id: id(),
                    len: 64 + choice % 65,
                },
                _ => Op::PollCq { id: id() },
            },
            (S::Connect, _, P::Failed | P::Rejected) | (S::DeviceRemoval, _, _) => release,
            (S::Disconnect, _, _) => match choice % 3 {
                0 => disconnect(id()),
                1 => Op::PollCq { id: id() },
                _ => release,
            },
            (S::Listen, _, _) if choice % 16 == 0 => destroy_id(id()),
            _ => wait,
        }
    }

    fn poll(&mut self, i: usize, wait: Duration) -> Result<usize, TestCaseError> {
        let (side, handle, alive) = (self.ids[i].side, self.ids[i].handle, self.ids[i].alive);
        let mut out = Vec::new();
        let got = self.backend(side).poll_cq(handle, &mut out, 64, wait);
        if !alive {
            prop_assert_eq!(
                got,
                Err(CmError::UnknownHandle {
                    call: Call::PollCq,
                    kind: HandleKind::Id
                })
            );
            return Ok(0);
        }
        if self.ids[i].m.qp().is_none() {
            prop_assert_eq!(got, Err(CmError::NoQp { call: Call::PollCq }));
            return Ok(0);
        }
        prop_assert!(got.is_ok(), "poll_cq: {:?}", got);
        for wc in &out {
            prop_assert!(
                self.ids[i].outstanding.remove(&wc.wr_id),
                "completion {:?} for no outstanding request (or twice)",
                wc
            );
            if wc.status == WcStatus::WrFlushErr {
                prop_assert_eq!(
                    self.ids[i].m.qp(),
                    Some(QpState::Err),
                    "flushed completion while the QP is not in ERR"
                );
            } else {
                prop_assert_eq!(wc.status, WcStatus::Success, "{:?}", wc);
            }
        }
        Ok(out.len())
    }

    fn get_event(&mut self, side: usize, wait: Duration, ack: bool) -> Result<(), TestCaseError> {
        let ch = self.channels[side];
        let got = self.backend(side).get_cm_event(ch, wait);
        let ev = match got {
            Ok(Some(ev)) => ev,
            Ok(None) => return Ok(()),
            Err(e) => return Err(TestCaseError::fail(format!("get_cm_event: {e}"))),
        };
        self.log.push(format!(
            "event {} on {} status {}",
            ev.event(),
            ev.id(),
            ev.status()
        ));
        let counted = ev.counted_id();
        let Some(i) = self
            .ids
            .iter()
            .position(|m| m.handle == counted && m.alive && m.side == side)
        else {
            return Err(TestCaseError::fail(format!(
                "{ev} counts against an id the model does not know"
            )));
        };
        let next = self.ids[i]
            .m
            .on_event(ev.event())
            .map_err(|illegal| TestCaseError::fail(illegal.to_string()))?;
        self.ids[i].m = next;
        let status_ok = match ev.event() {
            CmEventType::AddrError | CmEventType::Unreachable if ev.status() == -errno::ETIMEDOUT => true,
            CmEventType::AddrError => false,
            // IB_CM_REJ_TIMEOUT, INVALID_SERVICE_ID, CONSUMER_DEFINED (include/rdma/ib_cm.h).
            CmEventType::Rejected => matches!(ev.status(), 4 | 8 | 28),
            CmEventType::Unreachable => matches!(ev.status(), 1 | 2),
            CmEventType::Disconnected => matches!(ev.status(), 0 | -110),
            CmEventType::ConnectError => ev.status() != 0,
            _ => ev.status() == 0,
        };
        prop_assert!(status_ok, "unexpected status for {}", ev);
        if ev.event() == CmEventType::ConnectRequest {
            let ps = self.ids[i].m.port_space();
            self.ids.push(ModelId {
                side,
                handle: ev.id(),
                m: IdMachine::new_child(ps),
                alive: true,
                outstanding: BTreeSet::new(),
                on_port1: false,
            });
            let child = self.ids.len() - 1;
            self.check_view(child)?;
        }
        self.check_view(i)?;
        if ack {
            self.ack(side, ev)
        } else {
            self.held.push((side, ev));
            Ok(())
        }
    }

    fn ack(&mut self, side: usize, ev: CmEvent) -> Result<(), TestCaseError> {
        let counted = ev.counted_id();
        let i = self
            .ids
            .iter()
            .position(|m| m.handle == counted && m.side == side)
            .expect("known id");
        let got = self.backend(side).ack_cm_event(ev);
        prop_assert_eq!(got, Ok(()));
        self.ids[i].m = self.ids[i]
            .m
            .on_ack()
            .map_err(|e| TestCaseError::fail(e.to_string()))?;
        self.check_view(i)
    }

    fn teardown(&mut self, waits: &dyn Fn(u8) -> Duration) -> Result<(), TestCaseError> {
        for (side, ev) in std::mem::take(&mut self.held) {
            self.ack(side, ev)?;
        }
        for i in 0..self.ids.len() {
            if !self.ids[i].alive || self.ids[i].m.qp().is_none() {
                continue;
            }
            if self.ids[i].m.qp() == Some(QpState::Err) {
                // In ERR every posted request completes: collect them all.
                // Each poll that is not the last completes at least one: as many polls as
                // requests are enough, and a poll that miscounts cannot spin the test.
                for _ in 0..self.ids[i].outstanding.len() {
                    if self.poll(i, waits(3))? == 0 || self.ids[i].outstanding.is_empty() {
                        break;
                    }
                }
                prop_assert!(
                    self.ids[i].outstanding.is_empty(),
                    "posted requests never completed on a QP in ERR: {:?}",
                    self.ids[i].outstanding
                );
            }
            let (side, handle) = (self.ids[i].side, self.ids[i].handle);
            prop_assert_eq!(self.backend(side).destroy_qp(handle), Ok(()));
            self.ids[i].m = self.ids[i].m.destroy_qp().expect("had a QP");
        }
        for i in 0..self.ids.len() {
            if self.ids[i].alive {
                let (side, handle) = (self.ids[i].side, self.ids[i].handle);
                prop_assert_eq!(
                    self.backend(side).destroy_id(handle),
                    Ok(()),
                    "destroy_id {}",
                    handle
                );
                self.ids[i].alive = false;
            }
        }
        for side in 0..2 {
            let ch = self.channels[side];
            prop_assert_eq!(self.backend(side).destroy_event_channel(ch), Ok(()));
            let live = self.backend(side).live_resources();
            prop_assert!(live.is_clean(), "side {} still holds {:?}", side, live);
        }
        Ok(())
    }
}

fn run_case<B: CmBackend>(
    bed: &mut Bed<B>,
    ops: &[Op],
    waits: &dyn Fn(u8) -> Duration,
) -> Result<(), TestCaseError> {
    let repro = bed.repro.clone();
    let server_ch = bed
        .server
        .create_event_channel()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let client_ch = bed
        .client
        .create_event_channel()
        .map_err(|e| TestCaseError::fail(e.to_string()))?;
    let mut run = Run {
        bed,
        channels: [server_ch, client_ch],
        ids: Vec::new(),
        held: Vec::new(),
        next_wr: 0,
        log: Vec::new(),
    };
    let result = ops
        .iter()
        .try_for_each(|op| run.step(op, waits))
        .and_then(|()| run.teardown(waits));
    if result.is_err() {
        eprintln!("calls of the failing case:\n  {}", run.log.join("\n  "));
        if !repro.is_empty() {
            eprintln!("{repro}");
        }
    }
    result
}

fn config() -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or_else(crate::bed::prop_cases);
    ProptestConfig {
        cases,
        failure_persistence: None,
        ..ProptestConfig::default()
    }
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn random_call_sequences_follow_the_model(seed in any::<u64>(), ops in prop::collection::vec(op(), 1..48)) {
        let Some(mut bed) = crate::bed::seeded_bed(seed) else { return Ok(()) };
        run_case(&mut bed, &ops, &crate::bed::prop_wait)?;
    }

    #[test]
    fn connection_storms_follow_the_model(seed in any::<u64>(), ops in prop::collection::vec(lifecycle_op(), 1..160)) {
        let Some(mut bed) = crate::bed::seeded_bed(seed) else { return Ok(()) };
        run_case(&mut bed, &ops, &crate::bed::prop_wait)?;
    }
}

/// Calls biased towards full connections (listeners, resolves, connects, accepts, disconnects),
/// so most cases reach the later states.
fn lifecycle_op() -> impl Strategy<Value = Op> {
    let id = || pick(0.9);
    prop_oneof![
        24 => (any::<Index>(), any::<u8>()).prop_map(|(which, choice)| Op::Drive { which, choice }),
        2 => any::<bool>().prop_map(|side| Op::CreateId { side, datagram: false }),
        2 => id().prop_map(|id| Op::Bind { id, port: 1 }),
        2 => id().prop_map(|id| listen(id, 0)),
        3 => (id(), any::<bool>()).prop_map(|(id, to_server)| Op::ResolveAddr { id, to_server, port: 1, unreachable: false }),
        3 => id().prop_map(|id| Op::ResolveRoute { id }),
        3 => id().prop_map(create_qp),
        3 => id().prop_map(|id| connect(id, 8)),
        3 => id().prop_map(|id| accept(id, 8)),
        1 => id().prop_map(|id| reject(id, 4)),
        2 => id().prop_map(disconnect),
        1 => id().prop_map(destroy_id),
        1 => id().prop_map(destroy_qp),
        10 => (any::<bool>(), 0u8..4).prop_map(|(side, wait)| Op::GetEvent { side, wait, ack: true }),
        2 => (id(), 1u8..=64).prop_map(|(id, len)| Op::PostSend { id, len }),
        2 => (id(), 64u8..=128).prop_map(|(id, len)| Op::PostRecv { id, len }),
        2 => id().prop_map(|id| Op::PollCq { id }),
    ]
}
