//! Time control for executors that own the clock: an async executor runs its tasks until every
//! one waits, then asks when the fabric next has something to do and moves time to the earlier
//! of that and its own next timer; and, so that it asks only the channels and CQs that have
//! something, whether one does.

use std::time::Duration;

use cm_core::{Call, ChannelHandle, IdHandle};

use super::SimFabric;
use crate::time::SimTime;

/// Where [`SimFabric::step`] left the fabric.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Step {
    /// Everything due by `now`, the next instant, ran, and the clock is there.
    Moved {
        /// The time reached.
        now: SimTime,
        /// [`SimFabric::crashes_and_restarts`] after the step.
        crashes_and_restarts: (u64, u64),
    },
    /// Nothing is scheduled and no wake-up time was given: nothing can ever happen. The clock
    /// stayed at `now`.
    Idle {
        /// The current time.
        now: SimTime,
    },
    /// The next instant, `next`, is after the limit: nothing ran and the clock did not move.
    PastLimit {
        /// The next instant.
        next: SimTime,
    },
}

impl SimFabric {
    /// When the fabric next has something scheduled (a message arriving, a timer, a fault), or
    /// `None` when nothing is. A cancelled timer may still be counted: the answer is never
    /// later than the next real change, at worst earlier, where advancing to it changes nothing.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, PortSpace};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// assert_eq!(fabric.next_deadline(), None);
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// let next = fabric.next_deadline().expect("ADDR_RESOLVED is scheduled");
    /// fabric.advance_to(next);
    /// assert_eq!(fabric.now(), next);
    /// assert!(h.try_get_cm_event(ch)?.is_some());
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    pub fn next_deadline(&self) -> Option<SimTime> {
        self.inner()
            .borrow_mut()
            .sched
            .next_time()
            .map(SimTime::from_nanos)
    }

    /// Runs everything due up to `t` and moves the clock to `t` (never backwards: a `t` in the
    /// past runs what is due now).
    pub fn advance_to(&self, t: SimTime) {
        let mut fab = self.inner().borrow_mut();
        let deadline = t.max(fab.now);
        fab.run_to(deadline);
    }

    /// Moves the fabric to its next instant and reports where it got, in one call: the step an
    /// async executor takes when every task waits.
    ///
    /// The next instant is the earlier of the fabric's next scheduled action
    /// ([`next_deadline`](SimFabric::next_deadline)) and `wake_at` (the executor's own next
    /// timer, if it has one). When that is after `limit`, nothing runs and the answer is
    /// [`Step::PastLimit`]; when there is none, nothing runs and the answer is [`Step::Idle`].
    /// Otherwise everything due by then runs and the clock moves there, exactly as
    /// [`advance_to`](SimFabric::advance_to) would, and [`Step::Moved`] gives the new time and
    /// the [`crashes_and_restarts`](SimFabric::crashes_and_restarts), so that the executor need
    /// not ask for them again. The same run and trace as those calls one after the other.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, PortSpace};
    /// use cm_sim::{SimTime, Step};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// let never = SimTime::from_nanos(u64::MAX);
    /// assert_eq!(fabric.step(None, never), Step::Idle { now: fabric.now() });
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// let next = fabric.next_deadline().expect("ADDR_RESOLVED is scheduled");
    /// // The executor's own timer comes first: only the clock moves.
    /// let early = SimTime::from_nanos(1);
    /// assert!(matches!(fabric.step(Some(early), never), Step::Moved { now, .. } if now == early));
    /// assert_eq!(fabric.events_queued(), 0);
    /// // A limit before the next instant: nothing runs.
    /// assert_eq!(fabric.step(None, early), Step::PastLimit { next });
    /// match fabric.step(None, never) {
    ///     Step::Moved { now, crashes_and_restarts } => {
    ///         assert_eq!((now, fabric.events_queued(), crashes_and_restarts), (next, 1, (0, 0)));
    ///     }
    ///     other => panic!("ADDR_RESOLVED was due: {other:?}"),
    /// }
    /// assert!(h.try_get_cm_event(ch)?.is_some());
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    #[inline]
    pub fn step(&self, wake_at: Option<SimTime>, limit: SimTime) -> Step {
        let mut fab = self.inner().borrow_mut();
        let fab = &mut *fab;
        let first = fab.sched.peek_earliest();
        let next = match (first.map(|e| e.time), wake_at.map(SimTime::as_nanos)) {
            (Some(a), Some(b)) => a.min(b),
            (Some(t), None) | (None, Some(t)) => t,
            (None, None) => return Step::Idle { now: fab.now },
        };
        let next = SimTime::from_nanos(next);
        if next > limit {
            return Step::PastLimit { next };
        }
        let deadline = next.max(fab.now);
        // What `advance_to` runs, less the searches for the earliest entry that are known
        // already: the first entry is the one just found, and after it, when it was the only
        // one at its time, the queue can tell that nothing else is due without a search.
        match first {
            Some(e) if e.time <= deadline.as_nanos() => {
                if let Some((time, action)) = fab.sched.pop_earliest(e) {
                    fab.run_action(time, action);
                }
                if deadline != SimTime::NEVER && fab.sched.surely_none_due_by(deadline.as_nanos()) {
                    fab.now = fab.now.max(deadline);
                } else {
                    fab.run_to(deadline);
                }
            }
            _ => fab.run_to(deadline),
        }
        Step::Moved {
            now: fab.now,
            crashes_and_restarts: (fab.stats.crashes, fab.stats.restarts),
        }
    }

