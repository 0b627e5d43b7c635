//! The rules written out as tables, each row from rxe's source rather than from the functions:
//! the responder's answer for every check in its order, the sequence of requests, when the
//! requester starts its next work request, and what completions report.

use super::*;

const REGION: KeyedRegion = KeyedRegion {
    addr: 0x1000,
    len: 64,
    access: Access::ALL,
};

/// A ready responder that grants everything and has a receive posted.
const READY: Responder = Responder {
    ready: true,
    access: qp_access(16),
    max_dest_rd_atomic: 16,
    has_recv: true,
};

fn req(op: RemoteOp, addr: u64, len: u64) -> Request {
    Request {
        op,
        addr,
        rkey: 0x101,
        len,
    }
}

fn fail(status: WcStatus, takes_recv: bool) -> Verdict {
    Verdict::Fail { status, takes_recv }
}

fn exec(offset: u64, takes_recv: bool) -> Verdict {
    Verdict::Execute { offset, takes_recv }
}

use RemoteOp::*;
use WcStatus::{RemAccessErr, RemInvReqErr};

#[test]
fn qp_access_follows_the_responder_resources() {
    assert_eq!(qp_access(0), Access::REMOTE_WRITE);
    let all = qp_access(1);
    for flag in [Access::REMOTE_WRITE, Access::REMOTE_READ, Access::REMOTE_ATOMIC] {
        assert!(all.contains(flag), "{flag}");
    }
    assert!(!all.contains(Access::LOCAL_WRITE));
    assert_eq!(qp_access(128), all);
}

#[test]
fn a_ready_responder_executes_what_its_region_allows_at_the_offset_named() {
    let rows = [
        (req(Write, 0x1000, 64), exec(0, false)),
        (req(Write, 0x1010, 16), exec(0x10, false)),
        (req(WriteWithImm, 0x1008, 8), exec(8, true)),
        (req(Read, 0x103F, 1), exec(0x3F, false)),
        (req(Atomic, 0x1038, 0), exec(0x38, false)),
        (req(Atomic, 0x1000, 8), exec(0, false)),
    ];
    for (r, want) in rows {
        assert_eq!(respond(&r, &READY, Some(REGION)), want, "{r:?}");
    }
}

#[test]
fn a_responder_not_ready_drops_everything_before_any_other_check() {
    let not_ready = Responder {
        ready: false,
        access: Access::NONE,
        max_dest_rd_atomic: 0,
        has_recv: false,
    };
    for op in [Write, WriteWithImm, Read, Atomic] {
        for region in [None, Some(REGION)] {
            assert_eq!(respond(&req(op, 0, 0), &not_ready, region), Verdict::Drop);
            assert_eq!(respond(&req(op, 0x1000, 8), &not_ready, region), Verdict::Drop);
        }
    }
}

#[test]
fn the_qp_access_flags_are_checked_first_even_at_length_zero() {
    // check_op_valid comes before check_resource and check_rkey: UNSUPPORTED_OPCODE, a NAK
    // with NAK_INVALID_REQ, REM_INV_REQ_ERR at the requester; no receive is taken.
    let write_only = Responder {
        access: Access::REMOTE_WRITE,
        ..READY
    };
    for (op, len) in [(Read, 0), (Read, 8), (Atomic, 8)] {
        assert_eq!(
            respond(&req(op, 0x1000, len), &write_only, Some(REGION)),
            fail(RemInvReqErr, false),
            "{op:?}"
        );
    }
    let no_write = Responder {
        access: Access::REMOTE_READ,
        ..READY
    };
    for op in [Write, WriteWithImm] {
        assert_eq!(
            respond(&req(op, 0, 0), &no_write, None),
            fail(RemInvReqErr, false),
            "{op:?}"
        );
    }
    assert_eq!(
        respond(&req(Read, 0x1000, 8), &write_only, None),
        fail(RemInvReqErr, false),
        "before the key"
    );
}

