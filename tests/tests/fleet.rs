//! The fleet test (issue #18): `ansible/site.yml` run for real against
//! eight booted Debian 12 containers (systemd-nspawn) in three halls: an
//! entity cluster (three hosts, one per hall, each also running an arbiter,
//! a controller and a tailer) and a coord cluster of its own (five hosts,
//! 2-2-1 across the halls, as the placement ADR says).
//!
//! - One network namespace made for the test (`ip netns add`), its
//!   loopback up; the containers boot into it, each host on its own
//!   loopback address ([`HOSTS`], [`COORD_HOSTS`]: sshd, the etcd member's
//!   client and peer URLs, the arbiter's socket (a drop-in from the arbiter
//!   role), the metrics ports). Nothing leaves 127.0.0.0/8 of that namespace.
//! - The hosts name their cluster (`holdfast_provision_cluster`), so the
//!   placement plan pins them; `holdfast_etcd` makes each cluster's roles
//!   from its first host and initialises the coord cluster's epoch, then
//!   the entity cluster's, allocated on coord. Arbiters and tailers get a
//!   `[coord]` table, controllers publish on coord.
//! - Ansible connects over ssh (a key made by the test, sshd bound to the
//!   host's address) from the pinned venv tests/ansible.rs uses, run with
//!   `ip netns exec`; the inventory is written here: the TLS material made
//!   with openssl like README.md's quick start, the signed packages
//!   (HOLDFAST_PACKAGES_DIR, or built by packaging/build), no data volume
//!   (`holdfast_provision_volume: false`: a container has no disk).
//! - After the first run: every etcd member active, `etcdctl member list`
//!   showing three members of entity-1 and five of coord; controller,
//!   tailer, socket and arbiter active on every entity host, their rendered
//!   configurations naming the coord cluster; `holdfastctl health` SERVING
//!   and `holdfastctl lock exec` granted through each host's arbiter, for an
//!   entity-tier and a coord-tier class. The files under /etc/holdfast
//!   have the packages' owners and modes (one user per daemon: each key
//!   readable by its own daemon's group alone, the tailer's root-only for
//!   its LoadCredential=). A second run changes nothing
//!   (`changed=0` on every host in the PLAY RECAP).
//! - Then `rolling-restart.yml` (every etcd member of both clusters, then
//!   every arbiter, one host at a time, each gated on health) while a
//!   client holds a lock through `holdfastctl lock exec` and renews it: it
//!   keeps the lock throughout (exit 0, not 79 for a lost lock).
//! - Then `defrag.yml` (every etcd member of both clusters) the same way
//!   under a held lock: the client keeps it, and no two members' defrag
//!   runs overlap (each unit's start and exit on the shared monotonic
//!   clock).
//! - Then `epoch-advance.yml` with a request written and signed on
//!   etcd-a1: with one signer the packaged unit refuses (exit 77) and the
//!   entity cluster's `/sys/epoch`, the coord cluster's `/sys/epoch` and
//!   `/sys/epochs` keep their mod revisions; with two it advances the entity
//!   cluster above every allocated epoch (coord 1, entity 2 → 3), and every
//!   arbiter serves the entity tier at epoch 3 and the coord tier at
//!   epoch 1, each on its own cluster. The request and signatures the
//!   playbook copied are root:root 0644 in a root:root 0755 directory.
//! - Then `force-release.yml`: a client holds demo/stuck (a second
//!   session of its identity is refused as a leak, exit 76); alice requests
//!   its release and alice and bob sign (lock-operators whose identities'
//!   grants cover demo/); the playbook applies it, and the key is free.
//!
//! Needs root, debootstrap, systemd-container, openssl, ssh and the
//! ansible venv from scripts/install-deps; a Debian mirror the first time
//! (the root is cached). Containers and the namespace are removed at the
//! end, on failure too.

use holdfast_fixtures::nspawn::{self, BootOptions, Container, Output};
use holdfast_tests::debs::{Clock, ROOT_PACKAGES, packages};
use holdfast_tests::ssh_keygen;
use std::path::{Path, PathBuf};
use std::process::Command;

/// ansible-core 2.19.14 and ansible-lint 26.10.1, pinned by scripts/install-deps.
const ANSIBLE_VENV: &str = "/opt/holdfast/ansible-2.19.14-lint-26.10.1/bin";

/// How long the lock holder keeps demo/rolling after the rolling restart:
/// more than the demo class's TTL (30 s, config/classes.d), so a session
/// that stopped renewing during the restart would have expired.
const HOLD_PAST_TTL: std::time::Duration = std::time::Duration::from_secs(35);

/// The entity cluster's three hosts, one per hall, each also running an
/// arbiter, a controller and a tailer: name, hall, address (on the test
/// namespace's loopback).
const HOSTS: &[(&str, &str, &str)] =
    &[("etcd-a1", "hall-a", "127.0.1.11"), ("etcd-b1", "hall-b", "127.0.1.12"), ("etcd-c1", "hall-c", "127.0.1.13")];

/// The coord cluster's five hosts, 2-2-1 across the same halls (the
/// placement ADR), running its etcd members only.
const COORD_HOSTS: &[(&str, &str, &str)] = &[
    ("coord-a1", "hall-a", "127.0.1.21"),
    ("coord-a2", "hall-a", "127.0.1.22"),
    ("coord-b1", "hall-b", "127.0.1.23"),
    ("coord-b2", "hall-b", "127.0.1.24"),
    ("coord-c1", "hall-c", "127.0.1.25"),
];

/// Every host: the entity cluster's, then the coord cluster's (the
/// containers' order).
fn all_hosts() -> impl Iterator<Item = &'static (&'static str, &'static str, &'static str)> {
    HOSTS.iter().chain(COORD_HOSTS)
}

/// Client URLs of a cluster's hosts.
fn client_urls(hosts: &[(&str, &str, &str)]) -> Vec<String> {
    hosts.iter().map(|(_, _, a)| format!("https://{a}:2379")).collect()
}

/// The holdfast units whose journal is printed when a step fails.
const UNITS: &[&str] = &["holdfast-controller.service", "holdfast-arbiter.socket", "holdfast-arbiter.service", "holdfast-tailer.service"];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The test's network namespace; deleted when dropped.
struct Netns {
    name: String,
}

impl Netns {
    fn new(name: &str) -> Self {
        let _ = Command::new("ip").args(["netns", "del", name]).output();
        run_ok(Command::new("ip").args(["netns", "add", name]), "ip netns add");
        let ns = Netns { name: name.to_string() };
        run_ok(Command::new("ip").args(["-n", name, "link", "set", "lo", "up"]), "ip link set lo up");
        ns
    }

    fn path(&self) -> PathBuf {
        PathBuf::from("/run/netns").join(&self.name)
    }

    /// `ip netns exec NAME PROGRAM` (the program's environment is the caller's).
    fn exec(&self, program: &str) -> Command {
        let mut c = Command::new("ip");
        c.args(["netns", "exec", &self.name, program]);
        c
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        let _ = Command::new("ip").args(["netns", "del", &self.name]).output();
    }
}

