//! `holdfast-arbiter check`: what the unit's ExecStartPre= and Ansible run.

use holdfast_tests::*;
use std::process::Command;

#[test]
fn check_accepts_a_good_config_and_names_every_problem_in_a_bad_one() {
    let dir = TestDir::new("check");
    let pki = Pki::new(&dir.path);
    let good = dir.path.join("good.toml");
    std::fs::write(
        &good,
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = {:?}\ntrust_domain = \"holdfast.dev\"\n[etcd]\nendpoints = [\"http://127.0.0.1:2379\"]\n",
            pki.server.cert.display().to_string(),
            pki.server.key.display().to_string(),
            pki.ca.ca_path().display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(bin("holdfast-arbiter")).args(["check", "--config"]).arg(&good).output().unwrap();
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));

    // A world-readable key and a missing CA: both named, exit 78 (EX_CONFIG).
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(&pki.server.key, std::fs::Permissions::from_mode(0o644)).unwrap();
    let bad = dir.path.join("bad.toml");
    std::fs::write(
        &bad,
        format!(
            "[tls]\ncert_file = {:?}\nkey_file = {:?}\nclient_ca_file = \"/nonexistent/ca.pem\"\ntrust_domain = \"Holdfast Dev\"\n[etcd]\nendpoints = [\"127.0.0.1:2379\"]\n",
            pki.server.cert.display().to_string(),
            pki.server.key.display().to_string()
        ),
    )
    .unwrap();
    let out = Command::new(bin("holdfast-arbiter")).args(["check", "--config"]).arg(&bad).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{err}");
    assert!(err.contains("tls.key_file") && err.contains("chmod o-rwx"), "{err}");
    assert!(err.contains("tls.trust_domain = \"Holdfast Dev\" is not a SPIFFE trust domain"), "{err}");
    assert!(err.contains("tls.client_ca_file"), "{err}");
    assert!(err.contains("etcd.endpoints") && err.contains("https://127.0.0.1:2379"), "{err}");
    assert!(err.contains("4 problem(s)"), "{err}");

    // An unknown key is named.
    let typo = dir.path.join("typo.toml");
    std::fs::write(&typo, std::fs::read_to_string(&good).unwrap().replace("endpoints", "endpoint")).unwrap();
    let out = Command::new(bin("holdfast-arbiter")).args(["check", "--config"]).arg(&typo).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78));
    assert!(err.contains("unknown field `endpoint`"), "{err}");
}
