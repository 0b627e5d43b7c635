//! One event channel's driver: it owns the backend, retrieves events and completions, and
//! hands each to the mailbox of the id it concerns, waking the task that waits there.

use std::cell::{Cell, RefCell};
use std::collections::{BTreeSet, HashMap, VecDeque};
use std::hash::{BuildHasherDefault, Hasher};
use std::rc::Rc;
use std::task::Waker;

use cm_core::{
    ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, MrHandle, WorkCompletion,
};

/// What a task learns from an event. The event itself is acked as soon as the driver has
/// taken this out of it: a `CmEvent` is over 300 bytes, and keeping it unacked in a mailbox
/// until its task came cost a copy into the mailbox, one out and one into the ack, for no
/// gain (librdmacm only needs every event acked before its id is destroyed).
#[derive(Debug)]
pub(crate) struct EventInfo {
    pub(crate) ty: CmEventType,
    pub(crate) status: i32,
    pub(crate) id: IdHandle,
    pub(crate) private_data: Vec<u8>,
}

/// Events and completions of one id that its owner has not taken yet.
///
/// What nearly every id needs (one event at a time, one waiting task) is inline; the rest is
/// in [`Rare`], allocated for the ids that need it. A mailbox is moved when it is made and when
/// it is removed (and when another's removal fills its place): at 120 bytes with its id in the
/// table (at most 128), those moves are a few vector stores, where with its queues inline (176
/// bytes) each would be a call to `memcpy`.
#[derive(Default)]
pub(crate) struct Mailbox {
    /// The oldest event not taken, kept inline: an id rarely has two waiting, and a queue
    /// would allocate for the first.
    first: Option<EventInfo>,
    /// The event after `first` when it has no private data, kept inline too: a passive
    /// side's `ESTABLISHED` is still waiting when its `DISCONNECTED` comes, and queueing the
    /// second cost an allocation per connection.
    second: Option<BareEvent>,
    /// The waker of the last task that waited on the id, kept after it is woken: the same task
    /// nearly always waits again, and re-arming it then costs no reference count.
    waker: Option<Waker>,
    /// Whether `waker`'s task waits now (it is woken once per wait).
    armed: bool,
    rare: Option<Box<Rare>>,
}

/// An event without private data.
#[derive(Debug)]
struct BareEvent {
    ty: CmEventType,
    status: i32,
    id: IdHandle,
}

/// What few mailboxes need: a third event waiting (or a second with private data), completions, a second waiting task.
#[derive(Default)]
struct Rare {
    /// The events after `first` and `second`, oldest first.
    later: VecDeque<EventInfo>,
    cq: VecDeque<WorkCompletion>,
    /// Other tasks waiting on the same id (a `send` and a `recv` at once).
    more: Vec<Waker>,
}

impl Mailbox {
    fn rare(&mut self) -> &mut Rare {
        self.rare.get_or_insert_with(Box::default)
    }

    #[inline]
    fn push_event(&mut self, ev: EventInfo) {
        // Each place is used only while the ones after it are empty, so that events come out
        // in the order they came.
        let later_empty = self.rare.as_ref().is_none_or(|r| r.later.is_empty());
        if self.first.is_none() && self.second.is_none() && later_empty {
            self.first = Some(ev);
        } else if self.second.is_none() && later_empty && ev.private_data.is_empty() {
            self.second = Some(BareEvent {
                ty: ev.ty,
                status: ev.status,
                id: ev.id,
            });
        } else {
            self.rare().later.push_back(ev);
        }
    }

    #[inline]
    pub(crate) fn pop_event(&mut self) -> Option<EventInfo> {
        if let Some(ev) = self.first.take() {
            return Some(ev);
        }
        if let Some(BareEvent { ty, status, id }) = self.second.take() {
            return Some(EventInfo {
                ty,
                status,
                id,
                private_data: Vec::new(),
            });
        }
        self.rare.as_mut()?.later.pop_front()
    }

    /// Whether an event is waiting.
    #[inline]
    fn has_events(&self) -> bool {
        self.first.is_some()
            || self.second.is_some()
            || self.rare.as_ref().is_some_and(|r| !r.later.is_empty())
    }

