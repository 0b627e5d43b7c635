//! rdma-core v44's public structs, x86_64 layout, as the unmodified programs read them.
//!
//! Only the fields the programs and the inline functions of the headers touch are named; the
//! rest is padding of the right size. Sizes and offsets are checked at compile time against
//! the figures printed with `offsetof` from the installed v44 headers.

use std::ffi::c_void;

/// `struct sockaddr_storage` inside `struct rdma_addr` (a union of socket addresses).
#[repr(C, align(8))]
#[derive(Clone, Copy)]
pub struct SockaddrStorage(pub [u8; 128]);

/// `struct rdma_addr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaAddr {
    /// `src_addr` (union with `src_sin`, `src_sin6`, `src_storage`).
    pub src: SockaddrStorage,
    /// `dst_addr`.
    pub dst: SockaddrStorage,
    /// `addr.ibaddr` (`struct rdma_ib_addr`: sgid, dgid, pkey).
    pub ibaddr: [u8; 40],
}

/// `struct rdma_route`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaRoute {
    /// `addr`.
    pub addr: RdmaAddr,
    /// `path_rec`.
    pub path_rec: *mut c_void,
    /// `num_paths`.
    pub num_paths: i32,
}

/// `struct rdma_cm_id`.
#[repr(C)]
pub struct RdmaCmId {
    /// `verbs`: the device context, once the id is bound to a device.
    pub verbs: *mut c_void,
    /// `channel`.
    pub channel: *mut RdmaEventChannel,
    /// `context`: the application's pointer.
    pub context: *mut c_void,
    /// `qp`.
    pub qp: *mut IbvQp,
    /// `route`.
    pub route: RdmaRoute,
    /// `ps` (`enum rdma_port_space`).
    pub ps: u32,
    /// `port_num`.
    pub port_num: u8,
    /// `event`: the last event of a synchronous id.
    pub event: *mut RdmaCmEvent,
    /// `send_cq_channel`.
    pub send_cq_channel: *mut c_void,
    /// `send_cq`.
    pub send_cq: *mut c_void,
    /// `recv_cq_channel`.
    pub recv_cq_channel: *mut c_void,
    /// `recv_cq`.
    pub recv_cq: *mut c_void,
    /// `srq`.
    pub srq: *mut c_void,
    /// `pd`.
    pub pd: *mut c_void,
    /// `qp_type` (`enum ibv_qp_type`).
    pub qp_type: u32,
}

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct RdmaEventChannel {
    /// `fd`: readable when an event is queued.
    pub fd: i32,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct RdmaConnParam {
    /// `private_data`.
    pub private_data: *const c_void,
    /// `private_data_len`.
    pub private_data_len: u8,
    /// `responder_resources`.
    pub responder_resources: u8,
    /// `initiator_depth`.
    pub initiator_depth: u8,
    /// `flow_control`.
    pub flow_control: u8,
    /// `retry_count` (ignored by accept).
    pub retry_count: u8,
    /// `rnr_retry_count`.
    pub rnr_retry_count: u8,
    /// `srq`.
    pub srq: u8,
    /// Padding, explicit so events this library builds hold no uninitialised bytes.
    pub pad0: u8,
    /// `qp_num`.
    pub qp_num: u32,
    /// Padding to 8 bytes (explicit for the same reason; `param.ud.ah_attr` overlaps it).
    pub pad1: u32,
}

/// `struct rdma_cm_event`; `param` is the `conn` member of the union, padded to the union's size.
#[repr(C)]
pub struct RdmaCmEvent {
    /// `id`.
    pub id: *mut RdmaCmId,
    /// `listen_id`.
    pub listen_id: *mut RdmaCmId,
    /// `event` (`enum rdma_cm_event_type`).
    pub event: u32,
    /// `status`.
    pub status: i32,
    /// `param.conn`.
    pub conn: RdmaConnParam,
    /// The rest of `param` (the `ud` member is longer).
    pub param_rest: [u8; 32],
}

/// `struct rdma_addrinfo`.
#[repr(C)]
pub struct RdmaAddrinfo {
    /// `ai_flags` (`RAI_PASSIVE`, ...).
    pub ai_flags: i32,
    /// `ai_family`.
    pub ai_family: i32,
    /// `ai_qp_type`.
    pub ai_qp_type: i32,
    /// `ai_port_space`.
    pub ai_port_space: i32,
    /// `ai_src_len`.
    pub ai_src_len: u32,
    /// `ai_dst_len`.
    pub ai_dst_len: u32,
    /// `ai_src_addr`.
    pub ai_src_addr: *mut c_void,
    /// `ai_dst_addr`.
    pub ai_dst_addr: *mut c_void,
    /// `ai_src_canonname`.
    pub ai_src_canonname: *mut c_void,
    /// `ai_dst_canonname`.
    pub ai_dst_canonname: *mut c_void,
    /// `ai_route_len`.
    pub ai_route_len: usize,
    /// `ai_route`.
    pub ai_route: *mut c_void,
    /// `ai_connect_len`.
    pub ai_connect_len: usize,
    /// `ai_connect`.
    pub ai_connect: *mut c_void,
    /// `ai_next`.
    pub ai_next: *mut RdmaAddrinfo,
}

/// `struct ibv_qp_cap`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpCap {
    /// `max_send_wr`.
    pub max_send_wr: u32,
    /// `max_recv_wr`.
    pub max_recv_wr: u32,
    /// `max_send_sge`.
    pub max_send_sge: u32,
    /// `max_recv_sge`.
    pub max_recv_sge: u32,
    /// `max_inline_data`.
    pub max_inline_data: u32,
}

