//! Verbs QPs that no connection-manager id owns (`ibv_create_qp`, `ibv_modify_qp`): the
//! application moves them through the verbs state machine itself and exchanges QP numbers,
//! PSNs and GIDs out of band, as `ibv_rc_pingpong` and perftest do.
//!
//! [`VerbsQp`] is the legality of one such QP, a pure `Copy` machine as
//! [`IdMachine`](crate::IdMachine) is for ids: [`VerbsQp::modify`] answers an `ibv_modify_qp`
//! with the machine after it, or the error the kernel gives. Which transitions exist and which
//! attributes each requires and allows are Linux 6.1's `ib_modify_qp_is_ok`
//! (`drivers/infiniband/core/verbs.c`) for RC and UD; the checks of the values are rxe's
//! (`rxe_qp_chk_attr`) and uverbs' (port numbers).
//!
//! ```
//! use cm_core::{QpAttrMask, QpType, VerbsLimits, VerbsQp, VerbsQpAttr, VerbsQpState};
//!
//! let limits = VerbsLimits::RXE;
//! let qp = VerbsQp::new(QpType::Rc);
//! let init = VerbsQpAttr { qp_state: VerbsQpState::Init, port_num: 1, ..VerbsQpAttr::default() };
//! let mask = QpAttrMask::STATE | QpAttrMask::PKEY_INDEX | QpAttrMask::PORT | QpAttrMask::ACCESS_FLAGS;
//! let qp = qp.modify(&init, mask, &limits)?;
//! assert_eq!(qp.state(), VerbsQpState::Init);
//! // RTR without its required attributes: EINVAL, as the kernel answers.
//! let rtr = VerbsQpAttr { qp_state: VerbsQpState::Rtr, ..VerbsQpAttr::default() };
//! assert_eq!(qp.modify(&rtr, QpAttrMask::STATE, &limits).unwrap_err().errno(), 22);
//! # Ok::<(), cm_core::CmError>(())
//! ```

use std::fmt;

use crate::error::{Call, CmError};
use crate::external::{AddressVector, QpAttrMask};
use crate::state::QpState;

/// `enum ibv_qp_state`, all seven states a verbs QP has.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum VerbsQpState {
    /// `IBV_QPS_RESET`: just created, or reset; nothing can be posted.
    #[default]
    Reset,
    /// `IBV_QPS_INIT`: receives may be posted.
    Init,
    /// `IBV_QPS_RTR`: ready to receive.
    Rtr,
    /// `IBV_QPS_RTS`: ready to send.
    Rts,
    /// `IBV_QPS_SQD`: the send queue is drained (new sends wait).
    Sqd,
    /// `IBV_QPS_SQE`: the send queue is in error (a UD or UC QP's; RC QPs go to ERR).
    Sqe,
    /// `IBV_QPS_ERR`: every work request completes flushed.
    Err,
}

impl VerbsQpState {
    /// Every state, in `ibv_qp_state` order.
    pub const ALL: [VerbsQpState; 7] = [
        VerbsQpState::Reset,
        VerbsQpState::Init,
        VerbsQpState::Rtr,
        VerbsQpState::Rts,
        VerbsQpState::Sqd,
        VerbsQpState::Sqe,
        VerbsQpState::Err,
    ];

    /// The state of `ibv_qp_state` value `raw`; `None` past `IBV_QPS_ERR`.
    pub const fn from_raw(raw: u32) -> Option<VerbsQpState> {
        if raw < 7 {
            Some(Self::ALL[raw as usize])
        } else {
            None
        }
    }

    /// The `ibv_qp_state` value.
    pub const fn raw(self) -> u32 {
        self as u32
    }

