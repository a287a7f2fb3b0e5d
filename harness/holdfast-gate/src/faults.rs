//! Fault injection. Every fault is confirmed to have taken effect (the
//! leader changed, the process is stopped, packets were dropped, the proxy
//! held traffic, strace injected delays, the client's clock moved) and then
//! healed; the record says how it was confirmed.

use super::cluster::{self, Cluster, ELECTION_TIMEOUT};
use super::net::Net;
use anyhow::{Context, bail};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use rand::Rng;
use rand::rngs::StdRng;
use rand::seq::IndexedRandom;
use serde::Serialize;
use std::path::PathBuf;
use std::time::{Duration, Instant};

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum FaultKind {
    /// SIGSTOP the etcd leader past the election timeout.
    LeaderPause,
    /// kill -9 an etcd member, restart it.
    MemberKill,
    /// SIGSTOP a client for 2–3× its TTL (a zombie when it resumes).
    ClientPause,
    /// SIGSTOP an arbiter past the session TTL.
    ArbiterPause,
    /// kill -9 an arbiter while its transactions are in flight, restart it.
    ArbiterKill,
    /// Cut the etcd leader off from the other members.
    LeaderIsolation,
    /// Cut one follower off from the other members.
    MinorityPartition,
    /// The arbiters reach only one member, which is cut off from the majority.
    MajorityPartition,
    /// An arbiter's requests reach etcd but the answers are dropped.
    AsymmetricArbiterEtcd,
    /// Random packet loss everywhere.
    PacketLoss,
    /// Delay every chunk between arbiter 1 and etcd (TCP proxy).
    ProxyDelay,
    /// Stall all traffic between arbiter 1 and etcd (TCP proxy).
    ProxyStall,
    /// Delay fdatasync on the leader (strace fault injection).
    FsyncDelay,
    /// Jump the clocks of arbiter 1 and the clock-faulted clients forward (libfaketime).
    ClockJump,
    /// Advance the epoch under load; the old sessions' leases are revoked
    /// 1–3 s after the advance transaction (as when the advancing tool is
    /// cut off after its transaction), so they live on without records.
    /// The clients race the arbiters' switch to the new epoch, or (every
    /// other advance) are frozen until both arbiters serve it.
    EpochAdvance,
}

impl FaultKind {
    pub fn all() -> Vec<FaultKind> {
        <FaultKind as clap::ValueEnum>::value_variants().to_vec()
    }
    pub fn name(self) -> String {
        clap::ValueEnum::to_possible_value(&self).map(|v| v.get_name().to_string()).unwrap_or_default()
    }
}

/// A gate client process, as the fault injector sees it.
pub struct ClientProc {
    pub pid: u32,
    pub clock_file: Option<PathBuf>,
    pub clock_report: Option<PathBuf>,
    /// Reads `w` while the client is in the middle of a write.
    pub state_file: PathBuf,
    pub ttl: Duration,
}

#[derive(Debug, Clone, Serialize)]
pub struct FaultRecord {
    pub kind: FaultKind,
    pub seed: u64,
    pub at_ms: u64,
    pub what: String,
    pub confirmed: String,
    pub healed_after_ms: u64,
}

fn signal(pid: u32, sig: Signal) {
    let _ = kill(Pid::from_raw(pid as i32), sig);
}

fn stopped(pid: u32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .ok()
        .and_then(|s| s.rsplit_once(')').map(|(_, rest)| rest.trim_start().starts_with('T')))
        .unwrap_or(false)
}

async fn wait_for<F: std::future::Future<Output = bool>>(timeout: Duration, mut f: impl FnMut() -> F) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f().await {
            return true;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    false
}

