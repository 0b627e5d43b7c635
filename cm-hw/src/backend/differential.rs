//! Calls issued through librdmacm without the [`IdMachine`](cm_core::IdMachine) check, for the
//! lab's differential suite (`examples/differential.rs`), which compares what librdmacm does in
//! each state with what the machine decides. Internal: behind the `differential` feature and
//! hidden from the docs.
//!
//! Only the state check is bypassed. A call that would make librdmacm dereference NULL, block
//! forever or leave the backend holding freed memory is still not made: it comes back as
//! [`RawOutcome::NotIssued`] with the reason, which the suite lists.

use std::collections::hash_map::Entry;
use std::net::SocketAddr;

use cm_core::{Call, ChannelHandle, CmBackend, IdHandle, Invocation, QpCaps, QpState, WcOpcode};

use super::{HwBackend, QpEntry};
use crate::convert;
use crate::sys;
use cm_core::backend::WrPool;

/// What librdmacm (or verbs) answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum RawOutcome {
    /// The call returned 0.
    Ok,
    /// The call failed with this errno.
    Failed(i32),
    /// The call was not made: librdmacm would crash, hang or leak; the reason says which.
    NotIssued(&'static str),
}

impl HwBackend {
    /// Makes `call` through librdmacm without asking its id's machine first.
    ///
    /// The machine is moved on when the call succeeded and the machine allows the call, and left
    /// as it was otherwise, so that the events that follow are delivered (and counted) as usual.
    /// A handle this backend does not know is `NotIssued`, and so are the calls that have no
    /// state check to bypass (creating and destroying channels, creating ids, the address
    /// getters: make them through the trait).
    ///
    /// How a call is made where librdmacm and the trait part: `resolve_addr` as given;
    /// `connect` and `accept` never with a NULL parameter; `init_qp_attr`'s attributes are
    /// dropped (only the answer counts); `post_send_to` on a connected QP is the send
    /// `post_send` makes, since verbs ignore a work request's `wr.ud` there (`ibv_post_send(3)`),
    /// which is what `rdma_post_ud_send` would put on the connection; `join_multicast` has a NULL
    /// context, whatever the id's port space or state; `leave_multicast` is made for a group
    /// joined or not (librdmacm looks it up in the id's memberships before it asks the kernel).
    #[doc(hidden)]
    pub fn raw_call(&mut self, call: &Invocation) -> RawOutcome {
        use Invocation as I;
        let Some(&id) = call.id() else {
            return RawOutcome::NotIssued("no id: the call has no state check to bypass");
        };
        let Ok(index) = self.id_index(cm_core::Call::GetLocalAddr, id) else {
            return RawOutcome::NotIssued("unknown handle");
        };
        let e = self.ids.at_mut(index).expect("checked");
        let device = e.raw.verbs().is_some();
        let m = e.machine;
        let result = match call {
            I::CreateEventChannel | I::DestroyEventChannel { .. } | I::CreateId { .. } => {
                unreachable!("calls without an id returned above")
            }
            I::GetLocalAddr { .. } | I::GetPeerAddr { .. } => {
                return RawOutcome::NotIssued("no state check to bypass: make it through the trait")
            }
            I::BindAddr { addr, .. } => e.raw.bind_addr(addr).map(|()| m.bind_addr(!device)),
            I::ResolveAddr {
                src, dst, timeout, ..
            } => e
                .raw
                .resolve_addr(src.as_ref(), dst, convert::millis_ceil(*timeout))
                .map(|()| m.resolve_addr()),
            I::ResolveRoute { .. } if !device => {
                return RawOutcome::NotIssued("no device: rdma_resolve_route dereferences id->verbs")
            }
            I::ResolveRoute { timeout, .. } => e
                .raw
                .resolve_route(convert::millis_ceil(*timeout))
                .map(|()| m.resolve_route()),
            I::Listen { backlog, .. } => e.raw.listen(*backlog).map(|()| m.listen()),
            I::Connect { .. } if !device => {
                return RawOutcome::NotIssued(
                    "no device: rdma_connect's parameter check dereferences id->verbs",
                )
            }
            I::Connect { param, .. } => e.raw.connect(param).map(|()| m.connect(param.private_data.len())),
            I::Accept { .. } if !device => {
                return RawOutcome::NotIssued("no device: rdma_accept dereferences id->verbs")
            }
            I::Accept { param, .. } => e.raw.accept(param).map(|()| m.accept(param.private_data.len())),
            I::Reject { private_data, .. } => {
                e.raw.reject(private_data).map(|()| m.reject(private_data.len()))
            }
            I::Disconnect { .. } => e.raw.disconnect().map(|()| m.disconnect()),
            I::CreateQp { caps, .. } => return self.raw_create_qp(index, *caps),
            I::DestroyQp { .. } => return self.raw_destroy_qp(index),
            I::DestroyId { .. } => return self.raw_destroy_id(id, index),
            I::PostSend { wr_id, data, .. } => return self.raw_post(index, WcOpcode::Send, *wr_id, data, 0),
            I::PostRecv { wr_id, len, .. } => return self.raw_post(index, WcOpcode::Recv, *wr_id, &[], *len),
            I::InitQpAttr { qp_state, .. } => e
                .raw
                .init_qp_attr(*qp_state)
                .map(|_| m.init_qp_attr(*qp_state).map(|()| m)),
            // The sys wrapper's one check is librdmacm's own (EINVAL while id->qp is set).
            I::Establish { .. } => e.raw.establish().map(|()| m.establish()),
            I::PostSendTo {
                wr_id, dest, data, ..
            } => return self.raw_post_send_to(index, *wr_id, data, dest),
            I::SetOption { option, .. } => e
                .raw
                .set_option(*option)
                .map(|()| m.set_option(*option).map(|()| m)),
            I::MigrateId { channel, .. } => return self.raw_migrate(index, *channel),
            I::JoinMulticast { group, .. } => return self.raw_join(index, *group),
            I::LeaveMulticast { group, .. } => return self.raw_leave(index, *group),
        };
        match result {
            Ok(next) => {
                if let Ok(next) = next {
                    self.ids.at_mut(index).expect("checked").machine = next;
                }
                RawOutcome::Ok
            }
            Err(errno) => RawOutcome::Failed(errno),
        }
    }

