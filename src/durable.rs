//! What of the live tree may not be on disk yet, so that a rewind can make
//! it durable with a few fsyncs instead of a `syncfs` (D85).
//!
//! A rewind must leave on disk the tree its commit records (DESIGN §4
//! rule 6): what it wrote, and what it left alone too, which may be an
//! edit the agent made a moment ago that is still only in the page cache.
//! One `syncfs` covers both, but it writes back every dirty page of the
//! filesystem, whoever wrote it: with 1 GB of another program's writes
//! pending on the same XFS, a one-file rewind took 745 ms instead of 10.
//!
//! So the ledger keeps a [`State`]:
//! 1. A mark: after a sync, every change whose ctime is below it is
//!    durable. ctime, because user space cannot set it; the mark is the
//!    filesystem's own clock when the capture before the sync started
//!    (its racy cut-off; see [`MARGIN_NS`]).
//! 2. The unsynced set: every entry a storing capture saw with a ctime at
//!    or above the mark (but for one at its fsynced ctime, 4); past
//!    [`MAX`] entries or [`MAX_PATH_BYTES`], none ("too many").
//! 3. The store mark: after a `syncfs`, every file of the filesystem with
//!    an older ctime is durable, `.rewind/` included. The mark also moves
//!    after a rewind's fsyncs, which cover only the workspace's entries;
//!    the store mark does not. It says whether a chunk file found stored
//!    (maybe by a capture killed before its sync) needs an fsync (D90).
//! 4. The fsynced entries: a rewind that fsyncs entries one by one
//!    (outside a frozen mount) cannot move the mark past what it wrote,
//!    since another program may have written meanwhile. It records each
//!    entry it fsynced with the ctime it had just before its fsync, if
//!    that ctime is below the filesystem clock read before the fsyncs
//!    began: any later change then has a later ctime. A capture that sees
//!    an entry at that very ctime leaves it out of the unsynced set, which
//!    a run of such rewinds would otherwise fill with their own writes
//!    until one fell back to `syncfs` (D92).
//!
//! The invariant: a change that may not be durable is in the unsynced set,
//! or was made after the last storing capture. The next capture then sees
//! it (a walk stats it; an XFS bulk stat or the mount's dirty set names
//! it), so a rewind's safety capture completes the set. A scoped capture
//! keeps the old set and adds what it saw; a full walk replaces it.
//!
//! A mark from another boot, or one the real-time clock was stepped
//! across (file times follow that clock), is void; then, and when the set
//! outgrows [`MAX`], only a `syncfs` will do, and it sets a new mark.

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::ledger::Ledger;

/// The ledger meta key holding the [`State`].
pub const KEY: &str = "durable";

/// At most this many unsynced entries are tracked; past it, the next
/// rewind syncs the filesystem.
pub const MAX: usize = 64;

/// At most this many bytes of paths are tracked (the set is rewritten
/// with every checkpoint that changes it).
pub const MAX_PATH_BYTES: usize = 16 * 1024;

/// Whether these paths are few enough to track: at most [`MAX`] of them
/// and [`MAX_PATH_BYTES`] together.
fn paths_fit<'p>(paths: impl ExactSizeIterator<Item = &'p Vec<u8>>) -> bool {
    paths.len() <= MAX && paths.map(Vec::len).sum::<usize>() <= MAX_PATH_BYTES
}

/// Whether a set is small enough to track (else: "too many").
fn fits(set: &BTreeSet<Vec<u8>>) -> bool {
    paths_fit(set.iter())
}

/// How far below the filesystem clock the mark is set: not at all. A
/// change with a ctime below the clock was made before the clock was
/// read: file times come from one clock that only moves forward (a step
/// back voids the mark), and a change within the clock's tick gets a
/// ctime equal to it, not below. A `write` that moved the ctime before
/// and is still copying data is a concurrent writer, whose result no
/// rewind promises. (A 2 s margin was tried: a tree populated a second
/// before overflowed the set, and every rewind fell back to `syncfs`.)
pub const MARGIN_NS: i64 = 0;

/// How far the real-time clock may drift from the boot-time clock between
/// a mark and its use before the mark is void (a step of the clock).
const MAX_CLOCK_DRIFT_NS: i64 = 1_000_000_000;

/// What a rewind knows of the tree it changes, for making the result
/// durable (`Workspace::sync_applied`).
#[derive(Debug, Clone)]
pub enum Before {
    /// Durable already: the btrfs engine's safety snapshot committed it.
    Durable,
    /// Durable but for these entries.
    Unsynced(BTreeSet<Vec<u8>>),
    /// Unknown: only a `syncfs` covers it.
    Unknown,
}

