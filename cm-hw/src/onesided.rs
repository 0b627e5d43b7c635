//! The verbs side of one-sided work as pure code (no `unsafe`, no I/O): which
//! `ibv_send_wr` a [`SendWr`] becomes, what a polled completion of it (or of a receive it
//! took at the peer) hands out, how an SRQ's receives are told apart on a QP's CQ, and which
//! object an asynchronous event names.

use cm_core::backend::SlotUse;
use cm_core::{SendOp, SendWr, WcOpcode, WcStatus, ATOMIC_LEN};
use rdma_sys as ffi;

/// The bit an SRQ's receives carry in their verbs wr id. A QP's own work requests carry their
/// slot, below 2^32, so a completion on a QP's CQ with this bit set is a receive the QP took
/// from its SRQ, and the rest of the id is the SRQ's slot.
const SRQ_WR_ID_TAG: u64 = 1 << 63;

/// The verbs wr id of SRQ slot `slot`.
pub(crate) const fn srq_wr_id(slot: u32) -> u64 {
    SRQ_WR_ID_TAG | slot as u64
}

/// The SRQ slot a verbs wr id names, if it is an SRQ's receive.
pub(crate) const fn srq_slot(wr_id: u64) -> Option<u64> {
    if wr_id & SRQ_WR_ID_TAG != 0 {
        Some(wr_id & !SRQ_WR_ID_TAG)
    } else {
        None
    }
}

/// Where an RDMA WRITE, READ or atomic goes, and an atomic's operands (`wr.rdma` /
/// `wr.atomic`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Target {
    /// A send: no remote address.
    None,
    /// `wr.rdma`.
    Rdma {
        /// `remote_addr`.
        remote_addr: u64,
        /// `rkey`.
        rkey: u32,
    },
    /// `wr.atomic`.
    Atomic {
        /// `remote_addr`.
        remote_addr: u64,
        /// `rkey`.
        rkey: u32,
        /// `compare_add`: the compare value of a CAS, the addend of a FAA.
        compare_add: u64,
        /// `swap` (0 for a FAA).
        swap: u64,
    },
}

/// The fields of the `ibv_send_wr` a work request becomes, besides its wr id and list.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct WrShape {
    /// `opcode` (`enum ibv_wr_opcode`).
    pub(crate) opcode: ffi::ibv_wr_opcode::Type,
    /// `send_flags`: always `IBV_SEND_SIGNALED` (every request completes, so that its slot is
    /// freed when it is polled; the backend hides an unsignalled success), plus
    /// `IBV_SEND_FENCE` when asked.
    pub(crate) send_flags: u32,
    /// `imm_data` as verbs stores it: in network byte order.
    pub(crate) imm_data: Option<u32>,
    /// `wr.rdma` / `wr.atomic`.
    pub(crate) target: Target,
}

/// The `ibv_send_wr` of `wr`.
pub(crate) fn shape(wr: &SendWr<'_>) -> WrShape {
    use ffi::ibv_wr_opcode::*;
    let rdma = |r: cm_core::RemoteAddr| Target::Rdma {
        remote_addr: r.addr,
        rkey: r.rkey,
    };
    let (opcode, target) = match wr.op {
        SendOp::Send { imm: None } => (IBV_WR_SEND, Target::None),
        SendOp::Send { imm: Some(_) } => (IBV_WR_SEND_WITH_IMM, Target::None),
        SendOp::Write { remote, imm: None } => (IBV_WR_RDMA_WRITE, rdma(remote)),
        SendOp::Write { remote, imm: Some(_) } => (IBV_WR_RDMA_WRITE_WITH_IMM, rdma(remote)),
        SendOp::Read { remote } => (IBV_WR_RDMA_READ, rdma(remote)),
        SendOp::CompareSwap {
            remote,
            compare,
            swap,
        } => (
            IBV_WR_ATOMIC_CMP_AND_SWP,
            Target::Atomic {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                compare_add: compare,
                swap,
            },
        ),
        SendOp::FetchAdd { remote, add } => (
            IBV_WR_ATOMIC_FETCH_AND_ADD,
            Target::Atomic {
                remote_addr: remote.addr,
                rkey: remote.rkey,
                compare_add: add,
                swap: 0,
            },
        ),
    };
    let mut send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
    if wr.fence {
        send_flags |= ffi::ibv_send_flags::IBV_SEND_FENCE.0;
    }
    WrShape {
        opcode,
        send_flags,
        imm_data: wr.op.imm().map(u32::to_be),
        target,
    }
}

