//! A [`BlobStore`] on a local directory: the embedded default, no server needed.
//!
//! Semantics match the S3 store: a put writes a temp file next to its target, fsyncs it,
//! then renames it into place (overwrite) or hard-links it (`link(2)`, create-only: exactly
//! one of N concurrent writers wins), and fsyncs the directory before returning. A SHA-256 sent
//! with a put is checked before the object becomes visible. Keys map to paths below the root
//! and cannot leave it ([`BlobKey`] has no `.`/`..`/empty segments); names starting with
//! `.blobsnap` are reserved for temp files. Listing has S3's prefix semantics and key order.
//!
//! **A backup on the same disk as the state it protects is not a backup**: use this store
//! for development, tests and demos, or point it at a different device (an NFS mount, say).

use std::io::{Read as _, Seek as _, SeekFrom, Write as _};
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::time::SystemTime;

use async_trait::async_trait;
use bytes::Bytes;
use futures::stream::BoxStream;
use futures::StreamExt as _;

use super::{
    BlobKey, BlobStore, Capabilities, CreateOnly, DeleteFailures, GetResult, MultipartUpload,
    ObjectMeta, Probe, PutBody, PutMode, PutOptions, PutResult, Scope, Uploads,
};
use crate::digest::Hasher;
use crate::error::{Error, ErrorKind, Result};

const TMP_PREFIX: &str = ".blobsnap-tmp-";
const RESERVED: &str = ".blobsnap";

/// A blob store rooted at a local directory.
#[derive(Clone)]
pub struct LocalStore {
    root: PathBuf,
}

impl std::fmt::Debug for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "LocalStore({})", self.root.display())
    }
}

impl std::fmt::Display for LocalStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "local:{}", self.root.display())
    }
}

impl LocalStore {
    /// Open (creating if needed) a store rooted at `root`. The warning that a store on the
    /// state's disk does not survive that disk is logged once per store, when it is created
    /// (issue 51, item 12: every command repeated it).
    pub fn new(root: impl Into<PathBuf>) -> Result<Self> {
        let root = root.into();
        let created = !root.exists();
        std::fs::create_dir_all(&root)
            .map_err(|e| Error::io(format!("create store root {}", root.display()), e))?;
        let root = root
            .canonicalize()
            .map_err(|e| Error::io(format!("resolve store root {}", root.display()), e))?;
        if created {
            tracing::warn!(
                root = %root.display(),
                "created a local blob store: a backup on the same disk as the state does not survive the loss of that disk"
            );
        }
        Ok(LocalStore { root })
    }

    /// The root directory.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn path_of(&self, key: &BlobKey) -> Result<PathBuf> {
        let mut path = self.root.clone();
        for seg in key.as_str().split('/') {
            if seg.starts_with(RESERVED) {
                return Err(Error::invalid(format!(
                    "key {key}: segments starting with {RESERVED:?} are reserved by the local store"
                )));
            }
            path.push(seg);
        }
        Ok(path)
    }

    fn dir_of_scope(&self, scope: &Scope) -> PathBuf {
        let mut path = self.root.clone();
        for seg in scope.as_str().split('/').filter(|s| !s.is_empty()) {
            path.push(seg);
        }
        path
    }

    fn key_of(&self, path: &Path) -> Option<BlobKey> {
        let rel = path.strip_prefix(&self.root).ok()?;
        let s = rel.to_str()?;
        BlobKey::new(s).ok()
    }
}

fn io_err(what: impl std::fmt::Display, e: std::io::Error) -> Error {
    if e.raw_os_error() == Some(libc_enametoolong()) {
        return Error::invalid(format!("{what}: file name too long for the local store"))
            .with_source(e);
    }
    Error::io(what, e)
}

const fn libc_enametoolong() -> i32 {
    36 // ENAMETOOLONG on Linux
}

fn fsync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| io_err(format!("fsync dir {}", dir.display()), e))
}

