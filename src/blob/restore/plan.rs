//! The restore plan: what each file of an index comes from (staged, a local copy proven by
//! its SHA-256, or a download) and what local files are left over. [`Inventory::of`] reads the
//! disk; [`decide`] is pure.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::backend::StoreSpec;
use crate::digest::{hash_file, hash_files_in_parallel, Sha256};
use crate::error::{Error, Result};
use crate::index::{FileIndex, IndexMarker, SnapshotIndex};
use crate::local::hashcache::{CacheKey, HashCache};
use crate::local::scan::is_immutable;
use crate::local::swap::{sibling, staging_dir, standby_dir};

/// Where a file of the restored tree comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Source {
    /// Already in the staging dir of an interrupted restore, verified.
    Staged,
    /// A local file with the same size and SHA-256 (recomputed now).
    Local(PathBuf),
    /// The blob store.
    Download,
}

/// One file of the plan.
#[derive(Clone, Debug)]
pub struct PlannedFile {
    /// Path relative to the store dir.
    pub path: String,
    /// Its index entry.
    pub entry: FileIndex,
    /// Where its bytes come from.
    pub source: Source,
    /// How a reused file was proved to hold them (`None` for a download).
    pub proof: Option<Proof>,
}

/// How a reused local file was proved to hold the indexed bytes (DESIGN §8).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Proof {
    /// Read whole, its SHA-256 compared with the index's.
    Read,
    /// The hash cache's entry for this very inode, unchanged in size and nanosecond mtime
    /// since its SHA-256 was computed (immutable files only: `*.sst`, `*.blob`).
    HashCache,
}

/// Totals of a plan.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub struct PlanTotals {
    /// Files in the snapshot.
    pub files: u64,
    /// Bytes in the snapshot.
    pub bytes: u64,
    /// Files reused from local disk (live dir, checkpoint dirs, staging).
    pub files_reused: u64,
    /// Their bytes.
    pub bytes_reused: u64,
    /// Files to download.
    pub files_to_download: u64,
    /// Their bytes.
    pub bytes_to_download: u64,
    /// Files in the live store dir that the snapshot does not have (gone after the swap).
    pub files_to_delete: u64,
    /// Reused files proved by the hash cache ([`Proof::HashCache`]): not read.
    pub files_proved_by_cache: u64,
    /// Local files read whole to compute their SHA-256 (reuse candidates, whether they
    /// matched or not).
    pub files_hashed: u64,
    /// Their bytes.
    pub bytes_hashed: u64,
    /// Reused files taken from a warm standby's copy (counted in `files_reused` too).
    pub files_from_standby: u64,
    /// Their bytes.
    pub bytes_from_standby: u64,
    /// Of the files to download, those a lazy restore left remote (fetched on demand or in
    /// the background after the restore returned); set by the restore's execution.
    pub files_left_remote: u64,
    /// Their bytes.
    pub bytes_left_remote: u64,
}

/// What restoring one store will do.
#[derive(Clone, Debug)]
pub struct RestorePlan {
    /// The store.
    pub store: String,
    /// The index restored from (`None`: reset to empty).
    pub marker: Option<IndexMarker>,
    /// Every file of the snapshot.
    pub files: Vec<PlannedFile>,
    /// Every directory of the snapshot (relative, parents first).
    pub dirs: Vec<String>,
    /// Live files not in the snapshot.
    pub leftover: Vec<String>,
    /// Totals.
    pub totals: PlanTotals,
    /// Each proved local file as it was when its proof began: a reused file whose inode,
    /// size or modification time differ when it is linked is copied and hashed again, never
    /// hard-linked on the strength of an older proof.
    pub proof_stamps: HashMap<PathBuf, FileStamp>,
}

/// What identifies a file's content between its proof and its use: inode, size and
/// modification time (ns), as `symlink_metadata` says.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct FileStamp {
    dev: u64,
    ino: u64,
    size: u64,
    mtime_ns: i128,
}

