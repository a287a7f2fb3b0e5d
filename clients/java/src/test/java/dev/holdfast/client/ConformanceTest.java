package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertNotEquals;
import static org.junit.jupiter.api.Assertions.assertNotNull;
import static org.junit.jupiter.api.Assertions.assertNull;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import io.grpc.Status;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.io.IOException;
import java.nio.charset.StandardCharsets;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.List;
import java.util.concurrent.BlockingQueue;
import java.util.concurrent.LinkedBlockingQueue;
import java.util.concurrent.TimeUnit;
import java.util.logging.Handler;
import java.util.logging.LogRecord;
import java.util.logging.Logger;
import java.util.logging.SimpleFormatter;
import java.util.logging.StreamHandler;
import lock.v1.LockOuterClass.AcquireRequest;
import lock.v1.LockOuterClass.CloseSessionRequest;
import lock.v1.LockOuterClass.ErrorDetail;
import lock.v1.LockOuterClass.ErrorReason;
import lock.v1.LockOuterClass.InspectRequest;
import lock.v1.LockOuterClass.InspectResponse;
import lock.v1.LockOuterClass.OpenSessionRequest;
import lock.v1.LockOuterClass.ReleaseRequest;
import org.junit.jupiter.api.AfterEach;
import org.junit.jupiter.api.Assumptions;
import org.junit.jupiter.api.BeforeEach;
import org.junit.jupiter.api.MethodOrderer;
import org.junit.jupiter.api.Order;
import org.junit.jupiter.api.Test;
import org.junit.jupiter.api.TestMethodOrder;

/**
 * The conformance scenarios of clients/go/conformance and
 * clients/python/tests/conformance, against the dev appliance (`holdfastctl
 * dev` with the conformance classes dropped in): run
 * through tests/tests/client_java.rs (cargo test --test client_java), which
 * sets HOLDFAST_CONFORMANCE=1, HOLDFAST_ENDPOINT, HOLDFAST_CA, HOLDFAST_CERT,
 * HOLDFAST_KEY (identity A), HOLDFAST_CONFORMANCE_CERT2/_KEY2 (identity B),
 * HOLDFAST_CONFORMANCE_PLAIN_CERT/_PLAIN_KEY (no SPIFFE ID),
 * HOLDFAST_CONFORMANCE_ARBITER_PID, HOLDFAST_CONFORMANCE_ETCD (etcd's client
 * URL, with HOLDFAST_CONFORMANCE_ETCD_CA/_CERT/_KEY for TLS: read by
 * clients/conformance/hold-in-etcd), HOLDFAST_CONFORMANCE_ELSEWHERE (an arbiter in another
 * region, one request a second), HOLDFAST_CONFORMANCE_SEALED (a sealed
 * arbiter), HOLDFAST_CONFORMANCE_SCRIPTS (clients/conformance),
 * HOLDFAST_CONFORMANCE_PG_URL and HOLDFAST_CONFORMANCE_HOLDFASTCTL (for the
 * PostgreSQL fence and the successor), and optionally
 * HOLDFAST_CONFORMANCE_TTL (seconds) and HOLDFAST_CONFORMANCE_IDENTITY.
 * Skipped without HOLDFAST_CONFORMANCE=1 (all of them set by
 * holdfast_tests::ConformanceLab).
 */
@TestMethodOrder(MethodOrderer.OrderAnnotation.class)
class ConformanceTest {
    private Config a;
    private Config b;
    private Config plain;
    private long pid;
    private String scripts;
    private Duration ttl;
    private String identity;
    private final List<AutoCloseable> cleanup = new ArrayList<>();

    private static String need(String name) {
        String v = System.getenv(name);
        if (v == null || v.isEmpty()) {
            fail(name + " must be set (run through tests/tests/client_java.rs)");
        }
        return v;
    }

