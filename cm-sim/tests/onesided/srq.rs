//! Shared receive queues: several connections taking from one, its slots, its limit event, and
//! what a QP on one may and may not do.

use std::time::Duration;

use cm_core::{
    Access, AsyncEvent, Call, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdHandle, PortSpace,
    QpState, SendOp, SendWr, Sge, SrqCaps, WcOpcode, WcStatus,
};
use cm_sim::{SimFabric, SimHost};

use crate::support::*;

/// A server (host 0) whose children all take their receives from one SRQ, and `n` clients on
/// hosts 1..=n, each connected once.
struct Shared {
    fabric: SimFabric,
    server: SimHost,
    srq: cm_core::SrqHandle,
    children: Vec<IdHandle>,
    clients: Vec<(SimHost, IdHandle)>,
}

fn shared(seed: u64, n: usize, caps: SrqCaps) -> Shared {
    let mut b = builder(seed);
    for i in 2..=n {
        b = b.host(format!("10.0.0.{}", i + 1));
    }
    let fabric = b.build();
    let mut server = fabric.host(0);
    let sch = server.create_event_channel().unwrap();
    let listener = server.create_id(sch, PortSpace::Tcp).unwrap();
    server.bind_addr(listener, SERVER.parse().unwrap()).unwrap();
    server.listen(listener, 0).unwrap();
    let srq = server.create_srq(listener, caps).unwrap();
    let (mut children, mut clients) = (Vec::new(), Vec::new());
    for host in 1..=n {
        let mut c = fabric.host(host);
        let ch = c.create_event_channel().unwrap();
        let id = c.create_id(ch, PortSpace::Tcp).unwrap();
        c.resolve_addr(id, None, SERVER.parse().unwrap(), WAIT).unwrap();
        expect(&mut c, ch, CmEventType::AddrResolved);
        c.resolve_route(id, WAIT).unwrap();
        expect(&mut c, ch, CmEventType::RouteResolved);
        c.create_qp(id, Setup::default().caps).unwrap();
        c.connect(id, &ConnParam::new()).unwrap();
        let child = expect(&mut server, sch, CmEventType::ConnectRequest);
        server
            .create_qp_on_srq(child, Setup::default().caps, srq)
            .unwrap();
        server.accept(child, &ConnParam::new()).unwrap();
        expect(&mut c, ch, CmEventType::Established);
        expect(&mut server, sch, CmEventType::Established);
        children.push(child);
        clients.push((c, id));
    }
    Shared {
        fabric,
        server,
        srq,
        children,
        clients,
    }
}

#[test]
fn an_srq_shared_by_three_connections_completes_each_message_on_its_own_qp() {
    let mut s = shared(70, 3, SrqCaps::new().with_limit(2));
    for wr_id in 0..4 {
        s.server.post_srq_recv(s.srq, 100 + wr_id, 64).unwrap();
    }
    // Clients 0, 1, 2 send one message each: the SRQ's receives are taken in posting order.
    for (i, (c, id)) in s.clients.iter_mut().enumerate() {
        c.post_send(*id, i as u64, format!("from {i}").as_bytes())
            .unwrap();
        assert_eq!(poll(c, *id, 1)[0].status, WcStatus::Success);
    }
    for (i, child) in s.children.iter().enumerate() {
        let wcs = poll(&mut s.server, *child, 1);
        assert_eq!(
            summary(&wcs),
            [(100 + i as u64, WcOpcode::Recv, WcStatus::Success, 6)]
        );
        assert_eq!(wcs[0].data, format!("from {i}").as_bytes());
    }
    // The second take left 2 posted, the third 1 (< 2): one event, and the limit disarmed.
    let ev = s.server.get_async_event(Duration::ZERO).unwrap();
    assert_eq!(ev, Some(AsyncEvent::SrqLimitReached { srq: s.srq }));
    let (c, id) = &mut s.clients[0];
    c.post_send(*id, 9, b"last").unwrap();
    poll(c, *id, 1);
    poll(&mut s.server, s.children[0], 1);
    assert_eq!(
        s.server.get_async_event(Duration::from_millis(5)).unwrap(),
        None,
        "disarmed"
    );
}