    /// The state libibverbs holds for the id's QP; None without a QP.
    #[doc(hidden)]
    pub fn raw_qp_state(&self, id: IdHandle) -> Option<QpState> {
        let index = self.id_index(cm_core::Call::GetLocalAddr, id).ok()?;
        let e = self.ids.at(index)?;
        e.qp.as_ref().map(|q| q.raw.state())
    }

    fn raw_create_qp(&mut self, index: u32, caps: QpCaps) -> RawOutcome {
        let e = self.ids.at(index).expect("checked");
        let Some(context) = e.raw.verbs() else {
            return RawOutcome::NotIssued("no device: no protection domain to create the QP on");
        };
        if e.qp.is_some() || e.raw.has_qp() {
            // librdmacm would overwrite id->qp and leak the first QP, which the backend still
            // holds and would destroy through an id that no longer knows it.
            return RawOutcome::NotIssued("a QP exists: librdmacm overwrites id->qp and leaks the first");
        }
        let Ok(slots) = i32::try_from(caps.max_send_wr + caps.max_recv_wr) else {
            return RawOutcome::NotIssued("capabilities too large for one CQ");
        };
        let pd = match self.pds.entry(context) {
            Entry::Occupied(pd) => pd.into_mut(),
            Entry::Vacant(slot) => match sys::Pd::alloc(&e.raw) {
                Ok(pd) => {
                    self.inbox.join(context);
                    slot.insert(pd)
                }
                Err(errno) => return RawOutcome::Failed(errno),
            },
        };
        match sys::Qp::create(&e.raw, pd, &caps, slots as u32, slots, None) {
            Ok((raw, _granted)) => {
                self.inbox.own(raw.key());
                let e = self.ids.at_mut(index).expect("checked");
                e.qp = Some(QpEntry::new(
                    raw,
                    WrPool::new(caps.max_send_wr, caps.max_recv_wr),
                    caps,
                    None,
                ));
                if let Ok(next) = e.machine.create_qp() {
                    e.machine = next;
                }
                self.qps += 1;
                RawOutcome::Ok
            }
            Err(errno) => {
                self.release_pd(context, Some(index));
                RawOutcome::Failed(errno)
            }
        }
    }

    fn raw_destroy_qp(&mut self, index: u32) -> RawOutcome {
        let e = self.ids.at_mut(index).expect("checked");
        let Some(q) = e.qp.take() else {
            return RawOutcome::NotIssued("no QP: rdma_destroy_qp passes NULL to ibv_destroy_qp");
        };
        let context = q.raw.context();
        let key = q.raw.key();
        let outcome = match q.raw.destroy(&e.raw) {
            Ok(_pd) => RawOutcome::Ok,
            Err((Some(raw), errno)) => {
                e.qp = Some(QpEntry { raw, ..q });
                return RawOutcome::Failed(errno);
            }
            Err((None, errno)) => RawOutcome::Failed(errno),
        };
        self.inbox.disown(key);
        if let Ok(next) = e.machine.destroy_qp() {
            e.machine = next;
        }
        self.qps -= 1;
        self.release_pd(context, Some(index));
        outcome
    }

