//! `trainyard show NAME`: one run's record — status, driver, attempts, checkpoints — and its
//! metrics history (every report, with or without a checkpoint): rank 0's latest reports as a
//! table and a small chart per numeric metric. `--format json` prints the record and every
//! report of every rank.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::io::{self, Write as _};

use trainyard::checkpoint::{MetricsEntry, RunRecord};

use crate::args::{OutputFormat, ShowArgs};
use crate::runs::text::number;
use crate::runs::{Shown, find, open_storage, runtime};
use crate::{Failure, assets};

/// Rank 0's reports shown as rows in text.
const ROWS: usize = 10;
/// Metrics shown as columns and charts in text.
const COLUMNS: usize = 4;
/// The width of a chart, in reports.
const CHART_WIDTH: usize = 60;

pub(crate) fn run(args: &ShowArgs) -> Result<(), Failure> {
    let storage = open_storage(&args.storage)?;
    let runtime = runtime()?;
    let (folder, record) = find(&storage, &runtime, &args.name)?;
    let shown = runtime.block_on(Shown::read(&folder, record))?;
    if let Some(file) = &args.html {
        let page = html(&shown).map_err(Failure::other)?;
        // Never through a link, and never into another user's file (a shared folder's).
        trainyard_sys::private::write(file, page.as_bytes())
            .map_err(|error| Failure::other(format!("cannot write {}: {error}", file.display())))?;
        say!(
            "trainyard: run `{}` written to {} (one page, charts included)",
            crate::inert(&shown.record.name),
            file.display()
        );
        return Ok(());
    }
    let mut out = io::stdout().lock();
    let written = match args.format {
        OutputFormat::Json => serde_json::to_writer_pretty(&mut out, &shown)
            .map_err(io::Error::other)
            .and_then(|()| writeln!(out)),
        OutputFormat::Text => out
            .write_all(text(&shown.record, shown.status, &folder.uri(), &shown.metrics).as_bytes()),
    };
    written.map_err(Failure::output)
}

/// The record as text; every string it holds is made [`inert`](crate::inert) (it may be
/// another user's, or remote storage's).
fn text(record: &RunRecord, status: &str, uri: &str, entries: &[MetricsEntry]) -> String {
    use crate::inert;
    let mut out = String::new();
    let _ = writeln!(out, "run {}: {status}", inert(&record.name));
    let _ = writeln!(out, "  folder      {}", inert(uri));
    if let Some(driver) = &record.driver {
        let user = inert(driver.user.as_deref().unwrap_or("?"));
        let _ = writeln!(
            out,
            "  driver      pid {} on {} (user {user}), started {}",
            driver.pid,
            inert(&driver.host),
            crate::runs::text::started(driver.started_at)
        );
        if !driver.command.is_empty() {
            let _ = writeln!(
                out,
                "  command     {}",
                crate::inert(&command_line(&driver.command))
            );
        }
    }
    // Numbered as `trainyard logs --attempt K` numbers them: over every driver of the run.
    for (k, attempt) in record.attempts.iter().enumerate() {
        let took = attempt
            .ended_at
            .map(|end| crate::runs::text::duration((end - attempt.started_at).max(0.0)))
            .unwrap_or_else(|| "running".to_owned());
        let workers = attempt
            .world_size
            .map(|n| format!("{n} workers"))
            .unwrap_or_default();
        let ending = attempt
            .failure
            .as_deref()
            .map(|failure| format!(": {}", inert(failure)))
            .unwrap_or_default();
        let _ = writeln!(out, "  attempt {k}   {workers}, {took}{ending}");
        for worker in &attempt.workers {
            let _ = writeln!(
                out,
                "    rank {}  pid {} on {} ({})",
                worker.rank,
                worker.pid,
                inert(&worker.node),
                inert(&worker.ip)
            );
        }
    }
    for checkpoint in &record.checkpoints {
        let latest = if Some(checkpoint.index) == record.latest_checkpoint {
            " (latest)"
        } else {
            ""
        };
        let _ = writeln!(
            out,
            "  checkpoint  #{} {}{latest}",
            checkpoint.index,
            crate::runs::text::metrics(&checkpoint.metrics)
        );
    }
    let rank0: Vec<&MetricsEntry> = entries.iter().filter(|e| e.rank == 0).collect();
    let _ = writeln!(
        out,
        "metrics: {} reports ({} of rank 0)",
        entries.len(),
        rank0.len()
    );
    if rank0.is_empty() {
        return out;
    }
    // The first numeric metrics rank 0 reported, in the order it reported them.
    let mut names: Vec<&str> = Vec::new();
    for entry in &rank0 {
        for (name, value) in &entry.metrics {
            if value.is_number() && !names.contains(&name.as_str()) && names.len() < COLUMNS {
                names.push(name);
            }
        }
    }
    let mut table: Vec<Vec<String>> = vec![
        ["time", "attempt"]
            .into_iter()
            .map(str::to_owned)
            .chain(names.iter().map(|name| inert(name)))
            .collect(),
    ];
    for entry in rank0.iter().skip(rank0.len().saturating_sub(ROWS)) {
        let mut row = vec![
            crate::runs::text::started(entry.time)
                .split(' ')
                .nth(1)
                .unwrap_or_default()
                .to_owned(),
            entry.attempt.to_string(),
        ];
        for name in &names {
            row.push(
                entry
                    .metrics
                    .get(*name)
                    .map_or_else(|| "-".to_owned(), number),
            );
        }
        table.push(row);
    }
    let mut widths: Vec<usize> = vec![0; table[0].len()];
    for row in &table {
        for (width, cell) in widths.iter_mut().zip(row) {
            *width = (*width).max(cell.chars().count());
        }
    }
    for row in &table {
        let cells: Vec<String> = row
            .iter()
            .zip(&widths)
            .map(|(cell, width)| format!("{cell:>width$}"))
            .collect();
        let _ = writeln!(out, "  {}", cells.join("  "));
    }
    let series: BTreeMap<&str, Vec<f64>> = names
        .iter()
        .map(|name| {
            let values = rank0
                .iter()
                .filter_map(|entry| entry.metrics.get(*name)?.as_f64())
                .collect();
            (*name, values)
        })
        .collect();
    let label = names
        .iter()
        .map(|n| inert(n).chars().count())
        .max()
        .unwrap_or(0);
    for name in &names {
        let values = &series[name];
        let shown = inert(name);
        if values.len() < 2 {
            continue;
        }
        let (low, high) = values
            .iter()
            .fold((f64::INFINITY, f64::NEG_INFINITY), |(lo, hi), v| {
                (lo.min(*v), hi.max(*v))
            });
        let _ = writeln!(
            out,
            "  {shown:<label$}  {}  {} .. {}",
            sparkline(values, CHART_WIDTH),
            number(&serde_json::json!(low)),
            number(&serde_json::json!(high))
        );
    }
    out
}

