//! The IB CM messages on the wire: what they carry, how they are sent, lost, delayed and
//! resent.

use super::*;

/// What a REQ, REP or REJ carries: connection parameters as the receiver sees them, and a
/// REQ's destination.
pub(super) struct Payload {
    pub(super) wire: WireParam,
    pub(super) private_data: WirePrivateData,
    pub(super) dst: Addr,
}
/// [`ConnParam`] without its private data.
#[derive(Clone, Copy)]
pub(super) struct WireParam {
    pub(super) responder_resources: u8,
    pub(super) initiator_depth: u8,
    pub(super) flow_control: u8,
    pub(super) retry_count: u8,
    pub(super) rnr_retry_count: u8,
    pub(super) srq: bool,
    pub(super) qp_num: u32,
}

/// Private data zero-padded to `len` bytes, as the IB CM puts it on the wire. Only the bytes up
/// to the last non-zero one are kept (none, usually) and the padding is rebuilt on retrieval,
/// so a message carries no copy of a 256-byte buffer.
pub(super) struct WirePrivateData {
    pub(super) len: u16,
    pub(super) bytes: Box<[u8]>,
}

impl WirePrivateData {
    /// `given` padded to `len`, which must hold it (the id's machine checked the length).
    pub(super) fn new(given: &[u8], len: usize) -> Self {
        assert!(
            given.len() <= len && len <= MAX_PRIVATE_DATA,
            "private data longer than its slot"
        );
        let used = given.iter().rposition(|&b| b != 0).map_or(0, |last| last + 1);
        WirePrivateData {
            len: len as u16,
            bytes: given[..used].into(),
        }
    }

    pub(super) fn to_private_data(&self) -> PrivateData {
        const ZEROS: [u8; MAX_PRIVATE_DATA] = [0; MAX_PRIVATE_DATA];
        let len = usize::from(self.len);
        if self.bytes.is_empty() {
            // The usual all-zero data: the zeroed buffer with its length, no copy of zeros.
            return PrivateData::EMPTY.padded(len);
        }
        let mut padded = ZEROS;
        padded[..self.bytes.len()].copy_from_slice(&self.bytes);
        PrivateData::new(&padded[..len])
    }
}

impl Payload {
    #[inline]
    pub(super) fn conn_param(&self) -> ConnParam {
        self.wire.conn_param_with(self.private_data.to_private_data())
    }
}

impl WireParam {
    /// The parameters with `private_data`, which the caller built from the same payload's.
    #[inline(always)]
    pub(super) fn conn_param_with(self, private_data: PrivateData) -> ConnParam {
        ConnParam {
            private_data,
            responder_resources: self.responder_resources,
            initiator_depth: self.initiator_depth,
            flow_control: self.flow_control,
            retry_count: self.retry_count,
            rnr_retry_count: self.rnr_retry_count,
            srq: self.srq,
            qp_num: self.qp_num,
        }
    }
}

/// Parameters of events that carry none, on the wire (REJ).
pub(super) const NO_WIRE_PARAM: WireParam = WireParam {
    responder_resources: 0,
    initiator_depth: 0,
    flow_control: 0,
    retry_count: 0,
    rnr_retry_count: 0,
    srq: false,
    qp_num: 0,
};

impl Fabric {
    /// Records `event` of `id` on `host` at the current time (the caller knows the host).
    #[inline]
    pub(super) fn record_event(&mut self, host: u16, id: SlotRef, event: CmEventType, status: i32) {
        self.trace.record(TraceRecord {
            time: self.now,
            host,
            id: id.index,
            what: TraceWhat::Event(event),
            status,
        });
    }

