//! The effect barrier (DESIGN §5): before an irreversible external effect
//! (payment, email, deploy, `git push`), `guard` decides whether it may run,
//! knowing that a rewind cannot undo it. Identity is (scope, key); the
//! payload is hashed canonically. Every decision, refusals included, is
//! appended to the chain in the same transaction as the ledger change, and
//! anything that keeps us from deciding with certainty refuses (fail
//! closed).
//!
//! Timeline rule. An admission records HEAD (`H`) and the newest
//! checkpoint and operation at that moment. Later, with HEAD `C`, the
//! effect is on the current timeline when either `C == H` and no rewind,
//! replay, undo or restore happened since, or `C` descends from `H` through
//! a child of `H` created after the admission. Otherwise the timeline it
//! happened on was rewound past: `SPENT_BEFORE_REWIND`.

use crate::ledger::CachedRow;
use rusqlite::{Connection, OptionalExtension, params};
use serde::Serialize;

use crate::chain::Fields;
use crate::hash::{Hash, Hasher};

pub const SCHEMA: &str = "
CREATE TABLE IF NOT EXISTS effects(
    scope TEXT NOT NULL,
    key TEXT NOT NULL,
    kind TEXT NOT NULL,
    payload BLOB NOT NULL,
    status TEXT NOT NULL,
    head INTEGER,
    max_checkpoint INTEGER NOT NULL,
    max_operation INTEGER NOT NULL,
    first_seq INTEGER NOT NULL,
    attempts INTEGER NOT NULL,
    admitted_at INTEGER NOT NULL,
    admitted_call TEXT,
    PRIMARY KEY(scope, key)
) WITHOUT ROWID;
";

/// What is being asked.
#[derive(Debug, Clone)]
pub struct Request {
    pub scope: String,
    pub key: String,
    pub kind: String,
    pub payload: Hash,
    /// The agent's id for the call asking (a hook's `tool_use_id`): the
    /// outcome of another call never resolves this one (D108).
    pub call: Option<String>,
    /// Keys the same effect was recorded under by earlier builds, asked
    /// when `key` has no row: a shell line's key named the agent's own
    /// tool before D210 (`run_shell_command:git push`).
    pub former_keys: Vec<String>,
}

/// The longest key or scope the ledger stores. A hook's key is the whole
/// command: a 5 MB `curl -d …` grew the ledger by 5 MB at every decision
/// (D163). Longer derived keys are cut and named by their hash
/// ([`Request::bounded_key`]); longer typed ones are refused.
pub const KEY_MAX: usize = 4096;

impl Request {
    /// The key this build records the effect under, then the keys
    /// earlier builds recorded the same call under.
    pub fn keys(&self) -> impl Iterator<Item = &String> {
        std::iter::once(&self.key).chain(&self.former_keys)
    }

    /// `key` itself up to [`KEY_MAX`] bytes, else its first 256 bytes (to
    /// a character boundary), an ellipsis and the SHA-256 of the whole
    /// key: still exact (two commands that differ anywhere get two keys),
    /// and short enough to record at every decision and to type into
    /// `effects resolve`.
    pub fn bounded_key(key: String) -> String {
        if key.len() <= KEY_MAX {
            return key;
        }
        let mut cut = 256;
        while !key.is_char_boundary(cut) {
            cut -= 1;
        }
        let digest = Hash::of(key.as_bytes()).to_hex();
        format!("{}… sha256:{digest}", &key[..cut])
    }

    /// Why a key or scope a caller typed (`guard`, the MCP tool) cannot
    /// name an effect: empty, or holding a control character (a NUL or a
    /// newline made two effects print alike in `effects` while the
    /// barrier kept them apart). Hook keys are derived from the tool call
    /// and are not checked: the hook decides on whatever the agent ran.
    pub fn unfit_name(field: &str, value: &str) -> Option<String> {
        let example = match field {
            "scope" => "billing",
            "kind" => "payment",
            _ => "charge-order-1234",
        };
        if value.trim().is_empty() {
            return Some(format!(
                "the effect's {field} is empty: name it, e.g. {example}"
            ));
        }
        if value.len() > KEY_MAX {
            return Some(format!(
                "the effect's {field} is {} bytes, more than {KEY_MAX}: name it by a short word or id, e.g. {example}",
                value.len()
            ));
        }
        // Invisible and reordering characters too (U+202E, U+200B,
        // U+2028), as labels refuse them (D294): `effects` showed such a
        // key reordered, and the user must type it to resolve it
        // (helper-61, D306).
        value.chars().find(|c| crate::names::unseen(*c)).map(|c| {
            if c.is_control() {
                format!(
                    "the effect's {field} {value:?} holds the control character {c:?}: use printable text"
                )
            } else {
                format!(
                    "the effect's {field} \"{}\" holds the character U+{:04X}, which a terminal does not show as itself: use visible text",
                    crate::names::shown(value),
                    c as u32
                )
            }
        })
    }

