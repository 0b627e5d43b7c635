//! The exchange told as protocol stories, then as a table: each test feeds the machine a call,
//! a message or a timer and reads the effects the fabric would carry out. The table at the end
//! writes out every transition by hand (from the kernel's cm.c, not from the machine), and
//! checks that every other (state, input) pair changes nothing.

use super::*;

const ALL_WIRES: [Wire; 12] = [
    Wire::Idle,
    Wire::ReqSent,
    Wire::MraReqRcvd,
    Wire::RepRcvd,
    Wire::ReqRcvd,
    Wire::RepSent,
    Wire::MraRepRcvd,
    Wire::Established,
    Wire::DreqSent,
    Wire::DreqRcvd,
    Wire::TimeWait,
    Wire::Closed,
];
const ALL_MSGS: [MsgKind; 7] = MsgKind::ALL;
const ALL_TIMERS: [CmTimer; 3] = [CmTimer::Response, CmTimer::Service, CmTimer::Timewait];
const RETRIES: u8 = 15;
const RC: Params = Params {
    connected: true,
    retries: RETRIES,
};
const UD: Params = Params {
    connected: false,
    retries: RETRIES,
};

fn at(wire: Wire) -> Exchange {
    Exchange::new().to(wire)
}

/// Feeds `input`, asserting it is taken; returns the next state and its effects.
fn step(x: Exchange, input: Input, p: Params) -> (Exchange, Vec<Effect>) {
    let (next, effects) = x
        .on(input, p)
        .unwrap_or_else(|| panic!("{input:?} refused in {:?}", x.wire));
    (next, effects.as_slice().to_vec())
}

fn sent(msg: MsgKind, status: i32, to: To, carry: Carry) -> Effect {
    send(msg, status, to, carry)
}

fn event(event: CmEventType, status: i32) -> Effect {
    queue(event, status)
}

fn every_input() -> Vec<Input> {
    let mut inputs = vec![
        Input::Connect,
        Input::Accept,
        Input::Reject,
        Input::Disconnect,
        Input::Establish,
        Input::Destroy,
        Input::DeviceRemoved,
    ];
    inputs.extend(ALL_MSGS.iter().map(|&m| Input::Msg(m, 28)));
    inputs.extend(ALL_TIMERS.iter().map(|&t| Input::Timer(t)));
    inputs
}

#[test]
fn active_side_sends_req_gets_rep_and_sends_rtu_when_the_response_is_retrieved() {
    let (x, fx) = step(Exchange::new(), Input::Connect, RC);
    assert_eq!(x.wire(), Wire::ReqSent);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Response),
            sent(MsgKind::Req, 0, To::Peer, Carry::Keep)
        ]
    );
    let (x, fx) = step(x, Input::Msg(MsgKind::Rep, 0), RC);
    assert_eq!(x.wire(), Wire::RepRcvd);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::PeerIsSender,
            Effect::Queue {
                event: CmEventType::ConnectResponse,
                status: 0,
                with_message: true
            }
        ]
    );
    let (ev, status, x, fx) = x.on_connect_response(CmEventType::Established, 0, true);
    assert_eq!(
        (ev, status, x.wire()),
        (CmEventType::Established, 0, Wire::Established)
    );
    assert_eq!(fx.as_slice(), [sent(MsgKind::Rtu, 0, To::Peer, Carry::Nothing)]);
}

#[test]
fn passive_side_accepts_sends_rep_and_is_established_by_the_rtu() {
    let (x, fx) = step(Exchange::requested(), Input::Accept, RC);
    assert_eq!(x.wire(), Wire::RepSent);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Response),
            sent(MsgKind::Rep, 0, To::Peer, Carry::Keep)
        ]
    );
    let (x, fx) = step(x, Input::Msg(MsgKind::Rtu, 0), RC);
    assert_eq!(x.wire(), Wire::Established);
    assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Established, 0)]);
}

#[test]
fn datagram_exchange_ends_with_the_sidr_rep_and_sends_no_rtu() {
    let (x, fx) = step(Exchange::requested(), Input::Accept, UD);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            sent(MsgKind::Rep, 0, To::Peer, Carry::CallPayload)
        ]
    );
    let (x, _) = step(at(Wire::ReqSent), Input::Msg(MsgKind::Rep, 0), UD);
    assert_eq!(x.wire(), Wire::Closed);
    let (ev, _, x, fx) = x.on_connect_response(CmEventType::Established, 0, false);
    assert_eq!((ev, x.wire()), (CmEventType::Established, Wire::Closed));
    assert!(fx.as_slice().is_empty());
}

