//! Helpers shared by the benchmarks.

#![allow(dead_code)]

use std::path::Path;

use blobsnap::local::rocks::RocksStore;

/// The value of `--name VALUE` on the command line.
pub fn arg(name: &str) -> Option<String> {
    let args: Vec<String> = std::env::args().collect();
    args.iter()
        .position(|a| a == name)
        .and_then(|i| args.get(i + 1).cloned())
}

/// Write `bytes` of random (incompressible) 16 KiB values under keys `from..`, without WAL.
/// Returns the number of keys written.
pub fn fill(db: &RocksStore, from: u64, bytes: u64, seed: u64) -> u64 {
    use rand::{RngCore as _, SeedableRng as _};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let value = 16 << 10;
    let n = bytes / value;
    let mut wo = rocksdb::WriteOptions::default();
    wo.disable_wal(true);
    for chunk in (from..from + n).collect::<Vec<_>>().chunks(256) {
        let mut batch = rocksdb::WriteBatch::default();
        for i in chunk {
            let mut v = vec![0u8; value as usize];
            rng.fill_bytes(&mut v);
            batch.put(format!("key{i:012}"), v);
        }
        db.db().write_opt(batch, &wo).expect("write");
    }
    n
}

/// Bytes under `p`, recursively.
pub fn dir_size(p: &Path) -> u64 {
    let mut total = 0;
    for e in std::fs::read_dir(p).expect("read dir").flatten() {
        let md = e.metadata().expect("stat");
        total += if md.is_dir() {
            dir_size(&e.path())
        } else {
            md.len()
        };
    }
    total
}

/// MiB/s.
pub fn mbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / (1 << 20) as f64 / secs.max(1e-9)
}

/// The median (upper median of an even count).
pub fn median(mut v: Vec<f64>) -> f64 {
    if v.is_empty() {
        return f64::NAN;
    }
    v.sort_by(|a, b| a.total_cmp(b));
    v[v.len() / 2]
}
