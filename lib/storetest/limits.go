package storetest

import (
	"fmt"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

func limitPort(s agent.Store) agent.LimitStore { return s }

func limitTests() []test {
	return group(limitPort,
		leaf[agent.LimitStore]{"LeaseLimitReached", testLeaseLimit},
		leaf[agent.LimitStore]{"LeaseReacquireIsIdempotent", testLeaseReacquire},
		leaf[agent.LimitStore]{"LeaseExpiryFrees", testLeaseExpiry},
		leaf[agent.LimitStore]{"LeaseRelease", testLeaseRelease},
		leaf[agent.LimitStore]{"LeaseRenew", testLeaseRenew},
		leaf[agent.LimitStore]{"LeaseReleaseByPrefix", testLeaseReleaseByPrefix},
		leaf[agent.LimitStore]{"LeaseChurnPurgesExpired", testLeaseChurn},
		leaf[agent.LimitStore]{"LeaseConcurrentAcquirers", testLeaseConcurrent},
		leaf[agent.LimitStore]{"LeaseConcurrentOverExpired", testLeaseConcurrentExpired},
		leaf[agent.LimitStore]{"LeaseScopesIsolated", testLeaseScopes},
		leaf[agent.LimitStore]{"LeaseInvalid", testLeaseInvalid},
		leaf[agent.LimitStore]{"CounterWindowRollsOver", testCounterWindow},
		leaf[agent.LimitStore]{"CounterConcurrent", testCounterConcurrent},
		leaf[agent.LimitStore]{"CounterInvalid", testCounterInvalid},
	)
}

// acquire asks for a lease and checks the answer: want 0 is "granted", anything else the retryAfter of a refusal.
func acquire(e *env[agent.LimitStore], scope, holder string, limit int, ttl, now time.Duration, want time.Duration) {
	e.t.Helper()
	got, err := e.s.AcquireLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: holder, Limit: limit, TTL: ttl, Now: at(now)})
	must(e.t, err, fmt.Sprintf("AcquireLease(%s, %s) at +%s", scope, holder, now))
	if got != want {
		e.t.Fatalf("AcquireLease(%s, %s, limit %d) at +%s: retryAfter = %s, want %s (0: granted)", scope, holder, limit, now, got, want)
	}
}

func count(e *env[agent.LimitStore], scope string, limit int, window, now time.Duration, want time.Duration) {
	e.t.Helper()
	got, err := e.s.Count(e.ctx, agent.CountRequest{Scope: scope, Window: window, Limit: limit, Now: at(now)})
	must(e.t, err, fmt.Sprintf("Count(%s) at +%s", scope, now))
	if got != want {
		e.t.Fatalf("Count(%s, limit %d) at +%s: retryAfter = %s, want %s (0: counted)", scope, limit, now, got, want)
	}
}

// A full scope refuses with the time until its first live lease expires, and writes nothing: the refused holder
// holds nothing afterwards (it cannot renew).
func testLeaseLimit(e *env[agent.LimitStore]) {
	scope := "runs/" + e.id("user")
	acquire(e, scope, "a", 2, 10*time.Second, 0, 0)
	acquire(e, scope, "b", 2, 20*time.Second, time.Second, 0)
	acquire(e, scope, "c", 2, time.Minute, 2*time.Second, 8*time.Second)
	acquire(e, scope, "c", 2, time.Minute, 9*time.Second+500*time.Millisecond, 500*time.Millisecond)
	err := e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: "c", TTL: time.Minute, Now: at(3 * time.Second)})
	wantErr(e.t, err, agent.KindConflict, agent.CodeLeaseLost, "RenewLease of a refused holder")
	// A higher limit on the same scope has room again (limits are the caller's, the store keeps only leases).
	acquire(e, scope, "c", 3, time.Minute, 3*time.Second, 0)
}

// A holder that asks again (a retry whose first answer was lost) gets its lease again, extended, even when the
// scope is full; it never takes two slots.
func testLeaseReacquire(e *env[agent.LimitStore]) {
	scope := "runs/" + e.id("user")
	acquire(e, scope, "a", 1, 10*time.Second, 0, 0)
	acquire(e, scope, "a", 1, 10*time.Second, 5*time.Second, 0)
	acquire(e, scope, "b", 1, 10*time.Second, 12*time.Second, 3*time.Second)
	acquire(e, scope, "a", 2, 10*time.Second, 13*time.Second, 0)
	acquire(e, scope, "b", 2, 10*time.Second, 13*time.Second, 0) // a holds one slot, not two
	acquire(e, scope, "c", 2, 10*time.Second, 13*time.Second, 10*time.Second)
}

