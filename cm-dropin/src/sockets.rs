//! The programs' own TCP and UDP sockets between simulated hosts.
//!
//! Many RDMA programs keep a kernel socket beside RDMA to swap QP numbers or to synchronise
//! (`ibv_rc_pingpong`, perftest without `-R`, qperf, cmtime of rdma-core v52 on). Under the
//! simulator their hosts' addresses (`10.0.0.1`, ...) do not exist on the machine, so this
//! library stands in for the socket calls that carry an address (`bind`, `connect`, `accept`,
//! `accept4`, `getsockname`, `getpeername`, `sendto`, `recvfrom`, `sendmsg`, `recvmsg`,
//! `sendmmsg`, `recvmmsg`) and
//! moves each simulated host onto a loopback address of its own:
//!
//! * host `i` of the fabric is `127.A.B.(i + 1)`, the daemon's loopback /24 `127.A.B.0`
//!   (`CMSIM_LOOPBACK`, chosen per daemon, so that fabrics running at once keep apart) and the
//!   hosts in index order (`CMSIM_HOSTS`) being what `cmsim-run` hands the program. Each host
//!   having its own address, servers on two hosts may use one port;
//! * an address the program gives (bind, connect, a datagram's destination) that is a
//!   simulated host's becomes its loopback address; `INADDR_ANY` / `in6addr_any` means this
//!   simulated host (its loopback address, so it is reachable from the other hosts and binds
//!   no port of theirs); a bind to another host's address fails with `EADDRNOTAVAIL` as the
//!   kernel's would;
//! * every address the program reads (accept, getsockname, getpeername, a datagram's source)
//!   that is a host's loopback address reads as that host's simulated address: each end sees
//!   the simulated addresses;
//! * a socket connecting or sending to a simulated host without being bound is first bound to
//!   its own host's loopback address (port 0), so that its peer sees it come from its host;
//! * on an `AF_INET6` socket a host is the v4-mapped form of its loopback address
//!   (`::ffff:127.A.B.c`): an IPv6 host's address and a v4-mapped IPv4 host's address both
//!   map there, so a dual-stack socket reaches every host. An `IPV6_V6ONLY` socket cannot; a
//!   bind or connect of one to a simulated host fails with `EADDRNOTAVAIL` and a line on
//!   stderr. Hosts past the 254th have no loopback address (the same answer and line);
//! * `localhost` (`127.0.0.1`, `::1`) is this simulated host's own loopback address too: a
//!   server bound to `INADDR_ANY` is reached there by the programs of its own host, as on a
//!   real host (libfabric's name server connects to `localhost` to wake its own `accept`), and
//!   the hosts' `localhost` are apart. The addresses such sockets read back are the host's
//!   simulated ones, not `127.0.0.1`, and a server bound to `localhost` is reachable from the
//!   other hosts at its host's address;
//! * every other address (the machine's other loopback addresses such as `127.0.0.2`, real
//!   interfaces, unix sockets such as this library's own to the daemon) passes through
//!   untouched;
//! * `getifaddrs` answers with the simulated host's interfaces: `lo` (`127.0.0.1`, `::1`) and
//!   `cmsim0`, the netdev under the simulated RDMA device, with the host's address (a /24
//!   for IPv4, a /64 for IPv6), up and running; the machine's own interfaces are not seen.
//!   Programs that look for their RDMA-capable addresses there (libfabric's verbs provider
//!   binds an `rdma_cm_id` to each) find the host's. There are no `AF_PACKET` entries and no
//!   IPv6 link-local address; `freeifaddrs` (libc's) frees the list, one allocation as
//!   glibc's.
//!
//! What the kernel answers stays its answer: a connect to a host where nothing listens is
//! refused (`ECONNREFUSED`) as on a real network. These sockets are outside the simulated
//! fabric: its faults (partitions, loss, delay, a crashed host) do not reach them, so a
//! partitioned pair still swaps its QP numbers over TCP. `getsockname` of a socket bound to
//! `INADDR_ANY` reads `0.0.0.0` (`::`) with its port, as the kernel's would. Host names are
//! not resolved here (numeric addresses are what `getaddrinfo` gives back as they are).
//!
//! The calls are forwarded to libc's own definitions, looked up in libc itself (not with
//! `RTLD_NEXT`, which finds nothing when this library is loaded after libc). Without
//! `CMSIM_HOSTS` (a program not started by `cmsim-run`, or this crate's own binaries, which
//! link these definitions too) every call passes through.

use std::collections::HashSet;
use std::ffi::{c_int, c_uint, c_void};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::sync::{Mutex, OnceLock};

use libc::{msghdr, sockaddr, sockaddr_storage, socklen_t, ssize_t};

use crate::ffi::set_errno;
use crate::proto;

/// Hosts `0..MAX_HOSTS` have loopback addresses: `.1` to `.254` of the /24.
pub const MAX_HOSTS: usize = 254;

/// Where an address given by the program is used.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Use {
    /// `bind`: the address must be this host's.
    Bind,
    /// `connect`, `sendto`, `sendmsg`: any host.
    Reach,
}

/// What becomes of an address the program gives.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mapped {
    /// Not simulated: used as it is.
    Pass,
    /// A simulated host's (or `INADDR_ANY`): this loopback address instead.
    To(SocketAddr),
    /// Refused with this errno (a line on stderr when `said`).
    Refused {
        /// The errno.
        errno: c_int,
        /// Whether the reason was said on stderr (the kernel's own answers are not).
        said: bool,
    },
}

/// The fabric's hosts and their loopback addresses, as seen from one host.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostMap {
    block: [u8; 3],
    hosts: Vec<IpAddr>,
    own: usize,
}

impl HostMap {
    /// The map of the process on host `own` (index into `hosts`) of a fabric whose loopback
    /// /24 is `loopback`; None when `own` is no host or the block is not a loopback /24 off
    /// `127.0.0.0/24`.
    pub fn new(loopback: Ipv4Addr, hosts: Vec<IpAddr>, own: usize) -> Option<HostMap> {
        let o = loopback.octets();
        (o[0] == 127 && o[1] != 0 && o[3] == 0 && own < hosts.len()).then_some(HostMap {
            block: [o[0], o[1], o[2]],
            hosts,
            own,
        })
    }

    /// The map from the variables `cmsim-run` sets: the loopback block, the comma-separated
    /// hosts, and this process's host (`CMSIM_HOST`; empty: host 0, as the daemon takes it).
    pub fn parse(loopback: &str, hosts: &str, own: &str) -> Result<HostMap, String> {
        let block: Ipv4Addr = loopback
            .parse()
            .map_err(|_| format!("{} {loopback:?} is no IPv4 address", proto::LOOPBACK_ENV))?;
        let hosts = hosts
            .split(',')
            .map(|h| {
                h.trim()
                    .parse::<IpAddr>()
                    .map_err(|_| format!("{} holds {h:?}, no address", proto::HOSTS_ENV))
            })
            .collect::<Result<Vec<_>, _>>()?;
        let own = if own.is_empty() {
            0
        } else {
            let ip: IpAddr = own
                .parse()
                .map_err(|_| format!("{} {own:?} is no address", proto::HOST_ENV))?;
            hosts
                .iter()
                .position(|h| *h == ip)
                .ok_or_else(|| format!("{} {own} is none of the fabric's hosts", proto::HOST_ENV))?
        };
        HostMap::new(block, hosts, own).ok_or_else(|| {
            format!(
                "{} {loopback} is no loopback /24 but 127.0.0.0/24",
                proto::LOOPBACK_ENV
            )
        })
    }

