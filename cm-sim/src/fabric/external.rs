//! External QPs: `rdma_init_qp_attr` and `rdma_establish`.
//!
//! The application's own QP is its business: the fabric does only the CM for it. It keeps, for
//! each id connected or accepted with an external QP, what the REQ or REP carried for that QP
//! in a side table (`Fabric::external`), so that RC ids pay nothing for the feature.
//! `init_qp_attr` answers what the kernel would (the masks and values below were read on rxe,
//! Linux 6.1): the remote QP number from the exchange, a starting PSN per direction, the
//! negotiated resources. The PSNs pair as the kernel's do (`cm.c`, `cma.c`): each id has one
//! starting PSN, fixed when the id is made (`rdma_create_id` draws `seq_num`; a child's is drawn
//! when the REQ makes it), which its REQ or REP carries; an id's RTR `rq_psn` is its own, its
//! RTS `sq_psn` the peer's, from the peer's REQ or REP. So neither moves when `accept` names the
//! passive side's QP, and what one side sends first is what the other expects. The PSN is a hash
//! of the seed and the id's slot reference rather than a draw from the fabric's random stream,
//! so runs keep their trace hashes.

use cm_core::{AddressVector, GlobalRoute, QpAttr, QpAttrMask, ACCESS_REMOTE_ATOMIC, ACCESS_REMOTE_READ};
use cm_core::{ACCESS_REMOTE_WRITE, MTU_1024};

use super::*;
use crate::exchange::Wire;

/// What an id connected or accepted with an external QP agreed on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) struct ExternalQp {
    /// The application's QP number, as the REQ or REP carried it.
    pub(super) qpn: u32,
    /// The RDMA reads and atomics this side answers (`max_dest_rd_atomic`).
    pub(super) responder_resources: u8,
    /// The RDMA reads and atomics this side issues (`max_rd_atomic`).
    pub(super) initiator_depth: u8,
}

/// `RDMA_UDP_QKEY`, the QKey librdmacm's datagram ids use.
const UDP_QKEY: u32 = 0x0123_4567;

/// The local ACK timeout the simulated IB CM gives a connected QP (4.096 µs · 2^19 ≈ 2.1 s:
/// what Linux 6.1 gives on rxe).
pub(crate) const ACK_TIMEOUT: u8 = 19;

/// The source GID index of IPv4 address vectors: rxe's GID table has the port's IPv6
/// link-local GID at 0 and the IPv4-mapped one at 1.
const SGID_INDEX_V4: u8 = 1;

/// The hop limit of the simulated RoCE address vectors.
const HOP_LIMIT: u8 = 64;

/// The starting PSN of the id in slot `id` (24 bits): the PSN its REQ or REP carries, which it
/// expects to receive and its peer starts sending from. A slot reference names one id for the
/// fabric's life (a reused slot has a new generation), as the kernel's `seq_num` is one id's.
fn id_psn(seed: u64, id: SlotRef) -> u32 {
    // splitmix64's finaliser, twice: a fixed, well-mixed function of both.
    let mix = |mut z: u64| {
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    };
    let key = (u64::from(id.generation) << 32) | u64::from(id.index);
    (mix(seed ^ mix(key ^ 0x9E37_79B9_7F4A_7C15)) & 0x00FF_FFFF) as u32
}

/// The RoCE GID of an IP address: the IPv6 address, or the IPv4 one mapped into IPv6.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

impl Fabric {
    /// The QP number the id's side of the connection uses: its backend QP's, or its external
    /// one's; `None` when it has neither.
    fn qpn_of(&self, r: SlotRef) -> Option<u32> {
        let slot = self.ids.get(r)?;
        slot.qp
            .as_ref()
            .map(|q| q.qpn)
            .or_else(|| self.external.get(&r).map(|e| e.qpn))
    }

    /// Records the external QP of `r` after its connect or accept went out.
    pub(super) fn set_external(&mut self, r: SlotRef, param: &ConnParam, resources: (u8, u8)) {
        let (responder_resources, initiator_depth) = resources;
        self.external.insert(
            r,
            ExternalQp {
                qpn: param.qp_num & 0x00FF_FFFF,
                responder_resources,
                initiator_depth,
            },
        );
    }

