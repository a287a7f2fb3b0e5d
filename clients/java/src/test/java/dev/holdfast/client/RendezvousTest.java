package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertArrayEquals;
import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertNotEquals;

import java.util.ArrayList;
import java.util.List;
import java.util.Map;
import org.junit.jupiter.api.Test;

/** The values of clients/go/affinity_test.go, which come from the Rust client. */
class RendezvousTest {
    @Test
    void scoresMatchTheRustClient() {
        assertEquals("3520212007421997318", Long.toUnsignedString(Rendezvous.score("a:1", "ns/k")));
        assertEquals("5022652680759272974", Long.toUnsignedString(Rendezvous.score("a:2", "ns/k")));
        assertEquals("4724721133488286736", Long.toUnsignedString(Rendezvous.score("10.0.0.0:7420", "orders/0")));
        assertEquals("13714043251751596643",
                Long.toUnsignedString(Rendezvous.score("127.0.0.1:7420", "payments/ledger-7")));
        assertEquals("12377313802105884499", Long.toUnsignedString(Rendezvous.score("", "")));
    }

    private static List<String> eps(int n) {
        List<String> out = new ArrayList<>();
        for (int i = 0; i < n; i++) {
            out.add("10.0.0." + i + ":7420");
        }
        return out;
    }

    @Test
    void rankingMatchesTheRustClient() {
        Map<String, List<Integer>> want = Map.of(
                "orders/0", List.of(1, 2, 0),
                "orders/1", List.of(1, 0, 2),
                "orders/2", List.of(2, 0, 1),
                "payments/ledger-7", List.of(2, 1, 0),
                "session/10000", List.of(2, 1, 0),
                "session/demo", List.of(1, 0, 2));
        want.forEach((key, order) -> assertEquals(order, Rendezvous.ranked(key, eps(3)), key));
        // Equal scores (a duplicated endpoint) rank by index.
        assertEquals(List.of(0, 1, 2), Rendezvous.ranked("k/1", List.of("x:1", "x:1", "y:1")));
    }

    @Test
    void spreadsKeysEvenly() {
        int[] counts = new int[3];
        for (int i = 0; i < 3000; i++) {
            counts[Rendezvous.ranked("orders/" + i, eps(3)).get(0)]++;
        }
        assertArrayEquals(new int[] {998, 980, 1022}, counts);
    }

    @Test
    void removingAnEndpointMovesOnlyItsKeys() {
        List<String> e = eps(4);
        List<String> fewer = List.of(e.get(0), e.get(1), e.get(3));
        for (int i = 0; i < 2000; i++) {
            String k = "k/" + i;
            List<Integer> ranked = Rendezvous.ranked(k, e);
            String before = e.get(ranked.get(0));
            String after = fewer.get(Rendezvous.ranked(k, fewer).get(0));
            if (!before.equals(e.get(2))) {
                assertEquals(before, after, k + " moved although its arbiter stayed");
            } else {
                assertEquals(e.get(ranked.get(1)), after, k + " did not go to its second choice");
            }
        }
    }

    @Test
    void isDeterministicAndSeesTheEndpoint() {
        assertEquals(Rendezvous.score("a:1", "ns/k"), Rendezvous.score("a:1", "ns/k"));
        assertNotEquals(Rendezvous.score("a:1", "ns/k"), Rendezvous.score("a:2", "ns/k"));
    }
}
