//! The steps: each mirrors one transaction or check of the real protocol,
//! and names the Rust function it mirrors.

use crate::state::*;
use stateright::{Model, Property};

/// The lease TTL, in model time units (`Config::ttl`; the scenario with
/// leader changes needs a finer clock, see [`Config::ci`]).
pub const TTL: u8 = 2;
/// `holdfast_client::session::FENCE_MARGIN`, in model time units.
pub const FENCE_MARGIN: u8 = 1;

/// The eleven deliberate bugs. Each must produce a counterexample.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Mutation {
    /// `grant_txn` without `Compare::value(EPOCH_KEY, ..)`
    /// (`mutation::NO_EPOCH_COMPARE`).
    NoEpochCompare,
    /// Tokens from the arbiter's local counter instead of the commit
    /// revision (`mutation::TOKEN_FROM_COUNTER`).
    TokenFromCounter,
    /// Restore detection off: `judge` never says Rewound and the grant's
    /// `revision <= highest_before` check is skipped
    /// (`mutation::NO_SEAL_CHECK`).
    NoSealCheck,
    /// The advance takes the restored record's epoch + 1, ignoring the
    /// allocators and the arbiters' served epochs.
    AdvanceByOne,
    /// The arbiter keeps no record of the epochs it served: `admit` serves
    /// any record and `ServerStatus` reports nothing (stronger than
    /// `mutation::FORGET_SERVED_EPOCHS`, which only skips `admit`).
    ForgetServedEpochs,
    /// A key move flips the map without advancing the destination epoch.
    MoveWithoutAdvance,
    /// A key move neither drains the range nor waits for its holds.
    MoveWithoutDrain,
    /// The drain is the shard map only: the rebalancer writes no drain
    /// marker on the source, and the grant transaction compares none, so an
    /// arbiter whose watch has not delivered the drain (or the flip) yet
    /// still grants the range on the source.
    DrainByMapOnly,
    /// The client's deadline counts from the keepalive's receive time.
    DeadlineFromReceiveTime,
    /// `release_txn_for` without the create-revision, lease and session
    /// guard (`mutation::RELEASE_UNGUARDED`).
    ReleaseUnguarded,
    /// A keepalive answered with a TTL counts without the quorum read of
    /// the Raft term (`mutation::NO_KEEPALIVE_CONFIRMATION` in
    /// `LockService::renew`): a deposed leader's answer moves the deadline.
    NoKeepaliveConfirmation,
}

/// Which environment a check runs in (each a bound of one model).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Scenario {
    /// One entity cluster that also holds the coord tier (the MVP):
    /// snapshots, an older-snapshot restore, two-person advances, arbiter
    /// crashes, stale release retries, a fenced resource.
    Restore,
    /// A coord cluster and two entity clusters: a key move (drain, wait,
    /// advance destination, flip), advances, arbiter crashes.
    Move,
    /// One cluster with a clock: keepalives (send, leader renews, answer,
    /// loss), client deadlines, lease expiry by the clock.
    Time,
    /// The Time scenario's cluster with a finer clock (TTL 3) and an etcd
    /// leader change: the deposed leader stalls and still answers
    /// keepalives in its old term; the arbiter confirms the term.
    Leader,
    /// A holder and a waiter; the holder releases or stops (its lease then
    /// expires); every path ends, and the waiter must be granted.
    Liveness,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub scenario: Scenario,
    pub mutation: Option<Mutation>,
    pub clusters: u8,
    pub separate_coord: bool,
    pub keys: u8,
    pub clients: u8,
    pub arbiters: u8,
    pub clock: bool,
    /// The lease TTL and the client's fence margin, in model time units.
    pub ttl: u8,
    pub fence_margin: u8,
    /// Clients 0..renewers send keepalives (the others live on their
    /// sessions' first deadline, and new sessions).
    pub renewers: u8,
    pub budget: Budget,
    /// Test-only knob for the liveness check's vacuity: the waiter does not
    /// retry a refused acquire.
    pub waiter_polls: bool,
    /// Holders write the fenced resource.
    pub writes: bool,
    /// A restore breaks every arbiter's connection to the cluster (its
    /// members were stopped), so each arbiter sees a failed call and
    /// re-checks before granting there again. An assumption of the real
    /// protocol; `false` shows what it rests on.
    pub restore_breaks_connections: bool,
    /// A client does not acquire a key again on a session while a release
    /// of that key from that session may still be in flight (a release
    /// whose answer it has not had). The arbiter answers an acquire that
    /// finds the session's own hold with that hold's token (the retry of a
    /// lost grant answer), so a release still in flight would delete the
    /// hold the client now believes it has. An assumption about the client;
    /// `false` shows what it rests on.
    pub reacquire_waits_for_release: bool,
}

impl Config {
    /// The CI bound of a scenario.
    pub fn ci(scenario: Scenario) -> Config {
        let none = Budget {
            snapshots: 0,
            restores: 0,
            advances: 0,
            moves: 0,
            sessions: 0,
            redeliveries: 0,
            crashes: 0,
            stops: 0,
            ticks: 0,
            lost_answers: 0,
            leader_changes: 0,
            grants: 3,
        };
        let (clusters, separate_coord, arbiters, clock, budget) = match scenario {
            Scenario::Restore => (1, false, 2, false, Budget { snapshots: 1, restores: 1, advances: 2, sessions: 2, grants: 2, ..none }),
            Scenario::Move => (2, true, 1, false, Budget { advances: 1, moves: 1, sessions: 1, lost_answers: 1, ..none }),
            Scenario::Time => (1, false, 1, true, Budget { sessions: 1, ticks: 2, redeliveries: 1, ..none }),
            // The clock to t = 3: a deposed leader's answers can outrun the
            // real lease only from two renewals on, sent more than the
            // fence margin after the change.
            Scenario::Leader => (1, false, 1, true, Budget { sessions: 1, ticks: 3, leader_changes: 1, grants: 2, ..none }),
            Scenario::Liveness => (1, false, 1, false, Budget { crashes: 1, stops: 1, grants: 1, lost_answers: 1, ..none }),
        };
        // Restore: one client (a second multiplies the space by ~10; the
        // deep bound has two); the resource is written in Move (two
        // clients, tokens across clusters).
        let clients = if scenario == Scenario::Restore { 1 } else { 2 };
        let writes = scenario == Scenario::Move;
        // Leader: TTL 3 (with TTL 2 and margin 1 a client can renew only in
        // the time unit it last sent in, so no deadline moves past the
        // change); only client 0 renews (client 1 lives on its sessions'
        // first deadline: two renewers multiply the space by ~27, and the
        // Time scenario has both renewing).
        let (ttl, renewers) = if scenario == Scenario::Leader { (3, 1) } else { (TTL, clients) };
        Config {
            scenario,
            mutation: None,
            clusters,
            separate_coord,
            keys: 1,
            clients,
            arbiters,
            clock,
            ttl,
            fence_margin: FENCE_MARGIN,
            renewers,
            budget,
            waiter_polls: true,
            writes,
            restore_breaks_connections: true,
            reacquire_waits_for_release: true,
        }
    }

