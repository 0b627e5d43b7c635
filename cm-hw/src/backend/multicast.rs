//! Multicast membership: joins and leaves checked as the simulator checks them, so that
//! librdmacm is never asked to wait for an ack that cannot come.

use std::net::SocketAddr;

use cm_core::{Call, CmError, CmEventType, IdHandle, Result};

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
        if self.groups.contains(&(index, group.ip())) {
            return Err(CmError::AddrInUse { call });
        }
        e.raw.join_multicast(&group).map_err(|err| os_error(call, err))?;
        self.groups.insert((index, group.ip()));
        Ok(())
    }

    /// [`CmBackend::leave_multicast`](cm_core::CmBackend::leave_multicast).
    pub(super) fn leave_group(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        let call = Call::LeaveMulticast;
        let index = self.id_index(call, id)?;
        let ip = group.ip();
        if !self.groups.contains(&(index, ip)) {
            return Err(CmError::AddrNotAvailable { call });
        }
        // librdmacm waits for the acks of the group's retrieved events. An event whose group
        // cannot be told (no GID that maps to one of the id's groups) counts too: better refused
        // than a wait without end.
        let unacked = self
            .events
            .values()
            .filter(|o| o.counted == index)
            .filter(|o| matches!(o.ty, CmEventType::MulticastJoin | CmEventType::MulticastError))
            .filter(|o| {
                let of = o.raw.ud_param().ah_attr.dest_ip();
                of == Some(ip) || !of.is_some_and(|g| self.groups.contains(&(index, g)))
            })
            .count();
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

    /// The kernel leaves the groups of a destroyed id.
    pub(super) fn forget_groups(&mut self, index: u32) {
        if !self.groups.is_empty() {
            self.groups.retain(|(i, _)| *i != index);
        }
    }
}
