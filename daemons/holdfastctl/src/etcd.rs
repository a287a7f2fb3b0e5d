//! `holdfastctl etcd roles`: one etcd role and user per tool, each limited
//! to its key ranges (`holdfast_store::roles`), created idempotently, and
//! authentication turned on.

use holdfast_cli::conn::EtcdArgs;
use holdfast_cli::exit;
use holdfast_store::roles::{ROLES, ROOT, ensure};

pub const ROLES_HELP: &str = "\
etcd runs with --client-cert-auth: a client's etcd user is the common name
(CN) of its client certificate, so no tool holds a password. This creates one
role per tool with only the key ranges it needs, a user of the same name
holding it, and the `root` user (etcd's administrator, needed to turn
authentication on and to manage roles); then it enables authentication.

Run it as root (--etcd-cert with CN=root), once per cluster and again after
an upgrade: it makes the roles match the table exactly (revoking anything
else granted to them) and changes nothing on a second run. Other roles and
users are left alone. Before authentication is on, any client may run it.

Then give each tool a client certificate whose CN is its user:
  holdfast-arbiter     arbiter.toml [etcd] cert_file/key_file
  holdfast-controller  controller.toml [etcd]
  holdfast-pausetest   holdfast-pausetest --etcd-cert/--etcd-key
  holdfast-epoch       holdfastctl epoch init, the epoch advance
  holdfast-force-release  holdfastctl force-release apply
  holdfast-shard       holdfastctl shard init|add|remove|assign|segments
  holdfast-observer    holdfastctl status, shard list|status|where
  holdfast-tailer      the audit tailer (read-only)

Examples:
  holdfastctl etcd roles --list
  holdfastctl etcd roles --etcd-endpoint https://10.0.1.11:2379 \\
      --etcd-ca etcd-ca.pem --etcd-cert root.pem --etcd-key root-key.pem

Exit status:
  0   the roles match the table (and authentication is on)
  69  etcd cannot be reached
  77  etcd refused (not root: check the CN of --etcd-cert)";

#[derive(clap::Args)]
pub struct EtcdCmdArgs {
    #[command(subcommand)]
    action: EtcdAction,
}

#[derive(clap::Subcommand)]
enum EtcdAction {
    /// Create the etcd role and user of every holdfast tool, limited to its
    /// key ranges, and enable authentication (idempotent).
    #[command(after_long_help = ROLES_HELP)]
    Roles(RolesArgs),
}

#[derive(clap::Args)]
struct RolesArgs {
    /// Print the role table and exit, without contacting etcd.
    #[arg(long, exclusive = true)]
    list: bool,
    /// Create the roles and users but leave authentication as it is.
    #[arg(long)]
    no_enable_auth: bool,
    #[command(flatten)]
    etcd: EtcdArgs,
}

pub async fn run(args: EtcdCmdArgs) -> u8 {
    match args.action {
        EtcdAction::Roles(a) => roles(a).await,
    }
}

fn print_table() {
    for role in ROLES {
        println!("{}  ({})", role.name, role.used_by);
        for r in role.read_write {
            println!("  readwrite  {r}");
        }
        for r in role.read {
            println!("  read       {r}");
        }
    }
    println!("{ROOT}  (etcd's administrator: roles, authentication, snapshots)");
}

async fn roles(args: RolesArgs) -> u8 {
    if args.list {
        print_table();
        return exit::OK;
    }
    let etcd = match crate::epoch::connect(&args.etcd).await {
        Ok(e) => e,
        Err(code) => return code,
    };
    let mut client = etcd.client.clone();
    match ensure(&mut client, !args.no_enable_auth).await {
        Ok(changes) => {
            for c in &changes {
                println!("{c}");
            }
            let auth = if args.no_enable_auth { "left as it was" } else { "on" };
            println!("{} roles match the table ({} change(s)); authentication {auth}", ROLES.len(), changes.len());
            exit::OK
        }
        Err(e) => {
            let text = e.to_string();
            if text.contains("permission denied") || text.contains("user name not found") || text.contains("not found") {
                eprintln!("holdfastctl: etcd refused: {text}; run this as etcd's root user (a client certificate with CN=root)");
                exit::NOPERM
            } else {
                eprintln!("holdfastctl: {text}");
                exit::UNAVAILABLE
            }
        }
    }
}
