package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.protobuf.Any;
import io.grpc.ManagedChannel;
import io.grpc.Server;
import io.grpc.Status;
import io.grpc.inprocess.InProcessChannelBuilder;
import io.grpc.inprocess.InProcessServerBuilder;
import io.grpc.protobuf.StatusProto;
import io.grpc.stub.StreamObserver;
import java.io.IOException;
import java.time.Duration;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.atomic.AtomicInteger;
import java.util.concurrent.atomic.AtomicLong;
import lock.v1.LockGrpc;
import lock.v1.LockOuterClass.AcquireRequest;
import lock.v1.LockOuterClass.AcquireResponse;
import lock.v1.LockOuterClass.CloseSessionRequest;
import lock.v1.LockOuterClass.CloseSessionResponse;
import lock.v1.LockOuterClass.ErrorDetail;
import lock.v1.LockOuterClass.ErrorReason;
import lock.v1.LockOuterClass.KeepAliveRequest;
import lock.v1.LockOuterClass.KeepAliveResponse;
import lock.v1.LockOuterClass.OpenSessionRequest;
import lock.v1.LockOuterClass.OpenSessionResponse;
import lock.v1.LockOuterClass.ReleaseRequest;
import lock.v1.LockOuterClass.ReleaseResponse;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Test;

/**
 * The session loop and the Locker against an in-process fake arbiter whose
 * keepalive answers the test controls (as clients/go/session_test.go).
 */
class SessionTest {
    /** Checks nothing but counts every call. */
    static final class FakeArbiter extends LockGrpc.LockImplBase {
        final Duration ttl;
        /** "confirm", "slow" (answered 600 ms late), "stall", "unconfirmed", "gone". */
        volatile String mode = "confirm";
        final AtomicInteger opens = new AtomicInteger();
        final AtomicInteger acquires = new AtomicInteger();
        final AtomicInteger releases = new AtomicInteger();
        /** System.nanoTime when the last confirmed keepalive was received. */
        final AtomicLong lastConfirmed = new AtomicLong();
        private final AtomicLong nextRev = new AtomicLong();

        FakeArbiter(Duration ttl) {
            this.ttl = ttl;
        }

        @Override
        public void openSession(OpenSessionRequest req, StreamObserver<OpenSessionResponse> out) {
            int n = opens.incrementAndGet();
            out.onNext(OpenSessionResponse.newBuilder().setSessionId(n).setTtlMillis(ttl.toMillis()).setTier("entity").build());
            out.onCompleted();
        }

        @Override
        public StreamObserver<KeepAliveRequest> keepAlive(StreamObserver<KeepAliveResponse> out) {
            return new StreamObserver<>() {
                @Override
                public void onNext(KeepAliveRequest req) {
                    long received = System.nanoTime();
                    KeepAliveResponse.Builder resp =
                            KeepAliveResponse.newBuilder().setSessionId(req.getSessionId()).setTtlMillis(ttl.toMillis()).setConfirmed(true);
                    switch (mode) {
                        case "slow" -> {
                            // Renewed on receipt, answered late: the deadline
                            // counts from the send, never from the answer's arrival.
                            lastConfirmed.set(received);
                            try {
                                Thread.sleep(600);
                            } catch (InterruptedException e) {
                                Thread.currentThread().interrupt();
                            }
                        }
                        case "stall" -> {
                            return;
                        }
                        case "unconfirmed" -> resp.setConfirmed(false);
                        case "gone" -> resp.setTtlMillis(0);
                        default -> lastConfirmed.set(received);
                    }
                    out.onNext(resp.build());
                }

                @Override
                public void onError(Throwable t) {}

                @Override
                public void onCompleted() {
                    out.onCompleted();
                }
            };
        }

