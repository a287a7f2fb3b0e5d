//! The active tailer's work.
//!
//! 1. Open the store (its `flock` makes this the one writer) and read the
//!    checkpoint `C` (0 for a new store).
//! 2. Seed the classifier from the whole key space as it was at `C` (a
//!    read at revision `C`), so events after `C` are classified exactly as
//!    an uninterrupted run would have.
//! 3. Watch every key from `C + 1` with previous values, and store each
//!    response's events in every sink (and hand each sink the raw record of
//!    every put of `/sys/force/<nonce>`, for the archive) before counting
//!    its revisions done. A sink's error fails the round: nothing is
//!    skipped, the next round replays from the checkpoint.
//! 4. Every `checkpoint_interval`, record the last revision done.
//!
//! **No live token in any sink**: a revision that granted a hold (a put
//! that created `/l/<ns>/<key>`) is *withheld*, all of its events together
//! (group-committed grants of other keys, a durable grant's `wait-end`),
//! from the segments and every sink until every hold granted in it has
//! ended: with the epoch, the revision is the holder's token. Withheld
//! events are kept in the store's private `withheld.jsonl` (fsync'd before
//! the revision counts as done) and stored, in every sink, when the last of
//! those holds is deleted (seen in the stream, or missing from the key
//! space read at a resume). A gap event whose first or last revision is a
//! live hold's is withheld the same way.
//!
//! Replayed events (after a crash between a write and the checkpoint) are
//! skipped by the store and written again to the other sinks, each
//! idempotent on `(cluster_id, revision, index)` (ClickHouse keeps the last
//! copy, whose observed time may be later; the archive keeps the first).
//! If etcd compacted past the resume point (the read at `C`, or the watch,
//! says so), the revisions in between cannot be read: the tailer seeds from
//! the key space now (revision `X`), writes a gap event `[from, X]`, raises
//! the gap alarm and goes on from `X + 1`.

use crate::metrics::METRICS;
use anyhow::Context;
use etcd_client::{EventType, GetOptions, WatchOptions, WatchResponse, WatchStream};
use holdfast_audit::classify::{Change, Classifier};
use holdfast_audit::event::cluster_hex;
use holdfast_audit::sink::Sink;
use holdfast_audit::store::{Store, Withheld, WithheldForce};
use holdfast_audit::{Event, Kind};
use holdfast_config::TailerConfig;
use holdfast_model::layout::{self, ForceRecord};
use holdfast_store::Etcd;
use std::collections::HashMap;
use std::time::Duration;
use tokio::time::Instant;

/// How long a watch may stay silent while etcd's revision is ahead.
pub const STALL: Duration = Duration::from_secs(5);

/// The whole key space: from the key `\0` to the end (`\0`).
fn all_keys() -> Vec<u8> {
    vec![0]
}

/// How long the tailer has been behind etcd. Under a steady stream the
/// stored revision is always a little behind etcd's revision *now*; a
/// tailer that keeps up has stored, at each tick, at least the revision
/// etcd had at the tick before.
#[derive(Debug)]
pub struct Lag {
    caught_up_at: Instant,
    ticked: i64,
}

impl Lag {
    pub fn new(now: Instant) -> Lag {
        Lag { caught_up_at: now, ticked: 0 }
    }

    /// One tick: `done` is stored, etcd is at `etcd`. Returns how long the
    /// tailer has been behind.
    pub fn tick(&mut self, done: i64, etcd: i64, now: Instant) -> Duration {
        if done >= self.ticked {
            self.caught_up_at = now;
        }
        self.ticked = etcd;
        now.saturating_duration_since(self.caught_up_at)
    }
}

