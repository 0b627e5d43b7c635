//! A QP's work requests ([`WrPool`]: slots, and the order of flushed completions), as pure code
//! (no I/O), and the [`post_gate`] both backends call before posting.

use std::collections::VecDeque;

use crate::error::{Call, CmError};
use crate::handle::MrHandle;
use crate::state::{IdMachine, QpState};
use crate::types::{QpCaps, WcOpcode};
use crate::work_request::{check_local_sge, LocalRegion, SendWr};

/// What a taken slot carries.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct SlotUse {
    /// The caller's wr_id.
    pub wr_id: u64,
    /// Bytes posted (send length or receive buffer length); 0 for a flushed request.
    pub len: u32,
    /// Flushed by the backend (never given to the transport).
    pub flushed: bool,
    /// What the request is: the opcode its completion reports, whatever its status.
    pub opcode: WcOpcode,
    /// Whether it completes visibly when it succeeds. The transport completes every request
    /// (a backend gives an unsignalled one to the device signalled); the backend hands the
    /// completion of an unsignalled one out only when it failed, and frees its slot either way.
    pub signaled: bool,
}

/// What the [post gate](post_gate) decided for a work request it let through.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Admission {
    /// Give it to the transport ([`WrPool::post`]).
    Post,
    /// The QP is in ERR: complete it flushed without the transport ([`WrPool::flush`]).
    Flush,
}

/// The checks of `ibv_post_send` / `ibv_post_recv` before anything is posted, in the order both
/// backends answer them: the id's machine (a QP, the port space, the QP's state), the length
/// against `caps`, whether the QP has failed (`device_failed`, asked only while the machine does
/// not know it yet; it moves `machine` to QP ERR when it says so), and a full queue with
/// `outstanding` requests of `opcode`'s queue held.
///
/// ```
/// use cm_core::backend::{post_gate, Admission};
/// use cm_core::{CmError, CmEventType, IdMachine, PortSpace, QpCaps, WcOpcode};
///
/// let m = IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap();
/// let mut m = m.on_event(CmEventType::AddrResolved).unwrap().on_ack().unwrap();
/// let caps = QpCaps::new();
/// let refused = post_gate(&mut m, &caps, WcOpcode::Recv, 64, 0, || Ok(false));
/// assert!(matches!(refused, Err(CmError::NoQp { .. })), "no QP yet");
///
/// let mut m = m.create_qp().unwrap();
/// assert_eq!(post_gate(&mut m, &caps, WcOpcode::Recv, 64, 0, || Ok(false)), Ok(Admission::Post));
/// let full = post_gate(&mut m, &caps, WcOpcode::Recv, 64, caps.max_recv_wr, || Ok(false));
/// assert!(matches!(full, Err(CmError::QueueFull { outstanding: 16, .. })));
/// ```
///
/// # Errors
///
/// The machine's refusal, [`CmError::InvalidArgument`] for a message longer than
/// `max_message_size`, `device_failed`'s error, or [`CmError::QueueFull`].
pub fn post_gate(
    machine: &mut IdMachine,
    caps: &QpCaps,
    opcode: WcOpcode,
    len: usize,
    outstanding: u32,
    device_failed: impl FnOnce() -> Result<bool, CmError>,
) -> Result<Admission, CmError> {
    if opcode.is_recv() {
        machine.post_recv()?;
    } else {
        machine.post_send()?;
    }
    admit(machine, caps, opcode, len, outstanding, device_failed)
}

/// The [`post_gate`] of a datagram send (`post_send_to`): the machine's datagram rule (a UD QP
/// in a state that sends) in place of `post_send`'s, then the same checks in the same order.
///
/// # Errors
///
/// As [`post_gate`]'s.
pub fn datagram_gate(
    machine: &mut IdMachine,
    caps: &QpCaps,
    len: usize,
    outstanding: u32,
    device_failed: impl FnOnce() -> Result<bool, CmError>,
) -> Result<Admission, CmError> {
    machine.post_send_to()?;
    admit(machine, caps, WcOpcode::Send, len, outstanding, device_failed)
}

