//! The only module with `unsafe`: thin, checked wrappers over librdmacm and verbs (rdma-sys) and
//! the two libc calls the event loop needs.
//!
//! Every wrapper owns one C object and is created only here, so a value of the type proves the C
//! object is alive. C objects are released explicitly, in librdmacm's order, by methods that
//! consume the wrapper. Dropping a wrapper without releasing it leaks the C object, which is safe
//! — except an [`Event`]: a leaked event would make `rdma_destroy_id` of its id block forever, so
//! an event dropped unacked (a panic between retrieving and recording it, say) is acked by its
//! drop ([`Guarded`]). Releasing in the wrong order is refused, because the order is encoded in
//! reference counts rather than left to the caller:
//!
//! * every [`Id`] holds a counted reference to its [`Channel`]; [`Channel::destroy`] refuses while
//!   any exists (librdmacm would free the channel under them);
//! * every bound [`Event`] and every [`Qp`] holds a counted reference to the [`Id`] it counts
//!   against or is attached to; [`Id::destroy`] refuses while any exists (librdmacm would block
//!   forever on the unacked event, or leak the QP and later touch a freed id);
//! * every [`Qp`] holds a counted reference to its [`Pd`]; [`Pd::dealloc`] refuses while any
//!   exists, and takes a live [`Id`] on the same device as a witness that the device context the
//!   PD belongs to is still open;
//! * a [`Qp`]'s buffer is freed only after its memory region was deregistered and its QP and CQ
//!   destroyed, so the device can never write into freed memory; the same holds for a
//!   [`Region`]'s memory and an [`Srq`]'s receive slots;
//! * every [`Region`] and [`Srq`] holds a counted reference to its [`Pd`] too, and makes the PD
//!   hold its device context open ([`Pd::hold_device`]), since both outlive the ids on the
//!   device; every [`Qp`] on an SRQ holds a counted reference to the SRQ, and
//!   [`Srq::destroy`] refuses while any exists. So the order is QPs, then SRQs, then regions,
//!   then PDs, whatever order the caller tries.
//!
//! Functions return the errno as `Err(i32)`; the backend maps errnos to `CmError`.

use std::cell::{Cell, OnceCell};
use std::mem::MaybeUninit;
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::ptr::{self, NonNull};
use std::rc::Rc;

use cm_core::{ConnParam, QpCaps};
use libc::c_void;
use rdma_sys as ffi;

use crate::convert::{self, RawSockAddr};

mod async_event;
mod datagram;
mod memory;
mod srq;
pub(crate) use async_event::{Inbox, RawAsyncEvent};
pub(crate) use memory::Region;
pub(crate) use srq::Srq;

use crate::guard::Guarded;
use crate::onesided::WrShape;
use memory::SlotMemory;

mod external;
pub use external::RawId;
mod options;

mod multicast;

/// An errno value.
pub(crate) type Errno = i32;

/// The errno of the C call that just failed (read before anything else can overwrite it).
fn last_errno() -> Errno {
    match std::io::Error::last_os_error().raw_os_error() {
        Some(0) | None => libc::EIO,
        Some(e) => e,
    }
}

/// Switches `fd` to non-blocking mode, so that reading it never blocks (waiting is done with
/// `poll(2)`, bounded, or by an event loop).
fn set_nonblocking(fd: i32) -> Result<(), Errno> {
    // SAFETY: fcntl on an open fd; F_GETFL takes no further argument.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; F_SETFL takes an int.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(last_errno());
    }
    Ok(())
}

/// `poll(2)` of one fd for `POLLIN`, for at most `timeout_ms`; `Ok(true)` when readable (or in
/// error, which the next read reports). `Err(EINTR)` when a signal interrupted the wait.
pub(crate) fn poll_readable(fd: i32, timeout_ms: i32) -> Result<bool, Errno> {
    let mut pfd = libc::pollfd {
        fd,
        events: libc::POLLIN,
        revents: 0,
    };
    // SAFETY: one valid pollfd, count 1.
    let n = unsafe { libc::poll(&mut pfd, 1, timeout_ms) };
    if n < 0 {
        return Err(last_errno());
    }
    Ok(n > 0)
}

/// Maps librdmacm's `0` / `-1 + errno` convention.
fn check(ret: i32) -> Result<(), Errno> {
    if ret == 0 {
        Ok(())
    } else {
        Err(last_errno())
    }
}

// ------------------------------------------------------------------------------------------------
// Event channel

struct ChannelInner {
    ptr: NonNull<ffi::rdma_event_channel>,
}

/// An `rdma_event_channel`.
pub(crate) struct Channel {
    inner: Rc<ChannelInner>,
}

impl Channel {
    /// `rdma_create_event_channel`, with its fd switched to non-blocking mode so that retrieving
    /// an event never blocks (waiting is done with `poll(2)`, bounded).
    pub(crate) fn create() -> Result<Channel, Errno> {
        // SAFETY: no preconditions; returns NULL with errno set on failure.
        let ptr = unsafe { ffi::rdma_create_event_channel() };
        let ptr = NonNull::new(ptr).ok_or_else(last_errno)?;
        let channel = Channel {
            inner: Rc::new(ChannelInner { ptr }),
        };
        if let Err(err) = set_nonblocking(channel.fd()) {
            // No id exists on the new channel, so it can go at once.
            let _ = channel.destroy();
            return Err(err);
        }
        Ok(channel)
    }

    /// The channel's file descriptor.
    pub(crate) fn fd(&self) -> i32 {
        // SAFETY: the channel is alive while `self` exists (type invariant).
        unsafe { (*self.inner.ptr.as_ptr()).fd }
    }

    /// The channel's (non-blocking) fd, borrowed for as long as the channel.
    pub(crate) fn borrowed_fd(&self) -> BorrowedFd<'_> {
        // SAFETY: librdmacm opened the fd with the channel and closes it only in
        // rdma_destroy_event_channel, which consumes the channel: the borrow of `self` keeps the
        // fd open for the lifetime of the result.
        unsafe { BorrowedFd::borrow_raw(self.fd()) }
    }

    /// How many ids still hold the channel.
    pub(crate) fn ids(&self) -> usize {
        Rc::strong_count(&self.inner) - 1
    }

    /// `poll(2)` for `POLLIN` for at most `timeout_ms`; `Ok(true)` when readable (or in error,
    /// which the next retrieval reports). `Err(EINTR)` when a signal interrupted the wait.
    pub(crate) fn wait_readable(&self, timeout_ms: i32) -> Result<bool, Errno> {
        poll_readable(self.fd(), timeout_ms)
    }

    /// `rdma_get_cm_event` on the non-blocking fd: `Err(EAGAIN)` when nothing is queued.
    pub(crate) fn get_event(&self) -> Result<Event, Errno> {
        let mut ev: *mut ffi::rdma_cm_event = ptr::null_mut();
        // SAFETY: the channel is alive; `ev` is a valid out-pointer.
        check(unsafe { ffi::rdma_get_cm_event(self.inner.ptr.as_ptr(), &mut ev) })?;
        let ptr = NonNull::new(ev).ok_or(libc::EIO)?;
        Ok(Event {
            ptr: Guarded::new(ptr, ack_event),
            counted: None,
            child_taken: false,
        })
    }

    /// `rdma_destroy_event_channel`. Refused (the channel is handed back) while ids hold it.
    pub(crate) fn destroy(self) -> Result<(), Channel> {
        if self.ids() > 0 {
            return Err(self);
        }
        // SAFETY: the channel is alive, and no id created on it is alive (every Id holds a
        // reference, and there is none), so librdmacm frees nothing still in use.
        unsafe { ffi::rdma_destroy_event_channel(self.inner.ptr.as_ptr()) };
        Ok(())
    }
}

