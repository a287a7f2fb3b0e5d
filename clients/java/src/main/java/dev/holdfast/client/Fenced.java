package dev.holdfast.client;

import java.time.Duration;
import java.util.List;

/**
 * What a {@link FenceListener} receives when a session is lost (its local
 * deadline passed, or the arbiter said it is gone): every key in
 * {@link #keys()} must be treated as lost. Stop acting on them now.
 *
 * @param ttl the session's TTL
 * @param sessionId the session's id
 * @param keys every key the session held
 */
public record Fenced(Duration ttl, long sessionId, List<Key> keys) {
    /**
     * Copies keys.
     *
     * @param ttl the session's TTL
     * @param sessionId the session's id
     * @param keys every key the session held
     */
    public Fenced {
        keys = List.copyOf(keys);
    }

    @Override
    public String toString() {
        return "Fenced{ttl=" + ttl + ", session=" + Long.toHexString(sessionId) + ", keys=" + keys + "}";
    }
}
