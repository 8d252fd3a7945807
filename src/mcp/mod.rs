//! `rewind mcp`: the MCP server on stdio (DESIGN §7).
//!
//! One transport over the same operations as the CLI: each tool call builds
//! a [`Ctx`] and runs the verb's code on a blocking thread. Calls are
//! serialized (one writer at a time is the workspace's rule anyway, and a
//! queue is friendlier than a LOCKED error). Errors a model can act on come
//! back as `isError` results with no `structuredContent`: clients validate
//! structured content against the output schema even on errors.

mod lines;
mod tools;

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use rmcp::model::{
    CallToolRequestParams, CallToolResponse, CallToolResult, ContentBlock, Implementation,
    ListToolsResult, PaginatedRequestParams, ProgressNotificationParam, ServerCapabilities,
    ServerConfig, Tool, ToolAnnotations,
};
use rmcp::service::RequestContext;
use rmcp::{ErrorData, RoleServer, ServerHandler, ServiceExt};

pub use tools::{Profile, TOOLS, ToolDef};

use crate::capture::STATE_DIR;
use crate::cli::Ctx;
use crate::error::{Error, Result};
use crate::progress::Observer;
use crate::warm::WarmSlot;

/// Taught to the model at `initialize`; kept short because it is paid for
/// in every session's context.
pub const INSTRUCTIONS: &str = "rewind makes this workspace reversible, shell commands included. \
Call `checkpoint` before risky work. If it goes wrong, `rewind` to a checkpoint id (nothing is lost); \
say in `report` what failed, so the next attempt avoids it. \
Before an effect no rewind can undo (payment, email, deploy, push), call `guard_effect`; go on \
only if admitted.";

pub struct Server {
    dir: Option<PathBuf>,
    cwd: PathBuf,
    profile: Profile,
    /// One call at a time (see the module docs).
    queue: tokio::sync::Mutex<()>,
    /// The workspace, kept open between calls (D63).
    warm: WarmSlot,
    /// The server's directory was a `--at` view whose daemon died: with
    /// nothing there, a `checkpoint` made an empty workspace in it and
    /// said it had checkpointed (helper-40, D253).
    in_dead_view: AtomicBool,
    /// The workspace the last call found (canonical): a call whose
    /// directory is gone climbs no higher than this (D302).
    root: std::sync::Mutex<Option<PathBuf>>,
}

impl Server {
    pub fn new(dir: Option<PathBuf>, cwd: PathBuf, profile: Profile) -> Server {
        let start = dir.as_ref().map_or_else(|| cwd.clone(), |d| cwd.join(d));
        let root = crate::workspace::Workspace::discover(&start);
        Server {
            dir,
            cwd,
            profile,
            queue: tokio::sync::Mutex::new(()),
            warm: WarmSlot::default(),
            in_dead_view: AtomicBool::new(false),
            root: std::sync::Mutex::new(root),
        }
    }

