//! The arbiter speaks systemd's notify protocol: READY=1 only once it can
//! serve (listener bound and etcd answered), STOPPING=1 on SIGTERM.

use holdfast_tests::*;
use std::time::Duration;

#[tokio::test]
async fn ready_is_sent_only_once_the_arbiter_can_serve() {
    let dir = TestDir::new("notify");
    let pki = Pki::new(&dir.path);
    // etcd is not there yet: the arbiter must not claim readiness.
    let port = holdfast_devkit::ports::free_port();
    let endpoint = format!("http://127.0.0.1:{port}");
    let mut arbiter = Arbiter::spawn(&dir.path, "arbiter", std::slice::from_ref(&endpoint), &pki);
    let early = arbiter.wait_ready(Duration::from_secs(3));
    assert!(early.is_err(), "READY=1 before etcd answered");
    assert!(!arbiter.notify.messages().iter().any(|m| m.contains("READY=1")));

    // Start etcd on that port; the same arbiter becomes ready by itself.
    let mut etcd = Etcd::start_on(&dir.path, &[port]).await;
    arbiter.wait_ready(Duration::from_secs(20)).expect("READY=1 once etcd answers");
    let mut real = arbiter;
    let client = real.client(&pki, &pki.workload("w", "team/w")).await;
    // Ready but sealed: the epoch is not initialised yet, and it says so.
    let status = client.server_status().await.unwrap();
    assert!(status.sealed && status.sealed_reason.contains("epoch init"), "{status:?}");
    etcd.init_epoch().await;
    real.wait_sealed(&client, false, Duration::from_secs(10)).await;

    // STOPPING=1 on SIGTERM, and a clean exit.
    let mut child = real.child.take().unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::Signal::SIGTERM).unwrap();
    let status = tokio::task::spawn_blocking(move || child.wait()).await.unwrap().unwrap();
    assert!(status.success(), "arbiter exit status {status}");
    real.notify.drain();
    assert!(real.notify.messages().iter().any(|m| m.contains("STOPPING=1")), "{:?}", real.notify.messages());
    etcd.stop_all();
}

/// Runs grpcurl (scripts/install-deps builds it) against the arbiter with a
/// workload's client certificate, as an operator or a probe would:
/// `grpcurl [flags] ADDRESS [verb...]`.
fn grpcurl(pki: &Pki, endpoint: &str, flags: &[&str], verb: &[&str]) -> Ran {
    let cert = pki.workload("probe", "ops/probe");
    let grpcurl = holdfast_devkit::process::which("grpcurl").expect("grpcurl is not installed: run scripts/install-deps");
    let mut cmd = std::process::Command::new(grpcurl);
    cmd.args(["-max-time", "10", "-cacert"]).arg(pki.ca.ca_path()).arg("-cert").arg(&cert.cert).arg("-key").arg(&cert.key);
    cmd.args(flags).arg(endpoint).args(verb);
    Ran::of(&mut cmd)
}

/// grpc.health.v1.Health/Check for `service`, through grpcurl: the status
/// word it prints (SERVING, NOT_SERVING).
fn health(pki: &Pki, endpoint: &str, service: &str) -> String {
    let body = format!("{{\"service\":\"{service}\"}}");
    let ran = grpcurl(pki, endpoint, &["-d", &body], &["grpc.health.v1.Health/Check"]);
    assert!((ran.code == 0), "health check failed: {ran}");
    let v: serde_json::Value = serde_json::from_str(&ran.stdout).unwrap_or_else(|e| panic!("{e}: {ran}"));
    v["status"].as_str().unwrap_or("").to_string()
}

/// `holdfastctl health [ARGS]` as an operator runs it.
fn ctl_health(pki: &Pki, endpoint: &str, args: &[&str]) -> Ran {
    let cert = pki.workload("operator", "ops/operator");
    Ran::of(
        std::process::Command::new(bin("holdfastctl"))
            .arg("health")
            .args(args)
            .env("HOLDFAST_ENDPOINT", endpoint)
            .env("HOLDFAST_CA", pki.ca.ca_path())
            .env("HOLDFAST_CERT", &cert.cert)
            .env("HOLDFAST_KEY", &cert.key),
    )
}

