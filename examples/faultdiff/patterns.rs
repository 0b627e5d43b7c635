//! The patterns: which IB CM messages are lost on the wire, what each end does, and what Linux
//! 6.1's IB CM makes of it (drivers/infiniband/core/cm.c and cma.c, as rdma_cm drives them).
//!
//! Every time below follows from the kernel's arithmetic (`cm-sim/src/exchange/timeouts.rs`):
//! the active side sends its REQ or DREQ again every 6 144 ms, the passive side its REP or DREQ
//! every 4 096 ms, each 1 + 15 times; timewait is 2 048 ms; once the passive side answered a
//! duplicate REQ with an MRA, the active side waits 67 584 ms a try. The client is the active
//! side, on the pair's A address (rxe0 in the lab), the server the passive side on B (rxe1).

use cm::api::CmEventType::{self, *};
use cm::sim::MsgKind::{self, *};

/// One end of the connection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum End {
    /// The active side.
    Client,
    /// The listener and the children its requests make.
    Server,
}

/// Which way a message goes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Dir {
    /// Client to server (the lab's `ab`).
    ToServer,
    /// Server to client (`ba`).
    ToClient,
}

/// Every message from `skip` on, `count` of them (every transmission on the wire counts:
/// first sends, retries and answers to duplicates).
pub(crate) const ALL: u32 = u32::MAX;

/// Messages of one kind lost one way.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Loss {
    pub(crate) dir: Dir,
    pub(crate) msg: MsgKind,
    pub(crate) skip: u32,
    pub(crate) count: u32,
}

/// What an end does.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Act {
    /// `create_qp` and `accept` (the child of a `CONNECT_REQUEST`).
    Accept,
    /// `reject` and destroy the child.
    Reject,
    /// `disconnect`.
    Disconnect,
    /// `destroy_qp` and `destroy_id`.
    Destroy,
}

/// On `on` at `end`, `act` on the event's id `after_ms` later. Rules apply in table order.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rule {
    pub(crate) end: End,
    pub(crate) on: CmEventType,
    pub(crate) after_ms: u64,
    pub(crate) act: Act,
}

/// Something that happens to the link or the server's host at a time (ms after the connect).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Turn {
    /// Every CM message both ways is lost from now on (on rxe: dropped after the pair's
    /// counters, so they count it, as the simulator counts a lost message).
    Cut,
    /// The cut ends.
    Heal,
    /// The server's host crashes: its ids go without a word on the wire. On rxe, where both
    /// ends share one kernel, the pair's wire is cut ahead of the counters and the server's
    /// backend dropped, so what its kernel sends for the destroyed ids goes nowhere.
    Crash,
    /// The server's host is back, empty, and the server listens again.
    Restart,
}

/// One event an end retrieves: the end, its id (0 the client's, 1, 2, ... the server's children
/// in the order of their requests), the event, its status and when (ms after the connect).
pub(crate) type Seen = (End, u8, CmEventType, i32, u64);

/// Messages on the wire, every transmission: the way, the kind, how many.
pub(crate) type Sent = (Dir, MsgKind, u32);

pub(crate) struct Pattern {
    pub(crate) name: &'static str,
    pub(crate) about: &'static str,
    pub(crate) losses: &'static [Loss],
    /// What happens to the link or the server's host, in time order.
    pub(crate) turns: &'static [(u64, Turn)],
    pub(crate) rules: &'static [Rule],
    /// `ACK_TIMEOUT` the client sets before route resolution (the path's lifetime is one less).
    pub(crate) client_ack_timeout: Option<u8>,
    /// How long the pattern runs from the connect (ms); then both ends tear down.
    pub(crate) horizon_ms: u64,
    /// What the kernel's rules give.
    pub(crate) expect: &'static [Seen],
    pub(crate) wire: &'static [Sent],
}

const fn rule(end: End, on: CmEventType, after_ms: u64, act: Act) -> Rule {
    Rule {
        end,
        on,
        after_ms,
        act,
    }
}

const fn lose(dir: Dir, msg: MsgKind, skip: u32, count: u32) -> Loss {
    Loss {
        dir,
        msg,
        skip,
        count,
    }
}

use Act::*;
use Dir::*;
use End::*;

