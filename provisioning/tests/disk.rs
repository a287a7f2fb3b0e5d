//! The data device, with real tools: libcryptsetup on a loop device, Clevis
//! bound to Debian's tangd under socat on 127.0.0.1.
//!
//! Activation (`crypt_activate_by_passphrase` with a name) needs
//! device-mapper, which some hosts lack (this project's build machines among
//! them). The unlock test probes for it with a real `cryptsetup open` and
//! asserts what each kind of host must show; the other tests stop before
//! activation: they recover the key through Tang and check it against the
//! header (`cryptsetup open --test-passphrase`, and the library's name-less
//! activation).

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

mod common;

use std::io::Write;
use std::process::{Command, Stdio};

use common::{Loop, Tang, bin, node_config};
use holdfast_provision::ProvisionError;
use holdfast_provision::config::ProvisionConfig;
use holdfast_provision::disk;

fn quiet(_: &str) {}

fn setup(tangs: &[&Tang], threshold: u32) -> (Loop, ProvisionConfig, std::path::PathBuf) {
    let lo = Loop::new(32);
    let halls = ["hall-a", "hall-b", "hall-c"];
    let urls: Vec<(String, &str)> = tangs.iter().zip(halls).map(|(t, h)| (t.url(), h)).collect();
    let path = node_config(lo.dir.path(), &lo.dev, &urls, threshold);
    let cfg = ProvisionConfig::load(&path).expect("config");
    (lo, cfg, path)
}

fn clevis_pass(dev: &std::path::Path, slot: u32) -> std::process::Output {
    Command::new("clevis").args(["luks", "pass", "-d"]).arg(dev).args(["-s", &slot.to_string()]).output().expect("clevis luks pass")
}

fn test_passphrase(dev: &std::path::Path, key: &[u8]) -> bool {
    let mut c = Command::new("cryptsetup")
        .args(["open", "--test-passphrase", "--key-file", "-"])
        .arg(dev)
        .stdin(Stdio::piped())
        .spawn()
        .expect("cryptsetup");
    c.stdin.take().expect("stdin").write_all(key).expect("write key");
    c.wait().expect("wait").success()
}

#[test]
fn luks2_bound_to_two_tang_halls_keeps_no_passphrase_slot_and_key_recovers_through_tang() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, _) = setup(&[&a, &b], 1);

    let out = disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("format and bind");
    assert!(out.changed);
    let st = disk::inspect(&lo.dev).expect("inspect");
    assert_eq!(st.luks.as_deref(), Some("LUKS2"));
    assert_eq!(st.signature.as_deref(), Some("crypto_LUKS"));
    assert!(!st.clevis_keyslots.is_empty(), "a Clevis keyslot: {st:?}");
    assert!(st.other_keyslots.is_empty(), "no passphrase keyslot may remain: {st:?}");
    assert_eq!(st.keyslots, st.clevis_keyslots);

    // The token is an sss policy over both Tang servers.
    let dump = Command::new("cryptsetup").args(["luksDump"]).arg(&lo.dev).output().expect("luksDump");
    assert!(String::from_utf8_lossy(&dump.stdout).contains("clevis"));

    // Recover the key through Tang and verify it against the header.
    let pass = clevis_pass(&lo.dev, st.clevis_keyslots[0]);
    assert!(pass.status.success(), "clevis luks pass: {}", String::from_utf8_lossy(&pass.stderr));
    assert!(test_passphrase(&lo.dev, &pass.stdout), "cryptsetup open --test-passphrase refused the key Tang gave back");
    assert!(!test_passphrase(&lo.dev, b"not the key"), "a wrong key must be refused");

    // Idempotent: a second run changes nothing.
    let again = disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("second run");
    assert!(!again.changed, "{:?}", again.steps);
    assert_eq!(disk::inspect(&lo.dev).expect("inspect"), st);
}

#[test]
fn any_one_hall_tang_unlocks_with_threshold_one() {
    let (a, mut b) = (Tang::start(), Tang::start());
    let (lo, cfg, _) = setup(&[&a, &b], 1);
    disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("format and bind");
    b.stop();
    let st = disk::inspect(&lo.dev).expect("inspect");
    let key = disk::recover_key(&lo.dev, &cfg.tang, &st.clevis_keyslots).expect("hall-a's Tang alone suffices");
    disk::verify_key(&lo.dev, &key).expect("key opens a keyslot");
}

/// Closes what a successful `unlock` opened, should the test stop half-way.
struct Deactivate {
    mapper_name: String,
    mount_point: std::path::PathBuf,
}
impl Drop for Deactivate {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.mount_point).stderr(Stdio::null()).status();
        let _ = Command::new("cryptsetup").args(["close", &self.mapper_name]).stderr(Stdio::null()).status();
    }
}

