//! The data device: LUKS2 through libcryptsetup, bound to Tang with Clevis,
//! no passphrase keyslot left; unlock through Tang only; file system, mount
//! and the etcd data directory.
//!
//! Formatting: libcryptsetup formats LUKS2 and adds a *temporary* keyslot
//! with a random passphrase that never leaves memory (it goes to `clevis luks
//! bind` on stdin). Clevis adds its own keyslot and token (an `sss` policy over
//! the Tang servers). The agent then proves the Clevis slot opens through
//! Tang, and destroys every keyslot no Clevis token references. A recovery
//! key, if wanted, is added by the operator and escrowed offline (see
//! docs/provisioning.md): never kept on the host.
//!
//! Unlock: `clevis luks pass` recovers the slot's key from Tang; libcryptsetup
//! checks it (`crypt_activate_by_passphrase` with no name, the library form
//! of `cryptsetup open --test-passphrase`) and then activates the mapping. No
//! passphrase is ever asked for: without Tang, the node stays locked.
//!
//! This module holds the two entry points ([`format_and_bind`], [`unlock`]),
//! [`inspect`] and the types they share; the steps live in:
//! - `luks`: libcryptsetup: the LUKS2 header, keyslots, key checks, activation;
//! - `clevis`: the Clevis binding: the `sss` policy over Tang, `clevis luks
//!   bind`, the Clevis tokens in the header, `clevis luks pass`;
//! - `mount`: the unlocked volume: mkfs, mount, the data directory.

mod clevis;
mod luks;
mod mount;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde::Serialize;

use crate::config::{DiskConfig, TangConfig};
use crate::error::{ProvisionError, Result};

pub use clevis::{recover_key, sss_policy};
pub use luks::{activate, remove_other_keyslots, verify_key};
pub use mount::{ensure_data_dir, filesystem_and_mount, is_mounted};

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

/// Inspects a device: signature, LUKS header, keyslots and Clevis tokens.
pub fn inspect(device: &Path) -> Result<DeviceState> {
    if !device.exists() {
        return Err(ProvisionError::State(format!(
            "{} does not exist: check disk.device in provision.toml (use a /dev/disk/by-id/ path)",
            device.display()
        )));
    }
    let mut st = DeviceState { device: device.to_owned(), signature: signature(device)?, ..Default::default() };
    if let Some(mut cd) = luks::open_luks(device)? {
        st.luks = luks::version(&mut cd);
        st.keyslots = luks::active_keyslots(&mut cd);
        st.clevis_keyslots = clevis::clevis_slots(&mut cd);
        st.other_keyslots = st.keyslots.iter().copied().filter(|s| !st.clevis_keyslots.contains(s)).collect();
    }
    Ok(st)
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
    if !force && let Some(what) = state.luks.clone().or(state.signature.clone()) {
        return Err(ProvisionError::DeviceInUse {
            device: dev.display().to_string(),
            what: if state.luks.is_some() { format!("a {what} header without a Clevis binding") } else { format!("a {what} signature") },
        });
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
    luks::format_with_temporary_keyslot(dev, &temp)?;
    progress("binding to Tang with clevis luks bind (sss)");
    clevis::bind(dev, tang, &temp)?;
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
