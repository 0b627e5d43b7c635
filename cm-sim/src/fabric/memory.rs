//! Memory regions: registration, keys and addresses as rxe lays them out, and the bytes behind
//! them ([`RegionMemory`]).
//!
//! Each host has one device and one protection domain (librdmacm's `id->pd`, which every id of
//! the device shares), so its regions are one slab, whose handles carry the host's backend tag:
//! a handle of another host, a deregistered one and a forged one are all unknown. A region's
//! keys are rxe's layout (`rxe_mr_init`): the pool index above 8 bits of generation; the
//! index counts from 1, as rxe's MR pool does, so that no region's key is 0, the remote key of
//! a region registered without remote access. Its address is page-aligned and never given to
//! another region of the host, so a stale address cannot reach a new region.
//!
//! A region registered before the host's device was removed outlives the device (the
//! application still deregisters it) but belongs to it: a QP of the device that came back
//! neither names it locally nor reaches it with its key.
//!
//! The regions are made with the first registration: a run without one pays nothing.

use cm_core::{check_range, Access, LocalRegion, MrHandle, MrInfo, Sge};

use super::*;
use crate::rdma::KeyedRegion;

/// The bytes of a registered region, wherever they live: the simulator reads and writes them
/// through this, for local work requests and for the peers' RDMA READs, WRITEs and atomics.
///
/// [`reg_mr`](cm_core::CmBackend::reg_mr) registers zeroed bytes the simulator owns;
/// [`SimHost::reg_mr_with`](crate::SimHost::reg_mr_with) registers any other, such as memory
/// a program under test owns (the C drop-in's regions, which live in the program).
///
/// Offsets and lengths are checked before a call: `offset + len` never passes
/// [`len`](Self::len). The region's length is read once, at registration.
///
/// ```
/// use cm_core::{Access, CmBackend, PortSpace};
/// use cm_sim::{RegionMemory, SimFabric};
///
/// /// A region whose every byte reads as its offset, and which counts the bytes written to it.
/// struct Pattern { len: u64, written: u64 }
///
/// impl RegionMemory for Pattern {
///     fn len(&self) -> u64 { self.len }
///     fn read(&self, offset: u64, out: &mut [u8]) {
///         for (i, b) in out.iter_mut().enumerate() { *b = (offset + i as u64) as u8; }
///     }
///     fn write(&mut self, _offset: u64, data: &[u8]) { self.written += data.len() as u64; }
/// }
///
/// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").build();
/// let mut h = fabric.host(0);
/// let ch = h.create_event_channel()?;
/// let id = h.create_id(ch, PortSpace::Tcp)?;
/// h.bind_addr(id, "10.0.0.1:0".parse().unwrap())?;
/// let mr = h.reg_mr_with(id, Box::new(Pattern { len: 16, written: 0 }), Access::LOCAL_WRITE)?;
/// let mut out = [0; 3];
/// h.read_mr(mr, 5, &mut out)?;
/// assert_eq!(out, [5, 6, 7]);
/// assert_eq!(h.mr_info(mr)?.len, 16);
/// h.dereg_mr(mr)?;
/// # Ok::<(), cm_core::CmError>(())
/// ```
pub trait RegionMemory {
    /// The region's length in bytes.
    fn len(&self) -> u64;

    /// Whether the region has no bytes (such a region cannot be registered).
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Copies `out.len()` bytes at `offset` into `out`.
    fn read(&self, offset: u64, out: &mut [u8]);

    /// Copies `data` to `offset`.
    fn write(&mut self, offset: u64, data: &[u8]);
}

/// The zeroed bytes `reg_mr` makes, owned by the simulator.
struct Owned(Vec<u8>);

impl RegionMemory for Owned {
    fn len(&self) -> u64 {
        self.0.len() as u64
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        let at = offset as usize;
        out.copy_from_slice(&self.0[at..at + out.len()]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        let at = offset as usize;
        self.0[at..at + data.len()].copy_from_slice(data);
    }
}

/// One registered region.
pub(super) struct Region {
    memory: Box<dyn RegionMemory>,
    addr: u64,
    len: u64,
    key: u32,
    access: Access,
    /// The host's device when it was registered.
    device_epoch: u32,
}

impl Region {
    /// The remote key: the key, or 0 without any remote access (rxe).
    fn rkey(&self) -> u32 {
        if self.access.bits() & !Access::LOCAL_WRITE.bits() == 0 {
            0
        } else {
            self.key
        }
    }

