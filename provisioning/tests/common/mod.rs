//! Test harness: real tools only. Loop devices backed by files in a temp dir,
//! Debian's tangd under socat on 127.0.0.1, guards that clean up on drop.
#![allow(dead_code)]

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub const TANGD: &str = "/usr/libexec/tangd";
pub const TANGD_KEYGEN: &str = "/usr/libexec/tangd-keygen";

/// Fails (never skips) when a tool is missing.
pub fn require(tools: &[&str]) {
    for t in tools {
        let found = if t.starts_with('/') {
            Path::new(t).exists()
        } else {
            Command::new("sh").args(["-c", &format!("command -v {t}")]).stdout(Stdio::null()).status().map(|s| s.success()).unwrap_or(false)
        };
        assert!(
            found,
            "{t} is missing: run scripts/install-deps (it installs clevis, clevis-luks, tang-common, socat, cryptsetup-bin, libcryptsetup-dev, libclang-dev)"
        );
    }
}

pub fn bin() -> PathBuf {
    PathBuf::from(env!("CARGO_BIN_EXE_holdfast-provision"))
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).map(|a| a.port()).expect("a free port on 127.0.0.1")
}

/// A real tangd, served by socat on 127.0.0.1:<free port>.
pub struct Tang {
    pub port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
}

impl Tang {
    pub fn start() -> Tang {
        require(&[TANGD, TANGD_KEYGEN, "socat", "curl"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let keys = dir.path().join("keys");
        std::fs::create_dir(&keys).expect("keys dir");
        let st = Command::new(TANGD_KEYGEN).arg(&keys).status().expect("tangd-keygen");
        assert!(st.success(), "tangd-keygen failed");
        let mut t = Tang { port: free_port(), dir, child: None };
        t.spawn();
        t
    }

    fn spawn(&mut self) {
        let keys = self.dir.path().join("keys");
        let log = std::fs::File::create(self.dir.path().join("tangd.log")).expect("log");
        let child = Command::new("socat")
            .arg(format!("TCP-LISTEN:{},bind=127.0.0.1,reuseaddr,fork", self.port))
            .arg(format!("EXEC:{TANGD} {}", keys.display()))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .expect("socat");
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        while Instant::now() < deadline {
            let ok = Command::new("curl")
                .args(["-sf", "-o", "/dev/null", &format!("{}/adv", self.url())])
                .status()
                .map(|s| s.success())
                .unwrap_or(false);
            if ok {
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        panic!("tangd under socat did not answer on {}", self.url());
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Tang {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A loop device backed by a sparse file in a temp dir.
pub struct Loop {
    pub dev: PathBuf,
    pub dir: tempfile::TempDir,
}

impl Loop {
    pub fn new(size_mb: u64) -> Loop {
        require(&["losetup", "cryptsetup", "clevis", "blkid", "wipefs"]);
        let dir = tempfile::tempdir().expect("tempdir");
        let img = dir.path().join("disk.img");
        let f = std::fs::File::create(&img).expect("image");
        f.set_len(size_mb << 20).expect("size");
        let out = Command::new("losetup").args(["-f", "--show"]).arg(&img).output().expect("losetup");
        assert!(out.status.success(), "losetup: {}", String::from_utf8_lossy(&out.stderr));
        let dev = PathBuf::from(String::from_utf8_lossy(&out.stdout).trim());
        Loop { dev, dir }
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.dev).status();
    }
}

/// Whether this host can activate a dm-crypt mapping, probed the way
/// `disk::activate` needs it: a real `cryptsetup open --allow-discards` of a
/// throwaway LUKS2 image (aes-xts-plain64, 512-bit key, as `disk` formats),
/// then `cryptsetup close`. Neither `/dev/mapper/control` (libdevmapper creates
/// it when the kernel has device-mapper) nor `dmsetup version` (no dm-crypt
/// target, no cipher) says as much.
///
/// `Err` carries cryptsetup's words when device-mapper itself is missing. Any
/// other failure panics: a probe that cannot tell must not choose a branch.
pub fn device_mapper() -> Result<(), String> {
    let lo = Loop::new(32);
    let with_key = |args: &[&str]| {
        let mut c = Command::new("cryptsetup")
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("cryptsetup");
        std::io::Write::write_all(&mut c.stdin.take().expect("stdin"), b"probe").expect("write key");
        c.wait_with_output().expect("wait for cryptsetup")
    };
    let dev = lo.dev.to_str().expect("loop device path");
    let format = with_key(&[
        "luksFormat",
        "-q",
        "--type",
        "luks2",
        "--cipher",
        "aes-xts-plain64",
        "--key-size",
        "512",
        "--pbkdf",
        "pbkdf2",
        "--pbkdf-force-iterations",
        "1000",
        "--key-file",
        "-",
        dev,
    ]);
    assert!(format.status.success(), "device-mapper probe: luksFormat {dev}: {}", String::from_utf8_lossy(&format.stderr));
    let name = format!("holdfast-dmprobe-{}", std::process::id());
    let open = with_key(&["open", "--allow-discards", "--key-file", "-", dev, &name]);
    if !open.status.success() {
        let mut lines: Vec<&str> = Vec::new();
        let stderr = String::from_utf8_lossy(&open.stderr);
        for l in stderr.lines().map(str::trim).filter(|l| !l.is_empty()) {
            if !lines.contains(&l) {
                lines.push(l); // cryptsetup says it twice
            }
        }
        let why = lines.join(" ");
        assert!(
            why.contains("Cannot initialize device-mapper"),
            "device-mapper probe: cryptsetup open failed, but not for want of device-mapper, so this test cannot tell which kind of host this is: {why}"
        );
        return Err(why);
    }
    let close = Command::new("cryptsetup").args(["close", &name]).output().expect("cryptsetup close");
    assert!(
        close.status.success(),
        "device-mapper probe: /dev/mapper/{name} was opened but does not close: {}; close it by hand (cryptsetup close {name})",
        String::from_utf8_lossy(&close.stderr)
    );
    Ok(())
}

/// A node config for tests, written into `dir`.
pub fn node_config(dir: &Path, device: &Path, tang_urls: &[(String, &str)], threshold: u32) -> PathBuf {
    let mut servers = String::new();
    for (url, hall) in tang_urls {
        servers.push_str(&format!("[[tang.servers]]\nurl = \"{url}\"\nhall = \"{hall}\"\n\n"));
    }
    let text = format!(
        r#"host = "test-node"
hall = "hall-a"
state_dir = "{state}"

[roles.etcd]
cluster = "entity-1"
tier = "entity"

[disk]
device = "{dev}"
mapper_name = "holdfast-test-{pid}"
mount_point = "{mnt}"
data_dir = "{mnt}/member-data"
owner = "root"
group = "root"

[tang]
threshold = {threshold}

{servers}
[tune]
cpus = "0"
io_class = "best-effort"
io_priority = 4
nice = 5
unit_dir = "{units}"

[probe]
samples = 200
"#,
        state = dir.join("state").display(),
        dev = device.display(),
        pid = std::process::id(),
        mnt = dir.join("mnt").display(),
        units = dir.join("units").display(),
    );
    let path = dir.join("provision.toml");
    std::fs::write(&path, text).expect("write config");
    path
}

/// Runs a `--json` command that must succeed and returns its JSON output.
pub fn run_ok_json(cmd: &mut Command) -> serde_json::Value {
    let out = cmd.output().expect("run");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    serde_json::from_slice(&out.stdout).expect("json")
}
