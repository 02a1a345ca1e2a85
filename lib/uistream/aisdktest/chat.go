package aisdktest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os/exec"
	"path/filepath"
)

// Chat scenarios (chat.mjs): each drives one human-in-the-loop round trip through the SDK's AbstractChat, as
// useChat runs it, and checks the final chat.messages against the server's copy; ScenarioEnqueue pins what the
// SDK makes of a multitask "enqueue" answer.
const (
	ScenarioApprove    = "approve"     // delete_note approved: the same message continues with the tool's output
	ScenarioDeny       = "deny"        // delete_note denied: output-denied, then text about the denial
	ScenarioClientTool = "client-tool" // ask_user_question answered with addToolOutput
	// ScenarioEnqueue: two chats send with body {multitask: "enqueue"} while a third's run holds the thread. The
	// 202 is taken as a reply with no chunks (ready, no error, onFinish with an empty message); resumeStream()
	// resumes whatever run holds the thread when it is called, so only a client that waits until its message
	// has left the queue (GET /threads/{id}) gets its own reply.
	ScenarioEnqueue = "enqueue"
	// ScenarioCoalesce: continuation coalescing. A research job finishes while a question (asked again by every
	// continuation) waits; the answer's automatic re-post gets one new reply after the steer that answers both,
	// its start naming it and its metadata saying threadChanged; the README's re-sync from GET /threads/{id} makes
	// the chat agree with the server.
	ScenarioCoalesce = "coalesce"
	// ScenarioPredicate: the README's sendAutomaticallyWhen against the SDK's own predicates on the messages the
	// server leaves (no request): false for a reply stopped after a tool step (REVIEW H9), true once answered.
	ScenarioPredicate = "predicate"
	// ScenarioImage: sendMessage with a PNG attached (a file part with a data URL); the offline model's
	// /received reply shows it arrived as an image_url content part.
	ScenarioImage = "image"
	// ScenarioHandOver: a reply that crosses a hand-over, on a server whose POSTs hand over after their first step
	// (HandOverEnv): the POST's stream ends with metadata.handover and no finish, and the README's re-sync (drop
	// the partial copy, resumeStream) ends with the whole reply once, as the server stores it. Run only when named.
	ScenarioHandOver = "handover"
)

// HandOverEnv is the environment of an `agentloop dev` (or `agentloop serve`) whose POST /chat hands its run over
// at the first step boundary 200 ms after the request arrived (AGENT_REQUEST_DEADLINE less AGENT_HANDOVER_MARGIN),
// for ScenarioHandOver and the web app's hand-over flow. HandOverText is a message whose first step surely ends
// later: the offline model fails its first request once (/flaky), and the adapter waits at least half of its
// 500 ms backoff base (modelcall.DefaultBackoffBase) before the retry; then the tool's result is answered in a
// second step, which the continuation streams. token makes the text, and so the offline model's count of the
// turn's requests, the caller's own.
var HandOverEnv = []string{"AGENT_REQUEST_DEADLINE=1s", "AGENT_HANDOVER_MARGIN=800ms"}

// HandOverText is the message whose reply crosses a hand-over on a server with HandOverEnv (see there).
func HandOverText(token string) string {
	return fmt.Sprintf(`/flaky 1 500 /tool add_note {"text":"handed over %s"}`, token)
}

// ChatResult is one scenario that passed with one SDK major.
type ChatResult struct {
	SDK        string `json:"sdk"`        // one of SDKs
	SDKVersion string `json:"sdkVersion"` // e.g. "7.0.173"
	Node       string `json:"node"`
	Scenario   string `json:"scenario"`
	Thread     string `json:"thread"`   // the thread it ran on
	Requests   int    `json:"requests"` // HTTP requests the chat made
	Millis     int    `json:"ms"`
}

// Chat drives the agentloop server at baseURL (e.g. "http://127.0.0.1:8787") with token through the AI SDK's
// client-side chat state, ai@6.0.0 and the newest ai@6 under the system Node and ai@7 under the pinned Node 22,
// and returns one result per scenario and SDK of SDKs (all scenarios when none is named). A failed scenario is an error that carries the
// script's report: the chat's messages and every request and response it saw.
func Chat(ctx context.Context, baseURL, token string, scenarios ...string) ([]ChatResult, error) {
	stdout, stderr, err := runChecker(ctx, append([]string{"--chat", baseURL, token}, scenarios...)...)
	if err != nil {
		return nil, fmt.Errorf("aisdktest: chat: %w\n%s", err, stderr)
	}
	return decodeLines[ChatResult](stdout)
}

// runChecker runs run.sh with args and returns its output; err is non-nil when it exits non-zero.
func runChecker(ctx context.Context, args ...string) (stdout, stderr []byte, err error) {
	dir, err := CheckerDir()
	if err != nil {
		return nil, nil, err
	}
	cmd := exec.CommandContext(ctx, "bash", append([]string{filepath.Join(dir, "run.sh")}, args...)...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	err = cmd.Run()
	return out.Bytes(), errOut.Bytes(), err
}

// exitCode is the exit status of a run.sh that ran to its end, or -1.
func exitCode(err error) int {
	var ee *exec.ExitError
	if errors.As(err, &ee) {
		return ee.ExitCode()
	}
	return -1
}

// decodeLines decodes every line of a script's JSON-lines output as one T.
func decodeLines[T any](out []byte) ([]T, error) {
	var vs []T
	sc := bufio.NewScanner(bytes.NewReader(out))
	sc.Buffer(nil, 64<<20)
	for sc.Scan() {
		var v T
		if err := json.Unmarshal(sc.Bytes(), &v); err != nil {
			return nil, fmt.Errorf("aisdktest: unreadable checker output %q: %w", sc.Bytes(), err)
		}
		vs = append(vs, v)
	}
	return vs, sc.Err()
}
