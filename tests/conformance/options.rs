//! The per-id options on every backend: `rdma_set_option` (`REUSEADDR`, `AFONLY`, `TOS`,
//! `ACK_TIMEOUT`), `rdma_migrate_id`, synchronous ids, `rdma_getaddrinfo` and `rdma_create_ep`.

use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{
    errno, getaddrinfo, AddrHints, Call, CmBackend, CmError, CmEventType, ConnParam, IdOption, IdState,
    PortSpace, QpCaps, SyncId,
};

use crate::support::*;

/// How long a synchronous id waits for its events in these tests.
const SYNC_WAIT: Duration = WAIT;

#[test]
fn reuseaddr_lets_ids_share_an_address_until_one_of_them_listens() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let b = &mut bed.server;
    let ch = b.create_event_channel().unwrap();
    let [first, second, plain] = [(); 3].map(|()| b.create_id(ch, PortSpace::Tcp).unwrap());
    for id in [first, second] {
        b.set_option(id, IdOption::ReuseAddr(true)).unwrap();
        b.bind_addr(id, addr).unwrap();
    }
    assert_err(
        b.bind_addr(plain, addr),
        CmError::AddrInUse { call: Call::BindAddr },
    );
    // Once bound, reuse may be enabled again but not disabled.
    b.set_option(first, IdOption::ReuseAddr(true)).unwrap();
    let err = b.set_option(first, IdOption::ReuseAddr(false)).unwrap_err();
    assert_eq!(err.errno(), errno::EINVAL, "{err}");
    // A listener needs its address and port to itself.
    assert_err(b.listen(first, 0), CmError::AddrInUse { call: Call::Listen });
    b.destroy_id(second).unwrap();
    b.listen(first, 0).unwrap();
    let err = b.set_option(first, IdOption::ReuseAddr(true)).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::WrongState {
                state: IdState::Listen,
                ..
            }
        ),
        "{err}"
    );
    // Listening cleared the listener's reuse: a reusing id cannot join it any more.
    let late = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.set_option(late, IdOption::ReuseAddr(true)).unwrap();
    assert_err(
        b.bind_addr(late, addr),
        CmError::AddrInUse { call: Call::BindAddr },
    );
    destroy_all(b, &[first, plain, late], ch);
    assert_clean(&bed);
}

#[test]
fn a_reusing_listener_still_takes_connections() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let sch = bed.server.create_event_channel().unwrap();
    let listener = bed.server.create_id(sch, PortSpace::Tcp).unwrap();
    bed.server
        .set_option(listener, IdOption::ReuseAddr(true))
        .unwrap();
    bed.server.bind_addr(listener, addr).unwrap();
    bed.server.listen(listener, 0).unwrap();
    let client = resolved_client(&mut bed, addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let req = expect(&mut bed.server, sch, CmEventType::ConnectRequest);
    bed.server.reject(req.id, b"no").unwrap();
    let rej = expect(&mut bed.client, client.ch, CmEventType::Rejected);
    assert_eq!(&rej.private_data[..2], b"no");
    destroy_all(&mut bed.client, &[client.id], client.ch);
    destroy_all(&mut bed.server, &[req.id, listener], sch);
    assert_clean(&bed);
}

#[test]
fn afonly_is_taken_only_while_the_id_is_idle_or_bound() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let b = &mut bed.server;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.set_option(id, IdOption::AfOnly(true)).unwrap();
    b.bind_addr(id, addr).unwrap();
    b.set_option(id, IdOption::AfOnly(false)).unwrap();
    b.listen(id, 0).unwrap();
    let err = b.set_option(id, IdOption::AfOnly(true)).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::WrongState {
                state: IdState::Listen,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), errno::EINVAL);
    destroy_all(b, &[id], ch);
    assert_clean(&bed);
}

#[test]
fn afonly_lets_an_ipv6_wildcard_share_its_port_with_an_ipv4_wildcard() {
    let mut bed = bed!();
    let port = bed.port();
    let v6_any = SocketAddr::new(std::net::Ipv6Addr::UNSPECIFIED.into(), port);
    let v4_any = SocketAddr::new(std::net::Ipv4Addr::UNSPECIFIED.into(), port);
    let b = &mut bed.server;
    let ch = b.create_event_channel().unwrap();
    for afonly in [None, Some(false), Some(true)] {
        let v6 = b.create_id(ch, PortSpace::Tcp).unwrap();
        let v4 = b.create_id(ch, PortSpace::Tcp).unwrap();
        if let Some(on) = afonly {
            b.set_option(v6, IdOption::AfOnly(on)).unwrap();
        }
        b.bind_addr(v6, v6_any).unwrap();
        let got = b.bind_addr(v4, v4_any);
        if afonly == Some(true) {
            got.unwrap();
        } else {
            // IPv6 ids are not AF-only by default (bindv6only 0): the wildcards conflict.
            assert_eq!(got.unwrap_err().errno(), errno::EADDRNOTAVAIL, "{afonly:?}");
        }
        b.destroy_id(v6).unwrap();
        b.destroy_id(v4).unwrap();
    }
    b.destroy_event_channel(ch).unwrap();
    assert_clean(&bed);
}

