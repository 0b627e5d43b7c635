//! Dispatch of scheduled actions, and the IB CM exchange's reactions to messages and timers.

use super::*;

/// A host not known (yet): a sender's, looked up when an effect needs it.
const UNKNOWN_HOST: u16 = u16::MAX;

impl Fabric {
    pub(super) fn dispatch(&mut self, action: Action) {
        match action {
            Action::Req { host, from, payload } => self.on_req(host, from, payload),
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
                    self.on_msg_for_gone_id(kind, from);
                }
            }
            Action::Datagram(n) => self.on_datagram(n),
            Action::Rdma(n) => self.on_rdma(n),
            Action::RdmaTimer { id, qpn } => self.on_rdma_timer(id, qpn),
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
            TimerKind::Cm(timer) => self.on_cm_timer(id, timer),
        }
    }

    /// An IB CM timer of `id` fired: a retry, a timeout, or the end of timewait. Out of line:
    /// the resolutions' timers, which fire in every lifecycle, stay small enough to inline.
    #[inline(never)]
    fn on_cm_timer(&mut self, id: SlotRef, timer: CmTimer) {
        let before = self.slot(id).cm.wire();
        let after = self
            .transition(id, Input::Timer(timer), SlotRef::NONE, UNKNOWN_HOST, NO_PAYLOAD)
            .wire();
        use crate::exchange::Wire::*;
        match (before, after) {
            _ if before == after => self.stats.messages_resent += 1,
            (ReqSent | MraReqRcvd, _) => self.stats.req_timeouts += 1,
            (RepSent | MraRepRcvd, _) => self.stats.rep_timeouts += 1,
            (DreqSent, _) => self.stats.dreq_timeouts += 1,
            _ => {}
        }
    }

    /// A REQ (first sent or a retry) arrives at `host`: a duplicate of a request the host holds
    /// goes to its child, a new one to the listener (`cm_req_handler`, `cm_match_req`).
    pub(super) fn on_req(&mut self, host: u16, from: SlotRef, payload: u32) {
        let Some(active) = self.ids.get(from) else {
            self.drop_payload(payload);
            return;
        };
        // A host that crashed or lost its device while the REQ flew does not answer; a REQ
        // whose sender was answered, gave up or was destroyed meanwhile is dropped.
        if !active.cm.requesting() || !self.hosts[host as usize].reachable() {
            self.drop_payload(payload);
            return;
        }
        let ps = active.m.port_space();
        let (src, active_host, known) = (active.local.get(), active.host, active.remote);
        if let Some(child) = self.ids.get(known) {
            if child.host == host && child.remote == from && child.cm.holds_request(ps.is_connected()) {
                self.drop_payload(payload);
                self.stats.duplicates += 1;
                self.transition(known, Input::Msg(MsgKind::Req, 0), from, active_host, NO_PAYLOAD);
                return;
            }
        }
        let dst = self
            .payloads
            .get(payload)
            .and_then(|p| p.dst.get())
            .expect("REQ carries its destination");
        let (retry_count, rnr_retry) = self
            .payloads
            .get(payload)
            .map_or((0, 7), |p| (p.wire.retry_count, p.wire.rnr_retry_count));
        let listener = self.ports.listener(host, ps, dst.ip(), dst.port());
        let refuse = |no_listener: bool| match (ps.is_connected(), no_listener) {
            (true, true) => reason::INVALID_SERVICE_ID,
            (true, false) => reason::CONSUMER_DEFINED,
            (false, true) => reason::SIDR_UNSUPPORTED,
            (false, false) => reason::SIDR_REJECT,
        };
        let Some(listener) = listener else {
            self.drop_payload(payload);
            self.answer_without_id(host, from, active_host, MsgKind::Rej, refuse(true));
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
            // The kernel drops a request its listener has no room for, without an answer
            // (ucma's backlog refuses the event, and the IB CM resets the child without a REJ
            // "to allow future retries"): the sender's next try may find room.
            self.stats.backlog_drops += 1;
            self.drop_payload(payload);
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
            remote_host: active_host,
            kept: NO_PAYLOAD,
            timers: IdTimers::default(),
            queued: 0,
            last_arrival: SimTime::ZERO,
            pending_status: 0,
            retries: Retries::new(retry_count, rnr_retry),
            peer_lost: false,
            visible: false,
            qp: None,
            listener: None,
        });
        self.ids_changed();
        self.path_of_child(from, child);
        self.hosts[host as usize].counts.ids += 1;
        self.channels.get_mut(channel).expect("listener's channel").ids += 1;
        self.slot(listener)
            .listener
            .as_mut()
            .expect("listener state")
            .pending
            .push_back(child);
        // The MRA/REP tells the active side who answers; the simulator links them at once.
        let a = self.slot(from);
        a.remote = child;
        a.remote_host = host;
        self.queue_event(child, listener, CmEventType::ConnectRequest, 0, payload);
    }

    /// A message from `from` for an id that no longer exists reached the host it was for (the
    /// sender's `remote_host`): that host's IB CM answers a DREQ with a DREP (`cm_issue_drep`)
    /// and drops the rest. A crashed host answers nothing, and neither does one whose DREQ's
    /// sender is gone too (the answer would find nobody).
    fn on_msg_for_gone_id(&mut self, kind: MsgKind, from: SlotRef) {
        if kind != MsgKind::Dreq {
            return;
        }
        let Some(sender) = self.ids.get(from) else {
            return;
        };
        let (host, from_host) = (sender.remote_host, sender.host);
        if !self.hosts.get(host as usize).is_some_and(Host::reachable) {
            return;
        }
        self.stats.dreps_without_id += 1;
        self.answer_without_id(host, from, from_host, MsgKind::Drep, 0);
    }

    /// An answer from `host`'s IB CM, which has no id to answer for (a REJ or SIDR REP with an
    /// error status for a REQ nobody listens for; a DREP for a DREQ whose id is gone), to the
    /// id `to` on `to_host`.
    pub(super) fn answer_without_id(
        &mut self,
        host: u16,
        to: SlotRef,
        to_host: u16,
        kind: MsgKind,
        status: i32,
    ) {
        let lat = self.latency();
        if self.lost(host, to_host, kind) {
            self.trace_lost(host, SlotRef::NONE, kind, to_host);
            return;
        }
        let extra = self.extra_delay(host, to_host);
        let mut arrival = self.now.after_nanos(lat).after_nanos(extra);
        if let Some(dest) = self.ids.get_mut(to) {
            arrival = arrival.max(dest.last_arrival);
            dest.last_arrival = arrival;
        }
        self.trace_send(host, SlotRef::NONE, kind, to_host, status);
        let payload = if kind == MsgKind::Rej {
            self.rej_payload(&[])
        } else {
            NO_PAYLOAD
        };
        self.schedule(
            arrival,
            Action::Msg {
                kind,
                to,
                from: SlotRef::NONE,
                status,
                payload,
            },
        );
    }

    #[inline(always)]
    pub(super) fn on_msg(&mut self, kind: MsgKind, to: SlotRef, from: SlotRef, status: i32, payload: u32) {
        // One arm per kind, each with the kind a constant: the inlined exchange then matches on
        // the wire state alone and most effects fold.
        match kind {
            MsgKind::Req => self.on_msg_of(MsgKind::Req, to, from, status, payload),
            MsgKind::Rep => self.on_msg_of(MsgKind::Rep, to, from, status, payload),
            MsgKind::Rtu => self.on_msg_of(MsgKind::Rtu, to, from, status, payload),
            MsgKind::Rej => self.on_msg_of(MsgKind::Rej, to, from, status, payload),
            MsgKind::Dreq => self.on_msg_of(MsgKind::Dreq, to, from, status, payload),
            MsgKind::Drep => self.on_msg_of(MsgKind::Drep, to, from, status, payload),
            MsgKind::Mra => self.on_msg_of(MsgKind::Mra, to, from, status, payload),
        }
    }

    /// The sender's host is looked up only by the effects that need it.
    #[inline(always)]
    fn on_msg_of(&mut self, kind: MsgKind, to: SlotRef, from: SlotRef, status: i32, payload: u32) {
        self.transition(to, Input::Msg(kind, status), from, UNKNOWN_HOST, payload);
    }

    /// `id`'s exchange takes `input` and the fabric carries out the transition's effects in
    /// order, as the exchange names them. `sender` (on `sender_host`) sent the message being
    /// handled (if any); `payload` is what that message or the call brought, handed to the
    /// effect that takes it and otherwise dropped. For inputs the exchange takes in the id's
    /// state: the calls that can be refused (accept, reject, establish) ask first.
    // Each effect is a constant where the exchange names it, so its match folds; a list of
    // effects built at run time (the wire state of a received message, a timer or a destroy
    // is known only then) would be walked and matched.
    #[inline(always)]
    pub(super) fn transition(
        &mut self,
        id: SlotRef,
        input: Input,
        sender: SlotRef,
        sender_host: u16,
        payload: u32,
    ) -> Exchange {
        let slot = self.slot(id);
        let (before, connected, host) = (slot.cm, slot.m.port_space().is_connected(), slot.host);
        let active = connected && slot.m.role() != cm_core::Role::Passive;
        let params = Params {
            connected,
            retries: self.cm_retries,
        };
        let mut fx = CarryOut::new(self, id, host, active, sender, sender_host, payload);
        let next = before
            .on_with(input, params, &mut fx)
            .expect("the exchange takes this input in every state");
        let payload = fx.payload;
        // Set after the effects: no effect reads the exchange.
        let slot = self.slot(id);
        slot.cm = next;
        if slot.kept != NO_PAYLOAD && !next.keeps_message() {
            // Answered, or given up: the message is not sent again.
            let kept = std::mem::replace(&mut slot.kept, NO_PAYLOAD);
            self.drop_payload(kept);
        }
        self.drop_payload(payload);
        next
    }

    /// What the exchange of `id` depends on besides its state.
    pub(super) fn params_of(&mut self, id: SlotRef) -> Params {
        Params {
            connected: self.slot(id).m.port_space().is_connected(),
            retries: self.cm_retries,
        }
    }

    /// What the IB CM of `id` waits for `timer`, and the queue's lane for that length. `active`:
    /// the active side of an RC exchange, which adds the path's lifetime to each try; the
    /// passive side waits what the REQ named, and a SIDR REQ the bare response timeout.
    #[inline(always)]
    fn cm_wait(&self, id: SlotRef, active: bool, timer: CmTimer) -> (u64, usize) {
        let w = if self.id_options.is_empty() {
            self.waits
        } else {
            self.waits_of(id)
        };
        match timer {
            CmTimer::Response if active => (w.active_try, 0),
            CmTimer::Response => (w.passive_try, 2),
            CmTimer::Service if active => (w.active_service, 3),
            CmTimer::Service => (w.passive_service, 3),
            CmTimer::Timewait => (w.timewait, 1),
        }
    }

    /// The call's `payload`, kept by `id` to send again until answered; returns the share the
    /// first copy carries.
    #[inline(always)]
    fn keep(&mut self, id: SlotRef, payload: &mut u32) -> u32 {
        let p = std::mem::replace(payload, NO_PAYLOAD);
        let old = std::mem::replace(&mut self.slot(id).kept, p);
        if p != NO_PAYLOAD {
            self.payloads.share(p);
        }
        self.drop_payload(old);
        p
    }

    /// A share of the payload `id` keeps, for a copy of its message (`NO_PAYLOAD`: none kept).
    fn kept_share(&mut self, id: SlotRef) -> u32 {
        let p = self.slot(id).kept;
        if p != NO_PAYLOAD {
            self.payloads.share(p);
        }
        p
    }

    /// One effect of `id`'s transition; `payload` is what is left of the message's or call's
    /// payload (taken by the effect that carries it).
    #[inline(always)]
    fn carry_out(&mut self, on: &On, effect: Effect, payload: &mut u32) {
        let (id, host, sender, known_host) = (on.id, on.host, on.sender, on.sender_host);
        // The sender's host, looked up only by the effects that need it (a REP's sender becomes
        // the peer; an answer to a duplicate goes back).
        let sender_host = |f: &Fabric| match known_host {
            UNKNOWN_HOST => f.ids.get(sender).map_or(UNKNOWN_HOST, |s| s.host),
            h => h,
        };
        match effect {
            Effect::CancelTimers => self.cancel_timers(id),
            Effect::Arm(timer) => {
                let (after, lane) = self.cm_wait(id, on.active, timer);
                self.cm_timer(id, after, timer, lane);
            }
            Effect::PeerIsSender => {
                let h = sender_host(self);
                let slot = self.slot(id);
                slot.remote = sender;
                slot.remote_host = h;
            }
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
                let req = match carry {
                    Carry::Keep => self.keep(id, payload),
                    _ => {
                        debug_assert_eq!(carry, Carry::Kept, "a REQ carries its parameters");
                        self.kept_share(id)
                    }
                };
                let dst = self.slot(id).peer.get().expect("a resolved id has a destination");
                match self.host_of_ip(dst.ip()) {
                    Some(to_host) => self.send_req(id, host, to_host, req),
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
                let (dest, dest_host) = match to {
                    To::Peer => {
                        let slot = self.slot(id);
                        (slot.remote, slot.remote_host)
                    }
                    To::Sender => (sender, sender_host(self)),
                };
                if dest.is_none() {
                    // No REP or MRA named a peer yet: there is nobody to tell.
                    return;
                }
                // A REP is sent again only for a lost copy: one that arrived is answered by the
                // peer's state (an MRA, the RTU), whatever it carries. So it moves with its copy,
                // and a lost copy gives it back (`send`), where a REQ is kept and shared.
                let carried = match carry {
                    Carry::Nothing => NO_PAYLOAD,
                    Carry::EmptyPrivateData => self.rej_payload(&[]),
                    Carry::CallPayload => std::mem::replace(payload, NO_PAYLOAD),
                    Carry::Keep if msg == MsgKind::Rep => std::mem::replace(payload, NO_PAYLOAD),
                    Carry::Kept if msg == MsgKind::Rep => {
                        std::mem::replace(&mut self.slot(id).kept, NO_PAYLOAD)
                    }
                    Carry::Keep => self.keep(id, payload),
                    Carry::Kept => self.kept_share(id),
                };
                if msg == MsgKind::Mra {
                    self.stats.mras += 1;
                }
                self.send(host, id, dest, dest_host, msg, status, carried);
            }
        }
    }
}

