//! One upgraded connection: the bytes both ways between the client and the instance
//! ([`run`]), until either side closes, the connection idles for its timeout, or the
//! gateway closes it (a rollback, a drain).
//!
//! An idle tunnel holds no buffer: each direction reads into the task's stack and writes
//! at once, and only what its destination did not take is kept, on the heap, until it
//! does. A WebSocket tunnel follows the frames of both directions ([`Frames`]), so that
//! the gateway's own close ends each direction between two frames: what was already
//! forwarded of a frame is finished first, then the close frame goes out (masked towards
//! the instance, as a client's frames are), then the write side is shut, and the
//! tunnel waits a little for both peers to close.

use std::{
    future::poll_fn,
    io,
    mem::MaybeUninit,
    pin::Pin,
    task::{Context, Poll, ready},
    time::Duration,
};

use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::{
    Closed, Closing, Tunnel,
    frames::{Frames, close_frame},
};
use crate::drain::Member;

/// How much one read takes (on the stack).
const CHUNK: usize = 16 * 1024;

/// How long the tunnel waits for both peers to close after its own close frames.
const CLOSE_GRACE: Duration = Duration::from_secs(2);

/// One direction of the tunnel.
struct Half {
    /// What the destination has not taken yet.
    pending: Vec<u8>,
    /// The source is finished (end of stream, or cut by the gateway's close).
    read_done: bool,
    /// The destination's write side is shut.
    shut: bool,
    /// The frames the source sent (WebSocket only).
    frames: Option<Frames>,
    /// The gateway's close frame, once due, until written whole.
    close: Option<(Vec<u8>, usize)>,
    /// The gateway's close frame was written (or there is none to write).
    closed: bool,
    /// A close waits for the end of a frame begun: reads take no byte past it.
    finishing: bool,
    /// Bytes read from the source.
    bytes: u64,
}

impl Half {
    fn new(websocket: bool) -> Self {
        Half {
            pending: Vec::new(),
            read_done: false,
            shut: false,
            frames: websocket.then(Frames::default),
            close: None,
            closed: false,
            finishing: false,
            bytes: 0,
        }
    }

    /// Written to the destination so far, as a position in the source's stream.
    fn written(&self) -> u64 {
        self.frames
            .as_ref()
            .map_or(0, |f| f.pos() - self.pending.len() as u64)
    }

    /// The gateway closes: once what was forwarded of the current frame is finished, the
    /// source is cut and `frame` goes out. Returns whether the cut is made (else it waits
    /// for the rest of a frame begun).
    fn cut(&mut self, frame: impl FnOnce() -> Option<Vec<u8>>) -> bool {
        if self.closed || self.close.is_some() {
            return true;
        }
        if self.read_done {
            // The source ended first: no frame is begun, the close frame follows.
            match (self.frames.is_some(), frame()) {
                (true, Some(frame)) if !self.shut => self.close = Some((frame, 0)),
                _ => self.closed = true,
            }
            return true;
        }
        let Some(frames) = &self.frames else {
            // Not a WebSocket: the write side is shut, nothing is written.
            self.read_done = true;
            self.closed = true;
            return true;
        };
        let start = frames.frame_start();
        let written = self.written();
        if start < written {
            self.finishing = true;
            return false;
        }
        // Everything up to the frame that began at `start` goes; the rest of the frame
        // begun in `pending` (not written at all) is dropped.
        let keep = (start - written) as usize;
        self.pending.truncate(keep);
        self.read_done = true;
        match frame() {
            Some(frame) => self.close = Some((frame, 0)),
            None => self.closed = true,
        }
        true
    }

    /// Moves what it can from `src` to `dst`; `progress` is set when any byte moved.
    fn poll<S, D>(
        &mut self,
        cx: &mut Context<'_>,
        src: &mut S,
        dst: &mut D,
        progress: &mut bool,
    ) -> Poll<io::Result<Step>>
    where
        S: AsyncRead + Unpin,
        D: AsyncWrite + Unpin,
    {
        loop {
            if !self.pending.is_empty() {
                let n = ready!(Pin::new(&mut *dst).poll_write(cx, &self.pending))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                self.pending.drain(..n);
                *progress = true;
                continue;
            }
            if let Some((frame, at)) = &mut self.close {
                let n = ready!(Pin::new(&mut *dst).poll_write(cx, &frame[*at..]))?;
                if n == 0 {
                    return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                }
                *at += n;
                if *at < frame.len() {
                    continue;
                }
                self.close = None;
                self.closed = true;
            }
            if !self.read_done {
                // Not zeroed: a read per wake, most of them short.
                let mut stack = [MaybeUninit::<u8>::uninit(); CHUNK];
                let mut buf = ReadBuf::uninit(&mut stack);
                if Pin::new(&mut *src).poll_read(cx, &mut buf)?.is_pending() {
                    // Flushed before waiting: a TLS stream buffers what it wrote.
                    ready!(Pin::new(&mut *dst).poll_flush(cx))?;
                    return Poll::Pending;
                }
                let mut read = buf.filled();
                if read.is_empty() {
                    self.read_done = true;
                    continue;
                }
                *progress = true;
                if let Some(frames) = &mut self.frames {
                    if self.finishing {
                        // The rest of the frame goes; what follows it is cut with the
                        // source.
                        read = &read[..frames.feed_to_end(read)];
                    } else {
                        frames.feed(read);
                    }
                }
                self.bytes += read.len() as u64;
                // Written at once; only what the destination does not take is kept.
                let mut at = 0;
                while at < read.len() {
                    match Pin::new(&mut *dst).poll_write(cx, &read[at..]) {
                        Poll::Ready(Ok(0)) => {
                            return Poll::Ready(Err(io::ErrorKind::WriteZero.into()));
                        }
                        Poll::Ready(Ok(n)) => at += n,
                        Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                        Poll::Pending => break,
                    }
                }
                self.pending.extend_from_slice(&read[at..]);
                // A read may finish the frame that a cut waits for.
                return Poll::Ready(Ok(Step::Again));
            }
            if !self.shut {
                ready!(Pin::new(&mut *dst).poll_flush(cx))?;
                // A peer that already closed cannot be shut: that is fine.
                let _ = ready!(Pin::new(&mut *dst).poll_shutdown(cx));
                self.shut = true;
            }
            return Poll::Ready(Ok(Step::Done));
        }
    }

