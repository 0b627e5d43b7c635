//! Bookkeeping of a QP's work requests, as pure code (no I/O): which message slots are free,
//! which user work request each taken slot carries, and the completions the backend synthesizes
//! for work requests posted while the QP is in ERR.
//!
//! Slots `0..send` are for sends, `send..send + recv` for receives; the slot index is the `wr_id`
//! given to verbs, so a hardware completion finds its slot in O(1). A work request occupies a
//! slot of its queue from posting until its completion is polled, as in the simulator, whether
//! it went to the hardware or was flushed by the backend; a full queue is refused at the same
//! moment on both backends.
//!
//! # Flushed work requests
//!
//! The contract is that a work request posted on a QP in ERR completes at once with
//! `WR_FLUSH_ERR`. Not every provider does that (rxe on Linux 6.1 never completes a receive
//! posted on a QP already in ERR), so such a request is not posted to the hardware: it is
//! [`flush`](SlotPool::flush)ed here, and its completion handed out by
//! [`next_flushed`](SlotPool::next_flushed). Verbs completes each queue in posting order, and so
//! does this: a flushed completion is held back while requests of its queue posted earlier to
//! the hardware have not completed (they were all posted before, since a QP never leaves ERR).
//! Flushed completions that are ready come out in posting order across both queues.
//!
//! # Errors the device produced
//!
//! The QP also goes to ERR without any call of ours: the device does it when a request fails
//! (retries exhausted, a receive too short, a protection error), and says so only with an error
//! completion on the CQ. libibverbs' cached QP state does not change, so until that completion is
//! polled the backend would still post to the hardware — where rxe on Linux 6.1 never completes
//! a receive. Before posting, the backend therefore moves whatever the CQ holds into
//! [`Prefetched`] (polling a CQ is a user-space read, no system call) and flushes the request
//! when one of those completions is an error. `poll_cq` hands the prefetched completions out
//! first, in CQ order, so the user sees exactly what an immediate poll would have shown.
//!
//! What remains is the device failing a request between that look and the post: a race with the
//! hardware that no check in user space closes (querying the QP's state has the same window).

use std::collections::VecDeque;

use cm_core::{WcOpcode, WcStatus};

use crate::sys::RawCompletion;

/// What a taken slot carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotUse {
    /// The caller's wr_id.
    pub(crate) wr_id: u64,
    /// Bytes posted (send length or receive buffer length); 0 for a flushed request.
    pub(crate) len: u32,
    /// Flushed by the backend (never posted to the hardware).
    pub(crate) flushed: bool,
}

/// A queue's index in the per-queue arrays.
const fn queue(opcode: WcOpcode) -> usize {
    match opcode {
        WcOpcode::Send => 0,
        WcOpcode::Recv => 1,
    }
}

/// The work requests of one QP.
#[derive(Debug)]
pub(crate) struct SlotPool {
    send: u32,
    used: Vec<Option<SlotUse>>,
    send_free: Vec<u32>,
    recv_free: Vec<u32>,
    /// Per queue: requests posted to the hardware whose completion was not polled yet.
    on_hw: [u32; 2],
    /// Per queue: flushed requests not handed out yet, as (posting sequence, slot), in order.
    flushed: [VecDeque<(u64, u32)>; 2],
    next_seq: u64,
}

impl SlotPool {
    /// `send` send slots and `recv` receive slots, all free.
    pub(crate) fn new(send: u32, recv: u32) -> Self {
        SlotPool {
            send,
            used: vec![None; (send + recv) as usize],
            // Popped from the end: lowest slot first.
            send_free: (0..send).rev().collect(),
            recv_free: (send..send + recv).rev().collect(),
            on_hw: [0; 2],
            flushed: [VecDeque::new(), VecDeque::new()],
            next_seq: 0,
        }
    }

    fn take(&mut self, opcode: WcOpcode, use_: SlotUse) -> Option<u32> {
        let free = match opcode {
            WcOpcode::Send => &mut self.send_free,
            WcOpcode::Recv => &mut self.recv_free,
        };
        let slot = free.pop()?;
        self.used[slot as usize] = Some(use_);
        Some(slot)
    }

