//! Clock faults: the libfaketime clocks of arbiter 1 and the clock-faulted
//! clients jumped forward, confirmed by the clients' clock reports.

use super::{ClientProc, Effect, FaultCtx, clock_report, read_clock_spec, wait_for, write_clock_spec};
use anyhow::bail;
use rand::Rng;
use rand::rngs::StdRng;
use std::path::Path;
use std::time::Duration;

/// Jump the faked clocks forward by 5–30 s; at least one client must see
/// its clock move by that much.
pub async fn jump(ctx: &FaultCtx<'_>, rng: &mut StdRng, hold: Duration) -> anyhow::Result<Effect> {
    // Forward only, and cumulative (never set back): CLOCK_MONOTONIC
    // never goes back on Linux, so a backward jump of the faked
    // monotonic clock would test a clock that cannot exist (and
    // stall tokio's timers). A forward jump of both clocks is what a
    // VM suspend/resume or a stopped-then-stepped host does.
    let jump: i64 = rng.random_range(5..30);
    let faked: Vec<&ClientProc> = ctx.clients.iter().filter(|p| p.clock_file.is_some()).collect();
    // A client just started may not have reported its clock yet.
    let reported = |p: &&ClientProc| p.clock_report.as_deref().and_then(clock_offset_ms).is_some();
    wait_for(Duration::from_secs(5), || async { faked.iter().any(reported) }).await;
    let before: Vec<Option<i64>> = faked.iter().map(|p| p.clock_report.as_deref().and_then(clock_offset_ms)).collect();
    for f in faked.iter().filter_map(|p| p.clock_file.as_ref()).chain(ctx.cluster.arbiters.iter().filter_map(|a| a.clock_file.as_ref())) {
        let (now, rate) = read_clock_spec(f);
        write_clock_spec(f, now + jump, rate)?;
    }
    // libfaketime re-reads its file once a second.
    tokio::time::sleep(hold.max(Duration::from_millis(2500))).await;
    let after: Vec<Option<i64>> = faked.iter().map(|p| p.clock_report.as_deref().and_then(clock_offset_ms)).collect();
    // The clients' clocks also run at their own rates (±15 % over
    // the hold: well inside the tolerance).
    let moved =
        before.iter().zip(&after).filter(|(b, a)| matches!((b, a), (Some(b), Some(a)) if (a - b - jump * 1000).abs() < 2000)).count();
    if moved == 0 {
        bail!("no clock-faulted client saw its clock jump by {jump}s");
    }
    Ok(Effect {
        what: format!("jump the clocks of arbiter 1 and {} clients forward by {jump}s", faked.len()),
        confirmed: format!("{moved} clients saw the jump"),
    })
}

/// How far a process's clock is from the real one, in ms.
fn clock_offset_ms(report: &Path) -> Option<i64> {
    let (own, raw) = clock_report(report)?;
    Some(((own - raw) / 1_000_000) as i64)
}
