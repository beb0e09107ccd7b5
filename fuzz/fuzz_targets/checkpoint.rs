//! The CheckpointV1/V2 reader: any bytes give `Ok` or a classified error, never a panic; what
//! it accepts writes back to JSON that reads as the same checkpoint.
#![no_main]

use blobsnap::checkpoint::Checkpoint;
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(c) = Checkpoint::from_json(data) {
        let json = c.to_json().expect("an accepted checkpoint serializes");
        let again = Checkpoint::from_json(&json).expect("its own JSON reads back");
        assert_eq!(again, c, "round trip");
    }
});
