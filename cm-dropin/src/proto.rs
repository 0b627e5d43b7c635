//! The wire protocol between the drop-in library and the fabric daemon.
//!
//! Every message is one `SOCK_SEQPACKET` datagram, so framing is the kernel's. A request is
//! `op: u32` then its fields ([`Request`](crate::request::Request) is the typed value and its
//! codec); the reply is `errno: i32` (0 on success) then the result fields. Channel sockets
//! carry daemon-to-process datagrams only: [`CHAN_ATTACHED`] once, then one [`CHAN_EVENT`] per
//! CM event. Fields are little-endian; each cm-core type has one codec here ([`Enc::param`]
//! and [`Dec::param`] for [`ConnParam`], [`Enc::ud_param`] for [`UdParam`], ...), which both
//! ends use.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr};

use cm_core::{AhAttr, ConnParam, PrivateData, UdParam};

/// The version of this protocol, said in every hello: a library and a daemon of different
/// builds refuse each other with a message instead of misreading each other's messages.
/// Raised whenever a message's layout changes.
pub const PROTOCOL_VERSION: u32 = 11;

/// Environment variable: the daemon's socket path.
pub const SOCKET_ENV: &str = "CMSIM_SOCKET";
/// Environment variable: the simulated host (one of its addresses) the process runs on.
pub const HOST_ENV: &str = "CMSIM_HOST";
/// Environment variable (set by `cmsim-run`): the fabric's host addresses in index order,
/// comma-separated, for the programs' own TCP and UDP sockets between simulated hosts
/// ([`sockets`](crate::sockets)).
pub const HOSTS_ENV: &str = "CMSIM_HOSTS";
/// Environment variable (set by `cmsim-run`): the loopback /24 (`127.A.B.0`) whose `.1` to
/// `.254` stand for the fabric's hosts 0 to 253 on the programs' own sockets.
pub const LOOPBACK_ENV: &str = "CMSIM_LOOPBACK";

/// The first field of every datagram a process sends: which message it is. The layouts are
/// the codecs of [`Request`](crate::request::Request) and, for the first message of a
/// connection, [`Opening`](crate::request::Opening).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[repr(u32)]
pub enum Op {
    /// `pid: u32, host: str, argv0: str, version: u32` ([`PROTOCOL_VERSION`]) → `proc: u64,
    /// host_index: u32, host_addr: addr, daemon_pid: u32`; `EPROTONOSUPPORT` for another
    /// version (or none), `EPERM` for a pid that is not the sender's. Build it with
    /// [`Opening::hello`](crate::request::Opening::hello).
    Hello = 1,
    /// `rdma_create_event_channel`.
    CreateChannel,
    /// `rdma_destroy_event_channel`.
    DestroyChannel,
    /// Sent as the first datagram of a channel socket: `proc: u64, channel: u64`.
    AttachChannel,
    /// `rdma_create_id`.
    CreateId,
    /// `rdma_destroy_id`.
    DestroyId,
    /// `rdma_bind_addr`.
    BindAddr,
    /// `rdma_resolve_addr`.
    ResolveAddr,
    /// `rdma_resolve_route`.
    ResolveRoute,
    /// `rdma_create_qp`.
    CreateQp,
    /// `rdma_destroy_qp`.
    DestroyQp,
    /// `rdma_listen`.
    Listen,
    /// `rdma_connect`.
    Connect,
    /// `rdma_accept`.
    Accept,
    /// `rdma_reject`.
    Reject,
    /// `rdma_disconnect`.
    Disconnect,
    /// `rdma_ack_cm_event` (not answered).
    AckEvent,
    /// An id's addresses.
    QueryAddrs,
    /// `ibv_create_cq`.
    CreateCq,
    /// `ibv_destroy_cq`.
    DestroyCq,
    /// `ibv_poll_cq`.
    PollCq,
    /// `ibv_post_send` of a SEND.
    PostSend,
    /// `ibv_post_recv`.
    PostRecv,
    /// Sent as the first datagram of a connection that is not a process: `addr` → `u8`, 1
    /// when some id listens there (the wrapper's `--wait-for-listener`).
    ProbeListener,
    /// `ibv_create_comp_channel`.
    CreateCompChannel,
    /// `ibv_destroy_comp_channel`.
    DestroyCompChannel,
    /// Sent as the first datagram of a completion channel's socket: `proc: u64, channel: u64`.
    AttachCompChannel,
    /// `ibv_req_notify_cq`.
    ReqNotifyCq,
    /// `ibv_reg_mr`.
    RegMr,
    /// `ibv_dereg_mr`.
    DeregMr,
    /// `ibv_post_send` of an RDMA WRITE.
    RdmaWrite,
    /// `ibv_post_send` of an RDMA READ.
    RdmaRead,
    /// `ibv_post_send` on a UD QP.
    PostSendUd,
    /// `rdma_join_multicast`.
    JoinMcast,
    /// `rdma_leave_multicast`.
    LeaveMcast,
    /// Sent as the first datagram of a connection that is not a process (`cmsim-run` before it
    /// starts a program): → `0: i32, loopback: addr, count: u32, count × addr`, the fabric's
    /// hosts in index order and the loopback /24 their sockets use
    /// ([`FabricHosts`](crate::request::FabricHosts)).
    FabricHosts,
    /// `ibv_create_qp` (a QP no id owns).
    VerbsCreateQp,
    /// `ibv_modify_qp`.
    ModifyQp,
    /// `ibv_query_qp` of a QP no id owns.
    QueryQp,
    /// `ibv_destroy_qp` of a QP no id owns.
    VerbsDestroyQp,
    /// `ibv_post_recv` on a QP no id owns.
    QpPostRecv,
    /// `rdma_init_qp_attr`.
    InitQpAttr,
    /// `rdma_establish`.
    Establish,
    /// `ibv_post_send` of an `IBV_WR_SEND_WITH_IMM` on a connected QP, over registered memory.
    PostSendImm,
    /// `ibv_post_send` of an `IBV_WR_ATOMIC_CMP_AND_SWP` or `IBV_WR_ATOMIC_FETCH_AND_ADD`.
    Atomic,
    /// `ibv_post_send` of an `IBV_WR_RDMA_WRITE_WITH_IMM`: an [`RdmaWrite`](Op::RdmaWrite)
    /// with the immediate after the remote key.
    RdmaWriteImm,
    /// `ibv_create_srq`.
    CreateSrq,
    /// `ibv_modify_srq`.
    ModifySrq,
    /// `ibv_query_srq`.
    QuerySrq,
    /// `ibv_destroy_srq`.
    DestroySrq,
    /// `ibv_post_srq_recv`.
    PostSrqRecv,
    /// `rdma_migrate_id`: `id: u64, channel: u64`; the id's events not yet retrieved follow it.
    MigrateId,
}

