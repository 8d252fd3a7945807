//! The daemon: mount the overlay over the workspace directory itself,
//! serve the control socket, run until unmounted.

use std::os::fd::AsFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::Ordering;

use fuser::{Config, MountOption, SessionACL};
use rustix::fs::{Mode, OFlags};

use crate::claim::Claim;
use crate::companion::{Companion, Keeper};
use crate::control::{
    self, COMMIT, Client, Cursor, FREEZE, HELLO, PEEK, STATUS, TAKE, THAW, UNMOUNT, read_frame,
    write_frame,
};
use crate::error::{Error, Result};
use crate::fs::{OverlayFs, Shared};
use crate::wire::put_list;

/// How long a rewind's freeze lets files open for writing finish and
/// close before it closes the mount to everything (D241). Short writers
/// (a tool's append) close within it; one held open (a server's log) costs
/// each rewind this much, and writes on into the file a rewind replaces
/// (D220). `REWIND_MOUNT_DRAIN_MS` sets it for the daemon.
const WRITERS_DRAIN_MS: u64 = 25;

fn writers_drain() -> std::time::Duration {
    std::time::Duration::from_millis(
        std::env::var("REWIND_MOUNT_DRAIN_MS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(WRITERS_DRAIN_MS),
    )
}

/// How to run the daemon.
#[derive(Debug, Clone)]
pub struct ServeOptions {
    /// Mount here instead of over the workspace itself (`--at VIEW`).
    pub view: Option<PathBuf>,
    /// Request threads (the kernel queues requests across them).
    pub threads: usize,
    /// Ask for kernel passthrough of opened files (needs CAP_SYS_ADMIN).
    pub passthrough: bool,
    /// A process to keep running beside the mount (rewind's command server).
    pub companion: Option<Companion>,
    /// Called at the daemon's named test points (rewind's failpoints:
    /// `fuse:remove-marked`, `fuse:holder-gone`); a no-op by default.
    pub failpoint: fn(&str),
}

impl Default for ServeOptions {
    fn default() -> Self {
        ServeOptions {
            view: None,
            threads: std::thread::available_parallelism()
                .map(|n| n.get().clamp(2, 8))
                .unwrap_or(2),
            passthrough: rustix::process::geteuid().is_root(),
            companion: None,
            failpoint: |_| {},
        }
    }
}

struct Ctx {
    sh: Arc<Shared>,
    mountpoint: PathBuf,
    backing: PathBuf,
    /// The entry and attribute TTL the mount was given.
    ttl: std::time::Duration,
    /// How long a freeze lets writers close ([`writers_drain`]).
    drain: std::time::Duration,
    failpoint: fn(&str),
}

/// Keep the workspace `dir` reachable by path once a mount covers it: a
/// private bind mount (private, so the mount over `dir` does not
/// propagate onto it).
fn bind_backing(dir: &Path, mountpoint: &Path) -> Result<PathBuf> {
    if !rustix::process::geteuid().is_root() {
        return Err(over_itself_needs_root(dir));
    }
    let b = control::backing_path(mountpoint);
    let _ = rustix::mount::unmount(&b, rustix::mount::UnmountFlags::DETACH); // a dead daemon's
    std::fs::create_dir_all(&b).map_err(|e| Error::io("create", &b, e))?;
    rustix::mount::mount_bind(dir, &b)
        .map_err(|e| Error::io("bind-mount the workspace at", &b, e.into()))?;
    if let Err(e) = rustix::mount::mount_change(&b, rustix::mount::MountPropagationFlags::PRIVATE) {
        release_backing(&b);
        return Err(Error::io("make private", &b, e.into()));
    }
    Ok(b)
}

/// A user's mount over the workspace itself: what they are told first
/// (before what /dev/fuse or fusermount3 would need, which a view needs
/// too: helper-42 was told to chmod /dev/fuse, then that this needs root).
fn over_itself_needs_root(dir: &Path) -> Error {
    Error::io(
        "mount over",
        dir,
        std::io::Error::other(format!(
            "mounting over the workspace itself needs root (a private bind mount keeps the backing tree reachable); as a user, mount a view of it: `rewind mount {} --at VIEW`",
            dir.display()
        )),
    )
}

fn release_backing(b: &Path) {
    let _ = rustix::mount::unmount(b, rustix::mount::UnmountFlags::DETACH);
    let _ = std::fs::remove_dir(b);
}

/// Mount the overlay of the workspace `dir` (canonical) over `dir` itself
/// or at `opts.view`, and serve until unmounted. `ready` runs once the
/// mount and the control socket answer.
pub fn serve(dir: &Path, opts: &ServeOptions, ready: impl FnOnce()) -> Result<()> {
    let mountpoint = opts.view.clone().unwrap_or_else(|| dir.to_path_buf());
    // Made here, before anything is put in it: it holds the backing
    // trees' binds, closed to other users.
    control::private_runtime_dir()?;
    control::sweep_runtime_dir();
    // From the check for a dead mount to this one's mount (D222).
    let lock = control::MountLock::take(&mountpoint);
    match Client::connect(&mountpoint) {
        Ok(Some(c)) => {
            return Err(Error::AlreadyMounted {
                path: mountpoint,
                pid: c.daemon_pid(),
            });
        }
        // A killed daemon's mount is still there: mounting on it failed
        // ENOTCONN. Nothing but the workspace's own commands detached it,
        // and those do not look at a view's path.
        Err(Error::DaemonGone { .. }) => detach_dead(&mountpoint)?,
        Ok(None) if is_dead_rewind_mount(&mountpoint) => detach_dead(&mountpoint)?,
        _ => {}
    }
    let root_user = rustix::process::geteuid().is_root();
    if opts.view.is_none() && !root_user {
        return Err(over_itself_needs_root(dir));
    }
    // fuser opens /dev/fuse itself and falls back to fusermount3 only when
    // mount(2) is refused, not when the device is: say what to change.
    if !root_user && !dev_fuse_usable() {
        return Err(Error::io(
            "mount FUSE at",
            &mountpoint,
            std::io::Error::other(
                "/dev/fuse cannot be opened for reading and writing by this user (most systems make it mode 0666): `sudo chmod 0666 /dev/fuse`, or mount as root",
            ),
        ));
    }
    if !root_user && fusermount3().is_none() {
        return Err(Error::io(
            "mount FUSE at",
            &mountpoint,
            std::io::Error::other(NO_FUSERMOUNT3),
        ));
    }
    let fd_limit = raise_open_file_limit();
    let signals = block_termination_signals();
    // Opened before the mount covers `dir`: it reaches the backing tree.
    let root = rustix::fs::open(
        dir,
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| Error::io("open", dir, e.into()))?;
    // One mount per workspace, whatever path it is mounted at (D98): held
    // until this function returns, after the mount is gone. No `.rewind/`
    // to claim: a mount over `dir` raced this one and covered it after
    // the command checked the workspace (this daemon would have served a
    // view of that mount, history hidden).
    let claim = match Claim::take(root.as_fd(), dir, &mountpoint)? {
        Some(c) => c,
        None => {
            return Err(Error::AlreadyMounted {
                path: dir.to_path_buf(),
                pid: Client::connect(dir)
                    .ok()
                    .flatten()
                    .map_or(0, |c| c.daemon_pid()),
            });
        }
    };
    // The directory's own device, before the mount covers it (D319).
    let dev_below = std::fs::metadata(dir).map(|m| std::os::unix::fs::MetadataExt::dev(&m));
    let dir_below = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
    let sh = Arc::new(Shared::new(root).map_err(|e| Error::io("stat", dir, e))?);
    sh.inodes.set_fd_cap(
        std::env::var("REWIND_MOUNT_INODE_FDS")
            .ok()
            .and_then(|v| v.parse().ok())
            .unwrap_or(fd_limit / 8 * 5),
    );
    // Kept backing files get an eighth: inode fds and open handles need
    // the rest.
    sh.inodes.set_keep_budget(fd_limit / 8);

    let sock = control::socket_path(&mountpoint);
    let bound = opts.view.is_none();
    let backing = if bound {
        bind_backing(dir, &mountpoint)?
    } else {
        dir.to_path_buf()
    };
    let cleanup = || {
        control::remove_sockets(&mountpoint);
        if bound {
            release_backing(&backing);
        }
        // Not waited for: a command clearing this path holds it briefly,
        // and its own file then stays for the next one.
        if let Some(lock) = control::MountLock::try_take(&mountpoint) {
            lock.remove();
        }
    };
    // Bound under a temporary name and renamed into place: between bind
    // and listen a connect is refused, which clients take for a dead
    // daemon.
    let tmp_sock = sock.with_extension(format!("sock.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp_sock);
    let listener =
        UnixListener::bind(&tmp_sock).map_err(|e| Error::io("listen on", &tmp_sock, e))?;
    let _ = rustix::fs::chmod(&tmp_sock, Mode::from_raw_mode(0o600));
    // Replaces a dead daemon's socket (connect failed above).
    std::fs::rename(&tmp_sock, &sock).map_err(|e| Error::io("listen on", &sock, e))?;

    let mut config = Config::default();
    config.mount_options = vec![
        MountOption::FSName("rewind".into()),
        MountOption::Subtype("rewind".into()),
        MountOption::DefaultPermissions,
    ];
    // Over the workspace itself (root only): everyone who could use the
    // directory before still can, under the same permission checks
    // (`default_permissions`); without it, `sudo rewind mount .` locked
    // the workspace's own user out. A user's view stays theirs
    // (`allow_other` needs `user_allow_other` in /etc/fuse.conf).
    config.acl = if bound {
        SessionACL::All
    } else {
        SessionACL::Owner
    };
    config.n_threads = Some(opts.threads.max(1));
    config.clone_fd = opts.threads > 1;
    let ttl = if bound {
        crate::fs::TTL_OVER_ITSELF
    } else {
        crate::fs::TTL_VIEW
    };
    let fs = OverlayFs::new(Arc::clone(&sh), opts.passthrough, ttl, opts.failpoint);
    let session = match fuser::Session::new(fs, &mountpoint, &config) {
        Ok(s) => s,
        Err(e) => {
            cleanup();
            return Err(Error::io("mount FUSE at", &mountpoint, e));
        }
    };
    drop(lock);
    let _ = sh.notifier.set(session.notifier());
    // `REWIND_ANNOUNCE=0`: no announcements (to measure them, or for a
    // watcher whose every event costs a full rebuild).
    if std::env::var_os("REWIND_ANNOUNCE").is_none_or(|v| v != "0") {
        match crate::announce::Announcer::start(mountpoint.clone()) {
            Ok(a) => {
                let _ = sh.announcer.set(a);
            }
            Err(e) => rewind_platform::stderr_line!(
                "rewind: watchers of the mount will not be told of rewinds: {e}"
            ),
        }
    }
    if let (true, Ok(dev)) = (bound, &dev_below) {
        let _ = sh
            .beneath
            .set(crate::fs::Beneath::new(dir_below, backing.clone(), *dev));
    }
    let ctx = Arc::new(Ctx {
        sh,
        mountpoint: mountpoint.clone(),
        backing: backing.clone(),
        ttl,
        drain: writers_drain(),
        failpoint: opts.failpoint,
    });
    {
        let ctx = Arc::clone(&ctx);
        std::thread::Builder::new()
            .name("rewind-control".into())
            .spawn(move || {
                for conn in listener.incoming().flatten() {
                    let ctx = Arc::clone(&ctx);
                    let _ = std::thread::Builder::new()
                        .name("rewind-client".into())
                        .spawn(move || serve_client(&ctx, conn));
                }
            })
            .map_err(|e| Error::io("start the control thread for", dir, e))?;
    }
    {
        let mountpoint = mountpoint.clone();
        let _ = std::thread::Builder::new()
            .name("rewind-signals".into())
            .spawn(move || unmount_on_signal(signals, &mountpoint));
    }
    let keeper = match opts.companion.clone().map(Keeper::start).transpose() {
        Ok(k) => k,
        Err(e) => {
            rewind_platform::stderr_line!("rewind: cannot start the command server's keeper: {e}");
            None
        }
    };
    ready();
    let result = session.run();
    // Before the backing tree's bind mount goes: the companion holds
    // files there.
    if let Some(k) = keeper {
        k.stop();
    }
    cleanup();
    drop(claim);
    result.map_err(|e| Error::io("serve FUSE at", &mountpoint, e))
}

/// Block SIGTERM, SIGINT and SIGHUP in this thread (and so in every
/// thread started after it): one thread waits for them instead.
fn block_termination_signals() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data; the calls only read and write it.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for sig in [libc::SIGTERM, libc::SIGINT, libc::SIGHUP] {
            libc::sigaddset(&mut set, sig);
        }
        libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
        set
    }
}

/// A terminated daemon unmounts instead of leaving a dead mount behind
/// (ENOTCONN for everyone until the next command detaches it). A busy
/// mount is detached: open files keep working until they are closed.
fn unmount_on_signal(set: libc::sigset_t, mp: &Path) {
    let mut sig = 0;
    // SAFETY: `set` is a valid, initialized signal set.
    if unsafe { libc::sigwait(&set, &mut sig) } != 0 {
        return;
    }
    rewind_platform::stderr_line!("rewind: signal {sig}: unmounting {}", mp.display());
    if unmount(mp).is_err() {
        let _ = rustix::mount::unmount(mp, rustix::mount::UnmountFlags::DETACH);
    }
}

/// Every inode the kernel knows wants an `O_PATH` fd, and opened ones
/// keep their backing file: a tree of 10,000 files wants over 10,000 fds
/// once a tool has walked it. Raise the limit to the kernel's ceiling
/// (`fs.nr_open`) where we may (CAP_SYS_RESOURCE), else to the hard limit.
/// Inodes hold their fd up to 5/8 of it and keep backing files up to 1/8
/// (the rest: open handles, the ledger, the sessions); past that the
/// table evicts (inodes.rs), and running out anyway is survivable:
/// `OverlayFs::with_fds` sheds fds and retries.
fn raise_open_file_limit() -> u64 {
    use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};
    let ceiling = std::fs::read_to_string("/proc/sys/fs/nr_open")
        .ok()
        .and_then(|s| s.trim().parse::<u64>().ok());
    if let Some(c) = ceiling
        && getrlimit(Resource::Nofile).maximum.is_some_and(|h| h < c)
    {
        // Above the hard limit: allowed with CAP_SYS_RESOURCE only.
        let _ = setrlimit(
            Resource::Nofile,
            Rlimit {
                current: Some(c),
                maximum: Some(c),
            },
        );
    }
    let mut l = getrlimit(Resource::Nofile);
    if l.current != l.maximum {
        l.current = l.maximum;
        let _ = setrlimit(Resource::Nofile, l);
    }
    getrlimit(Resource::Nofile).current.unwrap_or(u64::MAX)
}