        @Override
        public void acquire(AcquireRequest req, StreamObserver<AcquireResponse> out) {
            acquires.incrementAndGet();
            if (req.getKey().equals("held")) {
                // Through grpc-java's own trailer encoding and decoding.
                out.onError(StatusProto.toStatusRuntimeException(com.google.rpc.Status.newBuilder()
                        .setCode(Status.Code.ABORTED.value())
                        .setMessage(req.getNamespace() + "/held is held by another session")
                        .addDetails(Any.pack(ErrorDetail.newBuilder().setReason(ErrorReason.ERROR_REASON_CONTENTION).build()))
                        .build()));
                return;
            }
            long rev = nextRev.incrementAndGet();
            out.onNext(AcquireResponse.newBuilder().setToken(1L << 48 | rev).setEpoch(1).setRevision(rev).build());
            out.onCompleted();
        }

        @Override
        public void release(ReleaseRequest req, StreamObserver<ReleaseResponse> out) {
            releases.incrementAndGet();
            out.onNext(ReleaseResponse.newBuilder().setReleased(true).build());
            out.onCompleted();
        }

        @Override
        public void closeSession(CloseSessionRequest req, StreamObserver<CloseSessionResponse> out) {
            out.onNext(CloseSessionResponse.getDefaultInstance());
            out.onCompleted();
        }
    }

    private Server server;
    private Locker locker;
    private final BlockingQueue<Fenced> fences = new LinkedBlockingQueue<>();
    /** System.nanoTime when the listener got each fence, in order. */
    private final BlockingQueue<Long> fencedAt = new LinkedBlockingQueue<>();

    private void onFence(Fenced x) {
        fencedAt.add(System.nanoTime());
        fences.add(x);
    }

    private FakeArbiter startFake(Duration ttl) throws IOException {
        FakeArbiter f = new FakeArbiter(ttl);
        String name = InProcessServerBuilder.generateName();
        server = InProcessServerBuilder.forName(name).addService(f).build().start();
        ManagedChannel ch = InProcessChannelBuilder.forName(name).build();
        locker = new Locker(Config.builder().endpoint("fake:1").build(), this::onFence, List.of(ch));
        return f;
    }

    @AfterEach
    void stop() {
        if (locker != null) {
            locker.close();
        }
        if (server != null) {
            server.shutdownNow();
        }
    }

    @Test
    void theFenceListenerIsRequired() {
        Config cfg = Config.builder().endpoint("127.0.0.1:1").build();
        assertThrows(HoldfastConfigException.class, () -> new Locker(cfg, null));
        assertThrows(HoldfastConfigException.class, () -> new Locker(Config.builder().build(), f -> {}));
    }

    @Test
    void holdsOfOneTtlShareASessionAndReentryReachesTheArbiterOnce() throws IOException {
        FakeArbiter f = startFake(Duration.ofSeconds(3));
        Lock a = locker.acquire("ns/a");
        Lock b = locker.acquire("ns/b");
        Lock again = locker.acquire("ns/a");
        assertEquals(a.sessionId(), b.sessionId());
        assertEquals(1, f.opens.get());
        assertEquals(2, f.acquires.get());
        assertEquals(a.token(), again.token());
        assertNotEquals(0, a.token().expose());
        assertFalse(again.release(), "the inner release");
        assertEquals(0, f.releases.get(), "the inner release reached the arbiter");
        assertFalse(again.release(), "a second release of one Lock counted twice");
        assertTrue(a.release(), "the outer release");
        assertEquals(1, f.releases.get());
        HoldfastException e = assertThrows(HoldfastException.class, () -> locker.acquire("ns/held"));
        assertTrue(e.is(ErrorReason.ERROR_REASON_CONTENTION), e.toString());
        assertEquals(Status.Code.ABORTED, e.code());
        b.close();
        assertEquals(2, f.releases.get(), "close releases");
    }

