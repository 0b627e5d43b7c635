//! Memory regions: what registration grants ([`Access`]), what a region is known by locally
//! ([`MrInfo`]) and remotely ([`RemoteMr`], the part a peer needs), and the scatter/gather
//! entries ([`Sge`]) that name bytes of a region in a work request.
//!
//! A region's bytes belong to the backend that registered them: the application reads and
//! writes them with [`read_mr`](crate::CmBackend::read_mr) and
//! [`write_mr`](crate::CmBackend::write_mr), never through a pointer, so no Rust reference can
//! alias memory a peer's RDMA WRITE or the local NIC changes underneath it.

use std::fmt;
use std::ops::BitOr;

use crate::error::{Call, CmError};
use crate::handle::MrHandle;

/// `enum ibv_access_flags`, the four flags a region can be registered with (verbs' values).
///
/// ```
/// use cm_core::Access;
///
/// let table = Access::LOCAL_WRITE | Access::REMOTE_READ | Access::REMOTE_WRITE;
/// assert!(table.contains(Access::REMOTE_READ));
/// assert!(!table.contains(Access::REMOTE_ATOMIC));
/// assert_eq!(table.to_string(), "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ");
/// assert!(Access::REMOTE_WRITE.check().is_err(), "remote write needs local write");
/// ```
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Access(u32);

impl Access {
    /// No access but local reads (what the NIC needs to send from the region).
    pub const NONE: Access = Access(0);
    /// `IBV_ACCESS_LOCAL_WRITE`: the NIC may write the region for local work requests (a
    /// READ's or an atomic's destination, a receive).
    pub const LOCAL_WRITE: Access = Access(1);
    /// `IBV_ACCESS_REMOTE_WRITE`: peers may RDMA WRITE into it.
    pub const REMOTE_WRITE: Access = Access(1 << 1);
    /// `IBV_ACCESS_REMOTE_READ`: peers may RDMA READ it.
    pub const REMOTE_READ: Access = Access(1 << 2);
    /// `IBV_ACCESS_REMOTE_ATOMIC`: peers may compare-and-swap and fetch-and-add on it.
    pub const REMOTE_ATOMIC: Access = Access(1 << 3);
    /// Every flag: what a region that serves every one-sided operation is registered with.
    pub const ALL: Access = Access(0xF);

    const NAMES: [(Access, &'static str); 4] = [
        (Access::LOCAL_WRITE, "LOCAL_WRITE"),
        (Access::REMOTE_WRITE, "REMOTE_WRITE"),
        (Access::REMOTE_READ, "REMOTE_READ"),
        (Access::REMOTE_ATOMIC, "REMOTE_ATOMIC"),
    ];

    /// Verbs' bits.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The flags of verbs' `bits`; `None` when a bit is not one of the four.
    pub const fn from_bits(bits: u32) -> Option<Access> {
        if bits & !Access::ALL.0 != 0 {
            return None;
        }
        Some(Access(bits))
    }

    /// Whether every flag of `other` is set.
    pub const fn contains(self, other: Access) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both sets of flags.
    pub const fn union(self, other: Access) -> Access {
        Access(self.0 | other.0)
    }

    /// `ibv_reg_mr`'s check (the kernel's `ib_check_mr_access`): remote write and remote
    /// atomic access need local write, since the NIC writes the region for them.
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] for `REMOTE_WRITE` or `REMOTE_ATOMIC` without
    /// `LOCAL_WRITE` (verbs: `EINVAL`).
    pub const fn check(self) -> Result<(), CmError> {
        let remote_writes = self.0 & (Access::REMOTE_WRITE.0 | Access::REMOTE_ATOMIC.0) != 0;
        if remote_writes && !self.contains(Access::LOCAL_WRITE) {
            return Err(CmError::InvalidArgument {
                call: Call::RegMr,
                reason: "REMOTE_WRITE and REMOTE_ATOMIC need LOCAL_WRITE",
            });
        }
        Ok(())
    }
}

impl BitOr for Access {
    type Output = Access;

    fn bitor(self, rhs: Access) -> Access {
        self.union(rhs)
    }
}

impl fmt::Display for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == 0 {
            return f.write_str("NONE");
        }
        let mut first = true;
        for (flag, name) in Access::NAMES {
            if self.contains(flag) {
                if !first {
                    f.write_str("|")?;
                }
                f.write_str(name)?;
                first = false;
            }
        }
        Ok(())
    }
}

impl fmt::Debug for Access {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Access({self})")
    }
}

