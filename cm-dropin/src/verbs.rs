//! The verbs the programs use: PDs and MRs (local bookkeeping), CQs, and the data path
//! reached through `ibv_context.ops` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` are
//! inline functions in the headers and jump through those pointers).
//!
//! Sends and receives are copied through this library in the calling process: a send gathers
//! its SGEs here and ships the bytes to the daemon; a receive's bytes come back with its
//! completion and are scattered into the buffers posted for it. RDMA READ and WRITE are the
//! simulator's, over the registered regions the entries name. QPs are `rdma_create_qp`'s
//! (an id's, moved by librdmacm) or `ibv_create_qp`'s (the application's, moved with
//! `ibv_modify_qp`).
#![allow(clippy::missing_safety_doc)] // the safety contract of each function is libibverbs' C one

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_char, c_int, c_void, CStr};
use std::ptr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::abi::*;
use crate::ffi::{fail, lock, registry, rpc, unsupported};
use crate::proto::{self, Dec};
use crate::request::{Opening, Request};
use crate::sock::{self, SeqConn};
use cm_core::Invocation;

/// `IBV_WC_GRH`: the receive buffer starts with the 40-byte GRH.
const IBV_WC_GRH: u32 = 1;
const IBV_WR_RDMA_WRITE: u32 = 0;
const IBV_WR_RDMA_WRITE_WITH_IMM: u32 = 1;
const IBV_QPT_UD: u32 = 4;
const IBV_WR_SEND: u32 = 2;
const IBV_WR_RDMA_READ: u32 = 4;
const IBV_WR_SEND_WITH_IMM: u32 = 3;
const IBV_WR_ATOMIC_CMP_AND_SWP: u32 = 5;
const IBV_WR_ATOMIC_FETCH_AND_ADD: u32 = 6;
const IBV_SEND_SIGNALED: u32 = 2;
const IBV_WC_RECV: u32 = 128;
const IBV_WC_SUCCESS: u32 = 0;
const IBV_WC_LOC_LEN_ERR: u32 = 1;

/// The library's part of a QP; `public` is what the application sees.
#[repr(C)]
pub struct QpPriv {
    /// What the application sees.
    pub public: IbvQp,
    /// The daemon's token of the QP's id.
    pub token: u64,
    /// The capabilities granted (what `ibv_query_qp` reports).
    pub cap: IbvQpCap,
    /// `sq_sig_all` as created.
    pub sq_sig_all: i32,
    /// Made by `ibv_create_qp` (no id owns it; `token` is its own): the application moves
    /// it with `ibv_modify_qp`.
    pub verbs: bool,
}

/// `IBV_QPT_RC`.
const IBV_QPT_RC: u32 = 2;

/// `ibv_create_qp`: an RC or UD QP no id owns, in RESET, on `pd`'s device, reporting into CQs of
/// this library. Its number (`qp_num`) is what the peer's `ibv_modify_qp` to RTR names.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_qp(pd: *mut IbvPd, attr: *mut IbvQpInitAttr) -> *mut IbvQp {
    if pd.is_null() || attr.is_null() {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: attr is the caller's struct ibv_qp_init_attr; its CQs are NULL or this
    // library's; pd came from ibv_alloc_pd.
    let (a, context, send_cq, recv_cq) = unsafe {
        let a = *attr;
        (a, (*pd).context, cq_token(a.send_cq), cq_token(a.recv_cq))
    };
    // SAFETY: a non-NULL SRQ handed to this library came from ibv_create_srq.
    let srq = unsafe { srq_token(a.srq) };
    if a.qp_type != IBV_QPT_RC && a.qp_type != IBV_QPT_UD {
        crate::ffi::refuse(
            "ibv_create_qp of a QP type other than IBV_QPT_RC and IBV_QPT_UD",
            libc::EOPNOTSUPP,
        );
        return ptr::null_mut();
    }
    let mut caps = cm_core::QpCaps::new();
    caps.max_send_wr = a.cap.max_send_wr;
    caps.max_recv_wr = a.cap.max_recv_wr;
    caps.max_send_sge = a.cap.max_send_sge;
    caps.max_recv_sge = a.cap.max_recv_sge;
    caps.max_inline_data = a.cap.max_inline_data;
    let create = Request::VerbsCreateQp {
        caps,
        send_cq,
        recv_cq,
        sq_sig_all: a.sq_sig_all != 0,
        qp_type: a.qp_type,
        srq,
    };
    let buf = match rpc(&create) {
        Ok(b) => b,
        Err(errno) => {
            fail(errno);
            return ptr::null_mut();
        }
    };
    let mut d = Dec::new(&buf);
    let Ok((got, qp_num)) = d.caps().and_then(|caps| Ok((caps, d.u32()?))) else {
        fail(libc::EPROTO);
        return ptr::null_mut();
    };
    let cap = IbvQpCap {
        max_send_wr: got.max_send_wr,
        max_recv_wr: got.max_recv_wr,
        max_send_sge: got.max_send_sge,
        max_recv_sge: got.max_recv_sge,
        max_inline_data: got.max_inline_data,
    };
    // SAFETY: as above: the caps are written back, as libibverbs does.
    unsafe { (*attr).cap = cap };
    let token = u64::from(qp_num);
    {
        let mut reg = lock(&registry().0);
        reg.recvs.insert(token, Default::default());
        reg.qp_nums.insert(token, qp_num);
    }
    note_srq_qp(token, srq);
    let qp = Box::new(QpPriv {
        public: IbvQp {
            context,
            qp_context: a.qp_context,
            pd: pd as *mut c_void,
            send_cq: a.send_cq,
            recv_cq: a.recv_cq,
            srq: a.srq,
            handle: qp_num,
            qp_num,
            state: 0,
            qp_type: a.qp_type,
            sync: [0; 11],
            events_completed: 0,
        },
        token,
        cap,
        sq_sig_all: a.sq_sig_all,
        verbs: true,
    });
    Box::into_raw(qp) as *mut IbvQp
}

/// `ibv_modify_qp` of a QP `ibv_create_qp` made, by the kernel's rules for each transition.
/// A QP `rdma_create_qp` made is librdmacm's to move: a modify that keeps its state (RTS →
/// RTS with `IBV_QP_MIN_RNR_TIMER`, say) is checked by the same rules and taken; one that
/// would move it is refused (`ENOSYS`, a line on stderr).
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_qp(qp: *mut IbvQp, attr: *mut IbvQpAttr, attr_mask: c_int) -> c_int {
    if qp.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: qp came from this library, so is QpPriv; attr is the caller's.
    let (q, a) = unsafe { (&mut *(qp as *mut QpPriv), *attr) };
    let Some(v) = a.to_verbs() else {
        return libc::EINVAL;
    };
    let modify = Request::ModifyQp {
        qp: q.token,
        mask: attr_mask as u32,
        attr: v,
    };
    match rpc(&modify) {
        Ok(_) => {
            if attr_mask as u32 & cm_core::QpAttrMask::STATE.bits() != 0 {
                q.public.state = a.qp_state;
            }
            0
        }
        Err(libc::ENOSYS) if !q.verbs => crate::ffi::refuse(
            "ibv_modify_qp moving a QP rdma_create_qp made to another state",
            libc::ENOSYS,
        ),
        Err(errno) => {
            // libibverbs returns the errno its write(2) to the kernel set, and leaves it
            // set: programs print it (qperf's "failed to modify QP to RTR: Invalid argument").
            crate::ffi::set_errno(errno);
            errno
        }
    }
}

/// The library's part of a completion channel.
#[repr(C)]
pub struct CompChannelPriv {
    public: IbvCompChannel,
    token: u64,
    /// Serialises the socket's attachment: the channels librdmacm makes for `rdma_create_qp`
    /// get their socket (an fd) only when first armed or read, so a thousand QPs do not cost
    /// two thousand fds up front.
    attach: Mutex<()>,
}

/// CQ token → `*mut CqPriv`, to give `ibv_get_cq_event` the application's pointer back.
static CQS: Mutex<Option<HashMap<u64, usize>>> = Mutex::new(None);

/// The library's part of a CQ.
#[repr(C)]
struct CqPriv {
    public: IbvCq,
    token: u64,
}

/// A posted receive: where its bytes go.
pub struct PostedRecv {
    wr_id: u64,
    sges: Vec<(u64, u32)>,
}

