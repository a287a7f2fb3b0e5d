//! etcd's own log of the lock key space, read through a watch from a given
//! revision: the ground truth of the correctness gate's checkers.

use holdfast_checkers::history::{DrainChange, EpochChange, EtcdEvent, EtcdEventKind, EtcdLog, SessionEnd, Withdrawal};
use holdfast_model::layout::{self, EpochRecord, WithdrawnRecord};
use std::collections::HashMap;
use std::time::Duration;

/// etcd's log as the checkers read it, from revision `from`: the events under
/// `/l/<prefix>` with the deleted values; every session record's delete;
/// every epoch advance (a put of `/sys/epoch`); every withdrawal marker
/// (a put under `/sys/withdrawn/`); every drain marker written or deleted
/// (`/sys/drain/`). `start_epoch` is the epoch in force at `from`.
///
/// A delete is marked `expired` when the hold's session ended with it: etcd
/// deleted the session record (`/s/<lease>`) in the same revision (lease
/// expiry), or earlier (CloseSession deletes the record first, then revokes
/// the lease; an epoch advance deletes both at once). This is exact by
/// construction: a release or withdrawal transaction deletes only the hold
/// and requires the session record to exist
/// (`holdfast_store::txn::release_txn_for`), so no release can land at or
/// after the record's delete.
///
/// History is replayed in one burst; the watch is read until it has been
/// quiet for two seconds (progress notifications are not relied on: etcd 3.4
/// answers them before an unsynced watcher has caught up).
pub async fn read_log(client: &etcd_client::Client, prefix: &str, from: i64, start_epoch: u64) -> anyhow::Result<EtcdLog> {
    let mut ends = Vec::new();
    let mut epochs = Vec::new();
    let mut withdrawals = Vec::new();
    let mut drains = Vec::new();
    let mut c = client.clone();
    let opts = etcd_client::WatchOptions::new().with_prefix().with_start_revision(from.max(1)).with_prev_key();
    let mut stream = c.watch("/", Some(opts)).await?;
    let lock_prefix = format!("/l/{prefix}");
    let mut events = Vec::new();
    let mut session_ends: HashMap<i64, u64> = HashMap::new();
    loop {
        let next = tokio::time::timeout(Duration::from_secs(2), stream.message()).await;
        let Ok(Ok(Some(resp))) = next else { break };
        for e in resp.events() {
            let Some(kv) = e.kv() else { continue };
            let key = kv.key_str().unwrap_or_default().to_string();
            let revision = kv.mod_revision() as u64;
            if let (Some(hex), etcd_client::EventType::Delete) = (key.strip_prefix("/s/"), e.event_type())
                && let Ok(lease) = u64::from_str_radix(hex, 16)
            {
                session_ends.entry(lease as i64).or_insert(revision);
                ends.push(SessionEnd { lease: lease as i64, revision });
            }
            if key == layout::EPOCH_KEY
                && e.event_type() == etcd_client::EventType::Put
                && let Ok(r) = layout::decode::<EpochRecord>(&key, kv.value())
            {
                epochs.push(EpochChange { revision, epoch: r.epoch as u64 });
            }
            if e.event_type() == etcd_client::EventType::Put
                && let Some(hold_key) = layout::hold_key_of_withdrawn(&key)
                && hold_key.starts_with(&lock_prefix)
                && let Ok(r) = layout::decode::<WithdrawnRecord>(&key, kv.value())
            {
                withdrawals.push(Withdrawal { key: hold_key, create_revision: r.create_revision as u64, lease: r.session, revision });
            }
            if let Some(unit) = key.strip_prefix(layout::DRAIN_PREFIX) {
                let present = e.event_type() == etcd_client::EventType::Put;
                drains.push(DrainChange { unit: unit.to_string(), revision, present });
            }
            if !key.starts_with(&lock_prefix) {
                continue;
            }
            match e.event_type() {
                etcd_client::EventType::Put => events.push(EtcdEvent {
                    kind: EtcdEventKind::Put,
                    key,
                    revision,
                    create_revision: kv.create_revision() as u64,
                    lease: kv.lease(),
                    expired: None,
                }),
                etcd_client::EventType::Delete => {
                    let prev = e.prev_kv();
                    events.push(EtcdEvent {
                        kind: EtcdEventKind::Delete,
                        key,
                        revision,
                        create_revision: prev.map(|p| p.create_revision() as u64).unwrap_or(0),
                        lease: prev.map(|p| p.lease()).unwrap_or(0),
                        expired: None,
                    })
                }
            }
        }
    }
    for e in &mut events {
        if e.kind == EtcdEventKind::Delete {
            e.expired = Some(session_ends.get(&e.lease).is_some_and(|end| *end <= e.revision));
        }
    }
    Ok(EtcdLog { epoch: start_epoch, epoch_changes: epochs, session_ends: ends, withdrawals, drains, events })
}
