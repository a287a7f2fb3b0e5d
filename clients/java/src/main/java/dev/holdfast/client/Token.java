package dev.holdfast.client;

/**
 * A fencing token, {@code epoch << 48 | revision}: a capability. Whoever
 * presents it can write to a fenced resource, so it never prints:
 * {@link #toString()} is {@code <redacted token>}. Call {@link #expose()} at
 * the single place where the token is handed to the resource.
 *
 * <p>The token of an unprotected (fail-open) grant is 0, below every token an
 * arbiter mints, so a fenced resource refuses it.
 */
public final class Token {
    static final int REVISION_BITS = 48;
    static final long MAX_EPOCH = (1L << 15) - 1;
    static final long MAX_REVISION = (1L << REVISION_BITS) - 1;
    static final String REDACTED = "<redacted token>";

    /** The token of an unprotected grant. */
    static final Token UNPROTECTED = new Token(0);

    private final long value;

    private Token(long value) {
        this.value = value;
    }

    /**
     * Reads a protected token as it travels on the wire, refusing values no
     * arbiter could have minted (epoch 1..32767, revision 1..2^48-1). 0 is
     * refused too: the token of an unprotected grant comes only from the
     * grant's unprotected flag ({@link #fromGrant}).
     *
     * @param wire the packed value (an unsigned 64-bit number)
     * @return the token
     * @throws HoldfastConfigException when no arbiter could have minted it
     */
    public static Token fromWire(long wire) {
        return minted(wire);
    }

    /**
     * The token of a grant: the unprotected token (0) when the grant says it
     * is unprotected, whatever its token field holds; otherwise the value
     * read as {@link #fromWire} reads it.
     *
     * @param wire the grant's token field
     * @param unprotected the grant's unprotected flag
     * @return the token
     * @throws HoldfastConfigException when a protected grant carries a value
     *     no arbiter could have minted
     */
    public static Token fromGrant(long wire, boolean unprotected) {
        return unprotected ? UNPROTECTED : minted(wire);
    }

    private static Token minted(long wire) {
        long epoch = wire >>> REVISION_BITS;
        long revision = wire & MAX_REVISION;
        if (epoch == 0 || epoch > MAX_EPOCH) {
            throw new HoldfastConfigException(
                    "the arbiter returned a malformed token (epoch " + epoch + " is out of range 1..=" + MAX_EPOCH + ")");
        }
        if (revision == 0) {
            throw new HoldfastConfigException("the arbiter returned a malformed token (revision 0)");
        }
        return new Token(wire);
    }

    /**
     * The packed value, for the wire and the resource's fence column (an
     * unsigned 64-bit number; it fits a signed {@code long} as every epoch is
     * below 2^15). Never log or print what it returns.
     *
     * @return the token's value
     */
    public long expose() {
        return value;
    }

    /**
     * The epoch the grant was made in (diagnostics only).
     *
     * @return the epoch, 0 for an unprotected grant
     */
    public int epoch() {
        return (int) (value >>> REVISION_BITS);
    }

    /**
     * The etcd revision of the grant (diagnostics only).
     *
     * @return the revision, 0 for an unprotected grant
     */
    public long revision() {
        return value & MAX_REVISION;
    }

    /**
     * Whether this is the token of an unprotected grant: 0, which a fenced
     * resource refuses.
     *
     * @return true for an unprotected grant's token
     */
    public boolean unprotected() {
        return value == 0;
    }

    @Override
    public boolean equals(Object other) {
        return other instanceof Token t && t.value == value;
    }

    @Override
    public int hashCode() {
        return Long.hashCode(value);
    }

    /** Always {@code <redacted token>}: the value never prints. */
    @Override
    public String toString() {
        return REDACTED;
    }
}
