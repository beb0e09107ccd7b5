//! The index a commit writes: the diff of the checkpoint dir against the committed index,
//! the heat of each table, which files travel inline (and which retained inline files become
//! shared blobs), which blobs to PUT, the dir index itself.
//!
//! The diff ([`diff`]): the local tree vs the previous [`DirIndex`] — which files are added,
//! retained and removed, recursively (Samza's DirDiff, reference §1.5), by content identity.
//! A file is *retained* when the previous index has a file of the same name, size and
//! SHA-256 (its blob is reused, its POSIX attributes are taken from disk now); otherwise it is
//! *added*, and a previous file of that name is *removed* (a MANIFEST or OPTIONS rewritten with
//! new content is removed + added). A previous entry without a SHA-256 (Samza's) is never
//! retained. Pure: no I/O, unit- and property-tested.

use super::*;

/// The heat of each file at the root of a snapshot (where RocksDB's table files are).
pub(super) fn heat_of(root: &DirIndex) -> HashMap<String, u64> {
    root.files_present
        .iter()
        .filter_map(|f| Some((f.file_name.clone(), f.heat?)))
        .collect()
}

/// The reads a checkpoint directory's [`crate::index::HEAT_FILE`] sampled, by file name:
/// none when it has none (a directory the caller made, or a store nobody read). An
/// unreadable one costs the heat of this snapshot, never the backup (a warning).
pub(super) async fn read_heat(dir: &Path) -> HashMap<String, u64> {
    let path = dir.join(crate::index::HEAT_FILE);
    let parsed = match tokio::fs::read(&path).await {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return HashMap::new(),
        Err(e) => Err(e.to_string()),
        Ok(bytes) => serde_json::from_slice(&bytes).map_err(|e| e.to_string()),
    };
    parsed.unwrap_or_else(|e| {
        tracing::warn!(file = %path.display(), error = %e, "unreadable heat file: this snapshot records no heat");
        HashMap::new()
    })
}

/// Set the heat of each root file: what it had when this process started plus the reads
/// sampled since (none written for a file never read).
pub(super) fn add_heat(
    root: &mut DirIndex,
    base: &HashMap<String, u64>,
    reads: &HashMap<String, u64>,
) {
    for f in &mut root.files_present {
        let heat = base
            .get(&f.file_name)
            .copied()
            .unwrap_or(0)
            .saturating_add(reads.get(&f.file_name).copied().unwrap_or(0));
        f.heat = (heat > 0).then_some(heat);
    }
}

pub(super) fn file_index(f: &LocalFile, blob_id: String) -> FileIndex {
    FileIndex {
        file_name: f.name.clone(),
        blobs: vec![FileBlob { blob_id, offset: 0 }],
        file_metadata: f.metadata.clone(),
        checksum: f.digest.crc32,
        sha256: Some(f.digest.sha256),
        inline_data: None,
        heat: None,
    }
}

/// Whether any present file of `d` (or below) travels inline.
pub(super) fn has_inline(d: &DirIndex) -> bool {
    d.files_present.iter().any(|f| f.inline_data.is_some())
        || d.sub_dirs_present.iter().any(has_inline)
}

/// Read the files that travel inline (small: off the async threads, all at once) and encode
/// them, by path. Each is checked against the SHA-256 and size the scan found: a file of
/// a checkpoint dir that changed since is an error, never a wrong index.
pub(super) async fn read_inline(files: &[&LocalFile]) -> Result<HashMap<PathBuf, String>> {
    let jobs: Vec<(PathBuf, FileDigest)> =
        files.iter().map(|f| (f.path.clone(), f.digest)).collect();
    tokio::task::spawn_blocking(move || {
        let mut out = HashMap::new();
        for (path, digest) in jobs {
            let bytes = std::fs::read(&path)
                .map_err(Error::io_with(format!("read {}", path.display())))?;
            if bytes.len() as u64 != digest.size || Sha256::of(&bytes) != digest.sha256 {
                return Err(Error::new(
                    ErrorKind::Io,
                    format!(
                        "{} changed after it was hashed ({} bytes, {} when scanned): a checkpoint dir must not change",
                        path.display(),
                        bytes.len(),
                        digest.size
                    ),
                ));
            }
            out.insert(path, FileIndex::encode_inline(&bytes));
        }
        Ok(out)
    })
    .await
    .map_err(|e| Error::task("read inline files", e))?
}

