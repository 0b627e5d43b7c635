//! `rdma_set_option` and `rdma_migrate_id` on the hardware backend.

use cm_core::{Call, ChannelHandle, CmError, IdHandle, IdOption, Result};

use super::HwBackend;
use crate::convert::os_error;

impl HwBackend {
    pub(super) fn set_option_checked(&mut self, id: IdHandle, option: IdOption) -> Result<()> {
        let e = self.id(Call::SetOption, id)?;
        e.machine.set_option(option)?;
        e.raw
            .set_option(option)
            .map_err(|err| os_error(Call::SetOption, err))
    }

    pub(super) fn migrate_id_checked(&mut self, id: IdHandle, channel: ChannelHandle) -> Result<()> {
        let index = self.id_index(Call::MigrateId, id)?;
        let to = self.channel_index(Call::MigrateId, channel)?;
        let entry = self.ids.at(index).expect("checked");
        entry.machine.migrate()?;
        if entry.channel == to {
            return Ok(());
        }
        let ch = &self.channels.at(to).expect("checked").raw;
        let entry = self.ids.at_mut(index).expect("checked");
        entry.raw.migrate(ch).map_err(|err| match err {
            // Only an event the machine does not count can still be outstanding here.
            libc::EBUSY => CmError::UnackedEvents {
                call: Call::MigrateId,
                count: entry.machine.unacked().max(1),
            },
            err => os_error(Call::MigrateId, err),
        })?;
        entry.channel = to;
        Ok(())
    }
}