    @BeforeEach
    void setup() {
        Assumptions.assumeTrue("1".equals(System.getenv("HOLDFAST_CONFORMANCE")),
                "HOLDFAST_CONFORMANCE is not 1: run through tests/tests/client_java.rs (cargo test --test client_java)");
        a = Config.fromEnv();
        b = a.toBuilder()
                .certFile(Path.of(need("HOLDFAST_CONFORMANCE_CERT2")))
                .keyFile(Path.of(need("HOLDFAST_CONFORMANCE_KEY2")))
                .build();
        plain = a.toBuilder()
                .certFile(Path.of(need("HOLDFAST_CONFORMANCE_PLAIN_CERT")))
                .keyFile(Path.of(need("HOLDFAST_CONFORMANCE_PLAIN_KEY")))
                .build();
        pid = Long.parseLong(need("HOLDFAST_CONFORMANCE_ARBITER_PID"));
        need("HOLDFAST_CONFORMANCE_ETCD");
        scripts = need("HOLDFAST_CONFORMANCE_SCRIPTS");
        String t = System.getenv("HOLDFAST_CONFORMANCE_TTL");
        ttl = Duration.ofMillis((long) (Double.parseDouble(t == null || t.isEmpty() ? "10" : t) * 1000));
        String id = System.getenv("HOLDFAST_CONFORMANCE_IDENTITY");
        identity = id == null || id.isEmpty() ? "conformance/java-a" : id;
    }

    @AfterEach
    void teardown() throws Exception {
        for (int i = cleanup.size() - 1; i >= 0; i--) {
            try {
                cleanup.get(i).close();
            } catch (HoldfastException e) {
                // A session already gone (fenced) cannot be closed again.
            }
        }
        cleanup.clear();
    }

    /** What the fence listener receives. */
    static final class Fences implements FenceListener {
        final BlockingQueue<Fenced> got = new LinkedBlockingQueue<>();

        @Override
        public void onFence(Fenced fenced) {
            got.add(fenced);
        }
    }

    private record Made(Locker locker, Fences fences) {}

    private Made locker(Config cfg) {
        Fences f = new Fences();
        Locker l = new Locker(cfg, f);
        cleanup.add(l);
        return new Made(l, f);
    }

    private HoldfastClient client(Config cfg) {
        HoldfastClient c = new HoldfastClient(cfg.endpoints().get(0), cfg);
        cleanup.add(c);
        return c;
    }

    private static InspectResponse held(HoldfastClient c, Key k) {
        return c.inspect(k);
    }

    private static long grantAttempts(HoldfastClient c) {
        return c.serverStatus().getGrantAttempts();
    }

    /**
     * Whether key exists in etcd itself, with the shared script
     * clients/conformance/hold-in-etcd. A test-only peek at the arbiter's
     * layout: a hold is /l/NS/KEY.
     */
    private boolean holdInEtcd(String key) throws IOException, InterruptedException {
        Process p = new ProcessBuilder(Path.of(scripts, "hold-in-etcd").toString(), key).redirectErrorStream(true).start();
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertTrue(p.waitFor(10, TimeUnit.SECONDS), "hold-in-etcd " + key + " did not end");
        int code = p.exitValue();
        assertTrue(code == 0 || code == 1, "hold-in-etcd " + key + ": exit " + code + ": " + out);
        return code == 0;
    }

    private void signal(String sig) throws IOException, InterruptedException {
        Process p = new ProcessBuilder("kill", "-" + sig, Long.toString(pid)).inheritIO().start();
        assertEquals(0, p.waitFor(), "kill -" + sig + " " + pid);
    }

    private static long now() {
        return System.nanoTime();
    }

    private static String ms(long nanos) {
        return TimeUnit.NANOSECONDS.toMillis(nanos) + "ms";
    }

    private static String seconds(Duration d) {
        return d.toMillis() % 1000 == 0 ? d.toSeconds() + "s" : d.toMillis() / 1000.0 + "s";
    }

