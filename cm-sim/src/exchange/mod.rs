//! The IB CM exchange of one id as a pure machine: (state, input) -> (next state, effects).
//!
//! An input is a call that touches the wire (connect, accept, reject, disconnect, destroy), a
//! message that arrived (a duplicate REQ, MRA, REP, RTU, REJ, DREQ, DREP), a timer that fired,
//! the device's removal, or the retrieval of the kernel's `CONNECT_RESPONSE`. The effects say
//! what the fabric does about it: send a message (again, on a retry), queue an event, arm or
//! cancel a timer, take the message's sender as the peer.
//!
//! The rules are the lab kernel's (Linux 6.1, `drivers/infiniband/core/cm.c` as rdma_cm and
//! ucma drive it): REQ, REP and DREQ are sent again on their own timers until answered, however
//! the first copy or its answer was lost, and each duplicate is answered by the receiver's state
//! (`cm_dup_req_handler`, `cm_dup_rep_handler`, `cm_dreq_handler`). [`timeouts`] has the times. The machine does no I/O, holds no references and knows no
//! time: it hands the effects, in order, to an [`Effector`] (the fabric, which carries each out
//! where it is named: latency, loss, payloads, the trace; or, in the tests, a list), and the
//! tests below drive it directly.
//!
//! This is the IB CM's view of a connection, which moves when messages arrive and timers fire;
//! what the application has observed is `cm_core::IdMachine`, which moves when calls succeed
//! and events are retrieved. The two differ while messages and events are in flight.

use cm_core::{errno, CmEventType};

use crate::trace::MsgKind;

pub(crate) mod timeouts;

/// IB CM reject reasons the simulator sends.
pub(crate) mod reason {
    /// `IB_CM_REJ_TIMEOUT` (include/rdma/ib_cm.h): the active side gave up (or was destroyed)
    /// while its REQ was out.
    pub(crate) const TIMEOUT: i32 = 4;
    /// `IB_CM_REJ_INVALID_SERVICE_ID`: no listener on that port.
    pub(crate) const INVALID_SERVICE_ID: i32 = 8;
    /// `IB_CM_REJ_CONSUMER_DEFINED`: `rdma_reject` or a destroyed peer.
    pub(crate) const CONSUMER_DEFINED: i32 = 28;
    /// SIDR REP status `IB_SIDR_UNSUPPORTED`: no listener (datagram port spaces).
    pub(crate) const SIDR_UNSUPPORTED: i32 = 1;
    /// SIDR REP status `IB_SIDR_REJECT`: `rdma_reject` (datagram port spaces).
    pub(crate) const SIDR_REJECT: i32 = 2;
}

/// Where the exchange of one id stands: the kernel's `enum ib_cm_state` as rdma_cm drives it.
///
/// rdma_cm answers every RC REQ and REP it receives with `ib_send_cm_mra(IB_CM_MRA_FLAG_DELAY
/// | 24)`, which sends nothing and only moves the id to `MRA_REQ_SENT` (`MRA_REP_SENT`): the MRA
/// goes out in answer to a duplicate. So a passive id that received a REQ is always in
/// `MRA_REQ_SENT` here ([`ReqRcvd`](Wire::ReqRcvd)), and an active id that received its REP in
/// `MRA_REP_SENT` ([`RepRcvd`](Wire::RepRcvd)).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Wire {
    /// No exchange.
    Idle,
    /// Active: REQ sent, waiting for REP or REJ (`REQ_SENT`).
    ReqSent,
    /// Active: the passive side answered a duplicate REQ with an MRA; the REQ's tries wait the
    /// MRA's service timeout (`MRA_REQ_RCVD`).
    MraReqRcvd,
    /// Active: REP arrived; the RTU goes out when the application retrieves the event
    /// (`MRA_REP_SENT`: a duplicate REP is answered with an MRA).
    RepRcvd,
    /// Passive: REQ arrived, not accepted (`MRA_REQ_SENT`: a duplicate REQ is answered with an
    /// MRA; `SIDR_REQ_RCVD` on a datagram port space).
    ReqRcvd,
    /// Passive: REP sent, waiting for the RTU (`REP_SENT`).
    RepSent,
    /// Passive: the active side answered a duplicate REP with an MRA; the REP's tries wait the
    /// MRA's service timeout (`MRA_REP_RCVD`).
    MraRepRcvd,
    /// Connected.
    Established,
    /// DREQ sent, waiting for the DREP.
    DreqSent,
    /// DREQ received, not answered yet.
    DreqRcvd,
    /// Disconnect complete (or a REJ ended the connection); `TIMEWAIT_EXIT` pending.
    TimeWait,
    /// Nothing more will happen on the wire (the kernel's `IDLE` after an exchange).
    Closed,
}

