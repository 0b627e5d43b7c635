//! rdma-core's `udaddy` written against the trait: UD datagrams on the UDP port space.
//!
//! The client resolves the server, makes a UD QP, posts its receives and connects (a SIDR
//! lookup); `ESTABLISHED` names the server's QP. It sends `-C` datagrams of `-S` bytes per
//! connection; the server receives them, learns each client from the first datagram's sender and
//! replies with as many; the client receives those. Interoperates with rdma-core's `udaddy` in
//! both directions on a device (`--backend hw`): the datagrams carry the sender's QP number as
//! immediate data, which `udaddy` replies to.
//!
//! ```sh
//! cargo run --example udaddy                                   # both roles on the simulator
//! cargo run --features hw --example udaddy -- --backend hw -b 10.0.0.1            # server
//! cargo run --features hw --example udaddy -- --backend hw -s 10.0.0.1 -b 10.0.0.2 # client
//! ```

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use cm::{CmBackend, CmEventType, ConnParam, IdHandle, PortSpace, QpCaps, UdParam, WcStatus};

/// How long any one wait may take before the run fails.
const WAIT: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: udaddy [-s server_address] [-b bind_address] [-c connections] \
[-C message_count] [-S message_size] [-p port] [--backend sim|hw] [--seed S]";

#[derive(Clone, Debug)]
struct Opts {
    server: Option<IpAddr>,
    bind: Option<IpAddr>,
    connections: u32,
    messages: u32,
    size: u32,
    port: u16,
    hw: bool,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        server: None,
        bind: None,
        connections: 1,
        messages: 10,
        size: 100,
        port: 7174,
        hw: false,
        seed: 7,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let bad = |v: &str| format!("{flag}: bad value {v:?}");
        match flag.as_str() {
            "-s" => o.server = Some(value()?.parse().map_err(|_| bad(flag))?),
            "-b" => o.bind = Some(value()?.parse().map_err(|_| bad(flag))?),
            "-c" => o.connections = value()?.parse().map_err(|_| bad(flag))?,
            "-C" => o.messages = value()?.parse().map_err(|_| bad(flag))?,
            "-S" => o.size = value()?.parse().map_err(|_| bad(flag))?,
            "-p" => o.port = value()?.parse().map_err(|_| bad(flag))?,
            "--seed" => o.seed = value()?.parse().map_err(|_| bad(flag))?,
            "--backend" => {
                o.hw = match value()?.as_str() {
                    "sim" => false,
                    "hw" => true,
                    other => return Err(bad(other)),
                }
            }
            "-h" | "--help" => return Err(USAGE.to_string()),
            other => return Err(format!("unknown option {other:?}\n{USAGE}")),
        }
    }
    if o.connections == 0 || o.messages == 0 || o.messages > 256 || o.size == 0 || o.size > 1024 {
        return Err("need 1..=256 messages of 1..=1024 bytes on at least one connection".into());
    }
    Ok(o)
}

fn caps(o: &Opts) -> QpCaps {
    QpCaps {
        max_send_wr: o.messages,
        max_recv_wr: o.messages,
        max_message_size: o.size,
        ..QpCaps::new()
    }
}

/// The next event on `ch`, which must be `ty`; acked. Returns its id, listener and UD parameters.
fn expect<B: CmBackend>(
    b: &mut B,
    ch: cm::ChannelHandle,
    ty: CmEventType,
) -> Result<(IdHandle, Option<UdParam>), String> {
    let ev = b
        .get_cm_event(ch, WAIT)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| format!("no {ty} within {WAIT:?}"))?;
    let got = (ev.event(), ev.status(), ev.id(), ev.ud_param().copied());
    b.ack_cm_event(ev).map_err(|e| e.to_string())?;
    if got.0 != ty {
        return Err(format!("udaddy: event: {}, error: {}", got.0, got.1));
    }
    Ok((got.2, got.3))
}

/// Polls `id`'s CQ until `sends` send and `recvs` receive completions arrived, all successful;
/// returns the receives. Both are counted in one loop: a reply can complete before the last
/// send's completion is polled.
fn collect<B: CmBackend>(
    b: &mut B,
    id: IdHandle,
    sends: u32,
    recvs: u32,
) -> Result<Vec<cm::WorkCompletion>, String> {
    let mut sent = 0;
    let mut got = Vec::new();
    let mut out = Vec::new();
    while sent < sends || got.len() < recvs as usize {
        out.clear();
        if b.poll_cq(id, &mut out, 16, WAIT).map_err(|e| e.to_string())? == 0 {
            return Err(format!(
                "udaddy: {sent} of {sends} send and {} of {recvs} receive completions within {WAIT:?}",
                got.len()
            ));
        }
        for wc in out.drain(..) {
            if wc.status != WcStatus::Success {
                return Err(format!("udaddy: completion status {}", wc.status));
            }
            if wc.opcode.is_recv() {
                got.push(wc);
            } else {
                sent += 1;
            }
        }
    }
    Ok(got)
}