fn run_ok(cmd: &mut Command, what: &str) -> String {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    let text = format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "{what} failed ({}):\n{text}", out.status);
    text
}

/// The TLS material of the quick start, for every host: a lock.v1 CA
/// (the arbiters' server certificates, SAN their addresses; the operator's
/// SPIFFE client certificate) and an etcd CA (each member, SAN its address;
/// a client certificate per etcd user). A member's certificate also names
/// 127.0.0.1: the kernel picks it as the source address of every loopback
/// connection, and etcd checks a peer's certificate against the address
/// it connects from (on real hosts that is the member's own address).
fn make_tls(dir: &Path) {
    std::fs::create_dir_all(dir).expect("tls dir");
    let mut script = String::from(
        r#"ca()    { openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout "$1-key.pem" -out "$1.pem" -days 3650 -subj "/CN=$1"; }
issue() { ca=$1 name=$2 subj=$3; shift 3; printf '%s\n' "$@" > "$name.ext"
          openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes \
            -keyout "$name-key.pem" -out "$name.csr" -subj "$subj"
          openssl x509 -req -in "$name.csr" -CA "$ca.pem" -CAkey "$ca-key.pem" \
            -CAcreateserial -days 365 -out "$name.pem" -extfile "$name.ext"; }
ca holdfast-ca
ca etcd-ca
issue holdfast-ca operator /CN=operator subjectAltName=URI:spiffe://example.org/ops/operator \
      extendedKeyUsage=clientAuth basicConstraints=critical,CA:FALSE
for user in root holdfast-arbiter holdfast-controller holdfast-tailer holdfast-epoch holdfast-observer holdfast-force-release; do
  issue etcd-ca "etcd-$user" "/CN=$user" extendedKeyUsage=clientAuth basicConstraints=critical,CA:FALSE
done
"#,
    );
    for (host, _, addr) in all_hosts() {
        script.push_str(&format!(
            "issue holdfast-ca arbiter-{host} /CN=arbiter-{host} subjectAltName=IP:{addr},DNS:{host} \
               extendedKeyUsage=serverAuth basicConstraints=critical,CA:FALSE\n\
             issue etcd-ca etcd-{host} '/CN=holdfast etcd member' subjectAltName=IP:{addr},IP:127.0.0.1,DNS:{host} \
               extendedKeyUsage=serverAuth,clientAuth basicConstraints=critical,CA:FALSE\n"
        ));
    }
    run_ok(Command::new("bash").arg("-ec").arg(&script).current_dir(dir), "openssl: the TLS material");
}

/// The class set the controller publishes: the quick start's demo class,
/// a coord-tier class (its keys on the coord cluster) and the operator's
/// grant.
fn write_classes(dir: &Path) {
    std::fs::create_dir_all(dir.join("classes.d")).expect("classes.d");
    std::fs::create_dir_all(dir.join("grants.d")).expect("grants.d");
    std::fs::write(
        dir.join("classes.d/demo.toml"),
        "[class.demo]\nnamespace = \"demo\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\nrisk_owner = \"ops\"\n\
         waiver_expires = 2099-12-31\nttl = \"30s\"\ntier = \"entity\"\n",
    )
    .expect("demo.toml");
    std::fs::write(
        dir.join("classes.d/coorddemo.toml"),
        "[class.coorddemo]\nnamespace = \"coorddemo\"\npurpose = \"efficiency\"\nenforcement = \"advisory\"\nrisk_owner = \"ops\"\n\
         waiver_expires = 2099-12-31\nttl = \"30s\"\ntier = \"coord\"\n",
    )
    .expect("coorddemo.toml");
    std::fs::write(
        dir.join("grants.d/ops.toml"),
        "[grant.operator]\nidentity = \"spiffe://example.org/ops/operator\"\nlock = [\"demo/\", \"coorddemo/\"]\ninspect = [\"demo/\", \"coorddemo/\"]\n\n\
         [grant.lock-operators]\nidentity = \"spiffe://example.org/ops/\"\nforce_release = [\"demo/\"]\n",
    )
    .expect("ops.toml");
}

