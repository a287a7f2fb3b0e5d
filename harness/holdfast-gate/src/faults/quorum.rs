//! Quorum loss: a majority of the entity cluster stopped for longer than
//! the arbiters' `fail_open.after`, under the clients' load. The fault
//! checks what fail-open promises (docs/policy.md, "Fail-open") and is not
//! confirmed unless all of it holds:
//!
//! - before and after the outage, a grant of the open class is protected
//!   (a real token): no token-0 grant outside an outage;
//! - during it, the correctness class is refused on both arbiters, and the
//!   open class is granted from memory with token 0, one holder per key on
//!   each arbiter;
//! - arbiter 0 is killed with kill -9 mid-outage (its open holds live only
//!   in its spool) and started again once etcd is back;
//! - every unprotected grant and its one end reach `/sys/unprotected/`
//!   exactly once (the gate's `--audit` then checks that the audit store
//!   holds each of them once), and both spools are emptied.
//!
//! A broken promise is a violation of the run (`fault/quorum-loss`); the
//! fault is unconfirmed only when the outage itself did not happen.
//!
//! The clients' own grants of the correctness class during the outage are
//! checked as always (C1 finds any grant etcd did not commit).

use super::{Effect, FaultCtx, current_leader, signal, wait_for};
use crate::cluster::{FAIL_OPEN_AFTER, GATE_NAMESPACE, OPEN_CLASS_TTL, OPEN_NAMESPACE};
use anyhow::{Context, bail};
use holdfast_client::{Client, Session};
use holdfast_model::LockKey;
use holdfast_model::spool::{Entry, Event};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use std::collections::BTreeMap;
use std::time::{Duration, Instant};

/// How long the majority stays stopped once both arbiters fail open.
const OPEN_FOR: Duration = Duration::from_secs(2);

pub async fn quorum_loss(ctx: &mut FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    let run = rng.random::<u32>();
    let mut violations = Vec::new();
    let clients = [ctx.cluster.arbiter_client(0).await?, ctx.cluster.arbiter_client(1).await?];
    // The fault before this one may have cut the arbiters off a quorum for
    // longer than fail_open.after (a majority partition with the arbiters
    // on the minority side): they then fail open, as promised, until they
    // have checked etcd again. The promise checked here is about an etcd
    // they reach, so first wait (20 s at most) until both serve again.
    wait_for(Duration::from_secs(20), || async {
        for c in &clients {
            if !c.server_status().await.is_ok_and(|s| s.serving) {
                return false;
            }
        }
        true
    })
    .await;
    let before = protected(&clients[0], &key(&format!("p{run:08x}-before"))?, Duration::from_secs(20), &mut violations).await?;

    // A majority stopped: every member but one.
    let n = ctx.cluster.spec.members.len();
    let keep = rng.random_range(0..n);
    let stopped: Vec<(usize, u32)> =
        (0..n).filter(|i| *i != keep).filter_map(|i| ctx.cluster.member_pid(i).map(|p| (i, p))).take(n / 2 + 1).collect();
    if stopped.len() <= n / 2 {
        bail!("only {} of {n} members have a process to stop", stopped.len());
    }
    let at = Instant::now();
    for (_, pid) in &stopped {
        signal(*pid, Signal::SIGSTOP);
    }
    let outage = during(&clients, run, &mut violations).await;
    // kill -9 arbiter 0 mid-outage: its open holds live only in its spool.
    ctx.cluster.kill_arbiter(0);
    for (_, pid) in &stopped {
        signal(*pid, Signal::SIGCONT);
    }
    let stopped_for = at.elapsed();
    current_leader(ctx.cluster).await.context("after the majority resumed")?;
    ctx.cluster.start_arbiter(0, ctx.net)?;
    let granted = outage?;

    // Both spools shipped and emptied.
    let spools = [ctx.cluster.arbiter_spool(0), ctx.cluster.arbiter_spool(1)];
    let emptied =
        wait_for(Duration::from_secs(30), || async { spools.iter().all(|p| std::fs::metadata(p).is_ok_and(|m| m.len() == 0)) }).await;
    if !emptied {
        violations.push(format!("a fail-open spool was not shipped within 30 s of etcd's return: {spools:?}"));
    }
    let checked = check_shipped(&granted, &shipped(ctx).await?, &mut violations);
    let clients = [ctx.cluster.arbiter_client(0).await?, ctx.cluster.arbiter_client(1).await?];
    let after = protected(&clients[0], &key(&format!("p{run:08x}-after"))?, Duration::from_secs(30), &mut violations).await?;
    let members: Vec<String> = stopped.iter().map(|(i, _)| format!("e{i}")).collect();
    let found = violations.len();
    ctx.violations.extend(violations);
    Ok(Effect {
        what: format!(
            "SIGSTOP {} (a majority) for {:.1}s, past fail_open.after = {}s; kill -9 arbiter 0 mid-outage, restarted after",
            members.join(", "),
            stopped_for.as_secs_f64(),
            FAIL_OPEN_AFTER.as_secs()
        ),
        confirmed: format!(
            "both arbiters failed open ({} unprotected grants); {checked} records in /sys/unprotected/; protected grants \
             before and after (tokens {before} < {after}); {found} broken promise(s)",
            granted.len()
        ),
    })
}