    fn raw_destroy_id(&mut self, id: IdHandle, index: u32) -> RawOutcome {
        let e = self.ids.at(index).expect("checked");
        if e.qp.is_some() || e.raw.has_qp() {
            return RawOutcome::NotIssued("a QP is attached: librdmacm leaks it");
        }
        if e.raw.holders() > 0 {
            return RawOutcome::NotIssued("unacked events: rdma_destroy_id blocks until they are acked");
        }
        // Every unacked event holds its id (checked above) and there is no QP: the machine has
        // nothing to refuse, so the guarded path makes exactly the librdmacm call.
        match self.destroy_id(id) {
            Ok(()) => RawOutcome::Ok,
            Err(err) => RawOutcome::Failed(err.errno()),
        }
    }

    fn raw_post(&mut self, index: u32, op: WcOpcode, wr_id: u64, data: &[u8], len: u32) -> RawOutcome {
        let e = self.ids.at_mut(index).expect("checked");
        let Some(q) = e.qp.as_mut() else {
            return RawOutcome::NotIssued("no QP: the verbs call would get a NULL QP");
        };
        if !e.machine.port_space().is_connected() && op == WcOpcode::Send {
            return RawOutcome::NotIssued("UD send without an address handle: providers dereference it");
        }
        let size = if op == WcOpcode::Send {
            data.len() as u32
        } else {
            len
        };
        let Some(slot) = q.pool.post(op, wr_id, size) else {
            return RawOutcome::NotIssued("queue full");
        };
        let result = if op == WcOpcode::Send {
            q.raw.post_send(slot, data)
        } else {
            q.raw.post_recv(slot, len)
        };
        match result {
            Ok(()) => RawOutcome::Ok,
            Err(errno) => {
                q.pool.unpost(slot);
                RawOutcome::Failed(errno)
            }
        }
    }

    fn raw_post_send_to(
        &mut self,
        index: u32,
        wr_id: u64,
        data: &[u8],
        dest: &cm_core::UdParam,
    ) -> RawOutcome {
        let e = self.ids.at_mut(index).expect("checked");
        if e.machine.port_space().is_connected() {
            return self.raw_post(index, WcOpcode::Send, wr_id, data, 0);
        }
        let Some(q) = e.qp.as_mut() else {
            return RawOutcome::NotIssued("no QP: the verbs call would get a NULL QP");
        };
        let Some(slot) = q.pool.post(WcOpcode::Send, wr_id, data.len() as u32) else {
            return RawOutcome::NotIssued("queue full");
        };
        match q.raw.post_send_to(slot, data, dest) {
            Ok(()) => RawOutcome::Ok,
            Err(errno) => {
                q.pool.unpost(slot);
                RawOutcome::Failed(errno)
            }
        }
    }

    fn raw_migrate(&mut self, index: u32, channel: ChannelHandle) -> RawOutcome {
        let Ok(to) = self.channel_index(Call::MigrateId, channel) else {
            return RawOutcome::NotIssued("unknown channel");
        };
        let e = self.ids.at(index).expect("checked");
        if e.raw.holders() > usize::from(e.raw.has_qp()) {
            return RawOutcome::NotIssued("unacked events: rdma_migrate_id blocks until they are acked");
        }
        let ch = &self.channels.at(to).expect("checked").raw;
        let e = self.ids.at_mut(index).expect("checked");
        match e.raw.migrate(ch) {
            Ok(()) => {
                e.channel = to;
                RawOutcome::Ok
            }
            Err(errno) => RawOutcome::Failed(errno),
        }
    }

    fn raw_join(&mut self, index: u32, group: SocketAddr) -> RawOutcome {
        let e = self.ids.at(index).expect("checked");
        match e.raw.join_multicast(&group) {
            Ok(()) => {
                // Tracked as a guarded join is, so that its MULTICAST_JOIN attaches the QP in the
                // backend's count and a leave finds it.
                self.groups.insert((index, group.ip()), false);
                RawOutcome::Ok
            }
            Err(errno) => RawOutcome::Failed(errno),
        }
    }

    fn raw_leave(&mut self, index: u32, group: SocketAddr) -> RawOutcome {
        if self.groups.contains_key(&(index, group.ip())) && self.unacked_group_events(index, group.ip()) > 0
        {
            return RawOutcome::NotIssued(
                "unacked multicast events: rdma_leave_multicast blocks until they are acked",
            );
        }
        let e = self.ids.at(index).expect("checked");
        match e.raw.leave_multicast(&group) {
            Ok(()) => {
                self.groups.remove(&(index, group.ip()));
                RawOutcome::Ok
            }
            Err(errno) => RawOutcome::Failed(errno),
        }
    }
}
