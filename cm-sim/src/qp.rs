//! The simulated QP's data path: posted work requests, the completion queue, and the flush.
//!
//! The QP's *state* lives in the id's [`IdMachine`](cm_core::IdMachine); this holds what is
//! posted. Which slot a work request holds, from posting until its completion is polled, and
//! the order in which requests posted on a QP in ERR complete, are cm-core's [`WrPool`], the
//! same as on hardware: both backends report a full queue at the same moment. Here the
//! simulator plays the device: its queues and completions carry the slot as work request id,
//! and [`Qp::poll`] turns it back into the caller's.
//!
//! The send queue holds every work request in posting order: `post_send`'s bytes and
//! `post_send_wr`'s requests over regions alike. One-sided requests (RDMA WRITE without
//! immediate, READ, atomics) leave it for the QP's [`Rdma`] state when they start, and
//! complete from there in posting order as their answers come back; the fabric
//! (`fabric/onesided.rs`) moves them over the wire, by the rules of [`crate::rdma`].

use std::collections::VecDeque;

use cm_core::backend::WrPool;
use cm_core::{QpCaps, SendOp, SendWr, Sge, UdSender, WcOpcode, WcStatus, WorkCompletion};

use crate::rdma::{self, Next, Pipeline, Reply};
use crate::slab::SlotRef;
use crate::time::SimTime;

/// Marks a completion's work request id as a slot of the QP's shared receive queue, whose
/// pool frees it when it is polled (the QP's own slots are far below).
pub(crate) const SRQ_SLOT: u64 = 1 << 63;

/// A receive posted on a QP's receive queue or on a shared receive queue.
pub(crate) struct PostedRecv {
    pub(crate) slot: u32,
    pub(crate) len: u32,
}

/// A receive taken for a message: the work request id its completion carries (the slot,
/// [`SRQ_SLOT`] set for a shared receive queue's) and its buffer's length.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct TakenRecv {
    pub(crate) wr_id: u64,
    pub(crate) len: u32,
}

pub(crate) struct PostedSend {
    slot: u32,
    data: Vec<u8>,
    /// A work request over regions (`post_send_wr`); `None` for `post_send`'s bytes.
    pub(crate) wr: Option<Box<PostedWr>>,
}

impl PostedSend {
    /// The bytes `post_send` queued, moved out to land (the send keeps its slot).
    pub(crate) fn take_data(&mut self) -> Vec<u8> {
        std::mem::take(&mut self.data)
    }
}

/// A work request over regions as the send queue keeps it: its entries name regions, whose
/// bytes are read when it leaves (and again when it is sent again), as rxe reads them.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct PostedWr {
    pub(crate) op: SendOp,
    pub(crate) sg_list: Vec<Sge>,
    pub(crate) signaled: bool,
    pub(crate) fence: bool,
}

impl PostedWr {
    pub(crate) fn new(wr: &SendWr<'_>) -> Self {
        PostedWr {
            op: wr.op,
            sg_list: wr.sg_list.to_vec(),
            signaled: wr.signaled,
            fence: wr.fence,
        }
    }

    pub(crate) fn opcode(&self) -> WcOpcode {
        self.op.wc_opcode()
    }

    /// Bytes of its list (the post gate checked they fit a `u32`).
    pub(crate) fn len(&self) -> u32 {
        self.sg_list.iter().map(|s| s.len).sum()
    }

    /// A SEND or an RDMA WRITE with immediate: it lands in a receive, as `post_send`'s bytes do.
    pub(crate) fn is_two_sided(&self) -> bool {
        matches!(self.op, SendOp::Send { .. } | SendOp::Write { imm: Some(_), .. })
    }

    fn next(&self) -> Next {
        if self.is_two_sided() {
            Next::TwoSided
        } else {
            Next::OneSided {
                reads: self.op.is_read_or_atomic(),
                fence: self.fence,
            }
        }
    }
}

/// A one-sided request that left the send queue: on the wire, answered, or failed, until it
/// completes (after every one before it).
pub(crate) struct Started {
    pub(crate) slot: u32,
    /// Its number in the QP's sequence of requests.
    pub(crate) psn: u64,
    pub(crate) wr: Box<PostedWr>,
    /// How it ended, once it has: its status and `byte_len`.
    pub(crate) done: Option<(WcStatus, u32)>,
}