/// The QP number that addresses a multicast group.
pub const MCAST_QPN: u32 = 0x00FF_FFFF;

/// Completion-channel datagram: one completion event, `cq: u64`.
pub const CHAN_COMP: u8 = 3;

/// The largest message a QP may carry: a completion with its bytes must fit in one datagram.
pub const MAX_MESSAGE: u32 = 128 * 1024;

/// The most entries a CQ may have: rxe's `max_cqe` (`RXE_MAX_LOG_CQE` 15), which its
/// `rxe_cq_chk_attr` holds `ibv_create_cq` to (`EINVAL` past it, and for none).
pub const MAX_CQE: u32 = (1 << 15) - 1;

/// One work completion as the daemon reports it to `ibv_poll_cq`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct WireWc {
    /// `wr_id`.
    pub wr_id: u64,
    /// The QP's id token (the library maps it to `qp_num`).
    pub id: u64,
    /// `enum ibv_wc_status`.
    pub status: u32,
    /// `enum ibv_wc_opcode`.
    pub opcode: u32,
    /// `byte_len`.
    pub byte_len: u32,
    /// The received bytes (successful receives), scattered by the library into the posted buffers.
    pub data: Vec<u8>,
    /// `src_qp` (UD receives: the sender's QP).
    pub src_qp: u32,
    /// `imm_data` (as the sender gave it, network order).
    pub imm_data: u32,
    /// `wc_flags` (`IBV_WC_GRH`, `IBV_WC_WITH_IMM`).
    pub wc_flags: u32,
}

impl Enc {
    /// Appends a work completion.
    pub fn wc(&mut self, wc: &WireWc) -> &mut Self {
        self.u64(wc.wr_id)
            .u64(wc.id)
            .u32(wc.status)
            .u32(wc.opcode)
            .u32(wc.byte_len)
            .bytes(&wc.data)
            .u32(wc.src_qp)
            .u32(wc.imm_data)
            .u32(wc.wc_flags)
    }
}

