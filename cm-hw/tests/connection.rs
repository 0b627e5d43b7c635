//! A whole connection over real hardware (Soft-RoCE is enough): resolve, connect with private
//! data, accept, exchange messages, disconnect with the flush, reject, and the refusals that
//! protect against librdmacm's hangs along the way.
//!
//! Needs an RDMA device and `CM_HW_ADDR` set to its IP address; otherwise each test prints
//! `skipped: ...` and passes. Server and client share one backend (and run in one thread).

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cm_core::{
    Call, ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, IdState, PortSpace,
    QpCaps, QpState, WcOpcode, WcStatus, WorkCompletion,
};
use cm_hw::HwBackend;

const T: Duration = Duration::from_secs(10);

/// The backend and the device address, or None (after saying why) when there is no device.
fn setup(test: &str) -> Option<(HwBackend, IpAddr)> {
    match cm_hw::probe() {
        Ok(()) => {}
        Err(CmError::NoRdmaDevice) => {
            eprintln!("skipped: {test}: no RDMA device");
            return None;
        }
        Err(e) => panic!("probe: {e}"),
    }
    let Ok(addr) = std::env::var("CM_HW_ADDR") else {
        eprintln!("skipped: {test}: set CM_HW_ADDR to the RDMA device's IP address");
        return None;
    };
    let ip = addr.parse().expect("CM_HW_ADDR is an IP address");
    Some((HwBackend::new().unwrap(), ip))
}

/// The next event on `ch`, which must be `ty`.
fn expect(hw: &mut HwBackend, ch: ChannelHandle, ty: CmEventType) -> CmEvent {
    let ev = hw
        .get_cm_event(ch, T)
        .unwrap()
        .unwrap_or_else(|| panic!("no {ty} within {T:?}"));
    assert_eq!(ev.event(), ty, "{ev} (status {})", ev.status());
    ev
}

/// Waits for `ty` on `ch`, acks it and returns its id.
fn expect_ack(hw: &mut HwBackend, ch: ChannelHandle, ty: CmEventType) -> IdHandle {
    let ev = expect(hw, ch, ty);
    let id = ev.id();
    hw.ack_cm_event(ev).unwrap();
    id
}

/// Polls until `n` completions arrived on `id`.
fn completions(hw: &mut HwBackend, id: IdHandle, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        let got = hw.poll_cq(id, &mut out, want, T).unwrap();
        assert!(got > 0, "{} of {n} completions within {T:?}: {out:?}", out.len());
    }
    out
}

/// A listener on the device address (kernel-picked port), its channel and its address.
fn listener(hw: &mut HwBackend, ip: IpAddr) -> (ChannelHandle, IdHandle, SocketAddr) {
    let ch = hw.create_event_channel().unwrap();
    let l = hw.create_id(ch, PortSpace::Tcp).unwrap();
    hw.bind_addr(l, SocketAddr::new(ip, 0)).unwrap();
    hw.listen(l, 8).unwrap();
    let addr = hw.get_local_addr(l).unwrap().expect("listener address");
    assert_eq!(hw.id_machine(l).unwrap().state(), IdState::Listen);
    (ch, l, addr)
}

/// A client id on its own channel with address and route resolved and a QP.
fn resolved_client(hw: &mut HwBackend, server: SocketAddr) -> (ChannelHandle, IdHandle) {
    let ch = hw.create_event_channel().unwrap();
    let c = hw.create_id(ch, PortSpace::Tcp).unwrap();
    hw.resolve_addr(c, None, server, Duration::from_secs(2)).unwrap();
    // Resolving the route before ADDR_RESOLVED was retrieved is refused (librdmacm would race).
    assert!(matches!(
        hw.resolve_route(c, Duration::from_secs(2)),
        Err(CmError::WrongState { .. })
    ));
    expect_ack(hw, ch, CmEventType::AddrResolved);
    assert!(hw.id_machine(c).unwrap().has_device());
    hw.resolve_route(c, Duration::from_secs(2)).unwrap();
    expect_ack(hw, ch, CmEventType::RouteResolved);
    assert_eq!(hw.get_peer_addr(c).unwrap(), Some(server));
    hw.create_qp(c, QpCaps::new()).unwrap();
    (ch, c)
}

