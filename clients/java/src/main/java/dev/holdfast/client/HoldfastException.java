package dev.holdfast.client;

import com.google.protobuf.Any;
import com.google.protobuf.InvalidProtocolBufferException;
import com.google.rpc.RetryInfo;
import io.grpc.Status;
import io.grpc.StatusException;
import io.grpc.StatusRuntimeException;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import java.util.Optional;
import lock.v1.LockOuterClass.ErrorDetail;
import lock.v1.LockOuterClass.ErrorReason;

/**
 * A refusal by the arbiter (or a transport failure, with reason
 * {@code ERROR_REASON_UNAVAILABLE}). Branch on {@link #reason()}, never on
 * the message text.
 *
 * <p>The reason is decoded from the {@code lock.v1.ErrorDetail} inside the
 * {@code google.rpc.Status} of the {@code grpc-status-details-bin} trailer.
 * Without one, it follows the code, as in the Rust, Go and Python clients:
 * UNAVAILABLE, DEADLINE_EXCEEDED and CANCELLED are
 * {@code ERROR_REASON_UNAVAILABLE}; UNAUTHENTICATED, PERMISSION_DENIED and
 * INVALID_ARGUMENT their own reasons; any other code
 * {@code ERROR_REASON_UNSPECIFIED}.
 */
public class HoldfastException extends RuntimeException {
    private static final long serialVersionUID = 1L;

    /** The type URL of lock.v1.ErrorDetail inside the google.rpc.Status of a refusal. */
    public static final String ERROR_DETAIL_TYPE_URL = "type.googleapis.com/lock.v1.ErrorDetail";

    /** The gRPC status code. */
    private final Status.Code code;
    /** The typed reason. */
    private final ErrorReason reason;
    /** The refused request field, or "". */
    private final String field;
    /** The RetryInfo delay, or null. */
    private final Duration retryAfter;

    /**
     * @param code the gRPC status code
     * @param reason the typed reason
     * @param field for INVALID_ARGUMENT, the refused request field ("" otherwise)
     * @param message the status message
     * @param retryAfter how long to wait before retrying, or null
     */
    public HoldfastException(Status.Code code, ErrorReason reason, String field, String message, Duration retryAfter) {
        super(message);
        this.code = code;
        this.reason = reason;
        this.field = field == null ? "" : field;
        this.retryAfter = retryAfter;
    }

    /** @return the gRPC status code */
    public Status.Code code() {
        return code;
    }

    /**
     * @return the typed reason; {@code ERROR_REASON_UNSPECIFIED} when the
     *     status carried none and its code maps to none
     */
    public ErrorReason reason() {
        return reason;
    }

    /** @return for INVALID_ARGUMENT, the request field that was refused; "" otherwise */
    public String field() {
        return field;
    }

    /** @return how long to wait before retrying, when the status carried a google.rpc.RetryInfo */
    public Optional<Duration> retryAfter() {
        return Optional.ofNullable(retryAfter);
    }

    /**
     * Whether this refusal has the given reason.
     *
     * @param r a reason
     * @return true when {@link #reason()} is r (never for UNSPECIFIED)
     */
    public boolean is(ErrorReason r) {
        return reason != ErrorReason.ERROR_REASON_UNSPECIFIED && reason == r;
    }

    @Override
    public String toString() {
        return "HoldfastException{code=" + code + ", reason=" + reason + ", field=" + field + ", message=" + getMessage() + "}";
    }

