package dev.holdfast.client;

import static org.junit.jupiter.api.Assertions.assertEquals;
import static org.junit.jupiter.api.Assertions.assertFalse;
import static org.junit.jupiter.api.Assertions.assertTrue;

import com.google.protobuf.Any;
import com.google.rpc.RetryInfo;
import io.grpc.Status;
import io.grpc.protobuf.StatusProto;
import java.time.Duration;
import lock.v1.LockOuterClass.ErrorDetail;
import lock.v1.LockOuterClass.ErrorReason;
import org.junit.jupiter.api.Test;

class ErrorsTest {
    private static com.google.rpc.Status status(Status.Code code, String message, ErrorReason reason, String field) {
        return com.google.rpc.Status.newBuilder()
                .setCode(code.value())
                .setMessage(message)
                .addDetails(Any.pack(ErrorDetail.newBuilder().setReason(reason).setField(field).build(), "type.googleapis.com"))
                .build();
    }

    @Test
    void decodesTheDetailThroughTheTrailer() {
        com.google.rpc.Status st = status(Status.Code.ABORTED, "jobs/x is held", ErrorReason.ERROR_REASON_CONTENTION, "");
        HoldfastException e = HoldfastException.from(StatusProto.toStatusRuntimeException(st));
        assertEquals(Status.Code.ABORTED, e.code());
        assertEquals(ErrorReason.ERROR_REASON_CONTENTION, e.reason());
        assertTrue(e.is(ErrorReason.ERROR_REASON_CONTENTION));
        assertFalse(e.is(ErrorReason.ERROR_REASON_LEAK));
        assertEquals("jobs/x is held", e.getMessage());
        assertTrue(e.retryAfter().isEmpty());
    }

    @Test
    void namesTheFieldAndTheRetryAfter() {
        com.google.rpc.Status st = status(Status.Code.INVALID_ARGUMENT, "key: bad", ErrorReason.ERROR_REASON_INVALID_ARGUMENT, "key")
                .toBuilder()
                .addDetails(Any.pack(RetryInfo.newBuilder()
                        .setRetryDelay(com.google.protobuf.Duration.newBuilder().setSeconds(1).setNanos(500_000_000))
                        .build()))
                .build();
        HoldfastException e = HoldfastException.from(StatusProto.toStatusRuntimeException(st));
        assertEquals("key", e.field());
        assertEquals(Duration.ofMillis(1500), e.retryAfter().orElseThrow());
    }

    @Test
    void aBrokenConnectionIsUnavailableAndAnUnknownStatusFromTheArbiterIsNot() {
        HoldfastException broken = HoldfastException.from(
                Status.UNKNOWN.withDescription("channel closed").withCause(new java.nio.channels.ClosedChannelException()).asRuntimeException());
        assertTrue(broken.unavailable(), broken.toString());
        HoldfastException sent = HoldfastException.from(Status.UNKNOWN.withDescription("the arbiter said so").asRuntimeException());
        assertFalse(sent.unavailable(), sent.toString());
    }

    @Test
    void fallsBackByCode() {
        assertEquals(ErrorReason.ERROR_REASON_UNAVAILABLE, HoldfastException.from(Status.UNAVAILABLE.asRuntimeException()).reason());
        assertEquals(ErrorReason.ERROR_REASON_UNAVAILABLE, HoldfastException.from(Status.DEADLINE_EXCEEDED.asRuntimeException()).reason());
        assertEquals(ErrorReason.ERROR_REASON_UNAVAILABLE, HoldfastException.from(Status.CANCELLED.asRuntimeException()).reason());
        assertEquals(ErrorReason.ERROR_REASON_UNAUTHENTICATED, HoldfastException.from(Status.UNAUTHENTICATED.asRuntimeException()).reason());
        assertEquals(ErrorReason.ERROR_REASON_DENIED, HoldfastException.from(Status.PERMISSION_DENIED.asRuntimeException()).reason());
        assertEquals(ErrorReason.ERROR_REASON_INVALID_ARGUMENT, HoldfastException.from(Status.INVALID_ARGUMENT.asRuntimeException()).reason());
        HoldfastException internal = HoldfastException.from(Status.INTERNAL.asRuntimeException());
        assertEquals(ErrorReason.ERROR_REASON_UNSPECIFIED, internal.reason());
        assertFalse(internal.is(ErrorReason.ERROR_REASON_UNSPECIFIED));
        // An empty message becomes the code's name.
        assertEquals("INTERNAL", internal.getMessage());
    }

    @Test
    void aThrowableWithoutAStatusIsUnknown() {
        HoldfastException e = HoldfastException.from(new IllegalStateException("boom"));
        assertEquals(Status.Code.UNKNOWN, e.code());
        assertEquals(ErrorReason.ERROR_REASON_UNSPECIFIED, e.reason());
    }

    @Test
    void aLostSessionIsSessionNotFound() {
        HoldfastException e = HoldfastException.lost();
        assertEquals(Status.Code.FAILED_PRECONDITION, e.code());
        assertTrue(e.is(ErrorReason.ERROR_REASON_SESSION_NOT_FOUND));
    }
}
