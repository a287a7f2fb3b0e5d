//! Man pages and shell completions generated from a binary's clap
//! definition, so what `--help` says and what `man` says never drift apart.
//! Every shipped binary has a hidden `generate-docs --out DIR` subcommand
//! calling [`write`]; `packaging/build` runs it and packages the result.

use clap::Command;
use clap_complete::Shell;
use std::fs;
use std::io;
use std::path::Path;

/// Writes, under `out`:
/// - `man/NAME.1`, `man/NAME-SUB.1`, … one page per visible (sub)command
///   (clap_mangen; hidden subcommands such as `generate-docs` are left out);
/// - `completions/bash/NAME.bash`, `completions/zsh/_NAME`,
///   `completions/fish/NAME.fish` (clap_complete).
///
/// `cmd` is the binary's `Args::command()`.
pub fn write(cmd: Command, out: &Path) -> io::Result<()> {
    let name = cmd.get_name().to_owned();
    let man = out.join("man");
    fs::create_dir_all(&man)?;
    clap_mangen::generate_to(cmd.clone(), &man)?;
    for (shell, dir) in [(Shell::Bash, "bash"), (Shell::Zsh, "zsh"), (Shell::Fish, "fish")] {
        let dir = out.join("completions").join(dir);
        fs::create_dir_all(&dir)?;
        clap_complete::generate_to(shell, &mut cmd.clone(), name.as_str(), dir.as_os_str())?;
    }
    Ok(())
}

/// [`write`] for a binary's `generate-docs` subcommand: prints what failed
/// and returns the exit status (0, or 73 EX_CANTCREAT).
pub fn run(cmd: Command, out: &Path) -> u8 {
    let name = cmd.get_name().to_owned();
    match write(cmd, out) {
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
}
