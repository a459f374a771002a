//! Child processes a test reads (feature `process`): [`read_stdout_until`] reads a child's
//! standard output until a line says what the test waits for (a program printing the
//! address it listens on), then keeps reading the rest, so the child never blocks on a
//! full pipe.

use tokio::{
    io::{AsyncBufReadExt, BufReader},
    process::Child,
};

use crate::WAIT;

/// Reads `child`'s piped stdout line by line until `found` returns `Some` (within
/// [`WAIT`]: the test fails otherwise, or when the child exits first), then reads the rest
/// in a task. Panics when stdout is not piped or was taken already.
pub async fn read_stdout_until<T>(
    child: &mut Child,
    mut found: impl FnMut(&str) -> Option<T>,
) -> T {
    let stdout = child.stdout.take().expect("the child's stdout is piped");
    let mut lines = BufReader::new(stdout).lines();
    let value = tokio::time::timeout(WAIT, async {
        while let Some(line) = lines.next_line().await.expect("the child's stdout is read") {
            if let Some(value) = found(&line) {
                return value;
            }
        }
        panic!("the child exited before it printed what the test waits for")
    })
    .await
    .expect("the child printed what the test waits for in time");
    tokio::spawn(async move { while let Ok(Some(_)) = lines.next_line().await {} });
    value
}
