//! Shared test helpers: real filesystems on loop devices (with a guard that
//! unmounts even when a test fails), a tree snapshot for exact comparisons,
//! and a runner for the `rewind` binary.

// Tests may panic on a closed stream (D348).
#![allow(clippy::disallowed_macros)]
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::ffi::OsStr;
use std::io::Write;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use sha2::{Digest, Sha256};

/// The filesystems the tests run on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fs {
    Ext4,
    Xfs,
    Btrfs,
}

impl Fs {
    pub const ALL: [Fs; 3] = [Fs::Ext4, Fs::Xfs, Fs::Btrfs];

    pub fn name(self) -> &'static str {
        match self {
            Fs::Ext4 => "ext4",
            Fs::Xfs => "xfs",
            Fs::Btrfs => "btrfs",
        }
    }

    fn mkfs(self, img: &Path, extra: &[&str]) -> Command {
        let mut c;
        match self {
            Fs::Ext4 => {
                c = Command::new("mkfs.ext4");
                c.args(["-q", "-F"]);
            }
            Fs::Xfs => {
                c = Command::new("mkfs.xfs");
                c.args(["-q", "-f", "-m", "reflink=1"]);
            }
            Fs::Btrfs => {
                c = Command::new("mkfs.btrfs");
                c.args(["-q", "-f"]);
            }
        }
        c.args(extra).arg(img);
        c
    }
}

/// Fail (in CI) or skip with a reason (elsewhere).
pub fn skip_or_fail(reason: &str) {
    if std::env::var_os("CI").is_some() {
        panic!("cannot run in CI: {reason}");
    }
    eprintln!("SKIPPED: {reason}");
}

pub fn is_root() -> bool {
    rustix_uid() == 0
}

fn rustix_uid() -> u32 {
    // /proc/self/status "Uid:" line, to avoid a libc dependency.
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("Uid:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|u| u.parse().ok())
        })
        .unwrap_or(u32::MAX)
}

/// A filesystem made on a loop device and mounted; unmounted on drop.
pub struct LoopFs {
    pub fs: Fs,
    pub mnt: PathBuf,
    _dir: tempfile::TempDir,
}

impl LoopFs {
    /// Make and mount `fs` of `size_mb`. `None` (with the reason printed)
    /// when not root or the mkfs tool is missing, outside CI.
    pub fn new(fs: Fs, size_mb: u64) -> Option<LoopFs> {
        LoopFs::made_with(fs, size_mb, &[])
    }

