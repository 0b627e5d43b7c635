//! Running a pattern: what each end does with its events, under the simulator's virtual clock
//! or, on a device, the wall clock, and the record both give.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use cm::api::{
    ChannelHandle, CmBackend, CmError, CmEvent, CmEventType, ConnParam, IdHandle, IdOption, PortSpace, QpCaps,
};
use cm::sim::{Fault, MsgKind, SimFabric, SimTime, TraceMode, TraceWhat};

use super::patterns::{Act, Dir, End, Pattern, Rule, Turn};

/// A turn and its time (ms after the connect).
type Timed = (u64, Turn);

/// The port the server listens on (each pattern has its own addresses).
pub(crate) const PORT: u16 = 7470;

/// How long setting up an end may wait for an event (address and route resolution).
const SETUP_WAIT: Duration = Duration::from_secs(10);

/// What one run of a pattern gave.
#[derive(Debug, Default)]
pub(crate) struct Record {
    /// Every event the ends retrieved: end, id (0 the client's, 1... the children), event,
    /// status, when after the connect.
    pub(crate) seen: Vec<(End, u8, CmEventType, i32, Duration)>,
    /// Each act's outcome: end, id, act, the errno of the call that failed (0: all went).
    pub(crate) acts: Vec<(End, u8, Act, i32)>,
    /// IB CM messages on the wire after the connect, every transmission, by way and kind.
    pub(crate) wire: BTreeMap<(Dir, MsgKind), u32>,
    /// A step that went wrong (setting up, a backend error): the run says nothing then.
    pub(crate) error: Option<String>,
}

/// One end: its channel, its ids and what it is due to do.
pub(crate) struct EndState {
    end: End,
    pub(crate) ch: ChannelHandle,
    listener: Option<IdHandle>,
    /// (handle, number, has a QP, alive)
    ids: Vec<(IdHandle, u8, bool, bool)>,
    /// The number the next child gets (a restarted server goes on from its last one).
    next_child: u8,
    /// Acts due: when, on which id, what; in the order the rules named them.
    due: Vec<(Duration, IdHandle, Act)>,
    seen: Vec<(End, u8, CmEventType, i32, Duration)>,
    acts: Vec<(End, u8, Act, i32)>,
}

fn errno_of(e: &CmError) -> i32 {
    e.errno().max(1)
}

impl EndState {
    fn new(end: End, ch: ChannelHandle) -> Self {
        EndState {
            end,
            ch,
            listener: None,
            ids: Vec::new(),
            next_child: 1,
            due: Vec::new(),
            seen: Vec::new(),
            acts: Vec::new(),
        }
    }

    /// The server end: a channel and a listener on `addr`; its children are numbered from
    /// `first_child` on.
    pub(crate) fn server<B: CmBackend>(
        b: &mut B,
        addr: SocketAddr,
        first_child: u8,
    ) -> Result<Self, CmError> {
        let ch = b.create_event_channel()?;
        let l = b.create_id(ch, PortSpace::Tcp)?;
        b.bind_addr(l, addr)?;
        b.listen(l, 0)?;
        let mut s = EndState::new(End::Server, ch);
        s.listener = Some(l);
        s.next_child = first_child;
        Ok(s)
    }

    /// The number the next child of a server restarted after this one gets.
    pub(crate) fn next_child(&self) -> u8 {
        self.next_child
    }

    /// The client end: an id bound to `from`, resolved to `to`, with a QP, ready to connect.
    pub(crate) fn client<B: CmBackend>(
        b: &mut B,
        from: SocketAddr,
        to: SocketAddr,
        ack_timeout: Option<u8>,
    ) -> Result<Self, String> {
        let e = |e: CmError| e.to_string();
        let ch = b.create_event_channel().map_err(e)?;
        let id = b.create_id(ch, PortSpace::Tcp).map_err(e)?;
        if let Some(t) = ack_timeout {
            b.set_option(id, IdOption::AckTimeout(t)).map_err(e)?;
        }
        let mut s = EndState::new(End::Client, ch);
        s.ids.push((id, 0, false, true));
        b.resolve_addr(id, Some(from), to, SETUP_WAIT).map_err(e)?;
        s.wait_for(b, CmEventType::AddrResolved)?;
        b.resolve_route(id, SETUP_WAIT).map_err(e)?;
        s.wait_for(b, CmEventType::RouteResolved)?;
        b.create_qp(id, QpCaps::new()).map_err(e)?;
        s.ids[0].2 = true;
        Ok(s)
    }

