//! `rdma_set_option` and `rdma_migrate_id`, and what the options change: the port table's
//! bind rules (`REUSEADDR`, `AFONLY`) and the IB CM and transport timeouts of one id
//! (`ACK_TIMEOUT`).
//!
//! Options are rare: they live in a side table keyed by id, allocated when an id sets one, so
//! that an id that never does costs nothing (the RC path's `IdSlot` does not grow), and the
//! timing paths look the table up only when it is not empty.

use std::collections::HashMap;

use cm_core::IdOption;

use super::*;
use crate::ports::{BindOpts, FxBuild};

/// What one id set with `rdma_set_option`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(super) struct IdOptions {
    tos: Option<u8>,
    reuse: bool,
    afonly: Option<bool>,
    ack_timeout: Option<u8>,
    /// The connection's packet lifetime when it is not the default: `ACK_TIMEOUT` - 1 when the
    /// active id set it before route resolution (the kernel's `cma_resolve_iboe_route`), and the
    /// same for the child its REQ made. The IB CM's waits follow from it.
    packet_lifetime: Option<u8>,
}

impl IdOptions {
    /// Sets the transport's local ACK timeout exponent (a verbs QP's `timeout` attribute).
    pub(super) fn set_ack_timeout(&mut self, t: u8) {
        self.ack_timeout = Some(t);
    }
}

pub(super) type OptionTable = HashMap<SlotRef, IdOptions, FxBuild>;

impl Fabric {
    pub(crate) fn set_option(&mut self, host: u16, id: IdHandle, option: IdOption) -> R<()> {
        let r = self.id_ref(host, id, Call::SetOption)?;
        self.slot(r).m.set_option(option)?;
        let mut opts = self.id_options.get(&r).copied().unwrap_or_default();
        match option {
            IdOption::Tos(tos) => opts.tos = Some(tos),
            IdOption::ReuseAddr(reuse) => opts.reuse = reuse,
            IdOption::AfOnly(afonly) => opts.afonly = Some(afonly),
            IdOption::AckTimeout(t) => opts.ack_timeout = Some(t),
            // `IdOption` is non-exhaustive; an option this simulator does not know yet is what
            // the kernel answers with ENOSYS.
            _ => {
                return Err(CmError::Os {
                    call: Call::SetOption,
                    errno: errno::ENOSYS,
                })
            }
        }
        self.id_options.insert(r, opts);
        let slot = self.slot(r);
        if let Some(local) = slot.local.get().filter(|_| slot.port_bound) {
            let ps = slot.m.port_space();
            let bind = Self::bind_opts_of(Some(&opts), local.is_ipv6());
            self.ports.set_opts(host, ps, local.port(), r, bind);
        }
        Ok(())
    }

    pub(crate) fn migrate_id(&mut self, host: u16, id: IdHandle, ch: ChannelHandle) -> R<()> {
        let call = Call::MigrateId;
        let r = self.id_ref(host, id, call)?;
        let to = self.channel_ref(host, ch, call)?;
        self.slot(r).m.migrate()?;
        let from = self.slot(r).channel;
        if from == to {
            return Ok(());
        }
        // The id's unretrieved events, and a listener's unretrieved requests (queued under
        // their children), move to the tail of the new channel in their order, as the kernel's
        // `ucma_move_events` does.
        let old = std::mem::take(
            &mut self
                .channels
                .get_mut(from)
                .expect("an id's channel outlives it")
                .queue,
        );
        let (moved, kept): (Fifo<Queued>, Fifo<Queued>) =
            old.into_iter().partition(|q| q.id == r || q.listen == r);
        self.channels.get_mut(from).expect("checked").queue = kept;
        // The children of requests not retrieved yet sit on the listener's channel too.
        let mut movers = vec![r];
        if let Some(l) = &self.slot(r).listener {
            movers.extend(l.pending.iter().copied());
        }
        for &m in &movers {
            self.slot(m).channel = to;
        }
        let n = movers.len() as u32;
        self.channels.get_mut(from).expect("checked").ids -= n;
        let dest = self.channels.get_mut(to).expect("checked");
        dest.ids += n;
        dest.queue.extend(moved);
        Ok(())
    }

