//! What event loops build on: non-blocking retrieval, the event channel's and the CQ's file
//! descriptors, and a backend that moves between threads.
//!
//! The tests of types and refusals run everywhere. Those that need an RDMA device and
//! `CM_HW_ADDR` (its IP address) print `skipped: ...` and pass without one; the lab runs them on
//! Soft-RoCE.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use cm_core::{
    Call, ChannelHandle, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdHandle, PortSpace, QpCaps,
    WcOpcode, WcStatus, WorkCompletion,
};
use cm_hw::HwBackend;

const T: Duration = Duration::from_secs(10);
/// A wait that only sees what is already there.
const NOW: Duration = Duration::ZERO;

fn assert_send<T: Send>() {}

#[test]
fn hw_backend_is_send() {
    assert_send::<HwBackend>();
    // And it really crosses: built here, used and dropped on another thread.
    let hw = HwBackend::new().unwrap();
    let live = std::thread::spawn(move || {
        let mut hw = hw;
        // Without a device the channel fails; with one it works; either way nothing stays open.
        if let Ok(ch) = hw.create_event_channel() {
            hw.destroy_event_channel(ch).unwrap();
        }
        hw.live_resources()
    })
    .join()
    .unwrap();
    assert!(live.is_clean());
}

#[test]
fn fds_and_try_calls_refuse_unknown_handles_with_typed_errors() {
    let mut hw = HwBackend::new().unwrap();
    let ch = cm_core::backend::channel_handle(0, 0, 0);
    let id = cm_core::backend::id_handle(0, 0, 0);
    let unknown_channel = CmError::UnknownHandle {
        call: Call::GetCmEvent,
        kind: HandleKind::Channel,
    };
    let unknown_id = CmError::UnknownHandle {
        call: Call::PollCq,
        kind: HandleKind::Id,
    };
    assert_eq!(hw.channel_fd(ch).err(), Some(unknown_channel.clone()));
    assert_eq!(hw.cq_fd(id).err(), Some(unknown_id.clone()));
    assert_eq!(hw.try_get_cm_event(ch), Err(unknown_channel));
    assert_eq!(hw.try_poll_cq(id, &mut Vec::new(), 4), Err(unknown_id));
}

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

/// Waits (bounded) on the channel's fd, then takes the one event there, which must be `ty`;
/// acks it and returns its id.
fn next_event(hw: &mut HwBackend, ch: ChannelHandle, ty: CmEventType) -> IdHandle {
    assert!(
        cm_hw::wait_readable(hw.channel_fd(ch).unwrap(), T).unwrap(),
        "channel fd not readable within {T:?} while waiting for {ty}"
    );
    let ev = hw
        .try_get_cm_event(ch)
        .unwrap()
        .unwrap_or_else(|| panic!("fd readable but no event (waiting for {ty})"));
    assert_eq!(ev.event(), ty, "{ev} (status {})", ev.status());
    let id = ev.id();
    hw.ack_cm_event(ev).unwrap();
    id
}

#[test]
fn channel_fd_is_readable_exactly_while_an_event_is_queued() {
    let Some((mut hw, ip)) = setup("channel_fd_is_readable_exactly_while_an_event_is_queued") else {
        return;
    };
    let ch = hw.create_event_channel().unwrap();
    // Nothing queued: Ok(None) at once, and the fd is not readable.
    assert_eq!(hw.try_get_cm_event(ch), Ok(None));
    assert!(!cm_hw::wait_readable(hw.channel_fd(ch).unwrap(), NOW).unwrap());

    let id = hw.create_id(ch, PortSpace::Tcp).unwrap();
    hw.resolve_addr(id, None, SocketAddr::new(ip, 7471), Duration::from_secs(2))
        .unwrap();
    next_event(&mut hw, ch, CmEventType::AddrResolved);
    // Drained: not readable any more, and nothing to take.
    assert!(!cm_hw::wait_readable(hw.channel_fd(ch).unwrap(), NOW).unwrap());
    assert_eq!(hw.try_get_cm_event(ch), Ok(None));
    // Without a QP there is no CQ fd.
    assert_eq!(hw.cq_fd(id).err(), Some(CmError::NoQp { call: Call::PollCq }));
    hw.destroy_id(id).unwrap();
    hw.destroy_event_channel(ch).unwrap();
    assert!(hw.live_resources().is_clean());
}

