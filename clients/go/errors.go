package holdfast

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/holdfast-dev/holdfast/clients/go/lockv1"
)

// ErrorDetailTypeURL is the type URL of lock.v1.ErrorDetail inside the
// google.rpc.Status of a refusal (the grpc-status-details-bin trailer).
const ErrorDetailTypeURL = "type.googleapis.com/lock.v1.ErrorDetail"

// reasonError is the type of the sentinels: one per lock.v1.ErrorReason.
type reasonError struct {
	reason lockv1.ErrorReason
	text   string
}

func (e *reasonError) Error() string { return e.text }

// One sentinel per lock.v1.ErrorReason. A refusal (*Error) matches the
// sentinel of its reason: errors.Is(err, holdfast.ErrContention).
var (
	// The key stayed held by another session until the wait deadline passed.
	ErrContention = &reasonError{lockv1.ErrorReason_ERROR_REASON_CONTENTION, "holdfast: contention"}
	// The key is held by this same identity under another session: a leaked hold.
	ErrLeak = &reasonError{lockv1.ErrorReason_ERROR_REASON_LEAK, "holdfast: leaked hold"}
	// The arbiter grants nothing until an epoch advance (or init).
	ErrSealed = &reasonError{lockv1.ErrorReason_ERROR_REASON_SEALED, "holdfast: sealed"}
	// The session does not exist, expired, belongs to another identity, or
	// was lost locally (its deadline passed).
	ErrSessionNotFound = &reasonError{lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND, "holdfast: session not found"}
	// A request field was refused; Error.Field names it.
	ErrInvalidArgument = &reasonError{lockv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT, "holdfast: invalid argument"}
	// The client certificate carries no usable identity.
	ErrUnauthenticated = &reasonError{lockv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED, "holdfast: unauthenticated"}
	// The identity may not lock this key.
	ErrDenied = &reasonError{lockv1.ErrorReason_ERROR_REASON_DENIED, "holdfast: denied"}
	// etcd or the arbiter could not be reached; transport failures count too.
	ErrUnavailable = &reasonError{lockv1.ErrorReason_ERROR_REASON_UNAVAILABLE, "holdfast: unavailable"}
	// The arbiter has no published class set yet.
	ErrNoPolicy = &reasonError{lockv1.ErrorReason_ERROR_REASON_NO_POLICY, "holdfast: no policy"}
	// The key's class is homed to another region (the message names it).
	ErrWrongRegion = &reasonError{lockv1.ErrorReason_ERROR_REASON_WRONG_REGION, "holdfast: wrong region"}
	// The session's TTL is not the TTL of the key's class.
	ErrClassTTL = &reasonError{lockv1.ErrorReason_ERROR_REASON_CLASS_TTL, "holdfast: class TTL mismatch"}
	// The identity made requests faster than the arbiter's limit.
	ErrRateLimited = &reasonError{lockv1.ErrorReason_ERROR_REASON_RATE_LIMITED, "holdfast: rate limited"}
	// A session or hold quota is used up.
	ErrQuota = &reasonError{lockv1.ErrorReason_ERROR_REASON_QUOTA, "holdfast: quota"}
	// The session is on another tier than the key's class.
	ErrClassTier = &reasonError{lockv1.ErrorReason_ERROR_REASON_CLASS_TIER, "holdfast: class tier mismatch"}
	// The key's range is moving between etcd clusters; nothing was written.
	// Retry after the error's RetryAfter.
	ErrMoving = &reasonError{lockv1.ErrorReason_ERROR_REASON_MOVING, "holdfast: moving"}
)

// ErrConfig marks a bad or unreadable client configuration (no endpoint,
// unreadable certificate, malformed endpoint). Not a refusal.
var ErrConfig = errors.New("holdfast: configuration")

var sentinels = map[lockv1.ErrorReason]*reasonError{}

func init() {
	for _, s := range []*reasonError{ErrContention, ErrLeak, ErrSealed, ErrSessionNotFound, ErrInvalidArgument,
		ErrUnauthenticated, ErrDenied, ErrUnavailable, ErrNoPolicy, ErrWrongRegion, ErrClassTTL, ErrRateLimited,
		ErrQuota, ErrClassTier, ErrMoving} {
		sentinels[s.reason] = s
	}
}