pub struct Tailer {
    store: Store,
    sinks: Vec<Box<dyn Sink>>,
    classifier: Classifier,
    cluster_id: u64,
    cluster: String,
    /// Every revision up to this one is stored in every sink.
    done: i64,
    checkpointed: i64,
    checkpointed_at: Instant,
    lag: Lag,
    /// When the watch last delivered a response.
    heard_at: Instant,
    /// etcd's revision as last seen.
    etcd_revision: i64,
    checkpoint_interval: Duration,
    alarm_after: Duration,
    /// Live holds: `/l/` key → the revision that created it.
    live: HashMap<String, i64>,
    /// How many live holds each revision created.
    holds_at: HashMap<i64, usize>,
    /// Whether a gap event is withheld (rare: its ends are checked at
    /// every hold's end while it is).
    gap_withheld: bool,
}

/// The raw record of a put of `/sys/force/<nonce>`, for the sinks.
pub struct ForcePut {
    pub revision: i64,
    pub nonce: String,
    pub record: ForceRecord,
}

/// What one watch response did.
pub enum Handled {
    /// Stored this many events (0 for a progress notice).
    Stored(usize),
    /// etcd compacted past where the watch started: call [`Tailer::resume`]
    /// again (it records the gap).
    Compacted,
}

fn compacted(e: &etcd_client::Error) -> bool {
    e.to_string().contains("compacted")
}

impl Tailer {
    /// Opens the store and checks it belongs to the cluster `etcd` reaches.
    pub async fn open(config: &TailerConfig, etcd: &Etcd, sinks: Vec<Box<dyn Sink>>) -> anyhow::Result<Tailer> {
        let dir = config.store_dir.clone();
        let store = tokio::task::spawn_blocking(move || Store::open(&dir)).await.context("opening the store")??;
        let resp = etcd.client.clone().get(holdfast_model::layout::EPOCH_KEY, None).await.context("reading etcd's cluster ID")?;
        let header = resp.header().context("etcd answered without a header")?;
        let cluster_id = header.cluster_id();
        let cluster = cluster_hex(cluster_id);
        store.check_cluster(&cluster)?;
        let done = store.checkpoint().map_or(0, |c| c.revision);
        if done > header.revision() {
            // The store holds revisions etcd has not reached: etcd was
            // restored from an older snapshot and will issue those revision
            // numbers again for other changes.
            anyhow::bail!(
                "etcd's revision is {} behind this store's checkpoint: etcd was restored from a snapshot. \
                 The store's history after the snapshot stays valid but its revision numbers will be reused; \
                 move {} aside (keep it: it is the audit trail up to the restore) and restart the tailer to start a new store",
                done - header.revision(),
                config.store_dir.display()
            );
        }
        let gap_withheld = withholds_gap(&store);
        METRICS.set_withheld(store.withheld().len());
        Ok(Tailer {
            gap_withheld,
            store,
            sinks,
            classifier: Classifier::new(cluster_id),
            cluster_id,
            cluster,
            done,
            checkpointed: done,
            checkpointed_at: Instant::now(),
            lag: Lag::new(Instant::now()),
            heard_at: Instant::now(),
            etcd_revision: header.revision(),
            checkpoint_interval: config.checkpoint_interval,
            alarm_after: config.compaction_window / 2,
            live: HashMap::new(),
            holds_at: HashMap::new(),
        })
    }

    pub fn done(&self) -> i64 {
        self.done
    }

    pub fn etcd_revision(&self) -> i64 {
        self.etcd_revision
    }

    /// Seeds the classifier as of the resume point and returns the first
    /// revision to watch. If etcd compacted the resume point away, records
    /// the gap and resumes from the key space now.
    pub async fn resume(&mut self, etcd: &Etcd) -> anyhow::Result<i64> {
        if self.done > 0 {
            let opts = GetOptions::new().with_range(all_keys()).with_revision(self.done);
            match etcd.client.clone().get(all_keys(), Some(opts)).await {
                Ok(resp) => {
                    self.seed(resp.kvs());
                    // Withheld revisions after the checkpoint come again in
                    // the replay; those at or before it whose holds ended
                    // while this tailer was not reading are released now.
                    self.release_ended(self.done).await?;
                    return Ok(self.done + 1);
                }
                Err(e) if compacted(&e) => {}
                Err(e) => return Err(e).context(format!("reading the key space at the checkpoint (revision {})", self.done)),
            }
        } else {
            // A new store: etcd's whole history, if it still has revision 1.
            self.classifier.seed(std::iter::empty());
            let opts = GetOptions::new().with_range(all_keys()).with_revision(1).with_count_only();
            match etcd.client.clone().get(all_keys(), Some(opts)).await {
                Ok(_) => return Ok(1),
                Err(e) if compacted(&e) => {}
                Err(e) => return Err(e).context("reading etcd's first revision"),
            }
        }
        self.gap(etcd).await
    }