/// A QP's one-sided work: the requester's requests in flight and its retries, and the
/// responder's side of its peer's requests. Made with the first work request over regions or
/// the first request that arrives, in the QP's [`Queues`].
#[derive(Default)]
pub(crate) struct Rdma {
    /// Requests started, in posting order, until they complete.
    started: VecDeque<Started>,
    next_psn: u64,
    /// READs and atomics among `started`.
    reads: u32,
    /// A started request failed before it left: nothing more starts.
    failed: bool,
    /// Transport retries left before the oldest unanswered request gives up.
    pub(crate) retries_left: u8,
    /// When the oldest unanswered request times out; `None` while none is unanswered.
    pub(crate) retry_at: Option<SimTime>,
    /// A retry timer of this QP is in the fabric's queue (one at a time: a later `retry_at`
    /// moves it on when it fires instead of queueing another).
    pub(crate) timer_queued: bool,
    /// When the last request sent arrives: a QP's requests arrive in order.
    pub(crate) last_request_arrival: SimTime,
    /// Responder: the number of the next request expected from the peer.
    pub(crate) expected_psn: u64,
    /// Responder: answers to the peer's READs and atomics, newest last, kept for duplicates.
    replies: VecDeque<(u64, Reply)>,
    /// Responder: when the last answer sent arrives.
    pub(crate) last_reply_arrival: SimTime,
}

/// Answers a responder keeps for duplicates: a requester has at most its initiator depth of
/// READs and atomics unanswered (128 on rxe, rounded up to 256 for any depth a `u8` names).
const KEPT_REPLIES: usize = 256;

impl Rdma {
    /// The answer to request `psn` saved for its duplicates, if it was a READ or atomic; a
    /// WRITE's duplicate is acked again.
    pub(crate) fn saved_reply(&self, psn: u64) -> Option<&Reply> {
        self.replies.iter().rev().find(|(p, _)| *p == psn).map(|(_, r)| r)
    }

    pub(crate) fn save_reply(&mut self, psn: u64, reply: Reply) {
        if self.replies.len() == KEPT_REPLIES {
            self.replies.pop_front();
        }
        self.replies.push_back((psn, reply));
    }

    /// The started request numbered `psn`, if it has not completed.
    pub(crate) fn started(&self, psn: u64) -> Option<&Started> {
        let first = self.started.front()?.psn;
        self.started.get(usize::try_from(psn.checked_sub(first)?).ok()?)
    }

    fn started_mut(&mut self, psn: u64) -> Option<&mut Started> {
        let first = self.started.front()?.psn;
        self.started
            .get_mut(usize::try_from(psn.checked_sub(first)?).ok()?)
    }

    /// The numbers of the started requests not answered yet, oldest first: what a timeout
    /// sends again.
    pub(crate) fn unanswered(&self) -> Vec<u64> {
        self.started
            .iter()
            .filter(|s| s.done.is_none())
            .map(|s| s.psn)
            .collect()
    }

    pub(crate) fn has_unanswered(&self) -> bool {
        self.started.iter().any(|s| s.done.is_none())
    }
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
    /// The connection's initiator depth (`max_rd_atomic`: READs and atomics it may have in
    /// flight) and responder resources (`max_dest_rd_atomic`: those of its peer it answers), as
    /// the QP was moved to RTR and RTS with them. In the padding after the flags: no larger QP.
    pub(crate) initiator_depth: u8,
    pub(crate) responder_resources: u8,
    /// The minimum RNR timer (`IBV_QP_MIN_RNR_TIMER`, the IBA's 5-bit encoding) this QP
    /// answers a send that finds no receive with: how long the sender waits before each
    /// retry. 0, the IB CM's, is [`SimConfig::rnr_timer`](crate::SimConfig::rnr_timer).
    pub(crate) min_rnr_timer: u8,
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
    /// Unsignalled successes in `cq`: [`Qp::poll`] frees their slots and hands nothing out.
    hidden: u32,
    /// The shared receive queue the QP takes its receives from (on its host).
    srq: Option<SlotRef>,
    /// One-sided work, made with the first of it.
    rdma: Option<Box<Rdma>>,
}

/// What happened when a send met a receive.
pub(crate) enum Landing {
    /// Delivered: completions on both sides.
    Delivered,
    /// The message was longer than the receive buffer: both QPs go to ERR.
    TooLong,
}

