//! Multicast: group membership of datagram ids, and datagrams sent to a group.
//!
//! There is no subnet manager or switch to program: a join is answered at once with
//! `MULTICAST_JOIN`, whose retrieval attaches the id's QP (librdmacm attaches it there, and
//! only when the id has a QP then). A datagram sent to a group is copied to every attached
//! member's QP, the sender's own included (rxe loops group sends back to a member on the same
//! device, as the lab's `rdmacore-mckey` suite shows), each copy lost, delayed and dropped by
//! the rules of single datagrams.
//!
//! Memberships live in a side table made with the first join, so ids that never join (every
//! RC id) carry nothing for them and draw nothing.

use std::collections::{BTreeMap, HashMap};

use cm_core::{group_ud_param, UdParam, MULTICAST_QPN};

use super::*;

/// The most groups a device attaches QPs to: rxe's `RXE_MAX_MCAST_GRP` (Linux 6.1).
pub(crate) const MAX_GROUPS: u32 = 8192;

/// The most QPs of a device one group attaches: rxe's `RXE_MAX_MCAST_QP_ATTACH`.
pub(crate) const MAX_GROUP_QPS: u32 = 56;

/// The fabric's memberships, made with the first join.
#[derive(Default)]
pub(super) struct Multicast {
    /// (member id, group) → membership.
    members: BTreeMap<(SlotRef, IpAddr), Membership>,
    /// (host, group) → how many of the host's QPs are attached to the group; groups with none
    /// have no entry. A host is one device, whose limits rxe counts so.
    attached_qps: HashMap<(u16, IpAddr), u32>,
    /// Host → how many groups its QPs are attached to.
    attached_groups: HashMap<u16, u32>,
    /// Numbers joins, so that an event queued for an earlier membership of the same id and
    /// group is recognised as stale.
    next_serial: u32,
}

struct Membership {
    serial: u32,
    /// The QP number attached when `MULTICAST_JOIN` was retrieved.
    attached: Option<u32>,
    /// The token of the group's event retrieved and not acked yet.
    unacked: Option<u64>,
}

impl Fabric {
    pub(crate) fn join_multicast(&mut self, host: u16, id: IdHandle, group: SocketAddr) -> R<()> {
        let call = Call::JoinMulticast;
        let r = self.id_ref(host, id, call)?;
        self.slot(r).m.join_multicast()?;
        let ip = group.ip();
        if !ip.is_multicast() {
            return Err(CmError::InvalidArgument {
                call,
                reason: "the group must be a multicast address",
            });
        }
        if ip.is_ipv6() {
            // RoCEv2 carries IPv4 groups only: the kernel's cma_iboe_join_multicast answers an
            // IPv6 group with ENOTSUPP, which reaches user space as it is (measured on rxe).
            return Err(CmError::Os {
                call,
                errno: ENOTSUPP,
            });
        }
        let mc = self.multicast.get_or_insert_with(Box::default);
        if mc.members.contains_key(&(r, ip)) {
            return Err(CmError::AddrInUse { call });
        }
        let serial = mc.next_serial;
        mc.next_serial = mc.next_serial.wrapping_add(1);
        mc.members.insert(
            (r, ip),
            Membership {
                serial,
                attached: None,
                unacked: None,
            },
        );
        // The payload names the group and the join: what the event reports, and whether it is
        // still current when retrieved.
        let payload = self.new_payload(Payload {
            wire: WireParam {
                qp_num: serial,
                ..NO_WIRE_PARAM
            },
            private_data: WirePrivateData::new(&[], 0),
            dst: Addr::from(SocketAddr::new(ip, 0)),
        });
        self.queue_event(r, SlotRef::NONE, CmEventType::MulticastJoin, 0, payload);
        Ok(())
    }

    pub(crate) fn leave_multicast(&mut self, host: u16, id: IdHandle, group: SocketAddr) -> R<()> {
        let call = Call::LeaveMulticast;
        let r = self.id_ref(host, id, call)?;
        let key = (r, group.ip());
        let Some(m) = self.multicast.as_mut().and_then(|mc| mc.members.get(&key)) else {
            return Err(CmError::AddrNotAvailable { call });
        };
        if m.unacked.is_some() {
            return Err(CmError::UnackedEvents { call, count: 1 });
        }
        // Its queued event, if any, is now stale and discarded on retrieval.
        let m = self.multicast.as_mut().expect("checked").members.remove(&key);
        if m.is_some_and(|m| m.attached.is_some()) {
            self.detach(host, group.ip());
        }
        Ok(())
    }

    /// How many groups the QP `qpn` of `id` is attached to (the kernel will not destroy it then).
    pub(super) fn groups_attached(&self, id: SlotRef, qpn: u32) -> u32 {
        self.multicast.as_ref().map_or(0, |mc| {
            mc.members
                .iter()
                .filter(|((r, _), m)| *r == id && m.attached == Some(qpn))
                .count() as u32
        })
    }

    /// The kernel leaves the groups of a destroyed id.
    pub(super) fn forget_memberships(&mut self, r: SlotRef, host: u16) {
        let Some(mc) = self.multicast.as_mut() else {
            return;
        };
        let mut left = Vec::new();
        mc.members.retain(|(id, group), m| {
            let keep = *id != r;
            if !keep && m.attached.is_some() {
                left.push(*group);
            }
            keep
        });
        for group in left {
            self.detach(host, group);
        }
    }

