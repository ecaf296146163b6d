//! SVG charts of compare results: latency percentile curves per system and
//! publish throughput over time.

use std::path::Path;

use plotters::prelude::*;
use serde_json::Value;

use crate::omb::CURVE_PERCENTILES;

const SIZE: (u32, u32) = (960, 540);
/// One colour per system, Narad first.
const COLOURS: [RGBColor; 5] = [
    RGBColor(0xd6, 0x27, 0x28),
    RGBColor(0x1f, 0x77, 0xb4),
    RGBColor(0x2c, 0xa0, 0x2c),
    RGBColor(0x94, 0x67, 0xbd),
    RGBColor(0xff, 0x7f, 0x0e),
];

/// A line of points (x, y).
type Line = Vec<(f64, f64)>;

fn fail(error: impl std::fmt::Display) -> String {
    format!("drawing a chart: {error}")
}

/// Percentile on a "nines" axis: 50 → 0.3, 90 → 1, 99 → 2, 99.9 → 3.
fn nines(percentile: f64) -> f64 {
    -(1.0 - (percentile / 100.0).min(0.99999)).log10()
}

fn curve(result: &Value, key: &str) -> Line {
    CURVE_PERCENTILES
        .iter()
        .filter_map(|p| {
            let ms = result[key][format!("{p}")].as_f64()?;
            Some((nines(*p), ms.max(0.001)))
        })
        .collect()
}

/// Publish and end-to-end latency by percentile, one colour per system
/// (solid: publish, thin: end to end), log scale.
pub fn latency_curves(path: &Path, title: &str, results: &[&Value]) -> Result<(), String> {
    let curves: Vec<(String, RGBColor, Line, Line)> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            (
                r["driver"].as_str().unwrap_or("?").to_string(),
                COLOURS[i % COLOURS.len()],
                curve(r, "aggregatedPublishLatencyQuantiles"),
                curve(r, "aggregatedEndToEndLatencyQuantiles"),
            )
        })
        .collect();
    let top = curves
        .iter()
        .flat_map(|(_, _, a, b)| a.iter().chain(b).map(|(_, y)| *y))
        .fold(1.0, f64::max)
        * 2.0;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{title}: latency by percentile"),
            ("sans-serif", 20),
        )
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(60)
        .build_cartesian_2d(0.0..nines(99.999), (0.01..top).log_scale())
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("percentile")
        .y_desc("ms")
        .x_labels(6)
        .x_label_formatter(&|x| {
            let percentile = 100.0 * (1.0 - 10f64.powf(-x));
            format!("{}", (percentile * 1000.0).round() / 1000.0)
        })
        .draw()
        .map_err(fail)?;
    for (name, colour, publish, end_to_end) in curves {
        chart
            .draw_series(LineSeries::new(publish, colour.stroke_width(3)))
            .map_err(fail)?
            .label(format!("{name} publish"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(3))
            });
        chart
            .draw_series(LineSeries::new(end_to_end, colour.stroke_width(1)))
            .map_err(fail)?
            .label(format!("{name} end to end"))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(1))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::UpperLeft)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(fail)?;
    root.present().map_err(fail)
}

/// Publish rate per 10-second interval, one line per system.
pub fn throughput(path: &Path, title: &str, results: &[&Value]) -> Result<(), String> {
    let series: Vec<(String, RGBColor, Line)> = results
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let points = r["publishRate"]
                .as_array()
                .map(|rates| {
                    rates
                        .iter()
                        .enumerate()
                        .filter_map(|(n, v)| Some(((n + 1) as f64 * 10.0, v.as_f64()?)))
                        .collect()
                })
                .unwrap_or_default();
            (
                r["driver"].as_str().unwrap_or("?").to_string(),
                COLOURS[i % COLOURS.len()],
                points,
            )
        })
        .collect();
    let right = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(x, _)| *x))
        .fold(10.0, f64::max);
    let top = series
        .iter()
        .flat_map(|(_, _, p)| p.iter().map(|(_, y)| *y))
        .fold(1.0, f64::max)
        * 1.15;
    let root = SVGBackend::new(path, SIZE).into_drawing_area();
    root.fill(&WHITE).map_err(fail)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(format!("{title}: publish rate"), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(70)
        .build_cartesian_2d(0.0..right, 0.0..top)
        .map_err(fail)?;
    chart
        .configure_mesh()
        .x_desc("seconds")
        .y_desc("messages/s")
        .draw()
        .map_err(fail)?;
    for (name, colour, points) in series {
        chart
            .draw_series(LineSeries::new(points, colour.stroke_width(2)))
            .map_err(fail)?
            .label(name)
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], colour.stroke_width(2))
            });
    }
    chart
        .configure_series_labels()
        .position(SeriesLabelPosition::LowerRight)
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .draw()
        .map_err(fail)?;
    root.present().map_err(fail)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn charts_are_written_as_svg() {
        let dir = std::env::temp_dir().join(format!("narad-chart-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("dir");
        let quantiles = json!({"50": 1.0, "99": 3.0, "99.9": 9.0, "100": 20.0});
        let result = json!({
            "driver": "narad",
            "publishRate": [1000.0, 1200.0],
            "aggregatedPublishLatencyQuantiles": quantiles,
            "aggregatedEndToEndLatencyQuantiles": quantiles,
        });
        let latency = dir.join("l.svg");
        let throughput_path = dir.join("t.svg");
        latency_curves(&latency, "w", &[&result]).expect("latency chart");
        throughput(&throughput_path, "w", &[&result]).expect("throughput chart");
        for path in [latency, throughput_path] {
            let svg = std::fs::read_to_string(&path).expect("read");
            assert!(svg.starts_with("<svg") && svg.contains("narad"), "{path:?}");
        }
        std::fs::remove_dir_all(&dir).ok();
    }
}
