//! The exported C functions: librdmacm's API over the daemon protocol.
//!
//! Every function follows librdmacm's C contract (valid pointers from earlier calls of this
//! library, or NULL where librdmacm allows it); that contract is the safety argument of each
//! `unsafe` block below, which only reads or writes through the pointers the caller handed in
//! or objects this library allocated.
#![allow(clippy::missing_safety_doc)] // the safety contract of each function is librdmacm's C one

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::path::PathBuf;
use std::ptr;
use std::sync::{Condvar, Mutex, MutexGuard, OnceLock};
use std::time::{Duration, Instant};

use crate::abi::*;
use crate::proto::{self, Dec, WireEvent};
use crate::request::{Opening, Request, Welcome};
use crate::sock::{self, SeqConn};
use cm_core::{Call, CmError, ConnParam, Invocation};

/// librdmacm waits forever for an id's events to be acked before destroying it; this library
/// bounds the wait so a lost ack shows up as an error message instead of a hang.
const DESTROY_WAIT: Duration = Duration::from_secs(60);

const RDMA_PS_TCP: u32 = 0x0106;
const RDMA_PS_UDP: u32 = 0x0111;
const RDMA_PS_IPOIB: u32 = 0x0002;
const IBV_QPT_RC: u32 = 2;
const IBV_QPT_UD: u32 = 4;
const IBV_QPS_INIT: u32 = 1;
const RAI_PASSIVE: i32 = 1;
const RAI_NUMERICHOST: i32 = 2;
const EV_CONNECT_REQUEST: u32 = 4;
const EV_ADDR_RESOLVED: u32 = 0;
const EV_MULTICAST_JOIN: u32 = 12;
const EV_MULTICAST_ERROR: u32 = 13;
/// The event number of events the library makes itself (nothing to give back to the daemon).
const LOCAL_EVENT: u64 = 0;
/// `RDMA_UDP_QKEY`: the Q_Key of the UDP port space.
pub(crate) const RDMA_UDP_QKEY: u32 = 0x0123_4567;

pub(crate) fn set_errno(e: c_int) {
    // SAFETY: __errno_location returns the calling thread's errno slot, always valid.
    unsafe { *libc::__errno_location() = e };
}

pub(crate) fn fail(e: c_int) -> c_int {
    set_errno(e);
    -1
}

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic never happens while these locks are held (no user code runs under them), but
    // a poisoned lock must not take the C program down either.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Reports a call this library does not implement: one line on stderr naming it and `errno`,
/// which is also set. Returns `errno`, for the calls that answer it as their value.
pub(crate) fn refuse(name: &str, errno: c_int) -> c_int {
    let what = match errno {
        libc::ENOSYS => "ENOSYS".to_string(),
        libc::EOPNOTSUPP => "EOPNOTSUPP".to_string(),
        other => format!("errno {other}"),
    };
    eprintln!("cmsim: {name} is not supported on the simulator ({what})");
    set_errno(errno);
    errno
}

/// Reports a call this library does not implement: ENOSYS and one line on stderr; returns -1.
pub(crate) fn unsupported(name: &str) -> c_int {
    refuse(name, libc::ENOSYS);
    -1
}

struct Client {
    ctrl: SeqConn,
    proc: u64,
    socket: PathBuf,
    /// The simulated host's address, as the daemon's hello reply names it: the device's GIDs
    /// and GUID derive from it.
    addr: IpAddr,
    /// The process that said the hello. A forked child inherits the socket but is not that
    /// process (the daemon refuses its requests on it): it says a hello of its own.
    pid: u32,
}

/// The connection to the daemon, made (or, in a forked child, made again) when needed.
fn client(guard: &mut Option<Client>) -> Result<&Client, c_int> {
    let pid = std::process::id();
    if let Some(old) = guard.as_ref() {
        if old.pid != pid {
            eprintln!(
                "cmsim: process {pid}, forked from {}, attaches to the fabric as a process of its own: its parent's ids, channels and regions are not its",
                old.pid
            );
            // Dropping closes this process's copy of the parent's socket only.
            *guard = None;
        }
    }
    if guard.is_none() {
        *guard = Some(connect_daemon()?);
    }
    Ok(guard.as_ref().expect("connected above"))
}

static CLIENT: Mutex<Option<Client>> = Mutex::new(None);

/// Library-side objects, keyed by the daemon's tokens.
#[derive(Default)]
pub(crate) struct Registry {
    /// id token → `*mut IdPriv` (as an address: the registry is shared between threads).
    ids: HashMap<u64, usize>,
    /// The addresses of the live ids (`ids`' values): an id pointer is looked up here before it
    /// is read, so one the application destroyed already is refused, not read after its free.
    live: std::collections::HashSet<usize>,
    /// counted id token → events retrieved by the application and not acked yet.
    unacked: HashMap<u64, u32>,
    /// (id token, group) → the context given to `rdma_join_multicast`, which its events
    /// carry in `param.ud.private_data`.
    groups: HashMap<(u64, IpAddr), usize>,
    /// QP (id token) → its posted receives, in order, waiting for their data.
    pub(crate) recvs: HashMap<u64, std::collections::VecDeque<crate::verbs::PostedRecv>>,
    /// QP token → its number (`qp->qp_num`), which its completions' `qp_num` reports: for a
    /// UD QP of `rdma_create_qp` the simulator's number, not the token.
    pub(crate) qp_nums: HashMap<u64, u32>,
}

static REGISTRY: OnceLock<(Mutex<Registry>, Condvar)> = OnceLock::new();

pub(crate) fn registry() -> &'static (Mutex<Registry>, Condvar) {
    REGISTRY.get_or_init(|| (Mutex::new(Registry::default()), Condvar::new()))
}

fn connect_daemon() -> Result<Client, c_int> {
    let Some(path) = std::env::var_os(proto::SOCKET_ENV) else {
        eprintln!(
            "cmsim: {} is not set: run the program under cmsim-run",
            proto::SOCKET_ENV
        );
        return Err(libc::ENODEV);
    };
    let socket = PathBuf::from(path);
    let ctrl = SeqConn::connect(&socket).map_err(|e| {
        eprintln!(
            "cmsim: cannot reach the fabric daemon at {}: {e}",
            socket.display()
        );
        libc::ENODEV
    })?;
    let host = std::env::var(proto::HOST_ENV).unwrap_or_default();
    // args_os: a name that is not UTF-8 is shown lossily, where `args` would panic.
    let argv0 = std::env::args_os()
        .next()
        .map(|a| a.to_string_lossy().into_owned())
        .unwrap_or_default();
    let argv0 = argv0.rsplit('/').next().unwrap_or("?").to_string();
    let e = Opening::hello(std::process::id(), &host, &argv0).encode();
    ctrl.send(&e.0).map_err(|_| libc::ENODEV)?;
    let mut buf = Vec::new();
    if !matches!(ctrl.recv(&mut buf), Ok(true)) {
        return Err(libc::ENODEV);
    }
    let welcome = match Welcome::decode(&buf) {
        Ok(w) => w,
        Err(libc::ENODEV) => {
            // Said here too, so that the program's own "no RDMA devices" line has a reason.
            eprintln!(
                "cmsim: the fabric daemon at {} has no simulated host with address {host:?} ({} names the host)",
                socket.display(),
                proto::HOST_ENV
            );
            return Err(libc::ENODEV);
        }
        Err(libc::EPROTONOSUPPORT) => {
            eprintln!(
                "cmsim: the fabric daemon at {} speaks another protocol than this library (version {}): run the cmsim-daemon and cmsim-run of one build",
                socket.display(),
                proto::PROTOCOL_VERSION
            );
            return Err(libc::ENODEV);
        }
        Err(errno) => return Err(errno),
    };
    // The daemon places RDMA READ/WRITE data in this process's memory, as a NIC would.
    sock::allow_ptracer(welcome.daemon_pid);
    let (proc, addr) = (welcome.proc, welcome.host_addr);
    Ok(Client {
        ctrl,
        proc,
        socket,
        addr,
        pid: std::process::id(),
    })
}

/// The daemon's socket path and this process's number (connecting first if needed).
pub(crate) fn daemon_address() -> Result<(PathBuf, u64), c_int> {
    let mut guard = lock(&CLIENT);
    let c = client(&mut guard)?;
    Ok((c.socket.clone(), c.proc))
}

/// The address of this process's simulated host (connecting first if needed).
pub(crate) fn host_addr() -> Result<IpAddr, c_int> {
    let mut guard = lock(&CLIENT);
    Ok(client(&mut guard)?.addr)
}

/// One request and its reply; the control socket is held only for this exchange.
pub(crate) fn rpc(req: &Request) -> Result<Vec<u8>, c_int> {
    let e = req.encode();
    let mut guard = lock(&CLIENT);
    let client = client(&mut guard)?;
    client.ctrl.send(&e.0).map_err(|_| libc::ECONNRESET)?;
    let mut buf = Vec::new();
    if !matches!(client.ctrl.recv(&mut buf), Ok(true)) {
        eprintln!("cmsim: the fabric daemon went away");
        return Err(libc::ECONNRESET);
    }
    let status = Dec::new(&buf).i32().map_err(|_| libc::EPROTO)?;
    if status != 0 {
        return Err(status);
    }
    buf.drain(..4);
    Ok(buf)
}

/// A message the daemon does not answer (an ack), sent in order with the requests: the caller
/// does not wait a round trip for it.
pub(crate) fn tell(req: &Request) -> Result<(), c_int> {
    let e = req.encode();
    let mut guard = lock(&CLIENT);
    let client = client(&mut guard)?;
    client.ctrl.send(&e.0).map_err(|_| libc::ECONNRESET)
}

/// A librdmacm call on the simulator.
pub(crate) fn call(call: Invocation<u64, u64>) -> Result<Vec<u8>, c_int> {
    rpc(&Request::Cm(call))
}

pub(crate) fn rpc_status(req: &Request) -> c_int {
    match rpc(req) {
        Ok(_) => 0,
        Err(errno) => fail(errno),
    }
}

