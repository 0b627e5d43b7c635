//! The owned objects: the channel handle [`Cm`], [`Listener`] and [`Connection`].

use std::cell::Cell;
use std::collections::VecDeque;
use std::future::{poll_fn, Future};
use std::net::SocketAddr;
use std::pin::{pin, Pin};
use std::rc::Rc;
use std::task::Poll;
use std::time::Duration;

use cm_core::errno::ETIMEDOUT;
use cm_core::{Access, RemoteAddr, SendOp, SendWr, Sge, WcOpcode, WcStatus, WorkCompletion, ATOMIC_LEN};
use cm_core::{CmBackend, CmError, CmEventType, ConnParam, IdHandle, LiveResources, PortSpace, QpCaps};

use crate::driver::{EventInfo, Shared};
use crate::error::{Error, Result};
use crate::region::Region;
use crate::runtime::{waiting_in, Runtime};

/// How connections are made and bounded. [`Default`] suits most uses.
#[derive(Clone, Debug)]
pub struct ConnOptions {
    /// Private data sent with the connect request (client) or the accept (server).
    pub private_data: Vec<u8>,
    /// Given to `rdma_resolve_addr` / `rdma_resolve_route`: `ADDR_ERROR` / `ROUTE_ERROR` after it.
    pub resolve_timeout: Duration,
    /// Bound on the whole of [`Cm::connect`]. The default, 120 s, lets the IB CM's own retries
    /// end first (`UNREACHABLE` after 16 tries of about 4.3 s each).
    pub connect_timeout: Duration,
    /// Bound on [`Connection::disconnect`]: the wait for `DISCONNECTED` and the flush.
    pub disconnect_timeout: Duration,
    /// Receive buffers kept posted, so that a peer's send always finds one.
    pub recv_depth: u32,
    /// The QP asked for; its `max_message_size` is the longest message.
    pub caps: QpCaps,
}

impl Default for ConnOptions {
    fn default() -> Self {
        ConnOptions {
            private_data: Vec::new(),
            resolve_timeout: Duration::from_secs(2),
            connect_timeout: Duration::from_secs(120),
            disconnect_timeout: Duration::from_secs(120),
            recv_depth: 4,
            caps: QpCaps::new(),
        }
    }
}

/// One event channel and the backend behind it, shared by every listener and connection made
/// from it. Cloning gives another handle to the same channel.
///
/// Something must retrieve the channel's events and wake the tasks they are for: make a `Cm`
/// with [`SimRuntime::cm`](crate::sim::SimRuntime::cm) (the simulator's executor drives it) or
/// `TokioRuntime::cm` (a task on the channel's fd drives it). [`Cm::new`] with
/// [`Cm::pump`] is for other runtimes.
pub struct Cm<B: CmBackend, R: Runtime> {
    pub(crate) sh: Rc<Shared<B>>,
    rt: R,
}

impl<B: CmBackend, R: Runtime> Clone for Cm<B, R> {
    fn clone(&self) -> Self {
        Cm {
            sh: self.sh.clone(),
            rt: self.rt.clone(),
        }
    }
}

