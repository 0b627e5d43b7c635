//! One test per misuse case: the typed error, its errno, and that nothing changed.
//! librdmacm itself hangs, crashes or leaks on several of these; every backend refuses them.

use std::net::SocketAddr;

use cm::api::{
    errno, Call, CmBackend, CmError, CmEventType, ConnParam, HandleKind, IdState, PortSpace, QpCaps,
};

use crate::support::*;

#[test]
fn destroy_id_with_a_qp_attached_is_refused() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, true);
    let b = &mut bed.client;
    let before = b.id_machine(client.id).unwrap();
    let err = b.destroy_id(client.id).unwrap_err();
    assert_eq!((err.clone(), err.errno()), (CmError::QpAttached, errno::EBUSY));
    assert!(err.is_guarded_misuse());
    assert_eq!(b.id_machine(client.id).unwrap(), before, "nothing changed");
    destroy_all(b, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn destroy_id_with_unacked_events_is_refused_and_says_how_many() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.resolve_addr(id, Some(src), dst, WAIT).unwrap();
    let addr_ev = b.get_cm_event(ch, WAIT).unwrap().expect("ADDR_RESOLVED");
    b.resolve_route(id, WAIT).unwrap();
    let route_ev = b.get_cm_event(ch, WAIT).unwrap().expect("ROUTE_RESOLVED");
    let err = b.destroy_id(id).unwrap_err();
    assert_eq!(
        err,
        CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 2
        }
    );
    assert_eq!(err.errno(), errno::EBUSY);
    assert_eq!(b.live_resources().unacked_events, 2);
    b.ack_cm_event(addr_ev).unwrap();
    assert_err(
        b.destroy_id(id),
        CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 1,
        },
    );
    b.ack_cm_event(route_ev).unwrap();
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn calls_in_the_wrong_state_name_the_call_and_the_state() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    let cases: [(Call, Result<(), CmError>); 5] = [
        (Call::ResolveRoute, b.resolve_route(id, WAIT)),
        (Call::Connect, b.connect(id, &ConnParam::new())),
        (Call::Accept, b.accept(id, &ConnParam::new())),
        (Call::Reject, b.reject(id, &[])),
        (Call::Disconnect, b.disconnect(id)),
    ];
    for (call, result) in cases {
        match result {
            Err(CmError::WrongState {
                call: c,
                state: IdState::Idle,
                ..
            }) => assert_eq!(c, call),
            other => panic!("{call}: expected WrongState in RDMA_CM_IDLE, got {other:?}"),
        }
    }
    let err = b.connect(id, &ConnParam::new()).unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL);
    assert!(
        err.to_string()
            .starts_with("rdma_connect on an id in state RDMA_CM_IDLE"),
        "{err}"
    );
    // Resolution in progress: a second resolve, and route resolution before ADDR_RESOLVED was
    // retrieved, are both refused.
    b.resolve_addr(id, None, dst, WAIT).unwrap();
    assert!(matches!(
        b.resolve_addr(id, None, dst, WAIT),
        Err(CmError::WrongState {
            state: IdState::AddrQuery,
            ..
        })
    ));
    assert!(matches!(
        b.resolve_route(id, WAIT),
        Err(CmError::WrongState {
            state: IdState::AddrQuery,
            ..
        })
    ));
    assert!(matches!(
        b.listen(id, 0),
        Err(CmError::WrongState {
            call: Call::Listen,
            ..
        })
    ));
    expect(b, ch, CmEventType::AddrResolved);
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn a_second_create_qp_is_refused() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, true);
    let b = &mut bed.client;
    let err = b.create_qp(client.id, QpCaps::new()).unwrap_err();
    assert_eq!((err.clone(), err.errno()), (CmError::QpExists, errno::EINVAL));
    assert_eq!(b.live_resources().qps, 1);
    destroy_all(b, &[client.id], client.ch);
    assert_clean(&bed);
}

#[test]
fn create_qp_without_a_device_is_refused() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    assert_err(
        b.create_qp(id, QpCaps::new()),
        CmError::NoDevice { call: Call::CreateQp },
    );
    // A wildcard bind attaches no device either.
    b.bind_addr(id, "0.0.0.0:0".parse().unwrap()).unwrap();
    assert_err(
        b.create_qp(id, QpCaps::new()),
        CmError::NoDevice { call: Call::CreateQp },
    );
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn destroy_qp_and_accept_without_a_qp_are_refused() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let client = resolved_client(&mut bed, server.addr, false);
    assert_err(
        bed.client.destroy_qp(client.id),
        CmError::NoQp {
            call: Call::DestroyQp,
        },
    );
    assert_err(
        bed.client.connect(client.id, &ConnParam::new()),
        CmError::NoQp { call: Call::Connect },
    );
    bed.client.create_qp(client.id, QpCaps::new()).unwrap();
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let child = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest).id;
    let err = bed.server.accept(child, &ConnParam::new()).unwrap_err();
    assert_eq!(err, CmError::NoQp { call: Call::Accept });
    assert!(err.is_guarded_misuse(), "librdmacm dereferences NULL here");
    bed.server.reject(child, &[]).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Rejected);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[child, server.listener], server.ch);
    assert_clean(&bed);
}

