//! A shard-local "something changed" signal: a version number and the tasks
//! waiting for it to move. Wakes long polls and driver loops without locks.

use std::cell::{Cell, RefCell};
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
pub struct Signal {
    version: Cell<u64>,
    wakers: RefCell<Vec<Waker>>,
}

impl Signal {
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    pub fn notify(&self) {
        self.version.set(self.version.get() + 1);
        for waker in self.wakers.borrow_mut().drain(..) {
            waker.wake();
        }
    }

    /// Completes once the version moved past `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        Changed { signal: self, seen }
    }
}

pub struct Changed<'a> {
    signal: &'a Signal,
    seen: u64,
}

impl Future for Changed<'_> {
    type Output = ();
    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.version.get() != self.seen {
            return Poll::Ready(());
        }
        self.signal.wakers.borrow_mut().push(cx.waker().clone());
        Poll::Pending
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn changed_completes_only_after_a_notify() {
        let signal = Signal::default();
        let seen = signal.version();
        let mut future = Box::pin(signal.changed(seen));
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        assert!(future.as_mut().poll(&mut cx).is_pending());
        signal.notify();
        assert!(future.as_mut().poll(&mut cx).is_ready());
    }
}