    /// The completions taken from the CQ and not yet picked; `None` when there never were any.
    #[inline]
    pub(crate) fn cq(&mut self) -> Option<&mut VecDeque<WorkCompletion>> {
        self.rare.as_mut().map(|r| &mut r.cq)
    }

    #[inline]
    fn wake(&mut self) {
        if std::mem::take(&mut self.armed) {
            if let Some(w) = &self.waker {
                w.wake_by_ref();
            }
        }
        if let Some(r) = &mut self.rare {
            for w in r.more.drain(..) {
                w.wake();
            }
        }
    }

    #[inline]
    pub(crate) fn add_waker(&mut self, waker: &Waker) {
        match &self.waker {
            Some(w) if w.will_wake(waker) => self.armed = true,
            _ if !self.armed => {
                self.waker = Some(waker.clone());
                self.armed = true;
            }
            _ => self.add_other_waker(waker),
        }
    }

    /// A second task waiting on the id at once.
    #[cold]
    #[inline(never)]
    fn add_other_waker(&mut self, waker: &Waker) {
        let more = &mut self.rare().more;
        if !more.iter().any(|w| w.will_wake(waker)) {
            more.push(waker.clone());
        }
    }
}

/// Hashes an [`IdHandle`] (three `u32`s) in a few instructions. Mailboxes are looked up
/// several times per event; a `BTreeMap` compared handles field by field down a node, and the
/// standard hasher is built for untrusted keys, which handles a backend issued are not.
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u32(u32::from(b));
        }
    }

    fn write_u32(&mut self, n: u32) {
        self.0 = (self.0.rotate_left(5) ^ u64::from(n)).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

/// The mailboxes, found by their id's slot number: a backend hands out ids from a slab, so
/// the numbers of the ids alive on a channel are few and small, and a table indexed by them
/// answers a lookup (several per event) in a few instructions where hashing takes dozens. An
/// id whose number is far beyond the others' goes to a hash map instead, so that the table
/// stays about as long as the ids alive are many.
#[derive(Default)]
struct Boxes {
    /// `at[i]`: 1 + where in `dense` the mailbox of the id with slot number `i` is; 0: none.
    at: Vec<u32>,
    dense: Vec<(IdHandle, Mailbox)>,
    far: HashMap<IdHandle, Mailbox, BuildHasherDefault<IdHasher>>,
}

impl Boxes {
    #[inline]
    fn position(&self, id: IdHandle) -> Option<usize> {
        let p = *self.at.get(id.index() as usize)? as usize;
        (p != 0 && self.dense[p - 1].0 == id).then(|| p - 1)
    }

    #[inline]
    fn get_mut(&mut self, id: &IdHandle) -> Option<&mut Mailbox> {
        match self.position(*id) {
            Some(p) => Some(&mut self.dense[p].1),
            None if self.far.is_empty() => None,
            None => self.far_mut(id),
        }
    }

    /// Kept out of line: hashing is the rare way to a mailbox, and inlined into every lookup
    /// it made each a call.
    #[cold]
    #[inline(never)]
    fn far_mut(&mut self, id: &IdHandle) -> Option<&mut Mailbox> {
        self.far.get_mut(id)
    }

    /// `id`'s mailbox, made empty when it has none.
    fn get_or_default(&mut self, id: IdHandle) -> &mut Mailbox {
        if let Some(p) = self.position(id) {
            return &mut self.dense[p].1;
        }
        let i = id.index() as usize;
        let near = i < self.at.len() || i <= 4 * self.dense.len() + 64;
        if near && !self.far.contains_key(&id) {
            if i >= self.at.len() {
                self.at.resize(i + 1, 0);
            }
            if self.at[i] == 0 {
                self.dense.push((id, Mailbox::default()));
                self.at[i] = self.dense.len() as u32;
                return &mut self.dense.last_mut().expect("just pushed").1;
            }
        }
        // Far, or the slot number is taken by another id's mailbox (one of an id destroyed
        // behind the driver's back, until it is released).
        self.far.entry(id).or_default()
    }

    fn remove(&mut self, id: &IdHandle) -> Option<Mailbox> {
        let Some(p) = self.position(*id) else {
            return self.far.remove(id);
        };
        self.at[id.index() as usize] = 0;
        let (_, bx) = self.dense.swap_remove(p);
        if let Some((moved, _)) = self.dense.get(p) {
            self.at[moved.index() as usize] = p as u32 + 1;
        }
        Some(bx)
    }

    /// Removes `id`'s mailbox, found at `p` by [`position`](Self::position), where it lies:
    /// returned by value (as [`remove`](Self::remove) does) it would be copied out and again
    /// into its caller before being dropped.
    #[inline]
    fn discard_at(&mut self, id: IdHandle, p: usize) {
        self.at[id.index() as usize] = 0;
        let last = self.dense.len() - 1;
        if p != last {
            self.dense.swap(p, last);
            self.at[self.dense[p].0.index() as usize] = p as u32 + 1;
        }
        self.dense.truncate(last);
    }

    fn keys(&self) -> impl Iterator<Item = IdHandle> + '_ {
        self.dense
            .iter()
            .map(|(id, _)| *id)
            .chain(self.far.keys().copied())
    }
}

