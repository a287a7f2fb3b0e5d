//! The epoch record: reading it, initialising a new cluster, and the advance
//! transaction that ends a seal.
//!
//! Operators reach the advance through the two-person signed procedure
//! (`holdfastctl epoch advance`, the `holdfast-epoch-advance@` unit): that
//! is [`advance_to`] with the request's target epoch and its nonce, which the
//! same transaction records so the request cannot run twice.

use crate::etcd::{Etcd, MemberStatus};
use etcd_client::{Compare, CompareOp, DeleteOptions, GetOptions, Txn, TxnOp, TxnOpResponse};
use holdfast_model::layout::{self, EpochRecord, EpochsRecord, SealRecord, WatermarkRecord};
use holdfast_model::seal::{self, LogPosition};
use holdfast_model::token::MAX_EPOCH;

#[derive(Debug, thiserror::Error)]
pub enum EpochError {
    #[error("etcd: {0}")]
    Etcd(#[from] etcd_client::Error),
    #[error("the epoch is already initialised (epoch {0}); nothing was changed")]
    AlreadyInitialised(u32),
    #[error("the epoch is not initialised; run `holdfastctl epoch init` first")]
    NotInitialised,
    #[error(
        "the current epoch is {actual}, not the expected {expected}; re-read `holdfastctl epoch status` and retry with the current epoch"
    )]
    Mismatch { expected: u32, actual: u32 },
    #[error("epoch {0} is the last one that fits in a token; this cluster cannot be advanced further")]
    Exhausted(u32),
    #[error("not enough etcd members answered Status ({0}); every member must be reachable to measure the log position")]
    Members(String),
    #[error("the record changed while we worked (another operator?); nothing was changed, retry")]
    Raced,
    #[error("this request was already carried out (its nonce is recorded at {0}); nothing was changed")]
    NonceUsed(String),
    #[error(
        "the cluster reports cluster ID {actual}, but the request names {expected}; nothing was changed: request again for this cluster"
    )]
    WrongCluster { expected: u64, actual: u64 },
    #[error("the new epoch {new} is not above the current {current}; nothing was changed")]
    NotAbove { new: u32, current: u32 },
    #[error(
        "epoch {highest} was already allocated ({key}), so epoch {new} could be issued twice; nothing was changed: request again (the new request asks for an epoch above {highest})"
    )]
    Allocated { new: u32, highest: u32, key: &'static str },
    #[error(
        "epoch {epoch} is allocated on the coord cluster (and this request's nonce recorded there), but the entity cluster's epoch record changed before it could be written; the entity cluster was not changed: write a new request (it asks for an epoch above {epoch})"
    )]
    Spent { epoch: u32 },
    #[error(
        "epoch {new} is more than {step} above {highest}, the highest epoch known now; nothing was changed: write a new request (it asks for {})",
        highest + 1
    )]
    TooFar { new: u32, highest: u32, step: u32 },
    #[error("no random number from the OS for the epoch's mint: {0}")]
    Random(String),
    #[error("{0}")]
    Malformed(String),
}

/// Everything under `/sys` that decides whether the arbiter may serve, read
/// in one linearizable transaction.
#[derive(Debug, Clone)]
pub struct SysState {
    pub epoch: Option<(EpochRecord, Vec<u8>)>,
    pub seal: Option<SealRecord>,
    /// The watermark and its mod revision (0 when absent).
    pub watermark: (Option<WatermarkRecord>, i64),
    pub revision: i64,
    pub cluster_id: u64,
}

