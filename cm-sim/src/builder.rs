//! Building a fabric: seed, hosts and their addresses, latencies, timeouts.

use std::collections::hash_map::RandomState;
use std::fmt;
use std::hash::{BuildHasher, Hasher};
use std::net::IpAddr;
use std::ops::RangeInclusive;
use std::time::Duration;

use crate::exchange::timeouts::{Exponents, Waits};
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
    /// The IB CM's response timeout, an IBA exponent (4.096 us x 2^t; `CMA_CM_RESPONSE_TIMEOUT`,
    /// 20). The IB CM waits `convert(t) = 2^(t - 8)` ms for an answer per try, plus twice the
    /// path's packet lifetime on the active side: see [`active_response_timeout`](Self::active_response_timeout).
    pub cm_response_timeout: u8,
    /// The path's packet lifetime, an IBA exponent: RoCE has no path records, and rdma_cm sets
    /// `CMA_IBOE_PACKET_LIFETIME` (18 on Linux 6.1, the lab's kernel; 16 from 6.12), or
    /// `ACK_TIMEOUT` - 1 for an id that set that option before route resolution.
    pub packet_lifetime: u8,
    /// The device's `local_ca_ack_delay`, an IBA exponent (rxe: 15): with the packet lifetime it
    /// makes the connection's ACK timeout (`cm_ack_timeout`), which timewait and the waits after
    /// an MRA follow.
    pub ca_ack_delay: u8,
    /// The service timeout rdma_cm's MRA names, an IBA exponent (`CMA_CM_MRA_SETTING`, 24: 65.5 s):
    /// once the peer sent one, each try waits this much more.
    pub mra_service_timeout: u8,
    /// How many times the IB CM sends an unanswered REQ, REP or DREQ again before giving up
    /// (`UNREACHABLE` / `DISCONNECTED` with `-ETIMEDOUT`; `CMA_MAX_CM_RETRIES`, 15).
    pub cm_retries: u32,
    /// The receiver-not-ready timer: how long a send waits between two tries when the
    /// receiver has no receive posted (librdmacm leaves the minimum RNR timer at 0, which the
    /// IB spec reads as 655.36 ms). Only matters on connections whose peer asked for fewer than 7
    /// RNR retries, and under [`Fault::RnrRetries`](crate::Fault::RnrRetries).
    pub rnr_timer: Duration,
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
    /// The device's `max_sge`: the most scatter/gather entries per work request (rxe: 32).
    pub max_sge: u32,
    /// The most bytes a QP may ask to send inline (rxe: 400).
    pub max_inline_data: u32,
    /// The device's `max_mr_size`: the longest region `reg_mr` registers (rxe reports 2^64 - 1;
    /// the default, 1 GiB, keeps a mistaken length from allocating the machine's memory).
    pub max_mr_size: u64,
    /// The port's `max_msg_sz` (rxe: 8 MiB). Reported only, as on rxe, which does not enforce
    /// it: longer READs, WRITEs and SENDs are carried whole.
    pub max_msg_sz: u32,
    /// The device's `max_srq_wr`: the most receives a shared receive queue may hold (rxe: 2^20).
    pub max_srq_wr: u32,
    /// The device's `max_srq_sge`: scatter/gather entries per SRQ receive (rxe: 27).
    pub max_srq_sge: u32,
    /// The QP's local ACK timeout: a send the peer never acknowledges (crashed, partitioned,
    /// gone) is sent again after it, `retry_count` times (from [`ConnParam`](cm_core::ConnParam)),
    /// then completes with `RETRY_EXC_ERR`. Default 4.096 us x 2^19 = 2.1 s: RoCE's packet
    /// lifetime 18 doubled, the timeout the IB CM gives a QP on rxe.
    pub ack_timeout: Duration,
    /// How much of the trace is kept.
    pub trace: TraceMode,
}

impl SimConfig {
    /// The exponents the IB CM's waits are made of.
    pub(crate) fn exponents(&self) -> Exponents {
        Exponents {
            response: self.cm_response_timeout,
            mra_service: self.mra_service_timeout,
            ca_ack_delay: self.ca_ack_delay,
        }
    }

    fn waits(&self) -> Waits {
        self.exponents().waits(self.packet_lifetime)
    }

