//! The command server of a mounted workspace (D93), and the client side
//! every command takes first.
//!
//! A command is a process: starting it, opening the ledger, preparing
//! SQLite's statements and reading its pages cold cost more than a
//! ten-edit checkpoint through the mount itself. While a workspace is
//! mounted, its daemon keeps `rewind serve-commands` running beside it
//! (restarted if it dies). A command run inside the mount connects to it,
//! hands over its arguments, working directory, umask and standard
//! streams (as file descriptors), and exits with the code the server
//! sends back. The server runs the same verb code on a workspace it keeps
//! open between commands, exactly like `rewind mcp` (D63).
//!
//! Rules, each against a failure:
//! 1. A command whose client dies dies with it: the server kills itself
//!    when the client hangs up mid-command, so a killed `rewind rewind`
//!    is interrupted exactly as if it had run in its own process (the
//!    crash rules of DESIGN §4 apply unchanged; the daemon restarts the
//!    server).
//! 2. Nothing is ever run twice or half-silently: a client falls back to
//!    running in its own process only when the server never started its
//!    command (no server, busy, refused); a server that dies after
//!    accepting is reported as an error.
//! 3. The server runs one command at a time and answers "busy" to the
//!    next instead of queueing it: a command never waits behind another
//!    one it would not have waited for in its own process.
//! 4. Only what cannot differ is handed over: a client whose environment
//!    sets a `REWIND_*` variable commands read (tracing, failpoints,
//!    engine overrides, `REWIND_IN_PROCESS`) runs in its own process, and
//!    so does one whose executable is not the server's (after an upgrade).
//! 5. Root's server over a user's workspace lets that user in (D151), and
//!    them alone, through a door only they may open: their commands could
//!    not run anywhere else (the history is hidden by the mount, and the
//!    backing tree is in root's runtime directory). What root does for
//!    them stays in their workspace: every workspace but this one is
//!    refused, and so is what would read or write a file elsewhere as
//!    root (`anchor FILE`, `verify --anchor`) or restore setuid bits
//!    (`--allow-setuid`). Their `rewind mcp` is started as a process of
//!    its own, confined the same way and killed when they hang up, and a
//!    busy server makes their command wait instead of running alone.
//! 6. A command the server accepted is finished even if the daemon dies
//!    meanwhile (D194): the server learns of it by SIGTERM
//!    (`PR_SET_PDEATHSIG`), which waits for the command to end; the
//!    command finds the daemon gone and walks. With SIGKILL, a `status`
//!    run just after a daemon was killed failed as "stopped while
//!    running" though nothing had stopped it.

use std::ffi::OsString;
use std::io::{Read, Write};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::os::unix::net::{UnixListener, UnixStream};
use std::path::{Path, PathBuf};

use rewind_fuse::wire::{Cursor, put_bytes};

use crate::error::{Error, Result};
use crate::warm::WarmSlot;
use crate::workspace::Workspace;

/// The hidden verb the daemon runs.
pub const VERB: &str = "serve-commands";
/// Set in the server's environment: commands it starts (none today) run in
/// their own process instead of asking the busy server.
pub const IN_PROCESS_VAR: &str = "REWIND_IN_PROCESS";

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Listen here
    #[arg(long)]
    socket: PathBuf,
    /// Root's mount over a user's workspace: let this user (its owner) in
    /// too, through a door in /run/rewind-owners (rule 5)
    #[arg(long, value_name = "UID", requires = "workspace")]
    owner: Option<u32>,
    /// The mount point: the door's name, and the one workspace the
    /// owner's commands may open
    #[arg(long, value_name = "DIR")]
    workspace: Option<PathBuf>,
}

/// Root's door for a workspace's owner (rule 5).
struct Door {
    owner: u32,
    workspace: PathBuf,
}

/// Who sent a command.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Caller {
    /// This server's own user.
    Same,
    /// The owner of the workspace root's mount serves (rule 5).
    Owner,
}

