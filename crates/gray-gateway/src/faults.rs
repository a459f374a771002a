//! Faults for the tests (feature `fault-injection`; never enable it in a build that
//! serves traffic): while the file named by the environment variable `GRAY_FAULT_FILE`
//! has a line `panic <service>` or `hang <service>`, every look of that service's rollout
//! panics, or never completes. The rollout tests of issue 30 use it to check that a
//! controller that panics or hangs is caught and loses the leadership to a gateway that
//! makes progress. Without the feature no such path exists.

/// Called at the start of each look of `service`'s rollout.
pub(crate) async fn look(service: &str) {
    let Some(path) = std::env::var_os("GRAY_FAULT_FILE") else {
        return;
    };
    let Ok(text) = tokio::fs::read_to_string(&path).await else {
        return;
    };
    for line in text.lines() {
        match line.trim().split_once(' ') {
            Some(("panic", s)) if s.trim() == service => {
                panic!("fault injected (GRAY_FAULT_FILE): a look of `{service}` panics")
            }
            Some(("hang", s)) if s.trim() == service => std::future::pending::<()>().await,
            _ => {}
        }
    }
}
