//! holdfast-bench against a real dev appliance: the direct etcd baselines
//! run as an authenticated, non-root etcd user over the arbiter's own TLS
//! endpoint, and every uncontended cell reports the CPU time the arbiter,
//! etcd and the benchmark spend per acquire+release pair and etcd's Raft
//! proposals per pair (issue 19). A short run: two concurrency levels, one
//! second per cell. Then `--scale` at a small size: 50 sessions held through
//! a second arbiter, none falsely fenced; group commit with etcd pinned; and
//! `--only holds,queue` at a small size (400 holds over 40 sessions, 40
//! waiters on one key); and `--only hop` for one second.

use holdfast_tests::*;
use std::process::Command;
use std::time::Instant;

/// The per-pair costs `--json` reports for the run's largest client count
/// up to 64 (`cost_clients`).
const COST_FIELDS: [&str; 10] = [
    "arbiter_cpu_us_per_pair_64",
    "etcd_cpu_us_per_pair_arbiter_64",
    "etcd_cpu_us_per_pair_direct_64",
    "etcd_cpu_us_per_pair_lock_rpc_64",
    "bench_cpu_us_per_pair_arbiter_64",
    "bench_cpu_us_per_pair_direct_64",
    "bench_cpu_us_per_pair_lock_rpc_64",
    "proposals_per_pair_64",
    "proposals_per_pair_direct_64",
    "proposals_per_pair_lock_rpc_64",
];

