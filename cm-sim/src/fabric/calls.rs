//! The bodies of the librdmacm calls, one per `CmBackend` method.

use super::*;
use cm_core::backend::{post_gate, Admission};

impl Fabric {
    pub(crate) fn create_event_channel(&mut self, host: u16) -> R<ChannelHandle> {
        self.host_up(host, Call::CreateEventChannel)?;
        let r = self.channels.insert(Channel {
            host,
            queue: Fifo::new(),
            ids: 0,
        });
        self.hosts[host as usize].counts.channels += 1;
        Ok(cm_core::backend::channel_handle(
            self.tag(host),
            r.index,
            r.generation,
        ))
    }

    pub(crate) fn destroy_event_channel(&mut self, host: u16, ch: ChannelHandle) -> R<()> {
        let r = self.channel_ref(host, ch, Call::DestroyEventChannel)?;
        let c = self.channels.get(r).expect("checked");
        if c.ids > 0 {
            return Err(CmError::ChannelBusy { ids: c.ids });
        }
        let c = self.channels.remove(r).expect("checked");
        for q in c.queue {
            self.drop_payload(q.payload);
        }
        self.hosts[host as usize].counts.channels -= 1;
        Ok(())
    }

    pub(crate) fn create_id(&mut self, host: u16, ch: ChannelHandle, ps: PortSpace) -> R<IdHandle> {
        let channel = self.channel_ref(host, ch, Call::CreateId)?;
        let r = self.ids.insert_with(|| IdSlot {
            host,
            channel,
            m: IdMachine::new(ps),
            local: Addr::None,
            peer: Addr::None,
            port_bound: false,
            cm: Exchange::new(),
            remote_host: u16::MAX,
            kept: NO_PAYLOAD,
            remote: SlotRef::NONE,
            timers: IdTimers::default(),
            queued: 0,
            last_arrival: SimTime::ZERO,
            pending_status: 0,
            retries: Retries::NEW,
            peer_lost: false,
            visible: true,
            qp: None,
            listener: None,
        });
        self.ids_changed();
        self.channels.get_mut(channel).expect("checked").ids += 1;
        self.hosts[host as usize].counts.ids += 1;
        Ok(cm_core::backend::id_handle(self.tag(host), r.index, r.generation))
    }

