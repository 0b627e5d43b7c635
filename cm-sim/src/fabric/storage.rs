//! What the fabric stores per host, id, channel and outstanding event, and the handles the
//! application holds to them.

use super::*;

pub(super) struct Listener {
    pub(super) backlog: u32,
    /// Children whose `CONNECT_REQUEST` is queued and not retrieved, in queue order.
    pub(super) pending: Fifo<SlotRef>,
}

pub(super) struct IdSlot {
    pub(super) host: u16,
    pub(super) channel: SlotRef,
    pub(super) m: IdMachine,
    pub(super) local: Addr,
    pub(super) peer: Addr,
    pub(super) port_bound: bool,
    /// The IB CM exchange.
    pub(super) cm: Exchange,
    /// The peer's id (the REQ's child for an active id, the requester for a child), which may
    /// be gone; `SlotRef::NONE` until known.
    pub(super) remote: SlotRef,
    /// The host `remote` lives (or lived) on: messages to it go there even once it is gone.
    pub(super) remote_host: u16,
    /// The payload of the REQ or REP the id sends again until it is answered (`NO_PAYLOAD`:
    /// none), shared with the copies in flight.
    pub(super) kept: u32,
    /// The id's timers in the queue, and which of them are live.
    pub(super) timers: IdTimers,
    /// Events queued on the channel and not retrieved.
    pub(super) queued: u32,
    /// When the last message to this id arrives: messages to one id are delivered in order.
    pub(super) last_arrival: SimTime,
    /// Status of the `ADDR_ERROR` / `ROUTE_ERROR` a pending resolution timer delivers.
    pub(super) pending_status: i32,
    /// The connection's retry counts.
    pub(super) retries: Retries,
    /// The peer's QP went away without a word on the wire (its host crashed or its device was
    /// removed): nothing sent to it will be acknowledged.
    pub(super) peer_lost: bool,
    /// Whether the application knows the id (false for a child until its request is retrieved).
    pub(super) visible: bool,
    pub(super) qp: Option<Qp>,
    pub(super) listener: Option<Box<Listener>>,
}

/// A connection's two retry counts, 3 bits each, in the one byte a count took (an id's slot is
/// most of the simulator's memory per connection):
/// * transport retries, the REQ's `retry_count` (both sides use it): how many times an
///   unacknowledged send is sent again before it fails;
/// * receiver-not-ready retries (7: for ever), as the IB CM sets them: a child's from the REQ
///   (`cm_req_handler`), the active side's from the REP (`cm_rep_handler`), so each side's
///   count is the one its peer asked for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct Retries(u8);

impl Retries {
    /// What a new id has: no transport retries, RNR retries for ever.
    pub(super) const NEW: Retries = Retries::new(0, 7);

    pub(super) const fn new(transport: u8, rnr: u8) -> Retries {
        Retries((transport & 7) | (rnr & 7) << 4)
    }

    pub(super) const fn transport(self) -> u8 {
        self.0 & 7
    }

    pub(super) const fn rnr(self) -> u8 {
        self.0 >> 4
    }

    /// The same transport retries with `rnr` receiver-not-ready retries.
    pub(super) const fn with_rnr(self, rnr: u8) -> Retries {
        Retries::new(self.transport(), rnr)
    }
}

/// An id's local or peer address in 16 bytes, where `Option<SocketAddr>` takes 32: every
/// connection has two ids with two addresses each, and at a million connections those 64 bytes
/// an id were an eighth of the simulator's memory and a cache line more per id touched. IPv6
/// addresses, rare in large runs, are boxed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Addr {
    None,
    V4(SocketAddrV4),
    V6(Box<SocketAddrV6>),
}

impl Addr {
    pub(super) fn get(&self) -> Option<SocketAddr> {
        match self {
            Addr::None => None,
            Addr::V4(a) => Some(SocketAddr::V4(*a)),
            Addr::V6(a) => Some(SocketAddr::V6(**a)),
        }
    }
}

// The conversions are inlined (and the optional one a `match`, not `map_or`): each new id
// and each bind converted through a call.
impl From<SocketAddr> for Addr {
    #[inline]
    fn from(a: SocketAddr) -> Self {
        match a {
            SocketAddr::V4(a) => Addr::V4(a),
            SocketAddr::V6(a) => Addr::V6(Box::new(a)),
        }
    }
}

impl From<Option<SocketAddr>> for Addr {
    #[inline]
    fn from(a: Option<SocketAddr>) -> Self {
        match a {
            Some(a) => Addr::from(a),
            None => Addr::None,
        }
    }
}

pub(super) struct Channel {
    pub(super) host: u16,
    pub(super) queue: Fifo<Queued>,
    pub(super) ids: u32,
}

