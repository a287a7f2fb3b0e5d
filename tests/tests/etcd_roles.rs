//! etcd with client and peer TLS, `--client-cert-auth` and authentication
//! on: one role per tool, limited to its prefixes (`holdfast_store::roles`),
//! made by `holdfastctl etcd roles`; and an appliance running on them.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::EtcdConfig;
use holdfast_model::LockKey;
use holdfast_model::layout;
use holdfast_store::roles::{ARBITER, CONTROLLER, EPOCH, OBSERVER, PAUSETEST, ROLES, TAILER};
use holdfast_tests::*;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

fn holdfastctl(args: &[&str], cfg: &EtcdConfig) -> Ran {
    Ran::of(Command::new(bin("holdfastctl")).args(args).args(etcd_flags(cfg)))
}

async fn put(cfg: &EtcdConfig, key: &str) -> Result<(), String> {
    let mut c = Etcd::client_for(cfg).await;
    c.put(key, "x", None).await.map(|_| ()).map_err(|e| e.to_string())
}

async fn get(cfg: &EtcdConfig, key: &str) -> Result<(), String> {
    let mut c = Etcd::client_for(cfg).await;
    c.get(key, None).await.map(|_| ()).map_err(|e| e.to_string())
}

fn denied(r: Result<(), String>, what: &str) {
    let e = r.expect_err(&format!("{what} was allowed"));
    assert!(e.contains("permission denied") || e.contains("user name"), "{what}: {e}");
}

#[tokio::test(flavor = "multi_thread")]
async fn etcd_roles_are_made_once_and_each_credential_reaches_only_its_prefixes() {
    let dir = TestDir::new("etcd-roles");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    let root = etcd.config();

    // Non-root before auth is on may run it; as it is run here, as root.
    let first = holdfastctl(&["etcd", "roles"], &root);
    assert_eq!(first.code, 0, "{first}");
    for role in ROLES {
        assert!(first.stdout.contains(&format!("created role {}", role.name)), "{first}");
        assert!(first.stdout.contains(&format!("granted role {0} to user {0}", role.name)), "{first}");
    }
    assert!(first.stdout.contains("authentication on"), "{first}");
    let again = holdfastctl(&["etcd", "roles"], &root);
    assert_eq!(again.code, 0, "{again}");
    assert!(again.stdout.contains(&format!("{} roles match the table (0 change(s)); authentication on", ROLES.len())), "{again}");

    // Authentication is on: a role's credentials cannot run it again.
    let arbiter = etcd.config_as(ARBITER.name);
    let refused = holdfastctl(&["etcd", "roles"], &arbiter);
    assert_eq!(refused.code, 77, "{refused}");
    assert!(refused.stderr.contains("run this as etcd's root user"), "{refused}");

    let revision = etcd.revision().await;
    let (pausetest, epoch, controller, observer, tailer) = (
        etcd.config_as(PAUSETEST.name),
        etcd.config_as(EPOCH.name),
        etcd.config_as(CONTROLLER.name),
        etcd.config_as(OBSERVER.name),
        etcd.config_as(TAILER.name),
    );
    let pausetest_key = format!("{}demo/fixture", layout::PAUSETEST_PREFIX);
    denied(put(&arbiter, &pausetest_key).await, "the arbiter writing /sys/pausetest/");
    denied(put(&arbiter, layout::EPOCH_KEY).await, "the arbiter writing /sys/epoch");
    denied(put(&arbiter, layout::EPOCHS_KEY).await, "the arbiter writing the epoch allocator");
    denied(put(&controller, layout::EPOCHS_KEY).await, "the controller writing the epoch allocator");
    denied(put(&arbiter, layout::POLICY_KEY).await, "the arbiter writing the class set");
    denied(put(&pausetest, "/l/demo/x").await, "the pause-test kit writing /l/");
    denied(put(&pausetest, layout::EPOCH_KEY).await, "the pause-test kit writing /sys/epoch");
    denied(put(&controller, "/l/demo/x").await, "the controller writing /l/");
    denied(put(&controller, layout::EPOCH_KEY).await, "the controller writing /sys/epoch");
    denied(put(&observer, layout::EPOCH_KEY).await, "the observer writing /sys/epoch");
    denied(get(&observer, "/l/demo/x").await, "the observer reading a hold");
    denied(put(&tailer, "/l/demo/x").await, "the tailer writing /l/");
    denied(put(&epoch, layout::POLICY_KEY).await, "the epoch administrator writing the class set");
    // Anonymous: a certificate from the etcd CA whose CN is no user, and no
    // certificate at all.
    let stranger = etcd.config_as("someone-else");
    denied(get(&stranger, layout::EPOCH_KEY).await, "an unknown user reading /sys/epoch");
    denied(put(&stranger, "/l/demo/x").await, "an unknown user writing /l/");
    let ca = etcd_client::Certificate::from_pem(std::fs::read(root.ca_file.as_ref().unwrap()).unwrap());
    let opts = etcd_client::ConnectOptions::new()
        .with_timeout(Duration::from_secs(2))
        .with_connect_timeout(Duration::from_secs(2))
        .with_tls(etcd_client::TlsOptions::new().ca_certificate(ca));
    // etcd ends the handshake without a client certificate: either the
    // connect or the first call fails.
    if let Ok(mut c) = etcd_client::Client::connect(&root.endpoints, Some(opts)).await {
        let e = c.get(layout::EPOCH_KEY, None).await.expect_err("a client without a certificate read /sys/epoch");
        assert!(!e.to_string().is_empty());
    }
    assert_eq!(etcd.revision().await, revision, "a refused write moved the revision");

    // What each may do, it can.
    put(&pausetest, &pausetest_key).await.expect("the pause-test kit writes its results");
    get(&tailer, "/l/demo/x").await.expect("the tailer reads everything");
    get(&observer, layout::EPOCH_KEY).await.expect("the observer reads /sys/");
    get(&arbiter, layout::EPOCH_KEY).await.expect("the arbiter reads the epoch");
}

