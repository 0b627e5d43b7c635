//! The simulated QP's data path: posted work requests, the completion queue, and the flush.
//!
//! The QP's *state* lives in the id's [`IdMachine`](cm_core::IdMachine); this holds what is
//! posted. Which slot a work request holds, from posting until its completion is polled, and
//! the order in which requests posted on a QP in ERR complete, are cm-core's [`WrPool`], the
//! same as on hardware: both backends report a full queue at the same moment. Here the
//! simulator plays the device: its queues and completions carry the slot as work request id,
//! and [`Qp::poll`] turns it back into the caller's.

use std::collections::VecDeque;

use cm_core::backend::WrPool;
use cm_core::{QpCaps, UdSender, WcOpcode, WcStatus, WorkCompletion};

pub(crate) struct PostedRecv {
    slot: u32,
    len: u32,
}

pub(crate) struct PostedSend {
    slot: u32,
    data: Vec<u8>,
}

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    /// Sends that left the send queue so far: names the head send for a receiver-not-ready
    /// timer, which gives up only if the send it was armed for is still at the head.
    pub(crate) sends_done: u64,
    /// Whether a receiver-not-ready timer is armed for the head send.
    pub(crate) rnr_armed: bool,
    /// Whether a transport retry timer (no acknowledgement) is armed for the head send.
    pub(crate) retry_armed: bool,
    /// Made by the first work request: most QPs of a connection-management workload never
    /// see one, and the QP lives inside its id, where empty queues would cost 96 bytes and more.
    queues: Option<Box<Queues>>,
}

struct Queues {
    pool: WrPool,
    recvs: VecDeque<PostedRecv>,
    sends: VecDeque<PostedSend>,
    /// Completions in the order the "device" made them, work request id = slot.
    cq: VecDeque<WorkCompletion>,
}

/// What happened when a send met a receive.
pub(crate) enum Landing {
    /// Delivered: completions on both sides.
    Delivered,
    /// The message was longer than the receive buffer: both QPs go to ERR.
    TooLong,
}

impl Qp {
    pub(crate) fn new(qpn: u32, caps: QpCaps) -> Self {
        Qp {
            qpn,
            caps,
            sends_done: 0,
            rnr_armed: false,
            retry_armed: false,
            queues: None,
        }
    }

    fn queues(&mut self) -> &mut Queues {
        let caps = self.caps;
        self.queues.get_or_insert_with(|| {
            Box::new(Queues {
                pool: WrPool::new(caps.max_send_wr, caps.max_recv_wr),
                recvs: VecDeque::new(),
                sends: VecDeque::new(),
                cq: VecDeque::new(),
            })
        })
    }

    /// Work requests of `opcode`'s queue posted and not polled yet.
    pub(crate) fn outstanding(&self, opcode: WcOpcode) -> u32 {
        self.queues.as_ref().map_or(0, |q| q.pool.outstanding(opcode))
    }

    /// Queues a send; the post gate checked there is a free slot.
    pub(crate) fn push_send(&mut self, wr_id: u64, data: &[u8]) {
        let q = self.queues();
        let slot = q
            .pool
            .post(WcOpcode::Send, wr_id, data.len() as u32)
            .expect("gate checked the slot");
        q.sends.push_back(PostedSend {
            slot,
            data: data.to_vec(),
        });
    }

    /// Queues a receive; the post gate checked there is a free slot.
    pub(crate) fn push_recv(&mut self, wr_id: u64, len: u32) {
        let q = self.queues();
        let slot = q
            .pool
            .post(WcOpcode::Recv, wr_id, len)
            .expect("gate checked the slot");
        q.recvs.push_back(PostedRecv { slot, len });
    }

    /// A work request posted while the QP is in ERR: it completes flushed, after what its
    /// queue completed before (the post gate checked there is a free slot).
    pub(crate) fn push_flushed(&mut self, wr_id: u64, opcode: WcOpcode) {
        let taken = self.queues().pool.flush(opcode, wr_id);
        debug_assert!(taken, "gate checked the slot");
    }

    pub(crate) fn has_pending_send(&self) -> bool {
        self.queues.as_ref().is_some_and(|q| !q.sends.is_empty())
    }

    pub(crate) fn has_recv(&self) -> bool {
        self.queues.as_ref().is_some_and(|q| !q.recvs.is_empty())
    }

    pub(crate) fn pop_send(&mut self) -> Option<PostedSend> {
        let send = self.queues.as_mut()?.sends.pop_front()?;
        self.sends_done += 1;
        self.rnr_armed = false;
        self.retry_armed = false;
        Some(send)
    }

