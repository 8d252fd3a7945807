//! The ledger: all metadata in one SQLite database, `.rewind/ledger.db`.
//!
//! WAL with `synchronous=FULL`: a commit that returned is on disk. Writers
//! use `BEGIN IMMEDIATE` so two writers never both read-then-write stale
//! state. Tree nodes live here too (small, many, shared); file contents live
//! in `.rewind/objects/`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rusqlite::{Connection, OptionalExtension, TransactionBehavior, params};
use serde::Serialize;

use crate::error::{Error, Result, db_err};
use crate::hash::Hash;
use crate::tree::{Node, SharedNode};
use std::collections::HashMap;

/// The ledger's format. 2: tree nodes may be stored compactly (D49),
/// which a format-1 rewind cannot read. A format-1 ledger is read as it is
/// and marked 2 when opened, so that an older rewind refuses it by its
/// version instead of calling its first compact node corrupt.
/// 3: the same tables as a format-2 ledger at [`MIGRATED`] 5, marked so
/// that every build before it refuses it by its version (D334): they
/// opened a ledger this build had migrated and wrote it without the rows
/// and keys they did not know (a stat cache that hid a skipped path, a
/// snapshot `gc` took for an orphan, a push admitted under its old key).
pub const FORMAT_VERSION: &str = "3";
const FORMAT_V1: &str = "1";
const FORMAT_V2: &str = "2";

/// What [`Ledger::migrate`] has brought a ledger up to, kept in SQLite's
/// `user_version` (the file header: no query plan, no table). A ledger
/// stamped with it skips the checks, eight statements parsed and run on
/// every open. Bump it when `migrate` learns something new: a build that
/// finds a higher stamp refuses the ledger (a later build's, D334).
pub const MIGRATED: i64 = 5;

const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS meta(key TEXT PRIMARY KEY, value TEXT NOT NULL) WITHOUT ROWID;
CREATE TABLE IF NOT EXISTS trees(hash BLOB NOT NULL UNIQUE, data BLOB NOT NULL);
CREATE TABLE IF NOT EXISTS checkpoints(
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    root BLOB NOT NULL,
    parent INTEGER REFERENCES checkpoints(seq),
    label TEXT,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    note TEXT,
    stats TEXT NOT NULL,
    pruned_at INTEGER
);
CREATE INDEX IF NOT EXISTS checkpoints_label ON checkpoints(label);
CREATE TABLE IF NOT EXISTS stat_cache(dir BLOB NOT NULL UNIQUE, node BLOB NOT NULL, stats BLOB NOT NULL, skips INTEGER NOT NULL DEFAULT 0);
CREATE TABLE IF NOT EXISTS intent(
    id INTEGER PRIMARY KEY CHECK (id = 1),
    op TEXT NOT NULL,
    target INTEGER NOT NULL,
    safety INTEGER NOT NULL,
    to_root BLOB NOT NULL,
    options TEXT NOT NULL,
    started_at INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS operations(
    seq INTEGER PRIMARY KEY,
    op TEXT NOT NULL,
    target INTEGER NOT NULL,
    safety INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    written INTEGER NOT NULL,
    deleted INTEGER NOT NULL
);
";

fn put_meta(conn: &Connection, key: &str, value: &str) -> rusqlite::Result<()> {
    conn.execute(
        "INSERT OR REPLACE INTO meta(key, value) VALUES (?1, ?2)",
        params![key, value],
    )?;
    Ok(())
}

fn genesis_fields(workspace_id: &str) -> crate::chain::Fields {
    crate::chain::Fields::new()
        .str("workspace", workspace_id)
        .str("format", FORMAT_VERSION)
}

/// Keep the WAL file when the last connection closes instead of deleting
/// it (D58): deleting and recreating it cost a WAL fsync per command. Up
/// to [`WAL_KEPT_ON_CLOSE`] its frames stay unfolded too (D70), so the
/// ledger is `ledger.db` together with `ledger.db-wal`.
fn persist_wal(conn: &Connection) {
    let mut on: std::os::raw::c_int = 1;
    // SAFETY: the handle is valid for the connection's lifetime, and
    // SQLITE_FCNTL_PERSIST_WAL reads and writes one int through the pointer.
    unsafe {
        rusqlite::ffi::sqlite3_file_control(
            conn.handle(),
            c"main".as_ptr(),
            rusqlite::ffi::SQLITE_FCNTL_PERSIST_WAL,
            (&mut on as *mut std::os::raw::c_int).cast(),
        );
    }
}

/// `query_row` and `execute` through the connection's statement cache: a
/// process that keeps the ledger open (`rewind mcp`, the command server,
/// D63) parses each statement once, not on every command (~20–50 µs each).
pub(crate) trait CachedRow {
    fn cached_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>;

    fn cached_execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize>;
}

impl CachedRow for Connection {
    fn cached_row<T, P, F>(&self, sql: &str, params: P, f: F) -> rusqlite::Result<T>
    where
        P: rusqlite::Params,
        F: FnOnce(&rusqlite::Row<'_>) -> rusqlite::Result<T>,
    {
        self.prepare_cached(sql)?.query_row(params, f)
    }

    fn cached_execute<P: rusqlite::Params>(&self, sql: &str, params: P) -> rusqlite::Result<usize> {
        self.prepare_cached(sql)?.execute(params)
    }
}

/// A read-write connection to the SQLite file at `path`, made if
/// missing, never through a symlink: a user's `.rewind/ledger.db` linked
/// to another workspace's ledger (or any database) made root's commands
/// read, append to and prune that one (helper-20, D160).
pub(crate) fn open_connection(path: &Path) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_WRITE
            | OpenFlags::SQLITE_OPEN_CREATE
            | OpenFlags::SQLITE_OPEN_URI
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_NOFOLLOW,
    )
}

/// A read-only connection to the ledger at `path` on a read-only
/// filesystem (see [`Ledger::open_read_only`]); the small-object reader
/// opens its own the same way.
pub(crate) fn connect_read_only(path: &Path) -> rusqlite::Result<Connection> {
    use rusqlite::OpenFlags;
    let immutable = if wal_path(path).exists() {
        ""
    } else {
        "&immutable=1"
    };
    // `readonly_shm`: an existing `-shm` is mapped read-only, never
    // truncated and regrown, which needs space on a full disk (D267); the
    // first connection then keeps the WAL's index in memory.
    let uri = format!("file:{}?mode=ro&readonly_shm=1{immutable}", uri_path(path));
    let flags = OpenFlags::SQLITE_OPEN_READ_ONLY
        | OpenFlags::SQLITE_OPEN_URI
        | OpenFlags::SQLITE_OPEN_NO_MUTEX
        | OpenFlags::SQLITE_OPEN_NOFOLLOW;
    let conn = Connection::open_with_flags(&uri, flags)?;
    conn.busy_timeout(BUSY_TIMEOUT)?;
    Ok(conn)
}

/// `path` for a `file:` URI: bytes outside the unreserved set escaped, so
/// a `?`, `#` or `%` in a workspace's path is not read as URI syntax.
fn uri_path(path: &Path) -> String {
    use std::fmt::Write;
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::new();
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-._~".contains(&b) {
            out.push(b as char);
        } else {
            let _ = write!(out, "%{b:02X}");
        }
    }
    out
}

/// `ledger.db-wal` beside `ledger.db`.
fn wal_path(db: &Path) -> PathBuf {
    crate::names::with_suffix(db, "-wal")
}

/// Why a ledger without tables is a history lost, not one whose
/// creation was killed (which the next checkpoint makes again), if it
/// is: a checkpoint was taken here (its capture leaves `clock` beside
/// the ledger; none runs before the ledger has tables), or objects of a
/// history lie beside it. An agent's `find . -size +100k -delete` took
/// the WAL, where a young history's every commit lives, and the next
/// command said "`rewind init` creates it again" (helper-63, D304).
pub(crate) fn lost_history(db: &Path) -> Option<String> {
    let dir = db.parent()?;
    let state = if dir.file_name() == Some(std::ffi::OsStr::new("state")) {
        dir.parent()?
    } else {
        dir
    };
    let has_objects =
        std::fs::read_dir(state.join("objects")).is_ok_and(|mut d| d.next().is_some());
    if !has_objects && !dir.join("clock").exists() {
        return None;
    }
    let wal = wal_path(db);
    Some(if stranded_wal(db).is_some() {
        format!(
            "it has no tables, though its WAL {} still holds the commits of a history: the main file was emptied; keep the WAL, and restore the main file from a backup",
            crate::names::human_os_path(&wal)
        )
    } else {
        format!(
            "it has no tables, though checkpoints were taken here: its WAL {}, which held every commit not yet folded into it, was deleted or emptied; put it back from a backup or the trash before anything else writes here",
            crate::names::human_os_path(&wal)
        )
    })
}

/// The size of a non-empty `-wal` beside `db`: commits of a history
/// whose main file is missing or empty are still in it, and must not be
/// overwritten by a new ledger (D212).
pub(crate) fn stranded_wal(db: &Path) -> Option<u64> {
    let wal = std::fs::read(wal_path(db)).ok()?;
    wal_has_commit(&wal).then_some(wal.len() as u64)
}

/// Whether a WAL holds a commit: a frame of its current generation (the
/// header's salts) that ends a transaction. One whose only frames were
/// never committed is what a killed creation leaves (helper-15), and is
/// no history.
fn wal_has_commit(wal: &[u8]) -> bool {
    let be32 = |b: &[u8], at: usize| {
        b.get(at..at + 4)
            .map(|x| u32::from_be_bytes([x[0], x[1], x[2], x[3]]))
    };
    let (Some(magic), Some(page)) = (be32(wal, 0), be32(wal, 8)) else {
        return false;
    };
    if magic & !1 != 0x377f_0682 || !(512..=65536).contains(&page) || !page.is_power_of_two() {
        return false;
    }
    let salts = &wal[16..24];
    let frame = 24 + page as usize;
    wal[32..]
        .chunks_exact(frame)
        .any(|f| &f[8..16] == salts && be32(f, 4).is_some_and(|n| n > 0))
}

/// fsync the directory holding `path`, so a file created in it survives a
/// power loss.
fn sync_parent(path: &Path) -> Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    rewind_platform::Dir::open(dir)
        .and_then(|d| d.fsync())
        .map_err(Error::os)
}

/// Free ledger pages given back to the filesystem at a time: 8 MiB of 4
/// KiB pages, 32 MiB in a ledger made before D165 (16 KiB pages).
const RELEASE_PAGES_PER_RUN: u32 = 2048;

/// A checkpoint row.
#[derive(Debug, Clone, Serialize)]
pub struct Checkpoint {
    #[serde(skip)]
    pub seq: i64,
    pub id: String,
    pub label: Option<String>,
    #[serde(serialize_with = "ser_parent")]
    pub parent: Option<(i64, String)>,
    pub kind: String,
    pub created_at: String,
    #[serde(skip)]
    pub created_at_ms: i64,
    #[serde(serialize_with = "ser_hash")]
    pub root: Hash,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
    #[serde(skip)]
    pub stats: serde_json::Value,
    /// Its contents were released by `gc`; the row (and its chain entry)
    /// stays so that history keeps its shape.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub pruned: bool,
}

fn ser_parent<S: serde::Serializer>(p: &Option<(i64, String)>, s: S) -> Result<S::Ok, S::Error> {
    match p {
        Some((_, id)) => s.serialize_str(id),
        None => s.serialize_none(),
    }
}

fn ser_hash<S: serde::Serializer>(h: &Hash, s: S) -> Result<S::Ok, S::Error> {
    s.serialize_str(&h.to_hex())
}

/// A rewind/replay/undo/restore in progress: persisted before the first file
/// is touched, cleared in the commit that finishes it (DESIGN §4 rule 3).
#[derive(Debug, Clone)]
pub struct Intent {
    pub op: String,
    pub target: i64,
    pub safety: i64,
    pub to_root: Hash,
    pub options: serde_json::Value,
}

/// A finished rewind-like operation, for `undo`.
#[derive(Debug, Clone)]
pub struct Operation {
    pub op: String,
    pub target: i64,
    pub safety: i64,
}

/// Checkpoints of the btrfs engine that are acknowledged (their snapshot
/// exists) but whose manifest is not built yet (`crate::snapshot`), and
/// ids of checkpoints that turned out identical to their parent and were
/// folded into it.
const PENDING_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS pending(
    seq INTEGER PRIMARY KEY,
    id TEXT NOT NULL UNIQUE,
    parent INTEGER,
    label TEXT,
    kind TEXT NOT NULL,
    created_at INTEGER NOT NULL,
    clock_ns INTEGER NOT NULL,
    reuse INTEGER NOT NULL
);
CREATE TABLE IF NOT EXISTS aliases(id TEXT PRIMARY KEY, seq INTEGER NOT NULL) WITHOUT ROWID;
";

/// A checkpoint acknowledged before its manifest exists (btrfs engine).
/// As JSON it is the record its snapshot holds (`crate::acknowledged`),
/// without the parent, which is HEAD when the row is committed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, serde::Deserialize)]
pub struct Pending {
    pub seq: i64,
    pub id: String,
    #[serde(skip)]
    pub parent: Option<i64>,
    pub label: Option<String>,
    pub kind: String,
    pub created_at_ms: i64,
    /// The filesystem clock just before the snapshot: the stat cache's
    /// racy cut-off for the manifest built from it.
    pub clock_ns: i64,
    /// Fold into the parent when the content is identical (automatic
    /// checkpoints).
    pub reuse: bool,
}

impl Pending {
    /// The checkpoint this will be once its manifest is built, with the
    /// root that a reading of its snapshot found (D266).
    pub fn as_checkpoint(&self, root: Hash, parent: Option<(i64, String)>) -> Checkpoint {
        Checkpoint {
            seq: self.seq,
            id: self.id.clone(),
            label: self.label.clone(),
            parent,
            kind: self.kind.clone(),
            created_at: crate::time::format_rfc3339(self.created_at_ms),
            created_at_ms: self.created_at_ms,
            root,
            note: None,
            stats: serde_json::Value::Null,
            pruned: false,
        }
    }
}

fn id_taken(conn: &Connection, id: &str) -> rusqlite::Result<bool> {
    conn.cached_row(
        "SELECT 1 FROM checkpoints WHERE id = ?1
         UNION ALL SELECT 1 FROM pending WHERE id = ?1
         UNION ALL SELECT 1 FROM aliases WHERE id = ?1",
        [id],
        |_| Ok(()),
    )
    .optional()
    .map(|o| o.is_some())
}

