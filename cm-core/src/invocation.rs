//! One value per call: an [`Invocation`] is a librdmacm call with its arguments, for code that
//! stores, sends, generates or replays calls instead of making them at once.
//!
//! It is generic over how ids and channels are named: `Invocation<IdHandle, ChannelHandle>` (the
//! default) is what [`invoke`](Invocation::invoke) makes on a backend; the C drop-in's wire
//! protocol carries `Invocation<u64, u64>` (its tokens), which the daemon turns into handles with
//! [`map_handles`](Invocation::map_handles), checking each one is the caller's; a generator of
//! call sequences names ids by their index in its own list. Byte payloads (private data,
//! messages) are a `Vec<u8>` unless the third parameter says otherwise: a generator that stores
//! many calls can lend them (`&'static [u8]`) instead of owning a copy in each.
//!
//! ```
//! use cm_core::{CmBackend, Invocation, Outcome, PortSpace};
//!
//! fn replay<B: CmBackend>(b: &mut B) -> cm_core::Result<()> {
//!     let Outcome::Channel(ch) = Invocation::CreateEventChannel.invoke(b)? else {
//!         unreachable!("a channel call makes a channel")
//!     };
//!     let call = Invocation::CreateId { channel: ch, ps: PortSpace::Tcp };
//!     assert_eq!(call.call().name(), "rdma_create_id");
//!     let Outcome::Id(id) = call.invoke(b)? else { unreachable!() };
//!     Invocation::DestroyId { id }.invoke(b)?;
//!     Invocation::DestroyEventChannel { channel: ch }.invoke(b)?;
//!     Ok(())
//! }
//! ```

use std::net::SocketAddr;
use std::time::Duration;

use crate::{
    Call, ChannelHandle, CmBackend, CmError, ConnParam, IdHandle, IdMachine, IdOption, PortSpace, QpAttr,
    QpCaps, QpState, Result, UdParam,
};

/// A call of [`CmBackend`] with its arguments, ids named by `Id`, channels by `Ch` and byte
/// payloads held as `D`.
///
/// It covers the calls that take ids, channels and plain values; the event, completion, memory
/// region and shared receive queue calls, which hand over values of their own
/// ([`CmEvent`](crate::CmEvent), buffers), are made directly.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Invocation<Id = IdHandle, Ch = ChannelHandle, D = Vec<u8>> {
    /// `rdma_create_event_channel`.
    CreateEventChannel,
    /// `rdma_destroy_event_channel`.
    DestroyEventChannel {
        /// The channel.
        channel: Ch,
    },
    /// `rdma_create_id`.
    CreateId {
        /// The channel its events go to.
        channel: Ch,
        /// Its port space.
        ps: PortSpace,
    },
    /// `rdma_destroy_id`.
    DestroyId {
        /// The id.
        id: Id,
    },
    /// `rdma_bind_addr`.
    BindAddr {
        /// The id.
        id: Id,
        /// The address.
        addr: SocketAddr,
    },
    /// `rdma_resolve_addr`.
    ResolveAddr {
        /// The id.
        id: Id,
        /// The source address, if bound to one here.
        src: Option<SocketAddr>,
        /// The destination.
        dst: SocketAddr,
        /// How long resolution may take.
        timeout: Duration,
    },
    /// `rdma_resolve_route`.
    ResolveRoute {
        /// The id.
        id: Id,
        /// How long resolution may take.
        timeout: Duration,
    },
    /// `rdma_create_qp`.
    CreateQp {
        /// The id.
        id: Id,
        /// The capabilities asked for.
        caps: QpCaps,
    },
    /// `rdma_destroy_qp`.
    DestroyQp {
        /// The id.
        id: Id,
    },
    /// `rdma_listen`.
    Listen {
        /// The id.
        id: Id,
        /// The backlog.
        backlog: i32,
    },
    /// `rdma_connect`.
    Connect {
        /// The id.
        id: Id,
        /// The connection parameters.
        param: ConnParam,
    },
    /// `rdma_accept`.
    Accept {
        /// The id.
        id: Id,
        /// The connection parameters.
        param: ConnParam,
    },
    /// `rdma_reject`.
    Reject {
        /// The id.
        id: Id,
        /// The private data.
        private_data: D,
    },
    /// `rdma_disconnect`.
    Disconnect {
        /// The id.
        id: Id,
    },
    /// `rdma_establish`.
    Establish {
        /// The id.
        id: Id,
    },
    /// `rdma_init_qp_attr`.
    InitQpAttr {
        /// The id.
        id: Id,
        /// The state whose attributes are asked for.
        qp_state: QpState,
    },
    /// `rdma_set_option`.
    SetOption {
        /// The id.
        id: Id,
        /// The option.
        option: IdOption,
    },
    /// `rdma_migrate_id`.
    MigrateId {
        /// The id.
        id: Id,
        /// Its new channel.
        channel: Ch,
    },
    /// `rdma_get_local_addr`.
    GetLocalAddr {
        /// The id.
        id: Id,
    },
    /// `rdma_get_peer_addr`.
    GetPeerAddr {
        /// The id.
        id: Id,
    },
    /// `ibv_post_send` of a SEND.
    PostSend {
        /// The id.
        id: Id,
        /// The work request id.
        wr_id: u64,
        /// The message.
        data: D,
    },
    /// `ibv_post_recv`.
    PostRecv {
        /// The id.
        id: Id,
        /// The work request id.
        wr_id: u64,
        /// The buffer's length.
        len: u32,
    },
    /// `ibv_post_send` of a datagram (`rdma_post_ud_send`).
    PostSendTo {
        /// The id.
        id: Id,
        /// The work request id.
        wr_id: u64,
        /// Where it goes.
        dest: UdParam,
        /// The payload.
        data: D,
    },
    /// `rdma_join_multicast`.
    JoinMulticast {
        /// The id.
        id: Id,
        /// The group.
        group: SocketAddr,
    },
    /// `rdma_leave_multicast`.
    LeaveMulticast {
        /// The id.
        id: Id,
        /// The group.
        group: SocketAddr,
    },
}

