//! Work requests over memory regions (`post_send_wr`): one-sided requests on the wire in
//! virtual time, and SEND and RDMA WRITE with immediate over regions on the two-sided path.
//!
//! A QP's send queue holds every work request in posting order. A SEND or WRITE with
//! immediate lands at once when the peer has a receive, as `post_send`'s bytes always have (it
//! waits for one otherwise: receiver-not-ready), once no one-sided request of the QP is in
//! flight. An RDMA WRITE, READ or atomic starts when no two-sided send is ahead of it and
//! [`rdma::may_start`] lets it (fence, initiator depth); its bytes are gathered from the local
//! regions as it leaves, and it travels to the responder with a latency drawn from the fabric's
//! range (and a `Delay` fault's), executes there on arrival by [`rdma::respond`]'s checks, and
//! its answer travels back the same way. A QP's requests arrive in posting order, and so do its
//! peer's answers (each arrival is at least the one before). Requests complete at the requester
//! in posting order: an answer that comes early waits for those before it.
//!
//! A request or answer is lost on a partitioned link, to or from a host that is down or lost
//! its device, and, on a lossy link, with the link's probability; a responder whose QP is not
//! ready (or gone) drops the request without a word, and one that sees a request past a lost
//! one drops it too. The requester sends its unanswered requests again one local ACK timeout
//! after the last progress, `retry_count` times; the responder answers a request it already
//! executed from what it answered before (an atomic is not executed twice). When the retries
//! run out, the oldest unanswered request completes with `RETRY_EXC_ERR`, the QP goes to ERR
//! and the rest flush. So a partition that heals in time costs a retry, and one that does not
//! fails the request after (`retry_count` + 1) ACK timeouts, as a send across it does.
//!
//! A refusal (a NAK) moves the responder's QP to ERR when it is sent, and the requester's when
//! the refused request completes. Every draw comes from a generator of its own, seeded from the
//! fabric's seed and made with the first request, so runs without one-sided work draw exactly
//! what they drew before (their trace hashes do not move).

use cm_core::backend::{send_wr_gate, Admission};
use cm_core::{SendOp, SendWr, Sge};

use super::*;
use crate::qp::PostedWr;
use crate::rdma::{self, AtomicOp, RemoteOp, Reply, Request, Responder, Sequence, Verdict};
use crate::trace::{RdmaOp, RdmaStep};

/// Mixed into the seed of the one-sided generator, so that its stream is unrelated to the
/// fabric's main one and the datagrams'.
const RDMA_STREAM: u64 = 0x7264_6d61_5f6f_6e65;

/// One-sided packets on the wire, made with the first.
pub(super) struct Wire {
    rng: ChaCha8Rng,
    packets: Pool<Packet>,
}

/// A request or its answer on the wire, naming both ends as they were when it left: each end's
/// id and QP number (a QP made since on the same id is another QP) and host.
struct Packet {
    requester: SlotRef,
    requester_qpn: u32,
    requester_host: u16,
    responder: SlotRef,
    responder_qpn: u32,
    responder_host: u16,
    /// The request's number in its QP's sequence.
    psn: u64,
    op: RdmaOp,
    body: Body,
}

enum Body {
    Request {
        request: Request,
        /// What an atomic does.
        atomic: Option<AtomicOp>,
        /// A WRITE's bytes.
        data: Vec<u8>,
    },
    Reply(Reply),
}

/// What a started request asks of the responder, from its work request.
fn request_of(op: &SendOp, len: u32) -> (Request, Option<AtomicOp>) {
    let (remote_op, atomic) = match *op {
        SendOp::Write { imm: None, .. } => (RemoteOp::Write, None),
        SendOp::Write { imm: Some(_), .. } => (RemoteOp::WriteWithImm, None),
        SendOp::Read { .. } => (RemoteOp::Read, None),
        SendOp::CompareSwap { compare, swap, .. } => {
            (RemoteOp::Atomic, Some(AtomicOp::CompareSwap { compare, swap }))
        }
        SendOp::FetchAdd { add, .. } => (RemoteOp::Atomic, Some(AtomicOp::FetchAdd { add })),
        SendOp::Send { .. } => unreachable!("a SEND names no remote memory"),
    };
    let remote = op.remote().expect("a one-sided operation names remote memory");
    (
        Request {
            op: remote_op,
            addr: remote.addr,
            rkey: remote.rkey,
            len: u64::from(len),
        },
        atomic,
    )
}

