//! The conformance suite on the simulator.
//!
//! Every test gets a fresh two-host fabric. Its seed comes from `CM_SIM_SEED` when set (to
//! reproduce a failure), else it is drawn and printed with the failure.

#![allow(unreachable_pub)] // a test crate: `pub` only shares items between its modules

#[macro_use]
#[path = "../conformance/macros.rs"]
mod macros;

mod bed {
    use cm::sim::SimFabric;

    use crate::support::Bed;

    pub type Backend = cm::SimHost;

    /// Property-test cases per property (at least 256 in CI).
    pub fn prop_cases() -> u32 {
        256
    }

    pub fn new_bed() -> Option<Bed<Backend>> {
        bed(SimFabric::builder())
    }

    pub fn seeded_bed(seed: u64) -> Option<Bed<Backend>> {
        bed(SimFabric::builder().seed(seed))
    }

    /// Waits used by the property tests (virtual time: long waits cost nothing, so the
    /// longest reaches the DREQ and timewait timers).
    pub fn prop_wait(choice: u8) -> std::time::Duration {
        match choice {
            0 => std::time::Duration::ZERO,
            1 => std::time::Duration::from_millis(1),
            2 => std::time::Duration::from_millis(100),
            _ => std::time::Duration::from_secs(80),
        }
    }

    fn bed(builder: cm::sim::SimBuilder) -> Option<Bed<Backend>> {
        let fabric = builder.host("10.0.0.1").host("10.0.0.2").build();
        let repro = fabric.repro_line();
        Some(Bed::new(
            fabric.host(0),
            fabric.host(1),
            "10.0.0.1".parse().unwrap(),
            "10.0.0.2".parse().unwrap(),
            "10.0.0.99".parse().unwrap(),
            7470,
            repro,
        ))
    }
}

#[path = "../conformance/support.rs"]
mod support;

#[path = "../conformance/scenarios.rs"]
mod scenarios;

#[path = "../conformance/misuse.rs"]
mod misuse;

#[path = "../conformance/datapath.rs"]
mod datapath;

#[path = "../conformance/onesided.rs"]
mod onesided;

#[path = "../conformance/onesided_sim.rs"]
mod onesided_sim;

#[path = "../conformance/onesided_rxe.rs"]
mod onesided_rxe;

#[path = "../conformance/external.rs"]
mod external;

#[path = "../conformance/datagram.rs"]
mod datagram;

#[path = "../conformance/multicast.rs"]
mod multicast;

#[path = "../conformance/datagram_sim.rs"]
mod datagram_sim;

#[path = "../conformance/props.rs"]
mod props;

#[path = "../conformance/sim_only.rs"]
mod sim_only;

#[path = "../conformance/faults.rs"]
mod faults;

#[path = "../conformance/options.rs"]
mod options;

#[path = "../conformance/options_sim.rs"]
mod options_sim;
