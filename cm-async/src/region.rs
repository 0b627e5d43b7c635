//! Registered memory the application owns through the layer: [`Region`].

use std::rc::Rc;

use cm_core::{CmBackend, MrHandle, MrInfo, RemoteAddr, RemoteMr};

use crate::driver::Shared;
use crate::error::Result;

/// A memory region registered on a device (`ibv_reg_mr`), made by
/// [`Connection::register`](crate::Connection::register) or
/// [`Listener::register`](crate::Listener::register); deregistered when dropped.
///
/// Its bytes belong to the backend: they are read and written through [`read`](Self::read) and
/// [`write`](Self::write), never through a reference, so nothing in Rust aliases memory that a
/// peer's RDMA WRITE or the local NIC changes. Give a peer [`remote`](Self::remote) (in private
/// data, or a first message) and it can address the region with the access it was registered
/// with. A region serves every connection on its device, not only the one it was made through.
pub struct Region<B: CmBackend> {
    sh: Rc<Shared<B>>,
    mr: MrHandle,
    info: MrInfo,
}

impl<B: CmBackend> Region<B> {
    pub(crate) fn new(sh: Rc<Shared<B>>, mr: MrHandle, info: MrInfo) -> Self {
        Region { sh, mr, info }
    }

    /// The backend's handle, for the trait's calls.
    pub fn handle(&self) -> MrHandle {
        self.mr
    }

    /// Address, length, keys and access.
    pub fn info(&self) -> MrInfo {
        self.info
    }

    /// Its length in bytes.
    pub fn len(&self) -> u64 {
        self.info.len
    }

    /// Whether it has no bytes (never: registration refuses a length of 0).
    pub fn is_empty(&self) -> bool {
        self.info.len == 0
    }

    /// What a peer needs to address the region.
    pub fn remote(&self) -> RemoteMr {
        self.info.remote()
    }

    /// The remote address `offset` bytes in, with the region's key; `None` past its end.
    pub fn remote_at(&self, offset: u64) -> Option<RemoteAddr> {
        self.info.remote().at(offset)
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`](cm_core::CmError::InvalidArgument) for a range outside the
    /// region.
    pub fn read(&self, offset: u64, out: &mut [u8]) -> Result<()> {
        Ok(self.sh.st.borrow().b.read_mr(self.mr, offset, out)?)
    }

    /// Copies `data` to `offset`.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn write(&self, offset: u64, data: &[u8]) -> Result<()> {
        Ok(self.sh.st.borrow_mut().b.write_mr(self.mr, offset, data)?)
    }

    /// The native-endian `u64` at `offset` (what an atomic sees there).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn read_u64(&self, offset: u64) -> Result<u64> {
        let mut v = [0; 8];
        self.read(offset, &mut v)?;
        Ok(u64::from_ne_bytes(v))
    }

    /// Writes `value` native-endian at `offset`.
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub fn write_u64(&self, offset: u64, value: u64) -> Result<()> {
        self.write(offset, &value.to_ne_bytes())
    }
}

impl<B: CmBackend> Drop for Region<B> {
    fn drop(&mut self) {
        self.sh.dereg(self.mr);
    }
}

impl<B: CmBackend> std::fmt::Debug for Region<B> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Region")
            .field("mr", &self.mr)
            .field("info", &self.info)
            .finish()
    }
}
