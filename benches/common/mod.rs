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

/// A field of `/proc/self/status` in MiB (`VmHWM:` the peak RSS, `VmRSS:` the RSS now).
fn status_mib(field: &str) -> f64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with(field))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|v| v.parse::<f64>().ok())
        })
        .unwrap_or(0.0)
        / 1024.0
}

/// The process's peak RSS since it started or since [`reset_peak_rss`], MiB.
pub fn peak_rss_mib() -> f64 {
    status_mib("VmHWM:")
}

/// The process's RSS now, MiB.
pub fn rss_mib() -> f64 {
    status_mib("VmRSS:")
}

/// Reset the peak RSS to the current RSS (Linux ≥ 4.0).
pub fn reset_peak_rss() {
    if let Err(e) = std::fs::write("/proc/self/clear_refs", "5") {
        eprintln!("cannot reset the peak RSS ({e}); peaks include what came before");
    }
}

/// A one-partition word-count job of one store, `counts`, committing every `commit_every`
/// messages, retention 2, a sweep grace of an hour and no periodic sweep.
pub fn one_task_job(
    name: &str,
    id: &str,
    state_dir: &Path,
    input_dir: &Path,
    commit_every: u64,
    unsafe_no_fencing: bool,
) -> blobsnap::job::JobSettings {
    blobsnap::job::JobSettings {
        job_name: name.into(),
        job_id: id.into(),
        state_dir: state_dir.to_path_buf(),
        input_dir: input_dir.to_path_buf(),
        stream: "lines".into(),
        partitions: 1,
        stores: vec!["counts".into()],
        commit_every,
        commit_interval: std::time::Duration::ZERO,
        retention: 2,
        unsafe_no_fencing,
        commit_max_delay: std::time::Duration::from_secs(600),
        sweep_every_commits: 0,
        gc_grace: std::time::Duration::from_secs(3600),
        restore_fallback: false,
        deployment_id: "bench".into(),
        create_resources: true,
        index_inline_below: blobsnap::blob::backup::INLINE_BELOW,
        restore_mode: blobsnap::job::RestoreMode::Full,
        lazy_download_rate: blobsnap::local::lazy::DEFAULT_RATE,
        pre_upload: false,
        start_from: None,
        start_from_id: None,
        retention_tiers: Vec::new(),
        stop: Default::default(),
    }
}
