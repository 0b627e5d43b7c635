//! Port bindings per host and port space, with the kernel's conflict rules.
//!
//! A bind conflicts with an existing one on the same host, port space and port when either is
//! a wildcard (`EADDRNOTAVAIL`) or both name the same address (`EADDRINUSE`), unless both set
//! `REUSEADDR`, or both are AF-only and of different families (the kernel's `cma_check_port`).
//! Ephemeral ports
//! come from a per-host cursor walking the configured range, so a free port is usually found at
//! the first try and the choice is deterministic.

use std::collections::hash_map::Entry;
use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::IpAddr;
use std::ops::RangeInclusive;

use cm_core::PortSpace;

use crate::slab::SlotRef;

/// A small multiply-rotate hasher: the keys are trusted (our own), and SipHash would dominate
/// the cost of a bind.
#[derive(Default)]
pub(crate) struct FxHasher(u64);

impl Hasher for FxHasher {
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.write_u64(u64::from(b));
        }
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_u64(&mut self, n: u64) {
        self.0 = (self.0.rotate_left(5) ^ n).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }

    fn finish(&self) -> u64 {
        self.0
    }
}

pub(crate) type FxBuild = BuildHasherDefault<FxHasher>;

#[derive(Clone, Copy, PartialEq, Eq, Hash)]
struct PortKey {
    host: u16,
    ps: PortSpace,
    port: u16,
}

#[derive(Clone, Copy)]
struct Binding {
    ip: Option<IpAddr>,
    id: SlotRef,
    listening: bool,
    opts: BindOpts,
}

/// What a binding's id set with `rdma_set_option` that the conflict rules read.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct BindOpts {
    /// The address's family (the wildcard's too).
    pub(crate) v6: bool,
    /// `REUSEADDR`.
    pub(crate) reuse: bool,
    /// `AFONLY`, or the kernel's default for the family (IPv4 yes, IPv6 no).
    pub(crate) afonly: bool,
}

impl BindOpts {
    /// The kernel's defaults for an id that set no option: no reuse, AF-only for IPv4 only.
    pub(crate) const fn default_for(v6: bool) -> Self {
        BindOpts {
            v6,
            reuse: false,
            afonly: !v6,
        }
    }
}

/// The bindings of one port. Nearly always there is one, kept inline: a `Vec` would cost an
/// allocation per bind.
#[derive(Default)]
struct Bindings {
    first: Option<Binding>,
    rest: Vec<Binding>,
}

impl Bindings {
    fn iter(&self) -> impl Iterator<Item = &Binding> {
        self.first.iter().chain(&self.rest)
    }

    fn iter_mut(&mut self) -> impl Iterator<Item = &mut Binding> {
        self.first.iter_mut().chain(&mut self.rest)
    }

    fn push(&mut self, b: Binding) {
        match self.first {
            None => self.first = Some(b),
            Some(_) => self.rest.push(b),
        }
    }

    /// Removes `id`'s binding, keeping the others in order.
    fn remove(&mut self, id: SlotRef) {
        if self.first.is_some_and(|b| b.id == id) {
            self.first = (!self.rest.is_empty()).then(|| self.rest.remove(0));
        } else {
            self.rest.retain(|b| b.id != id);
        }
    }

    fn is_empty(&self) -> bool {
        self.first.is_none()
    }
}

/// Why a bind failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum BindError {
    InUse,
    NotAvailable,
}

pub(crate) struct Ports {
    map: HashMap<PortKey, Bindings, FxBuild>,
    cursors: Vec<u16>,
    range: RangeInclusive<u16>,
}

impl Ports {
    pub(crate) fn new(hosts: usize, range: RangeInclusive<u16>) -> Self {
        Ports {
            map: HashMap::default(),
            cursors: vec![*range.start(); hosts],
            range,
        }
    }

    /// The kernel's `cma_check_port` for `id` at `ip` with `opts` against the other bindings.
    fn conflict(bindings: &Bindings, ip: Option<IpAddr>, opts: BindOpts, id: SlotRef) -> Option<BindError> {
        bindings
            .iter()
            .filter(|b| b.id != id)
            .filter(|b| !(opts.reuse && b.opts.reuse))
            .filter(|b| !(opts.afonly && b.opts.afonly && opts.v6 != b.opts.v6))
            .find_map(|b| match (b.ip, ip) {
                (None, _) | (_, None) => Some(BindError::NotAvailable),
                (Some(a), Some(c)) if a == c => Some(BindError::InUse),
                _ => None,
            })
    }