    /// Host `i`'s loopback address.
    pub fn loopback(&self, i: usize) -> Option<Ipv4Addr> {
        let [a, b, c] = self.block;
        (i < self.hosts.len() && i < MAX_HOSTS).then(|| Ipv4Addr::new(a, b, c, i as u8 + 1))
    }

    /// The host a loopback address stands for.
    fn host_of_loopback(&self, ip: Ipv4Addr) -> Option<usize> {
        let o = ip.octets();
        let i = usize::from(o[3]).checked_sub(1)?;
        ([o[0], o[1], o[2]] == self.block && i < self.hosts.len() && i < MAX_HOSTS).then_some(i)
    }

    /// The host a simulated address (an IPv4 host's also in its v4-mapped form) names.
    fn host_of_sim(&self, ip: IpAddr) -> Option<usize> {
        let direct = self.hosts.iter().position(|h| *h == ip);
        direct.or_else(|| match ip {
            IpAddr::V6(v6) => {
                let v4 = v6.to_ipv4_mapped()?;
                self.hosts.iter().position(|h| *h == IpAddr::V4(v4))
            }
            IpAddr::V4(_) => None,
        })
    }

    /// The address to use in place of `a`, an address the program gave for `what`.
    pub fn to_real(&self, a: SocketAddr, what: Use) -> Mapped {
        // localhost is this host's own, as a real host's wildcard listener is reached there
        // by its own programs (libfabric's name server wakes its accept so).
        let host = if is_unspecified(a.ip()) || is_localhost(a.ip()) {
            self.own
        } else {
            match self.host_of_sim(a.ip()) {
                Some(i) => i,
                None => return Mapped::Pass,
            }
        };
        if what == Use::Bind && host != self.own {
            return Mapped::Refused {
                errno: libc::EADDRNOTAVAIL,
                said: false,
            };
        }
        let Some(lo) = self.loopback(host) else {
            eprintln!(
                "cmsim: {} is host {host} of the fabric, past the {MAX_HOSTS} that have a loopback address for the program's own sockets (EADDRNOTAVAIL)",
                self.hosts[host]
            );
            return Mapped::Refused {
                errno: libc::EADDRNOTAVAIL,
                said: true,
            };
        };
        Mapped::To(match a {
            SocketAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(lo, v4.port())),
            SocketAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(
                lo.to_ipv6_mapped(),
                v6.port(),
                v6.flowinfo(),
                0,
            )),
        })
    }

    /// What the program reads in place of `a`, an address the kernel gave: a host's loopback
    /// address reads as the host's simulated address; None leaves `a` as it is (an IPv6
    /// host's address has no `AF_INET` form).
    pub fn to_sim(&self, a: SocketAddr) -> Option<SocketAddr> {
        match a {
            SocketAddr::V4(v4) => {
                let i = self.host_of_loopback(*v4.ip())?;
                match self.hosts[i] {
                    IpAddr::V4(h) => Some(SocketAddr::V4(SocketAddrV4::new(h, v4.port()))),
                    IpAddr::V6(_) => None,
                }
            }
            SocketAddr::V6(v6) => {
                let i = self.host_of_loopback(v6.ip().to_ipv4_mapped()?)?;
                let ip = match self.hosts[i] {
                    IpAddr::V4(h) => h.to_ipv6_mapped(),
                    IpAddr::V6(h) => h,
                };
                Some(SocketAddr::V6(SocketAddrV6::new(ip, v6.port(), v6.flowinfo(), 0)))
            }
        }
    }

    /// This process's host's loopback address in the family of `like` (port 0): what an
    /// unbound socket is bound to before it reaches another host.
    fn own_source(&self, like: &SocketAddr) -> Option<SocketAddr> {
        let lo = self.loopback(self.own)?;
        Some(match like {
            SocketAddr::V4(_) => SocketAddr::V4(SocketAddrV4::new(lo, 0)),
            SocketAddr::V6(_) => SocketAddr::V6(SocketAddrV6::new(lo.to_ipv6_mapped(), 0, 0, 0)),
        })
    }
}

/// This process's map, read once from the environment; None passes every call through.
fn map() -> Option<&'static HostMap> {
    static MAP: OnceLock<Option<HostMap>> = OnceLock::new();
    MAP.get_or_init(|| {
        let hosts = std::env::var(proto::HOSTS_ENV).ok()?;
        let loopback = std::env::var(proto::LOOPBACK_ENV).unwrap_or_default();
        let own = std::env::var(proto::HOST_ENV).unwrap_or_default();
        match HostMap::parse(&loopback, &hosts, &own) {
            Ok(m) => Some(m),
            Err(e) => {
                eprintln!("cmsim: {e}: the program's own sockets are not mapped onto the fabric's hosts");
                None
            }
        }
    })
    .as_ref()
}

// ---- raw socket addresses ----------------------------------------------------------------