/// The next seq, and the first id `make(seq, nonce)` gives for nonce = 0,
/// 1, ... that no checkpoint, pending one or alias has taken.
fn fresh_id(
    conn: &Connection,
    mut make: impl FnMut(i64, u64) -> String,
) -> rusqlite::Result<(i64, String)> {
    let seq = next_seq(conn)?;
    let mut nonce = 0;
    loop {
        let id = make(seq, nonce);
        if !id_taken(conn, &id)? {
            return Ok((seq, id));
        }
        nonce += 1;
    }
}

fn next_seq(conn: &Connection) -> rusqlite::Result<i64> {
    conn.cached_row(
        "SELECT max(coalesce((SELECT max(seq) FROM checkpoints), 0),
                    coalesce((SELECT max(seq) FROM pending), 0)) + 1",
        [],
        |r| r.get(0),
    )
}

/// The paths each checkpoint skipped (unreadable, a FIFO, a mount point):
/// a rewind to it keeps whatever is there now (D143).
const SKIPPED_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS skipped(checkpoint INTEGER NOT NULL, path BLOB NOT NULL);
CREATE INDEX IF NOT EXISTS skipped_by_checkpoint ON skipped(checkpoint);
";

/// The stat cache's directories whose last listing skipped an entry
/// (D235): few, and a scoped capture reads them on every run.
const SKIPS_INDEX: &str = "
CREATE INDEX IF NOT EXISTS stat_cache_skips ON stat_cache(dir) WHERE skips != 0;
";

/// The files the last rewind restored, with their stat once in place
/// (D275, `crate::capture::Restored`): replaced by each rewind.
const RESTORED_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS restored(
    path BLOB PRIMARY KEY,
    ino INTEGER NOT NULL,
    size INTEGER NOT NULL,
    mtime_ns INTEGER NOT NULL,
    ctime_ns INTEGER NOT NULL,
    hash BLOB NOT NULL
) WITHOUT ROWID;
";

/// Notes left on abandoned branches, one row per rewind report.
const NOTES_SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS notes(
    seq INTEGER PRIMARY KEY,
    checkpoint INTEGER NOT NULL,
    created_at INTEGER NOT NULL,
    text TEXT NOT NULL
);
";

/// A note on a checkpoint (see [`Tx::set_note`]).
#[derive(Debug, Clone)]
pub struct Note {
    pub checkpoint: i64,
    pub created_at: String,
    pub text: String,
}

/// How a ledger was opened.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Access {
    ReadWrite,
    /// On a read-only filesystem: a write fails READ_ONLY (D119).
    ReadOnlyFs,
    /// On a full disk, where SQLite could not make or regrow the `-shm`
    /// it indexes the WAL in: a write fails NO_SPACE (D267).
    DiskFull,
}

pub struct Ledger {
    conn: Connection,
    path: PathBuf,
    /// Decoded tree nodes by hash. Content-addressed, so never stale; it
    /// holds only nodes read from, or committed to, this ledger. A process
    /// that keeps the ledger open (D63) diffs the next capture against
    /// the last one's nodes without reading and verifying them again.
    nodes: std::cell::RefCell<HashMap<Hash, SharedNode>>,
    /// What `nodes` holds, by [`crate::tree::Node::approx_bytes`].
    nodes_bytes: std::cell::Cell<usize>,
    /// Opened for reading only, and why ([`Ledger::open_read_only`]).
    access: Access,
    /// SQLite's `data_version` when a read that takes no lock began
    /// ([`Ledger::begin_unlocked_read`]): other connections' commits since
    /// move it.
    read_from: std::cell::Cell<Option<i64>>,
    /// Left at `synchronous=NORMAL` by a [`Ledger::write_without_sync`]
    /// that could not set it back: the next write sets it first.
    unsynced: bool,
    /// Where this workspace's anchor is kept (D313), found once: a stat,
    /// a statfs and a query that every commit repeated.
    kept_anchor: std::cell::OnceCell<Option<(String, PathBuf)>>,
}

/// How long a statement waits for another process's transaction.
const BUSY_TIMEOUT: Duration = Duration::from_secs(10);

/// Up to this much WAL, the last connection to close leaves it for the
/// next command instead of folding it into the main file (D70).
const WAL_KEPT_ON_CLOSE: u64 = 4 << 20;

impl Drop for Ledger {
    fn drop(&mut self) {
        before_close(&self.conn, &self.path);
    }
}

/// A second connection to a ledger (the small-object store's) that
/// closes as the ledger's own does ([`before_close`]).
pub(crate) struct SideConnection {
    conn: Connection,
    path: PathBuf,
}

impl SideConnection {
    /// Keeps the WAL and `-shm` as the ledger's own connection does
    /// ([`persist_wal`]).
    pub(crate) fn new(conn: Connection, path: &Path) -> SideConnection {
        persist_wal(&conn);
        SideConnection {
            conn,
            path: path.to_owned(),
        }
    }
}

impl std::ops::Deref for SideConnection {
    type Target = Connection;
    fn deref(&self) -> &Connection {
        &self.conn
    }
}

impl Drop for SideConnection {
    fn drop(&mut self) {
        before_close(&self.conn, &self.path);
    }
}

/// Called before a connection to the ledger at `path` closes, the
/// ledger's own and the small-object store's alike: whichever closes last
/// decides what becomes of the WAL. Folding it costs a command three
/// flushes (the main file's, and the next command's for a fresh WAL
/// header) and the page copies; a small WAL costs the next command's open
/// ~0.3 ms per MiB to index instead. Past the limit the fold runs as
/// before, so the WAL and every open stay bounded.
pub(crate) fn before_close(conn: &Connection, path: &Path) {
    let small = std::fs::metadata(wal_path(path)).is_ok_and(|m| m.len() <= WAL_KEPT_ON_CLOSE);
    if small {
        // Failing leaves the default: the fold runs.
        let _ = conn.set_db_config(
            rusqlite::config::DbConfig::SQLITE_DBCONFIG_NO_CKPT_ON_CLOSE,
            true,
        );
    }
}

/// SQLite folds the WAL into the main file inside the commit that takes
/// it past this many frames (its default, 1,000). A server holding the
/// ledger between commands leaves that fold to a thread after the reply
/// instead ([`Ledger::defer_wal_folds`], D181).
const FOLD_AT_FRAMES: i32 = 1000;

/// A deferred fold that never got through (always busy) is made by the
/// commit again past this, as without D181, so the WAL stays bounded.
const FOLD_IN_COMMIT_AT_FRAMES: i32 = 4 * FOLD_AT_FRAMES;

/// Frames in the WAL after the last commit through a connection whose
/// folds are deferred. One per process: SQLite's hook is a plain
/// function. A process serving two ledgers may fold the other one (a
/// cheap no-op); the bound above still holds for each.
static WAL_FRAMES: std::sync::atomic::AtomicI32 = std::sync::atomic::AtomicI32::new(0);

/// A deferred fold is running (at most one per process).
static FOLDING: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

/// Replaces SQLite's automatic fold (which is itself a WAL hook) on a
/// connection whose folds are deferred.
fn count_wal_frames(wal: &rusqlite::hooks::Wal, frames: std::ffi::c_int) -> rusqlite::Result<()> {
    WAL_FRAMES.store(frames, std::sync::atomic::Ordering::Relaxed);
    if frames >= FOLD_IN_COMMIT_AT_FRAMES {
        // Busy (a reader or another fold) is not an error of the commit.
        let _ = wal.checkpoint_v2(rusqlite::hooks::CheckpointMode::PASSIVE);
    }
    Ok(())
}

impl Ledger {
    /// For a process that keeps this ledger open between commands (the
    /// command server, `rewind mcp`): the commit that takes the WAL past
    /// `FOLD_AT_FRAMES` no longer folds it (28–38 ms, every ~14th FUSE
    /// checkpoint); [`Ledger::fold_wal_later`] does, after the reply.
    pub fn defer_wal_folds(&self) {
        self.conn.wal_hook(Some(count_wal_frames));
    }

    /// Fold the WAL on a thread of its own if a commit left it past
    /// `FOLD_AT_FRAMES`. The thread's connection folds what is there
    /// without waiting for anyone (`PASSIVE`): a command arriving
    /// meanwhile reads and commits as usual, and the next commit after a
    /// complete fold starts the WAL over.
    pub fn fold_wal_later(&self) {
        use std::sync::atomic::Ordering;
        if WAL_FRAMES.load(Ordering::Relaxed) < FOLD_AT_FRAMES
            || FOLDING.swap(true, Ordering::AcqRel)
        {
            return;
        }
        WAL_FRAMES.store(0, Ordering::Relaxed);
        let path = self.path.clone();
        let started = std::thread::Builder::new()
            .name("rewind-fold-wal".into())
            .spawn(move || {
                if let Ok(conn) = open_connection(&path) {
                    // Closed last (the server's own connection went
                    // first), it must leave the WAL file as ours do.
                    persist_wal(&conn);
                    let _ = conn.busy_timeout(Duration::ZERO);
                    let _ = conn.query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |_| Ok(()));
                }
                FOLDING.store(false, Ordering::Release);
            });
        if started.is_err() {
            FOLDING.store(false, Ordering::Release);
        }
    }

    /// Fold the WAL into the main file and start a new one, for a command
    /// off the agent's path (the detached manifest builder): the next
    /// command then indexes one frame on open instead of up to
    /// `WAL_KEPT_ON_CLOSE` of WAL (D74). The new WAL gets its first
    /// commit here (`wal_folded_at`), so its header's fsync is paid here
    /// too and not by the next command's commit. Never waits: if another
    /// connection is reading or writing, nothing happens and `false` is
    /// returned (that connection's own close decides). A writer arriving
    /// during the fold waits for it (a few ms) through its busy timeout.
    pub fn fold_wal_if_idle(&self) -> bool {
        let _t = crate::trace::span("fold WAL");
        if self.conn.busy_timeout(Duration::ZERO).is_err() {
            return false;
        }
        let busy = self
            .conn
            .query_row("PRAGMA wal_checkpoint(TRUNCATE)", [], |r| {
                r.get::<_, i64>(0)
            });
        let _ = self.conn.busy_timeout(BUSY_TIMEOUT);
        matches!(busy, Ok(0))
            && put_meta(
                &self.conn,
                "wal_folded_at",
                &crate::time::now_ms().to_string(),
            )
            .is_ok()
    }
}

/// Past this many nodes, or this many bytes of them
/// ([`crate::tree::Node::approx_bytes`]), the cache starts over.
const NODE_CACHE_MAX: usize = 4096;
const NODE_CACHE_MAX_BYTES: usize = 16 << 20;

const CHECKPOINT_COLS: &str = "c.seq, c.id, c.root, c.parent, p.id, c.label, c.kind, c.created_at, c.note, c.stats, c.pruned_at";

fn checkpoint_from_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<Checkpoint> {
    let root: Vec<u8> = r.get(2)?;
    let parent: Option<i64> = r.get(3)?;
    let parent_id: Option<String> = r.get(4)?;
    let created_at_ms: i64 = r.get(7)?;
    let stats: String = r.get(9)?;
    Ok(Checkpoint {
        seq: r.get(0)?,
        id: r.get(1)?,
        root: Hash::from_slice(&root).unwrap_or(Hash([0; 32])),
        parent: parent.zip(parent_id),
        label: r.get(5)?,
        kind: r.get(6)?,
        created_at: crate::time::format_rfc3339(created_at_ms),
        created_at_ms,
        note: r.get(8)?,
        stats: serde_json::from_str(&stats).unwrap_or(serde_json::Value::Null),
        pruned: r.get::<_, Option<i64>>(10)?.is_some(),
    })
}

/// Whether no table was ever made in this database (see
/// [`Ledger::never_finished`]).
fn has_no_tables(conn: &Connection) -> bool {
    conn.query_row("SELECT count(*) FROM sqlite_master", [], |r| {
        r.get::<_, i64>(0)
    })
    .is_ok_and(|tables| tables == 0)
}

/// `LEDGER_NEWER` when a later build wrote the ledger at `path` (D334): a
/// format number above this build's, or a schema stamp above
/// [`MIGRATED`]. A format that is no number is not judged here.
fn refuse_a_later_build(path: &Path, format: Option<&str>, schema: i64) -> Result<()> {
    let ours = FORMAT_VERSION.parse::<u32>().ok();
    let found = match format.and_then(|v| v.parse::<u32>().ok()) {
        Some(n) if ours.is_some_and(|o| n > o) => format!("ledger format {n}"),
        _ if schema > MIGRATED => format!("ledger schema {schema}"),
        _ => return Ok(()),
    };
    Err(Error::NewerLedger {
        path: path.to_owned(),
        found,
    })
}

impl Ledger {
    /// Open an existing ledger. A missing file is an error here (never
    /// silently recreated: that would orphan the history).
    pub fn open(path: &Path) -> Result<Ledger> {
        if !path.exists() {
            return Err(Error::LedgerMissing {
                path: path.to_owned(),
            });
        }
        let sidecars = ["-wal", "-shm"].map(|s| crate::names::with_suffix(path, s));
        let made = sidecars.clone().map(|p| !p.exists());
        let r = match Self::open_existing(path) {
            // On a full disk a reader goes on through a connection that
            // keeps the WAL's index in memory; the first write says
            // NO_SPACE (helper-47, D267).
            Err(e) if e.is_no_space() => Self::open_reading(path, Access::DiskFull).map_err(|_| e),
            r => r,
        };
        // A ledger that cannot be read was written nothing: the empty
        // sidecars this open made are not left beside it, where they
        // would be one more thing to copy aside (helper-29, D207).
        if let Err(Error::LedgerCorrupt { .. }) = r {
            for (p, made) in sidecars.iter().zip(made) {
                if made && std::fs::metadata(p).is_ok_and(|m| m.len() == 0) {
                    let _ = std::fs::remove_file(p);
                }
            }
        }
        r
    }

