//! [`HwBackend`]: the `CmBackend` over the real librdmacm.

use std::collections::hash_map::Entry;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::os::fd::BorrowedFd;
use std::time::Duration;

use cm_core::backend::{post_gate, Admission, Slab, SlotRef, WrPool};
use cm_core::{
    Access, AsyncEvent, Call, ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, HandleKind,
    IdHandle, IdMachine, IdOption, LiveResources, MrHandle, MrInfo, PortSpace, QpAttr, QpCaps, QpState,
    Result, Role, SendWr, SrqCaps, SrqHandle, UdParam, WcOpcode, WorkCompletion,
};

use crate::convert::{self, os_error};
use crate::pool::Prefetched;
use crate::sys::{self, Errno};

mod datagram;
#[cfg(feature = "differential")]
pub(crate) mod differential;
mod external;
mod multicast;
mod onesided;
mod options;

/// The most memory one QP's message buffers may take: `(max_send_wr + max_recv_wr) *
/// max_message_size` bytes, all pinned by `ibv_reg_mr` on the QP's first post (mind `ulimit -l`:
/// a registration the limit refuses fails that post, not `create_qp`).
pub const MAX_QP_BUFFER_BYTES: u64 = 1 << 30;

/// The largest [`QpCaps::max_message_size`] accepted: 1 MiB, the simulator's default.
pub const MAX_MESSAGE_SIZE: u32 = 1 << 20;

/// The largest memory region [`reg_mr`](CmBackend::reg_mr) registers: 1 GiB, the simulator's
/// default. A region is pinned when it is registered (mind `ulimit -l`: a registration the
/// limit refuses fails with the kernel's errno).
pub const MAX_MR_SIZE: u64 = 1 << 30;

/// Its statements with the `tracing` feature; nothing at all without it (so the records'
/// arguments are neither evaluated nor compiled).
#[cfg(feature = "tracing")]
macro_rules! traced {
    ($($body:tt)*) => { $($body)* };
}
#[cfg(not(feature = "tracing"))]
macro_rules! traced {
    ($($body:tt)*) => {};
}

/// One event channel.
struct ChannelEntry {
    raw: sys::Channel,
    /// Events retrieved from the channel and not acked.
    unacked: u32,
}

/// One id.
struct IdEntry {
    raw: sys::Id,
    /// Slab index of the channel the id is on.
    channel: u32,
    machine: IdMachine,
    qp: Option<QpEntry>,
}

/// The QP of an id with its slot bookkeeping.
struct QpEntry {
    raw: sys::Qp,
    pool: WrPool,
    /// What the QP was created with (its message buffers are `caps.max_message_size` long).
    caps: QpCaps,
    /// Completions taken from the CQ by a post, not yet handed out by `poll_cq`.
    early: Prefetched,
    /// The slab index of the SRQ the QP takes its receives from.
    srq: Option<u32>,
    /// The QP's `max_rd_atomic` once queried (it is fixed from RTS on).
    rd_atomic: Option<u8>,
}

impl QpEntry {
    fn new(raw: sys::Qp, pool: WrPool, caps: QpCaps, srq: Option<u32>) -> QpEntry {
        QpEntry {
            raw,
            pool,
            caps,
            early: Prefetched::default(),
            srq,
            rd_atomic: None,
        }
    }
}

/// A memory region.
struct MrEntry {
    raw: sys::Region,
}

/// A shared receive queue with its receive slots' bookkeeping.
struct SrqEntry {
    raw: sys::Srq,
    /// No send slots; `caps.max_wr` receive slots, each held from posting until the completion
    /// is polled on whichever QP took it.
    pool: WrPool,
    caps: SrqCaps,
}

impl QpEntry {
    /// Whether the device has put the QP in ERR by itself, as far as its CQ tells: moves the
    /// completions the CQ holds into `early` (see the pool's docs, "Errors the device produced").
    fn device_failed(&mut self) -> std::result::Result<bool, Errno> {
        let mut polled = Vec::new();
        loop {
            polled.clear();
            let got = self.raw.poll(sys::POLL_BATCH, &mut polled)?;
            let failed = self.early.keep(&polled);
            // Bounded: the CQ holds at most one completion per request posted, and none is
            // posted meanwhile.
            if got < sys::POLL_BATCH {
                return Ok(failed);
            }
        }
    }
}

/// One retrieved, unacked event.
struct Outstanding {
    raw: sys::Event,
    id: IdHandle,
    ty: CmEventType,
    /// Slab index of the id the event counts against.
    counted: u32,
    channel: u32,
}

