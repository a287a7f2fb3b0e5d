package holdfast

import (
	"errors"
	"strings"
	"testing"
)

// The Rust model's key tests (crates/holdfast-model/src/key.rs).
func TestKeysAreValidatedAsTheArbiterDoes(t *testing.T) {
	k, err := ParseKey("payments/ledger/7")
	if err != nil || k.Namespace() != "payments" || k.Path() != "ledger/7" || k.String() != "payments/ledger/7" {
		t.Fatalf("%v %v", k, err)
	}
	for _, c := range []struct{ ns, key, field string }{
		{"", "k", "namespace"}, {"a/b", "k", "namespace"}, {"Pay", "k", "namespace"},
		{"-a", "k", "namespace"}, {"a-", "k", "namespace"}, {"a_b", "k", "namespace"},
		{strings.Repeat("n", MaxNamespaceLen+1), "k", "namespace"},
		{"p", "", "key"}, {"p", "/etc", "key"}, {"p", "../other/k", "key"}, {"p", "a/./b", "key"},
		{"p", "a//b", "key"}, {"p", "a b", "key"}, {"p", "k/", "key"}, {"p", ".", "key"},
		{"p", "a\tb", "key"}, {"p", "caf\u00e9", "key"}, {"p", strings.Repeat("x", MaxKeyLen+1), "key"},
	} {
		_, err := NewKey(c.ns, c.key)
		var e *Error
		if !errors.As(err, &e) || e.Field != c.field || !errors.Is(err, ErrInvalidArgument) {
			t.Errorf("NewKey(%q, %q): %v, want a refusal of %s", c.ns, c.key, err, c.field)
		}
	}
	for _, ok := range [][2]string{{"a-0", "k"}, {"p", "a/b.c/..d/~!"}, {strings.Repeat("n", MaxNamespaceLen), strings.Repeat("x", MaxKeyLen)}} {
		if _, err := NewKey(ok[0], ok[1]); err != nil {
			t.Errorf("NewKey(%q, %q): %v", ok[0], ok[1], err)
		}
	}
	if _, err := ParseKey("nokey"); !errors.Is(err, ErrInvalidArgument) {
		t.Errorf("ParseKey without a namespace: %v", err)
	}
}
