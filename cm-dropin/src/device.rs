//! Device discovery: the one simulated device (`cmsim0`), its context, and the queries
//! rdma-core's `ibv_devices` and `ibv_devinfo` make, with rxe's answers on Linux 6.1
//! (`drivers/infiniband/sw/rxe/rxe_param.h`) where the simulator does not enforce less.
//!
//! The device is the one every rdma_cm id is bound to. Its GUIDs and GIDs derive from the
//! simulated host's address (the daemon's hello reply names it): a simulated host has no MAC,
//! so it is given the locally administered `02:00:a.b.c.d`, from which rxe would derive the
//! node GUID and the IPv6 link-local GID (EUI-64).
#![allow(clippy::missing_safety_doc)] // the safety contract of each function is libibverbs' C one

use std::collections::HashSet;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::net::IpAddr;
use std::ptr;
use std::sync::{Mutex, OnceLock};

use crate::abi::*;
use crate::ffi::{fail, lock, set_errno, unsupported};
use crate::proto;

/// The simulated device's name (what `ibv_get_device_name` and `rdma_get_devices` give).
const NAME: &[u8] = b"cmsim0";
/// Where libibverbs would find the device in sysfs: served by name, never opened.
const IBDEV_PATH: &[u8] = b"/sys/class/infiniband/cmsim0";
const DEV_PATH: &[u8] = b"/sys/class/infiniband_verbs/uverbs0";

/// rxe's `RXE_PORT_GID_TBL_LEN`: the table's length; entries past the host's are empty.
const GID_TBL_LEN: i32 = 1024;
const IBV_GID_TYPE_ROCE_V2: u32 = 2;
const IBV_GID_TYPE_SYSFS_IB_ROCE_V1: u32 = 0;
const IBV_GID_TYPE_SYSFS_ROCE_V2: u32 = 1;

/// rxe's `RXE_DEVICE_CAP_FLAGS` (0x01223c76) less what the drop-in does not serve: SRQ resize
/// (`ibv_modify_srq` of `max_wr`), memory windows and fast registration (`MEM_MGT_EXTENSIONS`).
const DEVICE_CAP_FLAGS: u32 = (1 << 1) // BAD_PKEY_CNTR
    | (1 << 2) // BAD_QKEY_CNTR
    | (1 << 4) // AUTO_PATH_MIG
    | (1 << 5) // CHANGE_PHY_PORT
    | (1 << 6) // UD_AV_PORT_ENFORCE
    | (1 << 10) // PORT_ACTIVE_EVENT
    | (1 << 11) // SYS_IMAGE_GUID
    | (1 << 12); // RC_RNR_NAK_GEN

/// rdma-core's `struct verbs_device` around the device: libibverbs' own devices are one, and
/// provider calls given a device (`mlx5dv_is_supported`) read its `ops` right after the
/// `struct ibv_device` to see whether it is theirs. Here that is NULL and the rest zeroes:
/// no provider's device.
#[repr(C)]
struct VerbsDeviceShell {
    device: IbvDevice,
    /// `ops`, `refcount`, `entry`, `sysfs`, `core_support`, with room to spare.
    tail: [usize; 8],
}

/// The device every context points at (leaked: it lives as long as the process).
fn device() -> *mut IbvDevice {
    static DEV: OnceLock<usize> = OnceLock::new();
    *DEV.get_or_init(|| {
        let mut dev = Box::new(VerbsDeviceShell {
            tail: [0; 8],
            device: IbvDevice {
                ops: [ptr::null_mut(); 2],
                node_type: 1,      // IBV_NODE_CA
                transport_type: 0, // IBV_TRANSPORT_IB, as rxe (RoCE is IB transport)
                name: [0; 64],
                dev_name: [0; 64],
                dev_path: [0; 256],
                ibdev_path: [0; 256],
            },
        });
        let d = &mut dev.device;
        d.name[..NAME.len()].copy_from_slice(NAME);
        d.dev_name[..7].copy_from_slice(b"uverbs0");
        d.dev_path[..DEV_PATH.len()].copy_from_slice(DEV_PATH);
        d.ibdev_path[..IBDEV_PATH.len()].copy_from_slice(IBDEV_PATH);
        // The shell starts with the device (repr(C)): its address is the device's.
        Box::into_raw(dev) as usize
    }) as *mut IbvDevice
}

