//! The run's trace: one record per CM event generated, per CM message sent and per step of a
//! work request over memory regions (only in runs that post one), and a stable hash of it.
//!
//! The hash is FNV-1a over a fixed binary encoding of each record, so it depends on nothing but
//! the run (not on formatting, platform or crate versions). Keeping the records themselves is
//! optional ([`TraceMode`]); the hash is always kept, so large runs can still be compared.

use std::fmt;
use std::net::IpAddr;

use cm_core::{CmEventType, SendOp};

use crate::time::SimTime;

/// How much of the trace the fabric keeps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum TraceMode {
    /// Every record and the hash (the default: what a failing test wants to print).
    #[default]
    Full,
    /// Only the hash (for runs with millions of events).
    HashOnly,
}

/// IB CM wire messages the simulator exchanges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum MsgKind {
    /// Connection request.
    Req,
    /// Connection reply.
    Rep,
    /// Ready to use.
    Rtu,
    /// Reject.
    Rej,
    /// Disconnect request.
    Dreq,
    /// Disconnect reply.
    Drep,
    /// Message receipt acknowledgement: the receiver of a duplicate REQ or REP has the original
    /// and will answer it later (its service timeout stretches the sender's retries).
    Mra,
}

impl MsgKind {
    /// Every kind, in the order of their codes.
    pub const ALL: [MsgKind; 7] = [
        MsgKind::Req,
        MsgKind::Rep,
        MsgKind::Rtu,
        MsgKind::Rej,
        MsgKind::Dreq,
        MsgKind::Drep,
        MsgKind::Mra,
    ];

    /// The IB CM name.
    pub const fn name(self) -> &'static str {
        match self {
            MsgKind::Req => "REQ",
            MsgKind::Rep => "REP",
            MsgKind::Rtu => "RTU",
            MsgKind::Rej => "REJ",
            MsgKind::Dreq => "DREQ",
            MsgKind::Drep => "DREP",
            MsgKind::Mra => "MRA",
        }
    }

    fn code(self) -> u8 {
        self as u8
    }
}

/// A work request over memory regions (`post_send_wr`), as the trace names it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RdmaOp {
    /// `IBV_WR_SEND`.
    Send,
    /// `IBV_WR_SEND_WITH_IMM`.
    SendWithImm,
    /// `IBV_WR_RDMA_WRITE`.
    Write,
    /// `IBV_WR_RDMA_WRITE_WITH_IMM`.
    WriteWithImm,
    /// `IBV_WR_RDMA_READ`.
    Read,
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap,
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd,
}

impl RdmaOp {
    /// Every operation, in the order of their codes.
    pub const ALL: [RdmaOp; 7] = [
        RdmaOp::Send,
        RdmaOp::SendWithImm,
        RdmaOp::Write,
        RdmaOp::WriteWithImm,
        RdmaOp::Read,
        RdmaOp::CompareSwap,
        RdmaOp::FetchAdd,
    ];

    /// The operation of `op`.
    pub const fn of(op: &SendOp) -> RdmaOp {
        match op {
            SendOp::Send { imm: None } => RdmaOp::Send,
            SendOp::Send { imm: Some(_) } => RdmaOp::SendWithImm,
            SendOp::Write { imm: None, .. } => RdmaOp::Write,
            SendOp::Write { imm: Some(_), .. } => RdmaOp::WriteWithImm,
            SendOp::Read { .. } => RdmaOp::Read,
            SendOp::CompareSwap { .. } => RdmaOp::CompareSwap,
            SendOp::FetchAdd { .. } => RdmaOp::FetchAdd,
        }
    }

    /// verbs' name without its `IBV_WR_` prefix.
    pub const fn name(self) -> &'static str {
        match self {
            RdmaOp::Send => "SEND",
            RdmaOp::SendWithImm => "SEND_WITH_IMM",
            RdmaOp::Write => "RDMA_WRITE",
            RdmaOp::WriteWithImm => "RDMA_WRITE_WITH_IMM",
            RdmaOp::Read => "RDMA_READ",
            RdmaOp::CompareSwap => "ATOMIC_CMP_AND_SWP",
            RdmaOp::FetchAdd => "ATOMIC_FETCH_AND_ADD",
        }
    }

    fn code(self) -> u8 {
        self as u8
    }
}