    fn seed(&mut self, kvs: &[etcd_client::KeyValue]) {
        self.classifier.seed(kvs.iter().map(|kv| (kv.key_str().unwrap_or_default(), kv.value())));
        self.live.clear();
        self.holds_at.clear();
        for kv in kvs {
            if kv.key().starts_with(layout::HOLD_PREFIX.as_bytes()) {
                self.granted(String::from_utf8_lossy(kv.key()).into_owned(), kv.create_revision());
            }
        }
    }

    fn granted(&mut self, key: String, revision: i64) {
        if let Some(old) = self.live.insert(key, revision) {
            self.ended_at(old);
        }
        *self.holds_at.entry(revision).or_default() += 1;
    }

    /// A hold created at `revision` ended; true if it was the last one.
    fn ended_at(&mut self, revision: i64) -> bool {
        match self.holds_at.get_mut(&revision) {
            Some(n) if *n > 1 => {
                *n -= 1;
                false
            }
            Some(_) => {
                self.holds_at.remove(&revision);
                true
            }
            None => true,
        }
    }

    /// Whether a withheld entry may be stored: no live hold was created in
    /// a revision it names.
    fn releasable(&self, w: &Withheld) -> bool {
        let names = std::iter::once(w.revision).chain(w.events.iter().flat_map(|e| [e.gap_from, e.gap_to]).flatten());
        names.into_iter().all(|r| !self.holds_at.contains_key(&r))
    }

    /// Releases every withheld revision at or before `through` whose holds
    /// have all ended (by the live holds as seeded).
    async fn release_ended(&mut self, through: i64) -> anyhow::Result<()> {
        let ended: Vec<i64> =
            self.store.withheld().values().filter(|w| w.revision <= through && self.releasable(w)).map(|w| w.revision).collect();
        if !ended.is_empty() {
            self.store_batch(Vec::new(), &[], Vec::new(), &ended, self.done).await?;
        }
        Ok(())
    }

    /// Records that the revisions after the last stored one up to etcd's
    /// revision now cannot be read, and resumes from now.
    async fn gap(&mut self, etcd: &Etcd) -> anyhow::Result<i64> {
        let resp = etcd.client.clone().get(all_keys(), Some(GetOptions::new().with_range(all_keys()))).await?;
        let now = resp.header().map_or(0, |h| h.revision());
        self.seed(resp.kvs());
        // The first revision not read: after the checkpoint, the last
        // stored and the last withheld (read, not yet stored).
        let read = self.store.withheld().keys().next_back().copied().unwrap_or(0);
        let from = self.done.max(self.store.last_position().map_or(0, |p| p.0)).max(read) + 1;
        let mut e = Event::new(self.cluster_id, from, 0, Kind::Gap, "", holdfast_daemon::now_unix_ms());
        e.gap_from = Some(from);
        e.gap_to = Some(now);
        e.reason =
            Some(format!("etcd compacted revisions {from}..={now} before this tailer read them; their changes are not in the audit trail"));
        // No revision, nor a count (with the first one, a reader of the
        // store could work out the last): either end may be a live hold's.
        tracing::error!(
            "GAP in the audit trail: etcd compacted revisions before the tailer read them (raise etcd's compaction retention, or keep the tailer running); alarm raised; `holdfastctl audit --kind gap` names them once no live hold's revision is among them"
        );
        METRICS.gap();
        // Holds that ended in the lost revisions are seen ended now.
        self.release_ended(now).await?;
        // Its first or last revision may be a live hold's.
        let live = [now, from].into_iter().find(|r| self.holds_at.contains_key(r));
        match live {
            Some(revision) => {
                self.gap_withheld = true;
                self.store_batch(Vec::new(), &[], vec![Withheld { revision, events: vec![e], forced: Vec::new() }], &[], now).await?
            }
            None => self.store_batch(vec![e], &[], Vec::new(), &[], now).await?,
        }
        self.checkpoint().await?;
        Ok(now + 1)
    }