    pub(super) fn read(&self, offset: u64, out: &mut [u8]) {
        self.memory.read(offset, out);
    }

    pub(super) fn write(&mut self, offset: u64, data: &[u8]) {
        self.memory.write(offset, data);
    }
}

/// Regions' addresses start here (where a 64-bit Linux process's heap might be) and step by
/// whole pages.
const FIRST_ADDR: u64 = 0x7f00_0000_0000;
const PAGE: u64 = 4096;

/// The most regions a host holds at once: a key has 24 bits of index, counted from 1.
const MAX_REGIONS: usize = (1 << 24) - 1;

/// The key of the region in slot `r`.
fn key_of(r: SlotRef) -> u32 {
    ((r.index + 1) << 8) | (r.generation & 0xff)
}

/// One host's regions.
struct HostRegions {
    slab: Slab<Region>,
    /// Where the next region starts: addresses only grow, never reused.
    next_addr: u64,
}

/// Every host's regions, made with the first registration.
pub(super) struct Regions {
    hosts: Vec<HostRegions>,
}

impl Regions {
    fn new(hosts: usize) -> Self {
        Regions {
            hosts: (0..hosts)
                .map(|_| HostRegions {
                    slab: Slab::new(),
                    next_addr: FIRST_ADDR,
                })
                .collect(),
        }
    }

    /// The region `mr` names on `host` (tagged `tag`), if it is registered.
    fn get(&self, host: u16, tag: u32, mr: MrHandle) -> Option<&Region> {
        if mr.owner() != tag {
            return None;
        }
        self.hosts[host as usize].slab.get(SlotRef {
            index: mr.index(),
            generation: mr.generation(),
        })
    }

    /// What the post gate needs of the region a local entry names (`epoch`: the host's device
    /// now).
    pub(super) fn local(&self, host: u16, tag: u32, epoch: u32, mr: MrHandle) -> Option<LocalRegion> {
        self.get(host, tag, mr).map(|r| LocalRegion {
            len: r.len,
            access: r.access,
            same_device: r.device_epoch == epoch,
        })
    }

    /// The bytes a SEND or WRITE gathers from `sges` when it leaves, as rxe's requester copies
    /// them (`copy_data`): an entry whose region is gone (deregistered since the post, or of a
    /// removed device) fails it with `LOC_QP_OP_ERR`, one past its region's end with
    /// `LOC_PROT_ERR`; zero-length entries are skipped without a lookup.
    pub(super) fn gather(&self, host: u16, tag: u32, epoch: u32, sges: &[Sge]) -> Result<Vec<u8>, WcStatus> {
        let total: usize = sges.iter().map(|s| s.len as usize).sum();
        let mut out = vec![0; total];
        let mut at = 0;
        for sge in sges.iter().filter(|s| s.len > 0) {
            let region = self
                .get(host, tag, sge.mr)
                .filter(|r| r.device_epoch == epoch)
                .ok_or(WcStatus::LocQpOpErr)?;
            if !sge.fits(region.len) {
                return Err(WcStatus::LocProtErr);
            }
            let end = at + sge.len as usize;
            region.read(sge.offset, &mut out[at..end]);
            at = end;
        }
        Ok(out)
    }

    /// Scatters a READ's or atomic's answer into `sges` when it arrives (`do_read`,
    /// `do_atomic`): any entry that cannot take its part (region gone, past its end, no local
    /// write) fails the request with `LOC_PROT_ERR`, and nothing is written.
    pub(super) fn scatter(
        &mut self,
        host: u16,
        tag: u32,
        epoch: u32,
        sges: &[Sge],
        data: &[u8],
    ) -> Result<(), WcStatus> {
        for sge in sges.iter().filter(|s| s.len > 0) {
            let ok = self.get(host, tag, sge.mr).is_some_and(|r| {
                r.device_epoch == epoch && sge.fits(r.len) && r.access.contains(Access::LOCAL_WRITE)
            });
            if !ok {
                return Err(WcStatus::LocProtErr);
            }
        }
        let mut rest = data;
        for sge in sges.iter().filter(|s| s.len > 0) {
            if rest.is_empty() {
                break;
            }
            let n = rest.len().min(sge.len as usize);
            let r = SlotRef {
                index: sge.mr.index(),
                generation: sge.mr.generation(),
            };
            let region = self.hosts[host as usize].slab.get_mut(r).expect("checked");
            region.write(sge.offset, &rest[..n]);
            rest = &rest[n..];
        }
        Ok(())
    }

