//! Every typed refusal as a client no one here wrote sees it: grpcurl
//! (through the arbiter's reflection service, no .proto) gets each refusal
//! with its own gRPC status code and the lock.v1.ErrorDetail decoded, never
//! INTERNAL. The lab (the dev appliance with the conformance classes) is the one the Go, Python and Java conformance suites
//! run against (`ConformanceLab`), whose own refusal tests check the same
//! codes and reasons through grpc-go, grpcio and grpc-java.

use holdfast_tests::*;
use serde_json::Value;

/// `grpcurl -format-error` as identity `cert`: the JSON it printed (the
/// answer, or the status with its details) and whether the call failed.
fn grpcurl(lab: &ConformanceLab, cert: &holdfast_devkit::pki::Issued, endpoint: &str, method: &str, body: &str) -> (bool, Value) {
    let grpcurl = holdfast_devkit::process::which("grpcurl").expect("grpcurl is not installed: run scripts/install-deps");
    let ran = Ran::of(
        std::process::Command::new(grpcurl)
            .args(["-max-time", "10", "-format-error", "-cacert"])
            .arg(lab.pki.ca.ca_path())
            .arg("-cert")
            .arg(&cert.cert)
            .arg("-key")
            .arg(&cert.key)
            .args(["-d", body, endpoint])
            .arg(format!("lock.v1.Lock/{method}")),
    );
    let text = if ran.code == 0 { &ran.stdout } else { &ran.stderr };
    let start = text.find('{').unwrap_or_else(|| panic!("grpcurl {method} printed no JSON: {ran}"));
    let value = serde_json::from_str(&text[start..]).unwrap_or_else(|e| panic!("grpcurl {method}: {e}: {ran}"));
    (ran.code != 0, value)
}

/// Asserts that `got` is a refusal with `code` (the gRPC number) whose one
/// detail is a lock.v1.ErrorDetail with `reason`.
fn assert_refusal(what: &str, got: &(bool, Value), code: i64, reason: &str) {
    let (failed, v) = got;
    assert!(failed, "{what}: answered {v}");
    assert_eq!(v["code"].as_i64(), Some(code), "{what}: {v}");
    let details = v["details"].as_array().unwrap_or_else(|| panic!("{what}: no details: {v}"));
    assert_eq!(details.len(), 1, "{what}: {v}");
    assert_eq!(details[0]["@type"], "type.googleapis.com/lock.v1.ErrorDetail", "{what}: {v}");
    assert_eq!(details[0]["reason"], reason, "{what}: {v}");
    eprintln!("{what}: code {code}, {reason}: {}", v["message"]);
}

fn session(lab: &ConformanceLab, cert: &holdfast_devkit::pki::Issued, endpoint: &str) -> String {
    let (failed, v) = grpcurl(lab, cert, endpoint, "OpenSession", r#"{"namespace":"conformance"}"#);
    assert!(!failed, "OpenSession: {v}");
    v["sessionId"].as_str().unwrap_or_else(|| panic!("no sessionId: {v}")).to_string()
}

#[tokio::test]
async fn grpcurl_sees_every_refusal_with_its_code_and_decoded_detail() {
    let lab = ConformanceLab::start("curl").await;
    let main = lab.endpoint.clone();
    let a = lab.pki.workload("curl-a", "conformance/curl-a");
    let b = lab.pki.workload("curl-b", "conformance/curl-b");
    let acquire =
        |session: &str, key: &str| format!(r#"{{"sessionId":"{session}","namespace":"conformance","key":"{key}","waitMillis":"0"}}"#);

    let got = grpcurl(&lab, &a, &main, "Acquire", &acquire("12345", "curl-none"));
    assert_refusal("an unknown session", &got, 5, "ERROR_REASON_SESSION_NOT_FOUND");

    let held_by_b = session(&lab, &b, &main);
    let (failed, v) = grpcurl(&lab, &b, &main, "Acquire", &acquire(&held_by_b, "curl-held"));
    assert!(!failed, "b's acquire: {v}");
    let sa = session(&lab, &a, &main);
    assert_refusal("contention", &grpcurl(&lab, &a, &main, "Acquire", &acquire(&sa, "curl-held")), 10, "ERROR_REASON_CONTENTION");

    let (failed, v) = grpcurl(&lab, &a, &main, "Acquire", &acquire(&sa, "curl-leaked"));
    assert!(!failed, "a's acquire: {v}");
    let sa2 = session(&lab, &a, &main);
    assert_refusal("a leaked hold", &grpcurl(&lab, &a, &main, "Acquire", &acquire(&sa2, "curl-leaked")), 9, "ERROR_REASON_LEAK");

    let got = grpcurl(&lab, &a, &main, "Inspect", r#"{"namespace":"undeclared","key":"k"}"#);
    assert_refusal("a namespace no grant covers", &got, 7, "ERROR_REASON_DENIED");
    assert!(got.1["message"].as_str().is_some_and(|m| m.contains("ask for an inspect grant")), "{}", got.1);

    let sealed = lab.sealed.endpoint();
    // A sealed arbiter opens sessions (a lease grants nothing) but grants no key.
    let on_sealed = session(&lab, &a, &sealed);
    let got = grpcurl(&lab, &a, &sealed, "Acquire", &acquire(&on_sealed, "curl-sealed"));
    assert_refusal("a sealed arbiter", &got, 9, "ERROR_REASON_SEALED");

    let elsewhere = lab.elsewhere.endpoint();
    let got = grpcurl(&lab, &b, &elsewhere, "Inspect", &format!(r#"{{"namespace":"{HOMED_CLASSES}","key":"k"}}"#));
    assert_refusal("a class homed to another region", &got, 9, "ERROR_REASON_WRONG_REGION");

    // One request a second, a burst of five: the sixth call in a row at most.
    let limited =
        (0..20).map(|_| grpcurl(&lab, &a, &elsewhere, "Inspect", r#"{"namespace":"conformance","key":"k"}"#)).find(|(failed, _)| *failed);
    let got = limited.expect("20 calls in a row at one a second were all answered");
    assert_refusal("the request rate", &got, 8, "ERROR_REASON_RATE_LIMITED");
}
