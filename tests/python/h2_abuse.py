#!/usr/bin/env python3
"""A raw-frame HTTP/2 client that misbehaves, for the gateway's abuse tests (issue 22).

Driven by crates/gray-gateway/tests/h2_abuse.rs, and usable by hand against nginx:

  h2_abuse.py reset HOST:PORT PATH --connections C --rate R --seconds S
      opens streams (GET, END_STREAM) and resets each at once (RST_STREAM CANCEL), R per
      second on each of C connections, for S seconds;
  h2_abuse.py slow HOST:PORT PATH --connections C --streams N --seconds S
      opens N streams (POST) spread over C connections and sends each a 1-byte DATA frame
      per second, for S seconds or until the server has closed them all;
  h2_abuse.py stall HOST:PORT PATH --connections C --streams N --window W --seconds S
      opens N streams (GET) over C connections with a stream window of W bytes that it
      never reopens: each response stops after W bytes. Prints `ready` once every stream has
      received W bytes (or ended), then holds the connections until stdin closes or the
      server has closed them all (W = 0: streams that never open their window).

--forwarded-for IP adds `X-Forwarded-For: IP` to each request (a client behind a trusted
proxy, for per-client limits).

Each mode prints one JSON object per line on stdout; the last one is the summary.
Needs the `h2` package (scripts/test installs it).
"""

import argparse
import json
import select
import socket
import sys
import time

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings

CANCEL = 0x8


class Conn:
    """One client connection: a socket and its h2 state machine."""

    def __init__(self, addr, window=None):
        host, port = addr.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)))
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.h2 = h2.connection.H2Connection(
            h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        )
        self.h2.initiate_connection()
        if window is not None:
            self.h2.update_settings({h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: window})
            # The connection's window is no limit: the streams' windows are.
            self.h2.increment_flow_control_window(2**31 - 1 - 65535)
        self.goaway = None
        self.closed = False
        # The server closed the connection (a GOAWAY may be lost when it resets it).
        self.ended_by_server = False
        self.flush()

    def flush(self):
        data = self.h2.data_to_send()
        if data and not self.closed:
            try:
                self.sock.sendall(data)
            except OSError:
                self.closed = self.ended_by_server = True

    def receive(self):
        """Reads what has arrived (without waiting) and returns its events."""
        try:
            data = self.sock.recv(1 << 20)
        except BlockingIOError:
            return []
        except OSError:
            self.closed = self.ended_by_server = True
            return []
        if not data:
            self.closed = self.ended_by_server = True
            return []
        try:
            events = self.h2.receive_data(data)
        except h2.exceptions.ProtocolError:
            # After the server's GOAWAY, h2 refuses its further frames (the GOAWAY event
            # is lost with them).
            self.closed = True
            self.ended_by_server = self.h2.state_machine.state.name == "CLOSED"
            return []
        for event in events:
            if isinstance(event, h2.events.ConnectionTerminated):
                self.goaway = event.error_code
        self.flush()
        return events


FORWARDED_FOR = None


def headers(method, addr, path):
    out = [
        (":method", method),
        (":scheme", "http"),
        (":authority", addr),
        (":path", path),
    ]
    if FORWARDED_FOR:
        out.append(("x-forwarded-for", FORWARDED_FOR))
    return out


def pump(conns, timeout):
    """Waits up to `timeout` for any connection to be readable; returns (conn, event)s."""
    open_conns = [c for c in conns if not c.closed]
    if not open_conns:
        return []
    readable, _, _ = select.select([c.sock for c in open_conns], [], [], timeout)
    out = []
    for c in open_conns:
        if c.sock in readable:
            out.extend((c, e) for e in c.receive())
    return out


def settle(conns):
    """Waits (at most 5 s) for each server's SETTINGS: its stream cap and windows."""
    settled = set()
    deadline = time.monotonic() + 5
    while len(settled) < len(conns) and time.monotonic() < deadline:
        for c, e in pump(conns, 0.1):
            if isinstance(e, h2.events.RemoteSettingsChanged):
                settled.add(id(c))