    /// [`LoopFs::new`] with `extra` options for mkfs (`-N 300`: ext4
    /// with few inodes).
    pub fn made_with(fs: Fs, size_mb: u64, extra: &[&str]) -> Option<LoopFs> {
        if !is_root() {
            skip_or_fail(&format!("{} on a loop device needs root", fs.name()));
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix(&format!("rewind-{}-", fs.name()))
            .tempdir_in(base_tmp())
            .expect("tempdir");
        let img = dir.path().join("img");
        let mnt = dir.path().join("mnt");
        std::fs::create_dir(&mnt).expect("mkdir mnt");
        let f = std::fs::File::create(&img).expect("create image");
        f.set_len(size_mb << 20).expect("size image");
        drop(f);
        match fs.mkfs(&img, extra).output() {
            Ok(o) if o.status.success() => {}
            Ok(o) => panic!(
                "mkfs {} failed: {}",
                fs.name(),
                String::from_utf8_lossy(&o.stderr)
            ),
            Err(e) => {
                skip_or_fail(&format!(
                    "mkfs for {} not available: {e} (apt-get install btrfs-progs xfsprogs)",
                    fs.name()
                ));
                return None;
            }
        }
        LoopFs::mount(fs, dir)
    }

    /// Mount `dir/img` on `dir/mnt`.
    fn mount(fs: Fs, dir: tempfile::TempDir) -> Option<LoopFs> {
        let img = dir.path().join("img");
        let mnt = dir.path().join("mnt");
        // A copy of a mounted XFS has the same UUID (see `power_cut_copy`).
        let opts = match fs {
            Fs::Xfs => "loop,nouuid",
            _ => "loop",
        };
        let out = Command::new("mount")
            .arg("-o")
            .arg(opts)
            .arg(&img)
            .arg(&mnt)
            .output()
            .expect("run mount");
        if !out.status.success() {
            skip_or_fail(&format!(
                "mount {} loop device failed: {}",
                fs.name(),
                String::from_utf8_lossy(&out.stderr)
            ));
            return None;
        }
        Some(LoopFs { fs, mnt, _dir: dir })
    }

    /// Change mount options in place (`mount -o remount,OPTS`). Retried
    /// for a moment: a process another test forks between its `fork` and
    /// its `exec` holds this binary's descriptors, and a file this test
    /// had open for writing then makes `remount,ro` fail EBUSY (seen once
    /// under load).
    pub fn remount(&self, opts: &str) {
        let mut cmd = Command::new("mount");
        cmd.arg("-o").arg(format!("remount,{opts}")).arg(&self.mnt);
        for _ in 0..20 {
            if cmd.output().is_ok_and(|o| o.status.success()) {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        run_ok(&mut cmd, &format!("remount {opts}"));
    }

    /// Fill the filesystem to its last block, as root (reserved blocks
    /// included): 1 MiB writes, then 4 KiB appends until one fails. The
    /// filler files are `FILL*` at its root.
    pub fn fill_to_the_last_block(&self) {
        let dd = |bs: &str, of: &str, append: bool| {
            let mut c = Command::new("dd");
            c.args(["if=/dev/zero", &format!("bs={bs}")])
                .arg(format!("of={}", self.mnt.join(of).display()));
            if append {
                c.args(["oflag=append", "conv=notrunc"]);
            }
            let _ = c.output();
        };
        dd("1M", "FILL", false);
        self.sync();
        // Each round appends until the disk refuses a block; what writeback
        // frees (delayed allocation's reservations) is taken next round.
        for _ in 0..3 {
            dd("4k", "FILL-tail", true);
            self.sync();
        }
    }

    /// `syncfs` of this filesystem (`sync -f`).
    pub fn sync(&self) {
        run_ok(
            Command::new("sync").arg("-f").arg(&self.mnt),
            "sync the loop filesystem",
        );
    }

    /// What a power cut now would leave, mounted elsewhere: a copy of the
    /// image as the loop device has received it. btrfs sends metadata to
    /// the device only when it commits a transaction or syncs its log, and
    /// flushes right after, so on btrfs mounted with a long `commit=`
    /// interval the copy holds what was made durable and nothing else
    /// that a rewind writes (clones and renames are metadata only).
    pub fn power_cut_copy(&self) -> LoopFs {
        let dir = tempfile::Builder::new()
            .prefix(&format!("rewind-{}-cut-", self.fs.name()))
            .tempdir_in(base_tmp())
            .expect("tempdir");
        std::fs::create_dir(dir.path().join("mnt")).expect("mkdir mnt");
        run_ok(
            Command::new("cp")
                .arg("--sparse=always")
                .arg(self._dir.path().join("img"))
                .arg(dir.path().join("img")),
            "copy the image",
        );
        // A copy of a mounted btrfs has the same fsid; kernels since 6.7
        // mount it with a temporary one.
        LoopFs::mount(self.fs, dir).expect("mount the copy of the image")
    }

    /// Unmount, run `between`, and mount the same image at the same place
    /// again (as a reboot does); what `between` returns lives on.
    pub fn remount_after<T>(&self, between: impl FnOnce() -> T) -> T {
        let unmounted = (0..50).any(|_| {
            let ok = Command::new("umount")
                .arg(&self.mnt)
                .output()
                .is_ok_and(|o| o.status.success());
            if !ok {
                std::thread::sleep(std::time::Duration::from_millis(100));
            }
            ok
        });
        assert!(unmounted, "umount {}", self.mnt.display());
        let kept = between();
        let opts = match self.fs {
            Fs::Xfs => "loop,nouuid",
            _ => "loop",
        };
        run_ok(
            Command::new("mount")
                .arg("-o")
                .arg(opts)
                .arg(self._dir.path().join("img"))
                .arg(&self.mnt),
            "mount the image again",
        );
        kept
    }

    /// A fresh directory on this filesystem.
    /// Let every user reach the mount (search on each directory above
    /// it), as a test run as another user needs; modes are kept else.
    pub fn open_to_others(&self) {
        use std::os::unix::fs::PermissionsExt;
        for dir in self.mnt.ancestors() {
            let mode = std::fs::metadata(dir).expect("stat").permissions().mode() & 0o7777;
            if mode & 0o001 == 0 {
                chmod(dir, mode | 0o055);
            }
        }
    }

    pub fn subdir(&self, name: &str) -> PathBuf {
        let p = self.mnt.join(name);
        std::fs::create_dir_all(&p).expect("mkdir on loop fs");
        p
    }

    /// A fresh btrfs subvolume on this filesystem (the btrfs engine's
    /// workspace root).
    pub fn subvolume(&self, name: &str) -> PathBuf {
        subvolume_in(&self.mnt, name)
    }

    /// Bytes used on the filesystem (statfs), after flushing it.
    pub fn used_bytes(&self) -> u64 {
        self.sync();
        let dir = rewind_platform::Dir::open(&self.mnt).expect("open mnt");
        rewind_platform::FsInfo::of(&dir)
            .expect("statfs")
            .used_bytes()
    }
}

/// A fresh btrfs subvolume `name` in the directory `parent`.
pub fn subvolume_in(parent: &Path, name: &str) -> PathBuf {
    let dir = rewind_platform::Dir::open(parent).expect("open the parent");
    rewind_platform::create_subvolume(&dir, std::ffi::OsStr::new(name)).expect("create subvolume");
    parent.join(name)
}

impl Drop for LoopFs {
    fn drop(&mut self) {
        for _ in 0..50 {
            match Command::new("umount").arg(&self.mnt).output() {
                Ok(o) if o.status.success() => return,
                _ => std::thread::sleep(std::time::Duration::from_millis(100)),
            }
        }
        let _ = Command::new("umount").arg("-l").arg(&self.mnt).status();
    }
}

/// An overlayfs whose lower and upper layers are two tmpfs, mounted with
/// `xino=off`: the kernel then gives every non-directory its layer's
/// `st_dev`, not the overlay's (a sandbox's tmpfs upper over a project
/// does the same). Unmounted on drop, overlay first.
pub struct Overlay {
    /// The merged view: the workspace goes here.
    pub merged: PathBuf,
    layers: [PathBuf; 2],
    _dir: tempfile::TempDir,
}

impl Overlay {
    /// Mount it, after `lower` has filled the lower layer (a lower layer
    /// must not change while mounted). `None` outside CI when not root.
    pub fn new(lower: impl FnOnce(&Path)) -> Option<Overlay> {
        if !is_root() {
            skip_or_fail("mounting tmpfs and overlayfs needs root");
            return None;
        }
        let dir = tempfile::Builder::new()
            .prefix("rewind-overlay-")
            .tempdir_in(base_tmp())
            .expect("tempdir");
        let (low, up, merged) = (
            dir.path().join("lower"),
            dir.path().join("upperfs"),
            dir.path().join("merged"),
        );
        for d in [&low, &up, &merged] {
            std::fs::create_dir(d).expect("mkdir");
        }
        let mut overlay = Overlay {
            merged: merged.clone(),
            layers: [PathBuf::new(), PathBuf::new()],
            _dir: dir,
        };
        for (i, d) in [&low, &up].into_iter().enumerate() {
            run_ok(
                Command::new("mount").args(["-t", "tmpfs", "tmpfs"]).arg(d),
                "mount tmpfs",
            );
            overlay.layers[i] = d.clone();
        }
        lower(&low);
        for d in ["upper", "work"] {
            std::fs::create_dir(up.join(d)).expect("mkdir");
        }
        let opts = format!(
            "lowerdir={},upperdir={},workdir={},xino=off",
            low.display(),
            up.join("upper").display(),
            up.join("work").display()
        );
        run_ok(
            Command::new("mount")
                .args(["-t", "overlay", "overlay", "-o", &opts])
                .arg(&merged),
            "mount overlay",
        );
        Some(overlay)
    }
}

impl Drop for Overlay {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.merged).status();
        for d in self
            .layers
            .iter()
            .rev()
            .filter(|d| !d.as_os_str().is_empty())
        {
            let _ = Command::new("umount").arg(d).status();
        }
    }
}

/// Run `cmd`; panic naming `what`, with its stderr, unless it succeeds.
fn run_ok(cmd: &mut Command, what: &str) {
    let out = cmd.output().unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
}

fn base_tmp() -> PathBuf {
    std::env::var_os("REWIND_TEST_TMP")
        .map(PathBuf::from)
        .unwrap_or_else(std::env::temp_dir)
}

/// A plain temp dir on the default filesystem (for tests that need no root).
pub fn tmp() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("rewind-test-")
        .tempdir_in(base_tmp())
        .expect("tempdir")
}

/// What a tree entry looks like, as a rewind must restore it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Snap {
    File {
        mode: u32,
        sha256: String,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Dir {
        mode: u32,
        xattrs: Vec<(Vec<u8>, Vec<u8>)>,
    },
    Link {
        target: Vec<u8>,
    },
}

