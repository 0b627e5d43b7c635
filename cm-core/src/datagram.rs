//! Datagrams on the UDP port space: the SIDR exchange's result and the identities of UD sends
//! and receives.
//!
//! A UDP-port-space id gets a UD QP from `create_qp`, ready to send at once. The active side's
//! `ESTABLISHED` (the SIDR reply) carries a [`UdParam`]: the remote QP number, its Q_Key and
//! the address handle's attributes ([`AhAttr`], owned data; the backend makes and caches the
//! device's address handle from it). [`CmBackend::post_send_to`](crate::CmBackend::post_send_to)
//! sends a datagram to such a destination; a receive's [`WorkCompletion`](crate::WorkCompletion)
//! names its sender in [`UdSender`], from which a reply's destination follows.
//!
//! # The GRH
//!
//! Verbs put a 40-byte global routing header in front of every UD payload in the receive
//! buffer. This API hides it on every backend alike: `post_recv`'s length is the payload's
//! capacity (the hardware backend adds the 40 bytes to the buffer it posts), a completion's
//! `data` and `byte_len` are the payload alone, and what the header told (the sender's address)
//! is in [`UdSender::addr`].

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// `RDMA_UDP_QKEY`: the Q_Key librdmacm gives every QP of the UDP port space, and so the Q_Key
/// of every SIDR reply and of replies to a received datagram.
pub const UDP_QKEY: u32 = 0x0123_4567;

/// The size of the global routing header verbs put in front of a UD receive's payload.
pub const GRH_LEN: usize = 40;

/// The source GID index of IPv4 address handles: where rxe's GID table keeps an interface's
/// IPv4 address, after the port's IPv6 link-local GID at 0 (see [`AhAttr::for_ip`]).
const SGID_INDEX_IPV4: u8 = 1;

/// The interface identifier of a simulated host's port, the EUI-64 rxe derives from the
/// interface's MAC (`addrconf_addr_eui48`: the universal/local bit flipped, `ff:fe` in the
/// middle): the simulator gives the host at `ip` the MAC `02:00:b0:b1:b2:b3` of its address'
/// last four bytes. It is also the port's node and system image GUID.
///
/// ```
/// assert_eq!(cm_core::port_eui64("10.0.0.1".parse().unwrap()), [0, 0, 10, 0xff, 0xfe, 0, 0, 1]);
/// ```
pub fn port_eui64(ip: IpAddr) -> [u8; 8] {
    let b = match ip {
        IpAddr::V4(a) => a.octets(),
        IpAddr::V6(a) => {
            let o = a.octets();
            [o[12], o[13], o[14], o[15]]
        }
    };
    const MAC0: u8 = 0x02;
    [MAC0 ^ 0x02, 0x00, b[0], 0xff, 0xfe, b[1], b[2], b[3]]
}

/// The IPv6 link-local GID (`fe80::` and [`port_eui64`]) at index 0 of the GID table of the
/// simulated host at `ip`, as rxe puts its interface's link-local address first. Address
/// handles naming it (libfabric's verbs provider takes GID 0 by default) reach that host.
///
/// ```
/// use std::net::Ipv6Addr;
/// let gid = cm_core::link_local_gid("10.0.0.1".parse().unwrap());
/// assert_eq!(Ipv6Addr::from(gid), "fe80::aff:fe00:1".parse::<Ipv6Addr>().unwrap());
/// ```
pub fn link_local_gid(ip: IpAddr) -> [u8; 16] {
    let mut gid = [0u8; 16];
    gid[0] = 0xfe;
    gid[1] = 0x80;
    gid[8..].copy_from_slice(&port_eui64(ip));
    gid
}