fn serve_client(ctx: &Ctx, stream: UnixStream) {
    let mut took = false;
    let mut frozen = false;
    let _ = handle(ctx, &stream, &mut took, &mut frozen);
    // Gone without finishing: give everything back.
    if took {
        ctx.sh.tracker.abort();
    }
    if frozen {
        // Until here a command that finishes the holder's rewind is
        // refused its freeze: `MountLink::freeze` waits that out (D264).
        (ctx.failpoint)("fuse:holder-gone");
        ctx.sh.thaw(None);
    }
}

fn handle(
    ctx: &Ctx,
    stream: &UnixStream,
    took: &mut bool,
    frozen: &mut bool,
) -> std::io::Result<()> {
    let sh = &ctx.sh;
    loop {
        let (op, payload) = read_frame(&mut &*stream)?;
        let ok = |p: &[u8]| write_frame(&mut &*stream, 0, p);
        let err = |m: &str| write_frame(&mut &*stream, 1, m.as_bytes());
        match op {
            HELLO => {
                let mut p = std::process::id().to_string().into_bytes();
                p.push(b'\n');
                p.extend_from_slice(ctx.mountpoint.as_os_str().as_bytes());
                p.push(b'\n');
                p.extend_from_slice(ctx.backing.as_os_str().as_bytes());
                ok(&p)?;
            }
            TAKE => {
                *took = true;
                ok(&control::encode_dirty(&sh.take(true)))?;
            }
            PEEK => ok(&control::encode_dirty(&sh.take(false)))?,
            COMMIT => {
                if *took {
                    sh.tracker.commit();
                    *took = false;
                }
                ok(&[])?;
            }
            FREEZE => {
                if *frozen || !sh.freeze(ctx.drain) {
                    err(crate::FROZEN_BY_ANOTHER)?;
                } else {
                    *frozen = true;
                    let mut held = Vec::new();
                    put_list(&mut held, sh.held_at_freeze().iter());
                    ok(&held)?;
                }
            }
            THAW => {
                if !*frozen {
                    err("not frozen by this connection")?;
                    continue;
                }
                let mut c = Cursor(&payload);
                let paths = match c.u8() {
                    Some(1) => c.list(),
                    _ => None,
                };
                sh.thaw(paths.as_deref());
                *frozen = false;
                ok(&[])?;
            }
            STATUS => {
                let dirty = match sh.tracker.pending() {
                    usize::MAX => "all".to_string(),
                    n => n.to_string(),
                };
                let text = format!(
                    "pid={}\ngeneration={}\npassthrough={}\npassthrough_opens={}\ncached_opens={}\nplain_opens={}\ninodes={}\nfrozen={}\ndirty={}\nfds={}\nfd_limit={}\nttl_s={}\n",
                    std::process::id(),
                    sh.generation.load(Ordering::SeqCst),
                    sh.passthrough.load(Ordering::Relaxed) as u8,
                    sh.passthrough_opens.load(Ordering::Relaxed),
                    sh.cached_opens.load(Ordering::Relaxed),
                    sh.plain_opens.load(Ordering::Relaxed),
                    sh.inodes.len(),
                    sh.gate.is_frozen() as u8,
                    dirty,
                    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count()),
                    rustix::process::getrlimit(rustix::process::Resource::Nofile)
                        .current
                        .unwrap_or(u64::MAX),
                    ctx.ttl.as_secs(),
                );
                ok(text.as_bytes())?;
            }
            UNMOUNT => {
                // The announcer holds the mount's root open while it works.
                let paused = sh.announcer.get().map(|a| a.pause());
                let r = unmount(&ctx.mountpoint);
                drop(paused);
                match r {
                    Ok(()) => ok(&[])?,
                    Err(m) => err(&m)?,
                }
            }
            _ => err("unknown request")?,
        }
    }
}

