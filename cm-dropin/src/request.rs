//! What a process asks of the daemon on its control socket, one [`Request`] per datagram,
//! with the codec both ends use: the library encodes, the daemon decodes, and neither writes a
//! field by hand.
//!
//! The librdmacm calls are [`Invocation`]s naming ids and channels by the daemon's tokens;
//! the rest is what a NIC does for a process (completion queues and channels, memory
//! regions, work requests) and what the daemon keeps for it (the addresses of an id).
//!
//! ```
//! use cm_core::{Invocation, PortSpace};
//! use cm_dropin::request::Request;
//!
//! let req = Request::Cm(Invocation::CreateId { channel: 7, ps: PortSpace::Tcp });
//! assert_eq!(Request::decode(&req.encode().0), Ok(req));
//! ```

use std::time::Duration;

use cm_core::{
    AddressVector, AhAttr, GlobalRoute, Invocation, PortSpace, QpCaps, QpState, UdParam, VerbsQpAttr,
    VerbsQpState,
};

use crate::proto::{Dec, Enc, Malformed, Op};

/// The most scatter/gather entries one RDMA work request may carry (the simulated device's
/// `max_sge`; this bounds what a malformed request makes the daemon hold).
pub const MAX_SGE: usize = 64;

/// One request on a control socket, after the hello.
// A connect's parameters hold their private data's buffer in place; requests live one at a
// time, decoded and served, so the size is paid once and boxing would allocate per call.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Request {
    /// A librdmacm call on the simulator: `CreateEventChannel` (→ `channel: u64`),
    /// `DestroyEventChannel`, `CreateId` (→ `id: u64`), `DestroyId`, `BindAddr`, `ResolveAddr`,
    /// `ResolveRoute`, `DestroyQp`, `Listen`, `Connect`, `Accept`, `Reject`, `Disconnect`,
    /// `PostRecv` (a UD QP's receive holds the 40-byte GRH and then the payload, as on verbs),
    /// `JoinMulticast` (`MULTICAST_JOIN` or `MULTICAST_ERROR` follows on the id's channel),
    /// `LeaveMulticast`, `InitQpAttr` (→ `mask: u32`, then the attributes as
    /// [`Enc::verbs_attr`] writes them; the state asked for is an `ibv_qp_state`, SQD and SQE
    /// `EINVAL`), `Establish` and `MigrateId` (the id and the channel both the caller's).
    /// Other calls are refused as malformed.
    Cm(Invocation<u64, u64>),
    /// `rdma_create_qp` with the verbs side of it → `caps: 5 x u32, qp_num: u32`. A datagram
    /// id's QP is `IBV_QPT_UD`, a connected id's `IBV_QPT_RC` (else `EINVAL`); a UD QP's number
    /// is the simulator's, which datagrams are addressed by.
    CreateQp {
        /// The id token.
        id: u64,
        /// The capabilities asked for.
        caps: QpCaps,
        /// Its send CQ (a token; 0: none).
        send_cq: u64,
        /// Its receive CQ.
        recv_cq: u64,
        /// `sq_sig_all`.
        sq_sig_all: bool,
        /// `enum ibv_qp_type`.
        qp_type: u32,
        /// `ibv_qp_init_attr.srq` (or the id's, `rdma_create_srq`'s): the SRQ token the QP
        /// takes its receives from; 0: none.
        srq: u64,
    },
    /// `ibv_post_send` of a SEND.
    PostSend {
        /// The QP's token: its id's (a QP `rdma_create_qp` made) or its own (one
        /// [`VerbsCreateQp`](Request::VerbsCreateQp) made).
        id: u64,
        /// `wr_id`.
        wr_id: u64,
        /// `IBV_SEND_SIGNALED`.
        signaled: bool,
        /// The message.
        data: Vec<u8>,
    },
    /// `ibv_post_send` of a datagram to `dest` (the work request's remote QP number and Q_Key,
    /// and its address handle's attributes; the multicast QPN for a group).
    PostSendUd {
        /// The id token.
        id: u64,
        /// `wr_id`.
        wr_id: u64,
        /// `IBV_SEND_SIGNALED`.
        signaled: bool,
        /// Where it goes.
        dest: UdParam,
        /// `IBV_WR_SEND_WITH_IMM`'s immediate data.
        imm: Option<u32>,
        /// The payload.
        data: Vec<u8>,
    },
    /// `ibv_post_send` of an RDMA WRITE (or READ) of the caller's registered memory (the
    /// entries; inline data must lie in a registered region too) to (or from) the region `rkey`
    /// names at the QP's peer, carried out by the simulator.
    Rdma {
        /// WRITE, else READ.
        write: bool,
        /// A WRITE's immediate (`IBV_WR_RDMA_WRITE_WITH_IMM`), network order as the work
        /// request holds it: the write then takes the peer's next receive. A READ has none.
        imm: Option<u32>,
        /// The QP's token, as [`PostSend`](Request::PostSend)'s.
        id: u64,
        /// `wr_id`.
        wr_id: u64,
        /// `IBV_SEND_SIGNALED`.
        signaled: bool,
        /// The remote address.
        remote_addr: u64,
        /// The remote key.
        rkey: u32,
        /// The local entries: address, length, lkey.
        sges: Vec<(u64, u32, u32)>,
    },
    /// `ibv_post_send` of an `IBV_WR_SEND_WITH_IMM` on a connected QP: the message is
    /// gathered by the simulator from the caller's registered memory (the entries; inline data
    /// must lie in a registered region too), and its immediate reported at the receiver.
    PostSendImm {
        /// The QP's token, as [`PostSend`](Request::PostSend)'s.
        id: u64,
        /// `wr_id`.
        wr_id: u64,
        /// `IBV_SEND_SIGNALED`.
        signaled: bool,
        /// `imm_data`, as the work request holds it (network order).
        imm: u32,
        /// The local entries: address, length, lkey.
        sges: Vec<(u64, u32, u32)>,
    },
    /// `ibv_post_send` of an atomic on a connected QP: the 8 bytes at `remote_addr` of the
    /// peer's region `rkey` become `swap` if they equal `compare_add` (compare and swap), or
    /// have `compare_add` added (fetch and add); their value before lands in the one local
    /// entry. Carried out by the simulator.
    Atomic {
        /// Compare and swap, else fetch and add.
        cmp_swap: bool,
        /// The QP's token, as [`PostSend`](Request::PostSend)'s.
        id: u64,
        /// `wr_id`.
        wr_id: u64,
        /// `IBV_SEND_SIGNALED`.
        signaled: bool,
        /// `wr.atomic.remote_addr`.
        remote_addr: u64,
        /// `wr.atomic.rkey`.
        rkey: u32,
        /// `wr.atomic.compare_add`.
        compare_add: u64,
        /// `wr.atomic.swap`.
        swap: u64,
        /// The local entry: address, length, lkey.
        sge: (u64, u32, u32),
    },
    /// → `local: addr, peer: addr`.
    QueryAddrs {
        /// The id token.
        id: u64,
    },
    /// Not answered: an ack that is refused (another process's event, or one acked already)
    /// is said on the daemon's stderr and leaves the event as it was.
    AckEvent {
        /// The event's number.
        event: u64,
    },
    /// → `cq: u64`.
    CreateCq {
        /// `cqe`.
        cqe: u32,
        /// Its completion channel (0: none).
        channel: u64,
    },
    /// `ibv_destroy_cq`.
    DestroyCq {
        /// The CQ token.
        cq: u64,
    },
    /// → `n: u32`, then n x [`WireWc`](crate::proto::WireWc), then `more: u8` (1: fewer than
    /// `max` came because one reply could not hold the next, which is waiting).
    PollCq {
        /// The CQ token.
        cq: u64,
        /// At most this many.
        max: u32,
    },
    /// The next completion queued on the CQ raises one event on its channel.
    ReqNotifyCq {
        /// The CQ token.
        cq: u64,
    },
    /// → `channel: u64` (a completion channel; its socket is attached separately).
    CreateCompChannel,
    /// `ibv_destroy_comp_channel`.
    DestroyCompChannel {
        /// The channel token.
        channel: u64,
    },
    /// → `key: u32` (lkey and rkey).
    RegMr {
        /// Where the region starts in the caller's memory.
        addr: u64,
        /// Its length.
        len: u64,
        /// `enum ibv_access_flags`.
        access: u32,
    },
    /// `ibv_dereg_mr`.
    DeregMr {
        /// The region's key.
        key: u32,
    },
    /// `ibv_create_qp`: a QP no id owns, in RESET → `caps: 5 x u32, qp_num: u32`. Its number
    /// is also its token, which names it in the requests below and in [`PostSend`](Request::PostSend)
    /// and [`Rdma`](Request::Rdma) (and [`PostSendUd`](Request::PostSendUd), whose destination
    /// may name a verbs UD QP by its number too). RC or UD (else `EINVAL`).
    VerbsCreateQp {
        /// The capabilities asked for.
        caps: QpCaps,
        /// Its send CQ (a token).
        send_cq: u64,
        /// Its receive CQ.
        recv_cq: u64,
        /// `sq_sig_all`.
        sq_sig_all: bool,
        /// `enum ibv_qp_type`.
        qp_type: u32,
        /// `ibv_qp_init_attr.srq`: the SRQ ([`CreateSrq`](Request::CreateSrq)'s token) the QP
        /// takes its receives from; 0: none (the QP has its own receive queue).
        srq: u64,
    },
    /// `ibv_modify_qp`. `dest_qp_num` is a QP's number as the library shows it.
    ModifyQp {
        /// The QP's token.
        qp: u64,
        /// `enum ibv_qp_attr_mask`.
        mask: u32,
        /// The attributes the mask names.
        attr: VerbsQpAttr,
    },
    /// `ibv_query_qp` → `set: u32` (the attributes set), then the attributes.
    QueryQp {
        /// The QP's token.
        qp: u64,
    },
    /// `ibv_destroy_qp` of a QP no id owns.
    VerbsDestroyQp {
        /// The QP's token.
        qp: u64,
    },
    /// `ibv_post_recv` on a QP no id owns.
    QpPostRecv {
        /// The QP's token.
        qp: u64,
        /// `wr_id`.
        wr_id: u64,
        /// The receive buffer's length.
        len: u32,
    },
    /// `ibv_create_srq` on the caller's device → `srq: u64, max_wr: u32, max_sge: u32` (the
    /// token and what was granted).
    CreateSrq {
        /// `attr.max_wr`.
        max_wr: u32,
        /// `attr.max_sge`.
        max_sge: u32,
        /// `attr.srq_limit`.
        srq_limit: u32,
    },
    /// `ibv_modify_srq`.
    ModifySrq {
        /// The SRQ's token.
        srq: u64,
        /// `enum ibv_srq_attr_mask` (`IBV_SRQ_MAX_WR` 1, `IBV_SRQ_LIMIT` 2).
        mask: u32,
        /// `attr.max_wr`.
        max_wr: u32,
        /// `attr.srq_limit`.
        srq_limit: u32,
    },
    /// `ibv_query_srq` → `max_wr: u32, max_sge: u32, srq_limit: u32`.
    QuerySrq {
        /// The SRQ's token.
        srq: u64,
    },
    /// `ibv_destroy_srq`: `EBUSY` while a QP takes its receives from it.
    DestroySrq {
        /// The SRQ's token.
        srq: u64,
    },
    /// `ibv_post_srq_recv`: one receive on the SRQ; its completion comes on the receive CQ of
    /// whichever QP a message lands on, carrying `wr_id`.
    PostSrqRecv {
        /// The SRQ's token.
        srq: u64,
        /// `wr_id`.
        wr_id: u64,
        /// The receive buffer's length.
        len: u32,
    },
}