    /**
     * Waits for a fence and checks when the listener got it: at the deadline
     * the last confirmed keepalive set (sent no later than the fake received
     * it). The time is taken in the listener, not when this thread wakes.
     */
    private void waitFence(FakeArbiter f, Lock lock, Duration ttl) throws InterruptedException {
        Fenced x = fences.poll(2 * ttl.toMillis(), TimeUnit.MILLISECONDS);
        assertNotNull(x, "no fence");
        long at = fencedAt.take();
        long after = at - f.lastConfirmed.get();
        long want = ttl.minus(Locker.FENCE_MARGIN).toNanos();
        assertTrue(after >= want - TimeUnit.MILLISECONDS.toNanos(200) && after <= want + TimeUnit.MILLISECONDS.toNanos(300),
                "fenced " + TimeUnit.NANOSECONDS.toMillis(after) + " ms after the last confirmed keepalive, want about "
                        + TimeUnit.NANOSECONDS.toMillis(want));
        assertEquals(2, x.keys().size(), x.toString());
        assertEquals(lock.sessionId(), x.sessionId());
        assertEquals(ttl, x.ttl());
        assertEquals(Health.LOST, lock.health());
        assertFalse(lock.canStart());
        assertEquals(Duration.ZERO, lock.remainingTtl());
        assertTrue(lock.lost().toCompletableFuture().isDone(), "lost() not complete");
    }

    private FakeArbiter drainThenFence(String mode) throws Exception {
        // The arbiter's shortest TTL: a keepalive every 5/3 s, the deadline
        // 4 s after the last confirmed one was sent, so a stalled
        // keepalive's timeout comes 2/3 s before it.
        Duration ttl = Duration.ofSeconds(5);
        FakeArbiter f = startFake(ttl);
        Lock lock = locker.acquire("ns/a");
        locker.acquire("ns/b");
        // Healthy while keepalives are confirmed (each answered 600 ms late
        // in the slow variant).
        Thread.sleep(2000);
        if (mode.equals("slow-then-stall")) {
            f.mode = "slow";
            Thread.sleep(4000);
            mode = "stall";
        }
        assertTrue(lock.canStart() && lock.remainingTtl().compareTo(Duration.ofSeconds(1)) >= 0,
                "healthy session: can start " + lock.canStart() + ", " + lock.remainingTtl() + " left");
        f.mode = mode;
        // Drain: canStart turns false at the first failed keepalive (within
        // a period and its answer's timeout), before the deadline.
        long start = System.nanoTime();
        long limit = Session.keepalivePeriod(ttl).multipliedBy(2).plusMillis(200).toNanos();
        while (lock.canStart()) {
            if (System.nanoTime() - start > limit) {
                fail("canStart stayed true with keepalives failing");
            }
            Thread.sleep(20);
        }
        assertEquals(Health.DEGRADED, lock.health(), "degraded before the deadline");
        waitFence(f, lock, ttl);
        // The fence took the holds: nothing is left to release.
        assertFalse(lock.release(), "release after the fence");
        return f;
    }

    @Test
    void stalledKeepalivesDrainThenFenceAtTheDeadline() throws Exception {
        assertNewSessionAfterTheLoss(drainThenFence("stall"));
    }

    @Test
    void unconfirmedKeepalivesDoNotCount() throws Exception {
        assertNewSessionAfterTheLoss(drainThenFence("unconfirmed"));
    }

    /**
     * With answers 600 ms in transit, a deadline counted from their arrival
     * would fence 600 ms late: waitFence allows 300 ms.
     */
    @Test
    void theDeadlineCountsFromTheSendTime() throws Exception {
        assertNewSessionAfterTheLoss(drainThenFence("slow-then-stall"));
    }

    /**
     * The arbiter answers again: the next acquire opens a new, healthy
     * session. (Left stalling or unconfirming, the fake would make the new
     * session degraded as soon as its first keepalive came back.)
     */
    private void assertNewSessionAfterTheLoss(FakeArbiter f) {
        f.mode = "confirm";
        Lock c = locker.acquire("ns/c");
        assertEquals(Health.HEALTHY, c.health());
        assertNotEquals(1L, c.sessionId(), "a new session after the loss");
    }

    @Test
    void aSessionTheArbiterCallsGoneIsFencedAtOnce() throws Exception {
        FakeArbiter f = startFake(Duration.ofSeconds(3));
        Lock lock = locker.acquire("ns/a");
        f.mode = "gone";
        Fenced x = fences.poll(2, TimeUnit.SECONDS);
        assertNotNull(x, "no fence within a keepalive period");
        assertEquals(List.of(Key.parse("ns/a")), x.keys());
        assertEquals(Health.LOST, lock.health());
        assertFalse(lock.release(), "release after the fence");
        assertEquals(0, f.releases.get());
    }
}
