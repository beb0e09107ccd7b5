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
    let file = |name: &str, content: &[u8]| FileIndex {
        file_name: name.into(),
        blobs: vec![],
        file_metadata: FileMetadata {
            creation_time_millis: 0,
            last_modified_time_millis: 0,
            size: content.len() as u64,
            owner: String::new(),
            group: String::new(),
            permissions: "rw-r--r--".into(),
        },
        checksum: 0,
        sha256: Some(Sha256::of(content)),
        inline_data: None,
        heat: None,
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