const PROTOCOL: u8 = 1;
const ACCEPTED: u8 = 1;
const BUSY: u8 = 2;
const REFUSED: u8 = 3;
/// Arguments, a path and a header fit easily; anything bigger is not ours.
const MAX_REQUEST: usize = 1 << 20;

/// `REWIND_*` variables that no verb the server runs reads (test
/// harnesses, the daemon, `rewind mcp`); any other one keeps a command in
/// its own process (rule 4).
const NOT_READ_BY_VERBS: &[&str] = &[
    "REWIND_TEST_",
    "REWIND_PROPTEST_CASES",
    "REWIND_MOUNT_INODE_FDS",
    "REWIND_MCP_PROFILE",
];

fn env_allows_forwarding() -> bool {
    std::env::vars_os().all(|(k, _)| {
        let k = k.as_bytes();
        !k.starts_with(b"REWIND_")
            || NOT_READ_BY_VERBS
                .iter()
                .any(|p| k.starts_with(p.as_bytes()) && (p.ends_with('_') || k == p.as_bytes()))
    })
}

/// The daemon's description of the server it keeps beside a mount;
/// `owner`: root's mount over this user's workspace (rule 5).
pub fn companion(mountpoint: &Path, owner: Option<u32>) -> Result<rewind_fuse::Companion> {
    let program = std::env::current_exe()
        .map_err(|e| Error::Os(rewind_platform::Error::new("find", "the rewind binary", e)))?;
    // The server reads no `REWIND_*` variable the daemon was started with
    // (rule 4 compares the client's with none).
    let mut env: Vec<(OsString, Option<OsString>)> = std::env::vars_os()
        .filter(|(k, _)| k.as_bytes().starts_with(b"REWIND_"))
        .map(|(k, _)| (k, None))
        .collect();
    env.push((IN_PROCESS_VAR.into(), Some("1".into())));
    let mut args: Vec<OsString> = vec![
        VERB.into(),
        "--socket".into(),
        rewind_fuse::command_socket_path(mountpoint).into(),
    ];
    if let Some(uid) = owner {
        args.extend([
            "--owner".into(),
            uid.to_string().into(),
            "--workspace".into(),
            mountpoint.into(),
        ]);
    }
    Ok(rewind_fuse::Companion { program, args, env })
}

/// Identity of the running executable: a server started from another
/// build refuses (rule 4).
fn exe_identity() -> [u64; 3] {
    identity_of(Path::new("/proc/self/exe"))
}

/// Device, inode and mtime of the file at `path`.
fn identity_of(path: &Path) -> [u64; 3] {
    match std::fs::metadata(path) {
        Ok(m) => [
            m.dev(),
            m.ino(),
            (m.mtime() as u64)
                .wrapping_mul(1_000_000_000)
                .wrapping_add(m.mtime_nsec() as u64),
        ],
        Err(_) => [0; 3],
    }
}

struct Request {
    exe: [u64; 3],
    umask: u32,
    cwd: PathBuf,
    args: Vec<OsString>,
}

impl Request {
    fn encode(&self) -> Vec<u8> {
        let mut body = vec![PROTOCOL];
        for x in self.exe {
            body.extend_from_slice(&x.to_le_bytes());
        }
        body.extend_from_slice(&self.umask.to_le_bytes());
        put_bytes(&mut body, self.cwd.as_os_str().as_bytes());
        body.extend_from_slice(&(self.args.len() as u32).to_le_bytes());
        for a in &self.args {
            put_bytes(&mut body, a.as_bytes());
        }
        let mut out = (body.len() as u32).to_le_bytes().to_vec();
        out.extend(body);
        out
    }

    fn decode(b: &[u8]) -> Option<Request> {
        let mut r = Cursor(b);
        if r.u8()? != PROTOCOL {
            return None;
        }
        let exe = [r.u64()?, r.u64()?, r.u64()?];
        let umask = r.u32()?;
        let cwd = PathBuf::from(OsString::from_vec(r.bytes()?.to_vec()));
        let n = r.u32()?;
        let args = (0..n)
            .map(|_| Some(OsString::from_vec(r.bytes()?.to_vec())))
            .collect::<Option<Vec<_>>>()?;
        r.is_done().then_some(Request {
            exe,
            umask,
            cwd,
            args,
        })
    }
}

