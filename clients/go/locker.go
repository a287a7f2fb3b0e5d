package holdfast

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// Fenced is handed to the OnFence callback when a session is lost (its
// local deadline passed, or the arbiter said it is gone): every key in Keys
// must be treated as lost. Stop acting on them now.
type Fenced struct {
	TTL       time.Duration
	SessionID uint64
	Keys      []Key
}

// AcquireOptions says how to acquire.
type AcquireOptions struct {
	// Session TTL. Zero (the default): the TTL of the key's class, the only
	// TTL the arbiter accepts for it; another value is refused naming the
	// class (ErrClassTTL). Holds of one TTL and tier share one session.
	TTL time.Duration
	// How long to wait while another session holds the key (0: try once).
	Wait time.Duration
}

type entry struct {
	token Token
	count int
	via   int // the arbiter (endpoint index) that granted it
}

// slot is one session and the holds on it.
type slot struct {
	session *session
	key     slotKey
	// The arbiter the session was opened on: the only one that knows an
	// unprotected session.
	home int

	mu    sync.Mutex
	holds map[Key]*entry
	// Final releases sent without an answer: the hold may still be live,
	// and the release may still be applied. Acquire sends it again first.
	releasing map[Key]unanswered
	keyLocks  map[Key]chan struct{}
}

// unanswered is a final release that got no answer from any arbiter.
type unanswered struct {
	token Token
	via   int
}

// keyLock serialises acquire and release of one key in the slot.
func (s *slot) keyLock(ctx context.Context, k Key) (unlock func(), err error) {
	s.mu.Lock()
	ch, ok := s.keyLocks[k]
	if !ok {
		ch = make(chan struct{}, 1)
		s.keyLocks[k] = ch
	}
	s.mu.Unlock()
	select {
	case ch <- struct{}{}:
		return func() { <-ch }, nil
	case <-ctx.Done():
		return nil, FromError(ctx.Err())
	}
}

// slotKey: one session per (TTL, tier). A class's keys live on its tier's
// etcd cluster, and a session lives on one of them.
type slotKey struct {
	ttl  time.Duration
	tier string
}

// Locker takes locks for one workload identity. Safe for concurrent use;
// share one per process.
type Locker struct {
	endpoints []string
	conns     []*grpc.ClientConn
	clients   []lockv1.LockClient
	onFence   func(Fenced)

	// Held while a session is looked up or opened (one at a time).
	slotsLock chan struct{}
	slots     map[slotKey]*slot
	// The class TTL and tier of each namespace a session was opened for.
	classMu sync.Mutex
	classes map[string]slotKey
}

// NewLocker connects (lazily) to every endpoint. onFence is required: it is
// how the library tells the application to stop acting on its keys. It is
// called from a goroutine of the library, once per lost session that held
// keys.
func NewLocker(cfg Config, onFence func(Fenced)) (*Locker, error) {
	return newLocker(cfg, onFence, nil)
}

func newLocker(cfg Config, onFence func(Fenced), dialOpts []grpc.DialOption) (*Locker, error) {
	if onFence == nil {
		return nil, configError("onFence is required: it is how the library tells you to stop")
	}
	if len(cfg.Endpoints) == 0 {
		return nil, configError("no arbiter endpoints configured")
	}
	l := &Locker{
		endpoints: append([]string(nil), cfg.Endpoints...),
		onFence:   onFence,
		slotsLock: make(chan struct{}, 1),
		slots:     map[slotKey]*slot{},
		classes:   map[string]slotKey{},
	}
	for _, e := range cfg.Endpoints {
		conn, err := dial(e, cfg, dialOpts)
		if err != nil {
			for _, c := range l.conns {
				_ = c.Close()
			}
			return nil, err
		}
		l.conns = append(l.conns, conn)
		l.clients = append(l.clients, lockv1.NewLockClient(conn))
	}
	return l, nil
}

// HomeOf is the endpoint (index into Config.Endpoints) that serves key first.
func (l *Locker) HomeOf(key Key) int { return Ranked(key.String(), l.endpoints)[0] }

