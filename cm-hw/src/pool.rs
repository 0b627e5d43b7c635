//! Bookkeeping of a QP's message slots: which are free, and which user work request each posted
//! slot carries. Slots `0..send` are for sends, `send..send + recv` for receives; the slot index
//! is the `wr_id` given to verbs, so a completion finds its slot in O(1).

use cm_core::WcOpcode;

/// What a posted slot carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct SlotUse {
    /// The caller's wr_id.
    pub(crate) wr_id: u64,
    /// Bytes posted (send length or receive buffer length).
    pub(crate) len: u32,
}

/// The slots of one QP.
#[derive(Debug)]
pub(crate) struct SlotPool {
    send: u32,
    used: Vec<Option<SlotUse>>,
    send_free: Vec<u32>,
    recv_free: Vec<u32>,
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
        }
    }

    /// Takes a free send slot for `wr_id`.
    pub(crate) fn take_send(&mut self, wr_id: u64, len: u32) -> Option<u32> {
        let slot = self.send_free.pop()?;
        self.used[slot as usize] = Some(SlotUse { wr_id, len });
        Some(slot)
    }

    /// Takes a free receive slot for `wr_id`.
    pub(crate) fn take_recv(&mut self, wr_id: u64, len: u32) -> Option<u32> {
        let slot = self.recv_free.pop()?;
        self.used[slot as usize] = Some(SlotUse { wr_id, len });
        Some(slot)
    }

    /// Frees `slot` (its completion was polled, or posting it failed); returns what it carried
    /// and whether it was a send or a receive. None for a slot that is not posted.
    pub(crate) fn release(&mut self, slot: u64) -> Option<(WcOpcode, SlotUse)> {
        let index = usize::try_from(slot).ok()?;
        let use_ = self.used.get_mut(index)?.take()?;
        let slot = index as u32;
        if slot < self.send {
            self.send_free.push(slot);
            Some((WcOpcode::Send, use_))
        } else {
            self.recv_free.push(slot);
            Some((WcOpcode::Recv, use_))
        }
    }

    /// Sends posted and not completed.
    pub(crate) fn sends_outstanding(&self) -> u32 {
        self.send - self.send_free.len() as u32
    }

    /// Receives posted and not completed.
    pub(crate) fn recvs_outstanding(&self) -> u32 {
        (self.used.len() as u32 - self.send) - self.recv_free.len() as u32
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn slots_map_back_to_user_wr_ids() {
        let mut p = SlotPool::new(2, 1);
        let s0 = p.take_send(100, 5).unwrap();
        let s1 = p.take_send(101, 6).unwrap();
        assert_eq!((s0, s1), (0, 1));
        assert_eq!(p.take_send(102, 0), None, "send queue full");
        assert_eq!(p.sends_outstanding(), 2);
        let r = p.take_recv(200, 64).unwrap();
        assert_eq!(r, 2);
        assert_eq!(p.take_recv(201, 64), None);
        assert_eq!(p.recvs_outstanding(), 1);
        assert_eq!(
            p.release(u64::from(s1)),
            Some((WcOpcode::Send, SlotUse { wr_id: 101, len: 6 }))
        );
        assert_eq!(p.release(u64::from(s1)), None, "released twice");
        assert_eq!(
            p.release(u64::from(r)),
            Some((WcOpcode::Recv, SlotUse { wr_id: 200, len: 64 }))
        );
        assert_eq!(p.release(99), None, "not a slot");
        assert_eq!(p.release(u64::MAX), None);
        assert_eq!(p.take_send(103, 1), Some(1), "freed slot reused");
        assert_eq!((p.sends_outstanding(), p.recvs_outstanding()), (2, 0));
    }

    #[test]
    fn empty_pool() {
        let mut p = SlotPool::new(0, 0);
        assert_eq!(p.take_send(1, 0), None);
        assert_eq!(p.take_recv(1, 0), None);
    }
}
