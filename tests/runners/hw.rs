//! The conformance suite on the hardware backend (feature `hw`): the same scenario, misuse and
//! property tests as the simulator runner, over the real librdmacm.
//!
//! Needs an RDMA device and `CM_HW_ADDR`, an IPv4 or IPv6 address of the interface that carries
//! it (Soft-RoCE: `rdma link add rxe0 type rxe netdev <if>`; the lab runs the runner once on each
//! family). Server and client are two backends in this process on that one address; the device
//! loops the traffic back. `CM_HW_UNREACHABLE_ADDR` names an address nobody answers for (default:
//! the `.254` host of an IPv4 address's /24, the `::fe` host of an IPv6 address's /64).
//! Without a device every test prints `skipped: <reason>` and passes.
//!
//! libtest has no run-time skip, so a skipped test shows as passed in its summary. The runner
//! therefore keeps its own tally and its last test, [`zz_hw_summary`], prints
//! `hw: N passed, M failed, K skipped` (the line the lab's summary reads; see [`tally`]).
//!
//! Not included here: `sim_only.rs`, whose tests need the simulator's seeds, virtual time or
//! scale. Run with `--test-threads=1`: the tests share one device and one address, and the
//! tally is complete only when the summary runs after every other test.

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
            Ok(a) if a.parse::<IpAddr>().is_ok() => None,
            Ok(a) => Some(format!("CM_HW_ADDR={a:?} is not an IP address")),
            Err(_) => {
                Some("an RDMA device answers, but CM_HW_ADDR (its interface's IP address) is not set".into())
            }
        }
    }

    pub fn new_bed() -> Option<Bed<Backend>> {
        if let Some(why) = unavailable() {
            crate::tally::skipped();
            println!("skipped: {why}");
            return None;
        }
        crate::tally::ran();
        let ip: IpAddr = std::env::var("CM_HW_ADDR").ok()?.parse().ok()?;
        let unreachable = match std::env::var("CM_HW_UNREACHABLE_ADDR") {
            Ok(a) => a.parse().expect("CM_HW_UNREACHABLE_ADDR is an IP address"),
            Err(_) => match ip {
                IpAddr::V4(v4) => {
                    let [a, b, c, _] = v4.octets();
                    IpAddr::from([a, b, c, 254])
                }
                IpAddr::V6(v6) => {
                    let mut s = v6.segments();
                    s[4..].copy_from_slice(&[0, 0, 0, 0xfe]);
                    IpAddr::from(s)
                }
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

#[path = "../conformance/onesided.rs"]
mod onesided;

#[path = "../conformance/external.rs"]
mod external;

#[path = "../conformance/external_hw.rs"]
mod external_hw;

#[path = "../conformance/datagram.rs"]
mod datagram;

#[path = "../conformance/multicast.rs"]
mod multicast;

#[path = "../conformance/props.rs"]
mod props;

#[path = "../conformance/options.rs"]
mod options;

#[path = "../conformance/onesided_rxe.rs"]
mod onesided_rxe;

/// Behaviour only a real device shows the way it matters here.
mod hw_only {
    use cm::api::{CmBackend, QpState, WcOpcode, WcStatus};

    use crate::support::{completions, establish, let_time_pass, teardown};

    /// rxe on Linux 6.1 never completes a receive posted on a QP that the device itself has put
    /// in ERR; the backend must see the unpolled error completion and flush the receive.
    #[test]
    fn a_receive_posted_after_the_device_failed_the_qp_completes_flushed() {
        let mut bed = bed!();
        let conn = establish(&mut bed);
        // A receive too short for the message: the device fails it and puts the client's QP in
        // ERR, telling only through an error completion on the client's CQ.
        bed.client.post_recv(conn.client.id, 1, 4).unwrap();
        bed.server.post_send(conn.child, 2, &[7; 64]).unwrap();
        let sent = completions(&mut bed.server, conn.child, 1);
        assert_eq!(
            sent.len(),
            1,
            "the server's send completes (with the NAK's error)"
        );
        let_time_pass(&mut bed.client);
        assert_ne!(
            bed.client.id_machine(conn.client.id).unwrap().qp(),
            Some(QpState::Err),
            "nothing was polled yet: only the device knows"
        );

        bed.client.post_recv(conn.client.id, 3, 64).unwrap();
        let got = completions(&mut bed.client, conn.client.id, 2);
        let seen: Vec<_> = got.iter().map(|c| (c.wr_id, c.opcode, c.status)).collect();
        assert_eq!(seen.len(), 2, "both receives complete: {seen:?}");
        assert_eq!((seen[0].0, seen[0].1), (1, WcOpcode::Recv));
        assert_ne!(seen[0].2, WcStatus::Success, "the short receive failed: {seen:?}");
        assert_eq!(seen[1], (3, WcOpcode::Recv, WcStatus::WrFlushErr));
        assert_eq!(
            bed.client.id_machine(conn.client.id).unwrap().qp(),
            Some(QpState::Err)
        );
        teardown(&mut bed, conn);
    }

    /// A whole connection between two synchronous ids: each side's calls wait for their own
    /// events, so the sides run on two threads, as librdmacm's synchronous users do.
    #[test]
    fn two_synchronous_ids_on_two_threads_connect_and_disconnect() {
        use std::net::SocketAddr;

        use cm::api::{getaddrinfo, AddrHints, AddrInfo, CmEventType, ConnParam, PortSpace, QpCaps, SyncId};

        use crate::support::{assert_clean, WAIT};

        let mut bed = bed!();
        let addr = bed.server_addr();
        let src = SocketAddr::new(bed.client_ip, 0);
        let (server, client) = (&mut bed.server, &mut bed.client);
        let passive = AddrHints {
            passive: true,
            ..AddrHints::default()
        };
        let info = getaddrinfo(
            Some(&addr.ip().to_string()),
            Some(&addr.port().to_string()),
            &passive,
        )
        .unwrap()[0];
        let mut listener = SyncId::create_ep(server, &info, Some(QpCaps::new()), WAIT).unwrap();
        listener.listen(server, 0).unwrap();
        std::thread::scope(|s| {
            let serving = s.spawn(|| {
                let mut child = listener.get_request(server).unwrap();
                child.accept(server, &ConnParam::new()).unwrap();
                assert_eq!(child.event().map(|e| e.event()), Some(CmEventType::Established));
                assert_eq!(child.next_event(server).unwrap(), CmEventType::Disconnected);
                // Destroying the child answers the client's DREQ.
                child.destroy(server).map_err(|(_, e)| e).unwrap();
            });
            let active = AddrInfo {
                passive: false,
                port_space: PortSpace::Tcp,
                src: Some(src),
                dst: Some(addr),
            };
            let mut ep = SyncId::create_ep(client, &active, Some(QpCaps::new()), WAIT).unwrap();
            ep.connect(client, &ConnParam::new()).unwrap();
            assert_eq!(ep.event().map(|e| e.event()), Some(CmEventType::Established));
            ep.disconnect(client).unwrap();
            assert_eq!(ep.event().map(|e| e.event()), Some(CmEventType::Disconnected));
            ep.destroy(client).map_err(|(_, e)| e).unwrap();
            serving.join().expect("the server thread");
        });
        listener.destroy(server).map_err(|(_, e)| e).unwrap();
        assert_clean(&bed);
    }
}

/// Per-test outcomes, for the summary line libtest cannot print.
///
/// Why not a custom harness (`harness = false`): the conformance files are shared with the
/// simulator runner and declare ordinary `#[test]` and `proptest!` tests, which only libtest
/// collects. Instead every test that asks for a bed is recorded here by its thread's name
/// (libtest runs each test on a thread named after it): skipped when the bed was refused, run
/// otherwise, and failed when that thread panics (a panic hook; a failing proptest case ends in
/// a panic too). [`zz_hw_summary`] sorts after every other test, and libtest runs tests in
/// name order, so with `--test-threads=1` it sees them all.
mod tally {
    use std::collections::BTreeMap;
    use std::sync::{Mutex, Once};

    #[derive(Clone, Copy, PartialEq, Eq)]
    enum Outcome {
        Ran,
        Skipped,
        Failed,
    }

    static OUTCOMES: Mutex<BTreeMap<String, Outcome>> = Mutex::new(BTreeMap::new());

    fn test_name() -> String {
        std::thread::current()
            .name()
            .unwrap_or("(unnamed thread)")
            .to_string()
    }

    fn outcomes() -> std::sync::MutexGuard<'static, BTreeMap<String, Outcome>> {
        // A panic while the lock was held (none can happen inside) must not hide the tally.
        OUTCOMES.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
    }

    /// Records `outcome` for the running test unless it already failed (a property test asks
    /// for a bed once per case).
    fn record(outcome: Outcome) {
        static HOOK: Once = Once::new();
        HOOK.call_once(|| {
            let previous = std::panic::take_hook();
            std::panic::set_hook(Box::new(move |info| {
                outcomes().insert(test_name(), Outcome::Failed);
                previous(info);
            }));
        });
        let mut all = outcomes();
        let entry = all.entry(test_name()).or_insert(outcome);
        if *entry != Outcome::Failed {
            *entry = outcome;
        }
    }

    /// The running test got a bed.
    pub fn ran() {
        record(Outcome::Ran);
    }

    /// The running test was refused a bed and returns without testing anything.
    pub fn skipped() {
        record(Outcome::Skipped);
    }

    /// `(passed, failed, skipped)` so far.
    pub fn counts() -> (usize, usize, usize) {
        let all = outcomes();
        let n = |o| all.values().filter(|&&v| v == o).count();
        (n(Outcome::Ran), n(Outcome::Failed), n(Outcome::Skipped))
    }

    /// The summary line: `hw: N passed, M failed, K skipped`.
    pub fn line((passed, failed, skipped): (usize, usize, usize)) -> String {
        format!("hw: {passed} passed, {failed} failed, {skipped} skipped")
    }

    #[test]
    fn the_summary_line_has_the_format_the_lab_reads() {
        assert_eq!(line((29, 1, 2)), "hw: 29 passed, 1 failed, 2 skipped");
    }
}

/// Prints the runner's own summary (see [`tally`]). Named to sort after every other test.
#[test]
fn zz_hw_summary() {
    use std::io::Write;

    let single_threaded = std::env::args().any(|a| a == "--test-threads=1")
        || std::env::var("RUST_TEST_THREADS").is_ok_and(|v| v == "1");
    let mut line = tally::line(tally::counts());
    if !single_threaded {
        line.push_str(" (incomplete: run with --test-threads=1 to count every test)");
    }
    // Straight to the process's stdout, past libtest's capture of `println!`, so the line shows
    // without --nocapture too; on a line of its own after libtest's "test zz_hw_summary ... ".
    let mut out = std::io::stdout().lock();
    writeln!(out, "\n{line}").expect("stdout");
    out.flush().expect("stdout");
}
