//! Generational slab: slots addressed by index and generation, so a handle to a removed object
//! never reaches the object that reuses its slot.

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
        let slot = self.slots.get_mut(index as usize)?;
        let value = slot.value.take()?;
        slot.generation = slot.generation.wrapping_add(1);
        self.free.push(index);
        self.len -= 1;
        Some(value)
    }

    /// Hands the object at `index` (any generation) to `f`, which consumes it or gives it back
    /// with an error; removed (generation moved on) only when `f` succeeds, left in place with
    /// its generation otherwise. None for an empty slot.
    pub(crate) fn take_with<R, E>(
        &mut self,
        index: u32,
        f: impl FnOnce(T) -> Result<R, (T, E)>,
    ) -> Option<Result<R, E>> {
        let slot = self.slots.get_mut(index as usize)?;
        let value = slot.value.take()?;
        match f(value) {
            Ok(r) => {
                slot.generation = slot.generation.wrapping_add(1);
                self.free.push(index);
                self.len -= 1;
                Some(Ok(r))
            }
            Err((value, e)) => {
                slot.value = Some(value);
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
}
