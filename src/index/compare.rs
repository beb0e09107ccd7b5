//! What changed between two snapshots of one store (`blobsnap diff`), by path and SHA-256.

use super::*;

/// How a file changed between two snapshots of a store ([`SnapshotIndex::compare`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Change {
    /// Only in the newer snapshot.
    Added,
    /// Only in the older one.
    Removed,
    /// In both, with other bytes (or without a SHA-256 to tell).
    Changed,
}

impl Change {
    /// `added`, `removed`, `changed`.
    pub fn as_str(&self) -> &'static str {
        match self {
            Change::Added => "added",
            Change::Removed => "removed",
            Change::Changed => "changed",
        }
    }
}

/// Files and bytes of one kind of change.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Tally {
    /// Files.
    pub files: u64,
    /// Their bytes (the newer size for added, changed and retained files).
    pub bytes: u64,
}

impl Tally {
    fn add(&mut self, size: u64) {
        self.files += 1;
        self.bytes += size;
    }
}

/// What changed between two snapshots of one store.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Comparison {
    /// Every file added, changed or removed, with its size: the newer snapshot's files in
    /// path order, then the removed ones.
    pub entries: Vec<(Change, String, u64)>,
    /// Added files.
    pub added: Tally,
    /// Removed files.
    pub removed: Tally,
    /// Changed files.
    pub changed: Tally,
    /// Files with the same bytes in both.
    pub retained: Tally,
}

impl SnapshotIndex {
    /// What changed from `self` (the older snapshot) to `newer`, by path and SHA-256.
    pub fn compare(&self, newer: &SnapshotIndex) -> Comparison {
        type Files = std::collections::BTreeMap<String, (Option<Sha256>, u64)>;
        let files = |i: &SnapshotIndex| -> Files {
            i.present_files()
                .into_iter()
                .map(|(p, f)| (p, (f.sha256, f.file_metadata.size)))
                .collect()
        };
        let (old, new) = (files(self), files(newer));
        let mut c = Comparison::default();
        for (p, (sha, size)) in &new {
            match old.get(p) {
                None => {
                    c.added.add(*size);
                    c.entries.push((Change::Added, p.clone(), *size));
                }
                Some((was, _)) if was == sha && sha.is_some() => c.retained.add(*size),
                Some(_) => {
                    c.changed.add(*size);
                    c.entries.push((Change::Changed, p.clone(), *size));
                }
            }
        }
        for (p, (_, size)) in &old {
            if !new.contains_key(p) {
                c.removed.add(*size);
                c.entries.push((Change::Removed, p.clone(), *size));
            }
        }
        c
    }
}
