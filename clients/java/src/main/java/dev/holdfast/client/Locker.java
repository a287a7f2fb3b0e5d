package dev.holdfast.client;

import io.grpc.ChannelCredentials;
import io.grpc.ManagedChannel;
import java.time.Duration;
import java.util.ArrayList;
import java.util.HashMap;
import java.util.List;
import java.util.Map;
import java.util.Objects;
import java.util.concurrent.ConcurrentHashMap;
import java.util.concurrent.Semaphore;
import java.util.concurrent.TimeUnit;
import java.util.concurrent.locks.ReentrantLock;
import java.util.logging.Level;
import java.util.logging.Logger;
import lock.v1.LockGrpc;
import lock.v1.LockOuterClass.OpenSessionRequest;
import lock.v1.LockOuterClass.OpenSessionResponse;
import lock.v1.LockOuterClass.ReleaseRequest;

/**
 * Takes locks for one workload identity (the client certificate's). Safe for
 * concurrent use; share one per process.
 *
 * <p>Holds of one TTL (and tier) share one session, renewed in the
 * background. Each lock reports {@link Lock#canStart()} (false from the first
 * failed keepalive) and {@link Lock#remainingTtl()}; at the session's local
 * deadline the {@link FenceListener} is told every key the session held.
 */
public final class Locker implements AutoCloseable {
    /**
     * Kept between the local deadline and the earliest moment the arbiter's
     * lease can end.
     */
    public static final Duration FENCE_MARGIN = Duration.ofSeconds(1);

    private static final Logger LOG = Logger.getLogger(Locker.class.getName());

    private final List<String> endpoints;
    private final List<ManagedChannel> channels = new ArrayList<>();
    private final List<LockGrpc.LockStub> async = new ArrayList<>();
    private final List<LockGrpc.LockBlockingStub> blocking = new ArrayList<>();
    private final FenceListener onFence;
    private final Duration callTimeout;

    /** Held while a session is looked up or opened (one at a time). */
    private final ReentrantLock slotsLock = new ReentrantLock();
    private Map<SlotKey, Slot> slots = new HashMap<>();
    /** The class TTL and tier of each namespace a session was opened for. */
    private final Map<String, SlotKey> classes = new ConcurrentHashMap<>();

    /** One session per (TTL, tier): a class's keys live on its tier's etcd cluster. */
    record SlotKey(Duration ttl, String tier) {}

    record Entry(Token token, int count, int via) {}

    /** A final release sent without an answer from any arbiter. */
    record Unanswered(Token token, int via) {}

    /** One session and the holds on it. */
    static final class Slot {
        final Session session;
        final SlotKey key;
        /** The arbiter the session was opened on: the only one that knows an unprotected session. */
        final int home;
        final Map<Key, Entry> holds = new HashMap<>(); // guarded by this
        /**
         * Final releases without an answer: the hold may still be live and the
         * release may still be applied, so acquire sends it again first.
         */
        final Map<Key, Unanswered> releasing = new HashMap<>(); // guarded by this
        private final Map<Key, Semaphore> keyLocks = new ConcurrentHashMap<>();

        Slot(Session session, SlotKey key, int home) {
            this.session = session;
            this.key = key;
            this.home = home;
        }

        /** Serialises acquire and release of one key in the slot. */
        Semaphore keyLock(Key k) {
            Semaphore s = keyLocks.computeIfAbsent(k, x -> new Semaphore(1));
            s.acquireUninterruptibly();
            return s;
        }
    }

    /**
     * Connects (lazily) to every endpoint of cfg.
     *
     * @param cfg the endpoints and this workload's mTLS material
     * @param onFence required: how the library tells the application to stop
     *     acting on its keys
     * @throws HoldfastConfigException when onFence is null, no endpoint is
     *     configured, or the mTLS files cannot be read
     */
    public Locker(Config cfg, FenceListener onFence) {
        this(cfg, onFence, connect(cfg, onFence));
    }

    /** Locker on channels already open, one per endpoint of cfg (the unit tests' in-process fakes). */
    Locker(Config cfg, FenceListener onFence, List<ManagedChannel> channels) {
        check(cfg, onFence);
        if (channels.size() != cfg.endpoints().size()) {
            throw new IllegalArgumentException("one channel per endpoint");
        }
        this.endpoints = cfg.endpoints();
        this.onFence = onFence;
        this.callTimeout = cfg.callTimeout();
        for (ManagedChannel ch : channels) {
            this.channels.add(ch);
            async.add(LockGrpc.newStub(ch));
            blocking.add(LockGrpc.newBlockingStub(ch));
        }
    }

    private static void check(Config cfg, FenceListener onFence) {
        if (onFence == null) {
            throw new HoldfastConfigException("onFence is required: it is how the library tells you to stop");
        }
        Objects.requireNonNull(cfg, "cfg");
        if (cfg.endpoints().isEmpty()) {
            throw new HoldfastConfigException("no arbiter endpoints configured");
        }
    }

