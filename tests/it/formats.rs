//! Wire formats: Samza's CheckpointV2/V1 vectors (reference §2.2, §2.4), the snapshot index
//! (§2.3) and hostile indexes.

use std::collections::BTreeMap;

use blobsnap::checkpoint::{Checkpoint, CheckpointId, CheckpointV1, CheckpointV2, Ssp};
use blobsnap::digest::Sha256;
use blobsnap::index::{
    DirIndex, FileBlob, FileIndex, FileMetadata, SnapshotIndex, SnapshotMetadata, FORMAT_V1,
    FORMAT_VERSION, MAX_INDEX_BYTES,
};
use blobsnap::ErrorKind;
use proptest::prelude::*;

const VECTOR_1: &str = r#"{"checkpoint-id":"1234-567","input-offsets":{"test-system.test-stream.777":"1"},"state-checkpoint-markers":{"factory2":{"store1":"marker3","store2":"marker4"},"factory1":{"store1":"marker1","store2":"marker2"}},"version":2}"#;

const VECTOR_1B: &str = r#"{"checkpoint-id":"1700000000123-456789","input-offsets":{"kafka.inputTopic.0":"42"},"state-checkpoint-markers":{"org.apache.samza.storage.KafkaChangelogStateBackendFactory":{"inMemoryStore":"{\"version\":1,\"changelog-ssp\":{\"system\":\"kafka\",\"partition\":0,\"stream\":\"inMemoryStoreChangelog\",\"keyBucket\":-1},\"changelog-offset\":\"1234\"}"},"org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory":{"regularStore":"snapshot-index-blob-regularStore"}},"version":2}"#;

const FIRST_COMMIT_INDEX: &str = r#"{"creation-time-millis":1234567,"snapshot-metadata":{"checkpoint-id":"1234-567","job-name":"testJobName","job-id":"testJobID","task-name":"testTaskName","store-name":"testStoreName"},"dir-index":{"dir-name":"","files-present":[],"files-removed":[],"sub-dirs-present":[],"sub-dirs-removed":[]},"prev-snapshot-index-blob-id":null}"#;

fn markers(entries: &[(&str, &str, &str)]) -> BTreeMap<String, BTreeMap<String, String>> {
    let mut m: BTreeMap<String, BTreeMap<String, String>> = BTreeMap::new();
    for (f, s, v) in entries {
        m.entry(f.to_string())
            .or_default()
            .insert(s.to_string(), v.to_string());
    }
    m
}

#[test]
fn samza_vector_1_parses_to_its_values() {
    let cp = Checkpoint::from_json(VECTOR_1.as_bytes()).unwrap();
    let expected = CheckpointV2 {
        id: "1234-567".parse().unwrap(),
        input_offsets: [(Ssp::new("test-system", "test-stream", 777), "1".to_string())].into(),
        state_checkpoint_markers: markers(&[
            ("factory1", "store1", "marker1"),
            ("factory1", "store2", "marker2"),
            ("factory2", "store1", "marker3"),
            ("factory2", "store2", "marker4"),
        ]),
    };
    assert_eq!(cp, Checkpoint::V2(expected.clone()));
    // What we write parses back to the same value, and is byte-stable.
    let bytes = expected.to_json().unwrap();
    assert_eq!(
        Checkpoint::from_json(&bytes).unwrap(),
        Checkpoint::V2(expected.clone())
    );
    assert_eq!(
        String::from_utf8(bytes).unwrap(),
        r#"{"checkpoint-id":"1234-567","input-offsets":{"test-system.test-stream.777":"1"},"state-checkpoint-markers":{"factory1":{"store1":"marker1","store2":"marker2"},"factory2":{"store1":"marker3","store2":"marker4"}},"version":2}"#
    );
}

