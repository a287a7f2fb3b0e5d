//! The state the checker explores: etcd clusters as linearizable stores with
//! revisions and leases, the coord cluster, the arbiters (memory and disk),
//! the clients, the network, the fenced resource, and the ghost history the
//! properties read.

/// `holdfast_model::token::REVISION_BITS`.
pub const REVISION_BITS: u32 = 48;

/// `holdfast_model::Token::new`: `epoch << 48 | revision`.
pub fn token(epoch: u32, revision: u64) -> u64 {
    (u64::from(epoch) << REVISION_BITS) | revision
}

/// A token as `e<epoch>r<revision>` for traces.
pub fn show_token(t: u64) -> String {
    format!("e{}r{}", t >> REVISION_BITS, t & ((1 << REVISION_BITS) - 1))
}

/// `holdfast_model::layout::EpochRecord` (`/sys/epoch`): field for field.
/// Arbiters compare it by value (the grant compares its bytes; `served.rs`
/// compares the whole record).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct EpochRecord {
    pub epoch: u32,
    /// The etcd cluster ID it was minted for. A restore with the same
    /// cluster token keeps the ID, so the model never changes it: the seal
    /// must come from the log position.
    pub cluster_id: u8,
    /// `log_floor`: the log offset (applied index − revision) measured when
    /// the epoch was minted (`holdfast_model::seal`).
    pub log_floor: i16,
    /// `mint`: a fresh random value per advance (here a counter).
    pub mint: u8,
}

/// A hold `/l/<ns>/<key>`: put on the session's lease; its create revision
/// is the token's revision.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Hold {
    pub lease: u8,
    pub create_revision: u16,
    /// `HoldRecord::epoch`: the epoch it was granted in.
    pub epoch: u32,
    /// Ghost: the grant it is (its place in the key's grant order); 0 while
    /// its answer was lost and no retry has delivered it.
    pub grant: u8,
}

/// An etcd lease and the time it expires at (the leader's view: etcd's
/// lessor keeps expiries in the leader's memory only, `server/lease/lessor.go`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Lease {
    pub id: u8,
    pub expiry: u8,
}

/// One etcd cluster's key space: everything a snapshot holds.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Store {
    /// The MVCC revision (header.revision of the last write).
    pub revision: u16,
    /// `/sys/epoch`.
    pub epoch: EpochRecord,
    /// `/sys/seal` present.
    pub seal: bool,
    /// `/sys/epochs` (this cluster's own allocator: `EpochsRecord::highest`)
    /// and its mod revision. With `separate_coord = false` it is also the
    /// coord tier's allocator (the MVP: both tiers on one cluster).
    pub epochs: u32,
    pub epochs_mod_revision: u16,
    /// `/l/<key>` per key.
    pub holds: Vec<Option<Hold>>,
    /// The drain marker of each key's range (`/sys/drain/<unit>`), written
    /// by the rebalancer on a move's source before it waits; the grant
    /// transaction compares it absent. It stays once the range has moved
    /// away (an arbiter with a stale map must still be refused here), and
    /// goes when a range moves back.
    pub draining: Vec<bool>,
    /// `/s/<lease>` session records present (sorted lease IDs).
    pub sessions: Vec<u8>,
    /// Live leases (sorted by ID).
    pub leases: Vec<Lease>,
}

impl Store {
    pub fn lease(&self, id: u8) -> Option<&Lease> {
        self.leases.iter().find(|l| l.id == id)
    }
    pub fn has_session(&self, lease: u8) -> bool {
        self.sessions.contains(&lease)
    }
}

/// An etcd cluster: its store, its Raft log position, the snapshots an
/// operator took, and ghost facts for the properties.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Cluster {
    pub store: Store,
    /// applied index − revision. Every committed write raises both by one;
    /// a restore drops the index to ~0 and keeps the snapshot's revision.
    pub log_offset: i16,
    pub snapshots: Vec<Store>,
    /// Ghost: restored and not yet advanced (the protocol must be sealed).
    pub rewound: bool,
    /// Ghost: the highest token issued on this cluster so far.
    pub max_issued: u64,
    /// Ghost: the highest token issued here before the latest restore.
    pub pre_restore_max: u64,
    /// The Raft term of the current leader (the term a quorum read reports:
    /// `ResponseHeader::raft_term`).
    pub term: u8,
    /// The leader of an earlier term that has not learned it was deposed
    /// (its disk stalls: etcd #15247), and still answers keepalives.
    pub deposed: Option<Deposed>,
}

/// A deposed etcd leader whose Raft loop is stalled while its gRPC serves:
/// its lessor still believes it is primary and renews leases in its own
/// memory, in its old term. Nothing it does reaches the log.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Deposed {
    /// The term it led (and answers in).
    pub term: u8,
    /// Its lessor's leases and expiries: those it had when it was deposed,
    /// as it has renewed them since.
    pub leases: Vec<Lease>,
}

/// A key move in progress (the rebalancer's record on coord).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Move {
    pub to: u8,
    /// The destination's epoch was advanced above the source's.
    pub advanced: bool,
}

