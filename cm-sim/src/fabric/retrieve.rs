//! Event retrieval: librdmacm's processing of each event in `rdma_get_cm_event`.

use super::dispatch::CarryOut;
use super::*;

impl Fabric {
    /// The next event of channel `ch`, retrieved. With `keep` false the caller acks it before
    /// anyone can hold it (`take_cm_event`): it gets no token unless its kind needs one later.
    // Inlined into both retrievals: out of line, the `Taken` it returns and the slab lookups
    // around it make the raw lifecycle slower.
    #[inline(always)]
    pub(super) fn pop_event(&mut self, ch: SlotRef, keep: bool) -> Option<Taken> {
        loop {
            let q = self.channels.get_mut(ch)?.queue.pop_front()?;
            let listener_alive = q.listen.is_none() || self.ids.contains(q.listen);
            // One lookup of the id for whether it lives, its host and its count.
            let host = match self.ids.get_mut(q.id) {
                Some(slot) if listener_alive => {
                    slot.queued -= 1;
                    slot.host
                }
                _ => {
                    // Its id was destroyed: the kernel discarded the event then.
                    self.drop_payload(q.payload);
                    continue;
                }
            };
            self.hosts[host as usize].counts.queued -= 1;
            match self.retrieve(q, host, keep) {
                Some(ev) => {
                    self.hosts[host as usize].counts.unacked += 1;
                    return Some(ev);
                }
                None => {
                    self.drop_payload(q.payload);
                }
            }
        }
    }

    /// librdmacm's processing of one event in `rdma_get_cm_event`; `None` when it swallows it
    /// (its payload is then still in the pool, for the caller to drop). `host` is the event's
    /// id's host (and its listener's: a child is made on its listener's host), which the caller
    /// looked up; `keep`: see [`pop_event`](Self::pop_event).
    #[inline(always)]
    pub(super) fn retrieve(&mut self, q: Queued, host: u16, keep: bool) -> Option<Taken> {
        let mut event = q.event;
        let mut status = q.status;
        let mut listen_id = None;
        let counted = match event {
            CmEventType::ConnectRequest => {
                let listener = q.listen;
                let child = self.slot(q.id);
                child.visible = true;
                let popped = self
                    .slot(listener)
                    .listener
                    .as_mut()
                    .and_then(|l| l.pending.pop_front());
                debug_assert_eq!(popped, Some(q.id), "requests are retrieved in queue order");
                // Alive (`pop_event` checked) and on the child's host: no lookup for its host.
                listen_id = Some(cm_core::backend::id_handle(
                    self.tag(host),
                    listener.index,
                    listener.generation,
                ));
                listener
            }
            CmEventType::ConnectResponse => {
                let slot = self.slot(q.id);
                let connected = slot.m.port_space().is_connected();
                let outcome = slot.m.connect_response_outcome();
                let before = slot.cm;
                let mut fx = CarryOut::new(self, q.id, host, connected, SlotRef::NONE, u16::MAX, NO_PAYLOAD);
                let (seen, seen_status, next) =
                    before.on_connect_response_with(outcome, status, connected, &mut fx);
                // Set after its effect (the RTU), which does not read it, as `transition` does.
                let wire = self.payloads.get(q.payload).map(|p| p.wire);
                let slot = self.slot(q.id);
                slot.cm = next;
                if let Some(w) = wire {
                    slot.retries = slot.retries.with_rnr(w.rnr_retry_count);
                }
                if let (Some(qp), Some(w)) = (slot.qp.as_mut(), wire) {
                    // librdmacm moves the QP to RTR and RTS with what the REP granted: the
                    // peer's responder resources are this side's initiator depth.
                    qp.initiator_depth = w.initiator_depth;
                    qp.responder_resources = w.responder_resources;
                }
                (event, status) = (seen, seen_status);
                self.record_event(host, q.id, event, status);
                q.id
            }
            CmEventType::Rejected | CmEventType::Disconnected if self.slot(q.id).cm.swallows(event) => {
                return None
            }
            CmEventType::MulticastJoin | CmEventType::MulticastError
                if !self.multicast_event_current(q.id, self.payloads.get(q.payload)) =>
            {
                // Its group was left before it was retrieved: the kernel dropped it then.
                return None;
            }
            CmEventType::MulticastJoin if self.attach_refused(q.id, self.payloads.get(q.payload)) => {
                // librdmacm's `ibv_attach_mcast` failed (`ENOMEM` past rxe's limits): it
                // reports the join so, with `rdma_seterrno`'s -1.
                (event, status) = (CmEventType::MulticastError, -1);
                q.id
            }
            _ => q.id,
        };
        let slot = self.slot(counted);
        let next = slot.m.on_event(event).unwrap_or_else(|illegal| {
            panic!(
                "cm-sim bug: generated an illegal event: {illegal}; reproduce with {SEED_ENV}={}",
                self.seed.value
            )
        });
        self.set_machine(counted, next);
        // The id is alive (`pop_event` checked): its handle needs no second lookup for its host.
        let id = cm_core::backend::id_handle(self.tag(host), q.id.index, q.id.generation);
        let multicast = matches!(event, CmEventType::MulticastJoin | CmEventType::MulticastError);
        // A multicast event's token names its join until it is acked, whoever acks it.
        let kept = keep || multicast;
        let token = if kept {
            debug_assert_eq!(self.slot(counted).host, host, "an event counts on its own host");
            let key = self.hosts[host as usize].token_key;
            token_of(
                self.outstanding.insert(Outstanding {
                    host,
                    counted,
                    id,
                    event,
                }),
                key,
            )
        } else {
            0
        };
        if multicast {
            let group = self.payloads.get(q.payload).and_then(|p| p.dst.get());
            self.on_multicast_retrieved(q.id, event, group, token);
        }
        Some(Taken {
            id,
            listen_id,
            event,
            status,
            payload: q.payload,
            token,
            counted,
            kept,
        })
    }

    /// Stores a new machine for `id`, flushing the QP if it just went to ERR.
    // Inlined, with what a change of QP state does out of line: most calls (every retrieved
    // event) leave the QP's state as it was, and paid a call and a frame for the two tests.
    #[inline(always)]
    pub(super) fn set_machine(&mut self, id: SlotRef, next: IdMachine) {
        let slot = self.slot(id);
        let before = slot.m.qp();
        slot.m = next;
        if before != next.qp() {
            self.qp_state_changed(id, before, next);
        }
    }

    #[inline(never)]
    fn qp_state_changed(&mut self, id: SlotRef, before: Option<QpState>, next: IdMachine) {
        let slot = self.slot(id);
        if before != Some(QpState::Err) && next.qp() == Some(QpState::Err) {
            if let Some(qp) = slot.qp.as_mut() {
                qp.flush();
            }
            if slot.is_carrier() {
                self.carrier_failed(id);
            }
        }
        let slot = self.slot(id);
        if before != Some(QpState::Rts) && next.qp() == Some(QpState::Rts) {
            // Sends that waited for this QP (or were posted on it before it was ready) can go.
            // `deliver_sends(id)`'s test on the slot at hand (its machine is `next`, at RTS).
            let remote = slot.remote;
            if slot.qp.as_ref().is_some_and(|q| q.has_pending_send()) {
                self.deliver_pending_sends(id);
            }
            self.deliver_sends(remote);
        }
    }
}
