package agent

import (
	"errors"
	"fmt"
)

// Kind classifies an error so the edge (HTTP, Step Functions) can map it once.
type Kind int

const (
	KindInternal Kind = iota
	KindNotFound
	KindConflict
	KindInvalid
	KindUnauthenticated
	KindCanceled
	KindTooLarge
	KindUnavailable // a dependency (model, store) failed in a way that may pass on retry
)

func (k Kind) String() string {
	switch k {
	case KindNotFound:
		return "not_found"
	case KindConflict:
		return "conflict"
	case KindInvalid:
		return "invalid"
	case KindUnauthenticated:
		return "unauthenticated"
	case KindCanceled:
		return "canceled"
	case KindTooLarge:
		return "too_large"
	case KindUnavailable:
		return "unavailable"
	default:
		return "internal"
	}
}

// Error is the one error type that crosses package boundaries. Code is a stable snake_case identifier that
// clients may switch on (e.g. "run_active"); Message is for humans.
type Error struct {
	Kind    Kind
	Code    string
	Message string
	Err     error
}

func (e *Error) Error() string {
	msg := e.Code
	if e.Message != "" {
		msg += ": " + e.Message
	}
	if e.Err != nil {
		msg += ": " + e.Err.Error()
	}
	return msg
}

func (e *Error) Unwrap() error { return e.Err }

// E builds an *Error. The message may use fmt verbs.
func E(kind Kind, code, format string, args ...any) *Error {
	return &Error{Kind: kind, Code: code, Message: fmt.Sprintf(format, args...)}
}

// Wrap builds an *Error around a cause.
func Wrap(err error, kind Kind, code, message string) *Error {
	return &Error{Kind: kind, Code: code, Message: message, Err: err}
}

// KindOf reports the kind of the first *Error in err's chain; KindInternal when there is none.
func KindOf(err error) Kind {
	var e *Error
	if errors.As(err, &e) {
		return e.Kind
	}
	return KindInternal
}

// CodeOf reports the code of the first *Error in err's chain; "internal" when there is none.
func CodeOf(err error) string {
	var e *Error
	if errors.As(err, &e) && e.Code != "" {
		return e.Code
	}
	return "internal"
}

// IsKind reports whether err carries kind k.
func IsKind(err error, k Kind) bool { return err != nil && KindOf(err) == k }

// Stable error codes shared by the store, the engine and the edge.
const (
	CodeNotFound        = "not_found"
	CodeThreadNotFound  = "thread_not_found"
	CodeRunNotFound     = "run_not_found"
	CodeMessageNotFound = "message_not_found"
	CodeRunActive       = "run_active"   // a fresh claim exists on the thread
	CodeRunFenced       = "run_fenced"   // the caller's claim or epoch is no longer current
	CodeRunCanceled     = "run_canceled" // the claim carries a cancel request
	CodeNoActiveRun     = "no_active_run"
	CodeAlreadyResolved = "already_resolved"
	CodeTooLarge        = "request_too_large"
	CodeInternal        = "internal"
	CodeModelError      = "model_error"
	CodeModelTimeout    = "model_timeout"
	CodeStepLimit       = "step_limit"
	CodeRunTimeout      = "run_timeout"
	CodeStale           = "stale"
)