/// The whole tree below `root` (minus `.rewind/`), never following symlinks.
pub fn snapshot(root: &Path) -> BTreeMap<Vec<u8>, Snap> {
    let mut out = BTreeMap::new();
    walk(root, root, &mut out);
    out
}

fn xattrs_of(path: &Path, is_dir: bool) -> Vec<(Vec<u8>, Vec<u8>)> {
    let parent = rewind_platform::Dir::open(path.parent().expect("parent")).expect("open parent");
    let kind = if is_dir {
        rewind_platform::EntryKind::Dir
    } else {
        rewind_platform::EntryKind::File
    };
    parent
        .user_xattrs_at(path.file_name().expect("name"), kind)
        .expect("list xattrs")
        .into_iter()
        .map(|x| (x.name, x.value))
        .collect()
}

fn walk(root: &Path, dir: &Path, out: &mut BTreeMap<Vec<u8>, Snap>) {
    for ent in std::fs::read_dir(dir).expect("read_dir") {
        let ent = ent.expect("dirent");
        let path = ent.path();
        let rel = path
            .strip_prefix(root)
            .expect("rel")
            .as_os_str()
            .as_bytes()
            .to_vec();
        if rel == b".rewind" {
            continue;
        }
        let md = std::fs::symlink_metadata(&path).expect("lstat");
        let mode = md.permissions().mode() & 0o7777;
        if md.file_type().is_symlink() {
            out.insert(
                rel,
                Snap::Link {
                    target: std::fs::read_link(&path)
                        .expect("readlink")
                        .as_os_str()
                        .as_bytes()
                        .to_vec(),
                },
            );
        } else if md.is_dir() {
            out.insert(
                rel,
                Snap::Dir {
                    mode,
                    xattrs: xattrs_of(&path, true),
                },
            );
            walk(root, &path, out);
        } else if md.is_file() {
            let bytes = std::fs::read(&path).expect("read");
            out.insert(
                rel,
                Snap::File {
                    mode,
                    sha256: hex(&Sha256::digest(&bytes)),
                    xattrs: xattrs_of(&path, false),
                },
            );
        }
    }
}

pub fn hex(b: &[u8]) -> String {
    b.iter().map(|x| format!("{x:02x}")).collect()
}

/// Assert two snapshots are equal, printing the first differences.
pub fn assert_same(label: &str, want: &BTreeMap<Vec<u8>, Snap>, got: &BTreeMap<Vec<u8>, Snap>) {
    if want == got {
        return;
    }
    let mut diffs = Vec::new();
    for (k, v) in want {
        match got.get(k) {
            None => diffs.push(format!("missing {:?}", String::from_utf8_lossy(k))),
            Some(g) if g != v => diffs.push(format!(
                "differs {:?}: want {v:?} got {g:?}",
                String::from_utf8_lossy(k)
            )),
            _ => {}
        }
    }
    for k in got.keys() {
        if !want.contains_key(k) {
            diffs.push(format!("extra {:?}", String::from_utf8_lossy(k)));
        }
    }
    diffs.truncate(20);
    panic!(
        "{label}: tree differs from the checkpoint:\n{}",
        diffs.join("\n")
    );
}

/// Run the `rewind` binary in `dir` with `args`.
pub fn rewind(dir: &Path, args: &[&str]) -> Output {
    rewind_env(dir, args, &[])
}

pub fn rewind_env(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_rewind"));
    c.current_dir(dir).args(args);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().expect("run rewind")
}

/// `rewind ARGS` from `cwd` with `stdin` as its input and `env` added.
pub fn rewind_fed(cwd: &Path, args: &[&str], stdin: &[u8], env: &[(&str, &str)]) -> Output {
    rewind_fed_pid(cwd, args, stdin, env).1
}

/// [`rewind_fed`], also giving the process id.
pub fn rewind_fed_pid<V: AsRef<OsStr>>(
    cwd: &Path,
    args: &[&str],
    stdin: &[u8],
    env: &[(&str, V)],
) -> (u32, Output) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .args(args)
        .envs(env.iter().map(|(k, v)| (k, v.as_ref())))
        .current_dir(cwd)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("spawn rewind");
    let pid = child.id();
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(stdin)
        .expect("write stdin");
    (pid, child.wait_with_output().expect("wait rewind"))
}

