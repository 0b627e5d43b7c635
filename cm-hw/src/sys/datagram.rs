//! UD datagrams: the SIDR reply's UD parameters, address handles (made from [`AhAttr`] values
//! on first use and destroyed with their QP), sends to a destination, and the sender of a
//! receive, read from its completion and the GRH in front of its payload.

use std::collections::HashMap;
use std::ptr::{self, NonNull};

use cm_core::{AhAttr, UdParam, UdSender, GRH_LEN};
use rdma_sys as ffi;

use super::{last_errno, Errno, Event, Qp};

/// A UD QP's own state: its port (for `ibv_init_ah_from_wc`) and its address handles.
pub(crate) struct UdState {
    port_num: u8,
    ahs: HashMap<AhAttr, NonNull<ffi::ibv_ah>>,
}

impl UdState {
    pub(super) fn new(port_num: u8) -> Self {
        UdState {
            port_num,
            ahs: HashMap::new(),
        }
    }

    /// Destroys every address handle. After the QP: no send that uses one is in flight.
    pub(super) fn destroy(self) {
        for ah in self.ahs.into_values() {
            // SAFETY: made by ibv_create_ah below and destroyed once (consumed); the QP that
            // sent with it is destroyed, so no work request refers to it. A failure leaks it.
            let _ = unsafe { ffi::ibv_destroy_ah(ah.as_ptr()) };
        }
    }
}

fn to_raw(a: &AhAttr) -> ffi::ibv_ah_attr {
    ffi::ibv_ah_attr {
        grh: ffi::ibv_global_route {
            dgid: ffi::ibv_gid { raw: a.dgid },
            flow_label: a.flow_label,
            sgid_index: a.sgid_index,
            hop_limit: a.hop_limit,
            traffic_class: a.traffic_class,
        },
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: u8::from(a.is_global),
        port_num: a.port_num,
    }
}

fn from_raw(a: &ffi::ibv_ah_attr) -> AhAttr {
    AhAttr {
        // SAFETY: every bit pattern of the union is a valid byte array.
        dgid: unsafe { a.grh.dgid.raw },
        flow_label: a.grh.flow_label,
        sgid_index: a.grh.sgid_index,
        hop_limit: a.grh.hop_limit,
        traffic_class: a.grh.traffic_class,
        dlid: a.dlid,
        sl: a.sl,
        src_path_bits: a.src_path_bits,
        static_rate: a.static_rate,
        is_global: a.is_global != 0,
        port_num: a.port_num,
    }
}

impl Event {
    /// `param.ud` of the event: the remote QP, its Q_Key and the address handle attributes.
    /// Only meaningful for the events librdmacm fills it for (datagram ids' `ESTABLISHED`).
    pub(crate) fn ud_param(&self) -> UdParam {
        let ev = self.raw();
        // SAFETY: the event is alive until acked (type invariant); reading plain fields of its
        // `param.ud`, which librdmacm fills for datagram ids.
        let ud = unsafe { &(*ev).param.ud };
        UdParam {
            qp_num: ud.qp_num & 0x00FF_FFFF,
            qkey: ud.qkey,
            ah_attr: from_raw(&ud.ah_attr),
        }
    }
}

impl Qp {
    /// Whether this is a UD QP (its receive slots hold a GRH in front of the payload).
    pub(crate) fn is_ud(&self) -> bool {
        self.ud.is_some()
    }

