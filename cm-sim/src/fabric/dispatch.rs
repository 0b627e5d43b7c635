//! Dispatch of scheduled actions, and the IB CM exchange's reactions to messages and timers.

use super::*;

impl Fabric {
    pub(super) fn dispatch(&mut self, action: Action) {
        match action {
            Action::Req {
                host,
                from,
                payload,
                attempt,
            } => self.on_req(host, from, payload, attempt),
            Action::ResendReq {
                host,
                from,
                payload,
                attempt,
            } => {
                if self
                    .ids
                    .get(from)
                    .is_some_and(|s| s.cm.awaits_answer_to(MsgKind::Req))
                {
                    self.stats.messages_resent += 1;
                    self.send_req(from, host, payload, attempt);
                } else {
                    self.drop_payload(payload);
                }
            }
            Action::Resend {
                kind,
                to,
                from,
                status,
                payload,
                attempt,
            } => {
                if self.ids.get(from).is_some_and(|s| s.cm.awaits_answer_to(kind)) {
                    self.stats.messages_resent += 1;
                    self.send_attempt(from, to, kind, status, payload, attempt);
                } else {
                    self.drop_payload(payload);
                }
            }
            Action::Fault(n) => {
                let fault = self.faults[n as usize].clone();
                self.strike(&fault);
            }
            Action::Rnr { id, sends_done } => self.on_rnr(id, sends_done),
            Action::TransportRetry { id, sends_done } => self.on_transport_retry(id, sends_done),
            Action::Msg {
                kind,
                to,
                from,
                status,
                payload,
            } => {
                if self.ids.contains(to) {
                    self.on_msg(kind, to, from, status, payload);
                } else {
                    self.drop_payload(payload);
                }
            }
            Action::Datagram(n) => self.on_datagram(n),
            Action::Timer { id, epoch, kind } => {
                if self.ids.get_mut(id).is_some_and(|s| s.timers.fire(epoch)) {
                    self.on_timer(id, kind);
                } else {
                    // Saturating: a timer of an id dropped without `release` was never counted.
                    self.stale_timers = self.stale_timers.saturating_sub(1);
                }
            }
        }
    }

    pub(super) fn on_timer(&mut self, id: SlotRef, kind: TimerKind) {
        match kind {
            TimerKind::AddrResolved => {
                // A wildcard-bound id takes the host's address of the destination's family.
                let slot = self.slot(id);
                let host = slot.host as usize;
                if let Some(local) = slot.local.get().filter(|l| l.ip().is_unspecified()) {
                    let ip = self.hosts[host]
                        .addrs
                        .iter()
                        .copied()
                        .find(|a| a.is_ipv4() == local.is_ipv4());
                    if let Some(ip) = ip {
                        self.slot(id).local = SocketAddr::new(ip, local.port()).into();
                    }
                }
                self.queue_event(id, SlotRef::NONE, CmEventType::AddrResolved, 0, NO_PAYLOAD);
            }
            TimerKind::AddrError => {
                let status = self.slot(id).pending_status;
                self.queue_event(id, SlotRef::NONE, CmEventType::AddrError, status, NO_PAYLOAD)
            }
            TimerKind::RouteResolved => {
                self.queue_event(id, SlotRef::NONE, CmEventType::RouteResolved, 0, NO_PAYLOAD)
            }
            TimerKind::RouteError => {
                let status = self.slot(id).pending_status;
                self.queue_event(id, SlotRef::NONE, CmEventType::RouteError, status, NO_PAYLOAD)
            }
            TimerKind::Cm(timer) => {
                let before = self.slot(id).cm;
                let next = self.transition(id, Input::Timer(timer), SlotRef::NONE, NO_PAYLOAD);
                if next.wire() != before.wire() {
                    match timer {
                        CmTimer::Req => self.stats.req_timeouts += 1,
                        CmTimer::Rep => self.stats.rep_timeouts += 1,
                        CmTimer::Dreq => self.stats.dreq_timeouts += 1,
                        CmTimer::Timewait => {}
                    }
                }
            }
        }
    }

