//! Faults as plain data, and swarm testing: a seed that expands into a fault configuration.
//!
//! A [`FaultSchedule`] is a list of [`Fault`]s with the virtual time each strikes at. It is
//! ordinary data: proptest can generate it and shrink a failing one to the fewest faults that
//! still fail, and printing it (with the seed) is all it takes to reproduce a run. Give it to
//! [`SimBuilder::faults`](crate::SimBuilder::faults), or strike one fault at once with
//! [`SimFabric::inject`](crate::SimFabric::inject).
//!
//! What each fault does is in the crate docs (a table rustdoc shows).

use std::fmt;
use std::time::Duration;

use rand_chacha::rand_core::{RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;

use crate::trace::MsgKind;

/// One fault. Hosts are numbered in the order the builder added them.
///
/// A link fault ([`Partition`](Fault::Partition), [`Heal`](Fault::Heal), [`Loss`](Fault::Loss),
/// [`Delay`](Fault::Delay)) names all of a host's links at once with [`Fault::ALL_HOSTS`] as its
/// `b`: every link between `a` and another host, not `a`'s own loopback.
///
/// ```
/// use cm_sim::Fault;
///
/// let cut_off = Fault::Partition { a: 2, b: Fault::ALL_HOSTS };
/// assert_eq!(cut_off.to_string(), "partition 2<->all");
/// assert_eq!(cut_off.hosts(), [2]);
/// ```
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Fault {
    /// Every CM message between hosts `a` and `b` is lost, both ways, until [`Fault::Heal`].
    Partition {
        /// One host.
        a: u16,
        /// The other.
        b: u16,
    },
    /// Ends a partition between `a` and `b`.
    Heal {
        /// One host.
        a: u16,
        /// The other.
        b: u16,
    },
    /// Each CM message between `a` and `b` is lost with probability `per_mille` / 1000
    /// (0 ends the loss).
    Loss {
        /// One host.
        a: u16,
        /// The other.
        b: u16,
        /// Loss probability in thousandths.
        per_mille: u16,
    },
    /// CM messages between `a` and `b` take `min..=max` longer (both zero ends the delay).
    Delay {
        /// One host.
        a: u16,
        /// The other.
        b: u16,
        /// Least extra latency.
        min: Duration,
        /// Most extra latency.
        max: Duration,
    },
    /// The host crashes.
    Crash {
        /// The host.
        host: u16,
    },
    /// A crashed host comes back with nothing.
    Restart {
        /// The host.
        host: u16,
    },
    /// The host's RDMA device is unregistered.
    RemoveDevice {
        /// The host.
        host: u16,
    },
    /// The host's RDMA device comes back (ids that saw `DEVICE_REMOVAL` stay dead).
    RestoreDevice {
        /// The host.
        host: u16,
    },
    /// The hardware address of the host's bound net device changed.
    AddrChange {
        /// The host.
        host: u16,
    },
    /// The next `count` address resolutions started on the host fail with `status`.
    FailAddrResolution {
        /// The host.
        host: u16,
        /// The `ADDR_ERROR` status (a negative errno, e.g. `-ENETUNREACH`).
        status: i32,
        /// How many resolutions fail.
        count: u32,
    },
    /// The next `count` route resolutions started on the host fail with `status`.
    FailRouteResolution {
        /// The host.
        host: u16,
        /// The `ROUTE_ERROR` status (a negative errno, e.g. `-ETIMEDOUT`).
        status: i32,
        /// How many resolutions fail.
        count: u32,
    },
    /// The host's listeners hold at most `backlog` unretrieved requests (`u32::MAX` ends it).
    Backlog {
        /// The host.
        host: u16,
        /// The cap.
        backlog: u32,
    },
    /// QPs on the host give up a send after `retries` receiver-not-ready retries, `retries`
    /// RNR timers after it found no receive, whatever their connections agreed (7 ends the
    /// fault: each QP's own count applies again, the one its peer's REQ or REP carried).
    RnrRetries {
        /// The host.
        host: u16,
        /// Retries before `RNR_RETRY_EXC_ERR`.
        retries: u8,
    },
    /// Of the IB CM messages of kind `msg` from host `from` to host `to` ([`Fault::ALL_HOSTS`]:
    /// any other), counted from when the fault strikes, the first `skip` go through and the next
    /// `count` are lost (`u32::MAX`: every one after them). Every message on the wire counts:
    /// first sends, retries and answers to duplicates alike, as a filter on a real fabric
    /// counts them (the lab's fault-differential suite drops the same ones on rxe).
    ///
    /// ```
    /// use cm_sim::{Fault, MsgKind};
    ///
    /// let second_rep = Fault::Drop { from: 1, to: 0, msg: MsgKind::Rep, skip: 1, count: 1 };
    /// assert_eq!(second_rep.to_string(), "drop REP 1->0: lose 1 after 1");
    /// ```
    Drop {
        /// The sending host.
        from: u16,
        /// The receiving host.
        to: u16,
        /// The kind of message.
        msg: MsgKind,
        /// Messages let through first.
        skip: u32,
        /// Messages lost after them.
        count: u32,
    },
}

impl Fault {
    /// As the `b` of a link fault: every other host, so that the fault strikes all of `a`'s
    /// links at once (a host cut off from the fabric, a lossy network card).
    pub const ALL_HOSTS: u16 = u16::MAX;

    /// A short name for coverage reports and traces.
    pub const fn kind(&self) -> &'static str {
        match self {
            Fault::Partition { .. } => "partition",
            Fault::Heal { .. } => "heal",
            Fault::Loss { .. } => "loss",
            Fault::Delay { .. } => "delay",
            Fault::Crash { .. } => "crash",
            Fault::Restart { .. } => "restart",
            Fault::RemoveDevice { .. } => "remove-device",
            Fault::RestoreDevice { .. } => "restore-device",
            Fault::AddrChange { .. } => "addr-change",
            Fault::FailAddrResolution { .. } => "fail-addr-resolution",
            Fault::FailRouteResolution { .. } => "fail-route-resolution",
            Fault::Backlog { .. } => "backlog",
            Fault::RnrRetries { .. } => "rnr-retries",
            Fault::Drop { .. } => "drop",
        }
    }

    /// The hosts the fault names (to check them against the fabric).
    pub fn hosts(&self) -> Vec<u16> {
        match *self {
            Fault::Partition { a, b }
            | Fault::Heal { a, b }
            | Fault::Loss { a, b, .. }
            | Fault::Delay { a, b, .. }
            | Fault::Drop { from: a, to: b, .. } => {
                if b == Self::ALL_HOSTS {
                    vec![a]
                } else {
                    vec![a, b]
                }
            }
            Fault::Crash { host }
            | Fault::Restart { host }
            | Fault::RemoveDevice { host }
            | Fault::RestoreDevice { host }
            | Fault::AddrChange { host }
            | Fault::FailAddrResolution { host, .. }
            | Fault::FailRouteResolution { host, .. }
            | Fault::Backlog { host, .. }
            | Fault::RnrRetries { host, .. } => vec![host],
        }
    }
}

