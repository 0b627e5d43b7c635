//! Building a fabric: seed, hosts and their addresses, latencies, timeouts.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::fabric::SimFabric;
use crate::faults::FaultSchedule;
use crate::trace::TraceMode;

/// The environment variable a seed is read from when the builder is not given one.
pub const SEED_ENV: &str = "CM_SIM_SEED";

/// Everything about a fabric except its hosts; see [`SimBuilder`] for what each field does.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SimConfig {
    /// Range a CM message's one-way latency is drawn from, and the time address and route
    /// resolution take.
    pub latency: RangeInclusive<Duration>,
    /// How long the IB CM retries an unanswered REQ, REP or DREQ before giving up
    /// (`UNREACHABLE` / `DISCONNECTED` with `-ETIMEDOUT`): (retries + 1) x response timeout.
    pub cm_timeout: Duration,
    /// How many times the IB CM sends an unanswered message again within `cm_timeout`.
    pub cm_retries: u32,
    /// The receiver-not-ready timer: how long a send waits between two tries when the
    /// receiver has no receive posted (librdmacm leaves the minimum RNR timer at 0, which the
    /// IB spec reads as 655.36 ms). Only matters under [`Fault::RnrRetries`](crate::Fault::RnrRetries).
    pub rnr_timer: Duration,
    /// How long after a disconnect completes `TIMEWAIT_EXIT` is delivered.
    pub timewait: Duration,
    /// `net.rdma_ucm.max_backlog`: the backlog used when `rdma_listen` gets 0 or less, and its cap.
    pub max_backlog: u32,
    /// Ephemeral ports handed out to implicit binds and port-0 binds (Linux's default range).
    pub ephemeral_ports: RangeInclusive<u16>,
    /// The device's `max_qp_rd_atom` / `max_qp_init_rd_atom`: what 0xFF in the connection
    /// parameters stands for, and the cap on the values exchanged.
    pub max_rd_atomic: u8,
    /// The device's `max_qp_wr`: the most work requests a QP may ask for each way.
    pub max_qp_wr: u32,
    /// The largest message buffer a QP may ask for.
    pub max_message_size: u32,
    /// How much of the trace is kept.
    pub trace: TraceMode,
}

impl SimConfig {
    /// The time between two sends of an unanswered IB CM message: `cm_timeout / (cm_retries + 1)`.
    pub fn cm_response_timeout(&self) -> Duration {
        self.cm_timeout / (self.cm_retries + 1)
    }
}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: Duration::from_micros(5)..=Duration::from_micros(50),
            // CMA_CM_RESPONSE_TIMEOUT 20 => 4.096 us * 2^20 per try, CMA_MAX_CM_RETRIES 15 retries.
            cm_timeout: Duration::from_nanos(4_096 * (1 << 20) * 16),
            cm_retries: 15,
            rnr_timer: Duration::from_micros(655_360),
            timewait: Duration::from_secs(2),
            max_backlog: 1024,
            ephemeral_ports: 32768..=60999,
            max_rd_atomic: 128,
            max_qp_wr: 16384,
            max_message_size: 1 << 20,
            trace: TraceMode::Full,
        }
    }
}

/// The seed of a run and where it came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seed {
    /// The value.
    pub value: u64,
    /// Where it came from.
    pub source: SeedSource,
}

/// Where a seed came from.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum SeedSource {
    /// [`SimBuilder::seed`].
    Builder,
    /// The `CM_SIM_SEED` environment variable.
    Environment,
    /// Drawn at random because neither was given (recorded so the run can be repeated).
    Drawn,
}

impl fmt::Display for Seed {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.value)
    }
}

/// Parses a seed as decimal or `0x` hexadecimal.
pub fn parse_seed(text: &str) -> Option<u64> {
    let t = text.trim();
    match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        Some(hex) => u64::from_str_radix(hex, 16).ok(),
        None => t.parse().ok(),
    }
}

/// A seed for a run nobody gave one for: from the standard library's per-process random keys.
fn draw_seed() -> u64 {
    let mut h = RandomState::new().build_hasher();
    h.write_u64(0x6d_5f_73_69_6d);
    h.finish()
}

/// Builds a [`SimFabric`].
///
/// ```
/// use std::time::Duration;
/// use cm_sim::SimFabric;
///
/// let fabric = SimFabric::builder()
///     .seed(42)
///     .host("10.0.0.1")
///     .host("10.0.0.2")
///     .latency(Duration::from_micros(10)..=Duration::from_micros(20))
///     .build();
/// assert_eq!(fabric.seed(), 42);
/// let server = fabric.host(0);
/// let client = fabric.host(1);
/// # let _ = (server, client);
/// ```
#[derive(Clone, Debug)]
pub struct SimBuilder {
    seed: Option<u64>,
    hosts: Vec<Vec<IpAddr>>,
    config: SimConfig,
    faults: FaultSchedule,
}

