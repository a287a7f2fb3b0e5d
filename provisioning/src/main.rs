//! holdfast-provision: prepares a bare-metal host for a holdfast etcd member.
//! Arguments, config, printing; the work is in the library.

#![deny(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::ExitCode;

use anyhow::Context;
use clap::{Parser, Subcommand};
use holdfast_provision::config::{DEFAULT_CONFIG, ProvisionConfig};
use holdfast_provision::plan::{self, Inventory, TokenSource};
use holdfast_provision::{ProvisionError, disk, probe, tune};
use serde_json::json;

const AFTER: &str = "\
Every subcommand is idempotent (running it again changes nothing once done),
takes --dry-run (say what would change, change nothing) and --json (one JSON
object on stdout; progress and errors stay on stderr).

Exit status: 0 done; 65 refused (device in use, slow disk, invalid placement);
69 Tang unreachable (the disk stays locked); 78 invalid config; 1 other errors.

First boot of an etcd node, in order:
  holdfast-provision check                 # validate /etc/holdfast/provision.toml
  holdfast-provision disk                  # LUKS2 + Clevis/Tang, no passphrase slot
  holdfast-provision unlock                # through Tang; mkfs, mount, data dir
  holdfast-provision probe                 # fsync p99 gate (2 ms)
  holdfast-provision tune                  # CPU/IO drop-in for holdfast-etcd@.service
Every boot: holdfast-provision.service runs `unlock`, `probe` and `tune`.";

/// Provisioning agent for holdfast etcd nodes on bare metal.
#[derive(Parser)]
#[command(name = "holdfast-provision", version, about, after_help = AFTER)]
struct Cli {
    /// Node config.
    #[arg(long, global = true, env = "HOLDFAST_PROVISION_CONFIG", default_value = DEFAULT_CONFIG)]
    config: PathBuf,
    /// Say what would be done; change nothing.
    #[arg(long, global = true)]
    dry_run: bool,
    /// Print one JSON object on stdout instead of text.
    #[arg(long, global = true)]
    json: bool,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Validate the node config and print it with defaults filled in.
    #[command(
        long_about = "Validate the node config (every problem reported at once, naming the key) and print it with defaults filled in. Run by ExecStartPre= of holdfast-provision.service."
    )]
    Check,
    /// First boot: LUKS2-format the data device, bind it to Tang with Clevis, leave no passphrase keyslot.
    #[command(long_about = "First boot: LUKS2-format disk.device through libcryptsetup, bind it to the \
Tang servers with Clevis (an sss policy with threshold tang.threshold over all servers, in at least two \
halls), prove the Clevis keyslot opens through Tang, then destroy the temporary keyslot: no passphrase \
keyslot remains on the host.\n\nRefuses a device that already holds a file system or a LUKS header, unless \
--force. A device that is already provisioned is left alone; a run interrupted after binding is completed.\n\n\
Recovery key (optional, never kept on the host): right after this step, on the console, add a random \
key with `clevis luks pass -d DEV -s SLOT | cryptsetup luksAddKey --key-file - DEV`, save \
`cryptsetup luksHeaderBackup DEV --header-backup-file FILE` to offline media together with that key, escrow \
both offline, then run `holdfast-provision disk` again: it removes every keyslot no Clevis token references. \
The live header then holds no passphrase slot; restoring the escrowed header brings the recovery key back.")]
    Disk {
        /// Format even if the device holds a file system or LUKS header. Destroys its contents.
        #[arg(long)]
        force: bool,
    },
    /// Every boot: unlock through Tang (no passphrase fallback), create the file system if empty, mount, create the etcd data directory.
    #[command(long_about = "Every boot: recover the volume key through Tang with Clevis and activate \
/dev/mapper/<disk.mapper_name>. There is no passphrase fallback: if Tang cannot be reached, the node stays \
locked and this exits 69 saying which servers were tried. Then create disk.filesystem if the volume is empty, \
mount it on disk.mount_point and create disk.data_dir with disk.owner, disk.group and disk.mode.")]
    Unlock,
    /// Measure fdatasync latency (p50/p99) with etcd's WAL pattern; gate readiness on p99 <= 2 ms.
    #[command(long_about = "Measure fdatasync latency on the data volume with etcd's write pattern \
