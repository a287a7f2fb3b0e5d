//! libcryptsetup: the LUKS2 header, its keyslots, checking a key against them
//! and activating the mapping.

use std::path::Path;

use libcryptsetup_rs::consts::flags::{CryptActivate, CryptVolumeKey};
use libcryptsetup_rs::consts::vals::{CryptKdf, EncryptionFormat, KeyslotInfo};
use libcryptsetup_rs::{CryptDevice, CryptInit, CryptPbkdfType, Either};

use super::{Secret, inspect};
use crate::error::{ProvisionError, Result};

/// LUKS2 maximum keyslots / tokens.
pub(super) const MAX_SLOTS: u32 = 32;

pub(super) fn crypt_err(step: &str, device: &Path) -> impl FnOnce(libcryptsetup_rs::LibcryptErr) -> ProvisionError {
    let (step, device) = (step.to_string(), device.display().to_string());
    move |source| ProvisionError::Crypt { step, device, source }
}

/// The header, if one loads.
pub(super) fn open_luks(device: &Path) -> Result<Option<CryptDevice>> {
    let mut cd = CryptInit::init(device).map_err(crypt_err("opening", device))?;
    match cd.context_handle().load::<()>(None, None) {
        Ok(()) => Ok(Some(cd)),
        Err(_) => Ok(None),
    }
}

/// The LUKS version of a loaded header, e.g. `LUKS2`.
pub(super) fn version(cd: &mut CryptDevice) -> Option<String> {
    cd.format_handle().get_type().ok().map(|t| match t {
        EncryptionFormat::Luks2 => "LUKS2".to_string(),
        EncryptionFormat::Luks1 => "LUKS1".to_string(),
        other => format!("{other:?}"),
    })
}

/// Active keyslots of a loaded header.
pub(super) fn active_keyslots(cd: &mut CryptDevice) -> Vec<u32> {
    (0..MAX_SLOTS).filter(|&s| matches!(cd.keyslot_handle().status(s), Ok(KeyslotInfo::Active | KeyslotInfo::ActiveLast))).collect()
}

/// Formats `dev` as LUKS2 (aes-xts-plain64, 512-bit key) with one keyslot
/// holding `temp`, the temporary passphrase `clevis luks bind` is given.
pub(super) fn format_with_temporary_keyslot(dev: &Path, temp: &Secret) -> Result<()> {
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
    Ok(())
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