/// An address vector as `struct ibv_ah_attr` holds it (`is_global` for the GRH).
pub fn ah_attr_of(av: &AddressVector) -> AhAttr {
    let g = av.grh.unwrap_or_default();
    AhAttr {
        dgid: g.dgid,
        flow_label: g.flow_label,
        sgid_index: g.sgid_index,
        hop_limit: g.hop_limit,
        traffic_class: g.traffic_class,
        dlid: av.dlid,
        sl: av.sl,
        src_path_bits: av.src_path_bits,
        static_rate: av.static_rate,
        is_global: av.grh.is_some(),
        port_num: av.port_num,
    }
}

/// The address vector a `struct ibv_ah_attr` describes.
pub fn address_vector(ah: &AhAttr) -> AddressVector {
    AddressVector {
        dlid: ah.dlid,
        sl: ah.sl,
        src_path_bits: ah.src_path_bits,
        static_rate: ah.static_rate,
        grh: ah.is_global.then_some(GlobalRoute {
            dgid: ah.dgid,
            flow_label: ah.flow_label,
            sgid_index: ah.sgid_index,
            hop_limit: ah.hop_limit,
            traffic_class: ah.traffic_class,
        }),
        port_num: ah.port_num,
    }
}

/// The verbs state of an id's QP state (what `rdma_init_qp_attr` is asked for).
pub fn verbs_state_of(s: QpState) -> VerbsQpState {
    match s {
        QpState::Reset => VerbsQpState::Reset,
        QpState::Init => VerbsQpState::Init,
        QpState::Rtr => VerbsQpState::Rtr,
        QpState::Rts => VerbsQpState::Rts,
        QpState::Err => VerbsQpState::Err,
    }
}

/// The id QP state a verbs state is, if it is one of the five an id's QP goes through.
pub fn qp_state_of(s: VerbsQpState) -> Option<QpState> {
    Some(match s {
        VerbsQpState::Reset => QpState::Reset,
        VerbsQpState::Init => QpState::Init,
        VerbsQpState::Rtr => QpState::Rtr,
        VerbsQpState::Rts => QpState::Rts,
        VerbsQpState::Err => QpState::Err,
        VerbsQpState::Sqd | VerbsQpState::Sqe => return None,
    })
}

/// The librdmacm calls the protocol carries as [`Request::Cm`], with their ops.
fn cm_op(call: &Invocation<u64, u64>) -> Option<Op> {
    use Invocation as I;
    Some(match call {
        I::CreateEventChannel => Op::CreateChannel,
        I::DestroyEventChannel { .. } => Op::DestroyChannel,
        I::CreateId { .. } => Op::CreateId,
        I::DestroyId { .. } => Op::DestroyId,
        I::BindAddr { .. } => Op::BindAddr,
        I::ResolveAddr { .. } => Op::ResolveAddr,
        I::ResolveRoute { .. } => Op::ResolveRoute,
        I::DestroyQp { .. } => Op::DestroyQp,
        I::Listen { .. } => Op::Listen,
        I::Connect { .. } => Op::Connect,
        I::Accept { .. } => Op::Accept,
        I::Reject { .. } => Op::Reject,
        I::Disconnect { .. } => Op::Disconnect,
        I::PostRecv { .. } => Op::PostRecv,
        I::JoinMulticast { .. } => Op::JoinMcast,
        I::LeaveMulticast { .. } => Op::LeaveMcast,
        I::InitQpAttr { .. } => Op::InitQpAttr,
        I::Establish { .. } => Op::Establish,
        I::MigrateId { .. } => Op::MigrateId,
        // Carried with the verbs side of them (CreateQp, PostSend, PostSendUd) or not at all.
        I::CreateQp { .. }
        | I::SetOption { .. }
        | I::GetLocalAddr { .. }
        | I::GetPeerAddr { .. }
        | I::PostSend { .. }
        | I::PostSendTo { .. } => return None,
    })
}