/// Takes completions with `try_poll_cq`, waiting on the CQ's fd (bounded) whenever it says 0,
/// until `n` arrived.
fn completions_by_fd(hw: &mut HwBackend, id: IdHandle, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    while out.len() < n {
        let want = n - out.len();
        if hw.try_poll_cq(id, &mut out, want).unwrap() == 0 {
            assert!(
                cm_hw::wait_readable(hw.cq_fd(id).unwrap(), T).unwrap(),
                "CQ fd not readable within {T:?} with {} of {n} completions",
                out.len()
            );
        }
    }
    out
}

#[test]
fn cq_fd_turns_readable_when_a_completion_arrives_after_try_poll_cq_found_none() {
    let Some((mut hw, ip)) =
        setup("cq_fd_turns_readable_when_a_completion_arrives_after_try_poll_cq_found_none")
    else {
        return;
    };
    let sch = hw.create_event_channel().unwrap();
    let listener = hw.create_id(sch, PortSpace::Tcp).unwrap();
    hw.bind_addr(listener, SocketAddr::new(ip, 0)).unwrap();
    hw.listen(listener, 8).unwrap();
    let server_addr = hw.get_local_addr(listener).unwrap().expect("listener address");

    let cch = hw.create_event_channel().unwrap();
    let client = hw.create_id(cch, PortSpace::Tcp).unwrap();
    hw.resolve_addr(client, None, server_addr, Duration::from_secs(2))
        .unwrap();
    next_event(&mut hw, cch, CmEventType::AddrResolved);
    hw.resolve_route(client, Duration::from_secs(2)).unwrap();
    next_event(&mut hw, cch, CmEventType::RouteResolved);
    hw.create_qp(client, QpCaps::new()).unwrap();
    hw.connect(client, &ConnParam::new()).unwrap();
    let child = next_event(&mut hw, sch, CmEventType::ConnectRequest);
    hw.create_qp(child, QpCaps::new()).unwrap();
    hw.accept(child, &ConnParam::new()).unwrap();
    next_event(&mut hw, cch, CmEventType::Established);
    next_event(&mut hw, sch, CmEventType::Established);

    // Nothing posted: nothing to poll, the CQ is armed and its fd quiet.
    hw.post_recv(client, 7, 64).unwrap();
    assert_eq!(hw.try_poll_cq(client, &mut Vec::new(), 4), Ok(0));
    assert!(!cm_hw::wait_readable(hw.cq_fd(client).unwrap(), NOW).unwrap());

    // A message from the server wakes the client's fd.
    hw.post_send(child, 8, b"wake up").unwrap();
    assert!(
        cm_hw::wait_readable(hw.cq_fd(client).unwrap(), T).unwrap(),
        "client CQ fd not readable within {T:?} of the server's send"
    );
    let mut got = Vec::new();
    assert_eq!(hw.try_poll_cq(client, &mut got, 4), Ok(1));
    assert_eq!(got[0].wr_id, 7);
    assert_eq!(got[0].opcode, WcOpcode::Recv);
    assert_eq!(got[0].status, WcStatus::Success);
    assert_eq!(got[0].data, b"wake up");
    // The CQ event was taken and acked by the next empty poll: the fd is quiet again.
    assert_eq!(hw.try_poll_cq(client, &mut got, 4), Ok(0));
    assert!(!cm_hw::wait_readable(hw.cq_fd(client).unwrap(), NOW).unwrap());

    let sent = completions_by_fd(&mut hw, child, 1);
    assert_eq!((sent[0].wr_id, sent[0].status), (8, WcStatus::Success));

    // Disconnect: a receive still posted comes back flushed, through the fd as well. The
    // client's DISCONNECTED waits for the server's answer (its own disconnect).
    hw.post_recv(child, 9, 64).unwrap();
    hw.disconnect(client).unwrap();
    next_event(&mut hw, sch, CmEventType::Disconnected);
    hw.disconnect(child).unwrap();
    next_event(&mut hw, cch, CmEventType::Disconnected);
    let flushed = completions_by_fd(&mut hw, child, 1);
    assert_eq!((flushed[0].wr_id, flushed[0].status), (9, WcStatus::WrFlushErr));

    // Release in order: the QPs (with their CQs and completion channels), ids, channels.
    for id in [client, child] {
        hw.destroy_qp(id).unwrap();
        hw.destroy_id(id).unwrap();
    }
    hw.destroy_id(listener).unwrap();
    hw.destroy_event_channel(cch).unwrap();
    hw.destroy_event_channel(sch).unwrap();
    assert!(hw.live_resources().is_clean());
}