    fn opcode_of(&self, slot: u32) -> WcOpcode {
        if slot < self.send {
            WcOpcode::Send
        } else {
            WcOpcode::Recv
        }
    }

    /// Whether `slot` carries a request posted to the hardware.
    fn on_hw(&self, slot: u32) -> bool {
        matches!(self.used.get(slot as usize), Some(Some(u)) if !u.flushed)
    }

    /// Frees `slot`; what it carried, with its queue. None for a slot that is not taken.
    fn free(&mut self, slot: u32) -> Option<(WcOpcode, SlotUse)> {
        let use_ = self.used.get_mut(slot as usize)?.take()?;
        let opcode = self.opcode_of(slot);
        match opcode {
            WcOpcode::Send => self.send_free.push(slot),
            WcOpcode::Recv => self.recv_free.push(slot),
        }
        Some((opcode, use_))
    }

    /// Takes a free slot of `opcode`'s queue for `wr_id` about to be posted to the hardware with
    /// `len` bytes; None when the queue is full.
    pub(crate) fn post(&mut self, opcode: WcOpcode, wr_id: u64, len: u32) -> Option<u32> {
        let slot = self.take(
            opcode,
            SlotUse {
                wr_id,
                len,
                flushed: false,
            },
        )?;
        self.on_hw[queue(opcode)] += 1;
        Some(slot)
    }

    /// Gives back the slot of a request whose posting to the hardware failed (it will never
    /// complete).
    pub(crate) fn unpost(&mut self, slot: u32) {
        if self.on_hw(slot) {
            if let Some((opcode, _)) = self.free(slot) {
                self.on_hw[queue(opcode)] -= 1;
            }
        }
    }

    /// A hardware completion with `wr_id` was polled: frees its slot and returns what it carried
    /// and its queue. None when `wr_id` is not a slot posted to the hardware (ignored rather than
    /// trusted).
    pub(crate) fn complete(&mut self, wr_id: u64) -> Option<(WcOpcode, SlotUse)> {
        let slot = u32::try_from(wr_id).ok()?;
        if !self.on_hw(slot) {
            return None;
        }
        let (opcode, use_) = self.free(slot)?;
        self.on_hw[queue(opcode)] -= 1;
        Some((opcode, use_))
    }

    /// Takes a slot of `opcode`'s queue for `wr_id` posted while the QP is in ERR: it is not
    /// posted to the hardware, and completes flushed (see the [module docs](self)). False when
    /// the queue is full.
    pub(crate) fn flush(&mut self, opcode: WcOpcode, wr_id: u64) -> bool {
        let use_ = SlotUse {
            wr_id,
            len: 0,
            flushed: true,
        };
        let Some(slot) = self.take(opcode, use_) else {
            return false;
        };
        let seq = self.next_seq;
        self.next_seq += 1;
        self.flushed[queue(opcode)].push_back((seq, slot));
        true
    }

    /// The next flushed request whose completion may be handed out now (nothing posted earlier
    /// to the hardware on its queue is still outstanding), with its slot freed; the oldest first
    /// when both queues have one.
    pub(crate) fn next_flushed(&mut self) -> Option<(WcOpcode, u64)> {
        let ready = |q: usize| {
            if self.on_hw[q] == 0 {
                self.flushed[q].front().map(|&(seq, _)| seq)
            } else {
                None
            }
        };
        let q = match (ready(0), ready(1)) {
            (None, None) => return None,
            (Some(s), Some(r)) => usize::from(r < s),
            (Some(_), None) => 0,
            (None, Some(_)) => 1,
        };
        let (_, slot) = self.flushed[q].pop_front()?;
        let (opcode, use_) = self.free(slot)?;
        Some((opcode, use_.wr_id))
    }

    /// Flushed requests not handed out yet.
    #[cfg(test)]
    pub(crate) fn flushed_held(&self) -> usize {
        self.flushed[0].len() + self.flushed[1].len()
    }

    /// Sends posted and not completed (on the hardware or flushed).
    pub(crate) fn sends_outstanding(&self) -> u32 {
        self.send - self.send_free.len() as u32
    }