    fn wait_for<B: CmBackend>(&mut self, b: &mut B, want: CmEventType) -> Result<(), String> {
        let ev = b
            .get_cm_event(self.ch, SETUP_WAIT)
            .map_err(|e| e.to_string())?
            .ok_or_else(|| format!("no {want} within {SETUP_WAIT:?}"))?;
        let got = (ev.event(), ev.status());
        b.ack_cm_event(ev).map_err(|e| e.to_string())?;
        if got != (want, 0) {
            return Err(format!("{} (status {}) where {want} was due", got.0, got.1));
        }
        Ok(())
    }

    /// The client's `connect`, at the pattern's time zero.
    pub(crate) fn connect<B: CmBackend>(&mut self, b: &mut B) -> Result<(), String> {
        b.connect(self.ids[0].0, &ConnParam::new())
            .map_err(|e| e.to_string())
    }

    /// An event retrieved at `now`: recorded, acked, and the rules for it put in the due list.
    pub(crate) fn on_event<B: CmBackend>(
        &mut self,
        b: &mut B,
        ev: CmEvent,
        now: Duration,
        rules: &[Rule],
    ) -> Result<(), String> {
        let (ty, status, id) = (ev.event(), ev.status(), ev.id());
        let n = match ty {
            CmEventType::ConnectRequest => {
                let n = self.next_child;
                self.next_child += 1;
                self.ids.push((id, n, false, true));
                n
            }
            _ => self.ids.iter().find(|i| i.0 == id).map_or(u8::MAX, |i| i.1),
        };
        self.seen.push((self.end, n, ty, status, now));
        b.ack_cm_event(ev).map_err(|e| format!("ack of {ty}: {e}"))?;
        for r in rules.iter().filter(|r| r.end == self.end && r.on == ty) {
            self.due
                .push((now + Duration::from_millis(r.after_ms), id, r.act));
        }
        Ok(())
    }

    /// When the next act is due.
    pub(crate) fn next_due(&self) -> Option<Duration> {
        self.due.iter().map(|d| d.0).min()
    }

    /// Runs the acts due by `now`, earliest first (in rule order at equal times); returns
    /// whether it ran any.
    pub(crate) fn run_due<B: CmBackend>(&mut self, b: &mut B, now: Duration) -> bool {
        let mut ran = false;
        while let Some(i) = (0..self.due.len())
            .filter(|&i| self.due[i].0 <= now)
            .min_by_key(|&i| (self.due[i].0, i))
        {
            let (_, id, act) = self.due.remove(i);
            self.act(b, id, act);
            ran = true;
        }
        ran
    }

    fn act<B: CmBackend>(&mut self, b: &mut B, id: IdHandle, act: Act) {
        let Some(k) = self.ids.iter().position(|i| i.0 == id && i.3) else {
            return; // destroyed by an earlier act
        };
        let n = self.ids[k].1;
        let r = match act {
            Act::Accept => b.create_qp(id, QpCaps::new()).and_then(|_| {
                self.ids[k].2 = true;
                b.accept(id, &ConnParam::new())
            }),
            Act::Reject => b.reject(id, &[]).and_then(|()| {
                self.ids[k].3 = false;
                b.destroy_id(id)
            }),
            Act::Disconnect => b.disconnect(id),
            Act::Destroy => self.destroy(b, k),
        };
        self.acts
            .push((self.end, n, act, r.as_ref().err().map_or(0, errno_of)));
    }

    fn destroy<B: CmBackend>(&mut self, b: &mut B, k: usize) -> Result<(), CmError> {
        let (id, _, qp, _) = self.ids[k];
        self.ids[k].3 = false;
        if qp {
            b.destroy_qp(id)?;
        }
        b.destroy_id(id)
    }

