//! The marker, checkpoint-id, key and scope parsers: never a panic, and what they accept
//! prints back to a string they parse to the same value.
#![no_main]

use blobsnap::checkpoint::CheckpointId;
use blobsnap::index::IndexMarker;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let Ok(s) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(m) = s.parse::<IndexMarker>() {
        assert_eq!(
            m.to_string().parse::<IndexMarker>().ok(),
            Some(m),
            "marker {s:?}"
        );
    }
    if let Ok(id) = s.parse::<CheckpointId>() {
        assert_eq!(
            id.to_string().parse::<CheckpointId>().ok(),
            Some(id),
            "id {s:?}"
        );
    }
    let _ = blobsnap::blobstore::BlobKey::new(s.to_string());
    let _ = blobsnap::blobstore::Scope::new(s.to_string());
});