    /// The active side's wait for an answer to its REQ or DREQ, per try:
    /// `2 x convert(packet_lifetime) + convert(cm_response_timeout)` (6.144 s on Linux 6.1).
    ///
    /// ```
    /// use std::time::Duration;
    /// let cfg = cm_sim::SimConfig::default();
    /// assert_eq!(cfg.active_response_timeout(), Duration::from_millis(6_144));
    /// assert_eq!(cfg.passive_response_timeout(), Duration::from_millis(4_096));
    /// assert_eq!(cfg.timewait(), Duration::from_millis(2_048));
    /// // 16 tries of a REQ nobody answers: UNREACHABLE after 98.3 s.
    /// assert_eq!(cfg.req_timeout(), Duration::from_millis(16 * 6_144));
    /// ```
    pub fn active_response_timeout(&self) -> Duration {
        Duration::from_nanos(self.waits().active_try)
    }

    /// The passive side's wait for an answer to its REP or DREQ, and a SIDR REQ's, per try:
    /// `convert(cm_response_timeout)` (4.096 s).
    pub fn passive_response_timeout(&self) -> Duration {
        Duration::from_nanos(self.waits().passive_try)
    }

    /// The active side's wait per try once the passive side answered a duplicate REQ with an
    /// MRA: `convert(mra_service_timeout) + convert(packet_lifetime + 1)` (67.6 s).
    pub fn mra_response_timeout(&self) -> Duration {
        Duration::from_nanos(self.waits().active_service)
    }

    /// How long after a disconnect completes `TIMEWAIT_EXIT` is delivered:
    /// `convert(cm_ack_timeout(ca_ack_delay, packet_lifetime))` (2.048 s).
    pub fn timewait(&self) -> Duration {
        Duration::from_nanos(self.waits().timewait)
    }

    /// How long an active id's REQ that nobody answers takes to end in `UNREACHABLE`
    /// (`-ETIMEDOUT`): (`cm_retries` + 1) tries of [`active_response_timeout`](Self::active_response_timeout).
    pub fn req_timeout(&self) -> Duration {
        self.active_response_timeout() * self.cm_retries.saturating_add(1)
    }

    /// Checks every field: what [`SimBuilder::try_build`] refuses.
    pub fn check(&self) -> Result<(), ConfigError> {
        let bad = |field, reason| Err(ConfigError::BadConfig { field, reason });
        if self.latency.start() > self.latency.end() {
            return bad("latency", "the range is empty (start after end)");
        }
        if self.cm_retries > MAX_CM_RETRIES {
            return bad("cm_retries", "at most 15 (the REQ's 4-bit Max CM Retries field)");
        }
        for (field, t) in [
            ("cm_response_timeout", self.cm_response_timeout),
            ("packet_lifetime", self.packet_lifetime),
            ("ca_ack_delay", self.ca_ack_delay),
            ("mra_service_timeout", self.mra_service_timeout),
        ] {
            if t > MAX_IBA_TIME {
                return bad(field, "at most 31 (a 5-bit IBA time field)");
            }
        }
        if self.max_backlog == 0 {
            return bad("max_backlog", "must be at least 1");
        }
        if *self.ephemeral_ports.start() == 0 || self.ephemeral_ports.start() > self.ephemeral_ports.end() {
            return bad(
                "ephemeral_ports",
                "must be a non-empty range not starting at port 0",
            );
        }
        if self.max_qp_wr == 0 || self.max_message_size == 0 || self.max_sge == 0 {
            return bad(
                "max_qp_wr / max_message_size / max_sge",
                "a device allows at least 1",
            );
        }
        if self.max_mr_size == 0 || self.max_srq_wr == 0 || self.max_srq_sge == 0 {
            return bad(
                "max_mr_size / max_srq_wr / max_srq_sge",
                "a device allows at least 1",
            );
        }
        Ok(())
    }
}

/// The IB CM's limit on retries: the REQ carries them in 4 bits.
const MAX_CM_RETRIES: u32 = 15;

/// The largest IBA time exponent: the CM messages carry them in 5 bits.
const MAX_IBA_TIME: u8 = 31;