/// `struct ibv_qp_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvQpInitAttr {
    /// `qp_context`.
    pub qp_context: *mut c_void,
    /// `send_cq`.
    pub send_cq: *mut c_void,
    /// `recv_cq`.
    pub recv_cq: *mut c_void,
    /// `srq`.
    pub srq: *mut c_void,
    /// `cap`: asked for, and written back with what was granted.
    pub cap: IbvQpCap,
    /// `qp_type`.
    pub qp_type: u32,
    /// `sq_sig_all`.
    pub sq_sig_all: i32,
}

/// `struct ibv_qp`.
#[repr(C)]
pub struct IbvQp {
    /// `context`.
    pub context: *mut c_void,
    /// `qp_context`.
    pub qp_context: *mut c_void,
    /// `pd`.
    pub pd: *mut c_void,
    /// `send_cq`.
    pub send_cq: *mut c_void,
    /// `recv_cq`.
    pub recv_cq: *mut c_void,
    /// `srq`.
    pub srq: *mut c_void,
    /// `handle`.
    pub handle: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `state` (`enum ibv_qp_state`).
    pub state: u32,
    /// `qp_type`.
    pub qp_type: u32,
    /// `mutex` and `cond` (never used by the programs).
    pub sync: [u64; 11],
    /// `events_completed`.
    pub events_completed: u32,
}

/// `struct verbs_context` with its `struct ibv_context` (the last member) and the device.
///
/// Only the fields the programs reach are set: the device, `abi_compat = -1` (which makes the
/// header inlines use the extended context) and `sz`. Extended ops stay NULL but
/// `query_device_ex` ([`VCTX_QUERY_DEVICE_EX`]), so the inlines answer `EOPNOTSUPP`/`ENOSYS`
/// for them, as they do for a provider without the feature.
#[repr(C)]
pub struct VerbsContext {
    /// `verbs_context` before `sz` (`query_port` at 0 and the extended ops).
    pub ext_ops: [*mut c_void; 39],
    /// `sz`.
    pub sz: usize,
    /// `ibv_context.device`.
    pub device: *mut IbvDevice,
    /// `ibv_context.ops` (the inline data-path functions dispatch through it).
    pub ops: [*mut c_void; 32],
    /// `cmd_fd`.
    pub cmd_fd: i32,
    /// `async_fd`.
    pub async_fd: i32,
    /// `num_comp_vectors`.
    pub num_comp_vectors: i32,
    /// `mutex`.
    pub mutex: [u64; 5],
    /// `abi_compat`.
    pub abi_compat: *mut c_void,
}

/// `struct ibv_device`.
#[repr(C)]
pub struct IbvDevice {
    /// `_ops`.
    pub ops: [*mut c_void; 2],
    /// `node_type` (1 = CA).
    pub node_type: i32,
    /// `transport_type` (0 = IB).
    pub transport_type: i32,
    /// `name`.
    pub name: [u8; 64],
    /// `dev_name`.
    pub dev_name: [u8; 64],
    /// `dev_path`.
    pub dev_path: [u8; 256],
    /// `ibdev_path`.
    pub ibdev_path: [u8; 256],
}

/// Offset of the `struct ibv_context` inside [`VerbsContext`]: what `id->verbs` points at.
pub const IBV_CONTEXT_OFFSET: usize = std::mem::offset_of!(VerbsContext, device);