/// Which step of a work request over memory regions a record is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum RdmaStep {
    /// The request left the requester (`id`, on `host`) for the peer's host, first or again
    /// after a timeout. A SEND or WRITE with immediate leaves when it lands.
    Sent,
    /// The request (recorded on the requester's host) or its answer (on the responder's) was
    /// lost on the link to the peer's host: partitioned, lossy, a host down.
    Lost,
    /// The responder (`id`, on `host`) dropped the request without an answer: its QP is not
    /// ready or gone, or the request is past one that was lost.
    Dropped,
    /// The responder executed the request (`status` 0) or refused it (`status`: the
    /// requester's `WcStatus` number).
    Executed,
    /// The responder answered a request sent again with the answer it gave the first time.
    Replayed,
    /// The request completed at the requester with `status`, a `WcStatus` number (flushes are
    /// not recorded, as no flush is).
    Completed,
}

impl RdmaStep {
    /// A short name for trace lines.
    pub const fn name(self) -> &'static str {
        match self {
            RdmaStep::Sent => "sent",
            RdmaStep::Lost => "lost",
            RdmaStep::Dropped => "dropped",
            RdmaStep::Executed => "executed",
            RdmaStep::Replayed => "replayed",
            RdmaStep::Completed => "completed",
        }
    }

    fn code(self) -> u8 {
        self as u8
    }
}

/// What a record is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum TraceWhat {
    /// A CM event was queued on the id's channel.
    Event(CmEventType),
    /// The id sent an IB CM message to the host at `to`.
    Sent {
        /// The message.
        msg: MsgKind,
        /// Index of the receiving host.
        to: u16,
    },
    /// A message from the id to the host at `to` was lost (partition, loss, host down).
    Lost {
        /// The message.
        msg: MsgKind,
        /// Index of the host it was for.
        to: u16,
    },
    /// A fault struck the host (`id` is `u32::MAX`); the name is [`Fault::kind`](crate::Fault::kind).
    Fault(&'static str),
    /// A step of a work request over memory regions; `peer` is the index of the other host
    /// (the responder's for the requester's steps, the requester's for the responder's).
    Rdma {
        /// The operation.
        op: RdmaOp,
        /// The step.
        step: RdmaStep,
        /// Index of the other host.
        peer: u16,
    },
}

/// One line of the trace.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct TraceRecord {
    /// Virtual time.
    pub time: SimTime,
    /// Index of the host the id lives on.
    pub host: u16,
    /// The id's slot index (the number after `id#` in handles).
    pub id: u32,
    /// Event or message.
    pub what: TraceWhat,
    /// Event status, or the reject reason of a REJ.
    pub status: i32,
}

impl TraceRecord {
    /// The record's fixed binary encoding, which the hash is defined over (the fabric hashes
    /// it through [`fold_into`](Self::fold_into), which gives the same value).
    #[cfg(test)]
    fn encode(&self) -> [u8; 24] {
        let mut b = [0u8; 24];
        b[..8].copy_from_slice(&self.time.as_nanos().to_le_bytes());
        b[8..10].copy_from_slice(&self.host.to_le_bytes());
        b[10..14].copy_from_slice(&self.id.to_le_bytes());
        match self.what {
            TraceWhat::Event(ev) => {
                b[14] = 0;
                b[15] = ev.raw() as u8;
            }
            TraceWhat::Sent { msg, to } => {
                b[14] = 1;
                b[15] = msg.code();
                b[16..18].copy_from_slice(&to.to_le_bytes());
            }
            TraceWhat::Lost { msg, to } => {
                b[14] = 2;
                b[15] = msg.code();
                b[16..18].copy_from_slice(&to.to_le_bytes());
            }
            TraceWhat::Fault(kind) => {
                b[14] = 3;
                // The kind's bytes fold into the hash through a small stable digest.
                b[16..18].copy_from_slice(&fault_digest(kind).to_le_bytes());
            }
            TraceWhat::Rdma { op, step, peer } => {
                b[14] = 4;
                b[15] = rdma_code(op, step);
                b[16..18].copy_from_slice(&peer.to_le_bytes());
            }
        }
        b[18..22].copy_from_slice(&self.status.to_le_bytes());
        b
    }
}