    @Test
    @Order(1)
    void acquireAndRelease() {
        Locker l = locker(a).locker();
        HoldfastClient c = client(a);
        Key k = Key.parse("conformance/java-acquire");
        Lock lock = l.acquire(k);
        assertTrue(lock.token().expose() != 0 && lock.token().epoch() != 0 && !lock.unprotected() && lock.canStart(),
                "token above 0 in epoch " + lock.token().epoch() + ", unprotected " + lock.unprotected());
        assertEquals(ttl, lock.ttl(), "the class's TTL");
        assertTrue(!lock.remainingTtl().isZero() && lock.remainingTtl().compareTo(ttl.minus(Locker.FENCE_MARGIN)) <= 0,
                lock.remainingTtl() + " left (at most TTL - 1 s)");
        InspectResponse in = held(c, k);
        assertTrue(in.getHeld() && in.getSessionId() == lock.sessionId() && in.getHolderIdentity().endsWith("/" + identity),
                "inspect: " + in);
        assertTrue(lock.release(), "release");
        assertFalse(held(c, k).getHeld(), "still held after release");
        // try-with-resources releases too.
        try (Lock again = l.acquire(k)) {
            assertTrue(held(c, k).getHeld());
            assertEquals(k, again.key());
        }
        assertFalse(held(c, k).getHeld(), "still held after try-with-resources");
    }

    @Test
    @Order(2)
    void holdsOfOneTtlShareOneSession() {
        Locker l = locker(a).locker();
        List<Lock> locks = new ArrayList<>();
        try {
            // conformance and re are two classes with one TTL on one tier.
            for (String k : List.of("conformance/java-share-1", "conformance/java-share-2", "re/java-share-3")) {
                locks.add(l.acquire(k));
            }
            assertEquals(1, locks.stream().map(Lock::sessionId).distinct().count(), "one session");
        } finally {
            locks.forEach(Lock::release);
        }
    }

    @Test
    @Order(3)
    void reentrantAcquireReachesTheArbiterOnce() {
        Locker l = locker(a).locker();
        HoldfastClient c = client(a);
        Key k = Key.parse("conformance/java-reentrant");
        // Open the session first: the grant count below is the key's alone.
        try (Lock warm = l.acquire("conformance/java-reentrant-warm")) {
            long before = grantAttempts(c);
            Lock outer = l.acquire(k);
            Lock inner = l.acquire(k);
            assertEquals(1, grantAttempts(c) - before, "grant transactions for two nested acquires");
            assertEquals(outer.token(), inner.token(), "the nested acquire got another token");
            assertFalse(inner.release(), "the inner release ended the hold");
            assertTrue(held(c, k).getHeld(), "the inner release ended the hold");
            assertFalse(inner.release(), "a second release of one Lock");
            assertTrue(outer.release(), "the outer release");
            assertFalse(held(c, k).getHeld(), "held after the outer release");
            assertTrue(warm.canStart());
        }
    }

    @Test
    @Order(4)
    void contentionIsATypedErrorAfterAZeroWait() {
        Locker la = locker(a).locker();
        Locker lb = locker(b).locker();
        Key k = Key.parse("conformance/java-contended");
        try (Lock lock = lb.acquire(k);
                // Open A's session first, so the timing below is the acquire's alone.
                Lock other = la.acquire("conformance/java-contended-other")) {
            long start = now();
            HoldfastException e = assertThrows(HoldfastException.class,
                    () -> la.acquire(k, AcquireOptions.DEFAULT.withWait(Duration.ZERO)));
            long took = now() - start;
            assertTrue(e.is(ErrorReason.ERROR_REASON_CONTENTION) && e.code() == Status.Code.ABORTED, e.toString());
            assertFalse(e.is(ErrorReason.ERROR_REASON_LEAK));
            assertTrue(e.getMessage().contains("conformance/java-contended"), e.toString());
            assertTrue(took <= TimeUnit.SECONDS.toNanos(2), "a zero wait took " + ms(took));
            assertTrue(lock.canStart() && other.canStart());
        }
    }

