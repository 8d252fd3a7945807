use rustix::process::{Signal, getpid, kill_process};

/// SIGKILL this process. Used by test failpoints to simulate a crash at a
/// named point: no destructors, no flushing, exactly like a power cut for
/// everything above the page cache.
pub fn kill_self() -> ! {
    let _ = kill_process(getpid(), Signal::KILL);
    // SIGKILL cannot be caught; if delivery is somehow delayed, spin.
    loop {
        std::thread::park();
    }
}

/// SIGSTOP this process, so that a test can change the world between two
/// named steps and then SIGCONT it.
pub fn stop_self() {
    let _ = kill_process(getpid(), Signal::STOP);
}

/// Start a new session (`setsid`): a daemon leaves the terminal's process
/// group, so a hangup or ^C there does not reach it.
pub fn new_session() -> std::io::Result<()> {
    rustix::process::setsid().map(|_| ()).map_err(Into::into)
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    rustix::process::geteuid().is_root()
}