/// A timeout as librdmacm takes it: milliseconds in an `int` (longer ones are cut to the most
/// a `u32` holds).
fn millis(d: Duration) -> u32 {
    u32::try_from(d.as_millis()).unwrap_or(u32::MAX)
}

impl Enc {
    /// Appends a QP's capabilities as `ibv_qp_cap` has them (the message size is the port's).
    pub fn caps(&mut self, caps: &QpCaps) -> &mut Self {
        self.u32(caps.max_send_wr)
            .u32(caps.max_recv_wr)
            .u32(caps.max_send_sge)
            .u32(caps.max_recv_sge)
            .u32(caps.max_inline_data)
    }
}

impl Enc {
    /// Appends a verbs QP's attributes, every field of `struct ibv_qp_attr` but `cap`.
    pub fn verbs_attr(&mut self, a: &VerbsQpAttr) -> &mut Self {
        self.u32(a.qp_state.raw())
            .u32(a.cur_qp_state.raw())
            .u8(a.path_mtu)
            .u32(a.path_mig_state)
            .u32(a.qkey)
            .u32(a.rq_psn)
            .u32(a.sq_psn)
            .u32(a.dest_qp_num)
            .u32(a.qp_access_flags)
            .ah_attr(&ah_attr_of(&a.ah_attr))
            .ah_attr(&ah_attr_of(&a.alt_ah_attr))
            .u16(a.pkey_index)
            .u16(a.alt_pkey_index)
            .u8(a.en_sqd_async_notify)
            .u8(a.max_rd_atomic)
            .u8(a.max_dest_rd_atomic)
            .u8(a.min_rnr_timer)
            .u8(a.port_num)
            .u8(a.timeout)
            .u8(a.retry_cnt)
            .u8(a.rnr_retry)
            .u8(a.alt_port_num)
            .u8(a.alt_timeout)
            .u32(a.rate_limit)
    }
}

impl Dec<'_> {
    /// Reads a verbs QP's attributes; `None` for a state past `IBV_QPS_ERR`.
    pub fn verbs_attr(&mut self) -> Result<Option<VerbsQpAttr>, Malformed> {
        let (state, cur) = (self.u32()?, self.u32()?);
        let mut a = VerbsQpAttr {
            path_mtu: self.u8()?,
            path_mig_state: self.u32()?,
            qkey: self.u32()?,
            rq_psn: self.u32()?,
            sq_psn: self.u32()?,
            dest_qp_num: self.u32()?,
            qp_access_flags: self.u32()?,
            ah_attr: address_vector(&self.ah_attr()?),
            alt_ah_attr: address_vector(&self.ah_attr()?),
            pkey_index: self.u16()?,
            alt_pkey_index: self.u16()?,
            en_sqd_async_notify: self.u8()?,
            max_rd_atomic: self.u8()?,
            max_dest_rd_atomic: self.u8()?,
            min_rnr_timer: self.u8()?,
            port_num: self.u8()?,
            timeout: self.u8()?,
            retry_cnt: self.u8()?,
            rnr_retry: self.u8()?,
            alt_port_num: self.u8()?,
            alt_timeout: self.u8()?,
            rate_limit: self.u32()?,
            ..VerbsQpAttr::default()
        };
        match (VerbsQpState::from_raw(state), VerbsQpState::from_raw(cur)) {
            (Some(s), Some(c)) => {
                a.qp_state = s;
                a.cur_qp_state = c;
                Ok(Some(a))
            }
            _ => Ok(None),
        }
    }

    /// Reads a QP's capabilities (the message size left at [`QpCaps::new`]'s).
    pub fn caps(&mut self) -> Result<QpCaps, Malformed> {
        let mut caps = QpCaps::new();
        caps.max_send_wr = self.u32()?;
        caps.max_recv_wr = self.u32()?;
        caps.max_send_sge = self.u32()?;
        caps.max_recv_sge = self.u32()?;
        caps.max_inline_data = self.u32()?;
        Ok(caps)
    }
}

impl Request {
    /// The op that names it on the wire. `None` for an [`Invocation`] the protocol does not
    /// carry (see [`Request::Cm`]).
    pub fn op(&self) -> Option<Op> {
        Some(match self {
            Request::Cm(call) => return cm_op(call),
            Request::CreateQp { .. } => Op::CreateQp,
            Request::PostSend { .. } => Op::PostSend,
            Request::PostSendUd { .. } => Op::PostSendUd,
            Request::Rdma {
                write: true,
                imm: Some(_),
                ..
            } => Op::RdmaWriteImm,
            Request::Rdma { write: true, .. } => Op::RdmaWrite,
            Request::Rdma { write: false, .. } => Op::RdmaRead,
            Request::PostSendImm { .. } => Op::PostSendImm,
            Request::Atomic { .. } => Op::Atomic,
            Request::QueryAddrs { .. } => Op::QueryAddrs,
            Request::AckEvent { .. } => Op::AckEvent,
            Request::CreateCq { .. } => Op::CreateCq,
            Request::DestroyCq { .. } => Op::DestroyCq,
            Request::PollCq { .. } => Op::PollCq,
            Request::ReqNotifyCq { .. } => Op::ReqNotifyCq,
            Request::CreateCompChannel => Op::CreateCompChannel,
            Request::DestroyCompChannel { .. } => Op::DestroyCompChannel,
            Request::RegMr { .. } => Op::RegMr,
            Request::DeregMr { .. } => Op::DeregMr,
            Request::VerbsCreateQp { .. } => Op::VerbsCreateQp,
            Request::ModifyQp { .. } => Op::ModifyQp,
            Request::QueryQp { .. } => Op::QueryQp,
            Request::VerbsDestroyQp { .. } => Op::VerbsDestroyQp,
            Request::QpPostRecv { .. } => Op::QpPostRecv,
            Request::CreateSrq { .. } => Op::CreateSrq,
            Request::ModifySrq { .. } => Op::ModifySrq,
            Request::QuerySrq { .. } => Op::QuerySrq,
            Request::DestroySrq { .. } => Op::DestroySrq,
            Request::PostSrqRecv { .. } => Op::PostSrqRecv,
        })
    }