/// The exchange's timers; an id has at most one live at a time.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum CmTimer {
    /// The response timeout of the message the id waits to have answered (REQ, REP, DREQ): the
    /// id's per-try wait.
    Response,
    /// The same once the peer sent an MRA: its service timeout plus the path's.
    Service,
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
    /// The payload the call brought (`rdma_reject`'s data, a SIDR REP's parameters).
    CallPayload,
    /// The payload the call brought, which the id also keeps to send again until the message is
    /// answered (a REQ's or REP's parameters: the kernel keeps the MAD for its retries).
    Keep,
    /// The payload kept by the first send: a retry.
    Kept,
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
#[cfg(test)]
const MAX_EFFECTS: usize = 4;

/// The effects of one transition, in order, stored inline: a transition allocates nothing.
/// What the table tests read; the fabric carries each effect out as it is named instead.
#[cfg(test)]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Effects {
    list: [Effect; MAX_EFFECTS],
    len: u8,
}

#[cfg(test)]
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
    pub(crate) fn as_slice(&self) -> &[Effect] {
        &self.list[..usize::from(self.len)]
    }
}

/// Where a transition's effects go, one at a time, in the order the fabric carries them out:
/// a list (`Effects`) for the table tests, nowhere for the calls that ask first whether the
/// input is taken ([`Exchange::takes`]), the fabric itself where it carries them out.
pub(crate) trait Effector {
    /// The transition's next effect.
    fn effect(&mut self, effect: Effect);
}

#[cfg(test)]
impl Effector for Effects {
    #[inline(always)]
    fn effect(&mut self, effect: Effect) {
        *self = self.with(effect);
    }
}

/// An effector that drops every effect: for asking only whether the exchange takes an input
/// ([`Exchange::takes`]), with no list of effects built to be thrown away.
struct Discard;

impl Effector for Discard {
    #[inline(always)]
    fn effect(&mut self, _effect: Effect) {}
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
    /// A message arrived with its status. A REQ reaches an id only as a duplicate of the request
    /// that made it (the fabric routes a new one to a listener).
    Msg(MsgKind, i32),
    /// A timer fired (one that was not cancelled).
    Timer(CmTimer),
}

/// What a transition depends on besides the state and the input.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Params {
    /// A connected (RC/TCP-like) port space; a datagram one's exchange is SIDR's.
    pub(crate) connected: bool,
    /// How many times an unanswered REQ, REP or DREQ is sent again (`CMA_MAX_CM_RETRIES`).
    pub(crate) retries: u8,
}

