//! The control socket: how the CLI and the MCP server reach a mounted
//! workspace. It lives outside the mount (a process cannot reach the
//! backing tree through the mount, and `.rewind/` is hidden there), named
//! after the mount point, and tells the client a path that reaches the
//! backing tree (D53): the client then does its own capture and apply
//! there, asking the daemon only for what the daemon knows: the dirty
//! set, and a frozen mount while it rewinds.
//!
//! Frames: request `[op u8][len u32 le][payload]`, answer
//! `[status u8 (0 ok, 1 error)][len u32 le][payload]`. A connection that
//! closes while holding a taken dirty set or a frozen mount gives both
//! back: a killed client loses no change and blocks nobody.

use std::ffi::OsStr;
use std::io::{Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use crate::dirty::DirtySet;
use crate::error::{Error, Result};
pub(crate) use crate::wire::Cursor;
use crate::wire::{put_bytes, put_list};

pub(crate) const HELLO: u8 = 1;
pub(crate) const TAKE: u8 = 2;
pub(crate) const PEEK: u8 = 3;
pub(crate) const COMMIT: u8 = 4;
pub(crate) const FREEZE: u8 = 5;
pub(crate) const THAW: u8 = 6;
pub(crate) const STATUS: u8 = 7;
pub(crate) const UNMOUNT: u8 = 8;

/// Where the daemon's sockets live: outside any workspace, private to the
/// user.
pub fn runtime_dir() -> PathBuf {
    let uid = rustix::process::geteuid().as_raw();
    if uid == 0 {
        return PathBuf::from("/run/rewind");
    }
    match std::env::var_os("XDG_RUNTIME_DIR") {
        Some(d) if !d.is_empty() => PathBuf::from(d).join("rewind"),
        _ => PathBuf::from(format!("/tmp/rewind-{uid}")),
    }
}

/// [`runtime_dir`], made if missing, once it is sure to be this user's
/// alone: a directory (not a link to one) owned by this user that no one
/// else may enter. `/tmp/rewind-UID` can be made by anyone first: another
/// user who made it received a user's commands, their arguments and
/// their terminal (helper-79).
pub fn private_runtime_dir() -> Result<PathBuf> {
    let rt = runtime_dir();
    make_private(&rt, rustix::process::geteuid().as_raw())?;
    Ok(rt)
}

/// Make `rt` (mode 0700) unless it exists; then check that it is a
/// directory of user `me`'s that no one else may enter, closing it to
/// others if it is theirs.
fn make_private(rt: &Path, me: u32) -> Result<()> {
    use std::os::unix::fs::{DirBuilderExt, MetadataExt, PermissionsExt};
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(rt)
        .map_err(|e| Error::io("create", rt, e))?;
    let meta = std::fs::symlink_metadata(rt).map_err(|e| Error::io("inspect", rt, e))?;
    let why = if meta.file_type().is_symlink() {
        Some("a symbolic link".to_string())
    } else if !meta.is_dir() {
        Some("not a directory".to_string())
    } else if meta.uid() != me {
        Some(format!("it belongs to uid {}", meta.uid()))
    } else {
        None
    };
    if let Some(why) = why {
        return Err(Error::UnsafeRuntimeDir {
            path: rt.to_path_buf(),
            why,
        });
    }
    if meta.mode() & 0o077 != 0 {
        std::fs::set_permissions(rt, std::fs::Permissions::from_mode(0o700))
            .map_err(|e| Error::io("make private", rt, e))?;
    }
    Ok(())
}

/// Refuse the other end of `stream`, connected at `path`, unless it runs
/// as this user or as root (whose mount a workspace's owner reaches
/// through its door, D151): checked before anything is sent, a
/// descriptor least of all.
pub fn check_peer(stream: &UnixStream, path: &Path) -> Result<()> {
    let me = rustix::process::geteuid().as_raw();
    match rewind_platform::peer_uid(stream) {
        Ok(uid) if uid == me || uid == 0 => Ok(()),
        Ok(uid) => Err(Error::ForeignSocket {
            path: path.to_path_buf(),
            uid,
        }),
        Err(e) => Err(Error::io("check who listens at", path, e)),
    }
}

/// The name of a mount point's files in the runtime directory. FNV-1a:
/// stable across builds; the daemon's answer names its mount point, so a
/// collision is detected, not trusted.
fn key(mountpoint: &Path) -> String {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in mountpoint.as_os_str().as_bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    format!("{h:016x}")
}

/// The control socket of a mount point (an absolute, canonical path).
pub fn socket_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.sock", key(mountpoint)))
}

