//! Registered memory: a QP's (or an SRQ's) message slots and the application's memory regions,
//! page-aligned memory registered with a PD (`ibv_reg_mr`).
//!
//! A QP registers its slots on its first post, not when it is created: registering pins pages
//! and is a kernel call (on rxe the most expensive part of making a QP), and an application that
//! only connects and disconnects (rdma-core's `cmtime`) never posts.
//!
//! A [`Region`] is memory the backend owns on the application's behalf: the NIC reads and writes
//! it (the peer's RDMA READ, WRITE and atomics, the local READ's and atomic's results), and the
//! application only ever copies bytes in and out through [`Region::read`] and
//! [`Region::write`], so no Rust reference to it exists for the NIC to change underneath.

use std::alloc::Layout;
use std::ptr::NonNull;

use rdma_sys as ffi;

use super::{last_errno, Errno, Pd};
use cm_core::Access;

/// Zeroed, page-aligned heap memory.
pub(super) struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buffer {
    /// `len` zeroed bytes (at least one page's alignment; a length of 0 allocates one byte).
    fn new(len: usize) -> Result<Buffer, Errno> {
        let layout = Layout::from_size_align(len.max(1), 4096).map_err(|_| libc::ENOMEM)?;
        // SAFETY: the layout has a non-zero size.
        let ptr = unsafe { std::alloc::alloc_zeroed(layout) };
        let ptr = NonNull::new(ptr).ok_or(libc::ENOMEM)?;
        Ok(Buffer { ptr, layout })
    }

    /// Frees the memory. Only once nothing (no MR) lets the device reach it.
    fn free(self) {
        // SAFETY: allocated in `new` with this layout, freed once (consumed).
        unsafe { std::alloc::dealloc(self.ptr.as_ptr(), self.layout) };
    }
}

/// `len` bytes registered for local write on a PD.
pub(super) struct SlotMemory {
    buf: Buffer,
    mr: NonNull<ffi::ibv_mr>,
}

impl SlotMemory {
    /// Allocates `len` zeroed bytes and registers them with `pd` (local write).
    pub(super) fn register(pd: &Pd, len: usize) -> Result<SlotMemory, Errno> {
        let buf = Buffer::new(len)?;
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the PD is alive (the caller's QP holds it); the buffer is valid for
        // `layout.size()` bytes and stays allocated until the MR is deregistered (`release`).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.inner.ptr.as_ptr(),
                buf.ptr.as_ptr().cast(),
                buf.layout.size(),
                access,
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(SlotMemory { buf, mr }),
            None => {
                let err = last_errno();
                buf.free();
                Err(err)
            }
        }
    }

    /// The first byte.
    pub(super) fn base(&self) -> *mut u8 {
        self.buf.ptr.as_ptr()
    }

    /// The MR's local key.
    pub(super) fn lkey(&self) -> u32 {
        // SAFETY: the MR is alive until `release` consumes `self`; reading a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// Deregisters the MR, then frees the memory. Only once no QP can post with it (its QP is
    /// destroyed). When deregistration fails the memory leaks (the device may still reach it)
    /// and the errno is returned.
    pub(super) fn release(self) -> Result<(), Errno> {
        // SAFETY: the MR was registered in `register`, is deregistered once (consumed), and no
        // QP can use it any more (the caller's contract).
        let ret = unsafe { ffi::ibv_dereg_mr(self.mr.as_ptr()) };
        if ret != 0 {
            return Err(ret);
        }
        self.buf.free();
        Ok(())
    }
}

/// The `ibv_access_flags` bits of `access` (cm-core's flags carry verbs' values).
fn access_bits(access: Access) -> i32 {
    let bits = access.bits();
    debug_assert_eq!(
        ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_WRITE.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_READ.0
            | ffi::ibv_access_flags::IBV_ACCESS_REMOTE_ATOMIC.0,
        Access::ALL.bits()
    );
    bits as i32
}

/// A memory region: `len` zeroed bytes the backend owns, registered with `access` on a PD that
/// holds its device open ([`Pd::hold_device`]), so the region may outlive every id on the device.
///
/// Release order: [`dereg`](Region::dereg) deregisters the MR before the memory is freed, so
/// the NIC can never write into freed memory; the region keeps its PD counted as used until
/// then ([`Pd::users`]), so the PD is never deallocated under it.
pub(crate) struct Region {
    buf: Buffer,
    len: usize,
    mr: NonNull<ffi::ibv_mr>,
    access: Access,
    pd: Pd,
}

impl Region {
    /// Allocates `len` zeroed bytes and registers them on `pd` with `access`, keeping the PD's
    /// device context open for as long as the region lives. `EINVAL` for a length of 0.
    pub(crate) fn register(pd: &Pd, len: usize, access: Access) -> Result<Region, Errno> {
        if len == 0 {
            return Err(libc::EINVAL);
        }
        pd.hold_device()?;
        let buf = Buffer::new(len)?;
        // SAFETY: the PD is alive and its context open (it holds the device, above); the
        // buffer is valid for `len` bytes and stays allocated until the MR is deregistered
        // (`dereg` frees it only after ibv_dereg_mr succeeded).
        let mr = unsafe {
            ffi::ibv_reg_mr(
                pd.inner.ptr.as_ptr(),
                buf.ptr.as_ptr().cast(),
                len,
                access_bits(access),
            )
        };
        match NonNull::new(mr) {
            Some(mr) => Ok(Region {
                buf,
                len,
                mr,
                access,
                pd: Pd {
                    inner: std::rc::Rc::clone(&pd.inner),
                },
            }),
            None => {
                let err = last_errno();
                buf.free();
                Err(err)
            }
        }
    }

