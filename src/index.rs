//! The snapshot index: one JSON document per store per commit that lists every file of the
//! snapshot and the blob holding its bytes (Samza's SnapshotIndex, reference §1.4 and §2.3,
//! plus a per-file `sha256` and a top-level `format-version`).
//!
//! Rules (DESIGN §6):
//! - The writer always writes every field (`null` for an absent previous index), entries
//!   sorted by name, so the bytes are deterministic: [`SnapshotIndex::to_bytes`]. The index's
//!   key contains the SHA-256 of those bytes ([`IndexMarker`]), so a marker pins every byte of
//!   the snapshot.
//! - Readers ignore unknown fields but refuse a `format-version` greater than
//!   [`FORMAT_VERSION`] (`InvalidInput`): an old reader never mis-restores a newer format.
//! - `sha256` is optional when parsing (Samza's indexes lack it); restore and verify refuse a
//!   file without one.
//! - A small file may travel **inline** (`inline-data`, base64, no blob): such an index is
//!   [`FORMAT_INLINE`] (2); one without inline files is written as [`FORMAT_V1`], Samza's
//!   shape. The decoded bytes must match the entry's size (checked at parse) and SHA-256
//!   (checked by the restore, as a downloaded blob's).
//! - Every name is validated before it can reach a filesystem ([`SnapshotIndex::from_slice`]):
//!   not empty, not `.` or `..`, no `/`, no NUL or other control character, unique within its directory (files and
//!   sub-directories share one namespace). An index over [`MAX_INDEX_BYTES`] is refused before
//!   parsing.
//! - `files-removed` / `sub-dirs-removed` are informational; unlike Samza, the same blob may be
//!   both present and removed (content identity: an OPTIONS file rewritten identically). A
//!   `files-removed` entry of a file that traveled inline carries no `inline-data` (its bytes
//!   are in the previous index): it names the file, its size and hashes, and no blob.
//!   Readers check only the names of `files-removed` entries, so every reader of formats 1–3
//!   accepts it.

use std::collections::HashSet;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::digest::Sha256;
use crate::error::{Error, Result};
use crate::id::CheckpointId;

/// The highest index format this build reads: 1 is Samza's shape plus `sha256`, 2 adds
/// `inline-data`, 3 adds `borrowed-from` (a fork's, DESIGN §6).
pub const FORMAT_VERSION: u32 = FORMAT_FORK;

/// Samza's shape (plus `sha256`): what blobsnap writes when no file of the snapshot travels
/// inline, readable by every reader of version 1.
pub const FORMAT_V1: u32 = 1;

/// The first format with `inline-data`: a small file's bytes in the index itself, no blob.
pub const FORMAT_INLINE: u32 = 2;

/// The first format with `borrowed-from`: a fork's index, whose blobs may live in the scope
/// of the job it was forked from. Written only by a fork; a plain job never writes it.
pub const FORMAT_FORK: u32 = 3;

/// The prefix of a borrowed blob's id: `borrowed/<alias>/blobs/<checkpoint-id>/<sha256>`, the
/// blob `blobs/<checkpoint-id>/<sha256>` of the store scope `borrowed-from[<alias>]` declares.
pub const BORROWED_PREFIX: &str = "borrowed/";

/// The largest index accepted, in bytes (checked before parsing).
pub const MAX_INDEX_BYTES: u64 = 64 << 20;

/// The index of one store's snapshot at one checkpoint.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotIndex {
    /// The format of this document (absent in Samza's indexes: read as 1).
    #[serde(default = "samza_format")]
    pub format_version: u32,
    /// When the index was built (informational).
    pub creation_time_millis: u64,
    /// Whose snapshot this is.
    pub snapshot_metadata: SnapshotMetadata,
    /// The root directory (its `dir-name` is `""`).
    pub dir_index: DirIndex,
    /// The committed index this one was diffed against (informational), or `null`.
    pub prev_snapshot_index_blob_id: Option<String>,
    /// A fork's: the store scopes of other jobs whose blobs it names, by alias (a blob id
    /// `borrowed/<alias>/blobs/…`), each with the savepoint there that keeps them (format 3).
    /// Not written when empty, so every other index keeps its shape.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub borrowed_from: std::collections::BTreeMap<String, BorrowedScope>,
}

