//! The readers of the records of state through time: a savepoint's record, a task's
//! checkpoint document (a checkpoint or the record of its removal), a task's start-from record
//! (with a fork's pins), and the key parser that names a fork's pin. Any bytes give `Ok` or a
//! classified error, never a panic; a checkpoint document and a start-from record that are
//! accepted write back to bytes that read as the same value.
#![no_main]

use blobsnap::blobstore::BlobKey;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let key = BlobKey::new("wc/1/savepoints/nightly.json".to_string()).expect("a key");
    let _ = blobsnap::blob::savepoint::parse_record(data, &key);
    if let Ok(blobsnap::checkpoint::Record::Checkpoint(c)) = blobsnap::checkpoint::parse_entry(data)
    {
        let json = blobsnap::checkpoint::record_to_json(&c).expect("an accepted document writes");
        assert_eq!(
            blobsnap::checkpoint::parse_record(&json).expect("its own JSON reads back"),
            c,
            "round trip"
        );
    }
    let key = BlobKey::new("wc/1/start-from/Partition 0.json".to_string()).expect("a key");
    if let Ok(r) = blobsnap::blob::record::parse_start_from(data, &key) {
        let json = serde_json::to_vec(&r).expect("an accepted record writes");
        assert_eq!(
            blobsnap::blob::record::parse_start_from(&json, &key).expect("reads back"),
            r,
            "round trip"
        );
    }
    if let Ok(s) = std::str::from_utf8(data) {
        if let Ok(k) = BlobKey::new(s.to_string()) {
            let _ = blobsnap::layout::parse(&k);
        }
    }
});
