//! A workspace kept open between the calls of a long-lived process
//! (`rewind mcp`, D63). Opening one costs a ledger connection, SQLite's
//! statement preparation and, when the last connection closes, folding
//! the WAL into the main file: a few milliseconds that a server pays once
//! instead of per call. Between calls the workspace holds no lock, and it
//! is reused only while it still stands for the same files
//! ([`Workspace::is_current`]).

use std::ops::{Deref, DerefMut};
use std::path::Path;
use std::sync::{Arc, Mutex};

use crate::workspace::Workspace;

/// Where a server keeps its open workspace between calls.
#[derive(Clone, Default)]
pub struct WarmSlot(Arc<Mutex<Option<Workspace>>>);

impl WarmSlot {
    /// The kept workspace, if it is the one at `root` and still current.
    pub(crate) fn take(&self, root: &Path) -> Option<Workspace> {
        let ws = self.lock().take()?;
        (ws.root_path() == root && ws.is_current()).then_some(ws)
    }

    /// Forget the kept workspace (after a failed call: the next opens anew).
    pub fn clear(&self) {
        self.lock().take();
    }

    fn put(&self, ws: Workspace) {
        *self.lock() = Some(ws);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Option<Workspace>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// The workspace of one command. Dropped, it goes back to its server's
/// slot with its lock released; in a plain CLI command it just closes.
pub struct Held<'a> {
    ws: Option<Workspace>,
    slot: Option<&'a WarmSlot>,
}

impl<'a> Held<'a> {
    pub(crate) fn new(ws: Workspace, slot: Option<&'a WarmSlot>) -> Held<'a> {
        if slot.is_some() {
            ws.ledger().defer_wal_folds();
        }
        Held { ws: Some(ws), slot }
    }
}

impl Deref for Held<'_> {
    type Target = Workspace;
    fn deref(&self) -> &Workspace {
        self.ws
            .as_ref()
            .expect("a Held workspace is present until dropped")
    }
}

impl DerefMut for Held<'_> {
    fn deref_mut(&mut self) -> &mut Workspace {
        self.ws
            .as_mut()
            .expect("a Held workspace is present until dropped")
    }
}

impl Drop for Held<'_> {
    fn drop(&mut self) {
        if let (Some(mut ws), Some(slot)) = (self.ws.take(), self.slot) {
            // A ledger opened for reading only (a read-only filesystem, a
            // full disk) is not kept: on a full disk it may hold the
            // ledger exclusively, locking every other process out while
            // the server idles, and the next call should see the space
            // freed since (helper-48, D273).
            if ws.ledger().is_read_only() {
                return;
            }
            ws.release();
            // The command is done; its reply goes out as the fold starts.
            ws.ledger().fold_wal_later();
            slot.put(ws);
        }
    }
}