/// A store scope of another job a fork's index borrows blobs from, and the savepoint of that
/// job that keeps them (the fork holds a pin on it: `layout::JobScope::fork_pin_key`).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct BorrowedScope {
    /// The source job's name.
    pub job_name: String,
    /// The source job's id.
    pub job_id: String,
    /// The source task.
    pub task_name: String,
    /// The source store.
    pub store_name: String,
    /// The source job's savepoint that keeps the blobs.
    pub savepoint: String,
}

impl FileBlob {
    /// `(alias, id in the source scope)` of a borrowed blob id; `None` for one of the index's
    /// own scope.
    pub fn borrowed(&self) -> Option<(&str, &str)> {
        let rest = self.blob_id.strip_prefix(BORROWED_PREFIX)?;
        rest.split_once('/')
    }
}

fn samza_format() -> u32 {
    1
}

/// Whose snapshot an index describes; checked against what is being restored.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct SnapshotMetadata {
    /// The commit this snapshot belongs to.
    pub checkpoint_id: CheckpointId,
    /// The job's name.
    pub job_name: String,
    /// The job's id.
    pub job_id: String,
    /// The task's name.
    pub task_name: String,
    /// The store's name.
    pub store_name: String,
}

/// One directory of a snapshot.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct DirIndex {
    /// The directory's name (`""` for the root).
    pub dir_name: String,
    /// Files in this directory in this snapshot.
    pub files_present: Vec<FileIndex>,
    /// Files of the previous snapshot that are gone or changed (informational; an inline
    /// one without its `inline-data`).
    pub files_removed: Vec<FileIndex>,
    /// Sub-directories in this snapshot.
    pub sub_dirs_present: Vec<DirIndex>,
    /// Sub-directories of the previous snapshot that are gone, with their full contents.
    pub sub_dirs_removed: Vec<DirIndex>,
}

/// One file and the blob(s) holding its bytes.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FileIndex {
    /// The file's name (a bare name, not a path).
    pub file_name: String,
    /// The blobs holding the file's bytes, concatenated in `offset` order (blobsnap writes
    /// exactly one).
    pub blobs: Vec<FileBlob>,
    /// POSIX attributes when the snapshot was taken.
    pub file_metadata: FileMetadata,
    /// CRC32 of the bytes (as Samza).
    pub checksum: u32,
    /// SHA-256 of the bytes: the file's identity. Absent only in Samza's indexes.
    #[serde(default)]
    pub sha256: Option<Sha256>,
    /// A small file's bytes, base64 (standard alphabet, padded), carried in the index itself
    /// instead of a blob (`blobs` is then empty; format-version 2). Not written when absent,
    /// so an index without inline files keeps Samza's shape.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub inline_data: Option<String>,
    /// How often the running task read this file: RocksDB's sampled read count, summed over
    /// every process that had the file open since it was made (the estimate of reads it
    /// carries from the index it was restored from, plus the reads sampled since). A lazy
    /// restore fetches the hottest files first. Optional and additive (no format change):
    /// not written for a file never read, absent in older indexes and Samza's, and ignored
    /// by their readers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub heat: Option<u64>,
}

