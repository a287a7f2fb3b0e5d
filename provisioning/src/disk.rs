//! The data device: LUKS2 through libcryptsetup, bound to Tang with Clevis,
//! no passphrase keyslot left; unlock through Tang only; file system, mount
//! and the etcd data directory.
//!
//! Formatting: libcryptsetup formats LUKS2 and adds a *temporary* keyslot
//! with a random passphrase that never leaves memory (it goes to `clevis luks
//! bind` on stdin). Clevis adds its own keyslot and token (an `sss` policy over
//! the Tang servers). The agent then proves the Clevis slot opens through
//! Tang, and destroys every keyslot no Clevis token references. A recovery
//! key, if wanted, is added by the operator and escrowed offline (see the
//! README): never kept on the host.
//!
//! Unlock: `clevis luks pass` recovers the slot's key from Tang; libcryptsetup
//! checks it (`crypt_activate_by_passphrase` with no name, the library form
//! of `cryptsetup open --test-passphrase`) and then activates the mapping. No
//! passphrase is ever asked for: without Tang, the node stays locked.

use std::io::Write;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use libcryptsetup_rs::consts::flags::{CryptActivate, CryptVolumeKey};
use libcryptsetup_rs::consts::vals::{CryptKdf, EncryptionFormat, KeyslotInfo};
use libcryptsetup_rs::{CryptDevice, CryptInit, CryptPbkdfType, Either};
use serde::Serialize;

use crate::config::{DiskConfig, TangConfig};
use crate::error::{ProvisionError, Result};

/// Key material: zeroed when dropped, never printed.
pub struct Secret(Vec<u8>);

impl Secret {
    /// The bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.0
    }
}

impl std::ops::Deref for Secret {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.0
    }
}

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "Secret(<{} bytes redacted>)", self.0.len())
    }
}

impl Drop for Secret {
    fn drop(&mut self) {
        for b in self.0.iter_mut() {
            // SAFETY: b is a valid, exclusive reference; volatile so the wipe is not optimised away.
            unsafe { std::ptr::write_volatile(b, 0) };
        }
    }
}

/// LUKS2 maximum keyslots / tokens.
const MAX_SLOTS: u32 = 32;

/// What a device holds.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct DeviceState {
    /// The device path.
    pub device: PathBuf,
    /// File-system (or other) signature blkid sees, e.g. `ext4`, `crypto_LUKS`.
    pub signature: Option<String>,
    /// LUKS version if a LUKS header loads.
    pub luks: Option<String>,
    /// Active keyslots.
    pub keyslots: Vec<u32>,
    /// Keyslots referenced by a Clevis token.
    pub clevis_keyslots: Vec<u32>,
    /// Active keyslots no Clevis token references (passphrase or recovery slots).
    pub other_keyslots: Vec<u32>,
}

impl DeviceState {
    /// Formatted by us and finished: LUKS2, Clevis-bound, no other keyslot.
    pub fn is_provisioned(&self) -> bool {
        self.luks.as_deref() == Some("LUKS2") && !self.clevis_keyslots.is_empty() && self.other_keyslots.is_empty()
    }
}

fn crypt_err(step: &str, device: &Path) -> impl FnOnce(libcryptsetup_rs::LibcryptErr) -> ProvisionError {
    let (step, device) = (step.to_string(), device.display().to_string());
    move |source| ProvisionError::Crypt { step, device, source }
}

/// Runs a tool, feeding `stdin`; returns stdout, or an error with its stderr and `hint`.
fn run(cmd: &mut Command, stdin: Option<&[u8]>, hint: &str) -> Result<Vec<u8>> {
    let name = format!("{:?}", cmd.get_program());
    let mut child = cmd
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| ProvisionError::Tool {
            tool: name.clone(),
            detail: format!(
                "cannot run it: {e}; install it with scripts/install-deps (Debian: clevis, clevis-luks, cryptsetup-bin, util-linux)"
            ),
        })?;
    if let (Some(data), Some(mut pipe)) = (stdin, child.stdin.take()) {
        pipe.write_all(data).map_err(|e| ProvisionError::io(format!("writing to {name}"), e))?;
    }
    let out = child.wait_with_output().map_err(|e| ProvisionError::io(format!("waiting for {name}"), e))?;
    if out.status.success() {
        Ok(out.stdout)
    } else {
        Err(ProvisionError::Tool {
            tool: format!("{name} {:?}", cmd.get_args().collect::<Vec<_>>()),
            detail: format!("{} ({}); {hint}", String::from_utf8_lossy(&out.stderr).trim(), out.status),
        })
    }
}

