//! Running the one-sided calls and checking their answers: which errors each call may give,
//! stale and foreign handles refused, a live region's description unchanged, addresses never
//! reused, completions that fit their opcode, asynchronous events about the host's own SRQs.

use std::hash::Hash;
use std::time::Duration;

use cm_core::{
    Access, AsyncEvent, Call, CmBackend, CmError, HandleKind, MrHandle, MrInfo, RemoteAddr, SendOp, SendWr,
    Sge, SrqHandle, WcOpcode, WcStatus, WorkCompletion,
};

use super::{fail, op_call, Check, Checked, World};
use crate::gen::{HandleRef, HostSel, KeySel, OffSel, Op, RegionSel, RemoteSel, WrOp, WrSel};

/// A region the run registered, as the fuzzer knows it.
#[derive(Clone, Copy, Debug)]
pub(super) struct RegionRec {
    pub(super) host: HostSel,
    /// The host's incarnation when it was registered: a crash takes the region.
    pub(super) incarnation: u32,
    pub(super) info: MrInfo,
    /// Not deregistered by the application.
    pub(super) live: bool,
}

/// An SRQ the run made.
#[derive(Clone, Copy, Debug)]
pub(super) struct SrqRec {
    pub(super) host: HostSel,
    pub(super) incarnation: u32,
    /// Not destroyed by the application.
    pub(super) live: bool,
}

/// What the run knows of a handle argument of `h`: one it must refuse, one it must accept
/// (a live region or SRQ of `h`'s current incarnation), or neither (forged, unknown).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Standing {
    /// Deregistered or destroyed by the application, or another host's.
    Refused(&'static str),
    /// Live on this host.
    Live,
    /// Forged, or gone with a crash: either answer fits.
    Unknown,
}

/// The handle kinds a one-sided call takes: what its `UnknownHandle` may name.
fn handle_kinds(op: &Op) -> &'static [HandleKind] {
    match op {
        Op::RegMr { .. } | Op::CreateSrq { .. } => &[HandleKind::Id],
        Op::MrInfo { .. } | Op::DeregMr { .. } | Op::ReadMr { .. } | Op::WriteMr { .. } => &[HandleKind::Mr],
        Op::PostSendWr { .. } => &[HandleKind::Id, HandleKind::Mr],
        Op::DestroySrq { .. } | Op::PostSrqRecv { .. } | Op::ArmSrqLimit { .. } => &[HandleKind::Srq],
        Op::CreateQpOnSrq { .. } => &[HandleKind::Id, HandleKind::Srq],
        _ => &[],
    }
}

/// The call a one-sided operation's errors name (`mr_info` names `ibv_reg_mr`: it reads the
/// `struct ibv_mr` registration filled in).
pub(super) fn onesided_call(op: &Op) -> Option<Call> {
    Some(match op {
        Op::RegMr { .. } | Op::MrInfo { .. } => Call::RegMr,
        Op::DeregMr { .. } => Call::DeregMr,
        Op::ReadMr { .. } => Call::ReadMr,
        Op::WriteMr { .. } => Call::WriteMr,
        Op::PostSendWr { .. } => Call::PostSend,
        Op::CreateSrq { .. } => Call::CreateSrq,
        Op::DestroySrq { .. } => Call::DestroySrq,
        Op::PostSrqRecv { .. } => Call::PostSrqRecv,
        Op::ArmSrqLimit { .. } => Call::ModifySrq,
        Op::CreateQpOnSrq { .. } => Call::CreateQp,
        Op::GetAsyncEvent { .. } => Call::GetAsyncEvent,
        _ => return None,
    })
}