// ------------------------------------------------------------------------------------------------
// cm id

/// The address of an `rdma_cm_id`, the way librdmacm's events name ids: a key to find the
/// [`Id`] that owns it. Never dereferenced; only [`Id`] reaches the id through its pointer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct IdAddr(NonNull<ffi::rdma_cm_id>);

/// An open device context (`ibv_context`) as `id->verbs` names it: the key of the backend's
/// protection domain on that device. Dereferenced only here, while an id keeps it open.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub(crate) struct DeviceContext(NonNull<ffi::ibv_context>);

/// An `rdma_cm_id` in asynchronous mode.
pub(crate) struct Id {
    ptr: NonNull<ffi::rdma_cm_id>,
    /// Counted by every bound event and every QP of this id.
    anchor: Rc<()>,
    _channel: Rc<ChannelInner>,
}

impl Id {
    /// `rdma_create_id(channel, &id, NULL, ps)`.
    pub(crate) fn create(channel: &Channel, ps: u32) -> Result<Id, Errno> {
        let mut id: *mut ffi::rdma_cm_id = ptr::null_mut();
        // SAFETY: the channel is alive; `id` is a valid out-pointer; a NULL context is allowed.
        check(unsafe { ffi::rdma_create_id(channel.inner.ptr.as_ptr(), &mut id, ptr::null_mut(), ps) })?;
        let ptr = NonNull::new(id).ok_or(libc::EIO)?;
        Ok(Id {
            ptr,
            anchor: Rc::new(()),
            _channel: Rc::clone(&channel.inner),
        })
    }

    fn raw(&self) -> *mut ffi::rdma_cm_id {
        self.ptr.as_ptr()
    }

    /// The id's address, which librdmacm's events carry.
    pub(crate) fn addr(&self) -> IdAddr {
        IdAddr(self.ptr)
    }

    /// `id->verbs`; None while the id has no device.
    pub(crate) fn verbs(&self) -> Option<DeviceContext> {
        // SAFETY: the id is alive (type invariant); reading a pointer field.
        NonNull::new(unsafe { (*self.raw()).verbs }).map(DeviceContext)
    }

    /// Whether librdmacm has a QP on the id (`id->qp`).
    pub(crate) fn has_qp(&self) -> bool {
        // SAFETY: the id is alive; reading a pointer field.
        unsafe { !(*self.raw()).qp.is_null() }
    }

    /// The device's `max_qp_wr` (`ibv_query_device`); `EINVAL` when the id has no device.
    pub(crate) fn max_qp_wr(&self) -> Result<u32, Errno> {
        let ctx = self.verbs().ok_or(libc::EINVAL)?;
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: `ctx` is the live id's open device context; `attr` is a valid out-pointer.
        let ret = unsafe { ffi::ibv_query_device(ctx.0.as_ptr(), attr.as_mut_ptr()) };
        if ret != 0 {
            // verbs returns the errno itself.
            return Err(ret);
        }
        // SAFETY: ibv_query_device filled the struct (and it started zeroed: plain integers).
        let attr = unsafe { attr.assume_init() };
        Ok(u32::try_from(attr.max_qp_wr).unwrap_or(0))
    }

    /// The device's `max_srq_wr` and `max_srq_sge` (`ibv_query_device`); `EINVAL` when the
    /// id has no device.
    pub(crate) fn srq_limits(&self) -> Result<(u32, u32), Errno> {
        let ctx = self.verbs().ok_or(libc::EINVAL)?;
        let mut attr = MaybeUninit::<ffi::ibv_device_attr>::zeroed();
        // SAFETY: `ctx` is the live id's open device context; `attr` is a valid out-pointer.
        let ret = unsafe { ffi::ibv_query_device(ctx.0.as_ptr(), attr.as_mut_ptr()) };
        if ret != 0 {
            return Err(ret);
        }
        // SAFETY: ibv_query_device filled the struct (and it started zeroed: plain integers).
        let attr = unsafe { attr.assume_init() };
        let wr = u32::try_from(attr.max_srq_wr).unwrap_or(0);
        let sge = u32::try_from(attr.max_srq_sge).unwrap_or(0);
        Ok((wr, sge))
    }

    /// How many bound events and QPs refer to the id.
    pub(crate) fn holders(&self) -> usize {
        Rc::strong_count(&self.anchor) - 1
    }

    /// `rdma_bind_addr`.
    pub(crate) fn bind_addr(&self, addr: &SocketAddr) -> Result<(), Errno> {
        let mut sa = RawSockAddr::from(*addr);
        // SAFETY: the id is alive; `sa` is a properly sized sockaddr_in/sockaddr_in6 whose
        // family tells librdmacm its size; librdmacm copies it.
        check(unsafe { ffi::rdma_bind_addr(self.raw(), sa.as_mut_ptr()) })
    }

    /// `rdma_resolve_addr`; `src` None passes NULL.
    pub(crate) fn resolve_addr(
        &self,
        src: Option<&SocketAddr>,
        dst: &SocketAddr,
        timeout_ms: i32,
    ) -> Result<(), Errno> {
        let mut src = src.map(|s| RawSockAddr::from(*s));
        let src_ptr = src.as_mut().map_or(ptr::null_mut(), RawSockAddr::as_mut_ptr);
        let mut dst = RawSockAddr::from(*dst);
        // SAFETY: the id is alive; both addresses are valid sockaddrs (or NULL for src) that
        // live across the call; librdmacm copies them.
        check(unsafe { ffi::rdma_resolve_addr(self.raw(), src_ptr, dst.as_mut_ptr(), timeout_ms) })
    }

    /// `rdma_resolve_route`. Refused with `EINVAL` without a device: librdmacm would
    /// dereference the NULL `id->verbs`.
    pub(crate) fn resolve_route(&self, timeout_ms: i32) -> Result<(), Errno> {
        if self.verbs().is_none() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id is alive and has a device.
        check(unsafe { ffi::rdma_resolve_route(self.raw(), timeout_ms) })
    }

    /// `rdma_listen`.
    pub(crate) fn listen(&self, backlog: i32) -> Result<(), Errno> {
        // SAFETY: the id is alive.
        check(unsafe { ffi::rdma_listen(self.raw(), backlog) })
    }

    /// `rdma_connect` with `param`. Refused with `EINVAL` without a device (librdmacm's
    /// parameter check dereferences the device) or with private data over 255 bytes (the C
    /// length is a `u8`).
    pub(crate) fn connect(&self, param: &ConnParam) -> Result<(), Errno> {
        if self.verbs().is_none() {
            return Err(libc::EINVAL);
        }
        let mut raw = raw_conn_param(param).ok_or(libc::EINVAL)?;
        // SAFETY: the id is alive and has a device; `raw.private_data` points into `param`,
        // which outlives the call, for `private_data_len` bytes; librdmacm copies it.
        check(unsafe { ffi::rdma_connect(self.raw(), &mut raw) })
    }

