//! [`Guarded`]: a value whose release runs exactly once, even when a panic unwinds past it.
//!
//! A retrieved `rdma_cm_event` is the case in point: until `rdma_ack_cm_event` runs, librdmacm
//! counts it against its id, and `rdma_destroy_id` of that id waits for the ack forever. Between
//! retrieving an event and recording it in the backend's books the event is owned by a local
//! only; a panic there would drop it unacked and leave [`Drop`] of the backend blocked. Held in
//! a `Guarded`, the event is acked by that unwinding instead.

/// A value with a release (an ack, a free) that runs exactly once: by
/// [`finish`](Guarded::finish), which returns its result, or when the guard is dropped
/// unfinished — on an early return or while a panic unwinds — discarding the result.
pub(crate) struct Guarded<T, R> {
    value: T,
    release: fn(&mut T) -> R,
    released: bool,
}

impl<T, R> Guarded<T, R> {
    /// Guards `value`, to be released with `release`.
    pub(crate) const fn new(value: T, release: fn(&mut T) -> R) -> Self {
        Guarded {
            value,
            release,
            released: false,
        }
    }

    /// The guarded value.
    pub(crate) const fn get(&self) -> &T {
        &self.value
    }

    /// Runs the release now and returns what it returned.
    pub(crate) fn finish(mut self) -> R {
        self.released = true;
        (self.release)(&mut self.value)
    }
}

impl<T, R> Drop for Guarded<T, R> {
    fn drop(&mut self) {
        if !self.released {
            self.released = true;
            // Nobody is left to report a failed release to (the guard was dropped unfinished).
            let _ = (self.release)(&mut self.value);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::cell::Cell;
    use std::rc::Rc;

    use super::*;

    /// How often a stand-in event was acked.
    type Acks = Rc<Cell<u32>>;

    /// A stand-in for a raw event whose counter (shared with the test) counts its acks.
    fn event() -> (Guarded<Acks, u32>, Acks) {
        fn ack(acks: &mut Acks) -> u32 {
            acks.set(acks.get() + 1);
            acks.get()
        }
        let acks = Rc::new(Cell::new(0));
        (Guarded::new(Rc::clone(&acks), ack), acks)
    }

    #[test]
    fn finishing_releases_once_and_returns_the_result() {
        let (g, acks) = event();
        assert_eq!(g.get().get(), 0, "not released while guarded");
        assert_eq!(g.finish(), 1);
        assert_eq!(acks.get(), 1, "not released again when the finished guard drops");
    }

    #[test]
    fn a_guard_dropped_unfinished_releases_once() {
        let (g, acks) = event();
        drop(g);
        assert_eq!(acks.get(), 1);
    }

    #[test]
    fn a_panic_while_the_value_is_guarded_releases_it() {
        let (g, acks) = event();
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(move || {
            let _owned_by_this_frame = g;
            panic!("between retrieving an event and recording it");
        }));
        assert!(unwound.is_err());
        assert_eq!(acks.get(), 1, "the unwinding released the value");
    }
}
