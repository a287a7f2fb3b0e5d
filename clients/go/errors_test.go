package holdfast

import (
	"errors"
	"testing"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	spb "google.golang.org/genproto/googleapis/rpc/status"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// refusal builds a status the way the arbiter does (holdfast_proto::refusal):
// a google.rpc.Status with the same code and message whose details hold one
// lock.v1.ErrorDetail.
func refusal(t *testing.T, code codes.Code, reason lockv1.ErrorReason, field, msg string, extra ...*anypb.Any) *status.Status {
	t.Helper()
	detail, err := anypb.New(&lockv1.ErrorDetail{Reason: reason, Field: field})
	if err != nil {
		t.Fatal(err)
	}
	if detail.TypeUrl != ErrorDetailTypeURL {
		t.Fatalf("type URL %q", detail.TypeUrl)
	}
	return status.FromProto(&spb.Status{Code: int32(code), Message: msg, Details: append([]*anypb.Any{detail}, extra...)})
}

func TestEveryReasonHasItsSentinel(t *testing.T) {
	for value, name := range lockv1.ErrorReason_name {
		reason := lockv1.ErrorReason(value)
		if reason == lockv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
			continue
		}
		s, ok := sentinels[reason]
		if !ok {
			t.Errorf("%s has no sentinel", name)
			continue
		}
		err := FromError(refusal(t, codes.FailedPrecondition, reason, "", "m").Err())
		if !errors.Is(err, s) {
			t.Errorf("%s does not match its sentinel", name)
		}
		for other, o := range sentinels {
			if other != reason && errors.Is(err, o) {
				t.Errorf("%s also matches the sentinel of %s", name, other)
			}
		}
	}
}

func TestARefusalIsDecodedFromItsStatusDetails(t *testing.T) {
	err := FromError(refusal(t, codes.NotFound, lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "session_id", "session 3039 does not exist").Err())
	var e *Error
	if !errors.As(err, &e) {
		t.Fatalf("%T %v", err, err)
	}
	if e.Code != codes.NotFound || e.Reason != lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND || e.Field != "session_id" ||
		e.Message != "session 3039 does not exist" || e.RetryAfter != 0 {
		t.Fatalf("%+v", *e)
	}
	if !errors.Is(err, ErrSessionNotFound) || errors.Is(err, ErrContention) || status.Code(err) != codes.NotFound {
		t.Fatalf("errors.Is or status.Code wrong for %v", err)
	}
}

func TestRetryInfoBecomesRetryAfter(t *testing.T) {
	ri, _ := anypb.New(&errdetails.RetryInfo{RetryDelay: durationpb.New(1500 * time.Millisecond)})
	err := FromError(refusal(t, codes.ResourceExhausted, lockv1.ErrorReason_ERROR_REASON_RATE_LIMITED, "", "slow down", ri).Err())
	var e *Error
	if !errors.As(err, &e) || e.RetryAfter != 1500*time.Millisecond || !errors.Is(err, ErrRateLimited) {
		t.Fatalf("%+v", err)
	}
}

func TestWithoutADetailTheCodeDecidesAsInTheRustClient(t *testing.T) {
	for code, want := range map[codes.Code]error{
		codes.Unavailable:      ErrUnavailable,
		codes.DeadlineExceeded: ErrUnavailable,
		codes.Canceled:         ErrUnavailable,
		codes.Unauthenticated:  ErrUnauthenticated,
		codes.PermissionDenied: ErrDenied,
		codes.InvalidArgument:  ErrInvalidArgument,
	} {
		if err := FromError(status.Error(code, "x")); !errors.Is(err, want) {
			t.Errorf("%v: %v is not %v", code, err, want)
		}
	}
	err := FromError(status.Error(codes.Internal, ""))
	var e *Error
	if !errors.As(err, &e) || e.Reason != lockv1.ErrorReason_ERROR_REASON_UNSPECIFIED || e.Message != "Internal" {
		t.Fatalf("%+v", err)
	}
	for _, s := range sentinels {
		if errors.Is(err, s) {
			t.Errorf("an Internal status without a detail matches %v", s)
		}
	}
	// Another service's detail is no reason of ours.
	other, _ := anypb.New(&errdetails.DebugInfo{Detail: "x"})
	st := status.FromProto(&spb.Status{Code: int32(codes.NotFound), Message: "x", Details: []*anypb.Any{other}})
	if e := FromError(st.Err()); reasonOf(e) != lockv1.ErrorReason_ERROR_REASON_UNSPECIFIED {
		t.Errorf("foreign detail read as %v", reasonOf(e))
	}
	// Not a status: unchanged.
	plain := errors.New("plain")
	if FromError(plain) != plain || FromError(nil) != nil {
		t.Error("a non-status error was changed")
	}
}