/// The signature blkid finds on a device (probing the device itself, not the cache).
pub fn signature(device: &Path) -> Result<Option<String>> {
    let out = Command::new("blkid")
        .args(["-p", "-o", "value", "-s", "TYPE"])
        .arg(device)
        .output()
        .map_err(|e| ProvisionError::io("running blkid (install util-linux)", e))?;
    match out.status.code() {
        Some(0) => {
            let t = String::from_utf8_lossy(&out.stdout).trim().to_string();
            Ok((!t.is_empty()).then_some(t))
        }
        Some(2) => Ok(None), // nothing found
        _ => Err(ProvisionError::Tool {
            tool: "blkid".into(),
            detail: format!(
                "{} on {}: check the device path in disk.device",
                String::from_utf8_lossy(&out.stderr).trim(),
                device.display()
            ),
        }),
    }
}

fn open_luks(device: &Path) -> Result<Option<CryptDevice>> {
    let mut cd = CryptInit::init(device).map_err(crypt_err("opening", device))?;
    match cd.context_handle().load::<()>(None, None) {
        Ok(()) => Ok(Some(cd)),
        Err(_) => Ok(None),
    }
}

/// Keyslots referenced by Clevis tokens.
fn clevis_slots(cd: &mut CryptDevice) -> Vec<u32> {
    let mut slots = Vec::new();
    for t in 0..MAX_SLOTS {
        let Ok(json) = cd.token_handle().json_get(t) else {
            continue;
        };
        if json.get("type").and_then(|v| v.as_str()) != Some("clevis") {
            continue;
        }
        for s in json.get("keyslots").and_then(|v| v.as_array()).into_iter().flatten() {
            if let Some(n) = s.as_str().and_then(|s| s.parse().ok()) {
                slots.push(n);
            }
        }
    }
    slots.sort_unstable();
    slots.dedup();
    slots
}

/// Inspects a device: signature, LUKS header, keyslots and Clevis tokens.
pub fn inspect(device: &Path) -> Result<DeviceState> {
    if !device.exists() {
        return Err(ProvisionError::State(format!(
            "{} does not exist: check disk.device in provision.toml (use a /dev/disk/by-id/ path)",
            device.display()
        )));
    }
    let mut st = DeviceState { device: device.to_owned(), signature: signature(device)?, ..Default::default() };
    if let Some(mut cd) = open_luks(device)? {
        st.luks = cd.format_handle().get_type().ok().map(|t| match t {
            EncryptionFormat::Luks2 => "LUKS2".to_string(),
            EncryptionFormat::Luks1 => "LUKS1".to_string(),
            other => format!("{other:?}"),
        });
        for s in 0..MAX_SLOTS {
            if matches!(cd.keyslot_handle().status(s), Ok(KeyslotInfo::Active | KeyslotInfo::ActiveLast)) {
                st.keyslots.push(s);
            }
        }
        st.clevis_keyslots = clevis_slots(&mut cd);
        st.other_keyslots = st.keyslots.iter().copied().filter(|s| !st.clevis_keyslots.contains(s)).collect();
    }
    Ok(st)
}

/// The Clevis `sss` policy: threshold `t` over one `tang` pin per server.
pub fn sss_policy(tang: &TangConfig) -> Result<String> {
    let mut pins = Vec::new();
    for s in &tang.servers {
        let mut pin = serde_json::json!({ "url": s.url });
        if let Some(adv) = &s.adv_file {
            pin["adv"] = serde_json::Value::String(adv.display().to_string());
        }
        pins.push(pin);
    }
    Ok(serde_json::json!({ "t": tang.threshold, "pins": { "tang": pins } }).to_string())
}

