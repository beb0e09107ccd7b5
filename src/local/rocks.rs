//! [`StoreEngine`] for RocksDB (rust-rocksdb, bundled RocksDB 11).
//!
//! A checkpoint hard-links the SST and blob files and OPTIONS, copies MANIFEST and CURRENT,
//! and — rust-rocksdb always passes `log_size_for_flush = 0` — flushes the memtable first, so
//! the sync step costs a memtable flush plus O(files) links, never O(bytes on disk).

use std::path::{Path, PathBuf};

use super::engine::StoreEngine;
use crate::error::{Error, ErrorKind, Result};

/// An open RocksDB store.
pub struct RocksStore {
    name: String,
    dir: PathBuf,
    db: rocksdb::DB,
    /// Opened on the lazy file system (files of a lazy restore still remote).
    lazy: bool,
    /// The lazy open's limits (table cache) were lifted (every file is local), or never set
    /// (options that need every table file open).
    lifted: std::sync::atomic::AtomicBool,
    /// A lazy DB's share of the process's thread pools (dropped after `db`: declared after).
    _pools: Option<crate::local::lazy::PoolShare>,
    /// Where its file events go ([`crate::local::events`]; dropped after `db`).
    _events: crate::local::events::Registration,
    /// The caller's options of a lazy open (dropped after `db`): they keep alive what
    /// RocksDB uses by pointer (a custom comparator, compaction filter or callback logger).
    /// The options the lazy open derives with `get_options_from_string` do not carry them
    /// (rust-rocksdb leaves the derived options' keep-alive list empty; issue 46, L3).
    _options: Option<rocksdb::Options>,
}

impl Drop for RocksStore {
    fn drop(&mut self) {
        if self.lazy {
            // The background download of what is still remote stops with the store.
            crate::local::lazy::close(&self.dir);
        }
    }
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocksStore({} at {})", self.name, self.dir.display())
    }
}

fn rocks_err(what: String, e: rocksdb::Error) -> Error {
    rocks_error(what, &e)
}

/// A RocksDB error as the crate's error, classified ([`classify`]).
pub(crate) fn rocks_error(what: impl Into<String>, e: &rocksdb::Error) -> Error {
    let msg = e.to_string();
    Error::new(classify(&msg), format!("{}: {msg}", what.into()))
}

/// The kind of a RocksDB error message. A lazy restore's failed fetch carries its own kind
/// (`blobsnap lazy restore: <path>: [corrupt] …`, `local::lazy::ffi`): a corrupt or missing
/// blob stays `Corrupt` / `NotFound` through RocksDB, so the task's next start can fall back.
/// Then corruption: its messages may contain "lock" ("block checksum mismatch"); a held lock
/// is RocksDB's "While lock file: <dir>/LOCK: ...".
pub(crate) fn classify(msg: &str) -> ErrorKind {
    if let Some(i) = msg.find("blobsnap lazy restore: ") {
        let tail = &msg[i..];
        for kind in [
            ErrorKind::Corrupt,
            ErrorKind::NotFound,
            ErrorKind::Transient,
            ErrorKind::Permanent,
            ErrorKind::InvalidInput,
            ErrorKind::Cancelled,
        ] {
            if tail.contains(&format!("[{kind}] ")) {
                return kind;
            }
        }
    }
    if msg.contains("Corruption") {
        ErrorKind::Corrupt
    } else if msg.contains("While lock file") || msg.contains("/LOCK:") {
        ErrorKind::Conflict
    } else {
        ErrorKind::Io
    }
}

/// RocksDB's own lock on a closed database, held by this process: while it lives, no RocksDB
/// (of any version, in any process) can open the database. RocksDB locks its `LOCK` file with
/// a POSIX record lock (`fcntl(F_SETLK)`, whole file, write): this takes the same lock, so
/// either side sees the other. Taking it writes nothing (the `LOCK` file must exist).
#[derive(Debug)]
pub struct ClosedDb {
    dir: PathBuf,
    _lock: std::fs::File,
}

