//! The real O_DIRECT path on glommio: a fresh, empty data folder (read-back
//! included), and a child process SIGKILLed while it appends with group commit.

use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::rc::Rc;
use std::time::{Duration, Instant};

use glommio::LocalExecutorBuilder;
use narad_storage::clock::{SharedClock, SystemClock};
use narad_storage::consumer::{ConsumerConfig, ConsumerState};
use narad_storage::io::glommio_fs::GlommioFs;
use narad_storage::log::{LogConfig, Message, PartitionLog};
use narad_storage::wal::{Wal, WalConfig, WalRecord};

const IO_MEMORY_BYTES: usize = 2 * 1024 * 1024;
const RING: WalConfig = WalConfig {
    ring_bytes: 4 * 1024 * 1024,
    keys_max: narad_storage::limits::IDEMPOTENCY_KEYS_PER_SHARD_MAX,
};
const CHILD_ENV: &str = "NARAD_STORAGE_CRASH_CHILD_DIR";
const CHILD_DEADLINE: Duration = Duration::from_secs(60);

fn run<T>(future: impl std::future::Future<Output = T>) -> T {
    LocalExecutorBuilder::default()
        .io_memory(IO_MEMORY_BYTES)
        .make()
        .expect("glommio executor")
        .run(future)
}

fn record(id: u128) -> WalRecord {
    WalRecord {
        id,
        topic: "orders".into(),
        partition: 3,
        key: Some(b"k".to_vec()),
        value: vec![7u8; 1024],
        accept_ms: 1,
        topic_incarnation: Some(3),
        offset: None,
        idempotency: None,
        key_only: false,
    }
}

#[test]
fn real_files_work_on_a_fresh_empty_data_folder_with_read_back() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("narad-data");
    run(async move {
        let fs = GlommioFs::new(&data).await.expect("fs");
        let clock: SharedClock = Rc::new(SystemClock);
        let (wal, recovery) = Wal::open(&fs, &data.join("wal/shard-0"), RING)
            .await
            .expect("wal");
        assert!(recovery.records.is_empty());
        let committer = glommio::spawn_local(wal.clone().run_committer(|_, _| {}));
        let appended: Vec<_> = (0..50)
            .map(|id| wal.append(&record(id).as_ref()).expect("append"))
            .collect();
        let mut positions = Vec::new();
        for a in appended {
            positions.push(a.pos);
            a.durable.await.expect("durable");
        }
        // The partition log on a brand-new folder: the append's O_DIRECT
        // read-back must work (glommio's disk probe pitfall).
        let config = LogConfig {
            segment_bytes: 1 << 20,
            prealloc_step_bytes: 256 * 1024,
            retention_ms: 0,
        };
        let (log, _) = PartitionLog::open(
            &fs,
            &data.join("partitions/orders/3"),
            config,
            clock.clone(),
        )
        .await
        .expect("log");
        let messages: Vec<Message> = (0..20)
            .map(|id| Message {
                idempotency_key: None,
                id,
                produced_at_ms: 1,
                key: None,
                value: vec![id as u8; 3000].into(),
            })
            .collect();
        assert_eq!(
            log.append(&messages).await.expect("append with read-back"),
            0
        );
        assert_eq!(log.append(&messages[..5]).await.expect("append"), 20);
        let read = log.read(18, 10, usize::MAX).await.expect("read");
        assert_eq!(
            read.iter().map(|m| m.offset).collect::<Vec<_>>(),
            vec![18, 19, 20, 21, 22, 23, 24]
        );
        assert_eq!(read[0].message, messages[18]);
        let consumer = ConsumerState::open(
            &fs,
            &data.join("partitions/orders/3/consumer"),
            ConsumerConfig::default(),
            clock,
        )
        .await
        .expect("consumer");
        consumer.ack(0);
        consumer.flush_now().await.expect("flush acks");
        // The checkpointer moves the durable tail once records are committed.
        let checkpointer = glommio::spawn_local(wal.clone().run_checkpointer(
            Duration::from_millis(5),
            glommio::timer::sleep,
            || 0,
        ));
        let tail_before = wal.stats().checkpoint_tail;
        for pos in &positions {
            wal.mark_committed(*pos);
        }
        let deadline = Instant::now() + Duration::from_secs(10);
        while wal.stats().checkpoint_tail == tail_before && Instant::now() < deadline {
            glommio::timer::sleep(Duration::from_millis(1)).await;
        }
        assert!(
            wal.stats().checkpoint_tail > tail_before,
            "the checkpointer synced a new tail"
        );
        wal.close();
        committer.await;
        checkpointer.await;
    });
}

