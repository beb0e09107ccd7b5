//! The local disk: RocksDB stores and their checkpoints, directory scans, the hash cache, the
//! store-dir lock, and the atomic swap of a restored tree into a store dir.

pub mod hashcache;
pub mod lock;
pub mod rocks;
pub mod scan;
pub mod swap;