/// Whether `e` is an answer the one-sided call `op` can give; `None` for other calls.
pub(super) fn onesided_error_fits(op: &Op, e: &CmError) -> Option<bool> {
    let call = onesided_call(op)?;
    let named = super::error_call(e);
    if named.is_some_and(|n| n != call) {
        return Some(false);
    }
    let fits = match e {
        CmError::HostCrashed { call: c, .. } => *c == call,
        CmError::UnknownHandle { kind, .. } => handle_kinds(op).contains(kind),
        CmError::WrongState { .. } | CmError::NoDevice { .. } => matches!(
            op,
            Op::RegMr { .. } | Op::CreateSrq { .. } | Op::CreateQpOnSrq { .. }
        ),
        CmError::InvalidArgument { .. } => !matches!(
            op,
            Op::MrInfo { .. } | Op::DeregMr { .. } | Op::DestroySrq { .. } | Op::GetAsyncEvent { .. }
        ),
        CmError::QueueFull { .. } => matches!(op, Op::PostSendWr { .. } | Op::PostSrqRecv { .. }),
        CmError::NoQp { .. } | CmError::WrongQpState { .. } => matches!(op, Op::PostSendWr { .. }),
        CmError::SrqBusy { qps } => matches!(op, Op::DestroySrq { .. }) && *qps > 0,
        // A region the host has no room for (a key has 24 bits of index).
        CmError::Os { errno, .. } if matches!(op, Op::RegMr { .. }) => *errno == cm_core::errno::ENOMEM,
        // create_qp_on_srq is create_qp with an SRQ: its errors are create_qp's.
        _ if matches!(op, Op::CreateQpOnSrq { .. }) => super::error_fits_call(e, Call::CreateQp),
        _ => false,
    };
    Some(fits)
}

/// The statuses a completion of `opcode` may have on the simulator: what rxe gives for the
/// errors the model has (a flush, the responder's NAKs, the retries spent, a local entry gone
/// by the time the request ran, a receive too short).
fn status_fits(opcode: WcOpcode, status: WcStatus) -> bool {
    use WcStatus::*;
    match opcode {
        WcOpcode::Send => matches!(
            status,
            Success | LocQpOpErr | LocProtErr | WrFlushErr | RemInvReqErr | RetryExcErr | RnrRetryExcErr
        ),
        WcOpcode::RdmaWrite => matches!(
            status,
            Success
                | LocQpOpErr
                | LocProtErr
                | WrFlushErr
                | RemInvReqErr
                | RemAccessErr
                | RetryExcErr
                | RnrRetryExcErr
        ),
        WcOpcode::RdmaRead | WcOpcode::CompSwap | WcOpcode::FetchAdd => matches!(
            status,
            Success | LocProtErr | WrFlushErr | RemInvReqErr | RemAccessErr | RetryExcErr
        ),
        WcOpcode::Recv => matches!(status, Success | LocLenErr | WrFlushErr | RemAccessErr),
        // A receive a WRITE with immediate failed in completes as a `Recv`.
        WcOpcode::RecvRdmaWithImm => status == Success,
    }
}

/// What is wrong with a completion, if anything: its status for its opcode, its byte count,
/// its immediate, its bytes.
pub(super) fn completion_misfit(wc: &WorkCompletion) -> Option<String> {
    if !status_fits(wc.opcode, wc.status) {
        return Some(format!("{} completed with {:?}", wc.opcode, wc.status));
    }
    if wc.imm_data.is_some() && !wc.opcode.is_recv() {
        return Some(format!("{} carries an immediate", wc.opcode));
    }
    if wc.status != WcStatus::Success {
        if wc.byte_len != 0 || !wc.data.is_empty() {
            return Some(format!(
                "a failed {} reports {} bytes ({} of data)",
                wc.opcode,
                wc.byte_len,
                wc.data.len()
            ));
        }
        return None;
    }
    let fits = match wc.opcode {
        WcOpcode::Send
        | WcOpcode::RdmaWrite
        | WcOpcode::RdmaRead
        | WcOpcode::CompSwap
        | WcOpcode::FetchAdd
            if !wc.data.is_empty() =>
        {
            false
        }
        WcOpcode::Send | WcOpcode::RdmaWrite => wc.byte_len == 0,
        WcOpcode::CompSwap | WcOpcode::FetchAdd => wc.byte_len == 8,
        WcOpcode::RdmaRead => true,
        WcOpcode::Recv => wc.byte_len as usize == wc.data.len(),
        WcOpcode::RecvRdmaWithImm => wc.data.is_empty() && wc.imm_data.is_some(),
    };
    (!fits).then(|| {
        format!(
            "a successful {} reports {} bytes, {} of data, immediate {:?}",
            wc.opcode,
            wc.byte_len,
            wc.data.len(),
            wc.imm_data
        )
    })
}

