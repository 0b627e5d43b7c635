//! External QPs: `rdma_init_qp_attr`, `rdma_establish`, and the raw pointers an application
//! needs to create and drive its own QP on an id's device with another verbs crate.

use std::ptr::NonNull;

use cm_core::{AddressVector, GlobalRoute, IdHandle, QpAttr, QpAttrMask, QpState, Result};

use super::{check, ffi, Errno, Id};
use crate::HwBackend;

/// The raw librdmacm objects behind one id of an [`HwBackend`], from
/// [`HwBackend::raw_id`]: for creating and driving a QP with another verbs crate (an external
/// QP; see [`cm_core::QpAttr`]).
///
/// Every pointer stays valid until the id is destroyed
/// ([`destroy_id`](cm_core::CmBackend::destroy_id)) or the backend is dropped, whichever
/// comes first; `verbs` and `pd` also stay valid as long as any other id of the backend on the
/// same device lives. The backend keeps owning all of them: never free, destroy or close one,
/// never call librdmacm on `id` or `channel` (the backend's bookkeeping of events and states
/// would go wrong), and destroy every QP, CQ and memory region made on `pd` before the id.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct RawId {
    /// The `struct rdma_cm_id`.
    pub id: NonNull<ffi::rdma_cm_id>,
    /// Its event channel.
    pub channel: NonNull<ffi::rdma_event_channel>,
    /// `id->verbs`, the open device context; `None` while the id has no device.
    pub verbs: Option<NonNull<ffi::ibv_context>>,
    /// `id->pd`, librdmacm's protection domain for the device (one per device, shared by every
    /// id on it); `None` while the id has no device.
    pub pd: Option<NonNull<ffi::ibv_pd>>,
}

fn qp_state_raw(state: QpState) -> ffi::ibv_qp_state::Type {
    match state {
        QpState::Reset => ffi::ibv_qp_state::IBV_QPS_RESET,
        QpState::Init => ffi::ibv_qp_state::IBV_QPS_INIT,
        QpState::Rtr => ffi::ibv_qp_state::IBV_QPS_RTR,
        QpState::Rts => ffi::ibv_qp_state::IBV_QPS_RTS,
        QpState::Err => ffi::ibv_qp_state::IBV_QPS_ERR,
    }
}

/// The attributes `rdma_init_qp_attr` filled, in the crate's own type.
fn qp_attr_from_raw(raw: &ffi::ibv_qp_attr, mask: i32, state: QpState) -> QpAttr {
    let mask = QpAttrMask::from_bits(mask as u32);
    let ah = &raw.ah_attr;
    // SAFETY: the GID is a union of a byte array and two 64-bit integers; every bit pattern is
    // a valid byte array.
    let dgid = unsafe { ah.grh.dgid.raw };
    QpAttr {
        mask,
        qp_state: Some(state),
        pkey_index: raw.pkey_index,
        port_num: raw.port_num,
        qp_access_flags: raw.qp_access_flags,
        path_mtu: u8::try_from(raw.path_mtu).unwrap_or(0),
        dest_qp_num: raw.dest_qp_num,
        rq_psn: raw.rq_psn,
        sq_psn: raw.sq_psn,
        timeout: raw.timeout,
        retry_cnt: raw.retry_cnt,
        rnr_retry: raw.rnr_retry,
        max_rd_atomic: raw.max_rd_atomic,
        max_dest_rd_atomic: raw.max_dest_rd_atomic,
        min_rnr_timer: raw.min_rnr_timer,
        qkey: raw.qkey,
        ah_attr: AddressVector {
            dlid: ah.dlid,
            sl: ah.sl,
            src_path_bits: ah.src_path_bits,
            static_rate: ah.static_rate,
            grh: (ah.is_global != 0).then_some(GlobalRoute {
                dgid,
                flow_label: ah.grh.flow_label,
                sgid_index: ah.grh.sgid_index,
                hop_limit: ah.grh.hop_limit,
                traffic_class: ah.grh.traffic_class,
            }),
            port_num: ah.port_num,
        },
    }
}