    pub(crate) fn init_qp_attr(&mut self, host: u16, id: IdHandle, qp_state: QpState) -> R<QpAttr> {
        let call = Call::InitQpAttr;
        let r = self.id_ref(host, id, call)?;
        let m = self.slot(r).m;
        m.init_qp_attr(qp_state)?;
        let mut attr = QpAttr {
            qp_state: Some(qp_state),
            port_num: 1,
            mask: QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT,
            ..QpAttr::default()
        };
        if !m.port_space().is_connected() {
            attr.qkey = UDP_QKEY;
            attr.mask = attr.mask | QpAttrMask::QKEY;
            return Ok(attr);
        }
        if !m.has_cm_exchange() {
            // No IB CM id yet: the kernel answers the INIT attributes, no access granted.
            attr.mask = attr.mask | QpAttrMask::ACCESS_FLAGS;
            return Ok(attr);
        }
        let slot = self.slot(r);
        let (wire, remote, retry_count, rnr_retry, peer) = (
            slot.cm.wire(),
            slot.remote,
            slot.retries.transport(),
            slot.retries.rnr(),
            slot.peer.get(),
        );
        let answered = matches!(
            wire,
            Wire::RepRcvd | Wire::ReqRcvd | Wire::RepSent | Wire::Established
        );
        let in_exchange = answered || wire == Wire::ReqSent;
        let remote_qpn = self.qpn_of(remote);
        let ok = match qp_state {
            QpState::Init => in_exchange,
            _ => answered && remote_qpn.is_some(),
        };
        if !ok {
            // The IB CM id left the exchange (the peer rejected, went away, or disconnected)
            // before the application saw it.
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let max = self.cfg.max_rd_atomic;
        let ext = self.external.get(&r).copied();
        let (responder_resources, initiator_depth) =
            ext.map_or((max, max), |e| (e.responder_resources, e.initiator_depth));
        let seed = self.seed.value;
        match qp_state {
            QpState::Init => {
                attr.mask = attr.mask | QpAttrMask::ACCESS_FLAGS;
                attr.qp_access_flags = ACCESS_REMOTE_WRITE;
                if responder_resources > 0 {
                    attr.qp_access_flags |= ACCESS_REMOTE_READ | ACCESS_REMOTE_ATOMIC;
                }
            }
            QpState::Rtr => {
                attr.mask = QpAttrMask::STATE
                    | QpAttrMask::AV
                    | QpAttrMask::PATH_MTU
                    | QpAttrMask::DEST_QPN
                    | QpAttrMask::RQ_PSN
                    | QpAttrMask::MAX_DEST_RD_ATOMIC
                    | QpAttrMask::MIN_RNR_TIMER;
                attr.path_mtu = MTU_1024;
                attr.dest_qp_num = remote_qpn.unwrap_or(0);
                // `cma_init_qp_attr`: the id's own `seq_num`, which its REQ or REP carried.
                attr.rq_psn = id_psn(seed, r);
                attr.max_dest_rd_atomic = responder_resources;
                attr.ah_attr = AddressVector {
                    grh: peer.map(|p| GlobalRoute {
                        dgid: gid_of(p.ip()),
                        sgid_index: if p.is_ipv4() { SGID_INDEX_V4 } else { 0 },
                        hop_limit: HOP_LIMIT,
                        ..GlobalRoute::default()
                    }),
                    port_num: 1,
                    ..AddressVector::default()
                };
            }
            _ => {
                attr.mask = QpAttrMask::STATE
                    | QpAttrMask::SQ_PSN
                    | QpAttrMask::TIMEOUT
                    | QpAttrMask::RETRY_CNT
                    | QpAttrMask::RNR_RETRY
                    | QpAttrMask::MAX_QP_RD_ATOMIC;
                // The peer's REQ or REP's starting PSN (`cm_req_handler`, `cm_rep_handler`).
                attr.sq_psn = id_psn(seed, remote);
                attr.timeout = ACK_TIMEOUT;
                attr.retry_cnt = retry_count;
                attr.rnr_retry = rnr_retry;
                attr.max_rd_atomic = initiator_depth;
            }
        }
        attr.port_num = if attr.mask.contains(QpAttrMask::PORT) {
            1
        } else {
            0
        };
        Ok(attr)
    }

    pub(crate) fn establish(&mut self, host: u16, id: IdHandle) -> R<()> {
        let call = Call::Establish;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.establish()?;
        let params = self.params_of(r);
        let slot = self.slot(r);
        // Only whether the exchange takes it: the transition is carried out below.
        if !slot.cm.takes(Input::Establish, params) {
            // The REJ (or the peer's timeout) came first: the IB CM has no RTU to send.
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        slot.m = next;
        self.transition(r, Input::Establish, SlotRef::NONE, u16::MAX, NO_PAYLOAD);
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn id_psns_are_24_bits_and_depend_on_seed_slot_and_generation() {
        let at = |index, generation| SlotRef { index, generation };
        let a = id_psn(7, at(3, 0));
        assert_eq!(a, id_psn(7, at(3, 0)));
        assert_ne!(a, id_psn(8, at(3, 0)));
        assert_ne!(a, id_psn(7, at(4, 0)));
        assert_ne!(a, id_psn(7, at(3, 1)));
        // 24 bits, and all of them used.
        let psns: Vec<u32> = (0..64).map(|i| id_psn(1, at(i, 0))).collect();
        assert!(psns.iter().all(|&p| p <= 0x00FF_FFFF));
        assert!(psns.iter().any(|&p| p > 0x007F_FFFF));
    }

    #[test]
    fn roce_gids_map_ipv4_into_ipv6() {
        let gid = gid_of("10.0.0.2".parse().unwrap());
        assert_eq!(gid[10..], [0xff, 0xff, 10, 0, 0, 2]);
        assert_eq!(gid[..10], [0; 10]);
    }
}
