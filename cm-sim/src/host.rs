//! One host's view of the fabric: the [`CmBackend`] implementation.

use std::net::SocketAddr;
use std::time::Duration;

use cm_core::{
    Access, AsyncEvent, ChannelHandle, CmBackend, CmEvent, ConnParam, IdHandle, IdMachine, IdOption,
    LiveResources, MrHandle, MrInfo, PortSpace, QpAttr, QpAttrMask, QpCaps, QpHandle, QpState, QpType,
    Result, SendWr, SrqCaps, SrqHandle, UdParam, VerbsQp, VerbsQpAttr, WorkCompletion,
};

use crate::fabric::{RegionMemory, SimFabric};

/// The backend for one simulated host: like one process on one machine using librdmacm.
///
/// Handles issued by one host are foreign to every other host and fabric
/// ([`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle)). Cloning gives another handle to
/// the same host.
#[derive(Clone, Debug)]
pub struct SimHost {
    fabric: SimFabric,
    host: u16,
}

impl SimHost {
    pub(crate) fn new(fabric: SimFabric, host: u16) -> Self {
        SimHost { fabric, host }
    }

    /// The fabric this host is on.
    pub fn fabric(&self) -> &SimFabric {
        &self.fabric
    }

    /// The host's number on its fabric.
    pub fn index(&self) -> usize {
        self.host as usize
    }

    /// The type of service the id set with [`IdOption::Tos`], if it did: the simulator
    /// records it (it neither traces it nor lets it change anything).
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an id this host does not
    /// know.
    pub fn tos(&self, id: IdHandle) -> Result<Option<u8>> {
        self.fabric.inner().borrow().tos(self.host, id)
    }

    /// The host's first address (where unbound ids resolve from).
    pub fn addr(&self) -> std::net::IpAddr {
        self.fabric.host_addrs(self.index())[0]
    }

    /// The number of the QP the id holds (`ibv_qp.qp_num`), or `None` before
    /// [`create_qp`](CmBackend::create_qp) and after [`destroy_qp`](CmBackend::destroy_qp).
    /// Datagrams are addressed by it; the C drop-in shows it to programs.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an id this host does not
    /// know.
    pub fn qp_num(&self, id: IdHandle) -> Result<Option<u32>> {
        self.fabric.inner().borrow().qp_num(self.host, id)
    }

    /// [`post_send_to`](CmBackend::post_send_to) with immediate data
    /// (`IBV_WR_SEND_WITH_IMM`): the receiver's completion carries `imm` in
    /// [`WorkCompletion::imm_data`]. The trait's call sends none, as librdmacm's
    /// `rdma_post_ud_send` does; C programs reach this through the drop-in's `ibv_post_send`
    /// (rdma-core's `udaddy` tells its QP number so).
    ///
    /// # Errors
    /// As [`post_send_to`](CmBackend::post_send_to)'s.
    pub fn post_send_to_with_imm(
        &mut self,
        id: IdHandle,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
        imm: u32,
    ) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .post_send_to(self.host, id, wr_id, dest, data, Some(imm))
    }

    /// [`reg_mr`](CmBackend::reg_mr) of bytes that live elsewhere: `memory` is registered on
    /// the protection domain of the id's device with `access`, as the region the simulator
    /// reads and writes for local work requests and for peers' one-sided operations. Its length
    /// is `memory.len()`, read once here. The C drop-in registers programs' own memory through
    /// this; a test can register a region that records what was done to it.
    ///
    /// # Errors
    /// As [`reg_mr`](CmBackend::reg_mr)'s: [`CmError::NoDevice`](cm_core::CmError::NoDevice)
    /// before the id is bound to a device, [`CmError::InvalidArgument`](cm_core::CmError::InvalidArgument)
    /// for flags [`Access::check`] refuses or a length of 0 or above the configuration's
    /// `max_mr_size`.
    pub fn reg_mr_with(
        &mut self,
        id: IdHandle,
        memory: Box<dyn RegionMemory>,
        access: Access,
    ) -> Result<MrHandle> {
        self.fabric
            .inner()
            .borrow_mut()
            .reg_mr_with(self.host, id, memory, access)
    }
}

