//! How lenient `baggage` decoders read a member key: the spellings of the stain's key that
//! gray reads, replaces and strips as the key itself.
//!
//! W3C keys are tokens compared byte for byte, but the decoders in the field are looser.
//! OpenTelemetry Python (`W3CBaggagePropagator.extract`) runs `unquote_plus(key).strip()`:
//! percent-decoding of any byte, `+` as a space, then Unicode whitespace trimmed.
//! OpenTelemetry JS trims with `String.prototype.trim` and then `decodeURIComponent`s the
//! key; OpenTelemetry .NET keeps baggage in a dictionary compared with
//! `StringComparer.OrdinalIgnoreCase`; a decoder that does not encode the key again on its
//! way out lets the next one peel another layer of percent-encoding. A key that any of them
//! reads as `gray.lane` is the stain's key, however it is spelled.
//!
//! The rule, [`reads_as`]: `raw` is read as `key` when, after up to [`MAX_ROUNDS`] rounds of
//! percent-decoding (`%XX` of any byte; a `%` not followed by two hex digits stays), and
//! with any `+` read either as itself or as a space, the text is `key` with whitespace
//! around it, compared without case. Text is UTF-8 where it is valid, Latin-1 byte by byte
//! where it is not (a WSGI server reads header bytes as Latin-1). Whitespace is what any of
//! the decoders trims: the C0 controls and the space, Unicode `White_Space` (U+0085, U+00A0,
//! U+1680, U+2000–U+200A, U+2028, U+2029, U+202F, U+205F, U+3000), and U+180E, U+200B and
//! U+FEFF (trimmed by older JavaScript and .NET runtimes). Case is ASCII case, plus the four
//! letters whose simple case mapping lands on an ASCII letter: U+212A KELVIN SIGN (`k`),
//! U+017F LONG S (`s`), U+0131 DOTLESS I and U+0130 DOTTED CAPITAL I (`i`).

use super::grammar::is_token_byte;

/// How many rounds of percent-decoding [`reads_as`] peels: one per hop of a decoder that
/// passes the key on decoded. Bounded so that a hostile key costs linear time.
pub(crate) const MAX_ROUNDS: usize = 8;

/// `true` when a lenient decoder reads the member key `raw` (as sent, up to its `=`) as
/// `key` (an HTTP token). See the [module docs](self).
///
/// A token without `%` or `+` (every key gray itself writes) is compared without case in
/// place; only other spellings are decoded, into a buffer of their own.
pub(crate) fn reads_as(raw: &[u8], key: &[u8]) -> bool {
    if raw == key {
        return true;
    }
    if raw
        .iter()
        .all(|&b| is_token_byte(b) && b != b'%' && b != b'+')
    {
        return raw.eq_ignore_ascii_case(key);
    }
    decoded_reads_as(raw, key)
}

/// The slow path of [`reads_as`]: every round of decoding, trimmed and folded.
fn decoded_reads_as(raw: &[u8], key: &[u8]) -> bool {
    let key: Vec<Unit> = key.iter().map(|&b| ascii_unit(b)).collect();
    let mut text = raw.to_vec();
    let mut units = Vec::with_capacity(text.len());
    for round in 0..=MAX_ROUNDS {
        units.clear();
        units.extend(units_of(&text));
        if trimmed_equals(&units, &key) {
            return true;
        }
        if round == MAX_ROUNDS || !percent_decode_in_place(&mut text) {
            return false;
        }
    }
    false
}

/// One character of a key as a lenient decoder compares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Unit {
    /// Trimmed by some decoder.
    Space,
    /// `+`: itself, or a space to a decoder that reads `+` as one.
    Plus,
    /// An ASCII character, lowercased (or a letter that case-maps onto one).
    Ascii(u8),
    /// Anything else.
    Other,
}

fn ascii_unit(b: u8) -> Unit {
    match b {
        b'+' => Unit::Plus,
        0..=0x20 => Unit::Space,
        0x21..=0x7F => Unit::Ascii(b.to_ascii_lowercase()),
        _ => Unit::Other,
    }
}

fn char_unit(c: char) -> Unit {
    if c.is_ascii() {
        return ascii_unit(c as u8);
    }
    match c {
        '\u{212A}' => Unit::Ascii(b'k'),
        '\u{017F}' => Unit::Ascii(b's'),
        '\u{0130}' | '\u{0131}' => Unit::Ascii(b'i'),
        '\u{180E}' | '\u{200B}' | '\u{FEFF}' => Unit::Space,
        c if c.is_whitespace() => Unit::Space,
        _ => Unit::Other,
    }
}

/// The units of `text`: UTF-8 where valid, each byte of an invalid sequence as Latin-1.
fn units_of(text: &[u8]) -> impl Iterator<Item = Unit> + '_ {
    text.utf8_chunks().flat_map(|chunk| {
        chunk
            .valid()
            .chars()
            .map(char_unit)
            .chain(chunk.invalid().iter().map(|&b| char_unit(char::from(b))))
    })
}

