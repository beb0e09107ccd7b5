//! `blobsnap checkpoint show` and `blobsnap index show`: parse, validate, normalize.

use super::args::read_input;
use blobsnap::checkpoint::Checkpoint;

pub(crate) fn checkpoint(file: &str) -> blobsnap::Result<()> {
    let cp = Checkpoint::from_json(&read_input(file)?)?;
    println!("{}", String::from_utf8_lossy(&cp.to_json()?));
    Ok(())
}

pub(crate) fn index(file: &str) -> blobsnap::Result<()> {
    let index = blobsnap::index::SnapshotIndex::from_slice(&read_input(file)?)?;
    println!("{}", String::from_utf8_lossy(&index.to_bytes()?));
    Ok(())
}
