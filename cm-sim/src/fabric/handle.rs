//! The public `SimFabric` handle.

use super::*;

/// A simulated fabric: hosts with addresses, joined by a network with seeded latencies,
/// running in virtual time. Cloning gives another handle to the same fabric.
///
/// Get a [`SimHost`] per host with [`host`](SimFabric::host); each implements
/// [`CmBackend`](cm_core::CmBackend) for the ids and channels of that host. Virtual time moves
/// only when a call waits ([`get_cm_event`](cm_core::CmBackend::get_cm_event) and
/// [`poll_cq`](cm_core::CmBackend::poll_cq) with a timeout) or when the fabric is driven
/// ([`advance`](SimFabric::advance), [`run_until_idle`](SimFabric::run_until_idle)). A run is
/// a pure function of the seed and the calls made.
#[derive(Clone)]
pub struct SimFabric {
    inner: Rc<RefCell<Fabric>>,
}

impl fmt::Debug for SimFabric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let fab = self.inner.borrow();
        f.debug_struct("SimFabric")
            .field("seed", &fab.seed.value)
            .field("now", &fab.now)
            .field("hosts", &fab.hosts.iter().map(|h| &h.addrs).collect::<Vec<_>>())
            .finish()
    }
}

impl SimFabric {
    /// A builder.
    pub fn builder() -> SimBuilder {
        SimBuilder::new()
    }

    pub(crate) fn new(seed: Seed, hosts: Vec<Vec<IpAddr>>, cfg: SimConfig) -> Self {
        SimFabric {
            inner: Rc::new(RefCell::new(Fabric::new(seed, hosts, cfg))),
        }
    }

    pub(crate) fn inner(&self) -> &Rc<RefCell<Fabric>> {
        &self.inner
    }

    /// The backend for host number `index` (in the order the builder added them).
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host(&self, index: usize) -> SimHost {
        let hosts = self.inner.borrow().hosts.len();
        assert!(index < hosts, "no host {index}: the fabric has {hosts}");
        SimHost::new(self.clone(), index as u16)
    }

    /// How many hosts the fabric has (numbered from 0).
    pub fn host_count(&self) -> usize {
        self.inner.borrow().hosts.len()
    }

    /// The backend for the host that owns `addr`.
    pub fn host_by_addr(&self, addr: IpAddr) -> Option<SimHost> {
        let index = self.inner.borrow().host_of_ip(addr)?;
        Some(SimHost::new(self.clone(), index))
    }

    /// The addresses of host number `index`.
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_addrs(&self, index: usize) -> Vec<IpAddr> {
        self.inner.borrow().host_at(index).addrs.clone()
    }

    /// The seed.
    pub fn seed(&self) -> u64 {
        self.inner.borrow().seed.value
    }

    /// The seed and where it came from.
    pub fn seed_info(&self) -> Seed {
        self.inner.borrow().seed
    }

    /// `reproduce with CM_SIM_SEED=<seed>`: what to print when a run fails.
    pub fn repro_line(&self) -> String {
        format!("reproduce with {SEED_ENV}={}", self.seed())
    }

    /// The configuration.
    pub fn config(&self) -> SimConfig {
        self.inner.borrow().cfg.clone()
    }

    /// Current virtual time.
    #[inline]
    pub fn now(&self) -> SimTime {
        self.inner.borrow().now
    }

    /// Runs everything due within `duration` of virtual time and moves the clock on by it.
    pub fn advance(&self, duration: Duration) {
        let mut fab = self.inner.borrow_mut();
        let deadline = fab.deadline(duration);
        fab.run_to(deadline);
    }

    /// Runs until nothing is scheduled (pending timers included: timewaits, DREQ timeouts);
    /// returns the time reached.
    pub fn run_until_idle(&self) -> SimTime {
        let mut fab = self.inner.borrow_mut();
        fab.run_to(SimTime::NEVER);
        fab.now
    }

    /// Resources alive on the whole fabric.
    pub fn live_resources(&self) -> LiveResources {
        self.inner.borrow().live_resources(None)
    }

    /// The trace's stable hash.
    pub fn trace_hash(&self) -> u64 {
        self.inner.borrow().trace.hash()
    }

    /// How many records the trace has (kept or not).
    pub fn trace_len(&self) -> u64 {
        self.inner.borrow().trace.count()
    }

