//! The gate's network: one Linux bridge in the host namespace and one
//! network namespace per etcd member and per arbiter, joined by veth pairs.
//! Partitions and packet loss are iptables rules inside the namespaces, so
//! nothing outside the namespaces this run created is ever touched.

use anyhow::{Context, bail};
use std::process::Command;

/// A host (network namespace) on the gate's bridge.
#[derive(Debug, Clone)]
pub struct Host {
    pub ns: String,
    pub ip: String,
}

/// The bridge, its subnet and the namespaces. Dropping it deletes them all.
pub struct Net {
    pub bridge: String,
    /// The bridge's own address: how the host namespace (clients, proxies,
    /// the gate itself) reaches the namespaces.
    pub gateway: String,
    pub hosts: Vec<Host>,
}

pub fn run(cmd: &[&str]) -> anyhow::Result<String> {
    let out = Command::new(cmd[0]).args(&cmd[1..]).output().with_context(|| format!("running {}", cmd[0]))?;
    if !out.status.success() {
        bail!("`{}` failed: {}", cmd.join(" "), String::from_utf8_lossy(&out.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&out.stdout).into_owned())
}

/// Checks what the gate needs before it changes anything.
pub fn preflight() -> anyhow::Result<()> {
    if !nix::unistd::geteuid().is_root() {
        bail!("the gate creates network namespaces and needs root; run it as root (CI does) or with sudo");
    }
    for tool in ["ip", "iptables", "strace"] {
        if run(&["sh", "-c", &format!("command -v {tool}")]).is_err() {
            bail!("`{tool}` is not installed; run scripts/install-deps");
        }
    }
    Ok(())
}

impl Net {
    /// Creates a bridge `hfg<id>` on 10.213.<id>.0/24, with the first id
    /// from `start` (mod 250) that no other run uses, and one namespace per
    /// name; host i gets .(i+1).
    pub fn create(start: u32, names: &[&str]) -> anyhow::Result<Self> {
        let mut id = start % 250;
        let bridge = loop {
            let bridge = format!("hfg{id}");
            // `ip link add` fails if another run (or a crashed one) has it.
            if run(&["ip", "link", "add", &bridge, "type", "bridge"]).is_ok() {
                break bridge;
            }
            id = (id + 1) % 250;
            if id == start % 250 {
                bail!(
                    "no free gate network: every bridge hfg0..hfg249 exists (remove stale ones with `ip link del hfgN` and `ip netns del hfgN-…`)"
                );
            }
        };
        let subnet = format!("10.213.{id}");
        let gateway = format!("{subnet}.254");
        let mut net = Net { bridge: bridge.clone(), gateway: gateway.clone(), hosts: Vec::new() };
        for ns in run(&["ip", "netns", "list"]).unwrap_or_default().lines().filter_map(|l| l.split_whitespace().next()) {
            // Namespaces a crashed run left under this (now ours) name.
            if ns.starts_with(&format!("{bridge}-")) {
                let _ = run(&["ip", "netns", "del", ns]);
            }
        }
        run(&["ip", "addr", "add", &format!("{gateway}/24"), "dev", &bridge])?;
        run(&["ip", "link", "set", &bridge, "up"])?;
        for (i, name) in names.iter().enumerate() {
            let ns = format!("{bridge}-{name}");
            let ip = format!("{subnet}.{}", i + 1);
            let veth = format!("{bridge}{name}");
            run(&["ip", "netns", "add", &ns])?;
            net.hosts.push(Host { ns: ns.clone(), ip: ip.clone() });
            run(&["ip", "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns", &ns])?;
            run(&["ip", "link", "set", &veth, "master", &bridge, "up"])?;
            run(&["ip", "-n", &ns, "addr", "add", &format!("{ip}/24"), "dev", "eth0"])?;
            run(&["ip", "-n", &ns, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &ns, "link", "set", "lo", "up"])?;
        }
        Ok(net)
    }

    /// `ip netns exec NS` as a command prefix (it execs in place: the
    /// child's pid is the program's).
    pub fn wrapper(&self, host: &Host) -> Vec<String> {
        vec!["ip".into(), "netns".into(), "exec".into(), host.ns.clone()]
    }

    /// Runs iptables inside a host's namespace.
    pub fn iptables(&self, host: &Host, args: &[&str]) -> anyhow::Result<String> {
        let mut cmd = vec!["ip", "netns", "exec", &host.ns, "iptables", "-w"];
        cmd.extend_from_slice(args);
        run(&cmd)
    }

    /// Drops every packet `host` receives from any of `from`.
    pub fn drop_from(&self, host: &Host, from: &[&Host]) -> anyhow::Result<()> {
        for f in from {
            self.iptables(host, &["-A", "INPUT", "-s", &f.ip, "-j", "DROP"])?;
        }
        Ok(())
    }

    /// Cuts `a` and `b` apart in both directions.
    pub fn cut(&self, a: &Host, b: &Host) -> anyhow::Result<()> {
        self.drop_from(a, &[b])?;
        self.drop_from(b, &[a])
    }

    /// Drops a random share of every packet `host` receives.
    pub fn lossy(&self, host: &Host, probability: f64) -> anyhow::Result<()> {
        self.iptables(
            host,
            &["-A", "INPUT", "-m", "statistic", "--mode", "random", "--probability", &format!("{probability:.2}"), "-j", "DROP"],
        )?;
        Ok(())
    }

    /// Packets dropped so far by the rules in `host`'s INPUT chain.
    pub fn dropped(&self, host: &Host) -> u64 {
        let Ok(out) = self.iptables(host, &["-L", "INPUT", "-v", "-x", "-n"]) else { return 0 };
        out.lines().filter(|l| l.contains("DROP")).filter_map(|l| l.split_whitespace().next()?.parse::<u64>().ok()).sum()
    }

    /// Removes every rule in every namespace.
    pub fn heal(&self) -> anyhow::Result<()> {
        for h in &self.hosts {
            self.iptables(h, &["-F", "INPUT"])?;
        }
        Ok(())
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for h in &self.hosts {
            let _ = run(&["ip", "netns", "del", &h.ns]);
        }
        let _ = run(&["ip", "link", "del", &self.bridge]);
    }
}