#[test]
fn server_and_client_backends_run_on_their_own_threads() {
    let Some((mut server, ip)) = setup("server_and_client_backends_run_on_their_own_threads") else {
        return;
    };
    let sch = server.create_event_channel().unwrap();
    let listener = server.create_id(sch, PortSpace::Tcp).unwrap();
    server.bind_addr(listener, SocketAddr::new(ip, 0)).unwrap();
    server.listen(listener, 8).unwrap();
    let addr = server
        .get_local_addr(listener)
        .unwrap()
        .expect("listener address");

    // The listening backend moves to its own thread, and accepts one connection there.
    let server_thread = std::thread::spawn(move || {
        let child = next_event(&mut server, sch, CmEventType::ConnectRequest);
        server.create_qp(child, QpCaps::new()).unwrap();
        server
            .accept(child, &ConnParam::new().with_private_data(b"hi"))
            .unwrap();
        next_event(&mut server, sch, CmEventType::Established);
        next_event(&mut server, sch, CmEventType::Disconnected);
        server.disconnect(child).unwrap();
        server.destroy_qp(child).unwrap();
        server.destroy_id(child).unwrap();
        server.destroy_id(listener).unwrap();
        server.destroy_event_channel(sch).unwrap();
        server.live_resources()
    });

    let mut client = HwBackend::new().unwrap();
    let cch = client.create_event_channel().unwrap();
    let id = client.create_id(cch, PortSpace::Tcp).unwrap();
    client
        .resolve_addr(id, None, addr, Duration::from_secs(2))
        .unwrap();
    next_event(&mut client, cch, CmEventType::AddrResolved);
    client.resolve_route(id, Duration::from_secs(2)).unwrap();
    next_event(&mut client, cch, CmEventType::RouteResolved);
    client.create_qp(id, QpCaps::new()).unwrap();
    client.connect(id, &ConnParam::new()).unwrap();
    assert!(cm_hw::wait_readable(client.channel_fd(cch).unwrap(), T).unwrap());
    let ev = client.try_get_cm_event(cch).unwrap().expect("ESTABLISHED");
    assert_eq!(ev.event(), CmEventType::Established, "{ev}");
    // The IB CM pads private data to its message's fixed size.
    assert!(ev.private_data().starts_with(b"hi"), "{:?}", ev.private_data());
    client.ack_cm_event(ev).unwrap();
    client.disconnect(id).unwrap();
    next_event(&mut client, cch, CmEventType::Disconnected);
    client.destroy_qp(id).unwrap();
    client.destroy_id(id).unwrap();
    client.destroy_event_channel(cch).unwrap();
    assert!(client.live_resources().is_clean());
    assert!(server_thread.join().unwrap().is_clean());
}
