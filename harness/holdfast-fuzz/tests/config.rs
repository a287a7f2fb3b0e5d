//! Fuzz target: the daemons' configuration files, `arbiter.toml` and
//! `controller.toml`.
//!
//! Inputs: any text, TOML-shaped token soup, and edits of the annotated
//! examples in `config/` (lines deleted, duplicated, swapped or uncommented,
//! values replaced by hostile ones). Whatever parses must survive
//! `problems()` (which reads the filesystem for the certificate paths) and
//! render with `to_toml()` to text that parses to the same rendering.

#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)] // a test reports by panicking

use holdfast_config::{ArbiterConfig, ControllerConfig};
use holdfast_fuzz::{any_text, config, edited, soup, uncommented};
use proptest::prelude::*;

const ARBITER: &str = include_str!("../../../config/arbiter.toml");
const CONTROLLER: &str = include_str!("../../../config/controller.toml");

/// Values that have broken parsers: empty, wrong types, out of range,
/// overflowing, malformed URLs, durations and addresses, odd strings.
const HOSTILE: &[&str] = &[
    "",
    "\"\"",
    "\" \"",
    "-1",
    "0",
    "1",
    "1.0",
    "2.5",
    "-0.0",
    "1e400",
    "-1e400",
    "nan",
    "inf",
    "-inf",
    "true",
    "[]",
    "{}",
    "[[]]",
    "{ a = 1 }",
    "[\"\"]",
    "[\"http://\"]",
    "[\"10.0.0.1:2379\"]",
    "1979-05-27",
    "1979-05-27T07:32:00Z",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "-9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "0xffffffffffffffff",
    "\"0s\"",
    "\"1ns\"",
    "\"99ms\"",
    "\"1.5s\"",
    "\"1500ms\"",
    "\"300s\"",
    "\"99999999999999h\"",
    "\"18446744073709551615s\"",
    "\"18446744073709551616s\"",
    "\"584942417355years\"",
    "\"1y 2M 3w 4d 5h 6m 7s 8ms 9us 10ns\"",
    "\"http://\"",
    "\"https://\"",
    "\"http://[::1\"",
    "\"http://127.0.0.1:4318/v1/traces?x=1\"",
    "\"http://a:99999\"",
    "\"http://127.0.0.1:4318\"",
    "\"grpc\"",
    "\"http/protobuf\"",
    "\"0.0.0.0:0\"",
    "\"[::]:7420\"",
    "\"[::1]:99999\"",
    "\"localhost:7420\"",
    "\"/\"",
    "\"/dev/null\"",
    "\"/etc/hostname\"",
    "\"//\"",
    "\"/sys/election/\"",
    "\"a b\"",
    "\"\\u0000\"",
    "\"\\n\"",
    "\"\\\\\"",
    "\"caf\u{e9} \u{1f512}\"",
    "\"\u{202e}\"",
    "'''multi\nline'''",
    "\"\"\"\n\"\"\"",
];

/// The pieces of a TOML file about these configs.
const TOKENS: &[&str] = &[
    "\n",
    "\n",
    " ",
    "=",
    " = ",
    "[",
    "]",
    "[[",
    "]]",
    "{",
    "}",
    ",",
    ".",
    "\"",
    "'",
    "#",
    "tls",
    "etcd",
    "seal",
    "waiters",
    "grants",
    "limits",
    "namespaces",
    "mutation",
    "tracing",
    "election",
    "listen",
    "endpoints",
    "cert_file",
    "key_file",
    "client_ca_file",
    "ca_file",
    "request_timeout",
    "check_interval",
    "ttl",
    "name",
    "policy_dir",
    "sampling_ratio",
    "otlp_endpoint",
    "protocol",
    "max_holds",
    "\"5s\"",
    "\"http://x:1\"",
    "1",
    "0",
    "-1",
    "1e400",
    "true",
    "nan",
];

/// An arbiter config that parsed: `problems()` runs, and the rendering
/// reads back as itself.
fn check_arbiter(text: &str) -> Result<(), TestCaseError> {
    let Ok(c) = toml::from_str::<ArbiterConfig>(text) else { return Ok(()) };
    for p in c.problems() {
        prop_assert!(!p.is_empty());
    }
    let rendered = c.to_toml();
    prop_assert!(rendered.is_ok(), "a parsed config does not render: {rendered:?}\n{c:#?}");
    let rendered = rendered.unwrap();
    let back = toml::from_str::<ArbiterConfig>(&rendered);
    prop_assert!(back.is_ok(), "the rendering does not parse: {back:?}\n{rendered}");
    let again = back.unwrap().to_toml();
    prop_assert_eq!(again.as_deref().ok(), Some(rendered.as_str()), "the rendering does not read back the same");
    Ok(())
}

/// The same for a controller config.
fn check_controller(text: &str) -> Result<(), TestCaseError> {
    let Ok(c) = toml::from_str::<ControllerConfig>(text) else { return Ok(()) };
    for p in c.problems() {
        prop_assert!(!p.is_empty());
    }
    let rendered = c.to_toml();
    prop_assert!(rendered.is_ok(), "a parsed config does not render: {rendered:?}\n{c:#?}");
    let rendered = rendered.unwrap();
    let back = toml::from_str::<ControllerConfig>(&rendered);
    prop_assert!(back.is_ok(), "the rendering does not parse: {back:?}\n{rendered}");
    let again = back.unwrap().to_toml();
    prop_assert_eq!(again.as_deref().ok(), Some(rendered.as_str()), "the rendering does not read back the same");
    Ok(())
}

proptest! {
    #![proptest_config(config())]

    #[test]
    fn arbiter_toml_edits(text in prop_oneof![edited(ARBITER, HOSTILE), edited(uncommented(ARBITER), HOSTILE)]) {
        check_arbiter(&text)?;
    }

    #[test]
    fn controller_toml_edits(text in prop_oneof![edited(CONTROLLER, HOSTILE), edited(uncommented(CONTROLLER), HOSTILE)]) {
        check_controller(&text)?;
    }

    #[test]
    fn any_text_as_either_config(text in prop_oneof![any_text(64), soup(TOKENS, 40)]) {
        check_arbiter(&text)?;
        check_controller(&text)?;
    }
}

// Named cases: edges worth running whatever the strategies draw. An input a
// target fails on is added here as its own #[test] (see src/lib.rs).

#[test]
fn the_examples_render_and_read_back() {
    for (arbiter, controller) in [(ARBITER.to_string(), CONTROLLER.to_string()), (uncommented(ARBITER), uncommented(CONTROLLER))] {
        check_arbiter(&arbiter).unwrap();
        check_controller(&controller).unwrap();
        let a = toml::from_str::<ArbiterConfig>(&arbiter).unwrap();
        let c = toml::from_str::<ControllerConfig>(&controller).unwrap();
        // With its optional keys set, the example sets them all.
        if arbiter != ARBITER {
            assert!(a.region.is_some() && a.tracing.otlp_endpoint.is_some() && !a.limits.namespaces.is_empty(), "{a:#?}");
            assert!(c.etcd.key_file.is_some(), "{c:#?}");
        }
    }
}