/// What the send queue's head may do now, for a QP that has had work over regions.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum NextStep {
    /// Wait: for one-sided requests in flight, a fence, the initiator depth, or a failure.
    Wait,
    /// Start the one-sided request at the head.
    OneSided,
    /// Deliver the two-sided send at the head, as sends always have been.
    TwoSided,
}

impl Qp {
    pub(crate) fn new(qpn: u32, caps: QpCaps) -> Self {
        Qp {
            qpn,
            caps,
            sends_done: 0,
            rnr_armed: false,
            retry_armed: false,
            initiator_depth: 0,
            responder_resources: 0,
            min_rnr_timer: 0,
            queues: None,
        }
    }

    /// A QP that takes its receives from the shared receive queue `srq`.
    pub(crate) fn on_srq(qpn: u32, caps: QpCaps, srq: SlotRef) -> Self {
        let mut qp = Qp::new(qpn, caps);
        qp.queues().srq = Some(srq);
        qp
    }

    fn queues(&mut self) -> &mut Queues {
        let caps = self.caps;
        self.queues.get_or_insert_with(|| {
            Box::new(Queues {
                pool: WrPool::new(caps.max_send_wr, caps.max_recv_wr),
                recvs: VecDeque::new(),
                sends: VecDeque::new(),
                cq: VecDeque::new(),
                hidden: 0,
                srq: None,
                rdma: None,
            })
        })
    }

    /// The shared receive queue the QP takes its receives from, if any.
    pub(crate) fn srq(&self) -> Option<SlotRef> {
        self.queues.as_ref().and_then(|q| q.srq)
    }

    /// The QP's one-sided work, made if it is not yet.
    pub(crate) fn rdma(&mut self) -> &mut Rdma {
        self.queues().rdma.get_or_insert_with(Box::default)
    }

