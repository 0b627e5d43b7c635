//! A connected pair of QPs on two hosts, and what the tests read of it.

use std::time::Duration;

use cm_core::{
    Access, ChannelHandle, CmBackend, CmEventType, ConnParam, IdHandle, MrHandle, MrInfo, PortSpace, QpCaps,
    QpState, RemoteAddr, SendOp, SendWr, Sge, SrqHandle, WcOpcode, WcStatus, WorkCompletion,
};
use cm_sim::{SimBuilder, SimFabric, SimHost, TraceWhat};

pub const SERVER: &str = "10.0.0.1:7471";
pub const WAIT: Duration = Duration::from_secs(5);

/// A fabric of two hosts with a 10-20 us latency, seeded.
pub fn builder(seed: u64) -> SimBuilder {
    SimFabric::builder()
        .seed(seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .latency(Duration::from_micros(10)..=Duration::from_micros(20))
}

/// A connection: `a` (the client, on host 1) is the requester in most tests, `b` (the
/// server's child, on host 0) the responder.
pub struct Pair {
    pub fabric: SimFabric,
    pub a: SimHost,
    pub b: SimHost,
    pub a_id: IdHandle,
    pub b_id: IdHandle,
    pub a_ch: ChannelHandle,
    pub b_ch: ChannelHandle,
    pub listener: IdHandle,
}

/// How the pair connects.
#[derive(Clone, Copy)]
pub struct Setup {
    pub client: ConnParam,
    pub server: ConnParam,
    pub caps: QpCaps,
    /// The server's child takes its receives from this SRQ (made on the listener's device).
    pub server_srq: bool,
}

impl Default for Setup {
    fn default() -> Self {
        Setup {
            client: ConnParam::new(),
            server: ConnParam::new(),
            caps: QpCaps {
                max_send_sge: 4,
                ..QpCaps::new()
            },
            server_srq: false,
        }
    }
}

fn next(h: &mut SimHost, ch: ChannelHandle) -> (CmEventType, IdHandle, ConnParam) {
    let ev = h
        .get_cm_event(ch, WAIT)
        .expect("get_cm_event")
        .expect("an event in time");
    let out = (ev.event(), ev.id(), *ev.param());
    h.ack_cm_event(ev).expect("ack");
    out
}

pub fn expect(h: &mut SimHost, ch: ChannelHandle, ty: CmEventType) -> IdHandle {
    let (got, id, _) = next(h, ch);
    assert_eq!(got, ty);
    id
}

/// Connects a pair on `fabric`; with `setup.server_srq`, also returns the SRQ the server's
/// child uses.
pub fn connect_on(fabric: SimFabric, setup: Setup) -> (Pair, Option<SrqHandle>) {
    let (mut b, mut a) = (fabric.host(0), fabric.host(1));
    let b_ch = b.create_event_channel().unwrap();
    let listener = b.create_id(b_ch, PortSpace::Tcp).unwrap();
    b.bind_addr(listener, SERVER.parse().unwrap()).unwrap();
    b.listen(listener, 0).unwrap();
    let srq = setup
        .server_srq
        .then(|| b.create_srq(listener, cm_core::SrqCaps::new()).unwrap());
    let a_ch = a.create_event_channel().unwrap();
    let a_id = a.create_id(a_ch, PortSpace::Tcp).unwrap();
    a.resolve_addr(a_id, None, SERVER.parse().unwrap(), WAIT).unwrap();
    expect(&mut a, a_ch, CmEventType::AddrResolved);
    a.resolve_route(a_id, WAIT).unwrap();
    expect(&mut a, a_ch, CmEventType::RouteResolved);
    a.create_qp(a_id, setup.caps).unwrap();
    a.connect(a_id, &setup.client).unwrap();
    let b_id = expect(&mut b, b_ch, CmEventType::ConnectRequest);
    match srq {
        Some(srq) => b.create_qp_on_srq(b_id, setup.caps, srq).unwrap(),
        None => b.create_qp(b_id, setup.caps).unwrap(),
    };
    b.accept(b_id, &setup.server).unwrap();
    expect(&mut a, a_ch, CmEventType::Established);
    expect(&mut b, b_ch, CmEventType::Established);
    (
        Pair {
            fabric,
            a,
            b,
            a_id,
            b_id,
            a_ch,
            b_ch,
            listener,
        },
        srq,
    )
}

pub fn connect_with(builder: SimBuilder, setup: Setup) -> Pair {
    connect_on(builder.build(), setup).0
}

pub fn connect(seed: u64) -> Pair {
    connect_with(builder(seed), Setup::default())
}

impl Pair {
    /// A region of `len` bytes on the requester.
    pub fn a_mr(&mut self, len: usize, access: Access) -> MrHandle {
        self.a.reg_mr(self.a_id, len, access).expect("reg_mr")
    }

    /// A region of `len` bytes on the responder.
    pub fn b_mr(&mut self, len: usize, access: Access) -> MrHandle {
        self.b.reg_mr(self.b_id, len, access).expect("reg_mr")
    }

    pub fn post_a(&mut self, wr: &SendWr<'_>) {
        self.a.post_send_wr(self.a_id, wr).expect("post_send_wr");
    }

    /// Completions of the requester's QP: waits until `n` came (or fails).
    pub fn poll_a(&mut self, n: usize) -> Vec<WorkCompletion> {
        poll(&mut self.a, self.a_id, n)
    }

    pub fn poll_b(&mut self, n: usize) -> Vec<WorkCompletion> {
        poll(&mut self.b, self.b_id, n)
    }

    pub fn qp_a(&self) -> Option<QpState> {
        self.a.id_machine(self.a_id).unwrap().qp()
    }

    pub fn qp_b(&self) -> Option<QpState> {
        self.b.id_machine(self.b_id).unwrap().qp()
    }

    /// The one-sided trace records, as (host, step name, op name, status) in order.
    pub fn rdma_steps(&self) -> Vec<(u16, &'static str, &'static str, i32)> {
        self.fabric
            .trace_records()
            .iter()
            .filter_map(|r| match r.what {
                TraceWhat::Rdma { op, step, .. } => Some((r.host, step.name(), op.name(), r.status)),
                _ => None,
            })
            .collect()
    }
}

/// Polls `id` until `n` completions came, waiting in virtual time.
pub fn poll(h: &mut SimHost, id: IdHandle, n: usize) -> Vec<WorkCompletion> {
    let mut out = Vec::new();
    for _ in 0..64 {
        if out.len() >= n {
            break;
        }
        let want = n - out.len();
        h.poll_cq(id, &mut out, want, WAIT).expect("poll_cq");
    }
    assert_eq!(out.len(), n, "completions: {out:?}");
    out
}

/// Nothing more to poll on `id` within `wait`.
pub fn nothing_more(h: &mut SimHost, id: IdHandle, wait: Duration) {
    let mut out = Vec::new();
    h.poll_cq(id, &mut out, 16, wait).unwrap();
    assert!(out.is_empty(), "unexpected completions: {out:?}");
}

/// (wr_id, opcode, status, byte_len) of each completion.
pub fn summary(wcs: &[WorkCompletion]) -> Vec<(u64, WcOpcode, WcStatus, u32)> {
    wcs.iter()
        .map(|w| (w.wr_id, w.opcode, w.status, w.byte_len))
        .collect()
}

pub fn remote(info: &MrInfo, offset: u64) -> RemoteAddr {
    info.remote().at(offset).expect("inside the region")
}

pub fn write(wr_id: u64, to: RemoteAddr, sges: &[Sge]) -> SendWr<'_> {
    SendWr::new(
        wr_id,
        SendOp::Write {
            remote: to,
            imm: None,
        },
        sges,
    )
}

pub fn read(wr_id: u64, from: RemoteAddr, sges: &[Sge]) -> SendWr<'_> {
    SendWr::new(wr_id, SendOp::Read { remote: from }, sges)
}

pub fn read_mr(h: &SimHost, mr: MrHandle, offset: u64, len: usize) -> Vec<u8> {
    let mut out = vec![0; len];
    h.read_mr(mr, offset, &mut out).expect("read_mr");
    out
}
