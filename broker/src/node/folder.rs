//! The data folder's identity: its lock (one process per folder), the
//! client-port check, the epoch and receipt key kept in it, and the
//! incarnation drawn at every start.

use super::*;

pub(super) const EPOCH_FILE: &str = "node.epoch";
/// Held locked by the process that runs on the data folder.
pub(super) const LOCK_FILE: &str = "narad.lock";
pub(super) const RECEIPT_KEY_FILE: &str = "receipt.key";
/// Takes the data folder for this process: an exclusive `flock` on
/// `narad.lock`, held until the process exits (the kernel releases it even
/// after SIGKILL). A second process on the folder is refused, naming the
/// holder, before it touches anything.
pub(super) fn lock_data_dir(dir: &Path) -> Result<std::fs::File, String> {
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(|e| format!("opening {}: {e}", path.display()))?;
    // SAFETY: flock on a file descriptor this function owns.
    let locked = unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) };
    if locked != 0 {
        let holder = std::fs::read_to_string(&path).unwrap_or_default();
        let holder = holder.trim();
        let holder = if holder.is_empty() {
            "another process".to_string()
        } else {
            format!("process {holder}")
        };
        return Err(format!(
            "the data folder {} is in use by {holder} (it holds {LOCK_FILE}); one narad process per folder",
            dir.display()
        ));
    }
    file.set_len(0)
        .and_then(|()| {
            std::io::Write::write_all(&mut file, std::process::id().to_string().as_bytes())
        })
        .map_err(|e| format!("writing {}: {e}", path.display()))?;
    Ok(file)
}

/// How long a start waits for its client port to be let go before it
/// says another process holds it: a node that has just exited can keep its
/// listening socket a moment longer (the kernel tears down an exited
/// process's io_uring rings, and the sockets their requests hold, after the
/// process is gone), as in a rolling restart.
const PORT_RELEASE_WAIT: std::time::Duration = std::time::Duration::from_secs(3);
const PORT_RELEASE_POLL: std::time::Duration = std::time::Duration::from_millis(50);

/// Refuses a client port another process listens on. The shards bind with
/// SO_REUSEPORT (they share the port), which would let a second process
/// share it too; a plain bind fails while anyone else holds it.
pub(super) fn refuse_port_in_use(listen: SocketAddr) -> Result<(), String> {
    if listen.port() == 0 {
        return Ok(());
    }
    let deadline = std::time::Instant::now() + PORT_RELEASE_WAIT;
    loop {
        match std::net::TcpListener::bind(listen) {
            Ok(_probe) => return Ok(()),
            Err(error) if error.kind() == std::io::ErrorKind::AddrInUse => {
                if std::time::Instant::now() >= deadline {
                    return Err(format!(
                        "the client port {listen} is in use by another process"
                    ));
                }
                std::thread::sleep(PORT_RELEASE_POLL);
            }
            Err(error) => return Err(format!("listening on {listen}: {error}")),
        }
    }
}

/// A random number drawn at every start: message ids carry it, so they
/// never repeat, even on a node whose data folder was lost or copied.
pub(super) fn draw_incarnation() -> Result<u64, String> {
    let mut bytes = [0u8; 8];
    std::fs::File::open("/dev/urandom")
        .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut bytes))
        .map_err(|e| format!("reading /dev/urandom: {e}"))?;
    Ok(u64::from_le_bytes(bytes))
}

/// Reads, increments and persists the node's start counter.
pub(super) fn next_epoch(fs: &BlockingFs, dir: &Path) -> Result<u32, String> {
    let previous = match fs.read(&dir.join(EPOCH_FILE)) {
        Ok(Some(bytes)) => std::str::from_utf8(&bytes)
            .ok()
            .and_then(|text| text.trim().parse::<u32>().ok())
            .ok_or_else(|| format!("{EPOCH_FILE} is damaged: not a number"))?,
        Ok(None) => 0,
        Err(error) => return Err(format!("reading {EPOCH_FILE}: {error}")),
    };
    let epoch = previous
        .checked_add(1)
        .ok_or("the node's start counter overflowed")?;
    fs.write_whole(dir, EPOCH_FILE, epoch.to_string().as_bytes())
        .map_err(|e| format!("writing {EPOCH_FILE}: {e}"))?;
    Ok(epoch)
}

/// The key that authenticates receipts; made once, kept across restarts.
pub(super) fn receipt_key(fs: &BlockingFs, dir: &Path) -> Result<ReceiptKey, String> {
    let path = dir.join(RECEIPT_KEY_FILE);
    let bytes = match fs.read(&path) {
        Ok(Some(bytes)) => bytes,
        Ok(None) => {
            let mut key = [0u8; 32];
            std::fs::File::open("/dev/urandom")
                .and_then(|mut f| std::io::Read::read_exact(&mut f, &mut key))
                .map_err(|e| format!("reading /dev/urandom: {e}"))?;
            fs.write_whole(dir, RECEIPT_KEY_FILE, &key)
                .map_err(|e| format!("writing {RECEIPT_KEY_FILE}: {e}"))?;
            key.to_vec()
        }
        Err(error) => return Err(format!("reading {RECEIPT_KEY_FILE}: {error}")),
    };
    let key: [u8; 32] = bytes
        .try_into()
        .map_err(|_| format!("{RECEIPT_KEY_FILE} must hold 32 bytes"))?;
    Ok(ReceiptKey::from_bytes(key))
}
