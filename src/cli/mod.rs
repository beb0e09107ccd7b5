//! The `blobsnap` command: one module per subcommand; [`args`] holds the argument types.

mod admin;
mod args;
mod backup;
mod check;
mod checkpoints;
mod cost;
mod demo;
mod diff;
mod forget;
mod gc;
mod inspect;
mod ls;
mod probe;
mod progress;
mod restore;
mod savepoint;
mod show;
mod signal;
mod standby;
mod unlock;
mod usage;
mod verify;

use blobsnap::ErrorKind;
use clap::{Parser, Subcommand};

use args::{AdminAction, ShowAction, StoreArgs};

#[derive(Subcommand)]
pub(crate) enum Command {
    /// Run the demo job (word count over generated text, one task per partition, RocksDB
    /// state backed up at every commit). State lives under --dir; without store flags the
    /// blob store is --dir/store. Kill it at any moment and run it again: it resumes from the
    /// last checkpoint and ends with counts equal to an independent count of the input.
    Demo(demo::DemoArgs),
    /// Restore one store from a snapshot marker into a directory: the plan is printed first;
    /// only files missing locally are downloaded, every byte is verified, and the new tree is
    /// swapped in atomically.
    Restore(restore::RestoreArgs),
    /// Ask the S3 server what it really enforces: concurrent create-only puts to a scratch key
    /// (the fence of a job's checkpoints), SHA-256 verification, multipart listing, tagging,
    /// lifecycle. Prints the `[s3]` settings that describe it; writes and deletes a few
    /// objects under `<prefix>.blobsnap-probe/`.
    Probe,
    /// Sweep a job's scope: delete blobs and indexes that no retained checkpoint of any task
    /// references and that are older than the grace period; abort stale multipart uploads.
    /// Fails closed: if any root cannot be read, nothing is deleted.
    Gc(gc::GcArgs),
    /// Create or validate a job deployment's resources. The job itself creates them (unless
    /// job.create-resources = false) and validates them before its first commit.
    Admin {
        #[command(subcommand)]
        action: AdminAction,
    },
    /// Keep a warm standby of one task of the demo job on this host: follow its committed
    /// checkpoints without claiming the task (nothing is written to the blob store) and keep
    /// its stores restored and verified in `<store dir>.blobsnap-standby`, downloading only
    /// what each commit adds. A task then started on this host (`blobsnap demo --dir DIR`)
    /// links from the standby and downloads at most the last commit.
    Standby(standby::StandbyArgs),
    /// Back up a closed RocksDB directory (or a RocksDB checkpoint directory) into its own
    /// scope, `manual/<name>/`, deduplicated against the previous backup of that name. Each
    /// backup is pinned by a checkpoint record, so `gc --job manual --job-id NAME` keeps it.
    /// A database locked by a running job is refused (exit 6).
    Backup(backup::BackupArgs),
    /// Remove what is no longer wanted: a manual backup's history pruned by a policy (`--name
    /// N --keep "last 3, every 1d for 30d"`; `gc --name N` then frees what only the others
    /// held), one checkpoint of a task (`--checkpoint KEY`), or a whole deployment — a retired
    /// job id or a fork (`--all --job J --job-id ID`). Dry run first with `--dry-run`.
    Forget(forget::ForgetArgs),
    /// List what the store holds: jobs, tasks with their latest checkpoints, stores with their
    /// snapshots and sizes.
    Ls,
    /// Every retained checkpoint of every task of a job, newest first: number, id, time (UTC
    /// and local), input offsets, each store's size and new bytes, and the savepoints that
    /// pin it. Any of them can be named where a marker is taken (`#N`, an id or prefix,
    /// `@TIME`, `savepoint:NAME`).
    Checkpoints(checkpoints::CheckpointsArgs),
    /// Check a whole job: every retained checkpoint and savepoint of every task parses, every
    /// index is present and matches its key, every blob exists with its size (HEAD);
    /// `--read-data` (or `--read-data-subset 5%`) also hashes them. Each problem is listed
    /// with every checkpoint and savepoint that needs it, and what gc does about it. Exit 3
    /// if something is missing, 4 if corrupt.
    Check(check::CheckArgs),
    /// Every object and byte of a job's scope, classified: live (retained checkpoints), kept
    /// only by savepoints, orphans within the grace, orphans past it (a leak), metadata,
    /// unknown keys, stale multipart uploads — counts, bytes and the oldest of each. A root
    /// that cannot be read is named and what it may name counted as maybe-live: exit 4
    /// "partial".
    Usage(usage::UsageArgs),
    /// Release the writer leases of a job known to be stopped: a lease older than its grace,
    /// or whose process no longer runs on this host, goes; another host's within its grace
    /// goes once that host is named (`--stopped-host HOST`); one whose process runs on this
    /// host is never removed. `gc` refuses a short grace while a lease is active. Exit 6 if a
    /// lease is kept.
    Unlock(unlock::UnlockArgs),
    /// Savepoints: named records of one committed checkpoint per task of a job, kept by the
    /// job's cleanup and by `gc` until removed.
    Savepoint {
        #[command(subcommand)]
        action: savepoint::SavepointAction,
    },
    /// Show a snapshot: its files, sizes and blobs, totals, and what it cost to upload and
    /// would cost to restore.
    Inspect(inspect::InspectArgs),
    /// What changed between two snapshots of one store: files added, removed, changed and
    /// retained, with bytes.
    Diff(diff::DiffArgs),
    /// Check that every object a snapshot references exists with the right size (HEAD);
    /// `--deep` downloads and checks every SHA-256 (`--sample PCT` for a random share).
    /// Exit code 3 if an object is missing, 4 if one is corrupt.
    Verify(verify::VerifyArgs),
    /// What a job costs on S3: requests and bytes per commit, the bytes its retained
    /// snapshots keep, and a monthly estimate at list prices (`[cost]` in the settings
    /// overrides them), read from the job's retained checkpoints and indexes (one that cannot
    /// be read is named, the rest estimated: exit 4 "partial").
    Cost(cost::CostArgs),
    /// Parse a CheckpointV2/V1 JSON document (ours or Samza's), or a checkpoint record as
    /// blobsnap stores it (`checkpoints/<task>/<seq>.json`: number, writer, checkpoint), and
    /// print it normalized.
    Checkpoint {
        #[command(subcommand)]
        action: ShowAction,
    },
    /// Parse and validate a snapshot index JSON document and print it normalized.
    Index {
        #[command(subcommand)]
        action: ShowAction,
    },
    /// Print a completion script for SHELL on stdout, e.g. `blobsnap completions bash >
    /// ~/.local/share/bash-completion/completions/blobsnap`, or for zsh `blobsnap completions
    /// zsh > "${fpath[1]}/_blobsnap"`.
    Completions {
        /// bash, zsh, fish, elvish or powershell.
        shell: clap_complete::Shell,
    },
    /// Print blobsnap's man page (roff) on stdout: `blobsnap man | man -l -`; a command's own
    /// page: `blobsnap man gc`, `blobsnap man savepoint create`; install them all with
    /// `blobsnap man --dir ~/.local/share/man/man1` (then `man blobsnap-gc`).
    Man {
        /// The command whose page to print (none: the main page).
        command: Vec<String>,
        /// Write every page (blobsnap.1, blobsnap-gc.1, blobsnap-savepoint-create.1, …) into
        /// this directory instead (made if missing).
        #[arg(long, value_name = "DIR", conflicts_with = "command")]
        dir: Option<std::path::PathBuf>,
    },
}