def reset(args):
    conns = [Conn(args.addr) for _ in range(args.connections)]
    for c in conns:
        c.sock.setblocking(False)
    opened = 0
    start = time.monotonic()
    interval = 1.0 / args.rate
    next_at = start
    while time.monotonic() - start < args.seconds:
        now = time.monotonic()
        if now >= next_at:
            next_at += interval
            for c in conns:
                if c.closed or c.goaway is not None:
                    continue
                try:
                    sid = c.h2.get_next_available_stream_id()
                    c.h2.send_headers(sid, headers("GET", args.addr, args.path), end_stream=True)
                    c.h2.reset_stream(sid, error_code=CANCEL)
                    opened += 1
                except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError):
                    # h2 refuses to open streams after the server's GOAWAY.
                    c.closed = True
                    c.ended_by_server = c.h2.state_machine.state.name == "CLOSED"
                c.flush()
        if all(c.closed or c.goaway is not None for c in conns):
            break
        pump(conns, max(0.0, min(next_at - time.monotonic(), 0.05)))
    goaways = sum(1 for c in conns if c.goaway is not None)
    print(json.dumps({
        "mode": "reset", "opened": opened, "goaway": goaways,
        "goaway_codes": sorted({int(c.goaway) for c in conns if c.goaway is not None}),
        "ended_by_server": sum(1 for c in conns if c.ended_by_server or c.goaway is not None),
        "seconds": round(time.monotonic() - start, 3),
    }), flush=True)


