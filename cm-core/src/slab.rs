//! Generational slab: O(1) insert, remove and lookup, with stale-handle detection. Both backends
//! keep their channels and ids in one, and build their handles from its [`SlotRef`]s.
//!
//! Freed slots are reused last-in first-out, which keeps indices small and the order of reuse a
//! pure function of the calls made, as the simulator's determinism needs. A slot whose generation
//! reached `u32::MAX` is retired when freed instead of wrapping to 0, where a handle 2^32 reuses
//! old would have matched the newest value (a stale handle would read or destroy a newer id).
//! Retiring costs one empty slot per 2^32 reuses.

/// A slot reference: index plus the generation it was issued with.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct SlotRef {
    /// The slot's position in the slab.
    pub index: u32,
    /// The slot's generation when the value was stored.
    pub generation: u32,
}

impl SlotRef {
    /// A reference that never matches a live slot.
    pub const NONE: SlotRef = SlotRef {
        index: u32::MAX,
        generation: u32::MAX,
    };

    /// Whether this is [`NONE`](Self::NONE).
    #[inline]
    pub fn is_none(self) -> bool {
        self.index == u32::MAX
    }
}

struct Entry<T> {
    generation: u32,
    /// For a free slot: the slot freed before it ([`NO_FREE`]: none). The free slots form a
    /// stack through the entries themselves, where a `Vec` of indices cost each insert and
    /// each removal its length and capacity tests (and the field fits in the padding after
    /// the generation of most entries).
    next_free: u32,
    value: Option<T>,
}

/// The end of the free slots' stack: an index no slot has (it is [`SlotRef::NONE`]'s).
const NO_FREE: u32 = u32::MAX;

/// Values addressed by [`SlotRef`]: a reference to a removed value never reaches the value that
/// reuses its slot.
///
/// ```
/// use cm_core::backend::Slab;
///
/// let mut ids = Slab::new();
/// let a = ids.insert("first");
/// assert_eq!(ids.remove(a), Some("first"));
/// let b = ids.insert("second");
/// assert_eq!(b.index, a.index, "the slot is reused");
/// assert_eq!(ids.get(a), None, "the stale reference misses");
/// assert_eq!(ids.get(b), Some(&"second"));
/// ```
pub struct Slab<T> {
    entries: Vec<Entry<T>>,
    /// The most recently freed slot, the top of the free slots' stack ([`NO_FREE`]: none).
    free: u32,
    len: usize,
}

impl<T> Default for Slab<T> {
    fn default() -> Self {
        Self::new()
    }
}

impl<T> Slab<T> {
    /// An empty slab.
    pub const fn new() -> Self {
        Slab {
            entries: Vec::new(),
            free: NO_FREE,
            len: 0,
        }
    }

    /// How many values are stored.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether no value is stored.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Stores `value` in the most recently freed slot, or a new one; its reference.
    ///
    /// # Panics
    ///
    /// With 2^32 − 1 slots in use (the last index is [`SlotRef::NONE`]'s).
    #[inline(always)]
    pub fn insert(&mut self, value: T) -> SlotRef {
        self.insert_with(move || value)
    }

    /// [`insert`](Self::insert) of the value `make` builds, built where it is stored.
    ///
    /// ```
    /// use cm_core::backend::Slab;
    ///
    /// let mut slab = Slab::new();
    /// let r = slab.insert_with(|| [7u8; 200]);
    /// assert_eq!(slab.get(r).map(|v| v[199]), Some(7));
    /// ```
    ///
    /// # Panics
    ///
    /// With 2^32 − 1 slots in use (the last index is [`SlotRef::NONE`]'s).
    // A large value passed to `insert` is built on the stack and copied into its slot (a
    // `memcpy` call); `make` runs where the slot is known.
    #[inline(always)]
    pub fn insert_with(&mut self, make: impl FnOnce() -> T) -> SlotRef {
        self.len += 1;
        if self.free != NO_FREE {
            let index = self.free;
            let e = &mut self.entries[index as usize];
            self.free = e.next_free;
            e.value = Some(make());
            SlotRef {
                index,
                generation: e.generation,
            }
        } else {
            let index = u32::try_from(self.entries.len())
                .ok()
                .filter(|&i| i != NO_FREE)
                .expect("slab index overflow");
            self.entries.push(Entry {
                generation: 0,
                next_free: NO_FREE,
                value: Some(make()),
            });
            SlotRef { index, generation: 0 }
        }
    }

