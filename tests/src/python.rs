//! Running Python on the Python client (clients/python) from the tests.

use std::path::{Path, PathBuf};
use std::process::Command;

/// clients/python.
pub fn python_client_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../clients/python")
}

fn run(cmd: &mut Command) {
    let out = cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\n--- stdout\n{}--- stderr\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The venv's `python` in clients/python, with the client installed in
/// `site` (a directory of the calling test, put on PYTHONPATH) from a wheel
/// built from the checkout: what `pip install` of the wheel gives a user,
/// not an editable install. The venv `target/py-venv` is shared and holds
/// only the hash-pinned dependencies of `requirements-dev.txt`; it is
/// created and updated under a file lock (the end-to-end suites run side by
/// side, one per etcd target), and nothing changes it while tests run.
/// Panics when python3 is missing: the Python client's tests fail then,
/// never skip.
pub fn python_in_clients(site: &Path) -> Command {
    let python3 = holdfast_devkit::process::which("python3")
        .expect("python3 is not installed: the Python client's tests need Python 3.11+ with venv (apt-get install python3-venv)");
    let target = crate::cargo_target_dir();
    let venv = target.join("py-venv");
    let py = venv.join("bin/python");
    let dir = python_client_dir();
    {
        let lock = std::fs::File::create(target.join("py-venv.lock")).expect("create target/py-venv.lock");
        lock.lock().expect("lock target/py-venv.lock");
        if !py.exists() {
            run(Command::new(python3).args(["-m", "venv"]).arg(&venv));
        }
        run(Command::new(&py)
            .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--require-hashes", "-r", "requirements-dev.txt"])
            .current_dir(&dir));
        // Unlocked when `lock` drops.
    }
    run(Command::new(&py)
        .args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-build-isolation", "--no-deps", "--target"])
        .arg(site)
        .arg(".")
        .current_dir(&dir));
    let mut cmd = Command::new(py);
    cmd.current_dir(dir).env("PYTHONDONTWRITEBYTECODE", "1").env("PYTHONPATH", site);
    cmd
}
