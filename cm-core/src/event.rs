//! Connection-manager events (`struct rdma_cm_event`) and connection parameters.

use std::fmt;
use std::num::NonZeroUsize;

use crate::datagram::UdParam;
use crate::handle::IdHandle;

/// The event types of `enum rdma_cm_event_type`, with rdma-core's numeric values: the sixteen
/// of rdma-core v44 and the four newer ones (`ADDRINFO_RESOLVED`, `ADDRINFO_ERROR`, `USER`,
/// `INTERNAL`).
///
/// librdmacm still grows this enum, so it is `#[non_exhaustive]`, and a number this crate does
/// not know (from a newer librdmacm) is kept as [`CmEventType::Unknown`] rather than dropped.
///
/// `Display` prints the name `rdma_event_str` prints (`RDMA_CM_EVENT_ADDR_RESOLVED`, ...); for an
/// unknown number it adds the number to `rdma_event_str`'s `UNKNOWN EVENT`.
///
/// ```
/// use cm_core::CmEventType;
///
/// assert_eq!(CmEventType::from(9), CmEventType::Established);
/// assert_eq!(CmEventType::from(18), CmEventType::User);
/// let newer = CmEventType::from(42);
/// assert_eq!(newer, CmEventType::Unknown(42));
/// assert_eq!(newer.raw(), 42);
/// assert_eq!(newer.to_string(), "UNKNOWN EVENT (42)");
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CmEventType {
    /// Address resolution finished; the id now has a device (0).
    AddrResolved,
    /// Address resolution failed or timed out (status is a negative errno) (1).
    AddrError,
    /// Route resolution finished (2).
    RouteResolved,
    /// Route resolution failed (3).
    RouteError,
    /// A connection request arrived on a listener; the event's id is the new child id (4).
    ConnectRequest,
    /// A reply arrived on an id without a QP (the application must establish by itself) (5).
    ConnectResponse,
    /// Establishing the connection failed locally (6).
    ConnectError,
    /// The remote end did not answer (status is `-ETIMEDOUT` or a SIDR status) (7).
    Unreachable,
    /// The remote end rejected the connection (status is the IB CM reject reason) (8).
    Rejected,
    /// The connection is established (9).
    Established,
    /// The connection is disconnected (10).
    Disconnected,
    /// The RDMA device went away; only `rdma_destroy_id` is legal afterwards (11).
    DeviceRemoval,
    /// A multicast join finished (12).
    MulticastJoin,
    /// A multicast join failed or the group was lost (13).
    MulticastError,
    /// The address of the bound net device changed (bonding fail-over) (14).
    AddrChange,
    /// The IB CM timewait period after a disconnect has ended (15).
    TimewaitExit,
    /// `rdma_resolve_addrinfo` finished (16; rdma-core after v44).
    AddrinfoResolved,
    /// `rdma_resolve_addrinfo` failed (17; rdma-core after v44).
    AddrinfoError,
    /// An event the application queued itself with `rdma_write_cm_event` (18; rdma-core after
    /// v44).
    User,
    /// librdmacm's internal step of address-info resolution, never handed out by librdmacm
    /// itself (19; rdma-core after v44).
    Internal,
    /// A number this crate does not know, from a newer librdmacm; handed out rather than dropped
    /// so that the application can still ack it and log it.
    Unknown(u32),
}

impl CmEventType {
    /// Every event type this crate knows, in numeric order (without [`CmEventType::Unknown`]).
    pub const ALL: [CmEventType; 20] = [
        CmEventType::AddrResolved,
        CmEventType::AddrError,
        CmEventType::RouteResolved,
        CmEventType::RouteError,
        CmEventType::ConnectRequest,
        CmEventType::ConnectResponse,
        CmEventType::ConnectError,
        CmEventType::Unreachable,
        CmEventType::Rejected,
        CmEventType::Established,
        CmEventType::Disconnected,
        CmEventType::DeviceRemoval,
        CmEventType::MulticastJoin,
        CmEventType::MulticastError,
        CmEventType::AddrChange,
        CmEventType::TimewaitExit,
        CmEventType::AddrinfoResolved,
        CmEventType::AddrinfoError,
        CmEventType::User,
        CmEventType::Internal,
    ];

