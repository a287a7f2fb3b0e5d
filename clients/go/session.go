package holdfast

import (
	"context"
	"sync"
	"time"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// FenceMargin is kept between the local deadline and the earliest moment
// the arbiter's lease can end.
const FenceMargin = time.Second

// minKeepalivePeriod is the shortest interval between keepalives.
const minKeepalivePeriod = 500 * time.Millisecond

// Health is what a session knows about its own liveness.
type Health int

const (
	// Healthy: the last keepalive was confirmed. New work may start.
	Healthy Health = iota
	// Degraded: a keepalive failed; the session may still be alive on the
	// arbiter. Finish the unit of work in hand, start no new one.
	Degraded
	// Lost: the local deadline passed, or the arbiter said the session is
	// gone. Every hold of the session must be treated as lost.
	Lost
)

func (h Health) String() string {
	switch h {
	case Healthy:
		return "healthy"
	case Degraded:
		return "degraded"
	case Lost:
		return "lost"
	}
	return "unknown"
}

// keepalivePeriod is TTL/3, at least 500 ms.
func keepalivePeriod(ttl time.Duration) time.Duration {
	return max(ttl/3, minKeepalivePeriod)
}

// fenceDeadline is the local deadline a keepalive sent at sentAt and
// confirmed sets: sentAt + TTL − FenceMargin. The arbiter cannot have
// extended the lease before the keepalive was sent, so the deadline falls
// before the lease's end. sentAt must come from time.Now (it carries the
// monotonic reading every comparison with it uses).
func fenceDeadline(sentAt time.Time, ttl time.Duration) time.Time {
	return sentAt.Add(max(ttl-FenceMargin, 0))
}

// session is one lease on the arbiter, renewed in the background.
type session struct {
	// clients[0] is the arbiter the session was opened on; keepalives fail
	// over to the others in turn.
	clients     []lockv1.LockClient
	id          uint64
	ttl         time.Duration
	tier        string
	unprotected bool

	mu       sync.Mutex
	deadline time.Time
	health   Health
	lost     chan struct{} // closed when Lost

	cancel context.CancelFunc
	done   chan struct{} // closed when the keepalive loop has ended
}

// startSession starts renewing session id. openedAt is when the open call
// was sent: the lease cannot have started earlier, so the first deadline
// counts from there.
func startSession(clients []lockv1.LockClient, id uint64, ttl time.Duration, openedAt time.Time) *session {
	ctx, cancel := context.WithCancel(context.Background())
	s := &session{
		clients:  clients,
		id:       id,
		ttl:      ttl,
		tier:     "entity",
		deadline: fenceDeadline(openedAt, ttl),
		lost:     make(chan struct{}),
		cancel:   cancel,
		done:     make(chan struct{}),
	}
	go s.keepaliveLoop(ctx)
	return s
}

func (s *session) Health() Health {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.health
}

func (s *session) setHealth(h Health) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.health == Lost {
		return
	}
	s.health = h
	if h == Lost {
		close(s.lost)
	}
}

func (s *session) getDeadline() time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.deadline
}

func (s *session) canStart() bool { return s.Health() == Healthy }

// remainingTTL is the time left before the local deadline (zero once past).
func (s *session) remainingTTL() time.Duration {
	if s.Health() == Lost {
		return 0
	}
	return max(time.Until(s.getDeadline()), 0)
}

func (s *session) ensureAlive() error {
	if s.Health() == Lost || s.remainingTTL() == 0 {
		return errLost()
	}
	return nil
}

// acquireOn asks client for key on this session (any arbiter serves any
// session). Refused locally once the session is lost.
func (s *session) acquireOn(ctx context.Context, client lockv1.LockClient, key Key, wait time.Duration) (Token, error) {
	if err := s.ensureAlive(); err != nil {
		return Token{}, err
	}
	resp, err := client.Acquire(ctx, &lockv1.AcquireRequest{
		SessionId:  s.id,
		Namespace:  key.Namespace(),
		Key:        key.Path(),
		WaitMillis: uint64(wait.Milliseconds()),
	})
	if err != nil {
		return Token{}, FromError(err)
	}
	var token Token
	if !resp.GetUnprotected() {
		if token, err = tokenFromWire(resp.GetToken()); err != nil {
			return Token{}, err
		}
	}
	if err := s.ensureAlive(); err != nil {
		// Lost while the grant was in flight: the hold cannot be trusted.
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = client.Release(rctx, &lockv1.ReleaseRequest{SessionId: s.id, Namespace: key.Namespace(), Key: key.Path(), Token: token.Expose()})
		return Token{}, err
	}
	return token, nil
}

// close ends the keepalives and the session (and every hold on it) at the
// arbiter it was opened on.
func (s *session) close(ctx context.Context) error {
	s.cancel()
	<-s.done
	_, err := s.clients[0].CloseSession(ctx, &lockv1.CloseSessionRequest{SessionId: s.id})
	return FromError(err)
}

type outcome int

