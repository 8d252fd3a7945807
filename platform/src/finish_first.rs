//! Work that must not be left half done, told to stop (D353).
//!
//! A rewind stopped between its first and last change to the tree leaves
//! one that is neither the old tree nor the target until the next command
//! finishes it. Nothing is lost (the intent is in the ledger), but a user
//! who pressed Ctrl-C and then opens an editor sees the mix. So while a
//! [`FinishFirst`] lives, the first SIGINT or SIGHUP only says that the
//! work finishes first; a second one, or a SIGTERM (a supervisor that
//! will not wait), says what was left and ends the process by that
//! signal, as the default action would have. After the work, the caller
//! ends the process by a deferred signal with [`die_of_deferred_signal`],
//! so that a shell script stops as it would have at the first Ctrl-C.
//!
//! A disposition someone else chose (ignored, as under `nohup`, or a
//! handler of its own, as the command server's SIGTERM, D194) is left as
//! it is. The handler only writes static bytes, touches atomics and
//! raises a signal: all async-signal-safe.

use std::sync::Mutex;
use std::sync::atomic::{AtomicI32, AtomicPtr, AtomicUsize, Ordering::SeqCst};

/// The signals a guard takes over while it lives.
const SIGNALS: [libc::c_int; 3] = [libc::SIGINT, libc::SIGHUP, libc::SIGTERM];

/// Guards alive now, and the dispositions the first of them replaced.
static TAKEN: Mutex<(usize, Vec<(libc::c_int, libc::sigaction)>)> = Mutex::new((0, Vec::new()));
/// Interrupts (SIGINT, SIGHUP) received since the first guard.
static INTERRUPTS: AtomicUsize = AtomicUsize::new(0);
/// The signal that was let wait for the work (0: none).
static DEFERRED: AtomicI32 = AtomicI32::new(0);
/// What the handler says: one pointer, so that it never reads one
/// caller's text with another's length.
static TEXTS: AtomicPtr<FinishTexts> = AtomicPtr::new(std::ptr::null_mut());

/// What a [`FinishFirst`] says on stderr: `finishing` at the first
/// interrupt, `stopping` when it ends the process.
pub struct FinishTexts {
    pub finishing: &'static str,
    pub stopping: &'static str,
}

/// Write one of the texts of the guard alive now, if there is one.
fn say(pick: fn(&FinishTexts) -> &'static str) {
    // SAFETY: TEXTS is null or points at a `&'static FinishTexts`.
    if let Some(texts) = unsafe { TEXTS.load(SeqCst).as_ref() } {
        let text = pick(texts);
        // SAFETY: a static string; write(2) is async-signal-safe.
        unsafe {
            libc::write(2, text.as_ptr().cast(), text.len());
        }
    }
}

/// While this lives, interrupts wait for the work (module docs). Dropping
/// the last one puts the earlier dispositions back.
#[must_use = "the signals are taken over only while the guard lives"]
pub struct FinishFirst(());

/// Take over SIGINT, SIGHUP and SIGTERM where their disposition is the
/// default: the first interrupt writes `texts.finishing` to stderr and the
/// work goes on; a second interrupt or a SIGTERM writes `texts.stopping`
/// and ends the process by that signal.
pub fn finish_first(texts: &'static FinishTexts) -> FinishFirst {
    let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
    TEXTS.store(std::ptr::from_ref(texts).cast_mut(), SeqCst);
    if taken.0 == 0 {
        INTERRUPTS.store(0, SeqCst);
        for sig in SIGNALS {
            if let Some(previous) = take_if_default(sig) {
                taken.1.push((sig, previous));
            }
        }
    }
    taken.0 += 1;
    FinishFirst(())
}

impl Drop for FinishFirst {
    fn drop(&mut self) {
        let mut taken = TAKEN.lock().unwrap_or_else(|e| e.into_inner());
        taken.0 -= 1;
        if taken.0 == 0 {
            for (sig, previous) in taken.1.drain(..) {
                // SAFETY: `previous` is what sigaction(2) returned for `sig`.
                unsafe {
                    libc::sigaction(sig, &previous, std::ptr::null_mut());
                }
            }
        }
    }
}

