//! Shared receive queues and the asynchronous events of their limits.
//!
//! An SRQ lives on its host's device, in a slab whose handles carry the host's tag, like its
//! regions. Its receives have buffers the simulator owns, of the SRQ's message size. A message
//! to a QP on the SRQ takes the SRQ's oldest receive when it lands, and the receive completes on
//! that QP's completion queue; its slot in the SRQ is held until that completion is polled (or
//! the QP is destroyed with it unpolled). Taking a receive that leaves fewer posted than the
//! armed limit queues `IBV_EVENT_SRQ_LIMIT_REACHED` on the host and disarms the limit
//! (`rxe_resp.c`'s `get_srq_wqe`); posting never does. A QP on the SRQ that goes to ERR leaves
//! the SRQ's receives where they are (rxe flushes only its own queue), and rxe raises no
//! `LAST_WQE_REACHED`, so neither does the simulator: the limit's event is the only
//! asynchronous event it makes.
//!
//! The SRQs are made with the first one: a run without one pays nothing.

use cm_core::backend::WrPool;
use cm_core::{check_srq_limit, AsyncEvent, SrqCaps, SrqHandle};

use super::*;
use crate::qp::{PostedRecv, TakenRecv, SRQ_SLOT};

/// One shared receive queue.
pub(super) struct Srq {
    caps: SrqCaps,
    /// The armed limit (0: disarmed).
    limit: u32,
    /// Its slots: receives posted, and taken but not polled.
    pub(super) pool: WrPool,
    recvs: VecDeque<PostedRecv>,
    /// The ids whose QPs take their receives from it, in the order they were made: receives
    /// posted let their peers' waiting sends land in that order.
    users: Vec<SlotRef>,
    /// The host's device when it was made.
    device_epoch: u32,
}

/// One host's SRQs and the asynchronous events they raised, not retrieved yet.
struct HostSrqs {
    slab: Slab<Srq>,
    events: VecDeque<AsyncEvent>,
}

/// Every host's SRQs, made with the first one.
pub(super) struct Srqs {
    hosts: Vec<HostSrqs>,
}

impl Srqs {
    fn new(hosts: usize) -> Self {
        Srqs {
            hosts: (0..hosts)
                .map(|_| HostSrqs {
                    slab: Slab::new(),
                    events: VecDeque::new(),
                })
                .collect(),
        }
    }

    pub(super) fn get_mut(&mut self, host: u16, r: SlotRef) -> Option<&mut Srq> {
        self.hosts[host as usize].slab.get_mut(r)
    }
}

impl Fabric {
    fn srqs_mut(&mut self) -> &mut Srqs {
        let hosts = self.hosts.len();
        self.srqs.get_or_insert_with(|| Box::new(Srqs::new(hosts)))
    }

