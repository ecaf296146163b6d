//! The fault switch (`testing.faults`, tests only): the fault layer's
//! control file, applied by a thread, and power-loss mode.

use super::*;

/// The file a test writes fault names into (`testing.faults` only).
pub(super) const FAULT_CONTROL_FILE: &str = "fault-control";
pub(super) const FAULT_POLL_INTERVAL: Duration = Duration::from_millis(10);
/// The fault layer's switches (`testing.faults`; tests only). When on, a
/// thread applies `<data_dir>/fault-control` every few milliseconds; with
/// power loss, files whose creation never became durable are deleted first.
pub(super) fn fault_control(
    settings: &Settings,
    data_dir: &Path,
) -> Result<Arc<FaultControl>, String> {
    let mode = settings.testing.faults.as_str();
    let control = FaultControl::new(mode == "power_loss");
    if mode == "off" {
        return Ok(control);
    }
    tracing::warn!(mode, "fault injection is on: this node is for tests");
    if control.power_loss() {
        remove_unsynced_files(data_dir)
            .map_err(|e| format!("removing files a power cut lost: {e}"))?;
    }
    let path = data_dir.join(FAULT_CONTROL_FILE);
    // The switches in force at start apply before any file is opened (a
    // switch may change how the node recovers).
    let at_start = std::fs::read_to_string(&path).unwrap_or_default();
    if !at_start.trim().is_empty() {
        let unknown = control.apply(&at_start);
        tracing::warn!(faults = %at_start.trim(), ?unknown, "fault switches at start");
    }
    let switches = control.clone();
    std::thread::Builder::new()
        .name("narad-faults".into())
        .spawn(move || {
            let mut last = at_start;
            loop {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                if text != last {
                    let unknown = switches.apply(&text);
                    tracing::warn!(faults = %text.trim(), ?unknown, "fault switches changed");
                    last = text;
                }
                std::thread::sleep(FAULT_POLL_INTERVAL);
            }
        })
        .map_err(|e| format!("starting the fault switch thread: {e}"))?;
    Ok(control)
}
