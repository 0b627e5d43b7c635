//! Port spaces, QP capabilities, work completions and the live-resource report.

use std::fmt;

use crate::datagram::UdSender;

use crate::error::{Call, CmError};

/// `enum rdma_port_space`, with librdmacm's numeric values.
///
/// `#[non_exhaustive]`: the kernel's list of port spaces is longer (and may grow) than the four
/// librdmacm exposes today.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[non_exhaustive]
pub enum PortSpace {
    /// `RDMA_PS_IPOIB`: unreliable datagram, IB links only.
    IpoIb = 0x0002,
    /// `RDMA_PS_TCP`: reliable connected (RC) QPs, IB CM REQ/REP/RTU connections.
    Tcp = 0x0106,
    /// `RDMA_PS_UDP`: unreliable datagram (UD) QPs, SIDR lookups.
    Udp = 0x0111,
    /// `RDMA_PS_IB`: any IB service; `rdma_create_id` gives it an RC QP type.
    Ib = 0x013F,
}

/// Which wire message private data travels in; its size limit depends on it and the port space.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum PrivateDataSlot {
    /// `rdma_connect`: REQ (connected) or SIDR REQ (datagram).
    Connect,
    /// `rdma_accept`: REP or SIDR REP.
    Accept,
    /// `rdma_reject`: REJ or SIDR REP.
    Reject,
}

impl PortSpace {
    /// Every port space.
    pub const ALL: [PortSpace; 4] = [PortSpace::IpoIb, PortSpace::Tcp, PortSpace::Udp, PortSpace::Ib];

    /// The port space with librdmacm's numeric value `value`, if there is one.
    pub fn from_raw(value: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|ps| ps.raw() == value)
    }

    /// librdmacm's numeric value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// Whether ids of this port space make reliable connections (RC QPs, REQ/REP/RTU, DREQ/DREP).
    pub const fn is_connected(self) -> bool {
        matches!(self, PortSpace::Tcp | PortSpace::Ib)
    }

    /// The most private data a caller may pass in `slot` with IP addressing, which is also the
    /// size the receiver sees (the IB CM pads to it): connect 56 (connected) / 180 (datagram),
    /// accept 196 / 136, reject 148 / 136.
    pub const fn private_data_limit(self, slot: PrivateDataSlot) -> usize {
        match (self.is_connected(), slot) {
            (true, PrivateDataSlot::Connect) => 56,
            (true, PrivateDataSlot::Accept) => 196,
            (true, PrivateDataSlot::Reject) => 148,
            (false, PrivateDataSlot::Connect) => 180,
            (false, PrivateDataSlot::Accept | PrivateDataSlot::Reject) => 136,
        }
    }

    /// The `RDMA_PS_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            PortSpace::IpoIb => "RDMA_PS_IPOIB",
            PortSpace::Tcp => "RDMA_PS_TCP",
            PortSpace::Udp => "RDMA_PS_UDP",
            PortSpace::Ib => "RDMA_PS_IB",
        }
    }
}

impl fmt::Display for PortSpace {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// Capabilities asked of, and granted to, the QP that [`create_qp`](crate::CmBackend::create_qp)
/// attaches to an id (`struct ibv_qp_cap`, plus the size of the backend-owned message buffers).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct QpCaps {
    /// Most send work requests outstanding at once.
    pub max_send_wr: u32,
    /// Most receive work requests outstanding at once.
    pub max_recv_wr: u32,
    /// Scatter/gather entries per send work request.
    pub max_send_sge: u32,
    /// Scatter/gather entries per receive work request.
    pub max_recv_sge: u32,
    /// Bytes a send may carry inline.
    pub max_inline_data: u32,
    /// Size of each message buffer the backend registers for the QP: the longest send and the
    /// longest receive buffer a work request may use.
    pub max_message_size: u32,
}

impl QpCaps {
    /// Small defaults fit for connection-management work: 16 WRs each way, one SGE, 4 KiB messages.
    pub const fn new() -> Self {
        QpCaps {
            max_send_wr: 16,
            max_recv_wr: 16,
            max_send_sge: 1,
            max_recv_sge: 1,
            max_inline_data: 0,
            max_message_size: 4096,
        }
    }
}

