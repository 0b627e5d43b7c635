//! Debian 12's libfabric 1.17 (`libfabric-bin`), unmodified, on the simulator through the
//! drop-in: its verbs provider finds the simulated device and the host's address, and
//! `fi_pingpong -p verbs` runs between two simulated hosts.
//!
//! The verbs provider enumerates the devices (`rdma_get_devices`, `ibv_query_device`,
//! `ibv_query_port`, `ibv_query_gid`), takes the addresses `getifaddrs` lists and binds an
//! `rdma_cm_id` to each to learn which are RDMA-capable. `fi_pingpong`'s default endpoint is
//! `FI_EP_DGRAM`: UD verbs QPs whose address handles name the peer's GID 0 (the IPv6
//! link-local GID), addresses swapped over its own TCP control connection (port 47592), and
//! libfabric's name server, which listens on the wildcard address and is woken at the end by
//! a connection to `localhost`.
//!
//! `fi_pingpong -e msg` goes over rdma_cm: a passive endpoint, `rdma_migrate_id` to the
//! endpoint's event queue, `rdma_getaddrinfo` of hints alone, RC QPs; `-e rdm` is libfabric's
//! rxm layer over those.
//!
//! Each test skips with a message when libfabric's programs are not installed (`apt-get
//! install libfabric-bin`; `scripts/test-all` installs it).

use std::time::{Duration, Instant};

mod common;
#[path = "common/fabric.rs"]
mod fabric;
use common::{wait, Output};
use fabric::Fabric;

const A: &str = "10.0.0.1";
const B: &str = "10.0.0.2";

/// `/usr/bin/<program>`, or None with the package that brings it named.
fn installed(program: &str) -> Option<String> {
    let path = format!("/usr/bin/{program}");
    if std::path::Path::new(&path).exists() {
        Some(path)
    } else {
        eprintln!("skipped: {path} is not installed (apt-get install libfabric-bin)");
        None
    }
}

/// The entries `fi_info` prints (without `-v`): one map of `key: value` per `provider:`.
fn entries(stdout: &str) -> Vec<Vec<(String, String)>> {
    let mut out: Vec<Vec<(String, String)>> = Vec::new();
    for line in stdout.lines() {
        let Some((k, v)) = line.trim().split_once(": ") else {
            continue;
        };
        if k == "provider" {
            out.push(Vec::new());
        }
        if let Some(e) = out.last_mut() {
            e.push((k.to_string(), v.to_string()));
        }
    }
    out
}

fn field<'a>(e: &'a [(String, String)], key: &str) -> Option<&'a str> {
    e.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str())
}