    /// The request's datagram.
    ///
    /// # Panics
    /// For a [`Request::Cm`] the protocol does not carry (see [`Request::op`]): a bug of the
    /// library's, which only makes the ones it serves.
    pub fn encode(&self) -> Enc {
        use Invocation as I;
        let mut e = Enc::op(self.op().expect("a call the protocol carries"));
        match self {
            Request::Cm(call) => match call {
                I::CreateEventChannel => {}
                I::DestroyEventChannel { channel } => {
                    e.u64(*channel);
                }
                I::CreateId { channel, ps } => {
                    e.u64(*channel).u32(ps.raw());
                }
                I::MigrateId { id, channel } => {
                    e.u64(*id).u64(*channel);
                }
                I::DestroyId { id } | I::DestroyQp { id } | I::Disconnect { id } | I::Establish { id } => {
                    e.u64(*id);
                }
                I::BindAddr { id, addr } => {
                    e.u64(*id).addr(Some(*addr));
                }
                I::ResolveAddr {
                    id,
                    src,
                    dst,
                    timeout,
                } => {
                    e.u64(*id).addr(*src).addr(Some(*dst)).u32(millis(*timeout));
                }
                I::ResolveRoute { id, timeout } => {
                    e.u64(*id).u32(millis(*timeout));
                }
                I::Listen { id, backlog } => {
                    e.u64(*id).i32(*backlog);
                }
                I::Connect { id, param } | I::Accept { id, param } => {
                    e.u64(*id).param(param);
                }
                I::Reject { id, private_data } => {
                    e.u64(*id).bytes(private_data);
                }
                I::PostRecv { id, wr_id, len } => {
                    e.u64(*id).u64(*wr_id).u32(*len);
                }
                I::JoinMulticast { id, group } | I::LeaveMulticast { id, group } => {
                    e.u64(*id).addr(Some(*group));
                }
                I::InitQpAttr { id, qp_state } => {
                    e.u64(*id).u32(verbs_state_of(*qp_state).raw());
                }
                _ => unreachable!("op() refused it"),
            },
            Request::CreateQp {
                id,
                caps,
                send_cq,
                recv_cq,
                sq_sig_all,
                qp_type,
                srq,
            } => {
                e.u64(*id)
                    .caps(caps)
                    .u64(*send_cq)
                    .u64(*recv_cq)
                    .u8(*sq_sig_all as u8)
                    .u32(*qp_type)
                    .u64(*srq);
            }
            Request::PostSend {
                id,
                wr_id,
                signaled,
                data,
            } => {
                e.u64(*id).u64(*wr_id).u8(*signaled as u8).bytes(data);
            }
            Request::PostSendUd {
                id,
                wr_id,
                signaled,
                dest,
                imm,
                data,
            } => {
                e.u64(*id)
                    .u64(*wr_id)
                    .u8(*signaled as u8)
                    .ud_param(dest)
                    .u8(imm.is_some() as u8)
                    .u32(imm.unwrap_or(0))
                    .bytes(data);
            }
            Request::Atomic {
                cmp_swap,
                id,
                wr_id,
                signaled,
                remote_addr,
                rkey,
                compare_add,
                swap,
                sge,
            } => {
                e.u8(*cmp_swap as u8)
                    .u64(*id)
                    .u64(*wr_id)
                    .u8(*signaled as u8)
                    .u64(*remote_addr)
                    .u32(*rkey)
                    .u64(*compare_add)
                    .u64(*swap)
                    .u64(sge.0)
                    .u32(sge.1)
                    .u32(sge.2);
            }
            Request::PostSendImm {
                id,
                wr_id,
                signaled,
                imm,
                sges,
            } => {
                e.u64(*id)
                    .u64(*wr_id)
                    .u8(*signaled as u8)
                    .u32(*imm)
                    .u32(sges.len() as u32);
                for &(addr, len, lkey) in sges {
                    e.u64(addr).u32(len).u32(lkey);
                }
            }
            Request::Rdma {
                write,
                imm,
                id,
                wr_id,
                signaled,
                remote_addr,
                rkey,
                sges,
            } => {
                e.u64(*id)
                    .u64(*wr_id)
                    .u8(*signaled as u8)
                    .u64(*remote_addr)
                    .u32(*rkey);
                if let (true, Some(imm)) = (write, imm) {
                    e.u32(*imm);
                }
                e.u32(sges.len() as u32);
                for &(addr, len, lkey) in sges {
                    e.u64(addr).u32(len).u32(lkey);
                }
            }
            Request::QueryAddrs { id } => {
                e.u64(*id);
            }
            Request::AckEvent { event } => {
                e.u64(*event);
            }
            Request::CreateCq { cqe, channel } => {
                e.u32(*cqe).u64(*channel);
            }
            Request::DestroyCq { cq } | Request::ReqNotifyCq { cq } => {
                e.u64(*cq);
            }
            Request::PollCq { cq, max } => {
                e.u64(*cq).u32(*max);
            }
            Request::CreateCompChannel => {}
            Request::DestroyCompChannel { channel } => {
                e.u64(*channel);
            }
            Request::RegMr { addr, len, access } => {
                e.u64(*addr).u64(*len).u32(*access);
            }
            Request::DeregMr { key } => {
                e.u32(*key);
            }
            Request::VerbsCreateQp {
                caps,
                send_cq,
                recv_cq,
                sq_sig_all,
                qp_type,
                srq,
            } => {
                e.caps(caps)
                    .u64(*send_cq)
                    .u64(*recv_cq)
                    .u8(*sq_sig_all as u8)
                    .u32(*qp_type)
                    .u64(*srq);
            }
            Request::ModifyQp { qp, mask, attr } => {
                e.u64(*qp).u32(*mask).verbs_attr(attr);
            }
            Request::QueryQp { qp } | Request::VerbsDestroyQp { qp } => {
                e.u64(*qp);
            }
            Request::QpPostRecv { qp, wr_id, len } | Request::PostSrqRecv { srq: qp, wr_id, len } => {
                e.u64(*qp).u64(*wr_id).u32(*len);
            }
            Request::CreateSrq {
                max_wr,
                max_sge,
                srq_limit,
            } => {
                e.u32(*max_wr).u32(*max_sge).u32(*srq_limit);
            }
            Request::ModifySrq {
                srq,
                mask,
                max_wr,
                srq_limit,
            } => {
                e.u64(*srq).u32(*mask).u32(*max_wr).u32(*srq_limit);
            }
            Request::QuerySrq { srq } | Request::DestroySrq { srq } => {
                e.u64(*srq);
            }
        }
        e
    }