    /// Starts the watch of every key from `start` (with previous values).
    pub async fn watch(&self, client: &etcd_client::Client, start: i64) -> anyhow::Result<WatchStream> {
        let opts = WatchOptions::new().with_range(all_keys()).with_start_revision(start).with_prev_key().with_progress_notify();
        client.clone().watch(all_keys(), Some(opts)).await.context("starting the watch")
    }

    /// Classifies and stores one watch response.
    pub async fn handle(&mut self, resp: WatchResponse) -> anyhow::Result<Handled> {
        self.heard_at = Instant::now();
        if resp.compact_revision() > 0 {
            return Ok(Handled::Compacted);
        }
        if resp.canceled() {
            anyhow::bail!("etcd cancelled the watch ({})", resp.cancel_reason());
        }
        let header_revision = resp.header().map_or(0, |h| h.revision());
        self.etcd_revision = self.etcd_revision.max(header_revision);
        let now = holdfast_daemon::now_unix_ms();
        let mut batch = Batch::default();
        let mut last = self.done;
        let mut group: Vec<Change> = Vec::new();
        let mut group_revision = 0;
        for ev in resp.events() {
            let Some(kv) = ev.kv() else { continue };
            if kv.mod_revision() != group_revision && !group.is_empty() {
                self.group(group_revision, &group, now, &mut batch);
                group.clear();
            }
            group_revision = kv.mod_revision();
            group.push(Change {
                key: String::from_utf8_lossy(kv.key()).into_owned(),
                put: ev.event_type() == EventType::Put,
                value: kv.value().to_vec(),
                prev_value: ev.prev_kv().map(|p| p.value().to_vec()),
                create_revision: kv.create_revision(),
            });
            last = last.max(group_revision);
        }
        if !group.is_empty() {
            self.group(group_revision, &group, now, &mut batch);
        }
        if batch.is_empty() {
            // A progress notice: nothing changed up to the header's revision.
            // (A created notice's header is etcd's revision now, not progress.)
            if resp.events().is_empty() && !resp.created() {
                self.done = self.done.max(header_revision);
            }
            return Ok(Handled::Stored(0));
        }
        let n = batch.events.len();
        self.store_batch(batch.events, &batch.forced, batch.withhold, &batch.release, last).await?;
        Ok(Handled::Stored(n))
    }

    /// Classifies one revision's changes into `batch`: its events to store
    /// now, or to withhold if it granted a hold; and the withheld revisions
    /// whose last hold it ended.
    fn group(&mut self, revision: i64, changes: &[Change], now: u64, batch: &mut Batch) {
        let events = self.classifier.revision(revision, changes, now);
        let mut grants = 0;
        let mut ended = Vec::new();
        for c in changes.iter().filter(|c| c.key.starts_with(layout::HOLD_PREFIX)) {
            if c.put && c.create_revision == revision {
                self.granted(c.key.clone(), revision);
                grants += 1;
            } else if !c.put
                && let Some(at) = self.live.remove(&c.key)
                && self.ended_at(at)
            {
                ended.push(at);
            }
        }
        let forced: Vec<ForcePut> = changes.iter().filter(|c| c.put).filter_map(|c| force_put(&c.key, &c.value, revision)).collect();
        // Stored before as an ordinary revision (by a tailer from before
        // withholding): a replay neither withholds nor stores it again.
        let stored_before = self.store.last_position().is_some_and(|l| revision <= l.0) && !self.store.withheld().contains_key(&revision);
        if self.store.is_released(revision) {
            // A replay of a revision withheld and stored before the restart.
        } else if grants > 0 && !stored_before {
            let forced = forced.into_iter().map(|f| WithheldForce { nonce: f.nonce, record: f.record }).collect();
            batch.withholding.insert(revision, batch.withhold.len());
            batch.withhold.push(Withheld { revision, events, forced });
        } else {
            batch.events.extend(events);
            batch.forced.extend(forced);
        }
        // The withheld revisions whose last hold this one ended (a withheld
        // gap waits for the holds of both its ends).
        for at in ended {
            let mut keys = vec![at];
            if self.gap_withheld {
                keys.extend(self.store.withheld().values().filter(|w| names_gap_end(w, at)).map(|w| w.revision));
                keys.extend(batch.withhold.iter().filter(|w| names_gap_end(w, at)).map(|w| w.revision));
            }
            for key in keys {
                let pending = self.store.withheld().get(&key).or_else(|| batch.withheld_at(key));
                if pending.is_some_and(|w| self.releasable(w)) && batch.releasing.insert(key) {
                    batch.release.push(key);
                }
            }
        }
    }

