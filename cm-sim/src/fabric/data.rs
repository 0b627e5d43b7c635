//! The data path: sends landing in posted receives, receiver-not-ready and transport retries.

use super::*;
use crate::qp::NextStep;

impl Fabric {
    /// Lands `sender`'s pending sends in its peer's posted receives while both allow it.
    /// Sends wait (as under receiver-not-ready retries, which are infinite by default) while
    /// the peer has no receive posted or its QP is not ready to receive.
    // The test that most calls stop at (every QP reaching RTS finds nothing to send) inline,
    // the delivery out of line.
    #[inline]
    pub(super) fn deliver_sends(&mut self, sender: SlotRef) {
        let pending = self.ids.get(sender).is_some_and(|s| {
            s.m.qp() == Some(QpState::Rts) && s.qp.as_ref().is_some_and(|q| q.has_pending_send())
        });
        if pending {
            self.deliver_pending_sends(sender);
        }
    }

    #[inline(never)]
    pub(super) fn deliver_pending_sends(&mut self, sender: SlotRef) {
        if self.verbs.is_some() && self.ids.get(sender).is_some_and(IdSlot::is_carrier) {
            // A verbs QP finds its peer when it sends (it may have come or gone since).
            self.link_verbs(sender);
        }
        loop {
            let Some(s) = self.ids.get(sender) else { return };
            let remote = s.remote;
            let sender_ready =
                s.m.qp() == Some(QpState::Rts) && s.qp.as_ref().is_some_and(|q| q.has_pending_send());
            // Most calls (every QP reaching RTS) find nothing to send: the receiver is looked
            // up only when there is.
            if !sender_ready {
                return;
            }
            // A QP that had work over regions: one-sided requests start here, and two-sided
            // sends wait for those in flight (see `fabric/onesided.rs`).
            match s.qp.as_ref().and_then(Qp::next_step) {
                None | Some(NextStep::TwoSided) => {}
                Some(NextStep::Wait) => return,
                Some(NextStep::OneSided) => {
                    self.start_one_sided(sender);
                    continue;
                }
            }
            if self.fail_head_locally(sender) {
                return;
            }
            let receiver_ready = self
                .ids
                .get(remote)
                .is_some_and(|r| matches!(r.m.qp(), Some(QpState::Rtr | QpState::Rts)) && self.has_recv(r));
            if self.path_broken(sender) {
                self.arm_transport_retry(sender);
                return;
            }
            if !receiver_ready {
                self.arm_rnr(sender);
                return;
            }
            if self
                .slot(sender)
                .qp
                .as_ref()
                .is_some_and(|q| q.head_wr().is_some())
            {
                if !self.land_wr(sender, remote) {
                    return;
                }
                continue;
            }
            let mut send = self
                .slot(sender)
                .qp
                .as_mut()
                .and_then(|q| q.pop_send())
                .expect("checked");
            let recv = self.take_recv(remote).expect("checked");
            let landing =
                self.slot(remote)
                    .qp
                    .as_mut()
                    .expect("checked")
                    .land_in(recv, send.take_data(), None, None);
            match landing {
                Landing::Delivered => {
                    self.slot(sender)
                        .qp
                        .as_mut()
                        .expect("checked")
                        .complete_send(send, WcStatus::Success);
                }
                Landing::TooLong => {
                    self.stats.length_errors += 1;
                    self.slot(sender)
                        .qp
                        .as_mut()
                        .expect("checked")
                        .complete_send(send, WcStatus::RemInvReqErr);
                    for id in [remote, sender] {
                        let next = self.slot(id).m.qp_error();
                        self.set_machine(id, next);
                    }
                    return;
                }
            }
        }
    }

    /// Sets the minimum RNR timer of `r`'s QP (`IBV_QP_MIN_RNR_TIMER`, its 5-bit encoding).
    pub(super) fn set_min_rnr_timer(&mut self, r: SlotRef, timer: u8) {
        if let Some(q) = self.slot(r).qp.as_mut() {
            q.min_rnr_timer = timer & 0x1f;
        }
    }

    /// The send at the head of `sender`'s queue found no receive: under a receiver-not-ready
    /// retry limit (the connection's, or a [`Fault::RnrRetries`] on the host), it gives up once
    /// the retries have run out (if it is still waiting then). rxe NAKs each try and waits the
    /// RNR timer before the next: `retries` waits, then `RNR_RETRY_EXC_ERR`.
    pub(super) fn arm_rnr(&mut self, sender: SlotRef) {
        let slot = self.slot(sender);
        let (host, own) = (slot.host, slot.retries.rnr());
        let Some(retries) = self.hosts[host as usize].rnr_retries.or((own < 7).then_some(own)) else {
            return;
        };
        // The receiver's minimum RNR timer, which its NAK carries, is what the sender waits.
        let receiver = self.slot(sender).remote;
        let timer = self
            .ids
            .get(receiver)
            .and_then(|r| r.qp.as_ref())
            .and_then(|q| rnr_timer_micros(q.min_rnr_timer))
            .map_or(nanos(self.cfg.rnr_timer), |us| us * 1000);
        let Some(qp) = self.slot(sender).qp.as_mut() else {
            return;
        };
        if qp.rnr_armed {
            return;
        }
        qp.rnr_armed = true;
        let sends_done = qp.sends_done;
        let at = self.now.after_nanos(timer.saturating_mul(u64::from(retries)));
        self.schedule(
            at,
            Action::Rnr {
                id: sender,
                sends_done,
            },
        );
    }