    fn open_existing(path: &Path) -> Result<Ledger> {
        let ledger = Self::connect(path, false)?;
        let version: Option<String> = ledger
            .conn
            .cached_row(
                "SELECT value FROM meta WHERE key = 'format_version'",
                [],
                |r| r.get(0),
            )
            .optional()
            .map_err(|e| match e {
                // Asked only once the read failed: every command opens here.
                _ if has_no_tables(&ledger.conn) => match lost_history(path) {
                    Some(detail) => Error::LedgerCorrupt {
                        path: path.to_owned(),
                        detail,
                    },
                    None => Error::LedgerUnfinished {
                        path: path.to_owned(),
                    },
                },
                rusqlite::Error::SqliteFailure(_, _) => db_err(path)(e),
                e => Error::LedgerCorrupt {
                    path: path.to_owned(),
                    detail: e.to_string(),
                },
            })
            .map_err(|e| match e {
                Error::Db { source, .. } => Error::LedgerCorrupt {
                    path: path.to_owned(),
                    detail: source.to_string(),
                },
                e => e,
            })?;
        // Its schema stamp is judged by `migrate`.
        refuse_a_later_build(path, version.as_deref(), 0)?;
        match version.as_deref() {
            Some(FORMAT_VERSION) => {
                let _t = crate::trace::span("migrate ledger");
                ledger.migrate()?;
                Ok(ledger)
            }
            Some(FORMAT_V1 | FORMAT_V2) => {
                ledger.migrate()?;
                // Best effort: a ledger we cannot write gets no compact
                // nodes either, and an older build may still write it.
                let _ = ledger.mark_format();
                Ok(ledger)
            }
            Some(v) => Err(Error::LedgerCorrupt {
                path: path.to_owned(),
                detail: format!(
                    "format version {v}, this rewind reads {FORMAT_V1} to {FORMAT_VERSION}"
                ),
            }),
            None => Err(Error::LedgerCorrupt {
                path: path.to_owned(),
                detail: "no format version".into(),
            }),
        }
    }

    /// Open the ledger of a workspace on a read-only filesystem, for the
    /// commands that only read (`list`, `verify`, `diff`, `status`): a disk
    /// remounted read-only after an error is when someone most needs to see
    /// what the history holds. SQLite reads a WAL database read-only when
    /// its `-wal` and `-shm` are there (they persist, D70 and D97); without
    /// a `-wal` everything is in the main file, which is then opened as
    /// immutable. Any write fails `READ_ONLY`; so does a ledger an older
    /// build wrote, which would need a migration first.
    pub fn open_read_only(path: &Path) -> Result<Ledger> {
        Self::open_reading(path, Access::ReadOnlyFs)
    }

    fn open_reading(path: &Path, access: Access) -> Result<Ledger> {
        if !path.exists() {
            return Err(Error::LedgerMissing {
                path: path.to_owned(),
            });
        }
        let read_only = || Error::read_only(path.to_owned());
        let version = |conn: &Connection| -> rusqlite::Result<(Option<String>, i64)> {
            conn.query_row(
                "SELECT (SELECT value FROM meta WHERE key = 'format_version'), \
                 (SELECT user_version FROM pragma_user_version)",
                [],
                |r| Ok((r.get(0)?, r.get(1)?)),
            )
        };
        let conn = connect_read_only(path).map_err(|_| read_only())?;
        let (conn, found) = match version(&conn) {
            // No `-shm` and none can be made (XFS has no inode left on a
            // full disk): SQLite keeps the WAL's index in this process's
            // memory instead, which it does only for a connection that
            // holds the ledger exclusively, for as long as it is open. A
            // reading command is short; another process waits for it
            // (D267).
            Err(e) if e.sqlite_error_code() == Some(rusqlite::ErrorCode::CannotOpen) => {
                // Its shared lock would keep the exclusive one waiting,
                // and an exclusive lock needs a descriptor open for
                // writing; nothing is written through it (`write` and
                // [`Access`] refuse first).
                drop(conn);
                let conn = open_connection(path).map_err(|_| read_only())?;
                conn.busy_timeout(BUSY_TIMEOUT).map_err(|_| read_only())?;
                let found = conn
                    .query_row("PRAGMA locking_mode=EXCLUSIVE", [], |_| Ok(()))
                    .and_then(|()| version(&conn));
                (conn, found)
            }
            found => (conn, found),
        };
        let (version, migrated) = found.map_err(|e| match e.sqlite_error_code() {
            Some(rusqlite::ErrorCode::CannotOpen) => read_only(),
            _ => Error::LedgerCorrupt {
                path: path.to_owned(),
                detail: e.to_string(),
            },
        })?;
        refuse_a_later_build(path, version.as_deref(), migrated)?;
        match version.as_deref() {
            // Format 3 is format 2 at schema 5, marked (D334).
            Some(FORMAT_VERSION | FORMAT_V2) if migrated == MIGRATED => {}
            _ => {
                return Err(Error::LedgerNeedsUpgrade {
                    path: path.to_owned(),
                });
            }
        }
        conn.set_prepared_statement_cache_capacity(64);
        Ok(Ledger {
            conn,
            path: path.to_owned(),
            nodes: Default::default(),
            nodes_bytes: Default::default(),
            access,
            unsynced: false,
            kept_anchor: std::cell::OnceCell::new(),
            read_from: Default::default(),
        })
    }

    /// Whether `path` is a database in which no table was ever made: the
    /// file of a ledger whose creation was interrupted (opening it rolls
    /// back a creation left half done in a rollback journal). False when
    /// it is missing or unreadable: those are reported by [`Ledger::open`].
    pub fn never_finished(path: &Path) -> bool {
        path.exists()
            && stranded_wal(path).is_none()
            && open_connection(path).is_ok_and(|c| has_no_tables(&c))
    }

