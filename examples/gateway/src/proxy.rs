//! The proxy: `/{service}/rest` goes to an instance of `service` as `/rest`.

use std::{
    collections::HashMap, future::Future, net::IpAddr, pin::Pin, sync::Arc, task::Poll,
    time::Duration,
};

use bytes::Bytes;
use gray_core::{Context, Unroutable};
use gray_tower::edge::PeerAddr;
use http::{HeaderValue, Request, Response, StatusCode, Uri, header};
use http_body_util::{Either, Full};
use hyper::body::Incoming;
use tower::{Service, ServiceExt};

use crate::{hop, metrics::Metrics, upstream::Upstream};

/// The body of every gateway response: streamed from the upstream, or made here.
pub type Body = Either<Incoming, Full<Bytes>>;

/// The routing table and what every request needs.
#[derive(Debug)]
pub struct Routes {
    /// The upstream of each service, by name.
    pub services: HashMap<Box<str>, Upstream>,
    /// The time allowed until an upstream's response headers.
    pub timeout: Duration,
    /// The counters.
    pub metrics: Arc<Metrics>,
}

/// The proxy service (behind the edge layer). Cheap to clone.
#[derive(Debug, Clone)]
pub struct Proxy {
    routes: Arc<Routes>,
}

impl Proxy {
    /// A proxy over `routes`.
    pub fn new(routes: Arc<Routes>) -> Self {
        Proxy { routes }
    }
}

fn json(status: StatusCode, value: serde_json::Value) -> Response<Body> {
    let mut res = Response::new(Either::Right(Full::new(Bytes::from(value.to_string()))));
    *res.status_mut() = status;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

/// Splits `/service/rest?q` into `service` and `/rest?q`.
fn split(uri: &Uri) -> Option<(&str, String)> {
    let path = uri.path().strip_prefix('/')?;
    let (service, rest) = match path.find('/') {
        Some(i) => (&path[..i], &path[i..]),
        None => (path, "/"),
    };
    if service.is_empty() {
        return None;
    }
    let rest = match uri.query() {
        Some(q) => format!("{rest}?{q}"),
        None => rest.to_owned(),
    };
    Some((service, rest))
}

impl Service<Request<Incoming>> for Proxy {
    type Response = Response<Body>;
    type Error = std::convert::Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Body>, Self::Error>> + Send>>;

    fn poll_ready(&mut self, _: &mut std::task::Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<Incoming>) -> Self::Future {
        let routes = self.routes.clone();
        Box::pin(async move { Ok(proxy(&routes, req).await) })
    }
}

async fn proxy(routes: &Routes, mut req: Request<Incoming>) -> Response<Body> {
    let Some((service, rest)) = split(req.uri()) else {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "no service in the path; expected /{service}/…"}),
        );
    };
    let Some(upstream) = routes.services.get(service) else {
        return json(
            StatusCode::NOT_FOUND,
            serde_json::json!({"error": "unknown service", "service": service}),
        );
    };
    let lane = req
        .extensions()
        .get::<Context>()
        .and_then(|c| c.lane().cloned());
    let peer: Option<IpAddr> = req.extensions().get::<PeerAddr>().map(|p| p.0.ip());
    match rest.parse::<Uri>() {
        Ok(uri) => *req.uri_mut() = uri,
        Err(_) => {
            return json(
                StatusCode::BAD_REQUEST,
                serde_json::json!({"error": "invalid path"}),
            );
        }
    }
    hop::strip(req.headers_mut());
    if let Some(peer) = peer {
        hop::append_forwarded_for(req.headers_mut(), peer);
    }
    let lane_label = lane.as_ref().map_or("baseline", |l| l.as_str());
    let metrics = &routes.metrics;
    let call = upstream.balancer.clone().oneshot(req);
    let res = match tokio::time::timeout(routes.timeout, call).await {
        // Served by an instance: the endpoint wrapper counted it and named the instance.
        Ok(Ok(mut res)) => {
            hop::strip(res.headers_mut());
            return res.map(Either::Left);
        }
        Ok(Err(e)) => match e.downcast_ref::<Unroutable>() {
            Some(unroutable) => {
                tracing::info!(service = %upstream.name, lane = lane_label, error = %unroutable, "unroutable");
                json(
                    StatusCode::SERVICE_UNAVAILABLE,
                    serde_json::json!({
                        "error": unroutable.to_string(),
                        "service": unroutable.service(),
                        "lane": lane.as_ref().map(|l| l.as_str()),
                        "policy": unroutable.policy(),
                        "detail": unroutable,
                    }),
                )
            }
            None => {
                tracing::warn!(service = %upstream.name, lane = lane_label, error = %e, "upstream failed");
                json(
                    StatusCode::BAD_GATEWAY,
                    serde_json::json!({"error": e.to_string(), "service": &*upstream.name}),
                )
            }
        },
        Err(_) => {
            tracing::warn!(service = %upstream.name, lane = lane_label, "upstream timed out");
            json(
                StatusCode::GATEWAY_TIMEOUT,
                serde_json::json!({"error": "upstream timed out", "service": &*upstream.name, "timeout_ms": routes.timeout.as_millis() as u64}),
            )
        }
    };
    metrics.request(&upstream.name, lane.as_ref(), None, res.status().as_u16());
    res
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn splits_service_and_rest() {
        let uri: Uri = "/orders/v1/items?id=3".parse().unwrap();
        assert_eq!(split(&uri), Some(("orders", "/v1/items?id=3".to_owned())));
        let uri: Uri = "/orders".parse().unwrap();
        assert_eq!(split(&uri), Some(("orders", "/".to_owned())));
        let uri: Uri = "/".parse().unwrap();
        assert_eq!(split(&uri), None);
    }
}