    /// The known event type with librdmacm's numeric value `value`, if this crate knows it; see
    /// `From<u32>` for a conversion that keeps unknown numbers.
    pub fn from_raw(value: u32) -> Option<Self> {
        Self::ALL.get(value as usize).copied()
    }

    /// librdmacm's numeric value.
    pub const fn raw(self) -> u32 {
        match self {
            CmEventType::AddrResolved => 0,
            CmEventType::AddrError => 1,
            CmEventType::RouteResolved => 2,
            CmEventType::RouteError => 3,
            CmEventType::ConnectRequest => 4,
            CmEventType::ConnectResponse => 5,
            CmEventType::ConnectError => 6,
            CmEventType::Unreachable => 7,
            CmEventType::Rejected => 8,
            CmEventType::Established => 9,
            CmEventType::Disconnected => 10,
            CmEventType::DeviceRemoval => 11,
            CmEventType::MulticastJoin => 12,
            CmEventType::MulticastError => 13,
            CmEventType::AddrChange => 14,
            CmEventType::TimewaitExit => 15,
            CmEventType::AddrinfoResolved => 16,
            CmEventType::AddrinfoError => 17,
            CmEventType::User => 18,
            CmEventType::Internal => 19,
            CmEventType::Unknown(raw) => raw,
        }
    }

    /// The name `rdma_event_str` gives this event (`UNKNOWN EVENT` for an unknown number, as
    /// there).
    pub const fn name(self) -> &'static str {
        match self {
            CmEventType::AddrResolved => "RDMA_CM_EVENT_ADDR_RESOLVED",
            CmEventType::AddrError => "RDMA_CM_EVENT_ADDR_ERROR",
            CmEventType::RouteResolved => "RDMA_CM_EVENT_ROUTE_RESOLVED",
            CmEventType::RouteError => "RDMA_CM_EVENT_ROUTE_ERROR",
            CmEventType::ConnectRequest => "RDMA_CM_EVENT_CONNECT_REQUEST",
            CmEventType::ConnectResponse => "RDMA_CM_EVENT_CONNECT_RESPONSE",
            CmEventType::ConnectError => "RDMA_CM_EVENT_CONNECT_ERROR",
            CmEventType::Unreachable => "RDMA_CM_EVENT_UNREACHABLE",
            CmEventType::Rejected => "RDMA_CM_EVENT_REJECTED",
            CmEventType::Established => "RDMA_CM_EVENT_ESTABLISHED",
            CmEventType::Disconnected => "RDMA_CM_EVENT_DISCONNECTED",
            CmEventType::DeviceRemoval => "RDMA_CM_EVENT_DEVICE_REMOVAL",
            CmEventType::MulticastJoin => "RDMA_CM_EVENT_MULTICAST_JOIN",
            CmEventType::MulticastError => "RDMA_CM_EVENT_MULTICAST_ERROR",
            CmEventType::AddrChange => "RDMA_CM_EVENT_ADDR_CHANGE",
            CmEventType::TimewaitExit => "RDMA_CM_EVENT_TIMEWAIT_EXIT",
            CmEventType::AddrinfoResolved => "RDMA_CM_EVENT_ADDRINFO_RESOLVED",
            CmEventType::AddrinfoError => "RDMA_CM_EVENT_ADDRINFO_ERROR",
            CmEventType::User => "RDMA_CM_EVENT_USER",
            CmEventType::Internal => "RDMA_CM_EVENT_INTERNAL",
            CmEventType::Unknown(_) => "UNKNOWN EVENT",
        }
    }
}

