//! Datagram sends on UD QPs: the checks of `post_send`, then a send to a destination.

use cm_core::backend::{datagram_gate, Admission};
use cm_core::{Call, CmError, IdHandle, Result, UdParam, WcOpcode};

use super::HwBackend;
use crate::convert::os_error;

impl HwBackend {
    /// [`CmBackend::post_send_to`](cm_core::CmBackend::post_send_to): refused as the simulator
    /// refuses it, flushed on a QP in ERR, otherwise posted with the destination's address
    /// handle (made once per destination and QP).
    pub(super) fn send_datagram(
        &mut self,
        id: IdHandle,
        wr_id: u64,
        dest: &UdParam,
        data: &[u8],
    ) -> Result<()> {
        let call = Call::PostSend;
        let e = self.id(call, id)?;
        let Some(q) = e.qp.as_mut() else {
            // The machine names the refusal (no QP, or a state that allows nothing).
            e.machine.post_send_to()?;
            return Err(CmError::NoQp { call });
        };
        // The gate also refuses connected QPs, on which verbs would ignore the destination.
        let (caps, outstanding) = (q.caps, q.pool.outstanding(WcOpcode::Send));
        let device_failed = || q.device_failed().map_err(|err| os_error(call, err));
        if datagram_gate(&mut e.machine, &caps, data.len(), outstanding, device_failed)? == Admission::Flush {
            let taken = q.pool.flush(WcOpcode::Send, wr_id);
            debug_assert!(taken, "the gate checked the slot");
            return Ok(());
        }
        let slot = q
            .pool
            .post(WcOpcode::Send, wr_id, data.len() as u32)
            .expect("the gate checked the slot");
        if let Err(err) = q.raw.post_send_to(slot, data, dest) {
            q.pool.unpost(slot);
            return Err(os_error(call, err));
        }
        Ok(())
    }
}
