//! Every metric the library publishes (through the `metrics` facade), in one table: its name,
//! kind, labels and what it means. The `blobsnap` command's Prometheus endpoint describes each
//! (`# HELP` / `# TYPE` lines) with [`describe`], and a job's tasks start their counters at 0
//! ([`register_task`]), so that a counter's series exists before its first increment: an
//! alert on `increase(...)` then sees the first failure, not only the second, and a missing
//! series means a missing task, never "nothing happened yet". Gauges and histograms appear
//! with their first value (a gauge at 0 would be a false reading: a last-commit time of 1970).
//!
//! The table is the documentation's source: `docs/metrics.md` holds it as rendered by
//! [`markdown_table`] (a test compares them), and a test scrapes a running demo for every
//! name in it.

/// What kind of series a metric is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (`_total`).
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of observations (seconds).
    Histogram,
}

impl Kind {
    fn as_str(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// One metric of the catalog.
#[derive(Clone, Copy, Debug)]
pub struct Metric {
    /// Its full name (`blobsnap_` prefix).
    pub name: &'static str,
    /// Counter, gauge or histogram.
    pub kind: Kind,
    /// Its label names, in order.
    pub labels: &'static [&'static str],
    /// What it measures, one line (the `# HELP` text).
    pub help: &'static str,
}

const fn m(
    name: &'static str,
    kind: Kind,
    labels: &'static [&'static str],
    help: &'static str,
) -> Metric {
    Metric {
        name,
        kind,
        labels,
        help,
    }
}

use Kind::{Counter, Gauge, Histogram};
const T: &[&str] = &["task"];
const TS: &[&str] = &["task", "store"];
const NONE: &[&str] = &[];