/// Unmount (not lazily: a busy mount stays, and the answer names who
/// holds it).
fn unmount(mp: &Path) -> std::result::Result<(), String> {
    let r = if rustix::process::geteuid().is_root() {
        rustix::mount::unmount(mp, rustix::mount::UnmountFlags::empty())
            .map_err(std::io::Error::from)
    } else {
        match std::process::Command::new(fusermount3().ok_or_else(|| NO_FUSERMOUNT3.to_string())?)
            .arg("-u")
            .arg(mp)
            .output()
        {
            Ok(o) if o.status.success() => Ok(()),
            Ok(o) if String::from_utf8_lossy(&o.stderr).contains("busy") => Err(
                std::io::Error::from_raw_os_error(rustix::io::Errno::BUSY.raw_os_error()),
            ),
            Ok(o) => Err(std::io::Error::other(
                String::from_utf8_lossy(&o.stderr).trim().to_string(),
            )),
            Err(e) => Err(e),
        }
    };
    match r {
        Ok(()) => Ok(()),
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::BUSY.raw_os_error()) => {
            let h = holders(mp);
            Err(format!(
                "busy: {}",
                if h.is_empty() {
                    "open files or working directories".to_string()
                } else {
                    h.join(", ")
                }
            ))
        }
        Err(e) => Err(e.to_string()),
    }
}