async fn wait_health(pki: &Pki, endpoint: &str, want: &str) {
    let end = std::time::Instant::now() + Duration::from_secs(15);
    loop {
        let (a, b) = (health(pki, endpoint, ""), health(pki, endpoint, "lock.v1.Lock"));
        if a == want && b == want {
            return;
        }
        assert!(std::time::Instant::now() < end, "health: overall {a}, lock.v1.Lock {b}; wanted {want}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// The standard gRPC interfaces operators' tools use: reflection lists the
/// services (grpcurl needs no .proto), and grpc.health.v1 answers SERVING
/// only while the arbiter grants: NOT_SERVING while sealed (before the epoch
/// exists, and again once sealed after serving) and while etcd does not
/// answer; `holdfastctl health` says the same with its exit status.
#[tokio::test]
async fn health_follows_the_seal_and_reflection_lists_the_services() {
    let dir = TestDir::new("health");
    let pki = Pki::new(&dir.path);
    let mut etcd = Etcd::start(&dir.path, 1).await;
    let arbiter = Arbiter::start(&dir.path, "arbiter", &etcd.endpoints(), &pki);
    let endpoint = arbiter.endpoint();

    let listed = grpcurl(&pki, &endpoint, &[], &["list"]);
    assert!((listed.code == 0), "{listed}");
    for service in ["lock.v1.Lock", "grpc.health.v1.Health", "grpc.reflection.v1.ServerReflection"] {
        assert!(listed.stdout.lines().any(|l| l.trim() == service), "reflection does not list {service}: {listed}");
    }
    let described = grpcurl(&pki, &endpoint, &[], &["describe", "lock.v1.Lock"]);
    assert!((described.code == 0) && described.stdout.contains("rpc Acquire"), "{described}");

    // No epoch yet: sealed, so not serving.
    wait_health(&pki, &endpoint, "NOT_SERVING").await;
    let sealed = ctl_health(&pki, &endpoint, &[]);
    assert!(sealed.code == 69 && sealed.stdout.trim() == "NOT_SERVING", "{sealed}");
    let waited = ctl_health(&pki, &endpoint, &["--wait", "1s"]);
    assert!(waited.code == 69 && waited.stdout.trim() == "NOT_SERVING", "--wait gives up NOT_SERVING: {waited}");
    // `holdfastctl health --wait` returns as soon as it grants.
    let waiting = {
        let (pki_dir, endpoint) = (dir.path.clone(), endpoint.clone());
        std::thread::spawn(move || ctl_health(&Pki::new(&pki_dir), &endpoint, &["--wait", "30s"]))
    };
    tokio::time::sleep(Duration::from_millis(500)).await;
    etcd.init_epoch().await;
    wait_health(&pki, &endpoint, "SERVING").await;
    let waited = waiting.join().unwrap();
    assert!(waited.code == 0 && waited.stdout.trim() == "SERVING", "{waited}");

    // A typed refusal reaches a client no one here wrote (grpcurl is
    // grpc-go) with its code, message and typed detail: grpc-go turns a
    // status whose details disagree with them into `Internal`. (No class
    // set is published here, so the acquire is refused before its session
    // is looked up.)
    let refused = grpcurl(&pki, &endpoint, &["-d", r#"{"session_id": 12345, "namespace": "ops", "key": "x"}"#], &["lock.v1.Lock/Acquire"]);
    let said = format!("{}{}", refused.stdout, refused.stderr);
    assert!(refused.code != 0, "{refused}");
    assert!(
        said.contains("Code: FailedPrecondition") && said.contains("no class set is published yet"),
        "not the typed refusal: {refused}"
    );
    assert!(
        said.contains("type.googleapis.com/lock.v1.ErrorDetail") && said.contains("ERROR_REASON_NO_POLICY"),
        "grpcurl did not read the typed detail: {refused}"
    );
    assert!(!said.contains("Internal") && !said.contains("mismatch"), "grpc-go did not believe the status: {refused}");

    // etcd frozen: the arbiter cannot verify it, so it does not serve; and
    // serves again once etcd answers.
    let member = etcd.pid(0).expect("the etcd member's pid");
    sigstop(member);
    wait_health(&pki, &endpoint, "NOT_SERVING").await;
    let down = ctl_health(&pki, &endpoint, &[]);
    assert_eq!(down.code, 69, "{down}");
    sigcont(member);
    wait_health(&pki, &endpoint, "SERVING").await;

    // Sealed after serving (the durable seal an arbiter writes when it finds
    // the cluster restored): NOT_SERVING until an epoch advance.
    let seal = holdfast_model::layout::SealRecord { reason: "test: sealed by hand".into(), sealed_at_unix: 0 };
    etcd.client().await.put(holdfast_model::layout::SEAL_KEY, holdfast_model::layout::encode(&seal), None).await.expect("put /sys/seal");
    wait_health(&pki, &endpoint, "NOT_SERVING").await;
    let sealed = ctl_health(&pki, &endpoint, &[]);
    assert!(sealed.code == 69 && sealed.stdout.trim() == "NOT_SERVING", "{sealed}");
    etcd.stop_all();

    // A client without a certificate from the CA is refused, health or not.
    let grpcurl_bin = holdfast_devkit::process::which("grpcurl").expect("grpcurl");
    let anonymous = Ran::of(
        std::process::Command::new(grpcurl_bin).args(["-max-time", "5", "-cacert"]).arg(pki.ca.ca_path()).arg(&endpoint).arg("list"),
    );
    assert!(anonymous.code != 0, "an anonymous client was answered: {anonymous}");
}

/// Socket activation: started by `systemd-socket-activate` (systemd's own
/// tool, passing the socket as holdfast-arbiter.socket does), the arbiter
/// serves on the socket it was handed and never binds `listen` itself (the
/// port is held by the activator, so a bind would fail), and connections
/// made before it started are served once it is up.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_arbiter_serves_on_the_socket_systemd_passes() {
    let dir = TestDir::new("activation");
    let pki = Pki::new(&dir.path);
    let mut etcd = Etcd::start(&dir.path, 1).await;
    etcd.init_epoch().await;
    let activate = holdfast_devkit::process::which("systemd-socket-activate").expect("systemd-socket-activate (package systemd)");
    let config = Arbiter::config(&dir.path, "activated", &etcd.endpoints(), &pki);
    let listen = config.listen;
    let mut launch = holdfast_devkit::daemon::Launch::new(bin("holdfast-arbiter"), config, &dir.path, "activated");
    // The activator passes on only the variables named with -E.
    launch.wrapper = vec![activate.display().to_string(), "-E".into(), "NOTIFY_SOCKET".into(), "-l".into(), listen.to_string()];
    let mut process = holdfast_devkit::daemon::DaemonProcess::spawn(&launch).expect("start the activator");
    // The activator listens at once and starts the arbiter on the first
    // connection; this plain one waits in the socket's backlog.
    let end = std::time::Instant::now() + Duration::from_secs(10);
    let _queued = loop {
        match std::net::TcpStream::connect(listen) {
            Ok(c) => break c,
            Err(e) if std::time::Instant::now() > end => panic!("the activator never listened on {listen}: {e}"),
            Err(_) => std::thread::sleep(Duration::from_millis(50)),
        }
    };
    // A call made before the arbiter runs is answered once it does.
    let pki_config = pki.client_config(&listen.to_string(), &pki.workload("early", "team/early"));
    let early = tokio::spawn(async move {
        let client = holdfast_client::Client::connect(&pki_config).await?;
        client.server_status().await.map(|_| client).map_err(anyhow::Error::from)
    });
    process.wait_ready(Duration::from_secs(30)).expect("READY=1 from the activated arbiter");
    let client = early.await.unwrap().expect("the call made before the arbiter started is answered");
    let status = client.server_status().await.expect("ServerStatus over the passed socket");
    assert!(status.serving, "{status:?}");
    let log = std::fs::read_to_string(&launch.log).unwrap();
    assert!(log.contains("socket from systemd"), "the arbiter did not say it serves on the passed socket:\n{log}");
    process.stop(Duration::from_secs(10));
    etcd.stop_all();
}