/// The [`post_gate`] of a work request over memory regions (`post_send_wr`): the machine's
/// rule for its operation ([`IdMachine::post_send_wr`]), the request's own checks
/// ([`SendWr::check`] against the connection's `initiator_depth`), each
/// local entry against the region `region` finds for its handle ([`check_local_sge`]), then
/// a failed QP and a full queue, as for every send.
///
/// # Errors
///
/// The first refusal of those, in that order.
pub fn send_wr_gate(
    machine: &mut IdMachine,
    caps: &QpCaps,
    wr: &SendWr<'_>,
    initiator_depth: u8,
    outstanding: u32,
    mut region: impl FnMut(MrHandle) -> Option<LocalRegion>,
    device_failed: impl FnOnce() -> Result<bool, CmError>,
) -> Result<Admission, CmError> {
    machine.post_send_wr(&wr.op)?;
    wr.check(caps, initiator_depth)?;
    for sge in wr.sg_list {
        check_local_sge(&wr.op, sge, region(sge.mr))?;
    }
    queue_gate(
        machine,
        Call::PostSend,
        caps.max_send_wr,
        outstanding,
        device_failed,
    )
}

/// The checks after the machine's: length, a failed QP, a full queue; then post or flush.
fn admit(
    machine: &mut IdMachine,
    caps: &QpCaps,
    opcode: WcOpcode,
    len: usize,
    outstanding: u32,
    device_failed: impl FnOnce() -> Result<bool, CmError>,
) -> Result<Admission, CmError> {
    let (call, limit) = if opcode.is_recv() {
        (Call::PostRecv, caps.max_recv_wr)
    } else {
        (Call::PostSend, caps.max_send_wr)
    };
    caps.check_length(opcode, len)?;
    queue_gate(machine, call, limit, outstanding, device_failed)
}

/// A failed QP, then a full queue of `limit` with `outstanding` held; then post or flush.
fn queue_gate(
    machine: &mut IdMachine,
    call: Call,
    limit: u32,
    outstanding: u32,
    device_failed: impl FnOnce() -> Result<bool, CmError>,
) -> Result<Admission, CmError> {
    if machine.qp() != Some(QpState::Err) && device_failed()? {
        *machine = machine.qp_error();
    }
    if outstanding >= limit {
        return Err(CmError::QueueFull { call, outstanding });
    }
    Ok(if machine.qp() == Some(QpState::Err) {
        Admission::Flush
    } else {
        Admission::Post
    })
}

/// A queue's index in the per-queue arrays.
#[inline]
const fn queue(opcode: WcOpcode) -> usize {
    opcode.is_recv() as usize
}

/// The slots of one queue.
#[derive(Debug)]
struct Queue {
    /// The queue's first slot number.
    base: u32,
    /// How many slots it has.
    size: u32,
    /// What each slot used so far carries, by slot - base; slots beyond were never used.
    used: Vec<Option<SlotUse>>,
    /// Freed slots, the last freed reused first.
    free: Vec<u32>,
    /// Slots taken and not freed.
    held: u32,
    /// Requests given to the transport whose completion was not polled yet.
    in_transport: u32,
    /// Flushed requests not handed out yet, as (posting sequence, slot), in order.
    flushed: VecDeque<(u64, u32)>,
}

impl Queue {
    const fn new(base: u32, size: u32) -> Self {
        Queue {
            base,
            size,
            used: Vec::new(),
            free: Vec::new(),
            held: 0,
            in_transport: 0,
            flushed: VecDeque::new(),
        }
    }

    /// The lowest never-used slot comes after every freed one, which makes the order of slots
    /// the same as a free list that started full and sorted.
    #[inline]
    fn take(&mut self, use_: SlotUse) -> Option<u32> {
        let slot = match self.free.pop() {
            Some(slot) => slot,
            None if (self.used.len() as u32) < self.size => {
                self.used.push(None);
                self.base + self.used.len() as u32 - 1
            }
            None => return None,
        };
        self.used[(slot - self.base) as usize] = Some(use_);
        self.held += 1;
        Some(slot)
    }

