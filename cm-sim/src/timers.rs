//! One id's timers, as the fabric's queue holds them.
//!
//! The queue holds every timer as an entry tagged with its id's epoch; an id's table says which
//! epoch is current and how many of its entries are still queued. Cancelling every timer of an
//! id moves it to the next epoch, so the queue is never searched: entries of an older epoch are
//! stale and skipped when they come due, or swept out together once they are many (the table's
//! count says how many a cancellation made stale).

/// The timers of one id: 8 bytes, no allocation.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct IdTimers {
    /// Bumped by every cancellation: queued entries of an earlier epoch are stale.
    epoch: u32,
    /// Entries of the current epoch still queued.
    pending: u32,
}

impl IdTimers {
    /// Counts a new timer; returns the epoch its queue entry carries.
    pub(crate) fn arm(&mut self) -> u32 {
        self.pending += 1;
        self.epoch
    }

    /// Cancels every pending timer; returns how many queue entries that made stale.
    pub(crate) fn cancel_all(&mut self) -> u32 {
        self.epoch = self.epoch.wrapping_add(1);
        std::mem::take(&mut self.pending)
    }

    /// Whether a queue entry carrying `epoch` is a live timer of this id.
    pub(crate) fn is_live(&self, epoch: u32) -> bool {
        self.epoch == epoch
    }

    /// An entry carrying `epoch` came due: true (and no longer pending) if it is live.
    pub(crate) fn fire(&mut self, epoch: u32) -> bool {
        if !self.is_live(epoch) {
            return false;
        }
        self.pending -= 1;
        true
    }

    /// Entries of the current epoch still queued (stale ones once the id is dropped).
    pub(crate) fn pending(&self) -> u32 {
        self.pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_armed_timer_fires_once_and_is_no_longer_pending() {
        let mut t = IdTimers::default();
        let epoch = t.arm();
        assert_eq!(t.pending(), 1);
        assert!(t.fire(epoch));
        assert_eq!(t.pending(), 0);
    }

    #[test]
    fn cancelling_makes_every_queued_timer_stale_and_reports_how_many() {
        let mut t = IdTimers::default();
        let first = t.arm();
        let second = t.arm();
        assert_eq!(t.cancel_all(), 2);
        assert_eq!(t.pending(), 0);
        assert!(!t.fire(first));
        assert!(!t.fire(second));
        assert!(!t.is_live(first));
    }

    #[test]
    fn a_timer_armed_after_a_cancel_is_live_and_the_old_ones_are_not() {
        let mut t = IdTimers::default();
        let old = t.arm();
        t.cancel_all();
        let new = t.arm();
        assert_ne!(old, new);
        assert!(t.is_live(new));
        assert!(!t.fire(old));
        assert_eq!(
            t.pending(),
            1,
            "a stale entry does not count against the live one"
        );
        assert!(t.fire(new));
    }

    #[test]
    fn cancelling_with_nothing_armed_makes_nothing_stale() {
        let mut t = IdTimers::default();
        assert_eq!(t.cancel_all(), 0);
        assert_eq!(t.cancel_all(), 0);
    }

    #[test]
    fn epochs_wrap_instead_of_overflowing() {
        let mut t = IdTimers {
            epoch: u32::MAX,
            pending: 0,
        };
        let old = t.arm();
        t.cancel_all();
        assert_eq!(t.arm(), 0);
        assert!(!t.is_live(old));
    }
}
