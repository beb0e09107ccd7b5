//! [`StoreEngine`] for RocksDB (rust-rocksdb, bundled RocksDB 11).
//!
//! A checkpoint hard-links the SST and blob files and OPTIONS, copies MANIFEST and CURRENT,
//! and — rust-rocksdb always passes `log_size_for_flush = 0` — flushes the memtable first, so
//! the sync step costs a memtable flush plus O(files) links, never O(bytes on disk).

use std::path::{Path, PathBuf};

use crate::backend::StoreEngine;
use crate::error::{Error, ErrorKind, Result};

/// An open RocksDB store.
pub struct RocksStore {
    name: String,
    dir: PathBuf,
    db: rocksdb::DB,
}

impl std::fmt::Debug for RocksStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "RocksStore({} at {})", self.name, self.dir.display())
    }
}

fn rocks_err(what: String, e: rocksdb::Error) -> Error {
    let msg = e.to_string();
    let kind = if msg.contains("lock") || msg.contains("LOCK") {
        ErrorKind::Conflict
    } else if msg.contains("Corruption") {
        ErrorKind::Corrupt
    } else {
        ErrorKind::Io
    };
    Error::new(kind, format!("{what}: {msg}"))
}

impl RocksStore {
    /// Open (creating if missing) the store `name` at `dir` with default options.
    pub fn open(name: &str, dir: &Path) -> Result<Self> {
        let mut opts = rocksdb::Options::default();
        opts.create_if_missing(true);
        Self::open_with(name, dir, &opts)
    }

    /// Open with explicit RocksDB options.
    pub fn open_with(name: &str, dir: &Path, opts: &rocksdb::Options) -> Result<Self> {
        let db = rocksdb::DB::open(opts, dir)
            .map_err(|e| rocks_err(format!("open RocksDB store {name} at {}", dir.display()), e))?;
        Ok(RocksStore {
            name: name.to_string(),
            dir: dir.to_path_buf(),
            db,
        })
    }

    /// The database.
    pub fn db(&self) -> &rocksdb::DB {
        &self.db
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
            .map_err(|e| rocks_err(format!("flush store {}", self.name), e))
    }

    fn checkpoint_to(&self, path: &Path) -> Result<()> {
        if let Some(parent) = path.parent() {
            std::fs::create_dir_all(parent)
                .map_err(|e| Error::io(format!("create {}", parent.display()), e))?;
        }
        let cp = rocksdb::checkpoint::Checkpoint::new(&self.db)
            .map_err(|e| rocks_err(format!("checkpoint store {}", self.name), e))?;
        cp.create_checkpoint(path).map_err(|e| {
            rocks_err(
                format!("checkpoint store {} into {}", self.name, path.display()),
                e,
            )
        })
    }
}
