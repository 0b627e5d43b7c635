//! What a campaign saw: calls, events by type, errors by kind, completions by status and by
//! opcode, asynchronous events.

use std::fmt;

use cm_core::{CmError, CmEventType, WcOpcode, WcStatus};

/// The error kinds, in the order [`error_index`] numbers them.
const ERROR_KINDS: [&str; 22] = [
    "UnknownHandle",
    "WrongState",
    "QpAttached",
    "UnackedEvents",
    "ChannelBusy",
    "QpExists",
    "NoQp",
    "NoDevice",
    "WrongQpState",
    "PrivateDataTooLong",
    "AddrInUse",
    "AddrNotAvailable",
    "InvalidArgument",
    "QueueFull",
    "EventNotOutstanding",
    "NoRdmaDevice",
    "Os",
    "ExternalQp",
    "BackendQp",
    "SrqBusy",
    "HostCrashed",
    "other",
];

fn error_index(e: &CmError) -> usize {
    match e {
        CmError::UnknownHandle { .. } => 0,
        CmError::WrongState { .. } => 1,
        CmError::QpAttached => 2,
        CmError::UnackedEvents { .. } => 3,
        CmError::ChannelBusy { .. } => 4,
        CmError::QpExists => 5,
        CmError::NoQp { .. } => 6,
        CmError::NoDevice { .. } => 7,
        CmError::WrongQpState { .. } => 8,
        CmError::PrivateDataTooLong { .. } => 9,
        CmError::AddrInUse { .. } => 10,
        CmError::AddrNotAvailable { .. } => 11,
        CmError::InvalidArgument { .. } => 12,
        CmError::QueueFull { .. } => 13,
        CmError::EventNotOutstanding => 14,
        CmError::NoRdmaDevice => 15,
        CmError::Os { .. } => 16,
        CmError::ExternalQp { .. } => 17,
        CmError::BackendQp { .. } => 18,
        CmError::SrqBusy { .. } => 19,
        CmError::HostCrashed { .. } => 20,
        _ => 21,
    }
}

/// The variant name of an error.
pub fn error_kind(e: &CmError) -> &'static str {
    ERROR_KINDS[error_index(e)]
}

/// Counts over one or many sequences.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Stats {
    /// Sequences run (each twice: the determinism check's second run is not counted).
    pub sequences: u64,
    /// Calls made.
    pub calls: u64,
    /// Sequences whose generated configuration `SimBuilder::try_build` refused (with its reason).
    pub configs_refused: u64,
    /// Events retrieved, by type (indexed by librdmacm's number).
    pub events: [u64; CmEventType::ALL.len()],
    /// Errors answered, by kind (see [`error_kind`]).
    pub errors: [u64; ERROR_KINDS.len()],
    /// Work completions polled, by `ibv_wc_status`.
    pub completions: [u64; WcStatus::ALL.len()],
    /// Work completions polled, by opcode (in [`WcOpcode::ALL`]'s order), and how many of
    /// those succeeded.
    pub opcodes: [(u64, u64); WcOpcode::ALL.len()],
    /// Asynchronous events retrieved.
    pub async_events: u64,
}

impl Stats {
    pub(crate) fn event(&mut self, ty: CmEventType) {
        // Numbers past the known ones (a newer librdmacm's) are not counted: the simulator never
        // makes them up.
        if let Some(n) = self.events.get_mut(ty.raw() as usize) {
            *n += 1;
        }
    }

    pub(crate) fn error(&mut self, e: &CmError) {
        self.errors[error_index(e)] += 1;
    }

    pub(crate) fn completion(&mut self, s: WcStatus, op: WcOpcode) {
        self.completions[s.raw() as usize] += 1;
        if let Some(n) = WcOpcode::ALL.iter().position(|&o| o == op) {
            self.opcodes[n].0 += 1;
            self.opcodes[n].1 += u64::from(s == WcStatus::Success);
        }
    }