/// The context's `async_fd`: an eventfd nothing writes, since the simulator raises no
/// asynchronous event to the program. Like the kernel's uverbs event file it is a real fd
/// that programs poll or set `O_NONBLOCK` on (UCX does both), and it never becomes readable;
/// -1 when the process is out of fds.
fn async_event_fd() -> c_int {
    // SAFETY: eventfd takes no pointers.
    unsafe { libc::eventfd(0, libc::EFD_CLOEXEC) }
}

/// A new context on the device, with the data path and `query_device_ex` filled in.
fn new_context() -> *mut VerbsContext {
    let mut ops = [ptr::null_mut(); 32];
    crate::verbs::fill_ops(&mut ops);
    let mut ext_ops = [ptr::null_mut(); 39];
    ext_ops[VCTX_QUERY_DEVICE_EX] = query_device_ex as *mut c_void;
    Box::into_raw(Box::new(VerbsContext {
        ext_ops,
        sz: std::mem::size_of::<VerbsContext>(),
        device: device(),
        ops,
        cmd_fd: -1,
        async_fd: async_event_fd(),
        num_comp_vectors: 1,
        mutex: [0; 5],
        abi_compat: usize::MAX as *mut c_void,
    }))
}

/// The context every id is bound to (what `id->verbs` and `rdma_get_devices` give); it lives as
/// long as the process.
pub(crate) fn device_context() -> *mut c_void {
    static CTX: OnceLock<usize> = OnceLock::new();
    (*CTX.get_or_init(|| new_context() as usize) + IBV_CONTEXT_OFFSET) as *mut c_void
}

/// Contexts `ibv_open_device` handed out and `ibv_close_device` has not taken back.
static OPENED: Mutex<Option<HashSet<usize>>> = Mutex::new(None);

/// The EUI-64 rxe derives from the host's MAC: node and system image GUID, and the interface
/// half of the link-local GID.
fn eui64(addr: IpAddr) -> [u8; 8] {
    cm_core::port_eui64(addr)
}

/// The port's non-empty GIDs, as rxe lays the table out and the simulator checks source GIDs:
/// the IPv6 link-local GID at 0, then the host's address (IPv4 mapped into IPv6).
fn gids(addr: IpAddr) -> [[u8; 16]; 2] {
    let ll = cm_core::link_local_gid(addr);
    let own = match addr {
        IpAddr::V4(a) => a.to_ipv6_mapped().octets(),
        IpAddr::V6(a) => a.octets(),
    };
    [ll, own]
}

/// GID `index` of port `port`: `Ok(None)` for an empty entry of the table, `EINVAL` past it or
/// on another port (the kernel's answers).
fn gid_at(port: u32, index: i64) -> Result<Option<[u8; 16]>, c_int> {
    if port != 1 || !(0..i64::from(GID_TBL_LEN)).contains(&index) {
        return Err(libc::EINVAL);
    }
    let table = gids(crate::ffi::host_addr()?);
    Ok(table.get(index as usize).copied())
}

/// Whether `context` is one of this library's device contexts.
fn is_context(context: *mut c_void) -> bool {
    if context.is_null() {
        return false;
    }
    context == device_context()
        || lock(&OPENED)
            .as_ref()
            .is_some_and(|s| s.contains(&(context as usize)))
}

/// `ibv_get_device_list`: the one simulated device, once the process is attached to the fabric;
/// without a daemon or a host, NULL with the reason on stderr and in errno (as
/// `rdma_get_devices`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_list(num_devices: *mut c_int) -> *mut *mut IbvDevice {
    let list = match crate::ffi::daemon_address() {
        Ok(_) => Box::into_raw(Box::new([device(), ptr::null_mut()])) as *mut *mut IbvDevice,
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

/// `ibv_free_device_list`: frees a list of `ibv_get_device_list` (the device lives on).
#[no_mangle]
pub unsafe extern "C" fn ibv_free_device_list(list: *mut *mut IbvDevice) {
    if !list.is_null() {
        // SAFETY: list came from ibv_get_device_list, a boxed two-entry array, given back once.
        drop(unsafe { Box::from_raw(list as *mut [*mut IbvDevice; 2]) });
    }
}

/// `ibv_get_device_name`: the device's name (`cmsim0`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_name(device: *mut IbvDevice) -> *const c_char {
    if device.is_null() {
        fail(libc::EINVAL);
        return ptr::null();
    }
    // SAFETY: the only devices a program can reach are this library's; the name is
    // NUL-terminated within its 64 bytes and lives as long as the process.
    unsafe { (*device).name.as_ptr() as *const c_char }
}