impl FileStamp {
    /// The size it records.
    pub fn size(&self) -> u64 {
        self.size
    }

    /// The stamp of `path` now (`None`: it cannot be stat-ed).
    pub fn of(path: &Path) -> Option<FileStamp> {
        use std::os::unix::fs::MetadataExt as _;
        let md = std::fs::symlink_metadata(path).ok()?;
        Some(FileStamp {
            dev: md.dev(),
            ino: md.ino(),
            size: md.len(),
            mtime_ns: md.mtime() as i128 * 1_000_000_000 + md.mtime_nsec() as i128,
        })
    }
}

impl fmt::Display for RestorePlan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let t = &self.totals;
        match &self.marker {
            Some(m) => writeln!(f, "restore store {} from {m}", self.store)?,
            None => writeln!(f, "reset store {} to empty (no snapshot)", self.store)?,
        }
        // Small files travel inside the index: "downloaded" with it, not fetched as blobs.
        let inline = self
            .files
            .iter()
            .filter(|p| p.source == Source::Download && p.entry.blobs.is_empty())
            .count();
        let inline = if inline > 0 {
            format!(", {inline} of them written from the index")
        } else {
            String::new()
        };
        writeln!(
            f,
            "  {} files, {} bytes: reuse {} files ({} bytes), download {} files ({} bytes{inline}), delete {} local files",
            t.files, t.bytes, t.files_reused, t.bytes_reused, t.files_to_download, t.bytes_to_download, t.files_to_delete
        )?;
        writeln!(
            f,
            "  proofs of reused files: {} by the hash cache, {} local files read ({} bytes)",
            t.files_proved_by_cache, t.files_hashed, t.bytes_hashed
        )?;
        for p in &self.files {
            let by = match p.proof {
                Some(Proof::HashCache) => " (proved by the hash cache)",
                _ => "",
            };
            let how = match &p.source {
                Source::Staged => format!("staged{by}"),
                Source::Local(from) => format!("reuse {}{by}", from.display()),
                Source::Download => match p.entry.blobs.first() {
                    Some(b) => format!("download {}", b.blob_id),
                    None => "write from the index (inline)".to_string(),
                },
            };
            writeln!(f, "  {:>12}  {}  {how}", p.entry.file_metadata.size, p.path)?;
        }
        for l in &self.leftover {
            writeln!(f, "  {:>12}  {l}  delete", "")?;
        }
        Ok(())
    }
}

/// Regular files below `dir`, relative path → (full path, size). Missing dir: empty.
fn list_files(dir: &Path) -> Result<BTreeMap<String, (PathBuf, u64)>> {
    fn walk(dir: &Path, rel: &str, out: &mut BTreeMap<String, (PathBuf, u64)>) -> Result<()> {
        let entries = match std::fs::read_dir(dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) => return Err(Error::io(format!("list {}", dir.display()), e)),
        };
        for entry in entries {
            let entry = entry.map_err(Error::io_with(format!("list {}", dir.display())))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue;
            };
            let path = entry.path();
            let md = std::fs::symlink_metadata(&path)
                .map_err(Error::io_with(format!("stat {}", path.display())))?;
            let r = format!("{rel}{name}");
            if md.is_dir() {
                walk(&path, &format!("{r}/"), out)?;
            } else if md.is_file() {
                out.insert(r, (path, md.len()));
            }
        }
        Ok(())
    }
    let mut out = BTreeMap::new();
    walk(dir, "", &mut out)?;
    Ok(out)
}

/// SHA-256 of each file (`None` if unreadable), on up to as many threads as there are cores.
fn hash_in_parallel(paths: &[PathBuf]) -> HashMap<PathBuf, Option<Sha256>> {
    let refs: Vec<&Path> = paths.iter().map(PathBuf::as_path).collect();
    paths
        .iter()
        .cloned()
        .zip(hash_files_in_parallel(&refs))
        .map(|(p, d)| (p, d.ok().map(|d| d.sha256)))
        .collect()
}