/// Index of `query_device_ex` in [`VerbsContext::ext_ops`] (offset 216 of `verbs_context`):
/// the inline `ibv_query_device_ex` asks it before falling back to `ibv_query_device`.
pub const VCTX_QUERY_DEVICE_EX: usize = 27;

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<RdmaCmId>() == 416);
    assert!(offset_of!(RdmaCmId, route) == 32);
    assert!(offset_of!(RdmaCmId, route) + offset_of!(RdmaRoute, path_rec) == 328);
    assert!(offset_of!(RdmaCmId, ps) == 344);
    assert!(offset_of!(RdmaCmId, port_num) == 348);
    assert!(offset_of!(RdmaCmId, event) == 352);
    assert!(offset_of!(RdmaCmId, send_cq_channel) == 360);
    assert!(offset_of!(RdmaCmId, pd) == 400);
    assert!(offset_of!(RdmaCmId, qp_type) == 408);
    assert!(size_of::<RdmaRoute>() == 312);
    assert!(size_of::<RdmaCmEvent>() == 80);
    assert!(offset_of!(RdmaCmEvent, conn) == 24);
    assert!(offset_of!(RdmaCmEvent, conn) + offset_of!(RdmaConnParam, qp_num) == 40);
    assert!(size_of::<RdmaConnParam>() == 24);
    assert!(size_of::<RdmaAddrinfo>() == 96);
    assert!(offset_of!(RdmaAddrinfo, ai_connect) == 80);
    assert!(size_of::<IbvQpInitAttr>() == 64);
    assert!(offset_of!(IbvQpInitAttr, cap) == 32);
    assert!(size_of::<IbvQp>() == 160);
    assert!(offset_of!(IbvQp, qp_num) == 52);
    assert!(offset_of!(IbvQp, events_completed) == 152);
    assert!(size_of::<VerbsContext>() == 648);
    assert!(offset_of!(VerbsContext, sz) == 312);
    assert!(IBV_CONTEXT_OFFSET == 320);
    assert!(offset_of!(VerbsContext, cmd_fd) - IBV_CONTEXT_OFFSET == 264);
    assert!(offset_of!(VerbsContext, abi_compat) - IBV_CONTEXT_OFFSET == 320);
    assert!(size_of::<IbvDevice>() == 664);
    assert!(offset_of!(VerbsContext, ext_ops) + VCTX_QUERY_DEVICE_EX * 8 == 216);
};

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvDeviceAttr {
    /// `fw_ver`: NUL-terminated text.
    pub fw_ver: [u8; 64],
    /// `node_guid` (`__be64`: the bytes in network order).
    pub node_guid: [u8; 8],
    /// `sys_image_guid` (`__be64`).
    pub sys_image_guid: [u8; 8],
    /// `max_mr_size`.
    pub max_mr_size: u64,
    /// `page_size_cap`.
    pub page_size_cap: u64,
    /// `vendor_id`.
    pub vendor_id: u32,
    /// `vendor_part_id`.
    pub vendor_part_id: u32,
    /// `hw_ver`.
    pub hw_ver: u32,
    /// `max_qp`.
    pub max_qp: i32,
    /// `max_qp_wr`.
    pub max_qp_wr: i32,
    /// `device_cap_flags`.
    pub device_cap_flags: u32,
    /// `max_sge`.
    pub max_sge: i32,
    /// `max_sge_rd`.
    pub max_sge_rd: i32,
    /// `max_cq`.
    pub max_cq: i32,
    /// `max_cqe`.
    pub max_cqe: i32,
    /// `max_mr`.
    pub max_mr: i32,
    /// `max_pd`.
    pub max_pd: i32,
    /// `max_qp_rd_atom`.
    pub max_qp_rd_atom: i32,
    /// `max_ee_rd_atom`.
    pub max_ee_rd_atom: i32,
    /// `max_res_rd_atom`.
    pub max_res_rd_atom: i32,
    /// `max_qp_init_rd_atom`.
    pub max_qp_init_rd_atom: i32,
    /// `max_ee_init_rd_atom`.
    pub max_ee_init_rd_atom: i32,
    /// `atomic_cap` (`enum ibv_atomic_cap`).
    pub atomic_cap: u32,
    /// `max_ee`.
    pub max_ee: i32,
    /// `max_rdd`.
    pub max_rdd: i32,
    /// `max_mw`.
    pub max_mw: i32,
    /// `max_raw_ipv6_qp`.
    pub max_raw_ipv6_qp: i32,
    /// `max_raw_ethy_qp`.
    pub max_raw_ethy_qp: i32,
    /// `max_mcast_grp`.
    pub max_mcast_grp: i32,
    /// `max_mcast_qp_attach`.
    pub max_mcast_qp_attach: i32,
    /// `max_total_mcast_qp_attach`.
    pub max_total_mcast_qp_attach: i32,
    /// `max_ah`.
    pub max_ah: i32,
    /// `max_fmr`.
    pub max_fmr: i32,
    /// `max_map_per_fmr`.
    pub max_map_per_fmr: i32,
    /// `max_srq`.
    pub max_srq: i32,
    /// `max_srq_wr`.
    pub max_srq_wr: i32,
    /// `max_srq_sge`.
    pub max_srq_sge: i32,
    /// `max_pkeys`.
    pub max_pkeys: u16,
    /// `local_ca_ack_delay`.
    pub local_ca_ack_delay: u8,
    /// `phys_port_cnt`.
    pub phys_port_cnt: u8,
    /// Padding to the struct's 8-byte alignment (explicit, so no byte is left uninitialised).
    pub pad: u32,
}

