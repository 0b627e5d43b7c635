//! The IB CM exchange of one id as a pure machine: (state, input) -> (next state, effects).
//!
//! An input is a call that touches the wire (connect, accept, reject, disconnect, destroy), a
//! message that arrived (REQ and its answers: REP, RTU, REJ, DREQ, DREP), a timer that fired,
//! the device's removal, or the retrieval of the kernel's `CONNECT_RESPONSE`. The effects say
//! what the fabric does about it: send a message, queue an event, arm or cancel a timer, take
//! the message's sender as the peer. The machine does no I/O, holds no references and knows no
//! time: it hands the effects, in order, to an [`Effector`] (the fabric, which carries each out
//! where it is named: latency, loss, payloads, the trace; or a list, [`Effects`]), and the
//! tests below drive it directly.
//!
//! This is the IB CM's view of a connection, which moves when messages arrive and timers fire;
//! what the application has observed is `cm_core::IdMachine`, which moves when calls succeed
//! and events are retrieved. The two differ while messages and events are in flight.

use cm_core::{errno, CmEventType};

use crate::trace::MsgKind;

/// IB CM reject reasons the simulator sends.
pub(crate) mod reason {
    /// `IB_CM_REJ_TIMEOUT` (include/rdma/ib_cm.h): the active side gave up (or was destroyed)
    /// while its REQ was out.
    pub(crate) const TIMEOUT: i32 = 4;
    /// `IB_CM_REJ_INVALID_SERVICE_ID`: no listener on that port.
    pub(crate) const INVALID_SERVICE_ID: i32 = 8;
    /// `IB_CM_REJ_CONSUMER_DEFINED`: `rdma_reject`, a destroyed peer, or a full backlog.
    pub(crate) const CONSUMER_DEFINED: i32 = 28;
    /// SIDR REP status `IB_SIDR_UNSUPPORTED`: no listener (datagram port spaces).
    pub(crate) const SIDR_UNSUPPORTED: i32 = 1;
    /// SIDR REP status `IB_SIDR_REJECT`: `rdma_reject` (datagram port spaces).
    pub(crate) const SIDR_REJECT: i32 = 2;
}

/// Where the exchange of one id stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    /// No exchange.
    Idle,
    /// Active: REQ sent, waiting for REP or REJ.
    ReqSent,
    /// Active: REP arrived; the RTU goes out when the application retrieves the event.
    RepRcvd,
    /// Passive: REQ arrived, not accepted.
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU.
    RepSent,
    /// Connected.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// DREQ received, not answered yet.
    DreqRcvd,
    /// Disconnect complete; `TIMEWAIT_EXIT` pending.
    TimeWait,
    /// Nothing more will happen on the wire.
    Closed,
}

/// The exchange's timers. Each is armed for a configured length: the three response timeouts
/// for `cm_timeout`, the timewait for `timewait`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmTimer {
    /// No REP or REJ for the REQ.
    Req,
    /// No RTU for the REP.
    Rep,
    /// No DREP for the DREQ.
    Dreq,
    /// The end of timewait.
    Timewait,
}

/// Whom a message goes to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum To {
    /// The id's peer; a message to a peer not known yet (a REQ not answered by anyone) is not
    /// sent. A REQ goes to the host of the id's destination instead.
    Peer,
    /// The sender of the message being handled.
    Sender,
}

/// What a sent message carries besides its kind and status.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Carry {
    /// Nothing.
    Nothing,
    /// Empty private data, zero-padded as a REJ's is.
    EmptyPrivateData,
    /// The payload the call brought (a REQ's or REP's parameters, `rdma_reject`'s data).
    CallPayload,
}

/// One thing the fabric does for a transition, in the order given.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Effect {
    /// Cancel every pending timer of the id.
    CancelTimers,
    /// Arm a timer.
    Arm(CmTimer),
    /// Send a message.
    Send {
        msg: MsgKind,
        status: i32,
        to: To,
        carry: Carry,
    },
    /// Queue an event on the id's channel; `with_message` hands it the payload of the message
    /// being handled (a REP's parameters, a REJ's private data).
    Queue {
        event: CmEventType,
        status: i32,
        with_message: bool,
    },
    /// The sender of the message being handled is the peer from now on.
    PeerIsSender,
}

/// The most effects one transition has.
const MAX_EFFECTS: usize = 4;

/// The effects of one transition, in order, stored inline: a transition allocates nothing.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Effects {
    list: [Effect; MAX_EFFECTS],
    len: u8,
}