    /// [`Request::unfit_name`] for this request's key, scope and kind (a
    /// kind may be left out, but one given is printed by `effects` as the
    /// others are: a newline in it forged a line there, D189).
    pub fn check_names(&self) -> std::result::Result<(), String> {
        match Request::unfit_name("key", &self.key)
            .or_else(|| Request::unfit_name("scope", &self.scope))
            .or_else(|| {
                (!self.kind.is_empty())
                    .then(|| Request::unfit_name("kind", &self.kind))
                    .flatten()
            }) {
            Some(why) => Err(why),
            None => Ok(()),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum Code {
    FirstFiring,
    Spent,
    SpentBeforeRewind,
    PayloadMismatch,
    RetryAfterFailure,
    LedgerUnavailable,
}

impl Code {
    pub fn admitted(self) -> bool {
        matches!(self, Code::FirstFiring | Code::RetryAfterFailure)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Code::FirstFiring => "FIRST_FIRING",
            Code::Spent => "SPENT",
            Code::SpentBeforeRewind => "SPENT_BEFORE_REWIND",
            Code::PayloadMismatch => "PAYLOAD_MISMATCH",
            Code::RetryAfterFailure => "RETRY_AFTER_FAILURE",
            Code::LedgerUnavailable => "LEDGER_UNAVAILABLE",
        }
    }
}

/// `guard`'s answer.
#[derive(Debug, Clone, Serialize)]
pub struct Decision {
    pub decision: &'static str,
    pub code: Code,
    pub reason: String,
    pub scope: String,
    pub key: String,
    /// The chain entry recording this decision (absent when the ledger
    /// could not be written: then nothing was admitted either).
    pub seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_seq: Option<u64>,
    pub chain_head: Option<String>,
}

impl Decision {
    /// The one line on stderr that explains a refusal (`guard`, hooks).
    /// A key past 300 bytes (a hook's key is the whole command: a 5 MB
    /// `curl -d …` put 5 MB on the agent's stderr at each refusal,
    /// helper-19) is cut, with its length.
    pub fn refusal_line(&self) -> String {
        const SHOWN: usize = 300;
        let key = match self.key.char_indices().nth(SHOWN) {
            Some((cut, _)) => format!("{}… ({} bytes)", &self.key[..cut], self.key.len()),
            None => self.key.clone(),
        };
        format!(
            "rewind: {} ({}:{}): {}",
            self.code.as_str(),
            crate::names::shown(&self.scope),
            crate::names::shown(&key),
            self.reason
        )
    }

    pub fn unavailable(req: &Request, reason: String) -> Decision {
        Decision {
            decision: "refused",
            code: Code::LedgerUnavailable,
            reason: format!("refused, fail closed: {reason}"),
            scope: req.scope.clone(),
            key: req.key.clone(),
            seq: None,
            first_seq: None,
            chain_head: None,
        }
    }
}

/// SHA-256 of a payload in canonical form: JSON is re-serialized with
/// object keys sorted and no whitespace (so key order and spacing do not
/// matter); anything that is not JSON is hashed as given.
pub fn payload_hash(raw: Option<&str>) -> Hash {
    let canonical = match raw.map(str::trim) {
        None | Some("") => String::new(),
        Some(text) => match serde_json::from_str::<serde_json::Value>(text) {
            Ok(v) => canonical_json(&v),
            Err(_) => text.to_string(),
        },
    };
    let mut h = Hasher::default();
    h.update(b"rewind-payload-v1\0");
    h.update(canonical.as_bytes());
    h.finish()
}

/// Compact JSON with object keys sorted bytewise, whatever order the map
/// keeps (serde_json's `preserve_order` feature changes that order, and
/// features are unified across the dependency graph).
pub fn canonical_json(v: &serde_json::Value) -> String {
    fn write(v: &serde_json::Value, out: &mut String) {
        match v {
            serde_json::Value::Object(m) => {
                let mut keys: Vec<&String> = m.keys().collect();
                keys.sort();
                out.push('{');
                for (i, k) in keys.into_iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    out.push_str(&serde_json::Value::String(k.clone()).to_string());
                    out.push(':');
                    write(&m[k], out);
                }
                out.push('}');
            }
            serde_json::Value::Array(a) => {
                out.push('[');
                for (i, x) in a.iter().enumerate() {
                    if i > 0 {
                        out.push(',');
                    }
                    write(x, out);
                }
                out.push(']');
            }
            scalar => out.push_str(&scalar.to_string()),
        }
    }
    let mut out = String::new();
    write(v, &mut out);
    out
}

pub fn payload_hash_value(v: Option<&serde_json::Value>) -> Hash {
    payload_hash(v.map(|v| v.to_string()).as_deref())
}

struct Row {
    payload: Vec<u8>,
    status: String,
    head: Option<i64>,
    max_checkpoint: i64,
    max_operation: i64,
    first_seq: i64,
}

fn max_of(conn: &Connection, table: &str) -> rusqlite::Result<i64> {
    conn.cached_row(
        &format!("SELECT coalesce(max(seq), 0) FROM {table}"),
        [],
        |r| r.get(0),
    )
}

fn head_seq(conn: &Connection) -> rusqlite::Result<Option<i64>> {
    let v: Option<String> = conn
        .cached_row("SELECT value FROM meta WHERE key = 'head'", [], |r| {
            r.get(0)
        })
        .optional()?;
    Ok(v.and_then(|s| s.parse().ok()))
}

/// The current timeline, read once: for each checkpoint on the path from
/// HEAD up towards the root, the child the path takes below it. It goes
/// up only while the checkpoints are newer than `bound`: a step below an
/// effect's HEAD counts only when it was taken after the admission, and a
/// parent is always older than its child, so nothing above `bound` can
/// decide (and a parent row that is not older, which only damage makes,
/// ends the walk instead of looping: the effect then counts as off the
/// timeline, and is refused). One recursive query: the walk used to be a query per ancestor
/// per effect, and a rewind after 5,000 checkpoints and 20 effects took
/// 1.6 s (helper-16's scale run, D132).
struct Timeline {
    now: Option<i64>,
    newest_operation: i64,
    /// parent (`None`: the root) → its child on the path.
    child_of: std::collections::HashMap<Option<i64>, i64>,
}

impl Timeline {
    fn read(conn: &Connection, bound: i64) -> rusqlite::Result<Timeline> {
        let now = head_seq(conn)?;
        let mut stmt = conn.prepare_cached(
            "WITH RECURSIVE path(seq, parent) AS (
                 SELECT seq, parent FROM checkpoints WHERE seq = ?1
                 UNION ALL
                 SELECT c.seq, c.parent FROM checkpoints c JOIN path p ON c.seq = p.parent
                 WHERE p.seq > ?2 AND c.seq < p.seq
             )
             SELECT seq, parent FROM path",
        )?;
        let child_of = stmt
            .query_map(params![now, bound], |r| {
                Ok((r.get::<_, Option<i64>>(1)?, r.get::<_, i64>(0)?))
            })?
            .collect::<rusqlite::Result<_>>()?;
        Ok(Timeline {
            now,
            newest_operation: max_of(conn, "operations")?,
            child_of,
        })
    }

