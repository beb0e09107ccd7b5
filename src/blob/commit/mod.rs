//! The commit's path (DESIGN §7): the backup manager, the diff of a checkpoint dir against the committed index, pre-upload.

pub mod backup;
pub mod diff;
pub mod preupload;
