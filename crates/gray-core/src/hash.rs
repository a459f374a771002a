//! The workspace's one fixed, non-cryptographic 64-bit hash: FNV-1a over the bytes, then
//! MurmurHash3's 64-bit finalizer (`fmix64`).
//!
//! ```text
//! content_hash(bytes)    = fmix64(FNV-1a-64(bytes))
//! keyed_hash(salt, key)  = fmix64(FNV-1a-64(salt ‖ 0xFF ‖ key))
//! ```
//!
//! (FNV offset `0xcbf29ce484222325`, prime `0x100000001b3`.) The `0xFF` byte never occurs in
//! UTF-8, so `salt ‖ key` is unambiguous for text. Both functions are part of gray's
//! contracts and never change between releases: [`content_hash`] names file revisions, and
//! [`keyed_hash`] puts users into sticky buckets (gray-rules' `sticky_bucket`), so that a
//! user inside 10 % of a rollout stays inside at 20 %, on every gateway and every release.
//!
//! ```
//! use gray_core::hash::{content_hash, keyed_hash};
//!
//! assert_eq!(content_hash(b"rules"), content_hash(b"rules"));
//! assert_ne!(content_hash(b"rules"), content_hash(b"rules "));
//! // Fixed across releases and platforms (sticky bucket 4299 of 10,000).
//! assert_eq!(keyed_hash(b"", b"user-42") % 10_000, 4299);
//! ```

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
const FNV_PRIME: u64 = 0x0000_0100_0000_01b3;

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for &b in bytes {
        h ^= u64::from(b);
        h = h.wrapping_mul(FNV_PRIME);
    }
    h
}

fn fmix64(mut h: u64) -> u64 {
    h ^= h >> 33;
    h = h.wrapping_mul(0xff51_afd7_ed55_8ccd);
    h ^= h >> 33;
    h = h.wrapping_mul(0xc4ce_b9fe_1a85_ec53);
    h ^= h >> 33;
    h
}

/// The hash of `bytes`: a revision of a file's content.
#[must_use]
pub fn content_hash(bytes: &[u8]) -> u64 {
    fmix64(fnv1a(FNV_OFFSET, bytes))
}

/// The hash of `key` under `salt`: `fmix64(FNV-1a(salt ‖ 0xFF ‖ key))`.
#[must_use]
pub fn keyed_hash(salt: &[u8], key: &[u8]) -> u64 {
    let h = fnv1a(FNV_OFFSET, salt);
    let h = fnv1a(h, &[0xFF]);
    fmix64(fnv1a(h, key))
}

/// [`keyed_hash`] of the concatenation of `parts` under `salt`, without concatenating them:
/// `keyed_hash_parts(s, &[a, b]) == keyed_hash(s, a ‖ b)`.
///
/// ```
/// use gray_core::hash::{keyed_hash, keyed_hash_parts};
///
/// assert_eq!(keyed_hash_parts(b"s", &[b"user-", b"7"]), keyed_hash(b"s", b"user-7"));
/// ```
#[must_use]
pub fn keyed_hash_parts(salt: &[u8], parts: &[&[u8]]) -> u64 {
    let mut h = fnv1a(FNV_OFFSET, salt);
    h = fnv1a(h, &[0xFF]);
    for part in parts {
        h = fnv1a(h, part);
    }
    fmix64(h)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_fixed() {
        // Part of the configuration contract: computed from the documented formula.
        assert_eq!(keyed_hash(b"", b"") % 10_000, 2295);
        assert_eq!(keyed_hash(b"", b"alice") % 10_000, 2984);
        assert_eq!(keyed_hash(b"salt", b"alice") % 10_000, 9232);
        assert_ne!(keyed_hash(b"ab", b"c"), keyed_hash(b"a", b"bc"));
        assert_eq!(
            keyed_hash_parts(b"salt", &[b"al", b"", b"ice"]),
            keyed_hash(b"salt", b"alice")
        );
    }
}
