//! Runs everywhere. Without an RDMA device: `probe` and the first channel say
//! [`CmError::NoRdmaDevice`], and misuse that needs no device gets its typed error. With one (a
//! Soft-RoCE VM): channels and ids really work, and misuse on real ids is refused before
//! librdmacm sees it. When `CM_HW_ADDR` names the device's IP address, binding is checked too.

use std::net::{IpAddr, SocketAddr};
use std::time::{Duration, Instant};

use cm_core::{
    Call, ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdHandle, IdState,
    PortSpace, QpCaps,
};
use cm_hw::HwBackend;

/// The device's address from `CM_HW_ADDR`, if set.
fn hw_addr() -> Option<IpAddr> {
    let s = std::env::var("CM_HW_ADDR").ok()?;
    Some(
        s.parse()
            .unwrap_or_else(|e| panic!("CM_HW_ADDR={s:?} is not an IP address: {e}")),
    )
}

fn unknown_id(call: Call) -> CmError {
    CmError::UnknownHandle {
        call,
        kind: HandleKind::Id,
    }
}

fn unknown_channel(call: Call) -> CmError {
    CmError::UnknownHandle {
        call,
        kind: HandleKind::Channel,
    }
}

/// Every call that takes an id refuses `id` as unknown, naming itself.
fn assert_unknown_id(hw: &mut HwBackend, id: IdHandle) {
    let t = Duration::from_millis(1);
    let a: SocketAddr = "127.0.0.1:7471".parse().unwrap();
    let p = ConnParam::new();
    assert_eq!(hw.destroy_id(id), Err(unknown_id(Call::DestroyId)));
    assert_eq!(hw.bind_addr(id, a), Err(unknown_id(Call::BindAddr)));
    assert_eq!(
        hw.resolve_addr(id, None, a, t),
        Err(unknown_id(Call::ResolveAddr))
    );
    assert_eq!(hw.resolve_route(id, t), Err(unknown_id(Call::ResolveRoute)));
    assert_eq!(hw.create_qp(id, QpCaps::new()), Err(unknown_id(Call::CreateQp)));
    assert_eq!(hw.destroy_qp(id), Err(unknown_id(Call::DestroyQp)));
    assert_eq!(hw.listen(id, 0), Err(unknown_id(Call::Listen)));
    assert_eq!(hw.connect(id, &p), Err(unknown_id(Call::Connect)));
    assert_eq!(hw.accept(id, &p), Err(unknown_id(Call::Accept)));
    assert_eq!(hw.reject(id, b"no"), Err(unknown_id(Call::Reject)));
    assert_eq!(hw.disconnect(id), Err(unknown_id(Call::Disconnect)));
    assert_eq!(hw.get_local_addr(id), Err(unknown_id(Call::GetLocalAddr)));
    assert_eq!(hw.get_peer_addr(id), Err(unknown_id(Call::GetPeerAddr)));
    assert_eq!(hw.post_send(id, 1, b"x"), Err(unknown_id(Call::PostSend)));
    assert_eq!(hw.post_recv(id, 1, 8), Err(unknown_id(Call::PostRecv)));
    assert_eq!(
        hw.poll_cq(id, &mut Vec::new(), 1, t),
        Err(unknown_id(Call::PollCq))
    );
    assert!(matches!(
        hw.id_machine(id),
        Err(CmError::UnknownHandle {
            kind: HandleKind::Id,
            ..
        })
    ));
}

/// Every call that takes a channel refuses `ch` as unknown, naming itself.
fn assert_unknown_channel(hw: &mut HwBackend, ch: ChannelHandle) {
    assert_eq!(
        hw.destroy_event_channel(ch),
        Err(unknown_channel(Call::DestroyEventChannel))
    );
    assert_eq!(
        hw.create_id(ch, PortSpace::Tcp),
        Err(unknown_channel(Call::CreateId))
    );
    assert_eq!(
        hw.get_cm_event(ch, Duration::from_millis(1)),
        Err(unknown_channel(Call::GetCmEvent))
    );
}