#[test]
fn fi_info_p_verbs_lists_the_simulated_device_for_msg_and_dgram_endpoints() {
    let Some(fi_info) = installed("fi_info") else {
        return;
    };
    let fabric = Fabric::start("libfabric-info", &[A], 2);
    let o = fabric.run(A, &[&fi_info, "-p", "verbs"]);
    let verbose = fabric.run(A, &[&fi_info, "-p", "verbs", "-v"]);
    fabric.stop();
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    let all = entries(&o.stdout);
    let verbs: Vec<_> = all
        .iter()
        .filter(|e| field(e, "provider") == Some("verbs"))
        .collect();
    let has = |domain: &str, ep: &str, proto: &str| {
        verbs.iter().any(|e| {
            field(e, "domain") == Some(domain)
                && field(e, "type") == Some(ep)
                && field(e, "protocol") == Some(proto)
                // RoCE is IB transport: the fabric is named for GID 0's subnet prefix.
                && field(e, "fabric") == Some("IB-0xfe80000000000000")
        })
    };
    assert!(
        has("cmsim0", "FI_EP_MSG", "FI_PROTO_RDMA_CM_IB_RC"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
    assert!(
        has("cmsim0-dgram", "FI_EP_DGRAM", "FI_PROTO_IB_UD"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
    // Its MSG domain binds localhost when asked for no address, which succeeds with no device
    // (a loopback bind is a wildcard bind to the kernel), so the RDM layering over it works.
    assert!(
        all.iter().any(|e| field(e, "provider") == Some("verbs;ofi_rxm")
            && field(e, "domain") == Some("cmsim0")
            && field(e, "type") == Some("FI_EP_RDM")),
        "{}",
        o.stdout
    );
    assert!(
        all.iter()
            .all(|e| field(e, "domain").is_none_or(|d| d.starts_with("cmsim0"))),
        "only the simulated device: {}",
        o.stdout
    );
    // Then the MSG entries take their source address from the host's interface, as
    // getifaddrs lists it.
    assert!(verbose.status.success(), "{}", verbose.stderr);
    assert!(
        verbose
            .stdout
            .lines()
            .any(|l| l.trim() == "src_addr: fi_sockaddr_in://10.0.0.1:0"),
        "{}",
        verbose.stdout
    );
}

#[test]
fn the_verbs_provider_finds_the_hosts_address_on_its_interface_through_getifaddrs() {
    let Some(fi_info) = installed("fi_info") else {
        return;
    };
    let fabric = Fabric::start("libfabric-iface", &[A, B], 2);
    // With FI_VERBS_IFACE the provider offers FI_EP_MSG only on the addresses getifaddrs
    // lists on that interface that an rdma_cm_id binds to: the simulated host's.
    let on_b = fabric.run(
        B,
        &[
            "env",
            "FI_VERBS_IFACE=cmsim0",
            "FI_LOG_LEVEL=info",
            &fi_info,
            "-p",
            "verbs",
            "-t",
            "FI_EP_MSG",
            "-s",
            B,
            "-v",
        ],
    );
    // The machine's own interfaces are not the host's: none of them is there.
    let eth = fabric.run(
        A,
        &[
            "env",
            "FI_VERBS_IFACE=eth",
            &fi_info,
            "-p",
            "verbs",
            "-t",
            "FI_EP_MSG",
        ],
    );
    fabric.stop();
    assert!(on_b.status.success(), "{}\n{}", on_b.stdout, on_b.stderr);
    assert!(
        on_b.stderr.contains("#1 cmsim0 - IPoIB addresses:")
            && on_b.stderr.lines().any(|l| l.trim_end().ends_with("\t10.0.0.2")),
        "the provider's list of RDMA-capable addresses: {}",
        on_b.stderr
    );
    assert!(
        on_b.stdout
            .lines()
            .any(|l| l.trim() == "src_addr: fi_sockaddr_in://10.0.0.2:0"),
        "{}",
        on_b.stdout
    );
    assert!(
        on_b.stdout.lines().any(|l| l.trim() == "name: cmsim0"),
        "{}",
        on_b.stdout
    );
    assert!(!eth.status.success(), "{}\n{}", eth.stdout, eth.stderr);
    assert!(!eth.stdout.contains("FI_EP_MSG"), "{}", eth.stdout);
}

/// One row of `fi_pingpong`'s result table.
#[derive(Debug, PartialEq)]
struct Row {
    bytes: u64,
    sent: u64,
    acked: u64,
    usec_per_xfer: f64,
}

/// The rows under `fi_pingpong`'s header (`bytes #sent #ack total time MB/sec usec/xfer
/// Mxfers/sec`); sizes read `1k` for 1024.
fn table(stdout: &str) -> Vec<Row> {
    let size = |s: &str| -> Option<u64> {
        match s.strip_suffix('k') {
            Some(k) => k.parse::<u64>().ok().map(|k| k * 1024),
            None => s.parse().ok(),
        }
    };
    let mut lines = stdout.lines().skip_while(|l| !l.starts_with("bytes"));
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    assert_eq!(
        header,
        [
            "bytes",
            "#sent",
            "#ack",
            "total",
            "time",
            "MB/sec",
            "usec/xfer",
            "Mxfers/sec"
        ],
        "{stdout}"
    );
    lines
        .map(|l| {
            let c: Vec<&str> = l.split_whitespace().collect();
            assert_eq!(c.len(), 8, "a row of eight columns: {l:?}");
            Row {
                bytes: size(c[0]).unwrap_or_else(|| panic!("bytes in {l:?}")),
                sent: c[1].parse().unwrap_or_else(|_| panic!("#sent in {l:?}")),
                acked: c[2]
                    .strip_prefix('=')
                    .and_then(|a| a.parse().ok())
                    .unwrap_or_else(|| panic!("#ack in {l:?}")),
                usec_per_xfer: c[6].parse().unwrap_or_else(|_| panic!("usec/xfer in {l:?}")),
            }
        })
        .collect()
}

fn finish(child: std::process::Child, what: &str) -> Output {
    wait(child, Duration::from_secs(60), what)
}

/// `fi_pingpong` with `args` (and `-I 20`) in the environment `env` (`K=V` words), the server
/// on `A` and the client on `B` told `A`'s address: what each printed.
fn pingpong(name: &str, env: &[&str], args: &[&str]) -> Option<(Output, Output)> {
    let pingpong = installed("fi_pingpong")?;
    // Clients refused while the server starts come and go too: the daemon is stopped below.
    let fabric = Fabric::start(name, &[A, B], 64);
    let mut cmd = if env.is_empty() { vec![] } else { vec!["env"] };
    cmd.extend_from_slice(env);
    cmd.push(pingpong.as_str());
    cmd.extend_from_slice(args);
    cmd.extend_from_slice(&["-I", "20"]);
    let server = fabric.spawn(A, &cmd);
    cmd.push(A);
    // The client connects its control socket (TCP, port 47592) once, refused until the
    // server listens: it is started again until it gets through, for at most 30 s.
    let start = Instant::now();
    let c = loop {
        let c = finish(fabric.spawn(B, &cmd), "fi_pingpong client");
        let refused = !c.status.success() && c.stderr.contains("failed to connect");
        if !refused || start.elapsed() > Duration::from_secs(30) {
            break c;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let s = finish(server, "fi_pingpong server");
    fabric.stop();
    Some((s, c))
}

/// Both sides printed a table of 20 round trips for each of `sizes`.
fn assert_table(s: &Output, c: &Output, sizes: &[u64]) {
    for (o, who) in [(s, "server"), (c, "client")] {
        assert!(o.status.success(), "{who}: {}\n{}", o.stdout, o.stderr);
        let rows = table(&o.stdout);
        let got: Vec<u64> = rows.iter().map(|r| r.bytes).collect();
        assert_eq!(got, sizes, "{who}: {}", o.stdout);
        for r in &rows {
            assert_eq!((r.sent, r.acked), (20, 20), "{who}: {r:?}");
            assert!(r.usec_per_xfer > 0.0, "{who}: {r:?}");
        }
    }
}

#[test]
fn fi_pingpong_p_verbs_runs_its_dgram_endpoints_between_two_simulated_hosts() {
    let Some((s, c)) = pingpong("libfabric-pingpong", &[], &["-p", "verbs"]) else {
        return;
    };
    // Its default sizes up to the port's 1024-byte MTU (a datagram is one packet).
    assert_table(&s, &c, &[64, 256, 1024]);
}

#[test]
fn fi_pingpong_p_verbs_e_msg_connects_over_rdma_cm_and_runs_between_two_simulated_hosts() {
    // FI_EP_MSG: a passive endpoint (rdma_cm listener) migrated to its event queue, the
    // client's rdma_getaddrinfo of the server's name, RC QPs of rdma_create_qp.
    let Some((s, c)) = pingpong("libfabric-pingpong-msg", &[], &["-p", "verbs", "-e", "msg"]) else {
        return;
    };
    assert_table(&s, &c, &[64, 256, 1024, 4096, 65536]);
}

#[test]
fn rdma_migrate_id_moves_an_ids_events_to_another_channel_or_one_of_its_own() {
    // What libfabric's verbs provider calls when it binds an id to an event queue.
    let Some(prog) = fabric::compile_c("migrate", &["rdmacm"]) else {
        return;
    };
    let fabric = Fabric::start("libfabric-migrate", &[A], 1);
    let o = fabric.run(A, &[&prog.path(), A]);
    fabric.stop();
    assert_eq!(o.stdout, "ok\n", "{}", o.stderr);
    assert!(o.status.success(), "{}", o.stderr);
}

#[test]
fn fi_pingpong_p_verbs_e_rdm_fails_at_fi_enable_past_max_cqe_as_on_rxe_and_runs_in_a_universe_of_32() {
    // FI_EP_RDM: libfabric's rxm layer over verbs;ofi_rxm, connecting on the first send. Its
    // MSG CQ has (tx + rx size) x FI_UNIVERSE_SIZE entries, which with the default universe
    // of 256 is past max_cqe: fi_enable fails (EINVAL from ibv_create_cq), as on rxe (the
    // lab); a universe of 32 fits.
    let Some((s, c)) = pingpong("libfabric-pingpong-rdm", &[], &["-p", "verbs", "-e", "rdm"]) else {
        return;
    };
    assert!(!s.status.success(), "server: {}\n{}", s.stdout, s.stderr);
    assert!(
        s.stderr
            .contains("fi_enable(): util/pingpong.c:1551, ret=-22 (Invalid argument)"),
        "server: {}",
        s.stderr
    );
    assert!(!c.status.success(), "client: {}\n{}", c.stdout, c.stderr);
    let Some((s, c)) = pingpong(
        "libfabric-pingpong-rdm32",
        &["FI_UNIVERSE_SIZE=32"],
        &["-p", "verbs", "-e", "rdm"],
    ) else {
        return;
    };
    assert_table(&s, &c, &[64, 256, 1024, 4096, 65536]);
}

#[test]
fn ibv_create_cq_refuses_no_entries_and_more_than_max_cqe_as_rxe_does() {
    // rxe_cq_chk_attr: EINVAL for cqe <= 0 or cqe > max_cqe (32767); what ofi_rxm's default CQ
    // size runs into (the test below).
    let Some(prog) = fabric::compile_c("cqlimits", &["ibverbs"]) else {
        return;
    };
    let fabric = Fabric::start("libfabric-cqlimits", &[A], 1);
    let o = fabric.run(A, &[&prog.path()]);
    fabric.stop();
    assert_eq!(o.stdout, "ok\n", "{}", o.stderr);
    assert!(o.status.success(), "{}", o.stderr);
}