/// Which blobs an upload sends: an added mutable file (not `*.sst` or `*.blob`) smaller than
/// `inline_below` travels inline in the index; an added file whose SHA-256 the committed snapshot (or an earlier file of this
/// upload) already holds reuses that blob; every other content is sent once, as
/// `blobs/<id>/<sha256>`. Returns the blob of every content, the files to PUT, the files to
/// carry inline and how many added files were deduplicated.
type BlobPlan<'a> = (
    HashMap<Sha256, String>,
    Vec<&'a LocalFile>,
    Vec<&'a LocalFile>,
    u64,
);

pub(super) fn plan_blobs<'a>(
    id: CheckpointId,
    committed: Option<&LoadedSnapshot>,
    dd: &'a DirDiff<'a>,
    inline_below: u64,
    pre: &HashMap<Sha256, PreUploaded>,
) -> BlobPlan<'a> {
    let mut blob_of: HashMap<Sha256, String> = HashMap::new();
    if let Some(c) = committed {
        for (_, f) in c.index.present_files() {
            if let (Some(sha), [blob]) = (f.sha256, f.blobs.as_slice()) {
                blob_of.entry(sha).or_insert_with(|| blob.blob_id.clone());
            }
        }
    }
    let mut to_put: Vec<&LocalFile> = Vec::new();
    let mut to_inline: Vec<&LocalFile> = Vec::new();
    let mut deduplicated = 0u64;
    // What the retained files already carry inline counts against the index's budget.
    let mut inline_left = INLINE_BUDGET.saturating_sub(retained_inline_bytes(dd));
    // A file carried inline that came back unchanged (RocksDB's OPTIONS file, the same for the
    // DB's whole open life) would be sent again in every later index: from its first repeat
    // on it is a blob of its own (one PUT, once), which later snapshots share for free.
    for f in retained_inline(dd) {
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    for f in dd.added_files() {
        // Only mutable files (MANIFEST, OPTIONS, CURRENT, a WAL): they change at almost every
        // commit, so a blob of their own would cost a PUT each time. An SST or blob file is
        // immutable and stays a blob, which retained snapshots share for free (inline, it
        // would be sent again in every later index).
        if f.digest.size < inline_below && !is_immutable(&f.name) && f.digest.size <= inline_left {
            inline_left -= f.digest.size;
            to_inline.push(f);
            continue;
        }
        let sha = f.digest.sha256;
        if blob_of.contains_key(&sha) {
            deduplicated += 1;
            continue;
        }
        if let Some(p) = pre.get(&sha) {
            blob_of.insert(sha, p.blob_id.clone());
            continue;
        }
        blob_of.insert(sha, StoreScope::blob_id(id, sha));
        to_put.push(f);
    }
    (blob_of, to_put, to_inline, deduplicated)
}

/// Inline files at least this large that a snapshot retains unchanged become blobs of their
/// own from their first repeat on (one PUT, once; later snapshots name the blob); smaller
/// ones (CURRENT, IDENTITY) cost less inline than a PUT.
pub const SHARE_INLINE_FROM: u64 = 4 << 10;

/// The files `dd` retains (same name and content as the committed snapshot) whose entries
/// carry their content inline and are at least [`SHARE_INLINE_FROM`] bytes.
pub(super) fn retained_inline<'a>(dd: &'a DirDiff<'a>) -> Vec<&'a LocalFile> {
    fn collect<'a>(d: &'a DirDiff<'a>, out: &mut Vec<&'a LocalFile>) {
        out.extend(
            d.files_retained
                .iter()
                .filter(|(local, prev)| {
                    prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM
                })
                .map(|(local, _)| *local),
        );
        for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
            collect(sub, out);
        }
    }
    let mut out = Vec::new();
    collect(dd, &mut out);
    out
}

