//! The shard map document on the coord cluster
//! ([`holdfast_model::layout::SHARDMAP_KEY`]): read it, create it, and edit
//! it by compare-and-swap on its mod revision, so two operators editing at
//! once never lose an edit (the second is re-applied to the first's result,
//! or refused if it no longer makes sense). Every write raises the
//! document's version by one and is validated whole before it is sent.

use crate::etcd::Etcd;
use etcd_client::{Compare, CompareOp, Txn, TxnOp};
use holdfast_model::layout::{self, SHARDMAP_KEY};
use holdfast_model::shardmap::{ShardCluster, ShardMap};

/// Attempts of one edit before it gives up on a map that keeps changing.
const ATTEMPTS: u32 = 5;

/// The map and the etcd mod revision it was read at.
#[derive(Debug, Clone)]
pub struct Stored {
    pub map: ShardMap,
    pub mod_revision: i64,
}

#[derive(Debug, thiserror::Error)]
pub enum ShardMapError {
    #[error(transparent)]
    Etcd(#[from] etcd_client::Error),
    #[error("{0}")]
    Malformed(String),
    #[error(
        "there is no shard map on the coord cluster: `holdfastctl shard init NAME --client-urls URLS` names the entity cluster the arbiters use today"
    )]
    Missing,
    #[error("the shard map exists already (version {0}); edit it with `holdfastctl shard add|remove|assign|segments`")]
    Exists(u64),
    /// The edit makes no sense against the map as it is; nothing was written.
    #[error("{0}")]
    Refused(String),
    #[error("the shard map changed under this edit {0} times in a row; nothing was written, try again")]
    Conflict(u32),
}

/// The map, if one was created.
pub async fn read(etcd: &Etcd) -> Result<Option<Stored>, ShardMapError> {
    let resp = etcd.get(SHARDMAP_KEY, None).await?;
    let Some(kv) = resp.kvs().first() else { return Ok(None) };
    let map: ShardMap = layout::decode(SHARDMAP_KEY, kv.value()).map_err(ShardMapError::Malformed)?;
    map.validate().map_err(|e| ShardMapError::Malformed(format!("{SHARDMAP_KEY} (version {}): {e}", map.version)))?;
    Ok(Some(Stored { map, mod_revision: kv.mod_revision() }))
}

/// Creates the map, version 1: `first` serving every key.
pub async fn init(etcd: &Etcd, first: ShardCluster) -> Result<ShardMap, ShardMapError> {
    let map = ShardMap::new(first);
    map.validate().map_err(ShardMapError::Refused)?;
    let txn = Txn::new().when([Compare::create_revision(SHARDMAP_KEY, CompareOp::Equal, 0)]).and_then([TxnOp::put(
        SHARDMAP_KEY,
        layout::encode(&map),
        None,
    )]);
    if etcd.txn(txn).await?.succeeded() {
        return Ok(map);
    }
    match read(etcd).await? {
        Some(s) => Err(ShardMapError::Exists(s.map.version)),
        None => Err(ShardMapError::Conflict(1)),
    }
}

/// Applies `edit` to the map as it is and writes the result, version + 1,
/// if etcd still has what was read; otherwise reads again and re-applies
/// (at most [`ATTEMPTS`] times). Returns the map written.
pub async fn edit(etcd: &Etcd, edit: impl Fn(&mut ShardMap) -> Result<(), String>) -> Result<ShardMap, ShardMapError> {
    for _ in 0..ATTEMPTS {
        let stored = read(etcd).await?.ok_or(ShardMapError::Missing)?;
        let mut map = stored.map.clone();
        edit(&mut map).map_err(ShardMapError::Refused)?;
        if map == stored.map {
            return Ok(map);
        }
        map.version = stored.map.version + 1;
        map.validate().map_err(ShardMapError::Refused)?;
        let txn = Txn::new().when([Compare::mod_revision(SHARDMAP_KEY, CompareOp::Equal, stored.mod_revision)]).and_then([TxnOp::put(
            SHARDMAP_KEY,
            layout::encode(&map),
            None,
        )]);
        if etcd.txn(txn).await?.succeeded() {
            return Ok(map);
        }
    }
    Err(ShardMapError::Conflict(ATTEMPTS))
}