/// The verbs fields of a polled completion that decide what it hands out.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Polled {
    /// `status` (`enum ibv_wc_status`).
    pub(crate) status: u32,
    /// `opcode` (`enum ibv_wc_opcode`; verbs defines it only for a success).
    pub(crate) opcode: u32,
    /// `byte_len`.
    pub(crate) byte_len: u32,
    /// `wc_flags`.
    pub(crate) wc_flags: u32,
    /// `imm_data`, in network byte order as verbs leaves it.
    pub(crate) imm_data: u32,
}

/// Where a completion's bytes are.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Payload {
    /// It carries none.
    None,
    /// The first `n` bytes of the receive's slot (a connected QP's, or its SRQ's).
    Slot(u32),
    /// A UD receive: the datagram after the GRH, `byte_len` counting the GRH.
    Datagram,
}

/// What a polled completion becomes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Delivery {
    /// An unsignalled request that succeeded: its slot is freed and nothing is handed out (verbs
    /// would not have completed it visibly).
    Hidden,
    /// A completion to hand out.
    Out {
        /// Its status (an unknown value is a general error).
        status: WcStatus,
        /// Its opcode: the request's own, or for a receive the kind of message that took it.
        opcode: WcOpcode,
        /// `byte_len` as the trait reports it.
        byte_len: u32,
        /// The immediate, when the message carried one.
        imm_data: Option<u32>,
        /// Where its bytes are.
        payload: Payload,
    },
}

/// What the completion `c` of the request `posted` (as its slot recorded it) hands out; `ud`
/// says whether the QP is a datagram QP.
///
/// * A failed request reports its own opcode (rxe writes 0, `IBV_WC_SEND`, there), `byte_len`
///   0, no immediate and no bytes.
/// * A receive reports `RecvRdmaWithImm` when an RDMA WRITE with immediate took it (the WRITE's
///   whole length, no bytes: they went to the region), `Recv` otherwise (the bytes received, at
///   most the posted length); the immediate when `IBV_WC_WITH_IMM` says there is one.
/// * An RDMA READ reports the bytes read, an atomic its 8, a SEND or WRITE 0. An unsignalled one
///   is [`Delivery::Hidden`].
pub(crate) fn deliver(c: &Polled, posted: &SlotUse, ud: bool) -> Delivery {
    let status = WcStatus::from_raw(c.status).unwrap_or(WcStatus::GeneralErr);
    if status != WcStatus::Success {
        return Delivery::Out {
            status,
            opcode: posted.opcode,
            byte_len: 0,
            imm_data: None,
            payload: Payload::None,
        };
    }
    let imm = (c.wc_flags & ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0 != 0).then(|| u32::from_be(c.imm_data));
    if posted.opcode.is_recv() {
        if c.opcode == ffi::ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM {
            return Delivery::Out {
                status,
                opcode: WcOpcode::RecvRdmaWithImm,
                byte_len: c.byte_len,
                imm_data: imm,
                payload: Payload::None,
            };
        }
        // A datagram's length is the payload's, which its reader finds behind the GRH. Its
        // immediate is not the application's: the trait's datagrams carry none, and the
        // backend's own sends put their QP number there (for rdma-core's udaddy).
        let (byte_len, payload, imm) = if ud {
            (0, Payload::Datagram, None)
        } else {
            let n = c.byte_len.min(posted.len);
            (n, Payload::Slot(n), imm)
        };
        return Delivery::Out {
            status,
            opcode: WcOpcode::Recv,
            byte_len,
            imm_data: imm,
            payload,
        };
    }
    if !posted.signaled {
        return Delivery::Hidden;
    }
    let byte_len = match posted.opcode {
        WcOpcode::RdmaRead => c.byte_len,
        WcOpcode::CompSwap | WcOpcode::FetchAdd => ATOMIC_LEN,
        _ => 0,
    };
    Delivery::Out {
        status,
        opcode: posted.opcode,
        byte_len,
        // The requester's completion of a WRITE with immediate carries IBV_WC_WITH_IMM on rxe
        // too, but the immediate is the receiver's to report.
        imm_data: None,
        payload: Payload::None,
    }
}

