//! `blobsnap probe`: what the S3 server really enforces.

use super::args::{store_settings, StoreArgs};
use blobsnap::config::StoreKind;
use blobsnap::{Error, ErrorKind};

pub(crate) async fn run(store_args: &StoreArgs, json: bool) -> blobsnap::Result<()> {
    let settings = store_settings(store_args)?;
    if settings.store.kind != StoreKind::S3 {
        return Err(Error::new(
                ErrorKind::InvalidInput,
                "probe asks an S3 server: give --bucket (the local store's capabilities are fixed: create-only via link(2) is atomic)",
            ));
    }
    let store = blobsnap::blobstore::s3::S3Store::connect(settings.s3.clone()).await?;
    let report = store.probe().await?;
    if json {
        println!(
            "{}",
            serde_json::json!({ "schema": 1, "store": store.to_string(), "probe": report })
        );
    } else {
        let c = &report.create_only;
        println!("store: {store}");
        println!(
            "create-only puts: {} ({} concurrent writers per round, winners per round {:?}{})",
            c.verdict,
            blobsnap::blobstore::s3::PROBE_WRITERS,
            c.winners_per_round,
            match c.sequential_refused {
                Some(true) => "; a sequential second put is refused",
                Some(false) => "; a second put silently overwrites",
                None => "",
            }
        );
        if c.verdict != "atomic" {
            println!(
                    "  -> no fence: a job refuses to run here unless unsafe_no_fencing is set (one writer per task guaranteed by other means)"
                );
        }
        println!("sha256 verified on put: {}", report.verifies_sha256);
        println!("crc32c verified on put: {}", report.verifies_crc32c);
        println!("multipart listing: {}", report.multipart_listing);
        println!("object tagging: {}", report.tagging);
        println!("lifecycle rules: {}", report.lifecycle);
        println!(
            "\n[s3] settings for this server:\n{}",
            report.settings_toml()
        );
    }
    Ok(())
}
