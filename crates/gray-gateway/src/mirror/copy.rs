//! A copy's task, on the copies' thread: it waits for the request's body (when it has
//! one), sends the copy to its lane, reads the answer up to the bytes compared, waits for
//! the user's answer (when its body was still on its way at the hand-over) and compares
//! the two; for a request drawn for a control, it then sends the same request to a second
//! baseline instance (not the one that answered the user) and compares that answer too.
//! Both comparisons go to the mirror's judge. Everything it does is bounded by the
//! mirror's `timeout_ms`, from the moment the copy was handed over; it holds its place
//! under `max_in_flight` from the moment it was offered until it ends.

use std::{sync::Arc, time::Duration};

use bytes::Bytes;
use gray_core::Stain;
use gray_policy::Unroutable;
use gray_rollout::{Arm, shadow::Comparison};
use http::Request;
use http_body_util::{BodyExt, Full};
use tokio::time::Instant;
use tower::{BoxError, Service};

use super::{
    Catch, Copy, Mirror, Mismatch, compare,
    compare::Answer,
    describe,
    primary::{User, UserAnswer},
};
use crate::upstream::X_GRAY_INSTANCE;

/// A copy handed to the copies' thread.
#[derive(Debug)]
pub(super) struct Job {
    pub(super) mirror: Arc<Mirror>,
    pub(super) copy: Copy,
    /// Whether it has a control (the same request to a second baseline instance).
    pub(super) control: bool,
    /// What it gets of the answer the user got.
    pub(super) user: User,
}

/// Runs a copy of a request of `mirror` (and its control, with `control`) and judges the
/// answers against the user's.
pub(super) async fn run(job: Job) {
    let Job {
        mirror,
        mut copy,
        control,
        user,
    } = job;
    let outcome = |outcome: &'static str| mirror.series.count(outcome);
    let deadline = Instant::now() + mirror.config.timeout;
    let method = copy.method().clone();
    let path = copy.head().uri().path().to_owned();
    // Over the cap, abandoned by the client, or not finished in time: no copy.
    let Ok(Some((req, _place))) = tokio::time::timeout_at(deadline, copy.into_request()).await
    else {
        return outcome("dropped_body");
    };
    // The control: the same request, as baseline's.
    let control = control.then(|| mirror.control_request(&req));
    outcome("sent");
    let mut balancer = mirror.balancer.clone();
    let cap = mirror.config.max_compare_bytes;
    let answered = tokio::time::timeout_at(deadline, send(&mut balancer, req, cap)).await;
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
    let user = match user {
        User::Answered(user) => user,
        User::Later(later) => match tokio::time::timeout_at(deadline, later).await {
            Ok(Ok(user)) => user,
            // The user's answer did not finish, or not in time.
            _ => return outcome("unjudged"),
        },
        // The user's answer was the gateway's own.
        User::Unanswered => return outcome("unjudged"),
    };
    let differences = compare::compare(&user.answer, &answer, &mirror.ignore);
    let copy = Comparison::new(
        Arm::Gray,
        describe(&differences),
        slower(latency, user.latency),
    );
    // The control, when drawn: the same request to another baseline instance, judged in a
    // pair with the copy (the test counts pairs only).
    let control = match control {
        None => None,
        Some(control) => {
            match tokio::time::timeout_at(deadline, mirror.send_control(control, &user)).await {
                Ok(Some(Ok((answer, control_latency)))) => {
                    let differences = compare::compare(&user.answer, &answer, &mirror.ignore);
                    let slow = slower(control_latency, user.latency);
                    Some(Comparison::new(Arm::Baseline, describe(&differences), slow))
                }
                // No other baseline instance: no control.
                Ok(None) => None,
                _ => {
                    outcome("control_failed");
                    None
                }
            }
        }
    };
    let (judged, control) = mirror.judge(&copy, control.as_ref());
    if let Some(control) = control {
        outcome(if control.differences.is_empty() {
            "control_matched"
        } else {
            "control_mismatched"
        });
    }
    if judged.differences.is_empty() {
        return outcome("matched");
    }
    tracing::debug!(service = %mirror.service, lane = %mirror.config.lane, %method, %path, differences = ?judged.differences, "a mirror's answer differs");
    mirror.remember(Mismatch {
        method: method.to_string(),
        path,
        primary_status: user.answer.status.as_u16(),
        copy_status: answer.status.as_u16(),
        primary_ms: user.latency.as_secs_f64() * 1e3,
        copy_ms: latency.as_secs_f64() * 1e3,
        differences: judged.differences,
    });
    outcome("mismatched");
}

/// Whether an answer in `latency` is slow against the user's `user`: more than twice it,
/// and more than 10 ms beyond it.
fn slower(latency: Duration, user: Duration) -> bool {
    latency > (user * 2).max(user + Duration::from_millis(10))
}

/// Sends `req` through `service` and reads its answer to its end, kept up to `cap`
/// bytes; the answer and its time to its head.
async fn send<S>(
    service: &mut S,
    req: Request<Full<Bytes>>,
    cap: usize,
) -> Result<(Answer, Duration), BoxError>
where
    S: Service<
            Request<Full<Bytes>>,
            Response = http::Response<gray_discovery::http::ResponseBody>,
            Error = BoxError,
        >,
{
    let sent = Instant::now();
    std::future::poll_fn(|cx| service.poll_ready(cx)).await?;
    let response = service.call(req).await?;
    let latency = sent.elapsed();
    let (parts, mut body) = response.into_parts();
    // Read to its end (the connection goes back to the pool), kept up to the cap.
    let mut catch = Catch::new(cap);
    while let Some(frame) = body.frame().await {
        if let Some(data) = frame?.data_ref() {
            catch.feed(data);
        }
    }
    let answer = Answer {
        status: parts.status,
        headers: parts.headers,
        body: catch.whole(),
    };
    Ok((answer, latency))
}

impl Mirror {
    /// The control of a copy `req`: the same request with baseline's stain (no carrier).
    fn control_request(&self, req: &Request<Full<Bytes>>) -> Request<Full<Bytes>> {
        let mut control = Request::new(req.body().clone());
        *control.method_mut() = req.method().clone();
        *control.uri_mut() = req.uri().clone();
        *control.version_mut() = req.version();
        *control.headers_mut() = req.headers().clone();
        let baseline = Stain::baseline();
        self.copier
            .carriers()
            .inject(&baseline, control.headers_mut());
        control.extensions_mut().insert(baseline);
        control
    }

    /// Sends `control` to a baseline instance other than the one that answered `user`;
    /// `None` when there is none.
    async fn send_control(
        &self,
        control: Request<Full<Bytes>>,
        user: &UserAnswer,
    ) -> Option<Result<(Answer, Duration), BoxError>> {
        // Without the instance that answered the user, no control: it could be the same.
        let served = user
            .answer
            .headers
            .get(X_GRAY_INSTANCE)
            .and_then(|v| v.to_str().ok())?;
        // Picked as if the user's instance were ejected: among the others, as the balancer
        // picks (a pick that skipped the user's instance by drawing again would keep
        // finding it where the balancer prefers it, and make few controls).
        let picked = self
            .balancer
            .pick_other(Some(&Stain::baseline()), served)
            .ok()
            .filter(|picked| picked.key().as_str() != served)?;
        let mut endpoint = picked.endpoint().clone();
        let sent = send(&mut endpoint, control, self.config.max_compare_bytes).await;
        match &sent {
            Ok(_) => picked.succeeded(),
            Err(error) => {
                picked.failed_with(&**error);
            }
        }
        Some(sent)
    }
}
