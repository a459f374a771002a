#!/usr/bin/env python3
"""An HTTP/1.1 upstream that counts what it is sent, for scripts/h2-abuse-nginx.

`/big` answers 4 MiB, `/upload` reads the request body and answers `ok`, `/__counts`
answers the counts as JSON (connections accepted, open, requests), anything else `ok`.
Prints its port on the first line of stdout.
"""

import json
import socketserver
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

COUNTS = {"accepted": 0, "open": 0, "requests": 0}
LOCK = threading.Lock()


def bump(key, by=1):
    with LOCK:
        COUNTS[key] += by


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def setup(self):
        bump("accepted")
        bump("open")
        super().setup()

    def finish(self):
        super().finish()
        bump("open", -1)

    def log_message(self, *args):
        pass

    def answer(self, body):
        self.send_response(200)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path.endswith("/__counts"):
            with LOCK:
                return self.answer(json.dumps(COUNTS).encode())
        bump("requests")
        if self.path.endswith("/big"):
            chunk = b"x" * 65536
            self.send_response(200)
            self.send_header("content-length", str(64 * len(chunk)))
            self.end_headers()
            try:
                for _ in range(64):
                    self.wfile.write(chunk)
            except OSError:
                pass
            return
        self.answer(b"ok")

    def do_POST(self):
        bump("requests")
        length = int(self.headers.get("content-length", "0") or 0)
        if length:
            self.rfile.read(length)
        elif self.headers.get("transfer-encoding", "").lower() == "chunked":
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                self.rfile.read(size + 2)
                if size == 0:
                    break
        self.answer(b"ok")


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 1024

    def handle_error(self, request, client_address):
        pass  # a client that resets its connection is what the attacks do


def main():
    server = Server(("127.0.0.1", 0), Handler)
    print(server.server_address[1], flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
