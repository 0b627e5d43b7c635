//! Multicast membership: joins and leaves checked as the simulator checks them, so that
//! librdmacm is never asked to wait for an ack that cannot come.

use std::net::SocketAddr;

use cm_core::{Call, CmError, CmEventType, IdHandle, Result, UdParam};

use super::HwBackend;
use crate::convert::os_error;

impl HwBackend {
    /// [`CmBackend::join_multicast`](cm_core::CmBackend::join_multicast).
    pub(super) fn join_group(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        let call = Call::JoinMulticast;
        let index = self.id_index(call, id)?;
        let e = self.ids.at(index).expect("checked");
        e.machine.join_multicast()?;
        if !group.ip().is_multicast() {
            return Err(CmError::InvalidArgument {
                call,
                reason: "the group must be a multicast address",
            });
        }
        if self.groups.contains_key(&(index, group.ip())) {
            return Err(CmError::AddrInUse { call });
        }
        e.raw.join_multicast(&group).map_err(|err| os_error(call, err))?;
        self.groups.insert((index, group.ip()), false);
        Ok(())
    }

    /// [`CmBackend::leave_multicast`](cm_core::CmBackend::leave_multicast).
    pub(super) fn leave_group(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        let call = Call::LeaveMulticast;
        let index = self.id_index(call, id)?;
        let ip = group.ip();
        if !self.groups.contains_key(&(index, ip)) {
            return Err(CmError::AddrNotAvailable { call });
        }
        // librdmacm waits for the acks of the group's retrieved events.
        let unacked = self.unacked_group_events(index, ip);
        if unacked > 0 {
            return Err(CmError::UnackedEvents {
                call,
                count: unacked as u32,
            });
        }
        let e = self.ids.at(index).expect("checked");
        e.raw.leave_multicast(&group).map_err(|err| os_error(call, err))?;
        self.groups.remove(&(index, ip));
        Ok(())
    }

    /// How many retrieved, unacked events of id `index` `rdma_leave_multicast` of `ip` would wait
    /// for. An event whose group cannot be told (no GID that maps to one of the id's groups)
    /// counts too: better refused than a wait without end.
    pub(super) fn unacked_group_events(&self, index: u32, ip: std::net::IpAddr) -> usize {
        self.events
            .values()
            .filter(|o| o.counted == index)
            .filter(|o| matches!(o.ty, CmEventType::MulticastJoin | CmEventType::MulticastError))
            .filter(|o| {
                let of = o.raw.ud_param().ah_attr.dest_ip();
                of == Some(ip) || !of.is_some_and(|g| self.groups.contains_key(&(index, g)))
            })
            .count()
    }

    /// The kernel leaves the groups of a destroyed id.
    pub(super) fn forget_groups(&mut self, index: u32) {
        if !self.groups.is_empty() {
            self.groups.retain(|(i, _), _| *i != index);
        }
    }

    /// A `MULTICAST_JOIN` of id `index` was handed out: librdmacm attached the id's QP, if it
    /// has one, to the group.
    pub(super) fn joined(&mut self, index: u32, group: &UdParam) {
        let has_qp = self.ids.at(index).is_some_and(|e| e.qp.is_some());
        if let Some(ip) = group.ah_attr.dest_ip() {
            if let Some(attached) = self.groups.get_mut(&(index, ip)) {
                *attached = has_qp;
            }
        }
    }

    /// How many groups id `index`'s QP is attached to.
    pub(super) fn groups_attached(&self, index: u32) -> u32 {
        self.groups
            .range((index, std::net::IpAddr::from([0u8; 4]))..)
            .take_while(|((i, _), _)| *i == index)
            .filter(|(_, attached)| **attached)
            .count() as u32
    }
}
