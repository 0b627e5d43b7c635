//! cmtime's command line (examples/cmtime/cli.rs, included here as the example includes it):
//! what each flag means, that every mistake is one line, and that no combination of flags
//! panics in parsing, checking, the simulator's set-up or opening the output files.

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

// The example uses all of it; this test only part.
#[allow(dead_code)]
#[path = "../../examples/cmtime/cli.rs"]
mod cli;

use cli::{Backend, Options, Parsed, Role};

fn parse(args: &[&str], hw_built: bool) -> Result<Parsed, String> {
    cli::parse(std::iter::once("cmtime").chain(args.iter().copied()), hw_built)
}

fn run(args: &[&str]) -> Options {
    match parse(args, true) {
        Ok(Parsed::Run(o)) => o,
        other => panic!("{args:?}: expected a run, got {other:?}"),
    }
}

fn refusal(args: &[&str], hw_built: bool) -> String {
    match parse(args, hw_built) {
        Err(msg) => {
            assert!(!msg.contains('\n'), "{args:?}: not one line: {msg:?}");
            msg
        }
        Ok(other) => panic!("{args:?}: expected a refusal, got {other:?}"),
    }
}

fn ip(text: &str) -> IpAddr {
    text.parse().expect("an address literal")
}

#[test]
fn help_is_printed_on_stdout_and_names_the_short_flags() {
    for flag in ["--help", "-h"] {
        let Ok(Parsed::Help(help)) = parse(&[flag], false) else {
            panic!("{flag}: not help");
        };
        assert!(!help.use_stderr(), "{flag}: help goes to stderr");
        let text = help.render().to_string();
        for needle in [
            "-s, --server",
            "-b, --bind",
            "-c, --connections",
            "-p, --port",
            "--role",
            "--trace-mermaid",
        ] {
            assert!(text.contains(needle), "{flag}: help lacks {needle}:\n{text}");
        }
    }
}

#[test]
fn rdma_core_short_flags_mean_what_they_mean_there() {
    let o = run(&[
        "-s", "10.0.0.9", "-b", "10.0.0.8", "-c", "5", "-p", "7000", "-t", "100", "-r", "3",
    ]);
    assert_eq!(o.server, ip("10.0.0.9"));
    assert_eq!(o.bind, Some(ip("10.0.0.8")));
    assert_eq!(o.connections, 5);
    assert_eq!(o.port, 7000);
    assert_eq!(o.timeout, Duration::from_millis(100));
    assert_eq!(o.retries, 3);
}

#[test]
fn defaults_are_cmtimes_on_the_simulator() {
    let o = run(&[]);
    assert_eq!((o.backend, o.role), (Backend::Sim, Role::Both));
    assert_eq!((o.connections, o.port, o.retries), (1000, 7471, 2));
    assert_eq!(o.timeout, Duration::from_millis(2000));
    assert_eq!((o.server, o.bind, o.seed), (ip("10.0.0.1"), None, None));
}

#[test]
fn the_labs_long_option_rows_still_parse() {
    let hw = run(&[
        "--backend",
        "hw",
        "--role",
        "both",
        "--bind",
        "10.0.2.15",
        "--server",
        "10.0.2.15",
        "--connections",
        "1000",
    ]);
    assert_eq!(
        (hw.backend, hw.role, hw.server),
        (Backend::Hw, Role::Both, ip("10.0.2.15"))
    );
    let client = run(&[
        "--backend",
        "hw",
        "--role",
        "client",
        "--bind",
        "10.0.2.15",
        "--server",
        "10.0.2.15",
        "--connections",
        "10",
    ]);
    assert_eq!(client.role, Role::Client);
    let sim = run(&[
        "--backend",
        "sim",
        "--bind",
        "10.0.0.2",
        "--server",
        "10.0.0.1",
        "--connections",
        "1000",
        "--seed",
        "1",
    ]);
    assert_eq!((sim.seed, sim.bind), (Some(1), Some(ip("10.0.0.2"))));
    assert_eq!(run(&["--seed", "0x10"]).seed, Some(16));
}

