//! The packages (docs/packaging.md): `packaging/build --profile dev` with a
//! throwaway key from `packaging/throwaway-key`, run once per test binary
//! (the build is slow: [`built`] keeps it in a `OnceLock`), then what every
//! package holds, checked with the real tools: dpkg-deb, rpm, lintian,
//! debsig-verify and rpm's signature check.
//!
//! - every expected .deb and .rpm exists, and no harness binary is in any;
//! - debsig-verify accepts each signed .deb and rejects an unsigned and a
//!   tampered one; rpm with `_pkgverify_level signature` accepts each signed
//!   .rpm and rejects an unsigned and a tampered one (plain `rpm -K` passes
//!   the unsigned one: the level matters);
//! - lintian passes, with only the overrides in packaging/lintian/;
//! - conffiles are the /etc/holdfast TOML files; man pages and completions
//!   are packaged; units are shipped disabled with a preset;
//! - the .rpm files install into a root (`rpm --root`) with their scripts
//!   run there: the users appear, no unit is enabled.
//!
//! These tests do not depend on etcd. Tools missing is a failure naming
//! scripts/install-deps. dpkg install, upgrade and purge under systemd are
//! the install test's (tests/install.rs).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::OnceLock;

/// The packages packaging/build makes, each as .deb and .rpm.
const PACKAGES: &[&str] = &[
    "holdfast-arbiter",
    "holdfast-controller",
    "holdfast-tailer",
    "holdfastctl",
    "holdfast-pausetest",
    "holdfast-provision",
    "holdfast-etcd",
    "holdfast-archive-keyring",
];

/// The packages with a binary of the same name (man pages, completions).
const BINARIES: &[&str] =
    &["holdfast-arbiter", "holdfast-controller", "holdfast-tailer", "holdfastctl", "holdfast-pausetest", "holdfast-provision"];

/// The man section of each binary's pages: daemons and system agents in 8,
/// tools in 1.
fn man_section(name: &str) -> &'static str {
    match name {
        "holdfast-arbiter" | "holdfast-controller" | "holdfast-tailer" | "holdfast-provision" => "8",
        _ => "1",
    }
}

/// The config files with a section 5 page, and the package shipping it.
const CONFIG_PAGES: &[(&str, &str)] = &[
    ("holdfast-arbiter", "holdfast-arbiter.toml"),
    ("holdfast-controller", "holdfast-controller.toml"),
    ("holdfast-tailer", "holdfast-tailer.toml"),
];

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("workspace root").to_path_buf()
}

fn tool(name: &str) -> PathBuf {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let home_cargo = std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cargo/bin"));
    std::env::split_paths(&path)
        .chain(home_cargo)
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{name} is missing: run scripts/install-deps, which installs it"))
}

struct Ran {
    what: String,
    ok: bool,
    code: Option<i32>,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Ran {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "$ {}\nexit {:?}\n--- stdout\n{}--- stderr\n{}", self.what, self.code, self.stdout, self.stderr)
    }
}

fn ran(what: String, o: Output) -> Ran {
    Ran {
        what,
        ok: o.status.success(),
        code: o.status.code(),
        stdout: String::from_utf8_lossy(&o.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
    }
}

/// Runs `cmd`, whatever its status.
fn run(cmd: &mut Command) -> Ran {
    let what = format!("{cmd:?}");
    let o = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    ran(what, o)
}

/// Runs `cmd`; panics with its output unless it exits 0.
fn must(cmd: &mut Command) -> Ran {
    let r = run(cmd);
    assert!(r.ok, "failed:\n{r}");
    r
}

/// What packaging/build made, once per test binary.
struct Built {
    /// The packages.
    out: PathBuf,
    /// The environment packaging/throwaway-key printed.
    env: Vec<(String, String)>,
    /// Scratch space for the tests.
    scratch: PathBuf,
}

impl Built {
    fn file(&self, name: &str, ext: &str) -> PathBuf {
        let found: Vec<PathBuf> = std::fs::read_dir(&self.out)
            .expect("the packages' directory")
            .flatten()
            .map(|e| e.path())
            .filter(|p| {
                p.file_name().and_then(|n| n.to_str()).is_some_and(|n| {
                    let sep = if ext == "deb" { '_' } else { '-' };
                    n.ends_with(&format!(".{ext}"))
                        && n.strip_prefix(name)
                            .is_some_and(|rest| rest.starts_with(sep) && rest[1..].starts_with(|c: char| c.is_ascii_digit()))
                })
            })
            .collect();
        assert_eq!(found.len(), 1, "exactly one {name} .{ext} in {}: {found:?}", self.out.display());
        found[0].clone()
    }

    fn deb(&self, name: &str) -> PathBuf {
        self.file(name, "deb")
    }

    fn rpm(&self, name: &str) -> PathBuf {
        self.file(name, "rpm")
    }

    fn key_id(&self) -> String {
        self.env.iter().find(|(k, _)| k == "HOLDFAST_SIGNING_KEY_ID").map(|(_, v)| v.clone()).expect("HOLDFAST_SIGNING_KEY_ID")
    }

    /// A fresh directory under the scratch space.
    fn scratch(&self, name: &str) -> PathBuf {
        let d = self.scratch.join(name);
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        d
    }
}

fn built() -> &'static Built {
    // A failed build is kept too: every test reports it, none builds again.
    static BUILT: OnceLock<Result<Built, String>> = OnceLock::new();
    match BUILT.get_or_init(|| std::panic::catch_unwind(build).map_err(|e| panic_text(&*e))) {
        Ok(b) => b,
        Err(e) => panic!("packaging/build failed (once for every test):\n{e}"),
    }
}