/// How a rewind made its result durable (`Workspace::sync_applied`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Synced {
    /// Nothing to do, or the btrfs engine (which keeps no mark).
    Nothing,
    /// An fsync per changed entry: each entry with its ctime just before
    /// its fsync, and the filesystem clock read before the fsyncs began
    /// (`i64::MIN` when not recorded: see [`State::after_fsyncs`]).
    Entries {
        fsynced: Vec<(Vec<u8>, i64)>,
        clock_before_ns: i64,
    },
    /// A `syncfs`, begun after the filesystem clock read `clock_ns`.
    Filesystem { clock_ns: i64 },
}

impl State {
    /// What this state says of the tree the capture that produced it saw.
    pub fn before(state: Option<&State>) -> Before {
        match state.and_then(State::unsynced) {
            Some(paths) => Before::Unsynced(paths.clone()),
            None => Before::Unknown,
        }
    }
}

/// The durability bookkeeping of one workspace (see the module docs).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct State {
    mark: Mark,
    /// `None`: more than [`MAX`] entries.
    unsynced: Option<BTreeSet<Vec<u8>>>,
    /// Files with an older ctime were on disk after the last `syncfs`
    /// (module docs, 3); `None` before the first since this was kept.
    store_below_ns: Option<i64>,
    /// Entries durable at this ctime although it is past the mark (module
    /// docs, 4).
    fsynced: BTreeMap<Vec<u8>, i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
struct Mark {
    /// Changes with a ctime below this are durable.
    below_ns: i64,
    boot: String,
    /// The real-time and boot-time clocks when the mark was set.
    real_ns: i64,
    boot_ns: i64,
}

#[derive(Serialize, Deserialize)]
struct Stored {
    #[serde(flatten)]
    mark: Mark,
    /// Hex-encoded paths; `null` when there are too many.
    unsynced: Option<Vec<String>>,
    /// Absent in states written before D90.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    store_below_ns: Option<i64>,
    /// Hex-encoded path and ctime; absent before D92.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    fsynced: Vec<(String, i64)>,
}

impl Mark {
    fn new(below_ns: i64) -> Option<Mark> {
        let (real_ns, boot_ns) = rewind_platform::clocks_ns();
        Some(Mark {
            below_ns,
            boot: rewind_platform::boot_id()?,
            real_ns,
            boot_ns,
        })
    }

    /// Same boot, and the real-time clock moved with the boot-time clock.
    fn holds(&self) -> bool {
        let (real_ns, boot_ns) = rewind_platform::clocks_ns();
        let drift = (real_ns - self.real_ns) - (boot_ns - self.boot_ns);
        drift.abs() <= MAX_CLOCK_DRIFT_NS
            && rewind_platform::boot_id().is_some_and(|b| b == self.boot)
    }
}

impl State {
    /// The state the ledger holds, if its mark still holds.
    pub fn load(ledger: &Ledger) -> Result<Option<State>> {
        Ok(ledger
            .meta(KEY)?
            .and_then(|text| State::decode(&text))
            .filter(|s| s.mark.holds()))
    }

    /// The ctime from which a capture that started at filesystem clock
    /// `clock_ns` reports entries: the mark of `old`, or, with none, the
    /// mark a sync after the capture would set. `None` without a clock.
    pub fn reporting_from(old: Option<&State>, clock_ns: i64) -> Option<i64> {
        if clock_ns == i64::MIN {
            return None;
        }
        Some(old.map_or(clock_ns - MARGIN_NS, |s| s.mark.below_ns))
    }

    /// After a storing capture that reported `recent` (path, ctime): the
    /// old set (when the capture was scoped and so did not look at every
    /// entry) plus what it saw. `None` without an old mark.
    pub fn after_capture(
        old: Option<&State>,
        recent: &[(Vec<u8>, i64)],
        scoped: bool,
    ) -> Option<State> {
        let old = old?;
        let mut unsynced = if scoped {
            old.unsynced.clone()
        } else {
            Some(BTreeSet::new())
        };
        if let Some(set) = unsynced.as_mut() {
            set.extend(old.past_mark(recent));
        }
        Some(State {
            mark: old.mark.clone(),
            unsynced: unsynced.filter(fits),
            store_below_ns: old.store_below_ns,
            fsynced: old.fsynced.clone(),
        })
    }

    /// The entries of `recent` that may not be durable: at or past the
    /// mark, and not at the ctime they were fsynced at.
    fn past_mark<'r>(&'r self, recent: &'r [(Vec<u8>, i64)]) -> impl Iterator<Item = Vec<u8>> + 'r {
        recent
            .iter()
            .filter(|(path, ctime)| {
                *ctime >= self.mark.below_ns && self.fsynced.get(path) != Some(ctime)
            })
            .map(|(p, _)| p.clone())
    }

