#!/usr/bin/env python3
"""A well-behaved HTTP/1.1 client for scripts/h2-abuse-nginx: `GET URL` on one keep-alive
connection about 100 times a second for SECONDS; prints its statuses and p99 as JSON."""

import http.client
import json
import sys
import time
from urllib.parse import urlsplit


def main():
    url, seconds = urlsplit(sys.argv[1]), float(sys.argv[2])
    headers = {"x-forwarded-for": sys.argv[3]} if len(sys.argv) > 3 else {}
    conn = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
    latencies, statuses, errors = [], {}, 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        began = time.monotonic()
        try:
            conn.request("GET", url.path, headers=headers)
            response = conn.getresponse()
            response.read()
            statuses[response.status] = statuses.get(response.status, 0) + 1
        except (OSError, http.client.HTTPException):
            errors += 1
            conn.close()
            conn = http.client.HTTPConnection(url.hostname, url.port, timeout=20)
        latencies.append(time.monotonic() - began)
        time.sleep(0.01)
    latencies.sort()
    p99 = latencies[min(len(latencies) - 1, len(latencies) * 99 // 100)] if latencies else None
    print(json.dumps({"statuses": statuses, "errors": errors, "p99_ms": round(p99 * 1000, 1)}))


if __name__ == "__main__":
    main()
