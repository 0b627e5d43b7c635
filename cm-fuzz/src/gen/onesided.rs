//! One-sided RDMA inputs: memory regions, send work requests over them, shared receive queues
//! and asynchronous events, with hostile keys, handles, addresses and lengths.
//!
//! Every draw here comes from the generator's side stream ([`Gen::side`]), so a seed's
//! two-sided calls are the ones it had before these calls existed: the one-sided calls are
//! interleaved with them (and the sequence, still cut at its length, ends sooner).

use std::fmt;
use std::time::Duration;

use cm_core::{Access, Invocation, SrqCaps};
use cm_sim::SimConfig;
use rand_core::RngCore;

use super::{Gen, HandleRef, HostSel, Known, Op, NEWEST};

/// Where an offset (of a local entry, of `read_mr`/`write_mr`) or a remote address falls,
/// relative to the region it names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum OffSel {
    /// `n` bytes from the region's start.
    Start(u64),
    /// `n` bytes before its end (its start when it is shorter).
    End(u64),
    /// `n` bytes past its end.
    Past(u64),
    /// This very value, whatever the region (a remote address: the value as the address).
    Abs(u64),
}

impl fmt::Display for OffSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            OffSel::Start(n) => write!(f, "+{n}"),
            OffSel::End(n) => write!(f, "end-{n}"),
            OffSel::Past(n) => write!(f, "end+{n}"),
            OffSel::Abs(v) => write!(f, "@{v:#x}"),
        }
    }
}

/// The region a remote address is taken from.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum RegionSel {
    /// The `n`-th most recent region `host` registered, deregistered or not.
    Recent {
        /// Whose.
        host: HostSel,
        /// How recent.
        n: u16,
    },
    /// The `n`-th most recently deregistered region of `host`: its address and key are stale.
    Stale {
        /// Whose.
        host: HostSel,
        /// How recent.
        n: u16,
    },
    /// None: address 0 and key 0 before the offset and key are applied.
    Nowhere,
}

/// The remote key a one-sided request carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum KeySel {
    /// The region's own remote key (right while it is registered).
    Own,
    /// The key of another region: the `n`-th most recent of `host`.
    Of {
        /// Whose.
        host: HostSel,
        /// How recent.
        n: u16,
    },
    /// A made-up key.
    Forged(u32),
}

/// The remote end of a one-sided request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteSel {
    /// The region the address is taken from.
    pub region: RegionSel,
    /// Where in it.
    pub at: OffSel,
    /// The key.
    pub key: KeySel,
}

impl fmt::Display for RemoteSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.region {
            RegionSel::Recent { host, n } => write!(f, "{host}.mr[-{n}]")?,
            RegionSel::Stale { host, n } => write!(f, "{host}.deregistered[-{n}]")?,
            RegionSel::Nowhere => f.write_str("nowhere")?,
        }
        write!(f, "{} key ", self.at)?;
        match self.key {
            KeySel::Own => f.write_str("its own"),
            KeySel::Of { host, n } => write!(f, "of {host}.mr[-{n}]"),
            KeySel::Forged(k) => write!(f, "forged {k:#x}"),
        }
    }
}

/// One scatter/gather entry: `len` bytes at `at` of the region `mr` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SgeSel {
    /// The region.
    pub mr: HandleRef,
    /// Where in it.
    pub at: OffSel,
    /// How many bytes.
    pub len: u32,
}

/// What a send work request does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // one-to-one with `SendOp` (with and without an immediate)
pub enum WrOp {
    Send,
    SendImm,
    Write,
    WriteImm,
    Read,
    CompareSwap,
    FetchAdd,
}

/// A send work request for `post_send_wr`.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct WrSel {
    /// Its `wr_id`.
    pub wr_id: u64,
    /// What it does.
    pub op: WrOp,
    /// Where, for every operation but a send.
    pub remote: RemoteSel,
    /// Its scatter/gather list (possibly longer than any QP allows).
    pub sges: Vec<SgeSel>,
    /// `IBV_SEND_SIGNALED`.
    pub signaled: bool,
    /// `IBV_SEND_FENCE`.
    pub fence: bool,
    /// The immediate (with `SendImm` and `WriteImm`), or the compare value / the addend.
    pub a: u64,
    /// The swap value (with `CompareSwap`).
    pub b: u64,
}