impl Fabric {
    fn wire(&mut self) -> &mut Wire {
        let seed = self.seed.value;
        self.rdma.get_or_insert_with(|| {
            Box::new(Wire {
                rng: ChaCha8Rng::seed_from_u64(seed ^ RDMA_STREAM),
                packets: Pool::new(),
            })
        })
    }

    pub(crate) fn post_send_wr(&mut self, host: u16, id: IdHandle, wr: &SendWr<'_>) -> R<()> {
        let r = self.qp_for(host, id, Call::PostSend)?;
        self.post_send_wr_on(host, r, wr)
    }

    /// `post_send_wr` on the QP in slot `r` (an id's or a carrier's) of `host`.
    pub(super) fn post_send_wr_on(&mut self, host: u16, r: SlotRef, wr: &SendWr<'_>) -> R<()> {
        // Fields, not `region_view`: the regions are read while the id's slot is changed.
        let (tag, epoch) = (
            self.hosts[host as usize].tag,
            self.hosts[host as usize].device_epoch,
        );
        let regions = self.regions.as_deref();
        let slot = self.ids.get_mut(r).expect("checked");
        let qp = slot.qp.as_mut().expect("checked");
        let outstanding = qp.outstanding(WcOpcode::Send);
        let region = |mr| regions.and_then(|m| m.local(host, tag, epoch, mr));
        // A simulated device fails a QP only through the machine.
        let admission = send_wr_gate(
            &mut slot.m,
            &qp.caps,
            wr,
            qp.initiator_depth,
            outstanding,
            region,
            || Ok(false),
        )?;
        match admission {
            Admission::Flush => qp.push_flushed(wr.wr_id, wr.op.wc_opcode()),
            Admission::Post => {
                qp.push_wr(wr.wr_id, PostedWr::new(wr));
                self.deliver_sends(r);
            }
        }
        Ok(())
    }

    /// The bytes a SEND or WRITE gathers from `sges` on `host` as it leaves.
    fn gather(&self, host: u16, sges: &[Sge]) -> Result<Vec<u8>, WcStatus> {
        let (regions, tag, epoch) = self.region_view(host);
        match regions {
            Some(m) => m.gather(host, tag, epoch, sges),
            // No region was ever registered: only empty entries got past the post.
            None if sges.iter().all(|s| s.len == 0) => Ok(Vec::new()),
            None => Err(WcStatus::LocQpOpErr),
        }
    }

    /// Records a step of `id`'s request (or its peer's, on the responder) on `host`.
    fn trace_rdma(&mut self, host: u16, id: SlotRef, op: RdmaOp, step: RdmaStep, peer: u16, status: i32) {
        self.trace.record(TraceRecord {
            time: self.now,
            host,
            id: id.index,
            what: TraceWhat::Rdma { op, step, peer },
            status,
        });
    }

    /// The two-sided work request at the head of `a`'s send queue (a SEND or WRITE with
    /// immediate over regions) cannot leave: a region it gathers from is gone. It fails with
    /// the local error, its QP goes to ERR; the peer learns nothing. True when it failed.
    pub(super) fn fail_head_locally(&mut self, a: SlotRef) -> bool {
        let slot = self.slot(a);
        let host = slot.host;
        let Some(sges) = slot
            .qp
            .as_ref()
            .and_then(|q| q.head_wr())
            .map(|w| w.sg_list.clone())
        else {
            return false;
        };
        let Err(status) = self.gather(host, &sges) else {
            return false;
        };
        let slot = self.slot(a);
        let peer = slot.remote_host;
        let qp = slot.qp.as_mut().expect("checked");
        let send = qp.pop_send().expect("checked");
        let op = RdmaOp::of(&send.wr.as_ref().expect("checked").op);
        qp.complete_send(send, status);
        self.trace_rdma(host, a, op, RdmaStep::Completed, peer, status as i32);
        let next = self.slot(a).m.qp_error();
        self.set_machine(a, next);
        true
    }

