//! A workspace mounted with `rewind mount`: the link from a command to the
//! daemon serving it (see the `rewind-fuse` crate). The command works on
//! the backing tree through the path the daemon names; it asks the
//! daemon for the dirty set before a capture and for a frozen mount while
//! it rewinds.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, MutexGuard};

use rewind_fuse::{Client, MountStatus};

use crate::capture::Scope;
use crate::error::Result;

/// The error a path inside the mount of a dead daemon gives (ENOTCONN).
pub fn is_dead_mount(e: &std::io::Error) -> bool {
    e.raw_os_error() == Some(107)
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
}

fn lock(c: &Mutex<Client>) -> MutexGuard<'_, Client> {
    c.lock().unwrap_or_else(|p| p.into_inner())
}

impl MountLink {
    /// The daemon serving `root`, if any. A daemon that died leaves a dead
    /// mount: it is detached here, and the command goes on with the walk
    /// engine (the dirty set is an accelerator, never the source of truth).
    pub fn connect(root: &Path) -> Result<Option<MountLink>> {
        match Client::connect(root) {
            Ok(Some(client)) => {
                let access = client.backing_path().to_path_buf();
                let view = client.is_view();
                Ok(Some(MountLink {
                    client: Arc::new(Mutex::new(client)),
                    access,
                    view,
                    point: root.to_path_buf(),
                }))
            }
            Ok(None) => Ok(None),
            Err(rewind_fuse::Error::DaemonGone { .. }) => {
                rewind_fuse::detach_dead(root)?;
                eprintln!(
                    "rewind: the mount daemon for {} had died; its dead mount is detached and this command walks the tree instead",
                    root.display()
                );
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
        lock(&self.client).is_alive()
    }

    /// What the next capture must look at; `None`: everything. With
    /// `take`, the capture promises to [`MountLink::commit`] after
    /// persisting, and its set is given back if it never does.
    pub fn scope(&self, take: bool) -> Result<Option<Scope>> {
        let mut c = lock(&self.client);
        let d = if take {
            c.take_dirty()?
        } else {
            c.peek_dirty()?
        };
        // A changed ignore file at the root changes everything.
        if d.all || d.deep.contains(b"".as_slice()) {
            return Ok(None);
        }
        Ok(Some(Scope::new(d.dirs, d.deep)))
    }

    pub fn commit(&self) -> Result<()> {
        Ok(lock(&self.client).commit()?)
    }

    /// Block the mount until the returned guard is dropped.
    pub fn freeze(&self) -> Result<Frozen> {
        lock(&self.client).freeze()?;
        Ok(Frozen {
            client: Arc::clone(&self.client),
            changed: None,
        })
    }

    pub fn status(&self) -> Result<MountStatus> {
        Ok(lock(&self.client).status()?)
    }

    pub fn unmount(&self) -> Result<()> {
        Ok(lock(&self.client).unmount()?)
    }
}

/// A frozen mount. Dropping it thaws the mount and invalidates the paths
/// given to [`Frozen::changed`] (everything if none were).
pub struct Frozen {
    client: Arc<Mutex<Client>>,
    changed: Option<Vec<Vec<u8>>>,
}

impl Frozen {
    pub fn changed(&mut self, paths: impl IntoIterator<Item = Vec<u8>>) {
        let set: HashSet<Vec<u8>> = paths.into_iter().collect();
        self.changed = Some(set.into_iter().collect());
    }
}

impl Drop for Frozen {
    fn drop(&mut self) {
        // A failure here is a daemon that died: its connection drop
        // already thawed and invalidated everything.
        let _t = crate::trace::span("thaw + invalidate");
        let _ = lock(&self.client).thaw(self.changed.as_deref());
    }
}