impl fmt::Display for WrSel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "wr {} {:?}", self.wr_id, self.op)?;
        match self.op {
            WrOp::Send => {}
            WrOp::SendImm => write!(f, " imm {:#x}", self.a as u32)?,
            WrOp::Write | WrOp::Read => write!(f, " {}", self.remote)?,
            WrOp::WriteImm => write!(f, " {} imm {:#x}", self.remote, self.a as u32)?,
            WrOp::CompareSwap => write!(f, " {} {:#x}->{:#x}", self.remote, self.a, self.b)?,
            WrOp::FetchAdd => write!(f, " {} +{:#x}", self.remote, self.a)?,
        }
        f.write_str(" [")?;
        for (i, s) in self.sges.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{}{} len {}", s.mr, s.at, s.len)?;
        }
        f.write_str("]")?;
        if !self.signaled {
            f.write_str(" unsignalled")?;
        }
        if self.fence {
            f.write_str(" fenced")?;
        }
        Ok(())
    }
}

/// What the generator knows of a fabric's device, to aim lengths at its limits.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct DeviceLimits {
    pub(crate) max_mr_size: u64,
    pub(crate) max_srq_wr: u32,
}

/// Per mille of the generator's steps that add a random one-sided call.
const NOISE: u64 = 90;
/// Per mille of accepted connections that go on to one-sided work.
const STORY: u64 = 550;
/// Per mille of scenarios that begin with a connection made for one-sided work.
const PROLOGUE: u64 = 300;
/// Where the prologue's server listens: a port the application steps do not use, so that their
/// listeners and connections are the ones they were.
const PROLOGUE_PORT: u16 = 7473;

impl Gen {
    /// The device limits of a fabric: small regions (a region at the limit costs little, and a
    /// READ of a whole one copies at most a MiB), now and then a small SRQ limit; rarely a zero
    /// the builder refuses.
    pub(super) fn device_limits(&mut self, fabric: u8, c: &mut SimConfig) {
        c.max_mr_size = self.pick(&[4096, 65536, 1 << 20]);
        if self.chance(150) {
            c.max_srq_wr = self.pick(&[1, 16, 64]);
        }
        if self.chance(100) {
            c.max_srq_sge = self.pick(&[1, 2]);
        }
        if self.chance(5) && !self.skip.skips(Known::Config) {
            match self.below(3) {
                0 => c.max_mr_size = 0,
                1 => c.max_srq_wr = 0,
                _ => c.max_srq_sge = 0,
            }
        }
        self.limits[fabric as usize] = DeviceLimits {
            max_mr_size: c.max_mr_size,
            max_srq_wr: c.max_srq_wr,
        };
    }

    /// Whether this step of the generator adds a random one-sided call.
    pub(super) fn noise_here(&mut self) -> bool {
        self.chance(NOISE)
    }

    /// Whether the scenario begins with a connection for one-sided work.
    pub(super) fn prologue_here(&mut self) -> bool {
        self.chance(PROLOGUE)
    }

    /// A connection between the scenario's cast made as an application makes it, ungarbled
    /// (its QPs perhaps with room for lists, the server's perhaps on an SRQ), and rounds of
    /// one-sided work on it: so that requests reach a responder, and its checks, in many
    /// scenarios; the calls after it may then tear it down in any order.
    pub(super) fn prologue(&mut self, hosts: &[usize; 2], ops: &mut Vec<Op>) {
        let place = (0, self.cast.0, self.cast.1, PROLOGUE_PORT);
        for kind in [0, 1, 3] {
            let mut block = self.block_at(kind, place);
            let before = self.story_tweaks(kind, &mut block);
            for (op, before) in block.into_iter().zip(before) {
                ops.extend(before);
                ops.push(op);
            }
        }
        for _ in 0..1 + self.below(3) {
            self.story(self.pair, hosts, ops);
        }
    }

    /// Whether an accepted connection goes on to one-sided work.
    pub(super) fn story_here(&mut self) -> bool {
        self.chance(STORY)
    }

    fn access(&mut self) -> Access {
        if self.chance(500) {
            return Access::ALL;
        }
        // Every combination, the ones `Access::check` refuses among them.
        Access::from_bits(self.below(16) as u32).expect("four bits")
    }

    fn reg_len(&mut self, fabric: u8) -> usize {
        let max = self.limits[fabric as usize].max_mr_size as usize;
        self.pick(&[
            0,
            1,
            8,
            64,
            4096,
            4096,
            65536,
            max,
            max.saturating_add(1),
            usize::MAX,
        ])
    }

