//! The disaster-recovery drill on a 3-member cluster over mTLS with
//! authentication on: snapshot, more grants, restore with the same cluster
//! token and peer URLs, the arbiter seals, the two-person epoch advance
//! (`holdfastctl epoch advance-request`, `approve`, `advance` as the unit
//! runs it) refuses what it must and changing nothing, then advances; the
//! arbiter unseals without a restart and every new token is above every
//! token issued before the restore.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
use holdfast_model::{LockKey, Token, layout};
use holdfast_store::roles::{ARBITER, EPOCH, FORCE_RELEASE};
use holdfast_tests::*;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

fn ctl(args: &[&str]) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).args(args))
}

fn sign_file(request: &str, key: &Path) {
    let out = ctl(&["approve", request, "--ssh-key", &key.display().to_string()]);
    assert_eq!(out.code, 0, "{out}");
}

/// Every key in etcd with its mod revision, except what daemons write on
/// their own schedule: the controller's election (it campaigns again after
/// the restore: a put of its candidate key, seen landing seconds after the
/// arbiter sealed) and the serving arbiter's `/sys/watermark`. What a
/// refused or replayed advance must not touch is everything else.
async fn written(c: &mut etcd_client::Client) -> Vec<(String, i64)> {
    let opts = etcd_client::GetOptions::new().with_prefix().with_keys_only();
    let resp = c.get("/", Some(opts)).await.expect("list every key");
    resp.kvs()
        .iter()
        .map(|kv| (String::from_utf8_lossy(kv.key()).into_owned(), kv.mod_revision()))
        .filter(|(k, _)| !k.starts_with(layout::CONTROLLER_ELECTION) && k != layout::WATERMARK_KEY)
        .collect()
}