#[test]
fn samza_vector_1b_parses_with_nested_kafka_marker() {
    let cp = Checkpoint::from_json(VECTOR_1B.as_bytes()).unwrap();
    let v2 = cp.as_v2().unwrap();
    assert_eq!(v2.id.to_string(), "1700000000123-456789");
    assert_eq!(v2.input_offsets[&Ssp::new("kafka", "inputTopic", 0)], "42");
    assert_eq!(
        v2.marker(
            "org.apache.samza.storage.blobstore.BlobStoreStateBackendFactory",
            "regularStore"
        ),
        Some("snapshot-index-blob-regularStore")
    );
    let kafka = v2
        .marker(
            "org.apache.samza.storage.KafkaChangelogStateBackendFactory",
            "inMemoryStore",
        )
        .unwrap();
    let nested: serde_json::Value = serde_json::from_str(kafka).unwrap();
    assert_eq!(nested["changelog-offset"], "1234");
    assert_eq!(Checkpoint::from_json(&cp.to_json().unwrap()).unwrap(), cp);
}

#[test]
fn v2_reading_ignores_unknown_fields_and_order_and_keeps_dotted_streams() {
    let doc = r#"{"version":2,"extra":{"x":1},"state-checkpoint-markers":{},"input-offsets":{"kafka.page.views.v2.3":"17"},"checkpoint-id":"5-6"}"#;
    let cp = Checkpoint::from_json(doc.as_bytes()).unwrap();
    let v2 = cp.as_v2().unwrap();
    assert_eq!(
        v2.input_offsets[&Ssp::new("kafka", "page.views.v2", 3)],
        "17"
    );
    assert!(v2.state_checkpoint_markers.is_empty());
}

#[test]
fn v1_is_read_as_samza_writes_it() {
    let doc = r#"{"SystemStreamPartition [kafka, words, 0]":{"system":"kafka","stream":"words","partition":"0","offset":"100"},"SystemStreamPartition [kafka, words.x, 1]":{"system":"kafka","stream":"words.x","partition":"1","offset":"7"}}"#;
    let cp = Checkpoint::from_json(doc.as_bytes()).unwrap();
    assert_eq!(cp.version(), 1);
    assert_eq!(cp.offsets()[&Ssp::new("kafka", "words", 0)], "100");
    assert_eq!(cp.offsets()[&Ssp::new("kafka", "words.x", 1)], "7");
    assert!(cp.as_v2().is_none());
    let v1 = CheckpointV1 {
        offsets: cp.offsets().clone(),
    };
    assert_eq!(Checkpoint::from_json(&v1.to_json().unwrap()).unwrap(), cp);
}

#[test]
fn malformed_checkpoints_are_corrupt_with_a_reason() {
    for (doc, needle) in [
        ("", "not valid JSON"),
        ("[]", "not an object"),
        (
            r#"{"checkpoint-id":1234,"input-offsets":{},"state-checkpoint-markers":{}}"#,
            "must be a string",
        ),
        (
            r#"{"checkpoint-id":"12-x","input-offsets":{},"state-checkpoint-markers":{}}"#,
            "seq",
        ),
        (
            r#"{"checkpoint-id":"1-2","state-checkpoint-markers":{}}"#,
            "input-offsets",
        ),
        (
            r#"{"checkpoint-id":"1-2","input-offsets":{"nodots":"1"},"state-checkpoint-markers":{}}"#,
            "SSP key",
        ),
        (
            r#"{"checkpoint-id":"1-2","input-offsets":{"a.b.1":null},"state-checkpoint-markers":{}}"#,
            "offset",
        ),
        (
            r#"{"checkpoint-id":"1-2","input-offsets":{},"state-checkpoint-markers":{"f":{"s":5}}}"#,
            "marker of store",
        ),
        (
            r#"{"SystemStreamPartition [a, b, 0]":{"system":"a","stream":"b","partition":"x","offset":"1"}}"#,
            "partition",
        ),
    ] {
        let e = Checkpoint::from_json(doc.as_bytes()).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{doc}: {e}");
        assert!(e.to_string().contains(needle), "{doc}: {e}");
    }
}

fn meta(size: u64) -> FileMetadata {
    FileMetadata {
        creation_time_millis: 1,
        last_modified_time_millis: 2,
        size,
        owner: "samza".into(),
        group: "samza".into(),
        permissions: "rw-r--r--".into(),
    }
}

