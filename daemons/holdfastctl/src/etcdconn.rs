//! What the commands that read etcd directly (`status`, `shard`) share: the
//! TLS files checked before connecting, and an etcd error turned into one
//! message and an exit status.

use holdfast_cli::exit;
use holdfast_config::EtcdConfig;

/// Checks the TLS files of `config` before connecting, so that a bad path
/// is a configuration error (78), not an unreachable etcd (69).
pub fn check_files(config: &EtcdConfig) -> Result<(), u8> {
    if config.cert_file.is_some() != config.key_file.is_some() {
        eprintln!("holdfastctl: --etcd-cert and --etcd-key go together; pass both or neither");
        return Err(exit::CONFIG);
    }
    for (what, file) in [("CA", &config.ca_file), ("certificate", &config.cert_file), ("key", &config.key_file)] {
        if let Some(f) = file
            && let Err(e) = std::fs::read(f)
        {
            eprintln!("holdfastctl: cannot read the etcd {what} {}: {e}", f.display());
            return Err(exit::CONFIG);
        }
    }
    Ok(())
}

/// What the failed etcd call did: read `what`, or write it as the etcd user
/// `user` (whose refusal means the wrong certificate, 77).
pub enum Access<'a> {
    Read(&'a str),
    Write { what: &'a str, user: &'a str },
}

/// Why etcd failed, printed, as an exit status: a refused write 77, refused
/// credentials 78, anything else 69.
pub fn failure(access: Access, e: &etcd_client::Error) -> u8 {
    // gRPC codes: 7 PermissionDenied, 16 Unauthenticated.
    let code = match e {
        etcd_client::Error::GRpcStatus(s) => Some(s.code() as i32),
        _ => None,
    };
    let what = match access {
        Access::Write { what, user } if code == Some(7) => {
            eprintln!("holdfastctl: etcd refused to write {what}: {e}. That needs the {user} user (a certificate with CN={user}).");
            return exit::NOPERM;
        }
        Access::Read(what) | Access::Write { what, .. } => what,
    };
    if matches!(code, Some(7 | 16)) {
        eprintln!("holdfastctl: etcd refused the credentials ({what}): {e}. Check --etcd-cert/--etcd-key (or --coord-cert/--coord-key).");
        exit::CONFIG
    } else {
        eprintln!("holdfastctl: etcd could not be reached ({what}): {e}. Is etcd up, and are the endpoints and TLS flags right?");
        exit::UNAVAILABLE
    }
}
