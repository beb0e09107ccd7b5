//! Hostile input to every reader of untrusted bytes, for a fixed time: the CheckpointV1/V2
//! JSON reader, the SnapshotIndex reader, the savepoint record, checkpoint document and start-from record readers, and the marker, checkpoint id, key (a fork pin's too) and scope
//! parsers. A mutational fuzzer (seeded; inputs grown from valid documents by byte flips,
//! splices, duplications, number swaps to huge / negative / fractional values, deep nesting
//! and truncation, plus plain random bytes) runs each target on a
//! fixed number of inputs (`BLOBSNAP_FUZZ_INPUTS`, default 50,000: the same seeded inputs on
//! every machine, however fast) or, with `BLOBSNAP_FUZZ_SECS` set, for that many seconds (the
//! long-test command: 600). Every input must return (`Ok` or a classified
//! `Err`), never panic, and allocate at most a bounded multiple of its own size — measured by
//! a counting global allocator (`stats_alloc`) around each call. An index over the 64 MiB cap
//! is refused before a byte of it is parsed.

use std::alloc::System;
use std::time::{Duration, Instant};

use blobsnap::checkpoint::{Checkpoint, CheckpointId};
use blobsnap::index::{IndexMarker, SnapshotIndex, MAX_INDEX_BYTES};
use rand::{Rng as _, SeedableRng as _};
use stats_alloc::{Region, StatsAlloc, INSTRUMENTED_SYSTEM};

#[global_allocator]
static GLOBAL: &StatsAlloc<System> = &INSTRUMENTED_SYSTEM;

// Seeds the readers accept (asserted below): Samza's V2 shape (SSP keys
// `system.stream.partition`; markers of the blob backend and of Samza's changelog backend,
// whose marker is itself JSON), and Samza's V1 shape (entries keyed by the SSP's string form,
// each an object of system, stream, partition, offset).
const CHECKPOINT_V2: &str = r#"{"checkpoint-id":"1614147487244-33","input-offsets":{"kafka.topic.0":"42","kafka.topic.with.dots.1":"7"},"state-checkpoint-markers":{"blobsnap.BlobStoreStateBackendFactory":{"counts":"index/1614147487244-33.9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.json"},"org.apache.samza.storage.KafkaChangelogStateBackendFactory":{"inMemoryStore":"{\"version\":1,\"changelog-ssp\":{\"system\":\"kafka\",\"partition\":0,\"stream\":\"changelog\",\"keyBucket\":-1},\"changelog-offset\":\"1234\"}"}},"version":2}"#;
const CHECKPOINT_V1: &str = r#"{"SystemStreamPartition [kafka, words, 0]":{"system":"kafka","stream":"words","partition":"0","offset":"100"},"SystemStreamPartition [kafka, words.x, 1]":{"system":"kafka","stream":"words.x","partition":"1","offset":"7"}}"#;
const INDEX: &str = r#"{"format-version":1,"creation-time-millis":1614147487244,"snapshot-metadata":{"checkpoint-id":"1614147487244-33","job-name":"wordcount","job-id":"1","task-name":"Partition 0","store-name":"counts"},"dir-index":{"dir-name":"","files-present":[{"file-name":"000012.sst","blobs":[{"blob-id":"blobs/1614147487244-33/9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08","offset":0}],"file-metadata":{"creation-time-millis":1,"last-modified-time-millis":2,"size":4,"owner":"u","group":"g","permissions":"rw-r--r--"},"checksum":123,"sha256":"9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}],"files-removed":[],"sub-dirs-present":[{"dir-name":"sub","files-present":[],"files-removed":[],"sub-dirs-present":[],"sub-dirs-removed":[]}],"sub-dirs-removed":[]},"prev-snapshot-index-blob-id":null}"#;
const MARKER: &str =
    "index/1614147487244-33.9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08.json";

const NUMBERS: &[&str] = &[
    "-1",
    "0",
    "18446744073709551615",
    "18446744073709551616",
    "-9223372036854775809",
    "1e308",
    "1.5",
    "4611686018427387904",
    "NaN",
    "null",
    "\"\"",
    "[]",
    "{}",
];
const NAMES: &[&str] = &[
    "..",
    ".",
    "",
    "/etc/passwd",
    "a/b",
    "a\\u0000b",
    "\\u0000",
    "../../x",
    "C:\\\\x",
    "\\ud800",
    "blobs/../../other",
];