/// `struct ibv_device_attr_ex`'s size in v44: the `orig_attr` above, then the extended
/// capabilities this library leaves 0 but `device_cap_flags_ex`.
pub const IBV_DEVICE_ATTR_EX_SIZE: usize = 400;
/// Offset of `device_cap_flags_ex` (a `uint64_t`) in `struct ibv_device_attr_ex`.
pub const IBV_DEVICE_ATTR_EX_CAP_FLAGS_EX: usize = 280;

/// `struct ibv_port_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvPortAttr {
    /// `state` (`enum ibv_port_state`).
    pub state: u32,
    /// `max_mtu` (`enum ibv_mtu`).
    pub max_mtu: u32,
    /// `active_mtu`.
    pub active_mtu: u32,
    /// `gid_tbl_len`.
    pub gid_tbl_len: i32,
    /// `port_cap_flags`.
    pub port_cap_flags: u32,
    /// `max_msg_sz`.
    pub max_msg_sz: u32,
    /// `bad_pkey_cntr`.
    pub bad_pkey_cntr: u32,
    /// `qkey_viol_cntr`.
    pub qkey_viol_cntr: u32,
    /// `pkey_tbl_len`.
    pub pkey_tbl_len: u16,
    /// `lid`.
    pub lid: u16,
    /// `sm_lid`.
    pub sm_lid: u16,
    /// `lmc`.
    pub lmc: u8,
    /// `max_vl_num`.
    pub max_vl_num: u8,
    /// `sm_sl`.
    pub sm_sl: u8,
    /// `subnet_timeout`.
    pub subnet_timeout: u8,
    /// `init_type_reply`.
    pub init_type_reply: u8,
    /// `active_width`.
    pub active_width: u8,
    /// `active_speed`.
    pub active_speed: u8,
    /// `phys_state`.
    pub phys_state: u8,
    /// `link_layer`.
    pub link_layer: u8,
    /// `flags`.
    pub flags: u8,
    /// `port_cap_flags2`: past the end of `struct _compat_ibv_port_attr`, the struct the
    /// exported `ibv_query_port` fills.
    pub port_cap_flags2: u16,
    /// Padding to the struct's size (52).
    pub pad: u16,
}

/// The bytes of `struct _compat_ibv_port_attr`: [`IbvPortAttr`] up to `port_cap_flags2`.
pub const IBV_COMPAT_PORT_ATTR_SIZE: usize = 48;

