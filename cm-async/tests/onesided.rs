//! The layer's one-sided operations on the simulator: regions owned and deregistered on drop,
//! every operation's result, the peer's key handed over in private data, and typed failures.
//! (The remote counter of `examples/counter.rs` is tested in the root crate's `tests/counter.rs`.)

use std::net::SocketAddr;

use cm_async::sim::{HostOutcome, Sim};
use cm_async::{ConnOptions, Error, ImmWrite};
use cm_core::{Access, RemoteMr, WcStatus};
use cm_sim::SimFabric;

fn at() -> SocketAddr {
    "10.0.0.1:7471".parse().unwrap()
}

fn fabric(seed: u64, clients: usize) -> SimFabric {
    let mut b = SimFabric::builder().seed(seed).host("10.0.0.1");
    for c in 0..clients {
        b = b.host(format!("10.0.0.{}", c + 2).as_str());
    }
    b.build()
}

/// What the server's table holds at the start.
const TABLE: &[u8; 16] = b"0123456789abcdef";

/// A server with a 32-byte table (every access) whose key it gives each connection in the
/// accept; it serves until the peer says "bye", then returns what the table holds.
fn table_server(sim: &mut Sim<cm_async::Result<Vec<u8>>>) {
    sim.client(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(at(), ConnOptions::default())?;
        let table = listener.register(32, Access::ALL)?;
        table.write(0, TABLE)?;
        let conn = listener
            .request()
            .await?
            .accept_with_private_data(&table.remote().to_bytes())?;
        let note = conn.recv_imm().await?;
        assert_eq!(note, ImmWrite { imm: 0xBEEF, len: 4 });
        assert_eq!(conn.recv().await?, b"bye");
        conn.disconnect().await?;
        let mut out = vec![0; 32];
        table.read(0, &mut out)?;
        Ok(out)
    });
}

fn outcome<T: std::fmt::Debug>(o: HostOutcome<T>) -> T {
    match o {
        HostOutcome::Finished(v) => v,
        other => panic!("did not finish: {other:?}"),
    }
}

#[test]
fn a_connection_reads_writes_and_updates_the_peers_region_and_regions_go_with_their_owner() {
    let f = fabric(1, 1);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    table_server(&mut sim);
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        let table = RemoteMr::from_bytes(conn.peer_private_data()).expect("the table's key");
        let mine = conn.register(32, Access::LOCAL_WRITE)?;
        assert_eq!((mine.len(), mine.is_empty()), (32, false));
        conn.read(&mine, 0, 16, table.start()).await?;
        let mut got = [0; 16];
        mine.read(0, &mut got)?;
        assert_eq!(&got, TABLE);
        mine.write(16, b"WXYZ")?;
        conn.write(&mine, 16, 4, table.at(4).unwrap()).await?;
        mine.write_u64(24, 0)?;
        conn.write(&mine, 24, 8, table.at(16).unwrap()).await?;
        let counter = table.at(16).unwrap();
        assert_eq!(conn.fetch_add(&mine, 0, counter, 5).await?, 0);
        assert_eq!(conn.fetch_add(&mine, 0, counter, 5).await?, 5);
        assert_eq!(
            mine.read_u64(0)?,
            5,
            "the old value is left in the local region too"
        );
        assert_eq!(conn.compare_swap(&mine, 8, counter, 3, 99).await?, 10, "no match");
        assert_eq!(conn.compare_swap(&mine, 8, counter, 10, 99).await?, 10, "a match");
        mine.write(0, b"note")?;
        conn.write_with_imm(&mine, 0, 4, table.at(24).unwrap(), 0xBEEF)
            .await?;
        conn.send(b"bye").await?;
        drop(mine);
        assert_eq!(cm.live_resources().mrs, 0, "a dropped region is deregistered");
        conn.disconnect().await?;
        Ok(Vec::new())
    });
    let mut outcomes = sim.run().unwrap_or_else(|e| panic!("{e}")).into_iter();
    let table = outcome(outcomes.next().unwrap()).unwrap();
    outcome(outcomes.next().unwrap()).unwrap();
    assert_eq!(&table[..16], b"0123WXYZ89abcdef");
    assert_eq!(u64::from_ne_bytes(table[16..24].try_into().unwrap()), 99);
    assert_eq!(&table[24..28], b"note");
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_bad_key_is_a_typed_completion_error_and_the_connection_fails_after_it() {
    let f = fabric(2, 1);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.client(0, |ctx| async move {
        let cm = ctx.cm()?;
        let listener = cm.listen(at(), ConnOptions::default())?;
        let table = listener.register(8, Access::LOCAL_WRITE | Access::REMOTE_READ)?;
        let conn = listener
            .request()
            .await?
            .accept_with_private_data(&table.remote().to_bytes())?;
        // The client's failed write moved this QP to ERR too: its receives are flushed.
        let r = conn.recv().await;
        assert!(
            matches!(
                r,
                Err(Error::Completion {
                    status: WcStatus::WrFlushErr
                })
            ),
            "{r:?}"
        );
        let _ = conn.disconnect().await;
        Ok(Vec::new())
    });
    sim.client(1, |ctx| async move {
        let cm = ctx.cm()?;
        let conn = cm.connect(at(), &ConnOptions::default()).await?;
        let table = RemoteMr::from_bytes(conn.peer_private_data()).unwrap();
        let mine = conn.register(8, Access::LOCAL_WRITE)?;
        // The table grants reads only.
        let r = conn.write(&mine, 0, 8, table.start()).await;
        assert_eq!(
            r,
            Err(Error::Completion {
                status: WcStatus::RemAccessErr
            })
        );
        let r = conn.read(&mine, 0, 8, table.start()).await;
        assert_eq!(
            r,
            Err(Error::Completion {
                status: WcStatus::WrFlushErr
            }),
            "the QP is in ERR after the failure"
        );
        assert!(Error::Completion {
            status: WcStatus::RemAccessErr
        }
        .is_transient());
        drop(mine);
        let _ = conn.disconnect().await;
        Ok(Vec::new())
    });
    for o in sim.run().unwrap_or_else(|e| panic!("{e}")) {
        outcome(o).unwrap();
    }
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}

#[test]
fn a_region_needs_a_listener_on_a_device() {
    let f = fabric(3, 0);
    let mut sim: Sim<cm_async::Result<Vec<u8>>> = Sim::new(f.clone());
    sim.client(0, |ctx| async move {
        let cm = ctx.cm()?;
        let wildcard = cm.listen("0.0.0.0:7471".parse().unwrap(), ConnOptions::default())?;
        let r = wildcard.register(8, Access::LOCAL_WRITE);
        assert!(
            matches!(r, Err(Error::Cm(cm_core::CmError::NoDevice { .. }))),
            "{r:?}"
        );
        drop(wildcard);
        let bound = cm.listen(at(), ConnOptions::default())?;
        let region = bound.register(8, Access::LOCAL_WRITE)?;
        assert!(matches!(
            region.write(4, &[0; 8]),
            Err(Error::Cm(cm_core::CmError::InvalidArgument { .. }))
        ));
        assert_eq!(region.remote_at(8).map(|r| r.addr), Some(region.info().addr + 8));
        assert_eq!(region.remote_at(9), None);
        Ok(Vec::new())
    });
    outcome(sim.run().unwrap_or_else(|e| panic!("{e}")).remove(0)).unwrap();
    assert!(f.live_resources().is_clean(), "{:?}", f.live_resources());
}
