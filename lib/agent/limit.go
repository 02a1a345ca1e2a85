package agent

import (
	"context"
	"sync"
	"time"
)

// LimitStore keeps the per-user limits (DESIGN.md principle 6: runs and stream readers per user), so that they
// hold across every instance and every Lambda: each decision is one conditional write (or one local
// transaction), never a count held in memory.
//
// Two shapes of limit:
//
//   - A lease is a slot of a bounded set (the active runs of a user, the stream readers of a user or of a run).
//     Its holder takes it with AcquireLease, keeps it alive with RenewLease and gives it back with ReleaseLease;
//     a holder that crashes never gives it back, so every lease expires at its TTL and an expired lease counts
//     for nothing.
//   - A counter is a fixed window (new threads per minute): Count adds one to the window that holds Now, or
//     refuses when it is full.
//
// Scopes are opaque strings that name one bounded set or counter and include the user they belong to (e.g.
// "runs/<owner>"), so one user's limits never touch another's. A refusal is not an error: it is a positive
// retryAfter with a nil error, and nothing is written. Both stores refuse the same requests with the same
// retryAfter (to the millisecond, from the request's Now).
type LimitStore interface {
	// AcquireLease gives r.Holder a lease in r.Scope until r.Now+r.TTL when fewer than r.Limit other holders
	// hold a live one (expiry after r.Now). A holder that holds a live lease already gets it again, extended to
	// r.Now+r.TTL (idempotent: a retry whose first attempt applied converges), whatever the count. When the
	// scope is full it returns how long until the first live lease expires (> 0) and writes nothing. Bad input
	// (empty scope or holder, Limit < 1, TTL outside (0, MaxLeaseTTL]): KindInvalid/CodeInvalidLease.
	AcquireLease(ctx context.Context, r LeaseRequest) (retryAfter time.Duration, err error)
	// RenewLease extends r.Holder's live lease to r.Now+r.TTL (r.Limit is not read). A holder with no live
	// lease (released, expired, never acquired): KindConflict/CodeLeaseLost, and nothing changes; the caller
	// may try AcquireLease.
	RenewLease(ctx context.Context, r LeaseRequest) error
	// ReleaseLease gives holder's lease in scope back. Releasing a lease not held is a no-op.
	ReleaseLease(ctx context.Context, scope, holder string) error
	// ReleaseLeases gives back, at once, every lease in scope whose holder begins with prefix (an empty prefix:
	// the whole scope), live or expired, and no other: the reaper gives back the stream leases of a reaped run's
	// readers this way (ReadersOf), whose holder ids it cannot know. A holder released so gets
	// KindConflict/CodeLeaseLost on its next RenewLease and may acquire again (KeepLeases does). None held, or an
	// unknown scope, is a no-op. Empty scope: KindInvalid/CodeInvalidLease.
	ReleaseLeases(ctx context.Context, scope, prefix string) error
	// Count adds one to r.Scope's window that holds r.Now (windows are aligned on multiples of r.Window since
	// the Unix epoch) when it holds fewer than r.Limit; otherwise it returns the time until that window ends
	// (> 0) and writes nothing. Bad input (empty scope, Limit < 1, Window outside (0, MaxLeaseTTL]):
	// KindInvalid/CodeInvalidLease.
	Count(ctx context.Context, r CountRequest) (retryAfter time.Duration, err error)
}

// MaxLeaseTTL bounds lease TTLs and counter windows: stores may keep limit items only a little longer (the
// DynamoDB store sets their TTL attribute that far ahead of every write).
const MaxLeaseTTL = 24 * time.Hour

// LeaseRequest asks for (or renews) one holder's slot in a bounded scope.
type LeaseRequest struct {
	Scope  string
	Holder string
	Limit  int
	TTL    time.Duration
	Now    time.Time
}

// Check refuses what no store keeps.
func (r LeaseRequest) Check(renew bool) error {
	switch {
	case r.Scope == "" || r.Holder == "":
		return E(KindInvalid, CodeInvalidLease, "a lease needs a scope and a holder")
	case !renew && r.Limit < 1:
		return E(KindInvalid, CodeInvalidLease, "a lease limit must be at least 1, got %d", r.Limit)
	case r.TTL <= 0 || r.TTL > MaxLeaseTTL:
		return E(KindInvalid, CodeInvalidLease, "a lease TTL must be in (0, %s], got %s", MaxLeaseTTL, r.TTL)
	}
	return nil
}