/// The library's part of an event channel; `public` is what the application sees.
#[repr(C)]
struct ChannelPriv {
    public: RdmaEventChannel,
    token: u64,
    /// Events read from the socket by a synchronous call waiting for another id's event.
    stash: Mutex<VecDeque<WireEvent>>,
}

/// The library's part of an id; `public` is what the application sees.
#[repr(C)]
struct IdPriv {
    public: RdmaCmId,
    token: u64,
    /// Synchronous id (`rdma_create_id` with a NULL channel, `rdma_create_ep`): calls wait
    /// for their event, as librdmacm's `ucma_complete` does.
    sync: bool,
    /// The channel was made for this id and goes with it.
    owns_channel: bool,
    /// A passive endpoint's QP attributes and PD, for the QPs `rdma_get_request` creates.
    ep_attr: Option<(IbvQpInitAttr, *mut c_void)>,
}

/// The library's part of an event: the private data lives here until the ack.
#[repr(C)]
struct EventPriv {
    public: RdmaCmEvent,
    event_no: u64,
    counted: u64,
    private_data: Vec<u8>,
}

// ---- socket addresses -------------------------------------------------------------------

unsafe fn read_sockaddr(sa: *const libc::sockaddr) -> Option<SocketAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller passes a valid sockaddr; its family says how long it is.
    unsafe {
        match (*sa).sa_family as c_int {
            libc::AF_INET => {
                let sin = &*(sa as *const libc::sockaddr_in);
                let ip = Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
                Some(SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port))))
            }
            libc::AF_INET6 => {
                let sin6 = &*(sa as *const libc::sockaddr_in6);
                let ip = Ipv6Addr::from(sin6.sin6_addr.s6_addr);
                Some(SocketAddr::V6(SocketAddrV6::new(
                    ip,
                    u16::from_be(sin6.sin6_port),
                    0,
                    sin6.sin6_scope_id,
                )))
            }
            _ => None,
        }
    }
}

/// Writes `addr` as a sockaddr into `out` (at least 28 bytes); returns its length.
fn write_sockaddr(addr: SocketAddr, out: &mut [u8]) -> u32 {
    out.fill(0);
    match addr {
        SocketAddr::V4(v4) => {
            out[0..2].copy_from_slice(&(libc::AF_INET as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&v4.port().to_be_bytes());
            out[4..8].copy_from_slice(&v4.ip().octets());
            std::mem::size_of::<libc::sockaddr_in>() as u32
        }
        SocketAddr::V6(v6) => {
            out[0..2].copy_from_slice(&(libc::AF_INET6 as u16).to_ne_bytes());
            out[2..4].copy_from_slice(&v6.port().to_be_bytes());
            out[8..24].copy_from_slice(&v6.ip().octets());
            out[24..28].copy_from_slice(&v6.scope_id().to_ne_bytes());
            std::mem::size_of::<libc::sockaddr_in6>() as u32
        }
    }
}

// ---- event channels ---------------------------------------------------------------------

/// `rdma_create_event_channel`.
#[no_mangle]
pub extern "C" fn rdma_create_event_channel() -> *mut RdmaEventChannel {
    let token = match call(Invocation::CreateEventChannel)
        .and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO))
    {
        Ok(t) => t,
        Err(e) => {
            set_errno(e);
            return ptr::null_mut();
        }
    };
    let (socket, proc) = {
        let g = lock(&CLIENT);
        let c = g.as_ref().expect("the rpc above connected");
        (c.socket.clone(), c.proc)
    };
    let attach = || -> Result<SeqConn, c_int> {
        let conn = SeqConn::connect(&socket).map_err(|_| libc::ENODEV)?;
        let e = Opening::AttachChannel { proc, channel: token }.encode();
        conn.send(&e.0).map_err(|_| libc::ENODEV)?;
        let mut buf = Vec::new();
        match conn.recv(&mut buf) {
            Ok(true) if buf.first() == Some(&proto::CHAN_ATTACHED) => Ok(conn),
            _ => Err(libc::ENODEV),
        }
    };
    match attach() {
        Ok(conn) => Box::into_raw(Box::new(ChannelPriv {
            public: RdmaEventChannel {
                fd: conn.into_raw_fd(),
            },
            token,
            stash: Mutex::new(VecDeque::new()),
        })) as *mut RdmaEventChannel,
        Err(e) => {
            let _ = call(Invocation::DestroyEventChannel { channel: token });
            set_errno(e);
            ptr::null_mut()
        }
    }
}

/// `rdma_destroy_event_channel`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_event_channel(channel: *mut RdmaEventChannel) {
    if channel.is_null() {
        return;
    }
    let ch = channel as *mut ChannelPriv;
    // SAFETY: channel came from rdma_create_event_channel, so it is a live ChannelPriv.
    let token = unsafe { (*ch).token };
    if let Err(errno) = call(Invocation::DestroyEventChannel { channel: token }) {
        // librdmacm's version returns nothing; a refusal (ids still on it) leaves it alive.
        eprintln!(
            "cmsim: rdma_destroy_event_channel: {}",
            cm_core::errno_text(errno)
        );
        return;
    }
    // SAFETY: as above; after this the application no longer uses the channel.
    let ch = unsafe { Box::from_raw(ch) };
    sock::close_fd(ch.public.fd);
}

// ---- ids --------------------------------------------------------------------------------

fn new_id(
    token: u64,
    channel: *mut RdmaEventChannel,
    context: *mut c_void,
    ps: u32,
    sync: bool,
) -> *mut IdPriv {
    let qp_type = if ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB {
        IBV_QPT_UD
    } else {
        IBV_QPT_RC
    };
    let id = Box::into_raw(Box::new(IdPriv {
        public: RdmaCmId {
            verbs: ptr::null_mut(),
            channel,
            context,
            qp: ptr::null_mut(),
            route: RdmaRoute {
                addr: RdmaAddr {
                    src: SockaddrStorage([0; 128]),
                    dst: SockaddrStorage([0; 128]),
                    ibaddr: [0; 40],
                },
                path_rec: ptr::null_mut(),
                num_paths: 0,
            },
            ps,
            port_num: 0,
            event: ptr::null_mut(),
            send_cq_channel: ptr::null_mut(),
            send_cq: ptr::null_mut(),
            recv_cq_channel: ptr::null_mut(),
            recv_cq: ptr::null_mut(),
            srq: ptr::null_mut(),
            pd: ptr::null_mut(),
            qp_type,
        },
        token,
        sync,
        owns_channel: false,
        ep_attr: None,
    }));
    let mut reg = lock(&registry().0);
    reg.ids.insert(token, id as usize);
    reg.live.insert(id as usize);
    drop(reg);
    id
}

unsafe fn token_of(id: *mut RdmaCmId) -> Option<u64> {
    if id.is_null() {
        return None;
    }
    // perftest 4.5's rdma_cm client retries its connect with the ids it destroyed.
    if !lock(&registry().0).live.contains(&(id as usize)) {
        eprintln!("cmsim: an rdma_cm_id that is not live (destroyed already?) was passed: EINVAL");
        return None;
    }
    // SAFETY: non-NULL ids come from this library, so they are IdPriv.
    Some(unsafe { (*(id as *mut IdPriv)).token })
}

/// Binds an id to the device (what librdmacm does once the id has a concrete address): its
/// context, port and, as librdmacm's `ucma_get_device` sets it, the device's default PD
/// (programs such as UCX's rdmacm connection manager make their QPs on `id->pd`).
unsafe fn attach_device(id: *mut RdmaCmId) {
    // SAFETY: id is a live IdPriv of this library.
    unsafe {
        (*id).verbs = crate::device::device_context();
        (*id).port_num = 1;
        if (*id).pd.is_null() {
            (*id).pd = crate::verbs::default_pd();
        }
    }
}

/// `rdma_create_id`; a NULL channel makes a synchronous id with a channel of its own.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_id(
    channel: *mut RdmaEventChannel,
    id: *mut *mut RdmaCmId,
    context: *mut c_void,
    ps: u32,
) -> c_int {
    if id.is_null() {
        return fail(libc::EINVAL);
    }
    let sync = channel.is_null();
    let channel = if sync {
        rdma_create_event_channel()
    } else {
        channel
    };
    if channel.is_null() {
        return -1;
    }
    // SAFETY: channel came from rdma_create_event_channel.
    let ch_token = unsafe { (*(channel as *mut ChannelPriv)).token };
    let Some(port_space) = cm_core::PortSpace::from_raw(ps) else {
        return fail(libc::EINVAL);
    };
    match call(Invocation::CreateId {
        channel: ch_token,
        ps: port_space,
    })
    .and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO))
    {
        Ok(token) => {
            let new = new_id(token, channel, context, ps, sync);
            // SAFETY: new was just allocated; id is the caller's out pointer.
            unsafe {
                (*new).owns_channel = sync;
                *id = new as *mut RdmaCmId;
            }
            0
        }
        Err(errno) => {
            if sync {
                // SAFETY: the channel was made above for this id only.
                unsafe { rdma_destroy_event_channel(channel) };
            }
            fail(errno)
        }
    }
}

/// `rdma_destroy_id`: waits, like librdmacm, until the id's retrieved events are acked.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_id(id: *mut RdmaCmId) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    let (m, cv) = registry();
    let mut reg = lock(m);
    let deadline = Instant::now() + DESTROY_WAIT;
    while reg.unacked.get(&token).copied().unwrap_or(0) > 0 {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            eprintln!("cmsim: rdma_destroy_id: events of this id were not acked within {DESTROY_WAIT:?}");
            return fail(libc::EBUSY);
        }
        reg = cv.wait_timeout(reg, left).unwrap_or_else(|p| p.into_inner()).0;
    }
    drop(reg);
    if let Err(errno) = call(Invocation::DestroyId { id: token }) {
        return fail(errno);
    }
    let mut reg = lock(m);
    reg.ids.remove(&token);
    reg.live.remove(&(id as usize));
    reg.unacked.remove(&token);
    reg.groups.retain(|(id, _), _| *id != token);
    drop(reg);
    // SAFETY: the id is this library's IdPriv and the application gives it up with this call.
    let id = unsafe { Box::from_raw(id as *mut IdPriv) };
    let channel = id.public.channel as *mut ChannelPriv;
    // Stashed events of the id were never seen by the application; the daemon acked them.
    // SAFETY: the id's channel outlives it (librdmacm refuses to destroy a channel in use).
    lock(unsafe { &(*channel).stash }).retain(|w| w.id != token);
    if id.owns_channel {
        // SAFETY: the channel was made for this id only.
        unsafe { rdma_destroy_event_channel(channel as *mut RdmaEventChannel) };
    }
    0
}

