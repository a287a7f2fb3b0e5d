package dev.holdfast.client;

import io.grpc.Deadline;
import io.grpc.stub.ClientCallStreamObserver;
import io.grpc.stub.ClientResponseObserver;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.CompletableFuture;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import lock.v1.LockGrpc;
import lock.v1.LockOuterClass.AcquireRequest;
import lock.v1.LockOuterClass.AcquireResponse;
import lock.v1.LockOuterClass.CloseSessionRequest;
import lock.v1.LockOuterClass.ErrorReason;
import lock.v1.LockOuterClass.KeepAliveRequest;
import lock.v1.LockOuterClass.KeepAliveResponse;
import lock.v1.LockOuterClass.ReleaseRequest;

/**
 * One lease on the arbiter, renewed by a thread of its own. Every time is
 * read from {@link System#nanoTime()}, the monotonic clock.
 */
final class Session {
    static final Duration MIN_KEEPALIVE_PERIOD = Duration.ofMillis(500);
    private static final Duration RETRY_PAUSE = Duration.ofMillis(250);

    /** TTL/3, at least 500 ms. */
    static Duration keepalivePeriod(Duration ttl) {
        Duration third = ttl.dividedBy(3);
        return third.compareTo(MIN_KEEPALIVE_PERIOD) > 0 ? third : MIN_KEEPALIVE_PERIOD;
    }

    /**
     * The local deadline a keepalive sent at sentAt (a System.nanoTime
     * reading) and confirmed sets: sentAt + TTL − FENCE_MARGIN. The arbiter
     * cannot have extended the lease before the keepalive was sent, so the
     * deadline falls before the lease's end.
     */
    static long fenceDeadline(long sentAt, Duration ttl) {
        Duration d = ttl.minus(Locker.FENCE_MARGIN);
        return sentAt + (d.isNegative() ? 0 : d.toNanos());
    }

    /** clients.get(0) is the arbiter the session was opened on; keepalives fail over to the others in turn. */
    private final List<LockGrpc.LockStub> clients;
    private final List<LockGrpc.LockBlockingStub> blocking;
    final long id;
    final Duration ttl;
    volatile String tier = "entity";
    volatile boolean unprotected;
    private final Duration callTimeout;

    private long deadline; // guarded by this
    private Health health = Health.HEALTHY; // guarded by this
    final CompletableFuture<Void> lost = new CompletableFuture<>();

    private final Thread thread;
    private volatile boolean closed;
    private volatile Runnable onEnd = () -> {};

    /**
     * Starts renewing session id. openedAt is when the open call was sent:
     * the lease cannot have started earlier, so the first deadline counts
     * from there.
     */
    Session(List<LockGrpc.LockStub> clients, List<LockGrpc.LockBlockingStub> blocking, long id, Duration ttl,
            long openedAt, Duration callTimeout) {
        this.clients = List.copyOf(clients);
        this.blocking = List.copyOf(blocking);
        this.id = id;
        this.ttl = ttl;
        this.callTimeout = callTimeout;
        this.deadline = fenceDeadline(openedAt, ttl);
        this.thread = new Thread(this::run, "holdfast-session-" + Long.toHexString(id));
        this.thread.setDaemon(true);
    }

    /** Starts the keepalives; onEnd runs on the session's thread once they stop. */
    void start(Runnable onEnd) {
        this.onEnd = onEnd;
        thread.start();
    }

    synchronized Health health() {
        return health;
    }

    private synchronized void setHealth(Health h) {
        if (health == Health.LOST) {
            return;
        }
        health = h;
        if (h == Health.LOST) {
            lost.complete(null);
        }
    }

    private synchronized void degrade() {
        if (health == Health.HEALTHY) {
            health = Health.DEGRADED;
        }
    }

    synchronized long deadline() {
        return deadline;
    }

    boolean canStart() {
        return health() == Health.HEALTHY;
    }

    /** The time left before the local deadline (zero once past). */
    Duration remainingTtl() {
        if (health() == Health.LOST) {
            return Duration.ZERO;
        }
        long left = deadline() - System.nanoTime();
        return left > 0 ? Duration.ofNanos(left) : Duration.ZERO;
    }

    void ensureAlive() {
        if (health() == Health.LOST || remainingTtl().isZero()) {
            throw HoldfastException.lost();
        }
    }

    /**
     * Asks client for key on this session (any arbiter serves any session).
     * Refused locally once the session is lost.
     */
    Token acquireOn(LockGrpc.LockBlockingStub client, Key key, Duration wait) {
        ensureAlive();
        AcquireResponse resp;
        try {
            resp = client.withDeadline(Deadline.after(wait.plus(callTimeout).toNanos(), TimeUnit.NANOSECONDS))
                    .acquire(AcquireRequest.newBuilder()
                            .setSessionId(id)
                            .setNamespace(key.namespace())
                            .setKey(key.path())
                            .setWaitMillis(wait.toMillis())
                            .build());
        } catch (RuntimeException e) {
            throw HoldfastException.from(e);
        }
        Token token = Token.fromGrant(resp.getToken(), resp.getUnprotected());
        try {
            ensureAlive();
        } catch (HoldfastException e) {
            // Lost while the grant was in flight: the hold cannot be trusted.
            try {
                client.withDeadlineAfter(5, TimeUnit.SECONDS)
                        .release(ReleaseRequest.newBuilder()
                                .setSessionId(id)
                                .setNamespace(key.namespace())
                                .setKey(key.path())
                                .setToken(token.expose())
                                .build());
            } catch (RuntimeException ignored) {
                // Best effort: the session is gone anyway.
            }
            throw e;
        }
        return token;
    }