#[test]
fn consumer_reject_reaches_the_requester_as_rejected_with_its_private_data() {
    let (x, fx) = step(Exchange::requested(), Input::Reject, RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(
        fx,
        [sent(
            MsgKind::Rej,
            reason::CONSUMER_DEFINED,
            To::Peer,
            Carry::CallPayload
        )]
    );
    let (x, fx) = step(
        at(Wire::ReqSent),
        Input::Msg(MsgKind::Rej, reason::CONSUMER_DEFINED),
        RC,
    );
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Queue {
                event: CmEventType::Rejected,
                status: reason::CONSUMER_DEFINED,
                with_message: true
            }
        ]
    );
}

#[test]
fn datagram_reject_is_a_sidr_reject_without_data_and_arrives_as_unreachable() {
    let (_, fx) = step(Exchange::requested(), Input::Reject, UD);
    assert_eq!(
        fx,
        [sent(MsgKind::Rej, reason::SIDR_REJECT, To::Peer, Carry::Nothing)]
    );
    let (_, fx) = step(
        at(Wire::ReqSent),
        Input::Msg(MsgKind::Rej, reason::SIDR_REJECT),
        UD,
    );
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Queue {
                event: CmEventType::Unreachable,
                status: reason::SIDR_REJECT,
                with_message: false
            }
        ]
    );
}

/// Sends `x` the response timer `n` times, asserting each is a retry of `msg`.
fn retried(mut x: Exchange, n: u8, timer: CmTimer, msg: MsgKind, carry: Carry) -> Exchange {
    for i in 0..n {
        let (next, fx) = step(x, Input::Timer(timer), RC);
        assert_eq!(next.wire(), x.wire(), "try {i}");
        assert_eq!(fx, [Effect::Arm(timer), sent(msg, 0, To::Peer, carry)], "try {i}");
        x = next;
    }
    x
}

#[test]
fn an_unanswered_req_is_sent_again_on_its_timer_then_unreachable_without_a_rej() {
    let x = retried(
        at(Wire::ReqSent),
        RETRIES,
        CmTimer::Response,
        MsgKind::Req,
        Carry::Kept,
    );
    // The last try timed out: `cm_process_send_error` resets the id and rdma_cm reports it;
    // no REJ goes to the passive side (it hears nothing and keeps its child).
    let (x, fx) = step(x, Input::Timer(CmTimer::Response), RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(fx, [event(CmEventType::Unreachable, -errno::ETIMEDOUT)]);
}

#[test]
fn fewer_retries_give_up_sooner_and_none_gives_up_at_the_first_timeout() {
    for retries in [0u8, 1, 3] {
        let p = Params { retries, ..RC };
        let mut x = at(Wire::ReqSent);
        for _ in 0..retries {
            x = x.on(Input::Timer(CmTimer::Response), p).unwrap().0;
            assert_eq!(x.wire(), Wire::ReqSent);
        }
        let (x, _) = x.on(Input::Timer(CmTimer::Response), p).unwrap();
        assert_eq!(x.wire(), Wire::Closed, "{retries} retries");
    }
}

#[test]
fn an_unanswered_rep_is_sent_again_then_unreachable_on_the_passive_side() {
    let x = retried(
        at(Wire::RepSent),
        RETRIES,
        CmTimer::Response,
        MsgKind::Rep,
        Carry::Kept,
    );
    let (x, fx) = step(x, Input::Timer(CmTimer::Response), RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(fx, [event(CmEventType::Unreachable, -errno::ETIMEDOUT)]);
}

#[test]
fn an_unanswered_dreq_is_sent_again_then_disconnected_with_etimedout() {
    let x = retried(
        at(Wire::DreqSent),
        RETRIES,
        CmTimer::Response,
        MsgKind::Dreq,
        Carry::Nothing,
    );
    let (x, fx) = step(x, Input::Timer(CmTimer::Response), RC);
    assert_eq!(x.wire(), Wire::TimeWait);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Timewait),
            event(CmEventType::Disconnected, -errno::ETIMEDOUT)
        ]
    );
}

#[test]
fn a_new_message_starts_its_tries_afresh() {
    // A connection whose REQ needed retries starts its DREQ's count at zero.
    let x = retried(at(Wire::ReqSent), 5, CmTimer::Response, MsgKind::Req, Carry::Kept);
    let (x, _) = step(x, Input::Msg(MsgKind::Rep, 0), RC);
    let x = x.on_connect_response(CmEventType::Established, 0, true).2;
    let (x, _) = step(x, Input::Disconnect, RC);
    let x = retried(x, RETRIES, CmTimer::Response, MsgKind::Dreq, Carry::Nothing);
    assert_eq!(
        step(x, Input::Timer(CmTimer::Response), RC).0.wire(),
        Wire::TimeWait
    );
    // So does a passive side's REP after its REQ.
    let x = Exchange {
        retried: RETRIES,
        ..Exchange::requested()
    };
    let (x, _) = step(x, Input::Accept, RC);
    assert_eq!(
        step(x, Input::Timer(CmTimer::Response), RC).0.wire(),
        Wire::RepSent
    );
}