/// What an asynchronous event is about (`struct ibv_async_event`'s element, by event type).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) enum Subject {
    /// A QP, by its `struct ibv_qp`'s address.
    Qp(usize),
    /// An SRQ, by its `struct ibv_srq`'s address.
    Srq(usize),
    /// A CQ, by its address.
    Cq(usize),
    /// A port of the device (or the device itself: `DEVICE_FATAL`).
    Port(i32),
    /// A work queue, by its address.
    Wq(usize),
}

/// Which member of `struct ibv_async_event`'s element union an event of `event_type` fills,
/// as libibverbs' `ibv_get_async_event` fills it: CQ for `CQ_ERR`, QP for the QP events, SRQ
/// for the SRQ events, WQ for `WQ_FATAL`, the port number for everything else.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum ElementKind {
    /// `element.cq`.
    Cq,
    /// `element.qp`.
    Qp,
    /// `element.srq`.
    Srq,
    /// `element.wq`.
    Wq,
    /// `element.port_num`.
    Port,
}

/// The element an event of `event_type` names.
pub(crate) fn element_kind(event_type: u32) -> ElementKind {
    match event_type {
        CQ_ERR => ElementKind::Cq,
        QP_FATAL..=PATH_MIG_ERR | QP_LAST_WQE_REACHED => ElementKind::Qp,
        SRQ_ERR | SRQ_LIMIT_REACHED => ElementKind::Srq,
        WQ_FATAL => ElementKind::Wq,
        _ => ElementKind::Port,
    }
}

/// `enum ibv_event_type`'s values (bindgen makes it a Rust enum, which an unknown value from
/// a newer kernel would make undefined behaviour to read: the raw value is read instead).
const CQ_ERR: u32 = 0;
const QP_FATAL: u32 = 1;
const QP_REQ_ERR: u32 = 2;
const QP_ACCESS_ERR: u32 = 3;
const COMM_EST: u32 = 4;
const PATH_MIG_ERR: u32 = 7;
const SRQ_ERR: u32 = 14;
const SRQ_LIMIT_REACHED: u32 = 15;
const QP_LAST_WQE_REACHED: u32 = 16;
const WQ_FATAL: u32 = 19;

/// What the trait makes of an event about a QP of this backend.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum QpEventKind {
    /// `QP_FATAL`, `QP_REQ_ERR`, `QP_ACCESS_ERR`: the QP went to ERR.
    Failed,
    /// `COMM_EST`.
    CommEstablished,
    /// `QP_LAST_WQE_REACHED`.
    LastWqe,
    /// Another QP event (SQ drained, path migration): reported as `Other`.
    Other,
}

/// The trait's kind of a QP event of `event_type`.
pub(crate) fn qp_event_kind(event_type: u32) -> QpEventKind {
    match event_type {
        QP_FATAL | QP_REQ_ERR | QP_ACCESS_ERR => QpEventKind::Failed,
        COMM_EST => QpEventKind::CommEstablished,
        QP_LAST_WQE_REACHED => QpEventKind::LastWqe,
        _ => QpEventKind::Other,
    }
}

/// Whether an event of `event_type` about an SRQ is its limit.
pub(crate) const fn is_srq_limit(event_type: u32) -> bool {
    event_type == SRQ_LIMIT_REACHED
}

/// The event a QP event of `event_type` on `id`'s QP is, for the trait.
pub(crate) fn qp_event(event_type: u32, id: cm_core::IdHandle) -> cm_core::AsyncEvent {
    use cm_core::AsyncEvent;
    match event_type {
        QP_FATAL => AsyncEvent::QpFatal { id },
        QP_REQ_ERR => AsyncEvent::QpRequestErr { id },
        QP_ACCESS_ERR => AsyncEvent::QpAccessErr { id },
        COMM_EST => AsyncEvent::CommEstablished { id },
        QP_LAST_WQE_REACHED => AsyncEvent::QpLastWqeReached { id },
        raw => AsyncEvent::Other { raw },
    }
}

#[cfg(test)]
mod tests {
    use cm_core::{RemoteAddr, Sge};

    use super::*;

    const REMOTE: RemoteAddr = RemoteAddr {
        addr: 0x7f00_0000_1008,
        rkey: 0x1234,
    };

