//! Handles: small `Copy` names for event channels, ids, memory regions and shared receive
//! queues.
//!
//! A handle is an index into its backend's storage plus a generation that changes every time a
//! slot is reused, and the tag of the backend instance that made it. A backend therefore detects
//! a destroyed handle (generation moved on), an unknown one (no such slot) and a foreign one (tag
//! of another backend) and answers [`CmError::UnknownHandle`](crate::CmError::UnknownHandle)
//! instead of touching memory that is no longer what the caller thinks it is.

use std::fmt;
use std::sync::atomic::{AtomicU32, Ordering};

/// Draws a tag no other backend instance in this process has, for stamping handles.
///
/// Tags only tell instances apart; they never appear in traces, so they do not disturb a
/// simulator's byte-for-byte determinism.
pub fn next_backend_tag() -> u32 {
    static NEXT: AtomicU32 = AtomicU32::new(1);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

macro_rules! handle {
    ($(#[$doc:meta])* $name:ident, $prefix:literal) => {
        $(#[$doc])*
        #[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name {
            owner: u32,
            index: u32,
            generation: u32,
        }

        impl $name {
            pub(crate) const fn new(owner: u32, index: u32, generation: u32) -> Self {
                Self { owner, index, generation }
            }

            /// Tag of the backend instance that issued the handle.
            pub const fn owner(self) -> u32 {
                self.owner
            }

            /// Slot index inside the issuing backend.
            pub const fn index(self) -> u32 {
                self.index
            }

            /// Generation of the slot when the handle was issued.
            pub const fn generation(self) -> u32 {
                self.generation
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "#{}.{}"), self.index, self.generation)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                write!(f, concat!($prefix, "#{}"), self.index)
            }
        }
    };
}

handle!(
    /// An event channel (`struct rdma_event_channel`).
    ChannelHandle,
    "ch"
);
handle!(
    /// A connection-manager id (`struct rdma_cm_id`).
    IdHandle,
    "id"
);
handle!(
    /// A registered memory region (`struct ibv_mr`).
    MrHandle,
    "mr"
);
handle!(
    /// A shared receive queue (`struct ibv_srq`).
    SrqHandle,
    "srq"
);
handle!(
    /// A verbs QP no connection-manager id owns (`ibv_create_qp`).
    QpHandle,
    "qp"
);

/// Which kind of handle an error talks about.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum HandleKind {
    /// An event channel.
    Channel,
    /// A connection-manager id.
    Id,
    /// A memory region.
    Mr,
    /// A shared receive queue.
    Srq,
    /// A verbs QP no id owns.
    Qp,
}

impl fmt::Display for HandleKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            HandleKind::Channel => "event channel",
            HandleKind::Id => "cm id",
            HandleKind::Mr => "memory region",
            HandleKind::Srq => "shared receive queue",
            HandleKind::Qp => "queue pair",
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tags_are_distinct() {
        let a = next_backend_tag();
        let b = next_backend_tag();
        assert_ne!(a, b);
    }

    #[test]
    fn display_hides_owner_and_generation() {
        let id = IdHandle::new(77, 3, 9);
        assert_eq!(id.to_string(), "id#3");
        assert_eq!(format!("{id:?}"), "id#3.9");
        assert_eq!((id.owner(), id.index(), id.generation()), (77, 3, 9));
        assert_ne!(id, IdHandle::new(78, 3, 9));
    }
}