    /// Queues an event for `id` on its channel. `CONNECT_REQUEST`s carry the listener too.
    // Inlined: every caller names the event (and most the status) as a constant, so the test
    // for `CONNECT_RESPONSE` and the trace hash's event and status bytes fold.
    #[inline(always)]
    pub(super) fn queue_event(
        &mut self,
        id: SlotRef,
        listen: SlotRef,
        event: CmEventType,
        status: i32,
        payload: u32,
    ) {
        let slot = self.slot(id);
        slot.queued += 1;
        let (host, channel) = (slot.host, slot.channel);
        // The kernel's CONNECT_RESPONSE is traced when librdmacm turns it into what the
        // application sees (on retrieval). Recorded with the host at hand, not looked up again.
        if event != CmEventType::ConnectResponse {
            self.record_event(host, id, event, status);
        }
        self.hosts[host as usize].counts.queued += 1;
        self.events_queued += 1;
        let ch = self
            .channels
            .get_mut(channel)
            .expect("cm-sim: an id's channel outlives it");
        ch.queue.push_back(Queued {
            id,
            listen,
            event,
            status,
            payload,
        });
    }

    pub(super) fn new_payload(&mut self, payload: Payload) -> u32 {
        self.payloads.insert(payload)
    }

    /// A REJ's payload: its private data, zero-padded to the 148 bytes the receiver sees.
    pub(super) fn rej_payload(&mut self, data: &[u8]) -> u32 {
        let len = PortSpace::Tcp.private_data_limit(PrivateDataSlot::Reject);
        self.new_payload(Payload {
            wire: NO_WIRE_PARAM,
            private_data: WirePrivateData::new(data, len),
            dst: Addr::None,
        })
    }

    /// Lets a message's payload go (`NO_PAYLOAD`: none).
    #[inline(always)]
    pub(super) fn drop_payload(&mut self, payload: u32) {
        if payload != NO_PAYLOAD {
            self.payloads.discard(payload);
        }
    }

    #[inline]
    pub(super) fn trace_send(
        &mut self,
        from_host: u16,
        from: SlotRef,
        msg: MsgKind,
        to_host: u16,
        status: i32,
    ) {
        self.trace.record(TraceRecord {
            time: self.now,
            host: from_host,
            id: from.index,
            what: TraceWhat::Sent { msg, to: to_host },
            status,
        });
    }

    pub(super) fn trace_lost(&mut self, from_host: u16, from: SlotRef, msg: MsgKind, to_host: u16) {
        self.stats.messages_lost += 1;
        self.trace.record(TraceRecord {
            time: self.now,
            host: from_host,
            id: from.index,
            what: TraceWhat::Lost { msg, to: to_host },
            status: 0,
        });
    }

    /// Whether a message of `kind` from host `a` to host `b` is lost now (draws only when a
    /// loss fault is on, so runs without faults draw exactly what they always did).
    // The fault-free test inline, the rest out of line (as for `extra_delay`): every message
    // asks, and until a fault touches a link the answer is no.
    #[inline(always)]
    pub(super) fn lost(&mut self, a: u16, b: u16, kind: MsgKind) -> bool {
        self.links_faulted && self.lost_on_faulted_link(a, b, kind)
    }

    #[inline(never)]
    fn lost_on_faulted_link(&mut self, a: u16, b: u16, kind: MsgKind) -> bool {
        let n = self.hosts.len();
        let (Some(ha), Some(hb)) = (self.hosts.get(a as usize), self.hosts.get(b as usize)) else {
            return false;
        };
        if !ha.reachable() || !hb.reachable() {
            return true;
        }
        // Every message that leaves a host for another counts against the drop rules, as a
        // filter on the wire counts it: first sends, retries and answers to duplicates alike.
        if !self.drops.is_empty() && self.dropped(a, b, kind) {
            return true;
        }
        let link = self.links[a as usize * n + b as usize];
        link.partitioned
            || (link.loss_per_mille > 0 && self.rng.next_u64() % 1000 < u64::from(link.loss_per_mille))
    }

    /// Whether a drop rule loses this message of `kind` from `a` to `b` (each rule counts the
    /// messages it matches).
    fn dropped(&mut self, a: u16, b: u16, kind: MsgKind) -> bool {
        let mut lost = false;
        for rule in &mut self.drops {
            lost |= rule.matches(a, b, kind);
        }
        if lost {
            self.stats.messages_dropped += 1;
        }
        lost
    }

    /// Extra latency a delay fault adds between hosts `a` and `b`.
    #[inline(always)]
    pub(super) fn extra_delay(&mut self, a: u16, b: u16) -> u64 {
        if !self.links_faulted {
            return 0;
        }
        self.extra_delay_on_faulted_link(a, b)
    }