fn panic_text(e: &(dyn std::any::Any + Send)) -> String {
    e.downcast_ref::<String>().cloned().or_else(|| e.downcast_ref::<&str>().map(|s| s.to_string())).unwrap_or_default()
}

/// The environment `packaging/throwaway-key` printed (`export K=V` lines).
fn exports(printed: &str) -> Vec<(String, String)> {
    printed.lines().filter_map(|l| l.strip_prefix("export ")?.split_once('=')).map(|(k, v)| (k.to_string(), v.to_string())).collect()
}

/// The packages under test: HOLDFAST_PACKAGES_DIR (what `packaging/build`
/// wrote, as scripts/test builds once for this test and the install test)
/// signed with the throwaway key in HOLDFAST_PACKAGES_KEY; else built here.
fn build() -> Built {
    for t in ["cargo-deb", "cargo-generate-rpm", "debsigs", "debsig-verify", "rpm", "rpmsign", "lintian", "dpkg-deb", "gpg"] {
        tool(t);
    }
    // Kept for the whole test binary; removed by the OS's /tmp cleaning.
    let dir = tempfile::Builder::new().prefix("holdfast-packaging-").tempdir().expect("tempdir").keep();
    let scratch = dir.join("scratch");
    std::fs::create_dir_all(&scratch).expect("scratch");
    if let Some(out) = std::env::var_os("HOLDFAST_PACKAGES_DIR") {
        let key = std::env::var_os("HOLDFAST_PACKAGES_KEY").map(PathBuf::from).expect(
            "HOLDFAST_PACKAGES_DIR needs HOLDFAST_PACKAGES_KEY: the packaging/throwaway-key directory the packages were signed with",
        );
        let env = exports(&std::fs::read_to_string(key.join("env")).expect("the throwaway key's env file"));
        eprintln!("packages from HOLDFAST_PACKAGES_DIR={}", PathBuf::from(&out).display());
        return Built { out: PathBuf::from(out), env, scratch };
    }
    let key = dir.join("key");
    let printed = must(Command::new(workspace().join("packaging/throwaway-key")).arg(&key));
    let env = exports(&printed.stdout);
    for k in ["GNUPGHOME", "HOLDFAST_SIGNING_KEY", "HOLDFAST_SIGNING_KEY_ID"] {
        assert!(env.iter().any(|(n, _)| n == k), "packaging/throwaway-key printed no {k}:\n{printed}");
    }
    let out = dir.join("packages");
    let mut build = Command::new(workspace().join("packaging/build"));
    build.args(["--profile", "dev", "--out"]).arg(&out).current_dir(workspace());
    build.envs(env.iter().map(|(k, v)| (k.as_str(), v.as_str())));
    let started = std::time::Instant::now();
    let r = must(&mut build);
    eprintln!("packaging/build --profile dev: {:.0?}\n{}", started.elapsed(), r.stderr);
    // Nothing signs after this: stop the throwaway keyring's gpg-agent.
    let _ = Command::new("gpgconf").args(["--kill", "gpg-agent"]).env("GNUPGHOME", &key).status();
    Built { out, env, scratch }
}

/// `dpkg-deb -c`: the paths a .deb installs (without the leading `.`).
fn deb_files(deb: &Path) -> Vec<String> {
    must(Command::new("dpkg-deb").arg("-c").arg(deb))
        .stdout
        .lines()
        .filter_map(|l| l.split_whitespace().nth(5))
        .map(|p| p.trim_start_matches('.').to_string())
        .collect()
}

/// `rpm -qlp`: the paths an .rpm installs.
fn rpm_files(rpm: &Path) -> Vec<String> {
    must(Command::new("rpm").args(["-qlp"]).arg(rpm)).stdout.lines().map(str::to_string).collect()
}

/// `dpkg-deb -I DEB FILE`: a control member (conffiles, postinst…), or "" if absent.
fn control_member(deb: &Path, member: &str) -> String {
    let r = run(Command::new("dpkg-deb").arg("-I").arg(deb).arg(member));
    if r.ok { r.stdout } else { String::new() }
}

/// The unit files in systemd/ each package ships.
fn units_of(name: &str) -> Vec<&'static str> {
    match name {
        "holdfast-arbiter" => vec!["holdfast-arbiter.service", "holdfast-arbiter.socket"],
        "holdfast-controller" => vec!["holdfast-controller.service"],
        "holdfast-tailer" => vec!["holdfast-tailer.service"],
        "holdfastctl" => vec!["holdfast-epoch-advance@.service", "holdfast-risk-register.service", "holdfast-risk-register.timer"],
        "holdfast-provision" => vec!["holdfast-provision.service"],
        "holdfast-etcd" => vec!["holdfast-etcd@.service", "holdfast-etcd-defrag@.service", "holdfast-etcd-defrag@.timer"],
        _ => vec![],
    }
}

/// Copies a copy of `from` into `to` with one byte flipped in the middle of
/// the member named `member` (an ar member of a .deb), or in the payload
/// near the end (an .rpm, when `member` is None).
fn tampered(from: &Path, to: &Path, member: Option<&str>) {
    let mut bytes = std::fs::read(from).expect("read package");
    let at = match member {
        Some(m) => {
            let start = bytes.windows(m.len()).position(|w| w == m.as_bytes()).unwrap_or_else(|| panic!("no {m} in {}", from.display()));
            // ar member header: 16 name, 12 mtime, 6 uid, 6 gid, 8 mode, 10 size, 2 magic.
            let size: usize = String::from_utf8_lossy(&bytes[start + 48..start + 58]).trim().parse().expect("ar member size");
            start + 60 + size / 2
        }
        None => bytes.len() - 64,
    };
    bytes[at] ^= 0x5a;
    std::fs::write(to, bytes).expect("write tampered package");
}

