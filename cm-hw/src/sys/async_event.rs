//! Asynchronous device events (`ibv_get_async_event`): read from the async fd of each device
//! context a backend uses, acked at once, and routed to the backend that owns what they name.
//!
//! Every backend of a process shares librdmacm's device contexts, and so each context's one
//! async fd: the backend that reads an event is not always the one it is about (the lab's test
//! bed runs a server and a client backend in one process on one device). Reading therefore goes
//! through one process-wide router: an event about an SRQ or a QP goes to the inbox of the
//! backend that registered it ([`Inbox::own`]), an event about a port or the device to every
//! backend on that context, anything else (an object no backend knows: a CQ, an external QP) to
//! the backend that read it. An event routed to another backend wakes that backend's wait (an
//! eventfd of its own, made on its first wait).
//!
//! Each event is acked (`ibv_ack_async_event`) as soon as it is read and copied, under the
//! router's lock: `ibv_destroy_srq` and `ibv_destroy_qp` wait until every event about their
//! object is acked, so none is ever left waiting on a backend that has not asked for events.
//! Addresses serve only as keys: a routed event never dereferences the object it names, and the
//! events about an object are dropped from every inbox when the object is registered or
//! unregistered, so an address reused by a later object never inherits an old event.

use std::collections::{HashMap, HashSet, VecDeque};
use std::sync::{Mutex, MutexGuard};

use rdma_sys as ffi;

use super::{last_errno, set_nonblocking, DeviceContext, Errno, Pd};

/// Makes `fd` non-blocking unless it is already (one `fcntl` when it is).
fn ensure_nonblocking(fd: i32) -> Result<(), Errno> {
    // SAFETY: fcntl on an open fd (the caller's); F_GETFL takes no further argument.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    if flags >= 0 && flags & libc::O_NONBLOCK != 0 {
        return Ok(());
    }
    set_nonblocking(fd)
}
use crate::onesided::{element_kind, ElementKind, Subject};

/// One event as read: its raw type and what it is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawAsyncEvent {
    /// The `enum ibv_event_type` value.
    pub(crate) event_type: u32,
    /// What it names.
    pub(crate) subject: Subject,
}

/// `struct ibv_async_event` with its type as a plain integer: bindgen's Rust enum for
/// `enum ibv_event_type` could not hold a value a newer kernel adds, and reading one into it
/// would be undefined behaviour. Same layout as the C struct (checked below).
#[repr(C)]
struct CAsyncEvent {
    element: ffi::ibv_async_event_element_t,
    event_type: u32,
}

const _: () = {
    assert!(std::mem::size_of::<CAsyncEvent>() == std::mem::size_of::<ffi::ibv_async_event>());
    assert!(std::mem::align_of::<CAsyncEvent>() == std::mem::align_of::<ffi::ibv_async_event>());
};

/// A backend's queue of events, and the eventfd that wakes its wait.
#[derive(Default)]
struct Queue {
    events: VecDeque<RawAsyncEvent>,
    /// Made on the backend's first wait; closed when its inbox goes.
    wake: Option<i32>,
}

/// The process-wide routing table.
#[derive(Default)]
struct Router {
    /// Object address (SRQ or QP) → tag of the backend that owns it.
    owners: HashMap<usize, u32>,
    /// Backend tag → its queue.
    queues: HashMap<u32, Queue>,
    /// Context address → the backends using it (for port and device events).
    members: HashMap<usize, HashSet<u32>>,
}

impl Router {
    fn queue(&mut self, tag: u32) -> &mut Queue {
        self.queues.entry(tag).or_default()
    }

    /// Drops every queued event about `key`, whoever holds it.
    fn purge(&mut self, key: usize) {
        for q in self.queues.values_mut() {
            q.events
                .retain(|e| !matches!(e.subject, Subject::Qp(k) | Subject::Srq(k) if k == key));
        }
    }

    /// Queues `event` for `tag`, waking it when it is not the reader.
    fn deliver(&mut self, tag: u32, reader: u32, event: RawAsyncEvent) {
        let q = self.queue(tag);
        q.events.push_back(event);
        if tag != reader {
            if let Some(fd) = q.wake {
                wake(fd);
            }
        }
    }