/// Processes with their working directory or an open file under `mp`,
/// other than this one and its children (the daemon's companion, whose log
/// descriptor names a path under the mount point but is the backing file):
/// a daemon mounted over its own workspace holds backing files whose paths
/// look the same as the mount's.
pub fn holders(mp: &Path) -> Vec<String> {
    let me = std::process::id();
    rewind_platform::holders(mp, |pid, parent| pid == me || parent == Some(me))
}

/// The `fusermount3` this process can run, which a user's mount and
/// unmount go through: the PATH first, then where distributions put it.
/// fuser mounts with an absolute path, so a daemon started with a PATH
/// that lacks it mounted, then could not unmount (helper-42, D258).
pub fn fusermount3() -> Option<std::path::PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(
            ["/usr/bin", "/bin", "/usr/local/bin", "/usr/sbin", "/sbin"]
                .iter()
                .map(std::path::PathBuf::from),
        )
        .map(|d| d.join("fusermount3"))
        .find(|f| {
            f.is_file() && rustix::fs::access(f.as_path(), rustix::fs::Access::EXEC_OK).is_ok()
        })
}

/// What a user without `fusermount3` is told.
pub const NO_FUSERMOUNT3: &str = "fusermount3 was not found or cannot be run by this user: a mount without root goes through it; install it (`sudo apt-get install fuse3`, `sudo dnf install fuse3`), or mount as root";

