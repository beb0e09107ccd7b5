//! Verify a snapshot in the store: every object its index references exists with the size
//! the index records (HEAD), and — deep — its bytes hash to the index's SHA-256 (a download),
//! for all blobs or an exact random share of them. `blobsnap verify` prints the report.

use std::sync::atomic::{AtomicU64, Ordering};

use crate::blob::snapshot::LoadedSnapshot;
use crate::blobstore::{hash_object, BlobStore};
use crate::error::{Error, ErrorKind, Result};

/// How deep a verification goes.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct VerifyOptions {
    /// Download blobs and check their SHA-256 (else HEAD only).
    pub deep: bool,
    /// With `deep`: the percentage of blobs downloaded, in (0, 100], rounded up to whole
    /// blobs and chosen at random; every blob is still checked by HEAD.
    pub sample_pct: f64,
}

impl Default for VerifyOptions {
    fn default() -> Self {
        VerifyOptions {
            deep: false,
            sample_pct: 100.0,
        }
    }
}

impl VerifyOptions {
    /// Refuse a share outside (0, 100], or a share without `deep`.
    pub fn validate(&self) -> Result<()> {
        if !(self.sample_pct > 0.0 && self.sample_pct <= 100.0) {
            return Err(Error::invalid(format!(
                "--sample {}: a percentage in (0, 100]",
                self.sample_pct
            )));
        }
        if self.sample_pct < 100.0 && !self.deep {
            return Err(Error::invalid(
                "--sample chooses blobs to download: it needs --deep",
            ));
        }
        Ok(())
    }
}

/// What a verification found.
#[derive(Clone, Debug, Default)]
pub struct VerifyReport {
    /// Objects checked by HEAD.
    pub objects: u64,
    /// Of them, downloaded and hashed.
    pub deep_checked: u64,
    /// Each problem: its kind (`NotFound`: missing, `Corrupt`: wrong size or hash) and what.
    pub problems: Vec<(ErrorKind, String)>,
}

impl VerifyReport {
    /// The kind that names the verification's outcome: a missing object beats a corrupt one
    /// beats anything else; `None` when there is no problem.
    pub fn worst(&self) -> Option<ErrorKind> {
        [ErrorKind::NotFound, ErrorKind::Corrupt]
            .into_iter()
            .find(|k| self.problems.iter().any(|(p, _)| p == k))
            .or_else(|| self.problems.first().map(|(k, _)| *k))
    }
}

/// Verify `snap` in `store` as `opts` say; `progress` counts the bytes whose objects were
/// checked. Problems are reported, not returned as errors (a listing that fails is an error).
pub async fn verify(
    store: &dyn BlobStore,
    snap: &LoadedSnapshot,
    opts: &VerifyOptions,
    progress: &AtomicU64,
) -> Result<VerifyReport> {
    opts.validate()?;
    let files = snap.index.present_files();
    let objects: usize = files.iter().map(|(_, f)| f.blobs.len()).sum();
    // Exactly ceil(objects × pct / 100) blobs, chosen at random.
    let chosen: std::collections::HashSet<usize> = if !opts.deep {
        std::collections::HashSet::new()
    } else if opts.sample_pct >= 100.0 {
        (0..objects).collect()
    } else {
        let k = ((objects as f64 * opts.sample_pct / 100.0).ceil() as usize).min(objects);
        rand::seq::index::sample(&mut rand::rng(), objects, k)
            .into_iter()
            .collect()
    };
    let mut report = VerifyReport::default();
    let mut n = 0usize;
    for (path, f) in &files {
        // A file carried inline is checked here, whatever the depth: its bytes are in hand.
        if let Err(e) = f.verified_inline_bytes() {
            report.problems.push((e.kind(), format!("{path}: {e}")));
        }
        for b in &f.blobs {
            let key = snap.blobs.key(&b.blob_id)?;
            let this = n;
            n += 1;
            report.objects += 1;
            match store.head(&key).await {
                Ok(meta) if meta.size != f.file_metadata.size => report.problems.push((
                    ErrorKind::Corrupt,
                    format!(
                        "{path}: blob {key} is {} bytes, the index says {}",
                        meta.size, f.file_metadata.size
                    ),
                )),
                Ok(_) => {
                    progress.fetch_add(f.file_metadata.size, Ordering::Relaxed);
                    if chosen.contains(&this) {
                        report.deep_checked += 1;
                        match hash_object(store, &key).await {
                            Ok((sha, _)) if Some(sha) != f.sha256 => report.problems.push((
                                ErrorKind::Corrupt,
                                format!(
                                    "{path}: blob {key} has SHA-256 {sha}, the index says {}",
                                    f.sha256.map(|s| s.to_hex()).unwrap_or_default()
                                ),
                            )),
                            Ok(_) => {}
                            Err(e) => report.problems.push((e.kind(), format!("{path}: {e}"))),
                        }
                    }
                }
                Err(e) => report
                    .problems
                    .push((e.kind(), format!("{path}: blob {key}: {e}"))),
            }
        }
    }
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_worst_problem_names_the_outcome() {
        let mut r = VerifyReport::default();
        assert_eq!(r.worst(), None);
        r.problems.push((ErrorKind::Transient, "slow".into()));
        assert_eq!(r.worst(), Some(ErrorKind::Transient));
        r.problems.push((ErrorKind::Corrupt, "bad hash".into()));
        assert_eq!(r.worst(), Some(ErrorKind::Corrupt));
        r.problems.push((ErrorKind::NotFound, "gone".into()));
        assert_eq!(r.worst(), Some(ErrorKind::NotFound));
    }

    #[test]
    fn a_share_is_a_percentage_of_a_deep_check() {
        let ok = |deep, sample_pct| VerifyOptions { deep, sample_pct }.validate().is_ok();
        assert!(ok(false, 100.0) && ok(true, 100.0) && ok(true, 0.5));
        assert!(!ok(true, 0.0) && !ok(true, 100.5) && !ok(true, f64::NAN) && !ok(false, 50.0));
    }
}
