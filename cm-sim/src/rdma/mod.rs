//! One-sided RDMA's rules as pure functions, as rxe (Linux 6.1) applies them; the fabric
//! (`fabric/onesided.rs`) carries out what they decide.
//!
//! * [`respond`]: what the responder does with a request, in the order of `rxe_resp.c`'s
//!   checks: the QP must be ready (else the packet is dropped without a word), the QP's access
//!   flags must allow the operation (`check_op_valid`), the resources it takes must be there (a
//!   receive for a WRITE with immediate, responder resources for a READ or atomic:
//!   `check_resource`), the remote key must name a region that allows it over the whole range
//!   (`check_rkey`; skipped for a zero-length READ or WRITE), and an atomic's address must be
//!   aligned (`atomic_reply`).
//! * [`sequence`]: whether a request is the next one the responder expects, a duplicate of one it
//!   answered (sent again after a timeout: answered again, not executed again), or ahead of a
//!   lost one (dropped: the requester sends it again).
//! * [`may_start`]: whether the requester's next work request may start: a fenced one waits for
//!   every READ and atomic before it, at most the initiator depth (rounded up to a power of two,
//!   as rxe rounds `max_rd_atomic`) of those are in flight, and, the simulator's own rule, a
//!   two-sided send waits until no one-sided request of the QP is in flight (sends land at once,
//!   so completions stay in posting order).
//! * [`completion`]: what a completion reports of a work request that ended with a status.
//!
//! Nothing here does I/O, holds references or knows time; `tests.rs` writes every case out by
//! hand from rxe's source (`drivers/infiniband/sw/rxe`: `rxe_resp.c`, `rxe_req.c`, `rxe_comp.c`).

use cm_core::{Access, WcOpcode, WcStatus, ATOMIC_LEN};

/// What a request asks of the responder's memory.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum RemoteOp {
    /// RDMA WRITE without immediate.
    Write,
    /// RDMA WRITE with immediate: it also takes a receive.
    WriteWithImm,
    /// RDMA READ.
    Read,
    /// Compare-and-swap or fetch-and-add on 8 bytes.
    Atomic,
}

impl RemoteOp {
    /// The access flag the QP and the region must grant for it.
    pub(crate) const fn needs(self) -> Access {
        match self {
            RemoteOp::Write | RemoteOp::WriteWithImm => Access::REMOTE_WRITE,
            RemoteOp::Read => Access::REMOTE_READ,
            RemoteOp::Atomic => Access::REMOTE_ATOMIC,
        }
    }
}

/// A request as the responder reads it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Request {
    /// What it does.
    pub(crate) op: RemoteOp,
    /// The remote address.
    pub(crate) addr: u64,
    /// The remote key.
    pub(crate) rkey: u32,
    /// Bytes it writes or reads (an atomic's are always 8).
    pub(crate) len: u64,
}

/// The responder's QP as the checks see it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Responder {
    /// In RTR or RTS (`resp.state == READY`): a QP in any other state drops every request.
    pub(crate) ready: bool,
    /// Its `qp_access_flags`.
    pub(crate) access: Access,
    /// Its responder resources (`max_dest_rd_atomic`).
    pub(crate) max_dest_rd_atomic: u8,
    /// Whether a receive is posted (on its receive queue or its SRQ).
    pub(crate) has_recv: bool,
}

/// The region a request's remote key names on the responder's protection domain, when one
/// does (the key's index and generation match a registered region of the QP's device).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct KeyedRegion {
    /// Its first byte's address.
    pub(crate) addr: u64,
    /// Its length.
    pub(crate) len: u64,
    /// What it was registered with.
    pub(crate) access: Access,
}

