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
//! the old tree is deleted).

use std::sync::OnceLock;

fn target() -> Option<&'static str> {
    static TARGET: OnceLock<Option<String>> = OnceLock::new();
    TARGET
        .get_or_init(|| {
            std::env::var("BLOBSNAP_CRASH_AT")
                .ok()
                .filter(|s| !s.is_empty())
        })
        .as_deref()
}

/// Die here with SIGKILL if `BLOBSNAP_CRASH_AT` names this point.
pub fn point(name: &str) {
    if target() == Some(name) {
        eprintln!("blobsnap: crash point {name} reached: killing this process (BLOBSNAP_CRASH_AT)");
        let _ =
            rustix::process::kill_process(rustix::process::getpid(), rustix::process::Signal::KILL);
        std::process::abort();
    }
}
