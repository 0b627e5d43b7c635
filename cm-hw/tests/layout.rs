//! ABI check: the sizes, alignments and field offsets of every rdma-sys type the backend touches,
//! and the enum values it relies on, against the installed C headers.
//!
//! rdma-sys declares several of these by hand (`rdma_cm_event`, `rdma_addr`, `rdma_ud_param`,
//! `ibv_wc`, `ibv_send_wr`, `ibv_ah_attr`, `ibv_gid`, ...) instead of generating them, so a header
//! change would go unnoticed by the compiler. This test writes a C program that prints the same
//! quantities with `sizeof`/`_Alignof`/`offsetof`, compiles it with the system C compiler (`$CC`,
//! default `cc`) against `<rdma/rdma_cma.h>` and `<infiniband/verbs.h>`, runs it and compares.

use std::mem::{align_of, offset_of, size_of};
use std::path::PathBuf;
use std::process::Command;

use cm_core::{CmEventType, PortSpace, WcOpcode, WcStatus};
use rdma_sys::*;

/// One quantity: the C expression that computes it and the Rust value.
type Check = (String, i64);

/// `sizeof` and `_Alignof` of a C type against a Rust type.
macro_rules! layout {
    ($out:ident, $c:literal, $t:ty) => {
        $out.push((format!("sizeof({})", $c), size_of::<$t>() as i64));
        $out.push((format!("_Alignof({})", $c), align_of::<$t>() as i64));
    };
}

/// Size, alignment and the offsets of fields named alike in C and Rust.
macro_rules! fields {
    ($out:ident, $c:literal, $t:ty; $($f:ident),* $(,)?) => {
        layout!($out, $c, $t);
        $( $out.push((format!("offsetof({}, {})", $c, stringify!($f)), offset_of!($t, $f) as i64)); )*
    };
}

/// The offset of C field `$cf` (possibly nested, or a member of an anonymous union) against a
/// Rust expression.
macro_rules! off {
    ($out:ident, $c:literal, $cf:expr, $rust:expr) => {
        $out.push((format!("offsetof({}, {})", $c, $cf), ($rust) as i64));
    };
}

/// A C constant against a Rust value.
macro_rules! val {
    ($out:ident, $c:expr, $rust:expr) => {
        $out.push((($c).to_string(), ($rust) as i64));
    };
}

