//! The MCP tools: their input and output types (the JSON schemas are derived
//! from these, so schema and behaviour cannot drift apart), annotations,
//! profiles, and what each call does. Every tool runs the same code as the
//! CLI verb of the same name (`crate::cli`), on a blocking thread.

use std::path::PathBuf;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

use crate::cli::Ctx;
use crate::effects::{Request, payload_hash, payload_hash_value};
use crate::error::{Error, Result};
use crate::rewind::{self as engine, Op, RewindOptions, RewindReport};
use crate::workspace::ChangeJson;

/// Which tools a server offers (`--profile`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Profile {
    /// checkpoint, rewind, guard_effect: the smallest useful set.
    Lean,
    /// lean + list, replay, diff, status, backtrack_*.
    Recovery,
    /// Every tool.
    All,
}

impl Profile {
    pub const NAMES: &'static [&'static str] = &["lean", "recovery", "all"];

    /// As `--profile` spells it.
    pub fn name(self) -> &'static str {
        match self {
            Profile::Lean => "lean",
            Profile::Recovery => "recovery",
            Profile::All => "all",
        }
    }

    pub fn parse(name: &str) -> Result<Profile> {
        match name {
            "lean" => Ok(Profile::Lean),
            "recovery" => Ok(Profile::Recovery),
            "all" => Ok(Profile::All),
            other => Err(Error::Usage(format!(
                "unknown MCP profile '{other}': use one of {}",
                Profile::NAMES.join(", ")
            ))),
        }
    }
}

/// What a tool does to the world, in MCP annotation terms.
#[derive(Debug, Clone, Copy)]
pub struct Effects {
    pub read_only: bool,
    pub destructive: bool,
    pub idempotent: bool,
    pub open_world: bool,
}

const READ: Effects = Effects {
    read_only: true,
    destructive: false,
    idempotent: true,
    open_world: false,
};
const ADD: Effects = Effects {
    read_only: false,
    destructive: false,
    idempotent: false,
    open_world: false,
};
/// Rewinds overwrite the live tree; the previous tree is saved first, but
/// a client should still ask before running one.
const OVERWRITE: Effects = Effects {
    read_only: false,
    destructive: true,
    idempotent: false,
    open_world: false,
};

pub struct ToolDef {
    pub name: &'static str,
    pub title: &'static str,
    pub description: &'static str,
    pub effects: Effects,
    /// The smallest profile offering it.
    pub profile: Profile,
    pub input: fn() -> Map<String, Value>,
    pub output: fn() -> Map<String, Value>,
    pub call: fn(&Ctx, Value) -> Result<Value>,
}

impl ToolDef {
    pub fn offered_in(&self, p: Profile) -> bool {
        match p {
            Profile::All => true,
            Profile::Recovery => self.profile != Profile::All,
            Profile::Lean => self.profile == Profile::Lean,
        }
    }
}

macro_rules! tool {
    ($name:literal, $title:literal, $effects:expr, $profile:expr, $in:ty, $out:ty, $f:path, $desc:literal) => {
        ToolDef {
            name: $name,
            title: $title,
            description: $desc,
            effects: $effects,
            profile: $profile,
            input: schema::<$in>,
            output: schema::<$out>,
            call: |ctx, args| {
                let input: $in = parse_args($name, args)?;
                let out: $out = $f(ctx, input)?;
                serde_json::to_value(out).map_err(|e| Error::Usage(format!("internal: {e}")))
            },
        }
    };
}