    /// The deeper bound (`HOLDFAST_MODEL_DEEP=1`).
    pub fn deep(scenario: Scenario) -> Config {
        let mut c = Config::ci(scenario);
        let b = &mut c.budget;
        match scenario {
            // Both clients, so a restore can bring back or lose another
            // client's hold, and an old holder can write the resource.
            Scenario::Restore => {
                c.clients = 2;
                c.writes = true;
            }
            // Both arbiters.
            Scenario::Move => c.arbiters = 2,
            // A longer clock, and a lost grant answer.
            Scenario::Time => {
                b.ticks = 3;
                b.lost_answers = 1;
            }
            // Both clients renew.
            Scenario::Leader => c.renewers = 2,
            Scenario::Liveness => {
                b.crashes = 2;
                c.arbiters = 2;
            }
        }
        c
    }

    pub fn with(mut self, m: Mutation) -> Config {
        self.mutation = Some(m);
        self
    }

    fn on(&self, m: Mutation) -> bool {
        self.mutation == Some(m)
    }
}

/// Property names (as the tests and docs/protocol.md name them).
pub const TOKENS_INCREASE: &str = "per key, tokens strictly increase in grant order";
pub const NO_TOKEN_TWICE: &str = "per key, no token is issued twice";
pub const NO_TWO_LIVE_HOLDERS: &str = "no two holders of a key are both inside their deadline";
pub const FENCE_HOLDS: &str = "the resource never accepts a token at or below its mark";
pub const NO_GRANT_WHILE_SEALED: &str = "no grant while sealed";
pub const NO_REISSUE_AFTER_RESTORE: &str = "after a restore no token at or below any pre-restore token";
pub const WAITER_GRANTED: &str = "a waiter is granted once the holder releases or expires";

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Action {
    /// `seal::check_once` (judge, admit, commit, durable seal).
    Check {
        arbiter: u8,
        cluster: u8,
    },
    /// Crash and restart: memory lost, `served-epochs.json` kept.
    Crash {
        arbiter: u8,
    },
    /// `grant::attempt` with `txn::grant_txn`; `answer_lost`: the grant
    /// commits but its answer never reaches the client, which asks again.
    Acquire {
        client: u8,
        arbiter: u8,
        key: u8,
        answer_lost: bool,
    },
    /// The client asks for a release (`Hold::release`); the request travels.
    Release {
        client: u8,
        key: u8,
    },
    /// The arbiter runs `txn::release_txn_for` for a request; `retry`: the
    /// answer was lost and the client sends it again.
    DeliverRelease {
        msg: ReleaseMsg,
        retry: bool,
    },
    /// The holder writes the resource with its token (a paused holder may
    /// write long after its deadline: only the fence stops it).
    Write {
        client: u8,
        key: u8,
    },
    /// `on_fence`: the local deadline passed or the session is gone.
    Fence {
        client: u8,
        cluster: u8,
    },
    /// A new session: lease grant and `/s/<lease>`.
    OpenSession {
        client: u8,
        cluster: u8,
    },
    KeepaliveSend {
        client: u8,
        cluster: u8,
    },
    KeepaliveAtLeader {
        client: u8,
        cluster: u8,
    },
    /// The keepalive reaches a deposed leader that still answers.
    KeepaliveAtDeposed {
        client: u8,
        cluster: u8,
    },
    KeepaliveAnswer {
        client: u8,
        cluster: u8,
    },
    KeepaliveLost {
        client: u8,
        cluster: u8,
    },
    /// The client stops for good (crash, or a pause past everything).
    Stop {
        client: u8,
    },
    Tick,
    /// etcd elects a new leader (`lessor.Promote`); the old one stalls
    /// without learning it and keeps answering keepalives.
    LeaderChange {
        cluster: u8,
    },
    /// The leader expires a lease: the lease and its keys go.
    Expire {
        cluster: u8,
        lease: u8,
    },
    Snapshot {
        cluster: u8,
    },
    /// `etcdutl snapshot restore` of an earlier snapshot, same cluster token.
    Restore {
        cluster: u8,
        snapshot: u8,
    },
    /// The two-person advance (`holdfastctl epoch advance-request` +
    /// `epoch::advance_via`), from any host, as one step.
    Advance {
        cluster: u8,
    },
    /// The rebalancer: drain the key's range (arbiters refuse its grants).
    MoveDrain {
        key: u8,
    },
    /// Wait for no hold on the source, then advance the destination above.
    MoveAdvance {
        key: u8,
    },
    /// Flip the shard map version and resume.
    MoveFlip {
        key: u8,
    },
    /// The arbiter's watch of `/sys/shardmap` delivers the current map.
    MapDelivered {
        arbiter: u8,
    },
}

#[derive(Clone, Debug)]
pub struct ProtocolModel {
    pub cfg: Config,
}

fn arb_name(a: u8) -> char {
    (b'A' + a) as char
}
fn cluster_name(c: u8) -> char {
    (b'X' + c) as char
}

impl ProtocolModel {
    pub fn new(cfg: Config) -> Self {
        ProtocolModel { cfg }
    }