/// `values` as one line of block characters, lowest to highest, at most `width` wide (each
/// character the mean of the reports it covers).
fn sparkline(values: &[f64], width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let finite: Vec<f64> = values.iter().copied().filter(|v| v.is_finite()).collect();
    if finite.is_empty() {
        return String::new();
    }
    let columns = finite.len().min(width.max(1));
    let means: Vec<f64> = (0..columns)
        .map(|c| {
            let from = c * finite.len() / columns;
            let to = ((c + 1) * finite.len() / columns).max(from + 1);
            finite[from..to].iter().sum::<f64>() / (to - from) as f64
        })
        .collect();
    let low = means.iter().copied().fold(f64::INFINITY, f64::min);
    let high = means.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    means
        .iter()
        .map(|v| {
            if high > low {
                let step = ((v - low) / (high - low) * 7.0).round() as usize;
                BARS[step.min(7)]
            } else {
                BARS[3]
            }
        })
        .collect()
}

/// The page of `trainyard show --html`: the run's record and a chart per metric, with
/// everything it needs inside it (uPlot, the data).
fn html(shown: &Shown) -> Result<String, serde_json::Error> {
    // In a script element, `</script` or `<!--` could end it early or hide its end: JSON
    // has `<` only inside strings, where `\u003c` means the same.
    let data = serde_json::to_string(shown)?.replace('<', "\\u003c");
    let name: String = shown
        .record
        .name
        .chars()
        .filter(|c| !"<>&\"'".contains(*c))
        .collect();
    Ok(assets::SHOW_PAGE
        .replace("{{NAME}}", &name)
        .replace("{{UPLOT_CSS}}", assets::UPLOT_CSS)
        .replace("{{UPLOT_JS}}", assets::UPLOT_JS)
        .replace("{{CHARTS_JS}}", assets::CHARTS_JS)
        .replace("{{SHOWN}}", &data))
}

/// `words` as one command line a shell takes back (a word with a NUL byte, which no shell
/// word holds, as it is).
fn command_line(words: &[String]) -> String {
    shlex::try_join(words.iter().map(String::as_str)).unwrap_or_else(|_| words.join(" "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sparkline_goes_from_the_lowest_bar_to_the_highest() {
        assert_eq!(sparkline(&[1.0, 2.0, 3.0, 4.0], 60), "▁▃▆█");
        assert_eq!(sparkline(&[5.0, 5.0], 60), "▄▄");
        // Eight reports in four columns: each the mean of two.
        assert_eq!(
            sparkline(&[0.0, 0.0, 1.0, 1.0, 2.0, 2.0, 3.0, 3.0], 4),
            "▁▃▆█"
        );
        assert_eq!(sparkline(&[f64::NAN], 4), "");
    }
}