#[tokio::test(flavor = "multi_thread")]
async fn an_appliance_runs_on_its_roles_over_etcd_mtls() {
    let dir = TestDir::new("etcd-roles-appliance");
    let etcd = Etcd::start_secure(&dir.path, 3).await;
    etcd.enable_auth().await;
    denied(put(&etcd.config_as(ARBITER.name), layout::EPOCH_KEY).await, "the arbiter writing /sys/epoch");
    // Each tool with its own credentials: the epoch administrator, the
    // controller (and the pause-test kit's fixture records), the arbiter.
    holdfast_store::epoch::init(&holdfast_store::Etcd::connect(&etcd.config_as(EPOCH.name)).await.unwrap(), |_| {}).await.unwrap();
    let _controller = etcd.publish_policy(&dir.path, &[("demo", 30), ("fence", 10)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter_etcd = EtcdConfig { request_timeout: Duration::from_secs(2), ..etcd.config_as(ARBITER.name) };
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = arbiter_etcd.clone());
    let client = arbiter.client(&pki, &pki.workload("w", "svc/w")).await;
    let status = client.server_status().await.unwrap();
    assert!(status.serving && !status.sealed, "{status:?}");

    // Sessions, grants, contention, inspect, release, keepalives: all on
    // the arbiter's role.
    let key = LockKey::parse("fence/over-mtls").unwrap();
    let session = client.open_session_for("fence", None).await.unwrap();
    let hold = session.acquire(&key, Duration::ZERO).await.unwrap();
    let other = arbiter.client(&pki, &pki.workload("o", "svc/o")).await.open_session_for("fence", None).await.unwrap();
    assert!(other.acquire(&key, Duration::ZERO).await.is_err(), "a held key was granted again");
    assert!(client.inspect(&key).await.unwrap().held);
    tokio::time::sleep(Duration::from_secs(5)).await; // keepalives renew
    assert!(session.can_start());
    let first_token = hold.token();
    assert!(hold.release().await.unwrap());
    let again = other.acquire(&key, Duration::ZERO).await.unwrap();
    assert!(again.token() > first_token, "tokens increase");

    // `holdfastctl status` as the observer.
    let status = holdfastctl(&["status"], &etcd.config_as(OBSERVER.name));
    assert_eq!(status.code, 0, "{status}");
    assert!(status.stdout.contains("class set    version 1\n"), "{status}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_arbiters_etcd_certificate_rotates_without_a_restart() {
    let dir = TestDir::new("etcd-cert-rotation");
    let mut etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    etcd.init_epoch().await;
    let _controller = etcd.publish_policy(&dir.path, &[("demo", 30)], "").await;
    // The arbiter's etcd certificate expires 25 s from now.
    let pki = etcd.pki();
    let mut short = holdfast_devkit::pki::params(ARBITER.name, &[], &[]).unwrap();
    short.not_before = time::OffsetDateTime::now_utc() - time::Duration::minutes(1);
    short.not_after = time::OffsetDateTime::now_utc() + time::Duration::seconds(25);
    let issued = pki.ca.issue_with("arbiter-etcd", short).unwrap();
    let arbiter_etcd = EtcdConfig {
        cert_file: Some(issued.cert.clone()),
        key_file: Some(issued.key.clone()),
        request_timeout: Duration::from_secs(2),
        ..etcd.config_as(ARBITER.name)
    };
    let tls = Pki::new(&dir.path);
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &tls, &|c| c.etcd = arbiter_etcd.clone());
    let client = arbiter.client(&tls, &tls.workload("w", "svc/w")).await;
    let session = client.open_session_for("demo", None).await.unwrap();
    session.acquire(&LockKey::parse("demo/before").unwrap(), Duration::ZERO).await.unwrap();

    // A long-lived certificate for the same user replaces it on disk
    // (certificate, then key, each by rename), under the running arbiter.
    let fresh = pki.ca.issue_with("arbiter-etcd-next", holdfast_devkit::pki::params(ARBITER.name, &[], &[]).unwrap()).unwrap();
    let first = (dir.path.join("first-etcd-cert.pem"), dir.path.join("first-etcd-key.pem"));
    std::fs::copy(&issued.cert, &first.0).unwrap();
    std::fs::copy(&issued.key, &first.1).unwrap();
    for (from, to) in [(&fresh.cert, &issued.cert), (&fresh.key, &issued.key)] {
        std::fs::rename(from, to).unwrap();
    }
    // Past the first certificate's expiry, etcd restarts: every connection
    // is made again, and only the new certificate is still valid.
    tokio::time::sleep(Duration::from_secs(27)).await;
    etcd.restart_member(0).await;
    // The premise: etcd refuses the first certificate now.
    let expired = EtcdConfig { cert_file: Some(first.0.clone()), key_file: Some(first.1.clone()), ..arbiter_etcd.clone() };
    let refused = match holdfast_store::etcd::connect_client(&expired).await {
        Ok(mut c) => c.get(layout::EPOCH_KEY, None).await.is_err(),
        Err(_) => true,
    };
    assert!(refused, "etcd still accepts the expired certificate");
    let end = tokio::time::Instant::now() + Duration::from_secs(30);
    let key = LockKey::parse("demo/after").unwrap();
    loop {
        match session.acquire(&key, Duration::ZERO).await {
            Ok(_) => break,
            Err(e) => assert!(tokio::time::Instant::now() < end, "no grant after the restart: {e}"),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    assert!(client.server_status().await.unwrap().serving);
}

/// Any change to etcd's users or roles refuses the requests in flight across
/// it ("revision of auth store is old"; nothing of them was applied): every
/// write proposed while such a change is being committed, and keepalive
/// streams whose renewal's check straddles one (etcd 3.6 ends the stream).
/// The arbiter sends those again, as etcd's own Go client does: operators
/// changing roles back to back must not fail lock calls.
#[tokio::test(flavor = "multi_thread")]
async fn lock_calls_do_not_fail_while_an_operator_changes_etcds_roles() {
    let dir = TestDir::new("etcd-roles-churn");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    etcd.enable_auth().await;
    holdfast_store::epoch::init(&holdfast_store::Etcd::connect(&etcd.config_as(EPOCH.name)).await.unwrap(), |_| {}).await.unwrap();
    let _controller = etcd.publish_policy(&dir.path, &[("fence", 10)], "").await;
    let pki = Pki::new(&dir.path);
    let arbiter = Arbiter::start_with(&dir.path, "arbiter", &etcd.endpoints(), &pki, &|c| c.etcd = etcd.config_as(ARBITER.name));
    let client = arbiter.client(&pki, &pki.workload("w", "svc/w")).await;
    let key = LockKey::parse("fence/roles-churn").unwrap();

    // An operator's script granting permissions back to back, each grant a
    // new auth revision, until the lock calls are done.
    let mut root = etcd.client().await;
    root.role_add("churn").await.unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let operator = tokio::spawn({
        let done = done.clone();
        async move {
            let mut changes = 0u32;
            while !done.load(Ordering::Relaxed) {
                // The operator's own change can be refused for the same reason.
                let grant = || {
                    let mut root = root.clone();
                    async move { root.role_grant_permission("churn", etcd_client::Permission::read(format!("/churn/{changes}"))).await }
                };
                holdfast_store::etcd::retry_auth_race(grant).await.unwrap();
                changes += 1;
            }
            changes
        }
    });
    // Meanwhile four sessions take turns on one key.
    let mut workers = Vec::new();
    for _ in 0..4 {
        let (client, key) = (client.clone(), key.clone());
        workers.push(tokio::spawn(async move {
            let session = client.open_session_for("fence", None).await.map_err(|e| format!("open: {e}"))?;
            let mut handoffs = 0;
            for _ in 0..40 {
                let hold = session.acquire(&key, Duration::from_secs(20)).await.map_err(|e| format!("acquire: {e}"))?;
                hold.release().await.map_err(|e| format!("release: {e}"))?;
                handoffs += 1;
            }
            session.close().await.map_err(|e| format!("close: {e}"))?;
            Ok::<u32, String>(handoffs)
        }));
    }
    let mut handoffs = 0;
    for w in workers {
        handoffs += w.await.unwrap().unwrap_or_else(|e| panic!("a lock call failed while etcd's roles changed: {e}"));
    }
    done.store(true, Ordering::Relaxed);
    let changes = operator.await.unwrap();
    println!("{handoffs} acquire+release pairs while {changes} role changes landed");
    assert_eq!(handoffs, 160);
    assert!(changes >= 150, "only {changes} role changes landed during the lock calls");
    // The changes did race the lock calls: etcd refused some of them and the
    // arbiter sent those again.
    let text = scrape(arbiter.metrics_port).await;
    let resends = sample(&text, "holdfast_arbiter_etcd_auth_race_resends_total{cluster=\"test\"}");
    println!("requests the arbiter sent again: {resends}");
    assert!(resends > 0.0, "no lock call raced a role change; the test did not test anything");
    let status = client.server_status().await.unwrap();
    assert!(status.serving && !status.sealed, "{status:?}");
}

/// `GET /members` on a member's peer port over TLS, trusting `ca` and
/// presenting `cert`/`key`: the answer's status line, or why there was none.
async fn peer_get(addr: &str, ca: &std::path::Path, cert: &std::path::Path, key: &std::path::Path) -> Result<String, String> {
    use rustls::pki_types::pem::PemObject;
    use rustls::pki_types::{CertificateDer, PrivateKeyDer, ServerName};
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let _ = rustls::crypto::ring::default_provider().install_default();
    let mut roots = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(ca).unwrap() {
        roots.add(c.unwrap()).unwrap();
    }
    let chain = CertificateDer::pem_file_iter(cert).unwrap().collect::<Result<Vec<_>, _>>().unwrap();
    let key = PrivateKeyDer::from_pem_file(key).unwrap();
    let config = rustls::ClientConfig::builder().with_root_certificates(roots).with_client_auth_cert(chain, key).unwrap();
    let tcp = tokio::net::TcpStream::connect(addr).await.map_err(|e| format!("connect: {e}"))?;
    let name = ServerName::try_from("127.0.0.1").unwrap();
    let mut tls = tokio_rustls::TlsConnector::from(Arc::new(config)).connect(name, tcp).await.map_err(|e| format!("handshake: {e}"))?;
    tls.write_all(b"GET /members HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n").await.map_err(|e| format!("write: {e}"))?;
    let mut out = Vec::new();
    let read =
        tokio::time::timeout(Duration::from_secs(10), tls.read_to_end(&mut out)).await.map_err(|_| "no answer in 10 s".to_string())?;
    read.map_err(|e| format!("read: {e}"))?;
    Ok(String::from_utf8_lossy(&out).lines().next().unwrap_or_default().to_string())
}

/// The packaged member unit (systemd/holdfast-etcd@.service) on the etcd
/// under test, through `config/etcd/try-unit-flags` (its Environment=,
/// ExecStartPre= and ExecStart= exactly): the guard refuses an env file
/// without `ETCD_PEER_CERT_ALLOWED_CN`; with the one `holdfast-provision
/// plan` writes, the member starts, its peer port answers the member's
/// certificate and refuses root's, from the same CA.
#[test]
fn the_member_unit_refuses_an_open_peer_port_and_admits_only_member_certificates() {
    let bin = etcd_binary();
    let etcdctl = bin.etcdctl.clone().expect("etcdctl beside the etcd under test");
    let repo = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let mut cmd = Command::new("python3");
    cmd.arg(repo.join("config/etcd/try-unit-flags")).arg("--etcd").arg(&bin.etcd).arg("--etcdctl").arg(&etcdctl);
    // The unit's default flags are the shipped 3.6's; another version (the
    // 3.4 test target) gets its own through the env file, as a drop-in
    // running it would.
    if bin.version.1 < 6 {
        cmd.arg("--version-flags").arg(bin.checkpoint_flags().join(" "));
    }
    let out = cmd.output().unwrap();
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    println!("{text}");
    assert!(out.status.success() && text.contains("PASS: "), "try-unit-flags failed:\n{text}");
    assert!(text.contains("(no peer CN rule, must refuse): exit 1") && text.contains("set ETCD_PEER_CERT_ALLOWED_CN"), "{text}");
    assert!(text.contains("with root's certificate: refused"), "{text}");
    assert!(text.contains("'s certificate: HTTP/1.1 200"), "{text}");
    // One member CN everywhere: the plan's env files (its golden file),
    // the packaged example, and the dev CA's member certificates.
    let cn = format!("ETCD_PEER_CERT_ALLOWED_CN={}\n", holdfast_devkit::pki::MEMBER_CN);
    for f in ["provisioning/tests/golden/etcd-c1.env", "config/etcd/member.env.example"] {
        let text = std::fs::read_to_string(repo.join(f)).unwrap();
        assert!(text.contains(&cn), "{f} should carry {cn}");
    }
}

/// A member's peer port (Raft messages, `/members`) takes only members: the
/// members run with `--peer-cert-allowed-cn` naming the member certificate's
/// CN, so a certificate of the same CA issued to a tool (root, the arbiter,
/// the read-only observer every dev shell sources) is refused there.
#[tokio::test(flavor = "multi_thread")]
async fn the_peer_port_takes_a_member_certificate_and_refuses_every_tools() {
    let dir = TestDir::new("etcd-peer-trust");
    let etcd = Etcd::start_secure(&dir.path, 1).await;
    let m = &etcd.spec.members[0];
    let tls = m.tls.as_ref().expect("a secure member");
    let addr = format!("{}:{}", m.host, m.peer_port);
    let member = peer_get(&addr, &tls.ca, &tls.cert, &tls.key).await;
    assert!(member.as_ref().is_ok_and(|l| l.contains(" 200 ")), "a member's certificate must be answered: {member:?}");
    for user in ["root", ARBITER.name, OBSERVER.name] {
        let cfg = etcd.config_as(user);
        let (cert, key) = (cfg.cert_file.unwrap(), cfg.key_file.unwrap());
        let answer = peer_get(&addr, &tls.ca, &cert, &key).await;
        assert!(!answer.as_ref().is_ok_and(|l| l.contains(" 200 ")), "the peer port answered the {user} certificate: {answer:?}");
        eprintln!("{user}: refused ({})", answer.err().unwrap_or_else(|| "answered without 200".into()));
    }
}