fn mutate(rng: &mut rand::rngs::StdRng, seed: &[u8]) -> Vec<u8> {
    let mut v = seed.to_vec();
    for _ in 0..rng.random_range(1..6) {
        if v.is_empty() {
            v.push(rng.random());
            continue;
        }
        let at = rng.random_range(0..v.len());
        match rng.random_range(0..10) {
            0 => v[at] ^= 1 << rng.random_range(0..8),
            1 => v[at] = rng.random(),
            2 => {
                v.truncate(at);
            }
            3 => {
                // Duplicate a slice (duplicate keys, entries).
                let end = rng.random_range(at..v.len().min(at + 200) + 1);
                let piece = v[at..end].to_vec();
                let to = rng.random_range(0..=v.len());
                v.splice(to..to, piece);
            }
            4 => {
                // Replace a number with a hostile one.
                let n = NUMBERS[rng.random_range(0..NUMBERS.len())].as_bytes();
                if let Some(p) = v[at..].iter().position(|b| b.is_ascii_digit()) {
                    let start = at + p;
                    let len = v[start..].iter().take_while(|b| b.is_ascii_digit()).count();
                    v.splice(start..start + len, n.iter().copied());
                }
            }
            5 => {
                // Replace a string value with a hostile name.
                let n = NAMES[rng.random_range(0..NAMES.len())].as_bytes();
                if let Some(p) = v[at..].iter().position(|&b| b == b'"') {
                    let start = at + p + 1;
                    if let Some(len) = v[start..].iter().position(|&b| b == b'"') {
                        v.splice(start..start + len, n.iter().copied());
                    }
                }
            }
            6 => {
                // Deep nesting.
                let depth = rng.random_range(1..2000);
                let mut nest = vec![b'['; depth];
                nest.extend(std::iter::repeat_n(b']', depth));
                v.splice(at..at, nest);
            }
            7 => {
                v.remove(at);
            }
            8 => {
                let b: u8 = rng.random();
                v.insert(at, b);
            }
            _ => {
                // Splice in random bytes.
                let n = rng.random_range(1..32);
                let r: Vec<u8> = (0..n).map(|_| rng.random()).collect();
                v.splice(at..at, r);
            }
        }
    }
    v
}

/// How long a target is fuzzed: a fixed number of inputs (CI: the same inputs everywhere) or
/// a wall-clock time (the long run).
#[derive(Clone, Copy, Debug)]
enum Budget {
    Inputs(u64),
    Secs(u64),
}

impl Budget {
    fn from_env() -> Budget {
        let var = |name: &str| std::env::var(name).ok().and_then(|v| v.parse().ok());
        match (var("BLOBSNAP_FUZZ_SECS"), var("BLOBSNAP_FUZZ_INPUTS")) {
            (Some(secs), _) => Budget::Secs(secs),
            (None, inputs) => Budget::Inputs(inputs.unwrap_or(50_000)),
        }
    }

    fn more(self, done: u64, deadline: Instant) -> bool {
        match self {
            Budget::Inputs(n) => done < n,
            Budget::Secs(_) => Instant::now() < deadline,
        }
    }
}

