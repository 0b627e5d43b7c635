//! The verbs the programs use: PDs and MRs (local bookkeeping), CQs, and the data path
//! reached through `ibv_context.ops` (`ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq` are
//! inline functions in the headers and jump through those pointers).
//!
//! Sends and receives are copied through this library in the calling process: a send gathers
//! its SGEs here and ships the bytes to the daemon; a receive's bytes come back with its
//! completion and are scattered into the buffers posted for it. RDMA READ/WRITE are not
//! served yet (`ENOSYS`).
#![allow(clippy::missing_safety_doc)] // the safety contract of each function is libibverbs' C one

use std::collections::{HashMap, VecDeque};
use std::ffi::{c_int, c_void};
use std::ptr;
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use crate::abi::*;
use crate::ffi::{fail, lock, registry, rpc, unsupported};
use crate::proto::{self, Dec, Enc, Op};
use crate::sock::{self, SeqConn};

const IBV_WR_RDMA_WRITE: u32 = 0;
const IBV_QPT_UD: u32 = 4;
const IBV_WR_SEND: u32 = 2;
const IBV_WR_RDMA_READ: u32 = 4;
const IBV_WR_SEND_WITH_IMM: u32 = 3;
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
    let mut e = Enc::op(Op::RegMr);
    e.u64(addr as u64).u64(length as u64).u32(access as u32);
    let key = match rpc(&e).and_then(|b| Dec::new(&b).u32().map_err(|_| libc::EPROTO)) {
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

/// `ibv_dereg_mr`.
#[no_mangle]
pub unsafe extern "C" fn ibv_dereg_mr(mr: *mut IbvMr) -> c_int {
    if mr.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: mr came from ibv_reg_mr and is given back once.
    let mr = unsafe { Box::from_raw(mr) };
    let mut e = Enc::op(Op::DeregMr);
    e.u32(mr.lkey);
    rpc(&e).err().unwrap_or(0)
}

/// `ibv_create_cq`.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_cq(
    context: *mut c_void,
    cqe: c_int,
    cq_context: *mut c_void,
    channel: *mut IbvCompChannel,
    _comp_vector: c_int,
) -> *mut IbvCq {
    let channel_token = if channel.is_null() {
        0
    } else {
        // SAFETY: channel came from ibv_create_comp_channel.
        unsafe { (*(channel as *mut CompChannelPriv)).token }
    };
    let mut e = Enc::op(Op::CreateCq);
    e.u32(cqe.max(1) as u32).u64(channel_token);
    let token = match rpc(&e).and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO)) {
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
    let mut e = Enc::op(Op::DestroyCq);
    e.u64(token);
    match rpc(&e) {
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

/// `ops.post_send`: SEND and SEND_WITH_IMM; the bytes are gathered now, so the buffers are
/// free again as soon as this returns (stronger than verbs promises).
unsafe extern "C" fn post_send(qp: *mut IbvQp, wr: *mut IbvSendWr, bad_wr: *mut *mut IbvSendWr) -> c_int {
    // SAFETY: qp came from rdma_create_qp.
    let token = unsafe { qp_token(qp) };
    let mut cur = wr;
    while !cur.is_null() {
        // SAFETY: cur is the caller's work request list.
        let w = unsafe { &*cur };
        let signaled = (w.send_flags & IBV_SEND_SIGNALED != 0) as u8;
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
                // wr.ud: the address handle, remote_qpn, remote_qkey. QP numbers route; the
                // handle matters only for the multicast QPN, where it names the group.
                let ah = w.remote_addr as *const IbvAh;
                let group = if w.rkey == proto::MCAST_QPN && !ah.is_null() {
                    // SAFETY: the handle came from ibv_create_ah.
                    unsafe { (*ah).dgid }.to_vec()
                } else {
                    Vec::new()
                };
                let mut e = Enc::op(Op::PostSendUd);
                e.u64(token)
                    .u64(w.wr_id)
                    .u8(signaled)
                    .u32(w.rkey)
                    .u8(imm as u8)
                    .u32(w.imm_data)
                    .bytes(&data)
                    .bytes(&group);
                rpc(&e).err().unwrap_or(0)
            }
            IBV_WR_SEND | IBV_WR_SEND_WITH_IMM | IBV_WR_RDMA_WRITE => {
                let mut data = Vec::new();
                for s in &list {
                    // SAFETY: each SGE names memory of the caller's, readable for its length.
                    let bytes = unsafe { std::slice::from_raw_parts(s.addr as *const u8, s.length as usize) };
                    data.extend_from_slice(bytes);
                }
                let mut e;
                if w.opcode == IBV_WR_RDMA_WRITE {
                    e = Enc::op(Op::RdmaWrite);
                    e.u64(token)
                        .u64(w.wr_id)
                        .u8(signaled)
                        .u64(w.remote_addr)
                        .u32(w.rkey)
                        .bytes(&data);
                } else {
                    e = Enc::op(Op::PostSend);
                    e.u64(token).u64(w.wr_id).u8(signaled).bytes(&data);
                }
                rpc(&e).err().unwrap_or(0)
            }
            IBV_WR_RDMA_READ => {
                let pairs: Vec<(u64, u32)> = list.iter().map(|s| (s.addr, s.length)).collect();
                // SAFETY: the SGEs name the caller's registered buffers, writable for their
                // lengths until the READ completes.
                unsafe { rdma_read(token, w, &pairs, signaled) }
            }
            _ => {
                unsupported("ibv_post_send with an atomic or WRITE_WITH_IMM opcode");
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

/// An RDMA READ: the daemon reads the remote region, this library places the bytes, and only
/// then is the completion queued, so whoever polls it sees the data in place.
unsafe fn rdma_read(token: u64, w: &IbvSendWr, local: &[(u64, u32)], signaled: u8) -> c_int {
    // post_send has refused a total past max_msg_sz, so this sum fits.
    let len: u32 = local.iter().map(|s| s.1).sum();
    let mut e = Enc::op(Op::RdmaRead);
    e.u64(token).u64(w.remote_addr).u32(w.rkey).u32(len);
    let buf = match rpc(&e) {
        Ok(b) => b,
        Err(errno) => return errno,
    };
    let mut d = Dec::new(&buf);
    let (Ok(status), Ok(data)) = (d.u32(), d.bytes()) else {
        return libc::EPROTO;
    };
    // SAFETY: forwarded from the caller.
    unsafe { scatter(local, data) };
    let mut e = Enc::op(Op::RdmaReadDone);
    e.u64(token)
        .u64(w.wr_id)
        .u8(signaled)
        .u32(status)
        .u32(data.len() as u32);
    rpc(&e).err().unwrap_or(0)
}

/// `ibv_destroy_qp` on a QP `rdma_create_qp` made (rping destroys its QP this way).
#[no_mangle]
pub unsafe extern "C" fn ibv_destroy_qp(qp: *mut IbvQp) -> c_int {
    if qp.is_null() {
        return libc::EINVAL;
    }
    // SAFETY: qp came from rdma_create_qp.
    let token = unsafe { qp_token(qp) };
    let mut e = Enc::op(Op::DestroyQp);
    e.u64(token);
    if let Err(errno) = rpc(&e) {
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
        let mut e = Enc::op(Op::PostRecv);
        e.u64(token).u64(w.wr_id).u32(len);
        if let Err(errno) = rpc(&e) {
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

unsafe extern "C" fn post_srq_recv(_srq: *mut c_void, wr: *mut c_void, bad_wr: *mut *mut c_void) -> c_int {
    if !bad_wr.is_null() {
        // SAFETY: bad_wr is the caller's out pointer.
        unsafe { *bad_wr = wr };
    }
    unsupported("ibv_post_srq_recv");
    libc::ENOSYS
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
    let mut e = Enc::op(Op::PollCq);
    e.u64(token).u32(num_entries as u32);
    let buf = match rpc(&e) {
        Ok(b) => b,
        Err(errno) => return -errno,
    };
    let mut d = Dec::new(&buf);
    let Ok(n) = d.u32() else { return -libc::EPROTO };
    if n == 0 {
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
    for i in 0..n as usize {
        let Ok(w) = d.wc() else { return -libc::EPROTO };
        let mut status = w.status;
        if w.opcode == IBV_WC_RECV {
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
        // SAFETY: wc has room for num_entries entries and n <= num_entries.
        unsafe {
            *wc.add(i) = IbvWc {
                wr_id: w.wr_id,
                status,
                opcode: w.opcode,
                byte_len: w.byte_len,
                qp_num: w.id as u32,
                src_qp: w.src_qp,
                imm_data: w.imm_data,
                wc_flags: w.wc_flags,
                ..IbvWc::default()
            };
        }
    }
    n as c_int
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
    let mut e = Enc::op(Op::ReqNotifyCq);
    e.u64(token);
    rpc(&e).err().unwrap_or(0)
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
    let mut e = Enc::op(Op::AttachCompChannel);
    e.u64(proc).u64(token);
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
    let token = match rpc(&Enc::op(Op::CreateCompChannel))
        .and_then(|b| Dec::new(&b).u64().map_err(|_| libc::EPROTO))
    {
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
    let mut e = Enc::op(Op::DestroyCompChannel);
    // SAFETY: channel came from ibv_create_comp_channel.
    e.u64(unsafe { (*ch).token });
    if let Err(errno) = rpc(&e) {
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
/// `O_NONBLOCK`), with the application's CQ pointer and `cq_context`.
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
        match sock::recv_fd(fd, &mut buf, flags) {
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
    // SAFETY: qp came from rdma_create_qp; attr is NULL or the caller's ibv_qp_attr (state at
    // offset 0, cap at offset 36); init_attr is NULL or the caller's.
    unsafe {
        let q = &*(qp as *mut QpPriv);
        if !attr.is_null() {
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
    /// `grh.dgid` of the attributes: the group a multicast send goes to.
    dgid: [u8; 16],
}

fn new_ah(pd: *mut IbvPd, dgid: [u8; 16]) -> *mut IbvAh {
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
        dgid,
    }))
}

/// `ibv_create_ah`: address handles are nominal (UD sends are routed by the remote QP number).
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah(pd: *mut IbvPd, attr: *mut c_void) -> *mut IbvAh {
    let mut dgid = [0u8; 16];
    if !attr.is_null() {
        // SAFETY: attr is the caller's ibv_ah_attr; grh.dgid is its first 16 bytes.
        unsafe { ptr::copy_nonoverlapping(attr as *const u8, dgid.as_mut_ptr(), 16) };
    }
    new_ah(pd, dgid)
}

/// `ibv_create_ah_from_wc`: an address handle back to a datagram's sender.
#[no_mangle]
pub unsafe extern "C" fn ibv_create_ah_from_wc(
    pd: *mut IbvPd,
    _wc: *mut IbvWc,
    _grh: *mut c_void,
    _port_num: u8,
) -> *mut IbvAh {
    new_ah(pd, [0; 16])
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

/// `ibv_query_port`: the one port of the simulated device, active, RoCE (Ethernet link layer),
/// MTU 4096.
#[no_mangle]
pub unsafe extern "C" fn ibv_query_port(_context: *mut c_void, port_num: u8, attr: *mut u8) -> c_int {
    if attr.is_null() || port_num != 1 {
        return libc::EINVAL;
    }
    let mut a = [0u8; 48];
    a[0..4].copy_from_slice(&4u32.to_ne_bytes()); // state: IBV_PORT_ACTIVE
    a[4..8].copy_from_slice(&5u32.to_ne_bytes()); // max_mtu: IBV_MTU_4096
    a[8..12].copy_from_slice(&5u32.to_ne_bytes()); // active_mtu
    a[12..16].copy_from_slice(&1i32.to_ne_bytes()); // gid_tbl_len
    a[20..24].copy_from_slice(&proto::MAX_MESSAGE.to_ne_bytes()); // max_msg_sz
    a[32..34].copy_from_slice(&1u16.to_ne_bytes()); // pkey_tbl_len
    a[43] = 1; // active_width: 1X
    a[44] = 1; // active_speed
    a[45] = 5; // phys_state: LINK_UP
    a[46] = 2; // link_layer: IBV_LINK_LAYER_ETHERNET
               // SAFETY: attr is the caller's ibv_port_attr, at least the 48 bytes of its compat prefix.
    unsafe { ptr::copy_nonoverlapping(a.as_ptr(), attr, a.len()) };
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
    *PD.get_or_init(|| unsafe { ibv_alloc_pd(crate::ffi::device_context()) } as usize) as *mut c_void
}