#[test]
fn reads_and_atomics_need_responder_resources_and_writes_with_immediate_a_receive() {
    let no_resources = Responder {
        max_dest_rd_atomic: 0,
        ..READY
    };
    for op in [Read, Atomic] {
        // TOO_MANY_RDMA_ATM_REQ, before the key.
        assert_eq!(
            respond(&req(op, 0x1000, 8), &no_resources, None),
            fail(RemInvReqErr, false),
            "{op:?}"
        );
    }
    assert_eq!(
        respond(&req(Read, 0, 0), &no_resources, None),
        fail(RemInvReqErr, false),
        "a zero-length READ too"
    );
    assert_eq!(
        respond(&req(Write, 0x1000, 8), &no_resources, Some(REGION)),
        exec(0, false)
    );
    let no_recv = Responder {
        has_recv: false,
        ..READY
    };
    for r in [req(WriteWithImm, 0x1000, 8), req(WriteWithImm, 0, 0)] {
        // The RNR NAK comes before the key: a bad key with no receive is receiver-not-ready.
        assert_eq!(respond(&r, &no_recv, None), Verdict::ReceiverNotReady);
        assert_eq!(respond(&r, &no_recv, Some(REGION)), Verdict::ReceiverNotReady);
    }
    assert_eq!(
        respond(&req(Write, 0x1000, 8), &no_recv, Some(REGION)),
        exec(0, false),
        "a plain WRITE takes no receive"
    );
}

#[test]
fn a_key_naming_no_region_that_allows_the_whole_range_is_a_remote_access_error() {
    let read_only = KeyedRegion {
        access: Access::REMOTE_READ,
        ..REGION
    };
    let write_only = KeyedRegion {
        access: Access::LOCAL_WRITE | Access::REMOTE_WRITE,
        ..REGION
    };
    let rows: [(Request, Option<KeyedRegion>, Verdict); 14] = [
        // No region (unknown, stale or another device's key).
        (req(Write, 0x1000, 8), None, fail(RemAccessErr, false)),
        (req(Read, 0x1000, 8), None, fail(RemAccessErr, false)),
        (req(Atomic, 0x1000, 8), None, fail(RemAccessErr, false)),
        // The receive is taken before the key is checked, and fails with it.
        (req(WriteWithImm, 0x1000, 8), None, fail(RemAccessErr, true)),
        // The region lacks the flag.
        (req(Write, 0x1000, 8), Some(read_only), fail(RemAccessErr, false)),
        (req(Atomic, 0x1000, 8), Some(read_only), fail(RemAccessErr, false)),
        (req(Read, 0x1000, 8), Some(write_only), fail(RemAccessErr, false)),
        (
            req(WriteWithImm, 0x1000, 8),
            Some(read_only),
            fail(RemAccessErr, true),
        ),
        // The range, all of it.
        (req(Write, 0x0FFF, 2), Some(REGION), fail(RemAccessErr, false)),
        (req(Write, 0x1001, 64), Some(REGION), fail(RemAccessErr, false)),
        (req(Read, 0x1040, 1), Some(REGION), fail(RemAccessErr, false)),
        (req(Atomic, 0x1040, 8), Some(REGION), fail(RemAccessErr, false)),
        (req(Read, u64::MAX, 2), Some(REGION), fail(RemAccessErr, false)),
        (
            req(Write, 0x1000, u64::MAX),
            Some(REGION),
            fail(RemAccessErr, false),
        ),
    ];
    for (r, region, want) in rows {
        assert_eq!(respond(&r, &READY, region), want, "{r:?} on {region:?}");
    }
}

#[test]
fn a_zero_length_read_or_write_skips_the_key_but_an_atomic_does_not() {
    for op in [Write, Read, WriteWithImm] {
        let takes_recv = op == WriteWithImm;
        // Any key and address: check_rkey returns before the lookup when the length is 0.
        assert_eq!(
            respond(&req(op, 0xDEAD_0000, 0), &READY, None),
            exec(0, takes_recv),
            "{op:?}"
        );
    }
    assert_eq!(
        respond(&req(Atomic, 0xDEAD_0000, 0), &READY, None),
        fail(RemAccessErr, false),
        "an atomic is 8 bytes whatever its length says"
    );
}

#[test]
fn an_unaligned_atomic_is_an_invalid_request_after_the_key() {
    assert_eq!(
        respond(&req(Atomic, 0x1004, 8), &READY, Some(REGION)),
        fail(RemInvReqErr, false)
    );
    assert_eq!(
        respond(&req(Atomic, 0x1004, 8), &READY, None),
        fail(RemAccessErr, false),
        "the key is checked first"
    );
    assert_eq!(
        respond(&req(Read, 0x1004, 8), &READY, Some(REGION)),
        exec(4, false),
        "reads may be unaligned"
    );
}

#[test]
fn requests_are_next_duplicates_or_ahead_of_the_expected_number() {
    let rows = [
        (0, 0, Sequence::Next),
        (5, 5, Sequence::Next),
        (4, 5, Sequence::Duplicate),
        (0, 5, Sequence::Duplicate),
        (6, 5, Sequence::Ahead),
        (u64::MAX, 0, Sequence::Ahead),
    ];
    for (psn, expected, want) in rows {
        assert_eq!(sequence(psn, expected), want, "{psn} expecting {expected}");
    }
}