    /// Lands the SEND or RDMA WRITE with immediate over regions at the head of `a`'s send
    /// queue in a receive of its peer `b`, which is ready and has one (the caller checked).
    /// False when a QP went to ERR, which ends the caller's deliveries.
    pub(super) fn land_wr(&mut self, a: SlotRef, b: SlotRef) -> bool {
        let (host, peer) = (self.slot(a).host, self.slot(b).host);
        let wr = self
            .slot(a)
            .qp
            .as_ref()
            .and_then(|q| q.head_wr())
            .cloned()
            .expect("a request over regions at the head");
        let op = RdmaOp::of(&wr.op);
        let data = match self.gather(host, &wr.sg_list) {
            Ok(data) => data,
            // Checked by `fail_head_locally` on the way here.
            Err(_) => return !self.fail_head_locally(a),
        };
        let (verdict, region) = match wr.op {
            SendOp::Write { remote, imm: Some(_) } => {
                let (request, _) = request_of(&wr.op, wr.len());
                let epoch = self.hosts[peer as usize].device_epoch;
                let keyed = self
                    .regions
                    .as_deref()
                    .and_then(|m| m.keyed(peer, epoch, remote.rkey));
                let rr = self.slot(b).qp.as_ref().map_or(0, |q| q.responder_resources);
                let responder = Responder {
                    ready: true,
                    access: rdma::qp_access(rr),
                    max_dest_rd_atomic: rr,
                    has_recv: true,
                };
                let verdict = rdma::respond(&request, &responder, keyed.map(|(_, k)| k));
                (verdict, keyed.map(|(r, _)| r))
            }
            _ => (
                Verdict::Execute {
                    offset: 0,
                    takes_recv: true,
                },
                None,
            ),
        };
        if matches!(verdict, Verdict::Drop | Verdict::ReceiverNotReady) {
            // Not reached: the caller found the peer ready with a receive.
            self.arm_rnr(a);
            return false;
        }
        let send = self
            .slot(a)
            .qp
            .as_mut()
            .and_then(|q| q.pop_send())
            .expect("checked");
        self.trace_rdma(host, a, op, RdmaStep::Sent, peer, 0);
        let takes_recv = match verdict {
            Verdict::Execute { takes_recv, .. } | Verdict::Fail { takes_recv, .. } => takes_recv,
            Verdict::Drop | Verdict::ReceiverNotReady => false,
        };
        let recv = takes_recv.then(|| self.take_recv(b).expect("the caller checked a receive"));
        let status = match (wr.op, verdict, recv) {
            (SendOp::Send { imm }, _, Some(recv)) => {
                let qp = self.slot(b).qp.as_mut().expect("checked");
                match qp.land_in(recv, data, None, imm) {
                    Landing::Delivered => WcStatus::Success,
                    Landing::TooLong => {
                        self.stats.length_errors += 1;
                        WcStatus::RemInvReqErr
                    }
                }
            }
            (SendOp::Write { imm: Some(imm), .. }, Verdict::Execute { offset, .. }, Some(recv)) => {
                if let Some(r) = region.filter(|_| !data.is_empty()) {
                    let m = self.regions.as_mut().expect("a keyed region");
                    m.region_mut(peer, r).expect("keyed").write(offset, &data);
                }
                let qp = self.slot(b).qp.as_mut().expect("checked");
                qp.complete_write_imm(recv, WcStatus::Success, wr.len(), imm);
                WcStatus::Success
            }
            (SendOp::Write { imm: Some(imm), .. }, Verdict::Fail { status, .. }, recv) => {
                if status == WcStatus::RemAccessErr {
                    self.stats.remote_access_errors += 1;
                }
                if let Some(recv) = recv {
                    // Taken before the key was checked: it fails with the request.
                    let qp = self.slot(b).qp.as_mut().expect("checked");
                    qp.complete_write_imm(recv, status, 0, imm);
                }
                status
            }
            _ => unreachable!("two-sided requests are SENDs and WRITEs with immediate"),
        };
        self.trace_rdma(peer, b, op, RdmaStep::Executed, host, status as i32);
        self.slot(a)
            .qp
            .as_mut()
            .expect("checked")
            .complete_send(send, status);
        self.trace_rdma(host, a, op, RdmaStep::Completed, peer, status as i32);
        if status != WcStatus::Success {
            for id in [b, a] {
                let next = self.slot(id).m.qp_error();
                self.set_machine(id, next);
            }
            return false;
        }
        true
    }