impl FileIndex {
    /// The file's bytes when they travel inline: decoded and checked against the entry's size
    /// (`Corrupt` otherwise). `None` for a file held by blobs.
    pub fn inline_bytes(&self) -> Result<Option<Vec<u8>>> {
        use base64::Engine as _;
        let Some(text) = &self.inline_data else {
            return Ok(None);
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(text)
            .map_err(|e| {
                Error::corrupt(format!(
                    "index entry {}: inline-data is not base64: {e}",
                    self.file_name
                ))
            })?;
        if bytes.len() as u64 != self.file_metadata.size {
            return Err(Error::corrupt(format!(
                "index entry {}: inline-data holds {} bytes, the entry says {}",
                self.file_name,
                bytes.len(),
                self.file_metadata.size
            )));
        }
        Ok(Some(bytes))
    }

    /// [`inline_bytes`](Self::inline_bytes), also checked against the entry's SHA-256
    /// (`Corrupt` for another one, or for an inline entry without one).
    pub fn verified_inline_bytes(&self) -> Result<Option<Vec<u8>>> {
        let Some(bytes) = self.inline_bytes()? else {
            return Ok(None);
        };
        if self.sha256 != Some(Sha256::of(&bytes)) {
            return Err(Error::corrupt(format!(
                "index entry {}: its inline data does not have the entry's SHA-256",
                self.file_name
            )));
        }
        Ok(Some(bytes))
    }

    /// Encode `bytes` as this entry's inline data.
    pub fn encode_inline(bytes: &[u8]) -> String {
        use base64::Engine as _;
        base64::engine::general_purpose::STANDARD.encode(bytes)
    }
}

/// One blob of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FileBlob {
    /// The blob's key, relative to the store's scope (Samza: an opaque id).
    pub blob_id: String,
    /// Sort position among the file's blobs (a Java `int`: non-negative, < 2^31).
    pub offset: u32,
}

/// POSIX attributes of a file.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub struct FileMetadata {
    /// Creation time, ms (mtime where the filesystem has no birth time).
    pub creation_time_millis: u64,
    /// Modification time, ms.
    pub last_modified_time_millis: u64,
    /// Size in bytes.
    pub size: u64,
    /// Owner's user name.
    pub owner: String,
    /// Group name.
    pub group: String,
    /// `rwxr-x---`-style permission string.
    pub permissions: String,
}

impl FileMetadata {
    /// The permission bits (`0o640` for `rw-r-----`); `None` if the string is malformed.
    pub fn mode(&self) -> Option<u32> {
        let p = self.permissions.as_bytes();
        if p.len() != 9 {
            return None;
        }
        let mut mode = 0u32;
        for (i, &c) in p.iter().enumerate() {
            let expected = b"rwx"[i % 3];
            mode <<= 1;
            if c == expected {
                mode |= 1;
            } else if c != b'-' {
                return None;
            }
        }
        Some(mode)
    }

    /// The permission string for mode bits (the low 9 bits of `mode`).
    pub fn permissions_of(mode: u32) -> String {
        (0..9)
            .map(|i| {
                if mode & (1 << (8 - i)) != 0 {
                    char::from(b"rwx"[i % 3])
                } else {
                    '-'
                }
            })
            .collect()
    }
}

impl FileIndex {
    /// The file's size.
    pub fn size(&self) -> u64 {
        self.file_metadata.size
    }

    /// The id of the blob that holds the file (its first); `Corrupt` naming the file, as
    /// `path`, when the entry has none.
    pub fn first_blob_id(&self, path: &str) -> Result<&str> {
        self.blobs
            .first()
            .map(|b| b.blob_id.as_str())
            .ok_or_else(|| Error::corrupt(format!("index entry {path} has no blob")))
    }
}

/// Check one name read from an index: non-empty, not `.`/`..`, no `/` or NUL.
pub fn validate_name(name: &str) -> Result<()> {
    let why = if name.is_empty() {
        "is empty"
    } else if name == "." || name == ".." {
        "is a relative directory reference"
    } else if name.contains('/') {
        "contains '/'"
    } else if name.contains('\0') {
        "contains NUL"
    } else if name.chars().any(char::is_control) {
        // An ANSI escape or a newline, printed raw by `ls`, `inspect` and a restore plan,
        // and created as a name on disk.
        "contains a control character"
    } else {
        return Ok(());
    };
    Err(Error::corrupt(format!("index entry name {name:?} {why}")))
}