    fn shape_of(op: SendOp) -> WrShape {
        let mr = cm_core::backend::mr_handle(1, 0, 0);
        let sge = [Sge::new(mr, 0, 8)];
        shape(&SendWr::new(1, op, &sge))
    }

    #[test]
    fn every_operation_becomes_its_verbs_opcode_with_its_target() {
        use ffi::ibv_wr_opcode::*;
        let rdma = Target::Rdma {
            remote_addr: REMOTE.addr,
            rkey: REMOTE.rkey,
        };
        let cases = [
            (SendOp::Send { imm: None }, IBV_WR_SEND, Target::None, None),
            (
                SendOp::Send {
                    imm: Some(0x0102_0304),
                },
                IBV_WR_SEND_WITH_IMM,
                Target::None,
                Some(0x0102_0304),
            ),
            (
                SendOp::Write {
                    remote: REMOTE,
                    imm: None,
                },
                IBV_WR_RDMA_WRITE,
                rdma,
                None,
            ),
            (
                SendOp::Write {
                    remote: REMOTE,
                    imm: Some(7),
                },
                IBV_WR_RDMA_WRITE_WITH_IMM,
                rdma,
                Some(7),
            ),
            (SendOp::Read { remote: REMOTE }, IBV_WR_RDMA_READ, rdma, None),
            (
                SendOp::CompareSwap {
                    remote: REMOTE,
                    compare: 3,
                    swap: 9,
                },
                IBV_WR_ATOMIC_CMP_AND_SWP,
                Target::Atomic {
                    remote_addr: REMOTE.addr,
                    rkey: REMOTE.rkey,
                    compare_add: 3,
                    swap: 9,
                },
                None,
            ),
            (
                SendOp::FetchAdd {
                    remote: REMOTE,
                    add: 5,
                },
                IBV_WR_ATOMIC_FETCH_AND_ADD,
                Target::Atomic {
                    remote_addr: REMOTE.addr,
                    rkey: REMOTE.rkey,
                    compare_add: 5,
                    swap: 0,
                },
                None,
            ),
        ];
        for (op, opcode, target, imm) in cases {
            let s = shape_of(op);
            assert_eq!((s.opcode, s.target), (opcode, target), "{}", op.name());
            // verbs takes the immediate in network byte order.
            assert_eq!(s.imm_data.map(u32::from_be), imm, "{}", op.name());
        }
        assert_eq!(
            shape_of(SendOp::Send {
                imm: Some(0x0102_0304)
            })
            .imm_data
            .map(u32::to_ne_bytes),
            Some([1, 2, 3, 4]),
            "the first byte on the wire is the most significant"
        );
    }

    #[test]
    fn every_request_is_signalled_and_a_fenced_one_carries_the_fence() {
        let signaled = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let fence = ffi::ibv_send_flags::IBV_SEND_FENCE.0;
        let mr = cm_core::backend::mr_handle(1, 0, 0);
        let sge = [Sge::new(mr, 0, 8)];
        let read = SendWr::new(1, SendOp::Read { remote: REMOTE }, &sge);
        assert_eq!(shape(&read).send_flags, signaled);
        assert_eq!(shape(&read.unsignaled()).send_flags, signaled, "slot accounting");
        assert_eq!(shape(&read.fenced()).send_flags, signaled | fence);
        assert_eq!(shape(&read.unsignaled().fenced()).send_flags, signaled | fence);
    }

    fn slot(opcode: WcOpcode, len: u32, signaled: bool) -> SlotUse {
        SlotUse {
            wr_id: 42,
            len,
            flushed: false,
            opcode,
            signaled,
        }
    }

    fn polled(status: WcStatus, opcode: u32, byte_len: u32) -> Polled {
        Polled {
            status: status as u32,
            opcode,
            byte_len,
            wc_flags: 0,
            imm_data: 0,
        }
    }

    fn out(d: Delivery) -> (WcStatus, WcOpcode, u32, Option<u32>, Payload) {
        match d {
            Delivery::Out {
                status,
                opcode,
                byte_len,
                imm_data,
                payload,
            } => (status, opcode, byte_len, imm_data, payload),
            Delivery::Hidden => panic!("hidden"),
        }
    }