    /// Copies `data` into send slot `slot` and posts a signalled SEND_WITH_IMM of it to `dest`
    /// (the immediate is this QP's number, which rdma-core's `udaddy` answers to), making the
    /// address handle for `dest.ah_attr` on first use.
    pub(crate) fn post_send_to(&mut self, slot: u32, data: &[u8], dest: &UdParam) -> Result<(), Errno> {
        let lkey = self.register_slots()?;
        let dst = self.slot_ptr(slot, data.len())?;
        let pd = self.pd.inner.ptr.as_ptr();
        let Some(ud) = self.ud.as_mut() else {
            return Err(libc::EINVAL);
        };
        let ah = match ud.ahs.get(&dest.ah_attr) {
            Some(ah) => *ah,
            None => {
                let mut attr = to_raw(&dest.ah_attr);
                // SAFETY: the PD is alive (the QP holds it); `attr` is a valid ibv_ah_attr the
                // call only reads. A bad attribute (unknown GID index, say) fails with NULL.
                let ah = unsafe { ffi::ibv_create_ah(pd, &mut attr) };
                let ah = NonNull::new(ah).ok_or_else(last_errno)?;
                ud.ahs.insert(dest.ah_attr, ah);
                ah
            }
        };
        // SAFETY: `dst` is valid for `data.len()` bytes inside our buffer (checked above); the
        // slot is not posted (the caller owns it), so the device does not touch it now.
        unsafe { ptr::copy_nonoverlapping(data.as_ptr(), dst, data.len()) };
        let mut sge = ffi::ibv_sge {
            addr: dst as u64,
            length: data.len() as u32,
            lkey,
        };
        // SAFETY: all-zero is a valid ibv_send_wr (integers, NULL pointers, plain unions).
        let mut wr: ffi::ibv_send_wr = unsafe { std::mem::zeroed() };
        wr.wr_id = u64::from(slot);
        wr.sg_list = &mut sge;
        wr.num_sge = i32::from(!data.is_empty());
        wr.opcode = ffi::ibv_wr_opcode::IBV_WR_SEND_WITH_IMM;
        wr.send_flags = ffi::ibv_send_flags::IBV_SEND_SIGNALED.0;
        // SAFETY: the QP is alive; reading its number.
        let own_qpn = unsafe { (*self.qp.as_ptr()).qp_num };
        wr.imm_data_invalidated_rkey_union.imm_data = own_qpn.to_be();
        wr.wr.ud = ffi::ud_t {
            ah: ah.as_ptr(),
            remote_qpn: dest.qp_num & 0x00FF_FFFF,
            remote_qkey: dest.qkey,
        };
        let mut bad: *mut ffi::ibv_send_wr = ptr::null_mut();
        // SAFETY: the QP is alive; the WR and its SGE live across the call (the provider copies
        // them); the SGE lies in our registered MR; the address handle stays alive until the QP
        // is destroyed (`UdState::destroy` runs after it).
        let ret = unsafe { ffi::ibv_post_send(self.qp.as_ptr(), &mut wr, &mut bad) };
        if ret == 0 {
            Ok(())
        } else {
            Err(ret)
        }
    }

    /// The sender of a successful UD receive in slot `slot` whose completion is `wc`: its QP,
    /// the address in the GRH, and `ibv_init_ah_from_wc`'s way back (or, where that fails, a
    /// route to the address).
    pub(super) fn datagram_sender(&self, slot: u32, wc: &ffi::ibv_wc) -> Option<UdSender> {
        let ud = self.ud.as_ref()?;
        let grh = self.slot_ptr(slot, GRH_LEN).ok()?;
        let mut head = [0u8; GRH_LEN];
        // SAFETY: `grh` is valid for GRH_LEN bytes of our buffer (checked); the receive has
        // completed, so the device no longer writes there.
        unsafe { ptr::copy_nonoverlapping(grh, head.as_mut_ptr(), GRH_LEN) };
        let addr = cm_core::grh_source(&head);
        // SAFETY: all-zero is a valid ibv_ah_attr (integers and a byte union).
        let mut attr: ffi::ibv_ah_attr = unsafe { std::mem::zeroed() };
        // SAFETY: the context is the QP's open device context; `wc` is a completion just polled
        // from this QP's CQ; `grh` points at the 40 bytes the device wrote in front of the
        // payload; `attr` is a valid out-parameter.
        let ret = unsafe {
            ffi::ibv_init_ah_from_wc(
                self.pd.context().0.as_ptr(),
                ud.port_num,
                ptr::from_ref(wc).cast_mut(),
                grh.cast(),
                &mut attr,
            )
        };
        let ah_attr = if ret == 0 {
            from_raw(&attr)
        } else {
            AhAttr::for_ip(addr?)
        };
        Some(UdSender {
            qp_num: wc.src_qp & 0x00FF_FFFF,
            addr,
            ah_attr,
        })
    }

    /// Copies the payload of a UD receive in slot `slot` (`byte_len` counts the GRH too).
    pub(crate) fn read_datagram(&self, slot: u32, byte_len: u32) -> Vec<u8> {
        let payload = (byte_len as usize).saturating_sub(GRH_LEN);
        let mut whole = self.read_slot(slot, GRH_LEN + payload);
        if whole.len() < GRH_LEN {
            return Vec::new();
        }
        whole.drain(..GRH_LEN);
        whole
    }
}