static NEXT_KEY: AtomicU32 = AtomicU32::new(1);

/// Fills the data-path entries of `ibv_context.ops`.
pub(crate) fn fill_ops(ops: &mut [*mut c_void; 32]) {
    ops[OPS_POLL_CQ] = poll_cq as *mut c_void;
    ops[OPS_REQ_NOTIFY_CQ] = req_notify_cq as *mut c_void;
    ops[OPS_POST_SRQ_RECV] = post_srq_recv as *mut c_void;
    ops[OPS_POST_SEND] = post_send as *mut c_void;
    ops[OPS_POST_RECV] = post_recv as *mut c_void;
}

/// The daemon's token of a CQ of this library (0 for NULL).
pub(crate) unsafe fn cq_token(cq: *mut c_void) -> u64 {
    if cq.is_null() {
        0
    } else {
        // SAFETY: non-NULL CQs handed to this library came from ibv_create_cq, so are CqPriv.
        unsafe { (*(cq as *mut CqPriv)).token }
    }
}

/// `ibv_alloc_pd`: protection domains are bookkeeping only (the copy happens in-process).
#[no_mangle]
pub unsafe extern "C" fn ibv_alloc_pd(context: *mut c_void) -> *mut IbvPd {
    Box::into_raw(Box::new(IbvPd {
        context,
        handle: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
    }))
}

/// `ibv_dealloc_pd`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dealloc_pd(pd: *mut IbvPd) -> c_int {
    if pd.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: pd came from ibv_alloc_pd and is given back once.
    drop(unsafe { Box::from_raw(pd) });
    0
}

/// `ibv_reg_mr`: hands out keys; buffers are read and written by this library in place.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    access: c_int,
) -> *mut IbvMr {
    if pd.is_null() {
        crate::ffi::set_errno(libc::EINVAL);
        return ptr::null_mut();
    }
    // The daemon hands out the key: an RDMA READ/WRITE from a peer names the region by it.
    let reg = Request::RegMr {
        addr: addr as u64,
        len: length as u64,
        access: access as u32,
    };
    let key = match rpc(&reg).and_then(|b| Dec::new(&b).u32().map_err(|_| libc::EPROTO)) {
        Ok(k) => k,
        Err(errno) => {
            fail(errno);
            return ptr::null_mut();
        }
    };
    // SAFETY: pd came from ibv_alloc_pd.
    let context = unsafe { (*pd).context };
    Box::into_raw(Box::new(IbvMr {
        context,
        pd,
        addr,
        length,
        handle: key,
        lkey: key,
        rkey: key,
    }))
}

/// `ibv_reg_mr_iova2`, which rdma-core's headers call for `ibv_reg_mr` whenever the access
/// flags are not a compile-time constant: a region addressed by its own virtual address
/// (`iova == addr`) is `ibv_reg_mr`'s. Another iova, by which a peer would address the region,
/// is not modelled: refused with `EINVAL` and a line on stderr.
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova2(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: u32,
) -> *mut IbvMr {
    // SAFETY: the caller's arguments, passed on.
    unsafe { reg_mr_at("ibv_reg_mr_iova2", pd, addr, length, iova, access as c_int) }
}

/// `ibv_reg_mr_iova`: as [`ibv_reg_mr_iova2`].
#[no_mangle]
pub unsafe extern "C" fn ibv_reg_mr_iova(
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    // SAFETY: the caller's arguments, passed on.
    unsafe { reg_mr_at("ibv_reg_mr_iova", pd, addr, length, iova, access) }
}

/// `ibv_reg_mr` of a region whose iova must be its address; `call` names the refusal.
unsafe fn reg_mr_at(
    call: &str,
    pd: *mut IbvPd,
    addr: *mut c_void,
    length: usize,
    iova: u64,
    access: c_int,
) -> *mut IbvMr {
    if iova != addr as u64 {
        eprintln!(
            "cmsim: {call} with an iova ({iova:#x}) other than the region's address ({:#x}) is not supported: EINVAL",
            addr as u64
        );
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: the caller's arguments, as ibv_reg_mr takes them.
    unsafe { ibv_reg_mr(pd, addr, length, access) }
}

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: mr came from ibv_reg_mr and is given back once.
    let mr = unsafe { Box::from_raw(mr) };
    rpc(&Request::DeregMr { key: mr.lkey }).err().unwrap_or(0)
}

/// `ibv_create_cq`: `EINVAL` for no entries or more than the device's `max_cqe`, as rxe's
/// `rxe_cq_chk_attr` answers.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut c_void,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    _comp_vector: c_int,
) -> *mut IbvCq {
    if cqe <= 0 || cqe as u32 > proto::MAX_CQE {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    let channel_token = if channel.is_null() {
        0
    } else {
        // SAFETY: channel came from ibv_create_comp_channel.
        unsafe { (*(channel as *mut CompChannelPriv)).token }
    };
    let create = Request::CreateCq {
        cqe: cqe as u32,
        channel: channel_token,
    };
    let token = match rpc(&create).and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO)) {
        Ok(t) => t,
        Err(errno) => {
            fail(errno);
            return ptr::null_mut();
        }
    };
    let cq = Box::new(CqPriv {
        public: IbvCq {
            context,
            channel,
            cq_context,
            handle: token as u32,
            cqe,
            sync: [0; 11],
            comp_events_completed: 0,
            async_events_completed: 0,
        },
        token,
    });
    let cq = Box::into_raw(cq);
    lock(&CQS)
        .get_or_insert_with(HashMap::new)
        .insert(token, cq as usize);
    cq as *mut IbvCq
}

/// `ibv_destroy_cq`: refused (`EBUSY`) while a QP uses the CQ.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_cq(cq: *mut IbvCq) -> c_int {
    // SAFETY: cq came from ibv_create_cq.
    let token = unsafe { cq_token(cq as *mut c_void) };
    if token == 0 {
        return libc::EINVAL;
    }
    match rpc(&Request::DestroyCq { cq: token }) {
        Ok(_) => {
            if let Some(m) = lock(&CQS).as_mut() {
                m.remove(&token);
            }
            // SAFETY: cq is this library's CqPriv, given back once.
            drop(unsafe { Box::from_raw(cq as *mut CqPriv) });
            0
        }
        Err(errno) => errno,
    }
}

unsafe fn qp_token(qp: *mut IbvQp) -> u64 {
    // SAFETY: QPs reaching the ops came from rdma_create_qp, so are QpPriv.
    unsafe { (*(qp as *mut QpPriv)).token }
}

unsafe fn sges(list: *const IbvSge, n: i32) -> Vec<IbvSge> {
    if list.is_null() || n <= 0 {
        return Vec::new();
    }
    // SAFETY: the work request's sg_list holds num_sge entries.
    unsafe { std::slice::from_raw_parts(list, n as usize) }.to_vec()
}