/// Verbs QPs that no id owns: `ibv_create_qp`, `ibv_modify_qp`, `ibv_query_qp`,
/// `ibv_destroy_qp` and the data path on them, for programs that connect their QPs themselves
/// (exchanging QP numbers, PSNs and GIDs out of band, as `ibv_rc_pingpong` does) or through
/// librdmacm with an external QP (`rdma_init_qp_attr`, `rdma_establish`).
///
/// The QP starts in RESET; [`verbs_modify_qp`](Self::verbs_modify_qp) moves it by the kernel's
/// rules ([`VerbsQp::modify`]). Its RTR names its peer: `dest_qp_num` and an address vector
/// whose `dgid` is the peer host's RoCE GID (its IPv4 address mapped into IPv6, source GID
/// index 1). Data flows once both are in RTS and name each other; a send to a QP number nobody
/// has, or to a QP in neither RTR nor RTS, is lost and completes with `RETRY_EXC_ERR` once the
/// transport's retries (`retry_cnt`, each `timeout` long) run out, the QP going to ERR. Sends,
/// receives, completions, the flush on ERR, one-sided requests and the trace are those of an
/// id's QP. A UD QP sends datagrams ([`verbs_post_send_to`](Self::verbs_post_send_to)) once in
/// RTS and takes those carrying its Q_Key from RTR on.
///
/// ```
/// use std::time::Duration;
/// use cm_core::{AddressVector, GlobalRoute, QpAttrMask as M, QpCaps, QpType, VerbsQpAttr, VerbsQpState};
/// use cm_sim::SimFabric;
///
/// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").host("10.0.0.2").build();
/// let (mut a, mut b) = (fabric.host(0), fabric.host(1));
/// let (qa, _) = a.verbs_create_qp(QpType::Rc, QpCaps::new())?;
/// let (qb, _) = b.verbs_create_qp(QpType::Rc, QpCaps::new())?;
/// let gid = |ip: &str| ip.parse::<std::net::Ipv4Addr>().unwrap().to_ipv6_mapped().octets();
/// let (na, nb) = (a.verbs_qp_num(qa)?, b.verbs_qp_num(qb)?);
/// for (host, qp, peer_qp, peer_ip) in [(&mut a, qa, nb, "10.0.0.2"), (&mut b, qb, na, "10.0.0.1")] {
///     let init = VerbsQpAttr { qp_state: VerbsQpState::Init, port_num: 1, ..VerbsQpAttr::default() };
///     host.verbs_modify_qp(qp, &init, M::STATE | M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS)?;
///     let rtr = VerbsQpAttr {
///         qp_state: VerbsQpState::Rtr,
///         path_mtu: 3,
///         dest_qp_num: peer_qp,
///         ah_attr: AddressVector {
///             grh: Some(GlobalRoute { dgid: gid(peer_ip), sgid_index: 1, hop_limit: 1, ..GlobalRoute::default() }),
///             port_num: 1,
///             ..AddressVector::default()
///         },
///         ..VerbsQpAttr::default()
///     };
///     let mask = M::STATE | M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER;
///     host.verbs_modify_qp(qp, &rtr, mask)?;
///     let rts = VerbsQpAttr { qp_state: VerbsQpState::Rts, timeout: 14, retry_cnt: 7, rnr_retry: 7, ..VerbsQpAttr::default() };
///     let mask = M::STATE | M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC;
///     host.verbs_modify_qp(qp, &rts, mask)?;
/// }
/// b.verbs_post_recv(qb, 1, 64)?;
/// a.verbs_post_send(qa, 2, b"ping")?;
/// let mut wcs = Vec::new();
/// b.verbs_poll_cq(qb, &mut wcs, 1, Duration::from_secs(1))?;
/// assert_eq!(wcs[0].data, b"ping");
/// # Ok::<(), cm_core::CmError>(())
/// ```
impl SimHost {
    /// `ibv_create_qp` of `ty` with `caps` on the host's device: the QP (in RESET) and the
    /// capabilities granted.
    ///
    /// # Errors
    /// [`CmError::NoDevice`](cm_core::CmError::NoDevice) while the device is removed,
    /// [`CmError::InvalidArgument`](cm_core::CmError::InvalidArgument) for capabilities above
    /// the device's.
    pub fn verbs_create_qp(&mut self, ty: QpType, caps: QpCaps) -> Result<(QpHandle, QpCaps)> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_create_qp(self.host, ty, caps, None)
    }

    /// `ibv_create_qp` with `ibv_qp_init_attr.srq`: an RC QP that takes its receives from
    /// `srq` (one of [`verbs_create_srq`](Self::verbs_create_srq)'s or
    /// [`create_srq`](CmBackend::create_srq)'s on this host). Its receives complete on its own
    /// completion queue ([`verbs_poll_cq`](Self::verbs_poll_cq)); posting on the QP itself is
    /// refused (`EINVAL`, as rxe); its receive capabilities are granted as 0. When it goes to
    /// ERR only its own queues are flushed: the SRQ's receives stay for the other QPs, as on
    /// rxe. While it lives, [`destroy_srq`](CmBackend::destroy_srq) is refused (`EBUSY`).
    ///
    /// # Errors
    /// As [`verbs_create_qp`](Self::verbs_create_qp)'s;
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an SRQ this host does
    /// not have; [`CmError::InvalidArgument`](cm_core::CmError::InvalidArgument) for a UD QP.
    pub fn verbs_create_qp_on_srq(
        &mut self,
        ty: QpType,
        caps: QpCaps,
        srq: SrqHandle,
    ) -> Result<(QpHandle, QpCaps)> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_create_qp(self.host, ty, caps, Some(srq))
    }

    /// `ibv_create_srq` on the host's device, owned by no id: receives posted on it with
    /// [`post_srq_recv`](CmBackend::post_srq_recv) go to whichever of its QPs a message lands
    /// on first. Its limit and the rest of the SRQ calls are [`CmBackend`]'s.
    ///
    /// # Errors
    /// [`CmError::NoDevice`](cm_core::CmError::NoDevice) while the device is removed;
    /// [`CmError::InvalidArgument`](cm_core::CmError::InvalidArgument) for capabilities past
    /// the device's ([`SrqCaps::check`]).
    pub fn verbs_create_srq(&mut self, caps: SrqCaps) -> Result<SrqHandle> {
        self.fabric.inner().borrow_mut().verbs_create_srq(self.host, caps)
    }

    /// `ibv_query_srq`: the SRQ's capabilities, its `srq_limit` the limit armed now (0 once
    /// it fired).
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an SRQ this host does
    /// not have.
    pub fn query_srq(&self, srq: SrqHandle) -> Result<SrqCaps> {
        self.fabric.inner().borrow().query_srq(self.host, srq)
    }

    /// The QP's number (`ibv_qp.qp_num`), what a peer's RTR names as `dest_qp_num`.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for a QP this host does not
    /// have.
    pub fn verbs_qp_num(&self, qp: QpHandle) -> Result<u32> {
        self.fabric.inner().borrow().verbs_qp_num(self.host, qp)
    }

    /// `ibv_modify_qp(qp, attr, mask)`.
    ///
    /// # Errors
    /// What [`VerbsQp::modify`] refuses (`EINVAL`, `EOPNOTSUPP`);
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for a QP this host does not
    /// have.
    pub fn verbs_modify_qp(&mut self, qp: QpHandle, attr: &VerbsQpAttr, mask: QpAttrMask) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_modify_qp(self.host, qp, attr, mask)
    }

    /// `ibv_modify_qp` of the QP [`create_qp`](CmBackend::create_qp) gave `id`, which the
    /// CM moves: checked by the kernel's rules ([`VerbsQp::modify`]) from the state the id's
    /// machine has it in. A modify that keeps that state is made: RTS → RTS with
    /// `IBV_QP_MIN_RNR_TIMER` sets the wait its peer's sends make before each
    /// receiver-not-ready retry (qperf's server sets it so once connected).
    ///
    /// # Errors
    /// What [`VerbsQp::modify`] refuses (`EINVAL`, `EOPNOTSUPP`); `EINVAL` for an id without a
    /// QP; `ENOSYS` for a modify that would move the QP to another state, which is the CM's;
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an id this host does not
    /// know.
    pub fn modify_id_qp(&mut self, id: IdHandle, attr: &VerbsQpAttr, mask: QpAttrMask) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .modify_id_qp(self.host, id, attr, mask)
    }

    /// `ibv_query_qp`: the QP's machine (its state, which follows the data path to ERR, and the
    /// attributes set).
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for a QP this host does not
    /// have.
    pub fn verbs_query_qp(&self, qp: QpHandle) -> Result<VerbsQp> {
        self.fabric.inner().borrow().verbs_query_qp(self.host, qp)
    }

    /// [`reg_mr_with`](Self::reg_mr_with) on the host's device without an id: the region a
    /// verbs QP's work requests (and its peer's one-sided ones) name.
    ///
    /// # Errors
    /// As `reg_mr_with`'s, [`CmError::NoDevice`](cm_core::CmError::NoDevice) while the device
    /// is removed.
    pub fn device_reg_mr_with(&mut self, memory: Box<dyn RegionMemory>, access: Access) -> Result<MrHandle> {
        self.fabric
            .inner()
            .borrow_mut()
            .device_reg_mr_with(self.host, memory, access)
    }

    /// `ibv_destroy_qp`: the QP and its unpolled completions go.
    ///
    /// # Errors
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for a QP this host does not
    /// have.
    pub fn verbs_destroy_qp(&mut self, qp: QpHandle) -> Result<()> {
        self.fabric.inner().borrow_mut().verbs_destroy_qp(self.host, qp)
    }

    /// [`post_send`](CmBackend::post_send) on a verbs QP.
    ///
    /// # Errors
    /// As `post_send`'s.
    pub fn verbs_post_send(&mut self, qp: QpHandle, wr_id: u64, data: &[u8]) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_post_send(self.host, qp, wr_id, data)
    }

    /// [`post_send_to`](CmBackend::post_send_to) on a UD verbs QP, with an immediate if `imm`
    /// names one: `dest.qkey` must be the receiving QP's Q_Key, else the datagram is dropped
    /// there.
    ///
    /// # Errors
    /// As `post_send_to`'s.
    pub fn verbs_post_send_to(
        &mut self,
        qp: QpHandle,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
        imm: Option<u32>,
    ) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_post_send_to(self.host, qp, wr_id, dest, data, imm)
    }

    /// [`post_send_wr`](CmBackend::post_send_wr) on a verbs QP: work requests over regions
    /// (SEND and WRITE with immediate, RDMA READ and WRITE, atomics).
    ///
    /// # Errors
    /// As `post_send_wr`'s.
    pub fn verbs_post_send_wr(&mut self, qp: QpHandle, wr: &SendWr<'_>) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_post_send_wr(self.host, qp, wr)
    }

    /// [`post_recv`](CmBackend::post_recv) on a verbs QP.
    ///
    /// # Errors
    /// As `post_recv`'s.
    pub fn verbs_post_recv(&mut self, qp: QpHandle, wr_id: u64, len: u32) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_post_recv(self.host, qp, wr_id, len)
    }

    /// [`poll_cq`](CmBackend::poll_cq) on a verbs QP: its completions, waiting up to `timeout`
    /// of virtual time for the first.
    ///
    /// # Errors
    /// As `poll_cq`'s.
    pub fn verbs_poll_cq(
        &mut self,
        qp: QpHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> Result<usize> {
        self.fabric
            .inner()
            .borrow_mut()
            .verbs_poll_cq(self.host, qp, out, max, timeout)
    }
}