/// FNV-1a's step for a zero byte is a multiplication by the prime alone, so `n` zero bytes in a
/// row multiply by its `n`th power: one multiplication instead of `n` steps.
const fn fnv_prime_pow(n: u32) -> u64 {
    let mut p = 1u64;
    let mut i = 0;
    while i < n {
        p = p.wrapping_mul(FNV_PRIME);
        i += 1;
    }
    p
}

/// FNV-1a steps over the `n` low bytes of `v`, least significant first (the encoding's
/// little-endian order).
#[inline(always)]
fn fnv_le(mut h: u64, v: u64, n: u32) -> u64 {
    let mut i = 0;
    while i < n {
        h = (h ^ ((v >> (8 * i)) & 0xff)).wrapping_mul(FNV_PRIME);
        i += 1;
    }
    h
}

impl TraceRecord {
    /// `h` after FNV-1a over the record's 24-byte encoding (`encode`, which the tests keep as
    /// the definition), computed from the fields: the same value, with the runs of zero bytes
    /// most records have (a time's high bytes, an id's, the status and the padding) folded into
    /// one multiplication each: every record of a run is hashed, and the byte-by-byte loop is
    /// several times as long.
    #[inline(always)]
    fn fold_into(&self, h: u64) -> u64 {
        let time = self.time.as_nanos();
        let mut h = if time >> 40 == 0 {
            fnv_le(h, time, 5).wrapping_mul(fnv_prime_pow(3))
        } else {
            fnv_le(h, time, 8)
        };
        h = fnv_le(h, u64::from(self.host), 2);
        h = if self.id >> 16 == 0 {
            fnv_le(h, u64::from(self.id), 2).wrapping_mul(fnv_prime_pow(2))
        } else {
            fnv_le(h, u64::from(self.id), 4)
        };
        let (tag, code, to) = match self.what {
            TraceWhat::Event(ev) => (0u8, ev.raw() as u8, 0u16),
            TraceWhat::Sent { msg, to } => (1, msg.code(), to),
            TraceWhat::Lost { msg, to } => (2, msg.code(), to),
            TraceWhat::Fault(kind) => (3, 0, fault_digest(kind)),
            TraceWhat::Rdma { op, step, peer } => (4, rdma_code(op, step), peer),
        };
        h = fnv_le(h, u64::from(tag) | (u64::from(code) << 8), 2);
        // Bytes 16..24: `to`, the status and two bytes of padding.
        let tail = u64::from(to) | (u64::from(self.status as u32) << 16);
        if tail == 0 {
            h.wrapping_mul(fnv_prime_pow(8))
        } else {
            fnv_le(h, tail, 6).wrapping_mul(fnv_prime_pow(2))
        }
    }
}

/// A one-sided record's operation and step in one byte of the encoding.
fn rdma_code(op: RdmaOp, step: RdmaStep) -> u8 {
    op.code() | (step.code() << 4)
}

/// A fault kind's bytes folded into 16 bits for the encoding.
fn fault_digest(kind: &str) -> u16 {
    kind.bytes().fold(0u16, |h, c| h.rotate_left(5) ^ u16::from(c))
}

/// A record with the host addresses needed to print it.
pub(crate) struct TraceLine<'a> {
    record: &'a TraceRecord,
    hosts: &'a [IpAddr],
}

