//! `holdfastctl approve` signs exactly the bytes it showed, and writes its
//! signature through no symbolic link. No etcd: it runs once.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_approval::{Operation, Request, request::DEFAULT_VALIDITY};
use holdfast_tests::*;
use std::io::Write;
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn advance_request(new_epoch: u32) -> String {
    let op = Operation::EpochAdvance { cluster: "entity-1".into(), expected_epoch: 2, new_epoch, cluster_id: 42, highest_known: 2 };
    Request::new("alice", "restored after a disk loss", op, 4_000_000_000, DEFAULT_VALIDITY).unwrap().render()
}

/// `ssh-keygen -Y check-novalidate`: does `sig` verify over `bytes`?
fn signs(sig: &Path, bytes: &[u8]) -> bool {
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "check-novalidate", "-n", holdfast_approval::NAMESPACE, "-s"])
        .arg(sig)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(bytes).unwrap();
    child.wait().unwrap().success()
}

/// The request is a FIFO that hands out the request asking for epoch 3 to
/// its first reader and one asking for epoch 30 to any later reader: a
/// file swapped between the read that is shown and any read that is
/// signed. (The approve of before read the request to show it, then copied
/// the file for ssh-keygen: it showed epoch 3 and signed epoch 30.)
#[test]
fn approve_signs_the_bytes_it_showed_even_when_the_file_changes_after_the_read() {
    let dir = TestDir::new("approve-swap");
    let (key, _) = ssh_keygen(&dir.path.join("keys"), "alice");
    let (shown, swapped) = (advance_request(3), advance_request(30));
    let fifo = dir.path.join("epoch-advance.toml");
    nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let sig = dir.path.join("alice.sig");
    let mut approve = Command::new(bin("holdfastctl"))
        .args(["approve", &fifo.display().to_string(), "--ssh-key", &key.display().to_string(), "--out", &sig.display().to_string()])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // The first reader: blocks until approve opens the FIFO.
    std::fs::OpenOptions::new().write(true).open(&fifo).unwrap().write_all(shown.as_bytes()).unwrap();
    // Until approve has read to the end and closed it (twice seen closed:
    // the open itself may not be in its table yet on the first look).
    let started = Instant::now();
    let open_in = |pid: u32| {
        std::fs::read_dir(format!("/proc/{pid}/fd"))
            .map(|fds| fds.filter_map(|fd| std::fs::read_link(fd.ok()?.path()).ok()).any(|target| target == fifo))
            .unwrap_or(false)
    };
    let mut closed_looks = 0;
    while closed_looks < 2 && approve.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "approve kept the request open");
        closed_looks = if open_in(approve.id()) { 0 } else { closed_looks + 1 };
        std::thread::sleep(Duration::from_millis(10));
    }
    // Any later reader gets the swapped request, until approve exits.
    let mut later_reads = 0;
    while approve.try_wait().unwrap().is_none() {
        assert!(started.elapsed() < Duration::from_secs(30), "approve did not finish");
        // Opening for write without blocking succeeds only while a reader has it open.
        if let Ok(mut w) = std::fs::OpenOptions::new().write(true).custom_flags(nix::libc::O_NONBLOCK).open(&fifo) {
            later_reads += 1;
            let _ = w.write_all(swapped.as_bytes());
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    let out = approve.wait_with_output().unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.contains("from 2 to 3,"), "approve shows the request it read: {stdout}");
    assert_eq!(later_reads, 0, "approve read the request a second time");
    assert!(signs(&sig, shown.as_bytes()), "the signature does not cover the request shown");
    assert!(!signs(&sig, swapped.as_bytes()), "the signature covers the swapped request");
}

/// The signature is written through no symbolic link: one planted where it
/// goes makes approve fail, and the link's target is untouched.
#[test]
fn approve_refuses_to_write_its_signature_through_a_symbolic_link() {
    let dir = TestDir::new("approve-link");
    let (key, _) = ssh_keygen(&dir.path.join("keys"), "alice");
    let request = dir.path.join("epoch-advance.toml");
    std::fs::write(&request, advance_request(3)).unwrap();
    let victim = dir.path.join("victim");
    std::fs::write(&victim, "precious\n").unwrap();
    let planted = dir.path.join("epoch-advance.toml.alice.sig");
    std::os::unix::fs::symlink(&victim, &planted).unwrap();
    let approve = || {
        Ran::of(Command::new(bin("holdfastctl")).args(["approve", &request.display().to_string(), "--ssh-key", &key.display().to_string()]))
    };
    let out = approve();
    assert_eq!(out.code, 70, "{out}");
    assert!(out.stderr.contains("a symbolic link there is refused"), "{out}");
    assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious\n");
    // Without the link, the default name beside the request.
    std::fs::remove_file(&planted).unwrap();
    let out = approve();
    assert_eq!(out.code, 0, "{out}");
    assert!(signs(&planted, &std::fs::read(&request).unwrap()));
}

/// approvers.toml is refused, before anything else is done, when its mode
/// would let another user add an approver; fixed, it is read.
#[test]
fn a_group_writable_approvers_file_is_refused_with_what_to_change() {
    use std::os::unix::fs::PermissionsExt;
    let dir = TestDir::new("approve-modes");
    let (_, alice_pub) = ssh_keygen(&dir.path.join("keys"), "alice");
    let (_, bob_pub) = ssh_keygen(&dir.path.join("keys"), "bob");
    let approvers = dir.path.join("approvers.toml");
    std::fs::write(
        &approvers,
        format!(
            "[approver.alice]\nroles = [\"dr-operator\"]\nkeys = [{alice_pub:?}]\n[approver.bob]\nroles = [\"dr-operator\"]\nkeys = [{bob_pub:?}]\n"
        ),
    )
    .unwrap();
    let request = |mode: u32| {
        std::fs::set_permissions(&approvers, std::fs::Permissions::from_mode(mode)).unwrap();
        Ran::of(Command::new(bin("holdfastctl")).args([
            "force-release",
            "request",
            "demo/x",
            "--requester",
            "alice",
            "--reason",
            "modes",
            // Never dialled: both answers come before etcd.
            "--etcd-endpoint",
            "https://127.0.0.1:9",
            "--approvers",
            &approvers.display().to_string(),
            "--state-dir",
            &dir.path.join("state").display().to_string(),
        ]))
    };
    let refused = request(0o664);
    assert_eq!(refused.code, 78, "{refused}");
    assert!(
        refused.stderr.contains(&format!(
            "{}: is writable by its group or by others (mode 0664); `chmod go-w {}`",
            approvers.display(),
            approvers.display()
        )),
        "{refused}"
    );
    // Fixed: read, and the next check speaks (alice is no lock-operator).
    let read = request(0o644);
    assert_eq!(read.code, 65, "{read}");
    assert!(read.stderr.contains("\"alice\" is not a lock-operator"), "{read}");
}
