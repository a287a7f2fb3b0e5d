package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;

import org.junit.jupiter.api.Test;

class TokenTest {
    @Test
    void packsEpochAndRevision() {
        Token t = Token.fromWire(3L << 48 | 12345);
        assertEquals(3, t.epoch());
        assertEquals(12345, t.revision());
        assertEquals(3L << 48 | 12345, t.expose());
        assertFalse(t.unprotected());
    }

    @Test
    void onlyTheGrantsFlagMakesTheUnprotectedToken() {
        // Never a token on the wire: only a fail-open grant's flag makes it.
        assertThrows(HoldfastConfigException.class, () -> Token.fromWire(0));
        Token t = Token.fromGrant(0, true);
        assertTrue(t.unprotected());
        assertEquals(0, t.epoch());
        assertEquals(0, t.revision());
        assertEquals(0, t.expose());
        assertTrue(Token.fromGrant(1L << 48 | 5, true).unprotected());
        // A grant that does not say it is unprotected must carry a real token.
        assertThrows(HoldfastConfigException.class, () -> Token.fromGrant(0, false));
        assertEquals(1L << 48 | 5, Token.fromGrant(1L << 48 | 5, false).expose());
    }

    @Test
    void refusesValuesNoArbiterMints() {
        assertThrows(HoldfastConfigException.class, () -> Token.fromWire(5));
        assertThrows(HoldfastConfigException.class, () -> Token.fromWire(1L << 48));
        assertThrows(HoldfastConfigException.class, () -> Token.fromWire(-1L));
        assertThrows(HoldfastConfigException.class, () -> Token.fromWire(Long.MIN_VALUE | 1));
        assertEquals(Long.MAX_VALUE, Token.fromWire(Long.MAX_VALUE).expose());
    }

    @Test
    void neverPrints() {
        long v = 7L << 48 | 424242;
        Token t = Token.fromWire(v);
        String out = t + " " + String.valueOf(t) + " " + String.format("%s", t) + " " + java.util.List.of(t);
        assertFalse(out.contains(Long.toString(v)), out);
        assertFalse(out.contains(Long.toHexString(v)), out);
        assertFalse(out.contains("424242"), out);
        assertTrue(out.contains("<redacted token>"), out);
    }

    @Test
    void equalityFollowsTheValue() {
        assertEquals(Token.fromWire(1L << 48 | 9), Token.fromWire(1L << 48 | 9));
        assertFalse(Token.fromWire(1L << 48 | 9).equals(Token.fromWire(1L << 48 | 10)));
    }
}
