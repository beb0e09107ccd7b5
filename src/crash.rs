//! Named crash points for crash tests (failpoints).
//!
//! When the environment variable `BLOBSNAP_CRASH_AT` names a point (for example
//! `restore.after-marker`), the process kills itself with SIGKILL on reaching it: no
//! destructors, no buffered writes flushed, exactly what a `kill -9` or a power cut does to the
//! process. Unset (always, in production), a crash point costs one load of a cached value.
//!
//! Points: `task.after-claim`, `task.after-restore`, `task.end-of-input` (a task at the end
//! of its input, about to wait for its lazily restored stores to be complete); `commit.before-upload` (after the sync
//! step), `backup.mid-upload` (after the first blob PUT), `commit.before-checkpoint` (after the
//! index PUT), `commit.after-checkpoint`, `commit.during-cleanup` (after the history trim);
//! `restore.after-plan`, `restore.mid-download` (after the first downloaded file is in
//! staging), `restore.before-marker`, `restore.after-marker`, `restore.after-exchange` (before
//! the old tree is deleted); `sweep.mid-delete` (after the sweep's first delete batch);
//! `sweep.after-prepared` (a read of the roots, after the prepared records, before the tasks'
//! histories);
//! `forget.mid-deployment` (a deployment's removal, after its first kind of object — its
//! checkpoint documents — is deleted);
//! `lazy.after-fetch` (a lazy restore's first remote file fetched and in place, the others
//! still remote); `preupload.after-put` (a pre-upload's PUT landed, no commit names its blob
//! yet), `preupload.after-named` (a commit named pre-uploaded blobs, before its index PUT);
//! `samza.before-cleanup` (the Samza plug-in: Samza wrote its checkpoint and called
//! `cleanUp`, before the backup's cleanup).
//!
//! `point@N` dies the N-th time the point is reached (default 1), so a seeded crash matrix can
//! hit a point in its 1st, 2nd, … commit. An unknown name is refused ([`check_env`]): the
//! `blobsnap` command exits 5 naming it.
//!
//! The same points can **hold** a process instead: with `BLOBSNAP_HOLD_AT=point[@N]` and
//! `BLOBSNAP_HOLD_UNTIL=<path>`, the N-th time the point is reached the calling thread prints
//! `blobsnap: hold point <name> reached` on stderr and waits until `<path>` exists (at most
//! `BLOBSNAP_HOLD_MAX_SECS`, default 300, then it aborts). A test
//! pauses a real process at a named step, acts (starts a second process, waits for its claim)
//! and lets it go on: events, not sleeps, decide the interleaving.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::OnceLock;

use crate::error::{Error, Result};

/// Every crash point, by name.
pub const POINTS: &[&str] = &[
    "task.after-claim",
    "task.after-restore",
    "task.end-of-input",
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
    "sweep.after-prepared",
    "forget.mid-deployment",
    "lazy.after-fetch",
    "preupload.after-put",
    "preupload.after-named",
    "samza.before-cleanup",
];

/// Check `BLOBSNAP_CRASH_AT` and `BLOBSNAP_HOLD_AT`: a name that is not a crash point (a
/// typo, a renamed point) is an error, never a point that is silently "not reached"; a hold
/// needs `BLOBSNAP_HOLD_UNTIL`. The CLI calls this first.
pub fn check_env() -> Result<()> {
    for var in ["BLOBSNAP_CRASH_AT", "BLOBSNAP_HOLD_AT"] {
        let Some(v) = std::env::var(var).ok().filter(|s| !s.is_empty()) else {
            continue;
        };
        let (name, nth) = v.split_once('@').unwrap_or((v.as_str(), "1"));
        if !POINTS.contains(&name) {
            return Err(Error::invalid(format!(
                "{var}={v:?}: {name:?} is not a crash point (known: {})",
                POINTS.join(", ")
            )));
        }
        if nth.parse::<u64>().map_or(true, |n| n == 0) {
            return Err(Error::invalid(format!(
                "{var}={v:?}: the hit number after '@' must be a positive integer"
            )));
        }
        if var == "BLOBSNAP_HOLD_AT"
            && std::env::var_os("BLOBSNAP_HOLD_UNTIL").is_none_or(|v| v.is_empty())
        {
            return Err(Error::invalid(format!(
                "{var}={v:?} needs BLOBSNAP_HOLD_UNTIL=<path>: the file whose existence releases the hold"
            )));
        }
    }
    Ok(())
}