#[test]
fn a_hardware_server_listens_on_bind_then_server_then_every_address() {
    assert_eq!(
        run(&["--backend", "hw", "--role", "server", "-b", "10.0.0.7"]).server,
        ip("10.0.0.7")
    );
    assert_eq!(
        run(&["--backend", "hw", "--role", "server", "-s", "10.0.0.6"]).server,
        ip("10.0.0.6")
    );
    assert_eq!(
        run(&["--backend", "hw", "--role", "server"]).server,
        ip("0.0.0.0")
    );
}

#[test]
fn unknown_flags_and_bad_values_are_one_line_naming_the_culprit() {
    let cases: &[(&[&str], &[&str])] = &[
        (&["--bogus"], &["--bogus"]),
        (&["-x", "1"], &["-x"]),
        (&["stray"], &["stray"]),
        (&["-c", "abc"], &["--connections", "abc"]),
        (&["-c", "0"], &["--connections", "0"]),
        (&["-c", "1000001"], &["--connections"]),
        (&["-c", "-5"], &["-5"]),
        (&["-c"], &["--connections"]),
        (&["-p", "0"], &["--port"]),
        (&["-p", "70000"], &["--port", "70000"]),
        (&["-t", "0"], &["--timeout"]),
        (&["-s", "host.example"], &["--server", "host.example"]),
        (&["-b", "10.0.0"], &["--bind", "10.0.0"]),
        (&["--seed", "0xZZ"], &["--seed", "0xZZ"]),
        (&["--backend", "gpu"], &["--backend", "gpu"]),
        (&["--role", "peer"], &["--role", "peer"]),
    ];
    for (args, needles) in cases {
        let msg = refusal(args, true);
        for needle in *needles {
            assert!(msg.contains(needle), "{args:?}: {msg:?} does not name {needle}");
        }
    }
}

#[test]
fn simulator_only_options_are_refused_with_the_hardware_backend() {
    for (flag, value) in [("--seed", "7"), ("--trace", "t.txt"), ("--trace-mermaid", "t.md")] {
        let msg = refusal(&["--backend", "hw", "-s", "10.0.0.1", flag, value], true);
        assert!(msg.contains(flag) && msg.contains("simulator only"), "{msg}");
    }
}

#[test]
fn hardware_only_choices_are_refused_where_they_cannot_work() {
    assert!(refusal(&["--role", "server"], true).contains("--backend hw"));
    assert!(refusal(&["--backend", "sim", "--role", "client"], true).contains("--backend hw"));
    assert!(refusal(&["--backend", "hw", "-c", "10"], true).contains("--server"));
    assert!(refusal(&["--backend", "hw", "-s", "10.0.0.1"], false).contains("--features hw"));
}

#[test]
fn one_file_for_both_traces_is_refused() {
    assert!(refusal(&["--trace", "x", "--trace-mermaid", "x"], false).contains("both name x"));
}

