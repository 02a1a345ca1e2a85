package boot

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"testing"

	"github.com/aws/aws-lambda-go/events"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/lambdalaunch"
)

type continuer struct {
	http.Handler
	got []agent.Continuation
	err error
}

func (c *continuer) Continue(_ context.Context, k agent.Continuation) (agent.Run, error) {
	c.got = append(c.got, k)
	return agent.Run{ID: k.RunID, Status: agent.RunCompleted}, c.err
}

// The chat function's one handler takes both payloads: a continuation event continues its run, and a function URL
// request is served, streaming, as lambdaurl serves it.
func TestDispatchTellsContinuationsFromRequests(t *testing.T) {
	t.Parallel()
	c := &continuer{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(http.StatusTeapot)
		io.WriteString(w, r.Method+" "+r.URL.Path)
	})}
	h := Dispatch(c)
	want := agent.Continuation{ThreadID: "th", RunID: "run_1", Epoch: 2, Segment: 5, Steps: 1, HandOvers: 1}
	ev, _ := json.Marshal(lambdalaunch.Event{Kind: lambdalaunch.EventKind, Continuation: want})
	out, err := h(context.Background(), ev)
	if err != nil || len(c.got) != 1 || c.got[0] != want {
		t.Fatalf("continuation event: %v, continued %+v; want %+v", err, c.got, want)
	}
	if m, _ := out.(map[string]any); m["status"] != agent.RunCompleted {
		t.Fatalf("continuation answered %#v", out)
	}

	req, _ := json.Marshal(events.LambdaFunctionURLRequest{RawPath: "/chat",
		RequestContext: events.LambdaFunctionURLRequestContext{DomainName: "x.lambda-url.aws", HTTP: events.LambdaFunctionURLRequestContextHTTPDescription{Method: "POST"}}})
	out, err = h(context.Background(), req)
	resp, ok := out.(*events.LambdaFunctionURLStreamingResponse)
	if err != nil || !ok || resp.StatusCode != http.StatusTeapot {
		t.Fatalf("function URL request: %#v, %v; want the handler's streaming response", out, err)
	}
	body, _ := io.ReadAll(resp.Body)
	if string(body) != "POST /chat" || len(c.got) != 1 {
		t.Fatalf("function URL request served %q (continuations %d)", body, len(c.got))
	}

	// A continuation whose run moved on is done; another failure fails the invocation (Lambda retries it).
	c.err = agent.E(agent.KindConflict, agent.CodeRunFenced, "moved on")
	if _, err := h(context.Background(), ev); err != nil {
		t.Fatalf("fenced continuation: %v, want success (nothing to do)", err)
	}
	c.err = errors.New("store down")
	if _, err := h(context.Background(), ev); err == nil {
		t.Fatal("failed continuation: nil error, want the invocation failed")
	}
}
