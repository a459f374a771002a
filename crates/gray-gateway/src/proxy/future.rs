//! The proxy's response future: the upstream's answer once its body showed what comes
//! first, or the gateway's own.

use std::{future::Future, pin::Pin, sync::Arc, task::Poll};

use gray_core::Lane;
use gray_tower::edge::hop;
use http::{Response, StatusCode};
use http_body_util::Either;

use super::{
    Body, Routes,
    answers::{failed, json, reply},
    upgrade::{Upgrading, switched},
};
use crate::{
    hold::{First, HeldBody, Hold, poll_first},
    limits::Flight,
    mirror::Primary,
    rollout::Timing,
    upstream::{BalancerCall, Served},
};

pin_project_lite::pin_project! {
    /// The response future of [`Proxy`]: the upstream's response with its hop-by-hop
    /// headers removed, once its body's first frame arrived (or the hold's bound passed),
    /// or the gateway's own answer (404, 502, 503, 504).
    pub(crate) struct ProxyFuture {
        #[pin]
        pub(super) state: State,
    }
}

pin_project_lite::pin_project! {
    #[project = StateProj]
    pub(super) enum State {
        // The gateway's own answer, boxed as the call is (see `Upstream`): it is rare.
        Ready { response: Option<Box<Response<Body>>> },
        Upstream {
            // Boxed: the future moves by value through the layers before hyper pins it,
            // and the balancer's call (512 bytes, the request inside) would be copied at
            // each move; one allocation costs less (docs/performance.md).
            call: Pin<Box<Call>>,
            // Set once the response head arrived.
            hold: Option<Hold>,
            routes: Arc<Routes>,
            service: Arc<str>,
            lane: Option<Lane>,
            // The client speaks gRPC: the gateway's own answers are gRPC statuses.
            grpc: bool,
            timing: Timing,
            // Leaves the in-flight counts with the future.
            flight: Flight,
            // An upgrade request (WebSocket).
            upgrading: Option<Box<Upgrading>>,
            // A request copied for the service's mirror: its copy gets the answer.
            primary: Option<Box<Primary>>,
        },
    }
}

pin_project_lite::pin_project! {
    /// What a request's box holds: the balancer's call, then, when the answer waits for
    /// the next pass of the scheduler (see `ProxyFuture::poll`), the answer, written in
    /// the call's place: no allocation, and memory the call has just warmed.
    #[project = CallProj]
    pub(super) enum Call {
        Sending { #[pin] call: BalancerCall },
        Answered { response: Option<Response<Body>> },
    }
}

impl std::fmt::Debug for ProxyFuture {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProxyFuture").finish_non_exhaustive()
    }
}

impl ProxyFuture {
    pub(super) fn ready(response: Response<Body>) -> Self {
        ProxyFuture {
            state: State::Ready {
                response: Some(Box::new(response)),
            },
        }
    }
}

impl Future for ProxyFuture {
    type Output = Result<Response<Body>, std::convert::Infallible>;

