//! Faults striking the fabric: links, crashes, restarts, device removal and the rest.

use super::*;

impl Fabric {
    pub(super) fn check_fault(&self, fault: &Fault) {
        let n = self.hosts.len();
        for h in fault.hosts() {
            assert!(
                (h as usize) < n,
                "fault `{fault}` names host {h}, the fabric has {n}"
            );
        }
    }

    pub(super) fn trace_fault(&mut self, host: u16, fault: &Fault) {
        self.trace.record(TraceRecord {
            time: self.now,
            host,
            id: u32::MAX,
            what: TraceWhat::Fault(fault.kind()),
            status: 0,
        });
    }

    /// Changes the link between `a` and `b` both ways; with `b` [`Fault::ALL_HOSTS`], every
    /// link between `a` and another host.
    pub(super) fn set_link(&mut self, a: u16, b: u16, change: impl Fn(&mut Link)) {
        let (n, a) = (self.hosts.len(), usize::from(a));
        for peer in 0..n {
            let named = if b == Fault::ALL_HOSTS {
                peer != a
            } else {
                peer == usize::from(b)
            };
            if named {
                change(&mut self.links[a * n + peer]);
                change(&mut self.links[peer * n + a]);
            }
        }
    }

    /// Ids living on `host`, the application's and those it does not know yet.
    pub(super) fn ids_on(&self, host: u16) -> Vec<SlotRef> {
        self.ids
            .refs()
            .into_iter()
            .filter(|r| self.ids.get(*r).is_some_and(|s| s.host == host))
            .collect()
    }

    /// `r`'s connection ends without a word on the wire: its peer learns only that nothing it
    /// sends is acknowledged.
    pub(super) fn lose_peer_of(&mut self, r: SlotRef) {
        let remote = self.slot(r).remote;
        if let Some(peer) = self.ids.get_mut(remote) {
            if peer.remote == r {
                peer.peer_lost = true;
            }
        }
    }

    /// Drops an id without a word on the wire: the end of every destroy, and all of it when
    /// the id's host crashed or its device went.
    pub(super) fn vanish(&mut self, r: SlotRef) {
        if self.slot(r).is_carrier() {
            // A verbs QP of a crashed host.
            self.forget_carrier(r);
            let host = self.slot(r).host;
            self.ids.discard(r);
            self.ids_changed();
            self.forget_options(r);
            self.hosts[host as usize].counts.qps -= 1;
            return;
        }
        let s = self.slot(r);
        let (host, ps, channel, queued, timers, kept) = (
            s.host,
            s.m.port_space(),
            s.channel,
            s.queued,
            s.timers.pending(),
            s.kept,
        );
        let bound = s.local.get().filter(|_| s.port_bound);
        self.ids.discard(r);
        self.drop_payload(kept);
        self.ids_changed();
        if !self.external.is_empty() {
            self.external.remove(&r);
        }
        self.forget_options(r);
        self.forget_memberships(r, host);
        self.timers_cancelled(timers);
        if let Some(local) = bound {
            self.ports.unbind(host, ps, local.port(), r);
        }
        let counts = &mut self.hosts[host as usize].counts;
        counts.ids -= 1;
        counts.queued -= queued as usize;
        if let Some(c) = self.channels.get_mut(channel) {
            c.ids -= 1;
        }
    }

    /// Strikes `fault` now.
    pub(super) fn strike(&mut self, fault: &Fault) {
        let first_host = fault.hosts()[0];
        if matches!(
            fault,
            Fault::Partition { .. }
                | Fault::Loss { .. }
                | Fault::Delay { .. }
                | Fault::Crash { .. }
                | Fault::RemoveDevice { .. }
                | Fault::Drop { .. }
        ) {
            self.links_faulted = true;
        }
        self.trace_fault(first_host, fault);
        match *fault {
            Fault::Partition { a, b } => {
                self.stats.partitions += 1;
                self.set_link(a, b, |l| l.partitioned = true);
                self.recheck_waiting_sends();
            }
            Fault::Heal { a, b } => self.set_link(a, b, |l| l.partitioned = false),
            Fault::Loss { a, b, per_mille } => {
                self.set_link(a, b, |l| l.loss_per_mille = per_mille.min(1000))
            }
            Fault::Delay { a, b, min, max } => {
                let (lo, hi) = (nanos(min.min(max)), nanos(min.max(max)));
                self.set_link(a, b, |l| l.delay = (lo, hi));
            }
            Fault::Crash { host } => {
                self.crash(host);
                self.recheck_waiting_sends();
            }
            Fault::Restart { host } => {
                let h = &mut self.hosts[host as usize];
                if !h.up {
                    // Back with nothing, faults on it forgotten; the tag stays (handles of the
                    // old incarnation are unknown anyway: their slots are gone).
                    *h = Host {
                        incarnation: h.incarnation,
                        tag: h.tag,
                        token_key: h.token_key,
                        ..Host::new(std::mem::take(&mut h.addrs))
                    };
                    self.stats.restarts += 1;
                }
            }
            Fault::RemoveDevice { host } => {
                self.remove_device(host);
                self.recheck_waiting_sends();
            }
            Fault::RestoreDevice { host } => self.hosts[host as usize].device = true,
            Fault::AddrChange { host } => {
                for r in self.ids_on(host) {
                    let s = self.slot(r);
                    let waiting_child = s.m.phase() == cm_core::ConnPhase::Requested;
                    let live = !matches!(
                        s.m.state(),
                        cm_core::IdState::DeviceRemoval | cm_core::IdState::Destroying
                    );
                    if s.visible && s.m.has_device() && live && !waiting_child {
                        self.stats.addr_changes += 1;
                        self.queue_event(r, SlotRef::NONE, CmEventType::AddrChange, 0, NO_PAYLOAD);
                    }
                }
            }
            Fault::FailAddrResolution { host, status, count } => {
                self.hosts[host as usize].fail_addr = (status, count)
            }
            Fault::FailRouteResolution { host, status, count } => {
                self.hosts[host as usize].fail_route = (status, count)
            }
            Fault::Backlog { host, backlog } => self.hosts[host as usize].backlog_cap = backlog,
            Fault::RnrRetries { host, retries } => {
                self.hosts[host as usize].rnr_retries = (retries < 7).then_some(retries);
            }
            Fault::Drop {
                from,
                to,
                msg,
                skip,
                count,
            } => self.drops.push(DropRule {
                from,
                to,
                msg,
                skip,
                count,
                seen: 0,
            }),
        }
    }