/// The name of the marker a complete restore leaves at the root of a store dir.
pub const RESTORED_MARKER: &str = "RESTORED";

/// Name of the file a lazy restore leaves at the root of a store dir while some of its files
/// are still only in the blob store (removed once every file is local): a dir holding it is
/// not a complete database (the lazy restore's `local::lazy`).
pub const LAZY_PENDING: &str = "LAZY-PENDING";

/// Name of the file a lazy restore leaves at the root of a store dir when a remote file's
/// blob turned out corrupt or missing at its fetch (one JSON line each: file, blob, kind, why):
/// the next restore of that dir downloads and verifies those files before the store opens,
/// so a bad blob fails the restore (where `restore-fallback` acts) instead of every start's
/// first read of it (issue 46, L4). Gone with the swap of the next restored tree.
pub const LAZY_FAILED: &str = "LAZY-FAILED";

/// Name of the file a checkpoint directory of an open store carries beside RocksDB's files:
/// the sampled read count of each table file (JSON, name → count), which the backup turns
/// into the index's `heat` ([`FileIndex::heat`]). Never a file of the snapshot.
pub const HEAT_FILE: &str = "BLOBSNAP-HEAT";

/// Names blobsnap itself uses inside a store dir, which no snapshot may list: the restore
/// markers at the root ([`RESTORED_MARKER`], [`LAZY_PENDING`], [`LAZY_FAILED`]) and a checkpoint's
/// [`HEAT_FILE`], and `.<name>.blobsnap-part` (a download in progress) anywhere. An index
/// listing one would have the restore overwrite or delete its own bookkeeping.
pub fn reserved_name(name: &str, root: bool) -> Result<()> {
    if root
        && (name == RESTORED_MARKER
            || name == LAZY_PENDING
            || name == LAZY_FAILED
            || name == HEAT_FILE)
    {
        return Err(Error::corrupt(format!(
            "index entry name {name:?} is reserved (blobsnap's restore markers and heat file)"
        )));
    }
    if name.starts_with('.') && name.ends_with(".blobsnap-part") {
        return Err(Error::corrupt(format!(
            "index entry name {name:?} is reserved (blobsnap's partial downloads)"
        )));
    }
    Ok(())
}

impl DirIndex {
    fn validate(&self, path: &str, root: bool) -> Result<()> {
        if root {
            if !self.dir_name.is_empty() {
                return Err(Error::corrupt(format!(
                    "index root dir-name must be \"\", found {:?}",
                    self.dir_name
                )));
            }
        } else {
            validate_name(&self.dir_name).map_err(|e| e.context(format!("in {path:?}")))?;
        }
        let here = if root {
            String::new()
        } else {
            format!("{path}{}/", self.dir_name)
        };
        let mut seen = HashSet::new();
        for f in &self.files_present {
            validate_name(&f.file_name).map_err(|e| e.context(format!("in {here:?}")))?;
            reserved_name(&f.file_name, root).map_err(|e| e.context(format!("in {here:?}")))?;
            if !seen.insert(f.file_name.as_str()) {
                return Err(Error::corrupt(format!(
                    "index lists {:?} twice in {here:?}",
                    f.file_name
                )));
            }
            validate_blobs(f, &here)?;
        }
        for d in &self.sub_dirs_present {
            d.validate(&here, false)?;
            if !seen.insert(d.dir_name.as_str()) {
                return Err(Error::corrupt(format!(
                    "index lists {:?} twice in {here:?}",
                    d.dir_name
                )));
            }
        }
        for f in &self.files_removed {
            validate_name(&f.file_name).map_err(|e| e.context(format!("in {here:?}")))?;
        }
        for d in &self.sub_dirs_removed {
            d.validate(&here, false)?;
        }
        Ok(())
    }