impl Effects {
    /// No effect.
    pub(crate) const NONE: Effects = Effects {
        list: [Effect::CancelTimers; MAX_EFFECTS],
        len: 0,
    };

    const fn with(mut self, effect: Effect) -> Effects {
        self.list[self.len as usize] = effect;
        self.len += 1;
        self
    }

    /// The effects in the order the fabric carries them out.
    #[cfg(test)]
    pub(crate) fn as_slice(&self) -> &[Effect] {
        &self.list[..usize::from(self.len)]
    }
}

/// Where a transition's effects go, one at a time, in the order the fabric carries them out:
/// a list ([`Effects`]) for the table tests and for the calls that ask first whether the input
/// is taken, the fabric itself where it carries them out.
pub(crate) trait Effector {
    /// The transition's next effect.
    fn effect(&mut self, effect: Effect);
}

impl Effector for Effects {
    #[inline(always)]
    fn effect(&mut self, effect: Effect) {
        *self = self.with(effect);
    }
}

/// What moves the exchange.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Input {
    /// `rdma_connect`: the REQ goes out.
    Connect,
    /// `rdma_accept` of the request.
    Accept,
    /// `rdma_reject` of the request.
    Reject,
    /// `rdma_disconnect`.
    Disconnect,
    /// `rdma_establish` after `CONNECT_RESPONSE` (an external QP): the RTU goes out.
    Establish,
    /// `rdma_destroy_id`: the kernel tells the peer what the state calls for.
    Destroy,
    /// The device went: the connection ends without a word on the wire.
    DeviceRemoved,
    /// A message arrived with its status.
    Msg(MsgKind, i32),
    /// A timer fired (one that was not cancelled).
    Timer(CmTimer),
}

/// The IB CM exchange of one id. Small and `Copy`: the fabric keeps one per id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exchange {
    wire: Wire,
    /// `DISCONNECTED` was queued (the kernel generates it at most once per id).
    disconnected: bool,
    /// The `CONNECT_RESPONSE` was retrieved as `CONNECT_ERROR`: librdmacm swallows what the
    /// failed connection still generates.
    connect_error: bool,
}

impl Exchange {
    /// An id with no exchange yet.
    pub(crate) const fn new() -> Self {
        Exchange {
            wire: Wire::Idle,
            disconnected: false,
            connect_error: false,
        }
    }

    /// A child id made by an arriving REQ.
    pub(crate) const fn requested() -> Self {
        Exchange {
            wire: Wire::ReqRcvd,
            ..Exchange::new()
        }
    }

    /// Where the exchange stands.
    pub(crate) const fn wire(self) -> Wire {
        self.wire
    }

    /// Whether the IB CM still waits for an answer to `msg`, so that a lost copy is sent
    /// again (REQ, REP and DREQ are retransmitted until answered; the rest are sent once).
    pub(crate) const fn awaits_answer_to(self, msg: MsgKind) -> bool {
        matches!(
            (msg, self.wire),
            (MsgKind::Req, Wire::ReqSent) | (MsgKind::Rep, Wire::RepSent) | (MsgKind::Dreq, Wire::DreqSent)
        )
    }

    /// Whether the exchange ended before it established anything (the kernel then has no QP
    /// attributes to give a new QP).
    pub(crate) const fn ended_early(self) -> bool {
        !matches!(
            self.wire,
            Wire::Idle | Wire::ReqSent | Wire::RepRcvd | Wire::ReqRcvd | Wire::RepSent | Wire::Established
        )
    }

    /// Whether librdmacm swallows `event` instead of handing it out: after a `CONNECT_ERROR`,
    /// the `REJECTED` or `DISCONNECTED` of the same failed connection.
    pub(crate) const fn swallows(self, event: CmEventType) -> bool {
        self.connect_error && matches!(event, CmEventType::Rejected | CmEventType::Disconnected)
    }

    fn to(self, wire: Wire) -> Self {
        Exchange { wire, ..self }
    }

    /// Timewait after a completed disconnect, with `DISCONNECTED` if not said already.
    #[inline(always)]
    fn timewait(self, status: i32, fx: &mut impl Effector) -> Self {
        fx.effect(Effect::CancelTimers);
        fx.effect(Effect::Arm(CmTimer::Timewait));
        if !self.disconnected {
            fx.effect(queue(CmEventType::Disconnected, status));
        }
        Exchange {
            wire: Wire::TimeWait,
            disconnected: true,
            ..self
        }
    }