/// The socket of the command server kept beside a mount point's daemon.
pub fn command_socket_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.cmd", key(mountpoint)))
}

/// Where root's command servers open a door for a workspace's owner
/// (D151): root's runtime directory is closed to users (it holds the
/// backing trees' bind mounts, which bypass the permissions of the
/// directories above a workspace), so the door is a second name for the
/// command socket in a directory anyone may pass through but not list,
/// and only the owner may connect to.
pub const DOORS_DIR: &str = "/run/rewind-owners";

/// The door to the command server of root's mount at `mountpoint`, for
/// the workspace's owner.
pub fn door_path(mountpoint: &Path) -> PathBuf {
    Path::new(DOORS_DIR).join(format!("{}.cmd", key(mountpoint)))
}

/// Remove the sockets a mount point's daemon leaves in the runtime
/// directory (its own and its command server's, and the owner's door).
pub(crate) fn remove_sockets(mountpoint: &Path) {
    for s in sockets(mountpoint) {
        let _ = std::fs::remove_file(s);
    }
}

/// The sockets a mount point's daemon makes: its own, its command
/// server's, and root's door for the owner.
fn sockets(mountpoint: &Path) -> Vec<PathBuf> {
    let mut socks = vec![socket_path(mountpoint), command_socket_path(mountpoint)];
    if rustix::process::geteuid().is_root() {
        socks.push(door_path(mountpoint));
    }
    socks
}

/// Held while a mount point's mount changes hands: by a daemon from its
/// check for a dead mount there to its own mount, and by a command from
/// its check that the mount is dead to the detach. Without it, a `rewind
/// mount` between a command's check and its detach had its live mount
/// detached (helper-32, D222). An advisory `flock` on `KEY.lock` in the
/// runtime directory, dropped with the value; `None` when that file
/// cannot be made (the caller goes on unguarded, as before).
pub struct MountLock {
    file: std::fs::File,
    path: PathBuf,
}

impl MountLock {
    pub fn take(mountpoint: &Path) -> Option<MountLock> {
        Self::take_at(Self::path(mountpoint), true)
    }

    /// [`MountLock::take`] unless another holds it.
    pub(crate) fn try_take(mountpoint: &Path) -> Option<MountLock> {
        Self::take_at(Self::path(mountpoint), false)
    }

    fn path(mountpoint: &Path) -> PathBuf {
        runtime_dir().join(format!("{}.lock", key(mountpoint)))
    }