/// `ops.post_send`: SEND and SEND_WITH_IMM, RDMA READ, WRITE and WRITE_WITH_IMM, the two
/// atomics; a SEND's
/// bytes are gathered now, so the buffers are
/// free again as soon as this returns (stronger than verbs promises).
unsafe extern "C" fn post_send(qp: *mut IbvQp, wr: *mut IbvSendWr, bad_wr: *mut *mut IbvSendWr) -> c_int {
    // SAFETY: qp came from rdma_create_qp.
    let token = unsafe { qp_token(qp) };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: cur is the caller's work request list.
        let w = unsafe { &*cur };
        let signaled = w.send_flags & IBV_SEND_SIGNALED != 0;
        // SAFETY: sg_list holds num_sge entries.
        let list = unsafe { sges(w.sg_list, w.num_sge) };
        let total: u64 = list.iter().map(|s| u64::from(s.length)).sum();
        let errno = match w.opcode {
            // As rxe's post_send: a message past the port's max_msg_sz is refused, not cut
            // (one message is one datagram to the daemon, whose size this bounds).
            _ if total > u64::from(proto::MAX_MESSAGE) => {
                eprintln!(
                    "cmsim: ibv_post_send: {total} bytes exceed the simulated port's max_msg_sz ({}): EINVAL",
                    proto::MAX_MESSAGE
                );
                libc::EINVAL
            }
            // SAFETY: qp came from rdma_create_qp.
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM if unsafe { (*qp).qp_type } == IBV_QPT_UD => {
                let mut data = Vec::new();
                for s in &list {
                    // SAFETY: each SGE names memory of the caller's, readable for its length.
                    let bytes = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                    data.extend_from_slice(bytes);
                }
                let imm = w.opcode == IBV_WR_SEND_WITH_IMM;
                // wr.ud: the address handle, remote_qpn, remote_qkey.
                let ah = w.remote_addr as *const IbvAh;
                if ah.is_null() {
                    libc::EINVAL
                } else {
                    let dest = cm_core::UdParam {
                        qp_num: w.rkey,
                        qkey: w.remote_qkey,
                        // SAFETY: the handle came from ibv_create_ah(_from_wc).
                        ah_attr: unsafe { (*ah).attr },
                    };
                    let send = Request::PostSendUd {
                        id: token,
                        wr_id: w.wr_id,
                        signaled,
                        dest,
                        imm: imm.then_some(w.imm_data),
                        data,
                    };
                    rpc(&send).err().unwrap_or(0)
                }
            }
            // The immediate rides on a work request over registered memory, which the
            // simulator gathers itself.
            IBV_WR_SEND_WITH_IMM => {
                let send = Request::PostSendImm {
                    id: token,
                    wr_id: w.wr_id,
                    signaled,
                    imm: w.imm_data,
                    sges: list.iter().map(|s| (s.addr, s.length, s.lkey)).collect(),
                };
                rpc(&send).err().unwrap_or(0)
            }
            IBV_WR_SEND => {
                let mut data = Vec::new();
                for s in &list {
                    // SAFETY: each SGE names memory of the caller's, readable for its length.
                    let bytes = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                    data.extend_from_slice(bytes);
                }
                let send = Request::PostSend {
                    id: token,
                    wr_id: w.wr_id,
                    signaled,
                    data,
                };
                rpc(&send).err().unwrap_or(0)
            }
            // The simulator carries these out over the registered regions the entries name,
            // reaching this process's memory as a NIC would, in the QP's order and virtual time.
            IBV_WR_RDMA_WRITE | IBV_WR_RDMA_WRITE_WITH_IMM | IBV_WR_RDMA_READ => {
                let rdma = Request::Rdma {
                    write: w.opcode != IBV_WR_RDMA_READ,
                    imm: (w.opcode == IBV_WR_RDMA_WRITE_WITH_IMM).then_some(w.imm_data),
                    id: token,
                    wr_id: w.wr_id,
                    signaled,
                    remote_addr: w.remote_addr,
                    rkey: w.rkey,
                    sges: list.iter().map(|s| (s.addr, s.length, s.lkey)).collect(),
                };
                rpc(&rdma).err().unwrap_or(0)
            }
            // verbs takes one 8-byte entry for the old value; the simulator checks it.
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD if list.len() == 1 => {
                // SAFETY: cur is the caller's whole struct ibv_send_wr, whose wr.atomic is
                // remote_addr at 40, compare_add at 48, swap at 56 and rkey at 64.
                let (remote_addr, compare_add, swap, rkey) = unsafe {
                    let base = cur as *const u8;
                    (
                        (base.add(40) as *const u64).read_unaligned(),
                        (base.add(48) as *const u64).read_unaligned(),
                        (base.add(56) as *const u64).read_unaligned(),
                        (base.add(64) as *const u32).read_unaligned(),
                    )
                };
                let s = &list[0];
                let atomic = Request::Atomic {
                    cmp_swap: w.opcode == IBV_WR_ATOMIC_CMP_AND_SWP,
                    id: token,
                    wr_id: w.wr_id,
                    signaled,
                    remote_addr,
                    rkey,
                    compare_add,
                    swap,
                    sge: (s.addr, s.length, s.lkey),
                };
                rpc(&atomic).err().unwrap_or(0)
            }
            IBV_WR_ATOMIC_CMP_AND_SWP | IBV_WR_ATOMIC_FETCH_AND_ADD => libc::EINVAL,
            _ => {
                unsupported("ibv_post_send with this opcode");
                libc::ENOSYS
            }
        };
        if errno != 0 {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out pointer.
                unsafe { *bad_wr = cur };
            }
            return errno;
        }
        cur = w.next;
    }
    0
}

/// `ibv_destroy_qp` on a QP `rdma_create_qp` made (rping destroys its QP this way).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: qp came from rdma_create_qp or ibv_create_qp, so is QpPriv.
    let (token, verbs) = unsafe { (qp_token(qp), (*(qp as *mut QpPriv)).verbs) };
    if verbs {
        if let Err(errno) = rpc(&Request::VerbsDestroyQp { qp: token }) {
            return errno;
        }
        {
            let mut reg = lock(&registry().0);
            reg.recvs.remove(&token);
            reg.qp_nums.remove(&token);
        }
        forget_srq_qp(token);
        // SAFETY: qp is this library's QpPriv, given back once.
        drop(unsafe { Box::from_raw(qp as *mut QpPriv) });
        return 0;
    }
    if let Err(errno) = crate::ffi::call(Invocation::DestroyQp { id: token }) {
        return errno;
    }
    crate::ffi::forget_qp(token, qp);
    // SAFETY: qp is this library's QpPriv; the id no longer points at it.
    drop(unsafe { Box::from_raw(qp as *mut QpPriv) });
    0
}

/// `ops.post_recv`.
unsafe extern "C" fn post_recv(qp: *mut IbvQp, wr: *mut IbvRecvWr, bad_wr: *mut *mut IbvRecvWr) -> c_int {
    // SAFETY: qp came from rdma_create_qp.
    let token = unsafe { qp_token(qp) };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: cur is the caller's work request list.
        let w = unsafe { &*cur };
        // SAFETY: as above.
        let list: Vec<(u64, u32)> = unsafe { sges(w.sg_list, w.num_sge) }
            .iter()
            .map(|s| (s.addr, s.length))
            .collect();
        let len: u32 = list.iter().map(|s| s.1).sum();
        // The receive is known here before the daemon can complete it, so a concurrent poll
        // always finds where its bytes go.
        lock(&registry().0)
            .recvs
            .entry(token)
            .or_default()
            .push_back(PostedRecv {
                wr_id: w.wr_id,
                sges: list,
            });
        // SAFETY: qp is this library's QpPriv.
        let result = if unsafe { (*(qp as *mut QpPriv)).verbs } {
            rpc(&Request::QpPostRecv {
                qp: token,
                wr_id: w.wr_id,
                len,
            })
        } else {
            crate::ffi::call(Invocation::PostRecv {
                id: token,
                wr_id: w.wr_id,
                len,
            })
        };
        if let Err(errno) = result {
            if let Some(q) = lock(&registry().0).recvs.get_mut(&token) {
                if let Some(pos) = q.iter().rposition(|r| r.wr_id == w.wr_id) {
                    q.remove(pos);
                }
            }
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out pointer.
                unsafe { *bad_wr = cur };
            }
            return errno;
        }
        cur = w.next;
    }
    0
}

/// The library's part of a shared receive queue.
#[repr(C)]
struct SrqPriv {
    public: IbvSrq,
    token: u64,
    /// The entries a receive may have (`max_sge` granted).
    max_sge: u32,
}

/// A receive posted on an SRQ: the SRQ's token, the application's `wr_id` and where its
/// bytes go.
struct SrqRecv {
    srq: u64,
    wr_id: u64,
    sges: Vec<(u64, u32)>,
}

/// The receives posted on SRQs and not completed yet, by the key the daemon knows each by
/// (its `wr_id` there): a message takes whichever is oldest on whichever QP it lands, so the
/// completion names its receive by the key, never by the QP.
static SRQ_RECVS: Mutex<Option<HashMap<u64, SrqRecv>>> = Mutex::new(None);
/// The keys of [`SRQ_RECVS`].
static NEXT_SRQ_KEY: AtomicU64 = AtomicU64::new(1);
/// QP token → the token of the SRQ it takes its receives from, for the QPs that do.
static SRQ_QPS: Mutex<Option<HashMap<u64, u64>>> = Mutex::new(None);

/// QP `token` takes its receives from SRQ `srq` (a token): its receive completions name
/// theirs by the key they were posted under.
pub(crate) fn note_srq_qp(token: u64, srq: u64) {
    if srq != 0 {
        lock(&SRQ_QPS).get_or_insert_with(HashMap::new).insert(token, srq);
    }
}