    /// Everything left goes: ids (their QPs first), the listener, the channel.
    pub(crate) fn teardown<B: CmBackend>(&mut self, b: &mut B) -> Result<(), String> {
        for k in 0..self.ids.len() {
            if self.ids[k].3 {
                self.destroy(b, k)
                    .map_err(|e| format!("teardown of id {}: {e}", self.ids[k].1))?;
            }
        }
        if let Some(l) = self.listener.take() {
            b.destroy_id(l)
                .map_err(|e| format!("teardown of the listener: {e}"))?;
        }
        b.destroy_event_channel(self.ch)
            .map_err(|e| format!("teardown of the channel: {e}"))
    }

    /// Hands the end's record over.
    pub(crate) fn into_record(self, into: &mut Record) {
        into.seen.extend(self.seen);
        into.acts.extend(self.acts);
    }
}

/// The simulator's host numbers: the client on 0, the server on 1.
const fn sim_hosts(dir: Dir) -> (u16, u16) {
    match dir {
        Dir::ToServer => (0, 1),
        Dir::ToClient => (1, 0),
    }
}

/// Runs `p` on a fabric of its own (seed `seed`), in virtual time: both ends on one thread, the
/// losses as [`Fault::Drop`] rules struck at the connect, cuts as partitions, the server's crash
/// and restart as the simulator's.
pub(crate) fn run_sim(p: &Pattern, seed: u64) -> Record {
    let (a, b): (SocketAddr, SocketAddr) = (
        SocketAddr::new([10, 0, 0, 1].into(), 0),
        SocketAddr::new([10, 0, 0, 2].into(), PORT),
    );
    let fabric = SimFabric::builder()
        .seed(seed)
        .host(a.ip())
        .host(b.ip())
        .trace(TraceMode::Full)
        .build();
    let (mut client_b, mut server_b) = (fabric.host(0), fabric.host(1));
    let mut record = Record::default();
    let setup = EndState::server(&mut server_b, b, 1)
        .map_err(|e| e.to_string())
        .and_then(|s| Ok((s, EndState::client(&mut client_b, a, b, p.client_ack_timeout)?)));
    let (server, mut client) = match setup {
        Ok(ends) => ends,
        Err(e) => {
            record.error = Some(format!("setup: {e}"));
            return record;
        }
    };
    // The server end while its host is up; a crashed one's record is kept in `record`.
    let mut server = Some(server);
    let start = fabric.now();
    for l in p.losses {
        let (from, to) = sim_hosts(l.dir);
        fabric.inject(Fault::Drop {
            from,
            to,
            msg: l.msg,
            skip: l.skip,
            count: l.count,
        });
    }
    let since = |t: SimTime| t.since_start() - start.since_start();
    let horizon = Duration::from_millis(p.horizon_ms);
    let mut turns: Vec<Timed> = p.turns.to_vec();
    // A cut from time zero is in place before the REQ leaves.
    if turns.first() == Some(&(0, Turn::Cut)) {
        turns.remove(0);
        fabric.inject(Fault::Partition { a: 0, b: 1 });
    }
    if let Err(e) = client.connect(&mut client_b) {
        record.error = Some(format!("connect: {e}"));
        return record;
    }
    let mut next_child = 1;
    loop {
        let now = since(fabric.now());
        if now >= horizon {
            break;
        }
        let mut moved = false;
        while turns.first().is_some_and(|t| Duration::from_millis(t.0) <= now) {
            match turns.remove(0).1 {
                Turn::Cut => fabric.inject(Fault::Partition { a: 0, b: 1 }),
                Turn::Heal => fabric.inject(Fault::Heal { a: 0, b: 1 }),
                Turn::Crash => {
                    fabric.inject(Fault::Crash { host: 1 });
                    if let Some(s) = server.take() {
                        next_child = s.next_child();
                        s.into_record(&mut record);
                    }
                }
                Turn::Restart => {
                    fabric.inject(Fault::Restart { host: 1 });
                    match EndState::server(&mut server_b, b, next_child) {
                        Ok(s) => server = Some(s),
                        Err(e) => {
                            record.error.get_or_insert(format!("restart: {e}"));
                        }
                    }
                }
            }
            moved = true;
        }
        for (end, backend) in [
            (Some(&mut client), &mut client_b),
            (server.as_mut(), &mut server_b),
        ] {
            let Some(end) = end else { continue };
            moved |= end.run_due(backend, now);
            loop {
                match backend.try_get_cm_event(end.ch) {
                    Ok(Some(ev)) => {
                        if let Err(e) = end.on_event(backend, ev, now, p.rules) {
                            record.error.get_or_insert(e);
                        }
                        moved = true;
                    }
                    Ok(None) => break,
                    Err(e) => {
                        record.error.get_or_insert(e.to_string());
                        break;
                    }
                }
            }
        }
        if moved {
            continue;
        }
        let wake = [
            client.next_due(),
            server.as_ref().and_then(EndState::next_due),
            turns.first().map(|t| Duration::from_millis(t.0)),
        ]
        .into_iter()
        .flatten()
        .fold(horizon, Duration::min);
        let at = SimTime::from_nanos((start.since_start() + wake).as_nanos() as u64);
        fabric.step(Some(at), at);
    }
    let end = start.since_start() + horizon;
    for r in fabric.trace_records() {
        let t = r.time.since_start();
        if t < start.since_start() || t > end {
            continue;
        }
        let (msg, to) = match r.what {
            TraceWhat::Sent { msg, to } | TraceWhat::Lost { msg, to } => (msg, to),
            _ => continue,
        };
        let dir = if (r.host, to) == sim_hosts(Dir::ToServer) {
            Dir::ToServer
        } else {
            Dir::ToClient
        };
        *record.wire.entry((dir, msg)).or_default() += 1;
    }
    let mut torn = client.teardown(&mut client_b);
    if let Some(mut s) = server {
        torn = torn.and_then(|()| s.teardown(&mut server_b));
        s.into_record(&mut record);
    }
    if let Err(e) = torn {
        record.error.get_or_insert(e);
    }
    client.into_record(&mut record);
    record.seen.sort_by_key(|s| (s.0, s.4));
    // Each end's acts in their order, the client's first.
    record.acts.sort_by_key(|a| a.0);
    record
}

