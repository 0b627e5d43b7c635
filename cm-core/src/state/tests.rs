use super::*;
use crate::error::errno::*;
use CmEventType::*;

fn established_active() -> IdMachine {
    let m = IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap();
    let m = m.on_event(AddrResolved).unwrap().on_ack().unwrap();
    let m = m
        .resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .on_ack()
        .unwrap();
    let m = m.create_qp().unwrap().connect(56).unwrap();
    assert_eq!(m.connect_response_outcome(), Established);
    m.on_event(Established).unwrap().on_ack().unwrap()
}

#[test]
fn active_lifecycle() {
    let m = established_active();
    assert_eq!(
        (m.state(), m.phase(), m.qp()),
        (IdState::Connect, ConnPhase::Established, Some(QpState::Rts))
    );
    assert!(m.disconnect_reaches_wire());
    let m = m.disconnect().unwrap();
    assert_eq!(m.qp(), Some(QpState::Err));
    let m = m.on_event(Disconnected).unwrap();
    assert_eq!(m.state(), IdState::Disconnect);
    assert_eq!(m.destroy().unwrap_err(), CmError::QpAttached);
    let m = m.destroy_qp().unwrap();
    assert_eq!(
        m.destroy().unwrap_err(),
        CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 1
        }
    );
    let m = m
        .on_ack()
        .unwrap()
        .on_event(TimewaitExit)
        .unwrap()
        .on_ack()
        .unwrap();
    assert_eq!(
        m.disconnect().unwrap().state(),
        IdState::Disconnect,
        "second disconnect is fine"
    );
    assert_eq!(m.destroy().unwrap().state(), IdState::Destroying);
}

fn route_resolved() -> IdMachine {
    let m = IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap();
    let m = m.on_event(AddrResolved).unwrap().on_ack().unwrap();
    m.resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .on_ack()
        .unwrap()
}

#[test]
fn external_qp_active_side_gets_connect_response_then_establishes() {
    let m = route_resolved().connect_external(56).unwrap();
    assert!(m.is_external());
    assert_eq!(m.connect_response_outcome(), ConnectResponse);
    assert!(m.check_event(Established).is_err(), "no ESTABLISHED without a QP");
    assert!(matches!(
        m.establish(),
        Err(CmError::WrongState {
            call: Call::Establish,
            ..
        })
    ));
    let m = m.on_event(ConnectResponse).unwrap().on_ack().unwrap();
    let m = m.establish().unwrap();
    assert_eq!((m.phase(), m.qp()), (ConnPhase::Established, None));
    assert!(m.disconnect_reaches_wire());
    assert!(m.establish().is_err(), "established once");
    assert!(m.on_event(Disconnected).is_ok());
}

#[test]
fn external_qp_passive_side_accepts_with_its_own_qp_number() {
    let child = IdMachine::new_child(PortSpace::Tcp);
    let acc = child.accept_external(196).unwrap();
    assert_eq!(
        (acc.phase(), acc.qp(), acc.is_external()),
        (ConnPhase::Accepted, None, true)
    );
    assert!(acc.check_event(Established).is_ok());
    assert!(matches!(acc.establish(), Err(CmError::WrongState { .. })));
    assert!(
        matches!(child.establish(), Err(CmError::WrongState { .. })),
        "establish on an unanswered child would make the kernel reject it"
    );
}

#[test]
fn mixing_backend_and_external_qps_is_refused() {
    let ext = route_resolved().connect_external(0).unwrap();
    assert_eq!(
        ext.create_qp().unwrap_err(),
        CmError::ExternalQp { call: Call::CreateQp }
    );
    let backend = route_resolved().create_qp().unwrap();
    assert_eq!(
        backend.connect_external(0).unwrap_err(),
        CmError::BackendQp { call: Call::Connect }
    );
    let child = IdMachine::new_child(PortSpace::Tcp).create_qp().unwrap();
    assert_eq!(
        child.accept_external(0).unwrap_err(),
        CmError::BackendQp { call: Call::Accept }
    );
    let connected = backend.connect(0).unwrap().on_event(Established).unwrap();
    assert_eq!(
        connected.establish().unwrap_err(),
        CmError::BackendQp {
            call: Call::Establish
        }
    );
    let p = crate::ConnParam::new();
    assert!(!route_resolved().uses_external_qp(&p), "QP number 0 names no QP");
    assert!(route_resolved().uses_external_qp(&p.with_qp_num(7)));
    assert!(!backend.uses_external_qp(&p.with_qp_num(7)), "a backend QP wins");
    let ud = IdMachine::new(PortSpace::Udp);
    assert!(
        !ud.uses_external_qp(&p.with_qp_num(7)),
        "datagram ids have no external mode"
    );
    let ud_child = IdMachine::new_child(PortSpace::Udp).accept_external(0).unwrap();
    assert!(!ud_child.is_external(), "datagram ids have no external mode");
    assert!(!connected.is_external(), "a backend QP's connection");
}

#[test]
fn init_qp_attr_legality_by_state() {
    use QpState::{Init, Reset, Rtr, Rts};
    let idle = IdMachine::new(PortSpace::Tcp);
    assert_eq!(
        idle.init_qp_attr(Init).unwrap_err(),
        CmError::NoDevice {
            call: Call::InitQpAttr
        }
    );
    let wildcard = idle.bind_addr(true).unwrap();
    assert!(matches!(
        wildcard.init_qp_attr(Init),
        Err(CmError::NoDevice { .. })
    ));
    let rr = route_resolved();
    let connecting = rr.connect_external(0).unwrap();
    let responded = connecting.on_event(ConnectResponse).unwrap();
    let child = IdMachine::new_child(PortSpace::Tcp);
    let listener = idle.bind_addr(false).unwrap().listen().unwrap();
    let failed = connecting.on_event(Rejected).unwrap();
    let ended = responded.establish().unwrap().on_event(Disconnected).unwrap();
    // (machine, INIT, RTR, RTS): whether each is legal.
    let table = [
        (
            "bound to a device",
            idle.bind_addr(false).unwrap(),
            true,
            true,
            true,
        ),
        ("route resolved", rr, true, true, true),
        ("connecting", connecting, true, false, false),
        ("CONNECT_RESPONSE retrieved", responded, true, true, true),
        ("child", child, true, true, true),
        (
            "accepted child",
            child.accept_external(0).unwrap(),
            true,
            true,
            true,
        ),
        ("listener", listener, false, false, false),
        ("rejected", failed, false, false, false),
        ("disconnected", ended, false, false, false),
    ];
    for (what, m, init, rtr, rts) in table {
        for (state, legal) in [(Init, init), (Rtr, rtr), (Rts, rts)] {
            assert_eq!(m.init_qp_attr(state).is_ok(), legal, "{what}, {state}");
        }
    }
    for state in [Reset, QpState::Err] {
        assert!(matches!(
            rr.init_qp_attr(state),
            Err(CmError::InvalidArgument { .. })
        ));
    }
    let removed = rr.device_removed();
    assert!(matches!(
        removed.init_qp_attr(Init),
        Err(CmError::WrongState { .. })
    ));
    assert!(IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .init_qp_attr(Rts)
        .is_ok());
}

