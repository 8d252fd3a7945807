//! Progress of long work, shown two ways: a line on stderr for humans (after
//! a second, only on a terminal, never with `-q` or `--json`), and an
//! [`Observer`] for machine callers such as the MCP server, which forwards
//! progress notifications and asks for cancellation.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Called with (what is being done, items done so far, how many there are
/// when that is known), at most every [`OBSERVER_EVERY`].
pub type ProgressFn = dyn Fn(&'static str, u64, Option<u64>) + Send + Sync;

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
    shared: Arc<Shared>,
}

struct Shared {
    start: Instant,
    enabled: bool,
    message: &'static str,
    count: AtomicU64,
    /// How many items there are; 0 while unknown (a walk finds out only
    /// at its end). Shared with the line's style, which reads it on each
    /// draw: the style held by `bar` must not hold `Shared` itself.
    total: Arc<AtomicU64>,
    bar: OnceLock<ProgressBar>,
    observer: Option<Observer>,
    /// Milliseconds since `start` of the last observer call.
    observed_ms: AtomicU64,
    /// [`HASHED`] when this work started.
    hashed_at_start: u64,
    /// How long before the line appears (read once: `inc` runs per entry).
    delay: Duration,
    done: AtomicBool,
}

/// Bytes of file content this process has read to hash (see [`hashed`]).
static HASHED: AtomicU64 = AtomicU64::new(0);

/// Called by the hash loops for every buffer they hash. A checkpoint of
/// one 3 GB file is one entry for 20 s: counted in entries alone, its
/// progress never moved, and the line never appeared (helper-16).
pub fn hashed(bytes: u64) {
    HASHED.fetch_add(bytes, Ordering::Relaxed);
}

const DELAY: Duration = Duration::from_secs(1);
/// Often enough to show life, rarely enough not to flood a client.
pub const OBSERVER_EVERY: Duration = Duration::from_millis(200);

/// How long work runs before its line appears: [`DELAY`], or
/// `REWIND_PROGRESS_DELAY_MS` (tests, and people who want it at once).
fn delay() -> Duration {
    std::env::var("REWIND_PROGRESS_DELAY_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(DELAY, Duration::from_millis)
}

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
            (o.on_progress)(message, 0, None);
        }
        let shared = Arc::new(Shared {
            start: Instant::now(),
            enabled,
            message,
            count: AtomicU64::new(0),
            total: Arc::new(AtomicU64::new(0)),
            bar: OnceLock::new(),
            observer,
            observed_ms: AtomicU64::new(0),
            hashed_at_start: HASHED.load(Ordering::Relaxed),
            delay: delay(),
            done: AtomicBool::new(false),
        });
        if enabled && shared.delay.is_zero() {
            // At once, drawn here: work shorter than a thread's start
            // showed no line at all.
            let bar = shared.bar();
            bar.tick();
            bar.enable_steady_tick(Duration::from_millis(100));
        } else if enabled {
            // The line appears after the delay even when no entry is
            // finished meanwhile (one big file); from then on indicatif's
            // own tick redraws it, with the bytes read so far.
            let waiting = Arc::clone(&shared);
            let _ = std::thread::Builder::new()
                .name("rewind-progress".into())
                .spawn(move || {
                    std::thread::sleep(waiting.delay);
                    if !waiting.done.load(Ordering::SeqCst) {
                        let bar = waiting.bar();
                        bar.enable_steady_tick(Duration::from_millis(100));
                        // `finish` ran meanwhile and found no line to clear.
                        if waiting.done.load(Ordering::SeqCst) {
                            bar.finish_and_clear();
                        }
                    }
                });
        }
        Progress { shared }
    }

    pub fn hidden() -> Progress {
        Progress::new("", false)
    }

    /// True when the observer asked the work to stop.
    pub fn cancelled(&self) -> bool {
        self.shared
            .observer
            .as_ref()
            .is_some_and(|o| o.cancel.load(Ordering::Relaxed))
    }

    /// How many items the work has, once known: the line then reads
    /// "restoring: 30555/63479" (helper-70: a count alone did not say
    /// whether to wait a second or an hour).
    pub fn set_total(&self, total: u64) {
        self.shared.total.store(total, Ordering::Relaxed);
        // Drawn now: once the steady tick runs, updates draw nothing until
        // its next tick, and work done within that 100 ms never showed its
        // total at all (the line read "restoring: 0" to the end). The length
        // is not in the template; setting it is what draws.
        if let Some(bar) = self.shared.bar.get() {
            bar.set_length(total);
        }
    }

    pub fn inc(&self, n: u64) {
        let sh = &self.shared;
        let count = sh.count.fetch_add(n, Ordering::Relaxed) + n;
        if let Some(o) = &sh.observer {
            let now = sh.start.elapsed().as_millis() as u64;
            let last = sh.observed_ms.load(Ordering::Relaxed);
            if now >= last + OBSERVER_EVERY.as_millis() as u64
                && sh
                    .observed_ms
                    .compare_exchange(last, now, Ordering::Relaxed, Ordering::Relaxed)
                    .is_ok()
            {
                let total = sh.total.load(Ordering::Relaxed);
                (o.on_progress)(sh.message, count, (total > 0).then_some(total));
            }
        }
        if !sh.enabled || (sh.bar.get().is_none() && sh.start.elapsed() < sh.delay) {
            return;
        }
        sh.bar().set_position(count);
    }

    pub fn finish(&self) {
        self.shared.done.store(true, Ordering::SeqCst);
        if let Some(bar) = self.shared.bar.get() {
            bar.finish_and_clear();
        }
    }
}