/// What the responder does with a request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Dropped without an answer: the requester's retries run out.
    Drop,
    /// A WRITE with immediate found no receive: receiver-not-ready, and the requester tries
    /// again (the QP stays as it is).
    ReceiverNotReady,
    /// Executed at `offset` into the region (0 for a zero-length operation, which names none);
    /// `takes_recv`: a receive completes with it.
    Execute {
        /// Where in the region.
        offset: u64,
        /// A receive is taken (a WRITE with immediate).
        takes_recv: bool,
    },
    /// Refused with a NAK: the requester's work request completes with `status`, and both QPs
    /// go to ERR; `takes_recv`: the receive taken before the refusal completes with `status`.
    Fail {
        /// The requester's status (and the taken receive's).
        status: WcStatus,
        /// A receive was taken first.
        takes_recv: bool,
    },
}

/// The QP access flags the simulated IB CM gives a connected QP with `responder_resources`
/// (`cma_init_qp_attr` through `rdma_init_qp_attr`): remote write always, remote read and
/// atomics only when the QP answers any.
pub(crate) const fn qp_access(responder_resources: u8) -> Access {
    if responder_resources > 0 {
        Access::REMOTE_WRITE
            .union(Access::REMOTE_READ)
            .union(Access::REMOTE_ATOMIC)
    } else {
        Access::REMOTE_WRITE
    }
}

/// The responder's answer to `req`, by `rxe_resp.c`'s checks in their order; `region` is what
/// the request's key names (`None`: nothing, a stale key, another device's region).
pub(crate) fn respond(req: &Request, qp: &Responder, region: Option<KeyedRegion>) -> Verdict {
    if !qp.ready {
        return Verdict::Drop;
    }
    let needs = req.op.needs();
    // check_op_valid: the QP's own access flags, for every length.
    if !qp.access.contains(needs) {
        return Verdict::Fail {
            status: WcStatus::RemInvReqErr,
            takes_recv: false,
        };
    }
    // check_resource: a receive for the immediate, responder resources for a READ or atomic.
    let takes_recv = match req.op {
        RemoteOp::WriteWithImm if !qp.has_recv => return Verdict::ReceiverNotReady,
        RemoteOp::WriteWithImm => true,
        RemoteOp::Read | RemoteOp::Atomic if qp.max_dest_rd_atomic == 0 => {
            return Verdict::Fail {
                status: WcStatus::RemInvReqErr,
                takes_recv: false,
            }
        }
        _ => false,
    };
    let atomic = req.op == RemoteOp::Atomic;
    let len = if atomic { u64::from(ATOMIC_LEN) } else { req.len };
    // check_rkey: none for a zero-length READ or WRITE, whatever key and address it names.
    if len == 0 {
        return Verdict::Execute {
            offset: 0,
            takes_recv,
        };
    }
    let access_error = Verdict::Fail {
        status: WcStatus::RemAccessErr,
        takes_recv,
    };
    let Some(region) = region else {
        return access_error;
    };
    if !region.access.contains(needs) {
        return access_error;
    }
    // The whole range, at the first packet: an out-of-range WRITE writes nothing.
    let offset = match req.addr.checked_sub(region.addr) {
        Some(offset) if offset.checked_add(len).is_some_and(|end| end <= region.len) => offset,
        _ => return access_error,
    };
    // atomic_reply: an 8-byte aligned address (the requester's post refuses others, so only a
    // foreign requester reaches this).
    if atomic && req.addr % u64::from(ATOMIC_LEN) != 0 {
        return Verdict::Fail {
            status: WcStatus::RemInvReqErr,
            takes_recv,
        };
    }
    Verdict::Execute { offset, takes_recv }
}

/// Where a request stands in the responder's sequence of its peer's requests.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Sequence {
    /// The next one: executed.
    Next,
    /// One answered before, sent again because its answer was lost: answered again from what
    /// was saved (an atomic is not executed twice: `duplicate_request`).
    Duplicate,
    /// Past one that was lost: dropped, and sent again by the requester after its timeout.
    Ahead,
}

/// Where request number `psn` stands when the responder expects number `expected`.
pub(crate) const fn sequence(psn: u64, expected: u64) -> Sequence {
    if psn == expected {
        Sequence::Next
    } else if psn < expected {
        Sequence::Duplicate
    } else {
        Sequence::Ahead
    }
}