/// The usual life: the server accepts; the client disconnects a second after `ESTABLISHED`; the
/// server answers `DISCONNECTED` with its disconnect (the DREP); each end destroys its id after
/// `TIMEWAIT_EXIT`, or after a failure event.
const USUAL: &[Rule] = &[
    rule(Server, ConnectRequest, 0, Accept),
    rule(Client, Established, 1_000, Disconnect),
    rule(Server, Disconnected, 0, Disconnect),
    rule(Client, TimewaitExit, 0, Destroy),
    rule(Server, TimewaitExit, 0, Destroy),
    rule(Client, Unreachable, 0, Destroy),
    rule(Client, Rejected, 0, Destroy),
    rule(Server, Unreachable, 0, Destroy),
    rule(Server, Rejected, 0, Destroy),
];

/// The usual life, with the client waiting 6 s before its disconnect: past the REP's first
/// retry (4 096 ms).
const PATIENT: &[Rule] = &[
    rule(Server, ConnectRequest, 0, Accept),
    rule(Client, Established, 6_000, Disconnect),
    rule(Server, Disconnected, 0, Disconnect),
    rule(Client, TimewaitExit, 0, Destroy),
    rule(Server, TimewaitExit, 0, Destroy),
    rule(Server, Unreachable, 0, Destroy),
];

/// The echo server's way: it destroys its child as soon as it has answered the disconnect.
const ECHO_SERVER: &[Rule] = &[
    rule(Server, ConnectRequest, 0, Accept),
    rule(Client, Established, 1_000, Disconnect),
    rule(Server, Disconnected, 0, Disconnect),
    rule(Server, Disconnected, 0, Destroy),
    rule(Client, TimewaitExit, 0, Destroy),
];

/// A server that answers the disconnect and keeps its child (never destroys it).
const KEEPING_SERVER: &[Rule] = &[
    rule(Server, ConnectRequest, 0, Accept),
    rule(Client, Established, 1_000, Disconnect),
    rule(Server, Disconnected, 0, Disconnect),
    rule(Client, TimewaitExit, 0, Destroy),
];

/// The server disconnects a second after `ESTABLISHED`; the client answers.
const SERVER_FIRST: &[Rule] = &[
    rule(Server, ConnectRequest, 0, Accept),
    rule(Server, Established, 1_000, Disconnect),
    rule(Client, Disconnected, 0, Disconnect),
    rule(Client, TimewaitExit, 0, Destroy),
    rule(Server, TimewaitExit, 0, Destroy),
];

