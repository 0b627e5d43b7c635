//! A first-in first-out queue of `Copy` values on a plain `Vec` and a cursor: the channels'
//! event queues take a push and a pop per event, and `VecDeque`'s push is left a call in the
//! simulator's build where `Vec`'s is inlined.

/// A FIFO queue: pushed at the end of `items`, popped at `head`. It empties often (a channel's
/// events are retrieved as they come), and then starts again at the front; one that never
/// empties drops its popped values when its buffer is full and they are a quarter of it, so it
/// grows only when over three quarters of it are queued, to under 2.7 times what is queued (a
/// `VecDeque`, grown by doubling, holds up to twice).
#[derive(Clone, Debug)]
pub(crate) struct Fifo<T> {
    items: Vec<T>,
    /// The front's place in `items`: the values before it were popped.
    head: usize,
}

impl<T> Default for Fifo<T> {
    fn default() -> Self {
        Fifo {
            items: Vec::new(),
            head: 0,
        }
    }
}

impl<T: Copy> Fifo<T> {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    pub(crate) fn len(&self) -> usize {
        self.items.len() - self.head
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.head == self.items.len()
    }

    #[inline]
    pub(crate) fn push_back(&mut self, value: T) {
        if self.head > 0 && self.items.len() == self.items.capacity() {
            self.make_room();
        }
        self.items.push(value);
    }

    /// Before a push into a full buffer: drops the popped values from the front when they are
    /// a quarter of it or more, so that each such move of the queued values frees room for at
    /// least a third as many pushes (a few moved values per push, however the queue runs);
    /// otherwise the push grows the buffer.
    #[cold]
    #[inline(never)]
    fn make_room(&mut self) {
        if self.head >= self.items.len() / 4 {
            self.items.drain(..self.head);
            self.head = 0;
        }
    }

    #[inline]
    pub(crate) fn pop_front(&mut self) -> Option<T> {
        let value = *self.items.get(self.head)?;
        self.head += 1;
        if self.head == self.items.len() {
            self.items.clear();
            self.head = 0;
        }
        Some(value)
    }
}

impl<T> Fifo<T> {
    pub(crate) fn front(&self) -> Option<&T> {
        self.items.get(self.head)
    }

    pub(crate) fn back(&self) -> Option<&T> {
        self.items.last().filter(|_| self.head < self.items.len())
    }

    /// The value `i` places behind the front.
    pub(crate) fn get(&self, i: usize) -> Option<&T> {
        self.items.get(self.head + i)
    }

    /// The values, front first.
    pub(crate) fn iter(&self) -> std::slice::Iter<'_, T> {
        self.items[self.head..].iter()
    }

    pub(crate) fn contains(&self, value: &T) -> bool
    where
        T: PartialEq,
    {
        self.items[self.head..].contains(value)
    }

    /// Keeps only the values `keep` says yes to, in their order.
    pub(crate) fn retain(&mut self, keep: impl FnMut(&T) -> bool) {
        self.items.drain(..self.head);
        self.head = 0;
        self.items.retain(keep);
    }
}

impl<T: Copy> IntoIterator for Fifo<T> {
    type Item = T;
    type IntoIter = std::iter::Skip<std::vec::IntoIter<T>>;

    fn into_iter(self) -> Self::IntoIter {
        self.items.into_iter().skip(self.head)
    }
}

impl<T: Copy> Extend<T> for Fifo<T> {
    fn extend<I: IntoIterator<Item = T>>(&mut self, values: I) {
        for v in values {
            self.push_back(v);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::VecDeque;

    /// The same pushes and pops as a `VecDeque`, through growth, emptying and compaction, and
    /// the buffer stays within twice the peak of what is queued.
    #[test]
    fn a_fifo_pops_what_a_vecdeque_pops_and_stays_bounded() {
        let mut fifo = Fifo::new();
        let mut model = VecDeque::new();
        let mut next = 0u32;
        let mut peak = 0;
        let mut x = 12345u32;
        for round in 0..20_000 {
            x = x.wrapping_mul(1_103_515_245).wrapping_add(12345);
            // Rounds that drain, and rounds that keep a backlog of a few hundred.
            let push = if (round / 2000) % 2 == 0 {
                (x >> 16) % 8 < 4
            } else {
                (x >> 16) % 8 < 5
            };
            if push || model.len() < 300 && round % 2000 > 1000 {
                fifo.push_back(next);
                model.push_back(next);
                next += 1;
            } else {
                assert_eq!(fifo.pop_front(), model.pop_front());
            }
            assert_eq!((fifo.len(), fifo.is_empty()), (model.len(), model.is_empty()));
            peak = peak.max(model.len());
            assert!(
                fifo.items.capacity() * 3 <= 8 * peak.max(4),
                "{} for {peak}",
                fifo.items.capacity()
            );
        }
        let rest: Vec<u32> = fifo.into_iter().collect();
        assert_eq!(rest, model.into_iter().collect::<Vec<_>>());
    }

    #[test]
    fn a_fifo_reads_its_front_back_and_places_and_retains_in_order() {
        let mut fifo = Fifo::new();
        assert_eq!((fifo.front(), fifo.back(), fifo.get(0)), (None, None, None));
        fifo.extend([1, 2, 3, 4, 5, 6]);
        assert_eq!(fifo.pop_front(), Some(1));
        assert_eq!(
            (fifo.front(), fifo.back(), fifo.get(1), fifo.get(5)),
            (Some(&2), Some(&6), Some(&3), None)
        );
        assert_eq!(fifo.iter().copied().collect::<Vec<_>>(), [2, 3, 4, 5, 6]);
        assert!(fifo.contains(&2) && !fifo.contains(&1), "1 was popped");
        fifo.retain(|v| v % 2 == 0);
        assert_eq!((fifo.len(), fifo.front(), fifo.back()), (3, Some(&2), Some(&6)));
        while fifo.pop_front().is_some() {}
        assert_eq!((fifo.front(), fifo.back(), fifo.len()), (None, None, 0));
    }

    #[test]
    fn a_fifo_extended_keeps_order_and_an_empty_one_pops_nothing() {
        let mut fifo: Fifo<u8> = Fifo::default();
        assert_eq!(fifo.pop_front(), None);
        fifo.push_back(1);
        fifo.push_back(2);
        assert_eq!(fifo.pop_front(), Some(1));
        fifo.extend([3, 4, 5]);
        assert_eq!(fifo.into_iter().collect::<Vec<_>>(), [2, 3, 4, 5]);
    }
}
