//! The `blobsnap` command: parse the arguments, run the command on a runtime, map its
//! error to an exit code.

mod cli;

use std::process::ExitCode;

use blobsnap::ErrorKind;

/// Exit codes by error kind (clap uses 2 for usage errors).
fn exit_code(kind: ErrorKind) -> u8 {
    match kind {
        ErrorKind::NotFound => 3,
        ErrorKind::Corrupt => 4,
        ErrorKind::InvalidInput => 5,
        ErrorKind::Conflict => 6,
        ErrorKind::Transient => 7,
        ErrorKind::Permanent => 8,
        ErrorKind::Io => 9,
        ErrorKind::Cancelled => 10,
        _ => 1,
    }
}

/// Output to a closed pipe (`blobsnap ls | head -1`) ends the command quietly, as it ends a
/// Unix tool: `println!` panics on EPIPE (Rust ignores SIGPIPE), so that one panic exits with
/// 141 (128 + SIGPIPE) and no message; every other panic is reported as before.
fn quiet_on_closed_pipe() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let payload = info.payload();
        let msg = payload
            .downcast_ref::<String>()
            .map(String::as_str)
            .or_else(|| payload.downcast_ref::<&str>().copied())
            .unwrap_or("");
        if msg.starts_with("failed printing to stdout") && msg.contains("Broken pipe") {
            std::process::exit(141);
        }
        default(info);
    }));
}

fn main() -> ExitCode {
    quiet_on_closed_pipe();
    // Credentials in the environment are scrubbed from every log line and message.
    blobsnap::redact::register_env();
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(blobsnap::redact::RedactingWriter::new(std::io::stderr))
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    let cli = cli::parse();
    let json = cli.json;
    if let Err(e) = blobsnap::crash::check_env() {
        return fail(&e, json);
    }
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("blobsnap: cannot start the async runtime: {e}");
            return ExitCode::from(9);
        }
    };
    match rt.block_on(cli::run(cli)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => fail(&e, json),
    }
}

/// Report `e` on stderr and give its exit code. With `--json`, the last line of stderr is
/// also the error as one JSON object a script can parse (`schema`, `error.kind`,
/// `error.exit-code`, `error.message`).
fn fail(e: &blobsnap::Error, json: bool) -> ExitCode {
    let code = exit_code(e.kind());
    let text = e.to_string();
    let message = blobsnap::redact::scrub(&text);
    eprintln!("blobsnap: {message}");
    if json {
        eprintln!(
            "{}",
            serde_json::json!({"schema": 1, "error": {"kind": e.kind().as_str(), "exit-code": code, "message": message}})
        );
    }
    ExitCode::from(code)
}