    /// Whether attaching the QP of `id` to the group a retrieved `MULTICAST_JOIN` names
    /// (`payload`) would pass the device's limits, so that librdmacm's `ibv_attach_mcast`
    /// fails with `ENOMEM`. An id without a QP attaches nothing.
    pub(super) fn attach_refused(&self, id: SlotRef, payload: Option<&Payload>) -> bool {
        let (Some(slot), Some(mc)) = (self.ids.get(id), self.multicast.as_ref()) else {
            return false;
        };
        let Some(group) = payload.and_then(|p| p.dst.get()).map(|a| a.ip()) else {
            return false;
        };
        if slot.qp.is_none() {
            return false;
        }
        match mc.attached_qps.get(&(slot.host, group)) {
            Some(&qps) => qps >= MAX_GROUP_QPS,
            None => mc.attached_groups.get(&slot.host).copied().unwrap_or(0) >= MAX_GROUPS,
        }
    }

    /// Counts one more of `host`'s QPs attached to `group`.
    fn attach(&mut self, host: u16, group: IpAddr) {
        let mc = self.multicast.as_mut().expect("a membership exists");
        let qps = mc.attached_qps.entry((host, group)).or_insert(0);
        if *qps == 0 {
            *mc.attached_groups.entry(host).or_insert(0) += 1;
        }
        *qps += 1;
    }

    /// Counts one fewer of `host`'s QPs attached to `group`; a group with none is forgotten.
    fn detach(&mut self, host: u16, group: IpAddr) {
        let Some(mc) = self.multicast.as_mut() else { return };
        let Some(qps) = mc.attached_qps.get_mut(&(host, group)) else {
            return;
        };
        *qps -= 1;
        if *qps == 0 {
            mc.attached_qps.remove(&(host, group));
            if let Some(n) = mc.attached_groups.get_mut(&host) {
                *n -= 1;
            }
        }
    }

    /// Whether a queued multicast event of `id` belongs to its current membership (a left
    /// group's event is discarded, as the kernel discards it).
    pub(super) fn multicast_event_current(&self, id: SlotRef, payload: Option<&Payload>) -> bool {
        let Some((ip, serial)) = payload.and_then(|p| Some((p.dst.get()?.ip(), p.wire.qp_num))) else {
            return false;
        };
        self.multicast
            .as_ref()
            .and_then(|mc| mc.members.get(&(id, ip)))
            .is_some_and(|m| m.serial == serial)
    }

    /// librdmacm's processing of a retrieved `MULTICAST_JOIN` (`group`: what its payload
    /// names): the id's QP, if any, is attached.
    pub(super) fn on_multicast_retrieved(
        &mut self,
        id: SlotRef,
        event: CmEventType,
        group: Option<SocketAddr>,
        token: u64,
    ) {
        let Some(ip) = group.map(|a| a.ip()) else {
            return;
        };
        let qpn = self.ids.get(id).and_then(|s| s.qp.as_ref()).map(|q| q.qpn);
        let Some(m) = self
            .multicast
            .as_mut()
            .and_then(|mc| mc.members.get_mut(&(id, ip)))
        else {
            return;
        };
        m.unacked = Some(token);
        if event == CmEventType::MulticastJoin && m.attached.is_none() && qpn.is_some() {
            m.attached = qpn;
            let host = self.ids.get(id).map(|s| s.host).expect("the id is alive");
            self.attach(host, ip);
        }
    }

    /// A multicast event was acked (tokens are unique): its group may be left now.
    pub(super) fn on_multicast_acked(&mut self, token: u64) {
        if let Some(m) = self
            .multicast
            .as_mut()
            .and_then(|mc| mc.members.values_mut().find(|m| m.unacked == Some(token)))
        {
            m.unacked = None;
        }
    }

    /// The event a retrieved multicast event becomes: the group as its datagram destination.
    pub(super) fn multicast_event(
        &self,
        id: IdHandle,
        event: CmEventType,
        status: i32,
        token: u64,
        p: &Payload,
    ) -> Option<CmEvent> {
        let ip = p.dst.get()?.ip();
        let param = ConnParam {
            qp_num: MULTICAST_QPN,
            ..ConnParam::ZERO
        };
        let ev = cm_core::backend::cm_event(id, None, event, status, param, token);
        Some(cm_core::backend::with_ud_param(ev, group_ud_param(ip)))
    }

    /// The attached members of the group `dest` names: (host, QP number) of each, in a fixed
    /// order.
    pub(super) fn group_members(&self, dest: &UdParam) -> Vec<(u16, u32)> {
        let (Some(mc), Some(ip)) = (self.multicast.as_ref(), dest.ah_attr.dest_ip()) else {
            return Vec::new();
        };
        mc.members
            .iter()
            .filter(|((_, g), _)| *g == ip)
            .filter_map(|((r, _), m)| Some((self.ids.get(*r)?.host, m.attached?)))
            .collect()
    }

    /// Whether QP `qpn` is still attached to `group` (a datagram in flight is not delivered
    /// to a member that left meanwhile).
    pub(super) fn attached(&self, group: IpAddr, qpn: u32) -> bool {
        self.multicast.as_ref().is_some_and(|mc| {
            mc.members
                .iter()
                .any(|((_, g), m)| *g == group && m.attached == Some(qpn))
        })
    }
}

/// The kernel's `ENOTSUPP` (524, not libc's `ENOTSUP`).
const ENOTSUPP: i32 = 524;
