package httpapi_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// segmentReads signals the first read of a watched run's stream segments: the moment a reader attached through
// GET /chat/{id}/stream starts following that run.
type segmentReads struct {
	agent.Store
	mu      sync.Mutex
	watched map[string]chan struct{}
}

func (s *segmentReads) wrap(st agent.Store) agent.Store {
	s.Store = st
	return s
}

// watch returns a channel closed at the first ListSegments of runID.
func (s *segmentReads) watch(runID string) <-chan struct{} {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.watched == nil {
		s.watched = map[string]chan struct{}{}
	}
	ch := make(chan struct{})
	s.watched[runID] = ch
	return ch
}

func (s *segmentReads) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	s.mu.Lock()
	if ch, ok := s.watched[runID]; ok {
		close(ch)
		delete(s.watched, runID)
	}
	s.mu.Unlock()
	return s.Store.ListSegments(ctx, runID, from, now)
}

// storedStream is a run's stream as its segments hold it (what every reader is served).
func (h *hitlStack) storedStream(runID string) []byte {
	h.t.Helper()
	segs, err := h.stack.Store.ListSegments(context.Background(), runID, 0, time.Now())
	if err != nil {
		h.t.Fatal(err)
	}
	var b []byte
	for _, s := range segs {
		b = append(b, s.Data...)
	}
	if len(segs) == 0 || !segs[len(segs)-1].Final {
		h.t.Fatalf("run %s: %d segments, no final one", runID, len(segs))
	}
	return b
}

