//! # blobsnap
//!
//! The blob-store state backend for stream-processing jobs whose tasks keep local state in
//! RocksDB and commit **CheckpointV2** checkpoints (Apache Samza's model).
//!
//! At every commit a task's stores are snapshotted (a RocksDB checkpoint: hard links, fast),
//! then uploaded asynchronously as content-addressed, deduplicated blobs to S3 or a local
//! directory; one [`SnapshotIndex`](index::SnapshotIndex) per store lists the snapshot's files,
//! and the index's key becomes the store's *marker* in the CheckpointV2. Restore reads the
//! markers, compares each index with the local files, and downloads only what is missing,
//! verified. Cleanup deletes what no retained snapshot needs.
//!
//! ## Floors
//!
//! From the ground up; a module imports only modules on lower floors.
//!
//! - [`error`], [`redact`], [`units`], [`telemetry`]: one [`Error`] with an actionable
//!   [`ErrorKind`]; secrets scrubbed from logs; sizes and durations in settings; the catalog
//!   of every metric the library publishes.
//! - [`id`], [`digest`], [`crash`]: [`CheckpointId`](id::CheckpointId); SHA-256 / CRC32;
//!   named crash and hold points for the tests.
//! - [`blobstore`]: the [`BlobStore`](blobstore::BlobStore) trait, the local and S3 stores,
//!   and the layers that wrap one trait: retry, the process's transfer budget
//!   ([`limit`](blobstore::limit)), counting (metrics), fault injection.
//! - [`config`]: settings (TOML + `BLOBSNAP_*` env) and the wiring that opens a store with
//!   its layers.
//! - [`index`], [`backend`]: the snapshot index format and markers; the state-backend SPI
//!   (Samza's `TaskBackupManager` & co., async).
//! - [`checkpoint`], [`layout`], [`local`]: CheckpointV1/V2 JSON (Samza-compatible) and the
//!   [`CheckpointStore`](checkpoint::CheckpointStore); the bucket layout (DESIGN §5); RocksDB
//!   stores ([`StoreEngine`](backend::StoreEngine)), directory scans, the hash cache, the
//!   store-dir lock, the atomic swap of a restored tree ([`local::swap`]), the lazy restore's
//!   file system ([`local::lazy`]).
//! - [`commit`]: the commit manager, driving every backend of a task through the SPI.
//! - [`blob`]: the blob-store backend. [`blob::load_snapshot`] is the one way a snapshot is
//!   read and checked; [`blob::backup`] (scan, diff, dedup upload, index → marker),
//!   [`blob::restore`] (`plan` — an inventory and a pure `decide` — then `execute`),
//!   [`blob::gc`] (the sweep, streamed page by page), [`blob::admin`] (resources, leases),
//!   [`blob::cost`] (what a job costs, from its retained checkpoints),
//!   [`blob::factory`] (the [`StateBackendFactory`](backend::StateBackendFactory) the runtime
//!   builds its managers through).
//! - [`job`]: a small CheckpointV2 job runtime, the demo job, and a task's warm standby
//!   ([`job::standby`]: follows its commits read-only so that a failover downloads little).
//!
//! ## `unsafe`
//!
//! Denied crate-wide and allowed in one module only, `local::lazy::ffi` (private): the lazy
//! restore needs RocksDB to use a file system of ours, which rust-rocksdb cannot express, so
//! a small C++ `FileSystemWrapper` (`cpp/lazy_fs.cc`, built against the bundled RocksDB's
//! headers) is registered with RocksDB under the Env name `blobsnap-lazy` and calls back into
//! Rust; that registration call, its six callbacks, and three calls on RocksDB itself
//! (widening the default thread pools, `SetDBOptions` through the C API, reading the
//! SstFileManager's total) are the crate's only FFI. The module's
//! docs give the safety argument; a test fails if any other file allows `unsafe_code`.
//!
//! The `blobsnap` command is `src/main.rs` (parse, runtime, exit codes) and `src/cli/`, one
//! module per command; `examples/embed.rs` drives a processing loop of its own through the
//! factory and the commit manager.
//!
//! ## A first look, on the local store
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> blobsnap::Result<()> {
//! use blobsnap::blobstore::{local::LocalStore, BlobStore, PutBody, PutOptions, get_bytes};
//! use blobsnap::digest::Sha256;
//! use blobsnap::layout::{JobScope, StoreScope};
//!
//! let dir = tempfile::tempdir().unwrap();
//! let store = LocalStore::new(dir.path())?;
//! let scope = JobScope::new("wordcount", "1")?.store("Partition 0", "counts")?;
//! let bytes = b"hello".to_vec();
//! let sha = Sha256::of(&bytes);
//! let key = scope.key(&StoreScope::blob_id("1700000000000-0".parse()?, sha))?;
//! store.put(&key, PutBody::Bytes(bytes.into()), PutOptions::create_only(sha)).await?;
//! assert_eq!(&get_bytes(&store, &key, 1 << 20).await?[..], b"hello");
//! // Writing the same key again, create-only as blobs always are, is refused: a blob is
//! // never overwritten, and the first bytes stay.
//! let other = b"x".to_vec();
//! let again = store
//!     .put(&key, PutBody::Bytes(other.clone().into()), PutOptions::create_only(Sha256::of(&other)))
//!     .await;
//! assert_eq!(again.unwrap_err().kind(), blobsnap::ErrorKind::Conflict);
//! assert_eq!(&get_bytes(&store, &key, 1 << 20).await?[..], b"hello");
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

pub mod backend;
pub mod blob;
pub mod blobstore;
pub mod checkpoint;
pub mod commit;
pub mod config;
pub mod crash;
pub mod digest;
pub mod error;
pub mod id;
pub mod index;
pub mod job;
pub mod layout;
pub mod local;
pub mod redact;
pub mod retention;
pub mod telemetry;
pub mod units;

pub use error::{Error, ErrorKind, Result};