    /// The `IBV_QPS_*` name.
    pub const fn name(self) -> &'static str {
        match self {
            VerbsQpState::Reset => "IBV_QPS_RESET",
            VerbsQpState::Init => "IBV_QPS_INIT",
            VerbsQpState::Rtr => "IBV_QPS_RTR",
            VerbsQpState::Rts => "IBV_QPS_RTS",
            VerbsQpState::Sqd => "IBV_QPS_SQD",
            VerbsQpState::Sqe => "IBV_QPS_SQE",
            VerbsQpState::Err => "IBV_QPS_ERR",
        }
    }

    /// The state the data path treats the QP by: SQD and SQE receive but start no sends, as
    /// RTR does (a backend's data path knows the five states an id's QP goes through).
    pub const fn data_path(self) -> QpState {
        match self {
            VerbsQpState::Reset => QpState::Reset,
            VerbsQpState::Init => QpState::Init,
            VerbsQpState::Rtr | VerbsQpState::Sqd | VerbsQpState::Sqe => QpState::Rtr,
            VerbsQpState::Rts => QpState::Rts,
            VerbsQpState::Err => QpState::Err,
        }
    }
}

impl fmt::Display for VerbsQpState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// The transport of a verbs QP (`enum ibv_qp_type`): the two the simulator serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum QpType {
    /// `IBV_QPT_RC`: reliable connected.
    Rc,
    /// `IBV_QPT_UD`: unreliable datagram.
    Ud,
}

impl QpType {
    /// The type of `ibv_qp_type` value `raw` (2 for RC, 4 for UD); `None` for the others.
    pub const fn from_raw(raw: u32) -> Option<QpType> {
        match raw {
            2 => Some(QpType::Rc),
            4 => Some(QpType::Ud),
            _ => None,
        }
    }

    /// The `ibv_qp_type` value.
    pub const fn raw(self) -> u32 {
        match self {
            QpType::Rc => 2,
            QpType::Ud => 4,
        }
    }
}

/// What the device allows, for the checks of [`VerbsQp::modify`].
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsLimits {
    /// Physical ports (numbered from 1).
    pub ports: u8,
    /// Entries of the port's P_Key table.
    pub pkeys: u16,
    /// Entries of the port's GID table that are set (indices from 0).
    pub gids: u8,
    /// The port's largest MTU (`enum ibv_mtu`: 1 = 256 bytes ... 5 = 4096).
    pub max_mtu: u8,
    /// `max_qp_rd_atom`: the most RDMA reads and atomics a QP has in flight, either way.
    pub max_rd_atomic: u8,
}

impl VerbsLimits {
    /// rxe's: one port, one P_Key, the port's link-local and IPv4-mapped GIDs, a 4096-byte
    /// MTU, 128 reads and atomics.
    pub const RXE: VerbsLimits = VerbsLimits {
        ports: 1,
        pkeys: 1,
        gids: 2,
        max_mtu: 5,
        max_rd_atomic: 128,
    };
}

/// `struct ibv_qp_attr`: the attributes `ibv_modify_qp` sets (those its mask names) and
/// `ibv_query_qp` reports.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
#[allow(missing_docs)] // one field per `ibv_qp_attr` field, named after it
pub struct VerbsQpAttr {
    pub qp_state: VerbsQpState,
    pub cur_qp_state: VerbsQpState,
    /// `enum ibv_mtu`.
    pub path_mtu: u8,
    pub path_mig_state: u32,
    pub qkey: u32,
    pub rq_psn: u32,
    pub sq_psn: u32,
    pub dest_qp_num: u32,
    pub qp_access_flags: u32,
    pub ah_attr: AddressVector,
    pub alt_ah_attr: AddressVector,
    pub pkey_index: u16,
    pub alt_pkey_index: u16,
    pub en_sqd_async_notify: u8,
    pub max_rd_atomic: u8,
    pub max_dest_rd_atomic: u8,
    pub min_rnr_timer: u8,
    pub port_num: u8,
    pub timeout: u8,
    pub retry_cnt: u8,
    pub rnr_retry: u8,
    pub alt_port_num: u8,
    pub alt_timeout: u8,
    pub rate_limit: u32,
}

/// The mask bits uverbs knows (through `IBV_QP_RATE_LIMIT`); others are refused before any
/// transition is looked at.
const KNOWN: u32 = (1 << 26) - 1;