    /// Reads a request datagram. Errors are the errno the daemon answers: `EPROTO` for what
    /// does not decode (an unknown op, a first message's op, a field cut short), `EINVAL` for a
    /// field that decodes and cannot be (no address where one is needed, an unknown port
    /// space, more than [`MAX_SGE`] entries, counted before they are read).
    pub fn decode(msg: &[u8]) -> Result<Request, i32> {
        use Invocation as I;
        let bad = |_: Malformed| libc::EPROTO;
        let mut d = Dec::new(msg);
        let op = Op::from_u32(d.u32().map_err(bad)?).ok_or(libc::EPROTO)?;
        let cm = |call| Ok(Request::Cm(call));
        match op {
            Op::Hello | Op::AttachChannel | Op::ProbeListener | Op::AttachCompChannel | Op::FabricHosts => {
                Err(libc::EPROTO)
            }
            Op::CreateChannel => cm(I::CreateEventChannel),
            Op::DestroyChannel => cm(I::DestroyEventChannel {
                channel: d.u64().map_err(bad)?,
            }),
            Op::CreateId => {
                let channel = d.u64().map_err(bad)?;
                let ps = PortSpace::from_raw(d.u32().map_err(bad)?).ok_or(libc::EINVAL)?;
                cm(I::CreateId { channel, ps })
            }
            Op::DestroyId => cm(I::DestroyId {
                id: d.u64().map_err(bad)?,
            }),
            Op::MigrateId => {
                let id = d.u64().map_err(bad)?;
                let channel = d.u64().map_err(bad)?;
                cm(I::MigrateId { id, channel })
            }
            Op::BindAddr => {
                let id = d.u64().map_err(bad)?;
                let addr = d.addr().map_err(bad)?.ok_or(libc::EINVAL)?;
                cm(I::BindAddr { id, addr })
            }
            Op::ResolveAddr => {
                let id = d.u64().map_err(bad)?;
                let src = d.addr().map_err(bad)?;
                let dst = d.addr().map_err(bad)?.ok_or(libc::EINVAL)?;
                let timeout = Duration::from_millis(d.u32().map_err(bad)?.into());
                cm(I::ResolveAddr {
                    id,
                    src,
                    dst,
                    timeout,
                })
            }
            Op::ResolveRoute => {
                let id = d.u64().map_err(bad)?;
                let timeout = Duration::from_millis(d.u32().map_err(bad)?.into());
                cm(I::ResolveRoute { id, timeout })
            }
            Op::DestroyQp => cm(I::DestroyQp {
                id: d.u64().map_err(bad)?,
            }),
            Op::Listen => {
                let id = d.u64().map_err(bad)?;
                cm(I::Listen {
                    id,
                    backlog: d.i32().map_err(bad)?,
                })
            }
            Op::Connect | Op::Accept => {
                let id = d.u64().map_err(bad)?;
                let param = d.param().map_err(bad)?;
                cm(if op == Op::Connect {
                    I::Connect { id, param }
                } else {
                    I::Accept { id, param }
                })
            }
            Op::Reject => {
                let id = d.u64().map_err(bad)?;
                let private_data = d.bytes().map_err(bad)?.to_vec();
                cm(I::Reject { id, private_data })
            }
            Op::Disconnect => cm(I::Disconnect {
                id: d.u64().map_err(bad)?,
            }),
            Op::PostRecv => {
                let id = d.u64().map_err(bad)?;
                let wr_id = d.u64().map_err(bad)?;
                cm(I::PostRecv {
                    id,
                    wr_id,
                    len: d.u32().map_err(bad)?,
                })
            }
            Op::JoinMcast | Op::LeaveMcast => {
                let id = d.u64().map_err(bad)?;
                let group = d.addr().map_err(bad)?.ok_or(libc::EINVAL)?;
                cm(if op == Op::JoinMcast {
                    I::JoinMulticast { id, group }
                } else {
                    I::LeaveMulticast { id, group }
                })
            }
            Op::CreateQp => Ok(Request::CreateQp {
                id: d.u64().map_err(bad)?,
                caps: d.caps().map_err(bad)?,
                send_cq: d.u64().map_err(bad)?,
                recv_cq: d.u64().map_err(bad)?,
                sq_sig_all: d.u8().map_err(bad)? != 0,
                qp_type: d.u32().map_err(bad)?,
                srq: d.u64().map_err(bad)?,
            }),
            Op::PostSend => Ok(Request::PostSend {
                id: d.u64().map_err(bad)?,
                wr_id: d.u64().map_err(bad)?,
                signaled: d.u8().map_err(bad)? != 0,
                data: d.bytes().map_err(bad)?.to_vec(),
            }),
            Op::PostSendUd => {
                let id = d.u64().map_err(bad)?;
                let wr_id = d.u64().map_err(bad)?;
                let signaled = d.u8().map_err(bad)? != 0;
                let dest = d.ud_param().map_err(bad)?;
                let with_imm = d.u8().map_err(bad)? != 0;
                let imm = d.u32().map_err(bad)?;
                Ok(Request::PostSendUd {
                    id,
                    wr_id,
                    signaled,
                    dest,
                    imm: with_imm.then_some(imm),
                    data: d.bytes().map_err(bad)?.to_vec(),
                })
            }
            Op::Atomic => Ok(Request::Atomic {
                cmp_swap: d.u8().map_err(bad)? != 0,
                id: d.u64().map_err(bad)?,
                wr_id: d.u64().map_err(bad)?,
                signaled: d.u8().map_err(bad)? != 0,
                remote_addr: d.u64().map_err(bad)?,
                rkey: d.u32().map_err(bad)?,
                compare_add: d.u64().map_err(bad)?,
                swap: d.u64().map_err(bad)?,
                sge: (
                    d.u64().map_err(bad)?,
                    d.u32().map_err(bad)?,
                    d.u32().map_err(bad)?,
                ),
            }),
            Op::PostSendImm => {
                let id = d.u64().map_err(bad)?;
                let wr_id = d.u64().map_err(bad)?;
                let signaled = d.u8().map_err(bad)? != 0;
                let imm = d.u32().map_err(bad)?;
                let n = d.u32().map_err(bad)? as usize;
                // More entries than any QP takes is refused, not an allocation.
                if n > MAX_SGE {
                    return Err(libc::EINVAL);
                }
                let mut sges = Vec::with_capacity(n);
                for _ in 0..n {
                    sges.push((
                        d.u64().map_err(bad)?,
                        d.u32().map_err(bad)?,
                        d.u32().map_err(bad)?,
                    ));
                }
                Ok(Request::PostSendImm {
                    id,
                    wr_id,
                    signaled,
                    imm,
                    sges,
                })
            }
            Op::RdmaWrite | Op::RdmaRead | Op::RdmaWriteImm => {
                let id = d.u64().map_err(bad)?;
                let wr_id = d.u64().map_err(bad)?;
                let signaled = d.u8().map_err(bad)? != 0;
                let remote_addr = d.u64().map_err(bad)?;
                let rkey = d.u32().map_err(bad)?;
                let imm = if op == Op::RdmaWriteImm {
                    Some(d.u32().map_err(bad)?)
                } else {
                    None
                };
                let n = d.u32().map_err(bad)? as usize;
                // More entries than any QP takes is refused, not an allocation.
                if n > MAX_SGE {
                    return Err(libc::EINVAL);
                }
                let mut sges = Vec::with_capacity(n);
                for _ in 0..n {
                    sges.push((
                        d.u64().map_err(bad)?,
                        d.u32().map_err(bad)?,
                        d.u32().map_err(bad)?,
                    ));
                }
                Ok(Request::Rdma {
                    write: op != Op::RdmaRead,
                    imm,
                    id,
                    wr_id,
                    signaled,
                    remote_addr,
                    rkey,
                    sges,
                })
            }
            Op::QueryAddrs => Ok(Request::QueryAddrs {
                id: d.u64().map_err(bad)?,
            }),
            Op::AckEvent => Ok(Request::AckEvent {
                event: d.u64().map_err(bad)?,
            }),
            Op::CreateCq => Ok(Request::CreateCq {
                cqe: d.u32().map_err(bad)?,
                channel: d.u64().map_err(bad)?,
            }),
            Op::DestroyCq => Ok(Request::DestroyCq {
                cq: d.u64().map_err(bad)?,
            }),
            Op::PollCq => Ok(Request::PollCq {
                cq: d.u64().map_err(bad)?,
                max: d.u32().map_err(bad)?,
            }),
            Op::ReqNotifyCq => Ok(Request::ReqNotifyCq {
                cq: d.u64().map_err(bad)?,
            }),
            Op::CreateCompChannel => Ok(Request::CreateCompChannel),
            Op::DestroyCompChannel => Ok(Request::DestroyCompChannel {
                channel: d.u64().map_err(bad)?,
            }),
            Op::RegMr => Ok(Request::RegMr {
                addr: d.u64().map_err(bad)?,
                len: d.u64().map_err(bad)?,
                access: d.u32().map_err(bad)?,
            }),
            Op::DeregMr => Ok(Request::DeregMr {
                key: d.u32().map_err(bad)?,
            }),
            Op::VerbsCreateQp => Ok(Request::VerbsCreateQp {
                caps: d.caps().map_err(bad)?,
                send_cq: d.u64().map_err(bad)?,
                recv_cq: d.u64().map_err(bad)?,
                sq_sig_all: d.u8().map_err(bad)? != 0,
                qp_type: d.u32().map_err(bad)?,
                srq: d.u64().map_err(bad)?,
            }),
            Op::ModifyQp => {
                let qp = d.u64().map_err(bad)?;
                let mask = d.u32().map_err(bad)?;
                // A state past IBV_QPS_ERR is uverbs' EINVAL.
                let attr = d.verbs_attr().map_err(bad)?.ok_or(libc::EINVAL)?;
                Ok(Request::ModifyQp { qp, mask, attr })
            }
            Op::QueryQp => Ok(Request::QueryQp {
                qp: d.u64().map_err(bad)?,
            }),
            Op::VerbsDestroyQp => Ok(Request::VerbsDestroyQp {
                qp: d.u64().map_err(bad)?,
            }),
            Op::QpPostRecv => Ok(Request::QpPostRecv {
                qp: d.u64().map_err(bad)?,
                wr_id: d.u64().map_err(bad)?,
                len: d.u32().map_err(bad)?,
            }),
            Op::CreateSrq => Ok(Request::CreateSrq {
                max_wr: d.u32().map_err(bad)?,
                max_sge: d.u32().map_err(bad)?,
                srq_limit: d.u32().map_err(bad)?,
            }),
            Op::ModifySrq => Ok(Request::ModifySrq {
                srq: d.u64().map_err(bad)?,
                mask: d.u32().map_err(bad)?,
                max_wr: d.u32().map_err(bad)?,
                srq_limit: d.u32().map_err(bad)?,
            }),
            Op::QuerySrq => Ok(Request::QuerySrq {
                srq: d.u64().map_err(bad)?,
            }),
            Op::DestroySrq => Ok(Request::DestroySrq {
                srq: d.u64().map_err(bad)?,
            }),
            Op::PostSrqRecv => Ok(Request::PostSrqRecv {
                srq: d.u64().map_err(bad)?,
                wr_id: d.u64().map_err(bad)?,
                len: d.u32().map_err(bad)?,
            }),
            Op::InitQpAttr => {
                let id = d.u64().map_err(bad)?;
                let state = VerbsQpState::from_raw(d.u32().map_err(bad)?).ok_or(libc::EINVAL)?;
                let qp_state = qp_state_of(state).ok_or(libc::EINVAL)?;
                cm(I::InitQpAttr { id, qp_state })
            }
            Op::Establish => cm(I::Establish {
                id: d.u64().map_err(bad)?,
            }),
        }
    }
}