pub async fn read_sys(etcd: &Etcd) -> Result<SysState, EpochError> {
    let txn = Txn::new().and_then([
        TxnOp::get(layout::EPOCH_KEY, None),
        TxnOp::get(layout::SEAL_KEY, None),
        TxnOp::get(layout::WATERMARK_KEY, None),
    ]);
    let resp = etcd.txn(txn).await?;
    let header = resp.header().cloned();
    let mut gets = resp.op_responses().into_iter().map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    });
    let epoch_kv = gets.next().flatten();
    let seal_kv = gets.next().flatten();
    let wm_kv = gets.next().flatten();
    let epoch = match epoch_kv {
        Some(kv) => Some((layout::decode(layout::EPOCH_KEY, kv.value()).map_err(EpochError::Malformed)?, kv.value().to_vec())),
        None => None,
    };
    let seal = seal_kv.map(|kv| {
        layout::decode(layout::SEAL_KEY, kv.value())
            .unwrap_or(SealRecord { reason: String::from_utf8_lossy(kv.value()).into_owned(), sealed_at_unix: 0 })
    });
    let watermark = match wm_kv {
        Some(kv) => (layout::decode(layout::WATERMARK_KEY, kv.value()).ok(), kv.mod_revision()),
        None => (None, 0),
    };
    Ok(SysState {
        epoch,
        seal,
        watermark,
        revision: header.as_ref().map(|h| h.revision()).unwrap_or(0),
        cluster_id: header.as_ref().map(|h| h.cluster_id()).unwrap_or(0),
    })
}

/// A lower bound of the lowest log offset over all members (see
/// [`Etcd::offset_lower_bounds`]); every member must answer.
pub async fn measured_floor(etcd: &Etcd) -> Result<(i64, Vec<MemberStatus>), EpochError> {
    let answers = etcd.member_status().await;
    let errors: Vec<String> = answers.iter().filter_map(|a| a.as_ref().err().cloned()).collect();
    if !errors.is_empty() {
        return Err(EpochError::Members(errors.join("; ")));
    }
    let members: Vec<MemberStatus> = answers.into_iter().filter_map(Result::ok).collect();
    let bounds = etcd.offset_lower_bounds().await.map_err(EpochError::Members)?;
    let floor = bounds.into_iter().min().ok_or_else(|| EpochError::Members("none configured".into()))?;
    Ok((floor, members))
}

/// 32 random hex digits: the mint of a new epoch record (see
/// [`EpochRecord::mint`]).
pub fn new_mint() -> Result<String, EpochError> {
    let mut bytes = [0u8; 16];
    getrandom::getrandom(&mut bytes).map_err(|e| EpochError::Random(e.to_string()))?;
    Ok(bytes.iter().map(|b| format!("{b:02x}")).collect())
}

/// The epoch allocator at [`layout::EPOCHS_KEY`] and its mod revision
/// (0 and the default record when it was never written: nothing allocated
/// through it yet).
pub async fn read_allocator(etcd: &Etcd) -> Result<(EpochsRecord, i64), EpochError> {
    let resp = etcd.get(layout::EPOCHS_KEY, None).await?;
    match resp.kvs().first() {
        Some(kv) => Ok((layout::decode(layout::EPOCHS_KEY, kv.value()).map_err(EpochError::Malformed)?, kv.mod_revision())),
        None => Ok((EpochsRecord::default(), 0)),
    }
}

/// Initialises the first epoch on a new cluster: epoch 1, or one above the
/// allocator's highest when the allocator already has one. First moves the revision to at least
/// [`seal::INIT_MIN_REVISION`] (so that a restore of any later snapshot is
/// detectable, see `holdfast_model::seal`), then records the epoch with the
/// cluster ID and the measured log floor.
pub async fn init(etcd: &Etcd, progress: impl FnMut(&str)) -> Result<EpochRecord, EpochError> {
    init_via(etcd, None, progress).await
}

/// The coord cluster when it is another cluster than `etcd` (its cluster ID
/// differs); `None` when both tiers share one cluster, whose own allocator
/// and nonce records then decide.
pub async fn separate_coord<'a>(etcd: &Etcd, coord: Option<&'a Etcd>) -> Result<Option<&'a Etcd>, EpochError> {
    let Some(coord) = coord else { return Ok(None) };
    let (entity_id, coord_id) = (cluster_id(etcd).await?, cluster_id(coord).await?);
    Ok((entity_id != coord_id).then_some(coord))
}