/// What `format_and_bind` did.
#[derive(Debug, Clone, Serialize)]
pub struct FormatOutcome {
    /// Whether the device was (or, with dry-run, would be) changed.
    pub changed: bool,
    /// What was done or would be done, step by step.
    pub steps: Vec<String>,
    /// The device afterwards.
    pub state: DeviceState,
}

/// Formats `disk.device` as LUKS2, binds it to Tang with Clevis and leaves no
/// passphrase keyslot. Idempotent: a finished device is left alone; a device
/// whose run was interrupted after binding is completed.
pub fn format_and_bind(
    disk: &DiskConfig,
    tang: &TangConfig,
    force: bool,
    dry_run: bool,
    progress: &mut dyn FnMut(&str),
) -> Result<FormatOutcome> {
    let dev = disk.device.as_path();
    let state = inspect(dev)?;
    let mut steps = Vec::new();
    if state.is_provisioned() && !force {
        steps.push(format!(
            "{} is already LUKS2, bound to Tang (keyslots {:?}), no passphrase keyslot: nothing to do",
            dev.display(),
            state.clevis_keyslots
        ));
        return Ok(FormatOutcome { changed: false, steps, state });
    }
    if state.luks.is_some() && !state.clevis_keyslots.is_empty() && !force {
        // An earlier run bound Clevis but did not finish removing the temporary slot.
        steps.push(format!("prove the Clevis keyslot opens through Tang, then destroy keyslots {:?}", state.other_keyslots));
        if dry_run {
            return Ok(FormatOutcome { changed: true, steps, state });
        }
        progress("completing an interrupted run: checking the Clevis keyslot through Tang");
        let key = recover_key(dev, tang, &state.clevis_keyslots)?;
        verify_key(dev, &key)?;
        remove_other_keyslots(dev)?;
        return Ok(FormatOutcome { changed: true, steps, state: finished(dev)? });
    }
    if !force {
        if let Some(what) = state.luks.clone().or(state.signature.clone()) {
            return Err(ProvisionError::DeviceInUse {
                device: dev.display().to_string(),
                what: if state.luks.is_some() {
                    format!("a {what} header without a Clevis binding")
                } else {
                    format!("a {what} signature")
                },
            });
        }
    }
    if state.signature.is_some() {
        steps.push(format!("wipe signatures ({}) with wipefs (forced)", state.signature.as_deref().unwrap_or("")));
    }
    steps.push("format LUKS2 (aes-xts-plain64, 512-bit key) through libcryptsetup with a temporary random keyslot".into());
    steps.push(format!("clevis luks bind sss {}", sss_policy(tang)?));
    steps.push("prove the Clevis keyslot opens through Tang".into());
    steps.push("destroy the temporary keyslot: no passphrase keyslot remains".into());
    if dry_run {
        return Ok(FormatOutcome { changed: true, steps, state });
    }
    if state.signature.is_some() {
        progress("wiping existing signatures (--force)");
        run(Command::new("wipefs").arg("--all").arg(dev), None, "check nothing has the device open")?;
    }
    progress("formatting LUKS2 through libcryptsetup");
    // Hex, because `clevis luks bind -k -` reads the key through a shell
    // `$(cat)`, which would drop NUL bytes and trailing newlines.
    let temp = {
        use rand::RngCore;
        let mut b = [0u8; 32];
        rand::rng().fill_bytes(&mut b);
        let hex: Vec<u8> = b.iter().flat_map(|x| format!("{x:02x}").into_bytes()).collect();
        b.fill(0);
        Secret(hex)
    };
    {
        let mut cd = CryptInit::init(dev).map_err(crypt_err("opening", dev))?;
        cd.context_handle()
            .format::<()>(EncryptionFormat::Luks2, ("aes", "xts-plain64"), None, Either::Right(64), None)
            .map_err(crypt_err("formatting LUKS2", dev))?;
        // The temporary slot is destroyed within seconds: a cheap KDF is enough.
        let cheap = CryptPbkdfType {
            type_: CryptKdf::Pbkdf2,
            hash: "sha256".into(),
            time_ms: 0,
            iterations: 1000,
            max_memory_kb: 0,
            parallel_threads: 0,
            flags: libcryptsetup_rs::consts::flags::CryptPbkdf::NO_BENCHMARK,
        };
        cd.settings_handle().set_pbkdf_type(&cheap).map_err(crypt_err("setting the temporary keyslot's KDF", dev))?;
        cd.keyslot_handle()
            .add_by_key(None, None, temp.bytes(), CryptVolumeKey::empty())
            .map_err(crypt_err("adding the temporary keyslot", dev))?;
    }
    progress("binding to Tang with clevis luks bind (sss)");
    let policy = sss_policy(tang)?;
    run(
        Command::new("clevis").args(["luks", "bind", "-y", "-d"]).arg(dev).args(["-k", "-", "sss", &policy]),
        Some(temp.bytes()),
        "check that the Tang servers in provision.toml answer GET /adv from this host",
    )?;
    let bound = inspect(dev)?;
    if bound.clevis_keyslots.is_empty() {
        return Err(ProvisionError::State(format!(
            "clevis luks bind reported success but {} has no Clevis token; run `holdfast-provision disk --force` again",
            dev.display()
        )));
    }
    progress("proving the Clevis keyslot opens through Tang");
    let key = recover_key(dev, tang, &bound.clevis_keyslots)?;
    verify_key(dev, &key)?;
    progress("destroying the temporary keyslot");
    remove_other_keyslots(dev)?;
    Ok(FormatOutcome { changed: true, steps, state: finished(dev)? })
}

