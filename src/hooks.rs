//! Agent hooks (DESIGN §8): which tool calls get an automatic checkpoint,
//! and which are irreversible effects that must pass the barrier. Pure
//! logic over the hook payload and `rewind.toml`; `cli::hook` does the I/O.
//!
//! `rewind.toml` lives at the workspace root:
//!
//! ```toml
//! [hook]
//! checkpoint = ["Bash", "Write", "Edit", "MultiEdit", "NotebookEdit",
//!               "run_shell_command", "write_file", "replace",
//!               "apply_patch", "mcp__*write*", "mcp__*edit*", …]
//!               # the default: `config::DEFAULT_CHECKPOINT_TOOLS`
//!
//! [[effect]]
//! match = "Bash(git push*)"   # Tool(glob over the command) or a glob over the tool name
//! kind = "push"               # recorded with the decision
//!
//! [[effect]]
//! match = "mcp__stripe__*"
//! key = "order_id"            # the effect's identity: this field of tool_input
//! ```

use std::path::{Path, PathBuf};

use rewind_platform::lexical;
use serde::Deserialize;
use serde_json::Value;

use crate::effects::{Request, payload_hash};
use crate::names::shell_word;

mod find;
mod history;
mod rules;
mod shell;
pub use history::HistoryLoss;
use history::{
    expand_path, git_taking_ignored, home, mv_reaching, overwrite_reaching, rm_reaching,
    rsync_deleting, word_as_written,
};
use shell::{
    ASSIGNS, SCOPE_CLOSE, SCOPE_OPEN, TOO_DEEP, canonical_command, command_words, effect_identity,
    is_assignment, is_marker, runnable_commands, runnable_commands_and_assignments, shell_string,
    simple_commands, squeeze_blanks, written_by_redirections,
};

pub use crate::config::{CONFIG_FILE, Config, EffectRule};

impl Config {
    pub fn checkpoints(&self, tool: &str) -> bool {
        self.hook.checkpoint.iter().any(|g| glob(g, tool))
    }

    /// The first effect rule this call matches, as a barrier request.
    pub fn effect(&self, call: &ToolCall) -> Option<(Request, &EffectRule)> {
        self.effects.iter().find_map(|rule| {
            let pattern = Pattern::parse(&rule.pattern).ok()?;
            pattern
                .matches(call)
                .then(|| (call.request(rule, &pattern), rule))
        })
    }
}

/// One hook payload (Claude Code / Codex shape).
#[derive(Debug, Clone, Deserialize)]
pub struct ToolCall {
    pub tool_name: String,
    #[serde(default)]
    pub tool_input: Value,
    #[serde(default, deserialize_with = "lenient_text")]
    pub cwd: Option<String>,
    #[serde(default, deserialize_with = "lenient_text")]
    pub session_id: Option<String>,
    #[serde(default, deserialize_with = "lenient_text")]
    pub tool_use_id: Option<String>,
    #[serde(default)]
    pub tool_response: Option<Value>,
    /// Claude Code's `PostToolUseFailure` names the failure here instead of
    /// sending a `tool_response`.
    #[serde(default)]
    pub error: Option<Value>,
    #[serde(default, deserialize_with = "lenient_text")]
    pub hook_event_name: Option<String>,
    /// Claude Code's permission mode (`default`, `acceptEdits`, `plan`,
    /// `bypassPermissions`, `dontAsk`): whether a person is there to ask.
    #[serde(default, deserialize_with = "lenient_text")]
    pub permission_mode: Option<String>,
}

/// A field the hook only reads along: a number is its text, anything
/// else but a string is absent. Typed strictly, `"session_id": 123`
/// made the whole payload unreadable, and the hook's exit 1 let a
/// repeated push through that `tool_name` and `tool_input` named
/// plainly (helper-31, D211).
fn lenient_text<'de, D: serde::Deserializer<'de>>(
    d: D,
) -> std::result::Result<Option<String>, D::Error> {
    Ok(match <Value as serde::Deserialize>::deserialize(d)? {
        Value::String(s) => Some(s),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    })
}

impl ToolCall {
    /// The argument rules glob over: the shell command, else the file.
    pub fn argument(&self) -> String {
        let field = |k: &str| self.tool_input.get(k).and_then(Value::as_str);
        // Some agents send a command as its argv: each word is quoted as
        // a shell would need it, so that `["bash", "-lc", "git push"]` is
        // the line `bash -lc 'git push'`, whose inner command the rules
        // and D286 see. Joined bare, it read as `bash -lc git push`, and
        // the second push went through (D293).
        let argv = || {
            let words = self.argv()?;
            Some(
                words
                    .iter()
                    .map(|w| shell_word(w))
                    .collect::<Vec<_>>()
                    .join(" "),
            )
        };
        // A shell line's blanks outside quotes are squeezed: `git  push`
        // is the same command, and must be the same effect (D191).
        field("command")
            .map(squeeze_blanks)
            .or_else(argv)
            .or_else(|| {
                ["file_path", "notebook_path", "path"]
                    .into_iter()
                    .find_map(field)
                    .map(str::to_string)
            })
            .map(|s| s.trim().to_string())
            .unwrap_or_default()
    }

    /// The command's words, when the agent sent it as its argv.
    fn argv(&self) -> Option<Vec<&str>> {
        let words = self.tool_input.get("command")?.as_array()?;
        words.iter().map(Value::as_str).collect()
    }

    /// An argv command as builds before D293 read it, its words joined
    /// bare: a rule is tried on it too (a glob written for the bare form
    /// must not stop matching, D129), and an effect recorded under it is
    /// the same effect.
    fn argv_joined_bare(&self) -> Option<String> {
        Some(self.argv()?.join(" ").trim().to_string())
    }

    /// A checkpoint label naming the call, short enough to read in `list`;
    /// a path inside the workspace at `root` is named from its root.
    pub fn label(&self, root: &std::path::Path) -> String {
        // Control and invisible characters (a newline, a terminal escape, a
        // direction override) would reach `list` and the user's terminal.
        let mut arg: String = self
            .argument()
            .chars()
            .map(|c| if crate::names::unseen(c) { ' ' } else { c })
            .collect();
        // Paths inside the project read better relative to it: to its
        // root, as `status` and `list` name them, not to the payload's
        // `cwd`, which may be anywhere (`/tmp` gave `h77/mnt/proj/…`,
        // helper-77).
        let root = root.to_string_lossy();
        if let Some(rel) = arg.strip_prefix(&format!("{}/", root.trim_end_matches('/'))) {
            arg = rel.to_string();
        }
        let tool: String = self
            .tool_name
            .chars()
            .filter(|c| !crate::names::unseen(*c))
            .collect();
        let mut label = if arg.is_empty() {
            format!("before {tool}")
        } else {
            format!("before {tool}: {arg}")
        };
        if label.chars().count() > 72 {
            label = label.chars().take(71).collect::<String>() + "…";
        }
        label
    }