    /// Create a new ledger with a fresh workspace id. Idempotent: on a
    /// ledger being created by another process at the same moment, its
    /// statements change nothing.
    pub fn create(path: &Path, workspace_id: &str) -> Result<Ledger> {
        let mut ledger = Self::connect(path, true)?;
        crate::failpoint::hit("ledger:created-empty");
        let p = ledger.path.clone();
        let tx = ledger
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err(&p))?;
        tx.execute_batch(SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(NOTES_SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(SKIPPED_SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(SKIPS_INDEX).map_err(db_err(&p))?;
        tx.execute_batch(PENDING_SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(crate::blobs::SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(crate::chain::SCHEMA).map_err(db_err(&p))?;
        tx.execute_batch(crate::effects::SCHEMA)
            .map_err(db_err(&p))?;
        tx.execute_batch(RESTORED_SCHEMA).map_err(db_err(&p))?;
        if crate::chain::head(&tx, &p)?.is_none() {
            crate::chain::append(&tx, "genesis", genesis_fields(workspace_id))
                .map_err(db_err(&p))?;
        }
        tx.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('format_version', ?1)",
            [FORMAT_VERSION],
        )
        .map_err(db_err(&p))?;
        tx.execute(
            "INSERT OR IGNORE INTO meta(key, value) VALUES ('workspace_id', ?1)",
            [workspace_id],
        )
        .map_err(db_err(&p))?;
        tx.pragma_update(None, "user_version", MIGRATED)
            .map_err(db_err(&p))?;
        tx.commit().map_err(db_err(&p))?;
        Ok(ledger)
    }

    fn connect(path: &Path, new: bool) -> Result<Ledger> {
        // A file an interrupted creation left empty is still new: it takes
        // the page size a ledger is made with. Not one beside a WAL that
        // holds commits: that is a history whose main file was lost, and
        // making it new reset the WAL (helper-31, D212).
        let empty = std::fs::metadata(path).is_ok_and(|m| m.len() == 0);
        if empty && let Some(bytes) = stranded_wal(path) {
            return Err(Error::LedgerCorrupt {
                path: path.to_owned(),
                detail: format!(
                    "the file is empty while {} holds {bytes} bytes of its history; nothing was written: restore the ledger from a backup or copy (with its -wal), or move the state directory aside to start a new history",
                    wal_path(path).display()
                ),
            });
        }
        let new = new || empty;
        let wal = wal_path(path);
        let files_existed = path.exists() && wal.exists();
        let conn = open_connection(path).map_err(db_err(path))?;
        // Before SQLite first reads the file and maps its `-shm` (D97).
        if let Ok(m) = std::fs::metadata(path) {
            use std::os::unix::fs::MetadataExt;
            let _ = rewind_platform::create_in_place_file(
                &crate::names::with_suffix(path, "-shm"),
                m.mode() & 0o777,
                m.uid(),
                m.gid(),
            );
        }
        conn.busy_timeout(BUSY_TIMEOUT).map_err(db_err(path))?;
        // Room for every statement a command runs (CachedRow).
        conn.set_prepared_statement_cache_capacity(64);
        // Only for a new database, before WAL mode. 4 KiB pages: a commit
        // writes every page it touched, and a small checkpoint touches ~40
        // scattered ones (hash-index leaves, stat-cache rows), so its WAL
        // write and fdatasync shrink with the page (D165). On an existing
        // ledger (16 KiB before D165), setting auto_vacuum writes the
        // header page: a transaction and three fsyncs on every command.
        if new {
            conn.execute_batch("PRAGMA page_size=4096; PRAGMA auto_vacuum=INCREMENTAL;")
                .map_err(db_err(path))?;
        }
        // mmap reads skip a copy per page.
        conn.execute_batch(
            "PRAGMA journal_mode=WAL; PRAGMA synchronous=FULL; PRAGMA journal_size_limit=16777216; \
             PRAGMA foreign_keys=ON; PRAGMA mmap_size=268435456;",
        )
        .map_err(db_err(path))?;
        persist_wal(&conn);
        // SQLite is built without its own directory syncs (.cargo/config.toml):
        // a ledger or WAL file this open created is made durable here, once.
        if !files_existed {
            sync_parent(path)?;
        }
        Ok(Ledger {
            conn,
            path: path.to_owned(),
            nodes: Default::default(),
            nodes_bytes: Default::default(),
            access: Access::ReadWrite,
            unsynced: false,
            kept_anchor: std::cell::OnceCell::new(),
            read_from: Default::default(),
        })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Whether this ledger was opened read-only (its filesystem is).
    pub fn is_read_only(&self) -> bool {
        self.access != Access::ReadWrite
    }

    fn err(&self) -> impl Fn(rusqlite::Error) -> Error + '_ {
        move |e| match db_err(&self.path)(e) {
            Error::ReadOnly { .. } if self.access == Access::DiskFull => self.disk_full(),
            e => e,
        }
    }

    /// NO_SPACE when this ledger was opened read-only on a full disk:
    /// a command that writes stops before it starts (its other
    /// connections would wait for this one's exclusive lock, D267).
    pub fn check_writable(&self) -> Result<()> {
        match self.access {
            Access::DiskFull => Err(self.disk_full()),
            _ => Ok(()),
        }
    }

    fn disk_full(&self) -> Error {
        Error::no_space(self.path.clone())
    }

    /// A read that takes no workspace lock (`status`, `diff`, a dry run)
    /// begins: what another process commits from here on may prune what
    /// it reads ([`Ledger::pruned_under_the_read`]).
    pub fn begin_unlocked_read(&self) -> Result<()> {
        let v = self.data_version()?;
        self.read_from.set(Some(v));
        Ok(())
    }

    /// The unlocked read is over: a missing node is corruption again.
    pub fn end_unlocked_read(&self) {
        self.read_from.set(None);
    }

    /// Whether another process committed since the unlocked read began: a
    /// tree node missing then was pruned under it (D237), not lost.
    pub fn pruned_under_the_read(&self) -> bool {
        self.read_from
            .get()
            .is_some_and(|from| self.data_version().is_ok_and(|now| now != from))
    }

    fn data_version(&self) -> Result<i64> {
        self.conn
            .query_row("PRAGMA data_version", [], |r| r.get(0))
            .map_err(self.err())
    }

    pub fn meta(&self, key: &str) -> Result<Option<String>> {
        self.conn
            .cached_row("SELECT value FROM meta WHERE key = ?1", [key], |r| r.get(0))
            .optional()
            .map_err(self.err())
    }

    /// Add what a ledger created by an earlier build lacks: tables added
    /// since (no-op when present) and, for a ledger from before the chain,
    /// its genesis entry.
    fn migrate(&self) -> Result<()> {
        let path = self.path.clone();
        let done: i64 = self
            .conn
            .query_row("PRAGMA user_version", [], |r| r.get(0))
            .map_err(db_err(&path))?;
        refuse_a_later_build(&path, None, done)?;
        if done == MIGRATED {
            return Ok(());
        }
        for schema in [
            NOTES_SCHEMA,
            // 3: the paths a checkpoint skipped (D143).
            SKIPPED_SCHEMA,
            PENDING_SCHEMA,
            crate::blobs::SCHEMA,
            crate::chain::SCHEMA,
            crate::effects::SCHEMA,
            // 5: what the last rewind restored (D275).
            RESTORED_SCHEMA,
        ] {
            self.conn.execute_batch(schema).map_err(db_err(&path))?;
        }
        self.rowid_tables()?;
        self.add_column_if_missing("checkpoints", "pruned_at", "INTEGER")?;
        // 2: the call an effect was admitted for (D108).
        self.add_column_if_missing("effects", "admitted_call", "TEXT")?;
        // 4: which stat-cache rows skipped an entry (D235). Rows written
        // before do not say: the cache is dropped, and the next capture
        // walks and writes it again.
        if self.add_column_if_missing("stat_cache", "skips", "INTEGER NOT NULL DEFAULT 0")? {
            self.conn
                .execute_batch("DELETE FROM stat_cache")
                .map_err(db_err(&path))?;
        }
        self.conn
            .execute_batch(SKIPS_INDEX)
            .map_err(db_err(&path))?;
        if crate::chain::head(&self.conn, &path)?.is_none() {
            let id = self.workspace_id()?;
            let tx = self.conn.unchecked_transaction().map_err(db_err(&path))?;
            crate::chain::append(&tx, "genesis", genesis_fields(&id)).map_err(db_err(&path))?;
            tx.commit().map_err(db_err(&path))?;
        }
        // Best effort, like the format mark: a ledger we cannot write is
        // checked again next time.
        let _ = self.conn.pragma_update(None, "user_version", MIGRATED);
        Ok(())
    }

    /// Whether the ledger is still of this build's format and schema: a
    /// server that keeps it open between calls (D63) checks before each,
    /// as a later build may have opened and migrated it meanwhile, and
    /// this one would write it blind to that build's rows (D334).
    pub fn still_ours(&self) -> bool {
        let found: rusqlite::Result<(Option<String>, i64)> = self.conn.cached_row(
            "SELECT (SELECT value FROM meta WHERE key = 'format_version'), \
             (SELECT user_version FROM pragma_user_version)",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        );
        matches!(found, Ok((Some(v), n)) if v == FORMAT_VERSION && n <= MIGRATED)
    }

    /// Mark a ledger of an earlier format as this build's (D334), and drop
    /// its stat cache in the same transaction: a build before format 3
    /// may have written rows there after this one migrated the ledger
    /// (without `skips`, so a skipped path went unrecorded, helper-83).
    /// The next capture walks and writes the cache again.
    fn mark_format(&self) -> Result<()> {
        let path = self.path.clone();
        let tx = self.conn.unchecked_transaction().map_err(db_err(&path))?;
        tx.execute_batch("DELETE FROM stat_cache")
            .map_err(db_err(&path))?;
        put_meta(&tx, "format_version", FORMAT_VERSION).map_err(db_err(&path))?;
        tx.commit().map_err(db_err(&path))
    }

    /// `ALTER TABLE table ADD COLUMN column decl`, unless a ledger written
    /// since has it.
    /// Whether it added the column.
    fn add_column_if_missing(&self, table: &str, column: &str, decl: &str) -> Result<bool> {
        let has: i64 = self
            .conn
            .query_row(
                "SELECT count(*) FROM pragma_table_info(?1) WHERE name = ?2",
                params![table, column],
                |r| r.get(0),
            )
            .map_err(self.err())?;
        if has == 0 {
            self.conn
                .execute_batch(&format!("ALTER TABLE {table} ADD COLUMN {column} {decl}"))
                .map_err(self.err())?;
        }
        Ok(has == 0)
    }

    /// Tree nodes and stat-cache rows are a few KiB each: in a WITHOUT
    /// ROWID table a row keeps only ~4 KiB inline and spills the rest to
    /// its own overflow page, so every node cost a whole 16 KiB page (2.7x
    /// its size, measured by the benchmark). Ledgers made before this are
    /// rewritten once into rowid tables, where such rows fit inline.
    fn rowid_tables(&self) -> Result<()> {
        let path = self.path.clone();
        for (table, columns, ddl) in [
            (
                "trees",
                "hash, data",
                "hash BLOB NOT NULL UNIQUE, data BLOB NOT NULL",
            ),
            (
                "stat_cache",
                "dir, node, stats",
                "dir BLOB NOT NULL UNIQUE, node BLOB NOT NULL, stats BLOB NOT NULL",
            ),
        ] {
            let sql: Option<String> = self
                .conn
                .cached_row(
                    "SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?1",
                    [table],
                    |r| r.get(0),
                )
                .optional()
                .map_err(db_err(&path))?;
            if !sql.is_some_and(|s| s.contains("WITHOUT ROWID")) {
                continue;
            }
            self.conn
                .execute_batch(&format!(
                    "BEGIN IMMEDIATE;
                     CREATE TABLE {table}_rowid({ddl});
                     INSERT INTO {table}_rowid({columns}) SELECT {columns} FROM {table};
                     DROP TABLE {table};
                     ALTER TABLE {table}_rowid RENAME TO {table};
                     COMMIT;"
                ))
                .map_err(db_err(&path))?;
        }
        Ok(())
    }

    /// Wait at most this long for another writer (the default is 10 s).
    pub fn set_busy_timeout(&self, timeout: std::time::Duration) -> Result<()> {
        self.conn.busy_timeout(timeout).map_err(self.err())
    }

    /// The effect barrier's decision, recorded on the chain in the same
    /// transaction. Refuses (as an error: the caller fails closed) unless
    /// the whole chain verifies and says of this effect what its row says
    /// (D109).
    pub fn guard(&mut self, req: &crate::effects::Request) -> Result<crate::effects::Decision> {
        self.check_writable()?;
        let path = self.path.clone();
        let workspace_id = self.workspace_id()?;
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err(&path))?;
        if let Err(why) = barrier_check(&tx, &path, &workspace_id, req)? {
            return Err(Error::LedgerCorrupt { path, detail: why });
        }
        let d = crate::effects::decide(&tx, req).map_err(db_err(&path))?;
        crate::failpoint::hit("guard:before-commit");
        tx.commit().map_err(db_err(&path))?;
        crate::failpoint::hit("guard:after-commit");
        self.keep_anchor();
        Ok(d)
    }

    pub fn effects(&self) -> Result<Vec<crate::effects::Effect>> {
        crate::effects::list(&self.conn).map_err(self.err())
    }

    pub fn effects_not_undone(&self) -> Result<Vec<crate::effects::Effect>> {
        crate::effects::not_undone(&self.conn).map_err(self.err())
    }

    /// Record an effect's outcome by the rules of [`crate::effects::resolve`].
    pub fn resolve_effect(
        &mut self,
        scope: &str,
        key: &str,
        outcome: &str,
        call: Option<&str>,
        reopen: bool,
    ) -> Result<crate::effects::Resolution> {
        self.check_writable()?;
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err(&path))?;
        let r = crate::effects::resolve(&tx, scope, key, outcome, call, reopen)
            .map_err(db_err(&path))?;
        tx.commit().map_err(db_err(&path))?;
        self.keep_anchor();
        Ok(r)
    }

    /// After a commit: the head kept as this workspace's anchor outside
    /// it (D313).
    fn keep_anchor(&self) {
        let _t = crate::trace::span("keep anchor");
        let kept = self.kept_anchor.get_or_init(|| {
            let id = self.workspace_id().ok().filter(|id| !id.is_empty())?;
            let path = crate::kept_anchor::root_of(&self.path)
                .and_then(|root| crate::kept_anchor::path(&id, root))?;
            Some((id, path))
        });
        if let Some((id, path)) = kept {
            crate::kept_anchor::keep(&self.conn, &self.path, id, path);
        }
    }

    /// Whether the history lost what its kept anchor recorded (D313):
    /// what to tell the user. A small file read and a query (~0.1 ms).
    pub fn lost_to_kept_anchor(&self) -> Option<String> {
        let id = self.workspace_id().ok()?;
        crate::kept_anchor::lost(&self.conn, &self.path, &id)
    }

    /// Where the anchor of this workspace is kept, or why none is (D351).
    pub fn kept_anchor_described(&self) -> String {
        match (self.workspace_id(), crate::kept_anchor::root_of(&self.path)) {
            (Ok(id), Some(root)) => crate::kept_anchor::describe(&id, root),
            _ => "none kept: the workspace has no id yet".into(),
        }
    }

    /// The anchor kept for this workspace outside it (D313), and where.
    pub fn kept_anchor(&self) -> Result<Option<(PathBuf, crate::chain::Anchor)>> {
        let id = self.workspace_id()?;
        Ok(crate::kept_anchor::root_of(&self.path)
            .and_then(|root| crate::kept_anchor::read(&id, root)))
    }

    /// Check the event chain (see `chain::verify`).
    pub fn verify_chain(
        &self,
        anchor: Option<&crate::chain::Anchor>,
    ) -> Result<crate::chain::Verdict> {
        // The chain and the checkpoints' rows from one snapshot: read
        // apart, a checkpoint committed between the two was "in the table
        // but not on the chain", and `verify` said TAMPERED while other
        // processes checkpointed (helper-68, D315).
        self.in_one_snapshot(|| self.verify_chain_now(anchor))
    }

    /// Run `f`'s reads in one read transaction (one snapshot of the
    /// ledger), unless one is open already.
    fn in_one_snapshot<T>(&self, f: impl FnOnce() -> Result<T>) -> Result<T> {
        if !self.conn.is_autocommit() {
            return f();
        }
        self.conn
            .execute_batch("BEGIN DEFERRED")
            .map_err(self.err())?;
        let out = f();
        let _ = self.conn.execute_batch("COMMIT");
        out
    }

    fn verify_chain_now(
        &self,
        anchor: Option<&crate::chain::Anchor>,
    ) -> Result<crate::chain::Verdict> {
        let id = self.meta("workspace_id")?.unwrap_or_default();
        // The checkpoints' rows are held to what the chain recorded in
        // the same walk: an edited root, label or prune was caught only
        // by `--deep`, while a rewind refused the checkpoint as tampered
        // (helper-62, helper-63, D305).
        let mut replay = CheckpointReplay::default();
        let mut verdict =
            crate::chain::verify_with(&self.conn, &self.path, &id, anchor, &mut |e| replay.see(e))?;
        if verdict.ok
            && let Some((seq, reason)) = replay.differences(&self.checkpoints()?).into_iter().next()
        {
            verdict.ok = false;
            verdict.first_bad = Some(crate::chain::FirstBad {
                seq,
                code: crate::chain::Code::RowMismatch,
                reason,
            });
        }
        // Every ledger has a genesis from its first open: an empty chain
        // beside checkpoints or effects was deleted, not never written.
        if verdict.ok && verdict.entries == 0 {
            let rows: i64 = self
                .conn
                .query_row(
                    "SELECT (SELECT count(*) FROM checkpoints) + (SELECT count(*) FROM effects)",
                    [],
                    |r| r.get(0),
                )
                .map_err(self.err())?;
            if rows > 0 {
                verdict.ok = false;
                verdict.first_bad = Some(crate::chain::FirstBad {
                    seq: 1,
                    code: crate::chain::Code::SeqGap,
                    reason: format!(
                        "the chain is empty but the ledger holds {rows} checkpoints and effects: its entries were deleted"
                    ),
                });
            }
        }
        Ok(verdict)
    }

    /// The chain's last (seq, hash).
    pub fn chain_head(&self) -> Result<Option<(u64, Hash)>> {
        crate::chain::head(&self.conn, &self.path)
    }

    pub fn workspace_id(&self) -> Result<String> {
        Ok(self.meta("workspace_id")?.unwrap_or_default())
    }

    /// Whether checkpoint `ck` (its row) is what the chain recorded
    /// (D112): the newest `checkpoint` entry naming its id must hash to
    /// its stored hash, be linked from the entry after it, and carry the
    /// row's root, label, kind and parent. Read from the newest entry
    /// back, so a recent checkpoint costs a few rows; the whole chain is
    /// `verify`'s. A checkpoint from before the chain (a ledger older
    /// than its genesis) is not checked.
    pub fn checkpoint_on_chain(&self, ck: &Checkpoint) -> Result<std::result::Result<(), String>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT seq, data, hash FROM chain ORDER BY seq DESC")
            .map_err(self.err())?;
        let mut rows = stmt.query([]).map_err(self.err())?;
        let mut newer_prev: Option<Hash> = None;
        let mut genesis_ms = None;
        while let Some(row) = rows.next().map_err(self.err())? {
            let seq: i64 = row.get(0).map_err(self.err())?;
            let (Ok(data), Ok(stored)) = (row.get::<_, Vec<u8>>(1), row.get::<_, Vec<u8>>(2))
            else {
                return Ok(Err(format!("chain entry {seq} is not stored as bytes")));
            };
            let Ok(e) = crate::chain::Entry::decode(&data) else {
                return Ok(Err(format!("chain entry {seq} does not decode")));
            };
            let hash = crate::chain::leaf_hash(&data);
            if e.kind == "genesis" {
                genesis_ms = Some(e.time_ms);
            }
            if e.kind == "checkpoint" && e.field("id") == Some(ck.id.as_bytes()) {
                if stored[..] != hash.0[..] || e.seq != seq as u64 {
                    return Ok(Err(format!(
                        "chain entry {seq} (checkpoint {}) does not match its hash",
                        ck.id
                    )));
                }
                if newer_prev.is_some_and(|p| p != hash) {
                    return Ok(Err(format!(
                        "chain entry {} is not linked to entry {seq} (checkpoint {})",
                        seq + 1,
                        ck.id
                    )));
                }
                let changed = differing_fields(&e, ck);
                return Ok(if changed.is_empty() {
                    Ok(())
                } else {
                    Err(format!(
                        "checkpoint {}'s {} in its row is not what chain entry {seq} recorded",
                        ck.id,
                        changed.join(" and ")
                    ))
                });
            }
            newer_prev = Some(e.prev);
        }
        match genesis_ms {
            Some(g) if (ck.created_at_ms as u64) < g => Ok(Ok(())),
            _ => Ok(Err(format!("no chain entry records checkpoint {}", ck.id))),
        }
    }

    /// Checkpoint rows that differ from the chain entry that recorded
    /// them (root, label, kind), or that no entry recorded, and effect rows
    /// that differ from what the chain's effect entries leave (for `verify
    /// --deep`). The chain's hashes prove the entries; this carries that
    /// proof to the table a rewind reads: a row pointed at another
    /// checkpoint's content restored it.
    pub fn checkpoints_against_chain(&self) -> Result<Vec<String>> {
        let mut replay = CheckpointReplay::default();
        let mut effects = EffectReplay::default();
        let mut stmt = self
            .conn
            .prepare("SELECT data FROM chain ORDER BY seq")
            .map_err(self.err())?;
        let mut rows = stmt.query([]).map_err(self.err())?;
        while let Some(row) = rows.next().map_err(self.err())? {
            let data: Vec<u8> = row.get(0).map_err(self.err())?;
            let Ok(e) = crate::chain::Entry::decode(&data) else {
                continue; // the chain check reports it
            };
            replay.see(&e);
            effects.see(&e);
        }
        let mut bad: Vec<String> = replay
            .differences(&self.checkpoints()?)
            .into_iter()
            .map(|(_, why)| why)
            .collect();
        for row in self.effects()? {
            match effects.take(row.scope.as_bytes(), row.key.as_bytes()) {
                None => bad.push(format!(
                    "effect {}:{} is in the barrier's table but the chain never admitted it",
                    row.scope, row.key
                )),
                Some((payload, status)) => {
                    if crate::hash::hex(&payload) != row.payload || status != row.status {
                        bad.push(format!(
                            "effect {}:{} is {} in the barrier's table, {} on the chain (or its payload differs)",
                            row.scope, row.key, row.status, status
                        ));
                    }
                }
            }
        }
        for (scope, key) in effects.into_keys() {
            bad.push(format!(
                "effect {}:{} was admitted on the chain but its row is gone: the barrier would admit it again",
                String::from_utf8_lossy(&scope),
                String::from_utf8_lossy(&key)
            ));
        }
        Ok(bad)
    }

    /// Every tree node whose bytes do not hash to its name, and the count
    /// checked (for `verify --deep`).
    pub fn bad_tree_nodes(&self) -> Result<(u64, Vec<Hash>)> {
        self.bad_rows("trees", Node::hash_of_stored)
    }

    /// Every small object whose bytes do not hash to its name, and the
    /// count checked.
    pub fn bad_blobs(&self) -> Result<(u64, Vec<Hash>)> {
        self.bad_rows("blobs", Hash::of)
    }

    /// Re-hash the `data` of every row of a content-addressed table.
    fn bad_rows(
        &self,
        table: &'static str,
        name_of: fn(&[u8]) -> Hash,
    ) -> Result<(u64, Vec<Hash>)> {
        let mut stmt = self
            .conn
            .prepare(&format!("SELECT hash, data FROM {table}"))
            .map_err(self.err())?;
        let mut rows = stmt.query([]).map_err(self.err())?;
        let (mut n, mut bad) = (0, Vec::new());
        while let Some(r) = rows.next().map_err(self.err())? {
            let (h, d): (Vec<u8>, Vec<u8>) =
                (r.get(0).map_err(self.err())?, r.get(1).map_err(self.err())?);
            n += 1;
            let h = Hash::from_slice(&h).unwrap_or(Hash([0; 32]));
            if name_of(&d) != h {
                bad.push(h);
            }
        }
        Ok((n, bad))
    }

