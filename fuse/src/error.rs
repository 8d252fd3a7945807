use std::path::PathBuf;

/// Everything that can go wrong in the overlay, with the path it concerns.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{op} {path}: {source}")]
    Io {
        op: &'static str,
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "{path} is already mounted by rewind (daemon pid {pid}); `rewind unmount {path}` first"
    )]
    AlreadyMounted { path: PathBuf, pid: u32 },
    #[error("the rewind daemon for {path} is gone (its control socket refuses connections)")]
    DaemonGone { path: PathBuf },
    #[error("the rewind daemon for {path} answered: {message}")]
    Daemon { path: PathBuf, message: String },
    #[error("cannot unmount {path}: it is busy ({holders}); close them and retry")]
    Busy { path: PathBuf, holders: String },
}

impl Error {
    pub(crate) fn io(op: &'static str, path: impl Into<PathBuf>, source: std::io::Error) -> Error {
        Error::Io {
            op,
            path: path.into(),
            source,
        }
    }
}

pub type Result<T> = std::result::Result<T, Error>;