    /// The lock at `path`; without `wait`, `None` when it is held.
    fn take_at(path: PathBuf, wait: bool) -> Option<MountLock> {
        use rustix::fs::FlockOperation::{LockExclusive, NonBlockingLockExclusive};
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        loop {
            let file = std::fs::OpenOptions::new()
                .create(true)
                .truncate(false)
                .write(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .ok()?;
            let how = if wait {
                LockExclusive
            } else {
                NonBlockingLockExclusive
            };
            rustix::fs::flock(&file, how).ok()?;
            // Its last holder may have removed the file meanwhile
            // ([`MountLock::remove`]): a lock on that one guards nothing.
            let held = file.metadata().ok()?;
            if rewind_platform::file_id(&path) == Some((held.dev(), held.ino())) {
                return Some(MountLock { file, path });
            }
        }
    }

    /// Drop the lock and its file: nothing at the mount point is changing
    /// hands (a daemon that unmounted, a dead mount cleared). Kept, one
    /// file stayed per mount point ever used.
    pub fn remove(self) {
        let _ = std::fs::remove_file(&self.path);
        drop(self.file);
    }
}

/// Remove the lock files nobody holds from the runtime directory (D223):
/// one stayed per mount point whose daemon was killed. Run by each
/// daemon as it starts. A dead daemon's socket is not swept with them:
/// it is how the next command at its path knows the mount there is
/// dead, and clears it (swept, that command failed on the dead mount).
pub(crate) fn sweep_runtime_dir() {
    let Ok(entries) = std::fs::read_dir(runtime_dir()) else {
        return;
    };
    for e in entries.flatten() {
        if e.file_name().to_string_lossy().ends_with(".lock")
            && let Some(lock) = MountLock::take_at(e.path(), false)
        {
            lock.remove();
        }
    }
}

/// [`remove_sockets`] for a daemon found dead: only the sockets nobody
/// listens on. A new daemon of the same mount point (and its command
/// server) may have bound theirs since (D209).
pub(crate) fn remove_dead_sockets(mountpoint: &Path) {
    for s in sockets(mountpoint) {
        let refused = matches!(
            connect_within(&s, Duration::ZERO),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused
        );
        if refused {
            let _ = std::fs::remove_file(&s);
        }
    }
}

/// Where a mount over the workspace itself keeps the backing tree
/// reachable by path: a private bind mount (SQLite resolves symlinks, so
/// `/proc/self/fd/N` paths lead it back into the mount).
pub fn backing_path(mountpoint: &Path) -> PathBuf {
    runtime_dir().join(format!("{}.backing", key(mountpoint)))
}

fn frame(tag: u8, payload: &[u8]) -> Vec<u8> {
    let mut buf = Vec::with_capacity(5 + payload.len());
    buf.push(tag);
    buf.extend_from_slice(&(payload.len() as u32).to_le_bytes());
    buf.extend_from_slice(payload);
    buf
}

pub(crate) fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> std::io::Result<()> {
    w.write_all(&frame(tag, payload))
}

pub(crate) fn read_frame(r: &mut impl Read) -> std::io::Result<(u8, Vec<u8>)> {
    let mut head = [0u8; 5];
    r.read_exact(&mut head)?;
    let len = u32::from_le_bytes([head[1], head[2], head[3], head[4]]) as usize;
    if len > 1 << 30 {
        return Err(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            "control frame too large",
        ));
    }
    let mut payload = vec![0u8; len];
    r.read_exact(&mut payload)?;
    Ok((head[0], payload))
}

/// `[all u8][n u32]{[dir][has names u8][names list]}*[deep list][reread
/// list][open list]`; a daemon from before D247 sends neither of the last
/// two.
pub(crate) fn encode_dirty(d: &DirtySet) -> Vec<u8> {
    let mut out = vec![d.all as u8];
    out.extend_from_slice(&(d.dirs.len() as u32).to_le_bytes());
    for (dir, names) in &d.dirs {
        put_bytes(&mut out, dir);
        out.push(names.is_some() as u8);
        if let Some(ns) = names {
            put_list(&mut out, ns.iter());
        }
    }
    put_list(&mut out, d.deep.iter());
    put_list(&mut out, d.reread.iter());
    put_list(&mut out, d.open.iter());
    out
}

fn decode_dirty(b: &[u8]) -> Option<DirtySet> {
    let mut c = Cursor(b);
    let all = c.u8()? != 0;
    let n = c.u32()?;
    let mut dirs = std::collections::HashMap::new();
    for _ in 0..n {
        let dir = c.bytes()?.to_vec();
        let names = match c.u8()? {
            0 => None,
            _ => Some(c.list()?.into_iter().collect()),
        };
        dirs.insert(dir, names);
    }
    let deep = c.list()?.into_iter().collect();
    Some(DirtySet {
        all,
        dirs,
        deep,
        reread: c.list().unwrap_or_default().into_iter().collect(),
        open: c.list().unwrap_or_default().into_iter().collect(),
    })
}