/// The `b` of a link fault as `Display` shows it.
struct Peer(u16);

impl fmt::Display for Peer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.0 == Fault::ALL_HOSTS {
            f.write_str("all")
        } else {
            write!(f, "{}", self.0)
        }
    }
}

impl fmt::Display for Fault {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match *self {
            Fault::Partition { a, b } => write!(f, "partition {a}<->{}", Peer(b)),
            Fault::Heal { a, b } => write!(f, "heal {a}<->{}", Peer(b)),
            Fault::Loss { a, b, per_mille } => write!(f, "loss {a}<->{} {per_mille}/1000", Peer(b)),
            Fault::Delay { a, b, min, max } => write!(f, "delay {a}<->{} +{min:?}..={max:?}", Peer(b)),
            Fault::Crash { host } => write!(f, "crash host {host}"),
            Fault::Restart { host } => write!(f, "restart host {host}"),
            Fault::RemoveDevice { host } => write!(f, "remove device of host {host}"),
            Fault::RestoreDevice { host } => write!(f, "restore device of host {host}"),
            Fault::AddrChange { host } => write!(f, "address change on host {host}"),
            Fault::FailAddrResolution { host, status, count } => {
                write!(
                    f,
                    "fail {count} address resolution(s) on host {host} with {status}"
                )
            }
            Fault::FailRouteResolution { host, status, count } => {
                write!(f, "fail {count} route resolution(s) on host {host} with {status}")
            }
            Fault::Backlog { host, backlog } => write!(f, "backlog of host {host} capped at {backlog}"),
            Fault::RnrRetries { host, retries } => write!(f, "RNR retries on host {host}: {retries}"),
            Fault::Drop {
                from,
                to,
                msg,
                skip,
                count,
            } => {
                write!(f, "drop {} {from}->{}: lose ", msg.name(), Peer(to))?;
                if count == u32::MAX {
                    f.write_str("all")?;
                } else {
                    write!(f, "{count}")?;
                }
                write!(f, " after {skip}")
            }
        }
    }
}