#[test]
fn passive_lifecycle_and_reject() {
    let child = IdMachine::new_child(PortSpace::Tcp);
    assert_eq!(child.accept(0).unwrap_err(), CmError::NoQp { call: Call::Accept });
    let child = child.create_qp().unwrap();
    assert_eq!(
        child.accept(197).unwrap_err(),
        CmError::PrivateDataTooLong {
            call: Call::Accept,
            len: 197,
            max: 196
        }
    );
    let acc = child.accept(196).unwrap();
    assert_eq!(acc.qp(), Some(QpState::Rts));
    assert_eq!(acc.accept(0).unwrap_err().errno(), EINVAL, "second accept");
    assert!(acc.check_event(Established).is_ok());
    let rej = child.reject(148).unwrap();
    assert_eq!(rej.phase(), ConnPhase::Rejected);
    assert!(
        rej.check_event(Established).is_err(),
        "a rejected child gets no events"
    );
    assert!(child.reject(149).is_err());
}

#[test]
fn wrong_state_calls_name_call_and_state() {
    let m = IdMachine::new(PortSpace::Tcp);
    let e = m.connect(0).unwrap_err();
    assert!(matches!(
        e,
        CmError::WrongState {
            call: Call::Connect,
            state: IdState::Idle,
            ..
        }
    ));
    assert!(matches!(
        m.resolve_route(),
        Err(CmError::WrongState {
            call: Call::ResolveRoute,
            ..
        })
    ));
    assert!(matches!(
        m.disconnect(),
        Err(CmError::WrongState {
            call: Call::Disconnect,
            ..
        })
    ));
    assert!(matches!(
        m.accept(0),
        Err(CmError::WrongState {
            call: Call::Accept,
            ..
        })
    ));
    assert_eq!(
        m.create_qp().unwrap_err(),
        CmError::NoDevice { call: Call::CreateQp }
    );
    assert_eq!(
        m.destroy_qp().unwrap_err(),
        CmError::NoQp {
            call: Call::DestroyQp
        }
    );
    let b = m.bind_addr(false).unwrap();
    assert!(matches!(
        b.bind_addr(false),
        Err(CmError::WrongState {
            call: Call::BindAddr,
            ..
        })
    ));
    let q = b.create_qp().unwrap();
    assert_eq!(q.create_qp().unwrap_err(), CmError::QpExists);
    let wildcard = m.bind_addr(true).unwrap();
    assert!(!wildcard.has_device());
    let l = wildcard.listen().unwrap();
    assert!(matches!(
        l.listen(),
        Err(CmError::WrongState {
            call: Call::Listen,
            ..
        })
    ));
    assert!(matches!(l.resolve_addr(), Err(CmError::WrongState { .. })));
}

#[test]
fn resolution_errors_return_to_earlier_states() {
    let m = IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap();
    assert!(
        matches!(m.resolve_addr(), Err(CmError::WrongState { .. })),
        "called twice"
    );
    let m = m.on_event(AddrError).unwrap();
    assert_eq!(m.state(), IdState::AddrBound);
    let m = m.resolve_addr().unwrap().on_event(AddrResolved).unwrap();
    let m = m.resolve_route().unwrap().on_event(RouteError).unwrap();
    assert_eq!(m.state(), IdState::AddrResolved);
    assert_eq!(m.unacked(), 3);
}

#[test]
fn rejected_connection_stays_in_connect_and_needs_a_new_id() {
    let m = IdMachine::new(PortSpace::Tcp)
        .resolve_addr()
        .unwrap()
        .on_event(AddrResolved)
        .unwrap();
    let m = m
        .resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .create_qp()
        .unwrap();
    let m = m.connect(0).unwrap().on_event(Rejected).unwrap();
    assert_eq!(
        (m.state(), m.phase(), m.qp()),
        (IdState::Connect, ConnPhase::Failed, Some(QpState::Err))
    );
    assert!(m.connect(0).is_err());
    assert!(
        m.disconnect().is_ok(),
        "disconnect after REJECTED returns 0 on IB/RoCE"
    );
    assert!(!m.disconnect_reaches_wire());
    assert!(m.check_event(Disconnected).is_err());
}

#[test]
fn connect_response_becomes_connect_error_when_the_qp_is_in_err() {
    let m = IdMachine::new(PortSpace::Tcp)
        .resolve_addr()
        .unwrap()
        .on_event(AddrResolved)
        .unwrap();
    let m = m
        .resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .create_qp()
        .unwrap();
    let m = m.connect(0).unwrap().disconnect().unwrap();
    assert_eq!(m.connect_response_outcome(), ConnectError);
    assert!(m.check_event(Established).is_err());
    let m = m.on_event(ConnectError).unwrap();
    assert_eq!(m.phase(), ConnPhase::Failed);
    let ud = IdMachine::new(PortSpace::Udp)
        .resolve_addr()
        .unwrap()
        .on_event(AddrResolved)
        .unwrap();
    let ud = ud
        .resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .connect(180)
        .unwrap();
    assert_eq!(ud.connect_response_outcome(), Established, "SIDR needs no QP");
    assert!(ud.check_event(Established).is_ok());
}

