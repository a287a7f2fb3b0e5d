//! A throwaway CA for dev and tests, issuing X.509 SVIDs (one
//! `spiffe://` URI SAN) for workloads and a server certificate for the
//! arbiter. Keys are written with mode 0600.

use anyhow::Context;
use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, Issuer, KeyPair, KeyUsagePurpose, SanType};
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

pub const DEV_TRUST_DOMAIN: &str = "holdfast.dev";

pub struct DevCa {
    dir: PathBuf,
    issuer: Issuer<'static, KeyPair>,
}

/// Paths of an issued certificate and its key.
#[derive(Debug, Clone)]
pub struct Issued {
    pub cert: PathBuf,
    pub key: PathBuf,
}

impl DevCa {
    /// Opens the CA in `dir` (`ca.pem`, `ca-key.pem`), creating it if absent.
    pub fn open_or_create(dir: &Path) -> anyhow::Result<Self> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let (cert_path, key_path) = (dir.join("ca.pem"), dir.join("ca-key.pem"));
        // Reopening rebuilds the issuer from the key and the same subject:
        // signing needs only those, so no X.509 parser ships in holdfastctl.
        let issuer = if cert_path.exists() && key_path.exists() {
            let key = KeyPair::from_pem(&std::fs::read_to_string(&key_path)?).context("reading the dev CA key")?;
            Issuer::new(ca_params()?, key)
        } else {
            let key = KeyPair::generate()?;
            let params = ca_params()?;
            let cert = params.self_signed(&key)?;
            std::fs::write(&cert_path, cert.pem())?;
            write_secret(&key_path, &key.serialize_pem())?;
            Issuer::new(params, key)
        };
        Ok(DevCa { dir: dir.to_path_buf(), issuer })
    }

    pub fn ca_path(&self) -> PathBuf {
        self.dir.join("ca.pem")
    }

    /// Issues `<name>.pem` / `<name>-key.pem` with the given DNS/IP names and
    /// URI SANs (pass none for a certificate without a SPIFFE ID).
    pub fn issue(&self, name: &str, dns_or_ip: &[&str], uris: &[&str]) -> anyhow::Result<Issued> {
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(dns_or_ip.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
        params.distinguished_name.push(DnType::CommonName, name);
        for uri in uris {
            params.subject_alt_names.push(SanType::URI((*uri).try_into()?));
        }
        let cert = params.signed_by(&key, &self.issuer)?;
        let issued = Issued { cert: self.dir.join(format!("{name}.pem")), key: self.dir.join(format!("{name}-key.pem")) };
        std::fs::write(&issued.cert, cert.pem())?;
        write_secret(&issued.key, &key.serialize_pem())?;
        Ok(issued)
    }

    /// Issues a workload SVID for `spiffe://holdfast.dev/<path>`.
    pub fn workload(&self, name: &str, path: &str) -> anyhow::Result<Issued> {
        self.issue(name, &[], &[&format!("spiffe://{DEV_TRUST_DOMAIN}/{path}")])
    }

    /// Issues the arbiter's server certificate for loopback.
    pub fn server(&self, name: &str) -> anyhow::Result<Issued> {
        self.issue(name, &["localhost", "127.0.0.1"], &[&format!("spiffe://{DEV_TRUST_DOMAIN}/holdfast/{name}")])
    }
}

/// The dev CA's subject and constraints (the same on every open).
fn ca_params() -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    params.distinguished_name.push(DnType::CommonName, "holdfast dev CA (throwaway)");
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign, KeyUsagePurpose::DigitalSignature];
    Ok(params)
}

fn write_secret(path: &Path, contents: &str) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))?;
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o600))?;
    Ok(())
}
