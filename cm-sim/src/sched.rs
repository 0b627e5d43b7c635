//! The discrete-event queue: what the fabric has scheduled, popped in (time, sequence) order.
//!
//! Most of what is scheduled is a timeout of a fixed length (the IB CM's response timeout,
//! timewait) that is cancelled long before it fires. Those go to a FIFO lane per length: with
//! the clock never going back, a fixed delay makes each lane sorted by itself, so pushing and
//! popping there is O(1) and touches memory in order.
//!
//! What has a drawn delay (messages, resolutions) goes to a radix heap, which also relies on the
//! clock never going back: nothing is queued before the last time popped (what is, all the
//! same, waits in a small side list and comes out first). An entry sits in the
//! bucket of the highest bit in which its time differs from that last time and only ever moves
//! to lower buckets, so a push is an append and a pop mostly reads memory in order. (A binary
//! heap holding the 100 000 messages in flight while as many connections are made missed the
//! cache at nearly every level of every pop.)

use std::collections::VecDeque;

use crate::fifo::Fifo;

/// Where an action is queued.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Lane {
    /// The radix heap: any time from the last one popped on.
    Heap,
    /// FIFO lane `n`: every push to it is at `now + d` for one fixed `d` per lane.
    Fifo(usize),
}

/// Entries within `2^NEAR_BITS` ns of the last time popped are "near": see
/// [`Queue::take_lookahead`].
const NEAR_BITS: usize = 4;

/// How far ahead in a FIFO lane [`Queue::take_lookahead`] looks.
const FIFO_AHEAD: usize = 16;

/// FIFO lanes there are.
pub(crate) const FIFO_LANES: usize = 4;

#[derive(Clone, Copy)]
struct Entry<A> {
    time: u64,
    seq: u64,
    action: A,
}

impl<A> Entry<A> {
    fn key(&self) -> (u64, u64) {
        (self.time, self.seq)
    }
}

/// A monotone priority queue on (time, sequence).
struct RadixHeap<A> {
    /// The time last popped.
    last: u64,
    /// Entries pushed for a time before `last` (the fabric never does; a caller scheduling at an
    /// absolute time might). They come before everything else, earliest first.
    late: Vec<Entry<A>>,
    /// Entries at `last`, in sequence order.
    zero: VecDeque<Entry<A>>,
    /// `buckets[b]`: entries whose time first differs from `last` in bit `b`.
    buckets: [Vec<Entry<A>>; 64],
    /// Bit `b` set: `buckets[b]` is not empty.
    filled: u64,
    /// The earliest key in `buckets` when known: peeking finds it, a pop or removal forgets it.
    /// Peeking must not move `last` on: the clock may stop short of the earliest entry, and
    /// later pushes may then come before it.
    min: Option<(u64, u64)>,
    /// The last pop spread a bucket of `NEAR_BITS` or above out below the clock: the entries
    /// now near (in `zero` and the buckets below `NEAR_BITS`) are new there.
    refilled: bool,
}

impl<A> RadixHeap<A> {
    fn new() -> Self {
        RadixHeap {
            last: 0,
            late: Vec::new(),
            zero: VecDeque::new(),
            buckets: std::array::from_fn(|_| Vec::new()),
            filled: 0,
            min: None,
            refilled: false,
        }
    }

    fn bucket(last: u64, time: u64) -> usize {
        63 - (time ^ last).leading_zeros() as usize
    }

    fn first_filled(&self) -> Option<usize> {
        (self.filled != 0).then(|| self.filled.trailing_zeros() as usize)
    }

    fn push(&mut self, entry: Entry<A>) {
        if entry.time < self.last {
            self.late.push(entry);
            return;
        }
        if entry.time == self.last {
            // Its sequence number is the highest yet: it goes last among equal times.
            self.zero.push_back(entry);
            return;
        }
        if let Some(min) = &mut self.min {
            *min = (*min).min(entry.key());
        }
        let b = Self::bucket(self.last, entry.time);
        self.filled |= 1 << b;
        self.buckets[b].push(entry);
    }

