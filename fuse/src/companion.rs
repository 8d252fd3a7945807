//! A process the daemon keeps running beside the mount (rewind's command
//! server): started once the mount answers, started again when it exits,
//! and killed before the mount ends. It ends with the daemon
//! (`PR_SET_PDEATHSIG`, SIGTERM: it finishes the command it runs first),
//! so a killed daemon leaves no orphan holding the backing tree.

use std::ffi::OsString;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// What to run. `env`: variables to set, or with `None` to remove.
#[derive(Debug, Clone)]
pub struct Companion {
    pub program: PathBuf,
    pub args: Vec<OsString>,
    pub env: Vec<(OsString, Option<OsString>)>,
}

/// A companion that ran at least this long is restarted at once; one that
/// exits sooner waits, longer each time, up to `MAX_BACKOFF`: a companion
/// that cannot start must not spin.
const HEALTHY_RUN: Duration = Duration::from_secs(1);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(10);

pub(crate) struct Keeper {
    stop: Arc<AtomicBool>,
    pid: Arc<Mutex<Option<u32>>>,
    thread: JoinHandle<()>,
}

impl Keeper {
    pub(crate) fn start(c: Companion) -> std::io::Result<Keeper> {
        let stop = Arc::new(AtomicBool::new(false));
        let pid = Arc::new(Mutex::new(None));
        let thread = {
            let (stop, pid) = (Arc::clone(&stop), Arc::clone(&pid));
            std::thread::Builder::new()
                .name("rewind-companion".into())
                .spawn(move || keep_running(&c, &stop, &pid))?
        };
        Ok(Keeper { stop, pid, thread })
    }

    /// Kill the companion and wait for the keeper to end.
    pub(crate) fn stop(self) {
        self.stop.store(true, Ordering::SeqCst);
        if let Some(p) = *lock(&self.pid) {
            kill(p);
        }
        self.thread.thread().unpark();
        let _ = self.thread.join();
    }
}

fn lock(m: &Mutex<Option<u32>>) -> std::sync::MutexGuard<'_, Option<u32>> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

fn kill(pid: u32) {
    if let Some(p) = rustix::process::Pid::from_raw(pid as i32) {
        let _ = rustix::process::kill_process(p, rustix::process::Signal::KILL);
    }
}

fn keep_running(c: &Companion, stop: &AtomicBool, pid: &Mutex<Option<u32>>) {
    let mut backoff = FIRST_BACKOFF;
    while !stop.load(Ordering::SeqCst) {
        let started = Instant::now();
        let child = {
            // Under the lock: `stop` either sees this child or finds the
            // flag set before it is spawned.
            let mut slot = lock(pid);
            if stop.load(Ordering::SeqCst) {
                return;
            }
            match command(c).spawn() {
                Ok(child) => {
                    *slot = Some(child.id());
                    Some(child)
                }
                Err(e) => {
                    rewind_platform::stderr_line!(
                        "rewind: cannot start {}: {e}; commands run in their own process",
                        c.program.display()
                    );
                    None
                }
            }
        };
        if let Some(mut child) = child {
            let status = child.wait();
            *lock(pid) = None;
            if stop.load(Ordering::SeqCst) {
                return;
            }
            if started.elapsed() >= HEALTHY_RUN {
                backoff = FIRST_BACKOFF;
                continue;
            }
            rewind_platform::stderr_line!(
                "rewind: {} exited after {} ms ({status:?}); starting it again in {} ms",
                c.program.display(),
                started.elapsed().as_millis(),
                backoff.as_millis()
            );
        }
        std::thread::park_timeout(backoff);
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
}

fn command(c: &Companion) -> Command {
    let mut cmd = Command::new(&c.program);
    cmd.args(&c.args).stdin(Stdio::null()).current_dir("/");
    for (k, v) in &c.env {
        match v {
            Some(v) => cmd.env(k, v),
            None => cmd.env_remove(k),
        };
    }
    let daemon = std::process::id();
    // SAFETY: prctl, getppid and pthread_sigmask are async-signal-safe;
    // the closure touches no memory the parent shares.
    unsafe {
        cmd.pre_exec(move || {
            // Told when the thread that started it (the daemon's keeper)
            // dies; it finishes the command it runs, then exits (D194).
            if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGTERM) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The daemon died before the line above: no one would kill it.
            if libc::getppid() as u32 != daemon {
                return Err(std::io::Error::other("the daemon is gone"));
            }
            // The daemon blocks termination signals in its threads (one
            // thread waits for them); the companion takes its own.
            let mut none: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut none);
            libc::pthread_sigmask(libc::SIG_SETMASK, &none, std::ptr::null_mut());
            Ok(())
        });
    }
    cmd
}