    /// Starts the one-sided request at the head of `a`'s send queue (the caller checked that
    /// it may start).
    pub(super) fn start_one_sided(&mut self, a: SlotRef) {
        let psn = self.slot(a).qp.as_mut().expect("checked").start_head();
        self.transmit(a, psn);
    }

    /// Puts started request `psn` of `a` on the wire (first, or again after a timeout), its
    /// bytes gathered now; one whose bytes cannot be gathered fails at once, locally.
    fn transmit(&mut self, a: SlotRef, psn: u64) {
        let slot = self.slot(a);
        let (host, b, peer, retry_count) =
            (slot.host, slot.remote, slot.remote_host, slot.retries.transport());
        let Some(qp) = slot.qp.as_ref() else { return };
        let qpn = qp.qpn;
        let Some(started) = qp.rdma_ref().and_then(|r| r.started(psn)) else {
            // Flushed meanwhile (a retry after the QP failed).
            return;
        };
        let wr = started.wr.clone();
        let op = RdmaOp::of(&wr.op);
        let (request, atomic) = request_of(&wr.op, wr.len());
        let data = if request.op == RemoteOp::Write {
            match self.gather(host, &wr.sg_list) {
                Ok(data) => data,
                Err(status) => {
                    self.slot(a)
                        .qp
                        .as_mut()
                        .expect("checked")
                        .fail_started(psn, status);
                    self.drain_started(a);
                    return;
                }
            }
        } else {
            Vec::new()
        };
        let ack_timeout = nanos(self.ack_timeout_of(a));
        let now = self.now;
        let rdma = self.slot(a).qp.as_mut().expect("checked").rdma();
        if rdma.retry_at.is_none() {
            rdma.retry_at = Some(now.after_nanos(ack_timeout));
            rdma.retries_left = retry_count;
        }
        self.queue_rdma_timer(a);
        self.trace_rdma(host, a, op, RdmaStep::Sent, peer, 0);
        if self.rdma_lost(host, peer) {
            self.trace_rdma(host, a, op, RdmaStep::Lost, peer, 0);
            return;
        }
        let responder_qpn = self
            .ids
            .get(b)
            .and_then(|s| s.qp.as_ref())
            .map_or(u32::MAX, |q| q.qpn);
        let latency = self.rdma_latency(host, peer);
        let rdma = self.slot(a).qp.as_mut().expect("checked").rdma();
        let arrival = now.after_nanos(latency).max(rdma.last_request_arrival);
        rdma.last_request_arrival = arrival;
        let n = self.wire().packets.insert(Packet {
            requester: a,
            requester_qpn: qpn,
            requester_host: host,
            responder: b,
            responder_qpn,
            responder_host: peer,
            psn,
            op,
            body: Body::Request {
                request,
                atomic,
                data,
            },
        });
        self.schedule(arrival, Action::Rdma(n));
    }

    /// Queues `a`'s retry timer for its `retry_at`, unless one is queued (it moves itself on
    /// when it fires early).
    fn queue_rdma_timer(&mut self, a: SlotRef) {
        let qp = self.slot(a).qp.as_mut().expect("checked");
        let qpn = qp.qpn;
        let rdma = qp.rdma();
        let Some(at) = rdma.retry_at.filter(|_| !rdma.timer_queued) else {
            return;
        };
        rdma.timer_queued = true;
        self.schedule(at, Action::RdmaTimer { id: a, qpn });
    }