/// QP `token` is gone.
pub(crate) fn forget_srq_qp(token: u64) {
    if let Some(m) = lock(&SRQ_QPS).as_mut() {
        m.remove(&token);
    }
}

/// The daemon's token of an SRQ of this library (0 for NULL).
pub(crate) unsafe fn srq_token(srq: *mut c_void) -> u64 {
    if srq.is_null() {
        0
    } else {
        // SAFETY: non-NULL SRQs handed to this library came from ibv_create_srq, so are SrqPriv.
        unsafe { (*(srq as *mut SrqPriv)).token }
    }
}

/// Says on stderr why an SRQ call answers `EOPNOTSUPP`, when it does.
fn say_srq_refusal(call: &str, errno: c_int, what: &str) -> c_int {
    if errno == libc::EOPNOTSUPP {
        eprintln!("cmsim: {call}: {what} is not supported on the simulator (EOPNOTSUPP)");
    }
    errno
}

/// `ibv_create_srq`: a shared receive queue on `pd`'s device, checked by rxe's rules
/// (`max_wr` 1 up to `max_srq_wr`, `max_sge` up to `max_srq_sge`: `EINVAL`); the granted
/// sizes are written back. A nonzero `srq_limit` is refused (`EOPNOTSUPP`): its event would
/// come by `ibv_get_async_event`, which this library does not serve.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_srq(pd: *mut IbvPd, init_attr: *mut IbvSrqInitAttr) -> *mut IbvSrq {
    if pd.is_null() || init_attr.is_null() {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: init_attr is the caller's struct ibv_srq_init_attr; pd came from ibv_alloc_pd.
    let (a, context) = unsafe { (*init_attr, (*pd).context) };
    let create = Request::CreateSrq {
        max_wr: a.attr.max_wr,
        max_sge: a.attr.max_sge,
        srq_limit: a.attr.srq_limit,
    };
    let buf = match rpc(&create) {
        Ok(b) => b,
        Err(errno) => {
            say_srq_refusal("ibv_create_srq", errno, "an srq_limit (asynchronous events)");
            fail(errno);
            return ptr::null_mut();
        }
    };
    let mut d = Dec::new(&buf);
    let Ok((token, max_wr, max_sge)) = d.u64().and_then(|t| Ok((t, d.u32()?, d.u32()?))) else {
        fail(libc::EPROTO);
        return ptr::null_mut();
    };
    // SAFETY: as above: libibverbs writes the granted sizes back.
    unsafe {
        (*init_attr).attr.max_wr = max_wr;
        (*init_attr).attr.max_sge = max_sge;
    }
    let srq = Box::new(SrqPriv {
        public: IbvSrq {
            context,
            srq_context: a.srq_context,
            pd,
            handle: token as u32,
            sync: [0; 11],
            events_completed: 0,
        },
        token,
        max_sge,
    });
    Box::into_raw(srq) as *mut IbvSrq
}

/// `ibv_modify_srq`, checked as rxe checks it (`EINVAL`). Disarming the limit (`IBV_SRQ_LIMIT`
/// with 0) is served; resizing (`IBV_SRQ_MAX_WR`; the device does not claim
/// `IBV_DEVICE_SRQ_RESIZE`) and arming a limit are refused with `EOPNOTSUPP` and a line on
/// stderr.
#[no_mangle]
pub unsafe extern "C" fn ibv_modify_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr, mask: c_int) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: srq came from ibv_create_srq; attr is the caller's.
    let (token, a) = unsafe { (srq_token(srq as *mut c_void), *attr) };
    let modify = Request::ModifySrq {
        srq: token,
        mask: mask as u32,
        max_wr: a.max_wr,
        srq_limit: a.srq_limit,
    };
    match rpc(&modify) {
        Ok(_) => 0,
        Err(errno) => say_srq_refusal(
            "ibv_modify_srq",
            errno,
            "resizing an SRQ or arming its limit (asynchronous events)",
        ),
    }
}

/// `ibv_query_srq`: the sizes granted and the limit armed (0).
#[no_mangle]
pub unsafe extern "C" fn ibv_query_srq(srq: *mut IbvSrq, attr: *mut IbvSrqAttr) -> c_int {
    if srq.is_null() || attr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: srq came from ibv_create_srq.
    let token = unsafe { srq_token(srq as *mut c_void) };
    let buf = match rpc(&Request::QuerySrq { srq: token }) {
        Ok(b) => b,
        Err(errno) => return errno,
    };
    let mut d = Dec::new(&buf);
    let Ok(got) = d.u32().and_then(|max_wr| {
        Ok(IbvSrqAttr {
            max_wr,
            max_sge: d.u32()?,
            srq_limit: d.u32()?,
        })
    }) else {
        return libc::EPROTO;
    };
    // SAFETY: attr is the caller's struct ibv_srq_attr.
    unsafe { *attr = got };
    0
}

/// `ibv_destroy_srq`: refused (`EBUSY`) while a QP takes its receives from it, as the kernel
/// refuses; the receives still posted go with it.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_srq(srq: *mut IbvSrq) -> c_int {
    if srq.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: srq came from ibv_create_srq.
    let token = unsafe { srq_token(srq as *mut c_void) };
    if let Err(errno) = rpc(&Request::DestroySrq { srq: token }) {
        return errno;
    }
    if let Some(m) = lock(&SRQ_RECVS).as_mut() {
        m.retain(|_, r| r.srq != token);
    }
    // SAFETY: srq is this library's SrqPriv, given back once.
    drop(unsafe { Box::from_raw(srq as *mut SrqPriv) });
    0
}

/// `ops.post_srq_recv`: each receive is known here under a key of its own before the daemon
/// can complete it, so a concurrent poll always finds where its bytes go.
unsafe extern "C" fn post_srq_recv(srq: *mut c_void, wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int {
    // SAFETY: srq came from ibv_create_srq.
    let token = unsafe { srq_token(srq) };
    if token == 0 {
        return libc::EINVAL;
    }
    // SAFETY: as above: a non-NULL SRQ is an SrqPriv.
    let max_sge = unsafe { (*(srq as *mut SrqPriv)).max_sge };
    let mut cur = wr as *mut IbvRecvWr;
    while !cur.is_null() {
        // SAFETY: cur is the caller's work request list.
        let w = unsafe { &*cur };
        // rxe's post_one_recv: more entries than the SRQ takes is EINVAL.
        if w.num_sge < 0 || w.num_sge as u32 > max_sge {
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out pointer.
                unsafe { *bad_wr = cur as *mut c_void };
            }
            return libc::EINVAL;
        }
        // SAFETY: as above.
        let list: Vec<(u64, u32)> = unsafe { sges(w.sg_list, w.num_sge) }
            .iter()
            .map(|s| (s.addr, s.length))
            .collect();
        let len = list.iter().fold(0u32, |n, s| n.saturating_add(s.1));
        let key = NEXT_SRQ_KEY.fetch_add(1, Ordering::Relaxed);
        lock(&SRQ_RECVS).get_or_insert_with(HashMap::new).insert(
            key,
            SrqRecv {
                srq: token,
                wr_id: w.wr_id,
                sges: list,
            },
        );
        let post = Request::PostSrqRecv {
            srq: token,
            wr_id: key,
            len,
        };
        if let Err(errno) = rpc(&post) {
            if let Some(m) = lock(&SRQ_RECVS).as_mut() {
                m.remove(&key);
            }
            if !bad_wr.is_null() {
                // SAFETY: bad_wr is the caller's out pointer.
                unsafe { *bad_wr = cur as *mut c_void };
            }
            return errno;
        }
        cur = w.next;
    }
    0
}

thread_local! {
    /// Consecutive empty polls on this thread (a busy-polling loop).
    static EMPTY_POLLS: std::cell::Cell<u32> = const { std::cell::Cell::new(0) };
}

