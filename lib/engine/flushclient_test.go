package engine_test

import (
	"bytes"
	"context"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// pacedModel emits "a " with More (its next word is at hand), "b " without, then waits for the test before "c ".
type pacedModel struct{ next chan struct{} }

func (m *pacedModel) Stream(ctx context.Context, _ agent.ModelRequest, emit func(agent.ModelEvent) error) (agent.ModelResult, error) {
	for _, ev := range []agent.ModelEvent{{Type: agent.EventTextDelta, Delta: "a ", More: true}, {Type: agent.EventTextDelta, Delta: "b "}} {
		if err := emit(ev); err != nil {
			return agent.ModelResult{}, err
		}
	}
	select {
	case <-m.next:
	case <-ctx.Done():
		return agent.ModelResult{}, ctx.Err()
	}
	if err := emit(agent.ModelEvent{Type: agent.EventTextDelta, Delta: "c "}); err != nil {
		return agent.ModelResult{}, err
	}
	return agent.ModelResult{FinishReason: agent.FinishStop, Usage: agent.Usage{InputTokens: 1, OutputTokens: 3, TotalTokens: 4}}, nil
}

// flushRecorder is a client that notes how much of the stream each flush had sent.
type flushRecorder struct {
	httptest.ResponseRecorder
	mu      sync.Mutex
	flushed []int
	wrote   chan struct{}
}

func (r *flushRecorder) Write(b []byte) (int, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.ResponseRecorder.Write(b)
}

func (r *flushRecorder) Flush() {
	r.mu.Lock()
	r.flushed = append(r.flushed, r.Body.Len())
	r.mu.Unlock()
	select {
	case r.wrote <- struct{}{}:
	default:
	}
}

// sent is what the flushes had sent so far.
func (r *flushRecorder) sent() []byte {
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.flushed) == 0 {
		return nil
	}
	return bytes.Clone(r.Body.Bytes()[:r.flushed[len(r.flushed)-1]])
}

// A model's words reach the client before the model waits (here, for the test): the frames of an event with More
// go out with the next event's, in one flush, and those of an event without More at once.
func TestWordsReachTheClientBeforeTheModelWaits(t *testing.T) {
	t.Parallel()
	f := setup(t)
	model := &pacedModel{next: make(chan struct{})}
	eng := engine.New(engine.Deps{Store: f.store, Model: model, Tools: f.stack.Tools, Reaper: f.stack.Reaper, Signer: f.stack.Signer,
		Clock: f.clock}, f.eng.Config())
	tr, err := eng.Begin(context.Background(), submit("paced", "m1", "hi"))
	if err != nil {
		t.Fatal(err)
	}
	client := &flushRecorder{ResponseRecorder: *httptest.NewRecorder(), wrote: make(chan struct{}, 1)}
	ran := make(chan agent.Run, 1)
	go func() { ran <- tr.Stream(context.Background(), client) }()

	deltaB := []byte(`"delta":"b "`)
	for !bytes.Contains(client.sent(), deltaB) {
		select {
		case <-client.wrote:
		case <-time.After(30 * time.Second): // the model waits until the test sees b: a b held back never comes
			t.Fatalf("the client never received b while the model waited; it has %q", client.sent())
		}
	}
	close(model.next)
	if run := <-ran; run.Status != agent.RunCompleted {
		t.Fatalf("run %s %+v", run.Status, run.Error)
	}
	body := client.Body.Bytes()
	endA := bytes.Index(body, []byte(`"delta":"a "`))
	endA += bytes.IndexByte(body[endA:], '\n') + 2 // the end of a's frame
	client.mu.Lock()
	defer client.mu.Unlock()
	for _, n := range client.flushed {
		if n == endA {
			t.Fatalf("a was flushed on its own, though the model had b at hand (More)")
		}
	}
	if got := textOf(parseSSE(t, body)); got != "a b c " {
		t.Fatalf("text %q", got)
	}
}