#[test]
fn the_limit_fires_when_a_receive_is_taken_never_when_one_is_posted_and_may_be_armed_again() {
    let mut s = shared(71, 1, SrqCaps::new());
    for wr_id in 0..3 {
        s.server.post_srq_recv(s.srq, wr_id, 16).unwrap();
    }
    s.server.arm_srq_limit(s.srq, 3).unwrap();
    assert_eq!(
        s.server.get_async_event(Duration::ZERO).unwrap(),
        None,
        "posting never fires it"
    );
    // Waiting for an event takes virtual time, like get_cm_event.
    let before = s.fabric.now();
    assert_eq!(s.server.get_async_event(Duration::from_millis(3)).unwrap(), None);
    assert_eq!(
        s.fabric.now().since_start() - before.since_start(),
        Duration::from_millis(3)
    );
    let (c, id) = &mut s.clients[0];
    c.post_send(*id, 1, b"x").unwrap();
    poll(c, *id, 1);
    assert_eq!(
        s.server.get_async_event(Duration::ZERO).unwrap(),
        Some(AsyncEvent::SrqLimitReached { srq: s.srq })
    );
    s.server.arm_srq_limit(s.srq, 2).unwrap();
    c.post_send(*id, 2, b"y").unwrap();
    poll(c, *id, 1);
    // One left, fewer than 2: again, once.
    assert!(s.server.get_async_event(Duration::ZERO).unwrap().is_some());
    assert!(matches!(
        s.server.arm_srq_limit(s.srq, 65),
        Err(CmError::InvalidArgument {
            call: Call::ModifySrq,
            ..
        })
    ));
}

#[test]
fn an_srq_holds_at_most_max_wr_receives_until_their_completions_are_polled() {
    let caps = SrqCaps {
        max_wr: 2,
        max_message_size: 32,
        ..SrqCaps::new()
    };
    let mut s = shared(72, 1, caps);
    assert!(matches!(
        s.server.post_srq_recv(s.srq, 1, 33),
        Err(CmError::InvalidArgument {
            call: Call::PostSrqRecv,
            ..
        })
    ));
    s.server.post_srq_recv(s.srq, 1, 32).unwrap();
    s.server.post_srq_recv(s.srq, 2, 32).unwrap();
    let full = s.server.post_srq_recv(s.srq, 3, 32);
    assert_eq!(
        full,
        Err(CmError::QueueFull {
            call: Call::PostSrqRecv,
            outstanding: 2
        })
    );
    let (c, id) = &mut s.clients[0];
    c.post_send(*id, 1, b"a").unwrap();
    poll(c, *id, 1);
    // Taken but not polled: still held.
    assert!(matches!(
        s.server.post_srq_recv(s.srq, 3, 32),
        Err(CmError::QueueFull { .. })
    ));
    poll(&mut s.server, s.children[0], 1);
    s.server.post_srq_recv(s.srq, 3, 32).unwrap();
}

#[test]
fn a_send_waiting_for_a_receive_lands_when_one_is_posted_on_the_srq() {
    let mut s = shared(73, 2, SrqCaps::new());
    let (c, id) = &mut s.clients[1];
    c.post_send(*id, 5, b"waits").unwrap();
    nothing_more(c, *id, Duration::from_millis(10));
    s.server.post_srq_recv(s.srq, 50, 16).unwrap();
    let (c, id) = &mut s.clients[1];
    assert_eq!(poll(c, *id, 1)[0].status, WcStatus::Success);
    let wcs = poll(&mut s.server, s.children[1], 1);
    assert_eq!((wcs[0].wr_id, wcs[0].data.as_slice()), (50, &b"waits"[..]));
}

#[test]
fn a_write_with_immediate_to_a_qp_on_an_srq_takes_the_srqs_receive() {
    let mut s = shared(74, 1, SrqCaps::new());
    let region = s.server.reg_mr(s.children[0], 8, Access::ALL).unwrap();
    let to = s.server.mr_info(region).unwrap().remote().start();
    s.server.post_srq_recv(s.srq, 7, 1).unwrap();
    let (c, id) = &mut s.clients[0];
    let src = c.reg_mr(*id, 4, Access::NONE).unwrap();
    c.write_mr(src, 0, b"data").unwrap();
    let sge = [Sge::new(src, 0, 4)];
    let wr = SendWr::new(
        1,
        SendOp::Write {
            remote: to,
            imm: Some(3),
        },
        &sge,
    );
    c.post_send_wr(*id, &wr).unwrap();
    poll(c, *id, 1);
    let wcs = poll(&mut s.server, s.children[0], 1);
    assert_eq!(
        summary(&wcs),
        [(7, WcOpcode::RecvRdmaWithImm, WcStatus::Success, 4)]
    );
    assert_eq!(read_mr(&s.server, region, 0, 4), b"data");
}

