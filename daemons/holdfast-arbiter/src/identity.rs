//! Caller identity: the single `spiffe://` URI SAN of the client certificate,
//! in the arbiter's trust domain (`tls.trust_domain`), and the end of the
//! certificate's validity. rustls checks validity at the handshake only; a
//! connection can outlive its certificate, so every call checks it again
//! ([`expired`]), and a keepalive stream ends at the expiry.

use x509_parser::extensions::GeneralName;
use x509_parser::prelude::{FromDer, X509Certificate};

/// Extracts the SPIFFE ID from a DER client certificate, and its notAfter
/// in Unix seconds. The message of the error names what is wrong with the
/// certificate and what to issue instead. An ID of another trust domain is
/// refused even when the CA vouches for it (one CA may serve several
/// domains).
pub fn identify(der: &[u8], trust_domain: &str) -> Result<(String, i64), String> {
    let (_, cert) = X509Certificate::from_der(der).map_err(|e| format!("client certificate could not be parsed ({e})"))?;
    let not_after = cert.validity().not_after.timestamp();
    id_of(&cert, trust_domain).map(|id| (id, not_after))
}

/// Why a certificate valid until `not_after` (Unix seconds) is refused at
/// `now`, if it is.
pub fn expired(not_after: i64, now: i64) -> Option<String> {
    (now > not_after).then(|| {
        let at = humantime::format_rfc3339_seconds(std::time::UNIX_EPOCH + std::time::Duration::from_secs(not_after.max(0) as u64));
        format!("client certificate expired at {at}, after this connection was made; renew it (the client reconnects with the new one)")
    })
}

/// Seconds since the Unix epoch, now.
pub fn now() -> i64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs() as i64)
}

fn id_of(cert: &X509Certificate<'_>, trust_domain: &str) -> Result<String, String> {
    let san = cert.subject_alternative_name().map_err(|e| format!("client certificate has a malformed subjectAltName ({e})"))?;
    let uris: Vec<&str> = san
        .map(|ext| {
            ext.value
                .general_names
                .iter()
                .filter_map(|n| match n {
                    GeneralName::URI(u) => Some(*u),
                    _ => None,
                })
                .collect()
        })
        .unwrap_or_default();
    let spiffe: Vec<&str> = uris.iter().copied().filter(|u| u.starts_with("spiffe://")).collect();
    match spiffe.as_slice() {
        [] => Err("client certificate URI SAN: no spiffe:// ID; issue the workload an X.509 SVID (a certificate with one URI SAN spiffe://<trust-domain>/<path>)".into()),
        [one] if uris.len() == 1 => validate(one, trust_domain).map(|()| one.to_string()),
        _ => Err("client certificate URI SAN: an SVID carries exactly one URI SAN; this certificate has several".into()),
    }
}

fn validate(id: &str, trust_domain: &str) -> Result<(), String> {
    let rest = &id["spiffe://".len()..];
    let (domain, path) = rest.split_once('/').unwrap_or((rest, ""));
    let ok_domain = !domain.is_empty() && domain.bytes().all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b"-._".contains(&b));
    if !ok_domain {
        return Err(format!("client certificate URI SAN: {id:?} has an invalid trust domain"));
    }
    if domain != trust_domain {
        return Err(format!(
            "client certificate URI SAN: {id:?} is in trust domain {domain:?}, but this arbiter serves {trust_domain:?}; \
             issue the workload an SVID of spiffe://{trust_domain}/..."
        ));
    }
    if path.split('/').any(|s| s == "." || s == "..") || path.ends_with('/') {
        return Err(format!("client certificate URI SAN: {id:?} has an invalid path"));
    }
    Ok(())
}
