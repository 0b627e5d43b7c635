//! Generational slab: slots addressed by index and generation, so a handle to a removed object
//! never reaches the object that reuses its slot.
//!
//! A slot whose generation reaches `u32::MAX` is retired when emptied rather than reused: a
//! wrapped generation would make the handles of its first object match again, so that a stale
//! handle read and destroyed a newer id. Retiring costs one empty slot per 2^32 reuses.

/// One slot: the generation changes every time the slot is emptied.
struct Slot<T> {
    generation: u32,
    value: Option<T>,
}

/// Objects addressed by `(index, generation)`.
pub(crate) struct Slab<T> {
    slots: Vec<Slot<T>>,
    free: Vec<u32>,
    len: usize,
}

impl<T> Slab<T> {
    /// An empty slab.
    pub(crate) const fn new() -> Self {
        Slab {
            slots: Vec::new(),
            free: Vec::new(),
            len: 0,
        }
    }

    /// Stores `value`; returns its index and generation.
    pub(crate) fn insert(&mut self, value: T) -> (u32, u32) {
        self.len += 1;
        if let Some(index) = self.free.pop() {
            let slot = &mut self.slots[index as usize];
            slot.value = Some(value);
            return (index, slot.generation);
        }
        let index = u32::try_from(self.slots.len()).expect("fewer than 2^32 objects");
        self.slots.push(Slot {
            generation: 0,
            value: Some(value),
        });
        (index, 0)
    }

    /// The object at `index` if it is there and of `generation`.
    pub(crate) fn get(&self, index: u32, generation: u32) -> Option<&T> {
        let slot = self.slots.get(index as usize)?;
        if slot.generation != generation {
            return None;
        }
        slot.value.as_ref()
    }

    /// The object at `index`, whatever its generation.
    pub(crate) fn at(&self, index: u32) -> Option<&T> {
        self.slots.get(index as usize)?.value.as_ref()
    }

    /// Mutable [`at`](Self::at).
    pub(crate) fn at_mut(&mut self, index: u32) -> Option<&mut T> {
        self.slots.get_mut(index as usize)?.value.as_mut()
    }

    /// The current generation of an occupied slot.
    pub(crate) fn generation(&self, index: u32) -> Option<u32> {
        let slot = self.slots.get(index as usize)?;
        slot.value.as_ref().map(|_| slot.generation)
    }

    /// Removes and returns the object at `index` (any generation); the slot's generation moves
    /// on so that old handles stop matching.
    pub(crate) fn take(&mut self, index: u32) -> Option<T> {
        let value = self.slots.get_mut(index as usize)?.value.take()?;
        self.vacate(index);
        Some(value)
    }

    /// Bookkeeping for the slot at `index` just emptied: its generation moves on and it becomes
    /// free, or, with no generation left, it is retired (never handed out again).
    fn vacate(&mut self, index: u32) {
        let slot = &mut self.slots[index as usize];
        self.len -= 1;
        if let Some(next) = slot.generation.checked_add(1) {
            slot.generation = next;
            self.free.push(index);
        }
    }

    /// Hands the object at `index` (any generation) to `f`, which consumes it or gives it back
    /// with an error; removed (generation moved on) only when `f` succeeds, left in place with
    /// its generation otherwise. None for an empty slot.
    pub(crate) fn take_with<R, E>(
        &mut self,
        index: u32,
        f: impl FnOnce(T) -> Result<R, (T, E)>,
    ) -> Option<Result<R, E>> {
        let value = self.slots.get_mut(index as usize)?.value.take()?;
        match f(value) {
            Ok(r) => {
                self.vacate(index);
                Some(Ok(r))
            }
            Err((value, e)) => {
                self.slots[index as usize].value = Some(value);
                Some(Err(e))
            }
        }
    }

    /// How many objects are stored.
    pub(crate) fn len(&self) -> usize {
        self.len
    }

    /// Indices of the occupied slots, in index order.
    pub(crate) fn indices(&self) -> Vec<u32> {
        (0..self.slots.len() as u32)
            .filter(|&i| self.slots[i as usize].value.is_some())
            .collect()
    }