#[test]
fn ack_timeout_is_for_connected_ids_and_five_bits() {
    let mut bed = bed!();
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let udp = b.create_id(ch, PortSpace::Udp).unwrap();
    let rc = b.create_id(ch, PortSpace::Tcp).unwrap();
    for (id, t) in [(udp, 14), (rc, 32)] {
        let err = b.set_option(id, IdOption::AckTimeout(t)).unwrap_err();
        assert!(
            matches!(
                err,
                CmError::InvalidArgument {
                    call: Call::SetOption,
                    ..
                }
            ),
            "{err}"
        );
        assert_eq!(err.errno(), errno::EINVAL);
    }
    b.set_option(rc, IdOption::AckTimeout(31)).unwrap();
    b.set_option(udp, IdOption::Tos(0x10)).unwrap();
    destroy_all(b, &[udp, rc], ch);
    assert_clean(&bed);
}

#[test]
fn a_connection_with_tos_and_ack_timeout_set_establishes_and_tears_down() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    bed.server
        .set_option(server.listener, IdOption::Tos(0x20))
        .unwrap();
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let ch = b.create_event_channel().unwrap();
    let id = b.create_id(ch, PortSpace::Tcp).unwrap();
    b.set_option(id, IdOption::Tos(0x20)).unwrap();
    b.set_option(id, IdOption::AckTimeout(16)).unwrap();
    b.resolve_addr(id, Some(src), server.addr, WAIT).unwrap();
    expect(b, ch, CmEventType::AddrResolved);
    b.resolve_route(id, WAIT).unwrap();
    expect(b, ch, CmEventType::RouteResolved);
    b.create_qp(id, QpCaps::new()).unwrap();
    b.connect(id, &ConnParam::new()).unwrap();
    let child = expect(&mut bed.server, server.ch, CmEventType::ConnectRequest).id;
    bed.server.create_qp(child, QpCaps::new()).unwrap();
    bed.server.accept(child, &ConnParam::new()).unwrap();
    expect(&mut bed.client, ch, CmEventType::Established);
    expect(&mut bed.server, server.ch, CmEventType::Established);
    let conn = Conn {
        server,
        client: Client { ch, id },
        child,
    };
    teardown(&mut bed, conn);
}

#[test]
fn migrate_moves_the_ids_unretrieved_events_to_the_new_channel() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let old = b.create_event_channel().unwrap();
    let new = b.create_event_channel().unwrap();
    let id = b.create_id(old, PortSpace::Tcp).unwrap();
    b.resolve_addr(id, Some(src), dst, WAIT).unwrap();
    // ADDR_RESOLVED is queued on the old channel by now, not retrieved.
    let_time_pass(b);
    b.migrate_id(id, new).unwrap();
    expect(b, new, CmEventType::AddrResolved);
    expect_quiet(b, old);
    // Later events come on the new channel too.
    b.resolve_route(id, WAIT).unwrap();
    expect(b, new, CmEventType::RouteResolved);
    assert_err(b.destroy_event_channel(new), CmError::ChannelBusy { ids: 1 });
    b.destroy_event_channel(old).unwrap();
    destroy_all(b, &[id], new);
    assert_clean(&bed);
}

/// The listener moves before the request comes. (A request already queued when the listener
/// moves is lost on rxe, see README item 19; the simulator moves it, in `options_sim.rs`.)
#[test]
fn a_migrated_listener_gets_its_requests_on_the_new_channel() {
    let mut bed = bed!();
    let server = listen(&mut bed, 0);
    let new = bed.server.create_event_channel().unwrap();
    bed.server.migrate_id(server.listener, new).unwrap();
    let client = resolved_client(&mut bed, server.addr, true);
    bed.client.connect(client.id, &ConnParam::new()).unwrap();
    let req = expect(&mut bed.server, new, CmEventType::ConnectRequest);
    assert_eq!(req.listen_id, Some(server.listener));
    expect_quiet(&mut bed.server, server.ch);
    bed.server.reject(req.id, &[]).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Rejected);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    // The child came on the new channel with its request.
    destroy_all(&mut bed.server, &[req.id, server.listener], new);
    bed.server.destroy_event_channel(server.ch).unwrap();
    assert_clean(&bed);
}

#[test]
fn migrate_is_refused_while_a_retrieved_event_is_unacked() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let old = b.create_event_channel().unwrap();
    let new = b.create_event_channel().unwrap();
    let id = b.create_id(old, PortSpace::Tcp).unwrap();
    b.resolve_addr(id, Some(src), dst, WAIT).unwrap();
    let ev = b.get_cm_event(old, WAIT).unwrap().expect("ADDR_RESOLVED");
    let err = b.migrate_id(id, new).unwrap_err();
    assert_eq!(
        err,
        CmError::UnackedEvents {
            call: Call::MigrateId,
            count: 1
        }
    );
    assert_eq!(err.errno(), errno::EBUSY);
    assert!(err.is_guarded_misuse());
    b.ack_cm_event(ev).unwrap();
    b.migrate_id(id, new).unwrap();
    b.destroy_event_channel(old).unwrap();
    destroy_all(b, &[id], new);
    assert_clean(&bed);
}

