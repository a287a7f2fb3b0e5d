//! Man pages and shell completions generated from a binary's clap
//! definition, so what `--help` says and what `man` says never drift apart.
//! Every shipped binary has a hidden `generate-docs --out DIR` subcommand
//! calling [`write`] (a tool, section 1) or [`write_daemon`] (a daemon or
//! system agent, section 8, with a section 5 page for its config file);
//! `packaging/build` runs it and packages the result.

use clap::Command;
use clap_complete::Shell;
use std::fs;
use std::io::{self, Write};
use std::path::Path;

/// Writes, under `out`:
/// - `man/NAME.1`, `man/NAME-SUB.1`, … one page per visible (sub)command
///   (clap_mangen; hidden subcommands such as `generate-docs` are left out);
/// - `completions/bash/NAME.bash`, `completions/zsh/_NAME`,
///   `completions/fish/NAME.fish` (clap_complete).
///
/// `cmd` is the binary's `Args::command()`.
pub fn write(cmd: Command, out: &Path) -> io::Result<()> {
    write_in(cmd, out, "1")
}

/// A config file's section 5 page: the file's name (`holdfast-arbiter.toml`)
/// and its section of the operator's book's configuration reference
/// (`docs/configuration.md`, the `## ` heading `heading`), the same text
/// the book shows, so the two cannot drift.
pub struct ConfigPage<'a> {
    pub file: &'a str,
    pub heading: &'a str,
}

/// [`write`] for a daemon or system agent: its pages in section 8
/// (`man/NAME.8`, `man/NAME-SUB.8`), and one section 5 page per config file
/// (`man/FILE.5`) rendered from the configuration reference.
pub fn write_daemon(cmd: Command, out: &Path, configs: &[ConfigPage<'_>]) -> io::Result<()> {
    write_in(cmd, out, "8")?;
    let man = out.join("man");
    for page in configs {
        let mut f = fs::File::create(man.join(format!("{}.5", page.file)))?;
        f.write_all(config_page(page)?.as_bytes())?;
    }
    Ok(())
}

fn write_in(cmd: Command, out: &Path, section: &str) -> io::Result<()> {
    let name = cmd.get_name().to_owned();
    let man = out.join("man");
    fs::create_dir_all(&man)?;
    let mut built = cmd.clone().disable_help_subcommand(true);
    built.build();
    pages(&built, section, &man)?;
    for (shell, dir) in [(Shell::Bash, "bash"), (Shell::Zsh, "zsh"), (Shell::Fish, "fish")] {
        let dir = out.join("completions").join(dir);
        fs::create_dir_all(&dir)?;
        clap_complete::generate_to(shell, &mut cmd.clone(), name.as_str(), dir.as_os_str())?;
    }
    Ok(())
}

/// One page per visible (sub)command, in `section`.
fn pages(cmd: &Command, section: &str, dir: &Path) -> io::Result<()> {
    for sub in cmd.get_subcommands().filter(|s| !s.is_hide_set()) {
        pages(sub, section, dir)?;
    }
    let page = clap_mangen::Man::new(cmd.clone()).section(section);
    let name = cmd.get_display_name().unwrap_or(cmd.get_name());
    let mut f = fs::File::create(dir.join(format!("{name}.{section}")))?;
    page.render(&mut f)?;
    f.flush()
}

/// The configuration reference, as the book has it.
const REFERENCE: &str = include_str!("../../../docs/configuration.md");

/// The text of the reference's section `heading`, up to the next `## `.
fn section_of(heading: &str) -> io::Result<&'static str> {
    let start = REFERENCE
        .find(&format!("{heading}\n"))
        .ok_or_else(|| io::Error::other(format!("docs/configuration.md has no heading {heading:?}")))?;
    let rest = &REFERENCE[start + heading.len() + 1..];
    Ok(&rest[..rest.find("\n## ").unwrap_or(rest.len())])
}