/// `ops.poll_cq`. A busy-polling loop (ucmatose, udaddy) would keep the daemon spinning with
/// it, so after a run of empty polls each further empty one sleeps briefly first.
unsafe extern "C" fn poll_cq(cq: *mut IbvCq, num_entries: c_int, wc: *mut IbvWc) -> c_int {
    // SAFETY: cq came from ibv_create_cq.
    let token = unsafe { cq_token(cq as *mut c_void) };
    if token == 0 || num_entries < 0 || (num_entries > 0 && wc.is_null()) {
        return -libc::EINVAL;
    }
    let mut filled = 0usize;
    loop {
        // SAFETY: wc has room for num_entries entries, filled of them written.
        let got = unsafe { poll_some(token, num_entries as usize - filled, wc.add(filled)) };
        let (n, more) = match got {
            Ok(r) => r,
            Err(errno) => return -errno,
        };
        filled += n;
        if !more || filled >= num_entries as usize {
            break;
        }
    }
    if filled == 0 {
        let empties = EMPTY_POLLS.with(|c| {
            c.set(c.get().saturating_add(1));
            c.get()
        });
        if empties > 64 {
            std::thread::sleep(Duration::from_micros(50));
        }
        return 0;
    }
    EMPTY_POLLS.with(|c| c.set(0));
    filled as c_int
}

/// One `PollCq` of at most `max` completions into `wc`: how many came, and whether more wait
/// (one reply could not hold them all).
unsafe fn poll_some(token: u64, max: usize, wc: *mut IbvWc) -> Result<(usize, bool), c_int> {
    let buf = rpc(&Request::PollCq {
        cq: token,
        max: max as u32,
    })?;
    let mut d = Dec::new(&buf);
    let n = d.u32().map_err(|_| libc::EPROTO)? as usize;
    if n > max {
        return Err(libc::EPROTO);
    }
    for i in 0..n {
        let w = d.wc().map_err(|_| libc::EPROTO)?;
        let mut status = w.status;
        // verbs reports the local QP's number; a token with none known (its QP destroyed
        // meanwhile) stands for itself, as a connected QP's number is its token.
        let qp_num = lock(&registry().0)
            .qp_nums
            .get(&w.id)
            .copied()
            .unwrap_or(w.id as u32);
        let on_srq =
            w.opcode == IBV_WC_RECV && lock(&SRQ_QPS).as_ref().is_some_and(|m| m.contains_key(&w.id));
        let mut wr_id = w.wr_id;
        if on_srq {
            // The receive is the SRQ's, named by the key it was posted under.
            let posted = lock(&SRQ_RECVS).as_mut().and_then(|m| m.remove(&w.wr_id));
            match posted {
                Some(p) => {
                    wr_id = p.wr_id;
                    if status == IBV_WC_SUCCESS {
                        // SAFETY: the buffers were posted for this receive and stay valid
                        // until its completion is polled (the verbs contract).
                        unsafe { scatter(&p.sges, &w.data) };
                    }
                }
                None => status = IBV_WC_LOC_LEN_ERR,
            }
        } else if w.opcode == IBV_WC_RECV {
            let posted = lock(&registry().0)
                .recvs
                .get_mut(&w.id)
                .and_then(VecDeque::pop_front);
            if status == IBV_WC_SUCCESS {
                match posted {
                    // SAFETY: the buffers were posted for this receive and stay valid until
                    // its completion is polled (the verbs contract).
                    Some(p) => unsafe { scatter(&p.sges, &w.data) },
                    None => status = IBV_WC_LOC_LEN_ERR,
                }
            }
        }
        // SAFETY: wc has room for max entries and i < n <= max.
        unsafe {
            *wc.add(i) = IbvWc {
                wr_id,
                status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                qp_num,
                src_qp: w.src_qp,
                imm_data: w.imm_data,
                wc_flags: w.wc_flags,
                ..IbvWc::default()
            };
        }
    }
    let more = d.u8().map_err(|_| libc::EPROTO)? == 1;
    Ok((n, more))
}

unsafe fn scatter(sges: &[(u64, u32)], mut data: &[u8]) {
    for &(addr, len) in sges {
        let n = data.len().min(len as usize);
        // SAFETY: (addr, len) is a posted receive buffer of the caller's; n <= len.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), addr as *mut u8, n) };
        data = &data[n..];
    }
}

/// `ops.req_notify_cq`: the next completion on the CQ raises one event on its channel.
unsafe extern "C" fn req_notify_cq(cq: *mut IbvCq, _solicited_only: c_int) -> c_int {
    // SAFETY: cq came from ibv_create_cq.
    let (token, channel) = unsafe { (cq_token(cq as *mut c_void), (*cq).channel) };
    if token == 0 || channel.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: the CQ's channel came from this library.
    if let Err(errno) = unsafe { attach(channel as *mut CompChannelPriv) } {
        return errno;
    }
    rpc(&Request::ReqNotifyCq { cq: token }).err().unwrap_or(0)
}

/// Gives a completion channel its socket if it has none yet.
unsafe fn attach(ch: *mut CompChannelPriv) -> Result<(), c_int> {
    // Threads may race here (one arming, one reading): shared references and raw-pointer
    // access to `fd` only, under the channel's own lock.
    // SAFETY: ch is a live channel of this library.
    let (lock_ref, token, fd) = unsafe {
        (
            &(*ch).attach,
            (*ch).token,
            std::ptr::addr_of_mut!((*ch).public.fd),
        )
    };
    let _guard = lock(lock_ref);
    // SAFETY: fd points into the live channel; writers hold the lock we hold.
    if unsafe { fd.read() } >= 0 {
        return Ok(());
    }
    let (socket, proc) = crate::ffi::daemon_address()?;
    let conn = SeqConn::connect(&socket).map_err(|_| libc::ENODEV)?;
    let e = Opening::AttachCompChannel { proc, channel: token }.encode();
    conn.send(&e.0).map_err(|_| libc::ENODEV)?;
    let mut buf = Vec::new();
    match conn.recv(&mut buf) {
        Ok(true) if buf.first() == Some(&proto::CHAN_ATTACHED) => {
            // SAFETY: as above.
            unsafe { fd.write(conn.into_raw_fd()) };
            Ok(())
        }
        _ => Err(libc::ENODEV),
    }
}

fn new_comp_channel(context: *mut c_void, eager: bool) -> *mut CompChannelPriv {
    let token =
        match rpc(&Request::CreateCompChannel).and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO)) {
            Ok(t) => t,
            Err(errno) => {
                fail(errno);
                return ptr::null_mut();
            }
        };
    let ch = Box::into_raw(Box::new(CompChannelPriv {
        public: IbvCompChannel {
            context,
            fd: -1,
            refcnt: 0,
        },
        token,
        attach: Mutex::new(()),
    }));
    if eager {
        // SAFETY: ch was just allocated.
        if let Err(errno) = unsafe { attach(ch) } {
            // SAFETY: as above; not handed out.
            unsafe { ibv_destroy_comp_channel(ch as *mut IbvCompChannel) };
            fail(errno);
            return ptr::null_mut();
        }
    }
    ch
}

/// `ibv_create_comp_channel`: its fd is readable when a completion event is queued.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_comp_channel(context: *mut c_void) -> *mut IbvCompChannel {
    new_comp_channel(context, true) as *mut IbvCompChannel
}

/// `ibv_destroy_comp_channel`: refused (`EBUSY`) while a CQ uses the channel.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_comp_channel(channel: *mut IbvCompChannel) -> c_int {
    if channel.is_null() {
        return libc::EINVAL;
    }
    let ch = channel as *mut CompChannelPriv;
    let destroy = Request::DestroyCompChannel {
        // SAFETY: channel came from ibv_create_comp_channel.
        channel: unsafe { (*ch).token },
    };
    if let Err(errno) = rpc(&destroy) {
        return errno;
    }
    // SAFETY: ch is this library's, given back once.
    let ch = unsafe { Box::from_raw(ch) };
    if ch.public.fd >= 0 {
        sock::close_fd(ch.public.fd);
    }
    0
}

