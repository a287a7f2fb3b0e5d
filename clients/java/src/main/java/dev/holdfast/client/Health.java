package dev.holdfast.client;

/** What a session knows about its own liveness. */
public enum Health {
    /** The last keepalive was confirmed. New work may start. */
    HEALTHY,
    /**
     * A keepalive failed; the session may still be alive on the arbiter.
     * Finish the unit of work in hand, start no new one.
     */
    DEGRADED,
    /**
     * The local deadline passed, or the arbiter said the session is gone.
     * Every hold of the session must be treated as lost.
     */
    LOST
}