#[test]
fn a_duplicate_req_before_the_accept_draws_the_mra_rdma_cm_deferred() {
    let (x, fx) = step(Exchange::requested(), Input::Msg(MsgKind::Req, 0), RC);
    assert_eq!(x, Exchange::requested());
    assert_eq!(fx, [sent(MsgKind::Mra, 0, To::Sender, Carry::Nothing)]);
    // A SIDR child has no MRA to send: the duplicate is dropped.
    let (x, fx) = step(Exchange::requested(), Input::Msg(MsgKind::Req, 0), UD);
    assert_eq!((x, fx), (Exchange::requested(), vec![]));
    // After the accept (and later) the duplicate is dropped (`cm_dup_req_handler`'s default).
    for wire in [
        Wire::RepSent,
        Wire::MraRepRcvd,
        Wire::Established,
        Wire::DreqSent,
        Wire::DreqRcvd,
    ] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Req, 0), RC);
        assert_eq!((x, fx), (at(wire), vec![]), "{wire:?}");
    }
}

#[test]
fn an_mra_stretches_the_requests_tries_to_its_service_timeout() {
    let (x, fx) = step(at(Wire::ReqSent), Input::Msg(MsgKind::Mra, 0), RC);
    assert_eq!(x.wire(), Wire::MraReqRcvd);
    assert_eq!(fx, [Effect::CancelTimers, Effect::Arm(CmTimer::Service)]);
    // The tries go on, each waiting the service timeout, and a second MRA changes nothing.
    let x = retried(x, 3, CmTimer::Service, MsgKind::Req, Carry::Kept);
    let (again, fx) = step(x, Input::Msg(MsgKind::Mra, 0), RC);
    assert_eq!((again, fx), (x, vec![]));
    // The REP still completes the request.
    let (x, _) = step(x, Input::Msg(MsgKind::Rep, 0), RC);
    assert_eq!(x.wire(), Wire::RepRcvd);
    // And the count of tries carries over from before the MRA.
    let x = Exchange {
        retried: RETRIES,
        ..at(Wire::MraReqRcvd)
    };
    let (x, fx) = step(x, Input::Timer(CmTimer::Service), RC);
    assert_eq!(
        (x.wire(), fx),
        (
            Wire::Closed,
            vec![event(CmEventType::Unreachable, -errno::ETIMEDOUT)]
        )
    );
}

#[test]
fn an_mra_for_the_rep_stretches_the_passive_sides_tries() {
    let (x, fx) = step(at(Wire::RepSent), Input::Msg(MsgKind::Mra, 0), RC);
    assert_eq!(x.wire(), Wire::MraRepRcvd);
    assert_eq!(fx, [Effect::CancelTimers, Effect::Arm(CmTimer::Service)]);
    let x = retried(x, 2, CmTimer::Service, MsgKind::Rep, Carry::Kept);
    let (x, fx) = step(x, Input::Msg(MsgKind::Rtu, 0), RC);
    assert_eq!(x.wire(), Wire::Established);
    assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Established, 0)]);
}

#[test]
fn a_duplicate_rep_draws_an_mra_before_the_response_is_retrieved_and_the_rtu_after() {
    let (x, fx) = step(at(Wire::RepRcvd), Input::Msg(MsgKind::Rep, 0), RC);
    assert_eq!(
        (x, fx),
        (
            at(Wire::RepRcvd),
            vec![sent(MsgKind::Mra, 0, To::Sender, Carry::Nothing)]
        )
    );
    let (x, fx) = step(at(Wire::Established), Input::Msg(MsgKind::Rep, 0), RC);
    assert_eq!(
        (x, fx),
        (
            at(Wire::Established),
            vec![sent(MsgKind::Rtu, 0, To::Sender, Carry::Nothing)]
        )
    );
    // Once the connection is past it, or for SIDR, nothing.
    for (wire, p) in [
        (Wire::DreqSent, RC),
        (Wire::TimeWait, RC),
        (Wire::Closed, RC),
        (Wire::Closed, UD),
    ] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Rep, 0), p);
        assert_eq!((x, fx), (at(wire), vec![]), "{wire:?}");
    }
}

