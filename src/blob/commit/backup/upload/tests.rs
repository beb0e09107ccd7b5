use super::*;
use crate::digest::{FileDigest, Sha256};
use crate::index::{FileBlob, FileMetadata};
use proptest::prelude::*;
use std::collections::BTreeMap;

fn meta(size: u64) -> FileMetadata {
    FileMetadata {
        creation_time_millis: 0,
        last_modified_time_millis: 0,
        size,
        owner: "u".into(),
        group: "g".into(),
        permissions: "rw-r--r--".into(),
    }
}

fn lf(name: &str, content: &[u8]) -> LocalFile {
    LocalFile {
        name: name.into(),
        path: name.into(),
        digest: FileDigest {
            sha256: Sha256::of(content),
            crc32: crc32fast::hash(content),
            size: content.len() as u64,
        },
        metadata: meta(content.len() as u64),
    }
}

fn fi(name: &str, content: &[u8]) -> FileIndex {
    FileIndex {
        file_name: name.into(),
        blobs: vec![FileBlob {
            blob_id: format!("blobs/1-0/{}", Sha256::of(content)),
            offset: 0,
        }],
        file_metadata: meta(content.len() as u64),
        checksum: crc32fast::hash(content),
        sha256: Some(Sha256::of(content)),
        inline_data: None,
        heat: None,
    }
}

#[test]
fn samza_put_dir_shape() {
    // Local [a, c, z/1, y/2, p/m/3, q/n/4]; previous [a, b, z/1, x/2, p/m/3, p/m/5, r/o/6]
    let local = LocalDir {
        name: String::new(),
        files: vec![lf("a", b"a"), lf("c", b"c")],
        dirs: vec![
            LocalDir {
                name: "p".into(),
                files: vec![],
                dirs: vec![LocalDir {
                    name: "m".into(),
                    files: vec![lf("3", b"3")],
                    dirs: vec![],
                }],
            },
            LocalDir {
                name: "q".into(),
                files: vec![],
                dirs: vec![LocalDir {
                    name: "n".into(),
                    files: vec![lf("4", b"4")],
                    dirs: vec![],
                }],
            },
            LocalDir {
                name: "y".into(),
                files: vec![lf("2", b"2")],
                dirs: vec![],
            },
            LocalDir {
                name: "z".into(),
                files: vec![lf("1", b"1")],
                dirs: vec![],
            },
        ],
    };
    let d = |name: &str, files: Vec<FileIndex>, dirs: Vec<DirIndex>| DirIndex {
        dir_name: name.into(),
        files_present: files,
        sub_dirs_present: dirs,
        ..Default::default()
    };
    let prev = d(
        "",
        vec![fi("a", b"a"), fi("b", b"b")],
        vec![
            d(
                "p",
                vec![],
                vec![d("m", vec![fi("3", b"3"), fi("5", b"5")], vec![])],
            ),
            d("r", vec![], vec![d("o", vec![fi("6", b"6")], vec![])]),
            d("x", vec![fi("2", b"2")], vec![]),
            d("z", vec![fi("1", b"1")], vec![]),
        ],
    );
    let diff = diff(&local, Some(&prev));
    let t = diff.totals();
    assert_eq!(t.files_added, 3, "c, y/2, q/n/4");
    assert_eq!(t.files_retained, 3, "a, z/1, p/m/3");
    assert_eq!(t.files_removed, 4, "b, p/m/5, r/o/6, x/2");
    let added: Vec<&str> = diff.added_files().iter().map(|f| f.name.as_str()).collect();
    assert_eq!(added, ["c", "4", "2"]);
    assert_eq!(
        diff.sub_dirs_removed
            .iter()
            .map(|d| d.dir_name.as_str())
            .collect::<Vec<_>>(),
        ["r", "x"]
    );
    let pm = &diff.sub_dirs_retained[0].sub_dirs_retained[0];
    assert_eq!(pm.files_removed[0].file_name, "5");
}

#[test]
fn changed_content_is_removed_plus_added_and_samza_entries_never_retained() {
    let local = LocalDir {
        name: String::new(),
        files: vec![lf("CURRENT", b"MANIFEST-2"), lf("OPTIONS", b"o")],
        dirs: vec![],
    };
    let mut samza = fi("OPTIONS", b"o");
    samza.sha256 = None;
    let prev = DirIndex {
        dir_name: String::new(),
        files_present: vec![fi("CURRENT", b"MANIFEST-1"), samza],
        ..Default::default()
    };
    let d = diff(&local, Some(&prev));
    assert_eq!(d.files_added.len(), 2);
    assert_eq!(d.files_removed.len(), 2);
    assert!(d.files_retained.is_empty());
}

fn arb_tree(depth: u32) -> BoxedStrategy<BTreeMap<String, Option<u8>>> {
    // name -> Some(content byte) for a file, None for a directory (flattened paths)
    let leaf = proptest::collection::btree_map("[a-c]{1,2}", proptest::option::of(0u8..3), 0..5);
    let _ = depth;
    leaf.boxed()
}

fn build(tree: &BTreeMap<String, Option<u8>>) -> (LocalDir, DirIndex) {
    let mut local = LocalDir::default();
    let mut index = DirIndex::default();
    for (name, v) in tree {
        match v {
            Some(c) => {
                local.files.push(lf(name, &[*c]));
                index.files_present.push(fi(name, &[*c]));
            }
            None => {
                local.dirs.push(LocalDir {
                    name: name.clone(),
                    files: vec![lf("f", name.as_bytes())],
                    dirs: vec![],
                });
                index.sub_dirs_present.push(DirIndex {
                    dir_name: name.clone(),
                    files_present: vec![fi("f", name.as_bytes())],
                    ..Default::default()
                });
            }
        }
    }
    (local, index)
}

proptest! {
    #[test]
    fn every_file_is_accounted_for_once(a in arb_tree(1), b in arb_tree(1)) {
        let (local, _) = build(&a);
        let (_, prev) = build(&b);
        let d = diff(&local, Some(&prev));
        let t = d.totals();
        let local_files = local.all_files().len() as u64;
        prop_assert_eq!(t.files_added + t.files_retained, local_files);
        let prev_files = prev.present_files().len() as u64;
        prop_assert_eq!(t.files_retained + t.files_removed, prev_files);
        for (l, p) in &d.files_retained {
            prop_assert_eq!(Some(l.digest.sha256), p.sha256);
            prop_assert_eq!(&l.name, &p.file_name);
        }
        // Against itself, nothing changes; against nothing, everything is added.
        let (local2, prev2) = build(&a);
        let same = diff(&local2, Some(&prev2)).totals();
        prop_assert_eq!(same.files_added + same.files_removed, 0);
        prop_assert_eq!(diff(&local, None).totals().files_added, local_files);
    }
}
