//! Hall-aware placement: golden outputs for the example inventories in
//! config/, and property tests over random inventories.
//!
//! Regenerate the golden files after an intended change with
//! `UPDATE_GOLDEN=1 cargo test -p holdfast-provision --test plan` (the run that
//! writes a golden file fails), review the diff, and run again without it.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use common::bin;
use holdfast_provision::config::Tier;
use holdfast_provision::plan::{self, ClusterSpec, Host, Inventory, TokenSource};
use proptest::prelude::*;

fn config_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../config")
}

fn golden(name: &str, actual: &str) {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/golden").join(name);
    let want = std::fs::read_to_string(&path).ok();
    if want.as_deref() == Some(actual) {
        return;
    }
    // A run that writes the golden file never passes: the next run, without
    // UPDATE_GOLDEN, compares against what was written (review the diff).
    if std::env::var_os("UPDATE_GOLDEN").is_some() {
        std::fs::write(&path, actual).expect("write golden");
        panic!("{} written; review the diff, then run again without UPDATE_GOLDEN", path.display());
    }
    let Some(want) = want else { panic!("{} is missing; run with UPDATE_GOLDEN=1 to create it", path.display()) };
    assert_eq!(actual, want, "output differs from {}", path.display());
}

fn run_plan(inventory: &str, extra: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(bin()).args(["plan", "--inventory"]).arg(config_dir().join(inventory)).args(extra).output().expect("run plan");
    (out.status.code(), String::from_utf8_lossy(&out.stdout).into_owned(), String::from_utf8_lossy(&out.stderr).into_owned())
}

#[test]
fn golden_three_halls_plan_text_and_json() {
    let (code, text, err) = run_plan("inventory-three-halls.toml", &["--token-seed", "golden"]);
    assert_eq!(code, Some(0), "{err}");
    golden("plan-three-halls.txt", &text);
    let (code, json, _) = run_plan("inventory-three-halls.toml", &["--token-seed", "golden", "--json"]);
    assert_eq!(code, Some(0));
    golden("plan-three-halls.json", &json);
}

#[test]
fn golden_two_halls_is_refused_with_reasons() {
    let (code, _, err) = run_plan("inventory-two-halls.toml", &["--token-seed", "golden"]);
    assert_eq!(code, Some(65));
    golden("plan-two-halls.err", &err);
}

#[test]
fn golden_pinned_majority_is_refused_with_reasons() {
    let (code, _, err) = run_plan("inventory-pinned.toml", &["--token-seed", "golden"]);
    assert_eq!(code, Some(65));
    assert!(err.contains("hall hall-a would hold 3 of 5 members, a majority"), "{err}");
    golden("plan-pinned.err", &err);
}

#[test]
fn plan_output_is_deterministic_and_tokens_are_fresh_per_creation() {
    let a = run_plan("inventory-three-halls.toml", &["--token-seed", "change-1234", "--json"]);
    let b = run_plan("inventory-three-halls.toml", &["--token-seed", "change-1234", "--json"]);
    assert_eq!(a, b, "same inventory and seed, same bytes");
    let c = run_plan("inventory-three-halls.toml", &["--token-seed", "change-1235", "--json"]);
    let tokens = |s: &str| -> Vec<String> {
        let v: serde_json::Value = serde_json::from_str(s).expect("json");
        v["plan"]["clusters"]
            .as_array()
            .expect("clusters")
            .iter()
            .map(|c| c["initial_cluster_token"].as_str().expect("token").to_string())
            .collect()
    };
    let (ta, tc) = (tokens(&a.1), tokens(&c.1));
    assert!(ta.iter().zip(&tc).all(|(x, y)| x != y), "a new seed gives every cluster a new token");
    let mut uniq = ta.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), ta.len(), "every cluster has its own token");
    // Without a seed, tokens are random: two runs differ.
    let r1 = tokens(&run_plan("inventory-three-halls.toml", &["--json"]).1);
    let r2 = tokens(&run_plan("inventory-three-halls.toml", &["--json"]).1);
    assert!(r1.iter().zip(&r2).all(|(x, y)| x != y));
}

#[test]
fn plan_out_writes_one_env_file_per_member_idempotently() {
    let dir = tempfile::tempdir().expect("tempdir");
    let out = dir.path().join("members");
    let args = ["--token-seed", "golden", "--out", out.to_str().expect("utf8")];
    let (code, _, err) = run_plan("inventory-three-halls.toml", &["--dry-run", args[0], args[1], args[2], args[3]]);
    assert_eq!(code, Some(0), "{err}");
    assert!(!out.exists(), "dry run writes nothing");
    let (code, text, _) = run_plan("inventory-three-halls.toml", &args);
    assert_eq!(code, Some(0));
    assert_eq!(std::fs::read_dir(&out).expect("dir").count(), 11);
    let env = std::fs::read_to_string(out.join("etcd-c1.env")).expect("env");
    golden("etcd-c1.env", &env);
    assert!(text.contains("write "));
    let (_, text, _) = run_plan("inventory-three-halls.toml", &args);
    assert!(!text.contains("write ") && text.contains("unchanged:"), "{text}");
}

