//! Approvals made by the real `ssh-keygen -Y sign`, and every refusal.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_approval::request::DEFAULT_VALIDITY;
use holdfast_approval::{Approvers, NAMESPACE, Operation, Refusal, Request, verify};
use std::path::{Path, PathBuf};
use std::process::Command;

struct Keys {
    dir: tempfile::TempDir,
}

impl Keys {
    fn new() -> Self {
        Keys { dir: tempfile::tempdir().unwrap() }
    }

    /// A new key pair (`ssh-keygen -t KIND`); returns the private key's path.
    fn key(&self, name: &str, kind: &str) -> PathBuf {
        let path = self.dir.path().join(name);
        let out = Command::new("ssh-keygen").args(["-q", "-t", kind, "-N", "", "-C", name, "-f"]).arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        path
    }

    fn public(&self, key: &Path) -> String {
        std::fs::read_to_string(key.with_extension("pub")).unwrap().trim().to_string()
    }

    /// `ssh-keygen -Y sign -n NAMESPACE -f KEY` over `bytes`.
    fn sign(&self, key: &Path, namespace: &str, bytes: &[u8]) -> String {
        let file = self.dir.path().join(format!("req-{}", rand_suffix()));
        std::fs::write(&file, bytes).unwrap();
        let out = Command::new("ssh-keygen").args(["-Y", "sign", "-n", namespace, "-f"]).arg(key).arg(&file).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        std::fs::read_to_string(file.with_extension("sig")).unwrap()
    }
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap().as_nanos() as u64
}

fn request(requester: &str) -> (Request, Vec<u8>) {
    let op = Operation::EpochAdvance { cluster: "entity-1".into(), expected_epoch: 2, new_epoch: 3, cluster_id: 42, highest_known: 2 };
    let r = Request::new(requester, "restored after a disk loss", op, 1_700_000_000, DEFAULT_VALIDITY).unwrap();
    let bytes = r.render().into_bytes();
    (r, bytes)
}

const NOW: u64 = 1_700_000_100;

#[test]
fn two_approvers_with_the_role_approve_and_every_broken_rule_is_refused() {
    let keys = Keys::new();
    let (alice, bob, carol, mallory) =
        (keys.key("alice", "ed25519"), keys.key("bob", "ed25519"), keys.key("carol", "ed25519"), keys.key("mallory", "ed25519"));
    let approvers = Approvers::parse(&format!(
        "[approver.alice]\nroles = [\"dr-operator\"]\nkeys = [{:?}]\n\n\
         [approver.bob]\nroles = [\"dr-operator\", \"lock-operator\"]\nkeys = [{:?}]\nidentity = \"spiffe://corp/ops/bob\"\n\n\
         [approver.carol]\nroles = [\"lock-operator\"]\nkeys = [{:?}]\n",
        keys.public(&alice),
        keys.public(&bob),
        keys.public(&carol)
    ))
    .unwrap();
    let (req, bytes) = request("alice");
    let sign = |key: &Path| keys.sign(key, NAMESPACE, &bytes);
    let (a, b) = (sign(&alice), sign(&bob));

    let ok = verify(&bytes, &[a.clone(), b.clone()], &approvers, NOW).unwrap();
    assert_eq!(ok.signers, ["alice", "bob"]);
    // Each signer's identity, in the signers' order (force-release checks their grants).
    assert_eq!(ok.identities, [None, Some("spiffe://corp/ops/bob".to_string())]);
    assert_eq!(ok.request, req);
    // The order of the signatures does not matter.
    assert_eq!(verify(&bytes, &[b.clone(), a.clone()], &approvers, NOW).unwrap().signers, ["alice", "bob"]);

    let refused = |sigs: &[String], bytes: &[u8], now: u64| verify(bytes, sigs, &approvers, now).unwrap_err();
    // One signature; the requester twice; the approver without the requester.
    assert_eq!(refused(std::slice::from_ref(&a), &bytes, NOW), Refusal::OnePerson("alice".into()));
    assert_eq!(refused(&[a.clone(), sign(&alice)], &bytes, NOW), Refusal::OnePerson("alice".into()));
    assert_eq!(refused(std::slice::from_ref(&b), &bytes, NOW), Refusal::RequesterMissing("alice".into()));
    // A signer without the role; a key not listed.
    assert_eq!(
        refused(&[a.clone(), sign(&carol)], &bytes, NOW),
        Refusal::MissingRole { approver: "carol".into(), role: holdfast_approval::Role::DrOperator }
    );
    assert!(matches!(refused(&[a.clone(), sign(&mallory)], &bytes, NOW), Refusal::UnknownKey { index: 2, .. }));
    // Expired: at the expiry second and after.
    assert!(matches!(refused(&[a.clone(), b.clone()], &bytes, req.expires_unix), Refusal::Expired { .. }));
    // One byte changed in the reason: both signatures fail.
    let mut tampered = bytes.clone();
    let at = String::from_utf8(bytes.clone()).unwrap().find("disk loss").unwrap();
    tampered[at] = b'D';
    assert_eq!(refused(&[a.clone(), b.clone()], &tampered, NOW), Refusal::BadSignature { index: 1, approver: "alice".into() });
    // A signature made for another namespace (here git's `file`).
    let other = keys.sign(&bob, "file", &bytes);
    assert_eq!(
        refused(&[a.clone(), other], &bytes, NOW),
        Refusal::WrongNamespace { index: 2, namespace: "file".into(), expected: NAMESPACE }
    );
    // A signature of another request.
    let (_, second) = request("alice");
    assert!(matches!(refused(&[a.clone(), keys.sign(&bob, NAMESPACE, &second)], &bytes, NOW), Refusal::BadSignature { index: 2, .. }));
    // Not a signature at all.
    assert!(matches!(refused(&[a, "hello".into()], &bytes, NOW), Refusal::Malformed { index: 2, .. }));
}

