//! The local disk: RocksDB stores and their checkpoints, directory scans, the hash cache.

pub mod hashcache;
pub mod rocks;
pub mod scan;
