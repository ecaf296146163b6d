//! Time and tasks, as the broker's logic sees them: one seam, so that the
//! shard never names its executor. The node runs on glommio
//! ([`GlommioRuntime`]); a simulation can drive the same logic on a manual
//! clock with its own scheduler.

use std::future::Future;
use std::pin::Pin;
use std::rc::Rc;
use std::time::Duration;

/// A future of this thread.
pub type LocalFuture = Pin<Box<dyn Future<Output = ()>>>;

/// Timers and spawning on the shard's own thread.
pub trait Runtime {
    /// Completes once `duration` has passed.
    fn sleep(&self, duration: Duration) -> LocalFuture;
    /// Runs `task` on this thread, detached: it is not cancelled when the
    /// caller goes away (work that must finish once started).
    fn spawn(&self, task: LocalFuture);
    /// Runs slow, blocking `work` (a password hash) where it holds up no
    /// other request of the shard; completes once it ran.
    fn blocking(&self, work: BlockingWork) -> LocalFuture;
}

/// Work for [`Runtime::blocking`].
pub type BlockingWork = Box<dyn FnOnce() + Send + 'static>;

/// The runtime handle a shard keeps.
pub type SharedRuntime = Rc<dyn Runtime>;

/// The node's runtime: glommio's timers and local tasks.
#[derive(Debug, Default, Clone, Copy)]
pub struct GlommioRuntime;

impl Runtime for GlommioRuntime {
    fn sleep(&self, duration: Duration) -> LocalFuture {
        Box::pin(glommio::timer::sleep(duration))
    }

    fn spawn(&self, task: LocalFuture) {
        glommio::spawn_local(task).detach();
    }

    /// A thread of its own, not glommio's blocking pool: that pool also
    /// runs the storage's renames and removes, which must not queue behind
    /// password hashes.
    fn blocking(&self, work: BlockingWork) -> LocalFuture {
        let (done, finished) = futures_channel::oneshot::channel::<()>();
        let spawned = std::thread::Builder::new()
            .name("narad-hash".into())
            .spawn(move || {
                work();
                let _ = done.send(());
            });
        Box::pin(async move {
            if spawned.is_ok() {
                let _ = finished.await;
            }
        })
    }
}