    fn sort(&mut self) {
        self.files_present
            .sort_by(|a, b| a.file_name.cmp(&b.file_name));
        self.files_removed
            .sort_by(|a, b| a.file_name.cmp(&b.file_name));
        self.sub_dirs_present
            .sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
        self.sub_dirs_removed
            .sort_by(|a, b| a.dir_name.cmp(&b.dir_name));
        for f in self
            .files_present
            .iter_mut()
            .chain(self.files_removed.iter_mut())
        {
            f.blobs.sort_by_key(|b| b.offset);
        }
        for d in self
            .sub_dirs_present
            .iter_mut()
            .chain(self.sub_dirs_removed.iter_mut())
        {
            d.sort();
        }
    }

    /// Every present file with its path relative to the root (`a/b/000012.sst`), depth first.
    pub fn present_files(&self) -> Vec<(String, &FileIndex)> {
        let mut out = Vec::new();
        self.collect_present("", &mut out);
        out
    }

    /// DESIGN §6: an entry without `sha256` (Samza's engine writes none) whose one blob has a
    /// content-addressed key, `blobs/<checkpoint-id>/<sha256>` (as the Java
    /// `S3BlobStoreManager` writes it), takes the SHA-256 in its key — pinned, through the
    /// index's hash, by the marker, and checked against the bytes when they are read. Any
    /// other entry keeps none (restore and verify refuse it).
    fn sha256_from_keys(&mut self) {
        for f in &mut self.files_present {
            if f.sha256.is_some() || f.inline_data.is_some() {
                continue;
            }
            if let [b] = f.blobs.as_slice() {
                f.sha256 = content_address(&b.blob_id);
            }
        }
        for d in &mut self.sub_dirs_present {
            d.sha256_from_keys();
        }
    }

    fn collect_present<'a>(&'a self, prefix: &str, out: &mut Vec<(String, &'a FileIndex)>) {
        for f in &self.files_present {
            out.push((format!("{prefix}{}", f.file_name), f));
        }
        for d in &self.sub_dirs_present {
            d.collect_present(&format!("{prefix}{}/", d.dir_name), out);
        }
    }
}

/// The SHA-256 a content-addressed blob key names: `blobs/<checkpoint-id>/<64 lowercase
/// hex>`, nothing else.
fn content_address(blob_id: &str) -> Option<Sha256> {
    let rest = blob_id.strip_prefix("blobs/")?;
    let (id, hex) = rest.split_once('/')?;
    let lower = hex.len() == 64 && hex.bytes().all(|c| matches!(c, b'0'..=b'9' | b'a'..=b'f'));
    if id.is_empty() || id.contains('/') || !lower {
        return None;
    }
    hex.parse().ok()
}

fn validate_blobs(f: &FileIndex, here: &str) -> Result<()> {
    if f.inline_data.is_some() {
        if !f.blobs.is_empty() {
            return Err(Error::corrupt(format!(
                "index entry {here}{} has both inline-data and blobs",
                f.file_name
            )));
        }
        f.inline_bytes()
            .map_err(|e| e.context(format!("in {here:?}")))?;
        return Ok(());
    }
    if f.blobs.is_empty() && f.file_metadata.size > 0 {
        return Err(Error::corrupt(format!(
            "index entry {here}{} has {} bytes but no blob",
            f.file_name, f.file_metadata.size
        )));
    }
    let mut offsets = HashSet::new();
    for b in &f.blobs {
        if b.blob_id.trim().is_empty() {
            return Err(Error::corrupt(format!(
                "index entry {here}{} has a blank blob id",
                f.file_name
            )));
        }
        if b.offset > i32::MAX as u32 {
            return Err(Error::corrupt(format!(
                "index entry {here}{}: blob offset {} exceeds a Java int",
                f.file_name, b.offset
            )));
        }
        if !offsets.insert(b.offset) {
            return Err(Error::corrupt(format!(
                "index entry {here}{}: two blobs at offset {}",
                f.file_name, b.offset
            )));
        }
    }
    Ok(())
}

