//! `REWIND_TRACE=1` prints how long each phase of a command took, on
//! stderr. For finding where time goes without a profiler.
//! `REWIND_TRACE=/abs/path` appends the same lines, each prefixed with the
//! process id, to that file instead: for processes whose stderr is not
//! yours to read (hooks under an agent, the benchmark's timed commands).

use std::io::Write;
use std::sync::{Mutex, OnceLock};
use std::time::Instant;

enum Sink {
    Off,
    Stderr,
    File(Mutex<std::fs::File>),
}

fn sink() -> &'static Sink {
    static SINK: OnceLock<Sink> = OnceLock::new();
    SINK.get_or_init(|| match std::env::var_os("REWIND_TRACE") {
        None => Sink::Off,
        Some(v) if v.as_encoded_bytes().starts_with(b"/") => std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&v)
            .map_or(Sink::Stderr, |f| Sink::File(Mutex::new(f))),
        Some(_) => Sink::Stderr,
    })
}

fn enabled() -> bool {
    !matches!(sink(), Sink::Off)
}

fn emit(line: std::fmt::Arguments<'_>) {
    match sink() {
        Sink::Off => {}
        Sink::Stderr => rewind_platform::stderr_line!("trace: {line}"),
        Sink::File(f) => {
            // One write per line: lines of concurrent processes never mix.
            let text = format!("trace: [{}] {line}\n", std::process::id());
            if let Ok(mut f) = f.lock() {
                let _ = f.write_all(text.as_bytes());
            }
        }
    }
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
            emit(format_args!(
                "{:>8.2} ms  {}",
                start.elapsed().as_secs_f64() * 1000.0,
                self.name
            ));
        }
    }
}

/// A one-line note about how a phase went (which path a command took).
pub fn note(text: impl std::fmt::Display) {
    if enabled() {
        emit(format_args!("note: {text}"));
    }
}