    /// Routes an event read from `context` by the backend `reader`.
    fn route(&mut self, context: usize, reader: u32, event: RawAsyncEvent) {
        match event.subject {
            Subject::Qp(key) | Subject::Srq(key) => {
                let owner = self.owners.get(&key).copied().unwrap_or(reader);
                self.deliver(owner, reader, event);
            }
            Subject::Port(_) => {
                let mut tags: Vec<u32> = self
                    .members
                    .get(&context)
                    .map(|m| m.iter().copied().collect())
                    .unwrap_or_default();
                if !tags.contains(&reader) {
                    tags.push(reader);
                }
                for tag in tags {
                    self.deliver(tag, reader, event);
                }
            }
            Subject::Cq(_) | Subject::Wq(_) => self.deliver(reader, reader, event),
        }
    }
}

static ROUTER: Mutex<Option<Router>> = Mutex::new(None);

fn router() -> MutexGuard<'static, Option<Router>> {
    // Nothing panics while the lock is held but an allocation failure; the table stays usable.
    ROUTER.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

/// Runs `f` on the router, made on first use.
fn with_router<T>(f: impl FnOnce(&mut Router) -> T) -> T {
    let mut guard = router();
    f(guard.get_or_insert_with(Router::default))
}

/// Adds 1 to the eventfd `fd` (a failure only means it was already readable, or it is gone).
fn wake(fd: i32) {
    let one: u64 = 1;
    // SAFETY: `fd` is an eventfd the router keeps open while it is in the table (it is closed
    // only under the same lock, when its queue is removed); the buffer is 8 readable bytes.
    let _ = unsafe { libc::write(fd, std::ptr::from_ref(&one).cast(), 8) };
}

/// Empties the eventfd `fd` (non-blocking: returns at once when it is not readable).
fn drain_wake(fd: i32) {
    let mut count: u64 = 0;
    // SAFETY: `fd` is this backend's own eventfd, open while its inbox lives; the buffer is 8
    // writable bytes.
    let _ = unsafe { libc::read(fd, std::ptr::from_mut(&mut count).cast(), 8) };
}

/// One backend's end of the router: its tag and, once it has waited, its eventfd. Dropping it
/// removes the backend from the router (its queue, what it owned, its contexts) and closes the
/// eventfd.
pub(crate) struct Inbox {
    tag: u32,
}

impl Inbox {
    /// The inbox of the backend tagged `tag` (nothing is registered until it is used).
    pub(crate) fn new(tag: u32) -> Inbox {
        Inbox { tag }
    }

    /// Events about the object at `key` (an SRQ's or QP's address) are this backend's.
    pub(crate) fn own(&self, key: usize) {
        with_router(|r| {
            r.purge(key);
            r.owners.insert(key, self.tag);
        });
    }

    /// The object at `key` is gone (or about to be): its events are nobody's.
    pub(crate) fn disown(&self, key: usize) {
        with_router(|r| {
            r.purge(key);
            if r.owners.get(&key) == Some(&self.tag) {
                r.owners.remove(&key);
            }
        });
    }

    /// The backend uses `context` (it has a PD there): its port and device events are this
    /// backend's too.
    pub(crate) fn join(&self, context: DeviceContext) {
        with_router(|r| {
            r.members
                .entry(context.0.as_ptr() as usize)
                .or_default()
                .insert(self.tag);
        });
    }

    /// The backend no longer uses `context`.
    pub(crate) fn leave(&self, context: DeviceContext) {
        let key = context.0.as_ptr() as usize;
        with_router(|r| {
            if let Some(m) = r.members.get_mut(&key) {
                m.remove(&self.tag);
                if m.is_empty() {
                    r.members.remove(&key);
                }
            }
        });
    }

    /// The oldest event queued for this backend.
    pub(crate) fn take(&self) -> Option<RawAsyncEvent> {
        with_router(|r| r.queues.get_mut(&self.tag)?.events.pop_front())
    }