    /// Whether a one-sided packet from host `from` to host `to` is lost now (draws only when a
    /// loss fault is on the link).
    fn rdma_lost(&mut self, from: u16, to: u16) -> bool {
        let n = self.hosts.len();
        if (to as usize) >= n {
            // No peer known: nobody to send to.
            return true;
        }
        if !self.links_faulted {
            return false;
        }
        if !self.hosts[from as usize].reachable() || !self.hosts[to as usize].reachable() {
            return true;
        }
        let link = self.links[from as usize * n + to as usize];
        link.partitioned
            || (link.loss_per_mille > 0 && self.wire().rng.next_u32() % 1000 < u32::from(link.loss_per_mille))
    }

    /// A one-sided packet's one-way latency: the fabric's range plus a `Delay` fault's, drawn
    /// from the one-sided stream.
    fn rdma_latency(&mut self, from: u16, to: u16) -> u64 {
        let (latency, n) = (self.latency_nanos, self.hosts.len());
        let delay = self.links[from as usize * n + to as usize].delay;
        packet_latency(&mut self.wire().rng, latency, delay)
    }

    /// Packet `n` arrives.
    pub(super) fn on_rdma(&mut self, n: u32) {
        let Some(p) = self.rdma.as_mut().and_then(|w| w.packets.take(n)) else {
            return;
        };
        match p.body {
            Body::Request { .. } => self.on_request(p),
            Body::Reply(_) => self.on_reply(p),
        }
    }

    /// A request reaches its responder.
    fn on_request(&mut self, p: Packet) {
        let (b, host, from) = (p.responder, p.responder_host, p.requester_host);
        let Body::Request {
            request,
            atomic,
            data,
        } = p.body
        else {
            unreachable!("a request")
        };
        let reachable = self.hosts[host as usize].reachable();
        let ready = self.ids.get(b).is_some_and(|s| {
            reachable
                && s.host == host
                && s.qp.as_ref().is_some_and(|q| q.qpn == p.responder_qpn)
                && matches!(s.m.qp(), Some(QpState::Rtr | QpState::Rts))
        });
        if !ready {
            // Not for a QP that is ready (`check_type_state`), or for none at all.
            self.trace_rdma(host, b, p.op, RdmaStep::Dropped, from, 0);
            return;
        }
        let qp = self.slot(b).qp.as_mut().expect("checked");
        let rr = qp.responder_resources;
        let rdma = qp.rdma();
        let reply = match rdma::sequence(p.psn, rdma.expected_psn) {
            Sequence::Ahead => {
                self.trace_rdma(host, b, p.op, RdmaStep::Dropped, from, 0);
                return;
            }
            Sequence::Duplicate => {
                let reply = rdma.saved_reply(p.psn).cloned().unwrap_or(Reply::Ack);
                self.trace_rdma(host, b, p.op, RdmaStep::Replayed, from, 0);
                let to = (p.requester, p.requester_qpn, p.requester_host);
                self.send_reply(b, to, p.psn, p.op, reply);
                return;
            }
            Sequence::Next => {
                rdma.expected_psn += 1;
                let epoch = self.hosts[host as usize].device_epoch;
                let keyed = self
                    .regions
                    .as_deref()
                    .and_then(|m| m.keyed(host, epoch, request.rkey));
                let responder = Responder {
                    ready: true,
                    access: rdma::qp_access(rr),
                    max_dest_rd_atomic: rr,
                    has_recv: false,
                };
                match rdma::respond(&request, &responder, keyed.map(|(_, k)| k)) {
                    Verdict::Execute { offset, .. } => {
                        self.execute(host, keyed.map(|(r, _)| r), offset, &request, atomic, &data)
                    }
                    Verdict::Fail { status, .. } => Reply::Nak(status),
                    // Only a WRITE with immediate takes a receive, on the two-sided path.
                    Verdict::Drop | Verdict::ReceiverNotReady => unreachable!("a ready responder"),
                }
            }
        };
        let status = match reply {
            Reply::Nak(status) => status as i32,
            _ => 0,
        };
        if matches!(reply, Reply::Read(_) | Reply::Atomic(_)) {
            let rdma = self.slot(b).qp.as_mut().expect("checked").rdma();
            rdma.save_reply(p.psn, reply.clone());
        }
        if reply == Reply::Nak(WcStatus::RemAccessErr) {
            self.stats.remote_access_errors += 1;
        }
        self.trace_rdma(host, b, p.op, RdmaStep::Executed, from, status);
        let refused = matches!(reply, Reply::Nak(_));
        let to = (p.requester, p.requester_qpn, p.requester_host);
        self.send_reply(b, to, p.psn, p.op, reply);
        if refused {
            let next = self.slot(b).m.qp_error();
            self.set_machine(b, next);
        }
    }

