//! Send work requests over memory regions (`struct ibv_send_wr`): SEND, RDMA WRITE (with an
//! immediate or without), RDMA READ, compare-and-swap and fetch-and-add, with their
//! scatter/gather list and flags, and the checks `ibv_post_send` makes of them before
//! anything is posted, written once for every backend ([`SendWr::check`]).

use crate::error::{Call, CmError};
use crate::handle::HandleKind;
use crate::memory::{Access, RemoteAddr, Sge};
use crate::types::{QpCaps, WcOpcode};

/// The bytes an atomic operation works on: one aligned `u64`.
pub const ATOMIC_LEN: u32 = 8;

/// What a send work request does (`enum ibv_wr_opcode`, with its operands).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SendOp {
    /// `IBV_WR_SEND` / `IBV_WR_SEND_WITH_IMM`: the gathered bytes land in the peer's next
    /// receive; `imm` is reported there ([`WorkCompletion::imm_data`](crate::WorkCompletion)).
    Send {
        /// The immediate, if any.
        imm: Option<u32>,
    },
    /// `IBV_WR_RDMA_WRITE` / `IBV_WR_RDMA_WRITE_WITH_IMM`: the gathered bytes are written at
    /// `remote`. With an immediate, the write also takes the peer's next receive, which
    /// completes as [`WcOpcode::RecvRdmaWithImm`] with `imm`.
    Write {
        /// Where in the peer's region.
        remote: RemoteAddr,
        /// The immediate, if any.
        imm: Option<u32>,
    },
    /// `IBV_WR_RDMA_READ`: the peer's bytes at `remote` are scattered into the list.
    Read {
        /// Where in the peer's region.
        remote: RemoteAddr,
    },
    /// `IBV_WR_ATOMIC_CMP_AND_SWP`: the 8 bytes at `remote` become `swap` if they equal
    /// `compare`; their value before lands in the single 8-byte entry of the list.
    CompareSwap {
        /// The peer's 8 aligned bytes.
        remote: RemoteAddr,
        /// The value expected there.
        compare: u64,
        /// The value written when it is there.
        swap: u64,
    },
    /// `IBV_WR_ATOMIC_FETCH_AND_ADD`: `add` is added to the 8 bytes at `remote` (wrapping);
    /// their value before lands in the single 8-byte entry of the list.
    FetchAdd {
        /// The peer's 8 aligned bytes.
        remote: RemoteAddr,
        /// The addend.
        add: u64,
    },
}

impl SendOp {
    /// The opcode of the requester's completion.
    pub const fn wc_opcode(&self) -> WcOpcode {
        match self {
            SendOp::Send { .. } => WcOpcode::Send,
            SendOp::Write { .. } => WcOpcode::RdmaWrite,
            SendOp::Read { .. } => WcOpcode::RdmaRead,
            SendOp::CompareSwap { .. } => WcOpcode::CompSwap,
            SendOp::FetchAdd { .. } => WcOpcode::FetchAdd,
        }
    }

    /// Whether the operation reads or updates the peer's memory and waits for its answer (an
    /// RDMA READ or an atomic): these count against the connection's initiator depth and are
    /// what a fenced work request waits for.
    pub const fn is_read_or_atomic(&self) -> bool {
        matches!(
            self,
            SendOp::Read { .. } | SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. }
        )
    }

    /// Whether it is one of the two atomics.
    pub const fn is_atomic(&self) -> bool {
        matches!(self, SendOp::CompareSwap { .. } | SendOp::FetchAdd { .. })
    }

    /// Whether the NIC writes the local entries (the answer of a READ or an atomic lands
    /// there), so their regions need `LOCAL_WRITE`.
    pub const fn writes_locally(&self) -> bool {
        self.is_read_or_atomic()
    }

    /// The remote target, for every operation but a send.
    pub const fn remote(&self) -> Option<RemoteAddr> {
        match *self {
            SendOp::Send { .. } => None,
            SendOp::Write { remote, .. }
            | SendOp::Read { remote }
            | SendOp::CompareSwap { remote, .. }
            | SendOp::FetchAdd { remote, .. } => Some(remote),
        }
    }

    /// The immediate it carries, if any.
    pub const fn imm(&self) -> Option<u32> {
        match *self {
            SendOp::Send { imm } | SendOp::Write { imm, .. } => imm,
            _ => None,
        }
    }

    /// verbs' `IBV_WR_*` name.
    pub const fn name(&self) -> &'static str {
        match self {
            SendOp::Send { imm: None } => "IBV_WR_SEND",
            SendOp::Send { imm: Some(_) } => "IBV_WR_SEND_WITH_IMM",
            SendOp::Write { imm: None, .. } => "IBV_WR_RDMA_WRITE",
            SendOp::Write { imm: Some(_), .. } => "IBV_WR_RDMA_WRITE_WITH_IMM",
            SendOp::Read { .. } => "IBV_WR_RDMA_READ",
            SendOp::CompareSwap { .. } => "IBV_WR_ATOMIC_CMP_AND_SWP",
            SendOp::FetchAdd { .. } => "IBV_WR_ATOMIC_FETCH_AND_ADD",
        }
    }
}

