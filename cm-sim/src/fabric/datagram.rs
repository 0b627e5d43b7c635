//! Datagrams: UD sends between QPs of the datagram port spaces.
//!
//! A datagram leaves at once (its send completes successfully when posted, as on a NIC, which
//! learns nothing of its fate) and arrives after a latency drawn for it alone, so datagrams
//! overtake one another. It is dropped, silently, when the link loses it (`Loss`, `Partition`),
//! when it is longer than the path MTU (rxe completes such a send and sends nothing), when the
//! destination QP does not exist, is not a UD QP, expects another Q_Key or is in ERR, or when no
//! receive is posted there. One longer than the receive's buffer fails that receive with a local
//! length error and moves the receiver's QP to ERR, as measured on rxe (Linux 6.1, which reports
//! `LOC_QP_OP_ERR`).
//!
//! The address handle's source GID is checked as rxe checks it (measured on Linux 6.1): each
//! host's GID table is laid out as rxe's, the port's IPv6 link-local GID at 0, then the host's
//! IPv4 addresses, then its IPv6 ones. An index past the table fails `post_send_to` with
//! `ENODATA` (no address handle); a GID of the other family than the destination fails it with
//! `EINVAL` for one QP (no route between the two), while to a group the handle is made and the
//! send fails on the QP: `LOC_QP_OP_ERR`, and the QP goes to ERR (rxe builds the packet for the
//! source GID's family and finds no route for it). Whether the sending QP joined the group does
//! not matter.
//!
//! Every random draw here comes from a generator of its own, seeded from the fabric's seed
//! and made with the first datagram, so a run without datagrams draws exactly what it drew
//! before datagrams existed (the RC trace hashes do not move).

use std::collections::HashMap;

use cm_core::backend::{datagram_gate, Admission};
use cm_core::{AhAttr, UdParam, UdSender, UDP_QKEY};

use super::*;

/// The path MTU of the simulated UD path: rxe's on a 1500-byte Ethernet link (`IBV_MTU_1024`).
pub(crate) const UD_MTU: usize = 1024;

/// Mixed into the seed of the datagram generator, so that its stream is unrelated to the
/// fabric's main one.
const DATAGRAM_STREAM: u64 = 0x6461_7461_6772_616d;

/// The fabric's datagram state, made with the first UD QP.
pub(super) struct Datagrams {
    rng: ChaCha8Rng,
    /// QP number → the id holding it, for every UD QP made. Entries are checked on use (the
    /// id may be gone, or hold another QP by now) rather than removed on every path that ends
    /// a QP (destroy, crash, device removal).
    by_qpn: HashMap<u32, SlotRef>,
    in_flight: Pool<InFlight>,
}

/// Why an address handle's source GID cannot send to its destination.
enum SourceGid {
    /// The port has no GID at that index.
    Missing,
    /// The GID is of the other address family than the destination.
    OtherFamily,
}

/// A datagram on the wire.
struct InFlight {
    to_host: u16,
    qp_num: u32,
    /// The group it was sent to, for a copy of a group send.
    group: Option<IpAddr>,
    qkey: u32,
    from: UdSender,
    data: Vec<u8>,
    /// The sender's immediate data (`IBV_WR_SEND_WITH_IMM`).
    imm: Option<u32>,
}

impl Fabric {
    fn datagrams(&mut self) -> &mut Datagrams {
        let seed = self.seed.value;
        self.datagrams.get_or_insert_with(|| {
            Box::new(Datagrams {
                rng: ChaCha8Rng::seed_from_u64(seed ^ DATAGRAM_STREAM),
                by_qpn: HashMap::new(),
                in_flight: Pool::new(),
            })
        })
    }

    /// Makes the UD QP `qpn` of id `r` reachable by its number.
    pub(super) fn register_ud_qp(&mut self, qpn: u32, r: SlotRef) {
        self.datagrams().by_qpn.insert(qpn, r);
    }

    /// The datagram destination the active side's `ESTABLISHED` reports on a datagram port
    /// space: the passive side's QP (from the SIDR reply) at the address the id resolved.
    pub(super) fn sidr_ud_param(&self, id: IdHandle, qp_num: u32) -> Option<UdParam> {
        let r = SlotRef {
            index: id.index(),
            generation: id.generation(),
        };
        let slot = self.ids.get(r)?;
        if slot.m.port_space().is_connected() {
            return None;
        }
        Some(UdParam {
            qp_num,
            qkey: UDP_QKEY,
            ah_attr: AhAttr::for_ip(slot.peer.get()?.ip()),
        })
    }