/// Create `dir` and any missing parents, fsyncing each parent after creating a child in it.
fn create_dirs_durably(dir: &Path, root: &Path) -> Result<()> {
    let mut missing = Vec::new();
    let mut cur = dir;
    while !cur.exists() {
        missing.push(cur.to_path_buf());
        match cur.parent() {
            Some(p) if p.starts_with(root) => cur = p,
            _ => break,
        }
    }
    for d in missing.iter().rev() {
        match std::fs::create_dir(d) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(io_err(format!("create dir {}", d.display()), e)),
        }
        if let Some(parent) = d.parent() {
            fsync_dir(parent)?;
        }
    }
    Ok(())
}

fn system_time_of(meta: &std::fs::Metadata) -> Option<SystemTime> {
    meta.modified().ok()
}

fn random_suffix() -> String {
    format!("{:016x}", rand::random::<u64>())
}

fn put_blocking(
    root: &Path,
    key: &BlobKey,
    path: &Path,
    body: PutBody,
    opts: PutOptions,
) -> Result<PutResult> {
    let parent = path
        .parent()
        .ok_or_else(|| Error::invalid(format!("key {key} has no parent directory")))?;
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| Error::invalid(format!("key {key} has no file name")))?;
    let tmp = parent.join(format!("{TMP_PREFIX}{}-{name}", random_suffix()));
    // A concurrent delete may remove an empty parent between creating it and writing into it.
    let mut file = None;
    for _ in 0..3 {
        create_dirs_durably(parent, root)?;
        match std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(&tmp)
        {
            Ok(f) => {
                file = Some(f);
                break;
            }
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
            Err(e) => return Err(io_err(format!("create {}", tmp.display()), e)),
        }
    }
    let mut file = file.ok_or_else(|| {
        Error::new(
            ErrorKind::Io,
            format!("could not create a temp file in {}", parent.display()),
        )
    })?;
    let result = write_and_publish(&mut file, &tmp, path, key, body, opts);
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    let size = result?;
    fsync_dir(parent)?;
    Ok(PutResult {
        size,
        e_tag: None,
        requests: 1,
    })
}

fn write_and_publish(
    file: &mut std::fs::File,
    tmp: &Path,
    path: &Path,
    key: &BlobKey,
    body: PutBody,
    opts: PutOptions,
) -> Result<u64> {
    let mut hasher = Hasher::new();
    match body {
        PutBody::Bytes(bytes) => {
            hasher.update(&bytes);
            file.write_all(&bytes)
                .map_err(|e| io_err(format!("write {}", tmp.display()), e))?;
        }
        PutBody::File { path: src, len } => {
            let mut input = std::fs::File::open(&src)
                .map_err(|e| io_err(format!("open {}", src.display()), e))?;
            let mut buf = vec![0u8; 1 << 20];
            loop {
                let n = input
                    .read(&mut buf)
                    .map_err(|e| io_err(format!("read {}", src.display()), e))?;
                if n == 0 {
                    break;
                }
                hasher.update(&buf[..n]);
                if hasher.len() > len {
                    break;
                }
                file.write_all(&buf[..n])
                    .map_err(|e| io_err(format!("write {}", tmp.display()), e))?;
            }
            if hasher.len() != len {
                return Err(Error::corrupt(format!(
                    "{} changed while being stored as {key}: expected {len} bytes, read {}",
                    src.display(),
                    hasher.len()
                )));
            }
        }
    }
    let digest = hasher.finish();
    if let Some(expected) = opts.sha256 {
        if expected != digest.sha256 {
            return Err(Error::corrupt(format!(
                "put {key}: body has SHA-256 {}, the caller expected {expected}",
                digest.sha256
            )));
        }
    }
    file.sync_all()
        .map_err(|e| io_err(format!("fsync {}", tmp.display()), e))?;
    match opts.mode {
        PutMode::Overwrite => std::fs::rename(tmp, path)
            .map_err(|e| io_err(format!("rename into {}", path.display()), e))?,
        PutMode::CreateOnly => {
            let linked = std::fs::hard_link(tmp, path);
            let _ = std::fs::remove_file(tmp);
            match linked {
                Ok(()) => {}
                Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {
                    return Err(Error::conflict(format!(
                        "create-only put of {key}: the object already exists"
                    )))
                }
                Err(e) => return Err(io_err(format!("link into {}", path.display()), e)),
            }
        }
    }
    Ok(digest.size)
}