/// A fault and when it strikes (virtual time since the fabric was built).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct FaultAt {
    /// When.
    pub at: Duration,
    /// What.
    pub fault: Fault,
}

/// Faults and their times: plain data to generate, shrink, print and replay.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash)]
#[must_use = "a schedule does nothing until it is given to SimBuilder::faults"]
pub struct FaultSchedule {
    /// The faults, in any order (equal times strike in list order).
    pub faults: Vec<FaultAt>,
}

impl FaultSchedule {
    /// No faults.
    pub fn new() -> Self {
        Self::default()
    }

    /// The same schedule with `fault` striking at `at`.
    pub fn with(mut self, at: Duration, fault: Fault) -> Self {
        self.faults.push(FaultAt { at, fault });
        self
    }

    /// Whether there is no fault.
    pub fn is_empty(&self) -> bool {
        self.faults.is_empty()
    }
}

impl fmt::Display for FaultSchedule {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.faults.is_empty() {
            return f.write_str("no faults");
        }
        for (i, fa) in self.faults.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "at {:?}: {}", fa.at, fa.fault)?;
        }
        Ok(())
    }
}

/// A fault configuration expanded from a seed alone (swarm testing: each seed switches a
/// different set of fault kinds on, with its own rates, so runs explore different corners).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Swarm {
    /// The seed it came from.
    pub seed: u64,
    /// Which fault kinds are on, with their rates, one line each.
    pub description: Vec<String>,
    /// The faults it strikes.
    pub schedule: FaultSchedule,
}

impl fmt::Display for Swarm {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "swarm seed {}: {} fault(s)",
            self.seed,
            self.schedule.faults.len()
        )?;
        for line in &self.description {
            writeln!(f, "  {line}")?;
        }
        Ok(())
    }
}