    fn offset(&mut self) -> OffSel {
        match self.below(10) {
            0..=4 => OffSel::Start(self.pick(&[0, 8, 16, 64])),
            // Unaligned: fine for READ and WRITE, refused for an atomic.
            5 => OffSel::Start(self.pick(&[1, 4, 7])),
            6 => OffSel::End(self.pick(&[0, 1, 8])),
            7 => OffSel::Past(self.pick(&[0, 1, 8, 4096])),
            _ => OffSel::Abs(self.pick(&[0, 1, u64::MAX, u64::MAX - 7, 1 << 63, 0x7f00_0000_0000])),
        }
    }

    /// A remote address and key, of `peer`'s regions mostly when the caller has one.
    fn remote(&mut self, h: HostSel, peer: Option<HostSel>, hosts: &[usize; 2]) -> RemoteSel {
        // Else a region of a host of the caller's fabric (another's, or the caller's own: at
        // the peer that is another host's region), or of the other fabric.
        let host = match peer {
            Some(p) if self.chance(600) => p,
            _ if self.chance(850) => self.host_on(h.fabric, hosts),
            _ => self.any_host(hosts),
        };
        let region = match self.below(100) {
            0..=69 => RegionSel::Recent {
                host,
                n: self.recent(),
            },
            70..=86 => RegionSel::Stale {
                host,
                n: self.recent(),
            },
            _ => RegionSel::Nowhere,
        };
        let key = match self.below(100) {
            0..=74 => KeySel::Own,
            75..=84 => KeySel::Of {
                host: self.host_on(h.fabric, hosts),
                n: self.recent(),
            },
            _ => {
                let random = self.rng.next_u32();
                KeySel::Forged(self.pick(&[0, 1, 0x100, 0x101, 0x1_0000, u32::MAX, random]))
            }
        };
        let at = if self.chance(600) {
            OffSel::Start(self.pick(&[0, 8]))
        } else {
            self.offset()
        };
        RemoteSel { region, at, key }
    }

    fn sge(&mut self, hosts: &[usize; 2]) -> SgeSel {
        SgeSel {
            mr: if self.chance(850) {
                HandleRef::Own(self.recent())
            } else {
                self.handle(hosts)
            },
            at: if self.chance(800) {
                OffSel::Start(self.pick(&[0, 8]))
            } else {
                self.offset()
            },
            len: self.pick(&[0, 1, 8, 8, 64, 64, 4096, 1 << 20, u32::MAX]),
        }
    }

    fn wr_op(&mut self) -> WrOp {
        match self.below(100) {
            0..=9 => WrOp::Send,
            10..=14 => WrOp::SendImm,
            15..=39 => WrOp::Write,
            40..=49 => WrOp::WriteImm,
            50..=69 => WrOp::Read,
            70..=84 => WrOp::CompareSwap,
            _ => WrOp::FetchAdd,
        }
    }

    fn operand(&mut self) -> u64 {
        self.pick(&[0, 1, 2, 0xFFFF_FFFF, u64::MAX])
    }

    /// A work request with hostile parts: any operation, remote addresses in, at the edge of
    /// and past regions, right, stale, foreign and forged keys, lists empty or too long,
    /// entries of foreign, stale and forged regions, zero and huge lengths.
    fn hostile_wr(&mut self, h: HostSel, peer: Option<HostSel>, hosts: &[usize; 2]) -> WrSel {
        let op = self.wr_op();
        let atomic = matches!(op, WrOp::CompareSwap | WrOp::FetchAdd);
        let sges = if atomic && self.chance(700) {
            vec![SgeSel {
                len: 8,
                ..self.sge(hosts)
            }]
        } else {
            let n = match self.below(20) {
                0 => 0,
                1..=13 => 1,
                14..=16 => 2,
                17 => 4,
                18 => 31,
                _ => 33,
            };
            (0..n).map(|_| self.sge(hosts)).collect()
        };
        WrSel {
            wr_id: 10 + self.below(4),
            op,
            remote: self.remote(h, peer, hosts),
            sges,
            signaled: self.chance(800),
            fence: self.chance(200),
            a: self.operand(),
            b: self.operand(),
        }
    }

