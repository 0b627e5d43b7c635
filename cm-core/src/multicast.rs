//! Multicast on the datagram port spaces: what a `MULTICAST_JOIN` tells and where a datagram
//! to a group goes.
//!
//! [`CmBackend::join_multicast`](crate::CmBackend::join_multicast) asks for membership of a
//! group; its `MULTICAST_JOIN` event carries the group as a [`UdParam`]
//! ([`CmEvent::ud_param`](crate::CmEvent::ud_param)): the multicast QP number
//! [`MULTICAST_QPN`], the group's Q_Key and an address handle whose GID is the group's
//! (on RoCE the group's IP address, IPv4 mapped into IPv6). Retrieving that event attaches the
//! id's QP to the group (librdmacm does it then, and only when the id has a QP); a datagram
//! sent with [`post_send_to`](crate::CmBackend::post_send_to) to that `UdParam` reaches every
//! attached member's QP.

use std::net::IpAddr;

use crate::{AhAttr, UdParam, UDP_QKEY};

/// The QP number that addresses a multicast group (`0xFFFFFF`).
pub const MULTICAST_QPN: u32 = 0x00FF_FFFF;

/// The destination a `MULTICAST_JOIN` of `group` reports on the UDP port space: the multicast
/// QP number, [`UDP_QKEY`], and a global route to the group's GID from the source GID
/// [`AhAttr::for_ip`] names (on rxe, measured: exactly the join's). A QP need not have joined
/// to send to it.
///
/// ```
/// use cm_core::{group_ud_param, MULTICAST_QPN, UDP_QKEY};
///
/// let group = "239.1.2.3".parse().unwrap();
/// let dest = group_ud_param(group);
/// assert_eq!((dest.qp_num, dest.qkey), (MULTICAST_QPN, UDP_QKEY));
/// assert_eq!(dest.ah_attr.dest_ip(), Some(group));
/// ```
pub fn group_ud_param(group: IpAddr) -> UdParam {
    UdParam {
        qp_num: MULTICAST_QPN,
        qkey: UDP_QKEY,
        ah_attr: AhAttr::for_ip(group),
    }
}

impl UdParam {
    /// Whether this destination addresses a multicast group (QP number [`MULTICAST_QPN`])
    /// rather than one QP.
    ///
    /// ```
    /// use cm_core::group_ud_param;
    ///
    /// assert!(group_ud_param("239.1.2.3".parse().unwrap()).is_group());
    /// ```
    pub fn is_group(&self) -> bool {
        self.qp_num & MULTICAST_QPN == MULTICAST_QPN
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_group_destination_names_the_multicast_qpn_and_the_groups_gid() {
        let group: IpAddr = "ff0e::1234".parse().unwrap();
        let dest = group_ud_param(group);
        assert!(dest.is_group());
        assert_eq!(
            dest.ah_attr.dgid,
            "ff0e::1234".parse::<std::net::Ipv6Addr>().unwrap().octets()
        );
    }

    #[test]
    fn a_single_qp_destination_is_no_group() {
        let mut dest = group_ud_param("239.0.0.1".parse().unwrap());
        dest.qp_num = 0x12;
        assert!(!dest.is_group());
    }
}
