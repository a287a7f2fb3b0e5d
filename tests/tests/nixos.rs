//! The NixOS modules in `nixos/`, checked as far as this machine allows:
//! nixpkgs is not reachable here (docs: /work/shared/design/FACTS.md), so
//! nothing is built and no VM runs. What is checked:
//!
//! - every `.nix` file under `nixos/` parses (`nix-instantiate --parse`);
//! - the modules evaluate against the small module system in
//!   `nixos/tests/eval/` (a stub `lib` with options, types, mkIf/mkMerge and
//!   freeform submodules; a stub `pkgs` whose derivations are attribute
//!   sets), with `nix-instantiate --eval --strict --json --store dummy://`:
//!   the options exist with their types and defaults, each service carries
//!   the hardening of its unit in `systemd/` key for key, the config file is
//!   generated and checked with the daemon's own `check`, and every
//!   assertion fails for its unsafe combination and holds for a safe one;
//! - the two scripts the modules' build steps run (`nixos/check-config.sh`,
//!   `nixos/policy-dir.sh`) do what the build would, with the workspace's
//!   binaries on the example configs.
//!
//! Not checked here: a real nixpkgs evaluation, the package build and the
//! VM test `nixos/tests/three-halls.nix` (see nixos/README.md).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

fn repo() -> PathBuf {
    std::fs::canonicalize(Path::new(env!("CARGO_MANIFEST_DIR")).join("..")).expect("repository root")
}

fn nixos_dir() -> PathBuf {
    repo().join("nixos")
}

/// A program the test needs; missing is a failure naming install-deps.
fn tool(name: &str) -> PathBuf {
    for dir in std::env::var("PATH").unwrap_or_default().split(':').chain(["/usr/bin", "/usr/sbin", "/bin", "/sbin", "/usr/local/go/bin"]) {
        let p = Path::new(dir).join(name);
        if p.is_file() {
            return p;
        }
    }
    panic!("{name} is not installed: run scripts/install-deps (nix-instantiate comes from Debian's nix-bin)");
}

/// nix-instantiate with its state, config and home in a throwaway directory
/// (no daemon, no store is written: `--store dummy://`).
struct Nix {
    dir: tempfile::TempDir,
}

impl Nix {
    fn new() -> Self {
        let dir = tempfile::Builder::new().prefix("holdfast-nix-").tempdir().unwrap();
        for d in ["state", "conf", "home"] {
            std::fs::create_dir_all(dir.path().join(d)).unwrap();
        }
        Nix { dir }
    }

    fn command(&self) -> Command {
        let mut c = Command::new(tool("nix-instantiate"));
        c.env("NIX_STATE_DIR", self.dir.path().join("state"))
            .env("NIX_CONF_DIR", self.dir.path().join("conf"))
            .env("HOME", self.dir.path().join("home"))
            .args(["--store", "dummy://"]);
        c
    }

    /// `EXPR` with `r` bound to the evaluation of `configuration`
    /// (nixos/tests/eval/eval.nix), as JSON.
    fn eval(&self, configuration: &str, expr: &str) -> Value {
        let eval_nix = nixos_dir().join("tests/eval/eval.nix");
        let full = format!("let r = import {} {{ configuration = {configuration}; }}; in {expr}", eval_nix.display());
        let out = self.command().args(["--eval", "--strict", "--json", "-E", &full]).output().unwrap();
        assert!(out.status.success(), "evaluation failed:\n{full}\n{}", String::from_utf8_lossy(&out.stderr));
        serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&out.stdout)))
    }

    /// `EXPR` for each of `configurations` in one evaluation (each
    /// nix-instantiate start costs about a second).
    fn eval_each(&self, configurations: &[String], expr: &str) -> Vec<Value> {
        let eval_nix = nixos_dir().join("tests/eval/eval.nix");
        let list: String = configurations.iter().map(|c| format!("({c})\n")).collect();
        let full = format!("map (configuration: let r = import {} {{ inherit configuration; }}; in {expr}) [\n{list}]", eval_nix.display());
        let out = self.command().args(["--eval", "--strict", "--json", "-E", &full]).output().unwrap();
        assert!(out.status.success(), "evaluation failed:\n{full}\n{}", String::from_utf8_lossy(&out.stderr));
        match serde_json::from_slice(&out.stdout) {
            Ok(Value::Array(a)) if a.len() == configurations.len() => a,
            other => panic!("not one result per configuration: {other:?}"),
        }
    }

    /// The error of an evaluation that must fail.
    fn eval_error(&self, configuration: &str, expr: &str) -> String {
        let eval_nix = nixos_dir().join("tests/eval/eval.nix");
        let full = format!("let r = import {} {{ configuration = {configuration}; }}; in {expr}", eval_nix.display());
        let out = self.command().args(["--eval", "--strict", "--json", "-E", &full]).output().unwrap();
        assert!(!out.status.success(), "evaluation succeeded but must fail:\n{full}\n{}", String::from_utf8_lossy(&out.stdout));
        String::from_utf8_lossy(&out.stderr).into_owned()
    }
}

fn nix_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("{}: {e}", dir.display())) {
        let p = e.unwrap().path();
        if p.is_dir() {
            nix_files(&p, out);
        } else if p.extension().is_some_and(|x| x == "nix") {
            out.push(p);
        }
    }
}

