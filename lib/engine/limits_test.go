package engine_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/engine"
)

// manualClock is a clock the test moves; it starts 12.5 s into a minute, so a thread-rate refusal's RetryAfter
// (the rest of the minute) is not a round number.
type manualClock struct {
	mu  sync.Mutex
	now time.Time
}

func newManualClock() *manualClock {
	return &manualClock{now: time.Date(2031, 3, 4, 5, 6, 12, 500_000_000, time.UTC)}
}

func (c *manualClock) Now() time.Time { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *manualClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

func withClock(c agent.Clock) option { return func(o *devserver.Options) { o.Clock = c } }

// limitStores are the stores the limit tests run on: SQLite always, and dynalite unless -short.
func limitStores(t *testing.T) map[string]func(t *testing.T) option {
	stores := map[string]func(t *testing.T) option{"sqlite": func(*testing.T) option { return func(*devserver.Options) {} }}
	if testing.Short() {
		return stores
	}
	stores["dynamo"] = func(t *testing.T) option {
		endpoint := dynamotest.Start(t)
		client := dynamotest.Client(endpoint)
		table := fmt.Sprintf("limits_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
			t.Fatal(err)
		}
		store := dynamo.New(client, table)
		return func(o *devserver.Options) {
			inner := o.Wrap
			o.Wrap = func(agent.Store) agent.Store {
				if inner != nil {
					return inner(store)
				}
				return store
			}
		}
	}
	return stores
}

// deadAfterRun is a process that dies as its run ends: the slot's renewals and its release never reach the
// store (an error that is not retried, as a killed process retries nothing).
type deadAfterRun struct {
	agent.Store
}

func (deadAfterRun) RenewLease(context.Context, agent.LeaseRequest) error {
	return errors.New("the process died")
}
func (deadAfterRun) ReleaseLease(context.Context, string, string) error {
	return errors.New("the process died")
}

// wantLimited checks a refusal over a limit: its code, and a RetryAfter in (0, max].
func wantLimited(t *testing.T, err error, code string, max time.Duration) time.Duration {
	t.Helper()
	if !errors.Is(err, &agent.Error{Code: code}) || !agent.IsKind(err, agent.KindLimited) {
		t.Fatalf("err = %v, want %s (limited)", err, code)
	}
	ra := agent.RetryAfterOf(err)
	if ra <= 0 || ra > max {
		t.Fatalf("%s: RetryAfter %s, want in (0, %s]", code, ra, max)
	}
	return ra
}

func (f *fixture) noThread(t *testing.T, id string) {
	t.Helper()
	if _, err := f.store.GetThread(context.Background(), id); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("GetThread(%s) after a refusal: %v, want not found (nothing written)", id, err)
	}
}

// A run whose process died never gives its slot back; the slot frees itself once its lease's TTL passes, and
// until then the user's next run is refused with nothing written. Another user is not affected.
func TestRunSlotOfACrashedProcessExpires(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			limits := withConfig(func(c *config.Config) { c.MaxActiveRunsPerUser = 1; c.RunLeaseTTL = 40 * time.Second })
			f := setup(t, store(t), withClock(clock), limits, withStore(func(s agent.Store) agent.Store { return deadAfterRun{s} }))
			if run, _ := f.turn(t, "t1", "u1", "hello"); run.Status != agent.RunCompleted {
				t.Fatalf("first run: %s", run.Status)
			}
			ctx := context.Background()
			_, err := f.eng.Begin(ctx, submit("t2", "u2", "again"))
			wantLimited(t, err, agent.CodeTooManyRuns, engine.RunRetryAfter)
			f.noThread(t, "t2")
			if _, err := f.eng.Begin(ctx, submit("t1", "u2", "same thread")); !errors.Is(err, agent.ErrTooManyRuns) {
				t.Fatalf("a run on the first thread: %v, want too_many_runs", err)
			}
			bob := submit("b1", "u1", "hi")
			bob.Owner = "bob"
			if _, raw := f.run(t, bob); len(parseSSE(t, raw)) == 0 {
				t.Fatal("bob's run streamed nothing")
			}
			clock.add(40*time.Second - time.Millisecond)
			if _, err := f.eng.Begin(ctx, submit("t2", "u2", "again")); !errors.Is(err, agent.ErrTooManyRuns) {
				t.Fatalf("a millisecond before the TTL: %v, want too_many_runs", err)
			}
			clock.add(time.Millisecond)
			if run, _ := f.turn(t, "t2", "u2", "again"); run.Status != agent.RunCompleted {
				t.Fatalf("after the TTL: %s", run.Status)
			}
		})
	}
}