/// How long the server waits for a request once a client connected.
const RECEIVE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(2);

/// At most this many MCP servers run for the owner at once (rule 5):
/// root's processes, which the owner's process limit does not count.
const OWNER_MCP_MAX: usize = 4;
static OWNER_MCP: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// Verbs the workspace's owner may hand to root's server (rule 5): the
/// server's own (D93), and those that otherwise run in their own
/// process but cannot for this user (`mcp` gets a process of its own).
const OWNER_VERBS: &[&str] = &["gc", "du", "mcp"];

/// How long the owner's command waits for root's busy server (rule 5)
/// before giving up.
const OWNER_WAIT: std::time::Duration = std::time::Duration::from_secs(120);

/// The verbs that change the tree by a rewind's plan.
const REWINDING_VERBS: &[&str] = &["rewind", "to", "replay", "undo", "restore"];

/// Run this command in the server of the mount `start` is in, if there is
/// one and it takes it; `None`: run it in this process (rule 2).
/// `verb`: a command-server verb (D93), or one of [`OWNER_VERBS`].
pub fn forward(
    start: &Path,
    cwd: &Path,
    verb: &std::ffi::OsStr,
    args: Vec<OsString>,
) -> Option<i32> {
    // A relative cwd (the real one was unreadable) would name the
    // server's directory instead.
    let server_verb = super::SERVER_VERBS.iter().any(|v| verb == *v);
    if !(server_verb || OWNER_VERBS.iter().any(|v| verb == *v))
        || !env_allows_forwarding()
        || !cwd.is_absolute()
    {
        return None;
    }
    let (socket, root, door) = match Workspace::discover(start) {
        Some(root) if server_verb => (rewind_fuse::command_socket_path(&root), root, false),
        Some(_) => return None,
        None => {
            let mp = super::mounted_by_another_user(start)?;
            (rewind_fuse::door_path(&mp), mp, true)
        }
    };
    let umask = rewind_platform::set_umask(0o022);
    rewind_platform::set_umask(umask);
    let json = args.iter().any(|a| a == "--json");
    let req = Request {
        exe: exe_identity(),
        umask,
        cwd: cwd.to_path_buf(),
        args,
    }
    .encode();
    // The server ends with this client (rule 1): a Ctrl-C here would stop
    // its rewind mid-way, unannounced (D353).
    let _finish_first = REWINDING_VERBS
        .iter()
        .any(|v| verb == *v)
        .then(crate::rewind::finish_first_waiting);
    let waited = std::time::Instant::now();
    loop {
        let sock = UnixStream::connect(&socket).ok()?;
        // Not this user's server, nor root's: its listener gets nothing,
        // this terminal least of all (helper-79).
        if let Err(e) = rewind_fuse::check_peer(&sock, &socket) {
            let e = Error::Mount(e);
            super::report(json, &e);
            return Some(e.exit_code());
        }
        rewind_platform::send_with_stdio(&sock, &req).ok()?;
        // "Accepted" and the exit code in one wakeup; a server that closes
        // before accepting never ran the command (rule 2).
        let mut answer = [0u8; 5];
        match rewind_platform::recv_all(&sock, &mut answer) {
            Ok(5) if answer[0] == ACCEPTED => {
                return Some(i32::from_le_bytes([
                    answer[1], answer[2], answer[3], answer[4],
                ]));
            }
            Ok(n) if n >= 1 && answer[0] == ACCEPTED => {
                rewind_platform::stderr_line!(
                    "rewind: error: the command server of {} stopped while running this command (killed or crashed), as if the command itself were killed: it may or may not have taken effect (`rewind list` shows what was recorded; the next command finishes an interrupted rewind), so check before running it again",
                    root.display()
                );
                return Some(1);
            }
            // The owner's command cannot run in its own process: it waits
            // for root's server (rule 5).
            Ok(n) if n >= 1 && answer[0] == BUSY && door && waited.elapsed() < OWNER_WAIT => {
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
            // Not runnable in this process either: say why, not "mounted
            // by another user".
            Ok(n) if n >= 1 && door => {
                let why = if answer[0] == BUSY {
                    format!(
                        "root's command server stayed busy for {} s",
                        OWNER_WAIT.as_secs()
                    )
                } else {
                    "root's command server refused this command: it runs another rewind binary than this one (run the one root's mount was started from), or this user does not own the workspace".into()
                };
                let e = Error::InvalidPath {
                    path: root,
                    reason: format!(
                        "is a workspace mounted by root; {why}; or run rewind as root (`sudo rewind`)"
                    ),
                };
                super::report(json, &e);
                return Some(e.exit_code());
            }
            _ => return None,
        }
    }
}

/// The pid of the command server of the mount at `mountpoint`, if one
/// listens (for `doctor`; the server answers the empty connection with a
/// refusal).
pub fn server_pid(mountpoint: &Path) -> Option<u32> {
    let sock = UnixStream::connect(rewind_fuse::command_socket_path(mountpoint)).ok()?;
    rewind_platform::peer_pid(&sock).ok()
}

/// `rewind serve-commands --socket PATH`: the server (started by the
/// mount daemon, not by hand).
pub fn run(a: Args) -> Result<()> {
    let os = |op, e| Error::Os(rewind_platform::Error::new(op, &a.socket, e));
    let door = match (a.owner, a.workspace) {
        (Some(owner), Some(workspace)) if owner != rewind_platform::euid() => {
            Some(Door { owner, workspace })
        }
        _ => None,
    };
    let listener = listen(&a.socket, door.as_ref())?;
    let ours = rewind_platform::file_id(&a.socket);
    // The owner's door is a second name for the same socket.
    let names: Vec<PathBuf> = std::iter::once(a.socket.clone())
        .chain(door.as_ref().map(|d| rewind_fuse::door_path(&d.workspace)))
        .collect();
    // Both threads wait with poll and accept without blocking: whichever
    // loses the race for a connection just waits again.
    listener
        .set_nonblocking(true)
        .map_err(|e| os("listen on", e))?;
    let watcher = Watcher::start(listener.try_clone().map_err(|e| os("listen on", e))?)
        .map_err(|e| os("start the watcher of", e))?;
    let mut server = Server {
        warm: WarmSlot::default(),
        exe: exe_identity(),
        program: std::env::current_exe().ok(),
        parser: <super::Cli as clap::CommandFactory>::command(),
        watcher,
        door,
    };
    // Rule 6: a daemon's death (SIGTERM) ends this server between
    // commands only.
    rewind_platform::terminate_between_jobs();
    loop {
        rewind_platform::wait_readable(listener.as_fd()).map_err(|e| os("listen on", e))?;
        rewind_platform::job_begins();
        if let Ok((conn, _)) = listener.accept() {
            server.serve_one(conn);
        }
        if rewind_platform::job_ends() {
            // Its workspace goes first: a daemon found dead midway leaves
            // the bind of the backing tree to the link's drop.
            drop(server);
            // Its socket too, unless a new server's replaced it: the
            // command that cleared the dead mount saw this one still
            // listening, and left it (D223).
            for name in &names {
                if rewind_platform::file_id(name) == ours {
                    let _ = std::fs::remove_file(name);
                }
            }
            return Ok(());
        }
    }
}

/// The thread that watches a running command's client (rule 1) and
/// answers "busy" to the next ones (rule 3), so the command runs on the
/// main thread with no hop between threads on the way in or out.
struct Watcher {
    clients: std::sync::mpsc::Sender<UnixStream>,
    wake: UnixStream,
}

impl Watcher {
    fn start(listener: UnixListener) -> std::io::Result<Watcher> {
        let (clients, rx) = std::sync::mpsc::channel::<UnixStream>();
        let (wake, woken) = UnixStream::pair()?;
        std::thread::Builder::new()
            .name("rewind-watch".into())
            .spawn(move || {
                for client in rx {
                    watch_one(&client, &woken, &listener);
                }
            })?;
        Ok(Watcher { clients, wake })
    }
}

fn watch_one(client: &UnixStream, woken: &UnixStream, listener: &UnixListener) {
    loop {
        match rewind_platform::watch(client.as_fd(), woken.as_fd(), listener.as_fd()) {
            Ok(rewind_platform::Watched::Woken) => {
                let _ = (&*woken).read_exact(&mut [0u8; 1]);
                return;
            }
            // Rule 1: the client's hangup is this command's SIGKILL.
            Ok(rewind_platform::Watched::HungUp) => rewind_platform::kill_self(),
            Ok(rewind_platform::Watched::Incoming) => {
                if let Ok((mut next, _)) = listener.accept() {
                    let _ = next.write_all(&[BUSY]);
                }
            }
            // poll failed: the command runs to its end unwatched.
            Err(_) => return,
        }
    }
}

/// Bound under a temporary name and renamed into place, so a client never
/// connects to a socket nobody listens on yet.
fn listen(path: &Path, door: Option<&Door>) -> Result<UnixListener> {
    let os = |op, p: &Path, e| Error::Os(rewind_platform::Error::new(op, p, e));
    let tmp = temp_name(path);
    sweep_dead_temps(path);
    let l = UnixListener::bind(&tmp).map_err(|e| os("listen on", &tmp, e))?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| os("chmod", &tmp, e))?;
    if let Some(d) = door {
        // Root's own commands go on without it.
        if let Err(e) = open_door(&tmp, d) {
            rewind_platform::stderr_line!(
                "rewind: serve-commands: no door for the workspace's owner (uid {}): {e}; their commands say to use sudo",
                d.owner
            );
        }
    }
    std::fs::rename(&tmp, path).map_err(|e| os("listen on", path, e))?;
    Ok(l)
}

