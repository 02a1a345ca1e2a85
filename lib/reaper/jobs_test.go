package reaper_test

import (
	"context"
	"encoding/json"
	"errors"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/sqlite"
)

// fakeClock is a clock the test moves.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

// starts is a Jobs port that records starts (failing while fail is set) and runs nothing.
type starts struct {
	mu    sync.Mutex
	at    []time.Time
	clock agent.Clock
	fail  bool
}

func (s *starts) Start(context.Context, agent.Job) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.at = append(s.at, s.clock.Now())
	if s.fail {
		return agent.E(agent.KindUnavailable, agent.CodeJobsUnavailable, "ExecutionLimitExceeded")
	}
	return nil
}

func (s *starts) Wake(context.Context, agent.JobTask) error { return nil }

func (s *starts) list() []time.Time {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]time.Time(nil), s.at...)
}

// REVIEW H3: a job whose Start failed stayed running with no execution, the reaper never started it, and 31 min
// later failed it ("did not report back in time"). Now the dispatch acknowledges it (the job exists and will
// run), the reaper starts it again once its start is due, and fails it only past its execution's deadline.
func TestReaperStartsAJobThatNeverStarted(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)}
	js := &starts{clock: clock, fail: true}
	contract := agent.DefaultJobContract()
	d := jobs.Dispatcher{Store: st, Jobs: js, Clock: clock, Contract: contract}
	rp := reaper.New(reaper.Deps{Store: st, Tools: d.Tools(jobs.NewRegistry(jobs.Research())), Jobs: js, Clock: clock},
		reaper.Config{DeliveryGrace: contract.DeliveryGrace, StartDue: contract.StartDue, ExecutionTimeout: contract.ExecutionTimeout})
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: clock.Now(), UpdatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	research := d.Tools(jobs.NewRegistry(jobs.Research()))[0]
	out, err := research.Execute(ctx, agent.ToolInvocation{ThreadID: "th", Owner: "alice", RunID: "run_1", ToolCallID: "call_1",
		Input: json.RawMessage(`{"question":"what is Go?"}`)})
	if err != nil {
		t.Fatalf("a failed Start fails the call (%v): the job stays running with no execution", err)
	}
	var ack jobs.Ack
	if err := json.Unmarshal(out, &ack); err != nil || ack.JobID == "" {
		t.Fatalf("ack %s: %v", out, err)
	}
	js.mu.Lock()
	js.fail = false
	js.mu.Unlock()
	created := clock.Now()
	deadline := created.Add(contract.ExecutionTimeout + contract.DeliveryGrace)
	for clock.Now().Before(deadline.Add(2 * time.Minute)) {
		clock.add(time.Minute)
		if _, err := rp.Tick(ctx); err != nil {
			t.Fatal(err)
		}
		j, err := st.GetJob(ctx, "th", ack.JobID)
		if err != nil {
			t.Fatal(err)
		}
		if j.Failed() && clock.Now().Before(deadline) {
			t.Fatalf("the job failed at %s (%q), before its execution's deadline %s", clock.Now().Sub(created), j.Error, deadline.Sub(created))
		}
		if s := js.list(); len(s) < 2 && clock.Now().Sub(created) > contract.StartDue+time.Minute {
			t.Fatalf("no Start again %s after the failed one (starts at %v)", clock.Now().Sub(created), s)
		}
	}
	j, err := st.GetJob(ctx, "th", ack.JobID)
	if err != nil || !j.Failed() {
		t.Fatalf("job %+v (%v): a job that never reported back is failed past its deadline", j, err)
	}
	// Started again while its start was due, not once a sweep.
	if n := len(js.list()); n < 3 || n > 2+int(contract.ExecutionTimeout/contract.StartDue)+1 {
		t.Fatalf("%d starts, want one per start window", n)
	}
}

// The sub-agent task moves its job's deadline from its start's to its execution's before it runs, so the
// reaper leaves a job that is running alone.
func TestSubagentMovesTheStartDeadline(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st, err := sqlite.Open(ctx, filepath.Join(t.TempDir(), "db"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clock := &fakeClock{now: time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC)}
	contract := agent.DefaultJobContract()
	var due time.Time
	kind := jobs.Kind{Name: "probe", Run: func(ctx context.Context, env jobs.Env, input json.RawMessage) (json.RawMessage, error) {
		j, err := st.GetJob(ctx, "th", "job_probe")
		due = j.DueAt
		return json.RawMessage(`{}`), err
	}}
	if _, _, err := st.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: clock.Now(), UpdatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := st.CreateJob(ctx, agent.Job{ID: "job_probe", ThreadID: "th", Owner: "alice", Kind: "probe", ToolCallID: "call_1",
		Status: agent.JobRunning, DueAt: clock.Now().Add(contract.StartDue), CreatedAt: clock.Now(), UpdatedAt: clock.Now()}); err != nil {
		t.Fatal(err)
	}
	clock.add(5 * time.Minute) // started late (the reaper's second start)
	tasks := jobs.NewTasks(jobs.Deps{Store: st, Kinds: jobs.NewRegistry(kind), Clock: clock}, jobs.Config{Contract: contract})
	if _, err := tasks.Subagent(ctx, agent.JobTask{ThreadID: "th", JobID: "job_probe"}); err != nil && !errors.Is(err, context.Canceled) {
		t.Fatal(err)
	}
	if want := clock.Now().Add(contract.ExecutionTimeout + contract.DeliveryGrace); !due.Equal(want) {
		t.Fatalf("while the task ran the job was due at %s, want its execution's deadline %s", due, want)
	}
}