impl Id {
    /// `rdma_init_qp_attr` for `state`. Refused with `EINVAL` without a device (the kernel
    /// would refuse it too, but the answer would not say why).
    pub(crate) fn init_qp_attr(&self, state: QpState) -> std::result::Result<QpAttr, Errno> {
        if self.verbs().is_none() {
            return Err(libc::EINVAL);
        }
        // SAFETY: ibv_qp_attr is plain integers, arrays and a union of them: all zero is valid.
        let mut raw: ffi::ibv_qp_attr = unsafe { std::mem::zeroed() };
        raw.qp_state = qp_state_raw(state);
        let mut mask: i32 = 0;
        // SAFETY: the id is alive and has a device; `raw` and `mask` are valid out-pointers for
        // the call's duration; librdmacm only reads `qp_state` and writes both.
        check(unsafe { ffi::rdma_init_qp_attr(self.raw(), &mut raw, &mut mask) })?;
        Ok(qp_attr_from_raw(&raw, mask, state))
    }

    /// `rdma_establish`. Refused with `EINVAL` while librdmacm has a QP on the id (its own
    /// check, made here first so nothing is sent).
    pub(crate) fn establish(&self) -> std::result::Result<(), Errno> {
        if self.has_qp() {
            return Err(libc::EINVAL);
        }
        // SAFETY: the id is alive and has no QP, so librdmacm only sends the kernel's ACCEPT
        // command (the RTU) and touches no QP.
        check(unsafe { ffi::rdma_establish(self.raw()) })
    }

    /// The id's raw pointers.
    pub(crate) fn raw_parts(&self) -> RawId {
        let id = self.raw();
        // SAFETY: the id is alive (type invariant); reading pointer fields.
        let (channel, verbs, pd) = unsafe { ((*id).channel, (*id).verbs, (*id).pd) };
        RawId {
            id: self.ptr,
            channel: NonNull::new(channel).expect("an asynchronous id has a channel"),
            verbs: NonNull::new(verbs),
            pd: NonNull::new(pd),
        }
    }
}

impl HwBackend {
    /// The raw librdmacm pointers of `id` (the escape hatch for external QPs): create a QP on
    /// `pd` with another verbs crate, move it with [`init_qp_attr`](cm_core::CmBackend::init_qp_attr)'s
    /// attributes, and [`connect`](cm_core::CmBackend::connect) or
    /// [`accept`](cm_core::CmBackend::accept) with its number
    /// ([`ConnParam::with_qp_num`](cm_core::ConnParam::with_qp_num)).
    ///
    /// # Safety
    ///
    /// Calling this is safe in itself; it is `unsafe` because what the pointers allow is not:
    /// the caller must keep the rules of [`RawId`] — use the pointers only until the id is
    /// destroyed or the backend dropped, never release what they point to, never call
    /// librdmacm on the id or its channel, and destroy everything made on the PD before the id.
    ///
    /// # Errors
    ///
    /// [`CmError::UnknownHandle`](cm_core::CmError::UnknownHandle) for an id this backend does
    /// not know.
    ///
    /// ```no_run
    /// use cm_core::{CmBackend, PortSpace};
    ///
    /// # fn main() -> cm_core::Result<()> {
    /// let mut hw = cm_hw::HwBackend::new()?;
    /// let ch = hw.create_event_channel()?;
    /// let id = hw.create_id(ch, PortSpace::Tcp)?;
    /// hw.bind_addr(id, "192.0.2.1:0".parse().unwrap())?;
    /// // SAFETY: only read here; the id outlives the use.
    /// let raw = unsafe { hw.raw_id(id)? };
    /// assert!(raw.pd.is_some(), "bound to a device: librdmacm made its PD");
    /// # Ok(()) }
    /// ```
    pub unsafe fn raw_id(&self, id: IdHandle) -> Result<RawId> {
        Ok(self.raw_entry(id)?.raw_parts())
    }
}