pub static TOOLS: &[ToolDef] = &[
    tool!(
        "checkpoint",
        "Checkpoint the workspace",
        ADD,
        Profile::Lean,
        CheckpointIn,
        CheckpointOut,
        checkpoint,
        "Save the whole workspace, shell changes included; only changed files cost. Returns the id to rewind to."
    ),
    tool!(
        "rewind",
        "Rewind the workspace",
        OVERWRITE,
        Profile::Lean,
        RewindIn,
        RewindOut,
        rewind,
        "Make the workspace equal to checkpoint `id`. The current tree is saved first (`safety_checkpoint`): nothing is lost."
    ),
    tool!(
        "guard_effect",
        "Guard an irreversible effect",
        ADD,
        Profile::Lean,
        GuardIn,
        GuardOut,
        guard_effect,
        "Call before an effect no rewind can undo (payment, email, deploy, push). Go on only if decision is \"admitted\"."
    ),
    tool!(
        "list",
        "List checkpoints",
        READ,
        Profile::Recovery,
        ListIn,
        ListOut,
        list,
        "Checkpoints, newest first, with HEAD marked and the notes left on abandoned branches."
    ),
    tool!(
        "status",
        "What changed since HEAD",
        READ,
        Profile::Recovery,
        StatusIn,
        StatusOut,
        status,
        "Paths changed in the live workspace since the current checkpoint (HEAD)."
    ),
    tool!(
        "diff",
        "Compare checkpoints",
        READ,
        Profile::Recovery,
        DiffIn,
        DiffOut,
        diff,
        "Paths changed between two checkpoints (`to` defaults to the live tree), optionally with a unified patch."
    ),
    tool!(
        "replay",
        "Replay to a later checkpoint",
        OVERWRITE,
        Profile::Recovery,
        ReplayIn,
        RewindOut,
        replay,
        "Like rewind, forward again, e.g. to the branch a rewind left."
    ),
    tool!(
        "backtrack_candidates",
        "Where to backtrack to",
        READ,
        Profile::Recovery,
        CandidatesIn,
        CandidatesOut,
        backtrack_candidates,
        "Checkpoints on the current line of work, newest first, each with the notes of attempts abandoned from it, so you do not repeat a dead end."
    ),
    tool!(
        "backtrack_commit",
        "Backtrack with a note",
        OVERWRITE,
        Profile::Recovery,
        CommitIn,
        RewindOut,
        backtrack_commit,
        "Rewind to `id`, leaving `note` (required) on the abandoned attempt: what was tried and why it failed."
    ),
    tool!(
        "verify",
        "Verify the history",
        READ,
        Profile::All,
        VerifyIn,
        VerifyOut,
        verify,
        "Check the tamper-evident hash chain of the history (and with `deep`, every stored file)."
    ),
];

/// A JSON schema as the object MCP wants: no `$schema`/`title` noise, no
/// integer `format`s that clients ignore anyway.
pub fn schema<T: JsonSchema>() -> Map<String, Value> {
    let mut v = schemars::schema_for!(T).to_value();
    strip(&mut v);
    match v {
        Value::Object(m) => m,
        _ => Map::new(),
    }
}

fn strip(v: &mut Value) {
    match v {
        Value::Object(m) => {
            m.remove("$schema");
            m.remove("title");
            // Optional fields are absent, never null: one `type` each, which
            // every client's schema dialect can express.
            if let Some(Value::Array(types)) = m.get("type")
                && types.len() == 2
                && let Some(t) = types.iter().find(|t| t.as_str() != Some("null"))
            {
                let t = t.clone();
                m.insert("type".into(), t);
            }
            // Defaults of absent optional fields say nothing a model needs.
            if m.get("default")
                .is_some_and(|d| d.is_null() || d == &Value::Bool(false))
            {
                m.remove("default");
            }
            if m.get("format").is_some_and(Value::is_string)
                && m.get("type")
                    .is_some_and(|t| t.to_string().contains("integer"))
            {
                m.remove("format");
                m.remove("minimum");
            }
            for (k, child) in m.iter_mut() {
                // Property maps hold names, not keywords: recurse into values only.
                if k == "properties" || k == "$defs" {
                    if let Value::Object(props) = child {
                        props.values_mut().for_each(strip);
                    }
                } else {
                    strip(child);
                }
            }
        }
        Value::Array(a) => a.iter_mut().for_each(strip),
        _ => {}
    }
}

fn parse_args<T: serde::de::DeserializeOwned>(tool: &str, args: Value) -> Result<T> {
    serde_json::from_value(args)
        .map_err(|e| Error::Usage(format!("invalid arguments for `{tool}`: {e}")))
}

// ---- pagination ----

const DEFAULT_LIMIT: usize = 50;
const MAX_LIMIT: usize = 200;

