//! Test-only crash points. `REWIND_FAILPOINT=name` (or `name:N` for the
//! N-th hit) makes the process SIGKILL itself at that named point, stop
//! itself (`REWIND_FAILPOINT_ACTION=stop`) so a test can change the tree and
//! then continue it, or pause there (`pause:MS`, a slow disk) so a test can
//! cancel work in flight. Unset, a failpoint costs one relaxed atomic load.
//!
//! The named points, in the order a rewind passes them, are listed in
//! [`POINTS`]; the crash tests iterate over this list. The mount daemon
//! has its own, outside that list: `fuse:remove-marked` (an unlink or
//! rmdir marked dirty, its syscall not yet made) and `fuse:holder-gone`
//! (the connection of a command that froze the mount closed, the mount
//! not yet thawed: tests/fuse.rs). Also outside it, each
//! with its own test: `subvol:ledger-moved` (tests/btrfs.rs) and
//! `ledger:created-empty` (a new ledger's file made, its tables not yet:
//! tests/crash.rs), `mount:connected` (a command connected to its
//! mount daemon, nothing asked of it yet: tests/fuse.rs) and
//! `mount:found-dead` (a command found its daemon dead and has not yet
//! detached the dead mount: tests/fuse.rs), and `capture:stated` (a
//! directory's entries stat'ed, none read yet: tests/history.rs).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicU64, Ordering};

pub const POINTS: &[&str] = &[
    "capture:dir",
    "capture:object-stored",
    "checkpoint:before-sync",
    "checkpoint:before-commit",
    "checkpoint:after-commit",
    "rewind:captured",
    "rewind:after-intent",
    "apply:removed",
    "apply:dir-created",
    "apply:file-written",
    "apply:symlink-written",
    "apply:meta-fixed",
    "rewind:before-commit",
    "rewind:after-commit",
    "guard:before-commit",
    "guard:after-commit",
    "gc:pruned",
    "gc:rows-swept",
    "gc:object-removed",
    "subvol:created",
    "subvol:file-cloned",
    "subvol:copied",
    "subvol:swapped",
];

enum Action {
    Kill,
    Stop,
    Pause(std::time::Duration),
}

struct Config {
    name: String,
    nth: u64,
    action: Action,
}

static CONFIG: OnceLock<Option<Config>> = OnceLock::new();
static HITS: AtomicU64 = AtomicU64::new(0);

fn config() -> &'static Option<Config> {
    CONFIG.get_or_init(|| {
        let spec = std::env::var("REWIND_FAILPOINT").ok()?;
        let (name, nth) = match spec.rsplit_once(':') {
            Some((n, k)) if k.chars().all(|c| c.is_ascii_digit()) && !k.is_empty() => {
                (n.to_string(), k.parse().unwrap_or(1))
            }
            _ => (spec, 1),
        };
        let action = match std::env::var("REWIND_FAILPOINT_ACTION").as_deref() {
            Ok("stop") => Action::Stop,
            Ok(a) if a.starts_with("pause:") => Action::Pause(std::time::Duration::from_millis(
                a["pause:".len()..].parse().unwrap_or(1000),
            )),
            _ => Action::Kill,
        };
        Some(Config { name, nth, action })
    })
}

/// Mark a named point. Crashes (or stops) here if the environment says so.
pub fn hit(name: &str) {
    let Some(cfg) = config() else { return };
    if cfg.name != name {
        return;
    }
    if HITS.fetch_add(1, Ordering::SeqCst) + 1 == cfg.nth {
        match cfg.action {
            Action::Kill => rewind_platform::kill_self(),
            Action::Stop => rewind_platform::stop_self(),
            Action::Pause(d) => std::thread::sleep(d),
        }
    }
}