#[test]
fn create_qp_needs_the_cm_to_give_qp_attributes() {
    let l = IdMachine::new(PortSpace::Tcp)
        .bind_addr(false)
        .unwrap()
        .listen()
        .unwrap();
    assert!(matches!(
        l.create_qp(),
        Err(CmError::WrongState {
            call: Call::CreateQp,
            state: IdState::Listen,
            ..
        })
    ));
    let rej = IdMachine::new_child(PortSpace::Tcp).reject(0).unwrap();
    assert!(rej.create_qp().is_err(), "a rejected child's CM exchange is over");
    let d = established_active()
        .destroy_qp()
        .unwrap()
        .on_event(Disconnected)
        .unwrap();
    assert!(d.create_qp().is_err());
    assert!(IdMachine::new_child(PortSpace::Tcp).create_qp().is_ok());
    let ud = IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .listen()
        .unwrap();
    assert!(ud.create_qp().is_ok(), "datagram QPs need no CM exchange");
}

#[test]
fn post_send_to_is_for_datagram_qps_only() {
    let udp_child = IdMachine::new_child(PortSpace::Udp);
    let tcp_child = IdMachine::new_child(PortSpace::Tcp);
    // (machine, post_send_to's answer, post_send's answer)
    type Answer = Result<(), CmError>;
    let table: [(IdMachine, Answer, Answer); 4] = [
        (
            udp_child,
            Err(CmError::NoQp { call: Call::PostSend }),
            Err(CmError::NoQp { call: Call::PostSend }),
        ),
        (
            udp_child.create_qp().unwrap(),
            Ok(()),
            Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "sends on datagram (UD) QPs need an address handle, which post_send does not carry",
            }),
        ),
        (
            udp_child.create_qp().unwrap().qp_error(),
            Ok(()),
            Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "sends on datagram (UD) QPs need an address handle, which post_send does not carry",
            }),
        ),
        (
            tcp_child.create_qp().unwrap(),
            Err(CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "post_send_to needs a datagram (UD) QP; connected QPs send with post_send",
            }),
            Err(CmError::WrongQpState {
                call: Call::PostSend,
                state: QpState::Init,
            }),
        ),
    ];
    for (i, (m, to, plain)) in table.into_iter().enumerate() {
        assert_eq!(m.post_send_to(), to, "row {i}: post_send_to");
        assert_eq!(m.post_send(), plain, "row {i}: post_send");
    }
}

#[test]
fn device_removal_leaves_only_destroy() {
    let m = established_active()
        .on_event(DeviceRemoval)
        .unwrap()
        .on_ack()
        .unwrap();
    assert!(m.create_qp().is_err());
    assert!(m.disconnect().is_err());
    assert!(m.check_event(DeviceRemoval).is_err());
    let m = m.destroy_qp().unwrap();
    assert!(m.destroy().is_ok());
}

#[test]
fn after_a_device_removal_only_its_announcement_and_destroy_are_legal() {
    let m = established_active().device_removed();
    assert_eq!(m.state(), IdState::DeviceRemoval);
    assert_eq!(
        m.qp(),
        Some(QpState::Rts),
        "the QP goes to ERR when the event is retrieved"
    );
    assert!(matches!(
        m.resolve_route(),
        Err(CmError::WrongState {
            state: IdState::DeviceRemoval,
            ..
        })
    ));
    assert!(m.disconnect().is_err() && m.connect(0).is_err() && m.create_qp().is_err());
    for late in [
        RouteResolved,
        RouteError,
        Unreachable,
        ConnectRequest,
        Disconnected,
        Established,
    ] {
        assert!(m.check_event(late).is_err(), "{late}");
    }
    assert_eq!(m.device_removed(), m, "a second removal changes nothing");
    let m = m.on_event(DeviceRemoval).unwrap();
    assert_eq!((m.qp(), m.unacked()), (Some(QpState::Err), 1));
    assert!(m.check_event(DeviceRemoval).is_err());
    assert!(m.on_ack().unwrap().destroy_qp().unwrap().destroy().is_ok());
    let resolving = IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .resolve_addr()
        .unwrap()
        .device_removed();
    assert!(resolving.check_event(AddrResolved).is_err());
    assert!(resolving.check_event(AddrError).is_err());
}

#[test]
fn qp_transitions_follow_the_ib_spec() {
    use QpState::*;
    assert!(Reset.can_modify_to(Init));
    assert!(Init.can_modify_to(Rtr) && Rtr.can_modify_to(Rts));
    assert!(!Init.can_modify_to(Rts));
    assert!(!Err.can_modify_to(Rtr) && Err.can_modify_to(Reset));
    assert!(Rts.can_post_send() && Err.can_post_send() && !Init.can_post_send() && !Rtr.can_post_send());
    assert!(Init.can_post_recv() && !Reset.can_post_recv());
    let m = IdMachine::new(PortSpace::Tcp)
        .bind_addr(false)
        .unwrap()
        .create_qp()
        .unwrap();
    assert_eq!(
        m.post_send().unwrap_err(),
        CmError::WrongQpState {
            call: Call::PostSend,
            state: Init
        }
    );
    assert!(m.post_recv().is_ok());
    let ud = IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .create_qp()
        .unwrap();
    assert_eq!(ud.qp(), Some(Rts));
}

#[test]
fn acks_are_counted() {
    let m = IdMachine::new(PortSpace::Tcp);
    assert_eq!(m.count_event().unacked(), 1);
    assert_eq!(m.count_event().state(), m.state());
    assert_eq!(m.on_ack().unwrap_err(), CmError::EventNotOutstanding);
    let l = m
        .listen()
        .unwrap()
        .on_event(ConnectRequest)
        .unwrap()
        .on_event(ConnectRequest)
        .unwrap();
    assert_eq!(l.unacked(), 2);
    assert_eq!(
        l.destroy().unwrap_err(),
        CmError::UnackedEvents {
            call: Call::DestroyId,
            count: 2
        }
    );
    assert!(l.on_ack().unwrap().on_ack().unwrap().destroy().is_ok());
}

/// What retrieving one event does to an id in the table below.
#[derive(Clone, Copy, Debug)]
enum Cell {
    /// Refused: `on_event` names the event, the state and the phase.
    Refused,
    /// Legal and changes nothing but the unacked count.
    Same,
    /// Legal and moves the id to this state, phase and QP state (the device as before).
    To(IdState, ConnPhase, Option<QpState>),
    /// `ADDR_RESOLVED`: like `To`, and the id now has a device.
    ToWithDevice(IdState, ConnPhase, Option<QpState>),
}