/// One unprotected grant the fault made: on which arbiter, session, key.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Granted {
    arbiter: usize,
    session: u64,
    key: String,
    /// Released by its holder (else ended by etcd's return or the kill).
    released: bool,
}

/// What the fault does while the majority is stopped: waits for both
/// arbiters to fail open, checks the correctness class is refused, grants
/// open keys (one of them on both arbiters), releases some.
async fn during(clients: &[Client; 2], run: u32, violations: &mut Vec<String>) -> anyhow::Result<Vec<Granted>> {
    let mut sessions: Vec<Session> = Vec::new();
    for (a, c) in clients.iter().enumerate() {
        let s = retry(FAIL_OPEN_AFTER + Duration::from_secs(15), || c.open_session_for(OPEN_NAMESPACE, None))
            .await
            .with_context(|| format!("arbiter {a} did not fail open"))?;
        if !s.unprotected() || s.ttl() != OPEN_CLASS_TTL {
            violations.push(format!("arbiter {a} opened a session of the open class that is not unprotected (TTL {:?})", s.ttl()));
        }
        sessions.push(s);
    }
    for (a, c) in clients.iter().enumerate() {
        if let Ok(s) = c.open_session_for(GATE_NAMESPACE, None).await {
            violations.push(format!(
                "arbiter {a} opened a session of the correctness class {GATE_NAMESPACE} without a majority (unprotected: {})",
                s.unprotected()
            ));
        }
    }
    let mut granted = Vec::new();
    for (a, s) in sessions.iter().enumerate() {
        let keys = [format!("u{run:08x}-a{a}-held"), format!("u{run:08x}-a{a}-released"), format!("u{run:08x}-shared")];
        for (i, k) in keys.iter().enumerate() {
            let h = s.acquire(&key(k)?, Duration::ZERO).await.with_context(|| format!("arbiter {a}: unprotected grant of {k}"))?;
            if !h.unprotected() || h.token().expose() != 0 {
                violations.push(format!("arbiter {a}: the grant of {k} during the outage is not unprotected"));
            }
            let released = i == 1;
            if released && !h.release().await? {
                bail!("arbiter {a}: releasing unprotected {k} found no hold");
            }
            granted.push(Granted { arbiter: a, session: s.id(), key: format!("{OPEN_NAMESPACE}/{k}"), released });
        }
    }
    // One holder per key within an arbiter.
    let second = retry(Duration::from_secs(5), || clients[1].open_session_for(OPEN_NAMESPACE, None)).await?;
    let shared = key(&format!("u{run:08x}-shared"))?;
    if second.acquire(&shared, Duration::ZERO).await.is_ok() {
        violations.push(format!("arbiter 1 granted {shared} to a second session while its first held it"));
    }
    drop(second);
    tokio::time::sleep(OPEN_FOR).await;
    Ok(granted)
}

/// Every record under `/sys/unprotected/` on the entity cluster, and how
/// many times each was written.
async fn shipped(ctx: &FaultCtx<'_>) -> anyhow::Result<Vec<(Entry, i64)>> {
    let mut etcd = ctx.cluster.etcd().await?;
    let resp = etcd
        .get(holdfast_model::layout::UNPROTECTED_PREFIX, Some(etcd_client::GetOptions::new().with_prefix()))
        .await
        .context("reading /sys/unprotected/")?;
    resp.kvs()
        .iter()
        .map(|kv| {
            let e = serde_json::from_slice(kv.value())
                .with_context(|| format!("{} is not a spool record", String::from_utf8_lossy(kv.key())))?;
            Ok((e, kv.version()))
        })
        .collect()
}

