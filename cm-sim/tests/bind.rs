//! `rdma_bind_addr`'s answers for addresses that are local but carried by no RDMA device, as
//! Linux 6.1's `cma_acquire_dev_by_src_ip` gives them.

use cm_core::{errno, CmBackend, PortSpace};
use cm_sim::SimFabric;

#[test]
fn a_loopback_address_is_local_but_no_rdma_device_carries_it() {
    // The kernel finds `lo` for it, and no GID of any RDMA port is on `lo`: ENODEV, where an
    // address of no interface is EADDRNOTAVAIL. libfabric's verbs provider binds `localhost`
    // when given no address.
    let f = SimFabric::builder().seed(7).host("10.0.0.1").build();
    let mut h = f.host(0);
    let ch = h.create_event_channel().unwrap();
    for addr in ["127.0.0.1:0", "127.0.0.2:7471", "[::1]:0"] {
        let id = h.create_id(ch, PortSpace::Tcp).unwrap();
        let err = h.bind_addr(id, addr.parse().unwrap()).unwrap_err();
        assert_eq!(err.errno(), errno::ENODEV, "{addr}: {err}");
    }
    let id = h.create_id(ch, PortSpace::Tcp).unwrap();
    let err = h.bind_addr(id, "10.0.0.9:0".parse().unwrap()).unwrap_err();
    assert_eq!(err.errno(), errno::EADDRNOTAVAIL, "{err}");
}