/// The cluster ID the members report (Status, which every etcd user may
/// call: no key needs to be readable).
pub async fn cluster_id(etcd: &Etcd) -> Result<u64, EpochError> {
    let answers = etcd.member_status().await;
    if let Some(id) = answers.iter().find_map(|a| a.as_ref().ok().map(|m| m.cluster_id)) {
        return Ok(id);
    }
    let errors: Vec<String> = answers.into_iter().filter_map(Result::err).collect();
    Err(EpochError::Members(errors.join("; ")))
}

/// The coord cluster's allocator, as refusals name it.
const COORD_EPOCHS: &str = "/sys/epochs on the coord cluster";

/// The highest epoch allocated, as the entity cluster's own allocator and
/// (when separate) the coord cluster's say.
pub async fn highest_allocated(etcd: &Etcd, coord: Option<&Etcd>) -> Result<u32, EpochError> {
    let own = read_allocator(etcd).await?.0.highest;
    match separate_coord(etcd, coord).await? {
        Some(c) => Ok(own.max(read_allocator(c).await?.0.highest)),
        None => Ok(own),
    }
}

/// [`init`] with the epoch allocated from the coord cluster's allocator
/// when `coord` is another cluster: the coord allocator is raised first
/// (compare-and-raise), then the entity cluster's record written. A failure
/// between the two leaves an allocated epoch unused, never one used twice.
pub async fn init_via(etcd: &Etcd, coord: Option<&Etcd>, mut progress: impl FnMut(&str)) -> Result<EpochRecord, EpochError> {
    let coord = separate_coord(etcd, coord).await?;
    let sys = read_sys(etcd).await?;
    if let Some((record, _)) = sys.epoch {
        return Err(EpochError::AlreadyInitialised(record.epoch));
    }
    let mut revision = sys.revision;
    if revision < seal::INIT_MIN_REVISION {
        progress(&format!("moving the etcd revision from {revision} to {}", seal::INIT_MIN_REVISION));
        while revision < seal::INIT_MIN_REVISION {
            let batch = (seal::INIT_MIN_REVISION - revision).min(64);
            let puts = (0..batch).map(|_| {
                let mut c = etcd.client.clone();
                async move { c.put(layout::INIT_PAD_KEY, "", None).await }
            });
            for r in futures::future::join_all(puts).await {
                let resp = r?;
                revision = revision.max(resp.header().map(|h| h.revision()).unwrap_or(0));
            }
        }
        etcd.client.clone().delete(layout::INIT_PAD_KEY, None).await?;
    }
    let (floor, members) = measured_floor(etcd).await?;
    let cluster_id = members.first().map(|m| m.cluster_id).unwrap_or(sys.cluster_id);
    let (allocated, allocated_at) = read_allocator(etcd).await?;
    let coord_allocated = match coord {
        Some(c) => Some(read_allocator(c).await?),
        None => None,
    };
    let highest = allocated.highest.max(coord_allocated.map(|(a, _)| a.highest).unwrap_or(0));
    let epoch = highest.saturating_add(1);
    if epoch > MAX_EPOCH {
        return Err(EpochError::Exhausted(highest));
    }
    let record = EpochRecord { epoch, cluster_id, log_floor: floor, mint: new_mint()? };
    if let (Some(c), Some((_, at))) = (coord, coord_allocated)
        && !raise_allocator(c, at, epoch, None).await?
    {
        return Err(EpochError::Raced);
    }
    let txn = Txn::new()
        .when([
            Compare::version(layout::EPOCH_KEY, CompareOp::Equal, 0),
            Compare::mod_revision(layout::EPOCHS_KEY, CompareOp::Equal, allocated_at),
        ])
        .and_then([
            TxnOp::put(layout::EPOCH_KEY, layout::encode(&record), None),
            TxnOp::put(layout::EPOCHS_KEY, layout::encode(&EpochsRecord { highest: epoch }), None),
        ]);
    let resp = etcd.txn(txn).await?;
    if !resp.succeeded() {
        return Err(EpochError::Raced);
    }
    Ok(record)
}