    /// Set one meta value in its own transaction (for cached facts).
    pub fn set_meta_now(&self, key: &str, value: &str) -> Result<()> {
        put_meta(&self.conn, key, value).map_err(self.err())
    }

    /// Run `f` in a `BEGIN IMMEDIATE` transaction; commit if it succeeds.
    pub fn write<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        self.write_then(f, true)
    }

    /// [`Ledger::write`] that leaves the kept anchor (D313) where it is,
    /// for a commit the same command follows with another that keeps it:
    /// a rewind's intent, then its HEAD (D356). Killed between the two,
    /// the anchor is a commit behind, which `verify` takes for a history
    /// that went on; it only flags one missing what the anchor recorded.
    pub fn write_leaving_anchor<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        self.write_then(f, false)
    }

    fn write_then<T>(
        &mut self,
        f: impl FnOnce(&Tx<'_>) -> Result<T>,
        keep_anchor: bool,
    ) -> Result<T> {
        self.check_writable()?;
        self.synced()?;
        let path = self.path.clone();
        let tx = self
            .conn
            .transaction_with_behavior(TransactionBehavior::Immediate)
            .map_err(db_err(&path))?;
        let appended = std::cell::Cell::new(false);
        let out = {
            let _t = crate::trace::span("commit: rows");
            f(&Tx {
                tx: &tx,
                path: &path,
                appended: &appended,
            })?
        };
        {
            let _t = crate::trace::span("commit: wal and sync");
            tx.commit().map_err(db_err(&path))?;
        }
        // Only a commit that moved the chain's head moves its anchor: a
        // btrfs acknowledgement (a pending row) or a stat cache update
        // read the anchor file for nothing.
        if appended.get() && keep_anchor {
            self.keep_anchor();
        }
        Ok(out)
    }

    /// [`Ledger::write`] without waiting for the disk: the commit is in
    /// the WAL, and the next synced commit (any writer's: the WAL is one
    /// sequence) makes it durable. Only for a commit whose content the
    /// caller has already made durable elsewhere and recovers from there
    /// after a power cut: the btrfs engine's acknowledgement, whose record
    /// its snapshot carries (D324).
    pub fn write_without_sync<T>(&mut self, f: impl FnOnce(&Tx<'_>) -> Result<T>) -> Result<T> {
        let path = self.path.clone();
        self.conn
            .execute_batch("PRAGMA synchronous=NORMAL")
            .map_err(db_err(&path))?;
        let out = self.write(f);
        // FULL again whatever happened: every other commit waits for the
        // disk (DESIGN §4.6); failing that, the next `write` tries again
        // before it commits anything.
        self.unsynced = true;
        self.synced().and(out)
    }

    /// Back to `synchronous=FULL` after [`Ledger::write_without_sync`].
    fn synced(&mut self) -> Result<()> {
        if self.unsynced {
            self.conn
                .execute_batch("PRAGMA synchronous=FULL")
                .map_err(db_err(&self.path))?;
            self.unsynced = false;
        }
        Ok(())
    }

    pub fn head(&self) -> Result<Option<Checkpoint>> {
        match self.meta("head")? {
            Some(seq) => self.checkpoint_by_seq(seq.parse().unwrap_or(-1)),
            None => Ok(None),
        }
    }

    pub fn checkpoint_by_seq(&self, seq: i64) -> Result<Option<Checkpoint>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLS} FROM checkpoints c LEFT JOIN checkpoints p ON p.seq = c.parent WHERE c.seq = ?1"
        );
        self.conn
            .cached_row(&sql, [seq], checkpoint_from_row)
            .optional()
            .map_err(self.err())
    }

    /// The checkpoint made last, whatever HEAD points at.
    pub fn newest_checkpoint(&self) -> Result<Option<Checkpoint>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLS} FROM checkpoints c LEFT JOIN checkpoints p ON p.seq = c.parent WHERE c.seq = (SELECT max(seq) FROM checkpoints)"
        );
        self.conn
            .cached_row(&sql, [], checkpoint_from_row)
            .optional()
            .map_err(self.err())
    }

    /// The paths checkpoint `id` skipped (none recorded before D143).
    pub fn skipped(&self, id: &str) -> Result<Vec<Vec<u8>>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT s.path FROM skipped s JOIN checkpoints c ON c.seq = s.checkpoint WHERE c.id = ?1",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([id], |r| r.get::<_, Vec<u8>>(0))
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// Every note, oldest first. Notes written before the notes table
    /// existed live only in their checkpoint's column: those come back too.
    pub fn notes(&self) -> Result<Vec<Note>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT checkpoint, created_at, text FROM notes
                 UNION ALL
                 SELECT c.seq, c.created_at, c.note FROM checkpoints c
                 WHERE c.note IS NOT NULL AND NOT EXISTS (SELECT 1 FROM notes n WHERE n.checkpoint = c.seq)
                 ORDER BY 2",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(Note {
                    checkpoint: r.get(0)?,
                    created_at: crate::time::format_rfc3339(r.get(1)?),
                    text: r.get(2)?,
                })
            })
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    pub fn checkpoints(&self) -> Result<Vec<Checkpoint>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLS} FROM checkpoints c LEFT JOIN checkpoints p ON p.seq = c.parent ORDER BY c.seq"
        );
        let mut stmt = self.conn.prepare(&sql).map_err(self.err())?;
        let rows = stmt
            .query_map([], checkpoint_from_row)
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())
    }

    /// Checkpoints whose id starts with `prefix` (at most `limit`).
    pub fn checkpoints_by_prefix(&self, prefix: &str, limit: usize) -> Result<Vec<Checkpoint>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLS} FROM checkpoints c LEFT JOIN checkpoints p ON p.seq = c.parent \
             WHERE c.id >= ?1 AND c.id < ?1 || '~' ORDER BY c.id LIMIT ?2"
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.err())?;
        let rows = stmt
            .query_map(params![prefix, limit as i64], checkpoint_from_row)
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())
    }

    pub fn checkpoints_by_label(&self, label: &str, limit: usize) -> Result<Vec<Checkpoint>> {
        let sql = format!(
            "SELECT {CHECKPOINT_COLS} FROM checkpoints c LEFT JOIN checkpoints p ON p.seq = c.parent WHERE c.label = ?1 ORDER BY c.seq DESC LIMIT ?2"
        );
        let mut stmt = self.conn.prepare_cached(&sql).map_err(self.err())?;
        let rows = stmt
            .query_map(params![label, limit as i64], checkpoint_from_row)
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())
    }

    /// How many checkpoints are not pruned (one indexed count).
    pub fn live_checkpoints(&self) -> Result<usize> {
        self.conn
            .cached_row(
                "SELECT count(*) FROM checkpoints WHERE pruned_at IS NULL",
                [],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as usize)
            .map_err(self.err())
    }

    /// Live checkpoints created before `ms` (what `keep_within` may prune).
    pub fn live_checkpoints_before(&self, ms: i64) -> Result<usize> {
        self.conn
            .cached_row(
                "SELECT count(*) FROM checkpoints WHERE pruned_at IS NULL AND created_at < ?1",
                [ms],
                |r| r.get::<_, i64>(0),
            )
            .map(|n| n as usize)
            .map_err(self.err())
    }

    /// Checkpoints that admitted effects still unresolved point at.
    pub fn unresolved_effect_heads(&self) -> Result<Vec<i64>> {
        let mut stmt = self
            .conn
            .prepare(
                "SELECT DISTINCT head FROM effects WHERE status = 'admitted' AND head IS NOT NULL",
            )
            .map_err(self.err())?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// Every chunked object's chunk list (for `gc` and `verify --deep`).
    pub fn chunk_manifests(&self) -> Result<Vec<(Hash, Vec<Hash>)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT hash, manifest FROM chunked")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                let h: Vec<u8> = r.get(0)?;
                let m: Vec<u8> = r.get(1)?;
                Ok((
                    Hash::from_slice(&h).unwrap_or(Hash([0; 32])),
                    crate::blobs::decode_manifest(&m),
                ))
            })
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// Every stored tree node: (hash, stored size in bytes), for `gc`'s
    /// sweep.
    pub fn tree_sizes(&self) -> Result<Vec<(Hash, u64)>> {
        self.hash_sizes("SELECT hash, length(data) FROM trees")
    }

    /// Every small object: (hash, size in bytes).
    pub fn blob_sizes(&self) -> Result<Vec<(Hash, u64)>> {
        self.hash_sizes("SELECT hash, length(data) FROM blobs")
    }

    /// Rows of (hash, length) for `sql` (SQLite's `length` of a blob
    /// reads its size from the record header, not its content).
    fn hash_sizes(&self, sql: &str) -> Result<Vec<(Hash, u64)>> {
        let mut stmt = self.conn.prepare(sql).map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                let h: Vec<u8> = r.get(0)?;
                Ok((
                    Hash::from_slice(&h).unwrap_or(Hash([0; 32])),
                    r.get::<_, i64>(1)? as u64,
                ))
            })
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// Node hashes the stat cache points at: they are reused by the next
    /// capture without being re-read, so `gc` must keep them.
    /// Each stat-cache row's directory and node, for `gc` (D190).
    pub fn stat_cache_nodes(&self) -> Result<Vec<(Vec<u8>, Hash)>> {
        let mut stmt = self
            .conn
            .prepare("SELECT dir, node FROM stat_cache")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                let node: Vec<u8> = r.get(1)?;
                Ok((r.get(0)?, Hash::from_slice(&node).unwrap_or(Hash([0; 32]))))
            })
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// Bytes the ledger file uses, and the bytes of its free pages.
    pub fn used_bytes(&self) -> Result<(u64, u64)> {
        let q = |sql: &str| -> Result<u64> {
            self.conn
                .cached_row(sql, [], |r| r.get::<_, i64>(0))
                .map(|n| n as u64)
                .map_err(self.err())
        };
        let (pages, free, size) = (
            q("PRAGMA page_count")?,
            q("PRAGMA freelist_count")?,
            q("PRAGMA page_size")?,
        );
        Ok(((pages - free.min(pages)) * size, free * size))
    }

    /// Give free pages back to the filesystem (ledgers created with
    /// `auto_vacuum=INCREMENTAL`; a no-op on older ones), then fold the WAL
    /// into the main file so the space shows in `df`. The bytes given
    /// back, and those still free inside the file.
    /// One batch at least; more while `budget` has not passed.
    pub fn release_free_pages(&self, budget: Duration) -> Result<(u64, u64)> {
        let (_, free_before) = self.used_bytes()?;
        // incremental_vacuum frees one page per step: step it to the end
        // (execute_batch would step once). A page moved costs up to ~0.2
        // ms, so pages go back RELEASE_PAGES_PER_RUN at a time (each batch
        // folded, so the WAL stays small) until none is free or the budget
        // has passed; SQLite reuses the rest, and the next gc returns
        // more. 8 MiB a run took ten runs to give back what a failed first
        // checkpoint left (helper-70, D320).
        let started = std::time::Instant::now();
        let mut free = free_before;
        let mut first = true;
        while free > 0 && (first || started.elapsed() < budget) {
            first = false;
            let mut stmt = self
                .conn
                .prepare(&format!(
                    "PRAGMA incremental_vacuum({RELEASE_PAGES_PER_RUN})"
                ))
                .map_err(self.err())?;
            let mut rows = stmt.query([]).map_err(self.err())?;
            while rows.next().map_err(self.err())?.is_some() {}
            drop(rows);
            drop(stmt);
            self.fold_wal()?;
            let (_, now) = self.used_bytes()?;
            if now >= free {
                break;
            }
            free = now;
        }
        Ok((free_before.saturating_sub(free), free))
    }

    /// Fold the WAL into the main file and truncate it. A process that
    /// commits many times (the manifest builder) would otherwise carry a
    /// WAL of up to 1,000 pages (16 MiB) until it exits.
    pub fn fold_wal(&self) -> Result<()> {
        self.conn
            .execute_batch("PRAGMA wal_checkpoint(TRUNCATE);")
            .map_err(self.err())
    }

    /// Remember nodes read from, or committed to, this ledger (see
    /// `nodes`).
    pub fn remember_nodes<I>(&self, nodes: I)
    where
        I: IntoIterator<Item = (Hash, SharedNode)>,
        I::IntoIter: ExactSizeIterator,
    {
        let nodes: Vec<(Hash, SharedNode, usize)> = nodes
            .into_iter()
            .map(|(h, n)| {
                let b = n.approx_bytes();
                (h, n, b)
            })
            .collect();
        let bytes: usize = nodes.iter().map(|&(_, _, b)| b).sum();
        let mut cache = self.nodes.borrow_mut();
        if cache.len() + nodes.len() > NODE_CACHE_MAX
            || self.nodes_bytes.get() + bytes > NODE_CACHE_MAX_BYTES
        {
            cache.clear();
            self.nodes_bytes.set(0);
        }
        if nodes.len() <= NODE_CACHE_MAX && bytes <= NODE_CACHE_MAX_BYTES {
            for (h, n, b) in nodes {
                // Content-addressed: a node held already is this one.
                if let std::collections::hash_map::Entry::Vacant(slot) = cache.entry(h) {
                    slot.insert(n);
                    self.nodes_bytes.set(self.nodes_bytes.get() + b);
                }
            }
        }
    }

    /// After nodes were deleted (gc's sweep).
    pub fn forget_nodes(&self) {
        self.nodes.borrow_mut().clear();
        self.nodes_bytes.set(0);
    }

    /// A node as the ledger holds it now, verified, never from the cache
    /// (what `verify --deep` must check).
    pub fn tree_uncached(&self, hash: &Hash) -> Result<Option<SharedNode>> {
        self.read_tree(hash)
    }

    pub fn tree(&self, hash: &Hash) -> Result<Option<SharedNode>> {
        if let Some(n) = self.nodes.borrow().get(hash) {
            return Ok(Some(n.clone()));
        }
        let node = self.read_tree(hash)?;
        if let Some(n) = &node {
            self.remember_nodes([(*hash, n.clone())]);
        }
        Ok(node)
    }

    /// A node as [`Ledger::tree_uncached`] reads it, with the bytes its
    /// row holds: ledger space that a checkpoint alone reaching the node
    /// alone holds (`du`, which reads each node once).
    pub fn tree_and_row_bytes(&self, hash: &Hash) -> Result<Option<(SharedNode, u64)>> {
        let data: Option<Vec<u8>> = self
            .conn
            .cached_row(
                "SELECT data FROM trees WHERE hash = ?1",
                [&hash.0[..]],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())?;
        match data {
            None => Ok(None),
            // Stored compact (or canonical, in older rows): the canonical
            // bytes must hash to the name, then decode.
            Some(d) => {
                let corrupt = |detail: String| Error::LedgerCorrupt {
                    path: self.path.clone(),
                    detail,
                };
                let canonical = Node::canonical_from_stored(&d)
                    .map_err(|e| corrupt(format!("tree node {hash}: {e}")))?;
                if Node::hash_of_encoding(&canonical) != *hash {
                    return Err(corrupt(format!("tree node {hash} does not match its hash")));
                }
                Node::decode(&canonical)
                    .map(|n| Some((SharedNode::new(n), d.len() as u64)))
                    .map_err(|e| corrupt(format!("tree node {hash}: {e}")))
            }
        }
    }

    fn read_tree(&self, hash: &Hash) -> Result<Option<SharedNode>> {
        Ok(self.tree_and_row_bytes(hash)?.map(|(node, _)| node))
    }

    /// The whole stat cache, joined with the nodes it describes.
    pub fn stat_cache(&self) -> Result<Vec<crate::capture::StatCacheRow>> {
        let mut stmt = self
            .conn
            .prepare("SELECT s.dir, s.node, s.stats, t.data, s.skips FROM stat_cache s JOIN trees t ON t.hash = s.node")
            .map_err(self.err())?;
        let rows = stmt.query_map([], stat_cache_row).map_err(self.err())?;
        rows.collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())
    }

    /// The stat-cache rows of some directories (`dirs`), and of whole
    /// subtrees (`trees`, each with everything below it): what a capture
    /// guided by a dirty set opens, and nothing else.
    pub fn stat_cache_for(
        &self,
        dirs: &[Vec<u8>],
        trees: &[Vec<u8>],
    ) -> Result<Vec<crate::capture::StatCacheRow>> {
        const ROW: &str = "SELECT s.dir, s.node, s.stats, t.data, s.skips FROM stat_cache s JOIN trees t ON t.hash = s.node WHERE ";
        let mut out = Vec::new();
        let mut one = self
            .conn
            .prepare_cached(&format!("{ROW}s.dir = ?1"))
            .map_err(self.err())?;
        for d in dirs {
            if let Some(r) = one
                .query_row([d], stat_cache_row)
                .optional()
                .map_err(self.err())?
            {
                out.push(r);
            }
        }
        let mut below = self
            .conn
            .prepare_cached(&format!("{ROW}s.dir >= ?1 AND s.dir < ?2"))
            .map_err(self.err())?;
        for t in trees {
            let (lo, hi) = subtree_bounds(t);
            let rows = below
                .query_map(params![lo, hi], stat_cache_row)
                .map_err(self.err())?;
            for r in rows {
                out.push(r.map_err(self.err())?);
            }
        }
        Ok(out)
    }

    /// The directories whose last listing skipped an entry (a FIFO, an
    /// unreadable file, a mount point): a scoped capture lists them again,
    /// or what they skip would go unreported (D235).
    pub fn stat_cache_dirs_with_skips(&self) -> Result<Vec<Vec<u8>>> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT dir FROM stat_cache WHERE skips != 0")
            .map_err(self.err())?;
        let rows = stmt.query_map([], |r| r.get(0)).map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// What the last rewind restored (D275). A row that does not decode
    /// is left out: its file is read like any other.
    pub fn restored(&self) -> Result<crate::capture::RestoredFiles> {
        let mut stmt = self
            .conn
            .prepare_cached("SELECT path, ino, size, mtime_ns, ctime_ns, hash FROM restored")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                let (ino, size): (i64, i64) = (r.get(1)?, r.get(2)?);
                let (mtime_ns, ctime_ns) = (r.get(3)?, r.get(4)?);
                let hash: Vec<u8> = r.get(5)?;
                let restored = Hash::from_slice(&hash).map(|hash| crate::capture::Restored {
                    ino: ino as u64,
                    size: size as u64,
                    mtime_ns,
                    ctime_ns,
                    hash,
                });
                Ok((r.get::<_, Vec<u8>>(0)?, restored))
            })
            .map_err(self.err())?;
        let mut out = crate::capture::RestoredFiles::new();
        for row in rows {
            if let (path, Some(r)) = row.map_err(self.err())? {
                out.insert(path, r);
            }
        }
        Ok(out)
    }

    /// Checkpoints whose manifest is still to be built, oldest first.
    pub fn pending(&self) -> Result<Vec<Pending>> {
        let mut stmt = self
            .conn
            .prepare_cached(
                "SELECT seq, id, parent, label, kind, created_at, clock_ns, reuse FROM pending ORDER BY seq",
            )
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| {
                Ok(Pending {
                    seq: r.get(0)?,
                    id: r.get(1)?,
                    parent: r.get(2)?,
                    label: r.get(3)?,
                    kind: r.get(4)?,
                    created_at_ms: r.get(5)?,
                    clock_ns: r.get(6)?,
                    reuse: r.get::<_, i64>(7)? != 0,
                })
            })
            .map_err(self.err())?;
        rows.collect::<rusqlite::Result<_>>().map_err(self.err())
    }

    /// The pending checkpoint HEAD names, if HEAD's manifest is not built.
    pub fn pending_head(&self) -> Result<Option<Pending>> {
        let Some(head) = self.head_seq()? else {
            return Ok(None);
        };
        Ok(self.pending()?.into_iter().find(|p| p.seq == head))
    }

    pub fn has_pending(&self) -> Result<bool> {
        self.conn
            .cached_row("SELECT 1 FROM pending LIMIT 1", [], |_| Ok(()))
            .optional()
            .map(|o| o.is_some())
            .map_err(self.err())
    }

    /// Whether a checkpoint, pending checkpoint or alias has this id.
    pub fn knows_id(&self, id: &str) -> Result<bool> {
        id_taken(&self.conn, id).map_err(self.err())
    }

    /// The seq the next checkpoint gets.
    pub fn next_seq(&self) -> Result<i64> {
        next_seq(&self.conn).map_err(self.err())
    }

    /// The checkpoint an id was folded into, if it was.
    pub fn alias(&self, id: &str) -> Result<Option<i64>> {
        self.conn
            .cached_row("SELECT seq FROM aliases WHERE id = ?1", [id], |r| r.get(0))
            .optional()
            .map_err(self.err())
    }

    /// The id of a checkpoint, pending or not.
    pub fn id_of_seq(&self, seq: i64) -> Result<Option<String>> {
        self.conn
            .cached_row(
                "SELECT id FROM checkpoints WHERE seq = ?1 UNION ALL SELECT id FROM pending WHERE seq = ?1",
                [seq],
                |r| r.get(0),
            )
            .optional()
            .map_err(self.err())
    }

    /// The seq and id the next checkpoint would get. Only stable while the
    /// caller holds the workspace lock (the only writer of new seqs).
    pub fn next_id(&self, make: impl FnMut(i64, u64) -> String) -> Result<(i64, String)> {
        fresh_id(&self.conn, make).map_err(self.err())
    }

    /// The seq HEAD points at, without reading its row (which a pending
    /// checkpoint does not have yet).
    pub fn head_seq(&self) -> Result<Option<i64>> {
        Ok(self.meta("head")?.and_then(|s| s.parse().ok()))
    }

    pub fn intent(&self) -> Result<Option<Intent>> {
        self.conn
            .cached_row(
                "SELECT op, target, safety, to_root, options FROM intent WHERE id = 1",
                [],
                |r| {
                    let root: Vec<u8> = r.get(3)?;
                    let options: String = r.get(4)?;
                    Ok(Intent {
                        op: r.get(0)?,
                        target: r.get(1)?,
                        safety: r.get(2)?,
                        to_root: Hash::from_slice(&root).unwrap_or(Hash([0; 32])),
                        options: serde_json::from_str(&options).unwrap_or(serde_json::Value::Null),
                    })
                },
            )
            .optional()
            .map_err(self.err())
    }

    pub fn last_operation(&self) -> Result<Option<Operation>> {
        self.conn
            .cached_row(
                "SELECT op, target, safety FROM operations ORDER BY seq DESC LIMIT 1",
                [],
                |r| {
                    Ok(Operation {
                        op: r.get(0)?,
                        target: r.get(1)?,
                        safety: r.get(2)?,
                    })
                },
            )
            .optional()
            .map_err(self.err())
    }

    /// `PRAGMA integrity_check`: "ok" or the first problems found.
    pub fn integrity_check(&self) -> Result<String> {
        let mut stmt = self
            .conn
            .prepare("PRAGMA integrity_check")
            .map_err(self.err())?;
        let rows = stmt
            .query_map([], |r| r.get::<_, String>(0))
            .map_err(self.err())?;
        let lines = rows
            .collect::<rusqlite::Result<Vec<_>>>()
            .map_err(self.err())?;
        Ok(lines.join("; "))
    }

    pub fn count(&self, table: &'static str) -> Result<i64> {
        self.conn
            .cached_row(&format!("SELECT count(*) FROM {table}"), [], |r| r.get(0))
            .map_err(self.err())
    }
}