/// Reads an `AF_INET` / `AF_INET6` address of `len` bytes; None for anything else (another
/// family, NULL, too short).
///
/// # Safety
/// `p` is NULL or valid for `len` bytes.
unsafe fn read_addr(p: *const sockaddr, len: socklen_t) -> Option<SocketAddr> {
    if p.is_null() || (len as usize) < std::mem::size_of::<libc::sa_family_t>() {
        return None;
    }
    // SAFETY: p holds at least the family field (checked above); read unaligned, as the
    // caller's buffer may be any bytes.
    let family = unsafe { std::ptr::read_unaligned(p.cast::<libc::sa_family_t>()) };
    match c_int::from(family) {
        libc::AF_INET if len as usize >= std::mem::size_of::<libc::sockaddr_in>() => {
            // SAFETY: p holds a whole sockaddr_in (length checked).
            let sin = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in>()) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 if len as usize >= std::mem::size_of::<libc::sockaddr_in6>() => {
            // SAFETY: p holds a whole sockaddr_in6 (length checked).
            let sin6 = unsafe { std::ptr::read_unaligned(p.cast::<libc::sockaddr_in6>()) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                u32::from_be(sin6.sin6_flowinfo),
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

/// `a` as a C socket address and its length.
fn write_addr(a: SocketAddr) -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let mut st: sockaddr_storage = unsafe { std::mem::zeroed() };
    let len = match a {
        SocketAddr::V4(v4) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in.
            let sin = unsafe { &mut *(&mut st as *mut sockaddr_storage).cast::<libc::sockaddr_in>() };
            sin.sin_family = libc::AF_INET as libc::sa_family_t;
            sin.sin_port = v4.port().to_be();
            sin.sin_addr.s_addr = u32::from(*v4.ip()).to_be();
            std::mem::size_of::<libc::sockaddr_in>()
        }
        SocketAddr::V6(v6) => {
            // SAFETY: sockaddr_storage is larger than and aligned for sockaddr_in6.
            let sin6 = unsafe { &mut *(&mut st as *mut sockaddr_storage).cast::<libc::sockaddr_in6>() };
            sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
            sin6.sin6_port = v6.port().to_be();
            sin6.sin6_flowinfo = v6.flowinfo().to_be();
            sin6.sin6_addr.s6_addr = v6.ip().octets();
            sin6.sin6_scope_id = v6.scope_id();
            std::mem::size_of::<libc::sockaddr_in6>()
        }
    };
    (st, len as socklen_t)
}

fn storage() -> (sockaddr_storage, socklen_t) {
    // SAFETY: sockaddr_storage is plain old data; all-zero is a valid value.
    let st: sockaddr_storage = unsafe { std::mem::zeroed() };
    (st, std::mem::size_of::<sockaddr_storage>() as socklen_t)
}

/// Hands the program an address the kernel wrote in `st` (`len` bytes), translated back to
/// simulated form.
///
/// # Safety
/// `dst` is valid for `*dst_len` bytes and `dst_len` for a `socklen_t` (neither NULL).
unsafe fn hand_back(st: &sockaddr_storage, len: socklen_t, dst: *mut sockaddr, dst_len: *mut socklen_t) {
    let storage_len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: st is a whole sockaddr_storage; len is what the kernel says it wrote.
    let read = unsafe { read_addr((st as *const sockaddr_storage).cast(), len.min(storage_len)) };
    match map().zip(read).and_then(|(m, a)| m.to_sim(a)).map(write_addr) {
        // SAFETY: the caller's buffer; ours holds l bytes.
        Some((t, l)) => unsafe { copy_out(&t, l, dst, dst_len) },
        // SAFETY: as above.
        None => unsafe { copy_out(st, len, dst, dst_len) },
    }
}

/// Copies `len` bytes of `src` to the program's buffer with the kernel's truncation: at most
/// `*dst_len` bytes are written, and `*dst_len` becomes the address's whole length.
///
/// # Safety
/// `dst` is valid for `*dst_len` bytes and `dst_len` for a `socklen_t` (neither NULL).
unsafe fn copy_out(src: &sockaddr_storage, len: socklen_t, dst: *mut sockaddr, dst_len: *mut socklen_t) {
    let storage_len = std::mem::size_of::<sockaddr_storage>() as socklen_t;
    // SAFETY: dst_len is the caller's socklen_t.
    let room = unsafe { *dst_len };
    let n = room.min(len).min(storage_len) as usize;
    // SAFETY: src is a sockaddr_storage (n ≤ its size); dst has room for n ≤ *dst_len bytes;
    // the two never overlap (src is ours).
    unsafe {
        std::ptr::copy_nonoverlapping((src as *const sockaddr_storage).cast::<u8>(), dst.cast::<u8>(), n)
    };
    // SAFETY: as above.
    unsafe { *dst_len = len };
}

/// Sockets the program bound to `INADDR_ANY` / `in6addr_any` (bound here to their host's
/// loopback address), by the socket's inode, which every fd of it (`dup`, `fork`) shares and
/// no other socket has while it is open: `getsockname` reads the unspecified address for
/// them, as the kernel's would. At most [`MAX_ANY_BOUND`] are remembered (past that, their
/// host's address reads).
static ANY_BOUND: Mutex<Option<HashSet<(u64, u64)>>> = Mutex::new(None);

/// How many `INADDR_ANY` sockets [`ANY_BOUND`] remembers.
const MAX_ANY_BOUND: usize = 65_536;

/// The identity of the file `fd` is (device and inode).
fn file_id(fd: c_int) -> Option<(u64, u64)> {
    // SAFETY: stat is plain old data; all-zero is a valid value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: st is ours, of the size fstat writes.
    (unsafe { libc::fstat(fd, &mut st) } == 0).then_some((st.st_dev, st.st_ino))
}

fn any_bound(fd: c_int) -> bool {
    let set = ANY_BOUND.lock().unwrap_or_else(|e| e.into_inner());
    set.as_ref()
        .is_some_and(|s| !s.is_empty() && file_id(fd).is_some_and(|id| s.contains(&id)))
}

fn remember_any_bound(fd: c_int) {
    let Some(id) = file_id(fd) else { return };
    let mut set = ANY_BOUND.lock().unwrap_or_else(|e| e.into_inner());
    let s = set.get_or_insert_with(HashSet::new);
    if s.len() < MAX_ANY_BOUND {
        s.insert(id);
    }
}

/// `127.0.0.1` or `::1` (also v4-mapped): what `localhost` resolves to.
fn is_localhost(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4 == Ipv4Addr::LOCALHOST,
        IpAddr::V6(v6) => v6 == Ipv6Addr::LOCALHOST || v6.to_ipv4_mapped() == Some(Ipv4Addr::LOCALHOST),
    }
}

fn is_unspecified(ip: IpAddr) -> bool {
    match ip {
        IpAddr::V4(v4) => v4.is_unspecified(),
        IpAddr::V6(v6) => v6.is_unspecified() || v6.to_ipv4_mapped() == Some(Ipv4Addr::UNSPECIFIED),
    }
}

// ---- libc's own definitions --------------------------------------------------------------

type BindFn = unsafe extern "C" fn(c_int, *const sockaddr, socklen_t) -> c_int;
type NameFn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t) -> c_int;
type Accept4Fn = unsafe extern "C" fn(c_int, *mut sockaddr, *mut socklen_t, c_int) -> c_int;
type SendtoFn =
    unsafe extern "C" fn(c_int, *const c_void, usize, c_int, *const sockaddr, socklen_t) -> ssize_t;
type RecvfromFn =
    unsafe extern "C" fn(c_int, *mut c_void, usize, c_int, *mut sockaddr, *mut socklen_t) -> ssize_t;
type SendmsgFn = unsafe extern "C" fn(c_int, *const msghdr, c_int) -> ssize_t;
type RecvmsgFn = unsafe extern "C" fn(c_int, *mut msghdr, c_int) -> ssize_t;
type SendmmsgFn = unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int) -> c_int;
type RecvmmsgFn =
    unsafe extern "C" fn(c_int, *mut libc::mmsghdr, c_uint, c_int, *mut libc::timespec) -> c_int;
type GetifaddrsFn = unsafe extern "C" fn(*mut *mut libc::ifaddrs) -> c_int;

struct Real {
    bind: BindFn,
    connect: BindFn,
    accept: NameFn,
    accept4: Accept4Fn,
    getsockname: NameFn,
    getpeername: NameFn,
    sendto: SendtoFn,
    recvfrom: RecvfromFn,
    sendmsg: SendmsgFn,
    recvmsg: RecvmsgFn,
    sendmmsg: SendmmsgFn,
    recvmmsg: RecvmmsgFn,
    getifaddrs: GetifaddrsFn,
}