    /// Where a call starts looking for its workspace: the server's
    /// directory, or, once that is gone (the agent's `rm -rf` of the
    /// subdirectory it started the server in, or a rewind that removed
    /// it), its nearest existing ancestor, still inside the workspace.
    /// Every call failed with "does not exist: name the workspace's
    /// directory (-C DIR)", which a model cannot do, so the damage could
    /// not be rewound over MCP (D174).
    ///
    /// A mount whose daemon died answers ENOTCONN, which is not "gone":
    /// taken for it, the call climbed to the directory above the
    /// workspace, made that a workspace and rewound files outside this
    /// one (helper-39, D251). The dead mount is detached first, as every
    /// command does (D56), and the call walks the same workspace.
    ///
    /// The ancestor is taken only inside the workspace a call found
    /// before: with the workspace's own directory renamed or removed, the
    /// climb reached its parent, made that a workspace, rewound sibling
    /// projects' files and admitted a spent effect again (helper-61,
    /// D302). Then, and when no call found a workspace yet, the call is
    /// refused, naming where the directory went when it was renamed.
    fn start(&self) -> Result<(Option<PathBuf>, PathBuf), Error> {
        let start = match &self.dir {
            Some(d) => self.cwd.join(d),
            None => self.cwd.clone(),
        };
        if let Err(e) = std::fs::metadata(&start)
            && crate::mount::is_dead_mount(&e)
        {
            let _ = crate::mount::detach_dead_above(&start);
            // Detached, it shows no workspace: it was a view of one
            // elsewhere (D207).
            if crate::workspace::Workspace::discover(&start).is_none() {
                self.in_dead_view.store(true, Ordering::Relaxed);
            }
        }
        let mut root = self.root.lock().unwrap_or_else(|p| p.into_inner());
        if start.exists() {
            if let Some(found) = crate::workspace::Workspace::discover(&start) {
                *root = Some(found);
            }
            return Ok((self.dir.clone(), self.cwd.clone()));
        }
        let nearest = crate::cli::nearest_existing(&start);
        let inside = std::fs::canonicalize(&nearest)
            .ok()
            .zip(root.as_ref())
            .is_some_and(|(nearest, root)| {
                nearest.starts_with(root) && root.join(STATE_DIR).is_dir()
            });
        if inside {
            return Ok((None, nearest));
        }
        // The process's own directory follows a rename.
        let moved = std::fs::read_link("/proc/self/cwd")
            .ok()
            .filter(|now| self.dir.is_none() && *now != start && now.exists())
            .map(|now| format!(", now at {}", crate::names::human_os_path(&now)))
            .unwrap_or_default();
        let served = root
            .as_ref()
            .map(|r| {
                format!(
                    " (the workspace it served: {})",
                    crate::names::human_os_path(r)
                )
            })
            .unwrap_or_default();
        Err(Error::InvalidPath {
            path: start,
            reason: format!(
                "is gone: the MCP server's directory was renamed or removed{moved}{served}; the server does not go above it to another directory; restart the MCP server in the workspace's directory"
            ),
        })
    }

    /// The tool definitions this server's profile offers.
    pub fn tools(&self) -> Vec<Tool> {
        TOOLS
            .iter()
            .filter(|t| t.offered_in(self.profile))
            .map(definition)
            .collect()
    }

    fn find(&self, name: &str) -> Option<&'static ToolDef> {
        TOOLS
            .iter()
            .find(|t| t.name == name && t.offered_in(self.profile))
    }
}

fn definition(t: &ToolDef) -> Tool {
    let e = t.effects;
    Tool::new(t.name, t.description, Arc::new((t.input)()))
        .with_title(t.title)
        .with_raw_output_schema(Arc::new((t.output)()))
        .with_annotations(
            ToolAnnotations::new()
                .read_only(e.read_only)
                .destructive(e.destructive)
                .idempotent(e.idempotent)
                .open_world(e.open_world),
        )
}

/// An error result that tells the model what to do next, with tools its
/// profile offers (`lean` has no `list`).
fn error_result(tool: &str, e: &Error, profile: Profile) -> CallToolResult {
    let lists = TOOLS
        .iter()
        .any(|t| t.name == "list" && t.offered_in(profile));
    let hint = match e {
        Error::UnknownId { id } if lists => format!(
            "no checkpoint matches '{}': call `list` (or `backtrack_candidates`) to see the ids and labels",
            crate::names::cut(id, 64)
        ),
        Error::UnknownId { id } => format!(
            "no checkpoint matches '{}': use an id a `checkpoint` call returned, or `HEAD~N` (N checkpoints back from the current one)",
            crate::names::cut(id, 64)
        ),
        Error::BeforeHistory { spec, ancestors } => crate::error::before_history(spec, *ancestors),
        Error::Pruned { id } if lists => format!(
            "checkpoint {id} was pruned by gc: its contents are gone (its history entry stays); call `list` (or `backtrack_candidates`) for the checkpoints you can still rewind to"
        ),
        Error::Pruned { id } => format!(
            "checkpoint {id} was pruned by gc: its contents are gone (its history entry stays); rewind to an id a `checkpoint` call returned since, or `HEAD~N`"
        ),
        Error::NotAWorkspace { .. } => {
            format!("{e} (or call `checkpoint`, which creates the workspace)")
        }
        // The CLI's advice names a command the model cannot run here.
        Error::PlanChanged { expected, actual } => format!(
            "the plan changed since the dry run (expected {expected}, now {actual}): call `{tool}` with `dry_run` again, review the new plan, and pass its `plan_fingerprint` as `expect`"
        ),
        _ => e.to_string(),
    };
    CallToolResult::error(vec![ContentBlock::text(format!(
        "{tool} failed [{}]: {}",
        e.code(),
        crate::names::as_people_know_it(&hint)
    ))])
}