    fn srq_caps(&mut self, fabric: u8) -> SrqCaps {
        if self.chance(600) {
            return SrqCaps::new().with_limit(self.pick(&[0, 0, 1, 2, 8]));
        }
        let max = self.limits[fabric as usize].max_srq_wr;
        SrqCaps {
            max_wr: self.pick(&[0, 1, 2, 16, 64, max, max.saturating_add(1), u32::MAX]),
            max_sge: self.pick(&[0, 1, 1, 27, 28, u32::MAX]),
            srq_limit: self.pick(&[0, 1, 2, 16, 64, 65, u32::MAX]),
            max_message_size: self.pick(&[0, 1, 64, 4096, 4096, 1 << 20, (1 << 20) + 1, u32::MAX]),
        }
    }

    /// A random one-sided call, with hostile arguments.
    pub(super) fn onesided_op(&mut self, hosts: &[usize; 2]) -> Op {
        let h = self.any_host(hosts);
        let handle = self.handle(hosts);
        match self.below(100) {
            0..=13 => Op::RegMr {
                h,
                id: handle,
                len: self.reg_len(h.fabric),
                access: self.access(),
            },
            14..=18 => Op::MrInfo { h, mr: handle },
            19..=26 => Op::DeregMr { h, mr: handle },
            27..=31 => Op::ReadMr {
                h,
                mr: handle,
                at: self.offset(),
                len: self.pick(&[0, 1, 8, 64, 4096, (1 << 20) + 1]),
            },
            32..=36 => Op::WriteMr {
                h,
                mr: handle,
                at: self.offset(),
                len: self.pick(&[0, 1, 8, 64, 4096, (1 << 20) + 1]),
            },
            37..=64 => Op::PostSendWr {
                h,
                id: handle,
                wr: self.hostile_wr(h, None, hosts),
            },
            65..=71 => Op::CreateSrq {
                h,
                id: handle,
                caps: self.srq_caps(h.fabric),
            },
            72..=76 => Op::DestroySrq { h, srq: handle },
            77..=84 => Op::PostSrqRecv {
                h,
                srq: handle,
                wr_id: 20 + self.below(4),
                len: self.pick(&[0, 1, 64, 4096, 4097, 1 << 20, u32::MAX]),
            },
            85..=88 => Op::ArmSrqLimit {
                h,
                srq: handle,
                limit: self.pick(&[0, 1, 2, 16, 64, 65, u32::MAX]),
            },
            89..=94 => Op::CreateQpOnSrq {
                h,
                id: handle,
                caps: self.caps(),
                srq: self.handle(hosts),
            },
            _ => Op::GetAsyncEvent {
                h,
                timeout: self.wait(),
            },
        }
    }

    /// Changes to the application steps of `kind`, in place (so the main stream garbles the
    /// same number of calls), and the calls to insert before each: a QP with room for
    /// scatter/gather lists, a server QP on a shared receive queue.
    pub(super) fn story_tweaks(&mut self, kind: u64, block: &mut [Op]) -> Vec<Vec<Op>> {
        let mut before = vec![Vec::new(); block.len()];
        let mut on_srq = None;
        for (i, op) in block.iter_mut().enumerate() {
            match *op {
                Op::Call {
                    h,
                    call: Invocation::CreateQp { id, mut caps },
                } => {
                    if self.chance(300) {
                        caps.max_send_sge = self.pick(&[2, 4]);
                    }
                    if kind == 3 && self.chance(350) {
                        before[i].push(Op::CreateSrq {
                            h,
                            id: NEWEST,
                            caps: SrqCaps::new().with_limit(self.pick(&[0, 1, 2])),
                        });
                        for n in 0..self.below(4) {
                            before[i].push(Op::PostSrqRecv {
                                h,
                                srq: NEWEST,
                                wr_id: 30 + n,
                                len: 4096,
                            });
                        }
                        if self.chance(300) {
                            before[i].push(Op::ArmSrqLimit {
                                h,
                                srq: NEWEST,
                                limit: self.pick(&[0, 1, 2, 3, 64, 65]),
                            });
                        }
                        on_srq = Some(h);
                        *op = Op::CreateQpOnSrq {
                            h,
                            id,
                            caps,
                            srq: NEWEST,
                        };
                    } else {
                        *op = super::call(h, Invocation::CreateQp { id, caps });
                    }
                }
                Op::Call {
                    h,
                    call: Invocation::PostRecv { wr_id, len, .. },
                } if on_srq == Some(h) => {
                    *op = Op::PostSrqRecv {
                        h,
                        srq: NEWEST,
                        wr_id,
                        len,
                    };
                }
                _ => {}
            }
        }
        before
    }