    /// The SRQ `srq` names on `host`, for `call`.
    pub(super) fn srq_ref(&self, host: u16, srq: SrqHandle, call: Call) -> R<SlotRef> {
        let tag = self.up_host_tag(host, call)?;
        let r = SlotRef {
            index: srq.index(),
            generation: srq.generation(),
        };
        let known = srq.owner() == tag
            && self
                .srqs
                .as_deref()
                .is_some_and(|s| s.hosts[host as usize].slab.contains(r));
        if !known {
            return Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Srq,
            });
        }
        Ok(r)
    }

    fn srq(&mut self, host: u16, r: SlotRef) -> &mut Srq {
        self.srqs
            .as_mut()
            .and_then(|s| s.get_mut(host, r))
            .expect("cm-sim: live SRQ expected")
    }

    pub(crate) fn create_srq(&mut self, host: u16, id: IdHandle, caps: SrqCaps) -> R<SrqHandle> {
        let r = self.id_ref(host, id, Call::CreateSrq)?;
        self.ids.get(r).expect("checked").m.create_srq()?;
        self.make_srq(host, caps)
    }

    /// `ibv_create_srq` on the host's device, with no id: the SRQ verbs QPs
    /// (`verbs_create_qp_on_srq`) take their receives from.
    pub(crate) fn verbs_create_srq(&mut self, host: u16, caps: SrqCaps) -> R<SrqHandle> {
        let call = Call::CreateSrq;
        self.host_up(host, call)?;
        if !self.hosts[host as usize].device {
            return Err(CmError::NoDevice { call });
        }
        self.make_srq(host, caps)
    }

    /// `ibv_query_srq`: the SRQ's capabilities, with its limit as armed now (0: disarmed).
    pub(crate) fn query_srq(&self, host: u16, srq: SrqHandle) -> R<SrqCaps> {
        let r = self.srq_ref(host, srq, Call::QuerySrq)?;
        let s = self.srqs.as_deref().expect("checked").hosts[host as usize]
            .slab
            .get(r)
            .expect("checked");
        Ok(s.caps.with_limit(s.limit))
    }

    fn make_srq(&mut self, host: u16, caps: SrqCaps) -> R<SrqHandle> {
        let cfg = &self.cfg;
        caps.check(cfg.max_srq_wr, cfg.max_srq_sge, cfg.max_message_size)?;
        let (tag, epoch) = (self.tag(host), self.hosts[host as usize].device_epoch);
        let s = self.srqs_mut().hosts[host as usize].slab.insert(Srq {
            caps,
            // rxe arms a limit given at create (`rxe_srq_from_init`), where the spec ignores it.
            limit: caps.srq_limit,
            pool: WrPool::new(0, caps.max_wr),
            recvs: VecDeque::new(),
            users: Vec::new(),
            device_epoch: epoch,
        });
        self.hosts[host as usize].counts.srqs += 1;
        Ok(cm_core::backend::srq_handle(tag, s.index, s.generation))
    }

    pub(crate) fn destroy_srq(&mut self, host: u16, srq: SrqHandle) -> R<()> {
        let r = self.srq_ref(host, srq, Call::DestroySrq)?;
        let users = self.srq(host, r).users.len();
        if users > 0 {
            return Err(CmError::SrqBusy { qps: users as u32 });
        }
        let h = &mut self.srqs_mut().hosts[host as usize];
        h.slab.discard(r);
        // The kernel frees the SRQ's unread events with it (`uverbs_free_srq` ->
        // `ib_uverbs_release_uevent`): none names an SRQ that is gone.
        h.events
            .retain(|e| !matches!(e, AsyncEvent::SrqLimitReached { srq: s } if *s == srq));
        self.hosts[host as usize].counts.srqs -= 1;
        Ok(())
    }

    pub(crate) fn post_srq_recv(&mut self, host: u16, srq: SrqHandle, wr_id: u64, len: u32) -> R<()> {
        let call = Call::PostSrqRecv;
        let r = self.srq_ref(host, srq, call)?;
        let s = self.srq(host, r);
        if len > s.caps.max_message_size {
            return Err(CmError::InvalidArgument {
                call,
                reason: "receive buffer longer than the SRQ's max_message_size",
            });
        }
        let outstanding = s.pool.outstanding(WcOpcode::Recv);
        let Some(slot) = s.pool.post(WcOpcode::Recv, wr_id, len) else {
            return Err(CmError::QueueFull { call, outstanding });
        };
        s.recvs.push_back(PostedRecv { slot, len });
        // Sends waiting for a receive on any of the SRQ's QPs may land now.
        for user in s.users.clone() {
            if let Some(peer) = self.ids.get(user).map(|u| u.remote) {
                self.deliver_sends(peer);
            }
        }
        Ok(())
    }

    pub(crate) fn arm_srq_limit(&mut self, host: u16, srq: SrqHandle, limit: u32) -> R<()> {
        let r = self.srq_ref(host, srq, Call::ModifySrq)?;
        let s = self.srq(host, r);
        check_srq_limit(limit, s.caps.max_wr)?;
        s.limit = limit;
        Ok(())
    }

    /// The SRQ a QP about to be made on `host` names, checked: `UnknownHandle` for none of
    /// the host's, `InvalidArgument` for one of a device removed since.
    pub(super) fn srq_for_qp(&self, host: u16, srq: SrqHandle) -> R<SlotRef> {
        let call = Call::CreateQp;
        let r = self.srq_ref(host, srq, call)?;
        let epoch = self.srqs.as_deref().expect("checked").hosts[host as usize]
            .slab
            .get(r)
            .expect("checked")
            .device_epoch;
        if epoch != self.hosts[host as usize].device_epoch {
            return Err(CmError::InvalidArgument {
                call,
                reason: "shared receive queue of another device",
            });
        }
        Ok(r)
    }

    /// The QP of id `r` was made on SRQ `srq`.
    pub(super) fn join_srq(&mut self, host: u16, srq: SlotRef, r: SlotRef) {
        self.srq(host, srq).users.push(r);
    }

    /// The QP of id `r`, on SRQ `srq`, is destroyed: it no longer uses the SRQ, and the
    /// receives it took and nobody polled give their slots back.
    pub(super) fn leave_srq(&mut self, host: u16, srq: SlotRef, r: SlotRef, unpolled: &[u64]) {
        let Some(s) = self.srqs.as_mut().and_then(|s| s.get_mut(host, srq)) else {
            return;
        };
        s.users.retain(|&u| u != r);
        for &slot in unpolled {
            s.pool.complete(slot);
        }
    }

    /// Whether a message to the QP of id `r` finds a receive: on the QP's own queue, or on its
    /// SRQ's.
    pub(super) fn has_recv(&self, r: &IdSlot) -> bool {
        let Some(qp) = r.qp.as_ref() else {
            return false;
        };
        if !r.m.uses_srq() {
            return qp.has_recv();
        }
        qp.srq()
            .and_then(|srq| self.srqs.as_deref()?.hosts[r.host as usize].slab.get(srq))
            .is_some_and(|s| !s.recvs.is_empty())
    }

    /// Takes the receive a message to the QP of id `r` lands in: its own queue's next, or its
    /// SRQ's, which may cross the SRQ's limit.
    pub(super) fn take_recv(&mut self, r: SlotRef) -> Option<TakenRecv> {
        let slot = self.ids.get_mut(r)?;
        let host = slot.host;
        let qp = slot.qp.as_mut()?;
        if !slot.m.uses_srq() {
            return qp.take_recv();
        }
        let srq = qp.srq()?;
        let tag = self.hosts[host as usize].tag;
        let h = &mut self.srqs.as_mut()?.hosts[host as usize];
        let s = h.slab.get_mut(srq)?;
        let recv = s.recvs.pop_front()?;
        if s.limit > 0 && (s.recvs.len() as u64) < u64::from(s.limit) {
            s.limit = 0;
            let srq = cm_core::backend::srq_handle(tag, srq.index, srq.generation);
            h.events.push_back(AsyncEvent::SrqLimitReached { srq });
        }
        Some(TakenRecv {
            wr_id: SRQ_SLOT | u64::from(recv.slot),
            len: recv.len,
        })
    }

    /// `ibv_get_async_event` on the host's device: waits in virtual time, as `get_cm_event`
    /// does.
    pub(crate) fn get_async_event(&mut self, host: u16, timeout: Duration) -> R<Option<AsyncEvent>> {
        self.host_up(host, Call::GetAsyncEvent)?;
        let deadline = self.deadline(timeout);
        let queued = |f: &Fabric| {
            f.srqs
                .as_deref()
                .is_some_and(|s| !s.hosts[host as usize].events.is_empty())
        };
        loop {
            if let Some(ev) = self
                .srqs
                .as_mut()
                .and_then(|s| s.hosts[host as usize].events.pop_front())
            {
                return Ok(Some(ev));
            }
            if !self.run_until_next(deadline, queued) {
                return Ok(None);
            }
        }
    }

    /// The host crashed: its SRQs and its events not retrieved go with it.
    pub(super) fn crash_srqs(&mut self, host: u16) {
        if let Some(s) = self.srqs.as_mut() {
            let h = &mut s.hosts[host as usize];
            for r in h.slab.refs() {
                h.slab.discard(r);
            }
            h.events.clear();
        }
    }
}
