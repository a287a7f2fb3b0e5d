//! Whether the arbiter may grant: the serve state and the loop that checks
//! the epoch record, the cluster identity and the etcd log position.
//!
//! The arbiter grants only in [`Serve::Serving`]. It starts in
//! [`Serve::Unverified`], returns there whenever an etcd call fails (a
//! reconnect is a new cluster until proven otherwise), and leaves it only
//! after a full check. A detected restore is written to `/sys/seal`, so it
//! outlives this process; only the epoch advance clears it.

use crate::epoch::{self, SysState};
use crate::etcd::Etcd;
use crate::served::{Admission, Served};
use holdfast_model::layout::EpochRecord;
use holdfast_model::seal::{self, Verdict};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};
use tokio::sync::Notify;

#[derive(Debug, Clone)]
pub enum Serve {
    /// Not yet checked since start or since the last etcd error.
    Unverified(String),
    /// Granting in this epoch. The bytes are compared in every grant.
    Serving(Arc<Current>),
    /// Granting nothing. `epoch` is the epoch that was sealed (None: no
    /// epoch exists yet); only a different epoch lifts the seal.
    Sealed { reason: String, epoch: Option<u32> },
}

impl Serve {
    pub fn describe(&self) -> String {
        match self {
            Serve::Serving(c) => format!("serving epoch {}", c.record.epoch),
            Serve::Sealed { reason, .. } => format!("sealed: {reason}"),
            Serve::Unverified(r) => format!("unverified: {r}"),
        }
    }
}

#[derive(Debug)]
pub struct Current {
    pub record: EpochRecord,
    pub bytes: Vec<u8>,
}

/// State shared by the check loop and the request handlers.
pub struct Guard {
    state: RwLock<Serve>,
    /// (epoch, highest revision seen in any etcd response in that epoch).
    /// A successful write must land above the value read before it was sent.
    highest: Mutex<(u32, i64)>,
    etcd_version: RwLock<String>,
    checked_once: AtomicBool,
    /// When the state last became [`Serve::Unverified`] (None in any other
    /// state): how long etcd has been out of reach, for fail-open classes.
    unverified_since: Mutex<Option<Instant>>,
    recheck: Notify,
    /// The epochs this arbiter served, on its own disk: a record at or
    /// below one of them is served only if it is that very record.
    pub served: Served,
}

impl Guard {
    pub fn new(served: Served) -> Self {
        Guard {
            state: RwLock::new(Serve::Unverified("starting: etcd not checked yet".into())),
            highest: Mutex::new((0, 0)),
            etcd_version: RwLock::new(String::new()),
            checked_once: AtomicBool::new(false),
            unverified_since: Mutex::new(Some(Instant::now())),
            recheck: Notify::new(),
            served,
        }
    }

    pub fn state(&self) -> Serve {
        self.state.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Installs a new state. A seal of epoch E is replaced only by a state
    /// of another epoch (after an advance or init): never by `Unverified`,
    /// and never by `Serving` in E, whoever raised it and whenever.
    fn commit(&self, next: Serve) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let Serve::Sealed { epoch: Some(sealed), .. } = &*state {
            match &next {
                Serve::Unverified(_) => return,
                Serve::Serving(c) if c.record.epoch == *sealed => return,
                _ => {}
            }
        }
        self.note_unverified(matches!(next, Serve::Unverified(_)));
        *state = next;
    }

    /// Keeps [`Self::unverified_since`] in step with a new state.
    fn note_unverified(&self, unverified: bool) {
        let mut since = self.unverified_since.lock().unwrap_or_else(|e| e.into_inner());
        match (unverified, *since) {
            (true, None) => *since = Some(Instant::now()),
            (false, _) => *since = None,
            (true, Some(_)) => {}
        }
    }

    /// How long this cluster has been unverified without a break (etcd
    /// unanswered, fewer than a majority of its members answering, or a
    /// check not yet passed); None while serving or sealed.
    pub fn unverified_for(&self) -> Option<Duration> {
        let state = self.state.read().unwrap_or_else(|e| e.into_inner());
        if !matches!(&*state, Serve::Unverified(_)) {
            return None;
        }
        self.unverified_since.lock().unwrap_or_else(|e| e.into_inner()).map(|t| t.elapsed())
    }

