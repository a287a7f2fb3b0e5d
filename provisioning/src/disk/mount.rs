//! The unlocked volume: mkfs when it is empty, the mount, and the etcd data
//! directory with its owner and mode.

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::process::Command;

use super::{UnlockOutcome, run, signature};
use crate::config::DiskConfig;
use crate::error::{ProvisionError, Result};

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
