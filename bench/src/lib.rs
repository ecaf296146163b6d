//! narad-bench: benchmarks for Narad. `narad-bench wal` measures the ingress WAL against the disk's raw limits.
