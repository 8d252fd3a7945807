use std::path::PathBuf;

use serde::Serialize;

use super::Ctx;
use crate::chain::{Anchor, Verdict};
use crate::error::{Error, Result};
use crate::hash::Hash;

#[derive(clap::Args, Debug)]
pub struct Args {
    /// Also re-hash every stored object and tree node
    #[arg(long)]
    pub deep: bool,
    /// Check against a head exported earlier with `rewind anchor FILE`
    #[arg(long, value_name = "FILE")]
    pub anchor: Option<PathBuf>,
}

#[derive(Serialize)]
pub(crate) struct Deep {
    pub tree_nodes: u64,
    pub small_objects: u64,
    pub object_files: u64,
    /// btrfs snapshots walked and hashed against their manifests.
    pub snapshots: usize,
    /// Content reachable from a live checkpoint that is missing, and
    /// stored content whose bytes do not match its name.
    pub bad: Vec<String>,
}

#[derive(Serialize)]
pub(crate) struct KeptAnchor {
    pub path: PathBuf,
    pub seq: u64,
}

#[derive(Serialize)]
pub(crate) struct Out {
    #[serde(flatten)]
    pub verdict: Verdict,
    /// Checkpoints whose content gc released: their chain entries are
    /// intact, their content is not checked (it is gone by design).
    pub pruned_checkpoints: u64,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub deep: Option<Deep>,
    /// Checked against an anchor: the note on truncation is moot.
    #[serde(skip)]
    pub anchored: bool,
    /// The anchor rewind keeps outside the workspace (D313), when plain
    /// `verify` checked against it.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kept_anchor: Option<KeptAnchor>,
}

/// Exit codes (DESIGN §3): 0 intact, 1 tampered, 2 could not be read.
pub fn run(ctx: &Ctx, args: Args) -> i32 {
    match check(ctx, &args) {
        Ok(out) => {
            let _ = ctx.emit(&out, || human(&out));
            if out.verdict.ok { 0 } else { 1 }
        }
        Err(e) => {
            super::report_error(ctx, &e);
            2
        }
    }
}