/// `ib_modify_qp_is_ok`'s table for RC and UD: whether `from` → `to` exists, and the
/// attributes it requires and the ones it also allows (`IBV_QP_STATE` aside).
pub(crate) fn transition(
    ty: QpType,
    from: VerbsQpState,
    to: VerbsQpState,
) -> Option<(QpAttrMask, QpAttrMask)> {
    use QpAttrMask as M;
    use VerbsQpState::*;
    let none = M::EMPTY;
    let rc = ty == QpType::Rc;
    Some(match (from, to) {
        // 6.1's table has no RESET → ERR: rxe answers `EINVAL`.
        (Reset, Err) => return None,
        (_, Reset) | (_, Err) => (none, none),
        (Reset, Init) if rc => (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, none),
        (Reset, Init) => (M::PKEY_INDEX | M::PORT | M::QKEY, none),
        (Init, Init) if rc => (none, M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS),
        (Init, Init) => (none, M::PKEY_INDEX | M::PORT | M::QKEY),
        (Init, Rtr) if rc => (
            M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
            M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
        ),
        (Init, Rtr) => (none, M::PKEY_INDEX | M::QKEY),
        (Rtr, Rts) if rc => (
            M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
            M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
        ),
        (Rtr, Rts) => (M::SQ_PSN, M::CUR_STATE | M::QKEY),
        (Rts | Sqd, Rts) if rc => (
            none,
            M::CUR_STATE | M::ACCESS_FLAGS | M::ALT_PATH | M::PATH_MIG_STATE | M::MIN_RNR_TIMER,
        ),
        (Rts | Sqd | Sqe, Rts) if !rc => (none, M::CUR_STATE | M::QKEY),
        // RC lists no optional attribute for SQE → RTS: the state alone.
        (Sqe, Rts) => (none, none),
        (Rts, Sqd) => (none, M::EN_SQD_ASYNC_NOTIFY),
        (Sqd, Sqd) if rc => (
            none,
            M::PORT
                | M::AV
                | M::TIMEOUT
                | M::RETRY_CNT
                | M::RNR_RETRY
                | M::MAX_QP_RD_ATOMIC
                | M::MAX_DEST_RD_ATOMIC
                | M::ALT_PATH
                | M::ACCESS_FLAGS
                | M::PKEY_INDEX
                | M::MIN_RNR_TIMER
                | M::PATH_MIG_STATE,
        ),
        (Sqd, Sqd) => (none, M::PKEY_INDEX | M::QKEY),
        _ => return None,
    })
}

/// The legality state of one verbs QP: its type, state, and the attributes set so far.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct VerbsQp {
    ty: QpType,
    state: VerbsQpState,
    /// The attributes set since the QP was created or last reset (without `STATE`).
    set: QpAttrMask,
    attr: VerbsQpAttr,
}

fn invalid(reason: &'static str) -> CmError {
    CmError::InvalidArgument {
        call: Call::ModifyQp,
        reason,
    }
}

impl VerbsQp {
    /// A new QP (`ibv_create_qp`): in RESET, nothing set.
    pub const fn new(ty: QpType) -> VerbsQp {
        VerbsQp {
            ty,
            state: VerbsQpState::Reset,
            set: QpAttrMask::EMPTY,
            attr: VerbsQpAttr {
                qp_state: VerbsQpState::Reset,
                cur_qp_state: VerbsQpState::Reset,
                path_mtu: 0,
                path_mig_state: 0,
                qkey: 0,
                rq_psn: 0,
                sq_psn: 0,
                dest_qp_num: 0,
                qp_access_flags: 0,
                ah_attr: AddressVector {
                    dlid: 0,
                    sl: 0,
                    src_path_bits: 0,
                    static_rate: 0,
                    grh: None,
                    port_num: 0,
                },
                alt_ah_attr: AddressVector {
                    dlid: 0,
                    sl: 0,
                    src_path_bits: 0,
                    static_rate: 0,
                    grh: None,
                    port_num: 0,
                },
                pkey_index: 0,
                alt_pkey_index: 0,
                en_sqd_async_notify: 0,
                max_rd_atomic: 0,
                max_dest_rd_atomic: 0,
                min_rnr_timer: 0,
                port_num: 0,
                timeout: 0,
                retry_cnt: 0,
                rnr_retry: 0,
                alt_port_num: 0,
                alt_timeout: 0,
                rate_limit: 0,
            },
        }
    }

