//! An external QP for real (hardware runner only): each side creates its own CQ, memory region
//! and RC QP with raw rdma-sys verbs calls on the PD of [`HwBackend::raw_id`], moves the QP
//! through INIT, RTR and RTS with the attributes of `init_qp_attr` and `ibv_modify_qp`, connects
//! and accepts without a backend QP, establishes, and exchanges a message with raw posts; then
//! disconnects and frees everything. The way an application keeps its QPs in another verbs crate.
//!
//! Raw verbs need `unsafe`; every block says why it is sound. The objects are freed on every
//! path by [`RawQp`]'s `Drop`, before the ids are destroyed.

#![allow(unsafe_code)]

use std::ptr::{self, NonNull};
use std::time::{Duration, Instant};

use cm::api::{CmBackend, CmEventType, ConnParam, IdHandle, QpAttr, QpState};
use cm::hw::{ffi, HwBackend};

use crate::support::*;

const BUF: usize = 256;

/// A CQ, an MR over a buffer and an RC QP, made with raw verbs on an id's PD.
struct RawQp {
    cq: NonNull<ffi::ibv_cq>,
    qp: NonNull<ffi::ibv_qp>,
    mr: NonNull<ffi::ibv_mr>,
    buf: Box<[u8; BUF]>,
}

impl RawQp {
    fn new(hw: &HwBackend, id: IdHandle) -> RawQp {
        // SAFETY: the id outlives this RawQp (the test drops it before destroying the id) and
        // nothing here releases what the pointers name.
        let raw = unsafe { hw.raw_id(id) }.expect("raw_id");
        let verbs = raw.verbs.expect("the id has a device");
        let pd = raw.pd.expect("librdmacm's PD for the device");
        let mut buf = Box::new([0u8; BUF]);
        let access = ffi::ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0 as i32;
        // SAFETY: the PD is alive; the buffer is valid for BUF bytes and outlives the MR
        // (deregistered in Drop before the box is freed).
        let mr = unsafe { ffi::ibv_reg_mr(pd.as_ptr(), buf.as_mut_ptr().cast(), BUF, access) };
        let mr = NonNull::new(mr).expect("ibv_reg_mr");
        // SAFETY: the device context is open while the id lives.
        let cq = unsafe { ffi::ibv_create_cq(verbs.as_ptr(), 16, ptr::null_mut(), ptr::null_mut(), 0) };
        let cq = NonNull::new(cq).expect("ibv_create_cq");
        let mut attr = ffi::ibv_qp_init_attr {
            qp_context: ptr::null_mut(),
            send_cq: cq.as_ptr(),
            recv_cq: cq.as_ptr(),
            srq: ptr::null_mut(),
            cap: ffi::ibv_qp_cap {
                max_send_wr: 4,
                max_recv_wr: 4,
                max_send_sge: 1,
                max_recv_sge: 1,
                max_inline_data: 0,
            },
            qp_type: ffi::ibv_qp_type::IBV_QPT_RC,
            sq_sig_all: 1,
        };
        // SAFETY: PD and CQ are alive and on the same device; `attr` is valid for the call.
        let qp = unsafe { ffi::ibv_create_qp(pd.as_ptr(), &mut attr) };
        let qp = NonNull::new(qp).expect("ibv_create_qp");
        RawQp { cq, qp, mr, buf }
    }

    fn qp_num(&self) -> u32 {
        // SAFETY: the QP is alive; reading a plain field.
        unsafe { (*self.qp.as_ptr()).qp_num }
    }

    /// `ibv_modify_qp` with what `init_qp_attr` answered.
    fn modify(&self, attr: &QpAttr) {
        // SAFETY: all-zero is a valid ibv_qp_attr (integers, arrays, a union of them).
        let mut raw: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        raw.qp_state = match attr.qp_state.expect("a state") {
            QpState::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
            QpState::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
            QpState::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
            other => panic!("no transition to {other} here"),
        };
        raw.pkey_index = attr.pkey_index;
        raw.port_num = attr.port_num;
        raw.qp_access_flags = attr.qp_access_flags;
        raw.path_mtu = u32::from(attr.path_mtu);
        raw.dest_qp_num = attr.dest_qp_num;
        raw.rq_psn = attr.rq_psn;
        raw.sq_psn = attr.sq_psn;
        raw.timeout = attr.timeout;
        raw.retry_cnt = attr.retry_cnt;
        raw.rnr_retry = attr.rnr_retry;
        raw.max_rd_atomic = attr.max_rd_atomic;
        raw.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        raw.min_rnr_timer = attr.min_rnr_timer;
        raw.qkey = attr.qkey;
        let av = &attr.ah_attr;
        raw.ah_attr.dlid = av.dlid;
        raw.ah_attr.sl = av.sl;
        raw.ah_attr.src_path_bits = av.src_path_bits;
        raw.ah_attr.static_rate = av.static_rate;
        raw.ah_attr.port_num = av.port_num;
        if let Some(grh) = av.grh {
            raw.ah_attr.is_global = 1;
            raw.ah_attr.grh.dgid = ffi::ibv_gid { raw: grh.dgid };
            raw.ah_attr.grh.flow_label = grh.flow_label;
            raw.ah_attr.grh.sgid_index = grh.sgid_index;
            raw.ah_attr.grh.hop_limit = grh.hop_limit;
            raw.ah_attr.grh.traffic_class = grh.traffic_class;
        }
        // SAFETY: the QP is alive; `raw` is valid for the call and the mask names only fields
        // the kernel filled.
        let ret = unsafe { ffi::ibv_modify_qp(self.qp.as_ptr(), &mut raw, attr.mask.bits() as i32) };
        assert_eq!(
            ret, 0,
            "ibv_modify_qp to {:?} with mask {}",
            attr.qp_state, attr.mask
        );
    }