fn meta_of(key: &BlobKey, path: &Path) -> Result<(std::fs::File, ObjectMeta)> {
    let file = std::fs::File::open(path).map_err(|e| {
        if e.kind() == std::io::ErrorKind::NotFound {
            Error::not_found(format!("no object {key}"))
        } else {
            io_err(format!("open {}", path.display()), e)
        }
    })?;
    let md = file
        .metadata()
        .map_err(|e| io_err(format!("stat {}", path.display()), e))?;
    if !md.is_file() {
        return Err(Error::not_found(format!("no object {key}")));
    }
    let meta = ObjectMeta {
        key: key.clone(),
        size: md.len(),
        last_modified: system_time_of(&md),
        e_tag: None,
    };
    Ok((file, meta))
}

/// Every regular file under `dir` (recursively) whose name is not reserved, or, with
/// `temps`, only the temp files.
fn walk(dir: &Path, temps: bool, out: &mut Vec<(PathBuf, std::fs::Metadata)>) -> Result<()> {
    let entries = match std::fs::read_dir(dir) {
        Ok(e) => e,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
        Err(e) if e.raw_os_error() == Some(20) => return Ok(()), // ENOTDIR: a file, not a scope
        Err(e) => return Err(io_err(format!("list {}", dir.display()), e)),
    };
    for entry in entries {
        let entry = entry.map_err(|e| io_err(format!("list {}", dir.display()), e))?;
        let name = entry.file_name();
        let name = name.to_string_lossy();
        let path = entry.path();
        let md = match std::fs::symlink_metadata(&path) {
            Ok(md) => md,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue, // deleted meanwhile
            Err(e) => return Err(io_err(format!("stat {}", path.display()), e)),
        };
        if md.is_dir() {
            if !name.starts_with(RESERVED) {
                walk(&path, temps, out)?;
            }
        } else if md.is_file() && name.starts_with(TMP_PREFIX) == temps {
            if !temps && name.starts_with(RESERVED) {
                continue;
            }
            out.push((path, md));
        }
    }
    Ok(())
}

/// Keys a listing of the local store reads per blocking call.
const LIST_PAGE: usize = 1000;

/// A depth-first walk of a directory tree in the byte order of the keys its files make:
/// siblings sorted by name, a directory's name compared as `name/` (every key under it
/// starts so), so `a-b` (0x2D) comes before the keys under `a/` (0x2F) and `a0` after them.
/// Holds one directory's sorted names per level of the path, not the tree. Reserved names
/// (`.blobsnap*`) and temp files are skipped; symlinks are neither files nor directories here
/// and are never followed.
struct KeyOrderWalk {
    /// The directory to open first (`None` once opened).
    start: Option<PathBuf>,
    /// Per open directory: its path and its entries still to visit (name, is a directory).
    stack: Vec<(PathBuf, std::vec::IntoIter<(String, bool)>)>,
}

impl KeyOrderWalk {
    fn new(dir: PathBuf) -> Self {
        KeyOrderWalk {
            start: Some(dir),
            stack: Vec::new(),
        }
    }

    fn is_done(&self) -> bool {
        self.start.is_none() && self.stack.is_empty()
    }

