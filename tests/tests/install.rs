//! The install test: the signed `.deb` packages on a fresh Debian 12 host
//! booted with `systemd-nspawn -b`, driven with the real `systemctl`
//! (docs/install-test.md).
//!
//! One test, one container, steps in order (each prints its time): the
//! operator quick start followed literally (the book's, docs/install.md)
//! up to a granted lock; the
//! watchdog killing a hung (SIGSTOPped) arbiter; a reload with a bad
//! config keeping the old one; a restart of the socket-activated arbiter
//! while a client loops, with no call refused; an upgrade keeping an
//! edited conffile; a purge.
//!
//! It does not depend on the suite's etcd target: the container runs its
//! own member through `holdfast-etcd@.service`, on the etcd holdfast-etcd
//! ships (the root has no other etcd; a step checks the member's version is
//! the one packaging/etcd/go.mod pins).
//! Needs root, debootstrap, systemd-container and a Debian mirror in the
//! host's apt sources the first time (the root is cached); packages come
//! from `packaging/build` with a throwaway key, or HOLDFAST_PACKAGES_DIR.

use holdfast_fixtures::nspawn::{self, Container, Output};
use holdfast_tests::debs::{Clock, ROOT_PACKAGES, deb, key_env, packages};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

/// The holdfast packages the quick start installs.
const INSTALLED: &[&str] =
    &["holdfast-archive-keyring", "holdfastctl", "holdfast-etcd", "holdfast-arbiter", "holdfast-controller", "holdfast-tailer"];

/// Where the packages are copied inside the container.
const DEBS_IN: &str = "/root/holdfast-packages";