#[test]
fn a_lost_rtu_is_made_up_for_by_the_reps_retry() {
    // Passive side in REP_SENT retries its REP; the active side, established, answers with
    // the RTU again, which establishes the passive side.
    let passive = retried(at(Wire::RepSent), 1, CmTimer::Response, MsgKind::Rep, Carry::Kept);
    let (_, fx) = step(at(Wire::Established), Input::Msg(MsgKind::Rep, 0), RC);
    assert_eq!(fx, [sent(MsgKind::Rtu, 0, To::Sender, Carry::Nothing)]);
    let (passive, _) = step(passive, Input::Msg(MsgKind::Rtu, 0), RC);
    assert_eq!(passive.wire(), Wire::Established);
}

#[test]
fn rej_reaches_every_side_of_an_open_exchange_but_an_unaccepted_child_hears_nothing() {
    for wire in [
        Wire::ReqSent,
        Wire::MraReqRcvd,
        Wire::RepRcvd,
        Wire::RepSent,
        Wire::MraRepRcvd,
    ] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Rej, 28), RC);
        assert_eq!(x.wire(), Wire::Closed, "{wire:?}");
        assert_eq!(
            fx,
            [
                Effect::CancelTimers,
                Effect::Queue {
                    event: CmEventType::Rejected,
                    status: 28,
                    with_message: true
                }
            ],
            "{wire:?}"
        );
    }
    let (x, fx) = step(Exchange::requested(), Input::Msg(MsgKind::Rej, 1), RC);
    assert_eq!((x.wire(), fx), (Wire::Closed, vec![Effect::CancelTimers]));
}

#[test]
fn a_late_rej_on_an_established_connection_is_rejected_and_ends_in_timewait() {
    // The passive side destroyed its child before the RTU arrived (its REJ is consumer
    // defined): the kernel's `cm_rej_handler` takes it in ESTABLISHED, rdma_cm reports it.
    for wire in [Wire::Established, Wire::DreqSent] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Rej, 28), RC);
        assert_eq!(x.wire(), Wire::TimeWait, "{wire:?}");
        assert_eq!(
            fx,
            [
                Effect::CancelTimers,
                Effect::Arm(CmTimer::Timewait),
                Effect::Queue {
                    event: CmEventType::Rejected,
                    status: 28,
                    with_message: true
                }
            ],
            "{wire:?}"
        );
        // rdma_cm stays in RDMA_CM_CONNECT: the end of timewait says nothing.
        let (x, fx) = step(x, Input::Timer(CmTimer::Timewait), RC);
        assert_eq!((x.wire(), fx), (Wire::Closed, vec![]), "{wire:?}");
    }
    // After `DISCONNECTED` rdma_cm drops the REJ; the IB CM still enters timewait.
    let x = Exchange {
        disconnected: true,
        ..at(Wire::DreqSent)
    };
    let (x, fx) = step(x, Input::Msg(MsgKind::Rej, 28), RC);
    assert_eq!(
        (x.wire(), fx),
        (
            Wire::TimeWait,
            vec![Effect::CancelTimers, Effect::Arm(CmTimer::Timewait)]
        )
    );
}

#[test]
fn active_disconnect_completes_with_the_drep_then_timewait_exits() {
    let (x, fx) = step(at(Wire::Established), Input::Disconnect, RC);
    assert_eq!(x.wire(), Wire::DreqSent);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Response),
            sent(MsgKind::Dreq, 0, To::Peer, Carry::Nothing)
        ]
    );
    let (x, fx) = step(x, Input::Msg(MsgKind::Drep, 0), RC);
    assert_eq!(x.wire(), Wire::TimeWait);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Timewait),
            event(CmEventType::Disconnected, 0)
        ]
    );
    let (x, fx) = step(x, Input::Timer(CmTimer::Timewait), RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(fx, [event(CmEventType::TimewaitExit, 0)]);
}

#[test]
fn passive_disconnect_hears_the_dreq_once_and_answers_with_a_drep() {
    let (x, fx) = step(at(Wire::Established), Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!(x.wire(), Wire::DreqRcvd);
    assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Disconnected, 0)]);
    // A retransmitted DREQ while the DREP is not sent yet changes nothing (counted only).
    let (again, fx) = step(x, Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!((again, fx), (x, vec![]));
    let (x, fx) = step(x, Input::Disconnect, RC);
    assert_eq!(x.wire(), Wire::TimeWait);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Timewait),
            sent(MsgKind::Drep, 0, To::Peer, Carry::Nothing)
        ]
    );
    // A retransmitted DREQ in timewait (its DREP was lost) gets the DREP again.
    let (again, fx) = step(x, Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!(
        (again, fx),
        (x, vec![sent(MsgKind::Drep, 0, To::Sender, Carry::Nothing)])
    );
    let (x, fx) = step(x, Input::Timer(CmTimer::Timewait), RC);
    assert_eq!(fx, [event(CmEventType::TimewaitExit, 0)]);
    // After timewait the id ignores it: the initiator's tries run out (`-ETIMEDOUT`).
    let (again, fx) = step(x, Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!((again, fx), (x, vec![]));
}

#[test]
fn dreq_before_the_rtu_disconnects_the_passive_side() {
    for wire in [Wire::RepSent, Wire::MraRepRcvd] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Dreq, 0), RC);
        assert_eq!(x.wire(), Wire::DreqRcvd);
        assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Disconnected, 0)]);
    }
}

