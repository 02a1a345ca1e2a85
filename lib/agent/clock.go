package agent

import (
	"crypto/rand"
	"encoding/base32"
	"strings"
	"time"
)

// Clock is the time source. Inject it; never call time.Now in domain or engine code.
type Clock interface {
	Now() time.Time
}

// IDs makes new identifiers. prefix is a short type tag ("run", "msg").
type IDs interface {
	New(prefix string) string
}

// SystemClock is the wall clock, truncated to milliseconds so stored and re-read times compare equal.
type SystemClock struct{}

func (SystemClock) Now() time.Time { return time.Now().UTC().Truncate(time.Millisecond) }

// RandomIDs makes ids of the form prefix_<26 lowercase base32 chars>, time-ordered in their first 10 chars
// so ids sort roughly by creation.
type RandomIDs struct{ Clock Clock }

var idEncoding = base32.NewEncoding("0123456789abcdefghjkmnpqrstvwxyz").WithPadding(base32.NoPadding)

func (r RandomIDs) New(prefix string) string {
	var b [16]byte
	var now time.Time
	if r.Clock != nil {
		now = r.Clock.Now()
	} else {
		now = time.Now()
	}
	ms := uint64(now.UnixMilli())
	for i := 5; i >= 0; i-- {
		b[i] = byte(ms)
		ms >>= 8
	}
	_, _ = rand.Read(b[6:])
	s := strings.ToLower(idEncoding.EncodeToString(b[:]))
	if prefix == "" {
		return s
	}
	return prefix + "_" + s
}