/// What a pass of [`Shared::pump_where`] did and left.
pub(crate) struct Pumped {
    /// Whether anything was handed out.
    pub(crate) moved: bool,
    /// Whether work besides events is left: a release deferred, or a CQ some task waits on.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) more: bool,
}

/// The backend and everything the driver tracks. Always borrowed briefly, never across an
/// `.await`.
pub(crate) struct State<B: CmBackend> {
    pub(crate) b: B,
    pub(crate) ch: ChannelHandle,
    /// Visited in handle order where the order shows (waking on failure, releasing at the
    /// end), so that runs stay deterministic.
    boxes: Boxes,
    /// Ids whose CQ a task waits on; a `BTreeSet` so that polling order is deterministic.
    cq_watch: BTreeSet<IdHandle>,
    pub(crate) failed: Option<CmError>,
    /// The task that waits for the backend's readiness (tokio), woken when a CQ joins the watch.
    pub(crate) driver: Option<Waker>,
    /// The runtime's registrations of the backend's fds; dropped before the fds close.
    pub(crate) regs: Option<Box<dyn Registrations>>,
    scratch: Vec<WorkCompletion>,
    /// Set when a CQ joins the watch: the flag [`Shared::poke`] shares.
    poke: Rc<Cell<bool>>,
    /// Emptied buffers of private data that connections held, for the next events to copy
    /// theirs into: a request's and an accept's private data (56 and 196 bytes) otherwise cost
    /// an allocation and a free per connection.
    spare: Vec<Vec<u8>>,
}

/// At most this many buffers are kept in [`State::spare`], of at most [`SPARE_LEN`] bytes each
/// (the IB CM carries at most 220 bytes of private data).
const SPARE_MAX: usize = 16;
const SPARE_LEN: usize = 256;

/// A runtime's registrations of a channel's fds (tokio's `AsyncFd`s). The driver forgets an
/// id's before destroying its QP and drops them all before destroying the channel, so that no
/// registration outlives its fd (a number the kernel may hand out again).
pub(crate) trait Registrations {
    /// Drops the registration of `id`'s CQ fd, if any.
    fn forget(&mut self, id: IdHandle);
    /// For the runtime to get its own type back.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    fn as_any_mut(&mut self) -> &mut dyn std::any::Any;
}