/// The first message on a fresh connection to the daemon, which says what the connection is
/// for: a process's control socket (its hello), one of its channel sockets, or a one-shot
/// probe from `cmsim-run`. After a hello every datagram is a [`Request`].
///
/// ```
/// use cm_dropin::request::Opening;
///
/// let hello = Opening::hello(4242, "10.0.0.1", "rping");
/// assert_eq!(Opening::decode(&hello.encode().0), Ok(hello));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Opening {
    /// A process attaching (→ [`Welcome`], or an errno alone: `EPROTONOSUPPORT` for another
    /// version or none, `EPERM` for a pid that is not the sender's, `ENODEV` for a host the
    /// fabric lacks).
    Hello {
        /// The pid the process states; the daemon believes the kernel's, and refuses a
        /// hello where they differ.
        pid: u32,
        /// The simulated host's address as text (empty: host 0).
        host: String,
        /// `argv[0]`, whatever bytes it holds: shown in the daemon's messages, not checked.
        argv0: Vec<u8>,
        /// The protocol it speaks (`None`: a hello from before versions were said).
        version: Option<u32>,
    },
    /// Whether anything listens at `addr` (→ `0: i32, found: u8`); `None` finds nothing.
    ProbeListener {
        /// The address asked about.
        addr: Option<std::net::SocketAddr>,
    },
    /// The fabric's hosts and the loopback addresses their programs' own sockets use (→
    /// [`FabricHosts`]).
    FabricHosts,
    /// This socket becomes the event channel `channel` of process `proc` (→
    /// [`CHAN_ATTACHED`](crate::proto::CHAN_ATTACHED); silence when refused).
    AttachChannel {
        /// The process's token.
        proc: u64,
        /// The channel's token.
        channel: u64,
    },
    /// This socket becomes the completion channel `channel` of process `proc`.
    AttachCompChannel {
        /// The process's token.
        proc: u64,
        /// The channel's token.
        channel: u64,
    },
}

impl Opening {
    /// The hello of process `pid` on the simulated host `host`, named `argv0`, speaking
    /// [`PROTOCOL_VERSION`](crate::proto::PROTOCOL_VERSION).
    pub fn hello(pid: u32, host: &str, argv0: &str) -> Opening {
        Opening::Hello {
            pid,
            host: host.to_string(),
            argv0: argv0.as_bytes().to_vec(),
            version: Some(crate::proto::PROTOCOL_VERSION),
        }
    }

    /// The datagram.
    pub fn encode(&self) -> Enc {
        match self {
            Opening::Hello {
                pid,
                host,
                argv0,
                version,
            } => {
                let mut e = Enc::op(Op::Hello);
                e.u32(*pid).bytes(host.as_bytes()).bytes(argv0);
                if let Some(v) = version {
                    e.u32(*v);
                }
                e
            }
            Opening::ProbeListener { addr } => {
                let mut e = Enc::op(Op::ProbeListener);
                e.addr(*addr);
                e
            }
            Opening::FabricHosts => Enc::op(Op::FabricHosts),
            Opening::AttachChannel { proc, channel } | Opening::AttachCompChannel { proc, channel } => {
                let op = if matches!(self, Opening::AttachChannel { .. }) {
                    Op::AttachChannel
                } else {
                    Op::AttachCompChannel
                };
                let mut e = Enc::op(op);
                e.u64(*proc).u64(*channel);
                e
            }
        }
    }

    /// Reads a first message: `Err(EPROTO)` for anything else (a request's op, an unknown
    /// op, a field cut short, a host that is not text).
    pub fn decode(msg: &[u8]) -> Result<Opening, i32> {
        let bad = |_: Malformed| libc::EPROTO;
        let mut d = Dec::new(msg);
        match Op::from_u32(d.u32().map_err(bad)?).ok_or(libc::EPROTO)? {
            Op::Hello => {
                let pid = d.u32().map_err(bad)?;
                let host = d.str().map_err(bad)?.to_string();
                let argv0 = d.bytes().map_err(bad)?.to_vec();
                let version = d.u32().ok();
                Ok(Opening::Hello {
                    pid,
                    host,
                    argv0,
                    version,
                })
            }
            Op::ProbeListener => Ok(Opening::ProbeListener {
                addr: d.addr().map_err(bad)?,
            }),
            Op::FabricHosts => Ok(Opening::FabricHosts),
            op @ (Op::AttachChannel | Op::AttachCompChannel) => {
                let proc = d.u64().map_err(bad)?;
                let channel = d.u64().map_err(bad)?;
                Ok(if op == Op::AttachChannel {
                    Opening::AttachChannel { proc, channel }
                } else {
                    Opening::AttachCompChannel { proc, channel }
                })
            }
            _ => Err(libc::EPROTO),
        }
    }
}

/// The daemon's answer to [`Opening::FabricHosts`]: what `cmsim-run` hands a program
/// ([`HOSTS_ENV`](crate::proto::HOSTS_ENV), [`LOOPBACK_ENV`](crate::proto::LOOPBACK_ENV)) so
/// that its own sockets between simulated hosts meet on loopback addresses of their own.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FabricHosts {
    /// The loopback /24 (`127.A.B.0`, `A` never 0) whose `.1 + i` stands for host `i`.
    pub loopback: std::net::Ipv4Addr,
    /// The hosts' addresses, in index order.
    pub hosts: Vec<std::net::IpAddr>,
}

impl FabricHosts {
    /// The reply datagram (its status, 0, first).
    pub fn encode(&self) -> Enc {
        let mut e = Enc::default();
        e.i32(0)
            .addr(Some(std::net::SocketAddr::new(self.loopback.into(), 0)))
            .u32(self.hosts.len() as u32);
        for h in &self.hosts {
            e.addr(Some(std::net::SocketAddr::new(*h, 0)));
        }
        e
    }

