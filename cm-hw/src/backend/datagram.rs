//! Datagram sends on UD QPs: the checks of `post_send`, then a send to a destination.

use cm_core::{Call, CmError, IdHandle, QpState, Result, UdParam, WcOpcode};

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
        // The machine refuses connected QPs, on which verbs would ignore the destination.
        e.machine.post_send_to()?;
        let Some(q) = e.qp.as_mut() else {
            return Err(CmError::NoQp { call });
        };
        q.caps.check_length(WcOpcode::Send, data.len())?;
        if e.machine.qp() != Some(QpState::Err) && q.device_failed().map_err(|err| os_error(call, err))? {
            e.machine = e.machine.qp_error();
        }
        let outstanding = q.pool.outstanding(WcOpcode::Send);
        if outstanding >= q.caps.max_send_wr {
            return Err(CmError::QueueFull { call, outstanding });
        }
        if e.machine.qp() == Some(QpState::Err) {
            let taken = q.pool.flush(WcOpcode::Send, wr_id);
            debug_assert!(taken, "checked the slot");
            return Ok(());
        }
        let slot = q
            .pool
            .post(WcOpcode::Send, wr_id, data.len() as u32)
            .expect("checked the slot");
        if let Err(err) = q.raw.post_send_to(slot, data, dest) {
            q.pool.unpost(slot);
            return Err(os_error(call, err));
        }
        Ok(())
    }
}