    /// Executes a request the checks let through, on region `r` of `host` at `offset`; the
    /// answer. A zero-length READ or WRITE touches no region.
    fn execute(
        &mut self,
        host: u16,
        r: Option<SlotRef>,
        offset: u64,
        request: &Request,
        atomic: Option<AtomicOp>,
        data: &[u8],
    ) -> Reply {
        let region = match r {
            Some(r) => self.regions.as_mut().and_then(|m| m.region_mut(host, r)),
            None => None,
        };
        match (request.op, region) {
            (RemoteOp::Write, Some(region)) => {
                region.write(offset, data);
                Reply::Ack
            }
            (RemoteOp::Write, None) => Reply::Ack,
            (RemoteOp::Read, Some(region)) => {
                let mut out = vec![0; request.len as usize];
                region.read(offset, &mut out);
                Reply::Read(out)
            }
            (RemoteOp::Read, None) => Reply::Read(Vec::new()),
            (RemoteOp::Atomic, Some(region)) => {
                // One at a time: the simulator runs one action at an instant, so the read,
                // the change and the write are atomic against every other request.
                let mut old = [0; 8];
                region.read(offset, &mut old);
                let old = u64::from_ne_bytes(old);
                let new = atomic.expect("an atomic's operation").apply(old);
                region.write(offset, &new.to_ne_bytes());
                Reply::Atomic(old)
            }
            (RemoteOp::Atomic, None) | (RemoteOp::WriteWithImm, _) => {
                unreachable!("an atomic names a region; a WRITE with immediate is two-sided")
            }
        }
    }

    /// Sends `reply` to request `psn` from responder `b` back to its requester `to` (id, QP
    /// number, host).
    fn send_reply(&mut self, b: SlotRef, to: (SlotRef, u32, u16), psn: u64, op: RdmaOp, reply: Reply) {
        let (requester, requester_qpn, requester_host) = to;
        let slot = self.slot(b);
        let (host, qpn) = (slot.host, slot.qp.as_ref().map_or(u32::MAX, |q| q.qpn));
        if self.rdma_lost(host, requester_host) {
            self.trace_rdma(host, b, op, RdmaStep::Lost, requester_host, 0);
            return;
        }
        let latency = self.rdma_latency(host, requester_host);
        let now = self.now;
        let rdma = self.slot(b).qp.as_mut().expect("checked").rdma();
        let arrival = now.after_nanos(latency).max(rdma.last_reply_arrival);
        rdma.last_reply_arrival = arrival;
        let n = self.wire().packets.insert(Packet {
            requester,
            requester_qpn,
            requester_host,
            responder: b,
            responder_qpn: qpn,
            responder_host: host,
            psn,
            op,
            body: Body::Reply(reply),
        });
        self.schedule(arrival, Action::Rdma(n));
    }