    pub(crate) fn post_send_to(
        &mut self,
        host: u16,
        id: IdHandle,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
        imm: Option<u32>,
    ) -> R<()> {
        let r = self.qp_for(host, id, Call::PostSend)?;
        self.post_send_to_on(host, r, wr_id, dest, data, imm)
    }

    /// `post_send_to` on the UD QP in slot `r` (an id's or a carrier's) of `host`.
    pub(super) fn post_send_to_on(
        &mut self,
        host: u16,
        r: SlotRef,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
        imm: Option<u32>,
    ) -> R<()> {
        let call = Call::PostSend;
        let slot = self.slot(r);
        let local_ip = slot.local.get().map(|a| a.ip());
        let qp = slot.qp.as_mut().expect("checked");
        let outstanding = qp.outstanding(WcOpcode::Send);
        // A simulated device fails a QP only through the machine.
        if datagram_gate(&mut slot.m, &qp.caps, data.len(), outstanding, || Ok(false))? == Admission::Flush {
            qp.push_flushed(wr_id, WcOpcode::Send);
            return Ok(());
        }
        if let Some(refused) = self.source_gid_mismatch(host, dest) {
            return match refused {
                SourceGid::Missing => Err(CmError::Os {
                    call,
                    errno: errno::ENODATA,
                }),
                SourceGid::OtherFamily if !dest.is_group() => Err(CmError::Os {
                    call,
                    errno: errno::EINVAL,
                }),
                SourceGid::OtherFamily => {
                    let qp = self.slot(r).qp.as_mut().expect("checked");
                    qp.complete_datagram_send(wr_id, data.len(), WcStatus::LocQpOpErr);
                    let next = self.slot(r).m.qp_error();
                    self.set_machine(r, next);
                    Ok(())
                }
            };
        }
        let qp = self.slot(r).qp.as_mut().expect("checked");
        qp.complete_datagram_send(wr_id, data.len(), WcStatus::Success);
        let qp_num = qp.qpn;
        let addr = self.source_ip(host, local_ip);
        let from = UdSender {
            qp_num,
            addr,
            ah_attr: addr.map_or(AhAttr::for_ip(IpAddr::from([0, 0, 0, 0])), AhAttr::for_ip),
        };
        if dest.is_group() {
            // One copy per attached member, each on its own fate.
            let group = dest.ah_attr.dest_ip();
            for (to_host, qp_num) in self.group_members(dest) {
                self.send_datagram(host, to_host, (qp_num, group, dest.qkey), from, data, imm);
            }
            return Ok(());
        }
        let Some(to_host) = dest.ah_attr.dest_ip().and_then(|ip| self.host_of_gid_ip(ip)) else {
            return Ok(());
        };
        let to = (dest.qp_num & 0x00FF_FFFF, None, dest.qkey);
        self.send_datagram(host, to_host, to, from, data, imm);
        Ok(())
    }

    /// The host a datagram's destination GID names: the host with that address, or the host
    /// whose port's IPv6 link-local GID (index 0 of its table, [`cm_core::link_local_gid`] of
    /// its first address) it is, which reaches it on the one link every host shares.
    fn host_of_gid_ip(&self, ip: IpAddr) -> Option<u16> {
        if let Some(h) = self.host_of_ip(ip) {
            return Some(h);
        }
        let IpAddr::V6(v6) = ip else {
            return None;
        };
        let gid = v6.octets();
        if gid[..8] != [0xfe, 0x80, 0, 0, 0, 0, 0, 0] {
            return None;
        }
        self.hosts
            .iter()
            .position(|h| {
                h.addrs
                    .first()
                    .is_some_and(|a| cm_core::link_local_gid(*a) == gid)
            })
            .map(|i| i as u16)
    }

    /// The number of the QP `id` holds, if it holds one.
    pub(crate) fn qp_num(&self, host: u16, id: IdHandle) -> R<Option<u32>> {
        let r = self.id_ref(host, id, Call::CreateQp)?;
        Ok(self.ids.get(r).and_then(|s| s.qp.as_ref()).map(|q| q.qpn))
    }

    /// What is wrong with the source GID `dest`'s handle names on `host`'s port, if anything
    /// (a handle without a global route names none to check).
    fn source_gid_mismatch(&self, host: u16, dest: &UdParam) -> Option<SourceGid> {
        let to_ipv4 = dest.ah_attr.dest_ip()?.is_ipv4();
        let addrs = &self.hosts[host as usize].addrs;
        let ipv4 = addrs.iter().filter(|a| a.is_ipv4()).count();
        // Index 0 is the IPv6 link-local GID; then the IPv4 addresses, then the IPv6 ones.
        let gid_ipv4 = match usize::from(dest.ah_attr.sgid_index) {
            0 => false,
            i if i <= ipv4 => true,
            i if i <= addrs.len() => false,
            _ => return Some(SourceGid::Missing),
        };
        (gid_ipv4 != to_ipv4).then_some(SourceGid::OtherFamily)
    }

