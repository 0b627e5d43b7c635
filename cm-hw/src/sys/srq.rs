//! Shared receive queues (`ibv_create_srq`) with their registered receive slots.

use std::ptr::{self, NonNull};
use std::rc::Rc;

use cm_core::SrqCaps;
use rdma_sys as ffi;

use super::memory::SlotMemory;
use super::{last_errno, DeviceContext, Errno, Pd};
use crate::onesided::srq_wr_id;

/// An SRQ on a PD, with `slots` receive slots of `slot_size` bytes, registered on the first
/// post (as a QP's are).
///
/// Release order: every QP created on the SRQ holds a counted reference to it
/// ([`Srq::anchor`]), and [`Srq::destroy`] refuses while any exists (the kernel would answer
/// `EBUSY`, and a QP must never take receives from a destroyed SRQ); the slots' memory is
/// deregistered and freed only after `ibv_destroy_srq`, so the device never writes into freed
/// memory. The SRQ holds its PD's device context open ([`Pd::hold_device`]), since it may
/// outlive every id on the device.
pub(crate) struct Srq {
    srq: NonNull<ffi::ibv_srq>,
    /// None until the first post.
    mem: Option<SlotMemory>,
    slot_size: usize,
    slots: u32,
    /// Counted by every QP that takes its receives from the SRQ.
    anchor: Rc<()>,
    pd: Pd,
}

impl Srq {
    /// `ibv_create_srq` on `pd` for `caps.max_wr` receives of `caps.max_sge` entries, the limit
    /// armed at `caps.srq_limit` when it is not 0: rxe arms it from the create attributes, and
    /// `ibv_modify_srq` arms it on providers that ignore them, as the verbs spec has them do.
    pub(crate) fn create(pd: &Pd, caps: &SrqCaps) -> Result<Srq, Errno> {
        let slot_size = caps.max_message_size as usize;
        slot_size.checked_mul(caps.max_wr as usize).ok_or(libc::ENOMEM)?;
        pd.hold_device()?;
        let mut attr = ffi::ibv_srq_init_attr {
            srq_context: ptr::null_mut(),
            attr: ffi::ibv_srq_attr {
                max_wr: caps.max_wr,
                max_sge: caps.max_sge,
                srq_limit: caps.srq_limit,
            },
        };
        // SAFETY: the PD is alive with its context held open (above); `attr` is valid for the
        // call, which writes the granted sizes back into it.
        let srq = unsafe { ffi::ibv_create_srq(pd.inner.ptr.as_ptr(), &mut attr) };
        let srq = NonNull::new(srq).ok_or_else(last_errno)?;
        let made = Srq {
            srq,
            mem: None,
            slot_size,
            slots: caps.max_wr,
            anchor: Rc::new(()),
            pd: Pd {
                inner: Rc::clone(&pd.inner),
            },
        };
        if caps.srq_limit > 0 {
            if let Err(err) = made.arm_limit(caps.srq_limit) {
                // No QP and no receive uses the new SRQ: it can go at once.
                let _ = made.destroy();
                return Err(err);
            }
        }
        Ok(made)
    }

    /// The SRQ's address: what its asynchronous events name it by (never dereferenced there).
    pub(crate) fn key(&self) -> usize {
        self.srq.as_ptr() as usize
    }

    pub(super) fn raw(&self) -> *mut ffi::ibv_srq {
        self.srq.as_ptr()
    }

    /// The device context of the SRQ's PD.
    pub(crate) fn context(&self) -> DeviceContext {
        self.pd.context()
    }

    /// How many QPs take their receives from the SRQ.
    pub(crate) fn users(&self) -> usize {
        Rc::strong_count(&self.anchor) - 1
    }

    /// A counted reference for a QP created on the SRQ.
    pub(super) fn anchor(&self) -> Rc<()> {
        Rc::clone(&self.anchor)
    }