(probe.samples appends of probe.write_size bytes to a preallocated file, fdatasync after each) and print \
p50/p99/max. The node is marked ready for an etcd member (state_dir/probe.json) only if p99 <= probe.max_p99 \
(2 ms by default, the design's threshold), unless --accept-slow-disk. With --dry-run, measures but records nothing.")]
    Probe {
        /// Directory to measure (default: disk.data_dir).
        #[arg(long)]
        dir: Option<PathBuf>,
        /// Override probe.max_p99 (e.g. 2ms).
        #[arg(long, value_parser = humantime::parse_duration)]
        max_p99: Option<std::time::Duration>,
        /// Override probe.samples.
        #[arg(long)]
        samples: Option<usize>,
        /// Mark the node ready even if p99 exceeds the threshold (recorded as overridden).
        #[arg(long)]
        accept_slow_disk: bool,
    },
    /// Write the CPU/IO drop-in for holdfast-etcd@.service and apply it to a running member.
    #[command(long_about = "Write <tune.unit_dir>/holdfast-etcd@.service.d/50-holdfast-provision.conf with \
CPUAffinity= (tune.cpus), IOSchedulingClass=/IOSchedulingPriority= and Nice=, and apply the same to every \
thread of a running member (sched_setaffinity, ioprio_set, setpriority): the PID given with --pid, else the \
MainPID of holdfast-etcd@<host>.service (the member is named after the host) if it runs.")]
    Tune {
        /// PID of a running etcd member to retune.
        #[arg(long)]
        pid: Option<i32>,
    },
    /// Compute hall-aware etcd member placement from an inventory and emit each member's etcd configuration.
    #[command(long_about = "Compute etcd member placement from an inventory of hosts and halls: entity \
clusters one member per hall across three halls, coord five members split 2-2-1, one member per dedicated \
host. Refuses any plan in which one hall holds a majority of a cluster or a cluster spans fewer halls than \
required, and says why. Emits each member's name, initial cluster, peer and client URLs and the cluster's \
initial-cluster-token.\n\nTokens: without --token-seed every run draws fresh random tokens (use the output \
once, to create the clusters). With --token-seed the output is byte-for-byte reproducible; use a new seed \
every time a cluster is (re)created, e.g. the change ticket id. Does not read the node config.")]
    Plan {
        /// Inventory file (see config/inventory-*.toml).
        #[arg(long)]
        inventory: PathBuf,
        /// Derive cluster tokens from this seed (reproducible) instead of at random.
        #[arg(long)]
        token_seed: Option<String>,
        /// Write one ETCD_* environment file per member into this directory (<host>.env).
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Show the node's state: device, keyslots, mount, data directory, probe verdict, tuning drop-in.
    #[command(long_about = "Show the node's state without changing anything: the data device (LUKS \
version, Clevis keyslots, any other keyslot), whether it is unlocked and mounted, the data directory, the \
last probe verdict and whether the tuning drop-in is current.")]
    Status,
    /// Write the man pages and shell completions to DIR (packaging/build).
    #[command(hide = true)]
    GenerateDocs {
        #[arg(long, value_name = "DIR")]
        out: PathBuf,
    },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    if let Cmd::GenerateDocs { out } = &cli.cmd {
        return ExitCode::from(holdfast_cli::docs::run_daemon(<Cli as clap::CommandFactory>::command(), out, &[]));
    }
    match run(&cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let code = match e.downcast_ref::<ProvisionError>() {
                Some(ProvisionError::Config { .. } | ProvisionError::Inventory { .. }) => 78,
                Some(ProvisionError::DeviceInUse { .. } | ProvisionError::Placement { .. } | ProvisionError::SlowDisk { .. }) => 65,
                Some(ProvisionError::TangUnreachable { .. }) => 69,
                _ => 1,
            };
            eprintln!("holdfast-provision: {e:#}");
            if cli.json {
                println!("{}", json!({ "ok": false, "exit": code, "error": format!("{e:#}") }));
            }
            ExitCode::from(code)
        }
    }
}

fn progress(msg: &str) {
    eprintln!("holdfast-provision: {msg}…");
}

