//! The `blobsnap` command: one module per subcommand; [`args`] holds the argument types.

mod admin;
pub(crate) mod args;
mod backup;
mod demo;
mod diff;
mod gc;
mod inspect;
mod ls;
mod probe;
mod progress;
mod restore;
mod show;
mod verify;

use args::{Cli, Command, ShowAction};

/// Run the command the arguments name.
pub(crate) async fn run(cli: Cli) -> blobsnap::Result<()> {
    match cli.command {
        Command::Demo(args) => demo::run(&cli.store, cli.json, args).await,
        Command::Restore(args) => restore::run(&cli.store, cli.json, args).await,
        Command::Probe => probe::run(&cli.store, cli.json).await,
        Command::Gc(args) => gc::run(&cli.store, cli.json, args).await,
        Command::Admin { action } => admin::run(&cli.store, cli.json, action).await,
        Command::Backup(args) => backup::run(&cli.store, cli.json, args).await,
        Command::Ls => ls::run(&cli.store, cli.json).await,
        Command::Inspect(args) => inspect::run(&cli.store, cli.json, args).await,
        Command::Diff(args) => diff::run(&cli.store, cli.json, args).await,
        Command::Verify(args) => verify::run(&cli.store, cli.json, args).await,
        Command::Checkpoint {
            action: ShowAction::Show { file },
        } => show::checkpoint(&file),
        Command::Index {
            action: ShowAction::Show { file },
        } => show::index(&file),
    }
}