def slow(args):
    conns = [Conn(args.addr) for _ in range(args.connections)]
    for c in conns:
        c.sock.setblocking(False)
    settle(conns)
    start = time.monotonic()
    streams = {}  # (conn index, stream id) -> opened at
    closed = {}  # (conn index, stream id) -> closed at (seconds since start)
    statuses = {}
    refused = 0
    per_conn = -(-args.streams // args.connections)
    for i, c in enumerate(conns):
        for _ in range(per_conn):
            if len(streams) >= args.streams:
                break
            try:
                sid = c.h2.get_next_available_stream_id()
                c.h2.send_headers(sid, headers("POST", args.addr, args.path))
                streams[(i, sid)] = time.monotonic()
            except h2.exceptions.TooManyStreamsError:
                refused += 1
            except h2.exceptions.ProtocolError:
                c.closed = True
                break
        c.flush()
    next_byte = time.monotonic() + 1
    index = {id(c): i for i, c in enumerate(conns)}
    while time.monotonic() - start < args.seconds and len(closed) < len(streams):
        for c, e in pump(conns, max(0.0, min(next_byte - time.monotonic(), 0.1))):
            i = index[id(c)]
            sid = getattr(e, "stream_id", None)
            if isinstance(e, h2.events.ResponseReceived):
                status = dict(e.headers).get(":status", "?")
                statuses[status] = statuses.get(status, 0) + 1
            if isinstance(e, (h2.events.StreamReset, h2.events.StreamEnded, h2.events.ResponseReceived)):
                if (i, sid) in streams and (i, sid) not in closed:
                    closed[(i, sid)] = round(time.monotonic() - start, 3)
        for i, c in enumerate(conns):
            if c.closed:
                for key in streams:
                    if key[0] == i and key not in closed:
                        closed[key] = round(time.monotonic() - start, 3)
        if time.monotonic() >= next_byte:
            next_byte += 1
            for (i, sid) in streams:
                if (i, sid) in closed or conns[i].closed:
                    continue
                try:
                    conns[i].h2.send_data(sid, b"x")
                except (h2.exceptions.ProtocolError, h2.exceptions.StreamClosedError,
                        h2.exceptions.FlowControlError):
                    closed[(i, sid)] = round(time.monotonic() - start, 3)
            for c in conns:
                c.flush()
    times = sorted(closed.values())
    print(json.dumps({
        "mode": "slow", "opened": len(streams), "refused": refused, "closed": len(closed),
        "statuses": statuses,
        "first_closed": times[0] if times else None, "last_closed": times[-1] if times else None,
        "seconds": round(time.monotonic() - start, 3),
    }), flush=True)


def stall(args):
    conns = [Conn(args.addr, window=args.window) for _ in range(args.connections)]
    for c in conns:
        c.sock.setblocking(False)
    settle(conns)
    received = {}  # (conn index, stream id) -> bytes
    ended = set()
    per_conn = -(-args.streams // args.connections)
    for i, c in enumerate(conns):
        for _ in range(per_conn):
            if len(received) >= args.streams:
                break
            try:
                sid = c.h2.get_next_available_stream_id()
                c.h2.send_headers(sid, headers("GET", args.addr, args.path), end_stream=True)
                received[(i, sid)] = 0
            except (h2.exceptions.TooManyStreamsError, h2.exceptions.ProtocolError):
                break
        c.flush()
    index = {id(c): i for i, c in enumerate(conns)}
    statuses = {}
    resets = {}
    deadline = time.monotonic() + args.seconds
    while time.monotonic() < deadline:
        for c, e in pump(conns, 0.1):
            key = (index[id(c)], getattr(e, "stream_id", None))
            if isinstance(e, h2.events.ResponseReceived):
                status = dict(e.headers).get(":status", "?")
                statuses[status] = statuses.get(status, 0) + 1
            elif isinstance(e, h2.events.DataReceived):
                received[key] = received.get(key, 0) + len(e.data)
            elif isinstance(e, h2.events.StreamEnded):
                ended.add(key)
            elif isinstance(e, h2.events.StreamReset):
                ended.add(key)
                resets[int(e.error_code)] = resets.get(int(e.error_code), 0) + 1
        if all(n >= args.window or k in ended for k, n in received.items()):
            break
        if all(c.closed for c in conns):
            break
    total = sum(received.values())
    print(json.dumps({
        "mode": "stall", "ready": True, "streams": len(received), "received": total,
        "ended": len(ended), "statuses": statuses, "resets": resets,
    }), flush=True)
    # Hold the connections, reading (so the server's frames are not what stalls) without
    # ever reopening a window, until stdin closes or the server has closed them all.
    held = time.monotonic()
    for c in conns:
        c.sock.setblocking(False)
    socks = [c.sock for c in conns if not c.closed]
    while socks:
        readable, _, _ = select.select(socks + [sys.stdin], [], [], 1.0)
        if sys.stdin in readable and not sys.stdin.read(1):
            break
        for c in conns:
            if c.sock in readable:
                for e in c.receive():
                    if isinstance(e, (h2.events.StreamEnded, h2.events.StreamReset)):
                        ended.add((index[id(c)], e.stream_id))
        socks = [c.sock for c in conns if not c.closed]
    print(json.dumps({
        "mode": "stall", "streams": len(received), "ended": len(ended),
        "closed_by_server": sum(1 for c in conns if c.ended_by_server),
        "held": round(time.monotonic() - held, 3),
    }), flush=True)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("mode", choices=["reset", "slow", "stall"])
    parser.add_argument("addr")
    parser.add_argument("path")
    parser.add_argument("--connections", type=int, default=1)
    parser.add_argument("--rate", type=float, default=100.0)
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--streams", type=int, default=100)
    parser.add_argument("--window", type=int, default=1 << 20)
    parser.add_argument("--forwarded-for", help="an X-Forwarded-For header on each request")
    args = parser.parse_args()
    global FORWARDED_FOR
    FORWARDED_FOR = args.forwarded_for
    {"reset": reset, "slow": slow, "stall": stall}[args.mode](args)


if __name__ == "__main__":
    main()
