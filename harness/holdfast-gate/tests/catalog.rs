//! The book's fault and mutation tables (docs/correctness-gate.md) are exactly what
//! `holdfast-gate --list-faults` and `--list-mutations` print (the
//! catalog the mutation tests run from), so the docs cannot drift from the
//! tests.

use std::path::Path;
use std::process::Command;

fn list(flag: &str) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast-gate")).arg(flag).output().unwrap();
    assert!(out.status.success(), "holdfast-gate {flag}: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8(out.stdout).unwrap()
}

/// The lines between `<!-- holdfast-gate FLAG -->` and
/// `<!-- end of holdfast-gate FLAG -->` in docs/correctness-gate.md.
fn readme_block(flag: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../docs/correctness-gate.md");
    let readme = std::fs::read_to_string(&path).unwrap();
    let start = format!("<!-- holdfast-gate {flag} -->\n");
    let end = format!("<!-- end of holdfast-gate {flag} -->");
    let from = readme.find(&start).unwrap_or_else(|| panic!("docs/correctness-gate.md has no line {start:?}")) + start.len();
    let to = readme[from..].find(&end).unwrap_or_else(|| panic!("docs/correctness-gate.md has no line {end:?}")) + from;
    readme[from..to].to_string()
}

fn assert_same(flag: &str) {
    let printed = list(flag);
    assert!(printed.lines().count() > 3, "holdfast-gate {flag} printed a table with no rows:\n{printed}");
    assert_eq!(
        readme_block(flag),
        printed,
        "docs/correctness-gate.md's table differs from `holdfast-gate {flag}`: replace the lines between its markers with \
         the output of `cargo run -p holdfast-gate -- {flag}`"
    );
}

#[test]
fn the_books_fault_table_is_the_gates_list() {
    assert_same("--list-faults");
}

#[test]
fn the_books_mutation_table_is_the_gates_list() {
    assert_same("--list-mutations");
}

#[test]
fn both_lists_at_once_are_the_two_tables_with_a_blank_line_between() {
    let out = Command::new(env!("CARGO_BIN_EXE_holdfast-gate")).args(["--list-faults", "--list-mutations"]).output().unwrap();
    assert!(out.status.success());
    assert_eq!(String::from_utf8(out.stdout).unwrap(), format!("{}\n{}", list("--list-faults"), list("--list-mutations")));
}
