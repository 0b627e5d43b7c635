//! Asynchronous device events (`struct ibv_async_event`), which a device reports outside any
//! completion queue: an SRQ's limit crossed, a QP's last receive taken after it failed, a QP
//! that failed on an error no completion reports.

use std::fmt;

use crate::handle::{IdHandle, SrqHandle};

/// One asynchronous event, as [`get_async_event`](crate::CmBackend::get_async_event) hands
/// it out (already acked: the backend copies it and acks it with `ibv_ack_async_event`).
///
/// `#[non_exhaustive]`: devices report more kinds than these; a backend reports one it does
/// not model as [`AsyncEvent::Other`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum AsyncEvent {
    /// `IBV_EVENT_SRQ_LIMIT_REACHED`: fewer receives than the armed limit are posted on `srq`;
    /// the limit is disarmed until [`arm_srq_limit`](crate::CmBackend::arm_srq_limit).
    SrqLimitReached {
        /// The SRQ.
        srq: SrqHandle,
    },
    /// `IBV_EVENT_QP_LAST_WQE_REACHED`: the QP of `id`, which takes its receives from an SRQ,
    /// went to ERR and will take no more of them.
    QpLastWqeReached {
        /// The id whose QP it is.
        id: IdHandle,
    },
    /// `IBV_EVENT_QP_FATAL`: the QP of `id` failed with an error no completion reports.
    QpFatal {
        /// The id whose QP it is.
        id: IdHandle,
    },
    /// `IBV_EVENT_QP_REQ_ERR`: the QP of `id` received a request it could not make sense of.
    QpRequestErr {
        /// The id whose QP it is.
        id: IdHandle,
    },
    /// `IBV_EVENT_QP_ACCESS_ERR`: a peer's request to the QP of `id` violated its access
    /// rights.
    QpAccessErr {
        /// The id whose QP it is.
        id: IdHandle,
    },
    /// `IBV_EVENT_COMM_EST`: the QP of `id` received its first message while in RTR.
    CommEstablished {
        /// The id whose QP it is.
        id: IdHandle,
    },
    /// Another event: its `enum ibv_event_type` value.
    Other {
        /// The raw event type.
        raw: u32,
    },
}

impl AsyncEvent {
    /// The `enum ibv_event_type` value.
    pub const fn raw(&self) -> u32 {
        match self {
            AsyncEvent::QpFatal { .. } => 1,
            AsyncEvent::QpRequestErr { .. } => 2,
            AsyncEvent::QpAccessErr { .. } => 3,
            AsyncEvent::CommEstablished { .. } => 4,
            AsyncEvent::QpLastWqeReached { .. } => 16,
            AsyncEvent::SrqLimitReached { .. } => 15,
            AsyncEvent::Other { raw } => *raw,
        }
    }

    /// The `IBV_EVENT_*` name.
    pub const fn name(&self) -> &'static str {
        match self {
            AsyncEvent::QpFatal { .. } => "IBV_EVENT_QP_FATAL",
            AsyncEvent::QpRequestErr { .. } => "IBV_EVENT_QP_REQ_ERR",
            AsyncEvent::QpAccessErr { .. } => "IBV_EVENT_QP_ACCESS_ERR",
            AsyncEvent::CommEstablished { .. } => "IBV_EVENT_COMM_EST",
            AsyncEvent::QpLastWqeReached { .. } => "IBV_EVENT_QP_LAST_WQE_REACHED",
            AsyncEvent::SrqLimitReached { .. } => "IBV_EVENT_SRQ_LIMIT_REACHED",
            AsyncEvent::Other { .. } => "IBV_EVENT_(other)",
        }
    }
}

impl fmt::Display for AsyncEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            AsyncEvent::SrqLimitReached { srq } => write!(f, "{} on {srq}", self.name()),
            AsyncEvent::QpLastWqeReached { id }
            | AsyncEvent::QpFatal { id }
            | AsyncEvent::QpRequestErr { id }
            | AsyncEvent::QpAccessErr { id }
            | AsyncEvent::CommEstablished { id } => write!(f, "{} on {id}'s QP", self.name()),
            AsyncEvent::Other { raw } => write!(f, "async event {raw}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::{id_handle, srq_handle};

    #[test]
    fn events_carry_verbs_numbers_and_names() {
        let id = id_handle(1, 2, 0);
        let srq = srq_handle(1, 3, 0);
        let all = [
            (AsyncEvent::QpFatal { id }, 1, "IBV_EVENT_QP_FATAL"),
            (AsyncEvent::QpRequestErr { id }, 2, "IBV_EVENT_QP_REQ_ERR"),
            (AsyncEvent::QpAccessErr { id }, 3, "IBV_EVENT_QP_ACCESS_ERR"),
            (AsyncEvent::CommEstablished { id }, 4, "IBV_EVENT_COMM_EST"),
            (
                AsyncEvent::SrqLimitReached { srq },
                15,
                "IBV_EVENT_SRQ_LIMIT_REACHED",
            ),
            (
                AsyncEvent::QpLastWqeReached { id },
                16,
                "IBV_EVENT_QP_LAST_WQE_REACHED",
            ),
            (AsyncEvent::Other { raw: 9 }, 9, "IBV_EVENT_(other)"),
        ];
        for (ev, raw, name) in all {
            assert_eq!((ev.raw(), ev.name()), (raw, name));
        }
        assert_eq!(
            AsyncEvent::SrqLimitReached { srq }.to_string(),
            "IBV_EVENT_SRQ_LIMIT_REACHED on srq#3"
        );
        assert_eq!(
            AsyncEvent::QpFatal { id }.to_string(),
            "IBV_EVENT_QP_FATAL on id#2's QP"
        );
        assert_eq!(AsyncEvent::Other { raw: 9 }.to_string(), "async event 9");
    }
}