    pub fn etcd_version(&self) -> String {
        self.etcd_version.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn has_checked(&self) -> bool {
        self.checked_once.load(Ordering::Acquire)
    }

    /// An etcd call failed: stop granting until the loop has checked again
    /// (a reconnect may reach a restored cluster).
    pub fn etcd_failed(&self, why: &str) {
        let mut state = self.state.write().unwrap_or_else(|e| e.into_inner());
        if let Serve::Serving(_) = &*state {
            tracing::warn!(cluster = %self.served.cluster(), reason = why, "etcd call failed; granting paused until the cluster is re-checked");
            self.note_unverified(true);
            *state = Serve::Unverified(format!("re-checking etcd after an error: {why}"));
        }
        drop(state);
        self.recheck.notify_one();
    }

    /// Seals `epoch` now; the check loop makes it durable in `/sys/seal`.
    pub fn seal(&self, reason: String, epoch: u32) {
        tracing::error!(cluster = %self.served.cluster(), reason = %reason, "sealed: granting nothing until the epoch is advanced");
        self.commit(Serve::Sealed { reason, epoch: Some(epoch) });
        self.recheck.notify_one();
    }

    /// True while the arbiter still serves `epoch`: checked after a grant
    /// commits, before its token leaves.
    pub fn still_serving(&self, epoch: u32) -> bool {
        matches!(&*self.state.read().unwrap_or_else(|e| e.into_inner()), Serve::Serving(c) if c.record.epoch == epoch)
    }

    /// The highest revision observed in `epoch` so far; read before a write.
    pub fn highest_before(&self, epoch: u32) -> i64 {
        let h = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if h.0 == epoch { h.1 } else { 0 }
    }

    /// Records a revision seen in a response of `epoch`. Observations of an
    /// older epoch than the newest seen are ignored.
    pub fn observe(&self, epoch: u32, revision: i64) {
        let mut h = self.highest.lock().unwrap_or_else(|e| e.into_inner());
        if epoch > h.0 {
            *h = (epoch, revision);
        } else if epoch == h.0 && revision > h.1 {
            h.1 = revision;
        }
    }
}

/// Runs one full check and updates the state. Returns the new state.
pub async fn check_once(etcd: &Etcd, guard: &Guard, watermark: &mut WatermarkPacer) -> Serve {
    let answers = etcd.member_status().await;
    holdfast_daemon::route::log(&etcd.route_around(&answers).await);
    let members: Vec<_> = answers.iter().filter_map(|a| a.as_ref().ok().cloned()).collect();
    let sys = match epoch::read_sys(etcd).await {
        Ok(sys) => sys,
        Err(e) => {
            guard.commit(Serve::Unverified(format!("etcd did not answer the epoch read: {e}")));
            return guard.state();
        }
    };
    guard.checked_once.store(true, Ordering::Release);
    if let Some(m) = members.first() {
        *guard.etcd_version.write().unwrap_or_else(|e| e.into_inner()) = m.version.clone();
    }
    let next = match judge(etcd, &sys, &members) {
        Serve::Serving(current) => admit(&guard.served, current),
        other => other,
    };
    guard.commit(next);
    let state = guard.state();
    match &state {
        Serve::Serving(current) => {
            guard.observe(current.record.epoch, sys.revision);
            for m in &members {
                guard.observe(current.record.epoch, m.position.revision);
            }
            watermark.maybe_raise(etcd, current, &sys, &members).await;
        }
        Serve::Sealed { reason, epoch: Some(_) } if sys.seal.is_none() && sys.epoch.is_some() => {
            // Durable, so that every arbiter, and this one after a restart,
            // stays sealed until the advance.
            if let Err(e) = epoch::write_seal(etcd, reason).await {
                tracing::warn!(error = %e, "could not write /sys/seal; sealed in memory only");
            }
        }
        _ => {}
    }
    state
}

/// A record etcd's checks would serve, against what this arbiter served
/// before: recorded first when it is new, sealed when it is an older or
/// re-minted epoch.
fn admit(served: &Served, current: Arc<Current>) -> Serve {
    #[cfg(feature = "mutations")]
    if holdfast_store::mutation::on(&holdfast_store::mutation::FORGET_SERVED_EPOCHS) {
        return Serve::Serving(current);
    }
    match served.admit(&current.record) {
        Admission::Serve => Serve::Serving(current),
        Admission::Refuse(reason) => Serve::Sealed { reason, epoch: Some(current.record.epoch) },
        Admission::Unrecorded(reason) => Serve::Unverified(reason),
    }
}

/// The verdict of one check, before the rules of [`Guard::commit`].
fn judge(etcd: &Etcd, sys: &SysState, members: &[crate::etcd::MemberStatus]) -> Serve {
    let Some((record, bytes)) = &sys.epoch else {
        return Serve::Sealed {
            reason: "the epoch is not initialised; run `holdfastctl epoch init` against this etcd cluster".into(),
            epoch: None,
        };
    };
    let sealed = |reason: String| Serve::Sealed { reason, epoch: Some(record.epoch) };
    if let Some(seal) = &sys.seal {
        return sealed(seal.reason.clone());
    }
    if sys.cluster_id != record.cluster_id {
        return sealed(format!(
            "etcd cluster ID {:x} differs from {:x} recorded for epoch {}: the cluster was restored or replaced",
            sys.cluster_id, record.cluster_id, record.epoch
        ));
    }
    if let Some(m) = members.iter().find(|m| m.cluster_id != record.cluster_id) {
        return sealed(format!(
            "member {} reports cluster ID {:x}, not {:x} recorded for epoch {}: the cluster was restored or replaced",
            m.endpoint, m.cluster_id, record.cluster_id, record.epoch
        ));
    }
    let floor = record.log_floor.max(sys.watermark.0.as_ref().map(|w| w.log_floor).unwrap_or(i64::MIN));
    let verdict = seal::judge(&epoch::positions(members), floor, etcd.members.len());
    #[cfg(feature = "mutations")]
    let verdict = match verdict {
        Verdict::Rewound { highest_offset, .. } if holdfast_store::mutation::on(&holdfast_store::mutation::NO_SEAL_CHECK) => {
            Verdict::Intact { lowest_offset: highest_offset }
        }
        v => v,
    };
    match verdict {
        Verdict::Rewound { highest_offset, floor } => sealed(format!(
            "the etcd log was rewound (log offset {highest_offset} is below the floor {floor}): \
             the cluster was restored from a snapshot"
        )),
        Verdict::Unknown { answered, members } => {
            Serve::Unverified(format!("only {answered} of {members} etcd members answered Status; cannot rule out a restore"))
        }
        Verdict::Intact { .. } => Serve::Serving(Arc::new(Current { record: record.clone(), bytes: bytes.clone() })),
    }
}

/// Raises `/sys/watermark` at most once per interval, and only when the
/// lowest member offset has grown past it.
pub struct WatermarkPacer {
    interval: Duration,
    last: Option<Instant>,
}

impl WatermarkPacer {
    pub fn new(interval: Duration) -> Self {
        WatermarkPacer { interval, last: None }
    }