/// `KEY.cmd.PID`: where this server binds or links its socket before
/// renaming it to `KEY.cmd`.
fn temp_name(path: &Path) -> PathBuf {
    path.with_extension(format!("cmd.{}", std::process::id()))
}

/// Remove the temporary names beside `path` left by servers killed
/// between bind and rename (a daemon killed while starting its server):
/// each stayed in the runtime directory for good. A live server's is
/// its own, and this one's is about to be made again.
fn sweep_dead_temps(path: &Path) {
    let (Some(dir), Some(name)) = (path.parent(), path.file_name()) else {
        return;
    };
    let prefix = format!("{}.", name.to_string_lossy());
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for e in entries.flatten() {
        let n = e.file_name();
        let pid = n
            .to_str()
            .and_then(|n| n.strip_prefix(&prefix))
            .and_then(|p| p.parse::<u32>().ok());
        if let Some(pid) = pid
            && (pid == std::process::id() || !Path::new(&format!("/proc/{pid}")).exists())
        {
            let _ = std::fs::remove_file(e.path());
        }
    }
}

/// Give the socket at `sock` to the workspace's owner (connecting needs
/// write permission on it; its mode stays 0600) and link it into
/// [`rewind_fuse::DOORS_DIR`], which anyone may pass through and no one
/// but root may list or write (rule 5).
fn open_door(sock: &Path, d: &Door) -> Result<()> {
    use std::os::unix::fs::{MetadataExt, PermissionsExt};
    let os = |op, p: &Path, e| Error::Os(rewind_platform::Error::new(op, p, e));
    let dir = Path::new(rewind_fuse::DOORS_DIR);
    match std::fs::create_dir(dir) {
        Ok(()) => {}
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
        Err(e) => return Err(os("create", dir, e)),
    }
    let md = std::fs::symlink_metadata(dir).map_err(|e| os("stat", dir, e))?;
    if !md.is_dir() || md.uid() != 0 {
        return Err(os(
            "use",
            dir,
            std::io::Error::other("is not a directory of root's"),
        ));
    }
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o711))
        .map_err(|e| os("chmod", dir, e))?;
    std::os::unix::fs::chown(sock, Some(d.owner), None).map_err(|e| os("chown", sock, e))?;
    let door = rewind_fuse::door_path(&d.workspace);
    let tmp = temp_name(&door);
    sweep_dead_temps(&door);
    std::fs::hard_link(sock, &tmp).map_err(|e| os("link", &tmp, e))?;
    std::fs::rename(&tmp, &door).map_err(|e| os("open the door at", &door, e))
}

