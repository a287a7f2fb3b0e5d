package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertThrows;
import static org.junit.jupiter.api.Assertions.assertTrue;
import static org.junit.jupiter.api.Assertions.fail;

import com.google.gson.JsonArray;
import com.google.gson.JsonElement;
import com.google.gson.JsonObject;
import com.google.gson.JsonParser;
import io.grpc.Status;
import java.io.IOException;
import java.nio.file.Files;
import java.nio.file.Path;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Base64;
import java.util.List;
import lock.v1.LockOuterClass.ErrorReason;
import org.junit.jupiter.api.BeforeAll;
import org.junit.jupiter.api.Test;

/**
 * The language-neutral vectors of clients/conformance/vectors.json, which the
 * Rust, Go and Python clients check too: every entry of every section. The
 * file is HOLDFAST_VECTORS when set, else ../conformance/vectors.json.
 */
class VectorsTest {
    private static JsonObject vectors;

    @BeforeAll
    static void load() throws IOException {
        String override = System.getenv("HOLDFAST_VECTORS");
        Path path;
        if (override != null && !override.isEmpty()) {
            path = Path.of(override);
        } else if (System.getenv("HOLDFAST_VECTORS_DEFAULT") != null) {
            path = Path.of(System.getenv("HOLDFAST_VECTORS_DEFAULT"));
        } else {
            path = Path.of("../conformance/vectors.json");
        }
        vectors = JsonParser.parseString(Files.readString(path)).getAsJsonObject();
    }

    private static List<JsonObject> section(String name) {
        JsonElement s = vectors.get(name);
        if (s == null || !s.isJsonArray() || s.getAsJsonArray().isEmpty()) {
            fail("vectors.json has no entries in \"" + name + "\"");
        }
        List<JsonObject> out = new ArrayList<>();
        for (JsonElement e : s.getAsJsonArray()) {
            out.add(e.getAsJsonObject());
        }
        return out;
    }

    private static boolean flag(JsonObject o, String name) {
        return o.has(name) && o.get(name).getAsBoolean();
    }

    private static String str(JsonObject o, String name) {
        return o.has(name) && !o.get(name).isJsonNull() ? o.get(name).getAsString() : "";
    }

    @Test
    void tokens() {
        for (JsonObject v : section("tokens")) {
            String name = str(v, "name");
            long wire = Long.parseUnsignedLong(str(v, "wire"));
            if (flag(v, "malformed")) {
                assertThrows(HoldfastConfigException.class, () -> Token.fromWire(wire), name);
                assertThrows(HoldfastConfigException.class, () -> Token.fromGrant(wire, false), name);
                continue;
            }
            Token t;
            if (flag(v, "unprotected")) {
                // Never a token on the wire: only a fail-open grant's flag makes it.
                assertThrows(HoldfastConfigException.class, () -> Token.fromWire(wire), name);
                t = Token.fromGrant(wire, true);
            } else {
                t = Token.fromWire(wire);
                assertEquals(t, Token.fromGrant(wire, false), name);
            }
            assertEquals(v.get("epoch").getAsLong(), t.epoch(), name);
            assertEquals(v.get("revision").getAsLong(), t.revision(), name);
            assertEquals(flag(v, "unprotected"), t.unprotected(), name);
            assertEquals(str(v, "wire"), Long.toUnsignedString(t.expose()), name);
            assertEquals("<redacted token>", t.toString(), name);
        }
    }

    @Test
    void keys() {
        for (JsonObject v : section("keys")) {
            String text = str(v, "text");
            if (v.has("invalid_field")) {
                HoldfastException e = assertThrows(HoldfastException.class, () -> Key.parse(text), text);
                assertEquals(str(v, "invalid_field"), e.field(), text);
                assertEquals(ErrorReason.ERROR_REASON_INVALID_ARGUMENT, e.reason(), text);
                assertEquals(Status.Code.INVALID_ARGUMENT, e.code(), text);
                continue;
            }
            Key k = Key.parse(text);
            assertEquals(str(v, "namespace"), k.namespace(), text);
            assertEquals(str(v, "path"), k.path(), text);
            assertEquals(text, k.toString(), text);
        }
    }

    @Test
    void rendezvous() {
        for (JsonObject v : section("rendezvous")) {
            String key = str(v, "key");
            List<String> endpoints = new ArrayList<>();
            v.getAsJsonArray("endpoints").forEach(e -> endpoints.add(e.getAsString()));
            JsonArray scores = v.getAsJsonArray("scores");
            assertEquals(endpoints.size(), scores.size(), key);
            for (int i = 0; i < endpoints.size(); i++) {
                assertEquals(scores.get(i).getAsString(), Long.toUnsignedString(Rendezvous.score(endpoints.get(i), key)),
                        key + " on " + endpoints.get(i));
            }
            List<Integer> ranked = new ArrayList<>();
            v.getAsJsonArray("ranked").forEach(e -> ranked.add(e.getAsInt()));
            assertEquals(ranked, Rendezvous.ranked(key, endpoints), key + " over " + endpoints);
        }
    }

    @Test
    void errorDetails() throws Exception {
        for (JsonObject v : section("error_details")) {
            String name = str(v, "name");
            Status.Code code = Status.fromCodeValue(v.get("code").getAsInt()).getCode();
            String bin = str(v, "status_details_bin");
            com.google.rpc.Status details = bin.isEmpty() ? null : com.google.rpc.Status.parseFrom(Base64.getDecoder().decode(bin));
            HoldfastException direct = HoldfastException.fromStatus(code, str(v, "message"), details);
            // And as grpc-java hands it over: the status with its trailer.
            HoldfastException viaTrailer = HoldfastException.from(details == null
                    ? Status.fromCode(code).withDescription(str(v, "message")).asRuntimeException()
                    : io.grpc.protobuf.StatusProto.toStatusRuntimeException(details));
            for (HoldfastException e : List.of(direct, viaTrailer)) {
                assertEquals(code, e.code(), name);
                assertEquals(ErrorReason.valueOf(str(v, "reason")), e.reason(), name);
                assertEquals(str(v, "field"), e.field(), name);
                assertEquals(str(v, "message"), e.getMessage(), name);
                long retry = v.get("retry_after_ms").getAsLong();
                if (retry == 0) {
                    assertTrue(e.retryAfter().isEmpty() || e.retryAfter().get().isZero(), name);
                } else {
                    assertEquals(Duration.ofMillis(retry), e.retryAfter().orElseThrow(), name);
                }
            }
        }
    }

    @Test
    void deadlines() {
        for (JsonObject v : section("deadlines")) {
            Duration ttl = Duration.ofMillis(v.get("ttl_ms").getAsLong());
            long sentAt = Duration.ofMillis(v.get("sent_at_ms").getAsLong()).toNanos();
            String name = "TTL " + ttl + " sent at " + v.get("sent_at_ms");
            assertEquals(Duration.ofMillis(v.get("deadline_ms").getAsLong()).toNanos(), Session.fenceDeadline(sentAt, ttl), name);
            assertEquals(v.get("keepalive_period_ms").getAsLong(), Session.keepalivePeriod(ttl).toMillis(), name);
        }
    }

    @Test
    void everySectionIsKnown() {
        for (String name : vectors.keySet()) {
            if (vectors.get(name).isJsonArray()) {
                assertTrue(List.of("tokens", "keys", "rendezvous", "error_details", "deadlines").contains(name),
                        "a section this client does not check: " + name);
            }
        }
        assertFalse(vectors.keySet().isEmpty());
    }
}