    /// The QP's one-sided work, if it has had any.
    pub(crate) fn rdma_ref(&self) -> Option<&Rdma> {
        self.queues.as_ref()?.rdma.as_deref()
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
            wr: None,
        });
    }

    /// Queues a work request over regions; the post gate checked there is a free slot.
    pub(crate) fn push_wr(&mut self, wr_id: u64, wr: PostedWr) {
        self.rdma();
        let q = self.queues();
        let slot = q
            .pool
            .post_with(wr.opcode(), wr_id, wr.len(), wr.signaled)
            .expect("gate checked the slot");
        q.sends.push_back(PostedSend {
            slot,
            data: Vec::new(),
            wr: Some(Box::new(wr)),
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

    /// Whether the QP's own receive queue has a receive posted.
    pub(crate) fn has_recv(&self) -> bool {
        self.queues.as_ref().is_some_and(|q| !q.recvs.is_empty())
    }

    /// The work request over regions at the head of the send queue, if that is one.
    pub(crate) fn head_wr(&self) -> Option<&PostedWr> {
        self.queues.as_ref()?.sends.front()?.wr.as_deref()
    }

    /// What the head of the send queue may do now; `None` for a QP that never had one-sided
    /// work, whose sends all take the two-sided path (the fast path of connection workloads).
    pub(crate) fn next_step(&self) -> Option<NextStep> {
        let q = self.queues.as_ref()?;
        let rdma = q.rdma.as_deref()?;
        let head = q.sends.front()?;
        let next = head.wr.as_deref().map_or(Next::TwoSided, PostedWr::next);
        let pipeline = Pipeline {
            started: rdma.started.len(),
            reads: rdma.reads,
            depth: self.initiator_depth,
            failed: rdma.failed,
        };
        Some(match next {
            _ if !rdma::may_start(next, &pipeline) => NextStep::Wait,
            Next::TwoSided => NextStep::TwoSided,
            Next::OneSided { .. } => NextStep::OneSided,
        })
    }

    /// Moves the one-sided request at the head of the send queue to the started ones; its
    /// number. The caller checked [`next_step`](Self::next_step).
    pub(crate) fn start_head(&mut self) -> u64 {
        let send = self.pop_send().expect("a request at the head");
        let wr = send.wr.expect("a request over regions");
        let rdma = self.rdma();
        let psn = rdma.next_psn;
        rdma.next_psn += 1;
        rdma.reads += u32::from(wr.op.is_read_or_atomic());
        rdma.started.push_back(Started {
            slot: send.slot,
            psn,
            wr,
            done: None,
        });
        psn
    }

    /// Request `psn` failed before it left (a local error): it completes with `status` after
    /// those before it, and nothing after it starts.
    pub(crate) fn fail_started(&mut self, psn: u64, status: WcStatus) {
        let rdma = self.rdma();
        rdma.failed = true;
        if let Some(s) = rdma.started_mut(psn) {
            s.done.get_or_insert((status, 0));
        }
    }

    /// Request `psn` was answered and ended with `done` (status, `byte_len`). An answer acks
    /// every WRITE before it too, as an RC acknowledgement covers all earlier sequence numbers
    /// (READs and atomics before it still need their own answer, and are sent again for it).
    /// False when `psn` is not a started request waiting for its answer (flushed, answered
    /// already): the answer is ignored.
    pub(crate) fn answer(&mut self, psn: u64, done: (WcStatus, u32)) -> bool {
        let Some(rdma) = self.queues.as_mut().and_then(|q| q.rdma.as_mut()) else {
            return false;
        };
        if rdma.started(psn).is_none_or(|s| s.done.is_some()) {
            return false;
        }
        for s in rdma.started.iter_mut().take_while(|s| s.psn < psn) {
            if s.done.is_none() && !s.wr.op.is_read_or_atomic() {
                s.done = Some((WcStatus::Success, 0));
            }
        }
        rdma.started_mut(psn).expect("checked").done = Some(done);
        true
    }

    /// The oldest started request, when it has ended: it completes now (every one before it
    /// has). The caller queues its completion with [`complete_started`](Self::complete_started).
    pub(crate) fn pop_done(&mut self) -> Option<Started> {
        let rdma = self.queues.as_mut()?.rdma.as_mut()?;
        rdma.started.front()?.done?;
        let s = rdma.started.pop_front()?;
        rdma.reads -= u32::from(s.wr.op.is_read_or_atomic());
        Some(s)
    }

    /// The completion of started request `s`, which ended.
    pub(crate) fn complete_started(&mut self, s: &Started) {
        let (status, len) = s.done.expect("ended");
        self.complete_wr(s.slot, s.wr.opcode(), len, status, s.wr.signaled);
    }

    /// A send queue completion of the request in `slot`; `len` is what a success reports
    /// ([`rdma::completion`]). An unsignalled success is queued hidden: its slot is freed when
    /// the queue is polled, and it is not handed out.
    fn complete_wr(&mut self, slot: u32, opcode: WcOpcode, len: u32, status: WcStatus, signaled: bool) {
        let (byte_len, visible) = rdma::completion(opcode, len, status, signaled);
        let q = self.queues();
        q.hidden += u32::from(!visible);
        q.cq.push_back(WorkCompletion {
            wr_id: u64::from(slot),
            status,
            opcode,
            byte_len,
            data: Vec::new(),
            sender: None,
            imm_data: None,
        });
    }

    pub(crate) fn pop_send(&mut self) -> Option<PostedSend> {
        let send = self.queues.as_mut()?.sends.pop_front()?;
        self.sends_done += 1;
        self.rnr_armed = false;
        self.retry_armed = false;
        Some(send)
    }

    /// Takes the next receive posted on the QP's own receive queue.
    pub(crate) fn take_recv(&mut self) -> Option<TakenRecv> {
        let recv = self.queues.as_mut()?.recvs.pop_front()?;
        Some(TakenRecv {
            wr_id: u64::from(recv.slot),
            len: recv.len,
        })
    }

    /// Lands `send` in this QP's next receive; returns what happened, with the receive's
    /// completion queued here. The caller queues the sender's completion.
    #[cfg(test)]
    pub(crate) fn land(&mut self, send: &PostedSend) -> Option<Landing> {
        let recv = self.take_recv()?;
        Some(self.land_in(recv, send.data.clone(), None, None))
    }

    /// `data` lands in the receive `recv`, taken for it, with the immediate `imm` if it
    /// carries one. One longer than the receive's buffer fails it with a local length error
    /// (the caller moves the QP to ERR).
    pub(crate) fn land_in(
        &mut self,
        recv: TakenRecv,
        data: Vec<u8>,
        sender: Option<UdSender>,
        imm: Option<u32>,
    ) -> Landing {
        let q = self.queues();
        if data.len() > recv.len as usize {
            q.cq.push_back(WorkCompletion {
                wr_id: recv.wr_id,
                status: WcStatus::LocLenErr,
                opcode: WcOpcode::Recv,
                byte_len: 0,
                data: Vec::new(),
                sender: None,
                imm_data: None,
            });
            return Landing::TooLong;
        }
        q.cq.push_back(WorkCompletion {
            wr_id: recv.wr_id,
            status: WcStatus::Success,
            opcode: WcOpcode::Recv,
            byte_len: data.len() as u32,
            data,
            sender,
            imm_data: imm,
        });
        Landing::Delivered
    }

    /// The receive `recv`, taken by an RDMA WRITE with immediate: `RECV_RDMA_WITH_IMM` with
    /// the write's length and immediate when it succeeded, the receive's own opcode and
    /// nothing else when it failed (rxe clears a failed completion).
    pub(crate) fn complete_write_imm(&mut self, recv: TakenRecv, status: WcStatus, len: u32, imm: u32) {
        let success = status == WcStatus::Success;
        self.queues().cq.push_back(WorkCompletion {
            wr_id: recv.wr_id,
            status,
            opcode: if success {
                WcOpcode::RecvRdmaWithImm
            } else {
                WcOpcode::Recv
            },
            byte_len: if success { len } else { 0 },
            data: Vec::new(),
            sender: None,
            imm_data: success.then_some(imm),
        });
    }

    /// The sender's completion for `send`.
    pub(crate) fn complete_send(&mut self, send: PostedSend, status: WcStatus) {
        match send.wr {
            Some(wr) => self.complete_wr(send.slot, wr.opcode(), wr.len(), status, wr.signaled),
            None => {
                // `byte_len` counts received bytes only, as the hardware backend reports it:
                // verbs leaves it undefined for a send (rxe gives the length, mlx5 leaves the
                // field alone).
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
        }
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

    /// A datagram arrived and took the receive `recv`. One longer than that receive's buffer
    /// fails it with a local length error, as rxe does (the caller moves the QP to ERR).
    pub(crate) fn land_datagram(
        &mut self,
        recv: TakenRecv,
        data: Vec<u8>,
        from: UdSender,
        imm: Option<u32>,
    ) -> Landing {
        self.land_in(recv, data, Some(from), imm)
    }

    /// The QP went to ERR: every posted receive and send completes with `WR_FLUSH_ERR`, each
    /// exactly once, in posting order within its queue; receives first, as rxe flushes them.
    /// One-sided requests started and not completed come before the sends still queued (they
    /// were posted first), whatever answers they had; answers that arrive later are ignored.
    /// Receives of a shared receive queue are not the QP's to flush.
    pub(crate) fn flush(&mut self) {
        let Some(q) = self.queues.as_mut() else { return };
        let recvs = q
            .recvs
            .drain(..)
            .map(|r| flushed(u64::from(r.slot), WcOpcode::Recv));
        q.cq.extend(recvs);
        if let Some(rdma) = q.rdma.as_mut() {
            let started = rdma
                .started
                .drain(..)
                .map(|s| flushed(u64::from(s.slot), s.wr.opcode()));
            q.cq.extend(started);
            rdma.reads = 0;
            rdma.retry_at = None;
        }
        let sends = q.sends.drain(..).map(|s| {
            let opcode = s.wr.as_ref().map_or(WcOpcode::Send, |w| w.opcode());
            flushed(u64::from(s.slot), opcode)
        });
        q.cq.extend(sends);
    }

    /// Whether nothing is there to hand out (unsignalled successes waiting to be freed are
    /// not handed out).
    pub(crate) fn cq_is_empty(&self) -> bool {
        self.queues
            .as_ref()
            .is_none_or(|q| q.cq.len() == q.hidden as usize && !q.pool.has_flushed())
    }

    /// The shared receive queue's slots of completions not polled yet: what destroying the QP
    /// gives back to the SRQ.
    pub(crate) fn srq_slots_unpolled(&self) -> Vec<u64> {
        self.queues.as_ref().map_or_else(Vec::new, |q| {
            q.cq.iter()
                .filter(|wc| wc.wr_id & SRQ_SLOT != 0)
                .map(|wc| wc.wr_id & !SRQ_SLOT)
                .collect()
        })
    }

    /// Moves up to `max` completions to `out`, freeing their slots: the device's first, then
    /// the requests flushed on posting that their queues let out. Unsignalled successes are
    /// freed on the way and not handed out (nor counted against `max`). `srq`: the pool of the
    /// QP's shared receive queue, which frees the slots of the receives taken from it.
    pub(crate) fn poll(
        &mut self,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        mut srq: Option<&mut WrPool>,
    ) -> usize {
        let Some(q) = self.queues.as_mut() else { return 0 };
        let mut n = 0;
        while n < max {
            let Some(mut wc) = q.cq.pop_front() else { break };
            let (_, posted) = if wc.wr_id & SRQ_SLOT == 0 {
                q.pool.complete(wc.wr_id)
            } else {
                srq.as_deref_mut().and_then(|p| p.complete(wc.wr_id & !SRQ_SLOT))
            }
            .expect("every completion is of a posted slot");
            if !posted.signaled && wc.status == WcStatus::Success {
                q.hidden -= 1;
                continue;
            }
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
        assert_eq!(qp.poll(&mut out, 10, None), 3);
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
    fn a_datagram_send_completes_as_it_leaves_and_holds_its_slot_until_polled() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.complete_datagram_send(4, 10, WcStatus::Success);
        qp.complete_datagram_send(5, 3, WcStatus::LocQpOpErr);
        assert_eq!(qp.outstanding(WcOpcode::Send), 2);
        let mut out = Vec::new();
        assert_eq!(qp.poll(&mut out, 10, None), 2);
        let got: Vec<_> = out
            .iter()
            .map(|wc| (wc.wr_id, wc.opcode, wc.status, wc.byte_len))
            .collect();
        assert_eq!(
            got,
            [
                (4, WcOpcode::Send, WcStatus::Success, 0),
                (5, WcOpcode::Send, WcStatus::LocQpOpErr, 0)
            ]
        );
        assert_eq!(qp.outstanding(WcOpcode::Send), 0);
    }

    #[test]
    fn too_long_message_is_a_local_length_error() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(7, 2);
        let send = PostedSend {
            slot: 9,
            data: b"abc".to_vec(),
            wr: None,
        };
        assert!(matches!(qp.land(&send), Some(Landing::TooLong)));
        let mut out = Vec::new();
        qp.poll(&mut out, 1, None);
        assert_eq!(out[0].status, WcStatus::LocLenErr);
    }

    /// A send of the peer's, in its slot `slot`.
    fn send(slot: u32, data: &[u8]) -> PostedSend {
        PostedSend {
            slot,
            data: data.to_vec(),
            wr: None,
        }
    }

    fn polled(qp: &mut Qp, max: usize) -> Vec<WorkCompletion> {
        let mut out = Vec::new();
        let n = qp.poll(&mut out, max, None);
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

    fn wr(op: SendOp, signaled: bool) -> PostedWr {
        PostedWr {
            op,
            sg_list: Vec::new(),
            signaled,
            fence: false,
        }
    }

    const REMOTE: cm_core::RemoteAddr = cm_core::RemoteAddr { addr: 0, rkey: 1 };
    const WRITE: SendOp = SendOp::Write {
        remote: REMOTE,
        imm: None,
    };
    const READ: SendOp = SendOp::Read { remote: REMOTE };

    /// A QP with an initiator depth of 16 and `ops` posted and started, their numbers.
    fn started(ops: &[SendOp]) -> (Qp, Vec<u64>) {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.initiator_depth = 16;
        let psns = ops
            .iter()
            .map(|&op| {
                qp.push_wr(u64::from(op.wc_opcode().raw()), wr(op, true));
                assert_eq!(qp.next_step(), Some(NextStep::OneSided));
                qp.start_head()
            })
            .collect();
        (qp, psns)
    }

    fn drain(qp: &mut Qp) -> Vec<(WcOpcode, WcStatus)> {
        let mut out = Vec::new();
        while let Some(s) = qp.pop_done() {
            qp.complete_started(&s);
            out.push((s.wr.opcode(), s.done.unwrap().0));
        }
        out
    }

    #[test]
    fn a_qp_that_never_had_work_over_regions_takes_the_two_sided_path() {
        let mut qp = Qp::new(1, QpCaps::new());
        assert_eq!(qp.next_step(), None);
        qp.push_send(1, b"x");
        assert_eq!(qp.next_step(), None, "post_send alone makes no one-sided state");
        assert!(qp.rdma_ref().is_none() && qp.head_wr().is_none());
    }

    #[test]
    fn started_requests_complete_in_posting_order_whenever_they_are_answered() {
        let (mut qp, psns) = started(&[WRITE, READ, WRITE]);
        assert_eq!(psns, [0, 1, 2]);
        assert!(qp.answer(2, (WcStatus::Success, 0)));
        // The last WRITE's answer acks the first (an acknowledgement covers everything before
        // it) but not the READ, which needs its bytes.
        assert_eq!(drain(&mut qp), [(WcOpcode::RdmaWrite, WcStatus::Success)]);
        assert_eq!(qp.rdma_ref().unwrap().unanswered(), [1]);
        assert!(!qp.answer(2, (WcStatus::Success, 0)), "answered already");
        assert!(!qp.answer(7, (WcStatus::Success, 0)), "never started");
        assert!(qp.answer(1, (WcStatus::Success, 8)));
        assert_eq!(
            drain(&mut qp),
            [
                (WcOpcode::RdmaRead, WcStatus::Success),
                (WcOpcode::RdmaWrite, WcStatus::Success)
            ]
        );
        let wcs = polled(&mut qp, 8);
        let got: Vec<_> = wcs.iter().map(|w| (w.opcode, w.byte_len)).collect();
        assert_eq!(
            got,
            [
                (WcOpcode::RdmaWrite, 0),
                (WcOpcode::RdmaRead, 8),
                (WcOpcode::RdmaWrite, 0)
            ]
        );
        assert!(!qp.rdma_ref().unwrap().has_unanswered());
    }

    #[test]
    fn a_failure_before_leaving_stops_the_queue_and_completes_in_its_turn() {
        let (mut qp, _) = started(&[READ, WRITE]);
        qp.push_wr(9, wr(WRITE, true));
        qp.fail_started(1, WcStatus::LocQpOpErr);
        assert_eq!(qp.next_step(), Some(NextStep::Wait), "nothing starts after it");
        assert!(drain(&mut qp).is_empty(), "the READ before it is not answered");
        assert!(qp.answer(0, (WcStatus::Success, 4)));
        assert_eq!(
            drain(&mut qp),
            [
                (WcOpcode::RdmaRead, WcStatus::Success),
                (WcOpcode::RdmaWrite, WcStatus::LocQpOpErr)
            ]
        );
    }

    #[test]
    fn a_flush_completes_started_requests_before_queued_ones_each_with_its_own_opcode() {
        let (mut qp, _) = started(&[
            READ,
            SendOp::FetchAdd {
                remote: REMOTE,
                add: 1,
            },
        ]);
        qp.answer(1, (WcStatus::Success, 8));
        qp.push_wr(5, wr(SendOp::Send { imm: None }, false));
        qp.push_recv(6, 8);
        qp.flush();
        let got: Vec<_> = polled(&mut qp, 8)
            .iter()
            .map(|w| (w.wr_id, w.opcode, w.status))
            .collect();
        assert_eq!(
            got,
            [
                (6, WcOpcode::Recv, WcStatus::WrFlushErr),
                (2, WcOpcode::RdmaRead, WcStatus::WrFlushErr),
                (4, WcOpcode::FetchAdd, WcStatus::WrFlushErr),
                (5, WcOpcode::Send, WcStatus::WrFlushErr)
            ],
            "an answered request flushes too, and an unsignalled one comes out"
        );
        assert!(
            !qp.answer(1, (WcStatus::Success, 8)),
            "answers after the flush are ignored"
        );
        assert_eq!(qp.outstanding(WcOpcode::Send), 0);
    }

    #[test]
    fn unsignalled_successes_are_freed_by_a_poll_without_being_handed_out_or_counted() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.initiator_depth = 1;
        for (wr_id, signaled) in [(1, false), (2, false), (3, true), (4, false)] {
            qp.push_wr(wr_id, wr(WRITE, signaled));
            let psn = qp.start_head();
            qp.answer(psn, (WcStatus::Success, 0));
        }
        drain(&mut qp);
        assert_eq!(qp.outstanding(WcOpcode::Send), 4);
        let wcs = polled(&mut qp, 1);
        assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [3]);
        assert_eq!(
            qp.outstanding(WcOpcode::Send),
            1,
            "the last waits for the next poll"
        );
        assert!(qp.cq_is_empty(), "nothing to hand out");
        assert!(polled(&mut qp, 1).is_empty());
        assert_eq!(qp.outstanding(WcOpcode::Send), 0);
        // A failure of an unsignalled request comes out.
        qp.push_wr(5, wr(WRITE, false));
        let psn = qp.start_head();
        qp.answer(psn, (WcStatus::RemAccessErr, 0));
        drain(&mut qp);
        assert!(!qp.cq_is_empty());
        assert_eq!(polled(&mut qp, 4)[0].status, WcStatus::RemAccessErr);
    }

    #[test]
    fn a_two_sided_send_waits_for_one_sided_requests_ahead_of_it() {
        let (mut qp, _) = started(&[WRITE]);
        qp.push_wr(2, wr(SendOp::Send { imm: Some(1) }, true));
        assert_eq!(qp.next_step(), Some(NextStep::Wait));
        qp.answer(0, (WcStatus::Success, 0));
        drain(&mut qp);
        assert_eq!(qp.next_step(), Some(NextStep::TwoSided));
        assert!(qp.head_wr().is_some_and(PostedWr::is_two_sided));
    }

    #[test]
    fn receives_taken_from_an_srq_give_their_slots_back_to_the_srq_when_polled() {
        let mut srq = WrPool::new(0, 4);
        // Slot numbers that differ from the QP's own (its first send's is 0).
        let _earlier = (srq.post(WcOpcode::Recv, 75, 16), srq.post(WcOpcode::Recv, 76, 16));
        let slot = srq.post(WcOpcode::Recv, 77, 16).unwrap();
        assert_ne!(slot, 0);
        let mut qp = Qp::on_srq(
            1,
            QpCaps::new(),
            SlotRef {
                index: 0,
                generation: 0,
            },
        );
        assert!(qp.srq().is_some());
        let recv = TakenRecv {
            wr_id: SRQ_SLOT | u64::from(slot),
            len: 16,
        };
        assert!(matches!(
            qp.land_in(recv, b"hi".to_vec(), None, Some(3)),
            Landing::Delivered
        ));
        // A completion of the QP's own (a send) is not the SRQ's to take back.
        qp.complete_datagram_send(9, 1, WcStatus::Success);
        assert_eq!(qp.srq_slots_unpolled(), [u64::from(slot)]);
        let mut out = Vec::new();
        assert_eq!(qp.poll(&mut out, 4, Some(&mut srq)), 2);
        assert_eq!(
            (out[0].wr_id, out[0].imm_data, out[0].data.as_slice()),
            (77, Some(3), &b"hi"[..])
        );
        assert_eq!(srq.outstanding(WcOpcode::Recv), 2, "the two not taken");
        assert!(qp.srq_slots_unpolled().is_empty());
    }

    #[test]
    fn a_write_with_immediate_completes_its_receive_with_the_length_or_with_nothing() {
        let mut qp = Qp::new(1, QpCaps::new());
        qp.push_recv(1, 0);
        qp.push_recv(2, 0);
        let first = qp.take_recv().unwrap();
        qp.complete_write_imm(first, WcStatus::Success, 100, 9);
        let second = qp.take_recv().unwrap();
        qp.complete_write_imm(second, WcStatus::RemAccessErr, 100, 9);
        let got: Vec<_> = polled(&mut qp, 4)
            .iter()
            .map(|w| (w.wr_id, w.opcode, w.status, w.byte_len, w.imm_data))
            .collect();
        assert_eq!(
            got,
            [
                (1, WcOpcode::RecvRdmaWithImm, WcStatus::Success, 100, Some(9)),
                (2, WcOpcode::Recv, WcStatus::RemAccessErr, 0, None)
            ]
        );
    }

    #[test]
    fn a_responder_keeps_a_bounded_number_of_answers_for_duplicates() {
        let mut rdma = Rdma::default();
        for psn in 0..KEPT_REPLIES as u64 + 2 {
            rdma.save_reply(psn, Reply::Atomic(psn));
        }
        assert_eq!(rdma.saved_reply(0), None, "the oldest went");
        assert_eq!(rdma.saved_reply(2), Some(&Reply::Atomic(2)));
        assert_eq!(
            rdma.saved_reply(KEPT_REPLIES as u64 + 1),
            Some(&Reply::Atomic(KEPT_REPLIES as u64 + 1))
        );
    }
}
