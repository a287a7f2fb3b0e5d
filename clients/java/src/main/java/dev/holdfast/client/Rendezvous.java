package dev.holdfast.client;

import java.nio.charset.StandardCharsets;
import java.util.ArrayList;
import java.util.List;

/**
 * Key-affine arbiter choice: rendezvous (highest-random-weight) hashing of a
 * lock key over the configured endpoints, identical to the Rust, Go and
 * Python clients (FNV-1a with a SplitMix64 finaliser, ties broken by index),
 * so clients in every language send a key to the same arbiter.
 */
public final class Rendezvous {
    private static final long FNV_OFFSET = 0xcbf29ce484222325L;
    private static final long FNV_PRIME = 0x00000100000001b3L;

    private Rendezvous() {}

    private static long fnv1a(long h, byte[] bytes) {
        for (byte b : bytes) {
            h ^= b & 0xffL;
            h *= FNV_PRIME;
        }
        return h;
    }

    private static long mix(long z) {
        z = (z ^ (z >>> 30)) * 0xbf58476d1ce4e5b9L;
        z = (z ^ (z >>> 27)) * 0x94d049bb133111ebL;
        return z ^ (z >>> 31);
    }

    /**
     * The weight of endpoint for key.
     *
     * @param endpoint an endpoint as configured
     * @param key the routing key (a lock key's text)
     * @return the score, an unsigned 64-bit number (compare with
     *     {@link Long#compareUnsigned})
     */
    public static long score(String endpoint, String key) {
        long h = fnv1a(FNV_OFFSET, endpoint.getBytes(StandardCharsets.UTF_8));
        return mix(fnv1a(h ^ 0xff, key.getBytes(StandardCharsets.UTF_8)));
    }

    /**
     * The endpoint indexes in the order to try for key, best first.
     *
     * @param key the routing key
     * @param endpoints every endpoint
     * @return indexes into endpoints, best first
     */
    public static List<Integer> ranked(String key, List<String> endpoints) {
        long[] scores = new long[endpoints.size()];
        List<Integer> order = new ArrayList<>(endpoints.size());
        for (int i = 0; i < scores.length; i++) {
            scores[i] = score(endpoints.get(i), key);
            order.add(i);
        }
        order.sort((a, b) -> {
            int byScore = Long.compareUnsigned(scores[b], scores[a]);
            return byScore != 0 ? byScore : Integer.compare(a, b);
        });
        return order;
    }
}