/// The holdfast units whose journal is printed when a step fails.
const UNITS: &[&str] = &[
    "holdfast-etcd@etcd-a1.service",
    "holdfast-controller.service",
    "holdfast-arbiter.socket",
    "holdfast-arbiter.service",
    "holdfast-tailer.service",
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

/// The journal of the holdfast units and the failed units, for a failure message.
fn diagnostics(c: &Container) -> String {
    let mut text = String::new();
    if let Ok(o) = c.exec(&["systemctl", "--failed", "--no-legend", "--no-pager"]) {
        text.push_str(&format!("--- failed units\n{}", o.stdout));
    }
    let mut args = vec!["journalctl", "--no-pager", "-n", "150", "-o", "short-monotonic"];
    for u in UNITS {
        args.push("-u");
        args.push(u);
    }
    if let Ok(o) = c.exec(&args) {
        text.push_str(&format!("--- journal of the holdfast units (last 150 lines)\n{}{}", o.stdout, o.stderr));
    }
    text
}

/// Runs a shell script inside (`bash -ec`); panics with its output and
/// the journal unless it exits 0.
fn must(c: &Container, what: &str, script: &str) -> Output {
    let o = c.exec(&["bash", "-ec", script]).unwrap_or_else(|e| panic!("{what}: {e:#}"));
    if !o.ok() {
        panic!("{what} failed:\n--- script\n{script}\n{o}\n{}", diagnostics(c));
    }
    o
}

/// `systemctl show -p PROP --value UNIT`.
fn show(c: &Container, unit: &str, prop: &str) -> String {
    must(c, &format!("systemctl show {unit} -p {prop}"), &format!("systemctl show -p {prop} --value {unit}")).stdout.trim().to_string()
}

/// The operator quick start: the `sh` blocks between `<!-- quick-start -->`
/// and `<!-- /quick-start -->` in the operator's book (`QUICK_START`, the
/// chapter the README links to). Returns where it came from and the blocks.
fn quick_start() -> (String, Vec<String>) {
    let file = QUICK_START;
    let text = std::fs::read_to_string(workspace().join(file)).unwrap_or_else(|e| panic!("reading {file}: {e}"));
    // The markers on lines of their own (prose may name them).
    let lines: Vec<&str> = text.lines().collect();
    let start = lines
        .iter()
        .position(|l| l.trim() == "<!-- quick-start -->")
        .unwrap_or_else(|| panic!("{file} has no <!-- quick-start --> line: the test runs the quick start between its markers"));
    let end = lines[start..]
        .iter()
        .position(|l| l.trim() == "<!-- /quick-start -->")
        .map(|e| start + e)
        .unwrap_or_else(|| panic!("{file}: <!-- quick-start --> without <!-- /quick-start -->"));
    let mut blocks = Vec::new();
    let mut current: Option<String> = None;
    for line in &lines[start..end] {
        match (&mut current, line.trim_end()) {
            (None, "```sh") => current = Some(String::new()),
            (Some(_), "```") => blocks.push(current.take().unwrap_or_default()),
            (Some(b), l) => {
                b.push_str(l);
                b.push('\n');
            }
            (None, _) => {}
        }
    }
    assert!(!blocks.is_empty(), "{file}: no ```sh blocks in the quick start");
    (file.to_string(), blocks)
}

/// Where the operator quick start is written: the book's install chapter.
const QUICK_START: &str = "docs/install.md";

/// Repacks `deb` as version `version` (same files, same conffiles) and
/// signs it with the throwaway key like packaging/build does. Returns the
/// new file.
fn bump(deb: &Path, version: &str, key: &Path, out: &Path) -> PathBuf {
    let tree = out.join("repack");
    let _ = std::fs::remove_dir_all(&tree);
    let run = |cmd: &mut Command, what: &str| {
        let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
        assert!(o.status.success(), "{what} failed:\n{}{}", String::from_utf8_lossy(&o.stdout), String::from_utf8_lossy(&o.stderr));
        String::from_utf8_lossy(&o.stdout).into_owned()
    };
    run(Command::new("dpkg-deb").arg("-R").arg(deb).arg(&tree), "dpkg-deb -R");
    let control = tree.join("DEBIAN/control");
    let text = std::fs::read_to_string(&control).expect("control");
    let text: String =
        text.lines().map(|l| if l.starts_with("Version:") { format!("Version: {version}\n") } else { format!("{l}\n") }).collect();
    std::fs::write(&control, text).expect("write control");
    let name = deb.file_name().and_then(|n| n.to_str()).and_then(|n| n.split('_').next()).expect("deb name").to_string();
    let new = out.join(format!("{name}_{version}_amd64.deb"));
    run(Command::new("dpkg-deb").args(["--root-owner-group", "-b"]).arg(&tree).arg(&new), "dpkg-deb -b");
    let env: std::collections::HashMap<String, String> = key_env(key).into_iter().collect();
    let id = env.get("HOLDFAST_SIGNING_KEY_ID").expect("HOLDFAST_SIGNING_KEY_ID in the throwaway key's env");
    let mut sign = Command::new("debsigs");
    sign.args(["--sign=origin", "-k", id]).envs(&env);
    sign.arg(&new);
    run(&mut sign, "debsigs --sign=origin");
    new
}

/// Bare TCP connects to the arbiter's port for `secs` seconds, in the
/// background: prints `ok=N refused=M` (a refusal is a connect that fails:
/// the port was closed). Paced to about 100 a second: unpaced, a loop
/// reaches some 700 a second from 127.0.0.1, past the arbiter's handshake
/// limit per source address (500 a second), and the arbiter then closes
/// the `lock exec` calls' connections from the same address before TLS, as
/// it should, which is not what this step measures.
fn connect_loop(c: &Container, secs: u32) -> std::process::Child {
    let script = format!(
        "end=$(( $(date +%s) + {secs} )); ok=0; refused=0
         while [ $(date +%s) -lt $end ]; do
           if (exec 3<>/dev/tcp/127.0.0.1/7420) 2>/dev/null; then ok=$((ok+1)); else refused=$((refused+1)); fi
           sleep 0.01
         done
         echo \"ok=$ok refused=$refused\""
    );
    c.spawn(&["bash", "-c", &script]).expect("connect loop")
}

/// A loop's stdout and stderr once it ends.
fn finish(child: std::process::Child) -> (String, String) {
    let out = child.wait_with_output().expect("loop");
    (String::from_utf8_lossy(&out.stdout).trim().to_string(), String::from_utf8_lossy(&out.stderr).into_owned())
}

/// `k=N` from a loop's summary line.
fn count(line: &str, k: &str) -> u32 {
    line.split_whitespace().find_map(|w| w.strip_prefix(&format!("{k}="))).and_then(|v| v.parse().ok()).unwrap_or(u32::MAX)
}

/// Runs `holdfastctl lock exec` inside with the operator's credentials.
const LOCK: &str = "export HOLDFAST_ENDPOINT=127.0.0.1:7420 HOLDFAST_CA=/root/holdfast-ca/holdfast-ca.pem \
HOLDFAST_CERT=/root/holdfast-ca/operator.pem HOLDFAST_KEY=/root/holdfast-ca/operator-key.pem; \
holdfastctl lock exec demo/install-test --wait 30s -- true";

/// Waits until the arbiter's grpc.health.v1 says SERVING (what a rolling
/// restart waits on before it moves to the next host).
/// Two dr-operators' keys, approvers.toml, the unit's credentials
/// (/etc/holdfast/epoch-advance.env: the holdfast-epoch etcd user, and the
/// arbiter with the operator's certificate) and a request to advance the
/// (unsealed) cluster, written as the runbook writes it.
const EPOCH_ADVANCE_SETUP: &str = r#"set -e
install -d -m 0700 /root/dr-keys
for who in alice bob; do ssh-keygen -q -t ed25519 -N '' -C $who -f /root/dr-keys/$who; done
for who in alice bob; do
  printf '[approver.%s]\nroles = ["dr-operator"]\nkeys = ["%s"]\n' $who "$(cat /root/dr-keys/$who.pub)"
done > /root/approvers.toml
install -m 0644 /root/approvers.toml /etc/holdfast/approvers.toml
cd /root/holdfast-ca
install -m 0644 etcd-holdfast-epoch.pem /etc/holdfast/tls/etcd-epoch.pem
install -m 0640 -g holdfast-epoch etcd-holdfast-epoch-key.pem /etc/holdfast/tls/etcd-epoch-key.pem
install -m 0644 holdfast-ca.pem /etc/holdfast/tls/holdfast-ca.pem
install -m 0644 operator.pem /etc/holdfast/tls/dr-operator.pem
install -m 0640 -g holdfast-epoch operator-key.pem /etc/holdfast/tls/dr-operator-key.pem
cat > /etc/holdfast/epoch-advance.env <<'ENV'
HOLDFAST_ETCD_ENDPOINT=https://127.0.0.1:2379
HOLDFAST_ETCD_CA=/etc/holdfast/tls/etcd-ca.pem
HOLDFAST_ETCD_CERT=/etc/holdfast/tls/etcd-epoch.pem
HOLDFAST_ETCD_KEY=/etc/holdfast/tls/etcd-epoch-key.pem
HOLDFAST_ENDPOINT=127.0.0.1:7420
HOLDFAST_CA=/etc/holdfast/tls/holdfast-ca.pem
HOLDFAST_CERT=/etc/holdfast/tls/dr-operator.pem
HOLDFAST_KEY=/etc/holdfast/tls/dr-operator-key.pem
ENV
chmod 0600 /etc/holdfast/epoch-advance.env
set -a; . /etc/holdfast/epoch-advance.env; set +a
holdfastctl epoch advance-request --unsealed --requester alice --reason 'install test' \
  --approvers /etc/holdfast/approvers.toml --state-dir /var/lib/holdfast"#;

/// `/sys/epoch` and `/sys/epochs` with their mod revisions, read as etcd's root.
const EPOCH_RECORD: &str = r#"cd /root/holdfast-ca && for k in /sys/epoch /sys/epochs; do
  ETCDCTL_API=3 /usr/lib/holdfast/etcd/etcdctl --endpoints https://127.0.0.1:2379 --cacert etcd-ca.pem --cert etcd-root.pem --key etcd-root-key.pem \
    get $k -w fields | grep -E '^"(Key|Value|ModRevision)"'; done"#;

/// The arbiter's epoch status, once it serves epoch 2 (up to 30 s after the advance).
const EPOCH_STATUS: &str = r#"export HOLDFAST_ENDPOINT=127.0.0.1:7420 HOLDFAST_CA=/root/holdfast-ca/holdfast-ca.pem \
HOLDFAST_CERT=/root/holdfast-ca/operator.pem HOLDFAST_KEY=/root/holdfast-ca/operator-key.pem
for i in $(seq 60); do
  s=$(holdfastctl epoch status --json)
  case $s in *'"serving":true'*) case $s in *'"epoch":2,'*) break;; esac;; esac
  sleep 0.5
