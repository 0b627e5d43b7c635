//! Verbs QPs that no id owns (`ibv_create_qp`, `ibv_modify_qp`), RC and UD.
//!
//! Such a QP lives in the id slab as a *carrier*: a slot with no channel, invisible to every
//! CM call (`id_ref` refuses it), whose [`IdMachine`] is
//! [`IdMachine::for_verbs_qp`] at the data path's view of the verbs state. The data path
//! (`data.rs`, `onesided.rs`) knows QPs by slot and reads their state from the slot's
//! machine, so it serves a carrier as it serves an id's QP: posting, landing, receiver-not-ready
//! and transport retries, one-sided requests, the flush on ERR, the trace. What is a carrier's
//! own is kept in a side table made with the first one ([`VerbsQps`]): its [`VerbsQp`] (the
//! verbs state and the attributes set), and the index by (host, QP number) through which an RTR
//! names its peer. A QP's peer is found when it sends: the QP its RTR's `dest_qp_num` names on
//! the host whose RoCE GID is the AV's `dgid`, if that QP names this one back. A send that
//! finds none, or finds it in neither RTR nor RTS, is lost as a packet to nobody is: the
//! transport retries run out and the send completes with `RETRY_EXC_ERR`. A UD QP is reachable
//! by its number from its creation (`datagram.rs` finds it as it finds an id's) and takes the
//! datagrams that carry its Q_Key once it is in RTR.

use std::collections::BTreeMap;

use cm_core::{
    QpAttrMask, QpHandle, QpType, SendWr, SrqHandle, UdParam, VerbsLimits, VerbsQp, VerbsQpAttr, VerbsQpState,
};

use super::*;

/// The carriers' own state.
#[derive(Default)]
pub(super) struct VerbsQps {
    machines: BTreeMap<SlotRef, VerbsQp>,
    by_qpn: BTreeMap<(u16, u32), SlotRef>,
}

/// The RoCE GID of an IP address, as `external.rs` gives it in address vectors.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl IdSlot {
    /// Whether the slot carries a verbs QP no id owns (no id has no channel).
    pub(super) fn is_carrier(&self) -> bool {
        self.channel == SlotRef::NONE
    }
}

impl Fabric {
    fn verbs_limits(&self) -> VerbsLimits {
        VerbsLimits {
            max_rd_atomic: self.cfg.max_rd_atomic,
            ..VerbsLimits::RXE
        }
    }