impl<B: CmBackend + 'static, R: Runtime> Cm<B, R> {
    /// Creates an event channel on `backend`. Nothing retrieves its events until someone calls
    /// [`pump`](Cm::pump) whenever the backend may have new ones; the runtimes' constructors
    /// arrange that.
    pub fn new(backend: B, rt: R) -> Result<Self> {
        Ok(Cm {
            sh: Rc::new(Shared::new(backend)?),
            rt,
        })
    }

    /// Retrieves every queued event and every completion a task waits for, and wakes the tasks
    /// they are for; returns whether anything was handed out. Never blocks.
    pub fn pump(&self) -> bool {
        self.sh.pump(true)
    }

    /// The runtime: spawn, sleep, timeout, now.
    pub fn runtime(&self) -> &R {
        &self.rt
    }

    /// What the backend still holds (channels, ids, QPs, unacked events).
    pub fn live_resources(&self) -> LiveResources {
        self.sh.st.borrow().b.live_resources()
    }

    /// Binds to `addr` and listens (`rdma_bind_addr` + `rdma_listen`, backlog 0: the system's
    /// maximum). Accepted connections use `opts`.
    pub fn listen(&self, addr: SocketAddr, opts: ConnOptions) -> Result<Listener<B, R>> {
        let id = {
            let mut st = self.sh.st.borrow_mut();
            let ch = st.ch;
            let id = st.b.create_id(ch, PortSpace::Tcp)?;
            st.open(id);
            id
        };
        let param = ConnParam::new().with_private_data(&opts.private_data);
        let listener = Listener {
            sh: self.sh.clone(),
            rt: self.rt.clone(),
            id,
            accept: Rc::new(AcceptWith { opts, param }),
        };
        {
            let mut st = self.sh.st.borrow_mut();
            st.b.bind_addr(id, addr)?;
            st.b.listen(id, 0)?;
        }
        Ok(listener)
    }

    /// Connects to `dst`: address and route resolution, QP, `rdma_connect`, `ESTABLISHED`.
    /// Each failure event is its own error ([`Error::AddrError`], [`Error::RouteError`],
    /// [`Error::Rejected`] with the peer's private data, [`Error::Unreachable`],
    /// [`Error::ConnectError`]); the whole is bounded by `opts.connect_timeout`. Dropping the
    /// future halfway releases everything it made.
    pub async fn connect(&self, dst: SocketAddr, opts: &ConnOptions) -> Result<Connection<B, R>> {
        // The bound is polled by each wait itself rather than by a `timeout` around the whole:
        // the wrapper's future and poll function were a layer more to move and to poll at every
        // step of every connect.
        let mut bound = pin!(self.rt.sleep(opts.connect_timeout));
        let id = {
            let mut st = self.sh.st.borrow_mut();
            let ch = st.ch;
            let id = st.b.create_id(ch, PortSpace::Tcp)?;
            st.open(id);
            id
        };
        let mut conn = Connection::new(self.sh.clone(), self.rt.clone(), id, opts);
        self.sh
            .st
            .borrow_mut()
            .b
            .resolve_addr(id, None, dst, opts.resolve_timeout)?;
        // One wait for the three events, each step's call made as soon as its event is taken
        // (as three waits in a row made them): a single poll function that knows which event
        // is next, where three waits were three states to save and restore at every poll.
        let mut want = CmEventType::AddrResolved;
        poll_fn(|cx| loop {
            let data = match conn.expect_now(want, cx) {
                Poll::Ready(Ok(data)) => data,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return passed(bound.as_mut(), cx, "connect"),
            };
            match want {
                CmEventType::AddrResolved => {
                    if let Err(e) = self.sh.st.borrow_mut().b.resolve_route(id, opts.resolve_timeout) {
                        return Poll::Ready(Err(e.into()));
                    }
                    want = CmEventType::RouteResolved;
                }
                CmEventType::RouteResolved => {
                    if let Err(e) = self.connect_now(&mut conn, opts) {
                        return Poll::Ready(Err(e));
                    }
                    want = CmEventType::Established;
                }
                _ => {
                    conn.peer_data = data;
                    return Poll::Ready(Ok(()));
                }
            }
        })
        .await?;
        Ok(conn)
    }

    /// `connect`'s step once the route is resolved: the QP, then `rdma_connect`.
    fn connect_now(&self, conn: &mut Connection<B, R>, opts: &ConnOptions) -> Result<()> {
        conn.set_up_qp(opts)?;
        let mut param = self.sh.connect_param.borrow_mut();
        let data = &opts.private_data[..];
        let same = param.as_ref().is_some_and(|p| {
            p.private_data.len() == data.len() && data.starts_with(p.private_data.as_slice())
        });
        if !same {
            *param = Some(ConnParam::new().with_private_data(data));
        }
        let param = param.as_ref().expect("just made");
        self.sh.st.borrow_mut().b.connect(conn.id, param)?;
        Ok(())
    }
}

/// A listening id. Dropping it refuses the requests not accepted yet and destroys the id.
#[must_use = "dropping a Listener stops listening at once"]
pub struct Listener<B: CmBackend, R: Runtime> {
    sh: Rc<Shared<B>>,
    rt: R,
    id: IdHandle,
    accept: Rc<AcceptWith>,
}

/// How a listener's connections are set up, made once and shared by its requests.
struct AcceptWith {
    opts: ConnOptions,
    /// The accept's parameters (a few hundred bytes, with the private data in them).
    param: ConnParam,
}