impl fmt::Display for TraceLine<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let r = self.record;
        let host = self
            .hosts
            .get(r.host as usize)
            .map_or_else(|| format!("host{}", r.host), |ip| ip.to_string());
        let id = if r.id == u32::MAX {
            "-".to_string()
        } else {
            r.id.to_string()
        };
        let host_of = |i: u16| {
            self.hosts
                .get(i as usize)
                .map_or_else(|| format!("host{i}"), |ip| ip.to_string())
        };
        match r.what {
            TraceWhat::Event(ev) => write!(f, "{} {} id#{id} {} status={}", r.time, host, ev, r.status),
            TraceWhat::Lost { msg, to } => write!(
                f,
                "{} {} id#{id} lost {} to {}",
                r.time,
                host,
                msg.name(),
                host_of(to)
            ),
            TraceWhat::Fault(kind) => write!(f, "{} {} fault {}", r.time, host, kind),
            TraceWhat::Rdma { op, step, peer } => {
                let dir = match step {
                    RdmaStep::Sent | RdmaStep::Lost => "to",
                    RdmaStep::Completed => "with",
                    _ => "from",
                };
                write!(
                    f,
                    "{} {} id#{id} {} {} {dir} {} status={}",
                    r.time,
                    host,
                    op.name(),
                    step.name(),
                    host_of(peer),
                    r.status
                )
            }
            TraceWhat::Sent { msg, to } => {
                let to = self
                    .hosts
                    .get(to as usize)
                    .map_or_else(|| format!("host{to}"), |ip| ip.to_string());
                write!(f, "{} {} id#{id} sent {} to {}", r.time, host, msg.name(), to)?;
                if msg == MsgKind::Rej {
                    write!(f, " reason={}", r.status)?;
                }
                Ok(())
            }
        }
    }
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

pub(crate) struct Trace {
    mode: TraceMode,
    records: Vec<TraceRecord>,
    hash: u64,
    count: u64,
}

impl Trace {
    pub(crate) fn new(mode: TraceMode) -> Self {
        Trace {
            mode,
            records: Vec::new(),
            hash: FNV_OFFSET,
            count: 0,
        }
    }

    // `#[inline]`: called for every record, several a connection, where the call and the
    // record passed by reference cost more than the record's own work.
    #[inline]
    pub(crate) fn record(&mut self, record: TraceRecord) {
        // Every fault passes here when it strikes, scheduled or injected.
        traced! {
            if let TraceWhat::Fault(kind) = record.what {
                tracing::info!(time = %record.time, host = record.host, fault = kind, "fault");
            }
        }
        self.hash = record.fold_into(self.hash);
        self.count += 1;
        if self.mode == TraceMode::Full {
            self.records.push(record);
        }
    }

    pub(crate) fn hash(&self) -> u64 {
        self.hash
    }

    pub(crate) fn count(&self) -> u64 {
        self.count
    }

    pub(crate) fn records(&self) -> &[TraceRecord] {
        &self.records
    }

