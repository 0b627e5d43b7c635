//! Drop-in `librdmacm.so.1` and `libibverbs.so.1` that run unmodified rdma-core programs on the
//! simulator, and the pieces the fabric daemon (`cmsim-daemon`) and the wrapper (`cmsim-run`)
//! share with them.
//!
//! The cdylib is installed as `libibverbs.so.1` with `librdmacm.so.1` a link to the same file
//! (see `cmsim-run`): the loader maps it once, so every `rdma_*` and `ibv_*` call of a process
//! lands in one copy of the state below. Each process talks to the daemon over a
//! `SOCK_SEQPACKET` control socket; each event channel is its own socket whose readiness means
//! an event is queued.
#![deny(missing_docs)]

pub mod abi;
pub mod devfiles;
pub mod device;
pub mod ffi;
pub mod proto;
pub mod provider;
pub mod request;
pub mod sock;
pub mod sockets;
pub mod verbs;