/// `ibv_get_device_guid` (`__be64`): the node GUID; 0 (libibverbs' answer when it cannot read
/// one) with errno when the host is unknown.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_device_guid(device: *mut IbvDevice) -> u64 {
    if device != self::device() {
        set_errno(libc::EINVAL);
        return 0;
    }
    match crate::ffi::host_addr() {
        Ok(addr) => u64::from_ne_bytes(eui64(addr)),
        Err(errno) => {
            set_errno(errno);
            0
        }
    }
}

/// `ibv_open_device`: a context of its own on the simulated device, which every verb served
/// takes (PDs, MRs, CQs and channels are the daemon's, whatever context names them).
#[no_mangle]
pub unsafe extern "C" fn ibv_open_device(device: *mut IbvDevice) -> *mut c_void {
    if device.is_null() || device != self::device() {
        set_errno(libc::ENODEV);
        return ptr::null_mut();
    }
    let ctx = (new_context() as usize + IBV_CONTEXT_OFFSET) as *mut c_void;
    lock(&OPENED)
        .get_or_insert_with(HashSet::new)
        .insert(ctx as usize);
    ctx
}

/// `ibv_close_device`: frees a context of `ibv_open_device`; the one rdma_cm ids share is not
/// the program's to close (-1, `EINVAL`, as for a pointer this library never gave).
#[no_mangle]
pub unsafe extern "C" fn ibv_close_device(context: *mut c_void) -> c_int {
    let known = lock(&OPENED)
        .as_mut()
        .is_some_and(|s| s.remove(&(context as usize)));
    if !known {
        return fail(libc::EINVAL);
    }
    // SAFETY: context came from ibv_open_device (new_context's box, offset to its ibv_context)
    // and is given back once.
    let ctx = unsafe { Box::from_raw((context as usize - IBV_CONTEXT_OFFSET) as *mut VerbsContext) };
    if ctx.async_fd >= 0 {
        // SAFETY: the context's own eventfd, closed once with it.
        unsafe { libc::close(ctx.async_fd) };
    }
    drop(ctx);
    0
}

/// The device's attributes: rxe's (`rxe_init_device_param`), with the simulator's limits
/// where it enforces less (`max_qp_wr`, `max_mr_size`) and nothing promised the drop-in does
/// not serve (memory windows, atomics).
fn device_attr(addr: IpAddr) -> IbvDeviceAttr {
    let sim = cm_sim::SimConfig::default();
    let mut fw_ver = [0u8; 64];
    // rxe's provider prints the kernel's fw_ver (0) as major.minor.sub_minor.
    fw_ver[..5].copy_from_slice(b"0.0.0");
    IbvDeviceAttr {
        fw_ver,
        node_guid: eui64(addr),
        sys_image_guid: eui64(addr),
        max_mr_size: sim.max_mr_size,
        page_size_cap: 0xffff_f000,
        vendor_id: 0x00ff_ffff,
        vendor_part_id: 0,
        hw_ver: 0,
        max_qp: (1 << 20) - 16,
        max_qp_wr: sim.max_qp_wr as i32,
        device_cap_flags: DEVICE_CAP_FLAGS,
        max_sge: sim.max_sge as i32,
        max_sge_rd: 32,
        max_cq: 1 << 20,
        max_cqe: proto::MAX_CQE as i32,
        max_mr: (1 << 19) - 1,
        max_pd: 1 << 20,
        max_qp_rd_atom: i32::from(sim.max_rd_atomic),
        max_ee_rd_atom: 0,
        max_res_rd_atom: 0x3f000,
        max_qp_init_rd_atom: i32::from(sim.max_rd_atomic),
        max_ee_init_rd_atom: 0,
        atomic_cap: 0, // IBV_ATOMIC_NONE: atomics are refused at post
        max_ee: 0,
        max_rdd: 0,
        max_mw: 0,
        max_raw_ipv6_qp: 0,
        max_raw_ethy_qp: 0,
        max_mcast_grp: 8192,
        max_mcast_qp_attach: 56,
        max_total_mcast_qp_attach: 0x70000,
        max_ah: (1 << 15) - 1,
        max_fmr: 0,
        max_map_per_fmr: 0,
        // rxe's RXE_MAX_SRQ (its SRQ indices run from 0x20001 up to 2^20).
        max_srq: (1 << 20) - 0x0002_0001,
        max_srq_wr: sim.max_srq_wr as i32,
        max_srq_sge: sim.max_srq_sge as i32,
        max_pkeys: 64,
        local_ca_ack_delay: 15,
        phys_port_cnt: 1,
        pad: 0,
    }
}