/// The loss rules on a device's wire: nft rules in the lab's `ip cm_fault` table, pair `k`.
#[cfg(feature = "hw")]
pub(crate) mod wire {
    use std::collections::BTreeMap;
    use std::process::Command;

    use super::super::patterns::{attr_id, kind_name, Dir, Loss, ALL, KINDS};
    use cm::sim::MsgKind;

    fn chain(k: usize, dir: Dir) -> String {
        format!("p{k}_{}_drop", dir_name(dir))
    }

    pub(crate) fn dir_name(dir: Dir) -> &'static str {
        match dir {
            Dir::ToServer => "ab",
            Dir::ToClient => "ba",
        }
    }

    fn nft(args: &[&str]) -> Result<String, String> {
        let out = Command::new("nft")
            .args(args)
            .output()
            .map_err(|e| format!("nft {}: {e}", args.join(" ")))?;
        if !out.status.success() {
            return Err(format!(
                "nft {}: {}",
                args.join(" "),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// Removes every drop and cut rule of pair `k`.
    pub(crate) fn clear(k: usize) -> Result<(), String> {
        for dir in [Dir::ToServer, Dir::ToClient] {
            nft(&["flush", "chain", "ip", "cm_fault", &chain(k, dir)])?;
        }
        Ok(())
    }

    /// Adds the rule that loses `l` on pair `k`: a match on the MAD's attribute id and, unless
    /// every one goes, `numgen inc` numbering the matching messages from 0.
    pub(crate) fn lose(k: usize, l: &Loss) -> Result<(), String> {
        let attr = format!("0x{:04x}", attr_id(l.msg));
        let range = match l.count {
            ALL if l.skip == 0 => None,
            ALL => Some(format!("{}-999999", l.skip)),
            1 => Some(l.skip.to_string()),
            n => Some(format!("{}-{}", l.skip, l.skip + n - 1)),
        };
        let chain = chain(k, l.dir);
        let mut args = vec!["add", "rule", "ip", "cm_fault", &chain, "@th,352,16", &attr];
        if let Some(r) = &range {
            args.extend(["numgen", "inc", "mod", "1000000", r]);
        }
        args.extend(["counter", "drop"]);
        nft(&args).map(|_| ())
    }

    /// Cuts every CM message of pair `k`, both ways, after its counters (heal: [`clear`]).
    pub(crate) fn cut(k: usize) -> Result<(), String> {
        for dir in [Dir::ToServer, Dir::ToClient] {
            nft(&["add", "rule", "ip", "cm_fault", &chain(k, dir), "counter", "drop"])?;
        }
        Ok(())
    }

    /// Cuts every packet between pair `k`'s addresses, both ways, ahead of the counters (the
    /// table's `cut` chain, which all pairs share): the wire of a crashed host, which sends
    /// nothing. Returns the rules' handles, for [`uncut`].
    pub(crate) fn crash_cut(k: usize) -> Result<Vec<String>, String> {
        let (a, b) = (format!("10.0.{k}.1"), format!("10.0.{k}.2"));
        let mut handles = Vec::new();
        for (from, to) in [(&a, &b), (&b, &a)] {
            let out = nft(&[
                "--echo", "--handle", "add", "rule", "ip", "cm_fault", "cut", "ip", "saddr", from, "ip",
                "daddr", to, "drop",
            ])?;
            let handle = out
                .rsplit_once("# handle ")
                .map(|(_, h)| h.trim().to_string())
                .ok_or_else(|| format!("nft gave no handle for the cut rule: {out}"))?;
            handles.push(handle);
        }
        Ok(handles)
    }

    /// Removes the cut rules [`crash_cut`] added.
    pub(crate) fn uncut(handles: &[String]) -> Result<(), String> {
        for h in handles {
            nft(&["delete", "rule", "ip", "cm_fault", "cut", "handle", h])?;
        }
        Ok(())
    }

    /// Pair `k`'s counters: every CM message that reached the hook, by way and kind.
    pub(crate) fn counts(k: usize) -> Result<BTreeMap<(Dir, MsgKind), u32>, String> {
        let text = nft(&["list", "counters", "table", "ip", "cm_fault"])?;
        let mut by_name = BTreeMap::new();
        let mut name = String::new();
        for line in text.lines().map(str::trim) {
            if let Some(rest) = line.strip_prefix("counter ") {
                name = rest.trim_end_matches('{').trim().to_string();
            } else if let Some(rest) = line.strip_prefix("packets ") {
                let n = rest
                    .split_whitespace()
                    .next()
                    .and_then(|v| v.parse().ok())
                    .unwrap_or(0);
                by_name.insert(std::mem::take(&mut name), n);
            }
        }
        let mut out = BTreeMap::new();
        for dir in [Dir::ToServer, Dir::ToClient] {
            for msg in KINDS {
                let n = format!("p{k}_{}_{}", dir_name(dir), kind_name(msg));
                let v = *by_name.get(&n).ok_or_else(|| {
                    format!("no counter {n} in table ip cm_fault (fewer pairs than patterns?)")
                })?;
                out.insert((dir, msg), v);
            }
        }
        Ok(out)
    }
}

/// Runs `p` on the device's pair topology, pair `k` (client on 10.0.k.1, server on 10.0.k.2):
/// each end on a thread of its own with its own backend, on the wall clock; the losses and cuts
/// as nft rules on the pair's wire; a crash of the server's host as a cut ahead of the counters
/// and the server's backend dropped (its kernel's last words go nowhere), its restart as a new
/// backend listening again once the cut is gone.
///
/// Every pattern's setup (two backends, the listener, the client's resolution, the nft rules)
/// is done before `ready` lets any of them start its clock: under emulation one pattern's
/// setup (processes spawned for nft, sysfs reads) starves another's connect by hundreds of
/// milliseconds, which its event times would count.
#[cfg(feature = "hw")]
pub(crate) fn run_hw(p: &Pattern, k: usize, ready: &std::sync::Barrier) -> Record {
    use std::time::Instant;

    let mut record = Record::default();
    let b = SocketAddr::new([10, 0, k as u8, 2].into(), PORT);
    let set_up = set_up_hw(p, k);
    ready.wait();
    let (mut client_b, server_b, server, mut client, before, mut link, host) = match set_up {
        Ok(x) => x,
        Err(e) => {
            record.error = Some(e);
            return record;
        }
    };
    let horizon = Duration::from_millis(p.horizon_ms);
    let start = Instant::now();
    let rules = p.rules;
    let server_thread =
        std::thread::spawn(move || serve(server_b, server, rules, start, horizon, host, b, k));
    let mut err = client
        .connect(&mut client_b)
        .err()
        .map(|e| format!("connect: {e}"));
    if err.is_none() {
        err = drive(&mut client_b, &mut client, rules, start, horizon, &mut link, k);
    }
    let (mut server_b, server, mut server_record) = match server_thread.join() {
        Ok(x) => x,
        Err(_) => {
            record.error = Some("server thread: panicked".into());
            return record;
        }
    };
    record.error = err.or(server_record.error.take());
    match wire::counts(k) {
        Ok(after) => {
            for (key, n) in after {
                let d = n.saturating_sub(before.get(&key).copied().unwrap_or(0));
                if d > 0 {
                    record.wire.insert(key, d);
                }
            }
        }
        Err(e) => {
            record.error.get_or_insert(e);
        }
    }
    let mut torn = client.teardown(&mut client_b);
    if let Some(mut s) = server {
        torn = torn.and_then(|()| s.teardown(&mut server_b));
        s.into_record(&mut server_record);
    }
    if let Err(e) = torn.and_then(|()| wire::clear(k)) {
        record.error.get_or_insert(e);
    }
    client.into_record(&mut record);
    record.seen.extend(server_record.seen);
    record.acts.extend(server_record.acts);
    record.seen.sort_by_key(|s| (s.0, s.4));
    // Each end's acts in their order, the client's first.
    record.acts.sort_by_key(|a| a.0);
    record
}

/// What [`run_hw`] has ready when its clock starts.
#[cfg(feature = "hw")]
type HwSetUp = (
    cm::hw::HwBackend,
    cm::hw::HwBackend,
    EndState,
    EndState,
    BTreeMap<(Dir, MsgKind), u32>,
    Vec<Timed>,
    Vec<Timed>,
);

/// Pattern `p`'s ends on pair `k`, its losses in place: everything before the connect.
#[cfg(feature = "hw")]
fn set_up_hw(p: &Pattern, k: usize) -> Result<HwSetUp, String> {
    use cm::hw::HwBackend;

    let k8 = k as u8;
    let a = SocketAddr::new([10, 0, k8, 1].into(), 0);
    let b = SocketAddr::new([10, 0, k8, 2].into(), PORT);
    let (mut client_b, mut server_b) = match HwBackend::new().and_then(|c| Ok((c, HwBackend::new()?))) {
        Ok(x) => x,
        Err(e) => return Err(format!("backends: {e}")),
    };
    if let Err(e) = wire::clear(k) {
        return Err(format!("nft: {e}"));
    }
    let server = match EndState::server(&mut server_b, b, 1) {
        Ok(s) => s,
        Err(e) => return Err(format!("server setup: {e}")),
    };
    let client = match EndState::client(&mut client_b, a, b, p.client_ack_timeout) {
        Ok(c) => c,
        Err(e) => return Err(format!("client setup: {e}")),
    };
    let before = match wire::counts(k) {
        Ok(c) => c,
        Err(e) => return Err(format!("nft: {e}")),
    };
    for l in p.losses {
        if let Err(e) = wire::lose(k, l) {
            return Err(format!("nft: {e}"));
        }
    }
    // The link's turns are the client thread's, the host's the server's.
    let (mut link, host): (Vec<Timed>, Vec<Timed>) = p
        .turns
        .iter()
        .partition(|t| matches!(t.1, Turn::Cut | Turn::Heal));
    // A cut from time zero is in place before the REQ leaves.
    if link.first() == Some(&(0, Turn::Cut)) {
        link.remove(0);
        if let Err(e) = wire::cut(k) {
            return Err(format!("nft: {e}"));
        }
    }
    Ok((client_b, server_b, server, client, before, link, host))
}

/// The server's thread: its end until the host's next turn (a crash, then a restart) or the
/// horizon. Returns the backend and end that are up at the horizon (none when the host is down
/// then) and what the crashed ones recorded.
#[cfg(feature = "hw")]
#[allow(clippy::too_many_arguments)]
fn serve(
    mut b: cm::hw::HwBackend,
    end: EndState,
    rules: &'static [Rule],
    start: std::time::Instant,
    horizon: Duration,
    host: Vec<Timed>,
    addr: SocketAddr,
    k: usize,
) -> (cm::hw::HwBackend, Option<EndState>, Record) {
    let mut record = Record::default();
    let mut end = Some(end);
    let (mut cut, mut next_child) = (Vec::new(), 1);
    for (at, turn) in host {
        let at = Duration::from_millis(at);
        match (turn, end.take()) {
            (Turn::Crash, Some(mut up)) => {
                if let Some(e) = drive(&mut b, &mut up, rules, start, at, &mut Vec::new(), k) {
                    record.error.get_or_insert(e);
                }
                match wire::crash_cut(k) {
                    Ok(h) => cut = h,
                    Err(e) => {
                        record.error.get_or_insert(e);
                    }
                }
                next_child = up.next_child();
                up.into_record(&mut record);
                // Dropped, not torn down: its kernel destroys what is left, as at a kill -9.
                b = match cm::hw::HwBackend::new() {
                    Ok(fresh) => fresh,
                    Err(e) => {
                        record
                            .error
                            .get_or_insert(format!("a backend for the restart: {e}"));
                        return (b, None, record);
                    }
                };
            }
            (Turn::Restart, None) => {
                std::thread::sleep(at.saturating_sub(start.elapsed()));
                if let Err(e) = wire::uncut(&std::mem::take(&mut cut)) {
                    record.error.get_or_insert(e);
                }
                match EndState::server(&mut b, addr, next_child) {
                    Ok(s) => end = Some(s),
                    Err(e) => {
                        record.error.get_or_insert(format!("restart: {e}"));
                        return (b, None, record);
                    }
                }
            }
            (other, state) => {
                record
                    .error
                    .get_or_insert(format!("{other:?} of the server's host out of turn"));
                end = state;
            }
        }
    }
    if let Some(up) = end.as_mut() {
        if let Some(e) = drive(&mut b, up, rules, start, horizon, &mut Vec::new(), k) {
            record.error.get_or_insert(e);
        }
    } else {
        std::thread::sleep(horizon.saturating_sub(start.elapsed()));
    }
    (b, end, record)
}

/// One end's loop on the wall clock until `horizon`: the acts due, the cuts due (the client's
/// thread runs them), the events as they come, each wait bounded by the next of those.
#[cfg(feature = "hw")]
fn drive<B: CmBackend>(
    b: &mut B,
    end: &mut EndState,
    rules: &[Rule],
    start: std::time::Instant,
    horizon: Duration,
    cuts: &mut Vec<Timed>,
    k: usize,
) -> Option<String> {
    loop {
        let now = start.elapsed();
        if now >= horizon {
            return None;
        }
        while cuts.first().is_some_and(|c| Duration::from_millis(c.0) <= now) {
            let turn = cuts.remove(0).1;
            if let Err(e) = if turn == Turn::Cut {
                wire::cut(k)
            } else {
                wire::clear(k)
            } {
                return Some(e);
            }
        }
        end.run_due(b, now);
        let wake = [end.next_due(), cuts.first().map(|c| Duration::from_millis(c.0))]
            .into_iter()
            .flatten()
            .fold(horizon, Duration::min);
        let wait = wake
            .saturating_sub(start.elapsed())
            .min(Duration::from_millis(200));
        match b.get_cm_event(end.ch, wait) {
            Ok(Some(ev)) => {
                if let Err(e) = end.on_event(b, ev, start.elapsed(), rules) {
                    return Some(e);
                }
            }
            Ok(None) => {}
            Err(e) => return Some(e.to_string()),
        }
    }
}
