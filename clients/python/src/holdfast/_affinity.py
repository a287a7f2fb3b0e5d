"""Key-affine arbiter choice: rendezvous (highest-random-weight) hashing of
the lock key over the configured endpoints, identical to the Rust client's
crates/holdfast-client/src/affinity.rs and the Go client's affinity.go
(FNV-1a with a SplitMix64 finalizer, ties broken by index), so clients in
every language send a key to the same arbiter. Python integers do not wrap:
every product is masked to 64 bits."""

from collections.abc import Sequence

_MASK = (1 << 64) - 1
_FNV_OFFSET = 0xCBF2_9CE4_8422_2325
_FNV_PRIME = 0x0000_0100_0000_01B3


def _fnv1a(h: int, data: bytes) -> int:
    for c in data:
        h = ((h ^ c) * _FNV_PRIME) & _MASK
    return h


def _mix(z: int) -> int:
    z = ((z ^ (z >> 30)) * 0xBF58_476D_1CE4_E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D0_49BB_1331_11EB) & _MASK
    return z ^ (z >> 31)


def score(endpoint: str, key: str) -> int:
    """The weight of endpoint for key (an unsigned 64-bit value)."""
    h = _fnv1a(_FNV_OFFSET, endpoint.encode())
    return _mix(_fnv1a(h ^ 0xFF, key.encode()))


def ranked(key: str, endpoints: Sequence[str]) -> list[int]:
    """Endpoint indexes in the order to try for key, best first."""
    scores = [score(e, key) for e in endpoints]
    return sorted(range(len(endpoints)), key=lambda i: (-scores[i], i))
