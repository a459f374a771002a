//! What a run measures: one [`Mode`] per file, listed in [`MODES`] (the module docs of
//! [`bench`](super) say how to add one).

use std::fmt;

use super::{Result, harness::Bench, tools::Tool};

mod callgrind;
mod cpu;
mod idle;
mod instructions;
mod syscalls;

/// Every mode; the first is the default (no flag).
pub(crate) static MODES: &[&dyn Mode] = &[
    &cpu::Cpu,
    &instructions::Instructions,
    &syscalls::Syscalls,
    &idle::IdleMemory,
];

/// A way of measuring the targets.
pub(crate) trait Mode: Sync + fmt::Debug {
    /// The flag that chooses it (`--instructions`); `None` for the default mode.
    fn flag(&self) -> Option<&'static str>;

    /// Its `--help` entry (lines after the first are indented under it).
    fn about(&self) -> &'static str;

    /// The programs it needs beyond wrk and the targets', with their Debian packages.
    fn tools(&self) -> Vec<Tool> {
        Vec::new()
    }

    /// Whether each target must run as one process (nginx without its master).
    fn one_process(&self) -> bool {
        false
    }

    /// Whether the targets run under an instrumenting tool: starting and answering a check
    /// request get longer bounds (60 s and 10 s, against 10 s and 2 s).
    fn slow_targets(&self) -> bool {
        false
    }

    /// Measures the targets of `bench` and prints the results; fails when a target
    /// misbehaved.
    fn run(&self, bench: &mut Bench<'_>) -> Result<()>;
}
