//! A workspace mounted with `rewind mount`: the link from a command to the
//! daemon serving it (see the `rewind-fuse` crate). The command works on
//! the backing tree through the path the daemon names; it asks the
//! daemon for the dirty set before a capture and for a frozen mount while
//! it rewinds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rewind_fuse::{Client, MountStatus};

use crate::capture::{Scope, Writers};
use crate::error::Result;

/// The error a path inside the mount of a dead daemon gives: ENOTCONN,
/// or ECONNABORTED for a request already in flight when it died (a hook
/// that read `rewind.toml` then failed closed on it: helper-29, D206).
pub fn is_dead_mount(e: &std::io::Error) -> bool {
    matches!(e.raw_os_error(), Some(107) | Some(103))
}

/// Detach the dead mounts `path` is inside (connecting to their daemon
/// does), so that it leads to the backing tree again.
pub fn detach_dead_above(path: &Path) -> Result<()> {
    let abs = std::path::absolute(path).unwrap_or_else(|_| path.to_path_buf());
    for a in abs.ancestors() {
        if rewind_fuse::socket_path(a).exists() {
            MountLink::connect(a)?;
        }
    }
    Ok(())
}

/// The view whose dead mount this process detached, if any: nothing is
/// there any more, and its workspace is elsewhere.
static DEAD_VIEW: Mutex<Option<PathBuf>> = Mutex::new(None);

/// `e` as said to the user: "not a workspace" inside a view this command
/// found dead becomes what happened and what to do.
pub fn explain_dead_view(e: crate::error::Error) -> crate::error::Error {
    let dead = DEAD_VIEW.lock().unwrap_or_else(|p| p.into_inner()).clone();
    match (e, dead) {
        (crate::error::Error::NotAWorkspace { path }, Some(view)) if path.starts_with(&view) => {
            crate::error::Error::Mount(rewind_fuse::Error::DeadView { path: view })
        }
        (e, _) => e,
    }
}

pub struct MountLink {
    client: Arc<Mutex<Client>>,
    /// How this process reaches, by path, the backing tree and what the
    /// mount hides (`.rewind/`): a private bind mount, or the workspace
    /// itself when mounted `--at VIEW`.
    access: PathBuf,
    /// Mounted at a view (see [`MountLink::is_view`]), known at connect.
    view: bool,
    /// Where the mount is (the workspace, or its view).
    point: PathBuf,
    /// The daemon died after this link connected: its dead mount is
    /// detached, captures walk, and the private bind of the backing tree
    /// (which this command still works through) goes when the link does.
    gone: AtomicBool,
    /// ... unless a new daemon mounted the same path meanwhile: its mount
    /// and its bind (at the same path) are left alone.
    replaced: AtomicBool,
    /// This link's [`Frozen`] guard is alive: the daemon serves nothing,
    /// so nothing may be written back through the mount (D255).
    frozen: Arc<AtomicBool>,
}

/// How long a freeze waits for the daemon to notice that the command
/// holding the previous one is gone.
const FROZEN_WAIT: std::time::Duration = std::time::Duration::from_secs(5);