/// The advance transaction: compare the epoch record with the one read,
/// write epoch E+1 bound to the cluster ID etcd reports now and the log floor
/// measured now, and delete every hold, waiter and session together with the
/// seal and the watermark. Every token minted afterwards carries E+1 in its
/// top bits, so it is greater than every token of any earlier epoch.
pub async fn advance(etcd: &Etcd, expected: u32) -> Result<EpochRecord, EpochError> {
    let advanced = advance_txn(etcd, expected).await?;
    revoke_sessions(etcd, &advanced.old_leases).await;
    Ok(advanced.record)
}

/// An advance whose transaction committed; the old epoch's session leases
/// are not revoked yet.
pub struct Advanced {
    pub record: EpochRecord,
    /// The leases of the sessions the transaction ended.
    pub old_leases: Vec<i64>,
}

/// The advance transaction alone (see [`advance`]). Until
/// [`revoke_sessions`] runs, the old sessions' leases live on without their
/// records: only the grant's compare on the session record keeps them from
/// receiving grants. (The correctness gate delays the revokes on purpose.)
pub async fn advance_txn(etcd: &Etcd, expected: u32) -> Result<Advanced, EpochError> {
    advance_txn_to(etcd, &Target { expected, new_epoch: expected.saturating_add(1), cluster_id: None, known: 0, nonce: None }).await
}

/// What an approved advance asks for (see [`advance_to`]).
#[derive(Debug, Clone)]
pub struct Target {
    /// The epoch in force now; anything else refuses.
    pub expected: u32,
    /// The epoch to write: above every epoch this cluster ever used (after
    /// a restore from an old snapshot, more than `expected + 1`).
    pub new_epoch: u32,
    /// The cluster ID the request was made for; `None`: whatever etcd reports.
    pub cluster_id: Option<u64>,
    /// The highest epoch known besides etcd's records (what the arbiters
    /// report they served). `new_epoch` may be at most
    /// [`holdfast_approval::request::MAX_EPOCH_STEP`] above the highest of
    /// this, the record and the allocators.
    pub known: u32,
    /// The request's nonce and the record to keep at `/sys/nonce/<nonce>`
    /// (on a lease of `ttl_secs`), compared absent in the same transaction.
    pub nonce: Option<(String, Vec<u8>, i64)>,
}

/// What an approved request asks for: its epochs and cluster ID, and its
/// nonce with the record kept at `/sys/nonce/<nonce>` (who asked, who
/// signed, why) until a day past the request's expiry. `holdfastctl epoch
/// advance` (the unit) and the correctness gate's epoch-advance fault both
/// advance through this.
pub fn approved_target(approved: &holdfast_approval::Approved, now_unix: u64) -> Result<Target, EpochError> {
    let r = &approved.request;
    let holdfast_approval::Operation::EpochAdvance { expected_epoch, new_epoch, cluster_id, .. } = &r.operation else {
        return Err(EpochError::Malformed(format!("a {} request is not an epoch advance", r.operation.kind())));
    };
    let record = layout::encode(&layout::NonceRecord {
        kind: r.operation.kind().to_string(),
        requester: r.requester.clone(),
        signers: approved.signers.clone(),
        reason: r.reason.clone(),
        at_unix: now_unix,
    });
    let ttl = r.expires_unix.saturating_sub(now_unix) + 86_400;
    Ok(Target {
        expected: *expected_epoch,
        new_epoch: *new_epoch,
        cluster_id: Some(*cluster_id),
        known: 0,
        nonce: Some((r.nonce.clone(), record, ttl as i64)),
    })
}

