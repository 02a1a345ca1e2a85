package engine_test

import (
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/signals"
	"github.com/agentloop/agentloop/lib/webhooks"
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

// aheadClock reads the real clock an hour on: a later sweep, for signals due at once.
type aheadClock struct{}

func (aheadClock) Now() time.Time { return time.Now().Add(time.Hour) }

// A run refused after its claim (a duplicate message) answers its caller first and leaves its signal to the sweep,
// due at once: the next sweep (here another process's) delivers it failed, with the refusal's code.
func TestRefusedRunSignalsThroughTheSweep(t *testing.T) {
	t.Parallel()
	rcv := webhookstest.New(t, 0)
	f := setup(t, withWebhook(rcv))
	f.turn(t, "th_signal_refused", "u1", "hello")
	if _, err := f.eng.Begin(context.Background(), submit("th_signal_refused", "u1", "hello")); agent.CodeOf(err) != agent.CodeDuplicateMessage {
		t.Fatalf("err = %v, want duplicate_message", err)
	}
	f.stack.Signals.Wait()
	if n := len(rcv.Delivered()); n != 1 {
		t.Fatalf("receiver took %d before the sweep, want the first run's only", n)
	}
	runs, err := f.store.ListRuns(context.Background(), "th_signal_refused")
	if err != nil || len(runs) != 2 || runs[1].Signal == nil || runs[1].Signal.Status != agent.SignalPending ||
		!runs[1].Signal.DueAt.Equal(runs[1].FinishedAt) {
		t.Fatalf("runs %+v %v: want the refused one's signal pending, due at its end", runs, err)
	}
	hook, err := webhooks.New(webhooks.Config{URL: rcv.URL, Secret: webhookstest.Secret})
	if err != nil {
		t.Fatal(err)
	}
	sweeper := signals.New(signals.Deps{Store: f.store, Sinks: []agent.SignalSink{hook}, Clock: aheadClock{}}, signals.Config{})
	if n, err := sweeper.Sweep(context.Background()); n != 1 || err != nil {
		t.Fatalf("sweep delivered %d, %v; want 1", n, err)
	}
	taken := rcv.Delivered()
	var d agent.SignalDetail
	if err := json.Unmarshal(taken[len(taken)-1].Data, &d); err != nil {
		t.Fatal(err)
	}
	if d.RunID != runs[1].ID || d.Status != "failed" || d.ErrorCode != agent.CodeDuplicateMessage {
		t.Fatalf("signal %+v: want the refused run failed with duplicate_message", d)
	}
}