#[test]
fn a_drep_to_a_dreq_received_ends_in_timewait_without_a_second_disconnected() {
    let (x, _) = step(at(Wire::Established), Input::Msg(MsgKind::Dreq, 0), RC);
    let (x, fx) = step(x, Input::Msg(MsgKind::Drep, 0), RC);
    assert_eq!(x.wire(), Wire::TimeWait);
    assert_eq!(fx, [Effect::CancelTimers, Effect::Arm(CmTimer::Timewait)]);
}

#[test]
fn simultaneous_disconnect_each_side_answers_the_others_dreq_and_says_disconnected_once() {
    let (a, _) = step(at(Wire::Established), Input::Disconnect, RC);
    let (b, _) = step(at(Wire::Established), Input::Disconnect, RC);
    for side in [a, b] {
        let (x, fx) = step(side, Input::Msg(MsgKind::Dreq, 0), RC);
        assert_eq!(x.wire(), Wire::TimeWait);
        assert_eq!(
            fx,
            [
                Effect::CancelTimers,
                Effect::Arm(CmTimer::Timewait),
                event(CmEventType::Disconnected, 0),
                sent(MsgKind::Drep, 0, To::Sender, Carry::Nothing)
            ]
        );
        // The other side's DREP then finds the exchange in timewait: nothing more.
        let (y, fx) = step(x, Input::Msg(MsgKind::Drep, 0), RC);
        assert_eq!((y, fx), (x, vec![]));
    }
}

#[test]
fn disconnected_is_said_at_most_once_even_when_the_dreq_later_times_out() {
    let x = Exchange {
        disconnected: true,
        retried: RETRIES,
        ..at(Wire::DreqSent)
    };
    let (_, fx) = step(x, Input::Timer(CmTimer::Response), RC);
    assert_eq!(fx, [Effect::CancelTimers, Effect::Arm(CmTimer::Timewait)]);
    let (_, fx) = step(x, Input::Msg(MsgKind::Drep, 0), RC);
    assert_eq!(fx, [Effect::CancelTimers, Effect::Arm(CmTimer::Timewait)]);
}

#[test]
fn timewait_exit_is_silent_for_an_id_that_never_said_disconnected() {
    let (x, fx) = step(at(Wire::TimeWait), Input::Timer(CmTimer::Timewait), RC);
    assert_eq!((x.wire(), fx), (Wire::Closed, vec![]));
}

#[test]
fn rej_that_arrived_before_the_response_was_retrieved_makes_it_a_connect_error() {
    let (x, _) = step(at(Wire::RepRcvd), Input::Msg(MsgKind::Rej, 28), RC);
    let (ev, status, x, fx) = x.on_connect_response(CmEventType::Established, 0, true);
    assert_eq!((ev, status), (CmEventType::ConnectError, -1));
    assert!(fx.as_slice().is_empty(), "no RTU after a REJ");
    assert!(x.swallows(CmEventType::Rejected));
    assert!(x.swallows(CmEventType::Disconnected));
    assert!(!x.swallows(CmEventType::TimewaitExit));
    assert!(!Exchange::new().swallows(CmEventType::Rejected));
    // On a datagram port space there is no RTU to fail.
    let (ev, _, _, _) = at(Wire::Closed).on_connect_response(CmEventType::Established, 0, false);
    assert_eq!(ev, CmEventType::Established);
}

#[test]
fn connect_error_decided_by_the_application_machine_sends_no_rtu() {
    let (ev, status, x, fx) = at(Wire::RepRcvd).on_connect_response(CmEventType::ConnectError, 0, true);
    assert_eq!(
        (ev, status, x.wire()),
        (CmEventType::ConnectError, -1, Wire::RepRcvd)
    );
    assert!(fx.as_slice().is_empty());
    assert!(x.swallows(CmEventType::Rejected));
}