/// Bytes of the files `dd` retains that keep carrying their content inline (their entries
/// keep it; the larger ones become blobs, see `retained_inline`).
pub(super) fn retained_inline_bytes(dd: &DirDiff<'_>) -> u64 {
    let here: u64 = dd
        .files_retained
        .iter()
        .filter(|(local, prev)| prev.inline_data.is_some() && local.digest.size < SHARE_INLINE_FROM)
        .map(|(_, prev)| prev.file_metadata.size)
        .sum();
    dd.sub_dirs_added
        .iter()
        .chain(&dd.sub_dirs_retained)
        .map(retained_inline_bytes)
        .fold(here, u64::saturating_add)
}

/// The new DirIndex: retained files keep their blob or inline data (with attributes from
/// disk now), added files get their inline data or the blob planned for their content.
pub(super) fn build_dir(
    d: &DirDiff<'_>,
    blob_of: &HashMap<Sha256, String>,
    inline: &HashMap<PathBuf, String>,
) -> Result<DirIndex> {
    let mut files = Vec::with_capacity(d.files_added.len() + d.files_retained.len());
    for (local, prev) in &d.files_retained {
        // An inline file shared as a blob from its first repeat on (see `plan_blobs`).
        if prev.inline_data.is_some() && local.digest.size >= SHARE_INLINE_FROM {
            if let Some(blob) = blob_of.get(&local.digest.sha256) {
                files.push(file_index(local, blob.clone()));
                continue;
            }
        }
        let mut fi = (*prev).clone();
        fi.file_metadata = local.metadata.clone();
        files.push(fi);
    }
    for f in &d.files_added {
        // By file, not by content: a copy of an inlined content that came past the inline
        // budget is a blob.
        if let Some(data) = inline.get(&f.path) {
            files.push(FileIndex {
                blobs: Vec::new(),
                inline_data: Some(data.clone()),
                heat: None,
                ..file_index(f, String::new())
            });
            continue;
        }
        let blob = blob_of.get(&f.digest.sha256).ok_or_else(|| {
            Error::new(
                ErrorKind::Io,
                format!("internal: no blob planned for {}", f.path.display()),
            )
        })?;
        files.push(file_index(f, blob.clone()));
    }
    let mut dirs = Vec::new();
    for sub in d.sub_dirs_added.iter().chain(&d.sub_dirs_retained) {
        dirs.push(build_dir(sub, blob_of, inline)?);
    }
    Ok(DirIndex {
        dir_name: d.name.clone(),
        files_present: files,
        // A removed inline file is named without its bytes: they are in the previous index,
        // and copying them again made the removed MANIFEST a third of every index.
        files_removed: d
            .files_removed
            .iter()
            .map(|f| FileIndex {
                inline_data: None,
                ..(*f).clone()
            })
            .collect(),
        sub_dirs_present: dirs,
        sub_dirs_removed: d.sub_dirs_removed.iter().map(|d| (*d).clone()).collect(),
    })
}

// ---- the diff ----

/// The difference of one directory.
#[derive(Debug, Default)]
pub struct DirDiff<'a> {
    /// The directory's name (`""` for the root).
    pub name: String,
    /// Local files not in the previous index with the same content.
    pub files_added: Vec<&'a LocalFile>,
    /// Local files whose content the previous index already has, with that entry.
    pub files_retained: Vec<(&'a LocalFile, &'a FileIndex)>,
    /// Previous entries with no local file of the same name and content.
    pub files_removed: Vec<&'a FileIndex>,
    /// Local directories the previous index does not have.
    pub sub_dirs_added: Vec<DirDiff<'a>>,
    /// Directories on both sides.
    pub sub_dirs_retained: Vec<DirDiff<'a>>,
    /// Previous directories with no local counterpart (whole subtrees).
    pub sub_dirs_removed: Vec<&'a DirIndex>,
}

/// Totals of a diff.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffTotals {
    /// Files added.
    pub files_added: u64,
    /// Bytes of added files.
    pub bytes_added: u64,
    /// Files retained.
    pub files_retained: u64,
    /// Bytes of retained files.
    pub bytes_retained: u64,
    /// Files removed (including those of removed subtrees).
    pub files_removed: u64,
    /// Bytes of removed files.
    pub bytes_removed: u64,
}