    pub(super) fn on_req(&mut self, host: u16, from: SlotRef, payload: u32, attempt: u8) {
        let Some(active) = self.ids.get(from) else {
            self.drop_payload(payload);
            return;
        };
        // A host that crashed or lost its device while the REQ flew does not answer.
        if !active.cm.awaits_answer_to(MsgKind::Req) || !self.hosts[host as usize].reachable() {
            self.drop_payload(payload);
            return;
        }
        let ps = active.m.port_space();
        let src = active.local.get();
        let dst = self
            .payloads
            .get(payload)
            .and_then(|p| p.dst.get())
            .expect("REQ carries its destination");
        let retry_count = self.payloads.get(payload).map_or(0, |p| p.wire.retry_count);
        let listener = self.ports.listener(host, ps, dst.ip(), dst.port());
        let refuse = |no_listener: bool| match (ps.is_connected(), no_listener) {
            (true, true) => reason::INVALID_SERVICE_ID,
            (true, false) => reason::CONSUMER_DEFINED,
            (false, true) => reason::SIDR_UNSUPPORTED,
            (false, false) => reason::SIDR_REJECT,
        };
        let Some(listener) = listener else {
            self.drop_payload(payload);
            self.reply_without_id(host, from, refuse(true));
            return;
        };
        let l = self.ids.get(listener).expect("listening ids are bound and alive");
        let channel = l.channel;
        let cap = self.hosts[host as usize].backlog_cap;
        let full = l
            .listener
            .as_ref()
            .is_none_or(|ls| ls.pending.len() as u32 >= ls.backlog.min(cap));
        if full {
            // The kernel drops a request its listener has no room for, without an answer; the
            // sender's IB CM sends it again after its response timeout, until it gives up.
            self.stats.backlog_drops += 1;
            self.resend_req_later(from, host, payload, attempt);
            return;
        }
        let child = self.ids.insert(IdSlot {
            host,
            channel,
            m: IdMachine::new_child(ps),
            local: dst.into(),
            peer: src.into(),
            port_bound: false,
            cm: Exchange::requested(),
            remote: from,
            timers: IdTimers::default(),
            queued: 0,
            last_arrival: SimTime::ZERO,
            pending_status: 0,
            retry_count,
            peer_lost: false,
            visible: false,
            qp: None,
            listener: None,
        });
        self.ids_changed();
        self.hosts[host as usize].counts.ids += 1;
        self.channels.get_mut(channel).expect("listener's channel").ids += 1;
        self.slot(listener)
            .listener
            .as_mut()
            .expect("listener state")
            .pending
            .push_back(child);
        // The MRA/REP tells the active side who answers; the simulator links them at once.
        self.slot(from).remote = child;
        self.queue_event(child, listener, CmEventType::ConnectRequest, 0, payload);
    }

    /// A REJ (or SIDR REP with an error status) from a host with no id to answer for.
    pub(super) fn reply_without_id(&mut self, host: u16, to: SlotRef, status: i32) {
        let lat = self.latency();
        let Some(to_host) = self.ids.get(to).map(|d| d.host) else {
            return;
        };
        if self.lost(host, to_host) {
            self.trace_lost(host, SlotRef::NONE, MsgKind::Rej, to_host);
            return;
        }
        let extra = self.extra_delay(host, to_host);
        let dest = self.ids.get_mut(to).expect("checked");
        let arrival = self
            .now
            .after_nanos(lat)
            .after_nanos(extra)
            .max(dest.last_arrival);
        dest.last_arrival = arrival;
        self.trace_send(host, SlotRef::NONE, MsgKind::Rej, to_host, status);
        let pd = self.rej_payload(&[]);
        self.schedule(
            arrival,
            Action::Msg {
                kind: MsgKind::Rej,
                to,
                from: SlotRef::NONE,
                status,
                payload: pd,
            },
        );
    }

    #[inline(always)]
    pub(super) fn on_msg(&mut self, kind: MsgKind, to: SlotRef, from: SlotRef, status: i32, payload: u32) {
        // One arm per kind, each with the kind a constant: the inlined exchange then matches on
        // the wire state alone and most effects fold (issue 14).
        match kind {
            MsgKind::Req => self.on_msg_of(MsgKind::Req, to, from, status, payload),
            MsgKind::Rep => self.on_msg_of(MsgKind::Rep, to, from, status, payload),
            MsgKind::Rtu => self.on_msg_of(MsgKind::Rtu, to, from, status, payload),
            MsgKind::Rej => self.on_msg_of(MsgKind::Rej, to, from, status, payload),
            MsgKind::Dreq => self.on_msg_of(MsgKind::Dreq, to, from, status, payload),
            MsgKind::Drep => self.on_msg_of(MsgKind::Drep, to, from, status, payload),
        }
    }

    #[inline(always)]
    fn on_msg_of(&mut self, kind: MsgKind, to: SlotRef, from: SlotRef, status: i32, payload: u32) {
        self.transition(to, Input::Msg(kind, status), from, payload);
    }