#[test]
fn what_the_fabric_asks_of_each_state() {
    use Wire::*;
    for wire in ALL_WIRES {
        let x = at(wire);
        assert_eq!(x.requesting(), matches!(wire, ReqSent | MraReqRcvd), "{wire:?}");
        assert_eq!(
            x.keeps_message(),
            matches!(wire, ReqSent | MraReqRcvd | RepSent | MraRepRcvd),
            "{wire:?}"
        );
        assert_eq!(
            x.holds_request(true),
            matches!(
                wire,
                ReqRcvd | RepSent | MraRepRcvd | Established | DreqSent | DreqRcvd
            ),
            "{wire:?}"
        );
        assert_eq!(x.holds_request(false), wire == ReqRcvd, "{wire:?}");
        let ended = matches!(wire, DreqSent | DreqRcvd | TimeWait | Closed);
        assert_eq!(x.ended_early(), ended, "{wire:?}");
    }
}

#[test]
fn destroy_in_every_state_tells_the_peer_what_the_state_calls_for() {
    let rej = |status| vec![sent(MsgKind::Rej, status, To::Peer, Carry::EmptyPrivateData)];
    for p in [RC, UD] {
        let refused = if p.connected {
            reason::CONSUMER_DEFINED
        } else {
            reason::SIDR_REJECT
        };
        for wire in ALL_WIRES {
            let expected = match wire {
                Wire::ReqSent | Wire::MraReqRcvd => rej(reason::TIMEOUT),
                Wire::ReqRcvd | Wire::RepRcvd | Wire::RepSent | Wire::MraRepRcvd => rej(refused),
                Wire::Established => vec![sent(MsgKind::Dreq, 0, To::Peer, Carry::Nothing)],
                Wire::DreqRcvd => vec![sent(MsgKind::Drep, 0, To::Peer, Carry::Nothing)],
                Wire::Idle | Wire::DreqSent | Wire::TimeWait | Wire::Closed => vec![],
            };
            let (x, fx) = step(at(wire), Input::Destroy, p);
            assert_eq!(x.wire(), Wire::Closed, "{wire:?}");
            assert_eq!(fx, expected, "destroy in {wire:?}, connected {}", p.connected);
        }
    }
}

#[test]
fn device_removal_in_every_state_closes_the_exchange_without_a_word() {
    for wire in ALL_WIRES {
        let (x, fx) = step(at(wire), Input::DeviceRemoved, RC);
        assert_eq!(
            (x.wire(), fx),
            (Wire::Closed, vec![Effect::CancelTimers]),
            "{wire:?}"
        );
    }
}

#[test]
fn accept_and_reject_are_refused_without_a_pending_request() {
    for wire in ALL_WIRES {
        for input in [Input::Accept, Input::Reject] {
            for p in [RC, UD] {
                let taken = at(wire).on(input, p).is_some();
                assert_eq!(taken, wire == Wire::ReqRcvd, "{input:?} in {wire:?}");
            }
        }
    }
}

#[test]
fn disconnect_outside_an_established_exchange_sends_nothing() {
    for wire in ALL_WIRES {
        if matches!(wire, Wire::Established | Wire::DreqRcvd) {
            continue;
        }
        let (x, fx) = step(at(wire), Input::Disconnect, RC);
        assert_eq!((x.wire(), fx), (wire, vec![]), "{wire:?}");
    }
}

#[test]
fn connect_starts_over_from_any_state_with_a_fresh_request() {
    for wire in ALL_WIRES {
        let x = Exchange {
            retried: 7,
            ..at(wire)
        };
        let (x, fx) = step(x, Input::Connect, RC);
        assert_eq!((x.wire(), x.retried), (Wire::ReqSent, 0));
        assert_eq!(fx[..2], [Effect::CancelTimers, Effect::Arm(CmTimer::Response)]);
    }
}

/// Every state, flag and input (a transition with more effects than fit inline would panic
/// here): a timer is armed only right after the id's old timers are cancelled, or by the
/// timer that just fired (its retry), so an id never has two exchange timers live.
#[test]
fn every_armed_timer_replaces_the_ones_before_it() {
    for p in [RC, UD] {
        for wire in ALL_WIRES {
            for disconnected in [false, true] {
                for retried in [0, RETRIES] {
                    let x = Exchange {
                        disconnected,
                        retried,
                        ..at(wire)
                    };
                    for input in every_input() {
                        let Some((_, fx)) = x.on(input, p) else {
                            continue;
                        };
                        let fx = fx.as_slice();
                        let arms: Vec<usize> = (0..fx.len())
                            .filter(|&i| matches!(fx[i], Effect::Arm(_)))
                            .collect();
                        assert!(arms.len() <= 1, "{input:?} in {wire:?} arms twice: {fx:?}");
                        let Some(&i) = arms.first() else { continue };
                        if matches!(input, Input::Timer(_)) && i == 0 {
                            continue;
                        }
                        assert_eq!(fx[..i], [Effect::CancelTimers], "{input:?} in {wire:?}: {fx:?}");
                    }
                }
            }
        }
    }
}