    /// The earliest key. Entries in a lower bucket are earlier than all in higher ones, so only
    /// the first non-empty bucket is scanned, and only once per time the queue moves on.
    #[inline]
    fn peek(&mut self) -> Option<(u64, u64)> {
        if !self.late.is_empty() {
            return self.late.iter().map(Entry::key).min();
        }
        if let Some(e) = self.zero.front() {
            return Some(e.key());
        }
        if self.min.is_none() {
            self.min = self.buckets[self.first_filled()?].iter().map(Entry::key).min();
        }
        self.min
    }

    // Inlined into both callers: `pop_due` runs in the blocking calls' loop, where a call here
    // costs the raw trait's lifecycle more than the second copy of the code costs in size.
    #[inline(always)]
    fn pop(&mut self) -> Option<Entry<A>> {
        if !self.late.is_empty() {
            let (i, _) = self.late.iter().enumerate().min_by_key(|(_, e)| e.key())?;
            return Some(self.late.swap_remove(i));
        }
        if self.zero.is_empty() {
            let (time, _) = self.peek()?;
            return self.pop_buckets(time);
        }
        self.zero.pop_front()
    }

    /// [`pop`](Self::pop) when `late` and `zero` are empty and `time` is the earliest time in
    /// the buckets (what `peek` gave, nothing pushed or popped since).
    #[inline(always)]
    fn pop_buckets(&mut self, time: u64) -> Option<Entry<A>> {
        let b = self.first_filled()?;
        self.last = time;
        self.min = None;
        if self.buckets[b].len() == 1 {
            // The usual case with few entries: the one entry is the earliest, and entries
            // in higher buckets differ from the new `last` where they differed from the old.
            self.filled &= !(1 << b);
            return self.buckets[b].pop();
        }
        self.filled &= !(1 << b);
        // Every entry of bucket `b` shares the bits above `b` with the new `last`, so each
        // lands in a lower bucket, or at `last`.
        let mut moving = std::mem::take(&mut self.buckets[b]);
        for e in moving.drain(..) {
            if e.time == time {
                self.zero.push_back(e);
            } else {
                let to = Self::bucket(time, e.time);
                self.filled |= 1 << to;
                self.buckets[to].push(e);
            }
        }
        // The bucket keeps its allocation: it fills up again soon.
        self.buckets[b] = moving;
        self.zero.make_contiguous().sort_unstable_by_key(|e| e.seq);
        self.refilled = b >= NEAR_BITS;
        self.zero.pop_front()
    }

    /// The buckets `filled` marks, lowest first: the others are empty, and walking all 64
    /// cost the stale-timer check (which asks for the length) more than the rest of it.
    fn filled_buckets(filled: u64) -> impl Iterator<Item = usize> {
        let mut bits = filled;
        std::iter::from_fn(move || {
            let b = (bits != 0).then(|| bits.trailing_zeros() as usize)?;
            bits &= bits - 1;
            Some(b)
        })
    }

    fn len(&self) -> usize {
        self.late.len()
            + self.zero.len()
            + Self::filled_buckets(self.filled)
                .map(|b| self.buckets[b].len())
                .sum::<usize>()
    }

    fn retain(&mut self, mut keep: impl FnMut(&Entry<A>) -> bool) {
        self.late.retain(&mut keep);
        self.zero.retain(&mut keep);
        for n in Self::filled_buckets(self.filled) {
            let b = &mut self.buckets[n];
            b.retain(&mut keep);
            if b.is_empty() {
                self.filled &= !(1 << n);
            }
        }
        self.min = None;
    }
}

/// The earliest entry of a [`Queue`]: its time, and its lane (`None`: the heap).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Earliest {
    pub(crate) time: u64,
    lane: Option<usize>,
}

