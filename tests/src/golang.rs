//! Running Go on the Go client (clients/go) from the tests.

use std::path::Path;
use std::process::Command;

/// `go` in clients/go, with the module graph read-only (go.sum decides),
/// its caches under `target/` and the toolchain on the machine. Panics when
/// Go is missing: the Go client's tests fail then, never skip.
pub fn go_in_clients() -> Command {
    let go = holdfast_devkit::process::which("go").expect("go is not installed: the Go client's tests need Go 1.26 (go.dev/dl)");
    let target = crate::cargo_target_dir();
    let mut cmd = Command::new(go);
    cmd.current_dir(Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/go"))
        .env("GOFLAGS", "-mod=readonly")
        .env("GOPATH", target.join("go/path"))
        .env("GOCACHE", target.join("go/cache"))
        .env("GOTOOLCHAIN", "local");
    cmd
}
