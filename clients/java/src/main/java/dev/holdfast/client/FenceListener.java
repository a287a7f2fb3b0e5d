package dev.holdfast.client;

/**
 * How the library tells the application to stop acting on its keys: called
 * from a thread of the library, once per lost session that held keys, at the
 * session's local deadline (the send time of its last confirmed keepalive +
 * TTL − {@link Locker#FENCE_MARGIN}) or when the arbiter says the session is
 * gone. Required by every {@link Locker}.
 */
@FunctionalInterface
public interface FenceListener {
    /**
     * @param fenced the lost session and every key it held
     */
    void onFence(Fenced fenced);
}