/// `blobsnap --version`: the version, the bundled RocksDB (a database it writes is that
/// RocksDB's) and the formats it writes and reads (checked against Cargo.lock and the format
/// constants by `cli::version_names_rocksdb_and_the_formats`).
pub(crate) const LONG_VERSION: &str = concat!(
    env!("CARGO_PKG_VERSION"),
    "\nRocksDB 11.8.1 (bundled: librocksdb-sys 0.19.0+11.8.1)",
    "\nsnapshot index: format-version 1 or 2 written (3 by a fork), 1 to 3 read",
    "\ncheckpoints: CheckpointV2 written, V1 and V2 read (Samza's JSON)",
    "\nsavepoint record: format 1"
);

/// blobsnap: blob-store state backend for CheckpointV2 stream jobs.
///
/// Exit codes: 0 ok, 2 usage, 3 not found, 4 corrupt, 5 invalid input, 6 conflict,
/// 7 transient, 8 permanent, 9 I/O, 10 cancelled.
#[derive(Parser)]
#[command(version, long_version = LONG_VERSION, about)]
pub(crate) struct Cli {
    #[command(flatten)]
    pub(crate) store: StoreArgs,
    /// Print machine-readable JSON on stdout (documents carry a `schema` number).
    #[arg(long, global = true, help_heading = "Output (every command)")]
    pub(crate) json: bool,
    #[command(subcommand)]
    pub(crate) command: Command,
}

/// Parse the command line. `-h` is the short help: the options every command takes (the
/// blob store, the process's limits, `--json`) are left out, named in one line at its end;
/// `--help` shows them all.
pub(crate) fn parse() -> Cli {
    use clap::{CommandFactory as _, FromArgMatches as _};
    let mut cmd = Cli::command();
    if std::env::args_os().skip(1).any(|a| a == "-h") {
        let globals: Vec<clap::Id> = cmd
            .get_arguments()
            .filter(|a| a.is_global_set())
            .map(|a| a.get_id().clone())
            .collect();
        for id in globals {
            cmd = cmd.mut_arg(id, |a| a.hide(true));
        }
        cmd = name_the_hidden(cmd);
    }
    let matches = cmd.get_matches();
    Cli::from_arg_matches(&matches).unwrap_or_else(|e| e.exit())
}