// CountRequest counts one event in a fixed-window counter.
type CountRequest struct {
	Scope  string
	Window time.Duration
	Limit  int
	Now    time.Time
}

// Check refuses what no store keeps.
func (r CountRequest) Check() error {
	switch {
	case r.Scope == "":
		return E(KindInvalid, CodeInvalidLease, "a counter needs a scope")
	case r.Limit < 1:
		return E(KindInvalid, CodeInvalidLease, "a counter limit must be at least 1, got %d", r.Limit)
	case r.Window <= 0 || r.Window > MaxLeaseTTL:
		return E(KindInvalid, CodeInvalidLease, "a counter window must be in (0, %s], got %s", MaxLeaseTTL, r.Window)
	}
	return nil
}

// WindowOf returns the start and end of the fixed window of length w that holds now (windows are aligned on
// multiples of w since the Unix epoch, in milliseconds), so every store and every instance agrees on it.
func WindowOf(now time.Time, w time.Duration) (start, end time.Time) {
	ms := w.Milliseconds()
	if ms <= 0 {
		ms = 1
	}
	s := now.UnixMilli() / ms * ms
	return time.UnixMilli(s).UTC(), time.UnixMilli(s + ms).UTC()
}

// Limited builds the refusal of a request over a limit (KindLimited, HTTP 429): code names the limit, retryAfter
// says when to try again.
func Limited(code string, retryAfter time.Duration, format string, args ...any) *Error {
	e := E(KindLimited, code, format, args...)
	e.RetryAfter = retryAfter
	return e
}

// RetryAfterOf reports the RetryAfter of the first *Error in err's chain that carries one (0: none).
func RetryAfterOf(err error) time.Duration {
	for err != nil {
		if e, ok := err.(*Error); ok && e.RetryAfter > 0 {
			return e.RetryAfter
		}
		u, ok := err.(interface{ Unwrap() error })
		if !ok {
			return 0
		}
		err = u.Unwrap()
	}
	return 0
}

// KeepLeases renews held every period, in the background, until the returned stop is called (stop waits for a
// renewal in flight, and may be called more than once) or, when lifetime > 0, until lifetime has passed (a holder
// whose release was never reached must still expire). A lease found lost (its holder paused past the TTL) is
// taken again when there is room: a holder that is already running is never cut off for a limit. failed hears
// every renewal that did not apply (lifetime's end as ErrLeaseLost). Giving the leases back stays with the
// caller, after stop.
func KeepLeases(ctx context.Context, store LimitStore, clock Clock, held []LeaseRequest, period, lifetime time.Duration,
	failed func(LeaseRequest, error)) (stop func()) {
	quit, done := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(done)
		tick := time.NewTicker(max(period, time.Millisecond))
		defer tick.Stop()
		var end <-chan time.Time
		if lifetime > 0 {
			t := time.NewTimer(lifetime)
			defer t.Stop()
			end = t.C
		}
		for {
			select {
			case <-quit:
				return
			case <-end:
				for _, r := range held {
					failed(r, ErrLeaseLost)
				}
				return
			case <-tick.C:
			}
			for _, r := range held {
				r.Now = clock.Now()
				err := store.RenewLease(ctx, r)
				if IsKind(err, KindConflict) {
					_, err = store.AcquireLease(ctx, r)
				}
				if err != nil {
					failed(r, err)
				}
			}
		}
	}()
	var once sync.Once
	return func() {
		once.Do(func() {
			close(quit)
			<-done
		})
	}
}

// RunSlotScope is the lease scope of a user's active runs; a run holds its slot under its run id. The engine
// takes it, the reaper gives a reaped run's back.
func RunSlotScope(owner string) string { return "runs/" + owner }

// StreamUserScope and StreamRunScope are the lease scopes of a user's stream readers and of one run's; a reader
// holds one lease in each under ReaderHolder. The thread service takes them, the reaper gives back a reaped
// run's (ReleaseLeases with ReadersOf: in the run's scope every holder is the run's).
func StreamUserScope(owner string) string { return "streams/user/" + owner }
func StreamRunScope(runID string) string  { return "streams/run/" + runID }

// ReaderHolder is the holder id of reader id's leases on run runID: it begins with ReadersOf(runID), so that the
// reaper can give back the leases of a reaped run's readers without knowing them (a reader whose process died
// with the run never gives its own back).
func ReaderHolder(runID, id string) string { return ReadersOf(runID) + id }

// ReadersOf is the holder prefix of run runID's readers (ReaderHolder). Run ids never hold '/'.
func ReadersOf(runID string) string { return runID + "/" }