    /// Time from the start of the run to now, for executors that hand out `Duration`s.
    pub fn elapsed(&self) -> Duration {
        self.now().since_start()
    }

    /// How many events have been queued on any channel of any host since the fabric was built.
    /// An executor that retrieved every event its channels had when the count was `n`, and
    /// reads `n` again, knows that none of them has a new one (a channel can still fail: a
    /// crash or a restart shows in [`fault_stats`](SimFabric::fault_stats)).
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, PortSpace};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// let before = fabric.events_queued();
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// assert_eq!(fabric.events_queued(), before, "ADDR_RESOLVED is only scheduled");
    /// fabric.advance_to(fabric.next_deadline().expect("ADDR_RESOLVED is scheduled"));
    /// assert_eq!(fabric.events_queued(), before + 1);
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    #[inline]
    pub fn events_queued(&self) -> u64 {
        self.inner().borrow().events_queued
    }

    /// How many events are queued on the channels of host number `host` (0 for a host the
    /// fabric does not have). When it is 0, no channel of the host has an event to retrieve;
    /// cheaper than asking each channel with [`may_have_event`](SimFabric::may_have_event).
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, PortSpace};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// assert_eq!(fabric.queued_events_on(0), 0);
    /// fabric.advance_to(fabric.next_deadline().expect("ADDR_RESOLVED is scheduled"));
    /// assert_eq!(fabric.queued_events_on(0), 1);
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    #[inline]
    pub fn queued_events_on(&self, host: usize) -> usize {
        self.inner()
            .borrow()
            .hosts
            .get(host)
            .map_or(0, |h| h.counts.queued)
    }

    /// How many event channels host number `host` has open (0 for a host the fabric does not
    /// have). An executor that holds the only one knows, from
    /// [`queued_events_on`](SimFabric::queued_events_on), whether it has an event without asking
    /// the channel ([`may_have_event`](SimFabric::may_have_event)).
    ///
    /// ```
    /// use cm_core::CmBackend;
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// assert_eq!(fabric.channels_on(0), 0);
    /// let ch = fabric.host(0).create_event_channel()?;
    /// assert_eq!(fabric.channels_on(0), 1);
    /// fabric.host(0).destroy_event_channel(ch)?;
    /// assert_eq!(fabric.channels_on(0), 0);
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    #[inline]
    pub fn channels_on(&self, host: usize) -> usize {
        self.inner()
            .borrow()
            .hosts
            .get(host)
            .map_or(0, |h| h.counts.channels)
    }

    /// Whether `try_get_cm_event(ch)` on host number `host` may return something now: an event
    /// is queued on the channel, or the call would fail (the channel is gone, the host is
    /// down). `false` means that retrieval would return `Ok(None)` once what is due now has
    /// run; an executor that has just moved time on may skip the channel.
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, PortSpace};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// assert!(!fabric.may_have_event(0, ch));
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// fabric.advance_to(fabric.next_deadline().expect("ADDR_RESOLVED is scheduled"));
    /// assert!(fabric.may_have_event(0, ch));
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    pub fn may_have_event(&self, host: usize, ch: ChannelHandle) -> bool {
        let fab = self.inner().borrow();
        let Ok(host) = u16::try_from(host) else {
            return true;
        };
        match fab.channel_ref(host, ch, Call::GetCmEvent) {
            Ok(r) => fab.channels.get(r).is_some_and(|c| !c.queue.is_empty()),
            Err(_) => true,
        }
    }

    /// Whether `try_poll_cq(id)` on host number `host` may return something now: a completion
    /// is on the id's CQ, or the call would fail (no such id or QP, the host is down).
    pub fn may_have_completion(&self, host: usize, id: IdHandle) -> bool {
        let fab = self.inner().borrow();
        let Ok(host) = u16::try_from(host) else {
            return true;
        };
        match fab.id_ref(host, id, Call::PollCq) {
            Ok(r) => fab
                .ids
                .get(r)
                .and_then(|s| s.qp.as_ref())
                .is_none_or(|q| !q.cq_is_empty()),
            Err(_) => true,
        }
    }
}
