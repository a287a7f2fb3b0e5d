//! Process faults: SIGSTOP and kill -9 of etcd members, arbiters and
//! clients, confirmed by a new leader, state T in `/proc`, a restarted
//! process answering, or answers in flight at the kill.

use super::{ClientProc, Effect, FaultCtx, current_leader, leader_among, signal, wait_for};
use crate::cluster::Cluster;
use anyhow::{Context, bail};
use nix::sys::signal::Signal;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use std::time::{Duration, Instant};

/// SIGSTOP the etcd leader for [`leader_stop`]; a new leader must be
/// elected meanwhile.
pub async fn leader_pause(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let ttl = ctx.clients.first().map(|p| p.ttl).unwrap_or(Duration::from_secs(5));
    let stop = leader_stop(ctx.leader_pause_max.unwrap_or_else(|| leader_stop_bound(ttl)), hold, rng);
    let l = current_leader(c).await?;
    let pid = c.member_pid(l).context("the leader has no process")?;
    let stopped = Instant::now();
    signal(pid, Signal::SIGSTOP);
    let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
    let changed = wait_for(Duration::from_secs(10), || async { leader_among(c, &others).await.is_some_and(|n| n != l) }).await;
    tokio::time::sleep(stop.saturating_sub(stopped.elapsed())).await;
    signal(pid, Signal::SIGCONT);
    let stopped = stopped.elapsed();
    if !changed {
        bail!("leader e{l} paused but no new leader was elected within 10 s");
    }
    Ok(Effect { what: format!("SIGSTOP leader e{l} for {:.2}s", stopped.as_secs_f64()), confirmed: "a new leader was elected".to_string() })
}

/// The longest the leader-pause fault stops the etcd leader: two TTLs.
/// A leader stopped longer than the TTL minus the renewal period wakes up
/// with leases it thinks expired — leases the new leader has been renewing
/// — and its lessor proposes their revokes before it learns it was
/// deposed; a follower forwards those proposals to the new leader, which
/// commits them (`revokeExpiredLeases` in `server/lease/lessor.go`; etcd
/// 3.6's guard, `ensureLeadership` in `server/etcdserver/server.go`, etcd
/// #15247, asks nobody while the Raft loop ticked within three ticks, which
/// it has just after SIGCONT). Seen on 3.4.23 and the pinned 3.6.17
/// (docs/gate.md, "How long a leader may stop"). The arbiter does not count
/// keepalives while such a leader may wake (`holdfast_arbiter::deposed`);
/// stops up to two TTLs prove it, and the `no_deposed_leader_check`
/// mutation shows what happens without it.
pub fn leader_stop_bound(ttl: Duration) -> Duration {
    ttl * 2
}

/// How long the leader-pause fault stops the leader: `max` if the fault's
/// `hold` is at least that, else uniformly between `hold` and `max`. `max`
/// is [`leader_stop_bound`] unless `holdfast-gate --leader-pause-max` sets
/// it.
pub fn leader_stop(max: Duration, hold: Duration, rng: &mut StdRng) -> Duration {
    if hold >= max {
        return max;
    }
    Duration::from_millis(rng.random_range(hold.as_millis() as u64..=max.as_millis() as u64))
}

/// kill -9 the etcd leader, restart it after `hold`; it must answer again.
pub async fn member_kill(ctx: &mut FaultCtx<'_>, hold: Duration) -> anyhow::Result<Effect> {
    // The leader: the harsher case, and a leader change to count.
    let i = current_leader(ctx.cluster).await?;
    ctx.cluster.kill_member(i);
    tokio::time::sleep(hold).await;
    ctx.cluster.restart_member(i, ctx.net)?;
    let c: &Cluster = ctx.cluster;
    let back = wait_for(Duration::from_secs(30), || async { c.applied().await[i].is_some() }).await;
    if !back {
        bail!("member e{i} did not answer within 30 s of its restart");
    }
    Ok(Effect {
        what: format!("kill -9 leader e{i}, restart after {hold:?}"),
        confirmed: "the member was gone, then answered again".into(),
    })
}