    fn request(&self, rule: &EffectRule, pattern: &Pattern<'_>) -> Request {
        let named = rule
            .key
            .as_deref()
            .and_then(|k| self.tool_input.get(k))
            .map(|v| match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            });
        // A shell command is its own identity and payload: the description
        // the agent attaches changes between identical runs.
        let by_field = named.is_some();
        let line = self.argument();
        let (what, payload) = match named {
            Some(k) => (k, self.tool_input.to_string()),
            // The commands the rule names, not the whole line: what the
            // agent pipes the output through is not the effect (D301).
            None if self.tool_input.get("command").is_some() => {
                let commands = pattern.commands_named(&line);
                let what = if commands.is_empty() {
                    line.clone()
                } else {
                    commands.join("; ")
                };
                (what.clone(), what)
            }
            None => {
                let payload = self.tool_input.to_string();
                let digest = payload_hash(Some(&payload)).to_hex();
                (digest[..16].to_string(), payload)
            }
        };
        // The same shell line is the same effect whichever agent runs it:
        // its key names the first shell tool (D210).
        let tool = if is_shell_tool(&self.tool_name) {
            SHELL_TOOLS[0]
        } else {
            &self.tool_name
        };
        let mut former_keys: Vec<String> = SHELL_TOOLS
            .iter()
            .filter(|t| **t != tool)
            .map(|t| Request::bounded_key(format!("{t}:{what}")))
            .collect();
        // How earlier builds keyed the same command, under any shell tool
        // (or this tool): the whole line before D301, an argv's bare join
        // before D293.
        let tools: &[&str] = if is_shell_tool(&self.tool_name) {
            SHELL_TOOLS
        } else {
            std::slice::from_ref(&tool)
        };
        let mut earlier = |what: &str| {
            former_keys.extend(
                tools
                    .iter()
                    .map(|t| Request::bounded_key(format!("{t}:{what}"))),
            )
        };
        if !by_field && line != what && self.tool_input.get("command").is_some() {
            earlier(&line);
        }
        if !by_field && let Some(bare) = self.argv_joined_bare().filter(|b| *b != what) {
            earlier(&bare);
        }
        Request {
            scope: "hook".into(),
            key: Request::bounded_key(format!("{tool}:{what}")),
            kind: rule.kind.clone().unwrap_or_else(|| "effect".into()),
            payload: payload_hash(Some(&payload)),
            call: self.tool_use_id.clone().filter(|c| !c.is_empty()),
            former_keys,
        }
    }

    /// Whether the tool reported failure (post-tool-use): then the effect
    /// may be retried. Claude Code sends a failed call (a command that
    /// exited non-zero included) as `PostToolUseFailure` with an `error`,
    /// never as `PostToolUse`.
    pub fn failed(&self) -> bool {
        if self.hook_event_name.as_deref() == Some("PostToolUseFailure")
            || self.error.as_ref().is_some_and(|e| !e.is_null())
        {
            return true;
        }
        let Some(r) = &self.tool_response else {
            return false;
        };
        let flag = |k: &str| r.get(k).and_then(Value::as_bool);
        let code = ["exit_code", "exitCode", "returnCode"]
            .iter()
            .find_map(|k| r.get(*k).and_then(Value::as_i64));
        // Gemini CLI's AfterTool carries a failed tool's error beside its
        // output: `{"llmContent": …, "error": {"message": …}}`. Only there:
        // Claude Code passes an MCP tool's structured result as its
        // `tool_response`, where an `error` field may sit beside a success
        // (a receipt that bounced), and a failure read where there was
        // none lets the payment run twice (helper-54).
        let message = |e: &Value| e.as_str().is_some_and(|m| !m.trim().is_empty());
        let error = self.hook_event_name.as_deref() == Some("AfterTool")
            && r.get("llmContent").is_some()
            && r.get("error")
                .is_some_and(|e| message(e) || e.get("message").is_some_and(message));
        error
            || flag("is_error") == Some(true)
            || flag("isError") == Some(true)
            || flag("interrupted") == Some(true)
            // MCP-style tools answer `{"success": false}` when they failed.
            || flag("success") == Some(false)
            || code.is_some_and(|c| c != 0)
    }

    /// Whether this is a shell line that runs `rewind effects resolve`
    /// with any outcome but `succeeded`: reopening a guarded effect is a
    /// person's decision (D279). A refusal names that command for the
    /// user; an agent that ran it itself after a timeout on a charge that
    /// went through would charge twice (helper-54).
    pub fn reopens_an_effect(&self) -> bool {
        self.rewind_runs().iter().any(|(verb, after)| {
            let asks = |x: &str| after.iter().any(|a| a == x);
            let succeeded = after
                .windows(2)
                .any(|p| p[0] == "--outcome" && p[1] == "succeeded")
                || asks("--outcome=succeeded");
            verb == &["effects", "resolve"] && !(succeeded || asks("-h") || asks("--help"))
        })
    }

    /// The `rewind gc` of this shell line that prunes past the retention
    /// policy (`--keep-last`, `--keep-within`, `--force`), as written: an
    /// agent's own `rewind gc --keep-last 2` after a bad turn pruned the
    /// checkpoint from before the damage for good (helper-63, D306). Which
    /// history to give up is a person's decision; `--dry-run` and a plain
    /// `gc` (the configured policy) pass.
    pub fn prunes_past_the_policy(&self) -> Option<String> {
        self.rewind_runs().into_iter().find_map(|(verb, after)| {
            let overrides = after.iter().any(|a| {
                ["--keep-last", "--keep-within", "--force"]
                    .iter()
                    .any(|o| a == o || a.starts_with(&format!("{o}=")))
            });
            let looks = after
                .iter()
                .any(|a| matches!(a.as_str(), "--dry-run" | "-h" | "--help"));
            (verb == ["gc"] && overrides && !looks).then(|| {
                std::iter::once("rewind gc".to_string())
                    .chain(after.iter().map(|a| shell_word(a)))
                    .collect::<Vec<_>>()
                    .join(" ")
            })
        })
    }

    /// Whether this shell line runs `rewind deinit` (but for its help or
    /// `--dry-run`): deleting every checkpoint is the user's decision,
    /// as deleting `.rewind/` is (D300, D323). Also any shell line that
    /// holds the words `rewind`, `deinit` and `--yes` anywhere:
    /// `$(which rewind) deinit --yes`, `R=rewind; $R …`, `xargs`,
    /// `python -c` put the verb where no parse of the line finds it
    /// (helper-72). Without `rewind`, `deinit` and `--yes` are a commit
    /// message's or another tool's (helper-73).
    pub fn runs_deinit(&self) -> bool {
        let parsed = self.rewind_runs().iter().any(|(verb, after)| {
            verb.first().is_some_and(|v| v == "deinit")
                && !after
                    .iter()
                    .any(|a| matches!(a.as_str(), "--dry-run" | "-h" | "--help"))
        });
        parsed
            || (is_shell_tool(&self.tool_name) && {
                let text = self.argument();
                let words: Vec<&str> = text
                    .split(|c: char| !(c.is_ascii_alphanumeric() || c == '-' || c == '_'))
                    .collect();
                ["rewind", "deinit", "--yes"]
                    .iter()
                    .all(|w| words.contains(w))
            })
    }

    /// Each `rewind` command of this shell line: its verb (up to two
    /// words: `effects resolve`) and the words after it. The verb is the
    /// first word that is no global option (`-C DIR`, `--json`, `-q`):
    /// `rewind restore HEAD -- effects resolve` names paths (helper-56).
    fn rewind_runs(&self) -> Vec<(Vec<String>, Vec<String>)> {
        self.shell_commands()
            .iter()
            .filter_map(|w| {
                let (first, rest) = w.split_first()?;
                if first.rsplit('/').next() != Some("rewind") {
                    return None;
                }
                let mut args = rest.iter();
                let mut verb = Vec::new();
                while let Some(a) = args.next() {
                    if a == "-C" {
                        args.next();
                    } else if a.starts_with('-') {
                        if a == "-h" || a == "--help" {
                            return None;
                        }
                    } else {
                        verb.push(a.clone());
                        if verb.len() == 2 || a != "effects" {
                            break;
                        }
                    }
                }
                Some((verb, args.cloned().collect()))
            })
            .collect()
    }

    /// The file a file tool (Write, Edit, NotebookEdit; Gemini CLI's
    /// `write_file`, `replace`) writes, as the payload names it. Not any
    /// tool's `file_path`: an MCP mail tool's attachment in another
    /// workspace had its call judged by that workspace's rules, none, and
    /// a repeated send went through (helper-60).
    pub fn file_written(&self) -> Option<&str> {
        const FILE_TOOLS: &[&str] = &[
            "Write",
            "Edit",
            "MultiEdit",
            "NotebookEdit",
            "write_file",
            "replace",
        ];
        if !FILE_TOOLS.contains(&self.tool_name.as_str()) {
            return None;
        }
        ["file_path", "notebook_path"]
            .into_iter()
            .find_map(|k| self.tool_input.get(k).and_then(Value::as_str))
            .filter(|f| !f.is_empty())
    }

    /// The words of each simple command a shell call runs; none for
    /// other tools. Here-document text is no command (helper-56).
    fn shell_commands(&self) -> Vec<Vec<String>> {
        self.shell_commands_and_writes()
            .into_iter()
            .map(|(words, _)| words)
            .filter(|w| w.first().is_none_or(|f| !is_marker(f)))
            .collect()
    }

    /// [`Self::shell_commands`], each with the files its output
    /// redirections write.
    fn shell_commands_and_writes(&self) -> Vec<(Vec<String>, Vec<String>)> {
        if !is_shell_tool(&self.tool_name) {
            return Vec::new();
        }
        runnable_commands_and_assignments(&self.argument())
            .iter()
            .map(|c| (command_words(c), written_by_redirections(c)))
            .collect()
    }

    /// A command in this shell call that would delete `history` (a
    /// workspace's `.rewind/`), and what to run instead where there is
    /// such a form. `.rewind/` is ignored (D80), and `git clean -x`/`-X`
    /// and `git stash --all` take ignored files: an agent's routine `git
    /// clean -fdx` deleted every checkpoint, the one made for that very
    /// call included (helper-58, D296). An `rm` of the history, of a file
    /// in it, or of the workspace or a directory above it leaves nothing
    /// to rewind to (D300). `cwd`: where the line starts; `cd` and `git
    /// -C` move it. `histories`: the `.rewind/` of each workspace the
    /// call could reach. A dry run, a command whose scope holds no
    /// history, and one that already leaves it out pass.
    ///
    /// `resolve` makes a path the one the filesystem means (symbolic
    /// links followed as far as they exist): from a directory reached
    /// through a link, no path matched the history's, and every check
    /// let its command through (helper-64). Where a `cd` goes somewhere
    /// the line does not say, a command is judged from the workspace's
    /// root and from the last directory known; a form named to run
    /// instead repeats the `cd`s before it.
    pub fn deletes_the_history(
        &self,
        cwd: &Path,
        histories: &[PathBuf],
        resolve: Resolve,
    ) -> Option<HistoryLoss> {
        self.shell_line(cwd, resolve).deletes_the_history(histories)
    }

    /// This call's shell line read once: each simple command with where
    /// it runs, paths resolved with `resolve`. The hook asks it both
    /// which workspaces an `rm` names and what would delete a history.
    pub fn shell_line<'r>(&self, cwd: &Path, resolve: Resolve<'r>) -> ShellLine<'r> {
        ShellLine {
            steps: self.commands_with_dirs(cwd, resolve),
            resolve,
        }
    }

    /// Each simple command of this shell call with where it runs: `cwd`,
    /// moved by each `cd` or `pushd` before it. Somewhere the line does
    /// not say (`cd -`, `cd "$DIR"`, `popd`) is not known.
    fn commands_with_dirs(&self, cwd: &Path, resolve: Resolve) -> Vec<Step> {
        let mut dir = Some(resolve(&lexical(cwd)));
        let mut known = resolve(&lexical(cwd));
        let mut cds = Vec::new();
        let mut out = Vec::new();
        let mut vars = Variables::default();
        // Whether the `cd`s so far are spelled out in the line, not
        // through a variable it set (a form repeating them would run
        // without the assignment, helper-65).
        let mut cds_spelled = true;
        // What a subshell started with, given back where it ends.
        let mut saved = Vec::new();
        for (w, writes) in self.shell_commands_and_writes() {
            match w.first().map(String::as_str) {
                Some(SCOPE_OPEN) => {
                    saved.push((
                        dir.clone(),
                        known.clone(),
                        cds.len(),
                        cds_spelled,
                        vars.clone(),
                    ));
                    continue;
                }
                // One without its start (`case x in a)`) closes nothing.
                Some(SCOPE_CLOSE) => {
                    if let Some(s) = saved.pop() {
                        (dir, known, cds_spelled, vars) = (s.0, s.1, s.3, s.4);
                        cds.truncate(s.2);
                    }
                    continue;
                }
                _ => {}
            }
            if vars.assign(&w) {
                continue;
            }
            let (w, w_spelled) = vars.expand_all(w);
            let (writes, writes_spelled) = vars.expand_all(writes);
            match w.first().map(String::as_str) {
                Some("cd" | "pushd") => {
                    let target = w[1..].iter().find(|a| *a == "-" || !a.starts_with('-'));
                    dir = match target {
                        None => home().map(|h| resolve(&h)),
                        Some(t) => dir
                            .as_deref()
                            .or(Path::new(t).is_absolute().then_some(Path::new("/")))
                            .and_then(|from| expand_path(t, from))
                            .map(|d| resolve(&d)),
                    };
                    cds.push(
                        w.iter()
                            .map(|x| word_as_written(x))
                            .collect::<Vec<_>>()
                            .join(" "),
                    );
                    cds_spelled &= w_spelled;
                }
                Some("popd") => {
                    dir = None;
                    cds.push("popd".into());
                }
                _ => {}
            }
            if let Some(d) = &dir {
                known = d.clone();
            }
            out.push(Step {
                dir: dir.clone(),
                known: known.clone(),
                cds: cds.join(" && "),
                spelled: cds_spelled && w_spelled && writes_spelled,
                words: w,
                writes,
            });
        }
        out
    }
}

/// A shell line read once (see [`ToolCall::shell_line`]).
pub struct ShellLine<'r> {
    steps: Vec<Step>,
    resolve: Resolve<'r>,
}

impl ShellLine<'_> {
    /// See [`ToolCall::deletes_the_history`].
    pub fn deletes_the_history(&self, histories: &[PathBuf]) -> Option<HistoryLoss> {
        for step in &self.steps {
            // A redirection alone (`> .rewind/ledger.db`) is a command
            // without words.
            let first = step.words.first().map_or("", String::as_str);
            let rest = step.words.get(1..).unwrap_or_default();
            if first == TOO_DEEP {
                return histories.first().map(|h| HistoryLoss::Unclear {
                    runs: "this line".into(),
                    history: h.clone(),
                });
            }
            let name = history::program(&step.words);
            for history in histories {
                let candidates = match (&step.dir, name) {
                    // git's exclude then names the history absolutely.
                    (None, "git") => vec![PathBuf::from("/")],
                    _ => step.dirs(history),
                };
                for dir in &candidates {
                    let found = match name {
                        "git" => git_taking_ignored(rest, dir, history, self.resolve),
                        "rm" | "unlink" => rm_reaching(&step.words, dir, history, self.resolve),
                        "btrfs" => history::btrfs_reaching(&step.words, dir, history, self.resolve),
                        "mv" => mv_reaching(&step.words, dir, history, self.resolve),
                        "find" => find::deleting(&step.words, dir, history, self.resolve),
                        "rsync" => rsync_deleting(&step.words, dir, history, self.resolve),
                        _ => None,
                    }
                    .or_else(|| {
                        overwrite_reaching(&step.words, &step.writes, dir, history, self.resolve)
                    });
                    if let Some(loss) = found {
                        return Some(match step.dir {
                            Some(_) if step.spelled => loss.after(&step.cds),
                            _ => loss.unclear(history),
                        });
                    }
                }
            }
        }
        self.rewrites_a_listing_of(histories)
    }

    /// An in-place editor given files the line lists (`grep -rl old . |
    /// xargs sed -i 's/old/new/g'`, `sed -i … $(grep -rl old .)`), where a
    /// listing in the same line takes in a history: the everyday rename
    /// rewrote the ledger's WAL and objects, and the ledger silently lost
    /// its newest checkpoints (helper-67, D312). The listing and the
    /// editor are not matched pipe to pipe: an editor fed by `xargs`, a
    /// command substitution or a loop's variable, and such a listing
    /// anywhere in the line (`done < <(grep -rl …)` comes after).
    fn rewrites_a_listing_of(&self, histories: &[PathBuf]) -> Option<HistoryLoss> {
        // A filter that drops the history's names on the way (`grep -v
        // .rewind`) makes the listing harmless.
        let filtered = self.steps.iter().any(|s| {
            history::program(&s.words) == "grep"
                && s.words.iter().any(|w| w == "-v" || w == "--invert-match")
                && s.words
                    .iter()
                    .skip(1)
                    .any(|w| !w.starts_with('-') && w.contains("rewind"))
        });
        for editor in &self.steps {
            if filtered || !history::rewrites_in_place(&editor.words) {
                continue;
            }
            // Given its files by `xargs` (none of its own, or xargs -I's
            // `{}`), a command substitution, or a loop's variable.
            let files = history::edited_files(&editor.words);
            let fed = files.is_empty()
                || files
                    .iter()
                    .any(|f| f.contains(['$', '`']) || f.contains("{}") || f == "%");
            if !fed {
                continue;
            }
            for lister in &self.steps {
                for history in histories {
                    for dir in &lister.dirs(history) {
                        if let Some(advice) =
                            history::lists_history(&lister.words, dir, history, self.resolve)
                        {
                            return Some(HistoryLoss::Rewritten {
                                runs: history::shown(&lister.words),
                                // The editor and its options: its files
                                // are the listing's.
                                editor: history::shown(
                                    &editor
                                        .words
                                        .iter()
                                        .enumerate()
                                        .take_while(|(i, w)| *i == 0 || w.starts_with('-'))
                                        .map(|(_, w)| w.clone())
                                        .collect::<Vec<_>>(),
                                ),
                                history: history.clone(),
                                instead: advice.to_string(),
                            });
                        }
                    }
                }
            }
        }
        None
    }

    /// A command of this shell call that changes one of `rules` (the
    /// `rewind.toml` of each workspace it could reach), as the refusal
    /// shows it (D317).
    pub fn changes_the_rules(&self, rules: &[PathBuf]) -> Option<String> {
        self.steps.iter().find_map(|step| {
            let dir = step.dir.as_ref()?;
            rules
                .iter()
                .any(|r| rules::changes(&step.words, &step.writes, dir, r, self.resolve))
                .then(|| history::shown_with_writes(&step.words, &step.writes))
        })
    }

    /// The directories this shell call's commands run in, as far as the
    /// line says: where it starts, each `cd`, `env -C` and `git -C`. Where
    /// to look for a workspace it works on: from an agent's shell in
    /// /tmp, `cd ~/proj && git clean -fdx` deleted proj's history, no
    /// workspace being in sight to refuse it for (D316).
    pub fn dirs_worked_in(&self) -> Vec<PathBuf> {
        let mut out: Vec<PathBuf> = self
            .steps
            .iter()
            .filter_map(|step| {
                let dir = step.dir.as_ref()?;
                match history::program(&step.words) {
                    "git" => history::git_at(step.words.get(1..)?, dir, self.resolve)
                        .filter(|at| !at.unknown)
                        .map(|at| at.dir),
                    _ => Some(dir.clone()),
                }
            })
            .collect();
        out.sort();
        out.dedup();
        out
    }

    /// The paths this shell call's `rm` commands and its writes name
    /// (globs left out): where to look for a workspace whose history they
    /// would take with them, as `rm -rf proj` or `cp x
    /// proj/.rewind/ledger.db` run from proj's parent would.
    pub fn removed_paths(&self) -> Vec<PathBuf> {
        const WRITERS: &[&str] = &[
            "rm", "cp", "mv", "install", "ln", "truncate", "shred", "tee", "dd", "sed", "perl",
            // And what lists files for an editor (D312).
            "grep", "egrep", "fgrep", "rgrep", "rg", "find", "ack", "ag",
        ];
        self.steps
            .iter()
            .filter_map(|step| Some((step.dir.as_ref()?, step)))
            .flat_map(|(dir, step)| {
                let writes = WRITERS.contains(&history::program(&step.words));
                let operands = step
                    .words
                    .iter()
                    .skip(1)
                    .filter(|_| writes)
                    .map(|o| o.strip_prefix("of=").unwrap_or(o));
                operands
                    .chain(step.writes.iter().map(String::as_str))
                    .filter(|o| !o.starts_with('-') && !o.contains(['*', '?', '[']))
                    .filter_map(|o| expand_path(o, dir).map(|p| (self.resolve)(&p)))
                    .collect::<Vec<_>>()
            })
            .collect()
    }
}