/// The hardware backend: every `CmBackend` call checked against the id's [`IdMachine`] and this
/// backend's bookkeeping, then made on the real librdmacm.
///
/// * Construction is cheap and touches no device; the first
///   [`create_event_channel`](CmBackend::create_event_channel) does, and fails with
///   [`CmError::NoRdmaDevice`] on a machine without RDMA. [`probe`](crate::probe) asks first.
/// * Misuse that librdmacm turns into a hang, a crash or a leak is refused before librdmacm is
///   called, with the same [`CmError`] the simulator returns (the `IdMachine` decides). librdmacm's
///   own failures are [`CmError::Os`], except `EADDRINUSE` ([`CmError::AddrInUse`]) and
///   `EADDRNOTAVAIL` ([`CmError::AddrNotAvailable`]).
/// * Nothing blocks without a bound: channel fds are non-blocking and waited on with `poll(2)`;
///   completion queues are polled, yielding for a while and then waiting on the CQ's completion
///   channel, until the timeout.
/// * Each QP gets its own completion queue (for sends and receives, so completions come back in
///   completion order) with a completion channel (one file descriptor per QP: mind
///   `RLIMIT_NOFILE`, see [`raise_fd_limit`](crate::raise_fd_limit)), and a registered buffer
///   pool of `max_send_wr + max_recv_wr` slots of `max_message_size` bytes, allocated and
///   registered on the QP's first post (a QP nothing is posted on pins no memory), on a
///   protection domain the backend owns per device context (made with the first QP on the
///   device, freed with the last).
/// * A work request posted while the QP is in ERR — by the id's machine, or by the device itself
///   as an error completion still in the CQ shows — is not posted to the
///   hardware (rxe on Linux 6.1, for one, never completes a receive posted then): the backend
///   completes it with `WR_FLUSH_ERR` itself, once the requests of the same queue posted earlier
///   to the hardware have completed, so every provider honours the contract and each queue
///   completes in posting order. It occupies a slot of its queue until its completion is polled,
///   as in the simulator.
/// * Memory regions ([`reg_mr`](CmBackend::reg_mr)) are page-aligned, zeroed memory the
///   backend owns, registered with `ibv_reg_mr` on the backend's protection domain of the id's
///   device (the one its QPs use, so any QP of the backend on that device may name them); a
///   region or a shared receive queue keeps that protection domain, and librdmacm's device
///   context under it, alive after the id is gone. Work requests over regions
///   ([`post_send_wr`](CmBackend::post_send_wr)) are checked with cm-core's rules first, then
///   posted with `IBV_SEND_SIGNALED` always, so that every one completes and frees its slot; the
///   successful completion of an unsignalled one is not handed out.
/// * Asynchronous events ([`get_async_event`](CmBackend::get_async_event)) are read from the
///   device contexts the backend uses, acked at once, and routed to the backend (of any in the
///   process) whose SRQ or QP they name; the async fds are made non-blocking.
/// * Dropping the backend releases everything in librdmacm's order: acks every held event,
///   destroys QPs (with their CQs and buffers), SRQs, memory regions, the protection domains,
///   ids (child ids first), then channels.
///
/// Event bookkeeping follows the simulator: an event moves the machine of the id it counts
/// against ([`CmEvent::counted_id`]: the listener for `CONNECT_REQUEST`) when it is retrieved,
/// and [`IdMachine::on_ack`] releases it. A real event the machine calls illegal (for instance
/// `UNREACHABLE` that newer kernels send after a connection was established) is still delivered
/// — a real event is never hidden — and counted with [`IdMachine::count_event`], so it blocks
/// `destroy_id` until acked and [`unacked`](IdMachine::unacked) stays exact, but it leaves the
/// machine's state unchanged (except that `REJECTED` moves the QP to ERR, as librdmacm does).
///
/// # Threads and event loops
///
/// `HwBackend` is `Send`: it may move to another thread (a server on one thread, a client on
/// another, each with its own backend, as `cmtime` does), because librdmacm and verbs objects may
/// be used from any thread, and every object the backend refers to is owned by it alone. It is
/// not `Sync`: every call that does anything takes `&mut self`, so sharing `&HwBackend` between
/// threads would buy nothing; to share one backend, put it in a `Mutex` (which needs only
/// `Send`).
///
/// An event loop waits for readiness on file descriptors instead of blocking in a call:
/// [`channel_fd`](HwBackend::channel_fd) is readable when
/// [`try_get_cm_event`](CmBackend::try_get_cm_event) would return an event, and
/// [`cq_fd`](HwBackend::cq_fd) turns readable when a completion arrives after
/// [`try_poll_cq`](CmBackend::try_poll_cq) returned 0. Both calls return at once.
pub struct HwBackend {
    tag: u32,
    channels: Slab<ChannelEntry>,
    ids: Slab<IdEntry>,
    /// `rdma_cm_id` address → id slab index.
    by_addr: HashMap<sys::IdAddr, u32>,
    /// Device context → the backend's protection domain on it.
    pds: HashMap<sys::DeviceContext, sys::Pd>,
    /// Token → retrieved event (ordered, so teardown acks in retrieval order).
    events: BTreeMap<u64, Outstanding>,
    next_seq: u64,
    qps: usize,
    /// (id slab index, group) of every multicast membership → whether librdmacm attached the
    /// id's QP to it (it does when it hands out `MULTICAST_JOIN` to an id with a QP).
    groups: BTreeMap<(u32, std::net::IpAddr), bool>,
    /// Memory regions.
    mrs: Slab<MrEntry>,
    /// Shared receive queues.
    srqs: Slab<SrqEntry>,
    /// This backend's end of the process's asynchronous-event router (see `sys`).
    inbox: sys::Inbox,
}

impl std::fmt::Debug for HwBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HwBackend")
            .field("tag", &self.tag)
            .field("live", &self.live_resources())
            .finish()
    }
}

impl HwBackend {
    /// A backend with nothing open yet; needs no device (the first channel does).
    pub fn new() -> Result<HwBackend> {
        let tag = cm_core::backend::next_backend_tag();
        Ok(HwBackend {
            tag,
            channels: Slab::new(),
            ids: Slab::new(),
            by_addr: HashMap::new(),
            pds: HashMap::new(),
            events: BTreeMap::new(),
            next_seq: 1,
            qps: 0,
            groups: BTreeMap::new(),
            mrs: Slab::new(),
            srqs: Slab::new(),
            inbox: sys::Inbox::new(tag),
        })
    }

    /// Same as [`crate::probe`]: whether an RDMA device answers.
    pub fn probe() -> Result<()> {
        crate::probe()
    }

