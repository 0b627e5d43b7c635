//! The simulator's storage: cm-core's generational slab for channels and ids, and a pool of
//! message payloads.

pub(crate) use cm_core::backend::{Slab, SlotRef};

/// A pool addressed by bare index, for values with exactly one owner at a time (message
/// payloads): no generations needed, because nothing can hold a stale index.
pub(crate) struct Pool<T> {
    values: Vec<PoolEntry<T>>,
    /// The most recently freed place, the top of the free places' stack ([`NO_FREE`]: none):
    /// kept through the entries, as cm-core's slab keeps its free slots, where a `Vec` of
    /// indices cost each insert and each removal its length and capacity tests.
    free: u32,
}

struct PoolEntry<T> {
    /// For a free place: the place freed before it.
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
            e.value = Some(value);
            return i;
        }
        let i = u32::try_from(self.values.len())
            .ok()
            .filter(|&i| i != NO_FREE)
            .expect("pool index overflow");
        self.values.push(PoolEntry {
            next_free: NO_FREE,
            value: Some(value),
        });
        i
    }

    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.values.get(index as usize).and_then(|e| e.value.as_ref())
    }

    /// Drops the value at `index`, if any, where it lies: for the many owners that only let a
    /// value go, which [`take`](Self::take) made move it out first.
    pub(crate) fn discard(&mut self, index: u32) {
        if let Some(e) = self.values.get_mut(index as usize) {
            if e.value.is_some() {
                e.value = None;
                e.next_free = self.free;
                self.free = index;
            }
        }
    }

    pub(crate) fn take(&mut self, index: u32) -> Option<T> {
        let e = self.values.get_mut(index as usize)?;
        let v = e.value.take()?;
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
}