impl QpCaps {
    /// Checks asked-for capabilities against a device allowing `max_qp_wr` work requests each
    /// way and message buffers of at most `max_message_size` bytes (`rdma_create_qp`'s
    /// `EINVAL`s, with the reason). Both queues' work requests together must fit a `u32`: they
    /// share one CQ and one numbering of slots ([`WrPool`](crate::backend::WrPool)).
    #[inline]
    pub fn check(&self, max_qp_wr: u32, max_message_size: u32) -> Result<(), CmError> {
        let invalid = |reason| {
            Err(CmError::InvalidArgument {
                call: Call::CreateQp,
                reason,
            })
        };
        // rxe takes an empty queue either way (a QP that only sends, or only receives, as
        // qperf's bandwidth tests make); a QP with neither could post nothing at all, and
        // its one CQ, sized by the two, would have no entry.
        if self.max_send_wr > max_qp_wr || self.max_recv_wr > max_qp_wr {
            return invalid("max_send_wr and max_recv_wr must be at most max_qp_wr");
        }
        if self.max_send_wr == 0 && self.max_recv_wr == 0 {
            return invalid("max_send_wr and max_recv_wr are both 0");
        }
        if self.max_send_sge == 0 || self.max_recv_sge == 0 {
            return invalid("max_send_sge and max_recv_sge must be at least 1");
        }
        if !(1..=max_message_size).contains(&self.max_message_size) {
            return invalid("max_message_size out of range");
        }
        if self.max_send_wr.checked_add(self.max_recv_wr).is_none() {
            return invalid("max_send_wr + max_recv_wr overflows");
        }
        Ok(())
    }

    /// Checks the length of a work request against the QP's message buffers: a send's message,
    /// or a receive's buffer, may not exceed [`max_message_size`](Self::max_message_size).
    pub fn check_length(&self, opcode: WcOpcode, len: usize) -> Result<(), CmError> {
        if len <= self.max_message_size as usize {
            return Ok(());
        }
        Err(if opcode.is_recv() {
            CmError::InvalidArgument {
                call: Call::PostRecv,
                reason: "receive buffer longer than max_message_size",
            }
        } else {
            CmError::InvalidArgument {
                call: Call::PostSend,
                reason: "message longer than max_message_size",
            }
        })
    }
}

impl Default for QpCaps {
    fn default() -> Self {
        Self::new()
    }
}

/// `enum ibv_wc_status` with verbs' numeric values; `Display` prints `ibv_wc_status_str`'s text.
///
/// `#[non_exhaustive]` because verbs adds statuses (the tag-matching ones came in rdma-core v20);
/// a backend reports a status it does not know as [`WcStatus::GeneralErr`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
#[repr(u32)]
#[non_exhaustive]
#[allow(missing_docs)] // one-to-one with ibv_wc_status; the strings below document them
pub enum WcStatus {
    Success = 0,
    LocLenErr = 1,
    LocQpOpErr = 2,
    LocEecOpErr = 3,
    LocProtErr = 4,
    WrFlushErr = 5,
    MwBindErr = 6,
    BadRespErr = 7,
    LocAccessErr = 8,
    RemInvReqErr = 9,
    RemAccessErr = 10,
    RemOpErr = 11,
    RetryExcErr = 12,
    RnrRetryExcErr = 13,
    LocRddViolErr = 14,
    RemInvRdReqErr = 15,
    RemAbortErr = 16,
    InvEecnErr = 17,
    InvEecStateErr = 18,
    FatalErr = 19,
    RespTimeoutErr = 20,
    GeneralErr = 21,
    TmErr = 22,
    TmRndvIncomplete = 23,
}

impl WcStatus {
    /// Every status, in numeric order.
    pub const ALL: [WcStatus; 24] = [
        WcStatus::Success,
        WcStatus::LocLenErr,
        WcStatus::LocQpOpErr,
        WcStatus::LocEecOpErr,
        WcStatus::LocProtErr,
        WcStatus::WrFlushErr,
        WcStatus::MwBindErr,
        WcStatus::BadRespErr,
        WcStatus::LocAccessErr,
        WcStatus::RemInvReqErr,
        WcStatus::RemAccessErr,
        WcStatus::RemOpErr,
        WcStatus::RetryExcErr,
        WcStatus::RnrRetryExcErr,
        WcStatus::LocRddViolErr,
        WcStatus::RemInvRdReqErr,
        WcStatus::RemAbortErr,
        WcStatus::InvEecnErr,
        WcStatus::InvEecStateErr,
        WcStatus::FatalErr,
        WcStatus::RespTimeoutErr,
        WcStatus::GeneralErr,
        WcStatus::TmErr,
        WcStatus::TmRndvIncomplete,
    ];

