//! The one error type of the application layer.

use cm_core::{CmError, WcStatus};

/// What an operation of the layer can fail with. Events that end a connection attempt or a
/// connection become their own variants, with the status librdmacm reported.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A backend call failed.
    #[error(transparent)]
    Cm(#[from] CmError),
    /// `ADDR_ERROR`: the destination's address did not resolve.
    #[error("address resolution failed (ADDR_ERROR, status {status})")]
    AddrError {
        /// The event's status (a negative errno).
        status: i32,
    },
    /// `ROUTE_ERROR`: no route to the destination.
    #[error("route resolution failed (ROUTE_ERROR, status {status})")]
    RouteError {
        /// The event's status.
        status: i32,
    },
    /// `REJECTED`: the peer (or its CM) refused the connection.
    #[error("connection rejected (REJECTED, status {status}, {} bytes of private data)", private_data.len())]
    Rejected {
        /// The IB CM reject reason (28: the application rejected, 8: no listener).
        status: i32,
        /// The private data the rejecting side sent (padded to the IB CM's size).
        private_data: Vec<u8>,
    },
    /// `UNREACHABLE`: the peer did not answer.
    #[error("peer unreachable (UNREACHABLE, status {status})")]
    Unreachable {
        /// The event's status (`-ETIMEDOUT`, or a SIDR status).
        status: i32,
    },
    /// `CONNECT_ERROR`: establishing failed locally.
    #[error("connection failed locally (CONNECT_ERROR, status {status})")]
    ConnectError {
        /// The event's status.
        status: i32,
    },
    /// The connection was disconnected (`DISCONNECTED`, or the peer went away during the
    /// handshake); nothing more can be sent or received.
    #[error("disconnected (status {status})")]
    Disconnected {
        /// The event's status (0, or `-ETIMEDOUT` when the DREQ went unanswered).
        status: i32,
    },
    /// `DEVICE_REMOVAL`: the RDMA device went away.
    #[error("the RDMA device was removed")]
    DeviceRemoved,
    /// A work request completed with an error status (`WR_FLUSH_ERR` once the QP left RTS).
    #[error("work request failed: {status}")]
    Completion {
        /// The completion's status.
        status: WcStatus,
    },
    /// The operation did not finish within its timeout: its own bound
    /// ([`ConnOptions::connect_timeout`](crate::ConnOptions::connect_timeout),
    /// [`disconnect_timeout`](crate::ConnOptions::disconnect_timeout)) or a
    /// [`Runtime::timeout`](crate::Runtime::timeout) around it.
    #[error("{op} timed out")]
    TimedOut {
        /// Which operation: the layer's name for it (`"connect"`, `"accept"`, `"send"`,
        /// `"recv"`, `"read"`, `"write"`, `"disconnect"`, ... as [`Elapsed::op`] lists them),
        /// or `"operation"` when a timeout cut short a future that waited in none of them.
        ///
        /// [`Elapsed::op`]: crate::Elapsed::op
        op: &'static str,
    },
    /// The event channel's driver is gone (its backend failed, or the host crashed).
    #[error("the event channel failed: {0}")]
    ChannelFailed(CmError),
    /// A `tokio::CmThread`'s thread is gone (it could not start, or it
    /// panicked), or the handle's object was released there.
    #[error("the thread driving the channel is gone")]
    DriverGone,
}

impl Error {
    /// Whether trying again (a new connection) can help: the peer's answer or its absence,
    /// not a misuse of the API.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            Error::AddrError { .. }
                | Error::RouteError { .. }
                | Error::Rejected { .. }
                | Error::Unreachable { .. }
                | Error::ConnectError { .. }
                | Error::Disconnected { .. }
                | Error::Completion { .. }
                | Error::TimedOut { .. }
        )
    }
}

/// Result of the layer's operations.
pub type Result<T, E = Error> = std::result::Result<T, E>;

impl From<crate::runtime::Elapsed> for Error {
    fn from(e: crate::runtime::Elapsed) -> Self {
        Error::TimedOut { op: e.op() }
    }
}