    pub(crate) fn destroy_id(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::DestroyId)?;
        self.slot(r).m.destroy()?;
        let children = self
            .slot(r)
            .listener
            .take()
            .map(|l| l.pending)
            .unwrap_or_default();
        for child in children {
            self.release(child);
        }
        self.release(r);
        Ok(())
    }

    /// What the kernel does when an id goes away: tell the peer, free the port, drop the id
    /// and (lazily) its queued events.
    pub(super) fn release(&mut self, r: SlotRef) {
        self.transition(r, Input::Destroy, SlotRef::NONE, u16::MAX, NO_PAYLOAD);
        self.vanish(r);
    }

    pub(super) fn bind_port(&mut self, host: u16, r: SlotRef, addr: SocketAddr, call: Call) -> R<()> {
        let ip = addr.ip();
        let wildcard = binds_as_wildcard(ip);
        if !wildcard && !self.hosts[host as usize].addrs.contains(&ip) {
            return Err(CmError::AddrNotAvailable { call });
        }
        if !wildcard && !self.hosts[host as usize].device {
            // The address is local but no RDMA device carries it (removed).
            return Err(CmError::Os {
                call,
                errno: errno::ENODEV,
            });
        }
        let ps = self.slot(r).m.port_space();
        let opts = self.bind_opts(r, ip.is_ipv6());
        let port = self
            .ports
            .bind_with(host, ps, (!wildcard).then_some(ip), addr.port(), r, opts)
            .map_err(|e| match e {
                BindError::InUse => CmError::AddrInUse { call },
                BindError::NotAvailable => CmError::AddrNotAvailable { call },
            })?;
        let slot = self.slot(r);
        slot.local = SocketAddr::new(ip, port).into();
        slot.port_bound = true;
        Ok(())
    }

    pub(crate) fn bind_addr(&mut self, host: u16, id: IdHandle, addr: SocketAddr) -> R<()> {
        let r = self.id_ref(host, id, Call::BindAddr)?;
        let next = self.slot(r).m.bind_addr(binds_as_wildcard(addr.ip()))?;
        self.bind_port(host, r, addr, Call::BindAddr)?;
        self.slot(r).m = next;
        Ok(())
    }

    pub(crate) fn resolve_addr(
        &mut self,
        host: u16,
        id: IdHandle,
        src: Option<SocketAddr>,
        dst: SocketAddr,
        timeout: Duration,
    ) -> R<()> {
        let call = Call::ResolveAddr;
        let r = self.id_ref(host, id, call)?;
        let next = self.slot(r).m.resolve_addr()?;
        let v4 = dst.is_ipv4();
        let family_mismatch = src.is_some_and(|s| s.is_ipv4() != v4)
            || self.slot(r).local.get().is_some_and(|l| l.is_ipv4() != v4);
        if family_mismatch {
            return Err(CmError::InvalidArgument {
                call,
                reason: "source and destination address families differ",
            });
        }
        let own = self.hosts[host as usize]
            .addrs
            .iter()
            .copied()
            .find(|a| a.is_ipv4() == v4);
        // Loopback and wildcard destinations resolve to this host, as the kernel resolves them
        // to the first local device.
        let target = if dst.ip().is_unspecified() || dst.ip().is_loopback() {
            own.ok_or(CmError::AddrNotAvailable { call })?
        } else {
            dst.ip()
        };
        if self.slot(r).m.state() == cm_core::IdState::Idle {
            let src = match src {
                Some(s) => s,
                None => SocketAddr::new(own.ok_or(CmError::AddrNotAvailable { call })?, 0),
            };
            self.bind_port(host, r, src, call)?;
        }
        let reachable = self
            .host_of_ip(target)
            .is_some_and(|h| self.hosts[h as usize].reachable());
        let slot = self.slot(r);
        slot.peer = SocketAddr::new(target, dst.port()).into();
        slot.m = next;
        self.cancel_timers(r);
        let h = &mut self.hosts[host as usize];
        if h.fail_addr.1 > 0 {
            h.fail_addr.1 -= 1;
            let status = h.fail_addr.0;
            self.stats.addr_errors += 1;
            self.slot(r).pending_status = status;
            let lat = self.latency();
            self.timer(r, self.now.after_nanos(lat), TimerKind::AddrError);
        } else if !h.device {
            self.slot(r).pending_status = -errno::ENODEV;
            let lat = self.latency();
            self.timer(r, self.now.after_nanos(lat), TimerKind::AddrError);
        } else if reachable {
            let lat = self.latency();
            self.timer(r, self.now.after_nanos(lat), TimerKind::AddrResolved);
        } else {
            // Neighbour resolution gets no answer until the caller's timeout.
            self.slot(r).pending_status = -errno::ETIMEDOUT;
            self.timer(r, self.now + timeout, TimerKind::AddrError);
        }
        Ok(())
    }

    pub(crate) fn resolve_route(&mut self, host: u16, id: IdHandle, _timeout: Duration) -> R<()> {
        // RoCE (what rxe is) resolves routes from a work item without a path query, so the
        // timeout, which bounds only the IB SA query, never applies.
        let r = self.id_ref(host, id, Call::ResolveRoute)?;
        let next = self.slot(r).m.resolve_route()?;
        self.slot(r).m = next;
        self.on_route_resolution(r);
        let lat = self.latency();
        let h = &mut self.hosts[host as usize];
        if h.fail_route.1 > 0 {
            h.fail_route.1 -= 1;
            let status = h.fail_route.0;
            self.stats.route_errors += 1;
            self.slot(r).pending_status = status;
            self.timer(r, self.now.after_nanos(lat), TimerKind::RouteError);
        } else {
            self.timer(r, self.now.after_nanos(lat), TimerKind::RouteResolved);
        }
        Ok(())
    }

    pub(crate) fn create_qp(&mut self, host: u16, id: IdHandle, caps: QpCaps) -> R<QpCaps> {
        self.create_qp_with(host, id, caps, None)
    }

    pub(crate) fn create_qp_on_srq(
        &mut self,
        host: u16,
        id: IdHandle,
        caps: QpCaps,
        srq: cm_core::SrqHandle,
    ) -> R<QpCaps> {
        self.create_qp_with(host, id, caps, Some(srq))
    }

    /// `rdma_create_qp`, with `attr.srq` when `srq` names one. Always inlined: `create_qp`
    /// (every connection's) then folds the SRQ's branches away, as if there were no SRQs;
    /// out of line it would make every lifecycle slower.
    #[inline(always)]
    fn create_qp_with(
        &mut self,
        host: u16,
        id: IdHandle,
        caps: QpCaps,
        srq: Option<cm_core::SrqHandle>,
    ) -> R<QpCaps> {
        let call = Call::CreateQp;
        let r = self.id_ref(host, id, call)?;
        let m = self.slot(r).m;
        let next = if srq.is_some() {
            m.create_qp_on_srq()?
        } else {
            m.create_qp()?
        };
        if let Some(srq) = srq {
            self.srq_ref(host, srq, call)?;
            if !m.port_space().is_connected() {
                // As the hardware backend: a UD receive puts a 40-byte GRH ahead of the
                // payload, which buffers shared with RC QPs have no room for.
                return Err(CmError::InvalidArgument {
                    call,
                    reason: "a shared receive queue serves connected (RC) QPs only here",
                });
            }
        }
        let slot = self.slot(r);
        if slot.m.port_space().is_connected() && slot.cm.ended_early() {
            // The peer ended the exchange before the application saw it (e.g. a child whose
            // requester went away): the kernel has no QP attributes to give.
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let max_wr = self.cfg.max_qp_wr;
        caps.check(max_wr, self.cfg.max_message_size)?;
        if caps.max_send_sge > self.cfg.max_sge || caps.max_recv_sge > self.cfg.max_sge {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_send_sge / max_recv_sge above the device's max_sge",
            });
        }
        if caps.max_inline_data > self.cfg.max_inline_data {
            return Err(CmError::InvalidArgument {
                call,
                reason: "max_inline_data above the device maximum",
            });
        }
        let srq = match srq {
            Some(srq) => Some(self.srq_for_qp(host, srq)?),
            None => None,
        };
        let qpn = self.next_qpn;
        self.next_qpn = (self.next_qpn + 1) & 0x00FF_FFFF;
        let slot = self.slot(r);
        slot.qp = Some(match srq {
            Some(s) => Qp::on_srq(qpn, caps, s),
            None => Qp::new(qpn, caps),
        });
        slot.m = next;
        if let Some(s) = srq {
            self.join_srq(host, s, r);
        }
        if !next.port_space().is_connected() {
            self.register_ud_qp(qpn, r);
        }
        self.hosts[host as usize].counts.qps += 1;
        // A QP on an SRQ has no receive queue of its own.
        Ok(match srq {
            Some(_) => QpCaps {
                max_recv_wr: 0,
                ..caps
            },
            None => caps,
        })
    }

    pub(crate) fn destroy_qp(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::DestroyQp)?;
        let next = self.slot(r).m.destroy_qp()?;
        if let Some(qpn) = self.slot(r).qp.as_ref().map(|q| q.qpn) {
            let groups = self.groups_attached(r, qpn);
            if groups > 0 {
                return Err(CmError::QpInGroups { groups });
            }
        }
        let slot = self.slot(r);
        let qp = slot.qp.take();
        slot.m = next;
        if let Some(srq) = qp.as_ref().and_then(Qp::srq) {
            let unpolled = qp.as_ref().map_or_else(Vec::new, Qp::srq_slots_unpolled);
            self.leave_srq(host, srq, r, &unpolled);
        }
        self.hosts[host as usize].counts.qps -= 1;
        Ok(())
    }

    pub(crate) fn listen(&mut self, host: u16, id: IdHandle, backlog: i32) -> R<()> {
        let r = self.id_ref(host, id, Call::Listen)?;
        let next = self.slot(r).m.listen()?;
        if !self.slot(r).port_bound {
            self.bind_port(host, r, SocketAddr::from(([0, 0, 0, 0], 0)), Call::Listen)?;
        }
        let max = self.cfg.max_backlog;
        let backlog = if backlog <= 0 || backlog as u32 > max {
            max
        } else {
            backlog as u32
        };
        let slot = self.slot(r);
        let (ps, port) = (slot.m.port_space(), slot.local.get().expect("bound").port());
        self.ports
            .claim_for_listen(host, ps, port, r)
            .map_err(|e| match e {
                BindError::InUse => CmError::AddrInUse { call: Call::Listen },
                BindError::NotAvailable => CmError::AddrNotAvailable { call: Call::Listen },
            })?;
        self.on_listen(r);
        let slot = self.slot(r);
        slot.listener = Some(Box::new(Listener {
            backlog,
            pending: Fifo::new(),
        }));
        slot.m = next;
        self.ports.set_listening(host, ps, port, r, true);
        Ok(())
    }

    pub(super) fn check_resources(&self, call: Call, param: &ConnParam) -> R<(u8, u8)> {
        let max = self.cfg.max_rd_atomic;
        let resolve = |v: u8| {
            if v == 0xFF {
                Ok(max)
            } else if v > max {
                Err(())
            } else {
                Ok(v)
            }
        };
        match (resolve(param.responder_resources), resolve(param.initiator_depth)) {
            (Ok(rr), Ok(id)) => Ok((rr, id)),
            _ => Err(CmError::InvalidArgument {
                call,
                reason: "responder_resources / initiator_depth above the device maximum",
            }),
        }
    }

    pub(crate) fn connect(&mut self, host: u16, id: IdHandle, param: &ConnParam) -> R<()> {
        let call = Call::Connect;
        let r = self.id_ref(host, id, call)?;
        let m = self.slot(r).m;
        let external = m.uses_external_qp(param);
        let next = if external {
            m.connect_external(param.private_data.len())?
        } else {
            m.connect(param.private_data.len())?
        };
        let (rr, depth) = self.check_resources(call, param)?;
        if external {
            self.set_external(r, param, (rr, depth));
        }
        let slot = self.slot(r);
        let ps = slot.m.port_space();
        let dst = slot.peer.get().expect("a resolved id has a destination");
        let qp_num = slot.qp.as_ref().map_or(param.qp_num & 0x00FF_FFFF, |q| q.qpn);
        // The receiver sees the request from its own point of view: our initiator depth is
        // its responder resources and the other way round.
        let wire = WireParam {
            responder_resources: depth,
            initiator_depth: rr,
            flow_control: param.flow_control,
            retry_count: param.retry_count.min(7),
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            qp_num,
        };
        let private_data = WirePrivateData::new(
            param.private_data.as_slice(),
            ps.private_data_limit(PrivateDataSlot::Connect),
        );
        slot.m = next;
        slot.remote = SlotRef::NONE;
        slot.remote_host = u16::MAX;
        // The RNR retries are the REP's, once it comes.
        slot.retries = Retries::new(wire.retry_count, 7);
        let payload = self.new_payload(Payload {
            wire,
            private_data,
            dst: dst.into(),
        });
        self.transition(r, Input::Connect, SlotRef::NONE, u16::MAX, payload);
        Ok(())
    }

    pub(crate) fn accept(&mut self, host: u16, id: IdHandle, param: &ConnParam) -> R<()> {
        let call = Call::Accept;
        let r = self.id_ref(host, id, call)?;
        let m = self.slot(r).m;
        let external = m.uses_external_qp(param);
        let next = if external {
            m.accept_external(param.private_data.len())?
        } else {
            m.accept(param.private_data.len())?
        };
        let (rr, depth) = self.check_resources(call, param)?;
        let params = Params {
            connected: m.port_space().is_connected(),
            retries: self.cm_retries,
        };
        // Only whether the exchange takes it: the transition is carried out below.
        if !self.slot(r).cm.takes(Input::Accept, params) {
            // The request is gone (the active side gave up or was destroyed): the kernel
            // refuses, and librdmacm moves the QP to ERR after its RTR/RTS transitions.
            let failed = self.slot(r).m.qp_error();
            self.set_machine(r, failed);
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        let slot = self.slot(r);
        let ps = slot.m.port_space();
        let qp_num = match slot.qp.as_mut() {
            Some(qp) => {
                // librdmacm moves the QP to RTR and RTS with the accept's resources.
                qp.initiator_depth = depth;
                qp.responder_resources = rr;
                qp.qpn
            }
            None => param.qp_num & 0x00FF_FFFF,
        };
        let wire = WireParam {
            responder_resources: depth,
            initiator_depth: rr,
            flow_control: param.flow_control,
            retry_count: 0,
            rnr_retry_count: param.rnr_retry_count.min(7),
            srq: false,
            qp_num,
        };
        let private_data = WirePrivateData::new(
            param.private_data.as_slice(),
            ps.private_data_limit(PrivateDataSlot::Accept),
        );
        self.set_machine(r, next);
        if external {
            self.set_external(r, param, (rr, depth));
        }
        let payload = self.new_payload(Payload {
            wire,
            private_data,
            dst: Addr::None,
        });
        self.transition(r, Input::Accept, SlotRef::NONE, u16::MAX, payload);
        Ok(())
    }

    pub(crate) fn reject(&mut self, host: u16, id: IdHandle, private_data: &[u8]) -> R<()> {
        let call = Call::Reject;
        let r = self.id_ref(host, id, call)?;
        let retries = self.cm_retries;
        let slot = self.slot(r);
        let next = slot.m.reject(private_data.len())?;
        let connected = slot.m.port_space().is_connected();
        let params = Params { connected, retries };
        // Only whether the exchange takes it: the transition is carried out below.
        if !slot.cm.takes(Input::Reject, params) {
            return Err(CmError::Os {
                call,
                errno: errno::EINVAL,
            });
        }
        slot.m = next;
        // A SIDR REP that rejects carries no private data.
        let payload = if connected {
            self.rej_payload(private_data)
        } else {
            NO_PAYLOAD
        };
        self.transition(r, Input::Reject, SlotRef::NONE, u16::MAX, payload);
        Ok(())
    }

    pub(crate) fn disconnect(&mut self, host: u16, id: IdHandle) -> R<()> {
        let r = self.id_ref(host, id, Call::Disconnect)?;
        let next = self.slot(r).m.disconnect()?;
        self.set_machine(r, next);
        self.transition(r, Input::Disconnect, SlotRef::NONE, u16::MAX, NO_PAYLOAD);
        Ok(())
    }

    pub(crate) fn get_cm_event(
        &mut self,
        host: u16,
        ch: ChannelHandle,
        timeout: Duration,
    ) -> R<Option<CmEvent>> {
        let r = self.channel_ref(host, ch, Call::GetCmEvent)?;
        let deadline = self.deadline(timeout);
        loop {
            if let Some(t) = self.pop_event(r, true) {
                return self.event_of(t);
            }
            // `pop_event` found the queue empty (it drops the events of destroyed ids).
            let has_event = |f: &Fabric| f.channels.get(r).is_some_and(|c| !c.queue.is_empty());
            if !self.run_until_next(deadline, has_event) {
                return Ok(None);
            }
        }
    }

    /// `get_cm_event` without waiting, `read`, and the ack, in one: the event never enters the
    /// table of outstanding events (nobody can hold it past `read`), and is built once, where
    /// `read` looks at it, instead of being copied out to the caller and back into the ack.
    pub(crate) fn take_cm_event<T>(
        &mut self,
        host: u16,
        ch: ChannelHandle,
        read: impl FnOnce(&CmEvent) -> T,
    ) -> R<Option<T>> {
        let r = self.channel_ref(host, ch, Call::GetCmEvent)?;
        let deadline = self.deadline(Duration::ZERO);
        loop {
            if let Some(t) = self.pop_event(r, false) {
                let (counted, kept) = (t.counted, t.kept);
                let built = self.event_of(t);
                let Ok(Some(event)) = &built else {
                    unreachable!("event_of always builds an event");
                };
                let out = read(event);
                match built {
                    Ok(Some(event)) if kept => self.ack_cm_event(host, event)?,
                    _ => self.ack_counted(host, counted)?,
                }
                return Ok(Some(out));
            }
            // `pop_event` found the queue empty (it drops the events of destroyed ids).
            let has_event = |f: &Fabric| f.channels.get(r).is_some_and(|c| !c.queue.is_empty());
            if !self.run_until_next(deadline, has_event) {
                return Ok(None);
            }
        }
    }

    /// The event `t` stands for, with its parameters, as `get_cm_event` returns it (always
    /// `Ok(Some(_))`). Built in what is returned, one return per kind of parameters: an event is
    /// over 300 bytes and every copy of it shows in profiles (built in a `CmEvent` and then
    /// wrapped, it would be copied once more). The payload is read where it lies and then let go:
    /// its sender may still keep it to send again.
    #[inline(always)]
    fn event_of(&mut self, t: Taken) -> R<Option<CmEvent>> {
        let Some(p) = self.payloads.get(t.payload) else {
            return Ok(Some(cm_core::backend::cm_event(
                t.id,
                t.listen_id,
                t.event,
                t.status,
                no_param(),
                t.token,
            )));
        };
        if matches!(t.event, CmEventType::MulticastJoin | CmEventType::MulticastError) {
            if let Some(ev) = self.multicast_event(t.id, t.event, t.status, t.token, p) {
                self.drop_payload(t.payload);
                return Ok(Some(ev));
            }
        }
        if t.event == CmEventType::Established {
            if let Some(ud) = self.sidr_ud_param(t.id, p.wire.qp_num) {
                let ev =
                    cm_core::backend::cm_event(t.id, t.listen_id, t.event, t.status, p.conn_param(), t.token);
                self.drop_payload(t.payload);
                return Ok(Some(cm_core::backend::with_ud_param(ev, ud)));
            }
        }
        // What the event needs of the payload is read out before the payload is let go, so
        // that the event is built where it is returned.
        let wire = p.wire;
        if p.private_data.bytes.is_empty() {
            // The usual all-zero data: its one representation is built where the event is,
            // where the choice inside `conn_param` went through a temporary copied whole.
            let len = usize::from(p.private_data.len);
            self.drop_payload(t.payload);
            return Ok(Some(cm_core::backend::cm_event(
                t.id,
                t.listen_id,
                t.event,
                t.status,
                wire.conn_param_with(PrivateData::default().padded(len)),
                t.token,
            )));
        }
        let private_data = p.private_data.to_private_data();
        self.drop_payload(t.payload);
        Ok(Some(cm_core::backend::cm_event(
            t.id,
            t.listen_id,
            t.event,
            t.status,
            wire.conn_param_with(private_data),
            t.token,
        )))
    }

    pub(crate) fn ack_cm_event(&mut self, host: u16, event: CmEvent) -> R<()> {
        if event.counted_id().owner() != self.tag(host) {
            // Another host's, fabric's or backend's: refused, and handed back so that the id
            // it counts against can still be acked and destroyed where it lives.
            return Err(CmError::ForeignEvent(cm_core::backend::returned_event(event)));
        }
        self.host_up(host, Call::AckCmEvent)?;
        let r = token_ref(event.token(), self.hosts[host as usize].token_key);
        // Out of the table before the id's count goes down, in one lookup: with an entry
        // there, the count is at least one and `ack_counted` cannot refuse.
        let (id, ev) = (event.id(), event.event());
        let counted = self
            .outstanding
            .discard_if(r, |o| {
                (o.host == host && o.id == id && o.event == ev).then_some(o.counted)
            })
            .ok_or(CmError::EventNotOutstanding)?;
        self.ack_counted(host, counted)?;
        if matches!(
            event.event(),
            CmEventType::MulticastJoin | CmEventType::MulticastError
        ) {
            self.on_multicast_acked(event.token());
        }
        Ok(())
    }

    /// The ack's step on the id that counts the event and on the host's count: all of an ack
    /// for an event `take_cm_event` handed out without a token, the rest of `ack_cm_event`'s.
    #[inline(always)]
    fn ack_counted(&mut self, host: u16, counted: SlotRef) -> R<()> {
        let slot = self.slot(counted);
        slot.m = slot.m.on_ack()?;
        self.hosts[host as usize].counts.unacked -= 1;
        Ok(())
    }

    pub(crate) fn get_local_addr(&mut self, host: u16, id: IdHandle) -> R<Option<SocketAddr>> {
        let r = self.id_ref(host, id, Call::GetLocalAddr)?;
        Ok(self.slot(r).local.get())
    }

    pub(crate) fn get_peer_addr(&mut self, host: u16, id: IdHandle) -> R<Option<SocketAddr>> {
        let r = self.id_ref(host, id, Call::GetPeerAddr)?;
        Ok(self.slot(r).peer.get())
    }

    pub(super) fn qp_for(&mut self, host: u16, id: IdHandle, call: Call) -> R<SlotRef> {
        let r = self.id_ref(host, id, call)?;
        if self.slot(r).qp.is_none() {
            return Err(CmError::NoQp { call });
        }
        Ok(r)
    }

    pub(crate) fn post_send(&mut self, host: u16, id: IdHandle, wr_id: u64, data: &[u8]) -> R<()> {
        let r = self.qp_for(host, id, Call::PostSend)?;
        self.post_send_on(r, wr_id, data)
    }

    /// `post_send` on the QP in slot `r` (an id's or a carrier's).
    #[inline(always)]
    pub(super) fn post_send_on(&mut self, r: SlotRef, wr_id: u64, data: &[u8]) -> R<()> {
        if self.post(r, WcOpcode::Send, wr_id, data, data.len())? {
            self.deliver_sends(r);
        }
        Ok(())
    }

    pub(crate) fn post_recv(&mut self, host: u16, id: IdHandle, wr_id: u64, len: u32) -> R<()> {
        let r = self.qp_for(host, id, Call::PostRecv)?;
        self.post_recv_on(r, wr_id, len)
    }

    /// `post_recv` on the QP in slot `r` (an id's or a carrier's).
    #[inline(always)]
    pub(super) fn post_recv_on(&mut self, r: SlotRef, wr_id: u64, len: u32) -> R<()> {
        if self.post(r, WcOpcode::Recv, wr_id, &[], len as usize)? {
            let remote = self.slot(r).remote;
            self.deliver_sends(remote);
        }
        Ok(())
    }

    /// A work request on `r`'s QP through the post gate: queued (true: the caller lets sends
    /// land), refused (the error), or completed flushed at once (false). `len` is the send's
    /// length or the receive buffer's. A simulated device fails a QP only through the machine,
    /// so there is no failure the machine does not know yet.
    fn post(&mut self, r: SlotRef, opcode: WcOpcode, wr_id: u64, data: &[u8], len: usize) -> R<bool> {
        let slot = self.slot(r);
        let qp = slot.qp.as_mut().expect("checked");
        let outstanding = qp.outstanding(opcode);
        match post_gate(&mut slot.m, &qp.caps, opcode, len, outstanding, || Ok(false))? {
            Admission::Post => {
                if opcode.is_recv() {
                    qp.push_recv(wr_id, len as u32);
                } else {
                    qp.push_send(wr_id, data);
                }
                Ok(true)
            }
            Admission::Flush => {
                qp.push_flushed(wr_id, opcode);
                Ok(false)
            }
        }
    }

    pub(crate) fn poll_cq(
        &mut self,
        host: u16,
        id: IdHandle,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> R<usize> {
        let r = self.qp_for(host, id, Call::PollCq)?;
        self.poll_cq_on(host, r, out, max, timeout)
    }

    /// `poll_cq` on the QP in slot `r` (an id's or a carrier's) of `host`.
    #[inline(always)]
    pub(super) fn poll_cq_on(
        &mut self,
        host: u16,
        r: SlotRef,
        out: &mut Vec<WorkCompletion>,
        max: usize,
        timeout: Duration,
    ) -> R<usize> {
        let deadline = self.deadline(timeout);
        let ready = |f: &Fabric| {
            f.ids
                .get(r)
                .and_then(|s| s.qp.as_ref())
                .is_none_or(|q| !q.cq_is_empty())
        };
        self.run_until(deadline, ready);
        let Some(qp) = self.ids.get_mut(r).and_then(|s| s.qp.as_mut()) else {
            return Ok(0);
        };
        // Receives a QP took from its SRQ give their slots back to the SRQ.
        let srq = qp
            .srq()
            .and_then(|s| self.srqs.as_mut()?.get_mut(host, s))
            .map(|s| &mut s.pool);
        Ok(qp.poll(out, max, srq))
    }

    pub(crate) fn id_machine(&self, host: u16, id: IdHandle) -> R<IdMachine> {
        let r = SlotRef {
            index: id.index(),
            generation: id.generation(),
        };
        self.id_ref(host, id, Call::GetLocalAddr)?;
        Ok(self.ids.get(r).expect("checked").m)
    }

    pub(crate) fn live_resources(&self, host: Option<u16>) -> LiveResources {
        let mut total = LiveResources::default();
        for (i, h) in self.hosts.iter().enumerate() {
            if host.is_none_or(|only| only as usize == i) {
                total.channels += h.counts.channels;
                total.ids += h.counts.ids;
                total.qps += h.counts.qps;
                total.unacked_events += h.counts.unacked;
                total.queued_events += h.counts.queued;
                total.mrs += h.counts.mrs;
                total.srqs += h.counts.srqs;
            }
        }
        total
    }
}

/// Whether a bind to `ip` is a wildcard bind: the unspecified address, and a loopback one,
/// which Linux 6.1's cma takes as "any" too (`cma_any_addr`): such an id gets no device and
/// its port is the host's on every address, whatever address it keeps as its own.
fn binds_as_wildcard(ip: std::net::IpAddr) -> bool {
    ip.is_unspecified() || ip.is_loopback()
}
