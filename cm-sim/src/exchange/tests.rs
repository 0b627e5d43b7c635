//! The exchange told as protocol stories: each test feeds the machine a call, a message or a
//! timer and reads the effects the fabric would carry out.

use super::*;

const ALL_WIRES: [Wire; 10] = [
    Wire::Idle,
    Wire::ReqSent,
    Wire::RepRcvd,
    Wire::ReqRcvd,
    Wire::RepSent,
    Wire::Established,
    Wire::DreqSent,
    Wire::DreqRcvd,
    Wire::TimeWait,
    Wire::Closed,
];
const ALL_MSGS: [MsgKind; 6] = [
    MsgKind::Req,
    MsgKind::Rep,
    MsgKind::Rtu,
    MsgKind::Rej,
    MsgKind::Dreq,
    MsgKind::Drep,
];
const ALL_TIMERS: [CmTimer; 4] = [CmTimer::Req, CmTimer::Rep, CmTimer::Dreq, CmTimer::Timewait];
const RC: bool = true;
const UD: bool = false;

fn at(wire: Wire) -> Exchange {
    Exchange::new().to(wire)
}

/// Feeds `input`, asserting it is taken; returns the next state and its effects.
fn step(x: Exchange, input: Input, connected: bool) -> (Exchange, Vec<Effect>) {
    let (next, effects) = x
        .on(input, connected)
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
            Effect::Arm(CmTimer::Req),
            sent(MsgKind::Req, 0, To::Peer, Carry::CallPayload)
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
    let (ev, status, x, fx) = x.on_connect_response(CmEventType::Established, 0, RC);
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
            Effect::Arm(CmTimer::Rep),
            sent(MsgKind::Rep, 0, To::Peer, Carry::CallPayload)
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
    let (ev, _, x, fx) = x.on_connect_response(CmEventType::Established, 0, UD);
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

#[test]
fn rej_reaches_every_side_of_an_open_exchange_but_an_unaccepted_child_hears_nothing() {
    for wire in [Wire::ReqSent, Wire::RepRcvd, Wire::RepSent] {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Rej, 28), RC);
        assert_eq!(x.wire(), Wire::Closed, "{wire:?}");
        assert!(
            fx.contains(&Effect::Queue {
                event: CmEventType::Rejected,
                status: 28,
                with_message: true
            }),
            "{wire:?}"
        );
    }
    let (x, fx) = step(Exchange::requested(), Input::Msg(MsgKind::Rej, 1), RC);
    assert_eq!((x.wire(), fx), (Wire::Closed, vec![Effect::CancelTimers]));
}

