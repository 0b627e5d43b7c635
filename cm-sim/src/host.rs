//! One host's view of the fabric: the [`CmBackend`] implementation.

use std::net::SocketAddr;
use std::time::Duration;

use cm_core::{
    Access, AsyncEvent, Call, ChannelHandle, CmBackend, CmError, CmEvent, ConnParam, IdHandle, IdMachine,
    IdOption, LiveResources, MrHandle, MrInfo, PortSpace, QpAttr, QpCaps, QpState, Result, SendWr, SrqCaps,
    SrqHandle, UdParam, WorkCompletion,
};

// INTERIM (branch onesided).
fn interim(call: Call) -> CmError {
    CmError::InvalidArgument {
        call,
        reason: "INTERIM: one-sided operations not in the simulator yet",
    }
}

use crate::fabric::SimFabric;

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
            .post_send_to(self.host, id, wr_id, dest, data)
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

    // INTERIM (branch onesided): replaced by the simulator's one-sided model before merging.
    fn reg_mr(&mut self, _id: IdHandle, _len: usize, _access: Access) -> Result<MrHandle> {
        Err(interim(Call::RegMr))
    }

    fn mr_info(&self, _mr: MrHandle) -> Result<MrInfo> {
        Err(interim(Call::RegMr))
    }

    fn dereg_mr(&mut self, _mr: MrHandle) -> Result<()> {
        Err(interim(Call::DeregMr))
    }

    fn read_mr(&self, _mr: MrHandle, _offset: u64, _out: &mut [u8]) -> Result<()> {
        Err(interim(Call::ReadMr))
    }

    fn write_mr(&mut self, _mr: MrHandle, _offset: u64, _data: &[u8]) -> Result<()> {
        Err(interim(Call::WriteMr))
    }

    fn post_send_wr(&mut self, _id: IdHandle, _wr: &SendWr<'_>) -> Result<()> {
        Err(interim(Call::PostSend))
    }

    fn create_srq(&mut self, _id: IdHandle, _caps: SrqCaps) -> Result<SrqHandle> {
        Err(interim(Call::CreateSrq))
    }

    fn destroy_srq(&mut self, _srq: SrqHandle) -> Result<()> {
        Err(interim(Call::DestroySrq))
    }

    fn post_srq_recv(&mut self, _srq: SrqHandle, _wr_id: u64, _len: u32) -> Result<()> {
        Err(interim(Call::PostSrqRecv))
    }

    fn arm_srq_limit(&mut self, _srq: SrqHandle, _limit: u32) -> Result<()> {
        Err(interim(Call::ModifySrq))
    }

    fn create_qp_on_srq(&mut self, _id: IdHandle, _caps: QpCaps, _srq: SrqHandle) -> Result<QpCaps> {
        Err(interim(Call::CreateQp))
    }

    fn get_async_event(&mut self, _timeout: Duration) -> Result<Option<AsyncEvent>> {
        Err(interim(Call::GetAsyncEvent))
    }

    fn id_machine(&self, id: IdHandle) -> Result<IdMachine> {
        self.fabric.inner().borrow().id_machine(self.host, id)
    }

    fn live_resources(&self) -> LiveResources {
        self.fabric.inner().borrow().live_resources(Some(self.host))
    }
}
