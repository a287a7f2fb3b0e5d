//! Randomized: sequential histories generated from the model pass all three
//! checkers; mutated copies fail.

mod common;

use std::collections::BTreeMap;

use common::{B, tok};
use holdfast_checkers::{History, OpKind, Outcome, Rule, check_all, etcd_log, fence, linearizable};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

const KEYS: [&str; 2] = ["ns/a", "ns/b"];

/// A valid run from the model: sessions 1..=4 contend for two keys; holds
/// end by release or lease expiry; holders (and expired zombies) write to the
/// key's record through a fence that accepts `token >= highest accepted`.
/// Each lock operation takes effect at time `t` (steps of 20 ns); with
/// `jitter` > 0 its recorded interval stretches up to `jitter` either side,
/// so operations overlap but the history stays linearizable.
fn generate_with(seed: u64, jitter: u64) -> History {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut span = |t: u64| -> (u64, u64) {
        if jitter == 0 { (t, t + 10) } else { (t.saturating_sub(rng.random_range(0..jitter)), t + rng.random_range(0..jitter)) }
    };
    let mut rng = StdRng::seed_from_u64(seed ^ 0x5eed);
    let mut b = B::new();
    let mut rev = 1u64;
    let mut t = 0u64;
    let mut holder: BTreeMap<&str, Option<(i64, u64)>> = BTreeMap::new();
    let mut last_token: BTreeMap<i64, BTreeMap<&str, u64>> = BTreeMap::new();
    let mut fence_high: BTreeMap<&str, u64> = BTreeMap::new();
    let mut counters: BTreeMap<String, u64> = BTreeMap::new();
    for _ in 0..rng.random_range(10..60) {
        let key = KEYS[rng.random_range(0..KEYS.len())];
        let record = format!("rec-{key}");
        let s: i64 = rng.random_range(1..=4);
        t += 20;
        match holder.get(key).copied().flatten() {
            None => {
                rev += 1;
                let unknown = rng.random_bool(0.1);
                if unknown {
                    let (i, c) = span(t);
                    b.acq(key, s, i, c, Outcome::Unknown, None);
                } else {
                    let (i, c) = span(t);
                    b.ok_acq(key, s, i, c, rev);
                }
                b.put(key, rev, s);
                holder.insert(key, Some((s, rev)));
                last_token.entry(s).or_default().insert(key, rev);
            }
            Some((h, hrev)) if h == s => {
                if rng.random_bool(0.15) {
                    // A retried acquire: the arbiter returns the same hold.
                    let (i, c) = span(t);
                    b.ok_acq(key, s, i, c, hrev);
                } else if rng.random_bool(0.6) {
                    let accept = tok(hrev) >= fence_high.get(key).copied().unwrap_or(0);
                    assert!(accept);
                    fence_high.insert(key, tok(hrev));
                    *counters.entry(record.clone()).or_default() += 1;
                    b.write(key, &record, s, hrev, t, Outcome::Ok, Some(true));
                } else {
                    rev += 1;
                    let (i, c) = span(t);
                    b.rel(key, s, i, c, Outcome::Ok, hrev);
                    b.del(key, rev, hrev, s, false);
                    holder.insert(key, None);
                }
            }
            Some((h, hrev)) => {
                if rng.random_bool(0.5) {
                    b.acq(key, s, t, t + 10, Outcome::Fail, None);
                } else {
                    rev += 1;
                    b.del(key, rev, hrev, h, true);
                    holder.insert(key, None);
                }
            }
        }
        // Sometimes a zombie writes with an old token.
        if rng.random_bool(0.2) {
            let z: i64 = rng.random_range(1..=4);
            if let Some(&zrev) = last_token.get(&z).and_then(|m| m.get(key)) {
                t += 20;
                let accept = tok(zrev) >= fence_high.get(key).copied().unwrap_or(0);
                if accept {
                    fence_high.insert(key, tok(zrev));
                    *counters.entry(record.clone()).or_default() += 1;
                }
                let outcome = if accept { Outcome::Ok } else { Outcome::Fail };
                b.write(key, &record, z, zrev, t, outcome, Some(accept));
            }
        }
    }
    for (r, v) in counters {
        b.counter(&r, v);
    }
    b.h
}

