//! The hardware side of a QP's work requests, as pure code (no I/O). Slots, the wr_id each
//! carries and the completions of requests posted while the QP is in ERR are cm-core's
//! [`WrPool`](cm_core::backend::WrPool), shared with the simulator; the slot index is the `wr_id`
//! given to verbs and the index of the request's registered message buffer. Requests posted on
//! a QP in ERR are not posted to the device but flushed by the pool, because not every provider
//! completes them (rxe on Linux 6.1 never completes a receive posted on a QP already in ERR).
//!
//! # Errors the device produced
//!
//! The QP also goes to ERR without any call of ours: the device does it when a request fails
//! (retries exhausted, a receive too short, a protection error), and says so only with an error
//! completion on the CQ. libibverbs' cached QP state does not change, so until that completion is
//! polled the backend would still post to the hardware — where rxe on Linux 6.1 never completes
//! a receive. Before posting, the backend therefore moves whatever the CQ holds into
//! [`Prefetched`] (polling a CQ is a user-space read, no system call) and flushes the request
//! when one of those completions is an error. `poll_cq` hands the prefetched completions out
//! first, in CQ order, so the user sees exactly what an immediate poll would have shown.
//!
//! What remains is the device failing a request between that look and the post: a race with the
//! hardware that no check in user space closes (querying the QP's state has the same window).

use std::collections::VecDeque;

use cm_core::WcStatus;

use crate::sys::RawCompletion;

/// Completions taken from a QP's CQ before the user polled for them (see the
/// [module docs](self)), in CQ order. At most one per request posted to the hardware, so bounded
/// by the QP's work requests.
#[derive(Debug, Default)]
pub(crate) struct Prefetched {
    completions: VecDeque<RawCompletion>,
    /// Whether any completion stored so far reported an error.
    error: bool,
}

impl Prefetched {
    /// Keeps `polled` (just taken from the CQ) for a later poll; whether the device has reported
    /// an error completion so far, which means it has put the QP in ERR.
    pub(crate) fn keep(&mut self, polled: &[RawCompletion]) -> bool {
        self.error |= polled
            .iter()
            .any(|c| WcStatus::from_raw(c.status) != Some(WcStatus::Success));
        self.completions.extend(polled.iter().copied());
        self.error
    }

    /// Moves at most `max` of the kept completions, oldest first, to `out`; how many.
    pub(crate) fn hand_out(&mut self, max: usize, out: &mut Vec<RawCompletion>) -> usize {
        let n = max.min(self.completions.len());
        out.extend(self.completions.drain(..n));
        n
    }

    /// Completions kept and not handed out yet.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.completions.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn raw(wr_id: u64, status: WcStatus) -> RawCompletion {
        RawCompletion {
            wr_id,
            status: status as u32,
            opcode: 0,
            byte_len: 0,
            wc_flags: 0,
            imm_data: 0,
            sender: None,
        }
    }

    #[test]
    fn an_unpolled_error_completion_from_the_device_is_seen_before_posting() {
        let mut early = Prefetched::default();
        assert!(!early.keep(&[]), "an empty CQ shows no error");
        assert!(!early.keep(&[raw(0, WcStatus::Success)]));
        // The device failed a send (retries exhausted) and flushed the receive behind it.
        assert!(early.keep(&[raw(1, WcStatus::RetryExcErr), raw(2, WcStatus::WrFlushErr)]));
        assert!(early.keep(&[]), "the error is remembered until the QP is gone");
        assert_eq!(early.len(), 3);
        let mut out = Vec::new();
        assert_eq!(early.hand_out(2, &mut out), 2);
        assert_eq!(early.hand_out(5, &mut out), 1);
        assert_eq!(early.hand_out(5, &mut out), 0);
        let ids: Vec<u64> = out.iter().map(|c| c.wr_id).collect();
        assert_eq!(ids, [0, 1, 2], "handed out in CQ order");
    }

    #[test]
    fn a_status_verbs_does_not_name_counts_as_an_error() {
        let mut early = Prefetched::default();
        let unknown = RawCompletion {
            status: 999,
            ..raw(0, WcStatus::Success)
        };
        assert!(early.keep(&[unknown]));
    }
}
