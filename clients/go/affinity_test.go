package holdfast

import (
	"fmt"
	"slices"
	"testing"
)

// Vectors computed by running the Rust client's own functions
// (holdfast_client::affinity::{score, ranked}) on these inputs.
func TestScoreMatchesTheRustClient(t *testing.T) {
	for _, v := range []struct {
		endpoint, key string
		want          uint64
	}{
		{"a:1", "ns/k", 3520212007421997318},
		{"a:2", "ns/k", 5022652680759272974},
		{"10.0.0.0:7420", "orders/0", 4724721133488286736},
		{"127.0.0.1:7420", "payments/ledger-7", 13714043251751596643},
		{"", "", 12377313802105884499},
	} {
		if got := Score(v.endpoint, v.key); got != v.want {
			t.Errorf("Score(%q, %q) = %d, the Rust client says %d", v.endpoint, v.key, got, v.want)
		}
	}
}

func eps(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("10.0.0.%d:7420", i)
	}
	return out
}

func TestRankedMatchesTheRustClient(t *testing.T) {
	e := eps(3)
	for key, want := range map[string][]int{
		"orders/0":          {1, 2, 0},
		"orders/1":          {1, 0, 2},
		"orders/2":          {2, 0, 1},
		"payments/ledger-7": {2, 1, 0},
		"session/10000":     {2, 1, 0},
		"session/demo":      {1, 0, 2},
	} {
		if got := Ranked(key, e); !slices.Equal(got, want) {
			t.Errorf("Ranked(%q) = %v, the Rust client says %v", key, got, want)
		}
	}
	// Equal scores (a duplicated endpoint) rank by index.
	if got := Ranked("k/1", []string{"x:1", "x:1", "y:1"}); !slices.Equal(got, []int{0, 1, 2}) {
		t.Errorf("ties: %v, the Rust client says [0 1 2]", got)
	}
}

// The Rust unit test spreads_keys_evenly, with the exact counts the Rust
// function gives.
func TestSpreadsKeysEvenly(t *testing.T) {
	e := eps(3)
	var counts [3]int
	for i := range 3000 {
		counts[Ranked(fmt.Sprintf("orders/%d", i), e)[0]]++
	}
	if counts != [3]int{998, 980, 1022} {
		t.Errorf("counts %v, the Rust client's are [998 980 1022]", counts)
	}
}

// The Rust unit test removing_an_endpoint_moves_only_its_keys.
func TestRemovingAnEndpointMovesOnlyItsKeys(t *testing.T) {
	e := eps(4)
	fewer := []string{e[0], e[1], e[3]}
	for i := range 2000 {
		k := fmt.Sprintf("k/%d", i)
		before := e[Ranked(k, e)[0]]
		after := fewer[Ranked(k, fewer)[0]]
		if before != e[2] {
			if before != after {
				t.Fatalf("%s moved although its arbiter stayed", k)
			}
		} else if after != e[Ranked(k, e)[1]] {
			t.Fatalf("%s did not go to its second choice", k)
		}
	}
}

// The Rust unit test is_deterministic.
func TestScoreIsDeterministic(t *testing.T) {
	if Score("a:1", "ns/k") != Score("a:1", "ns/k") || Score("a:1", "ns/k") == Score("a:2", "ns/k") {
		t.Fatal("not deterministic, or blind to the endpoint")
	}
}