    /// Adds `other` to these counts.
    pub fn merge(&mut self, other: &Stats) {
        self.sequences += other.sequences;
        self.calls += other.calls;
        self.configs_refused += other.configs_refused;
        for (a, b) in self.events.iter_mut().zip(other.events) {
            *a += b;
        }
        for (a, b) in self.errors.iter_mut().zip(other.errors) {
            *a += b;
        }
        for (a, b) in self.completions.iter_mut().zip(other.completions) {
            *a += b;
        }
        for (a, b) in self.opcodes.iter_mut().zip(other.opcodes) {
            a.0 += b.0;
            a.1 += b.1;
        }
        self.async_events += other.async_events;
    }

    /// Event types with their counts (every type, zero counts included).
    pub fn event_counts(&self) -> impl Iterator<Item = (CmEventType, u64)> + '_ {
        CmEventType::ALL
            .iter()
            .map(|&t| (t, self.events[t.raw() as usize]))
    }

    /// Error kinds with their counts (every kind, zero counts included).
    pub fn error_counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        ERROR_KINDS.iter().copied().zip(self.errors.iter().copied())
    }

    /// Completion statuses seen, with their counts (zero counts left out).
    pub fn completion_counts(&self) -> impl Iterator<Item = (WcStatus, u64)> + '_ {
        WcStatus::ALL
            .iter()
            .map(|&s| (s, self.completions[s.raw() as usize]))
            .filter(|&(_, n)| n > 0)
    }

    /// Completion opcodes seen, with how many completed and how many of those succeeded
    /// (zero counts left out).
    pub fn opcode_counts(&self) -> impl Iterator<Item = (WcOpcode, u64, u64)> + '_ {
        WcOpcode::ALL
            .iter()
            .zip(self.opcodes)
            .map(|(&o, (n, ok))| (o, n, ok))
            .filter(|&(_, n, _)| n > 0)
    }

    /// The counts as one JSON object's members (no braces), for the JSON-lines summary.
    pub fn json_members(&self) -> String {
        let obj = |pairs: Vec<(String, u64)>| {
            let body: Vec<String> = pairs.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", body.join(","))
        };
        format!(
            "\"sequences\":{},\"calls\":{},\"configs_refused\":{},\"events\":{},\"errors\":{},\"completions\":{},\"opcodes\":{},\"async_events\":{}",
            self.sequences,
            self.calls,
            self.configs_refused,
            obj(self
                .event_counts()
                .map(|(t, n)| (t.name().to_string(), n))
                .collect()),
            obj(self.error_counts().map(|(k, n)| (k.to_string(), n)).collect()),
            obj(self
                .completion_counts()
                .map(|(s, n)| (format!("{s:?}"), n))
                .collect()),
            obj(self
                .opcode_counts()
                .map(|(o, n, _)| (o.name().to_string(), n))
                .collect()),
            self.async_events,
        )
    }
}

impl fmt::Display for Stats {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        writeln!(
            f,
            "sequences: {}  calls: {}  configurations refused by try_build: {}",
            self.sequences, self.calls, self.configs_refused
        )?;
        writeln!(f, "events:")?;
        for (t, n) in self.event_counts() {
            writeln!(f, "  {:<34} {n}", t.name())?;
        }
        writeln!(f, "errors:")?;
        for (k, n) in self.error_counts() {
            writeln!(f, "  {k:<34} {n}")?;
        }
        writeln!(f, "completions:")?;
        for (s, n) in self.completion_counts() {
            writeln!(f, "  {:<34} {n}", format!("{s:?}"))?;
        }
        writeln!(f, "completions by opcode (succeeded):")?;
        for (o, n, ok) in self.opcode_counts() {
            writeln!(f, "  {:<34} {n} ({ok})", o.name())?;
        }
        writeln!(f, "asynchronous events: {}", self.async_events)?;
        Ok(())
    }
}
