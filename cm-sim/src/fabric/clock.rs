//! Virtual time, randomness and the discrete-event queue: what is scheduled, timers and their
//! cancellation, running until a deadline.

use super::*;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum TimerKind {
    AddrResolved,
    AddrError,
    RouteResolved,
    RouteError,
    /// One of the IB CM exchange's.
    Cm(CmTimer),
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Action {
    /// A REQ (or a retry of it) arrives at `host`, where the kernel finds its child or a
    /// listener.
    Req { host: u16, from: SlotRef, payload: u32 },
    /// Fault number `n` of the fabric's list strikes.
    Fault(u32),
    /// A send has found no receive for as long as the receiver-not-ready retries allow.
    Rnr { id: SlotRef, sends_done: u64 },
    /// A send has gone unacknowledged (peer crashed, partitioned or gone) for as long as the
    /// transport retries allow.
    TransportRetry { id: SlotRef, sends_done: u64 },
    /// A message arrives for the id `to`, which may be gone by then (its host's IB CM answers a
    /// DREQ for an id it does not know with a DREP).
    Msg {
        kind: MsgKind,
        to: SlotRef,
        from: SlotRef,
        status: i32,
        payload: u32,
    },
    Timer {
        id: SlotRef,
        epoch: u32,
        kind: TimerKind,
    },
    /// A datagram in flight (its index in the datagram pool) arrives.
    Datagram(u32),
    /// A one-sided request or answer in flight (its index in the packet pool) arrives.
    Rdma(u32),
    /// The one-sided retry timer of the QP `qpn` of id `id` fires.
    RdmaTimer { id: SlotRef, qpn: u32 },
}

/// A value drawn uniformly from `lo..=hi` (`lo <= hi`). The range `0..=u64::MAX` (a range
/// ending at `Duration::MAX`) has no width that fits a `u64`: every value is in it.
// Always inlined: every message draws its latency, and out of line the call cost a third of
// the draw.
#[inline(always)]
pub(super) fn draw_between(rng: &mut ChaCha8Rng, lo: u64, hi: u64) -> u64 {
    match (hi - lo).checked_add(1) {
        Some(width) => lo + rng.next_u64() % width,
        None => rng.next_u64(),
    }
}

/// A data packet's one-way latency on a link: a draw from the fabric's range `latency`, then
/// one from the link's `Delay` fault range `delay` (each drawn only when it is a range), from
/// the generator of the packet's own kind (datagrams, one-sided RDMA), so that the CM
/// messages' draws stay as they were.
pub(super) fn packet_latency(rng: &mut ChaCha8Rng, latency: (u64, u64), delay: (u64, u64)) -> u64 {
    let draw =
        |rng: &mut ChaCha8Rng, (lo, hi): (u64, u64)| if hi > lo { draw_between(rng, lo, hi) } else { lo };
    let base = draw(rng, latency);
    base.saturating_add(draw(rng, delay))
}

/// Live ids from which the fabric reads ahead: their slots (176 bytes) then fill about 3 MB,
/// more than a core's L2 cache here holds.
const READ_AHEAD_IDS: usize = 16_384;

impl Fabric {
    #[inline(always)]
    pub(super) fn latency(&mut self) -> u64 {
        let (lo, hi) = self.latency_nanos;
        if hi <= lo {
            return lo;
        }
        draw_between(&mut self.rng, lo, hi)
    }

    pub(super) fn schedule(&mut self, time: SimTime, action: Action) {
        self.sched.push(time.as_nanos(), action, Lane::Heap);
    }

    #[inline(always)]
    pub(super) fn timer(&mut self, id: SlotRef, at: SimTime, kind: TimerKind) {
        let s = self.slot(id);
        let epoch = s.timers.arm();
        self.sched
            .push(at.as_nanos(), Action::Timer { id, epoch, kind }, Lane::Heap);
    }

    /// An IB CM timer of `id`, due `after` from now. Timeouts of one length expire in the order
    /// they are set, so each of the few lengths there are gets a FIFO lane and stays out of the
    /// heap (a push out of order, an id whose options changed its waits, falls back to the heap).
    #[inline(always)]
    pub(super) fn cm_timer(&mut self, id: SlotRef, after: u64, timer: CmTimer, lane: usize) {
        let s = self.slot(id);
        let epoch = s.timers.arm();
        let kind = TimerKind::Cm(timer);
        let at = self.now.after_nanos(after);
        self.sched
            .push(at.as_nanos(), Action::Timer { id, epoch, kind }, Lane::Fifo(lane));
    }

    /// Cancels the id's pending timers.
    // Always inlined: five calls a lifecycle, most the first effect of a transition, whose
    // lookup of the id then answers this one's too; `#[inline]` left it a call.
    #[inline(always)]
    pub(super) fn cancel_timers(&mut self, id: SlotRef) {
        let s = self.slot(id);
        let cancelled = s.timers.cancel_all();
        self.timers_cancelled(cancelled);
    }

    /// Counts `n` queued timers as stale; once they are half the queue, removes them all, which
    /// costs O(1) per timer over time and keeps the queue at most twice what is live.
    // The test inline, the sweep out of line: with the sweep inlined, every call (four a
    // lifecycle, one in sixty sweeping) saved and restored the registers the sweep uses.
    #[inline]
    pub(super) fn timers_cancelled(&mut self, n: u32) {
        self.stale_timers += n as usize;
        if self.stale_timers < 64 || self.stale_timers * 2 < self.sched.len() {
            return;
        }
        self.remove_stale_timers();
    }

    #[cold]
    #[inline(never)]
    fn remove_stale_timers(&mut self) {
        let ids = &self.ids;
        let mut removed_until = self.removed_until;
        self.sched.retain(|time, action| match *action {
            Action::Timer { id, epoch, .. } if ids.get(id).is_none_or(|slot| !slot.timers.is_live(epoch)) => {
                removed_until = removed_until.max(SimTime::from_nanos(time));
                false
            }
            _ => true,
        });
        self.removed_until = removed_until;
        self.stale_timers = 0;
    }

    /// Runs scheduled actions up to `deadline`, stopping early as soon as
    /// `done` holds. Returns whether `done` held.
    // Generic: through `&dyn Fn` the test after every action would be an indirect call.
    pub(super) fn run_until(&mut self, deadline: SimTime, done: impl Fn(&Fabric) -> bool) -> bool {
        loop {
            if done(self) {
                return true;
            }
            match self.sched.pop_due(deadline.as_nanos()) {
                Some((time, action)) => self.run_action(time, action),
                None => {
                    self.reach(deadline);
                    return false;
                }
            }
        }
    }

    /// [`run_until`](Fabric::run_until) for a caller that has just seen `done` not hold (and
    /// changed nothing since): the first action runs before `done` is asked, where `run_until`
    /// would ask it again first.
    pub(super) fn run_until_next(&mut self, deadline: SimTime, done: impl Fn(&Fabric) -> bool) -> bool {
        loop {
            match self.sched.pop_due(deadline.as_nanos()) {
                Some((time, action)) => self.run_action(time, action),
                None => {
                    self.reach(deadline);
                    return false;
                }
            }
            if done(self) {
                return true;
            }
        }
    }

    /// [`run_until`](Fabric::run_until) with nothing to stop it early, without asking a
    /// predicate after each action.
    pub(super) fn run_to(&mut self, deadline: SimTime) {
        while let Some((time, action)) = self.sched.pop_due(deadline.as_nanos()) {
            self.run_action(time, action);
        }
        self.reach(deadline);
    }

    /// Runs one action popped for `time`.
    #[inline(always)]
    pub(super) fn run_action(&mut self, time: u64, action: Action) {
        self.now = self.now.max(SimTime::from_nanos(time));
        self.read_ahead();
        self.dispatch(action);
    }

    /// Moves the clock to `deadline` once nothing before it is left to run; when running until
    /// idle, to the last stale timer removed unseen, as that timer would have if it had stayed
    /// queued, so that sweeping stale timers never changes the virtual time a run ends at.
    fn reach(&mut self, deadline: SimTime) {
        self.now = self.now.max(if deadline == SimTime::NEVER {
            self.removed_until
        } else {
            deadline
        });
    }

    /// Turns reading ahead on once the ids take more memory than a core's caches hold (and off
    /// below that): with all of it in the caches, reading ahead is only more work.
    #[inline]
    pub(super) fn ids_changed(&mut self) {
        self.sched.set_look_ahead(self.ids.len() >= READ_AHEAD_IDS);
    }

    /// Reads the memory the next actions will touch (their ids, their payloads) now, all at
    /// once: with many connections live their ids are spread over far more memory than the
    /// caches hold, and actions come in the order of their drawn times, not of the ids, so each
    /// action's first read of its id would otherwise wait for memory on its own. The reads
    /// overlap, and the actions then find the lines in the caches. Nothing read is used: what
    /// runs, and in which order, is unchanged.
    #[inline(always)]
    fn read_ahead(&mut self) {
        if self.sched.has_lookahead() {
            self.read_ahead_now();
        }
    }

    #[inline(never)]
    fn read_ahead_now(&mut self) {
        let (ids, payloads) = (&self.ids, &self.payloads);
        for a in self.sched.take_lookahead() {
            let (r, peer, payload) = match *a {
                Action::Msg {
                    to, from, payload, ..
                } => (to, from, payload),
                Action::Timer { id, .. } => (id, SlotRef::NONE, NO_PAYLOAD),
                Action::Req { from, payload, .. } => (from, SlotRef::NONE, payload),
                _ => continue,
            };
            for r in [r, peer] {
                if let Some(s) = ids.get(r) {
                    // One field from each part of the slot the actions read.
                    let qp = s.qp.as_ref().map(|q| (q.qpn, q.sends_done));
                    std::hint::black_box((s.m, s.timers, s.last_arrival, s.queued, s.remote, s.channel, qp));
                }
            }
            if let Some(p) = payloads.get(payload) {
                std::hint::black_box(p.wire);
            }
        }
    }

    pub(super) fn deadline(&self, timeout: Duration) -> SimTime {
        self.now + timeout
    }
}