// Runs that end give their slot back at once; server-side turns are never refused, and a message queued on a
// busy thread at the limit is queued, not refused.
func TestRunSlotsReleasedAndServerTurns(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			// No reaper ticks: its sweep of queues would start the delivery pass this test starts itself.
			f := setup(t, store(t), withConfig(func(c *config.Config) { c.MaxActiveRunsPerUser, c.ReaperInterval = 1, time.Hour }))
			ctx := context.Background()
			for i := range 3 { // one after another: each ends and frees the slot
				if run, _ := f.turn(t, fmt.Sprintf("seq%d", i), "u1", "hello"); run.Status != agent.RunCompleted {
					t.Fatalf("run %d: %s", i, run.Status)
				}
			}
			// A message waits in the queue of an idle thread (as a job's steer would).
			q := agent.QueuedMessage{ThreadID: "seq0", Kind: agent.QueueUser, Message: *userMsg("q1", "queued hello"), Owner: "alice",
				Status: agent.QueueQueued, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
			if _, _, err := f.store.Enqueue(ctx, q, 0); err != nil {
				t.Fatal(err)
			}

			busy, err := f.eng.Begin(ctx, submit("busy", "u1", "/slow 40"))
			if err != nil {
				t.Fatal(err)
			}
			done := make(chan agent.Run, 1)
			go func() { done <- busy.Stream(ctx, io.Discard) }()
			_, err = f.eng.Begin(ctx, submit("other", "u1", "hello"))
			wantLimited(t, err, agent.CodeTooManyRuns, engine.RunRetryAfter)
			f.noThread(t, "other")

			queued := submit("busy", "u2", "and then?")
			queued.Multitask = engine.MultitaskEnqueue
			tr, err := f.eng.Begin(ctx, queued)
			if err != nil || tr.Queued() == nil {
				t.Fatalf("enqueue on the busy thread at the limit: %v, want queued", err)
			}
			// The delivery pass is a server-side turn: it runs although the user is at the limit.
			tr, err = f.eng.BeginQueued(ctx, "seq0")
			if err != nil {
				t.Fatalf("a delivery pass at the limit: %v", err)
			}
			if run := tr.Stream(ctx, io.Discard); run.Status != agent.RunCompleted || run.Trigger != agent.TriggerQueued {
				t.Fatalf("the delivery pass: %s %s", run.Status, run.Trigger)
			}
			if run := <-done; run.Status != agent.RunCompleted {
				t.Fatalf("the busy run: %s", run.Status)
			}
			// The busy run's end wakes a delivery pass for the message queued behind it, which takes the slot the
			// run gave back while it answers: the user's next run gets in once that pass is over too. The deadline
			// only turns a slot never given back into a failure (as deliverAll's), it is no measure of how soon.
			deadline := time.Now().Add(2 * time.Minute)
			for {
				tr, err := f.eng.Begin(ctx, submit("other", "u1", "hello"))
				if err == nil {
					if run := tr.Stream(ctx, io.Discard); run.Status != agent.RunCompleted {
						t.Fatalf("after the busy run ended: %s", run.Status)
					}
					break
				}
				if !errors.Is(err, agent.ErrTooManyRuns) || time.Now().After(deadline) {
					t.Fatalf("after the busy run and its delivery pass: %v", err)
				}
				time.Sleep(20 * time.Millisecond)
			}
		})
	}
}

// New threads per minute: the first message of a new thread counts, messages to existing threads do not; over
// the limit the request is refused until the minute ends (RetryAfter is the rest of it), writing nothing and
// holding no run slot; another user has a count of their own.
func TestThreadsPerMinute(t *testing.T) {
	t.Parallel()
	for name, store := range limitStores(t) {
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			clock := newManualClock()
			f := setup(t, store(t), withClock(clock), withConfig(func(c *config.Config) { c.ThreadsPerMinute = 2; c.MaxActiveRunsPerUser = 1 }))
			ctx := context.Background()
			for _, id := range []string{"a", "b", "a", "b"} {
				if run, _ := f.turn(t, id, "u-"+fmt.Sprint(clock.Now().UnixNano()), "hello"); run.Status != agent.RunCompleted {
					t.Fatalf("turn on %s: %s", id, run.Status)
				}
				clock.add(time.Second)
			}
			// 05:06:16.5 now: the minute ends in 43.5 s.
			_, err := f.eng.Begin(ctx, submit("c", "u1", "hello"))
			if ra := wantLimited(t, err, agent.CodeThreadRateLimited, time.Minute); ra != 43*time.Second+500*time.Millisecond {
				t.Fatalf("RetryAfter %s, want 43.5s (the rest of the minute)", ra)
			}
			f.noThread(t, "c")
			// The refused request gave its run slot back (the limit is 1).
			if run, _ := f.turn(t, "a", "u9", "still here"); run.Status != agent.RunCompleted {
				t.Fatalf("a message to an existing thread after the refusal: %s", run.Status)
			}
			bob := submit("bob-1", "u1", "hi")
			bob.Owner = "bob"
			if run, _ := f.run(t, bob); run.Status != agent.RunCompleted {
				t.Fatalf("bob's new thread: %s", run.Status)
			}
			clock.add(43*time.Second + 500*time.Millisecond)
			if run, _ := f.turn(t, "c", "u1", "hello"); run.Status != agent.RunCompleted {
				t.Fatalf("in the next minute: %s", run.Status)
			}
		})
	}
}

// A delivery pass takes a free slot; one that finds nothing to answer (its queued message is in the thread
// already) gives it back at once, so the user's next run is not refused.
func TestEmptyDeliveryPassGivesItsSlotBack(t *testing.T) {
	t.Parallel()
	// No reaper ticks: its sweep of queues would start the delivery pass this test starts itself.
	f := setup(t, withConfig(func(c *config.Config) { c.MaxActiveRunsPerUser = 1; c.ReaperInterval = time.Hour }))
	ctx := context.Background()
	if run, _ := f.turn(t, "th", "u1", "hello"); run.Status != agent.RunCompleted {
		t.Fatal(run.Status)
	}
	q := agent.QueuedMessage{ThreadID: "th", Kind: agent.QueueUser, Message: *userMsg("u1", "hello"), Owner: "alice",
		Status: agent.QueueQueued, CreatedAt: time.Now().UTC().Truncate(time.Millisecond)}
	if _, _, err := f.store.Enqueue(ctx, q, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := f.eng.BeginQueued(ctx, "th"); !errors.Is(err, engine.ErrNothingQueued) {
		t.Fatalf("a pass over a message the thread holds: %v, want ErrNothingQueued", err)
	}
	if run, _ := f.turn(t, "th2", "u1", "hello"); run.Status != agent.RunCompleted {
		t.Fatalf("the next run after the empty pass: %s", run.Status)
	}
}
