//! The file-descriptor limit: raised at start where allowed, and the connection and
//! in-flight caps fitted under it with a reserve.
//!
//! Each client connection holds a descriptor, each request in flight to an upstream one
//! more (its upstream connection), and each idle upstream HTTP/1.1 connection kept for
//! reuse one: so the caps are fitted to keep
//! `max_connections + max_in_flight + upstream_max_idle` within the limit less
//! [`RESERVE`] (the listeners, the admin endpoint, etcd, files, connects under way), the
//! idle connections taking at most a quarter of it. The accept loop then stops accepting
//! at `max_connections` before the process runs out, a request over `max_in_flight` gets
//! a 503 instead of an upstream connect that fails, and a connection released when
//! `upstream_max_idle` are idle (over every instance together) is closed instead of kept.
//! A service's mirror (`[services.x.mirror]`) takes twice its `max_in_flight` off the
//! limit first: a connection per copy in flight, and as many idle.
//!
//! What the budget leaves out: each instance's one HTTP/2 connection (a service with
//! `protocol = "h2c"`, `"h2"` or `"auto"`), one descriptor per such instance. Size the
//! hard limit for `max_connections + max_in_flight + upstream_max_idle + (HTTP/2
//! instances) + 64` (`--check` prints the caps as configured; the start lowers them to
//! fit, with a WARN).

use rustix::process::{Resource, Rlimit, getrlimit, setrlimit};

use crate::config::Limits;

/// Descriptors kept out of the caps.
pub(crate) const RESERVE: u64 = 64;

/// Raises the soft descriptor limit to the hard one (nginx's `worker_rlimit_nofile`, set
/// to the hard limit). Returns the soft limit in force, `None` when unlimited.
pub fn raise_nofile_limit() -> Option<u64> {
    let limit = getrlimit(Resource::Nofile);
    if limit.current != limit.maximum {
        let raised = Rlimit {
            current: limit.maximum,
            maximum: limit.maximum,
        };
        if let Err(e) = setrlimit(Resource::Nofile, raised) {
            tracing::debug!(error = %e, "cannot raise the descriptor limit");
        }
    }
    getrlimit(Resource::Nofile).current
}

/// The caps of `limits` fitted under the soft descriptor limit (see the
/// [module docs](self)), less `mirrors` descriptors the mirrors' copies may hold; a WARN
/// names what was lowered.
pub(crate) fn fit(limits: &mut Limits, mirrors: usize) {
    if let Some(nofile) = getrlimit(Resource::Nofile).current {
        fit_under(limits, nofile.saturating_sub(mirrors as u64));
    }
}

fn fit_under(limits: &mut Limits, nofile: u64) {
    let budget = usize::try_from(nofile.saturating_sub(RESERVE)).unwrap_or(usize::MAX);
    let idle = limits.upstream_max_idle;
    limits.upstream_max_idle = idle.min(budget / 4);
    if limits.upstream_max_idle < idle {
        tracing::warn!(
            nofile,
            upstream_max_idle = limits.upstream_max_idle,
            configured_upstream_max_idle = idle,
            "the descriptor limit cannot cover upstream_max_idle: lowered to a quarter of it \
             (raise the hard limit, e.g. LimitNOFILE= in systemd or `ulimit -Hn`)"
        );
    }
    let budget = budget - limits.upstream_max_idle;
    let in_flight = match limits.max_in_flight {
        0 => usize::MAX,
        n => n,
    };
    if limits.max_connections.saturating_add(in_flight) <= budget {
        return;
    }
    let (connections, flights) = (limits.max_connections, limits.max_in_flight);
    limits.max_in_flight = in_flight.min(budget / 2).max(1);
    limits.max_connections = connections
        .min(budget.saturating_sub(limits.max_in_flight))
        .max(1);
    tracing::warn!(
        nofile,
        reserve = RESERVE,
        max_connections = limits.max_connections,
        max_in_flight = limits.max_in_flight,
        configured_max_connections = connections,
        configured_max_in_flight = flights,
        "the descriptor limit cannot cover max_connections and max_in_flight: both lowered \
         (raise the hard limit, e.g. LimitNOFILE= in systemd or `ulimit -Hn`)"
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_are_fitted_under_the_limit_less_the_reserve() {
        let mut limits = Limits::default();
        fit_under(&mut limits, 1024);
        // 960 less a quarter for the idle upstream connections, then halves
        assert_eq!(limits.upstream_max_idle, 240);
        assert_eq!(limits.max_in_flight, 360);
        assert_eq!(limits.max_connections, 360);
        assert!(
            limits.max_connections + limits.max_in_flight + limits.upstream_max_idle
                <= 1024 - RESERVE as usize
        );

        // Within the budget: untouched.
        let mut limits = Limits::default();
        fit_under(&mut limits, 1 << 20);
        assert_eq!(limits, Limits::default());
    }
}