/// A write transaction. Methods only stage; `Ledger::write` commits.
pub struct Tx<'a> {
    tx: &'a rusqlite::Transaction<'a>,
    path: &'a Path,
    /// Set once an entry goes on the chain.
    appended: &'a std::cell::Cell<bool>,
}

impl Tx<'_> {
    fn err(&self) -> impl Fn(rusqlite::Error) -> Error + '_ {
        db_err(self.path)
    }

    /// Append an event to the chain, committed with this transaction.
    pub fn event(&self, kind: &str, fields: crate::chain::Fields) -> Result<u64> {
        self.appended.set(true);
        crate::chain::append(self.tx, kind, fields).map_err(self.err())
    }

    pub fn checkpoint_id(&self, seq: i64) -> Result<String> {
        self.tx
            .cached_row("SELECT id FROM checkpoints WHERE seq = ?1", [seq], |r| {
                r.get(0)
            })
            .map_err(self.err())
    }

    /// Store a tree node given its canonical encoding (`data`); the row
    /// holds the compact stored form (`Node::encode_stored`, D49).
    pub fn put_tree(&self, hash: &Hash, node: &Node) -> Result<()> {
        self.tx
            .prepare_cached("INSERT OR IGNORE INTO trees(hash, data) VALUES (?1, ?2)")
            .and_then(|mut s| s.execute(params![&hash.0[..], node.encode_stored()]))
            .map_err(self.err())?;
        Ok(())
    }

    /// Store a small object; true if it was new.
    pub fn put_blob(&self, hash: &Hash, data: &[u8]) -> Result<bool> {
        crate::blobs::insert(self.tx, hash, data).map_err(self.err())
    }

    /// Store a chunked object's chunk list.
    pub fn put_manifest(&self, hash: &Hash, manifest: &[u8]) -> Result<()> {
        crate::blobs::insert_manifest(self.tx, hash, manifest).map_err(self.err())
    }

    pub fn delete_meta(&self, key: &str) -> Result<()> {
        self.tx
            .cached_execute("DELETE FROM meta WHERE key = ?1", [key])
            .map_err(self.err())?;
        Ok(())
    }

    pub fn set_meta(&self, key: &str, value: &str) -> Result<()> {
        put_meta(self.tx, key, value).map_err(self.err())
    }

    /// The seq and id of a new checkpoint (see [`Ledger::next_id`]).
    pub fn next_id(&self, make: impl FnMut(i64, u64) -> String) -> Result<(i64, String)> {
        fresh_id(self.tx, make).map_err(self.err())
    }

    /// The seq HEAD points at, read inside the transaction.
    pub fn head_seq(&self) -> Result<Option<i64>> {
        let v: Option<String> = self
            .tx
            .cached_row("SELECT value FROM meta WHERE key = 'head'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(self.err())?;
        Ok(v.and_then(|s| s.parse().ok()))
    }

    pub fn insert_pending(&self, p: &Pending) -> Result<()> {
        self.tx
            .cached_execute(
                "INSERT INTO pending(seq, id, parent, label, kind, created_at, clock_ns, reuse) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8)",
                params![p.seq, p.id, p.parent, p.label, p.kind, p.created_at_ms, p.clock_ns, p.reuse as i64],
            )
            .map_err(self.err())?;
        Ok(())
    }

    pub fn delete_pending(&self, seq: i64) -> Result<()> {
        self.tx
            .cached_execute("DELETE FROM pending WHERE seq = ?1", [seq])
            .map_err(self.err())?;
        Ok(())
    }

    /// Pending checkpoints whose parent was `from` get `to` instead (their
    /// parent was folded into its own parent, or lost).
    pub fn reparent_pending(&self, from: i64, to: Option<i64>) -> Result<()> {
        self.tx
            .cached_execute(
                "UPDATE pending SET parent = ?2 WHERE parent = ?1",
                params![from, to],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// `id` names checkpoint `seq` from now on (it was folded into it).
    pub fn insert_alias(&self, id: &str, seq: i64) -> Result<()> {
        self.tx
            .cached_execute(
                "INSERT OR REPLACE INTO aliases(id, seq) VALUES (?1, ?2)",
                params![id, seq],
            )
            .map_err(self.err())?;
        Ok(())
    }

    #[allow(clippy::too_many_arguments)]
    pub fn insert_checkpoint(
        &self,
        seq: i64,
        id: &str,
        root: &Hash,
        parent: Option<i64>,
        label: Option<&str>,
        kind: &str,
        created_at_ms: i64,
        stats: &serde_json::Value,
    ) -> Result<()> {
        self.tx
            .cached_execute(
                "INSERT INTO checkpoints(seq, id, root, parent, label, kind, created_at, note, stats) VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, NULL, ?8)",
                params![seq, id, &root.0[..], parent, label, kind, created_at_ms, stats.to_string()],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// Record the paths checkpoint `seq` skipped.
    pub fn insert_skipped<'p>(
        &self,
        seq: i64,
        paths: impl Iterator<Item = &'p [u8]>,
    ) -> Result<()> {
        let mut stmt = self
            .tx
            .prepare_cached("INSERT INTO skipped(checkpoint, path) VALUES (?1, ?2)")
            .map_err(self.err())?;
        for p in paths {
            stmt.execute(params![seq, p]).map_err(self.err())?;
        }
        Ok(())
    }

    /// Mark a checkpoint pruned (its contents go at the next sweep).
    pub fn mark_pruned(&self, seq: i64) -> Result<()> {
        self.tx
            .cached_execute(
                "UPDATE checkpoints SET pruned_at = ?2 WHERE seq = ?1 AND pruned_at IS NULL",
                params![seq, crate::time::now_ms()],
            )
            .map_err(self.err())?;
        Ok(())
    }

    pub fn delete_tree(&self, hash: &Hash) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM trees WHERE hash = ?1")
            .and_then(|mut s| s.execute([&hash.0[..]]))
            .map_err(self.err())?;
        Ok(())
    }

    pub fn delete_manifest(&self, hash: &Hash) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM chunked WHERE hash = ?1")
            .and_then(|mut s| s.execute([&hash.0[..]]))
            .map_err(self.err())?;
        Ok(())
    }

    /// Every small object, while no checkpoint (pruned or not) is in the
    /// ledger: then none can be named by a tree. The number dropped.
    pub fn delete_blobs_if_no_checkpoint(&self) -> Result<usize> {
        self.tx
            .execute(
                "DELETE FROM blobs WHERE NOT EXISTS (SELECT 1 FROM checkpoints)",
                [],
            )
            .map_err(self.err())
    }

    pub fn delete_blob(&self, hash: &Hash) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM blobs WHERE hash = ?1")
            .and_then(|mut s| s.execute([&hash.0[..]]))
            .map_err(self.err())?;
        Ok(())
    }

    pub fn set_note(&self, seq: i64, note: &str) -> Result<()> {
        let id = self.checkpoint_id(seq)?;
        self.event(
            "note",
            crate::chain::Fields::new()
                .str("checkpoint", &id)
                .str("note", note),
        )?;
        // Every note is kept (the notes table); the checkpoint's own column
        // joins them for `list`. Two attempts abandoned at the same tree
        // (HEAD reused as the safety checkpoint) are two notes, not one.
        self.tx
            .cached_execute(
                "INSERT INTO notes(checkpoint, created_at, text) VALUES (?1, ?2, ?3)",
                params![seq, crate::time::now_ms(), note],
            )
            .map_err(self.err())?;
        self.tx
            .cached_execute(
                "UPDATE checkpoints SET note = CASE WHEN note IS NULL OR note = '' THEN ?2 ELSE note || ' | ' || ?2 END WHERE seq = ?1",
                params![seq, note],
            )
            .map_err(self.err())?;
        Ok(())
    }

    /// An upsert, not INSERT OR REPLACE: the row is rewritten where it is
    /// instead of deleted and appended at the table's end (which also
    /// touched the table's index and free list: 12–16 stat-cache pages in
    /// the WAL for 10 changed directories, 11 now).
    pub fn put_stat_cache(&self, dir: &[u8], node: &Hash, stats: &[u8], skips: bool) -> Result<()> {
        self.tx
            .prepare_cached(
                "INSERT INTO stat_cache(dir, node, stats, skips) VALUES (?1, ?2, ?3, ?4) \
                 ON CONFLICT(dir) DO UPDATE SET node = excluded.node, stats = excluded.stats, skips = excluded.skips",
            )
            .and_then(|mut s| s.execute(params![dir, &node.0[..], stats, i64::from(skips)]))
            .map_err(self.err())?;
        Ok(())
    }

    pub fn clear_stat_cache(&self) -> Result<()> {
        self.tx
            .cached_execute("DELETE FROM stat_cache", [])
            .map_err(self.err())?;
        Ok(())
    }

    /// Delete the rows of `dir` and of everything below it.
    pub fn delete_stat_cache_tree(&self, dir: &[u8]) -> Result<()> {
        self.delete_stat_cache(dir)?;
        let (lo, hi) = subtree_bounds(dir);
        self.tx
            .prepare_cached("DELETE FROM stat_cache WHERE dir >= ?1 AND dir < ?2")
            .and_then(|mut s| s.execute(params![lo, hi]))
            .map_err(self.err())?;
        Ok(())
    }

    /// What this rewind restored, in place of the last one's (D275).
    pub fn replace_restored(&self, files: &[(Vec<u8>, crate::capture::Restored)]) -> Result<()> {
        self.tx
            .cached_execute("DELETE FROM restored", [])
            .map_err(self.err())?;
        for (path, r) in files {
            self.tx
                .cached_execute(
                    "INSERT OR REPLACE INTO restored(path, ino, size, mtime_ns, ctime_ns, hash) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                    params![path, r.ino as i64, r.size as i64, r.mtime_ns, r.ctime_ns, &r.hash.0[..]],
                )
                .map_err(self.err())?;
        }
        Ok(())
    }

    /// Restored files the stat cache now vouches for (D275).
    pub fn forget_restored(&self, paths: &[Vec<u8>]) -> Result<()> {
        for path in paths {
            self.tx
                .cached_execute("DELETE FROM restored WHERE path = ?1", [path])
                .map_err(self.err())?;
        }
        Ok(())
    }

    pub fn delete_stat_cache(&self, dir: &[u8]) -> Result<()> {
        self.tx
            .prepare_cached("DELETE FROM stat_cache WHERE dir = ?1")
            .and_then(|mut s| s.execute([dir]))
            .map_err(self.err())?;
        Ok(())
    }

    pub fn set_intent(&self, intent: &Intent) -> Result<()> {
        self.tx
            .cached_execute(
                "INSERT OR REPLACE INTO intent(id, op, target, safety, to_root, options, started_at) VALUES (1, ?1, ?2, ?3, ?4, ?5, ?6)",
                params![intent.op, intent.target, intent.safety, &intent.to_root.0[..], intent.options.to_string(), crate::time::now_ms()],
            )
            .map_err(self.err())?;
        Ok(())
    }

    pub fn clear_intent(&self) -> Result<()> {
        self.tx
            .cached_execute("DELETE FROM intent", [])
            .map_err(self.err())?;
        Ok(())
    }

    /// Write a row of `operations` and take it back, in this transaction.
    /// A rewind's intent commit does it so that a damaged page of the one
    /// table only its finishing commit writes stops the rewind before the
    /// tree changes (D161): otherwise the apply ran, the finish failed
    /// LEDGER_CORRUPT, and every later command retried it. The rowid is
    /// not AUTOINCREMENT, so the next insert takes the same seq.
    pub fn probe_operations(&self) -> Result<()> {
        self.record_operation(
            &Operation {
                op: String::new(),
                target: 0,
                safety: 0,
            },
            0,
            0,
        )?;
        self.tx
            .cached_execute("DELETE FROM operations WHERE seq = last_insert_rowid()", [])
            .map_err(self.err())?;
        Ok(())
    }

    pub fn record_operation(&self, op: &Operation, written: u64, deleted: u64) -> Result<()> {
        self.tx
            .cached_execute(
                "INSERT INTO operations(op, target, safety, created_at, written, deleted) VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
                params![op.op, op.target, op.safety, crate::time::now_ms(), written as i64, deleted as i64],
            )
            .map_err(self.err())?;
        Ok(())
    }
}