impl ClosedDb {
    /// Lock the closed database at `dir`. A database open in a running process → `Conflict`;
    /// no `LOCK` file → `InvalidInput` (not a live database dir: a checkpoint has none).
    pub fn lock(dir: &Path) -> Result<ClosedDb> {
        let path = dir.join("LOCK");
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(&path)
            .map_err(|e| match e.kind() {
                std::io::ErrorKind::NotFound => Error::invalid(format!(
                    "{}: no LOCK file: not a RocksDB database dir",
                    dir.display()
                )),
                _ => Error::io(format!("open {}", path.display()), e),
            })?;
        rustix::fs::fcntl_lock(&file, rustix::fs::FlockOperation::NonBlockingLockExclusive)
            .map_err(|e| {
                if e == rustix::io::Errno::AGAIN || e == rustix::io::Errno::ACCESS {
                    Error::new(
                        ErrorKind::Conflict,
                        format!(
                            "{} is locked by a running process (its RocksDB holds {}): stop it, or back up one of its checkpoint dirs",
                            dir.display(),
                            path.display()
                        ),
                    )
                } else {
                    Error::io(format!("lock {}", path.display()), e.into())
                }
            })?;
        Ok(ClosedDb {
            dir: dir.to_path_buf(),
            _lock: file,
        })
    }

    /// The database's live files, as RocksDB would open them: `CURRENT`, the MANIFEST it
    /// names, `IDENTITY`, the `OPTIONS-*` files, and every table (`*.sst`), blob (`*.blob`)
    /// and write-ahead log (`*.log`: it replays on open). Not `LOCK`, not the info logs
    /// (`LOG`, `LOG.old.*`), not an obsolete MANIFEST, nothing else, no sub-directory.
    /// A dir a lazy restore left incomplete is refused (its MANIFEST names absent files).
    pub fn live_files(&self) -> Result<std::collections::BTreeSet<String>> {
        crate::local::lazy::check_complete(&self.dir)?;
        let current = self.dir.join("CURRENT");
        let text = std::fs::read_to_string(&current)
            .map_err(|e| Error::io(format!("read {}", current.display()), e))?;
        let manifest = text
            .strip_suffix('\n')
            .filter(|m| {
                m.strip_prefix("MANIFEST-")
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            })
            .ok_or_else(|| {
                Error::new(
                    ErrorKind::Corrupt,
                    format!("{}: {text:?} does not name a MANIFEST", current.display()),
                )
            })?;
        let mut out = std::collections::BTreeSet::new();
        let entries = std::fs::read_dir(&self.dir)
            .map_err(|e| Error::io(format!("list {}", self.dir.display()), e))?;
        for entry in entries {
            let entry = entry.map_err(|e| Error::io(format!("list {}", self.dir.display()), e))?;
            let is_file = entry
                .file_type()
                .map_err(|e| Error::io(format!("stat {}", entry.path().display()), e))?
                .is_file();
            let Some(name) = entry.file_name().to_str().map(str::to_string) else {
                continue;
            };
            if !is_file {
                continue;
            }
            let numbered = |suffix: &str| {
                name.strip_suffix(suffix)
                    .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            };
            let live = name == "CURRENT"
                || name == "IDENTITY"
                || name == manifest
                || name.starts_with("OPTIONS-")
                || numbered(".sst")
                || numbered(".blob")
                || numbered(".log");
            if live {
                out.insert(name);
            }
        }
        if !out.contains(manifest) {
            return Err(Error::new(
                ErrorKind::Corrupt,
                format!(
                    "{}: CURRENT names {manifest}, which is missing",
                    self.dir.display()
                ),
            ));
        }
        Ok(out)
    }
}