impl<B: CmBackend + 'static, R: Runtime> Listener<B, R> {
    /// Registers `len` zeroed bytes with `access` on the listener's device (`ibv_reg_mr`): a
    /// region every connection the listener accepts can share with its peer. The listener must
    /// be bound to an address of a device, not a wildcard.
    ///
    /// # Errors
    /// [`CmError::NoDevice`](cm_core::CmError::NoDevice) on a wildcard listener; the
    /// backend's refusals of [`reg_mr`](cm_core::CmBackend::reg_mr).
    pub fn register(&self, len: usize, access: Access) -> Result<Region<B>> {
        register(&self.sh, self.id, len, access)
    }

    /// The bound address (with the port picked, when 0 was asked for).
    pub fn local_addr(&self) -> Result<Option<SocketAddr>> {
        Ok(self.sh.st.borrow_mut().b.get_local_addr(self.id)?)
    }

    /// The next connection request, to accept or reject. Dropping the future halfway leaves
    /// nothing behind; dropping the [`Request`] rejects it.
    pub async fn request(&self) -> Result<Request<B, R>> {
        let conn = self.next_request().await?;
        Ok(Request {
            conn: Some(conn),
            with: self.accept.clone(),
        })
    }

    /// The next request's connection, not answered yet (dropping it releases the id, as a
    /// dropped [`Request`] does after its reject).
    async fn next_request(&self) -> Result<Connection<B, R>> {
        let ev = self.next_request_event("request").await?;
        self.request_connection(ev)
    }

    /// The next `CONNECT_REQUEST` (or `DEVICE_REMOVAL`). The events a listener has no use for
    /// are skipped inside the wait, which takes one poll function rather than a loop around a
    /// future of its own for each event; and it is that poll function, not an `async fn`
    /// around it, so that `accept` goes through one state machine less at each poll.
    fn next_request_event(&self, op: &'static str) -> impl Future<Output = Result<EventInfo>> + '_ {
        poll_fn(move |cx| {
            let got = self
                .sh
                .st
                .borrow_mut()
                .next_for(self.id, cx.waker(), |ev| {
                    matches!(ev.ty, CmEventType::ConnectRequest | CmEventType::DeviceRemoval).then_some(ev)
                })
                .map_err(Error::ChannelFailed);
            if got.is_pending() {
                waiting_in(op);
            }
            got
        })
    }

    /// The connection of the request `ev` (or the device's removal it stands for).
    fn request_connection(&self, ev: EventInfo) -> Result<Connection<B, R>> {
        if ev.ty == CmEventType::DeviceRemoval {
            return Err(Error::DeviceRemoved);
        }
        let mut conn = Connection::new(self.sh.clone(), self.rt.clone(), ev.id, &self.accept.opts);
        conn.peer_data = ev.private_data;
        Ok(conn)
    }

    /// The next connection: waits for a `CONNECT_REQUEST`, gives the new id a QP with its
    /// receives posted, and accepts it. Returns the connection and the request's private data
    /// (padded by the IB CM to 56 bytes). A request whose set-up fails is refused and the wait
    /// goes on; the passive side's `ESTABLISHED` is taken by the connection's first operation.
    /// Dropping the future halfway leaves nothing behind.
    pub async fn accept(&self) -> Result<(Connection<B, R>, Vec<u8>)> {
        // Without a `Request` in between: at 136 bytes, moving one into its `accept` would be a
        // call to `memcpy`, and dropping it a check for nothing. A set-up that fails drops the
        // connection, which releases the id, as a failed `Request::accept` does.
        loop {
            let mut conn = self.request_connection(self.next_request_event("accept").await?)?;
            let data = conn.peer_data.clone();
            if conn.accept_with(&self.accept).is_ok() {
                return Ok((conn, data));
            }
        }
    }
}

/// A connection request not answered yet. Dropping it rejects it (without private data).
#[must_use = "dropping a Request rejects it"]
pub struct Request<B: CmBackend, R: Runtime> {
    conn: Option<Connection<B, R>>,
    with: Rc<AcceptWith>,
}

impl<B: CmBackend + 'static, R: Runtime> Request<B, R> {
    fn conn(&self) -> &Connection<B, R> {
        self.conn.as_ref().expect("a request holds its id until answered")
    }

    /// The private data of the request (padded by the IB CM to 56 bytes).
    pub fn private_data(&self) -> &[u8] {
        &self.conn().peer_data
    }

    /// The requester's address.
    pub fn peer_addr(&self) -> Result<Option<SocketAddr>> {
        self.conn().peer_addr()
    }

    /// Gives the new id a QP with its receives posted and accepts (`rdma_accept`, with the
    /// listener's private data). On failure the id is released.
    pub fn accept(mut self) -> Result<Connection<B, R>> {
        let mut conn = self.conn.take().expect("a request holds its id until answered");
        conn.accept_with(&self.with)?;
        Ok(conn)
    }

    /// [`accept`](Self::accept) with `private_data` in place of the listener's: for what only
    /// this connection's peer should learn (say, the [`RemoteMr`](cm_core::RemoteMr) of a
    /// region made for it, 20 bytes of the 196 an accept carries).
    pub fn accept_with_private_data(mut self, private_data: &[u8]) -> Result<Connection<B, R>> {
        let mut conn = self.conn.take().expect("a request holds its id until answered");
        let with = AcceptWith {
            opts: self.with.opts.clone(),
            param: self.with.param.with_private_data(private_data),
        };
        conn.accept_with(&with)?;
        Ok(conn)
    }

    /// Rejects (`rdma_reject` with `private_data`: the requester gets [`Error::Rejected`] with it)
    /// and releases the id.
    pub fn reject(mut self, private_data: &[u8]) -> Result<()> {
        let conn = self.conn.take().expect("a request holds its id until answered");
        let r = conn.sh.st.borrow_mut().b.reject(conn.id, private_data);
        Ok(r?)
    }
}

impl<B: CmBackend, R: Runtime> Drop for Request<B, R> {
    fn drop(&mut self) {
        if let Some(conn) = self.conn.take() {
            if let Ok(mut st) = conn.sh.st.try_borrow_mut() {
                let _ = st.b.reject(conn.id, &[]);
            }
        }
    }
}

impl<B: CmBackend, R: Runtime> Drop for Listener<B, R> {
    fn drop(&mut self) {
        self.sh.release(self.id, true);
    }
}

/// An RDMA WRITE with immediate the peer made ([`Connection::recv_imm`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ImmWrite {
    /// The immediate it carried.
    pub imm: u32,
    /// How many bytes it wrote.
    pub len: u32,
}