/// Makes a path the one the filesystem means (see
/// [`ToolCall::deletes_the_history`]).
pub type Resolve<'a> = &'a dyn Fn(&Path) -> PathBuf;

/// One simple command of a shell line and where it runs.
struct Step {
    /// Its directory; `None` where a `cd` went somewhere the line does
    /// not say.
    dir: Option<PathBuf>,
    /// The last directory known before it.
    known: PathBuf,
    /// The `cd`s before it, as a shell line (empty for none).
    cds: String,
    words: Vec<String>,
    /// The files its output redirections write (`> f`, `2>>log`).
    writes: Vec<String>,
    /// Whether it and the `cd`s before it are as the line spells them,
    /// no variable the line set read into them: only then is a form
    /// named that repeats them.
    spelled: bool,
}

impl Step {
    /// Where to judge it against `history`: its directory, or where the
    /// line does not say, the workspace's root and the last directory
    /// known.
    fn dirs(&self, history: &Path) -> Vec<PathBuf> {
        match &self.dir {
            Some(d) => vec![d.clone()],
            None => vec![
                history.parent().unwrap_or(history).to_path_buf(),
                self.known.clone(),
            ],
        }
    }
}

/// The shell variables a line sets for the commands after it (`D=.rewind;
/// rm -rf "$D"` passed, D311), read into their words as text: a value
/// holding another expansion (`D=$(mktemp -d)`) stays one, and
/// [`expand_path`] then knows no place for it. Words have lost their
/// quotes, so `'$D'` reads as `"$D"`: it can only refuse more.
///
/// A `for` loop's variable takes each of its words in turn (`for s in
/// .rewind/*; do rm -rf $s; done` passed, helper-79): a word naming it
/// is read once per value.
#[derive(Default, Clone)]
struct Variables {
    scalars: std::collections::HashMap<String, String>,
    lists: std::collections::HashMap<String, Vec<String>>,
}

/// Values of a `for` loop read, at most: past it, the rest are left out.
const MAX_LOOP_WORDS: usize = 256;

impl Variables {
    /// Record what a command sets (`D=x`, `export D=x`, `local`,
    /// `declare`, `readonly`, `typeset`; `unset D` forgets); whether it
    /// was such a command.
    fn assign(&mut self, words: &[String]) -> bool {
        let Some((first, rest)) = words.split_first() else {
            return false;
        };
        match first.as_str() {
            ASSIGNS | "export" | "local" | "declare" | "typeset" | "readonly" => {
                for w in rest {
                    if let Some((name, value)) = w.split_once('=').filter(|_| is_assignment(w)) {
                        let value = self.expand(value).0;
                        self.lists.remove(name);
                        self.scalars.insert(name.to_string(), value);
                    }
                }
                first == ASSIGNS
            }
            "for" => match rest {
                [name, kw, values @ ..] if kw == "in" => {
                    let values = values
                        .iter()
                        .take(MAX_LOOP_WORDS)
                        .map(|v| self.expand(v).0)
                        .collect();
                    self.scalars.remove(name);
                    self.lists.insert(name.clone(), values);
                    true
                }
                _ => false,
            },
            "unset" => {
                for w in rest {
                    self.scalars.remove(w);
                    self.lists.remove(w);
                }
                false
            }
            _ => false,
        }
    }

    /// Each word with the variables set earlier in the line read in, and
    /// whether none was.
    fn expand_all(&self, words: Vec<String>) -> (Vec<String>, bool) {
        let mut spelled = true;
        let words = words
            .into_iter()
            .flat_map(|w| {
                let (w, same) = self.expand(&w);
                spelled &= same;
                let each = self.each_value(&w);
                spelled &= each.is_none();
                each.unwrap_or_else(|| vec![w])
            })
            .collect();
        (words, spelled)
    }

    /// `word` once per value of the first loop variable it names, if it
    /// names one.
    fn each_value(&self, word: &str) -> Option<Vec<String>> {
        if !word.contains('$') {
            return None;
        }
        self.lists.iter().find_map(|(name, values)| {
            let braced = format!("${{{name}}}");
            let bare = format!("${name}");
            let named = word.contains(&braced)
                || word.match_indices(&bare).any(|(at, _)| {
                    !word[at + bare.len()..]
                        .starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_')
                });
            named.then(|| {
                values
                    .iter()
                    .map(|v| word.replace(&braced, v).replace(&bare, v))
                    .collect()
            })
        })
    }

    /// `word` with `$NAME` and `${NAME}` of the variables set read in, and
    /// whether it is unchanged.
    fn expand(&self, word: &str) -> (String, bool) {
        if self.scalars.is_empty() || !word.contains('$') {
            return (word.to_string(), true);
        }
        let mut out = String::with_capacity(word.len());
        let mut same = true;
        let mut rest = word;
        while let Some(at) = rest.find('$') {
            out.push_str(&rest[..at]);
            let after = &rest[at + 1..];
            let (name, len) = match after.strip_prefix('{') {
                Some(b) => match b.find('}') {
                    Some(end) => (&b[..end], end + 2),
                    None => ("", 0),
                },
                None => {
                    let end = after
                        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                        .unwrap_or(after.len());
                    (&after[..end], end)
                }
            };
            match self.scalars.get(name).filter(|_| len > 0) {
                Some(value) => {
                    out.push_str(value);
                    same = false;
                    rest = &after[len..];
                }
                None => {
                    out.push('$');
                    rest = after;
                }
            }
        }
        out.push_str(rest);
        (out, same)
    }
}

/// `Tool(glob)` or `glob`.
/// Check an effect rule's `match` when the config is read.
pub(crate) fn validate_pattern(s: &str) -> std::result::Result<(), String> {
    Pattern::parse(s).map(|_| ())
}

#[derive(Debug)]
struct Pattern<'a> {
    tool: &'a str,
    argument: Option<&'a str>,
}