/// [`EpochError::NonceUsed`] when the target's request was carried out
/// already (its nonce is recorded). A read only: the advance transaction
/// compares the nonce again.
pub async fn nonce_unused(etcd: &Etcd, target: &Target) -> Result<(), EpochError> {
    if let Some((nonce, _, _)) = &target.nonce {
        let key = layout::nonce_key(nonce);
        if etcd.get(key.as_str(), Some(GetOptions::new().with_count_only())).await?.count() > 0 {
            return Err(EpochError::NonceUsed(key));
        }
    }
    Ok(())
}

/// The two-person advance: [`advance_txn_to`], then the old sessions'
/// leases revoked.
pub async fn advance_to(etcd: &Etcd, target: &Target) -> Result<Advanced, EpochError> {
    advance_via(etcd, None, target).await
}

/// [`advance_to`] with the epoch allocated from the coord cluster and the
/// nonce recorded there when `coord` is another cluster (both survive a
/// restore of the entity cluster): one coord transaction compares the coord
/// allocator and that the nonce is unused, raises the allocator and records
/// the nonce; then the entity transaction as in [`advance_txn_to`]. If the
/// entity cluster changed in between, the allocated epoch stays unused
/// ([`EpochError::Spent`]) and nothing on the entity cluster changed.
pub async fn advance_via(etcd: &Etcd, coord: Option<&Etcd>, target: &Target) -> Result<Advanced, EpochError> {
    let advanced = advance_txn_via(etcd, coord, target).await?;
    revoke_sessions(etcd, &advanced.old_leases).await;
    Ok(advanced)
}

/// [`nonce_unused`] where the nonce would be recorded: on the coord cluster
/// when it is separate (and, for a request of before, on `etcd` too).
pub async fn nonce_unused_via(etcd: &Etcd, coord: Option<&Etcd>, target: &Target) -> Result<(), EpochError> {
    if let Some(c) = separate_coord(etcd, coord).await? {
        nonce_unused(c, target).await?;
    }
    nonce_unused(etcd, target).await
}

/// Compare-and-raise of the allocator at `etcd`: it must still be at the
/// mod revision read (`seen`); with the nonce compared absent and recorded.
/// `false`: something changed (the caller names what).
async fn raise_allocator(etcd: &Etcd, seen: i64, epoch: u32, nonce: Option<&(String, Vec<u8>, i64)>) -> Result<bool, EpochError> {
    let mut compares = vec![Compare::mod_revision(layout::EPOCHS_KEY, CompareOp::Equal, seen)];
    let mut ops = vec![TxnOp::put(layout::EPOCHS_KEY, layout::encode(&EpochsRecord { highest: epoch }), None)];
    if let Some((nonce, value, ttl)) = nonce {
        let key = layout::nonce_key(nonce);
        let lease = etcd.client.clone().lease_grant(*ttl, None).await?.id();
        compares.push(Compare::create_revision(key.as_str(), CompareOp::Equal, 0));
        ops.push(TxnOp::put(key.as_str(), value.clone(), Some(etcd_client::PutOptions::new().with_lease(lease))));
    }
    Ok(etcd.txn(Txn::new().when(compares).and_then(ops)).await?.succeeded())
}

/// The advance transaction: compares the epoch record, the allocator (the
/// new epoch must be above everything it ever allocated) and that the nonce
/// is unused; writes the new epoch bound to the cluster ID and log floor
/// measured now and a fresh mint, raises the allocator to it, and deletes every hold, waiter, withdrawal marker, session
/// record and the seal; nothing else changes, and on any refusal nothing
/// changes at all.
pub async fn advance_txn_to(etcd: &Etcd, target: &Target) -> Result<Advanced, EpochError> {
    advance_txn_via(etcd, None, target).await
}