#[test]
fn every_package_is_built_as_deb_and_rpm() {
    let b = built();
    for name in PACKAGES {
        let deb = b.deb(name);
        let info = must(Command::new("dpkg-deb").args(["-f"]).arg(&deb).args(["Package", "Version"])).stdout;
        assert!(info.contains(&format!("Package: {name}")), "{}: {info}", deb.display());
        let rpm = b.rpm(name);
        let q = must(Command::new("rpm").args(["-qp", "--qf", "%{NAME} %{VERSION}\n"]).arg(&rpm)).stdout;
        assert!(q.starts_with(&format!("{name} ")), "{}: {q}", rpm.display());
    }
    let sums = std::fs::read_to_string(b.out.join("SHA256SUMS")).expect("SHA256SUMS");
    must(Command::new("sha256sum").arg("-c").arg("SHA256SUMS").current_dir(&b.out));
    assert_eq!(sums.lines().count(), PACKAGES.len() * 2 + 1, "SHA256SUMS lists every package and the key:\n{sums}");
}

#[test]
fn no_harness_binary_is_in_any_package() {
    let b = built();
    let harness: BTreeSet<String> = std::fs::read_dir(workspace().join("harness"))
        .expect("harness/")
        .flatten()
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    assert!(harness.contains("holdfast-gate") && harness.contains("holdfast-bench"), "harness/: {harness:?}");
    for name in PACKAGES {
        for (pkg, files) in [(b.deb(name), deb_files(&b.deb(name))), (b.rpm(name), rpm_files(&b.rpm(name)))] {
            for f in &files {
                let base = f.rsplit('/').next().unwrap_or(f);
                let stem = base.split('.').next().unwrap_or(base).trim_start_matches('_');
                assert!(!harness.contains(stem), "{} ships {f}, from the harness", pkg.display());
            }
            if BINARIES.contains(name) {
                assert!(files.iter().any(|f| f == &format!("/usr/bin/{name}")), "{} lacks /usr/bin/{name}: {files:?}", pkg.display());
            }
            let bins: Vec<&String> = files.iter().filter(|f| f.starts_with("/usr/bin/") && f.len() > "/usr/bin/".len()).collect();
            assert!(bins.len() <= 1, "{} ships more than its own binary: {bins:?}", pkg.display());
        }
    }
}

#[test]
fn the_packaged_arbiter_is_built_without_the_mutations_feature() {
    // Packages never carry the mutations feature. Only an arbiter built
    // without it contains the refusal of a [mutation] table (the code that
    // says so is compiled out of the test builds).
    let b = built();
    let tree = b.scratch("arbiter-tree");
    must(Command::new("dpkg-deb").arg("-x").arg(b.deb("holdfast-arbiter")).arg(&tree));
    let refusal: &[u8] = b"but this arbiter was built without the `mutations` feature";
    for (what, path) in [
        ("deb", tree.join("usr/bin/holdfast-arbiter")),
        ("rpm", {
            let rpm_tree = b.scratch("arbiter-rpm-tree");
            // rpm2archive (Debian's rpm2cpio package) writes the payload as a tar.
            must(
                Command::new("sh")
                    .arg("-c")
                    .arg("rpm2archive - <\"$1\" | tar -xzf -")
                    .arg("sh")
                    .arg(b.rpm("holdfast-arbiter"))
                    .current_dir(&rpm_tree),
            );
            rpm_tree.join("usr/bin/holdfast-arbiter")
        }),
    ] {
        let bytes = std::fs::read(&path).unwrap_or_else(|e| panic!("{what}: {}: {e}", path.display()));
        assert!(bytes.windows(refusal.len()).any(|w| w == refusal), "the {what}'s arbiter was built with the mutations feature");
    }
}

#[test]
fn debsig_verify_accepts_signed_debs_and_rejects_unsigned_and_tampered() {
    let b = built();
    // Verify against the keyring package's own files, as an operator's host
    // would after installing holdfast-archive-keyring.
    let root = b.scratch("keyring-root");
    must(Command::new("dpkg-deb").arg("-x").arg(b.deb("holdfast-archive-keyring")).arg(&root));
    let id = b.key_id();
    let policies = root.join("etc/debsig/policies");
    let keyrings = root.join("usr/share/debsig/keyrings");
    assert!(policies.join(&id).join("holdfast.pol").is_file(), "the keyring package has /etc/debsig/policies/{id}/holdfast.pol");
    assert!(keyrings.join(&id).join("debsig.gpg").is_file(), "the keyring package has /usr/share/debsig/keyrings/{id}/debsig.gpg");
    let verify =
        |deb: &Path| run(Command::new("debsig-verify").arg("--policies-dir").arg(&policies).arg("--keyrings-dir").arg(&keyrings).arg(deb));
    for name in PACKAGES {
        let deb = b.deb(name);
        let r = verify(&deb);
        assert!(r.ok, "debsig-verify rejects the signed {name}:\n{r}");

        let unsigned = b.scratch("unsigned").join(deb.file_name().expect("name"));
        std::fs::copy(&deb, &unsigned).expect("copy");
        must(Command::new("ar").arg("d").arg(&unsigned).arg("_gpgorigin"));
        let members = must(Command::new("ar").arg("t").arg(&unsigned)).stdout;
        assert!(!members.contains("_gpgorigin"), "{members}");
        let r = verify(&unsigned);
        assert!(!r.ok, "debsig-verify accepts an unsigned {name}:\n{r}");

        let bad = b.scratch("tampered").join(deb.file_name().expect("name"));
        tampered(&deb, &bad, Some("data.tar"));
        let r = verify(&bad);
        assert!(!r.ok, "debsig-verify accepts a tampered {name}:\n{r}");
    }
}

