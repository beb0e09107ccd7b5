//! The commit's path (DESIGN §7): the backup manager (the scan of a checkpoint dir, its diff
//! against the committed index, the upload, the index it writes, what it keeps and lets go),
//! and pre-upload.

pub mod backup;
pub mod preupload;

/// The diff of a checkpoint dir against the committed index (it lives with the index build,
/// [`backup`]); the old path.
pub mod diff {
    pub use super::backup::{diff, DiffTotals, DirDiff};
}
