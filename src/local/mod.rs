//! The local disk: RocksDB stores and their checkpoints, directory scans, the hash cache, the
//! store-dir lock.

pub mod hashcache;
pub mod lock;
pub mod rocks;
pub mod scan;