    /// `rdma_accept` with `param` (never NULL: librdmacm dereferences `id->qp` for a NULL
    /// param). Refused with `EINVAL` without a device.
    pub(crate) fn accept(&self, param: &ConnParam) -> Result<(), Errno> {
        if self.verbs().is_none() {
            return Err(libc::EINVAL);
        }
        let mut raw = raw_conn_param(param).ok_or(libc::EINVAL)?;
        // SAFETY: as for connect.
        check(unsafe { ffi::rdma_accept(self.raw(), &mut raw) })
    }

    /// `rdma_reject` with `data` (NULL when empty).
    pub(crate) fn reject(&self, data: &[u8]) -> Result<(), Errno> {
        let len = u8::try_from(data.len()).map_err(|_| libc::EINVAL)?;
        let p = if data.is_empty() {
            ptr::null()
        } else {
            data.as_ptr().cast::<c_void>()
        };
        // SAFETY: the id is alive; `p` is NULL or valid for `len` bytes across the call.
        check(unsafe { ffi::rdma_reject(self.raw(), p, len) })
    }

    /// `rdma_disconnect`.
    pub(crate) fn disconnect(&self) -> Result<(), Errno> {
        // SAFETY: the id is alive; librdmacm checks `verbs` itself and fails with EINVAL.
        check(unsafe { ffi::rdma_disconnect(self.raw()) })
    }

    /// `rdma_get_local_addr`: the source address in `id->route.addr`.
    pub(crate) fn local_addr(&self) -> Option<SocketAddr> {
        // SAFETY: the id is alive; the union is a sockaddr_storage, large enough for any of
        // its members, and `read_sockaddr` looks at the family before reading a member.
        unsafe { read_sockaddr(ptr::addr_of!((*self.raw()).route.addr.src_addr_union).cast()) }
    }

    /// `rdma_get_peer_addr`: the destination address in `id->route.addr`.
    pub(crate) fn peer_addr(&self) -> Option<SocketAddr> {
        // SAFETY: as for local_addr.
        unsafe { read_sockaddr(ptr::addr_of!((*self.raw()).route.addr.dst_addr_union).cast()) }
    }

    /// `rdma_destroy_id`. Refused with `EBUSY` while an event or a QP refers to the id (the
    /// first would make librdmacm block forever, the second leak the QP); the id is handed back
    /// with the errno when refused or when librdmacm fails.
    pub(crate) fn destroy(self) -> Result<(), (Id, Errno)> {
        if self.holders() > 0 || self.has_qp() {
            return Err((self, libc::EBUSY));
        }
        // SAFETY: the id is alive, has no QP and no event retrieved through this module is
        // unacked for it (each would hold `anchor`), so librdmacm neither blocks nor leaks.
        match check(unsafe { ffi::rdma_destroy_id(self.raw()) }) {
            Ok(()) => Ok(()),
            Err(e) => Err((self, e)),
        }
    }
}

/// Reads an IPv4 or IPv6 socket address; None for any other family (unset, AF_IB).
///
/// # Safety
/// `sa` must point to readable memory of at least `sizeof(struct sockaddr_storage)` bytes.
unsafe fn read_sockaddr(sa: *const libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the caller guarantees `sa` is readable storage; the family is at offset 0 in
    // every sockaddr, and each member is read only after its family was seen.
    unsafe {
        match i32::from((*sa).ss_family) {
            libc::AF_INET => Some(convert::sockaddr_in_to_std(&*sa.cast::<libc::sockaddr_in>())),
            libc::AF_INET6 => Some(convert::sockaddr_in6_to_std(&*sa.cast::<libc::sockaddr_in6>())),
            _ => None,
        }
    }
}

/// `struct rdma_conn_param` for `param`, pointing into its private data; None if the private
/// data does not fit the C `u8` length.
fn raw_conn_param(param: &ConnParam) -> Option<ffi::rdma_conn_param> {
    let data = param.private_data.as_slice();
    if param.private_data.len() != data.len() {
        return None;
    }
    let len = u8::try_from(data.len()).ok()?;
    Some(ffi::rdma_conn_param {
        private_data: if data.is_empty() {
            ptr::null()
        } else {
            data.as_ptr().cast()
        },
        private_data_len: len,
        responder_resources: param.responder_resources,
        initiator_depth: param.initiator_depth,
        flow_control: param.flow_control,
        retry_count: param.retry_count,
        rnr_retry_count: param.rnr_retry_count,
        srq: u8::from(param.srq),
        qp_num: param.qp_num,
    })
}

// ------------------------------------------------------------------------------------------------
// Events

/// The plain fields of a retrieved event.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct EventData {
    /// `event->id`.
    pub(crate) id: Option<IdAddr>,
    /// `event->listen_id` (None when NULL).
    pub(crate) listen_id: Option<IdAddr>,
    /// `event->event`.
    pub(crate) event: u32,
    /// `event->status`.
    pub(crate) status: i32,
    /// `event->param.conn` (or the common fields of `param.ud`).
    pub(crate) param: ConnParam,
}

/// A retrieved `rdma_cm_event`, not yet acked. Acked by [`ack`](Event::ack), or by its drop
/// when it is dropped unacked (see the module docs).
pub(crate) struct Event {
    /// Declared first, so that a dropped event is acked before `counted` lets its id go.
    ptr: Guarded<NonNull<ffi::rdma_cm_event>, i32>,
    /// The anchor of the id the event counts against, once bound.
    counted: Option<Rc<()>>,
    child_taken: bool,
}

/// `rdma_ack_cm_event`: the release of an [`Event`]'s guard, so it runs exactly once per event.
fn ack_event(ev: &mut NonNull<ffi::rdma_cm_event>) -> i32 {
    // SAFETY: the event is alive and acked once (the guard runs its release once). librdmacm
    // touches the id it counts against, which is alive: librdmacm hands out no event for a
    // destroyed id, and `rdma_destroy_id` of that id cannot have returned since, because it
    // waits for this ack. A bound event keeps Id::destroy from even being called; an unbound
    // one exists only inside the backend's retrieval of it, where no id is destroyed, and is
    // dropped there (acked here) when that retrieval unwinds.
    unsafe { ffi::rdma_ack_cm_event(ev.as_ptr()) }
}

impl Event {
    fn raw(&self) -> *mut ffi::rdma_cm_event {
        self.ptr.get().as_ptr()
    }

    /// The event type's raw value.
    pub(crate) fn event_type(&self) -> u32 {
        // SAFETY: the event is alive until acked (type invariant).
        unsafe { (*self.raw()).event }
    }