fn file(name: &str, content: &[u8]) -> FileIndex {
    let sha = Sha256::of(content);
    FileIndex {
        file_name: name.into(),
        blobs: vec![FileBlob {
            blob_id: format!("blobs/1-0/{sha}"),
            offset: 0,
        }],
        file_metadata: meta(content.len() as u64),
        checksum: crc32fast::hash(content),
        sha256: Some(sha),
        inline_data: None,
        heat: None,
    }
}

fn dir(name: &str, files: Vec<FileIndex>, subdirs: Vec<DirIndex>) -> DirIndex {
    DirIndex {
        dir_name: name.into(),
        files_present: files,
        sub_dirs_present: subdirs,
        ..Default::default()
    }
}

fn sample_index() -> SnapshotIndex {
    SnapshotIndex {
        format_version: FORMAT_V1,
        creation_time_millis: 1_700_000_000_000,
        snapshot_metadata: SnapshotMetadata {
            checkpoint_id: "1700000000000-1".parse().unwrap(),
            job_name: "wordcount".into(),
            job_id: "1".into(),
            task_name: "Partition 0".into(),
            store_name: "counts".into(),
        },
        dir_index: DirIndex {
            dir_name: String::new(),
            files_present: vec![
                file("MANIFEST-000005", b"m"),
                file("000012.sst", b"sst"),
                file("CURRENT", b"c"),
            ],
            // The same bytes removed and present is legal (content identity).
            files_removed: vec![file("OPTIONS-000007", b"c")],
            sub_dirs_present: vec![dir(
                "z",
                vec![file("1", b"1")],
                vec![dir("y", vec![file("2", b"")], vec![])],
            )],
            sub_dirs_removed: vec![dir("old", vec![file("9", b"9")], vec![])],
        },
        prev_snapshot_index_blob_id: Some("index/1699999999999-0.abc.json".into()),
        borrowed_from: Default::default(),
    }
}