#[test]
fn rpm_signature_check_accepts_signed_rpms_and_rejects_unsigned_and_tampered() {
    let b = built();
    let db = b.scratch("rpmdb");
    must(Command::new("rpm").arg("--dbpath").arg(&db).arg("--initdb"));
    must(Command::new("rpm").arg("--dbpath").arg(&db).arg("--import").arg(b.out.join("holdfast-signing-key.asc")));
    let check =
        |rpm: &Path| run(Command::new("rpm").arg("--dbpath").arg(&db).args(["--define", "_pkgverify_level signature", "-K"]).arg(rpm));
    for name in PACKAGES {
        let rpm = b.rpm(name);
        let r = check(&rpm);
        assert!(r.ok, "rpm -K rejects the signed {name}:\n{r}");
        let sig = must(Command::new("rpm").args(["-qp", "--qf", "%{RSAHEADER:pgpsig}\n"]).arg(&rpm)).stdout;
        assert!(sig.to_lowercase().contains(&b.key_id().to_lowercase()), "{name} is signed by another key: {sig}");

        let unsigned = b.scratch("unsigned-rpm").join(rpm.file_name().expect("name"));
        std::fs::copy(&rpm, &unsigned).expect("copy");
        must(Command::new("rpmsign").arg("--delsign").arg(&unsigned));
        let r = check(&unsigned);
        assert!(!r.ok, "rpm -K with _pkgverify_level signature accepts an unsigned {name}:\n{r}");
        // Why the level is needed: without it the digests alone pass.
        let plain = run(Command::new("rpm").arg("--dbpath").arg(&db).arg("-K").arg(&unsigned));
        assert!(plain.ok, "plain rpm -K passes an unsigned package (that is why the test sets the level):\n{plain}");

        let bad = b.scratch("tampered-rpm").join(rpm.file_name().expect("name"));
        tampered(&rpm, &bad, None);
        let r = check(&bad);
        assert!(!r.ok, "rpm -K accepts a tampered {name}:\n{r}");
    }
}

#[test]
fn lintian_passes_with_only_justified_overrides() {
    let b = built();
    let debs: Vec<PathBuf> = PACKAGES.iter().map(|n| b.deb(n)).collect();
    // Errors and warnings fail; the overrides the packages ship apply.
    let r = run(Command::new("lintian").args(["--fail-on", "error,warning", "--tag-display-limit", "0"]).args(&debs));
    assert!(r.ok, "lintian:\n{r}");
    assert!(!r.stdout.lines().any(|l| l.starts_with("E: ") || l.starts_with("W: ")), "lintian:\n{r}");
    // Every override the packages carry says why.
    let overrides = workspace().join("packaging/lintian");
    for e in std::fs::read_dir(&overrides).expect("packaging/lintian").flatten() {
        let text = std::fs::read_to_string(e.path()).expect("overrides file");
        let mut justified = false;
        for line in text.lines() {
            if line.starts_with('#') {
                justified = true;
            } else if !line.trim().is_empty() {
                assert!(justified, "{}: override without a comment saying why: {line}", e.path().display());
                justified = false;
            }
        }
    }
}

#[test]
fn conffiles_are_the_etc_holdfast_tomls() {
    let b = built();
    for (name, want) in [
        ("holdfast-arbiter", vec!["/etc/holdfast/arbiter.toml"]),
        ("holdfast-controller", vec!["/etc/holdfast/controller.toml"]),
        ("holdfast-tailer", vec!["/etc/holdfast/tailer.toml"]),
        ("holdfast-provision", vec!["/etc/holdfast/provision.toml"]),
    ] {
        let conffiles = control_member(&b.deb(name), "conffiles");
        for f in &want {
            assert!(conffiles.lines().any(|l| l.trim() == *f), "{name}: conffiles lack {f}:\n{conffiles}");
        }
        // The rpm marks the same files %config(noreplace).
        let configs = must(Command::new("rpm").args(["-qp", "--configfiles"]).arg(b.rpm(name))).stdout;
        let dump = must(Command::new("rpm").args(["-qp", "--qf", "[%{FILENAMES} %{FILEFLAGS:fflags}\n]"]).arg(b.rpm(name))).stdout;
        for f in &want {
            assert!(configs.lines().any(|l| l == *f), "{name}.rpm: {f} is not %config:\n{configs}");
            assert!(dump.lines().any(|l| l.starts_with(&format!("{f} ")) && l.contains('n')), "{name}.rpm: {f} is not noreplace:\n{dump}");
        }
    }
    // The members' env files are the operator's (holdfast-provision plan
    // writes them): holdfast-etcd ships an example, and tmpfiles.d makes
    // /etc/holdfast/etcd (root only) at install.
    let etcd = deb_files(&b.deb("holdfast-etcd"));
    assert!(etcd.iter().any(|f| f == "/usr/share/doc/holdfast-etcd/examples/member.env.example"), "{etcd:#?}");
    assert!(
        !etcd.iter().any(|f| f.starts_with("/etc/holdfast/etcd/") && !f.ends_with('/')),
        "holdfast-etcd ships a member file: {etcd:#?}"
    );
    let keyring = control_member(&b.deb("holdfast-archive-keyring"), "conffiles");
    assert!(keyring.contains(&format!("/etc/debsig/policies/{}/holdfast.pol", b.key_id())), "keyring conffiles:\n{keyring}");
}