/// What `rewind doctor` and the tests want to know about a mount.
#[derive(Debug, Clone, Default)]
pub struct MountStatus {
    pub pid: u32,
    pub generation: u64,
    pub passthrough: bool,
    /// Opens served by kernel passthrough, by the page cache (small files
    /// read-only, D73; everything without passthrough), and by the daemon
    /// alone (`FOPEN_DIRECT_IO`), since the mount.
    pub passthrough_opens: u64,
    pub cached_opens: u64,
    pub plain_opens: u64,
    pub inodes: u64,
    pub frozen: bool,
    /// Dirty directories waiting for the next checkpoint; `None`: all.
    pub dirty: Option<u64>,
    /// File descriptors the daemon holds (inode fds up to their cap,
    /// backing files, handles), against its limit.
    pub fds: u64,
    pub fd_limit: u64,
    /// How long the kernel trusts entries and attributes, in seconds
    /// (D67, D77: longer over the workspace itself than for a view).
    pub ttl_s: u64,
}

/// How long the daemon may take to accept a connection and to answer a
/// request it answers from memory (hello, status, the dirty set, commit):
/// under a millisecond normally, the slowest being a status that lists a
/// few hundred thousand descriptors (~0.5 s). Only a stopped or hung
/// daemon takes 5 s, and a command that waits longer looks hung itself.
/// Requests that may rightly take longer wait while the daemon runs
/// (`Client::wait_while_running`).
pub const ANSWER_TIMEOUT: Duration = Duration::from_secs(5);

fn is_timeout(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
    )
}