impl Swarm {
    /// Expands `seed` into faults among `hosts` hosts over `horizon` of virtual time.
    ///
    /// The expansion uses its own generator (ChaCha8, seeded from `seed` with a fixed tweak),
    /// so the same seed always gives the same configuration, independent of the fabric's draws.
    pub fn from_seed(seed: u64, hosts: u16, horizon: Duration) -> Swarm {
        assert!(hosts >= 1, "a swarm needs a host");
        let mut rng = ChaCha8Rng::seed_from_u64(seed ^ 0x5357_4152_4d00_0001);
        let mut draw = |n: u64| rng.next_u64() % n.max(1);
        let mut description = Vec::new();
        let mut schedule = FaultSchedule::new();
        let horizon_ns = u64::try_from(horizon.as_nanos()).unwrap_or(u64::MAX).max(1);
        let when = |r: u64| Duration::from_nanos(r % horizon_ns);
        let pair = |draw: &mut dyn FnMut(u64) -> u64| {
            let a = draw(u64::from(hosts)) as u16;
            let b = if hosts > 1 {
                ((u64::from(a) + 1 + draw(u64::from(hosts) - 1)) % u64::from(hosts)) as u16
            } else {
                a
            };
            (a, b)
        };
        if draw(2) == 0 {
            let per_mille = 10 + draw(290) as u16;
            let (a, b) = pair(&mut draw);
            description.push(format!("loss {a}<->{b}: {per_mille}/1000 from the start"));
            schedule = schedule.with(Duration::ZERO, Fault::Loss { a, b, per_mille });
        }
        if draw(2) == 0 {
            let (a, b) = pair(&mut draw);
            let max = Duration::from_micros(1 + draw(5_000));
            description.push(format!("delay {a}<->{b}: up to {max:?} extra"));
            schedule = schedule.with(
                Duration::ZERO,
                Fault::Delay {
                    a,
                    b,
                    min: Duration::ZERO,
                    max,
                },
            );
        }
        if draw(3) == 0 {
            let (a, b) = pair(&mut draw);
            let start = when(draw(u64::MAX));
            let length = Duration::from_millis(1 + draw(20_000));
            description.push(format!("partition {a}<->{b} at {start:?} for {length:?}"));
            schedule = schedule
                .with(start, Fault::Partition { a, b })
                .with(start + length, Fault::Heal { a, b });
        }
        if draw(4) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let start = when(draw(u64::MAX));
            description.push(format!("crash host {host} at {start:?}, restart 1 s later"));
            schedule = schedule
                .with(start, Fault::Crash { host })
                .with(start + Duration::from_secs(1), Fault::Restart { host });
        }
        if draw(5) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let start = when(draw(u64::MAX));
            description.push(format!("remove the device of host {host} at {start:?}"));
            schedule = schedule.with(start, Fault::RemoveDevice { host });
        }
        if draw(3) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let start = when(draw(u64::MAX));
            description.push(format!("address change on host {host} at {start:?}"));
            schedule = schedule.with(start, Fault::AddrChange { host });
        }
        if draw(3) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let count = 1 + draw(4) as u32;
            let status = [-110, -101, -113][draw(3) as usize];
            description.push(format!(
                "{count} address resolution(s) on host {host} fail with {status}"
            ));
            schedule = schedule.with(Duration::ZERO, Fault::FailAddrResolution { host, status, count });
        }
        if draw(3) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let count = 1 + draw(4) as u32;
            description.push(format!(
                "{count} route resolution(s) on host {host} fail with -110"
            ));
            schedule = schedule.with(
                Duration::ZERO,
                Fault::FailRouteResolution {
                    host,
                    status: -110,
                    count,
                },
            );
        }
        if draw(3) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let backlog = draw(3) as u32;
            description.push(format!(
                "listeners of host {host} hold at most {backlog} request(s)"
            ));
            schedule = schedule.with(Duration::ZERO, Fault::Backlog { host, backlog });
        }
        if draw(3) == 0 {
            let host = draw(u64::from(hosts)) as u16;
            let retries = draw(7) as u8;
            description.push(format!("QPs of host {host} give up after {retries} RNR retries"));
            schedule = schedule.with(Duration::ZERO, Fault::RnrRetries { host, retries });
        }
        // Drawn last, so that the draws before give the configurations they always gave.
        if draw(4) == 0 {
            let (from, to) = pair(&mut draw);
            let msg = MsgKind::ALL[draw(MsgKind::ALL.len() as u64) as usize];
            let skip = draw(3) as u32;
            let count = [1, 2, u32::MAX][draw(3) as usize];
            let fault = Fault::Drop {
                from,
                to,
                msg,
                skip,
                count,
            };
            description.push(fault.to_string());
            schedule = schedule.with(Duration::ZERO, fault);
        }
        if description.is_empty() {
            description.push("no faults".into());
        }
        Swarm {
            seed,
            description,
            schedule,
        }
    }
}

/// How often each fault path fired in a run: what coverage tests check (each path at least
/// once across their runs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct FaultStats {
    /// CM messages lost (partition, loss, a drop rule, host or device down).
    pub messages_lost: u64,
    /// REQs, REPs and DREQs the IB CM sent again after a response timeout.
    pub messages_resent: u64,
    /// Messages a [`Fault::Drop`] rule lost.
    pub messages_dropped: u64,
    /// REQs that reached the child their request had made (a retry whose first copy arrived):
    /// answered with an MRA before the accept, dropped after it.
    pub duplicates: u64,
    /// MRAs sent, each in answer to a duplicate REQ or REP.
    pub mras: u64,
    /// DREPs a host's IB CM sent for a DREQ whose id it no longer has.
    pub dreps_without_id: u64,
    /// Messages slowed by a [`Fault::Delay`].
    pub messages_delayed: u64,
    /// Requests that ended in `UNREACHABLE` (`-ETIMEDOUT`) on the active side.
    pub req_timeouts: u64,
    /// Replies never answered: `UNREACHABLE` (`-ETIMEDOUT`) on the passive side.
    pub rep_timeouts: u64,
    /// Disconnects whose DREP never came: `DISCONNECTED` (`-ETIMEDOUT`).
    pub dreq_timeouts: u64,
    /// Partitions struck.
    pub partitions: u64,
    /// Hosts crashed.
    pub crashes: u64,
    /// Hosts restarted.
    pub restarts: u64,
    /// Devices removed.
    pub device_removals: u64,
    /// `ADDR_CHANGE` events delivered.
    pub addr_changes: u64,
    /// Address resolutions failed on purpose.
    pub addr_errors: u64,
    /// Route resolutions failed on purpose.
    pub route_errors: u64,
    /// Requests dropped by a full backlog.
    pub backlog_drops: u64,
    /// Sends that gave up on a receiver that was not ready (`RNR_RETRY_EXC_ERR`).
    pub rnr_retries_exceeded: u64,
    /// Sends to a crashed, partitioned or vanished peer that gave up after the transport
    /// retries (`RETRY_EXC_ERR`).
    pub transport_retries_exceeded: u64,
    /// Messages longer than the receive buffer (`LOC_LEN_ERR`).
    pub length_errors: u64,
    /// One-sided requests (and RDMA WRITEs with immediate) a responder refused for their
    /// remote key, range or the region's access (`REM_ACCESS_ERR` at the requester).
    pub remote_access_errors: u64,
    /// Times a QP sent its unanswered one-sided requests again after a local ACK timeout (a
    /// request or its answer lost, the responder gone or not ready).
    pub onesided_retries: u64,
    /// One-sided requests that gave up after the transport retries (`RETRY_EXC_ERR`).
    pub onesided_retries_exceeded: u64,
}