#[test]
fn connect_exchange_disconnect() {
    let Some((mut hw, ip)) = setup("connect_exchange_disconnect") else {
        return;
    };
    let (sch, listener, server) = listener(&mut hw, ip);
    let (cch, client) = resolved_client(&mut hw, server);
    hw.post_recv(client, 10, 64).unwrap();
    assert_eq!(
        hw.connect(client, &ConnParam::new().with_private_data(&[7u8; 57])),
        Err(CmError::PrivateDataTooLong {
            call: Call::Connect,
            len: 57,
            max: 56
        })
    );
    hw.connect(client, &ConnParam::new().with_private_data(b"hello"))
        .unwrap();

    // Server: the request counts against the listener, which cannot be destroyed until acked.
    let req = expect(&mut hw, sch, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id(), Some(listener));
    assert_eq!(req.counted_id(), listener);
    assert_eq!(&req.private_data()[..5], b"hello");
    assert_eq!(req.private_data().len(), 56, "the IB CM pads REQ private data");
    let child = req.id();
    assert_eq!(hw.id_machine(child).unwrap().state(), IdState::Connect);
    assert_eq!(
        hw.destroy_id(listener),
        Err(CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 1
        })
    );
    // Its channel holds the listener and the new child.
    assert_eq!(
        hw.destroy_event_channel(sch),
        Err(CmError::ChannelBusy { ids: 2 })
    );
    hw.ack_cm_event(req).unwrap();
    assert_eq!(
        hw.accept(child, &ConnParam::new()),
        Err(CmError::NoQp { call: Call::Accept })
    );
    hw.create_qp(child, QpCaps::new()).unwrap();
    hw.post_recv(child, 20, 64).unwrap();
    hw.accept(child, &ConnParam::new().with_private_data(b"welcome"))
        .unwrap();

    let est = expect(&mut hw, cch, CmEventType::Established);
    assert_eq!(&est.private_data()[..7], b"welcome");
    hw.ack_cm_event(est).unwrap();
    assert_eq!(hw.id_machine(client).unwrap().qp(), Some(QpState::Rts));
    expect_ack(&mut hw, sch, CmEventType::Established);
    assert_eq!(hw.get_peer_addr(child).unwrap().map(|a| a.ip()), Some(ip));

    // Data both ways; each CQ reports its completions in order.
    assert!(matches!(
        hw.post_send(client, 1, &[0u8; 4097]),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    hw.post_send(client, 1, b"ping").unwrap();
    let c = completions(&mut hw, client, 1);
    assert_eq!(
        (c[0].wr_id, c[0].opcode, c[0].status),
        (1, WcOpcode::Send, WcStatus::Success)
    );
    let s = completions(&mut hw, child, 1);
    assert_eq!(
        (s[0].wr_id, s[0].opcode, s[0].status),
        (20, WcOpcode::Recv, WcStatus::Success)
    );
    assert_eq!((s[0].byte_len, s[0].data.as_slice()), (4, &b"ping"[..]));
    hw.post_send(child, 2, b"pong!").unwrap();
    let mut both = completions(&mut hw, child, 1);
    both.extend(completions(&mut hw, client, 1));
    assert_eq!((both[0].wr_id, both[0].opcode), (2, WcOpcode::Send));
    assert_eq!((both[1].wr_id, both[1].data.as_slice()), (10, &b"pong!"[..]));

    // Waiting for a completion that does not come is bounded.
    let start = std::time::Instant::now();
    assert_eq!(
        hw.poll_cq(child, &mut Vec::new(), 4, Duration::from_millis(50)),
        Ok(0)
    );
    assert!(start.elapsed() >= Duration::from_millis(50) && start.elapsed() < Duration::from_secs(2));

    // The send queue holds max_send_wr requests; the next is refused until completions are
    // polled (the server has receives for all of them: 16 posted below, one each).
    for wr in 0..16 {
        hw.post_recv(child, 100 + wr, 64).unwrap();
    }
    for wr in 0..16 {
        hw.post_send(client, 200 + wr, &[wr as u8; 8]).unwrap();
    }
    assert_eq!(
        hw.post_send(client, 999, b"x"),
        Err(CmError::QueueFull {
            call: Call::PostSend,
            outstanding: 16
        })
    );
    let sent = completions(&mut hw, client, 16);
    assert!(sent
        .iter()
        .all(|c| c.status == WcStatus::Success && c.opcode == WcOpcode::Send));
    assert_eq!(
        sent.iter().map(|c| c.wr_id).collect::<Vec<_>>(),
        (200..216).collect::<Vec<_>>()
    );
    let got = completions(&mut hw, child, 16);
    for (i, c) in got.iter().enumerate() {
        assert_eq!(
            (c.wr_id, c.byte_len, c.data.as_slice()),
            (100 + i as u64, 8, &[i as u8; 8][..])
        );
    }

    // Disconnect: the client's QP goes to ERR and its posted receive flushes; the server hears
    // of it, disconnects too, and the client gets its DISCONNECTED. Requests posted in ERR
    // complete flushed too (rxe on Linux 6.1 would never complete such a receive: the backend
    // flushes them itself), each queue in posting order.
    hw.post_recv(client, 11, 64).unwrap();
    hw.disconnect(client).unwrap();
    assert_eq!(hw.id_machine(client).unwrap().qp(), Some(QpState::Err));
    hw.post_recv(client, 12, 64).unwrap();
    hw.post_send(client, 13, b"late").unwrap();
    hw.post_recv(client, 14, 64).unwrap();
    let f = completions(&mut hw, client, 4);
    assert!(
        f.iter()
            .all(|c| c.status == WcStatus::WrFlushErr && c.byte_len == 0 && c.data.is_empty()),
        "{f:?}"
    );
    let of = |op| {
        f.iter()
            .filter(|c| c.opcode == op)
            .map(|c| c.wr_id)
            .collect::<Vec<_>>()
    };
    assert_eq!(of(WcOpcode::Recv), [11, 12, 14]);
    assert_eq!(of(WcOpcode::Send), [13]);
    let disc = expect(&mut hw, sch, CmEventType::Disconnected);
    assert_eq!(disc.id(), child);
    hw.disconnect(child).unwrap();
    hw.destroy_qp(child).unwrap();
    // Destroying the child with its DISCONNECTED unacked would hang librdmacm: refused.
    assert_eq!(
        hw.destroy_id(child),
        Err(CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 1
        })
    );
    hw.ack_cm_event(disc).unwrap();
    expect_ack(&mut hw, cch, CmEventType::Disconnected);

    assert_eq!(hw.destroy_id(client), Err(CmError::QpAttached));
    hw.destroy_qp(client).unwrap();
    hw.destroy_id(client).unwrap();
    hw.destroy_id(child).unwrap();
    assert_eq!(
        hw.destroy_event_channel(sch),
        Err(CmError::ChannelBusy { ids: 1 })
    );
    hw.destroy_id(listener).unwrap();
    hw.destroy_event_channel(cch).unwrap();
    hw.destroy_event_channel(sch).unwrap();
    assert!(hw.live_resources().is_clean(), "{:?}", hw.live_resources());
}

