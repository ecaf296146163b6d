//! The Prometheus recorder that `/metrics` renders, with its histogram
//! buckets.

use super::*;

/// How often the metrics exporter drains its histograms.
pub(super) const METRICS_UPKEEP_INTERVAL: Duration = Duration::from_secs(5);
/// Buckets of every latency histogram, in seconds.
pub(super) const LATENCY_BUCKETS_SECONDS: &[f64] = &[
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5,
    5.0, 10.0, 30.0,
];
/// Buckets of the records-per-fsync histogram.
pub(super) const RECORDS_PER_SYNC_BUCKETS: &[f64] = &[
    1.0, 2.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0, 256.0, 512.0, 1024.0, 4096.0,
];

/// Installs the Prometheus recorder that `/metrics` renders.
pub(super) fn install_metrics() -> Result<metrics_exporter_prometheus::PrometheusHandle, String> {
    use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};
    PrometheusBuilder::new()
        .set_buckets(LATENCY_BUCKETS_SECONDS)
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(WAL_RECORDS_PER_SYNC.into()),
                RECORDS_PER_SYNC_BUCKETS,
            )
        })
        .and_then(|b| {
            b.set_buckets_for_metric(
                Matcher::Full(DISPATCHER_COMMIT_RECORDS.into()),
                RECORDS_PER_SYNC_BUCKETS,
            )
        })
        .and_then(PrometheusBuilder::install_recorder)
        .map_err(|e| format!("installing the metrics recorder: {e}"))
        .inspect(|_| describe_metrics())
}

/// Gives every metric its `# HELP` line.
fn describe_metrics() {
    use crate::metric_names::{Kind, ALL};
    for (name, kind, help) in ALL {
        match kind {
            Kind::Counter => metrics::describe_counter!(*name, *help),
            Kind::Gauge => metrics::describe_gauge!(*name, *help),
            Kind::Histogram => metrics::describe_histogram!(*name, *help),
        }
    }
}