/// What is on local disk for one store: the files a restore could reuse.
#[derive(Clone, Debug, Default)]
pub struct Inventory {
    /// The live store dir: relative path -> (full path, size).
    pub live: BTreeMap<String, (PathBuf, u64)>,
    /// The staging dir of an interrupted restore, the same way.
    pub staged: BTreeMap<String, (PathBuf, u64)>,
    /// Every local file by size — the live dir first, then a standby's copy, then every local
    /// checkpoint dir.
    pub by_size: HashMap<u64, Vec<PathBuf>>,
}

impl Inventory {
    /// List the live, staging and local checkpoint dirs of `spec`, and with `standby` the
    /// standby dir (whose lock the caller holds) (blocking).
    pub fn of(spec: &StoreSpec, standby: bool) -> Result<Inventory> {
        let staged = list_files(&staging_dir(&spec.dir)?)?;
        let live = list_files(&spec.dir)?;
        let mut by_size: HashMap<u64, Vec<PathBuf>> = HashMap::new();
        for (path, size) in live.values() {
            by_size.entry(*size).or_default().push(path.clone());
        }
        if standby {
            for (path, size) in list_files(&standby_dir(&spec.dir)?)?.into_values() {
                by_size.entry(size).or_default().push(path);
            }
        }
        let checkpoints = sibling(&spec.dir, ".checkpoints")?;
        if let Ok(entries) = std::fs::read_dir(&checkpoints) {
            for e in entries.flatten() {
                for (path, size) in list_files(&e.path())?.into_values() {
                    by_size.entry(size).or_default().push(path);
                }
            }
        }
        // Samza's RocksJava stores keep their checkpoints beside the store dir, as
        // `<store dir>-<checkpoint id>` (route 1 uploads them as they are): their files are
        // candidates too, proved like every other.
        for dir in samza_checkpoint_dirs(&spec.dir) {
            for (path, size) in list_files(&dir)?.into_values() {
                by_size.entry(size).or_default().push(path);
            }
        }
        Ok(Inventory {
            live,
            staged,
            by_size,
        })
    }

    /// The likely reuse candidates of `index`: the same path with the same size, staged or
    /// live (hashed first and in parallel: reusing most of a store is bound by this re-hash).
    fn likely(&self, index: &SnapshotIndex) -> Vec<PathBuf> {
        index
            .present_files()
            .into_iter()
            .filter_map(|(path, entry)| {
                let size = entry.file_metadata.size;
                self.staged
                    .get(&path)
                    .filter(|(_, s)| *s == size)
                    .or_else(|| self.live.get(&path).filter(|(_, s)| *s == size))
                    .map(|(p, _)| p.clone())
            })
            .collect()
    }
}

/// The checkpoint dirs Samza keeps for store dir `dir`: its siblings named
/// `<name>-<checkpoint id>` (Samza's `StorageManagerUtil.getCheckpointDirPath`), by name.
pub fn samza_checkpoint_dirs(dir: &Path) -> Vec<PathBuf> {
    let (Some(name), Some(parent)) = (dir.file_name().and_then(|n| n.to_str()), dir.parent())
    else {
        return Vec::new();
    };
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let prefix = format!("{name}-");
    let Ok(entries) = std::fs::read_dir(parent) else {
        return Vec::new();
    };
    let mut out: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| {
            e.file_name().to_str().is_some_and(|n| {
                n.strip_prefix(&prefix)
                    .is_some_and(|id| id.parse::<crate::id::CheckpointId>().is_ok())
            }) && e.file_type().is_ok_and(|t| t.is_dir())
        })
        .map(|e| e.path())
        .collect();
    out.sort();
    out
}