    /// Binds `id` to `ip` (None = wildcard) and `port` (0 = pick one) with the kernel's
    /// defaults for the family; returns the port.
    #[cfg(test)]
    pub(crate) fn bind(
        &mut self,
        host: u16,
        ps: PortSpace,
        ip: Option<IpAddr>,
        port: u16,
        id: SlotRef,
    ) -> Result<u16, BindError> {
        let v6 = ip.is_some_and(|ip| ip.is_ipv6());
        self.bind_with(host, ps, ip, port, id, BindOpts::default_for(v6))
    }

    /// Binds `id` to `ip` (None = the wildcard of `opts`' family) and `port` (0 = pick one);
    /// returns the port.
    pub(crate) fn bind_with(
        &mut self,
        host: u16,
        ps: PortSpace,
        ip: Option<IpAddr>,
        port: u16,
        id: SlotRef,
        opts: BindOpts,
    ) -> Result<u16, BindError> {
        let port = if port == 0 {
            self.pick(host, ps, ip, opts, id)?
        } else {
            port
        };
        let key = PortKey { host, ps, port };
        let bindings = self.map.entry(key).or_default();
        if let Some(err) = Self::conflict(bindings, ip, opts, id) {
            return Err(err);
        }
        bindings.push(Binding {
            ip,
            id,
            listening: false,
            opts,
        });
        Ok(port)
    }

    /// `rdma_listen` on an id bound with `REUSEADDR`: a listener needs its address and port to
    /// itself, so it must not conflict with any other binding even where both reuse; from then
    /// on it no longer reuses (the kernel clears its `reuseaddr`).
    pub(crate) fn claim_for_listen(
        &mut self,
        host: u16,
        ps: PortSpace,
        port: u16,
        id: SlotRef,
    ) -> Result<(), BindError> {
        let Some(bindings) = self.map.get_mut(&PortKey { host, ps, port }) else {
            return Ok(());
        };
        let Some(me) = bindings.iter().find(|b| b.id == id).copied() else {
            return Ok(());
        };
        if !me.opts.reuse {
            return Ok(());
        }
        let strict = BindOpts {
            reuse: false,
            ..me.opts
        };
        if let Some(err) = Self::conflict(bindings, me.ip, strict, id) {
            return Err(err);
        }
        if let Some(b) = bindings.iter_mut().find(|b| b.id == id) {
            b.opts.reuse = false;
        }
        Ok(())
    }

    /// `REUSEADDR` or `AFONLY` changed on a bound id: later binds read the new value.
    pub(crate) fn set_opts(&mut self, host: u16, ps: PortSpace, port: u16, id: SlotRef, opts: BindOpts) {
        if let Some(b) = self
            .map
            .get_mut(&PortKey { host, ps, port })
            .and_then(|v| v.iter_mut().find(|b| b.id == id))
        {
            b.opts = opts;
        }
    }

    fn pick(
        &mut self,
        host: u16,
        ps: PortSpace,
        ip: Option<IpAddr>,
        opts: BindOpts,
        id: SlotRef,
    ) -> Result<u16, BindError> {
        let (lo, hi) = (*self.range.start(), *self.range.end());
        let span = u32::from(hi - lo) + 1;
        let cursor = &mut self.cursors[host as usize];
        for _ in 0..span {
            let port = *cursor;
            *cursor = if port == hi { lo } else { port + 1 };
            let key = PortKey { host, ps, port };
            match self.map.get(&key) {
                Some(b) if Self::conflict(b, ip, opts, id).is_some() => continue,
                _ => return Ok(port),
            }
        }
        Err(BindError::NotAvailable)
    }

    pub(crate) fn unbind(&mut self, host: u16, ps: PortSpace, port: u16, id: SlotRef) {
        // One hash and one probe for the lookup and the removal, where `get_mut` and then
        // `remove` made two of each (a bound id's destroy, one a connection).
        if let Entry::Occupied(mut bindings) = self.map.entry(PortKey { host, ps, port }) {
            bindings.get_mut().remove(id);
            if bindings.get().is_empty() {
                bindings.remove();
            }
        }
    }