    /// `epoch::init_via` on each cluster: epochs allocated from coord
    /// (1, 2, ...), revision past the init pad, every client's session
    /// open on every cluster.
    fn initial(&self) -> State {
        let c = &self.cfg;
        let clients = c.clients;
        let mut clusters = Vec::new();
        for i in 0..c.clusters {
            let leases: Vec<Lease> = (0..clients).map(|k| Lease { id: 1 + k, expiry: c.ttl }).collect();
            let store = Store {
                revision: 1,
                epoch: EpochRecord { epoch: u32::from(i) + 1, cluster_id: i, log_floor: 0, mint: i },
                seal: false,
                epochs: u32::from(i) + 1,
                epochs_mod_revision: 1,
                holds: vec![None; usize::from(c.keys)],
                draining: vec![false; usize::from(c.keys)],
                sessions: leases.iter().map(|l| l.id).collect(),
                leases,
            };
            clusters.push(Cluster {
                store,
                log_offset: 0,
                snapshots: vec![],
                rewound: false,
                max_issued: 0,
                pre_restore_max: 0,
                term: 1,
                deposed: None,
            });
        }
        let arbiter = Arbiter {
            serve: vec![Serve::Unverified; usize::from(c.clusters)],
            highest: vec![(0, 0); usize::from(c.clusters)],
            served: vec![None; usize::from(c.clusters)],
            counter: 0,
            map: vec![c.clusters - 1; usize::from(c.keys)],
            moving: vec![false; usize::from(c.keys)],
        };
        let session = |k: u8| Some(Session { lease: 1 + k, deadline: c.ttl - c.fence_margin, keepalive: None });
        let mut s = State {
            now: 0,
            coord: Coord {
                epochs: u32::from(c.clusters),
                epochs_mod_revision: 1,
                revision: 1,
                // Key 0 starts on the last cluster (in Move: Y, epoch 2), so
                // a move to X goes to a lower epoch.
                map: vec![c.clusters - 1; usize::from(c.keys)],
                moving: vec![None; usize::from(c.keys)],
            },
            clusters,
            arbiters: vec![arbiter; usize::from(c.arbiters)],
            clients: (0..clients)
                .map(|k| Client {
                    sessions: vec![session(k); usize::from(c.clusters)],
                    held: vec![None; usize::from(c.keys)],
                    stopped: false,
                })
                .collect(),
            net: vec![],
            resource: vec![None; usize::from(c.keys)],
            keys: vec![KeyHistory::default(); usize::from(c.keys)],
            broken: Broken::default(),
            budget: c.budget,
            next_lease: clients + 1,
            next_mint: c.clusters,
            waiter_granted: false,
        };
        if c.scenario == Scenario::Liveness {
            // Client 0 holds key 0, granted by arbiter A at revision 2.
            let record = s.clusters[0].store.epoch.clone();
            s.clusters[0].store.revision = 2;
            s.clusters[0].store.holds[0] = Some(Hold { lease: 1, create_revision: 2, epoch: record.epoch, grant: 1 });
            let t = token(record.epoch, 2);
            s.arbiters[0].serve[0] = Serve::Serving(record.clone());
            s.arbiters[0].served[0] = Some(record.clone());
            s.arbiters[0].highest[0] = (record.epoch, 2);
            s.clients[0].held[0] = Some(Held { cluster: 0, token: t, lease: 1, create_revision: 2, arbiter: 0, grant: 1, ended: false });
            s.keys[0] = KeyHistory { grants: 1, last: t, issued: vec![t] };
            s.clusters[0].max_issued = t;
        }
        s
    }

    /// The cluster holding the epoch allocator of the coord tier, if it is
    /// an entity cluster (both tiers on one cluster).
    fn shared_coord(&self) -> bool {
        !self.cfg.separate_coord
    }

    /// A session is inside its deadline: by the client's clock when the
    /// model has one; without a clock, while the store still has its lease
    /// (the deadline falls before the lease's expiry).
    fn inside_deadline(&self, s: &State, client: u8, cluster: u8, lease: u8) -> bool {
        let Some(sess) = s.clients[usize::from(client)].sessions[usize::from(cluster)] else { return false };
        if sess.lease != lease {
            return false;
        }
        if self.cfg.clock { s.now < sess.deadline } else { s.clusters[usize::from(cluster)].store.lease(lease).is_some() }
    }

    /// `Guard::commit`: a seal of epoch E is replaced only by a state of
    /// another epoch.
    fn commit(a: &mut Arbiter, cluster: usize, next: Serve) {
        if let Serve::Sealed(sealed) = a.serve[cluster] {
            match &next {
                Serve::Unverified => return,
                Serve::Serving(r) if r.epoch == sealed => return,
                _ => {}
            }
        }
        a.serve[cluster] = next;
    }

    /// `Guard::observe`.
    fn observe(a: &mut Arbiter, cluster: usize, epoch: u32, revision: u16) {
        let h = &mut a.highest[cluster];
        if epoch > h.0 {
            *h = (epoch, revision);
        } else if epoch == h.0 && revision > h.1 {
            h.1 = revision;
        }
    }

    /// `Guard::highest_before`.
    fn highest_before(a: &Arbiter, cluster: usize, epoch: u32) -> u16 {
        let h = a.highest[cluster];
        if h.0 == epoch { h.1 } else { 0 }
    }

    /// The arbiter's copy of the shard map becomes coord's current one.
    fn read_map(a: &mut Arbiter, coord: &Coord) {
        a.map.clone_from(&coord.map);
        a.moving = coord.moving.iter().map(Option::is_some).collect();
    }

    /// The arbiter's copy of the shard map is coord's current one.
    fn map_current(a: &Arbiter, coord: &Coord) -> bool {
        a.map == coord.map && a.moving.iter().zip(&coord.moving).all(|(m, c)| *m == c.is_some())
    }

    /// `Guard::etcd_failed`: Serving becomes Unverified.
    fn etcd_failed(a: &mut Arbiter, cluster: usize) {
        if let Serve::Serving(_) = a.serve[cluster] {
            a.serve[cluster] = Serve::Unverified;
        }
    }

    /// One committed write: revision and applied index both + 1 (the log
    /// offset stays).
    fn write(st: &mut Store) -> u16 {
        st.revision += 1;
        st.revision
    }

    /// `seal::check_once` → `judge` → `admit` → `Guard::commit`, and the
    /// durable seal (`epoch::write_seal`).
    fn check(&self, s: &mut State, arbiter: u8, cluster: u8) {
        let (ai, ci) = (usize::from(arbiter), usize::from(cluster));
        let cl = &s.clusters[ci];
        let record = cl.store.epoch.clone();
        // judge: /sys/seal; cluster ID (header and members vs the record:
        // never differs here); log offset vs floor (`seal::judge`, SLACK 0).
        let rewound = cl.log_offset < record.log_floor && !self.cfg.on(Mutation::NoSealCheck);
        let verdict = if cl.store.seal || rewound { Serve::Sealed(record.epoch) } else { Serve::Serving(record.clone()) };
        // admit (`served::Served::admit`).
        let a = &mut s.arbiters[ai];
        let next = match verdict {
            Serve::Serving(r) if !self.cfg.on(Mutation::ForgetServedEpochs) => match &a.served[ci] {
                Some(high) if *high == r => Serve::Serving(r),
                Some(high) if r.epoch <= high.epoch => Serve::Sealed(r.epoch),
                _ => {
                    // Recorded (fsync'd) before the first grant.
                    a.served[ci] = Some(r.clone());
                    Serve::Serving(r)
                }
            },
            v => v,
        };
        Self::commit(a, ci, next);
        match a.serve[ci].clone() {
            Serve::Serving(r) => {
                let rev = s.clusters[ci].store.revision;
                Self::observe(a, ci, r.epoch, rev);
            }
            Serve::Sealed(_) => {
                // `epoch::write_seal`: compare version(/sys/seal) = 0; put.
                let st = &mut s.clusters[ci].store;
                if !st.seal {
                    st.seal = true;
                    Self::write(st);
                }
            }
            Serve::Unverified => {}
        }
    }

