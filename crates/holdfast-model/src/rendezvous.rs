//! Rendezvous (highest-random-weight) hashing: the one score function
//! holdfast ranks choices with, wherever a name must be chosen for a key.
//!
//! - The clients choose an arbiter for a lock key by it (key affinity:
//!   `holdfast_client::affinity`, the same function in Go, Python and Java,
//!   checked by `clients/conformance/vectors.json`).
//! - The shard map homes a lock key's homing unit on an entity cluster by it
//!   ([`crate::shardmap`]).
//!
//! The hash is FNV-1a with a SplitMix64 finalizer: stable across Rust
//! versions and platforms (std's hasher is not), a dozen lines that every
//! client language reproduces exactly, no state. Removing a choice moves
//! only the inputs it ranked first; adding one moves only the inputs it
//! ranks first, about 1/N of them.

fn fnv1a(mut h: u64, bytes: &[u8]) -> u64 {
    for b in bytes {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h
}

fn mix(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// The weight of `choice` (an arbiter endpoint, a cluster name) for `input`
/// (a lock key, a homing unit).
pub fn score(choice: &str, input: &str) -> u64 {
    let h = fnv1a(0xcbf2_9ce4_8422_2325, choice.as_bytes());
    mix(fnv1a(h ^ 0xff, input.as_bytes()))
}

/// Indexes of `choices` in the order to try for `input`: best first (ties
/// by index).
pub fn ranked<S: AsRef<str>>(input: &str, choices: &[S]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..choices.len()).collect();
    order.sort_by(|a, b| score(choices[*b].as_ref(), input).cmp(&score(choices[*a].as_ref(), input)).then(a.cmp(b)));
    order
}