impl From<u32> for CmEventType {
    /// The event type with librdmacm's numeric value `raw`; [`CmEventType::Unknown`] when this
    /// crate does not know the number.
    fn from(raw: u32) -> Self {
        Self::from_raw(raw).unwrap_or(CmEventType::Unknown(raw))
    }
}

impl fmt::Display for CmEventType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CmEventType::Unknown(raw) => write!(f, "{} ({raw})", self.name()),
            known => f.write_str(known.name()),
        }
    }
}

/// Capacity of the private-data buffer of an event (`RDMA_MAX_PRIVATE_DATA` in the ucma ABI).
pub const MAX_PRIVATE_DATA: usize = 256;

/// Private data carried by connect, accept and reject and handed out in events.
///
/// Stored inline (no allocation) because every connection carries some. A value built from a
/// slice longer than [`MAX_PRIVATE_DATA`] keeps its true length so the backend can refuse it with
/// [`CmError::PrivateDataTooLong`](crate::CmError::PrivateDataTooLong) at the call, the way
/// librdmacm refuses an oversized length with `EINVAL`.
///
/// All-zero data of any length (what most connections carry) holds no buffer of its own; it
/// reads the same as written zeros:
///
/// ```
/// use cm_core::PrivateData;
///
/// let padded = PrivateData::EMPTY.padded(56);
/// assert_eq!(padded.len(), 56);
/// assert_eq!(padded.as_slice(), &[0u8; 56][..]);
/// assert_eq!(padded, PrivateData::new(&[0u8; 56]));
/// ```
#[derive(Clone, Copy)]
pub struct PrivateData(Stored);

/// Every event carries a `PrivateData`, and most carry zeros: writing (or copying) a zeroed
/// 256-byte buffer for each of them would be a `memset` per event. `Zeros` writes only the length.
/// The data variant's length is non-zero (empty data is `Zeros`), so the enum keeps the size of
/// the buffer and a length: the zero length is the niche that marks `Zeros`.
// The size is the buffer's whichever variant is stored; boxing it would allocate per event.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Copy)]
enum Stored {
    /// `len` zero bytes.
    Zeros(usize),
    /// The given length and the first [`MAX_PRIVATE_DATA`] bytes, zero past the length.
    Bytes(NonZeroUsize, [u8; MAX_PRIVATE_DATA]),
}

/// What [`PrivateData::as_slice`] shows for all-zero data.
static ZEROS: [u8; MAX_PRIVATE_DATA] = [0; MAX_PRIVATE_DATA];

impl PrivateData {
    /// No private data.
    pub const EMPTY: PrivateData = PrivateData(Stored::Zeros(0));

    /// Copies `data` (or its first [`MAX_PRIVATE_DATA`] bytes, remembering the full length).
    // Inlined, a caller building an event writes the bytes in place instead of copying the
    // 256-byte buffer again.
    #[inline]
    pub fn new(data: &[u8]) -> Self {
        let Some(len) = NonZeroUsize::new(data.len()) else {
            return Self::EMPTY;
        };
        let mut bytes = [0; MAX_PRIVATE_DATA];
        let kept = data.len().min(MAX_PRIVATE_DATA);
        bytes[..kept].copy_from_slice(&data[..kept]);
        PrivateData(Stored::Bytes(len, bytes))
    }

    /// The length the data was given with (may exceed what is stored; see the type docs).
    pub const fn len(&self) -> usize {
        match self.0 {
            Stored::Zeros(len) => len,
            Stored::Bytes(len, _) => len.get(),
        }
    }

    /// Whether there is no private data.
    pub const fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The stored bytes.
    pub fn as_slice(&self) -> &[u8] {
        let stored = self.len().min(MAX_PRIVATE_DATA);
        match &self.0 {
            Stored::Zeros(_) => &ZEROS[..stored],
            Stored::Bytes(_, bytes) => &bytes[..stored],
        }
    }