#[test]
fn a_qp_on_an_srq_going_to_err_leaves_the_srqs_receives_to_the_others() {
    let mut s = shared(75, 2, SrqCaps::new());
    s.server.post_srq_recv(s.srq, 1, 8).unwrap();
    s.server.post_srq_recv(s.srq, 2, 8).unwrap();
    // The first connection ends; its QP flushes nothing of the SRQ's.
    let (c, id) = &mut s.clients[0];
    c.disconnect(*id).unwrap();
    let child = s.children[0];
    let mut out = Vec::new();
    s.server
        .poll_cq(child, &mut out, 8, Duration::from_millis(50))
        .unwrap();
    assert!(out.is_empty(), "{out:?}");
    // Nothing like LAST_WQE_REACHED either.
    assert_eq!(s.server.get_async_event(Duration::ZERO).unwrap(), None);
    let (c, id) = &mut s.clients[1];
    c.post_send(*id, 1, b"one").unwrap();
    c.post_send(*id, 2, b"two").unwrap();
    poll(c, *id, 2);
    let wcs = poll(&mut s.server, s.children[1], 2);
    assert_eq!(wcs.iter().map(|w| w.wr_id).collect::<Vec<_>>(), [1, 2]);
}

#[test]
fn a_qp_on_an_srq_posts_no_receives_of_its_own_and_the_srq_outlives_no_qp() {
    let mut s = shared(76, 1, SrqCaps::new());
    let child = s.children[0];
    let r = s.server.post_recv(child, 1, 8);
    assert!(
        matches!(
            r,
            Err(CmError::InvalidArgument {
                call: Call::PostRecv,
                ..
            })
        ),
        "{r:?}"
    );
    assert_eq!(s.server.destroy_srq(s.srq), Err(CmError::SrqBusy { qps: 1 }));
    assert_eq!(s.server.live_resources().srqs, 1);
    // A receive taken and never polled gives its slot back when the QP goes.
    s.server.post_srq_recv(s.srq, 1, 8).unwrap();
    let (c, id) = &mut s.clients[0];
    c.post_send(*id, 1, b"x").unwrap();
    poll(c, *id, 1);
    s.server.disconnect(child).unwrap();
    s.server.destroy_qp(child).unwrap();
    assert_eq!(s.server.destroy_srq(s.srq), Ok(()));
    assert_eq!(s.server.live_resources().srqs, 0);
    for r in [
        s.server.destroy_srq(s.srq),
        s.server.post_srq_recv(s.srq, 1, 8),
        s.server.arm_srq_limit(s.srq, 0),
    ] {
        assert!(
            matches!(
                r,
                Err(CmError::UnknownHandle {
                    kind: HandleKind::Srq,
                    ..
                })
            ),
            "{r:?}"
        );
    }
}

#[test]
fn srq_capabilities_are_checked_against_the_device_and_handles_against_the_host() {
    let mut p = connect(77);
    let bad = |r: cm_core::Result<cm_core::SrqHandle>| {
        matches!(
            r,
            Err(CmError::InvalidArgument {
                call: Call::CreateSrq,
                ..
            })
        )
    };
    assert!(bad(p.b.create_srq(
        p.b_id,
        SrqCaps {
            max_wr: (1 << 20) + 1,
            ..SrqCaps::new()
        }
    )));
    assert!(bad(p.b.create_srq(
        p.b_id,
        SrqCaps {
            max_sge: 28,
            ..SrqCaps::new()
        }
    )));
    assert!(bad(p.b.create_srq(p.b_id, SrqCaps::new().with_limit(65))));
    let max = SrqCaps {
        max_wr: 1 << 20,
        max_sge: 27,
        ..SrqCaps::new()
    };
    let srq = p.b.create_srq(p.b_id, max).unwrap();
    // Another host's SRQ is not this host's.
    let fresh = p.a.create_id(p.a_ch, PortSpace::Tcp).unwrap();
    p.a.bind_addr(fresh, "10.0.0.2:0".parse().unwrap()).unwrap();
    assert_eq!(
        p.a.create_qp_on_srq(fresh, cm_core::QpCaps::new(), srq),
        Err(CmError::UnknownHandle {
            call: Call::CreateQp,
            kind: HandleKind::Srq
        })
    );
    assert_eq!(
        p.a.post_srq_recv(srq, 1, 1),
        Err(CmError::UnknownHandle {
            call: Call::PostSrqRecv,
            kind: HandleKind::Srq
        })
    );
    // Before a device: none to make it on.
    let unbound = p.a.create_id(p.a_ch, PortSpace::Tcp).unwrap();
    assert!(matches!(
        p.a.create_srq(unbound, SrqCaps::new()),
        Err(CmError::NoDevice {
            call: Call::CreateSrq
        })
    ));
    assert_eq!(p.qp_b(), Some(QpState::Rts));
}