    /// Reads the reply: `EPROTO` for one that does not decode (a count past its addresses, an
    /// IPv6 loopback), or the errno the daemon answered.
    pub fn decode(msg: &[u8]) -> Result<FabricHosts, i32> {
        let bad = |_: Malformed| libc::EPROTO;
        let mut d = Dec::new(msg);
        match d.i32().map_err(bad)? {
            0 => {}
            errno => return Err(errno),
        }
        let loopback = match d.addr().map_err(bad)?.map(|a| a.ip()) {
            Some(std::net::IpAddr::V4(v4)) => v4,
            _ => return Err(libc::EPROTO),
        };
        let n = d.u32().map_err(bad)?;
        // Each address takes at least one byte: a count beyond the bytes left is a lie, and
        // no allocation follows it.
        if n as usize > msg.len() {
            return Err(libc::EPROTO);
        }
        let mut hosts = Vec::with_capacity(n as usize);
        for _ in 0..n {
            hosts.push(d.addr().map_err(bad)?.ok_or(libc::EPROTO)?.ip());
        }
        Ok(FabricHosts { loopback, hosts })
    }
}

/// The daemon's answer to a [`Opening::Hello`] it takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Welcome {
    /// The process's token, which its channel sockets name.
    pub proc: u64,
    /// Its simulated host's index.
    pub host_index: u32,
    /// Its simulated host's address.
    pub host_addr: std::net::IpAddr,
    /// The daemon's pid, which the process lets trace it (RDMA READ and WRITE).
    pub daemon_pid: u32,
}

impl Welcome {
    /// The reply datagram (its status, 0, first).
    pub fn encode(&self) -> Enc {
        let mut e = Enc::default();
        e.i32(0).u64(self.proc).u32(self.host_index);
        e.addr(Some(std::net::SocketAddr::new(self.host_addr, 0)))
            .u32(self.daemon_pid);
        e
    }

