use super::*;
use crate::event::CmEventType::{self, *};
use crate::types::PortSpace;
use WcOpcode::{Recv, Send};

/// One step of a work-request story and what the pool must answer.
#[derive(Debug)]
enum Step {
    /// `post(opcode, wr_id, len)` gets this slot (None: the queue is full).
    Post(WcOpcode, u64, u32, Option<u32>),
    /// `flush(opcode, wr_id)` takes a slot (false: the queue is full).
    Flush(WcOpcode, u64, bool),
    /// `complete(slot)` frees a slot that carried (queue, wr_id, len); None: ignored.
    Complete(u64, Option<(WcOpcode, u64, u32)>),
    /// `unpost(slot)`.
    Unpost(u32),
    /// `next_flushed()` hands out this completion.
    NextFlushed(Option<(WcOpcode, u64)>),
    /// Outstanding (sends, receives), and whether flushed requests wait.
    Held(u32, u32, bool),
}

use Step::*;

fn run(mut pool: WrPool, steps: &[Step]) {
    for (i, step) in steps.iter().enumerate() {
        let at = format!("step {i}: {step:?}");
        match *step {
            Post(op, wr_id, len, want) => assert_eq!(pool.post(op, wr_id, len), want, "{at}"),
            Flush(op, wr_id, want) => assert_eq!(pool.flush(op, wr_id), want, "{at}"),
            Complete(slot, want) => {
                let got = pool.complete(slot).map(|(op, u)| {
                    assert!(
                        !u.flushed,
                        "{at}: a transport completion never frees a flushed slot"
                    );
                    (op, u.wr_id, u.len)
                });
                assert_eq!(got, want, "{at}");
            }
            Unpost(slot) => pool.unpost(slot),
            NextFlushed(want) => assert_eq!(pool.next_flushed(), want, "{at}"),
            Held(send, recv, flushed) => assert_eq!(
                (pool.outstanding(Send), pool.outstanding(Recv), pool.has_flushed()),
                (send, recv, flushed),
                "{at}"
            ),
        }
    }
}

#[test]
fn a_work_request_holds_its_slot_until_its_completion_is_polled() {
    run(
        WrPool::new(2, 1),
        &[
            Held(0, 0, false),
            Post(Send, 100, 5, Some(0)),
            Post(Send, 101, 6, Some(1)),
            Post(Send, 102, 0, None),
            Post(Recv, 200, 64, Some(2)),
            Post(Recv, 201, 64, None),
            Held(2, 1, false),
            Complete(1, Some((Send, 101, 6))),
            Complete(1, None),
            Complete(2, Some((Recv, 200, 64))),
            Held(1, 0, false),
            Post(Send, 103, 1, Some(1)),
            Post(Recv, 202, 8, Some(2)),
            Held(2, 1, false),
        ],
    );
}

#[test]
fn slots_are_reused_last_freed_first_then_lowest_never_used() {
    run(
        WrPool::new(4, 0),
        &[
            Post(Send, 1, 0, Some(0)),
            Post(Send, 2, 0, Some(1)),
            Post(Send, 3, 0, Some(2)),
            Complete(1, Some((Send, 2, 0))),
            Complete(0, Some((Send, 1, 0))),
            Post(Send, 4, 0, Some(0)),
            Post(Send, 5, 0, Some(1)),
            Post(Send, 6, 0, Some(3)),
            Post(Send, 7, 0, None),
            Held(4, 0, false),
        ],
    );
}

#[test]
fn completions_for_slots_never_given_to_the_transport_are_ignored() {
    run(
        WrPool::new(1, 1),
        &[
            Complete(0, None),
            Complete(1, None),
            Complete(2, None),
            Complete(99, None),
            Complete(u64::MAX, None),
            Complete(u64::from(u32::MAX) + 1, None),
            Flush(Send, 1, true),
            Complete(0, None),
            Unpost(0),
            Held(1, 0, true),
            NextFlushed(Some((Send, 1))),
            Held(0, 0, false),
        ],
    );
}

#[test]
fn a_request_the_transport_refused_gives_its_slot_back_once() {
    run(
        WrPool::new(1, 1),
        &[
            Post(Recv, 9, 64, Some(1)),
            Unpost(1),
            Held(0, 0, false),
            Unpost(1),
            Complete(1, None),
            Held(0, 0, false),
            Post(Recv, 10, 64, Some(1)),
            Post(Send, 11, 4, Some(0)),
            Unpost(0),
            Held(0, 1, false),
        ],
    );
}