/// The SHA-256 the hash cache proves for the local file `path`: only an immutable file
/// (`*.sst`, `*.blob`), only for this very inode with the size and nanosecond mtime it had
/// when its SHA-256 was computed (DESIGN §7's key); `None` otherwise (it must be read).
pub fn proved_by_cache(cache: &HashCache, path: &Path) -> Option<Sha256> {
    let name = path.file_name()?.to_str()?;
    if !is_immutable(name) {
        return None;
    }
    let md = std::fs::symlink_metadata(path).ok()?;
    if !md.is_file() {
        return None;
    }
    cache.get(&CacheKey::of(name, &md)).map(|d| d.sha256)
}

/// Where a restore may look for local copies and their proofs.
#[derive(Clone, Copy, Debug, Default)]
pub struct Sources<'a> {
    /// Include the standby dir (its lock held by the caller).
    pub standby: bool,
    /// Hash caches whose entries may prove an immutable file (the store's, the standby's):
    /// an entry is about an inode, so any of them proves it wherever it was recorded.
    pub caches: &'a [&'a HashCache],
}

/// Plan the restore of `spec` to `index` (blocking: lists the local dirs and proves the
/// candidates — by a hash cache where it can, else by reading them; the decision is
/// [`decide`]'s).
pub fn plan_store(
    spec: &StoreSpec,
    marker: Option<IndexMarker>,
    index: Option<&SnapshotIndex>,
    sources: Sources<'_>,
) -> Result<RestorePlan> {
    let inventory = Inventory::of(spec, sources.standby)?;
    let standby = if sources.standby {
        Some(standby_dir(&spec.dir)?)
    } else {
        None
    };
    let caches = sources.caches;
    let proved = |p: &Path| caches.iter().find_map(|c| proved_by_cache(c, p));
    let mut proofs: HashMap<PathBuf, Option<Sha256>> = HashMap::new();
    let mut by_cache: HashSet<PathBuf> = HashSet::new();
    // Each candidate's stamp, taken before its proof (F12): staging links it only if the
    // stamp still holds.
    let mut stamps: HashMap<PathBuf, FileStamp> = HashMap::new();
    let mut likely = Vec::new();
    for p in index.map(|i| inventory.likely(i)).unwrap_or_default() {
        if let Some(st) = FileStamp::of(&p) {
            stamps.insert(p.clone(), st);
        }
        match proved(&p) {
            Some(sha) => {
                by_cache.insert(p.clone());
                proofs.insert(p, Some(sha));
            }
            None => likely.push(p),
        }
    }
    // The rest of the likely ones are read in parallel (a restore that reuses most of a
    // store without a cache is bound by this).
    let (mut hashed, mut hashed_bytes) = (likely.len() as u64, 0u64);
    for (p, sha) in hash_in_parallel(&likely) {
        hashed_bytes += std::fs::symlink_metadata(&p).map_or(0, |m| m.len());
        proofs.insert(p, sha);
    }
    let hash_of = |p: &Path| -> Option<Sha256> {
        *proofs.entry(p.to_path_buf()).or_insert_with(|| {
            if let Some(st) = FileStamp::of(p) {
                stamps.insert(p.to_path_buf(), st);
            }
            if let Some(sha) = proved(p) {
                by_cache.insert(p.to_path_buf());
                return Some(sha);
            }
            let d = hash_file(p).ok()?;
            hashed += 1;
            hashed_bytes += d.size;
            Some(d.sha256)
        })
    };
    let mut plan = decide(&spec.name, marker, index, &inventory, hash_of)?;
    for f in &plan.files {
        if let Source::Local(p) = &f.source {
            if let Some(st) = stamps.get(p) {
                plan.proof_stamps.insert(p.clone(), *st);
            }
        }
    }
    if let Some(sd) = &standby {
        for f in &plan.files {
            if matches!(&f.source, Source::Local(p) if p.starts_with(sd)) {
                plan.totals.files_from_standby += 1;
                plan.totals.bytes_from_standby += f.entry.file_metadata.size;
            }
        }
    }
    for f in &mut plan.files {
        let from = match &f.source {
            Source::Local(p) => Some(p),
            Source::Staged => inventory.staged.get(&f.path).map(|(p, _)| p),
            Source::Download => None,
        };
        if from.is_some_and(|p| by_cache.contains(p)) {
            f.proof = Some(Proof::HashCache);
            plan.totals.files_proved_by_cache += 1;
        }
    }
    plan.totals.files_hashed = hashed;
    plan.totals.bytes_hashed = hashed_bytes;
    Ok(plan)
}

