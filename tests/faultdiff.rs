//! The fault-differential suite's patterns on the simulator, against what each pattern's table
//! says Linux 6.1's IB CM does with the losses (examples/faultdiff/patterns.rs): every event
//! with its status at each end, in order and on time, every message on the wire. The lab's
//! `faultdiff` suite runs the same patterns on rxe and compares them with these runs.

#[allow(dead_code, unreachable_pub)]
#[path = "../examples/faultdiff.rs"]
mod faultdiff;

#[test]
fn every_pattern_runs_on_the_simulator_as_its_table_says_the_kernel_does() {
    let off = faultdiff::simulator_off_the_table();
    assert!(
        off.is_empty(),
        "patterns off their table (cargo run --example faultdiff shows each run):\n{}",
        off.iter()
            .map(|(name, why)| format!("{name}:\n  {}", why.join("\n  ")))
            .collect::<Vec<_>>()
            .join("\n")
    );
}