#[test]
fn every_nix_file_under_nixos_parses() {
    let nix = Nix::new();
    let mut files = Vec::new();
    nix_files(&nixos_dir(), &mut files);
    files.sort();
    for m in ["default", "arbiter", "controller", "tailer", "etcd", "provision", "package", "tests/three-halls"] {
        assert!(files.contains(&nixos_dir().join(format!("{m}.nix"))), "nixos/{m}.nix is missing: {files:?}");
    }
    let mut failures = Vec::new();
    for f in &files {
        let out = nix.command().arg("--parse").arg(f).output().unwrap();
        if !out.status.success() {
            failures.push(format!("{}:\n{}", f.display(), String::from_utf8_lossy(&out.stderr)));
        }
    }
    println!("parsed {} files", files.len());
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

const MODULES: &[&str] = &["arbiter", "controller", "tailer", "etcd", "provision"];

#[test]
fn options_exist_with_their_types_and_defaults() {
    let nix = Nix::new();
    let o = "r.options.services.holdfast";
    let v = nix.eval(
        "{ }",
        &format!(
            r#"{{
              enable = builtins.mapAttrs (_: m: {{ type = m.enable.type.description; default = m.enable.default; }}) {o};
              package = builtins.mapAttrs (_: m: m.package.type.description) {o};
              settings = builtins.mapAttrs (_: m: m.settings.type.description) {o};
              arbiterListen = {o}.arbiter.settings.type.getSubOptions.listen.default;
              arbiterStateDir = {o}.arbiter.settings.type.getSubOptions.state_dir.default;
              tailerStore = {o}.tailer.settings.type.getSubOptions.store_dir.default;
              tangThreshold = ({o}.provision.settings.type.getSubOptions.tang.type.getSubOptions.threshold).default;
              tangServers = ({o}.provision.settings.type.getSubOptions.tang.type.getSubOptions.servers).type.description;
              unitDir = ({o}.provision.settings.type.getSubOptions.tune.type.getSubOptions.unit_dir).default;
              classes = {o}.controller.classes.type.description;
              enforcement = {o}.controller.classes.type.getSubOptions.enforcement.type.description;
              onQuorumLoss = {o}.controller.classes.type.getSubOptions.on_quorum_loss.default;
              etcdSettings = {o}.etcd.settings.type.description;
              packageName = {o}.arbiter.package.default.name;
              packageLock = builtins.baseNameOf {o}.arbiter.package.default.passthru.args.cargoLock.lockFile;
              packageSrcIsPath = {o}.arbiter.package.default.srcIsPath;
              services = builtins.attrNames r.config.systemd.services;
            }}"#
        ),
    );
    println!("{v:#}");
    for m in MODULES {
        assert_eq!(v["enable"][m], serde_json::json!({"type": "boolean", "default": false}), "{m}.enable");
        assert_eq!(v["package"][m], "package", "{m}.package");
        let want = if *m == "etcd" { "attribute set of string" } else { "submodule" };
        assert_eq!(v["settings"][m], want, "{m}.settings");
    }
    assert_eq!(v["arbiterListen"], "0.0.0.0:7420");
    assert_eq!(v["arbiterStateDir"], "/var/lib/holdfast/arbiter");
    assert_eq!(v["tailerStore"], "/var/lib/holdfast/audit");
    assert_eq!(v["tangThreshold"], 1);
    assert_eq!(v["tangServers"], "list of submodule");
    assert_eq!(v["unitDir"], "/run/systemd/system");
    assert_eq!(v["classes"], "attribute set of submodule");
    assert_eq!(v["enforcement"], r#"one of "fenced", "advisory""#);
    assert_eq!(v["onQuorumLoss"], "closed");
    assert_eq!(v["etcdSettings"], "attribute set of string");
    // package.nix evaluated: the version is the workspace's.
    assert_eq!(v["packageName"], "holdfast-0.1.0");
    assert_eq!(v["packageLock"], "Cargo.lock");
    assert_eq!(v["packageSrcIsPath"], true);
    // Nothing enabled, nothing runs.
    assert_eq!(v["services"], serde_json::json!([]));

    // A freeform key is kept; a typed one is type-checked.
    let s = nix.eval(
        "{ services.holdfast.arbiter = { enable = true; settings.cluster_name = \"c\"; settings.tls.trust_domain = \"d\"; }; }",
        "r.config.services.holdfast.arbiter.settings",
    );
    assert_eq!(
        s,
        serde_json::json!({"cluster_name": "c", "listen": "0.0.0.0:7420", "state_dir": "/var/lib/holdfast/arbiter", "tls": {"trust_domain": "d"}})
    );
    let err = nix.eval_error(
        "{ services.holdfast.arbiter = { enable = true; settings.listen = 7420; }; }",
        "r.config.services.holdfast.arbiter.settings",
    );
    assert!(err.contains("services.holdfast.arbiter.settings.listen' is not of type `string'"), "{err}");
    let err = nix.eval_error("{ services.holdfast.arbiter.enabel = true; }", "r.config.services.holdfast.arbiter.enable");
    assert!(err.contains("services.holdfast.arbiter.enabel' does not exist"), "{err}");
}

/// The hardening directives of a unit: everything after its "# Hardening"
/// comment up to the next section, multi-valued keys in order.
fn unit_hardening(unit: &str) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("systemd").join(unit)).unwrap_or_else(|e| panic!("{unit}: {e}"));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let mut inside = false;
    for line in text.lines() {
        let t = line.trim();
        if t.starts_with("# Hardening") {
            inside = true;
            continue;
        }
        if t.starts_with('[') {
            inside = false;
        }
        if !inside || t.is_empty() || t.starts_with('#') {
            continue;
        }
        let (k, v) = t.split_once('=').unwrap_or_else(|| panic!("{unit}: {t}"));
        out.entry(k.to_string()).or_default().push(v.to_string());
    }
    assert!(out.len() >= 8, "{unit}: no hardening section found ({out:?})");
    out
}