/// Each call goes to the fabric with the host's number; with the `tracing` feature each is a
/// DEBUG span named for the call, with its arguments, the host and the result.
macro_rules! forward {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(
            #[cfg_attr(
                feature = "tracing",
                tracing::instrument(level = "debug", skip(self), fields(host = self.host), ret)
            )]
            #[inline]
            fn $name(&mut self, $($arg: $ty),*) -> $ret {
                self.fabric.inner().borrow_mut().$name(self.host, $($arg),*)
            }
        )*
    };
}

impl CmBackend for SimHost {
    forward! {
        create_event_channel() -> Result<ChannelHandle>;
        destroy_event_channel(channel: ChannelHandle) -> Result<()>;
        create_id(channel: ChannelHandle, ps: PortSpace) -> Result<IdHandle>;
        destroy_id(id: IdHandle) -> Result<()>;
        bind_addr(id: IdHandle, addr: SocketAddr) -> Result<()>;
        resolve_addr(id: IdHandle, src: Option<SocketAddr>, dst: SocketAddr, timeout: Duration) -> Result<()>;
        resolve_route(id: IdHandle, timeout: Duration) -> Result<()>;
        create_qp(id: IdHandle, caps: QpCaps) -> Result<QpCaps>;
        destroy_qp(id: IdHandle) -> Result<()>;
        listen(id: IdHandle, backlog: i32) -> Result<()>;
        connect(id: IdHandle, param: &ConnParam) -> Result<()>;
        accept(id: IdHandle, param: &ConnParam) -> Result<()>;
        reject(id: IdHandle, private_data: &[u8]) -> Result<()>;
        init_qp_attr(id: IdHandle, qp_state: QpState) -> Result<QpAttr>;
        establish(id: IdHandle) -> Result<()>;
        disconnect(id: IdHandle) -> Result<()>;
        ack_cm_event(event: CmEvent) -> Result<()>;
        set_option(id: IdHandle, option: IdOption) -> Result<()>;
        migrate_id(id: IdHandle, channel: ChannelHandle) -> Result<()>;
        get_local_addr(id: IdHandle) -> Result<Option<SocketAddr>>;
        get_peer_addr(id: IdHandle) -> Result<Option<SocketAddr>>;
        post_recv(id: IdHandle, wr_id: u64, len: u32) -> Result<()>;
        poll_cq(id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize, timeout: Duration) -> Result<usize>;
    }