    /// The event channel's file descriptor, for an event loop to wait on (`BorrowedFd` is
    /// `AsFd` and `AsRawFd`; register `as_raw_fd()` with epoll, mio or tokio's `AsyncFd` for no
    /// longer than the channel lives). It is non-blocking and readable when
    /// [`try_get_cm_event`](CmBackend::try_get_cm_event) would return an event; the backend
    /// never blocks on it. Readiness is level-triggered: drain with `try_get_cm_event` until
    /// `Ok(None)` before waiting again. [`CmError::UnknownHandle`] for a channel not (or no
    /// longer) of this backend.
    ///
    /// ```no_run
    /// use std::os::fd::AsRawFd;
    /// use cm_core::CmBackend;
    ///
    /// # fn main() -> cm_core::Result<()> {
    /// let mut hw = cm_hw::HwBackend::new()?;
    /// let ch = hw.create_event_channel()?;
    /// let fd = hw.channel_fd(ch)?.as_raw_fd();
    /// // An event loop (epoll, mio, tokio's AsyncFd) waits here, for all its fds at once, until
    /// // `fd` is readable; then it drains the channel:
    /// # let _ = fd;
    /// while let Some(event) = hw.try_get_cm_event(ch)? {
    ///     // ... hand the event to the task that owns event.id() ...
    ///     hw.ack_cm_event(event)?;
    /// }
    /// # Ok(()) }
    /// ```
    pub fn channel_fd(&self, channel: ChannelHandle) -> Result<BorrowedFd<'_>> {
        let index = self.channel_index(Call::GetCmEvent, channel)?;
        Ok(self.channels.at(index).expect("checked").raw.borrowed_fd())
    }

    /// The file descriptor of the completion channel of `id`'s CQ, for an event loop to wait on
    /// (`AsFd`, `AsRawFd`). It is non-blocking and edge-like: once
    /// [`try_poll_cq`](CmBackend::try_poll_cq) has returned 0 the CQ is armed, and the fd turns
    /// readable when a new completion arrives; then call `try_poll_cq` again (which takes and
    /// acks the CQ's events, arms it again when it finds nothing, and polls once more so that
    /// no completion slips between the two). A work request posted on a QP in ERR is completed
    /// (flushed) by the backend itself, without the fd turning readable: call `try_poll_cq`
    /// after posting, before waiting. The fd lives as long as the QP. [`CmError::NoQp`] without
    /// a QP, [`CmError::UnknownHandle`] for an id not of this backend.
    ///
    /// ```no_run
    /// use std::os::fd::{AsRawFd, RawFd};
    /// use cm_core::{CmBackend, IdHandle, WorkCompletion};
    ///
    /// /// The completions there are now, or the fd to wait on before asking again.
    /// fn completions_or_fd(
    ///     hw: &mut cm_hw::HwBackend,
    ///     id: IdHandle,
    ///     out: &mut Vec<WorkCompletion>,
    /// ) -> cm_core::Result<Option<RawFd>> {
    ///     if hw.try_poll_cq(id, out, 16)? > 0 {
    ///         return Ok(None);
    ///     }
    ///     // Armed: the fd turns readable once a completion arrives.
    ///     Ok(Some(hw.cq_fd(id)?.as_raw_fd()))
    /// }
    /// ```
    pub fn cq_fd(&self, id: IdHandle) -> Result<BorrowedFd<'_>> {
        let index = self.id_index(Call::PollCq, id)?;
        match &self.ids.at(index).expect("checked").qp {
            Some(q) => q.raw.cq_fd().map_err(|err| os_error(Call::PollCq, err)),
            None => Err(CmError::NoQp { call: Call::PollCq }),
        }
    }

    fn channel_index(&self, call: Call, h: ChannelHandle) -> Result<u32> {
        if h.owner() == self.tag && self.channels.contains(slot_ref(h.index(), h.generation())) {
            Ok(h.index())
        } else {
            Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Channel,
            })
        }
    }

    fn id_index(&self, call: Call, h: IdHandle) -> Result<u32> {
        if h.owner() == self.tag && self.ids.contains(slot_ref(h.index(), h.generation())) {
            Ok(h.index())
        } else {
            Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Id,
            })
        }
    }

    /// The entry of a checked id.
    fn id(&mut self, call: Call, h: IdHandle) -> Result<&mut IdEntry> {
        let index = self.id_index(call, h)?;
        Ok(self.ids.at_mut(index).expect("checked"))
    }

    fn id_handle(&self, index: u32) -> IdHandle {
        cm_core::backend::id_handle(self.tag, index, self.ids.generation(index).expect("live id"))
    }

    fn register_id(&mut self, raw: sys::Id, channel: u32, machine: IdMachine) -> u32 {
        let addr = raw.addr();
        let index = self
            .ids
            .insert(IdEntry {
                raw,
                channel,
                machine,
                qp: None,
            })
            .index;
        self.by_addr.insert(addr, index);
        index
    }

    /// Acks an event the backend does not hand out (an id it does not know), destroying the child a
    /// `CONNECT_REQUEST` brought (its request is then never seen by anyone).
    fn discard(&mut self, channel: u32, mut raw: sys::Event) {
        traced! {
            let event = CmEventType::from(raw.event_type());
            tracing::debug!(channel, %event, "event discarded: not one of this backend's ids");
        }
        if let Some(ch) = self.channels.at(channel) {
            if let Some(child) = raw.take_child(&ch.raw) {
                // A fresh child has no events and no QP: destroying it cannot block.
                let _ = child.destroy();
            }
        }
        let _ = raw.ack();
    }

    /// Turns a retrieved event into a `CmEvent` and records it; None when it was discarded.
    ///
    /// Until `raw` is in `self.events`, only this frame owns it. Should anything here panic,
    /// the unwinding drops `raw`, which acks it (see `sys::Event`), so that `Drop` of the backend
    /// does not block in `rdma_destroy_id` on an event nobody can ack; at worst a child id taken
    /// from a `CONNECT_REQUEST` and not yet registered is leaked (with its channel), never a hang.
    fn admit(&mut self, channel: u32, mut raw: sys::Event) -> Option<CmEvent> {
        // A number from a newer librdmacm is handed out as `Unknown`, not dropped: the id's
        // machine refuses it as an event, so it is only counted, like any illegal real event.
        let ty = CmEventType::from(raw.event_type());
        let counted = match raw.counted_addr().and_then(|addr| self.by_addr.get(&addr)) {
            Some(&i) if self.ids.at(i).is_some_and(|e| e.channel == channel) => i,
            _ => {
                self.discard(channel, raw);
                return None;
            }
        };
        let ps = self.ids.at(counted).expect("live").machine.port_space();
        let (id_index, listen) = if ty == CmEventType::ConnectRequest {
            let ch = &self.channels.at(channel).expect("live channel").raw;
            let Some(child) = raw.take_child(ch) else {
                self.discard(channel, raw);
                return None;
            };
            let child = self.register_id(child, channel, IdMachine::new_child(ps));
            (child, Some(counted))
        } else {
            (counted, None)
        };
        let data = raw.data(!ps.is_connected());
        let entry = self.ids.at_mut(counted).expect("live");
        let bound = raw.bind(&entry.raw);
        debug_assert!(bound, "the counted id is the one looked up by address");
        entry.machine = match entry.machine.on_event(ty) {
            Ok(next) => next,
            // Delivered all the same (a real event is never hidden) and counted as unacked.
            Err(_illegal) if ty == CmEventType::Rejected => {
                // librdmacm moves the QP to ERR when it hands out REJECTED, legal or not.
                entry.machine.count_event().qp_error()
            }
            Err(_illegal) => entry.machine.count_event(),
        };
        self.channels.at_mut(channel).expect("live channel").unacked += 1;
        let token = convert::event_token(self.tag, self.next_seq);
        self.next_seq += 1;
        let id = self.id_handle(id_index);
        let listen_id = listen.map(|l| self.id_handle(l));
        self.events.insert(
            token,
            Outstanding {
                raw,
                id,
                ty,
                counted,
                channel,
            },
        );
        traced! {
            tracing::debug!(%id, listen_id = ?listen_id, event = %ty, status = data.status, "event");
        }
        let event = cm_core::backend::cm_event(id, listen_id, ty, data.status, data.param, token);
        if matches!(ty, CmEventType::Established | CmEventType::MulticastJoin) && !ps.is_connected() {
            // librdmacm fills `param.ud` of a datagram id's ESTABLISHED from the SIDR reply,
            // and of MULTICAST_JOIN with the group's.
            let ud = self.events.get(&token).expect("recorded above").raw.ud_param();
            if ty == CmEventType::MulticastJoin {
                self.joined(counted, &ud);
            }
            return Some(cm_core::backend::with_ud_param(event, ud));
        }
        Some(event)
    }

    /// The slab index of a checked id that has a QP (`PollCq`'s errors otherwise).
    fn qp_index(&self, id: IdHandle) -> Result<u32> {
        let index = self.id_index(Call::PollCq, id)?;
        if self.ids.at(index).expect("checked").qp.is_none() {
            return Err(CmError::NoQp { call: Call::PollCq });
        }
        Ok(index)
    }

    /// Appends up to `max` completions there are now (the hardware's, then those the backend
    /// flushed itself) without waiting; how many were appended. A successful unsignalled
    /// request frees its slot and is not handed out (nor counted against `max`); a receive the
    /// QP took from its SRQ frees the SRQ's slot and hands out the SRQ's buffer.
    fn drain_cq(&mut self, index: u32, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        let srqs = &mut self.srqs;
        let e = self.ids.at_mut(index).expect("checked");
        let q = e.qp.as_mut().expect("checked");
        let ud = q.raw.is_ud();
        let mut raw = Vec::with_capacity(sys::POLL_BATCH);
        let mut appended = 0;
        let mut failed = false;
        while appended < max {
            // The hardware's completions first: a flushed request waits for those of its queue
            // posted before it (see the pool's docs).
            raw.clear();
            let asked = (max - appended).min(sys::POLL_BATCH);
            // Completions a post took from the CQ came out of it first, so they go first.
            let mut got = q.early.hand_out(asked, &mut raw);
            if got < asked {
                got += q
                    .raw
                    .poll(asked - got, &mut raw)
                    .map_err(|err| os_error(Call::PollCq, err))?;
            }
            for c in &raw {
                // Only this backend posts on the QP and its SRQ, so every wr_id is a slot of
                // ours; anything else is ignored rather than trusted.
                let (posted, srq_slot) = match crate::onesided::srq_slot(c.wr_id) {
                    Some(slot) => {
                        let Some(srq) = q.srq.and_then(|i| srqs.at_mut(i)) else {
                            continue;
                        };
                        let Some((_, posted)) = srq.pool.complete(slot) else {
                            continue;
                        };
                        (posted, Some(slot as u32))
                    }
                    None => match q.pool.complete(c.wr_id) {
                        Some((_, posted)) => (posted, None),
                        None => continue,
                    },
                };
                let crate::onesided::Delivery::Out {
                    status,
                    opcode,
                    byte_len,
                    imm_data,
                    payload,
                } = crate::onesided::deliver(&c.polled(), &posted, ud)
                else {
                    continue;
                };
                let (byte_len, data) = match payload {
                    crate::onesided::Payload::None => (byte_len, Vec::new()),
                    crate::onesided::Payload::Slot(n) => {
                        let data = match (srq_slot, q.srq.and_then(|i| srqs.at(i))) {
                            (Some(slot), Some(srq)) => srq.raw.read_slot(slot, n as usize),
                            _ => q.raw.read_slot(c.wr_id as u32, n as usize),
                        };
                        (n, data)
                    }
                    crate::onesided::Payload::Datagram => {
                        // The GRH in front of the payload is not handed out (see cm-core's
                        // `datagram` docs): the payload alone, its length without the 40 bytes.
                        let mut payload = q.raw.read_datagram(c.wr_id as u32, c.byte_len);
                        payload.truncate(posted.len as usize);
                        (payload.len() as u32, payload)
                    }
                };
                failed |= status != cm_core::WcStatus::Success;
                out.push(WorkCompletion {
                    wr_id: posted.wr_id,
                    status,
                    opcode,
                    byte_len,
                    data,
                    sender: c.sender,
                    imm_data,
                });
                appended += 1;
            }
            while appended < max {
                let Some((opcode, wr_id)) = q.pool.next_flushed() else {
                    break;
                };
                out.push(WorkCompletion {
                    wr_id,
                    status: cm_core::WcStatus::WrFlushErr,
                    opcode,
                    byte_len: 0,
                    data: Vec::new(),
                    sender: None,
                    imm_data: None,
                });
                appended += 1;
            }
            if got < asked {
                // The CQ is drained for now.
                break;
            }
        }
        if failed {
            // Any error completion puts a QP in ERR.
            e.machine = e.machine.qp_error();
        }
        Ok(appended)
    }

    /// The PD on `id`'s device (made now if the backend has none there yet, and the device's
    /// asynchronous events then read for this backend too).
    fn ensure_pd(&mut self, call: Call, id_index: u32) -> Result<sys::DeviceContext> {
        let e = self.ids.at(id_index).expect("checked");
        let Some(context) = e.raw.verbs() else {
            return Err(CmError::NoDevice { call });
        };
        if let Entry::Vacant(slot) = self.pds.entry(context) {
            slot.insert(sys::Pd::alloc(&e.raw).map_err(|err| os_error(call, err))?);
            self.inbox.join(context);
        }
        Ok(context)
    }

    /// `create_qp`, or with `srq` `create_qp_on_srq`: the QP takes its receives from the SRQ,
    /// its CQ has room for the SRQ's receives too, and it has no receive slots of its own.
    fn create_qp_with(&mut self, id: IdHandle, caps: QpCaps, srq: Option<SrqHandle>) -> Result<QpCaps> {
        let call = Call::CreateQp;
        let index = self.id_index(call, id)?;
        let e = self.ids.at(index).expect("checked");
        let next = match srq {
            Some(_) => e.machine.create_qp_on_srq()?,
            None => e.machine.create_qp()?,
        };
        let srq_index = match srq {
            Some(h) => Some(self.srq_index(call, h)?),
            None => None,
        };
        if srq_index.is_some() && !e.machine.port_space().is_connected() {
            // A UD receive puts a 40-byte GRH in front of the payload, which the SRQ's buffers
            // (shared with RC QPs, sized for the payload) have no room for.
            return Err(CmError::InvalidArgument {
                call,
                reason: "a shared receive queue serves connected (RC) QPs only here",
            });
        }
        let Some(context) = e.raw.verbs() else {
            return Err(CmError::NoDevice { call });
        };
        if e.qp.is_some() || e.raw.has_qp() {
            return Err(CmError::QpExists);
        }
        let invalid = |reason| CmError::InvalidArgument { call, reason };
        let srq_wr = match srq_index.and_then(|i| self.srqs.at(i)) {
            Some(s) if s.raw.context() != context => {
                return Err(invalid("shared receive queue of another device"));
            }
            Some(s) => Some(s.caps.max_wr),
            None => None,
        };
        // The simulator's checks, with its reasons; the limit on work requests is the device's.
        let max_wr = match self.pds.get(&context).and_then(sys::Pd::max_qp_wr) {
            Some(max_wr) => max_wr,
            None => e.raw.max_qp_wr().map_err(|err| os_error(call, err))?,
        };
        // Refuses a sum of the two queues past a u32 too, as the simulator does.
        caps.check(max_wr, MAX_MESSAGE_SIZE)?;
        // A QP on an SRQ posts no receives of its own: its slots are its sends'; its CQ holds
        // its sends' completions and as many receives as the SRQ can give it.
        let (slots, cq_entries) = match srq_wr {
            Some(srq_wr) => (caps.max_send_wr, u64::from(caps.max_send_wr) + u64::from(srq_wr)),
            None => {
                let slots = caps.max_send_wr + caps.max_recv_wr;
                (slots, u64::from(slots))
            }
        };
        let cqe = i32::try_from(cq_entries).map_err(|_| invalid("too many work requests for one CQ"))?;
        if u64::from(slots) * u64::from(caps.max_message_size) > MAX_QP_BUFFER_BYTES {
            return Err(invalid(
                "(max_send_wr + max_recv_wr) * max_message_size exceeds 1 GiB of registered buffers",
            ));
        }
        self.ensure_pd(call, index)?;
        let pd = &self.pds[&context];
        pd.remember_max_qp_wr(max_wr);
        let e = self.ids.at(index).expect("checked");
        let raw_srq = srq_index.and_then(|i| self.srqs.at(i)).map(|s| &s.raw);
        match sys::Qp::create(&e.raw, pd, &caps, slots, cqe, raw_srq) {
            Ok((raw, granted)) => {
                self.inbox.own(raw.key());
                let recv_slots = if srq_index.is_some() { 0 } else { caps.max_recv_wr };
                let e = self.ids.at_mut(index).expect("checked");
                e.qp = Some(QpEntry::new(
                    raw,
                    WrPool::new(caps.max_send_wr, recv_slots),
                    caps,
                    srq_index,
                ));
                e.machine = next;
                self.qps += 1;
                // The device may grant more work requests than asked (providers round up), but
                // the CQ and the buffer pool are sized for the request, which is therefore what
                // may be outstanding; the other capabilities are the device's. A QP on an SRQ
                // has no receive queue of its own: 0 receives.
                Ok(QpCaps {
                    max_send_wr: caps.max_send_wr,
                    max_recv_wr: recv_slots,
                    max_send_sge: granted.max_send_sge,
                    max_recv_sge: granted.max_recv_sge,
                    max_inline_data: granted.max_inline_data,
                    max_message_size: caps.max_message_size,
                })
            }
            Err(err) => {
                self.release_pd(context, Some(index));
                Err(os_error(call, err))
            }
        }
    }

    /// Deallocates the PD on `context` if no QP, region or SRQ uses it any more, with the id at
    /// `witness` (on that device) proving the context is open, unless the PD holds the device
    /// itself (it does once a region or an SRQ was made on it). A failure keeps the PD for a
    /// later try.
    fn release_pd(&mut self, context: sys::DeviceContext, witness: Option<u32>) {
        match self.pds.get(&context) {
            Some(pd) if pd.users() == 0 => {}
            _ => return,
        }
        let Some(pd) = self.pds.remove(&context) else {
            return;
        };
        let w = witness.and_then(|i| self.ids.at(i)).map(|e| &e.raw);
        match pd.dealloc(w) {
            Ok(()) => self.inbox.leave(context),
            Err((pd, _)) => {
                self.pds.insert(context, pd);
            }
        }
    }
}

