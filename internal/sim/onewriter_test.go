package sim

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// threadStore is a base store whose thread is what the test says it is now.
type threadStore struct {
	agent.Store
	th *agent.Thread
}

func (s threadStore) GetThread(context.Context, string) (agent.Thread, error) { return *s.th, nil }

// TestOneWriterFinishRunAfterOwnReleaseInDoubt is the one-writer check on DynamoDB's two-write FinishRun (fence
// C), seed 3334903252909217568 (dynalite soak): a FinishRun whose release applied and whose outcome write lost
// its answers fails, and the engine's next FinishRun records the outcome with no claim naming the run. That is
// the run's own release, not another writer: the check passes it while the thread is idle at the run's epoch,
// and still fires once anyone took the thread since (a reaper's takeover, a claim: both move the epoch).
func TestOneWriterFinishRunAfterOwnReleaseInDoubt(t *testing.T) {
	f := agent.Fence{RunID: "run_a", Epoch: 1}
	ours := agent.Thread{ID: "th", Epoch: 1, ActiveRun: &agent.Claim{RunID: "run_a", Epoch: 1}}
	for _, tc := range []struct {
		name     string
		retry    agent.Thread // the thread when the second FinishRun is made
		violates bool
	}{
		{"idle at the run's epoch", agent.Thread{ID: "th", Epoch: 1}, false},
		{"a reaper took the thread and released it", agent.Thread{ID: "th", Epoch: 2}, true},
		{"another run holds the thread", agent.Thread{ID: "th", Epoch: 2, ActiveRun: &agent.Claim{RunID: "run_b", Epoch: 2}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			th := ours
			w := &world{base: threadStore{th: &th}, clock: &vclock{t: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)}}
			p := &proc{w: w, name: "regen#2"}
			// The first FinishRun: the release applied (ours before, idle at the run's epoch after), the outcome
			// write's answers were lost.
			before := th
			th = agent.Thread{ID: "th", Epoch: 1}
			w.checkOwnWrite(p, "FinishRun", "first", f, "th", before, true, errors.New("store_unavailable"))
			// Whatever happened in between; the retry records the outcome.
			th = tc.retry
			w.checkOwnWrite(p, "FinishRun", "retry", f, "th", tc.retry, true, nil)
			got := len(w.violates) > 0
			if got != tc.violates {
				t.Fatalf("violations %q, want a one-writer violation: %v", w.violates, tc.violates)
			}
			for _, v := range w.violates {
				if !strings.HasPrefix(v, "one-writer: ") {
					t.Fatalf("violation %q, want one-writer", v)
				}
			}
		})
	}
}