#[test]
fn a_fido_sk_key_is_accepted_and_bad_approver_files_name_every_problem() {
    use ssh_key::public::{Ed25519PublicKey, KeyData, SkEd25519};
    let sk = ssh_key::PublicKey::new(KeyData::SkEd25519(SkEd25519::new(Ed25519PublicKey([7; 32]), String::from("ssh:"))), "dana@yubikey");
    let line = sk.to_openssh().unwrap();
    assert!(line.starts_with("sk-ssh-ed25519@openssh.com "), "{line}");
    let keys = Keys::new();
    let eve = keys.key("eve", "ed25519");
    let good = format!(
        "[approver.dana]\nroles = [\"dr-operator\"]\nkeys = [{line:?}]\n[approver.eve]\nroles = [\"dr-operator\"]\nkeys = [{:?}]\n",
        keys.public(&eve)
    );
    let a = Approvers::parse(&good).unwrap();
    assert_eq!(a.approvers["dana"].keys[0].algorithm(), ssh_key::Algorithm::SkEd25519);

    let bad = format!(
        "[approver.dana]\nroles = [\"dr-operator\", \"root\"]\nkeys = [{line:?}, \"ssh-ed25519 AAAAnotakey\"]\n\
         identity = \"corp/ops/dana\"\n\
         [approver.Eve]\nroles = []\nkeys = [{line:?}]\n"
    );
    let problems = Approvers::parse(&bad).unwrap_err();
    let all = problems.join("\n");
    for want in [
        "approver dana: unknown role \"root\"",
        "approver dana: key 2 is not an OpenSSH public key",
        "approver \"Eve\": use lower-case letters",
        "approver Eve: no roles",
        "approver dana: identity \"corp/ops/dana\" is not a SPIFFE ID",
        "approver dana: key 1",
    ] {
        assert!(all.contains(want), "missing {want:?} in:\n{all}");
    }
    assert!(all.contains("is also Eve's") || all.contains("is also dana's"), "{all}");
    let one = Approvers::parse(&format!("[approver.dana]\nroles = [\"dr-operator\"]\nkeys = [{line:?}]\n")).unwrap_err();
    assert!(one[0].contains("two-person operations need at least two"), "{one:?}");
}

#[test]
fn the_example_approvers_file_parses() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../config/approvers.toml");
    let a = Approvers::load(&path).unwrap();
    assert_eq!(a.approvers.keys().collect::<Vec<_>>(), ["alice", "bob", "carol"]);
    assert_eq!(a.approvers["alice"].keys[0].algorithm(), ssh_key::Algorithm::SkEd25519);
    assert!(a.approvers["carol"].roles.contains(&holdfast_approval::Role::LockOperator));
    assert_eq!(a.approvers["carol"].identity.as_deref(), Some("spiffe://corp.example/ops/carol"));
}