    /// Reads every event waiting on the async fd of each PD's context whose context is known to
    /// be open ([`Pd::context_open`]), acks it and routes it. Never blocks (the fds are made
    /// non-blocking: for every user of librdmacm's context in the process, which only matters
    /// to one that reads the same fd itself).
    pub(crate) fn read<'a>(&self, pds: impl Iterator<Item = &'a Pd>) -> Result<(), Errno> {
        let mut guard = router();
        let r = guard.get_or_insert_with(Router::default);
        for pd in pds.filter(|pd| pd.context_open()) {
            let ctx = pd.context();
            let key = ctx.0.as_ptr() as usize;
            // SAFETY: the context is open (checked above) while the backend holds the PD, and
            // the borrow of `pd` outlives this iteration; reading its fd field.
            let fd = unsafe { (*ctx.0.as_ptr()).async_fd };
            // Checked every time rather than remembered per context: a device removed and
            // added again may get a new context at the old address, with a blocking fd.
            ensure_nonblocking(fd)?;
            loop {
                let mut ev = std::mem::MaybeUninit::<CAsyncEvent>::zeroed();
                // SAFETY: the context is open; `ev` is a valid out-pointer of the C struct's
                // layout (CAsyncEvent, checked against bindgen's). The fd is non-blocking, so
                // this returns -1 (EAGAIN) at once when no event waits.
                let ret = unsafe { ffi::ibv_get_async_event(ctx.0.as_ptr(), ev.as_mut_ptr().cast()) };
                if ret != 0 {
                    let err = last_errno();
                    if err == libc::EAGAIN || err == libc::EWOULDBLOCK {
                        break;
                    }
                    if err == libc::EINTR {
                        continue;
                    }
                    return Err(err);
                }
                // SAFETY: ibv_get_async_event filled the struct (it started zeroed: pointers
                // and integers only, every bit pattern valid).
                let ev = unsafe { ev.assume_init() };
                let event = RawAsyncEvent {
                    event_type: ev.event_type,
                    subject: subject_of(&ev),
                };
                let mut ev = ev;
                // SAFETY: the event was just retrieved from this open context and is acked once;
                // libibverbs reads only its type and element (to count the ack on the object).
                unsafe { ffi::ibv_ack_async_event(std::ptr::from_mut(&mut ev).cast()) };
                r.route(key, self.tag, event);
            }
        }
        Ok(())
    }

    /// Waits at most `timeout_ms` for an event on any PD's context (as for [`read`]) or for
    /// another backend to route one here; `Ok(true)` when something may have come.
    /// `Err(EINTR)` when a signal interrupted the wait.
    ///
    /// [`read`]: Inbox::read
    pub(crate) fn wait<'a>(&self, pds: impl Iterator<Item = &'a Pd>, timeout_ms: i32) -> Result<bool, Errno> {
        let wake_fd = with_router(|r| -> Result<i32, Errno> {
            let q = r.queue(self.tag);
            if let Some(fd) = q.wake {
                return Ok(fd);
            }
            // SAFETY: no pointer arguments; returns a new fd or -1 with errno set.
            let fd = unsafe { libc::eventfd(0, libc::EFD_NONBLOCK | libc::EFD_CLOEXEC) };
            if fd < 0 {
                return Err(last_errno());
            }
            q.wake = Some(fd);
            Ok(fd)
        })?;
        let mut fds = vec![libc::pollfd {
            fd: wake_fd,
            events: libc::POLLIN,
            revents: 0,
        }];
        for pd in pds.filter(|pd| pd.context_open()) {
            // SAFETY: the context is open while the backend holds the PD (checked above), and
            // the fd stays open with it during the poll (the caller holds the backend).
            let fd = unsafe { (*pd.context().0.as_ptr()).async_fd };
            fds.push(libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            });
        }
        // SAFETY: `fds` is a valid array of `fds.len()` pollfds for the call.
        let n = unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, timeout_ms) };
        if n < 0 {
            return Err(last_errno());
        }
        if fds[0].revents != 0 {
            drain_wake(wake_fd);
        }
        Ok(n > 0)
    }
}