#[test]
fn accept_on_a_listener_and_a_second_accept_are_refused() {
    let mut bed = bed!();
    let conn = establish(&mut bed);
    let s = &mut bed.server;
    assert!(matches!(
        s.accept(conn.server.listener, &ConnParam::new()),
        Err(CmError::WrongState {
            call: Call::Accept,
            ..
        })
    ));
    assert!(matches!(
        s.accept(conn.child, &ConnParam::new()),
        Err(CmError::WrongState {
            call: Call::Accept,
            ..
        })
    ));
    assert!(matches!(
        s.reject(conn.child, &[]),
        Err(CmError::WrongState {
            call: Call::Reject,
            ..
        })
    ));
    teardown(&mut bed, conn);
}

#[test]
fn use_after_destroy_is_an_unknown_handle() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.destroy_id(id).unwrap();
    let err = b.destroy_id(id).unwrap_err();
    assert_eq!(
        err,
        CmError::UnknownHandle {
            call: Call::DestroyId,
            kind: HandleKind::Id
        }
    );
    assert_eq!(err.errno(), errno::ENOENT);
    assert_err(
        b.bind_addr(id, "0.0.0.0:0".parse().unwrap()),
        CmError::UnknownHandle {
            call: Call::BindAddr,
            kind: HandleKind::Id,
        },
    );
    // A new id may reuse the slot; the old handle still misses.
    let again = b.create_id(ch, PortSpace::Tcp).unwrap();
    assert!(b.id_machine(id).is_err());
    assert!(b.id_machine(again).is_ok());
    b.destroy_id(again).unwrap();
    b.destroy_event_channel(ch).unwrap();
    let err = b.create_id(ch, PortSpace::Tcp).unwrap_err();
    assert_eq!(
        (err.clone(), err.errno()),
        (
            CmError::UnknownHandle {
                call: Call::CreateId,
                kind: HandleKind::Channel
            },
            errno::EBADF
        )
    );
    assert!(b.get_cm_event(ch, QUIET).is_err());
    assert_clean(&bed);
}

#[test]
fn handles_of_another_backend_are_unknown() {
    let mut bed = bed!();
    let sch = bed.server.create_event_channel().unwrap();
    let sid = bed.server.create_id(sch, PortSpace::Tcp).unwrap();
    let c = &mut bed.client;
    assert_err(
        c.destroy_id(sid),
        CmError::UnknownHandle {
            call: Call::DestroyId,
            kind: HandleKind::Id,
        },
    );
    assert_err(
        c.create_id(sch, PortSpace::Tcp),
        CmError::UnknownHandle {
            call: Call::CreateId,
            kind: HandleKind::Channel,
        },
    );
    let forged = cm::api::backend::id_handle(sid.owner().wrapping_add(1000), sid.index(), sid.generation());
    assert!(bed.server.destroy_id(forged).is_err());
    destroy_all(&mut bed.server, &[sid], sch);
    assert_clean(&bed);
}

#[test]
fn destroy_event_channel_with_ids_on_it_is_refused() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let a = b.create_id(ch, PortSpace::Tcp).unwrap();
    let c = b.create_id(ch, PortSpace::Tcp).unwrap();
    let err = b.destroy_event_channel(ch).unwrap_err();
    assert_eq!(
        (err.clone(), err.errno()),
        (CmError::ChannelBusy { ids: 2 }, errno::EBUSY)
    );
    b.destroy_id(a).unwrap();
    assert_err(b.destroy_event_channel(ch), CmError::ChannelBusy { ids: 1 });
    destroy_all(b, &[c], ch);
    assert_clean(&bed);
}

/// A client id whose `ADDR_RESOLVED` was retrieved and not acked: (channel, id, the event).
fn retrieved_addr_resolved<B: CmBackend>(
    bed: &mut Bed<B>,
) -> (cm::api::ChannelHandle, cm::api::IdHandle, cm::api::CmEvent) {
    let dst = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let c = &mut bed.client;
    let ch = c.create_event_channel().unwrap();
    let id = c.create_id(ch, PortSpace::Tcp).unwrap();
    c.resolve_addr(id, Some(src), dst, WAIT).unwrap();
    let ev = c.get_cm_event(ch, WAIT).unwrap().expect("ADDR_RESOLVED");
    (ch, id, ev)
}