impl Dec<'_> {
    /// Reads a work completion.
    pub fn wc(&mut self) -> Result<WireWc, Malformed> {
        Ok(WireWc {
            wr_id: self.u64()?,
            id: self.u64()?,
            status: self.u32()?,
            opcode: self.u32()?,
            byte_len: self.u32()?,
            data: self.bytes()?.to_vec(),
            src_qp: self.u32()?,
            imm_data: self.u32()?,
            wc_flags: self.u32()?,
        })
    }
}

impl Op {
    /// The op for a wire value.
    pub fn from_u32(v: u32) -> Option<Op> {
        use Op::*;
        const ALL: [Op; 52] = [
            Hello,
            CreateChannel,
            DestroyChannel,
            AttachChannel,
            CreateId,
            DestroyId,
            BindAddr,
            ResolveAddr,
            ResolveRoute,
            CreateQp,
            DestroyQp,
            Listen,
            Connect,
            Accept,
            Reject,
            Disconnect,
            AckEvent,
            QueryAddrs,
            CreateCq,
            DestroyCq,
            PollCq,
            PostSend,
            PostRecv,
            ProbeListener,
            CreateCompChannel,
            DestroyCompChannel,
            AttachCompChannel,
            ReqNotifyCq,
            RegMr,
            DeregMr,
            RdmaWrite,
            RdmaRead,
            PostSendUd,
            JoinMcast,
            LeaveMcast,
            FabricHosts,
            VerbsCreateQp,
            ModifyQp,
            QueryQp,
            VerbsDestroyQp,
            QpPostRecv,
            InitQpAttr,
            Establish,
            PostSendImm,
            Atomic,
            RdmaWriteImm,
            CreateSrq,
            ModifySrq,
            QuerySrq,
            DestroySrq,
            PostSrqRecv,
            MigrateId,
        ];
        ALL.into_iter().find(|op| *op as u32 == v)
    }
}

/// Channel datagram: the daemon has bound this socket to its channel.
pub const CHAN_ATTACHED: u8 = 1;
/// Channel datagram: one CM event (see [`WireEvent`]).
pub const CHAN_EVENT: u8 = 2;

/// One CM event as the daemon sends it on a channel socket.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WireEvent {
    /// The daemon's number for the event, given back by [`Op::AckEvent`].
    pub event_no: u64,
    /// The id the event is about (for `CONNECT_REQUEST`, the new child id).
    pub id: u64,
    /// The listener for `CONNECT_REQUEST`, else 0.
    pub listen_id: u64,
    /// `enum rdma_cm_event_type`.
    pub event: u32,
    /// `status`.
    pub status: i32,
    /// Connection parameters carried by the event.
    pub param: ConnParam,
    /// The id's local address (so a child id knows it without a round trip).
    pub local: Option<SocketAddr>,
    /// The id's peer address.
    pub peer: Option<SocketAddr>,
    /// A datagram id's destination (`param.ud` of `ESTABLISHED` and `MULTICAST_JOIN`).
    pub ud: Option<UdParam>,
}

/// A protocol decoding failure: the peer sent something this version does not understand.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Malformed;

