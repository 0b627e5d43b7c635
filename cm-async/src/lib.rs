//! Applications, not only calls: an async layer over any [`CmBackend`](cm_core::CmBackend)
//! with owned objects, and two runtimes for the same application code.
#![deny(missing_docs)]
#![forbid(unsafe_code)]

mod conn;
mod driver;
mod error;
mod runtime;
pub mod sim;
#[cfg(feature = "tokio")]
pub mod tokio;

pub use conn::{Closed, Cm, ConnOptions, Connection, Listener, Request};
pub use error::{Error, Result};
pub use runtime::{Elapsed, JoinHandle, Runtime};