impl ServerHandler for Server {
    fn get_info(&self) -> ServerConfig {
        ServerConfig::new(ServerCapabilities::builder().enable_tools().build())
            .with_server_info(
                Implementation::new("rewind", crate::BUILD)
                    .with_title("rewind: reversible workspaces"),
            )
            .with_instructions(INSTRUCTIONS)
    }

    async fn list_tools(
        &self,
        _request: Option<PaginatedRequestParams>,
        _context: RequestContext<RoleServer>,
    ) -> std::result::Result<ListToolsResult, ErrorData> {
        Ok(ListToolsResult::with_all_items(self.tools()))
    }

    fn get_tool(&self, name: &str) -> Option<Tool> {
        self.find(name).map(definition)
    }

    async fn call_tool(
        &self,
        request: CallToolRequestParams,
        context: RequestContext<RoleServer>,
    ) -> std::result::Result<CallToolResponse, ErrorData> {
        let Some(tool) = self.find(&request.name) else {
            return Err(ErrorData::invalid_params(
                format!(
                    "unknown tool '{}' in the {} profile: call tools/list",
                    request.name,
                    self.profile.name()
                ),
                None,
            ));
        };
        let args = serde_json::Value::Object(request.arguments.unwrap_or_default());
        let cancel = Arc::new(AtomicBool::new(false));
        let observer = progress_observer(&context, tool.name, cancel.clone());
        let (dir, cwd) = match self.start() {
            Ok(found) => found,
            Err(e) => return Ok(error_result(tool.name, &e, self.profile).into()),
        };
        if self.in_dead_view.load(Ordering::Relaxed) {
            let here = dir.as_ref().map_or_else(|| cwd.clone(), |d| cwd.join(d));
            // Mounted again since: the view serves its workspace again.
            if crate::workspace::Workspace::discover(&here).is_some() {
                self.in_dead_view.store(false, Ordering::Relaxed);
            } else {
                let e = Error::InvalidPath {
                    path: here,
                    reason: "was a view of a workspace elsewhere (`rewind mount WORKSPACE --at VIEW`) whose daemon died: nothing of the workspace is here; mount it again, or start the MCP server in the workspace itself".into(),
                };
                return Ok(error_result(tool.name, &e, self.profile).into());
            }
        }
        let ctx = Ctx::for_tool(dir, cwd, Some(observer), Some(self.warm.clone()));

        let _turn = tokio::select! {
            turn = self.queue.lock() => turn,
            _ = context.ct.cancelled() => return Ok(cancelled(tool.name).into()),
        };
        // rmcp may drop this future when the client cancels: the guard
        // then raises the flag the blocking work polls.
        let _stop_on_drop = StopOnDrop(cancel.clone());
        let work = tokio::task::spawn_blocking(move || (tool.call)(&ctx, args));
        tokio::pin!(work);
        let joined = tokio::select! {
            r = &mut work => r,
            _ = context.ct.cancelled() => {
                // Ask the work to stop where that loses nothing, and keep
                // the queue until it has (a rewind past its intent finishes).
                cancel.store(true, Ordering::Relaxed);
                (&mut work).await
            }
        };
        if !matches!(joined, Ok(Ok(_))) {
            // Whatever failed may have been the open workspace itself.
            self.warm.clear();
        }
        if rewind_platform::deferred_signal().is_some() {
            // A Ctrl-C let this call's rewind finish (D353): the server
            // ends by it once the answer is out.
            lines::end_after_answer(serde_json::to_value(&context.id).unwrap_or_default());
        }
        let result = match joined {
            Ok(Ok(value)) => CallToolResult::structured(value),
            Ok(Err(e)) => error_result(tool.name, &e, self.profile),
            Err(join) => CallToolResult::error(vec![ContentBlock::text(format!(
                "{} failed: internal error ({join}); the workspace is unchanged or recovers on the next call",
                tool.name
            ))]),
        };
        Ok(result.into())
    }
}

