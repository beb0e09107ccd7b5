//! The local disk: RocksDB stores and their checkpoints, directory scans, the hash cache, the
//! store-dir lock, what a command may replace (the guard), the atomic swap of a restored tree into a store dir, and the lazy restore's
//! file system.

pub mod engine;
pub mod events;
pub mod guard;
pub mod lazy;
pub mod lock;
pub mod rocks;
pub mod scan;
/// The hash cache lives with the scan it serves ([`scan`]); its old path resolves.
pub use self::scan as hashcache;
pub mod swap;
