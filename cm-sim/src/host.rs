//! One host's view of the fabric: the [`CmBackend`] implementation.

use std::net::SocketAddr;
use std::time::Duration;

use cm_core::{
    ChannelHandle, CmBackend, CmEvent, ConnParam, IdHandle, IdMachine, LiveResources, PortSpace, QpCaps,
    Result, WorkCompletion,
};

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

    /// The host's first address (where unbound ids resolve from).
    pub fn addr(&self) -> std::net::IpAddr {
        self.fabric.host_addrs(self.index())[0]
    }
}

macro_rules! forward {
    ($($name:ident($($arg:ident: $ty:ty),*) -> $ret:ty;)*) => {
        $(fn $name(&mut self, $($arg: $ty),*) -> $ret {
            self.fabric.inner().borrow_mut().$name(self.host, $($arg),*)
        })*
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
        disconnect(id: IdHandle) -> Result<()>;
        get_cm_event(channel: ChannelHandle, timeout: Duration) -> Result<Option<CmEvent>>;
        ack_cm_event(event: CmEvent) -> Result<()>;
        get_local_addr(id: IdHandle) -> Result<Option<SocketAddr>>;
        get_peer_addr(id: IdHandle) -> Result<Option<SocketAddr>>;
        post_send(id: IdHandle, wr_id: u64, data: &[u8]) -> Result<()>;
        post_recv(id: IdHandle, wr_id: u64, len: u32) -> Result<()>;
        poll_cq(id: IdHandle, out: &mut Vec<WorkCompletion>, max: usize, timeout: Duration) -> Result<usize>;
    }

    fn id_machine(&self, id: IdHandle) -> Result<IdMachine> {
        self.fabric.inner().borrow().id_machine(self.host, id)
    }

    fn live_resources(&self) -> LiveResources {
        self.fabric.inner().borrow().live_resources(Some(self.host))
    }
}
