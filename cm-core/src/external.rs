//! External QPs: what `rdma_init_qp_attr` answers, so that an application that creates and
//! drives its own QP (with another verbs crate) can still let this crate manage the connection.
//!
//! The flow, as librdmacm has it for an id without a QP:
//!
//! 1. the application creates its QP on the id's device and moves it to INIT with
//!    [`CmBackend::init_qp_attr`](crate::CmBackend::init_qp_attr)`(id, QpState::Init)`;
//! 2. active side: [`connect`](crate::CmBackend::connect) with
//!    [`ConnParam::with_qp_num`](crate::ConnParam::with_qp_num) (its QP's number) gets
//!    `CONNECT_RESPONSE` instead of `ESTABLISHED`; the application moves its QP to RTR and RTS
//!    with the attributes of `init_qp_attr` and calls [`establish`](crate::CmBackend::establish),
//!    which sends the RTU;
//! 3. passive side: after `CONNECT_REQUEST` the application moves its QP to RTR and RTS, then
//!    [`accept`](crate::CmBackend::accept)s with its QP's number; `ESTABLISHED` follows the RTU.
//!
//! The backend never touches an external QP: a disconnect does not move it to ERR, the
//! application does.

use std::fmt;
use std::ops::BitOr;

use crate::state::QpState;

/// `enum ibv_qp_attr_mask`: which fields of a [`QpAttr`] are set, with verbs' bit values.
///
/// ```
/// use cm_core::QpAttrMask;
///
/// let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT;
/// assert_eq!(mask.bits(), 1 | 16 | 32);
/// assert!(mask.contains(QpAttrMask::PORT));
/// assert!(!mask.contains(QpAttrMask::AV));
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpAttrMask(u32);

impl QpAttrMask {
    /// `IBV_QP_STATE`.
    pub const STATE: QpAttrMask = QpAttrMask(1);
    /// `IBV_QP_CUR_STATE`.
    pub const CUR_STATE: QpAttrMask = QpAttrMask(1 << 1);
    /// `IBV_QP_EN_SQD_ASYNC_NOTIFY`.
    pub const EN_SQD_ASYNC_NOTIFY: QpAttrMask = QpAttrMask(1 << 2);
    /// `IBV_QP_ACCESS_FLAGS`.
    pub const ACCESS_FLAGS: QpAttrMask = QpAttrMask(1 << 3);
    /// `IBV_QP_PKEY_INDEX`.
    pub const PKEY_INDEX: QpAttrMask = QpAttrMask(1 << 4);
    /// `IBV_QP_PORT`.
    pub const PORT: QpAttrMask = QpAttrMask(1 << 5);
    /// `IBV_QP_QKEY`.
    pub const QKEY: QpAttrMask = QpAttrMask(1 << 6);
    /// `IBV_QP_AV`.
    pub const AV: QpAttrMask = QpAttrMask(1 << 7);
    /// `IBV_QP_PATH_MTU`.
    pub const PATH_MTU: QpAttrMask = QpAttrMask(1 << 8);
    /// `IBV_QP_TIMEOUT`.
    pub const TIMEOUT: QpAttrMask = QpAttrMask(1 << 9);
    /// `IBV_QP_RETRY_CNT`.
    pub const RETRY_CNT: QpAttrMask = QpAttrMask(1 << 10);
    /// `IBV_QP_RNR_RETRY`.
    pub const RNR_RETRY: QpAttrMask = QpAttrMask(1 << 11);
    /// `IBV_QP_RQ_PSN`.
    pub const RQ_PSN: QpAttrMask = QpAttrMask(1 << 12);
    /// `IBV_QP_MAX_QP_RD_ATOMIC`.
    pub const MAX_QP_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 13);
    /// `IBV_QP_ALT_PATH`.
    pub const ALT_PATH: QpAttrMask = QpAttrMask(1 << 14);
    /// `IBV_QP_MIN_RNR_TIMER`.
    pub const MIN_RNR_TIMER: QpAttrMask = QpAttrMask(1 << 15);
    /// `IBV_QP_SQ_PSN`.
    pub const SQ_PSN: QpAttrMask = QpAttrMask(1 << 16);
    /// `IBV_QP_MAX_DEST_RD_ATOMIC`.
    pub const MAX_DEST_RD_ATOMIC: QpAttrMask = QpAttrMask(1 << 17);
    /// `IBV_QP_PATH_MIG_STATE`.
    pub const PATH_MIG_STATE: QpAttrMask = QpAttrMask(1 << 18);
    /// `IBV_QP_CAP`.
    pub const CAP: QpAttrMask = QpAttrMask(1 << 19);
    /// `IBV_QP_DEST_QPN`.
    pub const DEST_QPN: QpAttrMask = QpAttrMask(1 << 20);
    /// `IBV_QP_RATE_LIMIT`.
    pub const RATE_LIMIT: QpAttrMask = QpAttrMask(1 << 25);

    /// No bit set.
    pub const EMPTY: QpAttrMask = QpAttrMask(0);

    /// The mask of verbs' bits `bits` (bits this type names no constant for are kept).
    pub const fn from_bits(bits: u32) -> Self {
        QpAttrMask(bits)
    }

    /// The bits, as `ibv_modify_qp` takes them.
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// The bits of `self` that `other` does not have.
    pub const fn without(self, other: QpAttrMask) -> Self {
        QpAttrMask(self.0 & !other.0)
    }

    /// Whether no bit is set.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Whether every bit of `other` is set.
    pub const fn contains(self, other: QpAttrMask) -> bool {
        self.0 & other.0 == other.0
    }

    /// Both masks' bits.
    pub const fn union(self, other: QpAttrMask) -> Self {
        QpAttrMask(self.0 | other.0)
    }
}