    /// The value `r` names, if it is still stored.
    // The simulator looks ids up several times per event and sees these only through
    // cm-core's boundary: without the hint, small as they are, some stayed calls.
    #[inline]
    pub fn get(&self, r: SlotRef) -> Option<&T> {
        match self.entries.get(r.index as usize) {
            Some(e) if e.generation == r.generation => e.value.as_ref(),
            _ => None,
        }
    }

    /// Mutable [`get`](Self::get).
    #[inline]
    pub fn get_mut(&mut self, r: SlotRef) -> Option<&mut T> {
        match self.entries.get_mut(r.index as usize) {
            Some(e) if e.generation == r.generation => e.value.as_mut(),
            _ => None,
        }
    }

    /// Whether the value `r` names is still stored.
    #[inline]
    pub fn contains(&self, r: SlotRef) -> bool {
        self.get(r).is_some()
    }

    /// The value at `index`, whatever its generation: for a caller that checked the
    /// generation already.
    #[inline]
    pub fn at(&self, index: u32) -> Option<&T> {
        self.entries.get(index as usize)?.value.as_ref()
    }

    /// Mutable [`at`](Self::at).
    #[inline]
    pub fn at_mut(&mut self, index: u32) -> Option<&mut T> {
        self.entries.get_mut(index as usize)?.value.as_mut()
    }

    /// The generation of the value at `index`; None for an empty slot.
    pub fn generation(&self, index: u32) -> Option<u32> {
        let e = self.entries.get(index as usize)?;
        e.value.as_ref().map(|_| e.generation)
    }

    /// Removes and returns the value `r` names; None when it is not stored (any more).
    pub fn remove(&mut self, r: SlotRef) -> Option<T> {
        let e = self.entries.get_mut(r.index as usize)?;
        if e.generation != r.generation {
            return None;
        }
        let value = e.value.take()?;
        self.free_slot(r.index);
        Some(value)
    }

    /// Drops the value `r` names. Unlike [`remove`](Self::remove) nothing is moved out: the
    /// caller reads the few fields it needs first, where reading them from a just-moved copy
    /// stalled on the copy's stores.
    #[inline]
    pub fn discard(&mut self, r: SlotRef) {
        if let Some(e) = self.entries.get_mut(r.index as usize) {
            if e.generation == r.generation && e.value.is_some() {
                e.value = None;
                self.free_slot(r.index);
            }
        }
    }

    /// Drops the value `r` names when `read` accepts it, and returns what `read` took from it;
    /// `None`, with the value left where it is, when `r` is stale or `read` refuses it. A
    /// check, the read and the removal in one lookup, where [`get`](Self::get) then
    /// [`discard`](Self::discard) looked the slot up twice.
    ///
    /// ```
    /// use cm_core::backend::Slab;
    ///
    /// let mut slab = Slab::new();
    /// let r = slab.insert((7u16, "seven"));
    /// assert_eq!(slab.discard_if(r, |&(n, _)| (n == 8).then_some(n)), None, "refused: kept");
    /// assert_eq!(slab.discard_if(r, |&(n, s)| (n == 7).then_some(s)), Some("seven"));
    /// assert_eq!(slab.get(r), None, "gone");
    /// assert_eq!(slab.discard_if(r, |&(n, _)| Some(n)), None, "stale");
    /// ```
    // The simulator's ack checks its event's token this way: it runs once per event.
    #[inline(always)]
    pub fn discard_if<R>(&mut self, r: SlotRef, read: impl FnOnce(&T) -> Option<R>) -> Option<R> {
        let e = self.entries.get_mut(r.index as usize)?;
        if e.generation != r.generation {
            return None;
        }
        let out = read(e.value.as_ref()?)?;
        e.value = None;
        self.free_slot(r.index);
        Some(out)
    }

    /// Removes and returns the value at `index`, whatever its generation.
    pub fn take(&mut self, index: u32) -> Option<T> {
        let value = self.entries.get_mut(index as usize)?.value.take()?;
        self.free_slot(index);
        Some(value)
    }

    /// Hands the value at `index` (any generation) to `f`, which consumes it or gives it back
    /// with an error: removed only when `f` succeeds, left in place with its generation
    /// otherwise (a destroy the system refused). None for an empty slot.
    pub fn take_with<R, E>(
        &mut self,
        index: u32,
        f: impl FnOnce(T) -> Result<R, (T, E)>,
    ) -> Option<Result<R, E>> {
        let value = self.entries.get_mut(index as usize)?.value.take()?;
        match f(value) {
            Ok(r) => {
                self.free_slot(index);
                Some(Ok(r))
            }
            Err((value, e)) => {
                self.entries[index as usize].value = Some(value);
                Some(Err(e))
            }
        }
    }

