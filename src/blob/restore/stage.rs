//! Staging: the new tree is built beside the store dir, from the plan's staged and local files
//! (downloads are written by the manager as they arrive).

use std::collections::HashSet;
use std::path::Path;

use super::plan::{FileStamp, RestorePlan, Source};
use crate::digest::hash_file;
use crate::error::{Error, Result};
use crate::local::scan::is_immutable;
use crate::local::swap::remove_tree;

/// Make the staging dir hold exactly the plan's staged files, the directories, and the reused
/// local files (linked or copied, copies re-verified); everything else in it is removed
/// without following a link. Downloads are added afterwards.
pub(super) fn prepare_staging(staging: &Path, plan: &RestorePlan) -> Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    // The staging dir itself must be a directory of ours: a symlink there (or anything else)
    // is removed, never followed.
    match std::fs::symlink_metadata(staging) {
        Ok(md) if md.is_dir() => {}
        Ok(_) => std::fs::remove_file(staging)
            .map_err(Error::io_with(format!("remove {}", staging.display())))?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => return Err(Error::io(format!("stat {}", staging.display()), e)),
    }
    std::fs::create_dir_all(staging)
        .map_err(Error::io_with(format!("create {}", staging.display())))?;
    let keep: HashSet<&str> = plan
        .files
        .iter()
        .filter(|f| f.source == Source::Staged)
        .map(|f| f.path.as_str())
        .collect();
    let wanted_dirs: HashSet<&str> = plan.dirs.iter().map(String::as_str).collect();
    // One walk that never follows a link (file types from the directory entry, not from the
    // path): staged files of the plan stay, wanted directories are walked, every other entry
    // — a file the plan does not stage, a directory it does not have, a symlink, a FIFO — is
    // removed itself. (A staging dir left by an interrupted restore holds the old tree, which
    // may hold anything.)
    fn prune(dir: &Path, rel: &str, keep: &HashSet<&str>, wanted: &HashSet<&str>) -> Result<()> {
        for e in
            std::fs::read_dir(dir).map_err(Error::io_with(format!("list {}", dir.display())))?
        {
            let e = e.map_err(Error::io_with(format!("list {}", dir.display())))?;
            let path = e.path();
            let ft = e
                .file_type()
                .map_err(Error::io_with(format!("stat {}", path.display())))?;
            let r = e
                .file_name()
                .into_string()
                .ok()
                .map(|name| format!("{rel}{name}"));
            if ft.is_dir() {
                match &r {
                    Some(r) if wanted.contains(r.as_str()) => {
                        prune(&path, &format!("{r}/"), keep, wanted)?
                    }
                    _ => remove_tree(&path)?,
                }
            } else if !(ft.is_file() && r.as_deref().is_some_and(|r| keep.contains(r))) {
                std::fs::remove_file(&path)
                    .map_err(Error::io_with(format!("remove {}", path.display())))?;
            }
        }
        Ok(())
    }
    prune(staging, "", &keep, &wanted_dirs)?;
    for d in &plan.dirs {
        let p = staging.join(d);
        std::fs::create_dir_all(&p).map_err(Error::io_with(format!("create {}", p.display())))?;
    }
    for f in &plan.files {
        let Source::Local(from) = &f.source else {
            continue;
        };
        let dest = staging.join(&f.path);
        let mode = f.entry.file_metadata.mode();
        let src_mode = std::fs::metadata(from)
            .map(|m| m.permissions().mode() & 0o777)
            .map_err(Error::io_with(format!("stat {}", from.display())))?;
        let linkable = is_immutable(&f.path) && mode.is_none_or(|m| m == src_mode);
        if linkable {
            match std::fs::hard_link(from, &dest) {
                // The link shares the proved file's inode: it holds the proved bytes unless
                // the file was written since its proof began (F12 of the second protocol
                // review). Another inode, size or modification time than its stamp at the
                // proof sends it down the copy path, which hashes what it copied.
                Ok(())
                    if plan.proof_stamps.get(from).is_some_and(|st| {
                        FileStamp::of(&dest) == Some(*st) && st.size() == f.entry.file_metadata.size
                    }) =>
                {
                    continue
                }
                Ok(()) => {
                    tracing::info!(from = %from.display(), "a reused file was modified after its proof began: copying and hashing it again");
                    std::fs::remove_file(&dest)
                        .map_err(Error::io_with(format!("remove {}", dest.display())))?;
                }
                // Another filesystem (EXDEV) or no link support: copy instead.
                Err(e) => {
                    tracing::debug!(from = %from.display(), error = %e, "cannot hard-link; copying")
                }
            }
        }
        std::fs::copy(from, &dest).map_err(Error::io_with(format!(
            "copy {} to {}",
            from.display(),
            dest.display()
        )))?;
        if let Some(mode) = mode {
            std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))
                .map_err(Error::io_with(format!("chmod {}", dest.display())))?;
        }
        // Re-verify the copy: the source could have changed since it was hashed.
        let d = hash_file(&dest)?;
        if Some(d.sha256) != f.entry.sha256 {
            return Err(Error::corrupt(format!(
                "{} changed while being copied for {}",
                from.display(),
                f.path
            )));
        }
        std::fs::File::open(&dest)
            .and_then(|file| file.sync_all())
            .map_err(Error::io_with(format!("fsync {}", dest.display())))?;
    }
    Ok(())
}