/// The child: appends as fast as group commit allows and reports each record
/// whose durability future completed, until it is killed.
fn crash_child(dir: &Path) {
    let dir = dir.to_path_buf();
    run(async move {
        let fs = GlommioFs::new(&dir).await.expect("fs");
        let (wal, recovery) = Wal::open(&fs, &dir.join("wal"), RING).await.expect("wal");
        let start_id = recovery
            .records
            .iter()
            .map(|r| r.record.id)
            .max()
            .unwrap_or(0)
            + 1;
        glommio::spawn_local(wal.clone().run_committer(|_, _| {})).detach();
        let mut tasks = Vec::new();
        for writer in 0..16u128 {
            let wal = wal.clone();
            tasks.push(glommio::spawn_local(async move {
                let mut id = start_id + writer;
                loop {
                    let Ok(appended) = wal.append(&record(id).as_ref()) else {
                        return;
                    };
                    if appended.durable.await.is_err() {
                        return;
                    }
                    println!("durable {id} {}", appended.pos);
                    id += 16;
                }
            }));
        }
        for task in tasks {
            task.await;
        }
    });
}

#[test]
fn a_sigkilled_appender_loses_no_record_whose_durability_future_completed() {
    if let Ok(dir) = std::env::var(CHILD_ENV) {
        crash_child(Path::new(&dir));
        return;
    }
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().to_path_buf();
    let seed = std::process::id() as u64;
    let mut reported: Vec<(u128, u64)> = Vec::new();
    for round in 0..3u64 {
        let kill_after = 200 + (seed.wrapping_mul(2654435761).wrapping_add(round * 977)) % 1500;
        let mut child = Command::new(std::env::current_exe().expect("test binary"))
            .args([
                "--exact",
                "a_sigkilled_appender_loses_no_record_whose_durability_future_completed",
                "--nocapture",
            ])
            .env(CHILD_ENV, &dir)
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn child");
        let stdout = child.stdout.take().expect("child stdout");
        let deadline = Instant::now() + CHILD_DEADLINE;
        let mut lines = BufReader::new(stdout).lines();
        let mut seen = 0u64;
        while seen < kill_after && Instant::now() < deadline {
            let Some(Ok(line)) = lines.next() else { break };
            if let Some(rest) = line.strip_prefix("durable ") {
                let mut parts = rest.split(' ');
                let id = parts.next().and_then(|v| v.parse().ok()).expect("id");
                let pos = parts.next().and_then(|v| v.parse().ok()).expect("pos");
                reported.push((id, pos));
                seen += 1;
            }
        }
        // SIGKILL at a moment when appends are in flight.
        child.kill().expect("SIGKILL");
        let _ = child.wait();
        assert!(
            seen >= kill_after.min(1),
            "child reported durable records (round {round})"
        );
        let wal_dir: PathBuf = dir.join("wal");
        let recovered = run(async move {
            let fs = GlommioFs::new(&wal_dir).await.expect("fs");
            let (_, recovery) = Wal::open(&fs, &wal_dir, RING).await.expect("recover");
            recovery.records
        });
        for (id, pos) in &reported {
            let found = recovered.iter().find(|r| r.record.id == *id);
            assert!(
                found.is_some_and(|r| r.pos == *pos && r.record == record(*id)),
                "record {id} reported durable is recovered"
            );
        }
    }
}

#[test]
fn a_read_back_compares_the_bytes_on_disk_direct_and_buffered() {
    use narad_storage::io::{FileSystem, OpenMode, StorageFile};
    let tmp = tempfile::tempdir().expect("tempdir");
    let data = tmp.path().join("narad-data");
    run(async move {
        let fs = GlommioFs::new(&data).await.expect("fs");
        let block: Vec<u8> = (0..4096u32).map(|i| (i % 251) as u8).collect();
        for (name, mode) in [
            ("direct", OpenMode::CREATE_DIRECT),
            ("buffered", OpenMode::CREATE_BUFFERED),
        ] {
            let file = fs.open(&data.join(name), mode).await.expect("open");
            file.write_at(&block, 4096).await.expect("write");
            file.sync_data().await.expect("fdatasync");
            assert!(
                file.read_equals(4096, &block).await.expect("read"),
                "{name}"
            );
            let mut other = block.clone();
            other[4000] ^= 1;
            assert!(
                !file.read_equals(4096, &other).await.expect("read"),
                "{name}"
            );
            // Past the end of the file the read is short: not equal.
            assert!(
                !file.read_equals(8192, &block).await.expect("read"),
                "{name}"
            );
        }
    });
}