pub(crate) struct Queue<A> {
    seq: u64,
    heap: RadixHeap<A>,
    fifos: [Fifo<Entry<A>>; FIFO_LANES],
    /// The earliest key at the front of a FIFO lane, and the lane: kept as the fronts change
    /// (a push to an empty lane, a pop, a removal) so that finding the earliest entry, before
    /// every pop, does not look at each lane.
    fifo_first: Option<((u64, u64), usize)>,
    /// The lane the last pop took from, for [`take_lookahead`](Queue::take_lookahead).
    fifo_popped: Option<usize>,
    /// Entries queued: counted, since the fabric asks after every cancelled timer, and summing
    /// the heap's 64 buckets at each of those questions shows in runs at scale.
    len: usize,
    /// Whether [`take_lookahead`](Queue::take_lookahead) is asked for: only worth its cost
    /// when what the actions touch is larger than the caches.
    look_ahead: bool,
}

impl<A: Copy> Queue<A> {
    pub(crate) fn new() -> Self {
        Queue {
            seq: 0,
            heap: RadixHeap::new(),
            fifos: std::array::from_fn(|_| Fifo::new()),
            fifo_first: None,
            fifo_popped: None,
            len: 0,
            look_ahead: false,
        }
    }

    /// Queues `action` at `time`, which must not be before the last time popped; among actions
    /// of one time, the first queued comes out first.
    #[inline(always)]
    pub(crate) fn push(&mut self, time: u64, action: A, lane: Lane) {
        self.seq += 1;
        self.len += 1;
        let entry = Entry {
            time,
            seq: self.seq,
            action,
        };
        match lane {
            // A push out of order would break the lane's sorting: the heap takes it instead.
            Lane::Fifo(n) if self.fifos[n].back().is_none_or(|last| last.time <= time) => {
                if self.fifos[n].is_empty() && self.fifo_first.is_none_or(|(key, _)| entry.key() < key) {
                    self.fifo_first = Some((entry.key(), n));
                }
                self.fifos[n].push_back(entry)
            }
            _ => self.heap.push(entry),
        }
    }

    /// The earliest key and where it is: `None` for the heap, `Some(n)` for FIFO lane `n`.
    #[inline]
    fn earliest(&mut self) -> Option<((u64, u64), Option<usize>)> {
        let heap = self.heap.peek();
        match (heap, self.fifo_first) {
            (Some(h), Some((f, n))) if f < h => Some((f, Some(n))),
            (Some(h), _) => Some((h, None)),
            (None, Some((f, n))) => Some((f, Some(n))),
            (None, None) => None,
        }
    }

    /// Takes the front of FIFO lane `n` and finds the lanes' earliest front again; notes the
    /// lane for [`take_lookahead`](Queue::take_lookahead) when it holds an entry that far on.
    #[inline(always)]
    fn pop_fifo(&mut self, n: usize) -> Option<Entry<A>> {
        let entry = self.fifos[n].pop_front();
        self.find_fifo_first();
        if self.fifos[n].len() > FIFO_AHEAD {
            self.fifo_popped = Some(n);
        }
        entry
    }

    fn find_fifo_first(&mut self) {
        let mut first = None;
        for (n, fifo) in self.fifos.iter().enumerate() {
            if let Some(e) = fifo.front() {
                if first.is_none_or(|(key, _)| e.key() < key) {
                    first = Some((e.key(), n));
                }
            }
        }
        self.fifo_first = first;
    }

    /// Takes the earliest entry out if it is due by `deadline`.
    #[inline]
    pub(crate) fn pop_due(&mut self, deadline: u64) -> Option<(u64, A)> {
        let at = self.peek_earliest()?;
        if at.time > deadline {
            return None;
        }
        self.pop_earliest(at)
    }

    /// The earliest entry's time and where it is, for [`pop_earliest`](Queue::pop_earliest):
    /// an executor's step needs the time first, then, usually, the entry.
    #[inline]
    pub(crate) fn peek_earliest(&mut self) -> Option<Earliest> {
        self.earliest().map(|((time, _), lane)| Earliest { time, lane })
    }