#[test]
fn a_request_the_transport_refused_does_not_hold_back_later_flushed_ones() {
    run(
        WrPool::new(1, 1),
        &[
            Post(Recv, 1, 8, Some(1)),
            Unpost(1),
            Flush(Recv, 2, true),
            NextFlushed(Some((Recv, 2))),
            Held(0, 0, false),
        ],
    );
}

#[test]
fn an_empty_pool_refuses_everything() {
    run(
        WrPool::new(0, 0),
        &[
            Post(Send, 1, 0, None),
            Post(Recv, 1, 0, None),
            Flush(Send, 1, false),
            Flush(Recv, 1, false),
            NextFlushed(None),
            Held(0, 0, false),
        ],
    );
}

#[test]
fn flushed_requests_wait_for_earlier_transport_requests_of_their_queue() {
    run(
        WrPool::new(4, 4),
        &[
            Post(Send, 1, 8, Some(0)),
            Post(Recv, 2, 64, Some(4)),
            Post(Recv, 3, 64, Some(5)),
            // The QP goes to ERR; from now on nothing reaches the transport.
            Flush(Recv, 4, true),
            Flush(Send, 5, true),
            Flush(Recv, 6, true),
            Held(2, 4, true),
            NextFlushed(None),
            Complete(4, Some((Recv, 2, 64))),
            NextFlushed(None),
            Complete(5, Some((Recv, 3, 64))),
            NextFlushed(Some((Recv, 4))),
            NextFlushed(Some((Recv, 6))),
            NextFlushed(None),
            Held(2, 0, true),
            Complete(0, Some((Send, 1, 8))),
            NextFlushed(Some((Send, 5))),
            NextFlushed(None),
            Held(0, 0, false),
        ],
    );
}

#[test]
fn ready_flushed_requests_come_out_in_posting_order_across_queues() {
    run(
        WrPool::new(2, 2),
        &[
            Flush(Send, 1, true),
            Flush(Recv, 2, true),
            Flush(Send, 3, true),
            Flush(Recv, 4, true),
            Flush(Recv, 5, false),
            Post(Send, 6, 0, None),
            Held(2, 2, true),
            NextFlushed(Some((Send, 1))),
            Flush(Send, 7, true),
            NextFlushed(Some((Recv, 2))),
            NextFlushed(Some((Send, 3))),
            NextFlushed(Some((Recv, 4))),
            NextFlushed(Some((Send, 7))),
            NextFlushed(None),
            Held(0, 0, false),
        ],
    );
}

/// Machines in the states a post meets, built through the calls and events that reach them.
fn machine(ps: PortSpace, events: &[CmEventType], qp: bool) -> IdMachine {
    let mut m = IdMachine::new(ps).resolve_addr().unwrap();
    for &ev in events {
        m = m.on_event(ev).unwrap().on_ack().unwrap();
        if ev == AddrResolved && qp {
            m = m.create_qp().unwrap();
        }
    }
    m
}

/// What the gate answers, named so that the table reads.
#[derive(Debug, PartialEq)]
enum Want {
    Admit(Admission),
    NoQp,
    WrongQpState,
    InvalidArgument,
    QueueFull(u32),
    DeviceError,
}

fn answer(r: Result<Admission, CmError>) -> Want {
    match r {
        Ok(a) => Want::Admit(a),
        Err(CmError::NoQp { .. }) => Want::NoQp,
        Err(CmError::WrongQpState { .. }) => Want::WrongQpState,
        Err(CmError::InvalidArgument { .. }) => Want::InvalidArgument,
        Err(CmError::QueueFull { outstanding, .. }) => Want::QueueFull(outstanding),
        Err(CmError::Os { .. }) => Want::DeviceError,
        Err(e) => panic!("unexpected refusal {e:?}"),
    }
}

/// A row of the post gate's table.
type Row = (
    IdMachine,
    WcOpcode,
    usize,
    u32,
    Option<bool>,
    Want,
    Option<QpState>,
);