#[derive(Clone, Copy)]
pub(super) struct Queued {
    pub(super) id: SlotRef,
    pub(super) listen: SlotRef,
    pub(super) event: CmEventType,
    pub(super) status: i32,
    pub(super) payload: u32,
}

/// An event handed out and not acked yet; its slab reference is the event's token.
pub(super) struct Outstanding {
    pub(super) host: u16,
    /// The id it counts against (the listener for `CONNECT_REQUEST`).
    pub(super) counted: SlotRef,
    pub(super) id: IdHandle,
    pub(super) event: CmEventType,
}

/// The key a host's event tokens are masked with, drawn from its backend tag (never from the
/// seeded generator, so traces do not move): without it a token is a small slab reference, and
/// `CmEvent::new` with token 0 would ack the first real event of the id.
fn token_key(tag: u32) -> u64 {
    // splitmix64's finaliser: every tag gives an unrelated 64-bit key.
    let mut z = u64::from(tag).wrapping_add(0x9E37_79B9_7F4A_7C15);
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// `key` is the host's [`Host::token_key`].
pub(super) fn token_of(r: SlotRef, key: u64) -> u64 {
    ((u64::from(r.generation) << 32) | u64::from(r.index)) ^ key
}

/// `key` is the host's [`Host::token_key`].
pub(super) fn token_ref(token: u64, key: u64) -> SlotRef {
    let t = token ^ key;
    SlotRef {
        index: t as u32,
        generation: (t >> 32) as u32,
    }
}

/// An event retrieved, before it becomes the [`CmEvent`] handed out.
pub(super) struct Taken {
    pub(super) id: IdHandle,
    pub(super) listen_id: Option<IdHandle>,
    pub(super) event: CmEventType,
    pub(super) status: i32,
    /// The event's payload, still in the fabric's pool (`NO_PAYLOAD`: none): most events have
    /// none, and moving an `Option<Payload>` through retrieval cost every event its copies.
    pub(super) payload: u32,
    pub(super) token: u64,
    /// The id whose machine counts the event unacked (the listener's, for a request).
    pub(super) counted: SlotRef,
    /// Whether the event is in the table of outstanding events under `token`: always, but for
    /// one taken by `take_cm_event` (acked before anyone can hold it) that needs no token.
    pub(super) kept: bool,
}

#[derive(Default, Clone, Copy)]
pub(super) struct HostCounts {
    pub(super) channels: usize,
    pub(super) ids: usize,
    pub(super) qps: usize,
    pub(super) unacked: usize,
    pub(super) queued: usize,
    pub(super) mrs: usize,
    pub(super) srqs: usize,
}

pub(super) struct Host {
    pub(super) addrs: Vec<IpAddr>,
    pub(super) tag: u32,
    /// `token_key(tag)`, kept because every event retrieved and acked needs it (three
    /// multiplications each time otherwise).
    pub(super) token_key: u64,
    pub(super) counts: HostCounts,
    /// Not crashed.
    pub(super) up: bool,
    /// Bumped by every crash: the application's handles of an earlier incarnation are gone.
    pub(super) incarnation: u32,
    /// When it last crashed, for the errors its calls answer while down.
    pub(super) crashed_at: SimTime,
    /// The RDMA device is registered.
    pub(super) device: bool,
    /// Bumped by every removal of the device: regions and SRQs made before belong to the
    /// device that went, which no QP of the one that came back uses.
    pub(super) device_epoch: u32,
    /// Injected resolution failures still to come: (status, how many).
    pub(super) fail_addr: (i32, u32),
    pub(super) fail_route: (i32, u32),
    /// Cap on every listener's backlog.
    pub(super) backlog_cap: u32,
    /// Receiver-not-ready retries before a send gives up (`None`: for ever).
    pub(super) rnr_retries: Option<u8>,
}

impl Host {
    pub(super) fn new(addrs: Vec<IpAddr>) -> Self {
        let tag = cm_core::backend::next_backend_tag();
        Host {
            addrs,
            tag,
            token_key: token_key(tag),
            counts: HostCounts::default(),
            up: true,
            incarnation: 0,
            crashed_at: SimTime::ZERO,
            device: true,
            device_epoch: 0,
            fail_addr: (0, 0),
            fail_route: (0, 0),
            backlog_cap: u32::MAX,
            rnr_retries: None,
        }
    }

    /// Whether CM messages can reach or leave the host.
    pub(super) fn reachable(&self) -> bool {
        self.up && self.device
    }
}

/// A [`Fault::Drop`] in force: which messages it loses, and how many it has counted.
pub(super) struct DropRule {
    pub(super) from: u16,
    pub(super) to: u16,
    pub(super) msg: MsgKind,
    pub(super) skip: u32,
    pub(super) count: u32,
    /// Messages the rule matched so far.
    pub(super) seen: u32,
}

impl DropRule {
    /// Counts a message of `kind` from host `a` to host `b`: true when it is one the rule loses.
    pub(super) fn matches(&mut self, a: u16, b: u16, kind: MsgKind) -> bool {
        if a != self.from || (self.to != Fault::ALL_HOSTS && b != self.to) || kind != self.msg {
            return false;
        }
        let n = self.seen;
        self.seen = self.seen.saturating_add(1);
        n >= self.skip && (self.count == u32::MAX || n - self.skip < self.count)
    }
}

/// The state of the link between two hosts, as faults leave it.
#[derive(Clone, Copy, Default)]
pub(super) struct Link {
    pub(super) partitioned: bool,
    pub(super) loss_per_mille: u16,
    /// Extra latency range in nanoseconds (0..=0: none).
    pub(super) delay: (u64, u64),
}

impl Fabric {
    /// Host number `index`, for the fabric's public accessors.
    pub(super) fn host_at(&self, index: usize) -> &Host {
        let n = self.hosts.len();
        self.hosts
            .get(index)
            .unwrap_or_else(|| panic!("no host {index}: the fabric has {n}"))
    }

    pub(crate) fn tag(&self, host: u16) -> u32 {
        self.hosts[host as usize].tag
    }

    /// Refuses every call of a crashed host, saying so (its handles are gone with it).
    pub(super) fn host_up(&self, host: u16, call: Call) -> R<()> {
        self.up_host_tag(host, call).map(|_| ())
    }

    /// [`host_up`](Self::host_up), and the host's tag when it is.
    pub(super) fn up_host_tag(&self, host: u16, call: Call) -> R<u32> {
        let h = &self.hosts[host as usize];
        if h.up {
            return Ok(h.tag);
        }
        Err(CmError::HostCrashed {
            call,
            at: h.crashed_at.since_start(),
        })
    }

    pub(super) fn id_ref(&self, host: u16, id: IdHandle, call: Call) -> R<SlotRef> {
        // The host is indexed once for both its state and its tag.
        let tag = self.up_host_tag(host, call)?;
        let r = SlotRef {
            index: id.index(),
            generation: id.generation(),
        };
        match self.ids.get(r) {
            Some(slot) if id.owner() == tag && slot.host == host && slot.visible => Ok(r),
            _ => Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Id,
            }),
        }
    }

    pub(super) fn channel_ref(&self, host: u16, ch: ChannelHandle, call: Call) -> R<SlotRef> {
        let tag = self.up_host_tag(host, call)?;
        let r = SlotRef {
            index: ch.index(),
            generation: ch.generation(),
        };
        match self.channels.get(r) {
            Some(c) if ch.owner() == tag && c.host == host => Ok(r),
            _ => Err(CmError::UnknownHandle {
                call,
                kind: HandleKind::Channel,
            }),
        }
    }

    pub(super) fn slot(&mut self, r: SlotRef) -> &mut IdSlot {
        self.ids.get_mut(r).expect("cm-sim: live id expected")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_keeps_what_was_stored_in_sixteen_bytes() {
        let v4: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let v6: SocketAddr = "[fe80::1%3]:7471".parse().unwrap();
        for a in [None, Some(v4), Some(v6)] {
            assert_eq!(Addr::from(a).get(), a);
        }
        assert_eq!(std::mem::size_of::<Addr>(), 16);
    }

    #[test]
    fn a_drop_rule_loses_the_messages_it_names_counting_every_one_it_matches() {
        let mut rule = DropRule {
            from: 0,
            to: 1,
            msg: MsgKind::Req,
            skip: 1,
            count: 2,
            seen: 0,
        };
        // Other kinds, directions and hosts pass uncounted.
        assert!(!rule.matches(0, 1, MsgKind::Rep));
        assert!(!rule.matches(1, 0, MsgKind::Req));
        assert!(!rule.matches(0, 2, MsgKind::Req));
        let fate: Vec<bool> = (0..5).map(|_| rule.matches(0, 1, MsgKind::Req)).collect();
        assert_eq!(fate, [false, true, true, false, false]);
        let mut all = DropRule {
            to: Fault::ALL_HOSTS,
            skip: 0,
            count: u32::MAX,
            seen: u32::MAX - 1,
            ..rule
        };
        assert!(all.matches(0, 5, MsgKind::Req));
        assert!(
            all.matches(0, 1, MsgKind::Req),
            "the count saturates, the rule holds"
        );
    }

    /// Two ids per connection, so a byte here is two per connection at scale (the addresses are
    /// packed into 16 bytes each to keep the slot at this size).
    #[test]
    fn an_id_slot_is_no_larger_than_it_was_made() {
        assert!(
            std::mem::size_of::<IdSlot>() <= 168,
            "{}",
            std::mem::size_of::<IdSlot>()
        );
    }
}