    /// Writes `events` to the store, then to each sink followed by the raw
    /// force records of the batch; stores every revision of `release` in
    /// every sink, then in the store; then counts revisions up to `through`
    /// as done. `withhold` is written to the store's private file first.
    /// The first error stops it: the revisions are not done.
    async fn store_batch(
        &mut self,
        events: Vec<Event>,
        forced: &[ForcePut],
        withhold: Vec<Withheld>,
        release: &[i64],
        through: i64,
    ) -> anyhow::Result<()> {
        let mut n = events.len();
        let cluster = &self.cluster;
        tokio::task::block_in_place(|| -> anyhow::Result<()> {
            self.store.withhold(withhold)?;
            self.store.append_events(&events)?;
            for sink in &mut self.sinks {
                sink.append(&events)?;
                for f in forced {
                    sink.force_record(cluster, f.revision, &f.nonce, &f.record)?;
                }
            }
            // The sinks first: a crash before the store marks the release
            // releases it again after the restart (the sinks are idempotent).
            if !release.is_empty() {
                let released: Vec<&Withheld> = release.iter().filter_map(|r| self.store.withheld().get(r)).collect();
                let mut late: Vec<Event> = released.iter().flat_map(|w| w.events.iter().cloned()).collect();
                late.sort_by_key(Event::position);
                for sink in &mut self.sinks {
                    sink.append(&late)?;
                    for w in &released {
                        for f in &w.forced {
                            sink.force_record(cluster, w.revision, &f.nonce, &f.record)?;
                        }
                    }
                }
                n += self.store.store_released(release)?;
            }
            Ok(())
        })?;
        self.done = self.done.max(through);
        METRICS.stored(n);
        METRICS.set_withheld(self.store.withheld().len());
        if self.gap_withheld {
            self.gap_withheld = withholds_gap(&self.store);
        }
        Ok(())
    }

    /// Writes the checkpoint if anything new is done.
    pub async fn checkpoint(&mut self) -> anyhow::Result<()> {
        if self.done > self.checkpointed || self.store.checkpoint().is_none() {
            let (cluster, done) = (self.cluster.clone(), self.done);
            tokio::task::block_in_place(|| self.store.write_checkpoint(&cluster, done, holdfast_daemon::now_unix_ms()))?;
            self.checkpointed = done;
            self.checkpointed_at = Instant::now();
        }
        Ok(())
    }