// A holder that never releases (a crashed Lambda) frees its slot when its TTL passes: a lease expiring at Now
// counts for nothing, one a millisecond later still counts.
func testLeaseExpiry(e *env[agent.LimitStore]) {
	scope := "runs/" + e.id("user")
	acquire(e, scope, "crashed", 1, 10*time.Second, 0, 0)
	acquire(e, scope, "next", 1, 10*time.Second, 10*time.Second-time.Millisecond, time.Millisecond)
	acquire(e, scope, "next", 1, 10*time.Second, 10*time.Second, 0)
	err := e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: "crashed", TTL: time.Minute, Now: at(10 * time.Second)})
	wantErr(e.t, err, agent.KindConflict, agent.CodeLeaseLost, "RenewLease of an expired lease")
	// The crashed holder, back, is a new holder and waits like any other.
	acquire(e, scope, "crashed", 1, 10*time.Second, 11*time.Second, 9*time.Second)
}

func testLeaseRelease(e *env[agent.LimitStore]) {
	scope := "streams/user/" + e.id("user")
	acquire(e, scope, "a", 1, time.Minute, 0, 0)
	acquire(e, scope, "b", 1, time.Minute, 0, time.Minute)
	must(e.t, e.s.ReleaseLease(e.ctx, scope, "a"), "ReleaseLease")
	must(e.t, e.s.ReleaseLease(e.ctx, scope, "a"), "ReleaseLease again")
	must(e.t, e.s.ReleaseLease(e.ctx, scope, "never"), "ReleaseLease of a holder that holds nothing")
	must(e.t, e.s.ReleaseLease(e.ctx, "streams/user/"+e.id("nobody"), "a"), "ReleaseLease in an unknown scope")
	acquire(e, scope, "b", 1, time.Minute, time.Second, 0)
	acquire(e, scope, "a", 1, time.Minute, time.Second, time.Minute)
	err := e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: "a", TTL: time.Minute, Now: at(time.Second)})
	wantErr(e.t, err, agent.KindConflict, agent.CodeLeaseLost, "RenewLease after release")
}

// ReleaseLeases gives back every lease of a scope whose holder begins with the prefix (the reaper: a reaped run's
// readers, agent.ReadersOf), live or expired, and nothing else: not a holder that only shares the prefix's
// beginning without its separator, not another scope's lease of the same holder. An empty prefix gives back the
// whole scope. A holder released so renews no more, and may acquire again; repeating it, or an unknown scope, is
// a no-op.
func testLeaseReleaseByPrefix(e *env[agent.LimitStore]) {
	scope, other := "streams/user/"+e.id("user"), "streams/user/"+e.id("user")
	run := e.id("run")
	dead1, dead2, expired := agent.ReaderHolder(run, "a"), agent.ReaderHolder(run, "b"), agent.ReaderHolder(run, "c")
	kept, longer := agent.ReaderHolder(e.id("run"), "d"), agent.ReaderHolder(run+"9", "e")
	acquire(e, scope, expired, 5, time.Second, 0, 0)
	for _, h := range []string{dead1, dead2, kept, longer} {
		acquire(e, scope, h, 5, time.Minute, 0, 0)
	}
	acquire(e, other, dead1, 1, time.Minute, 0, 0)
	must(e.t, e.s.ReleaseLeases(e.ctx, scope, agent.ReadersOf(run)), "ReleaseLeases")
	must(e.t, e.s.ReleaseLeases(e.ctx, scope, agent.ReadersOf(run)), "ReleaseLeases again")
	must(e.t, e.s.ReleaseLeases(e.ctx, "streams/user/"+e.id("nobody"), agent.ReadersOf(run)), "ReleaseLeases in an unknown scope")
	renew := func(scope, holder string, now time.Duration) error {
		return e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: holder, TTL: time.Minute, Now: at(now)})
	}
	for _, h := range []string{dead1, dead2} {
		wantErr(e.t, renew(scope, h, 2*time.Second), agent.KindConflict, agent.CodeLeaseLost, "RenewLease of a released reader")
	}
	must(e.t, renew(scope, kept, 2*time.Second), "RenewLease of another run's reader")
	must(e.t, renew(scope, longer, 2*time.Second), "RenewLease of a reader whose run id only begins like the prefix")
	must(e.t, renew(other, dead1, 2*time.Second), "RenewLease of the same holder in another scope")
	// Two live leases are left of five slots: three new holders get one, the fourth is refused.
	for _, h := range []string{"x", "y", dead1} {
		acquire(e, scope, h, 5, time.Minute, 3*time.Second, 0)
	}
	acquire(e, scope, "z", 5, time.Minute, 3*time.Second, 59*time.Second)
	// The whole scope.
	must(e.t, e.s.ReleaseLeases(e.ctx, scope, ""), "ReleaseLeases of a whole scope")
	wantErr(e.t, renew(scope, kept, 4*time.Second), agent.KindConflict, agent.CodeLeaseLost, "RenewLease after the whole scope was released")
	for i := range 5 {
		acquire(e, scope, fmt.Sprintf("n%d", i), 5, time.Minute, 4*time.Second, 0)
	}
	must(e.t, renew(other, dead1, 4*time.Second), "RenewLease in the other scope after a whole scope was released")
}

