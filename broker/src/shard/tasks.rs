//! The shard's own background tasks, started on its runtime: the node
//! starts them the same way a simulation does.

use super::*;
use crate::limits::{
    IDLE_PARTITION_FIRST_OPEN, IDLE_PARTITION_OPEN_INTERVAL, JOURNAL_SYNC_INTERVAL,
    RETENTION_INTERVAL,
};
use crate::metric_names::{WAL_RECORDS_PER_SYNC, WAL_SYNC_SECONDS};

impl<F: FileSystem> Shard<F> {
    /// Commits again what the WAL held above its checkpoint, then starts the
    /// WAL's committer and checkpointer, the metadata watch, availability
    /// notices and wake-ups passed on, the dead-letter mover, lease sweeps, retention of idle
    /// partitions, ack maintenance, and (on shard 0) the bootstrap of the
    /// user admin. The dispatcher loop
    /// ([`Self::run_dispatcher`]) is the caller's to run, since a stop waits
    /// for it.
    pub fn start_tasks(self: &Rc<Self>, recovered: Vec<(WalPos, WalRecord)>) {
        let runtime = self.env.runtime.clone();
        let recovered = self.set_journal_aside(recovered);
        self.redispatch(recovered);
        runtime.spawn(Box::pin(self.clone().replay_journals()));
        runtime.spawn(Box::pin(every(self.clone(), JOURNAL_SYNC_INTERVAL, |s| {
            Box::pin(async move { s.sync_journals().await })
        })));

        let committed = self.clone();
        let committer = self.wal.clone().run_committer(move |outcome, elapsed| {
            metrics::histogram!(WAL_SYNC_SECONDS).record(elapsed.as_secs_f64());
            metrics::histogram!(WAL_RECORDS_PER_SYNC).record(outcome.records as f64);
            // Every durable record goes to the dispatcher, whether or not
            // the request that appended it still waits.
            committed.dispatch_durable();
        });
        let failed = self.clone();
        runtime.spawn(Box::pin(async move {
            committer.await;
            // The committer ends at a close or a failure: a failure stops
            // produces on every shard of the node, and lets go of the keys
            // of records it will never make durable.
            if failed.wal.failure().is_some() {
                failed.env.wal_failed.store(true, Ordering::SeqCst);
                failed.keys_lost();
            }
        }));

        let checkpoint = Duration::from_millis(self.settings.dispatcher.checkpoint_interval_ms);
        let sleeper = runtime.clone();
        let clock = self.env.clock.clone();
        runtime.spawn(Box::pin(self.wal.clone().run_checkpointer(
            checkpoint,
            move |interval| sleeper.sleep(interval),
            move || clock.now_ms(),
        )));

        runtime.spawn(Box::pin(self.clone().watch_topics()));
        runtime.spawn(Box::pin(self.clone().run_moves()));
        runtime.spawn(Box::pin(self.clone().notify_peers()));
        runtime.spawn(Box::pin(self.clone().forward_wakes()));
        runtime.spawn(Box::pin(self.clone().run_dead_letters()));
        let sweep = Duration::from_millis(self.settings.leases.sweep_interval_ms);
        runtime.spawn(Box::pin(every(self.clone(), sweep, |s| {
            Box::pin(async move { s.sweep_all().await })
        })));
        // Partitions nobody touched since the start age out too: open them
        // soon after the start, then now and again.
        let idle = self.clone();
        runtime.spawn(Box::pin(async move {
            idle.env.runtime.sleep(IDLE_PARTITION_FIRST_OPEN).await;
            idle.open_idle_partitions().await;
            every(idle, IDLE_PARTITION_OPEN_INTERVAL, |s| {
                Box::pin(async move { s.open_idle_partitions().await })
            })
            .await;
        }));
        // Acks on their way to the OS every interval (each partition on a
        // task of its own); retention on its own, slower clock.
        let ack_flush = Duration::from_millis(self.settings.storage.ack_flush_interval_ms);
        runtime.spawn(Box::pin(every(self.clone(), ack_flush, |s| {
            Box::pin(async move { s.persist_acks_all() })
        })));
        runtime.spawn(Box::pin(every(self.clone(), RETENTION_INTERVAL, |s| {
            Box::pin(async move { s.retain_all().await })
        })));
        // Shard 0 runs the redrives this node took.
        if self.identity.shard_id == 0 {
            runtime.spawn(Box::pin(self.clone().run_redrives()));
        }
        // One shard of each node makes sure the user admin exists.
        if let (0, Some(password)) = (self.identity.shard_id, &self.settings.auth.admin_password) {
            let password = password.reveal().to_string();
            let shard = self.clone();
            runtime.spawn(Box::pin(async move {
                shard.bootstrap_admin(password).await;
            }));
        }
    }
}
