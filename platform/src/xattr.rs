use std::os::fd::BorrowedFd;

use rustix::io::Errno;

/// One extended attribute: name bytes (with its namespace prefix) and value.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Xattr {
    pub name: Vec<u8>,
    pub value: Vec<u8>,
}

const USER_PREFIX: &[u8] = b"user.";

/// A file's POSIX ACLs, as the kernel stores them.
const ACL_NAMES: [&[u8]; 2] = [b"system.posix_acl_access", b"system.posix_acl_default"];

/// The xattrs rewind records and restores: the `user.*` namespace, and
/// POSIX ACLs. Without the ACLs a file of mode 600 with `u:bob:rw` came
/// back 660, its group bits being the ACL's mask: a rewind gave its group
/// access (D145). Not `security.*` or `trusted.*` (the system's labels).
fn is_restored(name: &[u8]) -> bool {
    name.starts_with(USER_PREFIX) || ACL_NAMES.contains(&name)
}

/// The xattrs rewind restores ([`is_restored`]) of an open file or
/// directory, sorted by name. Filesystems without xattr support answer
/// an empty list.
pub(crate) fn list_user(fd: BorrowedFd<'_>) -> std::io::Result<Vec<Xattr>> {
    list_where(fd, is_restored)
}

/// The xattrs of an open file or directory whose names `keep` accepts
/// (names with their namespace prefix), sorted by name.
pub(crate) fn list_where(
    fd: BorrowedFd<'_>,
    keep: impl Fn(&[u8]) -> bool,
) -> std::io::Result<Vec<Xattr>> {
    let names = loop {
        let size = match rustix::fs::flistxattr_query(fd) {
            Ok(0) => return Ok(Vec::new()),
            Ok(n) => n,
            Err(Errno::OPNOTSUPP) => return Ok(Vec::new()),
            Err(e) => return Err(e.into()),
        };
        let mut buf = vec![0u8; size];
        match rustix::fs::flistxattr(fd, &mut buf) {
            Ok(n) => {
                buf.truncate(n);
                break buf;
            }
            Err(Errno::RANGE) => continue, // grew between the two calls
            Err(e) => return Err(e.into()),
        }
    };
    let mut out = Vec::new();
    for name in names
        .split(|&b| b == 0)
        .filter(|n| !n.is_empty() && keep(n))
    {
        let Ok(cname) = std::ffi::CString::new(name) else {
            continue;
        };
        let value = loop {
            let size = match rustix::fs::fgetxattr_query(fd, cname.as_c_str()) {
                Ok(n) => n,
                Err(Errno::NODATA) => break None, // removed meanwhile
                Err(e) => return Err(e.into()),
            };
            let mut buf = vec![0u8; size];
            if size == 0 {
                break Some(buf);
            }
            match rustix::fs::fgetxattr(fd, cname.as_c_str(), &mut buf) {
                Ok(n) => {
                    buf.truncate(n);
                    break Some(buf);
                }
                Err(Errno::RANGE) => continue,
                Err(Errno::NODATA) => break None,
                Err(e) => return Err(e.into()),
            }
        };
        if let Some(value) = value {
            out.push(Xattr {
                name: name.to_vec(),
                value,
            });
        }
    }
    out.sort();
    Ok(out)
}

/// Make the restored xattrs ([`is_restored`]) of `fd` exactly `want`: set
/// what differs, remove what is extra. Other namespaces (security.*,
/// trusted.*) are left alone, and never set, whatever `want` holds: a
/// manifest forged to carry `security.capability` made a rewind run as
/// root give a file of the user's `cap_setuid` (helper-20, D160).
pub(crate) fn set_user(fd: BorrowedFd<'_>, want: &[Xattr]) -> std::io::Result<()> {
    let have = list_user(fd)?;
    for x in &have {
        if !want.iter().any(|w| w.name == x.name) {
            let name = std::ffi::CString::new(x.name.clone()).map_err(std::io::Error::other)?;
            match rustix::fs::fremovexattr(fd, name.as_c_str()) {
                Ok(()) | Err(Errno::NODATA) => {}
                Err(e) => return Err(e.into()),
            }
        }
    }
    add(
        fd,
        want.iter()
            .filter(|w| is_restored(&w.name) && !have.contains(w)),
    )
}

/// Set each of `xs` on `fd` (nothing is removed): for a file just made,
/// with xattrs read from another file (`init --subvolume` carries every
/// namespace root may). What a manifest holds goes through [`set_user`].
pub(crate) fn add<'x>(
    fd: BorrowedFd<'_>,
    xs: impl IntoIterator<Item = &'x Xattr>,
) -> std::io::Result<()> {
    for x in xs {
        let name = std::ffi::CString::new(x.name.clone()).map_err(std::io::Error::other)?;
        rustix::fs::fsetxattr(
            fd,
            name.as_c_str(),
            &x.value,
            rustix::fs::XattrFlags::empty(),
        )?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::fd::AsFd;

    /// Only names rewind restores are set, whatever a manifest holds
    /// (D160): as root, a forged `security.capability` or `trusted.*` was
    /// set on a file given to a user.
    #[test]
    fn only_restored_names_are_ever_set() {
        let dir = tempfile::tempdir().expect("tempdir");
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path).expect("create");
        let want = [
            Xattr {
                name: b"trusted.rewind-test".to_vec(),
                value: b"x".to_vec(),
            },
            Xattr {
                name: b"user.kept".to_vec(),
                value: b"y".to_vec(),
            },
        ];
        match set_user(file.as_fd(), &want) {
            Ok(()) => {}
            // No user xattrs here (tmpfs without them): nothing to check.
            Err(e) if e.raw_os_error() == Some(libc::ENOTSUP) => return,
            Err(e) => panic!("add: {e}"),
        }
        let all = list_where(file.as_fd(), |_| true).expect("list");
        let names: Vec<&[u8]> = all.iter().map(|x| x.name.as_slice()).collect();
        assert!(names.contains(&b"user.kept".as_slice()), "{names:?}");
        assert!(
            !names.contains(&b"trusted.rewind-test".as_slice()),
            "{names:?}"
        );
    }
}