#[test]
fn an_event_acked_on_another_backend_is_refused_and_given_back() {
    let mut bed = bed!();
    let (ch, id, ev) = retrieved_addr_resolved(&mut bed);
    let err = bed.server.ack_cm_event(ev).unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL, "{err}");
    let CmError::ForeignEvent(back) = err else {
        panic!("not handed back: {err}")
    };
    let ev = back.take().expect("the refused event comes back");
    assert_eq!(ev.id(), id);
    assert!(back.take().is_none(), "handed back once");
    // Nothing changed on either side: the event is still outstanding where it came from.
    let c = &mut bed.client;
    assert_eq!(c.id_machine(id).unwrap().unacked(), 1);
    c.ack_cm_event(ev).unwrap();
    destroy_all(c, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn a_forged_event_is_refused_and_the_real_one_still_acks() {
    let mut bed = bed!();
    let (ch, id, ev) = retrieved_addr_resolved(&mut bed);
    let c = &mut bed.client;
    let forge = |event, token| cm::api::backend::cm_event(id, None, event, 0, ConnParam::ZERO, token);
    // A copy of the real event with another token, and one with the real token but another type.
    for forged in [
        forge(ev.event(), ev.token().wrapping_add(1)),
        forge(CmEventType::RouteResolved, ev.token()),
    ] {
        assert_err(c.ack_cm_event(forged), CmError::EventNotOutstanding);
    }
    assert_eq!(
        c.id_machine(id).unwrap().unacked(),
        1,
        "the forgeries acked nothing"
    );
    c.ack_cm_event(ev).unwrap();
    assert_err(
        c.ack_cm_event(forge(CmEventType::AddrResolved, 0)),
        CmError::EventNotOutstanding,
    );
    destroy_all(c, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn a_forged_event_with_a_guessed_token_is_refused() {
    // Tokens are not small counters a forger can guess: the real event's id and type with the
    // first few token values ack nothing, so the real event still acks afterwards.
    let mut bed = bed!();
    let (ch, id, ev) = retrieved_addr_resolved(&mut bed);
    let c = &mut bed.client;
    for token in 0..64 {
        let forged = cm::api::backend::cm_event(id, None, ev.event(), ev.status(), ConnParam::ZERO, token);
        assert_err(c.ack_cm_event(forged), CmError::EventNotOutstanding);
    }
    assert_eq!(
        c.id_machine(id).unwrap().unacked(),
        1,
        "the guesses acked nothing"
    );
    c.ack_cm_event(ev).unwrap();
    destroy_all(c, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn invalid_arguments_are_refused_with_einval() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let client = resolved_client(&mut bed, dst, false);
    let b = &mut bed.client;
    // More send work requests than any device has.
    let over = QpCaps {
        max_send_wr: u32::MAX,
        ..QpCaps::new()
    };
    let err = b.create_qp(client.id, over).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::InvalidArgument {
                call: Call::CreateQp,
                ..
            }
        ),
        "{err}"
    );
    // A destination of the other family than the source (the hardware runner runs on both).
    let other: SocketAddr = if bed.client_ip.is_ipv4() {
        "[::1]:1".parse().unwrap()
    } else {
        "127.0.0.1:1".parse().unwrap()
    };
    let v6 = b.create_id(client.ch, PortSpace::Tcp).unwrap();
    let err = b
        .resolve_addr(v6, Some(SocketAddr::new(bed.client_ip, 0)), other, WAIT)
        .unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL, "{err}");
    let b = &mut bed.client;
    let big = ConnParam {
        responder_resources: 0xFE,
        ..ConnParam::new()
    };
    b.create_qp(client.id, QpCaps::new()).unwrap();
    assert_eq!(b.connect(client.id, &big).unwrap_err().errno(), errno::EINVAL);
    destroy_all(b, &[client.id, v6], client.ch);
    assert_clean(&bed);
}

#[test]
fn disconnect_on_a_listener_is_a_no_op_as_in_librdmacm() {
    // Measured by the lab's differential suite: the kernel takes rdma_disconnect on a listener
    // bound to a device and returns 0; a wildcard listener has no device, and librdmacm refuses.
    let mut bed = bed!();
    let server = listen(&mut bed, 8);
    let b = &mut bed.server;
    let before = b.id_machine(server.listener).unwrap();
    b.disconnect(server.listener).unwrap();
    assert_eq!(b.id_machine(server.listener).unwrap(), before, "still listening");
    let wildcard = b.create_id(server.ch, PortSpace::Tcp).unwrap();
    b.listen(wildcard, 8).unwrap();
    let err = b.disconnect(wildcard).unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL);
    destroy_all(b, &[wildcard, server.listener], server.ch);
    assert_clean(&bed);
}