/// Every metric the library publishes.
pub const METRICS: &[Metric] = &[
    // A task's commits (the commit manager).
    m("blobsnap_commits_total", Counter, T, "Checkpoints committed by the task."),
    m("blobsnap_commit_failures_total", Counter, T, "Commits that failed (the task's error says why; the next commit retries)."),
    m("blobsnap_commit_abandoned_total", Counter, T, "Commits abandoned because their uploads outlived half the sweep's grace (3 in a row stop the task)."),
    m("blobsnap_commit_sync_seconds", Histogram, T, "The synchronous step of a commit: flush and RocksDB checkpoint of every store."),
    m("blobsnap_commit_upload_seconds", Histogram, T, "The asynchronous step of a commit: uploads, index PUTs and the checkpoint write."),
    m("blobsnap_commit_cleanup_seconds", Histogram, T, "The cleanup after a commit: history trim and one batch delete."),
    m("blobsnap_last_commit_timestamp_seconds", Gauge, T, "When the task last committed (Unix seconds); alert on its age."),
    m("blobsnap_cleanup_backlog", Gauge, T, "1 while a failed cleanup waits to be retried at the next commit, else 0."),
    m("blobsnap_cleanup_failures_total", Counter, T, "Cleanups that failed (retried at the next commit; the sweep collects what they leave)."),
    // A store's uploads (the backup manager).
    m("blobsnap_backup_uploads_total", Counter, TS, "Snapshots of the store uploaded (a new index)."),
    m("blobsnap_backup_carried_forward_total", Counter, TS, "Commits in which the store was unchanged and its marker carried forward (no request)."),
    m("blobsnap_backup_files_uploaded_total", Counter, TS, "Blobs uploaded (files the previous snapshot lacked)."),
    m("blobsnap_backup_bytes_uploaded_total", Counter, TS, "Bytes uploaded as blobs."),
    m("blobsnap_backup_files_retained_total", Counter, TS, "Files reused from the previous snapshot (no upload)."),
    m("blobsnap_backup_bytes_retained_total", Counter, TS, "Bytes of the files reused from the previous snapshot."),
    m("blobsnap_backup_files_deduplicated_total", Counter, TS, "Files whose content was already uploaded under another name (sent once)."),
    m("blobsnap_backup_bytes_hashed_total", Counter, TS, "Bytes read to hash files the hash cache could not vouch for."),
    m("blobsnap_backup_hash_cache_hits_total", Counter, TS, "Files whose SHA-256 came from the hash cache (not read)."),
    m("blobsnap_backup_requests_total", Counter, TS, "Store requests made by the store's uploads."),
    m("blobsnap_backup_files_to_upload", Gauge, TS, "Blobs the store's last upload sent."),
    m("blobsnap_backup_files_to_retain", Gauge, TS, "Files the store's last upload reused."),
    m("blobsnap_backup_files_to_remove", Gauge, TS, "Files the store's last snapshot dropped from the previous one."),
    m("blobsnap_backup_bytes_to_remove", Gauge, TS, "Bytes of the files the store's last snapshot dropped."),
    m("blobsnap_backup_scan_seconds", Histogram, TS, "Scanning and hashing the store's checkpoint dir."),
    m("blobsnap_backup_upload_seconds", Histogram, TS, "Uploading the store's new blobs and its index."),
    // Pre-upload (the blob backend's background uploads of finished table and blob files).
    m("blobsnap_preupload_files_total", Counter, TS, "Table and blob files uploaded as RocksDB finished them, before a commit needed them."),
    m("blobsnap_preupload_bytes_total", Counter, TS, "Bytes pre-uploaded."),
    m("blobsnap_preupload_used_files_total", Counter, TS, "Pre-uploaded files a commit named (it sent nothing for them)."),
    m("blobsnap_preupload_used_bytes_total", Counter, TS, "Bytes of the pre-uploaded files commits named."),
    m("blobsnap_preupload_waste_files_total", Counter, TS, "Pre-uploaded files no commit named (RocksDB deleted them first); their blobs are deleted."),
    m("blobsnap_preupload_waste_bytes_total", Counter, TS, "Bytes of the pre-uploads no commit named."),
    m("blobsnap_preupload_queue_depth", Gauge, TS, "Finished files waiting for their pre-upload now."),
    // Retention cleanup and the sweep.
    m("blobsnap_gc_blobs_deleted_total", Counter, T, "Blobs and indexes deleted by the task's retention cleanup."),
    m("blobsnap_gc_bytes_deleted_total", Counter, T, "Bytes deleted by the task's retention cleanup."),
    m("blobsnap_gc_sweep_objects_deleted_total", Counter, NONE, "Objects deleted by the sweep (orphans past the grace)."),
    m("blobsnap_gc_sweep_bytes_deleted_total", Counter, NONE, "Bytes deleted by the sweep."),
    m("blobsnap_gc_sweep_failures_total", Counter, NONE, "Scheduled sweeps that failed (closed: an unreadable root deletes nothing)."),
    // Restores.
    m("blobsnap_restore_files_downloaded_total", Counter, TS, "Files downloaded by restores of the store."),
    m("blobsnap_restore_bytes_downloaded_total", Counter, TS, "Bytes downloaded by restores of the store."),
    m("blobsnap_restore_files_reused_total", Counter, TS, "Local files a restore proved and kept instead of downloading."),
    m("blobsnap_restore_bytes_reused_total", Counter, TS, "Bytes of the local files restores kept."),
    m("blobsnap_restore_seconds", Histogram, T, "A task's restore, from its plan to the swap."),
    m("blobsnap_restore_fallbacks_total", Counter, T, "Restores that fell back to an older checkpoint than the latest."),
    m("blobsnap_lazy_background_retries_total", Counter, NONE, "Passes of a lazy restore's background download over files a transient failure left remote (after a backoff of 1 s doubling to 60 s; a corrupt or missing blob is never retried)."),
    m("blobsnap_task_first_message_seconds", Gauge, T, "From the task's start (claim, restore) to its first processed message."),
    m("blobsnap_standby_applied_seq", Gauge, T, "The checkpoint number a warm standby has applied."),
    m("blobsnap_standby_skipped_total", Counter, T, "Checkpoints a warm standby skipped (a newer one came first)."),
    // The store client.
    m("blobsnap_store_requests_total", Counter, &["op", "outcome"], "Requests to the object store, by operation and outcome."),
    m("blobsnap_store_retries_total", Counter, NONE, "Requests retried after a transient error."),
    m("blobsnap_store_throttled_total", Counter, NONE, "SlowDown / 503 answers (each halves the transfer window)."),
    m("blobsnap_transfers_in_flight", Gauge, NONE, "Transfers on the wire now (the process's one budget)."),
    m("blobsnap_transfer_window", Gauge, NONE, "Transfers the budget admits now (halved on throttling, grown back on success)."),
    m("blobsnap_urgent_transfers_total", Counter, NONE, "Transfers that found the window full and took the urgent lane (a lazy store's fetch RocksDB waited for)."),
    m("blobsnap_limit_wait_seconds", Histogram, &["limit"], "Time a transfer waited for a slot of a limit."),
];