fn emit(json_mode: bool, value: serde_json::Value, text: String) -> anyhow::Result<()> {
    if json_mode {
        println!("{}", serde_json::to_string_pretty(&value)?);
    } else {
        print!("{text}");
    }
    Ok(())
}

fn load(path: &Path) -> anyhow::Result<ProvisionConfig> {
    Ok(ProvisionConfig::load(path)?)
}

fn run(cli: &Cli) -> anyhow::Result<()> {
    let (dry, js) = (cli.dry_run, cli.json);
    let prefix = if dry { "would: " } else { "" };
    match &cli.cmd {
        Cmd::Check => {
            let cfg = load(&cli.config)?;
            let text = format!("{}: valid\n{}", cli.config.display(), toml::to_string_pretty(&cfg)?);
            emit(js, json!({ "ok": true, "config": cfg }), text)
        }
        Cmd::Disk { force } => {
            let cfg = load(&cli.config)?;
            let out = disk::format_and_bind(&cfg.disk, &cfg.tang, *force, dry, &mut |m| progress(m))?;
            let text = out.steps.iter().map(|s| format!("{prefix}{s}\n")).collect::<String>();
            emit(js, json!({ "ok": true, "dry_run": dry, "changed": out.changed, "steps": out.steps, "device": out.state }), text)
        }
        Cmd::Unlock => {
            let cfg = load(&cli.config)?;
            let out = disk::unlock(&cfg.disk, &cfg.tang, dry, &mut |m| progress(m))?;
            let text = out.steps.iter().map(|s| format!("{prefix}{s}\n")).collect::<String>();
            emit(js, json!({ "ok": true, "dry_run": dry, "changed": out.changed, "steps": out.steps }), text)
        }
        Cmd::Probe { dir, max_p99, samples, accept_slow_disk } => {
            let cfg = load(&cli.config)?;
            let mut pc = cfg.probe.clone();
            if let Some(d) = max_p99 {
                pc.max_p99 = *d;
            }
            if let Some(n) = samples {
                pc.samples = *n;
            }
            let dir = dir.clone().unwrap_or_else(|| cfg.disk.data_dir.clone());
            progress(&format!("measuring fdatasync latency in {} ({} appends of {} bytes)", dir.display(), pc.samples, pc.write_size));
            let report = probe::measure(&dir, &pc, |done, total| eprintln!("holdfast-provision: probe {done}/{total}"))?;
            let figures = format!(
                "fdatasync in {}: p50 {} p99 {} max {} (threshold p99 <= {})\n",
                dir.display(),
                probe::human_us(report.p50_us),
                probe::human_us(report.p99_us),
                probe::human_us(report.max_us),
                probe::human_us(report.max_p99_us)
            );
            let verdict = probe::gate(report.clone(), *accept_slow_disk);
            if verdict.is_err() {
                eprint!("{figures}");
            }
            let recorded = match &verdict {
                Ok(r) => r.clone(),
                Err(_) => report,
            };
            if !dry {
                probe::record(&cfg.state_dir, &recorded).context("recording the probe verdict")?;
            }
            let r = verdict?;
            let text = format!(
                "{figures}{}{}\n",
                if r.overridden {
                    "ready for an etcd member (slow disk accepted with --accept-slow-disk)"
                } else {
                    "ready for an etcd member"
                },
                if dry { " (dry run: verdict not recorded)" } else { "" }
            );
            emit(js, json!({ "ok": true, "dry_run": dry, "report": r }), text)
        }
        Cmd::Tune { pid } => {
            let cfg = load(&cli.config)?;
            let d = tune::write_dropin(&cfg.tune, dry)?;
            let mut text = format!("{}{} {}\n", prefix, if d.changed { "write" } else { "unchanged:" }, d.path.display());
            if d.changed && !dry && cfg.tune.unit_dir == Path::new("/etc/systemd/system") && Path::new("/run/systemd/system").exists() {
                let _ = std::process::Command::new("systemctl").arg("daemon-reload").status();
            }
            let pid = match pid {
                Some(p) => Some(*p),
                None => match &cfg.roles.etcd {
                    Some(_) if Path::new("/run/systemd/system").exists() => {
                        tune::main_pid_of(&format!("holdfast-etcd@{}.service", cfg.host))?
                    }
                    _ => None,
                },
            };
            let applied = match pid {
                Some(p) => {
                    let a = tune::apply_to_pid(p, &cfg.tune, dry)?;
                    text.push_str(&format!(
                        "{}PID {} ({} threads): CPUs {}, I/O {:?} prio {}, nice {}{}\n",
                        prefix,
                        a.pid,
                        a.threads,
                        cfg.tune.cpus,
                        cfg.tune.io_class,
                        cfg.tune.io_priority,
                        cfg.tune.nice,
                        if a.changed { "" } else { " (already so)" }
                    ));
                    Some(a)
                }
                None => {
                    text.push_str("no running etcd member to retune (pass --pid); the drop-in applies at its next start\n");
                    None
                }
            };
            emit(js, json!({ "ok": true, "dry_run": dry, "dropin": d, "applied": applied }), text)
        }
        Cmd::Plan { inventory, token_seed, out } => {
            let inv = Inventory::load(inventory)?;
            let tokens = token_seed.clone().map(TokenSource::Seed).unwrap_or(TokenSource::Random);
            let p = plan::plan(&inv, &tokens)?;
            let mut text = plan::render_text(&p);
            if let Some(dir) = out {
                for c in &p.clusters {
                    for m in &c.members {
                        let path = dir.join(format!("{}.env", m.host));
                        let content = plan::render_env(c, m);
                        let same = std::fs::read_to_string(&path).map(|x| x == content).unwrap_or(false);
                        if !same && !dry {
                            std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
                            std::fs::write(&path, content).with_context(|| format!("writing {}", path.display()))?;
                        }
                        text.push_str(&format!("{}{} {}\n", prefix, if same { "unchanged:" } else { "write" }, path.display()));
                    }
                }
            }
            emit(js, json!({ "ok": true, "plan": p }), text)
        }
        Cmd::GenerateDocs { .. } => Ok(()),
        Cmd::Status => {
            let cfg = load(&cli.config)?;
            let device = disk::inspect(&cfg.disk.device).map_err(|e| e.to_string());
            let mapper = Path::new("/dev/mapper").join(&cfg.disk.mapper_name);
            let unlocked = mapper.exists();
            let mounted = disk::is_mounted(&cfg.disk.mount_point);
            let data_dir = cfg.disk.data_dir.is_dir();
            let last_probe = probe::last(&cfg.state_dir);
            let dropin_current = std::fs::read_to_string(tune::dropin_path(&cfg.tune.unit_dir))
                .map(|c| c == tune::render_dropin(&cfg.tune))
                .unwrap_or(false);
            let mut text = format!("host {} in {}\n", cfg.host, cfg.hall);
            match &device {
                Ok(d) => text.push_str(&format!(
                    "device {}: {} clevis keyslots {:?}; other keyslots {:?}{}\n",
                    d.device.display(),
                    d.luks.as_deref().or(d.signature.as_deref()).unwrap_or("empty"),
                    d.clevis_keyslots,
                    d.other_keyslots,
                    if d.is_provisioned() { " (provisioned)" } else { " (not provisioned: run `holdfast-provision disk`)" }
                )),
                Err(e) => text.push_str(&format!("device: {e}\n")),
            }
            text.push_str(&format!(
                "unlocked ({}): {unlocked}\nmounted ({}): {mounted}\ndata dir ({}): {data_dir}\n",
                mapper.display(),
                cfg.disk.mount_point.display(),
                cfg.disk.data_dir.display()
            ));
            match &last_probe {
                Some(r) => text.push_str(&format!("probe: p50 {}us p99 {}us, ready {}\n", r.p50_us, r.p99_us, r.ready)),
                None => text.push_str("probe: never run (run `holdfast-provision probe`)\n"),
            }
            text.push_str(&format!("tuning drop-in current: {dropin_current}\n"));
            emit(
                js,
                json!({
                    "ok": true, "host": cfg.host, "hall": cfg.hall,
                    "device": device.as_ref().ok(), "device_error": device.as_ref().err(),
                    "unlocked": unlocked, "mounted": mounted, "data_dir": data_dir,
                    "probe": last_probe, "dropin_current": dropin_current,
                }),
                text,
            )
        }
    }
}