/// Whether an interrupt came while a [`FinishFirst`] lived and the work
/// went on: the signal, which [`die_of_deferred_signal`] raises.
pub fn deferred_signal() -> Option<libc::c_int> {
    Some(DEFERRED.load(SeqCst)).filter(|&s| s != 0)
}

/// End the process by the interrupt the work let wait, if one came (call
/// once the work's result is written): a shell sees the child die of
/// SIGINT and stops its script, as it would have at once.
pub fn die_of_deferred_signal() {
    if let Some(sig) = deferred_signal() {
        // SAFETY: the default disposition ends the process; raise(3) sends
        // `sig` to this thread, where it is not blocked.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
    }
}

/// Install the handler for `sig` if its disposition is the default: the
/// replaced one, or `None` if it was left.
fn take_if_default(sig: libc::c_int) -> Option<libc::sigaction> {
    // SAFETY: zeroed sigactions are valid; sigaction(2) with a null new
    // action only reads the current one; the handler lives for the whole
    // program and is async-signal-safe.
    unsafe {
        let mut current: libc::sigaction = std::mem::zeroed();
        if libc::sigaction(sig, std::ptr::null(), &mut current) != 0
            || current.sa_sigaction != libc::SIG_DFL
        {
            return None;
        }
        let mut act: libc::sigaction = std::mem::zeroed();
        act.sa_sigaction = on_stop_signal as *const () as usize;
        act.sa_flags = libc::SA_RESTART;
        libc::sigemptyset(&mut act.sa_mask);
        let mut previous: libc::sigaction = std::mem::zeroed();
        (libc::sigaction(sig, &act, &mut previous) == 0).then_some(previous)
    }
}

extern "C" fn on_stop_signal(sig: libc::c_int) {
    let interrupt = sig != libc::SIGTERM;
    if interrupt && INTERRUPTS.fetch_add(1, SeqCst) == 0 {
        DEFERRED.store(sig, SeqCst);
        say(|t| t.finishing);
        return;
    }
    say(|t| t.stopping);
    // SAFETY: signal(2) and raise(3) are async-signal-safe. `sig` is
    // blocked while this handler runs, so it ends the process as it
    // returns (or on another thread first): what the work does meanwhile
    // is as safe as a kill at any instant.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn handler_of(sig: libc::c_int) -> usize {
        // SAFETY: a query of the current disposition only.
        unsafe {
            let mut current: libc::sigaction = std::mem::zeroed();
            libc::sigaction(sig, std::ptr::null(), &mut current);
            current.sa_sigaction
        }
    }

    #[test]
    fn a_guard_takes_over_only_default_signals_and_the_last_one_gives_them_back() {
        // SAFETY: dispositions of this test process only: SIGHUP ignored
        // as nohup does, the others at their default whatever started it
        // (a shell's `cmd &` ignores SIGINT).
        unsafe {
            libc::signal(libc::SIGHUP, libc::SIG_IGN);
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            libc::signal(libc::SIGTERM, libc::SIG_DFL);
        }
        static SAID: FinishTexts = FinishTexts {
            finishing: "f\n",
            stopping: "s\n",
        };
        let outer = finish_first(&SAID);
        let ours = on_stop_signal as *const () as usize;
        assert_eq!(handler_of(libc::SIGINT), ours);
        assert_eq!(handler_of(libc::SIGTERM), ours);
        assert_eq!(handler_of(libc::SIGHUP), libc::SIG_IGN, "nohup's choice");
        let inner = finish_first(&SAID);
        drop(inner);
        assert_eq!(handler_of(libc::SIGINT), ours, "the outer guard lives");
        drop(outer);
        assert_eq!(handler_of(libc::SIGINT), libc::SIG_DFL);
        assert_eq!(handler_of(libc::SIGTERM), libc::SIG_DFL);
        assert_eq!(handler_of(libc::SIGHUP), libc::SIG_IGN);
        assert_eq!(deferred_signal(), None);
    }
}