/// Why a [`SimBuilder`] cannot build a fabric.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum ConfigError {
    /// No host was added.
    NoHosts,
    /// A host was added with an empty address list.
    HostWithoutAddress {
        /// The host's number.
        host: usize,
    },
    /// An address does not parse as IPv4 or IPv6.
    NotAnAddress {
        /// The host's number.
        host: usize,
        /// What was given.
        text: String,
    },
    /// A loopback or wildcard address (`127.0.0.1`, `0.0.0.0`, `::1`, `::`) given to a host:
    /// those resolve to the resolving host itself and are nobody's address on a fabric.
    NotUnicast {
        /// The host's number.
        host: usize,
        /// The address.
        addr: IpAddr,
    },
    /// The same address given twice.
    AddressTwice {
        /// The address.
        addr: IpAddr,
    },
    /// `CM_SIM_SEED` holds something that is not a number.
    BadSeed {
        /// The variable's value.
        text: String,
    },
    /// A [`SimConfig`] field is out of range.
    BadConfig {
        /// The field.
        field: &'static str,
        /// What it must be.
        reason: &'static str,
    },
    /// A scheduled fault names a host the fabric does not have.
    FaultHost {
        /// The fault.
        fault: String,
        /// The host it names.
        host: u16,
        /// How many hosts the fabric has.
        hosts: usize,
    },
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ConfigError::NoHosts => f.write_str("a fabric needs at least one host"),
            ConfigError::HostWithoutAddress { host } => write!(f, "host {host} needs at least one address"),
            ConfigError::NotAnAddress { host, text } => write!(f, "host {host}: not an IP address: {text:?}"),
            ConfigError::NotUnicast { host, addr } => write!(
                f,
                "host {host}: address {addr} must be a unicast address (loopback and wildcard destinations already resolve to the resolving host)"
            ),
            ConfigError::AddressTwice { addr } => write!(f, "address {addr} given twice"),
            ConfigError::BadSeed { text } => {
                write!(f, "{SEED_ENV}={text:?} is not a number (decimal or 0x hex)")
            }
            ConfigError::BadConfig { field, reason } => write!(f, "bad configuration: {field}: {reason}"),
            ConfigError::FaultHost { fault, host, hosts } => {
                write!(f, "fault `{fault}` names host {host}, the fabric has {hosts}")
            }
        }
    }
}

impl std::error::Error for ConfigError {}