/// `struct ibv_gid_entry`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvGidEntry {
    /// `gid` (`union ibv_gid`: 16 bytes in network order).
    pub gid: [u8; 16],
    /// `gid_index`.
    pub gid_index: u32,
    /// `port_num`.
    pub port_num: u32,
    /// `gid_type` (`enum ibv_gid_type`).
    pub gid_type: u32,
    /// `ndev_ifindex`.
    pub ndev_ifindex: u32,
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<IbvDeviceAttr>() == 232);
    assert!(offset_of!(IbvDeviceAttr, node_guid) == 64);
    assert!(offset_of!(IbvDeviceAttr, max_mr_size) == 80);
    assert!(offset_of!(IbvDeviceAttr, vendor_id) == 96);
    assert!(offset_of!(IbvDeviceAttr, max_qp) == 108);
    assert!(offset_of!(IbvDeviceAttr, device_cap_flags) == 116);
    assert!(offset_of!(IbvDeviceAttr, max_cqe) == 132);
    assert!(offset_of!(IbvDeviceAttr, atomic_cap) == 164);
    assert!(offset_of!(IbvDeviceAttr, max_mw) == 176);
    assert!(offset_of!(IbvDeviceAttr, max_ah) == 200);
    assert!(offset_of!(IbvDeviceAttr, max_srq) == 212);
    assert!(offset_of!(IbvDeviceAttr, max_pkeys) == 224);
    assert!(offset_of!(IbvDeviceAttr, local_ca_ack_delay) == 226);
    assert!(offset_of!(IbvDeviceAttr, phys_port_cnt) == 227);
    assert!(IBV_DEVICE_ATTR_EX_CAP_FLAGS_EX + 8 <= IBV_DEVICE_ATTR_EX_SIZE);
    assert!(size_of::<IbvPortAttr>() == 52);
    assert!(offset_of!(IbvPortAttr, gid_tbl_len) == 12);
    assert!(offset_of!(IbvPortAttr, max_msg_sz) == 20);
    assert!(offset_of!(IbvPortAttr, pkey_tbl_len) == 32);
    assert!(offset_of!(IbvPortAttr, lmc) == 38);
    assert!(offset_of!(IbvPortAttr, max_vl_num) == 39);
    assert!(offset_of!(IbvPortAttr, active_width) == 43);
    assert!(offset_of!(IbvPortAttr, link_layer) == 46);
    assert!(offset_of!(IbvPortAttr, flags) == 47);
    assert!(offset_of!(IbvPortAttr, port_cap_flags2) == IBV_COMPAT_PORT_ATTR_SIZE);
    assert!(size_of::<IbvGidEntry>() == 32);
    assert!(offset_of!(IbvGidEntry, gid_index) == 16);
    assert!(offset_of!(IbvGidEntry, gid_type) == 24);
    assert!(offset_of!(IbvGidEntry, ndev_ifindex) == 28);
};

/// `struct ibv_pd`.
#[repr(C)]
pub struct IbvPd {
    /// `context`.
    pub context: *mut c_void,
    /// `handle`.
    pub handle: u32,
}

/// `struct ibv_srq_attr`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug, PartialEq, Eq)]
pub struct IbvSrqAttr {
    /// `max_wr`.
    pub max_wr: u32,
    /// `max_sge`.
    pub max_sge: u32,
    /// `srq_limit`.
    pub srq_limit: u32,
}

/// `struct ibv_srq_init_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSrqInitAttr {
    /// `srq_context`.
    pub srq_context: *mut c_void,
    /// `attr`.
    pub attr: IbvSrqAttr,
}

/// `struct ibv_srq`: `ibv_post_srq_recv` (an inline function in the headers) reads `context`
/// to reach `ops.post_srq_recv`.
#[repr(C)]
pub struct IbvSrq {
    /// `context`.
    pub context: *mut c_void,
    /// `srq_context`.
    pub srq_context: *mut c_void,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `handle`.
    pub handle: u32,
    /// `mutex` (`pthread_mutex_t`, 40 bytes) and `cond` (`pthread_cond_t`, 48 bytes), which
    /// only libibverbs' async-event bookkeeping uses.
    pub sync: [u64; 11],
    /// `events_completed`.
    pub events_completed: u32,
}

const _: () = {
    assert!(std::mem::size_of::<IbvSrqAttr>() == 12);
    assert!(std::mem::size_of::<IbvSrqInitAttr>() == 24);
    assert!(std::mem::offset_of!(IbvSrq, sync) == 32);
    assert!(std::mem::offset_of!(IbvSrq, events_completed) == 120);
    assert!(std::mem::size_of::<IbvSrq>() == 128);
};

/// `struct ibv_mr`.
#[repr(C)]
pub struct IbvMr {
    /// `context`.
    pub context: *mut c_void,
    /// `pd`.
    pub pd: *mut IbvPd,
    /// `addr`.
    pub addr: *mut c_void,
    /// `length`.
    pub length: usize,
    /// `handle`.
    pub handle: u32,
    /// `lkey`.
    pub lkey: u32,
    /// `rkey`.
    pub rkey: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct IbvCompChannel {
    /// `context`.
    pub context: *mut c_void,
    /// `fd`: readable when a completion event is queued.
    pub fd: i32,
    /// `refcnt`.
    pub refcnt: i32,
}

/// `struct ibv_cq`.
#[repr(C)]
pub struct IbvCq {
    /// `context`.
    pub context: *mut c_void,
    /// `channel`.
    pub channel: *mut IbvCompChannel,
    /// `cq_context`.
    pub cq_context: *mut c_void,
    /// `handle`.
    pub handle: u32,
    /// `cqe`.
    pub cqe: i32,
    /// `mutex` and `cond`.
    pub sync: [u64; 11],
    /// `comp_events_completed`.
    pub comp_events_completed: u32,
    /// `async_events_completed`.
    pub async_events_completed: u32,
}

/// `struct ibv_sge`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct IbvSge {
    /// `addr`.
    pub addr: u64,
    /// `length`.
    pub length: u32,
    /// `lkey`.
    pub lkey: u32,
}

