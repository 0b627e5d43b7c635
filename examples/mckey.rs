//! rdma-core's `mckey` written against the trait: multicast on the UDP port space.
//!
//! Each of `-c` ids binds to `-b`, makes a UD QP (a receiver posts `-C` receives of `-S`
//! bytes) and joins the group `-m`; `MULTICAST_JOIN` names the group's QP number, Q_Key and
//! GID. A sender (`-s`) then sends `-C` datagrams to the group from each id; a receiver waits
//! for `-C` of them on each. Every id leaves the group at the end. Interoperates with
//! rdma-core's `mckey` in both roles on a device (`--backend hw`). Unlike `mckey`, the ids
//! bind to `-b` instead of resolving the group's address (the trait's joins need a bound or
//! resolved id either way), so `-b` is needed on a device.
//!
//! ```sh
//! cargo run --example mckey                                              # both roles, simulated
//! cargo run --features hw --example mckey -- --backend hw -m 239.1.2.3 -b 10.0.0.1      # receiver
//! cargo run --features hw --example mckey -- --backend hw -m 239.1.2.3 -b 10.0.0.1 -s   # sender
//! ```

use std::net::{IpAddr, SocketAddr};
use std::process::ExitCode;
use std::time::Duration;

use cm::{CmBackend, CmEventType, IdHandle, PortSpace, QpCaps, UdParam, WcOpcode, WcStatus};

/// How long any one wait may take before the run fails.
const WAIT: Duration = Duration::from_secs(30);

const USAGE: &str = "usage: mckey -m multicast_address [-b bind_address] [-s] [-c connections] \
[-C message_count] [-S message_size] [--backend sim|hw] [--seed S]";

#[derive(Clone, Debug)]
struct Opts {
    group: IpAddr,
    bind: Option<IpAddr>,
    sender: bool,
    connections: u32,
    messages: u32,
    size: u32,
    hw: bool,
    seed: u64,
}