/// A serviceConfig value as the lines systemd would get.
fn values(v: &Value) -> Vec<String> {
    match v {
        Value::Array(a) => a.iter().flat_map(values).collect(),
        Value::String(s) => vec![s.clone()],
        Value::Number(n) => vec![n.to_string()],
        Value::Bool(b) => vec![if *b { "true" } else { "false" }.to_string()],
        other => panic!("unexpected serviceConfig value {other}"),
    }
}

const SAFE_ETCD: &str = r#"{ enable = true; name = "etcd-a1"; settings = {
    ETCD_CERT_FILE = "/etc/holdfast/tls/etcd-a1.pem"; ETCD_KEY_FILE = "/etc/holdfast/tls/etcd-a1-key.pem";
    ETCD_TRUSTED_CA_FILE = "/etc/holdfast/tls/etcd-ca.pem"; ETCD_PEER_CERT_FILE = "/etc/holdfast/tls/etcd-a1.pem";
    ETCD_PEER_KEY_FILE = "/etc/holdfast/tls/etcd-a1-key.pem"; ETCD_PEER_TRUSTED_CA_FILE = "/etc/holdfast/tls/etcd-ca.pem";
    ETCD_LISTEN_CLIENT_URLS = "https://10.0.1.11:2379"; ETCD_ADVERTISE_CLIENT_URLS = "https://10.0.1.11:2379";
    ETCD_LISTEN_PEER_URLS = "https://10.0.1.11:2380"; ETCD_INITIAL_ADVERTISE_PEER_URLS = "https://10.0.1.11:2380";
    ETCD_PEER_CERT_ALLOWED_CN = "holdfast etcd member"; }; }"#;

const SAFE_TANG: &str = r#"[ { url = "http://tang-a:7500"; hall = "hall-a"; } { url = "http://tang-b:7500"; hall = "hall-b"; } ]"#;

fn all_enabled() -> String {
    format!(
        r#"{{ services.holdfast = {{
            arbiter.enable = true; controller.enable = true; tailer.enable = true;
            etcd = {SAFE_ETCD};
            provision = {{ enable = true; settings.host = "etcd-a1"; settings.tang.servers = {SAFE_TANG}; }};
        }}; }}"#
    )
}

#[test]
fn every_service_has_the_hardening_of_its_unit_file() {
    let nix = Nix::new();
    let services = nix.eval(&all_enabled(), "{ inherit (r.config.systemd) services sockets; failed = r.failedAssertions; }");
    assert_eq!(services["failed"], serde_json::json!([]), "the all-enabled configuration must be safe");
    let pairs = [
        ("holdfast-arbiter.service", "holdfast-arbiter"),
        ("holdfast-controller.service", "holdfast-controller"),
        ("holdfast-tailer.service", "holdfast-tailer"),
        ("holdfast-etcd@.service", "holdfast-etcd@etcd-a1"),
        ("holdfast-provision.service", "holdfast-provision"),
    ];
    let mut failures = Vec::new();
    for (unit, service) in pairs {
        let want = unit_hardening(unit);
        let got = &services["services"][service]["serviceConfig"];
        assert!(got.is_object(), "no systemd.services.{service} in {:#}", services["services"]);
        for (k, v) in &want {
            let g = got.get(k).map(values);
            if g.as_ref() != Some(v) {
                failures.push(format!("{service}: {k}: unit file {v:?}, module {g:?}"));
            }
        }
        println!("{service}: {} hardening keys equal to systemd/{unit}", want.len());
    }
    assert!(failures.is_empty(), "hardening differs from systemd/:\n{}", failures.join("\n"));
    // The arbiter's socket is the unit file's.
    let socket = &services["sockets"]["holdfast-arbiter"]["socketConfig"];
    for (k, v) in [
        ("ListenStream", "7420"),
        ("FileDescriptorName", "lock"),
        ("Service", "holdfast-arbiter.service"),
        ("NoDelay", "yes"),
        ("Backlog", "4096"),
    ] {
        assert_eq!(values(&socket[k]), vec![v.to_string()], "socket {k}");
    }
    // No PrivateUsers= where the unit explains why not.
    assert!(services["services"]["holdfast-etcd@etcd-a1"]["serviceConfig"].get("PrivateUsers").is_none());
}

/// The tailer's etcd key as config/tailer.toml names it (root:root 0600,
/// handed to the unit by LoadCredential=).
const TAILER_KEY: &str = "/etc/holdfast/tls/etcd-tailer-key.pem";

/// The [Service] keys of a unit that say who it runs as and where it may
/// write (outside its "# Hardening" section), `%i` as `instance`.
const IDENTITY_KEYS: &[&str] = &[
    "User",
    "Group",
    "DynamicUser",
    "SupplementaryGroups",
    "StateDirectory",
    "StateDirectoryMode",
    "RuntimeDirectory",
    "ConfigurationDirectory",
    "ConfigurationDirectoryMode",
    "LoadCredential",
];

fn unit_identity(unit: &str, instance: &str) -> BTreeMap<String, Vec<String>> {
    let text = std::fs::read_to_string(repo().join("systemd").join(unit)).unwrap_or_else(|e| panic!("{unit}: {e}"));
    let mut out: BTreeMap<String, Vec<String>> = BTreeMap::new();
    let (mut service, mut continued) = (false, false);
    for line in text.lines() {
        let t = line.trim();
        // A line after one ending in `\` continues its value (ExecStartPre=).
        let continuation = std::mem::replace(&mut continued, t.ends_with('\\'));
        if continuation {
            continue;
        }
        if t.starts_with('[') {
            service = t == "[Service]";
        }
        if !service || t.starts_with('#') {
            continue;
        }
        if let Some((k, v)) = t.split_once('=')
            && IDENTITY_KEYS.contains(&k)
        {
            out.entry(k.to_string()).or_default().push(v.replace("%i", instance));
        }
    }
    out
}