    pub(crate) fn line<'a>(record: &'a TraceRecord, hosts: &'a [IpAddr]) -> TraceLine<'a> {
        TraceLine { record, hosts }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(time: u64, ev: CmEventType) -> TraceRecord {
        TraceRecord {
            time: SimTime::from_nanos(time),
            host: 1,
            id: 3,
            what: TraceWhat::Event(ev),
            status: -110,
        }
    }

    #[test]
    fn hash_depends_on_every_field_and_not_on_mode() {
        let mut a = Trace::new(TraceMode::Full);
        let mut b = Trace::new(TraceMode::HashOnly);
        for t in [&mut a, &mut b] {
            t.record(rec(5, CmEventType::AddrError));
        }
        assert_eq!(a.hash(), b.hash());
        assert_eq!(a.records().len(), 1);
        assert!(b.records().is_empty());
        let mut c = Trace::new(TraceMode::Full);
        c.record(rec(6, CmEventType::AddrError));
        assert_ne!(a.hash(), c.hash());
        let mut d = Trace::new(TraceMode::Full);
        d.record(rec(5, CmEventType::AddrResolved));
        assert_ne!(a.hash(), d.hash());
    }

    /// FNV-1a over the encoding, byte by byte: the definition `fold_into` must keep.
    fn fnv_of_encoding(h: u64, r: &TraceRecord) -> u64 {
        r.encode()
            .iter()
            .fold(h, |h, &b| (h ^ u64::from(b)).wrapping_mul(FNV_PRIME))
    }

    #[test]
    fn the_folded_hash_is_fnv_over_the_encoding_with_and_without_zero_runs() {
        let times = [0, 1, 1_500, (1 << 40) - 1, 1 << 40, u64::MAX];
        let ids = [0, 3, 0xFFFF, 0x1_0000, u32::MAX];
        let whats = [
            TraceWhat::Event(CmEventType::Established),
            TraceWhat::Event(CmEventType::AddrResolved),
            TraceWhat::Sent {
                msg: MsgKind::Req,
                to: 0,
            },
            TraceWhat::Sent {
                msg: MsgKind::Drep,
                to: 0x0102,
            },
            TraceWhat::Lost {
                msg: MsgKind::Rej,
                to: 1,
            },
            TraceWhat::Fault("crash"),
            TraceWhat::Rdma {
                op: RdmaOp::Read,
                step: RdmaStep::Sent,
                peer: 1,
            },
            TraceWhat::Rdma {
                op: RdmaOp::FetchAdd,
                step: RdmaStep::Completed,
                peer: 0x0201,
            },
            TraceWhat::Rdma {
                op: RdmaOp::Send,
                step: RdmaStep::Executed,
                peer: 0,
            },
        ];
        let mut h = FNV_OFFSET;
        for &time in &times {
            for &id in &ids {
                for &what in &whats {
                    for status in [0, -110, 28, i32::MIN] {
                        for host in [0, 1, u16::MAX] {
                            let r = TraceRecord {
                                time: SimTime::from_nanos(time),
                                host,
                                id,
                                what,
                                status,
                            };
                            let want = fnv_of_encoding(h, &r);
                            assert_eq!(r.fold_into(h), want, "{r:?}");
                            h = want;
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn lines_are_readable() {
        let hosts: Vec<IpAddr> = vec!["10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap()];
        let r = rec(1_500, CmEventType::AddrError);
        assert_eq!(
            Trace::line(&r, &hosts).to_string(),
            "0.000001500 10.0.0.2 id#3 RDMA_CM_EVENT_ADDR_ERROR status=-110"
        );
        let s = TraceRecord {
            time: SimTime::from_nanos(0),
            host: 0,
            id: 1,
            what: TraceWhat::Sent {
                msg: MsgKind::Rej,
                to: 1,
            },
            status: 28,
        };
        assert_eq!(
            Trace::line(&s, &hosts).to_string(),
            "0.000000000 10.0.0.1 id#1 sent REJ to 10.0.0.2 reason=28"
        );
        let rdma = |step, status| TraceRecord {
            time: SimTime::from_nanos(2_000),
            host: 0,
            id: 4,
            what: TraceWhat::Rdma {
                op: RdmaOp::WriteWithImm,
                step,
                peer: 1,
            },
            status,
        };
        let lines: Vec<String> = [
            rdma(RdmaStep::Sent, 0),
            rdma(RdmaStep::Executed, 10),
            rdma(RdmaStep::Completed, 12),
        ]
        .iter()
        .map(|r| Trace::line(r, &hosts).to_string())
        .collect();
        assert_eq!(
            lines,
            [
                "0.000002000 10.0.0.1 id#4 RDMA_WRITE_WITH_IMM sent to 10.0.0.2 status=0",
                "0.000002000 10.0.0.1 id#4 RDMA_WRITE_WITH_IMM executed from 10.0.0.2 status=10",
                "0.000002000 10.0.0.1 id#4 RDMA_WRITE_WITH_IMM completed with 10.0.0.2 status=12",
            ]
        );
    }

    #[test]
    fn one_sided_records_give_every_operation_and_step_its_own_code() {
        let steps = [
            RdmaStep::Sent,
            RdmaStep::Lost,
            RdmaStep::Dropped,
            RdmaStep::Executed,
            RdmaStep::Replayed,
            RdmaStep::Completed,
        ];
        let mut codes = std::collections::BTreeSet::new();
        for op in RdmaOp::ALL {
            for step in steps {
                assert!(codes.insert(rdma_code(op, step)), "{op:?} {step:?}");
            }
        }
        let wr = |op| RdmaOp::of(&op);
        let remote = cm_core::RemoteAddr { addr: 0, rkey: 0 };
        assert_eq!(wr(SendOp::Send { imm: Some(1) }), RdmaOp::SendWithImm);
        assert_eq!(wr(SendOp::Write { remote, imm: None }), RdmaOp::Write);
        assert_eq!(wr(SendOp::Read { remote }), RdmaOp::Read);
        assert_eq!(
            wr(SendOp::CompareSwap {
                remote,
                compare: 0,
                swap: 0
            }),
            RdmaOp::CompareSwap
        );
    }
}