/// The slab reference of a handle's index and generation.
const fn slot_ref(index: u32, generation: u32) -> SlotRef {
    SlotRef { index, generation }
}

/// `EAGAIN` (= `EWOULDBLOCK` on Linux).
fn would_block(e: Errno) -> bool {
    e == libc::EAGAIN || e == libc::EWOULDBLOCK
}

/// How many times a blocking `poll_cq` yields before it arms the CQ and waits on its completion
/// channel: a completion is often only microseconds away.
const YIELD_ROUNDS: u32 = 64;

impl CmBackend for HwBackend {
    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn create_event_channel(&mut self) -> Result<ChannelHandle> {
        let raw = sys::Channel::create().map_err(|e| os_error(Call::CreateEventChannel, e))?;
        let r = self.channels.insert(ChannelEntry { raw, unacked: 0 });
        Ok(cm_core::backend::channel_handle(self.tag, r.index, r.generation))
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn destroy_event_channel(&mut self, channel: ChannelHandle) -> Result<()> {
        let index = self.channel_index(Call::DestroyEventChannel, channel)?;
        let entry = self.channels.at(index).expect("checked");
        // Ids first, as the simulator does. An unacked event always pins its id (destroy_id
        // refuses), so with no ids left there are no unacked events either: the second check
        // is a guard that cannot fire through the public API.
        let ids = entry.raw.ids();
        if ids > 0 {
            return Err(CmError::ChannelBusy {
                ids: u32::try_from(ids).unwrap_or(u32::MAX),
            });
        }
        if entry.unacked > 0 {
            return Err(CmError::UnackedEvents {
                call: Call::DestroyEventChannel,
                count: entry.unacked,
            });
        }
        let entry = self.channels.take(index).expect("checked");
        // No id holds the channel (checked), so this is not refused.
        let _ = entry.raw.destroy();
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn create_id(&mut self, channel: ChannelHandle, ps: PortSpace) -> Result<IdHandle> {
        let ch = self.channel_index(Call::CreateId, channel)?;
        let raw = sys::Id::create(&self.channels.at(ch).expect("checked").raw, ps.raw())
            .map_err(|e| os_error(Call::CreateId, e))?;
        let index = self.register_id(raw, ch, IdMachine::new(ps));
        Ok(self.id_handle(index))
    }

    // The entry travels back through `take_with` once, when librdmacm refuses: its size is no
    // concern there.
    #[allow(clippy::result_large_err)]
    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn destroy_id(&mut self, id: IdHandle) -> Result<()> {
        let index = self.id_index(Call::DestroyId, id)?;
        let entry = self.ids.at(index).expect("checked");
        entry.machine.destroy()?;
        if entry.qp.is_some() || entry.raw.has_qp() {
            return Err(CmError::QpAttached);
        }
        let addr = entry.raw.addr();
        let destroyed = self.ids.take_with(index, |entry| {
            let IdEntry {
                raw,
                channel,
                machine,
                qp,
            } = entry;
            raw.destroy().map_err(|(raw, errno)| {
                // librdmacm kept the id: so does the backend, under the same handle.
                let entry = IdEntry {
                    raw,
                    channel,
                    machine,
                    qp,
                };
                (entry, errno)
            })
        });
        match destroyed.expect("checked") {
            Ok(()) => {
                self.by_addr.remove(&addr);
                self.forget_groups(index);
                Ok(())
            }
            Err(errno) => Err(os_error(Call::DestroyId, errno)),
        }
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn bind_addr(&mut self, id: IdHandle, addr: SocketAddr) -> Result<()> {
        let e = self.id(Call::BindAddr, id)?;
        e.machine.bind_addr(false)?;
        e.raw
            .bind_addr(&addr)
            .map_err(|err| os_error(Call::BindAddr, err))?;
        // Whether the id got a device is what librdmacm says (a wildcard or loopback bind has none).
        e.machine = e.machine.bind_addr(e.raw.verbs().is_none())?;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn resolve_addr(
        &mut self,
        id: IdHandle,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> Result<()> {
        let e = self.id(Call::ResolveAddr, id)?;
        let next = e.machine.resolve_addr()?;
        e.raw
            .resolve_addr(src.as_ref(), &dst, convert::millis_ceil(timeout))
            .map_err(|err| os_error(Call::ResolveAddr, err))?;
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn resolve_route(&mut self, id: IdHandle, timeout: Duration) -> Result<()> {
        let e = self.id(Call::ResolveRoute, id)?;
        let next = e.machine.resolve_route()?;
        if e.raw.verbs().is_none() {
            return Err(CmError::NoDevice {
                call: Call::ResolveRoute,
            });
        }
        e.raw
            .resolve_route(convert::millis_ceil(timeout))
            .map_err(|err| os_error(Call::ResolveRoute, err))?;
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn create_qp(&mut self, id: IdHandle, caps: QpCaps) -> Result<QpCaps> {
        self.create_qp_with(id, caps, None)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn destroy_qp(&mut self, id: IdHandle) -> Result<()> {
        let index = self.id_index(Call::DestroyQp, id)?;
        let groups = self.groups_attached(index);
        let e = self.ids.at_mut(index).expect("checked");
        let next = e.machine.destroy_qp()?;
        if groups > 0 && e.qp.is_some() {
            // librdmacm would ignore the kernel's EBUSY and leak the QP and its CQ.
            return Err(CmError::QpInGroups { groups });
        }
        let Some(mut q) = e.qp.take() else {
            return Err(CmError::NoQp {
                call: Call::DestroyQp,
            });
        };
        let context = q.raw.context();
        let key = q.raw.key();
        // Receives the QP took from its SRQ and nobody polled: their SRQ slots are freed (the
        // ones still in the CQ once the QP is gone come to `leftover`).
        let mut srq = q.srq.and_then(|i| self.srqs.at_mut(i));
        let mut free_srq_slot = |c: &sys::RawCompletion| {
            if let (Some(slot), Some(srq)) = (crate::onesided::srq_slot(c.wr_id), srq.as_mut()) {
                srq.pool.complete(slot);
            }
        };
        let mut early = Vec::new();
        q.early.hand_out(usize::MAX, &mut early);
        early.iter().for_each(&mut free_srq_slot);
        let QpEntry { raw, .. } = q;
        let result = match raw.destroy_then(&e.raw, free_srq_slot) {
            Ok(_pd) => Ok(()),
            Err((Some(raw), errno)) => {
                // Not attached to this id (cannot happen): keep the QP (what was prefetched of
                // its SRQ's receives is lost with the slots, which stay held).
                e.qp = Some(QpEntry { raw, ..q });
                return Err(os_error(Call::DestroyQp, errno));
            }
            // The QP is gone; its CQ or buffers could not be released and were leaked.
            Err((None, errno)) => Err(os_error(Call::DestroyQp, errno)),
        };
        self.inbox.disown(key);
        e.machine = next;
        self.qps -= 1;
        self.release_pd(context, Some(index));
        result
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn listen(&mut self, id: IdHandle, backlog: i32) -> Result<()> {
        let e = self.id(Call::Listen, id)?;
        let next = e.machine.listen()?;
        e.raw.listen(backlog).map_err(|err| os_error(Call::Listen, err))?;
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn connect(&mut self, id: IdHandle, param: &ConnParam) -> Result<()> {
        let e = self.id(Call::Connect, id)?;
        let next = if e.machine.uses_external_qp(param) {
            e.machine.connect_external(param.private_data.len())?
        } else {
            e.machine.connect(param.private_data.len())?
        };
        if e.raw.verbs().is_none() {
            return Err(CmError::NoDevice { call: Call::Connect });
        }
        e.raw.connect(param).map_err(|err| os_error(Call::Connect, err))?;
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn accept(&mut self, id: IdHandle, param: &ConnParam) -> Result<()> {
        let e = self.id(Call::Accept, id)?;
        let external = e.machine.uses_external_qp(param);
        let next = if external {
            e.machine.accept_external(param.private_data.len())?
        } else {
            e.machine.accept(param.private_data.len())?
        };
        if e.raw.verbs().is_none() {
            return Err(CmError::NoDevice { call: Call::Accept });
        }
        // An external QP is the application's: librdmacm then takes its number from `param`.
        if !external && (e.qp.is_none() || !e.raw.has_qp()) {
            return Err(CmError::NoQp { call: Call::Accept });
        }
        if let Err(err) = e.raw.accept(param) {
            // librdmacm moves the QP through RTR and RTS before the kernel call, and to ERR when
            // that fails: follow the QP's real state.
            if e.qp.as_ref().is_some_and(|q| q.raw.in_error()) {
                e.machine = e.machine.qp_error();
            }
            return Err(os_error(Call::Accept, err));
        }
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn reject(&mut self, id: IdHandle, private_data: &[u8]) -> Result<()> {
        let e = self.id(Call::Reject, id)?;
        let next = e.machine.reject(private_data.len())?;
        e.raw
            .reject(private_data)
            .map_err(|err| os_error(Call::Reject, err))?;
        e.machine = next;
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn init_qp_attr(&mut self, id: IdHandle, qp_state: QpState) -> Result<QpAttr> {
        self.init_qp_attr_checked(id, qp_state)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn establish(&mut self, id: IdHandle) -> Result<()> {
        self.establish_checked(id)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn disconnect(&mut self, id: IdHandle) -> Result<()> {
        let e = self.id(Call::Disconnect, id)?;
        let next = e.machine.disconnect()?;
        match e.raw.disconnect() {
            Ok(()) => {
                e.machine = next;
                Ok(())
            }
            Err(err) => {
                // librdmacm moves the QP to ERR before the kernel call, which may then fail.
                if e.qp.as_ref().is_some_and(|q| q.raw.in_error()) {
                    e.machine = e.machine.qp_error();
                }
                Err(os_error(Call::Disconnect, err))
            }
        }
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn get_cm_event(&mut self, channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>> {
        let ch = self.channel_index(Call::GetCmEvent, channel)?;
        let mut bound = convert::Bound::new(timeout);
        loop {
            match self.channels.at(ch).expect("checked").raw.get_event() {
                Ok(raw) => {
                    if let Some(event) = self.admit(ch, raw) {
                        return Ok(Some(event));
                    }
                }
                Err(e) if would_block(e) || e == libc::EINTR => {}
                Err(e) => return Err(os_error(Call::GetCmEvent, e)),
            }
            let Some(left) = bound.left() else {
                return Ok(None);
            };
            match self
                .channels
                .at(ch)
                .expect("checked")
                .raw
                .wait_readable(convert::millis_ceil(left))
            {
                Ok(_) => {}
                Err(e) if e == libc::EINTR => {}
                Err(e) => return Err(os_error(Call::GetCmEvent, e)),
            }
        }
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn try_get_cm_event(&mut self, channel: ChannelHandle) -> Result<Option<CmEvent>> {
        let ch = self.channel_index(Call::GetCmEvent, channel)?;
        loop {
            // The fd is non-blocking: EAGAIN at once when nothing is queued.
            match self.channels.at(ch).expect("checked").raw.get_event() {
                Ok(raw) => {
                    if let Some(event) = self.admit(ch, raw) {
                        return Ok(Some(event));
                    }
                }
                Err(e) if would_block(e) => return Ok(None),
                Err(e) if e == libc::EINTR => {}
                Err(e) => return Err(os_error(Call::GetCmEvent, e)),
            }
        }
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn ack_cm_event(&mut self, event: CmEvent) -> Result<()> {
        if event.counted_id().owner() != self.tag {
            // Another backend's: refused before anything is consumed, and handed back so that it
            // can still be acked where it came from.
            return Err(CmError::ForeignEvent(cm_core::backend::returned_event(event)));
        }
        let token = event.token();
        match self.events.get(&token) {
            Some(rec) if rec.id == event.id() && rec.ty == event.event() => {}
            _ => return Err(CmError::EventNotOutstanding),
        }
        let rec = self.events.remove(&token).expect("checked");
        // rdma_ack_cm_event frees the event whatever it returns (it fails only for NULL).
        let result = rec.raw.ack().map_err(|e| os_error(Call::AckCmEvent, e));
        if let Some(ch) = self.channels.at_mut(rec.channel) {
            ch.unacked = ch.unacked.saturating_sub(1);
        }
        if let Some(e) = self.ids.at_mut(rec.counted) {
            if let Ok(next) = e.machine.on_ack() {
                e.machine = next;
            }
        }
        result
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn set_option(&mut self, id: IdHandle, option: IdOption) -> Result<()> {
        self.set_option_checked(id, option)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn migrate_id(&mut self, id: IdHandle, channel: ChannelHandle) -> Result<()> {
        self.migrate_id_checked(id, channel)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn get_local_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>> {
        let e = self.id(Call::GetLocalAddr, id)?;
        Ok(convert::reported_addr(e.raw.local_addr()))
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn get_peer_addr(&mut self, id: IdHandle) -> Result<Option<SocketAddr>> {
        let e = self.id(Call::GetPeerAddr, id)?;
        Ok(convert::reported_addr(e.raw.peer_addr()))
    }

    // The payload is left out of the record (it may be large); its length is in.
    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "debug", skip(self, data), fields(len = data.len()), ret)
    )]
    fn post_send(&mut self, id: IdHandle, wr_id: u64, data: &[u8]) -> Result<()> {
        let call = Call::PostSend;
        let e = self.id(call, id)?;
        let Some(q) = e.qp.as_mut() else {
            // The machine names the refusal (no QP, or a state that allows nothing).
            e.machine.post_send()?;
            return Err(CmError::NoQp { call });
        };
        // The gate also refuses sends on datagram QPs, whose missing address handle a provider
        // would dereference, and flushes a send on a QP in ERR, which not every provider
        // completes (see the pool's docs).
        let (caps, outstanding) = (q.caps, q.pool.outstanding(WcOpcode::Send));
        let device_failed = || q.device_failed().map_err(|err| os_error(call, err));
        match post_gate(
            &mut e.machine,
            &caps,
            WcOpcode::Send,
            data.len(),
            outstanding,
            device_failed,
        )? {
            Admission::Flush => {
                let taken = q.pool.flush(WcOpcode::Send, wr_id);
                debug_assert!(taken, "the gate checked the slot");
            }
            Admission::Post => {
                let slot = q
                    .pool
                    .post(WcOpcode::Send, wr_id, data.len() as u32)
                    .expect("the gate checked the slot");
                if let Err(err) = q.raw.post_send(slot, data) {
                    q.pool.unpost(slot);
                    return Err(os_error(call, err));
                }
            }
        }
        Ok(())
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn post_recv(&mut self, id: IdHandle, wr_id: u64, len: u32) -> Result<()> {
        let call = Call::PostRecv;
        let e = self.id(call, id)?;
        let Some(q) = e.qp.as_mut() else {
            e.machine.post_recv()?;
            return Err(CmError::NoQp { call });
        };
        // The device may have put the QP in ERR without a call of ours (an error completion not
        // polled yet): the gate counts that as ERR too, and then the receive is flushed here,
        // since rxe (Linux 6.1) never completes a receive posted on a QP in ERR.
        let (caps, outstanding) = (q.caps, q.pool.outstanding(WcOpcode::Recv));
        let device_failed = || q.device_failed().map_err(|err| os_error(call, err));
        match post_gate(
            &mut e.machine,
            &caps,
            WcOpcode::Recv,
            len as usize,
            outstanding,
            device_failed,
        )? {
            Admission::Flush => {
                let taken = q.pool.flush(WcOpcode::Recv, wr_id);
                debug_assert!(taken, "the gate checked the slot");
            }
            Admission::Post => {
                let slot = q
                    .pool
                    .post(WcOpcode::Recv, wr_id, len)
                    .expect("the gate checked the slot");
                if let Err(err) = q.raw.post_recv(slot, len) {
                    q.pool.unpost(slot);
                    return Err(os_error(call, err));
                }
            }
        }
        Ok(())
    }

    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "debug", skip(self, out), ret)
    )]
    fn poll_cq(
        &mut self,
        id: IdHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize> {
        let index = self.qp_index(id)?;
        if max == 0 {
            return Ok(0);
        }
        // One bound for the whole wait, however many times the CQ is polled.
        let mut bound = convert::Bound::new(timeout);
        let mut round = 0;
        let mut armed = false;
        loop {
            let appended = self.drain_cq(index, out, max)?;
            if appended > 0 {
                return Ok(appended);
            }
            let Some(left) = bound.left() else {
                return Ok(0);
            };
            if round < YIELD_ROUNDS {
                // A completion is often microseconds away: yielding beats a system call.
                std::thread::yield_now();
                round += 1;
                continue;
            }
            let q = &self
                .ids
                .at(index)
                .expect("checked")
                .qp
                .as_ref()
                .expect("checked")
                .raw;
            if armed {
                match q.wait_cq_event(convert::millis_ceil(left)) {
                    Ok(_) => {}
                    Err(e) if e == libc::EINTR => {}
                    Err(e) => return Err(os_error(Call::PollCq, e)),
                }
                armed = false;
            } else {
                // Armed, then polled once more (the loop's top) before waiting: a completion that
                // came before the arming raises no event.
                q.rearm().map_err(|e| os_error(Call::PollCq, e))?;
                armed = true;
            }
        }
    }

    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "debug", skip(self, out), ret)
    )]
    fn try_poll_cq(&mut self, id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize) -> Result<usize> {
        let index = self.qp_index(id)?;
        if max == 0 {
            return Ok(0);
        }
        let appended = self.drain_cq(index, out, max)?;
        if appended > 0 {
            return Ok(appended);
        }
        // Nothing there: arm the CQ for the caller's wait on `cq_fd`, then poll once more so that
        // a completion that came before the arming is not left waiting for an event.
        let q = &self
            .ids
            .at(index)
            .expect("checked")
            .qp
            .as_ref()
            .expect("checked")
            .raw;
        q.rearm().map_err(|e| os_error(Call::PollCq, e))?;
        self.drain_cq(index, out, max)
    }

    // The payload is left out of the record (it may be large); its length is in.
    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "debug", skip(self, data), fields(len = data.len()), ret)
    )]
    fn post_send_to(&mut self, id: IdHandle, wr_id: u64, dest: &UdParam, data: &[u8]) -> Result<()> {
        self.send_datagram(id, wr_id, dest, data)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn join_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        self.join_group(id, group)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn leave_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        self.leave_group(id, group)
    }
    fn id_machine(&self, id: IdHandle) -> Result<IdMachine> {
        // Calls made only to inspect use the `GetLocalAddr` tag: the trait has no call of its own
        // for this, and UnknownHandle needs one.
        let index = self.id_index(Call::GetLocalAddr, id)?;
        Ok(self.ids.at(index).expect("checked").machine)
    }

    fn live_resources(&self) -> LiveResources {
        LiveResources {
            channels: self.channels.len(),
            ids: self.ids.len(),
            qps: self.qps,
            unacked_events: self.events.len(),
            // librdmacm offers no way to count queued events without retrieving them.
            queued_events: 0,
            mrs: self.mrs.len(),
            srqs: self.srqs.len(),
        }
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn reg_mr(&mut self, id: IdHandle, len: usize, access: Access) -> Result<MrHandle> {
        self.reg_mr_checked(id, len, access)
    }

    fn mr_info(&self, mr: MrHandle) -> Result<MrInfo> {
        let r = &self.mrs.at(self.mr_index(Call::RegMr, mr)?).expect("checked").raw;
        Ok(MrInfo {
            addr: r.addr(),
            len: r.len(),
            lkey: r.lkey(),
            rkey: r.rkey(),
            access: r.access(),
        })
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        self.dereg_mr_checked(mr)
    }

    fn read_mr(&self, mr: MrHandle, offset: u64, out: &mut [u8]) -> Result<()> {
        let call = Call::ReadMr;
        let r = &self.mrs.at(self.mr_index(call, mr)?).expect("checked").raw;
        cm_core::check_range(call, offset, out.len(), r.len())?;
        r.read(offset, out).map_err(|err| os_error(call, err))
    }

    fn write_mr(&mut self, mr: MrHandle, offset: u64, data: &[u8]) -> Result<()> {
        let call = Call::WriteMr;
        let index = self.mr_index(call, mr)?;
        let r = &mut self.mrs.at_mut(index).expect("checked").raw;
        cm_core::check_range(call, offset, data.len(), r.len())?;
        r.write(offset, data).map_err(|err| os_error(call, err))
    }

    // The list is left out of the record (it may be long); the request's shape is in.
    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(level = "debug", skip(self, wr), fields(wr_id = wr.wr_id, op = wr.op.name(), len = wr.len()), ret)
    )]
    fn post_send_wr(&mut self, id: IdHandle, wr: &SendWr<'_>) -> Result<()> {
        self.post_send_wr_checked(id, wr)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn create_srq(&mut self, id: IdHandle, caps: SrqCaps) -> Result<SrqHandle> {
        self.create_srq_checked(id, caps)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<()> {
        self.destroy_srq_checked(srq)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn post_srq_recv(&mut self, srq: SrqHandle, wr_id: u64, len: u32) -> Result<()> {
        self.post_srq_recv_checked(srq, wr_id, len)
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()> {
        let call = Call::ModifySrq;
        let s = self.srqs.at(self.srq_index(call, srq)?).expect("checked");
        cm_core::check_srq_limit(limit, s.caps.max_wr)?;
        s.raw.arm_limit(limit).map_err(|err| os_error(call, err))
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn create_qp_on_srq(&mut self, id: IdHandle, caps: QpCaps, srq: SrqHandle) -> Result<QpCaps> {
        self.create_qp_with(id, caps, Some(srq))
    }

    #[cfg_attr(feature = "tracing", tracing::instrument(level = "debug", skip(self), ret))]
    fn get_async_event(&mut self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        self.get_async_event_checked(timeout)
    }
}

impl Drop for HwBackend {
    fn drop(&mut self) {
        // 1. Ack every held event, so no rdma_destroy_id below can block.
        for (_, rec) in std::mem::take(&mut self.events) {
            let _ = rec.raw.ack();
        }
        // 2. QPs with their CQs and buffers (each while its id is alive).
        for index in self.ids.indices() {
            let e = self.ids.at_mut(index).expect("listed");
            if let Some(q) = e.qp.take() {
                self.inbox.disown(q.raw.key());
                let _ = q.raw.destroy(&e.raw);
                self.qps -= 1;
            }
        }
        // 3. SRQs, now that no QP takes from them (one the device refuses leaks), then memory
        //    regions: each keeps its PD's device context open, whatever became of the ids.
        for index in self.srqs.indices() {
            if let Some(s) = self.srqs.take(index) {
                let key = s.raw.key();
                let _ = s.raw.destroy();
                self.inbox.disown(key);
            }
        }
        for index in self.mrs.indices() {
            if let Some(r) = self.mrs.take(index) {
                let _ = r.raw.dereg();
            }
        }
        // 4. Protection domains, each while its context is known to be open (the PD holds the
        //    device, or an id keeps it open); one with neither (or still busy) is leaked rather
        //    than freed on a closed context.
        for (context, pd) in std::mem::take(&mut self.pds) {
            let w = self.ids.values().find(|e| e.raw.verbs() == Some(context));
            let _ = pd.dealloc(w.map(|e| &e.raw));
        }
        // 5. Ids, child ids first. One librdmacm refuses is left to it.
        let mut order = self.ids.indices();
        order.sort_by_key(|&i| self.ids.at(i).is_some_and(|e| e.machine.role() != Role::Passive));
        for index in order {
            if let Some(e) = self.ids.take(index) {
                let _ = e.raw.destroy();
            }
        }
        self.by_addr.clear();
        // 6. Channels.
        for index in self.channels.indices() {
            if let Some(c) = self.channels.take(index) {
                let _ = c.raw.destroy();
            }
        }
    }
}
