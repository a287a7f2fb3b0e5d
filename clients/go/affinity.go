package holdfast

import "sort"

// Key-affine arbiter choice: rendezvous (highest-random-weight) hashing of
// the lock key over the configured endpoints, identical to the Rust client's
// crates/holdfast-client/src/affinity.rs (FNV-1a with a SplitMix64
// finalizer, ties broken by index), so clients in every language send a key
// to the same arbiter.

func fnv1a(h uint64, b []byte) uint64 {
	for _, c := range b {
		h ^= uint64(c)
		h *= 0x0000_0100_0000_01b3
	}
	return h
}

func mix(z uint64) uint64 {
	z = (z ^ (z >> 30)) * 0xbf58_476d_1ce4_e5b9
	z = (z ^ (z >> 27)) * 0x94d0_49bb_1331_11eb
	return z ^ (z >> 31)
}

// Score is the weight of endpoint for key.
func Score(endpoint, key string) uint64 {
	h := fnv1a(0xcbf2_9ce4_8422_2325, []byte(endpoint))
	return mix(fnv1a(h^0xff, []byte(key)))
}

// Ranked returns endpoint indexes in the order to try for key, best first.
func Ranked(key string, endpoints []string) []int {
	order := make([]int, len(endpoints))
	scores := make([]uint64, len(endpoints))
	for i, e := range endpoints {
		order[i] = i
		scores[i] = Score(e, key)
	}
	sort.SliceStable(order, func(a, b int) bool {
		sa, sb := scores[order[a]], scores[order[b]]
		if sa != sb {
			return sa > sb
		}
		return order[a] < order[b]
	})
	return order
}
