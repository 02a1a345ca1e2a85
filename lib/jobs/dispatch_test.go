package jobs_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/sqlite"
)

type fixedClock struct{ t time.Time }

func (c fixedClock) Now() time.Time { return c.t }

// noStarts is a Jobs port that starts nothing.
type noStarts struct{}

func (noStarts) Start(context.Context, agent.Job) error    { return nil }
func (noStarts) Wake(context.Context, agent.JobTask) error { return nil }

// failingCreate fails the first CreateJob: applied (the write lands, its answer is lost) or not.
type failingCreate struct {
	agent.JobStore
	applied bool
	failed  bool
}

func (s *failingCreate) CreateJob(ctx context.Context, j agent.Job) (agent.Job, bool, error) {
	if s.failed {
		return s.JobStore.CreateJob(ctx, j)
	}
	s.failed = true
	if s.applied {
		if _, _, err := s.JobStore.CreateJob(ctx, j); err != nil {
			return agent.Job{}, false, err
		}
	}
	return agent.Job{}, false, agent.ErrStoreUnavailable
}

// TestDispatchKeepsTheSlotOfAJobWhoseCreateIsInDoubt: a CreateJob whose outcome is unknown (the job may exist)
// does not give the job's slot back unless the job is known absent; otherwise the user could hold one job more
// than the limit (the simulation's jobs-bounds, seed 2745339543810134158).
func TestDispatchKeepsTheSlotOfAJobWhoseCreateIsInDoubt(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name      string
		applied   bool
		secondErr string // the code of the second dispatch's error ("": dispatched)
	}{
		{name: "the write landed", applied: true, secondErr: agent.CodeTooManyJobs},
		{name: "the write did not land", applied: false},
	}
	stores := map[string]func(t *testing.T) agent.Store{
		"sqlite": func(t *testing.T) agent.Store {
			s, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "db.sqlite"))
			if err != nil {
				t.Fatal(err)
			}
			t.Cleanup(func() { s.Close() })
			return s
		},
		"dynamo": func(t *testing.T) agent.Store {
			client := dynamotest.Client(dynamotest.Start(t))
			table := fmt.Sprintf("threads_%d", time.Now().UnixNano())
			if err := dynamotest.CreateTable(t.Context(), client, table); err != nil {
				t.Fatal(err)
			}
			return dynamo.New(client, table)
		},
	}
	for _, tc := range cases {
		for storeName, open := range stores {
			t.Run(storeName+"/"+tc.name, func(t *testing.T) {
				t.Parallel()
				dispatchWithACreateInDoubt(t, open(t), tc.applied, tc.secondErr)
			})
		}
	}
}

// dispatchWithACreateInDoubt dispatches a job whose CreateJob fails (applied: after the write landed), then a
// second one for the same user, at a limit of one.
func dispatchWithACreateInDoubt(t *testing.T, s agent.Store, applied bool, secondErr string) {
	ctx := t.Context()
	// Near the wall clock: DynamoDB items expire by it.
	now := time.Now().UTC().Truncate(time.Millisecond)
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: "th", Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
		t.Fatal(err)
	}
	store := &failingCreate{JobStore: s, applied: applied}
	d := jobs.Dispatcher{Store: store, Jobs: noStarts{}, Clock: fixedClock{now}, Limits: s, MaxActivePerUser: 1}
	tool := d.Tools(jobs.NewRegistry(jobs.Research()))[0]
	inv := func(call string) agent.ToolInvocation {
		return agent.ToolInvocation{ThreadID: "th", Owner: "alice", RunID: "run_1", Epoch: 1, ToolCallID: call,
			Input: json.RawMessage(`{"question":"tides"}`)}
	}
	if _, err := tool.Execute(ctx, inv("call_1")); err == nil {
		t.Fatal("the first dispatch succeeded although its CreateJob failed")
	}
	_, err := tool.Execute(ctx, inv("call_2"))
	var ae *agent.Error
	switch {
	case secondErr == "" && err != nil:
		t.Fatalf("second dispatch: %v, want dispatched (the first job does not exist: its slot is free)", err)
	case secondErr != "" && (!errors.As(err, &ae) || ae.Code != secondErr):
		t.Fatalf("second dispatch: %v, want %s (the first job exists and holds the only slot)", err, secondErr)
	}
	// A retry of the first call finds its job and holds its slot.
	if _, err := tool.Execute(ctx, inv("call_1")); applied && err != nil {
		t.Fatalf("retried first dispatch: %v", err)
	}
}
