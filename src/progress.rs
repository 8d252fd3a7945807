//! Progress of long work, shown two ways: a line on stderr for humans (after
//! a second, only on a terminal, never with `-q` or `--json`), and an
//! [`Observer`] for machine callers such as the MCP server, which forwards
//! progress notifications and asks for cancellation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Called with (what is being done, items done so far), at most every
/// [`OBSERVER_EVERY`].
pub type ProgressFn = dyn Fn(&'static str, u64) + Send + Sync;

/// A machine caller's view of long work: where it is, and a flag that asks
/// it to stop. Stopping is honoured only where it loses nothing: during a
/// capture, before anything is committed. Once a rewind has persisted its
/// intent it rolls forward regardless (DESIGN §4).
#[derive(Clone)]
pub struct Observer {
    pub on_progress: Arc<ProgressFn>,
    pub cancel: Arc<AtomicBool>,
}

pub struct Progress {
    start: Instant,
    enabled: bool,
    message: &'static str,
    count: AtomicU64,
    bar: OnceLock<ProgressBar>,
    observer: Option<Observer>,
    /// Milliseconds since `start` of the last observer call.
    observed_ms: AtomicU64,
}

const DELAY: Duration = Duration::from_secs(1);
/// Often enough to show life, rarely enough not to flood a client.
pub const OBSERVER_EVERY: Duration = Duration::from_millis(200);

impl Progress {
    pub fn new(message: &'static str, enabled: bool) -> Progress {
        Progress::with_observer(message, enabled, None)
    }

    pub fn with_observer(
        message: &'static str,
        enabled: bool,
        observer: Option<Observer>,
    ) -> Progress {
        if let Some(o) = &observer {
            (o.on_progress)(message, 0);
        }
        Progress {
            start: Instant::now(),
            enabled,
            message,
            count: AtomicU64::new(0),
            bar: OnceLock::new(),
            observer,
            observed_ms: AtomicU64::new(0),
        }
    }

    pub fn hidden() -> Progress {
        Progress::new("", false)
    }

    /// True when the observer asked the work to stop.
    pub fn cancelled(&self) -> bool {
        self.observer
            .as_ref()
            .is_some_and(|o| o.cancel.load(Ordering::Relaxed))
    }

    pub fn inc(&self, n: u64) {
        let count = self.count.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(o) = &self.observer {
            let now = self.start.elapsed().as_millis() as u64;
            let last = self.observed_ms.load(Ordering::Relaxed);
            if now >= last + OBSERVER_EVERY.as_millis() as u64
                && self
                    .observed_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                (o.on_progress)(self.message, count);
            }
        }
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

/// Human-readable byte counts (`1.5 MiB`; below a KiB, `912 B`).
pub fn human_bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{n} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}
