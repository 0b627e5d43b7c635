//! The simulator's storage: cm-core's generational slab for channels and ids, and a pool of
//! message payloads.

pub(crate) use cm_core::backend::{Slab, SlotRef};

/// A pool addressed by bare index, for values with exactly one owner at a time (message
/// payloads): no generations needed, because nothing can hold a stale index.
pub(crate) struct Pool<T> {
    values: Vec<Option<T>>,
    free: Vec<u32>,
}

impl<T> Pool<T> {
    pub(crate) fn new() -> Self {
        Pool {
            values: Vec::new(),
            free: Vec::new(),
        }
    }

    pub(crate) fn insert(&mut self, value: T) -> u32 {
        match self.free.pop() {
            Some(i) => {
                self.values[i as usize] = Some(value);
                i
            }
            None => {
                self.values.push(Some(value));
                u32::try_from(self.values.len() - 1).expect("pool index overflow")
            }
        }
    }

    pub(crate) fn get(&self, index: u32) -> Option<&T> {
        self.values.get(index as usize).and_then(Option::as_ref)
    }

    /// Drops the value at `index`, if any, where it lies: for the many owners that only let a
    /// value go, which [`take`](Self::take) made move it out first.
    pub(crate) fn discard(&mut self, index: u32) {
        if let Some(v) = self.values.get_mut(index as usize) {
            if v.is_some() {
                *v = None;
                self.free.push(index);
            }
        }
    }

    pub(crate) fn take(&mut self, index: u32) -> Option<T> {
        let v = self.values.get_mut(index as usize)?.take()?;
        self.free.push(index);
        Some(v)
    }
}