    /// The same data zero-padded to `size` bytes, as the IB CM puts it on the wire.
    ///
    /// # Panics
    /// If `size` exceeds [`MAX_PRIVATE_DATA`] or the data is longer than `size`; backends check
    /// the length against the port space's limit first.
    // Always inlined: padding all-zero data then writes a length and nothing else, where a call
    // returns the 264 bytes through memory and copies them (as it did into every event built
    // from a REQ or REP once the retrieval's code grew past `#[inline]`'s budget).
    #[inline(always)]
    pub fn padded(&self, size: usize) -> Self {
        assert!(
            size <= MAX_PRIVATE_DATA && self.len() <= size,
            "private data longer than its slot"
        );
        match self.0 {
            Stored::Zeros(_) => PrivateData(Stored::Zeros(size)),
            // Bytes past the length are zero already: `new` starts from a zeroed buffer. The
            // sum is `size`, non-zero as it is at least the length.
            Stored::Bytes(len, bytes) => {
                PrivateData(Stored::Bytes(len.saturating_add(size - len.get()), bytes))
            }
        }
    }
}

impl Default for PrivateData {
    // Built, not copied from `EMPTY`: a constant is written whole (a 264-byte `memset`), the
    // variant is one store.
    #[inline]
    fn default() -> Self {
        PrivateData(Stored::Zeros(0))
    }
}

impl PartialEq for PrivateData {
    fn eq(&self, other: &Self) -> bool {
        self.len() == other.len() && self.as_slice() == other.as_slice()
    }
}

impl Eq for PrivateData {}

impl fmt::Debug for PrivateData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let data = self.as_slice();
        // Trailing zero padding is noise in logs: show the meaningful prefix and the length.
        let used = data.iter().rposition(|&b| b != 0).map_or(0, |p| p + 1);
        write!(f, "PrivateData(len={}, {:02x?})", self.len(), &data[..used])
    }
}

impl From<&[u8]> for PrivateData {
    fn from(data: &[u8]) -> Self {
        Self::new(data)
    }
}

/// `struct rdma_conn_param`: what connect and accept pass, and what connection events report.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnParam {
    /// Private data (connect: up to 56 bytes on the TCP port space; accept: 196; see
    /// [`PortSpace::private_data_limit`](crate::PortSpace::private_data_limit)).
    pub private_data: PrivateData,
    /// RDMA read/atomic operations this side accepts in flight; 0xFF means the device maximum.
    pub responder_resources: u8,
    /// RDMA read/atomic operations this side issues in flight; 0xFF means the device maximum.
    pub initiator_depth: u8,
    /// Whether hardware flow control is used (exchanged, not acted on).
    pub flow_control: u8,
    /// Transport retries (3 bits; connect only).
    pub retry_count: u8,
    /// Receiver-not-ready retries (3 bits; 7 means infinite).
    pub rnr_retry_count: u8,
    /// Whether the remote QP uses a shared receive queue (reported by events).
    pub srq: bool,
    /// Events: the remote QP number. Calls: ignored when the id has a backend QP; on `connect`
    /// and `accept` of a connected id without one, the number of the application's own
    /// (external) QP, which the REQ or REP carries ([`with_qp_num`](Self::with_qp_num)); 0 there
    /// means no QP at all and is refused.
    pub qp_num: u32,
}

impl ConnParam {
    /// All zero and no private data: what events that carry no connection parameters report
    /// (the kernel zeroes them).
    pub const ZERO: ConnParam = ConnParam {
        private_data: PrivateData::EMPTY,
        responder_resources: 0,
        initiator_depth: 0,
        flow_control: 0,
        retry_count: 0,
        rnr_retry_count: 0,
        srq: false,
        qp_num: 0,
    };

    /// librdmacm's defaults for a NULL `conn_param`: device maximum resources, 7 retries each.
    pub const fn new() -> Self {
        ConnParam {
            private_data: PrivateData::EMPTY,
            responder_resources: 0xFF,
            initiator_depth: 0xFF,
            flow_control: 0,
            retry_count: 7,
            rnr_retry_count: 7,
            srq: false,
            qp_num: 0,
        }
    }

