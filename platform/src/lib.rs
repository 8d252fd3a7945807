//! OS primitives for rewind.
//!
//! This crate knows syscalls, not checkpoints: copy-on-write clones with a
//! copy fallback, filesystem detection, directory-fd-relative path operations
//! that never follow symlinks, `user.*` xattrs, durability helpers and locks.
//! Every fallible call returns [`Error`], which names the operation and path.

mod btrfs;
mod clone;
mod dir;
mod error;
mod fiemap;
mod finish_first;
mod fsinfo;
mod handoff;
mod heir;
mod lines;
mod lock;
mod process;
mod record;
mod system;
mod xattr;
mod xfs;

pub use btrfs::{
    ChangedInode, can_delete_snapshots, changed_inodes, create_subvolume, delete_subvolume,
    inode_path, is_readonly_subvolume, is_subvolume, set_subvolume_readonly, snapshot,
    subvolume_otransid, subvolume_written_since_creation,
};
pub use clone::{
    CloneOutcome, advise_sequential, clean_for_read, clone_or_copy, copy_with, match_nocow,
    set_direct_io, start_writeback, write_sparse,
};
pub use dir::{
    Dir, EntryKind, Meta, RenameMode, StatBeneath, Within, allocate, check_relative,
    create_in_place_file, file_set_mode, file_set_mtime, lexical, ns_since_epoch, resolve_existing,
};
pub use error::{Error, Result};
pub use fiemap::{Extent, Mapped, extents, mapping, next_data, same_blocks_prefix};
pub use finish_first::{
    FinishFirst, FinishTexts, deferred_signal, die_of_deferred_signal, finish_first,
};
pub use fsinfo::{
    FsInfo, FsKind, MountWatch, available_bytes, available_inodes, clone_support, file_id,
    filesystem_id, mount_at, mounts_below, probe_clone, reached_elsewhere,
};
pub use handoff::{
    Ended, StdioSwap, Watched, child_or_hangup, peer_pid, peer_uid, recv_all, recv_with_fds,
    send_with_fds, send_with_stdio, set_umask, wait_readable, watch,
};
pub use heir::{Heir, UserAccess};
pub use lock::LockFile;
pub use process::{
    credentials, euid, fail_writes_past_the_size_limit, give_back_free_heap, holders, is_root,
    is_running, job_begins, job_ends, kill_self, may_write, new_session, report_sigbus,
    return_big_frees_to_the_system, shared_writable_mappings, sigbus_json, spawn_tied, stop_self,
    terminate_between_jobs, works_beneath, writers_of,
};
pub use record::LockedRecord;
pub use system::{boot_id, clocks_ns, dirty_bytes, fd_headroom, raise_fd_limit, swap_files_under};
pub use xattr::Xattr;
pub use xfs::{xfs_bulkstat_ranges, xfs_chunk_ranges};