/// Registers a region through `id` (its device's protection domain).
fn register<B: CmBackend>(sh: &Rc<Shared<B>>, id: IdHandle, len: usize, access: Access) -> Result<Region<B>> {
    let mut st = sh.st.borrow_mut();
    let mr = st.b.reg_mr(id, len, access)?;
    match st.b.mr_info(mr) {
        Ok(info) => Ok(Region::new(sh.clone(), mr, info)),
        Err(e) => {
            let _ = st.b.dereg_mr(mr);
            Err(e.into())
        }
    }
}

/// What [`Connection::disconnect`] found still on the connection, and how the goodbye went:
/// nothing posted is ever lost without being reported.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Closed {
    /// Messages that had arrived and that no [`recv`](Connection::recv) took.
    pub unread: Vec<Vec<u8>>,
    /// RDMA WRITEs with immediate the peer made that no [`recv_imm`](Connection::recv_imm)
    /// took, in the order they landed.
    pub unread_imms: Vec<ImmWrite>,
    /// Completions of sends whose [`send`](Connection::send) future was dropped before it saw
    /// them (`WR_FLUSH_ERR` when the disconnect flushed them).
    pub unreported_sends: Vec<WorkCompletion>,
    /// The receives the layer had posted that took no message: flushed (`WR_FLUSH_ERR`) when
    /// the QP left RTS, or failed otherwise with no [`recv`](Connection::recv) to report it.
    /// In posting order (their `wr_id`s, which the layer numbers, rise). A connection keeps
    /// [`ConnOptions::recv_depth`] receives posted (each one a `recv` takes is posted again),
    /// so a connection closed while its peer was silent reports that many here.
    pub flushed_recvs: Vec<WorkCompletion>,
    /// Status of the `DISCONNECTED` event (0, or `-ETIMEDOUT` when the peer never answered).
    pub status: i32,
    /// Whether this side's DREQ went unanswered: no DREP came within the IB CM's retries, and
    /// `DISCONNECTED` came with `-ETIMEDOUT` (the peer crashed, was cut off, or lost every
    /// try). The connection is closed here all the same, so [`disconnect`](Connection::disconnect)
    /// returns `Ok` with this set rather than an error: whether the peer heard the goodbye
    /// is for the caller to weigh. `false` when the peer answered, and when the peer's own DREQ
    /// ended the connection first.
    pub dreq_timed_out: bool,
}

const SEND_BIT: u64 = 1 << 63;

/// A connection: its id and QP. Dropping it hands the teardown to the channel's driver (QP,
/// then id; a connected peer sees `DISCONNECTED`); [`disconnect`](Connection::disconnect) ends
/// it gracefully and reports what was still posted.
#[must_use = "dropping a Connection tears it down at once"]
pub struct Connection<B: CmBackend, R: Runtime> {
    sh: Rc<Shared<B>>,
    rt: R,
    id: IdHandle,
    peer_data: Vec<u8>,
    disconnect_timeout: Duration,
    recv_len: u32,
    next_wr: Cell<u64>,
    /// Work requests posted whose completion nobody took out of the mailbox yet.
    posted: Cell<u32>,
    /// The event that ended the connection, once one came.
    ended: Cell<Option<(CmEventType, i32)>>,
    /// The private data of the event that ended the connection. A `Cell` (taken and put back
    /// to be read) rather than a `RefCell`: the flag's 8 bytes would take the connection past
    /// 128, where each of its moves (returned by `connect`, into `disconnect`) is a `memcpy` call.
    end_data: Cell<Vec<u8>>,
}