// A renew moves the expiry to Now+TTL (shorter or longer than before); a lease that expired, or was never
// held, cannot be renewed.
func testLeaseRenew(e *env[agent.LimitStore]) {
	scope := "streams/run/" + e.id("run")
	acquire(e, scope, "a", 1, 10*time.Second, 0, 0)
	renew := func(holder string, ttl, now time.Duration) error {
		return e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: holder, TTL: ttl, Now: at(now)})
	}
	must(e.t, renew("a", 10*time.Second, 8*time.Second), "RenewLease")
	acquire(e, scope, "b", 1, 10*time.Second, 15*time.Second, 3*time.Second)
	must(e.t, renew("a", time.Second, 16*time.Second), "RenewLease (shorter)")
	acquire(e, scope, "b", 1, 10*time.Second, 16*time.Second+500*time.Millisecond, 500*time.Millisecond)
	wantErr(e.t, renew("a", time.Minute, 17*time.Second), agent.KindConflict, agent.CodeLeaseLost, "RenewLease at its expiry")
	wantErr(e.t, renew("zzz", time.Minute, 0), agent.KindConflict, agent.CodeLeaseLost, "RenewLease of a holder never seen")
	wantErr(e.t, e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: "streams/run/" + e.id("run"), Holder: "a", TTL: time.Minute, Now: at(0)}),
		agent.KindConflict, agent.CodeLeaseLost, "RenewLease in an unknown scope")
}

// Holders that come and go without releasing (each expires) never fill the scope: expired leases are not
// counted, however many accumulate.
func testLeaseChurn(e *env[agent.LimitStore]) {
	scope := "streams/user/" + e.id("user")
	for i := range 12 {
		now := time.Duration(i) * 2 * time.Second
		acquire(e, scope, fmt.Sprintf("h%d", i), 2, time.Second, now, 0)
		acquire(e, scope, fmt.Sprintf("g%d", i), 2, 2*time.Second, now, 0) // g(i-1) expires right now
	}
	// Live now: h11 (until +23 s) and g11 (+24 s).
	acquire(e, scope, "late", 2, time.Second, 22*time.Second+500*time.Millisecond, 500*time.Millisecond)
}

// Of many concurrent acquirers exactly the limit win, from any number of processes (the store decides, in one
// conditional write or transaction); a release lets exactly one more in.
func testLeaseConcurrent(e *env[agent.LimitStore]) {
	scope := "runs/" + e.id("user")
	const n, limit = 20, 3
	race := func(prefix string) (won []string) {
		var mu sync.Mutex
		var wg sync.WaitGroup
		errs := make(chan error, n)
		for i := range n {
			wg.Go(func() {
				h := fmt.Sprintf("%s%02d", prefix, i)
				retry, err := e.s.AcquireLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: h, Limit: limit, TTL: time.Minute, Now: at(0)})
				if err != nil {
					errs <- err
					return
				}
				if retry == 0 {
					mu.Lock()
					won = append(won, h)
					mu.Unlock()
				} else if retry != time.Minute {
					errs <- fmt.Errorf("%s refused with retryAfter %s, want 1m0s", h, retry)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			e.t.Errorf("concurrent AcquireLease: %v", err)
		}
		return won
	}
	won := race("a")
	if len(won) != limit {
		e.t.Fatalf("%d concurrent acquirers with limit %d: %d won (%v)", n, limit, len(won), won)
	}
	must(e.t, e.s.ReleaseLease(e.ctx, scope, won[0]), "ReleaseLease")
	if again := race("b"); len(again) != 1 {
		e.t.Fatalf("after one release, %d concurrent acquirers: %d won (%v), want 1", n, len(again), again)
	}
}

// A scope full of expired leases (holders that died) under a crowd of concurrent acquirers: exactly the limit
// win and none fails, however many must purge what expired first.
func testLeaseConcurrentExpired(e *env[agent.LimitStore]) {
	scope := "streams/user/" + e.id("user")
	const n, limit = 25, 10
	for i := range limit {
		acquire(e, scope, fmt.Sprintf("dead%02d", i), limit, time.Second, 0, 0)
	}
	var mu sync.Mutex
	var wg sync.WaitGroup
	won := 0
	for i := range n {
		wg.Go(func() {
			retry, err := e.s.AcquireLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: fmt.Sprintf("new%02d", i), Limit: limit,
				TTL: time.Minute, Now: at(time.Minute)})
			if err != nil {
				e.t.Errorf("concurrent AcquireLease over expired leases: %v", err)
				return
			}
			if retry == 0 {
				mu.Lock()
				won++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if won != limit {
		e.t.Fatalf("%d concurrent acquirers over %d expired leases, limit %d: %d won", n, limit, limit, won)
	}
}

func testLeaseScopes(e *env[agent.LimitStore]) {
	u1, u2 := "runs/"+e.id("user"), "runs/"+e.id("user")
	acquire(e, u1, "a", 1, time.Minute, 0, 0)
	acquire(e, u1, "b", 1, time.Minute, 0, time.Minute)
	acquire(e, u2, "b", 1, time.Minute, 0, 0)
	acquire(e, u2, "a", 1, time.Minute, 0, time.Minute)
	must(e.t, e.s.ReleaseLease(e.ctx, u1, "b"), "ReleaseLease of another scope's holder") // b holds u2's, not u1's
	acquire(e, u2, "a", 1, time.Minute, 0, time.Minute)
}

func testLeaseInvalid(e *env[agent.LimitStore]) {
	scope := "runs/" + e.id("user")
	for _, r := range []agent.LeaseRequest{
		{Holder: "a", Limit: 1, TTL: time.Minute},
		{Scope: scope, Limit: 1, TTL: time.Minute},
		{Scope: scope, Holder: "a", Limit: 0, TTL: time.Minute},
		{Scope: scope, Holder: "a", Limit: 1},
		{Scope: scope, Holder: "a", Limit: 1, TTL: agent.MaxLeaseTTL + time.Millisecond},
	} {
		r.Now = at(0)
		_, err := e.s.AcquireLease(e.ctx, r)
		wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidLease, fmt.Sprintf("AcquireLease(%+v)", r))
	}
	_, err := e.s.AcquireLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: "a", Limit: 1, TTL: time.Minute, Now: at(0)})
	must(e.t, err, "AcquireLease after the refused ones")
	err = e.s.RenewLease(e.ctx, agent.LeaseRequest{Scope: scope, Holder: "a", Now: at(0)})
	wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidLease, "RenewLease with no TTL")
}

