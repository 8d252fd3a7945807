use std::sync::atomic::{AtomicBool, Ordering::SeqCst};

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
/// named steps and then SIGCONT it. Raised on the calling thread: sent to
/// the process, the kernel gave it to another thread (the main one,
/// asleep), and the caller ran on until that thread stopped the group; a
/// release build read the files the test was about to change before it
/// stopped (D238's test).
pub fn stop_self() {
    // SAFETY: raise() takes a signal number and touches no memory of ours.
    unsafe {
        libc::raise(libc::SIGSTOP);
    }
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

/// Processes holding something under `dir`: their working directory, root
/// directory, an open file or a mapped file, as `pid N (comm): what`, one
/// per process. `skip(pid, parent_pid)` leaves out the caller's own.
/// Unreadable `/proc` entries (another user's, without root) are passed
/// over: the answer is what this process can see.
pub fn holders(dir: &std::path::Path, skip: impl Fn(u32, Option<u32>) -> bool) -> Vec<String> {
    processes()
        .filter(|(pid, base)| !skip(*pid, parent_pid(base)))
        .filter_map(|(pid, base)| {
            let what = held_under(&base, dir, &|_| true, &|_| true)?;
            let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
            Some(format!("pid {pid} ({}): {what}", comm.trim()))
        })
        .collect()
}

/// Whether some process works in `dir` on device `dev` (the directory a
/// mount now covers, reached the way it was before the mount): its
/// working or root directory there, anything it holds open there, or a
/// shared writable mapping there. A process that entered before the mount keeps
/// that directory, and so do the children it starts; what they change is
/// unseen by the mount. `skip(pid, parent_pid)` leaves out the caller's
/// own. Unreadable `/proc` entries are passed over.
pub fn works_beneath(
    dir: &std::path::Path,
    dev: u64,
    skip: impl Fn(u32, Option<u32>) -> bool,
) -> bool {
    use std::os::unix::fs::MetadataExt;
    // The link names the path, the stat the filesystem it is on: a path
    // under `dir` on `dev` is below the mount, not through it. Any
    // descriptor counts: one open for reading is opened again for writing
    // through `/proc/PID/fd/N` (helper-71).
    let on_dev = |link: &std::path::Path| std::fs::metadata(link).is_ok_and(|m| m.dev() == dev);
    // A shared writable mapping made before the mount writes there with
    // no system call, its descriptor long closed.
    let shown_dev = format!(
        "{:02x}:{:02x}",
        rustix::fs::major(dev),
        rustix::fs::minor(dev)
    );
    let written_on_dev = |l: &MapsLine<'_>| l.shared_writable() && l.dev == shown_dev.as_bytes();
    processes().any(|(pid, base)| {
        !skip(pid, parent_pid(&base)) && held_under(&base, dir, &on_dev, &written_on_dev).is_some()
    })
}

/// What the process at `base` (its `/proc` directory) holds under `dir`,
/// the first of: its working directory, its root directory (not `/`), an
/// open descriptor, a mapped file. A `/proc` link (`cwd`, `root`, `fd/N`)
/// whose target is under `dir` counts where `link_ok` says so, a mapping
/// there where `map_ok` does. A file replaced or removed since it was
/// opened is still held at its path (a rewind names holders after
/// replacing the files: D264).
fn held_under(
    base: &std::path::Path,
    dir: &std::path::Path,
    link_ok: &dyn Fn(&std::path::Path) -> bool,
    map_ok: &dyn Fn(&MapsLine<'_>) -> bool,
) -> Option<&'static str> {
    use std::os::unix::ffi::OsStrExt;
    let held = |link: &std::path::Path, root: bool| {
        std::fs::read_link(link).is_ok_and(|t| {
            !(root && t == std::path::Path::new("/"))
                && live_path(t.as_os_str().as_bytes()).0.starts_with(dir)
        }) && link_ok(link)
    };
    if held(&base.join("cwd"), false) {
        Some("working directory")
    } else if held(&base.join("root"), true) {
        Some("root directory")
    } else if std::fs::read_dir(base.join("fd"))
        .into_iter()
        .flatten()
        .flatten()
        .any(|fd| held(&fd.path(), false))
    {
        Some("open file")
    } else if std::fs::read(base.join("maps")).is_ok_and(|m| {
        maps_lines(&m)
            .any(|l| l.path.is_some_and(|p| live_path(p).0.starts_with(dir)) && map_ok(&l))
    }) {
        Some("mapped file")
    } else {
        None
    }
}

/// The inode numbers of the files process (or thread) `pid` maps shared
/// and writable: a write there reaches the file with no system call.
/// `Ok` and empty when the process is gone; `Err` when its maps cannot be
/// read (another user's process).
pub fn shared_writable_mappings(pid: u32) -> std::io::Result<std::collections::HashSet<u64>> {
    match std::fs::read(format!("/proc/{pid}/maps")) {
        Ok(maps) => Ok(parse_shared_writable(&maps)),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Default::default()),
        Err(e) => Err(e),
    }
}

