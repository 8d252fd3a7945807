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

/// The daemon's description of the server it keeps beside a mount.
pub fn companion(mountpoint: &Path) -> Result<rewind_fuse::Companion> {
    let program = std::env::current_exe()
        .map_err(|e| Error::Os(rewind_platform::Error::new("find", "the rewind binary", e)))?;
    // The server reads no `REWIND_*` variable the daemon was started with
    // (rule 4 compares the client's with none).
    let mut env: Vec<(OsString, Option<OsString>)> = std::env::vars_os()
        .filter(|(k, _)| k.as_bytes().starts_with(b"REWIND_"))
        .map(|(k, _)| (k, None))
        .collect();
    env.push((IN_PROCESS_VAR.into(), Some("1".into())));
    Ok(rewind_fuse::Companion {
        program,
        args: vec![
            VERB.into(),
            "--socket".into(),
            rewind_fuse::command_socket_path(mountpoint).into(),
        ],
        env,
    })
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

/// Run this command in the server of the mount `start` is in, if there is
/// one and it takes it; `None`: run it in this process (rule 2).
pub fn forward(start: &Path, cwd: &Path, args: Vec<OsString>) -> Option<i32> {
    // A relative cwd (the real one was unreadable) would name the
    // server's directory instead.
    if !env_allows_forwarding() || !cwd.is_absolute() {
        return None;
    }
    let root = Workspace::discover(start)?;
    let sock = UnixStream::connect(rewind_fuse::command_socket_path(&root)).ok()?;
    let umask = rewind_platform::set_umask(0o022);
    rewind_platform::set_umask(umask);
    let req = Request {
        exe: exe_identity(),
        umask,
        cwd: cwd.to_path_buf(),
        args,
    };
    rewind_platform::send_with_stdio(&sock, &req.encode()).ok()?;
    // "Accepted" and the exit code in one wakeup; a server that closes
    // before accepting never ran the command (rule 2).
    let mut answer = [0u8; 5];
    match rewind_platform::recv_all(&sock, &mut answer) {
        Ok(5) if answer[0] == ACCEPTED => Some(i32::from_le_bytes([
            answer[1], answer[2], answer[3], answer[4],
        ])),
        Ok(n) if n >= 1 && answer[0] == ACCEPTED => {
            eprintln!(
                "rewind: error: the command server of {} stopped while running this command (killed or crashed); like a killed command, it may have left it unfinished: the next command finishes an interrupted rewind; run it again",
                root.display()
            );
            Some(1)
        }
        _ => None,
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
    let listener = listen(&a.socket)?;
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
    };
    loop {
        rewind_platform::wait_readable(listener.as_fd()).map_err(|e| os("listen on", e))?;
        if let Ok((conn, _)) = listener.accept() {
            server.serve_one(conn);
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
fn listen(path: &Path) -> Result<UnixListener> {
    let os = |op, p: &Path, e| Error::Os(rewind_platform::Error::new(op, p, e));
    let tmp = path.with_extension(format!("cmd.{}", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    let l = UnixListener::bind(&tmp).map_err(|e| os("listen on", &tmp, e))?;
    std::fs::set_permissions(&tmp, std::os::unix::fs::PermissionsExt::from_mode(0o600))
        .map_err(|e| os("chmod", &tmp, e))?;
    std::fs::rename(&tmp, path).map_err(|e| os("listen on", path, e))?;
    Ok(l)
}

/// What came on a connection.
enum Received {
    Run(Request, [OwnedFd; 3]),
    /// A request from another build (its executable's identity).
    OtherBuild([u64; 3]),
}

/// The request on `conn`, if it is one.
fn receive(conn: &UnixStream, exe: [u64; 3]) -> Option<Received> {
    if !rewind_platform::peer_is_same_user(conn).ok()? {
        return None;
    }
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
    Some(Received::Run(req, fds))
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
}

impl Server {
    fn serve_one(&mut self, mut conn: UnixStream) {
        let (warm, watcher) = (&self.warm, &self.watcher);
        let (req, stdio) = match receive(&conn, self.exe) {
            Some(Received::Run(req, stdio)) => (req, stdio),
            Some(Received::OtherBuild(theirs)) => {
                let _ = conn.write_all(&[REFUSED]);
                // The binary this server was started from was replaced
                // (an upgrade): make way, and the daemon starts the new
                // one. A client of another install changes nothing.
                if self.program.as_deref().map(identity_of) == Some(theirs) {
                    eprintln!("rewind: serve-commands: the rewind binary was replaced; restarting");
                    std::process::exit(0);
                }
                return;
            }
            None => {
                let _ = conn.write_all(&[REFUSED]);
                return;
            }
        };
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
                let code = super::run_forwarded(req.args, req.cwd, warm, &mut self.parser);
                rewind_platform::set_umask(umask);
                code
            }
            Err(e) => {
                eprintln!("rewind: serve-commands: cannot take the client's streams: {e}");
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