fn checks() -> Vec<Check> {
    let mut v: Vec<Check> = Vec::new();

    // ---- librdmacm
    fields!(v, "struct rdma_event_channel", rdma_event_channel; fd);
    fields!(v, "struct rdma_cm_id", rdma_cm_id;
        verbs, channel, context, qp, route, ps, port_num, event, send_cq_channel, send_cq,
        recv_cq_channel, recv_cq, srq, pd, qp_type);
    fields!(v, "struct rdma_route", rdma_route; addr, path_rec, num_paths);
    layout!(v, "struct rdma_addr", rdma_addr);
    off!(
        v,
        "struct rdma_addr",
        "src_addr",
        offset_of!(rdma_addr, src_addr_union)
    );
    off!(
        v,
        "struct rdma_addr",
        "src_storage",
        offset_of!(rdma_addr, src_addr_union)
    );
    off!(
        v,
        "struct rdma_addr",
        "dst_addr",
        offset_of!(rdma_addr, dst_addr_union)
    );
    off!(
        v,
        "struct rdma_addr",
        "dst_storage",
        offset_of!(rdma_addr, dst_addr_union)
    );
    off!(v, "struct rdma_addr", "addr", offset_of!(rdma_addr, addr));
    off!(
        v,
        "struct rdma_addr",
        "addr.ibaddr",
        offset_of!(rdma_addr, addr) + offset_of!(addr_union_t, ibaddr)
    );
    v.push((
        "sizeof(((struct rdma_addr *)0)->src_storage)".into(),
        size_of::<src_addr_union_t>() as i64,
    ));
    v.push((
        "sizeof(((struct rdma_addr *)0)->dst_storage)".into(),
        size_of::<dst_addr_union_t>() as i64,
    ));
    fields!(v, "struct rdma_ib_addr", rdma_ib_addr; sgid, dgid, pkey);
    layout!(v, "union ibv_gid", ibv_gid);
    fields!(v, "struct rdma_cm_event", rdma_cm_event; id, listen_id, event, status, param);
    v.push((
        "sizeof(((struct rdma_cm_event *)0)->param)".into(),
        size_of::<param_t>() as i64,
    ));
    v.push((
        "_Alignof(((struct rdma_cm_event *)0)->param)".into(),
        align_of::<param_t>() as i64,
    ));
    off!(
        v,
        "struct rdma_cm_event",
        "param.conn",
        offset_of!(rdma_cm_event, param) + offset_of!(param_t, conn)
    );
    off!(
        v,
        "struct rdma_cm_event",
        "param.ud",
        offset_of!(rdma_cm_event, param) + offset_of!(param_t, ud)
    );
    fields!(v, "struct rdma_conn_param", rdma_conn_param;
        private_data, private_data_len, responder_resources, initiator_depth, flow_control,
        retry_count, rnr_retry_count, srq, qp_num);
    fields!(v, "struct rdma_ud_param", rdma_ud_param; private_data, private_data_len, ah_attr, qp_num, qkey);
    fields!(v, "struct ibv_ah_attr", ibv_ah_attr; grh, dlid, sl, src_path_bits, static_rate, is_global, port_num);
    fields!(v, "struct ibv_global_route", ibv_global_route; dgid, flow_label, sgid_index, hop_limit, traffic_class);

    // ---- verbs: QP creation, data path
    fields!(v, "struct ibv_qp_init_attr", ibv_qp_init_attr; qp_context, send_cq, recv_cq, srq, cap, qp_type, sq_sig_all);
    fields!(v, "struct ibv_qp_cap", ibv_qp_cap; max_send_wr, max_recv_wr, max_send_sge, max_recv_sge, max_inline_data);
    fields!(v, "struct ibv_sge", ibv_sge; addr, length, lkey);
    fields!(v, "struct ibv_recv_wr", ibv_recv_wr; wr_id, next, sg_list, num_sge);
    fields!(v, "struct ibv_send_wr", ibv_send_wr; wr_id, next, sg_list, num_sge, opcode, send_flags, wr, qp_type);
    off!(
        v,
        "struct ibv_send_wr",
        "imm_data",
        offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "invalidate_rkey",
        offset_of!(ibv_send_wr, imm_data_invalidated_rkey_union)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "bind_mw",
        offset_of!(ibv_send_wr, bind_mw_tso_union)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "tso",
        offset_of!(ibv_send_wr, bind_mw_tso_union)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "wr.ud.ah",
        offset_of!(ibv_send_wr, wr) + offset_of!(ud_t, ah)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "wr.ud.remote_qpn",
        offset_of!(ibv_send_wr, wr) + offset_of!(ud_t, remote_qpn)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "wr.rdma.rkey",
        offset_of!(ibv_send_wr, wr) + offset_of!(rdma_t, rkey)
    );
    off!(
        v,
        "struct ibv_send_wr",
        "wr.rdma.remote_addr",
        offset_of!(ibv_send_wr, wr) + offset_of!(rdma_t, remote_addr)
    );
    for (c, rust) in [
        ("remote_addr", offset_of!(atomic_t, remote_addr)),
        ("compare_add", offset_of!(atomic_t, compare_add)),
        ("swap", offset_of!(atomic_t, swap)),
        ("rkey", offset_of!(atomic_t, rkey)),
    ] {
        off!(
            v,
            "struct ibv_send_wr",
            format!("wr.atomic.{c}"),
            offset_of!(ibv_send_wr, wr) + rust
        );
    }
    v.push((
        "sizeof(((struct ibv_send_wr *)0)->wr)".into(),
        size_of::<wr_t>() as i64,
    ));
    fields!(v, "struct ibv_wc", ibv_wc;
        wr_id, status, opcode, vendor_err, byte_len, qp_num, src_qp, wc_flags, pkey_index, slid, sl,
        dlid_path_bits);
    off!(
        v,
        "struct ibv_wc",
        "imm_data",
        offset_of!(ibv_wc, imm_data_invalidated_rkey_union)
    );
    fields!(v, "struct ibv_mr", ibv_mr; context, pd, addr, length, handle, lkey, rkey);
    fields!(v, "struct ibv_pd", ibv_pd; context, handle);
    fields!(v, "struct ibv_cq", ibv_cq; context, channel, cq_context, handle, cqe);
    fields!(v, "struct ibv_qp", ibv_qp; context, qp_context, pd, send_cq, recv_cq, srq, handle, qp_num, state, qp_type);
    layout!(v, "struct ibv_device_attr", ibv_device_attr);
    off!(
        v,
        "struct ibv_device_attr",
        "max_qp_wr",
        offset_of!(ibv_device_attr, max_qp_wr)
    );
    off!(
        v,
        "struct ibv_device_attr",
        "max_srq_wr",
        offset_of!(ibv_device_attr, max_srq_wr)
    );
    off!(
        v,
        "struct ibv_device_attr",
        "max_srq_sge",
        offset_of!(ibv_device_attr, max_srq_sge)
    );
    // ---- verbs: one-sided work, SRQs, asynchronous events
    layout!(v, "struct ibv_qp_attr", ibv_qp_attr);
    off!(
        v,
        "struct ibv_qp_attr",
        "max_rd_atomic",
        offset_of!(ibv_qp_attr, max_rd_atomic)
    );
    fields!(v, "struct ibv_srq_attr", ibv_srq_attr; max_wr, max_sge, srq_limit);
    fields!(v, "struct ibv_srq_init_attr", ibv_srq_init_attr; srq_context, attr);
    fields!(v, "struct ibv_srq", ibv_srq; context, srq_context, pd, handle, events_completed);
    // The backend reads events into a struct of its own with the type as a plain u32 (see
    // sys/async_event.rs); it must have the C struct's layout, which rdma-sys' has.
    fields!(v, "struct ibv_async_event", ibv_async_event; element, event_type);
    val!(
        v,
        "sizeof(((struct ibv_async_event *)0)->event_type)",
        size_of::<u32>()
    );
    val!(v, "IBV_SRQ_LIMIT", ibv_srq_attr_mask::IBV_SRQ_LIMIT.0);
    val!(
        v,
        "IBV_QP_MAX_QP_RD_ATOMIC",
        ibv_qp_attr_mask::IBV_QP_MAX_QP_RD_ATOMIC.0
    );
    val!(v, "IBV_EVENT_SRQ_LIMIT_REACHED", 15);
    // rdma-sys' ibv_post_send / ibv_post_recv / ibv_poll_cq go through these function pointers.
    fields!(v, "struct ibv_context", ibv_context; device, ops, cmd_fd, async_fd, num_comp_vectors);
    fields!(v, "struct ibv_context_ops", ibv_context_ops; poll_cq, req_notify_cq, post_srq_recv, post_send, post_recv);

    // ---- sockets (libc's declarations, used through rdma_addr and for bind/resolve)
    fields!(v, "struct sockaddr_in", libc::sockaddr_in; sin_family, sin_port, sin_addr, sin_zero);
    fields!(v, "struct sockaddr_in6", libc::sockaddr_in6; sin6_family, sin6_port, sin6_flowinfo, sin6_addr, sin6_scope_id);
    layout!(v, "struct sockaddr_storage", libc::sockaddr_storage);
    val!(v, "AF_INET", libc::AF_INET);
    val!(v, "AF_INET6", libc::AF_INET6);

    // ---- constants: rdma-sys and cm-core against the headers
    // rdma-core v44's headers (Debian 12, the lab) end at TIMEWAIT_EXIT; the four newer numbers
    // are checked against rdma-core's HEAD in cm-core's own tests.
    for ty in CmEventType::ALL
        .into_iter()
        .filter(|ty| ty.raw() <= CmEventType::TimewaitExit.raw())
    {
        let c = format!("RDMA_CM_EVENT_{}", ty.name().trim_start_matches("RDMA_CM_EVENT_"));
        val!(v, c, ty.raw());
    }
    val!(
        v,
        "RDMA_CM_EVENT_CONNECT_REQUEST",
        rdma_cm_event_type::RDMA_CM_EVENT_CONNECT_REQUEST
    );
    for ps in PortSpace::ALL {
        val!(v, ps.name(), ps.raw());
    }
    val!(v, "RDMA_PS_TCP", rdma_port_space::RDMA_PS_TCP);
    let wc_names = [
        "IBV_WC_SUCCESS",
        "IBV_WC_LOC_LEN_ERR",
        "IBV_WC_LOC_QP_OP_ERR",
        "IBV_WC_LOC_EEC_OP_ERR",
        "IBV_WC_LOC_PROT_ERR",
        "IBV_WC_WR_FLUSH_ERR",
        "IBV_WC_MW_BIND_ERR",
        "IBV_WC_BAD_RESP_ERR",
        "IBV_WC_LOC_ACCESS_ERR",
        "IBV_WC_REM_INV_REQ_ERR",
        "IBV_WC_REM_ACCESS_ERR",
        "IBV_WC_REM_OP_ERR",
        "IBV_WC_RETRY_EXC_ERR",
        "IBV_WC_RNR_RETRY_EXC_ERR",
        "IBV_WC_LOC_RDD_VIOL_ERR",
        "IBV_WC_REM_INV_RD_REQ_ERR",
        "IBV_WC_REM_ABORT_ERR",
        "IBV_WC_INV_EECN_ERR",
        "IBV_WC_INV_EEC_STATE_ERR",
        "IBV_WC_FATAL_ERR",
        "IBV_WC_RESP_TIMEOUT_ERR",
        "IBV_WC_GENERAL_ERR",
        "IBV_WC_TM_ERR",
        "IBV_WC_TM_RNDV_INCOMPLETE",
    ];
    assert_eq!(wc_names.len(), WcStatus::ALL.len());
    for (name, st) in wc_names.iter().zip(WcStatus::ALL) {
        val!(v, name, st.raw());
    }
    val!(v, "IBV_WC_WR_FLUSH_ERR", ibv_wc_status::IBV_WC_WR_FLUSH_ERR);
    for op in WcOpcode::ALL {
        val!(v, op.name(), op.raw());
    }
    val!(
        v,
        "IBV_WC_RECV_RDMA_WITH_IMM",
        ibv_wc_opcode::IBV_WC_RECV_RDMA_WITH_IMM
    );
    val!(v, "IBV_WC_WITH_IMM", ibv_wc_flags::IBV_WC_WITH_IMM.0);
    for (name, op) in [
        ("IBV_WR_SEND", ibv_wr_opcode::IBV_WR_SEND),
        ("IBV_WR_SEND_WITH_IMM", ibv_wr_opcode::IBV_WR_SEND_WITH_IMM),
        ("IBV_WR_RDMA_WRITE", ibv_wr_opcode::IBV_WR_RDMA_WRITE),
        (
            "IBV_WR_RDMA_WRITE_WITH_IMM",
            ibv_wr_opcode::IBV_WR_RDMA_WRITE_WITH_IMM,
        ),
        ("IBV_WR_RDMA_READ", ibv_wr_opcode::IBV_WR_RDMA_READ),
        (
            "IBV_WR_ATOMIC_CMP_AND_SWP",
            ibv_wr_opcode::IBV_WR_ATOMIC_CMP_AND_SWP,
        ),
        (
            "IBV_WR_ATOMIC_FETCH_AND_ADD",
            ibv_wr_opcode::IBV_WR_ATOMIC_FETCH_AND_ADD,
        ),
    ] {
        val!(v, name, op);
    }
    val!(v, "IBV_SEND_SIGNALED", ibv_send_flags::IBV_SEND_SIGNALED.0);
    val!(v, "IBV_SEND_FENCE", ibv_send_flags::IBV_SEND_FENCE.0);
    // cm-core's Access carries verbs' bits.
    for (name, access) in [
        ("IBV_ACCESS_LOCAL_WRITE", cm_core::Access::LOCAL_WRITE),
        ("IBV_ACCESS_REMOTE_WRITE", cm_core::Access::REMOTE_WRITE),
        ("IBV_ACCESS_REMOTE_READ", cm_core::Access::REMOTE_READ),
        ("IBV_ACCESS_REMOTE_ATOMIC", cm_core::Access::REMOTE_ATOMIC),
    ] {
        val!(v, name, access.bits());
    }
    val!(
        v,
        "IBV_ACCESS_LOCAL_WRITE",
        ibv_access_flags::IBV_ACCESS_LOCAL_WRITE.0
    );
    val!(v, "IBV_QPT_RC", ibv_qp_type::IBV_QPT_RC);
    val!(v, "IBV_QPT_UD", ibv_qp_type::IBV_QPT_UD);
    val!(v, "IBV_QPS_ERR", ibv_qp_state::IBV_QPS_ERR);
    v
}

