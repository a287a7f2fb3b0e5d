//! Key-affine arbiter choice: rendezvous (highest-random-weight) hashing of
//! the lock key over the configured arbiter endpoints. Every client with the
//! same endpoint list sends a key to the same arbiter, so its waiters queue
//! together; removing an arbiter moves only the keys it ranked first for.
//! Correctness never depends on affinity: any arbiter can grant any key.
//!
//! The score is [`holdfast_model::rendezvous::score`] (FNV-1a with a
//! SplitMix64 finalizer), which the shard map homes keys with too.

pub use holdfast_model::rendezvous::score;

/// Endpoint indexes in the order to try for `key`: best first.
pub fn ranked(key: &str, endpoints: &[String]) -> Vec<usize> {
    holdfast_model::rendezvous::ranked(key, endpoints)
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
