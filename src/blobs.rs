//! Small objects live in the ledger, not in files.
//!
//! A file under [`INLINE_MAX`] bytes is stored as a row of the `blobs`
//! table (named by the SHA-256 of its bytes, like every object). Creating,
//! filling and renaming one inode per small file costs ~70 µs of metadata
//! work on XFS here; an INSERT into an open transaction costs a few. Trees
//! of many small files (source code, node_modules) are the common case.
//!
//! Walker threads hand blobs to a [`BlobWriter`]: the first 16 MiB ride in
//! the checkpoint's own transaction, anything beyond goes to a writer thread
//! with its own connection that commits every few MiB, so memory stays
//! bounded and the walk stays parallel. Either way every object a
//! checkpoint names is durable no later than the checkpoint (DESIGN §4
//! rule 6). Blobs written by a capture that then fails are harmless
//! orphans, like unreferenced object files.

use crate::ledger::{CachedRow, SideConnection};
use std::path::{Path, PathBuf};
use std::sync::mpsc::{SyncSender, sync_channel};
use std::sync::{Mutex, OnceLock};
use std::thread::JoinHandle;

use rusqlite::{Connection, OptionalExtension, params};

use crate::error::{Error, Result, db_err};
use crate::hash::Hash;

/// Files smaller than this are stored inline in the ledger.
pub const INLINE_MAX: u64 = 64 * 1024;

/// Commit the writer's transaction after this many bytes.
const COMMIT_EVERY: usize = 8 << 20;

/// ... or when no blob came for this long.
const IDLE_COMMIT: std::time::Duration = std::time::Duration::from_millis(20);

pub const SCHEMA: &str =
    "CREATE TABLE IF NOT EXISTS blobs(hash BLOB NOT NULL UNIQUE, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS chunked(hash BLOB PRIMARY KEY, manifest BLOB NOT NULL) WITHOUT ROWID;";

/// A second connection to the ledger, for small objects. It keeps the
/// WAL and `-shm` as the ledger's own does: closing last, it deleted
/// them, and the next command on a full disk could not make a new `-shm`
/// (every reader failed NO_SPACE; on XFS "unable to open database file";
/// helper-47, D267).
fn connect(path: &Path) -> Result<SideConnection> {
    let conn = SideConnection::new(
        crate::ledger::open_connection(path).map_err(db_err(path))?,
        path,
    );
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(db_err(path))?;
    conn.execute_batch("PRAGMA synchronous=FULL; PRAGMA mmap_size=268435456;")
        .map_err(db_err(path))?;
    Ok(conn)
}

/// Blobs kept in memory for the checkpoint's own transaction; beyond this
/// they spill to the writer thread.
const BUFFER_BUDGET: usize = 16 << 20;

type Blob = (Hash, Vec<u8>);

/// Collects blobs from many walker threads. Up to `BUFFER_BUDGET` bytes
/// stay in memory and are committed in the same transaction as the
/// checkpoint that names them (one fsync for an incremental checkpoint);
/// the rest goes to a writer thread with its own connection, committed
/// before `finish` returns.
pub struct BlobWriter {
    path: PathBuf,
    buffered: Mutex<(Vec<Blob>, usize)>,
    /// Chunk lists of chunked objects (32 bytes a chunk): always committed
    /// with the checkpoint's own transaction. A separate connection
    /// writing them waited for the spill thread's write lock, and a first
    /// checkpoint on ext4 with both failed with "database is locked".
    manifests: Mutex<Vec<Blob>>,
    spill: OnceLock<Result<Spill>>,
}

struct Spill {
    tx: Mutex<Option<SyncSender<Blob>>>,
    handle: Mutex<Option<JoinHandle<Result<u64>>>>,
}

/// What `finish` hands back.
pub struct Finished {
    /// Bytes the writer thread stored that were new.
    pub spilled_new_bytes: u64,
    /// Blobs for the caller's transaction.
    pub buffered: Vec<Blob>,
    /// Chunk lists (object hash, manifest) for the caller's transaction.
    pub manifests: Vec<Blob>,
}

impl BlobWriter {
    pub fn new(ledger_path: &Path) -> BlobWriter {
        BlobWriter {
            path: ledger_path.to_owned(),
            buffered: Mutex::new((Vec::new(), 0)),
            manifests: Mutex::new(Vec::new()),
            spill: OnceLock::new(),
        }
    }