    /// The event's fields. `ud` selects `param.ud` (datagram port spaces) over `param.conn`,
    /// as librdmacm fills one or the other by the id's QP type.
    pub(crate) fn data(&self, ud: bool) -> EventData {
        let ev = self.raw();
        // SAFETY: the event is alive; only its own fields are read (pointer values, not their
        // targets). The private-data pointer, when not NULL, points into the event's own
        // allocation for `private_data_len` bytes (librdmacm copies the data there); u8 lengths
        // cannot exceed that 256-byte buffer.
        unsafe {
            let (pd_ptr, pd_len) = if ud {
                let u = &(*ev).param.ud;
                (u.private_data, u.private_data_len)
            } else {
                let c = &(*ev).param.conn;
                (c.private_data, c.private_data_len)
            };
            let private: &[u8] = if pd_ptr.is_null() || pd_len == 0 {
                &[]
            } else {
                std::slice::from_raw_parts(pd_ptr.cast::<u8>(), usize::from(pd_len))
            };
            let param = if ud {
                convert::conn_param_from_ud(private, (*ev).param.ud.qp_num)
            } else {
                let c = &(*ev).param.conn;
                convert::conn_param_from_conn(
                    private,
                    [
                        c.responder_resources,
                        c.initiator_depth,
                        c.flow_control,
                        c.retry_count,
                        c.rnr_retry_count,
                        c.srq,
                    ],
                    c.qp_num,
                )
            };
            EventData {
                id: NonNull::new((*ev).id).map(IdAddr),
                listen_id: NonNull::new((*ev).listen_id).map(IdAddr),
                event: (*ev).event,
                status: (*ev).status,
                param,
            }
        }
    }

    /// The address of the id the event counts against: the listener for `CONNECT_REQUEST`
    /// (librdmacm's `evt->id_priv`), the event's id otherwise.
    pub(crate) fn counted_addr(&self) -> Option<IdAddr> {
        let ev = self.raw();
        // SAFETY: the event is alive; reading its own fields.
        let counted = unsafe {
            if (*ev).event == ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
                && !(*ev).listen_id.is_null()
            {
                (*ev).listen_id
            } else {
                (*ev).id
            }
        };
        NonNull::new(counted).map(IdAddr)
    }

    /// Binds the event to the id it counts against; false (nothing bound) if `id` is not that
    /// id. A bound event keeps [`Id::destroy`] from running until it is acked.
    pub(crate) fn bind(&mut self, id: &Id) -> bool {
        if self.counted_addr() != Some(id.addr()) || self.counted.is_some() {
            return false;
        }
        self.counted = Some(Rc::clone(&id.anchor));
        true
    }

    /// Takes ownership of the child id a `CONNECT_REQUEST` created (librdmacm puts it on the
    /// listener's channel, the one the event came from). At most once per event; None for
    /// other events, or when `channel` is not the child's channel.
    pub(crate) fn take_child(&mut self, channel: &Channel) -> Option<Id> {
        if self.child_taken || self.event_type() != ffi::rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST {
            return None;
        }
        // SAFETY: the event is alive; for CONNECT_REQUEST `event->id` is the child librdmacm
        // just created, alive until rdma_destroy_id, which only the Id taken here can call.
        let child = unsafe { (*self.raw()).id };
        let ptr = NonNull::new(child)?;
        // SAFETY: the child is alive (above); reading its channel pointer.
        let child_channel = unsafe { (*ptr.as_ptr()).channel };
        if child_channel != channel.inner.ptr.as_ptr() {
            return None;
        }
        self.child_taken = true;
        Some(Id {
            ptr,
            anchor: Rc::new(()),
            _channel: Rc::clone(&channel.inner),
        })
    }

    /// `rdma_ack_cm_event`: frees the event and releases the id it counted against.
    pub(crate) fn ack(self) -> Result<(), Errno> {
        let Event { ptr, counted, .. } = self;
        let ret = ptr.finish();
        // Only now may the id be destroyed.
        drop(counted);
        check(ret)
    }
}

// ------------------------------------------------------------------------------------------------
// Protection domain

struct PdInner {
    ptr: NonNull<ffi::ibv_pd>,
    context: DeviceContext,
    /// The device's `max_qp_wr` once queried: every QP checks against it, and a query is a
    /// kernel call.
    max_qp_wr: Cell<Option<u32>>,
    /// Held from the first memory region or SRQ on the PD until the PD is deallocated: those
    /// outlive the ids on the device, so they cannot count on an id to keep the context open.
    /// Declared after `ptr`, and only dropped once `ibv_dealloc_pd` has run (or the PD leaks).
    device: OnceCell<DeviceRef>,
}

/// librdmacm's device list (`rdma_get_devices`), held: librdmacm counts a reference on every
/// device context in it and closes a context only when its count is 0 (`remove_cma_dev`, for a
/// device that went away), so every context in the list stays open until the list is freed
/// (`rdma_free_devices`, in `Drop`).
struct DeviceRef {
    list: NonNull<*mut ffi::ibv_context>,
}

impl DeviceRef {
    /// The device list, if it holds `context`; `ENODEV` when it does not (a device librdmacm
    /// has seen go away is not in the list).
    fn acquire(context: DeviceContext) -> Result<DeviceRef, Errno> {
        let mut n: i32 = 0;
        // SAFETY: no preconditions; `n` is a valid out-pointer. NULL (no device, or out of
        // memory) holds nothing.
        let list = unsafe { ffi::rdma_get_devices(&mut n) };
        let held = DeviceRef {
            list: NonNull::new(list).ok_or(libc::ENODEV)?,
        };
        let mut at = held.list.as_ptr();
        loop {
            // SAFETY: the list is NULL-terminated and alive until `held` is dropped; `at` never
            // passes the terminator (the loop ends there).
            let ctx = unsafe { *at };
            if ctx.is_null() {
                return Err(libc::ENODEV);
            }
            if ctx == context.0.as_ptr() {
                return Ok(held);
            }
            // SAFETY: `ctx` was not the terminator, so the next entry exists.
            at = unsafe { at.add(1) };
        }
    }
}

impl Drop for DeviceRef {
    fn drop(&mut self) {
        // SAFETY: the list came from rdma_get_devices and is freed once (this drop).
        unsafe { ffi::rdma_free_devices(self.list.as_ptr()) };
    }
}

/// A protection domain on one device context.
pub(crate) struct Pd {
    inner: Rc<PdInner>,
}

impl Pd {
    /// `ibv_alloc_pd(id->verbs)`; `EINVAL` when the id has no device.
    pub(crate) fn alloc(id: &Id) -> Result<Pd, Errno> {
        let ctx = id.verbs().ok_or(libc::EINVAL)?;
        // SAFETY: `ctx` is the live id's device context, opened by librdmacm and kept open at
        // least as long as the id exists.
        let pd = unsafe { ffi::ibv_alloc_pd(ctx.0.as_ptr()) };
        let ptr = NonNull::new(pd).ok_or_else(last_errno)?;
        Ok(Pd {
            inner: Rc::new(PdInner {
                ptr,
                context: ctx,
                max_qp_wr: Cell::new(None),
                device: OnceCell::new(),
            }),
        })
    }

    /// Keeps the PD's device context open for as long as the PD lives, whatever happens to the
    /// ids on the device (see [`DeviceRef`]); done once, by the first region or SRQ. `ENODEV`
    /// when librdmacm no longer lists the device.
    pub(crate) fn hold_device(&self) -> Result<(), Errno> {
        if self.inner.device.get().is_none() {
            let held = DeviceRef::acquire(self.inner.context)?;
            let _ = self.inner.device.set(held);
        }
        Ok(())
    }

    /// Whether the PD's device context is known to be open: a QP on it holds an id on the
    /// device (which keeps it open), or the PD holds the device itself.
    pub(crate) fn context_open(&self) -> bool {
        self.users() > 0 || self.inner.device.get().is_some()
    }

