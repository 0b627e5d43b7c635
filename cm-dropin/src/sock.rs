//! `SOCK_SEQPACKET` Unix sockets and `poll`, the only system calls the daemon and the library
//! need beyond std. Each datagram is one protocol message, so no framing code exists anywhere.

use std::io;
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::path::Path;

/// The largest datagram either side sends: a poll reply with received bytes
/// ([`MAX_MESSAGE`](crate::proto::MAX_MESSAGE) each, replies are cut at this size) stays below
/// the kernel's default socket buffer, the limit of one `SOCK_SEQPACKET` message.
pub const MAX_DATAGRAM: usize = 192 * 1024;

fn cvt(ret: libc::c_int) -> io::Result<libc::c_int> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret)
    }
}

fn cvt_size(ret: libc::ssize_t) -> io::Result<usize> {
    if ret < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(ret as usize)
    }
}

fn sockaddr_un(path: &Path) -> io::Result<(libc::sockaddr_un, libc::socklen_t)> {
    use std::os::unix::ffi::OsStrExt;
    // SAFETY: sockaddr_un is plain old data; all-zero is a valid (empty) value.
    let mut sun: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    sun.sun_family = libc::AF_UNIX as libc::sa_family_t;
    let bytes = path.as_os_str().as_bytes();
    if bytes.len() >= sun.sun_path.len() {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            "socket path too long",
        ));
    }
    for (d, s) in sun.sun_path.iter_mut().zip(bytes) {
        *d = *s as libc::c_char;
    }
    let len = std::mem::size_of::<libc::sa_family_t>() + bytes.len() + 1;
    Ok((sun, len as libc::socklen_t))
}

fn seqpacket() -> io::Result<OwnedFd> {
    // SAFETY: socket() has no memory arguments; a non-negative result is a new fd we own.
    let fd = cvt(unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) })?;
    // SAFETY: fd was just returned by socket() and is owned by nobody else.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// A listening `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct SeqListener(OwnedFd);