/// `true` when `units` is `key` with spaces (or `+` read as spaces) around it.
fn trimmed_equals(units: &[Unit], key: &[Unit]) -> bool {
    let around = |u: &Unit| matches!(u, Unit::Space | Unit::Plus);
    if units.len() < key.len() {
        return false;
    }
    // The longest run that may be leading space; the key starts at its end, or inside it
    // when the key itself begins with `+`.
    let lead = units.iter().take_while(|u| around(u)).count();
    let key_pluses = key.iter().take_while(|u| **u == Unit::Plus).count();
    (lead.saturating_sub(key_pluses)..=lead).any(|start| {
        units.len() >= start + key.len()
            && units[start..start + key.len()] == *key
            && units[start + key.len()..].iter().all(around)
    })
}

/// Decodes every `%XX` of `text` in place; `false` when there was none.
fn percent_decode_in_place(text: &mut Vec<u8>) -> bool {
    let hex = |b: u8| char::from(b).to_digit(16);
    let mut out = 0;
    let mut i = 0;
    let mut decoded = false;
    while i < text.len() {
        let b = text[i];
        let escape = (b == b'%')
            .then(|| Some((hex(*text.get(i + 1)?)?, hex(*text.get(i + 2)?)?)))
            .flatten();
        match escape {
            Some((high, low)) => {
                // Two hex digits: at most 0xFF.
                text[out] = u8::try_from(high * 16 + low).unwrap_or(u8::MAX);
                i += 3;
                decoded = true;
            }
            None => {
                text[out] = b;
                i += 1;
            }
        }
        out += 1;
    }
    text.truncate(out);
    decoded
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reads(raw: &str) -> bool {
        reads_as(raw.as_bytes(), b"gray.lane")
    }

    #[test]
    fn every_spelling_a_lenient_decoder_reads_as_the_key() {
        for raw in [
            "gray.lane",
            "Gray.Lane",
            "GRAY.LANE",
            "gray%2Elane",
            "gray%2elane",
            "%67ray.lane",
            "%47RAY%2ELANE",
            "gray.lane+",
            "+gray.lane",
            "++gray.lane+%20",
            "%20gray.lane",
            "gray.lane%09",
            "gray.lane%0A%0D",
            "gray.lane%C2%A0",
            "gray.lane%A0",
            "%E2%80%83gray.lane%E3%80%80",
            "%EF%BB%BFgray.lane",
            "gray.lane%00",
            "gray%252Elane",
            "gray%25252Elane",
            "%2Bgray.lane",
            "gray.lane\u{a0}",
            " gray.lane ",
        ] {
            assert!(reads(raw), "{raw:?} is read as gray.lane");
        }
        // A key with the Kelvin sign, dotless i or long s folds onto ASCII.
        assert!(reads_as("\u{212A}ey".as_bytes(), b"key"));
        assert!(reads_as("%E2%84%AAey".as_bytes(), b"key"));
        assert!(reads_as("l\u{131}ne".as_bytes(), b"line"));
        assert!(reads_as("\u{17F}et".as_bytes(), b"set"));
    }

    #[test]
    fn other_keys_are_not_the_key() {
        for raw in [
            "gray.lane2",
            "gray-lane",
            "gray+lane",
            "gray%20lane",
            "graylane",
            "gray.lan",
            "xgray.lane",
            "gray.lane;",
            "gray.lane%",
            "gray.lane%2",
            "gray.lane%ZZ",
            "%FFgray.lane",
            "gray.\u{200d}lane",
            "gr\u{0430}y.lane",
            "",
        ] {
            assert!(!reads(raw), "{raw:?} is not gray.lane");
        }
    }

    #[test]
    fn a_key_with_plus_signs_compares_them_as_themselves() {
        assert!(reads_as(b"a+b", b"a+b"));
        assert!(reads_as(b"a%2Bb", b"a+b"));
        assert!(reads_as(b"+a+b+", b"a+b"));
        assert!(reads_as(b"+a+b", b"+a+b"));
        assert!(reads_as(b"%20+a+b", b"+a+b"));
        assert!(reads_as(b"++a+b", b"+a+b"));
        assert!(!reads_as(b"a b", b"a+b"));
        assert!(!reads_as(b"+b", b"a+b"));
    }

    #[test]
    fn decoding_rounds_are_bounded() {
        let mut raw = "gray%2Elane".to_owned();
        for _ in 0..MAX_ROUNDS - 1 {
            raw = raw.replace('%', "%25");
        }
        assert!(reads(&raw), "{MAX_ROUNDS} rounds");
        let deeper = raw.replace('%', "%25");
        assert!(!reads(&deeper), "beyond {MAX_ROUNDS} rounds");
        // A long hostile key is decoded at most MAX_ROUNDS times.
        let hostile = "%25".repeat(20_000);
        assert!(!reads(&hostile));
    }
}
