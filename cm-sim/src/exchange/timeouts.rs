//! The IB CM's timeouts by the kernel's arithmetic (Linux 6.1, `drivers/infiniband/core/cm.c`
//! and `cma.c`; 6.12 differs only in the RoCE packet lifetime).
//!
//! The IB CM keeps its times as IBA exponents: `t` stands for 4.096 us x 2^t. It converts them
//! to milliseconds with `cm_convert_to_ms(t) = 1 << max(t - 8, 0)`, which rounds 4.096 us x 2^t
//! down to a power of two (2^20 x 4.096 us = 4.29 s becomes 4 096 ms), and what it waits follows
//! from a path's packet lifetime and the device's ACK delay:
//!
//! | wait | kernel | Linux 6.1 on rxe |
//! |---|---|---|
//! | active side, per try of a REQ or DREQ | `2 x convert(lifetime) + convert(20)` (`ib_send_cm_req`) | 6 144 ms |
//! | passive side, per try of a REP or DREQ | `convert(20)`, the REQ's local CM response timeout | 4 096 ms |
//! | a SIDR REQ, per try | `1 << (20 - 8)` (`cma_resolve_ib_udp`) | 4 096 ms |
//! | per try once the peer sent an MRA | `convert(24) + convert(av.timeout)` (`cm_mra_handler`) | 67 584 ms |
//! | timewait | `convert(av.timeout)` (`cm_enter_timewait`) | 2 048 ms |
//!
//! `av.timeout` is `cm_ack_timeout(ca_ack_delay, lifetime)` once the REP is in (the active side)
//! or from the REQ (the passive side), and `lifetime + 1` on the active side before its REP: both
//! 19 with the defaults. Each message is sent 1 + 15 times (`CMA_MAX_CM_RETRIES`) before the IB
//! CM gives up.

/// Milliseconds the IB CM waits for the IBA exponent `t` (`cm_convert_to_ms`).
pub(crate) const fn convert_ms(t: u8) -> u64 {
    1 << t.saturating_sub(8)
}

/// The kernel's `cm_ack_timeout`: the exponent of 4.096 us x 2^`ca_ack_delay` plus twice the
/// packet lifetime, rounded as the kernel rounds it (the larger term, plus one when the other is
/// within a factor of two), at most 31.
pub(crate) fn ack_timeout(ca_ack_delay: u8, packet_lifetime: u8) -> u8 {
    let mut t = packet_lifetime as u16 + 1;
    let delay = ca_ack_delay as u16;
    if t >= delay {
        t += (delay + 1 >= t) as u16;
    } else {
        t = delay + (t + 1 >= delay) as u16;
    }
    // At most 31, the 5-bit field's largest value.
    t.min(31) as u8
}

/// The path's packet lifetime the passive side takes from a REQ sent over a path of
/// `packet_lifetime`: the REQ's local ACK timeout (`cm_ack_timeout`) less one
/// (`cm_format_paths_from_req`).
pub(crate) fn passive_lifetime(ca_ack_delay: u8, packet_lifetime: u8) -> u8 {
    ack_timeout(ca_ack_delay, packet_lifetime).saturating_sub(1)
}

/// What one id's IB CM waits, in nanoseconds, for a path of one packet lifetime.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Waits {
    /// Per try of the active side's REQ and DREQ.
    pub(crate) active_try: u64,
    /// Per try of the passive side's REP and DREQ, and of a SIDR REQ.
    pub(crate) passive_try: u64,
    /// Per try of the active side's REQ once the passive side sent an MRA.
    pub(crate) active_service: u64,
    /// Per try of the passive side's REP once the active side sent an MRA.
    pub(crate) passive_service: u64,
    /// Timewait, on both sides.
    pub(crate) timewait: u64,
}

/// The IB CM's settings the waits come from (IBA exponents, as the kernel keeps them).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Exponents {
    /// `CMA_CM_RESPONSE_TIMEOUT`.
    pub(crate) response: u8,
    /// The MRA's service timeout (`CMA_CM_MRA_SETTING`).
    pub(crate) mra_service: u8,
    /// The device's `local_ca_ack_delay`.
    pub(crate) ca_ack_delay: u8,
}