    /// Is an effect admitted at (`head`, newest checkpoint, newest
    /// operation) on this timeline? See the module docs. `max_checkpoint`
    /// must not be below the `bound` the timeline was read with.
    fn contains(&self, head: Option<i64>, max_checkpoint: i64, max_operation: i64) -> bool {
        if self.now == head {
            return self.newest_operation == max_operation;
        }
        self.child_of
            .get(&head)
            .is_some_and(|&child| child > max_checkpoint)
    }
}

/// Decide and record, inside an open `BEGIN IMMEDIATE` transaction.
pub fn decide(conn: &Connection, req: &Request) -> rusqlite::Result<Decision> {
    let mut existing: Option<Row> = None;
    // The key the row is under: an older release's form of this key.
    let mut found_key = &req.key;
    for key in req.keys() {
        found_key = key;
        existing = conn
            .cached_row(
                "SELECT payload, status, head, max_checkpoint, max_operation, first_seq FROM effects WHERE scope = ?1 AND key = ?2",
                params![req.scope, key],
                |r| Ok(Row { payload: r.get(0)?, status: r.get(1)?, head: r.get(2)?, max_checkpoint: r.get(3)?, max_operation: r.get(4)?, first_seq: r.get(5)? }),
            )
            .optional()?;
        if existing.is_some() {
            break;
        }
    }
    let now = head_seq(conn)?;
    let timeline = match &existing {
        Some(row) => Some(Timeline::read(conn, row.max_checkpoint)?),
        None => None,
    };
    let (code, reason) = match &existing {
        None => (Code::FirstFiring, "first firing of this key: admitted and recorded".to_string()),
        // Under a former key the payload is the older build's form of the
        // same call (an argv's bare join before D293): the key names it.
        Some(row) if row.payload != req.payload.0 && found_key == &req.key => {
            (Code::PayloadMismatch, "this key was used with a different payload: refused (use a new key for a different effect)".to_string())
        }
        Some(row) if row.status == "failed" => (Code::RetryAfterFailure, "the last attempt was resolved as failed: admitted again".to_string()),
        Some(row)
            if timeline
                .as_ref()
                .is_some_and(|t| t.contains(row.head, row.max_checkpoint, row.max_operation)) =>
        {
            (Code::Spent, format!("already admitted on the current timeline: refused{}", reopen_advice(&req.scope, found_key, &row.status)))
        }
        Some(row) => (
            Code::SpentBeforeRewind,
            format!(
                "already admitted on a timeline that was rewound past; the rewind did not undo it: refused{}",
                reopen_advice(&req.scope, found_key, &row.status)
            ),
        ),
    };
    let head_id: String = match now {
        Some(s) => conn
            .cached_row("SELECT id FROM checkpoints WHERE seq = ?1", [s], |r| {
                r.get(0)
            })
            .optional()?
            .unwrap_or_default(),
        None => String::new(),
    };
    let seq = crate::chain::append(
        conn,
        "effect",
        Fields::new()
            .str("code", code.as_str())
            .str(
                "decision",
                if code.admitted() {
                    "admitted"
                } else {
                    "refused"
                },
            )
            .str("head", &head_id)
            .str("key", &req.key)
            .str("kind", &req.kind)
            .bytes("payload", &req.payload.0)
            .str("scope", &req.scope),
    )?;
    if code.admitted() {
        let (max_checkpoint, max_operation) =
            (max_of(conn, "checkpoints")?, max_of(conn, "operations")?);
        conn.execute(
            "INSERT INTO effects(scope, key, kind, payload, status, head, max_checkpoint, max_operation, first_seq, attempts, admitted_at, admitted_call)
             VALUES (?1, ?2, ?3, ?4, 'admitted', ?5, ?6, ?7, ?8, 1, ?9, ?10)
             ON CONFLICT(scope, key) DO UPDATE SET status = 'admitted', head = ?5, max_checkpoint = ?6, max_operation = ?7,
                 attempts = attempts + 1, admitted_at = ?9, admitted_call = ?10",
            params![req.scope, req.key, req.kind, &req.payload.0[..], now, max_checkpoint, max_operation, seq as i64, crate::time::now_ms(), req.call],
        )?;
    }
    let first_seq = existing
        .as_ref()
        .map(|r| r.first_seq as u64)
        .or((code == Code::FirstFiring).then_some(seq));
    let chain_head = crate::chain::head_hash(conn)?.map(|h| h.to_hex());
    Ok(Decision {
        decision: if code.admitted() {
            "admitted"
        } else {
            "refused"
        },
        code,
        reason,
        scope: req.scope.clone(),
        key: req.key.clone(),
        seq: Some(seq),
        first_seq,
        chain_head,
    })
}

