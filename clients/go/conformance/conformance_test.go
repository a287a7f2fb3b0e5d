package conformance

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	holdfast "github.com/holdfast-dev/holdfast/clients/go"
	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

type env struct {
	a, b, plain holdfast.Config
	pid         int
	scripts     string
}

func setup(t *testing.T) env {
	t.Helper()
	if os.Getenv("HOLDFAST_CONFORMANCE") != "1" {
		t.Skip("HOLDFAST_CONFORMANCE is not 1: run through tests/tests/client_go.rs (cargo test --test client_go)")
	}
	a, err := holdfast.ConfigFromEnv()
	if err != nil {
		t.Fatal(err)
	}
	b, plain := a, a
	b.CertFile, b.KeyFile = os.Getenv("HOLDFAST_CONFORMANCE_CERT2"), os.Getenv("HOLDFAST_CONFORMANCE_KEY2")
	plain.CertFile, plain.KeyFile = os.Getenv("HOLDFAST_CONFORMANCE_PLAIN_CERT"), os.Getenv("HOLDFAST_CONFORMANCE_PLAIN_KEY")
	pid, err := strconv.Atoi(os.Getenv("HOLDFAST_CONFORMANCE_ARBITER_PID"))
	if err != nil || b.CertFile == "" || b.KeyFile == "" || plain.CertFile == "" || plain.KeyFile == "" {
		t.Fatalf("HOLDFAST_CONFORMANCE_CERT2, _KEY2, _PLAIN_CERT, _PLAIN_KEY and _ARBITER_PID must be set (pid: %v)", err)
	}
	scripts := os.Getenv("HOLDFAST_CONFORMANCE_SCRIPTS")
	if scripts == "" || os.Getenv("HOLDFAST_CONFORMANCE_ETCD") == "" {
		t.Fatal("HOLDFAST_CONFORMANCE_SCRIPTS (clients/conformance) and HOLDFAST_CONFORMANCE_ETCD (etcd's client URL) must be set")
	}
	return env{a, b, plain, pid, scripts}
}

// identity is A's SPIFFE path (HOLDFAST_CONFORMANCE_IDENTITY, default
// conformance/go-a).
func identity() string {
	if id := os.Getenv("HOLDFAST_CONFORMANCE_IDENTITY"); id != "" {
		return id
	}
	return "conformance/go-a"
}

// fences collects what OnFence receives.
type fences struct {
	mu  sync.Mutex
	got []holdfast.Fenced
	ch  chan holdfast.Fenced
}

func newFences() *fences { return &fences{ch: make(chan holdfast.Fenced, 8)} }

func (f *fences) on(x holdfast.Fenced) {
	f.mu.Lock()
	f.got = append(f.got, x)
	f.mu.Unlock()
	f.ch <- x
}

func locker(t *testing.T, cfg holdfast.Config) (*holdfast.Locker, *fences) {
	t.Helper()
	f := newFences()
	l, err := holdfast.NewLocker(cfg, f.on)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		_ = l.Close(ctx)
	})
	return l, f
}