/// What an [`Invocation`] gave back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The call succeeded and returns nothing.
    Done,
    /// The channel made.
    Channel(ChannelHandle),
    /// The id made.
    Id(IdHandle),
    /// The capabilities granted.
    Caps(QpCaps),
    /// The QP attributes asked for.
    QpAttr(QpAttr),
    /// The address asked for.
    Addr(Option<SocketAddr>),
}

impl<Id, Ch, D> Invocation<Id, Ch, D> {
    /// The call it makes.
    pub const fn call(&self) -> Call {
        match self {
            Invocation::CreateEventChannel => Call::CreateEventChannel,
            Invocation::DestroyEventChannel { .. } => Call::DestroyEventChannel,
            Invocation::CreateId { .. } => Call::CreateId,
            Invocation::DestroyId { .. } => Call::DestroyId,
            Invocation::BindAddr { .. } => Call::BindAddr,
            Invocation::ResolveAddr { .. } => Call::ResolveAddr,
            Invocation::ResolveRoute { .. } => Call::ResolveRoute,
            Invocation::CreateQp { .. } => Call::CreateQp,
            Invocation::DestroyQp { .. } => Call::DestroyQp,
            Invocation::Listen { .. } => Call::Listen,
            Invocation::Connect { .. } => Call::Connect,
            Invocation::Accept { .. } => Call::Accept,
            Invocation::Reject { .. } => Call::Reject,
            Invocation::Disconnect { .. } => Call::Disconnect,
            Invocation::Establish { .. } => Call::Establish,
            Invocation::InitQpAttr { .. } => Call::InitQpAttr,
            Invocation::SetOption { .. } => Call::SetOption,
            Invocation::MigrateId { .. } => Call::MigrateId,
            Invocation::GetLocalAddr { .. } => Call::GetLocalAddr,
            Invocation::GetPeerAddr { .. } => Call::GetPeerAddr,
            Invocation::PostSend { .. } | Invocation::PostSendTo { .. } => Call::PostSend,
            Invocation::PostRecv { .. } => Call::PostRecv,
            Invocation::JoinMulticast { .. } => Call::JoinMulticast,
            Invocation::LeaveMulticast { .. } => Call::LeaveMulticast,
        }
    }

    /// The id it acts on, if any.
    pub const fn id(&self) -> Option<&Id> {
        match self {
            Invocation::CreateEventChannel
            | Invocation::DestroyEventChannel { .. }
            | Invocation::CreateId { .. } => None,
            Invocation::DestroyId { id }
            | Invocation::BindAddr { id, .. }
            | Invocation::ResolveAddr { id, .. }
            | Invocation::ResolveRoute { id, .. }
            | Invocation::CreateQp { id, .. }
            | Invocation::DestroyQp { id }
            | Invocation::Listen { id, .. }
            | Invocation::Connect { id, .. }
            | Invocation::Accept { id, .. }
            | Invocation::Reject { id, .. }
            | Invocation::Disconnect { id }
            | Invocation::Establish { id }
            | Invocation::InitQpAttr { id, .. }
            | Invocation::SetOption { id, .. }
            | Invocation::MigrateId { id, .. }
            | Invocation::GetLocalAddr { id }
            | Invocation::GetPeerAddr { id }
            | Invocation::PostSend { id, .. }
            | Invocation::PostRecv { id, .. }
            | Invocation::PostSendTo { id, .. }
            | Invocation::JoinMulticast { id, .. }
            | Invocation::LeaveMulticast { id, .. } => Some(id),
        }
    }

