use serde::Serialize;

use super::Ctx;
use crate::effects::Resolution;
use crate::error::{Error, Result};

#[derive(clap::Args, Debug)]
pub struct Args {
    #[command(subcommand)]
    command: Option<Sub>,
}

#[derive(clap::Subcommand, Debug)]
enum Sub {
    /// Record what happened to an admitted effect (failed: it may be retried)
    Resolve {
        /// The effect's key, as `rewind effects` lists it (SCOPE:KEY, or
        /// KEY with --scope)
        key: String,
        /// failed: it did not happen, and may be retried; succeeded: it
        /// happened, and is refused from now on
        #[arg(long, value_parser = ["failed", "succeeded"])]
        outcome: String,
        /// Scope of the key (default: "default"; without it, KEY may
        /// also be SCOPE:KEY as `rewind effects` prints it)
        #[arg(long)]
        scope: Option<String>,
        /// Record `failed` for an effect that succeeded (it may then run
        /// again): only when it really did not happen
        #[arg(long)]
        reopen: bool,
    },
}

#[derive(Serialize)]
struct Listing {
    effects: Vec<crate::effects::Effect>,
}

#[derive(Serialize)]
struct Resolved {
    scope: String,
    key: String,
    outcome: String,
    /// The chain entry recording it; `None` when it already had that outcome.
    seq: Option<u64>,
}

pub fn run(ctx: &Ctx, args: Args) -> Result<()> {
    let mut ws = ctx.workspace()?;
    match args.command {
        None => {
            let out = Listing {
                effects: ws.ledger().effects()?,
            };
            ctx.emit(&out, || {
                if out.effects.is_empty() {
                    return "no effects recorded".into();
                }
                out.effects
                    .iter()
                    .map(|e| {
                        format!(
                            "{:<10} {}:{}  {}  admitted {} at {}",
                            e.status,
                            e.scope,
                            e.key,
                            e.kind,
                            e.admitted_at,
                            e.head.as_deref().unwrap_or("-")
                        )
                    })
                    .collect::<Vec<_>>()
                    .join("\n")
            })
        }
        Some(Sub::Resolve {
            key,
            outcome,
            scope,
            reopen,
        }) => {
            let (scope, key) = match scope {
                Some(scope) => (scope, key),
                None => which_effect(&ws, key)?,
            };
            let resolution = ws
                .ledger_mut()
                .resolve_effect(&scope, &key, &outcome, None, reopen)?;
            let seq = match resolution {
                Resolution::Recorded(seq) => Some(seq),
                Resolution::Unchanged => None,
                Resolution::Refused(why) => return Err(Error::Usage(why)),
                Resolution::Unknown => {
                    return Err(Error::Usage(format!(
                        "no effect {scope}:{key} in the ledger: `rewind effects` lists them as SCOPE:KEY (pass that, or KEY with --scope SCOPE)"
                    )));
                }
            };
            let out = Resolved {
                scope,
                key,
                outcome,
                seq,
            };
            ctx.emit(&out, || match out.seq {
                Some(seq) => format!(
                    "{}:{} resolved as {} (chain entry {seq})",
                    out.scope, out.key, out.outcome
                ),
                None => format!(
                    "{}:{} was already {}: nothing recorded",
                    out.scope, out.key, out.outcome
                ),
            })
        }
    }
}

/// The (scope, key) a `resolve` without `--scope` names: KEY in the
/// default scope, or SCOPE:KEY as `rewind effects` prints it, split at
/// any `:`. Scopes and keys may hold `:` themselves (a hook's key always
/// does), so `a:x:y` can be two effects; the first split that matched was
/// taken, silently, and a `failed` made the wrong one retryable
/// (helper-33, D233). More than one match is refused, naming each.
fn which_effect(ws: &crate::workspace::Workspace, key: String) -> Result<(String, String)> {
    let default = || ("default".to_string(), key.clone());
    let splits = key
        .match_indices(':')
        .map(|(i, _)| (key[..i].to_string(), key[i + 1..].to_string()));
    let effects = ws.ledger().effects()?;
    let mut found: Vec<(String, String)> = std::iter::once(default())
        .chain(splits)
        .filter(|(s, k)| effects.iter().any(|e| &e.scope == s && &e.key == k))
        .collect();
    match found.len() {
        0 => Ok(default()),
        1 => Ok(found.remove(0)),
        _ => Err(Error::Usage(format!(
            "{} names {} effects: pass KEY with --scope SCOPE for the one you mean ({}); nothing was recorded",
            crate::names::shell_word(&key),
            found.len(),
            found
                .iter()
                .map(|(s, k)| format!(
                    "--scope {} {}",
                    crate::names::shell_word(s),
                    crate::names::shell_word(k)
                ))
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