impl BitOr for QpAttrMask {
    type Output = QpAttrMask;
    fn bitor(self, rhs: QpAttrMask) -> QpAttrMask {
        self.union(rhs)
    }
}

impl fmt::Display for QpAttrMask {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        const NAMES: [(QpAttrMask, &str); 22] = [
            (QpAttrMask::STATE, "STATE"),
            (QpAttrMask::CUR_STATE, "CUR_STATE"),
            (QpAttrMask::EN_SQD_ASYNC_NOTIFY, "EN_SQD_ASYNC_NOTIFY"),
            (QpAttrMask::ACCESS_FLAGS, "ACCESS_FLAGS"),
            (QpAttrMask::PKEY_INDEX, "PKEY_INDEX"),
            (QpAttrMask::PORT, "PORT"),
            (QpAttrMask::QKEY, "QKEY"),
            (QpAttrMask::AV, "AV"),
            (QpAttrMask::PATH_MTU, "PATH_MTU"),
            (QpAttrMask::TIMEOUT, "TIMEOUT"),
            (QpAttrMask::RETRY_CNT, "RETRY_CNT"),
            (QpAttrMask::RNR_RETRY, "RNR_RETRY"),
            (QpAttrMask::RQ_PSN, "RQ_PSN"),
            (QpAttrMask::MAX_QP_RD_ATOMIC, "MAX_QP_RD_ATOMIC"),
            (QpAttrMask::ALT_PATH, "ALT_PATH"),
            (QpAttrMask::MIN_RNR_TIMER, "MIN_RNR_TIMER"),
            (QpAttrMask::SQ_PSN, "SQ_PSN"),
            (QpAttrMask::MAX_DEST_RD_ATOMIC, "MAX_DEST_RD_ATOMIC"),
            (QpAttrMask::PATH_MIG_STATE, "PATH_MIG_STATE"),
            (QpAttrMask::CAP, "CAP"),
            (QpAttrMask::DEST_QPN, "DEST_QPN"),
            (QpAttrMask::RATE_LIMIT, "RATE_LIMIT"),
        ];
        let mut rest = self.0;
        let mut first = true;
        for (bit, name) in NAMES {
            if self.contains(bit) {
                f.write_str(if first { "" } else { "|" })?;
                f.write_str(name)?;
                rest &= !bit.0;
                first = false;
            }
        }
        if rest != 0 || first {
            write!(f, "{}{rest:#x}", if first { "" } else { "|" })?;
        }
        Ok(())
    }
}

