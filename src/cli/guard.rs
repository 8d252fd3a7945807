use std::io::Read;
use std::time::Duration;

use super::Ctx;
use crate::effects::{Decision, Request, payload_hash, payload_hash_value};
use crate::error::{Error, Result};
use crate::workspace::Workspace;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// The effect as JSON: {"key","payload","scope","kind"}, or the peer
    /// tool's {"descriptor":{"effectKey","scopeLabel","kind",...}}. Read
    /// from stdin when neither this nor --key is given.
    #[arg(value_name = "JSON")]
    effect: Option<String>,
    /// Effect key (identity within the scope), e.g. "charge-order-1234"
    #[arg(long)]
    key: Option<String>,
    /// Payload; JSON is compared canonically (key order and spaces ignored)
    #[arg(long)]
    payload: Option<String>,
    /// Scope of the key (default: "default")
    #[arg(long)]
    scope: Option<String>,
    /// Kind of effect, for the record (payment, email, deploy, push, ...)
    #[arg(long)]
    kind: Option<String>,
}

/// How long `guard` waits for another writer before refusing.
fn timeout() -> Duration {
    let ms = std::env::var("REWIND_GUARD_TIMEOUT_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(5000);
    Duration::from_millis(ms)
}

/// Exit codes (DESIGN §3): 0 admitted, 2 refused, 1 usage error.
pub fn run(ctx: &Ctx, args: Args) -> i32 {
    let req = match request(args).and_then(|r| r.check_names().map(|()| r).map_err(Error::Usage)) {
        Ok(r) => r,
        Err(e) => {
            super::report_error(ctx, &e);
            return 1;
        }
    };
    let decision = decide(ctx, &req);
    let _ = ctx.emit(&decision, || {
        format!(
            "{} {}: {}",
            decision.decision,
            decision.code.as_str(),
            decision.reason
        )
    });
    if decision.code.admitted() {
        0
    } else {
        rewind_platform::stderr_line!("{}", decision.refusal_line());
        2
    }
}

/// The barrier's decision for the workspace of `ctx`. Anything that keeps
/// us from deciding refuses: fail closed.
pub(crate) fn decide(ctx: &Ctx, req: &Request) -> Decision {
    match ctx.workspace() {
        Ok(mut ws) => decide_in(&mut ws, req),
        Err(e) => Decision::unavailable(req, e.to_string()),
    }
}

/// The barrier's decision in an open workspace, failing closed.
pub(crate) fn decide_in(ws: &mut Workspace, req: &Request) -> Decision {
    // The decision is taken against HEAD's place in history: a btrfs
    // checkpoint still pending has none yet (it may even be folded into
    // its parent), so its manifest is finished first.
    if let Err(e) = crate::snapshot::finish_pending(ws) {
        return Decision::unavailable(req, e.to_string());
    }
    ws.ledger()
        .set_busy_timeout(timeout())
        .and_then(|_| ws.ledger_mut().guard(req))
        .unwrap_or_else(|e| Decision::unavailable(req, e.to_string()))
}

fn request(args: Args) -> Result<Request> {
    let from_flags = args.key.is_some();
    let json_text = match (&args.effect, from_flags) {
        (Some(j), _) => Some(j.clone()),
        (None, true) => None,
        (None, false) => {
            let mut s = String::new();
            std::io::stdin()
                .read_to_string(&mut s)
                .map_err(|e| Error::Usage(format!("cannot read the effect from stdin: {e}")))?;
            Some(s)
        }
    };
    let Some(text) = json_text else {
        return Ok(Request {
            scope: args.scope.unwrap_or_else(|| "default".into()),
            key: args.key.unwrap_or_default(),
            kind: args.kind.unwrap_or_default(),
            payload: payload_hash(args.payload.as_deref()),
            call: None,
            former_keys: Vec::new(),
        });
    };
    // `guard --payload P` alone read an empty stdin and called it bad
    // JSON (helper-74): what is missing is the key.
    if text.trim().is_empty() {
        return Err(Error::Usage(
            "no effect given: name it with --key KEY (and --payload, --scope, --kind), or give its JSON as the argument or on stdin".into(),
        ));
    }
    let v: serde_json::Value = serde_json::from_str(&text).map_err(|e| {
        Error::Usage(format!(
            "the effect is not valid JSON ({e}); expected {{\"key\": ..., \"payload\": ...}}"
        ))
    })?;
    let (obj, key_field, scope_field) = match v.get("descriptor") {
        Some(d) => (d, "effectKey", "scopeLabel"),
        None => (&v, "key", "scope"),
    };
    // Beside a descriptor, our own fields were dropped without a word
    // (helper-31, D214): one shape or the other.
    if v.get("descriptor").is_some()
        && let Some(other) = v
            .as_object()
            .and_then(|m| m.keys().find(|k| *k != "descriptor"))
    {
        return Err(Error::Usage(format!(
            "the effect has both a \"descriptor\" and \"{other}\": give the peer tool's descriptor alone, or {{\"key\", \"payload\", \"scope\", \"kind\"}} without it"
        )));
    }
    // Our own shape is closed: a misspelt "paylod" dropped the payload,
    // and every later payload then matched the first. The peer tool's
    // descriptor may carry fields of its own.
    if v.get("descriptor").is_none()
        && let Some(map) = v.as_object()
        && let Some(unknown) = map
            .keys()
            .find(|k| !["key", "payload", "scope", "kind"].contains(&k.as_str()))
    {
        return Err(Error::Usage(format!(
            "the effect has an unknown field \"{unknown}\": expected \"key\", \"payload\", \"scope\" and \"kind\""
        )));
    }
    for field in [key_field, scope_field, "kind"] {
        if obj.get(field).is_some_and(|x| !x.is_string()) {
            return Err(Error::Usage(format!(
                "the effect's \"{field}\" must be a string, e.g. {{\"{key_field}\": \"charge-order-1234\"}}"
            )));
        }
    }
    let text_of = |name: &str| obj.get(name).and_then(|x| x.as_str()).map(str::to_string);
    // A flag and the JSON naming the same field differently: which one
    // was meant cannot be known, and the JSON's was dropped (D214).
    for (flag, field, given) in [
        ("--key", key_field, &args.key),
        ("--scope", scope_field, &args.scope),
        ("--kind", "kind", &args.kind),
    ] {
        if let (Some(f), Some(j)) = (given, text_of(field))
            && *f != j
        {
            return Err(Error::Usage(format!(
                "{flag} {f:?} and the effect's \"{field}\": {j:?} disagree: give it once"
            )));
        }
    }
    if let (Some(p), Some(j)) = (&args.payload, obj.get("payload"))
        && payload_hash(Some(p)) != payload_hash_value(Some(j))
    {
        return Err(Error::Usage(
            "--payload and the effect's \"payload\" disagree: give it once".into(),
        ));
    }
    let key = args
        .key
        .or_else(|| text_of(key_field))
        .filter(|k| !k.is_empty());
    let key = key.ok_or_else(|| Error::Usage(format!("the effect has no \"{key_field}\": name the effect, e.g. {{\"{key_field}\": \"charge-order-1234\"}}")))?;
    Ok(Request {
        scope: args
            .scope
            .or_else(|| text_of(scope_field))
            .unwrap_or_else(|| "default".into()),
        key,
        kind: args.kind.or_else(|| text_of("kind")).unwrap_or_default(),
        payload: match args.payload {
            Some(p) => payload_hash(Some(&p)),
            None => payload_hash_value(obj.get("payload")),
        },
        call: None,
        former_keys: Vec::new(),
    })
}