/// One user per daemon, the layout of the packages' sysusers.d and
/// tmpfiles.d: each service runs as its own user (the tailer with group
/// holdfast-audit), writes only its own state directory, and no module
/// defines the old shared `holdfast` user or group.
#[test]
fn each_daemon_runs_as_its_own_user() {
    let nix = Nix::new();
    let v = nix.eval(
        &all_enabled(),
        "{ users = r.config.users; tmpfiles = r.config.systemd.tmpfiles.settings; \
           services = builtins.mapAttrs (_: s: s.serviceConfig) r.config.systemd.services; }",
    );
    let services = &v["services"];
    for (service, user, group, state, mode) in [
        ("holdfast-arbiter", "holdfast-arbiter", "holdfast-arbiter", Some("holdfast/arbiter"), Some("0700")),
        ("holdfast-controller", "holdfast-controller", "holdfast-controller", None, None),
        ("holdfast-tailer", "holdfast-tailer", "holdfast-audit", Some("holdfast/audit"), Some("0750")),
        ("holdfast-etcd@etcd-a1", "holdfast-etcd", "holdfast-etcd", Some("holdfast-etcd/etcd-a1"), Some("0700")),
    ] {
        let s = &services[service];
        assert_eq!(s["User"], user, "{service}: {s:#}");
        assert_eq!(s["Group"], group, "{service}");
        assert_eq!(s.get("StateDirectory").and_then(Value::as_str), state, "{service}");
        assert_eq!(s.get("StateDirectoryMode").and_then(Value::as_str), mode, "{service}");
        for k in ["ConfigurationDirectory", "ConfigurationDirectoryMode", "DynamicUser", "SupplementaryGroups"] {
            assert!(s.get(k).is_none(), "{service} sets {k}: {}", s[k]);
        }
    }
    // The audit store's files 0640, for group holdfast-audit; no key to
    // load when the settings name none.
    assert_eq!(services["holdfast-tailer"]["UMask"], "0027");
    assert!(services["holdfast-tailer"].get("LoadCredential").is_none());

    let users = &v["users"]["users"];
    for name in ["holdfast-arbiter", "holdfast-controller", "holdfast-tailer", "holdfast-etcd"] {
        assert_eq!(users[name]["isSystemUser"], true, "{name}: {:#}", users[name]);
        assert_eq!(users[name]["group"], name, "{name}: each user's group is its own");
        assert!(users[name].get("extraGroups").is_none_or(|g| g == &serde_json::json!([])), "{name} is in other groups: {:#}", users[name]);
    }
    let names = |x: &Value| x.as_object().unwrap().keys().cloned().collect::<Vec<_>>();
    assert_eq!(names(users), ["holdfast-arbiter", "holdfast-controller", "holdfast-etcd", "holdfast-tailer"]);
    assert_eq!(
        names(&v["users"]["groups"]),
        ["holdfast-arbiter", "holdfast-audit", "holdfast-controller", "holdfast-etcd", "holdfast-tailer"]
    );

    // Each module alone: its own user only, never `holdfast`.
    let alone = nix.eval_each(
        &[
            "{ services.holdfast.arbiter.enable = true; }".to_string(),
            "{ services.holdfast.controller.enable = true; }".to_string(),
            "{ services.holdfast.tailer.enable = true; }".to_string(),
            format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
            format!(r#"{{ services.holdfast.provision = {{ enable = true; settings.host = "etcd-a1"; settings.tang.servers = {SAFE_TANG}; }}; }}"#),
        ],
        "{ users = builtins.attrNames r.config.users.users; groups = builtins.attrNames r.config.users.groups; }",
    );
    let want = [
        (vec!["holdfast-arbiter"], vec!["holdfast-arbiter"]),
        (vec!["holdfast-controller"], vec!["holdfast-controller"]),
        (vec!["holdfast-tailer"], vec!["holdfast-audit", "holdfast-tailer"]),
        (vec!["holdfast-etcd"], vec!["holdfast-etcd"]),
        (vec![], vec![]),
    ];
    for (got, (users, groups)) in alone.iter().zip(want) {
        assert_eq!(got["users"], serde_json::json!(users), "{got}");
        assert_eq!(got["groups"], serde_json::json!(groups), "{got}");
    }

    // The directories of tmpfiles.d: only root writes /etc/holdfast (0711:
    // traversable, not listable); the controller's policy directories are
    // its group's; /var/lib/holdfast is root's, its daemons' directories
    // are their StateDirectory=.
    let dir = |mode: &str, user: &str, group: &str| serde_json::json!({"d": {"mode": mode, "user": user, "group": group}});
    assert_eq!(
        v["tmpfiles"],
        serde_json::json!({"holdfast": {
            "/etc/holdfast": dir("0711", "root", "root"),
            "/etc/holdfast/tls": dir("0711", "root", "root"),
            "/etc/holdfast/classes.d": dir("0750", "root", "holdfast-controller"),
            "/etc/holdfast/grants.d": dir("0750", "root", "holdfast-controller"),
            "/var/lib/holdfast": dir("0755", "root", "root"),
        }})
    );
}

/// The tailer's etcd keys (of [etcd] and [coord]) reach it by
/// LoadCredential=, each named after its file (the daemon reads
/// $CREDENTIALS_DIRECTORY/<file name of key_file>); a key_file already under
/// /run/credentials is left to the operator's own LoadCredential=.
#[test]
fn tailer_gets_its_etcd_keys_by_load_credential() {
    let nix = Nix::new();
    let tailer = |settings: &str| format!("{{ services.holdfast.tailer = {{ enable = true; checkConfig = false; {settings} }}; }}");
    let got = nix.eval_each(
        &[
            tailer(&format!("settings.etcd.key_file = {TAILER_KEY:?};")),
            tailer(&format!(
                "settings.etcd.key_file = {TAILER_KEY:?}; settings.coord.key_file = {:?};",
                "/etc/holdfast/tls/coord-tailer-key.pem"
            )),
            tailer(&format!("settings.etcd.key_file = {TAILER_KEY:?}; settings.coord.key_file = {TAILER_KEY:?};")),
            tailer(r#"settings.etcd.key_file = "/run/credentials/holdfast-tailer.service/etcd-key";"#),
        ],
        "r.config.systemd.services.holdfast-tailer.serviceConfig.LoadCredential or null",
    );
    let one = format!("etcd-tailer-key.pem:{TAILER_KEY}");
    assert_eq!(got[0], serde_json::json!([one]));
    assert_eq!(got[1], serde_json::json!([one, "coord-tailer-key.pem:/etc/holdfast/tls/coord-tailer-key.pem"]));
    assert_eq!(got[2], serde_json::json!([one]));
    assert_eq!(got[3], Value::Null);
}

/// Who each service runs as and where it may write, as its unit file in
/// systemd/ says (User=, Group=, StateDirectory=, LoadCredential=, no
/// ConfigurationDirectory=, ...): the packages and NixOS make one layout.
#[test]
fn every_service_runs_as_the_user_of_its_unit_file() {
    let nix = Nix::new();
    let conf =
        all_enabled().replace("tailer.enable = true;", &format!("tailer = {{ enable = true; settings.etcd.key_file = {TAILER_KEY:?}; }};"));
    let services = nix.eval(&conf, "builtins.mapAttrs (_: s: s.serviceConfig) r.config.systemd.services");
    let mut failures = Vec::new();
    for (unit, service, instance) in [
        ("holdfast-arbiter.service", "holdfast-arbiter", ""),
        ("holdfast-controller.service", "holdfast-controller", ""),
        ("holdfast-tailer.service", "holdfast-tailer", ""),
        ("holdfast-etcd@.service", "holdfast-etcd@etcd-a1", "etcd-a1"),
    ] {
        let want = unit_identity(unit, instance);
        let got = &services[service];
        for k in IDENTITY_KEYS {
            let g = got.get(*k).map(values);
            if g.as_ref() != want.get(*k) {
                failures.push(format!("{service}: {k}: unit file {:?}, module {g:?}", want.get(*k)));
            }
        }
    }
    assert!(failures.is_empty(), "users and directories differ from systemd/:\n{}", failures.join("\n"));
}

#[test]
fn arbiter_config_is_generated_checked_at_build_time_and_restarts_the_service() {
    let nix = Nix::new();
    let v = nix.eval(
        r#"{ services.holdfast.arbiter = { enable = true; settings.cluster_name = "entity-1"; }; }"#,
        r#"let s = r.config.systemd.services.holdfast-arbiter; f = builtins.head s.restartTriggers; in {
            file = "${f}"; script = f.passthru.script; inputs = map (p: p.name) f.passthru.env.nativeBuildInputs;
            pre = s.serviceConfig.ExecStartPre; start = s.serviceConfig.ExecStart; reload = s.serviceConfig.ExecReload;
            user = s.serviceConfig.User; users = r.config.users; }"#,
    );
    println!("{v:#}");
    let file = v["file"].as_str().unwrap();
    let script = v["script"].as_str().unwrap();
    assert!(file.ends_with("-holdfast-arbiter.toml"), "{file}");
    assert!(
        script.contains("-check-config.sh ") && script.contains("/bin/holdfast-arbiter"),
        "the build step does not run the check: {script}"
    );
    assert!(script.contains("cp /nix/store/"), "{script}");
    assert_eq!(v["inputs"], serde_json::json!(["holdfast-0.1.0", "openssl", "bash"]));
    assert!(v["pre"].as_str().unwrap().ends_with(&format!("/bin/holdfast-arbiter check --config {file}")), "{}", v["pre"]);
    assert!(v["start"].as_str().unwrap().ends_with(&format!("/bin/holdfast-arbiter --config {file} --log-format plain")));
    let reload = values(&v["reload"]);
    assert!(reload[0].ends_with(&format!("check --config {file}")) && reload[1].ends_with("/bin/kill -HUP $MAINPID"), "{reload:?}");
    // Its own user and group only (each_daemon_runs_as_its_own_user).
    assert_eq!(v["user"], "holdfast-arbiter");
    assert_eq!(v["users"]["users"]["holdfast-arbiter"]["isSystemUser"], true);
    assert_eq!(v["users"]["groups"], serde_json::json!({"holdfast-arbiter": {}}));

    // Another setting, another file: a switch restarts the arbiter.
    let other = nix.eval(
        r#"{ services.holdfast.arbiter = { enable = true; settings.cluster_name = "entity-2"; }; }"#,
        r#""${builtins.head r.config.systemd.services.holdfast-arbiter.restartTriggers}""#,
    );
    assert_ne!(other.as_str().unwrap(), file);
}

/// A coord cluster of its own, as the Ansible roles render it: the
/// arbiter's and the tailer's freeform `settings.coord` reach their
/// generated TOML (the values before the build-time check, which
/// `checkConfig = false` leaves out), and two etcd members on two hosts
/// name their units `holdfast-etcd@coord-a1` and `holdfast-etcd@etcd-a1`.
#[test]
fn arbiter_and_tailer_settings_carry_a_coord_cluster() {
    let nix = Nix::new();
    let coord =
        r#"coord = { endpoints = [ "https://10.0.1.21:2379" "https://10.0.1.22:2379" ]; ca_file = "/etc/holdfast/tls/etcd-ca.pem"; }"#;
    let v = nix.eval(
        &format!(
            r#"{{ services.holdfast.arbiter = {{ enable = true; checkConfig = false; settings.{coord}; }};
                services.holdfast.tailer = {{ enable = true; checkConfig = false; settings.{coord}; }}; }}"#
        ),
        r#"let file = name: (builtins.head r.config.systemd.services.${name}.restartTriggers).passthru.value; in {
            arbiter = (file "holdfast-arbiter").coord; tailer = (file "holdfast-tailer").coord; }"#,
    );
    let want =
        serde_json::json!({"endpoints": ["https://10.0.1.21:2379", "https://10.0.1.22:2379"], "ca_file": "/etc/holdfast/tls/etcd-ca.pem"});
    assert_eq!(v["arbiter"], want, "{v:#}");
    assert_eq!(v["tailer"], want, "{v:#}");
    let units = nix.eval_each(
        &[
            format!("{{ services.holdfast.etcd = {}; }}", SAFE_ETCD.replace("name = \"etcd-a1\"", "name = \"coord-a1\"")),
            format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
        ],
        r#"builtins.filter (n: builtins.substring 0 14 n == "holdfast-etcd@") (builtins.attrNames r.config.systemd.services)"#,
    );
    assert_eq!(units, [serde_json::json!(["holdfast-etcd@coord-a1"]), serde_json::json!(["holdfast-etcd@etcd-a1"])]);
}