    /// `grant::attempt_txn`, with `txn::grant_txn`. `answer_lost`: the
    /// answer never reaches the client (it retries: the same session asks
    /// again).
    fn acquire(&self, s: &mut State, client: u8, arbiter: u8, key: u8, answer_lost: bool) {
        let (ai, ki, cli) = (usize::from(arbiter), usize::from(key), usize::from(client));
        // The arbiter routes by its copy of the shard map (it may lag).
        let ci = usize::from(s.arbiters[ai].map[ki]);
        let c = &s.clients[cli];
        if c.stopped || c.held[ki].is_some() {
            return;
        }
        let Some(sess) = c.sessions[ci] else { return };
        if self.cfg.reacquire_waits_for_release
            && s.net.iter().any(|m| m.client == client && m.key == key && m.cluster == ci as u8 && m.lease == sess.lease)
        {
            return;
        }
        // `can_start`.
        if self.cfg.clock && s.now >= sess.deadline {
            return;
        }
        // The rebalancer's drain: arbiters refuse grants of a range their
        // copy of the shard map says is draining.
        if s.arbiters[ai].moving[ki] && !self.cfg.on(Mutation::MoveWithoutDrain) {
            return;
        }
        let Serve::Serving(current) = s.arbiters[ai].serve[ci].clone() else { return };
        let own_hold = s.clusters[ci].store.holds[ki].filter(|h| h.lease == sess.lease);
        // The bound: successful grant transactions (a retry that finds its
        // own hold commits nothing).
        if s.budget.grants == 0 && own_hold.is_none() {
            return;
        }
        if answer_lost && (s.budget.lost_answers == 0 || own_hold.is_some()) {
            return;
        }
        let epoch = current.epoch;
        let highest_before = Self::highest_before(&s.arbiters[ai], ci, epoch);
        let st = &mut s.clusters[ci].store;
        // grant_txn compares:
        let hold_absent = st.holds[ki].is_none(); // create_revision(hold) = 0
        let epoch_same = st.epoch == current || self.cfg.on(Mutation::NoEpochCompare); // value(/sys/epoch) = bytes
        let session_same = st.has_session(sess.lease); // value(/s/<lease>) = session bytes
        let unsealed = !st.seal; // version(/sys/seal) = 0
        let undrained = !st.draining[ki]; // version(/sys/drain/<unit>) = 0
        if !(hold_absent && epoch_same && session_same && unsealed && undrained) {
            // The or_else reads, classified in `attempt_txn`'s order: a seal
            // (another arbiter sealed: re-check), the session record (a
            // refusal, nothing else), the epoch record (re-read it), else
            // the revision is observed and the hold read: held by another
            // session, or by this very session (a retried acquire: the same
            // hold, its token again).
            let a = &mut s.arbiters[ai];
            if !unsealed || (session_same && st.epoch != current) {
                Self::etcd_failed(a, ci);
                return;
            }
            // The range is draining here, or has moved away: refused
            // (retryable; the arbiter re-reads the map).
            if !session_same || !undrained {
                return;
            }
            Self::observe(a, ci, epoch, st.revision);
            let Some(hold) = st.holds[ki] else { return };
            if hold.lease != sess.lease || hold.epoch != epoch {
                return;
            }
            let t = token(hold.epoch, u64::from(hold.create_revision));
            let grant = Self::deliver(s, ci, ki, t, hold.grant);
            if let Some(h) = s.clusters[ci].store.holds[ki].as_mut() {
                h.grant = grant;
            }
            s.clients[cli].held[ki] = Some(Held {
                cluster: ci as u8,
                token: t,
                lease: sess.lease,
                create_revision: hold.create_revision,
                arbiter,
                grant,
                ended: false,
            });
            if client == 1 {
                s.waiter_granted = true;
            }
            return;
        }
        // then: put the hold on the session's lease.
        s.budget.grants -= 1;
        let st = &mut s.clusters[ci].store;
        let revision = Self::write(st);
        st.holds[ki] = Some(Hold { lease: sess.lease, create_revision: revision, epoch, grant: 0 });
        // The response: cluster ID equals the record's (always, here).
        let withhold = revision <= highest_before && !self.cfg.on(Mutation::NoSealCheck);
        let a = &mut s.arbiters[ai];
        if withhold {
            // Rewound: seal, and `withdraw_txn` (guarded like a release).
            a.serve[ci] = Serve::Sealed(epoch);
            if st.holds[ki].is_some_and(|h| h.lease == sess.lease && h.create_revision == revision) && st.has_session(sess.lease) {
                st.holds[ki] = None;
                Self::write(st);
            }
            return;
        }
        Self::observe(a, ci, epoch, revision);
        let minted = if self.cfg.on(Mutation::TokenFromCounter) {
            a.counter += 1;
            a.counter
        } else {
            revision
        };
        let t = token(epoch, u64::from(minted));
        if answer_lost {
            // The token never reaches anyone: it counts as issued when
            // the retry delivers it (ghost: grant 0 until then).
            s.budget.lost_answers -= 1;
            return;
        }
        let grant = Self::deliver(s, ci, ki, t, 0);
        if let Some(h) = s.clusters[ci].store.holds[ki].as_mut() {
            h.grant = grant;
        }
        s.clients[cli].held[ki] =
            Some(Held { cluster: ci as u8, token: t, lease: sess.lease, create_revision: revision, arbiter, grant, ended: false });
        if client == 1 {
            s.waiter_granted = true;
        }
    }

    /// Ghost history for the properties: token `t` reaches a client.
    /// `grant` is the grant it already is (a retry answered with a hold
    /// delivered before), or 0: a new grant in the key's order. Returns
    /// the grant's number.
    fn deliver(s: &mut State, ci: usize, ki: usize, t: u64, grant: u8) -> u8 {
        let cl = &mut s.clusters[ci];
        if cl.rewound || cl.store.seal {
            s.broken.sealed = true;
        }
        if cl.pre_restore_max > 0 && t <= cl.pre_restore_max {
            s.broken.reissue = true;
        }
        if grant > 0 {
            return grant;
        }
        cl.max_issued = cl.max_issued.max(t);
        let h = &mut s.keys[ki];
        if h.issued.contains(&t) {
            s.broken.twice = true;
        }
        if t <= h.last {
            s.broken.order = true;
        }
        h.issued.push(t);
        h.issued.sort_unstable();
        h.last = t;
        h.grants += 1;
        h.grants
    }