    /// The region remote key `rkey` names on `host`'s device now (`lookup_mr`): the index and
    /// generation must match a registered region whose remote key it is.
    pub(super) fn keyed(&self, host: u16, epoch: u32, rkey: u32) -> Option<(SlotRef, KeyedRegion)> {
        let index = (rkey >> 8).checked_sub(1)?;
        let slab = &self.hosts[host as usize].slab;
        let generation = slab.generation(index)?;
        if generation & 0xff != rkey & 0xff {
            return None;
        }
        let r = SlotRef { index, generation };
        let region = slab.get(r)?;
        if region.rkey() != rkey || region.device_epoch != epoch {
            return None;
        }
        Some((
            r,
            KeyedRegion {
                addr: region.addr,
                len: region.len,
                access: region.access,
            },
        ))
    }

    pub(super) fn region_mut(&mut self, host: u16, r: SlotRef) -> Option<&mut Region> {
        self.hosts[host as usize].slab.get_mut(r)
    }

    /// The host crashed: its regions go (their handles stay unknown after a restart: each slot's
    /// generation moves on). Addresses go on from where they were.
    fn crash(&mut self, host: u16) {
        let slab = &mut self.hosts[host as usize].slab;
        for r in slab.refs() {
            slab.discard(r);
        }
    }
}

impl Fabric {
    fn regions_mut(&mut self) -> &mut Regions {
        let hosts = self.hosts.len();
        self.regions.get_or_insert_with(|| Box::new(Regions::new(hosts)))
    }

    /// The regions' view for a post on `host`: the regions, its tag and its device now.
    pub(super) fn region_view(&self, host: u16) -> (Option<&Regions>, u32, u32) {
        let h = &self.hosts[host as usize];
        (self.regions.as_deref(), h.tag, h.device_epoch)
    }

    pub(crate) fn reg_mr(&mut self, host: u16, id: IdHandle, len: usize, access: Access) -> R<MrHandle> {
        // Checked before the bytes are made: a refused length allocates nothing.
        self.check_reg(host, id, len as u64, access)?;
        self.register(host, Box::new(Owned(vec![0; len])), access)
    }

    pub(crate) fn reg_mr_with(
        &mut self,
        host: u16,
        id: IdHandle,
        memory: Box<dyn RegionMemory>,
        access: Access,
    ) -> R<MrHandle> {
        self.check_reg(host, id, memory.len(), access)?;
        self.register(host, memory, access)
    }

    /// [`reg_mr_with`](Self::reg_mr_with) on the protection domain of the host's device itself
    /// (a PD of `ibv_alloc_pd`, which no id names), for verbs QPs' work requests.
    pub(crate) fn device_reg_mr_with(
        &mut self,
        host: u16,
        memory: Box<dyn RegionMemory>,
        access: Access,
    ) -> R<MrHandle> {
        let call = Call::RegMr;
        self.host_up(host, call)?;
        if !self.hosts[host as usize].device {
            return Err(CmError::NoDevice { call });
        }
        access.check()?;
        let len = memory.len();
        if len == 0 || len > self.cfg.max_mr_size {
            return Err(CmError::InvalidArgument {
                call,
                reason: "region length 0 or above the device's max_mr_size",
            });
        }
        self.register(host, memory, access)
    }

    /// `ibv_reg_mr`'s checks: the id bound to a device, flags verbs accepts, a length of 1 up
    /// to the device's largest region.
    fn check_reg(&self, host: u16, id: IdHandle, len: u64, access: Access) -> R<()> {
        let call = Call::RegMr;
        let r = self.id_ref(host, id, call)?;
        self.ids.get(r).expect("checked").m.reg_mr()?;
        access.check()?;
        if len == 0 || len > self.cfg.max_mr_size {
            return Err(CmError::InvalidArgument {
                call,
                reason: "region length 0 or above the device's max_mr_size",
            });
        }
        Ok(())
    }