/// `(configuration, a fragment of the failed assertion's message)`: unsafe.
fn assertion_cases() -> Vec<(&'static str, String, String, &'static str)> {
    let controller = |class: &str| {
        format!(
            r#"{{ services.holdfast.controller = {{ enable = true; classes.x = {{ namespace = "x"; ttl = "30s"; tier = "entity"; {class} }}; }}; }}"#
        )
    };
    let provision = |servers: &str| {
        format!(
            r#"{{ services.holdfast.provision = {{ enable = true; settings.host = "etcd-a1"; settings.tang.servers = {servers}; }}; }}"#
        )
    };
    vec![
        (
            "fewer than two Tang servers",
            provision(r#"[ { url = "http://tang-a:7500"; hall = "hall-a"; } ]"#),
            provision(SAFE_TANG),
            "has 1 Tang server(s): with fewer than two",
        ),
        ("no Tang server", provision("[ ]"), provision(SAFE_TANG), "has 0 Tang server(s)"),
        (
            "Tang servers in one hall",
            provision(r#"[ { url = "http://tang-a:7500"; hall = "hall-a"; } { url = "http://tang-b:7500"; hall = "hall-a"; } ]"#),
            provision(SAFE_TANG),
            "all stand in hall hall-a",
        ),
        (
            "advisory class without an owner",
            controller(r#"purpose = "correctness"; enforcement = "advisory"; waiver_expires = "2099-12-31";"#),
            controller(r#"purpose = "correctness"; enforcement = "advisory"; waiver_expires = "2099-12-31"; risk_owner = "team-a";"#),
            "classes.x is advisory but names no risk_owner",
        ),
        (
            "on_quorum_loss = open on a fenced class",
            controller(
                r#"purpose = "efficiency"; enforcement = "fenced"; on_quorum_loss = "open"; resource = "fixture:r"; resource_schema_version = 1;"#,
            ),
            controller(
                r#"purpose = "efficiency"; enforcement = "fenced"; on_quorum_loss = "closed"; resource = "fixture:r"; resource_schema_version = 1;"#,
            ),
            "classes.x is fenced with on_quorum_loss = \"open\"",
        ),
        (
            "fenced class naming no resource",
            controller(r#"purpose = "correctness"; enforcement = "fenced"; resource_schema_version = 1;"#),
            controller(
                r#"purpose = "correctness"; enforcement = "fenced"; resource = "postgresql://db:5432/app?table=t"; resource_schema_version = 1;"#,
            ),
            "classes.x is fenced but lacks resource or resource_schema_version",
        ),
        (
            "etcd member with a plain http URL",
            format!(
                "{{ services.holdfast.etcd = {}; }}",
                SAFE_ETCD.replace("https://10.0.1.11:2379\"; ETCD_ADVERTISE", "http://10.0.1.11:2379\"; ETCD_ADVERTISE")
            ),
            format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
            "http://10.0.1.11:2379: every URL must be https://",
        ),
        (
            "etcd member admitting any certificate of its CA as a peer",
            format!("{{ services.holdfast.etcd = {}; }}", SAFE_ETCD.replace("ETCD_PEER_CERT_ALLOWED_CN = \"holdfast etcd member\";", "")),
            format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
            "lacks ETCD_PEER_CERT_ALLOWED_CN",
        ),
        (
            "etcd member setting what the unit fixes",
            format!("{{ services.holdfast.etcd = {}; }}", SAFE_ETCD.replace("settings = {", "settings = { ETCD_DATA_DIR = \"/tmp\";")),
            format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
            "settings sets ETCD_DATA_DIR",
        ),
        (
            "tailer store outside its state directory",
            r#"{ services.holdfast.tailer = { enable = true; settings.store_dir = "/srv/audit"; }; }"#.to_string(),
            r#"{ services.holdfast.tailer = { enable = true; }; }"#.to_string(),
            "store_dir = \"/srv/audit\" is not in /var/lib/holdfast/audit,",
        ),
        (
            "tailer store beside its state directory (the old shared StateDirectory=holdfast)",
            r#"{ services.holdfast.tailer = { enable = true; settings.store_dir = "/var/lib/holdfast/tailer"; }; }"#.to_string(),
            r#"{ services.holdfast.tailer = { enable = true; settings.store_dir = "/var/lib/holdfast/audit/entity-1"; }; }"#.to_string(),
            "store_dir = \"/var/lib/holdfast/tailer\" is not in /var/lib/holdfast/audit,",
        ),
        (
            "tailer store climbing out of its state directory",
            r#"{ services.holdfast.tailer = { enable = true; settings.store_dir = "/var/lib/holdfast/audit/../arbiter"; }; }"#.to_string(),
            r#"{ services.holdfast.tailer = { enable = true; settings.store_dir = "/var/lib/holdfast/audit"; }; }"#.to_string(),
            "store_dir = \"/var/lib/holdfast/audit/../arbiter\" is not in /var/lib/holdfast/audit,",
        ),
        (
            "arbiter state outside its state directory",
            r#"{ services.holdfast.arbiter = { enable = true; settings.state_dir = "/var/lib/holdfast"; }; }"#.to_string(),
            r#"{ services.holdfast.arbiter = { enable = true; settings.state_dir = "/var/lib/holdfast/arbiter"; }; }"#.to_string(),
            "state_dir = \"/var/lib/holdfast\" is not in /var/lib/holdfast/arbiter,",
        ),
        (
            "tailer etcd and coord keys with one credential name",
            format!(
                "{{ services.holdfast.tailer = {{ enable = true; settings.etcd.key_file = {:?}; settings.coord.key_file = {:?}; }}; }}",
                "/etc/holdfast/tls/entity/tailer-key.pem", "/etc/holdfast/tls/coord/tailer-key.pem"
            ),
            format!(
                "{{ services.holdfast.tailer = {{ enable = true; settings.etcd.key_file = {TAILER_KEY:?}; settings.coord.key_file = {TAILER_KEY:?}; }}; }}"
            ),
            "are different files with one file name",
        ),
    ]
}

#[test]
fn each_assertion_fails_for_its_unsafe_combination_and_holds_for_a_safe_one() {
    let nix = Nix::new();
    let cases = assertion_cases();
    let confs: Vec<String> = cases.iter().flat_map(|(_, unsafe_conf, safe_conf, _)| [unsafe_conf.clone(), safe_conf.clone()]).collect();
    let results = nix.eval_each(&confs, "r.failedAssertions");
    let mut failures = Vec::new();
    for (i, (what, _, _, fragment)) in cases.iter().enumerate() {
        let msgs: Vec<&str> = results[2 * i].as_array().unwrap().iter().filter_map(|m| m.as_str()).collect();
        match msgs.iter().find(|m| m.contains(fragment)) {
            Some(m) => println!("{what}: {m}"),
            None => failures.push(format!("{what}: no failed assertion containing {fragment:?}; failed: {msgs:?}")),
        }
        if results[2 * i + 1] != serde_json::json!([]) {
            failures.push(format!("{what}: the safe configuration fails assertions: {}", results[2 * i + 1]));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
}

fn run(cmd: &mut Command) -> (bool, String) {
    let out = cmd.output().unwrap();
    (out.status.success(), format!("{}{}", String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr)))
}

/// What the modules' build steps run: check-config.sh with the daemon's own
/// `check`, on the example configs (keys outside the sandbox get
/// stand-ins), and a refusal for a bad file.
#[test]
fn build_time_check_passes_the_examples_and_refuses_a_bad_file() {
    tool("openssl");
    let script = nixos_dir().join("check-config.sh");
    for (daemon, file) in
        [("holdfast-arbiter", "arbiter.toml"), ("holdfast-tailer", "tailer.toml"), ("holdfast-provision", "provision.toml")]
    {
        let (ok, out) = run(Command::new(tool("bash")).arg(&script).arg(repo().join("config").join(file)).arg(holdfast_tests::bin(daemon)));
        println!("{daemon} {file}:\n{out}");
        assert!(ok, "{daemon} check refused config/{file} through check-config.sh:\n{out}");
    }
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("arbiter.toml");
    let text = std::fs::read_to_string(repo().join("config/arbiter.toml")).unwrap();
    std::fs::write(&bad, text.replace("drain_timeout = \"10s\"", "drain_timeout = \"ten seconds\"")).unwrap();
    let (ok, out) = run(Command::new(tool("bash")).arg(&script).arg(&bad).arg(holdfast_tests::bin("holdfast-arbiter")));
    assert!(!ok && out.contains("drain_timeout"), "a bad drain_timeout passed the build-time check:\n{out}");
}

/// The controller's policy directory as the module builds it: classes from
/// pkgs.formats.toml (dates quoted), then policy-dir.sh, then
/// `holdfast-controller check --offline`.
#[test]
fn policy_dir_from_generated_toml_passes_the_controller_check() {
    let dir = tempfile::tempdir().unwrap();
    // What pkgs.formats.toml writes for the module's `classes` (no TOML
    // dates: a string).
    let classes = dir.path().join("classes.toml");
    std::fs::write(
        &classes,
        "[class.demo]\nenforcement = \"advisory\"\nnamespace = \"demo\"\non_quorum_loss = \"closed\"\npurpose = \"correctness\"\nrisk_owner = \"team-a\"\ntier = \"entity\"\nttl = \"30s\"\nwaiver_expires = \"2099-12-31\"\n",
    )
    .unwrap();
    let controller_toml = |policy: &Path| {
        let text = std::fs::read_to_string(repo().join("config/controller.toml")).unwrap();
        let f = dir.path().join("controller.toml");
        std::fs::write(&f, text.replace("policy_dir = \"/etc/holdfast\"", &format!("policy_dir = \"{}\"", policy.display()))).unwrap();
        f
    };
    let check = |config: &Path| {
        run(Command::new(tool("bash"))
            .arg(nixos_dir().join("check-config.sh"))
            .arg(config)
            .arg(holdfast_tests::bin("holdfast-controller"))
            .arg("--offline"))
    };

    // As generated, quoted: the controller refuses it (why policy-dir.sh exists).
    let raw = dir.path().join("raw");
    std::fs::create_dir_all(raw.join("classes.d")).unwrap();
    std::fs::create_dir_all(raw.join("grants.d")).unwrap();
    std::fs::copy(&classes, raw.join("classes.d/nixos.toml")).unwrap();
    let (ok, out) = check(&controller_toml(&raw));
    assert!(!ok && out.contains("waiver_expires"), "a quoted waiver_expires passed:\n{out}");

    let policy = dir.path().join("policy");
    let (ok, out) = run(Command::new(tool("bash")).arg(nixos_dir().join("policy-dir.sh")).arg(&classes).arg("-").arg(&policy));
    assert!(ok, "policy-dir.sh: {out}");
    let written = std::fs::read_to_string(policy.join("classes.d/nixos.toml")).unwrap();
    assert!(written.contains("waiver_expires = 2099-12-31\n"), "{written}");
    let (ok, out) = check(&controller_toml(&policy));
    println!("{out}");
    assert!(ok && out.contains("valid: 1 class(es)"), "holdfast-controller check refused the module's policy directory:\n{out}");
}

/// The Nix hash, in SRI form, of `go mod vendor` run in a copy of
/// packaging/etcd: what buildGoModule's vendorHash must be.
fn etcd_vendor_hash() -> String {
    let dir = tempfile::tempdir().unwrap();
    for f in ["go.mod", "go.sum"] {
        std::fs::copy(repo().join("packaging/etcd").join(f), dir.path().join(f)).unwrap();
    }
    // -mod=readonly: a module whose sum differs from go.sum fails here too.
    let out = Command::new(tool("go"))
        .args(["mod", "vendor"])
        .current_dir(dir.path())
        .env("GOTOOLCHAIN", "local")
        .env("GOFLAGS", "-mod=readonly")
        .output()
        .unwrap();
    assert!(out.status.success(), "go mod vendor: {}", String::from_utf8_lossy(&out.stderr));
    let nix = Nix::new();
    let out = Command::new(tool("nix-hash"))
        .args(["--type", "sha256"])
        .arg(dir.path().join("vendor"))
        .env("NIX_STATE_DIR", nix.dir.path().join("state"))
        .env("NIX_CONF_DIR", nix.dir.path().join("conf"))
        .output()
        .unwrap();
    assert!(out.status.success(), "nix-hash: {}", String::from_utf8_lossy(&out.stderr));
    let hex = String::from_utf8(out.stdout).unwrap();
    let bytes: Vec<u8> = (0..64).step_by(2).map(|i| u8::from_str_radix(&hex.trim()[i..i + 2], 16).unwrap()).collect();
    let mut b64 =
        Command::new(tool("base64")).arg("-w0").stdin(std::process::Stdio::piped()).stdout(std::process::Stdio::piped()).spawn().unwrap();
    use std::io::Write;
    b64.stdin.take().unwrap().write_all(&bytes).unwrap();
    let out = b64.wait_with_output().unwrap();
    format!("sha256-{}", String::from_utf8(out.stdout).unwrap().trim())
}

/// services.holdfast.etcd runs, by default, the etcd the packages ship:
/// built from packaging/etcd (the version its go.mod pins, its vendorHash
/// that of exactly go.sum's modules), with the pinned 3.6's lease-checkpoint
/// flags, the same as systemd/holdfast-etcd@.service's default.
#[test]
fn the_etcd_module_runs_the_pinned_etcd_built_from_packaging_etcd() {
    let nix = Nix::new();
    let v = nix.eval(
        &format!("{{ services.holdfast.etcd = {SAFE_ETCD}; }}"),
        r#"let p = r.options.services.holdfast.etcd.package.default; in {
            name = p.name; args = p.passthru.args;
            start = r.config.systemd.services."holdfast-etcd@etcd-a1".serviceConfig.ExecStart; }"#,
    );
    let version = holdfast_tests::pinned_etcd();
    let version = version.strip_prefix('v').unwrap();
    assert_eq!(v["name"], format!("holdfast-etcd-{version}"));
    assert_eq!(v["args"]["env"]["CGO_ENABLED"], 0);
    let build = v["args"]["buildPhase"].as_str().unwrap();
    for m in ["server", "etcdctl", "etcdutl"] {
        assert!(build.contains(m), "{build}");
    }
    assert!(build.contains(r#"go build -ldflags='-s -w' -o "bin/$name" "go.etcd.io/etcd/$m/v3""#), "{build}");
    let check = v["args"]["installCheckPhase"].as_str().unwrap();
    assert!(check.contains(&format!("etcd Version: {version}")), "{check}");

    let unit = std::fs::read_to_string(repo().join("systemd/holdfast-etcd@.service")).unwrap();
    let flags = unit
        .lines()
        .find_map(|l| l.strip_prefix("Environment=\"HOLDFAST_ETCD_VERSION_FLAGS=").map(|f| f.trim_end_matches('"').to_string()))
        .expect("the unit sets HOLDFAST_ETCD_VERSION_FLAGS");
    let start = v["start"].as_str().unwrap();
    assert!(start.starts_with("/nix/store/") && start.contains(&format!("-holdfast-etcd-{version}/bin/etcd ")), "{start}");
    assert!(start.ends_with(&format!(" {flags}")), "ExecStart {start} does not end with the unit's flags {flags}");

    let want = etcd_vendor_hash();
    assert_eq!(
        v["args"]["vendorHash"], want,
        "nixos/etcd-package.nix's vendorHash is not the hash of packaging/etcd's modules: set it to {want}"
    );
}