#[test]
fn unanswered_req_times_out_rejects_with_timeout_and_reports_unreachable() {
    let (x, fx) = step(at(Wire::ReqSent), Input::Timer(CmTimer::Req), RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(
        fx,
        [
            sent(MsgKind::Rej, reason::TIMEOUT, To::Peer, Carry::EmptyPrivateData),
            event(CmEventType::Unreachable, -errno::ETIMEDOUT)
        ]
    );
}

#[test]
fn unanswered_rep_times_out_as_unreachable_without_a_message() {
    let (x, fx) = step(at(Wire::RepSent), Input::Timer(CmTimer::Rep), RC);
    assert_eq!(x.wire(), Wire::Closed);
    assert_eq!(fx, [event(CmEventType::Unreachable, -errno::ETIMEDOUT)]);
}

#[test]
fn active_disconnect_completes_with_the_drep_then_timewait_exits() {
    let (x, fx) = step(at(Wire::Established), Input::Disconnect, RC);
    assert_eq!(x.wire(), Wire::DreqSent);
    assert_eq!(
        fx,
        [
            Effect::CancelTimers,
            Effect::Arm(CmTimer::Dreq),
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
fn unanswered_dreq_times_out_as_disconnected_with_etimedout() {
    let (x, fx) = step(at(Wire::DreqSent), Input::Timer(CmTimer::Dreq), RC);
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
fn passive_disconnect_hears_the_dreq_once_and_answers_with_a_drep() {
    let (x, fx) = step(at(Wire::Established), Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!(x.wire(), Wire::DreqRcvd);
    assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Disconnected, 0)]);
    // A retransmitted DREQ changes nothing.
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
    let (_, fx) = step(x, Input::Timer(CmTimer::Timewait), RC);
    assert_eq!(fx, [event(CmEventType::TimewaitExit, 0)]);
}

#[test]
fn dreq_before_the_rtu_disconnects_the_passive_side() {
    let (x, fx) = step(at(Wire::RepSent), Input::Msg(MsgKind::Dreq, 0), RC);
    assert_eq!(x.wire(), Wire::DreqRcvd);
    assert_eq!(fx, [Effect::CancelTimers, event(CmEventType::Disconnected, 0)]);
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
        ..at(Wire::DreqSent)
    };
    let (_, fx) = step(x, Input::Timer(CmTimer::Dreq), RC);
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
    let (ev, status, x, fx) = x.on_connect_response(CmEventType::Established, 0, RC);
    assert_eq!((ev, status), (CmEventType::ConnectError, -1));
    assert!(fx.as_slice().is_empty(), "no RTU after a REJ");
    assert!(x.swallows(CmEventType::Rejected));
    assert!(x.swallows(CmEventType::Disconnected));
    assert!(!x.swallows(CmEventType::TimewaitExit));
    assert!(!Exchange::new().swallows(CmEventType::Rejected));
}

#[test]
fn connect_error_decided_by_the_application_machine_sends_no_rtu() {
    let (ev, status, x, fx) = at(Wire::RepRcvd).on_connect_response(CmEventType::ConnectError, 0, RC);
    assert_eq!(
        (ev, status, x.wire()),
        (CmEventType::ConnectError, -1, Wire::RepRcvd)
    );
    assert!(fx.as_slice().is_empty());
    assert!(x.swallows(CmEventType::Rejected));
}

#[test]
fn lost_req_rep_and_dreq_are_resent_only_while_their_answer_is_awaited() {
    for wire in ALL_WIRES {
        for msg in ALL_MSGS {
            let expected = matches!(
                (msg, wire),
                (MsgKind::Req, Wire::ReqSent)
                    | (MsgKind::Rep, Wire::RepSent)
                    | (MsgKind::Dreq, Wire::DreqSent)
            );
            assert_eq!(at(wire).awaits_answer_to(msg), expected, "{msg:?} in {wire:?}");
        }
    }
}

#[test]
fn destroy_in_every_state_tells_the_peer_what_the_state_calls_for() {
    let rej = |status| vec![sent(MsgKind::Rej, status, To::Peer, Carry::EmptyPrivateData)];
    for connected in [RC, UD] {
        let refused = if connected {
            reason::CONSUMER_DEFINED
        } else {
            reason::SIDR_REJECT
        };
        for wire in ALL_WIRES {
            let expected = match wire {
                Wire::ReqSent => rej(reason::TIMEOUT),
                Wire::ReqRcvd | Wire::RepRcvd | Wire::RepSent => rej(refused),
                Wire::Established => vec![sent(MsgKind::Dreq, 0, To::Peer, Carry::Nothing)],
                Wire::DreqRcvd => vec![sent(MsgKind::Drep, 0, To::Peer, Carry::Nothing)],
                Wire::Idle | Wire::DreqSent | Wire::TimeWait | Wire::Closed => vec![],
            };
            let (x, fx) = step(at(wire), Input::Destroy, connected);
            assert_eq!(x.wire(), Wire::Closed, "{wire:?}");
            assert_eq!(fx, expected, "destroy in {wire:?}, connected {connected}");
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
            let taken = at(wire).on(input, RC).is_some();
            assert_eq!(taken, wire == Wire::ReqRcvd, "{input:?} in {wire:?}");
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

/// Every (state, message) and (state, timer) pair not in the protocol's table is a late or
/// stale input: it changes nothing and does nothing.
#[test]
fn late_messages_and_stale_timers_change_nothing() {
    let live = |input: Input, wire: Wire| {
        matches!(
            (input, wire),
            (Input::Msg(MsgKind::Rep, _), Wire::ReqSent)
                | (Input::Msg(MsgKind::Rtu, _), Wire::RepSent)
                | (
                    Input::Msg(MsgKind::Rej, _),
                    Wire::ReqSent | Wire::RepRcvd | Wire::RepSent | Wire::ReqRcvd
                )
                | (
                    Input::Msg(MsgKind::Dreq, _),
                    Wire::Established | Wire::RepSent | Wire::DreqSent
                )
                | (Input::Msg(MsgKind::Drep, _), Wire::DreqSent)
                | (Input::Timer(CmTimer::Req), Wire::ReqSent)
                | (Input::Timer(CmTimer::Rep), Wire::RepSent)
                | (Input::Timer(CmTimer::Dreq), Wire::DreqSent)
                | (Input::Timer(CmTimer::Timewait), Wire::TimeWait)
        )
    };
    let mut live_pairs = 0;
    for connected in [RC, UD] {
        for wire in ALL_WIRES {
            let inputs = ALL_MSGS
                .iter()
                .map(|&m| Input::Msg(m, 0))
                .chain(ALL_TIMERS.iter().map(|&t| Input::Timer(t)));
            for input in inputs {
                let (x, fx) = step(at(wire), input, connected);
                if live(input, wire) {
                    live_pairs += 1;
                    assert_ne!(x.wire(), wire, "{input:?} in {wire:?} moves the exchange");
                } else {
                    assert_eq!((x, fx), (at(wire), vec![]), "{input:?} in {wire:?}");
                }
            }
        }
    }
    assert_eq!(live_pairs, 2 * 14);
}

#[test]
fn a_req_arriving_at_an_id_is_ignored_the_fabric_makes_a_child_for_it() {
    for wire in ALL_WIRES {
        let (x, fx) = step(at(wire), Input::Msg(MsgKind::Req, 0), RC);
        assert_eq!((x, fx), (at(wire), vec![]));
    }
}

#[test]
fn a_new_qp_is_refused_once_the_exchange_ended_before_establishing() {
    for wire in ALL_WIRES {
        let ended = matches!(
            wire,
            Wire::DreqSent | Wire::DreqRcvd | Wire::TimeWait | Wire::Closed
        );
        assert_eq!(at(wire).ended_early(), ended, "{wire:?}");
    }
}

#[test]
fn connect_starts_over_from_any_state_with_a_fresh_req_timer() {
    for wire in ALL_WIRES {
        let (x, fx) = step(at(wire), Input::Connect, RC);
        assert_eq!(x.wire(), Wire::ReqSent);
        assert_eq!(fx[..2], [Effect::CancelTimers, Effect::Arm(CmTimer::Req)]);
    }
}

/// Every state, flag and input (a transition with more effects than fit inline would panic
/// here): a timer is armed only right after the id's old timers are cancelled, so an id never
/// has two exchange timers live.
#[test]
fn every_armed_timer_replaces_the_ones_before_it() {
    for connected in [RC, UD] {
        for wire in ALL_WIRES {
            for disconnected in [false, true] {
                let x = Exchange {
                    disconnected,
                    ..at(wire)
                };
                for input in every_input() {
                    let Some((_, fx)) = x.on(input, connected) else {
                        continue;
                    };
                    let fx = fx.as_slice();
                    let arms: Vec<usize> = (0..fx.len())
                        .filter(|&i| matches!(fx[i], Effect::Arm(_)))
                        .collect();
                    assert!(arms.len() <= 1, "{input:?} in {wire:?} arms twice: {fx:?}");
                    if let Some(&i) = arms.first() {
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
    let (event, status, x, fx) = at(Wire::RepRcvd).on_connect_response(CmEventType::ConnectResponse, 0, RC);
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
        for connected in [RC, UD] {
            for input in every_input() {
                let mut handed = Handed::default();
                if at(wire).on_with(input, connected, &mut handed).is_none() {
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
