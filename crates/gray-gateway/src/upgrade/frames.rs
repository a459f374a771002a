//! Where WebSocket frames begin in a byte stream ([`Frames`]), and the close frames the
//! gateway writes ([`close_frame`]): enough of RFC 6455 §5.2 to end a tunnel between two
//! frames, never in the middle of one.

/// Follows the frame headers of one direction of a WebSocket connection: after every
/// chunk fed, [`frame_start`](Self::frame_start) is where the frame that the stream has
/// reached began (the stream's position itself when it sits between two frames).
#[derive(Debug, Default, Clone)]
pub(super) struct Frames {
    /// Bytes fed so far.
    pos: u64,
    /// Where the frame containing `pos` began.
    frame_start: u64,
    /// The header being read.
    header: [u8; 14],
    have: u8,
    /// Payload bytes of the current frame still to come (its header read whole).
    remaining: u64,
}

impl Frames {
    /// Follows `data`, the next bytes of the stream.
    pub(super) fn feed(&mut self, mut data: &[u8]) {
        while !data.is_empty() {
            if self.remaining > 0 {
                let n = usize::try_from(self.remaining).map_or(data.len(), |r| r.min(data.len()));
                self.remaining -= n as u64;
                self.pos += n as u64;
                data = &data[n..];
                if self.remaining == 0 {
                    self.frame_start = self.pos;
                }
                continue;
            }
            if self.have == 0 {
                self.frame_start = self.pos;
            }
            self.header[usize::from(self.have)] = data[0];
            self.have += 1;
            self.pos += 1;
            data = &data[1..];
            if let Some(payload) = self.header_done() {
                self.have = 0;
                self.remaining = payload;
                if payload == 0 {
                    self.frame_start = self.pos;
                }
            }
        }
    }

    /// Follows `data` up to the end of the frame the stream is in (all of it if that frame
    /// goes on past it); returns how many bytes that took.
    pub(super) fn feed_to_end(&mut self, data: &[u8]) -> usize {
        let mut used = 0;
        while used < data.len() {
            let step = if self.remaining > 0 {
                usize::try_from(self.remaining)
                    .map_or(data.len() - used, |r| r.min(data.len() - used))
            } else {
                1
            };
            self.feed(&data[used..used + step]);
            used += step;
            if self.frame_start == self.pos {
                break;
            }
        }
        used
    }

    /// The payload length once the header read so far is whole.
    fn header_done(&self) -> Option<u64> {
        let have = usize::from(self.have);
        if have < 2 {
            return None;
        }
        let masked = self.header[1] & 0x80 != 0;
        let len7 = self.header[1] & 0x7f;
        let extended = match len7 {
            126 => 2,
            127 => 8,
            _ => 0,
        };
        let need = 2 + extended + if masked { 4 } else { 0 };
        if have < need {
            return None;
        }
        Some(match extended {
            2 => u64::from(u16::from_be_bytes([self.header[2], self.header[3]])),
            8 => {
                let mut len = [0; 8];
                len.copy_from_slice(&self.header[2..10]);
                u64::from_be_bytes(len)
            }
            _ => u64::from(len7),
        })
    }

    /// Bytes fed so far.
    pub(super) fn pos(&self) -> u64 {
        self.pos
    }

    /// Where the frame that the stream has reached began.
    pub(super) fn frame_start(&self) -> u64 {
        self.frame_start
    }
}

/// A close frame with `code` and `reason` (at most 123 bytes, RFC 6455 §5.5), masked with
/// `mask` when it goes to a server (a client's frames are masked, §5.3).
pub(super) fn close_frame(code: u16, reason: &str, mask: Option<[u8; 4]>) -> Vec<u8> {
    let reason = &reason.as_bytes()[..reason.len().min(123)];
    let mut payload = Vec::with_capacity(2 + reason.len());
    payload.extend_from_slice(&code.to_be_bytes());
    payload.extend_from_slice(reason);
    let len = payload.len() as u8;
    let mut frame = Vec::with_capacity(6 + payload.len());
    frame.push(0x88);
    match mask {
        Some(key) => {
            frame.push(0x80 | len);
            frame.extend_from_slice(&key);
            frame.extend(payload.iter().zip(key.iter().cycle()).map(|(b, k)| b ^ k));
        }
        None => {
            frame.push(len);
            frame.extend_from_slice(&payload);
        }
    }
    frame
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(payload: usize, masked: bool) -> Vec<u8> {
        let mut f = vec![0x82];
        let mask = if masked { 0x80 } else { 0 };
        match payload {
            0..=125 => f.push(mask | payload as u8),
            126..=65535 => {
                f.push(mask | 126);
                f.extend_from_slice(&(payload as u16).to_be_bytes());
            }
            _ => {
                f.push(mask | 127);
                f.extend_from_slice(&(payload as u64).to_be_bytes());
            }
        }
        if masked {
            f.extend_from_slice(&[1, 2, 3, 4]);
        }
        f.extend(std::iter::repeat_n(7, payload));
        f
    }

    #[test]
    fn frame_starts_are_found_whatever_the_chunks() {
        for masked in [false, true] {
            let frames = [
                frame(0, masked),
                frame(5, masked),
                frame(300, masked),
                frame(70_000, masked),
            ];
            let stream: Vec<u8> = frames.concat();
            let mut starts = vec![0u64];
            for f in &frames {
                starts.push(starts.last().unwrap() + f.len() as u64);
            }
            for chunk in [1, 2, 3, 7, 100, 4096, stream.len()] {
                let mut cursor = Frames::default();
                for piece in stream.chunks(chunk) {
                    cursor.feed(piece);
                    let pos = cursor.pos();
                    // The start of the frame containing `pos`: the last start at or below it.
                    let expected = *starts.iter().rev().find(|s| **s <= pos).unwrap();
                    assert_eq!(
                        cursor.frame_start(),
                        expected,
                        "chunk {chunk}, pos {pos}, masked {masked}"
                    );
                }
                assert_eq!(cursor.frame_start(), stream.len() as u64);
            }
        }
    }

    #[test]
    fn feeding_to_the_end_stops_at_the_frame_boundary() {
        let stream = [frame(300, true), frame(5, true)].concat();
        let mut cursor = Frames::default();
        cursor.feed(&stream[..10]);
        // The rest of the first frame, not a byte of the second.
        assert_eq!(
            cursor.feed_to_end(&stream[10..]),
            frame(300, true).len() - 10
        );
        assert_eq!(cursor.frame_start(), cursor.pos());
        // At a boundary, the next frame whole.
        assert_eq!(
            cursor.feed_to_end(&stream[frame(300, true).len()..]),
            frame(5, true).len()
        );
    }

    #[test]
    fn close_frames_carry_their_code_masked_or_not() {
        assert_eq!(close_frame(1012, "", None), vec![0x88, 2, 0x03, 0xf4]);
        let masked = close_frame(1012, "ab", Some([1, 2, 3, 4]));
        assert_eq!(&masked[..6], &[0x88, 0x84, 1, 2, 3, 4]);
        let payload: Vec<u8> = masked[6..]
            .iter()
            .zip([1, 2, 3, 4].iter().cycle())
            .map(|(b, k)| b ^ k)
            .collect();
        assert_eq!(payload, [0x03, 0xf4, b'a', b'b']);
        // A long reason is cut to what a control frame holds.
        assert_eq!(close_frame(1001, &"x".repeat(500), None).len(), 2 + 125);
    }
}
