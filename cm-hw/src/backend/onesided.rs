//! One-sided work on the hardware backend: memory regions, work requests over them, shared
//! receive queues and asynchronous events, each checked with cm-core's rules (the simulator's)
//! before verbs is called.

use std::time::Duration;

use cm_core::backend::{send_wr_gate, Admission, WrPool};
use cm_core::{
    Access, AsyncEvent, Call, CmError, HandleKind, IdHandle, LocalRegion, MrHandle, QpState, Result, SendWr,
    SrqCaps, SrqHandle, WcOpcode,
};

use super::{slot_ref, HwBackend, MrEntry, SrqEntry, MAX_MESSAGE_SIZE, MAX_MR_SIZE, MAX_QP_BUFFER_BYTES};
use crate::convert::{self, os_error};
use crate::onesided::{self as map, QpEventKind, Subject};
use crate::sys::{self, RawAsyncEvent};

impl HwBackend {
    /// The slab index of a region of this backend; [`CmError::UnknownHandle`] otherwise.
    pub(super) fn mr_index(&self, call: Call, h: MrHandle) -> Result<u32> {
        if h.owner() == self.tag && self.mrs.contains(slot_ref(h.index(), h.generation())) {
            Ok(h.index())
        } else {
            Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Mr,
            })
        }
    }

    /// The slab index of an SRQ of this backend; [`CmError::UnknownHandle`] otherwise.
    pub(super) fn srq_index(&self, call: Call, h: SrqHandle) -> Result<u32> {
        if h.owner() == self.tag && self.srqs.contains(slot_ref(h.index(), h.generation())) {
            Ok(h.index())
        } else {
            Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Srq,
            })
        }
    }

    /// `ibv_reg_mr` of `len` fresh zeroed bytes with `access`, on the PD of the id's device.
    pub(super) fn reg_mr_checked(&mut self, id: IdHandle, len: usize, access: Access) -> Result<MrHandle> {
        let call = Call::RegMr;
        let index = self.id_index(call, id)?;
        self.ids.at(index).expect("checked").machine.reg_mr()?;
        access.check()?;
        if len == 0 || len as u64 > MAX_MR_SIZE {
            return Err(CmError::InvalidArgument {
                call,
                reason: "memory region length out of range (1..=max_mr_size)",
            });
        }
        let context = self.ensure_pd(call, index)?;
        match sys::Region::register(&self.pds[&context], len, access) {
            Ok(raw) => {
                let r = self.mrs.insert(MrEntry { raw });
                Ok(cm_core::backend::mr_handle(self.tag, r.index, r.generation))
            }
            Err(err) => {
                self.release_pd(context, Some(index));
                Err(os_error(call, err))
            }
        }
    }

    /// `ibv_dereg_mr`, then the memory is freed; the PD goes with its last user.
    pub(super) fn dereg_mr_checked(&mut self, mr: MrHandle) -> Result<()> {
        let call = Call::DeregMr;
        let index = self.mr_index(call, mr)?;
        let entry = self.mrs.take(index).expect("checked");
        let context = entry.raw.context();
        // rxe refuses only while memory windows are bound, which the trait never binds; a
        // failure leaks the region (the device may still reach it) and is reported.
        entry.raw.dereg().map_err(|err| os_error(call, err))?;
        self.release_pd(context, None);
        Ok(())
    }

    /// `ibv_post_send` of `wr` on the id's QP, after `send_wr_gate`: the machine's rule, the
    /// request's own checks against the QP's initiator depth, each entry against its region,
    /// a failed QP (flushed), a full queue.
    pub(super) fn post_send_wr_checked(&mut self, id: IdHandle, wr: &SendWr<'_>) -> Result<()> {
        let call = Call::PostSend;
        let index = self.id_index(call, id)?;
        let (tag, mrs) = (self.tag, &self.mrs);
        let e = self.ids.at_mut(index).expect("checked");
        let Some(q) = e.qp.as_mut() else {
            // The machine names the refusal (no QP, or a state that allows nothing).
            e.machine.post_send_wr(&wr.op)?;
            return Err(CmError::NoQp { call });
        };
        // The depth matters only to a READ or atomic the machine lets through; the QP is then in
        // RTS (or ERR after it), where librdmacm has set it for good.
        let depth = if wr.op.is_read_or_atomic()
            && e.machine.post_send_wr(&wr.op).is_ok()
            && matches!(e.machine.qp(), Some(QpState::Rts | QpState::Err))
        {
            match q.rd_atomic {
                Some(depth) => depth,
                None => {
                    let depth = q.raw.max_rd_atomic().map_err(|err| os_error(call, err))?;
                    q.rd_atomic = Some(depth);
                    depth
                }
            }
        } else {
            0
        };
        let context = q.raw.context();
        let region_of = |mr: MrHandle| -> Option<&sys::Region> {
            (mr.owner() == tag && mrs.contains(slot_ref(mr.index(), mr.generation())))
                .then(|| &mrs.at(mr.index()).expect("checked").raw)
        };
        let region = |mr: MrHandle| {
            region_of(mr).map(|r| LocalRegion {
                len: r.len(),
                access: r.access(),
                same_device: r.context() == context,
            })
        };
        let (caps, outstanding) = (q.caps, q.pool.outstanding(WcOpcode::Send));
        let device_failed = || q.device_failed().map_err(|err| os_error(call, err));
        let opcode = wr.op.wc_opcode();
        match send_wr_gate(
            &mut e.machine,
            &caps,
            wr,
            depth,
            outstanding,
            region,
            device_failed,
        )? {
            Admission::Flush => {
                let taken = q.pool.flush(opcode, wr.wr_id);
                debug_assert!(taken, "the gate checked the slot");
            }
            Admission::Post => {
                let list: Vec<(&sys::Region, u64, u32)> = wr
                    .sg_list
                    .iter()
                    .map(|s| {
                        (
                            region_of(s.mr).expect("the gate checked every entry"),
                            s.offset,
                            s.len,
                        )
                    })
                    .collect();
                // At most u32::MAX bytes: the gate checked the sum.
                let slot = q
                    .pool
                    .post_with(opcode, wr.wr_id, wr.len() as u32, wr.signaled)
                    .expect("the gate checked the slot");
                if let Err(err) = q.raw.post_send_wr(slot, &map::shape(wr), &list) {
                    q.pool.unpost(slot);
                    return Err(os_error(call, err));
                }
            }
        }
        Ok(())
    }

    /// `ibv_create_srq` on the PD of the id's device, checked against the device's limits.
    pub(super) fn create_srq_checked(&mut self, id: IdHandle, caps: SrqCaps) -> Result<SrqHandle> {
        let call = Call::CreateSrq;
        let index = self.id_index(call, id)?;
        let e = self.ids.at(index).expect("checked");
        e.machine.create_srq()?;
        if e.raw.verbs().is_none() {
            return Err(CmError::NoDevice { call });
        }
        let (max_srq_wr, max_srq_sge) = e.raw.srq_limits().map_err(|err| os_error(call, err))?;
        caps.check(max_srq_wr, max_srq_sge, MAX_MESSAGE_SIZE)?;
        if u64::from(caps.max_wr) * u64::from(caps.max_message_size) > MAX_QP_BUFFER_BYTES {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_wr * max_message_size exceeds 1 GiB of registered buffers",
            });
        }
        let context = self.ensure_pd(call, index)?;
        match sys::Srq::create(&self.pds[&context], &caps) {
            Ok(raw) => {
                self.inbox.own(raw.key());
                let r = self.srqs.insert(SrqEntry {
                    raw,
                    pool: WrPool::new(0, caps.max_wr),
                    caps,
                });
                Ok(cm_core::backend::srq_handle(self.tag, r.index, r.generation))
            }
            Err(err) => {
                self.release_pd(context, Some(index));
                Err(os_error(call, err))
            }
        }
    }

    /// `ibv_destroy_srq`, refused while QPs take their receives from it.
    // The entry travels back through `take_with` once, when verbs refuses: its size is no
    // concern there.
    #[allow(clippy::result_large_err)]
    pub(super) fn destroy_srq_checked(&mut self, srq: SrqHandle) -> Result<()> {
        let call = Call::DestroySrq;
        let index = self.srq_index(call, srq)?;
        let users = self.srqs.at(index).expect("checked").raw.users();
        if users > 0 {
            return Err(CmError::SrqBusy {
                qps: u32::try_from(users).unwrap_or(u32::MAX),
            });
        }
        let s = &self.srqs.at(index).expect("checked").raw;
        let (context, key) = (s.context(), s.key());
        let destroyed = self.srqs.take_with(index, |entry| {
            let SrqEntry { raw, pool, caps } = entry;
            match raw.destroy() {
                Ok(()) => Ok(Ok(())),
                // Gone from the device with its slots leaked: gone from the backend too.
                Err((None, errno)) => Ok(Err(errno)),
                // verbs kept it: so does the backend, under the same handle.
                Err((Some(raw), errno)) => Err((SrqEntry { raw, pool, caps }, errno)),
            }
        });
        match destroyed.expect("checked") {
            Ok(gone) => {
                self.inbox.disown(key);
                self.release_pd(context, None);
                gone.map_err(|errno| os_error(call, errno))
            }
            Err(errno) => Err(os_error(call, errno)),
        }
    }

    /// `ibv_post_srq_recv` of a backend-owned buffer of `len` bytes.
    pub(super) fn post_srq_recv_checked(&mut self, srq: SrqHandle, wr_id: u64, len: u32) -> Result<()> {
        let call = Call::PostSrqRecv;
        let index = self.srq_index(call, srq)?;
        let s = self.srqs.at_mut(index).expect("checked");
        if len > s.caps.max_message_size {
            return Err(CmError::InvalidArgument {
                call,
                reason: "receive buffer longer than max_message_size",
            });
        }
        let outstanding = s.pool.outstanding(WcOpcode::Recv);
        if outstanding >= s.caps.max_wr {
            return Err(CmError::QueueFull { call, outstanding });
        }
        let slot = s.pool.post(WcOpcode::Recv, wr_id, len).expect("checked above");
        if let Err(err) = s.raw.post_recv(slot, len) {
            s.pool.unpost(slot);
            return Err(os_error(call, err));
        }
        Ok(())
    }

    /// The next asynchronous event about this backend's objects or devices, waiting at most
    /// `timeout` on the async fds of the devices it uses.
    pub(super) fn get_async_event_checked(&mut self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        let call = Call::GetAsyncEvent;
        let mut bound = convert::Bound::new(timeout);
        loop {
            self.inbox
                .read(self.pds.values())
                .map_err(|err| os_error(call, err))?;
            if let Some(raw) = self.inbox.take() {
                return Ok(Some(self.async_event(raw)));
            }
            let Some(left) = bound.left() else {
                return Ok(None);
            };
            match self.inbox.wait(self.pds.values(), convert::millis_ceil(left)) {
                Ok(_) => {}
                Err(e) if e == libc::EINTR => {}
                Err(e) => return Err(os_error(call, e)),
            }
        }
    }

    /// What a routed event is for the trait: the SRQ or the id it names, when it names one of
    /// this backend's; [`AsyncEvent::Other`] otherwise (a real event is never dropped). An event
    /// saying a QP failed moves its id's machine to QP ERR, as an error completion does.
    fn async_event(&mut self, raw: RawAsyncEvent) -> AsyncEvent {
        let other = AsyncEvent::Other { raw: raw.event_type };
        match raw.subject {
            Subject::Srq(key) if map::is_srq_limit(raw.event_type) => {
                let found = self
                    .srqs
                    .indices()
                    .into_iter()
                    .find(|&i| self.srqs.at(i).is_some_and(|s| s.raw.key() == key));
                match found {
                    Some(i) => AsyncEvent::SrqLimitReached {
                        srq: cm_core::backend::srq_handle(
                            self.tag,
                            i,
                            self.srqs.generation(i).expect("live"),
                        ),
                    },
                    None => other,
                }
            }
            Subject::Qp(key) => {
                let found = self.ids.indices().into_iter().find(|&i| {
                    self.ids
                        .at(i)
                        .and_then(|e| e.qp.as_ref())
                        .is_some_and(|q| q.raw.key() == key)
                });
                let Some(i) = found else {
                    return other;
                };
                if map::qp_event_kind(raw.event_type) == QpEventKind::Failed {
                    let e = self.ids.at_mut(i).expect("found");
                    e.machine = e.machine.qp_error();
                }
                map::qp_event(raw.event_type, self.id_handle(i))
            }
            _ => other,
        }
    }
}