#[test]
fn unlock_recovers_the_key_through_tang_then_activates_with_device_mapper_or_fails_only_at_activation_without_it() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, path) = setup(&[&a, &b], 2);
    disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("format and bind");
    // Dry run: says what it would do, touches nothing.
    let dry = disk::unlock(&cfg.disk, &cfg.tang, true, &mut quiet).expect("dry run");
    assert!(dry.changed);
    assert!(dry.steps.iter().any(|s| s.contains("recover the key through Tang")), "{:?}", dry.steps);

    let device_mapper = common::device_mapper();
    let mapper = std::path::Path::new("/dev/mapper").join(&cfg.disk.mapper_name);
    let mnt = &cfg.disk.mount_point;
    // Declared before the unlock and after the loop device: dropped first.
    let _close = device_mapper.is_ok().then(|| Deactivate { mapper_name: cfg.disk.mapper_name.clone(), mount_point: mnt.clone() });
    let mut said = Vec::new();
    let result = disk::unlock(&cfg.disk, &cfg.tang, false, &mut |m| said.push(m.to_string()));
    // On either kind of host, the key came back from Tang and libcryptsetup
    // accepted it: activation is only attempted after both.
    assert!(said.iter().any(|m| m.contains("recovering the volume key through Tang")), "{said:?}");
    assert!(said.iter().any(|m| m.contains("activating the LUKS2 volume")), "the key from Tang was refused: {said:?} {result:?}");

    match device_mapper {
        Err(why) => {
            eprintln!("no device-mapper on this host ({why}): checking that unlock fails at activation and only there");
            let err = result.expect_err("activation cannot succeed without device-mapper");
            assert!(matches!(err, ProvisionError::State(_)), "{err:?}");
            let msg = err.to_string();
            assert!(msg.contains("The key from Tang is valid") && msg.contains(&format!("as {}", mapper.display())), "{msg}");
            assert!(!mapper.exists() && !disk::is_mounted(mnt), "nothing may be left active or mounted");
            // The binary, as an operator runs it: libcryptsetup's own reason is
            // device-mapper, after the key came back from Tang.
            let out = Command::new(bin()).args(["unlock", "--config"]).arg(&path).stdin(Stdio::null()).output().expect("run");
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(1), "{stderr}");
            let (recovered, dm) = (stderr.find("recovering the volume key through Tang"), stderr.find("Cannot initialize device-mapper"));
            assert!(matches!((recovered, dm), (Some(r), Some(d)) if r < d), "{stderr}");
            assert!(stderr.contains("The key from Tang is valid"), "{stderr}");
        }
        Ok(()) => {
            eprintln!("device-mapper works on this host: checking that unlock activates and mounts the volume, then closing it");
            let out = result.expect("unlock with device-mapper");
            assert!(out.changed, "{:?}", out.steps);
            for want in ["recover the key through Tang", &format!("mkfs.ext4 {}", mapper.display()), &format!("mount {}", mapper.display())]
            {
                assert!(out.steps.iter().any(|s| s.contains(want)), "missing {want:?} in {:?}", out.steps);
            }
            assert!(mapper.exists(), "{} after unlock", mapper.display());
            let status = Command::new("cryptsetup").args(["status", &cfg.disk.mapper_name]).output().expect("cryptsetup status");
            let status_text = String::from_utf8_lossy(&status.stdout);
            assert!(status.status.success(), "{status_text}{}", String::from_utf8_lossy(&status.stderr));
            for want in ["LUKS2", "aes-xts-plain64", "discards", &lo.dev.display().to_string()] {
                assert!(status_text.contains(want), "missing {want:?} in cryptsetup status:\n{status_text}");
            }
            assert_eq!(disk::signature(&mapper).expect("blkid").as_deref(), Some("ext4"));
            assert!(disk::is_mounted(mnt), "{} is not mounted", mnt.display());
            use std::os::unix::fs::MetadataExt;
            assert_eq!(std::fs::metadata(&cfg.disk.data_dir).expect("data dir").mode() & 0o7777, 0o700);
            // Idempotent: a second run finds it unlocked and mounted.
            let again = disk::unlock(&cfg.disk, &cfg.tang, false, &mut quiet).expect("second unlock");
            assert!(!again.changed, "{:?}", again.steps);
            // Close it again, and check that it is gone.
            let umount = Command::new("umount").arg(mnt).output().expect("umount");
            assert!(umount.status.success(), "umount {}: {}", mnt.display(), String::from_utf8_lossy(&umount.stderr));
            let close = Command::new("cryptsetup").args(["close", &cfg.disk.mapper_name]).output().expect("cryptsetup close");
            assert!(close.status.success(), "cryptsetup close: {}", String::from_utf8_lossy(&close.stderr));
            assert!(!mapper.exists(), "{} after cryptsetup close", mapper.display());
        }
    }
}