    /// After a `syncfs` that began once the filesystem clock read
    /// `clock_ns` (after the capture that reported `recent`): a new mark
    /// and store mark below that clock, and the entries the capture saw at
    /// or above it (changed while it ran).
    pub fn after_syncfs(clock_ns: i64, recent: &[(Vec<u8>, i64)]) -> Option<State> {
        let mut state = State::after_sync(clock_ns, recent)?;
        state.store_below_ns = Some(state.mark.below_ns);
        Some(state)
    }

    /// After fsyncs of every workspace entry that may not have been
    /// durable (the apply's and the unsynced set's): a new mark below
    /// `below_ns`, the entries at or above it from `recent`, the old store
    /// mark (the fsyncs did not cover `.rewind/`), and `fsynced`: each
    /// entry fsynced with its ctime before the fsync, when that ctime is
    /// below `clock_before_ns`, the filesystem clock read before the
    /// fsyncs began (module docs, 4).
    pub fn after_fsyncs(
        old_store_below_ns: Option<i64>,
        below_ns: i64,
        recent: &[(Vec<u8>, i64)],
        fsynced: &[(Vec<u8>, i64)],
        clock_before_ns: i64,
    ) -> Option<State> {
        let mut state = State::after_sync(below_ns, recent)?;
        state.store_below_ns = old_store_below_ns;
        state.fsynced = fsynced
            .iter()
            .filter(|(_, ctime)| *ctime >= state.mark.below_ns && *ctime < clock_before_ns)
            .cloned()
            .collect();
        // Past the bound none are kept: the next captures list them as
        // unsynced, which is only slower.
        if !paths_fit(state.fsynced.keys()) {
            state.fsynced.clear();
        }
        if let Some(set) = state.unsynced.as_mut() {
            set.retain(|p| !state.fsynced.contains_key(p));
        }
        Some(state)
    }

    fn after_sync(clock_ns: i64, recent: &[(Vec<u8>, i64)]) -> Option<State> {
        let below_ns = State::reporting_from(None, clock_ns)?;
        let unsynced: BTreeSet<Vec<u8>> = recent
            .iter()
            .filter(|(_, ctime)| *ctime >= below_ns)
            .map(|(p, _)| p.clone())
            .collect();
        Some(State {
            mark: Mark::new(below_ns)?,
            unsynced: Some(unsynced).filter(fits),
            store_below_ns: None,
            fsynced: BTreeMap::new(),
        })
    }

    /// Files of the workspace's filesystem with an older ctime are durable
    /// (module docs, 3).
    pub fn store_below_ns(&self) -> Option<i64> {
        self.store_below_ns
    }

    /// The entries that may not be durable, unless there are too many.
    pub fn unsynced(&self) -> Option<&BTreeSet<Vec<u8>>> {
        self.unsynced.as_ref()
    }

    pub fn encode(&self) -> String {
        let stored = Stored {
            mark: self.mark.clone(),
            unsynced: self
                .unsynced
                .as_ref()
                .map(|s| s.iter().map(|p| crate::hash::hex(p)).collect()),
            store_below_ns: self.store_below_ns,
            fsynced: self
                .fsynced
                .iter()
                .map(|(p, t)| (crate::hash::hex(p), *t))
                .collect(),
        };
        serde_json::to_string(&stored).unwrap_or_default()
    }