/// `rdma_migrate_id`: the id's events go to `channel` from now on; a NULL channel gives the
/// id a channel of its own and makes it synchronous (`EINVAL` for an id that is synchronous
/// already), as librdmacm does. The simulator moves the events it still holds for the id;
/// those the library read from the old channel's socket and kept for it move with them. The
/// ones the daemon had already written into the old channel's socket stay there, where the
/// kernel would move them too: migrate an id before its events come (libfabric migrates its
/// ids as it binds them to an event queue).
#[no_mangle]
pub unsafe extern "C" fn rdma_migrate_id(id: *mut RdmaCmId, channel: *mut RdmaEventChannel) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    let idp = id as *mut IdPriv;
    // SAFETY: id is a live IdPriv.
    if channel.is_null() && unsafe { (*idp).sync } {
        return fail(libc::EINVAL);
    }
    let sync = channel.is_null();
    let new = if sync {
        rdma_create_event_channel()
    } else {
        channel
    };
    if new.is_null() {
        return -1;
    }
    // SAFETY: new came from rdma_create_event_channel (the caller's, or made above).
    let ch_token = unsafe { (*(new as *mut ChannelPriv)).token };
    if let Err(errno) = call(Invocation::MigrateId {
        id: token,
        channel: ch_token,
    }) {
        if sync {
            // SAFETY: the channel was made above for this id only.
            unsafe { rdma_destroy_event_channel(new) };
        }
        return fail(errno);
    }
    // SAFETY: id is a live IdPriv; its channel and new are live ChannelPrivs.
    unsafe {
        let old = (*id).channel as *mut ChannelPriv;
        if old != new as *mut ChannelPriv {
            let mut kept = lock(&(*old).stash);
            let (moved, stay): (VecDeque<WireEvent>, VecDeque<WireEvent>) =
                kept.drain(..).partition(|w| w.id == token);
            *kept = stay;
            drop(kept);
            lock(&(*(new as *mut ChannelPriv)).stash).extend(moved);
        }
        if (*idp).owns_channel {
            rdma_destroy_event_channel(old as *mut RdmaEventChannel);
        }
        (*idp).owns_channel = sync;
        (*idp).sync = sync;
        (*id).channel = new;
    }
    0
}

/// `rdma_bind_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_bind_addr(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: id came from this library; addr is the caller's sockaddr.
    let (Some(token), Some(sa)) = (unsafe { token_of(id) }, unsafe { read_sockaddr(addr) }) else {
        return fail(libc::EINVAL);
    };
    if let Err(errno) = call(Invocation::BindAddr { id: token, addr: sa }) {
        return fail(errno);
    }
    // SAFETY: id is a live IdPriv.
    unsafe {
        refresh_addrs(id, token);
        // A loopback address binds as a wildcard does (the kernel's cma_any_addr): no device.
        if !sa.ip().is_unspecified() && !sa.ip().is_loopback() {
            attach_device(id);
        }
    }
    0
}

/// Copies the daemon's view of the id's addresses into `id->route.addr`.
unsafe fn refresh_addrs(id: *mut RdmaCmId, token: u64) {
    if let Ok(buf) = rpc(&Request::QueryAddrs { id: token }) {
        let mut d = Dec::new(&buf);
        let (local, peer) = (d.addr().ok().flatten(), d.addr().ok().flatten());
        // SAFETY: id is a live IdPriv.
        unsafe { set_addrs(id, local, peer) };
    }
}

unsafe fn set_addrs(id: *mut RdmaCmId, local: Option<SocketAddr>, peer: Option<SocketAddr>) {
    // SAFETY: id is a live IdPriv; the storages are 128 bytes.
    unsafe {
        if let Some(l) = local {
            write_sockaddr(l, &mut (*id).route.addr.src.0);
        }
        if let Some(p) = peer {
            write_sockaddr(p, &mut (*id).route.addr.dst.0);
        }
    }
}

/// `rdma_resolve_addr`.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_addr(
    id: *mut RdmaCmId,
    src: *mut libc::sockaddr,
    dst: *mut libc::sockaddr,
    timeout_ms: c_int,
) -> c_int {
    // SAFETY: id came from this library; src (optional) and dst are the caller's sockaddrs.
    let (Some(token), src, Some(dst)) = (unsafe { token_of(id) }, unsafe { read_sockaddr(src) }, unsafe {
        read_sockaddr(dst)
    }) else {
        return fail(libc::EINVAL);
    };
    if dst.ip().is_multicast() {
        // SAFETY: id is a live IdPriv.
        return unsafe { resolve_multicast(id, token, src, dst) };
    }
    let r = rpc_status(&Request::Cm(Invocation::ResolveAddr {
        id: token,
        src,
        dst,
        timeout: Duration::from_millis(timeout_ms.max(0) as u64),
    }));
    if r == 0 {
        // SAFETY: id is a live IdPriv.
        unsafe { set_addrs(id, src, Some(dst)) };
    }
    // SAFETY: id is a live IdPriv.
    if r == 0 && unsafe { is_sync(id) } {
        // SAFETY: as above.
        return unsafe { complete(id, Call::ResolveAddr) };
    }
    r
}

/// A multicast destination needs no resolution: the id is bound (to `src` when given and not
/// bound yet) and `ADDR_RESOLVED` is queued on its channel at once.
unsafe fn resolve_multicast(
    id: *mut RdmaCmId,
    token: u64,
    src: Option<SocketAddr>,
    dst: SocketAddr,
) -> c_int {
    // SAFETY: id is a live IdPriv.
    unsafe {
        if let (Some(src), true) = (src, (*id).verbs.is_null()) {
            if let Err(errno) = call(Invocation::BindAddr { id: token, addr: src }) {
                return fail(errno);
            }
            refresh_addrs(id, token);
            attach_device(id);
        }
        if (*id).verbs.is_null() {
            // The simulator has no route from an unbound id to a group.
            return fail(libc::EADDRNOTAVAIL);
        }
        set_addrs(id, None, Some(dst));
        queue_local_event(id, token, EV_ADDR_RESOLVED, Some(dst));
    }
    0
}

/// Queues an event the library makes itself (a multicast destination's resolution, which the
/// simulator does not model) on the id's channel, behind those already read.
unsafe fn queue_local_event(id: *mut RdmaCmId, token: u64, event: u32, peer: Option<SocketAddr>) {
    let w = WireEvent {
        event_no: LOCAL_EVENT,
        id: token,
        listen_id: 0,
        event,
        status: 0,
        param: ConnParam {
            qp_num: proto::MCAST_QPN,
            ..ConnParam::ZERO
        },
        local: None,
        peer,
        ud: None,
    };
    // SAFETY: id is a live IdPriv with a live channel.
    lock(unsafe { &(*((*id).channel as *mut ChannelPriv)).stash }).push_back(w);
}

/// `rdma_join_multicast_ex`: the id's QP joins the group of `mc_join_attr->addr`;
/// `MULTICAST_JOIN` follows with the group's address vector, QP number and Q_Key (or
/// `MULTICAST_ERROR` where the device cannot attach the QP), `context` in its
/// `param.ud.private_data`.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast_ex(
    id: *mut RdmaCmId,
    mc_join_attr: *mut c_void,
    context: *mut c_void,
) -> c_int {
    // SAFETY: id came from this library; mc_join_attr is the caller's
    // rdma_cm_join_mc_attr_ex (comp_mask, join_flags, then the address pointer at offset 8).
    let (Some(token), group) = (unsafe { token_of(id) }, unsafe {
        if mc_join_attr.is_null() {
            None
        } else {
            read_sockaddr(*((mc_join_attr as *const u8).add(8) as *const *const libc::sockaddr))
        }
    }) else {
        return fail(libc::EINVAL);
    };
    let Some(group) = group.filter(|g| g.ip().is_multicast()) else {
        return fail(libc::EINVAL);
    };
    // Known before the event can come.
    lock(&registry().0)
        .groups
        .insert((token, group.ip()), context as usize);
    if let Err(errno) = call(Invocation::JoinMulticast { id: token, group }) {
        lock(&registry().0).groups.remove(&(token, group.ip()));
        return fail(errno);
    }
    0
}

/// `rdma_leave_multicast`.
#[no_mangle]
pub unsafe extern "C" fn rdma_leave_multicast(id: *mut RdmaCmId, addr: *mut libc::sockaddr) -> c_int {
    // SAFETY: id came from this library; addr is the caller's sockaddr.
    let (Some(token), Some(group)) = (unsafe { token_of(id) }, unsafe { read_sockaddr(addr) }) else {
        return fail(libc::EINVAL);
    };
    let r = rpc_status(&Request::Cm(Invocation::LeaveMulticast { id: token, group }));
    if r == 0 {
        lock(&registry().0).groups.remove(&(token, group.ip()));
    }
    r
}

/// `rdma_resolve_route`.
#[no_mangle]
pub unsafe extern "C" fn rdma_resolve_route(id: *mut RdmaCmId, timeout_ms: c_int) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    let r = rpc_status(&Request::Cm(Invocation::ResolveRoute {
        id: token,
        timeout: Duration::from_millis(timeout_ms.max(0) as u64),
    }));
    // SAFETY: id is a live IdPriv.
    if r == 0 && unsafe { is_sync(id) } {
        // SAFETY: as above.
        return unsafe { complete(id, Call::ResolveRoute) };
    }
    r
}

/// `rdma_listen`.
#[no_mangle]
pub unsafe extern "C" fn rdma_listen(id: *mut RdmaCmId, backlog: c_int) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    rpc_status(&Request::Cm(Invocation::Listen { id: token, backlog }))
}