fn message(i: u32, size: u32) -> Vec<u8> {
    let mut m = format!("udaddy message {i}").into_bytes();
    m.resize(size as usize, b'.');
    m
}

struct Server<B: CmBackend> {
    b: B,
    ch: cm::ChannelHandle,
    listener: IdHandle,
    nodes: Vec<IdHandle>,
}

impl<B: CmBackend> Server<B> {
    fn listen(mut b: B, o: &Opts) -> Result<Self, String> {
        println!("udaddy: starting server");
        let ip = o.bind.unwrap_or(IpAddr::from([0, 0, 0, 0]));
        let ch = b.create_event_channel().map_err(|e| e.to_string())?;
        let listener = b.create_id(ch, PortSpace::Udp).map_err(|e| e.to_string())?;
        b.bind_addr(listener, SocketAddr::new(ip, o.port))
            .map_err(|e| e.to_string())?;
        b.listen(listener, 0).map_err(|e| e.to_string())?;
        Ok(Server {
            b,
            ch,
            listener,
            nodes: Vec::new(),
        })
    }

    fn accept_all(&mut self, o: &Opts) -> Result<(), String> {
        while self.nodes.len() < o.connections as usize {
            let (child, _) = expect(&mut self.b, self.ch, CmEventType::ConnectRequest)?;
            self.b.create_qp(child, caps(o)).map_err(|e| e.to_string())?;
            for wr in 0..o.messages {
                self.b
                    .post_recv(child, u64::from(wr), o.size)
                    .map_err(|e| e.to_string())?;
            }
            self.b
                .accept(child, &ConnParam::new())
                .map_err(|e| e.to_string())?;
            self.nodes.push(child);
        }
        Ok(())
    }

    /// Receives every client's datagrams, then answers each client with as many.
    fn serve(&mut self, o: &Opts) -> Result<(), String> {
        println!("receiving data transfers");
        let mut peers = Vec::new();
        for &node in &self.nodes {
            let got = collect(&mut self.b, node, 0, o.messages)?;
            if got.iter().any(|wc| wc.byte_len != o.size) {
                return Err("udaddy: a datagram of the wrong length".into());
            }
            let sender = got[0].sender.ok_or("udaddy: a datagram without its sender")?;
            peers.push(sender.reply_to());
        }
        println!("sending replies");
        for (&node, dest) in self.nodes.iter().zip(&peers) {
            for i in 0..o.messages {
                self.b
                    .post_send_to(node, u64::from(i), dest, &message(i, o.size))
                    .map_err(|e| e.to_string())?;
            }
            collect(&mut self.b, node, o.messages, 0)?;
        }
        println!("data transfers complete");
        Ok(())
    }

    fn close(mut self) -> Result<(), String> {
        for id in self.nodes.drain(..).chain([self.listener]) {
            if self.b.id_machine(id).map_err(|e| e.to_string())?.qp().is_some() {
                self.b.destroy_qp(id).map_err(|e| e.to_string())?;
            }
            self.b.destroy_id(id).map_err(|e| e.to_string())?;
        }
        self.b.destroy_event_channel(self.ch).map_err(|e| e.to_string())
    }
}

struct Client<B: CmBackend> {
    b: B,
    ch: cm::ChannelHandle,
    nodes: Vec<(IdHandle, Option<UdParam>)>,
}