#[test]
fn man_pages_and_completions_are_packaged() {
    let b = built();
    for name in BINARIES {
        let deb = deb_files(&b.deb(name));
        let rpm = rpm_files(&b.rpm(name));
        let n = man_section(name);
        let man = format!("/usr/share/man/man{n}/{name}.{n}.gz");
        for (what, files, man, zsh) in [
            ("deb", &deb, man.clone(), format!("/usr/share/zsh/vendor-completions/_{name}")),
            ("rpm", &rpm, man, format!("/usr/share/zsh/site-functions/_{name}")),
        ] {
            for f in [
                man,
                format!("/usr/share/bash-completion/completions/{name}"),
                zsh,
                format!("/usr/share/fish/vendor_completions.d/{name}.fish"),
            ] {
                assert!(files.contains(&f), "{name}.{what} lacks {f}:\n{files:#?}");
            }
            assert!(!files.iter().any(|f| f.contains("generate-docs")), "{name}.{what}: the hidden generate-docs has a page");
            let other = if n == "8" { "/usr/share/man/man1/" } else { "/usr/share/man/man8/" };
            assert!(!files.iter().any(|f| f.starts_with(other) && f.ends_with(".gz")), "{name}.{what}: pages outside section {n}");
        }
    }
    // Each daemon's config file has a section 5 page: the book's
    // configuration reference for that file, every key on it.
    for (package, file) in CONFIG_PAGES {
        for files in [deb_files(&b.deb(package)), rpm_files(&b.rpm(package))] {
            assert!(files.contains(&format!("/usr/share/man/man5/{file}.5.gz")), "{package} lacks {file}(5):\n{files:#?}");
        }
    }
    let arbiter_tree = b.scratch("arbiter-tree");
    must(Command::new("dpkg-deb").arg("-x").arg(b.deb("holdfast-arbiter")).arg(&arbiter_tree));
    let page = must(
        Command::new("sh")
            .arg("-c")
            .arg("gzip -dc \"$1\"")
            .arg("sh")
            .arg(arbiter_tree.join("usr/share/man/man5/holdfast-arbiter.toml.5.gz")),
    )
    .stdout;
    for key in ["tls.cert_file", "fail_open.after", "limits.max_connection_age", "etcd.request_timeout"] {
        assert!(page.contains(&format!("\\fB{key}")), "holdfast-arbiter.toml(5) lacks {key}:\n{page}");
    }
    // One page per subcommand: holdfastctl's `lock` has its own page.
    let ctl = deb_files(&b.deb("holdfastctl"));
    assert!(ctl.iter().any(|f| f == "/usr/share/man/man1/holdfastctl-lock.1.gz"), "{ctl:#?}");
    // The page is the clap definition's text.
    let tree = b.scratch("ctl-tree");
    must(Command::new("dpkg-deb").arg("-x").arg(b.deb("holdfastctl")).arg(&tree));
    let page =
        must(Command::new("sh").arg("-c").arg("gzip -dc \"$1\"").arg("sh").arg(tree.join("usr/share/man/man1/holdfastctl.1.gz"))).stdout;
    assert!(page.contains("fencing tokens"), "holdfastctl.1 is not holdfastctl's --help:\n{page}");
    // The shipped holdfastctl leaves the dev appliance out (built without
    // the `dev` feature): no page, and the command says where it lives.
    assert!(!ctl.iter().any(|f| f.contains("holdfastctl-dev")), "a dev page is packaged: {ctl:#?}");
    let dev = Command::new(tree.join("usr/bin/holdfastctl")).args(["dev", "--detach"]).output().unwrap();
    let err = String::from_utf8_lossy(&dev.stderr);
    assert_eq!(dev.status.code(), Some(64), "{err}");
    assert!(err.contains("built without the dev appliance") && err.contains("scripts/dev"), "{err}");
}

#[test]
fn units_are_shipped_disabled_with_a_preset_and_users_from_sysusers() {
    let b = built();
    for name in PACKAGES {
        let units = units_of(name);
        let files = deb_files(&b.deb(name));
        for u in &units {
            assert!(files.contains(&format!("/usr/lib/systemd/system/{u}")), "{name}.deb lacks {u}:\n{files:#?}");
        }
        if units.is_empty() {
            continue;
        }
        assert!(files.contains(&format!("/usr/lib/sysusers.d/{name}.conf")), "{name}.deb lacks its sysusers.d file");
        let preset = files
            .iter()
            .find(|f| f.starts_with("/usr/lib/systemd/system-preset/") && f.ends_with(".preset"))
            .unwrap_or_else(|| panic!("{name}.deb: no preset"));
        let tree = b.scratch("preset-tree");
        must(Command::new("dpkg-deb").arg("-x").arg(b.deb(name)).arg(&tree));
        let text = std::fs::read_to_string(tree.join(preset.trim_start_matches('/'))).expect("preset");
        for u in units.iter().filter(|u| !u.contains('@')) {
            assert!(
                text.lines().any(|l| l.starts_with("disable ") && glob_match(l["disable ".len()..].trim(), u)),
                "{name}: the preset does not disable {u}:\n{text}"
            );
        }
        let postinst = control_member(&b.deb(name), "postinst");
        assert!(
            postinst.contains(&format!("systemd-sysusers ${{DPKG_ROOT:+--root=\"$DPKG_ROOT\"}} {name}.conf")),
            "{name} postinst:\n{postinst}"
        );
        assert!(!postinst.contains("deb-systemd-invoke start"), "{name}'s postinst starts a unit:\n{postinst}");
        assert!(
            !postinst.contains("deb-systemd-helper enable") || postinst.contains("was-enabled"),
            "{name}'s postinst enables a unit:\n{postinst}"
        );
    }
}

