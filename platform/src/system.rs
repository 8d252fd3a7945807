//! What the kernel says about this boot and its page cache: the inputs of
//! rewind's durability bookkeeping (the `durable` module of crate `rewind`).

use rustix::time::{ClockId, clock_gettime};

/// This boot's id (`/proc/sys/kernel/random/boot_id`), or `None` where it
/// cannot be read: a durability mark from another boot says nothing.
pub fn boot_id() -> Option<String> {
    let id = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let id = id.trim();
    (!id.is_empty()).then(|| id.to_owned())
}

/// The real-time clock and the boot-time clock, read back to back (ns).
/// Their difference moves only when someone steps the real-time clock
/// (or the machine sleeps): file times come from the real-time clock.
pub fn clocks_ns() -> (i64, i64) {
    let ns = |t: rustix::time::Timespec| crate::ns_since_epoch(t.tv_sec, t.tv_nsec);
    (
        ns(clock_gettime(ClockId::Realtime)),
        ns(clock_gettime(ClockId::Boottime)),
    )
}

/// The active swap files at or below `dir` (`/proc/swaps`; none where it
/// cannot be read). btrfs refuses to snapshot a subvolume that holds one
/// (ETXTBSY) and to unlink it: both name it with its fix (D246).
pub fn swap_files_under(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    let Ok(text) = std::fs::read_to_string("/proc/swaps") else {
        return Vec::new();
    };
    swap_paths(&text)
        .into_iter()
        .filter(|p| p.starts_with(dir))
        .collect()
}

/// The paths in `/proc/swaps`' first column, unescaped.
fn swap_paths(swaps: &str) -> Vec<std::path::PathBuf> {
    use std::os::unix::ffi::OsStringExt;
    swaps
        .lines()
        .skip(1)
        .filter_map(|l| l.split_whitespace().next())
        .map(|escaped| {
            let bytes = crate::fsinfo::unescape_octal(escaped.as_bytes());
            std::path::PathBuf::from(std::ffi::OsString::from_vec(bytes))
        })
        .collect()
}

/// Bytes of page cache that are dirty or under writeback, machine-wide
/// (`Dirty` + `Writeback` in `/proc/meminfo`): an upper bound on what a
/// `syncfs` may have to write first. `None` where it cannot be read.
pub fn dirty_bytes() -> Option<u64> {
    let text = std::fs::read_to_string("/proc/meminfo").ok()?;
    parse_dirty(&text)
}

fn parse_dirty(meminfo: &str) -> Option<u64> {
    let kib = |key: &str| -> Option<u64> {
        let line = meminfo.lines().find(|l| l.starts_with(key))?;
        line[key.len()..]
            .trim()
            .trim_end_matches("kB")
            .trim()
            .parse()
            .ok()
    };
    Some((kib("Dirty:")? + kib("Writeback:")?) * 1024)
}

/// Most descriptors [`raise_fd_limit`] asks for.
const FD_LIMIT_WANTED: u64 = 1 << 16;

/// Raise this process's soft limit on open descriptors towards its hard
/// limit (at most 65,536; never lowered). The capture walk holds one
/// descriptor per directory level on each walking thread (D166 bounds
/// the depth at 1,024), and the usual soft limit of 1,024 stopped every
/// command at about 1,000 levels, the rewind that would remove such a
/// chain included (helper-46, D268). Children inherit the raised limit.
pub fn raise_fd_limit() {
    use rustix::process::{Resource, getrlimit, setrlimit};
    let now = getrlimit(Resource::Nofile);
    let (Some(soft), hard) = (now.current, now.maximum) else {
        return;
    };
    let want = hard.map_or(FD_LIMIT_WANTED, |h| h.min(FD_LIMIT_WANTED));
    if want > soft {
        let _ = setrlimit(
            Resource::Nofile,
            rustix::process::Rlimit {
                current: Some(want),
                maximum: hard,
            },
        );
    }
}

/// How many more descriptors this process may open: its soft limit less
/// those open now (`/proc/self/fd`). `None` when either is unknown.
pub fn fd_headroom() -> Option<u64> {
    let limit = rustix::process::getrlimit(rustix::process::Resource::Nofile).current?;
    // The listing's own descriptor is one of those counted.
    let open = std::fs::read_dir("/proc/self/fd").ok()?.count() as u64;
    Some(limit.saturating_sub(open))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fd_headroom_shrinks_by_what_is_opened() {
        // Other test threads in this process open and close descriptors
        // meanwhile (CI saw 3 closed between the two counts), so hold far
        // more than any of them does and leave wide slack.
        const HELD: u64 = 256;
        let before = fd_headroom().expect("headroom");
        let held: Vec<std::fs::File> = (0..HELD)
            .map(|_| std::fs::File::open("/proc/self/status").expect("open"))
            .collect();
        let after = fd_headroom().expect("headroom");
        drop(held);
        assert!(
            before.saturating_sub(after) >= HELD - 64,
            "{before} then {after}"
        );
        assert!(before - after <= HELD + 64, "{before} then {after}");
    }

    #[test]
    fn dirty_bytes_add_dirty_and_writeback() {
        let text =
            "MemFree:  100 kB\nDirty:        84 kB\nWriteback:       16 kB\nWritebackTmp:  7 kB\n";
        assert_eq!(parse_dirty(text), Some(100 * 1024));
        assert_eq!(parse_dirty("Dirty: 1 kB\n"), None);
    }

    #[test]
    fn swap_paths_undo_the_kernels_escapes() {
        let text = "Filename\t\t\t\tType\t\tSize\tUsed\tPriority\n\
                    /dev/vda2                               partition\t1024\t0\t-2\n\
                    /w/my\\040ws/swap\\134f             file\t\t65532\t0\t-3\n";
        assert_eq!(
            swap_paths(text),
            vec![
                std::path::PathBuf::from("/dev/vda2"),
                std::path::PathBuf::from("/w/my ws/swap\\f"),
            ]
        );
    }

    #[test]
    fn this_machine_has_a_boot_id_and_monotone_clocks() {
        assert!(boot_id().is_some_and(|id| id.len() >= 32));
        let (r1, b1) = clocks_ns();
        let (r2, b2) = clocks_ns();
        assert!(b2 >= b1 && r1 > 0 && r2 > 0);
        assert!(dirty_bytes().is_some());
    }
}
