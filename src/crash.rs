//! Named crash points for crash tests (failpoints).
//!
//! When the environment variable `BLOBSNAP_CRASH_AT` names a point (for example
//! `restore.after-marker`), the process kills itself with SIGKILL on reaching it: no
//! destructors, no buffered writes flushed, exactly what a `kill -9` or a power cut does to the
//! process. Unset (always, in production), a crash point costs one load of a cached value.
//!
//! Points: `task.after-claim`, `task.after-restore`; `commit.before-upload` (after the sync
//! step), `backup.mid-upload` (after the first blob PUT), `commit.before-checkpoint` (after the
//! index PUT), `commit.after-checkpoint`, `commit.during-cleanup` (after the history trim);
//! `restore.after-plan`, `restore.mid-download` (after the first downloaded file is in
//! staging), `restore.before-marker`, `restore.after-marker`, `restore.after-exchange` (before
//! the old tree is deleted); `sweep.mid-delete` (after the sweep's first delete batch).
//!
//! `point@N` dies the N-th time the point is reached (default 1), so a seeded crash matrix can
//! hit a point in its 1st, 2nd, … commit. An unknown name is refused ([`check_env`]): the
//! `blobsnap` command exits 5 naming it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Every crash point, by name.
pub const POINTS: &[&str] = &[
    "task.after-claim",
    "task.after-restore",
    "commit.before-upload",
    "backup.mid-upload",
    "commit.before-checkpoint",
    "commit.after-checkpoint",
    "commit.during-cleanup",
    "restore.after-plan",
    "restore.mid-download",
    "restore.before-marker",
    "restore.after-marker",
    "restore.after-exchange",
    "sweep.mid-delete",
];

/// Check `BLOBSNAP_CRASH_AT`: a name that is not a crash point (a typo, a renamed point) is
/// an error, never a point that is silently "not reached". The CLI calls this first.
pub fn check_env() -> Result<()> {
    let Some(v) = std::env::var("BLOBSNAP_CRASH_AT")
        .ok()
        .filter(|s| !s.is_empty())
    else {
        return Ok(());
    };
    let (name, nth) = v.split_once('@').unwrap_or((v.as_str(), "1"));
    if !POINTS.contains(&name) {
        return Err(Error::invalid(format!(
            "BLOBSNAP_CRASH_AT={v:?}: {name:?} is not a crash point (known: {})",
            POINTS.join(", ")
        )));
    }
    if nth.parse::<u64>().map_or(true, |n| n == 0) {
        return Err(Error::invalid(format!(
            "BLOBSNAP_CRASH_AT={v:?}: the hit number after '@' must be a positive integer"
        )));
    }
    Ok(())
}

fn target() -> Option<&'static (String, u64)> {
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            let v = std::env::var("BLOBSNAP_CRASH_AT")
                .ok()
                .filter(|s| !s.is_empty())?;
            Some(match v.split_once('@') {
                Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1).max(1)),
                None => (v, 1),
            })
        })
        .as_ref()
}

/// Die here with SIGKILL if `BLOBSNAP_CRASH_AT` names this point (and this is the N-th hit).
pub fn point(name: &str) {
    debug_assert!(
        POINTS.contains(&name),
        "crash point {name:?} is not in POINTS"
    );
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((target, nth)) = target() else {
        return;
    };
    if target == name && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *nth {
        eprintln!("blobsnap: crash point {name} reached: killing this process (BLOBSNAP_CRASH_AT)");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}
