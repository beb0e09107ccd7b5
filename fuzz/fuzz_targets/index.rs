//! The snapshot-index reader: any bytes give `Ok` or a classified error, never a panic; an
//! accepted index writes a canonical form (files sorted by name) that reads back and writes
//! the very same bytes again.
#![no_main]

use blobsnap::index::SnapshotIndex;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(idx) = SnapshotIndex::from_slice(data) {
        let bytes = idx.to_bytes().expect("an accepted index serializes");
        let again = SnapshotIndex::from_slice(&bytes).expect("its own bytes read back");
        let twice = again.to_bytes().expect("and serialize");
        assert_eq!(twice, bytes, "the written form is canonical");
    }
});
