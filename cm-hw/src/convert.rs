//! Pure conversions between librdmacm's raw values and `cm_core`'s types (no `unsafe`, no I/O).

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};
use std::time::{Duration, Instant};

use cm_core::{errno, Call, CmError, ConnParam, PrivateData};

/// What a librdmacm or verbs failure with `errno` in `call` becomes: `EADDRINUSE` and
/// `EADDRNOTAVAIL` get their own variants (the simulator returns those), `ENODEV` from
/// `rdma_create_event_channel` is [`CmError::NoRdmaDevice`], everything else is
/// [`CmError::Os`].
pub(crate) fn os_error(call: Call, errno: i32) -> CmError {
    match errno {
        errno::EADDRINUSE => CmError::AddrInUse { call },
        errno::EADDRNOTAVAIL => CmError::AddrNotAvailable { call },
        errno::ENODEV if call == Call::CreateEventChannel => CmError::NoRdmaDevice,
        _ => CmError::Os { call, errno },
    }
}

/// A duration as librdmacm's and poll(2)'s `int` milliseconds: rounded up (so a short wait is
/// not turned into a busy loop) and clamped to `i32::MAX`.
pub(crate) fn millis_ceil(d: Duration) -> i32 {
    let ms = d.as_nanos().div_ceil(1_000_000);
    i32::try_from(ms).unwrap_or(i32::MAX)
}

/// The instant `timeout` from `now`; a timeout too large to represent waits about a year, which
/// is still a bound.
pub(crate) fn deadline(now: Instant, timeout: Duration) -> Instant {
    now.checked_add(timeout)
        .or_else(|| now.checked_add(Duration::from_secs(365 * 24 * 3600)))
        .unwrap_or(now)
}

/// A wait's bound whose clock is read only once the wait has to wait: a call that finds its
/// answer at once, or whose timeout is zero, reads no clock (each read is a system call where
/// the clock source has no vDSO, as under emulation). The deadline counts from the first
/// look that found nothing.
pub(crate) struct Bound {
    timeout: Duration,
    deadline: Option<Instant>,
}

impl Bound {
    pub(crate) fn new(timeout: Duration) -> Bound {
        Bound {
            timeout,
            deadline: None,
        }
    }

    /// What is left of the wait; `None` once it is over (at once for a zero timeout).
    pub(crate) fn left(&mut self) -> Option<Duration> {
        if self.timeout.is_zero() {
            return None;
        }
        let now = Instant::now();
        let at = *self.deadline.get_or_insert_with(|| deadline(now, self.timeout));
        at.checked_duration_since(now).filter(|d| !d.is_zero())
    }
}

/// A socket address in the C layout librdmacm takes.
pub(crate) enum RawSockAddr {
    /// `struct sockaddr_in`.
    V4(libc::sockaddr_in),
    /// `struct sockaddr_in6`.
    V6(libc::sockaddr_in6),
}

impl From<SocketAddr> for RawSockAddr {
    fn from(addr: SocketAddr) -> Self {
        match addr {
            SocketAddr::V4(a) => RawSockAddr::V4(libc::sockaddr_in {
                sin_family: libc::AF_INET as libc::sa_family_t,
                sin_port: a.port().to_be(),
                sin_addr: libc::in_addr {
                    s_addr: u32::from_ne_bytes(a.ip().octets()),
                },
                sin_zero: [0; 8],
            }),
            SocketAddr::V6(a) => RawSockAddr::V6(libc::sockaddr_in6 {
                sin6_family: libc::AF_INET6 as libc::sa_family_t,
                sin6_port: a.port().to_be(),
                sin6_flowinfo: a.flowinfo().to_be(),
                sin6_addr: libc::in6_addr {
                    s6_addr: a.ip().octets(),
                },
                sin6_scope_id: a.scope_id(),
            }),
        }
    }
}