/// A `(dir, node, stats, trees.data)` stat-cache row.
fn stat_cache_row(r: &rusqlite::Row<'_>) -> rusqlite::Result<crate::capture::StatCacheRow> {
    let node: Vec<u8> = r.get(1)?;
    Ok(crate::capture::StatCacheRow {
        dir: r.get(0)?,
        node_hash: Hash::from_slice(&node).unwrap_or(Hash([0; 32])),
        stats: r.get(2)?,
        node: r.get(3)?,
        skips: r.get::<_, i64>(4)? != 0,
    })
}

/// The byte range of the paths strictly below directory `dir` (BLOB
/// order): `dir/` up to, not including, `dir0` ('0' follows '/').
fn subtree_bounds(dir: &[u8]) -> (Vec<u8>, Vec<u8>) {
    let mut lo = dir.to_vec();
    let mut hi = dir.to_vec();
    if !dir.is_empty() {
        lo.push(b'/');
        hi.push(b'0');
    } else {
        // Below the root: every non-empty path.
        lo.push(0);
        hi = vec![0xff; 4097];
    }
    (lo, hi)
}

/// The fields of checkpoint row `ck` (root, label, kind, parent) that are
/// not what chain entry `e`, which recorded it, says: what a rewind
/// (D112) and `verify --deep` (D103) name when a row was changed.
fn differing_fields(e: &crate::chain::Entry, ck: &Checkpoint) -> Vec<&'static str> {
    let parent = ck.parent.as_ref().map(|p| p.1.as_str()).unwrap_or("");
    let label = ck.label.as_deref().unwrap_or("");
    [
        ("root", &ck.root.0[..]),
        ("label", label.as_bytes()),
        ("kind", ck.kind.as_bytes()),
        ("parent", parent.as_bytes()),
    ]
    .into_iter()
    .filter(|(name, row)| e.field(name) != Some(row))
    .map(|(name, _)| name)
    .collect()
}

/// What the chain's `checkpoint` and `gc` entries say of each checkpoint:
/// its newest recorded fields, and whether a `gc` pruned it. The table's
/// rows must say the same (D305); plain `verify` and `--deep` both
/// replay the chain through this.
#[derive(Default)]
struct CheckpointReplay {
    /// The newest entry recording each id, with its seq.
    recorded: HashMap<Vec<u8>, (u64, crate::chain::Entry)>,
    pruned: std::collections::HashSet<Vec<u8>>,
    /// A ledger older than its chain (a genesis added on upgrade) has
    /// rows no entry recorded: those cannot be checked.
    genesis_ms: Option<u64>,
}

impl CheckpointReplay {
    fn see(&mut self, e: &crate::chain::Entry) {
        match e.kind.as_str() {
            "genesis" => {
                self.genesis_ms = Some(self.genesis_ms.map_or(e.time_ms, |g| g.min(e.time_ms)));
            }
            "checkpoint" => {
                let id = e.field("id").unwrap_or_default().to_vec();
                self.recorded.insert(id, (e.seq, e.clone()));
            }
            "gc" => {
                let ids = e.field("pruned").unwrap_or_default();
                self.pruned.extend(
                    ids.split(|b| *b == b',')
                        .filter(|i| !i.is_empty())
                        .map(<[u8]>::to_vec),
                );
            }
            _ => {}
        }
    }

    /// Each checkpoint row that differs from the chain: the seq of the
    /// entry that recorded it (1 when none did), and how.
    fn differences(&self, checkpoints: &[Checkpoint]) -> Vec<(u64, String)> {
        let genesis_ms = self.genesis_ms.unwrap_or(u64::MAX);
        let mut bad = Vec::new();
        for c in checkpoints {
            let Some((seq, e)) = self.recorded.get(c.id.as_bytes()) else {
                if (c.created_at_ms as u64) >= genesis_ms {
                    bad.push((
                        1,
                        format!("checkpoint {} is in the table but not on the chain", c.id),
                    ));
                }
                continue;
            };
            let changed = differing_fields(e, c);
            if !changed.is_empty() {
                bad.push((
                    *seq,
                    format!(
                        "checkpoint {}'s {} differs from what the chain recorded at entry {seq}",
                        c.id,
                        changed.join(" and ")
                    ),
                ));
            }
            let pruned_on_chain = self.pruned.contains(c.id.as_bytes());
            if c.pruned != pruned_on_chain {
                bad.push((
                    *seq,
                    format!(
                        "checkpoint {} is {} in the table, but {} on the chain",
                        c.id,
                        if c.pruned { "pruned" } else { "kept" },
                        if pruned_on_chain {
                            "a gc pruned it"
                        } else {
                            "no gc pruned it"
                        }
                    ),
                ));
            }
        }
        bad
    }
}

/// What the chain's `effect` and `effect-outcome` entries leave for each
/// effect, read in chain order: the payload admitted and the status since.
/// The barrier's table must say the same; the barrier (D109) and
/// `verify --deep` (D103) both replay the chain through this.
#[derive(Default)]
struct EffectReplay {
    state: HashMap<EffectId, (Vec<u8>, String)>,
}

/// An effect's (scope, key), as the chain's entries hold them.
type EffectId = (Vec<u8>, Vec<u8>);

impl EffectReplay {
    fn see(&mut self, e: &crate::chain::Entry) {
        let id = || {
            (
                e.field("scope").unwrap_or_default().to_vec(),
                e.field("key").unwrap_or_default().to_vec(),
            )
        };
        match e.kind.as_str() {
            "effect" if e.field("decision") == Some(b"admitted") => {
                let payload = e.field("payload").unwrap_or_default().to_vec();
                self.state.insert(id(), (payload, "admitted".into()));
            }
            "effect-outcome" => {
                if let Some(st) = self.state.get_mut(&id()) {
                    st.1 = String::from_utf8_lossy(e.field("outcome").unwrap_or_default()).into();
                }
            }
            _ => {}
        }
    }

    fn take(&mut self, scope: &[u8], key: &[u8]) -> Option<(Vec<u8>, String)> {
        self.state.remove(&(scope.to_vec(), key.to_vec()))
    }

    fn into_keys(self) -> impl Iterator<Item = EffectId> {
        self.state.into_keys()
    }
}