    // Without the `tracing` feature the event is returned as the fabric builds it: an event is
    // over 300 bytes, and binding it to a local first cost a copy per event.
    #[cfg(not(feature = "tracing"))]
    #[inline]
    fn get_cm_event(&mut self, channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>> {
        self.fabric
            .inner()
            .borrow_mut()
            .get_cm_event(self.host, channel, timeout)
    }

    #[cfg(feature = "tracing")]
    #[tracing::instrument(level = "debug", skip(self), fields(host = self.host), ret)]
    fn get_cm_event(&mut self, channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>> {
        let got = self
            .fabric
            .inner()
            .borrow_mut()
            .get_cm_event(self.host, channel, timeout);
        if let Ok(Some(ev)) = &got {
            let (host, id, event, status) = (self.host, ev.id(), ev.event(), ev.status());
            tracing::debug!(host, %id, %event, status, "event");
        }
        got
    }

    /// Retrieves, reads and acks in one step of the fabric: the event never enters the table
    /// of outstanding events and is not copied out and back in (see
    /// [`CmBackend::take_cm_event`]).
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_core::{CmBackend, CmEventType, PortSpace};
    /// let fabric = cm_sim::SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// let mut h = fabric.host(0);
    /// let ch = h.create_event_channel()?;
    /// let id = h.create_id(ch, PortSpace::Tcp)?;
    /// h.resolve_addr(id, None, "10.0.0.1:1".parse().unwrap(), Duration::from_secs(1))?;
    /// assert_eq!(h.take_cm_event(ch, |ev| ev.event())?, None, "not resolved yet");
    /// fabric.advance_to(fabric.next_deadline().expect("ADDR_RESOLVED is scheduled"));
    /// assert_eq!(h.take_cm_event(ch, |ev| ev.event())?, Some(CmEventType::AddrResolved));
    /// h.destroy_id(id)?; // the event was acked: nothing holds the id
    /// # Ok::<(), cm_core::CmError>(())
    /// ```
    #[cfg(not(feature = "tracing"))]
    #[inline]
    fn take_cm_event<T>(
        &mut self,
        channel: ChannelHandle,
        read: impl FnOnce(&CmEvent) -> T,
    ) -> Result<Option<T>> {
        self.fabric
            .inner()
            .borrow_mut()
            .take_cm_event(self.host, channel, read)
    }

    #[cfg(feature = "tracing")]
    #[tracing::instrument(level = "debug", skip(self, read), fields(host = self.host))]
    fn take_cm_event<T>(
        &mut self,
        channel: ChannelHandle,
        read: impl FnOnce(&CmEvent) -> T,
    ) -> Result<Option<T>> {
        let host = self.host;
        self.fabric
            .inner()
            .borrow_mut()
            .take_cm_event(self.host, channel, |ev| {
                let (id, event, status) = (ev.id(), ev.event(), ev.status());
                tracing::debug!(host, %id, %event, status, "event");
                read(ev)
            })
    }

    // The payload is left out of the record (it may be large); its length is in.
    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(
            level = "debug",
            skip(self, data),
            fields(host = self.host, len = data.len()),
            ret
        )
    )]
    fn post_send(&mut self, id: IdHandle, wr_id: u64, data: &[u8]) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .post_send(self.host, id, wr_id, data)
    }

    // As post_send: the payload stays out of the record.
    #[cfg_attr(
        feature = "tracing",
        tracing::instrument(
            level = "debug",
            skip(self, data),
            fields(host = self.host, len = data.len()),
            ret
        )
    )]
    fn post_send_to(&mut self, id: IdHandle, wr_id: u64, dest: &UdParam, data: &[u8]) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .post_send_to(self.host, id, wr_id, dest, data, None)
    }

    fn join_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .join_multicast(self.host, id, group)
    }

    fn leave_multicast(&mut self, id: IdHandle, group: SocketAddr) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .leave_multicast(self.host, id, group)
    }

    fn reg_mr(&mut self, id: IdHandle, len: usize, access: Access) -> Result<MrHandle> {
        self.fabric
            .inner()
            .borrow_mut()
            .reg_mr(self.host, id, len, access)
    }

    fn mr_info(&self, mr: MrHandle) -> Result<MrInfo> {
        self.fabric.inner().borrow().mr_info(self.host, mr)
    }

    fn dereg_mr(&mut self, mr: MrHandle) -> Result<()> {
        self.fabric.inner().borrow_mut().dereg_mr(self.host, mr)
    }

    fn read_mr(&self, mr: MrHandle, offset: u64, out: &mut [u8]) -> Result<()> {
        self.fabric.inner().borrow().read_mr(self.host, mr, offset, out)
    }

    fn write_mr(&mut self, mr: MrHandle, offset: u64, data: &[u8]) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .write_mr(self.host, mr, offset, data)
    }

    fn post_send_wr(&mut self, id: IdHandle, wr: &SendWr<'_>) -> Result<()> {
        self.fabric.inner().borrow_mut().post_send_wr(self.host, id, wr)
    }

    fn create_srq(&mut self, id: IdHandle, caps: SrqCaps) -> Result<SrqHandle> {
        self.fabric.inner().borrow_mut().create_srq(self.host, id, caps)
    }

    fn destroy_srq(&mut self, srq: SrqHandle) -> Result<()> {
        self.fabric.inner().borrow_mut().destroy_srq(self.host, srq)
    }

    fn post_srq_recv(&mut self, srq: SrqHandle, wr_id: u64, len: u32) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .post_srq_recv(self.host, srq, wr_id, len)
    }

    fn arm_srq_limit(&mut self, srq: SrqHandle, limit: u32) -> Result<()> {
        self.fabric
            .inner()
            .borrow_mut()
            .arm_srq_limit(self.host, srq, limit)
    }

    fn create_qp_on_srq(&mut self, id: IdHandle, caps: QpCaps, srq: SrqHandle) -> Result<QpCaps> {
        self.fabric
            .inner()
            .borrow_mut()
            .create_qp_on_srq(self.host, id, caps, srq)
    }

    fn get_async_event(&mut self, timeout: Duration) -> Result<Option<AsyncEvent>> {
        self.fabric
            .inner()
            .borrow_mut()
            .get_async_event(self.host, timeout)
    }

    fn id_machine(&self, id: IdHandle) -> Result<IdMachine> {
        self.fabric.inner().borrow().id_machine(self.host, id)
    }

    fn live_resources(&self) -> LiveResources {
        self.fabric.inner().borrow().live_resources(Some(self.host))
    }
}