impl<B: CmBackend + 'static, R: Runtime> Connection<B, R> {
    fn new(sh: Rc<Shared<B>>, rt: R, id: IdHandle, opts: &ConnOptions) -> Self {
        Connection {
            sh,
            rt,
            id,
            peer_data: Vec::new(),
            disconnect_timeout: opts.disconnect_timeout,
            recv_len: opts.caps.max_message_size,
            next_wr: Cell::new(0),
            posted: Cell::new(0),
            ended: Cell::new(None),
            end_data: Cell::new(Vec::new()),
        }
    }

    fn set_up_qp(&mut self, opts: &ConnOptions) -> Result<()> {
        let mut caps = opts.caps;
        caps.max_recv_wr = caps.max_recv_wr.max(opts.recv_depth);
        let granted = self.sh.st.borrow_mut().b.create_qp(self.id, caps)?;
        self.recv_len = granted.max_message_size.min(opts.caps.max_message_size);
        for _ in 0..opts.recv_depth {
            self.post_recv()?;
        }
        Ok(())
    }

    /// Gives a requested connection its QP with its receives posted, and accepts it.
    fn accept_with(&mut self, with: &AcceptWith) -> Result<()> {
        self.set_up_qp(&with.opts)?;
        self.sh.st.borrow_mut().b.accept(self.id, &with.param)?;
        Ok(())
    }

    fn post_recv(&self) -> Result<()> {
        let wr = self.next_wr.get();
        self.next_wr.set(wr + 1);
        self.sh.st.borrow_mut().b.post_recv(self.id, wr, self.recv_len)?;
        self.posted.set(self.posted.get() + 1);
        Ok(())
    }

    /// The private data the peer sent: the request's on the server, the accept's on the client.
    pub fn peer_private_data(&self) -> &[u8] {
        &self.peer_data
    }

    /// The peer's address.
    pub fn peer_addr(&self) -> Result<Option<SocketAddr>> {
        Ok(self.sh.st.borrow_mut().b.get_peer_addr(self.id)?)
    }

    /// Sends `data` and waits for its completion. Fails with the connection's end
    /// ([`Error::Disconnected`], ...) when it ends first (the send, still posted, is then
    /// reported by [`disconnect`](Connection::disconnect)), or with [`Error::Completion`].
    ///
    /// # Bound
    ///
    /// None of its own: it waits as long as the transport does. A send that finds no receive
    /// posted at the peer is retried (receiver not ready) as often as the connection's RNR
    /// retry count allows, and librdmacm's default count, 7, means for ever. On the simulator
    /// such a send never completes (the README's departure 9: a peer that takes no messages,
    /// or that made its connection with [`ConnOptions::recv_depth`] 0, leaves it waiting until
    /// the run's deadline); on a device, as long as the peer's receives stay away. Bound it
    /// with the runtime's [`timeout`](Runtime::timeout), which ends the wait with
    /// [`Error::TimedOut`] `{ op: "send" }`. That cancels the wait, not the send: it stays
    /// posted, and [`disconnect`](Connection::disconnect) reports it in
    /// [`Closed::unreported_sends`] (`WR_FLUSH_ERR`).
    ///
    /// ```
    /// use std::time::Duration;
    /// use cm_async::{Connection, Error, Runtime};
    /// use cm_core::CmBackend;
    ///
    /// async fn send_within<B: CmBackend + 'static, R: Runtime>(
    ///     conn: &Connection<B, R>,
    ///     rt: &R,
    ///     msg: &[u8],
    /// ) -> Result<(), Error> {
    ///     // The outer `?` turns the timeout's `Elapsed` into `Error::TimedOut { op: "send" }`.
    ///     rt.timeout(Duration::from_secs(5), conn.send(msg)).await?
    /// }
    /// ```
    pub async fn send(&self, data: &[u8]) -> Result<()> {
        let wr = SEND_BIT | self.next_wr.get();
        self.next_wr.set(self.next_wr.get() + 1);
        self.sh.st.borrow_mut().b.post_send(self.id, wr, data)?;
        self.posted.set(self.posted.get() + 1);
        let wc = self
            .wait_cq("send", |cq| {
                cq.iter().position(|wc| wc.wr_id == wr).and_then(|i| cq.remove(i))
            })
            .await?;
        match wc.status {
            WcStatus::Success => Ok(()),
            status => Err(Error::Completion { status }),
        }
    }

    /// The next message. Messages that arrived before the connection ended come first; then the
    /// end ([`Error::Disconnected`], ...).
    pub fn recv(&self) -> impl Future<Output = Result<Vec<u8>>> + '_ {
        // A poll function around the wait's, not an `async fn`: a task waiting for a message
        // polls it at every wake, and a state machine would be one more layer to go through.
        let mut wait = self.wait_cq("recv", |cq| {
            let i = cq.iter().position(|wc| wc.opcode == WcOpcode::Recv)?;
            cq.remove(i)
        });
        poll_fn(move |cx| {
            let wc = match Pin::new(&mut wait).poll(cx) {
                Poll::Ready(r) => r?,
                Poll::Pending => return Poll::Pending,
            };
            if wc.status != WcStatus::Success {
                return Poll::Ready(Err(Error::Completion { status: wc.status }));
            }
            // Keeps the ring full; fails only when the QP left RTS, and then the end shows next.
            let _ = self.post_recv();
            Poll::Ready(Ok(wc.data))
        })
    }

    /// Registers `len` zeroed bytes with `access` on the connection's device (`ibv_reg_mr`).
    /// The region serves every connection on the device; give the peer its
    /// [`remote`](Region::remote) for it to read, write or update it.
    ///
    /// # Errors
    /// The backend's refusals of [`reg_mr`](cm_core::CmBackend::reg_mr).
    pub fn register(&self, len: usize, access: Access) -> Result<Region<B>> {
        register(&self.sh, self.id, len, access)
    }

    /// RDMA WRITE of `len` bytes at `offset` of `local` to the peer's `remote`; waits for its
    /// completion. The peer's NIC checks the key and the range: a bad one is
    /// [`Error::Completion`] with `REM_ACCESS_ERR`, and the connection's QP is in ERR after it
    /// (every later operation fails flushed).
    pub async fn write(&self, local: &Region<B>, offset: u64, len: u32, remote: RemoteAddr) -> Result<()> {
        let sge = [Sge::new(local.handle(), offset, len)];
        self.one_sided(SendOp::Write { remote, imm: None }, &sge)
            .await
            .map(drop)
    }

    /// [`write`](Self::write) with an immediate: the write also takes one of the peer's posted
    /// receives, which its [`recv_imm`](Self::recv_imm) reports with `imm`.
    pub async fn write_with_imm(
        &self,
        local: &Region<B>,
        offset: u64,
        len: u32,
        remote: RemoteAddr,
        imm: u32,
    ) -> Result<()> {
        let sge = [Sge::new(local.handle(), offset, len)];
        self.one_sided(
            SendOp::Write {
                remote,
                imm: Some(imm),
            },
            &sge,
        )
        .await
        .map(drop)
    }

    /// RDMA READ of `len` bytes at the peer's `remote` into `local` at `offset`; waits for its
    /// completion (errors as [`write`](Self::write)'s).
    pub async fn read(&self, local: &Region<B>, offset: u64, len: u32, remote: RemoteAddr) -> Result<()> {
        let sge = [Sge::new(local.handle(), offset, len)];
        self.one_sided(SendOp::Read { remote }, &sge).await.map(drop)
    }

    /// Atomic compare-and-swap of the peer's 8 aligned bytes at `remote`: they become `swap`
    /// if they were `compare`. Returns the value they had (also left in `local` at `offset`,
    /// where the NIC puts it). Atomics on one region are serialised by the peer's NIC.
    pub async fn compare_swap(
        &self,
        local: &Region<B>,
        offset: u64,
        remote: RemoteAddr,
        compare: u64,
        swap: u64,
    ) -> Result<u64> {
        let sge = [Sge::new(local.handle(), offset, ATOMIC_LEN)];
        self.one_sided(
            SendOp::CompareSwap {
                remote,
                compare,
                swap,
            },
            &sge,
        )
        .await?;
        local.read_u64(offset)
    }

    /// Atomic fetch-and-add of `add` to the peer's 8 aligned bytes at `remote` (wrapping).
    /// Returns the value they had (also left in `local` at `offset`).
    ///
    /// A counter on a server, incremented by every client:
    ///
    /// ```
    /// use std::net::SocketAddr;
    /// use cm_async::{Cm, ConnOptions, Error, Runtime};
    /// use cm_core::{Access, CmBackend, RemoteMr};
    ///
    /// async fn increment<B: CmBackend + 'static, R: Runtime>(cm: Cm<B, R>, at: SocketAddr) -> Result<u64, Error> {
    ///     let conn = cm.connect(at, &ConnOptions::default()).await?;
    ///     let counter = RemoteMr::from_bytes(conn.peer_private_data()).expect("the server's counter");
    ///     let scratch = conn.register(8, Access::LOCAL_WRITE)?;
    ///     let before = conn.fetch_add(&scratch, 0, counter.start(), 1).await?;
    ///     drop(scratch);
    ///     conn.disconnect().await?;
    ///     Ok(before)
    /// }
    /// ```
    pub async fn fetch_add(
        &self,
        local: &Region<B>,
        offset: u64,
        remote: RemoteAddr,
        add: u64,
    ) -> Result<u64> {
        let sge = [Sge::new(local.handle(), offset, ATOMIC_LEN)];
        self.one_sided(SendOp::FetchAdd { remote, add }, &sge).await?;
        local.read_u64(offset)
    }

    /// The next RDMA WRITE with immediate the peer made into this side's memory: its
    /// immediate and length. It took one of the connection's posted receives (which is posted
    /// again); messages ([`recv`](Self::recv)) are not taken.
    pub async fn recv_imm(&self) -> Result<ImmWrite> {
        let wc = self
            .wait_cq("recv_imm", |cq| {
                let i = cq.iter().position(|wc| wc.opcode == WcOpcode::RecvRdmaWithImm)?;
                cq.remove(i)
            })
            .await?;
        if wc.status != WcStatus::Success {
            return Err(Error::Completion { status: wc.status });
        }
        let _ = self.post_recv();
        Ok(ImmWrite {
            imm: wc.imm_data.unwrap_or(0),
            len: wc.byte_len,
        })
    }

    /// Posts one work request over regions and waits for its completion; a failed one is
    /// [`Error::Completion`].
    async fn one_sided(&self, op: SendOp, sge: &[Sge]) -> Result<WorkCompletion> {
        let name = match op {
            SendOp::Write { imm: None, .. } => "write",
            SendOp::Write { imm: Some(_), .. } => "write_with_imm",
            SendOp::Read { .. } => "read",
            SendOp::CompareSwap { .. } => "compare_swap",
            SendOp::FetchAdd { .. } => "fetch_add",
            SendOp::Send { .. } => "send",
        };
        let wr = SEND_BIT | self.next_wr.get();
        self.next_wr.set(self.next_wr.get() + 1);
        self.sh
            .st
            .borrow_mut()
            .b
            .post_send_wr(self.id, &SendWr::new(wr, op, sge))?;
        self.posted.set(self.posted.get() + 1);
        let wc = self
            .wait_cq(name, |cq| {
                cq.iter().position(|wc| wc.wr_id == wr).and_then(|i| cq.remove(i))
            })
            .await?;
        match wc.status {
            WcStatus::Success => Ok(wc),
            status => Err(Error::Completion { status }),
        }
    }

    /// Disconnects (`rdma_disconnect`), waits for `DISCONNECTED` and for everything still
    /// posted to complete (flushed), then releases the QP and the id. Bounded by the options'
    /// `disconnect_timeout` ([`Error::TimedOut`] `{ op: "disconnect" }`; the teardown happens
    /// all the same).
    ///
    /// [`Closed`] reports what was still posted: messages and writes with immediate nobody
    /// received, the receives the layer had posted ([`Closed::flushed_recvs`]), sends nobody
    /// saw complete. A DREQ the peer never answered (it crashed, or every try was lost) is
    /// `Ok` with [`Closed::dreq_timed_out`] set, not an error: the connection is closed on
    /// this side either way.
    #[allow(clippy::manual_async_fn)] // on purpose: see the comment inside
    pub fn disconnect(self) -> impl Future<Output = Result<Closed>> {
        // An `async` block that uses the connection where it was captured, not an `async fn`,
        // which would move its argument (128 bytes) into the future's locals at the first
        // poll. The connection is dropped (released) when the block completes.
        async move {
            // As in `connect`, each wait polls the bound itself. It is made by the first wait that
            // finds nothing (in this first poll, so at the same instant): a passive side that saw
            // `DISCONNECTED` already and has nothing posted never waits, and made it for nothing.
            let mut bound = pin!(None);
            let timeout = || self.rt.sleep(self.disconnect_timeout);
            let sent_dreq = match self.sh.st.borrow_mut().b.disconnect(self.id) {
                Ok(()) => true,
                // Never connected, or the attempt failed: there is nobody to say goodbye to.
                Err(CmError::WrongState { .. }) => false,
                Err(e) => return Err(e.into()),
            };
            let mut status = match self.ended.get() {
                Some((_, s)) => s,
                None => 0,
            };
            let mut dreq_timed_out = false;
            let (sh, id) = (&self.sh, self.id);
            if sent_dreq && self.ended.get().map(|(ty, _)| ty) != Some(CmEventType::Disconnected) {
                status = poll_fn(|cx| {
                    let got = sh.st.borrow_mut().next_for(id, cx.waker(), |ev| {
                        matches!(ev.ty, CmEventType::Disconnected | CmEventType::DeviceRemoval)
                            .then_some(ev.status)
                    });
                    match got {
                        Poll::Ready(r) => Poll::Ready(r.map_err(Error::ChannelFailed)),
                        Poll::Pending => passed_made(bound.as_mut(), timeout, cx, "disconnect"),
                    }
                })
                .await?;
                // Only the answer to this side's own DREQ can time out: a `DISCONNECTED` taken
                // before (the peer's DREQ came first) says nothing about it.
                dreq_timed_out = status == -ETIMEDOUT;
            }
            let mut closed = Closed {
                status,
                dreq_timed_out,
                ..Closed::default()
            };
            if self.posted.get() == 0 {
                // Every completion was taken: there is nothing left to flush, and no wait
                // for it to make and poll.
                return Ok(closed);
            }
            poll_fn(|cx| {
                let mut st = sh.st.borrow_mut();
                st.poll_cq_into_box(id);
                if let Some(cq) = st.mailbox(id).and_then(|bx| bx.cq()) {
                    for wc in cq.drain(..) {
                        self.posted.set(self.posted.get().saturating_sub(1));
                        match (wc.opcode, wc.status) {
                            (WcOpcode::Recv, WcStatus::Success) => closed.unread.push(wc.data),
                            (WcOpcode::RecvRdmaWithImm, WcStatus::Success) => {
                                closed.unread_imms.push(ImmWrite {
                                    imm: wc.imm_data.unwrap_or(0),
                                    len: wc.byte_len,
                                })
                            }
                            (op, _) if op.is_recv() => closed.flushed_recvs.push(wc),
                            _ => closed.unreported_sends.push(wc),
                        }
                    }
                }
                if self.posted.get() == 0 || st.failed.is_some() {
                    return Poll::Ready(Ok(()));
                }
                st.wait(id, cx.waker(), true);
                drop(st);
                passed_made(bound.as_mut(), timeout, cx, "disconnect")
            })
            .await?;
            // Both backends flush a receive queue in posting order today; the layer's own
            // numbers keep the documented order from resting on that.
            closed.flushed_recvs.sort_unstable_by_key(|wc| wc.wr_id);
            Ok(closed)
        }
    }

    /// The private data of the next event of the connection if it is `want`, skipping the
    /// ignorable ones; another is the error it stands for; `Pending` (with the task's waker
    /// registered) when none is there. Only the private data comes out, not the whole event:
    /// it is what the caller uses, and the result is moved at each level of the poll.
    #[inline]
    fn expect_now(&self, want: CmEventType, cx: &mut std::task::Context<'_>) -> Poll<Result<Vec<u8>>> {
        let got = self.sh.st.borrow_mut().next_for(self.id, cx.waker(), |ev| {
            if ev.ty == want {
                Some(Ok(ev.private_data))
            } else if !ignorable(ev.ty) {
                Some(Err(end_error(ev.ty, ev.status, ev.private_data)))
            } else {
                None
            }
        });
        match got {
            Poll::Ready(Ok(r)) => Poll::Ready(r),
            Poll::Ready(Err(e)) => Poll::Ready(Err(Error::ChannelFailed(e))),
            Poll::Pending => Poll::Pending,
        }
    }

    /// Waits until `pick` finds its completion in the mailbox, or the connection ends. The
    /// poll function itself, not an `async fn` around it: `recv` and `send` await it at each
    /// of their polls, and an extra state machine would be one more layer to go through.
    fn wait_cq<'a>(
        &'a self,
        op: &'static str,
        mut pick: impl FnMut(&mut VecDeque<WorkCompletion>) -> Option<WorkCompletion> + 'a,
    ) -> impl Future<Output = Result<WorkCompletion>> + 'a {
        let (sh, id) = (&self.sh, self.id);
        poll_fn(move |cx| {
            let mut st = sh.st.borrow_mut();
            // With nothing posted the CQ has nothing for this connection: it is neither polled
            // nor watched (a connection without receive buffers waits for its end alone).
            let cq = self.posted.get() > 0;
            let mut found = None;
            if let (Some(bx), failed) = st.mailbox_and_failed(id) {
                found = bx.cq().and_then(&mut pick);
                while found.is_none() {
                    let Some(ev) = bx.pop_event() else { break };
                    if !ignorable(ev.ty) && self.ended.get().is_none() {
                        self.ended.set(Some((ev.ty, ev.status)));
                        self.end_data.set(ev.private_data);
                    }
                }
                if found.is_none() && !cq && self.ended.get().is_none() && failed.is_none() {
                    // The usual wait, registered on the mailbox already at hand.
                    bx.add_waker(cx.waker());
                    waiting_in(op);
                    return Poll::Pending;
                }
            }
            if found.is_none() && cq && (self.ended.get().is_some() || st.failed.is_some()) {
                // What the CQ already holds came before the end.
                st.poll_cq_into_box(id);
                found = st.mailbox(id).and_then(|bx| bx.cq()).and_then(&mut pick);
            }
            if let Some(wc) = found {
                self.posted.set(self.posted.get().saturating_sub(1));
                return Poll::Ready(Ok(wc));
            }
            if let Some((ty, status)) = self.ended.get() {
                let data = self.end_data.take();
                self.end_data.set(data.clone());
                return Poll::Ready(Err(end_error(ty, status, data)));
            }
            if let Some(e) = &st.failed {
                return Poll::Ready(Err(Error::ChannelFailed(e.clone())));
            }
            st.wait(id, cx.waker(), cq);
            waiting_in(op);
            Poll::Pending
        })
    }
}

