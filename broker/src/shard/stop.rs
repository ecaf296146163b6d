//! The two halves of a graceful stop.

use super::*;

impl Shard {
    /// Graceful stop, first half: refuse new produces and let the dispatcher
    /// commit what it holds (other shards keep answering commits until every
    /// shard finished this half).
    pub async fn drain(&self) {
        self.stopping.set(true);
        self.availability.notify();
        self.dispatch_signal.notify();
        let deadline = std::time::Instant::now() + STOP_DRAIN_TIMEOUT;
        while self.undispatched() > 0 && std::time::Instant::now() < deadline {
            let seen = self.dispatch_signal.version();
            futures_lite::future::or(
                self.dispatch_signal.changed(seen),
                glommio::timer::sleep(Duration::from_millis(50)),
            )
            .await;
        }
        // Commits other nodes sent before the stop finish and are answered.
        while self.remote_in_flight.get() > 0 && std::time::Instant::now() < deadline {
            let seen = self.remote_done.version();
            futures_lite::future::or(
                self.remote_done.changed(seen),
                glommio::timer::sleep(Duration::from_millis(50)),
            )
            .await;
        }
        let left = self.undispatched();
        if left > 0 {
            tracing::warn!(
                records = left,
                "stopping with records not yet committed; the WAL keeps them for the next start"
            );
        }
    }

    /// Graceful stop, second half: sync the WAL checkpoint and flush every
    /// ack to disk.
    pub async fn finish(&self) {
        self.acks_closed.set(true);
        self.wal.close();
        if let Err(error) = self.wal.checkpoint().await {
            tracing::error!(%error, "final WAL checkpoint failed");
        }
        for owner in self.open_owners() {
            if let Err(error) = owner.flush_acks().await {
                tracing::error!(%error, "flushing acks at stop failed");
            }
        }
    }
}