#[test]
fn the_post_gate_checks_machine_length_device_and_queue_in_that_order() {
    use Admission::{Flush, Post};
    use Want::*;
    let caps = QpCaps {
        max_send_wr: 2,
        max_recv_wr: 3,
        max_message_size: 100,
        ..QpCaps::new()
    };
    let no_qp = machine(PortSpace::Tcp, &[AddrResolved], false);
    let init = machine(PortSpace::Tcp, &[AddrResolved], true);
    let err = init.qp_error();
    let ud = machine(PortSpace::Udp, &[AddrResolved], true);
    // (machine, opcode, length, outstanding, device failed (None: its check fails), answer,
    // machine's QP after)
    #[rustfmt::skip]
    let table: &[Row] = &[
        (no_qp, Send, 1, 0, Some(false), NoQp, None),
        (no_qp, Recv, 1, 0, Some(false), NoQp, None),
        (init, Send, 1, 0, Some(false), WrongQpState, Some(QpState::Init)),
        (init, Recv, 1, 0, Some(false), Admit(Post), Some(QpState::Init)),
        (init, Recv, 100, 2, Some(false), Admit(Post), Some(QpState::Init)),
        (init, Recv, 101, 0, Some(false), InvalidArgument, Some(QpState::Init)),
        (init, Recv, 101, 3, Some(false), InvalidArgument, Some(QpState::Init)),
        (init, Recv, 1, 3, Some(false), QueueFull(3), Some(QpState::Init)),
        (init, Recv, 1, 4, Some(false), QueueFull(4), Some(QpState::Init)),
        // The device failed the QP before the machine knew: the request is flushed.
        (init, Recv, 1, 0, Some(true), Admit(Flush), Some(QpState::Err)),
        (init, Recv, 1, 3, Some(true), QueueFull(3), Some(QpState::Err)),
        (init, Recv, 1, 0, None, DeviceError, Some(QpState::Init)),
        (err, Send, 0, 0, None, Admit(Flush), Some(QpState::Err)),
        (err, Send, 0, 1, None, Admit(Flush), Some(QpState::Err)),
        (err, Send, 0, 2, None, QueueFull(2), Some(QpState::Err)),
        (err, Send, 101, 0, None, InvalidArgument, Some(QpState::Err)),
        (err, Recv, 1, 2, None, Admit(Flush), Some(QpState::Err)),
        (ud, Send, 1, 0, Some(false), InvalidArgument, Some(QpState::Rts)),
        (ud, Recv, 1, 0, Some(false), Admit(Post), Some(QpState::Rts)),
    ];
    for (i, &(m, op, len, outstanding, device, ref want, qp_after)) in table.iter().enumerate() {
        let mut m = m;
        let got = post_gate(&mut m, &caps, op, len, outstanding, || {
            device.ok_or(CmError::Os {
                call: Call::PostRecv,
                errno: 5,
            })
        });
        assert_eq!(answer(got), *want, "row {i}");
        assert_eq!(m.qp(), qp_after, "row {i}: the machine after the gate");
    }
}

#[test]
fn the_device_is_asked_only_when_the_machine_does_not_know_the_qp_failed() {
    let init = machine(PortSpace::Tcp, &[AddrResolved], true);
    let caps = QpCaps::new();
    for (m, asked_want) in [(init, true), (init.qp_error(), false)] {
        let mut m = m;
        let mut asked = false;
        let got = post_gate(&mut m, &caps, Recv, 1, 0, || {
            asked = true;
            Ok(false)
        });
        assert_eq!(asked, asked_want, "{got:?}");
    }
    // Refused before the device is asked: nothing to ask about.
    let mut m = machine(PortSpace::Tcp, &[AddrResolved], false);
    let mut asked = false;
    let _ = post_gate(&mut m, &caps, Recv, 1, 0, || {
        asked = true;
        Ok(false)
    });
    assert!(!asked);
}

#[test]
fn the_datagram_gate_takes_ud_qps_only_then_checks_as_the_post_gate_does() {
    use Admission::{Flush, Post};
    use Want::*;
    let caps = QpCaps {
        max_send_wr: 2,
        max_message_size: 100,
        ..QpCaps::new()
    };
    let no_qp = machine(PortSpace::Udp, &[AddrResolved], false);
    let ud = machine(PortSpace::Udp, &[AddrResolved], true);
    let rc = machine(PortSpace::Tcp, &[AddrResolved], true);
    // (machine, length, outstanding, device failed, answer, machine's QP after)
    #[rustfmt::skip]
    let table = [
        (no_qp, 1, 0, false, NoQp, None),
        (rc, 1, 0, false, InvalidArgument, rc.qp()),
        (ud, 1, 0, false, Admit(Post), Some(QpState::Rts)),
        (ud, 101, 0, false, InvalidArgument, Some(QpState::Rts)),
        (ud, 1, 2, false, QueueFull(2), Some(QpState::Rts)),
        (ud, 1, 0, true, Admit(Flush), Some(QpState::Err)),
        (ud.qp_error(), 1, 1, false, Admit(Flush), Some(QpState::Err)),
    ];
    for (i, (m, len, outstanding, device, want, qp_after)) in table.into_iter().enumerate() {
        let mut m = m;
        let got = datagram_gate(&mut m, &caps, len, outstanding, || Ok(device));
        assert_eq!(answer(got), want, "row {i}");
        assert_eq!(m.qp(), qp_after, "row {i}: the machine after the gate");
    }
}