/// Shared by the `Cm` handle and every object made from it; the last one dropped destroys the
/// channel, so ids always go before their channel.
pub(crate) struct Shared<B: CmBackend> {
    pub(crate) st: RefCell<State<B>>,
    /// Ids whose owner was dropped while the state was borrowed; torn down at the next pump.
    pub(crate) deferred: RefCell<Vec<(IdHandle, bool)>>,
    /// Regions dropped while the state was borrowed; deregistered at the next pump.
    deferred_mrs: RefCell<Vec<MrHandle>>,
    /// Whether `deferred` or `deferred_mrs` may have some: looked at by every pump, and a flag
    /// is one load where the list took a borrow of its `RefCell` each time.
    any_deferred: Cell<bool>,
    /// Set whenever a pump gets work besides events (a release deferred, a CQ watched), so
    /// that an executor driving many channels can skip them all while it is clear. An
    /// executor may share one flag among its channels ([`Shared::set_poke`]).
    poke: RefCell<Rc<Cell<bool>>>,
    /// The parameters of the last `connect`, kept for the next with the same private data:
    /// they are a few hundred bytes to build (the private data's buffer zeroed and copied).
    pub(crate) connect_param: RefCell<Option<ConnParam>>,
}

impl<B: CmBackend> Shared<B> {
    pub(crate) fn new(mut b: B) -> Result<Self, CmError> {
        let ch = b.create_event_channel()?;
        let poke = Rc::new(Cell::new(false));
        Ok(Shared {
            st: RefCell::new(State {
                b,
                ch,
                boxes: Boxes::default(),
                cq_watch: BTreeSet::new(),
                failed: None,
                driver: None,
                regs: None,
                scratch: Vec::new(),
                poke: poke.clone(),
                spare: Vec::new(),
            }),
            deferred: RefCell::new(Vec::new()),
            deferred_mrs: RefCell::new(Vec::new()),
            any_deferred: Cell::new(false),
            poke: RefCell::new(poke),
            connect_param: RefCell::new(None),
        })
    }