/// [`advance_txn_to`] with the epoch allocated (and the nonce recorded) on
/// the coord cluster when it is separate (see [`advance_via`]); the old
/// sessions' leases are not revoked yet.
pub async fn advance_txn_via(etcd: &Etcd, coord: Option<&Etcd>, target: &Target) -> Result<Advanced, EpochError> {
    let coord = separate_coord(etcd, coord).await?;
    // `coord` is resolved already: check where the nonce would be recorded
    // without asking both clusters for their IDs again.
    for at in coord.into_iter().chain([etcd]) {
        nonce_unused(at, target).await?;
    }
    let sys = read_sys(etcd).await?;
    let (current, bytes) = sys.epoch.ok_or(EpochError::NotInitialised)?;
    if current.epoch != target.expected {
        return Err(EpochError::Mismatch { expected: target.expected, actual: current.epoch });
    }
    if current.epoch >= MAX_EPOCH || target.new_epoch > MAX_EPOCH {
        return Err(EpochError::Exhausted(current.epoch));
    }
    if target.new_epoch <= current.epoch {
        return Err(EpochError::NotAbove { new: target.new_epoch, current: current.epoch });
    }
    let (allocated, allocated_at) = read_allocator(etcd).await?;
    if allocated.highest >= target.new_epoch {
        return Err(EpochError::Allocated { new: target.new_epoch, highest: allocated.highest, key: layout::EPOCHS_KEY });
    }
    let mut highest = current.epoch.max(allocated.highest).max(target.known);
    let coord_allocated_at = match coord {
        Some(c) => {
            let (coord_allocated, at) = read_allocator(c).await?;
            if coord_allocated.highest >= target.new_epoch {
                return Err(EpochError::Allocated { new: target.new_epoch, highest: coord_allocated.highest, key: COORD_EPOCHS });
            }
            highest = highest.max(coord_allocated.highest);
            Some(at)
        }
        None => None,
    };
    if target.new_epoch.saturating_sub(highest) > holdfast_approval::request::MAX_EPOCH_STEP {
        return Err(EpochError::TooFar { new: target.new_epoch, highest, step: holdfast_approval::request::MAX_EPOCH_STEP });
    }
    let (floor, members) = measured_floor(etcd).await?;
    let cluster_id = members.first().map(|m| m.cluster_id).unwrap_or(sys.cluster_id);
    if let Some(expected) = target.cluster_id.filter(|c| *c != cluster_id) {
        return Err(EpochError::WrongCluster { expected, actual: cluster_id });
    }
    let record = EpochRecord { epoch: target.new_epoch, cluster_id, log_floor: floor, mint: new_mint()? };
    // The session leases outlive their records unless revoked: list them now.
    let sessions = etcd.get(layout::SESSION_PREFIX, Some(GetOptions::new().with_prefix().with_keys_only())).await?;
    let leases: Vec<i64> = sessions
        .kvs()
        .iter()
        .filter_map(|kv| kv.key_str().ok()?.strip_prefix(layout::SESSION_PREFIX).and_then(|h| u64::from_str_radix(h, 16).ok()))
        .map(|l| l as i64)
        .collect();
    let prefix = || Some(DeleteOptions::new().with_prefix());
    let mut compares = vec![
        Compare::value(layout::EPOCH_KEY, CompareOp::Equal, bytes),
        Compare::mod_revision(layout::EPOCHS_KEY, CompareOp::Equal, allocated_at),
    ];
    let mut ops = vec![
        TxnOp::put(layout::EPOCH_KEY, layout::encode(&record), None),
        TxnOp::put(layout::EPOCHS_KEY, layout::encode(&EpochsRecord { highest: target.new_epoch }), None),
        TxnOp::delete(layout::SEAL_KEY, None),
        TxnOp::delete(layout::WATERMARK_KEY, None),
        TxnOp::delete(layout::HOLD_PREFIX, prefix()),
        TxnOp::delete(layout::WAITER_PREFIX, prefix()),
        TxnOp::delete(layout::WITHDRAWN_PREFIX, prefix()),
        TxnOp::delete(layout::SESSION_PREFIX, prefix()),
    ];
    if let (Some(c), Some(at)) = (coord, coord_allocated_at) {
        // Allocate on coord (with the nonce) first, then write the entity
        // cluster's record: a failure in between skips an epoch, never
        // issues one twice.
        if !raise_allocator(c, at, target.new_epoch, target.nonce.as_ref()).await? {
            nonce_unused(c, target).await?;
            return Err(EpochError::Raced);
        }
        let resp = etcd.txn(Txn::new().when(compares).and_then(ops)).await?;
        if !resp.succeeded() {
            return Err(EpochError::Spent { epoch: target.new_epoch });
        }
        return Ok(Advanced { record, old_leases: leases });
    }
    let nonce_key = target.nonce.as_ref().map(|(n, _, _)| layout::nonce_key(n));
    if let (Some((_, value, ttl)), Some(key)) = (&target.nonce, &nonce_key) {
        let lease = etcd.client.clone().lease_grant(*ttl, None).await?.id();
        compares.push(Compare::create_revision(key.as_str(), CompareOp::Equal, 0));
        ops.push(TxnOp::put(key.as_str(), value.clone(), Some(etcd_client::PutOptions::new().with_lease(lease))));
    }
    let resp = etcd.txn(Txn::new().when(compares).and_then(ops)).await?;
    if !resp.succeeded() {
        if let Some(key) = nonce_key
            && etcd.get(key.as_str(), Some(GetOptions::new().with_count_only())).await?.count() > 0
        {
            return Err(EpochError::NonceUsed(key));
        }
        return Err(EpochError::Raced);
    }
    Ok(Advanced { record, old_leases: leases })
}

