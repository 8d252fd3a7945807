//! `REWIND_TRACE=1` prints how long each phase of a command took, on
//! stderr. For finding where time goes without a profiler.

use std::sync::OnceLock;
use std::time::Instant;

fn enabled() -> bool {
    static ON: OnceLock<bool> = OnceLock::new();
    *ON.get_or_init(|| std::env::var_os("REWIND_TRACE").is_some())
}

/// A timed phase; reports its duration when dropped.
pub struct Span {
    name: &'static str,
    start: Option<Instant>,
}

pub fn span(name: &'static str) -> Span {
    Span {
        name,
        start: enabled().then(Instant::now),
    }
}

impl Drop for Span {
    fn drop(&mut self) {
        if let Some(start) = self.start {
            eprintln!(
                "trace: {:>8.2} ms  {}",
                start.elapsed().as_secs_f64() * 1000.0,
                self.name
            );
        }
    }
}

/// A one-line note about how a phase went (which path a command took).
pub fn note(text: impl std::fmt::Display) {
    if enabled() {
        eprintln!("trace: note: {text}");
    }
}
