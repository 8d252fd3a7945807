//! Lines on stderr and stdout that cannot fail the work they describe (D348).

/// `eprintln!` for a warning, a notice or an error line, which loses the
/// line rather than the operation when stderr is closed or full:
/// `eprintln!` panics there (`2>&1 | head -1`, `2>/dev/full`, an MCP
/// client that closed the server's stderr, the mount daemon's log on a
/// full disk), and a panic in the middle of a checkpoint or a rewind
/// aborted the process. Rust ignores SIGPIPE, so the write only errs.
#[macro_export]
macro_rules! stderr_line {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stderr().lock(), $($arg)*);
    }};
}

/// [`stderr_line!`] for stdout, where a caller that stopped reading
/// (`| head`) must not turn a finished command into a crash.
#[macro_export]
macro_rules! stdout_line {
    ($($arg:tt)*) => {{
        use ::std::io::Write as _;
        let _ = ::std::writeln!(::std::io::stdout().lock(), $($arg)*);
    }};
}