impl Exponents {
    /// The waits of an active id on a path of `lifetime`, and of the passive id its REQ makes.
    pub(crate) fn waits(self, lifetime: u8) -> Waits {
        // The passive side's av.timeout, from the REQ's path: its lifetime plus one. The active
        // side's is lifetime + 1 until its REP, cm_ack_timeout(the peer's delay, lifetime) after.
        let after_rep = passive_lifetime(self.ca_ack_delay, lifetime) + 1;
        let service = convert_ms(self.mra_service);
        Waits {
            active_try: nanos_of_ms(2 * convert_ms(lifetime) + convert_ms(self.response)),
            passive_try: nanos_of_ms(convert_ms(self.response)),
            active_service: nanos_of_ms(service + convert_ms(lifetime.saturating_add(1))),
            passive_service: nanos_of_ms(service + convert_ms(after_rep)),
            timewait: nanos_of_ms(convert_ms(after_rep)),
        }
    }
}

fn nanos_of_ms(ms: u64) -> u64 {
    ms.saturating_mul(1_000_000)
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINUX_6_1: Exponents = Exponents {
        response: 20,
        mra_service: 24,
        ca_ack_delay: 15,
    };

    #[test]
    fn times_convert_to_powers_of_two_milliseconds_as_the_kernel_rounds_them() {
        assert_eq!(convert_ms(20), 4_096);
        assert_eq!(convert_ms(19), 2_048);
        assert_eq!(convert_ms(18), 1_024);
        assert_eq!(convert_ms(9), 2);
        assert_eq!(convert_ms(8), 1);
        // Below 8 the kernel's shift is clamped at 0: a millisecond, never less.
        assert_eq!(convert_ms(0), 1);
        assert_eq!(convert_ms(31), 1 << 23);
    }

    #[test]
    fn ack_timeout_takes_the_larger_term_and_rounds_up_when_the_other_is_close() {
        // rxe: ACK delay 15, RoCE lifetime 18 on 6.1 (16 on 6.12).
        assert_eq!(ack_timeout(15, 18), 19);
        assert_eq!(ack_timeout(15, 16), 17);
        // lifetime + 1 = 15 meets the delay 15: rounded up once.
        assert_eq!(ack_timeout(15, 14), 16);
        assert_eq!(ack_timeout(15, 13), 16);
        // The delay dominates, and lifetime + 1 = 13 is below delay - 1: not rounded up.
        assert_eq!(ack_timeout(15, 12), 15);
        assert_eq!(ack_timeout(15, 0), 15);
        assert_eq!(ack_timeout(0, 0), 2);
        assert_eq!(ack_timeout(31, 31), 31);
        assert_eq!(ack_timeout(0, 30), 31);
    }

    #[test]
    fn the_passive_side_takes_the_reqs_ack_timeout_less_one_as_its_lifetime() {
        assert_eq!(passive_lifetime(15, 18), 18);
        assert_eq!(passive_lifetime(15, 0), 14);
        assert_eq!(passive_lifetime(0, 0), 1);
    }

    #[test]
    fn linux_6_1_on_rxe_waits_six_seconds_a_req_four_a_rep_and_two_in_timewait() {
        let w = LINUX_6_1.waits(18);
        assert_eq!(w.active_try, 6_144_000_000);
        assert_eq!(w.passive_try, 4_096_000_000);
        assert_eq!(w.active_service, 67_584_000_000);
        assert_eq!(w.passive_service, 67_584_000_000);
        assert_eq!(w.timewait, 2_048_000_000);
        // 6.12's RoCE lifetime of 16.
        let w = LINUX_6_1.waits(16);
        assert_eq!(w.active_try, 4_608_000_000);
        assert_eq!(w.timewait, 512_000_000);
        assert_eq!(w.active_service, 66_048_000_000);
    }

    #[test]
    fn a_short_lifetime_leaves_the_passive_side_the_devices_ack_delay() {
        // ACK_TIMEOUT 1: lifetime 0 on the active side; the REQ's ACK timeout is then the
        // device's delay (15), so the passive side waits 128 ms in timewait.
        let w = LINUX_6_1.waits(0);
        assert_eq!(w.timewait, 128_000_000);
        assert_eq!(w.active_service, 65_537_000_000);
        assert_eq!(w.passive_service, 65_664_000_000);
    }

    #[test]
    fn ack_timeout_option_shortens_the_active_sides_tries() {
        // ACK_TIMEOUT t makes the lifetime t - 1 (cma_resolve_iboe_route).
        for (option, per_try_ms) in [(1u8, 4_098u64), (8, 4_098), (14, 4_160), (18, 5_120)] {
            let w = LINUX_6_1.waits(option - 1);
            assert_eq!(w.active_try, per_try_ms * 1_000_000, "ACK_TIMEOUT {option}");
        }
    }
}