    /// Makes `flag` the one set when this channel gets work besides events; it is set at once
    /// when there is some already.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    pub(crate) fn set_poke(&self, flag: Rc<Cell<bool>>) {
        self.st.borrow_mut().poke = flag.clone();
        *self.poke.borrow_mut() = flag;
        if self.has_other_work() {
            self.poke.borrow().set(true);
        }
    }

    /// Retrieves every queued event (unless `events` is false: the caller knows none is
    /// queued) and the completions tasks wait for, and wakes those tasks. Returns whether
    /// anything was handed out.
    pub(crate) fn pump(&self, events: bool) -> bool {
        self.pump_where(events, 0, |_, _| true, |_, _| true).moved
    }

    /// [`pump`](Self::pump), retrieving events only while `event_ready` says one may be queued,
    /// and polling only the watched CQs for which `cq_ready` says a poll may find something
    /// (the simulator's executor knows; a call that finds nothing is most of what a step
    /// costs). With `events`, the caller has found that `event_ready` holds: the first
    /// retrieval does not ask again. Tells, besides, whether work besides events is left
    /// ([`has_other_work`](Self::has_other_work), found under the borrow the pump holds).
    ///
    /// `known`, when not 0, is how many events the caller knows are queued on the channel
    /// (the simulator's executor: its host's count, when it is the host's only channel):
    /// that many are retrieved without asking `event_ready` in between, and after them it is
    /// not asked either unless the pump called the backend for something else (a deferred
    /// release, a refusal), which might have queued more.
    pub(crate) fn pump_where(
        &self,
        events: bool,
        known: usize,
        event_ready: impl Fn(&B, ChannelHandle) -> bool,
        cq_ready: impl Fn(&B, IdHandle) -> bool,
    ) -> Pumped {
        let mut st = self.st.borrow_mut();
        // Whether the backend may have queued events since the caller counted them.
        let mut touched = false;
        if self.any_deferred.replace(false) {
            touched = true;
            // Cleared first: a release deferred while these run sets it again.
            let deferred = std::mem::take(&mut *self.deferred.borrow_mut());
            for (id, listener) in deferred {
                st.release(id, listener);
            }
            for mr in std::mem::take(&mut *self.deferred_mrs.borrow_mut()) {
                let _ = st.b.dereg_mr(mr);
            }
        }
        let mut moved = false;
        if events && st.failed.is_none() {
            let mut first = true;
            let mut left = known;
            loop {
                let ch = st.ch;
                if !std::mem::take(&mut first) {
                    if known == 0 || touched {
                        if !event_ready(&st.b, ch) {
                            break;
                        }
                    } else if left == 0 {
                        // Every event counted is taken, and nothing else was asked of the
                        // backend: the channel is empty.
                        break;
                    }
                }
                left = left.saturating_sub(1);
                // Read and acked in one call: the event is needed only until its mailbox has
                // what the task wants of it. `delivered` tells an ack that failed after the
                // delivery (ignored, as the ack of a delivered event always was) from a
                // retrieval that failed (the channel is then failed).
                let mut delivered = None;
                let State { b, boxes, spare, .. } = &mut *st;
                let got = b.take_cm_event(ch, |ev| delivered = Some(deliver(boxes, spare, ev)));
                let orphan = match (delivered, got) {
                    (Some(orphan), _) => orphan,
                    (None, Ok(_)) => break,
                    (None, Err(e)) => {
                        st.fail(e);
                        return Pumped {
                            moved: true,
                            more: self.other_work_in(&st),
                        };
                    }
                };
                if let Some(child) = orphan {
                    touched = true;
                    st.refuse(child);
                }
                moved = true;
            }
        }
        if !st.cq_watch.is_empty() {
            // Collected first (no allocation when none is ready): polling needs the state
            // mutably, and the watch set is kept as it is for the ids that had nothing.
            let ready: Vec<IdHandle> = st
                .cq_watch
                .iter()
                .copied()
                .filter(|&id| cq_ready(&st.b, id))
                .collect();
            for id in ready {
                if st.poll_cq_into_box(id) {
                    moved = true;
                    st.cq_watch.remove(&id);
                    if let Some(bx) = st.boxes.get_mut(&id) {
                        bx.wake();
                    }
                }
            }
        }
        Pumped {
            moved,
            more: self.other_work_in(&st),
        }
    }

    /// [`has_other_work`](Self::has_other_work) with the state borrowed already.
    #[inline]
    fn other_work_in(&self, st: &State<B>) -> bool {
        !st.cq_watch.is_empty() || self.any_deferred.get()
    }

    /// Whether a pump may have work besides retrieving events: a release deferred, or a CQ
    /// some task waits on.
    #[cfg_attr(not(feature = "sim"), allow(dead_code))]
    #[inline]
    pub(crate) fn has_other_work(&self) -> bool {
        self.any_deferred.get() || !self.st.borrow().cq_watch.is_empty()
    }

    /// Tears `id` down now, or at the next pump when the state is in use.
    pub(crate) fn release(&self, id: IdHandle, listener: bool) {
        self.release_keeping(id, listener, Vec::new());
    }

    /// [`release`](Self::release), keeping `buf`'s allocation for the private data of a later
    /// event (dropped when the state is in use or enough are kept): one borrow of the state
    /// for both, as a connection's drop needs.
    pub(crate) fn release_keeping(&self, id: IdHandle, listener: bool, buf: Vec<u8>) {
        match self.st.try_borrow_mut() {
            Ok(mut st) => {
                st.release(id, listener);
                st.keep_spare(buf);
            }
            Err(_) => {
                self.deferred.borrow_mut().push((id, listener));
                self.any_deferred.set(true);
                self.poke.borrow().set(true);
            }
        }
    }
}

impl<B: CmBackend> Shared<B> {
    /// Deregisters a dropped region now, or at the next pump when the state is in use. An
    /// error (the host crashed, say) leaves nothing to release.
    pub(crate) fn dereg(&self, mr: MrHandle) {
        match self.st.try_borrow_mut() {
            Ok(mut st) => {
                let _ = st.b.dereg_mr(mr);
            }
            Err(_) => {
                self.deferred_mrs.borrow_mut().push(mr);
                self.any_deferred.set(true);
                self.poke.borrow().set(true);
            }
        }
    }
}

impl<B: CmBackend> State<B> {
    /// Keeps `buf`'s allocation for the private data of a later event, unless it has none, is
    /// larger than any, or enough are kept.
    #[inline]
    fn keep_spare(&mut self, mut buf: Vec<u8>) {
        if buf.capacity() != 0 && buf.capacity() <= SPARE_LEN && self.spare.len() < SPARE_MAX {
            buf.clear();
            self.spare.push(buf);
        }
    }