    /// The same call with ids and channels named another way: `id` and `channel` translate
    /// each name (a lookup that may refuse it: the first refusal is returned).
    pub fn map_handles<I2, C2, E>(
        self,
        mut id: impl FnMut(Id) -> std::result::Result<I2, E>,
        mut channel: impl FnMut(Ch) -> std::result::Result<C2, E>,
    ) -> std::result::Result<Invocation<I2, C2, D>, E> {
        use Invocation as I;
        Ok(match self {
            I::CreateEventChannel => I::CreateEventChannel,
            I::DestroyEventChannel { channel: c } => I::DestroyEventChannel { channel: channel(c)? },
            I::CreateId { channel: c, ps } => I::CreateId {
                channel: channel(c)?,
                ps,
            },
            I::DestroyId { id: i } => I::DestroyId { id: id(i)? },
            I::BindAddr { id: i, addr } => I::BindAddr { id: id(i)?, addr },
            I::ResolveAddr {
                id: i,
                src,
                dst,
                timeout,
            } => I::ResolveAddr {
                id: id(i)?,
                src,
                dst,
                timeout,
            },
            I::ResolveRoute { id: i, timeout } => I::ResolveRoute { id: id(i)?, timeout },
            I::CreateQp { id: i, caps } => I::CreateQp { id: id(i)?, caps },
            I::DestroyQp { id: i } => I::DestroyQp { id: id(i)? },
            I::Listen { id: i, backlog } => I::Listen { id: id(i)?, backlog },
            I::Connect { id: i, param } => I::Connect { id: id(i)?, param },
            I::Accept { id: i, param } => I::Accept { id: id(i)?, param },
            I::Reject { id: i, private_data } => I::Reject {
                id: id(i)?,
                private_data,
            },
            I::Disconnect { id: i } => I::Disconnect { id: id(i)? },
            I::Establish { id: i } => I::Establish { id: id(i)? },
            I::InitQpAttr { id: i, qp_state } => I::InitQpAttr { id: id(i)?, qp_state },
            I::SetOption { id: i, option } => I::SetOption { id: id(i)?, option },
            I::MigrateId { id: i, channel: c } => I::MigrateId {
                id: id(i)?,
                channel: channel(c)?,
            },
            I::GetLocalAddr { id: i } => I::GetLocalAddr { id: id(i)? },
            I::GetPeerAddr { id: i } => I::GetPeerAddr { id: id(i)? },
            I::PostSend { id: i, wr_id, data } => I::PostSend {
                id: id(i)?,
                wr_id,
                data,
            },
            I::PostRecv { id: i, wr_id, len } => I::PostRecv {
                id: id(i)?,
                wr_id,
                len,
            },
            I::PostSendTo {
                id: i,
                wr_id,
                dest,
                data,
            } => I::PostSendTo {
                id: id(i)?,
                wr_id,
                dest,
                data,
            },
            I::JoinMulticast { id: i, group } => I::JoinMulticast { id: id(i)?, group },
            I::LeaveMulticast { id: i, group } => I::LeaveMulticast { id: id(i)?, group },
        })
    }
}

