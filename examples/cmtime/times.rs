//! cmtime's bookkeeping: when each step began and ended, when each connection started the step
//! it is in, and each step's slowest and fastest connection.

use std::time::Instant;

use cm::api::IdHandle;

/// Start and end of each step for the whole run, and the slowest and fastest connection of
/// each step. The start of the step a connection is in is kept with the connection (see
/// [`Conns`]), in nanoseconds after `base`.
pub(crate) struct Times {
    pub(crate) step: [(Option<Instant>, Option<Instant>); 8],
    base: Instant,
    /// Per step: (slowest, fastest) connection in microseconds, once one finished.
    pub(crate) extremes: [Option<(f64, f64)>; 8],
}

impl Times {
    pub(crate) fn new() -> Self {
        Times {
            step: [(None, None); 8],
            base: Instant::now(),
            extremes: [None; 8],
        }
    }
    pub(crate) fn begin(&mut self, step: usize) {
        self.step[step].0 = Some(Instant::now());
    }
    pub(crate) fn end(&mut self, step: usize) {
        self.step[step].1 = Some(Instant::now());
    }
    pub(crate) fn now(&self) -> u64 {
        self.base.elapsed().as_nanos() as u64
    }
    /// A connection that started `step` at `started` finished it now.
    pub(crate) fn finish(&mut self, started: u64, step: usize) {
        self.finish_at(started, self.now(), step);
    }
    /// A connection that started `step` at `started` finished it at `at`.
    pub(crate) fn finish_at(&mut self, started: u64, at: u64, step: usize) {
        let d = at.saturating_sub(started) as f64 / 1e3;
        let e = self.extremes[step].get_or_insert((d, d));
        *e = (e.0.max(d), e.1.min(d));
    }
}

/// Microseconds from `a` to `b`.
pub(crate) fn us(a: Instant, b: Instant) -> f64 {
    b.duration_since(a).as_secs_f64() * 1e6
}

/// The client's ids in creation order, and per id (a table indexed by the handle's slot index)
/// which connection it is and when its current step started. Backends number their slots
/// densely from 0, so the table is 24 bytes per slot.
///
/// A step that ends with an event only logs, per event, the id and the time (appended in
/// order); the log is settled against the table once the step is over. At a million
/// connections the events of a step come in an order unrelated to the slots, so reading the
/// table per event missed the caches each time, one miss after another; settling reads it
/// with the entries a few places on read ahead, so that the misses overlap.
#[derive(Default)]
pub(crate) struct Conns {
    ids: Vec<IdHandle>,
    /// `by_slot[id.index()]`; `conn == u32::MAX` for a slot that is none of cmtime's ids.
    by_slot: Vec<Conn>,
    /// Connections that finished the step in progress: their id and when (as `Times::now`).
    finished: Vec<(IdHandle, u64)>,
}

#[derive(Clone, Copy)]
pub(crate) struct Conn {
    /// The id.
    id: IdHandle,
    /// Its connection's number, `u32::MAX` for none.
    pub(crate) conn: u32,
    /// When the step the connection is in started, nanoseconds after `Times::base`.
    started: u64,
}

/// How many log entries on [`Conns::settle`] reads the table ahead.
const SETTLE_AHEAD: usize = 16;

impl Conns {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Conns {
            ids: Vec::with_capacity(n),
            by_slot: Vec::with_capacity(n),
            finished: Vec::new(),
        }
    }

    pub(crate) fn push(&mut self, id: IdHandle, started: u64) {
        let slot = id.index() as usize;
        if self.by_slot.len() <= slot {
            let none = Conn {
                id,
                conn: u32::MAX,
                started: 0,
            };
            self.by_slot.resize(slot + 1, none);
        }
        let conn = u32::try_from(self.ids.len()).expect("fewer than 2^32 connections");
        self.by_slot[slot] = Conn { id, conn, started };
        self.ids.push(id);
    }

    pub(crate) fn len(&self) -> usize {
        self.ids.len()
    }

    /// Connection `c`'s id, and that it starts a step at `at` (as [`Times::now`]).
    pub(crate) fn start(&mut self, c: usize, at: u64) -> IdHandle {
        let id = self.ids[c];
        self.by_slot[id.index() as usize].started = at;
        id
    }

    /// `id`'s connection; panics for an id cmtime did not create.
    pub(crate) fn of(&self, id: IdHandle) -> &Conn {
        match self.by_slot.get(id.index() as usize) {
            Some(c) if c.conn != u32::MAX && c.id == id => c,
            _ => panic!("cmtime: an event for {id:?}, which is none of its connections"),
        }
    }

    /// `id`'s connection finished `step` (one run in a loop over the connections).
    pub(crate) fn stop(&mut self, id: IdHandle, step: usize, t: &mut Times) {
        let started = self.of(id).started;
        t.finish(started, step);
    }

    /// `id`'s connection finished the step in progress at `at` (an event said so): logged for
    /// [`settle`](Conns::settle).
    pub(crate) fn stop_later(&mut self, id: IdHandle, at: u64) {
        self.finished.push((id, at));
    }

    /// Files what [`stop_later`](Conns::stop_later) logged during `step`.
    pub(crate) fn settle(&mut self, step: usize, t: &mut Times) {
        let log = std::mem::take(&mut self.finished);
        for (i, &(id, at)) in log.iter().enumerate() {
            if let Some(&(ahead, _)) = log.get(i + SETTLE_AHEAD) {
                if let Some(c) = self.by_slot.get(ahead.index() as usize) {
                    std::hint::black_box(c.started);
                }
            }
            t.finish_at(self.of(id).started, at, step);
        }
        self.finished = log;
        self.finished.clear();
    }
}