/// The caller's `rdma_conn_param`, or librdmacm's defaults for NULL.
unsafe fn conn_param(param: *const RdmaConnParam) -> ConnParam {
    if param.is_null() {
        return ConnParam::new();
    }
    // SAFETY: param is the caller's rdma_conn_param; private_data points at private_data_len bytes.
    unsafe {
        let p = &*param;
        let pd: &[u8] = if p.private_data.is_null() || p.private_data_len == 0 {
            &[]
        } else {
            std::slice::from_raw_parts(p.private_data as *const u8, p.private_data_len as usize)
        };
        ConnParam {
            private_data: cm_core::PrivateData::new(pd),
            responder_resources: p.responder_resources,
            initiator_depth: p.initiator_depth,
            flow_control: p.flow_control,
            retry_count: p.retry_count,
            rnr_retry_count: p.rnr_retry_count,
            srq: p.srq != 0,
            qp_num: p.qp_num,
        }
    }
}

unsafe fn connect_or_accept(connect: bool, id: *mut RdmaCmId, param: *const RdmaConnParam) -> c_int {
    // SAFETY: id came from this library; param is NULL or the caller's.
    let (Some(token), mut p) = (unsafe { token_of(id) }, unsafe { conn_param(param) }) else {
        return fail(libc::EINVAL);
    };
    // Like librdmacm, an id with a QP announces that QP's number (the peer's event reports it).
    // SAFETY: id is a live IdPriv; its qp is NULL or this library's.
    if let Some(qp) = unsafe { (*id).qp.as_ref() } {
        p.qp_num = qp.qp_num;
    }
    let made = if connect {
        Invocation::Connect { id: token, param: p }
    } else {
        Invocation::Accept { id: token, param: p }
    };
    let call = made.call();
    let r = rpc_status(&Request::Cm(made));
    // SAFETY: id is a live IdPriv.
    if r == 0 && unsafe { is_sync(id) } {
        // SAFETY: as above.
        return unsafe { complete(id, call) };
    }
    r
}

/// `rdma_init_qp_attr`: the attributes that move the application's own QP to
/// `qp_attr->qp_state` for the id's connection (the id connected or accepted with
/// `conn_param.qp_num` naming it), and their mask.
#[no_mangle]
pub unsafe extern "C" fn rdma_init_qp_attr(
    id: *mut RdmaCmId,
    qp_attr: *mut IbvQpAttr,
    qp_attr_mask: *mut c_int,
) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    if qp_attr.is_null() || qp_attr_mask.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: qp_attr is the caller's struct ibv_qp_attr.
    let asked = unsafe { (*qp_attr).qp_state };
    // The kernel answers for INIT, RTR and RTS (and the others librdmacm passes on).
    let Some(qp_state) = cm_core::VerbsQpState::from_raw(asked).and_then(crate::request::qp_state_of) else {
        return fail(libc::EINVAL);
    };
    let buf = match call(Invocation::InitQpAttr { id: token, qp_state }) {
        Ok(b) => b,
        Err(errno) => return fail(errno),
    };
    let mut d = Dec::new(&buf);
    let (Ok(mask), Ok(Some(attr))) = (d.u32(), d.verbs_attr()) else {
        return fail(libc::EPROTO);
    };
    // SAFETY: as above; qp_attr_mask is the caller's int.
    unsafe {
        let cap = (*qp_attr).cap;
        *qp_attr = IbvQpAttr::from_verbs(&attr, cap);
        *qp_attr_mask = mask as c_int;
    }
    0
}

/// `rdma_establish`: after the application moved its own QP to RTR and RTS, the RTU goes
/// out and `ESTABLISHED` follows on both sides.
#[no_mangle]
pub unsafe extern "C" fn rdma_establish(id: *mut RdmaCmId) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    rpc_status(&Request::Cm(Invocation::Establish { id: token }))
}

/// `rdma_connect`.
#[no_mangle]
pub unsafe extern "C" fn rdma_connect(id: *mut RdmaCmId, param: *const RdmaConnParam) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { connect_or_accept(true, id, param) }
}

/// `rdma_accept`.
#[no_mangle]
pub unsafe extern "C" fn rdma_accept(id: *mut RdmaCmId, param: *const RdmaConnParam) -> c_int {
    // SAFETY: forwarded contract.
    unsafe { connect_or_accept(false, id, param) }
}

/// `rdma_reject`.
#[no_mangle]
pub unsafe extern "C" fn rdma_reject(id: *mut RdmaCmId, private_data: *const c_void, len: u8) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    let pd = if private_data.is_null() {
        Vec::new()
    } else {
        // SAFETY: the caller passes len readable bytes.
        unsafe { std::slice::from_raw_parts(private_data as *const u8, len as usize) }.to_vec()
    };
    rpc_status(&Request::Cm(Invocation::Reject {
        id: token,
        private_data: pd,
    }))
}

/// `rdma_disconnect`.
#[no_mangle]
pub unsafe extern "C" fn rdma_disconnect(id: *mut RdmaCmId) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    rpc_status(&Request::Cm(Invocation::Disconnect { id: token }))
}

/// `rdma_create_qp`: the QP lives in the simulator; the `ibv_qp` here carries its number and
/// the caller's attributes. NULL CQs are created here with `cq_context = id`, as librdmacm does.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_qp(
    id: *mut RdmaCmId,
    pd: *mut c_void,
    attr: *mut IbvQpInitAttr,
) -> c_int {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return fail(libc::EINVAL);
    };
    if attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: id is a live IdPriv and attr the caller's ibv_qp_init_attr.
    unsafe {
        if (*id).verbs.is_null() {
            attach_device(id);
        }
        if (*attr).send_cq.is_null() {
            let (channel, cq) =
                crate::verbs::default_cq((*id).verbs, (*attr).cap.max_send_wr, id as *mut c_void);
            if cq.is_null() {
                return -1;
            }
            (*id).send_cq_channel = channel;
            (*id).send_cq = cq;
            (*attr).send_cq = cq;
        }
        if (*attr).recv_cq.is_null() {
            let (channel, cq) =
                crate::verbs::default_cq((*id).verbs, (*attr).cap.max_recv_wr, id as *mut c_void);
            if cq.is_null() {
                destroy_default_cqs(id);
                return -1;
            }
            (*id).recv_cq_channel = channel;
            (*id).recv_cq = cq;
            (*attr).recv_cq = cq;
        }
    }
    // librdmacm gives the QP the id's SRQ (rdma_create_srq's) when the caller names none.
    // SAFETY: id is a live IdPriv and attr the caller's ibv_qp_init_attr.
    unsafe {
        if (*attr).srq.is_null() && !(*id).srq.is_null() {
            (*attr).srq = (*id).srq;
        }
    }
    // SAFETY: attr's SRQ is NULL or one of this library's.
    let srq = unsafe { crate::verbs::srq_token((*attr).srq) };
    // librdmacm uses the device's default PD for a NULL one and records it in id->pd.
    let pd = if !pd.is_null() {
        pd
    } else {
        // SAFETY: id is a live IdPriv.
        let own = unsafe { (*id).pd };
        if own.is_null() {
            crate::verbs::default_pd()
        } else {
            own
        }
    };
    // SAFETY: attr is the caller's ibv_qp_init_attr; its CQs came from this library.
    let (cap, send_cq, recv_cq, sig_all, qp_type) = unsafe {
        (
            (*attr).cap,
            crate::verbs::cq_token((*attr).send_cq),
            crate::verbs::cq_token((*attr).recv_cq),
            (*attr).sq_sig_all != 0,
            (*attr).qp_type,
        )
    };
    let mut caps = cm_core::QpCaps::new();
    caps.max_send_wr = cap.max_send_wr;
    caps.max_recv_wr = cap.max_recv_wr;
    caps.max_send_sge = cap.max_send_sge;
    caps.max_recv_sge = cap.max_recv_sge;
    caps.max_inline_data = cap.max_inline_data;
    let create = Request::CreateQp {
        id: token,
        caps,
        send_cq,
        recv_cq,
        sq_sig_all: sig_all,
        qp_type,
        srq,
    };
    let buf = match rpc(&create) {
        Ok(b) => b,
        Err(errno) => {
            // SAFETY: id is a live IdPriv.
            unsafe { destroy_default_cqs(id) };
            return fail(errno);
        }
    };
    crate::verbs::note_srq_qp(token, srq);
    let mut d = Dec::new(&buf);
    let Ok((got, qp_num)) = d.caps().and_then(|caps| Ok((caps, d.u32()?))) else {
        return fail(libc::EPROTO);
    };
    {
        let mut reg = lock(&registry().0);
        reg.recvs.insert(token, Default::default());
        reg.qp_nums.insert(token, qp_num);
    }
    // SAFETY: attr is the caller's (written back as librdmacm does); id is a live IdPriv.
    unsafe {
        (*attr).cap = IbvQpCap {
            max_send_wr: got.max_send_wr,
            max_recv_wr: got.max_recv_wr,
            max_send_sge: got.max_send_sge,
            max_recv_sge: got.max_recv_sge,
            max_inline_data: got.max_inline_data,
        };
        let qp = Box::new(crate::verbs::QpPriv {
            public: IbvQp {
                context: (*id).verbs,
                qp_context: (*attr).qp_context,
                pd,
                send_cq: (*attr).send_cq,
                recv_cq: (*attr).recv_cq,
                srq: (*attr).srq,
                handle: qp_num,
                qp_num,
                state: IBV_QPS_INIT,
                qp_type: (*attr).qp_type,
                sync: [0; 11],
                events_completed: 0,
            },
            token,
            cap: (*attr).cap,
            sq_sig_all: (*attr).sq_sig_all,
            verbs: false,
        });
        (*id).qp = Box::into_raw(qp) as *mut IbvQp;
        (*id).pd = pd;
    }
    0
}