/// `ibv_query_device`: 0, or the errno value (`EINVAL`, or why the host is unknown).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device(context: *mut c_void, attr: *mut IbvDeviceAttr) -> c_int {
    if attr.is_null() || !is_context(context) {
        return libc::EINVAL;
    }
    match crate::ffi::host_addr() {
        Ok(addr) => {
            // SAFETY: attr is the caller's struct ibv_device_attr.
            unsafe { attr.write(device_attr(addr)) };
            0
        }
        Err(errno) => errno,
    }
}

/// `verbs_context.query_device_ex`, which the inline `ibv_query_device_ex` calls: the base
/// attributes, and of the extended ones `device_cap_flags_ex` (the kernel's full flags, here
/// the same as the base ones); the rest is 0, as rxe's.
unsafe extern "C" fn query_device_ex(
    context: *mut c_void,
    input: *const u32,
    attr: *mut u8,
    attr_size: usize,
) -> c_int {
    // SAFETY: input is NULL or the caller's struct ibv_query_device_ex_input (comp_mask first).
    if (!input.is_null() && unsafe { *input } != 0) || attr_size < std::mem::size_of::<IbvDeviceAttr>() {
        return libc::EINVAL;
    }
    if attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: attr is the caller's struct of attr_size bytes.
    unsafe { ptr::write_bytes(attr, 0, attr_size) };
    // SAFETY: as above; the base struct comes first.
    let rc = unsafe { ibv_query_device(context, attr as *mut IbvDeviceAttr) };
    if rc == 0 && attr_size >= IBV_DEVICE_ATTR_EX_CAP_FLAGS_EX + 8 {
        // SAFETY: within attr_size, as just checked.
        unsafe {
            ptr::write_unaligned(
                attr.add(IBV_DEVICE_ATTR_EX_CAP_FLAGS_EX) as *mut u64,
                u64::from(DEVICE_CAP_FLAGS),
            )
        };
    }
    rc
}

/// `ibv_query_device_ex`: verbs.h's inline, exported because the map names it; v44's
/// `struct ibv_device_attr_ex`.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_device_ex(
    context: *mut c_void,
    input: *const u32,
    attr: *mut u8,
) -> c_int {
    // SAFETY: the caller's arguments, as the inline takes them.
    unsafe { query_device_ex(context, input, attr, IBV_DEVICE_ATTR_EX_SIZE) }
}

/// `ibv_query_port` (the compat struct the exported symbol fills; the inline zeroes the rest):
/// the one port, active, RoCE (Ethernet link layer), as rxe's on a 1500-byte link: MTU 4096
/// possible, 1024 active (the simulator's UD path MTU), rxe's 1024-entry GID table and one
/// P_Key, `max_msg_sz` the drop-in's 128 KiB (a message is one datagram to the daemon).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(_context: *mut c_void, port_num: u8, attr: *mut u8) -> c_int {
    if attr.is_null() || port_num != 1 {
        return libc::EINVAL;
    }
    let a = IbvPortAttr {
        state: 4,      // IBV_PORT_ACTIVE
        max_mtu: 5,    // IBV_MTU_4096
        active_mtu: 3, // IBV_MTU_1024
        gid_tbl_len: GID_TBL_LEN,
        port_cap_flags: 1 << 16, // IB_PORT_CM_SUP
        max_msg_sz: proto::MAX_MESSAGE,
        pkey_tbl_len: 1,
        max_vl_num: 1,
        active_width: 1, // 1X
        active_speed: 1, // 2.5 Gbps
        phys_state: 5,   // LINK_UP
        link_layer: 2,   // IBV_LINK_LAYER_ETHERNET
        ..IbvPortAttr::default()
    };
    // SAFETY: attr is the caller's ibv_port_attr, at least the bytes of its compat prefix.
    unsafe { ptr::copy_nonoverlapping(ptr::addr_of!(a) as *const u8, attr, IBV_COMPAT_PORT_ATTR_SIZE) };
    0
}