done
echo "$s""#;

/// Tries, as whoever runs it, to open each path for reading (a directory:
/// to list it) and for writing (a file: for appending, writing nothing; a
/// directory: to create a file in it, removed at once). One line per path:
/// `r`/`w` allowed, `-` refused with EACCES, `?` and the error otherwise.
const PROBE: &str = r#"#!/bin/sh
try() { if err=$("$@" 2>&1 >/dev/null); then printf '%s' "$2"; else case $err in *'Permission denied'*) printf -;; *) printf '?%s' "$err";; esac; fi; }
readable() { if [ -d "$2" ]; then ls "$2"; else cat "$2"; fi; }
writable() { if [ -d "$2" ]; then t=$(mktemp -p "$2" .probe.XXXXXX) && rm -f "$t"; else true >> "$2"; fi; }
for p in "$@"; do printf '%s%s %s\n' "$(try readable r "$p")" "$(try writable w "$p")" "$p"; done
"#;

/// The users the privilege matrix probes as: (row, setpriv arguments).
/// Each daemon as its unit runs it (its own user, the unit's Group=, no
/// other group), and an operator in group holdfast-audit.
const MATRIX_USERS: &[(&str, &str)] = &[
    ("root", "--reuid=root --regid=root --clear-groups"),
    ("arbiter", "--reuid=holdfast-arbiter --regid=holdfast-arbiter --clear-groups"),
    ("controller", "--reuid=holdfast-controller --regid=holdfast-controller --clear-groups"),
    ("tailer", "--reuid=holdfast-tailer --regid=holdfast-audit --clear-groups"),
    ("epoch", "--reuid=holdfast-epoch --regid=holdfast-epoch --clear-groups"),
    ("etcd", "--reuid=holdfast-etcd --regid=holdfast-etcd --clear-groups"),
    ("auditor", "--reuid=auditor --regid=auditor --init-groups"),
];