/// Ends every session of the old epoch, so that no holder keeps renewing
/// (and believing in) a hold the advance deleted. Best effort: a lease that
/// survives expires on its own TTL, and its record is already gone. Returns
/// how many leases were revoked (the others had already ended).
pub async fn revoke_sessions(etcd: &Etcd, leases: &[i64]) -> usize {
    let revokes = leases.iter().map(|&lease| {
        let mut c = etcd.client.clone();
        async move { c.lease_revoke(lease).await }
    });
    futures::future::join_all(revokes).await.iter().filter(|r| r.is_ok()).count()
}

/// Writes the durable seal (unless one is there already).
pub async fn write_seal(etcd: &Etcd, reason: &str) -> Result<(), EpochError> {
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0);
    let record = SealRecord { reason: reason.to_string(), sealed_at_unix: now };
    let txn = Txn::new().when([Compare::version(layout::SEAL_KEY, CompareOp::Equal, 0)]).and_then([TxnOp::put(
        layout::SEAL_KEY,
        layout::encode(&record),
        None,
    )]);
    etcd.txn(txn).await?;
    Ok(())
}

/// Raises the watermark to `floor` if it is still at `seen_mod_revision` and
/// the epoch record is unchanged.
pub async fn raise_watermark(etcd: &Etcd, epoch_bytes: &[u8], seen_mod_revision: i64, floor: i64) -> Result<bool, EpochError> {
    let txn = Txn::new()
        .when([
            Compare::mod_revision(layout::WATERMARK_KEY, CompareOp::Equal, seen_mod_revision),
            Compare::value(layout::EPOCH_KEY, CompareOp::Equal, epoch_bytes.to_vec()),
        ])
        .and_then([TxnOp::put(layout::WATERMARK_KEY, layout::encode(&WatermarkRecord { log_floor: floor }), None)]);
    Ok(etcd.txn(txn).await?.succeeded())
}

/// Counts keys under a prefix (used by status output and tests).
pub async fn count_prefix(etcd: &Etcd, prefix: &str) -> Result<i64, EpochError> {
    let resp = etcd.get(prefix, Some(GetOptions::new().with_prefix().with_count_only())).await?;
    Ok(resp.count())
}

pub fn positions(members: &[MemberStatus]) -> Vec<LogPosition> {
    members.iter().map(|m| m.position).collect()
}
