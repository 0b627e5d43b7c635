//! The conformance suite on the hardware backend (feature `hw`): the same scenario, misuse and
//! property tests as the simulator runner, over the real librdmacm.
//!
//! Needs an RDMA device and `CM_HW_ADDR`, the IPv4 address of the interface that carries it
//! (Soft-RoCE: `rdma link add rxe0 type rxe netdev <if>`). Server and client are two backends in
//! this process on that one address; the device loops the traffic back. `CM_HW_UNREACHABLE_ADDR`
//! names an address nobody answers for (default: the `.254` host of `CM_HW_ADDR`'s /24).
//! Without a device every test prints `skipped: <reason>` and passes.
//!
//! Not included here: `sim_only.rs`, whose tests need the simulator's seeds, virtual time or
//! scale. Run with `--test-threads=1`: the tests share one device and one address.

#![cfg(feature = "hw")]
#![allow(unreachable_pub)] // a test crate: `pub` only shares items between its modules

#[macro_use]
#[path = "../conformance/macros.rs"]
mod macros;

mod bed {
    use std::net::IpAddr;
    use std::sync::atomic::{AtomicU16, Ordering};
    use std::time::Duration;

    use crate::support::Bed;

    pub type Backend = cm::hw::HwBackend;

    /// Why the tests cannot run here, if they cannot.
    fn unavailable() -> Option<String> {
        if let Err(e) = cm::hw::probe() {
            return Some(e.to_string());
        }
        match std::env::var("CM_HW_ADDR") {
            Ok(a) if a.parse::<std::net::Ipv4Addr>().is_ok() => None,
            Ok(a) => Some(format!("CM_HW_ADDR={a:?} is not an IPv4 address")),
            Err(_) => Some(
                "an RDMA device answers, but CM_HW_ADDR (its interface's IPv4 address) is not set".into(),
            ),
        }
    }

    pub fn new_bed() -> Option<Bed<Backend>> {
        if let Some(why) = unavailable() {
            println!("skipped: {why}");
            return None;
        }
        let ip: IpAddr = std::env::var("CM_HW_ADDR").ok()?.parse().ok()?;
        let unreachable = match std::env::var("CM_HW_UNREACHABLE_ADDR") {
            Ok(a) => a.parse().expect("CM_HW_UNREACHABLE_ADDR is an IP address"),
            Err(_) => match ip {
                IpAddr::V4(v4) => {
                    let [a, b, c, _] = v4.octets();
                    IpAddr::from([a, b, c, 254])
                }
                IpAddr::V6(_) => unreachable!("checked to be IPv4"),
            },
        };
        // Each bed gets its own block of ports, so a test never meets the previous one's ids.
        static NEXT_BLOCK: AtomicU16 = AtomicU16::new(0);
        let block = NEXT_BLOCK.fetch_add(1, Ordering::Relaxed) % 2000;
        let first_port = 20_000 + block * 16;
        let server = cm::hw::HwBackend::new().expect("HwBackend::new");
        let client = cm::hw::HwBackend::new().expect("HwBackend::new");
        Some(Bed::new(
            server,
            client,
            ip,
            ip,
            unreachable,
            first_port,
            String::new(),
        ))
    }

    pub fn seeded_bed(_seed: u64) -> Option<Bed<Backend>> {
        new_bed()
    }

    /// Property-test cases per property: each case costs real time on a device.
    pub fn prop_cases() -> u32 {
        if unavailable().is_some() {
            1
        } else {
            16
        }
    }

    /// Real waits, short enough for a few dozen cases under emulation.
    pub fn prop_wait(choice: u8) -> Duration {
        match choice {
            0 => Duration::ZERO,
            1 => Duration::from_millis(10),
            2 => Duration::from_millis(100),
            _ => Duration::from_secs(1),
        }
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

#[path = "../conformance/props.rs"]
mod props;
