//! The simulated device's node under `/dev` as a program on a simulated host sees it.
//!
//! A process on a machine with an RDMA device finds the device's character file
//! `/dev/infiniband/uverbs0` (rdma-core's udev rules make it mode 0666; major 231, minor 192,
//! the uverbs base) in the directory `/dev/infiniband`. Some programs check it before they
//! use the device: UCX lists an IB device only when `stat` says its `/dev/infiniband/<dev_name>`
//! is a character device and `access(R_OK | W_OK)` succeeds. Under `cmsim-run` the simulated
//! device is the machine's only one, so `stat`, `lstat`, `fstatat` (and their `64` names) and
//! `access`, `faccessat` of those two paths answer as for rxe's device node, whatever the
//! machine has there; every other path goes to libc's own call. Opening the node is not
//! served (its ioctls are the kernel's uverbs ABI, which this library stands in for at the
//! libibverbs level): such an `open` answers what the machine's file system answers.
//!
//! Without `CMSIM_HOSTS` (a program not started by `cmsim-run`, or this crate's own binaries)
//! every call passes through. The interposed calls allocate nothing and keep `errno` as libc
//! leaves it, or set it as the kernel would for the simulated node.

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use crate::ffi::set_errno;

/// The device node's path: `/dev/infiniband/` and the device's `dev_name`.
pub const UVERBS_PATH: &[u8] = b"/dev/infiniband/uverbs0";
/// The directory the node is in.
pub const DIR_PATH: &[u8] = b"/dev/infiniband";
/// uverbs' character major (`IB_UVERBS_MAJOR`) and its first minor (`IB_UVERBS_BASE_MINOR`).
const UVERBS_MAJOR: u32 = 231;
const UVERBS_MINOR: u32 = 192;

/// What a simulated path is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Node {
    /// `/dev/infiniband`: a directory, mode 0755.
    Dir,
    /// `/dev/infiniband/uverbs0`: the device's character node, mode 0666.
    Uverbs,
}

/// The simulated node at `path` (absolute, as given: `/dev/infiniband` may end in one `/`);
/// None for every other path.
pub fn node_of(path: &[u8]) -> Option<Node> {
    if path == UVERBS_PATH {
        Some(Node::Uverbs)
    } else if path.strip_suffix(b"/").unwrap_or(path) == DIR_PATH {
        Some(Node::Dir)
    } else {
        None
    }
}

/// Whether `mode` (`F_OK` or a mask of `R_OK`, `W_OK`, `X_OK`) is granted on `node` to a
/// caller whose effective uid is `euid`: the permission bits as the kernel checks them (root
/// may read and write anything, and search a directory).
pub fn access_allowed(node: Node, mode: c_int, euid: u32) -> bool {
    let perm = match node {
        Node::Dir => 0o755,
        Node::Uverbs => 0o666,
    };
    if mode & libc::X_OK != 0 && perm & 0o111 == 0 {
        return false;
    }
    if euid == 0 {
        return true;
    }
    // The node is root's: others get the "other" bits.
    let other = perm & 0o7;
    (mode & libc::R_OK == 0 || other & 0o4 != 0)
        && (mode & libc::W_OK == 0 || other & 0o2 != 0)
        && (mode & libc::X_OK == 0 || other & 0o1 != 0)
}

/// Fills `st` as the kernel's `stat` of `node` would (root's, on devtmpfs).
pub fn fill_stat(node: Node, st: &mut libc::stat) {
    // SAFETY: libc::stat is plain old data, for which all zeroes is a valid value.
    *st = unsafe { std::mem::zeroed() };
    st.st_dev = libc::makedev(0, 5);
    st.st_uid = 0;
    st.st_gid = 0;
    st.st_blksize = 4096;
    match node {
        Node::Dir => {
            st.st_mode = libc::S_IFDIR | 0o755;
            st.st_nlink = 2;
            st.st_ino = 1000;
            st.st_size = 60;
        }
        Node::Uverbs => {
            st.st_mode = libc::S_IFCHR | 0o666;
            st.st_nlink = 1;
            st.st_ino = 1001;
            st.st_rdev = libc::makedev(UVERBS_MAJOR, UVERBS_MINOR);
        }
    }
}