pub(crate) const PATTERNS: &[Pattern] = &[
    Pattern {
        name: "clean",
        about: "nothing lost: the usual life",
        losses: &[],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 6_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 1_000),
            (Client, 0, TimewaitExit, 0, 3_048),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
            (Server, 1, Disconnected, 0, 1_000),
            (Server, 1, TimewaitExit, 0, 3_048),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "req-lost-once",
        about: "the first REQ is lost: its retry 6 144 ms later connects",
        losses: &[lose(ToServer, Req, 0, 1)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 12_000,
        expect: &[
            (Client, 0, Established, 0, 6_144),
            (Client, 0, Disconnected, 0, 7_144),
            (Client, 0, TimewaitExit, 0, 9_192),
            (Server, 1, ConnectRequest, 0, 6_144),
            (Server, 1, Established, 0, 6_144),
            (Server, 1, Disconnected, 0, 7_144),
            (Server, 1, TimewaitExit, 0, 9_192),
        ],
        wire: &[
            (ToServer, Req, 2),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "req-lost-twice",
        about: "the first two REQs are lost: the second retry connects",
        losses: &[lose(ToServer, Req, 0, 2)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 18_000,
        expect: &[
            (Client, 0, Established, 0, 12_288),
            (Client, 0, Disconnected, 0, 13_288),
            (Client, 0, TimewaitExit, 0, 15_336),
            (Server, 1, ConnectRequest, 0, 12_288),
            (Server, 1, Established, 0, 12_288),
            (Server, 1, Disconnected, 0, 13_288),
            (Server, 1, TimewaitExit, 0, 15_336),
        ],
        wire: &[
            (ToServer, Req, 3),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "req-lost-always",
        about: "every REQ is lost: UNREACHABLE after 16 tries, no REJ",
        losses: &[lose(ToServer, Req, 0, ALL)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 104_000,
        expect: &[(Client, 0, Unreachable, -110, 98_304)],
        wire: &[(ToServer, Req, 16)],
    },
    Pattern {
        name: "rep-lost-once",
        about: "the first REP is lost: its retry 4 096 ms later connects",
        losses: &[lose(ToClient, Rep, 0, 1)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 10_000,
        expect: &[
            (Client, 0, Established, 0, 4_096),
            (Client, 0, Disconnected, 0, 5_096),
            (Client, 0, TimewaitExit, 0, 7_144),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 4_096),
            (Server, 1, Disconnected, 0, 5_096),
            (Server, 1, TimewaitExit, 0, 7_144),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 2),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "rep-lost-twice",
        about: "two REPs are lost: the REQ's retry meets the accepted child and is dropped; the \
                REP's second retry connects",
        losses: &[lose(ToClient, Rep, 0, 2)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 14_000,
        expect: &[
            (Client, 0, Established, 0, 8_192),
            (Client, 0, Disconnected, 0, 9_192),
            (Client, 0, TimewaitExit, 0, 11_240),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 8_192),
            (Server, 1, Disconnected, 0, 9_192),
            (Server, 1, TimewaitExit, 0, 11_240),
        ],
        wire: &[
            (ToServer, Req, 2),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 3),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "rep-lost-always",
        about: "every REP is lost: the child gives up after 16 tries (65 536 ms), and the REQ's \
                next retry is a new request; the client gives up at 98 304 ms",
        losses: &[lose(ToClient, Rep, 0, ALL)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 150_000,
        expect: &[
            (Client, 0, Unreachable, -110, 98_304),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Unreachable, -110, 65_536),
            (Server, 2, ConnectRequest, 0, 67_584),
            (Server, 2, Unreachable, -110, 133_120),
        ],
        wire: &[(ToServer, Req, 16), (ToClient, Rep, 32)],
    },
    Pattern {
        name: "rtu-lost-once",
        about: "the RTU is lost: the REP's retry draws it again",
        losses: &[lose(ToServer, Rtu, 0, 1)],
        turns: &[],
        rules: PATIENT,
        client_ack_timeout: None,
        horizon_ms: 11_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 6_000),
            (Client, 0, TimewaitExit, 0, 8_048),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 4_096),
            (Server, 1, Disconnected, 0, 6_000),
            (Server, 1, TimewaitExit, 0, 8_048),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 2),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 2),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "rtu-lost-always",
        about: "every RTU is lost: the child gives up after its REP's 16 tries while the client \
                is established; the client's later DREQ finds no child and its host answers",
        losses: &[lose(ToServer, Rtu, 0, ALL)],
        turns: &[],
        rules: &[
            rule(Server, ConnectRequest, 0, Accept),
            rule(Server, Unreachable, 0, Destroy),
            rule(Client, Established, 70_000, Disconnect),
            rule(Client, TimewaitExit, 0, Destroy),
        ],
        client_ack_timeout: None,
        horizon_ms: 75_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 70_000),
            (Client, 0, TimewaitExit, 0, 72_048),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Unreachable, -110, 65_536),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 16),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 16),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "dreq-lost-once",
        about: "the DREQ is lost: its retry 6 144 ms later disconnects",
        losses: &[lose(ToServer, Dreq, 0, 1)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 12_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 7_144),
            (Client, 0, TimewaitExit, 0, 9_192),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
            (Server, 1, Disconnected, 0, 7_144),
            (Server, 1, TimewaitExit, 0, 9_192),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 2),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "dreq-lost-always",
        about: "every DREQ is lost: DISCONNECTED -ETIMEDOUT after 16 tries",
        losses: &[lose(ToServer, Dreq, 0, ALL)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 105_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, -110, 99_304),
            (Client, 0, TimewaitExit, 0, 101_352),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 16),
            (ToClient, Rep, 1),
        ],
    },
    Pattern {
        name: "drep-lost-peer-alive",
        about: "the DREP is lost and the server keeps its child: past its timewait the child \
                ignores the DREQ's retries, DISCONNECTED -ETIMEDOUT",
        losses: &[lose(ToClient, Drep, 0, 1)],
        turns: &[],
        rules: KEEPING_SERVER,
        client_ack_timeout: None,
        horizon_ms: 105_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, -110, 99_304),
            (Client, 0, TimewaitExit, 0, 101_352),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
            (Server, 1, Disconnected, 0, 1_000),
            (Server, 1, TimewaitExit, 0, 3_048),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 16),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "drep-lost-peer-gone",
        about: "the DREP is lost and the server destroyed its child: the DREQ's retry meets no \
                id and the server's host answers with a DREP (cm_issue_drep)",
        losses: &[lose(ToClient, Drep, 0, 1)],
        turns: &[],
        rules: ECHO_SERVER,
        client_ack_timeout: None,
        horizon_ms: 12_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 7_144),
            (Client, 0, TimewaitExit, 0, 9_192),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
            (Server, 1, Disconnected, 0, 1_000),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 2),
            (ToClient, Rep, 1),
            (ToClient, Drep, 2),
        ],
    },
    Pattern {
        name: "drep-lost-peer-in-timewait",
        about: "the server disconnects and the client's DREP is lost; with ACK_TIMEOUT 21 the \
                client's timewait (8 192 ms) outlasts the DREQ's retry, which draws the DREP again",
        losses: &[lose(ToServer, Drep, 0, 1)],
        turns: &[],
        rules: SERVER_FIRST,
        client_ack_timeout: Some(21),
        horizon_ms: 16_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 1_000),
            (Client, 0, TimewaitExit, 0, 9_192),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
            (Server, 1, Disconnected, 0, 5_096),
            (Server, 1, TimewaitExit, 0, 13_288),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Drep, 2),
            (ToClient, Rep, 1),
            (ToClient, Dreq, 2),
        ],
    },
    Pattern {
        name: "rej-lost-once",
        about: "the server rejects and the REJ is lost: the REQ's retry finds no child and is a \
                new request, rejected again",
        losses: &[lose(ToClient, Rej, 0, 1)],
        turns: &[],
        rules: &[
            rule(Server, ConnectRequest, 0, Reject),
            rule(Client, Rejected, 0, Destroy),
        ],
        client_ack_timeout: None,
        horizon_ms: 10_000,
        expect: &[
            (Client, 0, Rejected, 28, 6_144),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 2, ConnectRequest, 0, 6_144),
        ],
        wire: &[(ToServer, Req, 2), (ToClient, Rej, 2)],
    },
    Pattern {
        name: "peer-gone-before-rtu",
        about: "the RTU is lost and the server destroys its child a second later: the child's \
                REJ reaches an established client, which is REJECTED (status 28)",
        losses: &[lose(ToServer, Rtu, 0, 1)],
        turns: &[],
        // The client keeps its id past the REJ's timewait: nothing more comes (rdma_cm is still
        // in RDMA_CM_CONNECT, so the end of timewait is not reported).
        rules: &[
            rule(Server, ConnectRequest, 0, Accept),
            rule(Server, ConnectRequest, 1_000, Destroy),
            rule(Client, Rejected, 4_000, Destroy),
        ],
        client_ack_timeout: None,
        horizon_ms: 6_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Rejected, 28, 1_000),
            (Server, 1, ConnectRequest, 0, 0),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToClient, Rep, 1),
            (ToClient, Rej, 1),
        ],
    },
    Pattern {
        name: "peer-gone-after-rtu",
        about: "the server destroys its established child: its one DREQ disconnects the client, \
                whose DREP finds no id",
        losses: &[],
        turns: &[],
        rules: &[
            rule(Server, ConnectRequest, 0, Accept),
            rule(Server, Established, 1_000, Destroy),
            rule(Client, Disconnected, 0, Disconnect),
            rule(Client, TimewaitExit, 0, Destroy),
        ],
        client_ack_timeout: None,
        horizon_ms: 6_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 1_000),
            (Client, 0, TimewaitExit, 0, 3_048),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Drep, 1),
            (ToClient, Rep, 1),
            (ToClient, Dreq, 1),
        ],
    },
    Pattern {
        name: "peer-gone-dreq-lost",
        about: "the destroyed child's one DREQ is lost (destroy sends it once): the client stays \
                connected until its own DREQ, which the server's host answers",
        losses: &[lose(ToClient, Dreq, 0, 1)],
        turns: &[],
        rules: &[
            rule(Server, ConnectRequest, 0, Accept),
            rule(Server, Established, 1_000, Destroy),
            rule(Client, Established, 10_000, Disconnect),
            rule(Client, TimewaitExit, 0, Destroy),
        ],
        client_ack_timeout: None,
        horizon_ms: 15_000,
        expect: &[
            (Client, 0, Established, 0, 0),
            (Client, 0, Disconnected, 0, 10_000),
            (Client, 0, TimewaitExit, 0, 12_048),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 1, Established, 0, 0),
        ],
        wire: &[
            (ToServer, Req, 1),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Dreq, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "mra",
        about: "the server retrieves the request and never answers: the REQ's retry draws the \
                MRA rdma_cm deferred, and each later try waits 67 584 ms",
        losses: &[],
        turns: &[],
        rules: &[],
        client_ack_timeout: None,
        horizon_ms: 150_000,
        expect: &[(Server, 1, ConnectRequest, 0, 0)],
        wire: &[(ToServer, Req, 4), (ToClient, Mra, 3)],
    },
    Pattern {
        name: "mra-lost",
        about: "every MRA is lost: the REQ's tries keep their 6 144 ms and the client gives up \
                while the server holds the request",
        losses: &[lose(ToClient, Mra, 0, ALL)],
        turns: &[],
        rules: &[rule(Client, Unreachable, 0, Destroy)],
        client_ack_timeout: None,
        horizon_ms: 104_000,
        expect: &[
            (Client, 0, Unreachable, -110, 98_304),
            (Server, 1, ConnectRequest, 0, 0),
        ],
        wire: &[(ToServer, Req, 16), (ToClient, Mra, 15)],
    },
    Pattern {
        name: "partition-during-connect",
        about: "every CM message both ways is cut for 8 s from the connect: the REQ's second \
                retry, after the heal, connects",
        losses: &[],
        turns: &[(0, Turn::Cut), (8_000, Turn::Heal)],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 18_000,
        expect: &[
            (Client, 0, Established, 0, 12_288),
            (Client, 0, Disconnected, 0, 13_288),
            (Client, 0, TimewaitExit, 0, 15_336),
            (Server, 1, ConnectRequest, 0, 12_288),
            (Server, 1, Established, 0, 12_288),
            (Server, 1, Disconnected, 0, 13_288),
            (Server, 1, TimewaitExit, 0, 15_336),
        ],
        wire: &[
            (ToServer, Req, 3),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "rep-lost-server-restarts",
        about: "the REP is lost and the server's host crashes at 2 s and restarts at 3 s, \
                listening again: the REQ's retry reaches the new server as a new request",
        losses: &[lose(ToClient, Rep, 0, 1)],
        turns: &[(2_000, Turn::Crash), (3_000, Turn::Restart)],
        rules: USUAL,
        client_ack_timeout: None,
        horizon_ms: 12_000,
        expect: &[
            (Client, 0, Established, 0, 6_144),
            (Client, 0, Disconnected, 0, 7_144),
            (Client, 0, TimewaitExit, 0, 9_192),
            (Server, 1, ConnectRequest, 0, 0),
            (Server, 2, ConnectRequest, 0, 6_144),
            (Server, 2, Established, 0, 6_144),
            (Server, 2, Disconnected, 0, 7_144),
            (Server, 2, TimewaitExit, 0, 9_192),
        ],
        wire: &[
            (ToServer, Req, 2),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 2),
            (ToClient, Drep, 1),
        ],
    },
    Pattern {
        name: "req-lost-once-ack-timeout-14",
        about: "the first REQ is lost from a client with ACK_TIMEOUT 14: the path's lifetime 13 \
                makes the retry come after 2 x 32 + 4 096 ms",
        losses: &[lose(ToServer, Req, 0, 1)],
        turns: &[],
        rules: USUAL,
        client_ack_timeout: Some(14),
        horizon_ms: 8_000,
        expect: &[
            (Client, 0, Established, 0, 4_160),
            (Client, 0, Disconnected, 0, 5_160),
            (Client, 0, TimewaitExit, 0, 5_416),
            (Server, 1, ConnectRequest, 0, 4_160),
            (Server, 1, Established, 0, 4_160),
            (Server, 1, Disconnected, 0, 5_160),
            (Server, 1, TimewaitExit, 0, 5_416),
        ],
        wire: &[
            (ToServer, Req, 2),
            (ToServer, Rtu, 1),
            (ToServer, Dreq, 1),
            (ToClient, Rep, 1),
            (ToClient, Drep, 1),
        ],
    },
];

/// The kind's name as the lab's nft table and rxe's sysfs counters spell it.
#[cfg_attr(not(feature = "hw"), allow(dead_code))]
pub(crate) fn kind_name(msg: MsgKind) -> &'static str {
    match msg {
        Req => "req",
        Rep => "rep",
        Rtu => "rtu",
        Rej => "rej",
        Dreq => "dreq",
        Drep => "drep",
        Mra => "mra",
    }
}

/// The MAD attribute id of a kind (include/rdma/ib_cm.h's CM_*_ATTR_ID).
#[cfg_attr(not(feature = "hw"), allow(dead_code))]
pub(crate) fn attr_id(msg: MsgKind) -> u16 {
    match msg {
        Req => 0x10,
        Mra => 0x11,
        Rej => 0x12,
        Rep => 0x13,
        Rtu => 0x14,
        Dreq => 0x15,
        Drep => 0x16,
    }
}

/// Every kind, for the counts.
pub(crate) const KINDS: [MsgKind; 7] = MsgKind::ALL;
