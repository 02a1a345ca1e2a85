package httpapi

import (
	"testing"
	"time"
)

// Retry-After is whole seconds rounded up and never 0: a client told 0 retries at once and is refused again.
func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		in   time.Duration
		want string
	}{
		{0, "1"}, {time.Millisecond, "1"}, {time.Second, "1"}, {time.Second + time.Millisecond, "2"},
		{43*time.Second + 500*time.Millisecond, "44"}, {time.Minute, "60"},
	} {
		if got := retryAfterSeconds(tc.in); got != tc.want {
			t.Errorf("retryAfterSeconds(%s) = %q, want %q", tc.in, got, tc.want)
		}
	}
}
