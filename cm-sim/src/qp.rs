//! The simulated QP's data path: posted work requests, the completion queue, and the flush.
//!
//! The QP's *state* lives in the id's [`IdMachine`](cm_core::IdMachine); this holds what is
//! posted. A work request occupies a slot of its queue from posting until its completion is
//! polled (the hardware backend frees its message buffer at that point too, so both backends
//! report a full queue at the same moment).

use std::collections::VecDeque;

use cm_core::{QpCaps, WcOpcode, WcStatus, WorkCompletion};

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
            });
            return Some(Landing::TooLong);
        }
        q.cq.push_back(WorkCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: len as u32,
            data: send.data.clone(),
        });
        Some(Landing::Delivered)
    }

    /// The sender's completion for `send`.
    pub(crate) fn complete_send(&mut self, send: PostedSend, status: WcStatus) {
        let byte_len = if status == WcStatus::Success {
            send.data.len() as u32
        } else {
            0
        };
        self.queues().cq.push_back(WorkCompletion {
            wr_id: send.wr_id,
            status,
            opcode: WcOpcode::Send,
            byte_len,
            data: Vec::new(),
        });
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
}