    /// The device's `max_qp_wr` as remembered by [`Pd::remember_max_qp_wr`].
    pub(crate) fn max_qp_wr(&self) -> Option<u32> {
        self.inner.max_qp_wr.get()
    }

    /// Remembers the device's `max_qp_wr` (from [`Id::max_qp_wr`]) for the PD's lifetime.
    pub(crate) fn remember_max_qp_wr(&self, max_qp_wr: u32) {
        self.inner.max_qp_wr.set(Some(max_qp_wr));
    }

    /// The device context the PD belongs to.
    pub(crate) fn context(&self) -> DeviceContext {
        self.inner.context
    }

    /// How many QPs, memory regions and SRQs use the PD.
    pub(crate) fn users(&self) -> usize {
        Rc::strong_count(&self.inner) - 1
    }

    /// `ibv_dealloc_pd`. Refused with `EBUSY` while QPs, regions or SRQs use it, and with
    /// `EINVAL` unless the device context is known to be open: the PD holds the device
    /// ([`hold_device`](Pd::hold_device)), or `witness` is a live id on the PD's device. The
    /// device hold, if any, is let go only after the PD is gone.
    pub(crate) fn dealloc(self, witness: Option<&Id>) -> Result<(), (Pd, Errno)> {
        if self.users() > 0 {
            return Err((self, libc::EBUSY));
        }
        let open = self.inner.device.get().is_some()
            || witness.is_some_and(|w| w.verbs() == Some(self.inner.context));
        if !open {
            return Err((self, libc::EINVAL));
        }
        // SAFETY: the PD is alive, unused by any QP, MR or SRQ of ours, and its context is open
        // (held by the PD, or the witness id is alive on it).
        let ret = unsafe { ffi::ibv_dealloc_pd(self.inner.ptr.as_ptr()) };
        if ret == 0 {
            // Dropping the only reference drops the device hold, after the PD.
            Ok(())
        } else {
            // verbs returns the errno itself.
            Err((self, ret))
        }
    }
}

// ------------------------------------------------------------------------------------------------
// QP with its completion queue and registered buffers

/// The most completions one [`Qp::poll`] retrieves.
pub(crate) const POLL_BATCH: usize = 16;

/// One completion as polled: the internal wr_id (slot), status, opcode, length and immediate.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct RawCompletion {
    /// The wr_id the request was posted with (the slot index, or an SRQ's tagged slot).
    pub(crate) wr_id: u64,
    /// `ibv_wc_status` value.
    pub(crate) status: u32,
    /// `ibv_wc_opcode` value (defined only for a success).
    pub(crate) opcode: u32,
    /// `byte_len`.
    pub(crate) byte_len: u32,
    /// `wc_flags`.
    pub(crate) wc_flags: u32,
    /// `imm_data`, in network byte order (meaningful with `IBV_WC_WITH_IMM`).
    pub(crate) imm_data: u32,
    /// Who sent it (successful receives on a UD QP).
    pub(crate) sender: Option<cm_core::UdSender>,
}

impl RawCompletion {
    /// The fields that decide what the completion hands out.
    pub(crate) fn polled(&self) -> crate::onesided::Polled {
        crate::onesided::Polled {
            status: self.status,
            opcode: self.opcode,
            byte_len: self.byte_len,
            wc_flags: self.wc_flags,
            imm_data: self.imm_data,
        }
    }
}

/// The capabilities librdmacm wrote back.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct GrantedCaps {
    pub(crate) max_send_wr: u32,
    pub(crate) max_recv_wr: u32,
    pub(crate) max_send_sge: u32,
    pub(crate) max_recv_sge: u32,
    pub(crate) max_inline_data: u32,
}

/// A QP made by `rdma_create_qp` on an id, with its own completion queue (shared by sends and
/// receives), the CQ's completion channel, and `slots` message slots of `slot_size` bytes,
/// registered on the first post (see [`memory`]).
///
/// Release order: every CQ event retrieved from the completion channel is acked at once (in
/// [`Qp::rearm`]), so none is outstanding when the CQ is destroyed (`ibv_destroy_cq` would wait
/// for it forever); the completion channel goes after the CQ that uses it (`ibv_destroy_comp_channel`
/// refuses while a CQ does).
pub(crate) struct Qp {
    qp: NonNull<ffi::ibv_qp>,
    cq: NonNull<ffi::ibv_cq>,
    comp: NonNull<ffi::ibv_comp_channel>,
    /// Whether the completion channel's fd was made non-blocking: on its first use (`cq_fd`,
    /// `rearm`), which keeps two `fcntl`s out of the creation of a QP that never waits.
    comp_nonblocking: Cell<bool>,
    /// None until the first post.
    mem: Option<SlotMemory>,
    slot_size: usize,
    slots: u32,
    id_anchor: Rc<()>,
    pd: Pd,
    /// QPs on an SRQ: the SRQ's counted reference, held until the QP is destroyed.
    _srq: Option<Rc<()>>,
    /// UD QPs only: their port and address handles.
    ud: Option<Box<datagram::UdState>>,
}

/// Undo for a failed creation: releases what exists, in reverse order, leaking where a release
/// fails.
fn undo_create(comp: NonNull<ffi::ibv_comp_channel>, cq: Option<NonNull<ffi::ibv_cq>>) {
    if let Some(cq) = cq {
        // SAFETY: the CQ was created here, no QP uses it (creation failed) and no CQ event was
        // retrieved from it (nothing was posted).
        if unsafe { ffi::ibv_destroy_cq(cq.as_ptr()) } != 0 {
            return;
        }
    }
    // SAFETY: the channel was created here and the only CQ on it is gone (above).
    let _ = unsafe { ffi::ibv_destroy_comp_channel(comp.as_ptr()) };
}