/// Describe every metric to the installed recorder (its `# HELP` and `# TYPE` lines), and
/// start the unlabelled counters at 0. Call once, after installing a recorder.
pub fn describe() {
    for m in METRICS {
        match m.kind {
            Kind::Counter => metrics::describe_counter!(m.name, m.help),
            Kind::Gauge => metrics::describe_gauge!(m.name, m.help),
            Kind::Histogram => metrics::describe_histogram!(m.name, m.help),
        }
        if m.kind == Kind::Counter && m.labels.is_empty() {
            metrics::counter!(m.name).increment(0);
        }
    }
}

/// Start the counters of `task` and of its `stores` at 0 (a job runtime calls this when a
/// task starts; without a recorder it costs nothing).
pub fn register_task(task: &str, stores: &[String]) {
    for m in METRICS.iter().filter(|m| m.kind == Kind::Counter) {
        if m.labels == T {
            metrics::counter!(m.name, "task" => task.to_string()).increment(0);
        } else if m.labels == TS {
            for store in stores {
                metrics::counter!(m.name, "task" => task.to_string(), "store" => store.clone())
                    .increment(0);
            }
        }
    }
}

/// The catalog as the Markdown table `docs/metrics.md` holds.
pub fn markdown_table() -> String {
    let mut out =
        String::from("| metric | kind | labels | what it measures |\n|---|---|---|---|\n");
    for m in METRICS {
        let labels = if m.labels.is_empty() {
            "—".to_string()
        } else {
            m.labels.join(", ")
        };
        out.push_str(&format!(
            "| `{}` | {} | {} | {} |\n",
            m.name,
            m.kind.as_str(),
            labels,
            m.help
        ));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_prefixed_and_counters_end_in_total() {
        let mut seen = std::collections::BTreeSet::new();
        for m in METRICS {
            assert!(seen.insert(m.name), "{} twice", m.name);
            assert!(m.name.starts_with("blobsnap_"), "{}", m.name);
            assert_eq!(
                m.kind == Kind::Counter,
                m.name.ends_with("_total"),
                "{}: counters and only counters end in _total",
                m.name
            );
        }
    }

    /// Every name the library's source passes to a `metrics` macro is in the table, and every
    /// name in the table is used by the source.
    #[test]
    fn the_table_is_what_the_source_publishes() {
        let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
        let mut used = std::collections::BTreeSet::new();
        let mut stack = vec![root];
        while let Some(dir) = stack.pop() {
            for e in std::fs::read_dir(&dir).expect("src is readable") {
                let path = e.expect("a dir entry").path();
                if path.is_dir() {
                    stack.push(path);
                } else if path.extension().is_some_and(|x| x == "rs")
                    && !path.ends_with("telemetry.rs")
                {
                    let text = std::fs::read_to_string(&path).expect("a source file");
                    for (i, _) in text.match_indices("\"blobsnap_") {
                        let rest = &text[i + 1..];
                        let end = rest
                            .find(|c: char| !(c.is_ascii_lowercase() || c == '_'))
                            .unwrap_or(rest.len());
                        if rest[end..].starts_with('"') {
                            used.insert(rest[..end].to_string());
                        }
                    }
                }
            }
        }
        let table: std::collections::BTreeSet<String> =
            METRICS.iter().map(|m| m.name.to_string()).collect();
        assert_eq!(used, table, "the source's metric names against the table");
    }
}