    /// References to every stored value, in index order: for sweeps over everything (a crashed
    /// host, a closing backend), never for a per-call path.
    pub fn refs(&self) -> Vec<SlotRef> {
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

    /// Indices of the occupied slots, in index order.
    pub fn indices(&self) -> Vec<u32> {
        self.refs().into_iter().map(|r| r.index).collect()
    }

    /// The stored values, in index order.
    pub fn values(&self) -> impl Iterator<Item = &T> {
        self.entries.iter().filter_map(|e| e.value.as_ref())
    }

    /// Moves a just-emptied slot to the next generation and makes it reusable, or retires it for
    /// good when its generations are used up.
    #[inline(always)]
    fn free_slot(&mut self, index: u32) {
        let e = &mut self.entries[index as usize];
        self.len -= 1;
        if let Some(next) = e.generation.checked_add(1) {
            e.generation = next;
            e.next_free = self.free;
            self.free = index;
        }
    }

    /// A slab whose first slot is free at `generation`, as 2^32 frees would leave it.
    #[cfg(test)]
    fn with_free_slot_at(generation: u32) -> Self {
        Slab {
            entries: vec![Entry {
                generation,
                next_free: NO_FREE,
                value: None,
            }],
            free: 0,
            len: 0,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// One step of a slab story and what it must answer.
    #[derive(Debug)]
    enum Step {
        /// Insert this value; expect this (index, generation).
        Insert(&'static str, (u32, u32)),
        /// Insert through `insert_with`; expect this (index, generation).
        InsertWith(&'static str, (u32, u32)),
        /// Remove through the reference of insert number `n`; expect this value.
        Remove(usize, Option<&'static str>),
        /// Discard through the reference of insert number `n`.
        Discard(usize),
        /// Take slot `index` whatever its generation; expect this value.
        Take(u32, Option<&'static str>),
        /// A take_with at `index` whose closure refuses (`false`) or consumes (`true`).
        TakeWith(u32, bool, Option<Result<&'static str, &'static str>>),
        /// The reference of insert number `n` reaches this value.
        Get(usize, Option<&'static str>),
        /// Live count and occupied indices.
        Live(usize, &'static [u32]),
    }

    use Step::*;

    fn run(mut s: Slab<&'static str>, steps: &[Step]) {
        let mut refs = Vec::new();
        for (i, step) in steps.iter().enumerate() {
            let at = format!("step {i}: {step:?}");
            match *step {
                Insert(v, want) => {
                    let r = s.insert(v);
                    assert_eq!((r.index, r.generation), want, "{at}");
                    refs.push(r);
                }
                InsertWith(v, want) => {
                    let r = s.insert_with(|| v);
                    assert_eq!((r.index, r.generation), want, "{at}");
                    refs.push(r);
                }
                Remove(n, want) => assert_eq!(s.remove(refs[n]), want, "{at}"),
                Discard(n) => s.discard(refs[n]),
                Take(index, want) => assert_eq!(s.take(index), want, "{at}"),
                TakeWith(index, consume, want) => {
                    let got = s.take_with(index, |v| if consume { Ok(v) } else { Err((v, "refused")) });
                    assert_eq!(got, want, "{at}");
                }
                Get(n, want) => {
                    assert_eq!(s.get(refs[n]).copied(), want, "{at}");
                    assert_eq!(s.get_mut(refs[n]).map(|v| *v), want, "{at}");
                    assert_eq!(s.contains(refs[n]), want.is_some(), "{at}");
                    if want.is_some() {
                        assert_eq!(s.generation(refs[n].index), Some(refs[n].generation), "{at}");
                        assert_eq!(s.at(refs[n].index).copied(), want, "{at}");
                    }
                }
                Live(len, indices) => {
                    assert_eq!((s.len(), s.is_empty()), (len, len == 0), "{at}");
                    assert_eq!(s.indices(), indices, "{at}");
                    assert_eq!(s.values().count(), len, "{at}");
                    let refs = s.refs();
                    assert!(refs.iter().all(|&r| s.contains(r)), "{at}");
                }
            }
        }
    }

    #[test]
    fn stale_references_miss_after_reuse() {
        run(
            Slab::new(),
            &[
                Insert("a", (0, 0)),
                Insert("b", (1, 0)),
                Remove(0, Some("a")),
                Get(0, None),
                Remove(0, None),
                Live(1, &[1]),
                Insert("c", (0, 1)),
                Get(0, None),
                Get(2, Some("c")),
                Get(1, Some("b")),
                Live(2, &[0, 1]),
            ],
        );
    }

    #[test]
    fn freed_slots_are_reused_last_freed_first() {
        run(
            Slab::new(),
            &[
                Insert("a", (0, 0)),
                Insert("b", (1, 0)),
                Insert("c", (2, 0)),
                Remove(0, Some("a")),
                Discard(2),
                Insert("d", (2, 1)),
                Insert("e", (0, 1)),
                Insert("f", (3, 0)),
                Live(4, &[0, 1, 2, 3]),
            ],
        );
    }

    #[test]
    fn insert_with_takes_slots_as_insert_does_new_and_freed() {
        run(
            Slab::new(),
            &[
                InsertWith("a", (0, 0)),
                Insert("b", (1, 0)),
                InsertWith("c", (2, 0)),
                Remove(0, Some("a")),
                Discard(2),
                InsertWith("d", (2, 1)),
                InsertWith("e", (0, 1)),
                Get(3, Some("d")),
                Get(4, Some("e")),
                Get(0, None),
                Live(3, &[0, 1, 2]),
            ],
        );
    }

    #[test]
    fn discard_frees_the_slot_like_remove_and_only_once() {
        run(
            Slab::new(),
            &[
                Insert("a", (0, 0)),
                Discard(0),
                Discard(0),
                Live(0, &[]),
                Get(0, None),
                Insert("b", (0, 1)),
                Discard(0),
                Get(1, Some("b")),
                Live(1, &[0]),
            ],
        );
    }

    #[test]
    fn take_ignores_the_generation_and_moves_it_on() {
        run(
            Slab::new(),
            &[
                Insert("a", (0, 0)),
                Take(0, Some("a")),
                Take(0, None),
                Take(7, None),
                Get(0, None),
                Insert("b", (0, 1)),
                Live(1, &[0]),
            ],
        );
    }

    #[test]
    fn take_with_removes_only_when_its_closure_consumes_the_value() {
        run(
            Slab::new(),
            &[
                Insert("a", (0, 0)),
                TakeWith(0, false, Some(Err("refused"))),
                Get(0, Some("a")),
                Live(1, &[0]),
                TakeWith(0, true, Some(Ok("a"))),
                Get(0, None),
                TakeWith(0, true, None),
                Live(0, &[]),
                Insert("b", (0, 1)),
            ],
        );
    }

    #[test]
    fn a_slot_whose_generations_are_used_up_is_retired_not_wrapped() {
        run(
            Slab::with_free_slot_at(u32::MAX - 1),
            &[
                Insert("a", (0, u32::MAX - 1)),
                Remove(0, Some("a")),
                Insert("b", (0, u32::MAX)),
                Discard(1),
                Live(0, &[]),
                Insert("c", (1, 0)),
                Get(0, None),
                Get(1, None),
                Remove(1, None),
                Get(2, Some("c")),
                Live(1, &[1]),
            ],
        );
    }

    #[test]
    fn take_with_retires_an_exhausted_slot_only_when_it_succeeds() {
        run(
            Slab::with_free_slot_at(u32::MAX),
            &[
                Insert("x", (0, u32::MAX)),
                TakeWith(0, false, Some(Err("refused"))),
                Get(0, Some("x")),
                TakeWith(0, true, Some(Ok("x"))),
                Live(0, &[]),
                Insert("y", (1, 0)),
            ],
        );
    }

    #[test]
    fn the_none_reference_never_matches() {
        let mut s = Slab::new();
        let a = s.insert("a");
        assert!(SlotRef::NONE.is_none() && !a.is_none());
        assert_eq!(s.get(SlotRef::NONE), None);
        assert_eq!(s.get_mut(SlotRef::NONE), None);
        assert_eq!(s.remove(SlotRef::NONE), None);
        *s.get_mut(a).unwrap() = "A";
        assert!(s.at_mut(a.index).is_some());
        assert_eq!(s.get(a), Some(&"A"));
        assert_eq!(s.generation(1), None);
        assert_eq!(s.at_mut(1), None);
    }
}