/// Builds one datagram.
#[derive(Default, Debug)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// The hello of process `pid` on the simulated host `host` (empty: host 0), named
    /// `argv0` in the daemon's messages, speaking [`PROTOCOL_VERSION`].
    pub fn hello(pid: u32, host: &str, argv0: &str) -> Enc {
        crate::request::Opening::hello(pid, host, argv0).encode()
    }

    /// A request for `op`.
    pub fn op(op: Op) -> Enc {
        let mut e = Enc(Vec::with_capacity(64));
        e.u32(op as u32);
        e
    }
    /// Appends a byte.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    /// Appends a `u32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a `u16`.
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends bytes of a length both ends know.
    pub fn raw(&mut self, v: &[u8]) -> &mut Self {
        self.0.extend_from_slice(v);
        self
    }
    /// Appends an `i32`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends a `u64`.
    pub fn u64(&mut self, v: u64) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    /// Appends length-prefixed bytes.
    pub fn bytes(&mut self, v: &[u8]) -> &mut Self {
        self.u32(v.len() as u32);
        self.0.extend_from_slice(v);
        self
    }
    /// Appends an optional socket address.
    pub fn addr(&mut self, a: Option<SocketAddr>) -> &mut Self {
        match a {
            None => {
                self.u8(0);
            }
            Some(SocketAddr::V4(v4)) => {
                self.u8(4);
                self.0.extend_from_slice(&v4.ip().octets());
                self.0.extend_from_slice(&v4.port().to_le_bytes());
            }
            Some(SocketAddr::V6(v6)) => {
                self.u8(6);
                self.0.extend_from_slice(&v6.ip().octets());
                self.0.extend_from_slice(&v6.port().to_le_bytes());
            }
        }
        self
    }
    /// Appends connection parameters.
    pub fn param(&mut self, p: &ConnParam) -> &mut Self {
        self.bytes(p.private_data.as_slice());
        for b in [
            p.responder_resources,
            p.initiator_depth,
            p.flow_control,
            p.retry_count,
            p.rnr_retry_count,
            p.srq as u8,
        ] {
            self.u8(b);
        }
        self.u32(p.qp_num)
    }
    /// Appends a whole event datagram body.
    pub fn event(&mut self, ev: &WireEvent) -> &mut Self {
        self.u8(CHAN_EVENT)
            .u64(ev.event_no)
            .u64(ev.id)
            .u64(ev.listen_id)
            .u32(ev.event)
            .i32(ev.status)
            .param(&ev.param)
            .addr(ev.local)
            .addr(ev.peer)
            .option(ev.ud.as_ref(), |e, ud| {
                e.ud_param(ud);
            })
    }

    /// Appends `value` behind a presence byte.
    pub fn option<T>(&mut self, value: Option<&T>, put: impl FnOnce(&mut Enc, &T)) -> &mut Self {
        match value {
            None => self.u8(0),
            Some(v) => {
                put(self.u8(1), v);
                self
            }
        }
    }

    /// Appends an address handle's attributes, every field of `struct ibv_ah_attr`.
    pub fn ah_attr(&mut self, ah: &AhAttr) -> &mut Self {
        self.raw(&ah.dgid)
            .u32(ah.flow_label)
            .u8(ah.sgid_index)
            .u8(ah.hop_limit)
            .u8(ah.traffic_class)
            .u16(ah.dlid)
            .u8(ah.sl)
            .u8(ah.src_path_bits)
            .u8(ah.static_rate)
            .u8(ah.is_global as u8)
            .u8(ah.port_num)
    }

    /// Appends a datagram destination.
    pub fn ud_param(&mut self, ud: &UdParam) -> &mut Self {
        self.u32(ud.qp_num).u32(ud.qkey).ah_attr(&ud.ah_attr)
    }
}