impl<Id, Ch, D: AsRef<[u8]>> Invocation<Id, Ch, D> {
    /// The id machine's check of the call on an id in state `m`: the machine after it where the
    /// call moves the id, `None` where it leaves it as it is (or acts on no id), or the error
    /// every backend answers. The call itself is not made.
    pub fn check(&self, m: &IdMachine) -> std::result::Result<Option<IdMachine>, CmError> {
        use Invocation as I;
        let next = match self {
            I::CreateEventChannel
            | I::DestroyEventChannel { .. }
            | I::CreateId { .. }
            | I::GetLocalAddr { .. }
            | I::GetPeerAddr { .. }
            | I::LeaveMulticast { .. } => return Ok(None),
            I::DestroyId { .. } => m.destroy(),
            I::BindAddr { addr, .. } => m.bind_addr(addr.ip().is_unspecified()),
            I::ResolveAddr { .. } => m.resolve_addr(),
            I::ResolveRoute { .. } => m.resolve_route(),
            I::CreateQp { .. } => m.create_qp(),
            I::DestroyQp { .. } => m.destroy_qp(),
            I::Listen { .. } => m.listen(),
            I::Connect { param, .. } if m.uses_external_qp(param) => {
                m.connect_external(param.private_data.len())
            }
            I::Connect { param, .. } => m.connect(param.private_data.len()),
            I::Accept { param, .. } if m.uses_external_qp(param) => {
                m.accept_external(param.private_data.len())
            }
            I::Accept { param, .. } => m.accept(param.private_data.len()),
            I::Reject { private_data, .. } => m.reject(private_data.as_ref().len()),
            I::Disconnect { .. } => m.disconnect(),
            I::Establish { .. } => m.establish(),
            I::InitQpAttr { qp_state, .. } => return m.init_qp_attr(*qp_state).map(|()| None),
            I::SetOption { option, .. } => return m.set_option(*option).map(|()| None),
            I::MigrateId { .. } => return m.migrate().map(|()| None),
            I::PostSend { .. } => return m.post_send().map(|()| None),
            I::PostRecv { .. } => return m.post_recv().map(|()| None),
            I::PostSendTo { .. } => return m.post_send_to().map(|()| None),
            I::JoinMulticast { .. } => return m.join_multicast().map(|()| None),
        };
        next.map(Some)
    }
}

impl Invocation<IdHandle, ChannelHandle> {
    /// Makes the call on `b`.
    ///
    /// # Errors
    /// The call's own.
    pub fn invoke<B: CmBackend + ?Sized>(&self, b: &mut B) -> Result<Outcome> {
        self.invoke_lent(b)
    }
}