    fn done(&self) -> bool {
        self.read_done && self.shut && self.close.is_none() && self.pending.is_empty()
    }
}

/// What [`Half::poll`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Bytes moved: look again (a cut may be due now).
    Again,
    /// The direction is finished: its source ended (or was cut) and its destination shut.
    Done,
}

/// A mask key for a close frame to the instance (RFC 6455 §5.3: unpredictable to the
/// application; only the peer unmasks it).
fn mask_key() -> [u8; 4] {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u64(u64::from(std::process::id()));
    (hasher.finish() as u32).to_ne_bytes()
}

/// Runs `tunnel` between `client` and `upstream`, as a member of the server's drain (a
/// drain closes it with 1001), until it is closed; see the [module docs](self).
pub(crate) async fn run<C, U>(
    mut tunnel: Tunnel,
    mut client: C,
    mut upstream: U,
    member: &mut Member,
) where
    C: AsyncRead + AsyncWrite + Unpin,
    U: AsyncRead + AsyncWrite + Unpin,
{
    let websocket = tunnel.websocket;
    let idle_after = tunnel.tunnels.idle_timeout;
    let mut up = Half::new(websocket);
    let mut down = Half::new(websocket);
    let mut idle = idle_after.map(|after| Box::pin(tokio::time::sleep(after)));
    // Bytes moved since the idle timer was last armed.
    let mut active = false;
    let mut closing: Option<Closing> = None;
    let mut grace: Option<Pin<Box<tokio::time::Sleep>>> = None;
    let outcome = poll_fn(|cx| {
        loop {
            if closing.is_none() {
                closing = if let Some(reason) = tunnel.closer.requested(cx) {
                    Some(reason)
                } else if member.poll_closing(cx, None) {
                    Some(Closing::Drain)
                } else if let (Some(timer), Some(after)) = (&mut idle, idle_after)
                    && timer.as_mut().poll(cx).is_ready()
                {
                    if active {
                        // Bytes moved since the timer was armed: armed again from now, so
                        // that no clock is read per message.
                        active = false;
                        timer.as_mut().reset(tokio::time::Instant::now() + after);
                        continue;
                    }
                    Some(Closing::Idle)
                } else {
                    None
                };
                if closing.is_some() {
                    grace = Some(Box::pin(tokio::time::sleep(CLOSE_GRACE)));
                }
            }
            if let Some(reason) = closing {
                let (code, text) = reason.code();
                down.cut(|| websocket.then(|| close_frame(code, text, None)));
                up.cut(|| websocket.then(|| close_frame(code, text, Some(mask_key()))));
            }
            let mut progress = false;
            let up_step = up.poll(cx, &mut client, &mut upstream, &mut progress);
            let down_step = down.poll(cx, &mut upstream, &mut client, &mut progress);
            tunnel.count(up.bytes, down.bytes);
            if matches!(up_step, Poll::Ready(Err(_))) || matches!(down_step, Poll::Ready(Err(_))) {
                return Poll::Ready(closing.map_or(Closed::Error, Closed::from));
            }
            if up.done() && down.done() {
                let Some(reason) = closing else {
                    // Both peers closed their side (a WebSocket's close handshake is over).
                    return Poll::Ready(Closed::Peer);
                };
                // The gateway's close frames are out and its write sides shut: the peers'
                // answers are read and dropped until both close, within the grace.
                let client_gone = drain_reads(cx, &mut client);
                if (client_gone && drain_reads(cx, &mut upstream))
                    || grace
                        .as_mut()
                        .is_some_and(|g| g.as_mut().poll(cx).is_ready())
                {
                    return Poll::Ready(Closed::from(reason));
                }
                return Poll::Pending;
            }
            if progress {
                active = true;
                continue;
            }
            // A cut waits for the rest of a frame begun, or a peer to take its close
            // frame: within the grace.
            if let Some(reason) = closing
                && grace
                    .as_mut()
                    .is_some_and(|g| g.as_mut().poll(cx).is_ready())
            {
                return Poll::Ready(Closed::from(reason));
            }
            return Poll::Pending;
        }
    })
    .await;
    tunnel.count(up.bytes, down.bytes);
    tunnel.closed(outcome);
}

/// Reads and drops what `io` sends: true once it is closed (or failed).
fn drain_reads<I: AsyncRead + Unpin>(cx: &mut Context<'_>, io: &mut I) -> bool {
    let mut stack = [MaybeUninit::<u8>::uninit(); 1024];
    loop {
        let mut buf = ReadBuf::uninit(&mut stack);
        match Pin::new(&mut *io).poll_read(cx, &mut buf) {
            Poll::Ready(Ok(())) if buf.filled().is_empty() => return true,
            Poll::Ready(Ok(())) => {}
            Poll::Ready(Err(_)) => return true,
            Poll::Pending => return false,
        }
    }
}