    fn post_recv(&mut self) {
        let mut sge = ffi::ibv_sge {
            addr: self.buf.as_mut_ptr() as u64,
            length: BUF as u32,
            // SAFETY: the MR is alive; reading its lkey.
            lkey: unsafe { (*self.mr.as_ptr()).lkey },
        };
        let mut wr = ffi::ibv_recv_wr {
            wr_id: 1,
            next: ptr::null_mut(),
            sg_list: &mut sge,
            num_sge: 1,
        };
        let mut bad = ptr::null_mut();
        // SAFETY: the QP is alive; WR and SGE live across the call; the SGE lies in the MR,
        // which stays registered until the QP is destroyed.
        let ret = unsafe { ffi::ibv_post_recv(self.qp.as_ptr(), &mut wr, &mut bad) };
        assert_eq!(ret, 0, "ibv_post_recv");
    }

    fn post_send(&mut self, msg: &[u8]) {
        self.buf[..msg.len()].copy_from_slice(msg);
        let mut sge = ffi::ibv_sge {
            addr: self.buf.as_mut_ptr() as u64,
            length: msg.len() as u32,
            // SAFETY: the MR is alive; reading its lkey.
            lkey: unsafe { (*self.mr.as_ptr()).lkey },
        };
        // SAFETY: all-zero is a valid ibv_send_wr (integers, NULL pointers, plain unions).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = 2;
        wr.sg_list = &mut sge;
        wr.num_sge = 1;
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        let mut bad = ptr::null_mut();
        // SAFETY: as for post_recv.
        let ret = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        assert_eq!(ret, 0, "ibv_post_send");
    }

    /// The next completion within a few seconds: (wr_id, status, byte_len).
    fn completion(&self) -> (u64, u32, u32) {
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let mut wc = std::mem::MaybeUninit::<ffi::ibv_wc>::uninit();
            // SAFETY: the CQ is alive; `wc` has room for one entry.
            let got = unsafe { ffi::ibv_poll_cq(self.cq.as_ptr(), 1, wc.as_mut_ptr()) };
            assert!(got >= 0, "ibv_poll_cq");
            if got == 1 {
                // SAFETY: ibv_poll_cq filled the entry.
                let wc = unsafe { wc.assume_init() };
                return (wc.wr_id, wc.status, wc.byte_len);
            }
            assert!(Instant::now() < deadline, "no completion within 5 s");
            std::thread::sleep(Duration::from_millis(1));
        }
    }
}

impl Drop for RawQp {
    fn drop(&mut self) {
        // SAFETY: each object was made in `new` and is freed once, QP before CQ and MR, while
        // the device context (held by the id, destroyed after this) is open.
        unsafe {
            ffi::ibv_destroy_qp(self.qp.as_ptr());
            ffi::ibv_destroy_cq(self.cq.as_ptr());
            ffi::ibv_dereg_mr(self.mr.as_ptr());
        }
    }
}

#[test]
fn an_rc_qp_made_with_raw_verbs_connects_through_init_qp_attr_and_establish_and_carries_a_message() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, false);

    let mut cqp = RawQp::new(&bed.client, client.id);
    cqp.modify(&bed.client.init_qp_attr(client.id, QpState::Init).unwrap());
    bed.client
        .connect(client.id, &ConnParam::new().with_qp_num(cqp.qp_num()))
        .expect("connect with the raw QP's number");

    let req = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest);
    assert_eq!(req.param.qp_num, cqp.qp_num());
    let child = req.id;
    let mut sqp = RawQp::new(&bed.server, child);
    for state in [QpState::Init, QpState::Rtr, QpState::Rts] {
        sqp.modify(&bed.server.init_qp_attr(child, state).unwrap());
        if state == QpState::Init {
            sqp.post_recv();
        }
    }
    bed.server
        .accept(child, &ConnParam::new().with_qp_num(sqp.qp_num()))
        .expect("accept with the raw QP's number");

    let rep = expect(&mut bed.client, client.ch, CmEventType::ConnectResponse);
    assert_eq!(rep.param.qp_num, sqp.qp_num());
    for state in [QpState::Rtr, QpState::Rts] {
        let attr = bed.client.init_qp_attr(client.id, state).unwrap();
        println!("client {state}: {attr:?}");
        cqp.modify(&attr);
    }
    bed.client.establish(client.id).expect("establish");
    expect(&mut bed.server, server.ch, CmEventType::Established);

    let msg = b"through an external QP";
    cqp.post_send(msg);
    let (wr, status, _) = cqp.completion();
    assert_eq!(
        (wr, status),
        (2, ffi::ibv_wc_status::IBV_WC_SUCCESS),
        "the send completes"
    );
    let (wr, status, len) = sqp.completion();
    assert_eq!(
        (wr, status, len as usize),
        (1, ffi::ibv_wc_status::IBV_WC_SUCCESS, msg.len())
    );
    assert_eq!(&sqp.buf[..msg.len()], msg);

    bed.client.disconnect(client.id).expect("client disconnect");
    expect(&mut bed.server, server.ch, CmEventType::Disconnected);
    bed.server.disconnect(child).expect("server disconnect");
    expect(&mut bed.client, client.ch, CmEventType::Disconnected);
    drop((cqp, sqp));
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_clean(&bed);
}