impl SeqListener {
    /// Binds and listens at `path`, a socket file with permission bits `mode` (`0o600`: only
    /// its owner may connect). Whatever is at `path` already is left alone and refused
    /// (`AlreadyExists`) unless it is a socket nobody listens on any more (a daemon that was
    /// killed), which is replaced: a regular file, a symbolic link or a running daemon's socket
    /// is never taken over. The file appears only once the socket listens with its mode set, so
    /// whoever sees it can connect, and nobody else could before.
    pub fn bind(path: &Path, mode: u32) -> io::Result<SeqListener> {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        let taken = |what: &str| io::Error::new(io::ErrorKind::AlreadyExists, what.to_string());
        match std::fs::symlink_metadata(path) {
            Ok(m) if !m.file_type().is_socket() => {
                return Err(taken("exists and is not a socket; not replaced"))
            }
            Ok(_) => match SeqConn::connect(path) {
                Ok(_) => return Err(taken("a daemon listens there already")),
                Err(e) if e.raw_os_error() == Some(libc::ECONNREFUSED) => match std::fs::remove_file(path) {
                    Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
                    _ => {}
                },
                Err(e) => return Err(io::Error::new(e.kind(), format!("a socket not ours: {e}"))),
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        let mut tmp = path.as_os_str().to_owned();
        tmp.push(format!(".{}.tmp", std::process::id()));
        let tmp = std::path::PathBuf::from(tmp);
        let _ = std::fs::remove_file(&tmp);
        let fd = seqpacket()?;
        let (sun, len) = sockaddr_un(&tmp)?;
        // SAFETY: sun is a valid sockaddr_un of `len` meaningful bytes, alive for the call.
        cvt(unsafe { libc::bind(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) })?;
        // Before listen: until then a connect to the file is refused whatever its mode.
        let listening = std::fs::set_permissions(&tmp, std::fs::Permissions::from_mode(mode & 0o777))
            // SAFETY: plain call on an fd we own.
            .and_then(|()| cvt(unsafe { libc::listen(fd.as_raw_fd(), 1024) }).map(drop))
            // A link fails if anything appeared at `path` since the check: never replaced.
            .and_then(|()| std::fs::hard_link(&tmp, path));
        let _ = std::fs::remove_file(&tmp);
        listening.map_err(|e| match e.kind() {
            io::ErrorKind::AlreadyExists => taken("appeared while the daemon started; not replaced"),
            _ => e,
        })?;
        Ok(SeqListener(fd))
    }

    /// Accepts one connection.
    pub fn accept(&self) -> io::Result<SeqConn> {
        // SAFETY: NULL address arguments are allowed; the result is a new fd we own.
        let fd = cvt(unsafe {
            libc::accept4(
                self.0.as_raw_fd(),
                std::ptr::null_mut(),
                std::ptr::null_mut(),
                libc::SOCK_CLOEXEC,
            )
        })?;
        // SAFETY: fd was just returned by accept4 and is owned by nobody else.
        Ok(SeqConn(unsafe { OwnedFd::from_raw_fd(fd) }))
    }
}

impl AsRawFd for SeqListener {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// One connected `SOCK_SEQPACKET` socket.
#[derive(Debug)]
pub struct SeqConn(OwnedFd);

impl SeqConn {
    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> io::Result<SeqConn> {
        let fd = seqpacket()?;
        let (sun, len) = sockaddr_un(path)?;
        // SAFETY: sun is a valid sockaddr_un of `len` meaningful bytes, alive for the call.
        cvt(unsafe { libc::connect(fd.as_raw_fd(), (&sun as *const libc::sockaddr_un).cast(), len) })?;
        Ok(SeqConn(fd))
    }

    /// Sends one datagram, waiting for buffer space.
    pub fn send(&self, msg: &[u8]) -> io::Result<()> {
        self.send_flags(msg, 0)
    }

    /// Sends one datagram or fails with `WouldBlock` when the peer's buffer is full.
    pub fn try_send(&self, msg: &[u8]) -> io::Result<()> {
        self.send_flags(msg, libc::MSG_DONTWAIT)
    }

    fn send_flags(&self, msg: &[u8], flags: libc::c_int) -> io::Result<()> {
        loop {
            // SAFETY: msg is a valid buffer of msg.len() bytes for the duration of the call.
            let r = unsafe {
                libc::send(
                    self.0.as_raw_fd(),
                    msg.as_ptr().cast(),
                    msg.len(),
                    flags | libc::MSG_NOSIGNAL,
                )
            };
            match cvt_size(r) {
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
                Ok(_) => return Ok(()),
            }
        }
    }

    /// Receives one datagram into `buf` (resized to it); `Ok(false)` when the peer closed.
    pub fn recv(&self, buf: &mut Vec<u8>) -> io::Result<bool> {
        recv_fd(self.0.as_raw_fd(), buf, 0)
    }

    /// Lends the fd to C code: the caller keeps this value alive while the fd is used.
    pub fn into_raw_fd(self) -> RawFd {
        use std::os::fd::IntoRawFd;
        self.0.into_raw_fd()
    }
}

impl AsRawFd for SeqConn {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Receives one datagram from a socket fd (`flags` as for recv(2)); `Ok(false)` when the peer
/// closed. A datagram of no bytes is one (`Ok(true)`, `buf` empty, which no message decodes
/// as): recv(2) answers it with 0 as it answers the end, so the end is told by the peer having
/// hung up. Fails with `WouldBlock` on a non-blocking fd with nothing queued.
pub fn recv_fd(fd: RawFd, buf: &mut Vec<u8>, flags: libc::c_int) -> io::Result<bool> {
    recv_fd_with(fd, buf, flags, true)
}

/// [`recv_fd`], except that a signal caught while it waits ends it with `Interrupted`
/// (`EINTR`), as a `read` of a verbs completion channel ends: programs that stop a blocking
/// `ibv_get_cq_event` with an alarm (qperf's timed tests) see the call return.
pub fn recv_fd_interruptible(fd: RawFd, buf: &mut Vec<u8>, flags: libc::c_int) -> io::Result<bool> {
    recv_fd_with(fd, buf, flags, false)
}

fn recv_fd_with(fd: RawFd, buf: &mut Vec<u8>, flags: libc::c_int, restart: bool) -> io::Result<bool> {
    // Reused buffers keep their capacity: no zeroing and no allocation per message.
    buf.clear();
    buf.reserve(MAX_DATAGRAM);
    loop {
        let spare = buf.spare_capacity_mut();
        // SAFETY: spare is writable memory of spare.len() bytes for the duration of the call.
        let r = unsafe { libc::recv(fd, spare.as_mut_ptr().cast(), spare.len(), flags) };
        match cvt_size(r) {
            Err(e) if restart && e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(0) => return Ok(!hung_up(fd)),
            Ok(n) => {
                // SAFETY: the kernel initialised the first n bytes of the spare capacity.
                unsafe { buf.set_len(n) };
                return Ok(true);
            }
        }
    }
}

/// What [`recv_from`] received.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Received {
    /// One datagram (possibly empty), with the process that sent it as the kernel names it
    /// (`SCM_CREDENTIALS`; `None` when the socket was not set to [`pass_credentials`]).
    Message {
        /// The sending process's pid (its thread group), which the kernel checks: a process
        /// cannot claim another's without `CAP_SYS_ADMIN`.
        sender: Option<u32>,
    },
    /// The peer closed.
    End,
}

/// Receives one datagram as [`recv_fd`] does, and with it the pid of the process that sent
/// it: whoever holds a socket (a forked child holds its parent's) is told apart by that.
pub fn recv_from(fd: RawFd, buf: &mut Vec<u8>, flags: libc::c_int) -> io::Result<Received> {
    buf.clear();
    buf.reserve(MAX_DATAGRAM);
    // u64s: the control buffer must be aligned for cmsghdr; 64 bytes hold one ucred (32).
    let mut control = [0u64; 8];
    loop {
        let spare = buf.spare_capacity_mut();
        let mut iov = libc::iovec {
            iov_base: spare.as_mut_ptr().cast(),
            iov_len: spare.len(),
        };
        // SAFETY: msghdr is plain old data; all-zero is a valid empty value, filled in below.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        msg.msg_control = control.as_mut_ptr().cast();
        msg.msg_controllen = std::mem::size_of_val(&control);
        // SAFETY: msg points at iov (writable spare capacity) and control (writable, its size
        // given), both alive for the call.
        let r = unsafe { libc::recvmsg(fd, &mut msg, flags | libc::MSG_CMSG_CLOEXEC) };
        let n = match cvt_size(r) {
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => return Err(e),
            Ok(n) => n,
        };
        let mut sender = None;
        // SAFETY: msg was filled by recvmsg: CMSG_FIRSTHDR/NXTHDR walk the control bytes the
        // kernel wrote (msg_controllen), and an SCM_CREDENTIALS entry holds one ucred, read
        // unaligned since CMSG_DATA promises no alignment for it.
        unsafe {
            let mut c = libc::CMSG_FIRSTHDR(&msg);
            while !c.is_null() {
                if (*c).cmsg_level == libc::SOL_SOCKET && (*c).cmsg_type == libc::SCM_CREDENTIALS {
                    let cred = std::ptr::read_unaligned(libc::CMSG_DATA(c) as *const libc::ucred);
                    sender = Some(cred.pid as u32);
                }
                c = libc::CMSG_NXTHDR(&msg, c);
            }
        }
        if n == 0 && hung_up(fd) {
            return Ok(Received::End);
        }
        // SAFETY: the kernel initialised the first n bytes of the spare capacity.
        unsafe { buf.set_len(n) };
        return Ok(Received::Message { sender });
    }
}

/// Has the kernel attach the sender's credentials to every datagram `fd` receives
/// (`SO_PASSCRED`), for [`recv_from`].
pub fn pass_credentials(fd: RawFd) -> io::Result<()> {
    let on: libc::c_int = 1;
    // SAFETY: the option value is one c_int, alive for the call.
    cvt(unsafe {
        libc::setsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PASSCRED,
            (&on as *const libc::c_int).cast(),
            std::mem::size_of::<libc::c_int>() as libc::socklen_t,
        )
    })
    .map(|_| ())
}

/// The process at the other end of a connected Unix socket, as the kernel recorded it when it
/// connected (`SO_PEERCRED`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Peer {
    /// Its pid.
    pub pid: u32,
    /// Its effective uid.
    pub uid: u32,
}

/// The connecting process of `fd` ([`Peer`]).
pub fn peer(fd: RawFd) -> io::Result<Peer> {
    // SAFETY: ucred is plain old data; all-zero is valid, and getsockopt fills it.
    let mut cred: libc::ucred = unsafe { std::mem::zeroed() };
    let mut len = std::mem::size_of::<libc::ucred>() as libc::socklen_t;
    // SAFETY: cred is writable for len bytes, len is its size; both alive for the call.
    cvt(unsafe {
        libc::getsockopt(
            fd,
            libc::SOL_SOCKET,
            libc::SO_PEERCRED,
            (&mut cred as *mut libc::ucred).cast(),
            &mut len,
        )
    })?;
    Ok(Peer {
        pid: cred.pid as u32,
        uid: cred.uid,
    })
}

/// A pidfd: names one process for as long as the daemon holds it, whatever pid the kernel
/// later gives to another (`pidfd_open`), and becomes readable when that process exits.
#[derive(Debug)]
pub struct ProcessFd(OwnedFd);

impl ProcessFd {
    /// Opens a pidfd for the live process `pid`.
    pub fn open(pid: u32) -> io::Result<ProcessFd> {
        // SAFETY: pidfd_open takes a pid and flags, no pointers; a non-negative result is a
        // new fd we own.
        let r = unsafe { libc::syscall(libc::SYS_pidfd_open, pid as libc::pid_t, 0 as libc::c_uint) };
        if r < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: r is an fd just returned to us by the kernel, owned by nobody else.
        Ok(ProcessFd(unsafe { OwnedFd::from_raw_fd(r as RawFd) }))
    }

