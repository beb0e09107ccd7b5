//! The BlobStore conformance suite: written once, run against every store.
//!
//! `local::*` and `s3s::*` run in plain `cargo test` (the s3s-fs server starts in-process on
//! loopback). `external::*` is `#[ignore]`d and run by `scripts/test.sh` against LocalStack
//! with `BLOBSNAP_TEST_S3_ENDPOINT` set; without a reachable server those tests fail.
//!
//! A case that needs a capability the store lacks prints a `CAPABILITY:` line naming the store
//! and returns; LocalStack has every capability, so every case runs somewhere in CI.

use crate::support;

use std::sync::Arc;

use blobsnap::blobstore::fault::{FaultConfig, FaultStore, OpRates};
use blobsnap::blobstore::retry::{RetryPolicy, RetryStore};
use blobsnap::blobstore::Probe;
use blobsnap::blobstore::{
    download_to_file, get_bytes, list_all, BlobStore, CreateOnly, DownloadOptions, PutBody,
    PutMode, PutOptions,
};
use blobsnap::digest::Sha256;
use blobsnap::ErrorKind;
use bytes::Bytes;
use support::{Harness, Kind};

fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    use rand::{RngCore as _, SeedableRng as _};
    let mut v = vec![0u8; len];
    rand::rngs::StdRng::seed_from_u64(seed).fill_bytes(&mut v);
    v
}

fn bytes_body(b: &[u8]) -> PutBody {
    PutBody::Bytes(Bytes::copy_from_slice(b))
}

mod cases {
    use super::*;