    /// Receives posted and not completed (on the hardware or flushed).
    pub(crate) fn recvs_outstanding(&self) -> u32 {
        (self.used.len() as u32 - self.send) - self.recv_free.len() as u32
    }
}

/// Completions taken from a QP's CQ before the user polled for them (see the
/// [module docs](self)), in CQ order. At most one per request posted to the hardware, so bounded
/// by the QP's work requests.
#[derive(Debug, Default)]
pub(crate) struct Prefetched {
    completions: VecDeque<RawCompletion>,
    /// Whether any completion stored so far reported an error.
    error: bool,
}

impl Prefetched {
    /// Keeps `polled` (just taken from the CQ) for a later poll; whether the device has reported
    /// an error completion so far, which means it has put the QP in ERR.
    pub(crate) fn keep(&mut self, polled: &[RawCompletion]) -> bool {
        self.error |= polled
            .iter()
            .any(|c| WcStatus::from_raw(c.status) != Some(WcStatus::Success));
        self.completions.extend(polled.iter().copied());
        self.error
    }

    /// Moves at most `max` of the kept completions, oldest first, to `out`; how many.
    pub(crate) fn hand_out(&mut self, max: usize, out: &mut Vec<RawCompletion>) -> usize {
        let n = max.min(self.completions.len());
        out.extend(self.completions.drain(..n));
        n
    }

    /// Completions kept and not handed out yet.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.completions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use WcOpcode::{Recv, Send};

    fn hw(wr_id: u64, len: u32) -> SlotUse {
        SlotUse {
            wr_id,
            len,
            flushed: false,
        }
    }

    #[test]
    fn slots_map_back_to_user_wr_ids() {
        let mut p = SlotPool::new(2, 1);
        let s0 = p.post(Send, 100, 5).unwrap();
        let s1 = p.post(Send, 101, 6).unwrap();
        assert_eq!((s0, s1), (0, 1));
        assert_eq!(p.post(Send, 102, 0), None, "send queue full");
        assert_eq!(p.sends_outstanding(), 2);
        let r = p.post(Recv, 200, 64).unwrap();
        assert_eq!(r, 2);
        assert_eq!(p.post(Recv, 201, 64), None);
        assert_eq!(p.recvs_outstanding(), 1);
        assert_eq!(p.complete(u64::from(s1)), Some((Send, hw(101, 6))));
        assert_eq!(p.complete(u64::from(s1)), None, "completed twice");
        assert_eq!(p.complete(u64::from(r)), Some((Recv, hw(200, 64))));
        assert_eq!(p.complete(99), None, "not a slot");
        assert_eq!(p.complete(u64::MAX), None);
        assert_eq!(p.post(Send, 103, 1), Some(1), "freed slot reused");
        assert_eq!((p.sends_outstanding(), p.recvs_outstanding()), (2, 0));
        p.unpost(1);
        assert_eq!(p.sends_outstanding(), 1, "a failed post gives its slot back");
        assert_eq!(p.complete(1), None);
        assert_eq!(p.next_flushed(), None);
    }

    #[test]
    fn empty_pool() {
        let mut p = SlotPool::new(0, 0);
        assert_eq!(p.post(Send, 1, 0), None);
        assert_eq!(p.post(Recv, 1, 0), None);
        assert!(!p.flush(Send, 1));
        assert!(!p.flush(Recv, 1));
        assert_eq!(p.next_flushed(), None);
    }

