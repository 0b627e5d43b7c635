//! The remote counter of `examples/counter.rs` on the simulator: several clients' RDMA
//! fetch-and-adds on one server's 8 bytes, each counted once.

use std::net::SocketAddr;

use cm::app::sim::{HostOutcome, Sim};
use cm::sim::SimFabric;

#[path = "../examples/counter.rs"]
#[allow(dead_code, unreachable_pub)]
mod counter;

fn outcome<T: std::fmt::Debug>(o: HostOutcome<T>) -> T {
    match o {
        HostOutcome::Finished(v) => v,
        other => panic!("did not finish: {other:?}"),
    }
}

#[test]
fn the_counter_counts_every_clients_add_once() {
    let clients = 3;
    let mut b = SimFabric::builder().seed(4).host("10.0.0.1");
    for c in 0..clients {
        b = b.host(format!("10.0.0.{}", c + 2).as_str());
    }
    let f = b.build();
    let at: SocketAddr = "10.0.0.1:7471".parse().unwrap();
    let mut sim: Sim<cm::app::Result<Vec<u64>>> = Sim::new(f.clone());
    sim.client(0, move |ctx| async move {
        counter::app::server(ctx.cm()?, at, clients as u32)
            .await
            .map(|v| vec![v])
    });
    for c in 0..clients {
        sim.client(c + 1, move |ctx| async move {
            counter::app::client(ctx.cm()?, at, 50).await
        });
    }
    let mut results = sim
        .run()
        .unwrap_or_else(|e| panic!("{e}"))
        .into_iter()
        .map(outcome);
    let value = results.next().unwrap().unwrap()[0];
    let seen: Vec<Vec<u64>> = results.map(|r| r.unwrap()).collect();
    assert_eq!(value, 150);
    assert_eq!(counter::app::check(value, &seen), Ok(()));
    assert!(
        counter::app::check(value + 1, &seen).is_err(),
        "the check can fail"
    );
    let mut twice = seen.clone();
    twice[0][0] = twice[1][0];
    assert!(
        counter::app::check(value, &twice).is_err(),
        "a value seen twice is caught"
    );
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}