/// An `sk-ssh-ed25519` signature over `bytes` as a FIDO2 key makes it
/// (OpenSSH's PROTOCOL.u2f): Ed25519 over SHA-256(application) ‖ flags ‖
/// counter ‖ SHA-256(the sshsig signed data), sent with flags and counter.
/// Made here with the key's private half, as no FIDO2 device is attached.
fn sk_sign(secret: &ed25519_dalek::SigningKey, flags: u8, bytes: &[u8]) -> String {
    use ed25519_dalek::Signer;
    use sha2::{Digest, Sha256};
    use ssh_key::public::{Ed25519PublicKey, KeyData, SkEd25519};
    let public = KeyData::SkEd25519(SkEd25519::new(Ed25519PublicKey(secret.verifying_key().to_bytes()), String::from("ssh:")));
    let counter: u32 = 41;
    let message = ssh_key::SshSig::signed_data(NAMESPACE, ssh_key::HashAlg::Sha512, bytes).unwrap();
    let mut signed = Vec::new();
    signed.extend(Sha256::digest(b"ssh:"));
    signed.push(flags);
    signed.extend(counter.to_be_bytes());
    signed.extend(Sha256::digest(&message));
    let mut raw = secret.sign(&signed).to_bytes().to_vec();
    raw.push(flags);
    raw.extend(counter.to_be_bytes());
    let signature = ssh_key::Signature::new(ssh_key::Algorithm::SkEd25519, raw).unwrap();
    ssh_key::SshSig::new(public, NAMESPACE, ssh_key::HashAlg::Sha512, signature).unwrap().to_pem(ssh_key::LineEnding::LF).unwrap()
}

/// A FIDO2 key's signature counts only with the user-presence flag (a
/// touch); the same key's signature without it (a key made with
/// `-O no-touch-required`, or malware driving a plugged-in key) is refused,
/// naming the signer. Flags are signed: setting the bit afterwards breaks
/// the signature.
#[test]
fn a_fido_signature_without_user_presence_is_refused() {
    let secret = ed25519_dalek::SigningKey::from_bytes(&[9; 32]);
    let sk = ssh_key::PublicKey::new(
        ssh_key::public::KeyData::SkEd25519(ssh_key::public::SkEd25519::new(
            ssh_key::public::Ed25519PublicKey(secret.verifying_key().to_bytes()),
            String::from("ssh:"),
        )),
        "dana@yubikey",
    );
    let keys = Keys::new();
    let eve = keys.key("eve", "ed25519");
    let approvers = Approvers::parse(&format!(
        "[approver.dana]\nroles = [\"dr-operator\"]\nkeys = [{:?}]\n[approver.eve]\nroles = [\"dr-operator\"]\nkeys = [{:?}]\n",
        sk.to_openssh().unwrap(),
        keys.public(&eve)
    ))
    .unwrap();
    let (_, bytes) = request("dana");
    let e = keys.sign(&eve, NAMESPACE, &bytes);
    let touched = sk_sign(&secret, 0x01, &bytes);
    assert_eq!(verify(&bytes, &[touched, e.clone()], &approvers, NOW).unwrap().signers, ["dana", "eve"]);
    // User verification (0x04) without presence is still no touch.
    for flags in [0x00, 0x04] {
        let untouched = sk_sign(&secret, flags, &bytes);
        let refusal = verify(&bytes, &[untouched, e.clone()], &approvers, NOW).unwrap_err();
        assert_eq!(refusal, Refusal::NoUserPresence { index: 1, approver: "dana".into() }, "flags {flags:#x}");
        assert!(refusal.to_string().contains("touch the key"), "{refusal}");
    }
    // The flag set after signing: the signature no longer verifies.
    let forged = {
        let sig = ssh_key::SshSig::from_pem(sk_sign(&secret, 0x00, &bytes)).unwrap();
        let mut raw = sig.signature().as_bytes().to_vec();
        let at = raw.len() - 5;
        raw[at] |= 0x01;
        let signature = ssh_key::Signature::new(ssh_key::Algorithm::SkEd25519, raw).unwrap();
        ssh_key::SshSig::new(sig.public_key().clone(), NAMESPACE, ssh_key::HashAlg::Sha512, signature)
            .unwrap()
            .to_pem(ssh_key::LineEnding::LF)
            .unwrap()
    };
    assert_eq!(verify(&bytes, &[forged, e], &approvers, NOW).unwrap_err(), Refusal::BadSignature { index: 1, approver: "dana".into() });
}