    /// The same parameters with `data` as private data.
    #[must_use = "returns the changed parameters and leaves `self` as it was"]
    pub fn with_private_data(mut self, data: &[u8]) -> Self {
        self.private_data = PrivateData::new(data);
        self
    }
}

impl ConnParam {
    /// The same parameters naming the application's own QP, `qp_num` (24 bits), for a
    /// `connect` or `accept` without a backend QP (an external QP, see [`QpAttr`](crate::QpAttr)).
    ///
    /// ```
    /// let p = cm_core::ConnParam::new().with_qp_num(0x1234);
    /// assert_eq!(p.qp_num, 0x1234);
    /// ```
    #[must_use = "returns the changed parameters and leaves `self` as it was"]
    pub fn with_qp_num(mut self, qp_num: u32) -> Self {
        self.qp_num = qp_num;
        self
    }
}

impl Default for ConnParam {
    fn default() -> Self {
        Self::new()
    }
}

/// One event retrieved from a channel (`struct rdma_cm_event`).
///
/// An event is not `Clone`: it must be given back exactly once with
/// [`CmBackend::ack_cm_event`](crate::CmBackend::ack_cm_event), which makes a double ack impossible.
/// Dropping it without acking leaves it counted against its id, exactly like librdmacm, and the
/// backend then refuses to destroy that id with [`CmError::UnackedEvents`](crate::CmError::UnackedEvents).
#[derive(Debug, PartialEq, Eq)]
#[must_use = "an event counts against its id until it is acked with ack_cm_event"]
pub struct CmEvent {
    id: IdHandle,
    listen_id: Option<IdHandle>,
    event: CmEventType,
    status: i32,
    param: ConnParam,
    token: u64,
    /// Boxed: only datagram events carry it, and events of connected ids stay small.
    ud: Option<Box<UdParam>>,
}

impl CmEvent {
    pub(crate) const fn new(
        id: IdHandle,
        listen_id: Option<IdHandle>,
        event: CmEventType,
        status: i32,
        param: ConnParam,
        token: u64,
    ) -> Self {
        CmEvent {
            id,
            listen_id,
            event,
            status,
            param,
            token,
            ud: None,
        }
    }

    pub(crate) fn set_ud_param(&mut self, ud: UdParam) {
        self.ud = Some(Box::new(ud));
    }

    /// The datagram destination the event reports (`param.ud` of `struct rdma_cm_event`): on the
    /// UDP port space, the active side's `ESTABLISHED` carries the passive side's QP number,
    /// Q_Key and address handle attributes, where [`post_send_to`](crate::CmBackend::post_send_to)
    /// sends. `None` for events of connected ids and events without one.
    pub fn ud_param(&self) -> Option<&UdParam> {
        self.ud.as_deref()
    }

    /// The id the event is about; for `CONNECT_REQUEST` the new child id.
    pub const fn id(&self) -> IdHandle {
        self.id
    }

    /// The listener, for `CONNECT_REQUEST`.
    pub const fn listen_id(&self) -> Option<IdHandle> {
        self.listen_id
    }

    /// The event type.
    pub const fn event(&self) -> CmEventType {
        self.event
    }

    /// The status: 0, a negative errno, or a positive reject reason.
    pub const fn status(&self) -> i32 {
        self.status
    }

    /// Connection parameters (private data, resources, remote QP number).
    pub const fn param(&self) -> &ConnParam {
        &self.param
    }

    /// Private data carried by the event (empty when none).
    pub fn private_data(&self) -> &[u8] {
        self.param.private_data.as_slice()
    }

    /// The id the event counts against until it is acked: the listener for `CONNECT_REQUEST`
    /// (as in librdmacm), the event's own id otherwise.
    pub fn counted_id(&self) -> IdHandle {
        match (self.event, self.listen_id) {
            (CmEventType::ConnectRequest, Some(listener)) => listener,
            _ => self.id,
        }
    }