fn parse(args: &[String]) -> Result<Opts, String> {
    let mut o = Opts {
        group: IpAddr::from([239, 1, 2, 3]),
        bind: None,
        sender: false,
        connections: 1,
        messages: 10,
        size: 100,
        hw: false,
        seed: 7,
    };
    let mut it = args.iter();
    while let Some(flag) = it.next() {
        let mut value = || it.next().ok_or_else(|| format!("{flag} needs a value"));
        let bad = |v: &str| format!("{flag}: bad value {v:?}");
        match flag.as_str() {
            "-m" => o.group = value()?.parse().map_err(|_| bad(flag))?,
            "-b" => o.bind = Some(value()?.parse().map_err(|_| bad(flag))?),
            "-s" => o.sender = true,
            "-c" => o.connections = value()?.parse().map_err(|_| bad(flag))?,
            "-C" => o.messages = value()?.parse().map_err(|_| bad(flag))?,
            "-S" => o.size = value()?.parse().map_err(|_| bad(flag))?,
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
    if !o.group.is_multicast() {
        return Err(format!("-m {}: not a multicast address", o.group));
    }
    if o.connections == 0 || o.messages > 256 || o.size == 0 || o.size > 1024 {
        return Err("need 0..=256 messages of 1..=1024 bytes on at least one id".into());
    }
    Ok(o)
}

fn err(e: impl std::fmt::Display) -> String {
    format!("mckey: {e}")
}

/// One side: its ids, each with the group's destination once joined.
struct Node<B: CmBackend> {
    b: B,
    ch: cm::ChannelHandle,
    ids: Vec<(IdHandle, Option<UdParam>)>,
    sender: bool,
}

impl<B: CmBackend> Node<B> {
    /// Binds `connections` ids to `bind`, with a UD QP each (receives posted on a receiver),
    /// and asks to join the group.
    fn join(mut b: B, o: &Opts, bind: IpAddr, sender: bool) -> Result<Self, String> {
        println!("mckey: starting {}", if sender { "client" } else { "server" });
        let ch = b.create_event_channel().map_err(err)?;
        let caps = QpCaps {
            max_send_wr: o.messages.max(1),
            max_recv_wr: o.messages.max(1),
            max_message_size: o.size,
            ..QpCaps::new()
        };
        let mut ids = Vec::new();
        for _ in 0..o.connections {
            let id = b.create_id(ch, PortSpace::Udp).map_err(err)?;
            b.bind_addr(id, SocketAddr::new(bind, 0)).map_err(err)?;
            b.create_qp(id, caps).map_err(err)?;
            if !sender {
                for wr in 0..o.messages {
                    b.post_recv(id, u64::from(wr), o.size).map_err(err)?;
                }
            }
            b.join_multicast(id, SocketAddr::new(o.group, 0)).map_err(err)?;
            ids.push((id, None));
        }
        println!("mckey: joining");
        Ok(Node { b, ch, ids, sender })
    }

    /// Waits for every id's `MULTICAST_JOIN`.
    fn await_joins(&mut self) -> Result<(), String> {
        while self.ids.iter().any(|(_, d)| d.is_none()) {
            let ev = self
                .b
                .get_cm_event(self.ch, WAIT)
                .map_err(err)?
                .ok_or_else(|| err(format!("no MULTICAST_JOIN within {WAIT:?}")))?;
            let (ty, status, id, dest) = (ev.event(), ev.status(), ev.id(), ev.ud_param().copied());
            self.b.ack_cm_event(ev).map_err(err)?;
            if ty != CmEventType::MulticastJoin {
                return Err(format!("mckey: event: {ty}, error: {status}"));
            }
            let dest = dest.ok_or_else(|| err("MULTICAST_JOIN without the group"))?;
            println!(
                "mckey: joined dgid: {} qpn {:#x} qkey {:#x}",
                std::net::Ipv6Addr::from(dest.ah_attr.dgid),
                dest.qp_num,
                dest.qkey
            );
            if let Some(slot) = self.ids.iter_mut().find(|(i, _)| *i == id) {
                slot.1 = Some(dest);
            }
        }
        Ok(())
    }

    /// Sends `messages` datagrams to the group from every id, or receives as many on each.
    fn transfer(&mut self, o: &Opts) -> Result<(), String> {
        if o.messages == 0 {
            return Ok(());
        }
        let opcode = if self.sender {
            println!("initiating data transfers");
            for &(id, dest) in &self.ids {
                let dest = dest.expect("joined");
                for i in 0..o.messages {
                    let mut m = format!("mckey message {i}").into_bytes();
                    m.resize(o.size as usize, b'.');
                    self.b.post_send_to(id, u64::from(i), &dest, &m).map_err(err)?;
                }
            }
            WcOpcode::Send
        } else {
            println!("receiving data transfers");
            WcOpcode::Recv
        };
        for &(id, _) in &self.ids {
            let mut seen = 0;
            let mut out = Vec::new();
            while seen < o.messages {
                out.clear();
                if self.b.poll_cq(id, &mut out, 16, WAIT).map_err(err)? == 0 {
                    return Err(err(format!(
                        "{seen} of {} completions within {WAIT:?}",
                        o.messages
                    )));
                }
                for wc in &out {
                    if wc.status != WcStatus::Success {
                        return Err(err(format!("completion status {}", wc.status)));
                    }
                    seen += u32::from(wc.opcode == opcode);
                }
            }
        }
        println!("data transfers complete");
        Ok(())
    }

    fn leave(mut self, o: &Opts) -> Result<(), String> {
        for (id, _) in std::mem::take(&mut self.ids) {
            self.b
                .leave_multicast(id, SocketAddr::new(o.group, 0))
                .map_err(err)?;
            self.b.destroy_qp(id).map_err(err)?;
            self.b.destroy_id(id).map_err(err)?;
        }
        self.b.destroy_event_channel(self.ch).map_err(err)
    }
}

/// Both roles on one simulated fabric, in one thread: a receiver on the first host, a sender
/// on the second.
fn run_sim(o: &Opts) -> Result<(), String> {
    let fabric = cm::SimFabric::builder()
        .seed(o.seed)
        .host("10.0.0.1")
        .host("10.0.0.2")
        .build();
    let mut receiver = Node::join(fabric.host(0), o, fabric.host(0).addr(), false)?;
    let mut sender = Node::join(fabric.host(1), o, fabric.host(1).addr(), true)?;
    receiver.await_joins()?;
    sender.await_joins()?;
    sender.transfer(o)?;
    receiver.transfer(o)?;
    sender.leave(o)?;
    receiver.leave(o)?;
    println!("seed: {}", fabric.seed());
    println!("trace-hash: {:016x}", fabric.trace_hash());
    Ok(())
}

#[cfg(feature = "hw")]
fn run_hw(o: &Opts) -> Result<(), String> {
    let bind = o.bind.ok_or("--backend hw needs -b (the device's address)")?;
    let backend = cm::HwBackend::new().map_err(err)?;
    let mut node = Node::join(backend, o, bind, o.sender)?;
    node.await_joins()?;
    node.transfer(o)?;
    node.leave(o)
}

#[cfg(not(feature = "hw"))]
fn run_hw(_: &Opts) -> Result<(), String> {
    Err("--backend hw needs the `hw` feature (cargo run --features hw --example mckey)".into())
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
