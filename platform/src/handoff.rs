//! Handing a command to another process over a Unix socket: its standard
//! streams travel as file descriptors (`SCM_RIGHTS`), so the process that
//! runs it writes to the caller's terminal, pipe or file directly; the
//! caller's hangup is seen with `poll`; and the standard streams of the
//! running process are swapped for the caller's while it runs.

use std::io::{self, IoSlice, IoSliceMut, Read, Write};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::net::UnixStream;

use rustix::event::{PollFd, PollFlags, poll};
use rustix::net::{
    RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, SendAncillaryBuffer,
    SendAncillaryMessage, SendFlags, recvmsg, sendmsg,
};

/// At most this many descriptors travel with one message.
const MAX_FDS: usize = 3;

/// Send `data` with `fds` (at most `MAX_FDS`) attached to its first
/// byte.
pub fn send_with_fds(sock: &UnixStream, data: &[u8], fds: &[BorrowedFd<'_>]) -> io::Result<()> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = SendAncillaryBuffer::new(&mut space);
    if fds.len() > MAX_FDS || !control.push(SendAncillaryMessage::ScmRights(fds)) {
        return Err(io::Error::other("too many descriptors for one message"));
    }
    let sent = loop {
        match sendmsg(
            sock,
            &[IoSlice::new(data)],
            &mut control,
            SendFlags::NOSIGNAL,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?,
        }
    };
    // A stream socket may take the rest in later writes; the descriptors
    // rode with the first byte.
    (&*sock).write_all(&data[sent..])
}

/// Send `data` with this process's standard input, output and error.
pub fn send_with_stdio(sock: &UnixStream, data: &[u8]) -> io::Result<()> {
    let stdio = [
        rustix::stdio::stdin(),
        rustix::stdio::stdout(),
        rustix::stdio::stderr(),
    ];
    send_with_fds(sock, data, &stdio)
}

/// Receive exactly `buf.len()` bytes and the descriptors sent with them
/// (close-on-exec). Fails on a peer that closes first.
pub fn recv_with_fds(sock: &UnixStream, buf: &mut [u8]) -> io::Result<Vec<OwnedFd>> {
    let mut space = [MaybeUninit::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
    let mut control = RecvAncillaryBuffer::new(&mut space);
    let got = loop {
        match recvmsg(
            sock,
            &mut [IoSliceMut::new(buf)],
            &mut control,
            RecvFlags::CMSG_CLOEXEC,
        ) {
            Err(rustix::io::Errno::INTR) => continue,
            r => break r?.bytes,
        }
    };
    let mut fds = Vec::new();
    for msg in control.drain() {
        if let RecvAncillaryMessage::ScmRights(received) = msg {
            fds.extend(received);
        }
    }
    if got == 0 && !buf.is_empty() {
        return Err(io::ErrorKind::UnexpectedEof.into());
    }
    (&*sock).read_exact(&mut buf[got..])?;
    Ok(fds)
}

/// The process id at the other end of `sock` (as of its connect).
pub fn peer_pid(sock: &UnixStream) -> io::Result<u32> {
    let cred = rustix::net::sockopt::socket_peercred(sock)?;
    Ok(cred.pid.as_raw_nonzero().get() as u32)
}

/// The user the process at the other end of `sock` runs as (as of its
/// connect).
pub fn peer_uid(sock: &UnixStream) -> io::Result<u32> {
    Ok(rustix::net::sockopt::socket_peercred(sock)?.uid.as_raw())
}

/// What [`watch`] saw first.
#[derive(Debug, PartialEq, Eq)]
pub enum Watched {
    /// `wake` became readable.
    Woken,
    /// The peer hung up.
    HungUp,
    /// A connection waits on the listener.
    Incoming,
}

/// Wait until `wake` is readable, the peer of `peer` hangs up, or a
/// connection waits on `listener`; in that order of precedence.
pub fn watch(
    peer: BorrowedFd<'_>,
    wake: BorrowedFd<'_>,
    listener: BorrowedFd<'_>,
) -> io::Result<Watched> {
    let mut fds = [
        PollFd::new(&wake, PollFlags::IN),
        PollFd::new(&peer, PollFlags::RDHUP),
        PollFd::new(&listener, PollFlags::IN),
    ];
    poll_retrying(&mut fds)?;
    let hung = PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR;
    Ok(if !fds[0].revents().is_empty() {
        Watched::Woken
    } else if fds[1].revents().intersects(hung) {
        Watched::HungUp
    } else {
        Watched::Incoming
    })
}

/// How [`child_or_hangup`] ended.
#[derive(Debug, PartialEq, Eq)]
pub enum Ended {
    /// The child exited (it is not reaped: wait for it).
    Child,
    /// The peer hung up first.
    HungUp,
}

/// Wait until the child `pid` exits or the peer of `peer` hangs up,
/// whichever comes first (a pidfd: no signal handler, no second thread).
pub fn child_or_hangup(peer: BorrowedFd<'_>, pid: u32) -> io::Result<Ended> {
    let pid = rustix::process::Pid::from_raw(pid as i32)
        .ok_or_else(|| io::Error::from(io::ErrorKind::InvalidInput))?;
    let child = rustix::process::pidfd_open(pid, rustix::process::PidfdFlags::empty())?;
    let mut fds = [
        PollFd::new(&child, PollFlags::IN),
        PollFd::new(&peer, PollFlags::RDHUP),
    ];
    poll_retrying(&mut fds)?;
    Ok(if !fds[0].revents().is_empty() {
        Ended::Child
    } else {
        Ended::HungUp
    })
}

/// Wait until `fd` is readable.
pub fn wait_readable(fd: BorrowedFd<'_>) -> io::Result<()> {
    poll_retrying(&mut [PollFd::new(&fd, PollFlags::IN)])
}

fn poll_retrying(fds: &mut [PollFd<'_>]) -> io::Result<()> {
    loop {
        match poll(fds, None) {
            Ok(_) => return Ok(()),
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Read until `buf` is full or the peer closes, in one wakeup
/// (`MSG_WAITALL`); returns how much came.
pub fn recv_all(sock: &UnixStream, buf: &mut [u8]) -> io::Result<usize> {
    let mut got = 0;
    while got < buf.len() {
        match rustix::net::recv(sock, &mut buf[got..], RecvFlags::WAITALL) {
            Ok((0, _)) => break,
            Ok((n, _)) => got += n,
            Err(rustix::io::Errno::INTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
    Ok(got)
}

/// This process's standard input, output and error, swapped for another
/// process's while a guard lives; restored when it drops.
pub struct StdioSwap {
    saved: [OwnedFd; 3],
}

impl StdioSwap {
    /// Point fds 0, 1 and 2 at `stdio` (in that order).
    pub fn new(stdio: &[OwnedFd; 3]) -> io::Result<StdioSwap> {
        let saved = [
            rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdin(), 3)?,
            rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stdout(), 3)?,
            rustix::io::fcntl_dupfd_cloexec(rustix::stdio::stderr(), 3)?,
        ];
        let swap = StdioSwap { saved };
        swap.point_at([stdio[0].as_fd(), stdio[1].as_fd(), stdio[2].as_fd()])?;
        Ok(swap)
    }

    fn point_at(&self, fds: [BorrowedFd<'_>; 3]) -> io::Result<()> {
        rustix::stdio::dup2_stdin(fds[0])?;
        rustix::stdio::dup2_stdout(fds[1])?;
        rustix::stdio::dup2_stderr(fds[2])?;
        Ok(())
    }
}

impl Drop for StdioSwap {
    fn drop(&mut self) {
        // A reader that left (`| head -1`) fails the flush, and std keeps
        // the unsent bytes in its stdout buffer: the next command's
        // stdout got them first, before its own JSON (helper-93). They
        // are drained into /dev/null instead.
        if io::stdout().flush().is_err()
            && let Ok(null) = std::fs::OpenOptions::new().write(true).open("/dev/null")
        {
            let _ = rustix::stdio::dup2_stdout(&null);
            let _ = io::stdout().flush();
        }
        let [a, b, c] = &self.saved;
        let _ = self.point_at([a.as_fd(), b.as_fd(), c.as_fd()]);
    }
}

/// Set the file mode creation mask; returns the previous one.
pub fn set_umask(mask: u32) -> u32 {
    rustix::process::umask(rustix::fs::Mode::from_raw_mode(mask)).bits()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descriptors_and_bytes_arrive_together() {
        let (a, b) = UnixStream::pair().unwrap();
        let (r, mut w) = UnixStream::pair().unwrap();
        let payload = vec![7u8; 200_000];
        let sender = std::thread::spawn(move || {
            send_with_fds(&a, &payload, &[r.as_fd()]).unwrap();
        });
        let mut buf = vec![0u8; 200_000];
        let fds = recv_with_fds(&b, &mut buf).unwrap();
        sender.join().unwrap();
        assert!(buf.iter().all(|&x| x == 7));
        assert_eq!(fds.len(), 1);
        w.write_all(b"through").unwrap();
        let mut got = [0u8; 7];
        std::fs::File::from(fds.into_iter().next().unwrap())
            .read_exact(&mut got)
            .unwrap();
        assert_eq!(&got, b"through");
    }

    #[test]
    fn a_wake_comes_before_a_hangup_and_a_hangup_before_a_connection() {
        let dir = tempfile::tempdir().unwrap();
        let listener = std::os::unix::net::UnixListener::bind(dir.path().join("s")).unwrap();
        let (a, b) = UnixStream::pair().unwrap();
        let (wake_r, wake_w) = UnixStream::pair().unwrap();
        let _client = UnixStream::connect(dir.path().join("s")).unwrap();
        let seen = || watch(a.as_fd(), wake_r.as_fd(), listener.as_fd()).unwrap();
        assert_eq!(seen(), Watched::Incoming);
        drop(b);
        assert_eq!(seen(), Watched::HungUp);
        (&wake_w).write_all(b"x").unwrap();
        assert_eq!(seen(), Watched::Woken);
        assert_eq!(
            peer_uid(&wake_r).unwrap(),
            rustix::process::geteuid().as_raw()
        );
    }

    #[test]
    fn recv_all_returns_what_came_before_the_peer_closed() {
        let (a, b) = UnixStream::pair().unwrap();
        (&b).write_all(&[1, 2]).unwrap();
        drop(b);
        let mut buf = [0u8; 5];
        assert_eq!(recv_all(&a, &mut buf).unwrap(), 2);
        assert_eq!(&buf[..2], &[1, 2]);
    }
}