func client(t *testing.T, cfg holdfast.Config) *holdfast.Client {
	t.Helper()
	c, err := holdfast.NewClient(cfg.Endpoints[0], cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return c
}

func held(t *testing.T, c *holdfast.Client, k holdfast.Key) *lockv1.InspectResponse {
	t.Helper()
	r, err := c.Inspect(ctx(t), k)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// holdInEtcd reads whether key exists in etcd itself, with the shared
// script clients/conformance/hold-in-etcd (etcdctl with the credentials the
// harness passes): a test-only peek at the arbiter's layout, where a hold is
// /l/NS/KEY.
func holdInEtcd(t *testing.T, scripts, key string) bool {
	t.Helper()
	out, err := exec.Command(filepath.Join(scripts, "hold-in-etcd"), key).CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil:
		return true
	case errors.As(err, &exit) && exit.ExitCode() == 1:
		return false
	}
	t.Fatalf("hold-in-etcd %s: %v: %s", key, err, out)
	return false
}

func grantAttempts(t *testing.T, c *holdfast.Client) uint64 {
	t.Helper()
	s, err := c.ServerStatus(ctx(t))
	if err != nil {
		t.Fatal(err)
	}
	return s.GetGrantAttempts()
}

func TestAcquireAndRelease(t *testing.T) {
	e := setup(t)
	l, _ := locker(t, e.a)
	c := client(t, e.a)
	k := holdfast.MustParseKey("conformance/go-acquire")
	lock, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if lock.Token().Expose() == 0 || lock.Token().Epoch() == 0 || lock.Unprotected() || !lock.CanStart() {
		t.Fatalf("token above 0 in epoch %d, unprotected %v, can start %v", lock.Token().Epoch(), lock.Unprotected(), lock.CanStart())
	}
	if lock.TTL() != 10*time.Second || lock.RemainingTTL() <= 0 || lock.RemainingTTL() > 9*time.Second {
		t.Fatalf("TTL %v (the class's is 10 s), %v left (at most TTL - 1 s)", lock.TTL(), lock.RemainingTTL())
	}
	in := held(t, c, k)
	if !in.GetHeld() || in.GetSessionId() != lock.SessionID() || !strings.HasSuffix(in.GetHolderIdentity(), "/"+identity()) {
		t.Fatalf("inspect: %v", in)
	}
	if released, err := lock.Release(ctx(t)); !released || err != nil {
		t.Fatalf("release: %v %v", released, err)
	}
	if held(t, c, k).GetHeld() {
		t.Fatal("still held after release")
	}
}

func TestHoldsOfOneTTLShareOneSession(t *testing.T) {
	e := setup(t)
	l, _ := locker(t, e.a)
	var ids []uint64
	// conformance and re are two classes with one TTL (10 s) on one tier.
	for _, k := range []string{"conformance/go-share-1", "conformance/go-share-2", "re/go-share-3"} {
		lock, err := l.Acquire(ctx(t), holdfast.MustParseKey(k), holdfast.AcquireOptions{})
		if err != nil {
			t.Fatal(k, err)
		}
		ids = append(ids, lock.SessionID())
		defer func() { _, _ = lock.Release(ctx(t)) }()
	}
	if ids[0] != ids[1] || ids[1] != ids[2] {
		t.Fatalf("sessions %x: want one", ids)
	}
}

func TestReentrantAcquireReachesTheArbiterOnce(t *testing.T) {
	e := setup(t)
	l, _ := locker(t, e.a)
	c := client(t, e.a)
	k := holdfast.MustParseKey("conformance/go-reentrant")
	// Open the session first: the grant count below is the key's alone.
	warm, err := l.Acquire(ctx(t), holdfast.MustParseKey("conformance/go-reentrant-warm"), holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = warm.Release(ctx(t)) }()
	before := grantAttempts(t, c)
	outer, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	inner, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if got := grantAttempts(t, c) - before; got != 1 {
		t.Fatalf("%d grant transactions for two nested acquires, want 1", got)
	}
	if inner.Token() != outer.Token() {
		t.Fatal("the nested acquire got another token")
	}
	if released, err := inner.Release(ctx(t)); released || err != nil || !held(t, c, k).GetHeld() {
		t.Fatalf("the inner release ended the hold: %v %v", released, err)
	}
	if released, err := outer.Release(ctx(t)); !released || err != nil || held(t, c, k).GetHeld() {
		t.Fatalf("the outer release: %v %v", released, err)
	}
}

func TestContentionIsATypedErrorAfterAZeroWait(t *testing.T) {
	e := setup(t)
	la, _ := locker(t, e.a)
	lb, _ := locker(t, e.b)
	k := holdfast.MustParseKey("conformance/go-contended")
	lock, err := lb.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = lock.Release(ctx(t)) }()
	// Open A's session first, so the timing below is the acquire's alone.
	other, err := la.Acquire(ctx(t), holdfast.MustParseKey("conformance/go-contended-other"), holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = other.Release(ctx(t)) }()
	start := time.Now()
	_, err = la.Acquire(ctx(t), k, holdfast.AcquireOptions{Wait: 0})
	took := time.Since(start)
	var herr *holdfast.Error
	if !errors.Is(err, holdfast.ErrContention) || !errors.As(err, &herr) || herr.Code != codes.Aborted || status.Code(err) != codes.Aborted {
		t.Fatalf("want a contention refusal (Aborted), got %T %v", err, err)
	}
	if errors.Is(err, holdfast.ErrLeak) || !strings.Contains(herr.Message, "conformance/go-contended") {
		t.Fatalf("%+v", *herr)
	}
	if took > 2*time.Second {
		t.Fatalf("a zero wait took %v", took)
	}
}

