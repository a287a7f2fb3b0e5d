package dev.holdfast.client;

import java.time.Duration;
import java.util.Objects;

/**
 * How to acquire: the session TTL and how long to wait for the key.
 * Immutable; start from {@link #DEFAULT}.
 */
public final class AcquireOptions {
    /** The class's TTL, no wait. */
    public static final AcquireOptions DEFAULT = new AcquireOptions(Duration.ZERO, Duration.ZERO);

    private final Duration ttl;
    private final Duration waitTime;

    private AcquireOptions(Duration ttl, Duration waitTime) {
        Objects.requireNonNull(ttl, "ttl");
        Objects.requireNonNull(waitTime, "waitTime");
        if (ttl.isNegative() || waitTime.isNegative()) {
            throw new IllegalArgumentException("ttl and waitTime may not be negative");
        }
        this.ttl = ttl;
        this.waitTime = waitTime;
    }

    /**
     * @return the session TTL; {@link Duration#ZERO} (the default) is the
     *     TTL of the key's class, the only TTL the arbiter accepts for it;
     *     another value is refused naming the class (ERROR_REASON_CLASS_TTL).
     *     Holds of one TTL and tier share one session.
     */
    public Duration ttl() {
        return ttl;
    }

    /** @return how long to wait while another session holds the key ({@link Duration#ZERO}: try once) */
    public Duration waitTime() {
        return waitTime;
    }

    /**
     * @param ttl the session TTL
     * @return these options with ttl
     */
    public AcquireOptions withTtl(Duration ttl) {
        return new AcquireOptions(ttl, waitTime);
    }

    /**
     * @param waitTime how long to wait for the key
     * @return these options with waitTime
     */
    public AcquireOptions withWait(Duration waitTime) {
        return new AcquireOptions(ttl, waitTime);
    }

    @Override
    public String toString() {
        return "AcquireOptions{ttl=" + ttl + ", wait=" + waitTime + "}";
    }
}