    /// The transition for `input` on a connected (`connected`: RC/TCP-like) or datagram port
    /// space; `None` when the input is refused (accept or reject without a pending request,
    /// establish without a REP to answer).
    /// An input that does not apply to the state (a late message, a DREQ on a closed exchange)
    /// leaves it as it is, with no effect.
    // Inlined into each caller: most pass a constant input (connect, accept, destroy...), so
    // the match folds to the one transition; called, it cost about 80 instructions a call,
    // 1 000 a lifecycle (issue 14).
    #[inline(always)]
    pub(crate) fn on(self, input: Input, connected: bool) -> Option<(Exchange, Effects)> {
        let mut effects = Effects::NONE;
        let next = self.on_with(input, connected, &mut effects)?;
        Some((next, effects))
    }

    /// [`on`](Self::on) with each effect handed to `fx` as the transition names it, in order,
    /// instead of collected in a list; nothing is handed when the input is refused.
    // The fabric's effector carries each effect out where it is named: the effect is a
    // constant there and its match folds, where a list built at run time (the wire state of a
    // received message, a destroy or a timer is known only then) was walked and matched.
    #[inline(always)]
    pub(crate) fn on_with(self, input: Input, connected: bool, fx: &mut impl Effector) -> Option<Exchange> {
        use Wire::*;
        let rej_reason = if connected {
            reason::CONSUMER_DEFINED
        } else {
            reason::SIDR_REJECT
        };
        Some(match (input, self.wire) {
            (Input::Connect, _) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Req));
                fx.effect(send(MsgKind::Req, 0, To::Peer, Carry::CallPayload));
                self.to(ReqSent)
            }
            (Input::Accept, ReqRcvd) => {
                fx.effect(Effect::CancelTimers);
                if connected {
                    fx.effect(Effect::Arm(CmTimer::Rep));
                }
                fx.effect(send(MsgKind::Rep, 0, To::Peer, Carry::CallPayload));
                self.to(if connected { RepSent } else { Closed })
            }
            (Input::Reject, ReqRcvd) => {
                let carry = if connected {
                    Carry::CallPayload
                } else {
                    Carry::Nothing
                };
                fx.effect(send(MsgKind::Rej, rej_reason, To::Peer, carry));
                self.to(Closed)
            }
            (Input::Establish, RepRcvd) => {
                fx.effect(send(MsgKind::Rtu, 0, To::Peer, Carry::Nothing));
                self.to(Established)
            }
            (Input::Accept | Input::Reject | Input::Establish, _) => return None,
            (Input::Disconnect, Established) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Dreq));
                fx.effect(send(MsgKind::Dreq, 0, To::Peer, Carry::Nothing));
                self.to(DreqSent)
            }
            (Input::Disconnect, DreqRcvd) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Timewait));
                fx.effect(send(MsgKind::Drep, 0, To::Peer, Carry::Nothing));
                self.to(TimeWait)
            }
            // Not established on the wire: the IB CM has neither a DREQ nor a DREP to send, and
            // the kernel still returns 0.
            (Input::Disconnect, _) => self,
            (Input::Destroy, wire) => {
                match wire {
                    ReqSent => fx.effect(send(
                        MsgKind::Rej,
                        reason::TIMEOUT,
                        To::Peer,
                        Carry::EmptyPrivateData,
                    )),
                    ReqRcvd | RepRcvd | RepSent => {
                        fx.effect(send(MsgKind::Rej, rej_reason, To::Peer, Carry::EmptyPrivateData))
                    }
                    Established => fx.effect(send(MsgKind::Dreq, 0, To::Peer, Carry::Nothing)),
                    DreqRcvd => fx.effect(send(MsgKind::Drep, 0, To::Peer, Carry::Nothing)),
                    Idle | DreqSent | TimeWait | Closed => {}
                }
                self.to(Closed)
            }
            (Input::DeviceRemoved, _) => {
                fx.effect(Effect::CancelTimers);
                self.to(Closed)
            }
            (Input::Msg(MsgKind::Rep, _), ReqSent) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::PeerIsSender);
                fx.effect(Effect::Queue {
                    event: CmEventType::ConnectResponse,
                    status: 0,
                    with_message: true,
                });
                // A datagram exchange ends with the SIDR REP.
                self.to(if connected { RepRcvd } else { Closed })
            }
            (Input::Msg(MsgKind::Rtu, _), RepSent) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(queue(CmEventType::Established, 0));
                self.to(Established)
            }
            (Input::Msg(MsgKind::Rej, status), ReqSent | RepRcvd | RepSent | ReqRcvd) => {
                fx.effect(Effect::CancelTimers);
                // A child that was not accepted gets no events (the kernel drops them).
                if self.wire != ReqRcvd {
                    let event = if connected {
                        CmEventType::Rejected
                    } else {
                        CmEventType::Unreachable
                    };
                    fx.effect(Effect::Queue {
                        event,
                        status,
                        with_message: connected,
                    });
                }
                self.to(Closed)
            }
            (Input::Msg(MsgKind::Dreq, _), Established | RepSent) => {
                fx.effect(Effect::CancelTimers);
                if !self.disconnected {
                    fx.effect(queue(CmEventType::Disconnected, 0));
                }
                Exchange {
                    wire: DreqRcvd,
                    disconnected: true,
                    ..self
                }
            }
            (Input::Msg(MsgKind::Dreq, _), DreqSent) => {
                // Both sides disconnected at once: each answers the other's DREQ.
                let next = self.timewait(0, fx);
                fx.effect(send(MsgKind::Drep, 0, To::Sender, Carry::Nothing));
                next
            }
            (Input::Msg(MsgKind::Drep, _), DreqSent) => self.timewait(0, fx),
            (Input::Msg(..), _) => self,
            (Input::Timer(CmTimer::Req), ReqSent) => {
                fx.effect(send(
                    MsgKind::Rej,
                    reason::TIMEOUT,
                    To::Peer,
                    Carry::EmptyPrivateData,
                ));
                fx.effect(queue(CmEventType::Unreachable, -errno::ETIMEDOUT));
                self.to(Closed)
            }
            (Input::Timer(CmTimer::Rep), RepSent) => {
                fx.effect(queue(CmEventType::Unreachable, -errno::ETIMEDOUT));
                self.to(Closed)
            }
            (Input::Timer(CmTimer::Dreq), DreqSent) => self.timewait(-errno::ETIMEDOUT, fx),
            (Input::Timer(CmTimer::Timewait), TimeWait) => {
                if self.disconnected {
                    fx.effect(queue(CmEventType::TimewaitExit, 0));
                }
                self.to(Closed)
            }
            (Input::Timer(_), _) => self,
        })
    }

    /// [`on_connect_response_with`](Self::on_connect_response_with) with the effect in a list.
    // The fabric hands the effect over with `on_connect_response_with`; the list is for the
    // table tests.
    #[cfg(test)]
    pub(crate) fn on_connect_response(
        self,
        outcome: CmEventType,
        status: i32,
        connected: bool,
    ) -> (CmEventType, i32, Exchange, Effects) {
        let mut effects = Effects::NONE;
        let (event, status, next) = self.on_connect_response_with(outcome, status, connected, &mut effects);
        (event, status, next, effects)
    }

    /// librdmacm's handling of the retrieved `CONNECT_RESPONSE`, which the application's
    /// machine says becomes `outcome` (`ESTABLISHED` or `CONNECT_ERROR`): returns the event
    /// handed out, its status, and the next state, and hands the effect to `fx` as
    /// [`on_with`](Self::on_with) does. `ESTABLISHED` on a connected port space sends the RTU;
    /// a REJ that arrived meanwhile makes the RTU fail (`CONNECT_ERROR`).
    #[inline(always)]
    pub(crate) fn on_connect_response_with(
        self,
        outcome: CmEventType,
        status: i32,
        connected: bool,
        fx: &mut impl Effector,
    ) -> (CmEventType, i32, Exchange) {
        let event = if outcome == CmEventType::Established && self.wire == Wire::Closed && connected {
            CmEventType::ConnectError
        } else {
            outcome
        };
        match event {
            CmEventType::Established if connected => {
                fx.effect(send(MsgKind::Rtu, 0, To::Peer, Carry::Nothing));
                (event, status, self.to(Wire::Established))
            }
            CmEventType::ConnectError => (
                event,
                -1,
                Exchange {
                    connect_error: true,
                    ..self
                },
            ),
            _ => (event, status, self),
        }
    }
}

const fn send(msg: MsgKind, status: i32, to: To, carry: Carry) -> Effect {
    Effect::Send {
        msg,
        status,
        to,
        carry,
    }
}

const fn queue(event: CmEventType, status: i32) -> Effect {
    Effect::Queue {
        event,
        status,
        with_message: false,
    }
}

#[cfg(test)]
mod tests;
