//! The simulated QP's data path: posted work requests, the completion queue, and the flush.
//!
//! The QP's *state* lives in the id's [`IdMachine`](cm_core::IdMachine); this holds what is
//! posted. A work request occupies a slot of its queue from posting until its completion is
//! polled (the hardware backend frees its message buffer at that point too, so both backends
//! report a full queue at the same moment).

use std::collections::VecDeque;

use cm_core::{QpCaps, UdSender, WcOpcode, WcStatus, WorkCompletion};

pub(crate) struct PostedRecv {
    wr_id: u64,
    len: u32,
}

pub(crate) struct PostedSend {
    wr_id: u64,
    data: Vec<u8>,
}

pub(crate) struct Qp {
    pub(crate) qpn: u32,
    pub(crate) caps: QpCaps,
    send_slots: u32,
    recv_slots: u32,
    /// Sends that left the send queue so far: names the head send for a receiver-not-ready
    /// timer, which gives up only if the send it was armed for is still at the head.
    pub(crate) sends_done: u64,
    /// Whether a receiver-not-ready timer is armed for the head send.
    pub(crate) rnr_armed: bool,
    /// Whether a transport retry timer (no acknowledgement) is armed for the head send.
    pub(crate) retry_armed: bool,
    /// Made by the first work request: most QPs of a connection-management workload never
    /// see one, and the QP lives inside its id, where three empty queues would cost 96 bytes.
    queues: Option<Box<Queues>>,
}

