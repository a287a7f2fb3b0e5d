//! `holdfastctl approve REQUEST --ssh-key KEY`: show a two-person request and
//! sign it with `ssh-keygen -Y sign` under the holdfast namespace.
//!
//! Signing is OpenSSH's own (FIDO2 keys prompt for a touch there); this
//! command reads the request once, shows what is being approved, refuses a
//! file that is not a request, and signs exactly the bytes it showed
//! (through ssh-keygen's standard input: no copy, no second read). The
//! signature is named after the key so two approvers' signatures sit side
//! by side (`REQUEST.<key>.sig`).

use holdfast_approval::{Approved, Approvers, NAMESPACE, Operation, Refusal, Request};
use holdfast_cli::exit;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{SystemTime, UNIX_EPOCH};

#[derive(clap::Args)]
#[command(after_long_help = "\
The signature covers the request's bytes exactly: sign the file you were
given, unchanged. The same signature by hand:
  ssh-keygen -Y sign -n holdfast-request -f KEY REQUEST

Examples:
  holdfastctl approve /var/lib/holdfast/requests/epoch-advance-3f9a1c.toml --ssh-key ~/.ssh/id_ed25519_sk
  holdfastctl approve REQUEST --ssh-key ~/.ssh/id_ed25519 --out /tmp/bob.sig

Exit status: 0 signed; 65 not a request; 70 ssh-keygen failed.")]
pub struct ApproveArgs {
    /// The request file (from `holdfastctl epoch advance-request`).
    request: PathBuf,
    /// Your OpenSSH private key (or a FIDO2 key handle); its public key must
    /// be yours in approvers.toml.
    #[arg(long)]
    ssh_key: PathBuf,
    /// Where to write the signature; default REQUEST.<key file name>.sig.
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What a request asks for, in words, for whoever is about to sign it.
pub fn describe(r: &Request) -> String {
    let what = match &r.operation {
        Operation::EpochAdvance { cluster, expected_epoch, new_epoch, cluster_id, highest_known } => format!(
            "advance the epoch of cluster {cluster} (cluster ID {cluster_id}) from {expected_epoch} to {new_epoch}, \
             above {highest_known}, the highest epoch any arbiter or the allocator knew: \
             every hold, waiter and session of epoch {expected_epoch} ends"
        ),
        Operation::ForceRelease { cluster_id, namespace, key, holder, session, granted_unix_ms, class, fenced, revoke_session } => format!(
            "force-release {namespace}/{key} on cluster ID {cluster_id}: the hold of {holder} (session {session:x}, granted {}), class {class}, {}{}",
            time_ms(*granted_unix_ms),
            if *fenced { "fenced" } else { "ADVISORY (not fenced: the holder may go on writing, a second writer may follow)" },
            if *revoke_session { "; the holder's session ends too" } else { "" },
        ),
        _ => r.operation.kind().to_string(),
    };
    format!(
        "request   {}\noperation {what}\nrequester {}\nreason    {}\nexpires   {} (unix {})\nrole      {} (both signers)\n",
        r.name(),
        r.requester,
        r.reason,
        humantime::format_rfc3339_seconds(UNIX_EPOCH + std::time::Duration::from_secs(r.expires_unix)),
        r.expires_unix,
        r.operation.role(),
    )
}

/// A wall-clock time in milliseconds since the Unix epoch, as RFC 3339.
pub fn time_ms(ms: u64) -> String {
    humantime::format_rfc3339_millis(UNIX_EPOCH + std::time::Duration::from_millis(ms)).to_string()
}

pub fn run(args: ApproveArgs) -> u8 {
    // Read once: what is shown is what is signed, whatever happens to the
    // file afterwards.
    let bytes = match std::fs::read(&args.request) {
        Ok(b) => b,
        Err(e) => {
            eprintln!("holdfastctl: cannot read {}: {e}", args.request.display());
            return exit::INVALID;
        }
    };
    let request = match std::str::from_utf8(&bytes).map_err(|_| "not UTF-8".to_string()).and_then(Request::parse) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("holdfastctl: {}: {e}; nothing was signed", args.request.display());
            return exit::INVALID;
        }
    };
    print!("{}", describe(&request));
    let out = args.out.unwrap_or_else(|| default_signature_path(&args.request, &args.ssh_key));
    match sign(&bytes, &args.ssh_key, &out) {
        Ok(()) => {
            println!("signed: {}", out.display());
            exit::OK
        }
        Err(e) => {
            eprintln!("holdfastctl: {e}");
            exit::SOFTWARE
        }
    }
}

pub fn default_signature_path(request: &Path, key: &Path) -> PathBuf {
    let key_name = key.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_else(|| "key".into());
    let mut name = request.as_os_str().to_owned();
    name.push(format!(".{key_name}.sig"));
    PathBuf::from(name)
}