// `limit` + `cursor` paging, shared by every tool that returns a list, so
// that no result comes near a client's token limit. A plain comment: a doc
// comment here became the description of every such tool's input schema,
// words a model pays for and cannot use (helper-53).
#[derive(Debug, Default, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct PageIn {
    /// Items per page (default 50, at most 200)
    #[serde(default)]
    limit: Option<usize>,
    /// `next_cursor` from the previous page
    #[serde(default)]
    cursor: Option<String>,
}

impl PageIn {
    /// The page of `items`, and the cursor of the next one.
    fn page<T>(&self, items: Vec<T>) -> Result<(Vec<T>, Option<String>)> {
        let (range, next) = self.range(items.len())?;
        Ok((
            items
                .into_iter()
                .skip(range.start)
                .take(range.len())
                .collect(),
            next,
        ))
    }

    /// The page of `items`, which are in descending order of `key` (newest
    /// checkpoint first), and the next page's cursor: the key of the last
    /// item shown, so the next page starts below it however many items
    /// were added above meanwhile (an offset would show one twice).
    fn page_below<T>(
        &self,
        items: Vec<T>,
        key: impl Fn(&T) -> i64,
    ) -> Result<(Vec<T>, Option<String>)> {
        let start = match self.cursor.as_deref().and_then(|c| c.strip_prefix('k')) {
            Some(k) => {
                let below: i64 = k.parse().map_err(|_| self.unknown_cursor())?;
                items
                    .iter()
                    .position(|i| key(i) < below)
                    .unwrap_or(items.len())
            }
            None => self.range(items.len())?.0.start,
        };
        let end = (start + self.limit()).min(items.len());
        // No cursor after an empty page: a pager looping on it never ends.
        let next = (end > start && end < items.len()).then(|| format!("k{}", key(&items[end - 1])));
        Ok((
            items.into_iter().skip(start).take(end - start).collect(),
            next,
        ))
    }

    /// Items per page: 0 gives none (a count, with `total`).
    fn limit(&self) -> usize {
        self.limit.unwrap_or(DEFAULT_LIMIT).min(MAX_LIMIT)
    }

    fn unknown_cursor(&self) -> Error {
        Error::Usage(format!(
            "cursor '{}' is not one this server gave out: pass `next_cursor` from the previous page, or omit it to start over",
            self.cursor.as_deref().unwrap_or_default()
        ))
    }

