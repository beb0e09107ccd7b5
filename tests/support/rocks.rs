//! RocksDB helpers shared by the suites.

use blobsnap::local::rocks::RocksStore;

/// Put keys `key<from>` .. `key<from + n - 1>`, each with 512 random bytes from `seed`.
pub fn write_keys(db: &RocksStore, from: u32, n: u32, seed: u64) {
    write_keys_of(db, from, n, seed, 512);
}

/// [`write_keys`] with values of `len` random bytes.
pub fn write_keys_of(db: &RocksStore, from: u32, n: u32, seed: u64, len: usize) {
    use rand::{RngCore as _, SeedableRng as _};
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    for i in from..from + n {
        let mut v = vec![0u8; len];
        rng.fill_bytes(&mut v);
        db.db().put(format!("key{i:08}"), v).unwrap();
    }
}

/// What the commit manager does for one store at checkpoint `id`: flush, RocksDB checkpoint,
/// upload, cleanup (the checkpoint document itself is the caller's). Returns the markers.
pub async fn commit_once(
    mgr: &dyn blobsnap::backend::TaskBackupManager,
    db: &RocksStore,
    id: blobsnap::checkpoint::CheckpointId,
) -> blobsnap::backend::StoreMarkers {
    use blobsnap::backend::StoreEngine as _;
    let spec = blobsnap::backend::StoreSpec {
        name: db.name().into(),
        dir: db.dir().to_path_buf(),
    };
    db.flush().unwrap();
    let cp = spec.checkpoint_dir(id);
    db.checkpoint_to(&cp).unwrap();
    let markers = mgr
        .upload(
            id,
            &blobsnap::backend::StoreMarkers::new(),
            &std::collections::BTreeMap::from([(spec.name.clone(), cp)]),
        )
        .await
        .unwrap();
    mgr.cleanup(id, &markers).await.unwrap();
    markers
}