/// One line of `/proc/PID/maps`: `start-end perms offset dev inode path`,
/// perms `rwxs` with `-` for absent and `p` for private.
struct MapsLine<'a> {
    perms: &'a [u8],
    /// `major:minor` in hex, as the kernel prints it.
    dev: &'a [u8],
    ino: u64,
    /// From the first `/` to the end (a path may hold spaces); `None`
    /// for anonymous mappings and `[stack]` and the like.
    path: Option<&'a [u8]>,
}

impl MapsLine<'_> {
    /// A write through it reaches the file with no system call.
    fn shared_writable(&self) -> bool {
        self.perms.get(1) == Some(&b'w') && self.perms.get(3) == Some(&b's')
    }
}

fn maps_lines(maps: &[u8]) -> impl Iterator<Item = MapsLine<'_>> {
    maps.split(|b| *b == b'\n').filter_map(|line| {
        let mut f = line.split(|b| *b == b' ').filter(|f| !f.is_empty());
        let perms = f.nth(1)?;
        let dev = f.nth(1)?;
        let ino = std::str::from_utf8(f.next()?).ok()?.parse().ok()?;
        let path = line.iter().position(|b| *b == b'/').map(|at| &line[at..]);
        Some(MapsLine {
            perms,
            dev,
            ino,
            path,
        })
    })
}

/// A path as `/proc` shows it, and whether its file was deleted (or
/// replaced) since it was opened: the kernel then appends " (deleted)".
fn live_path(shown: &[u8]) -> (&std::path::Path, bool) {
    use std::os::unix::ffi::OsStrExt;
    let (b, deleted) = match shown.strip_suffix(b" (deleted)") {
        Some(b) => (b, true),
        None => (shown, false),
    };
    (
        std::path::Path::new(std::ffi::OsStr::from_bytes(b)),
        deleted,
    )
}

fn parse_shared_writable(maps: &[u8]) -> std::collections::HashSet<u64> {
    maps_lines(maps)
        .filter(|l| l.shared_writable() && l.ino != 0)
        .map(|l| l.ino)
        .collect()
}