/// Fuzz `target` from `seeds` within `budget`; returns (inputs, accepted). Every call must
/// return and allocate at most `64 x len + 1 MiB` in all. Every seed must be accepted (a seed
/// the reader refuses grows only garbage), and at least `min_share` of the inputs must be:
/// the mutants reach past the first field into the reader's depth.
fn fuzz(
    name: &str,
    seeds: &[&[u8]],
    budget: Budget,
    min_share: f64,
    target: impl Fn(&[u8]) -> bool,
) -> (u64, u64) {
    for seed in seeds {
        assert!(
            target(seed),
            "{name}: the seed {:?} is refused by its own reader",
            String::from_utf8_lossy(seed)
        );
    }
    let mut rng = rand::rngs::StdRng::seed_from_u64(0xb10b5 ^ name.len() as u64);
    let started = Instant::now();
    let deadline = match budget {
        Budget::Secs(secs) => started + Duration::from_secs(secs),
        Budget::Inputs(_) => started,
    };
    let (mut n, mut ok, mut worst) = (0u64, 0u64, 0u64);
    while budget.more(n, deadline) {
        for _ in 0..256 {
            if let Budget::Inputs(max) = budget {
                if n >= max {
                    break;
                }
            }
            let input = if rng.random_range(0..8) == 0 {
                let len = rng.random_range(0..512);
                (0..len).map(|_| rng.random()).collect()
            } else {
                let seed = seeds[rng.random_range(0..seeds.len())];
                mutate(&mut rng, seed)
            };
            let region = Region::new(GLOBAL);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
            let mut allocated = region.change().bytes_allocated as u64;
            // The allocator's counts are the whole process's: a test running beside this one
            // adds to them. A parser's allocations for one input are the same every time, so
            // the least of a few measurements is its own (noise only adds).
            for _ in 0..5 {
                if allocated <= 64 * input.len() as u64 + (1 << 20) {
                    break;
                }
                let region = Region::new(GLOBAL);
                let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| target(&input)));
                allocated = allocated.min(region.change().bytes_allocated as u64);
            }
            let r = result.unwrap_or_else(|_| {
                panic!(
                    "{name} panicked on input {:?}",
                    String::from_utf8_lossy(&input)
                )
            });
            let bound = 64 * input.len() as u64 + (1 << 20);
            assert!(
                allocated <= bound,
                "{name}: {allocated} bytes allocated for a {}-byte input: {:?}",
                input.len(),
                String::from_utf8_lossy(&input[..input.len().min(300)])
            );
            worst = worst.max(allocated);
            n += 1;
            ok += r as u64;
        }
    }
    eprintln!(
        "fuzz {name}: {n} inputs in {:.1} s, {ok} accepted ({:.1} %), 0 panics, largest allocation {} KiB",
        started.elapsed().as_secs_f64(),
        100.0 * ok as f64 / n.max(1) as f64,
        worst >> 10
    );
    assert!(n > 1000, "{name}: only {n} inputs ({budget:?})");
    assert!(
        ok as f64 >= min_share * n as f64,
        "{name}: only {ok} of {n} inputs accepted (under {:.1} %): the mutants do not get past the reader's first checks",
        min_share * 100.0
    );
    (n, ok)
}

