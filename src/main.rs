//! The `blobsnap` command.

use std::io::Read as _;
use std::process::ExitCode;

use clap::{Parser, Subcommand};

/// blobsnap: blob-store state backend for CheckpointV2 stream jobs.
#[derive(Parser)]
#[command(version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Parse a CheckpointV2/V1 JSON document (ours or Samza's) and print it normalized.
    Checkpoint {
        #[command(subcommand)]
        action: ShowAction,
    },
    /// Parse and validate a snapshot index JSON document and print it normalized.
    Index {
        #[command(subcommand)]
        action: ShowAction,
    },
}

#[derive(Subcommand)]
enum ShowAction {
    /// Read FILE (or `-` for stdin), validate, print normalized JSON on stdout.
    Show {
        /// The document, or `-` for standard input.
        file: String,
    },
}

/// Exit codes by error kind (clap uses 2 for usage errors).
fn exit_code(kind: blobsnap::ErrorKind) -> u8 {
    use blobsnap::ErrorKind::*;
    match kind {
        NotFound => 3,
        Corrupt => 4,
        InvalidInput => 5,
        Conflict => 6,
        Transient => 7,
        Permanent => 8,
        Io => 9,
        Cancelled => 10,
        _ => 1,
    }
}

fn read_input(file: &str) -> blobsnap::Result<Vec<u8>> {
    let mut buf = Vec::new();
    if file == "-" {
        std::io::stdin().read_to_end(&mut buf).map_err(|e| {
            blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("read stdin: {e}"))
        })?;
    } else {
        buf = std::fs::read(file).map_err(|e| {
            blobsnap::Error::new(blobsnap::ErrorKind::Io, format!("read {file}: {e}"))
        })?;
    }
    Ok(buf)
}

fn run(cli: Cli) -> blobsnap::Result<()> {
    match cli.command {
        Command::Checkpoint {
            action: ShowAction::Show { file },
        } => {
            let cp = blobsnap::checkpoint::Checkpoint::from_json(&read_input(&file)?)?;
            println!("{}", String::from_utf8_lossy(&cp.to_json()?));
        }
        Command::Index {
            action: ShowAction::Show { file },
        } => {
            let index = blobsnap::index::SnapshotIndex::from_slice(&read_input(&file)?)?;
            println!("{}", String::from_utf8_lossy(&index.to_bytes()?));
        }
    }
    Ok(())
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("blobsnap: {e}");
            ExitCode::from(exit_code(e.kind()))
        }
    }
}