    /// Lands `send` in this QP's next receive; returns what happened, with the receive's
    /// completion queued here. The caller queues the sender's completion.
    pub(crate) fn land(&mut self, send: &PostedSend) -> Option<Landing> {
        self.land_in_recv(send.data.clone(), None)
    }

    /// `data` takes the next posted receive (none: `None`). One longer than that receive's
    /// buffer fails it with a local length error (the caller moves the QP to ERR).
    fn land_in_recv(&mut self, data: Vec<u8>, sender: Option<UdSender>) -> Option<Landing> {
        let q = self.queues.as_mut()?;
        let recv = q.recvs.pop_front()?;
        let wr_id = u64::from(recv.slot);
        if data.len() > recv.len as usize {
            q.cq.push_back(WorkCompletion {
                wr_id,
                status: WcStatus::LocLenErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                data: Vec::new(),
                sender: None,
                imm_data: None,
            });
            return Some(Landing::TooLong);
        }
        q.cq.push_back(WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: data.len() as u32,
            data,
            sender,
            imm_data: None,
        });
        Some(Landing::Delivered)
    }

    /// The sender's completion for `send`.
    pub(crate) fn complete_send(&mut self, send: PostedSend, status: WcStatus) {
        // `byte_len` counts received bytes only, as the hardware backend reports it: verbs leaves
        // it undefined for a send (rxe gives the length, mlx5 leaves the field alone).
        self.queues().cq.push_back(WorkCompletion {
            wr_id: u64::from(send.slot),
            status,
            opcode: WcOpcode::Send,
            byte_len: 0,
            data: Vec::new(),
            sender: None,
            imm_data: None,
        });
    }

    /// A datagram send: it completes as it leaves, whatever becomes of it, with `status`
    /// (`Success` unless the QP could not send it). Its slot is held until the completion is
    /// polled, as for any send (the caller checked there is one free).
    pub(crate) fn complete_datagram_send(&mut self, wr_id: u64, len: usize, status: WcStatus) {
        let q = self.queues();
        let slot = q
            .pool
            .post(WcOpcode::Send, wr_id, len as u32)
            .expect("caller checked the slot");
        q.cq.push_back(WorkCompletion {
            wr_id: u64::from(slot),
            status,
            opcode: WcOpcode::Send,
            byte_len: 0,
            data: Vec::new(),
            sender: None,
            imm_data: None,
        });
    }

    /// A datagram arrived: it takes the next receive, if one is posted (without one it is
    /// dropped). One longer than that receive's buffer fails it with a local length error, as
    /// rxe does (the caller moves the QP to ERR).
    pub(crate) fn land_datagram(&mut self, data: Vec<u8>, from: UdSender) -> Option<Landing> {
        self.land_in_recv(data, Some(from))
    }

    /// The QP went to ERR: every posted receive and send completes with `WR_FLUSH_ERR`, each
    /// exactly once, in posting order within its queue; receives first, as rxe flushes them.
    pub(crate) fn flush(&mut self) {
        let Some(q) = self.queues.as_mut() else { return };
        let recvs = q
            .recvs
            .drain(..)
            .map(|r| flushed(u64::from(r.slot), WcOpcode::Recv));
        let sends = q
            .sends
            .drain(..)
            .map(|s| flushed(u64::from(s.slot), WcOpcode::Send));
        q.cq.extend(recvs.chain(sends));
    }

    pub(crate) fn cq_is_empty(&self) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|q| q.cq.is_empty() && !q.pool.has_flushed())
    }

    /// Moves up to `max` completions to `out`, freeing their slots: the device's first, then
    /// the requests flushed on posting that their queues let out.
    pub(crate) fn poll(&mut self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let Some(q) = self.queues.as_mut() else { return 0 };
        let mut n = 0;
        while n < max {
            let Some(mut wc) = q.cq.pop_front() else { break };
            let (_, posted) = q
                .pool
                .complete(wc.wr_id)
                .expect("every completion is of a posted slot");
            wc.wr_id = posted.wr_id;
            out.push(wc);
            n += 1;
        }
        while n < max {
            let Some((opcode, wr_id)) = q.pool.next_flushed() else {
                break;
            };
            out.push(flushed(wr_id, opcode));
            n += 1;
        }
        n
    }
}