/// `IBV_ACCESS_REMOTE_WRITE`: what the IB CM grants a connected QP in INIT.
pub const ACCESS_REMOTE_WRITE: u32 = 1 << 1;
/// `IBV_ACCESS_REMOTE_READ`: granted with `REMOTE_WRITE` when the id accepts RDMA reads.
pub const ACCESS_REMOTE_READ: u32 = 1 << 2;
/// `IBV_ACCESS_REMOTE_ATOMIC`: granted with `REMOTE_READ`.
pub const ACCESS_REMOTE_ATOMIC: u32 = 1 << 3;

/// The global route header part of an address vector (`struct ibv_global_route`): on RoCE
/// every address vector has one; the GIDs are the peers' IP addresses.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct GlobalRoute {
    /// The destination GID (on RoCE the peer's IPv6 address, or its IPv4 address mapped into
    /// IPv6 as `::ffff:a.b.c.d`).
    pub dgid: [u8; 16],
    /// Flow label.
    pub flow_label: u32,
    /// Index of the source GID in the port's GID table.
    pub sgid_index: u8,
    /// Hop limit (IP TTL on RoCE v2).
    pub hop_limit: u8,
    /// Traffic class.
    pub traffic_class: u8,
}

/// The address vector a connected QP needs at RTR (`struct ibv_ah_attr`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct AddressVector {
    /// Destination LID (0 on RoCE).
    pub dlid: u16,
    /// Service level.
    pub sl: u8,
    /// Source path bits.
    pub src_path_bits: u8,
    /// Static rate (`enum ibv_rate`).
    pub static_rate: u8,
    /// The global route header, when `is_global`.
    pub grh: Option<GlobalRoute>,
    /// The local port.
    pub port_num: u8,
}

/// `IBV_MTU_1024`, the path MTU the simulator's ports have (`enum ibv_mtu`: 1 = 256 bytes ...
/// 5 = 4096).
pub const MTU_1024: u8 = 3;

/// What `rdma_init_qp_attr` answers for one QP state: the attributes and the mask of those
/// that are set, ready for `ibv_modify_qp`. Fields outside [`mask`](QpAttr::mask) are zero and
/// mean nothing.
///
/// What the kernel sets, by requested state, for a connected (RC) id:
///
/// | state | mask |
/// |---|---|
/// | INIT | `STATE, ACCESS_FLAGS, PKEY_INDEX, PORT` |
/// | RTR | `STATE, AV, PATH_MTU, DEST_QPN, RQ_PSN, MAX_DEST_RD_ATOMIC, MIN_RNR_TIMER` |
/// | RTS | `STATE, SQ_PSN, TIMEOUT, RETRY_CNT, RNR_RETRY, MAX_QP_RD_ATOMIC` |
///
/// Before the id has an IB CM exchange (an active id before `connect`) and for datagram ids the
/// kernel answers the INIT attributes whatever state was asked for (with `QKEY` instead of
/// `ACCESS_FLAGS` for datagram ids), as librdmacm does.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct QpAttr {
    /// Which fields are set.
    pub mask: QpAttrMask,
    /// The state asked for (`IBV_QPS_*`).
    pub qp_state: Option<QpState>,
    /// Partition key index.
    pub pkey_index: u16,
    /// The local port.
    pub port_num: u8,
    /// `IBV_ACCESS_*` flags ([`ACCESS_REMOTE_WRITE`], ...).
    pub qp_access_flags: u32,
    /// `enum ibv_mtu` (1 = 256 bytes ... 5 = 4096).
    pub path_mtu: u8,
    /// The remote QP number.
    pub dest_qp_num: u32,
    /// The receive queue's starting packet sequence number.
    pub rq_psn: u32,
    /// The send queue's starting packet sequence number.
    pub sq_psn: u32,
    /// Local ACK timeout (4.096 µs · 2^timeout).
    pub timeout: u8,
    /// Transport retries.
    pub retry_cnt: u8,
    /// Receiver-not-ready retries (7 = infinite).
    pub rnr_retry: u8,
    /// RDMA reads and atomics this QP issues in flight (the initiator depth).
    pub max_rd_atomic: u8,
    /// RDMA reads and atomics this QP answers in flight (the responder resources).
    pub max_dest_rd_atomic: u8,
    /// Minimum RNR NAK timer (an `ibv` code, 0 = 655.36 ms).
    pub min_rnr_timer: u8,
    /// The QKey of a datagram QP.
    pub qkey: u32,
    /// The address vector (with `AV`).
    pub ah_attr: AddressVector,
}