/// `rdma_establish` (an external QP) answers a REP with the RTU; in any other state the IB CM has
/// nothing to answer and the kernel refuses.
#[test]
fn establish_sends_the_rtu_only_for_a_received_rep() {
    let (x, fx) = step(at(Wire::RepRcvd), Input::Establish, RC);
    assert_eq!(x.wire(), Wire::Established);
    assert_eq!(fx, vec![send(MsgKind::Rtu, 0, To::Peer, Carry::Nothing)]);
    for wire in ALL_WIRES {
        if wire != Wire::RepRcvd {
            assert_eq!(at(wire).on(Input::Establish, RC), None, "{wire:?}");
        }
    }
}

/// Without a QP the retrieved `CONNECT_RESPONSE` stays what it is and sends nothing: the RTU
/// waits for `establish`.
#[test]
fn a_connect_response_kept_for_an_external_qp_sends_no_rtu() {
    let (event, status, x, fx) = at(Wire::RepRcvd).on_connect_response(CmEventType::ConnectResponse, 0, true);
    assert_eq!(
        (event, status, x.wire()),
        (CmEventType::ConnectResponse, 0, Wire::RepRcvd)
    );
    assert_eq!(fx, Effects::NONE);
}

/// An effector that keeps what it is handed, as the fabric would receive it.
#[derive(Default)]
struct Handed(Vec<Effect>);

impl Effector for Handed {
    fn effect(&mut self, effect: Effect) {
        self.0.push(effect);
    }
}

#[test]
fn a_refused_input_hands_the_effector_nothing() {
    // The fabric carries effects out as they are handed: a refusal after one would have
    // changed the fabric for a call that fails.
    let mut refused = 0;
    for wire in ALL_WIRES {
        for p in [RC, UD] {
            for input in every_input() {
                let mut handed = Handed::default();
                if at(wire).on_with(input, p, &mut handed).is_none() {
                    refused += 1;
                    assert!(
                        handed.0.is_empty(),
                        "{input:?} refused in {wire:?}: {:?}",
                        handed.0
                    );
                }
            }
        }
    }
    assert!(
        refused > 0,
        "some inputs are refused (accept without a request...)"
    );
}

/// One row of the table: in `wire`, on a connected (`rc`) or datagram port space, `input`
/// leads to `next` with `effects`.
struct Row {
    wire: Wire,
    rc: bool,
    input: Input,
    next: Wire,
    effects: Vec<Effect>,
}