/// Whether this process runs on a simulated host (`cmsim-run` set the hosts).
fn simulated() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os(crate::proto::HOSTS_ENV).is_some())
}

/// The simulated node `path` names, on a simulated host; None otherwise (also for NULL).
///
/// # Safety
/// `path` is NULL or a C string.
unsafe fn simulated_node(path: *const c_char) -> Option<Node> {
    if path.is_null() || !simulated() {
        return None;
    }
    // SAFETY: the caller's C string.
    node_of(unsafe { CStr::from_ptr(path) }.to_bytes())
}

type StatFn = unsafe extern "C" fn(*const c_char, *mut libc::stat) -> c_int;
type FstatatFn = unsafe extern "C" fn(c_int, *const c_char, *mut libc::stat, c_int) -> c_int;
type AccessFn = unsafe extern "C" fn(*const c_char, c_int) -> c_int;
type FaccessatFn = unsafe extern "C" fn(c_int, *const c_char, c_int, c_int) -> c_int;

struct Real {
    stat: StatFn,
    lstat: StatFn,
    fstatat: FstatatFn,
    access: AccessFn,
    faccessat: FaccessatFn,
}

fn real() -> &'static Real {
    static REAL: OnceLock<Real> = OnceLock::new();
    REAL.get_or_init(|| {
        let find = crate::sockets::libc_symbol;
        // SAFETY: each symbol is libc's function of that name (glibc 2.33 on exports `stat`,
        // `lstat` and `fstatat` themselves), whose C type is the one given; a function pointer
        // and a data pointer have one size.
        unsafe {
            Real {
                stat: std::mem::transmute::<*mut c_void, StatFn>(find(c"stat")),
                lstat: std::mem::transmute::<*mut c_void, StatFn>(find(c"lstat")),
                fstatat: std::mem::transmute::<*mut c_void, FstatatFn>(find(c"fstatat")),
                access: std::mem::transmute::<*mut c_void, AccessFn>(find(c"access")),
                faccessat: std::mem::transmute::<*mut c_void, FaccessatFn>(find(c"faccessat")),
            }
        }
    })
}

/// Answers a stat of `node` into the caller's `st`: 0, or -1 with `EFAULT` for NULL.
///
/// # Safety
/// `st` is NULL or points to a `struct stat`.
unsafe fn stat_node(node: Node, st: *mut libc::stat) -> c_int {
    if st.is_null() {
        set_errno(libc::EFAULT);
        return -1;
    }
    // SAFETY: the caller's struct stat.
    fill_stat(node, unsafe { &mut *st });
    0
}

/// Answers an access check of `node`: 0, or -1 with `EACCES` (`EINVAL` for a mode of other
/// bits, as the kernel's).
fn access_node(node: Node, mode: c_int) -> c_int {
    if mode & !(libc::R_OK | libc::W_OK | libc::X_OK) != 0 {
        set_errno(libc::EINVAL);
        return -1;
    }
    // SAFETY: geteuid cannot fail.
    let euid = unsafe { libc::geteuid() };
    if access_allowed(node, mode, euid) {
        0
    } else {
        set_errno(libc::EACCES);
        -1
    }
}

/// `stat(2)`: the simulated device's node and its directory on a simulated host; else libc's.
///
/// # Safety
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments, as stat(2) takes them.
    unsafe {
        match simulated_node(path) {
            Some(node) => stat_node(node, st),
            None => (real().stat)(path, st),
        }
    }
}

/// `stat64`: glibc's other name of [`stat`] (one `struct stat` on 64-bit Linux).
///
/// # Safety
/// As `stat(2)`.
#[no_mangle]
pub unsafe extern "C" fn stat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: as stat.
    unsafe { stat(path, st) }
}

/// `lstat(2)`: as [`stat`] (the simulated paths are no links).
///
/// # Safety
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: the caller's arguments, as lstat(2) takes them.
    unsafe {
        match simulated_node(path) {
            Some(node) => stat_node(node, st),
            None => (real().lstat)(path, st),
        }
    }
}