    #[test]
    fn flushed_requests_wait_for_earlier_hardware_requests_of_their_queue() {
        let mut p = SlotPool::new(4, 4);
        let s1 = p.post(Send, 1, 8).unwrap();
        let r2 = p.post(Recv, 2, 64).unwrap();
        let r3 = p.post(Recv, 3, 64).unwrap();
        // The QP goes to ERR; from now on nothing reaches the hardware.
        assert!(p.flush(Recv, 4));
        assert!(p.flush(Send, 5));
        assert!(p.flush(Recv, 6));
        assert_eq!(p.flushed_held(), 3);
        assert_eq!(
            p.next_flushed(),
            None,
            "both queues have hardware requests outstanding"
        );

        // The hardware completes its receives (in its order, here out of posting order across
        // queues): the flushed receives become ready, the flushed send still waits for s1.
        assert_eq!(p.complete(u64::from(r2)), Some((Recv, hw(2, 64))));
        assert_eq!(p.next_flushed(), None, "r3 is still on the hardware");
        assert_eq!(p.complete(u64::from(r3)), Some((Recv, hw(3, 64))));
        assert_eq!(p.next_flushed(), Some((Recv, 4)));
        assert_eq!(p.next_flushed(), Some((Recv, 6)));
        assert_eq!(p.next_flushed(), None, "the send waits for s1");
        assert_eq!(p.sends_outstanding(), 2);
        assert_eq!(p.complete(u64::from(s1)), Some((Send, hw(1, 8))));
        assert_eq!(p.next_flushed(), Some((Send, 5)));
        assert_eq!(p.next_flushed(), None);
        assert_eq!(p.flushed_held(), 0);
        assert_eq!((p.sends_outstanding(), p.recvs_outstanding()), (0, 0));
    }

    #[test]
    fn ready_flushed_requests_come_out_in_posting_order_across_queues() {
        let mut p = SlotPool::new(2, 2);
        assert!(p.flush(Send, 1));
        assert!(p.flush(Recv, 2));
        assert!(p.flush(Send, 3));
        assert!(p.flush(Recv, 4));
        assert!(
            !p.flush(Recv, 5),
            "a flushed request occupies its slot until polled"
        );
        assert_eq!(
            p.post(Send, 6, 0),
            None,
            "so does the hardware's queue accounting"
        );
        assert_eq!((p.sends_outstanding(), p.recvs_outstanding()), (2, 2));
        assert_eq!(p.next_flushed(), Some((Send, 1)));
        assert!(p.flush(Send, 7), "polling frees the slot");
        let order: Vec<_> = std::iter::from_fn(|| p.next_flushed()).collect();
        assert_eq!(order, [(Recv, 2), (Send, 3), (Recv, 4), (Send, 7)]);
    }

    #[test]
    fn hardware_completions_never_match_flushed_slots() {
        let mut p = SlotPool::new(1, 1);
        assert!(p.flush(Send, 1));
        assert_eq!(p.complete(0), None, "slot 0 was never posted to the hardware");
        p.unpost(0);
        assert_eq!(p.sends_outstanding(), 1, "nor can it be unposted");
        assert_eq!(p.next_flushed(), Some((Send, 1)));
        assert_eq!(p.sends_outstanding(), 0);
    }

    fn raw(wr_id: u64, status: WcStatus) -> RawCompletion {
        RawCompletion {
            wr_id,
            status: status as u32,
            byte_len: 0,
            sender: None,
        }
    }

    #[test]
    fn an_unpolled_error_completion_from_the_device_is_seen_before_posting() {
        let mut early = Prefetched::default();
        assert!(!early.keep(&[]), "an empty CQ shows no error");
        assert!(!early.keep(&[raw(0, WcStatus::Success)]));
        // The device failed a send (retries exhausted) and flushed the receive behind it.
        assert!(early.keep(&[raw(1, WcStatus::RetryExcErr), raw(2, WcStatus::WrFlushErr)]));
        assert!(early.keep(&[]), "the error is remembered until the QP is gone");
        assert_eq!(early.len(), 3);
        let mut out = Vec::new();
        assert_eq!(early.hand_out(2, &mut out), 2);
        assert_eq!(early.hand_out(5, &mut out), 1);
        assert_eq!(early.hand_out(5, &mut out), 0);
        let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [0, 1, 2], "handed out in CQ order");
    }

    #[test]
    fn a_status_verbs_does_not_name_counts_as_an_error() {
        let mut early = Prefetched::default();
        let unknown = RawCompletion {
            wr_id: 0,
            status: 999,
            byte_len: 0,
            sender: None,
        };
        assert!(early.keep(&[unknown]));
    }
}
