//! Standard base64 decoding, for the screenshots WebDriver hands out (no dependency for
//! one function).

/// Decodes standard base64 (RFC 4648, alphabet `A–Z a–z 0–9 + /`, `=` padding optional),
/// ignoring ASCII whitespace; `None` when `text` is not base64.
pub(super) fn base64_decode(text: &str) -> Option<Vec<u8>> {
    fn sextet(c: u8) -> Option<u32> {
        let v = match c {
            b'A'..=b'Z' => c - b'A',
            b'a'..=b'z' => c - b'a' + 26,
            b'0'..=b'9' => c - b'0' + 52,
            b'+' => 62,
            b'/' => 63,
            _ => return None,
        };
        Some(u32::from(v))
    }
    let bytes: Vec<u8> = text.bytes().filter(|c| !c.is_ascii_whitespace()).collect();
    let data = bytes
        .strip_suffix(b"==")
        .or_else(|| bytes.strip_suffix(b"="))
        .unwrap_or(&bytes);
    // a padded text comes in whole quads
    if data.len() != bytes.len() && !bytes.len().is_multiple_of(4) {
        return None;
    }
    let mut out = Vec::with_capacity(data.len() / 4 * 3 + 2);
    for chunk in data.chunks(4) {
        let mut acc = 0u32;
        for &c in chunk {
            acc = (acc << 6) | sextet(c)?;
        }
        // the chunk's bits, most significant first, as whole bytes; left-over bits must be 0
        let bits = 6 * chunk.len();
        let whole = bits / 8;
        if whole == 0 || acc & ((1 << (bits % 8)) - 1) != 0 {
            return None;
        }
        let acc = acc >> (bits % 8);
        for i in (0..whole).rev() {
            out.push(((acc >> (8 * i)) & 0xff) as u8);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use super::base64_decode;

    #[test]
    fn base64_decodes_rfc_4648_vectors() {
        // RFC 4648, section 10
        for (encoded, decoded) in [
            ("", ""),
            ("Zg==", "f"),
            ("Zm8=", "fo"),
            ("Zm9v", "foo"),
            ("Zm9vYg==", "foob"),
            ("Zm9vYmE=", "fooba"),
            ("Zm9vYmFy", "foobar"),
        ] {
            assert_eq!(
                base64_decode(encoded).as_deref(),
                Some(decoded.as_bytes()),
                "{encoded}"
            );
        }
        // unpadded, and with line breaks
        assert_eq!(base64_decode("Zm9vYg").as_deref(), Some(&b"foob"[..]));
        assert_eq!(
            base64_decode("Zm9v\r\nYmFy\n").as_deref(),
            Some(&b"foobar"[..])
        );
    }

    #[test]
    fn base64_decodes_every_byte() {
        // the 256 byte values, encoded by `base64` (coreutils)
        let all: Vec<u8> = (0..=255).collect();
        let encoded = "AAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8gISIjJCUmJygpKissLS4vMDEyMzQ1Njc4\
                       OTo7PD0+P0BBQkNERUZHSElKS0xNTk9QUVJTVFVWV1hZWltcXV5fYGFiY2RlZmdoaWprbG1ub3Bx\
                       cnN0dXZ3eHl6e3x9fn+AgYKDhIWGh4iJiouMjY6PkJGSk5SVlpeYmZqbnJ2en6ChoqOkpaanqKmq\
                       q6ytrq+wsbKztLW2t7i5uru8vb6/wMHCw8TFxsfIycrLzM3Oz9DR0tPU1dbX2Nna29zd3t/g4eLj\
                       5OXm5+jp6uvs7e7v8PHy8/T19vf4+fr7/P3+/w==";
        assert_eq!(base64_decode(encoded), Some(all));
    }

    #[test]
    fn base64_rejects_what_is_not() {
        for bad in ["Zm9v!", "Z", "Zm9vY", "Zg=", "Zh==", "Z===", "Zm=v", "-_8="] {
            assert_eq!(base64_decode(bad), None, "{bad}");
        }
    }
}
