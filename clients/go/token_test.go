package holdfast

import (
	"bytes"
	"encoding/json"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
)

// secret is a token whose every printed form (decimal, hex, octal, …) can
// be searched for.
const secret = uint64(3)<<48 | 0x1d2c3b

func leaks(s string) bool {
	for _, form := range []string{strconv.FormatUint(secret, 10), strconv.FormatUint(secret, 16), strings.ToUpper(strconv.FormatUint(secret, 16)),
		strconv.FormatUint(secret, 8), strconv.FormatUint(secret, 2), "1d2c3b", "1D2C3B", strconv.FormatUint(0x1d2c3b, 10)} {
		if strings.Contains(s, form) {
			return true
		}
	}
	return false
}

var verbs = []string{"%v", "%+v", "%#v", "%s", "%q", "%d", "%x", "%X", "%o", "%b", "%08d", "%10v", "%-v"}

func TestATokenNeverPrints(t *testing.T) {
	tok, err := tokenFromWire(secret)
	if err != nil || tok.Expose() != secret || tok.Epoch() != 3 || tok.Revision() != 0x1d2c3b {
		t.Fatalf("%v %v", tok.Expose() == secret, err)
	}
	holder := struct{ T Token }{tok}
	for _, v := range verbs {
		for _, arg := range []any{tok, &tok, holder, &holder, []Token{tok}, map[string]Token{"t": tok}} {
			if s := fmt.Sprintf(v, arg); leaks(s) || !strings.Contains(s, "redacted") {
				t.Errorf("%s of %T: %s", v, arg, s)
			}
		}
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("grant", "token", tok)
	slog.New(slog.NewTextHandler(&buf, nil)).Info("grant", "token", tok)
	if leaks(buf.String()) {
		t.Errorf("slog: %s", buf.String())
	}
	j, _ := json.Marshal(holder)
	if leaks(string(j)) {
		t.Errorf("json: %s", j)
	}
}

func TestALockNeverPrintsItsToken(t *testing.T) {
	tok, _ := tokenFromWire(secret)
	s := &session{id: 0x3039, lost: make(chan struct{})}
	lock := &Lock{slot: &slot{session: s}, key: MustParseKey("payments/ledger-7"), token: tok, released: new(atomic.Bool)}
	for _, v := range verbs {
		for _, arg := range []any{lock, *lock, []*Lock{lock}, struct{ L *Lock }{lock}, struct{ L Lock }{*lock}} {
			if out := fmt.Sprintf(v, arg); leaks(out) || !strings.Contains(out, "redacted") {
				t.Errorf("%s of %T: %s", v, arg, out)
			}
		}
	}
	if out := fmt.Sprintf("%v", lock); !strings.Contains(out, "payments/ledger-7") || !strings.Contains(out, "unprotected: false") {
		t.Errorf("the key or the flag is missing: %s", out)
	}
	var buf bytes.Buffer
	slog.New(slog.NewJSONHandler(&buf, nil)).Info("held", "lock", lock)
	if leaks(buf.String()) || !strings.Contains(buf.String(), "payments/ledger-7") {
		t.Errorf("slog: %s", buf.String())
	}
}

func TestTokensNoArbiterMintsAreRefused(t *testing.T) {
	for _, v := range []uint64{0, 1, 1 << 48, 0x8000 << 48, ^uint64(0)} {
		if _, err := tokenFromWire(v); err == nil {
			t.Errorf("%#x accepted", v)
		}
	}
	if tok := (Token{}); !tok.Unprotected() {
		t.Error("the zero token is the unprotected one")
	}
}
