//! Multicast: `rdma_join_multicast` and `rdma_leave_multicast` on an id.

use std::net::SocketAddr;
use std::ptr;

use super::{check, ffi, Errno, Id};
use crate::convert::RawSockAddr;

impl Id {
    /// `rdma_join_multicast(id, group, NULL)`. The backend checked first that the id is a
    /// datagram id on a device in `ADDR_BOUND` or `ADDR_RESOLVED` and has not joined `group`.
    pub(crate) fn join_multicast(&self, group: &SocketAddr) -> Result<(), Errno> {
        let mut sa = RawSockAddr::from(*group);
        // SAFETY: the id is alive; `sa` is a properly sized sockaddr_in/sockaddr_in6 that lives
        // across the call (librdmacm copies it into its membership); a NULL context is allowed
        // and comes back as the events' private data.
        check(unsafe { ffi::rdma_join_multicast(self.raw(), sa.as_mut_ptr(), ptr::null_mut()) })
    }

    /// `rdma_leave_multicast(id, group)`. The backend checked first that the id joined `group`
    /// and holds none of the group's events unacked, so librdmacm's wait for their acks ends at
    /// once instead of never.
    pub(crate) fn leave_multicast(&self, group: &SocketAddr) -> Result<(), Errno> {
        let mut sa = RawSockAddr::from(*group);
        // SAFETY: the id is alive; `sa` is a valid sockaddr for the call's duration; librdmacm
        // only compares it with its memberships' addresses.
        check(unsafe { ffi::rdma_leave_multicast(self.raw(), sa.as_mut_ptr()) })
    }
}