impl Qp {
    /// Creates a CQ of `cqe` entries, then
    /// `rdma_create_qp(id, pd, attr)` with that CQ for both queues and `caps`' counts; returns
    /// the QP and the caps librdmacm wrote back. With `srq` the QP takes its receives from it
    /// (`attr.srq`; its own receive queue gets no work requests). `EINVAL` when the id has no
    /// device, already has a QP, or `pd` or `srq` belongs to another device.
    pub(crate) fn create(
        id: &Id,
        pd: &Pd,
        caps: &QpCaps,
        slots: u32,
        cqe: i32,
        srq: Option<&Srq>,
    ) -> Result<(Qp, GrantedCaps), Errno> {
        if id.verbs() != Some(pd.context()) || id.has_qp() {
            return Err(libc::EINVAL);
        }
        if srq.is_some_and(|s| s.context() != pd.context()) {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id is alive; reading its QP type and port.
        let (qp_type, port_num) = unsafe { ((*id.raw()).qp_type, (*id.raw()).port_num) };
        let ud = qp_type == ffi::ibv_qp_type::IBV_QPT_UD;
        // A UD receive buffer holds the 40-byte GRH in front of the payload.
        let slot_size = caps.max_message_size as usize + if ud { cm_core::GRH_LEN } else { 0 };
        // The slots are registered on the first post (`memory`); their size is checked now.
        slot_size.checked_mul(slots as usize).ok_or(libc::ENOMEM)?;
        // SAFETY: the context is the live id's device context, open while the id exists.
        let comp = unsafe { ffi::ibv_create_comp_channel(pd.context().0.as_ptr()) };
        let Some(comp) = NonNull::new(comp) else {
            return Err(last_errno());
        };
        // SAFETY: the context is the live id's device context; the completion channel is alive
        // on the same context and outlives the CQ (destroyed after it).
        let cq =
            unsafe { ffi::ibv_create_cq(pd.context().0.as_ptr(), cqe, ptr::null_mut(), comp.as_ptr(), 0) };
        let Some(cq) = NonNull::new(cq) else {
            let err = last_errno();
            undo_create(comp, None);
            return Err(err);
        };
        // Not armed yet: the first `rearm` (when a poll finds nothing) does it, which keeps a
        // kernel call out of every QP's creation.
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: srq.map_or(ptr::null_mut(), Srq::raw),
            cap: ffi::ibv_qp_cap {
                max_send_wr: caps.max_send_wr,
                // A QP on an SRQ has no receive queue of its own (verbs ignores these then).
                max_recv_wr: if srq.is_some() { 0 } else { caps.max_recv_wr },
                max_send_sge: caps.max_send_sge,
                max_recv_sge: if srq.is_some() { 0 } else { caps.max_recv_sge },
                max_inline_data: caps.max_inline_data,
            },
            qp_type,
            sq_sig_all: 0,
        };
        // SAFETY: the id is alive with a device and no QP; the PD (and the SRQ, if any) belong
        // to its device and stay alive while the QP does (it holds both); the attr is valid and
        // names our CQ, so librdmacm creates no CQs of its own.
        if let Err(err) = check(unsafe { ffi::rdma_create_qp(id.raw(), pd.inner.ptr.as_ptr(), &mut attr) }) {
            undo_create(comp, Some(cq));
            return Err(err);
        }
        // SAFETY: rdma_create_qp succeeded, so `id->qp` is the new QP.
        let Some(qp) = NonNull::new(unsafe { (*id.raw()).qp }) else {
            return Err(libc::EIO);
        };
        let granted = GrantedCaps {
            max_send_wr: attr.cap.max_send_wr,
            max_recv_wr: attr.cap.max_recv_wr,
            max_send_sge: attr.cap.max_send_sge,
            max_recv_sge: attr.cap.max_recv_sge,
            max_inline_data: attr.cap.max_inline_data,
        };
        Ok((
            Qp {
                qp,
                cq,
                comp,
                comp_nonblocking: Cell::new(false),
                mem: None,
                slot_size,
                slots,
                id_anchor: Rc::clone(&id.anchor),
                pd: Pd {
                    inner: Rc::clone(&pd.inner),
                },
                _srq: srq.map(Srq::anchor),
                ud: ud.then(|| Box::new(datagram::UdState::new(port_num))),
            },
            granted,
        ))
    }

    /// Whether the QP is in ERR as libibverbs last set it (`qp->state`, updated by every
    /// `ibv_modify_qp`, including librdmacm's).
    pub(crate) fn in_error(&self) -> bool {
        // SAFETY: the QP is alive (destroyed only by consuming `self`); reading a plain field.
        let state = unsafe { (*self.qp.as_ptr()).state };
        state == ffi::ibv_qp_state::IBV_QPS_ERR
    }

    /// The QP's state as libibverbs last set it (`qp->state`, updated by every `ibv_modify_qp`,
    /// librdmacm's included).
    #[cfg(feature = "differential")]
    pub(crate) fn state(&self) -> cm_core::QpState {
        use cm_core::QpState;
        use ffi::ibv_qp_state::*;
        // SAFETY: the QP is alive (destroyed only by consuming `self`); reading a plain field.
        match unsafe { (*self.qp.as_ptr()).state } {
            IBV_QPS_RESET => QpState::Reset,
            IBV_QPS_INIT => QpState::Init,
            IBV_QPS_RTR => QpState::Rtr,
            IBV_QPS_RTS => QpState::Rts,
            // SQD, SQE and unknown states: none of them lets work through as RTS would.
            _ => QpState::Err,
        }
    }

    /// The device context of the QP's PD.
    pub(crate) fn context(&self) -> DeviceContext {
        self.pd.context()
    }

    /// The slots' memory, registered now if this is the first post; its lkey.
    fn register_slots(&mut self) -> Result<u32, Errno> {
        if let Some(mem) = &self.mem {
            return Ok(mem.lkey());
        }
        // The product was checked in `create`.
        let mem = SlotMemory::register(&self.pd, self.slot_size * self.slots as usize)?;
        let lkey = mem.lkey();
        self.mem = Some(mem);
        Ok(lkey)
    }

    /// Where `len` bytes of slot `slot` start; `EINVAL` when out of bounds or nothing was
    /// posted yet (the slots are not allocated).
    fn slot_ptr(&self, slot: u32, len: usize) -> Result<*mut u8, Errno> {
        if slot >= self.slots || len > self.slot_size {
            return Err(libc::EINVAL);
        }
        let mem = self.mem.as_ref().ok_or(libc::EINVAL)?;
        // In bounds: slot * slot_size + len <= slots * slot_size = the allocation's length.
        Ok(mem.base().wrapping_add(slot as usize * self.slot_size))
    }