/// The restore decision, with no I/O of its own: for each file of `index`, reuse a staged
/// file of the same path, else a local file of the same size (the same path in the live dir
/// first), whose SHA-256 — as `hash_of` computes it (`None`: unreadable) — is the index's;
/// else download it. Live files the snapshot lacks are leftovers. An entry without a SHA-256
/// or with other than one blob is `Corrupt` (a restore must verify every byte).
pub fn decide(
    store: &str,
    marker: Option<IndexMarker>,
    index: Option<&SnapshotIndex>,
    inventory: &Inventory,
    mut hash_of: impl FnMut(&Path) -> Option<Sha256>,
) -> Result<RestorePlan> {
    let Inventory {
        live,
        staged,
        by_size,
    } = inventory;
    let mut files = Vec::new();
    let mut dirs = Vec::new();
    let mut totals = PlanTotals::default();
    if let Some(index) = index {
        fn collect_dirs(d: &crate::index::DirIndex, prefix: &str, out: &mut Vec<String>) {
            for s in &d.sub_dirs_present {
                let p = format!("{prefix}{}", s.dir_name);
                out.push(p.clone());
                collect_dirs(s, &format!("{p}/"), out);
            }
        }
        collect_dirs(&index.dir_index, "", &mut dirs);
        for (path, entry) in index.present_files() {
            let sha = entry.sha256.ok_or_else(|| {
                Error::corrupt(format!(
                    "index entry {path} has no sha256 (a Samza index?): blobsnap restores only verifiable files"
                ))
            })?;
            // Inline bytes are checked now, before anything is written (execute trusts them).
            let inline = entry
                .verified_inline_bytes()
                .map_err(|e| e.context(format!("index entry {path}")))?;
            if inline.is_none() && entry.blobs.len() != 1 {
                return Err(Error::corrupt(format!(
                    "index entry {path} has {} blobs; blobsnap restores single-blob files",
                    entry.blobs.len()
                )));
            }
            let size = entry.file_metadata.size;
            totals.files += 1;
            totals.bytes += size;
            let source = if staged
                .get(&path)
                .is_some_and(|(p, s)| *s == size && hash_of(p) == Some(sha))
            {
                Source::Staged
            } else {
                // Prefer the same path in the live dir, then any candidate of that size.
                let mut cands: Vec<PathBuf> = Vec::new();
                if let Some((p, s)) = live.get(&path) {
                    if *s == size {
                        cands.push(p.clone());
                    }
                }
                cands.extend(by_size.get(&size).into_iter().flatten().cloned());
                match cands.into_iter().find(|p| hash_of(p) == Some(sha)) {
                    Some(p) => Source::Local(p),
                    None => Source::Download,
                }
            };
            match source {
                Source::Download => {
                    totals.files_to_download += 1;
                    totals.bytes_to_download += size;
                }
                _ => {
                    totals.files_reused += 1;
                    totals.bytes_reused += size;
                }
            }
            let proof = (source != Source::Download).then_some(Proof::Read);
            files.push(PlannedFile {
                path,
                entry: entry.clone(),
                source,
                proof,
            });
        }
    }
    let wanted: HashSet<&str> = files.iter().map(|f| f.path.as_str()).collect();
    let leftover: Vec<String> = live
        .keys()
        .filter(|k| !wanted.contains(k.as_str()))
        .cloned()
        .collect();
    totals.files_to_delete = leftover.len() as u64;
    Ok(RestorePlan {
        store: store.to_owned(),
        marker,
        files,
        dirs,
        leftover,
        totals,
        proof_stamps: HashMap::new(),
    })
}