    /// A QP of type `ty` that something else moved to `state`, nothing set: what
    /// [`modify`](Self::modify) checks an `ibv_modify_qp` of a QP `rdma_create_qp` made
    /// against (librdmacm's CM moves that one, to the state its id's machine says).
    pub const fn in_state(ty: QpType, state: VerbsQpState) -> VerbsQp {
        let new = VerbsQp::new(ty);
        VerbsQp {
            state,
            attr: VerbsQpAttr {
                qp_state: state,
                cur_qp_state: state,
                ..new.attr
            },
            ..new
        }
    }

    /// The QP's type.
    pub const fn qp_type(&self) -> QpType {
        self.ty
    }

    /// The QP's state.
    pub const fn state(&self) -> VerbsQpState {
        self.state
    }

    /// The attributes set since creation or the last reset (never `STATE`).
    pub const fn attr_mask(&self) -> QpAttrMask {
        self.set
    }

    /// The attributes as `ibv_query_qp` reports them: those set, and the state.
    pub const fn attr(&self) -> VerbsQpAttr {
        VerbsQpAttr {
            qp_state: self.state,
            cur_qp_state: self.state,
            ..self.attr
        }
    }

    /// The QP went to ERR on its own (a completion error on the data path, a flush).
    pub const fn error(&self) -> VerbsQp {
        VerbsQp {
            state: VerbsQpState::Err,
            ..*self
        }
    }