/// libc's own definition of `name` (looked up in the libc already mapped, so that this
/// library's definition of the same name is not found); aborts with a line when libc has none.
pub(crate) fn libc_symbol(name: &std::ffi::CStr) -> *mut c_void {
    static LIBC: OnceLock<usize> = OnceLock::new();
    let handle = *LIBC.get_or_init(|| {
        // SAFETY: a constant C string; RTLD_NOLOAD only finds the libc already mapped (every
        // process has it), so nothing is loaded or run.
        unsafe { libc::dlopen(c"libc.so.6".as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD) as usize }
    });
    let handle = if handle == 0 {
        libc::RTLD_NEXT
    } else {
        handle as *mut c_void
    };
    // SAFETY: a valid handle (or RTLD_NEXT) and a C string.
    let f = unsafe { libc::dlsym(handle, name.as_ptr()) };
    if f.is_null() {
        eprintln!("cmsim: libc has no {}: cannot forward it", name.to_string_lossy());
        std::process::abort();
    }
    f
}

fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        let find = libc_symbol;
        // SAFETY: each symbol is libc's function of that name, whose C type is the one given
        // (socket(2) family prototypes); a function pointer and a data pointer have one size.
        unsafe {
            Real {
                bind: std::mem::transmute::<*mut c_void, BindFn>(find(c"bind")),
                connect: std::mem::transmute::<*mut c_void, BindFn>(find(c"connect")),
                accept: std::mem::transmute::<*mut c_void, NameFn>(find(c"accept")),
                accept4: std::mem::transmute::<*mut c_void, Accept4Fn>(find(c"accept4")),
                getsockname: std::mem::transmute::<*mut c_void, NameFn>(find(c"getsockname")),
                getpeername: std::mem::transmute::<*mut c_void, NameFn>(find(c"getpeername")),
                sendto: std::mem::transmute::<*mut c_void, SendtoFn>(find(c"sendto")),
                recvfrom: std::mem::transmute::<*mut c_void, RecvfromFn>(find(c"recvfrom")),
                sendmsg: std::mem::transmute::<*mut c_void, SendmsgFn>(find(c"sendmsg")),
                recvmsg: std::mem::transmute::<*mut c_void, RecvmsgFn>(find(c"recvmsg")),
                sendmmsg: std::mem::transmute::<*mut c_void, SendmmsgFn>(find(c"sendmmsg")),
                recvmmsg: std::mem::transmute::<*mut c_void, RecvmmsgFn>(find(c"recvmmsg")),
                getifaddrs: std::mem::transmute::<*mut c_void, GetifaddrsFn>(find(c"getifaddrs")),
            }
        }
    })
}

// ---- the translation around each call ----------------------------------------------------

/// Whether `fd` is an `AF_INET6` socket with `IPV6_V6ONLY` set.
fn v6_only(fd: c_int) -> bool {
    let mut v: c_int = 0;
    let mut len = std::mem::size_of::<c_int>() as socklen_t;
    // SAFETY: v and len are ours, of the sizes said.
    let r = unsafe {
        libc::getsockopt(
            fd,
            libc::IPPROTO_IPV6,
            libc::IPV6_V6ONLY,
            (&mut v as *mut c_int).cast(),
            &mut len,
        )
    };
    r == 0 && v != 0
}

/// The loopback address to use for the address the program gave (`p`, `len` bytes) on `fd`,
/// or the errno to fail with (set, and said where the kernel would not say it); None: use the
/// program's own.
///
/// # Safety
/// `p` is NULL or valid for `len` bytes.
unsafe fn translate_in(
    fd: c_int,
    p: *const sockaddr,
    len: socklen_t,
    what: Use,
) -> Result<Option<SocketAddr>, ()> {
    let Some(m) = map() else { return Ok(None) };
    // SAFETY: the caller's address of len bytes.
    let Some(sim) = (unsafe { read_addr(p, len) }) else {
        return Ok(None);
    };
    match m.to_real(sim, what) {
        Mapped::Pass => Ok(None),
        Mapped::To(real) => {
            if real.is_ipv6() && v6_only(fd) {
                eprintln!(
                    "cmsim: socket {fd} is IPv6-only (IPV6_V6ONLY): simulated host {} is reached at ::ffff:{} on the machine, which it cannot use (EADDRNOTAVAIL); leave IPV6_V6ONLY off",
                    sim.ip(),
                    m.loopback(m.host_of_sim(sim.ip()).unwrap_or(m.own)).map_or(Ipv4Addr::UNSPECIFIED, |l| l)
                );
                set_errno(libc::EADDRNOTAVAIL);
                return Err(());
            }
            Ok(Some(real))
        }
        Mapped::Refused { errno, .. } => {
            set_errno(errno);
            Err(())
        }
    }
}

/// Binds `fd` to its host's loopback address (port 0) when it is not bound yet, before it
/// reaches `dest` (a host's loopback address): its peer then sees it come from its host.
fn bind_source(fd: c_int, dest: &SocketAddr) -> Result<(), ()> {
    let Some(m) = map() else { return Ok(()) };
    let (mut st, mut len) = storage();
    // SAFETY: st and len are ours, len its size.
    if unsafe { (real().getsockname)(fd, (&mut st as *mut sockaddr_storage).cast(), &mut len) } != 0 {
        // Not a socket, or no such fd: the call itself answers that.
        return Ok(());
    }
    // SAFETY: st is a whole sockaddr_storage of which the kernel wrote len bytes.
    let bound = unsafe { read_addr((&st as *const sockaddr_storage).cast(), len) };
    let unbound = bound.is_some_and(|b| b.port() == 0 && b.ip().is_unspecified());
    if !unbound {
        return Ok(());
    }
    let Some(src) = m.own_source(dest) else {
        return Ok(());
    };
    let (sa, sl) = write_addr(src);
    // SAFETY: sa is a valid socket address of sl bytes.
    if unsafe { (real().bind)(fd, (&sa as *const sockaddr_storage).cast(), sl) } != 0 {
        // Raced by another thread's bind, or out of ports: the errno is the kernel's.
        return Err(());
    }
    Ok(())
}

/// `bind(2)`: a simulated host's address (its own, or `INADDR_ANY`) becomes its loopback one.
///
/// # Safety
/// As `bind(2)`: `addr` is valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn bind(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address of len bytes.
    match unsafe { translate_in(fd, addr, len, Use::Bind) } {
        Err(()) => -1,
        Ok(None) => {
            // SAFETY: the caller's arguments, as given.
            unsafe { (real().bind)(fd, addr, len) }
        }
        Ok(Some(real_addr)) => {
            let (st, l) = write_addr(real_addr);
            // SAFETY: st is a valid socket address of l bytes.
            let r = unsafe { (real().bind)(fd, (&st as *const sockaddr_storage).cast(), l) };
            // SAFETY: the caller's address of len bytes (read once already).
            if r == 0 && unsafe { read_addr(addr, len) }.is_some_and(|a| is_unspecified(a.ip())) {
                remember_any_bound(fd);
            }
            r
        }
    }
}