/// `struct sockaddr_in` to a `SocketAddr`.
pub(crate) fn sockaddr_in_to_std(sin: &libc::sockaddr_in) -> SocketAddr {
    let ip = Ipv4Addr::from(sin.sin_addr.s_addr.to_ne_bytes());
    SocketAddr::V4(SocketAddrV4::new(ip, u16::from_be(sin.sin_port)))
}

/// `struct sockaddr_in6` to a `SocketAddr`.
pub(crate) fn sockaddr_in6_to_std(sin6: &libc::sockaddr_in6) -> SocketAddr {
    SocketAddr::V6(SocketAddrV6::new(
        Ipv6Addr::from(sin6.sin6_addr.s6_addr),
        u16::from_be(sin6.sin6_port),
        u32::from_be(sin6.sin6_flowinfo),
        sin6.sin6_scope_id,
    ))
}

/// An address read from `id->route.addr` as the trait reports it: an all-zero address with port
/// 0 is what an id that never had that address holds, so it is `None`.
pub(crate) fn reported_addr(addr: Option<SocketAddr>) -> Option<SocketAddr> {
    addr.filter(|a| !(a.ip().is_unspecified() && a.port() == 0))
}

/// `param.conn` of an event: `fields` are responder resources, initiator depth, flow control,
/// retry count, RNR retry count and srq, in the C order.
pub(crate) fn conn_param_from_conn(private: &[u8], fields: [u8; 6], qp_num: u32) -> ConnParam {
    let [responder_resources, initiator_depth, flow_control, retry_count, rnr_retry_count, srq] = fields;
    ConnParam {
        private_data: PrivateData::new(private),
        responder_resources,
        initiator_depth,
        flow_control,
        retry_count,
        rnr_retry_count,
        srq: srq != 0,
        qp_num,
    }
}

/// `param.ud` of an event (datagram port spaces): private data and remote QP number; the
/// connection-only fields are 0.
pub(crate) fn conn_param_from_ud(private: &[u8], qp_num: u32) -> ConnParam {
    ConnParam {
        private_data: PrivateData::new(private),
        qp_num,
        ..ConnParam::ZERO
    }
}