/// `struct ibv_send_wr`, up to the fields a SEND uses (the rest is never read).
#[repr(C)]
pub struct IbvSendWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `next`.
    pub next: *mut IbvSendWr,
    /// `sg_list`.
    pub sg_list: *mut IbvSge,
    /// `num_sge`.
    pub num_sge: i32,
    /// `opcode` (`enum ibv_wr_opcode`).
    pub opcode: u32,
    /// `send_flags`.
    pub send_flags: u32,
    /// `imm_data`.
    pub imm_data: u32,
    /// `wr.rdma.remote_addr`.
    pub remote_addr: u64,
    /// `wr.rdma.rkey` (`wr.ud.remote_qpn` for UD).
    pub rkey: u32,
    /// `wr.ud.remote_qkey`.
    pub remote_qkey: u32,
}

/// `struct ibv_recv_wr`.
#[repr(C)]
pub struct IbvRecvWr {
    /// `wr_id`.
    pub wr_id: u64,
    /// `next`.
    pub next: *mut IbvRecvWr,
    /// `sg_list`.
    pub sg_list: *mut IbvSge,
    /// `num_sge`.
    pub num_sge: i32,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct IbvWc {
    /// `wr_id`.
    pub wr_id: u64,
    /// `status`.
    pub status: u32,
    /// `opcode`.
    pub opcode: u32,
    /// `vendor_err`.
    pub vendor_err: u32,
    /// `byte_len`.
    pub byte_len: u32,
    /// `imm_data`.
    pub imm_data: u32,
    /// `qp_num`.
    pub qp_num: u32,
    /// `src_qp`.
    pub src_qp: u32,
    /// `wc_flags`.
    pub wc_flags: u32,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `slid`.
    pub slid: u16,
    /// `sl`.
    pub sl: u8,
    /// `dlid_path_bits`.
    pub dlid_path_bits: u8,
}

/// Index of `ops.poll_cq` in [`VerbsContext::ops`] (`ibv_context` offset 0x60; the ops
/// start at offset 8).
pub const OPS_POLL_CQ: usize = 11;
/// Index of `ops.req_notify_cq` (context offset 0x68).
pub const OPS_REQ_NOTIFY_CQ: usize = 12;
/// Index of `ops.post_srq_recv` (context offset 0xa8).
pub const OPS_POST_SRQ_RECV: usize = 20;
/// Index of `ops.post_send` (context offset 0xd0).
pub const OPS_POST_SEND: usize = 25;
/// Index of `ops.post_recv` (context offset 0xd8).
pub const OPS_POST_RECV: usize = 26;

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<IbvPd>() == 16);
    assert!(size_of::<IbvMr>() == 48);
    assert!(offset_of!(IbvMr, lkey) == 36);
    assert!(size_of::<IbvCompChannel>() == 16);
    assert!(size_of::<IbvCq>() == 128);
    assert!(offset_of!(IbvCq, comp_events_completed) == 120);
    assert!(size_of::<IbvSge>() == 16);
    assert!(offset_of!(IbvSendWr, send_flags) == 32);
    assert!(offset_of!(IbvSendWr, remote_addr) == 40 && offset_of!(IbvSendWr, rkey) == 48);
    assert!(size_of::<IbvRecvWr>() == 32);
    assert!(size_of::<IbvWc>() == 48);
    let ops = offset_of!(VerbsContext, ops) - IBV_CONTEXT_OFFSET;
    assert!(ops + OPS_POLL_CQ * 8 == 0x60 && ops + OPS_REQ_NOTIFY_CQ * 8 == 0x68);
    assert!(ops + OPS_POST_SRQ_RECV * 8 == 0xa8);
    assert!(ops + OPS_POST_SEND * 8 == 0xd0 && ops + OPS_POST_RECV * 8 == 0xd8);
};

