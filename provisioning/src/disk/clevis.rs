//! The Clevis binding: the `sss` policy over the Tang servers, `clevis luks
//! bind`, the Clevis tokens in the LUKS2 header, and `clevis luks pass` to
//! recover a keyslot's key through Tang.

use std::path::Path;
use std::process::{Command, Stdio};

use libcryptsetup_rs::CryptDevice;

use super::luks::MAX_SLOTS;
use super::{Secret, run};
use crate::config::TangConfig;
use crate::error::{ProvisionError, Result};

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

/// Binds `dev` to Tang: `clevis luks bind` with the `sss` policy adds a
/// keyslot and a Clevis token, opening the header with `temp`.
///
/// clevis makes the new keyslot's key with `pwmake`, which now and then
/// draws a password that libpwquality's own checks reject ("Password
/// generation failed - required entropy too low for settings"; seen once in
/// CI) and stops before it touches the header: that failure is drawn again,
/// up to [`BIND_TRIES`] tries in all.
pub(super) fn bind(dev: &Path, tang: &TangConfig, temp: &Secret) -> Result<()> {
    let policy = sss_policy(tang)?;
    let mut tries = 1;
    loop {
        let bound = run(
            Command::new("clevis").args(["luks", "bind", "-y", "-d"]).arg(dev).args(["-k", "-", "sss", &policy]),
            Some(temp.bytes()),
            "check that the Tang servers in provision.toml answer GET /adv from this host",
        );
        match bound {
            Err(ProvisionError::Tool { detail, .. }) if tries < BIND_TRIES && detail.contains(PWMAKE_FAILED) => tries += 1,
            other => return other.map(|_| ()),
        }
    }
}

/// How many times `clevis luks bind` is run when `pwmake` fails.
const BIND_TRIES: u32 = 3;
/// libpwquality's message when `pwmake` drew no password its checks accept.
const PWMAKE_FAILED: &str = "Password generation failed";

/// Keyslots referenced by Clevis tokens.
pub(super) fn clevis_slots(cd: &mut CryptDevice) -> Vec<u32> {
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