/// `ibv_query_gid`: 0 with the GID (zeros for an empty entry, as libibverbs gives them), or -1
/// with errno (`EINVAL` for another port or an index past the table).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid(
    _context: *mut c_void,
    port_num: u8,
    index: c_int,
    gid: *mut [u8; 16],
) -> c_int {
    if gid.is_null() {
        return fail(libc::EINVAL);
    }
    match gid_at(u32::from(port_num), i64::from(index)) {
        Ok(g) => {
            // SAFETY: gid is the caller's union ibv_gid.
            unsafe { gid.write(g.unwrap_or([0; 16])) };
            0
        }
        Err(errno) => fail(errno),
    }
}

/// `ibv_query_gid_type` (libibverbs' private node, which `ibv_devinfo` imports): RoCE v2 for
/// every GID (rxe's port is RoCE v2 only), RoCE v1 for an empty entry as libibverbs says.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_gid_type(
    _context: *mut c_void,
    port_num: u8,
    index: u32,
    gid_type: *mut u32,
) -> c_int {
    if gid_type.is_null() {
        return fail(libc::EINVAL);
    }
    match gid_at(u32::from(port_num), i64::from(index)) {
        Ok(g) => {
            let t = if g.is_some() {
                IBV_GID_TYPE_SYSFS_ROCE_V2
            } else {
                IBV_GID_TYPE_SYSFS_IB_ROCE_V1
            };
            // SAFETY: gid_type is the caller's enum.
            unsafe { gid_type.write(t) };
            0
        }
        Err(errno) => fail(errno),
    }
}

fn gid_entry(port: u32, index: u32, gid: [u8; 16]) -> IbvGidEntry {
    IbvGidEntry {
        gid,
        gid_index: index,
        port_num: port,
        gid_type: IBV_GID_TYPE_ROCE_V2,
        // The simulated host's interface is none of this machine's.
        ndev_ifindex: 0,
    }
}

/// `_ibv_query_gid_ex` (behind the inline `ibv_query_gid_ex`): 0, `ENODATA` for an empty
/// entry, `EINVAL` for flags, a short entry or an index past the table (the kernel's answers).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_ex(
    _context: *mut c_void,
    port_num: u32,
    gid_index: u32,
    entry: *mut u8,
    flags: u32,
    entry_size: usize,
) -> c_int {
    if entry.is_null() || flags != 0 || entry_size < std::mem::size_of::<IbvGidEntry>() {
        set_errno(libc::EINVAL);
        return libc::EINVAL;
    }
    match gid_at(port_num, i64::from(gid_index)) {
        Ok(Some(g)) => {
            // SAFETY: entry is the caller's struct ibv_gid_entry of entry_size bytes.
            unsafe { (entry as *mut IbvGidEntry).write_unaligned(gid_entry(port_num, gid_index, g)) };
            0
        }
        Ok(None) => {
            set_errno(libc::ENODATA);
            libc::ENODATA
        }
        Err(errno) => {
            set_errno(errno);
            errno
        }
    }
}

/// `_ibv_query_gid_table` (behind the inline `ibv_query_gid_table`): the non-empty entries
/// and their count, or a negative errno (`EINVAL` for flags, short entries or too little room).
#[no_mangle]
pub unsafe extern "C" fn _ibv_query_gid_table(
    _context: *mut c_void,
    entries: *mut u8,
    max_entries: usize,
    flags: u32,
    entry_size: usize,
) -> libc::ssize_t {
    if flags != 0 || entry_size < std::mem::size_of::<IbvGidEntry>() {
        set_errno(libc::EINVAL);
        return -(libc::EINVAL as libc::ssize_t);
    }
    let table = match crate::ffi::host_addr() {
        Ok(addr) => gids(addr),
        Err(errno) => {
            set_errno(errno);
            return -(errno as libc::ssize_t);
        }
    };
    if max_entries < table.len() || entries.is_null() {
        set_errno(libc::EINVAL);
        return -(libc::EINVAL as libc::ssize_t);
    }
    for (i, g) in table.iter().enumerate() {
        // SAFETY: entries holds max_entries entries of entry_size bytes; i < max_entries.
        unsafe {
            let at = entries.add(i * entry_size);
            ptr::write_bytes(at, 0, entry_size);
            (at as *mut IbvGidEntry).write_unaligned(gid_entry(1, i as u32, *g));
        }
    }
    table.len() as libc::ssize_t
}

