package dev.holdfast.client;

import java.time.Duration;
import java.util.List;

/** The README's example, kept compiling (never run here: it needs an arbiter). */
final class ReadmeExample {
    private ReadmeExample() {}

    static void stopActingOn(List<Key> keys) {}

    static void writeWithFence(long token) {}

    static void example() {
        try (Locker locker = new Locker(Config.fromEnv(), fenced -> stopActingOn(fenced.keys())); // required
             Lock lock = locker.acquire(Key.parse("payments/ledger-7"), AcquireOptions.DEFAULT.withWait(Duration.ofSeconds(30)))) {
            while (lock.canStart() && lock.remainingTtl().compareTo(Duration.ofSeconds(2)) > 0)
                writeWithFence(lock.token().expose()); // one unit of work; the resource rejects lower tokens
        } // releases the lock, then closes the Locker's sessions
    }
}