/// `blobsnap man [COMMAND…] [--dir DIR]`: one page on stdout, or every page into `dir`.
fn man(command: &[String], dir: Option<&std::path::Path>) -> blobsnap::Result<()> {
    let mut cmd = <Cli as clap::CommandFactory>::command()
        .disable_help_subcommand(true)
        .propagate_version(true);
    cmd.build();
    if let Some(dir) = dir {
        std::fs::create_dir_all(dir).map_err(|e| {
            blobsnap::Error::new(ErrorKind::Io, format!("create {}: {e}", dir.display()))
        })?;
        let pages = count_pages(&cmd);
        clap_mangen::generate_to(cmd, dir).map_err(|e| {
            blobsnap::Error::new(
                ErrorKind::Io,
                format!("write the man pages into {}: {e}", dir.display()),
            )
        })?;
        println!(
            "{pages} man pages written to {} (blobsnap.1, blobsnap-gc.1, …): `man blobsnap-gc` once it is on MANPATH",
            dir.display()
        );
        return Ok(());
    }
    let mut page = cmd;
    for name in command {
        let Some(sub) = page.find_subcommand(name).cloned() else {
            let known: Vec<&str> = page.get_subcommands().map(|s| s.get_name()).collect();
            return Err(blobsnap::Error::new(
                ErrorKind::InvalidInput,
                format!(
                    "no command {name:?} under `{}`: {}",
                    page.get_display_name().unwrap_or(page.get_name()),
                    if known.is_empty() {
                        "it has no subcommands".to_string()
                    } else {
                        format!("its commands are {}", known.join(", "))
                    }
                ),
            ));
        };
        page = sub;
    }
    let mut out = Vec::new();
    clap_mangen::Man::new(page)
        .render(&mut out)
        .map_err(|e| blobsnap::Error::new(ErrorKind::Io, format!("render the man page: {e}")))?;
    print_bytes(&out, "the man page")
}

/// The pages `clap_mangen::generate_to` writes for `cmd`: its own and its visible
/// subcommands', recursively.
fn count_pages(cmd: &clap::Command) -> usize {
    1 + cmd
        .get_subcommands()
        .filter(|s| !s.is_hide_set())
        .map(count_pages)
        .sum::<usize>()
}

/// `cmd` and its subcommands, each with a line naming the options a short help leaves out.
fn name_the_hidden(cmd: clap::Command) -> clap::Command {
    let names: Vec<String> = cmd
        .get_subcommands()
        .map(|s| s.get_name().to_string())
        .collect();
    let mut cmd = cmd.after_help(
        "Options of every command (the blob store: --local, --bucket, --s3-*, --config; the process's limits: --max-*; --json): see --help",
    );
    for name in names {
        cmd = cmd.mut_subcommand(name, name_the_hidden);
    }
    cmd
}

/// Write `bytes` to stdout; a closed pipe ends the process quietly (as `println!` does, see
/// main.rs), any other failure is an I/O error naming `what`.
fn print_bytes(bytes: &[u8], what: &str) -> blobsnap::Result<()> {
    use std::io::Write as _;
    let mut out = std::io::stdout().lock();
    match out.write_all(bytes).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => std::process::exit(141),
        Err(e) => Err(blobsnap::Error::new(
            ErrorKind::Io,
            format!("write {what} to stdout: {e}"),
        )),
    }
}

/// Run the command the arguments name.
pub(crate) async fn run(cli: Cli) -> blobsnap::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(&cli.store, cli.json, args).await,
        Command::Restore(args) => restore::run(&cli.store, cli.json, args).await,
        Command::Probe => probe::run(&cli.store, cli.json).await,
        Command::Gc(args) => gc::run(&cli.store, cli.json, args).await,
        Command::Admin { action } => admin::run(&cli.store, cli.json, action).await,
        Command::Backup(args) => backup::run(&cli.store, cli.json, args).await,
        Command::Standby(args) => standby::run(&cli.store, cli.json, args).await,
        Command::Ls => ls::run(&cli.store, cli.json).await,
        Command::Forget(args) => forget::run(&cli.store, cli.json, args).await,
        Command::Usage(args) => usage::run(&cli.store, cli.json, args).await,
        Command::Unlock(args) => unlock::run(&cli.store, cli.json, args).await,
        Command::Check(args) => check::run(&cli.store, cli.json, args).await,
        Command::Checkpoints(args) => checkpoints::run(&cli.store, cli.json, args).await,
        Command::Savepoint { action } => savepoint::run(&cli.store, cli.json, action).await,
        Command::Inspect(args) => inspect::run(&cli.store, cli.json, args).await,
        Command::Diff(args) => diff::run(&cli.store, cli.json, args).await,
        Command::Verify(args) => verify::run(&cli.store, cli.json, args).await,
        Command::Cost(args) => cost::run(&cli.store, cli.json, args).await,
        Command::Checkpoint {
            action: ShowAction::Show { file },
        } => show::checkpoint(&file),
        Command::Index {
            action: ShowAction::Show { file },
        } => show::index(&file),
        Command::Completions { shell } => {
            let mut cmd = <Cli as clap::CommandFactory>::command();
            let mut out = Vec::new();
            clap_complete::generate(shell, &mut cmd, "blobsnap", &mut out);
            print_bytes(&out, "the completion script")
        }
        Command::Man { command, dir } => man(&command, dir.as_deref()),
    }
}