const (
	acked  outcome = iota // confirmed renewal
	gone                  // the arbiter says the session no longer exists
	failed                // no usable answer: error, lost stream, timeout, unconfirmed
)

type roundResult struct {
	outcome outcome
	sentAt  time.Time
}

type kaStream struct {
	stream lockv1.Lock_KeepAliveClient
	cancel context.CancelFunc
}

// round opens the stream if needed, sends one keepalive and waits up to
// period for its answer.
func (s *session) round(ctx context.Context, client lockv1.LockClient, st **kaStream, period time.Duration) roundResult {
	if *st == nil {
		sctx, cancel := context.WithCancel(ctx)
		type opened struct {
			stream lockv1.Lock_KeepAliveClient
			err    error
		}
		ch := make(chan opened, 1)
		go func() {
			stream, err := client.KeepAlive(sctx)
			ch <- opened{stream, err}
		}()
		timer := time.NewTimer(period)
		defer timer.Stop()
		select {
		case o := <-ch:
			if o.err != nil {
				cancel()
				return roundResult{outcome: failed}
			}
			*st = &kaStream{o.stream, cancel}
		case <-timer.C:
			cancel()
			return roundResult{outcome: failed}
		}
	}
	stream := (*st).stream
	type answer struct {
		resp *lockv1.KeepAliveResponse
		err  error
	}
	ch := make(chan answer, 1)
	sentAt := time.Now()
	go func() {
		if err := stream.Send(&lockv1.KeepAliveRequest{SessionId: s.id}); err != nil {
			// The stream ended: its status comes from Recv.
			_, err = stream.Recv()
			ch <- answer{nil, err}
			return
		}
		resp, err := stream.Recv()
		ch <- answer{resp, err}
	}()
	timer := time.NewTimer(period)
	defer timer.Stop()
	select {
	case a := <-ch:
		switch {
		case a.err == nil && a.resp.GetTtlMillis() > 0 && a.resp.GetConfirmed():
			return roundResult{acked, sentAt}
		case a.err == nil && a.resp.GetTtlMillis() > 0:
			// Renewed by a leader whose term was not confirmed: does not count.
			return roundResult{outcome: failed}
		case a.err == nil:
			return roundResult{outcome: gone}
		case reasonOf(FromError(a.err)) == lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND:
			// The arbiter knows the session is gone (expired, closed, revoked).
			return roundResult{outcome: gone}
		default:
			return roundResult{outcome: failed}
		}
	case <-timer.C:
		return roundResult{outcome: failed}
	}
}

// keepaliveLoop renews the session every keepalivePeriod. The local
// deadline is the monotonic send time of the last confirmed keepalive +
// TTL − FenceMargin; when it passes, the session is Lost at once, whatever
// call is in flight.
func (s *session) keepaliveLoop(ctx context.Context) {
	defer close(s.done)
	period := keepalivePeriod(s.ttl)
	var st *kaStream
	drop := func() {
		if st != nil {
			st.cancel()
			st = nil
		}
	}
	defer drop()
	current := 0
	// sleepUntil waits until t; false if the session was closed meanwhile.
	sleepUntil := func(t time.Time) bool {
		timer := time.NewTimer(time.Until(t))
		defer timer.Stop()
		select {
		case <-timer.C:
			return true
		case <-ctx.Done():
			return false
		}
	}
	for {
		deadline := s.getDeadline()
		if !time.Now().Before(deadline) {
			s.setHealth(Lost)
			return
		}
		results := make(chan roundResult, 1)
		client := s.clients[current]
		go func(st **kaStream) { results <- s.round(ctx, client, st, period) }(&st)
		fence := time.NewTimer(time.Until(deadline))
		var r roundResult
		select {
		case r = <-results:
			fence.Stop()
		case <-fence.C:
			// The deadline passed with the keepalive unanswered: lost now.
			// Cancelling ends the round (nothing it says can count any more).
			s.setHealth(Lost)
			s.cancel()
			<-results
			return
		case <-ctx.Done():
			fence.Stop()
			<-results
			return
		}
		switch r.outcome {
		case acked:
			d := fenceDeadline(r.sentAt, s.ttl)
			if !d.After(time.Now()) {
				// The answer was read only after the deadline it sets (the
				// process was stopped while it waited): it extends nothing.
				s.setHealth(Lost)
				return
			}
			s.mu.Lock()
			s.deadline = d
			s.mu.Unlock()
			s.setHealth(Healthy)
			next := r.sentAt.Add(period)
			if d.Before(next) {
				next = d
			}
			if !sleepUntil(next) {
				return
			}
		case gone:
			s.setHealth(Lost)
			return
		case failed:
			// Try the next arbiter: any arbiter renews any session.
			drop()
			current = (current + 1) % len(s.clients)
			s.mu.Lock()
			if s.health == Healthy {
				s.health = Degraded
			}
			s.mu.Unlock()
			next := time.Now().Add(250 * time.Millisecond)
			if deadline.Before(next) {
				next = deadline
			}
			if !sleepUntil(next) {
				return
			}
		}
	}
}