/// The resolved offset `at` names in a region of `len` bytes.
fn offset(at: OffSel, len: u64) -> u64 {
    match at {
        OffSel::Start(n) => n,
        OffSel::End(n) => len.saturating_sub(n),
        OffSel::Past(n) => len.saturating_add(n),
        OffSel::Abs(v) => v,
    }
}

impl World<'_> {
    fn index(h: HostSel) -> (usize, usize) {
        (h.fabric as usize, h.host as usize)
    }

    pub(super) fn mr(&self, h: HostSel, r: HandleRef) -> MrHandle {
        let (f, hh) = Self::index(h);
        Self::pick(
            &self.mrs[f][hh],
            &self.all_mrs,
            r,
            cm_core::backend::mr_handle,
            |o| self.owner_tag(o),
        )
    }

    pub(super) fn srq(&self, h: HostSel, r: HandleRef) -> SrqHandle {
        let (f, hh) = Self::index(h);
        Self::pick(
            &self.srqs[f][hh],
            &self.all_srqs,
            r,
            cm_core::backend::srq_handle,
            |o| self.owner_tag(o),
        )
    }

    fn incarnation(&self, h: HostSel) -> u32 {
        self.fabrics[h.fabric as usize].host_incarnation(h.host as usize)
    }

    fn mr_standing(&self, h: HostSel, mr: MrHandle) -> Standing {
        match self.regions.get(&mr) {
            Some(r) if r.host != h => Standing::Refused("another host's region"),
            Some(r) if !r.live => Standing::Refused("a deregistered region"),
            Some(r) if r.incarnation == self.incarnation(h) => Standing::Live,
            _ => Standing::Unknown,
        }
    }

    fn srq_standing(&self, h: HostSel, srq: SrqHandle) -> Standing {
        match self.srq_recs.get(&srq) {
            Some(s) if s.host != h => Standing::Refused("another host's SRQ"),
            Some(s) if !s.live => Standing::Refused("a destroyed SRQ"),
            Some(s) if s.incarnation == self.incarnation(h) => Standing::Live,
            _ => Standing::Unknown,
        }
    }

    /// Fails when a call that names a handle the run knows must be refused succeeded.
    fn refused_handle(i: usize, op: &Op, standing: Standing, ok: bool) -> Checked {
        match standing {
            Standing::Refused(what) if ok => fail(
                Check::WrongHandleAccepted,
                format!("{} accepted {what}", op_call(op).map_or("?", Call::name)),
                format!("{op} succeeded with {what}'s handle"),
                Some(i),
            ),
            _ => Ok(()),
        }
    }

    /// The `n`-th most recent region of `host` (`stale`: among those deregistered).
    fn region_of(&self, host: HostSel, n: u16, stale: bool) -> Option<RegionRec> {
        let list = self.mrs.get(host.fabric as usize)?;
        let list = list.get(host.host as usize % list.len().max(1))?;
        let recs: Vec<RegionRec> = list
            .iter()
            .filter_map(|mr| self.regions.get(mr).copied())
            .filter(|r| !stale || !r.live)
            .collect();
        recs.get(recs.len().checked_sub(1 + n as usize % recs.len().max(1))?)
            .copied()
    }

    fn remote(&self, r: &RemoteSel) -> RemoteAddr {
        let region = match r.region {
            RegionSel::Recent { host, n } => self.region_of(host, n, false),
            RegionSel::Stale { host, n } => self.region_of(host, n, true),
            RegionSel::Nowhere => None,
        };
        let (base, len, own_key) = region.map_or((0, 0, 0), |r| (r.info.addr, r.info.len, r.info.rkey));
        let addr = match r.at {
            OffSel::Abs(v) => v,
            at => base.wrapping_add(offset(at, len)),
        };
        let rkey = match r.key {
            KeySel::Own => own_key,
            KeySel::Of { host, n } => self.region_of(host, n, false).map_or(0, |r| r.info.rkey),
            KeySel::Forged(k) => k,
        };
        RemoteAddr { addr, rkey }
    }

    /// The length of the region `mr` names, as far as the run knows (0 when it does not).
    fn region_len(&self, mr: MrHandle) -> u64 {
        self.regions.get(&mr).map_or(0, |r| r.info.len)
    }

    fn send_op(&self, wr: &WrSel) -> SendOp {
        let remote = self.remote(&wr.remote);
        match wr.op {
            WrOp::Send => SendOp::Send { imm: None },
            WrOp::SendImm => SendOp::Send {
                imm: Some(wr.a as u32),
            },
            WrOp::Write => SendOp::Write { remote, imm: None },
            WrOp::WriteImm => SendOp::Write {
                remote,
                imm: Some(wr.a as u32),
            },
            WrOp::Read => SendOp::Read { remote },
            WrOp::CompareSwap => SendOp::CompareSwap {
                remote,
                compare: wr.a,
                swap: wr.b,
            },
            WrOp::FetchAdd => SendOp::FetchAdd { remote, add: wr.a },
        }
    }

    /// Records a region just registered on `h` with `len` bytes and `access`, and checks what
    /// `mr_info` says of it: its length and access, a page-aligned address no earlier region of
    /// the host had, keys in rxe's layout (a remote key only with remote access).
    fn registered(
        &mut self,
        i: usize,
        op: &Op,
        h: HostSel,
        mr: MrHandle,
        len: usize,
        access: Access,
    ) -> Checked {
        if self.regions.contains_key(&mr) {
            return fail(
                Check::WrongHandleAccepted,
                "reg_mr reissued a handle",
                format!("{op} gave {mr:?}, a handle already given out"),
                Some(i),
            );
        }
        self.learn_tag(h, mr.owner());
        let info = match self.host(h).mr_info(mr) {
            Ok(info) => info,
            Err(e) => {
                return fail(
                    Check::Region,
                    "mr_info of a region just registered failed",
                    format!("{op} gave {mr:?}, and mr_info of it answered {e:?}"),
                    Some(i),
                )
            }
        };
        info.hash(&mut self.digest);
        let remote_access = access.bits() & !Access::LOCAL_WRITE.bits() != 0;
        let mut wrong = Vec::new();
        if info.len != len as u64 {
            wrong.push("its length");
        }
        if info.access != access {
            wrong.push("its access");
        }
        if info.addr % 4096 != 0 {
            wrong.push("an address not page-aligned");
        }
        if info.lkey == 0 || (remote_access && info.rkey != info.lkey) || (!remote_access && info.rkey != 0) {
            wrong.push("its keys");
        }
        let (start, end) = (info.addr, info.addr.saturating_add(info.len));
        let (f, hh) = Self::index(h);
        if self.mrs[f][hh].iter().any(|m| {
            let o = &self.regions[m].info;
            start < o.addr.saturating_add(o.len) && o.addr < end
        }) {
            wrong.push("an address an earlier region of the host had");
        }
        if !wrong.is_empty() {
            return fail(
                Check::Region,
                format!("reg_mr: {}", wrong.join(", ")),
                format!(
                    "{op} registered {len} bytes with {access}; mr_info says {info:?}: {}",
                    wrong.join(", ")
                ),
                Some(i),
            );
        }
        self.mrs[f][hh].push(mr);
        self.all_mrs.push(mr);
        let incarnation = self.incarnation(h);
        self.regions.insert(
            mr,
            RegionRec {
                host: h,
                incarnation,
                info,
                live: true,
            },
        );
        Ok(())
    }

    /// Runs a one-sided call.
    pub(super) fn step_onesided(&mut self, i: usize, op: &Op) -> Checked {
        match *op {
            Op::RegMr { h, id, len, access } => {
                let id = self.id(h, id);
                let r = self.host(h).reg_mr(id, len, access);
                self.note(i, op, || format!("{r:?}"));
                match r {
                    Ok(mr) => self.registered(i, op, h, mr, len, access),
                    Err(e) => self.check_err(i, op, &e),
                }
            }
            Op::MrInfo { h, mr } => {
                let mr = self.mr(h, mr);
                let standing = self.mr_standing(h, mr);
                let r = self.host(h).mr_info(mr);
                self.note(i, op, || format!("{r:?}"));
                if standing == Standing::Live {
                    let known = self.regions[&mr].info;
                    if r.as_ref() != Ok(&known) {
                        return fail(
                            Check::Region,
                            "mr_info of a live region changed",
                            format!("{op}: registered as {known:?}, now {r:?}"),
                            Some(i),
                        );
                    }
                }
                match r {
                    Ok(info) => {
                        info.hash(&mut self.digest);
                        Self::refused_handle(i, op, standing, true)
                    }
                    Err(e) => self.check_err(i, op, &e),
                }
            }
            Op::DeregMr { h, mr } => {
                let mr = self.mr(h, mr);
                let standing = self.mr_standing(h, mr);
                let r = self.host(h).dereg_mr(mr);
                if r.is_ok() {
                    if let Some(rec) = self.regions.get_mut(&mr) {
                        rec.live = false;
                    }
                }
                if let (Standing::Live, Err(e)) = (standing, &r) {
                    // rxe refuses only while memory windows are bound, which the model has none of.
                    return fail(
                        Check::Region,
                        "dereg_mr of a live region refused",
                        format!("{op}: {e:?}"),
                        Some(i),
                    );
                }
                Self::refused_handle(i, op, standing, r.is_ok()).and_then(|()| self.unit(i, op, r))
            }
            Op::ReadMr { h, mr, at, len } => {
                let mr = self.mr(h, mr);
                let standing = self.mr_standing(h, mr);
                let mut out = vec![0; len];
                let r = self
                    .host(h)
                    .read_mr(mr, offset(at, self.region_len(mr)), &mut out);
                if r.is_ok() {
                    out.hash(&mut self.digest);
                }
                let refused = r
                    .as_ref()
                    .is_err_and(|e| !matches!(e, CmError::InvalidArgument { .. }));
                self.live_refused(i, op, standing, refused)
                    .and_then(|()| Self::refused_handle(i, op, standing, r.is_ok()))
                    .and_then(|()| self.unit(i, op, r))
            }
            Op::WriteMr { h, mr, at, len } => {
                let mr = self.mr(h, mr);
                let standing = self.mr_standing(h, mr);
                let data: Vec<u8> = (0..len).map(|n| (n as u8) ^ 0xA7).collect();
                let r = self.host(h).write_mr(mr, offset(at, self.region_len(mr)), &data);
                let refused = r
                    .as_ref()
                    .is_err_and(|e| !matches!(e, CmError::InvalidArgument { .. }));
                self.live_refused(i, op, standing, refused)
                    .and_then(|()| Self::refused_handle(i, op, standing, r.is_ok()))
                    .and_then(|()| self.unit(i, op, r))
            }
            Op::PostSendWr { h, id, ref wr } => {
                let id = self.id(h, id);
                let sges: Vec<Sge> = wr
                    .sges
                    .iter()
                    .map(|s| {
                        let mr = self.mr(h, s.mr);
                        Sge::new(mr, offset(s.at, self.region_len(mr)), s.len)
                    })
                    .collect();
                let standing = sges
                    .iter()
                    .map(|s| self.mr_standing(h, s.mr))
                    .find(|s| matches!(s, Standing::Refused(_)))
                    .unwrap_or(Standing::Unknown);
                let mut send = SendWr::new(wr.wr_id, self.send_op(wr), &sges);
                send.signaled = wr.signaled;
                send.fence = wr.fence;
                let r = self.host(h).post_send_wr(id, &send);
                let resolved = send.op.remote();
                Self::refused_handle(i, op, standing, r.is_ok())
                    .and_then(|()| self.unit_noting(i, op, r, || format!(" (remote {resolved:?})")))
            }
            Op::CreateSrq { h, id, caps } => {
                let id = self.id(h, id);
                let r = self.host(h).create_srq(id, caps);
                self.note(i, op, || format!("{r:?}"));
                match r {
                    Ok(srq) => self.srq_made(i, op, h, srq),
                    Err(e) => self.check_err(i, op, &e),
                }
            }
            Op::DestroySrq { h, srq } => {
                let srq = self.srq(h, srq);
                let standing = self.srq_standing(h, srq);
                let r = self.host(h).destroy_srq(srq);
                if r.is_ok() {
                    if let Some(rec) = self.srq_recs.get_mut(&srq) {
                        rec.live = false;
                    }
                }
                let refused = r.as_ref().is_err_and(|e| !matches!(e, CmError::SrqBusy { .. }));
                self.live_refused(i, op, standing, refused)
                    .and_then(|()| Self::refused_handle(i, op, standing, r.is_ok()))
                    .and_then(|()| self.unit(i, op, r))
            }
            Op::PostSrqRecv { h, srq, wr_id, len } => {
                let srq = self.srq(h, srq);
                let standing = self.srq_standing(h, srq);
                let r = self.host(h).post_srq_recv(srq, wr_id, len);
                Self::refused_handle(i, op, standing, r.is_ok()).and_then(|()| self.unit(i, op, r))
            }
            Op::ArmSrqLimit { h, srq, limit } => {
                let srq = self.srq(h, srq);
                let standing = self.srq_standing(h, srq);
                let r = self.host(h).arm_srq_limit(srq, limit);
                Self::refused_handle(i, op, standing, r.is_ok()).and_then(|()| self.unit(i, op, r))
            }
            Op::CreateQpOnSrq { h, id, caps, srq } => {
                let (id, srq) = (self.id(h, id), self.srq(h, srq));
                let standing = self.srq_standing(h, srq);
                let r = self.host(h).create_qp_on_srq(id, caps, srq).map(|_| ());
                Self::refused_handle(i, op, standing, r.is_ok()).and_then(|()| self.unit(i, op, r))
            }
            Op::GetAsyncEvent { h, timeout } => {
                let r = self.host(h).get_async_event(timeout);
                self.note(i, op, || format!("{r:?}"));
                match r {
                    Ok(Some(ev)) => self.async_event(i, op, h, ev),
                    Ok(None) => {
                        1u8.hash(&mut self.digest);
                        Ok(())
                    }
                    Err(e) => self.check_err(i, op, &e),
                }
            }
            _ => unreachable!("step runs the other calls"),
        }
    }

    /// Fails when a live region or SRQ of the host's current incarnation was refused for
    /// another reason than its arguments (a range outside the region, a busy SRQ).
    fn live_refused(&self, i: usize, op: &Op, standing: Standing, refused: bool) -> Checked {
        if standing == Standing::Live && refused {
            return fail(
                Check::Region,
                "a live handle refused",
                format!("{op} refused a region or SRQ the host holds"),
                Some(i),
            );
        }
        Ok(())
    }

    fn srq_made(&mut self, i: usize, op: &Op, h: HostSel, srq: SrqHandle) -> Checked {
        if self.srq_recs.contains_key(&srq) {
            return fail(
                Check::WrongHandleAccepted,
                "create_srq reissued a handle",
                format!("{op} gave {srq:?}, a handle already given out"),
                Some(i),
            );
        }
        self.learn_tag(h, srq.owner());
        let (f, hh) = Self::index(h);
        self.srqs[f][hh].push(srq);
        self.all_srqs.push(srq);
        let incarnation = self.incarnation(h);
        self.srq_recs.insert(
            srq,
            SrqRec {
                host: h,
                incarnation,
                live: true,
            },
        );
        0u8.hash(&mut self.digest);
        Ok(())
    }

    /// The simulator raises only an SRQ's limit (rxe raises no QP events), and only for an SRQ
    /// of the host that the application has not destroyed (the kernel drops a destroyed SRQ's
    /// events that were not read).
    fn async_event(&mut self, i: usize, op: &Op, h: HostSel, ev: AsyncEvent) -> Checked {
        self.stats.async_events += 1;
        // Not the handle itself: its owner tag is the process's count of backends, which the
        // second run of the seed does not share.
        ev.raw().hash(&mut self.digest);
        let AsyncEvent::SrqLimitReached { srq } = ev else {
            return fail(
                Check::AsyncEvent,
                format!("{} from the simulator", ev.name()),
                format!("{op} gave {ev}, an event the simulator does not make"),
                Some(i),
            );
        };
        (srq.index(), srq.generation()).hash(&mut self.digest);
        let why = match self.srq_recs.get(&srq) {
            None => Some("an SRQ never made"),
            Some(s) if s.host != h => Some("another host's SRQ"),
            Some(s) if !s.live => Some("a destroyed SRQ"),
            Some(_) => None,
        };
        match why {
            Some(why) => fail(
                Check::AsyncEvent,
                format!("SRQ_LIMIT_REACHED for {why}"),
                format!("{op} gave {ev}, for {why}"),
                Some(i),
            ),
            None => Ok(()),
        }
    }

    /// Teardown's part: every SRQ destroyed and every region deregistered (after the QPs, which
    /// keep an SRQ busy), then every asynchronous event still queued retrieved and checked
    /// (none may name an SRQ destroyed before it was read).
    pub(super) fn release_onesided(&mut self, f: usize, host: usize, keep_regions: bool) -> Checked {
        let h = HostSel {
            fabric: f as u8,
            host: host as u8,
        };
        let mut b = self.host(h);
        if keep_regions {
            return Ok(());
        }
        for srq in self.srqs[f][host].clone() {
            if b.destroy_srq(srq).is_ok() {
                if let Some(rec) = self.srq_recs.get_mut(&srq) {
                    rec.live = false;
                }
            }
        }
        for mr in self.mrs[f][host].clone() {
            if b.dereg_mr(mr).is_ok() {
                if let Some(rec) = self.regions.get_mut(&mr) {
                    rec.live = false;
                }
            }
        }
        let drain = Op::GetAsyncEvent {
            h,
            timeout: Duration::ZERO,
        };
        // Bounded: events come only from receives taken, and nothing is left to take them.
        for _ in 0..100_000 {
            let Ok(Some(ev)) = b.get_async_event(Duration::ZERO) else {
                break;
            };
            self.async_event(usize::MAX, &drain, h, ev).map_err(|mut fl| {
                fl.at = None;
                fl.detail = format!("teardown: {}", fl.detail);
                fl
            })?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gen::{HostSel, WrSel};

    fn wc(opcode: WcOpcode, status: WcStatus, byte_len: u32) -> WorkCompletion {
        WorkCompletion {
            wr_id: 1,
            status,
            opcode,
            byte_len,
            imm_data: None,
            data: Vec::new(),
            sender: None,
        }
    }

    #[test]
    fn completions_must_fit_their_opcode() {
        for fits in [
            wc(WcOpcode::RdmaRead, WcStatus::Success, 4096),
            wc(WcOpcode::FetchAdd, WcStatus::Success, 8),
            wc(WcOpcode::RdmaWrite, WcStatus::RemAccessErr, 0),
            wc(WcOpcode::Recv, WcStatus::RemAccessErr, 0),
            wc(WcOpcode::CompSwap, WcStatus::WrFlushErr, 0),
            WorkCompletion {
                imm_data: Some(7),
                ..wc(WcOpcode::RecvRdmaWithImm, WcStatus::Success, 64)
            },
            WorkCompletion {
                data: vec![1, 2],
                ..wc(WcOpcode::Recv, WcStatus::Success, 2)
            },
        ] {
            assert_eq!(completion_misfit(&fits), None, "{fits:?}");
        }
        for misfit in [
            wc(WcOpcode::RdmaRead, WcStatus::RnrRetryExcErr, 0),
            wc(WcOpcode::Send, WcStatus::RemAccessErr, 0),
            wc(WcOpcode::RecvRdmaWithImm, WcStatus::RemAccessErr, 0),
            wc(WcOpcode::RdmaWrite, WcStatus::RetryExcErr, 64),
            wc(WcOpcode::FetchAdd, WcStatus::Success, 4),
            wc(WcOpcode::Send, WcStatus::Success, 64),
            wc(WcOpcode::RecvRdmaWithImm, WcStatus::Success, 64),
            WorkCompletion {
                imm_data: Some(7),
                ..wc(WcOpcode::RdmaWrite, WcStatus::Success, 0)
            },
            WorkCompletion {
                data: vec![1, 2],
                ..wc(WcOpcode::Recv, WcStatus::Success, 3)
            },
        ] {
            assert!(completion_misfit(&misfit).is_some(), "{misfit:?}");
        }
    }

    #[test]
    fn each_one_sided_call_has_its_own_errors() {
        let h = HostSel { fabric: 0, host: 0 };
        let r = HandleRef::Own(0);
        let unknown = |call, kind| CmError::UnknownHandle { call, kind };
        let invalid = |call| CmError::InvalidArgument { call, reason: "r" };
        let wr = WrSel {
            wr_id: 1,
            op: WrOp::Read,
            remote: RemoteSel {
                region: RegionSel::Nowhere,
                at: OffSel::Start(0),
                key: KeySel::Own,
            },
            sges: Vec::new(),
            signaled: true,
            fence: false,
            a: 0,
            b: 0,
        };
        let post = Op::PostSendWr { h, id: r, wr };
        let destroy = Op::DestroySrq { h, srq: r };
        let arm = Op::ArmSrqLimit { h, srq: r, limit: 1 };
        let on_srq = Op::CreateQpOnSrq {
            h,
            id: r,
            caps: cm_core::QpCaps::new(),
            srq: r,
        };
        let info = Op::MrInfo { h, mr: r };
        let wait = Op::GetAsyncEvent {
            h,
            timeout: Duration::ZERO,
        };
        let fits = |op: &Op, e: CmError| onesided_error_fits(op, &e).expect("a one-sided call");
        assert!(fits(&destroy, CmError::SrqBusy { qps: 1 }));
        assert!(!fits(&destroy, CmError::SrqBusy { qps: 0 }));
        assert!(!fits(&arm, CmError::SrqBusy { qps: 1 }));
        assert!(fits(&post, unknown(Call::PostSend, HandleKind::Mr)));
        assert!(!fits(&post, unknown(Call::PostSend, HandleKind::Srq)));
        assert!(!fits(&post, unknown(Call::PostRecv, HandleKind::Id)));
        assert!(fits(
            &post,
            CmError::QueueFull {
                call: Call::PostSend,
                outstanding: 16
            }
        ));
        assert!(fits(&on_srq, unknown(Call::CreateQp, HandleKind::Srq)));
        assert!(fits(&on_srq, CmError::QpExists));
        assert!(!fits(&on_srq, unknown(Call::CreateQp, HandleKind::Mr)));
        assert!(fits(&arm, invalid(Call::ModifySrq)));
        assert!(!fits(&arm, invalid(Call::CreateSrq)));
        assert!(fits(&info, unknown(Call::RegMr, HandleKind::Mr)));
        assert!(!fits(&info, invalid(Call::RegMr)));
        assert!(!fits(&info, CmError::NoDevice { call: Call::RegMr }));
        assert!(fits(
            &wait,
            CmError::HostCrashed {
                call: Call::GetAsyncEvent,
                at: Duration::ZERO
            }
        ));
        assert!(!fits(
            &wait,
            CmError::HostCrashed {
                call: Call::PollCq,
                at: Duration::ZERO
            }
        ));
        assert!(!fits(&wait, CmError::QpExists));
        assert_eq!(
            onesided_error_fits(&Op::LiveResources { h }, &CmError::QpExists),
            None
        );
    }
}