    #[inline(never)]
    fn extra_delay_on_faulted_link(&mut self, a: u16, b: u16) -> u64 {
        let n = self.hosts.len();
        let Some(link) = self.links.get(a as usize * n + b as usize) else {
            return 0;
        };
        let (lo, hi) = link.delay;
        if hi == 0 {
            return 0;
        }
        self.stats.messages_delayed += 1;
        draw_between(&mut self.rng, lo, hi)
    }

    /// Sends an IB CM message from `from`, a live id on `from_host`, to the id `to` on
    /// `to_host`. The message goes out whether or not `to` still exists: a host whose id is gone
    /// answers as its IB CM does (a DREP for a DREQ, nothing for the rest).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    pub(super) fn send(
        &mut self,
        from_host: u16,
        from: SlotRef,
        to: SlotRef,
        to_host: u16,
        kind: MsgKind,
        status: i32,
        payload: u32,
    ) {
        let lat = self.latency();
        if !self.links_faulted {
            // No fault on any link: nothing is lost or delayed more.
            self.post_msg(from_host, from, to, to_host, kind, status, payload, lat);
            return;
        }
        if self.lost(from_host, to_host, kind) {
            self.trace_lost(from_host, from, kind, to_host);
            self.give_back(from, kind, payload);
            return;
        }
        let extra = self.extra_delay(from_host, to_host);
        self.post_msg(
            from_host,
            from,
            to,
            to_host,
            kind,
            status,
            payload,
            lat.saturating_add(extra),
        );
    }

    /// A lost copy's payload: a REP's goes back to its sender, which sends it again (a REP
    /// moves with its copy); the rest are let go (a REQ's sender keeps a share of its own).
    fn give_back(&mut self, from: SlotRef, kind: MsgKind, payload: u32) {
        if kind == MsgKind::Rep && payload != NO_PAYLOAD {
            if let Some(s) = self.ids.get_mut(from).filter(|s| s.kept == NO_PAYLOAD) {
                s.kept = payload;
                return;
            }
        }
        self.drop_payload(payload);
    }

    /// Puts a message from `from` on the wire to `to` on `to_host`, arriving `delay` from now
    /// but not before the last message to `to` (messages to one id arrive in order).
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
    fn post_msg(
        &mut self,
        from_host: u16,
        from: SlotRef,
        to: SlotRef,
        to_host: u16,
        kind: MsgKind,
        status: i32,
        payload: u32,
        delay: u64,
    ) {
        let mut arrival = self.now.after_nanos(delay);
        if let Some(dest) = self.ids.get_mut(to) {
            arrival = arrival.max(dest.last_arrival);
            dest.last_arrival = arrival;
        }
        self.trace_send(from_host, from, kind, to_host, status);
        // The hosts stay out of the action (a larger one is copied by a call into the queue):
        // the receiver's is the sender's `remote_host`, the sender's its slot's.
        self.schedule(
            arrival,
            Action::Msg {
                kind,
                to,
                from,
                status,
                payload,
            },
        );
    }

    /// Sends the REQ of `from` (a live id on `from_host`) to the host that owns its
    /// destination.
    pub(super) fn send_req(&mut self, from: SlotRef, from_host: u16, to_host: u16, payload: u32) {
        let lat = self.latency();
        if self.lost(from_host, to_host, MsgKind::Req) {
            self.trace_lost(from_host, from, MsgKind::Req, to_host);
            self.drop_payload(payload);
            return;
        }
        let extra = self.extra_delay(from_host, to_host);
        self.trace_send(from_host, from, MsgKind::Req, to_host, 0);
        self.schedule(
            self.now.after_nanos(lat).after_nanos(extra),
            Action::Req {
                host: to_host,
                from,
                payload,
            },
        );
    }

    pub(super) fn host_of_ip(&self, ip: IpAddr) -> Option<u16> {
        self.hosts
            .iter()
            .position(|h| h.addrs.contains(&ip))
            .map(|i| i as u16)
    }
}
