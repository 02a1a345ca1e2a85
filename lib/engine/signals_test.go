package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/webhooks/webhookstest"
)

// withWebhook points the stack's completion signals at rcv.
func withWebhook(rcv *webhookstest.Receiver) option {
	return withConfig(func(c *config.Config) { c.WebhookURL, c.WebhookSecret = rcv.URL, webhookstest.Secret })
}

// The receiver is down: the run ends exactly as it would without signals (completed, its stream ended with finish
// and [DONE], its outcome stored), and its signal stays pending in the run item for the sweep. With the receiver
// up, the next run's signal is delivered by the run itself: signed, status completed, the usage, no message text.
func TestSignalsNeverChangeTheRun(t *testing.T) {
	t.Parallel()
	rcv := webhookstest.New(t, 0)
	rcv.Down(true)
	f := setup(t, withWebhook(rcv))
	run, chunks := f.turn(t, "th_signal_down", "u1", "hello there")
	if run.Status != agent.RunCompleted || run.Error != nil {
		t.Fatalf("run %s %+v: want completed", run.Status, run.Error)
	}
	if last := chunks[len(chunks)-1]; last["type"] != "finish" {
		t.Fatalf("stream ends with %v, want finish", last)
	}
	f.stack.Signals.Wait()
	stored, err := f.store.GetRun(context.Background(), "th_signal_down", run.ID)
	if err != nil {
		t.Fatal(err)
	}
	if stored.Status != agent.RunCompleted || stored.Error != nil || stored.Usage != run.Usage {
		t.Fatalf("stored run %+v: want completed with the run's usage", stored)
	}
	if stored.Signal == nil || stored.Signal.Status != agent.SignalPending || stored.Signal.Owner != "alice" {
		t.Fatalf("signal %+v: want pending (the receiver is down), owner alice", stored.Signal)
	}
	if n := len(rcv.Requests()); n != 1 {
		t.Fatalf("%d attempts, want the run's own one", n)
	}

	rcv.Down(false)
	run2, _ := f.turn(t, "th_signal_down", "u2", "and again")
	f.stack.Signals.Wait()
	taken := rcv.Delivered()
	if len(taken) != 1 {
		t.Fatalf("receiver took %d signals, want 1", len(taken))
	}
	var d agent.SignalDetail
	if err := json.Unmarshal(taken[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.RunID != run2.ID || d.Status != "completed" || d.Owner != "alice" || d.Usage.TotalTokens != run2.Usage.TotalTokens || d.Usage.TotalTokens == 0 {
		t.Fatalf("signal %+v, want run %s completed with its usage", d, run2.ID)
	}
	if body := string(rcv.Requests()[1].Body); strings.Contains(body, "again") || strings.Contains(body, "You said") {
		t.Fatalf("the signal carries message text: %s", body)
	}
	stored, _ = f.store.GetRun(context.Background(), "th_signal_down", run2.ID)
	if stored.Signal == nil || stored.Signal.Status != agent.SignalDelivered {
		t.Fatalf("signal %+v: want delivered", stored.Signal)
	}
}

// A failed run signals failed with its error code; a canceled one canceled (any status signals).
func TestSignalsOfFailedRuns(t *testing.T) {
	t.Parallel()
	rcv := webhookstest.New(t, 0)
	f := setup(t, withWebhook(rcv))
	run, _ := f.turn(t, "th_signal_failed", "u1", "/error 500")
	if run.Status != agent.RunFailed {
		t.Fatalf("run %s, want failed", run.Status)
	}
	f.stack.Signals.Wait()
	taken := rcv.Delivered()
	if len(taken) != 1 {
		t.Fatalf("receiver took %d, want 1", len(taken))
	}
	var d agent.SignalDetail
	if err := json.Unmarshal(taken[0].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.Status != "failed" || d.ErrorCode != run.Error.Code || d.ErrorCode == "" {
		t.Fatalf("signal %+v, want failed with %s", d, run.Error.Code)
	}
}