/// `connect(2)`: to a simulated host's loopback address, from this host's.
///
/// # Safety
/// As `connect(2)`: `addr` is valid for `len` bytes.
#[no_mangle]
pub unsafe extern "C" fn connect(fd: c_int, addr: *const sockaddr, len: socklen_t) -> c_int {
    // SAFETY: the caller's address of len bytes.
    match unsafe { translate_in(fd, addr, len, Use::Reach) } {
        Err(()) => -1,
        Ok(None) => {
            // SAFETY: the caller's arguments, as given.
            unsafe { (real().connect)(fd, addr, len) }
        }
        Ok(Some(real_addr)) => {
            if bind_source(fd, &real_addr).is_err() {
                return -1;
            }
            let (st, l) = write_addr(real_addr);
            // SAFETY: st is a valid socket address of l bytes.
            unsafe { (real().connect)(fd, (&st as *const sockaddr_storage).cast(), l) }
        }
    }
}

/// Runs a call that writes an address (`addr`, `*len` bytes) through a buffer of ours, and
/// hands the program the simulated form.
///
/// # Safety
/// `addr` and `len` are as the socket call takes them (both NULL, or valid).
unsafe fn with_name_out(
    addr: *mut sockaddr,
    len: *mut socklen_t,
    call: impl FnOnce(*mut sockaddr, *mut socklen_t) -> c_int,
) -> c_int {
    if addr.is_null() || len.is_null() || map().is_none() {
        return call(addr, len);
    }
    let (mut st, mut l) = storage();
    let r = call((&mut st as *mut sockaddr_storage).cast(), &mut l);
    if r >= 0 {
        // SAFETY: addr and len are the caller's (non-NULL, checked); st holds l bytes.
        unsafe { hand_back(&st, l, addr, len) };
    }
    r
}

/// `accept(2)`: the peer's address in simulated form.
///
/// # Safety
/// As `accept(2)`.
#[no_mangle]
pub unsafe extern "C" fn accept(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments; the closure gets ours or theirs, both valid.
    unsafe { with_name_out(addr, len, |a, l| (real().accept)(fd, a, l)) }
}

/// `accept4(2)`: the peer's address in simulated form.
///
/// # Safety
/// As `accept4(2)`.
#[no_mangle]
pub unsafe extern "C" fn accept4(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments; the closure gets ours or theirs, both valid.
    unsafe { with_name_out(addr, len, |a, l| (real().accept4)(fd, a, l, flags)) }
}

/// `getsockname(2)`: the socket's address in simulated form.
///
/// # Safety
/// As `getsockname(2)`.
#[no_mangle]
pub unsafe extern "C" fn getsockname(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    if addr.is_null() || len.is_null() || map().is_none() || !any_bound(fd) {
        // SAFETY: the caller's arguments; the closure gets ours or theirs, both valid.
        return unsafe { with_name_out(addr, len, |a, l| (real().getsockname)(fd, a, l)) };
    }
    let (mut st, mut l) = storage();
    // SAFETY: st and l are ours.
    let r = unsafe { (real().getsockname)(fd, (&mut st as *mut sockaddr_storage).cast(), &mut l) };
    if r == 0 {
        // SAFETY: st holds l bytes the kernel wrote.
        let bound = unsafe { read_addr((&st as *const sockaddr_storage).cast(), l) };
        let any = bound.map(|b| match b {
            SocketAddr::V4(v4) => SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::UNSPECIFIED, v4.port())),
            SocketAddr::V6(v6) => SocketAddr::V6(SocketAddrV6::new(Ipv6Addr::UNSPECIFIED, v6.port(), 0, 0)),
        });
        match any.map(write_addr) {
            // SAFETY: the caller's buffer and length (non-NULL, checked).
            Some((t, tl)) => unsafe { copy_out(&t, tl, addr, len) },
            // SAFETY: as above.
            None => unsafe { copy_out(&st, l, addr, len) },
        }
    }
    r
}

/// `getpeername(2)`: the peer's address in simulated form.
///
/// # Safety
/// As `getpeername(2)`.
#[no_mangle]
pub unsafe extern "C" fn getpeername(fd: c_int, addr: *mut sockaddr, len: *mut socklen_t) -> c_int {
    // SAFETY: the caller's arguments; the closure gets ours or theirs, both valid.
    unsafe { with_name_out(addr, len, |a, l| (real().getpeername)(fd, a, l)) }
}

/// `sendto(2)`: a datagram to a simulated host goes to its loopback address.
///
/// # Safety
/// As `sendto(2)`.
#[no_mangle]
pub unsafe extern "C" fn sendto(
    fd: c_int,
    buf: *const c_void,
    n: usize,
    flags: c_int,
    dest: *const sockaddr,
    dest_len: socklen_t,
) -> ssize_t {
    // SAFETY: the caller's address of dest_len bytes (or NULL).
    match unsafe { translate_in(fd, dest, dest_len, Use::Reach) } {
        Err(()) => -1,
        Ok(None) => {
            // SAFETY: the caller's arguments, as given.
            unsafe { (real().sendto)(fd, buf, n, flags, dest, dest_len) }
        }
        Ok(Some(real_addr)) => {
            if bind_source(fd, &real_addr).is_err() {
                return -1;
            }
            let (st, l) = write_addr(real_addr);
            // SAFETY: the caller's buffer; st is a valid socket address of l bytes.
            unsafe { (real().sendto)(fd, buf, n, flags, (&st as *const sockaddr_storage).cast(), l) }
        }
    }
}

/// `recvfrom(2)`: the datagram's source in simulated form.
///
/// # Safety
/// As `recvfrom(2)`.
#[no_mangle]
pub unsafe extern "C" fn recvfrom(
    fd: c_int,
    buf: *mut c_void,
    n: usize,
    flags: c_int,
    src: *mut sockaddr,
    src_len: *mut socklen_t,
) -> ssize_t {
    if src.is_null() || src_len.is_null() || map().is_none() {
        // SAFETY: the caller's arguments, as given.
        return unsafe { (real().recvfrom)(fd, buf, n, flags, src, src_len) };
    }
    let (mut st, mut l) = storage();
    // SAFETY: the caller's buffer; st and l are ours.
    let r = unsafe {
        (real().recvfrom)(
            fd,
            buf,
            n,
            flags,
            (&mut st as *mut sockaddr_storage).cast(),
            &mut l,
        )
    };
    if r >= 0 {
        // SAFETY: src and src_len are the caller's (non-NULL); st holds l bytes.
        unsafe { hand_back(&st, l, src, src_len) };
    }
    r
}

