//! The shared client conformance vectors (clients/conformance/vectors.json),
//! which the Go, Python and Java clients check too: token packing, key
//! validation, the rendezvous choice of arbiter, the decoding of a refusal's
//! status details, and the deadline arithmetic. Every section must be
//! non-empty and every entry must agree.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use base64::Engine as _;
use holdfast_client::{Error, affinity, fence_deadline, keepalive_period};
use holdfast_model::{LockKey, Token};
use serde_json::Value;
use std::time::Duration;

fn vectors() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/../../clients/conformance/vectors.json");
    let text = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("read {path}: {e}"));
    serde_json::from_str(&text).expect("vectors.json is JSON")
}

fn section(name: &str) -> Vec<Value> {
    let v = vectors()[name].as_array().unwrap_or_else(|| panic!("vectors.json has no {name} list")).clone();
    assert!(!v.is_empty(), "vectors.json: {name} is empty");
    v
}

fn u64_of(v: &Value) -> u64 {
    v.as_str().expect("a decimal string").parse().expect("a u64")
}

#[test]
fn tokens() {
    for t in section("tokens") {
        let name = t["name"].as_str().unwrap();
        let wire = u64_of(&t["wire"]);
        if t["malformed"] == true {
            assert!(Token::from_wire(wire).is_err(), "{name}: read as a token");
        } else if t["unprotected"] == true {
            // Never a token on the wire: only a fail-open grant's flag makes it.
            assert!(Token::from_wire(wire).is_err(), "{name}: read as a protected token");
            let u = Token::unprotected();
            assert!(u.is_unprotected() && u.expose() == wire, "{name}");
        } else {
            let tok = Token::from_wire(wire).unwrap_or_else(|e| panic!("{name}: {e}"));
            assert_eq!(u64::from(tok.epoch()), t["epoch"].as_u64().unwrap(), "{name}: epoch");
            assert_eq!(tok.revision(), t["revision"].as_u64().unwrap(), "{name}: revision");
            assert!(!tok.is_unprotected(), "{name}");
            assert_eq!(tok.expose(), wire, "{name}");
            let shown = format!("{tok} {tok:?}");
            assert!(!shown.contains(&wire.to_string()), "{name}: the token printed its value: {shown}");
        }
    }
}

#[test]
fn keys() {
    for k in section("keys") {
        let text = k["text"].as_str().unwrap();
        match k["invalid_field"].as_str() {
            Some(field) => {
                let e = LockKey::parse(text).err().unwrap_or_else(|| panic!("{text:?} was accepted"));
                assert_eq!(e.field, field, "{text:?}: {}", e.message);
            }
            None => {
                let key = LockKey::parse(text).unwrap_or_else(|e| panic!("{text:?}: {}", e.message));
                assert_eq!(key.namespace(), k["namespace"].as_str().unwrap(), "{text:?}");
                assert_eq!(key.key(), k["path"].as_str().unwrap(), "{text:?}");
                assert_eq!(key.to_string(), text);
            }
        }
    }
}

#[test]
fn rendezvous() {
    for r in section("rendezvous") {
        let key = r["key"].as_str().unwrap();
        let endpoints: Vec<String> = r["endpoints"].as_array().unwrap().iter().map(|e| e.as_str().unwrap().to_string()).collect();
        let scores: Vec<u64> = endpoints.iter().map(|e| affinity::score(e, key)).collect();
        let want: Vec<u64> = r["scores"].as_array().unwrap().iter().map(u64_of).collect();
        assert_eq!(scores, want, "scores of {key:?} over {endpoints:?}");
        let want: Vec<usize> = r["ranked"].as_array().unwrap().iter().map(|i| i.as_u64().unwrap() as usize).collect();
        assert_eq!(affinity::ranked(key, &endpoints), want, "ranking of {key:?} over {endpoints:?}");
    }
}

#[test]
fn error_details() {
    for d in section("error_details") {
        let name = d["name"].as_str().unwrap();
        let code = tonic::Code::from_i32(d["code"].as_i64().unwrap() as i32);
        let bin = base64::engine::general_purpose::STANDARD.decode(d["status_details_bin"].as_str().unwrap()).expect("base64");
        let status = tonic::Status::with_details(code, d["message"].as_str().unwrap(), bin.into());
        let Error::Refused { code: got, reason, field, retry_after, .. } = Error::from(status) else {
            panic!("{name}: not a refusal");
        };
        assert_eq!(got, code, "{name}");
        assert_eq!(reason.as_str_name(), d["reason"].as_str().unwrap(), "{name}: reason");
        assert_eq!(field, d["field"].as_str().unwrap(), "{name}: field");
        let want = d["retry_after_ms"].as_u64().unwrap();
        assert_eq!(retry_after, (want > 0).then(|| Duration::from_millis(want)), "{name}: retry-after");
    }
}

#[test]
fn deadlines() {
    let base = tokio::time::Instant::now();
    for d in section("deadlines") {
        let ms = |f: &str| Duration::from_millis(d[f].as_u64().unwrap());
        let (ttl, sent) = (ms("ttl_ms"), ms("sent_at_ms"));
        assert_eq!(fence_deadline(base + sent, ttl) - base, ms("deadline_ms"), "deadline for TTL {ttl:?} sent at {sent:?}");
        assert_eq!(keepalive_period(ttl), ms("keepalive_period_ms"), "keepalive period for TTL {ttl:?}");
    }
}