#[test]
fn bench_reports_cpu_and_proposals_per_pair_against_an_authenticated_tls_baseline() {
    let started = Instant::now();
    let dir = TestDir::new("bench");
    let state = dir.path.join("hf");
    let (_, _stop) = dev_detach(&state);

    // The shell's environment after `source DIR/env`: the arbiter's
    // endpoint and identity, etcd's endpoint as the read-only observer.
    let env = env_file(&state.join("env"));
    let bench = |args: &[&str]| {
        Ran::of(
            Command::new(bin("holdfast-bench"))
                .envs(&env)
                .env_remove("HOLDFAST_ARBITER_PID")
                .env_remove("HOLDFAST_ETCD_PID")
                .arg("--dev-dir")
                .arg(&state)
                .args(args),
        )
    };
    // Without --dev-dir the direct paths would run as the shell's etcd user,
    // the read-only observer: refused before any cell, saying what to give.
    let refused = Ran::of(Command::new(bin("holdfast-bench")).envs(&env).env_remove("HOLDFAST_DEV_DIR").args([
        "--duration",
        "1s",
        "--clients",
        "1",
        "--only",
        "uncontended",
    ]));
    assert_ne!(refused.code, 0, "{refused}");
    assert!(refused.stderr.contains("--dev-dir") && refused.stderr.contains("holdfast-observer"), "{refused}");
    assert!(!refused.stderr.contains("holdfast bench against"), "refused before the first cell: {refused}");

    let ran = bench(&["--json", "--duration", "1s", "--clients", "1,4", "--only", "uncontended"]);
    assert_eq!(ran.code, 0, "{ran}");
    let json = ran.json();

    // The baselines' etcd identity: the bench's own user, not root, over
    // TLS, and etcd refused it an administrator's request.
    assert_eq!(json["baseline_etcd_user"], "holdfast-bench", "{ran}");
    assert_eq!(json["baseline_etcd_scheme"], "https", "{ran}");
    assert_eq!(json["baseline_auth_enforced"], true, "{ran}");
    assert!(ran.stderr.contains("checks its role on every request"), "{ran}");

    // Both pids were found, so every cost is there.
    assert_eq!(json["cost_clients"], 4, "{ran}");
    for field in COST_FIELDS {
        let v = json[field].as_f64().unwrap_or_else(|| panic!("{field} missing:\n{ran}"));
        assert!(v.is_finite() && v > 0.0, "{field} = {v}:\n{ran}");
    }
    // Each pair commits a grant and a release on every path: at least two
    // proposals (more only from the appliance's own background writes).
    for field in ["proposals_per_pair_64", "proposals_per_pair_direct_64", "proposals_per_pair_lock_rpc_64"] {
        let v = json[field].as_f64().unwrap_or_default();
        assert!((2.0..4.0).contains(&v), "{field} = {v}:\n{ran}");
    }
    let ratio = json["arbiter_vs_etcd_cpu_per_pair_64"].as_f64().unwrap_or_default();
    assert!(ratio.is_finite() && ratio > 0.0, "arbiter_vs_etcd_cpu_per_pair_64 = {ratio}:\n{ran}");

    // Six cells (three paths at 1 and 4 clients), each with pairs, its own
    // costs, and no failed pair.
    let cells = json["uncontended"].as_array().unwrap_or_else(|| panic!("no cells:\n{ran}"));
    assert_eq!(cells.len(), 6, "{ran}");
    for cell in cells {
        assert_eq!(cell["errors"], 0, "{cell}");
        assert!(cell["pairs_per_sec"].as_f64().unwrap_or_default() > 0.0, "{cell}");
        for f in ["etcd_cpu_us_per_pair", "bench_cpu_us_per_pair", "proposals_per_pair"] {
            let v = cell[f].as_f64().unwrap_or_else(|| panic!("{f} missing: {cell}"));
            assert!(v.is_finite() && v > 0.0, "{f} = {v}: {cell}");
        }
        // The arbiter's own CPU is measured in every cell (it may idle
        // through a direct path's window).
        assert!(cell["arbiter_cpu_us_per_pair"].as_f64().is_some_and(|v| v.is_finite() && v >= 0.0), "{cell}");
    }

    // Contended: four waiters on one key. Each handoff is one release and
    // one grant transaction. On top, over the whole window, only a try per
    // waiter that found no queue: its first, and one coming back to a queue
    // that emptied as the others stopped at the end. In the middle half none
    // come on top; each edge of it can be off by one transaction in flight.
    // Counted in transactions (ratio - 2) x handoffs, so the bounds hold at
    // any rate; the ratios are rounded to 3 decimals, hence the slack.
    let ran = bench(&["--json", "--only", "contended", "--waiters", "4", "--duration", "2s"]);
    assert_eq!(ran.code, 0, "{ran}");
    let json = ran.json();
    let f = |k: &str| json[k].as_f64().unwrap_or_else(|| panic!("{k} missing:\n{ran}"));
    assert!(f("contended_arbiter_handoffs_per_sec") > 0.0 && f("contended_lock_rpc_handoffs_per_sec") > 0.0, "{ran}");
    assert_eq!(json["contended_errors"], 0, "{ran}");
    // A failed Lock RPC call stops its waiter: the baseline's rate would be understated.
    assert_eq!(json["contended_lock_rpc_errors"], 0, "{ran}");
    // CPU per handoff from /proc: every process under test did some work.
    for k in [
        "contended_arbiter_cpu_us_per_handoff",
        "contended_etcd_cpu_us_per_handoff_arbiter",
        "contended_etcd_cpu_us_per_handoff_lock_rpc",
        "contended_bench_cpu_us_per_handoff_arbiter",
    ] {
        assert!(f(k) > 0.0, "{k} = 0:\n{ran}");
    }
    let extra = |ratio: &str, handoffs: &str| {
        let n = f(handoffs);
        assert!(n > 0.0, "{handoffs} = 0:\n{ran}");
        ((f(ratio) - 2.0) * n, 0.0005 * n + 0.01)
    };
    let (all, slack) = extra("txns_per_handoff", "contended_releases");
    assert!((-slack..=6.0 + slack).contains(&all), "{all:.2} transactions beyond two per handoff in the whole window:\n{ran}");
    let (steady, slack) = extra("txns_per_handoff_after_warmup", "handoffs_after_warmup");
    assert!((-2.0 - slack..=2.0 + slack).contains(&steady), "{steady:.2} transactions beyond two per handoff in the middle half:\n{ran}");

    // --scale, small: every session opened, renewed and closed, none lost.
    // The hold (6 s) spans a keepalive round (every 5 s at TTL 15 s).
    let ran = bench(&["--json", "--scale", "--scale-sessions", "50", "--scale-hold", "6s"]);
    assert_eq!(ran.code, 0, "{ran}");
    let json = ran.json();
    assert_eq!(json["scale_false_fences"], 0, "{ran}");
    assert_eq!(json["scale_largest_held"], 50, "{ran}");
    let level = &json["scale"][0];
    assert_eq!(level["opened"], 50, "{ran}");
    assert!(level.get("limit").is_none(), "{ran}");
    assert_eq!(level["keepalives_gone"], 0, "{ran}");
    for f in ["keepalives_per_sec", "keepalive_p50_ms", "arbiter_rss_mib", "etcd_cpu_cores", "workload_pairs_per_sec"] {
        let v = level[f].as_f64().unwrap_or_default();
        assert!(v.is_finite() && v > 0.0, "{f} = {v}:\n{ran}");
    }
    assert_eq!(level["workload_errors"], 0, "{ran}");
    assert!(ran.stderr.contains("a second arbiter at"), "{ran}");

    // Group commit with etcd pinned to one CPU: the grants-only window
    // commits one proposal per grant without it (more only from the
    // appliance's background writes) and fewer with it (16 clients, at
    // most 4 batches in flight); etcd's affinity is restored afterwards.
    let etcd_pid = holdfast_devkit::ports::listener_pid(
        env["HOLDFAST_ETCD_ENDPOINT"].rsplit(':').next().and_then(|p| p.parse().ok()).expect("etcd's port"),
    )
    .expect("etcd's pid");
    let mask =
        |pid: u32| String::from_utf8_lossy(&Command::new("taskset").args(["-p", &pid.to_string()]).output().unwrap().stdout).into_owned();
    let before = mask(etcd_pid);
    let svg = std::env::temp_dir().join(format!("hf-bench-group-{}.svg", std::process::id()));
    let ran = bench(&["--json", "--only", "group-commit", "--clients", "16,4", "--duration", "1s", "--plot", svg.to_str().unwrap()]);
    assert_eq!(ran.code, 0, "{ran}");
    assert_eq!(mask(etcd_pid), before, "etcd's CPU affinity was not restored:\n{ran}");
    let json = ran.json();
    // A curve over both levels, in client order; the top-level figures are
    // the most clients'.
    let curve = json["group_commit_curve"].as_array().unwrap_or_else(|| panic!("no group_commit_curve:\n{ran}"));
    assert_eq!(curve.iter().map(|p| p["clients"].as_u64().unwrap()).collect::<Vec<_>>(), [4, 16], "{ran}");
    assert_eq!(json["group_commit_clients"], 16, "{ran}");
    assert_eq!(curve[1]["proposals_per_grant_on"], json["proposals_per_grant_on"], "{ran}");
    let drawn = std::fs::read_to_string(&svg).unwrap_or_else(|e| panic!("no plot at {}: {e}\n{ran}", svg.display()));
    assert!(drawn.contains("Raft proposals per grant") && drawn.contains("direct transactions"), "the plot lacks a panel");
    std::fs::remove_file(&svg).unwrap();
    let f = |k: &str| json[k].as_f64().unwrap_or_else(|| panic!("{k} missing:\n{ran}"));
    let (off, on) = (f("proposals_per_grant_off"), f("proposals_per_grant_on"));
    assert!((0.95..1.3).contains(&off), "proposals_per_grant_off = {off}:\n{ran}");
    assert!(on > 0.0 && on <= 0.75 * off, "group commit did not batch: {on} vs {off} proposals per grant:\n{ran}");
    assert!((f("group_commit_proposal_cut") - off / on).abs() < 0.01 * off / on + 0.002, "{ran}");
    // Pairs: a grant and a release each, batched too with group commit.
    let (off, on) = (f("pinned_proposals_per_pair_off"), f("pinned_proposals_per_pair_on"));
    assert!((1.9..2.6).contains(&off), "pinned_proposals_per_pair_off = {off}:\n{ran}");
    assert!(on > 0.0 && on <= 0.75 * off, "releases and grants were not batched: {on} vs {off} proposals per pair:\n{ran}");
    for k in
        ["grants_per_sec_off", "grants_per_sec_on", "pinned_pairs_per_sec_off", "pinned_pairs_per_sec_on", "pinned_pairs_per_sec_direct"]
    {
        assert!(f(k) > 0.0, "{k}:\n{ran}");
    }
    for cell in json["group_commit"].as_array().unwrap_or_else(|| panic!("no group_commit cells:\n{ran}")) {
        assert_eq!(cell["errors"], 0, "{cell}");
    }
    assert!(ran.stderr.contains("pinned to CPU 0"), "{ran}");

    // Many holds over many sessions, and a queue on one key, at a small
    // size: every hold granted, no session lost, memory per hold and per
    // waiter measured, and the queue served strictly in arrival order.
    let ran = bench(&["--json", "--only", "holds,queue", "--holds", "400", "--holds-sessions", "40", "--queue", "40"]);
    assert_eq!(ran.code, 0, "{ran}");
    let json = ran.json();
    let holds = &json["holds"];
    assert_eq!((holds["sessions"].as_u64(), holds["granted"].as_u64()), (Some(40), Some(400)), "{ran}");
    assert_eq!((holds["errors"].as_u64(), holds["false_fences"].as_u64()), (Some(0), Some(0)), "{ran}");
    assert!(holds["grants_per_sec"].as_f64().unwrap_or_default() > 0.0, "{ran}");
    assert!(holds["etcd_db_bytes_per_hold"].is_number(), "no etcd bytes per hold:\n{ran}");
    assert!(holds["arbiter_rss_bytes_per_hold"].is_number(), "{ran}");
    let queue = &json["queue"];
    assert_eq!((queue["queued"].as_u64(), queue["granted"].as_u64(), queue["errors"].as_u64()), (Some(40), Some(40), Some(0)), "{ran}");
    assert_eq!(queue["out_of_order"].as_u64(), Some(0), "the queue was not served in arrival order:\n{ran}");
    assert!(queue["handoffs_per_sec"].as_f64().unwrap_or_default() > 0.0, "{ran}");
    assert!(queue["arbiter_rss_bytes_per_waiter"].is_number(), "{ran}");

    // The one-client hop taken apart: the arbiter's own grant-transaction
    // time is read from its metrics (found through --dev-dir's
    // arbiter.toml), and the split adds up to the added mean.
    let ran = bench(&["--json", "--only", "hop", "--duration", "1s"]);
    assert_eq!(ran.code, 0, "{ran}");
    let json: serde_json::Value = serde_json::from_str(ran.stdout.lines().last().unwrap_or_default()).expect("json");
    let hop = &json["hop"];
    assert!(hop["rounds"].as_u64().unwrap_or_default() > 0, "{ran}");
    assert_eq!(hop["errors"], 0, "{ran}");
    for call in ["arbiter_acquire", "arbiter_release", "direct_grant", "direct_release", "arbiter_empty_call", "etcd_empty_call"] {
        let ms = hop[call]["p50_ms"].as_f64().unwrap_or_default();
        assert!(ms > 0.0 && ms < 1000.0, "{call}: {ms} ms:\n{ran}");
    }
    let f = |k: &str| hop[k].as_f64().unwrap_or_else(|| panic!("no {k}:\n{ran}"));
    assert!(f("arbiter_grant_txn_mean_ms") > 0.0, "{ran}");
    let split = f("split_transport_ms") + f("split_etcd_from_arbiter_ms") + f("split_arbiter_work_ms");
    assert!((split - f("added_pair_mean_ms")).abs() < 0.01, "the split {split} does not add up:\n{ran}");
    assert!(ran.stderr.contains("the arbiter's own work"), "{ran}");

    eprintln!("bench test: {:.1} s", started.elapsed().as_secs_f64());
}