/// `ibv_get_cq_event`: the next completion event of the channel (blocking unless the fd is
/// `O_NONBLOCK`; a caught signal ends the wait with `EINTR`), with the application's CQ
/// pointer and `cq_context`.
#[no_mangle]
pub unsafe extern "C" fn ibv_get_cq_event(
    channel: *mut IbvCompChannel,
    cq: *mut *mut IbvCq,
    cq_context: *mut *mut c_void,
) -> c_int {
    if channel.is_null() || cq.is_null() || cq_context.is_null() {
        return fail(libc::EINVAL);
    }
    // SAFETY: channel came from this library.
    if let Err(errno) = unsafe { attach(channel as *mut CompChannelPriv) } {
        return fail(errno);
    }
    // SAFETY: as above.
    let fd = unsafe { (*channel).fd };
    let mut buf = Vec::new();
    loop {
        let flags = if sock::is_nonblocking(fd) {
            libc::MSG_DONTWAIT
        } else {
            0
        };
        // A signal handler without SA_RESTART ends the wait with EINTR, as libibverbs' read
        // of the channel's fd ends.
        match sock::recv_fd_interruptible(fd, &mut buf, flags) {
            Ok(true) => {}
            Ok(false) => {
                eprintln!("cmsim: the fabric daemon went away");
                return fail(libc::ENODEV);
            }
            Err(e) => return fail(e.raw_os_error().unwrap_or(libc::EIO)),
        }
        let mut d = Dec::new(&buf);
        if d.u8() != Ok(proto::CHAN_COMP) {
            continue;
        }
        let Ok(token) = d.u64() else {
            return fail(libc::EPROTO);
        };
        let Some(found) = lock(&CQS).as_ref().and_then(|m| m.get(&token).copied()) else {
            // The CQ was destroyed after the event was raised.
            continue;
        };
        let found = found as *mut IbvCq;
        // SAFETY: found is a live CQ of this library; the out pointers are the caller's.
        unsafe {
            *cq = found;
            *cq_context = (*found).cq_context;
        }
        return 0;
    }
}

/// `ibv_ack_cq_events`.
#[no_mangle]
pub unsafe extern "C" fn ibv_ack_cq_events(cq: *mut IbvCq, nevents: u32) {
    if !cq.is_null() {
        // SAFETY: cq came from ibv_create_cq.
        unsafe { (*cq).comp_events_completed = (*cq).comp_events_completed.wrapping_add(nevents) };
    }
}

/// `ibv_query_qp`: the capabilities granted and the creation attributes.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_qp(
    qp: *mut IbvQp,
    attr: *mut u8,
    _mask: c_int,
    init_attr: *mut IbvQpInitAttr,
) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: qp came from this library, so is QpPriv.
    let q = unsafe { &mut *(qp as *mut QpPriv) };
    if q.verbs {
        let buf = match rpc(&Request::QueryQp { qp: q.token }) {
            Ok(b) => b,
            Err(errno) => return errno,
        };
        let mut d = Dec::new(&buf);
        let (Ok(_set), Ok(Some(a))) = (d.u32(), d.verbs_attr()) else {
            return libc::EPROTO;
        };
        // The data path may have moved the QP to ERR.
        q.public.state = a.qp_state.raw();
        if !attr.is_null() {
            // SAFETY: attr is the caller's struct ibv_qp_attr.
            unsafe { ptr::write_unaligned(attr as *mut IbvQpAttr, IbvQpAttr::from_verbs(&a, q.cap)) };
        }
    }
    // SAFETY: qp came from rdma_create_qp or ibv_create_qp; attr is NULL or the caller's
    // ibv_qp_attr (state at offset 0, cap at offset 36); init_attr is NULL or the caller's.
    unsafe {
        if !attr.is_null() && !q.verbs {
            ptr::write_unaligned(attr as *mut u32, q.public.state);
            // qkey at offset 16: the UDP port space's.
            ptr::write_unaligned(attr.add(16) as *mut u32, crate::ffi::RDMA_UDP_QKEY);
            ptr::write_unaligned(attr.add(36) as *mut IbvQpCap, q.cap);
        }
        if !init_attr.is_null() {
            *init_attr = IbvQpInitAttr {
                qp_context: q.public.qp_context,
                send_cq: q.public.send_cq,
                recv_cq: q.public.recv_cq,
                srq: q.public.srq,
                cap: q.cap,
                qp_type: q.public.qp_type,
                sq_sig_all: q.sq_sig_all,
            };
        }
    }
    0
}

/// `struct ibv_ah`.
#[repr(C)]
pub struct IbvAh {
    context: *mut c_void,
    pd: *mut IbvPd,
    handle: u32,
    /// The attributes it was made with: where its datagrams go.
    attr: cm_core::AhAttr,
}