    @Test
    @Order(5)
    void leakIsATypedError() {
        Locker first = locker(a).locker();
        Locker second = locker(a).locker();
        Key k = Key.parse("conformance/java-leak");
        try (Lock lock = first.acquire(k)) {
            HoldfastException e = assertThrows(HoldfastException.class, () -> second.acquire(k));
            assertTrue(e.is(ErrorReason.ERROR_REASON_LEAK) && e.code() == Status.Code.FAILED_PRECONDITION, e.toString());
            assertTrue(lock.canStart());
        }
    }

    /**
     * Through grpc-java's own trailer decoding: StatusProto refuses a
     * google.rpc.Status whose code disagrees with the status's.
     */
    @Test
    @Order(6)
    void refusalsReachGrpcJavaWithTheirCodeAndDetail() throws Exception {
        HoldfastClient c = client(a);
        StatusRuntimeException raw = assertThrows(StatusRuntimeException.class, () -> c.rpc()
                .withDeadlineAfter(30, TimeUnit.SECONDS)
                .acquire(AcquireRequest.newBuilder().setSessionId(0x3039).setNamespace("conformance").setKey("java-nosession").build()));
        assertEquals(Status.Code.NOT_FOUND, raw.getStatus().getCode(), "unknown session: " + raw + " (want NOT_FOUND, not INTERNAL)");
        com.google.rpc.Status st = StatusProto.fromThrowable(raw);
        assertNotNull(st, "no grpc-status-details-bin");
        assertEquals(Status.Code.NOT_FOUND.value(), st.getCode());
        assertEquals(raw.getStatus().getDescription(), st.getMessage());
        assertEquals(1, st.getDetailsCount(), "details " + st.getDetailsList());
        ErrorDetail d = st.getDetails(0).unpack(ErrorDetail.class);
        assertEquals(ErrorReason.ERROR_REASON_SESSION_NOT_FOUND, d.getReason());
        assertTrue(HoldfastException.from(raw).is(ErrorReason.ERROR_REASON_SESSION_NOT_FOUND));

        StatusRuntimeException bad = assertThrows(StatusRuntimeException.class, () -> c.rpc()
                .withDeadlineAfter(30, TimeUnit.SECONDS)
                .acquire(AcquireRequest.newBuilder().setSessionId(0x3039).setNamespace("Jobs").setKey("k").build()));
        HoldfastException typed = HoldfastException.from(bad);
        assertTrue(typed.is(ErrorReason.ERROR_REASON_INVALID_ARGUMENT), typed.toString());
        assertEquals("namespace", typed.field());
        assertEquals(Status.Code.INVALID_ARGUMENT, typed.code());

        try {
            c.rpc().withDeadlineAfter(30, TimeUnit.SECONDS).release(ReleaseRequest.newBuilder()
                    .setSessionId(0x3039).setNamespace("conformance").setKey("java-nosession").setToken(1L << 48 | 1).build());
        } catch (StatusRuntimeException e) {
            assertNotEquals(Status.Code.INTERNAL, e.getStatus().getCode(), "release on an unknown session: " + e);
        }

        // The refusals that need another arbiter: one in another region that
        // allows one request a second (HOLDFAST_CONFORMANCE_ELSEWHERE), one
        // sealed (HOLDFAST_CONFORMANCE_SEALED).
        String elsewhere = need("HOLDFAST_CONFORMANCE_ELSEWHERE");
        String sealed = need("HOLDFAST_CONFORMANCE_SEALED");
        refused("a namespace no grant covers",
                () -> c.rpc().withDeadlineAfter(30, TimeUnit.SECONDS)
                        .inspect(InspectRequest.newBuilder().setNamespace("undeclared").setKey("k").build()),
                Status.Code.PERMISSION_DENIED, ErrorReason.ERROR_REASON_DENIED);

        HoldfastClient s = clientAt(sealed, a);
        long session = s.rpc().withDeadlineAfter(30, TimeUnit.SECONDS)
                .openSession(OpenSessionRequest.newBuilder().setNamespace("conformance").build())
                .getSessionId();
        refused("a sealed arbiter",
                () -> s.rpc().withDeadlineAfter(30, TimeUnit.SECONDS).acquire(AcquireRequest.newBuilder()
                        .setSessionId(session).setNamespace("conformance").setKey("java-sealed").build()),
                Status.Code.FAILED_PRECONDITION, ErrorReason.ERROR_REASON_SEALED);

        HoldfastClient homed = clientAt(elsewhere, b);
        refused("a class homed to another region",
                () -> homed.rpc().withDeadlineAfter(30, TimeUnit.SECONDS)
                        .inspect(InspectRequest.newBuilder().setNamespace("homed").setKey("k").build()),
                Status.Code.FAILED_PRECONDITION, ErrorReason.ERROR_REASON_WRONG_REGION);

        HoldfastClient limited = clientAt(elsewhere, a);
        refused("the request rate", () -> {
            for (int i = 0; i <= 20; i++) {
                limited.rpc().withDeadlineAfter(30, TimeUnit.SECONDS)
                        .inspect(InspectRequest.newBuilder().setNamespace("conformance").setKey("k").build());
            }
            fail("20 calls in a row at one a second were all answered");
        }, Status.Code.RESOURCE_EXHAUSTED, ErrorReason.ERROR_REASON_RATE_LIMITED);
    }