    /// The status with verbs' numeric value `value`, if there is one.
    pub fn from_raw(value: u32) -> Option<Self> {
        Self::ALL.get(value as usize).copied()
    }

    /// Verbs' numeric value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The text `ibv_wc_status_str` gives.
    pub const fn as_str(self) -> &'static str {
        match self {
            WcStatus::Success => "success",
            WcStatus::LocLenErr => "local length error",
            WcStatus::LocQpOpErr => "local QP operation error",
            WcStatus::LocEecOpErr => "local EE context operation error",
            WcStatus::LocProtErr => "local protection error",
            WcStatus::WrFlushErr => "Work Request Flushed Error",
            WcStatus::MwBindErr => "memory management operation error",
            WcStatus::BadRespErr => "bad response error",
            WcStatus::LocAccessErr => "local access error",
            WcStatus::RemInvReqErr => "remote invalid request error",
            WcStatus::RemAccessErr => "remote access error",
            WcStatus::RemOpErr => "remote operation error",
            WcStatus::RetryExcErr => "transport retry counter exceeded",
            WcStatus::RnrRetryExcErr => "RNR retry counter exceeded",
            WcStatus::LocRddViolErr => "local RDD violation error",
            WcStatus::RemInvRdReqErr => "remote invalid RD request",
            WcStatus::RemAbortErr => "aborted error",
            WcStatus::InvEecnErr => "invalid EE context number",
            WcStatus::InvEecStateErr => "invalid EE context state",
            WcStatus::FatalErr => "fatal error",
            WcStatus::RespTimeoutErr => "response timeout error",
            WcStatus::GeneralErr => "general error",
            WcStatus::TmErr => "TM error",
            WcStatus::TmRndvIncomplete => "TM software rendezvous",
        }
    }
}

impl fmt::Display for WcStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// What a completed work request was (`enum ibv_wc_opcode`, with verbs' numbers).
///
/// Two-sided work uses `Send` and `Recv`; the rest are the one-sided operations of
/// [`SendOp`](crate::SendOp) and the receive an RDMA WRITE with immediate takes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[repr(u32)]
pub enum WcOpcode {
    /// `IBV_WC_SEND`.
    Send = 0,
    /// `IBV_WC_RDMA_WRITE`.
    RdmaWrite = 1,
    /// `IBV_WC_RDMA_READ`.
    RdmaRead = 2,
    /// `IBV_WC_COMP_SWAP`.
    CompSwap = 3,
    /// `IBV_WC_FETCH_ADD`.
    FetchAdd = 4,
    /// `IBV_WC_RECV`.
    Recv = 128,
    /// `IBV_WC_RECV_RDMA_WITH_IMM`: a receive taken by a peer's RDMA WRITE with immediate.
    RecvRdmaWithImm = 129,
}

impl WcOpcode {
    /// Every opcode, in numeric order.
    pub const ALL: [WcOpcode; 7] = [
        WcOpcode::Send,
        WcOpcode::RdmaWrite,
        WcOpcode::RdmaRead,
        WcOpcode::CompSwap,
        WcOpcode::FetchAdd,
        WcOpcode::Recv,
        WcOpcode::RecvRdmaWithImm,
    ];

    /// Verbs' numeric value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The opcode with verbs' numeric value `value`, if it is one of these.
    pub fn from_raw(value: u32) -> Option<Self> {
        Self::ALL.into_iter().find(|op| op.raw() == value)
    }

    /// Whether it completes a receive (verbs: `opcode & IBV_WC_RECV`); the rest complete work
    /// of the send queue.
    pub const fn is_recv(self) -> bool {
        self as u32 & WcOpcode::Recv as u32 != 0
    }