#[derive(Default)]
struct Queues {
    recvs: VecDeque<PostedRecv>,
    sends: VecDeque<PostedSend>,
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
            send_slots: 0,
            recv_slots: 0,
            sends_done: 0,
            rnr_armed: false,
            retry_armed: false,
            queues: None,
        }
    }

    fn queues(&mut self) -> &mut Queues {
        self.queues.get_or_insert_with(Box::default)
    }

    pub(crate) fn send_slots(&self) -> u32 {
        self.send_slots
    }

    pub(crate) fn recv_slots(&self) -> u32 {
        self.recv_slots
    }

    pub(crate) fn push_send(&mut self, wr_id: u64, data: &[u8]) {
        self.send_slots += 1;
        self.queues().sends.push_back(PostedSend {
            wr_id,
            data: data.to_vec(),
        });
    }

    pub(crate) fn push_recv(&mut self, wr_id: u64, len: u32) {
        self.recv_slots += 1;
        self.queues().recvs.push_back(PostedRecv { wr_id, len });
    }

    /// A work request posted while the QP is in ERR: it completes at once, flushed.
    pub(crate) fn push_flushed(&mut self, wr_id: u64, opcode: WcOpcode) {
        match opcode {
            WcOpcode::Send => self.send_slots += 1,
            WcOpcode::Recv => self.recv_slots += 1,
        }
        self.queues().cq.push_back(flushed(wr_id, opcode));
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
        let q = self.queues.as_mut()?;
        let recv = q.recvs.pop_front()?;
        let len = send.data.len();
        if len > recv.len as usize {
            q.cq.push_back(WorkCompletion {
                wr_id: recv.wr_id,
                status: WcStatus::LocLenErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                data: Vec::new(),
                sender: None,
            });
            return Some(Landing::TooLong);
        }
        q.cq.push_back(WorkCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: len as u32,
            data: send.data.clone(),
            sender: None,
        });
        Some(Landing::Delivered)
    }

    /// The sender's completion for `send`.
    pub(crate) fn complete_send(&mut self, send: PostedSend, status: WcStatus) {
        // `byte_len` counts received bytes only, as the hardware backend reports it: verbs leaves
        // it undefined for a send (rxe gives the length, mlx5 leaves the field alone).
        self.queues().cq.push_back(WorkCompletion {
            wr_id: send.wr_id,
            status,
            opcode: WcOpcode::Send,
            byte_len: 0,
            data: Vec::new(),
            sender: None,
        });
    }

    /// A datagram send: it completes as it leaves, whatever becomes of it.
    pub(crate) fn complete_datagram_send(&mut self, wr_id: u64, len: usize) {
        self.send_slots += 1;
        self.queues().cq.push_back(WorkCompletion {
            wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Send,
            byte_len: len as u32,
            data: Vec::new(),
            sender: None,
        });
    }

    /// A datagram arrived: it takes the next receive, if one is posted (without one it is
    /// dropped). One longer than that receive's buffer fails it with a local length error, as
    /// rxe does (the caller moves the QP to ERR).
    pub(crate) fn land_datagram(&mut self, data: Vec<u8>, from: UdSender) -> Option<Landing> {
        let q = self.queues.as_mut()?;
        let recv = q.recvs.pop_front()?;
        if data.len() > recv.len as usize {
            q.cq.push_back(WorkCompletion {
                wr_id: recv.wr_id,
                status: WcStatus::LocLenErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                data: Vec::new(),
                sender: None,
            });
            return Some(Landing::TooLong);
        }
        q.cq.push_back(WorkCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: data.len() as u32,
            data,
            sender: Some(from),
        });
        Some(Landing::Delivered)
    }

    /// The QP went to ERR: every posted receive and send completes with `WR_FLUSH_ERR`, each
    /// exactly once, in posting order within its queue; receives first, as rxe flushes them.
    pub(crate) fn flush(&mut self) {
        let Some(q) = self.queues.as_mut() else { return };
        let recvs = q.recvs.drain(..).map(|r| flushed(r.wr_id, WcOpcode::Recv));
        let sends = q.sends.drain(..).map(|s| flushed(s.wr_id, WcOpcode::Send));
        q.cq.extend(recvs.chain(sends));
    }

    pub(crate) fn cq_is_empty(&self) -> bool {
        self.queues.as_ref().is_none_or(|q| q.cq.is_empty())
    }

    /// Moves up to `max` completions to `out`, freeing their queue slots.
    pub(crate) fn poll(&mut self, out: &mut Vec<WorkCompletion>, max: usize) -> usize {
        let Some(q) = self.queues.as_mut() else { return 0 };
        let n = max.min(q.cq.len());
        for wc in q.cq.drain(..n) {
            match wc.opcode {
                WcOpcode::Send => self.send_slots -= 1,
                WcOpcode::Recv => self.recv_slots -= 1,
            }
            out.push(wc);
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
        assert_eq!((qp.send_slots(), qp.recv_slots()), (0, 0));
    }

    #[test]
    fn too_long_message_is_a_local_length_error() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(7, 2);
        let send = PostedSend {
            wr_id: 9,
            data: b"abc".to_vec(),
        };
        assert!(matches!(qp.land(&send), Some(Landing::TooLong)));
        let mut out = Vec::new();
        qp.poll(&mut out, 1);
        assert_eq!(out[0].status, WcStatus::LocLenErr);
    }

    fn send(wr_id: u64, data: &[u8]) -> PostedSend {
        PostedSend {
            wr_id,
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
        assert_eq!((qp.send_slots(), qp.recv_slots()), (0, 0));
        assert!(!qp.has_pending_send() && !qp.has_recv() && qp.cq_is_empty());
        qp.push_send(1, b"a");
        qp.push_send(2, b"b");
        qp.push_recv(3, 8);
        assert_eq!((qp.send_slots(), qp.recv_slots()), (2, 1));
        assert!(qp.has_pending_send() && qp.has_recv());
        let first = qp.pop_send().expect("posted");
        assert_eq!(
            (first.wr_id, qp.send_slots()),
            (1, 2),
            "taken off the queue, slot still held"
        );
        qp.complete_send(first, WcStatus::Success);
        assert!(!qp.cq_is_empty());
        let wcs = polled(&mut qp, 16);
        assert_eq!(wcs.len(), 1);
        assert_eq!((qp.send_slots(), qp.recv_slots()), (1, 1));
        qp.flush();
        assert!(!qp.has_pending_send() && !qp.has_recv());
        assert_eq!(polled(&mut qp, 16).len(), 2);
        assert_eq!((qp.send_slots(), qp.recv_slots()), (0, 0));
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
        assert_eq!((qp.send_slots(), qp.recv_slots()), (1, 5));
        let ids = |wcs: Vec<WorkCompletion>| wcs.into_iter().map(|wc| wc.wr_id).collect::<Vec<_>>();
        assert_eq!(ids(polled(&mut qp, 2)), [0, 1]);
        assert_eq!((qp.send_slots(), qp.recv_slots()), (1, 3));
        assert_eq!(ids(polled(&mut qp, 0)), [0u64; 0]);
        assert_eq!(ids(polled(&mut qp, 10)), [2, 3, 4, 5]);
        assert_eq!((qp.send_slots(), qp.recv_slots()), (0, 0));
        assert_eq!(ids(polled(&mut qp, 10)), [0u64; 0]);
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
        assert_eq!(s.wr_id, 1);
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
        assert_eq!(qp.recv_slots(), 0);
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
