//! The FUSE overlay of rewind (`rewind mount DIR`).
//!
//! A passthrough filesystem mounted over the workspace directory itself.
//! It knows nothing about checkpoints; it knows three things the walk
//! engine has to find out the slow way:
//! - **what changed**: every mutating request marks its directory dirty
//!   ([`DirtySet`]), so a checkpoint opens only those;
//! - **when nobody looks**: a rewind freezes the mount (new requests wait,
//!   requests inside drain), changes the backing tree, thaws it and
//!   invalidates what the kernel cached;
//! - **where the backing tree is**: `.rewind/` is hidden from the mount,
//!   and clients learn a path to the backing tree over the control socket.
//!
//! Layout: `inodes` (table keyed by backing (dev, ino)), `dirty` (the
//! tracker), `gate` (freeze/thaw), `announce` (a rewind's changes told to
//! the mount's watchers), `fs` (the request handlers), `control`
//! (socket protocol and client), `claim` (one mount per workspace),
//! `companion` (a process kept running
//! beside the mount), `daemon` (mount and serve).

mod announce;
mod claim;
mod companion;
mod control;
mod daemon;
mod dirty;
mod error;
mod fs;
mod gate;
mod inodes;
pub mod wire;

pub use claim::{CLAIM_FILE, Holder, claimed_workspace, dead_view, holder};
pub use companion::Companion;
pub use control::{
    ANSWER_TIMEOUT, Client, DOORS_DIR, MountLock, MountStatus, backing_path, check_peer,
    command_socket_path, door_path, private_runtime_dir, runtime_dir, socket_path,
};
pub use daemon::{
    NO_FUSERMOUNT3, ServeOptions, detach_dead, detach_dead_mount, dev_fuse_usable, fusermount3,
    holders, is_rewind_mount, release_dead_backing, serve,
};
pub use dirty::{DirtySet, Names};
pub use error::{Error, Result};

/// The types a rewind mount has in the mount table: `fuse.rewind`, or
/// `fuse` where the subtype is not kept.
pub const FUSE_KINDS: &[&[u8]] = &[b"fuse.rewind", b"fuse"];

/// The daemon's answer to a freeze while another connection holds one.
pub const FROZEN_BY_ANOTHER: &str = "another rewind holds the mount frozen";