    /// `ibv_modify_qp(qp, attr, mask)`: the machine after it, or `EINVAL` where the kernel
    /// refuses (a transition the table lacks, a required attribute missing, one it does not
    /// allow, a value out of the device's range) and `EOPNOTSUPP` for mask bits uverbs does not
    /// know. Nothing changes on a refusal.
    pub fn modify(
        &self,
        attr: &VerbsQpAttr,
        mask: QpAttrMask,
        limits: &VerbsLimits,
    ) -> Result<VerbsQp, CmError> {
        use QpAttrMask as M;
        if mask.bits() & !KNOWN != 0 {
            return Err(CmError::Os {
                call: Call::ModifyQp,
                errno: crate::errno::EOPNOTSUPP,
            });
        }
        // rxe_qp_chk_attr: the current state the caller names, if it names one.
        let cur = if mask.contains(M::CUR_STATE) {
            attr.cur_qp_state
        } else {
            self.state
        };
        let next = if mask.contains(M::STATE) {
            attr.qp_state
        } else {
            cur
        };
        if mask.contains(M::CUR_STATE)
            && !matches!(
                cur,
                VerbsQpState::Rtr | VerbsQpState::Rts | VerbsQpState::Sqd | VerbsQpState::Sqe
            )
        {
            return Err(invalid(
                "IBV_QP_CUR_STATE is allowed from RTR, RTS, SQD and SQE only",
            ));
        }
        let Some((required, optional)) = transition(self.ty, cur, next) else {
            return Err(invalid("no such QP state transition"));
        };
        if !mask.contains(required) {
            return Err(invalid(
                "an attribute the transition requires is missing from the mask",
            ));
        }
        if !mask.without(required.union(optional).union(M::STATE)).is_empty() {
            return Err(invalid(
                "the mask names an attribute the transition does not take",
            ));
        }
        let port_ok = |p: u8| p >= 1 && p <= limits.ports;
        if mask.contains(M::PORT) && !port_ok(attr.port_num) {
            return Err(invalid("port_num names no port of the device"));
        }
        if mask.contains(M::PKEY_INDEX) && attr.pkey_index >= limits.pkeys {
            return Err(invalid("pkey_index past the port's P_Key table"));
        }
        let av_ok = |av: &AddressVector| {
            // RoCE: every address vector carries a GRH, from a GID the port has.
            port_ok(av.port_num) && av.grh.is_some_and(|g| g.sgid_index < limits.gids)
        };
        if mask.contains(M::AV) && !av_ok(&attr.ah_attr) {
            return Err(invalid(
                "the address vector needs the port, a GRH and a source GID index the port has",
            ));
        }
        if mask.contains(M::ALT_PATH)
            && (!av_ok(&attr.alt_ah_attr) || !port_ok(attr.alt_port_num) || attr.alt_timeout > 31)
        {
            return Err(invalid("the alternate path is not one the device has"));
        }
        if mask.contains(M::PATH_MTU) && attr.path_mtu > limits.max_mtu {
            return Err(invalid("path_mtu above the port's largest MTU"));
        }
        if mask.contains(M::MAX_QP_RD_ATOMIC) && attr.max_rd_atomic > limits.max_rd_atomic {
            return Err(invalid("max_rd_atomic above the device's max_qp_rd_atom"));
        }
        if mask.contains(M::MAX_DEST_RD_ATOMIC) && attr.max_dest_rd_atomic > limits.max_rd_atomic {
            return Err(invalid("max_dest_rd_atomic above the device's max_qp_rd_atom"));
        }
        if mask.contains(M::TIMEOUT) && attr.timeout > 31 {
            return Err(invalid("timeout above 31"));
        }
        if next == VerbsQpState::Reset {
            // rxe_qp_reset: the QP is as new, whatever was set.
            return Ok(VerbsQp::new(self.ty));
        }
        let mut out = *self;
        out.state = next;
        out.set = out.set.union(mask.without(M::STATE.union(M::CUR_STATE)));
        let a = &mut out.attr;
        let copy = |bit: QpAttrMask| mask.contains(bit);
        if copy(M::ACCESS_FLAGS) {
            a.qp_access_flags = attr.qp_access_flags;
        }
        if copy(M::PKEY_INDEX) {
            a.pkey_index = attr.pkey_index;
        }
        if copy(M::PORT) {
            a.port_num = attr.port_num;
        }
        if copy(M::QKEY) {
            a.qkey = attr.qkey;
        }
        if copy(M::AV) {
            a.ah_attr = attr.ah_attr;
        }
        if copy(M::PATH_MTU) {
            a.path_mtu = attr.path_mtu;
        }
        if copy(M::TIMEOUT) {
            a.timeout = attr.timeout;
        }
        if copy(M::RETRY_CNT) {
            a.retry_cnt = attr.retry_cnt & 7;
        }
        if copy(M::RNR_RETRY) {
            a.rnr_retry = attr.rnr_retry & 7;
        }
        if copy(M::RQ_PSN) {
            a.rq_psn = attr.rq_psn & 0x00FF_FFFF;
        }
        if copy(M::SQ_PSN) {
            a.sq_psn = attr.sq_psn & 0x00FF_FFFF;
        }
        if copy(M::MAX_QP_RD_ATOMIC) {
            a.max_rd_atomic = attr.max_rd_atomic;
        }
        if copy(M::MAX_DEST_RD_ATOMIC) {
            a.max_dest_rd_atomic = attr.max_dest_rd_atomic;
        }
        if copy(M::MIN_RNR_TIMER) {
            a.min_rnr_timer = attr.min_rnr_timer & 0x1f;
        }
        if copy(M::DEST_QPN) {
            a.dest_qp_num = attr.dest_qp_num & 0x00FF_FFFF;
        }
        if copy(M::ALT_PATH) {
            a.alt_ah_attr = attr.alt_ah_attr;
            a.alt_port_num = attr.alt_port_num;
            a.alt_timeout = attr.alt_timeout;
            a.alt_pkey_index = attr.alt_pkey_index;
        }
        if copy(M::PATH_MIG_STATE) {
            a.path_mig_state = attr.path_mig_state;
        }
        if copy(M::EN_SQD_ASYNC_NOTIFY) {
            a.en_sqd_async_notify = attr.en_sqd_async_notify;
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::external::GlobalRoute;
    use QpAttrMask as M;
    use VerbsQpState::*;

    #[test]
    fn a_qp_moved_by_the_cm_takes_the_attributes_its_state_allows() {
        let rts = VerbsQp::in_state(QpType::Rc, Rts);
        assert_eq!(rts.state(), Rts);
        let rnr = VerbsQpAttr {
            min_rnr_timer: 12,
            ..VerbsQpAttr::default()
        };
        // qperf's server after ESTABLISHED: the RNR timer alone, no state (RTS -> RTS).
        let after = rts.modify(&rnr, M::MIN_RNR_TIMER, &VerbsLimits::RXE).unwrap();
        assert_eq!((after.state(), after.attr().min_rnr_timer), (Rts, 12));
        // INIT -> INIT takes no RNR timer.
        let init = VerbsQp::in_state(QpType::Rc, Init);
        assert_eq!(
            init.modify(&rnr, M::MIN_RNR_TIMER, &VerbsLimits::RXE)
                .unwrap_err()
                .errno(),
            22
        );
    }

    /// Every transition `ib_modify_qp_is_ok` has for RC and UD, written out as verbs.c's
    /// table has them (rows: from; columns: to).
    #[test]
    fn the_transitions_are_the_kernels_for_rc_and_ud() {
        // R I R R S S E  (RESET INIT RTR RTS SQD SQE ERR)
        let valid: [[u8; 7]; 7] = [
            [1, 1, 0, 0, 0, 0, 0],
            [1, 1, 1, 0, 0, 0, 1],
            [1, 0, 0, 1, 0, 0, 1],
            [1, 0, 0, 1, 1, 0, 1],
            [1, 0, 0, 1, 1, 0, 1],
            [1, 0, 0, 1, 0, 0, 1],
            [1, 0, 0, 0, 0, 0, 1],
        ];
        for ty in [QpType::Rc, QpType::Ud] {
            for (i, from) in VerbsQpState::ALL.into_iter().enumerate() {
                for (j, to) in VerbsQpState::ALL.into_iter().enumerate() {
                    assert_eq!(
                        transition(ty, from, to).is_some(),
                        valid[i][j] == 1,
                        "{ty:?} {from} -> {to}"
                    );
                }
            }
        }
    }

    #[test]
    fn each_transition_requires_and_allows_the_kernels_attributes() {
        let rc = |f, t| transition(QpType::Rc, f, t).unwrap();
        let ud = |f, t| transition(QpType::Ud, f, t).unwrap();
        let cases = [
            (
                rc(Reset, Init),
                (M::PKEY_INDEX | M::PORT | M::ACCESS_FLAGS, M::EMPTY),
            ),
            (ud(Reset, Init), (M::PKEY_INDEX | M::PORT | M::QKEY, M::EMPTY)),
            (
                rc(Init, Rtr),
                (
                    M::AV | M::PATH_MTU | M::DEST_QPN | M::RQ_PSN | M::MAX_DEST_RD_ATOMIC | M::MIN_RNR_TIMER,
                    M::ALT_PATH | M::ACCESS_FLAGS | M::PKEY_INDEX,
                ),
            ),
            (ud(Init, Rtr), (M::EMPTY, M::PKEY_INDEX | M::QKEY)),
            (
                rc(Rtr, Rts),
                (
                    M::TIMEOUT | M::RETRY_CNT | M::RNR_RETRY | M::SQ_PSN | M::MAX_QP_RD_ATOMIC,
                    M::CUR_STATE | M::ALT_PATH | M::ACCESS_FLAGS | M::MIN_RNR_TIMER | M::PATH_MIG_STATE,
                ),
            ),
            (ud(Rtr, Rts), (M::SQ_PSN, M::CUR_STATE | M::QKEY)),
            (rc(Rts, Sqd), (M::EMPTY, M::EN_SQD_ASYNC_NOTIFY)),
            (rc(Sqe, Rts), (M::EMPTY, M::EMPTY)),
            (ud(Sqe, Rts), (M::EMPTY, M::CUR_STATE | M::QKEY)),
            (rc(Err, Reset), (M::EMPTY, M::EMPTY)),
            (ud(Init, Err), (M::EMPTY, M::EMPTY)),
        ];
        for (got, want) in cases {
            assert_eq!(got, want);
        }
    }

    fn av(sgid_index: u8) -> AddressVector {
        AddressVector {
            grh: Some(GlobalRoute {
                dgid: [1; 16],
                sgid_index,
                hop_limit: 1,
                ..GlobalRoute::default()
            }),
            port_num: 1,
            ..AddressVector::default()
        }
    }

    const INIT_MASK: QpAttrMask = M::STATE
        .union(M::PKEY_INDEX)
        .union(M::PORT)
        .union(M::ACCESS_FLAGS);
    const RTR_MASK: QpAttrMask = M::STATE
        .union(M::AV)
        .union(M::PATH_MTU)
        .union(M::DEST_QPN)
        .union(M::RQ_PSN)
        .union(M::MAX_DEST_RD_ATOMIC)
        .union(M::MIN_RNR_TIMER);
    const RTS_MASK: QpAttrMask = M::STATE
        .union(M::TIMEOUT)
        .union(M::RETRY_CNT)
        .union(M::RNR_RETRY)
        .union(M::SQ_PSN)
        .union(M::MAX_QP_RD_ATOMIC);

    fn attr(state: VerbsQpState) -> VerbsQpAttr {
        VerbsQpAttr {
            qp_state: state,
            port_num: 1,
            path_mtu: 3,
            dest_qp_num: 0x1234,
            rq_psn: 7,
            sq_psn: 9,
            timeout: 14,
            retry_cnt: 7,
            rnr_retry: 7,
            min_rnr_timer: 12,
            max_rd_atomic: 1,
            max_dest_rd_atomic: 1,
            ah_attr: av(1),
            ..VerbsQpAttr::default()
        }
    }

    fn rts() -> VerbsQp {
        let l = VerbsLimits::RXE;
        VerbsQp::new(QpType::Rc)
            .modify(&attr(Init), INIT_MASK, &l)
            .and_then(|q| q.modify(&attr(Rtr), RTR_MASK, &l))
            .and_then(|q| q.modify(&attr(Rts), RTS_MASK, &l))
            .unwrap()
    }

    #[test]
    fn an_rc_qp_goes_reset_init_rtr_rts_and_keeps_what_was_set() {
        let q = rts();
        assert_eq!(q.state(), Rts);
        let a = q.attr();
        assert_eq!(
            (
                a.qp_state,
                a.dest_qp_num,
                a.rq_psn,
                a.sq_psn,
                a.timeout,
                a.path_mtu
            ),
            (Rts, 0x1234, 7, 9, 14, 3)
        );
        assert_eq!(a.ah_attr, av(1));
        assert!(q.attr_mask().contains(M::DEST_QPN | M::SQ_PSN | M::PORT));
        assert!(!q.attr_mask().contains(M::STATE));
    }

    #[test]
    fn refusals_are_einval_and_change_nothing() {
        let l = VerbsLimits::RXE;
        let init = VerbsQp::new(QpType::Rc)
            .modify(&attr(Init), INIT_MASK, &l)
            .unwrap();
        let einval = |r: Result<VerbsQp, CmError>| r.map(|_| ()).map_err(|e| e.errno());
        let cases: Vec<(&str, VerbsQpAttr, QpAttrMask)> = vec![
            ("RTR without DEST_QPN", attr(Rtr), RTR_MASK.without(M::DEST_QPN)),
            ("RTR with SQ_PSN", attr(Rtr), RTR_MASK | M::SQ_PSN),
            ("INIT to RTS", attr(Rts), RTS_MASK),
            ("CUR_STATE from INIT", attr(Rtr), RTR_MASK | M::CUR_STATE),
            (
                "an AV without GRH",
                VerbsQpAttr {
                    ah_attr: AddressVector {
                        port_num: 1,
                        ..AddressVector::default()
                    },
                    ..attr(Rtr)
                },
                RTR_MASK,
            ),
            (
                "a source GID the port lacks",
                VerbsQpAttr {
                    ah_attr: av(2),
                    ..attr(Rtr)
                },
                RTR_MASK,
            ),
            (
                "an MTU above 4096",
                VerbsQpAttr {
                    path_mtu: 6,
                    ..attr(Rtr)
                },
                RTR_MASK,
            ),
            (
                "too many responder resources",
                VerbsQpAttr {
                    max_dest_rd_atomic: 129,
                    ..attr(Rtr)
                },
                RTR_MASK,
            ),
            (
                "port 2",
                VerbsQpAttr {
                    port_num: 2,
                    ..attr(Init)
                },
                INIT_MASK,
            ),
            (
                "pkey index 1",
                VerbsQpAttr {
                    pkey_index: 1,
                    ..attr(Init)
                },
                INIT_MASK,
            ),
            ("CAP", attr(Init), INIT_MASK | M::CAP),
        ];
        for (what, a, mask) in cases {
            assert_eq!(einval(init.modify(&a, mask, &l)), Result::Err(22), "{what}");
        }
        let rtr = init.modify(&attr(Rtr), RTR_MASK, &l).unwrap();
        let cases = [
            ("RTS without TIMEOUT", attr(Rts), RTS_MASK.without(M::TIMEOUT)),
            (
                "timeout 32",
                VerbsQpAttr {
                    timeout: 32,
                    ..attr(Rts)
                },
                RTS_MASK,
            ),
            (
                "max_rd_atomic 129",
                VerbsQpAttr {
                    max_rd_atomic: 129,
                    ..attr(Rts)
                },
                RTS_MASK,
            ),
        ];
        for (what, a, mask) in cases {
            assert_eq!(einval(rtr.modify(&a, mask, &l)), Result::Err(22), "{what}");
        }
        assert_eq!(
            einval(rtr.modify(&attr(Rts), RTS_MASK | QpAttrMask::from_bits(1 << 27), &l)),
            Result::Err(crate::errno::EOPNOTSUPP)
        );
    }

    #[test]
    fn err_leaves_only_to_reset_and_reset_forgets_everything() {
        let l = VerbsLimits::RXE;
        let err = rts().modify(&attr(Err), M::STATE, &l).unwrap();
        assert_eq!(err.state(), Err);
        assert!(err.modify(&attr(Rts), M::STATE, &l).is_err());
        assert!(err.modify(&attr(Init), INIT_MASK, &l).is_err());
        let reset = err.modify(&attr(Reset), M::STATE, &l).unwrap();
        assert_eq!(reset, VerbsQp::new(QpType::Rc));
        assert_eq!(reset.modify(&attr(Init), INIT_MASK, &l).unwrap().state(), Init);
    }

    #[test]
    fn a_mask_without_state_modifies_in_place() {
        let l = VerbsLimits::RXE;
        let q = rts();
        let a = VerbsQpAttr {
            min_rnr_timer: 3,
            ..attr(Rts)
        };
        let q2 = q.modify(&a, M::MIN_RNR_TIMER, &l).unwrap();
        assert_eq!((q2.state(), q2.attr().min_rnr_timer), (Rts, 3));
        // CUR_STATE names the state the check starts from.
        let named = VerbsQpAttr {
            cur_qp_state: Rts,
            ..attr(Sqd)
        };
        assert_eq!(
            q.modify(&named, M::STATE | M::CUR_STATE, &l)
                .map(|q| q.state())
                .ok(),
            None
        );
        let sqd = q.modify(&attr(Sqd), M::STATE, &l).unwrap();
        assert_eq!(sqd.state().data_path(), QpState::Rtr);
        assert_eq!(sqd.modify(&attr(Rts), M::STATE, &l).unwrap().state(), Rts);
    }

    #[test]
    fn a_ud_qp_takes_a_qkey_and_needs_only_the_send_psn_for_rts() {
        let l = VerbsLimits::RXE;
        let mut a = attr(Init);
        a.qkey = 0x1111_1111;
        let q = VerbsQp::new(QpType::Ud);
        assert!(q.modify(&a, INIT_MASK, &l).is_err(), "ACCESS_FLAGS is RC's");
        let q = q
            .modify(&a, M::STATE | M::PKEY_INDEX | M::PORT | M::QKEY, &l)
            .unwrap();
        let q = q.modify(&attr(Rtr), M::STATE, &l).unwrap();
        let q = q.modify(&attr(Rts), M::STATE | M::SQ_PSN, &l).unwrap();
        assert_eq!((q.state(), q.attr().qkey), (Rts, 0x1111_1111));
    }

    #[test]
    fn states_convert_from_and_to_their_verbs_values() {
        for s in VerbsQpState::ALL {
            assert_eq!(VerbsQpState::from_raw(s.raw()), Some(s));
        }
        assert_eq!(VerbsQpState::from_raw(7), None);
        assert_eq!(QpType::from_raw(2), Some(QpType::Rc));
        assert_eq!(QpType::from_raw(3), None);
    }
}
