//! External QPs on the hardware backend: `rdma_init_qp_attr` and `rdma_establish`, checked
//! against the id's machine first like every call.

use cm_core::{Call, CmError, IdHandle, QpAttr, QpState, Result};

use super::HwBackend;
use crate::convert::os_error;
use crate::sys;

impl HwBackend {
    /// The raw id of a live id of this backend (for [`HwBackend::raw_id`]).
    pub(crate) fn raw_entry(&self, id: IdHandle) -> Result<&sys::Id> {
        // No call of librdmacm's is made; the errors name the nearest one.
        let index = self.id_index(Call::GetLocalAddr, id)?;
        Ok(&self.ids.at(index).expect("checked").raw)
    }

    pub(super) fn init_qp_attr_checked(&mut self, id: IdHandle, qp_state: QpState) -> Result<QpAttr> {
        let call = Call::InitQpAttr;
        let e = self.id(call, id)?;
        e.machine.init_qp_attr(qp_state)?;
        if e.raw.verbs().is_none() {
            return Err(CmError::NoDevice { call });
        }
        e.raw.init_qp_attr(qp_state).map_err(|err| os_error(call, err))
    }

    pub(super) fn establish_checked(&mut self, id: IdHandle) -> Result<()> {
        let call = Call::Establish;
        let e = self.id(call, id)?;
        let next = e.machine.establish()?;
        if e.qp.is_some() || e.raw.has_qp() {
            return Err(CmError::BackendQp { call });
        }
        e.raw.establish().map_err(|err| os_error(call, err))?;
        e.machine = next;
        Ok(())
    }
}
