//! A progress line on stderr for work that takes over a second. Silent when
//! stderr is not a terminal, with `-q` or `--json`, and for fast work.

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

pub struct Progress {
    start: Instant,
    enabled: bool,
    message: &'static str,
    count: AtomicU64,
    bar: OnceLock<ProgressBar>,
}

const DELAY: Duration = Duration::from_secs(1);

impl Progress {
    pub fn new(message: &'static str, enabled: bool) -> Progress {
        Progress {
            start: Instant::now(),
            enabled,
            message,
            count: AtomicU64::new(0),
            bar: OnceLock::new(),
        }
    }

    pub fn hidden() -> Progress {
        Progress::new("", false)
    }

    pub fn inc(&self, n: u64) {
        let count = self.count.fetch_add(n, Ordering::Relaxed) + n;
        if !self.enabled || (self.bar.get().is_none() && self.start.elapsed() < DELAY) {
            return;
        }
        let bar = self.bar.get_or_init(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10));
            bar.set_style(
                ProgressStyle::with_template("{spinner} {msg}: {pos} ({elapsed})")
                    .unwrap_or_else(|_| ProgressStyle::default_spinner()),
            );
            bar.set_message(self.message);
            bar
        });
        bar.set_position(count);
    }

    pub fn finish(&self) {
        if let Some(bar) = self.bar.get() {
            bar.finish_and_clear();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}