/// Sets the cancel flag when dropped; harmless after the work finished.
struct StopOnDrop(Arc<AtomicBool>);

impl Drop for StopOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

fn cancelled(tool: &str) -> CallToolResult {
    error_result(tool, &Error::Cancelled, Profile::All)
}

/// The work's link to the client: progress is forwarded, in order, when the
/// client asked for it (a progress token); the cancel flag is always wired.
fn progress_observer(
    context: &RequestContext<RoleServer>,
    tool: &'static str,
    cancel: Arc<AtomicBool>,
) -> Observer {
    let Some(token) = context.meta.get_progress_token() else {
        return Observer {
            on_progress: Arc::new(|_, _, _| {}),
            cancel,
        };
    };
    let peer = context.peer.clone();
    let (tx, mut rx) = tokio::sync::mpsc::unbounded_channel::<(&'static str, u64, Option<u64>)>();
    tokio::spawn(async move {
        let mut last = -1.0f64;
        while let Some((what, n, total)) = rx.recv().await {
            // Progress must increase; phases restart their counts.
            let progress = (n as f64).max(last + 1.0);
            last = progress;
            let p =
                ProgressNotificationParam::new(token.clone(), progress).with_message(match total {
                    Some(t) => format!("{tool}: {what} ({n}/{t})"),
                    None => format!("{tool}: {what} ({n})"),
                });
            if peer.notify_progress(p).await.is_err() {
                break;
            }
        }
    });
    Observer {
        on_progress: Arc::new(move |what, n, total| {
            let _ = tx.send((what, n, total));
        }),
        cancel,
    }
}

/// Serve MCP on stdin/stdout until the client closes stdin.
pub fn serve(dir: Option<PathBuf>, cwd: PathBuf, profile: Profile) -> Result<()> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| Error::Usage(format!("cannot start the MCP server runtime: {e}")))?;
    crate::snapshot::start_writeback_ticker(match &dir {
        Some(d) => cwd.join(d),
        None => cwd.clone(),
    });
    runtime.block_on(async move {
        // rmcp speaks through two in-memory pipes; `lines::pump` stands
        // between them and stdio.
        let (to_rmcp, rmcp_in) = tokio::io::duplex(1 << 16);
        let (rmcp_out, from_rmcp) = tokio::io::duplex(1 << 16);
        let pump = tokio::spawn(lines::pump(
            tokio::io::stdin(),
            tokio::io::stdout(),
            to_rmcp,
            from_rmcp,
        ));
        let server = Server::new(dir, cwd, profile)
            .serve((rmcp_in, rmcp_out))
            .await
            .map_err(|e| Error::Usage(format!("MCP session failed to start: {e}")))?;
        server
            .waiting()
            .await
            .map_err(|e| Error::Usage(format!("MCP session ended with an error: {e}")))?;
        // rmcp has dropped its end: the pump writes what is left and ends.
        match pump.await {
            Ok(Err(e)) if e.kind() != std::io::ErrorKind::BrokenPipe => Err(Error::Usage(format!(
                "MCP session ended with an error on stdio: {e}"
            ))),
            _ => Ok(()),
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn text(r: &CallToolResult) -> String {
        serde_json::to_string(r).unwrap_or_default()
    }

    /// An unknown id told a `lean` model to call `list`, which `lean`
    /// does not offer (helper-14): the advice names tools it has.
    #[test]
    fn an_unknown_id_is_explained_with_tools_the_profile_offers() {
        let e = Error::UnknownId { id: "nope".into() };
        let lean = text(&error_result("rewind", &e, Profile::Lean));
        assert!(
            !lean.contains("`list`") && lean.contains("HEAD~N"),
            "{lean}"
        );
        let all = text(&error_result("rewind", &e, Profile::All));
        assert!(all.contains("`list`"), "{all}");
    }
}