#[test]
fn provision_ships_the_etcd_drop_in_and_is_never_restarted_on_upgrade() {
    // The etcd members require holdfast-provision.service through this
    // drop-in: restarting it on an upgrade would restart every member.
    let b = built();
    let dropin = "/usr/lib/systemd/system/holdfast-etcd@.service.d/10-holdfast-provision.conf";
    assert!(deb_files(&b.deb("holdfast-provision")).iter().any(|f| f == dropin), "holdfast-provision.deb lacks {dropin}");
    assert!(rpm_files(&b.rpm("holdfast-provision")).iter().any(|f| f == dropin), "holdfast-provision.rpm lacks {dropin}");
    for member in ["postinst", "prerm", "postrm"] {
        let script = control_member(&b.deb("holdfast-provision"), member);
        for verb in ["restart", "stop", "deb-systemd-invoke start"] {
            let hits: Vec<&str> =
                script.lines().filter(|l| l.contains("deb-systemd-invoke") && l.contains(verb) && !l.contains("#")).collect();
            assert!(hits.is_empty() || (member == "prerm" && verb == "stop"), "holdfast-provision {member} runs {verb}:\n{script}");
        }
    }
    let scripts = must(Command::new("rpm").args(["-qp", "--scripts"]).arg(b.rpm("holdfast-provision"))).stdout;
    assert!(!scripts.contains("try-restart"), "holdfast-provision.rpm restarts on upgrade:\n{scripts}");
}

#[test]
fn an_upgrade_restarts_the_arbiter_but_never_its_socket() {
    // holdfast-arbiter.socket holds the gRPC port while the service
    // restarts; restarting the socket too closes the port for a moment (the
    // install test once saw 1 connection of 4,760 refused during an upgrade).
    let b = built();
    let restarts = |script: &str| -> Vec<String> {
        script
            .lines()
            .map(str::trim)
            .filter(|l| !l.starts_with('#') && (l.contains("restart") || l.contains("deb-systemd-invoke stop")))
            .map(String::from)
            .collect()
    };
    let postinst = control_member(&b.deb("holdfast-arbiter"), "postinst");
    let deb = restarts(&postinst);
    assert!(
        deb.iter().any(|l| l.contains("try-restart holdfast-arbiter.service")),
        "holdfast-arbiter's postinst does not restart the running arbiter after an upgrade:\n{postinst}"
    );
    assert!(deb.iter().all(|l| !l.contains(".socket")), "holdfast-arbiter's postinst restarts the socket:\n{postinst}");
    let prerm = control_member(&b.deb("holdfast-arbiter"), "prerm");
    for l in prerm.lines().filter(|l| l.contains("deb-systemd-invoke stop")) {
        assert!(prerm.contains("\"$1\" = remove"), "holdfast-arbiter's prerm stops units on upgrade too ({l}):\n{prerm}");
    }
    let scripts = must(Command::new("rpm").args(["-qp", "--scripts"]).arg(b.rpm("holdfast-arbiter"))).stdout;
    let rpm = restarts(&scripts);
    assert!(
        rpm.iter().any(|l| l.contains("try-restart holdfast-arbiter.service")),
        "holdfast-arbiter.rpm does not restart the arbiter after an upgrade:\n{scripts}"
    );
    assert!(rpm.iter().all(|l| !l.contains(".socket")), "holdfast-arbiter.rpm restarts the socket:\n{scripts}");
}

/// A systemd preset pattern (`*` and `?` only) against a unit name.
fn glob_match(pattern: &str, name: &str) -> bool {
    fn m(p: &[u8], n: &[u8]) -> bool {
        match (p.first(), n.first()) {
            (None, None) => true,
            (Some(b'*'), _) => m(&p[1..], n) || (!n.is_empty() && m(p, &n[1..])),
            (Some(b'?'), Some(_)) => m(&p[1..], &n[1..]),
            (Some(a), Some(b)) if a == b => m(&p[1..], &n[1..]),
            _ => false,
        }
    }
    m(pattern.as_bytes(), name.as_bytes())
}

/// A minimal root for `rpm --root`: /bin/sh, systemd-sysusers,
/// systemd-tmpfiles and systemctl with the libraries they load, so the
/// packages' scriptlets run for real.
fn scriptlet_root(dir: &Path) {
    for d in ["usr/bin", "usr/lib", "usr/lib64", "etc", "run", "var/tmp", "tmp"] {
        std::fs::create_dir_all(dir.join(d)).expect("mkdir");
    }
    for (link, to) in [("bin", "usr/bin"), ("lib", "usr/lib"), ("lib64", "usr/lib64"), ("sbin", "usr/bin")] {
        std::os::unix::fs::symlink(to, dir.join(link)).expect("symlink");
    }
    let copy = |from: &Path| {
        let to = dir.join(from.strip_prefix("/").expect("absolute"));
        std::fs::create_dir_all(to.parent().expect("parent")).expect("mkdir");
        if !to.exists() {
            std::fs::copy(from, &to).unwrap_or_else(|e| panic!("copy {}: {e}", from.display()));
        }
    };
    for bin in ["/bin/sh", "/usr/bin/dash", "/usr/bin/systemd-sysusers", "/usr/bin/systemd-tmpfiles", "/usr/bin/systemctl"] {
        let real = std::fs::canonicalize(bin).unwrap_or_else(|e| panic!("{bin}: {e}: run scripts/install-deps"));
        copy(&real);
        if real != Path::new(bin) {
            let to = dir.join(bin.trim_start_matches('/'));
            if !to.exists() {
                std::fs::copy(&real, &to).expect("copy");
            }
        }
        for line in must(Command::new("ldd").arg(&real)).stdout.lines() {
            let lib = line.split("=>").nth(1).unwrap_or(line).split_whitespace().next().unwrap_or("");
            if lib.starts_with('/') {
                let lib = Path::new(lib);
                copy(lib);
                if let Ok(real) = std::fs::canonicalize(lib) {
                    copy(&real);
                }
            }
        }
    }
    // /bin/sh is dash in the root too (a symlink copied as a file above).
    std::fs::write(dir.join("etc/passwd"), "root:x:0:0:root:/root:/bin/sh\n").expect("passwd");
    std::fs::write(dir.join("etc/group"), "root:x:0:\n").expect("group");
}

