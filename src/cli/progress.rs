//! Progress on a terminal.

/// A progress bar on stderr, drawn only when stderr is a terminal (stdout carries `--json`).
/// `poll` returns (done, total) bytes; the bar stops when the returned guard is dropped.
pub(crate) struct Bar(Option<(tokio::task::JoinHandle<()>, indicatif::ProgressBar)>);

impl Bar {
    pub(crate) fn start(label: &str, poll: impl Fn() -> (u64, u64) + Send + 'static) -> Bar {
        if !std::io::IsTerminal::is_terminal(&std::io::stderr()) {
            return Bar(None);
        }
        let bar = indicatif::ProgressBar::new(0);
        bar.set_style(
            indicatif::ProgressStyle::with_template(
                "{msg} [{bar:40}] {bytes}/{total_bytes} {bytes_per_sec} {eta}",
            )
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar())
            .progress_chars("=> "),
        );
        bar.set_message(label.to_string());
        let drawn = bar.clone();
        let task = tokio::spawn(async move {
            loop {
                let (done, total) = poll();
                drawn.set_length(total);
                drawn.set_position(done);
                tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            }
        });
        Bar(Some((task, bar)))
    }
}

impl Drop for Bar {
    fn drop(&mut self) {
        if let Some((task, bar)) = self.0.take() {
            task.abort();
            bar.finish_and_clear();
        }
    }
}

pub(crate) fn mib(b: u64) -> f64 {
    b as f64 / (1u64 << 20) as f64
}