/// The inventory: the example's roles with a coord cluster of its own.
/// Group `holdfast_entity` (three hosts, one per hall: the entity
/// cluster's members, arbiters, controllers, tailers) and group
/// `holdfast_coord` (five hosts, 2-2-1: the coord cluster's members), both
/// in `holdfast_etcd`; the hosts name their cluster, so the placement plan
/// pins them. Arbiters grant on entity with `[coord]` on coord; the
/// controllers publish on coord; the tailers record entity and campaign on
/// coord; the entity cluster's epoch is allocated on coord.
fn inventory(work: &Path, debs: &Path, key: &Path) -> String {
    let w = work.display();
    let hosts = |list: &[(&str, &str, &str)]| {
        list.iter()
            .map(|(host, hall, addr)| {
                format!(
                    "        {host}:\n          ansible_host: {addr}\n          holdfast_address: {addr}\n          holdfast_hall: {hall}\n"
                )
            })
            .collect::<String>()
    };
    let (entity, coord) = (hosts(HOSTS), hosts(COORD_HOSTS));
    format!(
        r#"---
all:
  vars:
    ansible_user: root
    ansible_ssh_private_key_file: {key}
    ansible_ssh_common_args: -o StrictHostKeyChecking=no -o UserKnownHostsFile=/dev/null -o IdentitiesOnly=yes
    ansible_python_interpreter: /usr/bin/python3
    holdfast_packages_dir: {debs}
    holdfast_tls_src: {w}/tls
    holdfast_entity_urls: >-
      {{{{ groups['holdfast_entity'] | map('extract', hostvars, 'holdfast_address')
         | map('regex_replace', '^', 'https://') | map('regex_replace', '$', ':2379') | list }}}}
    holdfast_coord_urls: >-
      {{{{ groups['holdfast_coord'] | map('extract', hostvars, 'holdfast_address')
         | map('regex_replace', '^', 'https://') | map('regex_replace', '$', ':2379') | list }}}}
    holdfast_provision_token_seed: fleet-test
    holdfast_provision_volume: false
    holdfast_provision_plan_local_dir: {w}/plan
    holdfast_etcd_tls_ca_src: "{{{{ holdfast_tls_src }}}}/etcd-ca.pem"
    holdfast_etcd_tls_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-{{{{ inventory_hostname }}}}.pem"
    holdfast_etcd_tls_key_src: "{{{{ holdfast_tls_src }}}}/etcd-{{{{ inventory_hostname }}}}-key.pem"
    holdfast_etcd_root_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-root.pem"
    holdfast_etcd_root_key_src: "{{{{ holdfast_tls_src }}}}/etcd-root-key.pem"
    holdfast_etcd_epoch_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-epoch.pem"
    holdfast_etcd_epoch_key_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-epoch-key.pem"
    holdfast_etcd_defrag_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-root.pem"
    holdfast_etcd_defrag_key_src: "{{{{ holdfast_tls_src }}}}/etcd-root-key.pem"
    holdfast_arbiter_trust_domain: example.org
    holdfast_arbiter_listen: "{{{{ holdfast_address }}}}:7420"
    holdfast_arbiter_socket_listen: ["{{{{ holdfast_address }}}}:7420"]
    holdfast_arbiter_metrics_listen: "{{{{ holdfast_address }}}}:7421"
    holdfast_arbiter_etcd_endpoints: "{{{{ holdfast_entity_urls }}}}"
    holdfast_arbiter_coord_endpoints: "{{{{ holdfast_coord_urls }}}}"
    holdfast_arbiter_tls_cert_src: "{{{{ holdfast_tls_src }}}}/arbiter-{{{{ inventory_hostname }}}}.pem"
    holdfast_arbiter_tls_key_src: "{{{{ holdfast_tls_src }}}}/arbiter-{{{{ inventory_hostname }}}}-key.pem"
    holdfast_arbiter_tls_client_ca_src: "{{{{ holdfast_tls_src }}}}/holdfast-ca.pem"
    holdfast_arbiter_etcd_ca_src: "{{{{ holdfast_tls_src }}}}/etcd-ca.pem"
    holdfast_arbiter_etcd_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-arbiter.pem"
    holdfast_arbiter_etcd_key_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-arbiter-key.pem"
    holdfast_controller_metrics_listen: "{{{{ holdfast_address }}}}:7431"
    holdfast_controller_etcd_endpoints: "{{{{ holdfast_coord_urls }}}}"
    holdfast_controller_etcd_ca_src: "{{{{ holdfast_tls_src }}}}/etcd-ca.pem"
    holdfast_controller_etcd_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-controller.pem"
    holdfast_controller_etcd_key_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-controller-key.pem"
    holdfast_tailer_metrics_listen: "{{{{ holdfast_address }}}}:7432"
    holdfast_tailer_etcd_endpoints: "{{{{ holdfast_entity_urls }}}}"
    holdfast_tailer_coord_endpoints: "{{{{ holdfast_coord_urls }}}}"
    holdfast_tailer_etcd_ca_src: "{{{{ holdfast_tls_src }}}}/etcd-ca.pem"
    holdfast_tailer_etcd_cert_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-tailer.pem"
    holdfast_tailer_etcd_key_src: "{{{{ holdfast_tls_src }}}}/etcd-holdfast-tailer-key.pem"
    holdfast_classes_src_dir: {w}/classes
    holdfast_health_endpoint: "{{{{ holdfast_address }}}}:7420"
    holdfast_health_ca: /root/fleet-client/holdfast-ca.pem
    holdfast_health_cert: /root/fleet-client/operator.pem
    holdfast_health_key: /root/fleet-client/operator-key.pem
  children:
    holdfast_entity:
      vars:
        holdfast_provision_cluster: entity-1
        holdfast_provision_tier: entity
        holdfast_etcd_client_endpoints: "{{{{ holdfast_entity_urls }}}}"
        holdfast_etcd_coord_endpoints: "{{{{ holdfast_coord_urls }}}}"
      hosts:
{entity}    holdfast_coord:
      vars:
        holdfast_provision_cluster: coord
        holdfast_provision_tier: coord
        holdfast_etcd_client_endpoints: "{{{{ holdfast_coord_urls }}}}"
      hosts:
{coord}    holdfast_etcd:
      children: {{holdfast_entity: {{}}, holdfast_coord: {{}}}}
    holdfast_arbiter:
      children: {{holdfast_entity: {{}}}}
    holdfast_controller:
      children: {{holdfast_entity: {{}}}}
    holdfast_tailer:
      children: {{holdfast_entity: {{}}}}
"#,
        key = key.display(),
        debs = debs.display(),
    )
}

/// Runs a playbook from ansible/ against the inventory inside the test's
/// namespace; its output goes to `log` (and is returned).
fn playbook(ns: &Netns, work: &Path, playbook: &str, log: &Path) -> (bool, String) {
    playbook_with(ns, work, playbook, &[], log)
}

/// [`playbook`] with extra ansible-playbook arguments (`-e ...`).
fn playbook_with(ns: &Netns, work: &Path, playbook: &str, extra: &[String], log: &Path) -> (bool, String) {
    let venv = Path::new(ANSIBLE_VENV);
    assert!(
        venv.join("ansible-playbook").is_file(),
        "{ANSIBLE_VENV}/ansible-playbook is missing: run scripts/install-deps (it installs ansible-core into {ANSIBLE_VENV})"
    );
    let ansible = workspace().join("ansible");
    let out = std::fs::File::create(log).expect("playbook log");
    let mut cmd = ns.exec(&venv.join("ansible-playbook").to_string_lossy());
    cmd.args(["-i"])
        .arg(work.join("inventory.yml"))
        .arg(playbook)
        .args(extra)
        .current_dir(&ansible)
        .env("PATH", format!("{ANSIBLE_VENV}:{}", std::env::var("PATH").unwrap_or_default()))
        .env("ANSIBLE_CONFIG", ansible.join("ansible.cfg"))
        .env("ANSIBLE_HOME", work.join("ansible-home"))
        .env("ANSIBLE_LOCAL_TEMP", work.join("ansible-tmp"))
        .env("ANSIBLE_SSH_CONTROL_PATH_DIR", work.join("cp"))
        .env("ANSIBLE_PIPELINING", "true")
        .env("ANSIBLE_NOCOLOR", "1")
        .env("ANSIBLE_FORCE_COLOR", "0")
        .env("ANSIBLE_FORKS", "8")
        .stdin(std::process::Stdio::null())
        .stdout(out.try_clone().expect("log"))
        .stderr(out);
    let status = cmd.status().expect("running ansible-playbook");
    let text = std::fs::read_to_string(log).unwrap_or_default();
    (status.success(), text)
}

/// The PLAY RECAP: each host's counters (`ok=`, `changed=`, `failed=`, ...).
fn recap(text: &str) -> Vec<(String, std::collections::BTreeMap<String, u32>)> {
    let Some(at) = text.rfind("PLAY RECAP") else { return Vec::new() };
    text[at..]
        .lines()
        .skip(1)
        .filter_map(|l| {
            let (host, rest) = l.split_once(" : ")?;
            let counts = rest
                .split_whitespace()
                .filter_map(|w| w.split_once('=').and_then(|(k, v)| v.parse().ok().map(|v| (k.to_string(), v))))
                .collect();
            Some((host.trim().to_string(), counts))
        })
        .collect()
}

/// Each task that reported `changed:` on some host, with those lines.
fn changed_tasks(text: &str) -> String {
    let mut task = "";
    let mut out = Vec::new();
    for l in text.lines() {
        if l.starts_with("TASK [") || l.starts_with("RUNNING HANDLER [") {
            task = l;
        } else if l.starts_with("changed:") {
            out.push(format!("{task}\n  {l}"));
        }
    }
    out.join("\n")
}