    /// `grant::release` → `txn::release_txn_for`.
    fn deliver_release(&self, s: &mut State, m: ReleaseMsg) {
        let (ci, ki) = (usize::from(m.cluster), usize::from(m.key));
        // "A token of another epoch names no hold that can still exist."
        if let Serve::Serving(r) = &s.arbiters[usize::from(m.arbiter)].serve[ci]
            && u64::from(r.epoch) != m.token >> REVISION_BITS
        {
            return;
        }
        let st = &mut s.clusters[ci].store;
        let Some(hold) = st.holds[ki] else { return };
        let guard = if self.cfg.on(Mutation::ReleaseUnguarded) {
            true // version(hold) > 0 only
        } else {
            hold.create_revision == m.create_revision // create_revision(hold) = rev
                && hold.lease == m.lease // lease(hold) = lease
                && st.has_session(m.lease) // version(/s/<lease>) > 0
        };
        if guard {
            st.holds[ki] = None;
            Self::write(st);
        }
    }

    /// The advance on `cluster`: `holdfastctl epoch advance-request`
    /// (target above `highest_known`), `refuse_served`, then
    /// `epoch::advance_txn_via` (coord `raise_allocator`, then the entity
    /// transaction), then `revoke_sessions`. Returns false if refused.
    fn advance(&self, s: &mut State, cluster: u8) -> bool {
        let ci = usize::from(cluster);
        let current = s.clusters[ci].store.epoch.clone();
        let allocated = s.clusters[ci].store.epochs;
        let coord = if self.shared_coord() { 0 } else { s.coord.epochs };
        // `arbiters_served`: every arbiter's ServerStatus report.
        let known = if self.cfg.on(Mutation::ForgetServedEpochs) {
            0
        } else {
            s.arbiters.iter().filter_map(|a| a.served[ci].as_ref().map(|r| r.epoch)).max().unwrap_or(0)
        };
        let by_one = self.cfg.on(Mutation::AdvanceByOne);
        let new_epoch = if by_one { current.epoch + 1 } else { current.epoch.max(allocated).max(coord).max(known) + 1 };
        if !by_one {
            // refuse_served; advance_txn_via: NotAbove, Allocated (own and
            // coord's allocator).
            if known >= new_epoch || new_epoch <= current.epoch || allocated >= new_epoch || coord >= new_epoch {
                return false;
            }
        }
        // raise_allocator on coord (compare mod_revision; put highest).
        if !self.shared_coord() {
            s.coord.revision += 1;
            s.coord.epochs = new_epoch;
            s.coord.epochs_mod_revision = s.coord.revision;
        }
        let mint = s.next_mint;
        s.next_mint += 1;
        let cl = &mut s.clusters[ci];
        let floor = cl.log_offset; // measured_floor
        let st = &mut cl.store;
        // compares: value(/sys/epoch) = bytes, mod_revision(/sys/epochs) =
        // seen: true, the step is atomic. Then:
        let rev = Self::write(st);
        st.epoch = EpochRecord { epoch: new_epoch, cluster_id: current.cluster_id, log_floor: floor, mint };
        st.epochs = new_epoch;
        st.epochs_mod_revision = rev;
        st.seal = false; // delete /sys/seal (and /sys/watermark)
        let old: Vec<u8> = st.sessions.clone();
        st.holds.iter_mut().for_each(|h| *h = None); // delete /l/ prefix
        st.sessions.clear(); // delete /s/ prefix
        // revoke_sessions: the old sessions' leases.
        st.leases.retain(|l| !old.contains(&l.id));
        cl.rewound = false;
        for c in &mut s.clients {
            for h in c.held.iter_mut().flatten() {
                if usize::from(h.cluster) == ci {
                    h.ended = true;
                }
            }
        }
        true
    }