/// Signs `bytes` (the request as read and shown) through ssh-keygen's
/// standard input, so no file can be swapped in between; the signature
/// comes back on its standard output and is written to `out`, never through
/// a symbolic link.
fn sign(bytes: &[u8], key: &Path, out: &Path) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut child = Command::new("ssh-keygen")
        .args(["-Y", "sign", "-n", NAMESPACE, "-f"])
        .arg(key)
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| format!("running ssh-keygen (is openssh-client installed?): {e}"))?;
    // ssh-keygen reads all of standard input before it signs (and before a
    // FIDO2 key asks for its touch), so writing first cannot deadlock.
    let written = child.stdin.take().map(|mut stdin| stdin.write_all(bytes));
    let output = child.wait_with_output().map_err(|e| format!("waiting for ssh-keygen: {e}"))?;
    if !output.status.success() || !output.stdout.starts_with(b"-----BEGIN SSH SIGNATURE-----") {
        return Err(format!("ssh-keygen -Y sign failed ({}); nothing was signed", output.status));
    }
    if let Some(Err(e)) = written {
        return Err(format!("handing the request to ssh-keygen: {e}; nothing was signed"));
    }
    std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o644)
        .custom_flags(nix::libc::O_NOFOLLOW)
        .open(out)
        .and_then(|mut f| f.write_all(&output.stdout))
        .map_err(|e| format!("writing {}: {e} (a symbolic link there is refused)", out.display()))
}

/// Where two-person operations find approvers and keep requests.
#[derive(clap::Args)]
pub struct Files {
    /// Who may approve.
    #[arg(long, env = "HOLDFAST_APPROVERS", default_value = "/etc/holdfast/approvers.toml")]
    pub approvers: PathBuf,
    /// Requests (STATE_DIR/requests/) and the epoch history (STATE_DIR/epochs.log).
    #[arg(long, env = "HOLDFAST_STATE_DIR", default_value = "/var/lib/holdfast")]
    pub state_dir: PathBuf,
}

pub fn now_unix() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).map(|d| d.as_secs()).unwrap_or(0)
}

/// Reads approvers.toml, refusing one whose owner or mode would let
/// another user add an approver (see `holdfast_tls::trust`).
pub fn load_approvers(path: &Path) -> Result<Approvers, u8> {
    use holdfast_tls::trust;
    let problem = |why: String| {
        eprintln!("holdfastctl: {}: {why}", path.display());
        exit::CONFIG
    };
    let bytes = trust::read(path, trust::Kind::Public).map_err(|e| match e {
        trust::Refused::Io(e) => problem(format!("cannot read the file ({e})")),
        trust::Refused::Insecure(why) => problem(format!("{why}; nothing was done")),
    })?;
    let text = String::from_utf8(bytes).map_err(|_| problem("not UTF-8".into()))?;
    Approvers::from_text(path, &text).map_err(|e| {
        eprintln!("holdfastctl: {e}");
        exit::CONFIG
    })
}

/// The signatures: the ones given, else every `REQUEST.*.sig` beside it.
pub fn signatures(request: &Path, given: &[PathBuf]) -> Result<Vec<String>, String> {
    let files: Vec<PathBuf> = if !given.is_empty() {
        given.to_vec()
    } else {
        let name = request.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
        let dir = request.parent().filter(|p| !p.as_os_str().is_empty()).unwrap_or(Path::new("."));
        let mut found: Vec<PathBuf> = std::fs::read_dir(dir)
            .map_err(|e| format!("listing {}: {e}", dir.display()))?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| {
                p.file_name().map(|n| n.to_string_lossy()).is_some_and(|n| n.starts_with(&format!("{name}.")) && n.ends_with(".sig"))
            })
            .collect();
        found.sort();
        found
    };
    files.iter().map(|f| std::fs::read_to_string(f).map_err(|e| format!("reading the signature {}: {e}", f.display()))).collect()
}

/// Reads approvers.toml, the request and its signatures (`given`, else
/// every `REQUEST.*.sig`), and verifies the approvals. On any failure it
/// says why and returns the exit status: 78 unreadable, 77 refused.
pub fn verified(files: &Files, request: &Path, given: &[PathBuf]) -> Result<Approved, u8> {
    let approvers = load_approvers(&files.approvers)?;
    let bytes = std::fs::read(request).map_err(|e| {
        eprintln!("holdfastctl: reading the request {}: {e}", request.display());
        exit::CONFIG
    })?;
    let sigs = signatures(request, given).map_err(|e| {
        eprintln!("holdfastctl: {e}");
        exit::CONFIG
    })?;
    holdfast_approval::verify(&bytes, &sigs, &approvers, now_unix()).map_err(|e| {
        eprintln!("holdfastctl: refused, nothing was changed: {e}");
        if matches!(e, Refusal::Unreadable(_)) { exit::CONFIG } else { exit::NOPERM }
    })
}

/// A new request for `op` (fresh nonce, `valid_for`), written to
/// STATE_DIR/requests/NAME.toml and shown; returns it and its path, or the
/// exit status (70 no random nonce, 78 unwritable).
pub fn new_request(
    files: &Files,
    requester: &str,
    reason: &str,
    op: Operation,
    valid_for: std::time::Duration,
) -> Result<(Request, PathBuf), u8> {
    let request = Request::new(requester, reason, op, now_unix(), valid_for).map_err(|e| {
        eprintln!("holdfastctl: {e}");
        exit::SOFTWARE
    })?;
    let path = write_request(files, &request)?;
    Ok((request, path))
}

/// Writes a request to STATE_DIR/requests/NAME.toml and shows what it asks
/// for; returns its path (or 78).
fn write_request(files: &Files, request: &Request) -> Result<PathBuf, u8> {
    let dir = files.state_dir.join("requests");
    let path = dir.join(format!("{}.toml", request.name()));
    std::fs::create_dir_all(&dir).and_then(|()| std::fs::write(&path, request.render())).map_err(|e| {
        eprintln!("holdfastctl: writing {}: {e}", path.display());
        exit::CONFIG
    })?;
    print!("{}", describe(request));
    Ok(path)
}