/// What came on a connection.
enum Received {
    Run(Request, [OwnedFd; 3], Caller),
    /// A request from another build (its executable's identity).
    OtherBuild([u64; 3]),
}

/// The request on `conn`, if it is one from this server's user or the
/// owner it opened its door to.
fn receive(conn: &UnixStream, exe: [u64; 3], door: Option<&Door>) -> Option<Received> {
    let uid = rewind_platform::peer_uid(conn).ok()?;
    let caller = if uid == rewind_platform::euid() {
        Caller::Same
    } else if door.is_some_and(|d| d.owner == uid) {
        Caller::Owner
    } else {
        return None;
    };
    let mut len = [0u8; 4];
    let fds = rewind_platform::recv_with_fds(conn, &mut len).ok()?;
    let n = u32::from_le_bytes(len) as usize;
    if n > MAX_REQUEST {
        return None;
    }
    let mut body = vec![0u8; n];
    (&*conn).read_exact(&mut body).ok()?;
    let req = Request::decode(&body)?;
    if req.exe != exe {
        return Some(Received::OtherBuild(req.exe));
    }
    let fds: [OwnedFd; 3] = fds.try_into().ok()?;
    Some(Received::Run(req, fds, caller))
}

/// What the server keeps between commands.
struct Server {
    /// The workspace, open (D63).
    warm: WarmSlot,
    exe: [u64; 3],
    /// Where this server's binary was at its start.
    program: Option<PathBuf>,
    /// The CLI's parser: built once, not per command.
    parser: clap::Command,
    watcher: Watcher,
    door: Option<Door>,
}