#[cfg(test)]
mod tests {
    //! [`decide`] alone: no disk, no store — the inventory and the hashes are given.
    use super::*;
    use crate::index::DirIndex;

    fn sha(b: &[u8]) -> Sha256 {
        Sha256::of(b)
    }

    fn file(name: &str, content: &[u8]) -> FileIndex {
        let blob = format!("blobs/1-0/{}", sha(content).to_hex());
        crate::index::tests::test_file(name, content.len() as u64, Some(blob), Some(sha(content)))
    }

    fn index(files: Vec<FileIndex>, sub: Vec<DirIndex>) -> SnapshotIndex {
        crate::index::tests::test_index(files, sub)
    }

    /// An inventory of (relative path, size) in the live and staging dirs and of full paths
    /// in checkpoint dirs, and the hashes of every path in it.
    fn inventory(
        live: &[(&str, &[u8])],
        staged: &[(&str, &[u8])],
        checkpoints: &[(&str, &[u8])],
    ) -> (Inventory, HashMap<PathBuf, Sha256>) {
        let mut inv = Inventory::default();
        let mut hashes = HashMap::new();
        for (rel, bytes) in live {
            let p = PathBuf::from("/live").join(rel);
            inv.live
                .insert(rel.to_string(), (p.clone(), bytes.len() as u64));
            inv.by_size
                .entry(bytes.len() as u64)
                .or_default()
                .push(p.clone());
            hashes.insert(p, sha(bytes));
        }
        for (rel, bytes) in staged {
            let p = PathBuf::from("/staging").join(rel);
            inv.staged
                .insert(rel.to_string(), (p.clone(), bytes.len() as u64));
            hashes.insert(p, sha(bytes));
        }
        for (full, bytes) in checkpoints {
            let p = PathBuf::from(full);
            inv.by_size
                .entry(bytes.len() as u64)
                .or_default()
                .push(p.clone());
            hashes.insert(p, sha(bytes));
        }
        (inv, hashes)
    }

    fn plan_of(
        idx: &SnapshotIndex,
        inv: &Inventory,
        hashes: &HashMap<PathBuf, Sha256>,
    ) -> (RestorePlan, Vec<PathBuf>) {
        let mut asked = Vec::new();
        let plan = decide("s", None, Some(idx), inv, |p| {
            asked.push(p.to_path_buf());
            hashes.get(p).copied()
        })
        .unwrap();
        (plan, asked)
    }