/// The recap's tail of the output (from PLAY RECAP on), or the last lines.
fn tail(text: &str, n: usize) -> String {
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// The journal of the holdfast units and the failed units of one host.
fn diagnostics(c: &Container, member: &str) -> String {
    let mut text = format!("=== {}\n", c.name);
    if let Ok(o) = c.exec(&["systemctl", "--failed", "--no-legend", "--no-pager"]) {
        text.push_str(&format!("--- failed units\n{}", o.stdout));
    }
    let unit = format!("holdfast-etcd@{member}.service");
    let mut args = vec!["journalctl", "--no-pager", "-n", "80", "-o", "short-monotonic", "-u", &unit];
    for u in UNITS {
        args.push("-u");
        args.push(u);
    }
    if let Ok(o) = c.exec(&args) {
        text.push_str(&format!("--- journal of the holdfast units (last 80 lines)\n{}{}", o.stdout, o.stderr));
    }
    text
}

fn all_diagnostics(cs: &[Container]) -> String {
    cs.iter().zip(all_hosts()).map(|(c, (host, _, _))| diagnostics(c, host)).collect::<Vec<_>>().join("\n")
}

/// Runs `playbook` while a client on the first host holds `key` and
/// renews it: the client keeps it throughout (`lock exec` exits 79 if the
/// lock is lost), and for [`HOLD_PAST_TTL`] after the playbook, so that a
/// session that stopped renewing at any point has expired and the client
/// has been fenced by then.
fn held_through(cs: &[Container], ns: &Netns, w: &Path, playbook_name: &str, key: &str) {
    let tag = key.replace('/', "-");
    let endpoints = HOSTS.iter().map(|(_, _, a)| format!("{a}:7420")).collect::<Vec<_>>().join(",");
    let script = format!(
        "{}; export HOLDFAST_ENDPOINT={endpoints}; rm -f /root/{tag}-held /root/{tag}-done
         holdfastctl lock exec {key} --wait 30s -- sh -c \
           'echo held; touch /root/{tag}-held
            while [ ! -e /root/{tag}-done ]; do sleep 0.2; done; echo released'",
        client_env(HOSTS[0].2)
    );
    let holder = cs[0].spawn(&["bash", "-c", &script]).expect("lock holder");
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !cs[0].host_path(&format!("/root/{tag}-held")).exists() {
        assert!(std::time::Instant::now() < deadline, "the client did not get {key} within 60 s\n{}", all_diagnostics(cs));
        std::thread::sleep(std::time::Duration::from_millis(200));
    }
    let log = w.join(format!("{tag}.log"));
    let (ok, ran) = playbook(ns, w, playbook_name, &log);
    if ok {
        std::thread::sleep(HOLD_PAST_TTL);
    }
    cs[0].write(&format!("/root/{tag}-done"), "").expect("done marker");
    let out = holder.wait_with_output().expect("lock holder");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    if !ok {
        panic!("{playbook_name} failed (log {}):\n{}\n{}", log.display(), tail(&ran, 120), all_diagnostics(cs));
    }
    eprintln!("{}", tail(&ran, 5));
    eprintln!("   lock holder: {}\n{stdout}{stderr}", out.status);
    assert!(
        out.status.success() && stdout.contains("released"),
        "the lock holder lost {key} during {playbook_name} ({}):\n{stdout}{stderr}\n{}",
        out.status,
        all_diagnostics(cs)
    );
}

/// The last run of host `i`'s defrag unit: its start and exit on the
/// monotonic clock, in µs (None if it never ran).
fn defrag_run(cs: &[Container], i: usize, member: &str) -> Option<(u64, u64)> {
    let o = must(
        cs,
        i,
        "the defrag unit's times",
        &format!(
            "systemctl show holdfast-etcd-defrag@{member}.service -p ExecMainStartTimestampMonotonic -p ExecMainExitTimestampMonotonic"
        ),
    );
    let field = |name: &str| {
        o.stdout.lines().find_map(|l| l.strip_prefix(&format!("{name}="))).and_then(|v| v.trim().parse::<u64>().ok()).unwrap_or(0)
    };
    let (start, exit) = (field("ExecMainStartTimestampMonotonic"), field("ExecMainExitTimestampMonotonic"));
    (start > 0).then_some((start, exit))
}

fn must(cs: &[Container], i: usize, what: &str, script: &str) -> Output {
    let o = cs[i].exec(&["bash", "-ec", script]).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    if !o.ok() {
        panic!("{what} on {} failed:\n--- script\n{script}\n{o}\n{}", cs[i].name, all_diagnostics(cs));
    }
    o
}

/// The operator's lock.v1 client settings inside a host, against `addr`.
fn client_env(addr: &str) -> String {
    format!(
        "export HOLDFAST_ENDPOINT={addr}:7420 HOLDFAST_CA=/root/fleet-client/holdfast-ca.pem \
         HOLDFAST_CERT=/root/fleet-client/operator.pem HOLDFAST_KEY=/root/fleet-client/operator-key.pem"
    )
}

#[test]
fn site_yml_converges_three_halls_and_is_idempotent() {
    let mut clock = Clock::new("fleet test");
    let mut work = tempfile::Builder::new().prefix("hf-fleet-").tempdir_in("/var/tmp").expect("work dir");
    if std::env::var_os("HOLDFAST_KEEP_CONTAINER").is_some() {
        work.disable_cleanup(true);
        eprintln!("   work directory kept: {}", work.path().display());
    }
    let w = work.path().to_path_buf();
    eprintln!("   work directory {} (playbook logs: site-1.log, site-2.log)", w.display());
    let (debs, _) = clock.step("packages (packaging/build --profile dev)", || packages(&w));
    let (base, made) = clock.step("cached Debian 12 root", || nspawn::cached_root(ROOT_PACKAGES, |_| Ok(())).expect("debootstrap root"));
    if !made.is_zero() {
        eprintln!("   debootstrap took {made:.1?} (cached for next runs at {})", base.display());
    }
    clock.step("TLS material, class set, ssh key", || {
        make_tls(&w.join("tls"));
        write_classes(&w.join("classes"));
    });
    let (key, public) = ssh_keygen(&w.join("ssh"), "id_fleet");
    std::fs::write(w.join("inventory.yml"), inventory(&w, &debs, &key)).expect("inventory");

    // Declared before the containers: dropped after them.
    let ns = Netns::new(&format!("hf-fleet-{}", std::process::id()));
    let hosts_file = all_hosts()
        .fold(String::from("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n"), |acc, (h, _, a)| {
            acc + &format!("{a}\t{h}\n")
        });
    let cs: Vec<Container> = clock.step("boot eight containers into one network namespace", || {
        std::thread::scope(|s| {
            let handles: Vec<_> = all_hosts()
                .map(|(host, _, addr)| {
                    let options = BootOptions {
                        network_namespace: Some(ns.path()),
                        files: vec![
                            ("/etc/hosts".to_string(), hosts_file.clone()),
                            (
                                "/etc/ssh/sshd_config.d/fleet.conf".to_string(),
                                format!("ListenAddress {addr}\nPermitRootLogin prohibit-password\n"),
                            ),
                            ("/root/.ssh/authorized_keys".to_string(), format!("{public}\n")),
                        ],
                    };
                    let (base, w) = (&base, &w);
                    s.spawn(move || Container::boot_with(base, w, host, &options))
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("boot thread").expect("boot")).collect()
        })
    });
    for c in &cs {
        eprintln!("   {}: copy {:.1?}, boot {:.1?}", c.name, c.timings.copy, c.timings.boot);
    }

    let (ok, first) = clock.step("site.yml, first run", || playbook(&ns, &w, "site.yml", &w.join("site-1.log")));
    if !ok {
        panic!("site.yml failed (log {}):\n{}\n{}", w.join("site-1.log").display(), tail(&first, 120), all_diagnostics(&cs));
    }
    eprintln!("{}", tail(&first, 6));

    clock.step("every unit active, two etcd clusters (entity 3 members, coord 5)", || {
        let coord = client_urls(COORD_HOSTS);
        for (i, (host, _, _)) in HOSTS.iter().enumerate() {
            must(
                &cs,
                i,
                "units active",
                &format!(
                    "systemctl is-active holdfast-etcd@{host}.service holdfast-controller.service holdfast-arbiter.socket \
                     holdfast-arbiter.service holdfast-tailer.service"
                ),
            );
            // The arbiter and the tailer have a [coord] table naming the
            // coord cluster; the controller publishes there ([etcd]).
            for (file, table) in [("arbiter", "coord"), ("tailer", "coord"), ("controller", "etcd")] {
                let text = must(&cs, i, "rendered config", &format!("cat /etc/holdfast/{file}.toml")).stdout;
                assert_eq!(
                    table_endpoints(&text, table),
                    Some(coord.clone()),
                    "{host}: {file}.toml's [{table}] should list the coord cluster's members:\n{text}"
                );
            }
        }
        for (i, (host, _, _)) in COORD_HOSTS.iter().enumerate() {
            let state =
                must(&cs, HOSTS.len() + i, "coord member active", &format!("systemctl is-active holdfast-etcd@{host}.service")).stdout;
            assert_eq!(state.trim(), "active", "{host}: holdfast-etcd@{host}");
        }
        // The plan's ETCD_PEER_CERT_ALLOWED_CN: a member's peer port answers
        // a member certificate and refuses a tool's from the same CA.
        for (host, _, addr) in [HOSTS[0], COORD_HOSTS[0]] {
            let t = w.join("tls");
            let peer = |cert: &str| {
                ns.exec("curl")
                    .args(["-sS", "--http1.1", "-o", "/dev/null", "-w", "%{http_code}", "--max-time", "10", "--cacert"])
                    .arg(t.join("etcd-ca.pem"))
                    .arg("--cert")
                    .arg(t.join(format!("{cert}.pem")))
                    .arg("--key")
                    .arg(t.join(format!("{cert}-key.pem")))
                    .arg(format!("https://{addr}:2380/members"))
                    .output()
                    .expect("curl")
            };
            let member = peer(&format!("etcd-{host}"));
            assert_eq!(String::from_utf8_lossy(&member.stdout), "200", "{host}'s peer port should answer a member certificate: {member:?}");
            let tool = peer("etcd-holdfast-observer");
            assert!(
                !tool.status.success() && String::from_utf8_lossy(&tool.stderr).contains("alert"),
                "{host}'s peer port should refuse the observer's certificate: {tool:?}"
            );
        }
        for (cluster, hosts) in [("entity-1", HOSTS), ("coord", COORD_HOSTS)] {
            let listed = run_ok(etcdctl_root(&ns, &w, hosts).args(["member", "list"]), "etcdctl member list");
            eprintln!("{cluster}:\n{listed}");
            let started: Vec<&str> = listed.lines().filter(|l| l.contains(", started, ")).collect();
            assert_eq!(started.len(), hosts.len(), "{cluster}: etcdctl member list should show {} started members:\n{listed}", hosts.len());
            for (host, _, addr) in hosts {
                assert!(
                    started.iter().any(|l| l.contains(&format!(", {host}, https://{addr}:2380"))),
                    "{cluster}: {host} at {addr} is not a member:\n{listed}"
                );
            }
        }
    });

    // The files the roles wrote, as the packages lay them out: one user
    // per daemon, each key readable by its own daemon's group alone.
    clock.step("the files under /etc/holdfast: one user per daemon", || {
        for (i, (host, _, _)) in HOSTS.iter().enumerate() {
            let (member_env, member_cert, member_key) =
                (format!("etcd/{host}.env"), format!("tls/{host}.pem"), format!("tls/{host}-key.pem"));
            let mut want: Vec<(&str, &str)> = ETC_LAYOUT.to_vec();
            want.extend([
                (member_env.as_str(), "640 root:root"),
                (member_cert.as_str(), "644 root:root"),
                (member_key.as_str(), "640 root:holdfast-etcd"),
            ]);
            assert_layout(&cs, i, "/etc/holdfast", &want);
        }
    });

    clock.step("a lock through each host's arbiter", || {
        for (i, (_, _, addr)) in HOSTS.iter().enumerate() {
            for f in ["holdfast-ca.pem", "operator.pem", "operator-key.pem"] {
                cs[i].copy_in(&w.join("tls").join(f), &format!("/root/fleet-client/{f}")).expect("client credentials");
            }
            let env = client_env(addr);
            let health = must(&cs, i, "holdfastctl health", &format!("{env}; holdfastctl health --wait 60s"));
            assert_eq!(health.stdout.trim(), "SERVING", "holdfastctl health on {}", cs[i].name);
            // demo is entity-tier; coorddemo's keys are on the coord cluster.
            for namespace in ["demo", "coorddemo"] {
                let key = format!("{namespace}/fleet-{i}");
                let got = must(
                    &cs,
                    i,
                    "holdfastctl lock exec",
                    &format!("{env}; holdfastctl lock exec {key} --wait 30s -- sh -c 'echo granted {key}'"),
                );
                assert!(got.stdout.contains(&format!("granted {key}")), "lock exec through {addr}:\n{got}");
            }
        }
    });

    let (ok, second) = clock.step("site.yml, second run", || playbook(&ns, &w, "site.yml", &w.join("site-2.log")));
    if !ok {
        panic!("site.yml's second run failed (log {}):\n{}\n{}", w.join("site-2.log").display(), tail(&second, 120), all_diagnostics(&cs));
    }
    let counts = recap(&second);
    let at = second.rfind("PLAY RECAP").unwrap_or(0);
    let printed = &second[at..];
    eprintln!("{printed}");
    assert_eq!(counts.len(), all_hosts().count(), "the second run's PLAY RECAP should list every host:\n{printed}");
    for (host, c) in &counts {
        let get = |k: &str| c.get(k).copied().unwrap_or(u32::MAX);
        if get("changed") != 0 || get("failed") != 0 || get("unreachable") != 0 {
            panic!("the second site.yml run changed {host} (want changed=0):\n{printed}\nchanged tasks:\n{}", changed_tasks(&second));
        }
    }

    // The rolling restart (every etcd member, then every arbiter, one host
    // at a time) while a client holds a lock and renews it: the client
    // keeps it throughout (`lock exec` exits 79 if the lock is lost). The
    // restart takes less than the demo class's TTL (30 s), so the holder
    // keeps the lock for longer than a TTL after it: a session that stopped
    // renewing at any point of the restart has expired by then, and the
    // client has been fenced.
    clock.step("rolling-restart.yml while a client holds a lock", || {
        held_through(&cs, &ns, &w, "rolling-restart.yml", "demo/rolling");
    });

    // defrag.yml (every etcd member of both clusters, one at a time) while
    // a client holds a lock: the client keeps it, and no two members'
    // defrag runs overlap (their units' start and exit times, on the one
    // kernel's monotonic clock every container shares).
    clock.step("defrag.yml while a client holds a lock, one member at a time", || {
        let before: Vec<Option<(u64, u64)>> = all_hosts().enumerate().map(|(i, (name, ..))| defrag_run(&cs, i, name)).collect();
        held_through(&cs, &ns, &w, "defrag.yml", "demo/defrag");
        let mut runs = Vec::new();
        for (i, (name, ..)) in all_hosts().enumerate() {
            let run = defrag_run(&cs, i, name).unwrap_or_else(|| panic!("defrag.yml did not run holdfast-etcd-defrag@{name}"));
            assert_ne!(Some(run), before[i], "defrag.yml did not run holdfast-etcd-defrag@{name} again");
            runs.push((run, *name));
        }
        runs.sort();
        for pair in runs.windows(2) {
            let (((_, end), a), ((start, _), b)) = (pair[0], pair[1]);
            assert!(end <= start, "the defrags of {a} and {b} overlapped: {runs:?}");
        }
        eprintln!("   defrag runs (monotonic µs): {runs:?}");
    });

    // The two-person epoch advance as the DR runbook carries it out on a
    // fleet: the request written and signed on etcd-a1, then
    // `epoch-advance.yml`, which copies it with its signatures to the host
    // and starts the packaged holdfast-epoch-advance@ unit. One signer
    // (alice's signature given twice) is refused by the unit and changes
    // nothing in etcd; two advance the epoch, and every arbiter serves it.
    clock.step("epoch-advance.yml refuses one signer and advances with two", || {
        for f in ["etcd-ca.pem", "etcd-holdfast-epoch.pem", "etcd-holdfast-epoch-key.pem"] {
            cs[0].copy_in(&w.join("tls").join(f), &format!("/root/dr/{f}")).expect("the holdfast-epoch credentials");
        }
        let setup = must(&cs, 0, "approvers, credentials and a request", &epoch_advance_setup());
        let request = setup.stdout.lines().filter_map(|l| l.strip_prefix("request ")).next_back().map(str::to_string);
        let request = request.unwrap_or_else(|| panic!("no request was written:\n{setup}"));
        let sig = |who: &str| cs[0].host_path(&format!("/root/dr/requests/{request}.{who}.sig")).display().to_string();
        let (toml, before) = (cs[0].host_path(&format!("/root/dr/requests/{request}")).display().to_string(), epoch_record(&ns, &w));
        must(&cs, 0, "alice signs", &format!("holdfastctl approve /root/dr/requests/{request} --ssh-key /root/dr/alice"));
        let args = |sigs: [String; 2]| {
            vec![
                "-e".to_string(),
                "epoch_advance_host=etcd-a1".to_string(),
                "-e".to_string(),
                format!("epoch_advance_request={toml}"),
                "-e".to_string(),
                format!("{{\"epoch_advance_signatures\": [\"{}\", \"{}\"]}}", sigs[0], sigs[1]),
            ]
        };
        let (ok, refused) = playbook_with(&ns, &w, "epoch-advance.yml", &args([sig("alice"), sig("alice")]), &w.join("epoch-1.log"));
        assert!(!ok, "epoch-advance.yml advanced with one signer (log {}):\n{}", w.join("epoch-1.log").display(), tail(&refused, 60));
        assert!(
            refused.contains("only alice signed") && refused.contains("exit 77"),
            "the playbook reports the unit's refusal and why (log {}):\n{}",
            w.join("epoch-1.log").display(),
            tail(&refused, 60)
        );
        assert_eq!(epoch_record(&ns, &w), before, "a refused advance changed /sys/epoch or /sys/epochs");
        must(&cs, 0, "bob signs", &format!("holdfastctl approve /root/dr/requests/{request} --ssh-key /root/dr/bob"));
        let (ok, advanced) = playbook_with(&ns, &w, "epoch-advance.yml", &args([sig("alice"), sig("bob")]), &w.join("epoch-2.log"));
        if !ok {
            panic!(
                "epoch-advance.yml failed with two signers (log {}):\n{}\n{}",
                w.join("epoch-2.log").display(),
                tail(&advanced, 80),
                all_diagnostics(&cs)
            );
        }
        assert_ne!(epoch_record(&ns, &w), before, "the advance wrote neither /sys/epoch nor /sys/epochs");
        // The playbook's copies: written by root, public.
        let (sig_a, sig_b) = (format!("{request}.alice.sig"), format!("{request}.bob.sig"));
        assert_layout(
            &cs,
            0,
            "/var/lib/holdfast/requests",
            &[(".", "755 root:root"), (request.as_str(), "644 root:root"), (sig_a.as_str(), "644 root:root"), (sig_b.as_str(), "644 root:root")],
        );
        // The coord cluster's epoch was initialised first (1), the entity
        // cluster's allocated there (2); the advance goes above both (3).
        // Each tier on its own cluster, both serving (up to 30 s after the
        // advance, while the arbiters watch the new epoch arrive).
        let want = ((3, true), vec![("entity".to_string(), 3, true), ("coord".to_string(), 1, true)]);
        for (i, (_, _, addr)) in HOSTS.iter().enumerate() {
            let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
            loop {
                let status = must(&cs, i, "epoch status", &epoch_status(addr)).stdout;
                if tiers_served(&status) == want {
                    break;
                }
                assert!(
                    std::time::Instant::now() < deadline,
                    "the arbiter at {addr} should serve the entity tier at epoch 3 and the coord tier at epoch 1, each on its own cluster: {status}"
                );
                std::thread::sleep(std::time::Duration::from_millis(500));
            }
        }
        must(
            &cs,
            1,
            "a lock after the advance",
            &format!("{}; holdfastctl lock exec demo/after-advance --wait 30s -- true", client_env(HOSTS[1].2)),
        );
    });

    // The two-person force-release as the runbook carries it out on a
    // fleet: a client holds demo/stuck and does not let go; on etcd-a1 the
    // request is written by alice and signed by alice and bob (both
    // lock-operators whose identities' grants may force-release demo/),
    // then `force-release.yml` copies it with its signatures to the host and
    // applies it. Afterwards the same identity takes demo/stuck from another
    // session at once: the leaked hold is gone.
    clock.step("force-release.yml releases a stuck hold with two signatures", || {
        for f in ["etcd-holdfast-force-release.pem", "etcd-holdfast-force-release-key.pem"] {
            cs[0].copy_in(&w.join("tls").join(f), &format!("/root/dr/{f}")).expect("the holdfast-force-release credentials");
        }
        let script = format!(
            "{}; rm -f /root/stuck-held; holdfastctl lock exec demo/stuck --wait 30s -- sh -c 'touch /root/stuck-held; sleep 600'",
            client_env(HOSTS[1].2)
        );
        let mut holder = cs[1].spawn(&["bash", "-c", &script]).expect("lock holder");
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while !cs[1].host_path("/root/stuck-held").exists() {
            assert!(std::time::Instant::now() < deadline, "the client did not get demo/stuck within 60 s\n{}", all_diagnostics(&cs));
            std::thread::sleep(std::time::Duration::from_millis(200));
        }
        let taken = format!("{}; holdfastctl lock exec demo/stuck --wait 0 -- true", client_env(HOSTS[2].2));
        let leaked = cs[2].sh(&taken).expect("lock exec");
        assert_eq!(leaked.code, 76, "a second session of the holder's identity is refused while the hold lives:\n{leaked}");
        let setup = must(&cs, 0, "lock-operators, credentials and a request", &force_release_setup());
        let request = setup.stdout.lines().filter_map(|l| l.strip_prefix("request ")).next_back().map(str::to_string);
        let request = request.unwrap_or_else(|| panic!("no request was written:\n{setup}"));
        for who in ["alice", "bob"] {
            must(&cs, 0, &format!("{who} signs"), &format!("holdfastctl approve /root/fr/requests/{request} --ssh-key /root/dr/{who}"));
        }
        let path = |f: &str| cs[0].host_path(&format!("/root/fr/requests/{f}")).display().to_string();
        let args = vec![
            "-e".to_string(),
            "force_release_host=etcd-a1".to_string(),
            "-e".to_string(),
            format!("force_release_request={}", path(&request)),
            "-e".to_string(),
            format!(
                "{{\"force_release_signatures\": [\"{}\", \"{}\"]}}",
                path(&format!("{request}.alice.sig")),
                path(&format!("{request}.bob.sig"))
            ),
        ];
        let (ok, released) = playbook_with(&ns, &w, "force-release.yml", &args, &w.join("force-release.log"));
        let _ = holder.kill();
        let _ = holder.wait();
        if !ok {
            panic!(
                "force-release.yml failed (log {}):\n{}\n{}",
                w.join("force-release.log").display(),
                tail(&released, 80),
                all_diagnostics(&cs)
            );
        }
        assert!(released.contains("exit 0: released"), "the playbook reports the release:\n{}", tail(&released, 40));
        let after = cs[2].sh(&taken).expect("lock exec");
        assert_eq!(after.code, 0, "demo/stuck is free after the force-release:\n{after}");
    });
    clock.summary();
    drop(cs);
    drop(ns);
}

/// On etcd-a1, after the epoch advance's setup: alice and bob as
/// lock-operators too, each with an identity (spiffe://example.org/ops/NAME,
/// whose grant lets them force-release demo/), the holdfast-force-release
/// etcd user's credentials (root:root 0600) where force-release.yml looks
/// for them, and alice's request to release demo/stuck in
/// /root/fr/requests/. Prints `request NAME.toml`.
fn force_release_setup() -> String {
    let (etcd, coord) = (client_urls(HOSTS).join(","), client_urls(COORD_HOSTS).join(","));
    format!(
        r#"set -e
for who in alice bob; do
  printf '[approver.%s]\nroles = ["dr-operator", "lock-operator"]\nkeys = ["%s"]\nidentity = "spiffe://example.org/ops/%s"\n' $who "$(cat /root/dr/$who.pub)" $who
done > /root/dr/approvers.toml
install -m 0644 /root/dr/approvers.toml /etc/holdfast/approvers.toml
install -m 0644 /root/dr/etcd-holdfast-force-release.pem /etc/holdfast/tls/etcd-force-release.pem
install -m 0600 /root/dr/etcd-holdfast-force-release-key.pem /etc/holdfast/tls/etcd-force-release-key.pem
holdfastctl force-release request demo/stuck --requester alice --reason 'fleet test: a stuck holder' \
  --etcd-endpoint {etcd} --coord-endpoint {coord} --etcd-ca /etc/holdfast/tls/etcd-ca.pem \
  --etcd-cert /etc/holdfast/tls/etcd-force-release.pem --etcd-key /etc/holdfast/tls/etcd-force-release-key.pem \
  --approvers /etc/holdfast/approvers.toml --state-dir /root/fr
echo "request $(basename "$(ls -t /root/fr/requests/force-release-*.toml | head -1)")""#
    )
}

/// What the roles leave under /etc/holdfast on every entity host (the
/// member's env file and TLS files added per host): `MODE OWNER:GROUP` as
/// `stat -c '%a %U:%G'` prints it.
const ETC_LAYOUT: &[(&str, &str)] = &[
    (".", "711 root:root"),
    ("tls", "711 root:root"),
    ("etcd", "750 root:root"),
    ("classes.d", "750 root:holdfast-controller"),
    ("grants.d", "750 root:holdfast-controller"),
    ("classes.d/demo.toml", "640 root:holdfast-controller"),
    ("grants.d/ops.toml", "640 root:holdfast-controller"),
    ("arbiter.toml", "640 root:holdfast-arbiter"),
    ("controller.toml", "640 root:holdfast-controller"),
    ("tailer.toml", "640 root:holdfast-audit"),
    ("tls/etcd-ca.pem", "644 root:root"),
    ("tls/clients-ca.pem", "644 root:root"),
    ("tls/arbiter.pem", "644 root:root"),
    ("tls/arbiter-key.pem", "640 root:holdfast-arbiter"),
    ("tls/etcd-arbiter.pem", "644 root:root"),
    ("tls/etcd-arbiter-key.pem", "640 root:holdfast-arbiter"),
    ("tls/etcd-controller.pem", "644 root:root"),
    ("tls/etcd-controller-key.pem", "640 root:holdfast-controller"),
    ("tls/etcd-tailer.pem", "644 root:root"),
    ("tls/etcd-tailer-key.pem", "600 root:root"),
    ("tls/etcd-defrag.pem", "644 root:root"),
    ("tls/etcd-defrag-key.pem", "600 root:root"),
];

/// Asserts each `(path under dir, "MODE OWNER:GROUP")` on host `i`.
fn assert_layout(cs: &[Container], i: usize, dir: &str, want: &[(&str, &str)]) {
    let paths = want.iter().map(|(p, _)| format!("'{dir}/{p}'")).collect::<Vec<_>>().join(" ");
    let got = must(cs, i, "stat", &format!("stat -c '%a %U:%G' {paths}")).stdout;
    let got: Vec<&str> = got.lines().collect();
    let wrong: Vec<String> = want
        .iter()
        .zip(got.iter().chain(std::iter::repeat(&"?")))
        .filter(|((_, w), g)| w != *g)
        .map(|((p, w), g)| format!("{dir}/{p}: {g}, want {w}"))
        .collect();
    assert!(wrong.is_empty(), "{}: files not as the packages lay them out:\n{}", cs[i].name, wrong.join("\n"));
}

/// On etcd-a1: two dr-operators' keys and approvers.toml (root:root 0644),
/// the unit's credentials (/etc/holdfast/epoch-advance.env, root:root 0600:
/// the holdfast-epoch etcd user, and every arbiter with the operator's
/// certificate; the keys it names root:holdfast-epoch 0640), and a request
/// to advance the (unsealed) cluster, in /root/dr/requests/. Prints
/// `request NAME.toml`.
fn epoch_advance_setup() -> String {
    let (etcd, coord) = (client_urls(HOSTS).join(","), client_urls(COORD_HOSTS).join(","));
    let arbiters = HOSTS.iter().map(|(_, _, a)| format!("{a}:7420")).collect::<Vec<_>>().join(",");
    format!(
        r#"cd /root/dr
for who in alice bob; do ssh-keygen -q -t ed25519 -N '' -C $who -f /root/dr/$who; done
for who in alice bob; do
  printf '[approver.%s]\nroles = ["dr-operator"]\nkeys = ["%s"]\n' $who "$(cat /root/dr/$who.pub)"
done > /root/dr/approvers.toml
install -d -m 0711 /etc/holdfast/dr
install -m 0644 /root/dr/approvers.toml /etc/holdfast/approvers.toml
install -m 0644 etcd-ca.pem /etc/holdfast/dr/etcd-ca.pem
install -m 0644 etcd-holdfast-epoch.pem /etc/holdfast/dr/etcd-epoch.pem
install -m 0640 -g holdfast-epoch etcd-holdfast-epoch-key.pem /etc/holdfast/dr/etcd-epoch-key.pem
install -m 0644 /root/fleet-client/holdfast-ca.pem /etc/holdfast/dr/holdfast-ca.pem
install -m 0644 /root/fleet-client/operator.pem /etc/holdfast/dr/operator.pem
install -m 0640 -g holdfast-epoch /root/fleet-client/operator-key.pem /etc/holdfast/dr/operator-key.pem
install -m 0600 /dev/null /etc/holdfast/epoch-advance.env
cat > /etc/holdfast/epoch-advance.env <<'ENV'
HOLDFAST_ETCD_ENDPOINT={etcd}
HOLDFAST_ETCD_CA=/etc/holdfast/dr/etcd-ca.pem
HOLDFAST_ETCD_CERT=/etc/holdfast/dr/etcd-epoch.pem
HOLDFAST_ETCD_KEY=/etc/holdfast/dr/etcd-epoch-key.pem
HOLDFAST_COORD_ENDPOINT={coord}
HOLDFAST_ENDPOINT={arbiters}
HOLDFAST_CA=/etc/holdfast/dr/holdfast-ca.pem
HOLDFAST_CERT=/etc/holdfast/dr/operator.pem
HOLDFAST_KEY=/etc/holdfast/dr/operator-key.pem
ENV
set -a; . /etc/holdfast/epoch-advance.env; set +a
holdfastctl epoch advance-request --unsealed --requester alice --reason 'fleet test' \
  --approvers /etc/holdfast/approvers.toml --state-dir /root/dr
echo "request $(basename "$(ls -t /root/dr/requests/epoch-advance-*.toml | head -1)")""#
    )
}

/// The `endpoints` of `[table]` in a rendered TOML file (one line, a JSON
/// list of strings as the roles render it).
fn table_endpoints(text: &str, table: &str) -> Option<Vec<String>> {
    let header = format!("[{table}]");
    let body = text.lines().skip_while(|l| l.trim() != header).skip(1).take_while(|l| !l.starts_with('['));
    let line = body.into_iter().find_map(|l| l.strip_prefix("endpoints = "))?;
    serde_json::from_str(line).ok()
}

/// The entity cluster's `/sys/epoch`, the coord cluster's `/sys/epoch` and
/// `/sys/epochs` (the allocator), with their mod revisions, read as etcd's
/// root from the test's namespace.
fn epoch_record(ns: &Netns, work: &Path) -> String {
    let mut text = String::new();
    for (hosts, key) in [(HOSTS, "/sys/epoch"), (COORD_HOSTS, "/sys/epoch"), (COORD_HOSTS, "/sys/epochs")] {
        let got = run_ok(etcdctl_root(ns, work, hosts).args(["get", key, "-w", "fields"]), "etcdctl get");
        text.extend(
            got.lines()
                .filter(|l| l.starts_with("\"Key\"") || l.starts_with("\"Value\"") || l.starts_with("\"ModRevision\""))
                .map(|l| format!("{l}\n")),
        );
    }
    text
}

/// `etcdctl` against every member of one cluster (its hosts) as etcd's
/// root, from the test's namespace.
fn etcdctl_root(ns: &Netns, work: &Path, hosts: &[(&str, &str, &str)]) -> Command {
    let endpoints = client_urls(hosts).join(",");
    let t = work.join("tls");
    let mut cmd = ns.exec("etcdctl");
    cmd.arg(format!("--endpoints={endpoints}"))
        .arg(format!("--cacert={}", t.join("etcd-ca.pem").display()))
        .arg(format!("--cert={}", t.join("etcd-root.pem").display()))
        .arg(format!("--key={}", t.join("etcd-root-key.pem").display()))
        .env("ETCDCTL_API", "3");
    cmd
}

/// `(epoch, serving)`, and per cluster `(tiers, epoch, serving)`.
type Served = ((u64, bool), Vec<(String, u64, bool)>);

/// From `holdfastctl epoch status --json`: the entity tier's `(epoch,
/// serving)` and each cluster's `(tiers, epoch, serving)`.
fn tiers_served(status: &str) -> Served {
    let v: serde_json::Value = serde_json::from_str(status.trim()).unwrap_or_else(|e| panic!("epoch status --json: {e}: {status}"));
    let served = |c: &serde_json::Value| (c["epoch"].as_u64().unwrap_or(0), c["serving"] == true);
    let clusters = v["clusters"].as_array().into_iter().flatten().map(|c| {
        let (epoch, serving) = served(c);
        (c["tiers"].as_str().unwrap_or("").to_string(), epoch, serving)
    });
    (served(&v), clusters.collect())
}

/// The arbiter at `addr`'s epoch status (`holdfastctl epoch status --json`).
fn epoch_status(addr: &str) -> String {
    format!("{}; holdfastctl epoch status --json", client_env(addr))
}