/// Destroys the CQs and channels `rdma_create_qp` made for the id (`ucma_destroy_cqs`).
unsafe fn destroy_default_cqs(id: *mut RdmaCmId) {
    // SAFETY: id is a live IdPriv; its CQ and channel fields are NULL or this library's.
    unsafe {
        for (cq, ch) in [
            (&mut (*id).send_cq, &mut (*id).send_cq_channel),
            (&mut (*id).recv_cq, &mut (*id).recv_cq_channel),
        ] {
            let cq = std::mem::replace(cq, ptr::null_mut());
            if !cq.is_null() {
                crate::verbs::ibv_destroy_cq(cq as *mut IbvCq);
            }
            let ch = std::mem::replace(ch, ptr::null_mut());
            if !ch.is_null() {
                crate::verbs::ibv_destroy_comp_channel(ch as *mut IbvCompChannel);
            }
        }
    }
}

/// `rdma_create_srq`: an SRQ on the id's device, on `pd` (NULL: the id's, else the device's
/// default), recorded in `id->srq`, which `rdma_create_qp` then gives the id's QP and
/// `rdma_post_recv` posts on. What `ibv_create_srq` refuses, this refuses.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_srq(
    id: *mut RdmaCmId,
    pd: *mut IbvPd,
    attr: *mut crate::abi::IbvSrqInitAttr,
) -> c_int {
    // SAFETY: id came from this library.
    if unsafe { token_of(id) }.is_none() || attr.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: id is a live IdPriv.
    let pd = unsafe {
        if (*id).verbs.is_null() {
            attach_device(id);
        }
        match (pd.is_null(), (*id).pd.is_null()) {
            (false, _) => pd,
            (true, false) => (*id).pd as *mut IbvPd,
            (true, true) => crate::verbs::default_pd() as *mut IbvPd,
        }
    };
    // SAFETY: pd is a PD of this library's and attr the caller's ibv_srq_init_attr.
    let srq = unsafe { crate::verbs::ibv_create_srq(pd, attr) };
    if srq.is_null() {
        return -1;
    }
    // SAFETY: id is a live IdPriv.
    unsafe {
        if (*id).pd.is_null() {
            (*id).pd = pd as *mut c_void;
        }
        (*id).srq = srq as *mut c_void;
    }
    0
}

/// `rdma_destroy_srq`: destroys `id->srq` (librdmacm ignores a refusal: the SRQ stays if a
/// QP still uses it) and forgets it, and the id's CQs go with it, as in librdmacm.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_srq(id: *mut RdmaCmId) {
    // SAFETY: id came from this library.
    if unsafe { token_of(id) }.is_none() {
        return;
    }
    // SAFETY: id is a live IdPriv; its SRQ is NULL or this library's.
    unsafe {
        let srq = std::mem::replace(&mut (*id).srq, ptr::null_mut());
        if !srq.is_null() {
            crate::verbs::ibv_destroy_srq(srq as *mut crate::abi::IbvSrq);
        }
        destroy_default_cqs(id);
    }
}

/// `rdma_destroy_qp`.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_qp(id: *mut RdmaCmId) {
    // SAFETY: id came from this library.
    let Some(token) = (unsafe { token_of(id) }) else {
        return;
    };
    if let Err(errno) = call(Invocation::DestroyQp { id: token }) {
        eprintln!("cmsim: rdma_destroy_qp: {}", cm_core::errno_text(errno));
        return;
    }
    {
        let mut reg = lock(&registry().0);
        reg.recvs.remove(&token);
        reg.qp_nums.remove(&token);
    }
    // SAFETY: id is a live IdPriv; its qp, when set, is this library's QpPriv.
    unsafe {
        let qp = std::mem::replace(&mut (*id).qp, ptr::null_mut());
        if !qp.is_null() {
            drop(Box::from_raw(qp as *mut crate::verbs::QpPriv));
        }
        destroy_default_cqs(id);
    }
}

/// Unhooks a QP `ibv_destroy_qp` destroyed from its id, so the id is not left pointing at it.
pub(crate) fn forget_qp(token: u64, qp: *mut IbvQp) {
    crate::verbs::forget_srq_qp(token);
    let mut reg = lock(&registry().0);
    reg.recvs.remove(&token);
    reg.qp_nums.remove(&token);
    if let Some(&id) = reg.ids.get(&token) {
        let id = id as *mut RdmaCmId;
        // SAFETY: ids in the registry are live IdPriv; the registry lock serialises this.
        unsafe {
            if (*id).qp == qp {
                (*id).qp = ptr::null_mut();
            }
        }
    }
}

// ---- events -----------------------------------------------------------------------------

/// `rdma_get_cm_event`: one datagram from the channel socket (honouring `O_NONBLOCK`).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_cm_event(
    channel: *mut RdmaEventChannel,
    event: *mut *mut RdmaCmEvent,
) -> c_int {
    if channel.is_null() || event.is_null() {
        return fail(libc::EINVAL);
    }
    let ch = channel as *mut ChannelPriv;
    loop {
        // SAFETY: channel came from rdma_create_event_channel.
        let stashed = lock(unsafe { &(*ch).stash }).pop_front();
        let w = match stashed {
            Some(w) => w,
            // SAFETY: as above.
            None => match unsafe { recv_wire(ch) } {
                Ok(w) => w,
                Err(errno) => return fail(errno),
            },
        };
        // SAFETY: channel is live (above); the ids found in the registry are live IdPriv.
        if let Some(ev) = unsafe { build_event(channel, w) } {
            // SAFETY: event is the caller's out pointer.
            unsafe { *event = ev as *mut RdmaCmEvent };
            return 0;
        }
        // The event's id was destroyed after the daemon sent it: the daemon acked it then.
    }
}

/// Reads the next event datagram from a channel socket (blocking unless `O_NONBLOCK`).
unsafe fn recv_wire(ch: *mut ChannelPriv) -> Result<WireEvent, c_int> {
    // SAFETY: ch is a live channel of this library.
    let fd = unsafe { (*ch).public.fd };
    let mut buf = Vec::new();
    loop {
        let flags = if sock::is_nonblocking(fd) {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        match sock::recv_fd(fd, &mut buf, flags) {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("cmsim: the fabric daemon went away");
                return Err(libc::ENODEV);
            }
            Err(e) => return Err(e.raw_os_error().unwrap_or(libc::EIO)),
        }
        let mut d = Dec::new(&buf);
        if d.u8() == Ok(proto::CHAN_EVENT) {
            return d.event().map_err(|_| libc::EPROTO);
        }
    }
}

/// Waits for the first event on the id's channel that `want` accepts; events for other ids
/// read meanwhile are kept for later `rdma_get_cm_event` or synchronous calls.
unsafe fn wait_wire(ch: *mut ChannelPriv, want: impl Fn(&WireEvent) -> bool) -> Result<WireEvent, c_int> {
    {
        // SAFETY: ch is a live channel of this library.
        let mut stash = lock(unsafe { &(*ch).stash });
        if let Some(pos) = stash.iter().position(&want) {
            return Ok(stash.remove(pos).expect("position found"));
        }
    }
    loop {
        // SAFETY: as above.
        let w = unsafe { recv_wire(ch) }?;
        if want(&w) {
            return Ok(w);
        }
        // SAFETY: as above.
        lock(unsafe { &(*ch).stash }).push_back(w);
    }
}

unsafe fn is_sync(id: *mut RdmaCmId) -> bool {
    // SAFETY: id is a live IdPriv.
    unsafe { (*(id as *mut IdPriv)).sync }
}

/// Gives an event the library consumed itself back to the daemon.
fn ack_wire(w: &WireEvent) {
    let _ = tell(&Request::AckEvent { event: w.event_no });
}

/// librdmacm's `ucma_complete`: a synchronous `call` waits for the id's next event and turns
/// its status into the call's result, as cm-core's `SyncId` does.
unsafe fn complete(id: *mut RdmaCmId, call: Call) -> c_int {
    // SAFETY: id is a live synchronous IdPriv.
    let (token, ch) = unsafe { ((*(id as *mut IdPriv)).token, (*id).channel as *mut ChannelPriv) };
    // SAFETY: the id's channel is live.
    let w = match unsafe { wait_wire(ch, |w| w.id == token) } {
        Ok(w) => w,
        Err(errno) => return fail(errno),
    };
    ack_wire(&w);
    // SAFETY: id is live.
    unsafe {
        set_addrs(id, w.local, w.peer);
        if w.event == EV_ADDR_RESOLVED {
            attach_device(id);
        }
    }
    let event = cm_core::CmEventType::from(w.event);
    if w.status == 0 && event != cm_core::CmEventType::Rejected {
        return 0;
    }
    fail(
        CmError::EventFailed {
            call,
            event,
            status: w.status,
        }
        .errno(),
    )
}

