//! The blob-store state backend: one wing that implements the SPI of [`backend`](crate::backend)
//! over any [`BlobStore`](crate::blobstore::BlobStore). Its folders are the table of contents
//! of the design's §7–§10:
//!
//! - [`commit`]: the commit's path — scan a checkpoint dir (hash cache), diff it against the
//!   last *committed* index ([`commit::diff`]), PUT only content the committed snapshot does
//!   not reference (and pre-upload tables as RocksDB finishes them: [`commit::preupload`]),
//!   write the index, return its key as the marker, hand back what left retention
//!   ([`commit::backup::BlobBackupManager`]).
//! - [`restore`]: plan (reuse local bytes, download what is missing), execute into a staging
//!   dir with verified downloads, swap atomically ([`restore::BlobRestoreManager`]).
//! - [`time`]: state through time — every retained checkpoint and references to one
//!   ([`time::history`]), savepoints ([`time::savepoint`]), forks ([`time::fork`]), the records
//!   they all read ([`time::record`]), manual backups ([`time::manual`]).
//! - [`collect`]: the sweep ([`collect::gc`]), resources and writer leases ([`collect::admin`]).
//! - [`inspect`]: `check`, `usage`, `cost`, `verify`.
//! - [`snapshot`]: reading and checking one snapshot, used by all of them; [`factory`]: the
//!   backend's factory (the SPI's entry).
//!
//! The modules keep their earlier paths too (`blob::backup`, `blob::savepoint`, …: re-exports).
//! Markers are stored in CheckpointV2 under [`FACTORY_NAME`].

pub mod collect;
pub mod commit;
pub mod factory;
pub mod inspect;
pub mod restore;
pub mod snapshot;
pub mod time;

pub use collect::{admin, gc, remove};
pub use commit::{backup, diff, preupload};
pub use inspect::{check, cost, usage, verify};
pub use snapshot::*;
pub use time::{fork, history, manual, prepared, record, savepoint};