/// One ledger row, for `effects` and for rewind reports.
#[derive(Debug, Clone, Serialize)]
pub struct Effect {
    pub scope: String,
    pub key: String,
    pub kind: String,
    pub status: String,
    pub payload: String,
    pub admitted_at: String,
    pub head: Option<String>,
    pub first_seq: u64,
    pub attempts: u64,
}

pub fn list(conn: &Connection) -> rusqlite::Result<Vec<Effect>> {
    let mut stmt = conn.prepare_cached(
        "SELECT e.scope, e.key, e.kind, e.status, e.payload, e.admitted_at, c.id, e.first_seq, e.attempts
         FROM effects e LEFT JOIN checkpoints c ON c.seq = e.head ORDER BY e.first_seq",
    )?;
    let rows = stmt.query_map([], |r| {
        let payload: Vec<u8> = r.get(4)?;
        Ok(Effect {
            scope: r.get(0)?,
            key: r.get(1)?,
            kind: r.get(2)?,
            status: r.get(3)?,
            payload: crate::hash::hex(&payload),
            admitted_at: crate::time::format_rfc3339(r.get(5)?),
            head: r.get(6)?,
            first_seq: r.get::<_, i64>(7)? as u64,
            attempts: r.get::<_, i64>(8)? as u64,
        })
    })?;
    rows.collect()
}