    /// The backend's bookkeeping value.
    pub const fn token(&self) -> u64 {
        self.token
    }

    /// What the status means, where this crate knows: the errno's name for a negative status,
    /// the IB CM reject reason for `REJECTED`, the SIDR status for `UNREACHABLE` (datagram port
    /// spaces). `None` for 0 and for numbers without a known meaning. `Display` shows it beside
    /// the number.
    ///
    /// ```
    /// # use cm_core::{backend, CmEventType, ConnParam};
    /// let id = backend::id_handle(1, 3, 0);
    /// let timed_out = backend::cm_event(id, None, CmEventType::Unreachable, -110, ConnParam::ZERO, 0);
    /// assert_eq!(timed_out.status_meaning(), Some("ETIMEDOUT"));
    /// assert_eq!(timed_out.to_string(), "RDMA_CM_EVENT_UNREACHABLE on id#3 (status -110 (ETIMEDOUT))");
    /// let rejected = backend::cm_event(id, None, CmEventType::Rejected, 28, ConnParam::ZERO, 0);
    /// assert_eq!(rejected.to_string(), "RDMA_CM_EVENT_REJECTED on id#3 (status 28 (consumer reject))");
    /// ```
    pub fn status_meaning(&self) -> Option<&'static str> {
        status_meaning(self.event, self.status)
    }
}

/// The meaning of `status` on an event of type `event`; see [`CmEvent::status_meaning`].
fn status_meaning(event: CmEventType, status: i32) -> Option<&'static str> {
    if status < 0 {
        return crate::error::errno_name(status.checked_neg()?);
    }
    match (event, status) {
        // ib_cm_rej_reason (include/rdma/ib_cm.h): the reasons an IB or RoCE peer sends.
        (CmEventType::Rejected, 1) => Some("no QP"),
        (CmEventType::Rejected, 2) => Some("no EEC"),
        (CmEventType::Rejected, 3) => Some("no resources"),
        (CmEventType::Rejected, 4) => Some("timeout"),
        (CmEventType::Rejected, 5) => Some("unsupported"),
        (CmEventType::Rejected, 6) => Some("invalid comm id"),
        (CmEventType::Rejected, 7) => Some("invalid comm instance"),
        (CmEventType::Rejected, 8) => Some("invalid service id"),
        (CmEventType::Rejected, 9) => Some("invalid transport type"),
        (CmEventType::Rejected, 10) => Some("stale connection"),
        (CmEventType::Rejected, 28) => Some("consumer reject"),
        (CmEventType::Rejected, 29) => Some("invalid RNR retry"),
        (CmEventType::Rejected, 35) => Some("vendor option unsupported"),
        // ib_cm_sidr_status: a SIDR REP that is not a success arrives as UNREACHABLE.
        (CmEventType::Unreachable, 1) => Some("SIDR unsupported"),
        (CmEventType::Unreachable, 2) => Some("SIDR reject"),
        (CmEventType::Unreachable, 3) => Some("SIDR no QP"),
        (CmEventType::Unreachable, 4) => Some("SIDR redirect"),
        (CmEventType::Unreachable, 5) => Some("SIDR unsupported version"),
        _ => None,
    }
}

