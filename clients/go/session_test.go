package holdfast

import (
	"context"
	"errors"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

func TestDeadlineArithmetic(t *testing.T) {
	sent := time.Now()
	if !strings.Contains(sent.String(), "m=") {
		t.Fatal("time.Now carries no monotonic reading")
	}
	for _, c := range []struct{ ttl, want time.Duration }{
		{15 * time.Second, 14 * time.Second},
		{5 * time.Second, 4 * time.Second},
		{time.Second, 0},
		{500 * time.Millisecond, 0}, // never before the send time
	} {
		if got := fenceDeadline(sent, c.ttl).Sub(sent); got != c.want {
			t.Errorf("ttl %v: deadline at send + %v, want + %v", c.ttl, got, c.want)
		}
	}
	// The deadline keeps the monotonic reading: comparisons ignore wall-clock steps.
	if d := fenceDeadline(sent, 15*time.Second); !strings.Contains(d.String(), "m=") {
		t.Error("the deadline lost the monotonic reading")
	}
	for ttl, want := range map[time.Duration]time.Duration{
		15 * time.Second: 5 * time.Second, 5 * time.Second: 5 * time.Second / 3,
		time.Second: 500 * time.Millisecond, 300 * time.Millisecond: 500 * time.Millisecond,
	} {
		if got := keepalivePeriod(ttl); got != want {
			t.Errorf("keepalive period of %v: %v, want %v", ttl, got, want)
		}
	}
}

// fakeArbiter is an in-process lock.v1 server whose keepalive answers a test
// controls. It checks nothing but counts every call.
type fakeArbiter struct {
	lockv1.UnimplementedLockServer
	ttl time.Duration
	// "confirm" (default), "stall" (read, never answer), "unconfirmed" (TTL
	// above 0, confirmed false), "gone" (TTL 0).
	mode          atomic.Value
	opens         atomic.Int32
	acquires      atomic.Int32
	releases      atomic.Int32
	mu            sync.Mutex
	lastConfirmed time.Time // when the last confirmed answer was sent
	nextRev       uint64
}

func (f *fakeArbiter) OpenSession(context.Context, *lockv1.OpenSessionRequest) (*lockv1.OpenSessionResponse, error) {
	n := f.opens.Add(1)
	return &lockv1.OpenSessionResponse{SessionId: uint64(n), TtlMillis: uint64(f.ttl.Milliseconds()), Tier: "entity"}, nil
}

func (f *fakeArbiter) KeepAlive(stream lockv1.Lock_KeepAliveServer) error {
	for {
		req, err := stream.Recv()
		if err != nil {
			return err
		}
		received := time.Now()
		resp := &lockv1.KeepAliveResponse{SessionId: req.SessionId, TtlMillis: uint64(f.ttl.Milliseconds()), Confirmed: true}
		switch f.mode.Load() {
		case "slow":
			// Renewed on receipt, answered late: the deadline counts from
			// the send, never from the answer's arrival.
			f.mu.Lock()
			f.lastConfirmed = received
			f.mu.Unlock()
			time.Sleep(600 * time.Millisecond)
		case "stall":
			continue
		case "unconfirmed":
			resp.Confirmed = false
		case "gone":
			resp.TtlMillis = 0
		default:
			f.mu.Lock()
			f.lastConfirmed = received
			f.mu.Unlock()
		}
		if err := stream.Send(resp); err != nil {
			return err
		}
	}
}

func (f *fakeArbiter) Acquire(_ context.Context, req *lockv1.AcquireRequest) (*lockv1.AcquireResponse, error) {
	f.acquires.Add(1)
	if req.Key == "held" {
		// Through grpc-go's own trailer encoding and decoding.
		st, _ := status.New(codes.Aborted, req.Namespace+"/held is held by another session").WithDetails(&lockv1.ErrorDetail{Reason: lockv1.ErrorReason_ERROR_REASON_CONTENTION})
		return nil, st.Err()
	}
	f.mu.Lock()
	f.nextRev++
	rev := f.nextRev
	f.mu.Unlock()
	return &lockv1.AcquireResponse{Token: 1<<48 | rev, Epoch: 1, Revision: rev}, nil
}

func (f *fakeArbiter) Release(context.Context, *lockv1.ReleaseRequest) (*lockv1.ReleaseResponse, error) {
	f.releases.Add(1)
	return &lockv1.ReleaseResponse{Released: true}, nil
}

func (f *fakeArbiter) CloseSession(context.Context, *lockv1.CloseSessionRequest) (*lockv1.CloseSessionResponse, error) {
	return &lockv1.CloseSessionResponse{}, nil
}

// startFake serves a fakeArbiter and returns a Locker on it (plain HTTP/2:
// the unit tests need no certificates) and the channel its fences go to.
func startFake(t *testing.T, ttl time.Duration) (*fakeArbiter, *Locker, chan Fenced) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeArbiter{ttl: ttl}
	f.mode.Store("confirm")
	srv := grpc.NewServer()
	lockv1.RegisterLockServer(srv, f)
	go func() { _ = srv.Serve(ln) }()
	fences := make(chan Fenced, 4)
	l, err := newLocker(Config{Endpoints: []string{ln.Addr().String()}}, func(x Fenced) { fences <- x },
		[]grpc.DialOption{grpc.WithTransportCredentials(insecure.NewCredentials())})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = l.Close(context.Background())
		srv.Stop()
	})
	return f, l, fences
}