/// Reads one datagram.
#[derive(Debug)]
pub struct Dec<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Dec<'a> {
    /// Starts reading `buf`.
    pub fn new(buf: &'a [u8]) -> Self {
        Dec { buf, pos: 0 }
    }
    fn take(&mut self, n: usize) -> Result<&'a [u8], Malformed> {
        let end = self.pos.checked_add(n).ok_or(Malformed)?;
        let s = self.buf.get(self.pos..end).ok_or(Malformed)?;
        self.pos = end;
        Ok(s)
    }
    /// Reads a byte.
    pub fn u8(&mut self) -> Result<u8, Malformed> {
        Ok(self.take(1)?[0])
    }
    /// Reads a `u16`.
    pub fn u16(&mut self) -> Result<u16, Malformed> {
        Ok(u16::from_le_bytes(
            self.take(2)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    /// Reads a `u32`.
    pub fn u32(&mut self) -> Result<u32, Malformed> {
        Ok(u32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    /// Reads an `i32`.
    pub fn i32(&mut self) -> Result<i32, Malformed> {
        Ok(i32::from_le_bytes(
            self.take(4)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    /// Reads a `u64`.
    pub fn u64(&mut self) -> Result<u64, Malformed> {
        Ok(u64::from_le_bytes(
            self.take(8)?.try_into().map_err(|_| Malformed)?,
        ))
    }
    /// Reads length-prefixed bytes.
    pub fn bytes(&mut self) -> Result<&'a [u8], Malformed> {
        let n = self.u32()? as usize;
        self.take(n)
    }
    /// Reads length-prefixed UTF-8.
    pub fn str(&mut self) -> Result<&'a str, Malformed> {
        std::str::from_utf8(self.bytes()?).map_err(|_| Malformed)
    }
    /// Reads an optional socket address.
    pub fn addr(&mut self) -> Result<Option<SocketAddr>, Malformed> {
        match self.u8()? {
            0 => Ok(None),
            4 => {
                let o: [u8; 4] = self.take(4)?.try_into().map_err(|_| Malformed)?;
                let port = self.u16()?;
                Ok(Some(SocketAddr::new(IpAddr::V4(Ipv4Addr::from(o)), port)))
            }
            6 => {
                let o: [u8; 16] = self.take(16)?.try_into().map_err(|_| Malformed)?;
                let port = self.u16()?;
                Ok(Some(SocketAddr::new(IpAddr::V6(Ipv6Addr::from(o)), port)))
            }
            _ => Err(Malformed),
        }
    }
    /// Reads connection parameters.
    pub fn param(&mut self) -> Result<ConnParam, Malformed> {
        Ok(ConnParam {
            // Kept whole up to MAX_PRIVATE_DATA, its full length remembered: the simulator
            // refuses what is too long for the call.
            private_data: PrivateData::new(self.bytes()?),
            responder_resources: self.u8()?,
            initiator_depth: self.u8()?,
            flow_control: self.u8()?,
            retry_count: self.u8()?,
            rnr_retry_count: self.u8()?,
            srq: self.u8()? != 0,
            qp_num: self.u32()?,
        })
    }
    /// Reads an event datagram's body (after its [`CHAN_EVENT`] tag).
    pub fn event(&mut self) -> Result<WireEvent, Malformed> {
        Ok(WireEvent {
            event_no: self.u64()?,
            id: self.u64()?,
            listen_id: self.u64()?,
            event: self.u32()?,
            status: self.i32()?,
            param: self.param()?,
            local: self.addr()?,
            peer: self.addr()?,
            ud: self.option(Dec::ud_param)?,
        })
    }

    /// Reads a value behind a presence byte.
    pub fn option<T>(
        &mut self,
        get: impl FnOnce(&mut Self) -> Result<T, Malformed>,
    ) -> Result<Option<T>, Malformed> {
        match self.u8()? {
            0 => Ok(None),
            1 => get(self).map(Some),
            _ => Err(Malformed),
        }
    }

    /// Reads an address handle's attributes.
    pub fn ah_attr(&mut self) -> Result<AhAttr, Malformed> {
        Ok(AhAttr {
            dgid: self.take(16)?.try_into().map_err(|_| Malformed)?,
            flow_label: self.u32()?,
            sgid_index: self.u8()?,
            hop_limit: self.u8()?,
            traffic_class: self.u8()?,
            dlid: self.u16()?,
            sl: self.u8()?,
            src_path_bits: self.u8()?,
            static_rate: self.u8()?,
            is_global: match self.u8()? {
                0 => false,
                1 => true,
                _ => return Err(Malformed),
            },
            port_num: self.u8()?,
        })
    }

    /// Reads a datagram destination.
    pub fn ud_param(&mut self) -> Result<UdParam, Malformed> {
        Ok(UdParam {
            qp_num: self.u32()?,
            qkey: self.u32()?,
            ah_attr: self.ah_attr()?,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_event_survives_encoding_and_decoding() {
        let ev = WireEvent {
            event_no: 7,
            id: 3,
            listen_id: 1,
            event: 4,
            status: -110,
            param: ConnParam {
                retry_count: 2,
                qp_num: 99,
                ..ConnParam::ZERO
            }
            .with_private_data(b"hello"),
            local: Some("10.0.0.1:7471".parse().unwrap()),
            peer: Some("[fe80::1]:9".parse().unwrap()),
            ud: Some(UdParam {
                qp_num: 0x12,
                qkey: 0x0123_4567,
                ah_attr: AhAttr {
                    flow_label: 0xabcde,
                    traffic_class: 3,
                    dlid: 0x1234,
                    sl: 5,
                    src_path_bits: 6,
                    static_rate: 7,
                    ..AhAttr::for_ip("10.0.0.2".parse().unwrap())
                },
            }),
        };
        let mut e = Enc::default();
        e.event(&ev);
        let mut d = Dec::new(&e.0);
        assert_eq!(d.u8(), Ok(CHAN_EVENT));
        assert_eq!(d.event(), Ok(ev));
    }

    #[test]
    fn a_truncated_datagram_is_malformed_not_a_panic() {
        let mut e = Enc::op(Op::CreateId);
        e.u64(5);
        let mut d = Dec::new(&e.0[..6]);
        assert_eq!(d.u32(), Ok(Op::CreateId as u32));
        assert_eq!(d.u64(), Err(Malformed));
    }

    #[test]
    fn every_op_maps_back_from_its_wire_value() {
        for v in 1..=52 {
            assert_eq!(Op::from_u32(v).map(|op| op as u32), Some(v));
        }
        assert_eq!(Op::from_u32(0), None);
        assert_eq!(Op::from_u32(53), None);
    }
}