fn finished(dev: &Path) -> Result<DeviceState> {
    let st = inspect(dev)?;
    if !st.is_provisioned() {
        return Err(ProvisionError::State(format!(
            "{} is not in the expected state after provisioning (keyslots {:?}, Clevis {:?}); run `holdfast-provision status` and report it",
            dev.display(),
            st.keyslots,
            st.clevis_keyslots
        )));
    }
    Ok(st)
}

/// Destroys every active keyslot no Clevis token references.
pub fn remove_other_keyslots(dev: &Path) -> Result<Vec<u32>> {
    let st = inspect(dev)?;
    if st.clevis_keyslots.is_empty() {
        return Err(ProvisionError::State(format!(
            "refusing to destroy keyslots on {}: it has no Clevis keyslot, the volume would be lost",
            dev.display()
        )));
    }
    let mut cd = CryptInit::init(dev).map_err(crypt_err("opening", dev))?;
    cd.context_handle().load::<()>(Some(EncryptionFormat::Luks2), None).map_err(crypt_err("loading the LUKS2 header", dev))?;
    for &s in &st.other_keyslots {
        cd.keyslot_handle().destroy(s).map_err(crypt_err(&format!("destroying keyslot {s}"), dev))?;
    }
    Ok(st.other_keyslots)
}

/// Recovers a Clevis keyslot's key through Tang (`clevis luks pass`). Without
/// Tang this fails: there is no fallback.
pub fn recover_key(dev: &Path, tang: &TangConfig, slots: &[u32]) -> Result<Secret> {
    let mut last = String::from("no Clevis keyslot");
    for s in slots {
        let out = Command::new("clevis")
            .args(["luks", "pass", "-d"])
            .arg(dev)
            .args(["-s", &s.to_string()])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| ProvisionError::io("running clevis luks pass (install clevis-luks with scripts/install-deps)", e))?;
        let secret = Secret(out.stdout);
        if out.status.success() && !secret.is_empty() {
            return Ok(secret);
        }
        last = String::from_utf8_lossy(&out.stderr).trim().replace('\n', "; ");
    }
    Err(ProvisionError::TangUnreachable {
        device: dev.display().to_string(),
        servers: tang.servers.iter().map(|s| format!("{} in {}", s.url, s.hall)).collect::<Vec<_>>().join(", "),
        detail: last,
    })
}

