//! cmtime's bookkeeping (examples/cmtime/times.rs, included here as the example includes it):
//! each step's slowest and fastest connection, from the start each connection was given and the
//! end it was logged with, whether the step ends in a loop over the connections or with events
//! settled after the step.

use cm::api::backend::id_handle;
use cm::api::IdHandle;

#[path = "../../examples/cmtime/times.rs"]
mod times;

use times::{us, Conns, Times};

const OWNER: u32 = 9;

/// Ids as a backend numbers them: slot indexes from `first` up, generation 0.
fn ids(first: u32, n: u32) -> Vec<IdHandle> {
    (first..first + n).map(|i| id_handle(OWNER, i, 0)).collect()
}

fn conns(ids: &[IdHandle]) -> Conns {
    let mut c = Conns::with_capacity(ids.len());
    for &id in ids {
        c.push(id, 0);
    }
    c
}

#[test]
fn a_step_settled_from_its_log_has_its_slowest_and_fastest_connection() {
    let ids = ids(1, 4);
    let mut c = conns(&ids);
    let mut t = Times::new();
    // Started 1 us apart, finished in another order: durations 9, 2, 30, 5 us.
    for (i, at) in [1_000u64, 2_000, 3_000, 4_000].into_iter().enumerate() {
        assert_eq!(c.start(i, at), ids[i]);
    }
    for (id, end) in [
        (ids[1], 4_000u64),
        (ids[3], 9_000),
        (ids[0], 10_000),
        (ids[2], 33_000),
    ] {
        c.stop_later(id, end);
    }
    assert_eq!(t.extremes[5], None, "nothing counts before the step is settled");
    c.settle(5, &mut t);
    assert_eq!(t.extremes[5], Some((30.0, 2.0)));
    // The log was emptied: settling again changes nothing, another step starts afresh.
    c.settle(5, &mut t);
    assert_eq!(t.extremes[5], Some((30.0, 2.0)));
    c.start(0, 50_000);
    c.stop_later(ids[0], 57_000);
    c.settle(6, &mut t);
    assert_eq!(t.extremes[6], Some((7.0, 7.0)));
}

#[test]
fn a_log_longer_than_the_read_ahead_is_settled_whole() {
    let ids = ids(3, 100);
    let mut c = conns(&ids);
    let mut t = Times::new();
    for i in 0..ids.len() {
        c.start(i, 0);
    }
    // Finished in reverse order, connection i after (i + 1) us.
    for (i, &id) in ids.iter().enumerate().rev() {
        c.stop_later(id, (i as u64 + 1) * 1_000);
    }
    c.settle(2, &mut t);
    assert_eq!(t.extremes[2], Some((100.0, 1.0)));
}

#[test]
fn ids_map_to_their_connections_around_other_slots() {
    // The server's ids take slots between the client's: 0 (listener) and 5..8.
    let mut c = Conns::default();
    let a = ids(1, 4);
    let b = ids(8, 2);
    for &id in a.iter().chain(&b) {
        c.push(id, 0);
    }
    assert_eq!(c.len(), 6);
    assert_eq!(c.of(a[2]).conn, 2);
    assert_eq!(c.of(b[1]).conn, 5);
}

#[test]
#[should_panic(expected = "none of its connections")]
fn an_event_for_an_id_cmtime_did_not_make_is_a_bug_it_reports() {
    let ids = ids(1, 2);
    let mut c = conns(&ids);
    let mut t = Times::new();
    // Slot 0 is below cmtime's ids (the listener's): not one of its connections.
    c.stop_later(id_handle(OWNER, 0, 0), 1);
    c.settle(5, &mut t);
}

#[test]
#[should_panic(expected = "none of its connections")]
fn an_id_of_a_reused_slot_is_not_the_connection_that_had_it() {
    let ids = ids(1, 2);
    let c = conns(&ids);
    c.of(id_handle(OWNER, 1, 1));
}

#[test]
fn a_step_run_in_a_loop_counts_each_connection_as_it_returns() {
    let ids = ids(1, 3);
    let mut c = conns(&ids);
    let mut t = Times::new();
    let mut longest = 0;
    for i in 0..ids.len() {
        let at = t.now();
        let id = c.start(i, at);
        c.stop(id, 4, &mut t);
        longest = longest.max(t.now() - at);
    }
    let (max, min) = t.extremes[4].expect("every connection counted");
    assert!(0.0 <= min && min <= max, "{min} .. {max}");
    assert!(
        max <= longest as f64 / 1e3,
        "{max} us, yet no call took longer than {longest} ns"
    );
}

#[test]
fn a_steps_span_runs_from_its_begin_to_its_end() {
    let mut t = Times::new();
    t.begin(3);
    t.end(3);
    let (Some(a), Some(b)) = t.step[3] else {
        panic!("step 3 has no begin or end: {:?}", t.step[3]);
    };
    assert!(us(a, b) >= 0.0);
    assert_eq!(t.step[2], (None, None), "only the step begun and ended is marked");
}