/// Event tokens: the backend's tag in the top 24 bits, a sequence number below, so that an
/// event of one backend never matches a token of another.
pub(crate) fn event_token(tag: u32, seq: u64) -> u64 {
    (u64::from(tag & 0xFF_FFFF) << 40) | (seq & ((1 << 40) - 1))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errno_mapping() {
        assert_eq!(
            os_error(Call::BindAddr, libc::EADDRINUSE),
            CmError::AddrInUse { call: Call::BindAddr }
        );
        assert_eq!(
            os_error(Call::ResolveAddr, libc::EADDRNOTAVAIL),
            CmError::AddrNotAvailable {
                call: Call::ResolveAddr
            }
        );
        assert_eq!(
            os_error(Call::CreateEventChannel, libc::ENODEV),
            CmError::NoRdmaDevice
        );
        assert_eq!(
            os_error(Call::BindAddr, libc::ENODEV),
            CmError::Os {
                call: Call::BindAddr,
                errno: libc::ENODEV
            }
        );
        let e = os_error(Call::Connect, libc::ETIMEDOUT);
        assert_eq!(e.errno(), libc::ETIMEDOUT);
        assert!(e.to_string().starts_with("rdma_connect: "), "{e}");
    }

    #[test]
    fn cm_core_errnos_are_linux_errnos() {
        // cm-core hard-codes Linux numbers; the backend passes libc's through.
        assert_eq!(errno::EADDRINUSE, libc::EADDRINUSE);
        assert_eq!(errno::EADDRNOTAVAIL, libc::EADDRNOTAVAIL);
        assert_eq!(errno::ENODEV, libc::ENODEV);
        assert_eq!(errno::EINVAL, libc::EINVAL);
        assert_eq!(errno::EBUSY, libc::EBUSY);
        assert_eq!(errno::ENOMEM, libc::ENOMEM);
        assert_eq!(errno::ETIMEDOUT, libc::ETIMEDOUT);
        assert_eq!(errno::ECONNREFUSED, libc::ECONNREFUSED);
    }

    #[test]
    fn millis_round_up_and_clamp() {
        assert_eq!(millis_ceil(Duration::ZERO), 0);
        assert_eq!(millis_ceil(Duration::from_nanos(1)), 1);
        assert_eq!(millis_ceil(Duration::from_millis(2000)), 2000);
        assert_eq!(millis_ceil(Duration::from_micros(2001)), 3);
        assert_eq!(millis_ceil(Duration::MAX), i32::MAX);
    }

    #[test]
    fn deadlines_are_always_bounded() {
        let now = Instant::now();
        assert_eq!(
            deadline(now, Duration::from_secs(1)),
            now + Duration::from_secs(1)
        );
        let far = deadline(now, Duration::MAX);
        assert!(far > now);
    }

    #[test]
    fn a_bound_ends_at_once_for_a_zero_timeout_and_after_its_timeout_otherwise() {
        assert_eq!(Bound::new(Duration::ZERO).left(), None);
        let mut b = Bound::new(Duration::from_millis(20));
        let first = b.left().expect("a wait starts with its timeout left");
        assert!(first <= Duration::from_millis(20));
        std::thread::sleep(Duration::from_millis(25));
        assert_eq!(b.left(), None);
        let mut forever = Bound::new(Duration::MAX);
        assert!(forever.left().is_some());
    }

    #[test]
    fn socket_addresses_round_trip() {
        let v4: SocketAddr = "10.0.0.1:7471".parse().unwrap();
        let RawSockAddr::V4(sin) = RawSockAddr::from(v4) else {
            panic!("v4")
        };
        assert_eq!(i32::from(sin.sin_family), libc::AF_INET);
        assert_eq!(sin.sin_port, 7471u16.to_be());
        assert_eq!(sin.sin_addr.s_addr.to_ne_bytes(), [10, 0, 0, 1]);
        assert_eq!(sockaddr_in_to_std(&sin), v4);

        let v6: SocketAddr = "[fe80::1%3]:18515".parse().unwrap();
        let RawSockAddr::V6(sin6) = RawSockAddr::from(v6) else {
            panic!("v6")
        };
        assert_eq!(i32::from(sin6.sin6_family), libc::AF_INET6);
        assert_eq!(sin6.sin6_scope_id, 3);
        assert_eq!(sockaddr_in6_to_std(&sin6), v6);
    }

    #[test]
    fn unset_addresses_are_none() {
        assert_eq!(reported_addr(None), None);
        assert_eq!(reported_addr(Some("0.0.0.0:0".parse().unwrap())), None);
        assert_eq!(reported_addr(Some("[::]:0".parse().unwrap())), None);
        let wildcard_bound: SocketAddr = "0.0.0.0:7471".parse().unwrap();
        assert_eq!(reported_addr(Some(wildcard_bound)), Some(wildcard_bound));
    }

    #[test]
    fn conn_params_from_events() {
        let p = conn_param_from_conn(b"hello", [4, 5, 1, 7, 6, 1], 0x1234);
        assert_eq!(p.private_data.as_slice(), b"hello");
        assert_eq!(
            (
                p.responder_resources,
                p.initiator_depth,
                p.flow_control,
                p.retry_count,
                p.rnr_retry_count
            ),
            (4, 5, 1, 7, 6)
        );
        assert!(p.srq);
        assert_eq!(p.qp_num, 0x1234);
        let none = conn_param_from_conn(&[], [0; 6], 0);
        assert!(none.private_data.is_empty());
        let ud = conn_param_from_ud(&[1, 2, 3], 99);
        assert_eq!(ud.private_data.as_slice(), &[1, 2, 3]);
        assert_eq!(ud.qp_num, 99);
        assert_eq!(ud.responder_resources, 0);
    }

    #[test]
    fn tokens_carry_the_tag() {
        assert_ne!(event_token(1, 5), event_token(2, 5));
        assert_ne!(event_token(1, 5), event_token(1, 6));
        assert_eq!(event_token(3, 7) >> 40, 3);
    }
}