async fn grants(client: &holdfast_client::Client, prefix: &str, n: usize) -> Vec<Token> {
    let session = client.open_session_for("dr", None).await.unwrap();
    let mut tokens = Vec::new();
    for i in 0..n {
        let hold = session.acquire(&LockKey::parse(&format!("dr/{prefix}-{i}")).unwrap(), Duration::ZERO).await.unwrap();
        tokens.push(hold.token());
    }
    tokens
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dr_drill_restores_seals_and_advances_with_two_signed_approvals() {
    let dir = TestDir::new("dr-drill");
    let mut etcd = Etcd::start_secure(&dir.path, 3).await;
    etcd.enable_auth().await;
    let epoch_admin = etcd.config_as(EPOCH.name);
    holdfast_store::epoch::init(&holdfast_store::Etcd::connect(&epoch_admin).await.unwrap(), |_| {}).await.unwrap();
    let _controller = etcd.publish_policy(&dir.path, &[("dr", 30)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let client = arbiter.client(&pki, &pki.workload("w", "svc/w")).await;

    // Grants, a snapshot, more grants (lost by the restore), the restore.
    let mut before = grants(&client, "a", 5).await;
    let snapshot = dir.path.join("snap.db");
    etcd.snapshot(&snapshot);
    before.extend(grants(&client, "b", 5).await);
    etcd.restore(&snapshot, false).await;
    let status = arbiter.wait_sealed(&client, true, Duration::from_secs(30)).await;
    assert!(status.sealed, "{status:?}");

    // Approvers: alice and bob are dr-operators, carol only a lock-operator.
    let keys = dir.path.join("keys");
    std::fs::create_dir_all(&keys).unwrap();
    let (alice, alice_pub) = ssh_keygen(&keys, "alice");
    let (bob, bob_pub) = ssh_keygen(&keys, "bob");
    let (carol, carol_pub) = ssh_keygen(&keys, "carol");
    let approvers = dir.path.join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "[approver.alice]\nroles = [\"dr-operator\"]\nkeys = [{alice_pub:?}]\n[approver.bob]\nroles = [\"dr-operator\"]\nkeys = [{bob_pub:?}]\n\
             [approver.carol]\nroles = [\"lock-operator\"]\nkeys = [{carol_pub:?}]\n"
        ),
    )
    .unwrap();
    let state = dir.path.join("state");
    let files = [format!("--approvers={}", approvers.display()), format!("--state-dir={}", state.display())];
    let mut etcd_args = etcd_flags(&epoch_admin);
    // Any identity the arbiter admits may ask it which epochs it served.
    let operator = pki.workload("operator", "ops/dr");
    let arbiter_conn = pki.client_config(&arbiter.endpoint(), &operator);
    etcd_args.extend([
        format!("--endpoint={}", arbiter_conn.endpoint),
        format!("--ca={}", arbiter_conn.ca.display()),
        format!("--cert={}", arbiter_conn.cert.display()),
        format!("--key={}", arbiter_conn.key.display()),
    ]);
    let with = |base: &[&str]| -> Vec<String> {
        base.iter().map(|s| s.to_string()).chain(files.iter().cloned()).chain(etcd_args.iter().cloned()).collect()
    };

    // No request without every arbiter's word: no --endpoint (64), an
    // arbiter that does not answer (69), arbiters of another cluster (65).
    let request_with = |conn: &[String]| {
        let mut args: Vec<String> = ["epoch", "advance-request", "--requester", "alice", "--reason", "drill"].map(String::from).to_vec();
        args.extend(files.iter().cloned());
        args.extend(etcd_flags(&epoch_admin));
        args.extend(conn.iter().cloned());
        Ran::of(Command::new(bin("holdfastctl")).args(args).env_remove("HOLDFAST_ENDPOINT"))
    };
    let no_endpoint = request_with(&[]);
    assert_eq!(no_endpoint.code, 64, "{no_endpoint}");
    assert!(no_endpoint.stderr.contains("pass --endpoint with all of them"), "{no_endpoint}");
    let mut conn = etcd_args[etcd_args.len() - 4..].to_vec();
    conn[0] = format!("--endpoint={},127.0.0.1:{}", arbiter_conn.endpoint, holdfast_devkit::ports::free_port());
    let one_down = request_with(&conn);
    assert_eq!(one_down.code, 69, "{one_down}");
    assert!(one_down.stderr.contains("did not say which epochs it served"), "{one_down}");
    conn[0] = format!("--endpoint={}", arbiter_conn.endpoint);
    conn.push("--cluster=entity-9".into());
    let other = request_with(&conn);
    assert_eq!(other.code, 65, "{other}");
    assert!(other.stderr.contains("grants on cluster(s) [\"test\"], not \"entity-9\""), "{other}");
    assert!(!state.join("requests").exists(), "a refused request was written");

    // The request: epoch 1 -> 2, naming the cluster the restored etcd reports.
    let out =
        Ran::of(Command::new(bin("holdfastctl")).args(with(&["epoch", "advance-request", "--requester", "alice", "--reason", "drill"])));
    assert_eq!(out.code, 0, "{out}");
    let request = std::fs::read_dir(state.join("requests")).unwrap().next().unwrap().unwrap().path();
    let text = std::fs::read_to_string(&request).unwrap();
    assert!(text.contains("expected_epoch = 1") && text.contains("new_epoch = 2"), "{text}");
    assert!(text.contains("cluster = \"test\"") && text.contains("highest_known = 1"), "the arbiter's cluster and what it served: {text}");
    assert!(out.stdout.contains("sealed"), "{out}");
    assert!(out.stdout.contains(&format!("arbiter {}: has served up to epoch 1", arbiter.endpoint())), "{out}");
    let req = request.display().to_string();
    let advance = |extra: &[&str]| -> Ran {
        let mut args = vec!["epoch", "advance", "--request", &req];
        args.extend_from_slice(extra);
        Ran::of(Command::new(bin("holdfastctl")).args(with(&args)))
    };
    let sign = |key: &Path| {
        let out = ctl(&["approve", &req, "--ssh-key", &key.display().to_string()]);
        assert_eq!(out.code, 0, "{out}");
        assert!(out.stdout.contains("advance the epoch of cluster test"), "approve shows what it signs: {out}");
    };

    // Refused, changing nothing: the requester's signature alone; the
    // requester and a signer without the role; a changed request.
    let keys_before = written(&mut etcd.client().await).await;
    sign(&alice);
    let one = advance(&[]);
    assert_eq!(one.code, 77, "{one}");
    assert!(one.stderr.contains("only alice signed"), "{one}");
    sign(&carol);
    let no_role = advance(&[]);
    assert_eq!(no_role.code, 77, "{no_role}");
    assert!(no_role.stderr.contains("carol does not hold the role dr-operator"), "{no_role}");
    std::fs::remove_file(format!("{req}.carol.sig")).unwrap();
    sign(&bob);
    let tampered = dir.path.join("tampered.toml");
    std::fs::write(&tampered, text.replace("reason = \"drill\"", "reason = \"drilL\"")).unwrap();
    let (a_sig, b_sig) = (format!("{req}.alice.sig"), format!("{req}.bob.sig"));
    let changed = Ran::of(Command::new(bin("holdfastctl")).args(with(&[
        "epoch",
        "advance",
        "--request",
        &tampered.display().to_string(),
        "--signature",
        &a_sig,
        "--signature",
        &b_sig,
    ])));
    assert_eq!(changed.code, 77, "{changed}");
    assert!(changed.stderr.contains("does not verify over this request"), "{changed}");
    // The requester twice; a key not in approvers.toml; a signature under
    // another namespace; an expired request.
    let with_sigs = |request: &str, sigs: &[&str]| -> Ran {
        let mut args = vec!["epoch", "advance", "--request", request];
        for s in sigs {
            args.extend(["--signature", s]);
        }
        Ran::of(Command::new(bin("holdfastctl")).args(with(&args)))
    };
    let again = dir.path.join("alice-again.sig").display().to_string();
    assert_eq!(ctl(&["approve", &req, "--ssh-key", &alice.display().to_string(), "--out", &again]).code, 0);
    let twice = with_sigs(&req, &[&a_sig, &again]);
    assert_eq!(twice.code, 77, "{twice}");
    assert!(twice.stderr.contains("only alice signed"), "{twice}");
    let (mallory, _) = ssh_keygen(&keys, "mallory");
    let stranger = dir.path.join("mallory.sig").display().to_string();
    assert_eq!(ctl(&["approve", &req, "--ssh-key", &mallory.display().to_string(), "--out", &stranger]).code, 0);
    let unlisted = with_sigs(&req, &[&a_sig, &stranger]);
    assert_eq!(unlisted.code, 77, "{unlisted}");
    assert!(unlisted.stderr.contains("is not listed in approvers.toml"), "{unlisted}");
    let file_ns = Command::new("ssh-keygen").args(["-Y", "sign", "-n", "file", "-f"]).arg(&bob).arg(&tampered).output().unwrap();
    assert!(file_ns.status.success());
    let other_ns = format!("{}.sig", tampered.display());
    let namespace = with_sigs(&req, &[&a_sig, &other_ns]);
    assert_eq!(namespace.code, 77, "{namespace}");
    assert!(namespace.stderr.contains("made under the namespace \"file\""), "{namespace}");
    let out = Ran::of(Command::new(bin("holdfastctl")).args(with(&[
        "epoch",
        "advance-request",
        "--requester",
        "alice",
        "--reason",
        "short-lived",
        "--valid-for",
        "1s",
    ])));
    assert_eq!(out.code, 0, "{out}");
    let short = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap().to_string();
    sign_file(&short, &alice);
    sign_file(&short, &bob);
    std::thread::sleep(Duration::from_millis(2100));
    let expired = with_sigs(&short, &[]);
    assert_eq!(expired.code, 77, "{expired}");
    assert!(expired.stderr.contains("the request expired"), "{expired}");
    std::fs::remove_file(&short).unwrap();
    // An epoch far above the highest known: --new-epoch is refused before a
    // request is written; a request whose requester wrote a higher
    // highest_known (both signed it) is refused when carried out, against
    // the epochs known then.
    let far = Ran::of(Command::new(bin("holdfastctl")).args(with(&[
        "epoch",
        "advance-request",
        "--requester",
        "alice",
        "--reason",
        "far",
        "--new-epoch",
        "18",
    ])));
    assert_eq!(far.code, 64, "{far}");
    assert!(far.stderr.contains("--new-epoch 18 is more than 16 above 1, the highest epoch known"), "{far}");
    let inflated = dir.path.join("inflated.toml");
    std::fs::write(&inflated, text.replace("highest_known = 1", "highest_known = 20").replace("new_epoch = 2", "new_epoch = 21")).unwrap();
    let inflated = inflated.display().to_string();
    sign_file(&inflated, &alice);
    sign_file(&inflated, &bob);
    let too_far = with_sigs(&inflated, &[]);
    assert_eq!(too_far.code, 65, "{too_far}");
    assert!(too_far.stderr.contains("epoch 21 is more than 16 above 1, the highest epoch known now"), "{too_far}");
    assert_eq!(written(&mut etcd.client().await).await, keys_before, "a refused advance wrote to etcd");
    assert!(arbiter.wait_sealed(&client, true, Duration::from_secs(1)).await.sealed);

    // Two approvals: advanced, and the arbiter unseals by itself.
    let done = advance(&["--json"]);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(done.json()["epoch"], 2, "{done}");
    assert_eq!(done.json()["signers"], serde_json::json!(["alice", "bob"]));
    let status = arbiter.wait_sealed(&client, false, Duration::from_secs(30)).await;
    assert_eq!(status.epoch, 2);
    assert!(std::fs::read_to_string(state.join("epochs.log")).unwrap().starts_with("epoch 2 cluster "));

    // Old holds are gone; every new token is above every token before.
    let mut c = etcd.client().await;
    let held = c.get(layout::HOLD_PREFIX, Some(etcd_client::GetOptions::new().with_prefix().with_count_only())).await.unwrap();
    assert_eq!(held.count(), 0, "old holds survived the advance");
    let after = grants(&client, "c", 5).await;
    let highest = before.iter().max().unwrap();
    assert!(after.iter().all(|t| t > highest), "a token after the advance is not above every token before it");

    // Replayed: refused by its recorded nonce, nothing changes.
    let keys_before = written(&mut etcd.client().await).await;
    let replay = advance(&[]);
    assert_eq!(replay.code, 65, "{replay}");
    assert!(replay.stderr.contains("this request was already carried out"), "{replay}");
    assert_eq!(written(&mut etcd.client().await).await, keys_before, "a replayed advance wrote to etcd");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_dr_drill_on_the_dev_appliance() {
    let dir = TestDir::new("dr-dev");
    let state = dir.path.join("hf");
    let (_, _stop) = dev_detach(&state);
    let drill = Drill::new(&dir.path, &state);
    let host = dir.path.join("state");
    let mut before = drill.grants("before", 3).await;
    let snapshot = dir.path.join("dev.db");
    drill.snapshot(&drill.root(), &snapshot);
    before.extend(drill.grants("lost", 3).await);

    let restored = drill.restore(&snapshot);
    assert!(restored.stdout.contains("same cluster token"), "{restored}");
    drill.wait(true).await;

    let out = drill.run(&host, &["epoch", "advance-request", "--cluster", "dev", "--requester", "alice", "--reason", "dev drill"]);
    assert_eq!(out.code, 0, "{out}");
    let req = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap().to_string();
    sign_file(&req, &drill.alice);
    let one = drill.run(&host, &["epoch", "advance", "--request", &req]);
    assert_eq!(one.code, 77, "{one}");
    sign_file(&req, &drill.bob);
    let done = drill.run(&host, &["epoch", "advance", "--request", &req]);
    assert_eq!(done.code, 0, "{done}");
    // Epoch 1 is the entity cluster's first, 2 the coord cluster's: one allocator.
    assert_eq!(drill.wait(false).await.epoch, 3);

    let highest = *before.iter().max().unwrap();
    let after = drill.grants("after", 3).await;
    assert!(after.iter().all(|t| *t > highest), "a token after the advance is not above every token before the restore");
    let mut c = Etcd::client_for(&drill.root()).await;
    let old = c.get(format!("{}demo/before-0", layout::HOLD_PREFIX), None).await.unwrap();
    assert!(old.kvs().is_empty(), "an old hold survived the advance");
}

/// A dev appliance's epoch admin and its `holdfastctl epoch` runner, with
/// two dr-operators (alice, bob) whose keys are in `dir/keys`.
struct Drill {
    state: std::path::PathBuf,
    approvers: std::path::PathBuf,
    alice: std::path::PathBuf,
    bob: std::path::PathBuf,
    /// How holdfastctl is told of the tiers.
    tiers: Tiers,
}

/// The dev appliance runs a coord cluster and an entity cluster; the
/// operator's holdfastctl either names the coord cluster
/// (`--coord-endpoint`: epochs allocated and nonces recorded there) or not
/// (one cluster serves both tiers: the entity cluster's own allocator and
/// nonce records decide).
#[derive(Clone, Copy, PartialEq, Debug)]
enum Tiers {
    Separate,
    Shared,
}

impl Drill {
    fn new(dir: &Path, state: &Path) -> Drill {
        let keys = dir.join("keys");
        let (alice, alice_pub) = ssh_keygen(&keys, "alice");
        let (bob, bob_pub) = ssh_keygen(&keys, "bob");
        let approvers = dir.join("approvers.toml");
        std::fs::write(
            &approvers,
            // Their identities fall under the lab's grant and the dev set's lock-operators grant.
            format!(
                "[approver.alice]\nroles = [\"dr-operator\", \"lock-operator\"]\nkeys = [{alice_pub:?}]\nidentity = \"{LAB_IDENTITIES}ops/alice\"\n\
                 [approver.bob]\nroles = [\"dr-operator\", \"lock-operator\"]\nkeys = [{bob_pub:?}]\nidentity = \"{LAB_IDENTITIES}ops/bob\"\n"
            ),
        )
        .unwrap();
        Drill { state: state.to_path_buf(), approvers, alice, bob, tiers: Tiers::Separate }
    }

    /// `holdfastctl ARGS` as an operator on the host whose state directory
    /// is `host`: the epoch administrator's etcd credentials and the
    /// arbiter's address as the appliance's env files say now (a restarted
    /// appliance may have moved a port another process took).
    fn run(&self, host: &Path, args: &[&str]) -> Ran {
        self.run_on(host, "HOLDFAST_ETCD_ENDPOINT", args)
    }

    /// [`Drill::run`] with `--etcd-endpoint` at the cluster the root env
    /// names by `endpoint` (the coord cluster's own epoch: `HOLDFAST_COORD_ENDPOINT`).
    fn run_on(&self, host: &Path, endpoint: &str, args: &[&str]) -> Ran {
        self.run_as(host, endpoint, EPOCH.name, args)
    }

    /// [`Drill::run_on`] as etcd user `user`.
    fn run_as(&self, host: &Path, endpoint: &str, user: &str, args: &[&str]) -> Ran {
        let root_env = env_file(&self.state.join("env-etcd-root"));
        let endpoints = vec![root_env[endpoint].clone()];
        let epoch_admin =
            holdfast_devkit::pki::EtcdPki::open_or_create(&self.state.join("etcd-tls")).unwrap().config_as(user, endpoints).unwrap();
        let coord = match self.tiers {
            Tiers::Separate => vec![format!("--coord-endpoint={}", root_env["HOLDFAST_COORD_ENDPOINT"])],
            Tiers::Shared => vec![],
        };
        Ran::of(
            Command::new(bin("holdfastctl"))
                .args(args)
                .args(etcd_flags(&epoch_admin))
                .args(coord)
                .args(conn_flags(&env_file(&self.state.join("env"))))
                .arg(format!("--approvers={}", self.approvers.display()))
                .arg(format!("--state-dir={}", host.display())),
        )
    }

    /// advance-request from `host`; the request's path and text.
    fn request(&self, host: &Path, reason: &str) -> (String, String) {
        let out = self.run(host, &["epoch", "advance-request", "--requester", "alice", "--reason", reason]);
        assert_eq!(out.code, 0, "{out}");
        let req = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap().to_string();
        let text = std::fs::read_to_string(&req).unwrap();
        (req, text)
    }

    /// Both signatures, then the advance the unit runs.
    fn approve_and_advance(&self, host: &Path, req: &str) -> Ran {
        self.approve_and_advance_on(host, "HOLDFAST_ETCD_ENDPOINT", req)
    }

    fn approve_and_advance_on(&self, host: &Path, endpoint: &str, req: &str) -> Ran {
        sign_file(req, &self.alice);
        sign_file(req, &self.bob);
        self.run_on(host, endpoint, &["epoch", "advance", "--request", req, "--json"])
    }

    /// etcd's root on the entity cluster.
    fn root(&self) -> EtcdConfig {
        self.root_of("HOLDFAST_ETCD_ENDPOINT")
    }

    /// etcd's root on the coord cluster.
    fn coord_root(&self) -> EtcdConfig {
        self.root_of("HOLDFAST_COORD_ENDPOINT")
    }

    fn root_of(&self, endpoint: &str) -> EtcdConfig {
        let root_env = env_file(&self.state.join("env-etcd-root"));
        EtcdConfig {
            ca_file: Some(root_env["HOLDFAST_ETCD_CA"].clone().into()),
            cert_file: Some(root_env["HOLDFAST_ETCD_CERT"].clone().into()),
            key_file: Some(root_env["HOLDFAST_ETCD_KEY"].clone().into()),
            ..EtcdConfig::plain(vec![root_env[endpoint].clone()])
        }
    }

    /// A snapshot of the entity (`root`) or coord (`coord_root`) cluster.
    fn snapshot(&self, root: &EtcdConfig, file: &Path) {
        holdfast_devkit::etcd::snapshot_save(&holdfast_devkit::etcd::EtcdBinary::locate().unwrap(), root, file).unwrap();
    }

    async fn client(&self) -> holdfast_client::Client {
        let env = env_file(&self.state.join("env"));
        holdfast_client::Client::connect(&holdfast_client::ClientConfig {
            endpoint: env["HOLDFAST_ENDPOINT"].clone(),
            ca: env["HOLDFAST_CA"].clone().into(),
            cert: env["HOLDFAST_CERT"].clone().into(),
            key: env["HOLDFAST_KEY"].clone().into(),
        })
        .await
        .unwrap()
    }

    /// Waits for the dev arbiter's coord cluster (the coord tier) to be
    /// sealed (or serving) and returns the arbiter's status.
    async fn wait_coord(&self, sealed: bool) -> holdfast_proto::v1::ServerStatusResponse {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = self.client().await.server_status().await
                && let Some(c) = s.clusters.get(1)
                && c.sealed == sealed
                && (sealed || c.serving)
            {
                return s;
            }
            assert!(tokio::time::Instant::now() < end, "the dev arbiter's coord tier never became sealed={sealed}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// Waits for the dev arbiter to be sealed (or serving) and returns its status.
    async fn wait(&self, sealed: bool) -> holdfast_proto::v1::ServerStatusResponse {
        let end = tokio::time::Instant::now() + Duration::from_secs(30);
        loop {
            if let Ok(s) = self.client().await.server_status().await
                && s.sealed == sealed
                && (sealed || s.serving)
            {
                return s;
            }
            assert!(tokio::time::Instant::now() < end, "the dev arbiter never became sealed={sealed}");
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    /// `n` grants in namespace demo (an entity-tier class), each on a key of its own.
    async fn grants(&self, prefix: &str, n: usize) -> Vec<Token> {
        self.grants_in("demo", prefix, n).await
    }

    /// `n` grants in `namespace`, each on a key of its own.
    async fn grants_in(&self, namespace: &str, prefix: &str, n: usize) -> Vec<Token> {
        let session = self.client().await.open_session_for(namespace, None).await.unwrap();
        let mut tokens = Vec::new();
        for i in 0..n {
            tokens.push(
                session.acquire(&LockKey::parse(&format!("{namespace}/{prefix}-{i}")).unwrap(), Duration::ZERO).await.unwrap().token(),
            );
        }
        tokens
    }

    fn restore(&self, snapshot: &Path) -> Ran {
        self.restore_cluster(snapshot, "entity")
    }

    fn restore_cluster(&self, snapshot: &Path, cluster: &str) -> Ran {
        let (dir, file) = (self.state.display().to_string(), snapshot.display().to_string());
        let restored = ctl(&["dev", "restore", "--dir", &dir, "--snapshot", &file, "--cluster", cluster]);
        assert_eq!(restored.code, 0, "{restored}");
        restored
    }
}

/// The case the arbiters' own record exists for: a restore from a snapshot
/// OLDER than an earlier advance, every daemon restarted, and the next
/// advance requested from a host that never saw the first one. The
/// restored etcd (and its allocator) remember epoch 1 only (2 is the coord
/// cluster's own); the arbiter remembers serving epoch 3, so the request
/// asks for 4, and no token is ever issued twice. Also: the first advance's request, replayed after the
/// second restore, is refused (with a separate coord cluster its nonce is
/// still recorded there; with one cluster for both tiers the nonce record
/// went back with etcd and the arbiter's record refuses it); so is a
/// request valid for more than a day; neither changes anything.
#[tokio::test(flavor = "multi_thread")]
async fn an_advance_after_a_restore_older_than_an_earlier_advance_never_reissues_a_token() {
    older_snapshot_drill(Tiers::Separate).await;
}

/// The same drill with holdfastctl told of no coord cluster: one cluster
/// serves both tiers (the single-cluster deployment).
#[tokio::test(flavor = "multi_thread")]
async fn the_older_snapshot_drill_with_both_tiers_on_one_cluster() {
    older_snapshot_drill(Tiers::Shared).await;
}

async fn older_snapshot_drill(tiers: Tiers) {
    let dir = TestDir::new(match tiers {
        Tiers::Separate => "dr-older",
        Tiers::Shared => "dr-older-shared",
    });
    let state = dir.path.join("hf");
    let (_, stop) = dev_detach(&state);
    let drill = Drill { tiers, ..Drill::new(&dir.path, &state) };
    let (host_a, host_b) = (dir.path.join("host-a"), dir.path.join("host-b"));

    // Snapshot S at epoch 1, then grants the restore loses.
    let mut issued = drill.grants("s", 3).await;
    let snapshot = dir.path.join("s.db");
    drill.snapshot(&drill.root(), &snapshot);
    issued.extend(drill.grants("lost", 3).await);

    // Restore S; the two-person advance from host A: epoch 3 (epoch 2 is
    // the coord cluster's, which the arbiter reports serving, so the
    // request goes above it even told of no coord cluster).
    drill.restore(&snapshot);
    drill.wait(true).await;
    let (first, text) = drill.request(&host_a, "first restore");
    assert!(text.contains("new_epoch = 3"), "{text}");
    let done = drill.approve_and_advance(&host_a, &first);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(drill.wait(false).await.epoch, 3);
    issued.extend(drill.grants("epoch3", 30).await);
    let status = drill.client().await.server_status().await.unwrap();
    assert_eq!(status.cluster, "dev");
    let served =
        |status: &holdfast_proto::v1::ServerStatusResponse| status.served.iter().map(|s| (s.cluster.clone(), s.epoch)).collect::<Vec<_>>();
    assert_eq!(served(&status), [("coord".to_string(), 2), ("dev".to_string(), 3)], "{status:?}");

    // The tailer has recorded those grants (its checkpoint is past them,
    // so past S): after the restore its store is ahead of etcd.
    let last = issued.iter().map(|t| t.revision()).max().unwrap_or_default();
    let recorded = || holdfast_audit::store::read_checkpoint(&state.join("audit")).ok().flatten().map(|c| c.revision as u64);
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    while recorded().is_none_or(|r| r < last) {
        assert!(std::time::Instant::now() < deadline, "the tailer did not record past revision {last} in 30 s: {:?}", recorded());
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Restore S again (older than that advance), and restart every daemon.
    drill.restore(&snapshot);
    drill.wait(true).await;
    drop(stop);
    let (banner, _stop) = dev_detach(&state);
    // The tailer's store recorded revisions the restored etcd reuses: the
    // appliance kept it aside and the tailer started a new one (the runbook's step).
    let kept = std::fs::read_dir(&state)
        .unwrap()
        .filter_map(Result::ok)
        .filter(|e| e.file_name().to_string_lossy().starts_with("audit.before-restore-"))
        .count();
    assert_eq!(kept, 1, "the audit store recorded before the restore is kept aside: {banner}");
    let status = drill.wait(true).await;
    assert_eq!(served(&status), [("coord".to_string(), 2), ("dev".to_string(), 3)], "the arbiter remembers epoch 3 across the restart");
    let shown =
        Ran::of(Command::new(bin("holdfastctl")).args(["epoch", "status", "--json"]).args(conn_flags(&env_file(&state.join("env")))));
    assert_eq!(shown.code, 0, "{shown}");
    assert_eq!(
        shown.json()["served"][1],
        serde_json::json!({"cluster": "dev", "epoch": 3, "cluster_id": status.served[1].cluster_id}),
        "{shown}"
    );
    assert_eq!(shown.json()["sealed"], true, "{shown}");

    // The first request, replayed: the coord cluster still has its nonce;
    // with one cluster, etcd lost it and the arbiter's record refuses.
    let mut c = Etcd::client_for(&drill.root()).await;
    let before = written(&mut c).await;
    let replay = drill.run(&host_a, &["epoch", "advance", "--request", &first]);
    assert_eq!(replay.code, 65, "{replay}");
    let why = match tiers {
        Tiers::Separate => "this request was already carried out",
        Tiers::Shared => "an arbiter already served epoch 3",
    };
    assert!(replay.stderr.contains(why), "{replay}");
    assert_eq!(written(&mut c).await, before, "a replayed advance wrote to etcd");

    // A request valid for more than a day (edited before anyone signed).
    let (long, text) = drill.request(&host_b, "too long");
    let created: u64 = text.lines().find_map(|l| l.strip_prefix("created_unix = ")).unwrap().parse().unwrap();
    let expires = text.lines().find(|l| l.starts_with("expires_unix = ")).unwrap();
    std::fs::write(&long, text.replace(expires, &format!("expires_unix = {}", created + 25 * 3600))).unwrap();
    let capped = drill.approve_and_advance(&host_b, &long);
    assert_eq!(capped.code, 77, "{capped}");
    assert!(capped.stderr.contains("more than 24h"), "{capped}");
    assert_eq!(written(&mut c).await, before, "a refused advance wrote to etcd");

    // From host B, with no epochs.log: the request asks for epoch 4.
    assert!(!host_b.join("epochs.log").exists());
    let (second, text) = drill.request(&host_b, "second restore");
    assert!(text.contains("expected_epoch = 1") && text.contains("highest_known = 3") && text.contains("new_epoch = 4"), "{text}");
    let done = drill.approve_and_advance(&host_b, &second);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(done.json()["epoch"], 4, "{done}");
    assert_eq!(drill.wait(false).await.epoch, 4);

    let after = drill.grants("epoch4", 30).await;
    let highest = *issued.iter().max().unwrap();
    assert!(after.iter().all(|t| *t > highest), "a token after the second advance is not above every token before it");
    assert_unique(issued.iter().chain(&after));
}

fn assert_unique<'a>(tokens: impl Iterator<Item = &'a Token>) {
    let mut all: Vec<u64> = tokens.map(|t| t.expose()).collect();
    let n = all.len();
    all.sort_unstable();
    all.dedup();
    assert_eq!(all.len(), n, "a token was issued twice");
}

/// A restore of the coord cluster from a snapshot older than an advance
/// rolls the allocator and the approval nonces back, and seals the coord
/// tier (its keys live there) while the entity tier grants on. With the
/// entity cluster also restored from before that advance and every daemon
/// restarted, the advance's request replayed is refused (the arbiter
/// remembers serving its epoch) and changes neither cluster, and the next
/// advance, requested from a host that never saw the first, asks above
/// every epoch used; so does the coord cluster's own advance, which lifts
/// its seal: no token of either tier is ever issued twice.
#[tokio::test(flavor = "multi_thread")]
async fn a_coord_restore_older_than_an_advance_never_reissues_an_epoch() {
    let dir = TestDir::new("dr-coord");
    let state = dir.path.join("hf");
    let (_, stop) = dev_detach(&state);
    let drill = Drill::new(&dir.path, &state);
    let (host_a, host_b) = (dir.path.join("host-a"), dir.path.join("host-b"));

    // Epoch 1 is the entity cluster's, 2 the coord cluster's (allocator 2):
    // demo is an entity-tier class, jobs a coord-tier one.
    let mut issued = drill.grants("s", 3).await;
    let mut jobs = drill.grants_in("jobs", "s", 3).await;
    assert!(issued.iter().all(|t| t.epoch() == 1) && jobs.iter().all(|t| t.epoch() == 2), "{issued:?} {jobs:?}");
    // A session lives on one tier: a jobs key on a demo session is refused
    // (CLASS_TIER, before anything is read), and one Locker keeps a session
    // per tier, so it takes keys of both.
    let demo = drill.client().await.open_session_for("demo", None).await.unwrap();
    assert_eq!(demo.tier(), "entity");
    let refused = demo.acquire(&LockKey::parse("jobs/on-demo").unwrap(), Duration::ZERO).await.unwrap_err();
    assert_eq!(refused.reason(), Some(holdfast_proto::ErrorReason::ClassTier), "{refused}");
    assert!(refused.to_string().contains("class jobs of the coord tier"), "{refused}");
    demo.close().await.unwrap();
    let env = env_file(&state.join("env"));
    let locker = holdfast_client::Locker::new(
        holdfast_client::LockerConfig {
            endpoints: vec![env["HOLDFAST_ENDPOINT"].clone()],
            ca: env["HOLDFAST_CA"].clone().into(),
            cert: env["HOLDFAST_CERT"].clone().into(),
            key: env["HOLDFAST_KEY"].clone().into(),
        },
        |_| {},
    )
    .unwrap();
    let opts = holdfast_client::AcquireOptions::default();
    let on_entity = locker.acquire(&LockKey::parse("demo/locker").unwrap(), opts).await.unwrap();
    let on_coord = locker.acquire(&LockKey::parse("jobs/locker").unwrap(), opts).await.unwrap();
    assert_eq!((on_entity.token().epoch(), on_coord.token().epoch()), (1, 2));
    assert!(on_entity.release().await.unwrap() && on_coord.release().await.unwrap());
    locker.close().await.unwrap();
    let (coord_snapshot, entity_snapshot) = (dir.path.join("coord.db"), dir.path.join("entity.db"));
    drill.snapshot(&drill.coord_root(), &coord_snapshot);
    drill.snapshot(&drill.root(), &entity_snapshot);
    issued.extend(drill.grants("lost", 3).await);
    jobs.extend(drill.grants_in("jobs", "lost", 3).await);

    // An entity restore, the advance to epoch 3 (allocated on coord).
    drill.restore(&entity_snapshot);
    drill.wait(true).await;
    let (first, text) = drill.request(&host_a, "entity restore");
    assert!(text.contains("new_epoch = 3"), "{text}");
    let done = drill.approve_and_advance(&host_a, &first);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(drill.wait(false).await.epoch, 3);
    issued.extend(drill.grants("epoch3", 20).await);
    let (allocator, _) =
        holdfast_store::epoch::read_allocator(&holdfast_store::Etcd::connect(&drill.coord_root()).await.unwrap()).await.unwrap();
    assert_eq!(allocator.highest, 3, "the advance allocated epoch 3 on the coord cluster");

    // The coord restore seals the coord tier only: the entity cluster's
    // locks and epoch are untouched, and its grants go on.
    let restored = drill.restore_cluster(&coord_snapshot, "coord");
    assert!(restored.stdout.contains("coord etcd restored") && restored.stdout.contains("seals the coord tier"), "{restored}");
    let status = drill.wait_coord(true).await;
    assert!(status.serving && status.epoch == 3, "a coord restore sealed the entity tier: {status:?}");
    assert!(status.clusters[1].sealed_reason.contains("rewound"), "{status:?}");
    issued.extend(drill.grants("after-coord-restore", 3).await);
    let session = drill.client().await.open_session_for("jobs", None).await.unwrap();
    let refused = session.acquire(&LockKey::parse("jobs/while-sealed").unwrap(), Duration::ZERO).await.unwrap_err();
    assert_eq!(refused.reason(), Some(holdfast_proto::ErrorReason::Sealed), "{refused}");
    drop(session);
    drill.restore(&entity_snapshot);
    drill.wait(true).await;
    drop(stop);
    let (_, _stop) = dev_detach(&state);
    drill.wait(true).await;
    drill.wait_coord(true).await;
    let coord = holdfast_store::Etcd::connect(&drill.coord_root()).await.unwrap();
    assert_eq!(holdfast_store::epoch::read_allocator(&coord).await.unwrap().0.highest, 2, "the coord restore rolled the allocator back");

    // The replay: neither cluster remembers its nonce; the arbiter refuses.
    let (mut c, mut k) = (Etcd::client_for(&drill.root()).await, Etcd::client_for(&drill.coord_root()).await);
    let before = (written(&mut c).await, written(&mut k).await);
    let replay = drill.run(&host_a, &["epoch", "advance", "--request", &first]);
    assert_eq!(replay.code, 65, "{replay}");
    assert!(replay.stderr.contains("an arbiter already served epoch 3"), "{replay}");
    assert_eq!((written(&mut c).await, written(&mut k).await), before, "a replayed advance wrote to a cluster");

    // From host B: above the arbiter's epoch 3, allocated on coord again.
    let (second, text) = drill.request(&host_b, "coord and entity restore");
    assert!(text.contains("highest_known = 3") && text.contains("new_epoch = 4"), "{text}");
    let done = drill.approve_and_advance(&host_b, &second);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(drill.wait(false).await.epoch, 4);
    assert_eq!(holdfast_store::epoch::read_allocator(&coord).await.unwrap().0.highest, 4);
    let after = drill.grants("epoch4", 20).await;
    let highest = *issued.iter().max().unwrap();
    assert!(after.iter().all(|t| *t > highest), "a token after the advance is not above every token before it");
    assert_unique(issued.iter().chain(&after));

    // The coord cluster's own advance, requested against it by name: its
    // epoch 2 goes to 5, above every epoch any cluster used; the coord tier
    // serves again and its tokens are above every earlier coord-tier token.
    let coord_endpoint = "HOLDFAST_COORD_ENDPOINT";
    let out = drill.run_on(
        &host_b,
        coord_endpoint,
        &["epoch", "advance-request", "--cluster", "coord", "--requester", "alice", "--reason", "coord restore"],
    );
    assert_eq!(out.code, 0, "{out}");
    let req = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap().to_string();
    let text = std::fs::read_to_string(&req).unwrap();
    assert!(text.contains("cluster = \"coord\"") && text.contains("expected_epoch = 2") && text.contains("new_epoch = 5"), "{text}");
    let done = drill.approve_and_advance_on(&host_b, coord_endpoint, &req);
    assert_eq!(done.code, 0, "{done}");
    let status = drill.wait_coord(false).await;
    assert_eq!((status.clusters[1].name.as_str(), status.clusters[1].epoch, status.epoch), ("coord", 5, 4), "{status:?}");
    let jobs_after = drill.grants_in("jobs", "epoch5", 5).await;
    let highest = *jobs.iter().max().unwrap();
    assert!(
        jobs_after.iter().all(|t| *t > highest && t.epoch() == 5),
        "a coord-tier token after the advance is not above every one before it"
    );
    assert_unique(jobs.iter().chain(&jobs_after));

    // A coord-tier hold is force-released where it lives: holdfastctl reads
    // the key's class and goes to the coord cluster (named by
    // --coord-endpoint) although --etcd-endpoint is the entity cluster.
    let session = drill.client().await.open_session_for("jobs", None).await.unwrap();
    let _stuck = session.acquire(&LockKey::parse("jobs/stuck").unwrap(), Duration::ZERO).await.unwrap();
    let hold = format!("{}jobs/stuck", layout::HOLD_PREFIX);
    assert_eq!(k.get(hold.as_str(), None).await.unwrap().count(), 1, "the jobs hold is on the coord cluster");
    assert_eq!(c.get(hold.as_str(), None).await.unwrap().count(), 0, "the jobs hold is on the entity cluster");
    let force = |args: &[&str]| drill.run_as(&host_b, "HOLDFAST_ETCD_ENDPOINT", FORCE_RELEASE.name, args);
    let out = force(&["force-release", "request", "jobs/stuck", "--requester", "alice", "--reason", "stuck job"]);
    assert_eq!(out.code, 0, "{out}");
    let req = out.stdout.lines().find_map(|l| l.strip_prefix("wrote ")).unwrap().to_string();
    sign_file(&req, &drill.alice);
    sign_file(&req, &drill.bob);
    let done = force(&["force-release", "apply", &req]);
    assert_eq!(done.code, 0, "{done}");
    assert_eq!(k.get(hold.as_str(), None).await.unwrap().count(), 0, "the force-release left the coord-tier hold");
}