/// `struct ibv_ah_attr` with its `struct ibv_global_route` (8-aligned, as its `union ibv_gid`
/// is).
#[repr(C, align(8))]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IbvAhAttr {
    /// `grh.dgid`.
    pub dgid: [u8; 16],
    /// `grh.flow_label`.
    pub flow_label: u32,
    /// `grh.sgid_index`.
    pub sgid_index: u8,
    /// `grh.hop_limit`.
    pub hop_limit: u8,
    /// `grh.traffic_class`.
    pub traffic_class: u8,
    pad0: u8,
    /// `dlid`.
    pub dlid: u16,
    /// `sl`.
    pub sl: u8,
    /// `src_path_bits`.
    pub src_path_bits: u8,
    /// `static_rate`.
    pub static_rate: u8,
    /// `is_global`.
    pub is_global: u8,
    /// `port_num`.
    pub port_num: u8,
    pad1: u8,
}

impl IbvAhAttr {
    /// The struct's bytes, as C lays them out.
    pub fn to_bytes(&self) -> [u8; 32] {
        let mut b = [0u8; 32];
        b[..16].copy_from_slice(&self.dgid);
        b[16..20].copy_from_slice(&self.flow_label.to_ne_bytes());
        b[20] = self.sgid_index;
        b[21] = self.hop_limit;
        b[22] = self.traffic_class;
        b[24..26].copy_from_slice(&self.dlid.to_ne_bytes());
        b[26] = self.sl;
        b[27] = self.src_path_bits;
        b[28] = self.static_rate;
        b[29] = self.is_global;
        b[30] = self.port_num;
        b
    }

    /// The struct C laid out in `b`.
    pub fn from_bytes(b: &[u8; 32]) -> Self {
        IbvAhAttr {
            dgid: b[..16].try_into().expect("16 bytes"),
            flow_label: u32::from_ne_bytes([b[16], b[17], b[18], b[19]]),
            sgid_index: b[20],
            hop_limit: b[21],
            traffic_class: b[22],
            pad0: 0,
            dlid: u16::from_ne_bytes([b[24], b[25]]),
            sl: b[26],
            src_path_bits: b[27],
            static_rate: b[28],
            is_global: b[29],
            port_num: b[30],
            pad1: 0,
        }
    }
}

impl From<cm_core::AhAttr> for IbvAhAttr {
    fn from(a: cm_core::AhAttr) -> Self {
        IbvAhAttr {
            dgid: a.dgid,
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            pad0: 0,
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            is_global: a.is_global as u8,
            port_num: a.port_num,
            pad1: 0,
        }
    }
}

impl From<IbvAhAttr> for cm_core::AhAttr {
    fn from(a: IbvAhAttr) -> Self {
        cm_core::AhAttr {
            dgid: a.dgid,
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
            dlid: a.dlid,
            sl: a.sl,
            src_path_bits: a.src_path_bits,
            static_rate: a.static_rate,
            is_global: a.is_global != 0,
            port_num: a.port_num,
        }
    }
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvAhAttr, sgid_index) == 20 && offset_of!(IbvAhAttr, dlid) == 24);
    assert!(offset_of!(IbvAhAttr, is_global) == 29 && offset_of!(IbvAhAttr, port_num) == 30);
};

/// `struct ibv_qp_attr`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct IbvQpAttr {
    /// `qp_state`.
    pub qp_state: u32,
    /// `cur_qp_state`.
    pub cur_qp_state: u32,
    /// `path_mtu`.
    pub path_mtu: u32,
    /// `path_mig_state`.
    pub path_mig_state: u32,
    /// `qkey`.
    pub qkey: u32,
    /// `rq_psn`.
    pub rq_psn: u32,
    /// `sq_psn`.
    pub sq_psn: u32,
    /// `dest_qp_num`.
    pub dest_qp_num: u32,
    /// `qp_access_flags`.
    pub qp_access_flags: u32,
    /// `cap`.
    pub cap: IbvQpCap,
    /// `ah_attr`.
    pub ah_attr: IbvAhAttr,
    /// `alt_ah_attr`.
    pub alt_ah_attr: IbvAhAttr,
    /// `pkey_index`.
    pub pkey_index: u16,
    /// `alt_pkey_index`.
    pub alt_pkey_index: u16,
    /// `en_sqd_async_notify`.
    pub en_sqd_async_notify: u8,
    /// `sq_draining`.
    pub sq_draining: u8,
    /// `max_rd_atomic`.
    pub max_rd_atomic: u8,
    /// `max_dest_rd_atomic`.
    pub max_dest_rd_atomic: u8,
    /// `min_rnr_timer`.
    pub min_rnr_timer: u8,
    /// `port_num`.
    pub port_num: u8,
    /// `timeout`.
    pub timeout: u8,
    /// `retry_cnt`.
    pub retry_cnt: u8,
    /// `rnr_retry`.
    pub rnr_retry: u8,
    /// `alt_port_num`.
    pub alt_port_num: u8,
    /// `alt_timeout`.
    pub alt_timeout: u8,
    /// `rate_limit`.
    pub rate_limit: u32,
}