func (l *Locker) lockSlots(ctx context.Context) (func(), error) {
	select {
	case l.slotsLock <- struct{}{}:
		return func() { <-l.slotsLock }, nil
	case <-ctx.Done():
		return nil, FromError(ctx.Err())
	}
}

// slot is the session for holds of key's class TTL (or ttl), opened if
// needed: a new session is opened for the key's namespace, so the arbiter
// says the class's TTL and tier (and refuses a ttl that differs).
func (l *Locker) slot(ctx context.Context, key Key, ttl time.Duration) (*slot, error) {
	unlock, err := l.lockSlots(ctx)
	if err != nil {
		return nil, err
	}
	defer unlock()
	l.classMu.Lock()
	known, isKnown := l.classes[key.Namespace()]
	l.classMu.Unlock()
	if isKnown && ttl != 0 {
		known.ttl = ttl
	}
	if isKnown {
		if s, ok := l.slots[known]; ok && s.session.Health() != Lost {
			return s, nil
		}
	}
	// Sessions are spread by TTL and tier (or namespace, until its class is
	// known) over the arbiters, with failover.
	var spread string
	switch {
	case isKnown && known.tier == "entity":
		spread = "session/" + strconv.FormatInt(known.ttl.Milliseconds(), 10)
	case isKnown:
		spread = "session/" + strconv.FormatInt(known.ttl.Milliseconds(), 10) + "/" + known.tier
	default:
		spread = "session/" + key.Namespace()
	}
	asked := ttl
	if asked == 0 && isKnown {
		asked = known.ttl
	}
	order := Ranked(spread, l.endpoints)
	var last error
	for n, i := range order {
		clients := []lockv1.LockClient{l.clients[i]}
		for _, j := range append(append([]int(nil), order[n+1:]...), order[:n]...) {
			clients = append(clients, l.clients[j])
		}
		openedAt := time.Now()
		resp, err := l.clients[i].OpenSession(ctx, &lockv1.OpenSessionRequest{TtlMillis: uint64(asked.Milliseconds()), Namespace: key.Namespace()})
		if err != nil {
			err = FromError(err)
			if unavailable(err) {
				last = err
				continue
			}
			return nil, err
		}
		sess := startSession(clients, resp.GetSessionId(), time.Duration(resp.GetTtlMillis())*time.Millisecond, openedAt)
		if resp.GetTier() != "" {
			sess.tier = resp.GetTier()
		}
		sess.unprotected = resp.GetUnprotected()
		k := slotKey{sess.ttl, sess.tier}
		l.classMu.Lock()
		l.classes[key.Namespace()] = k
		l.classMu.Unlock()
		// Opened only to learn the class's TTL and tier, which a live
		// session already has: keep that one (one session per TTL and tier).
		if s, ok := l.slots[k]; ok && s.session.Health() != Lost {
			_ = sess.close(ctx)
			return s, nil
		}
		s := &slot{session: sess, key: k, home: i, holds: map[Key]*entry{}, releasing: map[Key]unanswered{}, keyLocks: map[Key]chan struct{}{}}
		l.slots[k] = s
		go l.fenceWhenLost(s)
		return s, nil
	}
	if last == nil {
		last = configError("no arbiter endpoints")
	}
	return nil, last
}

// fenceWhenLost waits for the session to end; if it was lost (not closed),
// drops it and hands every key it held to OnFence.
func (l *Locker) fenceWhenLost(s *slot) {
	<-s.session.done
	if s.session.Health() != Lost {
		return
	}
	l.slotsLock <- struct{}{}
	if l.slots[s.key] == s {
		delete(l.slots, s.key)
	}
	<-l.slotsLock
	s.mu.Lock()
	keys := make([]Key, 0, len(s.holds))
	for k := range s.holds {
		keys = append(keys, k)
	}
	clear(s.holds)
	s.mu.Unlock()
	if len(keys) > 0 {
		l.onFence(Fenced{TTL: s.session.ttl, SessionID: s.session.id, Keys: keys})
	}
}