impl<'a> Pattern<'a> {
    fn parse(s: &'a str) -> std::result::Result<Pattern<'a>, String> {
        let s = s.trim();
        if s.is_empty() {
            return Err("an [[effect]] has an empty `match`: write e.g. \"Bash(git push*)\" or \"mcp__stripe__*\"".into());
        }
        // Only `*` and `?` are wildcards: a `[main]` or `{a,b}` a user
        // meant as a class or a choice is literal here, and the rule would
        // never fire, letting the effect through unguarded.
        if let Some(c) = s.chars().find(|c| matches!(c, '[' | ']' | '{' | '}')) {
            return Err(format!(
                "the effect pattern '{s}' holds '{c}': only `*` (any run of characters) and `?` (one character) are wildcards, so `[…]` and `{{…}}` would be matched literally and the rule would never fire; write one rule per alternative, e.g. \"Bash(git push*)\""
            ));
        }
        match s.find('(') {
            None => Ok(Pattern {
                tool: s,
                argument: None,
            }),
            Some(i) if s.ends_with(')') => Ok(Pattern {
                tool: &s[..i],
                argument: Some(&s[i + 1..s.len() - 1]),
            }),
            Some(_) => Err(format!(
                "the effect pattern '{s}' opens '(' but does not end with ')': write e.g. \"Bash(git push*)\""
            )),
        }
    }

    /// The argument pattern is tried on the whole argument and on each
    /// simple command of a shell line: `Bash(git push*)` missed
    /// `cd repo && git push`, `GIT_TRACE=1 git push` and `true; git push`,
    /// the forms agents actually run, and the barrier let them through
    /// (D129). Matching more only refuses more.
    fn matches(&self, call: &ToolCall) -> bool {
        let both_shells = is_shell_tool(self.tool) && is_shell_tool(&call.tool_name);
        if !glob(self.tool, &call.tool_name) && !both_shells {
            return false;
        }
        let Some(a) = self.argument else {
            return true;
        };
        let tried = |arg: &str| {
            glob(a, arg)
                || simple_commands(arg)
                    .iter()
                    .any(|c| glob(a, c) || glob(a, &canonical_command(c)))
        };
        tried(&call.argument()) || call.argv_joined_bare().is_some_and(|b| tried(&b))
    }

    /// The simple commands of a shell call's `line` this pattern names, each
    /// canonical: the effect's identity (D301). Keyed by its whole line,
    /// `git push origin main 2>&1 | tail -3` was another effect than the
    /// push before it, and went through (helper-63). Empty when the
    /// pattern names no command, or only the whole line matches.
    fn commands_named(&self, line: &str) -> Vec<String> {
        let Some(a) = self.argument else {
            return Vec::new();
        };
        let mut out: Vec<String> = Vec::new();
        // A here-document's text runs nothing: a script written through
        // `cat <<EOF` that holds the push is not the push (helper-64).
        for c in runnable_commands(line) {
            // `bash -c 'git push'` is named by the push inside it.
            if shell_string(&c).is_some() {
                continue;
            }
            if glob(a, &c) || glob(a, &canonical_command(&c)) {
                let identity = effect_identity(&c);
                if !out.contains(&identity) {
                    out.push(identity);
                }
            }
        }
        out
    }
}

/// Each agent's tool that runs a shell line: Claude Code's (and Codex's)
/// `Bash`, Gemini CLI's `run_shell_command`. A rule naming one names them
/// all: `Bash(git push*)` let a push through from Gemini (helper-28,
/// D195). The effect's key names the first of them whichever agent ran
/// the line (D210): a push from one agent is the same push from another.
const SHELL_TOOLS: &[&str] = &["Bash", "run_shell_command"];

fn is_shell_tool(name: &str) -> bool {
    SHELL_TOOLS.contains(&name)
}

/// `*` matches any run of characters, `?` any one; everything else is
/// literal.
pub fn glob(pattern: &str, text: &str) -> bool {
    history::wildcard(pattern, text, false)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a Bash line run in `cwd` would delete of the workspace `/w`'s
    /// history, paths taken as written.
    fn deletes_in_w(line: &str, cwd: &str) -> Option<HistoryLoss> {
        call("Bash", serde_json::json!({ "command": line })).deletes_the_history(
            Path::new(cwd),
            &[PathBuf::from("/w/.rewind")],
            &|p: &Path| p.to_path_buf(),
        )
    }

    fn call(tool: &str, input: Value) -> ToolCall {
        ToolCall {
            tool_name: tool.into(),
            tool_input: input,
            cwd: None,
            session_id: None,
            tool_use_id: None,
            tool_response: None,
            error: None,
            hook_event_name: None,
            permission_mode: None,
        }
    }

    #[test]
    fn a_pattern_with_brackets_or_braces_is_refused_not_silently_literal() {
        for bad in [
            "Bash(git push[)",
            "Bash(git push origin [main])",
            "Bash(git push {origin,up})",
        ] {
            let e = validate_pattern(bad).expect_err(bad);
            assert!(e.contains("wildcards") && e.contains(bad), "{e}");
        }
        assert!(validate_pattern("Bash(git push*)").is_ok());
    }

    #[test]
    fn glob_matches_stars_and_literals() {
        assert!(glob("git push*", "git push origin main"));
        assert!(glob("mcp__stripe__*", "mcp__stripe__create_charge"));
        assert!(!glob("mcp__stripe__*", "mcp__github__push"));
        assert!(glob("*publish*", "cd pkg && npm publish"));
        assert!(!glob("git push*", "echo git push"));
        assert!(glob("a?c", "abc") && !glob("a?c", "ac"));
        assert!(glob("*", "") && !glob("x", ""));
    }

    #[test]
    fn a_rule_finds_its_command_wherever_a_shell_line_puts_it() {
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        for line in [
            "git push origin main",
            "cd repo && git push origin main",
            "GIT_TRACE=1 git push origin main",
            "true; git push origin main",
            "make test || git push",
            "(cd x; git push)",
            "env -C repo git push",
            "parallel -j2 git push ::: origin upstream",
            "sudo -D repo git push origin",
            "sudo -u me true && env A=1 B=2 git push",
            "echo done\ngit push origin main",
            // D153 (helper-19): wrappers with options, keywords, quoted
            // assignments, `sh -c`.
            "GIT_SSH_COMMAND=\"ssh -i deploy_key\" git push origin main",
            "sudo -u deploy git push origin main",
            "sudo -E -u deploy -- git push",
            "env -u GIT_DIR git push origin main",
            "env -i PATH=/usr/bin git push",
            "timeout 60 git push origin main",
            "timeout -s KILL 5m git push",
            "nice -n 5 git push",
            "/usr/bin/time -p git push",
            "if git diff --quiet; then git push origin main; fi",
            "for r in origin; do git push $r main; done",
            "while true; do git push && break; done",
            "! git push",
            "bash -c 'git push origin main'",
            "sh -ec \"cd repo && git push\"",
            "sudo bash -lc 'GIT_TRACE=1 git push'",
        ] {
            let push = call("Bash", serde_json::json!({ "command": line }));
            assert!(c.effect(&push).is_some(), "{line:?}");
        }
        let argv = call(
            "Bash",
            serde_json::json!({"command": ["git", "push", "origin", "main"]}),
        );
        assert!(c.effect(&argv).is_some());
        for line in [
            "echo 'x && git push'",
            "echo git push",
            "git status",
            "cat \"a; git push\"",
            "grep -r \"git push\" docs",
            "timeout 60 echo git push",
            "sudo -u git push",
        ] {
            let other = call("Bash", serde_json::json!({ "command": line }));
            assert!(c.effect(&other).is_none(), "{line:?}");
        }
    }

    #[test]
    fn rules_match_tool_and_command() {
        let c = Config::parse(
            "[[effect]]\nmatch = \"Bash(git push*)\"\nkind = \"push\"\n[[effect]]\nmatch = \"mcp__stripe__*\"\nkey = \"order\"\n",
        )
        .unwrap();
        let push = call(
            "Bash",
            serde_json::json!({"command": "git push origin main", "description": "x"}),
        );
        let (req, _) = c.effect(&push).unwrap();
        assert_eq!(req.key, "Bash:git push origin main");
        assert_eq!(req.kind, "push");
        assert!(
            c.effect(&call("Bash", serde_json::json!({"command": "npm test"})))
                .is_none()
        );
        let charge = call(
            "mcp__stripe__charge",
            serde_json::json!({"order": 7, "amount": 5}),
        );
        assert_eq!(c.effect(&charge).unwrap().0.key, "mcp__stripe__charge:7");
    }

    /// D191: the shell splits words at any run of blanks, so a push
    /// written with two spaces or a tab is the same command and the same
    /// effect; quoted blanks are not squeezed.
    #[test]
    fn blanks_between_words_do_not_hide_or_split_an_effect() {
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        let key = |line: &str| {
            c.effect(&call("Bash", serde_json::json!({ "command": line })))
                .map(|(r, _)| (r.key, r.payload))
        };
        let plain = key("git push origin main").expect("matched");
        for line in [
            "git  push origin main",
            "git\tpush  origin\t main",
            "  git push origin main ",
        ] {
            assert_eq!(key(line).as_ref(), Some(&plain), "{line:?}");
        }
        assert!(key("cd repo &&  git   push").is_some());
        assert_eq!(
            squeeze_blanks("echo 'a  b'  \"c\t d\"  e\\  f"),
            "echo 'a  b' \"c\t d\" e\\  f"
        );
    }

    #[test]
    fn same_command_different_description_is_the_same_payload() {
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        let a = call(
            "Bash",
            serde_json::json!({"command": "git push", "description": "a"}),
        );
        let b = call(
            "Bash",
            serde_json::json!({"command": "git push", "description": "b"}),
        );
        assert_eq!(
            c.effect(&a).unwrap().0.payload,
            c.effect(&b).unwrap().0.payload
        );
    }

    #[test]
    fn broken_config_is_an_error_that_names_the_fix() {
        assert!(Config::parse("[[effect]]\nmatch = \"Bash(git push*\"\n").is_err());
        assert!(Config::parse("[hook]\ncheckpoint = 3\n").is_err());
        assert!(Config::parse("[unknown]\n").is_err());
        let d = Config::parse("").unwrap();
        assert!(d.checkpoints("Bash") && d.checkpoints("Edit") && !d.checkpoints("Read"));
    }

    /// D195: a rule naming one agent's shell tool guards every agent's.
    #[test]
    fn a_shell_rule_guards_every_agents_shell_tool() {
        let push = serde_json::json!({ "command": "git push origin main" });
        for rule in ["Bash(git push*)", "run_shell_command(git push*)"] {
            let c = Config::parse(&format!("[[effect]]\nmatch = \"{rule}\"\n")).unwrap();
            for tool in ["Bash", "run_shell_command"] {
                let (req, _) = c
                    .effect(&call(tool, push.clone()))
                    .unwrap_or_else(|| panic!("{rule} lets {tool} push"));
                // One effect whichever agent runs it (D210), found also
                // under the other agent's former key.
                assert_eq!(req.key, "Bash:git push origin main");
                assert_eq!(req.former_keys, ["run_shell_command:git push origin main"]);
            }
            assert!(c.effect(&call("write_file", push.clone())).is_none());
        }
        // Only the exact name stands for the shell: a glob stays a glob.
        let c = Config::parse("[[effect]]\nmatch = \"Ba*(git push*)\"\n").unwrap();
        assert!(c.effect(&call("run_shell_command", push)).is_none());
    }

    /// D300: `find` with a deleting action, its expression evaluated on
    /// the history's paths; `rsync --delete` into the workspace.
    #[test]
    fn find_and_rsync_that_would_delete_the_history_are_refused() {
        let at = deletes_in_w;
        for (line, cwd) in [
            ("find . -name '*.db' -delete", "/w"),
            ("find . -type f -size +100k -delete", "/w"),
            ("find . -mindepth 1 -delete", "/w"),
            ("find -type f -delete", "/w"),
            ("find /w -iname 'LEDGER*' -delete", "/tmp"),
            ("find . -path './.rewind/*' -delete", "/w"),
            ("find .. -name '*.db' -exec rm -f {} +", "/w/src"),
            ("find . -type f -newer x -exec rm {} \\;", "/w"),
            ("find . \\( -name '*.db' -o -name '*.log' \\) -delete", "/w"),
            (
                "find . -depth -path ./.rewind -prune -o -name '*.db' -delete",
                "/w",
            ),
            ("find . -maxdepth 2 -name 'ledger.db*' -delete", "/w"),
            ("find . -name '*.db' -delete 2>/dev/null", "/w"),
        ] {
            match at(line, cwd) {
                Some(HistoryLoss::Deletes { instead, .. }) => {
                    assert!(
                        instead.contains("! -path '*/.rewind' ! -path '*/.rewind/*' \\("),
                        "{line}: {instead}"
                    );
                    // The form named passes.
                    assert_eq!(at(&instead, cwd), None, "{instead}");
                }
                other => panic!("{line} in {cwd}: {other:?}"),
            }
        }
        for (line, cwd) in [
            ("find . -name '*.pyc' -delete", "/w"),
            (
                "find . -name node_modules -prune -o -name '*.log' -print",
                "/w",
            ),
            ("find . -type d -name __pycache__ -exec rm -rf {} +", "/w"),
            ("find src -name '*.db' -delete", "/w"),
            ("find . -maxdepth 1 -name '*.db' -delete", "/w"),
            (
                "find . -path ./.rewind -prune -o -name '*.db' -exec rm {} +",
                "/w",
            ),
            ("find . -not -path './.rewind*' -name '*.db' -delete", "/w"),
            ("find . -name '*.db'", "/w"),
            // `-o` binds looser than the implied `-a`: the .db files are
            // only matched, not deleted.
            ("find . -name '*.db' -o -name '*.pyc' -delete", "/w"),
            ("find . -name '*.db' -delete -o -print", "/other"),
            // find refuses `-prune` under `-delete`'s implied `-depth`.
            (
                "find . -path ./.rewind -prune -o -name '*.db' -delete",
                "/w",
            ),
            (
                "find /w -mindepth 1 -maxdepth 1 ! -name .rewind -exec rm -rf {} +",
                "/",
            ),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
        assert!(matches!(
            at("find .rewind -type f -delete", "/w"),
            Some(HistoryLoss::Removed { .. })
        ));
        // An `-exec rm -rf` of the workspace itself.
        assert!(matches!(
            at("find / -maxdepth 1 -name w -exec rm -rf {} +", "/tmp"),
            Some(HistoryLoss::RemovedWithWorkspace { .. })
        ));

        for line in [
            "rsync -a --delete empty/ ./",
            "rsync -a --delete --exclude .git empty/ /w/",
            "rsync -av --delete-after ../template/ .",
            "rsync -a --delete --exclude .rewind --delete-excluded empty/ ./",
        ] {
            match at(line, "/w") {
                Some(HistoryLoss::Deletes { instead, .. }) => {
                    assert!(
                        instead.starts_with("rsync '--filter=P .rewind' "),
                        "{instead}"
                    );
                    assert_eq!(at(&instead, "/w"), None, "{instead}");
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        for line in [
            "rsync -a --delete src/ backup/",
            "rsync -a --delete --exclude=.rewind empty/ ./",
            "rsync -a --delete --filter '- .rewind' empty/ ./",
            "rsync -a --delete -f 'P .rewind' --delete-excluded empty/ ./",
            "rsync -a empty/ ./",
            "rsync -a --delete ./ host:/srv/w/",
        ] {
            assert_eq!(at(line, "/w"), None, "{line}");
        }
    }

    /// helper-64's bypasses of the first D300 and its false refusals.
    #[test]
    fn deletions_of_the_history_written_other_ways_are_refused_and_cleanups_pass() {
        let at = deletes_in_w;
        for (line, cwd) in [
            (
                "cd \"$(git rev-parse --show-toplevel)\" && rm -rf .rewind",
                "/w/src",
            ),
            ("cd \"$SOMEWHERE\" && rm -rf .rewind", "/w"),
            ("rm -rf \"$(pwd)/.rewind\"", "/w"),
            ("rm -rf `pwd`/.rewind", "/w"),
            ("rm -r -- \"$(pwd)\"", "/w"),
            (
                "find . -name '*.db' -exec echo removing {} \\; -delete",
                "/w",
            ),
            ("find . -name '*.db' -exec /usr/bin/env rm {} +", "/w"),
            ("find . -name '*.db' -exec mv {} bk/ \\;", "/w"),
            ("find . -name '*.db' -delete>/dev/null", "/w"),
            ("rm -rf .rewind>/dev/null", "/w"),
            ("rm -rf ./{build,dist,.rewind}", "/w"),
            ("rm -rf .{rewind,cache}", "/w"),
            ("rsync -a --delete empty/ ./ --exclude .git", "/w"),
            ("rsync -a --delete --exclude .rewind/tmp empty/ ./", "/w"),
            ("rsync -a --remove-source-files ./ bk/", "/w"),
            ("git -C \"$PWD\" clean -fdx", "/w"),
            ("git worktree remove --force /w", "/tmp"),
            ("unlink .rewind/ledger.db", "/w"),
            ("echo $(rm -rf .rewind)", "/w"),
        ] {
            assert!(at(line, cwd).is_some(), "{line} in {cwd}");
        }
        for (line, cwd) in [
            ("find . -type d -empty -delete", "/w"),
            ("find . -empty -delete", "/w"),
            ("find . -type f -size 0 -delete", "/w"),
            ("rsync -avn --delete a/ ./", "/w"),
            ("rsync --dry-run --delete a/ ./", "/w"),
            ("cd \"$(mktemp -d)\" && rm -rf ./*", "/w"),
            ("find . -type f -exec sh -c 'echo \"$1\"' _ {} \\;", "/w"),
            ("find . -name '*.pyc' -exec rm -f {} +", "/w"),
            ("rm -rf ./{build,dist}", "/w"),
            ("git worktree remove ../other", "/w"),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
        // A form named after a `cd` repeats it, expansions still expanding.
        let Some(HistoryLoss::Deletes { instead, .. }) =
            at("cd src && find .. -name '*.db' -delete", "/w")
        else {
            panic!("not refused");
        };
        assert!(instead.starts_with("cd src && find .. "), "{instead}");
        let Some(HistoryLoss::Deletes { instead, .. }) =
            at("find \"$PWD\" -name '*.db' -exec rm -f {} +", "/w")
        else {
            panic!("not refused");
        };
        assert!(
            instead.starts_with("find \"$PWD\" ") && instead.contains(" '{}' + \\)"),
            "{instead}"
        );
        let Some(HistoryLoss::Deletes { instead, .. }) = at("rsync -a --delete empty/ ./", "/w")
        else {
            panic!("not refused");
        };
        assert!(
            instead.starts_with("rsync '--filter=P .rewind' '--filter=- .rewind' -a"),
            "{instead}"
        );
    }

    /// helper-65's round: false refusals of everyday cleanups, forms that
    /// ran elsewhere, and the bypasses left.
    #[test]
    fn everyday_cleanups_pass_and_the_last_bypasses_are_refused() {
        let history = [PathBuf::from("/w/.rewind")];
        let judge = |call: ToolCall, cwd: &str| {
            call.deletes_the_history(Path::new(cwd), &history, &|p: &Path| p.to_path_buf())
        };
        let at = |line: &str| judge(call("Bash", serde_json::json!({ "command": line })), "/w");
        for line in [
            "npm test # afterwards; git clean -fdx",
            "git clean -fdx -e '.*'",
            "git clean -fdx -e '.rewind/*'",
            "git clean -fdx '*.log'",
            "git clean -fxd :/packages",
            "find . -type f -exec sh -c 'clang-format --dry-run \"$1\"' _ {} \\;",
            "find . -name .rewind -delete",
            "find . -type d -delete",
            "find . -lname '*node_modules*' -delete",
            "rm -f .rewind/lock",
            "rm -rf .rewind/tmp",
            "rm -rf .rewind/tmp/*",
            "rsync -a --delete --exclude='.rewind/**' a/ ./",
            "rsync -a --delete --exclude='.rewind/***' a/ ./",
            "rsync -a --delete --exclude='.*' a/ ./",
            "rsync -a --delete --exclude='.rewind*' a/ ./",
            "echo \"x <<END\"\nls",
            "mv build dist",
        ] {
            assert_eq!(at(line), None, "{line}");
        }
        let codex = call(
            "Bash",
            serde_json::json!({ "command": ["bash", "-lc", "cat > Makefile <<'EOF'\nclean:\n\trm -rf build .rewind\nEOF"] }),
        );
        assert_eq!(judge(codex, "/w"), None);
        for line in [
            "# don't clean the caches here\nrm -rf .rewind",
            "echo \"x <<END\"\nrm -rf .rewind",
            "echo $((1<<2))\nrm -rf .rewind",
            "rm -rf \"$(git rev-parse --show-toplevel)/.rewind\"",
            "rm -rf ~+/.rewind",
            "rsync -a --delete -f '- node_modules' ../template/ ./",
            "mv .rewind .rewind.old && rm -rf .rewind.old",
            "mv -t /tmp .rewind",
            "git -C \"$(git rev-parse --show-toplevel)\" clean -fdx",
            // helper-66
            "cat <<-EOF > notes.txt\n\tx\n\tEOF\ngit clean -fdx",
            "ls  # see <<END\ngit clean -fdx",
            "echo $[1<<2]\nrm -rf .rewind",
            "mv -t/tmp .rewind",
            "mv -vt /tmp .rewind",
            "mv --target /tmp .rewind",
            "rsync -a --delete ../template/ ./ -B 8192",
            "rsync -a --delete --exclude='node_modules/*' ../t/ ./",
            "rsync -a --delete --exclude='*/.rewind' ../t/ ./",
            "rsync -a --delete --include=.rewind --exclude=.rewind ../t/ ./",
            "find . -name '*.db' -exec sh -c '\\rm -f \"$1\"' _ {} \\;",
            "find . -name '*.db' -exec bash --norc -c 'rm -f \"$1\"' _ {} \\;",
            "find . -name '*.db' -exec timeout 5 rm {} +",
            "find . -name '*.db' -exec nice -n 5 rm {} +",
        ] {
            assert!(at(line).is_some(), "{line}");
        }
        for line in [
            "rsync -a --delay-updates ../template/ ./",
            "rsync -a --delete -f'- .rewind' ../t/ ./",
            "rsync -a --delete -f'P .rewind' ../t/ ./",
            "rsync --list-only --delete ../t/ ./",
            "git clean -fdx -e '**/.rewind'",
            "git clean -fdx -- ':(glob)**/*.pyc'",
            "cd .. && mv w w-renamed",
            "mv /w /w-old",
        ] {
            assert_eq!(at(line), None, "{line}");
        }
        // A find's script form keeps its single quotes, so `$1` stays.
        let Some(HistoryLoss::Deletes { instead, .. }) =
            at("find . -name '*.db' -exec sh -c 'rm -f \"$1\"' _ {} \\;")
        else {
            panic!("not refused");
        };
        assert!(instead.contains("'rm -f \"$1\"'"), "{instead}");
        // A brace expansion past its bound is not judged by guess: it is
        // refused as a place the line does not spell out, quickly.
        let many = format!("rm -f {}", "{a,b}".repeat(24));
        assert!(matches!(at(&many), Some(HistoryLoss::Unclear { .. })));
        // Nesting past what is read, and a find too long to evaluate,
        // are refused, not crashed on (helper-66).
        let deep = format!(
            "echo {}rm -rf .rewind{}",
            "$(".repeat(10_000),
            ")".repeat(10_000)
        );
        assert!(matches!(at(&deep), Some(HistoryLoss::Unclear { .. })));
        let parens = format!(
            "find . {} -name x {} -delete",
            "\\( ".repeat(50_000),
            "\\) ".repeat(50_000)
        );
        assert!(at(&parens).is_some());
        let parens = format!(
            "find . {} -name x {} -delete",
            "\\( ".repeat(500),
            "\\) ".repeat(500)
        );
        assert!(at(&parens).is_some());
        let nots = format!("find . {} -name x -delete", "! ".repeat(50_000));
        assert!(at(&nots).is_some());
        // A comment's apostrophe hid a repeated push from the rules.
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        let push = call(
            "Bash",
            serde_json::json!({ "command": "# it's done\ngit push origin release-1" }),
        );
        assert_eq!(
            c.effect(&push).map(|(r, _)| r.key).as_deref(),
            Some("Bash:git push origin release-1")
        );
    }

    /// D301: an effect is the command the rule names, whatever the line
    /// does around it: redirections and pipes do not make another push.
    #[test]
    fn an_effect_is_its_command_not_what_the_line_pipes_it_through() {
        let c = Config::parse(
            "[[effect]]\nmatch = \"Bash(git push*)\"\n[[effect]]\nmatch = \"Bash(npm publish)\"\n",
        )
        .unwrap();
        let key = |line: &str| {
            c.effect(&call("Bash", serde_json::json!({ "command": line })))
                .map(|(r, _)| r.key)
        };
        for line in [
            "git push origin main",
            "git push origin main 2>&1",
            "git push origin main 2>&1 | tail -3",
            "git push origin main >/dev/null 2>/dev/null",
            "git push origin main > push.log",
            "git push origin main &> push.log",
            "cd /w && git push \"origin\" main |& tee log",
            "git add . && git commit -m x && git  push origin main 2>&1 | tail",
            "git push origin main </dev/null",
        ] {
            assert_eq!(
                key(line).as_deref(),
                Some("Bash:git push origin main"),
                "{line}"
            );
        }
        assert_eq!(
            key("npm publish 2>&1 | tail").as_deref(),
            Some("Bash:npm publish")
        );
        assert_eq!(
            key("git push origin dev 2>&1").as_deref(),
            Some("Bash:git push origin dev")
        );
        // Two pushes in one line are one effect naming both.
        assert_eq!(
            key("git push a main && git push b main").as_deref(),
            Some("Bash:git push a main; git push b main")
        );
        // What an earlier build recorded under the whole line is found.
        let (req, _) = c
            .effect(&call(
                "Bash",
                serde_json::json!({ "command": "git push origin main 2>&1 | tail -3" }),
            ))
            .unwrap();
        assert!(
            req.former_keys
                .contains(&"Bash:git push origin main 2>&1 | tail -3".to_string()),
            "{:?}",
            req.former_keys
        );
        // A redirection is no pipe: the command after `>|` or `2>&1` is
        // not a new one.
        assert_eq!(
            simple_commands("git push 2>&1 >| log"),
            ["git push 2>&1 >| log"]
        );
        assert_eq!(
            command_words("git clean -fdx 2>&1 > /dev/null"),
            ["git", "clean", "-fdx"]
        );
        // What a command reads is part of it; a here-document is not.
        let apply = Config::parse("[[effect]]\nmatch = \"Bash(kubectl apply*)\"\n").unwrap();
        let key = |line: &str| {
            apply
                .effect(&call("Bash", serde_json::json!({ "command": line })))
                .map(|(r, _)| r.key)
        };
        assert_eq!(
            key("kubectl apply -f - < staging.yaml 2>&1").as_deref(),
            Some("Bash:kubectl apply -f - '<' staging.yaml")
        );
        assert_ne!(
            key("kubectl apply -f - < prod.yaml"),
            key("kubectl apply -f - < staging.yaml")
        );
        assert_ne!(
            key("cat > deploy.sh <<'EOF'\nkubectl apply -f x\nEOF"),
            key("kubectl apply -f x")
        );
    }

    /// D293: an argv command is read as the shell line it stands for.
    #[test]
    fn an_argv_command_is_guarded_like_its_shell_line() {
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        let argv = |words: &[&str]| call("Bash", serde_json::json!({ "command": words }));
        for words in [
            &["bash", "-lc", "git push origin main"][..],
            &["/bin/sh", "-c", "cd repo && git push"],
            &["env", "GIT_TRACE=1", "git", "push"],
        ] {
            assert!(c.effect(&argv(words)).is_some(), "{words:?}");
        }
        for words in [&["bash", "-lc", "echo git push"][..], &["echo", "git push"]] {
            assert!(c.effect(&argv(words)).is_none(), "{words:?}");
        }
        // Its key is the push it runs (D301); the quoted line and the
        // bare join earlier builds recorded stay the same effect.
        let (req, _) = c
            .effect(&argv(&["bash", "-lc", "git push origin main"]))
            .unwrap();
        assert_eq!(req.key, "Bash:git push origin main");
        for former in [
            "Bash:bash -lc git push origin main",
            "Bash:bash -lc 'git push origin main'",
        ] {
            assert!(req.former_keys.contains(&former.to_string()), "{former}");
        }
        let (plain, _) = c.effect(&argv(&["git", "push", "origin", "main"])).unwrap();
        assert_eq!(plain.key, "Bash:git push origin main");
        assert_eq!(
            plain.former_keys,
            ["run_shell_command:git push origin main"]
        );
        // A glob written for the bare join still fires.
        let bare =
            Config::parse("[[effect]]\nmatch = \"Bash(curl https://x/pay?id=*)\"\n").unwrap();
        assert!(
            bare.effect(&argv(&["curl", "https://x/pay?id=7"]))
                .is_some()
        );
        assert!(
            argv(&["bash", "-lc", "rewind effects resolve k --outcome failed"]).reopens_an_effect()
        );
        assert!(
            argv(&[
                "rewind",
                "effects",
                "resolve",
                "--outcome",
                "failed",
                "--",
                "k"
            ])
            .reopens_an_effect()
        );
        assert!(
            !argv(&[
                "rewind",
                "effects",
                "resolve",
                "--outcome",
                "succeeded",
                "--",
                "k"
            ])
            .reopens_an_effect()
        );
    }

    /// D296: git commands that take ignored files, `.rewind/` among them,
    /// with the form that leaves it out; helper-60's bypasses and false
    /// refusals of the first version.
    #[test]
    fn git_commands_that_delete_ignored_files_are_named_with_a_safe_form() {
        let shell = |line: &str| call("Bash", serde_json::json!({ "command": line }));
        let ws = Path::new("/w");
        let history = [PathBuf::from("/w/.rewind")];
        let at = |line: &str, cwd: &str| {
            shell(line)
                .deletes_the_history(Path::new(cwd), &history, &|p: &Path| p.to_path_buf())
                .map(|loss| match loss {
                    HistoryLoss::IgnoredFiles { instead, .. } => instead,
                    other => panic!("{line}: {other:?}"),
                })
        };
        for (line, cwd, instead) in [
            (
                "git clean -fdx",
                "/w",
                "git clean -fdx -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdX",
                "/w",
                "git clean -fdX -- ':(exclude).rewind'",
            ),
            (
                "cd /w/src && cd .. && git clean -xfd",
                "/w/src",
                "cd /w/src && cd .. && git clean -xfd -- ':(exclude).rewind'",
            ),
            (
                "git -C .. clean -f -x",
                "/w/src",
                "git -C .. clean -f -x -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx -e .venv",
                "/w",
                "git clean -fdx -e .venv -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx -enode_modules",
                "/w",
                "git clean -fdx -enode_modules -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdxn --no-dry-run",
                "/w",
                "git clean -fdxn --no-dry-run -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx -e .rewind/objects",
                "/w",
                "git clean -fdx -e .rewind/objects -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx -- .",
                "/w",
                "git clean -fdx -- . ':(exclude).rewind'",
            ),
            (
                "git clean -fdx .rewind",
                "/w",
                "git clean -fdx -- .rewind ':(exclude).rewind'",
            ),
            (
                "git clean -fdX -e .rewind",
                "/w",
                // Under -X, `-e .rewind` would take it past the exclude
                // (helper-66): the form leaves it out.
                "git clean -fdX -- ':(exclude).rewind'",
            ),
            (
                "git --attr-source HEAD clean -fdx",
                "/w",
                "git --attr-source HEAD clean -fdx -- ':(exclude).rewind'",
            ),
            (
                "git stash -a",
                "/w",
                "git stash push -a -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx 2>&1 | tail",
                "/w",
                "git clean -fdx -- ':(exclude).rewind'",
            ),
            (
                "git clean -fdx >/dev/null 2> err.log",
                "/w",
                "git clean -fdx -- ':(exclude).rewind'",
            ),
            (
                "pushd .. && git clean -fdx",
                "/w/src",
                "pushd .. && git clean -fdx -- ':(exclude).rewind'",
            ),
            (
                "git stash -a",
                "/w/src",
                "git stash push -a -- ':(exclude)../.rewind'",
            ),
            (
                "git stash push --al",
                "/w",
                "git stash push --al -- ':(exclude).rewind'",
            ),
            (
                "git stash save -a wip",
                "/w",
                "git stash push -a -m wip -- ':(exclude).rewind'",
            ),
            (
                "git stash -a -m 'before .rewind cleanup'",
                "/w",
                "git stash push -a -m 'before .rewind cleanup' -- ':(exclude).rewind'",
            ),
            (
                "git stash -a -- '*'",
                "/w",
                "git stash push -a -- '*' ':(exclude).rewind'",
            ),
        ] {
            assert_eq!(at(line, cwd).as_deref(), Some(instead), "{line} in {cwd}");
        }
        for (line, cwd) in [
            ("git clean -fd", "/w"),
            ("git clean -ndx", "/w"),
            ("git clean -fdx --dry", "/w"),
            ("git clean -fdx -e .rewind", "/w"),
            ("git clean -fdx --exclude=.rewind/", "/w"),
            ("git clean -fdx -- ':(exclude).rewind'", "/w"),
            ("git clean -fdX -- ':!.rewind'", "/w"),
            ("git clean -fdx build/", "/w"),
            ("git clean -fdx", "/w/src"),
            ("cd src && git clean -fdx", "/w"),
            ("git clean -fd -- -x", "/w"),
            ("git -C /other clean -fdx", "/w"),
            ("git stash -u", "/w"),
            ("git stash apply", "/w"),
            ("git stash list", "/w"),
            ("git stash push -a -- ':!.rewind'", "/w"),
            ("git stash -a -p", "/w"),
            ("git stash push --all --patch", "/w"),
            ("git stash -a -- ':(exclude)../.rewind'", "/w/src"),
            ("git log --grep 'clean -x'", "/w"),
            ("echo git clean -fdx", "/w"),
            ("cat <<'EOF' > notes\ngit clean -fdx\nEOF", "/w"),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
        // Where a `cd` goes the line does not say, no form is named: one
        // repeating only the `cd` ran elsewhere (helper-65).
        for (line, cwd) in [
            (
                "cd \"$(git rev-parse --show-toplevel)\" && git clean -fdx",
                "/w/src",
            ),
            ("cd \"$DIR\" && git clean -fdx", "/w"),
            ("git -C \"$ROOT\" clean -fdx", "/w"),
        ] {
            let found = shell(line)
                .deletes_the_history(Path::new(cwd), &history, &|p: &Path| p.to_path_buf());
            assert!(
                matches!(found, Some(HistoryLoss::Unclear { .. })),
                "{line}: {found:?}"
            );
        }
        let write = call(
            "Write",
            serde_json::json!({"file_path": "x", "content": "git clean -fdx"}),
        );
        assert!(
            write
                .deletes_the_history(ws, &history, &|p: &Path| p.to_path_buf())
                .is_none()
        );
    }

    /// D311: a variable the line sets is read into the words after it:
    /// `D=.rewind; rm -rf "$D"` passed. A `cd` through one is judged
    /// without a form (the form would run without the assignment); one
    /// set only for a command (`X=v cmd`), or unset, sets nothing.
    #[test]
    fn a_variable_the_line_sets_is_read_into_the_commands_after_it() {
        let at = deletes_in_w;
        for line in [
            "D=.rewind; rm -rf $D",
            "D=.rewind && rm -rf \"$D\"",
            "export D=/w/.rewind; rm -rf \"${D}\"",
            "R=$PWD; rm -rf \"$R\"/.rewind",
            "B=/w; H=$B/.rewind; rm -rf $H",
            "bash -c 'D=.rewind; rm -rf $D'",
        ] {
            assert!(
                matches!(at(line, "/w"), Some(HistoryLoss::Removed { .. })),
                "{line}: {:?}",
                at(line, "/w")
            );
        }
        assert!(matches!(
            at("L=.rewind/ledger.db; : > $L", "/w"),
            Some(HistoryLoss::Overwritten { .. })
        ));
        assert!(matches!(
            at("R=$PWD; rm -rf \"$R\"", "/w"),
            Some(HistoryLoss::RemovedWithWorkspace { .. })
        ));
        for line in [
            "W=/w; cd $W && git clean -fdx",
            "W=/w; cd \"$W\" && find . -delete",
        ] {
            assert!(
                matches!(at(line, "/tmp"), Some(HistoryLoss::Unclear { .. })),
                "{line}: {:?}",
                at(line, "/tmp")
            );
        }
        for line in [
            "D=build; rm -rf $D",
            "D=.rewind; unset D; rm -rf \"$D\"",
            "D=.rewind cmd; rm -rf \"$D\"",
            "D=.rewind; echo $D",
            "D=$(mktemp -d); rm -rf \"$D\"",
            "for f in a b; do rm -f $f; done",
        ] {
            assert_eq!(at(line, "/w"), None, "{line}");
        }
        // An assignment is no command an effect rule could match.
        let c = Config::parse("[[effect]]\nmatch = \"Bash(*)\"\n").unwrap();
        let set = call("Bash", serde_json::json!({ "command": "D=1; git push" }));
        let (req, _) = c.effect(&set).expect("matched");
        assert!(!req.key.contains("D=1"), "{}", req.key);
    }

    /// helper-79: a `for` loop's variable took none of its words, and
    /// `btrfs subvolume delete` of the btrfs engine's snapshots (with
    /// `user_subvol_rm_allowed`) was no deletion: both passed, and the
    /// checkpoints were gone.
    #[test]
    fn a_loops_words_and_btrfs_deleting_a_snapshot_are_judged() {
        let at = deletes_in_w;
        for line in [
            "for s in .rewind/*; do rm -rf $s; done",
            "for s in build .rewind; do rm -rf \"${s}\"; done",
            "for s in .rewind/state/snapshots/*; do btrfs property set -f $s ro false; btrfs subvolume delete $s; done",
            "btrfs subvolume delete .rewind/state/snapshots/abc",
            "btrfs -q su de -c /w/.rewind/state/snapshots/abc",
            "sudo btrfs property set .rewind/snapshots/x ro false",
        ] {
            assert!(
                matches!(at(line, "/w"), Some(HistoryLoss::Removed { .. })),
                "{line}: {:?}",
                at(line, "/w")
            );
        }
        for line in [
            "for s in a b; do rm -rf $s/build; done",
            "for s in .rewind/*; do echo $s; done",
            "btrfs subvolume delete /tmp/snap",
            "btrfs subvolume list .rewind",
            "btrfs property get .rewind/snapshots/x ro",
            "btrfs subvolume snapshot -r . .rewind-copy",
        ] {
            assert_eq!(at(line, "/w"), None, "{line}");
        }
    }

    /// `eval rm -rf .rewind` was a command named `eval`, and `env -S 'rm
    /// -rf .rewind'` one with no command at all: both passed.
    #[test]
    fn eval_and_env_split_string_run_the_commands_they_are_given() {
        let at = deletes_in_w;
        for line in [
            "eval rm -rf .rewind",
            "eval \"rm -rf .rew\"\"ind\"",
            "eval 'cd .rewind && rm -rf *'",
            "env -S 'rm -rf .rewind'",
            "env -S\"rm -rf\" .rewind",
            "env --split-string='sudo rm -rf' /w/.rewind",
            "env -i -S 'rm -rf .rewind'",
        ] {
            assert!(
                matches!(at(line, "/w"), Some(HistoryLoss::Removed { .. })),
                "{line}: {:?}",
                at(line, "/w")
            );
        }
        for line in [
            "eval \"$(ssh-agent -s)\"",
            "eval rm -rf build",
            "env -S 'rm -rf build'",
            "env -S 'echo .rewind'",
        ] {
            assert_eq!(at(line, "/w"), None, "{line}");
        }
        // The effect is the command eval runs.
        let c = Config::parse("[[effect]]\nmatch = \"Bash(git push*)\"\n").unwrap();
        let set = call(
            "Bash",
            serde_json::json!({ "command": "eval git push origin main" }),
        );
        let (req, _) = c.effect(&set).expect("matched");
        assert!(req.key.contains("git push origin main"), "{}", req.key);
    }

    /// D316: a `cd` inside a subshell (`( … )`, `$( … )`, `sh -c`) moves
    /// only the commands inside it, and `env -C DIR`/`sudo -D DIR` only
    /// the command they run. The subshell's `cd` used to move every
    /// command after it, and `(cd src && make); git clean -fdx` passed.
    #[test]
    fn a_cd_in_a_subshell_moves_only_the_commands_inside_it() {
        let at = deletes_in_w;
        for (line, cwd) in [
            ("(cd src && make); rm -rf .rewind", "/w"),
            ("(cd src && make) && git clean -fdx", "/w"),
            ("(cd src; make) ; rm -f .rewind/ledger.db-wal", "/w"),
            ("echo $(cd src && pwd); rm -rf .rewind", "/w"),
            ("echo `cd src`; git clean -fdx", "/w"),
            ("bash -c 'cd src'; git clean -fdx", "/w"),
            ("cd src && (cd .. && ls) && rm -rf ../.rewind", "/w"),
            ("(cd src; (cd ..)); rm -rf .rewind", "/w"),
            ("D=.rewind; (D=src); rm -rf $D", "/w"),
            ("env -C /w git clean -fdx", "/tmp"),
            ("env -C/w git clean -fdx", "/tmp"),
            ("env --chdir=/w git clean -fdx", "/tmp"),
            ("env --chdir /w git clean -fdx", "/tmp"),
            ("sudo -D /w git clean -fdx", "/tmp"),
            ("env -C .. rm -rf .rewind", "/w/src"),
            // helper-71: a `case` pattern's `)` is no subshell's end, and
            // a quoted `)` no substitution's.
            ("(cd .. && case 1 in 1) git clean -fdx;; esac)", "/w/src"),
            ("(cd ..; case 1 in 1) rm -rf .rewind;; esac)", "/w/src"),
            (
                "echo $(cd ..; case a in a) echo;; esac; rm -rf .rewind)",
                "/w/src",
            ),
            (
                "x=$(cd .. && case a in a) :;; esac && git clean -fdx)",
                "/w/src",
            ),
            ("echo $(echo ')') && rm -rf ../.rewind", "/w/src"),
            // A pipeline's pieces and a background list are subshells.
            ("cd src | true; git clean -fdx", "/w"),
            ("ls | cd src; rm -rf .rewind", "/w"),
            ("cd src & git clean -fdx", "/w"),
            ("cd src && make & git clean -fdx", "/w"),
            ("sleep 1 & cd src && rm -rf ../.rewind", "/w"),
        ] {
            assert!(at(line, cwd).is_some(), "{line} in {cwd}");
        }
        for (line, cwd) in [
            // git clean cleans its own directory's subtree.
            ("(cd src && git clean -fdx)", "/w"),
            ("env -C src git clean -fdx", "/w"),
            ("(cd /tmp && rm -rf .rewind)", "/w"),
            ("env -C /tmp rm -rf .rewind; ls", "/w"),
            ("(cd src && make) && git clean -fdx -e .rewind", "/w"),
            // A `case` pattern's `)` closes no subshell.
            ("case $1 in a) cd src;; esac; rm -rf build", "/w"),
            ("(case a in (a) ls;; esac); rm -rf build", "/w"),
            ("echo $(case a in a) echo x;; esac) && rm -rf build", "/w"),
            ("cd src && ls | grep x && rm -rf build", "/w"),
            ("cd src && rm -rf .rewind | tee log", "/w"),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
    }

    /// D317: a command that writes over, makes, removes or moves away a
    /// workspace's `rewind.toml` changes the rules that bind the agent;
    /// reading or copying it does not, nor a glob that happens to take it.
    #[test]
    fn a_write_to_the_rules_is_told_apart_from_reading_them() {
        let changes = |line: &str, cwd: &str| {
            call("Bash", serde_json::json!({ "command": line }))
                .shell_line(Path::new(cwd), &|p: &Path| p.to_path_buf())
                .changes_the_rules(&[PathBuf::from("/w/rewind.toml")])
        };
        for (line, cwd) in [
            ("echo '[retention]' >> rewind.toml", "/w"),
            ("cat > /w/rewind.toml <<'EOF'\n[x]\nEOF", "/tmp"),
            ("rm -f rewind.toml", "/w"),
            ("unlink rewind.toml", "/w"),
            ("mv rewind.toml rewind.toml.off", "/w"),
            ("mv other.toml rewind.toml", "/w"),
            ("sed -i '/git push/d' rewind.toml", "/w"),
            ("perl -pi -e 's/push/pull/' ../rewind.toml", "/w/src"),
            ("cp /tmp/lax.toml rewind.toml", "/w"),
            ("cp /tmp/rewind.toml .", "/w"),
            ("truncate -s0 rewind.toml", "/w"),
            ("tee rewind.toml < new.toml", "/w"),
            ("cd src && rm ../rewind.toml", "/w"),
            ("(cd /w && : > rewind.toml)", "/tmp"),
            // helper-71: braces, a glob aimed at it, git.
            ("mv rewind.toml{,.bak}", "/w"),
            ("sed -i 's/git push/git pull/' rew*.toml", "/w"),
            ("rm -f *.toml", "/w"),
            ("git rm -q rewind.toml", "/w"),
            ("git mv rewind.toml off.toml", "/w"),
        ] {
            assert!(changes(line, cwd).is_some(), "{line} in {cwd}");
        }
        for (line, cwd) in [
            ("cat rewind.toml", "/w"),
            ("grep push rewind.toml", "/w"),
            ("cp rewind.toml /tmp/rules.bak", "/w"),
            ("git diff rewind.toml", "/w"),
            ("rm -rf *", "/w"),
            ("rm -f *.json", "/w"),
            ("git rm --cached src/a.py", "/w"),
            ("rm src/rewind.toml", "/w"),
            ("echo x > rewind.toml", "/w/src"),
        ] {
            assert_eq!(changes(line, cwd), None, "{line} in {cwd}");
        }
    }

    /// D309: a write over what the history holds loses it as an `rm`
    /// does: a redirection, `truncate`, `shred`, `tee`, `dd of=`, and a
    /// `cp`, `mv`, `install` or `ln` whose destination is the ledger or
    /// lands a file of its name in `.rewind/`. Reading the history,
    /// writing beside it and into what it makes again passes.
    #[test]
    fn a_write_over_the_history_is_refused_and_one_beside_it_passes() {
        let at = deletes_in_w;
        for (line, cwd) in [
            ("truncate -s0 .rewind/ledger.db", "/w"),
            ("truncate --size=0 -- .rewind/ledger.db-wal", "/w"),
            (": > .rewind/ledger.db-wal", "/w"),
            ("> /w/.rewind/ledger.db", "/tmp"),
            ("echo x >>.rewind/objects/ab/cdef", "/w"),
            ("make 2>&1 &>../.rewind/ledger.db", "/w/src"),
            ("cp /tmp/x .rewind/ledger.db", "/w"),
            ("cp backup/ledger.db .rewind/", "/w"),
            ("cp backup/ledger.db .rewind", "/w"),
            ("cp -t .rewind x ledger.db", "/w"),
            ("cp --target-directory=/w/.rewind ledger.db", "/tmp"),
            ("mv new.db .rewind/ledger.db", "/w"),
            ("ln -sf /dev/null .rewind/ledger.db", "/w"),
            ("install -m 644 x .rewind/state/ledger.db", "/w"),
            ("dd if=/dev/zero of=.rewind/ledger.db bs=1 count=1", "/w"),
            ("echo hi | tee -a .rewind/ledger.db", "/w"),
            ("shred -u -n 3 .rewind/ledger.db", "/w"),
            ("cd /w && truncate -s 0 .rewind/ledger.db", "/tmp"),
            ("bash -c 'cat /dev/null > .rewind/ledger.db'", "/w"),
            // helper-67: `-t` in a cluster or abbreviated, a glob target,
            // the editors' own operands.
            ("cp -vt .rewind other/ledger.db", "/w"),
            ("cp -ft.rewind other/ledger.db", "/w"),
            ("mv --target=.rewind other/ledger.db", "/w"),
            ("cp other/ledger.db .rew*", "/w"),
            ("sed -i 's/a/b/' .rewind/ledger.db", "/w"),
            ("perl -pi -e 's/a/b/' .rewind/ledger.db-wal", "/w"),
        ] {
            assert!(
                matches!(at(line, cwd), Some(HistoryLoss::Overwritten { .. })),
                "{line} in {cwd}: {:?}",
                at(line, cwd)
            );
        }
        for (line, cwd) in [
            ("echo x > .rewind/tmp/y", "/w"),
            ("echo x > out.txt 2>&1", "/w"),
            ("make 2>/dev/null >&2", "/w"),
            ("cmd >&- 2>&1", "/w"),
            ("cp a b", "/w"),
            ("cp .rewind/ledger.db /tmp/", "/w"),
            ("cat .rewind/ledger.db > /tmp/copy.db", "/w"),
            ("truncate -s 0 log.txt", "/w"),
            ("truncate -r .rewind/ledger.db copy.db", "/w"),
            ("ls > .rewind/../list.txt", "/w"),
            ("tee < .rewind/ledger.db out", "/w"),
            ("dd if=.rewind/ledger.db of=/tmp/l.db", "/w"),
            ("cp x ledger.db", "/w"),
            ("ln -s .rewind/ledger.db", "/w"),
            ("echo x > .rewind/ledger.db", "/elsewhere"),
            // What the history can do without (helper-67).
            ("echo '/secrets/' >> .rewind/ignore", "/w"),
            ("echo > .rewind/mount.log", "/w"),
            ("cp .rewind/ledger.db .rewind/ledger.db.bak", "/w"),
            ("sed -n 's/a/b/p' .rewind/ledger.db", "/w"),
            ("sed -e 's/i/x/' in > out", "/w"),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
        // Past what can be read: said, not let through.
        assert!(matches!(
            at(
                "truncate -s0 \"$(git rev-parse --show-toplevel)/.rewind/ledger.db\"",
                "/w/src"
            ),
            Some(HistoryLoss::Unclear { .. })
        ));
    }

    /// D312: an in-place editor fed a recursive listing that takes in the
    /// history (`grep -rl old . | xargs sed -i`, the everyday rename)
    /// rewrote its WAL and objects, and the ledger silently lost its
    /// newest checkpoints (helper-67). Refused, saying how to leave the
    /// history out of the listing; a listing that already does, or
    /// cannot reach it, passes.
    #[test]
    fn an_in_place_edit_of_a_listing_that_takes_in_the_history_is_refused() {
        let at = deletes_in_w;
        for (line, advice) in [
            (
                "grep -rl old . | xargs sed -i 's/old/new/g'",
                "--exclude-dir=.rewind",
            ),
            (
                "grep -Rl old | xargs -0 sed -i.bak 's/old/new/'",
                "--exclude-dir=.rewind",
            ),
            ("sed -i 's/a/b/g' $(grep -rl a .)", "--exclude-dir=.rewind"),
            ("sed -Ei 's/a/b/' `grep -lr a /w`", "--exclude-dir=.rewind"),
            (
                "grep -rl old . | xargs perl -pi -e 's/old/new/'",
                "--exclude-dir=.rewind",
            ),
            ("find . -type f | xargs sed -i 's/a/b/'", "! -path"),
            (
                "find . -type f -print0 | xargs -0 sed -i 's/a/b/'",
                "! -path",
            ),
            (
                "rg --hidden -l old | xargs sed -i 's/old/new/'",
                "-g '!.rewind'",
            ),
            (
                "cd /w && grep -rl old . | xargs sed -i 's/o/n/'",
                "--exclude-dir=.rewind",
            ),
            // helper-68: xargs -I, a listing after its editor, a scope only
            // the shell knows, ack.
            (
                "grep -rl x . | xargs -I{} sed -i 's/x/y/g' {}",
                "--exclude-dir=.rewind",
            ),
            // GNU parallel feeds its command as xargs does (D316).
            (
                "grep -rl x . | parallel sed -i 's/x/y/g' {}",
                "--exclude-dir=.rewind",
            ),
            (
                "grep -rl x . | parallel -j4 --halt now,fail=1 sed -i 's/x/y/'",
                "--exclude-dir=.rewind",
            ),
            (
                "grep -rl x . | xargs -I% perl -pi -e 's/x/y/' %",
                "--exclude-dir=.rewind",
            ),
            (
                "while read -r f; do sed -i 's/x/y/' \"$f\"; done < <(grep -rl x .)",
                "--exclude-dir=.rewind",
            ),
            (
                "grep -rl x \"$(git rev-parse --show-toplevel)\" | xargs sed -i 's/x/y/'",
                "--exclude-dir=.rewind",
            ),
            ("ack -l x | xargs sed -i 's/x/y/'", "--ignore-dir=.rewind"),
        ] {
            match at(line, "/w") {
                Some(HistoryLoss::Rewritten { instead, .. }) => {
                    assert!(instead.contains(advice), "{line}: {instead}")
                }
                other => panic!("{line}: {other:?}"),
            }
        }
        assert!(matches!(
            at("find . -type f -exec sed -i 's/a/b/' {} +", "/w"),
            Some(HistoryLoss::Deletes { .. })
        ));
        for line in [
            "grep -rl --exclude-dir=.rewind old . | xargs sed -i 's/o/n/'",
            "grep -rl --exclude-dir='.*' old . | xargs sed -i 's/o/n/'",
            "grep -rl --include='*.py' old . | xargs sed -i 's/o/n/'",
            "grep -rl old src | xargs sed -i 's/o/n/'",
            "grep -l old *.py | xargs sed -i 's/o/n/'",
            "rg -l old | xargs sed -i 's/old/new/'",
            "git grep -l old | xargs sed -i 's/old/new/'",
            "find . -name '*.py' | xargs sed -i 's/a/b/'",
            "find . -type f ! -path '*/.rewind/*' | xargs sed -i 's/a/b/'",
            "find . -name '*.py' -exec sed -i 's/a/b/' {} +",
            "grep -rl old . | xargs wc -l",
            "grep -r old . | head",
            "sed -i 's/a/b/' src/main.py",
            // helper-68's false refusals.
            "grep -rn old . | head; git ls-files '*.py' | xargs sed -i 's/old/new/g'",
            "grep -rn old . | head -20; for f in src/*.py; do sed -i 's/o/n/' \"$f\"; done",
            "grep -rl x . | grep -v .rewind | xargs sed -i 's/x/y/'",
            "grep -rl --exclude-dir={.rewind,node_modules,.git} x . | xargs sed -i 's/x/y/'",
            "find . -type f -not -path '*/\\.*' | xargs sed -i 's/x/y/'",
            "rg -l --no-ignore x | xargs sed -i 's/x/y/'",
            "rg -l --hidden -g '*.py' x | xargs sed -i 's/x/y/'",
            "rg -l --hidden -t py x | xargs sed -i 's/x/y/'",
            "ack -l --ignore-dir=.rewind x | xargs sed -i 's/x/y/'",
        ] {
            assert_eq!(at(line, "/w"), None, "{line}");
        }
        assert_eq!(
            at("grep -rl old . | xargs sed -i 's/o/n/'", "/w/src"),
            None,
            "from src/, the listing holds no history"
        );
    }

    /// D300: an `rm` that deletes the history, a file in it, or the
    /// workspace with it, globs as bash expands them; what leaves the
    /// history alone passes.
    #[test]
    fn rm_of_the_history_or_the_workspace_holding_it_is_refused() {
        let at = deletes_in_w;
        for (line, cwd) in [
            ("rm -rf .rewind", "/w"),
            ("rm -r -f .rewind/", "/w"),
            ("rm --recursive --force ./.rewind", "/w"),
            ("rm -fR ../.rewind", "/w/src"),
            ("rm .rewind/ledger.db", "/w"),
            ("rm -f .rewind/ledger.db-wal", "/w"),
            ("rm -rf .rewind/objects", "/w"),
            ("rm -f .rewind/*", "/w"),
            ("rm -rf .[!.]*", "/w"),
            ("rm -rf .[^.]* *", "/w"),
            ("rm -rf .??*", "/w"),
            ("rm -rf .r*", "/w"),
            ("rm -rf /w/.rewind", "/tmp"),
            ("cd /w && rm -rf .rewind", "/tmp"),
            ("sudo rm -rf .rewind", "/w"),
            ("bash -c 'rm -rf .rewind'", "/w"),
            ("/bin/rm -rf -- .rewind", "/w"),
            ("rm -rf $PWD/.rewind", "/w"),
            ("rm -rf .rewind 2>/dev/null", "/w"),
            ("rm -rf .rewind 2>&1 | tail", "/w"),
            (
                "cd \"$(git rev-parse --show-toplevel)\" && rm -rf /w/.rewind",
                "/w",
            ),
        ] {
            assert!(
                matches!(at(line, cwd), Some(HistoryLoss::Removed { .. })),
                "{line} in {cwd}: {:?}",
                at(line, cwd)
            );
        }
        for (line, cwd, target) in [
            ("rm -rf /w", "/tmp", "/w"),
            ("rm -rf /w/", "/tmp", "/w"),
            ("cd .. && rm -rf w", "/w", "/w"),
            ("rm -rf ../../w", "/w/src", "/w"),
            ("rm -rf \"$PWD\"", "/w", "/w"),
            ("rm -rf ${PWD}", "/w", "/w"),
            ("rm -rf /", "/w", "/"),
            ("rm -rf /*", "/w", "/w"),
            ("rm -rf ../../*", "/w/src", "/w"),
            ("rm -r --one-file-system /w", "/", "/w"),
        ] {
            match at(line, cwd) {
                Some(HistoryLoss::RemovedWithWorkspace { target: t, .. }) => {
                    assert_eq!(t, Path::new(target), "{line} in {cwd}")
                }
                other => panic!("{line} in {cwd}: {other:?}"),
            }
        }
        for (line, cwd) in [
            ("rm -rf *", "/w"),
            ("rm -rf ../*", "/w/src"),
            ("rm -rf build node_modules", "/w"),
            ("rm -rf src/.rewind", "/w"),
            ("rm -f .rewindrc", "/w"),
            ("rm .rewind", "/w"),
            ("rm -rf .", "/w"),
            ("rm -rf ..", "/w/src"),
            ("rm -rf ./", "/w"),
            ("rm -f /w", "/tmp"),
            ("rm -rf $DIR", "/w"),
            ("echo rm -rf .rewind", "/w"),
            ("rm -rf .[!.r]*", "/w"),
            ("rm -rf /other", "/w"),
            ("cd src && rm -rf .rewind", "/w"),
        ] {
            assert_eq!(at(line, cwd), None, "{line} in {cwd}");
        }
        let shown = at("rm -rf /w", "/tmp").map(|l| l.to_string());
        assert!(
            shown
                .as_deref()
                .is_some_and(|s| s
                    .contains("find /w -mindepth 1 -maxdepth 1 ! -name .rewind -exec rm -rf {} +")),
            "{shown:?}"
        );
    }

    /// D308: an MCP server's writing tools are checkpointed by default,
    /// its reading ones not.
    #[test]
    fn mcp_tools_named_for_writing_are_checkpointed_by_default() {
        let c = Config::default();
        for tool in [
            "mcp__filesystem__write_file",
            "mcp__filesystem__edit_file",
            "mcp__filesystem__move_file",
            "mcp__filesystem__create_directory",
            "mcp__serena__replace_symbol_body",
            "mcp__serena__insert_after_symbol",
            "Bash",
        ] {
            assert!(c.checkpoints(tool), "{tool}");
        }
        for tool in [
            "mcp__filesystem__read_file",
            "mcp__filesystem__list_directory",
            "mcp__serena__find_symbol",
            "Read",
            "Grep",
        ] {
            assert!(!c.checkpoints(tool), "{tool}");
        }
    }

    /// D306: pruning past the policy is the user's call.
    #[test]
    fn an_agents_shell_may_not_prune_past_the_policy() {
        let shell = |line: &str| call("Bash", serde_json::json!({ "command": line }));
        for line in [
            "rewind gc --keep-last 2",
            "cd /w && rewind -C . gc --force",
            "rewind --json gc --keep-within=1h",
            "bash -c 'rewind gc --keep-last 1 --keep-within 0s'",
        ] {
            assert!(shell(line).prunes_past_the_policy().is_some(), "{line}");
        }
        for line in [
            "rewind gc",
            "rewind gc --dry-run --keep-last 2",
            "rewind gc --help",
            "rewind list",
            "echo rewind gc --force",
            "rewind restore HEAD -- gc --force",
        ] {
            assert_eq!(shell(line).prunes_past_the_policy(), None, "{line}");
        }
    }

    /// D323: deleting the whole history is the user's call.
    #[test]
    fn an_agents_shell_may_not_delete_the_history() {
        let shell = |line: &str| call("Bash", serde_json::json!({ "command": line }));
        for line in [
            "rewind deinit --yes",
            "cd /w && rewind -C . deinit --yes",
            "yes | rewind --json deinit --yes",
            "sh -c 'rewind deinit --yes'",
            "$(which rewind) deinit --yes",
            "R=rewind; $R deinit --yes",
            "echo deinit --yes | xargs rewind",
            "python3 -c \"import subprocess; subprocess.run(['rewind','deinit','--yes'])\"",
        ] {
            assert!(shell(line).runs_deinit(), "{line}");
        }
        for line in [
            "rewind deinit --dry-run",
            "rewind deinit --help",
            "rewind status",
            "git submodule deinit --force vendor/lib",
            "git commit -m 'deinit: ask before --yes'",
            "./deinit.sh --yes",
            "rewind restore HEAD -- deinit",
        ] {
            assert!(!shell(line).runs_deinit(), "{line}");
        }
    }

    #[test]
    fn an_agents_shell_may_not_reopen_an_effect() {
        let shell = |tool: &str, line: &str| call(tool, serde_json::json!({ "command": line }));
        for line in [
            "rewind effects resolve 'hook:Bash:git push origin main' --outcome failed",
            "cd /w && /usr/local/bin/rewind -C . effects resolve k --outcome failed --reopen",
            "rewind --json effects resolve --scope hook --outcome=failed -- k",
            "sudo -u dev rewind effects resolve k",
            "bash -c 'rewind effects resolve k --outcome failed'",
            "true; rewind effects resolve k --outcome succeeded; rewind effects resolve k --outcome failed",
            // A comment is no outcome; a shell reading a here-document
            // runs it; a line after one still runs.
            "rewind effects resolve k --outcome failed # --outcome succeeded",
            "bash <<'EOF'\nrewind effects resolve k --outcome failed\nEOF",
            "cat <<EOF > notes\nx\nEOF\nrewind -C . effects resolve k",
        ] {
            assert!(shell("Bash", line).reopens_an_effect(), "{line}");
            assert!(
                shell("run_shell_command", line).reopens_an_effect(),
                "{line}"
            );
        }
        for line in [
            "rewind effects",
            "rewind effects resolve k --outcome succeeded",
            "grep -n 'rewind effects resolve' README.md",
            "echo rewind effects resolve k",
            "rewind checkpoint effects-resolve",
            // What helper-56 found refused: text written through a
            // here-document, help, paths, a continued line.
            "cat >> README.md <<'EOF'\nrewind effects resolve --scope=hook --outcome failed -- KEY\nEOF",
            "git commit -F - <<EOF\ndocs: reopening\n\nrewind effects resolve is refused to the agent\nEOF\ngit log -1",
            "rewind effects resolve --help",
            "rewind effects resolve -h",
            "rewind restore HEAD -- effects resolve",
            "rewind effects resolve k --outcome succeeded\\\n -- k",
        ] {
            assert!(!shell("Bash", line).reopens_an_effect(), "{line}");
        }
        let write = call(
            "Write",
            serde_json::json!({"file_path": "x", "content": "rewind effects resolve k"}),
        );
        assert!(!write.reopens_an_effect());
    }

    #[test]
    fn failure_is_read_from_the_tool_response() {
        let mut c = call("Bash", Value::Null);
        assert!(!c.failed());
        c.tool_response = Some(serde_json::json!({"exit_code": 1}));
        assert!(c.failed());
        c.tool_response = Some(serde_json::json!({"stdout": "ok", "interrupted": false}));
        assert!(!c.failed());
        c.tool_response = Some(serde_json::json!({"success": false, "error": "rejected"}));
        assert!(c.failed());
        c.tool_response = Some(serde_json::json!({"success": true}));
        assert!(!c.failed());
        // An MCP tool's structured result passed on by Claude Code's
        // PostToolUse: an `error` beside a success is not a failure.
        let beside = serde_json::json!({"success": true, "payment_intent": "pi_3", "error": {"message": "receipt email bounced"}});
        c.hook_event_name = Some("PostToolUse".into());
        c.tool_response = Some(beside.clone());
        assert!(!c.failed());
        // Gemini CLI's AfterTool: the error beside the output.
        let gemini = serde_json::json!({"llmContent": "Exit Code: 1", "returnDisplay": "rejected", "error": {"message": "exit 1", "type": "shell_execute_error"}});
        c.tool_response = Some(gemini.clone());
        assert!(!c.failed(), "only Gemini CLI's AfterTool says it so");
        c.hook_event_name = Some("AfterTool".into());
        assert!(c.failed());
        c.tool_response = Some(beside);
        assert!(!c.failed(), "no llmContent: not Gemini CLI's shape");
        c.tool_response = Some(serde_json::json!({"llmContent": "ok", "returnDisplay": "ok"}));
        assert!(!c.failed());
        // An `error` that holds no message is no failure: reading one
        // where there was none would let the effect run twice.
        for none in [
            serde_json::json!(null),
            serde_json::json!(false),
            serde_json::json!(""),
            serde_json::json!({}),
            serde_json::json!({"message": " "}),
            serde_json::json!(0),
        ] {
            c.tool_response = Some(serde_json::json!({"llmContent": "ok", "error": none}));
            assert!(!c.failed(), "{none}");
        }
    }
}
