//! The two halves of a graceful stop.

use super::*;

impl<F: FileSystem> Shard<F> {
    /// Graceful stop, first half: refuse new produces and let the dispatcher
    /// commit what it holds (other shards keep answering commits until every
    /// shard finished this half).
    pub async fn drain(&self) {
        self.flow.stopping.set(true);
        self.wake_every_poll();
        self.flow.polls.forward_due.notify();
        self.dispatch.signal.notify();
        let deadline = self.mono() + STOP_DRAIN_TIMEOUT.as_millis() as u64;
        while self.undispatched() > 0 && self.mono() < deadline {
            let seen = self.dispatch.signal.version();
            futures_lite::future::or(
                self.dispatch.signal.changed(seen),
                self.env.runtime.sleep(STOP_DRAIN_POLL),
            )
            .await;
        }
        // Commits other nodes sent before the stop finish and are answered.
        while self.remote.in_flight.get() > 0 && self.mono() < deadline {
            let seen = self.remote.done.version();
            futures_lite::future::or(
                self.remote.done.changed(seen),
                self.env.runtime.sleep(STOP_DRAIN_POLL),
            )
            .await;
        }
        // Copies to children end and store their cursors (a graceful
        // restart copies nothing twice).
        self.stop_copies();
        while self.copies_running() > 0 && self.mono() < deadline {
            self.env.runtime.sleep(STOP_DRAIN_POLL).await;
        }
        let copies = self.copies_running();
        if copies > 0 {
            tracing::warn!(
                copies,
                "stopping with copies to children still running; they copy again from their stored cursors"
            );
        }
        let left = self.undispatched();
        if left > 0 {
            tracing::warn!(
                records = left,
                "stopping with records not yet committed; the WAL keeps them for the next start"
            );
        }
    }

    /// Graceful stop, second half: sync what the journal wrote behind and
    /// the WAL checkpoint, flush every ack
    /// to disk, and mark each partition log closed cleanly.
    pub async fn finish(&self) {
        self.flow.acks_closed.set(true);
        // What partitions wrote behind for the journal is synced first, so
        // the checkpoint passes its journal copies and the next start has
        // nothing to put back.
        self.sync_journals().await;
        self.wal.close();
        if let Err(error) = self.wal.checkpoint(self.wall()).await {
            tracing::error!(%error, "final WAL checkpoint failed");
        }
        for owner in self.open_owners() {
            if let Err(error) = owner.flush_acks().await {
                tracing::error!(%error, "flushing acks at stop failed");
            }
            if let Err(error) = owner.mark_log_clean().await {
                tracing::warn!(%error, "marking a partition log closed cleanly failed; its next open rewrites its newest segment");
            }
        }
    }
}