#[test]
fn initiator_depth_rounds_up_to_a_power_of_two() {
    let rows = [
        (0, 0),
        (1, 1),
        (2, 2),
        (3, 4),
        (5, 8),
        (16, 16),
        (100, 128),
        (128, 128),
        (129, 256),
        (255, 256),
    ];
    for (depth, limit) in rows {
        assert_eq!(depth_limit(depth), limit, "{depth}");
    }
}

#[test]
fn the_next_request_starts_when_fence_depth_and_two_sided_order_allow() {
    let idle = Pipeline {
        started: 0,
        reads: 0,
        depth: 3,
        failed: false,
    };
    let one_write = Pipeline { started: 1, ..idle };
    let one_read = Pipeline {
        started: 1,
        reads: 1,
        ..idle
    };
    // Depth 3 rounds up to 4.
    let three_reads = Pipeline {
        started: 5,
        reads: 3,
        ..idle
    };
    let four_reads = Pipeline {
        started: 4,
        reads: 4,
        ..idle
    };
    let failed = Pipeline { failed: true, ..idle };
    let write = Next::OneSided {
        reads: false,
        fence: false,
    };
    let fenced_write = Next::OneSided {
        reads: false,
        fence: true,
    };
    let read = Next::OneSided {
        reads: true,
        fence: false,
    };
    let fenced_read = Next::OneSided {
        reads: true,
        fence: true,
    };
    let rows = [
        // Two-sided sends wait for every one-sided request in flight, READ or not.
        (Next::TwoSided, idle, true),
        (Next::TwoSided, one_write, false),
        (Next::TwoSided, one_read, false),
        // One-sided requests pipeline behind writes...
        (write, one_write, true),
        (read, one_write, true),
        (fenced_write, one_write, true),
        (fenced_read, one_write, true),
        // ...and behind reads, unless fenced.
        (write, one_read, true),
        (read, one_read, true),
        (fenced_write, one_read, false),
        (fenced_read, one_read, false),
        // At most the depth of reads and atomics.
        (read, three_reads, true),
        (read, four_reads, false),
        (write, four_reads, true),
        (fenced_write, four_reads, false),
        // Nothing after a request that failed before it left.
        (Next::TwoSided, failed, false),
        (write, failed, false),
        (read, failed, false),
    ];
    for (next, pipeline, want) in rows {
        assert_eq!(may_start(next, &pipeline), want, "{next:?} with {pipeline:?}");
    }
    let no_depth = Pipeline { depth: 0, ..idle };
    assert!(!may_start(read, &no_depth), "post refuses these; never started");
    assert!(may_start(write, &no_depth));
}

#[test]
fn completions_report_bytes_read_eight_for_atomics_and_nothing_else() {
    use WcOpcode::*;
    use WcStatus::{LocProtErr, Success, WrFlushErr};
    let rows = [
        (RdmaRead, 100, Success, true, (100, true)),
        (RdmaRead, 0, Success, true, (0, true)),
        (CompSwap, 8, Success, true, (8, true)),
        (FetchAdd, 8, Success, false, (8, false)),
        (RdmaWrite, 100, Success, true, (0, true)),
        (Send, 100, Success, true, (0, true)),
        (RdmaWrite, 100, Success, false, (0, false)),
        // Errors and flushes come out, unsignalled or not, with nothing counted.
        (RdmaRead, 100, RemAccessErr, false, (0, true)),
        (FetchAdd, 8, LocProtErr, true, (0, true)),
        (RdmaWrite, 100, WrFlushErr, false, (0, true)),
        (Send, 1, RemInvReqErr, false, (0, true)),
    ];
    for (opcode, len, status, signaled, want) in rows {
        assert_eq!(
            completion(opcode, len, status, signaled),
            want,
            "{opcode} {status:?} signaled={signaled}"
        );
    }
}

#[test]
fn atomics_swap_on_equality_and_add_wrapping() {
    let cas = AtomicOp::CompareSwap { compare: 5, swap: 9 };
    assert_eq!(cas.apply(5), 9);
    assert_eq!(cas.apply(6), 6);
    let faa = AtomicOp::FetchAdd { add: 3 };
    assert_eq!(faa.apply(1), 4);
    assert_eq!(faa.apply(u64::MAX), 2);
    assert_eq!(AtomicOp::FetchAdd { add: 0 }.apply(7), 7);
}
