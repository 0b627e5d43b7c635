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

    /// Whether this runner is the simulator (sim-only tests check it).
    pub const SIM: bool = true;

    pub fn new_bed() -> Option<Bed<Backend>> {
        let fabric = SimFabric::builder().host("10.0.0.1").host("10.0.0.2").build();
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