/// The IB CM exchange of one id. Small and `Copy`: the fabric keeps one per id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exchange {
    wire: Wire,
    /// Retries of the message awaiting an answer so far (the MAD's `retries`).
    retried: u8,
    /// `DISCONNECTED` was queued (rdma_cm's id moved to `RDMA_CM_DISCONNECT`: it generates the
    /// event at most once, and drops a REJ that comes later).
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
            retried: 0,
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

    /// Whether the id waits for an answer to its REQ, so that a REQ it sent that arrives now
    /// is still a request (one that arrives after the answer, or after the id gave up or was
    /// destroyed, is dropped).
    pub(crate) const fn requesting(self) -> bool {
        matches!(self.wire, Wire::ReqSent | Wire::MraReqRcvd)
    }

    /// Whether the id keeps a message to send again until it is answered (a REQ or a REP).
    pub(crate) const fn keeps_message(self) -> bool {
        matches!(
            self.wire,
            Wire::ReqSent | Wire::MraReqRcvd | Wire::RepSent | Wire::MraRepRcvd
        )
    }

    /// Whether a REQ from this child's requester is a duplicate of the request that made it:
    /// the kernel keeps the child in its table of remote ids until it resets it or it enters
    /// timewait (`cm_remove_remote`), and a SIDR child only until it answers. A REQ that finds
    /// no child so is a new request.
    pub(crate) const fn holds_request(self, connected: bool) -> bool {
        if !connected {
            return matches!(self.wire, Wire::ReqRcvd);
        }
        matches!(
            self.wire,
            Wire::ReqRcvd
                | Wire::RepSent
                | Wire::MraRepRcvd
                | Wire::Established
                | Wire::DreqSent
                | Wire::DreqRcvd
        )
    }

    /// Whether the exchange ended before it established anything (the kernel then has no QP
    /// attributes to give a new QP).
    pub(crate) const fn ended_early(self) -> bool {
        !matches!(
            self.wire,
            Wire::Idle
                | Wire::ReqSent
                | Wire::MraReqRcvd
                | Wire::RepRcvd
                | Wire::ReqRcvd
                | Wire::RepSent
                | Wire::MraRepRcvd
                | Wire::Established
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

    /// A new message awaiting an answer: its tries start again.
    fn sending(self, wire: Wire) -> Self {
        Exchange {
            wire,
            retried: 0,
            ..self
        }
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

    /// The response timeout of the message awaiting an answer fired: sends it again, with the
    /// timer re-armed as it was, while retries are left; `None` once they ran out.
    #[inline(always)]
    fn retry(self, msg: MsgKind, carry: Carry, p: Params, fx: &mut impl Effector) -> Option<Self> {
        if self.retried >= p.retries {
            return None;
        }
        let timer = match self.wire {
            Wire::MraReqRcvd | Wire::MraRepRcvd => CmTimer::Service,
            _ => CmTimer::Response,
        };
        fx.effect(Effect::Arm(timer));
        fx.effect(send(msg, 0, To::Peer, carry));
        Some(Exchange {
            retried: self.retried + 1,
            ..self
        })
    }

    /// The transition for `input`, with the effects in a list; `None` when the input is refused
    /// (accept or reject without a pending request, establish without a REP to answer). An
    /// input that does not apply to the state (a late message, a DREQ on a closed exchange)
    /// leaves it as it is, with no effect. The table tests read transitions through it.
    #[cfg(test)]
    pub(crate) fn on(self, input: Input, p: Params) -> Option<(Exchange, Effects)> {
        let mut effects = Effects::NONE;
        let next = self.on_with(input, p, &mut effects)?;
        Some((next, effects))
    }

    /// Whether the exchange takes `input` in its state: what a call the exchange may refuse
    /// (accept, reject, establish) asks before the fabric carries the transition out.
    // Without building the effects: asked through `on`, the list of a call's effects would be
    // built and dropped wherever inlining leaves it unseen that nothing reads it.
    #[inline(always)]
    pub(crate) fn takes(self, input: Input, p: Params) -> bool {
        self.on_with(input, p, &mut Discard).is_some()
    }

    /// [`on`](Self::on) with each effect handed to `fx` as the transition names it, in order,
    /// instead of collected in a list; nothing is handed when the input is refused.
    // The fabric's effector carries each effect out where it is named: the effect is a
    // constant there and its match folds, where a list built at run time (the wire state of a
    // received message, a destroy or a timer is known only then) would be walked and matched.
    #[inline(always)]
    pub(crate) fn on_with(self, input: Input, p: Params, fx: &mut impl Effector) -> Option<Exchange> {
        use Wire::*;
        let connected = p.connected;
        let rej_reason = if connected {
            reason::CONSUMER_DEFINED
        } else {
            reason::SIDR_REJECT
        };
        Some(match (input, self.wire) {
            (Input::Connect, _) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Response));
                fx.effect(send(MsgKind::Req, 0, To::Peer, Carry::Keep));
                self.sending(ReqSent)
            }
            (Input::Accept, ReqRcvd) if connected => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Response));
                fx.effect(send(MsgKind::Rep, 0, To::Peer, Carry::Keep));
                self.sending(RepSent)
            }
            (Input::Accept, ReqRcvd) => {
                // A SIDR REP is sent once; the requester's retries ask again.
                fx.effect(Effect::CancelTimers);
                fx.effect(send(MsgKind::Rep, 0, To::Peer, Carry::CallPayload));
                self.to(Closed)
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
                fx.effect(Effect::Arm(CmTimer::Response));
                fx.effect(send(MsgKind::Dreq, 0, To::Peer, Carry::Nothing));
                self.sending(DreqSent)
            }
            (Input::Disconnect, DreqRcvd) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Timewait));
                fx.effect(send(MsgKind::Drep, 0, To::Peer, Carry::Nothing));
                self.to(TimeWait)
            }
            // Not established on the wire: the IB CM has neither a DREQ nor a DREP to send, and
            // the kernel still returns 0 (an accepted child's REP keeps being sent).
            (Input::Disconnect, _) => self,
            (Input::Destroy, wire) => {
                match wire {
                    ReqSent | MraReqRcvd => fx.effect(send(
                        MsgKind::Rej,
                        reason::TIMEOUT,
                        To::Peer,
                        Carry::EmptyPrivateData,
                    )),
                    ReqRcvd | RepRcvd | RepSent | MraRepRcvd => {
                        fx.effect(send(MsgKind::Rej, rej_reason, To::Peer, Carry::EmptyPrivateData))
                    }
                    // Sent once: the kernel cancels its retries and goes through timewait.
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
            // A duplicate REQ (`cm_dup_req_handler`): the MRA that rdma_cm deferred goes out now.
            // A SIDR child drops it, and so does a child past the request.
            (Input::Msg(MsgKind::Req, _), ReqRcvd) if connected => {
                fx.effect(send(MsgKind::Mra, 0, To::Sender, Carry::Nothing));
                self
            }
            // `cm_mra_handler`: the message's tries wait the MRA's service timeout from now on.
            (Input::Msg(MsgKind::Mra, _), ReqSent) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Service));
                self.to(MraReqRcvd)
            }
            (Input::Msg(MsgKind::Mra, _), RepSent) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Service));
                self.to(MraRepRcvd)
            }
            (Input::Msg(MsgKind::Rep, _), ReqSent | MraReqRcvd) => {
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
            // A duplicate REP (`cm_dup_rep_handler`): an MRA while the response is not retrieved,
            // the RTU again once it was.
            (Input::Msg(MsgKind::Rep, _), RepRcvd) if connected => {
                fx.effect(send(MsgKind::Mra, 0, To::Sender, Carry::Nothing));
                self
            }
            (Input::Msg(MsgKind::Rep, _), Established) if connected => {
                fx.effect(send(MsgKind::Rtu, 0, To::Sender, Carry::Nothing));
                self
            }
            (Input::Msg(MsgKind::Rtu, _), RepSent | MraRepRcvd) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(queue(CmEventType::Established, 0));
                self.to(Established)
            }
            (Input::Msg(MsgKind::Rej, status), ReqSent | MraReqRcvd | RepRcvd | RepSent | MraRepRcvd) => {
                fx.effect(Effect::CancelTimers);
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
                self.to(Closed)
            }
            // A child that was not accepted gets no events (ucma drops them).
            (Input::Msg(MsgKind::Rej, _), ReqRcvd) => {
                fx.effect(Effect::CancelTimers);
                self.to(Closed)
            }
            // `cm_rej_handler` takes a REJ on an established id (its LAP state is UNINIT on
            // RoCE) into timewait, and rdma_cm, still in RDMA_CM_CONNECT, reports it; a REJ after
            // `DISCONNECTED` it drops.
            (Input::Msg(MsgKind::Rej, status), Established | DreqSent) => {
                fx.effect(Effect::CancelTimers);
                fx.effect(Effect::Arm(CmTimer::Timewait));
                if !self.disconnected {
                    fx.effect(Effect::Queue {
                        event: CmEventType::Rejected,
                        status,
                        with_message: true,
                    });
                }
                self.to(TimeWait)
            }
            (Input::Msg(MsgKind::Dreq, _), Established | RepSent | MraRepRcvd) => {
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
            // A duplicate DREQ in timewait: the DREP again (`cm_dreq_handler`).
            (Input::Msg(MsgKind::Dreq, _), TimeWait) => {
                fx.effect(send(MsgKind::Drep, 0, To::Sender, Carry::Nothing));
                self
            }
            (Input::Msg(MsgKind::Drep, _), DreqSent | DreqRcvd) => self.timewait(0, fx),
            (Input::Msg(..), _) => self,
            // The kernel sends no REJ when the last try times out (`cm_process_send_error`
            // only resets the id).
            (Input::Timer(CmTimer::Response | CmTimer::Service), ReqSent | MraReqRcvd) => {
                match self.retry(MsgKind::Req, Carry::Kept, p, fx) {
                    Some(next) => next,
                    None => {
                        fx.effect(queue(CmEventType::Unreachable, -errno::ETIMEDOUT));
                        self.to(Closed)
                    }
                }
            }
            (Input::Timer(CmTimer::Response | CmTimer::Service), RepSent | MraRepRcvd) => {
                match self.retry(MsgKind::Rep, Carry::Kept, p, fx) {
                    Some(next) => next,
                    None => {
                        fx.effect(queue(CmEventType::Unreachable, -errno::ETIMEDOUT));
                        self.to(Closed)
                    }
                }
            }
            (Input::Timer(CmTimer::Response | CmTimer::Service), DreqSent) => {
                match self.retry(MsgKind::Dreq, Carry::Nothing, p, fx) {
                    Some(next) => next,
                    None => self.timewait(-errno::ETIMEDOUT, fx),
                }
            }
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