#[test]
fn create_ep_resolves_a_synchronous_id_and_connecting_without_a_listener_fails_with_econnrefused() {
    let mut bed = bed!();
    let dst = bed.server_addr();
    let hints = AddrHints::default();
    let mut info =
        getaddrinfo(Some(&dst.ip().to_string()), Some(&dst.port().to_string()), &hints).unwrap()[0];
    info.src = Some(SocketAddr::new(bed.client_ip, 0));
    let b = &mut bed.client;
    let mut ep = SyncId::create_ep(b, &info, Some(QpCaps::new()), SYNC_WAIT).unwrap();
    assert_eq!(ep.event().map(|e| e.event()), Some(CmEventType::RouteResolved));
    let m = b.id_machine(ep.id()).unwrap();
    assert_eq!(
        (m.state(), m.unacked()),
        (IdState::RouteResolved, 1),
        "the route's event is kept"
    );
    assert!(m.qp().is_some());
    let err = ep.connect(b, &ConnParam::new()).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::EventFailed {
                call: Call::Connect,
                event: CmEventType::Rejected,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), errno::ECONNREFUSED);
    ep.destroy(b).map_err(|(_, e)| e).unwrap();
    assert_clean(&bed);
}

#[test]
fn a_synchronous_resolution_of_an_unreachable_address_fails_with_its_addr_error() {
    let mut bed = bed!();
    let dst = SocketAddr::new(bed.unreachable_ip, 7);
    let src = SocketAddr::new(bed.client_ip, 0);
    let b = &mut bed.client;
    let mut id = SyncId::create(b, PortSpace::Tcp, SYNC_WAIT).unwrap();
    let err = id
        .resolve_addr(b, Some(src), dst, Duration::from_millis(500))
        .unwrap_err();
    assert_eq!(
        err,
        CmError::EventFailed {
            call: Call::ResolveAddr,
            event: CmEventType::AddrError,
            status: -errno::ETIMEDOUT
        }
    );
    assert_eq!(err.errno(), errno::ETIMEDOUT);
    id.destroy(b).map_err(|(_, e)| e).unwrap();
    assert_clean(&bed);
}

#[test]
fn a_synchronous_listener_hands_out_requests_as_synchronous_children() {
    let mut bed = bed!();
    let addr = bed.server_addr();
    let hints = AddrHints {
        passive: true,
        ..AddrHints::default()
    };
    let info = getaddrinfo(
        Some(&addr.ip().to_string()),
        Some(&addr.port().to_string()),
        &hints,
    )
    .unwrap()[0];
    let mut listener = SyncId::create_ep(&mut bed.server, &info, Some(QpCaps::new()), SYNC_WAIT).unwrap();
    assert_eq!(bed.server.get_local_addr(listener.id()).unwrap(), Some(addr));
    listener.listen(&mut bed.server, 0).unwrap();
    let client = resolved_client(&mut bed, addr, true);
    bed.client
        .connect(client.id, &ConnParam::new().with_private_data(b"sync"))
        .unwrap();
    let mut child = listener.get_request(&mut bed.server).unwrap();
    let req = child.event().expect("the request is kept");
    assert_eq!(req.event(), CmEventType::ConnectRequest);
    assert_eq!(&req.private_data()[..4], b"sync");
    assert_ne!(
        child.channel(),
        listener.channel(),
        "the child has a channel of its own"
    );
    assert!(
        bed.server.id_machine(child.id()).unwrap().qp().is_some(),
        "create_ep's QP capabilities give the child a QP"
    );
    // The passive side's ESTABLISHED needs the RTU, which the client sends when it retrieves
    // its own ESTABLISHED: until then the synchronous accept waits, and only up to its bound.
    child.set_wait(QUIET);
    let err = child.accept(&mut bed.server, &ConnParam::new()).unwrap_err();
    assert!(
        matches!(
            err,
            CmError::EventTimeout {
                call: Call::Accept,
                ..
            }
        ),
        "{err}"
    );
    assert_eq!(err.errno(), errno::ETIMEDOUT);
    expect(&mut bed.client, client.ch, CmEventType::Established);
    child.set_wait(SYNC_WAIT);
    assert_eq!(
        child.next_event(&mut bed.server).unwrap(),
        CmEventType::Established
    );
    bed.client.disconnect(client.id).unwrap();
    assert_eq!(
        child.next_event(&mut bed.server).unwrap(),
        CmEventType::Disconnected
    );
    // Destroying the child answers the client's DREQ.
    child.destroy(&mut bed.server).map_err(|(_, e)| e).unwrap();
    expect(&mut bed.client, client.ch, CmEventType::Disconnected);
    destroy_all(&mut bed.client, &[client.id], client.ch);
    listener.destroy(&mut bed.server).map_err(|(_, e)| e).unwrap();
    assert_clean(&bed);
}