impl<B: CmBackend, R: Runtime> Drop for Connection<B, R> {
    fn drop(&mut self) {
        self.sh
            .release_keeping(self.id, false, std::mem::take(&mut self.peer_data));
    }
}

/// `Pending` while `bound` has not passed, [`Error::TimedOut`] for `op` once it has. A wait
/// calls it after registering its waker, when it found nothing (as a `timeout` around it would
/// poll its sleep after it).
fn passed<S: Future<Output = ()>, T>(
    bound: Pin<&mut S>,
    cx: &mut std::task::Context<'_>,
    op: &'static str,
) -> Poll<Result<T>> {
    match bound.poll(cx) {
        Poll::Ready(()) => Poll::Ready(Err(Error::TimedOut { op })),
        Poll::Pending => {
            waiting_in(op);
            Poll::Pending
        }
    }
}

/// [`passed`] for a bound made by `make` when first needed.
fn passed_made<S: Future<Output = ()>, T>(
    mut bound: Pin<&mut Option<S>>,
    make: impl FnOnce() -> S,
    cx: &mut std::task::Context<'_>,
    op: &'static str,
) -> Poll<Result<T>> {
    if bound.is_none() {
        bound.set(Some(make()));
    }
    passed(bound.as_pin_mut().expect("made above"), cx, op)
}

/// Events that change nothing for the connection's owner.
fn ignorable(ty: CmEventType) -> bool {
    matches!(
        ty,
        CmEventType::Established | CmEventType::TimewaitExit | CmEventType::AddrChange
    )
}

fn end_error(ty: CmEventType, status: i32, private_data: Vec<u8>) -> Error {
    match ty {
        CmEventType::AddrError => Error::AddrError { status },
        CmEventType::RouteError => Error::RouteError { status },
        CmEventType::Rejected => Error::Rejected { status, private_data },
        CmEventType::Unreachable => Error::Unreachable { status },
        CmEventType::ConnectError => Error::ConnectError { status },
        CmEventType::DeviceRemoval => Error::DeviceRemoved,
        _ => Error::Disconnected { status },
    }
}