fn bound() -> IdMachine {
    IdMachine::new(PortSpace::Tcp).bind_addr(false).unwrap()
}

fn addr_query() -> IdMachine {
    IdMachine::new(PortSpace::Tcp).resolve_addr().unwrap()
}

fn route_query() -> IdMachine {
    addr_query()
        .on_event(AddrResolved)
        .unwrap()
        .resolve_route()
        .unwrap()
}

fn route_resolved_with_qp() -> IdMachine {
    route_query()
        .on_event(RouteResolved)
        .unwrap()
        .create_qp()
        .unwrap()
}

fn connecting() -> IdMachine {
    route_resolved_with_qp().connect(0).unwrap()
}

fn connecting_udp() -> IdMachine {
    IdMachine::new(PortSpace::Udp)
        .resolve_addr()
        .unwrap()
        .on_event(AddrResolved)
        .unwrap()
        .resolve_route()
        .unwrap()
        .on_event(RouteResolved)
        .unwrap()
        .connect(0)
        .unwrap()
}

fn accepted_child() -> IdMachine {
    IdMachine::new_child(PortSpace::Tcp)
        .create_qp()
        .unwrap()
        .accept(0)
        .unwrap()
}

/// Every id state and handshake phase an application can observe, with the facts that decide
/// event legality varied where they matter (QP or none, device or none, UDP, a removal not
/// announced yet).
fn fixtures() -> Vec<(&'static str, IdMachine)> {
    vec![
        ("idle", IdMachine::new(PortSpace::Tcp)),
        ("bound", bound()),
        (
            "bound to the wildcard",
            IdMachine::new(PortSpace::Tcp).bind_addr(true).unwrap(),
        ),
        ("addr query", addr_query()),
        ("addr resolved", addr_query().on_event(AddrResolved).unwrap()),
        ("route query", route_query()),
        ("route resolved", route_query().on_event(RouteResolved).unwrap()),
        ("connecting", connecting()),
        ("connecting, QP destroyed", connecting().destroy_qp().unwrap()),
        ("connecting, QP in ERR", connecting().disconnect().unwrap()),
        ("connecting UDP", connecting_udp()),
        (
            "responded",
            connecting()
                .destroy_qp()
                .unwrap()
                .on_event(ConnectResponse)
                .unwrap(),
        ),
        ("established", established_active()),
        ("failed", connecting().on_event(Rejected).unwrap()),
        // UNREACHABLE leaves the QP in INIT, from which it could still go to RTR: only the
        // phase refuses a late ESTABLISHED here.
        (
            "failed unreachable, QP in INIT",
            connecting().on_event(Unreachable).unwrap(),
        ),
        ("child requested", IdMachine::new_child(PortSpace::Tcp)),
        ("child accepted", accepted_child()),
        (
            "child rejected",
            IdMachine::new_child(PortSpace::Tcp).reject(0).unwrap(),
        ),
        (
            "child established",
            accepted_child().on_event(Established).unwrap(),
        ),
        (
            "disconnected",
            established_active().on_event(Disconnected).unwrap(),
        ),
        ("listening", bound().listen().unwrap()),
        ("removed, not announced", established_active().device_removed()),
        ("removed without a QP, not announced", bound().device_removed()),
        ("removed", established_active().on_event(DeviceRemoval).unwrap()),
        ("destroying", bound().destroy().unwrap()),
    ]
}

#[test]
#[rustfmt::skip]
fn every_option_in_every_state_is_taken_or_refused_as_the_kernel_does() {
    use crate::IdOption as O;
    // Per fixture: TOS, REUSEADDR on, REUSEADDR off, AFONLY, ACK_TIMEOUT 14.
    let table: &[(&str, [bool; 5])] = &[
        ("idle",                                 [true, true,  true,  true,  true]),
        ("bound",                                [true, true,  false, true,  true]),
        ("bound to the wildcard",                [true, true,  false, true,  true]),
        ("addr query",                           [true, true,  false, false, true]),
        ("addr resolved",                        [true, true,  false, false, true]),
        ("route query",                          [true, true,  false, false, true]),
        ("route resolved",                       [true, true,  false, false, true]),
        ("connecting",                           [true, true,  false, false, true]),
        ("connecting, QP destroyed",             [true, true,  false, false, true]),
        ("connecting, QP in ERR",                [true, true,  false, false, true]),
        ("connecting UDP",                       [true, true,  false, false, false]),
        ("responded",                            [true, true,  false, false, true]),
        ("established",                          [true, true,  false, false, true]),
        ("failed",                               [true, true,  false, false, true]),
        ("failed unreachable, QP in INIT",       [true, true,  false, false, true]),
        ("child requested",                      [true, true,  false, false, true]),
        ("child accepted",                       [true, true,  false, false, true]),
        ("child rejected",                       [true, true,  false, false, true]),
        ("child established",                    [true, true,  false, false, true]),
        ("disconnected",                         [true, true,  false, false, true]),
        ("listening",                            [true, false, false, false, true]),
        ("removed, not announced",               [false, false, false, false, false]),
        ("removed without a QP, not announced",  [false, false, false, false, false]),
        ("removed",                              [false, false, false, false, false]),
        ("destroying",                           [false, false, false, false, false]),
    ];
    let options = [O::Tos(4), O::ReuseAddr(true), O::ReuseAddr(false), O::AfOnly(true), O::AckTimeout(14)];
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), table.len(), "one row per fixture");
    for ((name, m), &(row, expected)) in fixtures.iter().zip(table) {
        assert_eq!(*name, row, "rows follow the fixtures");
        for (opt, ok) in options.into_iter().zip(expected) {
            let got = m.set_option(opt);
            assert_eq!(got.is_ok(), ok, "{name}: {opt}: {got:?}");
            if let Err(e) = got {
                assert_eq!(e.errno(), EINVAL, "{name}: {opt}");
            }
        }
    }
    assert!(IdMachine::new(PortSpace::Tcp).set_option(O::AckTimeout(32)).is_err());
    assert!(IdMachine::new(PortSpace::Ib).set_option(O::AckTimeout(31)).is_ok());
}