/// The attributes of an address handle (`struct ibv_ah_attr`), as the SIDR reply gives them
/// (`rdma_ud_param.ah_attr`) or a received datagram implies them. Plain owned data: a backend
/// creates the device's address handle from it when a datagram is sent.
///
/// ```
/// use std::net::IpAddr;
/// use cm_core::AhAttr;
///
/// let ah = AhAttr::for_ip("10.0.0.2".parse().unwrap());
/// assert_eq!(ah.dest_ip(), Some("10.0.0.2".parse::<IpAddr>().unwrap()));
/// assert!(ah.is_global);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct AhAttr {
    /// Destination GID (`grh.dgid`); on RoCE the destination IP address, IPv4 mapped into IPv6.
    pub dgid: [u8; 16],
    /// Flow label (`grh.flow_label`).
    pub flow_label: u32,
    /// Index of the source GID in the port's table (`grh.sgid_index`).
    pub sgid_index: u8,
    /// Hop limit (`grh.hop_limit`).
    pub hop_limit: u8,
    /// Traffic class (`grh.traffic_class`).
    pub traffic_class: u8,
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate.
    pub static_rate: u8,
    /// Whether the GRH fields are valid (always on RoCE).
    pub is_global: bool,
    /// The local port the handle sends from.
    pub port_num: u8,
}

impl AhAttr {
    /// The attributes a RoCE device gives for `ip`: a global route to its GID (an IPv4 address
    /// mapped into IPv6), hop limit 64, port 1, and a source GID of `ip`'s family: index 1 for
    /// IPv4, 0 for IPv6.
    ///
    /// The source GID must be of the destination's family. rxe's table (measured on Linux 6.1)
    /// has the port's IPv6 link-local GID at 0 and the interface's IPv4 address at 1, where the
    /// kernel's own handles for IPv4 (a SIDR reply's, a `MULTICAST_JOIN`'s, a received
    /// datagram's) point; a handle naming the other family's GID makes `post_send_to` fail
    /// (`EINVAL` to one QP; to a group the send completes with `LOC_QP_OP_ERR` and the QP goes
    /// to ERR), one naming no GID fails with `ENODATA`. The simulator lays its tables out so.
    /// On another device or address layout, take the handle from an event or a received
    /// datagram.
    pub fn for_ip(ip: IpAddr) -> Self {
        let (v6, sgid_index) = match ip {
            IpAddr::V4(v4) => (v4.to_ipv6_mapped(), SGID_INDEX_IPV4),
            IpAddr::V6(v6) => (v6, 0),
        };
        AhAttr {
            dgid: v6.octets(),
            flow_label: 0,
            sgid_index,
            hop_limit: 64,
            traffic_class: 0,
            dlid: 0,
            sl: 0,
            src_path_bits: 0,
            static_rate: 0,
            is_global: true,
            port_num: 1,
        }
    }

    /// The IP address the destination GID stands for on RoCE (an IPv4-mapped GID gives the IPv4
    /// address); `None` without a global route.
    pub fn dest_ip(&self) -> Option<IpAddr> {
        if !self.is_global {
            return None;
        }
        Some(gid_ip(self.dgid))
    }
}

/// The IP address a RoCE GID stands for.
pub fn gid_ip(gid: [u8; 16]) -> IpAddr {
    let v6 = Ipv6Addr::from(gid);
    match v6.to_ipv4_mapped() {
        Some(v4) => IpAddr::V4(v4),
        None => IpAddr::V6(v6),
    }
}

/// Where datagrams go (`struct rdma_ud_param` without its private data, which the event's
/// [`ConnParam`](crate::ConnParam) carries): the active side's `ESTABLISHED` on the UDP port
/// space reports the passive side's QP, and a received datagram's [`UdSender::reply_to`] the
/// sender's.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdParam {
    /// The remote QP number (24 bits).
    pub qp_num: u32,
    /// The remote QP's Q_Key ([`UDP_QKEY`] on the UDP port space).
    pub qkey: u32,
    /// How to reach the remote port.
    pub ah_attr: AhAttr,
}

/// Who sent a received datagram: what a UD receive's completion tells.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct UdSender {
    /// The sender's QP number (`ibv_wc.src_qp`).
    pub qp_num: u32,
    /// The sender's IP address, from the GRH (RoCE: the packet's IP source address).
    pub addr: Option<IpAddr>,
    /// The way back to the sender, as `ibv_init_ah_from_wc` makes it (on hardware with the
    /// local GID index the datagram arrived on).
    pub ah_attr: AhAttr,
}