unsafe fn build_event(channel: *mut RdmaEventChannel, w: proto::WireEvent) -> Option<*mut EventPriv> {
    let (m, _) = registry();
    let mut reg = lock(m);
    let listen = if w.listen_id != 0 {
        reg.ids.get(&w.listen_id).copied()
    } else {
        None
    };
    let id = match reg.ids.get(&w.id).copied() {
        Some(id) => id as *mut RdmaCmId,
        None if w.event == EV_CONNECT_REQUEST => {
            let l = listen? as *mut RdmaCmId;
            drop(reg);
            // SAFETY: l is a live IdPriv (found in the registry).
            let (context, ps) = unsafe { ((*l).context, (*l).ps) };
            let child = new_id(w.id, channel, context, ps, false) as *mut RdmaCmId;
            // SAFETY: child was just allocated.
            unsafe { attach_device(child) };
            reg = lock(m);
            child
        }
        None => return None,
    };
    let counted = if w.event == EV_CONNECT_REQUEST && w.listen_id != 0 {
        w.listen_id
    } else {
        w.id
    };
    *reg.unacked.entry(counted).or_insert(0) += 1;
    drop(reg);
    // SAFETY: id is a live IdPriv.
    unsafe {
        set_addrs(id, w.local, w.peer);
        if w.event == EV_ADDR_RESOLVED {
            attach_device(id);
        }
    }
    let mut ev = Box::new(EventPriv {
        public: RdmaCmEvent {
            id,
            listen_id: listen.map_or(ptr::null_mut(), |l| l as *mut RdmaCmId),
            event: w.event,
            status: w.status,
            conn: RdmaConnParam {
                private_data: ptr::null(),
                private_data_len: 0,
                responder_resources: w.param.responder_resources,
                initiator_depth: w.param.initiator_depth,
                flow_control: w.param.flow_control,
                retry_count: w.param.retry_count,
                rnr_retry_count: w.param.rnr_retry_count,
                srq: w.param.srq as u8,
                pad0: 0,
                qp_num: w.param.qp_num,
                pad1: 0,
            },
            param_rest: [0; 32],
        },
        event_no: w.event_no,
        counted,
        private_data: w.param.private_data.as_slice().to_vec(),
    });
    if !ev.private_data.is_empty() {
        ev.public.conn.private_data = ev.private_data.as_ptr() as *const c_void;
        ev.public.conn.private_data_len = ev.private_data.len().min(255) as u8;
    }
    // SAFETY: id is a live IdPriv.
    let ps = unsafe { (*id).ps };
    if let (true, Some(dest)) = (ps == RDMA_PS_UDP || ps == RDMA_PS_IPOIB, w.ud) {
        // Datagram ids read `param.ud`: the destination the simulator reported.
        ud_param(&mut ev.public, &dest);
        if w.event == EV_MULTICAST_JOIN || w.event == EV_MULTICAST_ERROR {
            // librdmacm hands the join's context back in the private data's place.
            let group = dest.ah_attr.dest_ip();
            let context = group.and_then(|g| lock(&registry().0).groups.get(&(w.id, g)).copied());
            ev.public.conn.private_data = context.unwrap_or(0) as *const c_void;
            ev.public.conn.private_data_len = 0;
        }
    }
    Some(Box::into_raw(ev))
}

/// Fills `event->param.ud` (`ah_attr` at offset 40, `qp_num` at 72, `qkey` at 76).
fn ud_param(ev: &mut RdmaCmEvent, dest: &cm_core::UdParam) {
    let mut ud = [0u8; 40];
    ud[..32].copy_from_slice(&crate::abi::IbvAhAttr::from(dest.ah_attr).to_bytes());
    ud[32..36].copy_from_slice(&dest.qp_num.to_ne_bytes());
    ud[36..40].copy_from_slice(&dest.qkey.to_ne_bytes());
    // The conn view's qp_num and padding overlap ah_attr: a datagram event has no conn view.
    ev.conn.qp_num = u32::from_ne_bytes([ud[0], ud[1], ud[2], ud[3]]);
    ev.conn.pad1 = u32::from_ne_bytes([ud[4], ud[5], ud[6], ud[7]]);
    ev.param_rest.copy_from_slice(&ud[8..]);
}

/// `rdma_ack_cm_event`.
#[no_mangle]
pub unsafe extern "C" fn rdma_ack_cm_event(event: *mut RdmaCmEvent) -> c_int {
    if event.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: event came from rdma_get_cm_event and is given back exactly once.
    let ev = unsafe { Box::from_raw(event as *mut EventPriv) };
    let r = if ev.event_no == LOCAL_EVENT {
        0
    } else {
        // librdmacm's ack is the library's alone and cannot fail for an event it gave out; the
        // daemon is told (it holds the id's accounting) without a round trip.
        match tell(&Request::AckEvent { event: ev.event_no }) {
            Ok(()) => 0,
            Err(errno) => fail(errno),
        }
    };
    let (m, cv) = registry();
    let mut reg = lock(m);
    if let Some(n) = reg.unacked.get_mut(&ev.counted) {
        *n = n.saturating_sub(1);
    }
    drop(reg);
    cv.notify_all();
    r
}

/// `rdma_event_str`: cm-core's names, NUL-terminated once. rdma-core v44 names the first 16
/// event types (through `TIMEWAIT_EXIT`); later numbers are `UNKNOWN EVENT` there, and here.
#[no_mangle]
pub extern "C" fn rdma_event_str(event: u32) -> *const c_char {
    const V44_NAMED: usize = 16;
    static NAMES: OnceLock<Vec<std::ffi::CString>> = OnceLock::new();
    let names = NAMES.get_or_init(|| {
        cm_core::CmEventType::ALL[..V44_NAMED]
            .iter()
            .map(|t| std::ffi::CString::new(t.name()).expect("event names have no NUL"))
            .collect()
    });
    names
        .get(event as usize)
        .map_or(c"UNKNOWN EVENT", |n| n.as_c_str())
        .as_ptr()
}

/// `rdma_set_option`: the options the rdma-core programs set (type of service, address reuse,
/// IPv6-only, ACK timeout) are accepted and have no effect on the simulator; others are `ENOSYS`.
#[no_mangle]
pub unsafe extern "C" fn rdma_set_option(
    id: *mut RdmaCmId,
    level: c_int,
    optname: c_int,
    optval: *mut c_void,
    optlen: usize,
) -> c_int {
    const RDMA_OPTION_ID: c_int = 0;
    // TOS, REUSEADDR, AFONLY, ACK_TIMEOUT: rdma_cma.h's RDMA_OPTION_ID_* values.
    const ACCEPTED: [c_int; 4] = [0, 1, 2, 3];
    // SAFETY: id came from this library.
    if unsafe { token_of(id) }.is_none() || optval.is_null() || optlen == 0 {
        return fail(libc::EINVAL);
    }
    if level == RDMA_OPTION_ID && ACCEPTED.contains(&optname) {
        return 0;
    }
    unsupported(&format!("rdma_set_option level {level} option {optname}"))
}

// ---- synchronous endpoints --------------------------------------------------------------

/// `rdma_create_ep`: a synchronous id; passive (`RAI_PASSIVE`) ones are bound and remember
/// `qp_init_attr` for `rdma_get_request`, active ones are resolved and get their QP.
#[no_mangle]
pub unsafe extern "C" fn rdma_create_ep(
    id: *mut *mut RdmaCmId,
    res: *const RdmaAddrinfo,
    pd: *mut c_void,
    qp_init_attr: *mut IbvQpInitAttr,
) -> c_int {
    if id.is_null() || res.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: res came from rdma_getaddrinfo (or is the caller's equivalent).
    let res = unsafe { &*res };
    let mut new: *mut RdmaCmId = ptr::null_mut();
    // SAFETY: new is a valid out pointer.
    if unsafe {
        rdma_create_id(
            ptr::null_mut(),
            &mut new,
            ptr::null_mut(),
            res.ai_port_space as u32,
        )
    } != 0
    {
        return -1;
    }
    let setup = || -> c_int {
        // SAFETY: new is a live synchronous IdPriv; res' addresses are NULL or valid sockaddrs;
        // qp_init_attr is NULL or the caller's.
        unsafe {
            if res.ai_flags & RAI_PASSIVE != 0 {
                if rdma_bind_addr(new, res.ai_src_addr as *mut libc::sockaddr) != 0 {
                    return -1;
                }
                if !qp_init_attr.is_null() {
                    (*(new as *mut IdPriv)).ep_attr = Some((*qp_init_attr, pd));
                }
                return 0;
            }
            let src = res.ai_src_addr as *mut libc::sockaddr;
            if rdma_resolve_addr(new, src, res.ai_dst_addr as *mut libc::sockaddr, 2000) != 0 {
                return -1;
            }
            if rdma_resolve_route(new, 2000) != 0 {
                return -1;
            }
            if !qp_init_attr.is_null() {
                (*qp_init_attr).qp_type = res.ai_qp_type as u32;
                if rdma_create_qp(new, pd, qp_init_attr) != 0 {
                    return -1;
                }
            }
            0
        }
    };
    if setup() != 0 {
        let errno = std::io::Error::last_os_error()
            .raw_os_error()
            .unwrap_or(libc::EINVAL);
        // SAFETY: new is this function's id, not handed out.
        unsafe { rdma_destroy_ep(new) };
        return fail(errno);
    }
    // SAFETY: id is the caller's out pointer.
    unsafe { *id = new };
    0
}

/// `rdma_destroy_ep`: the QP (if any), then the id with its channel.
#[no_mangle]
pub unsafe extern "C" fn rdma_destroy_ep(id: *mut RdmaCmId) {
    if id.is_null() {
        return;
    }
    // SAFETY: id came from this library.
    unsafe {
        if !(*id).qp.is_null() {
            rdma_destroy_qp(id);
        }
        rdma_destroy_id(id);
    }
}

/// `rdma_get_request`: waits for a connection request on a synchronous listener; the new id
/// gets a QP from the listener's `rdma_create_ep` attributes.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_request(listen: *mut RdmaCmId, id: *mut *mut RdmaCmId) -> c_int {
    // SAFETY: listen came from this library.
    let Some(token) = (unsafe { token_of(listen) }) else {
        return fail(libc::EINVAL);
    };
    // SAFETY: as above.
    if id.is_null() || !unsafe { is_sync(listen) } {
        return fail(libc::EINVAL);
    }
    // SAFETY: listen is a live IdPriv with a live channel.
    let ch = unsafe { (*listen).channel } as *mut ChannelPriv;
    // SAFETY: as above.
    let w = match unsafe { wait_wire(ch, |w| w.event == EV_CONNECT_REQUEST && w.listen_id == token) } {
        Ok(w) => w,
        Err(errno) => return fail(errno),
    };
    ack_wire(&w);
    // SAFETY: listen is live.
    let (context, ps, ep_attr) = unsafe {
        (
            (*listen).context,
            (*listen).ps,
            (*(listen as *mut IdPriv)).ep_attr,
        )
    };
    let child = new_id(w.id, ch as *mut RdmaEventChannel, context, ps, true) as *mut RdmaCmId;
    // SAFETY: child was just allocated.
    unsafe {
        attach_device(child);
        set_addrs(child, w.local, w.peer);
    }
    if let Some((mut attr, pd)) = ep_attr {
        // SAFETY: child is live; attr is this function's copy.
        if unsafe { rdma_create_qp(child, pd, &mut attr) } != 0 {
            let errno = std::io::Error::last_os_error()
                .raw_os_error()
                .unwrap_or(libc::EINVAL);
            // SAFETY: child is live and not handed out.
            unsafe {
                rdma_reject(child, ptr::null(), 0);
                rdma_destroy_id(child);
            }
            return fail(errno);
        }
    }
    // SAFETY: id is the caller's out pointer.
    unsafe { *id = child };
    0
}