// Windows are aligned on multiples of the window since the epoch: the suite's clock reads :07.891 past a whole
// minute, so a full window answers 52.109 s, and the next minute counts from zero.
func testCounterWindow(e *env[agent.LimitStore]) {
	scope := "threads/" + e.id("user")
	count(e, scope, 2, time.Minute, 0, 0)
	count(e, scope, 2, time.Minute, 10*time.Second, 0)
	count(e, scope, 2, time.Minute, 20*time.Second, 32*time.Second+109*time.Millisecond)
	count(e, scope, 2, time.Minute, 52*time.Second+108*time.Millisecond, time.Millisecond)
	count(e, scope, 2, time.Minute, 52*time.Second+109*time.Millisecond, 0) // the next window
	count(e, scope, 2, time.Minute, 53*time.Second, 0)
	count(e, scope, 2, time.Minute, 54*time.Second, 58*time.Second+109*time.Millisecond)
	count(e, scope, 3, time.Minute, 54*time.Second, 0) // the limit is the caller's
	other := "threads/" + e.id("user")
	count(e, other, 1, time.Minute, 54*time.Second, 0)
	// Another window length is another counter: 05:07:01.891 is 52m58.109s before its hour ends.
	count(e, scope, 1, time.Hour, 54*time.Second, 0)
	count(e, scope, 1, time.Hour, 54*time.Second, 52*time.Minute+58*time.Second+109*time.Millisecond)
}

func testCounterConcurrent(e *env[agent.LimitStore]) {
	scope := "threads/" + e.id("user")
	const n, limit = 12, 4
	var mu sync.Mutex
	var wg sync.WaitGroup
	counted := 0
	for range n {
		wg.Go(func() {
			retry, err := e.s.Count(e.ctx, agent.CountRequest{Scope: scope, Window: time.Minute, Limit: limit, Now: at(0)})
			if err != nil {
				e.t.Errorf("concurrent Count: %v", err)
				return
			}
			if retry == 0 {
				mu.Lock()
				counted++
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	if counted != limit {
		e.t.Fatalf("%d concurrent counts with limit %d: %d counted", n, limit, counted)
	}
}

func testCounterInvalid(e *env[agent.LimitStore]) {
	for _, r := range []agent.CountRequest{
		{Window: time.Minute, Limit: 1},
		{Scope: "threads/x", Window: time.Minute},
		{Scope: "threads/x", Limit: 1},
		{Scope: "threads/x", Window: agent.MaxLeaseTTL + time.Millisecond, Limit: 1},
	} {
		r.Now = at(0)
		_, err := e.s.Count(e.ctx, r)
		wantErr(e.t, err, agent.KindInvalid, agent.CodeInvalidLease, fmt.Sprintf("Count(%+v)", r))
	}
}
