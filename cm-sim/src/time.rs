//! Virtual time: nanoseconds since the fabric was built. Nothing reads the wall clock.

use std::fmt;
use std::ops::Add;
use std::time::Duration;

/// A point in virtual time.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SimTime(u64);

impl SimTime {
    /// The start of the run.
    pub const ZERO: SimTime = SimTime(0);

    /// `nanos` nanoseconds after the start.
    pub const fn from_nanos(nanos: u64) -> Self {
        SimTime(nanos)
    }

    /// Nanoseconds since the start.
    pub const fn as_nanos(self) -> u64 {
        self.0
    }

    /// The end of virtual time: a deadline that never comes.
    pub(crate) const NEVER: SimTime = SimTime(u64::MAX);

    /// `nanos` nanoseconds later, saturating at the end of virtual time.
    pub(crate) const fn after_nanos(self, nanos: u64) -> SimTime {
        SimTime(self.0.saturating_add(nanos))
    }

    /// Time since the start.
    pub const fn since_start(self) -> Duration {
        Duration::from_nanos(self.0)
    }
}

/// Saturating conversion: virtual time has 584 years of range, far beyond any timeout.
pub(crate) fn nanos(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

impl Add<Duration> for SimTime {
    type Output = SimTime;

    fn add(self, d: Duration) -> SimTime {
        SimTime(self.0.saturating_add(nanos(d)))
    }
}

impl fmt::Display for SimTime {
    /// Seconds with nanosecond digits: `1.000250000`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}.{:09}", self.0 / 1_000_000_000, self.0 % 1_000_000_000)
    }
}