    /// Starts (or, `listening` false, stops) `id` taking requests on its port.
    pub(crate) fn set_listening(
        &mut self,
        host: u16,
        ps: PortSpace,
        port: u16,
        id: SlotRef,
        listening: bool,
    ) {
        if let Some(b) = self
            .map
            .get_mut(&PortKey { host, ps, port })
            .and_then(|v| v.iter_mut().find(|b| b.id == id))
        {
            b.listening = listening;
        }
    }

    /// The listener a request for `ip:port` reaches: one bound to that address, else a wildcard
    /// one of the same family or one that is not AF-only (`cma_match_private_data`).
    pub(crate) fn listener(&self, host: u16, ps: PortSpace, ip: IpAddr, port: u16) -> Option<SlotRef> {
        let bindings = self.map.get(&PortKey { host, ps, port })?;
        let listening = || bindings.iter().filter(|b| b.listening);
        listening()
            .find(|b| b.ip == Some(ip))
            .or_else(|| listening().find(|b| b.ip.is_none() && (!b.opts.afonly || b.opts.v6 == ip.is_ipv6())))
            .map(|b| b.id)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(n: u32) -> SlotRef {
        SlotRef {
            index: n,
            generation: 0,
        }
    }

    #[test]
    fn kernel_conflict_rules() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40002);
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 7471, id(1)), Ok(7471));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 7471, id(2)),
            Err(BindError::InUse)
        );
        assert_eq!(
            p.bind(0, PortSpace::Tcp, None, 7471, id(2)),
            Err(BindError::NotAvailable)
        );
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(b), 7471, id(2)), Ok(7471));
        assert_eq!(
            p.bind(0, PortSpace::Udp, None, 7471, id(3)),
            Ok(7471),
            "port spaces are separate"
        );
        p.unbind(0, PortSpace::Tcp, 7471, id(1));
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 7471, id(4)), Ok(7471));
    }

    #[test]
    fn reuse_and_afonly_follow_the_kernels_cma_check_port() {
        use BindError::{InUse, NotAvailable};
        use PortSpace::Tcp;
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        let reuse = BindOpts {
            reuse: true,
            ..BindOpts::default_for(false)
        };
        assert_eq!(p.bind_with(0, Tcp, Some(a), 7, id(1), reuse), Ok(7));
        assert_eq!(p.bind_with(0, Tcp, Some(a), 7, id(2), reuse), Ok(7));
        assert_eq!(
            p.bind(0, Tcp, Some(a), 7, id(3)),
            Err(InUse),
            "only where both reuse"
        );
        assert_eq!(p.claim_for_listen(0, Tcp, 7, id(1)), Err(InUse));
        p.unbind(0, Tcp, 7, id(2));
        assert_eq!(p.claim_for_listen(0, Tcp, 7, id(1)), Ok(()));
        assert_eq!(
            p.bind_with(0, Tcp, Some(a), 7, id(4), reuse),
            Err(InUse),
            "a listener reuses no more"
        );
        let v6_afonly = BindOpts {
            afonly: true,
            ..BindOpts::default_for(true)
        };
        assert_eq!(p.bind_with(0, Tcp, None, 8, id(5), v6_afonly), Ok(8));
        assert_eq!(
            p.bind(0, Tcp, None, 8, id(6)),
            Ok(8),
            "both AF-only, families differ"
        );
        assert_eq!(
            p.bind_with(0, Tcp, None, 9, id(7), BindOpts::default_for(true)),
            Ok(9)
        );
        assert_eq!(
            p.bind(0, Tcp, None, 9, id(8)),
            Err(NotAvailable),
            "IPv6 is not AF-only by default"
        );
        p.set_listening(0, Tcp, 8, id(5), true);
        assert_eq!(
            p.listener(0, Tcp, a, 8),
            None,
            "an AF-only IPv6 wildcard takes no IPv4"
        );
        p.set_listening(0, Tcp, 9, id(7), true);
        assert_eq!(p.listener(0, Tcp, a, 9), Some(id(7)));
    }

    #[test]
    fn ephemeral_ports_run_out() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(1)), Ok(40000));
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(2)), Ok(40001));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 0, id(3)),
            Err(BindError::NotAvailable)
        );
        p.unbind(0, PortSpace::Tcp, 40000, id(1));
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(3)), Ok(40000));
    }

    #[test]
    fn listener_lookup_prefers_the_specific_address() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        p.bind(0, PortSpace::Tcp, Some(a), 1, id(1)).unwrap();
        assert_eq!(
            p.listener(0, PortSpace::Tcp, a, 1),
            None,
            "bound but not listening"
        );
        p.set_listening(0, PortSpace::Tcp, 1, id(1), true);
        assert_eq!(p.listener(0, PortSpace::Tcp, a, 1), Some(id(1)));
        assert_eq!(p.listener(0, PortSpace::Tcp, b, 1), None);
        p.bind(0, PortSpace::Tcp, None, 2, id(2)).unwrap();
        p.set_listening(0, PortSpace::Tcp, 2, id(2), true);
        assert_eq!(p.listener(0, PortSpace::Tcp, b, 2), Some(id(2)));
    }

    #[test]
    fn unbinding_one_of_two_bindings_keeps_the_other() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let c: IpAddr = "10.0.0.3".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        for (first, second) in [(id(1), id(2)), (id(2), id(1))] {
            let mut p2 = Ports::new(1, 40000..=40001);
            p2.bind(0, PortSpace::Tcp, Some(a), 7, id(1)).unwrap();
            p2.bind(0, PortSpace::Tcp, Some(b), 7, id(2)).unwrap();
            p2.set_listening(0, PortSpace::Tcp, 7, id(1), true);
            p2.set_listening(0, PortSpace::Tcp, 7, id(2), true);
            p2.unbind(0, PortSpace::Tcp, 7, first);
            let (gone, kept) = if first == id(1) { (a, b) } else { (b, a) };
            assert_eq!(p2.listener(0, PortSpace::Tcp, kept, 7), Some(second));
            assert_eq!(p2.listener(0, PortSpace::Tcp, gone, 7), None);
            assert_eq!(
                p2.bind(0, PortSpace::Tcp, Some(kept), 7, id(3)),
                Err(BindError::InUse),
                "the remaining binding still holds its address"
            );
            assert_eq!(p2.bind(0, PortSpace::Tcp, Some(gone), 7, id(3)), Ok(7));
        }
        // Three bindings: removing the first moves the next one up, the last stays behind it.
        p.bind(0, PortSpace::Tcp, Some(a), 7, id(1)).unwrap();
        p.bind(0, PortSpace::Tcp, Some(b), 7, id(2)).unwrap();
        p.bind(0, PortSpace::Tcp, Some(c), 7, id(3)).unwrap();
        p.unbind(0, PortSpace::Tcp, 7, id(1));
        p.unbind(0, PortSpace::Tcp, 7, id(2));
        p.set_listening(0, PortSpace::Tcp, 7, id(3), true);
        assert_eq!(p.listener(0, PortSpace::Tcp, c, 7), Some(id(3)));
        p.unbind(0, PortSpace::Tcp, 7, id(3));
        assert!(p.map.is_empty(), "a port without bindings is forgotten");
        assert_eq!(
            p.bind(0, PortSpace::Tcp, None, 7, id(4)),
            Ok(7),
            "free for a wildcard again"
        );
        p.unbind(0, PortSpace::Tcp, 8, id(4));
        p.unbind(0, PortSpace::Udp, 7, id(4));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 7, id(5)),
            Err(BindError::NotAvailable),
            "unbinding elsewhere left the wildcard in place"
        );
    }

    #[test]
    fn ephemeral_port_search_wraps_around_the_range_and_skips_taken_ports() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = Ports::new(2, 40000..=40002);
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 40001, id(1)), Ok(40001));
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(2)), Ok(40000));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 0, id(3)),
            Ok(40002),
            "40001 is taken"
        );
        p.unbind(0, PortSpace::Tcp, 40000, id(2));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 0, id(4)),
            Ok(40000),
            "the cursor wrapped past the range's end"
        );
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 0, id(5)),
            Err(BindError::NotAvailable)
        );
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(b), 0, id(6)),
            Ok(40001),
            "a full search leaves the cursor where it began; another address may share a port"
        );
        assert_eq!(
            p.bind(1, PortSpace::Tcp, Some(a), 0, id(7)),
            Ok(40000),
            "cursors are per host"
        );
        assert_eq!(
            p.bind(0, PortSpace::Tcp, None, 0, id(8)),
            Err(BindError::NotAvailable)
        );
        assert_eq!(
            p.bind(0, PortSpace::Udp, None, 0, id(8)),
            Ok(40002),
            "port spaces are separate; the cursor is the host's"
        );
    }

    #[test]
    fn a_single_port_range_and_one_at_the_top_of_the_port_space_work() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut p = Ports::new(1, 65535..=65535);
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(1)), Ok(65535));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 0, id(2)),
            Err(BindError::NotAvailable)
        );
        p.unbind(0, PortSpace::Tcp, 65535, id(1));
        assert_eq!(p.bind(0, PortSpace::Tcp, Some(a), 0, id(2)), Ok(65535));
    }

    #[test]
    fn a_wildcard_binding_conflicts_with_every_address() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        assert_eq!(p.bind(0, PortSpace::Tcp, None, 9, id(1)), Ok(9));
        assert_eq!(
            p.bind(0, PortSpace::Tcp, Some(a), 9, id(2)),
            Err(BindError::NotAvailable)
        );
        assert_eq!(
            p.bind(0, PortSpace::Tcp, None, 9, id(2)),
            Err(BindError::NotAvailable)
        );
    }

    #[test]
    fn listening_can_be_stopped_and_other_ids_are_not_touched() {
        let a: IpAddr = "10.0.0.1".parse().unwrap();
        let b: IpAddr = "10.0.0.2".parse().unwrap();
        let mut p = Ports::new(1, 40000..=40001);
        p.bind(0, PortSpace::Tcp, Some(a), 5, id(1)).unwrap();
        p.bind(0, PortSpace::Tcp, Some(b), 5, id(2)).unwrap();
        p.set_listening(0, PortSpace::Tcp, 5, id(2), true);
        assert_eq!(p.listener(0, PortSpace::Tcp, a, 5), None, "only id 2 listens");
        assert_eq!(p.listener(0, PortSpace::Tcp, b, 5), Some(id(2)));
        p.set_listening(0, PortSpace::Tcp, 5, id(2), false);
        assert_eq!(p.listener(0, PortSpace::Tcp, b, 5), None);
        p.set_listening(0, PortSpace::Tcp, 6, id(1), true);
        assert_eq!(p.listener(0, PortSpace::Tcp, a, 5), None, "another port named");
    }

    fn hash_of(write: impl FnOnce(&mut FxHasher)) -> u64 {
        let mut h = FxHasher::default();
        write(&mut h);
        h.finish()
    }

    /// A hasher that mapped keys together would put every binding in one bucket and make binds
    /// scan them all: each input, at each width, must change the hash.
    #[test]
    fn the_port_hasher_tells_every_input_apart() {
        let all = [
            hash_of(|h| h.write(&[1])),
            hash_of(|h| h.write(&[2])),
            hash_of(|h| h.write(&[1, 1])),
            hash_of(|h| h.write_u8(3)),
            hash_of(|h| h.write_u16(4)),
            hash_of(|h| h.write_u32(5)),
            hash_of(|h| h.write_u64(6)),
            hash_of(|h| h.write_usize(7)),
            hash_of(|_| ()),
        ];
        let mut distinct = all.to_vec();
        distinct.sort_unstable();
        distinct.dedup();
        assert_eq!(distinct.len(), all.len(), "{all:x?}");
        // After a prefix, each bit of the next word still matters (a bitwise or would drop
        // the bits the prefix had set).
        let mut after_prefix: Vec<u64> = (0..64)
            .map(|bit| {
                hash_of(|h| {
                    h.write_u64(u64::MAX);
                    h.write_u64(1 << bit);
                })
            })
            .collect();
        after_prefix.sort_unstable();
        after_prefix.dedup();
        assert_eq!(after_prefix.len(), 64);
    }
}