    /// `None` for anything but what [`State::encode`] wrote: then the next
    /// rewind syncs the filesystem, which is always correct.
    fn decode(text: &str) -> Option<State> {
        let stored: Stored = serde_json::from_str(text).ok()?;
        let unsynced = match stored.unsynced {
            None => None,
            Some(paths) => Some(
                paths
                    .iter()
                    .map(|h| crate::hash::unhex(h))
                    .collect::<Option<BTreeSet<Vec<u8>>>>()?,
            ),
        };
        let fsynced = stored
            .fsynced
            .iter()
            .map(|(h, t)| crate::hash::unhex(h).map(|p| (p, *t)))
            .collect::<Option<BTreeMap<Vec<u8>, i64>>>()?;
        Some(State {
            mark: stored.mark,
            unsynced,
            store_below_ns: stored.store_below_ns,
            fsynced,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn recent(items: &[(&str, i64)]) -> Vec<(Vec<u8>, i64)> {
        items
            .iter()
            .map(|(p, t)| (p.as_bytes().to_vec(), *t))
            .collect()
    }

    fn paths(s: &State) -> Vec<String> {
        s.unsynced()
            .map(|set| {
                set.iter()
                    .map(|p| String::from_utf8_lossy(p).into_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    #[test]
    fn a_sync_marks_below_the_capture_clock_and_keeps_what_changed_while_it_ran() {
        let clock = 1_000_000_000_000;
        let s = State::after_syncfs(
            clock,
            &recent(&[("old", clock - 1), ("tick", clock), ("during", clock + 5)]),
        )
        .expect("state");
        assert_eq!(s.mark.below_ns, clock - MARGIN_NS);
        assert_eq!(paths(&s), ["during", "tick"]);
        assert!(s.mark.holds(), "a fresh mark holds");
        assert_eq!(State::decode(&s.encode()), Some(s.clone()));
        assert_eq!(
            State::after_syncfs(i64::MIN, &[]),
            None,
            "no clock, no mark"
        );
    }

    #[test]
    fn a_scoped_capture_adds_to_the_set_and_a_walk_replaces_it() {
        let clock = 1_000_000_000_000;
        let synced = State::after_syncfs(clock, &recent(&[("a", clock)])).expect("state");
        let below = synced.mark.below_ns;
        let seen = recent(&[("b", below), ("durable", below - 1)]);
        let scoped = State::after_capture(Some(&synced), &seen, true).expect("state");
        assert_eq!(paths(&scoped), ["a", "b"]);
        let walked = State::after_capture(Some(&scoped), &seen, false).expect("state");
        assert_eq!(paths(&walked), ["b"]);
        assert_eq!(
            State::after_capture(None, &seen, false),
            None,
            "no mark, no set"
        );
    }

    #[test]
    fn an_entry_fsynced_before_the_clock_is_left_out_until_its_ctime_moves() {
        let clock = 1_000_000_000_000;
        let old = State::after_syncfs(clock, &[]).expect("state");
        let capture_clock = clock + 100;
        let before_fsyncs = clock + 200;
        let fsynced = recent(&[
            ("rewritten", clock + 150),
            ("racing", before_fsyncs),
            ("old", clock - 1),
        ]);
        let s = State::after_fsyncs(
            old.store_below_ns(),
            capture_clock,
            &recent(&[("rewritten", capture_clock + 10)]),
            &fsynced,
            before_fsyncs,
        )
        .expect("state");
        assert_eq!(
            s.fsynced.keys().map(|k| k.as_slice()).collect::<Vec<_>>(),
            [b"rewritten".as_slice()],
            "only ctimes from the mark to before the fsyncs are recorded"
        );
        assert_eq!(
            paths(&s),
            Vec::<String>::new(),
            "the fsynced entry is durable"
        );
        assert_eq!(State::decode(&s.encode()), Some(s.clone()));
        let seen = recent(&[
            ("rewritten", clock + 150),
            ("racing", before_fsyncs),
            ("edited", clock + 300),
        ]);
        let next = State::after_capture(Some(&s), &seen, false).expect("state");
        assert_eq!(paths(&next), ["edited", "racing"]);
        let moved = recent(&[("rewritten", clock + 400)]);
        let again = State::after_capture(Some(&next), &moved, true).expect("state");
        assert_eq!(paths(&again), ["edited", "racing", "rewritten"]);
    }

    #[test]
    fn too_many_unsynced_entries_void_the_set_until_the_next_sync() {
        let clock = 1_000_000_000_000;
        let synced = State::after_syncfs(clock, &[]).expect("state");
        let many: Vec<(Vec<u8>, i64)> = (0..=MAX)
            .map(|i| (format!("f{i}").into_bytes(), clock))
            .collect();
        let over = State::after_capture(Some(&synced), &many, true).expect("state");
        assert_eq!(over.unsynced(), None);
        assert_eq!(State::decode(&over.encode()), Some(over.clone()));
        let still = State::after_capture(Some(&over), &[], true).expect("state");
        assert_eq!(
            still.unsynced(),
            None,
            "a scoped capture cannot recover the set"
        );
        let long = vec![(vec![b'x'; MAX_PATH_BYTES + 1], clock)];
        let too_long = State::after_capture(Some(&synced), &long, false).expect("state");
        assert_eq!(
            too_long.unsynced(),
            None,
            "paths past the byte budget void the set"
        );
    }

    #[test]
    fn a_mark_from_another_boot_or_across_a_clock_step_is_void() {
        let fresh = Mark::new(0).expect("mark");
        let other_boot = Mark {
            boot: "another-boot".into(),
            ..fresh.clone()
        };
        assert!(!other_boot.holds());
        let stepped = Mark {
            real_ns: fresh.real_ns + 5 * MAX_CLOCK_DRIFT_NS,
            ..fresh.clone()
        };
        assert!(!stepped.holds());
        assert!(fresh.holds());
        assert_eq!(State::decode("{not json"), None);
    }
}