    /// The `IBV_WC_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            WcOpcode::Send => "IBV_WC_SEND",
            WcOpcode::RdmaWrite => "IBV_WC_RDMA_WRITE",
            WcOpcode::RdmaRead => "IBV_WC_RDMA_READ",
            WcOpcode::CompSwap => "IBV_WC_COMP_SWAP",
            WcOpcode::FetchAdd => "IBV_WC_FETCH_ADD",
            WcOpcode::Recv => "IBV_WC_RECV",
            WcOpcode::RecvRdmaWithImm => "IBV_WC_RECV_RDMA_WITH_IMM",
        }
    }
}

impl fmt::Display for WcOpcode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// One work completion (`struct ibv_wc`, reduced to what the CM data path needs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct WorkCompletion {
    /// The `wr_id` the work request was posted with.
    pub wr_id: u64,
    /// Success, or why the request failed (`WR_FLUSH_ERR` after a disconnect).
    pub status: WcStatus,
    /// What the request was. Verbs leaves it undefined in a completion that failed; both
    /// backends report the request's own opcode there, a flushed receive as `Recv`.
    pub opcode: WcOpcode,
    /// Bytes received (receives that succeeded; for `RecvRdmaWithImm` the length of the
    /// WRITE), or read by an RDMA READ (8 for an atomic); 0 otherwise, as verbs leaves it
    /// undefined for sends and for failed requests.
    pub byte_len: u32,
    /// The immediate of a SEND or RDMA WRITE with immediate (`IBV_WC_WITH_IMM`), on the
    /// receive it took; `None` otherwise.
    pub imm_data: Option<u32>,
    /// The received bytes (successful receives only). On a UD QP the payload alone: the 40-byte
    /// GRH verbs put in front of it is not included (its sender's address is in `sender`).
    pub data: Vec<u8>,
    /// Who sent a datagram (successful receives on UD QPs); `None` otherwise.
    pub sender: Option<UdSender>,
}

/// Resources a backend still holds: what tests check is zero after teardown.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct LiveResources {
    /// Event channels not destroyed.
    pub channels: usize,
    /// Ids not destroyed (including child ids whose request was not retrieved yet).
    pub ids: usize,
    /// QPs not destroyed.
    pub qps: usize,
    /// Events retrieved and not acked.
    pub unacked_events: usize,
    /// Events queued on channels and not retrieved.
    pub queued_events: usize,
    /// Memory regions not deregistered.
    pub mrs: usize,
    /// Shared receive queues not destroyed.
    pub srqs: usize,
}