    /// A work request an application posts against `resp`'s newest region (a well-formed
    /// one, mostly).
    fn good_wr(&mut self, resp: HostSel, region_len: u64) -> WrSel {
        let op = self.wr_op();
        let atomic = matches!(op, WrOp::CompareSwap | WrOp::FetchAdd);
        let len = if atomic {
            8
        } else {
            self.pick(&[0, 8, 64, 64, region_len.min(4096) as u32])
        };
        let mut sges = vec![SgeSel {
            mr: NEWEST,
            at: OffSel::Start(0),
            len,
        }];
        if !atomic && self.chance(200) {
            sges.push(SgeSel {
                mr: NEWEST,
                at: OffSel::Start(64),
                len: 8,
            });
        }
        WrSel {
            wr_id: 40 + self.below(4),
            op,
            remote: RemoteSel {
                region: RegionSel::Recent { host: resp, n: 0 },
                at: OffSel::Start(if atomic { self.pick(&[0, 8, 56]) } else { 0 }),
                key: KeySel::Own,
            },
            sges,
            signaled: self.chance(850),
            fence: self.chance(150),
            a: self.operand(),
            b: self.operand(),
        }
    }

    /// One-sided work on a connection that was just accepted between `server` and `client`:
    /// both register regions, one writes, reads and updates the other's, both poll, and now
    /// and then the target is deregistered and used again; garbled as application steps are.
    pub(super) fn story(
        &mut self,
        (server, client): (HostSel, HostSel),
        hosts: &[usize; 2],
        ops: &mut Vec<Op>,
    ) {
        let (resp, req) = if self.chance(800) {
            (server, client)
        } else {
            (client, server)
        };
        let max = self.limits[resp.fabric as usize].max_mr_size.max(1);
        let target = self.pick(&[64, 4096, 4096, 65536]).min(max);
        let local = 4096.min(self.limits[req.fabric as usize].max_mr_size.max(1));
        let mut steps = vec![
            Op::RegMr {
                h: resp,
                id: NEWEST,
                len: target as usize,
                access: if self.chance(700) {
                    Access::ALL
                } else {
                    self.access()
                },
            },
            Op::RegMr {
                h: req,
                id: NEWEST,
                len: local as usize,
                access: if self.chance(800) {
                    Access::LOCAL_WRITE
                } else {
                    self.access()
                },
            },
            Op::WriteMr {
                h: req,
                mr: NEWEST,
                at: OffSel::Start(0),
                len: 64,
            },
        ];
        if self.chance(300) {
            steps.push(Op::MrInfo { h: resp, mr: NEWEST });
        }
        if self.chance(300) {
            // A receive for a WRITE or SEND with an immediate.
            steps.push(super::call(
                resp,
                Invocation::PostRecv {
                    id: NEWEST,
                    wr_id: 50,
                    len: 4096,
                },
            ));
        }
        for _ in 0..1 + self.below(4) {
            // Hostile requests on a live connection, too: what the checks at the post and at
            // the responder are for.
            let wr = if self.chance(700) {
                self.good_wr(resp, target)
            } else {
                self.hostile_wr(req, Some(resp), hosts)
            };
            steps.push(Op::PostSendWr {
                h: req,
                id: NEWEST,
                wr,
            });
        }
        steps.push(Op::PollCq {
            h: req,
            id: NEWEST,
            max: 8,
            timeout: self.pick(&[Duration::from_millis(10), Duration::from_secs(1)]),
        });
        steps.push(Op::ReadMr {
            h: resp,
            mr: NEWEST,
            at: OffSel::Start(0),
            len: 64,
        });
        if self.chance(400) {
            steps.push(Op::PollCq {
                h: resp,
                id: NEWEST,
                max: 4,
                timeout: Duration::ZERO,
            });
        }
        if self.chance(250) {
            steps.push(Op::DeregMr { h: resp, mr: NEWEST });
            let mut wr = self.good_wr(resp, target);
            wr.remote.region = RegionSel::Stale { host: resp, n: 0 };
            steps.push(Op::PostSendWr {
                h: req,
                id: NEWEST,
                wr,
            });
            steps.push(Op::PollCq {
                h: req,
                id: NEWEST,
                max: 8,
                timeout: Duration::from_secs(1),
            });
        }
        if self.chance(200) {
            steps.push(Op::GetAsyncEvent {
                h: resp,
                timeout: Duration::ZERO,
            });
        }
        for op in steps {
            match self.below(100) {
                0..=5 => ops.push(self.onesided_op(hosts)),
                6..=8 => {}
                _ => ops.push(op),
            }
        }
    }
}