fn parse(var: &str) -> Option<(String, u64)> {
    let v = std::env::var(var).ok().filter(|s| !s.is_empty())?;
    Some(match v.split_once('@') {
        Some((p, n)) => (p.to_string(), n.parse().unwrap_or(1).max(1)),
        None => (v, 1),
    })
}

fn target() -> Option<&'static (String, u64)> {
    static TARGET: OnceLock<Option<(String, u64)>> = OnceLock::new();
    TARGET.get_or_init(|| parse("BLOBSNAP_CRASH_AT")).as_ref()
}

fn hold_target() -> Option<&'static (String, u64, std::path::PathBuf)> {
    static HOLD: OnceLock<Option<(String, u64, std::path::PathBuf)>> = OnceLock::new();
    HOLD.get_or_init(|| {
        let (name, nth) = parse("BLOBSNAP_HOLD_AT")?;
        let until = std::env::var_os("BLOBSNAP_HOLD_UNTIL").filter(|v| !v.is_empty())?;
        Some((name, nth, until.into()))
    })
    .as_ref()
}

/// Hold here if `BLOBSNAP_HOLD_AT` names this point (and this is the N-th hit) until the
/// file `BLOBSNAP_HOLD_UNTIL` exists.
fn hold(name: &str) {
    static HITS: AtomicU64 = AtomicU64::new(0);
    let Some((target, nth, until)) = hold_target() else {
        return;
    };
    if target == name && HITS.fetch_add(1, Ordering::Relaxed) + 1 == *nth {
        eprintln!(
            "blobsnap: hold point {name} reached: waiting for {} (BLOBSNAP_HOLD_AT)",
            until.display()
        );
        // A hold never outlives the test that set it: after BLOBSNAP_HOLD_MAX_SECS (default
        // 300) unreleased, the process aborts.
        let max = std::env::var("BLOBSNAP_HOLD_MAX_SECS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(300u64);
        let wait = || {
            let started = std::time::Instant::now();
            while !until.exists() {
                if started.elapsed().as_secs() >= max {
                    eprintln!("blobsnap: hold point {name} not released within {max} s: aborting");
                    std::process::abort();
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
        };
        // On a runtime worker, hand its other tasks to another thread while this one waits.
        match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
            Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(wait),
            _ => wait(),
        }
        eprintln!("blobsnap: hold point {name} released");
    }
}

/// A step between two reads that a unit test interleaves with deterministically (the hook
/// [`TEST_HOOK`] of the calling thread runs here); in any other build a no-op.
#[inline]
pub(crate) fn test_point(name: &str) {
    #[cfg(test)]
    TEST_HOOK.with(|h| {
        if let Some((n, f)) = h.borrow_mut().as_mut() {
            if *n == name {
                f();
            }
        }
    });
    #[cfg(not(test))]
    let _ = name;
}

/// A hook of [`TEST_HOOK`]: the point's name and what to run there.
#[cfg(test)]
pub(crate) type TestHook = Option<(&'static str, Box<dyn FnMut()>)>;

#[cfg(test)]
thread_local! {
    /// The calling thread's hook for [`test_point`].
    pub(crate) static TEST_HOOK: std::cell::RefCell<TestHook> =
        const { std::cell::RefCell::new(None) };
}

/// Die here with SIGKILL if `BLOBSNAP_CRASH_AT` names this point (and this is the N-th hit);
/// first hold here if `BLOBSNAP_HOLD_AT` names it.
pub fn point(name: &str) {
    debug_assert!(
        POINTS.contains(&name),
        "crash point {name:?} is not in POINTS"
    );
    hold(name);
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