#[test]
fn reject_reaches_the_client_with_private_data() {
    let Some((mut hw, ip)) = setup("reject_reaches_the_client_with_private_data") else {
        return;
    };
    let (sch, listener, server) = listener(&mut hw, ip);
    let (cch, client) = resolved_client(&mut hw, server);
    hw.connect(client, &ConnParam::new()).unwrap();
    let child = expect_ack(&mut hw, sch, CmEventType::ConnectRequest);
    hw.reject(child, b"go away").unwrap();
    assert!(matches!(
        hw.accept(child, &ConnParam::new()),
        Err(CmError::WrongState {
            call: Call::Accept,
            ..
        })
    ));
    let rej = expect(&mut hw, cch, CmEventType::Rejected);
    assert_eq!(rej.status(), 28, "consumer-defined reject");
    assert_eq!(&rej.private_data()[..7], b"go away");
    hw.ack_cm_event(rej).unwrap();
    assert_eq!(hw.id_machine(client).unwrap().qp(), Some(QpState::Err));
    assert!(matches!(
        hw.connect(client, &ConnParam::new()),
        Err(CmError::WrongState { .. })
    ));
    hw.destroy_id(child).unwrap();
    hw.destroy_qp(client).unwrap();
    hw.destroy_id(client).unwrap();
    hw.destroy_id(listener).unwrap();
    hw.destroy_event_channel(cch).unwrap();
    hw.destroy_event_channel(sch).unwrap();
    assert!(hw.live_resources().is_clean());
}

#[test]
fn dropping_the_backend_mid_connection_does_not_hang() {
    let Some((mut hw, ip)) = setup("dropping_the_backend_mid_connection_does_not_hang") else {
        return;
    };
    let (sch, _listener, server) = listener(&mut hw, ip);
    let (_cch, client) = resolved_client(&mut hw, server);
    hw.post_recv(client, 1, 64).unwrap();
    hw.connect(client, &ConnParam::new()).unwrap();
    // Hold the request unacked, with QPs, ids and channels all live: Drop must release them all.
    let req = expect(&mut hw, sch, CmEventType::ConnectRequest);
    hw.create_qp(req.id(), QpCaps::new()).unwrap();
    let _never_acked = req;
    let live = hw.live_resources();
    assert_eq!(
        (live.channels, live.ids, live.qps, live.unacked_events),
        (2, 3, 2, 1)
    );
    let (tx, rx) = std::sync::mpsc::channel();
    // The backend is not Send: drop it here and let a watchdog thread report a hang.
    let watchdog = std::thread::spawn(move || rx.recv_timeout(Duration::from_secs(30)).is_ok());
    drop(hw);
    tx.send(()).unwrap();
    assert!(watchdog.join().unwrap(), "dropping the backend took over 30 s");
}