    /// `ibv_modify_srq(IBV_SRQ_LIMIT)`: arms the limit at `limit` (0 disarms it).
    pub(crate) fn arm_limit(&self, limit: u32) -> Result<(), Errno> {
        let mut attr = ffi::ibv_srq_attr {
            max_wr: 0,
            max_sge: 0,
            srq_limit: limit,
        };
        let mask = ffi::ibv_srq_attr_mask::IBV_SRQ_LIMIT.0 as i32;
        // SAFETY: the SRQ is alive (destroyed only by consuming `self`); `attr` is valid for the
        // call, which reads only the limit (the mask says so).
        let ret = unsafe { ffi::ibv_modify_srq(self.srq.as_ptr(), &mut attr, mask) };
        if ret == 0 {
            Ok(())
        } else {
            // verbs returns the errno itself.
            Err(ret)
        }
    }

    /// Where `len` bytes of slot `slot` start; `EINVAL` when out of bounds or nothing was
    /// posted yet.
    fn slot_ptr(&self, slot: u32, len: usize) -> Result<*mut u8, Errno> {
        if slot >= self.slots || len > self.slot_size {
            return Err(libc::EINVAL);
        }
        let mem = self.mem.as_ref().ok_or(libc::EINVAL)?;
        // In bounds: slot * slot_size + len <= slots * slot_size, the allocation's length.
        Ok(mem.base().wrapping_add(slot as usize * self.slot_size))
    }

    /// Posts receive slot `slot` for `len` bytes (no SGE for 0), with the slot tagged as an
    /// SRQ receive ([`srq_wr_id`]) as the wr id, so that the completion on whichever QP's CQ
    /// takes it is told apart from that QP's own work.
    pub(crate) fn post_recv(&mut self, slot: u32, len: u32) -> Result<(), Errno> {
        if self.mem.is_none() {
            // The product was checked in `create`.
            self.mem = Some(SlotMemory::register(
                &self.pd,
                self.slot_size * self.slots as usize,
            )?);
        }
        let lkey = self.mem.as_ref().map_or(0, SlotMemory::lkey);
        let dst = self.slot_ptr(slot, len as usize)?;
        let mut sge = ffi::ibv_sge {
            addr: dst as u64,
            length: len,
            lkey,
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: srq_wr_id(slot),
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: i32::from(len > 0),
        };
        let mut bad: *mut ffi::ibv_recv_wr = ptr::null_mut();
        // SAFETY: the SRQ is alive; the WR and its SGE live across the call (the provider
        // copies them); the SGE lies in our registered slots, which stay allocated until the
        // SRQ is destroyed, and the device writes at most `len` bytes there.
        let ret = unsafe { ffi::ibv_post_srq_recv(self.srq.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(ret)
        }
    }

    /// Copies the first `len` bytes of slot `slot` (a receive whose completion was polled).
    pub(crate) fn read_slot(&self, slot: u32, len: usize) -> Vec<u8> {
        let len = len.min(self.slot_size);
        match self.slot_ptr(slot, len) {
            Ok(src) => {
                let mut v = vec![0u8; len];
                // SAFETY: `src` is valid for `len` bytes of our buffer; the receive completed,
                // so the device no longer writes to the slot (it is not posted again before
                // this completion was handed out).
                unsafe { ptr::copy_nonoverlapping(src, v.as_mut_ptr(), len) };
                v
            }
            Err(_) => Vec::new(),
        }
    }

    /// `ibv_destroy_srq`, then deregisters and frees the slots. Refused with `EBUSY` (the SRQ
    /// handed back) while QPs use it, or when verbs refuses (with verbs' errno). When the
    /// slots cannot be deregistered they leak, with the PD counted as used, and the errno is
    /// returned.
    pub(crate) fn destroy(self) -> Result<(), (Option<Srq>, Errno)> {
        if self.users() > 0 {
            return Err((Some(self), libc::EBUSY));
        }
        // SAFETY: the SRQ is alive, no QP of ours uses it (each holds `anchor`), its context is
        // open (its PD holds it), and every asynchronous event about it has been acked (the
        // backend acks each as it reads it), so ibv_destroy_srq does not wait forever.
        let ret = unsafe { ffi::ibv_destroy_srq(self.srq.as_ptr()) };
        if ret != 0 {
            return Err((Some(self), ret));
        }
        let Srq { mem, pd, .. } = self;
        if let Some(mem) = mem {
            // The SRQ is gone: nothing can receive into the slots any more.
            if let Err(err) = mem.release() {
                std::mem::forget(pd);
                return Err((None, err));
            }
        }
        drop(pd);
        Ok(())
    }
}