impl<B: CmBackend> Client<B> {
    fn connect_all(mut b: B, o: &Opts, server: IpAddr) -> Result<Self, String> {
        println!("udaddy: starting client");
        let ch = b.create_event_channel().map_err(|e| e.to_string())?;
        let dst = SocketAddr::new(server, o.port);
        let src = o.bind.map(|ip| SocketAddr::new(ip, 0));
        println!("udaddy: connecting");
        let mut nodes = Vec::new();
        for _ in 0..o.connections {
            let id = b.create_id(ch, PortSpace::Udp).map_err(|e| e.to_string())?;
            b.resolve_addr(id, src, dst, Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
            expect(&mut b, ch, CmEventType::AddrResolved)?;
            b.resolve_route(id, Duration::from_secs(2))
                .map_err(|e| e.to_string())?;
            expect(&mut b, ch, CmEventType::RouteResolved)?;
            b.create_qp(id, caps(o)).map_err(|e| e.to_string())?;
            for wr in 0..o.messages {
                b.post_recv(id, u64::from(wr), o.size)
                    .map_err(|e| e.to_string())?;
            }
            b.connect(id, &ConnParam::new()).map_err(|e| e.to_string())?;
            nodes.push((id, None));
        }
        Ok(Client { b, ch, nodes })
    }

    fn await_established(&mut self) -> Result<(), String> {
        for _ in 0..self.nodes.len() {
            let (id, ud) = expect(&mut self.b, self.ch, CmEventType::Established)?;
            let node = self
                .nodes
                .iter_mut()
                .find(|(n, _)| *n == id)
                .ok_or("udaddy: ESTABLISHED for an id of nobody")?;
            node.1 = Some(ud.ok_or("udaddy: ESTABLISHED without UD parameters")?);
        }
        Ok(())
    }

    fn send_all(&mut self, o: &Opts) -> Result<(), String> {
        println!("initiating data transfers");
        for &(id, dest) in &self.nodes {
            let dest = dest.ok_or("udaddy: not established")?;
            for i in 0..o.messages {
                self.b
                    .post_send_to(id, u64::from(i), &dest, &message(i, o.size))
                    .map_err(|e| e.to_string())?;
            }
        }
        Ok(())
    }

    fn receive_all(&mut self, o: &Opts) -> Result<(), String> {
        println!("receiving data transfers");
        for &(id, dest) in &self.nodes {
            let got = collect(&mut self.b, id, o.messages, o.messages)?;
            let server_qpn = dest.map(|d| d.qp_num);
            if got.iter().any(|wc| wc.sender.map(|s| s.qp_num) != server_qpn) {
                return Err("udaddy: a reply from a QP that is not the server's".into());
            }
        }
        println!("data transfers complete");
        Ok(())
    }

    fn close(mut self) -> Result<(), String> {
        for (id, _) in std::mem::take(&mut self.nodes) {
            self.b.destroy_qp(id).map_err(|e| e.to_string())?;
            self.b.destroy_id(id).map_err(|e| e.to_string())?;
        }
        self.b.destroy_event_channel(self.ch).map_err(|e| e.to_string())
    }
}

/// Both roles on one simulated fabric, in one thread: each blocking wait moves virtual time.
fn run_sim(o: &Opts) -> Result<(), String> {
    let fabric = cm::SimFabric::builder()
        .seed(o.seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build();
    let server_ip = o.server.unwrap_or(fabric.host(0).addr());
    let mut server = Server::listen(fabric.host(0), o)?;
    let mut client = Client::connect_all(fabric.host(1), o, server_ip)?;
    server.accept_all(o)?;
    client.await_established()?;
    client.send_all(o)?;
    server.serve(o)?;
    client.receive_all(o)?;
    client.close()?;
    server.close()?;
    println!("seed: {}", fabric.seed());
    println!("trace-hash: {:016x}", fabric.trace_hash());
    Ok(())
}

#[cfg(feature = "hw")]
fn run_hw(o: &Opts) -> Result<(), String> {
    let backend = cm::HwBackend::new().map_err(|e| e.to_string())?;
    match o.server {
        None => {
            let mut server = Server::listen(backend, o)?;
            server.accept_all(o)?;
            server.serve(o)?;
            server.close()
        }
        Some(ip) => {
            let mut client = Client::connect_all(backend, o, ip)?;
            client.await_established()?;
            client.send_all(o)?;
            client.receive_all(o)?;
            client.close()
        }
    }
}

#[cfg(not(feature = "hw"))]
fn run_hw(_: &Opts) -> Result<(), String> {
    Err("--backend hw needs the `hw` feature (cargo run --features hw --example udaddy)".into())
}

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let o = match parse(&args) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{e}");
            return ExitCode::from(2);
        }
    };
    let result = if o.hw { run_hw(&o) } else { run_sim(&o) };
    match result {
        Ok(()) => {
            println!("test complete");
            println!("return status 0");
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("{e}");
            println!("return status 1");
            ExitCode::FAILURE
        }
    }
}