#[test]
fn unlock_with_tang_stopped_stays_locked_and_says_why_without_passphrase_fallback() {
    let (mut a, mut b) = (Tang::start(), Tang::start());
    let (lo, cfg, path) = setup(&[&a, &b], 1);
    disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("format and bind");
    a.stop();
    b.stop();
    let err = disk::unlock(&cfg.disk, &cfg.tang, false, &mut quiet).expect_err("must stay locked");
    assert!(matches!(err, ProvisionError::TangUnreachable { .. }), "{err:?}");
    let msg = err.to_string();
    assert!(msg.contains("stays locked") && msg.contains("no passphrase fallback"), "{msg}");
    assert!(msg.contains(&a.url()) && msg.contains(&b.url()), "names the servers tried: {msg}");

    // The binary: exit 69, the reason on stderr, nothing read from stdin.
    let out = Command::new(bin()).args(["unlock", "--config"]).arg(&path).stdin(Stdio::null()).output().expect("run");
    assert_eq!(out.status.code(), Some(69), "{}", String::from_utf8_lossy(&out.stderr));
    assert!(String::from_utf8_lossy(&out.stderr).contains("no passphrase fallback"));
    assert!(disk::inspect(&lo.dev).expect("inspect").other_keyslots.is_empty());
}

#[test]
fn refuses_to_format_a_device_holding_a_file_system_unless_forced() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, path) = setup(&[&a, &b], 1);
    let st = Command::new("mkfs.ext4").args(["-q", "-F"]).arg(&lo.dev).status().expect("mkfs.ext4");
    assert!(st.success());
    let err = disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect_err("must refuse");
    assert!(matches!(err, ProvisionError::DeviceInUse { .. }), "{err:?}");
    assert!(err.to_string().contains("ext4") && err.to_string().contains("--force"), "{err}");
    assert_eq!(disk::signature(&lo.dev).expect("blkid").as_deref(), Some("ext4"), "untouched");

    let out = Command::new(bin()).args(["disk", "--json", "--config"]).arg(&path).output().expect("run");
    assert_eq!(out.status.code(), Some(65));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(v["ok"], false);

    let v = common::run_ok_json(Command::new(bin()).args(["disk", "--force", "--json", "--config"]).arg(&path));
    assert_eq!(v["changed"], true);
    assert!(disk::inspect(&lo.dev).expect("inspect").is_provisioned());
}

#[test]
fn refuses_to_format_a_foreign_luks_header_unless_forced() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, _) = setup(&[&a, &b], 1);
    let mut c = Command::new("cryptsetup")
        .args(["luksFormat", "-q", "--type", "luks2", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file", "-"])
        .arg(&lo.dev)
        .stdin(Stdio::piped())
        .spawn()
        .expect("cryptsetup");
    c.stdin.take().expect("stdin").write_all(b"someone else's").expect("key");
    assert!(c.wait().expect("wait").success());
    let err = disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect_err("must refuse");
    assert!(err.to_string().contains("LUKS2 header without a Clevis binding"), "{err}");
    disk::format_and_bind(&cfg.disk, &cfg.tang, true, false, &mut quiet).expect("forced");
    assert!(disk::inspect(&lo.dev).expect("inspect").is_provisioned());
}

#[test]
fn dry_run_on_an_empty_device_changes_nothing() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, path) = setup(&[&a, &b], 1);
    let out = disk::format_and_bind(&cfg.disk, &cfg.tang, false, true, &mut quiet).expect("dry run");
    assert!(out.changed && out.steps.len() >= 4, "{:?}", out.steps);
    assert_eq!(disk::signature(&lo.dev).expect("blkid"), None);
    let out = Command::new(bin()).args(["disk", "--dry-run", "--config"]).arg(&path).output().expect("run");
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("would: format LUKS2"));
    assert_eq!(disk::signature(&lo.dev).expect("blkid"), None);
}