/// Admitted effects that the current timeline no longer contains: what a
/// rewind just went back past without undoing.
pub fn not_undone(conn: &Connection) -> rusqlite::Result<Vec<Effect>> {
    let mut at = Vec::new();
    for e in list(conn)? {
        if e.status == "failed" {
            continue;
        }
        let (head, maxc, maxo): (Option<i64>, i64, i64) = conn.cached_row(
            "SELECT head, max_checkpoint, max_operation FROM effects WHERE scope = ?1 AND key = ?2",
            params![e.scope, e.key],
            |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?)),
        )?;
        at.push((e, head, maxc, maxo));
    }
    let Some(bound) = at.iter().map(|&(_, _, maxc, _)| maxc).min() else {
        return Ok(Vec::new());
    };
    let timeline = Timeline::read(conn, bound)?;
    Ok(at
        .into_iter()
        .filter(|&(_, head, maxc, maxo)| !timeline.contains(head, maxc, maxo))
        .map(|(e, ..)| e)
        .collect())
}

/// Record an outcome. Returns false when the key is unknown.
/// What recording an outcome did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// Recorded, at this chain entry.
    Recorded(u64),
    /// No effect has this scope and key.
    Unknown,
    /// It already had this outcome: nothing recorded.
    Unchanged,
    /// Not recorded, and why (the effect keeps its status).
    Refused(String),
}

/// The command a person runs to say that effect `scope:key` failed, so that
/// it may run again, quoted to paste as written (a shell line's key holds
/// spaces, D214). The scope is its own option and the key comes after
/// `--`: `SCOPE:KEY` named two effects when a scope held a colon, and a
/// scope starting with `-` read as an option (helper-54). A key too long
/// to paste is named through `rewind effects --json`.
fn resolve_command(scope: &str, key: &str, reopen: bool) -> String {
    const PASTABLE: usize = 300;
    let reopen = if reopen { " --reopen" } else { "" };
    // `--scope=WORD`: a scope that starts with `-` is then no option.
    let scope = crate::names::pasteable_word(scope);
    let resolve = |key: &str| {
        format!("`rewind effects resolve --scope={scope} --outcome failed{reopen} -- {key}`")
    };
    if key.len() > PASTABLE {
        format!("{} with KEY from `rewind effects --json`", resolve("KEY"))
    } else {
        resolve(&crate::names::pasteable_word(key))
    }
}

/// How a refused effect that did not take effect is opened again. The
/// barrier refuses on what it was told: an outcome never reported (an MCP
/// client has no tool for it, a hook payload did not say) or reported
/// wrongly leaves the effect spent until the user says otherwise. Said to
/// the agent, for its user: the agent's hooks refuse the command (D286).
fn reopen_advice(scope: &str, key: &str, status: &str) -> String {
    match status {
        "succeeded" => format!(
            " (it was recorded as succeeded; if it did not happen, the user can reopen it by running {} in a terminal)",
            resolve_command(scope, key, true)
        ),
        _ => format!(
            " (no outcome is recorded for it: it may still be running; if it failed, the user can reopen it by running {} in a terminal)",
            resolve_command(scope, key, false)
        ),
    }
}

