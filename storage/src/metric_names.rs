//! Metric names the storage engine reports, defined once.

/// Records or frames recovery found corrupt and skipped (or refused).
pub const STORAGE_CORRUPT_RECORDS_TOTAL: &str = "narad_storage_corrupt_records_total";