/// One send work request over registered memory, for
/// [`post_send_wr`](crate::CmBackend::post_send_wr).
///
/// Signalled by default: one completion when it is done. An unsignalled one completes
/// silently when it succeeds (a failure still completes, and so does a flush); its slot in the
/// send queue is held until a later signalled request of the queue completes and that
/// completion is polled, as verbs requires of applications.
///
/// ```
/// use cm_core::{RemoteAddr, SendOp, SendWr, Sge};
/// # let mr = cm_core::backend::mr_handle(1, 0, 0);
/// let remote = RemoteAddr { addr: 0x1000, rkey: 7 };
/// let sge = [Sge::new(mr, 0, 8)];
/// let add = SendWr::new(1, SendOp::FetchAdd { remote, add: 1 }, &sge).fenced();
/// assert!(add.signaled && add.fence);
/// let quiet = SendWr::new(2, SendOp::Write { remote, imm: None }, &sge).unsignaled();
/// assert!(!quiet.signaled);
/// assert_eq!(quiet.len(), 8);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SendWr<'a> {
    /// The caller's id for it, reported by its completion.
    pub wr_id: u64,
    /// What it does.
    pub op: SendOp,
    /// The local bytes: gathered for a send or write, scattered into for a read or atomic.
    pub sg_list: &'a [Sge],
    /// `IBV_SEND_SIGNALED`: complete with a completion even when it succeeds.
    pub signaled: bool,
    /// `IBV_SEND_FENCE`: start only once every earlier READ and atomic of the QP has completed.
    pub fence: bool,
}

impl<'a> SendWr<'a> {
    /// A signalled, unfenced work request.
    pub const fn new(wr_id: u64, op: SendOp, sg_list: &'a [Sge]) -> SendWr<'a> {
        SendWr {
            wr_id,
            op,
            sg_list,
            signaled: true,
            fence: false,
        }
    }

    /// The same request without `IBV_SEND_SIGNALED`.
    #[must_use = "returns the changed request"]
    pub const fn unsignaled(self) -> SendWr<'a> {
        SendWr {
            signaled: false,
            ..self
        }
    }

    /// The same request with `IBV_SEND_FENCE`.
    #[must_use = "returns the changed request"]
    pub const fn fenced(self) -> SendWr<'a> {
        SendWr { fence: true, ..self }
    }

    /// Bytes of the scatter/gather list.
    pub fn len(&self) -> u64 {
        self.sg_list.iter().map(|s| u64::from(s.len)).sum()
    }

    /// Whether the list carries no bytes.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The checks `ibv_post_send` makes of the request itself, before the backend looks at
    /// its regions, in the order both backends answer them:
    /// * more entries than the QP's `max_send_sge` (verbs: `EINVAL`);
    /// * an atomic whose list is not one 8-byte entry, or whose remote address is not 8-byte
    ///   aligned (rxe refuses a list shorter than 8 bytes and an unaligned address with
    ///   `EINVAL`; a longer list it takes, and writes 8 bytes of it: refused here too);
    /// * a message of more than `u32::MAX` bytes (a completion's `byte_len` cannot count it;
    ///   rxe's provider wraps the sum). The port's `max_msg_sz` is not a limit: rxe reports
    ///   8 MiB and carries longer messages whole;
    /// * a READ or atomic on a connection whose initiator depth is 0: the QP may have none in
    ///   flight, so rxe would hold it, and every request after it, forever.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] naming the rule.
    pub fn check(&self, caps: &QpCaps, initiator_depth: u8) -> Result<(), CmError> {
        let invalid = |reason| {
            Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason,
            })
        };
        if self.sg_list.len() > caps.max_send_sge as usize {
            return invalid("more scatter/gather entries than max_send_sge");
        }
        if self.op.is_atomic() {
            if self.sg_list.len() != 1 || self.sg_list[0].len != ATOMIC_LEN {
                return invalid("an atomic needs one scatter/gather entry of 8 bytes");
            }
            if self
                .op
                .remote()
                .is_some_and(|r| r.addr % u64::from(ATOMIC_LEN) != 0)
            {
                return invalid("an atomic's remote address must be 8-byte aligned");
            }
        }
        if self.len() > u64::from(u32::MAX) {
            return invalid("message longer than 2^32 - 1 bytes");
        }
        if self.op.is_read_or_atomic() && initiator_depth == 0 {
            return invalid("RDMA READ and atomics need an initiator depth above 0");
        }
        Ok(())
    }
}