#[test]
fn a_leftover_passphrase_slot_is_removed_on_the_next_run() {
    let (a, b) = (Tang::start(), Tang::start());
    let (lo, cfg, _) = setup(&[&a, &b], 1);
    disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("format and bind");
    let slot = disk::inspect(&lo.dev).expect("inspect").clevis_keyslots[0];
    let key = clevis_pass(&lo.dev, slot).stdout;
    // Simulate an interrupted run / an operator's passphrase left on the host.
    let keyfile = lo.dir.path().join("k");
    std::fs::write(&keyfile, &key).expect("write");
    let mut c = Command::new("cryptsetup")
        .args(["luksAddKey", "-q", "--pbkdf", "pbkdf2", "--pbkdf-force-iterations", "1000", "--key-file"])
        .arg(&keyfile)
        .arg(&lo.dev)
        .arg("-")
        .stdin(Stdio::piped())
        .spawn()
        .expect("luksAddKey");
    c.stdin.take().expect("stdin").write_all(b"a passphrase").expect("pass");
    assert!(c.wait().expect("wait").success());
    assert_eq!(disk::inspect(&lo.dev).expect("inspect").other_keyslots.len(), 1);

    let out = disk::format_and_bind(&cfg.disk, &cfg.tang, false, false, &mut quiet).expect("completes");
    assert!(out.changed);
    let st = disk::inspect(&lo.dev).expect("inspect");
    assert!(st.other_keyslots.is_empty() && st.is_provisioned(), "{st:?}");
    assert!(!test_passphrase(&lo.dev, b"a passphrase"), "the passphrase no longer opens the volume");
}

#[test]
fn data_directory_gets_owner_and_mode_idempotently() {
    use std::os::unix::fs::MetadataExt;
    let dir = tempfile::tempdir().expect("tempdir");
    let d = dir.path().join("mnt/member-data");
    assert!(disk::ensure_data_dir(&d, "root", "root", 0o700, true).expect("dry"));
    assert!(!d.exists(), "dry run creates nothing");
    assert!(disk::ensure_data_dir(&d, "root", "root", 0o700, false).expect("create"));
    let m = std::fs::metadata(&d).expect("meta");
    assert_eq!((m.mode() & 0o7777, m.uid(), m.gid()), (0o700, 0, 0));
    assert!(!disk::ensure_data_dir(&d, "0", "0", 0o700, false).expect("again"), "second run changes nothing");
    std::fs::set_permissions(&d, std::os::unix::fs::PermissionsExt::from_mode(0o755)).expect("chmod");
    assert!(disk::ensure_data_dir(&d, "root", "root", 0o700, false).expect("fix"));
    assert_eq!(std::fs::metadata(&d).expect("meta").mode() & 0o7777, 0o700);
    let err = disk::ensure_data_dir(&d, "no-such-user-holdfast", "root", 0o700, false).expect_err("unknown user");
    assert!(err.to_string().contains("disk.owner"), "{err}");
}

struct Unmount(std::path::PathBuf);
impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

/// A plain loop device stands in for `/dev/mapper/<name>`, so this runs on
/// hosts without device-mapper too: what `unlock` does after activation.
#[test]
fn after_activation_an_empty_volume_gets_a_file_system_a_mount_and_the_data_dir_once() {
    common::require(&["mkfs.ext4", "mount", "umount"]);
    let lo = Loop::new(32);
    let mnt = lo.dir.path().join("mnt");
    let _guard = Unmount(mnt.clone());
    let disk_cfg = holdfast_provision::config::DiskConfig {
        device: lo.dev.clone(),
        mapper_name: "unused".into(),
        filesystem: "ext4".into(),
        mount_point: mnt.clone(),
        data_dir: mnt.join("member-data"),
        owner: "root".into(),
        group: "root".into(),
        mode: "0700".into(),
    };
    let dry = disk::filesystem_and_mount(&lo.dev, &disk_cfg, true, &mut quiet).expect("dry run");
    assert!(dry.changed && dry.steps.len() == 3, "{:?}", dry.steps);
    assert_eq!(disk::signature(&lo.dev).expect("blkid"), None, "dry run formats nothing");

    let first = disk::filesystem_and_mount(&lo.dev, &disk_cfg, false, &mut quiet).expect("mkfs, mount, data dir");
    assert!(first.changed);
    assert_eq!(disk::signature(&lo.dev).expect("blkid").as_deref(), Some("ext4"));
    assert!(disk::is_mounted(&mnt));
    use std::os::unix::fs::MetadataExt;
    assert_eq!(std::fs::metadata(mnt.join("member-data")).expect("data dir").mode() & 0o7777, 0o700);
    std::fs::write(mnt.join("member-data/keep"), b"etcd data").expect("write");

    let second = disk::filesystem_and_mount(&lo.dev, &disk_cfg, false, &mut quiet).expect("again");
    assert!(!second.changed && second.steps.is_empty(), "{:?}", second.steps);
    assert!(mnt.join("member-data/keep").exists(), "never reformats");

    let xfs = holdfast_provision::config::DiskConfig { filesystem: "xfs".into(), ..disk_cfg.clone() };
    let err = disk::filesystem_and_mount(&lo.dev, &xfs, false, &mut quiet).expect_err("other fs");
    assert!(err.to_string().contains("refusing to reformat"), "{err}");
}