/// The MANIFEST size at which a store opened by [`RocksStore::open`] starts a new one
/// (RocksDB's `max_manifest_file_size`; its default is 1 GiB).
///
/// A snapshot holds the MANIFEST whole, and the MANIFEST changes at every commit (the
/// checkpoint's flush appends to it), so each commit stores a new copy of it: inline in the
/// index below the backup's inline bound (`blob::backup::INLINE_BELOW`), a blob of its own above.
/// With RocksDB's default it only grows — about 200 bytes a flush, 10.7 MB after 59,000
/// commits at one a second, re-uploaded at every commit and stored once per retained
/// point (RESULTS.md §6). Rolled at 4 KiB it stays inline and ~2–4 KB in a small store's
/// index (at 16 KiB a day of one commit a second kept 1.4 % of its data as metadata, 0.39 %
/// at 4 KiB); the cost is a compacted MANIFEST of a few KB written every ~10 flushes.
/// RocksDB raises the effective bound with the store to [`MANIFEST_SPACE_AMP_PCT`]'s share
/// over its compacted size, so a store of many files does not start one at every flush.
pub const MAX_MANIFEST_FILE_SIZE: usize = 4 << 10;

/// RocksDB's `max_manifest_space_amp_pct` for a store opened by [`RocksStore::open`]: a new
/// MANIFEST once the current one is twice its compacted size (RocksDB's default, 500, waits
/// for six times: a store whose compacted MANIFEST is 1 MB would carry up to 6 MB into
/// every snapshot, against 2 MB; the cost is one compacted MANIFEST written per its own
/// size of edits, RocksDB's "about 1.0 write amp" on a file of a few KB to MBs).
pub const MANIFEST_SPACE_AMP_PCT: u32 = 100;

impl RocksStore {
    /// Open (creating if missing) the store `name` at `dir` with default options, but a
    /// MANIFEST rolled at [`MAX_MANIFEST_FILE_SIZE`] and [`MANIFEST_SPACE_AMP_PCT`].
    pub fn open(name: &str, dir: &Path) -> Result<Self> {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        opts.set_max_manifest_file_size(MAX_MANIFEST_FILE_SIZE);
        let opts = opts
            .get_options_from_string(format!(
                "max_manifest_space_amp_pct={MANIFEST_SPACE_AMP_PCT}"
            ))
            .map_err(|e| rocks_err(format!("RocksDB options of store {name}"), e))?;
        Self::open_with(name, dir, &opts)
    }

    /// Open with explicit RocksDB options (set `max_manifest_file_size`, as
    /// [`open`](Self::open) does with [`MAX_MANIFEST_FILE_SIZE`]: RocksDB's default lets the
    /// MANIFEST every snapshot holds grow to 1 GiB). A store whose lazy restore still has remote
    /// files ([`crate::local::lazy`]) opens on the lazy file system, with at most
    /// [`LAZY_MAX_OPEN_FILES`](crate::local::lazy::LAZY_MAX_OPEN_FILES) files open and no
    /// statistics loaded from every file at open (both would fetch every SST first). Options
    /// that need every table file open (FIFO compaction with a TTL) open it unbounded: the
    /// open then waits for every remote table file (a warning says so).
    pub fn open_with(name: &str, dir: &Path, opts: &rocksdb::Options) -> Result<Self> {
        use crate::local::lazy;
        let what = || format!("open RocksDB store {name} at {}", dir.display());
        lazy::check_complete(dir).map_err(|e| e.context(what()))?;
        let lazy = lazy::is_lazy(dir);
        if lazy {
            lazy::refuse_current_thread().map_err(|e| e.context(what()))?;
        }
        let pools = lazy.then(lazy::PoolShare::take);
        // Every finished and deleted table or blob file is reported (the pre-upload's source).
        let events = crate::local::events::register(dir);
        let mut opts = opts.clone();
        if !lazy::add_file_listener(&mut opts, events.token()) {
            tracing::warn!(
                store = name,
                "RocksDB refused the file-event listener: no file of this store is pre-uploaded"
            );
        }
        let opts = &opts;
        let mut lifted = false;
        let mut kept = None;
        let db = if lazy {
            let mut base = opts.clone();
            let mut opts = base
                .get_options_from_string(lazy::ENV_OPTION)
                .map_err(|e| rocks_err(format!("{} (lazy file system)", what()), e))?;
            opts.set_max_open_files(lazy::LAZY_MAX_OPEN_FILES);
            opts.set_skip_stats_update_on_db_open(true);
            opts.set_max_background_jobs(lazy::LAZY_MAX_BACKGROUND_JOBS);
            kept = Some(base);
            let abs = lazy::absolute(dir)?;
            match rocksdb::DB::open(&opts, &abs) {
                // Options that need every table file open (FIFO compaction with a TTL, which
                // RocksDB refuses with a bounded table cache): the store still opens on the
                // lazy file system, unbounded, and the open waits for every table file.
                Err(e) if e.to_string().contains("max_open_files = -1") => {
                    tracing::warn!(
                        store = name,
                        dir = %dir.display(),
                        reason = %e,
                        "the store's options need every table file open: this lazy open waits until every remote table file is fetched"
                    );
                    opts.set_max_open_files(-1);
                    lifted = true;
                    rocksdb::DB::open(&opts, &abs)
                }
                other => other,
            }
        } else {
            rocksdb::DB::open(opts, dir)
        }
        .map_err(|e| rocks_err(what(), e))?;
        Ok(RocksStore {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            db,
            lazy,
            lifted: std::sync::atomic::AtomicBool::new(lifted),
            _pools: pools,
            _events: events,
            _options: kept,
        })
    }