/// Checks a key against the header without activating (the library form of
/// `cryptsetup open --test-passphrase`). Returns the keyslot it opened.
pub fn verify_key(dev: &Path, key: &[u8]) -> Result<u32> {
    let mut cd = CryptInit::init(dev).map_err(crypt_err("opening", dev))?;
    cd.context_handle().load::<()>(Some(EncryptionFormat::Luks2), None).map_err(crypt_err("loading the LUKS2 header", dev))?;
    cd.activate_handle()
        .activate_by_passphrase(None, None, key, CryptActivate::empty())
        .map_err(crypt_err("checking the key recovered from Tang", dev))
}

/// Activates `/dev/mapper/<name>` with a key. Needs device-mapper (dm_crypt).
pub fn activate(dev: &Path, name: &str, key: &[u8]) -> Result<()> {
    let mut cd = CryptInit::init(dev).map_err(crypt_err("opening", dev))?;
    cd.context_handle().load::<()>(Some(EncryptionFormat::Luks2), None).map_err(crypt_err("loading the LUKS2 header", dev))?;
    cd.activate_handle()
        .activate_by_passphrase(Some(name), None, key, CryptActivate::ALLOW_DISCARDS)
        .map(|_| ())
        .map_err(|e| {
            ProvisionError::State(format!(
                "activating {} as /dev/mapper/{name} failed: {e}. The key from Tang is valid; this is the kernel side: check that device-mapper and dm_crypt are available (`modprobe dm_crypt`, `ls /dev/mapper/control`)",
                dev.display()
            ))
        })
}

/// What `unlock` did.
#[derive(Debug, Clone, Serialize)]
pub struct UnlockOutcome {
    /// Whether anything was (or would be) changed.
    pub changed: bool,
    /// Steps done, or that would be done.
    pub steps: Vec<String>,
}

/// Unlocks through Tang, creates the file system if the volume is empty,
/// mounts it and creates the data directory. Idempotent.
pub fn unlock(disk: &DiskConfig, tang: &TangConfig, dry_run: bool, progress: &mut dyn FnMut(&str)) -> Result<UnlockOutcome> {
    let dev = disk.device.as_path();
    let mapper = PathBuf::from("/dev/mapper").join(&disk.mapper_name);
    let mut steps = Vec::new();
    let mut changed = false;
    if mapper.exists() {
        steps.push(format!("{} is already unlocked", mapper.display()));
    } else {
        let st = inspect(dev)?;
        if st.clevis_keyslots.is_empty() {
            return Err(ProvisionError::State(format!(
                "{} has no Clevis binding ({}); provision it first with `holdfast-provision disk`",
                dev.display(),
                st.luks.as_deref().or(st.signature.as_deref()).unwrap_or("no LUKS header")
            )));
        }
        changed = true;
        steps.push(format!("recover the key through Tang, check it, activate {}", mapper.display()));
        if !dry_run {
            progress("recovering the volume key through Tang (no passphrase fallback)");
            let key = recover_key(dev, tang, &st.clevis_keyslots)?;
            verify_key(dev, &key)?;
            progress("activating the LUKS2 volume");
            activate(dev, &disk.mapper_name, &key)?;
        }
    }
    let fs = filesystem_and_mount(&mapper, disk, dry_run, progress)?;
    changed |= fs.changed;
    steps.extend(fs.steps);
    Ok(UnlockOutcome { changed, steps })
}

/// Whether `path` is a mount point (per /proc/self/mountinfo).
pub fn is_mounted(path: &Path) -> bool {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let want = path.display().to_string();
    info.lines().any(|l| l.split_whitespace().nth(4) == Some(want.as_str()))
}