    private static List<ManagedChannel> connect(Config cfg, FenceListener onFence) {
        check(cfg, onFence);
        for (String e : cfg.endpoints()) {
            Channels.target(e);
        }
        ChannelCredentials creds = Channels.credentials(cfg);
        List<ManagedChannel> out = new ArrayList<>();
        for (String e : cfg.endpoints()) {
            out.add(Channels.open(e, creds));
        }
        return out;
    }

    /**
     * The endpoint that serves key first.
     *
     * @param key the key
     * @return its index in the configured endpoints
     */
    public int homeOf(Key key) {
        return Rendezvous.ranked(key.toString(), endpoints).get(0);
    }

    /**
     * The session for holds of key's class TTL (or ttl), opened if needed: a
     * new session is opened for the key's namespace, so the arbiter says the
     * class's TTL and tier (and refuses a ttl that differs).
     */
    private Slot slot(Key key, Duration ttl) {
        slotsLock.lock();
        try {
            SlotKey known = classes.get(key.namespace());
            if (known != null && !ttl.isZero()) {
                known = new SlotKey(ttl, known.tier());
            }
            if (known != null) {
                Slot s = slots.get(known);
                if (s != null && s.session.health() != Health.LOST) {
                    return s;
                }
            }
            // Sessions are spread by TTL and tier (or namespace, until its
            // class is known) over the arbiters, with failover.
            String spread;
            if (known != null && known.tier().equals("entity")) {
                spread = "session/" + known.ttl().toMillis();
            } else if (known != null) {
                spread = "session/" + known.ttl().toMillis() + "/" + known.tier();
            } else {
                spread = "session/" + key.namespace();
            }
            Duration asked = ttl.isZero() && known != null ? known.ttl() : ttl;
            List<Integer> order = Rendezvous.ranked(spread, endpoints);
            HoldfastException last = null;
            for (int n = 0; n < order.size(); n++) {
                int i = order.get(n);
                List<LockGrpc.LockStub> clients = new ArrayList<>();
                List<LockGrpc.LockBlockingStub> blockings = new ArrayList<>();
                for (int step = 0; step < order.size(); step++) {
                    int j = order.get((n + step) % order.size());
                    clients.add(async.get(j));
                    blockings.add(blocking.get(j));
                }
                long openedAt = System.nanoTime();
                OpenSessionResponse resp;
                try {
                    resp = blocking.get(i).withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                            .openSession(OpenSessionRequest.newBuilder()
                                    .setTtlMillis(asked.toMillis())
                                    .setNamespace(key.namespace())
                                    .build());
                } catch (RuntimeException e) {
                    HoldfastException h = HoldfastException.from(e);
                    if (h.unavailable()) {
                        last = h;
                        continue;
                    }
                    throw h;
                }
                Session sess = new Session(clients, blockings, resp.getSessionId(),
                        Duration.ofMillis(resp.getTtlMillis()), openedAt, callTimeout);
                if (!resp.getTier().isEmpty()) {
                    sess.tier = resp.getTier();
                }
                sess.unprotected = resp.getUnprotected();
                SlotKey k = new SlotKey(sess.ttl, sess.tier);
                classes.put(key.namespace(), k);
                // Opened only to learn the class's TTL and tier, which a live
                // session already has: keep that one (one session per TTL and tier).
                Slot existing = slots.get(k);
                if (existing != null && existing.session.health() != Health.LOST) {
                    try {
                        sess.close();
                    } catch (HoldfastException ignored) {
                        // The spare session expires by itself.
                    }
                    return existing;
                }
                Slot s = new Slot(sess, k, i);
                slots.put(k, s);
                sess.start(() -> fenceWhenLost(s));
                return s;
            }
            throw last != null ? last : new HoldfastConfigException("no arbiter endpoints");
        } finally {
            slotsLock.unlock();
        }
    }

    /**
     * Runs when a session's keepalives stop; if it was lost (not closed),
     * drops it and hands every key it held to the fence listener.
     */
    private void fenceWhenLost(Slot s) {
        if (s.session.health() != Health.LOST) {
            return;
        }
        slotsLock.lock();
        try {
            if (slots.get(s.key) == s) {
                slots.remove(s.key);
            }
        } finally {
            slotsLock.unlock();
        }
        List<Key> keys;
        synchronized (s) {
            keys = new ArrayList<>(s.holds.keySet());
            s.holds.clear();
        }
        if (!keys.isEmpty()) {
            try {
                onFence.onFence(new Fenced(s.session.ttl, s.session.id, keys));
            } catch (RuntimeException e) {
                LOG.log(Level.WARNING, "holdfast: the fence listener threw", e);
            }
        }
    }

    /**
     * Acquires key with the class's TTL, trying once.
     *
     * @param key {@code NAMESPACE/KEY}
     * @return the lock; release it (or close it in try-with-resources)
     * @throws HoldfastException when refused (contention, leak, denied, …)
     */
    public Lock acquire(String key) {
        return acquire(Key.parse(key), AcquireOptions.DEFAULT);
    }

    /**
     * Acquires key with the class's TTL, trying once.
     *
     * @param key the key
     * @return the lock
     * @throws HoldfastException when refused
     */
    public Lock acquire(Key key) {
        return acquire(key, AcquireOptions.DEFAULT);
    }