    /// A request is sent to its instance in the poll that routed it. Its answer, while
    /// other requests are in flight, is handed to hyper one pass of the scheduler after
    /// it arrived (a wake of the task by itself puts it at the back of the run queue):
    /// the answers that arrived together are then written together, so that a client
    /// busy with several connections (a load balancer, a pooled client) is woken once for
    /// several rather than once each. An answer alone in flight has nothing to wait for:
    /// it is written at once, which saves the pass a client sending one request after
    /// another would pay for nothing. Waiting before sending instead saved less CPU per
    /// request at 64 connections (docs/performance.md). See the gateway docs, *Routing*.
    fn poll(self: Pin<&mut Self>, cx: &mut std::task::Context<'_>) -> Poll<Self::Output> {
        let mut state = self.project().state;
        let response = match state.as_mut().project() {
            StateProj::Ready { response } => {
                return Poll::Ready(Ok(response
                    .take()
                    .map_or_else(polled_after_completion, |response| *response)));
            }
            StateProj::Upstream {
                call,
                hold,
                routes,
                service,
                lane,
                grpc,
                timing,
                flight,
                upgrading,
                primary,
            } => {
                let sending = match call.as_mut().project() {
                    CallProj::Sending { call } => call,
                    // Answered in the previous pass (below).
                    CallProj::Answered { response } => {
                        let response = response.take().unwrap_or_else(polled_after_completion);
                        state.set(State::Ready { response: None });
                        return Poll::Ready(Ok(response));
                    }
                };
                let mut finished = None;
                if hold.is_none() {
                    let Served {
                        mut response,
                        tally,
                    } = match std::task::ready!(sending.poll(cx)) {
                        Ok(served) => served,
                        Err(error) => {
                            let (status, res) =
                                failed(routes, service, lane.as_ref(), *grpc, &*error);
                            // Timed and counted as the gateway's status, also when a gRPC
                            // client reads it as a gRPC status in an HTTP 200.
                            timing.done(status.as_u16());
                            routes
                                .metrics
                                .answered(service, lane.as_ref(), status.as_u16());
                            return Poll::Ready(Ok(res));
                        }
                    };
                    if response.status() == StatusCode::SWITCHING_PROTOCOLS {
                        let res = match upgrading.take() {
                            Some(upgrading) => switched(
                                service,
                                lane.as_ref(),
                                timing,
                                response,
                                tally,
                                *upgrading,
                            ),
                            // A 101 to a request that asked for no upgrade.
                            None => {
                                tally.count(lane.as_ref(), StatusCode::BAD_GATEWAY.as_u16());
                                timing.done(StatusCode::BAD_GATEWAY.as_u16());
                                json(
                                    StatusCode::BAD_GATEWAY,
                                    serde_json::json!({"error": "the instance switched protocols unasked (101)", "service": &**service}),
                                )
                            }
                        };
                        state.set(State::Ready { response: None });
                        return Poll::Ready(Ok(res));
                    }
                    hop::strip(response.headers_mut());
                    // Most bodies bring their first frame with the head: nothing is held.
                    let first = match poll_first(response.body_mut(), cx) {
                        Poll::Ready(first) => Some(first),
                        Poll::Pending if routes.head_hold.is_zero() => Some(First::Nothing),
                        Poll::Pending => None,
                    };
                    match first {
                        Some(first) => {
                            let served = Served { response, tally };
                            finished = Some(finish(
                                service,
                                lane,
                                *grpc,
                                timing,
                                served,
                                first,
                                primary.take(),
                            ));
                        }
                        None => *hold = Some(Hold::new(response, tally, routes.head_hold)),
                    }
                }
                let response = match finished {
                    Some(response) => response,
                    // Held: polled at once, so that its timer is armed.
                    None => {
                        let Some(held) = hold.as_mut() else {
                            return Poll::Ready(Ok(polled_after_completion()));
                        };
                        match std::task::ready!(held.poll(cx)) {
                            Some((first, response, tally)) => finish(
                                service,
                                lane,
                                *grpc,
                                timing,
                                Served { response, tally },
                                first,
                                primary.take(),
                            ),
                            None => polled_after_completion(),
                        }
                    }
                };
                if flight.others_in_flight() {
                    // Answered in the next pass, with the others that arrive in this one.
                    call.as_mut().set(Call::Answered {
                        response: Some(response),
                    });
                    cx.waker().wake_by_ref();
                    return Poll::Pending;
                }
                response
            }
        };
        state.set(State::Ready { response: None });
        Poll::Ready(Ok(response))
    }
}

fn polled_after_completion() -> Response<Body> {
    json(
        StatusCode::INTERNAL_SERVER_ERROR,
        serde_json::json!({"error": "response polled after completion"}),
    )
}

/// The answer to a request an instance served, once its body showed what comes first:
/// the response, counted under the instance (and handed to its mirror's copy, if it has
/// one: whole, or teed as it streams); or, when the body failed before its first byte, a 502 the client can act on,
/// counted under it as such.
fn finish(
    service: &Arc<str>,
    lane: &Option<Lane>,
    grpc: bool,
    timing: &Timing,
    served: Served,
    first: First,
    primary: Option<Box<Primary>>,
) -> Response<Body> {
    let Served { response, tally } = served;
    let lane = lane.as_ref();
    if let First::Failed(error) = first {
        let lane_label = lane.map_or("baseline", |l| l.as_str());
        let instance = tally.instance().to_owned();
        tally.count(lane, StatusCode::BAD_GATEWAY.as_u16());
        timing.done(StatusCode::BAD_GATEWAY.as_u16());
        tracing::warn!(service = %service, lane = lane_label, %instance, error = %error, "upstream failed after its response head, before its body: 502");
        return reply(
            grpc,
            StatusCode::BAD_GATEWAY,
            serde_json::json!({
                "error": format!("the upstream's response body failed before its first byte: {error}"),
                "service": &**service,
                "instance": instance,
            }),
        );
    }
    let fell_back = tally.fell_back();
    let answerer = tally.answerer();
    tally.count(lane, response.status().as_u16());
    timing.served(response.status().as_u16(), fell_back);
    let (head, rest) = response.into_parts();
    let mut body = HeldBody::new(first, rest, grpc, answerer);
    if let Some(primary) = primary {
        let tee = primary.answered(head.status, &head.headers, body.whole().as_ref());
        body = body.with_tee(tee);
    }
    Response::from_parts(head, Either::Left(body))
}