impl UdSender {
    /// The destination of a reply: the sender's QP, with the UDP port space's Q_Key, as
    /// rdma-core's `udaddy` answers (`ibv_create_ah_from_wc`).
    ///
    /// ```
    /// use cm_core::{AhAttr, UdSender, UDP_QKEY};
    ///
    /// let addr = "10.0.0.2".parse().unwrap();
    /// let sender = UdSender { qp_num: 0x12, addr: Some(addr), ah_attr: AhAttr::for_ip(addr) };
    /// let dest = sender.reply_to();
    /// assert_eq!((dest.qp_num, dest.qkey), (0x12, UDP_QKEY));
    /// assert_eq!(dest.ah_attr.dest_ip(), sender.addr);
    /// ```
    pub fn reply_to(&self) -> UdParam {
        UdParam {
            qp_num: self.qp_num,
            qkey: UDP_QKEY,
            ah_attr: self.ah_attr,
        }
    }
}

/// The sender's IP address in a UD receive buffer's 40-byte header: RoCE v2 over IPv4 puts the
/// packet's IPv4 header in the header's last 20 bytes (source address at offset 32), IPv6 and
/// RoCE v1 an IPv6-shaped GRH (source GID at offset 8). `None` when neither version matches.
///
/// ```
/// use cm_core::grh_source;
///
/// let mut grh = [0u8; 40];
/// grh[20] = 0x45; // IPv4, 20-byte header
/// grh[32..36].copy_from_slice(&[10, 0, 0, 2]);
/// assert_eq!(grh_source(&grh), Some("10.0.0.2".parse().unwrap()));
/// ```
pub fn grh_source(grh: &[u8]) -> Option<IpAddr> {
    let grh: &[u8; GRH_LEN] = grh.get(..GRH_LEN)?.try_into().ok()?;
    if grh[20] >> 4 == 4 {
        let src: [u8; 4] = grh[32..36].try_into().ok()?;
        return Some(IpAddr::V4(Ipv4Addr::from(src)));
    }
    if grh[0] >> 4 == 6 {
        let src: [u8; 16] = grh[8..24].try_into().ok()?;
        return Some(gid_ip(src));
    }
    None
}

/// The 40 bytes rxe (Linux 6.1, `rxe_resp.c`) puts in front of a UD payload of `payload_len`
/// bytes sent from `from` to `to`: for IPv4 20 zero bytes and the packet's IPv4 header (UDP, TTL
/// 64, its checksum), for IPv6 its IPv6 header. [`grh_source`] reads `from` back. A backend
/// that hands programs raw receive buffers (the C drop-in) writes it; this API's own
/// completions leave it out.
///
/// ```
/// use cm_core::{grh, grh_source};
///
/// let from = "10.0.0.1".parse().unwrap();
/// let header = grh(from, Some("10.0.0.2".parse().unwrap()), 100);
/// assert_eq!((header[20], grh_source(&header)), (0x45, Some(from)));
/// ```
pub fn grh(from: IpAddr, to: Option<IpAddr>, payload_len: usize) -> [u8; GRH_LEN] {
    // A UDP header (8 bytes) sits between the IP header and the payload on RoCE v2.
    const UDP_HEADER: usize = 8;
    let mut out = [0u8; GRH_LEN];
    match from {
        IpAddr::V6(from) => {
            out[0] = 0x60;
            let len = (payload_len + UDP_HEADER).min(usize::from(u16::MAX)) as u16;
            out[4..6].copy_from_slice(&len.to_be_bytes());
            out[6] = 17; // next header: UDP
            out[7] = 64; // hop limit
            out[8..24].copy_from_slice(&from.octets());
            if let Some(to) = to {
                out[24..40].copy_from_slice(&gid_of(to));
            }
        }
        IpAddr::V4(from) => {
            let ip = &mut out[20..];
            ip[0] = 0x45;
            let len = (20 + UDP_HEADER + payload_len).min(usize::from(u16::MAX)) as u16;
            ip[2..4].copy_from_slice(&len.to_be_bytes());
            ip[8] = 64; // TTL
            ip[9] = 17; // protocol: UDP
            ip[12..16].copy_from_slice(&from.octets());
            if let Some(IpAddr::V4(to)) = to {
                ip[16..20].copy_from_slice(&to.octets());
            }
            let sum: u32 = ip
                .chunks(2)
                .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
                .sum();
            let folded = (sum & 0xffff) + (sum >> 16);
            let checksum = !(((folded & 0xffff) + (folded >> 16)) as u16);
            ip[10..12].copy_from_slice(&checksum.to_be_bytes());
        }
    }
    out
}

