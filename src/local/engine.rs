//! A store as the runtime sees it: the handle of an open store ([`StoreEngine`]: only its
//! owner can checkpoint it), and the dirs beside a store dir ([`sibling_of`]: its
//! checkpoints, hash cache and lock). Re-exported by the SPI module, `backend`.

use std::path::{Path, PathBuf};

use crate::error::Result;

/// The handle of one open store. Only the owner of an open RocksDB can checkpoint it (it holds
/// the DB's LOCK), so the engine, not a path, is what the commit manager is given.
pub trait StoreEngine: Send + Sync {
    /// The store's name.
    fn name(&self) -> &str;
    /// The live store directory.
    fn dir(&self) -> &Path;
    /// Flush buffered writes to disk.
    fn flush(&self) -> Result<()>;
    /// Create a checkpoint of the store at `path` (which must not exist): immutable files
    /// hard-linked, the rest copied.
    fn checkpoint_to(&self, path: &Path) -> Result<()>;
    /// A value that differs whenever the store's content or files may have changed since it
    /// was read (RocksDB: the last sequence number, which every write moves, and the
    /// super-version number, which every flush, compaction and options change moves), or
    /// `None` if the engine cannot tell. The commit manager hands the backends the last
    /// checkpoint directory again, instead of flushing and making a new one, for a store whose
    /// token is the one it had when that checkpoint was made.
    fn change_token(&self) -> Option<(u64, u64)> {
        None
    }
}

/// `dir` with `suffix` appended to its last component: a sibling in the same parent, also for
/// a dir written with a trailing `/` (`a/db/` → `a/db.checkpoints`). A path without a last
/// name (`/`, `..`) gets the suffix appended as it is.
pub fn sibling_of(dir: &Path, suffix: &str) -> PathBuf {
    match dir.file_name() {
        Some(name) if !dir.ends_with("..") => {
            let mut n = name.to_os_string();
            n.push(suffix);
            dir.with_file_name(n)
        }
        _ => {
            let mut base = dir.as_os_str().to_owned();
            base.push(suffix);
            PathBuf::from(base)
        }
    }
}
