//! Names the commit a `rewind` binary was built from: `rewind --version`
//! said "0.1.0" for every build, and a user with an older build in an
//! agent's hooks could not tell which one ran (helper-83, D334).

// Cargo reads a build script's directives from its stdout; a build that
// cannot write them should fail (D348 is about the binary's output).
#![allow(clippy::disallowed_macros)]

use std::path::Path;
use std::process::Command;

fn main() {
    let commit = Command::new("git")
        .args(["rev-parse", "--short=9", "HEAD"])
        .output()
        .ok()
        .filter(|o| o.status.success())
        .and_then(|o| String::from_utf8(o.stdout).ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "unknown".to_string());
    // Not a `REWIND_*` name: cargo sets it in the environment of
    // `cargo test`'s processes too, and a command with a `REWIND_*`
    // variable runs in its own process, never in a mount's command
    // server (D93), which eight tests of the mount then missed.
    println!("cargo:rustc-env=BUILT_FROM_COMMIT={commit}");
    // Run again when HEAD moves; only for paths that exist, as a missing
    // one would run this script (and rebuild the crate) every time.
    for p in [".git/HEAD", ".git/refs/heads", ".git/packed-refs"] {
        if Path::new(p).exists() {
            println!("cargo:rerun-if-changed={p}");
        }
    }
    println!("cargo:rerun-if-changed=build.rs");
}