func TestOnFenceIsRequired(t *testing.T) {
	if _, err := NewLocker(Config{Endpoints: []string{"127.0.0.1:1"}}, nil); !errors.Is(err, ErrConfig) {
		t.Fatalf("%v", err)
	}
}

func TestHoldsOfOneTTLShareASessionAndReentryReachesTheArbiterOnce(t *testing.T) {
	f, l, _ := startFake(t, 3*time.Second)
	ctx := context.Background()
	a, err := l.Acquire(ctx, MustParseKey("ns/a"), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	b, err := l.Acquire(ctx, MustParseKey("ns/b"), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	again, err := l.Acquire(ctx, MustParseKey("ns/a"), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if a.SessionID() != b.SessionID() || f.opens.Load() != 1 {
		t.Fatalf("sessions %d and %d, %d opened", a.SessionID(), b.SessionID(), f.opens.Load())
	}
	if f.acquires.Load() != 2 || again.Token() != a.Token() || a.Token().Expose() == 0 {
		t.Fatalf("%d acquires reached the arbiter", f.acquires.Load())
	}
	if released, err := again.Release(ctx); released || err != nil || f.releases.Load() != 0 {
		t.Fatalf("the inner release reached the arbiter: %v %v", released, err)
	}
	if released, err := again.Release(ctx); released || err != nil {
		t.Fatal("a second Release of one Lock counted twice")
	}
	if released, err := a.Release(ctx); !released || err != nil || f.releases.Load() != 1 {
		t.Fatalf("the outer release: %v %v (%d)", released, err, f.releases.Load())
	}
	if _, err := l.Acquire(ctx, MustParseKey("ns/held"), AcquireOptions{}); !errors.Is(err, ErrContention) || status.Code(err) != codes.Aborted {
		t.Fatalf("contention: %v", err)
	}
}

// waitFence waits for a fence and checks when it came: at the deadline the
// last confirmed keepalive set (sent no later than the fake answered it).
func waitFence(t *testing.T, f *fakeArbiter, fences chan Fenced, lock *Lock, ttl time.Duration) {
	t.Helper()
	select {
	case x := <-fences:
		at := time.Now()
		f.mu.Lock()
		last := f.lastConfirmed
		f.mu.Unlock()
		after := at.Sub(last)
		if after < ttl-FenceMargin-200*time.Millisecond || after > ttl-FenceMargin+300*time.Millisecond {
			t.Errorf("fenced %v after the last confirmed keepalive, want about %v", after, ttl-FenceMargin)
		}
		if len(x.Keys) != 2 || x.SessionID != lock.SessionID() || x.TTL != ttl {
			t.Errorf("fence %+v", x)
		}
	case <-time.After(2 * ttl):
		t.Fatal("no fence")
	}
	if lock.Health() != Lost || lock.CanStart() || lock.RemainingTTL() != 0 {
		t.Errorf("after the fence: %v, can start %v, %v left", lock.Health(), lock.CanStart(), lock.RemainingTTL())
	}
	select {
	case <-lock.Lost():
	default:
		t.Error("Lost() not closed")
	}
}

func drainThenFence(t *testing.T, mode string) {
	// The arbiter's shortest TTL: a keepalive every 5/3 s, the deadline 4 s
	// after the last confirmed one was sent, so a stalled keepalive's
	// timeout comes 2/3 s before it.
	ttl := 5 * time.Second
	f, l, fences := startFake(t, ttl)
	ctx := context.Background()
	lock, err := l.Acquire(ctx, MustParseKey("ns/a"), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := l.Acquire(ctx, MustParseKey("ns/b"), AcquireOptions{}); err != nil {
		t.Fatal(err)
	}
	// Healthy while keepalives are confirmed (each answered 600 ms late in
	// the slow variant).
	time.Sleep(2 * time.Second)
	if mode == "slow-then-stall" {
		f.mode.Store("slow")
		time.Sleep(4 * time.Second)
		mode = "stall"
	}
	if !lock.CanStart() || lock.RemainingTTL() < time.Second {
		t.Fatalf("healthy session: can start %v, %v left", lock.CanStart(), lock.RemainingTTL())
	}
	f.mode.Store(mode)
	// Drain: CanStart turns false at the first failed keepalive (within a
	// period and its answer's timeout), before the deadline.
	start := time.Now()
	for lock.CanStart() {
		if time.Since(start) > 2*keepalivePeriod(ttl)+200*time.Millisecond {
			t.Fatal("CanStart stayed true with keepalives failing")
		}
		time.Sleep(20 * time.Millisecond)
	}
	if lock.Health() != Degraded {
		t.Fatalf("health %v, want degraded before the deadline", lock.Health())
	}
	waitFence(t, f, fences, lock, ttl)
	if _, err := l.Acquire(ctx, MustParseKey("ns/c"), AcquireOptions{}); err != nil {
		t.Fatalf("a new session after the fence: %v", err)
	}
	if f.opens.Load() != 2 {
		t.Errorf("%d sessions opened, want a new one after the loss", f.opens.Load())
	}
}

func TestStalledKeepalivesDrainThenFenceAtTheDeadline(t *testing.T) { drainThenFence(t, "stall") }

func TestUnconfirmedKeepalivesDoNotCount(t *testing.T) { drainThenFence(t, "unconfirmed") }

// With answers 600 ms in transit, a deadline counted from their arrival
// would fence 600 ms late: waitFence allows 300 ms.
func TestTheDeadlineCountsFromTheSendTime(t *testing.T) { drainThenFence(t, "slow-then-stall") }

func TestASessionTheArbiterCallsGoneIsFencedAtOnce(t *testing.T) {
	f, l, fences := startFake(t, 3*time.Second)
	lock, err := l.Acquire(context.Background(), MustParseKey("ns/a"), AcquireOptions{})
	if err != nil {
		t.Fatal(err)
	}
	f.mode.Store("gone")
	select {
	case x := <-fences:
		if len(x.Keys) != 1 || x.Keys[0].String() != "ns/a" {
			t.Fatalf("%+v", x)
		}
	case <-time.After(2 * time.Second):
		t.Fatal("no fence within a keepalive period")
	}
	if lock.Health() != Lost {
		t.Fatal(lock.Health())
	}
	if released, err := lock.Release(context.Background()); released || err != nil {
		t.Fatalf("release after the fence: %v %v", released, err)
	}
}