/// A registered region as the registering side knows it (`struct ibv_mr`'s fields).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct MrInfo {
    /// The region's first byte as the NIC addresses it: what remote work requests name.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// The local key (work requests on this side name the region by its handle instead).
    pub lkey: u32,
    /// The remote key a peer's work requests must carry.
    pub rkey: u32,
    /// What it was registered with.
    pub access: Access,
}

impl MrInfo {
    /// What a peer needs to address the region: give it in private data or a first message.
    pub const fn remote(&self) -> RemoteMr {
        RemoteMr {
            addr: self.addr,
            len: self.len,
            rkey: self.rkey,
        }
    }
}

/// A peer's region as this side addresses it: its address, length and remote key.
///
/// It travels as [`ENCODED_LEN`](Self::ENCODED_LEN) bytes, which fit the 56 bytes of private
/// data a connect carries:
///
/// ```
/// use cm_core::RemoteMr;
///
/// let table = RemoteMr { addr: 0x7f00_0000_1000, len: 4096, rkey: 0x1234 };
/// let wire = table.to_bytes();
/// assert_eq!(RemoteMr::from_bytes(&wire), Some(table));
/// assert_eq!(table.at(8).map(|r| r.addr), Some(0x7f00_0000_1008));
/// assert_eq!(table.at(4097), None, "past its end");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteMr {
    /// The region's first byte.
    pub addr: u64,
    /// Its length in bytes.
    pub len: u64,
    /// Its remote key.
    pub rkey: u32,
}

impl RemoteMr {
    /// Bytes of [`to_bytes`](Self::to_bytes): the address, the length, the key, big-endian.
    pub const ENCODED_LEN: usize = 20;

    /// The region as bytes, for private data or a message.
    pub fn to_bytes(&self) -> [u8; RemoteMr::ENCODED_LEN] {
        let mut out = [0; RemoteMr::ENCODED_LEN];
        out[..8].copy_from_slice(&self.addr.to_be_bytes());
        out[8..16].copy_from_slice(&self.len.to_be_bytes());
        out[16..].copy_from_slice(&self.rkey.to_be_bytes());
        out
    }

    /// The region [`to_bytes`](Self::to_bytes) wrote at the start of `bytes`; `None` when
    /// `bytes` is shorter. Whatever follows is ignored (private data arrives padded).
    pub fn from_bytes(bytes: &[u8]) -> Option<RemoteMr> {
        let b = bytes.get(..RemoteMr::ENCODED_LEN)?;
        let u64_at = |at: usize| u64::from_be_bytes(b[at..at + 8].try_into().expect("8 bytes"));
        Some(RemoteMr {
            addr: u64_at(0),
            len: u64_at(8),
            rkey: u32::from_be_bytes(b[16..].try_into().expect("4 bytes")),
        })
    }

    /// The address `offset` bytes into the region, with its key; `None` past its end. An
    /// offset at the very end is allowed (a zero-length operation may name it).
    pub const fn at(&self, offset: u64) -> Option<RemoteAddr> {
        if offset > self.len {
            return None;
        }
        Some(RemoteAddr {
            addr: self.addr.wrapping_add(offset),
            rkey: self.rkey,
        })
    }

    /// The region's first byte, with its key.
    pub const fn start(&self) -> RemoteAddr {
        RemoteAddr {
            addr: self.addr,
            rkey: self.rkey,
        }
    }
}

/// A remote address and the key that grants access there: the target of an RDMA READ,
/// WRITE or atomic (`wr.rdma` / `wr.atomic`'s `remote_addr` and `rkey`). Nothing checks it on
/// this side: the peer's NIC does, and a bad one fails the work request with
/// [`WcStatus::RemAccessErr`](crate::WcStatus::RemAccessErr).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct RemoteAddr {
    /// The address in the peer's region.
    pub addr: u64,
    /// The region's remote key.
    pub rkey: u32,
}

/// One scatter/gather entry (`struct ibv_sge`): `len` bytes at `offset` in a region
/// registered on this backend. The backend turns it into the region's address and local key.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Sge {
    /// The region.
    pub mr: MrHandle,
    /// Where in it the bytes start.
    pub offset: u64,
    /// How many bytes.
    pub len: u32,
}

impl Sge {
    /// `len` bytes at `offset` of `mr`.
    pub const fn new(mr: MrHandle, offset: u64, len: u32) -> Sge {
        Sge { mr, offset, len }
    }

    /// Whether the entry lies within a region of `region_len` bytes (the check both backends
    /// make before posting; rxe would fail the work request with a local protection error).
    pub const fn fits(&self, region_len: u64) -> bool {
        match self.offset.checked_add(self.len as u64) {
            Some(end) => end <= region_len,
            None => false,
        }
    }
}