    /// Queue one blob.
    pub fn put(&self, hash: Hash, data: Vec<u8>) -> Result<()> {
        {
            let mut buf = self.buffered.lock().unwrap_or_else(|p| p.into_inner());
            if buf.1 + data.len() <= BUFFER_BUDGET {
                buf.1 += data.len();
                buf.0.push((hash, data));
                return Ok(());
            }
        }
        let spill = match self.spill.get_or_init(|| Spill::start(&self.path)) {
            Ok(s) => s,
            Err(e) => {
                return Err(Error::LedgerCorrupt {
                    path: self.path.clone(),
                    detail: format!("cannot store small objects: {e}"),
                });
            }
        };
        let tx = spill.tx.lock().unwrap_or_else(|p| p.into_inner()).clone();
        match tx.map(|tx| tx.send((hash, data))) {
            Some(Ok(())) => Ok(()),
            // The thread stopped on an error; `finish` reports it.
            _ => Err(self
                .stop_spill()
                .err()
                .unwrap_or_else(|| Error::LedgerCorrupt {
                    path: self.path.clone(),
                    detail: "the blob writer stopped".into(),
                })),
        }
    }

    /// Queue a chunked object's chunk list (see `objects::CHUNK_SIZE`).
    pub fn put_manifest(&self, hash: Hash, chunks: &[Hash]) {
        let manifest: Vec<u8> = chunks.iter().flat_map(|h| h.0).collect();
        self.manifests
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((hash, manifest));
    }

    /// Commit the spilled blobs and hand back the buffered ones.
    pub fn finish(self) -> Result<Finished> {
        let spilled_new_bytes = self.stop_spill()?;
        let buffered =
            std::mem::take(&mut self.buffered.lock().unwrap_or_else(|p| p.into_inner()).0);
        let manifests =
            std::mem::take(&mut *self.manifests.lock().unwrap_or_else(|p| p.into_inner()));
        Ok(Finished {
            spilled_new_bytes,
            buffered,
            manifests,
        })
    }

    fn stop_spill(&self) -> Result<u64> {
        let Some(Ok(spill)) = self.spill.get() else {
            return Ok(0);
        };
        drop(spill.tx.lock().unwrap_or_else(|p| p.into_inner()).take());
        let handle = spill
            .handle
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take();
        match handle {
            Some(h) => h.join().unwrap_or_else(|_| {
                Err(Error::LedgerCorrupt {
                    path: self.path.clone(),
                    detail: "the blob writer panicked".into(),
                })
            }),
            None => Ok(0),
        }
    }
}

impl Drop for BlobWriter {
    fn drop(&mut self) {
        let _ = self.stop_spill();
    }
}

impl Spill {
    fn start(path: &Path) -> Result<Spill> {
        let conn = connect(path)?;
        let thread_path = path.to_owned();
        let (tx, rx) = sync_channel::<Blob>(256);
        let handle = std::thread::Builder::new()
            .name("rewind-blobs".into())
            .spawn(move || -> Result<u64> {
                let err = db_err(&thread_path);
                let mut new_bytes = 0u64;
                let mut pending = 0usize;
                // The write lock is held only while blobs keep coming: a
                // transaction is opened by the first blob of a batch and
                // committed after COMMIT_EVERY bytes or an idle moment, so
                // other writers (another command, `guard`) are not locked
                // out for the whole capture.
                // (Plain BEGIN/COMMIT: an error drops the connection, which
                // rolls back what is open.)
                let mut open = false;
                loop {
                    let (hash, data) = match rx.recv_timeout(IDLE_COMMIT) {
                        Ok(b) => b,
                        Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                            if open {
                                conn.execute_batch("COMMIT").map_err(&err)?;
                                open = false;
                                pending = 0;
                            }
                            continue;
                        }
                        Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => break,
                    };
                    if !open {
                        conn.execute_batch("BEGIN IMMEDIATE").map_err(&err)?;
                        open = true;
                    }
                    if insert(&conn, &hash, &data).map_err(&err)? {
                        new_bytes += data.len() as u64;
                        pending += data.len();
                    }
                    if pending >= COMMIT_EVERY {
                        conn.execute_batch("COMMIT").map_err(&err)?;
                        open = false;
                        pending = 0;
                    }
                }
                if open {
                    conn.execute_batch("COMMIT").map_err(&err)?;
                }
                Ok(new_bytes)
            })
            .map_err(|e| Error::os(rewind_platform::Error::new("start blob writer", path, e)))?;
        Ok(Spill {
            tx: Mutex::new(Some(tx)),
            handle: Mutex::new(Some(handle)),
        })
    }
}

/// INSERT OR IGNORE one chunk list.
pub fn insert_manifest(conn: &Connection, hash: &Hash, manifest: &[u8]) -> rusqlite::Result<()> {
    conn.prepare_cached("INSERT OR IGNORE INTO chunked(hash, manifest) VALUES (?1, ?2)")?
        .execute(params![&hash.0[..], manifest])
        .map(|_| ())
}

/// INSERT OR IGNORE one blob; true if it was new.
pub fn insert(conn: &Connection, hash: &Hash, data: &[u8]) -> rusqlite::Result<bool> {
    let n = conn
        .prepare_cached("INSERT OR IGNORE INTO blobs(hash, data) VALUES (?1, ?2)")?
        .execute(params![&hash.0[..], data])?;
    Ok(n == 1)
}