/// Markdown inline text as roff: code and emphasis marks dropped, a link
/// reduced to its label, roff's escape character escaped.
fn inline(md: &str) -> String {
    let mut out = String::new();
    let mut rest = md;
    while let Some(open) = rest.find('[') {
        let after = &rest[open + 1..];
        // A link is `[label](target)`: the `(` right after this `[`'s `]`.
        let link = after.find(']').and_then(|close| {
            let tail = &after[close + 1..];
            if tail.starts_with('(') { tail.find(')').map(|end| (close, close + 1 + end)) } else { None }
        });
        match link {
            Some((close, end)) => {
                out.push_str(&rest[..open]);
                out.push_str(&after[..close]);
                rest = &after[end + 1..];
            }
            None => {
                out.push_str(&rest[..=open]);
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out.replace('\\', "\\e").replace(['`', '*'], "")
}

/// A roff text line: one starting with `.` or `'` would be a request.
fn text_line(line: &str) -> String {
    if line.starts_with('.') || line.starts_with('\'') { format!("\\&{line}") } else { line.to_string() }
}

/// The markdown of a reference section as roff: paragraphs, and each
/// table row as a tagged paragraph (the key in bold, its default, then
/// what it means).
fn roff_section(md: &str, out: &mut String) {
    for line in md.lines() {
        let line = line.trim_end();
        if line.starts_with("| key") || line.starts_with("|---") || line.starts_with("<!--") {
            continue;
        }
        if let Some(row) = line.strip_prefix('|') {
            let cells: Vec<&str> = row.trim_end_matches('|').split('|').map(str::trim).collect();
            if let [key, default, meaning] = cells.as_slice() {
                out.push_str(&format!(".TP\n\\fB{}\\fR\n", inline(key)));
                if *default == "required" {
                    out.push_str("Required.\n.br\n");
                } else if !default.is_empty() {
                    out.push_str(&text_line(&format!("Default: {}.", inline(default))));
                    out.push('\n');
                    out.push_str(".br\n");
                }
                out.push_str(&text_line(&inline(meaning)));
                out.push('\n');
            }
        } else if line.is_empty() {
            out.push_str(".PP\n");
        } else {
            out.push_str(&text_line(&inline(line)));
            out.push('\n');
        }
    }
}

/// The section 5 page of `page` as roff.
fn config_page(page: &ConfigPage<'_>) -> io::Result<String> {
    let mut out = format!(
        ".TH \"{}\" 5 \"\" \"holdfast\" \"File Formats\"\n.SH NAME\n{} \\- holdfast configuration file\n.SH DESCRIPTION\n",
        page.file.to_uppercase(),
        page.file
    );
    roff_section(section_of(page.heading)?, &mut out);
    out.push_str(".SH SEE ALSO\nThe operator's book, chapter \"Configuration reference\" (docs/configuration.md).\n");
    Ok(out)
}

/// [`write`] for a binary's `generate-docs` subcommand: prints what failed
/// and returns the exit status (0, or 73 EX_CANTCREAT).
pub fn run(cmd: Command, out: &Path) -> u8 {
    report(cmd.get_name().to_owned(), out, write(cmd, out))
}

/// [`write_daemon`] for a daemon's `generate-docs` subcommand, as [`run`].
pub fn run_daemon(cmd: Command, out: &Path, configs: &[ConfigPage<'_>]) -> u8 {
    report(cmd.get_name().to_owned(), out, write_daemon(cmd, out, configs))
}

fn report(name: String, out: &Path, r: io::Result<()>) -> u8 {
    match r {
        Ok(()) => 0,
        Err(e) => {
            eprintln!("{name}: generate-docs: cannot write {}: {e}", out.display());
            73
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::{Arg, Command};

    #[test]
    fn writes_a_page_per_visible_subcommand_and_three_completions() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = Command::new("tool")
            .about("a tool")
            .subcommand(Command::new("check").about("check it"))
            .subcommand(Command::new("generate-docs").hide(true).arg(Arg::new("out").long("out")));
        write(cmd, dir.path()).unwrap();
        for f in ["man/tool.1", "man/tool-check.1", "completions/bash/tool.bash", "completions/zsh/_tool", "completions/fish/tool.fish"] {
            assert!(dir.path().join(f).is_file(), "{f} missing");
        }
        assert!(!dir.path().join("man/tool-generate-docs.1").exists());
        let page = std::fs::read_to_string(dir.path().join("man/tool.1")).unwrap();
        assert!(page.contains("a tool"));
    }

    #[test]
    fn a_daemon_gets_section_8_and_its_config_file_section_5_from_the_reference() {
        let dir = tempfile::tempdir().unwrap();
        let cmd = Command::new("holdfast-arbiter").about("the arbiter").subcommand(Command::new("check").about("check it"));
        let configs = [ConfigPage { file: "holdfast-arbiter.toml", heading: "## arbiter.toml" }];
        write_daemon(cmd, dir.path(), &configs).unwrap();
        for f in ["man/holdfast-arbiter.8", "man/holdfast-arbiter-check.8", "man/holdfast-arbiter.toml.5"] {
            assert!(dir.path().join(f).is_file(), "{f} missing");
        }
        assert!(!dir.path().join("man/holdfast-arbiter.1").exists());
        let page = std::fs::read_to_string(dir.path().join("man/holdfast-arbiter.toml.5")).unwrap();
        assert!(page.starts_with(".TH \"HOLDFAST-ARBITER.TOML\" 5"), "{page}");
        // Every key row of the book's section is on the page; no Markdown
        // left (nor the table's generation markers).
        for key in ["listen", "tls.cert_file", "fail_open.after", "limits.max_connection_age", "etcd.request_timeout"] {
            assert!(page.contains(&format!("\\fB{key}")), "{key} is not on the page:\n{page}");
        }
        assert!(!page.contains('`') && !page.contains("](") && !page.contains("<!--"), "Markdown left on the page:\n{page}");
        assert!(page.contains("\\fB[tls]\\fR"), "a table name is not kept as written:\n{page}");
        assert_eq!(inline("see `[coord]` and [the book](docs/x.md) \\ ok"), "see [coord] and the book \\e ok");
        // The text reads as text: no line is a roff request by accident.
        for line in page.lines().filter(|l| l.starts_with('.')) {
            let request = line.split_whitespace().next().unwrap();
            assert!([".TH", ".SH", ".TP", ".PP", ".br"].contains(&request), "stray request {line:?}");
        }
    }

    #[test]
    fn a_missing_reference_section_is_an_error_not_an_empty_page() {
        let dir = tempfile::tempdir().unwrap();
        let configs = [ConfigPage { file: "x.toml", heading: "## no such section" }];
        let err = write_daemon(Command::new("x"), dir.path(), &configs).unwrap_err();
        assert!(err.to_string().contains("no such section"), "{err}");
    }
}