/// The coord cluster: the epoch allocator and the shard map.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Coord {
    /// `/sys/epochs` on coord and its mod revision (unused when both tiers
    /// share a cluster: then the entity store's allocator is the coord one).
    pub epochs: u32,
    pub epochs_mod_revision: u16,
    pub revision: u16,
    /// `/sys/shardmap`: the home cluster of each key.
    pub map: Vec<u8>,
    /// A move of the key in progress (its range is draining).
    pub moving: Vec<Option<Move>>,
}

/// `holdfast_arbiter::seal::Serve` (per cluster).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Serve {
    Unverified,
    Serving(EpochRecord),
    /// Sealed in this epoch: only a record of another epoch lifts it.
    Sealed(u32),
}

/// An arbiter: memory (lost on a crash) and disk (kept).
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Arbiter {
    /// Per cluster.
    pub serve: Vec<Serve>,
    /// `Guard::highest`: (epoch, highest revision seen in it), per cluster.
    pub highest: Vec<(u32, u16)>,
    /// Disk: `served-epochs.json`, the highest record served per cluster.
    pub served: Vec<Option<EpochRecord>>,
    /// Memory: the local counter of the `token_from_counter` mutation.
    pub counter: u16,
    /// Memory: the shard map as this arbiter's watch last delivered it
    /// (each key's home, and whether its range is draining): it may lag
    /// behind coord's.
    pub map: Vec<u8>,
    pub moving: Vec<bool>,
}

/// A keepalive in flight.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Keepalive {
    pub sent_at: u8,
    /// None: not yet answered by etcd.
    pub answer: Option<Renewal>,
}

/// What the arbiter answers a keepalive with (`KeepAliveResponse`), once
/// etcd answered it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Renewal {
    /// Renewed (`ttl_millis > 0`); `confirmed`: the term etcd answered in
    /// is the term a quorum read issued after the send reports
    /// (`Confirmer::term_after(sent_at) == acked_term`).
    Renewed { confirmed: bool },
    /// The lease is gone (`ttl_millis = 0`).
    Gone,
}

/// A client's session on one cluster (`holdfast_client::session`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Session {
    pub lease: u8,
    /// Local deadline: send time of the last confirmed keepalive + TTL −
    /// margin.
    pub deadline: u8,
    pub keepalive: Option<Keepalive>,
}

/// A hold as the client knows it (`holdfast_client::Hold`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Held {
    pub cluster: u8,
    pub token: u64,
    pub lease: u8,
    pub create_revision: u16,
    pub arbiter: u8,
    /// Ghost: this grant's place in the key's grant order (1, 2, ...).
    pub grant: u8,
    /// Ghost: ended by an epoch advance (which ends holds at once, by
    /// design, without waiting for deadlines).
    pub ended: bool,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Client {
    pub sessions: Vec<Option<Session>>,
    pub held: Vec<Option<Held>>,
    /// Crashed or paused for good: sends nothing more (its leases expire).
    pub stopped: bool,
}

/// A release request in the network (can be delayed, reordered, lost and,
/// when its answer is lost, retried).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ReleaseMsg {
    pub client: u8,
    pub key: u8,
    pub cluster: u8,
    pub arbiter: u8,
    pub lease: u8,
    pub create_revision: u16,
    pub token: u64,
}

/// The fenced resource's mark for one record (one record per key).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Mark {
    pub token: u64,
    /// Ghost: the grant whose token it is.
    pub grant: u8,
}

/// Ghost history of one key's grants.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Default)]
pub struct KeyHistory {
    pub grants: u8,
    pub last: u64,
    pub issued: Vec<u64>,
}

/// Ghost: which safety property a step broke (sticky).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub struct Broken {
    pub order: bool,
    pub twice: bool,
    pub fence: bool,
    pub sealed: bool,
    pub reissue: bool,
}

/// What the environment may still do (the bound of the model).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub struct Budget {
    pub snapshots: u8,
    pub restores: u8,
    pub advances: u8,
    pub moves: u8,
    pub sessions: u8,
    pub redeliveries: u8,
    pub crashes: u8,
    pub stops: u8,
    pub ticks: u8,
    /// Grant answers lost on the way to the client (it retries).
    pub lost_answers: u8,
    /// etcd leader elections.
    pub leader_changes: u8,
    /// Successful grant transactions left.
    pub grants: u8,
}

#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct State {
    pub now: u8,
    pub clusters: Vec<Cluster>,
    pub coord: Coord,
    pub arbiters: Vec<Arbiter>,
    pub clients: Vec<Client>,
    pub net: Vec<ReleaseMsg>,
    pub resource: Vec<Option<Mark>>,
    pub keys: Vec<KeyHistory>,
    pub broken: Broken,
    pub budget: Budget,
    pub next_lease: u8,
    pub next_mint: u8,
    /// Ghost for the liveness property: client 1 was granted.
    pub waiter_granted: bool,
}