/// `sendmsg(2)`: a datagram to a simulated host goes to its loopback address.
///
/// # Safety
/// As `sendmsg(2)`.
#[no_mangle]
pub unsafe extern "C" fn sendmsg(fd: c_int, msg: *const msghdr, flags: c_int) -> ssize_t {
    if msg.is_null() {
        // SAFETY: the kernel answers a NULL message (EFAULT).
        return unsafe { (real().sendmsg)(fd, msg, flags) };
    }
    // SAFETY: msg is the caller's message header.
    let m = unsafe { *msg };
    // SAFETY: the caller's destination of msg_namelen bytes (or NULL).
    match unsafe { translate_in(fd, m.msg_name.cast(), m.msg_namelen, Use::Reach) } {
        Err(()) => -1,
        Ok(None) => {
            // SAFETY: the caller's arguments, as given.
            unsafe { (real().sendmsg)(fd, msg, flags) }
        }
        Ok(Some(real_addr)) => {
            if bind_source(fd, &real_addr).is_err() {
                return -1;
            }
            let (mut st, l) = write_addr(real_addr);
            let mut copy = m;
            copy.msg_name = (&mut st as *mut sockaddr_storage).cast();
            copy.msg_namelen = l;
            // SAFETY: the caller's buffers and control data; the name is ours.
            unsafe { (real().sendmsg)(fd, &copy, flags) }
        }
    }
}

/// `recvmsg(2)`: the datagram's source in simulated form.
///
/// # Safety
/// As `recvmsg(2)`.
#[no_mangle]
pub unsafe extern "C" fn recvmsg(fd: c_int, msg: *mut msghdr, flags: c_int) -> ssize_t {
    // SAFETY: msg is NULL or the caller's header.
    if msg.is_null() || unsafe { (*msg).msg_name.is_null() } || map().is_none() {
        // SAFETY: the caller's arguments, as given.
        return unsafe { (real().recvmsg)(fd, msg, flags) };
    }
    // SAFETY: msg is the caller's header (non-NULL).
    let mut copy = unsafe { *msg };
    let (mut st, l) = storage();
    copy.msg_name = (&mut st as *mut sockaddr_storage).cast();
    copy.msg_namelen = l;
    // SAFETY: the caller's buffers and control space; the name buffer is ours.
    let r = unsafe { (real().recvmsg)(fd, &mut copy, flags) };
    if r >= 0 {
        // SAFETY: msg is the caller's header; its name buffer holds msg_namelen bytes.
        unsafe {
            (*msg).msg_controllen = copy.msg_controllen;
            (*msg).msg_flags = copy.msg_flags;
            hand_back(
                &st,
                copy.msg_namelen,
                (*msg).msg_name.cast(),
                &mut (*msg).msg_namelen,
            );
        }
    }
    r
}

/// The most messages one `sendmmsg`/`recvmmsg` handles (the kernel's `UIO_MAXIOV`): the
/// kernel takes no more, so no more are copied.
const MAX_MMSG: usize = 1024;

/// `sendmmsg(2)`: each datagram to a simulated host goes to its loopback address. A
/// destination refused before anything is sent fails the call; one refused later ends the
/// batch there (the kernel's rule for an error after the first message).
///
/// # Safety
/// As `sendmmsg(2)`: `msgvec` holds `vlen` message headers.
#[no_mangle]
pub unsafe extern "C" fn sendmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
) -> c_int {
    if msgvec.is_null() || vlen == 0 || map().is_none() {
        // SAFETY: the caller's arguments, as given.
        return unsafe { (real().sendmmsg)(fd, msgvec, vlen, flags) };
    }
    let n = (vlen as usize).min(MAX_MMSG);
    // SAFETY: the caller's vector of at least n headers.
    let given = unsafe { std::slice::from_raw_parts(msgvec, n) };
    let mut copies: Vec<libc::mmsghdr> = Vec::with_capacity(n);
    // Filled before any pointer into it is taken, so none moves.
    let mut names: Vec<(sockaddr_storage, socklen_t)> = Vec::with_capacity(n);
    let mut mapped = Vec::with_capacity(n);
    for m in given {
        let h = &m.msg_hdr;
        // SAFETY: each header's name is NULL or valid for its msg_namelen bytes.
        match unsafe { translate_in(fd, h.msg_name.cast(), h.msg_namelen, Use::Reach) } {
            Err(()) if mapped.is_empty() => return -1,
            Err(()) => break,
            Ok(to) => mapped.push(to),
        }
    }
    if mapped.iter().all(Option::is_none) {
        // SAFETY: the caller's arguments, as given (at most the first len(mapped) of them).
        return unsafe { (real().sendmmsg)(fd, msgvec, mapped.len() as c_uint, flags) };
    }
    if let Some(first) = mapped.iter().flatten().next() {
        if bind_source(fd, first).is_err() {
            return -1;
        }
    }
    names.extend(mapped.iter().map(|to| to.map_or_else(storage, write_addr)));
    for (i, to) in mapped.iter().enumerate() {
        let mut c = given[i];
        if to.is_some() {
            c.msg_hdr.msg_name = (&mut names[i].0 as *mut sockaddr_storage).cast();
            c.msg_hdr.msg_namelen = names[i].1;
        }
        copies.push(c);
    }
    // SAFETY: the caller's buffers and control data; the names are ours, alive for the call.
    let r = unsafe { (real().sendmmsg)(fd, copies.as_mut_ptr(), copies.len() as c_uint, flags) };
    let sent = usize::try_from(r).unwrap_or(0);
    for (i, c) in copies.iter().enumerate().take(sent) {
        // SAFETY: msgvec holds at least n ≥ copies.len() > i headers.
        unsafe { (*msgvec.add(i)).msg_len = c.msg_len };
    }
    r
}

/// `recvmmsg(2)`: each datagram's source in simulated form.
///
/// # Safety
/// As `recvmmsg(2)`: `msgvec` holds `vlen` message headers.
#[no_mangle]
pub unsafe extern "C" fn recvmmsg(
    fd: c_int,
    msgvec: *mut libc::mmsghdr,
    vlen: c_uint,
    flags: c_int,
    timeout: *mut libc::timespec,
) -> c_int {
    if msgvec.is_null() || vlen == 0 || map().is_none() {
        // SAFETY: the caller's arguments, as given.
        return unsafe { (real().recvmmsg)(fd, msgvec, vlen, flags, timeout) };
    }
    let n = (vlen as usize).min(MAX_MMSG);
    // SAFETY: the caller's vector of at least n headers.
    let mut copies: Vec<libc::mmsghdr> = unsafe { std::slice::from_raw_parts(msgvec, n) }.to_vec();
    // Made whole before any pointer into it is taken, so none moves.
    let mut names: Vec<(sockaddr_storage, socklen_t)> = (0..n).map(|_| storage()).collect();
    for (c, (st, l)) in copies.iter_mut().zip(names.iter_mut()) {
        if !c.msg_hdr.msg_name.is_null() {
            c.msg_hdr.msg_name = (st as *mut sockaddr_storage).cast();
            c.msg_hdr.msg_namelen = *l;
        }
    }
    // SAFETY: the caller's buffers, control space and timeout; the names are ours.
    let r = unsafe { (real().recvmmsg)(fd, copies.as_mut_ptr(), n as c_uint, flags, timeout) };
    let got = usize::try_from(r).unwrap_or(0);
    for (i, (c, name)) in copies.iter().zip(&names).enumerate().take(got) {
        // SAFETY: msgvec holds at least n > i headers; a non-NULL name of the caller's has
        // room for its msg_namelen bytes.
        unsafe {
            let m = &mut *msgvec.add(i);
            m.msg_len = c.msg_len;
            m.msg_hdr.msg_flags = c.msg_hdr.msg_flags;
            m.msg_hdr.msg_controllen = c.msg_hdr.msg_controllen;
            if !m.msg_hdr.msg_name.is_null() {
                hand_back(
                    &name.0,
                    c.msg_hdr.msg_namelen,
                    m.msg_hdr.msg_name.cast(),
                    &mut m.msg_hdr.msg_namelen,
                );
            }
        }
    }
    r
}