/// The processes (but those `skip` names) that can write a file `wanted`
/// accepts without opening it again: through a descriptor open for
/// writing or a shared writable mapping. One line per process, "pid N
/// (comm): PATH open for writing" or "...: PATH mapped shared and
/// writable", the first such file found. Paths as the kernel shows them.
pub fn writers_of(
    wanted: impl Fn(&std::path::Path) -> bool,
    skip: impl Fn(u32) -> bool,
) -> Vec<String> {
    use std::os::unix::ffi::OsStrExt;
    use std::path::PathBuf;
    let mut out = Vec::new();
    for (pid, base) in processes() {
        if skip(pid) {
            continue;
        }
        let open_for_writing = || -> Option<PathBuf> {
            for fd in std::fs::read_dir(base.join("fd")).ok()?.flatten() {
                let Ok(target) = std::fs::read_link(fd.path()) else {
                    continue;
                };
                // Unlinked (or O_TMPFILE): no checkpoint could hold what
                // is written there (helper-43).
                if live_path(target.as_os_str().as_bytes()).1 || !wanted(&target) {
                    continue;
                }
                let info = std::fs::read_to_string(base.join("fdinfo").join(fd.file_name()))
                    .unwrap_or_default();
                let flags = info
                    .lines()
                    .find_map(|l| l.strip_prefix("flags:"))
                    .and_then(|f| u32::from_str_radix(f.trim(), 8).ok())
                    .unwrap_or(0);
                if flags & 0o3 != 0 {
                    return Some(target);
                }
            }
            None
        };
        let mapped = || -> Option<PathBuf> {
            let maps = std::fs::read(base.join("maps")).ok()?;
            maps_lines(&maps).find_map(|l| {
                let (path, deleted) = live_path(l.path?);
                (l.shared_writable() && !deleted && wanted(path)).then(|| path.to_path_buf())
            })
        };
        let what = if let Some(f) = open_for_writing() {
            format!("{} open for writing", f.display())
        } else if let Some(f) = mapped() {
            format!("{} mapped shared and writable", f.display())
        } else {
            continue;
        };
        let comm = std::fs::read_to_string(base.join("comm")).unwrap_or_default();
        out.push(format!("pid {pid} ({}): {what}", comm.trim()));
    }
    out
}

/// Every process this one can see: its pid and `/proc/PID`.
fn processes() -> impl Iterator<Item = (u32, std::path::PathBuf)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|p| {
            let pid = p.file_name().to_str()?.parse::<u32>().ok()?;
            Some((pid, p.path()))
        })
}

/// The parent pid in `/proc/PID/stat` (after the command name, which may
/// hold spaces and parentheses: the last `)` ends it).
fn parent_pid(proc_dir: &std::path::Path) -> Option<u32> {
    stat_field(proc_dir, 1)?.parse().ok()
}

/// Field `n` after the command name in `/proc/PID/stat` (0: the state).
fn stat_field(proc_dir: &std::path::Path, n: usize) -> Option<String> {
    let stat = std::fs::read_to_string(proc_dir.join("stat")).ok()?;
    let rest = &stat[stat.rfind(')')? + 1..];
    rest.split_whitespace().nth(n).map(str::to_string)
}

/// Whether process `pid` still runs: it exists and has not exited (a
/// zombie has closed its descriptors, and released its locks with them).
pub fn is_running(pid: u32) -> bool {
    let dir = std::path::Path::new("/proc").join(pid.to_string());
    stat_field(&dir, 0).is_some_and(|state| !matches!(state.as_str(), "Z" | "X"))
}

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// This process's effective uid, and every group it acts with (the
/// effective gid and the supplementary groups).
pub fn credentials() -> (u32, Vec<u32>) {
    let mut groups: Vec<u32> = rustix::process::getgroups()
        .unwrap_or_default()
        .into_iter()
        .map(|g| g.as_raw())
        .collect();
    groups.push(rustix::process::getegid().as_raw());
    (rustix::process::geteuid().as_raw(), groups)
}

/// Stores into a memory-mapped file that fail raise SIGBUS, whose default
/// action kills the process silently (exit 135, no message). After this, a
/// SIGBUS writes `human` to stderr (and `json` to stdout first when
/// [`sigbus_json`] was set), then exits with status 1. Both are built before any store can
/// fail: the handler only writes bytes and exits (async-signal-safe).
pub fn report_sigbus(human: &'static [u8], json: &'static [u8]) {
    let _ = SIGBUS_TEXT.set((human, json));
    // The handler only calls write(2) and _exit(2).
    install_handler(
        libc::SIGBUS,
        on_sigbus as *const () as usize,
        libc::SA_RESETHAND,
    );
}