/// The GID an IP address is on RoCE: IPv6 as it is, IPv4 mapped into IPv6.
fn gid_of(ip: IpAddr) -> [u8; 16] {
    match ip {
        IpAddr::V4(v4) => v4.to_ipv6_mapped().octets(),
        IpAddr::V6(v6) => v6.octets(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_header_names_its_sender_for_either_family_and_an_ipv4_one_checks_out() {
        for from in ["10.1.2.3", "fe80::7"] {
            let from: IpAddr = from.parse().unwrap();
            assert_eq!(grh_source(&grh(from, None, 9)), Some(from));
        }
        // An IPv4 header's one's-complement sum, checksum included, is all ones.
        let header = grh(
            "10.0.0.1".parse().unwrap(),
            Some("10.0.0.2".parse().unwrap()),
            1000,
        );
        let sum: u32 = header[20..]
            .chunks(2)
            .map(|w| u32::from(u16::from_be_bytes([w[0], w[1]])))
            .sum();
        assert_eq!((sum & 0xffff) + (sum >> 16), 0xffff);
        assert_eq!(u16::from_be_bytes([header[22], header[23]]), 1028);
        assert_eq!(header[36..40], [10, 0, 0, 2]);
    }

    #[test]
    fn ipv4_address_handles_round_trip_through_a_mapped_gid() {
        let ip: IpAddr = "192.168.7.9".parse().unwrap();
        let ah = AhAttr::for_ip(ip);
        assert_eq!(&ah.dgid[..12], &[0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(ah.dest_ip(), Some(ip));
    }

    #[test]
    fn ipv6_address_handles_keep_the_address_as_gid() {
        let ip: IpAddr = "fd00::2".parse().unwrap();
        assert_eq!(AhAttr::for_ip(ip).dest_ip(), Some(ip));
    }

    #[test]
    fn address_handles_send_from_a_source_gid_of_the_destinations_family() {
        // rxe's table: the IPv6 link-local GID at 0, the IPv4 address at 1.
        assert_eq!(AhAttr::for_ip("10.0.0.1".parse().unwrap()).sgid_index, 1);
        assert_eq!(AhAttr::for_ip("fd00::1".parse().unwrap()).sgid_index, 0);
    }

    #[test]
    fn a_handle_without_global_route_names_no_address() {
        let mut ah = AhAttr::for_ip("10.0.0.1".parse().unwrap());
        ah.is_global = false;
        assert_eq!(ah.dest_ip(), None);
    }

    #[test]
    fn ipv6_grh_gives_the_source_gid() {
        let mut grh = [0u8; GRH_LEN];
        grh[0] = 0x60;
        grh[8..24].copy_from_slice(&Ipv4Addr::new(10, 0, 0, 7).to_ipv6_mapped().octets());
        assert_eq!(grh_source(&grh), Some("10.0.0.7".parse().unwrap()));
    }

    #[test]
    fn short_or_unversioned_headers_give_no_source() {
        assert_eq!(grh_source(&[0u8; GRH_LEN]), None);
        assert_eq!(grh_source(&[0x60; 12]), None);
    }

    #[test]
    fn a_reply_goes_to_the_senders_qp_by_its_own_route_with_the_udp_qkey() {
        let mut ah_attr = AhAttr::for_ip("10.0.0.9".parse().unwrap());
        ah_attr.sgid_index = 1;
        let dest = UdSender {
            qp_num: 5,
            addr: None,
            ah_attr,
        }
        .reply_to();
        assert_eq!(
            dest,
            UdParam {
                qp_num: 5,
                qkey: UDP_QKEY,
                ah_attr
            }
        );
    }
}