/// Every credential, trust and state path of the installed host: who may
/// read it and who may write it (besides root, who may do both). `*` is
/// everyone. Everything else must be refused with EACCES.
const MATRIX: &[(&str, &str, &str)] = &[
    // Keys: each daemon's alone; the tailer's and the defrag's are root's (LoadCredential=).
    ("/etc/holdfast/tls/arbiter-key.pem", "arbiter", ""),
    ("/etc/holdfast/tls/etcd-arbiter-key.pem", "arbiter", ""),
    ("/etc/holdfast/tls/etcd-controller-key.pem", "controller", ""),
    ("/etc/holdfast/tls/etcd-tailer-key.pem", "", ""),
    ("/etc/holdfast/tls/etcd-a1-key.pem", "etcd", ""),
    ("/etc/holdfast/tls/etcd-defrag-key.pem", "", ""),
    ("/etc/holdfast/tls/etcd-epoch-key.pem", "epoch", ""),
    ("/etc/holdfast/tls/dr-operator-key.pem", "epoch", ""),
    ("/root/holdfast-ca/etcd-root-key.pem", "", ""),
    ("/etc/holdfast/epoch-advance.env", "", ""),
    ("/etc/holdfast/etcd/etcd-a1.env", "", ""),
    // Trust and config: anyone may read what is public, nobody but root writes.
    ("/etc/holdfast/tls/clients-ca.pem", "*", ""),
    ("/etc/holdfast/tls/etcd-ca.pem", "*", ""),
    ("/etc/holdfast/approvers.toml", "*", ""),
    ("/etc/holdfast/arbiter.toml", "*", ""),
    ("/etc/holdfast/controller.toml", "*", ""),
    ("/etc/holdfast/tailer.toml", "*", ""),
    ("/etc/holdfast", "", ""),
    ("/etc/holdfast/tls", "", ""),
    ("/etc/holdfast/classes.d", "controller", ""),
    ("/etc/holdfast/grants.d", "controller", ""),
    ("/etc/holdfast/classes.d/demo.toml", "controller", ""),
    // The two-person epoch advance: requests, signatures and the record.
    ("/var/lib/holdfast", "*", ""),
    ("/var/lib/holdfast/requests", "*", ""),
    ("REQUEST", "*", ""),
    ("SIGNATURE", "*", ""),
    ("/var/lib/holdfast/epochs.log", "*", "epoch"),
    // State: each daemon's own.
    ("/var/lib/holdfast/arbiter", "arbiter", "arbiter"),
    ("/var/lib/holdfast/arbiter/served", "arbiter", "arbiter"),
    ("/var/lib/holdfast/audit", "tailer auditor", "tailer"),
    ("SEGMENT", "tailer auditor", "tailer"),
    // The checkpoint may name a live hold's revision (its token): the tailer's alone.
    ("/var/lib/holdfast/audit/checkpoint.json", "tailer", "tailer"),
    ("/var/lib/holdfast-etcd/etcd-a1", "etcd", "etcd"),
];

const HEALTHY: &str = "export HOLDFAST_ENDPOINT=127.0.0.1:7420 HOLDFAST_CA=/root/holdfast-ca/holdfast-ca.pem \
HOLDFAST_CERT=/root/holdfast-ca/operator.pem HOLDFAST_KEY=/root/holdfast-ca/operator-key.pem; \
holdfastctl health --wait 30s";