impl fmt::Display for CmEvent {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} on {} (status {}", self.event, self.id, self.status)?;
        match self.status_meaning() {
            Some(meaning) => write!(f, " ({meaning}))"),
            None => f.write_str(")"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_numbers_and_names_match_rdma_core() {
        assert_eq!(CmEventType::AddrResolved.raw(), 0);
        assert_eq!(CmEventType::ConnectRequest.raw(), 4);
        assert_eq!(CmEventType::Rejected.raw(), 8);
        assert_eq!(CmEventType::Established.raw(), 9);
        assert_eq!(CmEventType::TimewaitExit.raw(), 15);
        for (n, ty) in CmEventType::ALL.iter().enumerate() {
            assert_eq!(ty.raw() as usize, n);
            assert_eq!(CmEventType::from_raw(n as u32), Some(*ty));
            assert!(ty.to_string().starts_with("RDMA_CM_EVENT_"));
        }
        assert_eq!(CmEventType::AddrinfoResolved.raw(), 16);
        assert_eq!(CmEventType::AddrinfoError.raw(), 17);
        assert_eq!(CmEventType::User.raw(), 18);
        assert_eq!(CmEventType::Internal.raw(), 19);
        assert_eq!(CmEventType::User.to_string(), "RDMA_CM_EVENT_USER");
        assert_eq!(CmEventType::from_raw(20), None);
        assert_eq!(
            CmEventType::Disconnected.to_string(),
            "RDMA_CM_EVENT_DISCONNECTED"
        );
    }

    #[test]
    fn display_names_what_a_status_means_by_event_type() {
        let shown = |ty, status| {
            CmEvent::new(IdHandle::new(1, 4, 0), None, ty, status, ConnParam::ZERO, 0).to_string()
        };
        assert_eq!(
            shown(CmEventType::Established, 0),
            "RDMA_CM_EVENT_ESTABLISHED on id#4 (status 0)"
        );
        assert_eq!(
            shown(CmEventType::Disconnected, -110),
            "RDMA_CM_EVENT_DISCONNECTED on id#4 (status -110 (ETIMEDOUT))"
        );
        assert_eq!(
            shown(CmEventType::AddrError, -113),
            "RDMA_CM_EVENT_ADDR_ERROR on id#4 (status -113 (EHOSTUNREACH))"
        );
        assert_eq!(
            shown(CmEventType::Rejected, 8),
            "RDMA_CM_EVENT_REJECTED on id#4 (status 8 (invalid service id))"
        );
        // The same number means a SIDR status on UNREACHABLE and nothing on a USER event.
        assert_eq!(
            shown(CmEventType::Unreachable, 2),
            "RDMA_CM_EVENT_UNREACHABLE on id#4 (status 2 (SIDR reject))"
        );
        assert_eq!(
            shown(CmEventType::User, 2),
            "RDMA_CM_EVENT_USER on id#4 (status 2)"
        );
        assert_eq!(
            shown(CmEventType::Rejected, 27),
            "RDMA_CM_EVENT_REJECTED on id#4 (status 27)"
        );
        assert_eq!(
            shown(CmEventType::AddrError, -4095),
            "RDMA_CM_EVENT_ADDR_ERROR on id#4 (status -4095)"
        );
        assert_eq!(
            shown(CmEventType::AddrError, i32::MIN),
            format!("RDMA_CM_EVENT_ADDR_ERROR on id#4 (status {})", i32::MIN)
        );
    }

    #[test]
    fn numbers_from_a_newer_librdmacm_are_kept_not_dropped() {
        for raw in [20, 21, 255, u32::MAX] {
            let ty = CmEventType::from(raw);
            assert_eq!(ty, CmEventType::Unknown(raw));
            assert_eq!(ty.raw(), raw);
            assert_eq!(ty.name(), "UNKNOWN EVENT");
            assert_eq!(ty.to_string(), format!("UNKNOWN EVENT ({raw})"));
        }
        for ty in CmEventType::ALL {
            assert_eq!(CmEventType::from(ty.raw()), ty);
        }
    }

    #[test]
    fn an_unknown_event_changes_no_state_and_is_only_counted() {
        // What a backend does with an event from a newer librdmacm: the machine refuses it as a
        // transition, and the backend records it with count_event so destroy waits for its ack.
        let m = crate::IdMachine::new(crate::PortSpace::Tcp);
        for ty in [
            CmEventType::Unknown(42),
            CmEventType::User,
            CmEventType::AddrinfoResolved,
        ] {
            assert!(m.on_event(ty).is_err(), "{ty}");
            let counted = m.count_event();
            assert_eq!(counted.unacked(), m.unacked() + 1);
            assert_eq!(counted.state(), m.state());
        }
    }

    #[test]
    fn private_data_pads_with_zeros_and_keeps_true_length() {
        let pd = PrivateData::new(b"hello");
        assert_eq!(pd.len(), 5);
        let padded = pd.padded(56);
        assert_eq!(padded.len(), 56);
        assert_eq!(&padded.as_slice()[..5], b"hello");
        assert!(padded.as_slice()[5..].iter().all(|&b| b == 0));
        let long = PrivateData::new(&[1u8; 300]);
        assert_eq!(long.len(), 300);
        assert_eq!(long.as_slice().len(), MAX_PRIVATE_DATA);
    }

    #[test]
    fn empty_private_data_reads_as_no_bytes_whichever_way_it_is_built() {
        for pd in [
            PrivateData::EMPTY,
            PrivateData::default(),
            PrivateData::new(&[]),
            PrivateData::EMPTY.padded(0),
        ] {
            assert_eq!(pd.len(), 0);
            assert!(pd.is_empty());
            assert_eq!(pd.as_slice(), &[] as &[u8]);
            assert_eq!(pd, PrivateData::EMPTY);
            assert_eq!(format!("{pd:?}"), "PrivateData(len=0, [])");
        }
    }

    #[test]
    fn all_zero_private_data_reads_like_written_zeros_at_every_length() {
        for size in 0..=MAX_PRIVATE_DATA {
            let padded = PrivateData::EMPTY.padded(size);
            let written = PrivateData::new(&vec![0u8; size]);
            assert_eq!(padded.len(), size);
            assert_eq!(padded.is_empty(), size == 0);
            assert_eq!(padded.as_slice(), &vec![0u8; size][..]);
            assert_eq!(padded, written);
            assert_eq!(written, padded);
            assert_eq!(format!("{padded:?}"), format!("{written:?}"));
            assert_eq!(padded.padded(MAX_PRIVATE_DATA), written.padded(MAX_PRIVATE_DATA));
        }
    }

    #[test]
    fn written_private_data_reads_back_its_bytes_and_pads_with_zeros_at_every_length() {
        for len in 1..=MAX_PRIVATE_DATA {
            let data: Vec<u8> = (1..=len).map(|i| i as u8 | 1).collect();
            let pd = PrivateData::new(&data);
            assert_eq!(pd.len(), len);
            assert!(!pd.is_empty());
            assert_eq!(pd.as_slice(), &data[..]);
            let padded = pd.padded(MAX_PRIVATE_DATA);
            assert_eq!(padded.len(), MAX_PRIVATE_DATA);
            assert_eq!(&padded.as_slice()[..len], &data[..]);
            assert!(padded.as_slice()[len..].iter().all(|&b| b == 0));
            assert_ne!(
                pd,
                PrivateData::EMPTY.padded(len),
                "non-zero bytes differ from zeros"
            );
        }
    }

    #[test]
    fn private_data_is_no_bigger_than_its_buffer_and_a_length() {
        // Events and connection parameters carry one each: a tag of its own would grow them.
        assert_eq!(
            std::mem::size_of::<PrivateData>(),
            MAX_PRIVATE_DATA + std::mem::size_of::<usize>()
        );
    }

    #[test]
    #[should_panic(expected = "private data longer than its slot")]
    fn padding_private_data_to_less_than_its_length_panics() {
        let _ = PrivateData::new(b"hello").padded(4);
    }

    #[test]
    fn connect_request_counts_against_the_listener() {
        let child = IdHandle::new(1, 2, 0);
        let listener = IdHandle::new(1, 1, 0);
        let ev = CmEvent::new(
            child,
            Some(listener),
            CmEventType::ConnectRequest,
            0,
            ConnParam::new(),
            0,
        );
        assert_eq!(ev.counted_id(), listener);
        let ev = CmEvent::new(child, None, CmEventType::Established, 0, ConnParam::new(), 0);
        assert_eq!(ev.counted_id(), child);
    }
}
