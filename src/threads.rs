//! Splitting a list of independent blocking calls over a few threads.

use crate::error::{Error, Result};

/// Run `f` over `items` in up to `threads` contiguous parts at once (on
/// the calling thread alone for one part), and give back the first error.
/// For calls that wait on the device rather than the CPU (fsyncs), where
/// the filesystem batches concurrent waiters.
pub fn in_parts<T: Sync>(
    items: &[T],
    threads: usize,
    f: impl Fn(&[T]) -> Result<()> + Sync,
) -> Result<()> {
    let threads = items.len().min(threads);
    if threads <= 1 {
        return f(items);
    }
    let f = &f;
    std::thread::scope(|s| {
        let running: Vec<_> = items
            .chunks(items.len().div_ceil(threads))
            .map(|part| s.spawn(move || f(part)))
            .collect();
        let mut out = Ok(());
        for t in running {
            let r = t
                .join()
                .unwrap_or_else(|_| Err(Error::Usage("internal: a worker thread panicked".into())));
            out = out.and(r);
        }
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Mutex;

    #[test]
    fn every_item_is_visited_once_and_an_error_is_given_back() {
        for threads in [0, 1, 3, 8, 40] {
            let seen = Mutex::new(Vec::new());
            let items: Vec<u32> = (0..20).collect();
            in_parts(&items, threads, |part| {
                seen.lock().expect("lock").extend_from_slice(part);
                Ok(())
            })
            .expect("no error");
            let mut seen = seen.into_inner().expect("lock");
            seen.sort();
            assert_eq!(seen, items, "{threads} threads");
            let failed = in_parts(&items, threads, |part| match part.contains(&13) {
                true => Err(Error::Usage("13".into())),
                false => Ok(()),
            });
            assert!(failed.is_err(), "{threads} threads: the error is lost");
        }
    }
}