    fn source_of<'a>(plan: &'a RestorePlan, path: &str) -> &'a Source {
        &plan.files.iter().find(|f| f.path == path).unwrap().source
    }

    #[test]
    fn staged_then_same_path_then_any_local_copy_then_download() {
        let idx = index(
            vec![
                file("000001.sst", b"one"),
                file("000002.sst", b"two two"),
                file("000003.sst", b"three three"),
                file("MANIFEST-000004", b"new manifest"),
            ],
            vec![DirIndex {
                dir_name: "sub".into(),
                files_present: vec![file("x", b"xx")],
                ..DirIndex::default()
            }],
        );
        let (inv, hashes) = inventory(
            // 000001 live with the right bytes; 000002 live but changed (same size);
            // MANIFEST-000004 live, stale (other size); an old file the snapshot lacks.
            &[
                ("000001.sst", b"one"),
                ("000002.sst", b"two TWO"),
                ("MANIFEST-000004", b"old"),
                ("000000.log", b"log"),
            ],
            // 000003 staged by an interrupted restore.
            &[("000003.sst", b"three three")],
            // 000002's bytes in a local checkpoint dir.
            &[("/live.checkpoints/1-0/000002.sst", b"two two")],
        );
        let (plan, _) = plan_of(&idx, &inv, &hashes);
        assert_eq!(
            source_of(&plan, "000001.sst"),
            &Source::Local("/live/000001.sst".into())
        );
        assert_eq!(
            source_of(&plan, "000002.sst"),
            &Source::Local("/live.checkpoints/1-0/000002.sst".into())
        );
        assert_eq!(source_of(&plan, "000003.sst"), &Source::Staged);
        assert_eq!(source_of(&plan, "MANIFEST-000004"), &Source::Download);
        assert_eq!(source_of(&plan, "sub/x"), &Source::Download);
        assert_eq!(plan.dirs, ["sub"]);
        assert_eq!(plan.leftover, ["000000.log"]);
        let t = plan.totals;
        assert_eq!(
            (
                t.files,
                t.files_reused,
                t.files_to_download,
                t.files_to_delete
            ),
            (5, 3, 2, 1)
        );
        assert_eq!(t.bytes_to_download, (b"new manifest".len() + 2) as u64);
        assert_eq!(t.bytes, t.bytes_reused + t.bytes_to_download);
    }

    /// Samza's `<store dir>-<checkpoint id>` dirs beside the store dir are listed as reuse
    /// candidates (route 1: a restart whose store dir is gone but whose checkpoint dir is not
    /// downloads nothing it holds); a sibling whose suffix is not a checkpoint id is not.
    #[test]
    fn samza_checkpoint_dirs_beside_the_store_dir_are_candidates() {
        let tmp = tempfile::tempdir().unwrap();
        let store = tmp.path().join("counts");
        let samza = tmp.path().join("counts-1796515000338-5000000");
        let other = tmp.path().join("counts-backup");
        for d in [&samza, &other] {
            std::fs::create_dir_all(d).unwrap();
            std::fs::write(d.join("000007.sst"), b"seven").unwrap();
        }
        assert_eq!(samza_checkpoint_dirs(&store), vec![samza.clone()]);
        let spec = StoreSpec {
            name: "counts".into(),
            dir: store,
        };
        let inv = Inventory::of(&spec, false).unwrap();
        assert_eq!(inv.by_size[&5], vec![samza.join("000007.sst")]);
    }

    #[test]
    fn a_file_is_never_reused_on_its_size_alone_nor_hashed_when_no_size_matches() {
        let idx = index(vec![file("a.sst", b"aaaa")], vec![]);
        // Same size, other bytes (an unreadable file hashes to None).
        let (inv, mut hashes) = inventory(&[("a.sst", b"AAAA"), ("b.sst", b"bbbb")], &[], &[]);
        let (plan, asked) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        assert_eq!(
            asked.len(),
            3,
            "the same path (twice: live and by size) and b.sst: {asked:?}"
        );
        hashes.clear();
        let (plan, _) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        // No local file of that size: nothing hashed at all.
        let (inv, hashes) = inventory(&[("c.sst", b"ccccc")], &[], &[]);
        let (plan, asked) = plan_of(&idx, &inv, &hashes);
        assert_eq!(source_of(&plan, "a.sst"), &Source::Download);
        assert!(asked.is_empty(), "{asked:?}");
    }

    #[test]
    fn an_entry_a_restore_cannot_verify_is_corrupt_and_no_snapshot_resets() {
        let mut f = file("a.sst", b"a");
        f.sha256 = None;
        let (inv, hashes) = inventory(&[("old", b"x")], &[], &[]);
        let e = decide("s", None, Some(&index(vec![f], vec![])), &inv, |p| {
            hashes.get(p).copied()
        })
        .unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains("a.sst"), "{e}");
        let mut two = file("b.sst", b"b");
        two.blobs.push(two.blobs[0].clone());
        let e = decide("s", None, Some(&index(vec![two], vec![])), &inv, |_| None).unwrap_err();
        assert_eq!(e.kind(), crate::ErrorKind::Corrupt, "{e}");
        // No snapshot: everything live is a leftover, nothing downloads.
        let plan = decide("s", None, None, &inv, |_| None).unwrap();
        assert!(plan.files.is_empty());
        assert_eq!(plan.leftover, ["old"]);
    }
}