    /// The first byte's address, which the NIC and the peer's work requests name (the MR was
    /// registered at its own address: `iova == addr`).
    pub(crate) fn addr(&self) -> u64 {
        self.buf.ptr.as_ptr() as u64
    }

    /// Its length.
    pub(crate) fn len(&self) -> u64 {
        self.len as u64
    }

    /// What it was registered with.
    pub(crate) fn access(&self) -> Access {
        self.access
    }

    /// The MR's local key.
    pub(crate) fn lkey(&self) -> u32 {
        // SAFETY: the MR is alive until `dereg` consumes `self`; reading a plain field.
        unsafe { (*self.mr.as_ptr()).lkey }
    }

    /// The MR's remote key (rxe gives a region without remote access 0).
    pub(crate) fn rkey(&self) -> u32 {
        // SAFETY: as for lkey.
        unsafe { (*self.mr.as_ptr()).rkey }
    }

    /// The device context of the region's PD.
    pub(crate) fn context(&self) -> super::DeviceContext {
        self.pd.context()
    }

    /// Whether the region is registered on `pd`.
    pub(super) fn on(&self, pd: &Pd) -> bool {
        std::rc::Rc::ptr_eq(&self.pd.inner, &pd.inner)
    }

    /// Copies `out.len()` bytes at `offset` into `out`; `EINVAL` for a range outside the region.
    pub(crate) fn read(&self, offset: u64, out: &mut [u8]) -> Result<(), Errno> {
        let at = self.range(offset, out.len())?;
        // SAFETY: `at` is valid for `out.len()` bytes of our allocation (checked by `range`);
        // no Rust reference to the region exists, only raw copies like this one. The NIC may
        // be writing the same bytes (a peer's RDMA WRITE): the copy then sees some of the old
        // and some of the new bytes, as a C program reading RDMA memory does; every bit pattern
        // is a valid u8.
        unsafe { std::ptr::copy_nonoverlapping(at, out.as_mut_ptr(), out.len()) };
        Ok(())
    }

    /// Copies `data` to `offset`; `EINVAL` for a range outside the region.
    pub(crate) fn write(&mut self, offset: u64, data: &[u8]) -> Result<(), Errno> {
        let at = self.range(offset, data.len())?;
        // SAFETY: `at` is valid for `data.len()` bytes of our allocation (checked by `range`),
        // which `data` (the caller's) cannot overlap; as for `read`, the NIC may touch the same
        // bytes at the same time, with the same outcome as in C.
        unsafe { std::ptr::copy_nonoverlapping(data.as_ptr(), at, data.len()) };
        Ok(())
    }

    /// Where `len` bytes at `offset` start, if they lie inside the region.
    fn range(&self, offset: u64, len: usize) -> Result<*mut u8, Errno> {
        match offset.checked_add(len as u64) {
            Some(end) if end <= self.len as u64 => Ok(self.buf.ptr.as_ptr().wrapping_add(offset as usize)),
            _ => Err(libc::EINVAL),
        }
    }

    /// `ibv_dereg_mr`, then frees the memory. Work still in flight that names the region fails
    /// when it reaches it (the device's lookup of the key fails). When deregistration fails the
    /// memory leaks (the device may still reach it), the PD stays counted as used (so it is
    /// never deallocated under the MR), and the errno is returned.
    pub(crate) fn dereg(self) -> Result<(), Errno> {
        let Region { buf, mr, pd, .. } = self;
        // SAFETY: the MR was registered in `register` and is deregistered once (consumed); its
        // PD's context is open (the PD holds the device for as long as the PD lives, and the
        // region holds the PD).
        let ret = unsafe { ffi::ibv_dereg_mr(mr.as_ptr()) };
        if ret != 0 {
            std::mem::forget(pd);
            return Err(ret);
        }
        buf.free();
        drop(pd);
        Ok(())
    }
}