    /// Once a lazily opened store has every file local, lift the table-cache bound the lazy
    /// open set ([`LAZY_MAX_OPEN_FILES`](crate::local::lazy::LAZY_MAX_OPEN_FILES)) back to
    /// RocksDB's default, unbounded (`SetDBOptions("max_open_files" = -1)`, applied to the
    /// open DB's table cache and persisted in its OPTIONS file). Cheap to call often: a
    /// registry lookup until it lifts once, then nothing. Returns whether it lifted now.
    pub fn lift_lazy_limits(&self) -> Result<bool> {
        use std::sync::atomic::Ordering;
        if !self.lazy || self.lifted.load(Ordering::Acquire) {
            return Ok(false);
        }
        if crate::local::lazy::status(&self.dir).is_some_and(|s| s.files_remote > 0) {
            return Ok(false);
        }
        if crate::local::lazy::check_complete(&self.dir).is_err() {
            return Ok(false);
        }
        crate::local::lazy::set_db_options(&self.db, &[("max_open_files", "-1")]).map_err(|e| {
            Error::new(
                ErrorKind::Io,
                format!("lift the table-cache bound of store {}: {e}", self.name),
            )
        })?;
        self.lifted.store(true, Ordering::Release);
        tracing::info!(store = %self.name, dir = %self.dir.display(), "lazy restore complete: table-cache bound lifted (max_open_files = -1)");
        Ok(true)
    }

    /// The bytes of SST and blob files RocksDB's SstFileManager accounts for in this
    /// database (what its space limits and compaction reservations see). On a lazily
    /// restored store the remote files count from the open on: RocksDB tracks every file its
    /// MANIFEST names, at the MANIFEST's size, whether or not it is on disk yet.
    pub fn tracked_file_bytes(&self) -> u64 {
        crate::local::lazy::tracked_bytes(&self.db)
    }

    /// The database.
    pub fn db(&self) -> &rocksdb::DB {
        &self.db
    }
}

impl RocksStore {
    /// Beside a checkpoint's files, the sampled read count of each of its table files since
    /// the DB was opened ([`crate::index::HEAT_FILE`], JSON name → count; files never read
    /// are left out, and no file is written if none was read): the backup records it as the
    /// index's heat.
    fn write_heat(&self, path: &Path) -> Result<()> {
        let reads: std::collections::BTreeMap<String, u64> =
            crate::local::lazy::file_reads(&self.db)
                .into_iter()
                .filter(|(_, n)| *n > 0)
                .collect();
        if reads.is_empty() {
            return Ok(());
        }
        let file = path.join(crate::index::HEAT_FILE);
        let bytes = serde_json::to_vec(&reads)
            .map_err(|e| Error::invalid(format!("encode {}: {e}", file.display())))?;
        std::fs::write(&file, bytes).map_err(|e| Error::io(format!("write {}", file.display()), e))
    }
}

impl StoreEngine for RocksStore {
    fn name(&self) -> &str {
        &self.name
    }

    fn dir(&self) -> &Path {
        &self.dir
    }

    fn flush(&self) -> Result<()> {
        self.db
            .flush()
            .map_err(|e| rocks_err("RocksDB flush".into(), e))
    }