/// Whether this process may open /dev/fuse to serve a mount.
pub fn dev_fuse_usable() -> bool {
    rustix::fs::access(
        "/dev/fuse",
        rustix::fs::Access::READ_OK | rustix::fs::Access::WRITE_OK,
    )
    .is_ok()
}

/// A rewind mount whose daemon is gone: every request fails ENOTCONN.
pub(crate) fn is_dead_rewind_mount(path: &Path) -> bool {
    // statfs, not stat: the kernel answers a stat of the mount's root
    // from its attribute cache for the TTL, dead daemon or not; a statfs
    // always asks. ECONNABORTED: a request in flight when the daemon
    // died (D206).
    matches!(
        rustix::fs::statfs(path).err(),
        Some(rustix::io::Errno::NOTCONN | rustix::io::Errno::CONNABORTED)
    ) && is_rewind_mount(path)
}

/// Whether a rewind daemon's FUSE filesystem is mounted at `path`, live or
/// dead, this user's or another's (the mount table says; no request is
/// made of it).
pub fn is_rewind_mount(path: &Path) -> bool {
    rewind_platform::mount_at(path).is_some_and(|(kind, source)| {
        crate::FUSE_KINDS.contains(&kind.as_slice()) && source == b"rewind"
    })
}

/// Clear the mount of a daemon that died: detach the dead mount (its
/// requests fail with ENOTCONN) and remove its socket, so the directory
/// shows the backing tree again. The caller holds the mount point's
/// [`control::MountLock`] (D222).
pub fn detach_dead(mp: &Path) -> Result<()> {
    detach_dead_mount(mp)?;
    release_dead_backing(mp);
    Ok(())
}