    /// Whether the process has exited (its pid may name another process now).
    pub fn exited(&self) -> bool {
        let mut p = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: p is one valid pollfd for the duration of the call; a zero timeout never
        // blocks.
        let r = unsafe { libc::poll(&mut p, 1, 0) };
        r != 0 && (r < 0 || p.revents != 0)
    }
}

impl AsRawFd for ProcessFd {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

/// Whether the peer of the connected socket `fd` has closed its end (or shut down writing).
fn hung_up(fd: RawFd) -> bool {
    let mut p = libc::pollfd {
        fd,
        events: libc::POLLRDHUP,
        revents: 0,
    };
    // SAFETY: p is one valid pollfd for the duration of the call; a zero timeout never blocks.
    let r = unsafe { libc::poll(&mut p, 1, 0) };
    r < 0 || p.revents & (libc::POLLRDHUP | libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0
}

/// Whether the application set `O_NONBLOCK` on `fd`.
pub fn is_nonblocking(fd: RawFd) -> bool {
    // SAFETY: F_GETFL takes no pointer argument; a bad fd just returns -1.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    flags >= 0 && flags & libc::O_NONBLOCK != 0
}

/// Closes an fd that was lent to C code with [`SeqConn::into_raw_fd`].
pub fn close_fd(fd: RawFd) {
    // SAFETY: the caller owned fd (it came from into_raw_fd) and gives up every use of it.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
}

/// Reads `len` bytes at `addr` in process `pid` (`process_vm_readv`: how the daemon, like a
/// NIC, reads registered memory without a thread of the target's).
pub fn read_process(pid: u32, addr: u64, len: usize) -> io::Result<Vec<u8>> {
    let mut buf = vec![0u8; len];
    let local = libc::iovec {
        iov_base: buf.as_mut_ptr().cast(),
        iov_len: len,
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: len,
    };
    // SAFETY: local describes buf, writable for len bytes; the remote side is only accessed
    // by the kernel, which checks it against the target's address space.
    let n = cvt_size(unsafe { libc::process_vm_readv(pid as libc::pid_t, &local, 1, &remote, 1, 0) })?;
    if n != len {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short remote read"));
    }
    Ok(buf)
}

/// Writes `data` at `addr` in process `pid` (`process_vm_writev`).
pub fn write_process(pid: u32, addr: u64, data: &[u8]) -> io::Result<()> {
    let local = libc::iovec {
        iov_base: data.as_ptr() as *mut libc::c_void,
        iov_len: data.len(),
    };
    let remote = libc::iovec {
        iov_base: addr as *mut libc::c_void,
        iov_len: data.len(),
    };
    // SAFETY: local describes data, readable for its length (the kernel only reads it); the
    // remote side is checked by the kernel against the target's address space.
    let n = cvt_size(unsafe { libc::process_vm_writev(pid as libc::pid_t, &local, 1, &remote, 1, 0) })?;
    if n != data.len() {
        return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "short remote write"));
    }
    Ok(())
}

/// Raises this process's soft limit on open fds to its hard limit: the daemon holds sockets
/// for every program's channels, and the default soft limit (1024) is an accident of history.
pub fn raise_fd_limit() {
    // SAFETY: rlimit is plain old data; getrlimit fills it and setrlimit reads it, each alive
    // for its call.
    unsafe {
        let mut l: libc::rlimit = std::mem::zeroed();
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) == 0 && l.rlim_cur < l.rlim_max {
            l.rlim_cur = l.rlim_max;
            let _ = libc::setrlimit(libc::RLIMIT_NOFILE, &l);
        }
    }
}