    /// Open `dir`: its entries sorted in key order (a missing dir or a file: nothing).
    fn open(&mut self, dir: PathBuf) -> Result<()> {
        let entries = match std::fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(()),
            Err(e) if e.raw_os_error() == Some(20) => return Ok(()), // ENOTDIR: a file, not a scope
            Err(e) => return Err(io_err(format!("list {}", dir.display()), e)),
        };
        let mut names = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| io_err(format!("list {}", dir.display()), e))?;
            let Ok(name) = entry.file_name().into_string() else {
                continue; // not UTF-8: no key names it
            };
            if name.starts_with(RESERVED) {
                continue; // temp files and the store's own
            }
            let file_type = match entry.file_type() {
                Ok(t) => t,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => continue,
                Err(e) => return Err(io_err(format!("stat {}", entry.path().display()), e)),
            };
            if file_type.is_dir() {
                names.push((format!("{name}/"), true));
            } else if file_type.is_file() {
                names.push((name, false));
            }
        }
        names.sort_unstable_by(|a, b| a.0.as_bytes().cmp(b.0.as_bytes()));
        self.stack.push((dir, names.into_iter()));
        Ok(())
    }

    /// The next up to `n` files, in key order; empty at the end.
    fn next_page(&mut self, n: usize) -> Result<Vec<(PathBuf, std::fs::Metadata)>> {
        if let Some(dir) = self.start.take() {
            self.open(dir)?;
        }
        let mut out = Vec::new();
        while out.len() < n {
            let Some((dir, entries)) = self.stack.last_mut() else {
                break;
            };
            let Some((name, is_dir)) = entries.next() else {
                self.stack.pop();
                continue;
            };
            let path = dir.join(name.trim_end_matches('/'));
            if is_dir {
                self.open(path)?;
                continue;
            }
            match std::fs::symlink_metadata(&path) {
                Ok(md) if md.is_file() => out.push((path, md)),
                Ok(_) => {}
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {} // deleted meanwhile
                Err(e) => return Err(io_err(format!("stat {}", path.display()), e)),
            }
        }
        Ok(out)
    }
}

async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T> + Send + 'static) -> Result<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| Error::task("blocking", e))?
}

#[async_trait]
impl BlobStore for LocalStore {
    async fn capabilities(&self, _probe: Probe) -> Result<Capabilities> {
        Ok(Capabilities {
            create_only: CreateOnly::Atomic,
            verifies_sha256: true,
            multipart_listing: true,
            tagging: false,
            lifecycle: false,
        })
    }

    async fn put(&self, key: &BlobKey, body: PutBody, opts: PutOptions) -> Result<PutResult> {
        let path = self.path_of(key)?;
        let root = self.root.clone();
        let key = key.clone();
        blocking(move || put_blocking(&root, &key, &path, body, opts)).await
    }

    async fn get(&self, key: &BlobKey, range: Option<Range<u64>>) -> Result<GetResult> {
        let path = self.path_of(key)?;
        let key2 = key.clone();
        let (mut file, meta) = blocking(move || meta_of(&key2, &path)).await?;
        let range = match range {
            None => 0..meta.size,
            Some(r) if r.start < r.end && r.end <= meta.size => r,
            Some(r) => {
                return Err(Error::invalid(format!(
                    "range {r:?} is empty or outside object {key} of {} bytes",
                    meta.size
                )))
            }
        };
        file.seek(SeekFrom::Start(range.start))
            .map_err(|e| io_err(format!("seek {key}"), e))?;
        let file = tokio::fs::File::from_std(file);
        let reader = tokio::io::AsyncReadExt::take(file, range.end - range.start);
        let key2 = key.clone();
        let body = tokio_util::io::ReaderStream::with_capacity(reader, 256 * 1024)
            .map(move |r: std::io::Result<Bytes>| r.map_err(|e| io_err(format!("read {key2}"), e)))
            .boxed();
        Ok(GetResult { meta, range, body })
    }

    async fn head(&self, key: &BlobKey) -> Result<ObjectMeta> {
        let path = self.path_of(key)?;
        let key = key.clone();
        blocking(move || meta_of(&key, &path).map(|(_, m)| m)).await
    }

    async fn delete_many(&self, keys: &[BlobKey]) -> Result<DeleteFailures> {
        let mut jobs = Vec::with_capacity(keys.len());
        for key in keys {
            jobs.push((key.clone(), self.path_of(key)?));
        }
        let root = self.root.clone();
        blocking(move || {
            let mut failures = Vec::new();
            let mut dirs = std::collections::BTreeSet::new();
            for (key, path) in jobs {
                match std::fs::remove_file(&path) {
                    Ok(()) => {
                        if let Some(p) = path.parent() {
                            dirs.insert(p.to_path_buf());
                        }
                    }
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => failures.push((key, io_err(format!("delete {}", path.display()), e))),
                }
            }
            for dir in &dirs {
                let _ = fsync_dir(dir);
            }
            // Remove directories left empty, deepest first; a failure only leaves clutter.
            for dir in dirs.iter().rev() {
                let mut cur = dir.as_path();
                while cur != root && cur.starts_with(&root) && std::fs::remove_dir(cur).is_ok() {
                    match cur.parent() {
                        Some(p) => cur = p,
                        None => break,
                    }
                }
            }
            Ok(failures)
        })
        .await
    }