// ---- rdma_getaddrinfo -------------------------------------------------------------------

/// An `rdma_addrinfo` with its addresses in the same allocation.
#[repr(C)]
struct AddrinfoPriv {
    public: RdmaAddrinfo,
    src: SockaddrStorage,
    dst: SockaddrStorage,
}

/// A host name the system resolver knows, as an address literal for cm-core's numeric
/// [`getaddrinfo`](cm_core::getaddrinfo); literals (and no node) pass as they are.
fn numeric_node(node: Option<&str>) -> Result<Option<String>, c_int> {
    let Some(node) = node else { return Ok(None) };
    if node
        .trim_start_matches('[')
        .trim_end_matches(']')
        .parse::<IpAddr>()
        .is_ok()
    {
        return Ok(Some(node.to_string()));
    }
    use std::net::ToSocketAddrs;
    (node, 0)
        .to_socket_addrs()
        .ok()
        .and_then(|mut a| a.next())
        .map(|a| Some(a.ip().to_string()))
        .ok_or(libc::EADDRNOTAVAIL)
}

/// `rdma_getaddrinfo`: numeric addresses and names the system resolver knows; no route or
/// connect data (`ai_route`, `ai_connect` stay NULL, as they do over RoCE).
#[no_mangle]
pub unsafe extern "C" fn rdma_getaddrinfo(
    node: *const c_char,
    service: *const c_char,
    hints: *const RdmaAddrinfo,
    res: *mut *mut RdmaAddrinfo,
) -> c_int {
    if res.is_null() || (node.is_null() && service.is_null() && hints.is_null()) {
        return fail(libc::EINVAL);
    }
    if node.is_null() && service.is_null() {
        // SAFETY: hints is the caller's, non-NULL (checked); res is its out pointer.
        return unsafe { addrinfo_of_hints(&*hints, res) };
    }
    // SAFETY: node and service are NULL or C strings; hints is NULL or the caller's.
    let (node, service, hints) = unsafe {
        (
            (!node.is_null()).then(|| CStr::from_ptr(node).to_string_lossy().into_owned()),
            (!service.is_null()).then(|| CStr::from_ptr(service).to_string_lossy().into_owned()),
            hints.as_ref(),
        )
    };
    let flags = hints.map_or(0, |h| h.ai_flags);
    let passive = flags & RAI_PASSIVE != 0;
    if flags & RAI_NUMERICHOST != 0 && node.as_deref().is_some_and(|n| n.parse::<IpAddr>().is_err()) {
        return fail(libc::EINVAL);
    }
    // The rules (ports, the wildcard of a passive lookup, families) are cm-core's; names are
    // the system resolver's, which cm-core does not ask.
    let node = match numeric_node(node.as_deref()) {
        Ok(n) => n,
        Err(e) => return fail(e),
    };
    let core_hints = cm_core::AddrHints {
        passive,
        port_space: cm_core::PortSpace::Tcp,
        ipv6: match hints.map_or(0, |h| h.ai_family) {
            libc::AF_INET => Some(false),
            libc::AF_INET6 => Some(true),
            _ => None,
        },
    };
    let addr = match cm_core::getaddrinfo(node.as_deref(), service.as_deref(), &core_hints) {
        Ok(infos) => match infos.first().and_then(|i| i.src.or(i.dst)) {
            Some(a) => a,
            None => return fail(libc::EADDRNOTAVAIL),
        },
        Err(e) => return fail(e.errno()),
    };
    let mut ai = Box::new(AddrinfoPriv {
        public: RdmaAddrinfo {
            ai_flags: flags,
            ai_family: if addr.is_ipv4() {
                libc::AF_INET
            } else {
                libc::AF_INET6
            },
            ai_qp_type: hints.map_or(0, |h| h.ai_qp_type).max(0),
            ai_port_space: hints.map_or(0, |h| h.ai_port_space),
            ai_src_len: 0,
            ai_dst_len: 0,
            ai_src_addr: ptr::null_mut(),
            ai_dst_addr: ptr::null_mut(),
            ai_src_canonname: ptr::null_mut(),
            ai_dst_canonname: ptr::null_mut(),
            ai_route_len: 0,
            ai_route: ptr::null_mut(),
            ai_connect_len: 0,
            ai_connect: ptr::null_mut(),
            ai_next: ptr::null_mut(),
        },
        src: SockaddrStorage([0; 128]),
        dst: SockaddrStorage([0; 128]),
    });
    if ai.public.ai_qp_type == 0 {
        ai.public.ai_qp_type = IBV_QPT_RC as i32;
    }
    if ai.public.ai_port_space == 0 {
        ai.public.ai_port_space = RDMA_PS_TCP as i32;
    }
    if passive {
        ai.public.ai_src_len = write_sockaddr(addr, &mut ai.src.0);
    } else {
        ai.public.ai_dst_len = write_sockaddr(addr, &mut ai.dst.0);
        let src_hint = hints.map_or(ptr::null(), |h| h.ai_src_addr as *const libc::sockaddr);
        // SAFETY: hints' source address is NULL or a valid sockaddr of the caller's.
        if let Some(src) = unsafe { read_sockaddr(src_hint) } {
            ai.public.ai_src_len = write_sockaddr(src, &mut ai.src.0);
        }
    }
    let raw = Box::into_raw(ai);
    // SAFETY: raw is the allocation just made; the address fields point into it.
    unsafe {
        if (*raw).public.ai_src_len != 0 {
            (*raw).public.ai_src_addr = (*raw).src.0.as_mut_ptr() as *mut c_void;
        }
        if (*raw).public.ai_dst_len != 0 {
            (*raw).public.ai_dst_addr = (*raw).dst.0.as_mut_ptr() as *mut c_void;
        }
        *res = raw as *mut RdmaAddrinfo;
    }
    0
}

/// `rdma_getaddrinfo` with neither node nor service: librdmacm's answer is the hints' own
/// flags, family, QP type, port space and addresses (what libfabric's verbs provider asks for
/// an address it has already). An address of another family than `AF_INET`/`AF_INET6`
/// (`AF_IB`) is `EAFNOSUPPORT`, with a line on stderr.
///
/// # Safety
/// `hints`' addresses are NULL or valid for their lengths; `res` is valid for writing.
unsafe fn addrinfo_of_hints(hints: &RdmaAddrinfo, res: *mut *mut RdmaAddrinfo) -> c_int {
    let read = |len: u32, addr: *mut c_void| -> Result<Option<SocketAddr>, ()> {
        if len == 0 || addr.is_null() {
            return Ok(None);
        }
        // SAFETY: the caller's address of len bytes (its family says how many are read).
        match unsafe { read_sockaddr(addr as *const libc::sockaddr) } {
            Some(a) => Ok(Some(a)),
            None => Err(()),
        }
    };
    let (Ok(dst), Ok(src)) = (
        read(hints.ai_dst_len, hints.ai_dst_addr),
        read(hints.ai_src_len, hints.ai_src_addr),
    ) else {
        eprintln!("cmsim: rdma_getaddrinfo: hints with an address of a family other than AF_INET and AF_INET6 (EAFNOSUPPORT)");
        return fail(libc::EAFNOSUPPORT);
    };
    let mut ai = Box::new(AddrinfoPriv {
        public: RdmaAddrinfo {
            ai_flags: hints.ai_flags,
            ai_family: hints.ai_family,
            ai_qp_type: hints.ai_qp_type,
            ai_port_space: hints.ai_port_space,
            ai_src_len: 0,
            ai_dst_len: 0,
            ai_src_addr: ptr::null_mut(),
            ai_dst_addr: ptr::null_mut(),
            ai_src_canonname: ptr::null_mut(),
            ai_dst_canonname: ptr::null_mut(),
            ai_route_len: 0,
            ai_route: ptr::null_mut(),
            ai_connect_len: 0,
            ai_connect: ptr::null_mut(),
            ai_next: ptr::null_mut(),
        },
        src: SockaddrStorage([0; 128]),
        dst: SockaddrStorage([0; 128]),
    });
    if let Some(d) = dst {
        ai.public.ai_dst_len = write_sockaddr(d, &mut ai.dst.0);
    }
    if let Some(s) = src {
        ai.public.ai_src_len = write_sockaddr(s, &mut ai.src.0);
    }
    let raw = Box::into_raw(ai);
    // SAFETY: raw is the allocation just made; the address fields point into it.
    unsafe {
        if (*raw).public.ai_src_len != 0 {
            (*raw).public.ai_src_addr = (*raw).src.0.as_mut_ptr() as *mut c_void;
        }
        if (*raw).public.ai_dst_len != 0 {
            (*raw).public.ai_dst_addr = (*raw).dst.0.as_mut_ptr() as *mut c_void;
        }
        *res = raw as *mut RdmaAddrinfo;
    }
    0
}

/// `rdma_freeaddrinfo`.
#[no_mangle]
pub unsafe extern "C" fn rdma_freeaddrinfo(res: *mut RdmaAddrinfo) {
    let mut cur = res;
    while !cur.is_null() {
        // SAFETY: every element of the list came from rdma_getaddrinfo as an AddrinfoPriv.
        let ai = unsafe { Box::from_raw(cur as *mut AddrinfoPriv) };
        cur = ai.public.ai_next;
    }
}

// ---- addresses, ports, devices ---------------------------------------------------------

/// librdmacm's `ucma_get_port`: the port of a socket address in network order (0 for a family
/// without one). For `AF_IB` it is the low 16 bits of the service id.
unsafe fn port_of(addr: *const SockaddrStorage) -> u16 {
    // SAFETY: addr points at a sockaddr_storage of this library's id.
    let b = unsafe { &(*addr).0 };
    match u16::from_ne_bytes([b[0], b[1]]) as c_int {
        libc::AF_INET | libc::AF_INET6 => u16::from_ne_bytes([b[2], b[3]]),
        AF_IB => {
            // sockaddr_ib: sib_sid, big-endian, at offset 24.
            let sid = u64::from_be_bytes(b[24..32].try_into().expect("8 bytes"));
            (sid as u16).to_be()
        }
        _ => 0,
    }
}