impl FaultStats {
    /// Every path of the connection-management model with its count (the one-sided paths are
    /// [`rdma_paths`](Self::rdma_paths): only runs that post work over regions reach them).
    pub fn paths(&self) -> [(&'static str, u64); 21] {
        [
            ("messages_lost", self.messages_lost),
            ("messages_resent", self.messages_resent),
            ("messages_dropped", self.messages_dropped),
            ("duplicates", self.duplicates),
            ("mras", self.mras),
            ("dreps_without_id", self.dreps_without_id),
            ("messages_delayed", self.messages_delayed),
            ("req_timeouts", self.req_timeouts),
            ("rep_timeouts", self.rep_timeouts),
            ("dreq_timeouts", self.dreq_timeouts),
            ("partitions", self.partitions),
            ("crashes", self.crashes),
            ("restarts", self.restarts),
            ("device_removals", self.device_removals),
            ("addr_changes", self.addr_changes),
            ("addr_errors", self.addr_errors),
            ("route_errors", self.route_errors),
            ("backlog_drops", self.backlog_drops),
            ("rnr_retries_exceeded", self.rnr_retries_exceeded),
            ("transport_retries_exceeded", self.transport_retries_exceeded),
            ("length_errors", self.length_errors),
        ]
    }

    /// The one-sided paths with their counts.
    pub fn rdma_paths(&self) -> [(&'static str, u64); 3] {
        [
            ("remote_access_errors", self.remote_access_errors),
            ("onesided_retries", self.onesided_retries),
            ("onesided_retries_exceeded", self.onesided_retries_exceeded),
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_alone_gives_the_same_swarm() {
        let horizon = Duration::from_secs(30);
        assert_eq!(Swarm::from_seed(7, 2, horizon), Swarm::from_seed(7, 2, horizon));
        let kinds: std::collections::BTreeSet<&str> = (0..64)
            .flat_map(|s| Swarm::from_seed(s, 2, horizon).schedule.faults)
            .map(|fa| fa.fault.kind())
            .collect();
        for kind in [
            "loss",
            "delay",
            "partition",
            "heal",
            "crash",
            "restart",
            "remove-device",
            "addr-change",
            "drop",
        ] {
            assert!(kinds.contains(kind), "no seed of 64 turned {kind} on");
        }
        let configs: std::collections::BTreeSet<Vec<String>> = (0..64)
            .map(|s| Swarm::from_seed(s, 2, horizon).description)
            .collect();
        assert!(configs.len() > 48, "seeds should give different configurations");
    }

    #[test]
    fn faults_name_their_hosts_and_print() {
        let f = Fault::Partition { a: 0, b: 1 };
        assert_eq!(f.hosts(), vec![0, 1]);
        assert_eq!(f.to_string(), "partition 0<->1");
        let every_drep = Fault::Drop {
            from: 2,
            to: Fault::ALL_HOSTS,
            msg: MsgKind::Drep,
            skip: 0,
            count: u32::MAX,
        };
        assert_eq!(every_drep.to_string(), "drop DREP 2->all: lose all after 0");
        assert_eq!((every_drep.hosts(), every_drep.kind()), (vec![2], "drop"));
        let s = FaultSchedule::new().with(Duration::from_millis(5), Fault::Crash { host: 1 });
        assert_eq!(s.to_string(), "at 5ms: crash host 1");
        assert!(Swarm::from_seed(1, 1, Duration::from_secs(1))
            .to_string()
            .starts_with("swarm seed 1"));
    }
}