/// The first client whose state file reads `state` (see the client's
/// `--state-file`), polled every 2 ms until `deadline`.
async fn find_state<'a>(clients: &'a [ClientProc], state: &[u8], deadline: Instant) -> Option<&'a ClientProc> {
    loop {
        if let Some(p) = clients.iter().find(|p| std::fs::read(&p.state_file).is_ok_and(|s| s == state)) {
            return Some(p);
        }
        if Instant::now() >= deadline {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
}

/// SIGSTOP a client for 2–3× its TTL, preferably in the middle of a write,
/// else while it holds a key (it releases late, with a token its expired
/// session no longer owns).
pub async fn client_pause(ctx: &FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    let clients = ctx.clients;
    let ttl = client_ttl(clients);
    // Preferably a client in the middle of a write (it read the
    // record and is about to write it back): the zombie write that
    // an unfenced resource would lose an update to.
    let mid_write = find_state(clients, b"w", Instant::now() + Duration::from_secs(3)).await;
    // Else a client holding a key (between its grant and its release).
    let mid_hold = if mid_write.is_none() { find_state(clients, b"h", Instant::now() + Duration::from_secs(3)).await } else { None };
    let p = match mid_write.or(mid_hold) {
        Some(p) => p,
        None => clients.choose(rng).context("no clients")?,
    };
    let pause = ttl * 2 + Duration::from_millis(rng.random_range(0..ttl.as_millis() as u64));
    signal(p.pid, Signal::SIGSTOP);
    let ok = wait_for(Duration::from_secs(2), || async { stopped(p.pid) }).await;
    tokio::time::sleep(pause).await;
    signal(p.pid, Signal::SIGCONT);
    if !ok {
        bail!("client pid {} did not stop", p.pid);
    }
    let when = match (mid_write, mid_hold) {
        (Some(_), _) => "in the middle of a write",
        (None, Some(_)) => "while it held a key",
        (None, None) => "between operations",
    };
    Ok(Effect { what: format!("SIGSTOP client pid {} {when} for {pause:?}", p.pid), confirmed: "the process was in state T".into() })
}

/// SIGSTOP an arbiter past the session TTL.
pub async fn arbiter_pause(ctx: &FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    let c: &Cluster = ctx.cluster;
    let ttl = client_ttl(ctx.clients);
    let a = rng.random_range(0..c.arbiters.len());
    let pid = c.arbiter_pid(a).context("arbiter not running")?;
    let pause = ttl + Duration::from_millis(rng.random_range(500..2500));
    signal(pid, Signal::SIGSTOP);
    let ok = wait_for(Duration::from_secs(2), || async { stopped(pid) }).await;
    tokio::time::sleep(pause).await;
    signal(pid, Signal::SIGCONT);
    if !ok {
        bail!("arbiter {a} did not stop");
    }
    Ok(Effect { what: format!("SIGSTOP arbiter {a} for {pause:?}"), confirmed: "the process was in state T".into() })
}

/// kill -9 arbiter 1 while etcd's answers to it are held, restart it.
pub async fn arbiter_kill(ctx: &mut FaultCtx<'_>, rng: &mut StdRng) -> anyhow::Result<Effect> {
    // Arbiter 1 reaches etcd through the proxies: hold etcd's answers
    // so that its transactions are applied but unanswered, then kill
    // it — a kill in the middle of a Txn, for certain.
    let held = |c: &Cluster| c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>();
    let before = held(ctx.cluster);
    for p in &ctx.cluster.proxies {
        p.set_replies_stalled(true);
    }
    tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
    let in_flight = held(ctx.cluster) - before;
    ctx.cluster.kill_arbiter(1);
    for p in &ctx.cluster.proxies {
        p.clear();
    }
    tokio::time::sleep(Duration::from_secs(1)).await;
    ctx.cluster.start_arbiter(1, ctx.net)?;
    if in_flight == 0 {
        bail!("no etcd answer to arbiter 1 was in flight when it was killed");
    }
    Ok(Effect {
        what: "kill -9 arbiter 1 with etcd's answers held (transactions applied, unanswered), restart".to_string(),
        confirmed: format!("{in_flight} answers in flight at the kill; the new process sent READY=1"),
    })
}

/// The clients' lease TTL (they all share one).
fn client_ttl(clients: &[ClientProc]) -> Duration {
    clients.first().map(|c| c.ttl).unwrap_or(Duration::from_secs(5))
}

fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}

#[cfg(test)]
mod tests {
    use super::{leader_stop, leader_stop_bound};
    use crate::cluster::ELECTION_TIMEOUT;
    use rand::SeedableRng;
    use rand::rngs::StdRng;
    use std::time::Duration;

    /// The stop is never longer than the bound and, when the fault's hold
    /// is shorter than the bound, drawn across the whole range between them.
    #[test]
    fn a_leader_stop_is_drawn_between_the_hold_and_the_bound() {
        let mut rng = StdRng::seed_from_u64(7);
        let max = Duration::from_secs(10);
        let stops: Vec<Duration> = (0..200).map(|_| leader_stop(max, Duration::from_secs(2), &mut rng)).collect();
        assert!(stops.iter().all(|s| *s >= Duration::from_secs(2) && *s <= max), "{stops:?}");
        assert!(stops.iter().any(|s| *s < Duration::from_secs(4)) && stops.iter().any(|s| *s > Duration::from_secs(8)), "{stops:?}");
        // A hold at or past the bound stops for the bound.
        assert_eq!(leader_stop(Duration::from_millis(2333), Duration::from_secs(3), &mut rng), Duration::from_millis(2333));
    }

    #[test]
    fn a_paused_leader_stays_stopped_up_to_two_ttls_and_long_enough_for_an_election() {
        for secs in [5, 15, 60] {
            let ttl = Duration::from_secs(secs);
            let stop = leader_stop_bound(ttl);
            // Past the TTL: every lease renewed through it looks expired
            // to it when it wakes, the case the arbiter must survive.
            assert!(stop >= ttl * 2, "TTL {ttl:?}: stop {stop:?}");
            assert!(stop >= ELECTION_TIMEOUT * 4, "TTL {ttl:?}: stop {stop:?}");
        }
        assert_eq!(leader_stop_bound(Duration::from_secs(5)), Duration::from_secs(10));
    }
}