/// Connect to the socket `path`, waiting at most `limit` for a listener
/// whose backlog is full (a blocking connect would wait for ever).
fn connect_within(path: &Path, limit: Duration) -> std::io::Result<UnixStream> {
    use std::os::fd::{FromRawFd, OwnedFd};
    let bytes = path.as_os_str().as_bytes();
    // SAFETY: sockaddr_un is plain data.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    if bytes.len() >= addr.sun_path.len() {
        return Err(std::io::Error::from_raw_os_error(libc::ENAMETOOLONG));
    }
    addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (d, &b) in addr.sun_path.iter_mut().zip(bytes) {
        *d = b as libc::c_char;
    }
    let start = Instant::now();
    loop {
        // SAFETY: plain socket(2); the fd is owned at once.
        let fd = unsafe {
            libc::socket(
                libc::AF_UNIX,
                libc::SOCK_STREAM | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                0,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just created and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        use std::os::fd::AsRawFd;
        // SAFETY: `addr` is a valid sockaddr_un of the given size.
        let r = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t,
            )
        };
        if r == 0 {
            let s = UnixStream::from(fd);
            s.set_nonblocking(false)?;
            return Ok(s);
        }
        let e = std::io::Error::last_os_error();
        match e.raw_os_error() {
            Some(libc::EAGAIN) | Some(libc::EINTR) => {}
            _ => return Err(e),
        }
        if start.elapsed() >= limit {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The other end closed the connection instead of answering.
fn hung_up(e: &std::io::Error) -> bool {
    use std::io::ErrorKind::{BrokenPipe, ConnectionReset, UnexpectedEof};
    matches!(e.kind(), ConnectionReset | BrokenPipe | UnexpectedEof)
}

/// Process `pid` is gone, or a zombie, within a few seconds.
fn exits_soon(pid: u32) -> bool {
    if pid == 0 {
        return false;
    }
    let deadline = std::time::Instant::now() + Duration::from_secs(3);
    loop {
        if process_state(pid).is_none_or(|st| st == "Z" || st == "X") {
            return true;
        }
        if std::time::Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// The state letter of process `pid` (`R`, `S`, `T`, `Z`, ...), from its
/// stat line after the command name; `None` when there is no such process.
fn process_state(pid: u32) -> Option<String> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let after_comm = &stat[stat.rfind(')')? + 1..];
    after_comm.split_whitespace().next().map(str::to_string)
}

/// The process is stopped (SIGSTOP, a debugger): `T` or `t` in its stat.
fn is_stopped(pid: u32) -> bool {
    process_state(pid).is_some_and(|st| st == "T" || st == "t")
}

/// The daemon's answer to HELLO, `pid\nMOUNTPOINT\nBACKING`, when it is
/// the daemon of `mountpoint`: its pid (if it reads as one) and backing
/// path. Matched as bytes against the mount point the client expects,
/// not split at newlines or read as UTF-8: a path holding either is a
/// path, and the mount at it was unreachable (helper-29, D207). The
/// format itself is unchanged, so daemons and clients of other builds
/// still understand each other. (The check guards against another mount
/// point hashing to the same socket; the backing path is absolute.)
fn parse_hello(payload: &[u8], mountpoint: &Path) -> Option<(Option<u32>, PathBuf)> {
    let nl = payload.iter().position(|&b| b == b'\n')?;
    let (pid, rest) = (&payload[..nl], &payload[nl + 1..]);
    let backing = rest
        .strip_prefix(mountpoint.as_os_str().as_bytes())?
        .strip_prefix(b"\n")
        .filter(|b| b.starts_with(b"/"))?;
    let pid = std::str::from_utf8(pid).ok().and_then(|p| p.parse().ok());
    Some((pid, PathBuf::from(OsStr::from_bytes(backing))))
}

/// A connection to the daemon of one mount.
pub struct Client {
    stream: UnixStream,
    mountpoint: PathBuf,
    backing: PathBuf,
    pid: u32,
}

impl Client {
    /// Connect to the daemon serving `mountpoint` (canonical). `Ok(None)`:
    /// no daemon was started for it; `Err(DaemonGone)`: one was, and died.
    pub fn connect(mountpoint: &Path) -> Result<Option<Client>> {
        let sock = socket_path(mountpoint);
        let unresponsive = |pid| Error::Unresponsive {
            path: mountpoint.to_path_buf(),
            pid,
            secs: ANSWER_TIMEOUT.as_secs(),
        };
        let stream = match connect_within(&sock, ANSWER_TIMEOUT) {
            Ok(s) => s,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionRefused => {
                return Err(Error::DaemonGone {
                    path: mountpoint.to_path_buf(),
                });
            }
            // Its backlog is full: nobody has accepted for a while.
            Err(e) if e.kind() == std::io::ErrorKind::TimedOut => return Err(unresponsive(0)),
            Err(e) => return Err(Error::io("connect to the rewind daemon at", sock, e)),
        };
        check_peer(&stream, &sock)?;
        // The listener's pid, known before it answers anything.
        let peer = rewind_platform::peer_pid(&stream).unwrap_or(0);
        let io = |e: std::io::Error| {
            if is_timeout(&e) {
                unresponsive(peer)
            } else {
                Error::io("talk to the rewind daemon at", &sock, e)
            }
        };
        stream
            .set_read_timeout(Some(ANSWER_TIMEOUT))
            .and_then(|()| stream.set_write_timeout(Some(ANSWER_TIMEOUT)))
            .map_err(io)?;
        let hello = write_frame(&mut &stream, HELLO, &[]).and_then(|()| read_frame(&mut &stream));
        let (status, payload) = match hello {
            Ok(answer) => answer,
            // Killed as we connected: its socket took the connection, then
            // the process went (a daemon with many inodes takes a moment to
            // die). Gone is gone, as when the connect is refused (D192).
            Err(e) if hung_up(&e) && exits_soon(peer) => {
                return Err(Error::DaemonGone {
                    path: mountpoint.to_path_buf(),
                });
            }
            Err(e) => return Err(io(e)),
        };
        // Another mount hashed to the same socket name, or an error.
        let Some((pid, backing)) = (status == 0)
            .then(|| parse_hello(&payload, mountpoint))
            .flatten()
        else {
            return Ok(None);
        };
        Ok(Some(Client {
            stream,
            mountpoint: mountpoint.to_path_buf(),
            backing,
            pid: pid.unwrap_or(peer),
        }))
    }

    pub fn mountpoint(&self) -> &Path {
        &self.mountpoint
    }

    /// A view (`mount --at VIEW`): the workspace directory stays open to
    /// writes the daemon never sees (an editor beside the agent's view).
    /// A mount over the workspace itself reaches it through its private
    /// bind mount instead.
    pub fn is_view(&self) -> bool {
        self.backing != backing_path(&self.mountpoint)
    }

    pub fn daemon_pid(&self) -> u32 {
        self.pid
    }

    /// No answer is pending, so anything readable now is the daemon's end
    /// of the connection (EOF) or garbage: either way, not a usable link.
    pub fn is_alive(&self) -> bool {
        use std::os::fd::AsRawFd;
        let mut byte = 0u8;
        // SAFETY: the fd is this stream's, open for the call; one byte of
        // valid memory; MSG_PEEK leaves it in the socket.
        let n = unsafe {
            libc::recv(
                self.stream.as_raw_fd(),
                (&mut byte as *mut u8).cast(),
                1,
                libc::MSG_PEEK | libc::MSG_DONTWAIT,
            )
        };
        n < 0 && std::io::Error::last_os_error().kind() == std::io::ErrorKind::WouldBlock
    }

    /// A path that reaches the backing workspace root (not through the
    /// mount): the workspace itself for `--at VIEW`, else a private bind.
    pub fn backing_path(&self) -> &Path {
        &self.backing
    }

    fn call(&mut self, op: u8, payload: &[u8]) -> Result<Vec<u8>> {
        let sock = socket_path(&self.mountpoint);
        let (path, pid) = (&self.mountpoint, self.pid);
        let io = |e: std::io::Error| {
            if is_timeout(&e) {
                Error::Unresponsive {
                    path: path.clone(),
                    pid,
                    secs: ANSWER_TIMEOUT.as_secs(),
                }
            } else {
                Error::io("talk to the rewind daemon at", &sock, e)
            }
        };
        // Killed after it answered HELLO (on a busy machine a SIGKILL
        // lands a moment after kill(2) returns): gone, as at connect.
        let gone = |e: std::io::Error| {
            if hung_up(&e) && exits_soon(pid) {
                Error::DaemonGone { path: path.clone() }
            } else {
                io(e)
            }
        };
        write_frame(&mut self.stream, op, payload).map_err(gone)?;
        if matches!(op, FREEZE | THAW | UNMOUNT) {
            self.wait_while_running()?;
        }
        let (status, answer) = read_frame(&mut self.stream).map_err(gone)?;
        if status != 0 {
            return Err(Error::Daemon {
                path: self.mountpoint.clone(),
                message: String::from_utf8_lossy(&answer).into_owned(),
            });
        }
        Ok(answer)
    }

    /// Wait for the answer to a request that may rightly take long: a
    /// freeze waits for the requests inside the mount to finish (an
    /// `fsync` of a big file, say), a thaw invalidates every changed path
    /// in the kernel, an unmount that finds the mount busy lists who holds
    /// it. Waited for as long as the daemon runs; a stopped one (SIGSTOP,
    /// a debugger) is reported after [`ANSWER_TIMEOUT`].
    fn wait_while_running(&self) -> Result<()> {
        use std::os::fd::AsRawFd;
        loop {
            let mut p = libc::pollfd {
                fd: self.stream.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd for the duration of the call.
            let n = unsafe { libc::poll(&mut p, 1, ANSWER_TIMEOUT.as_millis() as i32) };
            if n > 0 {
                return Ok(());
            }
            if n < 0 {
                let e = std::io::Error::last_os_error();
                if e.kind() == std::io::ErrorKind::Interrupted {
                    continue;
                }
                return Err(Error::io(
                    "wait for the rewind daemon at",
                    socket_path(&self.mountpoint),
                    e,
                ));
            }
            if is_stopped(self.pid) {
                return Err(Error::Unresponsive {
                    path: self.mountpoint.clone(),
                    pid: self.pid,
                    secs: ANSWER_TIMEOUT.as_secs(),
                });
            }
        }
    }

    fn dirty(&mut self, op: u8) -> Result<DirtySet> {
        let b = self.call(op, &[])?;
        decode_dirty(&b).ok_or_else(|| Error::Daemon {
            path: self.mountpoint.clone(),
            message: "malformed dirty set".into(),
        })
    }

    /// Take the dirty set for a capture that will be committed; until
    /// [`Client::commit`], a new set collects further changes and a
    /// dropped connection gives the taken one back.
    pub fn take_dirty(&mut self) -> Result<DirtySet> {
        self.dirty(TAKE)
    }

    /// The dirty set, left in place (status, diff, dry runs).
    pub fn peek_dirty(&mut self) -> Result<DirtySet> {
        self.dirty(PEEK)
    }

    /// The capture of the taken set is committed.
    pub fn commit(&mut self) -> Result<()> {
        self.call(COMMIT, &[]).map(|_| ())
    }

    /// Block every request on the mount until [`Client::thaw`] (or until
    /// this connection closes). The answer: the workspace-relative paths
    /// of files still open for writing through the mount (a daemon from
    /// before D244 answers nothing, read as none).
    pub fn freeze(&mut self) -> Result<Vec<Vec<u8>>> {
        let b = self.call(FREEZE, &[])?;
        Ok(Cursor(&b).list().unwrap_or_default())
    }

    /// Resume the mount after the backing tree changed at `changed`
    /// (`None`: anywhere); the kernel forgets what it cached there.
    pub fn thaw(&mut self, changed: Option<&[Vec<u8>]>) -> Result<()> {
        let mut p = vec![changed.is_some() as u8];
        if let Some(c) = changed {
            put_list(&mut p, c.iter());
        }
        self.call(THAW, &p).map(|_| ())
    }

    pub fn status(&mut self) -> Result<MountStatus> {
        let b = self.call(STATUS, &[])?;
        let text = String::from_utf8_lossy(&b);
        let mut s = MountStatus::default();
        for line in text.lines() {
            let Some((k, v)) = line.split_once('=') else {
                continue;
            };
            let n = v.parse::<u64>().unwrap_or(0);
            match k {
                "pid" => s.pid = n as u32,
                "generation" => s.generation = n,
                "passthrough" => s.passthrough = n != 0,
                "passthrough_opens" => s.passthrough_opens = n,
                "cached_opens" => s.cached_opens = n,
                "plain_opens" => s.plain_opens = n,
                "inodes" => s.inodes = n,
                "frozen" => s.frozen = n != 0,
                "dirty" => s.dirty = (v != "all").then_some(n),
                "fds" => s.fds = n,
                "fd_limit" => s.fd_limit = n,
                "ttl_s" => s.ttl_s = n,
                _ => {}
            }
        }
        Ok(s)
    }

    /// Unmount; the daemon exits. A busy mount stays and says who holds it.
    pub fn unmount(&mut self) -> Result<()> {
        match self.call(UNMOUNT, &[]) {
            // The daemon exits as soon as the kernel ends the session,
            // sometimes before its answer is written.
            Err(Error::Io { source, .. }) if source.kind() == std::io::ErrorKind::UnexpectedEof => {
                Ok(())
            }
            // Gone before or while it unmounted: clear what it left.
            // Its lock file goes too: taken and dropped, it stayed.
            Err(Error::DaemonGone { .. }) => {
                let lock = MountLock::take(&self.mountpoint);
                let detached = crate::daemon::detach_dead(&self.mountpoint);
                if let Some(lock) = lock {
                    lock.remove();
                }
                detached
            }
            Err(Error::Daemon { message, .. }) if message.starts_with("busy: ") => {
                Err(Error::Busy {
                    path: self.mountpoint.clone(),
                    holders: message.trim_start_matches("busy: ").to_string(),
                })
            }
            r => r.map(|_| ()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hello(pid: &str, mp: &[u8], backing: &[u8]) -> Vec<u8> {
        [pid.as_bytes(), b"\n", mp, b"\n", backing].concat()
    }

    /// helper-79: `/tmp/rewind-UID` made first by another user, or a
    /// link put there, took a user's sockets. Only a directory of the
    /// user's own is used, and closed to others if it was open.
    #[test]
    fn the_runtime_directory_is_used_only_if_it_is_the_users_own() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let t = tempfile::tempdir().expect("tempdir");
        let me = rustix::process::geteuid().as_raw();
        let made = t.path().join("made/rewind");
        make_private(&made, me).expect("made");
        let mode = std::fs::metadata(&made).expect("stat").mode();
        assert_eq!(mode & 0o777, 0o700);
        // Ours but open to all: closed.
        std::fs::set_permissions(&made, std::fs::Permissions::from_mode(0o777)).expect("chmod");
        make_private(&made, me).expect("ours");
        assert_eq!(
            std::fs::metadata(&made).expect("stat").mode() & 0o777,
            0o700
        );
        // Another user's, as it looks to them.
        let err = make_private(&made, me + 1)
            .expect_err("another's")
            .to_string();
        assert!(err.contains(&format!("it belongs to uid {me}")), "{err}");
        // A link to a directory of ours is still a link.
        let link = t.path().join("link");
        std::os::unix::fs::symlink(&made, &link).expect("symlink");
        let err = make_private(&link, me).expect_err("a link").to_string();
        assert!(err.contains("a symbolic link"), "{err}");
        let file = t.path().join("file");
        std::fs::write(&file, b"").expect("write");
        assert!(make_private(&file, me).is_err());
    }

    #[test]
    fn a_dirty_set_round_trips_and_an_old_daemons_reads_as_no_reread() {
        let mut d = DirtySet::default();
        d.dirs
            .insert(b"src".to_vec(), Some([b"a.rs".to_vec()].into()));
        d.dirs.insert(b"docs".to_vec(), None);
        d.deep.insert(b"deep".to_vec());
        d.reread.insert(b"src/a.rs".to_vec());
        d.open.insert(b"log/x".to_vec());
        let wire = encode_dirty(&d);
        assert_eq!(decode_dirty(&wire), Some(d.clone()));
        // Before D247 the payload ended after the deep list.
        let mut old = d.clone();
        old.reread.clear();
        old.open.clear();
        let mut short = encode_dirty(&old);
        short.truncate(short.len() - 8);
        assert_eq!(decode_dirty(&short), Some(old));
    }

    #[test]
    fn a_mount_point_with_a_newline_or_no_utf8_is_still_its_daemons() {
        for mp in [&b"/w/a\nb"[..], b"/w/caf\xe9", b"/w/plain"] {
            let path = Path::new(OsStr::from_bytes(mp));
            let got = parse_hello(&hello("42", mp, b"/run/b\nx"), path);
            assert_eq!(
                got,
                Some((Some(42), PathBuf::from(OsStr::from_bytes(b"/run/b\nx"))))
            );
        }
    }

    #[test]
    fn another_mount_points_daemon_is_not_this_ones() {
        let path = Path::new("/w/a");
        assert_eq!(parse_hello(&hello("42", b"/w/a\nb", b"/b"), path), None);
        assert_eq!(parse_hello(&hello("42", b"/w/ab", b"/b"), path), None);
        assert_eq!(parse_hello(b"42", path), None);
        assert_eq!(parse_hello(b"", path), None);
    }
}