impl SnapshotIndex {
    /// Parse and validate an index: size cap first, then JSON, then format version, then every
    /// name and blob entry. The error names the offending entry.
    pub fn from_slice(bytes: &[u8]) -> Result<Self> {
        if bytes.len() as u64 > MAX_INDEX_BYTES {
            return Err(Error::corrupt(format!(
                "index is {} bytes, over the {MAX_INDEX_BYTES}-byte cap",
                bytes.len()
            )));
        }
        // Check the version before the full parse, so a newer format with a changed shape is
        // reported as "too new", not as malformed.
        #[derive(Deserialize)]
        struct Version {
            #[serde(rename = "format-version", default = "samza_format")]
            v: u32,
        }
        if let Ok(Version { v }) = serde_json::from_slice::<Version>(bytes) {
            if v > FORMAT_VERSION {
                return Err(Error::invalid(format!(
                    "index format-version {v} is newer than this build reads ({FORMAT_VERSION}); upgrade blobsnap"
                )));
            }
        }
        let index: SnapshotIndex = serde_json::from_slice(bytes)
            .map_err(|e| Error::corrupt(format!("index is not a valid snapshot index: {e}")))?;
        index.validate()?;
        Ok(index)
    }

    /// Check format version, names and blob entries.
    pub fn validate(&self) -> Result<()> {
        if self.format_version > FORMAT_VERSION {
            return Err(Error::invalid(format!(
                "index format-version {} is newer than this build reads ({FORMAT_VERSION})",
                self.format_version
            )));
        }
        let m = &self.snapshot_metadata;
        for (field, v) in [
            ("job-name", &m.job_name),
            ("job-id", &m.job_id),
            ("task-name", &m.task_name),
            ("store-name", &m.store_name),
        ] {
            if v.trim().is_empty() {
                return Err(Error::corrupt(format!(
                    "index snapshot-metadata {field} is blank"
                )));
            }
        }
        if let Some(prev) = &self.prev_snapshot_index_blob_id {
            if prev.trim().is_empty() {
                return Err(Error::corrupt("index prev-snapshot-index-blob-id is blank"));
            }
        }
        self.dir_index.validate("", true)?;
        if !self.borrowed_from.is_empty() && self.format_version < FORMAT_FORK {
            return Err(Error::corrupt(format!(
                "index declares borrowed-from in a format-version {} index (borrowing needs {FORMAT_FORK})",
                self.format_version
            )));
        }
        for (alias, b) in &self.borrowed_from {
            if alias.is_empty() || alias.len() > 9 || !alias.bytes().all(|c| c.is_ascii_digit()) {
                return Err(Error::corrupt(format!(
                    "index borrowed-from alias {alias:?} is not a number"
                )));
            }
            for (field, v) in [
                ("job-name", &b.job_name),
                ("job-id", &b.job_id),
                ("task-name", &b.task_name),
                ("store-name", &b.store_name),
                ("savepoint", &b.savepoint),
            ] {
                if v.trim().is_empty() {
                    return Err(Error::corrupt(format!(
                        "index borrowed-from[{alias}] {field} is blank"
                    )));
                }
            }
        }
        for (path, f) in self.present_files() {
            for b in &f.blobs {
                if b.blob_id.starts_with(BORROWED_PREFIX) {
                    let declared = b
                        .borrowed()
                        .is_some_and(|(alias, _)| self.borrowed_from.contains_key(alias));
                    if !declared {
                        return Err(Error::corrupt(format!(
                            "index entry {path}: blob {:?} borrows from a scope the index does not declare",
                            b.blob_id
                        )));
                    }
                }
            }
        }
        if self.format_version < FORMAT_INLINE {
            if let Some((path, _)) = self
                .present_files()
                .into_iter()
                .find(|(_, f)| f.inline_data.is_some())
            {
                return Err(Error::corrupt(format!(
                    "index entry {path} has inline-data in a format-version {} index (inline data needs {FORMAT_INLINE})",
                    self.format_version
                )));
            }
        }
        // Sizes: a file holds at most off_t's 2^63 - 1 bytes, and the snapshot's total must be
        // a number (a hostile index must be reported as corrupt, not as a disk too small).
        let mut total: u64 = 0;
        for (path, f) in self.present_files() {
            let size = f.file_metadata.size;
            if size > i64::MAX as u64 {
                return Err(Error::corrupt(format!(
                    "index entry {path} claims {size} bytes, more than a file can hold"
                )));
            }
            total = total.checked_add(size).ok_or_else(|| {
                Error::corrupt(format!(
                    "index file sizes add up past 2^64 bytes (at {path})"
                ))
            })?;
        }
        Ok(())
    }