    fn step(&self, s: &mut State, action: &Action) {
        let clock = self.cfg.clock;
        match *action {
            Action::Check { arbiter, cluster } => self.check(s, arbiter, cluster),
            Action::Crash { arbiter } => {
                if s.budget.crashes == 0 {
                    return;
                }
                let a = &mut s.arbiters[usize::from(arbiter)];
                let before = a.clone();
                a.serve.iter_mut().for_each(|x| *x = Serve::Unverified);
                a.highest.iter_mut().for_each(|h| *h = (0, 0));
                a.counter = 0;
                // It reads the map afresh as it starts.
                Self::read_map(a, &s.coord);
                if *a != before {
                    s.budget.crashes -= 1;
                }
            }
            Action::Acquire { client, arbiter, key, answer_lost } => {
                // Liveness: the holder releases or stops; only the waiter asks.
                if self.cfg.scenario == Scenario::Liveness && client != 1 {
                    return;
                }
                if client == 1 && !self.cfg.waiter_polls && s.clients[0].held[0].is_none() {
                    return;
                }
                self.acquire(s, client, arbiter, key, answer_lost)
            }
            Action::Release { client, key } => {
                let c = &mut s.clients[usize::from(client)];
                if c.stopped {
                    return;
                }
                let Some(h) = c.held[usize::from(key)].take() else { return };
                let msg = ReleaseMsg {
                    client,
                    key,
                    cluster: h.cluster,
                    arbiter: h.arbiter,
                    lease: h.lease,
                    create_revision: h.create_revision,
                    token: h.token,
                };
                if !s.net.contains(&msg) {
                    s.net.push(msg);
                    s.net.sort();
                }
            }
            Action::DeliverRelease { msg, retry } => {
                let Some(i) = s.net.iter().position(|m| *m == msg) else { return };
                if retry {
                    if s.budget.redeliveries == 0 {
                        return;
                    }
                    s.budget.redeliveries -= 1;
                } else {
                    s.net.remove(i);
                }
                self.deliver_release(s, msg);
            }
            Action::Write { client, key } => {
                let Some(h) = s.clients[usize::from(client)].held[usize::from(key)] else { return };
                let mark = &mut s.resource[usize::from(key)];
                // The reference fence: UPDATE .. WHERE fence < $token.
                let accept = mark.is_none_or(|m| m.token < h.token);
                if accept {
                    if let Some(m) = mark
                        && h.grant < m.grant
                    {
                        s.broken.fence = true;
                    }
                    *mark = Some(Mark { token: h.token, grant: h.grant });
                }
            }
            Action::Fence { client, cluster } => {
                let ci = usize::from(cluster);
                let Some(sess) = s.clients[usize::from(client)].sessions[ci] else { return };
                let gone = s.clusters[ci].store.lease(sess.lease).is_none();
                let passed = clock && s.now >= sess.deadline;
                if !(gone || passed) {
                    return;
                }
                let c = &mut s.clients[usize::from(client)];
                c.sessions[ci] = None;
                for h in c.held.iter_mut() {
                    if h.is_some_and(|h| usize::from(h.cluster) == ci) {
                        *h = None;
                    }
                }
            }
            Action::OpenSession { client, cluster } => {
                let ci = usize::from(cluster);
                let c = &s.clients[usize::from(client)];
                if c.stopped || c.sessions[ci].is_some() || s.budget.sessions == 0 {
                    return;
                }
                s.budget.sessions -= 1;
                let id = s.next_lease;
                s.next_lease += 1;
                let st = &mut s.clusters[ci].store;
                st.leases.push(Lease { id, expiry: s.now + self.cfg.ttl });
                st.sessions.push(id);
                Self::write(st);
                s.clients[usize::from(client)].sessions[ci] =
                    Some(Session { lease: id, deadline: s.now + self.cfg.ttl - self.cfg.fence_margin, keepalive: None });
            }
            Action::KeepaliveSend { client, cluster } => {
                let now = s.now;
                let c = &mut s.clients[usize::from(client)];
                if c.stopped {
                    return;
                }
                if let Some(sess) = c.sessions[usize::from(cluster)].as_mut()
                    && sess.keepalive.is_none()
                    && now < sess.deadline
                {
                    sess.keepalive = Some(Keepalive { sent_at: now, answer: None });
                }
            }
            Action::KeepaliveAtLeader { client, cluster } => {
                // `renewal::Renewer::renew` → etcd `LeaseKeepAlive` at the
                // leader: `lessor.Renew` sets the expiry to now + TTL. The
                // answer's header carries the leader's term; the arbiter's
                // quorum read (`Confirmer::term_after`) is taken at once,
                // before the term can move (the most a keepalive can count).
                let ci = usize::from(cluster);
                let now = s.now;
                let ttl = self.cfg.ttl;
                let Some(sess) = s.clients[usize::from(client)].sessions[ci] else { return };
                let Some(ka) = sess.keepalive.filter(|k| k.answer.is_none()) else { return };
                let cl = &mut s.clusters[ci];
                let answer = match cl.store.leases.iter_mut().find(|l| l.id == sess.lease) {
                    Some(l) => {
                        l.expiry = now + ttl;
                        // acked_term = the leader's term = the read's term.
                        Renewal::Renewed { confirmed: true }
                    }
                    None => Renewal::Gone,
                };
                if let Some(x) = s.clients[usize::from(client)].sessions[ci].as_mut() {
                    x.keepalive = Some(Keepalive { answer: Some(answer), ..ka });
                }
            }
            Action::KeepaliveAtDeposed { client, cluster } => {
                // The keepalive stream reaches the deposed leader: its
                // `lessor.Renew` renews a lease it holds unexpired in its
                // own memory (an expired one waits for a revoke that never
                // comes: no answer, as a lost keepalive), and answers in its
                // old term. The real lease (the current leader's) is not
                // extended. `LockService::renew` counts the answer only if
                // `Confirmer::term_after(sent_at) == acked_term`: the quorum
                // read reports the current term, never the deposed one.
                let ci = usize::from(cluster);
                let now = s.now;
                let ttl = self.cfg.ttl;
                let unconfirmed_counts = self.cfg.on(Mutation::NoKeepaliveConfirmation);
                let Some(sess) = s.clients[usize::from(client)].sessions[ci] else { return };
                let Some(ka) = sess.keepalive.filter(|k| k.answer.is_none()) else { return };
                let cl = &mut s.clusters[ci];
                let current_term = cl.term;
                let Some(d) = cl.deposed.as_mut() else { return };
                let answer = match d.leases.iter_mut().find(|l| l.id == sess.lease) {
                    Some(l) if now < l.expiry => {
                        l.expiry = now + ttl;
                        Renewal::Renewed { confirmed: unconfirmed_counts || d.term == current_term }
                    }
                    Some(_) => return,
                    // Granted after it stalled: ErrLeaseNotFound.
                    None => Renewal::Gone,
                };
                if let Some(x) = s.clients[usize::from(client)].sessions[ci].as_mut() {
                    x.keepalive = Some(Keepalive { answer: Some(answer), ..ka });
                }
            }
            Action::KeepaliveAnswer { client, cluster } => {
                let now = s.now;
                let receive_time = self.cfg.on(Mutation::DeadlineFromReceiveTime);
                let (ttl, margin) = (self.cfg.ttl, self.cfg.fence_margin);
                let c = &mut s.clients[usize::from(client)];
                let Some(sess) = c.sessions[usize::from(cluster)].as_mut() else { return };
                let Some(ka) = sess.keepalive else { return };
                match ka.answer {
                    None => return,
                    // `Round::Acked(sent_at)`.
                    Some(Renewal::Renewed { confirmed: true }) => {
                        // `fence_deadline(fence_anchor(sent_at), ttl)`.
                        let from = if receive_time { now } else { ka.sent_at };
                        let deadline = from + ttl - margin;
                        // An answer read after the deadline it sets: lost.
                        if deadline > now {
                            sess.deadline = deadline;
                        }
                    }
                    // Renewed in an unconfirmed term: `Round::Failed`, the
                    // deadline stays.
                    Some(Renewal::Renewed { confirmed: false }) => {}
                    // `Round::Gone`.
                    Some(Renewal::Gone) => sess.deadline = now,
                }
                sess.keepalive = None;
            }
            Action::KeepaliveLost { client, cluster } => {
                if let Some(sess) = s.clients[usize::from(client)].sessions[usize::from(cluster)].as_mut() {
                    sess.keepalive = None;
                }
            }
            Action::Stop { client } => {
                // Liveness: the waiter never stops (fairness to it).
                let waiter = self.cfg.scenario == Scenario::Liveness && client == 1;
                if waiter || s.budget.stops == 0 || s.clients[usize::from(client)].stopped {
                    return;
                }
                s.budget.stops -= 1;
                s.clients[usize::from(client)].stopped = true;
            }
            Action::Tick => {
                if s.budget.ticks == 0 {
                    return;
                }
                s.budget.ticks -= 1;
                s.now += 1;
            }
            Action::LeaderChange { cluster } => {
                if s.budget.leader_changes == 0 {
                    return;
                }
                s.budget.leader_changes -= 1;
                let now = s.now;
                let ttl = self.cfg.ttl;
                let cl = &mut s.clusters[usize::from(cluster)];
                // The old leader's Raft loop stalls (its disk: etcd #15247);
                // its lessor keeps its expiries and stays primary. (A leader
                // deposed earlier has learned it by now.)
                cl.deposed = Some(Deposed { term: cl.term, leases: cl.store.leases.clone() });
                cl.term += 1;
                // The new leader's `lessor.Promote(extend)`: every lease's
                // expiry refreshed to now + TTL + extend (extend, the
                // election timeout, taken as 0: the shortest). Every expiry
                // was set at or before now to at most its time + TTL, so
                // leases only lengthen.
                cl.store.leases.iter_mut().for_each(|l| l.expiry = l.expiry.max(now + ttl));
            }
            Action::Expire { cluster, lease } => {
                let ci = usize::from(cluster);
                let now = s.now;
                let Some(l) = s.clusters[ci].store.lease(lease).copied() else { return };
                let due = if clock {
                    now >= l.expiry
                } else {
                    // No clock: a lease expires once its client stopped
                    // renewing it.
                    s.clients.iter().any(|c| c.stopped && c.sessions.iter().flatten().any(|x| x.lease == lease))
                };
                if !due {
                    return;
                }
                let st = &mut s.clusters[ci].store;
                st.leases.retain(|x| x.id != lease);
                st.sessions.retain(|x| *x != lease);
                st.holds.iter_mut().for_each(|h| {
                    if h.is_some_and(|h| h.lease == lease) {
                        *h = None
                    }
                });
                Self::write(st);
            }
            Action::Snapshot { cluster } => {
                if s.budget.snapshots == 0 {
                    return;
                }
                s.budget.snapshots -= 1;
                let cl = &mut s.clusters[usize::from(cluster)];
                let snap = cl.store.clone();
                cl.snapshots.push(snap);
            }
            Action::Restore { cluster, snapshot } => {
                let ci = usize::from(cluster);
                if s.budget.restores == 0 {
                    return;
                }
                let Some(snap) = s.clusters[ci].snapshots.get(usize::from(snapshot)).cloned() else { return };
                s.budget.restores -= 1;
                let now = s.now;
                let cl = &mut s.clusters[ci];
                cl.pre_restore_max = cl.pre_restore_max.max(cl.max_issued);
                cl.store = snap;
                // Restored leases get their TTL again.
                cl.store.leases.iter_mut().for_each(|l| l.expiry = now + self.cfg.ttl);
                // Every member was restarted: no deposed leader survives.
                cl.deposed = None;
                // The new log starts near index 0; the revision is kept.
                cl.log_offset = -(cl.store.revision as i16);
                cl.rewound = true;
                // The cluster was down: every arbiter's calls to it failed
                // (`Guard::etcd_failed`) before any reached the restored one.
                for a in s.arbiters.iter_mut().filter(|_| self.cfg.restore_breaks_connections) {
                    Self::etcd_failed(a, ci);
                }
            }
            Action::Advance { cluster } => {
                if s.budget.advances == 0 {
                    return;
                }
                if self.advance(s, cluster) {
                    s.budget.advances -= 1;
                }
            }
            Action::MoveDrain { key } => {
                let ki = usize::from(key);
                if s.budget.moves == 0 || s.coord.moving[ki].is_some() {
                    return;
                }
                s.budget.moves -= 1;
                let from = s.coord.map[ki];
                let to = (from + 1) % self.cfg.clusters;
                // The drain marker on the source first (`/sys/drain/<unit>`):
                // from here no grant of the range commits there, whatever
                // map an arbiter holds. Then the map says draining.
                if !self.cfg.on(Mutation::MoveWithoutDrain) && !self.cfg.on(Mutation::DrainByMapOnly) {
                    let st = &mut s.clusters[usize::from(from)].store;
                    st.draining[ki] = true;
                    Self::write(st);
                }
                s.coord.moving[ki] = Some(Move { to, advanced: false });
                s.coord.revision += 1;
            }
            Action::MoveAdvance { key } => {
                let ki = usize::from(key);
                let Some(m) = s.coord.moving[ki] else { return };
                if m.advanced || self.cfg.on(Mutation::MoveWithoutAdvance) {
                    return;
                }
                let from = usize::from(s.coord.map[ki]);
                // Wait: no hold of the range on the source.
                if !self.cfg.on(Mutation::MoveWithoutDrain) && s.clusters[from].store.holds[ki].is_some() {
                    return;
                }
                // Allocate a destination epoch above everything (coord) and
                // advance the destination with it.
                if !self.advance(s, m.to) {
                    return;
                }
                s.coord.moving[ki] = Some(Move { advanced: true, ..m });
                s.coord.revision += 1;
            }
            Action::MoveFlip { key } => {
                let ki = usize::from(key);
                let Some(m) = s.coord.moving[ki] else { return };
                if !m.advanced && !self.cfg.on(Mutation::MoveWithoutAdvance) {
                    return;
                }
                if self.cfg.on(Mutation::MoveWithoutAdvance) {
                    let from = usize::from(s.coord.map[ki]);
                    if s.clusters[from].store.holds[ki].is_some() {
                        return; // still waits for the range to drain
                    }
                }
                // A range moving back to a cluster it left: its old drain
                // marker there goes before the map says so.
                let dest = &mut s.clusters[usize::from(m.to)].store;
                if dest.draining[ki] {
                    dest.draining[ki] = false;
                    Self::write(dest);
                }
                s.coord.map[ki] = m.to;
                s.coord.moving[ki] = None;
                s.coord.revision += 1;
            }
            Action::MapDelivered { arbiter } => {
                let a = &mut s.arbiters[usize::from(arbiter)];
                Self::read_map(a, &s.coord);
            }
        }
    }

