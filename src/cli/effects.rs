use serde::Serialize;

use super::Ctx;
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
        key: String,
        #[arg(long, value_parser = ["failed", "succeeded"])]
        outcome: String,
        #[arg(long, default_value = "default")]
        scope: String,
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
    seq: u64,
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
        }) => {
            let mut found = ws.ledger_mut().resolve_effect(&scope, &key, &outcome)?;
            let (mut scope, mut key) = (scope, key);
            // `rewind effects` prints SCOPE:KEY: take that form as well.
            if found.is_none()
                && let Some((s, k)) = key.split_once(':')
                && let Some(seq) = ws.ledger_mut().resolve_effect(s, k, &outcome)?
            {
                found = Some(seq);
                (scope, key) = (s.to_string(), k.to_string());
            }
            let seq = found.ok_or_else(|| {
                Error::Usage(format!(
                    "no effect {scope}:{key} in the ledger: `rewind effects` lists them as SCOPE:KEY (pass that, or KEY with --scope SCOPE)"
                ))
            })?;
            let out = Resolved {
                scope,
                key,
                outcome,
                seq,
            };
            ctx.emit(&out, || {
                format!(
                    "{}:{} resolved as {} (chain entry {})",
                    out.scope, out.key, out.outcome, out.seq
                )
            })
        }
    }
}
