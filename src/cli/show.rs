//! `blobsnap checkpoint show` and `blobsnap index show`: parse, validate, normalize.

use super::args::read_input;
use blobsnap::checkpoint::Checkpoint;

/// A CheckpointV2/V1 document (ours or Samza's), or one of blobsnap's stored checkpoint
/// records (`checkpoints/<task>/<seq>.json`: number, writer, checkpoint), printed normalized.
pub(crate) fn checkpoint(file: &str) -> blobsnap::Result<()> {
    let bytes = read_input(file)?;
    if blobsnap::checkpoint::is_record(&bytes) {
        match blobsnap::checkpoint::parse_entry(&bytes)? {
            blobsnap::checkpoint::Record::Checkpoint(record) => println!(
                "{}",
                String::from_utf8_lossy(&blobsnap::checkpoint::record_to_json(&record)?)
            ),
            // The record of a removal (`forget --checkpoint`): its number, when and why.
            blobsnap::checkpoint::Record::Removed { seq, removal } => {
                println!("{}", serde_json::json!({"seq": seq, "removed": removal}))
            }
        }
        return Ok(());
    }
    let cp = Checkpoint::from_json(&bytes)?;
    println!("{}", String::from_utf8_lossy(&cp.to_json()?));
    Ok(())
}

pub(crate) fn index(file: &str) -> blobsnap::Result<()> {
    let index = blobsnap::index::SnapshotIndex::from_slice(&read_input(file)?)?;
    println!("{}", String::from_utf8_lossy(&index.to_bytes()?));
    Ok(())
}