    pub async fn put_get_head(h: &Harness) {
        let key = h.scope.key("blobs/1-0/a").unwrap();
        let data = pseudo_random(100_000, 1);
        let r = h
            .store
            .put(
                &key,
                bytes_body(&data),
                PutOptions::create_only(Sha256::of(&data)),
            )
            .await
            .unwrap();
        assert_eq!(r.size, data.len() as u64);
        let got = get_bytes(h.store.as_ref(), &key, 1 << 30).await.unwrap();
        assert_eq!(&got[..], &data[..]);
        let meta = h.store.head(&key).await.unwrap();
        assert_eq!(meta.size, data.len() as u64);
        assert_eq!(meta.key, key);
        assert!(meta.last_modified.is_some(), "{}: no last-modified", h.name);

        // From a file, streamed, with the digest computed by the store.
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("f");
        std::fs::write(&path, &data[..5000]).unwrap();
        let fkey = h.scope.key("blobs/1-0/f").unwrap();
        h.store
            .put(
                &fkey,
                PutBody::File { path, len: 5000 },
                PutOptions::default(),
            )
            .await
            .unwrap();
        let got = get_bytes(h.store.as_ref(), &fkey, 1 << 30).await.unwrap();
        assert_eq!(&got[..], &data[..5000]);

        // Overwrite mode replaces.
        h.store
            .put(&fkey, bytes_body(b"new"), PutOptions::default())
            .await
            .unwrap();
        assert_eq!(
            &get_bytes(h.store.as_ref(), &fkey, 100).await.unwrap()[..],
            b"new"
        );

        // The size cap is enforced before reading.
        let e = get_bytes(h.store.as_ref(), &key, 10).await.unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidInput);
    }

    pub async fn ranged_get(h: &Harness) {
        let key = h.scope.key("r").unwrap();
        let data = pseudo_random(10_000, 2);
        h.store
            .put(&key, bytes_body(&data), PutOptions::default())
            .await
            .unwrap();
        for range in [0..1, 0..10_000, 9_999..10_000, 1234..5678] {
            let got = h.store.get(&key, Some(range.clone())).await.unwrap();
            assert_eq!(got.meta.size, 10_000, "{}: full size reported", h.name);
            assert_eq!(got.range, range);
            use futures::TryStreamExt as _;
            let body: Vec<Bytes> = got.body.try_collect().await.unwrap();
            let body: Vec<u8> = body.concat();
            assert_eq!(&body[..], &data[range.start as usize..range.end as usize]);
        }
        for bad in [10_000..10_001, 5..5, 20_000..20_010] {
            let e = h.store.get(&key, Some(bad.clone())).await.unwrap_err();
            assert_eq!(
                e.kind(),
                ErrorKind::InvalidInput,
                "{}: range {bad:?}: {e}",
                h.name
            );
        }
    }

    pub async fn missing_is_not_found(h: &Harness) {
        let key = h.scope.key("nope/x").unwrap();
        assert_eq!(
            h.store.get(&key, None).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        assert_eq!(
            h.store.head(&key).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    pub async fn list_pagination_and_prefix_boundaries(h: &Harness) {
        let mut expected = Vec::new();
        for i in 0..25 {
            let key = h.scope.key(&format!("a/x{i:02}")).unwrap();
            h.store
                .put(&key, bytes_body(&[i as u8]), PutOptions::default())
                .await
                .unwrap();
            expected.push(key);
        }
        for k in ["ab/y", "b", "a0/z"] {
            h.store
                .put(
                    &h.scope.key(k).unwrap(),
                    bytes_body(b"z"),
                    PutOptions::default(),
                )
                .await
                .unwrap();
        }
        let a = h.scope.child("a").unwrap();
        let listed = list_all(h.store.as_ref(), &a).await.unwrap();
        let keys: Vec<_> = listed.iter().map(|m| m.key.clone()).collect();
        assert_eq!(
            keys, expected,
            "{}: list a/ must not return ab/ or a0/",
            h.name
        );
        assert!(listed.iter().all(|m| m.size == 1));
        let all = list_all(h.store.as_ref(), &h.scope).await.unwrap();
        assert_eq!(all.len(), 28);
        let mut sorted: Vec<_> = all.iter().map(|m| m.key.as_str().to_string()).collect();
        sorted.sort();
        assert_eq!(
            all.iter().map(|m| m.key.as_str()).collect::<Vec<_>>(),
            sorted.iter().map(String::as_str).collect::<Vec<_>>(),
            "{}: listing is in key order",
            h.name
        );
        let empty = list_all(h.store.as_ref(), &h.scope.child("zzz").unwrap())
            .await
            .unwrap();
        assert!(empty.is_empty());
    }

    pub async fn delete_is_idempotent(h: &Harness) {
        let k1 = h.scope.key("d/1").unwrap();
        let k2 = h.scope.key("d/2").unwrap();
        let missing = h.scope.key("d/missing").unwrap();
        for k in [&k1, &k2] {
            h.store
                .put(k, bytes_body(b"x"), PutOptions::default())
                .await
                .unwrap();
        }
        let failures = h
            .store
            .delete_many(&[k1.clone(), k2.clone(), missing.clone()])
            .await
            .unwrap();
        assert!(failures.is_empty(), "{}: {failures:?}", h.name);
        assert_eq!(
            h.store.head(&k1).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
        let again = h.store.delete_many(&[k1, k2, missing]).await.unwrap();
        assert!(again.is_empty());
        assert!(list_all(h.store.as_ref(), &h.scope)
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn create_only_refuses_second_put(h: &Harness) {
        if h.store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            == CreateOnly::Ignored
        {
            return h.lacks("enforced create-only puts");
        }
        let key = h.scope.key("c/once").unwrap();
        h.store
            .put(
                &key,
                bytes_body(b"first"),
                PutOptions::create_only(Sha256::of(b"first")),
            )
            .await
            .unwrap();
        let e = h
            .store
            .put(
                &key,
                bytes_body(b"second"),
                PutOptions::create_only(Sha256::of(b"second")),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{}: {e}", h.name);
        assert_eq!(
            &get_bytes(h.store.as_ref(), &key, 100).await.unwrap()[..],
            b"first"
        );
    }

    pub async fn create_only_is_exclusive_under_concurrency(h: &Harness) {
        if h.store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            != CreateOnly::Atomic
        {
            return h.lacks("atomic create-only puts");
        }
        let key = h.scope.key("c/race").unwrap();
        let puts = (0..8u8).map(|i| {
            let store = Arc::clone(&h.store);
            let key = key.clone();
            tokio::spawn(async move {
                let body = vec![i; 1000];
                store
                    .put(
                        &key,
                        PutBody::Bytes(body.clone().into()),
                        PutOptions::create_only(Sha256::of(&body)),
                    )
                    .await
                    .map(|_| i)
            })
        });
        let results = futures::future::join_all(puts).await;
        let winners: Vec<u8> = results
            .iter()
            .filter_map(|r| r.as_ref().unwrap().as_ref().ok().copied())
            .collect();
        assert_eq!(winners.len(), 1, "{}: {results:?}", h.name);
        for r in &results {
            if let Err(e) = r.as_ref().unwrap() {
                assert_eq!(e.kind(), ErrorKind::Conflict, "{}: {e}", h.name);
            }
        }
        let stored = get_bytes(h.store.as_ref(), &key, 10_000).await.unwrap();
        assert_eq!(&stored[..], &vec![winners[0]; 1000][..]);
    }

    /// The capability probe finds what the server really does, agrees with what the harness
    /// declares, and leaves nothing behind.
    pub async fn probe_finds_what_the_server_enforces(h: &Harness) {
        let Kind::S3(s3) = &h.kind else {
            // Fixed capabilities: probing asks nothing.
            assert_eq!(
                h.store
                    .capabilities(Probe::IfUnknown)
                    .await
                    .unwrap()
                    .create_only,
                CreateOnly::Atomic
            );
            return;
        };
        let report = s3.probe().await.unwrap();
        eprintln!("{}: probe {report:?}", h.name);
        let declared = h.store.capabilities(Probe::Never).await.unwrap();
        match declared.create_only {
            CreateOnly::Atomic => assert_eq!(report.create_only.verdict, "atomic", "{}", h.name),
            // A check-then-write server may, by chance, serialise a round; the sequential
            // test still tells it from one that ignores the condition.
            CreateOnly::Racy => assert_ne!(report.create_only.verdict, "ignored", "{}", h.name),
            CreateOnly::Ignored => {
                assert_eq!(report.create_only.verdict, "ignored", "{}", h.name)
            }
            CreateOnly::Unknown => unreachable!("the harness resolves auto"),
        }
        if report.create_only.verdict == "atomic" {
            assert!(report.create_only.winners_per_round.iter().all(|&w| w == 1));
        }
        assert_eq!(
            report.verifies_sha256, declared.verifies_sha256,
            "{}",
            h.name
        );
        // Multipart parts carry CRC-32C by default: a server that checks SHA-256 checks it too
        // (LocalStack, Garage), or `blobsnap probe` says to use `part-checksum = "sha256"`.
        if declared.verifies_sha256 {
            assert!(report.verifies_crc32c, "{}: CRC-32C not verified", h.name);
            assert!(
                report
                    .settings_toml()
                    .contains("part-checksum = \"crc32c\""),
                "{}",
                h.name
            );
        }
        assert_eq!(
            report.multipart_listing, declared.multipart_listing,
            "{}",
            h.name
        );
        assert_eq!(report.tagging, declared.tagging, "{}", h.name);
        // Nothing left behind in the bucket by the probe.
        let left = s3
            .client()
            .list_objects_v2()
            .bucket(&s3.config().bucket)
            .prefix(format!("{}.blobsnap-probe/", s3.config().prefix))
            .send()
            .await
            .unwrap();
        assert_eq!(left.key_count.unwrap_or(0), 0, "{}: {left:?}", h.name);
    }

    pub async fn checksum_mismatch_is_rejected(h: &Harness) {
        if !h
            .store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .verifies_sha256
        {
            return h.lacks("SHA-256 verification of puts");
        }
        let key = h.scope.key("bad").unwrap();
        let e = h
            .store
            .put(
                &key,
                bytes_body(b"actual bytes"),
                PutOptions {
                    mode: PutMode::Overwrite,
                    sha256: Some(Sha256::of(b"other bytes")),
                    crc32: None,
                },
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt, "{}: {e}", h.name);
        assert_eq!(
            h.store.head(&key).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    pub async fn empty_object(h: &Harness) {
        let key = h.scope.key("empty").unwrap();
        h.store
            .put(
                &key,
                bytes_body(b""),
                PutOptions::create_only(Sha256::of(b"")),
            )
            .await
            .unwrap();
        assert_eq!(h.store.head(&key).await.unwrap().size, 0);
        assert!(get_bytes(h.store.as_ref(), &key, 10)
            .await
            .unwrap()
            .is_empty());
        let dir = tempfile::tempdir().unwrap();
        let dest = dir.path().join("e");
        let stats = download_to_file(
            h.store.as_ref(),
            &key,
            &dest,
            DownloadOptions {
                expected_size: 0,
                expected_sha256: Some(Sha256::of(b"")),
                part_size: 1 << 20,
                concurrency: 2,
            },
        )
        .await
        .unwrap();
        assert_eq!(stats.bytes, 0);
        assert_eq!(std::fs::metadata(&dest).unwrap().len(), 0);
    }

    pub async fn large_object_multipart_and_ranged_download(h: &Harness) {
        let len = (12 << 20) + 123;
        let data = pseudo_random(len, 3);
        let sha = Sha256::of(&data);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("big");
        std::fs::write(&path, &data).unwrap();
        let key = h.scope.key("big").unwrap();
        let r = h
            .store
            .put(
                &key,
                PutBody::File {
                    path,
                    len: len as u64,
                },
                PutOptions::create_only(sha),
            )
            .await
            .unwrap();
        assert_eq!(r.size, len as u64);
        if let Kind::S3(_) = h.kind {
            assert_eq!(r.requests, 3 + 2, "{}: 3 parts + create + complete", h.name);
        }
        assert_eq!(h.store.head(&key).await.unwrap().size, len as u64);
        let dest = dir.path().join("back");
        let stats = download_to_file(
            h.store.as_ref(),
            &key,
            &dest,
            DownloadOptions {
                expected_size: len as u64,
                expected_sha256: Some(sha),
                part_size: 4 << 20,
                concurrency: 3,
            },
        )
        .await
        .unwrap();
        assert_eq!(stats.requests, 4);
        assert_eq!(stats.bytes, len as u64);
        assert_eq!(std::fs::read(&dest).unwrap(), data);
        // A wrong expected digest is caught after the download.
        let e = download_to_file(
            h.store.as_ref(),
            &key,
            &dest,
            DownloadOptions {
                expected_size: len as u64,
                expected_sha256: Some(Sha256::of(b"x")),
                part_size: 4 << 20,
                concurrency: 3,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
        // A wrong expected size is caught before the body is read.
        let e = download_to_file(
            h.store.as_ref(),
            &key,
            &dest,
            DownloadOptions {
                expected_size: 7,
                expected_sha256: None,
                part_size: 0,
                concurrency: 1,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Corrupt);
    }

    /// A put dropped mid-upload (a sibling's error in a `try_join_all`, a cancelled commit)
    /// aborts its multipart upload (F18 of the second protocol review): once the server lists
    /// the upload, the put's future is dropped, and the listing empties without a sweep.
    /// Before the fix the upload stayed until the sweep or the bucket rule took it.
    /// A multipart put reports its parts as they land (issue 35 §2: `backup`'s progress moves
    /// within a large file): a 12 MiB file in 5 MiB parts reports 3 times, the file's size in
    /// all; outside a reporting scope nothing is reported and nothing breaks.
    pub async fn a_multipart_put_reports_its_parts(h: &Harness) {
        use std::sync::Mutex;
        if matches!(h.kind, support::Kind::Local(_)) {
            return h.lacks("multipart uploads (a local put is one file copy)");
        }
        let dir = tempfile::tempdir().unwrap();
        let len = 12usize << 20;
        let path = dir.path().join("parts");
        std::fs::write(&path, pseudo_random(len, 5)).unwrap();
        let seen: Arc<Mutex<Vec<u64>>> = Arc::default();
        let report: Arc<dyn Fn(u64) + Send + Sync> = {
            let seen = Arc::clone(&seen);
            Arc::new(move |n| seen.lock().unwrap().push(n))
        };
        let key = h.scope.key("reported").unwrap();
        blobsnap::blobstore::with_put_progress(
            report,
            h.store.put(
                &key,
                PutBody::File {
                    path: path.clone(),
                    len: len as u64,
                },
                PutOptions::default(),
            ),
        )
        .await
        .unwrap();
        let seen = seen.lock().unwrap().clone();
        assert!(seen.len() >= 2, "{}: parts reported {seen:?}", h.name);
        assert_eq!(seen.iter().sum::<u64>(), len as u64, "{}: {seen:?}", h.name);
        assert_eq!(h.store.head(&key).await.unwrap().size, len as u64);
    }

    pub async fn a_dropped_multipart_put_aborts_its_upload(h: &Harness) {
        if !h
            .store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .multipart_listing
            || matches!(h.kind, support::Kind::Local(_))
        {
            return h.lacks("multipart listing (a dropped put's upload cannot be observed)");
        }
        let dir = tempfile::tempdir().unwrap();
        // The put must still be running when its upload is seen: a larger file each try.
        for (attempt, mib) in [48usize, 160, 480].into_iter().enumerate() {
            let len = mib << 20;
            let path = dir.path().join(format!("big{attempt}"));
            std::fs::write(&path, pseudo_random(len, 9)).unwrap();
            let key = h.scope.key(&format!("dropped{attempt}")).unwrap();
            let scope = h.scope.clone();
            let mut put = Box::pin(h.store.put(
                &key,
                PutBody::File {
                    path,
                    len: len as u64,
                },
                PutOptions::default(),
            ));
            let seen = async {
                loop {
                    let ups = h.store.incomplete_uploads(&scope, None).await.unwrap();
                    if ups.iter().any(|u| u.key == key) {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            };
            let finished = tokio::select! {
                r = &mut put => Some(r),
                () = seen => None,
            };
            if finished.is_some() {
                continue; // done before it was seen: try a larger file
            }
            drop(put); // the future itself, mid-upload
                       // The abort is spawned by the drop: wait for the listing to empty (bounded).
            let gone = async {
                loop {
                    let ups = h.store.incomplete_uploads(&scope, None).await.unwrap();
                    if !ups.iter().any(|u| u.key == key) {
                        return;
                    }
                    tokio::task::yield_now().await;
                }
            };
            tokio::time::timeout(std::time::Duration::from_secs(60), gone)
                .await
                .unwrap_or_else(|_| panic!("{}: the dropped put's upload is still listed", h.name));
            assert_eq!(
                h.store.head(&key).await.unwrap_err().kind(),
                ErrorKind::NotFound
            );
            return;
        }
        panic!(
            "{}: every put finished before its upload was listed",
            h.name
        );
    }

    pub async fn multipart_aborted_when_file_changed(h: &Harness) {
        let len = (11 << 20) + 7;
        let data = pseudo_random(len, 4);
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("changing");
        std::fs::write(&path, &data).unwrap();
        let key = h.scope.key("changed").unwrap();
        // The scan's digest no longer matches the bytes on disk: as if the file changed. With
        // the scan's SHA-256 alone (checked by a second SHA-256 pass) and with its CRC-32 too
        // (checked by CRC).
        let stale = Sha256::of(&data[1..]);
        for opts in [
            PutOptions::create_only(stale),
            PutOptions::create_only(stale).with_crc32(crc32fast::hash(&data[1..])),
        ] {
            let e = h
                .store
                .put(
                    &key,
                    PutBody::File {
                        path: path.clone(),
                        len: len as u64,
                    },
                    opts,
                )
                .await
                .unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Corrupt, "{}: {e}", h.name);
            assert_eq!(
                h.store.head(&key).await.unwrap_err().kind(),
                ErrorKind::NotFound
            );
        }
        if h.store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .multipart_listing
        {
            let uploads = h.store.incomplete_uploads(&h.scope, None).await.unwrap();
            assert!(
                uploads.is_empty(),
                "{}: upload left behind: {uploads:?}",
                h.name
            );
        } else {
            h.lacks("multipart listing (cannot check that the aborted upload is gone)");
        }
        // A length that does not match the file is refused too.
        let path = dir.path().join("changing");
        let e = h
            .store
            .put(
                &key,
                PutBody::File {
                    path,
                    len: len as u64 + 1,
                },
                PutOptions::default(),
            )
            .await
            .unwrap_err();
        assert!(
            matches!(
                e.kind(),
                ErrorKind::Corrupt | ErrorKind::Io | ErrorKind::Transient
            ),
            "{}: {e}",
            h.name
        );
        assert_eq!(
            h.store.head(&key).await.unwrap_err().kind(),
            ErrorKind::NotFound
        );
    }

    pub async fn stale_uploads_listed_and_aborted(h: &Harness) {
        if !h
            .store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .multipart_listing
        {
            return h.lacks("ListMultipartUploads");
        }
        let key = h.scope.key("stale/obj").unwrap();
        match &h.kind {
            Kind::S3(s3) => {
                let full = format!("{}{}", s3.config().prefix, key.as_str());
                s3.client()
                    .create_multipart_upload()
                    .bucket(&s3.config().bucket)
                    .key(full)
                    .send()
                    .await
                    .unwrap();
            }
            Kind::Local(local) => {
                // What a put killed midway leaves behind.
                let dir = local.root().join(h.scope.as_str()).join("stale");
                std::fs::create_dir_all(&dir).unwrap();
                std::fs::write(dir.join(".blobsnap-tmp-0123456789abcdef-obj"), b"partial").unwrap();
            }
        }
        let uploads = h.store.incomplete_uploads(&h.scope, None).await.unwrap();
        assert_eq!(uploads.len(), 1, "{}: {uploads:?}", h.name);
        assert_eq!(uploads[0].key, key);
        assert!(uploads[0].initiated.is_some(), "{}: {uploads:?}", h.name);
        // Incomplete uploads are not objects.
        assert!(list_all(h.store.as_ref(), &h.scope)
            .await
            .unwrap()
            .is_empty());
        // A cutoff before it began spares it.
        let long_ago = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1);
        let listed = h
            .store
            .incomplete_uploads(&h.scope, Some(long_ago))
            .await
            .unwrap();
        assert_eq!(listed.len(), 1, "{}: {listed:?}", h.name);
        // A cutoff after it began (a day ahead: any sane server clock) aborts it, twice
        // (idempotent).
        let later = blobsnap::backend::Clock::now(&blobsnap::backend::SystemClock)
            + std::time::Duration::from_secs(86_400);
        h.store
            .incomplete_uploads(&h.scope, Some(later))
            .await
            .unwrap();
        h.store
            .incomplete_uploads(&h.scope, Some(later))
            .await
            .unwrap();
        assert!(h
            .store
            .incomplete_uploads(&h.scope, None)
            .await
            .unwrap()
            .is_empty());
    }

    pub async fn escaped_keys_round_trip(h: &Harness) {
        let store_scope = blobsnap::layout::JobScope::new("word.count job", "1/2")
            .unwrap()
            .store("Partition 0", "counts ü")
            .unwrap();
        let key = h
            .scope
            .key(&format!("{}blobs/1-0/x", store_scope.scope().as_str()))
            .unwrap();
        h.store
            .put(&key, bytes_body(b"v"), PutOptions::default())
            .await
            .unwrap();
        let listed = list_all(h.store.as_ref(), &h.scope).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].key, key, "{}", h.name);
        assert_eq!(
            &get_bytes(h.store.as_ref(), &key, 10).await.unwrap()[..],
            b"v"
        );
    }

    pub async fn truncated_body_is_detected(h: &Harness) {
        let key = h.scope.key("t").unwrap();
        let data = pseudo_random(300_000, 5);
        h.store
            .put(&key, bytes_body(&data), PutOptions::default())
            .await
            .unwrap();
        let faulty = FaultStore::new(
            Arc::clone(&h.store),
            FaultConfig {
                truncate_rate: 1.0,
                seed: 7,
                ..Default::default()
            },
        );
        for _ in 0..5 {
            let e = get_bytes(&faulty, &key, 1 << 20).await.unwrap_err();
            assert_eq!(e.kind(), ErrorKind::Transient, "{}: {e}", h.name);
        }
        let dir = tempfile::tempdir().unwrap();
        let e = download_to_file(
            &faulty,
            &key,
            &dir.path().join("t"),
            DownloadOptions {
                expected_size: 300_000,
                expected_sha256: Some(Sha256::of(&data)),
                part_size: 0,
                concurrency: 1,
            },
        )
        .await
        .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Transient);
        assert!(faulty.injected() >= 6);
    }

    pub async fn retry_settles_ambiguous_create_only_put(h: &Harness) {
        if h.store
            .capabilities(Probe::Never)
            .await
            .unwrap()
            .create_only
            == CreateOnly::Ignored
        {
            return h.lacks("enforced create-only puts");
        }
        // Every successful put is reported as a failure (a lost response); the retry then
        // gets Conflict and must recognise its own object by reading it back.
        let faulty = FaultStore::new(
            Arc::clone(&h.store),
            FaultConfig {
                ambiguous_rate: 1.0,
                seed: 1,
                ..Default::default()
            },
        );
        let policy = RetryPolicy {
            initial_delay_ms: 1,
            max_delay_ms: 5,
            budget_ms: 10_000,
            ..Default::default()
        };
        let retrying = RetryStore::new(faulty, policy);
        let key = h.scope.key("amb").unwrap();
        let body = b"mine".to_vec();
        let r = retrying
            .put(
                &key,
                PutBody::Bytes(body.clone().into()),
                PutOptions::create_only(Sha256::of(&body)),
            )
            .await
            .unwrap();
        assert_eq!(r.size, 4);
        // Another writer's bytes under the same key: Conflict stands.
        let other = b"theirs".to_vec();
        let e = retrying
            .put(
                &key,
                PutBody::Bytes(other.clone().into()),
                PutOptions::create_only(Sha256::of(&other)),
            )
            .await
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Conflict, "{}: {e}", h.name);
    }

    pub async fn retry_rides_out_transient_faults(h: &Harness) {
        let faulty = FaultStore::new(
            Arc::clone(&h.store),
            FaultConfig {
                error_rate: OpRates::all(0.3),
                seed: 42,
                ..Default::default()
            },
        );
        let policy = RetryPolicy {
            initial_delay_ms: 1,
            max_delay_ms: 5,
            budget_ms: 30_000,
            ..Default::default()
        };
        let store = RetryStore::new(faulty, policy);
        let mut keys = Vec::new();
        for i in 0..20u8 {
            let key = h.scope.key(&format!("f/{i:02}")).unwrap();
            store
                .put(&key, bytes_body(&[i; 10]), PutOptions::default())
                .await
                .unwrap();
            keys.push(key);
        }
        for (i, key) in keys.iter().enumerate() {
            assert_eq!(store.head(key).await.unwrap().size, 10);
            let got = store.get(key, None).await.unwrap();
            use futures::TryStreamExt as _;
            let body: Vec<Bytes> = got.body.try_collect().await.unwrap();
            assert_eq!(body.concat(), vec![i as u8; 10]);
        }
        let listed = list_all(&store, &h.scope.child("f").unwrap())
            .await
            .unwrap();
        assert_eq!(
            listed.iter().map(|m| m.key.clone()).collect::<Vec<_>>(),
            keys
        );
        assert!(store.delete_many(&keys).await.unwrap().is_empty());
        assert!(store.inner().injected() > 0, "no fault was injected");
    }
}

store_suites!([
    put_get_head,
    ranged_get,
    missing_is_not_found,
    list_pagination_and_prefix_boundaries,
    delete_is_idempotent,
    create_only_refuses_second_put,
    create_only_is_exclusive_under_concurrency,
    probe_finds_what_the_server_enforces,
    checksum_mismatch_is_rejected,
    empty_object,
    large_object_multipart_and_ranged_download,
    multipart_aborted_when_file_changed,
    a_dropped_multipart_put_aborts_its_upload,
    a_multipart_put_reports_its_parts,
    stale_uploads_listed_and_aborted,
    escaped_keys_round_trip,
    truncated_body_is_detected,
    retry_settles_ambiguous_create_only_put,
    retry_rides_out_transient_faults,
]);