/// A write past the file size limit (`ulimit -f`) raises SIGXFSZ, whose
/// default action kills the process with no message. A rewind killed so
/// was rolled forward by the next command, which the limit killed too:
/// every command, `list` and `verify` included, died silently
/// (helper-81). Ignored, the write fails with EFBIG: an error that names
/// the limit, and the rewind rolls back. Children inherit the
/// disposition, and meet the limit as an error too.
pub fn fail_writes_past_the_size_limit() {
    install_handler(libc::SIGXFSZ, libc::SIG_IGN, 0);
}

/// Buffers of a MiB or more go back to the system when freed (D347).
/// glibc maps an allocation of 128 KiB or more on its own and unmaps it
/// at free, but after such a free it raises that threshold (up to 32
/// MiB), and from then on big buffers come from per-thread arenas that
/// keep them. With the walk's eight threads each hashing a big file in
/// 1 MiB buffers, a `rewind mcp` server kept 67 MB after three
/// checkpoints of six edited 200 MB files (11 MB with this). A fixed
/// threshold turns the adjustment off. Called first, before any thread;
/// a no-op off glibc.
pub fn return_big_frees_to_the_system() {
    #[cfg(target_env = "gnu")]
    // SAFETY: mallopt only sets an allocator parameter; no allocation is
    // in flight on another thread (none runs yet).
    unsafe {
        libc::mallopt(libc::M_MMAP_THRESHOLD, 1 << 20);
    }
}