#[test]
fn migrating_waits_for_no_ack_but_refuses_unacked_events() {
    let l = bound().listen().unwrap();
    assert_eq!(l.migrate(), Ok(()));
    let pending = l.on_event(ConnectRequest).unwrap();
    assert_eq!(
        pending.migrate(),
        Err(CmError::UnackedEvents {
            call: Call::MigrateId,
            count: 1
        })
    );
    assert_eq!(pending.on_ack().unwrap().migrate(), Ok(()));
    assert!(bound().destroy().unwrap().migrate().is_err());
}

#[test]
#[rustfmt::skip]
fn every_event_in_every_state_is_refused_or_moves_the_id_as_the_table_says() {
    use Cell::{Refused as __, Same as OK, To, ToWithDevice};
    use ConnPhase as P;
    use IdState as S;
    use QpState as Q;
    let (init, rts, err) = (Some(Q::Init), Some(Q::Rts), Some(Q::Err));
    let removed = |qp| To(S::DeviceRemoval, P::None, qp);
    let gone = |p, qp| To(S::DeviceRemoval, p, qp);
    let failed = |qp| To(S::Connect, P::Failed, qp);
    // Columns: AddrResolved AddrError RouteResolved RouteError ConnectRequest
    // ConnectResponse ConnectError Unreachable Rejected Established Disconnected
    // DeviceRemoval MulticastJoin MulticastError AddrChange TimewaitExit.
    let table: [[Cell; 16]; 25] = [
        /* idle */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, __, __],
        /* bound */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, OK, __],
        /* wildcard */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, __, __],
        /* addr query */ [ToWithDevice(S::AddrResolved, P::None, None), To(S::AddrBound, P::None, None), __, __, __, __, __, __, __, __, __, removed(None), __, __, __, __],
        /* addr resolved */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, OK, __],
        /* route query */ [__, __, To(S::RouteResolved, P::None, None), To(S::AddrResolved, P::None, None), __, __, __, __, __, __, __, removed(None), __, __, OK, __],
        /* route resolved */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, OK, __],
        /* connecting */ [__, __, __, __, __, __, failed(err), failed(init), failed(err), To(S::Connect, P::Established, rts), __, gone(P::Connecting, err), __, __, OK, __],
        /* connecting, no QP */ [__, __, __, __, __, To(S::Connect, P::Responded, None), failed(None), failed(None), failed(None), __, __, gone(P::Connecting, None), __, __, OK, __],
        /* connecting, QP ERR */ [__, __, __, __, __, __, failed(err), failed(err), failed(err), __, __, gone(P::Connecting, err), __, __, OK, __],
        /* connecting UDP */ [__, __, __, __, __, To(S::Connect, P::Responded, None), failed(None), failed(None), failed(None), To(S::Connect, P::Established, None), __, gone(P::Connecting, None), OK, OK, OK, __],
        /* responded */ [__, __, __, __, __, __, __, failed(None), failed(None), __, __, gone(P::Responded, None), __, __, OK, __],
        /* established */ [__, __, __, __, __, __, __, __, failed(err), __, To(S::Disconnect, P::Established, rts), gone(P::Established, err), __, __, OK, __],
        /* failed */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Failed, err), __, __, OK, __],
        /* failed unreachable */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Failed, err), __, __, OK, __],
        /* child requested */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Requested, None), __, __, OK, __],
        /* child accepted */ [__, __, __, __, __, __, __, failed(rts), failed(err), To(S::Connect, P::Established, rts), To(S::Disconnect, P::Accepted, rts), gone(P::Accepted, err), __, __, OK, __],
        /* child rejected */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Rejected, None), __, __, OK, __],
        /* child established */ [__, __, __, __, __, __, __, __, failed(err), __, To(S::Disconnect, P::Established, rts), gone(P::Established, err), __, __, OK, __],
        /* disconnected */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Established, err), __, __, OK, OK],
        /* listening */ [__, __, __, __, OK, __, __, __, __, __, __, removed(None), __, __, OK, __],
        /* removed, pending */ [__, __, __, __, __, __, __, __, __, __, __, gone(P::Established, err), __, __, __, __],
        /* removed, no QP, pending */ [__, __, __, __, __, __, __, __, __, __, __, removed(None), __, __, __, __],
        /* removed */ [__, __, __, __, __, __, __, __, __, __, __, __, __, __, OK, __],
        /* destroying */ [__, __, __, __, __, __, __, __, __, __, __, __, __, __, __, __],
    ];
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), table.len());
    for ((name, m), row) in fixtures.into_iter().zip(table) {
        for (event, cell) in CmEventType::ALL.into_iter().zip(row) {
            let got = m.on_event(event);
            assert_eq!(got.is_ok(), m.check_event(event).is_ok(), "{name}: check_event({event})");
            let counted = IdMachine {
                unacked: m.unacked + 1,
                removal_pending: false,
                ..m
            };
            let want = match cell {
                Cell::Refused => Err(IllegalEvent {
                    event,
                    state: m.state,
                    phase: m.phase,
                }),
                Cell::Same => Ok(IdMachine {
                    unacked: m.unacked + 1,
                    ..m
                }),
                Cell::To(state, phase, qp) => Ok(IdMachine { state, phase, qp, ..counted }),
                Cell::ToWithDevice(state, phase, qp) => Ok(IdMachine {
                    state,
                    phase,
                    qp,
                    device: true,
                    ..counted
                }),
            };
            assert_eq!(got, want, "{name}: {event}");
        }
    }
}