#[test]
fn rpms_install_into_a_root_with_their_scripts() {
    let b = built();
    let root = b.scratch("rpm-root");
    scriptlet_root(&root);
    let rpms: Vec<PathBuf> = PACKAGES.iter().map(|n| b.rpm(n)).collect();
    for (name, rpm) in PACKAGES.iter().zip(&rpms) {
        let scripts = must(Command::new("rpm").args(["-qp", "--scripts"]).arg(rpm)).stdout;
        if units_of(name).is_empty() {
            assert!(!scripts.contains("systemctl"), "{name}.rpm has unit scripts but no units:\n{scripts}");
            continue;
        }
        assert!(scripts.contains("postinstall scriptlet"), "{name}.rpm has no %post:\n{scripts}");
        assert!(scripts.contains(&format!("systemd-sysusers {name}.conf")), "{name}.rpm %post does not create its users:\n{scripts}");
        assert!(scripts.contains("preset"), "{name}.rpm %post does not apply the presets:\n{scripts}");
        if units_of(name).iter().any(|u| !u.contains('@')) {
            assert!(scripts.contains("preuninstall scriptlet") && scripts.contains("disable --now"), "{name}.rpm %preun:\n{scripts}");
        }
        assert!(
            !scripts.contains("enable --now") && !scripts.contains("systemctl start"),
            "{name}.rpm starts or enables a unit:\n{scripts}"
        );
    }
    // systemd-tmpfiles refuses to run without /proc, as on any real host.
    let _proc = ProcMount::new(&root.join("proc"));
    let r = must(Command::new("rpm").arg("--root").arg(&root).args(["--nodeps", "-i"]).args(&rpms));
    assert!(!r.stderr.contains("scriptlet failed") && !r.stderr.contains("warning: %post"), "a scriptlet failed:\n{r}");
    let installed = must(Command::new("rpm").arg("--root").arg(&root).args(["-qa", "--qf", "%{NAME}\n"])).stdout;
    for name in PACKAGES {
        assert!(installed.lines().any(|l| l == *name), "{name} not installed in the root:\n{installed}");
        for f in rpm_files(&b.rpm(name)) {
            let p = root.join(f.trim_start_matches('/'));
            assert!(p.symlink_metadata().is_ok(), "{name}: {f} not in the root after rpm -i");
        }
    }
    // %post ran systemd-sysusers in the root: the daemons' users exist.
    let passwd = std::fs::read_to_string(root.join("etc/passwd")).expect("passwd");
    let mut users = BTreeSet::new();
    for name in PACKAGES {
        let conf = root.join(format!("usr/lib/sysusers.d/{name}.conf"));
        if let Ok(text) = std::fs::read_to_string(&conf) {
            for l in text.lines().filter(|l| l.starts_with("u ")) {
                users.insert(l.split_whitespace().nth(1).expect("user name").to_string());
            }
        }
    }
    assert!(!users.is_empty(), "no sysusers.d user in the packages");
    for u in &users {
        assert!(passwd.lines().any(|l| l.starts_with(&format!("{u}:"))), "%post did not create user {u}:\n{passwd}");
    }
    assert!(!users.contains("holdfast"), "the shared holdfast user is back: {users:?}");
    for daemon in ["holdfast-arbiter", "holdfast-controller", "holdfast-tailer", "holdfast-epoch", "holdfast-etcd"] {
        assert!(users.contains(daemon), "no user {daemon} in the packages' sysusers.d: {users:?}");
    }
    // …and systemd-tmpfiles: /etc/holdfast is root:root 0711, the audit readers' group exists.
    let etc = std::fs::metadata(root.join("etc/holdfast")).expect("/etc/holdfast in the root");
    use std::os::unix::fs::MetadataExt;
    assert_eq!((etc.mode() & 0o7777, etc.uid(), etc.gid()), (0o711, 0, 0), "/etc/holdfast (mode, uid, gid) after %post");
    let group = std::fs::read_to_string(root.join("etc/group")).expect("group");
    assert!(group.lines().any(|l| l.starts_with("holdfast-audit:")), "%post did not create group holdfast-audit:\n{group}");
    // …and applied the presets offline: nothing is enabled.
    let wants: Vec<String> = walk(&root.join("etc/systemd/system")).into_iter().filter(|p| p.contains("holdfast")).collect();
    assert!(wants.is_empty(), "units enabled by the rpm scripts: {wants:?}");
    // Removing runs %preun/%postun in the root and leaves the edited config.
    let config = root.join("etc/holdfast/arbiter.toml");
    std::fs::write(&config, "# edited\n").expect("edit conffile");
    must(Command::new("rpm").arg("--root").arg(&root).args(["--nodeps", "-e", "holdfast-arbiter"]));
    assert!(root.join("etc/holdfast/arbiter.toml.rpmsave").is_file(), "the edited arbiter.toml was not kept as .rpmsave");
    assert!(!root.join("usr/bin/holdfast-arbiter").exists(), "rpm -e left the binary");
}

/// /proc mounted in the scriptlet root while the guard lives.
struct ProcMount(PathBuf);

impl ProcMount {
    fn new(at: &Path) -> Self {
        std::fs::create_dir_all(at).expect("mkdir proc");
        must(Command::new("mount").args(["-t", "proc", "proc"]).arg(at));
        ProcMount(at.to_path_buf())
    }
}