impl Default for SimBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl SimBuilder {
    /// A builder with no hosts and the default configuration.
    pub fn new() -> Self {
        SimBuilder {
            seed: None,
            hosts: Vec::new(),
            config: SimConfig::default(),
            faults: FaultSchedule::new(),
        }
    }

    /// Fixes the seed. Without it the seed comes from `CM_SIM_SEED`, else it is drawn at random;
    /// either way [`SimFabric::seed`] reports it.
    pub fn seed(mut self, seed: u64) -> Self {
        self.seed = Some(seed);
        self
    }

    /// Adds a host with one address.
    ///
    /// # Panics
    /// If `addr` is not an IP address.
    pub fn host(self, addr: &str) -> Self {
        self.host_with_addrs(&[addr])
    }

    /// Adds a host with several addresses (its first is where unbound ids resolve from).
    ///
    /// # Panics
    /// If an address does not parse, the list is empty, or an address is already used.
    pub fn host_with_addrs(mut self, addrs: &[&str]) -> Self {
        assert!(!addrs.is_empty(), "a host needs at least one address");
        let ips: Vec<IpAddr> = addrs
            .iter()
            .map(|a| a.parse().unwrap_or_else(|_| panic!("not an IP address: {a}")))
            .collect();
        for ip in &ips {
            assert!(
                !self.hosts.iter().flatten().any(|other| other == ip),
                "address {ip} given twice"
            );
            assert!(
                !ip.is_unspecified() && !ip.is_loopback(),
                "host address {ip} must be a unicast address"
            );
        }
        self.hosts.push(ips);
        self
    }

    /// One-way CM message latency range (also the time address and route resolution take).
    pub fn latency(mut self, range: RangeInclusive<Duration>) -> Self {
        assert!(range.start() <= range.end(), "empty latency range");
        self.config.latency = range;
        self
    }

    /// How long the IB CM retries unanswered messages before giving up.
    pub fn cm_timeout(mut self, timeout: Duration) -> Self {
        self.config.cm_timeout = timeout;
        self
    }

    /// The timewait period before `TIMEWAIT_EXIT`.
    pub fn timewait(mut self, timewait: Duration) -> Self {
        self.config.timewait = timewait;
        self
    }

    /// `net.rdma_ucm.max_backlog`.
    pub fn max_backlog(mut self, backlog: u32) -> Self {
        assert!(backlog > 0, "max_backlog must be positive");
        self.config.max_backlog = backlog;
        self
    }

    /// The ephemeral port range.
    pub fn ephemeral_ports(mut self, range: RangeInclusive<u16>) -> Self {
        assert!(
            *range.start() > 0 && range.start() <= range.end(),
            "bad ephemeral port range"
        );
        self.config.ephemeral_ports = range;
        self
    }

    /// How much of the trace is kept.
    pub fn trace(mut self, mode: TraceMode) -> Self {
        self.config.trace = mode;
        self
    }

    /// Replaces the whole configuration.
    pub fn config(mut self, config: SimConfig) -> Self {
        self.config = config;
        self
    }

    /// The seed this builder will use, resolving `CM_SIM_SEED` or drawing one if needed.
    fn resolve_seed(&self) -> Seed {
        if let Some(value) = self.seed {
            return Seed {
                value,
                source: SeedSource::Builder,
            };
        }
        if let Ok(text) = std::env::var(SEED_ENV) {
            match parse_seed(&text) {
                Some(value) => {
                    return Seed {
                        value,
                        source: SeedSource::Environment,
                    }
                }
                None => panic!("{SEED_ENV}={text:?} is not a number (decimal or 0x hex)"),
            }
        }
        Seed {
            value: draw_seed(),
            source: SeedSource::Drawn,
        }
    }

    /// Faults to strike during the run (see [`Fault`](crate::Fault)); several calls add up.
    pub fn faults(mut self, schedule: FaultSchedule) -> Self {
        self.faults.faults.extend(schedule.faults);
        self
    }

    /// Builds the fabric.
    ///
    /// # Panics
    /// If no host was added, or a fault names a host the fabric does not have.
    pub fn build(self) -> SimFabric {
        assert!(!self.hosts.is_empty(), "a fabric needs at least one host");
        let seed = self.resolve_seed();
        let fabric = SimFabric::new(seed, self.hosts, self.config);
        fabric.schedule_faults(self.faults);
        fabric
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seeds_parse_in_decimal_and_hex() {
        assert_eq!(parse_seed("42"), Some(42));
        assert_eq!(parse_seed(" 0x2A "), Some(42));
        assert_eq!(parse_seed("x"), None);
    }

    #[test]
    fn builder_seed_wins() {
        let b = SimBuilder::new().seed(9).host("10.0.0.1");
        assert_eq!(
            b.resolve_seed(),
            Seed {
                value: 9,
                source: SeedSource::Builder
            }
        );
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn duplicate_addresses_are_refused() {
        let _ = SimBuilder::new().host("10.0.0.1").host("10.0.0.1");
    }
}