/// Record an effect's outcome, by the rules that keep a done effect done
/// (D108): an admitted effect takes either outcome, but only from the call
/// it admitted when both calls are named; a failed one may turn out
/// succeeded; a succeeded one is reopened as failed only by a person who
/// says so (`reopen`). Before, any later "failed" (another call's, a
/// refused call's) reopened a succeeded push, and the next was admitted.
pub fn resolve(
    conn: &Connection,
    scope: &str,
    key: &str,
    outcome: &str,
    call: Option<&str>,
    reopen: bool,
) -> rusqlite::Result<Resolution> {
    let row: Option<(String, Option<String>)> = conn
        .cached_row(
            "SELECT status, admitted_call FROM effects WHERE scope = ?1 AND key = ?2",
            params![scope, key],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .optional()?;
    let Some((status, admitted_call)) = row else {
        return Ok(Resolution::Unknown);
    };
    if status == outcome {
        return Ok(Resolution::Unchanged);
    }
    if status == "admitted"
        && let (Some(asked), Some(admitted)) = (call, admitted_call.as_deref())
        && asked != admitted
    {
        return Ok(Resolution::Refused(format!(
            "{scope}:{key} was admitted for call {admitted}; the outcome of call {asked} is not its outcome"
        )));
    }
    // Admitted by a build from before the call was kept (D108): any
    // named call's failure read as its own, and a refused retry's failure
    // event reopened a push still running (helper-83). Only a success, or
    // a person, resolves it.
    if status == "admitted" && admitted_call.is_none() && call.is_some() && outcome == "failed" {
        return Ok(Resolution::Refused(format!(
            "{scope}:{key} was admitted by an earlier build of rewind, which kept no call, so a call's failure cannot be told to be its own (if it did not happen, the user runs {})",
            resolve_command(scope, key, false)
        )));
    }
    if status == "succeeded" && !reopen {
        return Ok(Resolution::Refused(format!(
            "{scope}:{key} already succeeded; a later failure does not reopen it (if it really did not happen, the user runs {})",
            resolve_command(scope, key, true)
        )));
    }
    conn.execute(
        "UPDATE effects SET status = ?3 WHERE scope = ?1 AND key = ?2",
        params![scope, key, outcome],
    )?;
    let seq = crate::chain::append(
        conn,
        "effect-outcome",
        Fields::new()
            .str("key", key)
            .str("outcome", outcome)
            .str("scope", scope),
    )?;
    Ok(Resolution::Recorded(seq))
}

#[cfg(test)]
mod tests {
    use super::{Code, Decision, Request, payload_hash};

    #[test]
    fn a_derived_key_past_the_bound_is_cut_and_named_by_its_hash() {
        let long = |tail: &str| format!("Bash:curl -d {}{tail}", "é".repeat(3_000));
        let (a, b) = (long("1"), long("2"));
        let (ka, kb) = (Request::bounded_key(a.clone()), Request::bounded_key(b));
        assert!(ka.len() < 400, "{} bytes", ka.len());
        assert_ne!(ka, kb, "keys differing only at the end stay apart");
        assert_eq!(ka, Request::bounded_key(a.clone()), "and are stable");
        assert!(
            ka.starts_with("Bash:curl -d é") && ka.contains(" sha256:"),
            "{ka}"
        );
        assert!(Request::unfit_name("key", &ka).is_none(), "{ka}");
        let why = Request::unfit_name("key", &a).expect("a typed 9 KB key is refused");
        assert!(why.contains("more than 4096"), "{why}");
        let short = "Bash:git push origin main".to_string();
        assert_eq!(Request::bounded_key(short.clone()), short);
    }

    #[test]
    fn a_refusal_line_cuts_a_huge_key_and_says_its_length() {
        let key = format!("Bash:curl -X POST https://x -d {}", "A".repeat(5_000_000));
        let d = Decision {
            decision: "refused",
            code: Code::Spent,
            reason: "already admitted".into(),
            scope: "hook".into(),
            key: key.clone(),
            seq: None,
            first_seq: None,
            chain_head: None,
        };
        let line = d.refusal_line();
        assert!(line.len() < 600, "{} bytes", line.len());
        assert!(line.contains(&format!("({} bytes)", key.len())), "{line}");
        let short = Decision {
            key: "Bash:git push".into(),
            ..d
        };
        assert!(short.refusal_line().contains("(hook:Bash:git push)"));
    }

    #[test]
    fn payload_hash_ignores_key_order_and_whitespace_only() {
        let a = payload_hash(Some(r#"{"amount": 100, "to": {"b": 1, "a": 2}}"#));
        let b = payload_hash(Some(r#"{"to":{"a":2,"b":1},"amount":100}"#));
        assert_eq!(a, b);
        assert_ne!(
            a,
            payload_hash(Some(r#"{"amount": 101, "to": {"b": 1, "a": 2}}"#))
        );
        assert_ne!(payload_hash(Some("[1,2]")), payload_hash(Some("[2,1]")));
        assert_eq!(payload_hash(None), payload_hash(Some("")));
    }
}