/// What a backend knows of the region a local entry names, for [`check_local_sge`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LocalRegion {
    /// The region's length.
    pub len: u64,
    /// What it was registered with.
    pub access: Access,
    /// Whether it is registered on the protection domain of the QP's device.
    pub same_device: bool,
}

/// The checks of one local entry of `op`'s list, which both backends make before posting,
/// given the region its handle names (`None`: no region of this backend has that handle).
/// rxe would fail the request on the QP with a local protection error instead; refusing it
/// here keeps the QP usable, and a backend's own regions cannot otherwise be misnamed.
///
/// # Errors
/// [`CmError::UnknownHandle`] for an unknown region; [`CmError::InvalidArgument`] for a region
/// of another device, an entry past the region's end, or a READ's or atomic's destination
/// without `LOCAL_WRITE`.
pub fn check_local_sge(op: &SendOp, sge: &Sge, region: Option<LocalRegion>) -> Result<(), CmError> {
    let call = Call::PostSend;
    let Some(region) = region else {
        return Err(CmError::UnknownHandle {
            call,
            kind: HandleKind::Mr,
        });
    };
    let invalid = |reason| Err(CmError::InvalidArgument { call, reason });
    if !region.same_device {
        return invalid("memory region registered on another device");
    }
    if !sge.fits(region.len) {
        return invalid("scatter/gather entry outside its memory region");
    }
    if op.writes_locally() && !region.access.contains(Access::LOCAL_WRITE) {
        return invalid("a READ's or atomic's destination needs LOCAL_WRITE");
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::mr_handle;

    const REMOTE: RemoteAddr = RemoteAddr {
        addr: 0x1000,
        rkey: 9,
    };

    fn reason(r: Result<(), CmError>) -> &'static str {
        match r {
            Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason,
            }) => reason,
            other => panic!("not a post_send refusal: {other:?}"),
        }
    }

    #[test]
    fn every_operation_names_its_completion_remote_and_immediate() {
        let ops = [
            (SendOp::Send { imm: None }, WcOpcode::Send, None, None, false),
            (
                SendOp::Send { imm: Some(5) },
                WcOpcode::Send,
                None,
                Some(5),
                false,
            ),
            (
                SendOp::Write {
                    remote: REMOTE,
                    imm: Some(6),
                },
                WcOpcode::RdmaWrite,
                Some(REMOTE),
                Some(6),
                false,
            ),
            (
                SendOp::Read { remote: REMOTE },
                WcOpcode::RdmaRead,
                Some(REMOTE),
                None,
                true,
            ),
            (
                SendOp::CompareSwap {
                    remote: REMOTE,
                    compare: 1,
                    swap: 2,
                },
                WcOpcode::CompSwap,
                Some(REMOTE),
                None,
                true,
            ),
            (
                SendOp::FetchAdd {
                    remote: REMOTE,
                    add: 1,
                },
                WcOpcode::FetchAdd,
                Some(REMOTE),
                None,
                true,
            ),
        ];
        for (op, wc, remote, imm, reads) in ops {
            assert_eq!(op.wc_opcode(), wc, "{}", op.name());
            assert_eq!(op.remote(), remote, "{}", op.name());
            assert_eq!(op.imm(), imm, "{}", op.name());
            assert_eq!(op.is_read_or_atomic(), reads, "{}", op.name());
            assert_eq!(op.writes_locally(), reads, "{}", op.name());
        }
        assert!(SendOp::FetchAdd {
            remote: REMOTE,
            add: 0
        }
        .is_atomic());
        assert!(!SendOp::Read { remote: REMOTE }.is_atomic());
        assert_eq!(
            SendOp::Write {
                remote: REMOTE,
                imm: None
            }
            .name(),
            "IBV_WR_RDMA_WRITE"
        );
    }

    #[test]
    fn post_send_refuses_what_verbs_refuses_in_the_order_both_backends_check() {
        let mr = mr_handle(1, 0, 0);
        let caps = QpCaps {
            max_send_sge: 2,
            ..QpCaps::new()
        };
        let eight = [Sge::new(mr, 0, 8)];
        let write = |sges| {
            SendWr::new(
                1,
                SendOp::Write {
                    remote: REMOTE,
                    imm: None,
                },
                sges,
            )
        };
        assert_eq!(write(&eight).check(&caps, 0), Ok(()), "a write needs no depth");
        let three = [Sge::new(mr, 0, 1); 3];
        assert_eq!(
            reason(write(&three).check(&caps, 1)),
            "more scatter/gather entries than max_send_sge"
        );
        let huge = [Sge::new(mr, 0, u32::MAX), Sge::new(mr, 0, 1)];
        assert_eq!(
            reason(write(&huge).check(&caps, 1)),
            "message longer than 2^32 - 1 bytes"
        );
        let largest = [Sge::new(mr, 0, u32::MAX - 1), Sge::new(mr, 0, 1)];
        assert_eq!(write(&largest).check(&caps, 1), Ok(()));
        let add = |remote, sges| SendWr::new(1, SendOp::FetchAdd { remote, add: 1 }, sges);
        assert_eq!(add(REMOTE, &eight).check(&caps, 1), Ok(()));
        let four = [Sge::new(mr, 0, 4)];
        let two = [Sge::new(mr, 0, 8), Sge::new(mr, 8, 0)];
        for bad in [&four[..], &two[..], &[][..]] {
            assert_eq!(
                reason(add(REMOTE, bad).check(&caps, 1)),
                "an atomic needs one scatter/gather entry of 8 bytes"
            );
        }
        let odd = RemoteAddr {
            addr: 0x1004,
            rkey: 9,
        };
        assert_eq!(
            reason(add(odd, &eight).check(&caps, 1)),
            "an atomic's remote address must be 8-byte aligned"
        );
        let cas = SendWr::new(
            2,
            SendOp::CompareSwap {
                remote: odd,
                compare: 0,
                swap: 1,
            },
            &eight,
        );
        assert_eq!(
            reason(cas.check(&caps, 1)),
            "an atomic's remote address must be 8-byte aligned"
        );
        assert_eq!(
            reason(add(REMOTE, &eight).check(&caps, 0)),
            "RDMA READ and atomics need an initiator depth above 0"
        );
        let read = SendWr::new(3, SendOp::Read { remote: odd }, &four);
        assert_eq!(read.check(&caps, 1), Ok(()), "reads may be unaligned");
        assert_eq!(
            reason(read.check(&caps, 0)),
            "RDMA READ and atomics need an initiator depth above 0"
        );
        let none = SendWr::new(4, SendOp::Send { imm: None }, &[]);
        assert!(none.is_empty());
        assert_eq!(none.len(), 0);
        assert_eq!(none.check(&caps, 0), Ok(()), "an empty send fits any size");
    }

    #[test]
    fn local_entries_must_name_a_region_of_the_device_that_fits_and_may_be_written() {
        let mr = mr_handle(1, 0, 0);
        let region = LocalRegion {
            len: 16,
            access: Access::NONE,
            same_device: true,
        };
        let write = SendOp::Write {
            remote: REMOTE,
            imm: None,
        };
        let read = SendOp::Read { remote: REMOTE };
        let add = SendOp::FetchAdd {
            remote: REMOTE,
            add: 1,
        };
        let sge = Sge::new(mr, 8, 8);
        assert_eq!(
            check_local_sge(&write, &sge, Some(region)),
            Ok(()),
            "a write reads locally"
        );
        assert_eq!(
            check_local_sge(&write, &sge, None),
            Err(CmError::UnknownHandle {
                call: Call::PostSend,
                kind: HandleKind::Mr
            })
        );
        let elsewhere = LocalRegion {
            same_device: false,
            ..region
        };
        assert_eq!(
            reason(check_local_sge(&write, &sge, Some(elsewhere))),
            "memory region registered on another device"
        );
        assert_eq!(
            reason(check_local_sge(&write, &Sge::new(mr, 9, 8), Some(region))),
            "scatter/gather entry outside its memory region"
        );
        for op in [read, add] {
            assert_eq!(
                reason(check_local_sge(&op, &sge, Some(region))),
                "a READ's or atomic's destination needs LOCAL_WRITE"
            );
            let writable = LocalRegion {
                access: Access::LOCAL_WRITE,
                ..region
            };
            assert_eq!(check_local_sge(&op, &sge, Some(writable)), Ok(()));
        }
    }

    #[test]
    fn flags_default_to_signalled_and_unfenced() {
        let wr = SendWr::new(1, SendOp::Send { imm: None }, &[]);
        assert!(wr.signaled && !wr.fence);
        let wr = wr.unsignaled().fenced();
        assert!(!wr.signaled && wr.fence);
    }

    #[test]
    fn a_requests_length_is_its_entries_bytes() {
        let mr = mr_handle(1, 0, 0);
        assert!(SendWr::new(1, SendOp::Send { imm: None }, &[]).is_empty());
        let zero = [Sge::new(mr, 0, 0), Sge::new(mr, 8, 0)];
        assert!(SendWr::new(1, SendOp::Send { imm: None }, &zero).is_empty());
        let list = [Sge::new(mr, 0, 3), Sge::new(mr, 64, 5)];
        let wr = SendWr::new(1, SendOp::Send { imm: None }, &list);
        assert_eq!((wr.len(), wr.is_empty()), (8, false));
    }
}