func TestLeakIsATypedError(t *testing.T) {
	e := setup(t)
	first, _ := locker(t, e.a)
	second, _ := locker(t, e.a)
	k := holdfast.MustParseKey("conformance/go-leak")
	lock, err := first.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = lock.Release(ctx(t)) }()
	_, err = second.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if !errors.Is(err, holdfast.ErrLeak) || status.Code(err) != codes.FailedPrecondition {
		t.Fatalf("want a leak refusal (FailedPrecondition), got %v", err)
	}
}

// Through grpc-go's own trailer check: a google.rpc.Status that disagreed
// with the status's code or message would arrive as Internal.
func TestRefusalsReachGrpcGoWithTheirCodeAndDetail(t *testing.T) {
	e := setup(t)
	c := client(t, e.a)
	_, err := c.RPC().Acquire(ctx(t), &lockv1.AcquireRequest{SessionId: 0x3039, Namespace: "conformance", Key: "go-nosession"})
	if status.Code(err) != codes.NotFound {
		t.Fatalf("unknown session: %v (want NotFound, not Internal)", err)
	}
	st, _ := status.FromError(err)
	if len(st.Details()) != 1 {
		t.Fatalf("details %v", st.Details())
	}
	if d, ok := st.Details()[0].(*lockv1.ErrorDetail); !ok || d.GetReason() != lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND {
		t.Fatalf("detail %v", st.Details()[0])
	}
	if err := holdfast.FromError(err); !errors.Is(err, holdfast.ErrSessionNotFound) {
		t.Fatalf("%v", err)
	}
	_, err = c.RPC().Acquire(ctx(t), &lockv1.AcquireRequest{SessionId: 0x3039, Namespace: "Jobs", Key: "k"})
	var herr *holdfast.Error
	if err = holdfast.FromError(err); !errors.Is(err, holdfast.ErrInvalidArgument) || !errors.As(err, &herr) ||
		herr.Field != "namespace" || herr.Code != codes.InvalidArgument {
		t.Fatalf("bad namespace: %v", err)
	}
	_, err = c.RPC().Release(ctx(t), &lockv1.ReleaseRequest{SessionId: 0x3039, Namespace: "conformance", Key: "go-nosession", Token: 1<<48 | 1})
	if err != nil && status.Code(err) == codes.Internal {
		t.Fatalf("release on an unknown session: %v", err)
	}

	// The refusals that need another arbiter: one in another region that
	// allows one request a second (HOLDFAST_CONFORMANCE_ELSEWHERE), one
	// sealed (HOLDFAST_CONFORMANCE_SEALED).
	elsewhere, sealed := os.Getenv("HOLDFAST_CONFORMANCE_ELSEWHERE"), os.Getenv("HOLDFAST_CONFORMANCE_SEALED")
	if elsewhere == "" || sealed == "" {
		t.Fatal("HOLDFAST_CONFORMANCE_ELSEWHERE and HOLDFAST_CONFORMANCE_SEALED must be set")
	}
	_, err = c.RPC().Inspect(ctx(t), &lockv1.InspectRequest{Namespace: "undeclared", Key: "k"})
	refused(t, "a namespace no grant covers", err, codes.PermissionDenied, lockv1.ErrorReason_ERROR_REASON_DENIED, holdfast.ErrDenied)

	s := clientAt(t, sealed, e.a)
	open, err := s.RPC().OpenSession(ctx(t), &lockv1.OpenSessionRequest{Namespace: "conformance"})
	if err != nil {
		t.Fatalf("a sealed arbiter opens sessions: %v", err)
	}
	_, err = s.RPC().Acquire(ctx(t), &lockv1.AcquireRequest{SessionId: open.GetSessionId(), Namespace: "conformance", Key: "go-sealed"})
	refused(t, "a sealed arbiter", err, codes.FailedPrecondition, lockv1.ErrorReason_ERROR_REASON_SEALED, holdfast.ErrSealed)

	_, err = clientAt(t, elsewhere, e.b).RPC().Inspect(ctx(t), &lockv1.InspectRequest{Namespace: "homed", Key: "k"})
	refused(t, "a class homed to another region", err, codes.FailedPrecondition, lockv1.ErrorReason_ERROR_REASON_WRONG_REGION, holdfast.ErrWrongRegion)

	limited := clientAt(t, elsewhere, e.a)
	for i := 0; ; i++ {
		if _, err = limited.RPC().Inspect(ctx(t), &lockv1.InspectRequest{Namespace: "conformance", Key: "k"}); err != nil {
			break
		}
		if i == 20 {
			t.Fatal("20 calls in a row at one a second were all answered")
		}
	}
	refused(t, "the request rate", err, codes.ResourceExhausted, lockv1.ErrorReason_ERROR_REASON_RATE_LIMITED, holdfast.ErrRateLimited)
}