/// Checks a range of `len` bytes at `offset` of a region of `region_len` bytes, for
/// [`read_mr`](crate::CmBackend::read_mr) and [`write_mr`](crate::CmBackend::write_mr).
///
/// # Errors
/// [`CmError::InvalidArgument`] when the range does not lie within the region.
pub fn check_range(call: Call, offset: u64, len: usize, region_len: u64) -> Result<(), CmError> {
    match offset.checked_add(len as u64) {
        Some(end) if end <= region_len => Ok(()),
        _ => Err(CmError::InvalidArgument {
            call,
            reason: "range outside the memory region",
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn access_flags_have_verbs_values_and_names() {
        assert_eq!(
            [
                Access::LOCAL_WRITE,
                Access::REMOTE_WRITE,
                Access::REMOTE_READ,
                Access::REMOTE_ATOMIC
            ]
            .map(Access::bits),
            [1, 2, 4, 8]
        );
        assert_eq!(Access::REMOTE_WRITE.bits(), crate::ACCESS_REMOTE_WRITE);
        assert_eq!(Access::from_bits(0xF), Some(Access::ALL));
        assert_eq!(Access::from_bits(0x10), None);
        assert_eq!(Access::from_bits(0), Some(Access::NONE));
        assert_eq!(Access::NONE.to_string(), "NONE");
        assert_eq!(
            Access::ALL.to_string(),
            "LOCAL_WRITE|REMOTE_WRITE|REMOTE_READ|REMOTE_ATOMIC"
        );
        assert_eq!(format!("{:?}", Access::REMOTE_READ), "Access(REMOTE_READ)");
        assert!(Access::ALL.contains(Access::REMOTE_ATOMIC));
        assert!(Access::NONE.contains(Access::NONE));
        assert!(!Access::LOCAL_WRITE.contains(Access::REMOTE_READ));
        // A flag given twice is set once.
        assert_eq!(Access::ALL | Access::LOCAL_WRITE, Access::ALL);
        assert_eq!(Access::REMOTE_READ | Access::REMOTE_READ, Access::REMOTE_READ);
    }

    #[test]
    fn remote_write_and_atomic_need_local_write() {
        for ok in [
            Access::NONE,
            Access::LOCAL_WRITE,
            Access::REMOTE_READ,
            Access::LOCAL_WRITE | Access::REMOTE_WRITE,
            Access::LOCAL_WRITE | Access::REMOTE_ATOMIC,
            Access::ALL,
        ] {
            assert_eq!(ok.check(), Ok(()), "{ok}");
        }
        for bad in [
            Access::REMOTE_WRITE,
            Access::REMOTE_ATOMIC,
            Access::REMOTE_READ | Access::REMOTE_WRITE,
        ] {
            assert!(
                matches!(
                    bad.check(),
                    Err(CmError::InvalidArgument {
                        call: Call::RegMr,
                        ..
                    })
                ),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_remote_region_survives_its_encoding_and_bounds_its_offsets() {
        let r = RemoteMr {
            addr: u64::MAX - 3,
            len: 3,
            rkey: 0xDEAD_BEEF,
        };
        let mut padded = r.to_bytes().to_vec();
        padded.extend_from_slice(&[0; 36]);
        assert_eq!(RemoteMr::from_bytes(&padded), Some(r));
        assert_eq!(RemoteMr::from_bytes(&padded[..19]), None);
        assert_eq!(
            r.at(3),
            Some(RemoteAddr {
                addr: u64::MAX,
                rkey: 0xDEAD_BEEF
            })
        );
        assert_eq!(r.at(4), None);
        assert_eq!(r.start().addr, u64::MAX - 3);
        let info = MrInfo {
            addr: 5,
            len: 6,
            lkey: 7,
            rkey: 8,
            access: Access::ALL,
        };
        assert_eq!(
            info.remote(),
            RemoteMr {
                addr: 5,
                len: 6,
                rkey: 8
            }
        );
    }

    #[test]
    fn ranges_must_lie_within_the_region() {
        let mr = crate::backend::mr_handle(1, 0, 0);
        assert!(Sge::new(mr, 0, 8).fits(8));
        assert!(Sge::new(mr, 8, 0).fits(8));
        assert!(!Sge::new(mr, 1, 8).fits(8));
        assert!(!Sge::new(mr, u64::MAX, 1).fits(u64::MAX));
        assert_eq!(check_range(Call::ReadMr, 4, 4, 8), Ok(()));
        assert_eq!(check_range(Call::ReadMr, 8, 0, 8), Ok(()));
        assert!(check_range(Call::WriteMr, 5, 4, 8).is_err());
        assert!(check_range(Call::WriteMr, u64::MAX, 2, u64::MAX).is_err());
    }
}