impl Drop for Inbox {
    fn drop(&mut self) {
        let tag = self.tag;
        with_router(|r| {
            if let Some(q) = r.queues.remove(&tag) {
                if let Some(fd) = q.wake {
                    // SAFETY: the eventfd was made in `wait` for this inbox and is closed once,
                    // here, under the lock every writer takes.
                    unsafe { libc::close(fd) };
                }
            }
            r.owners.retain(|_, owner| *owner != tag);
            for m in r.members.values_mut() {
                m.remove(&tag);
            }
            r.members.retain(|_, m| !m.is_empty());
        });
    }
}

/// What a retrieved event names, by the union member libibverbs filled for its type.
fn subject_of(ev: &CAsyncEvent) -> Subject {
    // SAFETY (each read): libibverbs fills the member of the union that `element_kind` names
    // for the event's type (`ibv_get_async_event`); every member is a pointer or an int, and
    // the union started zeroed, so reading the filled one is a plain read of what it wrote.
    match element_kind(ev.event_type) {
        // SAFETY: see above.
        ElementKind::Cq => Subject::Cq(unsafe { ev.element.cq } as usize),
        // SAFETY: see above.
        ElementKind::Qp => Subject::Qp(unsafe { ev.element.qp } as usize),
        // SAFETY: see above.
        ElementKind::Srq => Subject::Srq(unsafe { ev.element.srq } as usize),
        // SAFETY: see above.
        ElementKind::Wq => Subject::Wq(unsafe { ev.element.wq } as usize),
        // SAFETY: see above.
        ElementKind::Port => Subject::Port(unsafe { ev.element.port_num }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(event_type: u32, subject: Subject) -> RawAsyncEvent {
        RawAsyncEvent { event_type, subject }
    }

    fn queued(r: &Router, tag: u32) -> Vec<RawAsyncEvent> {
        r.queues
            .get(&tag)
            .map(|q| q.events.iter().copied().collect())
            .unwrap_or_default()
    }

    #[test]
    fn an_event_goes_to_the_backend_owning_its_object_whoever_reads_it() {
        let mut r = Router::default();
        let (server, client) = (1, 2);
        r.owners.insert(0x1000, server);
        let limit = event(15, Subject::Srq(0x1000));
        // The client's wait read the server's SRQ limit off the shared async fd.
        r.route(0xC0, client, limit);
        assert_eq!(queued(&r, server), [limit]);
        assert!(queued(&r, client).is_empty());
    }

    #[test]
    fn an_event_about_an_object_nobody_registered_stays_with_its_reader() {
        let mut r = Router::default();
        let fatal = event(1, Subject::Qp(0x2000));
        r.route(0xC0, 7, fatal);
        let cq = event(0, Subject::Cq(0x3000));
        r.route(0xC0, 7, cq);
        assert_eq!(queued(&r, 7), [fatal, cq]);
    }

    #[test]
    fn a_port_event_reaches_every_backend_on_the_device_once() {
        let mut r = Router::default();
        r.members.entry(0xC0).or_default().extend([1, 2]);
        let port_err = event(10, Subject::Port(1));
        r.route(0xC0, 2, port_err);
        r.route(0xD0, 3, port_err);
        assert_eq!(queued(&r, 1), [port_err]);
        assert_eq!(queued(&r, 2), [port_err], "the reader is a member: once");
        assert_eq!(queued(&r, 3), [port_err], "another device's: its reader only");
    }

    #[test]
    fn registering_an_address_again_drops_the_old_objects_events() {
        let mut r = Router::default();
        r.owners.insert(0x1000, 1);
        r.route(0xC0, 1, event(15, Subject::Srq(0x1000)));
        r.route(0xC0, 1, event(1, Subject::Qp(0x2000)));
        // The SRQ was destroyed and a new object took its address.
        r.purge(0x1000);
        assert_eq!(queued(&r, 1), [event(1, Subject::Qp(0x2000))]);
    }
}