fn lock(c: &Mutex<Client>) -> MutexGuard<'_, Client> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl MountLink {
    /// The daemon serving `root`, if any. A daemon that died leaves a dead
    /// mount: it is detached here, and the command goes on with the walk
    /// engine (the dirty set is an accelerator, never the source of truth).
    pub fn connect(root: &Path) -> Result<Option<MountLink>> {
        match Client::connect(root) {
            Ok(Some(client)) => Ok(Some(Self::linked(root, client))),
            Ok(None) => Ok(None),
            Err(rewind_fuse::Error::DaemonGone { .. }) => {
                // Held from here to the detach: a `rewind mount` of the
                // path waits, and then finds nothing dead (D222).
                let lock = rewind_fuse::MountLock::take(root);
                crate::failpoint::hit("mount:found-dead");
                rewind_fuse::detach_dead(root)?;
                drop(lock);
                // Mounted again since this command found it dead: the
                // dead mount is gone already, and the new daemon serves
                // this command too (D209).
                if let Ok(Some(client)) = Client::connect(root) {
                    return Ok(Some(Self::linked(root, client)));
                }
                if root.join(crate::capture::STATE_DIR).is_dir() {
                    say_walks(root);
                } else {
                    // A view: nothing here to walk, and the workspace it
                    // showed is elsewhere (helper-29, D207). The command
                    // fails "not a workspace … run `rewind init` there",
                    // which this replaces (helper-42, D263).
                    *DEAD_VIEW.lock().unwrap_or_else(|p| p.into_inner()) = Some(root.to_path_buf());
                }
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// The link to `client`, the daemon answering for `root`.
    fn linked(root: &Path, client: Client) -> MountLink {
        crate::failpoint::hit("mount:connected");
        let access = client.backing_path().to_path_buf();
        let view = client.is_view();
        MountLink {
            client: Arc::new(Mutex::new(client)),
            access,
            view,
            point: root.to_path_buf(),
            gone: AtomicBool::new(false),
            replaced: AtomicBool::new(false),
            frozen: Arc::new(AtomicBool::new(false)),
        }
    }

    /// Write back what programs wrote through shared mappings of files the
    /// kernel serves from its own page cache (a mount without passthrough:
    /// every mount made without CAP_SYS_ADMIN). Until the kernel writes
    /// those pages back (up to 30 s later) the daemon and the backing
    /// file have the old bytes, so a capture, even one that reads the
    /// file again (D250), saved them: a rewind and `undo` lost the writes
    /// (D255). `syncfs` on the mount writes them back through the daemon;
    /// with nothing dirty it costs a few microseconds. Never while frozen:
    /// the daemon would not serve the writes, and the capture waiting on
    /// them is what holds the freeze. Best effort: a daemon that died is
    /// found by the request that follows.
    fn write_back_mappings(&self) {
        if self.gone.load(Ordering::SeqCst) || self.frozen.load(Ordering::SeqCst) {
            return;
        }
        let _t = crate::trace::span("write back mappings");
        if let Err(e) = rewind_platform::Dir::open(&self.point).and_then(|d| d.syncfs()) {
            crate::trace::note(format_args!("write back mappings: {e}"));
        }
    }

    /// Wait until the writes the kernel has sent the daemon for `open`,
    /// the files open for writing (a mapping keeps its file open after
    /// its descriptor is closed), have reached it. `syncfs` starts them
    /// but does not wait on this mount: fuser answers `FUSE_SYNCFS` with
    /// ENOSYS, after which the kernel skips that wait. An `fsync` through
    /// the mount waits (`fuse_sync_writes`) before it asks the daemon.
    /// Measured on a mount without passthrough, a write through a mapping
    /// whose descriptor was closed: `syncfs` alone missed 16 of 1,800,
    /// with the `fsync` 0 of 1,500; a checkpoint took the old bytes, and
    /// `tests/fuse.rs` caught it under load (D299). Best effort, as the
    /// `syncfs`.
    fn wait_for_writes_in_flight(&self, open: &HashSet<Vec<u8>>) {
        use std::os::unix::ffi::OsStrExt;
        if open.is_empty() || self.frozen.load(Ordering::SeqCst) {
            return;
        }
        let _t = crate::trace::span("wait for writes in flight");
        let Ok(top) = rewind_platform::Dir::open(&self.point) else {
            return;
        };
        for rel in open {
            let rel = Path::new(std::ffi::OsStr::from_bytes(rel));
            let synced = top
                .open_read_beneath(rel)
                .map_err(|e| e.to_string())
                .and_then(|(f, _)| f.sync_data().map_err(|e| e.to_string()));
            if let Err(e) = synced {
                crate::trace::note(format_args!("wait for writes to {}: {e}", rel.display()));
            }
        }
    }

    /// `r` is the answer to a request; a daemon that died since connect
    /// is detached once (D194), and `r` becomes `Ok(None)`.
    fn unless_gone<T>(&self, r: rewind_fuse::Result<T>) -> Result<Option<T>> {
        match r {
            Ok(v) => Ok(Some(v)),
            Err(rewind_fuse::Error::DaemonGone { .. }) => {
                if !self.gone.swap(true, Ordering::SeqCst) {
                    let old = self.daemon_pid();
                    let mut new = matches!(Client::connect(&self.point), Ok(Some(c)) if c.daemon_pid() != old);
                    if !new {
                        let lock = rewind_fuse::MountLock::take(&self.point);
                        crate::failpoint::hit("mount:found-dead");
                        rewind_fuse::detach_dead_mount(&self.point)?;
                        drop(lock);
                        // Only a dead mount is detached: one still there
                        // was mounted since the check above (D209).
                        new = rewind_fuse::is_rewind_mount(&self.point);
                    }
                    self.replaced.store(new, Ordering::SeqCst);
                    if new {
                        rewind_platform::stderr_line!(
                            "rewind: the mount daemon for {} died during this command (another one serves it now); this command walks the tree instead",
                            self.point.display()
                        );
                    } else {
                        say_walks(&self.point);
                    }
                }
                Ok(None)
            }
            Err(e) => Err(e.into()),
        }
    }

    /// Where the mount is: the workspace itself, or its view.
    pub fn mount_point(&self) -> &Path {
        &self.point
    }

    pub fn access_path(&self) -> &Path {
        &self.access
    }

    /// Mounted at a view: the daemon's dirty set misses what is written in
    /// the workspace directory itself, so captures walk (D123).
    pub fn is_view(&self) -> bool {
        self.view
    }

    pub fn daemon_pid(&self) -> u32 {
        lock(&self.client).daemon_pid()
    }

    /// The daemon still holds this link's connection (a process that keeps
    /// the link between commands asks before reusing it).
    pub fn is_alive(&self) -> bool {
        !self.gone.load(Ordering::SeqCst) && lock(&self.client).is_alive()
    }

    /// What the next capture must look at (`scope`; `None`: everything),
    /// and which files the mount saw opened for writing (`writers`). With
    /// `take`, the capture promises to [`MountLink::commit`] after
    /// persisting, and its set is given back if it never does.
    pub fn dirty(&self, take: bool) -> Result<MountDirty> {
        if self.gone.load(Ordering::SeqCst) {
            return Ok(MountDirty::default());
        }
        self.write_back_mappings();
        let mut c = lock(&self.client);
        let d = if take { c.take_dirty() } else { c.peek_dirty() };
        drop(c);
        let Some(d) = self.unless_gone(d)? else {
            return Ok(MountDirty::default());
        };
        self.wait_for_writes_in_flight(&d.open);
        // A changed ignore file at the root changes everything.
        let everything = d.all || d.deep.contains(b"".as_slice());
        Ok(MountDirty {
            scope: (!everything).then(|| Scope::new(d.dirs, d.deep)),
            writers: Writers::new(d.reread, d.open),
        })
    }

    pub fn commit(&self) -> Result<()> {
        if self.gone.load(Ordering::SeqCst) {
            return Ok(());
        }
        let r = lock(&self.client).commit();
        self.unless_gone(r).map(|_| ())
    }

    /// Block the mount until the returned guard is dropped. A daemon that
    /// died serves nobody: there is nothing to block.
    pub fn freeze(&self) -> Result<Frozen> {
        let (client, open_for_writing) = if self.gone.load(Ordering::SeqCst) {
            (None, Vec::new())
        } else {
            self.write_back_mappings();
            // The caller holds the workspace lock, so whoever holds the
            // freeze is a command that died holding both: the daemon thaws
            // once it sees that connection close, a moment later. The
            // next command was refused in that moment (helper-44: 3 in
            // 140 kills), and left the mount showing a half-rewound tree.
            let started = std::time::Instant::now();
            let r = loop {
                let r = lock(&self.client).freeze();
                match &r {
                    Err(rewind_fuse::Error::Daemon { message, .. })
                        if message.contains(rewind_fuse::FROZEN_BY_ANOTHER)
                            && started.elapsed() < FROZEN_WAIT =>
                    {
                        std::thread::sleep(std::time::Duration::from_millis(5));
                    }
                    _ => break r,
                }
            };
            match self.unless_gone(r)? {
                Some(held) => (Some(Arc::clone(&self.client)), held),
                None => (None, Vec::new()),
            }
        };
        if client.is_some() {
            self.frozen.store(true, Ordering::SeqCst);
        }
        Ok(Frozen {
            client,
            changed: None,
            open_for_writing,
            link_frozen: Arc::clone(&self.frozen),
        })
    }

    pub fn status(&self) -> Result<MountStatus> {
        Ok(lock(&self.client).status()?)
    }

    pub fn unmount(&self) -> Result<()> {
        Ok(lock(&self.client).unmount()?)
    }
}

/// What a mount's daemon says before a capture (see [`MountLink::dirty`]).
#[derive(Default)]
pub struct MountDirty {
    pub scope: Option<Scope>,
    pub writers: Writers,
}

/// A frozen mount. Dropping it thaws the mount and invalidates the paths
/// given to [`Frozen::changed`] (everything if none were).
pub struct Frozen {
    client: Option<Arc<Mutex<Client>>>,
    changed: Option<Vec<Vec<u8>>>,
    open_for_writing: Vec<Vec<u8>>,
    /// The link's [`MountLink::frozen`], cleared once thawed.
    link_frozen: Arc<AtomicBool>,
}

impl Frozen {
    /// The workspace-relative paths of the files a tool still held open
    /// for writing through the mount when it froze (D244).
    pub fn open_for_writing(&self) -> &[Vec<u8>] {
        &self.open_for_writing
    }

    pub fn changed(&mut self, paths: impl IntoIterator<Item = Vec<u8>>) {
        let set: HashSet<Vec<u8>> = paths.into_iter().collect();
        self.changed = Some(set.into_iter().collect());
    }

    /// What changes from here on is not known (an apply that may stop half
    /// way): the thaw invalidates everything, unless told what changed.
    pub fn anything_may_change(&mut self) {
        self.changed = None;
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // A failure here is a daemon that died: its connection drop
        // already thawed and invalidated everything.
        if let Some(c) = &self.client {
            let _t = crate::trace::span("thaw + invalidate");
            let _ = lock(c).thaw(self.changed.as_deref());
        }
        self.link_frozen.store(false, Ordering::SeqCst);
    }
}

impl Drop for MountLink {
    fn drop(&mut self) {
        if self.gone.load(Ordering::SeqCst) && !self.replaced.load(Ordering::SeqCst) {
            rewind_fuse::release_dead_backing(&self.point);
        }
    }
}

fn say_walks(mountpoint: &Path) {
    rewind_platform::stderr_line!(
        "rewind: the mount daemon for {} had died; its dead mount is detached and this command walks the tree instead",
        mountpoint.display()
    );
}