    /// The periodic work: etcd's revision now, checkpoint when due, lag
    /// metrics. A watch that has delivered nothing for [`STALL`] while etcd
    /// moved on is an error (the round restarts from the checkpoint): a
    /// stream through a member that was cut off can go quiet without
    /// failing. Returns a status line for systemd.
    pub async fn tick(&mut self, etcd: &Etcd) -> anyhow::Result<String> {
        let resp = etcd.client.clone().get(holdfast_model::layout::EPOCH_KEY, Some(GetOptions::new().with_count_only())).await?;
        self.etcd_revision = self.etcd_revision.max(resp.header().map_or(0, |h| h.revision()));
        if self.etcd_revision > self.done && self.heard_at.elapsed() >= STALL {
            // A difference, never a revision (etcd's may be a live hold's).
            anyhow::bail!(
                "the watch delivered nothing for {:?} while etcd moved {} revision(s) ahead of what is stored; watching again",
                self.heard_at.elapsed(),
                self.etcd_revision - self.done
            );
        }
        if self.checkpointed_at.elapsed() >= self.checkpoint_interval {
            self.checkpoint().await?;
        }
        // Behind etcd for half the compaction window: what is not stored
        // yet is about to be compacted away.
        let alarm = self.lag.tick(self.done, self.etcd_revision, Instant::now()) >= self.alarm_after;
        METRICS.set_lag(self.etcd_revision - self.done, self.checkpointed_at.elapsed().as_secs() as i64, alarm);
        // Constant while active: STATUS= is a datagram per change, and how
        // far the store is lives in the metrics.
        Ok(format!("active; recording the history of etcd cluster {}", self.cluster))
    }
}

/// The record of a put of `/sys/force/<nonce>`; `None` for any other key.
/// A value that does not decode was not written by holdfast (only the
/// force-release role may write there): it is logged and left out of the
/// archive rather than stop the tailer for good; its change is still an
/// event in every sink.
fn force_put(key: &str, value: &[u8], revision: i64) -> Option<ForcePut> {
    let nonce = key.strip_prefix(layout::FORCE_PREFIX)?;
    match layout::decode::<ForceRecord>(key, value) {
        Ok(record) => Some(ForcePut { revision, nonce: nonce.to_string(), record }),
        Err(e) => {
            tracing::error!(key, error = %e, "a force-release record that does not decode is not archived");
            None
        }
    }
}

/// What one watch response brings: events to store now, revisions to
/// withhold, withheld revisions to release (each indexed: an epoch advance
/// ends every hold in one revision).
#[derive(Default)]
struct Batch {
    events: Vec<Event>,
    forced: Vec<ForcePut>,
    withhold: Vec<Withheld>,
    withholding: HashMap<i64, usize>,
    release: Vec<i64>,
    releasing: std::collections::HashSet<i64>,
}

fn withholds_gap(store: &Store) -> bool {
    store.withheld().values().any(|w| w.events.iter().any(|e| e.kind == Kind::Gap))
}

/// Whether `w` holds a gap event one of whose ends is `revision`.
fn names_gap_end(w: &Withheld, revision: i64) -> bool {
    w.events.iter().any(|e| e.kind == Kind::Gap && (e.gap_from == Some(revision) || e.gap_to == Some(revision)))
}

impl Batch {
    fn withheld_at(&self, revision: i64) -> Option<&Withheld> {
        self.withholding.get(&revision).map(|i| &self.withhold[*i])
    }

    fn is_empty(&self) -> bool {
        self.events.is_empty() && self.forced.is_empty() && self.withhold.is_empty() && self.release.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeping_up_with_a_steady_stream_is_no_lag_and_a_stuck_tailer_is() {
        let t0 = Instant::now();
        let at = |s: u64| t0 + Duration::from_secs(s);
        let mut lag = Lag::new(t0);
        // Always 5 revisions behind etcd now, never behind a second ago.
        for s in 1..100 {
            assert_eq!(lag.tick(s as i64 * 100 - 5, s as i64 * 100, at(s)), Duration::ZERO, "tick {s}");
        }
        // Stuck at one revision while etcd moves on.
        let behind: Vec<_> = (100..105).map(|s| lag.tick(9_895, s as i64 * 100, at(s))).collect();
        assert_eq!(behind, [1, 2, 3, 4, 5].map(Duration::from_secs), "behind since the last tick it kept up");
        // Caught up again.
        assert_eq!(lag.tick(10_400, 10_400, at(105)), Duration::ZERO);
        // Idle: nothing changes, nothing is behind.
        assert_eq!(lag.tick(10_400, 10_400, at(500)), Duration::ZERO);
    }
}
