//! Programs that link a provider library (perftest, libfabric, UCX, pyverbs link libmlx5 or
//! libefa) load against the drop-in: every provider on the machine (`libmlx5.so.1`,
//! `libefa.so.1` and rdma-core's `libibverbs/*-rdmav34.so`) binds what it imports from
//! libibverbs' private node `IBVERBS_PRIVATE_34` at once (`dlopen` with `RTLD_NOW`), and its
//! registration adds no device beside the simulated one; perftest's `ib_send_bw` and
//! libfabric's `fi_info`, which link them, start.
//!
//! Each test skips with a message when what it runs is not installed (`apt-get install
//! ibverbs-providers perftest libfabric-bin`; `scripts/test-all` installs them) or the C
//! program cannot be compiled.

use std::path::PathBuf;

mod common;
#[path = "common/fabric.rs"]
mod fabric;
use fabric::{compile_c, Fabric};

const HOST: &str = "10.0.0.1";
const LIB_DIR: &str = "/usr/lib/x86_64-linux-gnu";

/// The provider libraries installed: the two a program links directly and the plugins.
fn providers() -> Vec<PathBuf> {
    let mut libs: Vec<PathBuf> = ["libmlx5.so.1", "libefa.so.1"]
        .iter()
        .map(|l| PathBuf::from(LIB_DIR).join(l))
        .filter(|p| p.exists())
        .collect();
    if let Ok(dir) = std::fs::read_dir(PathBuf::from(LIB_DIR).join("libibverbs")) {
        let mut plugins: Vec<PathBuf> = dir
            .filter_map(|e| Some(e.ok()?.path()))
            .filter(|p| p.extension().is_some_and(|x| x == "so"))
            .collect();
        plugins.sort();
        libs.extend(plugins);
    }
    libs
}

#[test]
fn every_installed_provider_library_loads_against_the_drop_in_and_adds_no_device() {
    let libs = providers();
    if !libs.iter().any(|p| p.ends_with("libmlx5.so.1")) {
        eprintln!("skipped: {LIB_DIR}/libmlx5.so.1 is not installed (apt-get install ibverbs-providers)");
        return;
    }
    let Some(prog) = compile_c("providers", &["ibverbs"]) else {
        return;
    };
    let fabric = Fabric::start("providers", &[HOST], 1);
    let mut args = vec![prog.path()];
    args.extend(libs.iter().map(|p| p.to_string_lossy().into_owned()));
    let args: Vec<&str> = args.iter().map(String::as_str).collect();
    let o = fabric.run(HOST, &args);
    let loaded: Vec<&str> = o
        .stdout
        .lines()
        .filter_map(|l| l.strip_prefix("loaded "))
        .collect();
    let failed: Vec<&str> = o.stdout.lines().filter(|l| l.starts_with("failed ")).collect();
    assert!(failed.is_empty(), "{failed:#?}\n{}", o.stderr);
    assert_eq!(loaded.len(), libs.len(), "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.lines().any(|l| l == "devices: cmsim0"),
        "only the simulated device: {}\n{}",
        o.stdout,
        o.stderr
    );
    assert!(o.status.success(), "{}", o.stderr);
    // Loading and registering is silent, as with rdma-core's libibverbs.
    assert!(o.stderr.is_empty(), "stderr: {}", o.stderr);
}

/// `/usr/bin/<program>`, or None with the package that brings it named.
fn installed(program: &str, package: &str) -> Option<String> {
    let path = format!("/usr/bin/{program}");
    if std::path::Path::new(&path).exists() {
        Some(path)
    } else {
        eprintln!("skipped: {path} is not installed (apt-get install {package})");
        None
    }
}

/// What the loader says when a library's imports are missing from the drop-in.
fn assert_loaded(o: &common::Output, what: &str) {
    for refusal in [
        "symbol lookup error",
        "undefined symbol",
        "not found (required by",
    ] {
        assert!(!o.stderr.contains(refusal), "{what}: {}", o.stderr);
    }
}

#[test]
fn perftest_which_links_libmlx5_and_libefa_loads_and_prints_its_usage() {
    let Some(prog) = installed("ib_send_bw", "perftest") else {
        return;
    };
    let fabric = Fabric::start("providers-perftest", &[HOST], 1);
    let o = fabric.run(HOST, &[&prog, "--help"]);
    fabric.stop();
    assert_loaded(&o, "ib_send_bw --help");
    assert!(
        o.stdout.contains("Usage:") && o.stdout.contains("ib_send_bw"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
}

#[test]
fn fi_info_which_links_libefa_loads_and_lists_libfabrics_providers() {
    let Some(prog) = installed("fi_info", "libfabric-bin") else {
        return;
    };
    let fabric = Fabric::start("providers-fi-info", &[HOST], 1);
    let o = fabric.run(HOST, &[&prog, "-l"]);
    fabric.stop();
    assert_loaded(&o, "fi_info -l");
    assert!(o.status.success(), "{}\n{}", o.stdout, o.stderr);
    assert!(
        o.stdout.lines().any(|l| l == "tcp:"),
        "{}\n{}",
        o.stdout,
        o.stderr
    );
}
