//! The unit tests of `index.rs` (in a file of their own beside it), and `test_index`, the
//! index other modules' tests build.

use super::*;

/// A snapshot index of `files` and `sub_dirs` at checkpoint `1-0` of store `s` of task `t`
/// of job `j`/`1` (for tests).
pub(crate) fn test_index(files: Vec<FileIndex>, sub_dirs: Vec<DirIndex>) -> SnapshotIndex {
    SnapshotIndex {
        format_version: FORMAT_V1,
        creation_time_millis: 0,
        snapshot_metadata: SnapshotMetadata {
            checkpoint_id: "1-0".parse().expect("a valid checkpoint id"),
            job_name: "j".into(),
            job_id: "1".into(),
            task_name: "t".into(),
            store_name: "s".into(),
        },
        dir_index: DirIndex {
            files_present: files,
            sub_dirs_present: sub_dirs,
            ..DirIndex::default()
        },
        prev_snapshot_index_blob_id: None,
        borrowed_from: Default::default(),
    }
}

/// A file entry of `size` bytes, held by the blob `blob_id` (none: no blob), with `sha256`;
/// `rw-r--r--`, times and owners empty (for tests).
pub(crate) fn test_file(
    name: &str,
    size: u64,
    blob_id: Option<String>,
    sha256: Option<Sha256>,
) -> FileIndex {
    FileIndex {
        file_name: name.into(),
        blobs: blob_id
            .map(|blob_id| FileBlob { blob_id, offset: 0 })
            .into_iter()
            .collect(),
        file_metadata: FileMetadata {
            creation_time_millis: 0,
            last_modified_time_millis: 0,
            size,
            owner: String::new(),
            group: String::new(),
            permissions: "rw-r--r--".into(),
        },
        checksum: 0,
        sha256,
        inline_data: None,
        heat: None,
    }
}

#[test]
fn blobsnap_s_own_names_are_refused_in_an_index() {
    assert!(reserved_name("RESTORED", true).is_err());
    assert!(
        reserved_name("RESTORED", false).is_ok(),
        "only the root holds the marker"
    );
    assert!(reserved_name(".000012.sst.blobsnap-part", false).is_err());
    assert!(reserved_name(".000012.sst.blobsnap-part", true).is_err());
    assert!(reserved_name("000012.sst", true).is_ok());
}

#[test]
fn permissions_round_trip() {
    for mode in [0o644, 0o755, 0o600, 0o000, 0o777] {
        let s = FileMetadata::permissions_of(mode);
        let m = FileMetadata {
            creation_time_millis: 0,
            last_modified_time_millis: 0,
            size: 0,
            owner: "u".into(),
            group: "g".into(),
            permissions: s.clone(),
        };
        assert_eq!(m.mode(), Some(mode), "{s}");
    }
    assert_eq!(FileMetadata::permissions_of(0o640), "rw-r-----");
}

#[test]
fn marker_golden_and_parse() {
    let id: CheckpointId = "1700000000123-4".parse().unwrap();
    let m = IndexMarker::of(id, b"{}");
    let s = m.to_string();
    assert_eq!(
        s,
        "index/1700000000123-4.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json"
    );
    assert_eq!(s.parse::<IndexMarker>().unwrap(), m);
    for bad in [
        "",
        "index/.json",
        "index/1-2.json",
        "1-2.abc.json",
        "index/1-2.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
        "index/x.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json",
        "index/../1-2.44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a.json",
    ] {
        assert_eq!(
            bad.parse::<IndexMarker>().unwrap_err().kind(),
            crate::ErrorKind::InvalidInput,
            "{bad}"
        );
    }
}

#[test]
fn compare_by_path_and_content() {
    let file = |name: &str, content: &[u8]| {
        test_file(name, content.len() as u64, None, Some(Sha256::of(content)))
    };
    let index = |files: Vec<FileIndex>| test_index(files, Vec::new());
    let old = index(vec![
        file("a", b"same"),
        file("b", b"old"),
        file("gone", b"xy"),
    ]);
    let new = index(vec![
        file("a", b"same"),
        file("b", b"new!"),
        file("c", b"added"),
    ]);
    let c = old.compare(&new);
    assert_eq!(
        c.entries,
        [
            (Change::Changed, "b".to_string(), 4),
            (Change::Added, "c".to_string(), 5),
            (Change::Removed, "gone".to_string(), 2),
        ]
    );
    assert_eq!((c.retained.files, c.retained.bytes), (1, 4));
    assert_eq!((c.added.files, c.changed.files, c.removed.files), (1, 1, 1));
    assert_eq!(old.compare(&old).entries, []);
}

/// DESIGN §6: an entry of Samza's shape (no `sha256`) whose one blob key is content-addressed
/// takes the SHA-256 in its key; any other keeps none.
#[test]
fn an_entry_without_sha256_takes_the_one_its_content_addressed_key_names() {
    let sha = Sha256::of(b"abc");
    let entry = |name: &str, blobs: &[&str]| {
        serde_json::json!({
            "file-name": name,
            "blobs": blobs.iter().enumerate().map(|(i, b)| serde_json::json!({"blob-id": b, "offset": i})).collect::<Vec<_>>(),
            "file-metadata": {"creation-time-millis": 1, "last-modified-time-millis": 2, "size": 3,
                "owner": "u", "group": "g", "permissions": "rw-r--r--"},
            "checksum": 0
        })
    };
    let hex = sha.to_hex();
    let keyed = format!("blobs/1-0/{hex}");
    let upper = format!("blobs/1-0/{}", hex.to_uppercase());
    let nested = format!("blobs/1-0/x/{hex}");
    let json = serde_json::json!({
        "creation-time-millis": 0,
        "snapshot-metadata": {"checkpoint-id": "1-0", "job-name": "j", "job-id": "1",
            "task-name": "t", "store-name": "s"},
        "dir-index": {"dir-name": "", "files-present": [
                entry("a.sst", &[&keyed]),
                entry("b.sst", &["2c8e9a3e-samza-opaque-id"]),
                entry("c.sst", &[&upper]),
                entry("d.sst", &[&keyed, &keyed]),
                entry("e.sst", &[&nested]),
            ], "files-removed": [], "sub-dirs-removed": [],
            "sub-dirs-present": [{"dir-name": "sub", "files-present": [entry("f.sst", &[&keyed])],
                "files-removed": [], "sub-dirs-present": [], "sub-dirs-removed": []}]},
        "prev-snapshot-index-blob-id": null
    });
    let mut index = SnapshotIndex::from_slice(&serde_json::to_vec(&json).unwrap()).unwrap();
    index.sha256_from_keys();
    let got: Vec<(String, Option<Sha256>)> = index
        .present_files()
        .into_iter()
        .map(|(p, f)| (p, f.sha256))
        .collect();
    assert_eq!(
        got,
        [
            ("a.sst".to_string(), Some(sha)),
            ("b.sst".to_string(), None),
            ("c.sst".to_string(), None),
            ("d.sst".to_string(), None),
            ("e.sst".to_string(), None),
            ("sub/f.sst".to_string(), Some(sha)),
        ]
    );
}
