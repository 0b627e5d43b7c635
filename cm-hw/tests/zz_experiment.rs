//! Temporary experiment.
use cm_core::*;
use cm_hw::HwBackend;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

fn next(hw: &mut HwBackend, ch: ChannelHandle, t: Duration) -> Option<(CmEventType, i32, IdHandle, usize)> {
    let ev = hw.get_cm_event(ch, t).unwrap()?;
    let r = (ev.event(), ev.status(), ev.id(), ev.private_data().len());
    hw.ack_cm_event(ev).unwrap();
    Some(r)
}

#[test]
fn experiment() {
    if cm_hw::probe().is_err() {
        return;
    }
    let ip: std::net::IpAddr = std::env::var("CM_HW_ADDR").unwrap().parse().unwrap();
    let mut hw = HwBackend::new().unwrap();
    let t = Duration::from_secs(10);
    // 1. connect to a port nobody listens on
    let cch = hw.create_event_channel().unwrap();
    let c = hw.create_id(cch, PortSpace::Tcp).unwrap();
    hw.resolve_addr(c, None, SocketAddr::new(ip, 9), t).unwrap();
    println!("EXP no-listener: {:?}", next(&mut hw, cch, t));
    hw.resolve_route(c, t).unwrap();
    println!("EXP no-listener: {:?}", next(&mut hw, cch, t));
    hw.create_qp(c, QpCaps::new()).unwrap();
    hw.connect(c, &ConnParam::new()).unwrap();
    let s = Instant::now();
    println!(
        "EXP no-listener connect: {:?} after {:?}",
        next(&mut hw, cch, t),
        s.elapsed()
    );
    println!("EXP machine {:?}", hw.id_machine(c).unwrap());
    hw.destroy_qp(c).unwrap();
    hw.destroy_id(c).unwrap();

    // 2. connection, both disconnect, wait for TIMEWAIT_EXIT
    let sch = hw.create_event_channel().unwrap();
    let l = hw.create_id(sch, PortSpace::Tcp).unwrap();
    hw.bind_addr(l, SocketAddr::new(ip, 0)).unwrap();
    hw.listen(l, 4).unwrap();
    let server = hw.get_local_addr(l).unwrap().unwrap();
    let mk = |hw: &mut HwBackend| {
        let c = hw.create_id(cch, PortSpace::Tcp).unwrap();
        hw.resolve_addr(c, None, server, t).unwrap();
        next(hw, cch, t).unwrap();
        hw.resolve_route(c, t).unwrap();
        next(hw, cch, t).unwrap();
        hw.create_qp(c, QpCaps::new()).unwrap();
        hw.connect(c, &ConnParam::new()).unwrap();
        let (ty, _, child, len) = next(hw, sch, t).unwrap();
        println!("EXP req {ty} len {len}");
        hw.create_qp(child, QpCaps::new()).unwrap();
        hw.accept(child, &ConnParam::new()).unwrap();
        println!("EXP {:?}", next(hw, cch, t));
        println!("EXP {:?}", next(hw, sch, t));
        (c, child)
    };
    let (c, child) = mk(&mut hw);
    hw.disconnect(c).unwrap();
    println!("EXP srv {:?}", next(&mut hw, sch, t));
    hw.disconnect(child).unwrap();
    println!("EXP cli {:?}", next(&mut hw, cch, t));
    let s = Instant::now();
    println!(
        "EXP cli {:?} after {:?}",
        next(&mut hw, cch, Duration::from_secs(30)),
        s.elapsed()
    );
    println!(
        "EXP srv {:?} after {:?}",
        next(&mut hw, sch, Duration::from_secs(30)),
        s.elapsed()
    );
    for id in [c, child] {
        hw.destroy_qp(id).unwrap();
        hw.destroy_id(id).unwrap();
    }

    // 3. destroy a connected id without disconnecting: what does the peer see?
    let (c, child) = mk(&mut hw);
    hw.destroy_qp(child).unwrap();
    hw.destroy_id(child).unwrap();
    let s = Instant::now();
    println!(
        "EXP after server destroy, client: {:?} after {:?}",
        next(&mut hw, cch, t),
        s.elapsed()
    );
    println!("EXP then: {:?}", next(&mut hw, cch, Duration::from_secs(1)));
    // 4. disconnect after DISCONNECTED received
    println!("EXP disconnect after peer gone: {:?}", hw.disconnect(c));
    println!("EXP then: {:?}", next(&mut hw, cch, Duration::from_secs(30)));
    // 5. active disconnect while peer never answers (peer not destroyed): DREQ timeout
    let (c2, child2) = mk(&mut hw);
    hw.disconnect(c2).unwrap();
    println!("EXP srv {:?}", next(&mut hw, sch, t));
    let s = Instant::now();
    println!(
        "EXP cli without peer disconnect: {:?} after {:?}",
        next(&mut hw, cch, Duration::from_secs(60)),
        s.elapsed()
    );
    let _ = (child2, c);
}