// Acquire acquires key. A key already held through this Locker's session of
// the same TTL is re-entered: its count goes up and nothing is sent; the
// returned Lock shares the hold's token. If the key's last release in this
// session got no answer, it is sent again first, and Acquire fails (with that
// error: unavailable, or the arbiter's refusal) until it is answered; the
// arbiter would otherwise hand the session its old hold back, which the late
// release could then delete under the new holder.
func (l *Locker) Acquire(ctx context.Context, key Key, opts AcquireOptions) (*Lock, error) {
	if key.Namespace() == "" {
		return nil, invalid("key", "the zero Key; build one with ParseKey or NewKey")
	}
	s, err := l.slot(ctx, key, opts.TTL)
	if err != nil {
		return nil, err
	}
	unlock, err := s.keyLock(ctx, key)
	if err != nil {
		return nil, err
	}
	defer unlock()
	s.mu.Lock()
	u, pending := s.releasing[key]
	s.mu.Unlock()
	if pending {
		if _, err := l.sendRelease(ctx, s, key, u.token, u.via); err != nil {
			return nil, err
		}
	}
	s.mu.Lock()
	if e, ok := s.holds[key]; ok {
		e.count++
		s.mu.Unlock()
		return &Lock{locker: l, slot: s, key: key, token: e.token, released: new(atomic.Bool)}, nil
	}
	s.mu.Unlock()
	// An unprotected session exists only on the arbiter that opened it.
	order := []int{s.home}
	if !s.session.unprotected {
		order = Ranked(key.String(), l.endpoints)
	}
	var last error
	for _, i := range order {
		token, err := s.session.acquireOn(ctx, l.clients[i], key, opts.Wait)
		if err == nil {
			s.mu.Lock()
			s.holds[key] = &entry{token: token, count: 1, via: i}
			s.mu.Unlock()
			return &Lock{locker: l, slot: s, key: key, token: token, released: new(atomic.Bool)}, nil
		}
		if !unavailable(err) {
			return nil, err
		}
		last = err
	}
	if last == nil {
		last = configError("no arbiter endpoints")
	}
	return nil, last
}

// Close ends every session of this Locker (and so every hold), each in one
// committed entry, and closes the connections. No fence is delivered for
// holds ended this way.
func (l *Locker) Close(ctx context.Context) error {
	unlock, err := l.lockSlots(ctx)
	if err != nil {
		return err
	}
	slots := l.slots
	l.slots = map[slotKey]*slot{}
	unlock()
	var errs []error
	for _, s := range slots {
		s.mu.Lock()
		clear(s.holds)
		clear(s.releasing)
		s.mu.Unlock()
		if err := s.session.close(ctx); err != nil {
			errs = append(errs, err)
		}
	}
	for _, c := range l.conns {
		_ = c.Close()
	}
	return errors.Join(errs...)
}

// Lock is one level of a held lock. Call Release; dropping a Lock keeps the
// hold until its session ends. Its token never prints (see Token).
type Lock struct {
	locker   *Locker
	slot     *slot
	key      Key
	token    Token
	released *atomic.Bool
}

// Token is the fencing token: pass Token().Expose() to the resource with
// every write. Zero for an unprotected grant, which a fenced resource refuses.
func (k *Lock) Token() Token { return k.token }

// Unprotected reports a grant made from an arbiter's memory while etcd was
// out of its reach (a class with on_quorum_loss = "open"): token 0, another
// arbiter may grant the key at the same time, and it is recorded for
// reconciliation. The hold is lost (fenced) once etcd is back.
func (k Lock) Unprotected() bool { return k.token.Unprotected() }

func (k *Lock) Key() Key { return k.key }

// CanStart is false from the first failed keepalive until keepalives are
// confirmed again: finish the unit of work in hand, start no new one.
func (k *Lock) CanStart() bool { return k.slot.session.canStart() }

// RemainingTTL is the time left until the local deadline, when the hold must
// be treated as lost. Do not start work that cannot finish in this time.
func (k *Lock) RemainingTTL() time.Duration { return k.slot.session.remainingTTL() }

// Health is the session's liveness now.
func (k *Lock) Health() Health { return k.slot.session.Health() }