impl Default for SimConfig {
    fn default() -> Self {
        SimConfig {
            latency: Duration::from_micros(5)..=Duration::from_micros(50),
            // Linux 6.1's cma.c: CMA_CM_RESPONSE_TIMEOUT, CMA_IBOE_PACKET_LIFETIME,
            // CMA_CM_MRA_SETTING, CMA_MAX_CM_RETRIES; rxe's RXE_LOCAL_CA_ACK_DELAY.
            cm_response_timeout: 20,
            packet_lifetime: 18,
            ca_ack_delay: 15,
            mra_service_timeout: 24,
            cm_retries: 15,
            rnr_timer: Duration::from_micros(655_360),
            max_backlog: 1024,
            ephemeral_ports: 32768..=60999,
            max_rd_atomic: 128,
            max_qp_wr: 16384,
            max_message_size: 1 << 20,
            max_sge: 32,
            max_inline_data: 400,
            max_mr_size: 1 << 30,
            // rxe's RXE_PORT_MAX_MSG_SZ, RXE_MAX_SRQ_WR and RXE_MAX_SRQ_SGE.
            max_msg_sz: 1 << 23,
            max_srq_wr: 1 << 20,
            max_srq_sge: 27,
            ack_timeout: Duration::from_nanos(4_096 << 19),
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

/// The seed `CM_SIM_SEED` (its value `env`) gives, or a drawn one when it is not set.
fn seed_from_env(env: Option<std::ffi::OsString>) -> Result<Seed, ConfigError> {
    let Some(text) = env else {
        return Ok(Seed {
            value: draw_seed(),
            source: SeedSource::Drawn,
        });
    };
    let text = text.to_string_lossy().into_owned();
    match parse_seed(&text) {
        Some(value) => Ok(Seed {
            value,
            source: SeedSource::Environment,
        }),
        None => Err(ConfigError::BadSeed { text }),
    }
}

/// An address given to [`SimBuilder::host`]: an [`IpAddr`] (or anything that converts into
/// one: `Ipv4Addr`, `Ipv6Addr`, `[u8; 4]`, `[u8; 16]`, `[u16; 8]`), or text that
/// [`try_build`](SimBuilder::try_build) parses and reports with
/// [`ConfigError::NotAnAddress`] when it is not an address.
///
/// Text stays accepted because fabrics are mostly written down as literals (`"10.0.0.1"`) and
/// read from command lines, where an early `parse().unwrap()` would trade the builder's one
/// error report for a panic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HostAddr(HostAddrRepr);

#[derive(Clone, Debug, PartialEq, Eq)]
enum HostAddrRepr {
    Ip(IpAddr),
    Text(String),
}

impl HostAddr {
    fn parse(&self, host: usize) -> Result<IpAddr, ConfigError> {
        match &self.0 {
            HostAddrRepr::Ip(ip) => Ok(*ip),
            HostAddrRepr::Text(text) => text.trim().parse().map_err(|_| ConfigError::NotAnAddress {
                host,
                text: text.clone(),
            }),
        }
    }
}

macro_rules! host_addr_from_ip {
    ($($t:ty),*) => {$(
        impl From<$t> for HostAddr {
            fn from(addr: $t) -> Self {
                HostAddr(HostAddrRepr::Ip(IpAddr::from(addr)))
            }
        }
    )*};
}
host_addr_from_ip!(
    IpAddr,
    std::net::Ipv4Addr,
    std::net::Ipv6Addr,
    [u8; 4],
    [u8; 16],
    [u16; 8]
);

impl From<&IpAddr> for HostAddr {
    fn from(addr: &IpAddr) -> Self {
        HostAddr(HostAddrRepr::Ip(*addr))
    }
}

impl From<&str> for HostAddr {
    fn from(text: &str) -> Self {
        HostAddr(HostAddrRepr::Text(text.to_owned()))
    }
}

impl From<&&str> for HostAddr {
    fn from(text: &&str) -> Self {
        HostAddr::from(*text)
    }
}

impl From<String> for HostAddr {
    fn from(text: String) -> Self {
        HostAddr(HostAddrRepr::Text(text))
    }
}

impl From<&String> for HostAddr {
    fn from(text: &String) -> Self {
        HostAddr::from(text.as_str())
    }
}

/// Builds a [`SimFabric`]. Nothing is checked until [`try_build`](SimBuilder::try_build) (or
/// [`build`](SimBuilder::build), which panics with the same message).
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
#[must_use = "a builder does nothing until build or try_build"]
pub struct SimBuilder {
    seed: Option<u64>,
    hosts: Vec<Vec<HostAddr>>,
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

    /// Adds a host with one address (checked by [`try_build`](Self::try_build)): an
    /// [`IpAddr`], or text (see [`HostAddr`]).
    ///
    /// ```
    /// use std::net::{IpAddr, Ipv4Addr};
    /// use cm_sim::SimFabric;
    ///
    /// let fabric = SimFabric::builder()
    ///     .seed(1)
    ///     .host(Ipv4Addr::new(10, 0, 0, 1))
    ///     .host([10, 0, 0, 2])
    ///     .host("fd00::3")
    ///     .build();
    /// assert_eq!(fabric.host(1).addr(), "10.0.0.2".parse::<IpAddr>().unwrap());
    /// ```
    pub fn host(self, addr: impl Into<HostAddr>) -> Self {
        self.host_with_addrs([addr])
    }

    /// Adds a host with several addresses (its first is where unbound ids resolve from). Each
    /// must be a unicast IPv4 or IPv6 address no other host has; [`try_build`](Self::try_build)
    /// checks.
    pub fn host_with_addrs<A: Into<HostAddr>>(mut self, addrs: impl IntoIterator<Item = A>) -> Self {
        self.hosts.push(addrs.into_iter().map(Into::into).collect());
        self
    }

    /// One-way CM message latency range (also the time address and route resolution take).
    pub fn latency(mut self, range: RangeInclusive<Duration>) -> Self {
        self.config.latency = range;
        self
    }

    /// The IB CM's response timeout and the path's packet lifetime, as IBA exponents (see
    /// [`SimConfig::cm_response_timeout`] and [`SimConfig::packet_lifetime`]; Linux 6.1's are 20
    /// and 18). Small values make a test's timeouts short, as they would be on a fabric:
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_sim::SimFabric;
    ///
    /// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").cm_timeouts(12, 8).build();
    /// // 2 x 1 ms + 16 ms a try, 16 tries.
    /// assert_eq!(fabric.config().req_timeout(), Duration::from_millis(16 * 18));
    /// ```
    pub fn cm_timeouts(mut self, response_timeout: u8, packet_lifetime: u8) -> Self {
        self.config.cm_response_timeout = response_timeout;
        self.config.packet_lifetime = packet_lifetime;
        self
    }

    /// How many times the IB CM sends an unanswered REQ, REP or DREQ again (at most 15).
    pub fn cm_retries(mut self, retries: u32) -> Self {
        self.config.cm_retries = retries;
        self
    }

    /// `net.rdma_ucm.max_backlog` (at least 1).
    pub fn max_backlog(mut self, backlog: u32) -> Self {
        self.config.max_backlog = backlog;
        self
    }

    /// The ephemeral port range (non-empty, not starting at 0).
    pub fn ephemeral_ports(mut self, range: RangeInclusive<u16>) -> Self {
        self.config.ephemeral_ports = range;
        self
    }

    /// The longest memory region `reg_mr` registers (at least 1; 1 GiB by default).
    pub fn max_mr_size(mut self, bytes: u64) -> Self {
        self.config.max_mr_size = bytes;
        self
    }

    /// The QPs' local ACK timeout: how long a request nobody acknowledges waits before it is
    /// sent again (see [`SimConfig::ack_timeout`]). Small values make a test's transport
    /// retries short.
    pub fn ack_timeout(mut self, timeout: Duration) -> Self {
        self.config.ack_timeout = timeout;
        self
    }

    /// How much of the trace is kept.
    pub fn trace(mut self, mode: TraceMode) -> Self {
        self.config.trace = mode;
        self
    }

    /// Replaces the whole configuration (checked by [`try_build`](Self::try_build) like the
    /// setters' values).
    pub fn config(mut self, config: SimConfig) -> Self {
        self.config = config;
        self
    }

    /// The seed this builder will use, resolving `CM_SIM_SEED` or drawing one if needed.
    fn resolve_seed(&self) -> Result<Seed, ConfigError> {
        if let Some(value) = self.seed {
            return Ok(Seed {
                value,
                source: SeedSource::Builder,
            });
        }
        seed_from_env(std::env::var_os(SEED_ENV))
    }

    /// The hosts' addresses, parsed and checked.
    fn host_addrs(&self) -> Result<Vec<Vec<IpAddr>>, ConfigError> {
        if self.hosts.is_empty() {
            return Err(ConfigError::NoHosts);
        }
        let mut seen: Vec<IpAddr> = Vec::new();
        let mut hosts = Vec::with_capacity(self.hosts.len());
        for (host, texts) in self.hosts.iter().enumerate() {
            if texts.is_empty() {
                return Err(ConfigError::HostWithoutAddress { host });
            }
            let mut ips = Vec::with_capacity(texts.len());
            for given in texts {
                let addr = given.parse(host)?;
                if addr.is_unspecified() || addr.is_loopback() {
                    return Err(ConfigError::NotUnicast { host, addr });
                }
                if seen.contains(&addr) {
                    return Err(ConfigError::AddressTwice { addr });
                }
                seen.push(addr);
                ips.push(addr);
            }
            hosts.push(ips);
        }
        Ok(hosts)
    }

    /// Faults to strike during the run (see [`Fault`](crate::Fault)); several calls add up.
    pub fn faults(mut self, schedule: FaultSchedule) -> Self {
        self.faults.faults.extend(schedule.faults);
        self
    }

    /// Builds the fabric, or says what is wrong: no host, an address that does not parse, is
    /// loopback or wildcard, or is given twice, a `CM_SIM_SEED` that is not a number, a
    /// [`SimConfig`] field out of range ([`SimConfig::check`]), a fault naming a host the fabric
    /// does not have.
    ///
    /// ```
    /// use cm_sim::{ConfigError, SimFabric};
    ///
    /// let err = SimFabric::builder().seed(1).host("127.0.0.1").try_build().unwrap_err();
    /// assert!(matches!(err, ConfigError::NotUnicast { host: 0, .. }));
    /// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").try_build()?;
    /// assert_eq!(fabric.seed(), 1);
    /// # Ok::<(), ConfigError>(())
    /// ```
    pub fn try_build(self) -> Result<SimFabric, ConfigError> {
        let hosts = self.host_addrs()?;
        self.config.check()?;
        for fa in &self.faults.faults {
            if let Some(&host) = fa.fault.hosts().iter().find(|&&h| usize::from(h) >= hosts.len()) {
                return Err(ConfigError::FaultHost {
                    fault: fa.fault.to_string(),
                    host,
                    hosts: hosts.len(),
                });
            }
        }
        let seed = self.resolve_seed()?;
        let fabric = SimFabric::new(seed, hosts, self.config);
        fabric.schedule_faults(self.faults);
        Ok(fabric)
    }

    /// Builds the fabric: [`try_build`](Self::try_build) for code whose configuration is fixed.
    ///
    /// # Panics
    /// Where `try_build` returns an error, with its message.
    pub fn build(self) -> SimFabric {
        self.try_build().unwrap_or_else(|e| panic!("{e}"))
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
            Ok(Seed {
                value: 9,
                source: SeedSource::Builder
            })
        );
    }

    #[test]
    fn a_seed_variable_that_is_not_a_number_is_an_error_not_a_panic() {
        let err = seed_from_env(Some("abc".into())).unwrap_err();
        assert_eq!(
            err.to_string(),
            "CM_SIM_SEED=\"abc\" is not a number (decimal or 0x hex)"
        );
        assert_eq!(
            seed_from_env(Some("0x10".into())),
            Ok(Seed {
                value: 16,
                source: SeedSource::Environment
            })
        );
        assert_eq!(seed_from_env(None).map(|s| s.source), Ok(SeedSource::Drawn));
    }

    #[test]
    #[should_panic(expected = "given twice")]
    fn build_panics_with_the_message_try_build_returns() {
        let _ = SimBuilder::new()
            .seed(1)
            .host("10.0.0.1")
            .host("10.0.0.1")
            .build();
    }

    fn refusal(b: SimBuilder) -> ConfigError {
        b.seed(1).try_build().expect_err("must be refused")
    }

    #[test]
    fn try_build_refuses_bad_addresses_instead_of_panicking() {
        for addr in ["127.0.0.1", "0.0.0.0", "::1", "::"] {
            let err = refusal(SimBuilder::new().host("10.0.0.1").host(addr));
            assert!(
                matches!(err, ConfigError::NotUnicast { host: 1, .. }),
                "{addr}: {err}"
            );
        }
        let err = refusal(SimBuilder::new().host("10.0.0.300"));
        assert_eq!(err.to_string(), "host 0: not an IP address: \"10.0.0.300\"");
        assert_eq!(refusal(SimBuilder::new()), ConfigError::NoHosts);
        assert_eq!(
            refusal(SimBuilder::new().host_with_addrs(Vec::<IpAddr>::new())),
            ConfigError::HostWithoutAddress { host: 0 }
        );
        assert_eq!(
            refusal(
                SimBuilder::new()
                    .host("10.0.0.1")
                    .host_with_addrs(["10.0.0.2", "10.0.0.1"])
            ),
            ConfigError::AddressTwice {
                addr: "10.0.0.1".parse().unwrap()
            }
        );
        assert!(SimBuilder::new().seed(1).host("fd00::1").try_build().is_ok());
    }

    #[test]
    fn try_build_checks_every_config_field_the_setters_would() {
        let with = |change: fn(&mut SimConfig)| {
            let mut cfg = SimConfig::default();
            change(&mut cfg);
            refusal(SimBuilder::new().host("10.0.0.1").config(cfg))
        };
        let field = |e: ConfigError| match e {
            ConfigError::BadConfig { field, .. } => field,
            other => panic!("not a config error: {other}"),
        };
        assert_eq!(field(with(|c| c.cm_retries = u32::MAX)), "cm_retries");
        assert_eq!(field(with(|c| c.cm_retries = 256)), "cm_retries");
        assert_eq!(field(with(|c| c.cm_retries = 16)), "cm_retries");
        assert_eq!(
            field(with(|c| c.ephemeral_ports = RangeInclusive::new(61000, 32768))),
            "ephemeral_ports"
        );
        assert_eq!(field(with(|c| c.ephemeral_ports = 0..=10)), "ephemeral_ports");
        assert_eq!(field(with(|c| c.max_backlog = 0)), "max_backlog");
        assert_eq!(
            field(with(
                |c| c.latency = Duration::from_micros(2)..=Duration::from_micros(1)
            )),
            "latency"
        );
        assert!(field(with(|c| c.max_qp_wr = 0)).contains("max_qp_wr"));
        assert!(field(with(|c| c.max_sge = 0)).contains("max_sge"));
        assert!(field(with(|c| c.max_mr_size = 0)).contains("max_mr_size"));
        assert!(field(with(|c| c.max_srq_wr = 0)).contains("max_srq_wr"));
        assert!(field(with(|c| c.max_srq_sge = 0)).contains("max_srq_sge"));
        let setter = refusal(SimBuilder::new().host("10.0.0.1").max_mr_size(0));
        assert!(field(setter).contains("max_mr_size"));
        let setter = refusal(SimBuilder::new().host("10.0.0.1").max_backlog(0));
        assert_eq!(field(setter), "max_backlog");
        for t in [
            "cm_response_timeout",
            "packet_lifetime",
            "ca_ack_delay",
            "mra_service_timeout",
        ] {
            let mut cfg = SimConfig::default();
            match t {
                "cm_response_timeout" => cfg.cm_response_timeout = 32,
                "packet_lifetime" => cfg.packet_lifetime = 32,
                "ca_ack_delay" => cfg.ca_ack_delay = 32,
                _ => cfg.mra_service_timeout = 32,
            }
            assert_eq!(field(cfg.check().unwrap_err()), t);
        }
        let most = SimConfig {
            cm_retries: 15,
            cm_response_timeout: 31,
            packet_lifetime: 31,
            ca_ack_delay: 31,
            mra_service_timeout: 31,
            ..SimConfig::default()
        };
        assert!(most.check().is_ok());
        let cfg = SimConfig {
            cm_retries: u32::MAX,
            ..most
        };
        // Unchecked values overflow nothing: 2^23 ms a term at most, saturating in total.
        assert_eq!(cfg.active_response_timeout(), Duration::from_millis(3 << 23));
        assert_eq!(cfg.req_timeout(), Duration::from_millis(3 << 23) * u32::MAX);
    }

    #[test]
    fn try_build_refuses_a_fault_on_a_missing_host() {
        let faults = FaultSchedule::new().with(Duration::ZERO, crate::Fault::Crash { host: 2 });
        let err = refusal(SimBuilder::new().host("10.0.0.1").faults(faults));
        assert!(
            matches!(
                err,
                ConfigError::FaultHost {
                    host: 2,
                    hosts: 1,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn typed_addresses_are_checked_like_text() {
        use std::net::{Ipv4Addr, Ipv6Addr};
        let err = refusal(SimBuilder::new().host([10, 0, 0, 1]).host(Ipv4Addr::LOCALHOST));
        assert!(matches!(err, ConfigError::NotUnicast { host: 1, .. }), "{err}");
        let err = refusal(SimBuilder::new().host(Ipv6Addr::UNSPECIFIED));
        assert!(matches!(err, ConfigError::NotUnicast { host: 0, .. }), "{err}");
        // The same address as text and as a value is the same address.
        assert_eq!(
            refusal(SimBuilder::new().host("10.0.0.1").host([10, 0, 0, 1])),
            ConfigError::AddressTwice {
                addr: IpAddr::from([10, 0, 0, 1])
            }
        );
        let ips: Vec<IpAddr> = vec![[10, 0, 0, 2].into(), Ipv4Addr::new(10, 0, 0, 3).into()];
        let fabric = SimBuilder::new()
            .seed(1)
            .host(String::from("10.0.0.1"))
            .host_with_addrs(&ips)
            .try_build();
        assert!(fabric.is_ok(), "{:?}", fabric.err());
    }

    #[test]
    fn a_fault_on_all_links_names_one_host_and_is_checked_against_the_fabric() {
        let all = |a| crate::Fault::Loss {
            a,
            b: crate::Fault::ALL_HOSTS,
            per_mille: 1000,
        };
        assert_eq!(all(1).hosts(), [1]);
        assert_eq!(all(1).to_string(), "loss 1<->all 1000/1000");
        let two = || SimBuilder::new().host("10.0.0.1").host("10.0.0.2");
        let err = refusal(two().faults(FaultSchedule::new().with(Duration::ZERO, all(2))));
        assert!(
            matches!(
                err,
                ConfigError::FaultHost {
                    host: 2,
                    hosts: 2,
                    ..
                }
            ),
            "{err}"
        );
        assert!(two()
            .seed(1)
            .faults(FaultSchedule::new().with(Duration::ZERO, all(1)))
            .try_build()
            .is_ok());
    }
}