/// [`detach_dead`] but for the private bind of the backing tree, which a
/// command that found the daemon dead midway still works through; it
/// calls [`release_dead_backing`] when done.
pub fn detach_dead_mount(mp: &Path) -> Result<()> {
    // Only rewind's own mount, and only a dead one: a daemon that exited
    // after it unmounted (`rewind unmount` answered by EOF, D194) leaves
    // the path showing what was under it, perhaps a filesystem mounted
    // there, which a lazy unmount would detach from under its users; and
    // a `rewind mount` of the path since the caller found its daemon
    // dead put a live one there, with its own sockets (D209).
    let r = if !is_dead_rewind_mount(mp) {
        Ok(())
    } else if rustix::process::geteuid().is_root() {
        rustix::mount::unmount(mp, rustix::mount::UnmountFlags::DETACH)
            .map_err(std::io::Error::from)
    } else {
        fusermount3()
            .ok_or_else(|| std::io::Error::other(NO_FUSERMOUNT3))
            .and_then(|f| {
                std::process::Command::new(f)
                    .args(["-u", "-z", "-q"])
                    .arg(mp)
                    .status()
            })
            .map(|_| ())
    };
    // EINVAL: not a mount point any more (someone else cleared it).
    match r {
        Ok(()) => {}
        Err(e) if e.raw_os_error() == Some(rustix::io::Errno::INVAL.raw_os_error()) => {}
        Err(e) => return Err(Error::io("detach the dead mount at", mp, e)),
    }
    control::remove_dead_sockets(mp);
    Ok(())
}

/// The rest of [`detach_dead`], after [`detach_dead_mount`]. Called when
/// the command that found the daemon dead is done, which may be after a
/// new `rewind mount` of the same path bound its own backing tree there:
/// that one is left alone.
pub fn release_dead_backing(mp: &Path) {
    if is_rewind_mount(mp) || control::socket_path(mp).exists() {
        return;
    }
    release_backing(&control::backing_path(mp));
}