#[test]
fn multicast_joins_need_a_datagram_id_bound_to_a_device_before_any_route() {
    use IdState as S;
    let udp = IdMachine::new(PortSpace::Udp);
    let bound = udp.bind_addr(false).unwrap();
    let resolved = udp
        .resolve_addr()
        .unwrap()
        .on_event(CmEventType::AddrResolved)
        .unwrap();
    let acked = resolved.on_ack().unwrap();
    let routing = acked.resolve_route().unwrap();
    let wrong = |m: &IdMachine| {
        Err(CmError::WrongState {
            call: Call::JoinMulticast,
            state: m.state(),
            expected: "a datagram id bound to a device (RDMA_CM_ADDR_BOUND or RDMA_CM_ADDR_RESOLVED)",
        })
    };
    let tcp_bound = IdMachine::new(PortSpace::Tcp).bind_addr(false).unwrap();
    let wildcard = udp.bind_addr(true).unwrap();
    let removed = bound.device_removed();
    let gone = |m: &IdMachine| {
        Err(CmError::WrongState {
            call: Call::JoinMulticast,
            state: m.state(),
            expected: "a live device (after DEVICE_REMOVAL only destroy is legal)",
        })
    };
    // (name, machine, join's answer, whether MULTICAST_JOIN / _ERROR may be retrieved)
    let rows: [(&str, IdMachine, Result<(), CmError>, bool); 8] = [
        ("udp idle", udp, wrong(&udp), false),
        ("udp bound", bound, Ok(()), true),
        ("udp wildcard-bound", wildcard, wrong(&wildcard), false),
        ("udp addr resolved", acked, Ok(()), true),
        ("udp route query", routing, wrong(&routing), true),
        ("tcp bound", tcp_bound, wrong(&tcp_bound), false),
        ("udp removed", removed, gone(&removed), false),
        (
            "udp destroying",
            bound.destroy().unwrap(),
            gone(&bound.destroy().unwrap()),
            false,
        ),
    ];
    for (name, m, join, events) in rows {
        assert_eq!(m.join_multicast(), join, "{name}: join");
        for ev in [CmEventType::MulticastJoin, CmEventType::MulticastError] {
            let got = m.on_event(ev);
            assert_eq!(got.is_ok(), events, "{name}: {ev}");
            if let Ok(next) = got {
                assert_eq!(next, m.count_event(), "{name}: {ev} changes only the count");
            }
        }
    }
    assert_eq!(routing.state(), S::RouteQuery);
}

#[test]
fn states_display_as_the_kernel_and_verbs_names() {
    let ids = [
        (IdState::Idle, "RDMA_CM_IDLE"),
        (IdState::AddrQuery, "RDMA_CM_ADDR_QUERY"),
        (IdState::AddrResolved, "RDMA_CM_ADDR_RESOLVED"),
        (IdState::RouteQuery, "RDMA_CM_ROUTE_QUERY"),
        (IdState::RouteResolved, "RDMA_CM_ROUTE_RESOLVED"),
        (IdState::Connect, "RDMA_CM_CONNECT"),
        (IdState::Disconnect, "RDMA_CM_DISCONNECT"),
        (IdState::AddrBound, "RDMA_CM_ADDR_BOUND"),
        (IdState::Listen, "RDMA_CM_LISTEN"),
        (IdState::DeviceRemoval, "RDMA_CM_DEVICE_REMOVAL"),
        (IdState::Destroying, "RDMA_CM_DESTROYING"),
    ];
    for (state, name) in ids {
        assert_eq!((state.name(), state.to_string()), (name, name.to_string()));
    }
    let qps = [
        (QpState::Reset, "IBV_QPS_RESET"),
        (QpState::Init, "IBV_QPS_INIT"),
        (QpState::Rtr, "IBV_QPS_RTR"),
        (QpState::Rts, "IBV_QPS_RTS"),
        (QpState::Err, "IBV_QPS_ERR"),
    ];
    for (state, name) in qps {
        assert_eq!((state.name(), state.to_string()), (name, name.to_string()));
    }
    let illegal = IdMachine::new(PortSpace::Tcp)
        .on_event(CmEventType::Established)
        .unwrap_err();
    assert_eq!(
        illegal.to_string(),
        "RDMA_CM_EVENT_ESTABLISHED is not legal for an id in RDMA_CM_IDLE (None)"
    );
}

#[test]
#[rustfmt::skip]
fn qp_transitions_and_posting_follow_the_ib_spec_in_every_state() {
    use QpState::*;
    const ALL: [QpState; 5] = [Reset, Init, Rtr, Rts, Err];
    // Rows: from; columns: to, in the order of ALL.
    let modify = [
        /* Reset */ [true, true, false, false, true],
        /* Init */ [true, true, true, false, true],
        /* Rtr */ [true, false, false, true, true],
        /* Rts */ [true, false, false, true, true],
        /* Err */ [true, false, false, false, true],
    ];
    for (from, row) in ALL.into_iter().zip(modify) {
        for (to, legal) in ALL.into_iter().zip(row) {
            assert_eq!(from.can_modify_to(to), legal, "{from} -> {to}");
        }
    }
    let send = [false, false, false, true, true];
    let recv = [false, true, true, true, true];
    for ((qp, send), recv) in ALL.into_iter().zip(send).zip(recv) {
        assert_eq!((qp.can_post_send(), qp.can_post_recv()), (send, recv), "{qp}");
    }
}

#[test]
fn accessors_report_what_the_calls_committed() {
    let m = IdMachine::new(PortSpace::Udp);
    assert_eq!(
        (m.port_space(), m.role(), m.has_device(), m.qp(), m.unacked()),
        (PortSpace::Udp, Role::Unassigned, false, None, 0)
    );
    let l = bound().listen().unwrap();
    assert_eq!(
        (l.port_space(), l.role(), l.has_device()),
        (PortSpace::Tcp, Role::Listener, true)
    );
    assert_eq!(addr_query().role(), Role::Active);
    assert_eq!(IdMachine::new_child(PortSpace::Tcp).role(), Role::Passive);
}

#[test]
fn only_an_established_connection_disconnects_on_the_wire() {
    assert!(established_active().disconnect_reaches_wire());
    assert!(accepted_child()
        .on_event(Established)
        .unwrap()
        .disconnect_reaches_wire());
    for m in [
        connecting(),
        accepted_child(),
        connecting().on_event(Rejected).unwrap(),
    ] {
        assert!(!m.disconnect_reaches_wire(), "{:?}", m.phase());
    }
}

#[test]
fn accept_after_the_qp_went_to_err_is_refused_with_its_state() {
    let child = IdMachine::new_child(PortSpace::Tcp).create_qp().unwrap();
    let err = child.disconnect().unwrap().accept(0).unwrap_err();
    assert_eq!(
        err,
        CmError::WrongQpState {
            call: Call::Accept,
            state: QpState::Err
        }
    );
    let ud = IdMachine::new_child(PortSpace::Udp).create_qp().unwrap();
    assert_eq!(ud.qp(), Some(QpState::Rts));
    let ud = ud.accept(136).unwrap();
    assert_eq!((ud.phase(), ud.qp()), (ConnPhase::Accepted, Some(QpState::Rts)));
}