    pub(crate) fn open(&mut self, id: IdHandle) {
        self.boxes.get_or_default(id);
    }

    /// Marks the channel failed and wakes every waiting task, which then sees the failure.
    pub(crate) fn fail(&mut self, e: CmError) {
        self.failed = Some(e);
        for id in self.ids_in_order() {
            if let Some(bx) = self.boxes.get_mut(&id) {
                bx.wake();
            }
        }
    }

    /// The ids that have a mailbox, in handle order.
    fn ids_in_order(&self) -> Vec<IdHandle> {
        let mut ids: Vec<IdHandle> = self.boxes.keys().collect();
        ids.sort_unstable();
        ids
    }

    /// The ids whose CQ a task waits on.
    #[cfg_attr(not(feature = "tokio"), allow(dead_code))]
    pub(crate) fn watched(&self) -> impl Iterator<Item = IdHandle> + '_ {
        self.cq_watch.iter().copied()
    }

    pub(crate) fn mailbox(&mut self, id: IdHandle) -> Option<&mut Mailbox> {
        self.boxes.get_mut(&id)
    }

    /// `id`'s mailbox and the channel's failure, for a wait that looks at both with one
    /// lookup.
    pub(crate) fn mailbox_and_failed(&mut self, id: IdHandle) -> (Option<&mut Mailbox>, Option<&CmError>) {
        (self.boxes.get_mut(&id), self.failed.as_ref())
    }

    /// Hands `id`'s events, oldest first, to `take` until it returns something; when none is
    /// left, the channel's failure if it failed, or `Pending` with `waker` registered for the
    /// next event. The same as taking its events one by one, a look at `failed` and
    /// [`wait`](Self::wait), with one lookup of the mailbox instead of two (a task's poll is
    /// little more than this).
    pub(crate) fn next_for<T>(
        &mut self,
        id: IdHandle,
        waker: &Waker,
        mut take: impl FnMut(EventInfo) -> Option<T>,
    ) -> std::task::Poll<Result<T, CmError>> {
        use std::task::Poll;
        let failed = &self.failed;
        let Some(bx) = self.boxes.get_mut(&id) else {
            return match failed {
                Some(e) => Poll::Ready(Err(e.clone())),
                None => Poll::Pending,
            };
        };
        while let Some(ev) = bx.pop_event() {
            if let Some(v) = take(ev) {
                return Poll::Ready(Ok(v));
            }
        }
        if let Some(e) = failed {
            return Poll::Ready(Err(e.clone()));
        }
        bx.add_waker(waker);
        Poll::Pending
    }

    /// Registers `waker` to be woken when `id` gets an event (and, with `cq`, a completion).
    pub(crate) fn wait(&mut self, id: IdHandle, waker: &Waker, cq: bool) {
        if let Some(bx) = self.boxes.get_mut(&id) {
            bx.add_waker(waker);
        }
        if cq && self.cq_watch.insert(id) {
            self.poke.set(true);
            if let Some(d) = &self.driver {
                d.wake_by_ref();
            }
        }
    }

    /// Moves the completions already on `id`'s CQ into its mailbox; whether there were any.
    pub(crate) fn poll_cq_into_box(&mut self, id: IdHandle) -> bool {
        let mut got = false;
        loop {
            self.scratch.clear();
            let n = self.b.try_poll_cq(id, &mut self.scratch, 32).unwrap_or(0);
            if n == 0 {
                return got;
            }
            got = true;
            let Some(bx) = self.boxes.get_mut(&id) else {
                return got;
            };
            bx.rare().cq.extend(self.scratch.drain(..));
        }
    }

    /// Rejects and destroys a child id from a request nobody will accept.
    fn refuse(&mut self, child: IdHandle) {
        let _ = self.b.reject(child, &[]);
        self.release(child, false);
    }

    /// Releases everything `id` holds, in the order librdmacm needs: QP, events, id. Errors are
    /// ignored: on a crashed host or a removed device the handles are already gone.
    pub(crate) fn release(&mut self, id: IdHandle, listener: bool) {
        // The watch is nearly always empty (a connection watches its CQ only while it waits
        // for a completion): looked at first, it spares a call into the set's search.
        if !self.cq_watch.is_empty() {
            self.cq_watch.remove(&id);
        }
        if let Some(r) = &mut self.regs {
            r.forget(id);
        }
        let _ = self.b.destroy_qp(id);
        if let Some(p) = self.boxes.position(id) {
            let bx = &mut self.boxes.dense[p].1;
            if !bx.has_events() {
                // Nothing left to refuse: it goes where it lies.
                bx.wake();
                self.boxes.discard_at(id, p);
                let _ = self.b.destroy_id(id);
                return;
            }
        }
        if let Some(mut bx) = self.boxes.remove(&id) {
            while let Some(ev) = bx.pop_event() {
                if listener && ev.ty == CmEventType::ConnectRequest {
                    self.refuse(ev.id);
                }
            }
            bx.wake();
        }
        let _ = self.b.destroy_id(id);
    }
}