// ---- property tests -------------------------------------------------------

/// Independent oracle: exhaustive search over per-hall member counts.
fn feasible(halls: &[usize], clusters: &[Tier], required: usize) -> bool {
    fn go(free: &mut Vec<usize>, clusters: &[Tier], required: usize) -> bool {
        let Some((&t, rest)) = clusters.split_first() else {
            return true;
        };
        let n = t.size();
        let mut counts = vec![0usize; free.len()];
        fn place(i: usize, left: usize, counts: &mut Vec<usize>, free: &mut Vec<usize>, t: Tier, rest: &[Tier], required: usize) -> bool {
            if i == counts.len() {
                if left != 0 {
                    return false;
                }
                let halls = counts.iter().filter(|&&c| c > 0).count();
                if halls < required || counts.iter().any(|&c| 2 * c > t.size()) {
                    return false;
                }
                for (f, c) in free.iter_mut().zip(counts.iter()) {
                    *f -= c;
                }
                let ok = go(free, rest, required);
                for (f, c) in free.iter_mut().zip(counts.iter()) {
                    *f += c;
                }
                return ok;
            }
            for c in 0..=left.min(free[i]) {
                counts[i] = c;
                if place(i + 1, left - c, counts, free, t, rest, required) {
                    return true;
                }
            }
            counts[i] = 0;
            false
        }
        place(0, n, &mut counts, free, t, rest, required)
    }
    go(&mut halls.to_vec(), clusters, required)
}

fn inventory(halls: &[usize], clusters: &[Tier]) -> Inventory {
    let mut hosts = Vec::new();
    for (h, &n) in halls.iter().enumerate() {
        for i in 0..n {
            hosts.push(Host { name: format!("h{h}-{i}"), hall: format!("hall-{h}"), address: format!("10.0.{h}.{i}") });
        }
    }
    let clusters = clusters.iter().enumerate().map(|(i, &tier)| ClusterSpec { name: format!("c{i}"), tier, members: None }).collect();
    Inventory { required_halls: 3, peer_port: 2380, client_port: 2379, hosts, clusters }
}

fn tier() -> impl Strategy<Value = Tier> {
    prop_oneof![Just(Tier::Entity), Just(Tier::Coord)]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(400))]

    #[test]
    fn no_plan_ever_gives_one_hall_a_majority_and_every_feasible_inventory_gets_a_plan(
        halls in prop::collection::vec(0usize..6, 1..6),
        clusters in prop::collection::vec(tier(), 0..4),
    ) {
        let inv = inventory(&halls, &clusters);
        let result = plan::plan(&inv, &TokenSource::Seed("prop".into()));
        let oracle = feasible(&halls, &clusters, 3);
        match &result {
            Ok(p) => {
                prop_assert!(oracle, "planned an inventory the oracle calls infeasible");
                let placed: Vec<(String, Tier, Vec<String>)> = p.clusters.iter()
                    .map(|c| (c.name.clone(), c.tier, c.members.iter().map(|m| m.host.clone()).collect()))
                    .collect();
                prop_assert!(plan::violations(&inv, &placed).is_empty());
                for c in &p.clusters {
                    let mut per_hall: BTreeMap<&str, usize> = BTreeMap::new();
                    for m in &c.members { *per_hall.entry(m.hall.as_str()).or_default() += 1; }
                    prop_assert!(per_hall.values().all(|&n| 2 * n < c.members.len()), "majority in {per_hall:?}");
                    prop_assert!(per_hall.len() >= 3);
                    prop_assert_eq!(c.members.len(), c.tier.size());
                }
                // Deterministic.
                let again = plan::plan(&inv, &TokenSource::Seed("prop".into())).ok();
                prop_assert_eq!(Some(p), again.as_ref());
            }
            Err(e) => {
                prop_assert!(!oracle, "feasible inventory refused: {e}");
                prop_assert!(e.to_string().contains("refusing to plan"));
            }
        }
    }

    #[test]
    fn pinned_placements_are_refused_exactly_when_they_break_the_hall_rules(
        assignment in prop::collection::vec(0usize..3, 5),
    ) {
        // A coord cluster pinned to five hosts whose halls are drawn at random.
        let halls = [5usize, 5, 5];
        let mut inv = inventory(&halls, &[Tier::Coord]);
        let members: Vec<String> = assignment.iter().enumerate().map(|(i, &h)| format!("h{h}-{i}")).collect();
        inv.clusters[0].members = Some(members);
        let mut per_hall = [0usize; 3];
        for &h in &assignment { per_hall[h] += 1; }
        let valid = per_hall.iter().all(|&n| n <= 2) && per_hall.iter().filter(|&&n| n > 0).count() >= 3;
        let result = plan::plan(&inv, &TokenSource::Seed("prop".into()));
        prop_assert_eq!(result.is_ok(), valid, "{:?} {:?}", per_hall, result.err().map(|e| e.to_string()));
    }
}