fn new_ah(pd: *mut IbvPd, attr: cm_core::AhAttr) -> *mut IbvAh {
    if pd.is_null() {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    // SAFETY: pd came from ibv_alloc_pd.
    let context = unsafe { (*pd).context };
    Box::into_raw(Box::new(IbvAh {
        context,
        pd,
        handle: NEXT_KEY.fetch_add(1, Ordering::Relaxed),
        attr,
    }))
}

/// `ibv_create_ah`: the simulator checks and routes by the attributes when a datagram is sent
/// with the handle, as rxe does. A handle of a port the device lacks, or without a global
/// route, is `EINVAL`: Linux's ib core refuses both on a RoCE port (`rdma_check_ah_attr`)
/// before rxe sees them.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut IbvPd, attr: *mut c_void) -> *mut IbvAh {
    if attr.is_null() {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    let mut bytes = [0u8; 32];
    // SAFETY: attr is the caller's struct ibv_ah_attr, 32 bytes.
    unsafe { ptr::copy_nonoverlapping(attr as *const u8, bytes.as_mut_ptr(), 32) };
    let attr: cm_core::AhAttr = IbvAhAttr::from_bytes(&bytes).into();
    if attr.port_num != 1 || !attr.is_global {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    new_ah(pd, attr)
}

/// `ibv_create_ah_from_wc`: an address handle back to a datagram's sender, read from the 40
/// bytes in front of its payload as libibverbs' `ibv_init_ah_from_wc` reads them: for RoCE v2
/// over IPv4 an IPv4 header in their last 20, else an IPv6 header.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    wc: *mut IbvWc,
    grh: *mut c_void,
    port_num: u8,
) -> *mut IbvAh {
    // SAFETY: wc is the caller's completion.
    if wc.is_null() || grh.is_null() || unsafe { (*wc).wc_flags } & IBV_WC_GRH == 0 {
        fail(libc::EINVAL);
        return ptr::null_mut();
    }
    let mut header = [0u8; 40];
    // SAFETY: grh is the caller's receive buffer, whose first 40 bytes the GRH fills.
    unsafe { ptr::copy_nonoverlapping(grh as *const u8, header.as_mut_ptr(), 40) };
    let Some(sender) = cm_core::grh_source(&header) else {
        fail(libc::EINVAL);
        return ptr::null_mut();
    };
    let mut attr = cm_core::AhAttr::for_ip(sender);
    attr.hop_limit = 0xff;
    attr.port_num = port_num;
    new_ah(pd, attr)
}

/// `ibv_destroy_ah`.
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_ah(ah: *mut IbvAh) -> c_int {
    if ah.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: ah came from ibv_create_ah(_from_wc) and is given back once.
    drop(unsafe { Box::from_raw(ah) });
    0
}

/// The CQ (with its channel) librdmacm makes for an `rdma_create_qp` given NULL CQs.
pub(crate) unsafe fn default_cq(
    context: *mut c_void,
    size: u32,
    id: *mut c_void,
) -> (*mut c_void, *mut c_void) {
    let channel = new_comp_channel(context, false);
    if channel.is_null() {
        return (ptr::null_mut(), ptr::null_mut());
    }
    // SAFETY: plain call with this library's channel.
    let cq = unsafe {
        ibv_create_cq(
            context,
            size.max(1) as c_int,
            id,
            channel as *mut IbvCompChannel,
            0,
        )
    };
    if cq.is_null() {
        // SAFETY: channel is this function's.
        unsafe { ibv_destroy_comp_channel(channel as *mut IbvCompChannel) };
        return (ptr::null_mut(), ptr::null_mut());
    }
    (channel as *mut c_void, cq as *mut c_void)
}

/// The device's default protection domain (librdmacm uses it for a NULL PD).
pub(crate) fn default_pd() -> *mut c_void {
    static PD: std::sync::OnceLock<usize> = std::sync::OnceLock::new();
    // SAFETY: ibv_alloc_pd only records the context.
    *PD.get_or_init(|| unsafe { ibv_alloc_pd(crate::device::device_context()) } as usize) as *mut c_void
}

// ---- pure calls: names, rates, fork, the kernel-struct copies -------------------------------

/// `ibv_wc_status_str`: libibverbs' text for a completion status (`enum_strs.c`).
#[no_mangle]
pub extern "C" fn ibv_wc_status_str(status: c_int) -> *const c_char {
    const NAMES: [&CStr; 24] = [
        c"success",
        c"local length error",
        c"local QP operation error",
        c"local EE context operation error",
        c"local protection error",
        c"Work Request Flushed Error",
        c"memory management operation error",
        c"bad response error",
        c"local access error",
        c"remote invalid request error",
        c"remote access error",
        c"remote operation error",
        c"transport retry counter exceeded",
        c"RNR retry counter exceeded",
        c"local RDD violation error",
        c"remote invalid RD request",
        c"aborted error",
        c"invalid EE context number",
        c"invalid EE context state",
        c"fatal error",
        c"response timeout error",
        c"general error",
        c"TM error",
        c"TM software rendezvous",
    ];
    name_of(&NAMES, status)
}

/// `ibv_event_type_str`: libibverbs' text for an asynchronous event type (`enum_strs.c`).
#[no_mangle]
pub extern "C" fn ibv_event_type_str(event: c_int) -> *const c_char {
    const NAMES: [&CStr; 20] = [
        c"CQ error",
        c"local work queue catastrophic error",
        c"invalid request local work queue error",
        c"local access violation work queue error",
        c"communication established",
        c"send queue drained",
        c"path migrated",
        c"path migration request error",
        c"local catastrophic error",
        c"port active",
        c"port error",
        c"LID change",
        c"P_Key change",
        c"SM change",
        c"SRQ catastrophic error",
        c"SRQ limit reached",
        c"last WQE reached",
        c"client reregistration",
        c"GID table change",
        c"WQ fatal",
    ];
    name_of(&NAMES, event)
}

/// `ibv_node_type_str`: libibverbs' text for a node type (`enum_strs.c`; the types start at 1).
#[no_mangle]
pub extern "C" fn ibv_node_type_str(node_type: c_int) -> *const c_char {
    const NAMES: [&CStr; 7] = [
        c"InfiniBand channel adapter",
        c"InfiniBand switch",
        c"InfiniBand router",
        c"iWARP NIC",
        c"usNIC",
        c"usNIC UDP",
        c"unspecified",
    ];
    name_of(&NAMES, node_type.wrapping_sub(1))
}

/// `ibv_port_state_str`: libibverbs' text for a port state (`enum_strs.c`).
#[no_mangle]
pub extern "C" fn ibv_port_state_str(port_state: c_int) -> *const c_char {
    const NAMES: [&CStr; 6] = [
        c"no state change (NOP)",
        c"down",
        c"init",
        c"armed",
        c"active",
        c"active defer",
    ];
    name_of(&NAMES, port_state)
}

/// Entry `i` of a name table, or libibverbs' `"unknown"` past either end.
fn name_of(names: &[&'static CStr], i: c_int) -> *const c_char {
    usize::try_from(i)
        .ok()
        .and_then(|i| names.get(i))
        .copied()
        .unwrap_or(c"unknown")
        .as_ptr()
}

/// `enum ibv_rate` → (its multiple of 2.5 Gb/s, if it has one; its Mb/s), from libibverbs'
/// `verbs.c`.
const RATES: [(c_int, Option<c_int>, c_int); 23] = [
    (2, Some(1), 2500),
    (5, Some(2), 5000),
    (3, Some(4), 10000),
    (6, Some(8), 20000),
    (4, Some(12), 30000),
    (7, Some(16), 40000),
    (8, Some(24), 60000),
    (9, Some(32), 80000),
    (10, Some(48), 120000),
    (11, None, 14062),
    (12, None, 56250),
    (13, None, 112500),
    (14, None, 168750),
    (15, None, 25781),
    (16, None, 103125),
    (17, None, 206250),
    (18, None, 309375),
    (19, Some(11), 28125),
    (20, Some(20), 53125),
    (21, Some(160), 425000),
    (22, Some(240), 637500),
    (23, Some(320), 850000),
    (24, Some(480), 1275000),
];

/// `IBV_RATE_MAX`: what the conversions to a rate answer for a value without one.
const IBV_RATE_MAX: c_int = 0;

/// `ibv_rate_to_mult`: the rate as a multiple of 2.5 Gb/s; -1 for a rate that is none.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mult(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).and_then(|r| r.1).unwrap_or(-1)
}

/// `mult_to_ibv_rate`: the rate of a multiple of 2.5 Gb/s; `IBV_RATE_MAX` for none.
#[no_mangle]
pub extern "C" fn mult_to_ibv_rate(mult: c_int) -> c_int {
    RATES
        .iter()
        .find(|r| r.1 == Some(mult))
        .map_or(IBV_RATE_MAX, |r| r.0)
}

/// `ibv_rate_to_mbps`: the rate in Mb/s; -1 for a rate that is none.
#[no_mangle]
pub extern "C" fn ibv_rate_to_mbps(rate: c_int) -> c_int {
    RATES.iter().find(|r| r.0 == rate).map_or(-1, |r| r.2)
}

/// `mbps_to_ibv_rate`: the rate of exactly that many Mb/s; `IBV_RATE_MAX` for none.
#[no_mangle]
pub extern "C" fn mbps_to_ibv_rate(mbps: c_int) -> c_int {
    RATES.iter().find(|r| r.2 == mbps).map_or(IBV_RATE_MAX, |r| r.0)
}

/// `IBV_FORK_UNNEEDED` of `enum ibv_fork_status`.
const IBV_FORK_UNNEEDED: c_int = 2;

/// `ibv_fork_init`: 0, nothing to do. libibverbs marks registered memory `MADV_DONTFORK` so
/// that a fork's copy-on-write cannot move a page the device has pinned; here no device pins
/// anything: sends are copied when posted, receives are scattered by this library in the
/// process, and RDMA READ/WRITE reach the memory through the process itself at the time of the
/// post, so whatever page copy-on-write leaves the parent is the one they reach. This is the
/// case libibverbs reports as `IBV_FORK_UNNEEDED` (a kernel that copies DMA pages on fork), in
/// which its `ibv_fork_init` returns 0 too.
#[no_mangle]
pub extern "C" fn ibv_fork_init() -> c_int {
    0
}

/// `ibv_is_fork_initialized`: `IBV_FORK_UNNEEDED` (see [`ibv_fork_init`]).
#[no_mangle]
pub extern "C" fn ibv_is_fork_initialized() -> c_int {
    IBV_FORK_UNNEEDED
}

/// `ibv_dontfork_range`: 0, nothing to protect (see [`ibv_fork_init`]); libibverbs too returns
/// 0 without fork support set up.
#[no_mangle]
pub extern "C" fn ibv_dontfork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_dofork_range`: 0, as [`ibv_dontfork_range`].
#[no_mangle]
pub extern "C" fn ibv_dofork_range(_base: *mut c_void, _size: usize) -> c_int {
    0
}

/// `ibv_register_driver`: nothing, as in libibverbs, where the driver interface has been
/// private since rdma-core 13 and this is an empty stub kept for old providers that call it.
#[no_mangle]
pub extern "C" fn ibv_register_driver(_name: *const c_char, _init_func: *mut c_void) {}

/// `struct ib_uverbs_global_route` (`rdma/ib_user_verbs.h`).
#[repr(C)]
#[allow(dead_code)] // as IbvGlobalRoute
struct UverbsGlobalRoute {
    dgid: [u8; 16],
    flow_label: u32,
    sgid_index: u8,
    hop_limit: u8,
    traffic_class: u8,
    reserved: u8,
}

/// `struct ib_uverbs_ah_attr`.
#[repr(C)]
#[allow(dead_code)] // as IbvGlobalRoute
struct UverbsAhAttr {
    grh: UverbsGlobalRoute,
    dlid: u16,
    sl: u8,
    src_path_bits: u8,
    static_rate: u8,
    is_global: u8,
    port_num: u8,
    reserved: u8,
}

/// `struct ib_uverbs_qp_attr`.
#[repr(C)]
#[allow(dead_code)] // as IbvGlobalRoute
struct UverbsQpAttr {
    qp_attr_mask: u32,
    qp_state: u32,
    cur_qp_state: u32,
    path_mtu: u32,
    path_mig_state: u32,
    qkey: u32,
    rq_psn: u32,
    sq_psn: u32,
    dest_qp_num: u32,
    qp_access_flags: u32,
    ah_attr: UverbsAhAttr,
    alt_ah_attr: UverbsAhAttr,
    max_send_wr: u32,
    max_recv_wr: u32,
    max_send_sge: u32,
    max_recv_sge: u32,
    max_inline_data: u32,
    pkey_index: u16,
    alt_pkey_index: u16,
    en_sqd_async_notify: u8,
    sq_draining: u8,
    max_rd_atomic: u8,
    max_dest_rd_atomic: u8,
    min_rnr_timer: u8,
    port_num: u8,
    timeout: u8,
    retry_cnt: u8,
    rnr_retry: u8,
    alt_port_num: u8,
    alt_timeout: u8,
    reserved: [u8; 5],
}

/// `struct ib_user_path_rec` (`rdma/ib_user_sa.h`).
#[repr(C)]
#[allow(dead_code)] // as IbvGlobalRoute
struct UserPathRec {
    dgid: [u8; 16],
    sgid: [u8; 16],
    dlid: u16,
    slid: u16,
    raw_traffic: u32,
    flow_label: u32,
    reversible: u32,
    mtu: u32,
    pkey: u16,
    hop_limit: u8,
    traffic_class: u8,
    numb_path: u8,
    sl: u8,
    mtu_selector: u8,
    rate_selector: u8,
    rate: u8,
    packet_life_time_selector: u8,
    packet_life_time: u8,
    preference: u8,
}

/// `struct ibv_sa_path_rec` (`infiniband/sa.h`).
#[repr(C)]
#[allow(dead_code)] // as IbvGlobalRoute
struct SaPathRec {
    dgid: [u8; 16],
    sgid: [u8; 16],
    dlid: u16,
    slid: u16,
    raw_traffic: i32,
    flow_label: u32,
    hop_limit: u8,
    traffic_class: u8,
    reversible: i32,
    numb_path: u8,
    pkey: u16,
    sl: u8,
    mtu_selector: u8,
    mtu: u8,
    rate_selector: u8,
    rate: u8,
    packet_life_time_selector: u8,
    packet_life_time: u8,
    preference: u8,
}

// The sizes and offsets printed with `offsetof` from the installed v44 headers.
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<IbvAhAttr>() == 32);
    assert!(offset_of!(IbvAhAttr, dlid) == 24);
    assert!(offset_of!(IbvAhAttr, port_num) == 30);
    assert!(size_of::<UverbsAhAttr>() == 32);
    assert!(size_of::<UverbsQpAttr>() == 144);
    assert!(offset_of!(UverbsQpAttr, ah_attr) == 40);
    assert!(offset_of!(UverbsQpAttr, max_send_wr) == 104);
    assert!(offset_of!(UverbsQpAttr, pkey_index) == 124);
    assert!(size_of::<UserPathRec>() == 64);
    assert!(offset_of!(UserPathRec, pkey) == 52);
    assert!(offset_of!(UserPathRec, preference) == 63);
    assert!(size_of::<SaPathRec>() == 64);
    assert!(offset_of!(SaPathRec, raw_traffic) == 36);
    assert!(offset_of!(SaPathRec, flow_label) == 40);
    assert!(offset_of!(SaPathRec, reversible) == 48);
    assert!(offset_of!(SaPathRec, pkey) == 54);
    assert!(offset_of!(SaPathRec, sl) == 56);
    assert!(offset_of!(SaPathRec, preference) == 63);
};

/// libibverbs' `ibv_copy_ah_attr_from_kern`, field by field (`marshall.c`).
fn copy_ah_from_kern(d: &mut IbvAhAttr, s: &UverbsAhAttr) {
    d.dgid = s.grh.dgid;
    d.flow_label = s.grh.flow_label;
    d.sgid_index = s.grh.sgid_index;
    d.hop_limit = s.grh.hop_limit;
    d.traffic_class = s.grh.traffic_class;
    d.dlid = s.dlid;
    d.sl = s.sl;
    d.src_path_bits = s.src_path_bits;
    d.static_rate = s.static_rate;
    d.is_global = s.is_global;
    d.port_num = s.port_num;
}

/// `ibv_copy_ah_attr_from_kern`: the kernel's address vector into libibverbs' (a helper
/// libibverbs exports for rdma-core's other libraries).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_ah_attr_from_kern(dst: *mut c_void, src: *const c_void) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: dst and src are the caller's structs of these layouts.
    copy_ah_from_kern(unsafe { &mut *(dst as *mut IbvAhAttr) }, unsafe {
        &*(src as *const UverbsAhAttr)
    });
}

/// `ibv_copy_qp_attr_from_kern`: the kernel's QP attributes into libibverbs' (`qp_state` and
/// `rate_limit` are left as they were, as libibverbs leaves them).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_qp_attr_from_kern(dst: *mut c_void, src: *const c_void) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: dst and src are the caller's structs of these layouts.
    let (d, s) = unsafe { (&mut *(dst as *mut IbvQpAttr), &*(src as *const UverbsQpAttr)) };
    d.cur_qp_state = s.cur_qp_state;
    d.path_mtu = s.path_mtu;
    d.path_mig_state = s.path_mig_state;
    d.qkey = s.qkey;
    d.rq_psn = s.rq_psn;
    d.sq_psn = s.sq_psn;
    d.dest_qp_num = s.dest_qp_num;
    d.qp_access_flags = s.qp_access_flags;
    d.cap = IbvQpCap {
        max_send_wr: s.max_send_wr,
        max_recv_wr: s.max_recv_wr,
        max_send_sge: s.max_send_sge,
        max_recv_sge: s.max_recv_sge,
        max_inline_data: s.max_inline_data,
    };
    copy_ah_from_kern(&mut d.ah_attr, &s.ah_attr);
    copy_ah_from_kern(&mut d.alt_ah_attr, &s.alt_ah_attr);
    d.pkey_index = s.pkey_index;
    d.alt_pkey_index = s.alt_pkey_index;
    d.en_sqd_async_notify = s.en_sqd_async_notify;
    d.sq_draining = s.sq_draining;
    d.max_rd_atomic = s.max_rd_atomic;
    d.max_dest_rd_atomic = s.max_dest_rd_atomic;
    d.min_rnr_timer = s.min_rnr_timer;
    d.port_num = s.port_num;
    d.timeout = s.timeout;
    d.retry_cnt = s.retry_cnt;
    d.rnr_retry = s.rnr_retry;
    d.alt_port_num = s.alt_port_num;
    d.alt_timeout = s.alt_timeout;
}

/// `ibv_copy_path_rec_from_kern`: the kernel's path record into libibverbs' (the C integer
/// conversions of `marshall.c`: `mtu` truncated to 8 bits, the flags reinterpreted as `int`).
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_from_kern(dst: *mut c_void, src: *const c_void) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: dst and src are the caller's structs of these layouts.
    let (d, s) = unsafe { (&mut *(dst as *mut SaPathRec), &*(src as *const UserPathRec)) };
    d.dgid = s.dgid;
    d.sgid = s.sgid;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as i32;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as i32;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = s.mtu as u8;
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}

/// `ibv_copy_path_rec_to_kern`: libibverbs' path record into the kernel's.
#[no_mangle]
pub unsafe extern "C" fn ibv_copy_path_rec_to_kern(dst: *mut c_void, src: *const c_void) {
    if dst.is_null() || src.is_null() {
        return;
    }
    // SAFETY: dst and src are the caller's structs of these layouts.
    let (d, s) = unsafe { (&mut *(dst as *mut UserPathRec), &*(src as *const SaPathRec)) };
    d.dgid = s.dgid;
    d.sgid = s.sgid;
    d.dlid = s.dlid;
    d.slid = s.slid;
    d.raw_traffic = s.raw_traffic as u32;
    d.flow_label = s.flow_label;
    d.hop_limit = s.hop_limit;
    d.traffic_class = s.traffic_class;
    d.reversible = s.reversible as u32;
    d.numb_path = s.numb_path;
    d.pkey = s.pkey;
    d.sl = s.sl;
    d.mtu_selector = s.mtu_selector;
    d.mtu = u32::from(s.mtu);
    d.rate_selector = s.rate_selector;
    d.rate = s.rate;
    d.packet_life_time = s.packet_life_time;
    d.preference = s.preference;
    d.packet_life_time_selector = s.packet_life_time_selector;
}