impl Drop for ProcMount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn walk(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    if let Ok(rd) = std::fs::read_dir(dir) {
        for e in rd.flatten() {
            let p = e.path();
            out.push(p.display().to_string());
            if p.is_dir() && !p.is_symlink() {
                out.extend(walk(&p));
            }
        }
    }
    out
}

#[test]
fn build_refuses_without_a_signing_key() {
    let r = run(Command::new(workspace().join("packaging/build"))
        .args(["--profile", "dev", "--out", "/nonexistent/never-written"])
        .env_remove("HOLDFAST_SIGNING_KEY")
        .env_remove("GNUPGHOME")
        .current_dir(workspace()));
    assert!(!r.ok, "packaging/build ran without a key:\n{r}");
    assert!(r.stderr.contains("HOLDFAST_SIGNING_KEY") && r.stderr.contains("throwaway-key"), "the refusal says what to set:\n{r}");
    assert!(!Path::new("/nonexistent/never-written").exists());
    // A GNUPGHOME without the key's secret is refused before anything is built.
    let b = built();
    let weak = b.scratch("weak-gnupghome");
    let r = run(Command::new(workspace().join("packaging/build"))
        .args(["--profile", "dev", "--out"])
        .arg(b.scratch("weak-out"))
        .env("GNUPGHOME", &weak)
        .env("HOLDFAST_SIGNING_KEY", &b.env.iter().find(|(k, _)| k == "HOLDFAST_SIGNING_KEY").expect("key").1)
        .current_dir(workspace()));
    assert!(!r.ok, "packaging/build ran with a keyring lacking the key:\n{r}");
    assert!(r.stderr.contains("no secret key"), "the refusal names the missing key:\n{r}");
}

/// holdfast-etcd ships the pinned etcd server, etcdctl and etcdutl in
/// /usr/lib/holdfast/etcd, runs that server from its unit, and depends on
/// no distribution etcd (neither the .deb nor the .rpm).
#[test]
fn holdfast_etcd_ships_the_pinned_etcd_and_needs_no_distribution_etcd() {
    let b = built();
    let pinned = holdfast_tests::pinned_etcd();
    let version = pinned.trim_start_matches('v');
    let control = must(Command::new("dpkg-deb").arg("-f").arg(b.deb("holdfast-etcd")).arg("Depends")).stdout;
    assert!(!control.contains("etcd"), "holdfast-etcd.deb depends on a distribution etcd: {control}");
    let requires = must(Command::new("rpm").args(["-qpR"]).arg(b.rpm("holdfast-etcd"))).stdout;
    assert!(!requires.lines().any(|l| l.trim().starts_with("etcd")), "holdfast-etcd.rpm requires a distribution etcd:\n{requires}");
    let deb_tree = b.scratch.join("etcd-deb");
    let rpm_tree = b.scratch.join("etcd-rpm");
    let _ = std::fs::remove_dir_all(&deb_tree);
    let _ = std::fs::remove_dir_all(&rpm_tree);
    std::fs::create_dir_all(&rpm_tree).unwrap();
    must(Command::new("dpkg-deb").arg("-x").arg(b.deb("holdfast-etcd")).arg(&deb_tree));
    must(
        Command::new("sh").arg("-c").arg("rpm2archive - <\"$1\" | tar -xzf -").arg("sh").arg(b.rpm("holdfast-etcd")).current_dir(&rpm_tree),
    );
    for tree in [&deb_tree, &rpm_tree] {
        for (bin, arg, said) in [
            ("etcd", "--version", "etcd Version: "),
            ("etcdctl", "version", "etcdctl version: "),
            ("etcdutl", "version", "etcdutl version: "),
        ] {
            let path = tree.join("usr/lib/holdfast/etcd").join(bin);
            let out = must(Command::new(&path).arg(arg)).stdout;
            assert!(out.lines().any(|l| l == format!("{said}{version}")), "{}: not {pinned}:\n{out}", path.display());
        }
    }
    let unit = std::fs::read_to_string(deb_tree.join("usr/lib/systemd/system/holdfast-etcd@.service")).unwrap();
    assert!(unit.lines().any(|l| l.starts_with("ExecStart=/usr/lib/holdfast/etcd/etcd ")), "the unit runs another etcd:\n{unit}");
}

/// A module whose checksum differs from the committed go.sum fails the
/// etcd build, with Go's own explanation (and nothing is written).
#[test]
fn a_go_sum_mismatch_fails_the_etcd_build() {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join("etcd");
    std::fs::create_dir_all(&copy).unwrap();
    for f in ["build", "go.mod", "go.sum"] {
        std::fs::copy(workspace().join("packaging/etcd").join(f), copy.join(f)).unwrap();
    }
    let sum = std::fs::read_to_string(copy.join("go.sum")).unwrap();
    let line = sum.lines().find(|l| l.starts_with("go.etcd.io/etcd/server/v3 ") && !l.contains("/go.mod ")).expect("the server's sum");
    let hash = line.rsplit("h1:").next().unwrap();
    let flipped = format!("{}{}", if hash.starts_with('A') { 'B' } else { 'A' }, &hash[1..]);
    std::fs::write(copy.join("go.sum"), sum.replace(line, &line.replace(hash, &flipped))).unwrap();
    let out = dir.path().join("out");
    let r = run(Command::new(copy.join("build")).arg(&out));
    assert!(!r.ok, "a tampered go.sum built:\n{r}");
    assert!(r.stderr.contains("checksum mismatch") && r.stderr.contains("SECURITY ERROR"), "{r}");
    assert!(!out.join("etcd").exists(), "an etcd was written");
}
