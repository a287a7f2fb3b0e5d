"""Rendezvous choice: the vectors of the Rust client (also
clients/go/affinity_test.go), computed by holdfast_client::affinity."""

import pytest

from holdfast import ranked, score


@pytest.mark.parametrize(
    "endpoint, key, want",
    [
        ("a:1", "ns/k", 3520212007421997318),
        ("a:2", "ns/k", 5022652680759272974),
        ("10.0.0.0:7420", "orders/0", 4724721133488286736),
        ("127.0.0.1:7420", "payments/ledger-7", 13714043251751596643),
        ("", "", 12377313802105884499),
    ],
)
def test_score_matches_the_rust_client(endpoint, key, want):
    assert score(endpoint, key) == want


def eps(n):
    return [f"10.0.0.{i}:7420" for i in range(n)]


@pytest.mark.parametrize(
    "key, want",
    [
        ("orders/0", [1, 2, 0]),
        ("orders/1", [1, 0, 2]),
        ("orders/2", [2, 0, 1]),
        ("payments/ledger-7", [2, 1, 0]),
        ("session/10000", [2, 1, 0]),
        ("session/demo", [1, 0, 2]),
    ],
)
def test_ranked_matches_the_rust_client(key, want):
    assert ranked(key, eps(3)) == want


def test_equal_scores_rank_by_index():
    assert ranked("k/1", ["x:1", "x:1", "y:1"]) == [0, 1, 2]


def test_spreads_keys_evenly_with_the_rust_clients_counts():
    counts = [0, 0, 0]
    for i in range(3000):
        counts[ranked(f"orders/{i}", eps(3))[0]] += 1
    assert counts == [998, 980, 1022]


def test_removing_an_endpoint_moves_only_its_keys():
    e = eps(4)
    fewer = [e[0], e[1], e[3]]
    for i in range(2000):
        k = f"k/{i}"
        before = e[ranked(k, e)[0]]
        after = fewer[ranked(k, fewer)[0]]
        if before != e[2]:
            assert before == after, f"{k} moved although its arbiter stayed"
        else:
            assert after == e[ranked(k, e)[1]], f"{k} did not go to its second choice"


def test_score_is_deterministic_and_sees_the_endpoint():
    assert score("a:1", "ns/k") == score("a:1", "ns/k")
    assert score("a:1", "ns/k") != score("a:2", "ns/k")
