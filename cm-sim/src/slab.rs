//! Generational slab: O(1) insert, remove and lookup, with stale-handle detection.
//!
//! Freed slots are reused last-in first-out, which keeps indices small and the order of reuse a
//! pure function of the calls made, as determinism needs. A slot whose generation reached
//! `u32::MAX` is retired when freed instead of wrapping to 0, where a handle 2^32 reuses old
//! would have matched the newest value.

/// A slot reference: index plus the generation it was issued with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct SlotRef {
    pub(crate) index: u32,
    pub(crate) generation: u32,
}

impl SlotRef {
    /// A reference that never matches a live slot.
    pub(crate) const NONE: SlotRef = SlotRef {
        index: u32::MAX,
        generation: u32::MAX,
    };

    pub(crate) fn is_none(self) -> bool {
        self.index == u32::MAX
    }
}

struct Entry<T> {
    generation: u32,
    value: Option<T>,
}

pub(crate) struct Slab<T> {
    entries: Vec<Entry<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    pub(crate) fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn insert(&mut self, value: T) -> SlotRef {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            let e = &mut self.entries[index as usize];
            e.value = Some(value);
            SlotRef {
                index,
                generation: e.generation,
            }
        } else {
            let index = u32::try_from(self.entries.len()).expect("slab index overflow");
            self.entries.push(Entry {
                generation: 0,
                value: Some(value),
            });
            SlotRef { index, generation: 0 }
        }
    }

    pub(crate) fn get(&self, r: SlotRef) -> Option<&T> {
        match self.entries.get(r.index as usize) {
            Some(e) if e.generation == r.generation => e.value.as_ref(),
            _ => None,
        }
    }

    pub(crate) fn get_mut(&mut self, r: SlotRef) -> Option<&mut T> {
        match self.entries.get_mut(r.index as usize) {
            Some(e) if e.generation == r.generation => e.value.as_mut(),
            _ => None,
        }
    }

    pub(crate) fn contains(&self, r: SlotRef) -> bool {
        self.get(r).is_some()
    }

    /// Drops the value in its slot. Unlike [`remove`](Self::remove) nothing is moved out: the
    /// caller reads the few fields it needs first, where reading them from a just-moved copy
    /// stalled on the copy's stores.
    pub(crate) fn discard(&mut self, r: SlotRef) {
        if let Some(e) = self.entries.get_mut(r.index as usize) {
            if e.generation == r.generation && e.value.is_some() {
                e.value = None;
                self.free_slot(r.index);
            }
        }
    }

    /// References to every live value, in index order: for faults that sweep a whole host,
    /// never for a per-call path.
    pub(crate) fn refs(&self) -> Vec<SlotRef> {
        self.entries
            .iter()
            .enumerate()
            .filter(|(_, e)| e.value.is_some())
            .map(|(i, e)| SlotRef {
                index: i as u32,
                generation: e.generation,
            })
            .collect()
    }

    pub(crate) fn remove(&mut self, r: SlotRef) -> Option<T> {
        let e = self.entries.get_mut(r.index as usize)?;
        if e.generation != r.generation {
            return None;
        }
        let value = e.value.take()?;
        self.free_slot(r.index);
        Some(value)
    }

    /// Moves a just-emptied slot to the next generation and makes it reusable, or retires it
    /// for good when its generations are used up (4 bytes of slab per 2^32 frees).
    fn free_slot(&mut self, index: u32) {
        let e = &mut self.entries[index as usize];
        self.len -= 1;
        if let Some(next) = e.generation.checked_add(1) {
            e.generation = next;
            self.free.push(index);
        }
    }

    /// A slab whose first slot is free at `generation`, as 2^32 frees would leave it.
    #[cfg(test)]
    pub(crate) fn with_free_slot_at(generation: u32) -> Self {
        Slab {
            entries: vec![Entry {
                generation,
                value: None,
            }],
            free: vec![0],
            len: 0,
        }
    }
}

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

    pub(crate) fn take(&mut self, index: u32) -> Option<T> {
        let v = self.values.get_mut(index as usize)?.take()?;
        self.free.push(index);
        Some(v)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn discard_frees_the_slot_like_remove() {
        let mut s = Slab::new();
        let a = s.insert(String::from("a"));
        s.discard(a);
        s.discard(a);
        assert_eq!(s.len(), 0);
        assert!(s.get(a).is_none());
        let b = s.insert(String::from("b"));
        assert_eq!((b.index, b.generation), (a.index, a.generation + 1));
    }

    #[test]
    fn a_slot_whose_generations_are_used_up_is_retired_not_wrapped() {
        let mut s = Slab::with_free_slot_at(u32::MAX - 1);
        let a = s.insert("a");
        assert_eq!((a.index, a.generation), (0, u32::MAX - 1));
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b");
        assert_eq!((b.index, b.generation), (0, u32::MAX));
        s.discard(b);
        assert_eq!(s.len(), 0);
        let c = s.insert("c");
        assert_eq!(c.index, 1, "the exhausted slot is not reused");
        for stale in [
            a,
            b,
            SlotRef {
                index: 0,
                generation: 0,
            },
        ] {
            assert!(s.get(stale).is_none());
            assert_eq!(s.remove(stale), None);
        }
        assert_eq!(s.get(c), Some(&"c"));
        assert_eq!(s.len(), 1);
        assert_eq!(s.refs(), vec![c]);
    }

    #[test]
    fn stale_references_miss_after_reuse() {
        let mut s = Slab::new();
        let a = s.insert("a");
        assert_eq!(s.remove(a), Some("a"));
        let b = s.insert("b");
        assert_eq!(a.index, b.index);
        assert_ne!(a.generation, b.generation);
        assert!(s.get(a).is_none());
        assert_eq!(s.get(b), Some(&"b"));
        assert_eq!(s.remove(a), None);
        assert_eq!(s.len(), 1);
        assert!(s.get(SlotRef::NONE).is_none());
    }
}
