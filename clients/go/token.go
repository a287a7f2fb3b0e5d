package holdfast

import (
	"fmt"
	"log/slog"
)

// Token is a fencing token, epoch<<48 | revision: a capability. Whoever
// presents it can write to a fenced resource, so it never prints: every fmt
// verb (%v, %+v, %#v, %s, %d, %x, …) and slog show "<redacted token>".
// Call Expose at the single place where it is handed to the resource.
type Token struct {
	value uint64
}

const (
	revisionBits = 48
	maxEpoch     = 1<<15 - 1
	maxRevision  = 1<<revisionBits - 1
	redacted     = "<redacted token>"
)

// tokenFromWire reads a token received from the arbiter, rejecting values no
// arbiter could have minted (epoch 1..32767, revision 1..2^48-1).
func tokenFromWire(v uint64) (Token, error) {
	epoch, rev := v>>revisionBits, v&maxRevision
	if epoch == 0 || epoch > maxEpoch {
		return Token{}, configError("the arbiter returned a malformed token (epoch %d is out of range 1..=%d)", epoch, maxEpoch)
	}
	if rev == 0 {
		return Token{}, configError("the arbiter returned a malformed token (revision 0)")
	}
	return Token{v}, nil
}

// Expose returns the packed value, for the wire and the resource's fence
// column. Never log or print what it returns.
func (t Token) Expose() uint64 { return t.value }

// Epoch is the epoch the grant was made in (diagnostics only).
func (t Token) Epoch() uint32 { return uint32(t.value >> revisionBits) }

// Revision is the etcd revision of the grant (diagnostics only).
func (t Token) Revision() uint64 { return t.value & maxRevision }

// Unprotected reports the token of an unprotected grant: 0, below every
// token an arbiter mints, so a fenced resource refuses it.
func (t Token) Unprotected() bool { return t.value == 0 }

func (t Token) String() string   { return redacted }
func (t Token) GoString() string { return "holdfast.Token(" + redacted + ")" }

// Format redacts the token in every verb.
func (t Token) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(t.GoString()))
		return
	}
	_, _ = f.Write([]byte(redacted))
}

// LogValue redacts the token in log/slog.
func (t Token) LogValue() slog.Value { return slog.StringValue(redacted) }

// MarshalText redacts the token in encoding/json and friends.
func (t Token) MarshalText() ([]byte, error) { return []byte(redacted), nil }