    #[test]
    fn successful_requests_report_the_lengths_the_trait_defines() {
        use ffi::ibv_wc_opcode::*;
        let ok = WcStatus::Success;
        let read = polled(ok, IBV_WC_RDMA_READ, 100);
        assert_eq!(
            out(deliver(&read, &slot(WcOpcode::RdmaRead, 100, true), false)),
            (ok, WcOpcode::RdmaRead, 100, None, Payload::None)
        );
        // rxe reports the list's length for an atomic; the trait says 8.
        for op in [WcOpcode::CompSwap, WcOpcode::FetchAdd] {
            let c = polled(ok, op.raw(), 8);
            assert_eq!(out(deliver(&c, &slot(op, 8, true), false)).2, 8, "{op}");
        }
        for op in [WcOpcode::Send, WcOpcode::RdmaWrite] {
            let c = polled(ok, op.raw(), 64);
            assert_eq!(
                out(deliver(&c, &slot(op, 64, true), false)),
                (ok, op, 0, None, Payload::None),
                "{op}"
            );
        }
    }

    #[test]
    fn an_unsignalled_success_is_hidden_but_its_failure_is_not() {
        use ffi::ibv_wc_opcode::*;
        let quiet = slot(WcOpcode::RdmaWrite, 8, false);
        let ok = polled(WcStatus::Success, IBV_WC_RDMA_WRITE, 8);
        assert_eq!(deliver(&ok, &quiet, false), Delivery::Hidden);
        let failed = polled(WcStatus::RemAccessErr, 0, 0);
        assert_eq!(
            out(deliver(&failed, &quiet, false)),
            (
                WcStatus::RemAccessErr,
                WcOpcode::RdmaWrite,
                0,
                None,
                Payload::None
            )
        );
        let flushed = polled(WcStatus::WrFlushErr, 0, 0);
        assert_eq!(out(deliver(&flushed, &quiet, false)).0, WcStatus::WrFlushErr);
    }

    #[test]
    fn a_failed_request_reports_its_own_opcode_not_the_devices() {
        // rxe memsets an error CQE: opcode 0 (IBV_WC_SEND), byte_len 0.
        for op in [WcOpcode::RdmaRead, WcOpcode::FetchAdd, WcOpcode::Recv] {
            let c = polled(WcStatus::RemAccessErr, 0, 0);
            assert_eq!(
                out(deliver(&c, &slot(op, 16, true), false)),
                (WcStatus::RemAccessErr, op, 0, None, Payload::None)
            );
        }
        let unknown = Polled {
            status: 999,
            ..polled(WcStatus::Success, 0, 0)
        };
        assert_eq!(
            out(deliver(&unknown, &slot(WcOpcode::Send, 0, true), false)).0,
            WcStatus::GeneralErr
        );
    }

    #[test]
    fn receives_report_their_bytes_and_the_immediate_in_host_order() {
        use ffi::ibv_wc_opcode::*;
        let with_imm = ffi::ibv_wc_flags::IBV_WC_WITH_IMM.0;
        let posted = slot(WcOpcode::Recv, 64, true);
        let send = Polled {
            wc_flags: with_imm,
            imm_data: 0xAABB_CCDDu32.to_be(),
            ..polled(WcStatus::Success, IBV_WC_RECV, 100)
        };
        assert_eq!(
            out(deliver(&send, &posted, false)),
            (
                WcStatus::Success,
                WcOpcode::Recv,
                64,
                Some(0xAABB_CCDD),
                Payload::Slot(64)
            ),
            "at most the posted length is copied"
        );
        let write = Polled {
            wc_flags: with_imm | ffi::ibv_wc_flags::IBV_WC_GRH.0,
            imm_data: 5u32.to_be(),
            ..polled(WcStatus::Success, IBV_WC_RECV_RDMA_WITH_IMM, 4096)
        };
        assert_eq!(
            out(deliver(&write, &posted, false)),
            (
                WcStatus::Success,
                WcOpcode::RecvRdmaWithImm,
                4096,
                Some(5),
                Payload::None
            ),
            "the WRITE's whole length, its bytes in the region"
        );
        let plain = polled(WcStatus::Success, IBV_WC_RECV, 10);
        assert_eq!(out(deliver(&plain, &posted, false)).3, None);
        assert_eq!(out(deliver(&plain, &posted, true)).4, Payload::Datagram);
        // A datagram's immediate (the sender's QP number, from this backend) is not handed out.
        assert_eq!(out(deliver(&send, &posted, true)).3, None);
    }

