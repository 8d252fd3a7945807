//! rewind: reversible workspaces for AI coding agents.
//!
//! Layers, from the bottom: `rewind-platform` (syscalls) → [`objects`] and
//! [`ledger`] (the store) → [`capture`] (change detection: the walk engine)
//! → [`diff`] and [`apply`] (plans) → [`workspace`] and [`rewind`] (the
//! operations and their crash-safety rules) → [`cli`].

/// This build: the version and, as semver build metadata, the commit it
/// was built from (build.rs): `0.1.0+ec62d394e`,
/// as `rewind --version` and the errors that tell builds apart say it.
pub const BUILD: &str = concat!(env!("CARGO_PKG_VERSION"), "+", env!("BUILT_FROM_COMMIT"));
pub mod acknowledged;
pub mod apply;
pub mod blobs;
pub mod capture;
pub mod chain;
pub mod cli;
pub mod config;
pub mod deinit;
pub mod diff;
pub mod du;
pub mod durable;
pub mod effects;
pub mod error;
pub mod failpoint;
pub mod gc;
pub mod git_guard;
pub mod hash;
pub mod hooks;
pub mod ids;
pub mod keep;
pub mod kept_anchor;
pub mod ledger;
pub mod mcp;
pub mod mount;
pub mod names;
pub mod objects;
pub mod progress;
pub mod rewind;
pub mod snapshot;
pub mod subvol;
pub mod threads;
pub mod time;
pub mod trace;
pub mod tree;
pub mod warm;
pub mod workspace;

pub use error::{Error, Result};
pub use workspace::Workspace;