    /// Takes out the entry `peek_earliest` found; nothing may have been pushed or popped since.
    #[inline(always)]
    pub(crate) fn pop_earliest(&mut self, at: Earliest) -> Option<(u64, A)> {
        let entry = match at.lane {
            // The search `peek_earliest` made need not be made again.
            None if self.heap.late.is_empty() && self.heap.zero.is_empty() => self.heap.pop_buckets(at.time),
            None => self.heap.pop(),
            Some(n) => self.pop_fifo(n),
        }?;
        self.len -= 1;
        Some((entry.time, entry.action))
    }

    /// Whether it is known without a search that nothing queued is due by `deadline`: true
    /// when the heap last popped at `deadline` or later and holds nothing at or before that
    /// time (what its buckets hold is later), and no FIFO lane starts by `deadline`. False
    /// says nothing: [`pop_due`](Queue::pop_due) answers then. After a step's one action at
    /// the heap's earliest time (nearly every step), this spares the search for the earliest
    /// entry that the next step makes anyway.
    pub(crate) fn surely_none_due_by(&self, deadline: u64) -> bool {
        self.heap.last >= deadline
            && self.heap.late.is_empty()
            && self.heap.zero.is_empty()
            && self.fifo_first.is_none_or(|((time, _), _)| time > deadline)
    }

    /// The time of the earliest entry, if any.
    pub(crate) fn next_time(&mut self) -> Option<u64> {
        self.earliest().map(|((time, _), _)| time)
    }

    /// Whether [`take_lookahead`](Queue::take_lookahead) has anything to give: asked after every
    /// pop, so that the usual answer, no, costs a test.
    #[inline(always)]
    pub(crate) fn has_lookahead(&self) -> bool {
        self.look_ahead && (self.heap.refilled || self.fifo_popped.is_some())
    }

    /// Turns [`has_lookahead`](Queue::has_lookahead) on or off.
    #[inline]
    pub(crate) fn set_look_ahead(&mut self, on: bool) {
        self.look_ahead = on;
    }

    /// What the pops after the last one will take, for the caller to read the memory they touch
    /// ahead of time, many reads at once rather than one cache miss after another: when the last
    /// pop moved entries to within `2^NEAR_BITS` ns of the clock, all of them (each such entry
    /// is given once), and when it took from a FIFO lane, that lane's entry `FIFO_AHEAD` places
    /// on. Empty after the first ask.
    pub(crate) fn take_lookahead(&mut self) -> impl Iterator<Item = &A> {
        let near = std::mem::take(&mut self.heap.refilled);
        let lane = self.fifo_popped.take();
        let h = &self.heap;
        let near = near.then(|| h.zero.iter().chain(h.buckets[..NEAR_BITS].iter().flatten()));
        let ahead = lane.and_then(|n| self.fifos[n].get(FIFO_AHEAD));
        near.into_iter().flatten().chain(ahead).map(|e| &e.action)
    }

    pub(crate) fn len(&self) -> usize {
        debug_assert_eq!(self.len, self.count());
        self.len
    }

    fn count(&self) -> usize {
        self.heap.len() + self.fifos.iter().map(Fifo::len).sum::<usize>()
    }

