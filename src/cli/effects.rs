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
        key: String,
        #[arg(long, value_parser = ["failed", "succeeded"])]
        outcome: String,
        #[arg(long, default_value = "default")]
        scope: String,
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
            let mut resolution = ws
                .ledger_mut()
                .resolve_effect(&scope, &key, &outcome, None, reopen)?;
            let (mut scope, mut key) = (scope, key);
            // `rewind effects` prints SCOPE:KEY: take that form as well.
            if resolution == Resolution::Unknown
                && let Some((s, k)) = key.split_once(':')
            {
                resolution = ws
                    .ledger_mut()
                    .resolve_effect(s, k, &outcome, None, reopen)?;
                if resolution != Resolution::Unknown {
                    (scope, key) = (s.to_string(), k.to_string());
                }
            }
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