/// The four targets in one test, one after another. The allocator's counts are the whole
/// process's (the `it` binary's other tests run beside it): `fuzz` keeps the least of a few
/// measurements of an input over the bound, which only noise can inflate.
#[test]
fn hostile_input_never_panics_and_allocation_stays_bounded() {
    let budget = Budget::from_env();
    fuzz(
        "checkpoint reader",
        &[CHECKPOINT_V2.as_bytes(), CHECKPOINT_V1.as_bytes()],
        budget,
        0.01,
        |b| Checkpoint::from_json(b).is_ok(),
    );
    fuzz("index reader", &[INDEX.as_bytes()], budget, 0.005, |b| {
        SnapshotIndex::from_slice(b).is_ok()
    });
    // The savepoint record reader (issue 47): every record a listing or a collector reads.
    let savepoint = format!(
        r#"{{"format":1,"name":"nightly","job-name":"wc","job-id":"1","created-millis":1614147487244,"at":"latest","tasks":{{"Partition 0":{{"seq":3,"checkpoint":{CHECKPOINT_V2}}}}}}}"#
    );
    let key =
        blobsnap::blobstore::BlobKey::new("wc/1/savepoints/nightly.json".to_string()).unwrap();
    fuzz(
        "savepoint record reader",
        &[savepoint.as_bytes()],
        budget,
        0.005,
        |b| blobsnap::blob::savepoint::parse_record(b, &key).is_ok(),
    );
    // A task's checkpoint document (a checkpoint, or the record of its removal) and its
    // start-from record (issue 47): every document a listing, a restore or a collector reads.
    let document =
        format!(r#"{{"blobsnap-checkpoint":1,"seq":3,"writer":"w","checkpoint":{CHECKPOINT_V2}}}"#);
    let removed = r#"{"blobsnap-checkpoint":1,"seq":4,"writer":"w","removed":{"at-millis":1,"reason":"cut short"}}"#;
    fuzz(
        "checkpoint document reader",
        &[document.as_bytes(), removed.as_bytes()],
        budget,
        0.01,
        |b| blobsnap::checkpoint::parse_entry(b).is_ok(),
    );
    let start = r#"{"start-from":"savepoint:wc/1/nightly","seq":7,"checkpoint-id":"1614147487244-33","pins":[{"source-job":"wc","source-id":"1","savepoint":"nightly","fork-job":"f","fork-id":"1","task":"Partition 0"}]}"#;
    let start_key =
        blobsnap::blobstore::BlobKey::new("wc/1/start-from/Partition 0.json".to_string()).unwrap();
    fuzz(
        "start-from record reader",
        &[start.as_bytes()],
        budget,
        0.01,
        |b| blobsnap::blob::record::parse_start_from(b, &start_key).is_ok(),
    );
    fuzz(
        "marker, id, key and scope parsers",
        &[MARKER.as_bytes(), b"1614147487244-33", b"a/b/c", b"scope/"],
        budget,
        0.05,
        |b| {
            let s = String::from_utf8_lossy(b);
            let m = s.parse::<IndexMarker>().is_ok();
            let i = s.parse::<CheckpointId>().is_ok();
            let k = blobsnap::blobstore::BlobKey::new(s.to_string()).is_ok();
            let sc = blobsnap::blobstore::Scope::new(s.to_string()).is_ok();
            let u = blobsnap::blobstore::unescape_segment(&s).is_ok();
            // A fork's pin is named by its key alone: the layout's parser reads it.
            let p = blobsnap::blobstore::BlobKey::new(s.to_string())
                .ok()
                .and_then(|k| blobsnap::layout::parse(&k))
                .is_some();
            m | i | k | sc | u | p
        },
    );

    // The cap: an index over it is refused before parsing (no allocation proportional to
    // its size beyond the input itself).
    let big = vec![b' '; (MAX_INDEX_BYTES + 1) as usize];
    let region = Region::new(GLOBAL);
    let e = SnapshotIndex::from_slice(&big).unwrap_err();
    let allocated = region.change().bytes_allocated;
    assert_eq!(e.kind(), blobsnap::ErrorKind::Corrupt, "{e}");
    assert!(
        allocated < 64 << 10,
        "{allocated} bytes allocated to refuse it"
    );
}

/// The coverage-guided fuzzer's seeds (fuzz/corpus/, scripts/fuzz.sh) are documents the
/// readers accept — Samza's V1/V2 checkpoints, one the demo wrote, real indexes — so
/// libFuzzer starts inside the parsers, not at their first byte.
#[test]
fn the_libfuzzer_seeds_parse() {
    let corpus = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/corpus");
    let files = |t: &str| -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(corpus.join(t))
            .unwrap()
            .flatten()
            .map(|e| {
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        assert!(v.len() >= 2, "{t}: seeds {v:?}");
        v
    };
    for (name, bytes) in files("checkpoint") {
        Checkpoint::from_json(&bytes).unwrap_or_else(|e| panic!("checkpoint seed {name}: {e}"));
    }
    for (name, bytes) in files("index") {
        SnapshotIndex::from_slice(&bytes).unwrap_or_else(|e| panic!("index seed {name}: {e}"));
    }
    let parsers = files("parsers");
    let text = |n: &str| {
        String::from_utf8(parsers.iter().find(|(f, _)| f == n).unwrap().1.clone()).unwrap()
    };
    text("marker").parse::<IndexMarker>().unwrap();
    text("id").parse::<CheckpointId>().unwrap();
    blobsnap::blobstore::BlobKey::new(text("key")).unwrap();
    blobsnap::blobstore::Scope::new(text("scope")).unwrap();
    let records = files("records");
    let seed = |n: &str| records.iter().find(|(f, _)| f == n).unwrap().1.clone();
    let key =
        blobsnap::blobstore::BlobKey::new("wc/1/savepoints/nightly.json".to_string()).unwrap();
    blobsnap::blob::savepoint::parse_record(&seed("savepoint.json"), &key).unwrap();
    assert!(matches!(
        blobsnap::checkpoint::parse_entry(&seed("checkpoint-document.json")).unwrap(),
        blobsnap::checkpoint::Record::Checkpoint(_)
    ));
    assert!(matches!(
        blobsnap::checkpoint::parse_entry(&seed("checkpoint-removed.json")).unwrap(),
        blobsnap::checkpoint::Record::Removed { seq: 4, .. }
    ));
    let key =
        blobsnap::blobstore::BlobKey::new("wc/1/start-from/Partition 0.json".to_string()).unwrap();
    assert_eq!(
        blobsnap::blob::record::parse_start_from(&seed("start-from.json"), &key)
            .unwrap()
            .pins
            .len(),
        1
    );
    let pin = String::from_utf8(seed("fork-pin-key")).unwrap();
    let parsed = blobsnap::layout::parse(&blobsnap::blobstore::BlobKey::new(pin.clone()).unwrap());
    assert!(
        matches!(
            parsed.as_ref().map(|p| &p.kind),
            Some(blobsnap::layout::KeyKind::ForkPin { .. })
        ),
        "{pin}: {parsed:?}"
    );
}