    /// Copies `data` into send slot `slot` and posts a signalled SEND of it (one SGE; none for
    /// an empty message), with `slot` as the work request id.
    pub(crate) fn post_send(&mut self, slot: u32, data: &[u8]) -> Result<(), Errno> {
        let lkey = self.register_slots()?;
        let dst = self.slot_ptr(slot, data.len())?;
        // SAFETY: `dst` is valid for `data.len()` bytes inside our buffer (checked above); the
        // slot is not posted (the caller owns it), so the device does not touch it now.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        let mut sge = ffi::ibv_sge {
            addr: dst as u64,
            length: data.len() as u32,
            lkey,
        };
        // SAFETY: all-zero is a valid ibv_send_wr (integers, NULL pointers, plain unions).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(slot);
        wr.next = ptr::null_mut();
        wr.sg_list = &mut sge;
        wr.num_sge = i32::from(!data.is_empty());
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive (destroyed only by consuming `self`); the WR and its SGE live
        // across the call (the provider copies them); the SGE lies in our registered MR.
        let ret = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(ret)
        }
    }

    /// Posts one send work request over memory regions with `slot` as the wr id: `shape`'s
    /// opcode, flags, immediate and target, and one SGE per `(region, offset, len)` of `list`
    /// (the region's address plus `offset`, `len` bytes, its lkey). `EINVAL`, with nothing
    /// posted, for an entry outside its region or a region on another PD.
    pub(crate) fn post_send_wr(
        &mut self,
        slot: u32,
        shape: &WrShape,
        list: &[(&Region, u64, u32)],
    ) -> Result<(), Errno> {
        let mut sges = Vec::with_capacity(list.len());
        for &(region, offset, len) in list {
            if !region.on(&self.pd)
                || offset
                    .checked_add(u64::from(len))
                    .is_none_or(|end| end > region.len())
            {
                return Err(libc::EINVAL);
            }
            sges.push(ffi::ibv_sge {
                addr: region.addr() + offset,
                length: len,
                lkey: region.lkey(),
            });
        }
        // SAFETY: all-zero is a valid ibv_send_wr (integers, NULL pointers, plain unions).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(slot);
        wr.next = ptr::null_mut();
        wr.sg_list = if sges.is_empty() {
            ptr::null_mut()
        } else {
            sges.as_mut_ptr()
        };
        wr.num_sge = i32::try_from(sges.len()).map_err(|_| libc::EINVAL)?;
        wr.opcode = shape.opcode;
        wr.send_flags = shape.send_flags;
        if let Some(imm) = shape.imm_data {
            wr.imm_data_invalidated_rkey_union.imm_data = imm;
        }
        match shape.target {
            crate::onesided::Target::None => {}
            crate::onesided::Target::Rdma { remote_addr, rkey } => {
                wr.wr.rdma = ffi::rdma_t { remote_addr, rkey };
            }
            crate::onesided::Target::Atomic {
                remote_addr,
                rkey,
                compare_add,
                swap,
            } => {
                wr.wr.atomic = ffi::atomic_t {
                    remote_addr,
                    compare_add,
                    swap,
                    rkey,
                };
            }
        }
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive (destroyed only by consuming `self`); the WR and its SGEs
        // live across the call (the provider copies them); every SGE lies inside a region
        // registered on this QP's PD (checked above), whose memory stays allocated until it is
        // deregistered, after which the device can no longer reach it (a request still naming
        // it then fails on the key).
        let ret = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(ret)
        }
    }

    /// The QP's `max_rd_atomic` (`ibv_query_qp`): how many RDMA READs and atomics it may have
    /// in flight, which librdmacm set from the connection's initiator depth on the way to RTS.
    pub(crate) fn max_rd_atomic(&self) -> Result<u8, Errno> {
        // SAFETY: all-zero is a valid ibv_qp_attr and ibv_qp_init_attr (integers, NULL
        // pointers, unions of them).
        let mut attr: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        let mut init: ffi::ibv_qp_init_attr = unsafe { std::mem::zeroed() };
        let mask = ffi::ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0 as i32;
        // SAFETY: the QP is alive; both out-pointers are valid for the call.
        let ret = unsafe { ffi::ibv_query_qp(self.qp.as_ptr(), &mut attr, mask, &mut init) };
        if ret != 0 {
            // verbs returns the errno itself.
            return Err(ret);
        }
        Ok(attr.max_rd_atomic)
    }

    /// The QP's address: what its asynchronous events name it by (never dereferenced there).
    pub(crate) fn key(&self) -> usize {
        self.qp.as_ptr() as usize
    }

    /// Posts receive slot `slot` for `len` bytes (no SGE for 0; on a UD QP `len` bytes after
    /// the GRH), with `slot` as the wr id.
    pub(crate) fn post_recv(&mut self, slot: u32, len: u32) -> Result<(), Errno> {
        let lkey = self.register_slots()?;
        let len = if self.ud.is_some() {
            len + cm_core::GRH_LEN as u32
        } else {
            len
        };
        let dst = self.slot_ptr(slot, len as usize)?;
        let mut sge = ffi::ibv_sge {
            addr: dst as u64,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: u64::from(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: as for post_send; the device writes at most `len` bytes into the slot, which
        // stays allocated until the MR is deregistered.
        let ret = unsafe { ffi::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(ret)
        }
    }

    /// `ibv_poll_cq` for at most `max` (at most [`POLL_BATCH`] per call) completions, appended
    /// to `out`; how many were appended.
    pub(crate) fn poll(&self, max: usize, out: &mut Vec<RawCompletion>) -> Result<usize, Errno> {
        const BATCH: usize = POLL_BATCH;
        let n = max.min(BATCH);
        if n == 0 {
            return Ok(0);
        }
        let mut wcs: [MaybeUninit<ffi::ibv_wc>; BATCH] = [const { MaybeUninit::uninit() }; BATCH];
        // SAFETY: the CQ is alive; `wcs` has room for `n` entries.
        let got = unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), n as i32, wcs.as_mut_ptr().cast()) };
        if got < 0 {
            return Err(libc::EIO);
        }
        let got = (got as usize).min(n);
        for wc in &wcs[..got] {
            // SAFETY: ibv_poll_cq initialised the first `got` entries.
            let wc = unsafe { wc.assume_init_ref() };
            let received = wc.status == ffi::ibv_wc_status::IBV_WC_SUCCESS
                && wc.opcode & ffi::ibv_wc_opcode::IBV_WC_RECV != 0;
            let sender = if received && self.ud.is_some() {
                u32::try_from(wc.wr_id)
                    .ok()
                    .and_then(|slot| self.datagram_sender(slot, wc))
            } else {
                None
            };
            out.push(RawCompletion {
                wr_id: wc.wr_id,
                status: wc.status,
                opcode: wc.opcode,
                byte_len: wc.byte_len,
                wc_flags: wc.wc_flags,
                // SAFETY: both members of the union are u32s; any bit pattern is valid.
                imm_data: unsafe { wc.imm_data_invalidated_rkey_union.imm_data },
                sender,
            });
        }
        Ok(got)
    }

    /// The completion channel's fd (non-blocking), borrowed for as long as the QP: readable once
    /// the armed CQ has a new completion.
    pub(crate) fn cq_fd(&self) -> Result<BorrowedFd<'_>, Errno> {
        let fd = self.comp_fd()?;
        // SAFETY: the channel is alive while `self` exists (destroyed only by consuming `self`);
        // it closes the fd only in ibv_destroy_comp_channel, so the fd stays open for the borrow.
        Ok(unsafe { BorrowedFd::borrow_raw(fd) })
    }

    /// The completion channel's fd, made non-blocking if it was not yet.
    fn comp_fd(&self) -> Result<i32, Errno> {
        // SAFETY: the channel is alive; reading its fd field.
        let fd = unsafe { (*self.comp.as_ptr()).fd };
        if !self.comp_nonblocking.get() {
            set_nonblocking(fd)?;
            self.comp_nonblocking.set(true);
        }
        Ok(fd)
    }

    /// Takes every CQ event waiting on the completion channel, acks them, and arms the CQ again
    /// (`ibv_req_notify_cq`), so that the channel's fd turns readable with the next completion.
    /// A completion that arrived before the arming raises no event: the caller polls the CQ
    /// again afterwards to close that race. Returns how many events were taken.
    pub(crate) fn rearm(&self) -> Result<u32, Errno> {
        self.comp_fd()?;
        let mut taken: u32 = 0;
        loop {
            let mut cq: *mut ffi::ibv_cq = ptr::null_mut();
            let mut ctx: *mut c_void = ptr::null_mut();
            // SAFETY: the channel is alive; both out-pointers are valid. The fd is non-blocking
            // (`comp_fd` above), so this returns -1 (EAGAIN) at once when no event waits.
            let ret = unsafe { ffi::ibv_get_cq_event(self.comp.as_ptr(), &mut cq, &mut ctx) };
            if ret != 0 {
                let err = last_errno();
                if err == libc::EAGAIN || err == libc::EWOULDBLOCK {
                    break;
                }
                self.ack_events(taken);
                return Err(err);
            }
            // Only our CQ uses the channel, so every event is for it.
            taken = taken.saturating_add(1);
        }
        self.ack_events(taken);
        // SAFETY: the CQ is alive.
        let ret = unsafe { ffi::ibv_req_notify_cq(self.cq.as_ptr(), 0) };
        if ret != 0 {
            // verbs returns the errno itself.
            return Err(ret);
        }
        Ok(taken)
    }

    fn ack_events(&self, n: u32) {
        if n > 0 {
            // SAFETY: the CQ is alive and `n` events were retrieved for it and not yet acked.
            unsafe { ffi::ibv_ack_cq_events(self.cq.as_ptr(), n) };
        }
    }

    /// Waits at most `timeout_ms` for the completion channel's fd to turn readable.
    pub(crate) fn wait_cq_event(&self, timeout_ms: i32) -> Result<bool, Errno> {
        // SAFETY: the channel is alive; reading its fd field.
        poll_readable(unsafe { (*self.comp.as_ptr()).fd }, timeout_ms)
    }

    /// Copies the first `len` bytes of slot `slot` (a receive whose completion was polled).
    pub(crate) fn read_slot(&self, slot: u32, len: usize) -> Vec<u8> {
        let len = len.min(self.slot_size);
        match self.slot_ptr(slot, len) {
            Ok(src) => {
                let mut v = vec![0u8; len];
                // SAFETY: `src` is valid for `len` bytes of our buffer; the receive completed,
                // so the device no longer writes to the slot.
                unsafe { ptr::copy_nonoverlapping(src, v.as_mut_ptr(), len) };
                v
            }
            Err(_) => Vec::new(),
        }
    }

    /// `rdma_destroy_qp(id)`, then destroys the CQ, deregisters the MR and frees the slots (if
    /// anything was posted);
    /// returns the PD (to release it when unused). `EINVAL` (nothing done, the QP handed back)
    /// when `id` is not the id the QP is attached to. A later failure (CQ or MR still busy)
    /// leaks what remains, never freeing memory the device can reach, and is reported as the
    /// errno with the PD.
    pub(crate) fn destroy(self, id: &Id) -> Result<Pd, (Option<Qp>, Errno)> {
        self.destroy_then(id, |_| {})
    }

    /// [`destroy`](Qp::destroy), handing every completion still in the CQ once the QP is gone
    /// (none can come after) to `leftover`: a QP on an SRQ may have taken receives whose
    /// completions nobody polled, and their SRQ slots must be freed.
    pub(crate) fn destroy_then(
        self,
        id: &Id,
        mut leftover: impl FnMut(&RawCompletion),
    ) -> Result<Pd, (Option<Qp>, Errno)> {
        // SAFETY: the id is alive; reading its QP pointer.
        let attached = unsafe { (*id.raw()).qp };
        if !Rc::ptr_eq(&self.id_anchor, &id.anchor) || attached != self.qp.as_ptr() {
            return Err((Some(self), libc::EINVAL));
        }
        let Qp {
            cq,
            comp,
            mem,
            pd,
            ud,
            ..
        } = self;
        // SAFETY: the id is alive and `id->qp` is our QP; librdmacm destroys it and only the
        // CQs it created itself (none: we passed ours).
        unsafe { ffi::rdma_destroy_qp(id.raw()) };
        if let Some(ud) = ud {
            ud.destroy();
        }
        let mut wcs: [MaybeUninit<ffi::ibv_wc>; POLL_BATCH] = [const { MaybeUninit::uninit() }; POLL_BATCH];
        loop {
            // SAFETY: the CQ is alive (destroyed below); `wcs` has room for POLL_BATCH entries.
            let got = unsafe { ffi::ibv_poll_cq(cq.as_ptr(), POLL_BATCH as i32, wcs.as_mut_ptr().cast()) };
            let got = usize::try_from(got).unwrap_or(0).min(POLL_BATCH);
            for wc in &wcs[..got] {
                // SAFETY: ibv_poll_cq initialised the first `got` entries.
                let wc = unsafe { wc.assume_init_ref() };
                leftover(&RawCompletion {
                    wr_id: wc.wr_id,
                    status: wc.status,
                    opcode: wc.opcode,
                    byte_len: wc.byte_len,
                    wc_flags: wc.wc_flags,
                    // SAFETY: both members of the union are u32s; any bit pattern is valid.
                    imm_data: unsafe { wc.imm_data_invalidated_rkey_union.imm_data },
                    sender: None,
                });
            }
            // Bounded: the QP is gone, so nothing adds to the CQ while it is emptied.
            if got < POLL_BATCH {
                break;
            }
        }
        // SAFETY: the QP using the CQ is gone, and no CQ event is unacked (`rearm` acks every
        // event it takes before returning), so this does not wait.
        let ret = unsafe { ffi::ibv_destroy_cq(cq.as_ptr()) };
        if ret != 0 {
            // The MR, buffer and completion channel leak with it (never free what the device may
            // reach), and the MR keeps the PD busy.
            std::mem::forget(pd);
            return Err((None, ret));
        }
        // SAFETY: its only CQ is gone (above). A failure leaks the channel's fd, nothing more.
        let _ = unsafe { ffi::ibv_destroy_comp_channel(comp.as_ptr()) };
        if let Some(mem) = mem {
            // No QP can use the MR any more (destroyed above).
            if let Err(ret) = mem.release() {
                // The MR (and so the buffer) leaks and keeps the PD busy: keep counting it as
                // used so that it is never deallocated under the MR.
                std::mem::forget(pd);
                return Err((None, ret));
            }
        }
        Ok(pd)
    }
}