/// Each grant the fault made is shipped exactly once, with exactly one
/// end: a release where it released, else the end that etcd's return made
/// (on arbiter 1) or the kill (on arbiter 0); each record written once.
/// Returns how many records it checked.
fn check_shipped(granted: &[Granted], shipped: &[(Entry, i64)], violations: &mut Vec<String>) -> usize {
    let mut found: BTreeMap<(u64, String), Vec<&(Entry, i64)>> = BTreeMap::new();
    for r in shipped {
        found.entry((r.0.session, format!("{}/{}", r.0.namespace, r.0.key))).or_default().push(r);
    }
    let mut checked = 0;
    for g in granted {
        let records = found.get(&(g.session, g.key.clone())).map(Vec::as_slice).unwrap_or_default();
        let events: Vec<(Event, &str)> = records.iter().map(|(e, _)| (e.event, e.why.as_str())).collect();
        let end = match (g.released, g.arbiter) {
            (true, _) => (Event::Release, ""),
            (false, 0) => (Event::End, "arbiter_restart"),
            (false, _) => (Event::End, "quorum_back"),
        };
        if events != [(Event::Grant, ""), end] {
            violations.push(format!(
                "arbiter {}'s unprotected grant of {} was shipped as {events:?}; expected one grant and then {end:?}",
                g.arbiter, g.key
            ));
        }
        if let Some((e, v)) = records.iter().find(|(_, v)| *v != 1) {
            violations.push(format!("the record {}/{} of {} was written {v} times; a shipped record is put once", e.spool, e.seq, g.key));
        }
        checked += records.len();
    }
    checked
}

/// A protected grant of `key` (opening and acquiring retried while etcd is
/// not yet back, or answers a call late, within `within`): its token,
/// above 0; a token-0 grant is a violation. The hold is released and its
/// session closed (retried: closing also ends a hold whose release failed;
/// failing that, the session's lease does).
async fn protected(client: &Client, key: &LockKey, within: Duration, violations: &mut Vec<String>) -> anyhow::Result<u64> {
    let (session, hold) = retry(within, || async {
        let session = client.open_session_for(OPEN_NAMESPACE, None).await?;
        let hold = session.acquire(key, Duration::ZERO).await?;
        Ok((session, hold))
    })
    .await
    .with_context(|| format!("a protected grant of {key}"))?;
    let token = hold.token().expose();
    if session.unprotected() || hold.unprotected() || token == 0 {
        violations.push(format!("a grant of {key} carries token 0 while etcd has a majority"));
    }
    let _ = hold.release().await;
    let _ = retry(Duration::from_secs(10), || session.close()).await;
    Ok(token)
}

async fn retry<T, F: std::future::Future<Output = Result<T, holdfast_client::Error>>>(
    within: Duration,
    mut f: impl FnMut() -> F,
) -> anyhow::Result<T> {
    let end = Instant::now() + within;
    loop {
        match f().await {
            Ok(v) => return Ok(v),
            Err(_) if Instant::now() < end => tokio::time::sleep(Duration::from_millis(200)).await,
            Err(e) => return Err(e.into()),
        }
    }
}

fn key(k: &str) -> anyhow::Result<LockKey> {
    Ok(LockKey::parse(&format!("{OPEN_NAMESPACE}/{k}"))?)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry(session: u64, key: &str, event: Event, why: &str) -> Entry {
        Entry {
            spool: "00000000000000aa".into(),
            seq: 1,
            event,
            at_unix_ms: 1,
            cluster: "gate".into(),
            namespace: OPEN_NAMESPACE.into(),
            key: key.into(),
            class: OPEN_NAMESPACE.into(),
            identity: "spiffe://holdfast.dev/gate/client".into(),
            session,
            why: why.into(),
        }
    }

    #[test]
    fn each_grant_must_be_shipped_once_with_its_one_end() {
        let g = |arbiter, session, k: &str, released| Granted { arbiter, session, key: format!("{OPEN_NAMESPACE}/{k}"), released };
        let granted = [g(0, 1, "a", false), g(0, 1, "b", true), g(1, 2, "a", false)];
        let good: Vec<(Entry, i64)> = [
            entry(1, "a", Event::Grant, ""),
            entry(1, "b", Event::Grant, ""),
            entry(1, "b", Event::Release, ""),
            entry(2, "a", Event::Grant, ""),
            entry(1, "a", Event::End, "arbiter_restart"),
            entry(2, "a", Event::End, "quorum_back"),
        ]
        .into_iter()
        .map(|e| (e, 1))
        .collect();
        let mut v = Vec::new();
        assert_eq!(check_shipped(&granted, &good, &mut v), 6);
        assert!(v.is_empty(), "{v:?}");
        let mut twice = good.clone();
        twice.push((entry(2, "a", Event::Grant, ""), 1));
        check_shipped(&granted, &twice, &mut v);
        assert!(v.len() == 1 && v[0].contains("shipped as"), "{v:?}");
        let missing: Vec<(Entry, i64)> = good.iter().filter(|e| e.0.session != 2).cloned().collect();
        let mut v = Vec::new();
        check_shipped(&granted, &missing, &mut v);
        assert_eq!(v.len(), 1, "{v:?}");
        let mut rewritten = good.clone();
        rewritten[0].1 = 2;
        let mut v = Vec::new();
        check_shipped(&granted, &rewritten, &mut v);
        assert!(v.len() == 1 && v[0].contains("written 2 times"), "{v:?}");
    }
}
