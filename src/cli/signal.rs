//! Ctrl-C and SIGTERM: the first stops the command gracefully, the second kills it.
//!
//! [`stop_on_signal`] is called by the commands that have a graceful stop (the demo job,
//! `restore`, `backup`, `standby`): from then on the first SIGINT or SIGTERM cancels the token
//! it returns — the command finishes or abandons what is in flight, deletes its leases,
//! releases its locks and exits 10 (`Cancelled`) — and says so on stderr; a second one exits
//! at once with 130 (SIGINT) or 143 (SIGTERM), as the default action would. Commands that do
//! not call it keep the default action: the first signal ends them.

use tokio::signal::unix::{signal, SignalKind};
use tokio_util::sync::CancellationToken;

/// A token cancelled by the first SIGINT or SIGTERM; a second one ends the process. Must be
/// called on the runtime. `what` says what a graceful stop does, for the message.
pub(crate) fn stop_on_signal(what: &'static str) -> CancellationToken {
    let stop = CancellationToken::new();
    let (Ok(mut int), Ok(mut term)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        tracing::warn!(
            "cannot install the SIGINT/SIGTERM handlers: a signal ends the command at once"
        );
        return stop;
    };
    let token = stop.clone();
    tokio::spawn(async move {
        let first = tokio::select! {
            _ = int.recv() => "interrupt",
            _ = term.recv() => "SIGTERM",
        };
        eprintln!("blobsnap: {first}: stopping gracefully ({what}); send it again to stop at once");
        token.cancel();
        let code = tokio::select! {
            _ = int.recv() => 130,
            _ = term.recv() => 143,
        };
        eprintln!("blobsnap: stopped at once (second signal)");
        std::process::exit(code);
    });
    stop
}