fn flushed(wr_id: u64, opcode: WcOpcode) -> WorkCompletion {
    WorkCompletion {
        wr_id,
        status: WcStatus::WrFlushErr,
        opcode,
        byte_len: 0,
        data: Vec::new(),
        sender: None,
        imm_data: None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_completes_everything_once_in_posting_order_per_queue() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(1, 64);
        qp.push_send(2, b"x");
        qp.push_recv(3, 64);
        qp.flush();
        qp.flush();
        let mut out = Vec::new();
        assert_eq!(qp.poll(&mut out, 10), 3);
        let got: Vec<_> = out.iter().map(|wc| (wc.wr_id, wc.opcode, wc.status)).collect();
        assert_eq!(
            got,
            [
                (1, WcOpcode::Recv, WcStatus::WrFlushErr),
                (3, WcOpcode::Recv, WcStatus::WrFlushErr),
                (2, WcOpcode::Send, WcStatus::WrFlushErr)
            ]
        );
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (0, 0)
        );
    }

    #[test]
    fn too_long_message_is_a_local_length_error() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(7, 2);
        let send = PostedSend {
            slot: 9,
            data: b"abc".to_vec(),
        };
        assert!(matches!(qp.land(&send), Some(Landing::TooLong)));
        let mut out = Vec::new();
        qp.poll(&mut out, 1);
        assert_eq!(out[0].status, WcStatus::LocLenErr);
    }

    /// A send of the peer's, in its slot `slot`.
    fn send(slot: u32, data: &[u8]) -> PostedSend {
        PostedSend {
            slot,
            data: data.to_vec(),
        }
    }

    fn polled(qp: &mut Qp, max: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let n = qp.poll(&mut out, max);
        assert_eq!(n, out.len(), "poll reports what it moved");
        out
    }

    #[test]
    fn work_requests_hold_their_slot_until_their_completion_is_polled() {
        let mut qp = Qp::new(1, QpCaps::new());
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (0, 0)
        );
        assert!(!qp.has_pending_send() && !qp.has_recv() && qp.cq_is_empty());
        qp.push_send(1, b"a");
        qp.push_send(2, b"b");
        qp.push_recv(3, 8);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (2, 1)
        );
        assert!(qp.has_pending_send() && qp.has_recv());
        let first = qp.pop_send().expect("posted");
        assert_eq!(
            (first.slot, qp.outstanding(WcOpcode::Send)),
            (0, 2),
            "taken off the queue, slot still held"
        );
        qp.complete_send(first, WcStatus::Success);
        assert!(!qp.cq_is_empty());
        let wcs = polled(&mut qp, 16);
        assert_eq!(wcs.len(), 1);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (1, 1)
        );
        qp.flush();
        assert!(!qp.has_pending_send() && !qp.has_recv());
        assert_eq!(polled(&mut qp, 16).len(), 2);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (0, 0)
        );
        assert!(qp.cq_is_empty());
    }

    #[test]
    fn poll_moves_at_most_max_completions_oldest_first() {
        let mut qp = Qp::new(1, QpCaps::new());
        assert_eq!(polled(&mut qp, 4).len(), 0, "nothing ever posted");
        for wr_id in 0..5 {
            qp.push_flushed(wr_id, WcOpcode::Recv);
        }
        qp.push_flushed(5, WcOpcode::Send);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (1, 5)
        );
        let ids = |wcs: Vec<WorkCompletion>| wcs.into_iter().map(|wc| wc.wr_id).collect::<Vec<_>>();
        assert_eq!(ids(polled(&mut qp, 2)), [0, 1]);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (1, 3)
        );
        assert_eq!(ids(polled(&mut qp, 0)), [0u64; 0]);
        assert_eq!(ids(polled(&mut qp, 10)), [2, 3, 4, 5]);
        assert_eq!(
            (qp.outstanding(WcOpcode::Send), qp.outstanding(WcOpcode::Recv)),
            (0, 0)
        );
        assert_eq!(ids(polled(&mut qp, 10)), [0u64; 0]);
    }

    #[test]
    fn poll_moves_at_most_max_of_the_queued_completions_and_frees_only_their_slots() {
        let mut qp = Qp::new(1, QpCaps::new());
        for wr_id in 10..13 {
            qp.push_recv(wr_id, 8);
        }
        qp.flush();
        let ids = |wcs: Vec<WorkCompletion>| wcs.into_iter().map(|wc| wc.wr_id).collect::<Vec<_>>();
        assert_eq!(ids(polled(&mut qp, 0)), [0u64; 0]);
        assert_eq!(qp.outstanding(WcOpcode::Recv), 3);
        assert_eq!(ids(polled(&mut qp, 2)), [10, 11]);
        assert_eq!(qp.outstanding(WcOpcode::Recv), 1);
        assert_eq!(ids(polled(&mut qp, 2)), [12]);
        assert_eq!(qp.outstanding(WcOpcode::Recv), 0);
    }

    #[test]
    fn a_work_request_posted_in_err_completes_flushed_at_once() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_flushed(4, WcOpcode::Send);
        qp.push_flushed(5, WcOpcode::Recv);
        assert!(!qp.has_pending_send() && !qp.has_recv(), "never queued");
        let got: Vec<_> = polled(&mut qp, 4)
            .into_iter()
            .map(|wc| (wc.wr_id, wc.opcode, wc.status, wc.byte_len))
            .collect();
        assert_eq!(
            got,
            [
                (4, WcOpcode::Send, WcStatus::WrFlushErr, 0),
                (5, WcOpcode::Recv, WcStatus::WrFlushErr, 0)
            ]
        );
    }

    #[test]
    fn taking_the_head_send_disarms_its_timers_and_counts_it() {
        let mut qp = Qp::new(1, QpCaps::new());
        assert!(qp.pop_send().is_none(), "no queues yet");
        qp.push_recv(9, 1);
        assert!(qp.pop_send().is_none(), "no send posted");
        qp.push_send(1, b"x");
        qp.rnr_armed = true;
        qp.retry_armed = true;
        let s = qp.pop_send().unwrap();
        assert_eq!(s.slot, 0);
        assert_eq!((qp.sends_done, qp.rnr_armed, qp.retry_armed), (1, false, false));
        assert!(qp.pop_send().is_none());
        assert_eq!(qp.sends_done, 1, "nothing taken, nothing counted");
    }

    #[test]
    fn a_message_as_long_as_the_receive_buffer_is_delivered_with_its_length() {
        let mut qp = Qp::new(1, QpCaps::new());
        assert!(qp.land(&send(1, b"abc")).is_none(), "no queues yet");
        qp.push_send(8, b"zz");
        assert!(qp.land(&send(1, b"abc")).is_none(), "no receive posted");
        qp.push_recv(7, 3);
        qp.push_recv(6, 3);
        assert!(matches!(qp.land(&send(1, b"abc")), Some(Landing::Delivered)));
        assert!(matches!(qp.land(&send(2, b"")), Some(Landing::Delivered)));
        let wcs = polled(&mut qp, 4);
        let got: Vec<_> = wcs
            .iter()
            .map(|wc| (wc.wr_id, wc.opcode, wc.status, wc.byte_len, wc.data.as_slice()))
            .collect();
        assert_eq!(
            got,
            [
                (7, WcOpcode::Recv, WcStatus::Success, 3, &b"abc"[..]),
                (6, WcOpcode::Recv, WcStatus::Success, 0, &b""[..])
            ]
        );
        assert_eq!(qp.outstanding(WcOpcode::Recv), 0);
    }

    #[test]
    fn a_too_long_message_consumes_the_receive_without_data() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(7, 2);
        qp.push_recv(8, 64);
        assert!(matches!(qp.land(&send(9, b"abc")), Some(Landing::TooLong)));
        let wcs = polled(&mut qp, 4);
        assert_eq!(wcs.len(), 1);
        let wc = &wcs[0];
        assert_eq!(
            (wc.wr_id, wc.opcode, wc.status, wc.byte_len, wc.data.len()),
            (7, WcOpcode::Recv, WcStatus::LocLenErr, 0, 0)
        );
        assert!(qp.has_recv(), "the next receive is still posted");
    }

    #[test]
    fn send_completions_count_no_bytes_whatever_their_status() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_send(1, b"four");
        qp.push_send(2, b"five!");
        let ok = qp.pop_send().unwrap();
        qp.complete_send(ok, WcStatus::Success);
        let failed = qp.pop_send().unwrap();
        qp.complete_send(failed, WcStatus::RetryExcErr);
        let got: Vec<_> = polled(&mut qp, 4)
            .into_iter()
            .map(|wc| (wc.wr_id, wc.opcode, wc.status, wc.byte_len, wc.data.len()))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcOpcode::Send, WcStatus::Success, 0, 0),
                (2, WcOpcode::Send, WcStatus::RetryExcErr, 0, 0)
            ]
        );
    }

    #[test]
    fn flushing_a_qp_that_never_saw_a_work_request_completes_nothing() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.flush();
        assert!(qp.cq_is_empty());
        assert_eq!(polled(&mut qp, 4).len(), 0);
    }
}
