"""A service in another language between the gray gateway and a Rust service.

It has no gray code. Like an app instrumented with OpenTelemetry, it extracts the inbound
`baggage` with OpenTelemetry's W3C propagator (the same getter as the WSGI instrumentation:
`HTTP_BAGGAGE` from the WSGI environ) and injects it into its outbound call. Like many apps,
it also forwards the `x-gray-lane` header it reads, as WSGI names it (`HTTP_X_GRAY_LANE`).
It is served by `wsgiref`, which, like many WSGI servers, maps `x_gray_lane` to the same
`HTTP_X_GRAY_LANE` as `x-gray-lane`.

Usage: python3 otel_hop.py NEXT_URL. Prints the port it listens on (127.0.0.1, port 0),
then answers each request with what it read, what it sent, and the next hop's answer.
"""

import sys
import urllib.request
from wsgiref.simple_server import WSGIRequestHandler, make_server

from opentelemetry import baggage
from opentelemetry.baggage.propagation import W3CBaggagePropagator
from opentelemetry.propagators.textmap import Getter

NEXT = sys.argv[1]
PROPAGATOR = W3CBaggagePropagator()
# No proxy from the environment: the next hop is on loopback.
OPENER = urllib.request.build_opener(urllib.request.ProxyHandler({}))


class EnvironGetter(Getter):
    """Reads a header from the WSGI environ, as opentelemetry-instrumentation-wsgi does."""

    def get(self, carrier, key):
        value = carrier.get("HTTP_" + key.upper().replace("-", "_"))
        return None if value is None else [value]

    def keys(self, carrier):
        return list(carrier)


def app(environ, start_response):
    context = PROPAGATOR.extract(environ, getter=EnvironGetter())
    lane = baggage.get_baggage("gray.lane", context) or ""
    header_lane = environ.get("HTTP_X_GRAY_LANE", "")
    outbound = {}
    PROPAGATOR.inject(outbound, context=context)
    if header_lane:
        outbound["x-gray-lane"] = header_lane
    request = urllib.request.Request(NEXT, headers=outbound)
    with OPENER.open(request, timeout=20) as response:
        body = response.read().decode()
    answer = (
        f"python_lane={lane}\n"
        f"python_x_gray_lane={header_lane}\n"
        f"python_sent_baggage={outbound.get('baggage', '')}\n"
        f"{body}"
    )
    start_response("200 OK", [("content-type", "text/plain")])
    return [answer.encode()]


class QuietHandler(WSGIRequestHandler):
    def log_message(self, *args):
        pass


server = make_server("127.0.0.1", 0, app, handler_class=QuietHandler)
print(server.server_port, flush=True)
server.serve_forever()