    /// The canonical bytes: compact JSON, every field written, entries sorted by name. Write
    /// these bytes once and reuse them on retries.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut sorted = self.clone();
        sorted.dir_index.sort();
        serde_json::to_vec(&sorted).map_err(|e| Error::invalid(format!("serialize index: {e}")))
    }

    /// Every present file with its relative path.
    pub fn present_files(&self) -> Vec<(String, &FileIndex)> {
        self.dir_index.present_files()
    }

    /// Give each entry of Samza's shape without `sha256` the one its content-addressed blob
    /// key names (DESIGN §6; [`DirIndex`]'s rule). Done by every reader of an index
    /// ([`crate::blob::load_snapshot`]), never written back.
    pub fn sha256_from_keys(&mut self) {
        self.dir_index.sha256_from_keys();
    }
}

/// The marker of a store in a CheckpointV2: the scope-relative key of its index,
/// `index/<checkpoint-id>.<sha256 of the index bytes>.json` (DESIGN §5).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IndexMarker {
    /// The checkpoint the index belongs to.
    pub checkpoint_id: CheckpointId,
    /// SHA-256 of the index's exact bytes.
    pub sha256: Sha256,
}

impl IndexMarker {
    /// The marker of an index's bytes.
    pub fn of(checkpoint_id: CheckpointId, index_bytes: &[u8]) -> Self {
        IndexMarker {
            checkpoint_id,
            sha256: Sha256::of(index_bytes),
        }
    }
}

impl fmt::Display for IndexMarker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "index/{}.{}.json", self.checkpoint_id, self.sha256)
    }
}

impl FromStr for IndexMarker {
    type Err = Error;

    /// Parse `index/<checkpoint-id>.<sha256>.json`, from the right (checkpoint ids contain
    /// `-`). Anything else is `InvalidInput`, naming the marker.
    fn from_str(s: &str) -> Result<Self> {
        let bad =
            |why: &str| Error::invalid(format!("marker {s:?} is not a blobsnap index key: {why}"));
        let rest = s
            .strip_prefix("index/")
            .ok_or_else(|| bad("it must start with \"index/\""))?;
        let rest = rest
            .strip_suffix(".json")
            .ok_or_else(|| bad("it must end with \".json\""))?;
        let (id, sha) = rest
            .rsplit_once('.')
            .ok_or_else(|| bad("no '.' between checkpoint id and SHA-256"))?;
        let sha256 = sha.parse::<Sha256>().map_err(|e| bad(e.message()))?;
        let checkpoint_id = id.parse::<CheckpointId>().map_err(|e| bad(e.message()))?;
        Ok(IndexMarker {
            checkpoint_id,
            sha256,
        })
    }
}

mod compare;
mod origin;
pub use compare::*;
pub use origin::*;

#[cfg(test)]
pub(crate) mod tests;
