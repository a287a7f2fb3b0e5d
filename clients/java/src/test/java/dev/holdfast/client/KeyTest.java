package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertThrows;

import lock.v1.LockOuterClass.ErrorReason;
import org.junit.jupiter.api.Test;

class KeyTest {
    @Test
    void parsesAtTheFirstSlash() {
        Key k = Key.parse("jobs/nightly/report");
        assertEquals("jobs", k.namespace());
        assertEquals("nightly/report", k.path());
        assertEquals("jobs/nightly/report", k.toString());
        assertEquals(Key.of("jobs", "nightly/report"), k);
    }

    private static HoldfastException refused(String text, String field) {
        HoldfastException e = assertThrows(HoldfastException.class, () -> Key.parse(text));
        assertEquals(field, e.field());
        assertEquals(ErrorReason.ERROR_REASON_INVALID_ARGUMENT, e.reason());
        assertEquals(io.grpc.Status.Code.INVALID_ARGUMENT, e.code());
        return e;
    }

    // The messages are the Go client's (clients/go/key.go), word for word.
    @Test
    void refusesAsTheGoClientDoes() {
        assertEquals("key: \"payments\" has no namespace; write it as NAMESPACE/KEY, e.g. payments/ledger-7",
                refused("payments", "key").getMessage());
        assertEquals("namespace: is empty; every key lives in a namespace such as \"payments\"",
                refused("/x", "namespace").getMessage());
        assertEquals("namespace: \"Pay\" may contain only a-z, 0-9 and '-'", refused("Pay/x", "namespace").getMessage());
        assertEquals("namespace: \"-pay\" may not start or end with '-'", refused("-pay/x", "namespace").getMessage());
        assertEquals("namespace: is 64 bytes; the limit is 63", refused("a".repeat(64) + "/k", "namespace").getMessage());
        assertEquals("key: is empty; name the resource the lock guards, e.g. \"ledger-7\"",
                refused("ns/", "key").getMessage());
        assertEquals("key: is 513 bytes; the limit is 512", refused("ns/" + "k".repeat(513), "key").getMessage());
        assertEquals("key: contains ' '; only visible ASCII characters are allowed", refused("ns/a b", "key").getMessage());
        assertEquals("key: contains '\\t'; only visible ASCII characters are allowed", refused("ns/a\tb", "key").getMessage());
        assertEquals("key: contains 'é'; only visible ASCII characters are allowed", refused("ns/café", "key").getMessage());
        assertEquals("key: may not start or end with '/'", refused("ns/a/", "key").getMessage());
        assertEquals("key: contains an empty path segment (\"//\")", refused("ns/a//b", "key").getMessage());
        assertEquals("key: contains a \"..\" path segment, which could leave the namespace",
                refused("ns/a/../b", "key").getMessage());
        assertEquals("key: contains a \".\" path segment, which could leave the namespace",
                refused("ns/./a", "key").getMessage());
    }

    @Test
    void acceptsTheLimits() {
        assertEquals(63, Key.parse("a".repeat(63) + "/k").namespace().length());
        assertEquals(512, Key.parse("n/" + "k".repeat(512)).path().length());
        assertEquals("..x", Key.parse("ns/..x").path());
    }
}