/// The requester's next work request, as [`may_start`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Next {
    /// A SEND, or an RDMA WRITE with immediate: it lands in a receive at once when it goes.
    TwoSided,
    /// An RDMA WRITE, READ or atomic: it goes on the wire and completes when its answer comes.
    OneSided {
        /// A READ or atomic (it needs initiator depth, and a fence waits for it).
        reads: bool,
        /// `IBV_SEND_FENCE`.
        fence: bool,
    },
}

/// What the requester has in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pipeline {
    /// One-sided requests started and not completed.
    pub(crate) started: usize,
    /// Of those, READs and atomics.
    pub(crate) reads: u32,
    /// The QP's initiator depth (`max_rd_atomic`) as negotiated.
    pub(crate) depth: u8,
    /// A started request failed before leaving (a local error): nothing more starts, and the
    /// QP goes to ERR when that request completes.
    pub(crate) failed: bool,
}

/// The most READs and atomics in flight at an initiator depth of `depth`: rxe rounds
/// `max_rd_atomic` up to a power of two (`rxe_qp_from_attr`).
pub(crate) const fn depth_limit(depth: u8) -> u32 {
    if depth == 0 {
        0
    } else {
        (depth as u32).next_power_of_two()
    }
}

/// Whether `next` may start now.
pub(crate) const fn may_start(next: Next, p: &Pipeline) -> bool {
    if p.failed {
        return false;
    }
    match next {
        Next::TwoSided => p.started == 0,
        Next::OneSided { reads, fence } => {
            // rxe_wqe_is_fenced: until every earlier READ and atomic has completed here.
            if fence && p.reads > 0 {
                return false;
            }
            // check_init_depth.
            !reads || p.reads < depth_limit(p.depth)
        }
    }
}

/// What a completion of a send-queue work request of `opcode` over `len` bytes that ended
/// with `status` reports: its `byte_len`, and whether it is handed out at all (`signaled`: an
/// unsignalled success completes silently; failures and flushes always come out).
///
/// A successful READ reports the bytes it read, an atomic the 8 it returned, a SEND or WRITE
/// nothing (as the simulator's sends always have; verbs leaves it undefined); a failure
/// nothing (rxe clears the completion).
pub(crate) const fn completion(opcode: WcOpcode, len: u32, status: WcStatus, signaled: bool) -> (u32, bool) {
    let success = matches!(status, WcStatus::Success);
    let byte_len = match opcode {
        _ if !success => 0,
        WcOpcode::RdmaRead => len,
        WcOpcode::CompSwap | WcOpcode::FetchAdd => ATOMIC_LEN,
        _ => 0,
    };
    (byte_len, signaled || !success)
}

/// What a responder answered to a request, kept while its requester may send the request
/// again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Reply {
    /// A WRITE done.
    Ack,
    /// A READ's bytes.
    Read(Vec<u8>),
    /// An atomic's value before it.
    Atomic(u64),
    /// A refusal: the requester's status.
    Nak(WcStatus),
}

/// What an atomic leaves in memory given the value `old` it found: compare-and-swap swaps when
/// `old` equals `compare`, fetch-and-add adds, wrapping.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum AtomicOp {
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`.
    CompareSwap {
        /// Compared with the value found.
        compare: u64,
        /// Stored when they are equal.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    FetchAdd {
        /// Added to the value found.
        add: u64,
    },
}

impl AtomicOp {
    /// The value stored after the atomic found `old`.
    pub(crate) const fn apply(self, old: u64) -> u64 {
        match self {
            AtomicOp::CompareSwap { compare, swap } if old == compare => swap,
            AtomicOp::CompareSwap { .. } => old,
            AtomicOp::FetchAdd { add } => old.wrapping_add(add),
        }
    }
}

#[cfg(test)]
mod tests;