#[test]
fn handles_never_issued_here_are_unknown() {
    let mut hw = HwBackend::new().unwrap();
    // Tag 0 is never drawn by `next_backend_tag`, and nothing was created yet.
    assert_unknown_id(&mut hw, cm_core::backend::id_handle(0, 0, 0));
    assert_unknown_channel(&mut hw, cm_core::backend::channel_handle(0, 0, 0));
    assert_unknown_id(&mut hw, cm_core::backend::id_handle(u32::MAX, 7, 3));
    assert_unknown_channel(&mut hw, cm_core::backend::channel_handle(u32::MAX, 7, 3));
    // An event this backend never handed out, naming an id of no backend (owner tag 0): refused
    // as another backend's and handed back, as the simulator does.
    let forged = cm_core::backend::cm_event(
        cm_core::backend::id_handle(0, 0, 0),
        None,
        CmEventType::Established,
        0,
        ConnParam::new(),
        1,
    );
    assert!(
        matches!(hw.ack_cm_event(forged), Err(CmError::ForeignEvent(_))),
        "a forged event naming no id of this backend is refused as foreign"
    );
    assert!(hw.live_resources().is_clean());
    assert_eq!(hw.live_resources(), Default::default());
}

#[test]
fn probe_and_first_channel_agree() {
    let mut hw = HwBackend::new().expect("new needs no device");
    match cm_hw::probe() {
        Err(CmError::NoRdmaDevice) => {
            eprintln!("no RDMA device here: checking the no-device path");
            assert_eq!(HwBackend::probe(), Err(CmError::NoRdmaDevice));
            let err = hw.create_event_channel().unwrap_err();
            assert_eq!(err, CmError::NoRdmaDevice);
            assert_eq!(err.errno(), libc::ENODEV);
            assert!(err.to_string().contains("rdma link add"), "{err}");
            assert!(hw.live_resources().is_clean());
        }
        Ok(()) => {
            eprintln!("an RDMA device answers: checking real channels and ids");
            device_path(&mut hw);
        }
        Err(other) => panic!("probe failed with something other than NoRdmaDevice: {other}"),
    }
}

/// With a device: real objects, and misuse on them refused with the machine's errors.
fn device_path(hw: &mut HwBackend) {
    let t = Duration::from_millis(100);
    let ch = hw.create_event_channel().expect("probe said a device answers");
    let id = hw.create_id(ch, PortSpace::Tcp).unwrap();
    assert_eq!(hw.id_machine(id).unwrap().state(), IdState::Idle);
    assert_eq!(hw.live_resources().channels, 1);
    assert_eq!(hw.live_resources().ids, 1);

    // Misuse librdmacm would hang, crash or leak on.
    assert_eq!(hw.destroy_event_channel(ch), Err(CmError::ChannelBusy { ids: 1 }));
    assert!(matches!(
        hw.resolve_route(id, t),
        Err(CmError::WrongState {
            call: Call::ResolveRoute,
            state: IdState::Idle,
            ..
        })
    ));
    assert_eq!(
        hw.create_qp(id, QpCaps::new()),
        Err(CmError::NoDevice { call: Call::CreateQp })
    );
    assert_eq!(
        hw.destroy_qp(id),
        Err(CmError::NoQp {
            call: Call::DestroyQp
        })
    );
    assert!(matches!(
        hw.accept(id, &ConnParam::new()),
        Err(CmError::WrongState {
            call: Call::Accept,
            ..
        })
    ));
    assert!(matches!(
        hw.connect(id, &ConnParam::new()),
        Err(CmError::WrongState {
            call: Call::Connect,
            ..
        })
    ));
    assert!(matches!(
        hw.disconnect(id),
        Err(CmError::WrongState {
            call: Call::Disconnect,
            ..
        })
    ));
    assert_eq!(
        hw.post_send(id, 1, b"x"),
        Err(CmError::NoQp { call: Call::PostSend })
    );
    assert_eq!(
        hw.post_recv(id, 1, 8),
        Err(CmError::NoQp { call: Call::PostRecv })
    );
    assert_eq!(
        hw.poll_cq(id, &mut Vec::new(), 1, t),
        Err(CmError::NoQp { call: Call::PollCq })
    );
    assert_eq!(hw.get_local_addr(id), Ok(None));
    assert_eq!(hw.get_peer_addr(id), Ok(None));

    // Waiting is bounded.
    let start = Instant::now();
    assert_eq!(hw.get_cm_event(ch, t), Ok(None));
    let waited = start.elapsed();
    assert!(
        waited >= t && waited < t + Duration::from_secs(2),
        "waited {waited:?}"
    );
    assert_eq!(hw.get_cm_event(ch, Duration::ZERO), Ok(None));

    // Handles of another backend are foreign.
    let mut other = HwBackend::new().unwrap();
    let other_ch = other.create_event_channel().unwrap();
    let other_id = other.create_id(other_ch, PortSpace::Tcp).unwrap();
    assert_unknown_id(hw, other_id);
    assert_unknown_channel(hw, other_ch);
    drop(other); // releases its channel and id

    if let Some(ip) = hw_addr() {
        bound_checks(hw, ch, ip);
    } else {
        eprintln!("skipped: bind checks (set CM_HW_ADDR to the RDMA device's IP address)");
    }

    hw.destroy_id(id).unwrap();
    assert_unknown_id(hw, id);
    hw.destroy_event_channel(ch).unwrap();
    assert_unknown_channel(hw, ch);
    assert!(hw.live_resources().is_clean(), "{:?}", hw.live_resources());
}