    /// The host goes down: its ids, channels and QPs vanish, nothing is said on the wire.
    pub(super) fn crash(&mut self, host: u16) {
        if !self.hosts[host as usize].up {
            return;
        }
        self.stats.crashes += 1;
        let h = &mut self.hosts[host as usize];
        h.up = false;
        h.crashed_at = self.now;
        h.incarnation += 1;
        for r in self.ids_on(host) {
            self.lose_peer_of(r);
            self.vanish(r);
        }
        for o in self.outstanding.refs() {
            if self.outstanding.get(o).is_some_and(|x| x.host == host) {
                self.outstanding.discard(o);
            }
        }
        for ch in self.channels.refs() {
            if self.channels.get(ch).is_some_and(|c| c.host == host) {
                let c = self.channels.remove(ch).expect("live");
                for q in c.queue {
                    self.drop_payload(q.payload);
                }
            }
        }
        // Its regions, SRQs and their events not retrieved go with it.
        self.crash_regions(host);
        self.crash_srqs(host);
        self.hosts[host as usize].counts = HostCounts::default();
    }

    /// Discards every event queued on `host`'s channels and not retrieved, but the
    /// `DEVICE_REMOVAL`s of an earlier removal: what the device's removal leaves of them could
    /// follow `DEVICE_REMOVAL` (an `ADDR_RESOLVED` with an `ADDR_ERROR` after it, say), which no
    /// id may see.
    pub(super) fn discard_queued_events(&mut self, host: u16) {
        for ch in self.channels.refs() {
            let Some(c) = self.channels.get_mut(ch).filter(|c| c.host == host) else {
                continue;
            };
            let queue = std::mem::take(&mut c.queue);
            let mut kept = Fifo::new();
            for q in queue {
                let Some(slot) = self.ids.get_mut(q.id) else {
                    // Its id was destroyed, and its events uncounted then.
                    self.drop_payload(q.payload);
                    continue;
                };
                if q.event == CmEventType::DeviceRemoval {
                    kept.push_back(q);
                    continue;
                }
                slot.queued -= 1;
                self.hosts[host as usize].counts.queued -= 1;
                self.drop_payload(q.payload);
            }
            self.channels.get_mut(ch).expect("live").queue = kept;
        }
    }

    /// The host's device is unregistered: `DEVICE_REMOVAL` on each id bound to it, after which
    /// it takes no call but destroy; events not retrieved yet are discarded; a listener bound to
    /// the device stops listening; connections end without a word on the wire.
    pub(super) fn remove_device(&mut self, host: u16) {
        if !self.hosts[host as usize].device {
            return;
        }
        self.stats.device_removals += 1;
        let h = &mut self.hosts[host as usize];
        h.device = false;
        h.device_epoch = h.device_epoch.wrapping_add(1);
        self.discard_queued_events(host);
        for r in self.ids_on(host) {
            let s = self.slot(r);
            if s.is_carrier() {
                // A verbs QP: its device went, so it fails.
                let next = s.m.qp_error();
                self.set_machine(r, next);
                continue;
            }
            if !s.visible {
                // A request nobody retrieved yet: its child goes with the device.
                if let Some(listener) = self.ids.refs().into_iter().find(|l| {
                    self.ids
                        .get(*l)
                        .and_then(|x| x.listener.as_ref())
                        .is_some_and(|x| x.pending.contains(&r))
                }) {
                    self.slot(listener)
                        .listener
                        .as_mut()
                        .expect("listener")
                        .pending
                        .retain(|c| *c != r);
                }
                self.vanish(r);
                continue;
            }
            let (state, phase, device) = (s.m.state(), s.m.phase(), s.m.has_device());
            if matches!(
                state,
                cm_core::IdState::DeviceRemoval | cm_core::IdState::Destroying
            ) {
                continue;
            }
            self.transition(r, Input::DeviceRemoved, SlotRef::NONE, u16::MAX, NO_PAYLOAD);
            self.lose_peer_of(r);
            let s = self.slot(r);
            if state == cm_core::IdState::AddrQuery && !device {
                // Resolving from a wildcard bind: the resolution fails instead.
                s.pending_status = -errno::ENODEV;
                self.queue_event(
                    r,
                    SlotRef::NONE,
                    CmEventType::AddrError,
                    -errno::ENODEV,
                    NO_PAYLOAD,
                );
            } else if device && phase != cm_core::ConnPhase::Requested {
                // A child not accepted yet gets no event (the kernel drops them), only a dead id.
                s.m = s.m.device_removed();
                if s.listener.take().is_some() {
                    let (ps, port) = (s.m.port_space(), s.local.get().map_or(0, |l| l.port()));
                    self.ports.set_listening(host, ps, port, r, false);
                }
                self.queue_event(r, SlotRef::NONE, CmEventType::DeviceRemoval, 0, NO_PAYLOAD);
            }
        }
    }
}