    #[test]
    fn srq_receives_are_told_apart_from_a_qps_own_slots() {
        assert_eq!(srq_slot(srq_wr_id(0)), Some(0));
        assert_eq!(srq_slot(srq_wr_id(u32::MAX)), Some(u64::from(u32::MAX)));
        assert_eq!(srq_slot(u64::from(u32::MAX)), None, "a QP's slot");
        assert_eq!(srq_slot(0), None);
    }

    #[test]
    fn async_events_name_the_element_libibverbs_fills() {
        assert_eq!(element_kind(0), ElementKind::Cq);
        for qp in [1, 2, 3, 4, 5, 6, 7, 16] {
            assert_eq!(element_kind(qp), ElementKind::Qp, "{qp}");
        }
        assert_eq!(element_kind(14), ElementKind::Srq);
        assert_eq!(element_kind(15), ElementKind::Srq);
        assert_eq!(element_kind(19), ElementKind::Wq);
        for port in [8, 9, 10, 11, 12, 13, 17, 18, 20, 1000] {
            assert_eq!(element_kind(port), ElementKind::Port, "{port}");
        }
        assert!(is_srq_limit(15) && !is_srq_limit(14));
        let id = cm_core::backend::id_handle(1, 2, 0);
        use cm_core::AsyncEvent;
        assert_eq!(qp_event(1, id), AsyncEvent::QpFatal { id });
        assert_eq!(qp_event(2, id), AsyncEvent::QpRequestErr { id });
        assert_eq!(qp_event(3, id), AsyncEvent::QpAccessErr { id });
        assert_eq!(qp_event(4, id), AsyncEvent::CommEstablished { id });
        assert_eq!(qp_event(16, id), AsyncEvent::QpLastWqeReached { id });
        assert_eq!(qp_event(5, id), AsyncEvent::Other { raw: 5 });
        assert_eq!(qp_event_kind(3), QpEventKind::Failed);
        assert_eq!(qp_event_kind(16), QpEventKind::LastWqe);
        assert_eq!(qp_event_kind(6), QpEventKind::Other);
    }

    #[test]
    fn the_event_numbers_are_libibverbs() {
        use ffi::ibv_event_type::*;
        assert_eq!(IBV_EVENT_CQ_ERR as u32, CQ_ERR);
        assert_eq!(IBV_EVENT_QP_FATAL as u32, QP_FATAL);
        assert_eq!(IBV_EVENT_QP_REQ_ERR as u32, QP_REQ_ERR);
        assert_eq!(IBV_EVENT_QP_ACCESS_ERR as u32, QP_ACCESS_ERR);
        assert_eq!(IBV_EVENT_COMM_EST as u32, COMM_EST);
        assert_eq!(IBV_EVENT_PATH_MIG_ERR as u32, PATH_MIG_ERR);
        assert_eq!(IBV_EVENT_SRQ_ERR as u32, SRQ_ERR);
        assert_eq!(IBV_EVENT_SRQ_LIMIT_REACHED as u32, SRQ_LIMIT_REACHED);
        assert_eq!(IBV_EVENT_QP_LAST_WQE_REACHED as u32, QP_LAST_WQE_REACHED);
        assert_eq!(IBV_EVENT_WQ_FATAL as u32, WQ_FATAL);
        // cm-core numbers its events itself: they must be libibverbs' too.
        use cm_core::AsyncEvent;
        let id = cm_core::backend::id_handle(1, 2, 0);
        let srq = cm_core::backend::srq_handle(1, 3, 0);
        for (ev, raw) in [
            (AsyncEvent::QpFatal { id }, IBV_EVENT_QP_FATAL),
            (AsyncEvent::QpRequestErr { id }, IBV_EVENT_QP_REQ_ERR),
            (AsyncEvent::QpAccessErr { id }, IBV_EVENT_QP_ACCESS_ERR),
            (AsyncEvent::CommEstablished { id }, IBV_EVENT_COMM_EST),
            (AsyncEvent::SrqLimitReached { srq }, IBV_EVENT_SRQ_LIMIT_REACHED),
            (AsyncEvent::QpLastWqeReached { id }, IBV_EVENT_QP_LAST_WQE_REACHED),
        ] {
            assert_eq!(ev.raw(), raw as u32, "{}", ev.name());
        }
    }
}