impl Server {
    fn serve_one(&mut self, mut conn: UnixStream) {
        let (warm, watcher) = (&self.warm, &self.watcher);
        // A client that connects and sends nothing must not hold the
        // server (and every command after it) for ever (helper-20, D160).
        let _ = conn.set_read_timeout(Some(RECEIVE_TIMEOUT));
        let received = receive(&conn, self.exe, self.door.as_ref());
        let _ = conn.set_read_timeout(None);
        let (req, stdio, caller) = match received {
            Some(Received::Run(req, stdio, caller)) => (req, stdio, caller),
            Some(Received::OtherBuild(theirs)) => {
                let _ = conn.write_all(&[REFUSED]);
                // The binary this server was started from was replaced
                // (an upgrade): make way, and the daemon starts the new
                // one. A client of another install changes nothing.
                if self.program.as_deref().map(identity_of) == Some(theirs) {
                    rewind_platform::stderr_line!(
                        "rewind: serve-commands: the rewind binary was replaced; restarting"
                    );
                    std::process::exit(0);
                }
                return;
            }
            None => {
                let _ = conn.write_all(&[REFUSED]);
                return;
            }
        };
        // Only the owner gets here with `mcp` (their own one runs in their
        // process).
        let confine = match (caller, &self.door) {
            (Caller::Owner, Some(d)) => Some(d.workspace.as_path()),
            _ => None,
        };
        if let Some(workspace) = confine
            && super::scan_command_line(&req.args).is_some_and(|(verb, _)| verb == "mcp")
        {
            self.start_mcp(conn, req, stdio, workspace);
            return;
        }
        let Ok(watched) = conn.try_clone() else {
            let _ = conn.write_all(&[REFUSED]);
            return;
        };
        if watcher.clients.send(watched).is_err() {
            // The watcher is gone, so rule 1 cannot hold: make way for a
            // new server.
            let _ = conn.write_all(&[REFUSED]);
            std::process::exit(1);
        }
        if conn.write_all(&[ACCEPTED]).is_err() {
            // Stand the watcher down (a wake outranks the hangup).
            let _ = (&watcher.wake).write_all(b"x");
            return;
        }
        let code = match rewind_platform::StdioSwap::new(&stdio) {
            Ok(_swap) => {
                let umask = rewind_platform::set_umask(req.umask);
                let code = super::run_forwarded(req.args, req.cwd, warm, &mut self.parser, confine);
                rewind_platform::set_umask(umask);
                code
            }
            Err(e) => {
                rewind_platform::stderr_line!(
                    "rewind: serve-commands: cannot take the client's streams: {e}"
                );
                1
            }
        };
        // The watcher stands down before the client, told its code, hangs up.
        let _ = (&watcher.wake).write_all(b"x");
        if code != 0 {
            // As the MCP server does: a failed command's workspace is not kept.
            warm.clear();
        }
        let _ = conn.write_all(&code.to_le_bytes());
    }

