//! A copy's task: it waits for the request's body (when it has one), sends the copy to
//! its lane, reads the answer up to the bytes compared, waits for the user's answer and
//! compares the two. Everything it does is bounded by the mirror's `timeout_ms`, from the
//! moment the copy was offered; it holds its place under `max_in_flight` until it ends.

use std::sync::Arc;

use gray_policy::Unroutable;
use http_body_util::BodyExt;
use tokio::{sync::oneshot, time::Instant};
use tower::Service;

use super::{Catch, Copy, Mirror, Mismatch, UserAnswer, compare, describe};

/// Runs `copy` of a request of `mirror` and judges its answer against the user's, from
/// `primary`.
pub(super) async fn run(mirror: Arc<Mirror>, copy: Copy, primary: oneshot::Receiver<UserAnswer>) {
    let outcome = |outcome: &'static str| mirror.series.count(outcome);
    let deadline = Instant::now() + mirror.config.timeout;
    let method = copy.head().method().clone();
    let path = copy.head().uri().path().to_owned();
    // Over the cap, abandoned by the client, or not finished in time: no copy.
    let Ok(Some((req, _place))) = tokio::time::timeout_at(deadline, copy.into_request()).await
    else {
        return outcome("dropped_body");
    };
    outcome("sent");
    let sent = Instant::now();
    let cap = mirror.config.max_compare_bytes;
    let mut balancer = mirror.balancer.clone();
    let answered = tokio::time::timeout_at(deadline, async move {
        let response = balancer.call(req).await?;
        let latency = sent.elapsed();
        let (parts, mut body) = response.into_parts();
        // Read to its end (the connection goes back to the pool), kept up to the cap.
        let mut catch = Catch::new(cap);
        while let Some(frame) = body.frame().await {
            if let Some(data) = frame?.data_ref() {
                catch.feed(data);
            }
        }
        let body = catch.whole();
        Ok::<_, tower::BoxError>((
            compare::Answer {
                status: parts.status,
                headers: parts.headers,
                body,
            },
            latency,
        ))
    })
    .await;
    let (answer, latency) = match answered {
        Ok(Ok(answered)) => answered,
        Ok(Err(error)) if crate::proxy::find::<Unroutable>(&*error).is_some() => {
            return outcome("no_instance");
        }
        failed => {
            let error = match failed {
                Ok(Err(error)) => error.to_string(),
                _ => format!("no answer within {} ms", mirror.config.timeout.as_millis()),
            };
            crate::limits::warn(crate::limits::Warning::MirrorFailed, |suppressed| {
                tracing::warn!(service = %mirror.service, lane = %mirror.config.lane, %error, suppressed, "a mirror's copy failed");
            });
            return outcome("failed");
        }
    };
    mirror.series.duration.observe(latency.as_secs_f64());
    let Ok(Ok(user)) = tokio::time::timeout_at(deadline, primary).await else {
        // The user's answer was the gateway's own, or did not finish in time.
        return outcome("unjudged");
    };
    let differences = compare::compare(&user.answer, &answer, &mirror.ignore);
    if differences.is_empty() {
        return outcome("matched");
    }
    tracing::debug!(service = %mirror.service, lane = %mirror.config.lane, %method, %path, differences = ?describe(&differences), "a mirror's answer differs");
    mirror.remember(Mismatch {
        method: method.to_string(),
        path,
        primary_status: user.answer.status.as_u16(),
        copy_status: answer.status.as_u16(),
        primary_ms: user.latency.as_secs_f64() * 1e3,
        copy_ms: latency.as_secs_f64() * 1e3,
        differences: describe(&differences),
    });
    outcome("mismatched");
}