/// Compiles and runs a C program printing `exprs`, one value a line.
fn c_values(exprs: &[&str]) -> Vec<i64> {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join(format!("cm-hw-layout-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let src = dir.join("layout.c");
    let bin = dir.join("layout");
    let mut c = String::from(
        "#include <stddef.h>\n#include <stdio.h>\n#include <sys/socket.h>\n#include <netinet/in.h>\n\
         #include <infiniband/verbs.h>\n#include <rdma/rdma_cma.h>\n\nint main(void)\n{\n",
    );
    for e in exprs {
        c.push_str(&format!("\tprintf(\"%lld\\n\", (long long)({e}));\n"));
    }
    c.push_str("\treturn 0;\n}\n");
    std::fs::write(&src, c).unwrap();
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".into());
    let status = Command::new(&cc)
        .args(["-std=gnu11", "-O0", "-o"])
        .arg(&bin)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("running the C compiler `{cc}` (set CC to another): {e}"));
    assert!(status.success(), "compiling {} failed", src.display());
    let out = Command::new(&bin).output().expect("running the layout probe");
    assert!(out.status.success());
    let values: Vec<i64> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| l.trim().parse().unwrap())
        .collect();
    let _ = std::fs::remove_dir_all(&dir);
    values
}

#[test]
fn rdma_sys_layouts_and_constants_match_the_c_headers() {
    let checks = checks();
    let exprs: Vec<&str> = checks.iter().map(|(c, _)| c.as_str()).collect();
    let c = c_values(&exprs);
    assert_eq!(c.len(), checks.len(), "one value per expression");
    let mismatches: Vec<String> = checks
        .iter()
        .zip(&c)
        .filter(|((_, rust), c)| rust != *c)
        .map(|((expr, rust), c)| format!("{expr}: C {c}, Rust {rust}"))
        .collect();
    assert!(
        mismatches.is_empty(),
        "rdma-sys / cm-core disagree with the installed headers:\n  {}",
        mismatches.join("\n  ")
    );
    eprintln!(
        "{} sizes, offsets and constants match the C headers",
        checks.len()
    );
}