    /// The carrier `qp` names on `host`.
    fn carrier_ref(&self, host: u16, qp: QpHandle, call: Call) -> R<SlotRef> {
        let tag = self.up_host_tag(host, call)?;
        let r = SlotRef {
            index: qp.index(),
            generation: qp.generation(),
        };
        match self.ids.get(r) {
            Some(s) if qp.owner() == tag && s.host == host && s.is_carrier() => Ok(r),
            _ => Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Qp,
            }),
        }
    }

    fn machine_of(&self, r: SlotRef) -> VerbsQp {
        *self
            .verbs
            .as_ref()
            .and_then(|v| v.machines.get(&r))
            .expect("cm-sim: a carrier has a verbs machine")
    }

    /// `ibv_create_qp`, with `ibv_qp_init_attr.srq` when `srq` names one of the host's SRQs:
    /// the QP then takes its receives from it, and its own receive queue has no room
    /// (`max_recv_wr` and `max_recv_sge` are ignored and granted as 0, as rxe does).
    pub(crate) fn verbs_create_qp(
        &mut self,
        host: u16,
        ty: QpType,
        mut caps: QpCaps,
        srq: Option<SrqHandle>,
    ) -> R<(QpHandle, QpCaps)> {
        let call = Call::VerbsCreateQp;
        self.host_up(host, call)?;
        if !self.hosts[host as usize].device {
            return Err(CmError::NoDevice { call });
        }
        let srq = match srq {
            Some(s) => {
                let sr = self.srq_for_qp(host, s).map_err(|e| match e {
                    CmError::UnknownHandle { kind, .. } => CmError::UnknownHandle { call, kind },
                    CmError::InvalidArgument { reason, .. } => CmError::InvalidArgument { call, reason },
                    e => e,
                })?;
                if ty != QpType::Rc {
                    // As rdma_create_qp's: a UD receive puts the GRH ahead of the payload,
                    // which the SRQ's buffers, shared with RC QPs, have no room for here.
                    return Err(CmError::InvalidArgument {
                        call,
                        reason: "a shared receive queue serves RC QPs only here",
                    });
                }
                Some(sr)
            }
            None => None,
        };
        // rxe_qp_chk_cap checks the receive queue's capabilities only for a QP without an
        // SRQ, which has none of its own (granted as 0).
        let checked = if srq.is_some() {
            QpCaps {
                max_recv_wr: 1,
                max_recv_sge: 1,
                ..caps
            }
        } else {
            caps
        };
        checked.check(self.cfg.max_qp_wr, self.cfg.max_message_size)?;
        if srq.is_some() {
            caps.max_recv_wr = 0;
            caps.max_recv_sge = 0;
        }
        if caps.max_send_sge > self.cfg.max_sge
            || checked.max_recv_sge > self.cfg.max_sge
            || caps.max_inline_data > self.cfg.max_inline_data
        {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_send_sge / max_recv_sge / max_inline_data above the device's",
            });
        }
        let ps = match ty {
            QpType::Rc => PortSpace::Tcp,
            QpType::Ud => PortSpace::Udp,
        };
        let qpn = self.next_qpn;
        self.next_qpn = (self.next_qpn + 1) & 0x00FF_FFFF;
        let m = if srq.is_some() {
            IdMachine::for_verbs_qp_on_srq(ps, QpState::Reset)
        } else {
            IdMachine::for_verbs_qp(ps, QpState::Reset)
        };
        let r = self.ids.insert_with(|| IdSlot {
            host,
            channel: SlotRef::NONE,
            m,
            local: Addr::None,
            peer: Addr::None,
            port_bound: false,
            cm: Exchange::new(),
            remote_host: u16::MAX,
            kept: NO_PAYLOAD,
            remote: SlotRef::NONE,
            timers: IdTimers::default(),
            queued: 0,
            last_arrival: SimTime::ZERO,
            pending_status: 0,
            retries: Retries::NEW,
            peer_lost: false,
            visible: false,
            qp: Some(match srq {
                Some(s) => Qp::on_srq(qpn, caps, s),
                None => Qp::new(qpn, caps),
            }),
            listener: None,
        });
        self.ids_changed();
        if let Some(s) = srq {
            self.join_srq(host, s, r);
        }
        let v = self.verbs.get_or_insert_with(Box::default);
        v.machines.insert(r, VerbsQp::new(ty));
        v.by_qpn.insert((host, qpn), r);
        if ty == QpType::Ud {
            self.register_ud_qp(qpn, r);
        }
        self.hosts[host as usize].counts.qps += 1;
        Ok((
            cm_core::backend::qp_handle(self.tag(host), r.index, r.generation),
            caps,
        ))
    }

    pub(crate) fn verbs_qp_num(&self, host: u16, qp: QpHandle) -> R<u32> {
        let r = self.carrier_ref(host, qp, Call::QueryQp)?;
        Ok(self
            .ids
            .get(r)
            .and_then(|s| s.qp.as_ref())
            .expect("a carrier has its QP")
            .qpn)
    }

    pub(crate) fn verbs_query_qp(&self, host: u16, qp: QpHandle) -> R<VerbsQp> {
        let r = self.carrier_ref(host, qp, Call::QueryQp)?;
        Ok(self.machine_of(r))
    }

    pub(crate) fn verbs_modify_qp(
        &mut self,
        host: u16,
        qp: QpHandle,
        attr: &VerbsQpAttr,
        mask: QpAttrMask,
    ) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::ModifyQp)?;
        let before = self.machine_of(r);
        let next = before.modify(attr, mask, &self.verbs_limits())?;
        self.verbs.as_mut().expect("checked").machines.insert(r, next);
        let a = next.attr();
        let slot = self.slot(r);
        if mask.contains(QpAttrMask::RETRY_CNT) || mask.contains(QpAttrMask::RNR_RETRY) {
            slot.retries = Retries::new(a.retry_cnt, a.rnr_retry);
        }
        let q = slot.qp.as_mut().expect("a carrier has its QP");
        q.initiator_depth = a.max_rd_atomic;
        q.responder_resources = a.max_dest_rd_atomic;
        q.min_rnr_timer = a.min_rnr_timer;
        if mask.contains(QpAttrMask::TIMEOUT) && a.timeout > 0 {
            // The transport's wait for an acknowledgement is the id option's (4.096 µs ·
            // 2^timeout); 0 (wait for ever) keeps the configured one.
            let mut opts = self.id_options.get(&r).copied().unwrap_or_default();
            opts.set_ack_timeout(a.timeout);
            self.id_options.insert(r, opts);
        }
        self.link_verbs(r);
        let (ps, on_srq) = (self.slot(r).m.port_space(), self.slot(r).m.uses_srq());
        let data_path = next.state().data_path();
        let m = if on_srq {
            IdMachine::for_verbs_qp_on_srq(ps, data_path)
        } else {
            IdMachine::for_verbs_qp(ps, data_path)
        };
        self.set_machine(r, m);
        if next.state() == VerbsQpState::Reset && before.state() != VerbsQpState::Reset {
            // What was posted completes flushed (rxe discards it; its completions are the
            // only way the simulator's queues give slots back), and the QP is unlinked.
            if let Some(q) = self.slot(r).qp.as_mut() {
                q.flush();
            }
            self.unlink_verbs(r);
            // What RTS set goes with the rest: the next RTS sets it again.
            self.slot(r).retries = Retries::NEW;
            self.forget_options(r);
        }
        if matches!(next.state(), VerbsQpState::Rtr | VerbsQpState::Rts) {
            // A peer's sends that waited for this QP to be ready go now.
            let remote = self.slot(r).remote;
            self.deliver_sends(remote);
        }
        Ok(())
    }

    /// `ibv_modify_qp` of the QP `rdma_create_qp` gave `id`, which the CM moves: checked by
    /// the kernel's rules from the state the id's machine has it in. One that keeps the state
    /// is made (its minimum RNR timer is the one the simulator uses; the other attributes
    /// it takes are the CM's to set, and checked only); one that would move the QP is the
    /// CM's, refused with `ENOSYS`.
    pub(crate) fn modify_id_qp(
        &mut self,
        host: u16,
        id: IdHandle,
        attr: &VerbsQpAttr,
        mask: QpAttrMask,
    ) -> R<()> {
        let call = Call::ModifyQp;
        let r = self.id_ref(host, id, call)?;
        let m = self.slot(r).m;
        let state = match m.qp() {
            Some(QpState::Reset) => VerbsQpState::Reset,
            Some(QpState::Init) => VerbsQpState::Init,
            Some(QpState::Rtr) => VerbsQpState::Rtr,
            Some(QpState::Rts) => VerbsQpState::Rts,
            Some(QpState::Err) => VerbsQpState::Err,
            None => {
                return Err(CmError::InvalidArgument {
                    call,
                    reason: "the id has no QP",
                })
            }
        };
        let ty = if m.port_space().is_connected() {
            QpType::Rc
        } else {
            QpType::Ud
        };
        let next = VerbsQp::in_state(ty, state).modify(attr, mask, &self.verbs_limits())?;
        if next.state() != state {
            return Err(CmError::Os {
                call,
                errno: cm_core::errno::ENOSYS,
            });
        }
        if mask.contains(QpAttrMask::MIN_RNR_TIMER) {
            self.set_min_rnr_timer(r, next.attr().min_rnr_timer);
        }
        Ok(())
    }

    pub(crate) fn verbs_destroy_qp(&mut self, host: u16, qp: QpHandle) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::VerbsDestroyQp)?;
        if let Some(q) = self.slot(r).qp.as_ref() {
            if let Some(srq) = q.srq() {
                // The receives it took and nobody polled give their slots back to the SRQ.
                let unpolled = q.srq_slots_unpolled();
                self.leave_srq(host, srq, r, &unpolled);
            }
        }
        self.unlink_verbs(r);
        self.forget_carrier(r);
        self.ids.discard(r);
        self.ids_changed();
        self.forget_options(r);
        self.hosts[host as usize].counts.qps -= 1;
        Ok(())
    }

    /// Drops `r`'s side-table entries (the slot goes with the caller).
    pub(super) fn forget_carrier(&mut self, r: SlotRef) {
        let (host, qpn) = {
            let s = self.ids.get(r).expect("live carrier");
            (s.host, s.qp.as_ref().map_or(u32::MAX, |q| q.qpn))
        };
        if let Some(v) = self.verbs.as_mut() {
            v.machines.remove(&r);
            v.by_qpn.remove(&(host, qpn));
        }
    }

    /// The host whose RoCE GID is `gid`.
    fn host_of_gid(&self, gid: &[u8; 16]) -> Option<u16> {
        self.hosts
            .iter()
            .position(|h| h.addrs.iter().any(|ip| gid_of(*ip) == *gid))
            .map(|i| i as u16)
    }

    /// Where `r`'s RTR points: (host, QP number), once it has an AV and a destination.
    fn verbs_dest(&self, r: SlotRef) -> Option<(u16, u32)> {
        let m = self.verbs.as_ref()?.machines.get(&r)?;
        if !m.attr_mask().contains(QpAttrMask::AV | QpAttrMask::DEST_QPN) {
            return None;
        }
        let a = m.attr();
        Some((self.host_of_gid(&a.ah_attr.grh?.dgid)?, a.dest_qp_num))
    }

    /// `r`'s peer: the carrier its destination names, if that one names `r` back.
    fn verbs_peer(&self, r: SlotRef) -> Option<SlotRef> {
        let dest = self.verbs_dest(r)?;
        let p = *self.verbs.as_ref()?.by_qpn.get(&dest)?;
        let s = self.ids.get(r)?;
        let me = (s.host, s.qp.as_ref()?.qpn);
        (p != r && self.verbs_dest(p) == Some(me)).then_some(p)
    }

    /// Points `r` (and its peer) at each other as the data path's `remote`, or `r` at nobody.
    pub(super) fn link_verbs(&mut self, r: SlotRef) {
        let peer = self.verbs_peer(r);
        let old = self.slot(r).remote;
        if old != SlotRef::NONE && Some(old) != peer {
            if let Some(o) = self.ids.get_mut(old).filter(|o| o.remote == r) {
                o.remote = SlotRef::NONE;
                o.remote_host = u16::MAX;
            }
        }
        let host = self.slot(r).host;
        match peer {
            Some(p) => {
                let peer_host = self.slot(p).host;
                let slot = self.slot(r);
                if slot.remote != p {
                    slot.peer_lost = false;
                }
                slot.remote = p;
                slot.remote_host = peer_host;
                let ps = self.slot(p);
                if ps.remote != r {
                    ps.peer_lost = false;
                }
                ps.remote = r;
                ps.remote_host = host;
            }
            None => {
                let slot = self.slot(r);
                slot.remote = SlotRef::NONE;
                slot.remote_host = u16::MAX;
            }
        }
    }

    /// `r` stops being anyone's peer.
    fn unlink_verbs(&mut self, r: SlotRef) {
        let remote = self.slot(r).remote;
        if let Some(o) = self.ids.get_mut(remote).filter(|o| o.remote == r) {
            o.remote = SlotRef::NONE;
            o.remote_host = u16::MAX;
        }
        let slot = self.slot(r);
        slot.remote = SlotRef::NONE;
        slot.remote_host = u16::MAX;
    }

    /// Whether a carrier's packets reach nobody ready for them: no peer, or one in neither
    /// RTR nor RTS.
    pub(super) fn carrier_unanswered(&self, s: &IdSlot) -> bool {
        self.ids
            .get(s.remote)
            .is_none_or(|r| !matches!(r.m.qp(), Some(QpState::Rtr | QpState::Rts)))
    }

    /// The data path moved carrier `r`'s QP to ERR: its verbs machine follows.
    pub(super) fn carrier_failed(&mut self, r: SlotRef) {
        if let Some(m) = self.verbs.as_mut().and_then(|v| v.machines.get_mut(&r)) {
            *m = m.error();
        }
    }

    pub(crate) fn verbs_post_send(&mut self, host: u16, qp: QpHandle, wr_id: u64, data: &[u8]) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::PostSend)?;
        self.post_send_on(r, wr_id, data)
    }

    /// The Q_Key of carrier `r` (0 before one is set).
    pub(super) fn carrier_qkey(&self, r: SlotRef) -> u32 {
        self.verbs
            .as_ref()
            .and_then(|v| v.machines.get(&r))
            .map_or(0, |m| m.attr().qkey)
    }

    pub(crate) fn verbs_post_send_to(
        &mut self,
        host: u16,
        qp: QpHandle,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
        imm: Option<u32>,
    ) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::PostSend)?;
        self.post_send_to_on(host, r, wr_id, dest, data, imm)
    }

    pub(crate) fn verbs_post_recv(&mut self, host: u16, qp: QpHandle, wr_id: u64, len: u32) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::PostRecv)?;
        self.post_recv_on(r, wr_id, len)
    }

    pub(crate) fn verbs_post_send_wr(&mut self, host: u16, qp: QpHandle, wr: &SendWr<'_>) -> R<()> {
        let r = self.carrier_ref(host, qp, Call::PostSend)?;
        self.post_send_wr_on(host, r, wr)
    }

    pub(crate) fn verbs_poll_cq(
        &mut self,
        host: u16,
        qp: QpHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> R<usize> {
        let r = self.carrier_ref(host, qp, Call::PollCq)?;
        self.poll_cq_on(host, r, out, max, timeout)
    }
}