    /** A raw client of the arbiter at endpoint with cfg's identity. */
    private HoldfastClient clientAt(String endpoint, Config cfg) {
        return client(cfg.toBuilder().endpoints(List.of(endpoint)).build());
    }

    /**
     * Asserts that call is refused, reaching grpc-java with code and one
     * lock.v1.ErrorDetail of reason, and that the library maps it to reason.
     */
    private static void refused(String what, org.junit.jupiter.api.function.Executable call, Status.Code code,
            ErrorReason reason) throws Exception {
        StatusRuntimeException e = assertThrows(StatusRuntimeException.class, call, what);
        assertEquals(code, e.getStatus().getCode(), what + ": " + e);
        com.google.rpc.Status st = StatusProto.fromThrowable(e);
        assertNotNull(st, what + ": no grpc-status-details-bin");
        assertEquals(1, st.getDetailsCount(), what + ": details " + st.getDetailsList());
        assertEquals(reason, st.getDetails(0).unpack(ErrorDetail.class).getReason(), what);
        HoldfastException typed = HoldfastException.from(e);
        assertTrue(typed.is(reason) && typed.code() == code, what + ": " + typed);
        System.out.println(what + ": " + code + ", " + reason);
    }

    @Test
    @Order(7)
    void aCertificateWithoutASpiffeIdIsUnauthenticated() {
        Locker l = locker(plain).locker();
        HoldfastException e = assertThrows(HoldfastException.class, () -> l.acquire("conformance/java-plain"));
        assertTrue(e.is(ErrorReason.ERROR_REASON_UNAUTHENTICATED) && e.code() == Status.Code.UNAUTHENTICATED, e.toString());
    }

    @Test
    @Order(8)
    void aSessionClosedElsewhereIsFencedWithItsKeys() throws Exception {
        Made m = locker(a);
        Locker l = m.locker();
        HoldfastClient c = client(a);
        Lock lock = null;
        for (String k : List.of("conformance/java-fence-1", "conformance/java-fence-2")) {
            lock = l.acquire(k);
        }
        c.rpc().withDeadlineAfter(30, TimeUnit.SECONDS)
                .closeSession(CloseSessionRequest.newBuilder().setSessionId(lock.sessionId()).build());
        Fenced x = m.fences().got.poll(ttl.toMillis(), TimeUnit.MILLISECONDS);
        assertNotNull(x, "no fence within the TTL of the session's close");
        List<String> keys = x.keys().stream().map(Key::toString).sorted().toList();
        assertEquals(List.of("conformance/java-fence-1", "conformance/java-fence-2"), keys);
        assertEquals(lock.sessionId(), x.sessionId());
        assertEquals(ttl, x.ttl());
        assertEquals(Health.LOST, lock.health());
        assertFalse(lock.canStart());
        assertTrue(lock.lost().toCompletableFuture().isDone());
        assertEquals(Duration.ZERO, lock.remainingTtl());
        // The next acquire opens a new session.
        try (Lock again = l.acquire("conformance/java-fence-1")) {
            assertNotEquals(lock.sessionId(), again.sessionId());
        }
    }

