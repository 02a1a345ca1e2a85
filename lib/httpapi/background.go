package httpapi

import (
	"io"
	"net/http"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/engine"
)

// Background runs (issue 21 item 3). POST /chat with "background": true is admitted exactly as a streamed request
// is (the same validation, claim, per-user and per-process limits, multitask strategies and refusals), and then
// answers 202 at once instead of streaming:
//
//	{"threadId": "...", "runId": "...", "messageId": "...", "status": "running"}
//
// messageId is the reply's id. The run hands over at its first step boundary (engine: Turn.HandOverNow) and goes
// on with no client attached through the run launcher: in-process in `agentloop dev` and `agentloop serve`, an
// asynchronous invocation of the chat function in AWS. Its stream is stored like any run's: GET
// /chat/{threadId}/stream attaches to it (a replay from its start, then its tail), POST /threads/{id}/stop stops it,
// and GET /threads/{id} and /runs read it. A background request that is queued (multitask enqueue) answers 202
// {"queued": ...} as a streamed one does. Where no launcher is configured the request is refused, 503
// launch_unavailable, before anything is written. Should the launch itself fail, the run goes on in the request
// and the 202 comes when it has ended, with its final status.
func (s *server) background(w http.ResponseWriter, r *http.Request, turn *engine.Turn) {
	turn.HandOverNow()
	run := turn.Stream(r.Context(), io.Discard)
	writeJSON(w, http.StatusAccepted, map[string]any{"threadId": run.ThreadID, "runId": run.ID,
		"messageId": run.AssistantMessageID, "status": run.Status})
}

// errNoBackground refuses a background run where runs cannot go on with no client.
func errNoBackground() error {
	return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable,
		"background runs are not available here: no run launcher is configured")
}