#[test]
fn samza_first_commit_index_parses_without_our_fields() {
    let index = SnapshotIndex::from_slice(FIRST_COMMIT_INDEX.as_bytes()).unwrap();
    assert_eq!(index.format_version, 1);
    assert_eq!(
        index.snapshot_metadata.checkpoint_id.to_string(),
        "1234-567"
    );
    assert_eq!(index.snapshot_metadata.job_name, "testJobName");
    assert_eq!(index.prev_snapshot_index_blob_id, None);
    assert!(index.present_files().is_empty());
    // We write every field, including format-version and the null previous index.
    let ours = String::from_utf8(index.to_bytes().unwrap()).unwrap();
    assert!(
        ours.contains(r#""prev-snapshot-index-blob-id":null"#),
        "{ours}"
    );
    assert!(ours.contains(r#""format-version":1"#), "{ours}");
    assert_eq!(SnapshotIndex::from_slice(ours.as_bytes()).unwrap(), index);
}

#[test]
fn samza_file_entries_without_sha256_parse() {
    let doc = FIRST_COMMIT_INDEX.replace(
        r#""files-present":[]"#,
        r#""files-present":[{"file-name":"a","blobs":[{"blob-id":"b1","offset":0}],"file-metadata":{"creation-time-millis":1,"last-modified-time-millis":2,"size":1,"owner":"o","group":"g","permissions":"rw-r--r--"},"checksum":3904355907}]"#,
    );
    let index = SnapshotIndex::from_slice(doc.as_bytes()).unwrap();
    let files = index.present_files();
    assert_eq!(files.len(), 1);
    assert_eq!(files[0].1.sha256, None);
    assert_eq!(files[0].1.checksum, 3_904_355_907);
}

#[test]
fn index_bytes_are_deterministic_and_round_trip() {
    let index = sample_index();
    let bytes = index.to_bytes().unwrap();
    let back = SnapshotIndex::from_slice(&bytes).unwrap();
    assert_eq!(back.to_bytes().unwrap(), bytes);
    // Entries come out sorted whatever order they were built in.
    let mut shuffled = index.clone();
    shuffled.dir_index.files_present.reverse();
    assert_eq!(shuffled.to_bytes().unwrap(), bytes);
    let paths: Vec<String> = back.present_files().into_iter().map(|(p, _)| p).collect();
    assert_eq!(
        paths,
        ["000012.sst", "CURRENT", "MANIFEST-000005", "z/1", "z/y/2"]
    );
    let text = String::from_utf8(bytes).unwrap();
    assert!(text.starts_with(r#"{"format-version":1,"creation-time-millis":1700000000000,"snapshot-metadata":{"checkpoint-id":"1700000000000-1""#), "{text}");
}

/// A file's heat (issue 34) is optional and additive: written only when known, as a plain
/// number in a format-1 index, so an index without it (Samza's, an older blobsnap's) reads
/// with none and Samza's readers, which ignore unknown properties (reference §2.3), read an
/// index with it.
#[test]
fn heat_is_optional_additive_and_round_trips() {
    let mut index = sample_index();
    let plain = String::from_utf8(index.to_bytes().unwrap()).unwrap();
    assert!(!plain.contains("heat"), "no heat, no field: {plain}");
    index.dir_index.files_present[0].heat = Some(4096);
    let bytes = index.to_bytes().unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(text.contains(r#""heat":4096"#), "{text}");
    assert!(text.starts_with(r#"{"format-version":1,"#), "{text}");
    let back = SnapshotIndex::from_slice(&bytes).unwrap();
    assert_eq!(back.to_bytes().unwrap(), bytes);
    let name = &index.dir_index.files_present[0].file_name;
    let heat: Vec<_> = back
        .present_files()
        .into_iter()
        .map(|(p, f)| (p, f.heat))
        .filter(|(_, h)| h.is_some())
        .collect();
    assert_eq!(heat, [(name.clone(), Some(4096))]);
    // Samza's entry shape, with the field: every Samza field reads as it was.
    let doc = FIRST_COMMIT_INDEX.replace(
        r#""files-present":[]"#,
        r#""files-present":[{"file-name":"a","blobs":[{"blob-id":"b1","offset":0}],"file-metadata":{"creation-time-millis":1,"last-modified-time-millis":2,"size":1,"owner":"o","group":"g","permissions":"rw-r--r--"},"checksum":3904355907,"heat":7}]"#,
    );
    let with = SnapshotIndex::from_slice(doc.as_bytes()).unwrap();
    assert_eq!(with.present_files()[0].1.heat, Some(7));
    let without = SnapshotIndex::from_slice(doc.replace(r#","heat":7"#, "").as_bytes()).unwrap();
    assert_eq!(without.present_files()[0].1.heat, None);
    let mut stripped = with.clone();
    stripped.dir_index.files_present[0].heat = None;
    assert_eq!(stripped, without, "heat is the only difference");
}

#[test]
fn newer_format_is_refused_unknown_fields_ignored() {
    let mut v: serde_json::Value =
        serde_json::from_slice(&sample_index().to_bytes().unwrap()).unwrap();
    v["some-future-field"] = serde_json::json!({"x": 1});
    assert!(SnapshotIndex::from_slice(&serde_json::to_vec(&v).unwrap()).is_ok());
    v["format-version"] = serde_json::json!(FORMAT_VERSION + 1);
    v["dir-index"] = serde_json::json!("a different shape");
    let e = SnapshotIndex::from_slice(&serde_json::to_vec(&v).unwrap()).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidInput);
    assert!(e.to_string().contains("newer"), "{e}");
}

#[test]
fn hostile_names_are_rejected_naming_the_entry() {
    type Mutation = Box<dyn Fn(&mut SnapshotIndex)>;
    // (what, a piece of the message that names the entry or the problem, the mutation)
    let cases: Vec<(&str, &str, Mutation)> = vec![
        (
            "\"..\"",
            "\"..\"",
            Box::new(|i| i.dir_index.files_present[0].file_name = "..".into()),
        ),
        (
            "\".\"",
            "\".\"",
            Box::new(|i| i.dir_index.sub_dirs_present[0].dir_name = ".".into()),
        ),
        (
            "\"a/b\"",
            "\"a/b\"",
            Box::new(|i| i.dir_index.files_present[0].file_name = "a/b".into()),
        ),
        (
            "\"/etc/passwd\"",
            "\"/etc/passwd\"",
            Box::new(|i| {
                i.dir_index.sub_dirs_present[0].files_present[0].file_name = "/etc/passwd".into()
            }),
        ),
        (
            "NUL",
            "NUL",
            Box::new(|i| i.dir_index.files_present[0].file_name = "a\0b".into()),
        ),
        // N16: an ANSI escape would be printed raw by `ls`, `inspect` and the restore plan.
        (
            "control character",
            "control character",
            Box::new(|i| i.dir_index.files_present[0].file_name = "a\u{1b}[2Jb".into()),
        ),
        (
            "control character",
            "control character",
            Box::new(|i| i.dir_index.sub_dirs_present[0].dir_name = "x\ny".into()),
        ),
        (
            "empty",
            "empty",
            Box::new(|i| {
                i.dir_index.sub_dirs_present[0].sub_dirs_present[0].dir_name = String::new()
            }),
        ),
        (
            "\"CURRENT\" twice",
            "\"CURRENT\"",
            Box::new(|i| i.dir_index.files_present[0].file_name = "CURRENT".into()),
        ),
        (
            "\"z\" twice",
            "\"z\"",
            Box::new(|i| i.dir_index.files_present[0].file_name = "z".into()),
        ),
        (
            "root dir-name",
            "dir-name",
            Box::new(|i| i.dir_index.dir_name = "x".into()),
        ),
        (
            "blank blob id",
            "blob id",
            Box::new(|i| i.dir_index.files_present[0].blobs[0].blob_id = " ".into()),
        ),
        (
            "no blob",
            "blob",
            Box::new(|i| i.dir_index.files_present[0].blobs.clear()),
        ),
        (
            "\"..\" removed",
            "\"..\"",
            Box::new(|i| i.dir_index.sub_dirs_removed[0].dir_name = "..".into()),
        ),
        (
            "job-name",
            "job-name",
            Box::new(|i| i.snapshot_metadata.job_name = "".into()),
        ),
        (
            "reserved (blobsnap's restore markers and heat file)",
            "RESTORED",
            Box::new(|i| i.dir_index.files_present[0].file_name = "RESTORED".into()),
        ),
        (
            "reserved (blobsnap's restore markers and heat file)",
            "BLOBSNAP-HEAT",
            Box::new(|i| i.dir_index.files_present[0].file_name = "BLOBSNAP-HEAT".into()),
        ),
        (
            "reserved (blobsnap's partial downloads)",
            "blobsnap-part",
            Box::new(|i| {
                i.dir_index.sub_dirs_present[0].files_present[0].file_name =
                    ".000012.sst.blobsnap-part".into()
            }),
        ),
        (
            "more than a file can hold",
            "MANIFEST-000005",
            Box::new(|i| i.dir_index.files_present[0].file_metadata.size = 1 << 63),
        ),
        (
            "add up past 2^64",
            "(at z/1)",
            Box::new(|i| {
                i.dir_index.files_present[0].file_metadata.size = i64::MAX as u64;
                i.dir_index.files_present[1].file_metadata.size = i64::MAX as u64;
                i.dir_index.sub_dirs_present[0].files_present[0]
                    .file_metadata
                    .size = 2;
            }),
        ),
    ];
    for (what, needle, mutate) in cases {
        let mut index = sample_index();
        mutate(&mut index);
        // Serialize without validation, as an attacker would, then read it back.
        let bytes = serde_json::to_vec(&index).unwrap();
        let e = SnapshotIndex::from_slice(&bytes).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{what}: {e}");
        let msg = e.to_string();
        assert!(
            !needle.is_empty() && msg.contains(needle),
            "{what}: {needle:?} not in {msg}"
        );
    }
}

#[test]
fn negative_offsets_and_sizes_and_oversized_indexes_are_refused() {
    let text = String::from_utf8(sample_index().to_bytes().unwrap()).unwrap();
    let neg = text.replacen(r#""offset":0"#, r#""offset":-1"#, 1);
    assert_eq!(
        SnapshotIndex::from_slice(neg.as_bytes())
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
    let neg = text.replacen(r#""size":1,"#, r#""size":-5,"#, 1);
    assert_eq!(
        SnapshotIndex::from_slice(neg.as_bytes())
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
    let huge = vec![b' '; MAX_INDEX_BYTES as usize + 1];
    let e = SnapshotIndex::from_slice(&huge).unwrap_err();
    assert!(e.to_string().contains("cap"), "{e}");
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    assert_eq!(
        SnapshotIndex::from_slice(deep.as_bytes())
            .unwrap_err()
            .kind(),
        ErrorKind::Corrupt
    );
}

fn arb_name() -> impl Strategy<Value = String> {
    "[A-Za-z0-9._-]{1,12}".prop_filter("not . or ..", |s| s != "." && s != "..")
}

fn arb_dir(depth: u32) -> BoxedStrategy<DirIndex> {
    let files = proptest::collection::btree_map(
        arb_name(),
        proptest::collection::vec(any::<u8>(), 0..8),
        0..4,
    );
    if depth == 0 {
        files
            .prop_map(|f| dir("d", f.iter().map(|(n, c)| file(n, c)).collect(), vec![]))
            .boxed()
    } else {
        (
            files,
            proptest::collection::btree_map(arb_name(), arb_dir(depth - 1), 0..3),
        )
            .prop_map(|(f, subs)| {
                let files: Vec<FileIndex> = f.iter().map(|(n, c)| file(n, c)).collect();
                let subdirs = subs
                    .into_iter()
                    .filter(|(n, _)| !f.contains_key(n))
                    .map(|(n, mut d)| {
                        d.dir_name = n;
                        d
                    })
                    .collect();
                dir("d", files, subdirs)
            })
            .boxed()
    }
}

proptest! {
    #[test]
    fn any_valid_index_round_trips(mut root in arb_dir(3), millis in 0u64..i64::MAX as u64, seq in 0u64..1000) {
        root.dir_name = String::new();
        let index = SnapshotIndex {
            format_version: FORMAT_V1,
            creation_time_millis: millis,
            snapshot_metadata: SnapshotMetadata {
                checkpoint_id: CheckpointId::new(millis, seq).unwrap(),
                job_name: "j".into(), job_id: "1".into(), task_name: "t".into(), store_name: "s".into(),
            },
            dir_index: root,
            prev_snapshot_index_blob_id: None,
            borrowed_from: Default::default(),
        };
        let bytes = index.to_bytes().unwrap();
        let back = SnapshotIndex::from_slice(&bytes).unwrap();
        prop_assert_eq!(back.to_bytes().unwrap(), bytes);
        prop_assert_eq!(back.present_files().len(), index.present_files().len());
    }

    #[test]
    fn checkpoint_v2_round_trips(
        offsets in proptest::collection::btree_map(("[a-z]{1,5}", "[a-z.]{0,3}[a-z]{1,5}", 0u32..100), "[0-9]{1,6}", 0..5),
        marks in proptest::collection::btree_map("[a-zA-Z.]{1,20}", proptest::collection::btree_map("[a-z ]{1,8}", ".{0,30}", 0..3), 0..3),
        millis in 0u64..i64::MAX as u64, seq in 0u64..1_000_000,
    ) {
        let cp = CheckpointV2 {
            id: CheckpointId::new(millis, seq).unwrap(),
            input_offsets: offsets.into_iter().map(|((sys, stream, p), o)| (Ssp::new(sys, stream, p), o)).collect(),
            state_checkpoint_markers: marks,
        };
        let bytes = cp.to_json().unwrap();
        prop_assert_eq!(Checkpoint::from_json(&bytes).unwrap(), Checkpoint::V2(cp));
    }

    #[test]
    fn arbitrary_bytes_never_panic_the_readers(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
        let _ = Checkpoint::from_json(&bytes);
        let _ = SnapshotIndex::from_slice(&bytes);
        let _ = std::str::from_utf8(&bytes).map(|s| s.parse::<blobsnap::index::IndexMarker>());
    }
}

/// `inline-data` (format-version 2, DESIGN §6): a small file's bytes in the index, no blob.
/// Such an index round-trips; every malformed variant is refused as `Corrupt` naming the
/// entry — inline data in a version-1 index, inline data beside blobs, data that is not
/// base64, data whose length is not the entry's size.
#[test]
fn inline_data_round_trips_and_malformed_inline_entries_are_refused() {
    use blobsnap::index::FORMAT_INLINE;
    let inline = |name: &str, content: &[u8]| FileIndex {
        blobs: vec![],
        inline_data: Some(FileIndex::encode_inline(content)),
        heat: None,
        ..file(name, content)
    };
    let mut index = sample_index();
    index.format_version = FORMAT_INLINE;
    index.dir_index.files_present[0] = inline("MANIFEST-000005", b"manifest bytes");
    let bytes = index.to_bytes().unwrap();
    let text = String::from_utf8(bytes.clone()).unwrap();
    assert!(
        text.contains(r#""inline-data":"bWFuaWZlc3QgYnl0ZXM=""#),
        "{text}"
    );
    let back = SnapshotIndex::from_slice(&bytes).unwrap();
    let f = back
        .dir_index
        .files_present
        .iter()
        .find(|f| f.file_name == "MANIFEST-000005")
        .unwrap();
    assert_eq!(f.inline_bytes().unwrap().unwrap(), b"manifest bytes");
    assert!(f.blobs.is_empty());

    let refused = |what: &str, edit: &dyn Fn(&mut SnapshotIndex), needle: &str| {
        let mut bad = index.clone();
        edit(&mut bad);
        let e = SnapshotIndex::from_slice(&bad.to_bytes().unwrap()).unwrap_err();
        assert_eq!(e.kind(), blobsnap::ErrorKind::Corrupt, "{what}: {e}");
        let msg = e.to_string();
        assert!(
            msg.contains("MANIFEST-000005") && msg.contains(needle),
            "{what}: {msg}"
        );
    };
    refused("v1", &|i| i.format_version = FORMAT_V1, "format-version 1");
    refused(
        "blobs too",
        &|i| i.dir_index.files_present[0].blobs = file("x", b"x").blobs,
        "both inline-data and blobs",
    );
    refused(
        "not base64",
        &|i| i.dir_index.files_present[0].inline_data = Some("***".into()),
        "not base64",
    );
    refused(
        "short",
        &|i| i.dir_index.files_present[0].file_metadata.size = 99,
        "holds 14 bytes",
    );
}

/// A fork's index may name blobs of another job only through a declared alias, inside the
/// declared store's `blobs/`, and only while the fork holds its pin there; every other shape
/// is `Corrupt`, naming what is wrong. Plain indexes keep the own-scope rule.
#[tokio::test]
async fn a_borrowed_blob_is_read_only_through_a_declared_and_pinned_scope() {
    use blobsnap::blob::{load_snapshot, Expected};
    use blobsnap::blobstore::{BlobStore, PutBody, PutOptions};
    use blobsnap::index::{BorrowedScope, IndexMarker, FORMAT_FORK};
    use blobsnap::layout::JobScope;

    let tmp = tempfile::tempdir().unwrap();
    let store = blobsnap::blobstore::local::LocalStore::new(tmp.path()).unwrap();
    let fork = JobScope::new("wordcount", "2").unwrap();
    let source = JobScope::new("wordcount", "1").unwrap();
    let who = Expected {
        job_name: "wordcount",
        job_id: "2",
        task_name: "Partition 0",
        store_name: "counts",
    };
    let sha = Sha256::of(b"sst");
    let declared = |job_id: &str| BorrowedScope {
        job_name: "wordcount".into(),
        job_id: job_id.into(),
        task_name: "Partition 0".into(),
        store_name: "counts".into(),
        savepoint: "base".into(),
    };
    let index = |blob_id: String, decl: Option<BorrowedScope>, format: u32| {
        let mut i = sample_index();
        i.format_version = format;
        i.snapshot_metadata.job_id = "2".into();
        i.prev_snapshot_index_blob_id = None;
        i.dir_index = DirIndex {
            dir_name: String::new(),
            files_present: vec![FileIndex {
                blobs: vec![FileBlob { blob_id, offset: 0 }],
                ..file("000012.sst", b"sst")
            }],
            ..Default::default()
        };
        i.borrowed_from = decl.into_iter().map(|d| ("0".to_string(), d)).collect();
        i
    };
    // Written as-is (to_bytes would not refuse them: the reader must).
    let load = |i: SnapshotIndex| {
        let (store, fork, who) = (&store, fork.clone(), who.clone());
        async move {
            let bytes = serde_json::to_vec(&i).unwrap();
            let marker = IndexMarker::of(i.snapshot_metadata.checkpoint_id, &bytes);
            let key = fork
                .store("Partition 0", "counts")
                .unwrap()
                .index_key(&marker)
                .unwrap();
            store
                .put(&key, PutBody::Bytes(bytes.into()), PutOptions::default())
                .await
                .unwrap();
            load_snapshot(store, &who, &marker.to_string()).await
        }
    };
    let good = format!("borrowed/0/blobs/1-0/{sha}");
    let corrupt = |r: blobsnap::Result<blobsnap::blob::LoadedSnapshot>, says: &str| {
        let e = r.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{e}");
        assert!(e.to_string().contains(says), "{says:?} in {e}");
    };
    // Undeclared alias; a declaration in a format-2 index; the fork's own job; no pin yet.
    corrupt(
        load(index(good.clone(), None, FORMAT_FORK)).await,
        "does not declare",
    );
    corrupt(
        load(index(good.clone(), Some(declared("1")), 2)).await,
        "borrowing needs 3",
    );
    corrupt(
        load(index(good.clone(), Some(declared("2")), FORMAT_FORK)).await,
        "names its own job",
    );
    corrupt(
        load(index(good.clone(), Some(declared("1")), FORMAT_FORK)).await,
        "needs its pin",
    );
    let pin = source
        .fork_pin_key("base", "wordcount", "2", "Partition 0")
        .unwrap();
    store
        .put(&pin, PutBody::Bytes("{}".into()), PutOptions::default())
        .await
        .unwrap();
    // Pinned, but declaring another task (or store) of the source than its own: refused.
    let mut other = declared("1");
    other.task_name = "Partition 7".into();
    corrupt(
        load(index(good.clone(), Some(other), FORMAT_FORK)).await,
        "borrows only from its own task and store",
    );
    // Pinned: escapes and non-blob keys of the source are still refused.
    for bad in [
        "borrowed/0/index/1-0.x.json".to_string(),
        format!("borrowed/0/blobs/../../../../../../2/x/{sha}"),
        "borrowed/0".to_string(),
        "borrowed/1/blobs/1-0/x".to_string(),
    ] {
        let r = load(index(bad.clone(), Some(declared("1")), FORMAT_FORK)).await;
        assert_eq!(r.unwrap_err().kind(), ErrorKind::Corrupt, "{bad}");
    }
    let snap = load(index(good.clone(), Some(declared("1")), FORMAT_FORK))
        .await
        .unwrap();
    assert_eq!(
        snap.blobs.key(&good).unwrap().as_str(),
        format!("wordcount/1/tasks/Partition%200/stores/counts/blobs/1-0/{sha}")
    );
    // A plain index still names only its own scope.
    corrupt(
        load(index("../../1/tasks/x/blobs/1-0/y".into(), None, FORMAT_V1)).await,
        "bad blob id",
    );
}