    async fn maybe_raise(&mut self, etcd: &Etcd, current: &Current, sys: &SysState, members: &[crate::etcd::MemberStatus]) {
        if self.last.is_some_and(|t| t.elapsed() < self.interval) {
            return;
        }
        // Only when every configured member answered: the floor must not
        // exceed what a lagging member reports.
        if members.len() < etcd.members.len() {
            return;
        }
        self.last = Some(Instant::now());
        // Not the offsets just measured: those can run ahead of the truth.
        let Ok(bounds) = etcd.offset_lower_bounds().await else { return };
        let Some(lowest) = bounds.into_iter().min() else { return };
        let current_floor = sys.watermark.0.as_ref().map(|w| w.log_floor).unwrap_or(current.record.log_floor);
        if lowest > current_floor
            && let Err(e) = epoch::raise_watermark(etcd, &current.bytes, sys.watermark.1, lowest).await
        {
            tracing::debug!(error = %e, "watermark not raised this time");
        }
    }
}

/// The check loop. `on_round` runs after every round (the watchdog ping).
pub async fn run(etcd: Etcd, guard: Arc<Guard>, interval: Duration, watermark_interval: Duration, mut on_round: impl FnMut(&Serve)) {
    let mut pacer = WatermarkPacer::new(watermark_interval);
    let mut last_kind = String::new();
    // One round never takes longer than this, so the watchdog keeps getting
    // pinged while etcd is slow or gone.
    let round_limit = etcd.timeout * 2;
    // The `sealed` gauge of this cluster.
    let labels = crate::metrics::Labels { cluster: guard.served.cluster().to_string() };
    loop {
        let state = match tokio::time::timeout(round_limit, check_once(&etcd, &guard, &mut pacer)).await {
            Ok(state) => state,
            Err(_) => {
                guard.commit(Serve::Unverified(format!("an etcd check took longer than {round_limit:?}")));
                guard.state()
            }
        };
        let kind = state.describe();
        let m = &*crate::metrics::METRICS;
        m.sealed.get_or_create(&labels).set(if matches!(state, Serve::Serving(_)) { 0 } else { 1 });
        if kind != last_kind {
            match &state {
                Serve::Serving(_) => tracing::info!(cluster = %labels.cluster, state = %kind, "serve state changed"),
                _ => tracing::warn!(cluster = %labels.cluster, state = %kind, "serve state changed"),
            }
            last_kind = kind;
        }
        on_round(&state);
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = guard.recheck.notified() => {}
        }
    }
}