fn same_content(local: &LocalFile, prev: &FileIndex) -> bool {
    prev.sha256 == Some(local.digest.sha256) && prev.file_metadata.size == local.digest.size
}

/// Diff `local` against `prev` (`None`: everything is added).
pub fn diff<'a>(local: &'a LocalDir, prev: Option<&'a DirIndex>) -> DirDiff<'a> {
    let mut out = DirDiff {
        name: local.name.clone(),
        ..Default::default()
    };
    let prev_files: HashMap<&str, &FileIndex> = prev
        .map(|p| {
            p.files_present
                .iter()
                .map(|f| (f.file_name.as_str(), f))
                .collect()
        })
        .unwrap_or_default();
    let prev_dirs: HashMap<&str, &DirIndex> = prev
        .map(|p| {
            p.sub_dirs_present
                .iter()
                .map(|d| (d.dir_name.as_str(), d))
                .collect()
        })
        .unwrap_or_default();

    for f in &local.files {
        match prev_files.get(f.name.as_str()) {
            Some(p) if same_content(f, p) => out.files_retained.push((f, p)),
            _ => out.files_added.push(f),
        }
    }
    if let Some(p) = prev {
        for pf in &p.files_present {
            let kept = local
                .files
                .iter()
                .any(|f| f.name == pf.file_name && same_content(f, pf));
            if !kept {
                out.files_removed.push(pf);
            }
        }
    }
    for d in &local.dirs {
        match prev_dirs.get(d.name.as_str()) {
            Some(p) => out.sub_dirs_retained.push(diff(d, Some(p))),
            None => out.sub_dirs_added.push(diff(d, None)),
        }
    }
    if let Some(p) = prev {
        for pd in &p.sub_dirs_present {
            if !local.dirs.iter().any(|d| d.name == pd.dir_name) {
                out.sub_dirs_removed.push(pd);
            }
        }
    }
    out
}

fn removed_subtree(d: &DirIndex, t: &mut DiffTotals) {
    for f in &d.files_present {
        t.files_removed += 1;
        t.bytes_removed += f.file_metadata.size;
    }
    for s in &d.sub_dirs_present {
        removed_subtree(s, t);
    }
}

impl DirDiff<'_> {
    /// Totals over the whole tree.
    pub fn totals(&self) -> DiffTotals {
        let mut t = DiffTotals::default();
        self.add_totals(&mut t);
        t
    }

    fn add_totals(&self, t: &mut DiffTotals) {
        for f in &self.files_added {
            t.files_added += 1;
            t.bytes_added += f.digest.size;
        }
        for (f, _) in &self.files_retained {
            t.files_retained += 1;
            t.bytes_retained += f.digest.size;
        }
        for f in &self.files_removed {
            t.files_removed += 1;
            t.bytes_removed += f.file_metadata.size;
        }
        for d in self.sub_dirs_added.iter().chain(&self.sub_dirs_retained) {
            d.add_totals(t);
        }
        for d in &self.sub_dirs_removed {
            removed_subtree(d, t);
        }
    }

    /// Whether the local tree has exactly the files of the previous snapshot: the same
    /// directories, names, sizes, contents (SHA-256) and permissions. Such a snapshot needs no
    /// new index: the previous marker is carried forward (DESIGN §7 step 2).
    pub fn is_unchanged(&self) -> bool {
        self.files_added.is_empty()
            && self.files_removed.is_empty()
            && self.sub_dirs_added.is_empty()
            && self.sub_dirs_removed.is_empty()
            && self
                .files_retained
                .iter()
                .all(|(f, p)| f.metadata.mode() == p.file_metadata.mode())
            && self.sub_dirs_retained.iter().all(DirDiff::is_unchanged)
    }

    /// Every added file, depth first.
    pub fn added_files(&self) -> Vec<&LocalFile> {
        let mut out = Vec::new();
        self.collect_added(&mut out);
        out
    }

    fn collect_added<'s>(&'s self, out: &mut Vec<&'s LocalFile>) {
        out.extend(self.files_added.iter().copied());
        for d in self.sub_dirs_added.iter().chain(&self.sub_dirs_retained) {
            d.collect_added(out);
        }
    }
}

#[cfg(test)]
mod tests;