    /// The `TOS` the id set, if it did.
    pub(crate) fn tos(&self, host: u16, id: IdHandle) -> R<Option<u8>> {
        let r = self.id_ref(host, id, Call::SetOption)?;
        Ok(self.id_options.get(&r).and_then(|o| o.tos))
    }

    /// The options the port table reads for an id with `opts` binding an address of the
    /// family `v6`.
    fn bind_opts_of(opts: Option<&IdOptions>, v6: bool) -> BindOpts {
        let default = BindOpts::default_for(v6);
        match opts {
            None => default,
            Some(o) => BindOpts {
                v6,
                reuse: o.reuse,
                afonly: o.afonly.unwrap_or(default.afonly),
            },
        }
    }

    /// What `r` binds with.
    pub(super) fn bind_opts(&self, r: SlotRef, v6: bool) -> BindOpts {
        if self.id_options.is_empty() {
            return BindOpts::default_for(v6);
        }
        Self::bind_opts_of(self.id_options.get(&r), v6)
    }

    /// The id listens: it no longer reuses its address (the kernel clears `reuseaddr` then, so
    /// that the listener stays unique), whatever it sets later.
    pub(super) fn on_listen(&mut self, r: SlotRef) {
        if let Some(o) = self.id_options.get_mut(&r) {
            o.reuse = false;
        }
    }

    /// Route resolution: an `ACK_TIMEOUT` set by now becomes the path's packet lifetime (one
    /// less; `cma_resolve_iboe_route`, which keeps the default for 0).
    pub(super) fn on_route_resolution(&mut self, r: SlotRef) {
        // Most runs set no option: no hashing of the id for an empty table.
        if self.id_options.is_empty() {
            return;
        }
        if let Some(o) = self.id_options.get_mut(&r) {
            o.packet_lifetime = o.ack_timeout.filter(|&t| t > 0).map(|t| t - 1);
        }
    }

    /// A child made by `active`'s REQ follows the REQ's path: `active`'s lifetime when
    /// `ACK_TIMEOUT` gave it its own (the kernel's passive side reads it from the REQ).
    pub(super) fn path_of_child(&mut self, active: SlotRef, child: SlotRef) {
        if self.id_options.is_empty() {
            return;
        }
        if let Some(lifetime) = self.id_options.get(&active).and_then(|o| o.packet_lifetime) {
            self.id_options.entry(child).or_default().packet_lifetime = Some(lifetime);
        }
    }

    /// What the IB CM of `r` waits once some id set an option: the default path's waits, or
    /// those of `r`'s own path. Kept out of line: inlined, the compiler hashed the id for the
    /// lookup ahead of the emptiness test, on every armed timer of runs that set no option.
    #[inline(never)]
    pub(super) fn waits_of(&self, r: SlotRef) -> Waits {
        match self.id_options.get(&r).and_then(|o| o.packet_lifetime) {
            Some(lifetime) => self.cfg.exponents().waits(lifetime),
            None => self.waits,
        }
    }

    /// The local ACK timeout of `r`'s QP: `ACK_TIMEOUT`'s when it set one.
    pub(super) fn ack_timeout_of(&self, r: SlotRef) -> Duration {
        if self.id_options.is_empty() {
            return self.cfg.ack_timeout;
        }
        match self.id_options.get(&r).and_then(|o| o.ack_timeout) {
            Some(t) => IdOption::ack_timeout(t),
            None => self.cfg.ack_timeout,
        }
    }

    /// The id went away: its options go with it.
    pub(super) fn forget_options(&mut self, r: SlotRef) {
        if !self.id_options.is_empty() {
            self.id_options.remove(&r);
        }
    }
}
