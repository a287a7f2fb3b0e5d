//! `holdfast-tailer check`: the config file, then the store directory
//! (its checkpoint readable, its segments parseable).

use holdfast_config::TailerConfig;
use std::path::Path;

/// The config file is wrong, or the store cannot be read (EX_CONFIG).
pub const CONFIG: u8 = 78;

/// Runs the check and returns the exit status.
pub fn run(config_path: &Path) -> u8 {
    let config = match TailerConfig::load(config_path) {
        Ok(c) => c,
        Err(e) => {
            eprintln!("holdfast-tailer: {e}");
            return CONFIG;
        }
    };
    println!("{}: ok", config_path.display());
    let dir = &config.store_dir;
    if !dir.exists() {
        println!("{}: not created yet (the tailer creates it on start)", dir.display());
        return 0;
    }
    // systemd makes the unit's StateDirectory= (the store) empty before this runs.
    if dir.read_dir().is_ok_and(|mut entries| entries.next().is_none()) {
        println!("{}: empty (the tailer creates the store on start)", dir.display());
        return 0;
    }
    match (holdfast_audit::store::read_checkpoint(dir), holdfast_audit::store::read_events(dir)) {
        (Ok(checkpoint), Ok(events)) => {
            match checkpoint {
                // The checkpoint's age, not its revision: on a quiet cluster
                // the last revision is the last grant's, a live hold's token.
                Some(c) => println!(
                    "{}: {} events of cluster {}, checkpoint written {}s ago",
                    dir.display(),
                    events.len(),
                    c.cluster_id,
                    holdfast_daemon::now_unix_ms().saturating_sub(c.written_unix_ms) / 1000
                ),
                None => println!("{}: {} events, no checkpoint yet", dir.display(), events.len()),
            }
            0
        }
        (Err(e), _) | (_, Err(e)) => {
            eprintln!("holdfast-tailer: store_dir: {e}");
            CONFIG
        }
    }
}