/// Every message and timer transition of a fresh exchange (no flags, no retries spent), written
/// out from the kernel's handlers; calls are in the story tests above.
fn table() -> Vec<Row> {
    use Wire::*;
    let msg = |m| Input::Msg(m, 28);
    let timer = Input::Timer;
    let cancel = Effect::CancelTimers;
    let arm = Effect::Arm;
    let rejected = Effect::Queue {
        event: CmEventType::Rejected,
        status: 28,
        with_message: true,
    };
    let mut rows = Vec::new();
    let mut row = |wire, rc, input, next, effects: Vec<Effect>| {
        rows.push(Row {
            wire,
            rc,
            input,
            next,
            effects,
        })
    };
    for rc in [true, false] {
        // cm_rep_handler (a SIDR REP on a datagram port space).
        for wire in [ReqSent, MraReqRcvd] {
            row(
                wire,
                rc,
                msg(MsgKind::Rep),
                if rc { RepRcvd } else { Closed },
                vec![
                    cancel,
                    Effect::PeerIsSender,
                    Effect::Queue {
                        event: CmEventType::ConnectResponse,
                        status: 0,
                        with_message: true,
                    },
                ],
            );
            // cm_process_send_error: a try timed out, more are left.
            let t = if wire == ReqSent {
                CmTimer::Response
            } else {
                CmTimer::Service
            };
            for fired in [CmTimer::Response, CmTimer::Service] {
                row(
                    wire,
                    rc,
                    timer(fired),
                    wire,
                    vec![arm(t), sent(MsgKind::Req, 0, To::Peer, Carry::Kept)],
                );
            }
        }
        // cm_rej_handler before the connection exists (SIDR: the SIDR REP's error status).
        for wire in [ReqSent, MraReqRcvd, RepRcvd, RepSent, MraRepRcvd] {
            let ev = if rc {
                rejected
            } else {
                Effect::Queue {
                    event: CmEventType::Unreachable,
                    status: 28,
                    with_message: false,
                }
            };
            row(wire, rc, msg(MsgKind::Rej), Closed, vec![cancel, ev]);
        }
        row(ReqRcvd, rc, msg(MsgKind::Rej), Closed, vec![cancel]);
        row(TimeWait, rc, timer(CmTimer::Timewait), Closed, vec![]);
        // cm_mra_handler.
        row(
            ReqSent,
            rc,
            msg(MsgKind::Mra),
            MraReqRcvd,
            vec![cancel, arm(CmTimer::Service)],
        );
        row(
            RepSent,
            rc,
            msg(MsgKind::Mra),
            MraRepRcvd,
            vec![cancel, arm(CmTimer::Service)],
        );
    }
    // Duplicates answered with an MRA or the RTU again: SIDR has neither.
    let rc = true;
    row(
        ReqRcvd,
        rc,
        msg(MsgKind::Req),
        ReqRcvd,
        vec![sent(MsgKind::Mra, 0, To::Sender, Carry::Nothing)],
    );
    row(
        RepRcvd,
        rc,
        msg(MsgKind::Rep),
        RepRcvd,
        vec![sent(MsgKind::Mra, 0, To::Sender, Carry::Nothing)],
    );
    row(
        Established,
        rc,
        msg(MsgKind::Rep),
        Established,
        vec![sent(MsgKind::Rtu, 0, To::Sender, Carry::Nothing)],
    );
    // The rest: a SIDR exchange never reaches these states, and the machine does not ask.
    for rc in [true, false] {
        for wire in [RepSent, MraRepRcvd] {
            row(
                wire,
                rc,
                msg(MsgKind::Rtu),
                Established,
                vec![cancel, event(CmEventType::Established, 0)],
            );
            let t = if wire == RepSent {
                CmTimer::Response
            } else {
                CmTimer::Service
            };
            for fired in [CmTimer::Response, CmTimer::Service] {
                row(
                    wire,
                    rc,
                    timer(fired),
                    wire,
                    vec![arm(t), sent(MsgKind::Rep, 0, To::Peer, Carry::Kept)],
                );
            }
        }
        for wire in [Established, DreqSent] {
            row(
                wire,
                rc,
                msg(MsgKind::Rej),
                TimeWait,
                vec![cancel, arm(CmTimer::Timewait), rejected],
            );
        }
        for wire in [Established, RepSent, MraRepRcvd] {
            row(
                wire,
                rc,
                msg(MsgKind::Dreq),
                DreqRcvd,
                vec![cancel, event(CmEventType::Disconnected, 0)],
            );
        }
        let timewait = vec![
            cancel,
            arm(CmTimer::Timewait),
            event(CmEventType::Disconnected, 0),
        ];
        row(DreqSent, rc, msg(MsgKind::Dreq), TimeWait, {
            let mut fx = timewait.clone();
            fx.push(sent(MsgKind::Drep, 0, To::Sender, Carry::Nothing));
            fx
        });
        row(
            TimeWait,
            rc,
            msg(MsgKind::Dreq),
            TimeWait,
            vec![sent(MsgKind::Drep, 0, To::Sender, Carry::Nothing)],
        );
        row(DreqSent, rc, msg(MsgKind::Drep), TimeWait, timewait.clone());
        row(DreqRcvd, rc, msg(MsgKind::Drep), TimeWait, timewait);
        for fired in [CmTimer::Response, CmTimer::Service] {
            row(
                DreqSent,
                rc,
                timer(fired),
                DreqSent,
                vec![
                    arm(CmTimer::Response),
                    sent(MsgKind::Dreq, 0, To::Peer, Carry::Nothing),
                ],
            );
        }
    }
    rows
}

/// The table, and every (state, message or timer) pair not in it: a late or stale input that
/// changes nothing and does nothing.
#[test]
fn every_message_and_timer_transition_is_the_kernels_and_the_rest_change_nothing() {
    let rows = table();
    let mut matched = 0;
    for p in [RC, UD] {
        for wire in ALL_WIRES {
            let inputs = ALL_MSGS
                .iter()
                .map(|&m| Input::Msg(m, 28))
                .chain(ALL_TIMERS.iter().map(|&t| Input::Timer(t)));
            for input in inputs {
                let (x, fx) = step(at(wire), input, p);
                match rows
                    .iter()
                    .find(|r| r.wire == wire && r.rc == p.connected && r.input == input)
                {
                    Some(r) => {
                        matched += 1;
                        assert_eq!(
                            (x.wire(), &fx),
                            (r.next, &r.effects),
                            "{input:?} in {wire:?}, connected {}",
                            p.connected
                        );
                    }
                    None => assert_eq!(
                        (x, fx),
                        (at(wire), vec![]),
                        "{input:?} in {wire:?}, connected {}",
                        p.connected
                    ),
                }
            }
        }
    }
    assert_eq!(matched, rows.len(), "every row is reached once");
}