/// Lets process `pid` (the daemon) read and write this process's memory under Yama's
/// `ptrace_scope = 1`; without Yama the call fails harmlessly.
pub fn allow_ptracer(pid: u32) {
    // SAFETY: PR_SET_PTRACER takes a pid and no pointers.
    let _ = unsafe { libc::prctl(libc::PR_SET_PTRACER, pid as libc::c_ulong, 0, 0, 0) };
}

/// What `poll` reported for one fd.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Ready {
    /// Data (or end of file) can be read.
    pub readable: bool,
    /// Space to write.
    pub writable: bool,
    /// Hang-up or error.
    pub closed: bool,
}

/// What [`poll`] waits for on one fd. Hang-ups and errors are reported whichever it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Interest {
    /// Data (or end of file) to read.
    Read,
    /// Space to write.
    Write,
    /// Only the peer closing: what a socket nothing is read from or written to waits for.
    HangUp,
}

/// Waits up to `timeout_ms` (−1: forever) for `fds`; returns their readiness.
pub fn poll(fds: &[(RawFd, Interest)], timeout_ms: i32) -> io::Result<Vec<Ready>> {
    let mut pfds: Vec<libc::pollfd> = fds
        .iter()
        .map(|&(fd, interest)| libc::pollfd {
            fd,
            events: match interest {
                Interest::Read => libc::POLLIN,
                Interest::Write => libc::POLLOUT,
                Interest::HangUp => 0,
            },
            revents: 0,
        })
        .collect();
    // SAFETY: pfds is a valid array of pfds.len() pollfd structs for the duration of the call.
    let r = unsafe { libc::poll(pfds.as_mut_ptr(), pfds.len() as libc::nfds_t, timeout_ms) };
    if r < 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::Interrupted {
            return Err(e);
        }
    }
    Ok(pfds
        .iter()
        .map(|p| Ready {
            readable: p.revents & libc::POLLIN != 0,
            writable: p.revents & libc::POLLOUT != 0,
            closed: p.revents & (libc::POLLHUP | libc::POLLERR | libc::POLLNVAL) != 0,
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_kernel_names_the_sender_of_each_datagram_and_the_connecting_process() {
        let path = scratch("creds");
        let listener = SeqListener::bind(&path, 0o600).expect("bind");
        let client = SeqConn::connect(&path).expect("connect");
        let server = listener.accept().expect("accept");
        let me = std::process::id();
        assert_eq!(peer(server.as_raw_fd()).expect("SO_PEERCRED").pid, me);
        pass_credentials(server.as_raw_fd()).expect("SO_PASSCRED");
        client.send(b"hi").expect("send");
        let mut buf = Vec::new();
        assert_eq!(
            recv_from(server.as_raw_fd(), &mut buf, 0).expect("recv"),
            Received::Message { sender: Some(me) }
        );
        assert_eq!(buf, b"hi");
        drop(client);
        assert_eq!(
            recv_from(server.as_raw_fd(), &mut buf, 0).expect("recv"),
            Received::End
        );
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn a_pidfd_becomes_readable_when_its_process_exits() {
        let mut child = std::process::Command::new("sleep")
            .arg("0.2")
            .spawn()
            .expect("sleep");
        let fd = ProcessFd::open(child.id()).expect("pidfd_open");
        assert!(!fd.exited());
        child.wait().expect("wait");
        assert!(fd.exited());
    }

    #[test]
    fn datagrams_keep_their_boundaries_and_close_reads_as_end() {
        let dir = std::env::temp_dir().join(format!("cmsim-sock-test-{}", std::process::id()));
        let l = SeqListener::bind(&dir, 0o600).unwrap();
        let c = SeqConn::connect(&dir).unwrap();
        let s = l.accept().unwrap();
        c.send(b"one").unwrap();
        c.send(b"second").unwrap();
        let mut buf = Vec::new();
        assert!(s.recv(&mut buf).unwrap());
        assert_eq!(buf, b"one");
        assert!(s.recv(&mut buf).unwrap());
        assert_eq!(buf, b"second");
        let e = recv_fd(s.as_raw_fd(), &mut buf, libc::MSG_DONTWAIT).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::WouldBlock);
        // A datagram of no bytes is a message, not the end.
        c.send(b"").unwrap();
        c.send(b"after").unwrap();
        assert!(s.recv(&mut buf).unwrap(), "an empty datagram is not the end");
        assert!(buf.is_empty());
        assert!(s.recv(&mut buf).unwrap());
        assert_eq!(buf, b"after");
        drop(c);
        assert!(!s.recv(&mut buf).unwrap());
        let _ = std::fs::remove_file(&dir);
    }

    fn scratch(name: &str) -> std::path::PathBuf {
        let p = std::env::temp_dir().join(format!("cmsim-sock-{name}-{}", std::process::id()));
        let _ = std::fs::remove_file(&p);
        p
    }

    #[test]
    fn the_socket_file_has_the_mode_asked_for_whatever_the_umask() {
        use std::os::unix::fs::PermissionsExt;
        for mode in [0o600, 0o660] {
            let path = scratch(&format!("mode-{mode:o}"));
            // SAFETY: umask only sets this process's file-creation mask; it cannot fail.
            let old = unsafe { libc::umask(0) };
            let l = SeqListener::bind(&path, mode);
            // SAFETY: as above, putting the mask back.
            unsafe { libc::umask(old) };
            let _l = l.unwrap();
            let got = std::fs::metadata(&path).unwrap().permissions().mode() & 0o777;
            assert_eq!(got, mode, "{}", path.display());
            let _ = std::fs::remove_file(&path);
        }
    }

    #[test]
    fn a_path_holding_a_file_or_a_live_socket_is_refused_and_left_alone() {
        let file = scratch("file");
        std::fs::write(&file, b"precious").unwrap();
        let e = SeqListener::bind(&file, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        assert_eq!(std::fs::read(&file).unwrap(), b"precious");
        let _ = std::fs::remove_file(&file);

        let link = scratch("link");
        std::os::unix::fs::symlink("/nonexistent/target", &link).unwrap();
        assert_eq!(
            SeqListener::bind(&link, 0o600).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        assert!(std::fs::symlink_metadata(&link).unwrap().file_type().is_symlink());
        let _ = std::fs::remove_file(&link);

        let live = scratch("live");
        let first = SeqListener::bind(&live, 0o600).unwrap();
        let e = SeqListener::bind(&live, 0o600).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::AlreadyExists, "{e}");
        // The refused one's probe came and went (the daemon reads its end as a client that
        // left without a word), and the first daemon still serves its path.
        let mut buf = Vec::new();
        assert!(
            !first.accept().unwrap().recv(&mut buf).unwrap(),
            "the probe hung up"
        );
        let c = SeqConn::connect(&live).unwrap();
        let s = first.accept().unwrap();
        c.send(b"still here").unwrap();
        assert!(s.recv(&mut buf).unwrap());
        assert_eq!(buf, b"still here");
        let _ = std::fs::remove_file(&live);
    }

    #[test]
    fn a_socket_nobody_listens_on_is_replaced() {
        let path = scratch("stale");
        drop(SeqListener::bind(&path, 0o600).unwrap());
        assert!(
            std::fs::symlink_metadata(&path).is_ok(),
            "a killed daemon leaves its file"
        );
        let l = SeqListener::bind(&path, 0o600).unwrap();
        let c = SeqConn::connect(&path).unwrap();
        let _s = l.accept().unwrap();
        drop(c);
        let _ = std::fs::remove_file(&path);
    }

    #[test]
    fn process_memory_is_read_and_written_in_place() {
        let mut target = *b"0123456789";
        let pid = std::process::id();
        let addr = target.as_mut_ptr() as u64;
        assert_eq!(read_process(pid, addr + 2, 3).unwrap(), b"234");
        write_process(pid, addr + 4, b"ab").unwrap();
        assert_eq!(std::hint::black_box(&target), b"0123ab6789");
        assert!(read_process(pid, 0, 4).is_err(), "address 0 is never mapped");
    }
}