// Lost is closed when the session is lost (OnFence is called too).
func (k *Lock) Lost() <-chan struct{} { return k.slot.session.lost }

func (k *Lock) SessionID() uint64 { return k.slot.session.id }

// TTL is the session's TTL (the class's).
func (k *Lock) TTL() time.Duration { return k.slot.session.ttl }

// Release ends one level of nesting; the last one releases the hold at the
// arbiter. It reports whether a hold was deleted there (false while still
// nested, if the hold was already gone, or if this Lock was released before).
// An unavailable error means the outcome is unknown: the hold may live until
// its session ends. Call Release again to retry; the next Acquire of the key
// through this Locker also sends the release again before anything else.
func (k *Lock) Release(ctx context.Context) (bool, error) {
	if k.released.Swap(true) {
		return false, nil
	}
	s := k.slot
	unlock, err := s.keyLock(ctx, k.key)
	if err != nil {
		k.released.Store(false)
		return false, err
	}
	defer unlock()
	s.mu.Lock()
	e, ok := s.holds[k.key]
	u, pending := s.releasing[k.key]
	switch {
	case !ok && pending && u.token == k.token:
		// This Lock's release is still unanswered: send it again.
		s.mu.Unlock()
		released, err := k.locker.sendRelease(ctx, s, k.key, u.token, u.via)
		if err != nil {
			k.released.Store(false)
		}
		return released, err
	case !ok || e.token != k.token:
		// Fenced or replaced meanwhile: nothing of ours to release.
		s.mu.Unlock()
		return false, nil
	case e.count > 1:
		e.count--
		s.mu.Unlock()
		return false, nil
	}
	via := e.via
	delete(s.holds, k.key)
	s.mu.Unlock()
	released, err := k.locker.sendRelease(ctx, s, k.key, k.token, via)
	if err != nil && unavailable(err) {
		k.released.Store(false)
	}
	return released, err
}

// sendRelease sends the final release of key's hold token, from arbiter via
// on (failing over while unavailable). Without an answer the release is kept
// in the slot as unanswered; only an answer clears it (a refusal says this
// attempt did nothing, not what became of an earlier unanswered one).
func (l *Locker) sendRelease(ctx context.Context, s *slot, key Key, token Token, via int) (bool, error) {
	req := &lockv1.ReleaseRequest{SessionId: s.session.id, Namespace: key.Namespace(), Key: key.Path(), Token: token.Expose()}
	n := len(l.clients)
	var last error
	for step := range n {
		r, err := l.clients[(via+step)%n].Release(ctx, req)
		if err == nil {
			s.mu.Lock()
			delete(s.releasing, key)
			s.mu.Unlock()
			return r.GetReleased(), nil
		}
		err = FromError(err)
		if !unavailable(err) {
			return false, err
		}
		last = err
	}
	s.mu.Lock()
	s.releasing[key] = unanswered{token: token, via: via}
	s.mu.Unlock()
	if last == nil {
		last = configError("no arbiter endpoints")
	}
	return false, last
}

// String describes the lock without its token. String, GoString, Format
// and LogValue have value receivers, so a Lock and a *Lock print alike and
// no fmt verb reaches the token through reflection.
func (k Lock) String() string {
	if k.slot == nil {
		return "holdfast.Lock{}"
	}
	return fmt.Sprintf("holdfast.Lock{key: %s, session: %x, token: %s, unprotected: %t}", k.key, k.slot.session.id, redacted, k.Unprotected())
}

// GoString is String: the token stays redacted under %#v.
func (k Lock) GoString() string { return k.String() }

// Format prints String for every verb.
func (k Lock) Format(f fmt.State, _ rune) { _, _ = f.Write([]byte(k.String())) }

// LogValue redacts the token in log/slog.
func (k Lock) LogValue() slog.Value {
	if k.slot == nil {
		return slog.StringValue(k.String())
	}
	return slog.GroupValue(slog.String("key", k.key.String()), slog.Uint64("session", k.slot.session.id),
		slog.String("token", redacted), slog.Bool("unprotected", k.Unprotected()))
}
