//! Medians, counts and the machine's load, for the tables the modes print.

use std::{collections::HashMap, process::Command};

/// The median of `values` (the mean of the middle two for an even count); 0 for none.
pub(crate) fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => 0.0,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => (sorted[n / 2 - 1] + sorted[n / 2]) / 2.0,
    }
}

/// `median (min–max)` of `values`, each with `decimals` decimals.
pub(crate) fn spread(values: &[f64], decimals: usize) -> String {
    let min = values.iter().copied().fold(f64::INFINITY, f64::min);
    let max = values.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    format!(
        "{:.d$} ({:.d$}–{:.d$})",
        median(values),
        min,
        max,
        d = decimals
    )
}

/// The width of the target column: the longest label, at least 16.
pub(crate) fn label_width<'a>(labels: impl IntoIterator<Item = &'a str>) -> usize {
    labels
        .into_iter()
        .map(|l| l.chars().count())
        .fold(16, usize::max)
}

/// What `uptime` prints (the machine line of a run).
pub(crate) fn uptime() -> String {
    match Command::new("uptime").output() {
        Ok(output) if output.status.success() => {
            String::from_utf8_lossy(&output.stdout).trim().to_owned()
        }
        _ => format!("load average: {}", load_average()),
    }
}

/// The load averages over 1, 5 and 15 minutes: `0.40, 1.53, 0.97`.
pub(crate) fn load_average() -> String {
    let loadavg = std::fs::read_to_string("/proc/loadavg").unwrap_or_default();
    let averages: Vec<&str> = loadavg.split_whitespace().take(3).collect();
    if averages.len() == 3 {
        averages.join(", ")
    } else {
        "unknown (no /proc/loadavg)".into()
    }
}

/// Counts by name, in the order names first came, largest first on demand.
#[derive(Debug, Default, Clone)]
pub(crate) struct Tally {
    counts: Vec<(String, u64)>,
    index: HashMap<String, usize>,
}

impl Tally {
    /// Adds `n` to `name`'s count.
    pub(crate) fn add(&mut self, name: &str, n: u64) {
        match self.index.get(name) {
            Some(&i) => self.counts[i].1 += n,
            None => {
                self.index.insert(name.to_owned(), self.counts.len());
                self.counts.push((name.to_owned(), n));
            }
        }
    }

    /// `name`'s count (0 when never added).
    pub(crate) fn get(&self, name: &str) -> u64 {
        self.index.get(name).map_or(0, |&i| self.counts[i].1)
    }

    /// The sum of every count.
    pub(crate) fn total(&self) -> u64 {
        self.counts.iter().map(|(_, n)| n).sum()
    }

    /// The `top` largest counts, largest first; equal counts in the order they came.
    pub(crate) fn most_common(&self, top: usize) -> Vec<(&str, u64)> {
        let mut sorted: Vec<(&str, u64)> =
            self.counts.iter().map(|(k, n)| (k.as_str(), *n)).collect();
        sorted.sort_by_key(|(_, n)| std::cmp::Reverse(*n));
        sorted.truncate(top);
        sorted
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn median_of_odd_and_even_counts() {
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.5);
        assert_eq!(spread(&[11.7, 11.9, 11.6], 1), "11.7 (11.6–11.9)");
    }

    #[test]
    fn most_common_is_largest_first_ties_in_arrival_order() {
        let mut tally = Tally::default();
        for (name, n) in [("read", 2), ("write", 5), ("epoll_wait", 2), ("read", 1)] {
            tally.add(name, n);
        }
        assert_eq!(
            tally.most_common(3),
            [("write", 5), ("read", 3), ("epoll_wait", 2)]
        );
        assert_eq!(tally.most_common(1), [("write", 5)]);
        assert_eq!(
            (tally.total(), tally.get("read"), tally.get("x")),
            (10, 3, 0)
        );
    }

    #[test]
    fn the_target_column_fits_the_longest_label() {
        assert_eq!(label_width(["nginx", "gateway"]), 16);
        assert_eq!(label_width(["gateway#before_the_change"]), 25);
    }
}