// clientAt is a raw client of the arbiter at endpoint with cfg's identity.
func clientAt(t *testing.T, endpoint string, cfg holdfast.Config) *holdfast.Client {
	t.Helper()
	cfg.Endpoints = []string{endpoint}
	return client(t, cfg)
}

// refused asserts that err reached grpc-go with code and one
// lock.v1.ErrorDetail of reason, and that the library maps it to sentinel.
func refused(t *testing.T, what string, err error, code codes.Code, reason lockv1.ErrorReason, sentinel error) {
	t.Helper()
	st, _ := status.FromError(err)
	if st.Code() != code || len(st.Details()) != 1 {
		t.Fatalf("%s: %v (want %v with one detail)", what, err, code)
	}
	if d, ok := st.Details()[0].(*lockv1.ErrorDetail); !ok || d.GetReason() != reason {
		t.Fatalf("%s: detail %v, want %v", what, st.Details()[0], reason)
	}
	if !errors.Is(holdfast.FromError(err), sentinel) {
		t.Fatalf("%s: %v is not %v", what, holdfast.FromError(err), sentinel)
	}
	t.Logf("%s: %v, %v", what, code, reason)
}

func TestACertificateWithoutASpiffeIDIsUnauthenticated(t *testing.T) {
	e := setup(t)
	l, _ := locker(t, e.plain)
	_, err := l.Acquire(ctx(t), holdfast.MustParseKey("conformance/go-plain"), holdfast.AcquireOptions{})
	var herr *holdfast.Error
	if !errors.Is(err, holdfast.ErrUnauthenticated) || !errors.As(err, &herr) || herr.Code != codes.Unauthenticated {
		t.Fatalf("want an unauthenticated refusal, got %v", err)
	}
}