#[test]
fn create_qp_is_refused_when_the_connection_attempt_is_over() {
    let failed = connecting().destroy_qp().unwrap().on_event(Rejected).unwrap();
    assert!(matches!(
        failed.create_qp(),
        Err(CmError::WrongState {
            call: Call::CreateQp,
            state: IdState::Connect,
            ..
        })
    ));
    for open in [
        connecting().destroy_qp().unwrap(),
        connecting()
            .destroy_qp()
            .unwrap()
            .on_event(ConnectResponse)
            .unwrap(),
        accepted_child().destroy_qp().unwrap(),
        established_active().destroy_qp().unwrap(),
        route_query(),
        addr_query().on_event(AddrResolved).unwrap(),
    ] {
        assert_eq!(
            open.create_qp().unwrap().qp(),
            Some(QpState::Init),
            "{:?}",
            open.phase()
        );
    }
    let removed = bound().device_removed();
    assert!(matches!(
        removed.create_qp(),
        Err(CmError::WrongState {
            state: IdState::DeviceRemoval,
            ..
        })
    ));
    assert!(bound().destroy().unwrap().create_qp().is_err(), "destroying");
    assert_eq!(
        IdMachine::new(PortSpace::Tcp).create_qp().unwrap_err(),
        CmError::NoDevice { call: Call::CreateQp }
    );
}

#[test]
fn after_device_removal_only_destroy_is_legal_on_an_id_without_a_qp() {
    let m = bound().device_removed();
    assert_eq!((m.state(), m.qp()), (IdState::DeviceRemoval, None));
    let calls = [
        m.bind_addr(false),
        m.resolve_addr(),
        m.resolve_route(),
        m.listen(),
        m.create_qp(),
        m.connect(0),
        m.accept(0),
        m.reject(0),
        m.disconnect(),
    ];
    for call in calls {
        assert!(matches!(call, Err(CmError::WrongState { .. })), "{call:?}");
    }
    assert_eq!(
        m.destroy_qp().unwrap_err(),
        CmError::NoQp {
            call: Call::DestroyQp
        }
    );
    assert_eq!(m.destroy().unwrap().state(), IdState::Destroying);
    let announced = m.on_event(DeviceRemoval).unwrap();
    assert_eq!((announced.qp(), announced.unacked()), (None, 1));
    assert!(announced.on_ack().unwrap().destroy().is_ok());
    let destroying = bound().destroy().unwrap();
    assert_eq!(destroying.device_removed(), destroying, "nothing to remove from");
}

#[test]
fn the_data_path_checks_the_qp_and_the_port_space() {
    let m = IdMachine::new(PortSpace::Tcp);
    assert_eq!(m.post_send().unwrap_err(), CmError::NoQp { call: Call::PostSend });
    assert_eq!(m.post_recv().unwrap_err(), CmError::NoQp { call: Call::PostRecv });
    let ud = IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .create_qp()
        .unwrap();
    assert!(matches!(
        ud.post_send(),
        Err(CmError::InvalidArgument {
            call: Call::PostSend,
            ..
        })
    ));
    assert!(ud.post_recv().is_ok());
    let est = established_active();
    assert!(est.post_send().is_ok() && est.post_recv().is_ok());
    let broken = est.qp_error();
    assert_eq!(
        broken,
        IdMachine {
            qp: Some(QpState::Err),
            ..est
        }
    );
    assert!(broken.post_send().is_ok(), "posted in ERR, completes flushed");
    assert_eq!(m.qp_error(), m, "no QP to break");
}

#[test]
fn connect_response_outcome_follows_the_qp() {
    assert_eq!(connecting().connect_response_outcome(), Established);
    assert_eq!(
        connecting().destroy_qp().unwrap().connect_response_outcome(),
        ConnectResponse
    );
    assert_eq!(
        connecting().disconnect().unwrap().connect_response_outcome(),
        ConnectError
    );
    assert_eq!(connecting_udp().connect_response_outcome(), Established);
}

#[test]
fn counting_and_acking_change_only_the_unacked_count() {
    let m = established_active().count_event().count_event();
    assert_eq!(
        m,
        IdMachine {
            unacked: 2,
            ..established_active()
        }
    );
    assert_eq!(m.on_ack().unwrap(), IdMachine { unacked: 1, ..m });
}

#[test]
fn a_child_whose_device_went_away_can_be_neither_accepted_nor_rejected() {
    for child in [
        IdMachine::new_child(PortSpace::Tcp),
        IdMachine::new_child(PortSpace::Tcp).create_qp().unwrap(),
    ] {
        let removed = child.device_removed();
        assert_eq!(
            removed.phase(),
            ConnPhase::Requested,
            "the request is still unanswered"
        );
        for (call, got) in [
            (Call::Accept, removed.accept(0)),
            (Call::Reject, removed.reject(0)),
        ] {
            assert!(
                matches!(
                    got,
                    Err(CmError::WrongState { call: c, state: IdState::DeviceRemoval, .. }) if c == call
                ),
                "{call}: {got:?}"
            );
        }
    }
    let listener = bound().listen().unwrap();
    assert!(matches!(
        listener.accept(0),
        Err(CmError::WrongState {
            call: Call::Accept,
            state: IdState::Listen,
            ..
        })
    ));
}

/// What `reg_mr` and `create_srq` answer on an id (both work on its device's protection
/// domain).
#[derive(Clone, Copy, Debug)]
enum Pd {
    /// Taken: the id is alive and bound to a device.
    Taken,
    /// `NoDevice`: no device bound yet (or only the wildcard address).
    NoDevice,
    /// `WrongState`: the device went away or the id is being destroyed.
    Gone,
}

