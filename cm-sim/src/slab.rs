//! The simulator's storage: cm-core's generational slab for channels and ids, and a pool of
//! message payloads.

pub(crate) use cm_core::backend::{Slab, SlotRef};

/// A pool addressed by bare index, for values whose owners are counted (message payloads: a
/// REQ's parameters are held by the message in flight and by its sender, which sends them
/// again until answered): no generations needed, because a place is freed only when its last
/// owner lets it go, so nothing can hold a stale index.
pub(crate) struct Pool<T> {
    values: Vec<PoolEntry<T>>,
    /// The most recently freed place, the top of the free places' stack ([`NO_FREE`]: none):
    /// kept through the entries, as cm-core's slab keeps its free slots, where a `Vec` of
    /// indices cost each insert and each removal its length and capacity tests.
    free: u32,
}

struct PoolEntry<T> {
    /// For a free place: the place freed before it. For a value: how many owners share it
    /// besides the first (the field serves both: a place is either free or holds a value).
    next_free: u32,
    value: Option<T>,
}

/// The end of the free places' stack (an index no pool reaches: its values are in flight).
const NO_FREE: u32 = u32::MAX;

impl<T> Pool<T> {
    pub(crate) fn new() -> Self {
        Pool {
            values: Vec::new(),
            free: NO_FREE,
        }
    }

    pub(crate) fn insert(&mut self, value: T) -> u32 {
        if self.free != NO_FREE {
            let i = self.free;
            let e = &mut self.values[i as usize];
            self.free = e.next_free;
            e.next_free = 0;
            e.value = Some(value);
            return i;
        }
        let i = u32::try_from(self.values.len())
            .ok()
            .filter(|&i| i != NO_FREE)
            .expect("pool index overflow");
        self.values.push(PoolEntry {
            next_free: 0,
            value: Some(value),
        });
        i
    }

    /// One more owner of the value at `index` (which must hold one).
    pub(crate) fn share(&mut self, index: u32) {
        let e = &mut self.values[index as usize];
        debug_assert!(e.value.is_some(), "sharing a free place");
        e.next_free += 1;
    }

    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.values.get(index as usize).and_then(|e| e.value.as_ref())
    }

    /// One owner lets the value at `index` go; the last one drops it where it lies (for the
    /// many owners that only let a value go, which [`take`](Self::take) made move it out first).
    #[inline]
    pub(crate) fn discard(&mut self, index: u32) {
        if let Some(e) = self.values.get_mut(index as usize) {
            if e.value.is_some() {
                if e.next_free > 0 {
                    e.next_free -= 1;
                    return;
                }
                e.value = None;
                e.next_free = self.free;
                self.free = index;
            }
        }
    }

    /// The one owner of the value at `index` moves it out.
    pub(crate) fn take(&mut self, index: u32) -> Option<T> {
        let e = self.values.get_mut(index as usize)?;
        let v = e.value.take()?;
        debug_assert_eq!(e.next_free, 0, "taking a shared value whole");
        e.next_free = self.free;
        self.free = index;
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Places are reused last freed first, and a freed place answers nothing.
    #[test]
    fn a_pool_reuses_the_last_freed_place_first() {
        let mut pool = Pool::new();
        let (a, b, c) = (pool.insert("a"), pool.insert("b"), pool.insert("c"));
        assert_eq!((a, b, c), (0, 1, 2));
        assert_eq!(pool.take(a), Some("a"));
        pool.discard(c);
        pool.discard(c);
        assert_eq!(pool.take(a), None);
        assert_eq!((pool.get(a), pool.get(b), pool.get(c)), (None, Some(&"b"), None));
        assert_eq!(pool.insert("d"), c);
        assert_eq!(pool.insert("e"), a);
        assert_eq!(pool.insert("f"), 3);
        assert_eq!(pool.get(a), Some(&"e"));
    }

    /// A shared value lives until its last owner lets it go.
    #[test]
    fn a_shared_value_is_freed_by_its_last_owner() {
        let mut pool = Pool::new();
        let a = pool.insert(String::from("req"));
        pool.share(a);
        pool.share(a);
        pool.discard(a);
        pool.discard(a);
        assert_eq!(pool.get(a).map(String::as_str), Some("req"), "one owner is left");
        pool.discard(a);
        assert_eq!(pool.get(a), None);
        assert_eq!(pool.take(a), None);
        pool.discard(a);
        // The freed place is the next one handed out, unshared.
        let b = pool.insert(String::from("rep"));
        assert_eq!(b, a);
        pool.discard(b);
        assert_eq!(pool.get(b), None);
    }
}