func TestASessionClosedElsewhereIsFencedWithItsKeys(t *testing.T) {
	e := setup(t)
	l, f := locker(t, e.a)
	c := client(t, e.a)
	var lock *holdfast.Lock
	for _, k := range []string{"conformance/go-fence-1", "conformance/go-fence-2"} {
		var err error
		if lock, err = l.Acquire(ctx(t), holdfast.MustParseKey(k), holdfast.AcquireOptions{}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := c.RPC().CloseSession(ctx(t), &lockv1.CloseSessionRequest{SessionId: lock.SessionID()}); err != nil {
		t.Fatal(err)
	}
	select {
	case x := <-f.ch:
		keys := []string{x.Keys[0].String()}
		if len(x.Keys) == 2 {
			keys = append(keys, x.Keys[1].String())
		}
		if len(x.Keys) != 2 || x.SessionID != lock.SessionID() || x.TTL != 10*time.Second ||
			!(keys[0] == "conformance/go-fence-1" && keys[1] == "conformance/go-fence-2" || keys[1] == "conformance/go-fence-1" && keys[0] == "conformance/go-fence-2") {
			t.Fatalf("fence %v (session %x)", keys, x.SessionID)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no fence within the TTL of the session's close")
	}
	if lock.Health() != holdfast.Lost || lock.CanStart() {
		t.Fatalf("health %v", lock.Health())
	}
	// The next acquire opens a new session.
	again, err := l.Acquire(ctx(t), holdfast.MustParseKey("conformance/go-fence-1"), holdfast.AcquireOptions{})
	if err != nil || again.SessionID() == lock.SessionID() {
		t.Fatalf("after the fence: %v", err)
	}
	_, _ = again.Release(ctx(t))
}

func TestTheTokenNeverPrints(t *testing.T) {
	e := setup(t)
	l, _ := locker(t, e.a)
	lock, err := l.Acquire(ctx(t), holdfast.MustParseKey("conformance/go-redact"), holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _, _ = lock.Release(ctx(t)) }()
	v := lock.Token().Expose()
	out := fmt.Sprintf("%v %+v %#v %v %+v %#v %s %d %x", lock, lock, lock, *lock, lock.Token(), lock.Token(), lock.Token(), lock.Token(), lock.Token())
	for _, form := range []string{strconv.FormatUint(v, 10), strconv.FormatUint(v, 16), strconv.FormatUint(v&(1<<48-1), 10)} {
		if strings.Contains(out, form) {
			t.Fatalf("the token (%s) shows in %q", form, out)
		}
	}
	if !strings.Contains(out, "conformance/go-redact") || !strings.Contains(out, "redacted") {
		t.Fatalf("%q", out)
	}
}

// A release that gets no answer may still be applied later, so the library
// keeps its key blocked: through a proxy in front of the dev arbiter that
// drops everything while cut (HOLDFAST_CONFORMANCE_CUTTABLE, cut while the
// file HOLDFAST_CONFORMANCE_CUT exists), the release gets no answer and the
// hold stays in etcd; the next acquire sends the release again first and
// fails while still cut; once the cut ends, the acquire has the release
// answered and gets a hold of its own on the same session, rather than the
// old one handed back (which the late release could delete under it).
func TestAnUnansweredReleaseIsSentAgainBeforeTheKeyIsAcquiredAgain(t *testing.T) {
	e := setup(t)
	proxy, cut := os.Getenv("HOLDFAST_CONFORMANCE_CUTTABLE"), os.Getenv("HOLDFAST_CONFORMANCE_CUT")
	if proxy == "" || cut == "" {
		t.Fatal("HOLDFAST_CONFORMANCE_CUTTABLE (the proxy) and HOLDFAST_CONFORMANCE_CUT (its cut file) must be set")
	}
	cfg := e.a
	cfg.Endpoints = []string{proxy}
	l, _ := locker(t, cfg)
	k := holdfast.MustParseKey("conformance/go-unanswered")
	first, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(cut, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.Remove(cut) })
	short, cancel := context.WithTimeout(context.Background(), time.Second)
	_, err = first.Release(short)
	cancel()
	if !errors.Is(err, holdfast.ErrUnavailable) {
		t.Fatalf("a release with no answer: got %v, want ErrUnavailable", err)
	}
	if !holdInEtcd(t, e.scripts, "/l/conformance/go-unanswered") {
		t.Fatal("the unanswered release was applied: the proxy let it through")
	}
	short, cancel = context.WithTimeout(context.Background(), time.Second)
	_, err = l.Acquire(short, k, holdfast.AcquireOptions{})
	cancel()
	if !errors.Is(err, holdfast.ErrUnavailable) {
		t.Fatalf("an acquire while the release is unanswered: got %v, want ErrUnavailable", err)
	}
	if err := os.Remove(cut); err != nil {
		t.Fatal(err)
	}
	var again *holdfast.Lock
	for end := time.Now().Add(8 * time.Second); ; {
		again, err = l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
		if err == nil {
			break
		}
		if !errors.Is(err, holdfast.ErrUnavailable) || time.Now().After(end) {
			t.Fatalf("acquire after the cut: %v", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
	if again.SessionID() != first.SessionID() {
		t.Fatalf("the session was lost during the cut (%x, then %x): the test proves nothing", first.SessionID(), again.SessionID())
	}
	if again.Token().Expose() <= first.Token().Expose() {
		t.Fatal("the old hold was handed back to its session: a late release could delete it under the new holder")
	}
	released, err := again.Release(ctx(t))
	if err != nil || !released {
		t.Fatalf("release the new hold: %v, %v", released, err)
	}
}

// Last: it stops the arbiter (SIGSTOP), twice. A short freeze: CanStart
// turns false at the first failed keepalive and true again once one is
// confirmed, with no fence. A long one: OnFence comes at the local deadline
// (the last confirmed keepalive's send time + TTL - 1 s), while etcd still
// has the hold; etcd ends it later (measured, the arbiter still stopped).
func TestAStoppedArbiterDrainsThenFencesBeforeTheLeaseCanExpire(t *testing.T) {
	e := setup(t)
	l, f := locker(t, e.a)
	k := holdfast.MustParseKey("fence/go-sigstop")
	lock, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	ttl := 10 * time.Second
	if lock.TTL() != ttl {
		t.Fatalf("TTL %v, the fence class's is 10 s", lock.TTL())
	}
	defer func() { _ = syscall.Kill(e.pid, syscall.SIGCONT) }()
	stop := func() time.Time {
		// Wait for a confirmed renewal first (the deadline moves forward).
		first := time.Now().Add(lock.RemainingTTL())
		for time.Now().Add(lock.RemainingTTL()).Sub(first) < 500*time.Millisecond {
			if time.Since(first) > ttl {
				t.Fatal("no confirmed keepalive")
			}
			time.Sleep(50 * time.Millisecond)
		}
		if err := syscall.Kill(e.pid, syscall.SIGSTOP); err != nil {
			t.Fatal(err)
		}
		return time.Now()
	}
	waitDrained := func(stopped time.Time) time.Time {
		for lock.CanStart() {
			if time.Since(stopped) > ttl {
				t.Fatal("CanStart stayed true with the arbiter stopped")
			}
			time.Sleep(10 * time.Millisecond)
		}
		return time.Now()
	}

	// 1. A short freeze.
	stopped := stop()
	drained := waitDrained(stopped)
	if err := syscall.Kill(e.pid, syscall.SIGCONT); err != nil {
		t.Fatal(err)
	}
	for !lock.CanStart() {
		if time.Since(drained) > 5*time.Second {
			t.Fatal("CanStart did not come back after keepalives resumed")
		}
		time.Sleep(20 * time.Millisecond)
	}
	select {
	case x := <-f.ch:
		t.Fatalf("fenced on a recovered blip: %v", x.Keys)
	default:
	}
	t.Logf("CanStart dropped %v after the short freeze and recovered", drained.Sub(stopped).Round(time.Millisecond))

	// 2. A long freeze.
	stopped = stop()
	// Renewals cannot move the deadline any more.
	deadline := stopped.Add(lock.RemainingTTL())
	drained = waitDrained(stopped)
	var fenced time.Time
	select {
	case x := <-f.ch:
		fenced = time.Now()
		if len(x.Keys) != 1 || x.Keys[0] != k {
			t.Fatalf("fence %v", x.Keys)
		}
		if drained.After(fenced) || fenced.Before(deadline.Add(-50*time.Millisecond)) || fenced.After(deadline.Add(300*time.Millisecond)) {
			t.Fatalf("drained at +%v, fenced at +%v, the deadline at +%v", drained.Sub(stopped), fenced.Sub(stopped), deadline.Sub(stopped))
		}
	case <-time.After(2 * ttl):
		t.Fatal("no fence")
	}
	// The lease's real end, read from etcd itself (hold-in-etcd) while
	// the arbiter is still stopped: the hold must still exist after the
	// fence, and disappear when etcd expires the lease.
	first := true
	var expired time.Time
	for expired.IsZero() {
		if time.Since(fenced) > ttl {
			t.Fatal("the hold outlived the fence by a TTL")
		}
		switch holdInEtcd(t, e.scripts, "/l/"+k.String()) {
		case true:
			first = false
		case false:
			if first {
				t.Fatalf("the hold was gone from etcd at the first look after the fence (%v after it): the fence came too late", time.Since(fenced))
			}
			expired = time.Now()
		}
		time.Sleep(20 * time.Millisecond)
	}
	t.Logf("FENCE-MARGIN go: drained %v and fenced %v after SIGSTOP; etcd expired the lease %v after the fence (TTL %v, margin %v)",
		drained.Sub(stopped).Round(time.Millisecond), fenced.Sub(stopped).Round(time.Millisecond),
		expired.Sub(fenced).Round(time.Millisecond), ttl, holdfast.FenceMargin)
	if expired.Sub(fenced) <= 0 {
		t.Fatal("fenced after the lease ended")
	}
	if lock.Health() != holdfast.Lost || lock.CanStart() {
		t.Fatalf("health %v after the fence", lock.Health())
	}
}

// fencedWrite writes record through the PostgreSQL reference fence with the
// shared script (clients/conformance/fenced-write), the token on its
// standard input: true when the fence accepted it, false when it rejected it.
func fencedWrite(t *testing.T, scripts string, tok holdfast.Token, record string) bool {
	t.Helper()
	cmd := exec.Command(filepath.Join(scripts, "fenced-write"), record)
	cmd.Stdin = strings.NewReader(strconv.FormatUint(tok.Expose(), 10) + "\n")
	out, err := cmd.CombinedOutput()
	var exit *exec.ExitError
	switch {
	case err == nil && strings.TrimSpace(string(out)) == "accepted":
		return true
	case errors.As(err, &exit) && exit.ExitCode() == 1 && strings.TrimSpace(string(out)) == "rejected":
		return false
	}
	t.Fatalf("fenced-write %s: %v: %s", record, err, out)
	return false
}

func TestAStoppedClientsLateWriteIsRejectedByThePostgresqlFence(t *testing.T) {
	e := setup(t)
	scripts := os.Getenv("HOLDFAST_CONFORMANCE_SCRIPTS")
	if scripts == "" || os.Getenv("HOLDFAST_CONFORMANCE_PG_URL") == "" {
		t.Fatal("HOLDFAST_CONFORMANCE_SCRIPTS and HOLDFAST_CONFORMANCE_PG_URL must be set")
	}
	l, f := locker(t, e.a)
	k := holdfast.MustParseKey("fence/go-late-write")
	const record = "go-late-write"
	lock, err := l.Acquire(ctx(t), k, holdfast.AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if !fencedWrite(t, scripts, lock.Token(), record) {
		t.Fatal("the holder's first write was rejected")
	}
	// The successor waits for the key as another identity, writes, and
	// resumes this process; then this process stops itself past its TTL.
	var successor bytes.Buffer
	take := exec.Command(filepath.Join(scripts, "take-over"), strconv.Itoa(os.Getpid()), k.String(), record)
	take.Stdout, take.Stderr = &successor, &successor
	if err := take.Start(); err != nil {
		t.Fatal(err)
	}
	remaining, stopped := lock.RemainingTTL(), time.Now()
	if err := syscall.Kill(os.Getpid(), syscall.SIGSTOP); err != nil {
		t.Fatal(err)
	}
	// kill returns before the stop reaches every thread: this sleep is
	// where the process stops.
	time.Sleep(200 * time.Millisecond)
	resumed := time.Now()
	if resumed.Sub(stopped) <= remaining {
		t.Fatalf("stopped for %v, within the lock's remaining TTL %v", resumed.Sub(stopped), remaining)
	}
	if err := take.Wait(); err != nil || !strings.Contains(successor.String(), "accepted") {
		t.Fatalf("the successor: %v: %s", err, successor.String())
	}
	select {
	case x := <-f.ch:
		if len(x.Keys) != 1 || x.Keys[0] != k {
			t.Fatalf("fence %v", x.Keys)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("no fence after a stop longer than the TTL")
	}
	if lock.CanStart() {
		t.Fatal("CanStart is true after the stop")
	}
	// The write a paused process makes when it wakes, before it looks at
	// its lock: the fence must reject it.
	if fencedWrite(t, scripts, lock.Token(), record) {
		t.Fatal("the stopped client's late write was accepted")
	}
	count, err := exec.Command(filepath.Join(scripts, "fenced-write"), "--count", record).Output()
	if err != nil || strings.TrimSpace(string(count)) != "2" {
		t.Fatalf("accepted writes: %q (%v), want 2 (the holder's first and the successor's)", count, err)
	}
	t.Logf("LATE-WRITE go: the late write was rejected after a %v stop (%v of the lock's TTL was left when it stopped; TTL 10s)",
		resumed.Sub(stopped).Round(time.Millisecond), remaining.Round(time.Millisecond))
}