    /// Which of `total` items this page holds, and the next page's cursor.
    fn range(&self, total: usize) -> Result<(std::ops::Range<usize>, Option<String>)> {
        let start = match &self.cursor {
            None => 0,
            Some(c) => c
                .strip_prefix("o")
                .and_then(|n| n.parse::<usize>().ok())
                .filter(|&n| n <= total)
                .ok_or_else(|| self.unknown_cursor())?,
        };
        let end = (start + self.limit()).min(total);
        let next = (end > start && end < total).then(|| format!("o{end}"));
        Ok((start..end, next))
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Change {
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_hex: Option<String>,
    /// added, modified, deleted or type
    status: String,
}

fn changes(c: Vec<ChangeJson>) -> Vec<Change> {
    c.into_iter()
        .map(|c| Change {
            path: c.path,
            path_hex: c.path_hex,
            status: c.status.into(),
        })
        .collect()
}

// A path a rewind left as it is (the tree differs from the target
// there), and why. Not a doc comment: it would go into every schema.
#[derive(Debug, Serialize, JsonSchema)]
pub struct Kept {
    path: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    path_hex: Option<String>,
    reason: String,
}

// ---- checkpoint ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CheckpointIn {
    /// Name to find it by
    #[serde(default)]
    label: Option<String>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckpointOut {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    unchanged: bool,
    // btrfs engine: acknowledged once its snapshot exists; the change
    // counts are known when its manifest is built (see `list`).
    /// Counts follow in `list`
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    manifest_pending: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    added: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    modified: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    deleted: Option<u64>,
    bytes_new: u64,
    duration_ms: u64,
    // The history lost what its kept anchor recorded (D313, D354); named
    // as the rewind tools' field, and undescribed: the lean profile's
    // tools/list budget (D170).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

fn checkpoint(ctx: &Ctx, input: CheckpointIn) -> Result<CheckpointOut> {
    let mut ws = ctx.workspace_or_init()?;
    let r = ws.checkpoint(input.label.as_deref(), "manual", false)?;
    // As the CLI does (a broken rewind.toml turns the size budget off):
    // the client's log shows the server's stderr. Not in the result, which
    // the lean profile's token budget has no room for (D170).
    for w in &r.warnings {
        rewind_platform::stderr_line!("rewind: warning: {w}");
    }
    Ok(CheckpointOut {
        id: r.id,
        label: r.label,
        parent: r.parent,
        unchanged: r.unchanged,
        manifest_pending: r.manifest_pending,
        added: r.changes.map(|c| c.added),
        modified: r.changes.map(|c| c.modified),
        deleted: r.changes.map(|c| c.deleted),
        bytes_new: r.bytes_new,
        duration_ms: r.duration_ms,
        // Unlike the warnings above: the agent must hear of it, or the
        // user it works for never does (helper-92).
        warning: r.history_lost,
    })
}

// ---- rewind, replay, backtrack_commit ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct RewindIn {
    /// Checkpoint id, label or HEAD~N
    id: String,
    /// Why you go back; shown to later attempts
    #[serde(default)]
    report: Option<String>,
    /// Only show the plan
    #[serde(default)]
    dry_run: bool,
    /// plan_fingerprint from dry_run: apply only that plan
    #[serde(default)]
    expect: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ReplayIn {
    /// Checkpoint id or label to move to
    id: String,
    /// Why: stored on the branch being left
    #[serde(default)]
    report: Option<String>,
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CommitIn {
    /// Checkpoint to go back to (from backtrack_candidates)
    id: String,
    /// What was tried since then and why it failed (required)
    #[schemars(length(min = 1))]
    note: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct RewindOut {
    rewound_to: String,
    /// Rewind here to undo
    #[serde(skip_serializing_if = "Option::is_none")]
    safety_checkpoint: Option<String>,
    written: u64,
    deleted: u64,
    dry_run: bool,
    plan_fingerprint: String,
    /// dry_run: the first 200 changes
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    plan: Vec<Change>,
    /// Left as they were
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    kept: Vec<Kept>,
    /// Done effects no rewind undoes
    effects_not_undone: Vec<String>,
    duration_ms: u64,
    // What was asked and not done (a report with nothing to leave). No
    // doc comment: it would be the schema's description, and the lean
    // profile has no room for it (D170).
    #[serde(skip_serializing_if = "Option::is_none")]
    warning: Option<String>,
}

impl From<RewindReport> for RewindOut {
    fn from(r: RewindReport) -> RewindOut {
        RewindOut {
            rewound_to: r.rewound_to,
            safety_checkpoint: r.safety_checkpoint,
            written: r.changes.written,
            deleted: r.changes.deleted,
            dry_run: r.dry_run,
            plan_fingerprint: r.plan_fingerprint,
            // Only a dry run's: after the real one, `written` and
            // `deleted` say what it did, and up to 200 paths in every
            // result filled the agent's context for nothing.
            plan: if r.dry_run {
                changes(r.plan.into_iter().take(MAX_LIMIT).collect())
            } else {
                Vec::new()
            },
            kept: r
                .kept
                .into_iter()
                .take(MAX_LIMIT)
                .map(|k| Kept {
                    path: k.path,
                    path_hex: k.path_hex,
                    reason: k.reason,
                })
                .collect(),
            effects_not_undone: r
                .effects_not_undone
                .into_iter()
                .map(|e| {
                    format!("{} {}:{}", e.kind, e.scope, e.key)
                        .trim()
                        .to_string()
                })
                .collect(),
            duration_ms: r.duration_ms,
            warning: r.warning,
        }
    }
}

fn options(report: Option<String>) -> RewindOptions {
    RewindOptions {
        dry_run: false,
        expect: None,
        report: report.filter(|r| !r.trim().is_empty()),
        exact_times: false,
        allow_setuid: false,
        paths: Vec::new(),
    }
}

fn rewind(ctx: &Ctx, input: RewindIn) -> Result<RewindOut> {
    let mut ws = ctx.workspace()?;
    let mut opts = options(input.report);
    opts.dry_run = input.dry_run;
    opts.expect = input.expect;
    Ok(engine::run(&mut ws, Op::Rewind, &input.id, &opts)?.into())
}

fn replay(ctx: &Ctx, input: ReplayIn) -> Result<RewindOut> {
    let mut ws = ctx.workspace()?;
    Ok(engine::run(&mut ws, Op::Replay, &input.id, &options(input.report))?.into())
}

fn backtrack_commit(ctx: &Ctx, input: CommitIn) -> Result<RewindOut> {
    if input.note.trim().is_empty() {
        return Err(Error::Usage(
            "`note` is required: say what was tried since that checkpoint and why it failed".into(),
        ));
    }
    let mut ws = ctx.workspace()?;
    Ok(engine::run(&mut ws, Op::Rewind, &input.id, &options(Some(input.note)))?.into())
}

// ---- guard_effect ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct GuardIn {
    /// Stable name, e.g. "charge-order-1234"
    #[schemars(length(min = 1))]
    key: String,
    /// What will be sent
    #[serde(default)]
    #[schemars(schema_with = "payload_schema")]
    payload: Option<Value>,
    /// Key namespace
    #[serde(default)]
    scope: Option<String>,
    /// payment, email, deploy, ...
    #[serde(default)]
    kind: Option<String>,
}

/// A payload is a JSON object or text; both are compared canonically.
fn payload_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({"anyOf": [{"type": "object"}, {"type": "string"}], "description": "What will be sent"})
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct GuardOut {
    /// admitted or refused
    decision: String,
    code: String,
    reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    seq: Option<u64>,
}

fn guard_effect(ctx: &Ctx, input: GuardIn) -> Result<GuardOut> {
    // The schema says so, and a client need not check it (D186).
    if let Some(p) = input
        .payload
        .as_ref()
        .filter(|p| !p.is_object() && !p.is_string())
    {
        return Err(Error::Usage(format!(
            "payload is what will be sent, as a JSON object or a string; got {p}: wrap it, e.g. {{\"value\": {p}}}"
        )));
    }
    let req = Request {
        scope: input.scope.unwrap_or_else(|| "default".into()),
        key: input.key,
        kind: input.kind.unwrap_or_default(),
        payload: match &input.payload {
            Some(Value::String(s)) => payload_hash(Some(s)),
            other => payload_hash_value(other.as_ref()),
        },
        call: None,
        former_keys: Vec::new(),
    };
    req.check_names().map_err(Error::Usage)?;
    // Fail closed as the CLI does, with the advice a model can follow.
    let d = match ctx.workspace() {
        Ok(mut ws) => crate::cli::guard::decide_in(&mut ws, &req),
        Err(e @ Error::NotAWorkspace { .. }) => crate::effects::Decision::unavailable(
            &req,
            format!("{e} (or call `checkpoint`, which creates the workspace)"),
        ),
        Err(e) => crate::effects::Decision::unavailable(&req, e.to_string()),
    };
    Ok(GuardOut {
        decision: d.decision.into(),
        code: d.code.as_str().into(),
        reason: d.reason,
        seq: d.seq,
    })
}

// ---- list, status, diff ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct ListIn {
    #[serde(flatten)]
    page: PageIn,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CheckpointItem {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    parent: Option<String>,
    /// manual, auto, hook or pre-rewind
    kind: String,
    created_at: String,
    /// Left by a rewind with a report: why this branch was abandoned
    #[serde(skip_serializing_if = "Option::is_none")]
    note: Option<String>,
    /// Released by gc: cannot be rewound to
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pruned: bool,
}

impl From<crate::ledger::Checkpoint> for CheckpointItem {
    fn from(c: crate::ledger::Checkpoint) -> CheckpointItem {
        CheckpointItem {
            id: c.id,
            label: c.label,
            parent: c.parent.map(|p| p.1),
            kind: c.kind,
            created_at: c.created_at,
            note: c.note,
            pruned: c.pruned,
        }
    }
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct ListOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    head: Option<String>,
    total: usize,
    checkpoints: Vec<CheckpointItem>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn list(ctx: &Ctx, input: ListIn) -> Result<ListOut> {
    let out = crate::cli::list::compute(ctx)?;
    let total = out.checkpoints.len() + out.pending.len();
    // Pending ones too (a full disk stopped their manifests, D266): HEAD
    // may be one, and a list without it hid what `checkpoint` had just
    // returned (helper-48, D273).
    let pending = out.pending.into_iter().map(|p| {
        let item = CheckpointItem {
            id: p.id,
            label: p.label,
            parent: p.parent,
            kind: p.kind,
            created_at: p.created_at,
            note: None,
            pruned: false,
        };
        (p.seq, item)
    });
    let mut newest_first: Vec<(i64, CheckpointItem)> = out
        .checkpoints
        .into_iter()
        .map(|c| (c.seq, CheckpointItem::from(c)))
        .chain(pending)
        .collect();
    newest_first.sort_by_key(|(seq, _)| std::cmp::Reverse(*seq));
    let (checkpoints, next_cursor) = input.page.page_below(newest_first, |(seq, _)| *seq)?;
    let checkpoints = checkpoints.into_iter().map(|(_, c)| c).collect();
    Ok(ListOut {
        head: out.head,
        total,
        checkpoints,
        next_cursor,
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct StatusIn {
    /// Only these paths (relative to the workspace)
    #[serde(default)]
    paths: Vec<String>,
    #[serde(flatten)]
    page: PageIn,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct StatusOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    head: Option<String>,
    total: usize,
    changes: Vec<Change>,
    /// Paths asked for that are neither in the tree nor in HEAD (a typo)
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    warnings: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn status(ctx: &Ctx, input: StatusIn) -> Result<StatusOut> {
    let paths: Vec<PathBuf> = input.paths.iter().map(PathBuf::from).collect();
    let out = crate::cli::status::compute(ctx, &paths)?;
    let total = out.changes.len();
    let (changes, next_cursor) = input.page.page(changes(out.changes))?;
    Ok(StatusOut {
        head: out.head,
        total,
        changes,
        // An agent read "no changes" for a mistyped path (helper-76).
        warnings: out.warnings,
        next_cursor,
    })
}

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct DiffIn {
    /// From this checkpoint (default HEAD)
    #[serde(default)]
    from: Option<String>,
    /// To this checkpoint (default: the live tree)
    #[serde(default)]
    to: Option<String>,
    /// Only these paths (relative to the workspace)
    #[serde(default)]
    paths: Vec<String>,
    /// Include a unified diff of the files on this page (text, 1 MiB max per file)
    #[serde(default)]
    patch: bool,
    #[serde(flatten)]
    page: PageIn,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct DiffOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    from: Option<String>,
    to: String,
    total: usize,
    changes: Vec<Change>,
    #[serde(skip_serializing_if = "Option::is_none")]
    patch: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

fn diff(ctx: &Ctx, input: DiffIn) -> Result<DiffOut> {
    let args = crate::cli::diff::Args {
        from: input.from,
        to: input.to,
        patch: input.patch,
        all: true,
        paths: input.paths.iter().map(PathBuf::from).collect(),
    };
    // The patch covers only this page's files, so it is paged too.
    let out =
        crate::cli::diff::compute_patching(ctx, &args, |n| input.page.range(n).map(|(r, _)| r))?;
    let total = out.changes.len();
    let (page, next_cursor) = input.page.page(changes(out.changes))?;
    let patch = out.patch.filter(|_| !page.is_empty());
    Ok(DiffOut {
        from: out.from,
        to: out.to,
        total,
        changes: page,
        patch,
        next_cursor,
    })
}

// ---- backtrack_candidates ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct CandidatesIn {
    #[serde(flatten)]
    page: PageIn,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct FailedAttempt {
    /// The note left when the attempt was abandoned
    note: String,
    /// The abandoned branch's last checkpoint (replay to see it again)
    abandoned_at: String,
    created_at: String,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct Candidate {
    id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    label: Option<String>,
    kind: String,
    created_at: String,
    /// Attempts already made from here and abandoned, oldest first
    failed_attempts: Vec<FailedAttempt>,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct CandidatesOut {
    #[serde(skip_serializing_if = "Option::is_none")]
    head: Option<String>,
    total: usize,
    candidates: Vec<Candidate>,
    #[serde(skip_serializing_if = "Option::is_none")]
    next_cursor: Option<String>,
}

/// Failure memory: each checkpoint on HEAD's line of history, with the
/// notes of abandoned branches that fork from it. A branch's note sits on
/// its last checkpoint (the safety checkpoint of the rewind that left it);
/// its fork point is its nearest ancestor on HEAD's line.
fn backtrack_candidates(ctx: &Ctx, input: CandidatesIn) -> Result<CandidatesOut> {
    use std::collections::HashMap;
    let mut ws = ctx.workspace()?;
    ws.recover_if_needed()?;
    let head = ws.head()?.map(|h| h.id);
    let checkpoints = ws.ledger().checkpoints()?;
    let notes = ws.ledger().notes()?;
    let by_seq: HashMap<i64, &crate::ledger::Checkpoint> =
        checkpoints.iter().map(|c| (c.seq, c)).collect();
    let parent = |c: &crate::ledger::Checkpoint| c.parent.as_ref().and_then(|p| by_seq.get(&p.0));
    let mut line = Vec::new();
    let mut cur = head
        .as_ref()
        .and_then(|h| checkpoints.iter().find(|c| &c.id == h));
    while let Some(c) = cur {
        line.push(c);
        cur = parent(c).copied();
    }
    let on_line: HashMap<i64, usize> = line.iter().enumerate().map(|(i, c)| (c.seq, i)).collect();
    let mut attempts: Vec<Vec<FailedAttempt>> = line.iter().map(|_| Vec::new()).collect();
    for note in &notes {
        let Some(tip) = by_seq.get(&note.checkpoint) else {
            continue;
        };
        let mut fork = Some(*tip);
        while let Some(f) = fork {
            if let Some(&i) = on_line.get(&f.seq) {
                attempts[i].push(FailedAttempt {
                    note: note.text.clone(),
                    abandoned_at: tip.id.clone(),
                    created_at: note.created_at.clone(),
                });
                break;
            }
            fork = parent(f).copied();
        }
    }
    // Pruned checkpoints cannot be gone back to: not candidates.
    let (line, attempts): (Vec<_>, Vec<_>) = line
        .into_iter()
        .zip(attempts)
        .filter(|(c, _)| !c.pruned)
        .unzip();
    let total = line.len();
    let candidates: Vec<(i64, Candidate)> = line
        .into_iter()
        .zip(attempts)
        .map(|(c, failed_attempts)| {
            (
                c.seq,
                Candidate {
                    id: c.id.clone(),
                    label: c.label.clone(),
                    kind: c.kind.clone(),
                    created_at: c.created_at.clone(),
                    failed_attempts,
                },
            )
        })
        .collect();
    // Newest first along HEAD's line: paged below the last one shown, as
    // `list` is, so a checkpoint made between two pages does not show
    // one twice (helper-61).
    let (candidates, next_cursor) = input.page.page_below(candidates, |(seq, _)| *seq)?;
    let candidates = candidates.into_iter().map(|(_, c)| c).collect();
    Ok(CandidatesOut {
        head,
        total,
        candidates,
        next_cursor,
    })
}

// ---- verify ----

#[derive(Debug, Deserialize, JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct VerifyIn {
    /// Also re-hash every stored file (slow on big histories)
    #[serde(default)]
    deep: bool,
}

#[derive(Debug, Serialize, JsonSchema)]
pub struct VerifyOut {
    ok: bool,
    entries: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    head_seq: Option<u64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    head: Option<String>,
    /// First entry that fails, with its code (e.g. HASH_MISMATCH)
    #[serde(skip_serializing_if = "Option::is_none")]
    first_bad: Option<String>,
    /// With deep: damaged objects
    damaged: Vec<String>,
}

fn verify(ctx: &Ctx, input: VerifyIn) -> Result<VerifyOut> {
    let out = crate::cli::verify::check(
        ctx,
        &crate::cli::verify::Args {
            deep: input.deep,
            anchor: None,
        },
    )?;
    let v = out.verdict;
    let damaged = out.deep.map(|d| d.bad).unwrap_or_default();
    Ok(VerifyOut {
        ok: v.ok && damaged.is_empty(),
        entries: v.entries,
        head_seq: v.head.as_ref().map(|h| h.seq),
        head: v.head.map(|h| h.hash),
        first_bad: v.first_bad.map(|b| b.summary()),
        damaged,
    })
}
