package localjobs_test

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobstest"
	"github.com/agentloop/agentloop/lib/localjobs"
)

func TestConformance(t *testing.T) {
	jobstest.Run(t, func(t *testing.T, _ string, tasks jobstest.Tasks) jobstest.Adapter {
		r := localjobs.New(localjobs.Tasks(tasks), jobstest.Contract(), slog.New(slog.NewTextHandler(testWriter{t}, nil)))
		t.Cleanup(func() { _ = r.Close(context.Background()) })
		return jobstest.Adapter{Jobs: r, Wait: r.Wait}
	})
}

// testWriter sends the runner's log to the test's.
type testWriter struct{ t *testing.T }

func (w testWriter) Write(p []byte) (int, error) {
	w.t.Log(strings.TrimSpace(string(p)))
	return len(p), nil
}

// setup is a runner under the suite's contract whose sub-agent is fn and whose delivery records its inputs.
func setup(t *testing.T, fn func(ctx context.Context, in agent.JobTask) (agent.JobTask, error)) (*localjobs.Runner, chan agent.JobTask) {
	t.Helper()
	got := make(chan agent.JobTask, 16)
	r := localjobs.New(localjobs.Tasks{
		Subagent: fn,
		Deliver: func(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
			got <- in
			return agent.DeliveryResult{ThreadID: in.ThreadID, Status: agent.DeliveredSteer}, nil
		},
	}, jobstest.Contract(), nil)
	t.Cleanup(func() { _ = r.Close(context.Background()) })
	return r, got
}

func job(id string) agent.Job {
	return agent.Job{ID: id, ThreadID: "thr_1", Kind: "research", ToolCallID: "tc"}
}

// Zero fields take the deployed contract's values.
func TestZeroContractTakesDefaults(t *testing.T) {
	t.Parallel()
	r := localjobs.New(localjobs.Tasks{}, agent.JobContract{TaskRetries: 1}, nil)
	want := agent.DefaultJobContract()
	want.TaskRetries = 1
	if got := r.Contract(); got != want {
		t.Fatalf("contract = %+v, want %+v", got, want)
	}
}

// Errors are named by their outermost type, as the Lambda runtime and Step Functions name them: a wrapped
// TransientError is not retried, and a panic is a failure named by the panic value's type.
func TestErrorNames(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name     string
		err      func() error
		attempts int32
		want     string
	}{
		{"transient", func() error { return &agent.TransientError{Err: errors.New("x")} }, 3, "TransientError"},
		{"wrapped transient", func() error { return fmt.Errorf("ctx: %w", &agent.TransientError{Err: errors.New("x")}) }, 1, "wrapError"},
		{"plain", func() error { return errors.New("x") }, 1, "errorString"},
		{"panic", func() error { panic("boom") }, 1, "string"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			var n atomic.Int32
			r, got := setup(t, func(context.Context, agent.JobTask) (agent.JobTask, error) {
				n.Add(1)
				return agent.JobTask{}, tc.err()
			})
			if err := r.Start(context.Background(), job("job_"+strings.ReplaceAll(tc.name, " ", "_"))); err != nil {
				t.Fatal(err)
			}
			in := <-got
			if in.Failure == nil || in.Failure.Error != tc.want || n.Load() != tc.attempts {
				t.Fatalf("failure %+v after %d attempts, want %s after %d", in.Failure, n.Load(), tc.want, tc.attempts)
			}
		})
	}
}

// Close refuses new executions, waits for those in flight until its context ends, then cancels them: the
// execution stops without delivering (the reaper re-drives the job), even when the task ignores its context.
func TestCloseCancelsWhatOutlastsIt(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	defer close(release)
	r, got := setup(t, func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
		<-release // ignores its context
		return in, nil
	})
	if err := r.Start(context.Background(), job("job_close")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	// The task holds until the test ends: Close returning at all shows it did not wait for it (no wall-clock
	// bound on how soon: on a loaded machine that is a race between timers).
	if err := r.Close(ctx); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("Close = %v, want its context's deadline", err)
	}
	if err := r.Start(context.Background(), job("job_after")); !agent.IsKind(err, agent.KindUnavailable) {
		t.Fatalf("Start after Close = %v, want KindUnavailable", err)
	}
	select {
	case in := <-got:
		t.Fatalf("delivery ran after Close canceled the execution: %+v", in)
	case <-time.After(50 * time.Millisecond):
	}
}

// Wait honours its context.
func TestWaitHonoursContext(t *testing.T) {
	t.Parallel()
	r, _ := setup(t, func(ctx context.Context, in agent.JobTask) (agent.JobTask, error) {
		<-ctx.Done()
		return in, ctx.Err()
	})
	if err := r.Start(context.Background(), job("job_wait")); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.Wait(ctx); !errors.Is(err, context.Canceled) {
		t.Fatalf("Wait = %v, want context.Canceled", err)
	}
}
