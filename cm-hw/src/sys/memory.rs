//! A QP's message slots: page-aligned memory registered with the QP's PD (`ibv_reg_mr`).
//!
//! A QP registers its slots on its first post, not when it is created: registering pins pages
//! and is a kernel call (on rxe the most expensive part of making a QP), and an application that
//! only connects and disconnects (rdma-core's `cmtime`) never posts.

use std::alloc::Layout;
use std::ptr::NonNull;

use rdma_sys as ffi;

use super::{last_errno, Errno, Pd};

/// Zeroed, page-aligned heap memory.
pub(super) struct Buffer {
    ptr: NonNull<u8>,
    layout: Layout,
}

impl Buffer {
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