/// The id a transition is about, and the message it handles.
pub(super) struct On {
    id: SlotRef,
    /// The id's host.
    host: u16,
    /// The active side of an RC exchange.
    active: bool,
    /// Who sent the message being handled, and from which host (`UNKNOWN_HOST`: look it up).
    sender: SlotRef,
    sender_host: u16,
}

/// The fabric as the exchange's effector: each effect carried out on `on.id` as it is named.
pub(super) struct CarryOut<'a> {
    fabric: &'a mut Fabric,
    on: On,
    payload: u32,
}

impl<'a> CarryOut<'a> {
    /// Effects on `id`, a live id on `host` (the active side of an RC exchange when `active`),
    /// for a message from `sender` on `sender_host` (if any) with `payload` (if any), which an
    /// effect that carries it takes. What is left of `payload` is the caller's to drop.
    #[inline(always)]
    pub(super) fn new(
        fabric: &'a mut Fabric,
        id: SlotRef,
        host: u16,
        active: bool,
        sender: SlotRef,
        sender_host: u16,
        payload: u32,
    ) -> Self {
        CarryOut {
            fabric,
            on: On {
                id,
                host,
                active,
                sender,
                sender_host,
            },
            payload,
        }
    }
}

impl Effector for CarryOut<'_> {
    #[inline(always)]
    fn effect(&mut self, effect: Effect) {
        self.fabric.carry_out(&self.on, effect, &mut self.payload);
    }
}
