//! Memory regions: registration's checks, keys and addresses, handles, the bytes behind a
//! region (owned or the caller's), and what crashes and device removal leave.

use std::cell::RefCell;
use std::rc::Rc;
use std::time::Duration;

use cm_core::{Access, Call, CmBackend, CmError, HandleKind, PortSpace, QpState, Sge, WcStatus};
use cm_sim::{Fault, RegionMemory};

use crate::support::*;

#[test]
fn registration_needs_a_device_valid_flags_and_a_length_the_device_allows() {
    let fabric = builder(80).max_mr_size(1024).build();
    let mut h = fabric.host(0);
    let ch = h.create_event_channel().unwrap();
    let id = h.create_id(ch, PortSpace::Tcp).unwrap();
    assert_eq!(
        h.reg_mr(id, 8, Access::LOCAL_WRITE),
        Err(CmError::NoDevice { call: Call::RegMr })
    );
    h.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap();
    let invalid = |r: cm_core::Result<cm_core::MrHandle>| {
        matches!(
            r,
            Err(CmError::InvalidArgument {
                call: Call::RegMr,
                ..
            })
        )
    };
    assert!(invalid(h.reg_mr(id, 0, Access::LOCAL_WRITE)));
    assert!(invalid(h.reg_mr(id, 1025, Access::LOCAL_WRITE)));
    assert!(
        invalid(h.reg_mr(id, 8, Access::REMOTE_WRITE)),
        "remote write needs local write"
    );
    let mr = h.reg_mr(id, 1024, Access::ALL).unwrap();
    assert_eq!(h.live_resources().mrs, 1);
    assert!(!h.live_resources().is_clean());
    // The region outlives its id.
    h.destroy_id(id).unwrap();
    h.write_mr(mr, 1020, b"tail").unwrap();
    assert_eq!(read_mr(&h, mr, 1020, 4), b"tail");
    h.dereg_mr(mr).unwrap();
    h.destroy_event_channel(ch).unwrap();
    assert!(h.live_resources().is_clean());
}

#[test]
fn keys_and_addresses_follow_rxes_layout_and_are_never_reused() {
    let mut p = connect(81);
    let a = p.b_mr(100, Access::ALL);
    let b = p.b_mr(5000, Access::LOCAL_WRITE | Access::REMOTE_READ);
    let local = p.b_mr(8, Access::LOCAL_WRITE);
    let (ia, ib, il) = (
        p.b.mr_info(a).unwrap(),
        p.b.mr_info(b).unwrap(),
        p.b.mr_info(local).unwrap(),
    );
    for info in [ia, ib, il] {
        assert_eq!(info.addr % 4096, 0, "page-aligned: {info:?}");
    }
    assert_eq!(
        (ia.len, ia.access, ia.lkey, ia.rkey),
        (100, Access::ALL, ia.rkey, ia.lkey)
    );
    assert_eq!(ib.addr, ia.addr + 4096, "the next page after a one-page region");
    assert_eq!(il.addr, ib.addr + 8192);
    assert_eq!(il.rkey, 0, "no remote access, no remote key");
    assert!(ia.lkey != ib.lkey && ib.lkey != il.lkey);
    p.b.dereg_mr(b).unwrap();
    let again = p.b_mr(5000, Access::ALL);
    let ia2 = p.b.mr_info(again).unwrap();
    assert!(ia2.addr > il.addr, "a freed address is not given again");
    assert_eq!(ia2.rkey >> 8, ib.rkey >> 8, "the same slot...");
    assert_ne!(ia2.rkey, ib.rkey, "...with another generation");
}

#[test]
fn stale_foreign_and_forged_region_handles_are_unknown() {
    let mut p = connect(82);
    let mine = p.a_mr(8, Access::LOCAL_WRITE);
    let theirs = p.b_mr(8, Access::LOCAL_WRITE);
    let gone = p.a_mr(8, Access::LOCAL_WRITE);
    p.a.dereg_mr(gone).unwrap();
    let forged = cm_core::backend::mr_handle(p.a_id.owner(), mine.index(), mine.generation() + 1);
    for mr in [theirs, gone, forged] {
        let unknown = |call| CmError::UnknownHandle {
            call,
            kind: HandleKind::Mr,
        };
        assert_eq!(p.a.mr_info(mr), Err(unknown(Call::RegMr)), "{mr}");
        assert_eq!(p.a.read_mr(mr, 0, &mut [0; 1]), Err(unknown(Call::ReadMr)));
        assert_eq!(p.a.write_mr(mr, 0, &[1]), Err(unknown(Call::WriteMr)));
        assert_eq!(p.a.dereg_mr(mr), Err(unknown(Call::DeregMr)));
    }
    let outside = |r: cm_core::Result<()>| {
        matches!(
            r,
            Err(CmError::InvalidArgument {
                reason: "range outside the memory region",
                ..
            })
        )
    };
    assert!(outside(p.a.read_mr(mine, 1, &mut [0; 8])));
    assert!(outside(p.a.write_mr(mine, u64::MAX, &[1])));
    assert_eq!(p.a.write_mr(mine, 8, &[]), Ok(()), "an empty range at the end");
}

