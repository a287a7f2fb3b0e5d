//! Key-affine arbiter choice: rendezvous (highest-random-weight) hashing of
//! the lock key over the configured arbiter endpoints. Every client with the
//! same endpoint list sends a key to the same arbiter, so its waiters queue
//! together; removing an arbiter moves only the keys it ranked first for.
//! Correctness never depends on affinity: any arbiter can grant any key.
//!
//! The hash is FNV-1a with a SplitMix64 finalizer: stable across Rust
//! versions and platforms (std's hasher is not), a dozen lines, no state.

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

/// The weight of `endpoint` for `key`.
pub fn score(endpoint: &str, key: &str) -> u64 {
    let h = fnv1a(0xcbf2_9ce4_8422_2325, endpoint.as_bytes());
    mix(fnv1a(h ^ 0xff, key.as_bytes()))
}

/// Endpoint indexes in the order to try for `key`: best first.
pub fn ranked(key: &str, endpoints: &[String]) -> Vec<usize> {
    let mut order: Vec<usize> = (0..endpoints.len()).collect();
    order.sort_by(|a, b| score(&endpoints[*b], key).cmp(&score(&endpoints[*a], key)).then(a.cmp(b)));
    order
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eps(n: usize) -> Vec<String> {
        (0..n).map(|i| format!("10.0.0.{i}:7420")).collect()
    }

    #[test]
    fn spreads_keys_evenly() {
        let e = eps(3);
        let mut counts = [0usize; 3];
        for i in 0..3000 {
            counts[ranked(&format!("orders/{i}"), &e)[0]] += 1;
        }
        for c in counts {
            assert!((800..1200).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn removing_an_endpoint_moves_only_its_keys() {
        let e = eps(4);
        let fewer: Vec<String> = e.iter().filter(|x| *x != &e[2]).cloned().collect();
        for i in 0..2000 {
            let k = format!("k/{i}");
            let before = &e[ranked(&k, &e)[0]];
            let after = &fewer[ranked(&k, &fewer)[0]];
            if before != &e[2] {
                assert_eq!(before, after, "{k} moved although its arbiter stayed");
            } else {
                assert_eq!(after, &e[ranked(&k, &e)[1]], "{k} went to its second choice");
            }
        }
    }

    #[test]
    fn is_deterministic() {
        assert_eq!(score("a:1", "ns/k"), score("a:1", "ns/k"));
        assert_ne!(score("a:1", "ns/k"), score("a:2", "ns/k"));
    }
}
