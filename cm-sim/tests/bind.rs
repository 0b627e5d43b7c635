//! `rdma_bind_addr` of a loopback address, as Linux 6.1's cma takes it: like the wildcard
//! (`cma_any_addr` is true for both), with no device and its port the host's on every address.

use cm_core::{errno, CmBackend, PortSpace};
use cm_sim::SimFabric;

#[test]
fn a_loopback_bind_is_a_wildcard_bind_that_keeps_its_address() {
    // libfabric's verbs provider binds `localhost` when it is given no address.
    let f = SimFabric::builder().seed(7).host("10.0.0.1").build();
    let mut h = f.host(0);
    let ch = h.create_event_channel().unwrap();
    for (addr, port) in [("127.0.0.1", 7471), ("::1", 7472)] {
        let lo = std::net::SocketAddr::new(addr.parse().unwrap(), port);
        let id = h.create_id(ch, PortSpace::Tcp).unwrap();
        h.bind_addr(id, lo).unwrap();
        assert_eq!(h.get_local_addr(id).unwrap(), Some(lo));
        // The port is taken on the host's address too, as a wildcard's is.
        let other = h.create_id(ch, PortSpace::Tcp).unwrap();
        let here = std::net::SocketAddr::new("10.0.0.1".parse().unwrap(), port);
        let err = h.bind_addr(other, here).unwrap_err();
        assert_eq!(err.errno(), errno::EADDRNOTAVAIL, "{addr}: {err}");
    }
}