impl<D: AsRef<[u8]>> Invocation<IdHandle, ChannelHandle, D> {
    /// [`invoke`](Invocation::invoke) for a call whose payloads are held as `D` (lent, for
    /// one): the call is made with them where they are. `invoke` itself takes the default
    /// `Vec<u8>` only, so that a call written without its types still names one method.
    ///
    /// # Errors
    /// The call's own.
    pub fn invoke_lent<B: CmBackend + ?Sized>(&self, b: &mut B) -> Result<Outcome> {
        use Invocation as I;
        let done = |r: Result<()>| r.map(|()| Outcome::Done);
        match self {
            I::CreateEventChannel => b.create_event_channel().map(Outcome::Channel),
            I::DestroyEventChannel { channel } => done(b.destroy_event_channel(*channel)),
            I::CreateId { channel, ps } => b.create_id(*channel, *ps).map(Outcome::Id),
            I::DestroyId { id } => done(b.destroy_id(*id)),
            I::BindAddr { id, addr } => done(b.bind_addr(*id, *addr)),
            I::ResolveAddr {
                id,
                src,
                dst,
                timeout,
            } => done(b.resolve_addr(*id, *src, *dst, *timeout)),
            I::ResolveRoute { id, timeout } => done(b.resolve_route(*id, *timeout)),
            I::CreateQp { id, caps } => b.create_qp(*id, *caps).map(Outcome::Caps),
            I::DestroyQp { id } => done(b.destroy_qp(*id)),
            I::Listen { id, backlog } => done(b.listen(*id, *backlog)),
            I::Connect { id, param } => done(b.connect(*id, param)),
            I::Accept { id, param } => done(b.accept(*id, param)),
            I::Reject { id, private_data } => done(b.reject(*id, private_data.as_ref())),
            I::Disconnect { id } => done(b.disconnect(*id)),
            I::Establish { id } => done(b.establish(*id)),
            I::InitQpAttr { id, qp_state } => b.init_qp_attr(*id, *qp_state).map(Outcome::QpAttr),
            I::SetOption { id, option } => done(b.set_option(*id, *option)),
            I::MigrateId { id, channel } => done(b.migrate_id(*id, *channel)),
            I::GetLocalAddr { id } => b.get_local_addr(*id).map(Outcome::Addr),
            I::GetPeerAddr { id } => b.get_peer_addr(*id).map(Outcome::Addr),
            I::PostSend { id, wr_id, data } => done(b.post_send(*id, *wr_id, data.as_ref())),
            I::PostRecv { id, wr_id, len } => done(b.post_recv(*id, *wr_id, *len)),
            I::PostSendTo {
                id,
                wr_id,
                dest,
                data,
            } => done(b.post_send_to(*id, *wr_id, dest, data.as_ref())),
            I::JoinMulticast { id, group } => done(b.join_multicast(*id, *group)),
            I::LeaveMulticast { id, group } => done(b.leave_multicast(*id, *group)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{CmEventType, IdState};

    #[test]
    fn handles_are_renamed_in_place_and_a_refused_name_stops_the_renaming() {
        let call: Invocation<u64, u64> = Invocation::MigrateId { id: 7, channel: 9 };
        let renamed = call.clone().map_handles(|i| Ok::<_, ()>(i * 10), |c| Ok(c + 1));
        assert_eq!(renamed, Ok(Invocation::MigrateId { id: 70, channel: 10 }));
        let refused = call.map_handles(|_| Err::<u64, _>("not yours"), Ok);
        assert_eq!(refused, Err("not yours"));
        let none: Invocation<u64, u64> = Invocation::CreateEventChannel;
        assert_eq!(none.id(), None);
        assert_eq!(Invocation::<u64, u64>::DestroyQp { id: 3 }.id(), Some(&3));
    }

    #[test]
    fn the_check_is_the_machines_and_names_the_next_state() {
        let idle = IdMachine::new(PortSpace::Tcp);
        let resolve: Invocation<u64, u64> = Invocation::ResolveAddr {
            id: 1,
            src: None,
            dst: "10.0.0.2:7471".parse().unwrap(),
            timeout: Duration::from_secs(1),
        };
        let next = resolve.check(&idle).unwrap().expect("resolving moves the id");
        assert_eq!(next, idle.resolve_addr().unwrap());
        let connect: Invocation<u64, u64> = Invocation::Connect {
            id: 1,
            param: ConnParam::new(),
        };
        assert_eq!(connect.check(&idle), Err(idle.connect(0).unwrap_err()));
        let addr: Invocation<u64, u64> = Invocation::GetLocalAddr { id: 1 };
        assert_eq!(addr.check(&idle), Ok(None));
        let post: Invocation<u64, u64> = Invocation::PostRecv {
            id: 1,
            wr_id: 0,
            len: 8,
        };
        assert_eq!(post.check(&idle), Err(CmError::NoQp { call: Call::PostRecv }));
        let bound = idle
            .resolve_addr()
            .unwrap()
            .on_event(CmEventType::AddrResolved)
            .unwrap();
        assert_eq!(bound.state(), IdState::AddrResolved);
    }

    #[test]
    fn a_lent_payload_is_checked_like_an_owned_one_and_keeps_through_renaming() {
        static TOO_LONG: [u8; 300] = [0x5A; 300];
        let idle = IdMachine::new(PortSpace::Tcp);
        let lent: Invocation<u8, u8, &[u8]> = Invocation::Reject {
            id: 0,
            private_data: &TOO_LONG,
        };
        let owned: Invocation<u8, u8> = Invocation::Reject {
            id: 0,
            private_data: TOO_LONG.to_vec(),
        };
        assert_eq!(lent.check(&idle), owned.check(&idle));
        assert_eq!(lent.check(&idle), Err(idle.reject(300).unwrap_err()));
        let renamed = lent.map_handles(|i| Ok::<_, ()>(u16::from(i) + 1), |c| Ok(u16::from(c)));
        let Ok(Invocation::Reject { id, private_data }) = renamed else {
            panic!("renaming keeps the call")
        };
        assert_eq!((id, private_data.len()), (1, 300));
        assert!(
            std::ptr::eq(private_data, &TOO_LONG[..]),
            "the payload is lent, not copied"
        );
    }

    #[test]
    fn every_call_names_its_librdmacm_function() {
        let calls: [Invocation<u8, u8>; 4] = [
            Invocation::CreateEventChannel,
            Invocation::Listen { id: 0, backlog: 1 },
            Invocation::PostSendTo {
                id: 0,
                wr_id: 0,
                dest: crate::group_ud_param("239.0.0.1".parse().unwrap()),
                data: Vec::new(),
            },
            Invocation::LeaveMulticast {
                id: 0,
                group: "239.0.0.1:0".parse().unwrap(),
            },
        ];
        let names: Vec<&str> = calls.iter().map(|c| c.call().name()).collect();
        assert_eq!(
            names,
            [
                "rdma_create_event_channel",
                "rdma_listen",
                "ibv_post_send",
                "rdma_leave_multicast"
            ]
        );
    }
}