    #[inline]
    fn use_of(&self, slot: u32) -> Option<&SlotUse> {
        self.used.get(slot.checked_sub(self.base)? as usize)?.as_ref()
    }

    #[inline]
    fn free(&mut self, slot: u32) -> Option<SlotUse> {
        let use_ = self.used.get_mut((slot - self.base) as usize)?.take()?;
        self.free.push(slot);
        self.held -= 1;
        Some(use_)
    }
}

/// The work requests of one QP.
///
/// # Slots
///
/// A work request occupies a slot of its queue from posting until its completion is polled,
/// whether the transport (the device, or the simulator's queues) still holds it or it was
/// flushed by the backend, so both backends refuse a full queue at the same moment. Slots
/// `0..send` are for sends, `send..send + recv` for receives: a backend gives the slot as the
/// work request's id to its transport and finds the caller's `wr_id` (and, on hardware, the
/// registered message buffer) from it in O(1) when the completion comes back
/// ([`WrPool::complete`]). Slot storage grows with the slots used, so a QP that never posts
/// costs nothing here.
///
/// # Flushed work requests
///
/// A work request posted while the QP is in ERR completes at once with `WR_FLUSH_ERR`; it never
/// reaches the transport (not every provider completes one: rxe on Linux 6.1 never completes a
/// receive posted on a QP in ERR). It is [`flush`](WrPool::flush)ed here and its completion
/// handed out by [`next_flushed`](WrPool::next_flushed). Verbs completes each queue in posting
/// order, and so does this: a flushed completion is held back while requests of its queue that
/// went to the transport earlier have not been polled (they were all posted before, since a QP
/// never leaves ERR). Flushed completions that are ready come out in posting order across both
/// queues.
///
/// ```
/// use cm_core::backend::WrPool;
/// use cm_core::WcOpcode::{Recv, Send};
///
/// let mut pool = WrPool::new(1, 2);
/// let slot = pool.post(Recv, 7, 64).expect("a free receive slot");
/// assert_eq!(slot, 1, "receive slots follow the send slots");
/// assert!(pool.flush(Send, 8), "posted while the QP is in ERR");
/// assert_eq!(pool.next_flushed(), Some((Send, 8)));
/// assert!(pool.flush(Recv, 9));
/// assert_eq!(pool.next_flushed(), None, "waits for the receive the transport holds");
/// assert_eq!(pool.complete(u64::from(slot)).map(|(_, u)| u.wr_id), Some(7));
/// assert_eq!(pool.next_flushed(), Some((Recv, 9)));
/// assert_eq!((pool.outstanding(Send), pool.outstanding(Recv)), (0, 0));
/// ```
#[derive(Debug)]
pub struct WrPool {
    queues: [Queue; 2],
    next_seq: u64,
}

impl WrPool {
    /// `send` send slots and `recv` receive slots, all free.
    ///
    /// # Panics
    ///
    /// When `send + recv` does not fit a `u32`.
    pub fn new(send: u32, recv: u32) -> Self {
        send.checked_add(recv).expect("fewer than 2^32 slots");
        WrPool {
            queues: [Queue::new(0, send), Queue::new(send, recv)],
            next_seq: 0,
        }
    }

    #[inline]
    fn queue_of(&self, slot: u32) -> usize {
        usize::from(slot >= self.queues[1].base)
    }

    /// Requests of `opcode`'s queue posted and not polled yet (given to the transport or
    /// flushed).
    #[inline]
    pub fn outstanding(&self, opcode: WcOpcode) -> u32 {
        self.queues[queue(opcode)].held
    }

    /// Takes a free slot of `opcode`'s queue for `wr_id`, about to be given to the transport
    /// with `len` bytes (signalled); None when the queue is full.
    #[inline]
    pub fn post(&mut self, opcode: WcOpcode, wr_id: u64, len: u32) -> Option<u32> {
        self.post_with(opcode, wr_id, len, true)
    }