/// What the barrier checks before it decides (D109): the whole chain
/// verifies (DESIGN §5: a broken chain refuses), and this effect's row
/// says what the chain's entries for it leave. A row deleted or edited
/// by SQL re-opened a spent effect, and a chain broken anywhere but its
/// last two entries was not noticed; both are now refusals. One walk of
/// the chain: a few milliseconds per 5,000 entries, paid only by calls
/// that match an effect rule.
fn barrier_check(
    conn: &Connection,
    path: &Path,
    workspace_id: &str,
    req: &crate::effects::Request,
) -> Result<std::result::Result<(), String>> {
    let mut effects = EffectReplay::default();
    let mut genesis_ms = u64::MAX;
    let verdict = crate::chain::verify_with(conn, path, workspace_id, None, &mut |e| {
        if e.kind == "genesis" {
            genesis_ms = genesis_ms.min(e.time_ms);
        }
        effects.see(e);
    })?;
    // (payload, status) as the chain's entries for this effect leave it.
    let on_chain = effects.take(req.scope.as_bytes(), req.key.as_bytes());
    if let Some(b) = &verdict.first_bad {
        return Ok(Err(format!("the event chain is broken at {}", b.summary())));
    }
    if verdict.entries == 0 {
        return Ok(Err("the event chain is empty (no genesis)".into()));
    }
    let row: Option<(Vec<u8>, String, i64)> = conn
        .cached_row(
            "SELECT payload, status, admitted_at FROM effects WHERE scope = ?1 AND key = ?2",
            params![req.scope, req.key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )
        .optional()
        .map_err(db_err(path))?;
    let agrees = match (&row, &on_chain) {
        (None, None) => true,
        (Some((payload, status, _)), Some((p, s))) => payload == p && status == s,
        // Admitted before the chain existed (a ledger from before it).
        (Some((_, _, at)), None) => (*at as u64) < genesis_ms,
        (None, Some(_)) => false,
    };
    if agrees {
        return Ok(Ok(()));
    }
    let say = |x: Option<&str>| x.unwrap_or("no row").to_string();
    Ok(Err(format!(
        "the barrier's row for {}:{} ({}) is not what the chain recorded ({}): it was changed outside rewind; `rewind verify --deep` lists what differs",
        req.scope,
        req.key,
        say(row.as_ref().map(|r| r.1.as_str())),
        on_chain
            .as_ref()
            .map_or("never admitted".to_string(), |c| c.1.clone()),
    )))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tree::{Entry, Target};

    fn one_link_node(target: &[u8]) -> (Hash, Node) {
        let node = Node {
            entries: vec![Entry {
                name: b"link".to_vec(),
                mode: 0o120777,
                size: target.len() as u64,
                mtime_ns: 0,
                target: Target::Link(target.to_vec()),
                xattrs: Vec::new(),
            }],
        };
        (Node::hash_of_encoding(&node.encode()), node)
    }

    /// D212: a WAL with a commit of its generation is history; one cut
    /// to its header, one whose frames are of an older generation (other
    /// salts) or were never committed is not.
    #[test]
    fn only_a_wal_holding_a_commit_is_history() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger.db");
        let ledger = Ledger::create(&path, "test").expect("ledger");
        let wal = std::fs::read(wal_path(&path)).expect("read the WAL");
        drop(ledger);
        assert!(
            wal_has_commit(&wal),
            "a new ledger's WAL holds its creation"
        );
        assert!(!wal_has_commit(&wal[..32]), "the header alone");
        assert!(!wal_has_commit(&[]), "nothing");
        let mut other = wal.clone();
        other[16] ^= 0xff;
        assert!(!wal_has_commit(&other), "frames of another generation");
        let page = u32::from_be_bytes([wal[8], wal[9], wal[10], wal[11]]) as usize;
        let mut uncommitted = wal.clone();
        for f in uncommitted[32..].chunks_exact_mut(24 + page) {
            f[4..8].fill(0);
        }
        assert!(!wal_has_commit(&uncommitted), "frames never committed");
    }

    /// D181: a server's commit never folds the WAL itself, however far
    /// past SQLite's 1,000 frames it goes; the fold after the reply does,
    /// and the next commit starts the WAL over.
    #[test]
    fn a_deferred_fold_runs_after_the_commit_and_the_wal_starts_over() {
        use std::sync::atomic::Ordering;
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("ledger.db");
        let mut ledger = Ledger::create(&path, "test").expect("ledger");
        ledger.defer_wal_folds();
        let frames_in_wal = || -> i64 {
            let probe = open_connection(&path).expect("probe connection");
            // A fold on a probe that gives up at once: it reports the
            // WAL's frames (column 1) whether or not it copies any.
            let _ = probe.busy_timeout(Duration::ZERO);
            probe
                .query_row("PRAGMA wal_checkpoint(PASSIVE)", [], |r| r.get(1))
                .expect("wal_checkpoint")
        };
        let mut n = 0u32;
        while WAL_FRAMES.load(Ordering::Relaxed) < FOLD_AT_FRAMES + 200 {
            ledger
                .write(|tx| {
                    for _ in 0..20 {
                        n += 1;
                        let data = vec![n as u8; 3000];
                        tx.put_blob(&crate::hash::Hash::of(&n.to_be_bytes()), &data)?;
                    }
                    Ok(())
                })
                .expect("commit");
            assert!(
                n < 200_000,
                "the WAL never grew past {FOLD_AT_FRAMES} frames"
            );
        }
        let before = WAL_FRAMES.load(Ordering::Relaxed);
        assert!(
            before > FOLD_AT_FRAMES + 100,
            "{before} frames: folded and started over in a commit"
        );
        ledger.fold_wal_later();
        let waited = std::time::Instant::now();
        while FOLDING.load(Ordering::Acquire) {
            assert!(
                waited.elapsed() < Duration::from_secs(30),
                "the fold never finished"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
        ledger
            .write(|tx| tx.put_blob(&crate::hash::Hash::of(b"after"), b"after"))
            .expect("commit after the fold");
        let after = frames_in_wal();
        assert!(
            after < 50,
            "{after} frames after the fold: the WAL did not start over"
        );
    }

    /// D70: a small WAL outlives the last close unfolded (one flush per
    /// command instead of four) and the next open reads what it holds;
    /// past `WAL_KEPT_ON_CLOSE` the close folds it and empties the file.
    #[test]
    fn a_small_wal_is_kept_on_close_and_a_large_one_is_folded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        drop(Ledger::create(&db, "test").expect("ledger"));
        let wal_len = || std::fs::metadata(wal_path(&db)).map_or(0, |m| m.len());
        {
            let ledger = Ledger::open(&db).expect("open");
            put_meta(&ledger.conn, "small", "kept").expect("write");
        }
        assert!(wal_len() > 0, "a small WAL is folded on close");
        let ledger = Ledger::open(&db).expect("reopen");
        assert_eq!(ledger.meta("small").expect("read").as_deref(), Some("kept"));
        let big = "x".repeat(WAL_KEPT_ON_CLOSE as usize + (1 << 20));
        put_meta(&ledger.conn, "big", &big).expect("write");
        drop(ledger);
        assert_eq!(wal_len(), 0, "a WAL past the limit is not folded on close");
        let ledger = Ledger::open(&db).expect("reopen");
        assert_eq!(
            ledger.meta("big").expect("read").map(|v| v.len()),
            Some(big.len())
        );
    }

    #[test]
    fn an_idle_fold_restarts_the_wal_and_a_busy_one_changes_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        drop(Ledger::create(&db, "test").expect("ledger"));
        let wal_len = || std::fs::metadata(wal_path(&db)).map_or(0, |m| m.len());
        let ledger = Ledger::open(&db).expect("open");
        put_meta(&ledger.conn, "k", "v1").expect("write");
        let reader = Ledger::open(&db).expect("second connection");
        let tx = reader.conn.unchecked_transaction().expect("begin");
        assert_eq!(reader.meta("k").expect("read").as_deref(), Some("v1"));
        let before = wal_len();
        assert!(before > 0, "the write is in the WAL");
        assert!(!ledger.fold_wal_if_idle(), "a reader is in a transaction");
        assert!(wal_len() >= before, "a busy fold truncated the WAL");
        drop(tx);
        drop(reader);
        assert!(ledger.fold_wal_if_idle(), "nobody else is active");
        let one_frame = wal_len();
        assert!(
            one_frame > 0 && one_frame < before,
            "an idle fold leaves a new WAL with its first commit: {one_frame} bytes, {before} before"
        );
        drop(ledger);
        let ledger = Ledger::open(&db).expect("reopen");
        assert_eq!(ledger.meta("k").expect("read").as_deref(), Some("v1"));
    }

    /// A ledger from before the migration stamp (no `notes` table, as an
    /// older build made it) is brought up to date on open and stamped; a
    /// stamped ledger is trusted without the checks. A new ledger is
    /// complete and stamped from the start.
    #[test]
    fn an_unstamped_ledger_is_migrated_once_and_a_new_one_needs_nothing() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        let tables = |l: &Ledger| -> Vec<String> {
            let mut st = l
                .conn
                .prepare("SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name")
                .expect("prepare");
            st.query_map([], |r| r.get(0))
                .expect("query")
                .collect::<rusqlite::Result<_>>()
                .expect("rows")
        };
        let stamp = |l: &Ledger| -> i64 {
            l.conn
                .query_row("PRAGMA user_version", [], |r| r.get(0))
                .expect("user_version")
        };
        let ledger = Ledger::create(&db, "test").expect("ledger");
        let complete = tables(&ledger);
        assert!(complete.iter().any(|t| t == "notes"), "{complete:?}");
        assert!(complete.iter().any(|t| t == "pending"), "{complete:?}");
        assert_eq!(stamp(&ledger), MIGRATED);
        ledger
            .conn
            .execute_batch("DROP TABLE notes; PRAGMA user_version = 0;")
            .expect("make it look older");
        drop(ledger);
        let ledger = Ledger::open(&db).expect("open");
        assert_eq!(tables(&ledger), complete, "the missing table is back");
        assert_eq!(stamp(&ledger), MIGRATED);
        ledger
            .conn
            .execute_batch("DROP TABLE notes;")
            .expect("drop behind the stamp");
        drop(ledger);
        let ledger = Ledger::open(&db).expect("open");
        assert!(
            !tables(&ledger).iter().any(|t| t == "notes"),
            "a stamped ledger was checked again"
        );
    }

    /// D235: a stat cache from before `skips` cannot say which listings
    /// skipped an entry: migrating drops its rows (the next capture walks),
    /// and a row written since says it.
    #[test]
    fn a_stat_cache_from_before_skips_is_dropped_and_rows_say_their_skips() {
        let dir = tempfile::tempdir().expect("temp dir");
        let db = dir.path().join("ledger.db");
        let ledger = Ledger::create(&db, "test").expect("ledger");
        ledger
            .conn
            .execute_batch(
                "DROP INDEX stat_cache_skips; ALTER TABLE stat_cache DROP COLUMN skips;
                 INSERT INTO stat_cache(dir, node, stats) VALUES (x'', x'00', x'');
                 PRAGMA user_version = 3;",
            )
            .expect("make it look older");
        drop(ledger);
        let mut ledger = Ledger::open(&db).expect("open");
        let rows: i64 = ledger
            .conn
            .query_row("SELECT count(*) FROM stat_cache", [], |r| r.get(0))
            .expect("count");
        assert_eq!(rows, 0, "rows that cannot say their skips were kept");
        ledger
            .write(|tx| {
                tx.put_stat_cache(b"a", &Hash([1; 32]), b"", true)?;
                tx.put_stat_cache(b"b", &Hash([2; 32]), b"", false)
            })
            .expect("put");
        assert_eq!(
            ledger.stat_cache_dirs_with_skips().expect("dirs"),
            vec![b"a".to_vec()]
        );
    }

    /// D165: a new ledger has 4 KiB pages (a small commit writes ~40
    /// scattered pages whole); a ledger made with 16 KiB pages before it
    /// keeps them (changing them would rewrite the whole file) and still
    /// opens and commits.
    #[test]
    fn a_new_ledger_has_4_kib_pages_and_an_older_one_keeps_its_own() {
        let dir = tempfile::tempdir().expect("temp dir");
        let page_size = |l: &Ledger| -> i64 {
            l.conn
                .query_row("PRAGMA page_size", [], |r| r.get(0))
                .expect("page_size")
        };
        let new = dir.path().join("new.db");
        assert_eq!(
            page_size(&Ledger::create(&new, "test").expect("ledger")),
            4096
        );
        assert_eq!(page_size(&Ledger::open(&new).expect("open")), 4096);

        // A 16 KiB ledger as an older build made it: the page size is set
        // before the first table, then the ledger is created in it.
        let old = dir.path().join("old.db");
        {
            let conn = Connection::open(&old).expect("sqlite");
            conn.execute_batch("PRAGMA page_size=16384; CREATE TABLE t(x); DROP TABLE t;")
                .expect("16 KiB database");
        }
        let ledger = Ledger::create(&old, "test").expect("ledger over the old file");
        assert_eq!(page_size(&ledger), 16384);
        drop(ledger);
        let ledger = Ledger::open(&old).expect("open");
        assert_eq!(page_size(&ledger), 16384, "reopening changed nothing");
        ledger.set_meta_now("probe", "written").expect("commits");
        assert_eq!(
            ledger.meta("probe").expect("read").as_deref(),
            Some("written")
        );
    }

    /// The node cache (D63) may outlive a row another process deletes:
    /// reads serve it, but `verify --deep` (`tree_uncached`) must see the
    /// ledger as it is, and a sweep in this process empties the cache.
    #[test]
    fn a_deleted_node_is_missing_to_the_uncached_read_and_after_a_sweep() {
        let dir = tempfile::tempdir().expect("temp dir");
        let mut ledger = Ledger::create(&dir.path().join("ledger.db"), "test").expect("ledger");
        let (hash, node) = one_link_node(b"somewhere");
        ledger
            .write(|tx| tx.put_tree(&hash, &node))
            .expect("store the node");
        let node = SharedNode::new(node);
        assert_eq!(ledger.tree(&hash).expect("read"), Some(node.clone()));
        ledger
            .conn
            .execute("DELETE FROM trees WHERE hash = ?1", [&hash.0[..]])
            .expect("delete behind the cache's back");
        assert_eq!(ledger.tree(&hash).expect("cached read"), Some(node));
        assert_eq!(ledger.tree_uncached(&hash).expect("uncached read"), None);
        ledger.forget_nodes();
        assert_eq!(ledger.tree(&hash).expect("read after forget"), None);
    }

    /// Committed nodes are remembered; the cache starts over instead of
    /// growing past its bound.
    #[test]
    fn remembered_nodes_are_served_and_the_cache_stays_bounded() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = Ledger::create(&dir.path().join("ledger.db"), "test").expect("ledger");
        let (hash, node) = one_link_node(b"first");
        let node = SharedNode::new(node);
        ledger.remember_nodes(HashMap::from([(hash, node.clone())]));
        assert_eq!(ledger.tree(&hash).expect("read"), Some(node));
        let many: HashMap<Hash, SharedNode> = (0..NODE_CACHE_MAX)
            .map(|i| one_link_node(format!("t{i}").as_bytes()))
            .map(|(h, n)| (h, SharedNode::new(n)))
            .collect();
        ledger.remember_nodes(many);
        assert!(ledger.nodes.borrow().len() <= NODE_CACHE_MAX);
        assert_eq!(ledger.tree(&hash).expect("read after reset"), None);
    }

    /// Wide nodes bound the cache by their bytes, not their number: a
    /// server's cache grew by a 5,000-entry directory per checkpoint
    /// (helper-85).
    #[test]
    fn the_node_cache_stays_within_its_bytes_whatever_the_nodes_width() {
        let dir = tempfile::tempdir().expect("temp dir");
        let ledger = Ledger::create(&dir.path().join("ledger.db"), "test").expect("ledger");
        for i in 0..40u8 {
            let (hash, node) = one_link_node(&vec![i; 1 << 20]);
            ledger.remember_nodes([(hash, SharedNode::new(node))]);
            let held: usize = ledger
                .nodes
                .borrow()
                .values()
                .map(|n| n.approx_bytes())
                .sum();
            assert_eq!(held, ledger.nodes_bytes.get());
            assert!(held <= NODE_CACHE_MAX_BYTES, "{held} bytes cached");
        }
        assert!(ledger.nodes.borrow().len() < 40);
    }
}