    pub fn describe(&self, action: &Action) -> String {
        match *action {
            Action::Check { arbiter, cluster } => format!("arbiter {} checks cluster {}", arb_name(arbiter), cluster_name(cluster)),
            Action::Crash { arbiter } => format!("arbiter {} crashes and restarts (disk kept)", arb_name(arbiter)),
            Action::Acquire { client, arbiter, key, answer_lost } => format!(
                "client {client} acquires key {key} through arbiter {}{}",
                arb_name(arbiter),
                if answer_lost { "; the answer is lost" } else { "" }
            ),
            Action::Release { client, key } => format!("client {client} sends a release of key {key}"),
            Action::DeliverRelease { msg, retry } => format!(
                "arbiter {} runs client {}'s release of key {} ({}){}",
                arb_name(msg.arbiter),
                msg.client,
                msg.key,
                show_token(msg.token),
                if retry { "; the answer is lost, the request will be retried" } else { "" }
            ),
            Action::Write { client, key } => format!("client {client} writes record {key} of the resource with its token"),
            Action::Fence { client, cluster } => format!("client {client} fences its session on {}", cluster_name(cluster)),
            Action::OpenSession { client, cluster } => format!("client {client} opens a new session on {}", cluster_name(cluster)),
            Action::KeepaliveSend { client, cluster } => format!("client {client} sends a keepalive ({})", cluster_name(cluster)),
            Action::KeepaliveAtLeader { client, cluster } => {
                format!("the leader of {} renews client {client}'s lease", cluster_name(cluster))
            }
            Action::KeepaliveAtDeposed { client, cluster } => {
                format!("the deposed leader of {} renews client {client}'s lease in its memory", cluster_name(cluster))
            }
            Action::KeepaliveAnswer { client, cluster } => {
                format!("client {client} reads its keepalive answer ({})", cluster_name(cluster))
            }
            Action::KeepaliveLost { client, cluster } => format!("client {client}'s keepalive to {} is lost", cluster_name(cluster)),
            Action::Stop { client } => format!("client {client} stops (crash or endless pause)"),
            Action::Tick => "time passes".into(),
            Action::LeaderChange { cluster } => {
                format!("{} elects a new leader; the old one stalls, still answering keepalives", cluster_name(cluster))
            }
            Action::Expire { cluster, lease } => format!("{} expires lease {lease}", cluster_name(cluster)),
            Action::Snapshot { cluster } => format!("operator snapshots {}", cluster_name(cluster)),
            Action::Restore { cluster, snapshot } => {
                format!("operator restores {} from snapshot {snapshot} (same cluster token)", cluster_name(cluster))
            }
            Action::Advance { cluster } => format!("two-person epoch advance of {}", cluster_name(cluster)),
            Action::MoveDrain { key } => format!("rebalancer starts moving key {key}: drain"),
            Action::MoveAdvance { key } => format!("rebalancer waits for key {key} to drain, advances the destination epoch"),
            Action::MoveFlip { key } => format!("rebalancer flips the shard map for key {key}"),
            Action::MapDelivered { arbiter } => format!("arbiter {}'s watch delivers the shard map", arb_name(arbiter)),
        }
    }
}

