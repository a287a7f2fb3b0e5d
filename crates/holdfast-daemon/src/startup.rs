//! What every daemon's `main` does around its own logic: the `--log-format`
//! values, the config load (exit 78 on a bad file), the async runtime, the
//! logging and the mapping of the daemon's outcome to an exit status, each
//! with the same message (`NAME: …` on stderr).

use std::fmt::Display;
use std::future::Future;
use std::process::ExitCode;
use tokio::runtime::Runtime;

/// sysexits.h EX_CONFIG: the configuration is wrong.
pub const EX_CONFIG: u8 = 78;

/// `--log-format`: how log lines look off systemd (under systemd they go to
/// journald natively either way; see [`crate::log_layer`]).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum LogFormat {
    // Text, for terminals. (No doc comments here: clap would print them
    // in --help beside each value.)
    #[default]
    Plain,
    // One JSON object per line, for collectors.
    Json,
}

impl LogFormat {
    pub fn json(self) -> bool {
        self == LogFormat::Json
    }
}

/// One daemon's start-up, named as in its messages (`holdfast-tailer`).
#[derive(Clone, Copy, Debug)]
pub struct Daemon {
    pub name: &'static str,
}

impl Daemon {
    pub const fn new(name: &'static str) -> Self {
        Daemon { name }
    }

    /// Prints `NAME: ERROR` and returns exit status 78 (EX_CONFIG).
    pub fn config_error(&self, e: impl Display) -> ExitCode {
        eprintln!("{}: {e}", self.name);
        ExitCode::from(EX_CONFIG)
    }

    /// The loaded config, or (printed) exit status 78.
    pub fn config<C, E: Display>(&self, loaded: Result<C, E>) -> Result<C, ExitCode> {
        loaded.map_err(|e| self.config_error(e))
    }

    /// The multi-threaded tokio runtime, or (printed) exit status 1.
    pub fn runtime(&self) -> Result<Runtime, ExitCode> {
        Runtime::new().map_err(|e| {
            eprintln!("{}: cannot start the async runtime: {e}", self.name);
            ExitCode::FAILURE
        })
    }

    /// The exit status of a daemon's run: 0, or 1 with `NAME: ERROR` (the
    /// whole chain) printed.
    pub fn outcome(&self, outcome: anyhow::Result<()>) -> ExitCode {
        match outcome {
            Ok(()) => ExitCode::SUCCESS,
            Err(e) => {
                eprintln!("{}: {e:#}", self.name);
                ExitCode::FAILURE
            }
        }
    }

    /// Starts logging ([`crate::init_logging`]) and runs the daemon on
    /// `runtime` to its end.
    pub fn serve(&self, runtime: &Runtime, format: LogFormat, run: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
        crate::init_logging(format.json());
        self.outcome(runtime.block_on(run))
    }

    /// [`Daemon::serve`] on a new runtime.
    pub fn start(&self, format: LogFormat, run: impl Future<Output = anyhow::Result<()>>) -> ExitCode {
        match self.runtime() {
            Ok(runtime) => self.serve(&runtime, format, run),
            Err(code) => code,
        }
    }
}

/// The exit status of a `main` written with `?` on the helpers above.
pub fn exit_code(status: Result<ExitCode, ExitCode>) -> ExitCode {
    match status {
        Ok(code) | Err(code) => code,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_bad_config_is_78_and_a_failed_run_is_1() {
        let d = Daemon::new("holdfast-unit");
        assert_eq!(d.config::<(), _>(Err("bad")).unwrap_err(), ExitCode::from(78));
        assert_eq!(d.config::<u8, &str>(Ok(3)).unwrap(), 3);
        assert_eq!(d.outcome(Err(anyhow::anyhow!("down"))), ExitCode::FAILURE);
        assert_eq!(d.outcome(Ok(())), ExitCode::SUCCESS);
        assert_eq!(exit_code(Err(ExitCode::from(78))), ExitCode::from(78));
    }

    #[test]
    fn log_format_values() {
        use clap::ValueEnum;
        let names: Vec<_> = LogFormat::value_variants().iter().map(|v| v.to_possible_value().unwrap().get_name().to_string()).collect();
        assert_eq!(names, ["plain", "json"]);
        assert!(LogFormat::Json.json() && !LogFormat::Plain.json());
    }
}