async fn current_leader(c: &Cluster) -> anyhow::Result<usize> {
    let end = Instant::now() + Duration::from_secs(20);
    loop {
        if let Some(l) = c.leader().await {
            return Ok(l);
        }
        if Instant::now() > end {
            bail!("the etcd cluster has no agreed leader");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The leader as named by the members in `among` (the others may be cut off).
async fn leader_among(c: &Cluster, among: &[usize]) -> Option<usize> {
    let urls = c.spec.client_urls();
    let sub: Vec<String> = among.iter().map(|i| urls[*i].clone()).collect();
    // A leader outside `among` (the isolated old leader) maps to None.
    cluster::leader_of(&sub).await.map(|j| among[j])
}

/// A libfaketime timestamp file: an offset from the real clock, and the
/// rate the faked clock runs at. The rate is set when the process starts
/// and never changed: libfaketime 0.9.10 computes a faked clock as
/// `start + elapsed × rate + offset`, so a rate changed at run time moves
/// the clock by `elapsed × Δrate` at once (backwards when slowing down,
/// even with FAKETIME_XRESET). Offsets only ever grow (see `ClockJump`).
fn clock_spec(offset_s: i64, rate: f64) -> String {
    format!("{offset_s:+}s x{rate:.2}\n")
}

/// Writes a timestamp file atomically (aside, then renamed): libfaketime
/// re-reads it every second and must never see half of it (a missing rate
/// would move the clock by `elapsed × Δrate`).
pub fn write_clock_spec(path: &std::path::Path, offset_s: i64, rate: f64) -> std::io::Result<()> {
    write_aside(path, &clock_spec(offset_s, rate))
}

/// Writes `path` whole or not at all: aside (`<path>.new`), then renamed
/// over it, so that a reader in another process never sees half of it.
pub fn write_aside(path: &std::path::Path, contents: &str) -> std::io::Result<()> {
    let mut tmp = path.as_os_str().to_owned();
    tmp.push(".new");
    std::fs::write(&tmp, contents)?;
    std::fs::rename(&tmp, path)
}

/// Reads a timestamp file written by [`clock_spec`].
pub fn read_clock_spec(path: &std::path::Path) -> (i64, f64) {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let mut it = text.split_whitespace();
    let offset = it.next().and_then(|o| o.trim_end_matches('s').parse().ok()).unwrap_or(0);
    let rate = it.next().and_then(|r| r.strip_prefix('x')?.parse().ok()).unwrap_or(1.0);
    (offset, rate)
}

/// A process's clock report: (its own CLOCK_MONOTONIC, the raw one), in ns.
pub fn clock_report(report: &std::path::Path) -> Option<(i128, i128)> {
    let text = std::fs::read_to_string(report).ok()?;
    let mut it = text.split_whitespace().map(|v| v.parse::<i128>().ok());
    Some((it.next()??, it.next()??))
}

/// How far a process's clock is from the real one, in ms.
fn clock_offset_ms(report: &PathBuf) -> Option<i64> {
    let (own, raw) = clock_report(report)?;
    Some(((own - raw) / 1_000_000) as i64)
}

/// Injects `kind`, confirms it, keeps it for `hold`, heals it.
pub async fn inject(
    kind: FaultKind,
    seed: u64,
    rng: &mut StdRng,
    net: &Net,
    c: &mut Cluster,
    clients: &[ClientProc],
    hold: Duration,
    t0: Instant,
) -> anyhow::Result<FaultRecord> {
    let at_ms = t0.elapsed().as_millis() as u64;
    let ttl = clients.first().map(|c| c.ttl).unwrap_or(Duration::from_secs(5));
    let hold = hold.max(ELECTION_TIMEOUT * 4);
    let (what, confirmed) = match kind {
        FaultKind::LeaderPause => {
            let l = current_leader(c).await?;
            let pid = c.member_pid(l).context("the leader has no process")?;
            signal(pid, Signal::SIGSTOP);
            let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
            let changed = wait_for(Duration::from_secs(10), || async { leader_among(c, &others).await.is_some_and(|n| n != l) }).await;
            tokio::time::sleep(hold).await;
            signal(pid, Signal::SIGCONT);
            if !changed {
                bail!("leader e{l} paused but no new leader was elected within 10 s");
            }
            (format!("SIGSTOP leader e{l} for {hold:?}"), "a new leader was elected".to_string())
        }
        FaultKind::MemberKill => {
            // The leader: the harsher case, and a leader change to count.
            let i = current_leader(c).await?;
            c.kill_member(i);
            tokio::time::sleep(hold).await;
            c.restart_member(i, net)?;
            let back = wait_for(Duration::from_secs(30), || async { c.applied().await[i].is_some() }).await;
            if !back {
                bail!("member e{i} did not answer within 30 s of its restart");
            }
            (format!("kill -9 leader e{i}, restart after {hold:?}"), "the member was gone, then answered again".into())
        }
        FaultKind::ClientPause => {
            // Preferably a client in the middle of a write (it read the
            // record and is about to write it back): the zombie write that
            // an unfenced resource would lose an update to.
            let writing = |p: &&ClientProc| std::fs::read(&p.state_file).is_ok_and(|s| s == b"w");
            let deadline = Instant::now() + Duration::from_secs(3);
            let mut mid_write = None;
            while mid_write.is_none() && Instant::now() < deadline {
                mid_write = clients.iter().find(writing);
                if mid_write.is_none() {
                    tokio::time::sleep(Duration::from_millis(2)).await;
                }
            }
            let p = match mid_write {
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
            let when = if mid_write.is_some() { "in the middle of a write" } else { "between operations" };
            (format!("SIGSTOP client pid {} {when} for {pause:?}", p.pid), "the process was in state T".into())
        }
        FaultKind::ArbiterPause => {
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
            (format!("SIGSTOP arbiter {a} for {pause:?}"), "the process was in state T".into())
        }
        FaultKind::ArbiterKill => {
            // Arbiter 1 reaches etcd through the proxies: hold etcd's answers
            // so that its transactions are applied but unanswered, then kill
            // it — a kill in the middle of a Txn, for certain.
            let held = |c: &Cluster| c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum::<u64>();
            let before = held(c);
            for p in &c.proxies {
                p.set_replies_stalled(true);
            }
            tokio::time::sleep(Duration::from_millis(rng.random_range(200..800))).await;
            let in_flight = held(c) - before;
            c.kill_arbiter(1);
            for p in &c.proxies {
                p.clear();
            }
            tokio::time::sleep(Duration::from_secs(1)).await;
            c.start_arbiter(1, net)?;
            if in_flight == 0 {
                bail!("no etcd answer to arbiter 1 was in flight when it was killed");
            }
            (
                "kill -9 arbiter 1 with etcd's answers held (transactions applied, unanswered), restart".to_string(),
                format!("{in_flight} answers in flight at the kill; the new process sent READY=1"),
            )
        }
        FaultKind::LeaderIsolation => {
            let l = current_leader(c).await?;
            let others: Vec<usize> = (0..3).filter(|i| *i != l).collect();
            for o in &others {
                net.cut(&net.hosts[l], &net.hosts[*o])?;
            }
            let changed = wait_for(Duration::from_secs(10), || async { leader_among(c, &others).await.is_some_and(|n| n != l) }).await;
            tokio::time::sleep(hold).await;
            net.heal()?;
            if !changed {
                bail!("leader e{l} isolated but the others elected no new leader within 10 s");
            }
            (format!("isolate leader e{l} from its peers for {hold:?}"), "the majority elected a new leader".into())
        }
        FaultKind::MinorityPartition | FaultKind::MajorityPartition => {
            let l = current_leader(c).await?;
            // Minority: a follower alone. Majority: the arbiters see only
            // the lone member, cut off from the two that keep the quorum.
            let lone = *(0..3).filter(|i| *i != l).collect::<Vec<_>>().choose(rng).context("no follower")?;
            let rest: Vec<usize> = (0..3).filter(|i| *i != lone).collect();
            for r in &rest {
                net.cut(&net.hosts[lone], &net.hosts[*r])?;
            }
            if kind == FaultKind::MajorityPartition {
                for a in 3..5 {
                    for r in &rest {
                        net.cut(&net.hosts[a], &net.hosts[*r])?;
                    }
                }
                // Arbiter 1 reaches etcd through the proxies: stall those to the majority.
                for r in &rest {
                    c.proxies[*r].set_stalled(true);
                }
            }
            let before = c.applied().await;
            tokio::time::sleep(hold).await;
            let after = c.applied().await;
            let dropped = net.dropped(&net.hosts[lone]);
            net.heal()?;
            for p in &c.proxies {
                p.clear();
            }
            let lone_moved = matches!((before[lone], after[lone]), (Some(b), Some(a)) if a > b);
            let rest_moved = rest.iter().any(|r| matches!((before[*r], after[*r]), (Some(b), Some(a)) if a > b));
            let confirmed = format!(
                "lone member e{lone} applied index {}, majority {}; packets dropped at e{lone}: {dropped}",
                if lone_moved { "moved" } else { "stalled" },
                if rest_moved { "moved" } else { "stalled" }
            );
            if lone_moved {
                bail!("partition of e{lone} did not take effect: {confirmed}");
            }
            let what = if kind == FaultKind::MinorityPartition {
                format!("partition e{lone} | {rest:?} for {hold:?}")
            } else {
                format!("partition e{lone}+arbiters | {rest:?} for {hold:?}")
            };
            (what, confirmed)
        }
        FaultKind::AsymmetricArbiterEtcd => {
            let a = rng.random_range(0..2usize);
            let host = &net.hosts[3 + a];
            let members: Vec<&super::net::Host> = net.hosts[0..3].iter().collect();
            net.drop_from(host, &members)?;
            if a == 1 {
                // Arbiter 1 reaches etcd through the proxies on the gateway.
                net.drop_from(host, &[&super::net::Host { ns: String::new(), ip: net.gateway.clone() }])?;
            }
            tokio::time::sleep(hold).await;
            let dropped = net.dropped(host);
            net.heal()?;
            if dropped == 0 {
                bail!("no answer from etcd to arbiter {a} was dropped");
            }
            (format!("drop etcd's answers to arbiter {a} (its requests still arrive) for {hold:?}"), format!("{dropped} packets dropped"))
        }
        FaultKind::PacketLoss => {
            let p = rng.random_range(0.05..0.25);
            for h in &net.hosts {
                net.lossy(h, p)?;
            }
            tokio::time::sleep(hold).await;
            let dropped: u64 = net.hosts.iter().map(|h| net.dropped(h)).sum();
            net.heal()?;
            if dropped == 0 {
                bail!("packet loss dropped nothing");
            }
            (format!("drop {:.0}% of packets everywhere for {hold:?}", p * 100.0), format!("{dropped} packets dropped"))
        }
        FaultKind::ProxyDelay | FaultKind::ProxyStall => {
            let before: u64 = c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum();
            let delay = Duration::from_millis(rng.random_range(50..400));
            for p in &c.proxies {
                if kind == FaultKind::ProxyDelay {
                    p.set_delay(delay);
                } else {
                    p.set_stalled(true);
                }
            }
            tokio::time::sleep(hold).await;
            for p in &c.proxies {
                p.clear();
            }
            let after: u64 = c.proxies.iter().map(|p| p.affected.load(std::sync::atomic::Ordering::Relaxed)).sum();
            if after == before {
                bail!("no traffic went through the proxies");
            }
            let what = if kind == FaultKind::ProxyDelay {
                format!("delay arbiter 1 <-> etcd by {delay:?} per chunk for {hold:?}")
            } else {
                format!("stall arbiter 1 <-> etcd for {hold:?}")
            };
            (what, format!("{} chunks held", after - before))
        }
        FaultKind::FsyncDelay => {
            let l = current_leader(c).await?;
            let pid = c.member_pid(l).context("the leader has no process")?;
            let delay_us = rng.random_range(50_000..300_000u64);
            let out = c.dir.join(format!("strace-{at_ms}.log"));
            let mut strace = std::process::Command::new("strace")
                .args([
                    "-f",
                    "-qq",
                    "-p",
                    &pid.to_string(),
                    "-e",
                    "trace=fdatasync,fsync",
                    "-e",
                    &format!("inject=fdatasync,fsync:delay_enter={delay_us}"),
                    "-o",
                ])
                .arg(&out)
                .stdin(std::process::Stdio::null())
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .context("starting strace")?;
            tokio::time::sleep(hold).await;
            signal(strace.id(), Signal::SIGINT); // detaches cleanly
            let _ = strace.wait();
            let injected = std::fs::read_to_string(&out).unwrap_or_default().lines().filter(|l| l.contains("DELAYED")).count();
            if injected == 0 {
                bail!("strace injected no fdatasync delay into e{l} (see {})", out.display());
            }
            (format!("delay fdatasync/fsync on leader e{l} by {}ms for {hold:?}", delay_us / 1000), format!("{injected} delayed syncs"))
        }
        FaultKind::ClockJump => {
            // Forward only, and cumulative (never set back): CLOCK_MONOTONIC
            // never goes back on Linux, so a backward jump of the faked
            // monotonic clock would test a clock that cannot exist (and
            // stall tokio's timers). A forward jump of both clocks is what a
            // VM suspend/resume or a stopped-then-stepped host does.
            let jump: i64 = rng.random_range(5..30);
            let faked: Vec<&ClientProc> = clients.iter().filter(|p| p.clock_file.is_some()).collect();
            // A client just started may not have reported its clock yet.
            let reported = |p: &&ClientProc| p.clock_report.as_ref().and_then(clock_offset_ms).is_some();
            wait_for(Duration::from_secs(5), || async { faked.iter().any(reported) }).await;
            let before: Vec<Option<i64>> = faked.iter().map(|p| p.clock_report.as_ref().and_then(clock_offset_ms)).collect();
            for f in faked.iter().filter_map(|p| p.clock_file.as_ref()).chain(c.arbiters.iter().filter_map(|a| a.clock_file.as_ref())) {
                let (now, rate) = read_clock_spec(f);
                write_clock_spec(f, now + jump, rate)?;
            }
            // libfaketime re-reads its file once a second.
            tokio::time::sleep(hold.max(Duration::from_millis(2500))).await;
            let after: Vec<Option<i64>> = faked.iter().map(|p| p.clock_report.as_ref().and_then(clock_offset_ms)).collect();
            // The clients' clocks also run at their own rates (±15 % over
            // the hold: well inside the tolerance).
            let moved = before
                .iter()
                .zip(&after)
                .filter(|(b, a)| matches!((b, a), (Some(b), Some(a)) if (a - b - jump * 1000).abs() < 2000))
                .count();
            if moved == 0 {
                bail!("no clock-faulted client saw its clock jump by {jump}s");
            }
            (
                format!("jump the clocks of arbiter 1 and {} clients forward by {jump}s", faked.len()),
                format!("{moved} clients saw the jump"),
            )
        }
        FaultKind::EpochAdvance => {
            // Two orders, alternating by epoch: the clients race the
            // arbiters' switch to the new epoch (a grant in the old epoch
            // after the advance is what the epoch compare prevents), or the
            // clients are frozen across the switch and come back to an
            // arbiter serving the new epoch with sessions whose records the
            // advance deleted but whose leases still live (a grant on them
            // is what the session-record compare prevents). In production
            // the second is the common case: an arbiter re-checks within a
            // second, and most clients' next call comes later.
            let etcd = c.holdfast_etcd().await?;
            let from = cluster::epoch_of(&etcd).await?;
            let to = from + 1;
            let frozen = to % 2 == 1;
            let late = Duration::from_millis(rng.random_range(1000..3000));
            let serving = format!("state=serving epoch {to}");
            let logs: Vec<PathBuf> = c.arbiters.iter().map(|a| a.launch.log.clone()).collect();
            let both_serve = || {
                let (logs, serving) = (&logs, &serving);
                async move { logs.iter().all(|l| std::fs::read_to_string(l).is_ok_and(|t| t.contains(serving.as_str()))) }
            };
            if frozen {
                for p in clients {
                    signal(p.pid, Signal::SIGSTOP);
                }
            }
            let advanced = holdfast_store::epoch::advance_txn(&etcd, from).await;
            let switched = wait_for(Duration::from_secs(10), both_serve).await;
            if frozen {
                for p in clients {
                    signal(p.pid, Signal::SIGCONT);
                }
            }
            let advanced = advanced.context("the advance transaction")?;
            tokio::time::sleep(late).await;
            let revoked = holdfast_store::epoch::revoke_sessions(&etcd, &advanced.old_leases).await;
            if !switched {
                bail!("epoch {to} committed but not every arbiter serves it within 10 s");
            }
            let order = if frozen { "clients frozen until both arbiters served it" } else { "clients racing the arbiters' switch" };
            (
                format!(
                    "advance epoch {from} -> {to} ({order}); the {} old sessions' leases revoked {late:?} later",
                    advanced.old_leases.len()
                ),
                format!("both arbiters serve epoch {to}; {revoked} old leases were still alive at the revoke"),
            )
        }
    };
    // Healed: etcd has a leader again and both arbiters run.
    let healed = Instant::now();
    current_leader(c).await.context("after healing")?;
    Ok(FaultRecord { kind, seed, at_ms, what, confirmed, healed_after_ms: healed.elapsed().as_millis() as u64 })
}