    /// Appends an empty, free slot at `generation`, so that tests reach the end of a slot's
    /// generations without 2^32 insertions.
    #[cfg(test)]
    fn push_free_slot_at(&mut self, generation: u32) -> u32 {
        let index = u32::try_from(self.slots.len()).expect("a small test slab");
        self.slots.push(Slot {
            generation,
            value: None,
        });
        self.free.push(index);
        index
    }

    /// The stored objects.
    pub(crate) fn values(&self) -> impl Iterator<Item = &T> {
        self.slots.iter().filter_map(|s| s.value.as_ref())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stale_generations_do_not_match() {
        let mut s = Slab::new();
        let (a, ga) = s.insert("a");
        let (b, gb) = s.insert("b");
        assert_eq!(s.get(a, ga), Some(&"a"));
        assert_eq!(s.take(a), Some("a"));
        assert_eq!(s.get(a, ga), None, "removed");
        assert_eq!(s.take(a), None, "twice");
        let (c, gc) = s.insert("c");
        assert_eq!(c, a, "slot reused");
        assert_ne!(gc, ga);
        assert_eq!(s.get(a, ga), None, "old handle does not see the new object");
        assert_eq!(s.get(c, gc), Some(&"c"));
        assert_eq!(s.get(b, gb), Some(&"b"));
        assert_eq!(s.get(99, 0), None);
        assert_eq!(s.len(), 2);
        assert_eq!(s.indices(), vec![0, 1]);
        assert_eq!(s.generation(c), Some(gc));
        *s.at_mut(b).unwrap() = "B";
        assert_eq!(s.at(b), Some(&"B"));
        assert_eq!(s.values().count(), 2);
        assert_eq!(
            s.take_with(b, |v| Err::<(), _>((v, "refused"))),
            Some(Err("refused"))
        );
        assert_eq!(s.get(b, gb), Some(&"B"), "kept with its generation");
        assert_eq!(s.take_with(b, Ok::<_, (&str, ())>), Some(Ok("B")));
        assert_eq!(s.get(b, gb), None);
        assert_eq!(s.len(), 1);
    }

    #[test]
    fn a_slot_whose_generations_are_exhausted_is_retired_not_wrapped() {
        let mut s = Slab::new();
        let slot = s.push_free_slot_at(u32::MAX - 1);
        let (i, g) = s.insert("old");
        assert_eq!((i, g), (slot, u32::MAX - 1));
        assert_eq!(s.take(i), Some("old"));
        let (i, last) = s.insert("last");
        assert_eq!(
            (i, last),
            (slot, u32::MAX),
            "the slot's last generation is still used"
        );
        assert_eq!(s.take(i), Some("last"));
        assert_eq!(s.len(), 0);

        // The slot is retired: the next object gets a fresh slot, so no earlier handle of the
        // retired slot (generation 0 after a wrap among them) can reach it.
        let (fresh, gf) = s.insert("new");
        assert_ne!(fresh, slot, "an exhausted slot is never reused");
        assert_eq!(gf, 0);
        for stale in [0, u32::MAX - 1, u32::MAX] {
            assert_eq!(s.get(slot, stale), None);
        }
        assert_eq!(s.take(slot), None, "a stale handle destroys nothing");
        assert_eq!(s.get(fresh, gf), Some(&"new"));
        assert_eq!(s.indices(), vec![fresh]);
    }

    #[test]
    fn take_with_retires_an_exhausted_slot_only_when_it_succeeds() {
        let mut s = Slab::new();
        let slot = s.push_free_slot_at(u32::MAX);
        let (i, g) = s.insert("x");
        assert_eq!((i, g), (slot, u32::MAX));
        assert_eq!(
            s.take_with(i, |v| Err::<(), _>((v, "refused"))),
            Some(Err("refused"))
        );
        assert_eq!(
            s.get(i, g),
            Some(&"x"),
            "a refused take keeps the object and its slot"
        );
        assert_eq!(s.take_with(i, Ok::<_, (&str, ())>), Some(Ok("x")));
        assert_eq!((s.get(i, g), s.len()), (None, 0));
        let (next, _) = s.insert("y");
        assert_ne!(next, slot, "retired after the successful take");
    }
}
