package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;

import java.time.Duration;
import org.junit.jupiter.api.Test;

class DeadlineTest {
    @Test
    void theDeadlineIsTheSendTimePlusTtlLessTheMargin() {
        long sent = 123_456_789L;
        assertEquals(sent + Duration.ofSeconds(9).toNanos(), Session.fenceDeadline(sent, Duration.ofSeconds(10)));
        // A TTL at or below the margin: the deadline is the send time itself.
        assertEquals(sent, Session.fenceDeadline(sent, Duration.ofSeconds(1)));
        assertEquals(sent, Session.fenceDeadline(sent, Duration.ofMillis(500)));
        // nanoTime readings may be negative; only differences matter.
        assertEquals(-5 + Duration.ofMillis(200).toNanos(), Session.fenceDeadline(-5, Duration.ofMillis(1200)));
        assertEquals(Duration.ofSeconds(1), Locker.FENCE_MARGIN);
    }

    @Test
    void keepalivesComeEveryThirdOfTheTtlAtLeastHalfASecond() {
        assertEquals(Duration.ofNanos(3_333_333_333L), Session.keepalivePeriod(Duration.ofSeconds(10)));
        assertEquals(Duration.ofMillis(500), Session.keepalivePeriod(Duration.ofSeconds(1)));
        assertEquals(Duration.ofMillis(500), Session.keepalivePeriod(Duration.ofMillis(1500)));
        assertEquals(Duration.ofSeconds(100), Session.keepalivePeriod(Duration.ofMinutes(5)));
    }
}