// The streams of sub-agent delivery parse under ai@6 and ai@7 and reduce to the reply the server stored: a steer
// turn as the wake writes it and as a reader attached through GET /chat/{id}/stream while it runs gets it
// (byte for byte the same, and the same as its stored segments); the steer turn of a real job's wake; and a
// user turn that coalesced a steer (a question was pending when the job finished).
func TestProtocolConformanceJobs(t *testing.T) {
	t.Parallel()
	reads := &segmentReads{}
	h := startHITL(t, nil, func(h *hitlStack) { h.wrap = reads.wrap })
	ctx := context.Background()

	// A steer turn with a reader attached from its first byte. The test makes the wake's own two calls
	// (jobs.Tasks.Drain: BeginQueued, then Stream) so that it can attach between the claim and the first chunk.
	h.send("conf-steer", "u1", "hello")
	j := h.finishedJob("conf-steer", "call_1", "brief for the client")
	if _, _, err := h.stack.Store.Enqueue(ctx, agent.QueuedMessage{ThreadID: "conf-steer", Kind: agent.QueueSteer, Message: steerOf(t, h, j),
		JobID: j.ID, Status: agent.QueueQueued, CreatedAt: time.Now().UTC()}, 0); err != nil {
		t.Fatal(err)
	}
	turn, err := h.stack.Engine.BeginQueued(ctx, "conf-steer")
	if err != nil {
		t.Fatal(err)
	}
	v := h.jobsView("conf-steer")
	if v.ActiveRun == nil || v.ActiveRun.Trigger != agent.TriggerSteer {
		t.Fatalf("the delivery pass's run: %+v", v.ActiveRun)
	}
	steerRun := *v.ActiveRun
	following := reads.watch(steerRun.ID)
	attached := make(chan string, 1)
	go func() {
		req, _ := http.NewRequest("GET", h.server.URL+"/chat/conf-steer/stream", nil)
		req.Header.Set("Authorization", "Bearer "+token(t, "alice"))
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			attached <- err.Error()
			return
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		attached <- fmt.Sprint(resp.StatusCode, "\n", string(b))
	}()
	select {
	case <-following:
	case <-time.After(10 * time.Second):
		t.Fatal("the reader did not attach")
	}
	var wrote bytes.Buffer
	if run := turn.Stream(ctx, &wrote); run.Status != agent.RunCompleted {
		t.Fatalf("steer turn: %+v", run)
	}
	status, got, _ := strings.Cut(<-attached, "\n")
	if status != "200" || got != wrote.String() {
		t.Fatalf("attached reader: %s\n%s\nthe wake wrote:\n%s", status, got, wrote.Bytes())
	}
	if stored := h.storedStream(steerRun.ID); !bytes.Equal(stored, wrote.Bytes()) {
		t.Fatalf("stored segments:\n%s\nthe wake wrote:\n%s", stored, wrote.Bytes())
	}

	// A real job: dispatched by the research tool, run by the local runner, delivered by its wake into the idle
	// thread (its stream goes to io.Discard and the segments).
	h.send("conf-wake", "u1", `/tool research {"question":"What is Go? See [The Go site](https://go.dev)"}`)
	h.settled("conf-wake")
	runs := h.runs("conf-wake")
	if len(runs) != 2 || runs[1].Trigger != agent.TriggerSteer {
		t.Fatalf("runs: %+v", runs)
	}
	wakeRun := runs[1]

	// A steer that waited behind a pending question, carried by the next user message's turn.
	id := h.addNote("conf")
	h.send("conf-coalesce", "u1", fmt.Sprintf(`/tool delete_note {"id":%q}`, id))
	if out := h.deliver(h.finishedJob("conf-coalesce", "call_1", "brief coalesced")); out.Status != agent.DeliveredQueued {
		t.Fatalf("delivery while a question is pending: %+v", out)
	}
	coalesced := h.send("conf-coalesce", "u2", "never mind")
	runs = h.runs("conf-coalesce")
	if len(runs) != 2 || runs[1].Trigger != agent.TriggerUser {
		t.Fatalf("runs: %+v", runs)
	}
	coalescedRun := runs[1]

	cases := []struct {
		name   string
		stream []byte
		run    agent.Run
		thread string
		brief  string
	}{
		{"steer turn, as the wake writes it", wrote.Bytes(), steerRun, "conf-steer", "brief for the client"},
		{"steer turn, attached", []byte(got), steerRun, "conf-steer", "brief for the client"},
		{"steer turn of a real job's wake, stored", h.storedStream(wakeRun.ID), wakeRun, "conf-wake", "What is Go?"},
		{"user turn that coalesced a steer", []byte(coalesced), coalescedRun, "conf-coalesce", "brief coalesced"},
	}
	bodies := make([][]byte, len(cases))
	for i, c := range cases {
		bodies[i] = c.stream
	}
	parsed := aisdktest.CheckStreams(t, bodies...)
	if len(parsed) != len(aisdktest.SDKs)*len(cases) {
		t.Fatalf("%d results", len(parsed))
	}
	for i, c := range cases {
		stored := h.view(c.thread).Messages
		reply := stored[len(stored)-1]
		for _, p := range aisdktest.OfFile(parsed, i) {
			text := p.Message.Text()
			if p.Message.ID != c.run.AssistantMessageID || reply.ID != c.run.AssistantMessageID || p.FinishReason != "stop" || len(p.Errors) != 0 {
				t.Fatalf("%s under ai@%s: message %s (run %s made %s, the thread ends with %s), finish %q, errors %v",
					c.name, p.SDK, p.Message.ID, c.run.ID, c.run.AssistantMessageID, reply.ID, p.FinishReason, p.Errors)
			}
			if !strings.HasPrefix(text, "You said: Research complete.") || !strings.Contains(text, c.brief) || text != reply.Text() {
				t.Fatalf("%s under ai@%s: text %q, stored %q", c.name, p.SDK, text, reply.Text())
			}
			if md := p.Message.Meta(); md.RunID != c.run.ID || md.Status != agent.MessageCompleted || md.Usage == nil {
				t.Fatalf("%s under ai@%s: metadata %s", c.name, p.SDK, p.Message.Metadata)
			}
			var stored, client []string
			for _, raw := range reply.Parts {
				part, _ := agent.DecodePart(raw)
				stored = append(stored, part.Type)
			}
			parts, err := p.Parts()
			if err != nil {
				t.Fatal(err)
			}
			for _, part := range parts {
				client = append(client, part.Type)
			}
			if s, c2 := fmt.Sprint(stored), fmt.Sprint(client); s != c2 {
				t.Fatalf("%s under ai@%s: parts %s, stored %s", c.name, p.SDK, c2, s)
			}
		}
	}
	// The steer itself is a user message in the thread, never a chunk of the assistant's stream.
	for _, c := range cases {
		if bytes.Contains(c.stream, []byte("subagent")) || bytes.Contains(c.stream, []byte(agent.SteerMessageID(""))) {
			t.Fatalf("%s: the stream mentions the steer: %s", c.name, c.stream)
		}
	}
}