    /// Puts one datagram on the wire, unless the path MTU or the link drops it. `to` is the
    /// destination QP's number, the group the copy is for (if any) and the Q_Key sent.
    fn send_datagram(
        &mut self,
        host: u16,
        to_host: u16,
        to: (u32, Option<IpAddr>, u32),
        from: UdSender,
        data: &[u8],
        imm: Option<u32>,
    ) {
        let (qp_num, group, qkey) = to;
        if data.len() > UD_MTU || self.datagram_lost(host, to_host) {
            return;
        }
        let latency = self.datagram_latency(host, to_host);
        let at = self.now.after_nanos(latency);
        let n = self.datagrams().in_flight.insert(InFlight {
            to_host,
            qp_num,
            group,
            qkey,
            from,
            data: data.to_vec(),
            imm,
        });
        self.schedule(at, Action::Datagram(n));
    }

    /// The address a datagram's receiver sees as its source: the sending id's own address, or
    /// the host's first one where the id is bound to a wildcard.
    fn source_ip(&self, host: u16, local: Option<IpAddr>) -> Option<IpAddr> {
        let addrs = &self.hosts[host as usize].addrs;
        match local {
            Some(ip) if !ip.is_unspecified() => Some(ip),
            Some(ip) => addrs.iter().copied().find(|a| a.is_ipv4() == ip.is_ipv4()),
            None => addrs.first().copied(),
        }
    }

    /// Whether the link drops this datagram: cut, or lost by a `Loss` fault's draw.
    fn datagram_lost(&mut self, from: u16, to: u16) -> bool {
        if !self.links_faulted {
            return false;
        }
        let n = self.hosts.len();
        let link = self.links[from as usize * n + to as usize];
        if link.partitioned || !self.hosts[to as usize].reachable() {
            return true;
        }
        link.loss_per_mille > 0 && (self.datagrams().rng.next_u32() % 1000) < u32::from(link.loss_per_mille)
    }

    /// A datagram's one-way latency: the fabric's range plus a `Delay` fault's, drawn for each
    /// datagram alone.
    fn datagram_latency(&mut self, from: u16, to: u16) -> u64 {
        let (latency, n) = (self.latency_nanos, self.hosts.len());
        let delay = self.links[from as usize * n + to as usize].delay;
        packet_latency(&mut self.datagrams().rng, latency, delay)
    }

    /// Datagram `n` arrives: it lands in the destination QP's next receive, or is dropped.
    pub(super) fn on_datagram(&mut self, n: u32) {
        let Some(d) = self.datagrams.as_mut().and_then(|g| g.in_flight.take(n)) else {
            return;
        };
        if !self.hosts[d.to_host as usize].reachable() {
            return;
        }
        if d.group.is_some_and(|g| !self.attached(g, d.qp_num)) {
            // The member left while the datagram was on its way.
            return;
        }
        let Some(&r) = self.datagrams.as_ref().and_then(|g| g.by_qpn.get(&d.qp_num)) else {
            return;
        };
        let Some(slot) = self.ids.get(r) else { return };
        // An id's UD QP has the UDP port space's Q_Key and is in RTS from its creation; a verbs
        // QP has the Q_Key it was given, and receives from RTR on.
        let (qkey, ready) = if slot.is_carrier() {
            (
                self.carrier_qkey(r),
                matches!(slot.m.qp(), Some(QpState::Rtr | QpState::Rts)),
            )
        } else {
            (UDP_QKEY, slot.m.qp() == Some(QpState::Rts))
        };
        if d.qkey != qkey || slot.host != d.to_host || slot.m.port_space().is_connected() || !ready {
            return;
        }
        if slot.qp.as_ref().is_none_or(|q| q.qpn != d.qp_num) {
            return;
        }
        // Its own receive queue's next receive, or its SRQ's.
        let Some(recv) = self.take_recv(r) else { return };
        let qp = self.slot(r).qp.as_mut().expect("checked");
        if let Landing::TooLong = qp.land_datagram(recv, d.data, d.from, d.imm) {
            // rxe (Linux 6.1) fails the receive and moves the receiver's QP to ERR; the sender
            // learns nothing (its send completed as it left).
            self.stats.length_errors += 1;
            let next = self.slot(r).m.qp_error();
            self.set_machine(r, next);
        }
    }
}