// ------------------------------------------------------------------------------------------------

impl RawSockAddr {
    fn as_mut_ptr(&mut self) -> *mut libc::sockaddr {
        match self {
            RawSockAddr::V4(sin) => ptr::from_mut(sin).cast(),
            RawSockAddr::V6(sin6) => ptr::from_mut(sin6).cast(),
        }
    }
}

// ------------------------------------------------------------------------------------------------
// Threads

// SAFETY: `HwBackend` is not `Send` automatically only because of what this module gives it: raw
// pointers to librdmacm and verbs objects, and `Rc` reference counts between the wrappers. Both
// are sound to move to another thread together with the backend:
// * librdmacm and libibverbs objects are not tied to the thread that created them: any thread may
//   call into them, one at a time (the libraries lock what they share internally, e.g. librdmacm's
//   global id table and each channel's fd). `&mut self` on every call that touches them makes the
//   calls one at a time.
// * Every `Rc` clone (channel, id anchor, PD, SRQ anchor) lives inside the backend's own tables: no
//   wrapper and no clone is ever handed out (callers get plain `Copy` handles), so all holders of a
//   count move with the backend and no two threads can touch one count.
// * A held device list (`rdma_get_devices`) is freed with `rdma_free_devices`, which takes
//   librdmacm's global lock: any thread may free it. Memory regions are plain heap memory.
// * The asynchronous-event router every backend shares is behind a `Mutex`.
// The backend is deliberately not `Sync` (see its docs).
unsafe impl Send for crate::backend::HwBackend {}

// ------------------------------------------------------------------------------------------------
// Process limits

/// Raises the soft limit on open file descriptors (`RLIMIT_NOFILE`) to the hard limit; returns
/// the new soft limit.
pub(crate) fn raise_nofile_limit() -> Result<u64, Errno> {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer to an rlimit.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return Err(last_errno());
    }
    if lim.rlim_cur < lim.rlim_max {
        lim.rlim_cur = lim.rlim_max;
        // SAFETY: a valid rlimit; raising the soft limit up to the hard one needs no privilege.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) } != 0 {
            return Err(last_errno());
        }
    }
    Ok(lim.rlim_cur)
}