impl IbvQpAttr {
    /// The attributes as the simulator takes them; `None` for a state past `IBV_QPS_ERR`.
    pub fn to_verbs(&self) -> Option<cm_core::VerbsQpAttr> {
        use crate::request as av;
        Some(cm_core::VerbsQpAttr {
            qp_state: cm_core::VerbsQpState::from_raw(self.qp_state)?,
            cur_qp_state: cm_core::VerbsQpState::from_raw(self.cur_qp_state)?,
            path_mtu: u8::try_from(self.path_mtu).unwrap_or(u8::MAX),
            path_mig_state: self.path_mig_state,
            qkey: self.qkey,
            rq_psn: self.rq_psn,
            sq_psn: self.sq_psn,
            dest_qp_num: self.dest_qp_num,
            qp_access_flags: self.qp_access_flags,
            ah_attr: av::address_vector(&self.ah_attr.into()),
            alt_ah_attr: av::address_vector(&self.alt_ah_attr.into()),
            pkey_index: self.pkey_index,
            alt_pkey_index: self.alt_pkey_index,
            en_sqd_async_notify: self.en_sqd_async_notify,
            max_rd_atomic: self.max_rd_atomic,
            max_dest_rd_atomic: self.max_dest_rd_atomic,
            min_rnr_timer: self.min_rnr_timer,
            port_num: self.port_num,
            timeout: self.timeout,
            retry_cnt: self.retry_cnt,
            rnr_retry: self.rnr_retry,
            alt_port_num: self.alt_port_num,
            alt_timeout: self.alt_timeout,
            rate_limit: self.rate_limit,
        })
    }

    /// The struct as `ibv_query_qp` fills it from the simulator's attributes and `cap`.
    pub fn from_verbs(a: &cm_core::VerbsQpAttr, cap: IbvQpCap) -> Self {
        use crate::request as av;
        IbvQpAttr {
            qp_state: a.qp_state.raw(),
            cur_qp_state: a.cur_qp_state.raw(),
            path_mtu: u32::from(a.path_mtu),
            path_mig_state: a.path_mig_state,
            qkey: a.qkey,
            rq_psn: a.rq_psn,
            sq_psn: a.sq_psn,
            dest_qp_num: a.dest_qp_num,
            qp_access_flags: a.qp_access_flags,
            cap,
            ah_attr: av::ah_attr_of(&a.ah_attr).into(),
            alt_ah_attr: av::ah_attr_of(&a.alt_ah_attr).into(),
            pkey_index: a.pkey_index,
            alt_pkey_index: a.alt_pkey_index,
            en_sqd_async_notify: a.en_sqd_async_notify,
            sq_draining: 0,
            max_rd_atomic: a.max_rd_atomic,
            max_dest_rd_atomic: a.max_dest_rd_atomic,
            min_rnr_timer: a.min_rnr_timer,
            port_num: a.port_num,
            timeout: a.timeout,
            retry_cnt: a.retry_cnt,
            rnr_retry: a.rnr_retry,
            alt_port_num: a.alt_port_num,
            alt_timeout: a.alt_timeout,
            rate_limit: a.rate_limit,
        }
    }
}

const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<IbvQpAttr>() == 144);
    assert!(offset_of!(IbvQpAttr, cap) == 36);
    assert!(offset_of!(IbvQpAttr, ah_attr) == 56);
    assert!(offset_of!(IbvQpAttr, alt_ah_attr) == 88);
    assert!(offset_of!(IbvQpAttr, pkey_index) == 120);
    assert!(offset_of!(IbvQpAttr, en_sqd_async_notify) == 124);
    assert!(offset_of!(IbvQpAttr, max_rd_atomic) == 126);
    assert!(offset_of!(IbvQpAttr, port_num) == 129);
    assert!(offset_of!(IbvQpAttr, timeout) == 130);
    assert!(offset_of!(IbvQpAttr, rate_limit) == 136);
};