#[test]
fn fresh_host_installs_and_runs_under_systemd() {
    let mut clock = Clock::new("install test");
    let mut work = tempfile::Builder::new().prefix("holdfast-install-").tempdir_in("/var/tmp").expect("work dir");
    if std::env::var_os("HOLDFAST_KEEP_CONTAINER").is_some() {
        work.disable_cleanup(true);
        eprintln!("   work directory kept: {}", work.path().display());
    }
    let (debs, key) = clock.step("packages (packaging/build --profile dev)", || packages(work.path()));
    let (base, made) = clock.step("cached Debian 12 root", || nspawn::cached_root(ROOT_PACKAGES, |_| Ok(())).expect("debootstrap root"));
    if !made.is_zero() {
        eprintln!("   debootstrap took {made:.1?} (cached for next runs at {})", base.display());
    }
    let c = clock.step("copy and boot the container", || Container::boot(&base, work.path(), "holdfast-install").expect("boot"));
    eprintln!("   copy {:.1?}, boot {:.1?}", c.timings.copy, c.timings.boot);

    for name in INSTALLED {
        let f = deb(&debs, name);
        c.copy_in(&f, &format!("{DEBS_IN}/{}", f.file_name().and_then(|n| n.to_str()).expect("name"))).expect("copy deb");
    }

    // The operator quick start, literally, up to a granted lock.
    let (source, blocks) = quick_start();
    for (i, block) in blocks.iter().enumerate() {
        let first = block.lines().find(|l| !l.trim().is_empty()).unwrap_or("").trim().to_string();
        let out = clock.step(&format!("quick start {}/{} ({source})", i + 1, blocks.len()), || {
            must(&c, &format!("quick start block {} ({first})", i + 1), &format!("cd {DEBS_IN}\nset -x\n{block}"))
        });
        if i + 1 == blocks.len() {
            assert!(out.stdout.contains("granted"), "the quick start's last block should print `granted`:\n{out}");
        }
    }
    for unit in [
        "holdfast-etcd@etcd-a1.service",
        "holdfast-controller.service",
        "holdfast-arbiter.socket",
        "holdfast-arbiter.service",
        "holdfast-tailer.service",
    ] {
        assert_eq!(show(&c, unit, "ActiveState"), "active", "{unit} after the quick start\n{}", diagnostics(&c));
        assert_eq!(show(&c, unit, "UnitFileState"), "enabled", "{unit} after the quick start");
    }
    clock.step("the member runs the pinned etcd holdfast-etcd ships, and no other etcd is installed", || {
        let pinned = holdfast_tests::pinned_etcd().trim_start_matches('v').to_string();
        let status = must(
            &c,
            "the member's version",
            "cd /root/holdfast-ca && /usr/lib/holdfast/etcd/etcdctl --endpoints https://127.0.0.1:2379 --cacert etcd-ca.pem \\
               --cert etcd-root.pem --key etcd-root-key.pem endpoint status -w json",
        )
        .stdout;
        assert!(status.contains(&format!("\"version\":\"{pinned}\"")), "the member does not run etcd {pinned}:\n{status}");
        let main = show(&c, "holdfast-etcd@etcd-a1.service", "ExecMainPID");
        let exe = must(&c, "the member's executable", &format!("readlink /proc/{main}/exe")).stdout;
        assert_eq!(exe.trim(), "/usr/lib/holdfast/etcd/etcd");
        let others = must(&c, "other etcd binaries", "ls /usr/bin/etcd /usr/bin/etcdctl /usr/sbin/etcd 2>/dev/null || true").stdout;
        assert_eq!(others.trim(), "", "a distribution etcd is installed in the container");
    });
    clock.step("lock exec through the arbiter", || must(&c, "holdfastctl lock exec", LOCK));

    // Under systemd the arbiter took its listener from the socket unit and
    // logs to the journal natively: its event fields are journal fields.
    clock.step("the arbiter's journal has structured fields", || {
        let fields =
            must(&c, "journal fields", "journalctl -u holdfast-arbiter.service -o verbose --no-pager | grep -E '^ +HOLDFAST_' || true");
        assert!(
            fields.stdout.lines().any(|l| l.trim() == "HOLDFAST_FROM=socket from systemd"),
            "no HOLDFAST_FROM=socket from systemd field in the arbiter's journal:\n{}",
            fields.stdout
        );
        assert!(fields.stdout.lines().any(|l| l.trim().starts_with("HOLDFAST_LISTEN=")), "no HOLDFAST_LISTEN field:\n{}", fields.stdout);
    });

    // The installed keyring's policy refuses what the signing key did not sign.
    clock.step("debsig-verify refuses tampered and unsigned packages", || {
        must(
            &c,
            "tampered and unsigned packages",
            &format!(
                "cd /tmp && cp {DEBS_IN}/holdfast-arbiter_*.deb signed.deb && debsig-verify signed.deb
                 cp signed.deb tampered.deb
                 size=$(stat -c %s tampered.deb)
                 printf 'X' | dd of=tampered.deb bs=1 seek=$((size - 100)) conv=notrunc status=none
                 if debsig-verify tampered.deb; then echo 'a tampered package verified' >&2; exit 1; fi
                 dpkg-deb -R signed.deb unsigned && dpkg-deb --root-owner-group -Znone -b unsigned unsigned.deb >/dev/null
                 if debsig-verify unsigned.deb; then echo 'an unsigned package verified' >&2; exit 1; fi"
            ),
        );
    });

    // A hung arbiter is killed by the watchdog and replaced.
    clock.step("watchdog replaces a SIGSTOPped arbiter", || {
        let pid = show(&c, "holdfast-arbiter.service", "MainPID");
        let restarts: u32 = show(&c, "holdfast-arbiter.service", "NRestarts").parse().expect("NRestarts");
        let watchdog = show(&c, "holdfast-arbiter.service", "WatchdogUSec");
        eprintln!("   arbiter MainPID {pid}, WatchdogUSec {watchdog}, NRestarts {restarts}");
        must(&c, "kill -STOP", &format!("kill -STOP {pid}"));
        let deadline = Instant::now() + Duration::from_secs(180);
        loop {
            let now = show(&c, "holdfast-arbiter.service", "MainPID");
            let state = show(&c, "holdfast-arbiter.service", "ActiveState");
            if now != pid && now != "0" && state == "active" {
                eprintln!("   new MainPID {now}");
                break;
            }
            assert!(
                Instant::now() < deadline,
                "the watchdog did not replace the stopped arbiter (MainPID {now}, {state})\n{}",
                diagnostics(&c)
            );
            std::thread::sleep(Duration::from_millis(500));
        }
        let after: u32 = show(&c, "holdfast-arbiter.service", "NRestarts").parse().expect("NRestarts");
        assert!(after > restarts, "NRestarts {restarts} -> {after}");
        let journal = must(&c, "journal", "journalctl --no-pager -u holdfast-arbiter.service").stdout;
        assert!(journal.contains("Watchdog timeout"), "the journal does not name the watchdog:\n{journal}");
        must(&c, "lock after the watchdog restart", LOCK);
    });

    // A reload with a config that does not check keeps the running one.
    clock.step("reload with a bad config keeps the old one", || {
        for (unit, file) in
            [("holdfast-arbiter.service", "/etc/holdfast/arbiter.toml"), ("holdfast-controller.service", "/etc/holdfast/controller.toml")]
        {
            let pid = show(&c, unit, "MainPID");
            must(&c, "break the config", &format!("cp {file} {file}.good && echo 'no_such_key = 1' >> {file}"));
            let r = c.sh(&format!("systemctl reload {unit}")).expect("reload");
            assert!(!r.ok(), "systemctl reload {unit} with a bad config succeeded:\n{r}");
            assert_eq!(show(&c, unit, "MainPID"), pid, "{unit}'s MainPID changed on a bad reload");
            assert_eq!(show(&c, unit, "ActiveState"), "active", "{unit} after a bad reload\n{}", diagnostics(&c));
            must(&c, "restore the config", &format!("mv {file}.good {file} && systemctl reload {unit}"));
            assert_eq!(show(&c, unit, "MainPID"), pid, "{unit}'s MainPID changed on a good reload");
        }
        must(&c, "lock after the reloads", LOCK);
    });

    // The packaged arbiter is built without the gate's deliberate bugs: a
    // config that turns one on is refused before it touches etcd or a port,
    // and the running arbiter serves on.
    clock.step("the packaged arbiter refuses a [mutation] table", || {
        must(
            &c,
            "a config turning a mutation on",
            "cp /etc/holdfast/arbiter.toml /root/mutation.toml && printf '\\n[mutation]\\ntoken_from_counter = true\\n' >> /root/mutation.toml",
        );
        let refusal = "token_from_counter but this arbiter was built without the `mutations` feature";
        let check = c.sh("holdfast-arbiter --config /root/mutation.toml check").expect("check");
        assert_eq!(check.code, 78, "`check` passed a [mutation] table:\n{check}");
        assert!(check.stderr.contains(refusal), "check says which mutation and why:\n{check}");
        let run = c.sh("holdfast-arbiter --config /root/mutation.toml").expect("run the arbiter");
        assert_eq!(run.code, 1, "an arbiter without the mutations feature started with [mutation]:\n{run}");
        assert!(run.stderr.contains(refusal), "the refusal says which mutation and why:\n{run}");
        must(&c, "lock after the refused start", LOCK);
    });

    // The packaged epoch-advance unit, as the DR runbook starts it: with one
    // signature it fails and changes nothing; with two it advances, and the
    // arbiter serves the new epoch.
    clock.step("holdfast-epoch-advance@ refuses one signature and advances with two", || {
        must(&c, "approvers, credentials and a request", EPOCH_ADVANCE_SETUP);
        let name =
            must(&c, "the request's name", "basename /var/lib/holdfast/requests/epoch-advance-*.toml .toml").stdout.trim().to_string();
        let unit = format!("holdfast-epoch-advance@{name}.service");
        let before = must(&c, "the epoch record", EPOCH_RECORD).stdout;
        must(&c, "alice signs", &format!("holdfastctl approve /var/lib/holdfast/requests/{name}.toml --ssh-key /root/dr-keys/alice"));
        let one = c.sh(&format!("systemctl start {unit}")).expect("start the unit");
        assert!(
            !one.ok(),
            "the epoch advance ran with one signature:
{one}"
        );
        assert_eq!(
            show(&c, &unit, "ExecMainStatus"),
            "77",
            "refused for its approvals
{}",
            diagnostics(&c)
        );
        let journal = must(&c, "the unit's journal", &format!("journalctl --no-pager -u {unit}")).stdout;
        assert!(
            journal.contains("only alice signed"),
            "the unit's journal says why:
{journal}"
        );
        assert_eq!(must(&c, "the epoch record", EPOCH_RECORD).stdout, before, "a refused advance changed /sys/epoch or /sys/epochs");
        must(&c, "bob signs", &format!("holdfastctl approve /var/lib/holdfast/requests/{name}.toml --ssh-key /root/dr-keys/bob"));
        must(&c, "reset the failed unit", &format!("systemctl reset-failed {unit}"));
        must(&c, "the advance with two signatures", &format!("systemctl start {unit}"));
        assert_eq!(show(&c, &unit, "Result"), "success");
        let status = must(&c, "epoch status", EPOCH_STATUS).stdout;
        assert!(status.contains("\"epoch\":2,") && status.contains("\"serving\":true"), "the arbiter serves epoch 2: {status}");
        let log = c.read("/var/lib/holdfast/epochs.log").expect("epochs.log");
        assert!(log.starts_with("epoch 2 cluster "), "the unit recorded the advance: {log}");
        must(&c, "lock after the advance", LOCK);
    });

    // Least privilege: every daemon user, every credential and state path.
    clock.step("privilege matrix: each daemon reaches its own files only", || {
        must(
            &c,
            "a defrag key, an auditor, the probe",
            &format!(
                "install -m 0644 /root/holdfast-ca/etcd-root.pem /etc/holdfast/tls/etcd-defrag.pem
                 install -m 0600 /root/holdfast-ca/etcd-root-key.pem /etc/holdfast/tls/etcd-defrag-key.pem
                 id auditor >/dev/null 2>&1 || useradd --system --no-create-home -G holdfast-audit auditor
                 cat > /usr/local/bin/holdfast-probe <<'PROBE'\n{PROBE}PROBE
                 chmod 0755 /usr/local/bin/holdfast-probe"
            ),
        );
        let find = |what: &str, cmd: &str| must(&c, what, cmd).stdout.lines().next().unwrap_or_default().trim().to_string();
        let request = find("a request", "ls /var/lib/holdfast/requests/*.toml");
        let signature = find("a signature", "ls /var/lib/holdfast/requests/*.sig");
        let segment = find("an audit store segment", "find /var/lib/holdfast/audit/segments -type f | sort | head -1");
        let served = find("the arbiter's state file", "find /var/lib/holdfast/arbiter -type f | sort | head -1");
        assert!(!request.is_empty() && !signature.is_empty() && !segment.is_empty() && !served.is_empty(), "a path to probe is missing");
        let path = |p: &str| match p {
            "REQUEST" => request.clone(),
            "SIGNATURE" => signature.clone(),
            "SEGMENT" => segment.clone(),
            "/var/lib/holdfast/arbiter/served" => served.clone(),
            other => other.to_string(),
        };
        let paths: Vec<String> = MATRIX.iter().map(|(p, _, _)| path(p)).collect();
        let mut wrong = Vec::new();
        let mut table = String::new();
        for (row, how) in MATRIX_USERS {
            let out = must(&c, &format!("probe as {row}"), &format!("setpriv {how} /usr/local/bin/holdfast-probe {}", paths.join(" ")));
            let lines: Vec<&str> = out.stdout.lines().collect();
            assert_eq!(lines.len(), MATRIX.len(), "the probe as {row}:\n{out}");
            table.push_str(&format!("   {row:<11}"));
            for ((name, readers, writers), line) in MATRIX.iter().zip(lines) {
                let (got, p) = line.split_once(' ').expect("probe line");
                assert_eq!(p, path(name), "probe output order");
                let may = |who: &str| *row == "root" || who == "*" || who.split_whitespace().any(|w| w == *row);
                let want = format!("{}{}", if may(readers) { "r" } else { "-" }, if may(writers) { "w" } else { "-" });
                table.push_str(&format!(" {got}"));
                if got != want {
                    wrong.push(format!("{row} on {p}: {got}, expected {want}"));
                }
            }
            table.push('\n');
        }
        eprintln!("   columns: {}\n{table}", MATRIX.iter().map(|(p, _, _)| *p).collect::<Vec<_>>().join(", "));
        assert!(wrong.is_empty(), "the privilege matrix differs:\n{}", wrong.join("\n"));
        // A key another daemon's user may not open is refused with the fix.
        let refused = c
            .sh("setpriv --reuid=holdfast-controller --regid=holdfast-controller --clear-groups holdfast-arbiter check --config /etc/holdfast/arbiter.toml")
            .expect("check as another daemon");
        assert!(
            !refused.ok() && refused.stderr.contains("chown root:holdfast-controller /etc/holdfast/tls/"),
            "the arbiter's check as holdfast-controller names the fix:\n{refused}"
        );
        // The group holdfast-audit reads the audit trail.
        let audit = must(&c, "holdfastctl audit as an auditor", "setpriv --reuid=auditor --regid=auditor --init-groups holdfastctl audit --store /var/lib/holdfast/audit --json");
        assert!(
            audit.stdout.contains("\"grant\"") && audit.stdout.contains("\"demo/install-test\""),
            "holdfastctl audit as a member of holdfast-audit shows the grants taken so far:\n{audit}"
        );
        // The defrag unit defragments with the root-role key it alone receives, as a user of its own.
        must(&c, "defrag as a DynamicUser with its credential", "systemctl start holdfast-etcd-defrag@etcd-a1.service");
        assert_eq!(show(&c, "holdfast-etcd-defrag@etcd-a1.service", "Result"), "success", "{}", diagnostics(&c));
    });

    // The socket stays open while the arbiter restarts: no call is refused.
    clock.step("restart the socket-activated arbiter under client loops", || {
        // Two loops for 12 s across two restarts: bare TCP connects (a
        // refusal is a connect that fails: the port was closed), and
        // `holdfastctl lock exec` calls (ok, or failed with the message).
        let calls = format!(
            "end=$(( $(date +%s) + 12 )); ok=0; failed=0
             while [ $(date +%s) -lt $end ]; do
               if out=$( ( {LOCK} ) 2>&1); then ok=$((ok+1)); else failed=$((failed+1)); echo \"$out\" >&2; fi
             done
             echo \"ok=$ok failed=$failed\""
        );
        let connects = connect_loop(&c, 12);
        let call_loop = c.spawn(&["bash", "-c", &calls]).expect("call loop");
        let mut pid = show(&c, "holdfast-arbiter.service", "MainPID");
        for _ in 0..2 {
            std::thread::sleep(Duration::from_secs(3));
            must(&c, "restart the arbiter", "systemctl restart holdfast-arbiter.service");
            let now = show(&c, "holdfast-arbiter.service", "MainPID");
            assert_ne!(now, pid, "the arbiter did not restart");
            pid = now;
            let healthy = must(&c, "the restarted arbiter answers SERVING", HEALTHY);
            assert_eq!(healthy.stdout.trim(), "SERVING", "holdfastctl health after the restart");
        }
        let (connected, _) = finish(connects);
        let (called, call_errors) = finish(call_loop);
        eprintln!("   TCP connects: {connected}; lock exec calls: {called}");
        assert_eq!(show(&c, "holdfast-arbiter.socket", "ActiveState"), "active");
        assert_eq!(count(&connected, "refused"), 0, "connections refused while the arbiter restarted");
        assert!(count(&connected, "ok") > 0, "no connection made: {connected}");
        assert!(count(&called, "ok") > 0, "no lock taken during the restarts: {called}\n{call_errors}");
        assert!(!call_errors.to_lowercase().contains("refused"), "a call was refused:\n{call_errors}");
        if count(&called, "failed") > 0 {
            // Not refused, but in flight when the old arbiter stopped (see docs/install-test.md).
            eprintln!("!! lock exec calls that failed across the restarts (none refused):\n{call_errors}");
        }
    });

    // An upgrade keeps the operator's edit of a conffile, without a prompt.
    clock.step("upgrade keeps an edited conffile", || {
        let key = key.as_deref().expect("the upgrade re-signs with the packages' key: with HOLDFAST_PACKAGES_DIR, set HOLDFAST_PACKAGES_KEY to its packaging/throwaway-key directory");
        let old = deb(&debs, "holdfast-arbiter");
        let current = must(&c, "version", "dpkg-query -W -f '${Version}' holdfast-arbiter").stdout;
        let newer = format!("{current}+installtest1");
        let new = bump(&old, &newer, key, work.path());
        let inside = format!("/root/upgrade/{}", new.file_name().and_then(|n| n.to_str()).expect("name"));
        c.copy_in(&new, &inside).expect("copy upgrade");
        must(&c, "edit the conffile", "echo '# edited by the operator' >> /etc/holdfast/arbiter.toml");
        must(&c, "debsig-verify the upgrade", &format!("debsig-verify {inside}"));
        let pid = show(&c, "holdfast-arbiter.service", "MainPID");
        let connects = connect_loop(&c, 8);
        std::thread::sleep(Duration::from_secs(1));
        let up = must(&c, "dpkg -i the upgrade", &format!("timeout 300 dpkg -i {inside} </dev/null"));
        let (connected, _) = finish(connects);
        eprintln!("   TCP connects across the upgrade: {connected}");
        assert_eq!(count(&connected, "refused"), 0, "connections refused during the upgrade (the socket should stay open)\n{up}");
        assert_ne!(show(&c, "holdfast-arbiter.service", "MainPID"), pid, "the running arbiter was not restarted into the new package");
        assert!(!up.stdout.contains("Configuration file '/etc/holdfast/arbiter.toml'"), "dpkg asked about the conffile:\n{up}");
        assert_eq!(must(&c, "version", "dpkg-query -W -f '${Version}' holdfast-arbiter").stdout, newer);
        let conf = c.read("/etc/holdfast/arbiter.toml").expect("arbiter.toml");
        assert!(conf.contains("# edited by the operator"), "the edit of arbiter.toml was lost on upgrade");
        assert!(
            !c.host_path("/etc/holdfast/arbiter.toml.dpkg-new").exists() && !c.host_path("/etc/holdfast/arbiter.toml.dpkg-dist").exists()
        );
        must(&c, "the arbiter runs after the upgrade", "systemctl is-active holdfast-arbiter.service holdfast-arbiter.socket");
        must(&c, "lock after the upgrade", LOCK);
    });

    // Purge removes the conffiles and the units; the system user stays.
    clock.step("purge", || {
        // The daemons' units are running and enabled: removal stops them
        // (prerm) and purge drops their enablement (postrm). The etcd
        // member is a template instance the package cannot name: the
        // operator stops it first.
        must(&c, "stop the etcd member", "systemctl disable --now holdfast-etcd@etcd-a1.service");
        must(&c, "dpkg --purge", "dpkg --purge holdfast-tailer holdfast-arbiter holdfast-controller holdfast-etcd holdfastctl </dev/null");
        let left = must(&c, "processes", "ps -eo user:20,comm --no-headers | awk '$1 ~ /^holdfast/' || true").stdout;
        assert!(left.trim().is_empty(), "holdfast processes still run after the purge:\n{left}");
        let links = must(&c, "enablement", "find /etc/systemd/system -name 'holdfast*' || true").stdout;
        assert!(links.trim().is_empty(), "enablement or masks left after the purge:\n{links}");
        for gone in [
            "/etc/holdfast/arbiter.toml",
            "/etc/holdfast/controller.toml",
            "/etc/holdfast/tailer.toml",
            "/usr/lib/systemd/system/holdfast-arbiter.service",
            "/usr/lib/systemd/system/holdfast-arbiter.socket",
            "/usr/lib/systemd/system/holdfast-controller.service",
            "/usr/lib/systemd/system/holdfast-tailer.service",
            "/usr/lib/systemd/system/holdfast-etcd@.service",
            "/usr/bin/holdfast-arbiter",
            "/usr/bin/holdfastctl",
            "/usr/lib/holdfast/etcd/etcd",
            "/usr/lib/holdfast/etcd/etcdctl",
        ] {
            assert!(!c.host_path(gone).exists(), "{gone} is still there after the purge");
        }
        let listed = must(&c, "list units", "systemctl daemon-reload; systemctl list-unit-files --no-legend 'holdfast*' || true").stdout;
        assert!(listed.trim().is_empty(), "units left after the purge:\n{listed}");
        must(&c, "the system users stay", "getent passwd holdfast-arbiter holdfast-etcd");
    });
    clock.summary();
}
