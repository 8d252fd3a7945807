//! The gate every FUSE request passes. A rewind closes it: new requests
//! wait, requests already inside drain, and the backing tree is changed
//! with nobody looking. Kernel passthrough I/O on already-open files does
//! not pass the gate; such a file keeps its old inode if the rewind
//! replaces it, as it would natively.
//!
//! Before it closes, a rewind closes it to opens alone for a moment
//! ([`Gate::close_to_opens`]): files open for writing are let finish and
//! close, so that what they write is in the rewind's safety capture
//! instead of in a file the rewind then replaces (D241).

use std::sync::{Condvar, Mutex, MutexGuard};

#[derive(Default)]
struct State {
    frozen: bool,
    /// Opens wait; everything else passes.
    closed_to_opens: bool,
    inside: u64,
}

#[derive(Default)]
pub struct Gate {
    st: Mutex<State>,
    cv: Condvar,
}

/// A request inside the gate.
pub struct Pass<'a>(&'a Gate);

impl Drop for Pass<'_> {
    fn drop(&mut self) {
        let mut st = self.0.lock();
        st.inside -= 1;
        if st.inside == 0 && st.frozen {
            self.0.cv.notify_all();
        }
    }
}

impl Gate {
    fn lock(&self) -> MutexGuard<'_, State> {
        self.st.lock().unwrap_or_else(|p| p.into_inner())
    }

    pub fn enter(&self) -> Pass<'_> {
        self.enter_while(|st| st.frozen)
    }

    /// For an open or a create: waits also while the gate is closed to
    /// opens.
    pub fn enter_open(&self) -> Pass<'_> {
        self.enter_while(|st| st.frozen || st.closed_to_opens)
    }

    fn enter_while(&self, wait: impl Fn(&State) -> bool) -> Pass<'_> {
        let mut st = self.lock();
        while wait(&st) {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        st.inside += 1;
        Pass(self)
    }

    /// Close the gate to opens. Returns false if a rewind has it closed
    /// already (one rewind at a time); [`Gate::freeze`] then closes it
    /// to everything.
    pub fn close_to_opens(&self) -> bool {
        let mut st = self.lock();
        if st.frozen || st.closed_to_opens {
            return false;
        }
        st.closed_to_opens = true;
        true
    }

    /// Close the gate and wait until no request is inside. Returns false
    /// if it was already closed (one rewind at a time).
    pub fn freeze(&self) -> bool {
        let mut st = self.lock();
        if st.frozen {
            return false;
        }
        st.frozen = true;
        while st.inside > 0 {
            st = self.cv.wait(st).unwrap_or_else(|p| p.into_inner());
        }
        true
    }

    /// Let everything but opens pass again (after a [`Gate::freeze`] that
    /// found a file just opened for writing).
    pub fn unfreeze_to_opens_closed(&self) {
        self.lock().frozen = false;
        self.cv.notify_all();
    }

    pub fn thaw(&self) {
        let mut st = self.lock();
        st.frozen = false;
        st.closed_to_opens = false;
        drop(st);
        self.cv.notify_all();
    }

    pub fn is_frozen(&self) -> bool {
        self.lock().frozen
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Duration;

    #[test]
    fn a_frozen_gate_holds_new_requests_until_thawed() {
        let g = Arc::new(Gate::default());
        assert!(g.freeze());
        assert!(!g.freeze());
        let g2 = Arc::clone(&g);
        let t = std::thread::spawn(move || {
            let _p = g2.enter();
            std::time::Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        let thawed = std::time::Instant::now();
        g.thaw();
        assert!(t.join().unwrap_or(thawed) >= thawed);
    }

    /// D241: closed to opens, the gate lets other requests through (a
    /// writer's write and close) and holds opens until thawed; a second
    /// rewind cannot close it again meanwhile.
    #[test]
    fn a_gate_closed_to_opens_holds_opens_alone() {
        let g = Arc::new(Gate::default());
        assert!(g.close_to_opens());
        assert!(!g.close_to_opens(), "two rewinds at once");
        drop(g.enter());
        let g2 = Arc::clone(&g);
        let t = std::thread::spawn(move || {
            let _p = g2.enter_open();
            std::time::Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        assert!(g.freeze(), "a gate closed to opens still freezes");
        g.unfreeze_to_opens_closed();
        drop(g.enter());
        std::thread::sleep(Duration::from_millis(20));
        let thawed = std::time::Instant::now();
        g.thaw();
        assert!(t.join().unwrap_or(thawed) >= thawed, "an open passed early");
    }

    #[test]
    fn freeze_waits_for_requests_inside() {
        let g = Arc::new(Gate::default());
        let p = g.enter();
        let g2 = Arc::clone(&g);
        let t = std::thread::spawn(move || {
            g2.freeze();
            std::time::Instant::now()
        });
        std::thread::sleep(Duration::from_millis(50));
        let left = std::time::Instant::now();
        drop(p);
        assert!(t.join().unwrap_or(left) >= left);
    }
}