    /// Keeps only the entries `keep` says yes to; the order of the rest is unchanged.
    pub(crate) fn retain(&mut self, mut keep: impl FnMut(u64, &A) -> bool) {
        self.heap.retain(|e| keep(e.time, &e.action));
        for fifo in &mut self.fifos {
            fifo.retain(|e| keep(e.time, &e.action));
        }
        self.find_fifo_first();
        self.len = self.count();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pushes like the fabric does (mostly not before the clock, which follows the pops) and
    /// checks every pop against a sorted set of everything queued.
    #[test]
    fn pops_in_time_then_sequence_order_across_lanes() {
        let mut q = Queue::new();
        let mut model = std::collections::BTreeSet::new();
        let mut now = 0u64;
        let mut x = 0x2545_f491_4f6c_dd1du64;
        let mut rand = move || {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x
        };
        let mut popped = 0;
        for i in 0..20_000u64 {
            if i == 10_000 {
                // Removal keeps the order of the rest.
                q.retain(|_, &a| a % 7 != 0);
                model.retain(|&(_, a)| a % 7 != 0);
            }
            let (time, lane) = match rand() % 9 {
                0 => (now + 1_000, Lane::Fifo(0)),
                1 => (now + 300, Lane::Fifo(1)),
                // A clash: the same time as something else, in either lane or the heap.
                2 => (now + 300, Lane::Heap),
                3..=5 => (now + rand() % 500, Lane::Heap),
                // Now and then a time already past.
                6 => (now.saturating_sub(rand() % 100), Lane::Heap),
                _ => {
                    // Looking at an entry not due yet must not stop pushes before it.
                    let deadline = now + 50;
                    let want = model.first().copied().filter(|&(t, _)| t <= deadline);
                    assert_eq!(q.pop_due(deadline), want);
                    if let Some((t, a)) = want {
                        model.remove(&(t, a));
                        now = now.max(t);
                        popped += 1;
                    } else {
                        now += 40;
                    }
                    continue;
                }
            };
            // `i` grows with every push, so (time, i) sorts like the queue's (time, sequence).
            q.push(time, i, lane);
            model.insert((time, i));
        }
        assert_eq!(q.len(), model.len());
        while let Some(want) = model.pop_first() {
            assert_eq!(q.pop_due(u64::MAX), Some(want));
        }
        assert_eq!(q.pop_due(u64::MAX), None);
        assert!(popped > 1_000, "the run popped as it went");
    }

    #[test]
    fn look_ahead_gives_the_entries_brought_near_once() {
        let mut q = Queue::new();
        q.set_look_ahead(true);
        for (time, action) in [(1000, 1), (1001, 2), (1002, 3), (1030, 4), (5000, 5)] {
            q.push(time, action, Lane::Heap);
        }
        assert!(!q.has_lookahead(), "nothing was popped yet");
        // The first pop spreads the bucket holding 1000..1030 out below the new clock: 1001
        // and 1002 land within 16 ns of it, 1030 does not; 5000 stays far.
        assert_eq!(q.pop_due(u64::MAX), Some((1000, 1)));
        assert!(q.has_lookahead());
        assert_eq!(q.take_lookahead().copied().collect::<Vec<_>>(), vec![2, 3]);
        assert!(!q.has_lookahead(), "each entry is given once");
        assert_eq!(q.take_lookahead().count(), 0);
        assert_eq!(q.pop_due(u64::MAX), Some((1001, 2)));
        assert!(
            !q.has_lookahead(),
            "a pop within the near window brings nothing new near"
        );
        assert_eq!(q.pop_due(u64::MAX), Some((1002, 3)));
        assert_eq!(q.pop_due(u64::MAX), Some((1030, 4)));
        assert_eq!(q.pop_due(u64::MAX), Some((5000, 5)));
    }

    #[test]
    fn look_ahead_gives_a_fifo_lanes_entry_sixteen_places_on() {
        let mut q = Queue::new();
        q.set_look_ahead(true);
        for i in 0..20u64 {
            q.push(10 + i, i, Lane::Fifo(0));
        }
        assert_eq!(q.pop_due(u64::MAX), Some((10, 0)));
        assert_eq!(q.take_lookahead().copied().collect::<Vec<_>>(), vec![17]);
        for i in 1..3 {
            assert_eq!(q.pop_due(u64::MAX), Some((10 + i, i)));
            assert_eq!(q.take_lookahead().copied().collect::<Vec<_>>(), vec![i + 17]);
        }
        assert_eq!(q.pop_due(u64::MAX), Some((13, 3)));
        assert!(!q.has_lookahead(), "with 16 left there is nothing that far on");
    }

    #[test]
    fn look_ahead_is_off_until_turned_on() {
        let mut q = Queue::new();
        for (time, action) in [(1000, 1), (1001, 2), (5000, 3)] {
            q.push(time, action, Lane::Heap);
        }
        assert_eq!(q.pop_due(u64::MAX), Some((1000, 1)));
        assert!(!q.has_lookahead());
        q.set_look_ahead(true);
        assert!(
            q.has_lookahead(),
            "what the pop brought near is still there to read"
        );
    }
}
