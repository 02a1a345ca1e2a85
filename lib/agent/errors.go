package agent

import (
	"errors"
	"fmt"
	"time"
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
	KindLimited     // the caller is over a per-user limit; Error.RetryAfter says when to try again (HTTP 429)
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
	case KindLimited:
		return "limited"
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
	// RetryAfter, on a KindLimited error (Limited) or an overloaded one (KindUnavailable, CodeOverloaded), is how
	// long the caller should wait before trying again.
	RetryAfter time.Duration
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

// Is matches on codes, so errors.Is(err, ErrRunActive) holds for every *Error with code run_active, whatever
// its message, kind or cause.
func (e *Error) Is(target error) bool {
	t, ok := target.(*Error)
	return ok && t.Code != "" && t.Code == e.Code
}

// Public returns the code and a message safe to show a client: the error's own message for every kind but
// internal, never the chain of causes (provider bodies, AWS request ids, keys: those go to the log).
func Public(err error) (code, message string) {
	var e *Error
	if !errors.As(err, &e) || e.Kind == KindInternal {
		return CodeInternal, "internal error"
	}
	code, message = e.Code, e.Message
	if code == "" {
		code = CodeInternal
	}
	if message == "" {
		message = e.Kind.String()
	}
	return code, message
}

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
