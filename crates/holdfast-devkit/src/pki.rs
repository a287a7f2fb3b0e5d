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
        self.issue_cn(name, name, dns_or_ip, uris)
    }

    /// Like [`DevCa::issue`], with a common name other than the file name.
    pub fn issue_cn(&self, name: &str, common_name: &str, dns_or_ip: &[&str], uris: &[&str]) -> anyhow::Result<Issued> {
        self.issue_with(name, params(common_name, dns_or_ip, uris)?)
    }

    /// Issues `<name>.pem` / `<name>-key.pem` from `params` as given (tests
    /// use it for certificates that must be refused: expired, not yet
    /// valid, a CA as a leaf).
    pub fn issue_with(&self, name: &str, params: CertificateParams) -> anyhow::Result<Issued> {
        let key = KeyPair::generate()?;
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

    /// An etcd client certificate for the etcd user `user`: etcd with
    /// `--client-cert-auth` takes the user from the common name.
    pub fn etcd_user(&self, user: &str) -> anyhow::Result<Issued> {
        self.issue_cn(&format!("etcd-user-{user}"), user, &[], &[])
    }

    /// The etcd members' certificate (server and peer) for `hosts` and
    /// loopback.
    pub fn etcd_member(&self, hosts: &[&str]) -> anyhow::Result<Issued> {
        let mut names = vec!["localhost", "127.0.0.1"];
        names.extend(hosts.iter().filter(|h| !["localhost", "127.0.0.1"].contains(h)));
        self.issue_cn("etcd-member", MEMBER_CN, &names, &[])
    }

    /// The arbiter's `[tls]` for a server certificate of this CA: clients
    /// from this CA, in the dev trust domain.
    pub fn arbiter_tls(&self, server: &Issued) -> holdfast_config::arbiter::TlsConfig {
        holdfast_config::arbiter::TlsConfig {
            cert_file: server.cert.clone(),
            key_file: server.key.clone(),
            client_ca_file: self.ca_path(),
            trust_domain: DEV_TRUST_DOMAIN.into(),
        }
    }

    /// Issues the arbiter's server certificate for loopback.
    pub fn server(&self, name: &str) -> anyhow::Result<Issued> {
        self.issue(name, &["localhost", "127.0.0.1"], &[&format!("spiffe://{DEV_TRUST_DOMAIN}/holdfast/{name}")])
    }
}

/// etcd's own CA (not the workloads'), for a cluster run with client and
/// peer TLS and `--client-cert-auth`: the members' certificate, and a
/// client certificate per etcd user (the CN is the user, so no tool holds a
/// password). The dev appliance, the gate and the tests use it.
pub struct EtcdPki {
    pub ca: DevCa,
}

impl EtcdPki {
    /// Opens the CA in `dir`, creating it if absent.
    pub fn open_or_create(dir: &Path) -> anyhow::Result<Self> {
        Ok(EtcdPki { ca: DevCa::open_or_create(dir)? })
    }

    /// The members' TLS files, valid for `hosts` and loopback.
    pub fn member_tls(&self, hosts: &[&str]) -> anyhow::Result<crate::etcd::MemberTls> {
        let member = self.ca.etcd_member(hosts)?;
        Ok(crate::etcd::MemberTls { cert: member.cert, key: member.key, ca: self.ca.ca_path() })
    }

    /// How to reach `endpoints` as the etcd user `user` (its certificate is
    /// issued on first use and reused after).
    pub fn config_as(&self, user: &str, endpoints: Vec<String>) -> anyhow::Result<holdfast_config::EtcdConfig> {
        let dir = &self.ca.dir;
        let issued = Issued { cert: dir.join(format!("etcd-user-{user}.pem")), key: dir.join(format!("etcd-user-{user}-key.pem")) };
        let issued = if issued.cert.exists() && issued.key.exists() { issued } else { self.ca.etcd_user(user)? };
        Ok(holdfast_config::EtcdConfig {
            ca_file: Some(self.ca.ca_path()),
            cert_file: Some(issued.cert),
            key_file: Some(issued.key),
            ..holdfast_config::EtcdConfig::plain(endpoints)
        })
    }
}

/// The common name of every etcd member certificate this CA issues; the
/// members accept peers with this CN only (`--peer-cert-allowed-cn`).
pub const MEMBER_CN: &str = "holdfast etcd member";

/// A leaf's parameters: the common name, DNS/IP names and URI SANs.
pub fn params(common_name: &str, dns_or_ip: &[&str], uris: &[&str]) -> anyhow::Result<CertificateParams> {
    let mut params = CertificateParams::new(dns_or_ip.iter().map(|s| s.to_string()).collect::<Vec<_>>())?;
    params.distinguished_name.push(DnType::CommonName, common_name);
    for uri in uris {
        params.subject_alt_names.push(SanType::URI((*uri).try_into()?));
    }
    Ok(params)
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