impl<B: CmBackend> Drop for State<B> {
    fn drop(&mut self) {
        let left = self.ids_in_order();
        for id in left {
            self.release(id, true);
        }
        self.regs = None;
        let _ = self.b.destroy_event_channel(self.ch);
    }
}

/// Hands what `ev` says to the mailbox of the id it is for and wakes the task waiting
/// there. Returns the child id of a request nobody owns any more, to refuse once the event
/// is acked. Takes the event by reference: a `CmEvent` is over 300 bytes, and each move of
/// it would be a copy.
fn deliver(boxes: &mut Boxes, spare: &mut Vec<Vec<u8>>, ev: &CmEvent) -> Option<IdHandle> {
    let request = ev.event() == CmEventType::ConnectRequest;
    let owner = if request {
        // The child's own events (ESTABLISHED, DISCONNECTED) must wait for whoever accepts it.
        boxes.get_or_default(ev.id());
        ev.listen_id()
    } else {
        Some(ev.id())
    };
    match owner.and_then(|o| boxes.get_mut(&o)) {
        Some(bx) => {
            let data = ev.private_data();
            let private_data = if data.is_empty() {
                Vec::new()
            } else {
                let mut v = spare.pop().unwrap_or_default();
                v.extend_from_slice(data);
                v
            };
            bx.push_event(EventInfo {
                ty: ev.event(),
                status: ev.status(),
                id: ev.id(),
                private_data,
            });
            bx.wake();
            None
        }
        // Nobody owns the id any more: the event goes back, an orphan request is refused.
        None => request.then(|| ev.id()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(status: i32) -> EventInfo {
        EventInfo {
            ty: CmEventType::Established,
            status,
            id: cm_core::backend::id_handle(1, 2, 3),
            private_data: Vec::new(),
        }
    }

    #[test]
    fn mailboxes_are_found_by_id_across_removals_far_slots_and_reused_slot_numbers() {
        use cm_core::backend::id_handle;
        let mut boxes = Boxes::default();
        let ids: Vec<IdHandle> = (0..10).map(|i| id_handle(1, i, 1)).collect();
        let far = id_handle(1, 1_000_000, 1);
        let twin = id_handle(1, 3, 2); // slot 3 again, another generation
        for (n, &id) in ids.iter().chain([&far, &twin]).enumerate() {
            boxes.get_or_default(id).push_event(info(n as i32));
        }
        assert!(!boxes.far.is_empty(), "slot 1000000 is far beyond the others");
        for &gone in &[ids[0], ids[3], ids[9]] {
            assert!(boxes.remove(&gone).is_some());
            assert!(boxes.get_mut(&gone).is_none());
            assert!(boxes.remove(&gone).is_none());
        }
        assert!(
            boxes.get_mut(&id_handle(1, 4, 7)).is_none(),
            "same slot, other generation"
        );
        let mut left: Vec<(IdHandle, i32)> = boxes
            .keys()
            .collect::<Vec<_>>()
            .into_iter()
            .map(|id| {
                (
                    id,
                    boxes
                        .get_mut(&id)
                        .and_then(|b| b.pop_event())
                        .map(|e| e.status)
                        .unwrap(),
                )
            })
            .collect();
        left.sort();
        let mut want: Vec<(IdHandle, i32)> = [1, 2, 4, 5, 6, 7, 8]
            .iter()
            .map(|&n| (ids[n], n as i32))
            .chain([(far, 10), (twin, 11)])
            .collect();
        want.sort();
        assert_eq!(left, want);
    }

    #[test]
    fn a_mailbox_discarded_where_it_lies_leaves_the_others_found_by_their_ids() {
        use cm_core::backend::id_handle;
        let mut boxes = Boxes::default();
        let ids: Vec<IdHandle> = (0..5).map(|i| id_handle(1, i, 1)).collect();
        for (n, &id) in ids.iter().enumerate() {
            boxes.get_or_default(id).push_event(info(n as i32));
        }
        // The middle one (the last moves into its place), then the last.
        for gone in [ids[1], ids[4]] {
            let p = boxes.position(gone).expect("has a mailbox");
            boxes.discard_at(gone, p);
            assert!(boxes.get_mut(&gone).is_none());
        }
        for n in [0, 2, 3] {
            let ev = boxes.get_mut(&ids[n]).and_then(Mailbox::pop_event);
            assert_eq!(ev.map(|e| e.status), Some(n as i32));
        }
        assert_eq!(boxes.dense.len(), 3);
    }

    #[test]
    fn a_mailbox_with_its_id_is_small_enough_to_move_without_a_memcpy_call() {
        // Mailboxes move when made and removed; past 128 bytes each move is a call to `memcpy`.
        assert!(std::mem::size_of::<(IdHandle, Mailbox)>() <= 128);
    }

    #[test]
    fn a_mailbox_hands_events_out_oldest_first_across_its_inline_slot_and_queue() {
        let mut bx = Mailbox::default();
        bx.push_event(info(1));
        bx.push_event(info(2));
        assert_eq!(bx.pop_event().map(|e| e.status), Some(1));
        bx.push_event(info(3));
        bx.push_event(info(4));
        let order: Vec<i32> = std::iter::from_fn(|| bx.pop_event().map(|e| e.status)).collect();
        assert_eq!(order, vec![2, 3, 4]);
        bx.push_event(info(5));
        assert_eq!(bx.pop_event().map(|e| e.status), Some(5));
        assert!(bx.pop_event().is_none());
        // With private data an event skips the inline place for bare ones, and the bare events
        // after it queue behind it.
        let with_data = |status| EventInfo {
            private_data: vec![status as u8],
            ..info(status)
        };
        bx.push_event(info(6));
        bx.push_event(with_data(7));
        bx.push_event(info(8));
        bx.push_event(with_data(9));
        let order: Vec<(i32, Vec<u8>)> =
            std::iter::from_fn(|| bx.pop_event().map(|e| (e.status, e.private_data))).collect();
        assert_eq!(order, vec![(6, vec![]), (7, vec![7]), (8, vec![]), (9, vec![9])]);
    }

    #[test]
    fn a_mailbox_wakes_each_waiting_task_once_in_the_order_they_waited() {
        use std::sync::{Arc, Mutex};
        use std::task::Wake;
        struct Tagged(u32, Arc<Mutex<Vec<u32>>>);
        impl Wake for Tagged {
            fn wake(self: Arc<Self>) {
                self.1.lock().expect("log").push(self.0);
            }
        }
        let log = Arc::new(Mutex::new(Vec::new()));
        let a = Waker::from(Arc::new(Tagged(1, log.clone())));
        let b = Waker::from(Arc::new(Tagged(2, log.clone())));
        let mut bx = Mailbox::default();
        bx.add_waker(&a);
        bx.add_waker(&b);
        bx.add_waker(&a);
        bx.add_waker(&b);
        bx.wake();
        bx.wake();
        assert_eq!(*log.lock().expect("log"), vec![1, 2]);
        bx.add_waker(&a);
        bx.wake();
        assert_eq!(
            *log.lock().expect("log"),
            vec![1, 2, 1],
            "a task waiting again is woken again"
        );
    }
}