    @Test
    @Order(9)
    void theTokenNeverPrints() {
        Locker l = locker(a).locker();
        try (Lock lock = l.acquire("conformance/java-redact")) {
            long v = lock.token().expose();
            Token t = lock.token();
            java.io.ByteArrayOutputStream logged = new java.io.ByteArrayOutputStream();
            Logger logger = Logger.getLogger("holdfast-conformance");
            Handler handler = new StreamHandler(logged, new SimpleFormatter());
            logger.addHandler(handler);
            try {
                logger.warning(lock + " " + t);
                logger.log(new LogRecord(java.util.logging.Level.WARNING, "{0} {1}") {
                    {
                        setParameters(new Object[] {lock, t});
                    }
                });
                handler.flush();
            } finally {
                logger.removeHandler(handler);
            }
            String out = String.join(" ", lock.toString(), String.valueOf(lock), String.format("%s %s", lock, t),
                    t.toString(), String.valueOf(t), List.of(lock, t).toString(), logged.toString(StandardCharsets.UTF_8));
            for (String form : List.of(Long.toUnsignedString(v), Long.toHexString(v), Long.toString(v & ((1L << 48) - 1)))) {
                assertFalse(out.contains(form), "the token (" + form + ") shows in " + out);
            }
            assertTrue(out.contains("conformance/java-redact") && out.contains("redacted"), out);
        }
    }

    /**
     * A release that gets no answer may still be applied later, so the
     * library keeps its key blocked: through a proxy in front of the dev
     * arbiter that drops everything while cut (HOLDFAST_CONFORMANCE_CUTTABLE,
     * cut while the file HOLDFAST_CONFORMANCE_CUT exists), the release gets no
     * answer and the hold stays in etcd; the next acquire sends the release
     * again first and fails while still cut; once the cut ends, the acquire
     * has the release answered and gets a hold of its own on the same
     * session, rather than the old one handed back (which the late release
     * could delete under it).
     */
    @Test
    @Order(10)
    void anUnansweredReleaseIsSentAgainBeforeTheKeyIsAcquiredAgain() throws Exception {
        Path cut = Path.of(need("HOLDFAST_CONFORMANCE_CUT"));
        Config viaProxy = a.toBuilder()
                .endpoints(List.of(need("HOLDFAST_CONFORMANCE_CUTTABLE")))
                .callTimeout(Duration.ofSeconds(1))
                .build();
        Locker l = locker(viaProxy).locker();
        String key = "conformance/java-unanswered";
        Lock first = l.acquire(key);
        Files.createFile(cut);
        try {
            HoldfastException e = assertThrows(HoldfastException.class, first::release);
            assertTrue(e.unavailable(), "a release with no answer: " + e);
            assertTrue(holdInEtcd("/l/" + key), "the unanswered release was applied: the proxy let it through");
            e = assertThrows(HoldfastException.class, () -> l.acquire(key));
            assertTrue(e.unavailable(), "an acquire while the release is unanswered: " + e);
        } finally {
            Files.deleteIfExists(cut);
        }
        Lock again = null;
        long end = now() + TimeUnit.SECONDS.toNanos(8);
        while (again == null) {
            try {
                again = l.acquire(key);
            } catch (HoldfastException e) {
                assertTrue(e.unavailable() && now() < end, "acquire after the cut: " + e);
                Thread.sleep(100);
            }
        }
        assertEquals(first.sessionId(), again.sessionId(), "the session was lost during the cut: the test proves nothing");
        assertTrue(Long.compareUnsigned(again.token().expose(), first.token().expose()) > 0,
                "the old hold was handed back to its session: a late release could delete it under the new holder");
        assertTrue(again.release());
    }