    /// Whether nothing `sender` sends can be acknowledged: its peer vanished with a crashed
    /// host or a removed device, either host is unreachable, or the link between them is
    /// partitioned. (A peer that destroyed its id told the IB CM; its sends still wait, as
    /// README's departures say.)
    pub(super) fn path_broken(&self, sender: SlotRef) -> bool {
        if !self.links_faulted && self.verbs.is_none() {
            return false;
        }
        let Some(s) = self.ids.get(sender) else {
            return false;
        };
        if s.is_carrier() && self.carrier_unanswered(s) {
            return true;
        }
        if !self.links_faulted {
            return false;
        }
        if s.peer_lost {
            return true;
        }
        let Some(r) = self.ids.get(s.remote) else {
            return false;
        };
        let (a, b) = (s.host as usize, r.host as usize);
        let n = self.hosts.len();
        !self.hosts[a].reachable() || !self.hosts[b].reachable() || self.links[a * n + b].partitioned
    }

    /// The send at the head of `sender`'s queue goes unacknowledged: the transport sends it
    /// again every local ACK timeout, `retry_count` times, then gives up.
    pub(super) fn arm_transport_retry(&mut self, sender: SlotRef) {
        let per_try = nanos(self.ack_timeout_of(sender));
        let tries = u64::from(self.slot(sender).retries.transport()) + 1;
        let Some(qp) = self.slot(sender).qp.as_mut() else {
            return;
        };
        if qp.retry_armed {
            return;
        }
        qp.retry_armed = true;
        let sends_done = qp.sends_done;
        let at = self.now.after_nanos(per_try.saturating_mul(tries));
        self.schedule(
            at,
            Action::TransportRetry {
                id: sender,
                sends_done,
            },
        );
    }

    pub(super) fn on_transport_retry(&mut self, id: SlotRef, sends_done: u64) {
        let Some(slot) = self.ids.get_mut(id) else { return };
        let rts = slot.m.qp() == Some(QpState::Rts);
        let Some(qp) = slot.qp.as_mut() else { return };
        if !rts || !qp.retry_armed || qp.sends_done != sends_done || !qp.has_pending_send() {
            return;
        }
        qp.retry_armed = false;
        if !self.path_broken(id) {
            // The path healed in time: one of the retries gets through.
            self.deliver_sends(id);
            return;
        }
        self.give_up_head(id, WcStatus::RetryExcErr);
        self.stats.transport_retries_exceeded += 1;
        let next = self.slot(id).m.qp_error();
        self.set_machine(id, next);
    }

    /// After a fault that may have cut paths: sends already waiting (for a receive, say) learn
    /// that their peer no longer answers. Fault path only: scans every id.
    pub(super) fn recheck_waiting_sends(&mut self) {
        for r in self.ids.refs() {
            if self
                .ids
                .get(r)
                .and_then(|s| s.qp.as_ref())
                .is_some_and(|q| q.has_pending_send())
            {
                self.deliver_sends(r);
            }
        }
    }

    /// The send at the head of `id`'s queue gives up with `status` (the caller moves the QP
    /// to ERR); a work request over regions says so in the trace.
    fn give_up_head(&mut self, id: SlotRef, status: WcStatus) {
        let slot = self.slot(id);
        let (host, peer) = (slot.host, slot.remote_host);
        let qp = slot.qp.as_mut().expect("checked");
        let send = qp.pop_send().expect("checked");
        let op = send.wr.as_ref().map(|w| crate::trace::RdmaOp::of(&w.op));
        qp.complete_send(send, status);
        if let Some(op) = op {
            self.trace.record(TraceRecord {
                time: self.now,
                host,
                id: id.index,
                what: TraceWhat::Rdma {
                    op,
                    step: crate::trace::RdmaStep::Completed,
                    peer,
                },
                status: status as i32,
            });
        }
    }

    pub(super) fn on_rnr(&mut self, id: SlotRef, sends_done: u64) {
        let Some(slot) = self.ids.get_mut(id) else { return };
        let rts = slot.m.qp() == Some(QpState::Rts);
        let Some(qp) = slot.qp.as_mut() else { return };
        if !rts || !qp.rnr_armed || qp.sends_done != sends_done || !qp.has_pending_send() {
            return;
        }
        self.give_up_head(id, WcStatus::RnrRetryExcErr);
        self.stats.rnr_retries_exceeded += 1;
        let next = self.slot(id).m.qp_error();
        self.set_machine(id, next);
    }
}

/// The wait, in µs, of the minimum RNR timer's encoding `timer` (IBA table 45, rxe's
/// `rnrnak_usec`); `None` for 0, whose 655.36 ms is the configured
/// [`rnr_timer`](crate::SimConfig::rnr_timer).
pub(crate) const fn rnr_timer_micros(timer: u8) -> Option<u64> {
    const MICROS: [u64; 32] = [
        655_360, 10, 20, 30, 40, 60, 80, 120, 160, 240, 320, 480, 640, 960, 1280, 1920, 2560, 3840, 5120,
        7680, 10_240, 15_360, 20_480, 30_720, 40_960, 61_440, 81_920, 122_880, 163_840, 245_760, 327_680,
        491_520,
    ];
    match timer & 0x1f {
        0 => None,
        t => Some(MICROS[t as usize]),
    }
}