    /// `id`'s exchange takes `input` and the fabric carries out the transition's effects in
    /// order, as the exchange names them. `sender` sent the message being handled (if any);
    /// `payload` is what that message or the call brought, handed to the effect that takes it
    /// and otherwise dropped. For inputs the exchange takes in the id's state: the calls that
    /// can be refused (accept, reject, establish) ask first.
    // Each effect is a constant where the exchange names it, so its match folds; a list of
    // effects built at run time (the wire state of a received message, a timer or a destroy
    // is known only then) was walked and matched (issue 14).
    #[inline(always)]
    pub(super) fn transition(
        &mut self,
        id: SlotRef,
        input: Input,
        sender: SlotRef,
        payload: u32,
    ) -> Exchange {
        let slot = self.slot(id);
        let (before, connected, host) = (slot.cm, slot.m.port_space().is_connected(), slot.host);
        let mut fx = CarryOut::new(self, id, host, sender, payload);
        let next = before
            .on_with(input, connected, &mut fx)
            .expect("the exchange takes this input in every state");
        let payload = fx.payload;
        // Set after the effects: no effect reads the exchange.
        self.slot(id).cm = next;
        self.drop_payload(payload);
        next
    }

    /// One effect of `id`'s transition; `payload` is what is left of the message's or call's
    /// payload (taken by the effect that carries it).
    #[inline(always)]
    fn carry_out(&mut self, id: SlotRef, host: u16, effect: Effect, sender: SlotRef, payload: &mut u32) {
        match effect {
            Effect::CancelTimers => self.cancel_timers(id),
            Effect::Arm(timer) => {
                let after = match timer {
                    CmTimer::Timewait => self.cfg.timewait,
                    CmTimer::Req | CmTimer::Rep | CmTimer::Dreq => self.cm_timeout_of(id),
                };
                self.timer(id, self.now + after, TimerKind::Cm(timer));
            }
            Effect::PeerIsSender => self.slot(id).remote = sender,
            Effect::Queue {
                event,
                status,
                with_message,
            } => {
                let carried = if with_message {
                    std::mem::replace(payload, NO_PAYLOAD)
                } else {
                    NO_PAYLOAD
                };
                self.queue_event(id, SlotRef::NONE, event, status, carried);
            }
            Effect::Send {
                msg: MsgKind::Req,
                carry,
                ..
            } => {
                debug_assert_eq!(carry, Carry::CallPayload, "a REQ carries the call's parameters");
                let req = std::mem::replace(payload, NO_PAYLOAD);
                let dst = self.slot(id).peer.get().expect("a resolved id has a destination");
                match self.host_of_ip(dst.ip()) {
                    Some(to_host) => self.send_req(id, to_host, req, 0),
                    None => {
                        // The REQ leaves for an address no host has: it is lost without a
                        // trace, after the same draw a sent one makes.
                        self.latency();
                        self.drop_payload(req);
                    }
                }
            }
            Effect::Send {
                msg,
                status,
                to,
                carry,
            } => {
                let dest = match to {
                    To::Peer => self.slot(id).remote,
                    To::Sender => sender,
                };
                if dest.is_none() {
                    // No REP or MRA named a peer yet: there is nobody to tell.
                    return;
                }
                let carried = match carry {
                    Carry::Nothing => NO_PAYLOAD,
                    Carry::EmptyPrivateData => self.rej_payload(&[]),
                    Carry::CallPayload => std::mem::replace(payload, NO_PAYLOAD),
                };
                self.send(host, id, dest, msg, status, carried);
            }
        }
    }
}

/// The fabric as the exchange's effector: each effect carried out on `id` as it is named.
pub(super) struct CarryOut<'a> {
    fabric: &'a mut Fabric,
    id: SlotRef,
    host: u16,
    sender: SlotRef,
    payload: u32,
}

impl<'a> CarryOut<'a> {
    /// Effects on `id`, a live id on `host`, for a message from `sender` (if any) with
    /// `payload` (if any), which an effect that carries it takes. What is left of `payload` is
    /// the caller's to drop.
    #[inline(always)]
    pub(super) fn new(fabric: &'a mut Fabric, id: SlotRef, host: u16, sender: SlotRef, payload: u32) -> Self {
        CarryOut {
            fabric,
            id,
            host,
            sender,
            payload,
        }
    }
}

impl Effector for CarryOut<'_> {
    #[inline(always)]
    fn effect(&mut self, effect: Effect) {
        self.fabric
            .carry_out(self.id, self.host, effect, self.sender, &mut self.payload);
    }
}