    /// Reads a reply to a hello: the welcome, or the errno the daemon refused it with
    /// (`EPROTO` for a reply that does not decode).
    pub fn decode(msg: &[u8]) -> Result<Welcome, i32> {
        let bad = |_: Malformed| libc::EPROTO;
        let mut d = Dec::new(msg);
        match d.i32().map_err(bad)? {
            0 => {}
            errno => return Err(errno),
        }
        Ok(Welcome {
            proc: d.u64().map_err(bad)?,
            host_index: d.u32().map_err(bad)?,
            host_addr: d.addr().map_err(bad)?.ok_or(libc::EPROTO)?.ip(),
            daemon_pid: d.u32().map_err(bad)?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cm_core::{group_ud_param, ConnParam};

    /// One request of every kind the protocol carries.
    fn every_request() -> Vec<Request> {
        use Invocation as I;
        let addr = "10.0.0.2:7471".parse().unwrap();
        let group = "239.1.2.3:0".parse().unwrap();
        let mut caps = QpCaps::new();
        caps.max_send_wr = 3;
        caps.max_inline_data = 64;
        let cm = [
            I::CreateEventChannel,
            I::DestroyEventChannel { channel: 1 },
            I::CreateId {
                channel: 1,
                ps: PortSpace::Udp,
            },
            I::DestroyId { id: 2 },
            I::BindAddr { id: 2, addr },
            I::ResolveAddr {
                id: 2,
                src: Some("[fe80::1]:9".parse().unwrap()),
                dst: addr,
                timeout: Duration::from_millis(2000),
            },
            I::ResolveRoute {
                id: 2,
                timeout: Duration::from_millis(10),
            },
            I::DestroyQp { id: 2 },
            I::Listen { id: 2, backlog: -1 },
            I::Connect {
                id: 2,
                param: ConnParam::new().with_private_data(b"hello"),
            },
            I::Accept {
                id: 2,
                param: ConnParam {
                    srq: true,
                    qp_num: 17,
                    ..ConnParam::ZERO
                },
            },
            I::Reject {
                id: 2,
                private_data: vec![1, 2, 3],
            },
            I::Disconnect { id: 2 },
            I::PostRecv {
                id: 2,
                wr_id: 9,
                len: 4096,
            },
            I::JoinMulticast { id: 2, group },
            I::LeaveMulticast { id: 2, group },
            I::InitQpAttr {
                id: 2,
                qp_state: QpState::Rtr,
            },
            I::Establish { id: 2 },
            I::MigrateId { id: 2, channel: 3 },
        ];
        let mut all: Vec<Request> = cm.into_iter().map(Request::Cm).collect();
        all.extend([
            Request::CreateQp {
                id: 2,
                caps,
                send_cq: 4,
                recv_cq: 5,
                sq_sig_all: true,
                qp_type: 4,
                srq: 0x45,
            },
            Request::PostSend {
                id: 2,
                wr_id: 1,
                signaled: true,
                data: vec![7; 100],
            },
            Request::PostSendUd {
                id: 2,
                wr_id: 1,
                signaled: false,
                dest: group_ud_param(group.ip()),
                imm: Some(0x1234),
                data: vec![8; 10],
            },
            Request::Rdma {
                write: false,
                imm: None,
                id: 2,
                wr_id: 3,
                signaled: true,
                remote_addr: 0x1000,
                rkey: 77,
                sges: vec![(0x2000, 16, 5), (0x3000, 8, 6)],
            },
            Request::Rdma {
                write: true,
                imm: Some(0x0102_0304),
                id: 2,
                wr_id: 6,
                signaled: false,
                remote_addr: 0x1000,
                rkey: 77,
                sges: vec![(0x2000, 16, 5)],
            },
            Request::Atomic {
                cmp_swap: true,
                id: 2,
                wr_id: 5,
                signaled: true,
                remote_addr: 0x1008,
                rkey: 77,
                compare_add: 1,
                swap: 2,
                sge: (0x2000, 8, 5),
            },
            Request::PostSendImm {
                id: 2,
                wr_id: 4,
                signaled: false,
                imm: 0x7856_3412,
                sges: vec![(0x2000, 16, 5)],
            },
            Request::QueryAddrs { id: 2 },
            Request::AckEvent { event: 99 },
            Request::CreateCq { cqe: 16, channel: 0 },
            Request::DestroyCq { cq: 4 },
            Request::PollCq { cq: 4, max: 16 },
            Request::ReqNotifyCq { cq: 4 },
            Request::CreateCompChannel,
            Request::DestroyCompChannel { channel: 6 },
            Request::RegMr {
                addr: 0x2000,
                len: 4096,
                access: 7,
            },
            Request::DeregMr { key: 5 },
            Request::VerbsCreateQp {
                caps,
                send_cq: 4,
                recv_cq: 4,
                sq_sig_all: false,
                qp_type: 2,
                srq: 0x44,
            },
            Request::ModifyQp {
                qp: 0x12,
                mask: 0x1f_ffff,
                attr: VerbsQpAttr {
                    qp_state: VerbsQpState::Rtr,
                    cur_qp_state: VerbsQpState::Init,
                    path_mtu: 3,
                    dest_qp_num: 0x33,
                    rq_psn: 0xabcdef,
                    max_dest_rd_atomic: 1,
                    min_rnr_timer: 12,
                    pkey_index: 0,
                    ah_attr: AddressVector {
                        grh: Some(GlobalRoute {
                            dgid: [9; 16],
                            sgid_index: 1,
                            hop_limit: 64,
                            ..GlobalRoute::default()
                        }),
                        port_num: 1,
                        ..AddressVector::default()
                    },
                    rate_limit: 7,
                    ..VerbsQpAttr::default()
                },
            },
            Request::QueryQp { qp: 0x12 },
            Request::VerbsDestroyQp { qp: 0x12 },
            Request::QpPostRecv {
                qp: 0x12,
                wr_id: 3,
                len: 64,
            },
            Request::CreateSrq {
                max_wr: 500,
                max_sge: 1,
                srq_limit: 7,
            },
            Request::ModifySrq {
                srq: 0x44,
                mask: 3,
                max_wr: 600,
                srq_limit: 9,
            },
            Request::QuerySrq { srq: 0x44 },
            Request::DestroySrq { srq: 0x44 },
            Request::PostSrqRecv {
                srq: 0x44,
                wr_id: 4,
                len: 32,
            },
        ]);
        all
    }

    #[test]
    fn every_request_survives_encoding_and_decoding_and_has_an_op_of_its_own() {
        let all = every_request();
        let mut ops: Vec<u32> = all.iter().map(|r| r.op().expect("carried") as u32).collect();
        for req in all {
            assert_eq!(Request::decode(&req.encode().0), Ok(req.clone()), "{req:?}");
        }
        ops.sort_unstable();
        ops.dedup();
        // RdmaWrite shares its variant with RdmaRead; the first messages are not requests.
        assert_eq!(ops.len(), 52 - 5 - 1, "{ops:?}");
    }

    #[test]
    fn a_request_cut_anywhere_is_malformed_and_not_a_shorter_request() {
        for req in every_request() {
            let whole = req.encode().0;
            for cut in 0..whole.len() {
                assert_eq!(
                    Request::decode(&whole[..cut]),
                    Err(libc::EPROTO),
                    "{req:?} cut at {cut}"
                );
            }
        }
    }

    #[test]
    fn fields_that_decode_but_cannot_be_are_refused_as_invalid() {
        let mut no_addr = Enc::op(Op::BindAddr);
        no_addr.u64(1).addr(None);
        assert_eq!(Request::decode(&no_addr.0), Err(libc::EINVAL));
        let mut no_port_space = Enc::op(Op::CreateId);
        no_port_space.u64(1).u32(0x0999);
        assert_eq!(Request::decode(&no_port_space.0), Err(libc::EINVAL));
        let mut too_many = Enc::op(Op::RdmaWrite);
        too_many.u64(1).u64(1).u8(1).u64(0).u32(0).u32(MAX_SGE as u32 + 1);
        assert_eq!(
            Request::decode(&too_many.0),
            Err(libc::EINVAL),
            "counted before read"
        );
        assert_eq!(
            Request::decode(&Enc::hello(1, "10.0.0.1", "x").0),
            Err(libc::EPROTO),
            "a first message"
        );
        assert_eq!(Request::decode(&777u32.to_le_bytes()), Err(libc::EPROTO));
        let mut bad_state = Request::ModifyQp {
            qp: 1,
            mask: 1,
            attr: VerbsQpAttr::default(),
        }
        .encode();
        bad_state.0[16..20].copy_from_slice(&7u32.to_le_bytes());
        assert_eq!(
            Request::decode(&bad_state.0),
            Err(libc::EINVAL),
            "a QP state past ERR"
        );
        let mut sqd = Request::Cm(Invocation::InitQpAttr {
            id: 1,
            qp_state: QpState::Rts,
        })
        .encode();
        sqd.0[12..16].copy_from_slice(&4u32.to_le_bytes());
        assert_eq!(
            Request::decode(&sqd.0),
            Err(libc::EINVAL),
            "rdma_init_qp_attr of SQD"
        );
    }

    #[test]
    fn calls_the_protocol_does_not_carry_have_no_op() {
        let local = Request::Cm(Invocation::GetLocalAddr { id: 1 });
        assert_eq!(local.op(), None);
    }

    fn every_opening() -> Vec<Opening> {
        vec![
            Opening::hello(4242, "10.0.0.1", "rping"),
            Opening::Hello {
                pid: 1,
                host: String::new(),
                argv0: vec![0xff, 0xfe],
                version: None,
            },
            Opening::ProbeListener {
                addr: Some("10.0.0.1:7471".parse().unwrap()),
            },
            Opening::ProbeListener { addr: None },
            Opening::FabricHosts,
            Opening::AttachChannel { proc: 3, channel: 9 },
            Opening::AttachCompChannel { proc: 3, channel: 10 },
        ]
    }

    #[test]
    fn every_first_message_survives_encoding_and_decoding_and_is_no_request() {
        for o in every_opening() {
            let msg = o.encode().0;
            assert_eq!(Opening::decode(&msg), Ok(o.clone()), "{o:?}");
            assert_eq!(Request::decode(&msg), Err(libc::EPROTO), "{o:?}");
        }
        for req in every_request() {
            assert_eq!(Opening::decode(&req.encode().0), Err(libc::EPROTO), "{req:?}");
        }
    }

    #[test]
    fn a_first_message_cut_short_is_malformed_and_a_hello_cut_at_its_version_has_none() {
        for o in every_opening() {
            let whole = o.encode().0;
            let versioned = matches!(o, Opening::Hello { version: Some(_), .. });
            for cut in 0..whole.len() {
                let got = Opening::decode(&whole[..cut]);
                if versioned && cut >= whole.len() - 4 {
                    let Ok(Opening::Hello { version, .. }) = got else {
                        panic!("{o:?} cut at {cut}: {got:?}");
                    };
                    assert_eq!(version, None, "{o:?} cut at {cut}");
                } else {
                    assert_eq!(got, Err(libc::EPROTO), "{o:?} cut at {cut}");
                }
            }
        }
    }

    #[test]
    fn a_hello_whose_host_is_not_text_is_malformed() {
        let mut e = Enc::op(Op::Hello);
        e.u32(1)
            .bytes(&[0xff])
            .bytes(b"x")
            .u32(crate::proto::PROTOCOL_VERSION);
        assert_eq!(Opening::decode(&e.0), Err(libc::EPROTO));
    }

    #[test]
    fn the_fabric_hosts_survive_encoding_and_a_reply_cut_short_is_malformed() {
        let h = FabricHosts {
            loopback: "127.9.8.0".parse().unwrap(),
            hosts: vec!["10.0.0.1".parse().unwrap(), "fd00::2".parse().unwrap()],
        };
        let msg = h.encode().0;
        assert_eq!(FabricHosts::decode(&msg), Ok(h));
        for cut in 0..msg.len() {
            assert_eq!(
                FabricHosts::decode(&msg[..cut]),
                Err(libc::EPROTO),
                "cut at {cut}"
            );
        }
        let mut lie = Enc::default();
        lie.i32(0)
            .addr(Some("127.9.8.0:0".parse().unwrap()))
            .u32(u32::MAX);
        assert_eq!(FabricHosts::decode(&lie.0), Err(libc::EPROTO));
    }

    #[test]
    fn a_welcome_survives_encoding_and_a_refusal_is_its_errno() {
        let w = Welcome {
            proc: 77,
            host_index: 1,
            host_addr: "fd00::2".parse().unwrap(),
            daemon_pid: 4000,
        };
        let msg = w.encode().0;
        assert_eq!(Welcome::decode(&msg), Ok(w));
        for cut in 4..msg.len() {
            assert_eq!(Welcome::decode(&msg[..cut]), Err(libc::EPROTO), "cut at {cut}");
        }
        let mut refused = Enc::default();
        refused.i32(libc::EPROTONOSUPPORT);
        assert_eq!(Welcome::decode(&refused.0), Err(libc::EPROTONOSUPPORT));
        assert_eq!(Welcome::decode(&[]), Err(libc::EPROTO));
    }
}
