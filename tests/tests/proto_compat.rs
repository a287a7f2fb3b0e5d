//! The proto's compatibility (`scripts/proto-check`): the working
//! `lock.proto` passes `buf lint` and `buf breaking` against the proto as
//! last released (crates/holdfast-proto/proto-released/lock.v1.json), and
//! altered copies of it fail the way a released client would break: a
//! renamed field, a removed field, a changed field number. A compatible
//! addition passes, and a lint finding alone fails. buf is built from the
//! Go module proxy into target/go-bin by the script; without Go these
//! tests fail, never skip. Run once, not per etcd target.

use holdfast_tests::{Ran, TestDir};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

/// `scripts/proto-check`, on `proto_dir` when given.
fn proto_check(proto_dir: Option<&Path>) -> Ran {
    holdfast_devkit::process::which("go").expect("go is not installed: scripts/proto-check builds buf with Go 1.26 (go.dev/dl)");
    let mut cmd = Command::new(repo().join("scripts/proto-check"));
    if let Some(dir) = proto_dir {
        cmd.arg("--proto-dir").arg(dir);
    }
    Ran::of(&mut cmd)
}

/// The check of the working proto, run once: the first run builds buf, and
/// every other test waits for it rather than building buf beside it.
fn current() -> &'static Ran {
    static RAN: OnceLock<Ran> = OnceLock::new();
    RAN.get_or_init(|| proto_check(None))
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_dir(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), &target).unwrap();
        }
    }
}

/// The check of a copy of the proto directory (buf.yaml included) whose
/// `lock.proto` has the one line `from` replaced by `to`.
fn check_altered(name: &str, from: &str, to: &str) -> Ran {
    let _ = current();
    let dir = TestDir::new(&format!("proto-compat-{name}"));
    let proto_dir = dir.path.join("proto");
    copy_dir(&repo().join("crates/holdfast-proto/proto"), &proto_dir);
    let file = proto_dir.join("lock/v1/lock.proto");
    let text = std::fs::read_to_string(&file).unwrap();
    assert_eq!(text.matches(from).count(), 1, "`{from}` is not exactly once in lock.proto");
    std::fs::write(&file, text.replacen(from, to, 1)).unwrap();
    let ran = proto_check(Some(&proto_dir));
    eprintln!("proto-check of lock.proto with `{from}` -> `{to}`:\n{ran}");
    ran
}

#[test]
fn the_current_proto_passes_lint_and_breaking_against_the_released_one() {
    let ran = current();
    eprintln!("{ran}");
    assert_eq!(ran.code, 0, "scripts/proto-check:\n{ran}");
    assert!(ran.stdout.contains("lint: no findings"), "{ran}");
    assert!(ran.stdout.contains("breaking: no breaking change"), "{ran}");
}

#[test]
fn a_renamed_field_fails_and_buf_names_it() {
    let ran = check_altered("rename", "uint64 wait_millis = 4;", "uint64 wait_ms = 4;");
    assert_eq!(ran.code, 1, "{ran}");
    // Lint-clean: the breaking check alone refuses it, for the name and the
    // JSON name both (the bytes of the binary encoding are unchanged).
    assert!(ran.stdout.contains("lint: no findings"), "{ran}");
    assert!(
        ran.stdout.contains(r#"Field "4" on message "AcquireRequest" changed name from "wait_millis" to "wait_ms"."#),
        "buf did not name the renamed field:\n{ran}"
    );
    assert!(
        ran.stdout.contains(
            r#"Field "4" with name "wait_ms" on message "AcquireRequest" changed option "json_name" from "waitMillis" to "waitMs"."#
        ),
        "{ran}"
    );
}

#[test]
fn a_removed_field_fails() {
    let ran = check_altered("remove", "string holder_identity = 2;", "");
    assert_eq!(ran.code, 1, "{ran}");
    assert!(
        ran.stdout.contains(r#"Previously present field "2" with name "holder_identity" on message "InspectResponse" was deleted"#),
        "buf did not name the removed field:\n{ran}"
    );
}

#[test]
fn a_changed_field_number_fails() {
    let ran = check_altered("renumber", "fixed64 token = 4;", "fixed64 token = 5;");
    assert_eq!(ran.code, 1, "{ran}");
    assert!(
        ran.stdout.contains(r#"Previously present field "4" with name "token" on message "ReleaseRequest" was deleted"#),
        "buf did not name the renumbered field:\n{ran}"
    );
}

#[test]
fn a_compatible_addition_passes_and_a_lint_finding_alone_fails() {
    let added = check_altered("add", "uint64 wait_millis = 4;", "uint64 wait_millis = 4;\n  string reason = 6;");
    assert_eq!(added.code, 0, "a new field is compatible:\n{added}");
    let unlinted = check_altered("lint", "uint64 wait_millis = 4;", "uint64 wait_millis = 4;\n  string waitReason = 6;");
    assert_eq!(unlinted.code, 1, "{unlinted}");
    assert!(unlinted.stdout.contains("breaking: no breaking change"), "{unlinted}");
    assert!(unlinted.stdout.contains(r#"Field name "waitReason" should be lower_snake_case"#), "{unlinted}");
}