#[test]
#[rustfmt::skip]
fn every_state_has_a_cm_exchange_and_takes_regions_and_srqs_as_the_table_says() {
    use Pd::{Gone, NoDevice, Taken};
    // Per fixture: whether the kernel has an IB CM exchange for the id (RDMA_CM_CONNECT or
    // RDMA_CM_DISCONNECT), and what reg_mr and create_srq answer.
    let table: &[(&str, bool, Pd)] = &[
        ("idle",                                 false, NoDevice),
        ("bound",                                false, Taken),
        ("bound to the wildcard",                false, NoDevice),
        ("addr query",                           false, NoDevice),
        ("addr resolved",                        false, Taken),
        ("route query",                          false, Taken),
        ("route resolved",                       false, Taken),
        ("connecting",                           true,  Taken),
        ("connecting, QP destroyed",             true,  Taken),
        ("connecting, QP in ERR",                true,  Taken),
        ("connecting UDP",                       true,  Taken),
        ("responded",                            true,  Taken),
        ("established",                          true,  Taken),
        ("failed",                               true,  Taken),
        ("failed unreachable, QP in INIT",       true,  Taken),
        ("child requested",                      true,  Taken),
        ("child accepted",                       true,  Taken),
        ("child rejected",                       true,  Taken),
        ("child established",                    true,  Taken),
        ("disconnected",                         true,  Taken),
        ("listening",                            false, Taken),
        ("removed, not announced",               false, Gone),
        ("removed without a QP, not announced",  false, Gone),
        ("removed",                              false, Gone),
        ("destroying",                           false, Gone),
    ];
    let fixtures = fixtures();
    assert_eq!(fixtures.len(), table.len(), "one row per fixture");
    for ((name, m), &(row, exchange, pd)) in fixtures.iter().zip(table) {
        assert_eq!(*name, row, "rows follow the fixtures");
        assert_eq!(m.has_cm_exchange(), exchange, "{name}: has_cm_exchange");
        for (call, got) in [(Call::RegMr, m.reg_mr()), (Call::CreateSrq, m.create_srq())] {
            let want = match pd {
                Taken => Ok(()),
                NoDevice => Err(CmError::NoDevice { call }),
                Gone => Err(CmError::WrongState {
                    call,
                    state: m.state(),
                    expected: "a live device (after DEVICE_REMOVAL only destroy is legal)",
                }),
            };
            assert_eq!(got, want, "{name}: {call}");
        }
        // None of them connected with the application's QP or made one on an SRQ.
        assert!(!m.is_external() && !m.uses_srq(), "{name}");
    }
}

#[test]
fn a_qp_on_an_srq_takes_no_receives_of_its_own_until_it_is_destroyed() {
    let on_srq_refusal = Err(CmError::InvalidArgument {
        call: Call::PostRecv,
        reason: "the QP takes its receives from a shared receive queue: post them there",
    });
    let child = IdMachine::new_child(PortSpace::Tcp);
    let on_srq = child.create_qp_on_srq().unwrap();
    assert_eq!(
        on_srq,
        IdMachine {
            srq: true,
            ..child.create_qp().unwrap()
        },
        "a QP as create_qp makes it, on the SRQ"
    );
    assert!(on_srq.uses_srq() && !child.create_qp().unwrap().uses_srq());
    assert_eq!(on_srq.post_recv(), on_srq_refusal, "in INIT");
    let accepted = on_srq.accept(0).unwrap();
    assert!(accepted.uses_srq(), "accept keeps the SRQ");
    assert_eq!(accepted.post_send(), Ok(()));
    assert_eq!(accepted.post_recv(), on_srq_refusal, "in RTS");
    assert_eq!(accepted.qp_error().post_recv(), on_srq_refusal, "in ERR");
    // The SRQ went with the QP: a QP made after it has its own receive queue.
    let without = accepted.destroy_qp().unwrap();
    assert!(!without.uses_srq());
    assert_eq!(without.post_recv(), Err(CmError::NoQp { call: Call::PostRecv }));
    let own = without.create_qp().unwrap();
    assert_eq!((own.uses_srq(), own.post_recv()), (false, Ok(())));
    let ud = IdMachine::new(PortSpace::Udp)
        .bind_addr(false)
        .unwrap()
        .create_qp_on_srq()
        .unwrap();
    assert_eq!((ud.qp(), ud.post_send_to()), (Some(QpState::Rts), Ok(())));
    assert_eq!(ud.post_recv(), on_srq_refusal, "datagram QPs too");
    // create_qp's refusals stand.
    assert_eq!(
        IdMachine::new(PortSpace::Tcp).create_qp_on_srq().unwrap_err(),
        CmError::NoDevice { call: Call::CreateQp }
    );
    assert_eq!(on_srq.create_qp_on_srq().unwrap_err(), CmError::QpExists);
}

#[test]
fn one_sided_operations_need_a_connected_qp_that_may_send() {
    use crate::SendOp;
    let remote = crate::RemoteAddr {
        addr: 0x1000,
        rkey: 7,
    };
    let ops = [
        SendOp::Send { imm: None },
        SendOp::Write { remote, imm: Some(1) },
        SendOp::Read { remote },
        SendOp::CompareSwap {
            remote,
            compare: 1,
            swap: 2,
        },
        SendOp::FetchAdd { remote, add: 1 },
    ];
    type Answer = Result<(), CmError>;
    let no_qp: Answer = Err(CmError::NoQp { call: Call::PostSend });
    let in_init: Answer = Err(CmError::WrongQpState {
        call: Call::PostSend,
        state: QpState::Init,
    });
    let rc_only: Answer = Err(CmError::InvalidArgument {
        call: Call::PostSend,
        reason: "RDMA READ, WRITE and atomics need a connected (RC) QP",
    });
    let no_ah: Answer = Err(CmError::InvalidArgument {
        call: Call::PostSend,
        reason: "sends on datagram (UD) QPs need an address handle, which post_send does not carry",
    });
    let ud = IdMachine::new(PortSpace::Udp).bind_addr(false).unwrap();
    // (machine, the answer for SEND, the answer for each one-sided operation)
    let table = [
        ("RC, no QP", bound(), no_qp.clone(), no_qp.clone()),
        (
            "RC, QP in INIT",
            route_resolved_with_qp(),
            in_init.clone(),
            in_init,
        ),
        ("RC, established", established_active(), Ok(()), Ok(())),
        ("RC, QP in ERR", established_active().qp_error(), Ok(()), Ok(())),
        ("UD, no QP", ud, no_qp.clone(), no_qp),
        ("UD, QP in RTS", ud.create_qp().unwrap(), no_ah, rc_only),
    ];
    for (name, m, send, one_sided) in table {
        for op in ops {
            let want = if matches!(op, SendOp::Send { .. }) {
                &send
            } else {
                &one_sided
            };
            assert_eq!(&m.post_send_wr(&op), want, "{name}: {op:?}");
        }
    }
}