// ---- the host's interfaces -------------------------------------------------------------

/// The name of the simulated host's interface, the netdev under its RDMA device.
pub const IFACE: &str = "cmsim0";

/// One entry of the list `getifaddrs` gives.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Iface {
    /// The interface's name.
    pub name: &'static str,
    /// `IFF_*` flags.
    pub flags: c_uint,
    /// Its address.
    pub addr: IpAddr,
    /// The netmask.
    pub netmask: IpAddr,
    /// The broadcast address (IPv4 on a broadcast interface).
    pub broadcast: Option<IpAddr>,
}

/// The interfaces of the simulated host at `host`, in glibc's order (every IPv4 entry, then
/// every IPv6 one, `lo` first in each): `lo` with `127.0.0.1/8` and `::1/128`, and
/// [`IFACE`] with the host's address.
pub fn interfaces(host: IpAddr) -> Vec<Iface> {
    let lo_flags = (libc::IFF_UP | libc::IFF_LOOPBACK | libc::IFF_RUNNING) as c_uint;
    let flags = (libc::IFF_UP | libc::IFF_BROADCAST | libc::IFF_RUNNING | libc::IFF_MULTICAST) as c_uint;
    let mut list = vec![Iface {
        name: "lo",
        flags: lo_flags,
        addr: Ipv4Addr::LOCALHOST.into(),
        netmask: Ipv4Addr::new(255, 0, 0, 0).into(),
        broadcast: None,
    }];
    if let IpAddr::V4(v4) = host {
        let o = v4.octets();
        list.push(Iface {
            name: IFACE,
            flags,
            addr: host,
            netmask: Ipv4Addr::new(255, 255, 255, 0).into(),
            broadcast: Some(Ipv4Addr::new(o[0], o[1], o[2], 255).into()),
        });
    }
    list.push(Iface {
        name: "lo",
        flags: lo_flags,
        addr: Ipv6Addr::LOCALHOST.into(),
        netmask: Ipv6Addr::from(u128::MAX).into(),
        broadcast: None,
    });
    if host.is_ipv6() {
        list.push(Iface {
            name: IFACE,
            flags,
            addr: host,
            netmask: Ipv6Addr::from(u128::MAX << 64).into(),
            broadcast: None,
        });
    }
    list
}

/// Room for one entry's name (`IFNAMSIZ`).
const IFA_NAME: usize = libc::IFNAMSIZ;
/// Room for each of an entry's three addresses: a `sockaddr_in6` (28 bytes), rounded up to 8.
const IFA_ADDR: usize = std::mem::size_of::<libc::sockaddr_in6>().next_multiple_of(8);