#[test]
fn wildcard_listener_accepts_on_the_device() {
    let Some((mut hw, ip)) = setup("wildcard_listener_accepts_on_the_device") else {
        return;
    };
    let sch = hw.create_event_channel().unwrap();
    let l = hw.create_id(sch, PortSpace::Tcp).unwrap();
    let any = if ip.is_ipv4() { "0.0.0.0:0" } else { "[::]:0" };
    hw.bind_addr(l, any.parse().unwrap()).unwrap();
    assert!(
        !hw.id_machine(l).unwrap().has_device(),
        "a wildcard bind has no device"
    );
    assert_eq!(
        hw.create_qp(l, QpCaps::new()),
        Err(CmError::NoDevice { call: Call::CreateQp })
    );
    hw.listen(l, 0).unwrap();
    let port = hw.get_local_addr(l).unwrap().expect("bound").port();
    assert_ne!(port, 0);
    let (cch, c) = resolved_client(&mut hw, SocketAddr::new(ip, port));
    hw.connect(c, &ConnParam::new()).unwrap();
    let child = expect_ack(&mut hw, sch, CmEventType::ConnectRequest);
    assert!(
        hw.id_machine(child).unwrap().has_device(),
        "the child is on the device"
    );
    assert_eq!(hw.get_local_addr(child).unwrap(), Some(SocketAddr::new(ip, port)));
    hw.create_qp(child, QpCaps::new()).unwrap();
    hw.accept(child, &ConnParam::new()).unwrap();
    expect_ack(&mut hw, cch, CmEventType::Established);
    expect_ack(&mut hw, sch, CmEventType::Established);
    // Teardown by drop, mid-connection.
}

#[test]
fn datagram_lookup_carries_ud_parameters() {
    let Some((mut hw, ip)) = setup("datagram_lookup_carries_ud_parameters") else {
        return;
    };
    let sch = hw.create_event_channel().unwrap();
    let l = hw.create_id(sch, PortSpace::Udp).unwrap();
    hw.bind_addr(l, SocketAddr::new(ip, 0)).unwrap();
    hw.listen(l, 8).unwrap();
    let server = hw.get_local_addr(l).unwrap().unwrap();

    let cch = hw.create_event_channel().unwrap();
    let c = hw.create_id(cch, PortSpace::Udp).unwrap();
    hw.resolve_addr(c, None, server, Duration::from_secs(2)).unwrap();
    expect_ack(&mut hw, cch, CmEventType::AddrResolved);
    hw.resolve_route(c, Duration::from_secs(2)).unwrap();
    expect_ack(&mut hw, cch, CmEventType::RouteResolved);
    hw.create_qp(c, QpCaps::new()).unwrap();
    assert_eq!(
        hw.id_machine(c).unwrap().qp(),
        Some(QpState::Rts),
        "UD QPs are ready at once"
    );
    assert!(matches!(
        hw.post_send(c, 1, b"x"),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    assert_eq!(
        hw.connect(c, &ConnParam::new().with_private_data(&[1u8; 181])),
        Err(CmError::PrivateDataTooLong {
            call: Call::Connect,
            len: 181,
            max: 180
        })
    );
    hw.connect(c, &ConnParam::new().with_private_data(b"lookup"))
        .unwrap();

    let req = expect(&mut hw, sch, CmEventType::ConnectRequest);
    assert_eq!(&req.private_data()[..6], b"lookup");
    let child = req.id();
    hw.ack_cm_event(req).unwrap();
    hw.create_qp(child, QpCaps::new()).unwrap();
    hw.accept(child, &ConnParam::new().with_private_data(b"found"))
        .unwrap();

    let est = expect(&mut hw, cch, CmEventType::Established);
    assert_eq!(&est.private_data()[..5], b"found");
    assert_ne!(est.param().qp_num, 0, "the remote UD QP number");
    hw.ack_cm_event(est).unwrap();

    for id in [c, child] {
        hw.destroy_qp(id).unwrap();
        hw.destroy_id(id).unwrap();
    }
    hw.destroy_id(l).unwrap();
    hw.destroy_event_channel(cch).unwrap();
    hw.destroy_event_channel(sch).unwrap();
    assert!(hw.live_resources().is_clean());
}