/// Binding to the device's address gives the id a device: a QP can be made, and the id cannot
/// be destroyed under it.
fn bound_checks(hw: &mut HwBackend, ch: ChannelHandle, ip: IpAddr) {
    let a = hw.create_id(ch, PortSpace::Tcp).unwrap();
    hw.bind_addr(a, SocketAddr::new(ip, 0)).unwrap();
    let m = hw.id_machine(a).unwrap();
    assert_eq!(m.state(), IdState::AddrBound);
    assert!(m.has_device(), "binding to CM_HW_ADDR={ip} gave no RDMA device");
    let local = hw.get_local_addr(a).unwrap().expect("bound address");
    assert_eq!(local.ip(), ip);
    assert_ne!(local.port(), 0, "the kernel picks a port");

    // The same address and port again: in use.
    let b = hw.create_id(ch, PortSpace::Tcp).unwrap();
    assert_eq!(
        hw.bind_addr(b, local),
        Err(CmError::AddrInUse { call: Call::BindAddr })
    );
    assert_eq!(
        hw.id_machine(b).unwrap().state(),
        IdState::Idle,
        "a failed bind changes nothing"
    );
    hw.destroy_id(b).unwrap();

    let caps = hw.create_qp(a, QpCaps::new()).unwrap();
    assert_eq!(caps.max_send_wr, 16);
    assert_eq!(caps.max_recv_wr, 16);
    assert_eq!(caps.max_message_size, 4096);
    assert!(caps.max_send_sge >= 1 && caps.max_recv_sge >= 1);
    assert_eq!(hw.create_qp(a, QpCaps::new()), Err(CmError::QpExists));
    assert_eq!(hw.live_resources().qps, 1);
    // Not connected: the QP is in INIT, sends are refused, receives may be posted.
    assert!(matches!(
        hw.post_send(a, 1, b"x"),
        Err(CmError::WrongQpState {
            call: Call::PostSend,
            ..
        })
    ));
    assert!(matches!(
        hw.post_recv(a, 1, 5000),
        Err(CmError::InvalidArgument {
            call: Call::PostRecv,
            ..
        })
    ));
    for wr in 0..16 {
        hw.post_recv(a, wr, 64).unwrap();
    }
    assert_eq!(
        hw.post_recv(a, 99, 64),
        Err(CmError::QueueFull {
            call: Call::PostRecv,
            outstanding: 16
        })
    );
    let mut wcs = Vec::new();
    assert_eq!(hw.poll_cq(a, &mut wcs, 8, Duration::from_millis(20)), Ok(0));

    assert_eq!(hw.destroy_id(a), Err(CmError::QpAttached));
    hw.destroy_qp(a).unwrap();
    assert_eq!(hw.live_resources().qps, 0);
    hw.destroy_id(a).unwrap();
}