    /**
     * Acquires key. A key already held through this Locker's session of the
     * same TTL is re-entered: its count goes up and nothing is sent; the
     * returned Lock shares the hold's token. If the key's last release in this
     * session got no answer, it is sent again first, and acquire throws
     * (unavailable, or the arbiter's refusal) until it is answered: the arbiter
     * would otherwise hand the session its old hold back, which the late
     * release could then delete under the new holder.
     *
     * @param key the key
     * @param opts the TTL and how long to wait
     * @return the lock
     * @throws HoldfastException when refused
     */
    public Lock acquire(Key key, AcquireOptions opts) {
        Objects.requireNonNull(key, "key");
        Slot s = slot(key, opts.ttl());
        Semaphore keyLock = s.keyLock(key);
        try {
            Unanswered u;
            synchronized (s) {
                u = s.releasing.get(key);
            }
            if (u != null) {
                sendRelease(s, key, u.token(), u.via());
            }
            synchronized (s) {
                Entry e = s.holds.get(key);
                if (e != null) {
                    s.holds.put(key, new Entry(e.token(), e.count() + 1, e.via()));
                    return new Lock(this, s, key, e.token());
                }
            }
            // An unprotected session exists only on the arbiter that opened it.
            List<Integer> order = s.session.unprotected ? List.of(s.home) : Rendezvous.ranked(key.toString(), endpoints);
            HoldfastException last = null;
            for (int i : order) {
                Token token;
                try {
                    token = s.session.acquireOn(blocking.get(i), key, opts.waitTime());
                } catch (HoldfastException e) {
                    if (!e.unavailable()) {
                        throw e;
                    }
                    last = e;
                    continue;
                }
                synchronized (s) {
                    s.holds.put(key, new Entry(token, 1, i));
                }
                return new Lock(this, s, key, token);
            }
            throw last != null ? last : new HoldfastConfigException("no arbiter endpoints");
        } finally {
            keyLock.release();
        }
    }

    /**
     * Ends one level of a hold; the last one releases it at the arbiter. A
     * release of this token still unanswered is sent again.
     */
    boolean release(Slot s, Key key, Token token) {
        Semaphore keyLock = s.keyLock(key);
        try {
            int via;
            synchronized (s) {
                Entry e = s.holds.get(key);
                Unanswered u = s.releasing.get(key);
                if (e == null && u != null && u.token().equals(token)) {
                    via = u.via();
                } else if (e == null || !e.token().equals(token)) {
                    // Fenced or replaced meanwhile: nothing of ours to release.
                    return false;
                } else if (e.count() > 1) {
                    s.holds.put(key, new Entry(e.token(), e.count() - 1, e.via()));
                    return false;
                } else {
                    via = e.via();
                    s.holds.remove(key);
                }
            }
            return sendRelease(s, key, token, via);
        } finally {
            keyLock.release();
        }
    }

    /**
     * Sends the final release of key's hold token, from arbiter via on
     * (failing over while unavailable). Without an answer the release is kept
     * in the slot as unanswered; only an answer clears it (a refusal says this
     * attempt did nothing, not what became of an earlier unanswered one).
     */
    private boolean sendRelease(Slot s, Key key, Token token, int via) {
        ReleaseRequest req = ReleaseRequest.newBuilder()
                .setSessionId(s.session.id)
                .setNamespace(key.namespace())
                .setKey(key.path())
                .setToken(token.expose())
                .build();
        int n = blocking.size();
        HoldfastException last = null;
        for (int step = 0; step < n; step++) {
            boolean released;
            try {
                released = blocking.get((via + step) % n).withDeadlineAfter(callTimeout.toNanos(), TimeUnit.NANOSECONDS)
                        .release(req)
                        .getReleased();
            } catch (RuntimeException e) {
                HoldfastException h = HoldfastException.from(e);
                if (!h.unavailable()) {
                    throw h;
                }
                last = h;
                continue;
            }
            synchronized (s) {
                s.releasing.remove(key);
            }
            return released;
        }
        synchronized (s) {
            s.releasing.put(key, new Unanswered(token, via));
        }
        throw last != null ? last : new HoldfastConfigException("no arbiter endpoints");
    }

    /**
     * Ends every session of this Locker (and so every hold), each in one
     * committed entry, and closes the connections. No fence is delivered for
     * holds ended this way.
     *
     * @throws HoldfastException the first failure to close a session at the
     *     arbiter (the connections are closed all the same)
     */
    @Override
    public void close() {
        Map<SlotKey, Slot> all;
        slotsLock.lock();
        try {
            all = slots;
            slots = new HashMap<>();
        } finally {
            slotsLock.unlock();
        }
        HoldfastException first = null;
        for (Slot s : all.values()) {
            synchronized (s) {
                s.holds.clear();
                s.releasing.clear();
            }
            try {
                s.session.close();
            } catch (HoldfastException e) {
                if (first == null) {
                    first = e;
                }
            }
        }
        for (ManagedChannel ch : channels) {
            Channels.shutdown(ch);
        }
        if (first != null) {
            throw first;
        }
    }
}