impl LiveResources {
    /// Whether nothing the application must release is left (queued events die with their ids).
    pub const fn is_clean(&self) -> bool {
        self.channels == 0
            && self.ids == 0
            && self.qps == 0
            && self.unacked_events == 0
            && self.mrs == 0
            && self.srqs == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_space_values_match_librdmacm() {
        assert_eq!(PortSpace::IpoIb.raw(), 0x0002);
        assert_eq!(PortSpace::Tcp.raw(), 0x0106);
        assert_eq!(PortSpace::Udp.raw(), 0x0111);
        assert_eq!(PortSpace::Ib.raw(), 0x013F);
        for ps in PortSpace::ALL {
            assert_eq!(PortSpace::from_raw(ps.raw()), Some(ps));
        }
        assert_eq!(PortSpace::from_raw(7), None);
    }

    #[test]
    fn private_data_limits_follow_the_ib_cm_sizes() {
        use PrivateDataSlot::*;
        assert_eq!(PortSpace::Tcp.private_data_limit(Connect), 56);
        assert_eq!(PortSpace::Tcp.private_data_limit(Accept), 196);
        assert_eq!(PortSpace::Tcp.private_data_limit(Reject), 148);
        assert_eq!(PortSpace::Udp.private_data_limit(Connect), 180);
        assert_eq!(PortSpace::Udp.private_data_limit(Accept), 136);
    }

    #[test]
    fn caps_and_lengths_are_checked_alike_for_every_backend() {
        let caps = QpCaps::new();
        assert_eq!(caps.check(16384, 1 << 20), Ok(()));
        let send_only = QpCaps {
            max_recv_wr: 0,
            ..caps
        };
        assert_eq!(send_only.check(16384, 1 << 20), Ok(()));
        let recv_only = QpCaps {
            max_send_wr: 0,
            ..caps
        };
        assert_eq!(recv_only.check(16384, 1 << 20), Ok(()));
        let none = QpCaps {
            max_send_wr: 0,
            ..send_only
        };
        assert!(matches!(
            none.check(16384, 1 << 20),
            Err(CmError::InvalidArgument {
                call: Call::CreateQp,
                ..
            })
        ));
        let big = QpCaps {
            max_message_size: 2 << 20,
            ..caps
        };
        assert!(big.check(16384, 1 << 20).is_err());
        assert!(QpCaps {
            max_send_sge: 0,
            ..caps
        }
        .check(16384, 1 << 20)
        .is_err());
        // Each queue within a device's limit, the two together past a u32.
        let sum_overflows = QpCaps {
            max_send_wr: 16,
            max_recv_wr: u32::MAX,
            ..caps
        };
        assert_eq!(
            sum_overflows.check(u32::MAX, 1 << 20),
            Err(CmError::InvalidArgument {
                call: Call::CreateQp,
                reason: "max_send_wr + max_recv_wr overflows",
            })
        );
        let largest = QpCaps {
            max_recv_wr: u32::MAX - 16,
            ..sum_overflows
        };
        assert_eq!(largest.check(u32::MAX, 1 << 20), Ok(()));
        assert_eq!(caps.check_length(WcOpcode::Send, 4096), Ok(()));
        let err = caps.check_length(WcOpcode::Recv, 4097).unwrap_err();
        assert!(
            matches!(
                err,
                CmError::InvalidArgument {
                    call: Call::PostRecv,
                    ..
                }
            ),
            "{err}"
        );
    }

    #[test]
    fn wc_status_values_match_ibv_wc_status() {
        assert_eq!(WcStatus::Success.raw(), 0);
        assert_eq!(WcStatus::LocLenErr.raw(), 1);
        assert_eq!(WcStatus::WrFlushErr.raw(), 5);
        assert_eq!(WcStatus::RemInvReqErr.raw(), 9);
        assert_eq!(WcStatus::RnrRetryExcErr.raw(), 13);
        assert_eq!(WcStatus::GeneralErr.raw(), 21);
        for (n, st) in WcStatus::ALL.iter().enumerate() {
            assert_eq!(st.raw() as usize, n);
            assert_eq!(WcStatus::from_raw(n as u32), Some(*st));
        }
        assert_eq!(WcStatus::WrFlushErr.to_string(), "Work Request Flushed Error");
    }

    #[test]
    fn wc_opcode_values_match_ibv_wc_opcode() {
        let raw: Vec<u32> = WcOpcode::ALL.iter().map(|op| op.raw()).collect();
        assert_eq!(raw, [0, 1, 2, 3, 4, 128, 129]);
        for op in WcOpcode::ALL {
            assert_eq!(WcOpcode::from_raw(op.raw()), Some(op));
            assert_eq!(op.is_recv(), op.raw() >= 128, "{op}");
            assert!(op.name().starts_with("IBV_WC_"));
        }
        assert_eq!(WcOpcode::from_raw(5), None);
        assert_eq!(WcOpcode::RecvRdmaWithImm.to_string(), "IBV_WC_RECV_RDMA_WITH_IMM");
        let caps = QpCaps::new();
        for op in [WcOpcode::RdmaWrite, WcOpcode::FetchAdd] {
            assert!(matches!(
                caps.check_length(op, 4097),
                Err(CmError::InvalidArgument {
                    call: Call::PostSend,
                    ..
                })
            ));
        }
        assert!(matches!(
            caps.check_length(WcOpcode::RecvRdmaWithImm, 4097),
            Err(CmError::InvalidArgument {
                call: Call::PostRecv,
                ..
            })
        ));
    }

    #[test]
    fn regions_and_srqs_left_are_not_clean() {
        assert!(LiveResources::default().is_clean());
        let mr = LiveResources {
            mrs: 1,
            ..LiveResources::default()
        };
        let srq = LiveResources {
            srqs: 1,
            ..LiveResources::default()
        };
        assert!(!mr.is_clean() && !srq.is_clean());
    }
}