    fn list<'a>(&'a self, scope: &Scope) -> BoxStream<'a, Result<ObjectMeta>> {
        // A page of keys per blocking call, in key order, never the whole tree in memory: a
        // sweep over a million objects streams through this.
        let walk = KeyOrderWalk::new(self.dir_of_scope(scope));
        let (scope, this) = (scope.clone(), self.clone());
        futures::stream::unfold(Some(walk), move |walk| {
            let (scope, this) = (scope.clone(), this.clone());
            async move {
                let mut walk = walk?;
                let page = blocking(move || {
                    let files = walk.next_page(LIST_PAGE)?;
                    Ok((walk, files))
                })
                .await;
                let (walk, files) = match page {
                    Ok(p) => p,
                    Err(e) => return Some((vec![Err(e)], None)),
                };
                if files.is_empty() && walk.is_done() {
                    return None;
                }
                let metas = files
                    .into_iter()
                    .filter_map(|(path, md)| {
                        let key = this.key_of(&path)?;
                        key.is_in(&scope).then(|| {
                            Ok(ObjectMeta {
                                key,
                                size: md.len(),
                                last_modified: system_time_of(&md),
                                e_tag: None,
                            })
                        })
                    })
                    .collect::<Vec<_>>();
                Some((metas, Some(walk)))
            }
        })
        .flat_map(futures::stream::iter)
        .boxed()
    }

    async fn incomplete_uploads(&self, scope: &Scope, before: Option<SystemTime>) -> Uploads {
        super::incomplete_uploads(self, scope, before).await
    }
}

/// Incomplete uploads: the temp files of puts that never finished.
#[async_trait]
impl super::ListUploads for LocalStore {
    async fn list_uploads(&self, scope: &Scope) -> Uploads {
        let dir = self.dir_of_scope(scope);
        let root = self.root.clone();
        let scope = scope.clone();
        blocking(move || {
            let mut files = Vec::new();
            walk(&dir, true, &mut files)?;
            let mut out = Vec::new();
            for (path, md) in files {
                let Some(name) = path.file_name().and_then(|n| n.to_str()) else {
                    continue;
                };
                // .blobsnap-tmp-<16 hex>-<name>
                let Some(target) = name
                    .strip_prefix(TMP_PREFIX)
                    .and_then(|rest| rest.get(17..))
                else {
                    continue;
                };
                let Some(rel_dir) = path.parent().and_then(|p| p.strip_prefix(&root).ok()) else {
                    continue;
                };
                let Some(rel_dir) = rel_dir.to_str() else {
                    continue;
                };
                let key = if rel_dir.is_empty() {
                    target.to_string()
                } else {
                    format!("{rel_dir}/{target}")
                };
                let (Ok(key), Some(upload_id)) = (
                    BlobKey::new(key),
                    path.strip_prefix(&root).ok().and_then(|p| p.to_str()),
                ) else {
                    continue;
                };
                if key.is_in(&scope) {
                    out.push(MultipartUpload {
                        key,
                        upload_id: upload_id.to_string(),
                        initiated: system_time_of(&md),
                    });
                }
            }
            out.sort_by(|a, b| a.key.cmp(&b.key));
            Ok(out)
        })
        .await
    }

    async fn abort_upload(&self, upload: &MultipartUpload) -> Result<()> {
        // The upload id is the temp file's path relative to the root; validate it like a key
        // so that it cannot name anything outside the root or anything but a temp file.
        let rel = BlobKey::new(upload.upload_id.clone())?;
        let is_temp = rel.file_name().starts_with(TMP_PREFIX);
        if !is_temp {
            return Err(Error::invalid(format!(
                "{:?} is not a local-store upload id",
                upload.upload_id
            )));
        }
        let mut path = self.root.clone();
        for seg in rel.as_str().split('/') {
            path.push(seg);
        }
        blocking(move || match std::fs::remove_file(&path) {
            Ok(()) => Ok(()),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
            Err(e) => Err(io_err(format!("remove {}", path.display()), e)),
        })
        .await
    }
}