/// `getifaddrs(3)`: on a simulated host, that host's [`interfaces`], in one `malloc`ed block
/// (the entries, then each one's name and addresses) that libc's `freeifaddrs` frees as it
/// frees its own; elsewhere libc's answer.
///
/// # Safety
/// As `getifaddrs(3)`: `out` is valid for writing a pointer.
#[no_mangle]
pub unsafe extern "C" fn getifaddrs(out: *mut *mut libc::ifaddrs) -> c_int {
    let Some(m) = map() else {
        // SAFETY: the caller's argument, as given.
        return unsafe { (real().getifaddrs)(out) };
    };
    if out.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    let list = interfaces(m.hosts[m.own]);
    let entry = std::mem::size_of::<libc::ifaddrs>();
    let per = IFA_NAME + 3 * IFA_ADDR;
    let size = list.len() * (entry + per);
    // SAFETY: malloc of a non-zero size; checked for NULL below.
    let block = unsafe { libc::malloc(size) } as *mut u8;
    if block.is_null() {
        set_errno(libc::ENOMEM);
        return -1;
    }
    // SAFETY: block holds size bytes, all of them written here before use.
    unsafe { std::ptr::write_bytes(block, 0, size) };
    let entries = block as *mut libc::ifaddrs;
    // SAFETY: every pointer below stays inside block: the entries first (list.len() of them,
    // malloc's alignment suiting ifaddrs), then per bytes for each entry at 8-byte multiples
    // (entry and per both are), each address of IFA_ADDR bytes written unaligned.
    unsafe {
        let tail = block.add(list.len() * entry);
        for (i, f) in list.iter().enumerate() {
            let room = tail.add(i * per);
            let name = room;
            std::ptr::copy_nonoverlapping(f.name.as_ptr(), name, f.name.len().min(IFA_NAME - 1));
            let put = |k: usize, ip: IpAddr| -> *mut sockaddr {
                let at = room.add(IFA_NAME + k * IFA_ADDR);
                let (st, len) = write_addr(SocketAddr::new(ip, 0));
                std::ptr::copy_nonoverlapping(
                    (&st as *const sockaddr_storage).cast::<u8>(),
                    at,
                    len as usize,
                );
                at as *mut sockaddr
            };
            let e = entries.add(i);
            (*e).ifa_next = if i + 1 < list.len() {
                entries.add(i + 1)
            } else {
                std::ptr::null_mut()
            };
            (*e).ifa_name = name as *mut libc::c_char;
            (*e).ifa_flags = f.flags;
            (*e).ifa_addr = put(0, f.addr);
            (*e).ifa_netmask = put(1, f.netmask);
            (*e).ifa_ifu = f.broadcast.map_or(std::ptr::null_mut(), |b| put(2, b));
            (*e).ifa_data = std::ptr::null_mut();
        }
        *out = entries;
    }
    0
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sa(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    fn fabric(own: usize) -> HostMap {
        HostMap::new(
            "127.5.6.0".parse().unwrap(),
            vec![
                "10.0.0.1".parse().unwrap(),
                "10.0.0.2".parse().unwrap(),
                "fd00::3".parse().unwrap(),
            ],
            own,
        )
        .unwrap()
    }

    #[test]
    fn each_host_has_a_loopback_address_of_its_own_and_reads_back_as_itself() {
        let m = fabric(1);
        assert_eq!(
            m.to_real(sa("10.0.0.1:7000"), Use::Reach),
            Mapped::To(sa("127.5.6.1:7000"))
        );
        assert_eq!(
            m.to_real(sa("10.0.0.2:7000"), Use::Reach),
            Mapped::To(sa("127.5.6.2:7000"))
        );
        assert_eq!(m.to_sim(sa("127.5.6.1:7000")), Some(sa("10.0.0.1:7000")));
        assert_eq!(m.to_sim(sa("127.5.6.2:41000")), Some(sa("10.0.0.2:41000")));
    }

    #[test]
    fn any_address_binds_this_host_and_another_hosts_address_is_not_available() {
        let m = fabric(1);
        assert_eq!(
            m.to_real(sa("0.0.0.0:18515"), Use::Bind),
            Mapped::To(sa("127.5.6.2:18515"))
        );
        assert_eq!(
            m.to_real(sa("10.0.0.2:18515"), Use::Bind),
            Mapped::To(sa("127.5.6.2:18515"))
        );
        assert_eq!(
            m.to_real(sa("10.0.0.1:18515"), Use::Bind),
            Mapped::Refused {
                errno: libc::EADDRNOTAVAIL,
                said: false
            }
        );
        assert_eq!(
            m.to_real(sa("[::]:18515"), Use::Bind),
            Mapped::To(sa("[::ffff:127.5.6.2]:18515"))
        );
    }

    #[test]
    fn ipv6_sockets_reach_every_host_through_v4_mapped_loopback_addresses() {
        let m = fabric(0);
        assert_eq!(
            m.to_real(sa("[fd00::3]:9"), Use::Reach),
            Mapped::To(sa("[::ffff:127.5.6.3]:9"))
        );
        assert_eq!(
            m.to_real(sa("[::ffff:10.0.0.2]:9"), Use::Reach),
            Mapped::To(sa("[::ffff:127.5.6.2]:9"))
        );
        assert_eq!(m.to_sim(sa("[::ffff:127.5.6.3]:9")), Some(sa("[fd00::3]:9")));
        assert_eq!(
            m.to_sim(sa("[::ffff:127.5.6.1]:9")),
            Some(sa("[::ffff:10.0.0.1]:9"))
        );
        // An IPv6 host has no AF_INET form: its loopback address stays as the kernel said.
        assert_eq!(m.to_sim(sa("127.5.6.3:9")), None);
    }

    #[test]
    fn addresses_that_are_not_simulated_pass_through() {
        let m = fabric(0);
        for a in ["127.0.0.2:80", "192.168.1.5:22", "10.0.0.9:1", "[fd00::9]:1"] {
            assert_eq!(m.to_real(sa(a), Use::Reach), Mapped::Pass, "{a}");
            assert_eq!(m.to_sim(sa(a)), None, "{a}");
        }
        // Another daemon's block, and addresses of this block that are no host.
        for a in ["127.5.7.1:80", "127.5.6.4:80", "127.5.6.0:80", "127.5.6.255:80"] {
            assert_eq!(m.to_sim(sa(a)), None, "{a}");
        }
    }

    #[test]
    fn localhost_is_this_hosts_own_loopback_address() {
        let m = fabric(1);
        for (a, what) in [("127.0.0.1:80", Use::Reach), ("127.0.0.1:80", Use::Bind)] {
            assert_eq!(m.to_real(sa(a), what), Mapped::To(sa("127.5.6.2:80")), "{a}");
        }
        assert_eq!(
            m.to_real(sa("[::1]:80"), Use::Reach),
            Mapped::To(sa("[::ffff:127.5.6.2]:80"))
        );
        assert_eq!(
            m.to_real(sa("[::ffff:127.0.0.1]:80"), Use::Bind),
            Mapped::To(sa("[::ffff:127.5.6.2]:80"))
        );
    }

    #[test]
    fn the_interfaces_are_lo_and_the_hosts_own_in_glibcs_order() {
        let names = |host: &str| -> Vec<(&str, IpAddr)> {
            interfaces(host.parse().unwrap())
                .iter()
                .map(|i| (i.name, i.addr))
                .collect()
        };
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        assert_eq!(
            names("10.0.0.2"),
            [
                ("lo", ip("127.0.0.1")),
                (IFACE, ip("10.0.0.2")),
                ("lo", ip("::1"))
            ]
        );
        assert_eq!(
            names("fd00::3"),
            [("lo", ip("127.0.0.1")), ("lo", ip("::1")), (IFACE, ip("fd00::3"))]
        );
        let own = interfaces(ip("10.0.0.2"))[1].clone();
        assert_eq!(own.broadcast, Some(ip("10.0.0.255")));
        assert_eq!(own.flags & libc::IFF_LOOPBACK as c_uint, 0);
    }

    #[test]
    fn hosts_past_the_254th_have_no_loopback_address() {
        let hosts: Vec<IpAddr> = (0..300u32)
            .map(|i| IpAddr::V4(Ipv4Addr::from(0x0a00_0000 + i + 1)))
            .collect();
        let m = HostMap::new("127.1.2.0".parse().unwrap(), hosts, 0).unwrap();
        assert_eq!(m.loopback(253), Some("127.1.2.254".parse().unwrap()));
        assert_eq!(m.loopback(254), None);
        assert!(matches!(
            m.to_real(sa("10.0.1.0:1"), Use::Reach),
            Mapped::Refused {
                errno: libc::EADDRNOTAVAIL,
                said: true
            }
        ));
    }

    #[test]
    fn the_variables_cmsim_run_sets_parse_and_bad_ones_are_refused() {
        let m = HostMap::parse("127.5.6.0", "10.0.0.1,10.0.0.2,fd00::3", "10.0.0.2").unwrap();
        assert_eq!(m, fabric(1));
        assert_eq!(
            HostMap::parse("127.5.6.0", "10.0.0.1,10.0.0.2,fd00::3", ""),
            Ok(fabric(0))
        );
        assert!(HostMap::parse("127.5.6.0", "10.0.0.1", "10.0.0.7").is_err());
        assert!(HostMap::parse("127.0.0.0", "10.0.0.1", "").is_err());
        assert!(HostMap::parse("10.5.6.0", "10.0.0.1", "").is_err());
        assert!(HostMap::parse("127.5.6.0", "10.0.0.1,nohost", "").is_err());
    }

    #[test]
    fn raw_addresses_survive_writing_and_reading() {
        for a in ["10.0.0.1:7471", "[fd00::3]:1", "[::ffff:127.5.6.1]:65535"] {
            let (st, len) = write_addr(sa(a));
            // SAFETY: st is a whole sockaddr_storage holding len bytes.
            let back = unsafe { read_addr((&st as *const sockaddr_storage).cast(), len) };
            assert_eq!(back, Some(sa(a)));
            // SAFETY: as above; one byte short is no address.
            let short = unsafe { read_addr((&st as *const sockaddr_storage).cast(), len - 1) };
            assert_eq!(short, None);
        }
    }
}
