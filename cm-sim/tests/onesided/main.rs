//! One-sided RDMA on the simulator, driven through two hosts of a fabric: memory regions,
//! READ, WRITE (with an immediate and without), atomics and SENDs over regions, their
//! ordering, every refusal rxe makes and which QPs it moves to ERR, shared receive queues and
//! their limit event, and faults. Everything runs in virtual time and is a function of the
//! seed.

#![allow(unreachable_pub)] // a test crate: `pub` only shares items between its modules

mod support;

mod errors;
mod faults;
mod ordering;
mod regions;
mod srq;
mod success;
