package dev.holdfast.client;

import java.time.Duration;
import java.util.concurrent.CompletionStage;
import java.util.concurrent.atomic.AtomicBoolean;

/**
 * One level of a held lock. Release it with {@link #release()}, or with
 * try-with-resources ({@link #close()}); dropping a Lock keeps the hold until
 * its session ends. Its token never prints (see {@link Token}).
 */
public final class Lock implements AutoCloseable {
    private final Locker locker;
    private final Locker.Slot slot;
    private final Key key;
    private final Token token;
    private final AtomicBoolean released = new AtomicBoolean();

    Lock(Locker locker, Locker.Slot slot, Key key, Token token) {
        this.locker = locker;
        this.slot = slot;
        this.key = key;
        this.token = token;
    }

    /**
     * The fencing token: pass {@code token().expose()} to the resource with
     * every write. 0 for an unprotected grant, which a fenced resource refuses.
     *
     * @return the token
     */
    public Token token() {
        return token;
    }

    /**
     * Whether the grant was made from an arbiter's memory while etcd was out
     * of its reach (a class with on_quorum_loss = "open"): token 0, another
     * arbiter may grant the key at the same time, and it is recorded for
     * reconciliation. The hold is lost (fenced) once etcd is back.
     *
     * @return true for an unprotected grant
     */
    public boolean unprotected() {
        return token.unprotected();
    }

    /** @return the key */
    public Key key() {
        return key;
    }

    /**
     * False from the first failed keepalive until keepalives are confirmed
     * again: finish the unit of work in hand, start no new one.
     *
     * @return whether new work may start
     */
    public boolean canStart() {
        return slot.session.canStart();
    }

    /**
     * The time left until the local deadline, when the hold must be treated
     * as lost. Do not start work that cannot finish in this time.
     *
     * @return the time left, zero once past
     */
    public Duration remainingTtl() {
        return slot.session.remainingTtl();
    }

    /** @return the session's liveness now */
    public Health health() {
        return slot.session.health();
    }

    /** @return completes when the session is lost (the fence listener is called too) */
    public CompletionStage<Void> lost() {
        return slot.session.lost.minimalCompletionStage();
    }

    /** @return the session's id */
    public long sessionId() {
        return slot.session.id;
    }

    /** @return the session's TTL (the class's) */
    public Duration ttl() {
        return slot.session.ttl;
    }

    /**
     * Ends one level of nesting; the last one releases the hold at the
     * arbiter.
     *
     * @return whether a hold was deleted there (false while still nested, if
     *     the hold was already gone, or if this Lock was released before)
     * @throws HoldfastException when the arbiter refused or could not be
     *     reached. Unavailable means the outcome is unknown: the hold may live
     *     until its session ends. Call release again to retry; the next acquire
     *     of the key through this Locker also sends the release again first.
     */
    public boolean release() {
        if (released.getAndSet(true)) {
            return false;
        }
        try {
            return locker.release(slot, key, token);
        } catch (HoldfastException e) {
            if (e.unavailable()) {
                released.set(false);
            }
            throw e;
        }
    }

    /** {@link #release()}, for try-with-resources. */
    @Override
    public void close() {
        release();
    }

    /** Describes the lock without its token. */
    @Override
    public String toString() {
        return "Lock{key: " + key + ", session: " + Long.toHexString(slot.session.id) + ", token: " + Token.REDACTED
                + ", unprotected: " + unprotected() + "}";
    }
}