/// What was done to a region: (call, offset, length) each time.
type Log = Rc<RefCell<Vec<(&'static str, u64, usize)>>>;

/// Bytes the test owns, registered with `reg_mr_with`: every call is recorded.
struct Recorded {
    bytes: Rc<RefCell<Vec<u8>>>,
    log: Log,
}

impl RegionMemory for Recorded {
    fn len(&self) -> u64 {
        self.bytes.borrow().len() as u64
    }

    fn read(&self, offset: u64, out: &mut [u8]) {
        self.log.borrow_mut().push(("read", offset, out.len()));
        let at = offset as usize;
        out.copy_from_slice(&self.bytes.borrow()[at..at + out.len()]);
    }

    fn write(&mut self, offset: u64, data: &[u8]) {
        self.log.borrow_mut().push(("write", offset, data.len()));
        let at = offset as usize;
        self.bytes.borrow_mut()[at..at + data.len()].copy_from_slice(data);
    }
}

#[test]
fn a_region_of_the_callers_own_memory_serves_peers_and_local_work_through_its_accessor() {
    let mut p = connect(83);
    let bytes = Rc::new(RefCell::new(b"remote table....".to_vec()));
    let log = Rc::new(RefCell::new(Vec::new()));
    let memory = Recorded {
        bytes: bytes.clone(),
        log: log.clone(),
    };
    let mr = p.b.reg_mr_with(p.b_id, Box::new(memory), Access::ALL).unwrap();
    let info = p.b.mr_info(mr).unwrap();
    assert_eq!(info.len, 16);
    let local = p.a_mr(8, Access::LOCAL_WRITE);
    p.a.write_mr(local, 0, b"TABLE!!!").unwrap();
    p.post_a(&read(1, remote(&info, 0), &[Sge::new(local, 0, 6)]));
    p.post_a(&write(2, remote(&info, 7), &[Sge::new(local, 0, 5)]));
    p.poll_a(2);
    assert_eq!(read_mr(&p.a, local, 0, 8), b"remote!!");
    assert_eq!(&bytes.borrow()[..], b"remote TABLE....");
    assert_eq!(*log.borrow(), [("read", 0, 6), ("write", 7, 5)]);
    // A zero-length registration is refused.
    let empty = Recorded {
        bytes: Rc::new(RefCell::new(Vec::new())),
        log,
    };
    assert!(empty.is_empty());
    assert!(matches!(
        p.b.reg_mr_with(p.b_id, Box::new(empty), Access::ALL),
        Err(CmError::InvalidArgument {
            call: Call::RegMr,
            ..
        })
    ));
}

#[test]
fn a_crash_takes_the_hosts_regions_srqs_and_events_and_a_restart_knows_none_of_them() {
    let mut p = connect(84);
    let mr = p.b_mr(8, Access::ALL);
    let srq =
        p.b.create_srq(p.b_id, cm_core::SrqCaps::new().with_limit(1))
            .unwrap();
    p.b.post_srq_recv(srq, 1, 8).unwrap();
    let before = p.b.live_resources();
    assert_eq!((before.mrs, before.srqs), (1, 1));
    p.fabric.inject(Fault::Crash { host: 0 });
    p.fabric.inject(Fault::Restart { host: 0 });
    let after = p.b.live_resources();
    assert_eq!((after.mrs, after.srqs), (0, 0));
    assert_eq!(
        p.b.mr_info(mr),
        Err(CmError::UnknownHandle {
            call: Call::RegMr,
            kind: HandleKind::Mr
        })
    );
    assert_eq!(
        p.b.destroy_srq(srq),
        Err(CmError::UnknownHandle {
            call: Call::DestroySrq,
            kind: HandleKind::Srq
        })
    );
    // A new region in the restarted host does not answer to the old handle.
    let ch = p.b.create_event_channel().unwrap();
    let id = p.b.create_id(ch, PortSpace::Tcp).unwrap();
    p.b.bind_addr(id, "10.0.0.1:0".parse().unwrap()).unwrap();
    let fresh = p.b.reg_mr(id, 8, Access::ALL).unwrap();
    assert_ne!(fresh, mr);
    assert!(p.b.mr_info(mr).is_err());
    assert_eq!(p.b.get_async_event(Duration::ZERO).unwrap(), None);
    // While down, every call says so.
    p.fabric.inject(Fault::Crash { host: 0 });
    assert!(matches!(p.b.mr_info(fresh), Err(CmError::HostCrashed { .. })));
    assert!(matches!(
        p.b.get_async_event(Duration::ZERO),
        Err(CmError::HostCrashed { .. })
    ));
}

#[test]
fn a_region_of_a_removed_device_serves_no_qp_of_the_device_that_came_back() {
    let mut p = connect(85);
    let old = p.b_mr(8, Access::ALL);
    let old_info = p.b.mr_info(old).unwrap();
    let old_srq = p.b.create_srq(p.b_id, cm_core::SrqCaps::new()).unwrap();
    p.fabric.inject(Fault::RemoveDevice { host: 0 });
    p.fabric.inject(Fault::RestoreDevice { host: 0 });
    // The old ids are dead; a new connection to the restored device.
    let b_ch = p.b.create_event_channel().unwrap();
    let listener = p.b.create_id(b_ch, PortSpace::Tcp).unwrap();
    p.b.bind_addr(listener, "10.0.0.1:7472".parse().unwrap()).unwrap();
    p.b.listen(listener, 0).unwrap();
    let a_id = p.a.create_id(p.a_ch, PortSpace::Tcp).unwrap();
    p.a.resolve_addr(a_id, None, "10.0.0.1:7472".parse().unwrap(), WAIT)
        .unwrap();
    // Events of the old connection first (its peer went with the device).
    loop {
        let ev = p.a.get_cm_event(p.a_ch, WAIT).unwrap().expect("an event");
        let done = ev.event() == cm_core::CmEventType::AddrResolved;
        p.a.ack_cm_event(ev).unwrap();
        if done {
            break;
        }
    }
    p.a.resolve_route(a_id, WAIT).unwrap();
    expect(&mut p.a, p.a_ch, cm_core::CmEventType::RouteResolved);
    p.a.create_qp(a_id, Setup::default().caps).unwrap();
    p.a.connect(a_id, &cm_core::ConnParam::new()).unwrap();
    let child = expect(&mut p.b, b_ch, cm_core::CmEventType::ConnectRequest);
    assert_eq!(
        p.b.create_qp_on_srq(child, cm_core::QpCaps::new(), old_srq),
        Err(CmError::InvalidArgument {
            call: Call::CreateQp,
            reason: "shared receive queue of another device"
        })
    );
    p.b.create_qp(child, cm_core::QpCaps::new()).unwrap();
    p.b.accept(child, &cm_core::ConnParam::new()).unwrap();
    expect(&mut p.a, p.a_ch, cm_core::CmEventType::Established);
    expect(&mut p.b, b_ch, cm_core::CmEventType::Established);
    // The old region is still the application's to read and deregister...
    assert_eq!(read_mr(&p.b, old, 0, 8), [0; 8]);
    // ...but no QP of the new device names it, locally or through its key.
    let r = p.b.post_send_wr(
        child,
        &write(1, old_info.remote().start(), &[Sge::new(old, 0, 8)]),
    );
    assert!(
        matches!(
            r,
            Err(CmError::InvalidArgument {
                reason: "memory region registered on another device",
                ..
            })
        ),
        "{r:?}"
    );
    let src = p.a.reg_mr(a_id, 8, Access::NONE).unwrap();
    p.a.post_send_wr(a_id, &write(2, old_info.remote().start(), &[Sge::new(src, 0, 8)]))
        .unwrap();
    let wcs = poll(&mut p.a, a_id, 1);
    assert_eq!(wcs[0].status, WcStatus::RemAccessErr);
    assert_eq!(p.b.id_machine(child).unwrap().qp(), Some(QpState::Err));
    p.b.dereg_mr(old).unwrap();
}