/// `lstat64`: glibc's other name of [`lstat`].
///
/// # Safety
/// As `lstat(2)`.
#[no_mangle]
pub unsafe extern "C" fn lstat64(path: *const c_char, st: *mut libc::stat) -> c_int {
    // SAFETY: as lstat.
    unsafe { lstat(path, st) }
}

/// `fstatat(2)`: an absolute simulated path (which makes `dirfd` unused) as [`stat`]; with
/// `AT_EMPTY_PATH` or a relative path, libc's.
///
/// # Safety
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: the caller's arguments, as fstatat(2) takes them.
    unsafe {
        match simulated_node(path) {
            Some(node) if flags & libc::AT_EMPTY_PATH == 0 => stat_node(node, st),
            _ => (real().fstatat)(dirfd, path, st, flags),
        }
    }
}

/// `fstatat64`: glibc's other name of [`fstatat`].
///
/// # Safety
/// As `fstatat(2)`.
#[no_mangle]
pub unsafe extern "C" fn fstatat64(
    dirfd: c_int,
    path: *const c_char,
    st: *mut libc::stat,
    flags: c_int,
) -> c_int {
    // SAFETY: as fstatat.
    unsafe { fstatat(dirfd, path, st, flags) }
}

/// `access(2)`: the simulated node's permission bits on a simulated host; else libc's.
///
/// # Safety
/// As `access(2)`.
#[no_mangle]
pub unsafe extern "C" fn access(path: *const c_char, mode: c_int) -> c_int {
    // SAFETY: the caller's arguments, as access(2) takes them.
    unsafe {
        match simulated_node(path) {
            Some(node) => access_node(node, mode),
            None => (real().access)(path, mode),
        }
    }
}

/// `faccessat(2)`: an absolute simulated path as [`access`] (`AT_EACCESS` changes nothing: the
/// real and effective ids are checked alike here); otherwise libc's.
///
/// # Safety
/// As `faccessat(2)`.
#[no_mangle]
pub unsafe extern "C" fn faccessat(dirfd: c_int, path: *const c_char, mode: c_int, flags: c_int) -> c_int {
    // SAFETY: the caller's arguments, as faccessat(2) takes them.
    unsafe {
        match simulated_node(path) {
            Some(node) if flags & libc::AT_EMPTY_PATH == 0 => access_node(node, mode),
            _ => (real().faccessat)(dirfd, path, mode, flags),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_device_node_and_its_directory_are_simulated() {
        assert_eq!(node_of(b"/dev/infiniband/uverbs0"), Some(Node::Uverbs));
        assert_eq!(node_of(b"/dev/infiniband"), Some(Node::Dir));
        assert_eq!(node_of(b"/dev/infiniband/"), Some(Node::Dir));
        assert_eq!(node_of(b"/dev/infiniband/uverbs1"), None);
        assert_eq!(node_of(b"/dev/infiniband/uverbs0/"), None);
        assert_eq!(node_of(b"dev/infiniband/uverbs0"), None);
        assert_eq!(node_of(b"/etc/passwd"), None);
    }

    #[test]
    fn the_node_is_a_character_device_everyone_may_read_and_write() {
        // SAFETY: libc::stat is plain old data, for which all zeroes is a valid value.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        fill_stat(Node::Uverbs, &mut st);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFCHR);
        assert_eq!(libc::major(st.st_rdev), 231);
        assert_eq!(libc::minor(st.st_rdev), 192);
        assert!(access_allowed(Node::Uverbs, libc::R_OK | libc::W_OK, 1000));
        assert!(!access_allowed(Node::Uverbs, libc::X_OK, 0));
        fill_stat(Node::Dir, &mut st);
        assert_eq!(st.st_mode & libc::S_IFMT, libc::S_IFDIR);
        assert!(access_allowed(Node::Dir, libc::R_OK | libc::X_OK, 1000));
        assert!(!access_allowed(Node::Dir, libc::W_OK, 1000));
        assert!(access_allowed(Node::Dir, libc::W_OK, 0));
    }
}