    /**
     * Last: it stops the arbiter (SIGSTOP), twice. A short freeze: canStart
     * turns false at the first failed keepalive and true again once one is
     * confirmed, with no fence. A long one: the fence listener is called at
     * the local deadline (the last confirmed keepalive's send time + TTL −
     * 1 s), while etcd still has the hold; etcd ends it later (measured, the
     * arbiter still stopped).
     */
    @Test
    @Order(11)
    void aStoppedArbiterDrainsThenFencesBeforeTheLeaseCanExpire() throws Exception {
        Made m = locker(a);
        Key k = Key.parse("fence/java-sigstop");
        Lock lock = m.locker().acquire(k);
        assertEquals(ttl, lock.ttl(), "the fence class's TTL");
        long stopped;
        long drained;
        long fenced;
        long expired = 0;
        try {
            // 1. A short freeze.
            stopped = stop(lock);
            drained = waitDrained(lock, stopped);
            signal("CONT");
            while (!lock.canStart()) {
                assertTrue(now() - drained < TimeUnit.SECONDS.toNanos(5), "canStart did not come back after keepalives resumed");
                Thread.sleep(20);
            }
            assertNull(m.fences().got.poll(), "fenced on a recovered blip");
            System.out.println("canStart dropped " + ms(drained - stopped) + " after the short freeze and recovered");

            // 2. A long freeze.
            stopped = stop(lock);
            // Renewals cannot move the deadline any more.
            long deadline = stopped + lock.remainingTtl().toNanos();
            drained = waitDrained(lock, stopped);
            Fenced x = m.fences().got.poll(2 * ttl.toMillis(), TimeUnit.MILLISECONDS);
            fenced = now();
            assertNotNull(x, "no fence");
            assertEquals(List.of(k), x.keys());
            assertTrue(drained - fenced <= 0 && fenced - (deadline - TimeUnit.MILLISECONDS.toNanos(50)) >= 0
                            && fenced - (deadline + TimeUnit.MILLISECONDS.toNanos(300)) <= 0,
                    "drained at +" + ms(drained - stopped) + ", fenced at +" + ms(fenced - stopped) + ", the deadline at +"
                            + ms(deadline - stopped));
            // The lease's real end, read from etcd itself (its JSON gateway)
            // while the arbiter is still stopped: the hold must still exist
            // after the fence, and disappear when etcd expires the lease.
            boolean first = true;
            while (expired == 0) {
                assertTrue(now() - fenced < ttl.toNanos(), "the hold outlived the fence by a TTL");
                if (holdInEtcd("/l/" + k)) {
                    first = false;
                } else {
                    assertFalse(first, "the hold was gone from etcd at the first look after the fence ("
                            + ms(now() - fenced) + " after it): the fence came too late");
                    expired = now();
                }
                Thread.sleep(20);
            }
        } finally {
            signal("CONT");
        }
        System.out.println("FENCE-MARGIN java: drained " + ms(drained - stopped) + " and fenced " + ms(fenced - stopped)
                + " after SIGSTOP; etcd expired the lease " + ms(expired - fenced) + " after the fence (TTL " + seconds(ttl)
                + ", margin " + seconds(Locker.FENCE_MARGIN) + ")");
        assertTrue(expired - fenced > 0, "fenced after the lease ended");
        assertEquals(Health.LOST, lock.health(), "health after the fence");
        assertFalse(lock.canStart());
    }

