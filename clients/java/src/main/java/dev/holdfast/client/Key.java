package dev.holdfast.client;

import io.grpc.Status;
import java.nio.charset.StandardCharsets;
import lock.v1.LockOuterClass.ErrorReason;

/**
 * A lock key: a namespace (its class decides TTL and tier) and a path inside
 * it. Validated as the arbiter validates it, so a bad key is refused before
 * any call, with a {@link HoldfastException} of reason
 * {@code ERROR_REASON_INVALID_ARGUMENT} whose field is {@code namespace} or
 * {@code key}.
 */
public final class Key {
    /** The longest namespace, in bytes. */
    public static final int MAX_NAMESPACE_LEN = 63;
    /** The longest path, in bytes. */
    public static final int MAX_KEY_LEN = 512;

    private final String namespace;
    private final String path;

    private Key(String namespace, String path) {
        this.namespace = namespace;
        this.path = path;
    }

    /**
     * Validates namespace and path.
     *
     * @param namespace the namespace, e.g. {@code payments}
     * @param path the path inside it, e.g. {@code ledger-7}
     * @return the key
     * @throws HoldfastException (INVALID_ARGUMENT) when either is refused
     */
    public static Key of(String namespace, String path) {
        validateNamespace(namespace);
        validatePath(path);
        return new Key(namespace, path);
    }

    /**
     * Parses {@code NAMESPACE/KEY}: everything up to the first '/' is the
     * namespace.
     *
     * @param text e.g. {@code payments/ledger-7}
     * @return the key
     * @throws HoldfastException (INVALID_ARGUMENT) when it is refused
     */
    public static Key parse(String text) {
        int slash = text.indexOf('/');
        if (slash < 0) {
            throw invalid("key", quote(text) + " has no namespace; write it as NAMESPACE/KEY, e.g. payments/ledger-7");
        }
        return of(text.substring(0, slash), text.substring(slash + 1));
    }

    /** @return the namespace */
    public String namespace() {
        return namespace;
    }

    /** @return the path inside the namespace */
    public String path() {
        return path;
    }

    /** @return {@code namespace/path} */
    @Override
    public String toString() {
        return namespace + "/" + path;
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof Key k && k.namespace.equals(namespace) && k.path.equals(path);
    }

    @Override
    public int hashCode() {
        return namespace.hashCode() * 31 + path.hashCode();
    }

    static HoldfastException invalid(String field, String message) {
        return new HoldfastException(
                Status.Code.INVALID_ARGUMENT, ErrorReason.ERROR_REASON_INVALID_ARGUMENT, field, field + ": " + message, null);
    }

    /** Go's %q for the strings a key check quotes: ASCII with escapes. */
    static String quote(String s) {
        StringBuilder b = new StringBuilder("\"");
        s.codePoints().forEach(c -> appendQuoted(b, c, '"'));
        return b.append('"').toString();
    }

    private static void appendQuoted(StringBuilder b, int c, char quote) {
        switch (c) {
            case '\\' -> b.append("\\\\");
            case '\n' -> b.append("\\n");
            case '\t' -> b.append("\\t");
            case '\r' -> b.append("\\r");
            default -> {
                if (c == quote) {
                    b.append('\\').append((char) c);
                } else if (c >= 0x20 && c < 0x7f || c > 0x7f && Character.isLetterOrDigit(c)) {
                    b.appendCodePoint(c);
                } else if (c < 0x10000) {
                    b.append(c < 0x80 ? String.format("\\x%02x", c) : String.format("\\u%04x", c));
                } else {
                    b.append(String.format("\\U%08x", c));
                }
            }
        }
    }

    private static void validateNamespace(String ns) {
        int len = ns.getBytes(StandardCharsets.UTF_8).length;
        if (ns.isEmpty()) {
            throw invalid("namespace", "is empty; every key lives in a namespace such as \"payments\"");
        }
        if (len > MAX_NAMESPACE_LEN) {
            throw invalid("namespace", "is " + len + " bytes; the limit is " + MAX_NAMESPACE_LEN);
        }
        for (int i = 0; i < ns.length(); i++) {
            char c = ns.charAt(i);
            if (!(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-')) {
                throw invalid("namespace", quote(ns) + " may contain only a-z, 0-9 and '-'");
            }
        }
        if (ns.startsWith("-") || ns.endsWith("-")) {
            throw invalid("namespace", quote(ns) + " may not start or end with '-'");
        }
    }

    private static void validatePath(String key) {
        int len = key.getBytes(StandardCharsets.UTF_8).length;
        if (key.isEmpty()) {
            throw invalid("key", "is empty; name the resource the lock guards, e.g. \"ledger-7\"");
        }
        if (len > MAX_KEY_LEN) {
            throw invalid("key", "is " + len + " bytes; the limit is " + MAX_KEY_LEN);
        }
        for (int i = 0; i < key.length(); ) {
            int c = key.codePointAt(i);
            if (c <= ' ' || c > '~') {
                StringBuilder q = new StringBuilder("'");
                appendQuoted(q, c, '\'');
                throw invalid("key", "contains " + q.append('\'') + "; only visible ASCII characters are allowed");
            }
            i += Character.charCount(c);
        }
        if (key.startsWith("/") || key.endsWith("/")) {
            throw invalid("key", "may not start or end with '/'");
        }
        for (String seg : key.split("/", -1)) {
            if (seg.isEmpty()) {
                throw invalid("key", "contains an empty path segment (\"//\")");
            }
            if (seg.equals(".") || seg.equals("..")) {
                throw invalid("key", "contains a " + quote(seg) + " path segment, which could leave the namespace");
            }
        }
    }
}