    /// The owner's `rewind mcp` (rule 5): a process of its own, on their
    /// streams, confined to `workspace`, killed when they hang up; this
    /// server goes on serving commands meanwhile.
    fn start_mcp(&self, mut conn: UnixStream, req: Request, stdio: [OwnedFd; 3], workspace: &Path) {
        let Some(program) = self.program.clone() else {
            let _ = conn.write_all(&[REFUSED]);
            return;
        };
        use std::sync::atomic::Ordering;
        if OWNER_MCP.fetch_add(1, Ordering::SeqCst) >= OWNER_MCP_MAX {
            OWNER_MCP.fetch_sub(1, Ordering::SeqCst);
            let _ = conn.write_all(&[BUSY]);
            return;
        }
        // Counted down however the session thread ends, or if it never
        // starts.
        struct Session;
        impl Drop for Session {
            fn drop(&mut self) {
                OWNER_MCP.fetch_sub(1, Ordering::SeqCst);
            }
        }
        let session = Session;
        let [stdin, stdout, stderr] = stdio;
        let mut cmd = std::process::Command::new(program);
        cmd.args(req.args.iter().skip(1))
            .current_dir(&req.cwd)
            .env(crate::workspace::CONFINE_VAR, workspace)
            .stdin(stdin)
            .stdout(stdout)
            .stderr(stderr);
        let umask = req.umask;
        // The thread that watches the client starts the server: it dies
        // with that thread (rule 1).
        let _ = std::thread::Builder::new()
            .name("rewind-mcp".into())
            .spawn(move || {
                let _session = session;
                let mut child = match rewind_platform::spawn_tied(&mut cmd, umask) {
                    Ok(c) => c,
                    Err(e) => {
                        rewind_platform::stderr_line!(
                            "rewind: serve-commands: cannot start the owner's MCP server: {e}"
                        );
                        let _ = conn.write_all(&[REFUSED]);
                        return;
                    }
                };
                if conn.write_all(&[ACCEPTED]).is_err() {
                    let _ = child.kill();
                    let _ = child.wait();
                    return;
                }
                match rewind_platform::child_or_hangup(conn.as_fd(), child.id()) {
                    Ok(rewind_platform::Ended::Child) => {}
                    Ok(rewind_platform::Ended::HungUp) | Err(_) => {
                        let _ = child.kill();
                    }
                }
                let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(1);
                let _ = conn.write_all(&code.to_le_bytes());
            });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_request_decodes_to_what_was_encoded_and_nothing_else() {
        let req = Request {
            exe: [1, 2, 3],
            umask: 0o027,
            cwd: PathBuf::from("/w/ä b"),
            args: vec!["rewind".into(), "checkpoint".into(), "".into()],
        };
        let bytes = req.encode();
        let body = &bytes[4..];
        let back = Request::decode(body).unwrap();
        assert_eq!(back.exe, [1, 2, 3]);
        assert_eq!(back.umask, 0o027);
        assert_eq!(back.cwd, req.cwd);
        assert_eq!(back.args, req.args);
        assert!(Request::decode(&body[..body.len() - 1]).is_none());
        let mut longer = body.to_vec();
        longer.push(0);
        assert!(Request::decode(&longer).is_none());
    }
}