/// mkfs when the unlocked volume is empty, mount it, create the data directory.
pub fn filesystem_and_mount(mapper: &Path, disk: &DiskConfig, dry_run: bool, progress: &mut dyn FnMut(&str)) -> Result<UnlockOutcome> {
    let mut steps = Vec::new();
    let mut changed = false;
    let sig = if mapper.exists() { signature(mapper)? } else { None };
    match sig.as_deref() {
        Some(fs) if fs == disk.filesystem => {}
        Some(other) => {
            return Err(ProvisionError::State(format!(
                "{} holds {other}, not {}: refusing to reformat the unlocked volume; fix disk.filesystem or wipe it by hand",
                mapper.display(),
                disk.filesystem
            )));
        }
        None => {
            changed = true;
            steps.push(format!("mkfs.{} {}", disk.filesystem, mapper.display()));
            if !dry_run {
                progress("creating the file system");
                run(
                    Command::new(format!("mkfs.{}", disk.filesystem)).arg("-q").arg(mapper),
                    None,
                    "check disk.filesystem names an installed mkfs",
                )?;
            }
        }
    }
    if !is_mounted(&disk.mount_point) {
        changed = true;
        steps.push(format!("mount {} on {}", mapper.display(), disk.mount_point.display()));
        if !dry_run {
            std::fs::create_dir_all(&disk.mount_point)
                .map_err(|e| ProvisionError::io(format!("creating {}", disk.mount_point.display()), e))?;
            run(
                Command::new("mount").args(["-t", &disk.filesystem, "-o", "noatime"]).arg(mapper).arg(&disk.mount_point),
                None,
                "check the mount point and the kernel log",
            )?;
        }
    }
    let mode = u32::from_str_radix(disk.mode.trim_start_matches("0o"), 8).unwrap_or(0o700);
    let d = ensure_data_dir(&disk.data_dir, &disk.owner, &disk.group, mode, dry_run)?;
    changed |= d;
    if d {
        steps.push(format!("data directory {} owned by {}:{} mode {:o}", disk.data_dir.display(), disk.owner, disk.group, mode));
    }
    Ok(UnlockOutcome { changed, steps })
}

fn resolve_ids(owner: &str, group: &str) -> Result<(nix::unistd::Uid, nix::unistd::Gid)> {
    use nix::unistd::{Gid, Group, Uid, User};
    let uid = match owner.parse::<u32>() {
        Ok(n) => Uid::from_raw(n),
        Err(_) => User::from_name(owner).ok().flatten().map(|u| u.uid).ok_or_else(|| {
            ProvisionError::State(format!("disk.owner: no user {owner:?}; create it (the etcd package's sysusers.d does) or give a uid"))
        })?,
    };
    let gid = match group.parse::<u32>() {
        Ok(n) => Gid::from_raw(n),
        Err(_) => Group::from_name(group)
            .ok()
            .flatten()
            .map(|g| g.gid)
            .ok_or_else(|| ProvisionError::State(format!("disk.group: no group {group:?}; create it or give a gid")))?,
    };
    Ok((uid, gid))
}

/// Creates the data directory with owner, group and mode; fixes them if they
/// differ. Returns whether anything changed (or would change).
pub fn ensure_data_dir(dir: &Path, owner: &str, group: &str, mode: u32, dry_run: bool) -> Result<bool> {
    use std::os::unix::fs::MetadataExt;
    let (uid, gid) = resolve_ids(owner, group)?;
    let ok = std::fs::metadata(dir)
        .map(|m| m.is_dir() && m.uid() == uid.as_raw() && m.gid() == gid.as_raw() && m.mode() & 0o7777 == mode)
        .unwrap_or(false);
    if ok || dry_run {
        return Ok(!ok);
    }
    std::fs::create_dir_all(dir).map_err(|e| ProvisionError::io(format!("creating {}", dir.display()), e))?;
    nix::unistd::chown(dir, Some(uid), Some(gid))
        .map_err(|e| ProvisionError::io(format!("chown {}", dir.display()), std::io::Error::from(e)))?;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(mode))
        .map_err(|e| ProvisionError::io(format!("chmod {}", dir.display()), e))?;
    Ok(true)
}