    fn checkpoint_to(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
        }
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db)
            .map_err(|e| rocks_err("RocksDB checkpoint".into(), e))?;
        cp.create_checkpoint(path)
            .map_err(|e| rocks_err(format!("RocksDB checkpoint into {}", path.display()), e))?;
        self.write_heat(path)
    }

    fn change_token(&self) -> Option<(u64, u64)> {
        let version = self
            .db
            .property_int_value("rocksdb.current-super-version-number")
            .ok()
            .flatten()?;
        Some((self.db.latest_sequence_number(), version))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn corruption_is_not_a_lock() {
        // "block" contains "lock": corruption used to be reported as a held lock (exit 6).
        assert_eq!(
            classify("Corruption: block checksum mismatch: stored = 1, computed = 2"),
            ErrorKind::Corrupt
        );
        assert_eq!(
            classify("IO error: While lock file: /db/LOCK: Resource temporarily unavailable"),
            ErrorKind::Conflict
        );
        assert_eq!(classify("IO error: No space left on device"), ErrorKind::Io);
    }

    #[test]
    fn the_manifest_is_rolled_so_a_snapshot_does_not_carry_its_whole_history() {
        // Each flush appends to the MANIFEST: 1,000 of them grow RocksDB's default one to
        // ~200 KB; rolled, it stays near MAX_MANIFEST_FILE_SIZE (a few KB here).
        let dir = tempfile::tempdir().unwrap();
        let db = RocksStore::open("s", dir.path()).unwrap();
        for i in 0..1_000u32 {
            // Overlapping keys: compactions merge the files (non-overlapping ones would be
            // moved down whole, 1,000 live files that a compacted MANIFEST lists).
            db.db()
                .put((i % 10).to_le_bytes(), i.to_le_bytes())
                .unwrap();
            db.db().flush().unwrap();
        }
        let mut manifests = Vec::new();
        for e in std::fs::read_dir(dir.path()).unwrap() {
            let e = e.unwrap();
            let name = e.file_name().to_string_lossy().into_owned();
            if name.starts_with("MANIFEST-") {
                manifests.push((name, e.metadata().unwrap().len()));
            }
        }
        assert_eq!(manifests.len(), 1, "{manifests:?}");
        // RocksDB may raise the bound to twice the compacted size.
        let (name, len) = &manifests[0];
        assert!(
            *len <= 2 * MAX_MANIFEST_FILE_SIZE as u64,
            "{name} is {len} bytes after 1,000 flushes"
        );
        assert_ne!(name, "MANIFEST-000005", "never rolled");
    }

    #[test]
    fn a_corrupt_database_opens_as_corrupt() {
        let dir = tempfile::tempdir().unwrap();
        drop(RocksStore::open("s", dir.path()).unwrap());
        std::fs::write(dir.path().join("CURRENT"), b"MANIFEST-000099").unwrap();
        let e = RocksStore::open("s", dir.path()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
    }

    #[test]
    fn a_closed_db_is_locked_against_rocksdb_and_lists_its_live_files() {
        let dir = tempfile::tempdir().unwrap();
        {
            let db = RocksStore::open("s", dir.path()).unwrap();
            db.db().put(b"k", b"v").unwrap();
        }
        std::fs::write(dir.path().join("notes.txt"), b"not RocksDB's").unwrap();
        let closed = ClosedDb::lock(dir.path()).unwrap();
        let live = closed.live_files().unwrap();
        assert!(
            live.contains("CURRENT") && live.contains("IDENTITY"),
            "{live:?}"
        );
        assert!(live.iter().any(|n| n.starts_with("MANIFEST-")), "{live:?}");
        assert!(live.iter().any(|n| n.ends_with(".log")), "{live:?}");
        for n in ["LOCK", "LOG", "notes.txt"] {
            assert!(!live.contains(n), "{n} in {live:?}");
        }
        // The record-lock conflict with a RocksDB of another process is checked through the
        // CLI (tests/it/cli.rs) and against RocksDB 7.8's ldb (tests/it/interop.rs).
        drop(closed);
        assert!(ClosedDb::lock(dir.path()).is_ok());
    }
}