pub(crate) fn check(ctx: &Ctx, args: &Args) -> Result<Out> {
    let anchor = match args.anchor.as_deref().map(|a| ctx.path_arg(a)) {
        Some(path) => Some(
            Anchor::read(&path)
                .map_err(|e| match e {
                    Error::InvalidPath { path, reason } => Error::InvalidPath {
                        path,
                        reason: format!("{reason}: name the file `rewind anchor FILE` wrote"),
                    },
                    e => e,
                })?
                .ok_or_else(|| Error::InvalidPath {
                    path,
                    reason: "does not exist: name the file `rewind anchor FILE` wrote".into(),
                })?,
        ),
        None => None,
    };
    let mut ws = ctx.workspace()?;
    // A btrfs checkpoint whose manifest is still being built is not on the
    // chain yet: finish it, as `list` does, so the count and head include
    // it. Not on a read-only filesystem, where nothing can be (D119).
    if !ws.ledger().is_read_only() {
        ws.recover_if_needed()?;
    }
    // Another workspace's anchor: the ledger was replaced, or the file is
    // the wrong one. Either way the chain is not the anchored one: exit 1
    // with a code, as for any mismatch (a script reading exit 2 as
    // "unreadable" missed a swapped ledger).
    let this = ws.ledger().workspace_id()?;
    let foreign = anchor.as_ref().filter(|a| a.workspace != this).map(|a| {
        crate::chain::FirstBad {
            seq: 1,
            code: crate::chain::Code::GenesisMismatch,
            reason: format!(
                "the anchor is for workspace {}, this ledger is workspace {this}: the ledger was replaced, or the anchor is another workspace's",
                a.workspace
            ),
        }
    });
    let anchor = anchor.filter(|_| foreign.is_none());
    // Without one given, the one rewind keeps (D313): a chain cut at its
    // tail verifies otherwise.
    let kept = match args.anchor {
        None => ws.ledger().kept_anchor()?,
        Some(_) => None,
    };
    let anchor = anchor.or_else(|| kept.as_ref().map(|(_, a)| a.clone()));
    let mut verdict = ws.ledger().verify_chain(anchor.as_ref())?;
    if let (Some((path, a)), Some(bad)) = (&kept, verdict.first_bad.as_mut())
        && matches!(
            bad.code,
            crate::chain::Code::TruncatedBelowAnchor | crate::chain::Code::AnchorMismatch
        )
    {
        bad.reason = format!(
            "{}; the anchor rewind keeps at {} recorded entry {}: the ledger lost its newest entries or holds others (a tool rewrote .rewind/, or a copy of it was put back); if you restored it on purpose, delete that file",
            bad.reason,
            crate::names::human_os_path(path),
            a.seq
        );
    }
    if let Some(bad) = foreign {
        verdict.ok = false;
        verdict.head = None;
        verdict.first_bad = Some(bad);
    }
    let deep = if args.deep {
        // Each a line of its own on a terminal: a million small files took
        // 9 s without one (helper-89, D341).
        let (tree_nodes, bad_trees) =
            ws.saying("re-hashing tree nodes", || ws.ledger().bad_tree_nodes())?;
        let (small_objects, bad_blobs) =
            ws.saying("re-hashing small objects", || ws.ledger().bad_blobs())?;
        let (object_files, bad_files) =
            ws.saying("re-hashing object files", || ws.store().verify_files())?;
        let bad_chunked = ws.saying("re-hashing chunked objects", || {
            ws.store().bad_manifests(&ws.ledger().chunk_manifests()?)
        })?;
        // Each named with a file that holds it: a hash alone told no one
        // what was affected (helper-74).
        let damaged: Vec<Hash> = bad_blobs
            .iter()
            .copied()
            .chain(bad_files.iter().filter_map(|h| Hash::from_hex(h)))
            .chain(bad_chunked.iter().copied())
            .collect();
        let held = match damaged.is_empty() {
            true => Default::default(),
            false => crate::gc::where_held(&ws, &damaged)?,
        };
        let named = |what: &str, h: &Hash| match held.get(h) {
            Some((id, path)) => format!(
                "{what} {h}: {} in checkpoint {id}",
                crate::names::human_bytes_name(path)
            ),
            None => format!("{what} {h}"),
        };
        let mut bad: Vec<String> = bad_trees.iter().map(|h| format!("tree node {h}")).collect();
        bad.extend(bad_blobs.iter().map(|h| named("small object", h)));
        bad.extend(bad_files.iter().map(|h| match Hash::from_hex(h) {
            Some(h) => named("object file", &h),
            None => format!("object file {h}"),
        }));
        let missing = crate::gc::missing(&ws)?;
        bad.extend(missing.damage);
        bad.extend(bad_chunked.iter().map(|h| named("chunked object", h)));
        bad.extend(ws.ledger().checkpoints_against_chain()?);
        Some(Deep {
            tree_nodes,
            small_objects,
            object_files,
            snapshots: missing.snapshots_walked,
            bad,
        })
    } else {
        None
    };
    // `ok` answers "is everything intact": damaged content is not, though
    // the chain that names it is.
    verdict.ok &= deep.as_ref().is_none_or(|d| d.bad.is_empty());
    let pruned_checkpoints = ws
        .ledger()
        .checkpoints()?
        .iter()
        .filter(|c| c.pruned)
        .count() as u64;
    Ok(Out {
        verdict,
        pruned_checkpoints,
        deep,
        anchored: args.anchor.is_some() || kept.is_some(),
        kept_anchor: kept.map(|(path, a)| KeptAnchor { path, seq: a.seq }),
    })
}

fn human(out: &Out) -> String {
    let v = &out.verdict;
    let mut s = match (&v.first_bad, &v.head) {
        (Some(b), _) => format!("TAMPERED at {}", b.summary()),
        (None, Some(h)) if v.ok => {
            format!("ok: {} entries, head {} {}", v.entries, h.seq, h.hash)
        }
        (None, Some(h)) => format!(
            "DAMAGED: the chain is intact ({} entries, head {} {}), stored content is not",
            v.entries, h.seq, h.hash
        ),
        (None, None) => "ok: the chain is empty".into(),
    };
    if out.pruned_checkpoints > 0 {
        s.push_str(&format!(
            "\n{} checkpoints were pruned by gc: their entries verified, their content gone by design",
            out.pruned_checkpoints
        ));
    }
    if let Some(d) = &out.deep {
        s.push_str(&format!(
            "\ndeep: {} tree nodes, {} small objects, {} object files re-hashed",
            d.tree_nodes, d.small_objects, d.object_files
        ));
        if d.snapshots > 0 {
            s.push_str(&format!(", {} btrfs snapshots walked", d.snapshots));
        }
        for b in &d.bad {
            s.push_str(&format!("\n  DAMAGED {b}"));
        }
    }
    if let Some(k) = &out.kept_anchor {
        s.push_str(&format!(
            "\nchecked against the anchor rewind keeps at {} (entry {}); one kept off this machine (`rewind anchor FILE`) survives what this one does not",
            crate::names::human_os_path(&k.path),
            k.seq
        ));
    } else if !out.anchored {
        s.push_str("\n(truncating the newest entries is undetectable without an anchor: keep `rewind anchor` output elsewhere)");
    }
    s
}