    /**
     * Ends the keepalives and the session (and every hold on it) at the
     * arbiter it was opened on.
     */
    void close() {
        closed = true;
        thread.interrupt();
        if (Thread.currentThread() != thread) {
            boolean interrupted = false;
            while (thread.isAlive()) {
                try {
                    thread.join();
                } catch (InterruptedException e) {
                    interrupted = true;
                }
            }
            if (interrupted) {
                Thread.currentThread().interrupt();
            }
        }
        try {
            blocking.get(0).withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                    .closeSession(CloseSessionRequest.newBuilder().setSessionId(id).build());
        } catch (RuntimeException e) {
            throw HoldfastException.from(e);
        }
    }

    private void run() {
        try {
            keepaliveLoop();
        } catch (InterruptedException e) {
            // Closed.
        } finally {
            onEnd.run();
        }
    }

    private enum Outcome {
        /** A confirmed renewal. */
        ACKED,
        /** The arbiter says the session no longer exists. */
        GONE,
        /** No usable answer: error, lost stream, timeout, unconfirmed. */
        FAILED,
        /** The deadline passed with the keepalive unanswered. */
        EXPIRED
    }

    /** One KeepAlive stream: what it answers, in order, lands in answers. */
    private static final class KaStream implements ClientResponseObserver<KeepAliveRequest, KeepAliveResponse> {
        final BlockingQueue<Object> answers = new LinkedBlockingQueue<>();
        private static final Object COMPLETED = new Object();
        volatile ClientCallStreamObserver<KeepAliveRequest> requests;

        @Override
        public void beforeStart(ClientCallStreamObserver<KeepAliveRequest> requestStream) {
            this.requests = requestStream;
        }

        @Override
        public void onNext(KeepAliveResponse value) {
            answers.add(value);
        }

        @Override
        public void onError(Throwable t) {
            answers.add(t);
        }

        @Override
        public void onCompleted() {
            answers.add(COMPLETED);
        }

        void cancel() {
            ClientCallStreamObserver<KeepAliveRequest> r = requests;
            if (r != null) {
                r.cancel("holdfast: keepalive stream dropped", null);
            }
        }
    }

    private KaStream stream;
    private long sentAt;

    /**
     * Opens the stream if needed, sends one keepalive and waits for its
     * answer up to period, or up to the deadline if that comes first.
     */
    private Outcome round(LockGrpc.LockStub client, Duration period, long deadline) throws InterruptedException {
        if (stream == null) {
            KaStream s = new KaStream();
            try {
                client.keepAlive(s);
            } catch (RuntimeException e) {
                return Outcome.FAILED;
            }
            stream = s;
        }
        sentAt = System.nanoTime();
        try {
            stream.requests.onNext(KeepAliveRequest.newBuilder().setSessionId(id).build());
        } catch (RuntimeException e) {
            // The stream ended: its status, if any, is in answers.
        }
        long waitUntil = Math.min(sentAt + period.toNanos(), deadline);
        Object answer = stream.answers.poll(Math.max(waitUntil - System.nanoTime(), 0), TimeUnit.NANOSECONDS);
        if (answer == null) {
            return System.nanoTime() - deadline >= 0 ? Outcome.EXPIRED : Outcome.FAILED;
        }
        if (answer instanceof KeepAliveResponse r) {
            if (r.getTtlMillis() > 0 && r.getConfirmed()) {
                return Outcome.ACKED;
            }
            // Renewed by a leader whose term was not confirmed: does not count.
            return r.getTtlMillis() > 0 ? Outcome.FAILED : Outcome.GONE;
        }
        if (answer instanceof Throwable t
                && HoldfastException.from(t).reason() == ErrorReason.ERROR_REASON_SESSION_NOT_FOUND) {
            // The arbiter knows the session is gone (expired, closed, revoked).
            return Outcome.GONE;
        }
        return Outcome.FAILED;
    }

    private void dropStream() {
        if (stream != null) {
            stream.cancel();
            stream = null;
        }
    }

    /** Sleeps until the System.nanoTime reading t. */
    private static void sleepUntil(long t) throws InterruptedException {
        long left;
        while ((left = t - System.nanoTime()) > 0) {
            TimeUnit.NANOSECONDS.sleep(left);
        }
    }

    /**
     * Renews the session every keepalive period. The local deadline is the
     * monotonic send time of the last confirmed keepalive + TTL −
     * FENCE_MARGIN; when it passes, the session is lost at once, whatever
     * call is in flight.
     */
    private void keepaliveLoop() throws InterruptedException {
        Duration period = keepalivePeriod(ttl);
        int current = 0;
        try {
            while (!closed) {
                long deadline = deadline();
                if (System.nanoTime() - deadline >= 0) {
                    setHealth(Health.LOST);
                    return;
                }
                Outcome r = round(clients.get(current), period, deadline);
                if (closed) {
                    return;
                }
                switch (r) {
                    case ACKED -> {
                        long d = fenceDeadline(sentAt, ttl);
                        if (d - System.nanoTime() <= 0) {
                            // The answer was read only after the deadline it
                            // sets (the process was stopped while it waited):
                            // it extends nothing.
                            setHealth(Health.LOST);
                            return;
                        }
                        synchronized (this) {
                            this.deadline = d;
                        }
                        setHealth(Health.HEALTHY);
                        sleepUntil(Math.min(sentAt + period.toNanos(), d));
                    }
                    case GONE, EXPIRED -> {
                        setHealth(Health.LOST);
                        return;
                    }
                    case FAILED -> {
                        // Try the next arbiter: any arbiter renews any session.
                        dropStream();
                        current = (current + 1) % clients.size();
                        degrade();
                        sleepUntil(Math.min(System.nanoTime() + RETRY_PAUSE.toNanos(), deadline));
                    }
                }
            }
        } finally {
            dropStream();
        }
    }
}
