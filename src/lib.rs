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
//! - [`error`]: one [`Error`] with an actionable [`ErrorKind`].
//! - [`config`]: settings (TOML + `BLOBSNAP_*` env).
//! - [`digest`]: SHA-256 / CRC32.
//! - [`blobstore`]: the [`BlobStore`](blobstore::BlobStore) trait, the local and S3 stores, and
//!   the retry, counting and fault-injection layers.
//! - [`index`]: the snapshot index format and markers.
//! - [`layout`]: the bucket layout (DESIGN §5).
//! - [`local`]: RocksDB stores ([`StoreEngine`](backend::StoreEngine)), directory scans and
//!   the hash cache.
//! - [`checkpoint`]: checkpoint ids, CheckpointV1/V2 JSON (Samza-compatible), the
//!   [`CheckpointStore`](checkpoint::CheckpointStore) trait.
//! - [`backend`]: the state-backend SPI (Samza's `TaskBackupManager` & co., async).
//! - [`blob`]: the blob-store backend: backup (scan, diff, dedup upload, index → marker).
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
pub mod units;

pub use error::{Error, ErrorKind, Result};