    /**
     * The typed error of a failed gRPC call. A HoldfastException is returned
     * as is; a throwable that carries no gRPC status counts as UNKNOWN.
     *
     * @param t what a generated stub threw (or passed to onError)
     * @return the typed error
     */
    public static HoldfastException from(Throwable t) {
        if (t instanceof HoldfastException h) {
            return h;
        }
        Status status = Status.fromThrowable(t);
        com.google.rpc.Status proto = null;
        boolean fromCall = t instanceof StatusRuntimeException || t instanceof StatusException
                || t.getCause() instanceof StatusRuntimeException || t.getCause() instanceof StatusException;
        if (fromCall) {
            try {
                proto = StatusProto.fromThrowable(t);
            } catch (RuntimeException malformed) {
                // A malformed trailer: fall back on the code.
                proto = null;
            }
        }
        HoldfastException e;
        if (fromCall && status.getCode() == Status.Code.UNKNOWN && status.getCause() != null
                && (proto == null || proto.getDetailsCount() == 0)) {
            // grpc-java's own status for a connection that broke under the
            // call ("channel closed") carries the transport's exception as
            // its cause; a status the arbiter sent has none (a cause never
            // crosses the wire), and a throwable that is no call's status
            // stays unknown.
            String message = status.getDescription() == null ? "UNKNOWN" : status.getDescription();
            e = new HoldfastException(Status.Code.UNKNOWN, ErrorReason.ERROR_REASON_UNAVAILABLE, "", message, null);
        } else {
            e = fromStatus(status.getCode(), status.getDescription(), proto);
        }
        e.initCause(t);
        return e;
    }

    /**
     * The typed error for a status code, its message and the decoded
     * {@code grpc-status-details-bin} trailer.
     *
     * @param code the status code
     * @param message the status message (the code's name when empty)
     * @param details the google.rpc.Status of the trailer, or null
     * @return the typed error
     */
    public static HoldfastException fromStatus(Status.Code code, String message, com.google.rpc.Status details) {
        if (message == null || message.isEmpty()) {
            message = code.name();
        }
        ErrorReason reason = ErrorReason.ERROR_REASON_UNSPECIFIED;
        String field = "";
        Duration retryAfter = null;
        boolean found = false;
        if (details != null) {
            for (Any any : details.getDetailsList()) {
                if (any.getTypeUrl().equals(ERROR_DETAIL_TYPE_URL)) {
                    if (found) {
                        continue;
                    }
                    try {
                        ErrorDetail d = ErrorDetail.parseFrom(any.getValue());
                        ErrorReason r = d.getReason();
                        if (r != ErrorReason.ERROR_REASON_UNSPECIFIED && r != ErrorReason.UNRECOGNIZED) {
                            reason = r;
                            field = d.getField();
                            found = true;
                        }
                    } catch (InvalidProtocolBufferException ignored) {
                        // An undecodable detail: fall back on the code.
                    }
                } else if (any.is(RetryInfo.class)) {
                    try {
                        RetryInfo ri = any.unpack(RetryInfo.class);
                        if (ri.hasRetryDelay()) {
                            retryAfter = Duration.ofSeconds(ri.getRetryDelay().getSeconds(), ri.getRetryDelay().getNanos());
                        }
                    } catch (InvalidProtocolBufferException ignored) {
                        // An undecodable RetryInfo: no retry-after.
                    }
                }
            }
        }
        if (!found) {
            reason = switch (code) {
                case UNAVAILABLE, DEADLINE_EXCEEDED, CANCELLED -> ErrorReason.ERROR_REASON_UNAVAILABLE;
                case UNAUTHENTICATED -> ErrorReason.ERROR_REASON_UNAUTHENTICATED;
                case PERMISSION_DENIED -> ErrorReason.ERROR_REASON_DENIED;
                case INVALID_ARGUMENT -> ErrorReason.ERROR_REASON_INVALID_ARGUMENT;
                default -> ErrorReason.ERROR_REASON_UNSPECIFIED;
            };
        }
        return new HoldfastException(code, reason, field, message, retryAfter);
    }

    /** What a call on a lost session throws (as the Rust and Go clients). */
    static HoldfastException lost() {
        return new HoldfastException(Status.Code.FAILED_PRECONDITION, ErrorReason.ERROR_REASON_SESSION_NOT_FOUND, "",
                "the session is lost (its local deadline passed); open a new session", null);
    }

    boolean unavailable() {
        return reason == ErrorReason.ERROR_REASON_UNAVAILABLE;
    }
}
