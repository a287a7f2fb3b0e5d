package dev.holdfast.client;

/**
 * A bad or unreadable client configuration (no endpoint, unreadable
 * certificate, malformed endpoint, a missing fence listener), or a value no
 * arbiter could have sent (a malformed token). Not a refusal by the arbiter:
 * those are {@link HoldfastException}.
 */
public class HoldfastConfigException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /**
     * @param message what is wrong and how to fix it
     */
    public HoldfastConfigException(String message) {
        super(message);
    }

    /**
     * @param message what is wrong and how to fix it
     * @param cause the underlying failure
     */
    public HoldfastConfigException(String message, Throwable cause) {
        super(message, cause);
    }
}