    fn register(&mut self, host: u16, memory: Box<dyn RegionMemory>, access: Access) -> R<MrHandle> {
        let (tag, epoch) = (self.tag(host), self.hosts[host as usize].device_epoch);
        let len = memory.len();
        let h = &mut self.regions_mut().hosts[host as usize];
        if h.slab.len() >= MAX_REGIONS {
            return Err(CmError::Os {
                call: Call::RegMr,
                errno: errno::ENOMEM,
            });
        }
        let addr = h.next_addr;
        h.next_addr = addr.saturating_add(len.div_ceil(PAGE) * PAGE);
        let r = h.slab.insert(Region {
            memory,
            addr,
            len,
            key: 0,
            access,
            device_epoch: epoch,
        });
        h.slab.get_mut(r).expect("just stored").key = key_of(r);
        self.hosts[host as usize].counts.mrs += 1;
        Ok(cm_core::backend::mr_handle(tag, r.index, r.generation))
    }

    /// The region `mr` names on `host`, for `call`.
    fn mr_ref(&self, host: u16, mr: MrHandle, call: Call) -> R<SlotRef> {
        let tag = self.up_host_tag(host, call)?;
        let unknown = CmError::UnknownHandle {
            call,
            kind: HandleKind::Mr,
        };
        match self.regions.as_deref().and_then(|m| m.get(host, tag, mr)) {
            Some(_) => Ok(SlotRef {
                index: mr.index(),
                generation: mr.generation(),
            }),
            None => Err(unknown),
        }
    }

    fn region(&self, host: u16, r: SlotRef) -> &Region {
        self.regions.as_deref().expect("checked").hosts[host as usize]
            .slab
            .get(r)
            .expect("checked")
    }

    pub(crate) fn mr_info(&self, host: u16, mr: MrHandle) -> R<MrInfo> {
        let r = self.mr_ref(host, mr, Call::RegMr)?;
        let region = self.region(host, r);
        Ok(MrInfo {
            addr: region.addr,
            len: region.len,
            lkey: region.key,
            rkey: region.rkey(),
            access: region.access,
        })
    }

    /// `ibv_dereg_mr`: always succeeds (no memory windows bind to it, the only refusal rxe
    /// has). Work that still names the region fails when it reaches it: locally
    /// (`gather`/`scatter`), or at a peer through its key ([`Regions::keyed`]).
    pub(crate) fn dereg_mr(&mut self, host: u16, mr: MrHandle) -> R<()> {
        let r = self.mr_ref(host, mr, Call::DeregMr)?;
        self.regions_mut().hosts[host as usize].slab.discard(r);
        self.hosts[host as usize].counts.mrs -= 1;
        Ok(())
    }

    pub(crate) fn read_mr(&self, host: u16, mr: MrHandle, offset: u64, out: &mut [u8]) -> R<()> {
        let call = Call::ReadMr;
        let r = self.mr_ref(host, mr, call)?;
        let region = self.region(host, r);
        check_range(call, offset, out.len(), region.len)?;
        region.read(offset, out);
        Ok(())
    }

    pub(crate) fn write_mr(&mut self, host: u16, mr: MrHandle, offset: u64, data: &[u8]) -> R<()> {
        let call = Call::WriteMr;
        let r = self.mr_ref(host, mr, call)?;
        let len = self.region(host, r).len;
        check_range(call, offset, data.len(), len)?;
        self.regions_mut()
            .region_mut(host, r)
            .expect("checked")
            .write(offset, data);
        Ok(())
    }

    /// The host crashed: its regions go with it.
    pub(super) fn crash_regions(&mut self, host: u16) {
        if let Some(m) = self.regions.as_mut() {
            m.crash(host);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_put_the_index_from_one_above_eight_bits_of_generation() {
        let at = |index, generation| SlotRef { index, generation };
        assert_eq!(key_of(at(0, 0)), 0x100, "never 0");
        assert_eq!(key_of(at(0, 1)), 0x101);
        assert_eq!(key_of(at(2, 0x1ff)), 0x3ff, "the generation's low byte");
        assert_eq!(key_of(at(MAX_REGIONS as u32 - 1, 7)) >> 8, MAX_REGIONS as u32);
    }

    #[test]
    fn owned_bytes_read_back_what_was_written() {
        let mut m = Owned(vec![0; 8]);
        assert_eq!((m.len(), m.is_empty()), (8, false));
        m.write(2, b"abc");
        let mut out = [9; 5];
        m.read(1, &mut out);
        assert_eq!(out, [0, b'a', b'b', b'c', 0]);
        assert!(Owned(Vec::new()).is_empty());
    }
}