impl Model for ProtocolModel {
    type State = State;
    type Action = Action;

    fn init_states(&self) -> Vec<State> {
        vec![self.initial()]
    }

    fn actions(&self, s: &State, out: &mut Vec<Action>) {
        let c = &self.cfg;
        // A state that broke a safety property ends its trace.
        if s.broken != Broken::default() || !self.at_most_one_live_holder(s) {
            return;
        }
        for arbiter in 0..c.arbiters {
            for cluster in 0..c.clusters {
                out.push(Action::Check { arbiter, cluster });
            }
            if s.budget.crashes > 0 {
                out.push(Action::Crash { arbiter });
            }
        }
        for client in 0..c.clients {
            for key in 0..c.keys {
                for arbiter in 0..c.arbiters {
                    // The lost answer first: when both end a counterexample,
                    // Stateright keeps the later one, the plain grant.
                    if s.budget.lost_answers > 0 {
                        out.push(Action::Acquire { client, arbiter, key, answer_lost: true });
                    }
                    out.push(Action::Acquire { client, arbiter, key, answer_lost: false });
                }
                if s.clients[usize::from(client)].held[usize::from(key)].is_some() {
                    out.push(Action::Release { client, key });
                    if c.writes {
                        out.push(Action::Write { client, key });
                    }
                }
            }
            for cluster in 0..c.clusters {
                out.push(Action::Fence { client, cluster });
                if s.budget.sessions > 0 {
                    out.push(Action::OpenSession { client, cluster });
                }
                if c.clock && client < c.renewers {
                    out.push(Action::KeepaliveSend { client, cluster });
                    out.push(Action::KeepaliveAtLeader { client, cluster });
                    if s.clusters[usize::from(cluster)].deposed.is_some() {
                        out.push(Action::KeepaliveAtDeposed { client, cluster });
                    }
                    out.push(Action::KeepaliveAnswer { client, cluster });
                    out.push(Action::KeepaliveLost { client, cluster });
                }
            }
            if s.budget.stops > 0 {
                out.push(Action::Stop { client });
            }
        }
        for m in &s.net {
            out.push(Action::DeliverRelease { msg: *m, retry: false });
            if s.budget.redeliveries > 0 {
                out.push(Action::DeliverRelease { msg: *m, retry: true });
            }
        }
        if c.clock && s.budget.ticks > 0 {
            out.push(Action::Tick);
        }
        for (ci, cl) in s.clusters.iter().enumerate() {
            let cluster = ci as u8;
            for l in &cl.store.leases {
                out.push(Action::Expire { cluster, lease: l.id });
            }
            if s.budget.snapshots > 0 {
                out.push(Action::Snapshot { cluster });
            }
            if s.budget.restores > 0 {
                for snapshot in 0..cl.snapshots.len() {
                    out.push(Action::Restore { cluster, snapshot: snapshot as u8 });
                }
            }
            if s.budget.advances > 0 {
                out.push(Action::Advance { cluster });
            }
            if s.budget.leader_changes > 0 {
                out.push(Action::LeaderChange { cluster });
            }
        }
        for key in 0..c.keys {
            if s.budget.moves > 0 {
                out.push(Action::MoveDrain { key });
            }
            if s.coord.moving[usize::from(key)].is_some() {
                out.push(Action::MoveAdvance { key });
                out.push(Action::MoveFlip { key });
            }
        }
        for (ai, a) in s.arbiters.iter().enumerate() {
            if !Self::map_current(a, &s.coord) {
                out.push(Action::MapDelivered { arbiter: ai as u8 });
            }
        }
    }

    fn next_state(&self, last: &State, action: Action) -> Option<State> {
        let mut s = last.clone();
        self.step(&mut s, &action);
        if s == *last { None } else { Some(s) }
    }

    fn format_action(&self, action: &Action) -> String {
        self.describe(action)
    }

    fn properties(&self) -> Vec<Property<Self>> {
        let mut p = vec![
            Property::always(TOKENS_INCREASE, |_, s: &State| !s.broken.order),
            Property::always(NO_TOKEN_TWICE, |_, s: &State| !s.broken.twice),
            Property::always(NO_TWO_LIVE_HOLDERS, |m: &ProtocolModel, s: &State| m.at_most_one_live_holder(s)),
            Property::always(FENCE_HOLDS, |_, s: &State| !s.broken.fence),
            Property::always(NO_GRANT_WHILE_SEALED, |_, s: &State| !s.broken.sealed),
            Property::always(NO_REISSUE_AFTER_RESTORE, |_, s: &State| !s.broken.reissue),
        ];
        if self.cfg.scenario == Scenario::Liveness {
            p.push(Property::eventually(WAITER_GRANTED, |_, s: &State| s.waiter_granted));
        }
        p
    }
}

impl ProtocolModel {
    /// No two clients believe they hold a key, both inside their deadlines,
    /// unless the older hold was ended by an epoch advance (which by design
    /// ends holds at once; the token fences the old holder).
    pub fn at_most_one_live_holder(&self, s: &State) -> bool {
        for k in 0..usize::from(self.cfg.keys) {
            let live = s
                .clients
                .iter()
                .enumerate()
                .filter(|(ci, c)| c.held[k].is_some_and(|h| !h.ended && self.inside_deadline(s, *ci as u8, h.cluster, h.lease)))
                .count();
            if live > 1 {
                return false;
            }
        }
        true
    }
}