// Error is a refusal by the arbiter (or a transport failure, with reason
// UNAVAILABLE). Branch on Reason (or errors.Is with a sentinel), never on
// the message text. Use errors.As to reach it.
type Error struct {
	// The gRPC status code.
	Code codes.Code
	// The typed reason; ERROR_REASON_UNSPECIFIED when the status carried
	// none and its code maps to none.
	Reason lockv1.ErrorReason
	// For INVALID_ARGUMENT: the request field that was refused.
	Field string
	// The status message (the code's name when empty).
	Message string
	// How long to wait before retrying, when the status carries a
	// google.rpc.RetryInfo; zero otherwise.
	RetryAfter time.Duration
}

func (e *Error) Error() string { return e.Message }

// Is reports whether target is the sentinel of e's reason.
func (e *Error) Is(target error) bool {
	s, ok := target.(*reasonError)
	return ok && e.Reason != lockv1.ErrorReason_ERROR_REASON_UNSPECIFIED && s.reason == e.Reason
}

// GRPCStatus lets status.Code and status.FromError read the code back.
func (e *Error) GRPCStatus() *status.Status { return status.New(e.Code, e.Message) }

// FromError turns an error returned by a lockv1 call into an *Error with the
// typed reason of its google.rpc.Status details (lock.v1.ErrorDetail). Errors
// that are not gRPC statuses (and nil) are returned unchanged. Without a
// detail, the reason follows the code, as in the Rust client: UNAVAILABLE,
// DEADLINE_EXCEEDED and CANCELLED are ErrUnavailable; UNAUTHENTICATED,
// PERMISSION_DENIED and INVALID_ARGUMENT their own reasons.
func FromError(err error) error {
	if err == nil {
		return nil
	}
	var already *Error
	if errors.As(err, &already) {
		return err
	}
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	return fromStatus(st)
}

func fromStatus(st *status.Status) *Error {
	e := &Error{Code: st.Code(), Message: st.Message()}
	if e.Message == "" {
		e.Message = st.Code().String()
	}
	found := false
	for _, a := range st.Proto().GetDetails() {
		switch a.GetTypeUrl() {
		case ErrorDetailTypeURL:
			var d lockv1.ErrorDetail
			if a.UnmarshalTo(&d) == nil && !found {
				if _, known := sentinels[d.GetReason()]; known {
					e.Reason, e.Field, found = d.GetReason(), d.GetField(), true
				}
			}
		default:
			var ri errdetails.RetryInfo
			if a.MessageIs(&ri) && a.UnmarshalTo(&ri) == nil && ri.GetRetryDelay() != nil {
				e.RetryAfter = ri.GetRetryDelay().AsDuration()
			}
		}
	}
	if !found {
		switch st.Code() {
		case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled:
			e.Reason = lockv1.ErrorReason_ERROR_REASON_UNAVAILABLE
		case codes.Unauthenticated:
			e.Reason = lockv1.ErrorReason_ERROR_REASON_UNAUTHENTICATED
		case codes.PermissionDenied:
			e.Reason = lockv1.ErrorReason_ERROR_REASON_DENIED
		case codes.InvalidArgument:
			e.Reason = lockv1.ErrorReason_ERROR_REASON_INVALID_ARGUMENT
		}
	}
	return e
}

func reasonOf(err error) lockv1.ErrorReason {
	var e *Error
	if errors.As(err, &e) {
		return e.Reason
	}
	return lockv1.ErrorReason_ERROR_REASON_UNSPECIFIED
}

func unavailable(err error) bool {
	return reasonOf(err) == lockv1.ErrorReason_ERROR_REASON_UNAVAILABLE
}

func configError(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrConfig, fmt.Sprintf(format, args...))
}

// errLost is what a call on a lost session returns (as the Rust client).
func errLost() error {
	return &Error{
		Code:    codes.FailedPrecondition,
		Reason:  lockv1.ErrorReason_ERROR_REASON_SESSION_NOT_FOUND,
		Message: "the session is lost (its local deadline passed); open a new session",
	}
}