    /// An answer reaches its requester: the request ends (a READ's bytes and an atomic's value
    /// are scattered into its list now), and those before it that have ended complete.
    fn on_reply(&mut self, p: Packet) {
        let (a, host) = (p.requester, p.requester_host);
        let Body::Reply(reply) = p.body else {
            unreachable!("an answer")
        };
        let live = self.hosts[host as usize].reachable()
            && self.ids.get(a).is_some_and(|s| {
                s.host == host
                    && s.m.qp() == Some(QpState::Rts)
                    && s.qp.as_ref().is_some_and(|q| q.qpn == p.requester_qpn)
            });
        if !live {
            // The QP failed (its requests flushed), went, or its host did.
            return;
        }
        let slot = self.slot(a);
        let retry_count = slot.retries.transport();
        let Some(started) = slot
            .qp
            .as_ref()
            .and_then(|q| q.rdma_ref())
            .and_then(|r| r.started(p.psn))
        else {
            return;
        };
        let (sges, len) = (started.wr.sg_list.clone(), started.wr.len());
        let done = match reply {
            Reply::Ack => (WcStatus::Success, len),
            Reply::Nak(status) => (status, 0),
            Reply::Read(bytes) => self.scatter(host, &sges, &bytes, len),
            Reply::Atomic(old) => self.scatter(host, &sges, &old.to_ne_bytes(), len),
        };
        let ack_timeout = nanos(self.ack_timeout_of(a));
        let now = self.now;
        let qp = self.slot(a).qp.as_mut().expect("checked");
        if !qp.answer(p.psn, done) {
            // Answered already (a duplicate's answer), or flushed.
            return;
        }
        let rdma = qp.rdma();
        rdma.retries_left = retry_count;
        rdma.retry_at = rdma.has_unanswered().then(|| now.after_nanos(ack_timeout));
        self.queue_rdma_timer(a);
        self.drain_started(a);
        self.deliver_sends(a);
    }

    /// Scatters an answer's bytes into the request's list on `host`: `(status, byte count)`.
    fn scatter(&mut self, host: u16, sges: &[Sge], data: &[u8], len: u32) -> (WcStatus, u32) {
        let (tag, epoch) = (
            self.hosts[host as usize].tag,
            self.hosts[host as usize].device_epoch,
        );
        let scattered = match self.regions.as_mut() {
            Some(m) => m.scatter(host, tag, epoch, sges, data),
            None if sges.iter().all(|s| s.len == 0) => Ok(()),
            None => Err(WcStatus::LocProtErr),
        };
        match scattered {
            Ok(()) => (WcStatus::Success, len),
            Err(status) => (status, 0),
        }
    }

    /// Completes `a`'s started requests that have ended, oldest first, while every one before
    /// has; one that failed moves the QP to ERR (the rest flush).
    fn drain_started(&mut self, a: SlotRef) {
        loop {
            let slot = self.slot(a);
            let (host, peer) = (slot.host, slot.remote_host);
            let Some(qp) = slot.qp.as_mut() else { return };
            let Some(s) = qp.pop_done() else { return };
            qp.complete_started(&s);
            let (status, _) = s.done.expect("ended");
            self.trace_rdma(
                host,
                a,
                RdmaOp::of(&s.wr.op),
                RdmaStep::Completed,
                peer,
                status as i32,
            );
            if status != WcStatus::Success {
                let next = self.slot(a).m.qp_error();
                self.set_machine(a, next);
                return;
            }
        }
    }

    /// `a`'s retry timer fires: nothing answered for an ACK timeout. Its unanswered requests go
    /// again, or, with the retries spent, the oldest fails with `RETRY_EXC_ERR`.
    pub(super) fn on_rdma_timer(&mut self, a: SlotRef, qpn: u32) {
        let now = self.now;
        let Some(slot) = self.ids.get_mut(a) else { return };
        let rts = slot.m.qp() == Some(QpState::Rts);
        let Some(qp) = slot.qp.as_mut().filter(|q| q.qpn == qpn) else {
            return;
        };
        let rdma = qp.rdma();
        rdma.timer_queued = false;
        let Some(at) = rdma.retry_at.filter(|_| rts) else {
            return;
        };
        if now < at {
            // Answers came since it was queued: it waits for the latest deadline.
            self.queue_rdma_timer(a);
            return;
        }
        let unanswered = rdma.unanswered();
        let Some(&oldest) = unanswered.first() else {
            rdma.retry_at = None;
            return;
        };
        if rdma.retries_left == 0 {
            rdma.retry_at = None;
            qp.fail_started(oldest, WcStatus::RetryExcErr);
            self.stats.onesided_retries_exceeded += 1;
            self.drain_started(a);
            return;
        }
        rdma.retries_left -= 1;
        let ack_timeout = nanos(self.ack_timeout_of(a));
        let rdma = self.slot(a).qp.as_mut().expect("checked").rdma();
        rdma.retry_at = Some(now.after_nanos(ack_timeout));
        self.stats.onesided_retries += 1;
        for psn in unanswered {
            self.transmit(a, psn);
        }
    }
}