#[test]
fn an_unwritable_output_file_fails_before_the_run_and_a_writable_one_is_created() {
    let dir = std::env::temp_dir().join(format!("cmtime-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temporary directory");
    let missing = dir.join("no-such-dir").join("trace.txt");
    let missing_text = missing.to_str().expect("UTF-8 path");
    let o = run(&["--trace", missing_text]);
    let msg = cli::open_outputs(&o).expect_err("an unwritable trace file");
    assert!(msg.contains(missing_text) && !msg.contains('\n'), "{msg}");

    let good = dir.join("trace.md");
    let o = run(&["--trace-mermaid", good.to_str().expect("UTF-8 path")]);
    let outputs = cli::open_outputs(&o).expect("a writable trace file");
    assert!(good.exists() && outputs.trace.is_none() && outputs.mermaid.is_some());
    std::fs::remove_dir_all(&dir).expect("clean up");
}

#[test]
fn extra_client_addresses_avoid_the_server_and_keep_the_default_runs_addresses() {
    // The addresses the 100 000-connection trace hashes were recorded with.
    let default = cli::sim_client_addrs(ip("10.0.0.2"), ip("10.0.0.1"), 100_000);
    let expected: Vec<IpAddr> = ["10.0.0.2", "10.255.0.2", "10.255.0.3", "10.255.0.4", "10.255.0.5"]
        .iter()
        .map(|a| ip(a))
        .collect();
    assert_eq!(default, expected);

    let o = run(&["--server", "10.255.0.2", "-c", "30000"]);
    let (fabric, sources) = cli::sim_fabric(&o).expect("a fabric");
    assert_eq!(sources.len(), 2);
    assert!(!sources.contains(&ip("10.255.0.2")), "{sources:?}");
    assert_eq!(fabric.host_count(), 2);

    let o = run(&["-b", "10.255.0.3", "-s", "10.255.0.2", "-c", "60000"]);
    let (_, sources) = cli::sim_fabric(&o).expect("a fabric");
    assert_eq!(sources.len(), 3);
    assert_eq!(sources[0], ip("10.255.0.3"));
    assert_eq!(sources.iter().filter(|a| **a == ip("10.255.0.3")).count(), 1);
}

#[test]
fn every_hardware_connection_binds_to_the_one_bind_address() {
    let bind = [ip("10.0.0.1")];
    for c in [0, 19_999, 20_000, 30_000, 999_999] {
        assert_eq!(
            cli::source(&bind, c),
            Some(SocketAddr::new(bind[0], 0)),
            "connection {c}"
        );
    }
    assert_eq!(cli::source(&[], 0), None);
}

/// Every combination of these fragments is parsed and checked (with and without the hardware
/// backend built); each run the simulator would start also builds its fabric. None may panic,
/// and every refusal is one line.
#[test]
fn no_combination_of_flags_panics() {
    let backends: &[&[&str]] = &[
        &[],
        &["--backend", "sim"],
        &["--backend", "hw"],
        &["--backend", "x"],
    ];
    let roles: &[&[&str]] = &[
        &[],
        &["--role", "server"],
        &["--role", "client"],
        &["--role", "both"],
    ];
    let binds: &[&[&str]] = &[
        &[],
        &["-b", "10.0.0.2"],
        &["-b", "127.0.0.1"],
        &["-b", "::1"],
        &["-b", "10.255.0.2"],
        &["-b", "nope"],
    ];
    let servers: &[&[&str]] = &[&[], &["-s", "10.255.0.2"], &["-s", "fe80::1"], &["-s", "0.0.0.0"]];
    let counts: &[&[&str]] = &[
        &[],
        &["-c", "0"],
        &["-c", "30000"],
        &["-c", "1000000"],
        &["-c", "x"],
    ];
    let rest: &[&[&str]] = &[
        &[],
        &["--seed", "7"],
        &["--trace", "t"],
        &["--trace-mermaid", "m", "--trace", "m"],
        &["-p", "0"],
        &["-t", "4294967295"],
        &["--bogus"],
        &["--help"],
    ];
    let (mut runs, mut refusals) = (0, 0);
    for b in backends {
        for r in roles {
            for bind in binds {
                for s in servers {
                    for c in counts {
                        for x in rest {
                            let args: Vec<&str> = [*b, *r, *bind, *s, *c, *x].concat();
                            // Whether the hardware backend is built matters to `--backend hw` only.
                            let builds: &[bool] = if b.contains(&"hw") {
                                &[false, true]
                            } else {
                                &[false]
                            };
                            for &hw_built in builds {
                                match parse(&args, hw_built) {
                                    Ok(Parsed::Run(o)) => {
                                        runs += 1;
                                        if o.backend == Backend::Sim {
                                            // An error is a fine answer (`-b 127.0.0.1`); a panic is not.
                                            let _ = cli::sim_fabric(&o);
                                        }
                                    }
                                    Ok(Parsed::Help(_)) => {}
                                    Err(msg) => {
                                        refusals += 1;
                                        assert!(!msg.contains('\n'), "{args:?}: {msg:?}");
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // The table reaches both outcomes, so it checks something either way.
    assert!(runs > 0 && refusals > 0, "runs {runs}, refusals {refusals}");
}
