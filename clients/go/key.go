package holdfast

import (
	"fmt"
	"strings"

	"google.golang.org/grpc/codes"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// Limits of a lock key, as the arbiter enforces them.
const (
	MaxNamespaceLen = 63
	MaxKeyLen       = 512
)

// Key is a lock key: a namespace (its class decides TTL and tier) and a
// path inside it. Validated as the arbiter validates it, so a bad key is
// refused before any call.
type Key struct {
	namespace string
	key       string
}

// NewKey validates namespace and key.
func NewKey(namespace, key string) (Key, error) {
	if err := validateNamespace(namespace); err != nil {
		return Key{}, err
	}
	if err := validateKey(key); err != nil {
		return Key{}, err
	}
	return Key{namespace, key}, nil
}

// ParseKey parses "NAMESPACE/KEY": everything up to the first '/' is the
// namespace.
func ParseKey(text string) (Key, error) {
	ns, key, ok := strings.Cut(text, "/")
	if !ok {
		return Key{}, invalid("key", fmt.Sprintf("%q has no namespace; write it as NAMESPACE/KEY, e.g. payments/ledger-7", text))
	}
	return NewKey(ns, key)
}

// MustParseKey is ParseKey for constants; it panics on a bad key.
func MustParseKey(text string) Key {
	k, err := ParseKey(text)
	if err != nil {
		panic(err)
	}
	return k
}

func (k Key) Namespace() string { return k.namespace }
func (k Key) Path() string      { return k.key }
func (k Key) String() string    { return k.namespace + "/" + k.key }

func invalid(field, message string) error {
	return &Error{Code: codes.InvalidArgument, Reason: lockv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, Field: field, Message: field + ": " + message}
}

func validateNamespace(ns string) error {
	switch {
	case ns == "":
		return invalid("namespace", `is empty; every key lives in a namespace such as "payments"`)
	case len(ns) > MaxNamespaceLen:
		return invalid("namespace", fmt.Sprintf("is %d bytes; the limit is %d", len(ns), MaxNamespaceLen))
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
			return invalid("namespace", fmt.Sprintf("%q may contain only a-z, 0-9 and '-'", ns))
		}
	}
	if strings.HasPrefix(ns, "-") || strings.HasSuffix(ns, "-") {
		return invalid("namespace", fmt.Sprintf("%q may not start or end with '-'", ns))
	}
	return nil
}

func validateKey(key string) error {
	switch {
	case key == "":
		return invalid("key", `is empty; name the resource the lock guards, e.g. "ledger-7"`)
	case len(key) > MaxKeyLen:
		return invalid("key", fmt.Sprintf("is %d bytes; the limit is %d", len(key), MaxKeyLen))
	}
	for _, c := range key {
		if c <= ' ' || c > '~' {
			return invalid("key", fmt.Sprintf("contains %q; only visible ASCII characters are allowed", c))
		}
	}
	if strings.HasPrefix(key, "/") || strings.HasSuffix(key, "/") {
		return invalid("key", "may not start or end with '/'")
	}
	for _, seg := range strings.Split(key, "/") {
		switch seg {
		case "":
			return invalid("key", `contains an empty path segment ("//")`)
		case ".", "..":
			return invalid("key", fmt.Sprintf("contains a %q path segment, which could leave the namespace", seg))
		}
	}
	return nil
}
