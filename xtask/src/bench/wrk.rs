//! The load: one wrk thread, every other request with `x-gray-lane: gray`, and the summary
//! line its Lua script prints.

use std::{path::Path, process::Command};

use super::Result;

/// wrk's script: every other request carries `x-gray-lane: gray`; prints one parseable
/// summary line.
pub(crate) const MIXED_LUA: &str = r#"-- Every other request carries `x-gray-lane: gray`; prints one parseable summary line.
local n = 0
local plain, stained
init = function(args)
    plain = wrk.format("GET", "/svc/bench", { EXTRA_HEADERS })
    stained = wrk.format("GET", "/svc/bench", { ["x-gray-lane"] = "gray", EXTRA_HEADERS })
end
request = function()
    n = n + 1
    if n % 2 == 0 then return stained end
    return plain
end
done = function(summary, latency, requests)
    local e = summary.errors
    io.write(string.format(
        "BENCH requests=%d duration_us=%d non2xx=%d connect=%d read=%d write=%d timeout=%d p50_us=%d p99_us=%d\n",
        summary.requests, summary.duration, e.status, e.connect, e.read, e.write, e.timeout,
        latency:percentile(50), latency:percentile(99)))
end
"#;

/// [`MIXED_LUA`] with `Connection: close` on every request when `new_connections` (wrk
/// then opens a new connection for each).
pub(crate) fn mixed_lua(new_connections: bool) -> String {
    MIXED_LUA.replace(
        "EXTRA_HEADERS",
        if new_connections {
            r#"["connection"] = "close""#
        } else {
            ""
        },
    )
}

/// What one wrk run did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Summary {
    pub(crate) requests: u64,
    pub(crate) duration_us: u64,
    pub(crate) non2xx: u64,
    pub(crate) connect: u64,
    pub(crate) read: u64,
    pub(crate) write: u64,
    pub(crate) timeout: u64,
    pub(crate) p50_us: u64,
    pub(crate) p99_us: u64,
}

impl Summary {
    /// Parses the `BENCH key=value ...` line of [`MIXED_LUA`].
    pub(crate) fn parse(line: &str) -> Result<Self> {
        let mut words = line.split_whitespace();
        if words.next() != Some("BENCH") {
            return Err(format!("not a wrk summary line: `{line}`"));
        }
        let mut summary = Summary {
            requests: 0,
            duration_us: 0,
            non2xx: 0,
            connect: 0,
            read: 0,
            write: 0,
            timeout: 0,
            p50_us: 0,
            p99_us: 0,
        };
        let mut seen = 0;
        for word in words {
            let (key, value) = word
                .split_once('=')
                .ok_or_else(|| format!("`{word}` is not key=value in `{line}`"))?;
            let value: u64 = value
                .parse()
                .map_err(|_| format!("`{word}`: not a count in `{line}`"))?;
            let field = match key {
                "requests" => &mut summary.requests,
                "duration_us" => &mut summary.duration_us,
                "non2xx" => &mut summary.non2xx,
                "connect" => &mut summary.connect,
                "read" => &mut summary.read,
                "write" => &mut summary.write,
                "timeout" => &mut summary.timeout,
                "p50_us" => &mut summary.p50_us,
                "p99_us" => &mut summary.p99_us,
                _ => return Err(format!("unknown field `{key}` in `{line}`")),
            };
            *field = value;
            seen += 1;
        }
        if seen != 9 {
            return Err(format!("expected 9 fields in `{line}`, got {seen}"));
        }
        Ok(summary)
    }

    /// Requests per second over the run.
    pub(crate) fn rps(&self) -> f64 {
        self.requests as f64 / (self.duration_us as f64 / 1e6)
    }

    /// The error counts that are not zero, by name.
    pub(crate) fn errors(&self) -> Vec<(&'static str, u64)> {
        [
            ("non2xx", self.non2xx),
            ("connect", self.connect),
            ("read", self.read),
            ("write", self.write),
            ("timeout", self.timeout),
        ]
        .into_iter()
        .filter(|(_, n)| *n > 0)
        .collect()
    }

    /// The requests of a measured run against `label`; fails on any error in it, or when
    /// none completed.
    pub(crate) fn requests_of(&self, label: &str) -> Result<u64> {
        if let Some((field, n)) = self.errors().first() {
            return Err(format!(
                "{label}: {field}={n} in the measured run ({self:?})"
            ));
        }
        if self.requests == 0 {
            return Err(format!(
                "{label}: wrk completed no requests in the measured run"
            ));
        }
        Ok(self.requests)
    }
}

/// One wrk run pinned to CPU `cpu`: one thread, `connections` connections, `seconds`
/// seconds, the script at `script`, against `url`.
pub(crate) fn run(
    cpu: u64,
    connections: u64,
    seconds: u64,
    script: &Path,
    url: &str,
) -> Result<Summary> {
    let output = Command::new("taskset")
        .args(["-c", &cpu.to_string(), "wrk", "-t1"])
        .arg(format!("-c{connections}"))
        .arg(format!("-d{seconds}s"))
        .arg("--latency")
        .arg("-s")
        .arg(script)
        .arg(url)
        .output()
        .map_err(|e| format!("cannot run wrk: {e}"))?;
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    if !output.status.success() {
        return Err(format!(
            "wrk failed against {url} ({}):\n{text}",
            output.status
        ));
    }
    match text.lines().find(|l| l.starts_with("BENCH ")) {
        Some(line) => Summary::parse(line),
        None => Err(format!("no summary from wrk against {url}:\n{text}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const LINE: &str = "BENCH requests=431207 duration_us=5001234 non2xx=0 connect=0 read=0 \
                        write=0 timeout=0 p50_us=712 p99_us=1480";

    #[test]
    fn parses_the_summary_line() {
        let s = Summary::parse(LINE).unwrap();
        assert_eq!(
            (s.requests, s.duration_us, s.p50_us, s.p99_us),
            (431207, 5001234, 712, 1480)
        );
        assert!((s.rps() - 86220.12).abs() < 0.01, "{}", s.rps());
        assert_eq!(s.requests_of("nginx"), Ok(431207));
    }

    #[test]
    fn errors_fail_a_measured_run() {
        let s = Summary::parse(&LINE.replace("read=0", "read=3")).unwrap();
        assert_eq!(s.errors(), [("read", 3)]);
        let err = s.requests_of("gateway").unwrap_err();
        assert!(err.starts_with("gateway: read=3"), "{err}");
        let none = Summary::parse(&LINE.replace("requests=431207", "requests=0")).unwrap();
        assert!(
            none.requests_of("bare")
                .unwrap_err()
                .contains("no requests")
        );
    }

    #[test]
    fn refuses_lines_that_are_not_the_summary() {
        for line in [
            "Running 5s test @ http://127.0.0.1:1/svc/bench",
            "BENCH requests=1",
            "BENCH requests=x duration_us=1",
        ] {
            assert!(Summary::parse(line).is_err(), "{line}");
        }
    }
}