    /**
     * Writes record through the PostgreSQL reference fence with the shared
     * script (clients/conformance/fenced-write), the token on its standard
     * input: true when the fence accepted it, false when it rejected it.
     */
    private static boolean fencedWrite(String scripts, Token token, String record) throws Exception {
        Process p = new ProcessBuilder(Path.of(scripts, "fenced-write").toString(), record).redirectErrorStream(true).start();
        try (var in = p.getOutputStream()) {
            in.write((Long.toUnsignedString(token.expose()) + "\n").getBytes(StandardCharsets.UTF_8));
        }
        String out = new String(p.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        int code = p.waitFor();
        if (code == 0 && out.equals("accepted")) {
            return true;
        }
        if (code == 1 && out.equals("rejected")) {
            return false;
        }
        // Not the token: the script never prints it.
        return fail("fenced-write " + record + ": exit " + code + ": " + out);
    }

    /**
     * This process (the test JVM) stops itself (SIGSTOP) past its TTL while
     * it holds a key. A successor (clients/conformance/take-over, another
     * identity) gets the key once the lease expires, writes with its newer
     * token and resumes this process, whose late write with the old token the
     * PostgreSQL fence must reject.
     */
    @Test
    @Order(12)
    void aStoppedClientsLateWriteIsRejectedByThePostgresqlFence() throws Exception {
        need("HOLDFAST_CONFORMANCE_SCRIPTS");
        need("HOLDFAST_CONFORMANCE_PG_URL");
        Made m = locker(a);
        Key k = Key.parse("fence/java-late-write");
        String record = "java-late-write";
        Lock lock = m.locker().acquire(k);
        assertTrue(fencedWrite(scripts, lock.token(), record), "the holder's first write was rejected");
        // The successor waits for the key as another identity, writes, and
        // resumes this process; then this process stops itself past its TTL.
        long self = ProcessHandle.current().pid();
        Process take = new ProcessBuilder(Path.of(scripts, "take-over").toString(), Long.toString(self), k.toString(), record)
                .redirectErrorStream(true)
                .start();
        Duration remaining = lock.remainingTtl();
        long stopped = now();
        Process stop = new ProcessBuilder("kill", "-STOP", Long.toString(self)).inheritIO().start();
        assertEquals(0, stop.waitFor(), "kill -STOP " + self);
        // Another process stops this one, so the stop may land a moment after
        // kill returns: the stop is measured to the successor's exit, which
        // is when it resumes this process.
        String successor = new String(take.getInputStream().readAllBytes(), StandardCharsets.UTF_8);
        assertEquals(0, take.waitFor(), "the successor: " + successor);
        long resumed = now();
        assertTrue(successor.contains("accepted"), "the successor: " + successor);
        assertTrue(resumed - stopped > remaining.toNanos(),
                "stopped for " + ms(resumed - stopped) + ", within the lock's remaining TTL " + ms(remaining.toNanos()));
        Fenced x = m.fences().got.poll(5, TimeUnit.SECONDS);
        assertNotNull(x, "no fence after a stop longer than the TTL");
        assertEquals(List.of(k), x.keys());
        assertFalse(lock.canStart(), "canStart is true after the stop");
        // The write a paused process makes when it wakes, before it looks at
        // its lock: the fence must reject it.
        assertFalse(fencedWrite(scripts, lock.token(), record), "the stopped client's late write was accepted");
        Process count = new ProcessBuilder(Path.of(scripts, "fenced-write").toString(), "--count", record).start();
        String accepted = new String(count.getInputStream().readAllBytes(), StandardCharsets.UTF_8).strip();
        assertEquals(0, count.waitFor());
        assertEquals("2", accepted, "accepted writes (the holder's first and the successor's)");
        System.out.println("LATE-WRITE java: the late write was rejected after a " + ms(resumed - stopped) + " stop ("
                + ms(remaining.toNanos()) + " of the lock's TTL was left when it stopped; TTL " + seconds(ttl) + ")");
    }

    /** Waits for a confirmed renewal (the deadline moves forward), then stops the arbiter. */
    private long stop(Lock lock) throws Exception {
        long first = now() + lock.remainingTtl().toNanos();
        while (now() + lock.remainingTtl().toNanos() - first < TimeUnit.MILLISECONDS.toNanos(500)) {
            assertTrue(now() - first < ttl.toNanos(), "no confirmed keepalive");
            Thread.sleep(50);
        }
        signal("STOP");
        return now();
    }

    private long waitDrained(Lock lock, long stopped) throws InterruptedException {
        while (lock.canStart()) {
            assertTrue(now() - stopped < ttl.toNanos(), "canStart stayed true with the arbiter stopped");
            Thread.sleep(10);
        }
        return now();
    }
}