/// Whether this process may create files in the directory `dir`
/// (`access(W_OK)`: its real ids, as for a setuid program; rewind is none).
pub fn may_write(dir: &std::path::Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let Ok(c) = std::ffi::CString::new(dir.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated path for the call's duration.
    unsafe { libc::access(c.as_ptr(), libc::W_OK) == 0 }
}

/// Hand the allocator's free pages back to the system after a long-lived
/// process freed many small allocations (the mount daemon's inode table,
/// D349): glibc keeps them in its heap for reuse, and the resident size
/// stays at its high-water mark. A no-op off glibc.
pub fn give_back_free_heap() {
    #[cfg(target_env = "gnu")]
    // SAFETY: malloc_trim takes the allocator's own locks; it only
    // releases pages no allocation uses.
    unsafe {
        libc::malloc_trim(0);
    }
}

/// Install `handler` for `signal` with `flags`: an `extern "C"` fn's
/// address, or `SIG_IGN`. The handlers given here are async-signal-safe
/// (atomics, write(2), _exit(2)), as they must be.
pub(crate) fn install_handler(
    signal: libc::c_int,
    handler: libc::sighandler_t,
    flags: libc::c_int,
) {
    // SAFETY: a zeroed sigaction is valid; the handler is SIG_IGN or an
    // extern "C" fn that lives for the whole program.
    unsafe {
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = handler;
        act.sa_flags = flags;
        libc::sigemptyset(&mut act.sa_mask);
        libc::sigaction(signal, &act, std::ptr::null_mut());
    }
}

/// Whether a SIGBUS answers in JSON (the command at hand has `--json`).
pub fn sigbus_json(json: bool) {
    SIGBUS_JSON.store(json, std::sync::atomic::Ordering::Relaxed);
}

static SIGBUS_TEXT: std::sync::OnceLock<(&'static [u8], &'static [u8])> =
    std::sync::OnceLock::new();
static SIGBUS_JSON: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_sigbus(_: libc::c_int) {
    if let Some((human, json)) = SIGBUS_TEXT.get() {
        // SAFETY: write(2) of static buffers, then _exit(2).
        unsafe {
            if SIGBUS_JSON.load(std::sync::atomic::Ordering::Relaxed) {
                libc::write(1, json.as_ptr().cast(), json.len());
            }
            libc::write(2, human.as_ptr().cast(), human.len());
        }
    }
    // SAFETY: _exit skips atexit handlers and destructors, as a kill would.
    unsafe { libc::_exit(1) }
}

/// After this, SIGTERM ends the process at once between jobs, and after
/// [`job_ends`] when a job runs: a server whose parent died (it asked for
/// SIGTERM then, `PR_SET_PDEATHSIG`) finishes what it accepted instead of
/// leaving it half done (D194). The handler only touches two atomics and
/// calls `_exit(2)` (async-signal-safe).
pub fn terminate_between_jobs() {
    install_handler(
        libc::SIGTERM,
        on_sigterm as *const () as usize,
        libc::SA_RESTART,
    );
}

/// A job begins: a SIGTERM from now on waits for [`job_ends`].
pub fn job_begins() {
    IN_JOB.store(true, SeqCst);
}

/// The job ended; `true`: a SIGTERM came meanwhile, and the caller should
/// exit now.
pub fn job_ends() -> bool {
    IN_JOB.store(false, SeqCst);
    TERMINATED.load(SeqCst)
}

// Each side stores its flag, then loads the other's (SeqCst): either the
// handler sees no job and exits, or `job_ends` sees the signal.
static IN_JOB: AtomicBool = AtomicBool::new(false);
static TERMINATED: AtomicBool = AtomicBool::new(false);

extern "C" fn on_sigterm(_: libc::c_int) {
    TERMINATED.store(true, SeqCst);
    if !IN_JOB.load(SeqCst) {
        // SAFETY: _exit skips destructors; between jobs there is nothing
        // half done to finish.
        unsafe { libc::_exit(0) }
    }
}

/// Start `cmd` with umask `umask`, dying with the thread that calls this
/// (`PR_SET_PDEATHSIG`): a process started for a client lives no longer
/// than the thread that watches that client.
pub fn spawn_tied(
    cmd: &mut std::process::Command,
    umask: u32,
) -> std::io::Result<std::process::Child> {
    use std::os::unix::process::CommandExt;
    let parent = std::process::id();
    // SAFETY: the closure makes raw system calls only (rustix), which are
    // async-signal-safe, and touches no memory the parent shares.
    unsafe {
        cmd.pre_exec(move || {
            rustix::process::set_parent_process_death_signal(Some(Signal::KILL))?;
            // The parent died before the line above: no one would kill it.
            if rustix::process::getppid().map(|p| p.as_raw_nonzero().get() as u32) != Some(parent) {
                return Err(std::io::Error::other("the parent is gone"));
            }
            rustix::process::umask(rustix::fs::Mode::from_raw_mode(umask));
            Ok(())
        });
    }
    cmd.spawn()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_shared_writable_file_mappings_are_named() {
        let maps = b"55d0c0a00000-55d0c0a01000 r--p 00000000 fd:01 1001 /usr/bin/x\n\
7f00a0000000-7f00a0001000 rw-s 00000000 07:01 131 /ws/data.bin\n\
7f00a0001000-7f00a0002000 r--s 00000000 07:01 132 /ws/read-only.bin\n\
7f00a0002000-7f00a0003000 rw-p 00000000 07:01 133 /ws/private.bin\n\
7f00a0003000-7f00a0004000 rw-s 00000000 00:01 0 /dev/zero (deleted)\n\
7f00a0004000-7f00a0005000 -w-s 00000000 07:01 134 /ws/with space.bin\n\
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0                          [stack]\n";
        let got = parse_shared_writable(maps);
        assert_eq!(got, [131, 134].into_iter().collect());
    }

    #[test]
    fn a_gone_process_maps_nothing() {
        // Above pid_max: no such process.
        let got = shared_writable_mappings(u32::MAX).expect("gone is not an error");
        assert!(got.is_empty());
    }
}