impl Shared {
    /// The line on stderr, made the first time it is needed.
    fn bar(&self) -> &ProgressBar {
        self.bar.get_or_init(|| {
            let bar = ProgressBar::with_draw_target(None, ProgressDrawTarget::stderr_with_hz(10))
                .with_elapsed(self.start.elapsed());
            let since = self.hashed_at_start;
            let total = Arc::clone(&self.total);
            let style =
                ProgressStyle::with_template("{spinner} {msg}{count}{of}{read} ({elapsed})")
                    .map(|st| {
                        let total_here = Arc::clone(&total);
                        // Work that counts nothing (one SQLite call) shows
                        // its name and time, not ": 0".
                        st.with_key(
                            "count",
                            move |s: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                                if s.pos() > 0 || total_here.load(Ordering::Relaxed) > 0 {
                                    let _ = write!(w, ": {}", s.pos());
                                }
                            },
                        )
                        .with_key(
                            "of",
                            move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                                match total.load(Ordering::Relaxed) {
                                    0 => {}
                                    n => {
                                        let _ = write!(w, "/{n}");
                                    }
                                }
                            },
                        )
                        .with_key(
                            "read",
                            move |_: &indicatif::ProgressState, w: &mut dyn std::fmt::Write| {
                                let n = HASHED.load(Ordering::Relaxed).saturating_sub(since);
                                if n > 0 {
                                    let _ = write!(w, ", {} read", human_bytes(n));
                                }
                            },
                        )
                    })
                    .unwrap_or_else(|_| ProgressStyle::default_spinner());
            bar.set_style(style);
            bar.set_message(self.message);
            bar.set_position(self.count.load(Ordering::Relaxed));
            bar
        })
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// `n` in the largest binary unit it fills (under 1024 of it): the value
/// and its unit's index in [`UNITS`].
fn scaled(n: u64) -> (f64, usize) {
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    (v, u)
}

const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];

/// Human-readable byte counts (`1.5 MiB`; below a KiB, `912 B`).
pub fn human_bytes(n: u64) -> String {
    match scaled(n) {
        (_, 0) => format!("{n} B"),
        (v, u) => format!("{v:.1} {}", UNITS[u]),
    }
}

/// The smallest figure as [`human_bytes`] writes it (one decimal) that is
/// more than `n`: a budget to raise "above" `n`, which a rounded figure
/// could leave still under it (helper-29, D206).
pub fn human_bytes_above(n: u64) -> String {
    match scaled(n) {
        (_, 0) => format!("{} B", n + 1),
        (v, u) => format!("{:.1} {}", ((v * 10.0).floor() + 1.0) / 10.0, UNITS[u]),
    }
}