/// `ibv_query_pkey`: the default P_Key 0xffff at index 0 of port 1; else -1 with `ENOENT`, as
/// libibverbs answers when sysfs has no such entry.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_pkey(
    _context: *mut c_void,
    port_num: u8,
    index: c_int,
    pkey: *mut u16,
) -> c_int {
    if pkey.is_null() {
        return fail(libc::EINVAL);
    }
    if port_num != 1 || index != 0 {
        return fail(libc::ENOENT);
    }
    // SAFETY: pkey is the caller's __be16.
    unsafe { pkey.write(0xffffu16.to_be()) };
    0
}

/// `ibv_get_pkey_index`: the index of `pkey` (network order) in the table, or -1 as
/// libibverbs' search ends (`ENOENT`).
#[no_mangle]
pub unsafe extern "C" fn ibv_get_pkey_index(_context: *mut c_void, port_num: u8, pkey: u16) -> c_int {
    if port_num == 1 && pkey == 0xffffu16.to_be() {
        0
    } else {
        fail(libc::ENOENT)
    }
}

/// The simulated device's sysfs file `file`, as rxe's would read (without the newline).
fn sysfs_file(file: &str) -> Option<String> {
    let addr = crate::ffi::host_addr().ok()?;
    let guid = |g: [u8; 8]| {
        format!(
            "{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}:{:02x}{:02x}",
            g[0], g[1], g[2], g[3], g[4], g[5], g[6], g[7]
        )
    };
    let gid = |i: usize| -> Option<String> {
        let g = if i < GID_TBL_LEN as usize {
            gids(addr).get(i).copied().unwrap_or([0; 16])
        } else {
            return None;
        };
        Some(
            g.chunks(2)
                .map(|c| format!("{:02x}{:02x}", c[0], c[1]))
                .collect::<Vec<_>>()
                .join(":"),
        )
    };
    match file {
        "node_type" => Some("1: CA".into()),
        "node_guid" | "sys_image_guid" => Some(guid(eui64(addr))),
        "ports/1/link_layer" => Some("Ethernet".into()),
        "ports/1/state" => Some("4: ACTIVE".into()),
        "ports/1/pkeys/0" => Some("0xffff".into()),
        _ => {
            if let Some(i) = file.strip_prefix("ports/1/gids/") {
                return gid(i.parse().ok()?);
            }
            let i: usize = file.strip_prefix("ports/1/gid_attrs/types/")?.parse().ok()?;
            (i < gids(addr).len()).then(|| "RoCE v2".into())
        }
    }
}

/// `ibv_read_sysfs_file`: the simulated device's own files (under its `ibdev_path`) are
/// served; one it does not have (like rxe, no `board_id`) is -1 with `ENOENT`, quietly, as a
/// missing file is. Any other directory is refused: it would lead to the host's own devices,
/// which this library stands in for.
#[no_mangle]
pub unsafe extern "C" fn ibv_read_sysfs_file(
    dir: *const c_char,
    file: *const c_char,
    buf: *mut c_char,
    size: usize,
) -> c_int {
    if dir.is_null() || file.is_null() || buf.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: dir and file are the caller's NUL-terminated strings.
    let (dir, file) = unsafe { (CStr::from_ptr(dir).to_bytes(), CStr::from_ptr(file)) };
    if dir.strip_suffix(b"/").unwrap_or(dir) != IBDEV_PATH {
        return unsupported("ibv_read_sysfs_file");
    }
    let Some(text) = file.to_str().ok().and_then(sysfs_file) else {
        return fail(libc::ENOENT);
    };
    // As libibverbs: the text NUL-terminated in place of its newline; one that does not fit is
    // an error rather than cut short.
    if text.len() >= size {
        return fail(libc::EINVAL);
    }
    // SAFETY: buf holds size bytes; text.len() + 1 <= size.
    unsafe {
        ptr::copy_nonoverlapping(text.as_ptr(), buf as *mut u8, text.len());
        *buf.add(text.len()) = 0;
    }
    text.len() as c_int
}