/// A sequential run (no overlapping intervals).
fn generate(seed: u64) -> History {
    generate_with(seed, 0)
}

fn passes(h: &History) -> bool {
    check_all(h, &linearizable::Config::default()).iter().all(|r| r.passed())
}

/// Indices of ok acquires, grouped by key.
fn ok_grants(h: &History) -> BTreeMap<String, Vec<usize>> {
    let mut m: BTreeMap<String, Vec<usize>> = BTreeMap::new();
    for (i, op) in h.ops.iter().enumerate() {
        if let (OpKind::Acquire { key }, Outcome::Ok) = (&op.kind, op.outcome) {
            m.entry(key.clone()).or_default().push(i);
        }
    }
    m
}

#[test]
fn generated_sequential_histories_pass_all_checkers() {
    for seed in 0..300 {
        let h = generate(seed);
        for r in check_all(&h, &linearizable::Config::default()) {
            assert!(r.passed(), "seed {seed}: {:?} {:?}", r.violations, r.inconclusive);
        }
    }
}

#[test]
fn generated_concurrent_histories_pass_all_checkers() {
    for seed in 0..300 {
        let h = generate_with(seed, 70);
        for r in check_all(&h, &linearizable::Config::default()) {
            assert!(r.passed(), "seed {seed}: {:?} {:?}", r.violations, r.inconclusive);
        }
    }
}

#[test]
fn swapping_two_grant_tokens_is_caught_by_c1_and_c3() {
    let mut tried = 0;
    for seed in 0..300 {
        let mut h = generate(seed);
        // Two grants of one key with different tokens (not a retry pair).
        let found = ok_grants(&h).into_values().find_map(|v| {
            let first = *v.first()?;
            let other = v.iter().copied().find(|&j| h.ops[j].token != h.ops[first].token)?;
            Some((first, other))
        });
        let Some((i, j)) = found else { continue };
        let (ti, tj) = (h.ops[i].token, h.ops[j].token);
        h.ops[i].token = tj;
        h.ops[j].token = ti;
        tried += 1;
        assert!(!etcd_log::check(&h).passed(), "seed {seed}: C1 missed a token swap");
        assert!(!linearizable::check(&h, &linearizable::Config::default()).passed(), "seed {seed}: C3 missed a token swap");
    }
    assert!(tried > 50, "only {tried} histories had two grants on one key");
}

#[test]
fn duplicating_a_grant_is_caught_as_token_reuse_and_non_linearizable() {
    let mut tried = 0;
    for seed in 0..300 {
        let mut h = generate(seed);
        let Some(&i) = ok_grants(&h).values().flatten().next() else {
            continue;
        };
        let end = h.ops.iter().filter_map(|o| o.complete_ns).max().unwrap_or(0);
        // The same token handed to another session.
        let mut dup = h.ops[i].clone();
        dup.session = dup.session.map(|s| s % 4 + 1);
        dup.invoke_ns = end + 100;
        dup.complete_ns = Some(end + 110);
        h.ops.push(dup);
        tried += 1;
        assert!(etcd_log::check(&h).has(Rule::TokenReused), "seed {seed}");
        assert!(linearizable::check(&h, &linearizable::Config::default()).has(Rule::NotLinearizable), "seed {seed}");
        assert!(!passes(&h));
    }
    assert!(tried > 200);
}

#[test]
fn losing_an_acknowledged_increment_is_caught_by_c2() {
    let mut tried = 0;
    for seed in 0..300 {
        let mut h = generate(seed);
        let Some((_, v)) = h.final_counters.iter_mut().find(|(_, v)| **v > 0) else {
            continue;
        };
        *v -= 1;
        tried += 1;
        assert!(fence::check(&h).has(Rule::LostUpdate), "seed {seed}");
    }
    assert!(tried > 100);
}