/// `AF_IB`: the family of `struct sockaddr_ib`.
const AF_IB: c_int = 27;

/// `rdma_get_src_port`: the id's local port, in network order (0 while it has none).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_src_port(id: *mut RdmaCmId) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: id came from this library; its route holds the addresses set_addrs wrote.
    unsafe { port_of(&(*id).route.addr.src) }
}

/// `rdma_get_dst_port`: the id's peer's port, in network order (0 while it has none).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_dst_port(id: *mut RdmaCmId) -> u16 {
    if id.is_null() {
        return 0;
    }
    // SAFETY: as in rdma_get_src_port.
    unsafe { port_of(&(*id).route.addr.dst) }
}

/// `rdma_get_local_addr`: `&id->route.addr.src_addr` (an inline function in `rdma_cma.h`;
/// librdmacm's map names it, so it is exported for programs that look it up).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_local_addr(id: *mut RdmaCmId) -> *mut libc::sockaddr {
    if id.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: id came from this library; only the field's address is taken.
    unsafe { ptr::addr_of_mut!((*id).route.addr.src) as *mut libc::sockaddr }
}

/// `rdma_get_peer_addr`: `&id->route.addr.dst_addr` (an inline function in `rdma_cma.h`, as
/// `rdma_get_local_addr`).
#[no_mangle]
pub unsafe extern "C" fn rdma_get_peer_addr(id: *mut RdmaCmId) -> *mut libc::sockaddr {
    if id.is_null() {
        return ptr::null_mut();
    }
    // SAFETY: as in rdma_get_local_addr.
    unsafe { ptr::addr_of_mut!((*id).route.addr.dst) as *mut libc::sockaddr }
}

/// `rdma_join_multicast`: as librdmacm does, `rdma_join_multicast_ex` with the address and
/// a full-member join.
#[no_mangle]
pub unsafe extern "C" fn rdma_join_multicast(
    id: *mut RdmaCmId,
    addr: *mut libc::sockaddr,
    context: *mut c_void,
) -> c_int {
    /// `struct rdma_cm_join_mc_attr_ex`.
    #[repr(C)]
    struct JoinAttr {
        comp_mask: u32,
        join_flags: u32,
        addr: *mut libc::sockaddr,
    }
    // RDMA_CM_JOIN_MC_ATTR_ADDRESS | RDMA_CM_JOIN_MC_ATTR_JOIN_FLAGS; RDMA_MC_JOIN_FLAG_FULLMEMBER.
    let mut attr = JoinAttr {
        comp_mask: 1 | 2,
        join_flags: 0,
        addr,
    };
    // SAFETY: id and addr are the caller's, as rdma_join_multicast_ex takes them; attr lives
    // for the call.
    unsafe { rdma_join_multicast_ex(id, ptr::addr_of_mut!(attr) as *mut c_void, context) }
}

/// `rdma_get_devices`: the one simulated device's context, the one every id is bound to (as
/// librdmacm's list holds the contexts its ids use). A process whose host is not on the fabric
/// (or without a daemon) has none: NULL, `*num_devices` 0 and the reason in errno.
#[no_mangle]
pub unsafe extern "C" fn rdma_get_devices(num_devices: *mut c_int) -> *mut *mut c_void {
    let list = match daemon_address() {
        Ok(_) => {
            Box::into_raw(Box::new([crate::device::device_context(), ptr::null_mut()])) as *mut *mut c_void
        }
        Err(errno) => {
            set_errno(errno);
            ptr::null_mut()
        }
    };
    if !num_devices.is_null() {
        // SAFETY: num_devices is the caller's int.
        unsafe { *num_devices = if list.is_null() { 0 } else { 1 } };
    }
    list
}

/// `rdma_free_devices`: frees a list of `rdma_get_devices` (the contexts live on).
#[no_mangle]
pub unsafe extern "C" fn rdma_free_devices(list: *mut *mut c_void) {
    if !list.is_null() {
        // SAFETY: list came from rdma_get_devices, a boxed two-entry array, given back once.
        drop(unsafe { Box::from_raw(list as *mut [*mut c_void; 2]) });
    }
}

// ---- everything else --------------------------------------------------------------------

/// Not served: each macro below exports the named calls with the answer their C return type
/// gives for an error, and one line on stderr naming the call (see [`refuse`]). The functions
/// take no parameters: under the C calling convention the caller's arguments are ignored.
macro_rules! unsupported_int {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on the simulator: returns -1 with errno `ENOSYS` and says so on stderr.
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            unsupported(stringify!($name))
        }
    )*};
}

/// `ssize_t` calls: -1 (all 64 bits of it) with errno `ENOSYS`.
macro_rules! unsupported_ssize {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on the simulator: returns -1 (`ssize_t`) with errno `ENOSYS` and says
        /// so on stderr.
        #[no_mangle]
        pub extern "C" fn $name() -> libc::ssize_t {
            unsupported(stringify!($name)) as libc::ssize_t
        }
    )*};
}

/// `int` calls that return the errno value itself (most verbs): that value, errno set too.
macro_rules! unsupported_errno {
    ($errno:ident: $($name:ident),* $(,)?) => {$(
        #[doc = concat!(
            "Not supported on the simulator: returns `", stringify!($errno),
            "` (the verb's errno value; errno is set too) and says so on stderr."
        )]
        #[no_mangle]
        pub extern "C" fn $name() -> c_int {
            refuse(stringify!($name), libc::$errno)
        }
    )*};
}

macro_rules! unsupported_ptr {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on the simulator: returns NULL with errno `ENOSYS` and says so on stderr.
        #[no_mangle]
        pub extern "C" fn $name() -> *mut c_void {
            unsupported(stringify!($name));
            ptr::null_mut()
        }
    )*};
}

/// `void` calls: nothing to return; the line on stderr says the call did nothing.
macro_rules! unsupported_void {
    ($($name:ident),* $(,)?) => {$(
        /// Not supported on the simulator: does nothing but say so on stderr (and set errno to
        /// `ENOSYS`).
        #[no_mangle]
        pub extern "C" fn $name() {
            unsupported(stringify!($name));
        }
    )*};
}

// The public calls of librdmacm's and libibverbs' version nodes (rdma-core v44's maps, the list
// in public-symbols.txt) that this library does not serve. The loader binds every import at
// start (BIND_NOW), so each must exist; calling one is an error, never a crash.
unsupported_int!(
    rdma_create_qp_ex,
    rdma_get_remote_ece,
    rdma_set_local_ece,
    rdma_reject_ece,
    rdma_notify,
    rdma_create_srq_ex,
    raccept,
    rbind,
    rclose,
    rconnect,
    rfcntl,
    rgetpeername,
    rgetsockname,
    rgetsockopt,
    riounmap,
    rlisten,
    rpoll,
    rselect,
    rsetsockopt,
    rshutdown,
    rsocket,
    // -1 on error, as their man pages say.
    ibv_get_device_index,
    ibv_get_async_event,
    ibv_init_ah_from_wc,
);

unsupported_ssize!(rread, rreadv, rrecv, rrecvfrom, rrecvmsg, rsend, rsendmsg, rsendto, rwrite, rwritev);

unsupported_errno!(ENOSYS:
    ibv_attach_mcast,
    ibv_detach_mcast,
    ibv_resize_cq,
);

// ECE: EOPNOTSUPP is these verbs' documented answer for "not supported", and librdmacm itself
// takes it to mean "no ECE".
unsupported_errno!(EOPNOTSUPP: ibv_query_ece, ibv_set_ece);

unsupported_ptr!(
    ibv_qp_to_qp_ex,
    ibv_reg_dmabuf_mr,
    ibv_import_device,
    ibv_import_pd,
    ibv_import_mr,
    ibv_import_dm,
    // A `const char *`. The simulated device's sysfs files are served by name
    // (`ibv_read_sysfs_file`); a path into the real /sys would lead to the host's own devices,
    // which this library stands in for.
    ibv_get_sysfs_path,
);

unsupported_void!(
    ibv_ack_async_event,
    ibv_unimport_pd,
    ibv_unimport_mr,
    ibv_unimport_dm,
);

/// `riomap` (`off_t`): not supported on the simulator; -1 with errno `ENOSYS`.
#[no_mangle]
pub extern "C" fn riomap() -> libc::off_t {
    unsupported("riomap") as libc::off_t
}

/// `riowrite` (`size_t`, -1 cast to it on error): not supported on the simulator;
/// `(size_t)-1` with errno `ENOSYS`.
#[no_mangle]
pub extern "C" fn riowrite() -> libc::size_t {
    unsupported("riowrite");
    libc::size_t::MAX
}

/// `ibv_resolve_eth_l2_from_gid` (0 or a negative errno): not supported on the simulator;
/// `-ENOSYS`.
#[no_mangle]
pub extern "C" fn ibv_resolve_eth_l2_from_gid() -> c_int {
    -refuse("ibv_resolve_eth_l2_from_gid", libc::ENOSYS)
}

/// `ibv_rereg_mr`: not supported on the simulator; `IBV_REREG_MR_ERR_CMD` (-4, what libibverbs
/// answers when the provider refuses) with errno `ENOSYS`. The region stays as it was.
#[no_mangle]
pub extern "C" fn ibv_rereg_mr() -> c_int {
    const IBV_REREG_MR_ERR_CMD: c_int = -4;
    refuse("ibv_rereg_mr", libc::ENOSYS);
    IBV_REREG_MR_ERR_CMD
}

/// `ibv_query_qp_data_in_order` (1 when RDMA WRITE data lands in order, 0 otherwise): not
/// supported on the simulator, where RDMA WRITE happens outside the fabric; 0, the answer that
/// promises nothing, and a line on stderr.
#[no_mangle]
pub extern "C" fn ibv_query_qp_data_in_order() -> c_int {
    refuse("ibv_query_qp_data_in_order", libc::ENOSYS);
    0
}
