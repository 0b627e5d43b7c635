//! Shared receive queues (`struct ibv_srq`): one queue of receives that several QPs take
//! from, and its limit, whose crossing is an asynchronous event
//! ([`AsyncEvent::SrqLimitReached`](crate::AsyncEvent::SrqLimitReached)).

use crate::error::{Call, CmError};

/// What [`create_srq`](crate::CmBackend::create_srq) asks for (`struct ibv_srq_attr` and the
/// size of the backend-owned receive buffers), and what it grants.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct SrqCaps {
    /// Most receives outstanding at once.
    pub max_wr: u32,
    /// Scatter/gather entries per receive.
    pub max_sge: u32,
    /// The limit: when a receive taken leaves fewer than this many posted, the SRQ reports
    /// [`AsyncEvent::SrqLimitReached`](crate::AsyncEvent::SrqLimitReached) once and disarms.
    /// 0: disarmed. [`arm_srq_limit`](crate::CmBackend::arm_srq_limit) arms it again.
    pub srq_limit: u32,
    /// Size of each receive buffer the backend registers for the SRQ: the longest receive a
    /// work request may ask for.
    pub max_message_size: u32,
}

impl SrqCaps {
    /// 64 receives of up to 4 KiB, one entry each, no limit armed.
    pub const fn new() -> SrqCaps {
        SrqCaps {
            max_wr: 64,
            max_sge: 1,
            srq_limit: 0,
            max_message_size: 4096,
        }
    }

    /// The same capabilities with the limit armed at `limit`.
    #[must_use = "returns the changed capabilities"]
    pub const fn with_limit(self, limit: u32) -> SrqCaps {
        SrqCaps {
            srq_limit: limit,
            ..self
        }
    }

    /// `ibv_create_srq`'s checks against a device allowing `max_srq_wr` receives, `max_srq_sge`
    /// entries and message buffers of at most `max_message_size` bytes. A limit above
    /// `max_wr` is refused, as rxe refuses it (`rxe_srq_chk_attr`: `EINVAL`).
    ///
    /// # Errors
    /// [`CmError::InvalidArgument`] naming the rule.
    pub fn check(&self, max_srq_wr: u32, max_srq_sge: u32, max_message_size: u32) -> Result<(), CmError> {
        let invalid = |reason| {
            Err(CmError::InvalidArgument {
                call: Call::CreateSrq,
                reason,
            })
        };
        if !(1..=max_srq_wr).contains(&self.max_wr) {
            return invalid("max_wr must be 1..=max_srq_wr");
        }
        if !(1..=max_srq_sge).contains(&self.max_sge) {
            return invalid("max_sge must be 1..=max_srq_sge");
        }
        if !(1..=max_message_size).contains(&self.max_message_size) {
            return invalid("max_message_size out of range");
        }
        if self.srq_limit > self.max_wr {
            return invalid("srq_limit above max_wr");
        }
        Ok(())
    }
}

impl Default for SrqCaps {
    fn default() -> Self {
        Self::new()
    }
}

/// `ibv_modify_srq(IBV_SRQ_LIMIT)`'s check of a new limit on an SRQ of `max_wr` receives.
///
/// # Errors
/// [`CmError::InvalidArgument`] for a limit above `max_wr` (rxe: `EINVAL`).
pub fn check_srq_limit(limit: u32, max_wr: u32) -> Result<(), CmError> {
    if limit > max_wr {
        return Err(CmError::InvalidArgument {
            call: Call::ModifySrq,
            reason: "srq_limit above max_wr",
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reason(r: Result<(), CmError>) -> &'static str {
        match r {
            Err(CmError::InvalidArgument { reason, .. }) => reason,
            other => panic!("not refused: {other:?}"),
        }
    }

    #[test]
    fn srq_capabilities_are_checked_against_the_device() {
        let caps = SrqCaps::new();
        assert_eq!(caps.check(64, 1, 4096), Ok(()));
        assert_eq!(reason(caps.check(63, 1, 4096)), "max_wr must be 1..=max_srq_wr");
        assert_eq!(
            reason(SrqCaps { max_wr: 0, ..caps }.check(64, 1, 4096)),
            "max_wr must be 1..=max_srq_wr"
        );
        assert_eq!(
            reason(SrqCaps { max_sge: 2, ..caps }.check(64, 1, 4096)),
            "max_sge must be 1..=max_srq_sge"
        );
        assert_eq!(
            reason(SrqCaps { max_sge: 0, ..caps }.check(64, 1, 4096)),
            "max_sge must be 1..=max_srq_sge"
        );
        assert_eq!(reason(caps.check(64, 1, 4095)), "max_message_size out of range");
        assert_eq!(
            reason(
                SrqCaps {
                    max_message_size: 0,
                    ..caps
                }
                .check(64, 1, 4096)
            ),
            "max_message_size out of range"
        );
        assert_eq!(caps.with_limit(64).check(64, 1, 4096), Ok(()));
        assert_eq!(
            reason(caps.with_limit(65).check(64, 1, 4096)),
            "srq_limit above max_wr"
        );
        assert_eq!(check_srq_limit(64, 64), Ok(()));
        assert_eq!(check_srq_limit(0, 64), Ok(()));
        assert!(matches!(
            check_srq_limit(65, 64),
            Err(CmError::InvalidArgument {
                call: Call::ModifySrq,
                ..
            })
        ));
    }
}
