package holdfast

import (
	"encoding/base64"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
)

// The shared client conformance vectors (clients/conformance/vectors.json),
// which the Rust, Python and Java clients check too.
type vectors struct {
	Tokens []struct {
		Name        string
		Wire        string
		Epoch       uint32
		Revision    uint64
		Unprotected bool
		Malformed   bool
	}
	Keys []struct {
		Text         string
		Namespace    string
		Path         string
		InvalidField string `json:"invalid_field"`
	}
	Rendezvous []struct {
		Key       string
		Endpoints []string
		Scores    []string
		Ranked    []int
	}
	ErrorDetails []struct {
		Name             string
		Code             codes.Code
		Message          string
		StatusDetailsBin string `json:"status_details_bin"`
		Reason           string
		Field            string
		RetryAfterMs     int64 `json:"retry_after_ms"`
	} `json:"error_details"`
	Deadlines []struct {
		TTLMs             int64 `json:"ttl_ms"`
		SentAtMs          int64 `json:"sent_at_ms"`
		DeadlineMs        int64 `json:"deadline_ms"`
		KeepalivePeriodMs int64 `json:"keepalive_period_ms"`
	}
}

func loadVectors(t *testing.T) vectors {
	t.Helper()
	text, err := os.ReadFile("../conformance/vectors.json")
	if err != nil {
		t.Fatal(err)
	}
	var v vectors
	if err := json.Unmarshal(text, &v); err != nil {
		t.Fatalf("vectors.json: %v", err)
	}
	for name, n := range map[string]int{"tokens": len(v.Tokens), "keys": len(v.Keys), "rendezvous": len(v.Rendezvous),
		"error_details": len(v.ErrorDetails), "deadlines": len(v.Deadlines)} {
		if n == 0 {
			t.Fatalf("vectors.json: %s is missing or empty", name)
		}
	}
	return v
}

func parseU64(t *testing.T, s string) uint64 {
	t.Helper()
	n, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		t.Fatalf("%q: %v", s, err)
	}
	return n
}

func TestVectorsTokens(t *testing.T) {
	for _, v := range loadVectors(t).Tokens {
		wire := parseU64(t, v.Wire)
		tok, err := tokenFromWire(wire)
		switch {
		case v.Malformed:
			if err == nil || !errors.Is(err, ErrConfig) {
				t.Errorf("%s: read as a token (err %v)", v.Name, err)
			}
		case v.Unprotected:
			// Never a token on the wire: only a fail-open grant's flag makes it.
			if err == nil {
				t.Errorf("%s: read as a protected token", v.Name)
			}
			var u Token
			if !u.Unprotected() || u.Expose() != wire {
				t.Errorf("%s: the unprotected token is %d", v.Name, u.Expose())
			}
		default:
			if err != nil {
				t.Errorf("%s: %v", v.Name, err)
				continue
			}
			if tok.Epoch() != v.Epoch || tok.Revision() != v.Revision || tok.Unprotected() || tok.Expose() != wire {
				t.Errorf("%s: epoch %d revision %d", v.Name, tok.Epoch(), tok.Revision())
			}
			if shown := fmt.Sprintf("%v %s %#v %d", tok, tok, tok, tok); strings.Contains(shown, v.Wire) {
				t.Errorf("%s: the token printed its value: %s", v.Name, shown)
			}
		}
	}
}

func TestVectorsKeys(t *testing.T) {
	for _, v := range loadVectors(t).Keys {
		k, err := ParseKey(v.Text)
		if v.InvalidField != "" {
			var e *Error
			if !errors.As(err, &e) || e.Field != v.InvalidField || !errors.Is(err, ErrInvalidArgument) {
				t.Errorf("%q: want a refusal of field %q, got %v", v.Text, v.InvalidField, err)
			}
			continue
		}
		if err != nil || k.Namespace() != v.Namespace || k.Path() != v.Path || k.String() != v.Text {
			t.Errorf("%q: got %q %q (%v)", v.Text, k.Namespace(), k.Path(), err)
		}
	}
}

func TestVectorsRendezvous(t *testing.T) {
	for _, v := range loadVectors(t).Rendezvous {
		for i, e := range v.Endpoints {
			if got, want := Score(e, v.Key), parseU64(t, v.Scores[i]); got != want {
				t.Errorf("Score(%q, %q) = %d, want %d", e, v.Key, got, want)
			}
		}
		if got := Ranked(v.Key, v.Endpoints); !slices.Equal(got, v.Ranked) {
			t.Errorf("Ranked(%q, %v) = %v, want %v", v.Key, v.Endpoints, got, v.Ranked)
		}
	}
}

func TestVectorsErrorDetails(t *testing.T) {
	for _, v := range loadVectors(t).ErrorDetails {
		st := status.New(v.Code, v.Message)
		if v.StatusDetailsBin != "" {
			// What grpc-go does with the grpc-status-details-bin trailer.
			bin, err := base64.StdEncoding.DecodeString(v.StatusDetailsBin)
			if err != nil {
				t.Fatal(err)
			}
			var p spb.Status
			if err := proto.Unmarshal(bin, &p); err != nil {
				t.Fatalf("%s: %v", v.Name, err)
			}
			st = status.FromProto(&p)
		}
		e := fromStatus(st)
		if e.Code != v.Code || e.Reason.String() != v.Reason || e.Field != v.Field || e.RetryAfter != time.Duration(v.RetryAfterMs)*time.Millisecond {
			t.Errorf("%s: got code %v reason %v field %q retry-after %v", v.Name, e.Code, e.Reason, e.Field, e.RetryAfter)
		}
	}
}

func TestVectorsDeadlines(t *testing.T) {
	base := time.Now()
	ms := func(n int64) time.Duration { return time.Duration(n) * time.Millisecond }
	for _, v := range loadVectors(t).Deadlines {
		if got := fenceDeadline(base.Add(ms(v.SentAtMs)), ms(v.TTLMs)).Sub(base); got != ms(v.DeadlineMs) {
			t.Errorf("TTL %d ms sent at %d ms: deadline %v, want %d ms", v.TTLMs, v.SentAtMs, got, v.DeadlineMs)
		}
		if got := keepalivePeriod(ms(v.TTLMs)); got != ms(v.KeepalivePeriodMs) {
			t.Errorf("TTL %d ms: keepalive period %v, want %d ms", v.TTLMs, got, v.KeepalivePeriodMs)
		}
	}
}