/// `rewind --json hook pre-tool-use` for a Bash call of `command` whose
/// payload names `ws` as its cwd, as Claude Code sends it; panics unless
/// it exits 0.
pub fn pre_bash_hook(ws: &Path, command: &str) -> Output {
    let payload =
        serde_json::json!({"tool_name": "Bash", "tool_input": {"command": command}, "cwd": ws});
    let out = rewind_fed(
        ws,
        &["--json", "hook", "pre-tool-use"],
        payload.to_string().as_bytes(),
        &[],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Run and parse `--json` output; panics with stderr on failure.
pub fn rewind_json(dir: &Path, args: &[&str]) -> serde_json::Value {
    let mut a = vec!["--json"];
    a.extend_from_slice(args);
    let out = rewind(dir, &a);
    assert!(
        out.status.success(),
        "rewind {args:?} failed: {}\n{}",
        String::from_utf8_lossy(&out.stderr),
        String::from_utf8_lossy(&out.stdout)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "rewind {args:?}: bad JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// `rewind checkpoint [ARGS]` and its id.
pub fn checkpoint_id(dir: &Path, args: &[&str]) -> String {
    let mut a = vec!["checkpoint"];
    a.extend_from_slice(args);
    rewind_json(dir, &a)["id"]
        .as_str()
        .expect("checkpoint id")
        .to_string()
}

pub fn write(path: &Path, bytes: &[u8]) {
    if let Some(p) = path.parent() {
        std::fs::create_dir_all(p).expect("mkdir -p");
    }
    std::fs::write(path, bytes).expect("write");
}

pub fn chmod(path: &Path, mode: u32) {
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).expect("chmod");
}

/// `chown -R -h nobody: PATH`: the tree becomes the user nobody's, in
/// its login group, symlinks themselves included.
pub fn give_to_nobody(path: &Path) {
    let st = std::process::Command::new("chown")
        .args(["-R", "-h", "nobody:"])
        .arg(path)
        .status()
        .expect("chown");
    assert!(st.success(), "chown -R nobody: {}", path.display());
}

/// Every entry at or below `top` (symlinks not followed) whose owner is
/// not `uid`, as "PATH (uid N)".
pub fn not_owned_by(top: &Path, uid: u32) -> Vec<String> {
    use std::os::unix::fs::MetadataExt;
    let mut found = Vec::new();
    let mut todo = vec![top.to_path_buf()];
    while let Some(p) = todo.pop() {
        let m = std::fs::symlink_metadata(&p).expect("stat");
        if m.uid() != uid {
            found.push(format!("{} (uid {})", p.display(), m.uid()));
        }
        if m.is_dir() {
            todo.extend(
                std::fs::read_dir(&p)
                    .expect("readdir")
                    .map(|e| e.expect("entry").path()),
            );
        }
    }
    found.sort();
    found
}

pub fn set_xattr(path: &Path, name: &str, value: &[u8]) {
    let parent = rewind_platform::Dir::open(path.parent().expect("parent")).expect("open parent");
    let md = std::fs::symlink_metadata(path).expect("lstat");
    let kind = if md.is_dir() {
        rewind_platform::EntryKind::Dir
    } else {
        rewind_platform::EntryKind::File
    };
    let mut xs = parent
        .user_xattrs_at(path.file_name().expect("name"), kind)
        .expect("xattrs");
    xs.retain(|x| x.name != name.as_bytes());
    xs.push(rewind_platform::Xattr {
        name: name.as_bytes().to_vec(),
        value: value.to_vec(),
    });
    parent
        .set_user_xattrs(path.file_name().expect("name"), kind, &xs)
        .expect("set xattr");
}

/// The bytes allocated to the files below `dir` (`st_blocks`), as `du`
/// counts them.
pub fn allocated_below(dir: &Path) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let mut total = 0;
    for e in std::fs::read_dir(dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display())) {
        let e = e.expect("entry");
        let m = e.metadata().expect("stat");
        total += if m.is_dir() {
            allocated_below(&e.path())
        } else {
            m.blocks() * 512
        };
    }
    total
}

pub fn os(b: &[u8]) -> &OsStr {
    OsStr::from_bytes(b)
}

/// A chain of `levels` directories `d/d/…` below `root` with `leaf.txt`
/// at the bottom, made fd-relative (its path may pass PATH_MAX).
pub fn nest(root: &Path, levels: usize, leaf: &[u8]) {
    nest_named(root, b"d", levels, leaf);
}

/// [`nest`] with directories called `name`.
pub fn nest_named(root: &Path, name: &[u8], levels: usize, leaf: &[u8]) {
    let mut dir = rewind_platform::Dir::open(root).expect("open root");
    for _ in 0..levels {
        let _ = dir.mkdir(os(name), 0o755);
        dir = dir.open_dir(os(name)).expect("open a level");
    }
    use std::io::Write;
    dir.create_new(os(b"leaf.txt"), 0o644)
        .and_then(|mut f| {
            f.write_all(leaf)
                .map_err(|e| rewind_platform::Error::new("write", "leaf.txt", e))
        })
        .expect("write leaf");
}

/// How many `d` levels there are below `root`, and the leaf's bytes.
pub fn depth_and_leaf(root: &Path) -> (usize, Option<Vec<u8>>) {
    let mut dir = rewind_platform::Dir::open(root).expect("open root");
    let mut levels = 0;
    while let Ok(sub) = dir.open_dir(os(b"d")) {
        dir = sub;
        levels += 1;
    }
    let leaf = dir.open_read(os(b"leaf.txt")).ok().map(|(mut f, _)| {
        let mut bytes = Vec::new();
        std::io::Read::read_to_end(&mut f, &mut bytes).expect("read leaf");
        bytes
    });
    (levels, leaf)
}

/// `rewind ARGS` in `root` under `ulimit LIMIT` (`-Sn 1024`: the soft
/// limit alone; `-n N`: soft and hard).
pub fn rewind_under_ulimit(root: &Path, limit: &str, args: &str) -> std::process::Output {
    std::process::Command::new("sh")
        .arg("-c")
        .arg(format!("ulimit {limit} && exec \"$0\" {args}",))
        .arg(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(root)
        .output()
        .expect("sh")
}

/// `rewind mcp` in `cwd`, spoken to line by line over its stdin and stdout.
pub fn raw_mcp(cwd: &Path) -> std::process::Child {
    Command::new(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(cwd)
        .arg("mcp")
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run rewind mcp")
}

/// The first request of a session, as id 1.
pub const INITIALIZE: &str = r#"{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2025-06-18","capabilities":{},"clientInfo":{"name":"raw","version":"1"}}}"#;

/// The answers of `rewind mcp` in `cwd` to `lines`, written one per line
/// before its stdin closes; it must exit 0 and answer only JSON.
pub fn raw_mcp_answers(cwd: &std::path::Path, lines: &[&str]) -> Vec<serde_json::Value> {
    use std::io::Write;
    let mut child = raw_mcp(cwd);
    let mut stdin = child.stdin.take().expect("stdin");
    for l in lines {
        writeln!(stdin, "{l}").expect("write a line");
    }
    drop(stdin);
    let out = child.wait_with_output().expect("rewind mcp");
    assert!(out.status.success(), "rewind mcp exited {:?}", out.status);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("not JSON ({e}): {l}")))
        .collect()
}

/// Files left in `.rewind/tmp/` (must be none after any command finishes).
pub fn temp_leftovers(ws: &Path) -> Vec<PathBuf> {
    std::fs::read_dir(ws.join(".rewind/tmp"))
        .map(|it| it.filter_map(|e| e.ok().map(|e| e.path())).collect())
        .unwrap_or_default()
}

/// A workspace mounted with `rewind mount`; unmounted on drop (lazily if
/// the daemon cannot, so a failing test never leaks a mount).
pub struct MountGuard {
    pub dir: PathBuf,
}

impl MountGuard {
    /// `rewind mount DIR ARGS...`; `None` (with the reason) without root
    /// or /dev/fuse, outside CI.
    pub fn new(dir: &Path, args: &[&str]) -> Option<MountGuard> {
        Self::mount(dir, args, None, &[])
    }

    /// The same, with the daemon started under `ulimit -n fd_limit` (soft
    /// and hard: it can raise it again only with CAP_SYS_RESOURCE).
    pub fn with_fd_limit(dir: &Path, fd_limit: u64) -> Option<MountGuard> {
        Self::mount(dir, &[], Some(fd_limit), &[])
    }

    /// The same, with the daemon started with `env` set.
    pub fn with_env(dir: &Path, env: &[(&str, &str)]) -> Option<MountGuard> {
        Self::mount(dir, &[], None, env)
    }

    fn mount(
        dir: &Path,
        args: &[&str],
        fd_limit: Option<u64>,
        env: &[(&str, &str)],
    ) -> Option<MountGuard> {
        if !is_root() || !Path::new("/dev/fuse").exists() {
            skip_or_fail("a FUSE mount over the workspace needs root and /dev/fuse");
            return None;
        }
        let mut a = vec!["mount".to_string(), dir.display().to_string()];
        a.extend(args.iter().map(|s| s.to_string()));
        let out = match fd_limit {
            None => {
                let a: Vec<&str> = a.iter().map(String::as_str).collect();
                rewind_env(Path::new("/"), &a, env)
            }
            Some(n) => Command::new("sh")
                .arg("-c")
                .arg(format!("ulimit -n {n} && exec \"$0\" \"$@\""))
                .arg(env!("CARGO_BIN_EXE_rewind"))
                .args(&a)
                .current_dir("/")
                .output()
                .expect("run sh"),
        };
        assert!(
            out.status.success(),
            "rewind mount {}: {}",
            dir.display(),
            String::from_utf8_lossy(&out.stderr)
        );
        Some(MountGuard {
            dir: dir.to_path_buf(),
        })
    }

    /// The backing tree (where `.rewind/` is visible), as the daemon says.
    pub fn backing(&self) -> PathBuf {
        rewind_fuse::Client::connect(&self.dir)
            .expect("connect to the daemon")
            .expect("a daemon serves the mount")
            .backing_path()
            .to_path_buf()
    }

    /// The daemon's status (generation, passthrough, ...).
    pub fn status(&self) -> rewind_fuse::MountStatus {
        rewind_fuse::Client::connect(&self.dir)
            .expect("connect to the daemon")
            .expect("a daemon serves the mount")
            .status()
            .expect("daemon status")
    }

    pub fn unmount(self) {
        let out = rewind(
            Path::new("/"),
            &["unmount", &self.dir.display().to_string()],
        );
        assert!(
            out.status.success(),
            "rewind unmount: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        std::mem::forget(self);
    }
}

impl Drop for MountGuard {
    fn drop(&mut self) {
        let d = self.dir.display().to_string();
        if !rewind(Path::new("/"), &["unmount", &d]).status.success() {
            let _ = Command::new("umount")
                .arg("-l")
                .arg(&self.dir)
                .stderr(std::process::Stdio::null())
                .status();
        }
    }
}

/// A small source tree: 5 directories of 20 files, a symlink, an empty
/// directory, an executable and an xattr.
pub fn populate_src_tree(ws: &Path) {
    for d in 0..5 {
        for f in 0..20 {
            write(
                &ws.join(format!("src/d{d}/f{f}.rs")),
                format!("fn f{d}_{f}() {{}}\n").repeat(f + 1).as_bytes(),
            );
        }
    }
    std::os::unix::fs::symlink("src/d0/f0.rs", ws.join("link")).expect("symlink");
    std::fs::create_dir_all(ws.join("empty")).expect("mkdir");
    chmod(&ws.join("src/d1/f1.rs"), 0o755);
    set_xattr(&ws.join("src/d2/f2.rs"), "user.tag", b"x");
}

/// One change to a workspace made by [`populate_src_tree`].
pub type Change = (&'static str, Box<dyn Fn(&Path)>);

/// Every kind of change a capture must notice, in an order that applies
/// to a tree made by [`populate_src_tree`]: each one is a way a change
/// tracker could miss something (the mtime set back, a hard link edited
/// through its other name, a renamed directory, a type change).
pub fn every_kind_of_change() -> Vec<Change> {
    vec![
        (
            "edit in place",
            Box::new(|ws| write(&ws.join("src/d0/f0.rs"), b"edited\n")),
        ),
        (
            "same size, mtime set back",
            Box::new(|ws| {
                let p = ws.join("src/d0/f1.rs");
                let before = std::fs::read(&p).expect("read");
                let mut after = before.clone();
                after[0] ^= 0x20;
                let mtime = std::fs::metadata(&p)
                    .expect("stat")
                    .modified()
                    .expect("mtime");
                std::fs::write(&p, &after).expect("write");
                std::fs::File::options()
                    .write(true)
                    .open(&p)
                    .expect("open")
                    .set_modified(mtime)
                    .expect("set mtime");
            }),
        ),
        (
            "chmod",
            Box::new(|ws| chmod(&ws.join("src/d0/f2.rs"), 0o700)),
        ),
        (
            "xattr",
            Box::new(|ws| set_xattr(&ws.join("src/d0/f3.rs"), "user.k", b"v2")),
        ),
        (
            "new nested directories",
            Box::new(|ws| write(&ws.join("new/a/b/c.txt"), b"deep\n")),
        ),
        (
            "file moved across directories",
            Box::new(|ws| {
                std::fs::rename(ws.join("src/d2/f5.rs"), ws.join("src/d3/moved.rs")).expect("mv")
            }),
        ),
        (
            "directory renamed",
            Box::new(|ws| {
                std::fs::rename(ws.join("src/d1"), ws.join("src/renamed")).expect("mv dir")
            }),
        ),
        (
            "directory tree removed",
            Box::new(|ws| std::fs::remove_dir_all(ws.join("new/a")).expect("rm -r")),
        ),
        (
            "hard link made",
            Box::new(|ws| {
                std::fs::hard_link(ws.join("src/d0/f5.rs"), ws.join("src/d3/hl.rs")).expect("ln")
            }),
        ),
        (
            "edited through the other link",
            Box::new(|ws| write(&ws.join("src/d3/hl.rs"), b"both names see this\n")),
        ),
        (
            "symlink retargeted",
            Box::new(|ws| {
                std::fs::remove_file(ws.join("link")).expect("rm link");
                std::os::unix::fs::symlink("src/d3/f0.rs", ws.join("link")).expect("symlink");
            }),
        ),
        (
            "file became a directory",
            Box::new(|ws| {
                std::fs::remove_file(ws.join("src/d4/f0.rs")).expect("rm");
                write(&ws.join("src/d4/f0.rs/inner"), b"inner\n");
            }),
        ),
        (
            "appended at the root",
            Box::new(|ws| write(&ws.join("top.txt"), b"at the root\n")),
        ),
    ]
}

/// One round of [`checkpoint_every_kind_of_change`]: the change, the
/// checkpoint taken after it, and the tree then.
pub struct Round {
    pub what: &'static str,
    pub id: String,
    pub tree: BTreeMap<Vec<u8>, Snap>,
}

/// Make each of [`every_kind_of_change`] to `ws` (a tree from
/// [`populate_src_tree`] with a first checkpoint) and checkpoint after it
/// with `env` and `REWIND_TRACE=1`. The trace must say `scoped`: the scope
/// under test was used, not a walk. `check(what)` then looks at the round.
pub fn checkpoint_every_kind_of_change(
    ws: &Path,
    env: &[(&str, &str)],
    scoped: &str,
    mut check: impl FnMut(&str),
) -> Vec<Round> {
    let mut env = env.to_vec();
    env.push(("REWIND_TRACE", "1"));
    let mut rounds = Vec::new();
    for (what, change) in every_kind_of_change() {
        change(ws);
        let out = rewind_env(ws, &["--json", "checkpoint", what], &env);
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{what}: {err}");
        assert!(
            err.contains(scoped),
            "{what}: the checkpoint did not use the scope under test ({scoped}): {err}"
        );
        let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
        check(what);
        rounds.push(Round {
            what,
            id: c["id"].as_str().expect("id").to_string(),
            tree: snapshot(ws),
        });
    }
    rounds
}

/// D235: a capture scoped to what changed (a bulk stat, btrfs's changes,
/// the mount's dirty set) took a directory the change did not touch from
/// the stat cache, which holds no record of what its listing skipped (a
/// FIFO here). The checkpoint then recorded no skip, and once a regular
/// file stood in the FIFO's place a rewind to it deleted that file (D143's
/// loss, through a scope). With `env`, and `scoped` the trace note that
/// says the scope under test was used.
pub fn a_skip_the_scope_did_not_touch_is_still_recorded(
    ws: &Path,
    env: &[(&str, &str)],
    scoped: &str,
) {
    let skipped = |v: &serde_json::Value| -> Vec<String> {
        v["skipped"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|s| s["path"].as_str().map(str::to_string))
            .collect()
    };
    write(&ws.join("skips/s"), b"s\n");
    let fifo = ws.join("skips/p");
    let c = std::ffi::CString::new(fifo.as_os_str().as_bytes()).expect("path");
    // SAFETY: a valid C string; mkfifo keeps no pointer.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o644) }, 0, "mkfifo");
    let out = rewind_env(ws, &["--json", "checkpoint", "with-fifo"], env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    // The btrfs engine acknowledges at the snapshot, before its manifest
    // says what it skipped: there the rewind below is the test.
    let reports_skips = v["engine"] != "btrfs";
    if reports_skips {
        assert_eq!(skipped(&v), ["skips/p"], "{v}");
    }
    write(&ws.join("elsewhere.txt"), b"a change outside skips/\n");
    let mut traced = env.to_vec();
    traced.push(("REWIND_TRACE", "1"));
    let out = rewind_env(ws, &["--json", "checkpoint", "scoped"], &traced);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(
        err.contains(scoped),
        "the scope under test ({scoped}) was not used: {err}"
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    if reports_skips {
        assert_eq!(
            skipped(&v),
            ["skips/p"],
            "the scoped checkpoint recorded no skip: {v}"
        );
    }
    let id = v["id"].as_str().expect("id").to_string();
    let out = rewind_env(ws, &["--json", "status"], env);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    assert_eq!(skipped(&v), ["skips/p"], "status: {v}");
    std::fs::remove_file(&fifo).expect("rm fifo");
    write(&fifo, b"precious\n");
    let out = rewind_env(ws, &["--json", "rewind", &id], env);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(
        std::fs::read(&fifo).ok().as_deref(),
        Some(&b"precious\n"[..]),
        "the rewind deleted what its checkpoint skipped: {}",
        String::from_utf8_lossy(&out.stdout)
    );
}

/// Rewind to every round, newest first: each gives back exactly its tree.
pub fn rewind_to_every_round(ws: &Path, rounds: &[Round]) {
    for r in rounds.iter().rev() {
        rewind_json(ws, &["rewind", &r.id]);
        assert_same(&format!("rewind to \"{}\"", r.what), &r.tree, &snapshot(ws));
    }
}

/// A `.rewindignore` changes what is captured below it: the next
/// checkpoint (with `env`) must no longer hold the file it names, which
/// checkpoint `before` held.
pub fn a_new_ignore_file_drops_what_it_names(ws: &Path, before: &str, env: &[(&str, &str)]) {
    write(&ws.join("src/d0/.rewindignore"), b"f4.rs\n");
    let out = rewind_env(ws, &["--json", "checkpoint", "ignore"], env);
    assert!(out.status.success());
    let c: serde_json::Value = serde_json::from_slice(&out.stdout).expect("json");
    let d = rewind_json(ws, &["diff", before, c["id"].as_str().expect("id")]);
    assert!(
        d["changes"]
            .as_array()
            .expect("changes")
            .iter()
            .any(|c| c["path"] == "src/d0/f4.rs"),
        "the newly ignored file is still in the checkpoint: {d}"
    );
}

/// Run git in `dir` with a fixed identity and branch name; its stdout.
/// Fails the test when git does.
pub fn git(dir: &Path, args: &[&str]) -> String {
    let out = Command::new("git")
        .current_dir(dir)
        .args([
            "-c",
            "user.name=t",
            "-c",
            "user.email=t@t",
            "-c",
            "init.defaultBranch=main",
            "-c",
            "advice.detachedHead=false",
        ])
        .args(args)
        .output()
        .expect("git");
    assert!(
        out.status.success(),
        "git {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The paths of a `status` or `diff` JSON's `changes`, in its order.
pub fn changed_paths(v: &serde_json::Value) -> Vec<&str> {
    paths_in(v, "changes")
}

/// The `path` of each item of the array `v[key]` (a report's `kept`, a
/// dry run's `plan`).
pub fn paths_in<'a>(v: &'a serde_json::Value, key: &str) -> Vec<&'a str> {
    v[key]
        .as_array()
        .unwrap_or_else(|| panic!("no array {key:?} in {v}"))
        .iter()
        .filter_map(|c| c["path"].as_str())
        .collect()
}

/// The names of the object files in a workspace's store (shard + name),
/// wherever the layout keeps them.
pub fn object_files(ws: &Path) -> std::collections::BTreeSet<String> {
    let mut out = std::collections::BTreeSet::new();
    for objects in [ws.join(".rewind/objects"), ws.join(".rewind/state/objects")] {
        let Ok(shards) = std::fs::read_dir(&objects) else {
            continue;
        };
        for shard in shards.flatten() {
            let Ok(files) = std::fs::read_dir(shard.path()) else {
                continue;
            };
            for f in files.flatten() {
                out.insert(format!(
                    "{}/{}",
                    shard.file_name().to_string_lossy(),
                    f.file_name().to_string_lossy()
                ));
            }
        }
    }
    out
}

/// Wait until process `pid` is stopped (at a failpoint with
/// `REWIND_FAILPOINT_ACTION=stop`).
pub fn wait_stopped(pid: u32) {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(20);
    loop {
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
        if stat
            .rsplit(')')
            .next()
            .is_some_and(|rest| rest.trim_start().starts_with('T'))
        {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "process {pid} never stopped at the failpoint"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
}

/// `rewind ARGS` in `cwd`, its output piped, stopped (SIGSTOP) at the
/// named failpoint: returned once it is. [`resume`] lets it go on.
pub fn spawn_stopped_at(cwd: &Path, args: &[&str], failpoint: &str) -> std::process::Child {
    spawn_stopped_at_with(cwd, args, failpoint, &[])
}

/// [`spawn_stopped_at`] with more environment variables set.
pub fn spawn_stopped_at_with(
    cwd: &Path,
    args: &[&str],
    failpoint: &str,
    envs: &[(&str, &str)],
) -> std::process::Child {
    let child = Command::new(env!("CARGO_BIN_EXE_rewind"))
        .current_dir(cwd)
        .args(args)
        .envs(envs.iter().copied())
        .env("REWIND_FAILPOINT", failpoint)
        .env("REWIND_FAILPOINT_ACTION", "stop")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .expect("spawn rewind");
    wait_stopped(child.id());
    child
}

/// SIGCONT to a process [`spawn_stopped_at`] stopped.
pub fn resume(child: &std::process::Child) {
    let cont = Command::new("kill")
        .arg("-CONT")
        .arg(child.id().to_string())
        .status()
        .expect("kill -CONT");
    assert!(cont.success(), "kill -CONT failed");
}

/// `rewind --json ARGS` in `cwd`, stopped at `failpoint` while `during`
/// changes the tree (another program at work mid-rewind), then let go on;
/// its JSON answer, once it has succeeded.
pub fn rewind_json_stopped_at(
    cwd: &Path,
    args: &[&str],
    failpoint: &str,
    during: impl FnOnce(),
) -> serde_json::Value {
    let child = spawn_stopped_at(cwd, &[&["--json"][..], args].concat(), failpoint);
    during();
    let out = resume_to_success(child);
    serde_json::from_slice(&out.stdout).expect("json")
}

/// [`resume`] a process [`spawn_stopped_at`] stopped, and wait for it to
/// succeed: its output.
pub fn resume_to_success(child: std::process::Child) -> Output {
    resume(&child);
    let out = child.wait_with_output().expect("wait");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// The rewind report `v` warns that `file` was open for writing by `pid`
/// when the rewind replaced it, and does not name `other` (D220, D244).
/// Returns the warning.
pub fn assert_held_open_named(v: &serde_json::Value, file: &str, pid: u32, other: &str) -> String {
    let warning = v["warning"]
        .as_str()
        .unwrap_or_else(|| panic!("no warning: {v}"))
        .to_owned();
    assert!(
        warning.contains("open for writing") && warning.contains(file),
        "{warning}"
    );
    assert!(warning.contains(&format!("pid {pid}")), "{warning}");
    assert!(!warning.contains(other), "{warning}");
    warning
}

/// A 4096-byte shared mapping of a file, unmapped on drop; its descriptor
/// kept open with it, or closed once mapped (the usual C pattern).
pub struct SharedMap {
    map: *mut libc::c_void,
    _file: Option<std::fs::File>,
}

impl SharedMap {
    pub fn of(path: &Path, keep_fd: bool) -> SharedMap {
        let file = std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .open(path)
            .expect("open for the mapping");
        // SAFETY: a fresh shared mapping of 4096 bytes of an open file,
        // used only through `put` and unmapped on drop.
        let map = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                std::os::fd::AsRawFd::as_raw_fd(&file),
                0,
            )
        };
        assert_ne!(map, libc::MAP_FAILED, "mmap {}", path.display());
        SharedMap {
            map,
            _file: keep_fd.then_some(file),
        }
    }

    pub fn put(&self, bytes: &[u8; 8]) {
        // SAFETY: `map` is 4096 writable bytes.
        unsafe { std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.map.cast::<u8>(), 8) }
    }
}

impl Drop for SharedMap {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `of`, no longer used.
        unsafe { libc::munmap(self.map, 4096) };
    }
}

/// Another process writing through a 4096-byte shared mapping of a file,
/// 8 bytes at offset 0 per [`MappedWriter::put`]; its descriptor kept
/// open, or closed once mapped. Another process, not this one: a process
/// holding a mapping of a file in a FUSE mount writes the mapping back
/// whenever a copy of it is unmapped, and every `rewind` this test
/// spawns would copy it (at fork) and unmap it (at exec), flushing what
/// the test must show unflushed. `None` (the test skips) without
/// `python3`, except under CI.
pub struct MappedWriter {
    child: std::process::Child,
    stdin: std::process::ChildStdin,
    stdout: std::io::BufReader<std::process::ChildStdout>,
}

const MAPPED_WRITER: &str = r#"
import ctypes, os, sys
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
fd = os.open(sys.argv[1], os.O_RDWR)
addr = libc.mmap(None, 4096, 3, 1, fd, 0)  # PROT_READ|PROT_WRITE, MAP_SHARED
if addr is None or addr == ctypes.c_void_p(-1).value:
    sys.exit("mmap: errno %d" % ctypes.get_errno())
if sys.argv[2] == "close":
    os.close(fd)
print("mapped", flush=True)
while True:
    line = sys.stdin.readline()
    if not line:
        break
    b = line.strip().encode()[:8]
    ctypes.memmove(addr, b, len(b))
    print("ok", flush=True)
"#;

impl MappedWriter {
    pub fn spawn(path: &Path, keep_fd: bool) -> Option<MappedWriter> {
        let child = Command::new("python3")
            .arg("-c")
            .arg(MAPPED_WRITER)
            .arg(path)
            .arg(if keep_fd { "keep" } else { "close" })
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn();
        let mut child = match child {
            Ok(c) => c,
            Err(e) => {
                assert!(
                    std::env::var_os("CI").is_none(),
                    "python3 is needed for the mapped writer under CI: {e}"
                );
                eprintln!("SKIP: no python3 for the mapped writer: {e}");
                return None;
            }
        };
        let stdin = child.stdin.take().expect("stdin");
        let stdout = std::io::BufReader::new(child.stdout.take().expect("stdout"));
        let mut w = MappedWriter {
            child,
            stdin,
            stdout,
        };
        w.expect("mapped", path);
        Some(w)
    }

    fn expect(&mut self, what: &str, path: &Path) {
        let mut line = String::new();
        std::io::BufRead::read_line(&mut self.stdout, &mut line).expect("read the writer");
        assert_eq!(line.trim(), what, "mapped writer of {}", path.display());
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Write `bytes` through the mapping; returns once they are written.
    pub fn put(&mut self, bytes: &[u8; 8]) {
        let text = std::str::from_utf8(bytes).expect("ASCII");
        writeln!(self.stdin, "{text}").expect("ask the writer");
        self.stdin.flush().expect("flush");
        self.expect("ok", Path::new("(mapping)"));
    }
}

impl Drop for MappedWriter {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bytes from a xorshift generator: content no two seeds share.
pub fn pseudo_random(len: usize, seed: u64) -> Vec<u8> {
    let mut x = seed;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            (x >> 24) as u8
        })
        .collect()
}

/// What each capture of `rewind ARGS` (in `ws`, with `env` added) did,
/// from its `REWIND_TRACE` note: (files read, files a rewind restored
/// taken as written). The notes are read from the trace file `env` names
/// (a mount's daemon was started with it too), or a new one. Panics
/// unless it exits 0.
pub fn capture_notes(ws: &Path, args: &[&str], env: &[(&str, &str)]) -> Vec<(u64, u64)> {
    static CALLS: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
    let call = CALLS.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let own = std::env::temp_dir().join(format!("rewind-trace-{}-{call}.log", std::process::id()));
    let file = match env.iter().find(|(k, _)| *k == "REWIND_TRACE") {
        Some((_, v)) => PathBuf::from(v),
        None => own.clone(),
    };
    let read = || std::fs::read_to_string(&file).unwrap_or_default();
    let before = read().len();
    let trace = file.display().to_string();
    let env = [env, &[("REWIND_TRACE", trace.as_str())]].concat();
    let out = rewind_env(ws, args, &env);
    let notes = read().split_off(before);
    let _ = std::fs::remove_file(&own);
    assert!(
        out.status.success(),
        "rewind {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    notes
        .lines()
        .filter_map(|l| l.split_once("note: capture: ").map(|(_, n)| n))
        .map(|n| {
            let words: Vec<&str> = n.split_whitespace().collect();
            let num = |i: usize| words.get(i).and_then(|w| w.parse().ok()).expect(n);
            (num(0), num(5))
        })
        .collect()
}

/// A rewind records the stat of each file of 64 KiB or more it puts in
/// place (D275): the next `status` and checkpoint take its content as
/// written instead of reading it all again (4-6 s for 5 GiB), and a change
/// made since, even one whose mtime was put back by hand, is still seen.
/// `env` goes to every command (the engine's settings).
pub fn a_restored_file_is_not_read_again_until_it_changes(ws: &Path, env: &[(&str, &str)]) {
    let run = |args: &[&str]| {
        let out = rewind_env(ws, &[&["--json"], args].concat(), env);
        assert!(
            out.status.success(),
            "rewind {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).expect("json")
    };
    let big = ws.join("data.bin");
    write(&big, &pseudo_random(1 << 20, 1));
    write(&ws.join("small.txt"), b"small\n");
    run(&["checkpoint", "a"]);
    write(&big, &pseudo_random(1 << 20, 2));
    run(&["checkpoint", "b"]);
    run(&["rewind", "a"]);
    assert_eq!(std::fs::read(&big).expect("big"), pseudo_random(1 << 20, 1));
    assert_eq!(
        capture_notes(ws, &["status"], env),
        [(0, 1)],
        "status read the file the rewind had just restored"
    );
    let c = run(&["checkpoint", "c"]);
    let none = serde_json::json!({"added": 0, "modified": 0, "deleted": 0});
    assert_eq!(c["changes"], none, "{c}");

    // Changed in place since, size kept and mtime put back: ctime says so.
    run(&["rewind", "b"]);
    let mtime = std::fs::metadata(&big)
        .and_then(|m| m.modified())
        .expect("mtime");
    let f = std::fs::OpenOptions::new()
        .write(true)
        .open(&big)
        .expect("open");
    std::os::unix::fs::FileExt::write_at(&f, b"changed", 4096).expect("write");
    f.set_modified(mtime).expect("set mtime");
    drop(f);
    let status = run(&["status"]);
    assert_eq!(changed_paths(&status), ["data.bin"], "{status}");
    assert_eq!(capture_notes(ws, &["status"], env), [(1, 0)]);
    let d = run(&["checkpoint", "d"]);
    assert_eq!(d["changes"]["modified"], 1, "{d}");
    let changed = std::fs::read(&big).expect("big");
    run(&["rewind", "a"]);
    run(&["rewind", "d"]);
    assert_eq!(std::fs::read(&big).expect("big"), changed);
}

/// Every file below `dir` (what is not a directory), depth first.
pub fn files_below(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(files_below(&p));
        } else {
            out.push(p);
        }
    }
    out
}

/// Whether util-linux's `script` is there to give rewind a terminal (CI
/// must have it; elsewhere the test says it skips).
pub fn has_script() -> bool {
    if Command::new("script").arg("--version").output().is_ok() {
        return true;
    }
    skip_or_fail("no `script` (util-linux) to give rewind a terminal");
    false
}

/// What `rewind ARGS` run in `root` under `script` showed, stderr a
/// terminal and progress lines drawn at once; it must succeed.
pub fn in_a_terminal(root: &Path, args: &str) -> String {
    let out = Command::new("script")
        .args([
            "-qec",
            &format!("{} {args}", env!("CARGO_BIN_EXE_rewind")),
            "/dev/null",
        ])
        .current_dir(root)
        .env("REWIND_PROGRESS_DELAY_MS", "0")
        .output()
        .expect("script");
    let shown = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(out.status.success(), "{args}: {shown}");
    shown
}

/// `rewind ARGS` in `cwd` with `envs`, its streams piped, and SIGINT,
/// SIGHUP and SIGTERM at their default: a non-interactive shell's `cmd &`
/// ignores SIGINT, and rewind leaves an ignored signal ignored (D353).
pub fn spawn_with_default_signals(
    cwd: &Path,
    args: &[&str],
    envs: &[(&str, &str)],
) -> std::process::Child {
    use std::os::unix::process::CommandExt;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_rewind"));
    cmd.current_dir(cwd)
        .args(args)
        .envs(envs.iter().copied())
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    // SAFETY: signal(2) only, between fork and exec.
    unsafe {
        cmd.pre_exec(|| {
            for sig in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM] {
                libc::signal(sig, libc::SIG_DFL);
            }
            Ok(())
        });
    }
    cmd.spawn().expect("spawn rewind")
}

/// Whether process `pid` has a handler for `sig` (`SigCgt` in its
/// `/proc/PID/status`); false once it is gone.
pub fn catches(pid: u32, sig: i32) -> bool {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigCgt:"))
        .and_then(|mask| u64::from_str_radix(mask.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (sig - 1)) != 0)
}

/// Send `sig` to process `pid`.
pub fn signal(pid: u32, sig: i32) {
    // SAFETY: plain kill(2).
    assert_eq!(unsafe { libc::kill(pid as i32, sig) }, 0, "kill {pid}");
}
