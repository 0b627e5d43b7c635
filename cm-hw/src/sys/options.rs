//! `rdma_set_option` (level `RDMA_OPTION_ID`) and `rdma_migrate_id`.

use std::mem::size_of;
use std::rc::Rc;

use cm_core::IdOption;
use libc::c_void;
use rdma_sys as ffi;

use super::{check, Channel, Errno, Id};

/// `RDMA_OPTION_ID`: the level of the id options.
const RDMA_OPTION_ID: i32 = 0;

impl Id {
    /// `rdma_set_option(id, RDMA_OPTION_ID, ...)` with the value in the size the kernel expects
    /// for the option (a byte for TOS and ACK_TIMEOUT, an int for REUSEADDR and AFONLY).
    pub(crate) fn set_option(&self, option: IdOption) -> Result<(), Errno> {
        let optname = option.optname();
        let mut byte: u8;
        let mut int: i32;
        let (ptr, len): (*mut c_void, usize) = match option {
            IdOption::Tos(v) | IdOption::AckTimeout(v) => {
                byte = v;
                (std::ptr::addr_of_mut!(byte).cast(), size_of::<u8>())
            }
            IdOption::ReuseAddr(v) | IdOption::AfOnly(v) => {
                int = i32::from(v);
                (std::ptr::addr_of_mut!(int).cast(), size_of::<i32>())
            }
            // An option this backend does not know: what the kernel answers for an unknown
            // option name.
            _ => return Err(libc::ENOSYS),
        };
        // SAFETY: the id is alive (type invariant); `ptr` points to a local of exactly `len`
        // bytes that lives across the call, and librdmacm only reads it.
        check(unsafe { ffi::rdma_set_option(self.raw(), RDMA_OPTION_ID, optname, ptr, len) })
    }

    /// `rdma_migrate_id` to `channel`. Refused with `EBUSY` while an event retrieved through
    /// this module for the id is unacked: librdmacm would wait for its ack for ever.
    pub(crate) fn migrate(&mut self, channel: &Channel) -> Result<(), Errno> {
        let events = self.holders() - usize::from(self.has_qp()).min(self.holders());
        if events > 0 {
            return Err(libc::EBUSY);
        }
        // SAFETY: the id and the channel are alive (type invariants), and no event of the id is
        // retrieved and unacked (each bound one holds `anchor`, counted above), so librdmacm's
        // wait for acks returns at once.
        check(unsafe { ffi::rdma_migrate_id(self.raw(), channel.inner.ptr.as_ptr()) })?;
        // The id now holds the new channel, which must outlive it; the old one is free of it.
        self._channel = Rc::clone(&channel.inner);
        Ok(())
    }
}