    /// [`post`](Self::post), signalled or not ([`SlotUse::signaled`]).
    #[inline]
    pub fn post_with(&mut self, opcode: WcOpcode, wr_id: u64, len: u32, signaled: bool) -> Option<u32> {
        let q = &mut self.queues[queue(opcode)];
        let slot = q.take(SlotUse {
            wr_id,
            len,
            flushed: false,
            opcode,
            signaled,
        })?;
        q.in_transport += 1;
        Some(slot)
    }

    /// Whether `slot` carries a request given to the transport.
    #[inline]
    fn in_transport(&self, slot: u32) -> bool {
        self.queues[self.queue_of(slot)]
            .use_of(slot)
            .is_some_and(|u| !u.flushed)
    }

    /// Gives back the slot of a request the transport refused (it will never complete).
    pub fn unpost(&mut self, slot: u32) {
        if self.in_transport(slot) {
            let q = &mut self.queues[self.queue_of(slot)];
            q.free(slot);
            q.in_transport -= 1;
        }
    }

    /// The transport completed the request in `slot` (its work request id) and the completion
    /// was polled: frees the slot; what it carried and its queue (`Send` or `Recv`). None when
    /// `slot` is not a slot given to the transport (ignored rather than trusted).
    #[inline]
    pub fn complete(&mut self, slot: u64) -> Option<(WcOpcode, SlotUse)> {
        let slot = u32::try_from(slot).ok()?;
        let qi = self.queue_of(slot);
        let q = &mut self.queues[qi];
        // One lookup: this runs for every completion polled.
        let entry = q.used.get_mut(slot.checked_sub(q.base)? as usize)?;
        let use_ = match *entry {
            Some(u) if !u.flushed => u,
            _ => return None,
        };
        *entry = None;
        q.free.push(slot);
        q.held -= 1;
        q.in_transport -= 1;
        Some((opcode_of(qi), use_))
    }

    /// Takes a slot of `opcode`'s queue for `wr_id` posted while the QP is in ERR: it never goes
    /// to the transport and completes flushed (see [`WrPool`]). False when the
    /// queue is full.
    #[inline]
    pub fn flush(&mut self, opcode: WcOpcode, wr_id: u64) -> bool {
        let q = &mut self.queues[queue(opcode)];
        let Some(slot) = q.take(SlotUse {
            wr_id,
            len: 0,
            flushed: true,
            opcode,
            signaled: true,
        }) else {
            return false;
        };
        q.flushed.push_back((self.next_seq, slot));
        self.next_seq += 1;
        true
    }

    /// Whether flushed requests wait to be handed out (ready or not).
    #[inline]
    pub fn has_flushed(&self) -> bool {
        self.queues.iter().any(|q| !q.flushed.is_empty())
    }

    /// The next flushed request whose completion may be handed out now (nothing its queue gave
    /// the transport earlier is still unpolled), with its slot freed; the oldest first when
    /// both queues have one. The opcode is the request's own.
    #[inline]
    pub fn next_flushed(&mut self) -> Option<(WcOpcode, u64)> {
        if !self.has_flushed() {
            return None;
        }
        let ready = |q: &Queue| match q.in_transport {
            0 => q.flushed.front().map(|&(seq, _)| seq),
            _ => None,
        };
        let qi = match (ready(&self.queues[0]), ready(&self.queues[1])) {
            (None, None) => return None,
            (Some(s), Some(r)) => usize::from(r < s),
            (Some(_), None) => 0,
            (None, Some(_)) => 1,
        };
        let q = &mut self.queues[qi];
        let (_, slot) = q.flushed.pop_front()?;
        let use_ = q.free(slot)?;
        Some((use_.opcode, use_.wr_id))
    }
}

#[inline]
const fn opcode_of(queue: usize) -> WcOpcode {
    if queue == 0 {
        WcOpcode::Send
    } else {
        WcOpcode::Recv
    }
}

#[cfg(test)]
mod tests;
