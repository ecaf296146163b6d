//! A shard-local "something changed" signal: a version number and the tasks
//! waiting for it to move. Wakes long polls and driver loops without locks.
//!
//! A waiter holds one slot however often it is polled, and gives it back
//! when dropped: a long poll that times out or whose client goes away leaves
//! nothing behind, so parked wakers are bounded by the waiters that exist.

use std::cell::{Cell, RefCell};
use std::collections::HashMap;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, Waker};

#[derive(Debug, Default)]
pub struct Signal {
    version: Cell<u64>,
    wakers: RefCell<HashMap<u64, Waker>>,
    next_slot: Cell<u64>,
}

impl Signal {
    pub fn version(&self) -> u64 {
        self.version.get()
    }

    pub fn notify(&self) {
        self.version.set(self.version.get() + 1);
        let woken = std::mem::take(&mut *self.wakers.borrow_mut());
        for (_, waker) in woken {
            waker.wake();
        }
    }

    /// Completes once the version moved past `seen`.
    pub fn changed(&self, seen: u64) -> Changed<'_> {
        Changed {
            signal: self,
            seen,
            slot: None,
        }
    }

    /// Wakers parked now (for tests and gauges).
    pub fn parked(&self) -> usize {
        self.wakers.borrow().len()
    }
}

pub struct Changed<'a> {
    signal: &'a Signal,
    seen: u64,
    slot: Option<u64>,
}

impl Future for Changed<'_> {
    type Output = ();
    fn poll(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<()> {
        if self.signal.version.get() != self.seen {
            return Poll::Ready(());
        }
        let slot = match self.slot {
            Some(slot) => slot,
            None => {
                let slot = self.signal.next_slot.get();
                self.signal.next_slot.set(slot + 1);
                self.slot = Some(slot);
                slot
            }
        };
        self.signal
            .wakers
            .borrow_mut()
            .insert(slot, cx.waker().clone());
        Poll::Pending
    }
}

impl Drop for Changed<'_> {
    fn drop(&mut self) {
        if let Some(slot) = self.slot {
            self.signal.wakers.borrow_mut().remove(&slot);
        }
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

    #[test]
    fn a_waiter_parks_one_waker_however_often_polled_and_none_once_dropped() {
        let signal = Signal::default();
        let waker = Waker::noop();
        let mut cx = Context::from_waker(waker);
        let mut waiters: Vec<_> = (0..100)
            .map(|_| Box::pin(signal.changed(signal.version())))
            .collect();
        for _ in 0..3 {
            for waiter in &mut waiters {
                assert!(waiter.as_mut().poll(&mut cx).is_pending());
            }
        }
        assert_eq!(signal.parked(), 100);
        // Long polls that time out or lose their client.
        waiters.truncate(10);
        assert_eq!(signal.parked(), 10);
        signal.notify();
        assert_eq!(signal.parked(), 0);
        drop(waiters);
        assert_eq!(signal.parked(), 0);
    }
}