/// Reads blobs through its own connection (opened on first use).
pub struct BlobReader {
    path: PathBuf,
    /// The ledger is on a read-only filesystem (D119).
    read_only: bool,
    conn: Mutex<Option<SideConnection>>,
}

impl BlobReader {
    pub fn new(ledger_path: &Path, read_only: bool) -> BlobReader {
        BlobReader {
            path: ledger_path.to_owned(),
            read_only,
            conn: Mutex::new(None),
        }
    }

    pub fn get(&self, hash: &Hash) -> Result<Option<Vec<u8>>> {
        self.with(|conn| {
            conn.cached_row(
                "SELECT data FROM blobs WHERE hash = ?1",
                [&hash.0[..]],
                |r| r.get(0),
            )
            .optional()
        })
    }

    /// Whether a small object is stored (without reading it).
    pub fn has(&self, hash: &Hash) -> Result<bool> {
        self.with(|conn| {
            conn.cached_row("SELECT 1 FROM blobs WHERE hash = ?1", [&hash.0[..]], |_| {
                Ok(())
            })
            .optional()
        })
        .map(|found| found.is_some())
    }

    /// The chunk list of a chunked object (see `objects::CHUNK_SIZE`).
    pub fn chunks(&self, hash: &Hash) -> Result<Option<Vec<Hash>>> {
        let manifest: Option<Vec<u8>> = self.with(|conn| {
            conn.cached_row(
                "SELECT manifest FROM chunked WHERE hash = ?1",
                [&hash.0[..]],
                |r| r.get(0),
            )
            .optional()
        })?;
        Ok(manifest.map(|m| decode_manifest(&m)))
    }

    /// Run `f`, whose reads of this reader then share one read
    /// transaction: each lookup on its own took and released the WAL's
    /// read lock, two `fcntl`s a lookup, for 60,000 lookups in a row
    /// (D321). What `f` reads is the ledger as of its first lookup.
    /// Best effort: without the transaction (one could not begin) each
    /// lookup takes its own, as before; a read has nothing to lose at its
    /// end, and is rolled back if it cannot be committed, so that no
    /// later call of a long-lived server reads an old snapshot.
    pub fn in_one_read<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        let began = self.with(|conn| conn.execute_batch("BEGIN")).is_ok();
        let out = f();
        if began && self.with(|conn| conn.execute_batch("COMMIT")).is_err() {
            let _ = self.with(|conn| conn.execute_batch("ROLLBACK"));
        }
        out
    }

    fn with<T>(&self, f: impl FnOnce(&Connection) -> rusqlite::Result<T>) -> Result<T> {
        let mut guard = self.conn.lock().unwrap_or_else(|p| p.into_inner());
        if guard.is_none() {
            *guard = Some(if self.read_only {
                SideConnection::new(
                    crate::ledger::connect_read_only(&self.path).map_err(db_err(&self.path))?,
                    &self.path,
                )
            } else {
                connect(&self.path)?
            });
        }
        match guard.as_ref() {
            Some(conn) => f(conn).map_err(db_err(&self.path)),
            None => Err(crate::error::Error::Usage(
                "internal: no ledger connection".into(),
            )),
        }
    }
}

/// A manifest is the chunks' hashes, 32 bytes each, in file order.
pub fn decode_manifest(m: &[u8]) -> Vec<Hash> {
    m.chunks_exact(32).filter_map(Hash::from_slice).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// D321: the reads of one call share a snapshot of the ledger, and
    /// nothing of it outlives the call, also when calls nest.
    #[test]
    fn reads_in_one_transaction_see_one_snapshot_and_leave_none_open() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("ledger.db");
        let w = crate::ledger::open_connection(&path).expect("open");
        w.execute_batch(&format!("PRAGMA journal_mode=WAL; {SCHEMA}"))
            .expect("schema");
        let put = |h: &Hash| {
            w.execute(
                "INSERT INTO blobs(hash, data) VALUES (?1, ?2)",
                params![&h.0[..], b"x".as_slice()],
            )
            .expect("insert")
        };
        let (a, b, c) = (Hash::of(b"a"), Hash::of(b"b"), Hash::of(b"c"));
        put(&a);
        let r = BlobReader::new(&path, false);
        let seen = r
            .in_one_read(|| {
                let before = r.has(&a)?;
                put(&b);
                Ok((before, r.has(&b)?))
            })
            .expect("read");
        assert_eq!(seen, (true, false), "one snapshot for the whole call");
        assert!(r.has(&b).expect("has"), "the next read sees the new row");
        let nested = r.in_one_read(|| r.in_one_read(|| r.has(&a)));
        assert!(nested.expect("nested"), "a nested call still reads");
        put(&c);
        assert!(r.has(&c).expect("has"), "no transaction was left open");
    }
}