    /// The kept trace records (empty with [`TraceMode::HashOnly`](crate::TraceMode::HashOnly)).
    pub fn trace_records(&self) -> Vec<TraceRecord> {
        self.inner.borrow().trace.records().to_vec()
    }

    /// The kept trace as text, one line per record.
    pub fn trace_lines(&self) -> Vec<String> {
        let fab = self.inner.borrow();
        let hosts: Vec<IpAddr> = fab.hosts.iter().map(|h| h.addrs[0]).collect();
        fab.trace
            .records()
            .iter()
            .map(|r| Trace::line(r, &hosts).to_string())
            .collect()
    }

    /// Schedules the faults of `schedule` at their times.
    ///
    /// # Panics
    /// If a fault names a host the fabric does not have.
    pub(crate) fn schedule_faults(&self, schedule: FaultSchedule) {
        let mut fab = self.inner.borrow_mut();
        for fa in schedule.faults {
            fab.check_fault(&fa.fault);
            let n = u32::try_from(fab.faults.len()).expect("fault count");
            fab.faults.push(fa.fault);
            let at = SimTime::ZERO + fa.at;
            fab.schedule(at, Action::Fault(n));
        }
    }

    /// Strikes `fault` now (see [`Fault`] for what each does).
    ///
    /// # Panics
    /// If the fault names a host the fabric does not have.
    pub fn inject(&self, fault: Fault) {
        let mut fab = self.inner.borrow_mut();
        fab.check_fault(&fault);
        fab.faults.push(fault.clone());
        fab.strike(&fault);
    }

    /// How often each fault path fired so far.
    pub fn fault_stats(&self) -> FaultStats {
        self.inner.borrow().stats
    }

    /// Hosts crashed and hosts restarted so far: the `crashes` and `restarts` of
    /// [`fault_stats`](SimFabric::fault_stats) without a copy of the rest, for an executor
    /// that asks after every step whether it must stop or start a host's tasks.
    ///
    /// ```
    /// use cm_sim::{Fault, SimFabric};
    /// let fabric = SimFabric::builder().seed(1).host("10.0.0.1").build();
    /// assert_eq!(fabric.crashes_and_restarts(), (0, 0));
    /// fabric.inject(Fault::Crash { host: 0 });
    /// assert_eq!(fabric.crashes_and_restarts(), (1, 0));
    /// ```
    #[inline]
    pub fn crashes_and_restarts(&self) -> (u64, u64) {
        let fab = self.inner.borrow();
        (fab.stats.crashes, fab.stats.restarts)
    }

    /// Whether host number `index` is up (not crashed).
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_is_up(&self, index: usize) -> bool {
        self.inner.borrow().host_at(index).up
    }

    /// How many times host number `index` has crashed: an application on it must forget every
    /// handle of an earlier incarnation.
    ///
    /// # Panics
    /// If there is no such host.
    pub fn host_incarnation(&self, index: usize) -> u32 {
        self.inner.borrow().host_at(index).incarnation
    }

    /// Writes the kept trace, one line per record, to `<dir>/<label>.trace`, where `dir` is
    /// `CM_SIM_TRACE_DIR` or else `cm-sim-traces` in the system's temporary directory; returns
    /// the path. For failing runs: print the path with the seed.
    pub fn write_trace_file(&self, label: &str) -> std::io::Result<std::path::PathBuf> {
        let dir = std::env::var_os("CM_SIM_TRACE_DIR")
            .map(std::path::PathBuf::from)
            .unwrap_or_else(|| std::env::temp_dir().join("cm-sim-traces"));
        std::fs::create_dir_all(&dir)?;
        let path = dir.join(format!("{label}.trace"));
        let mut text = self.trace_lines().join("\n");
        text.push('\n');
        std::fs::write(&path, text)?;
        Ok(path)
    }

    /// The kept trace as a Mermaid sequence diagram (see [`TraceMode`](crate::TraceMode)): a
    /// participant per host, an arrow per CM message, a note per event.
    pub fn trace_mermaid(&self) -> String {
        let fab = self.inner.borrow();
        let hosts: Vec<IpAddr> = fab.hosts.iter().map(|h| h.addrs[0]).collect();
        crate::mermaid::render(fab.trace.records(), &hosts)
    }
}
