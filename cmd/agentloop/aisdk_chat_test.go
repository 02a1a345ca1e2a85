package main

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// Human in the loop end to end, as a browser runs it: the AI SDK's own AbstractChat (what useChat wraps), ai@6
// under the system Node and ai@7 under the pinned Node 22, against the real `agentloop dev` binary with the
// offline model. Approve, deny and a client tool each continue the same assistant message through the SDK's
// automatic re-post, and the server's copy of the thread agrees with the client's (see chat.mjs).
func TestAISDKChatHumanInTheLoop(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data)
	scenarios := []string{aisdktest.ScenarioApprove, aisdktest.ScenarioDeny, aisdktest.ScenarioClientTool, aisdktest.ScenarioPredicate}
	chatScenarios(t, dev, scenarios...)
	dev.stop(t)
}

// multitask "enqueue" through DefaultChatTransport (body: {multitask: "enqueue"}), as a browser sends it, from two
// chats while a third's /slow reply streams: both majors take the 202 as an empty reply without an error, and
// resumeStream() gets a queued message's reply only once that message has left the queue (see chat.mjs).
func TestAISDKChatEnqueue(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data)
	chatScenarios(t, dev, aisdktest.ScenarioEnqueue)
	dev.stop(t)
}

// Continuation coalescing (issue 16 item 6) through the SDK's AbstractChat: a job's result that arrives while a
// question waits is answered in the answer's own turn, as a new reply after the steer, and the README's re-sync
// makes the chat agree with the server (see chat.mjs).
func TestAISDKChatCoalesce(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data)
	chatScenarios(t, dev, aisdktest.ScenarioCoalesce)
	dev.stop(t)
}

// An image attached by the AI SDK client (sendMessage with files, as useChat sends an <input type=file>) reaches
// the model as an image content part: the offline model's /received reply names it (see chat.mjs).
func TestAISDKChatImage(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data)
	chatScenarios(t, dev, aisdktest.ScenarioImage)
	dev.stop(t)
}

// chatScenarios runs chat.mjs's scenarios against dev with both SDK majors and logs each result.
func chatScenarios(t *testing.T, dev *devProc, scenarios ...string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), aisdktest.Timeout) // a first `npm ci` included
	defer cancel()
	started := time.Now()
	results, err := aisdktest.Chat(ctx, dev.url, dev.token, scenarios...)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("every SDK version drove the chat in %s", time.Since(started).Round(time.Millisecond))
	for _, sdk := range aisdktest.SDKs {
		for _, sc := range scenarios {
			i := slices.IndexFunc(results, func(r aisdktest.ChatResult) bool { return r.SDK == sdk && r.Scenario == sc })
			if i < 0 {
				t.Fatalf("no ai@%s result for %s: %+v", sdk, sc, results)
			}
			r := results[i]
			t.Logf("ai@%s (Node %s) %s: %d requests, %d ms, thread %s", r.SDKVersion, r.Node, r.Scenario, r.Requests, r.Millis, r.Thread)
		}
	}
}

// A reply that crosses a hand-over (issue 21 item 2), on `agentloop dev` with AGENT_REQUEST_DEADLINE: the POST's
// own stream, captured here, ends with message-metadata {handover: true} and no finish, and every SDK version
// parses it without an error, keeping the partial reply (check.mjs --handover, AbstractChat included); then the
// SDK's chat client sends such a message and the README's re-sync (drop the partial copy, resumeStream) ends with
// the whole reply once, completed, as the server stores it (chat.mjs handover).
func TestAISDKChatHandOver(t *testing.T) {
	bin, data := setup(t)
	dev := startDev(t, bin, data, aisdktest.HandOverEnv...)

	thread := "th-handover-post"
	msg, err := json.Marshal(map[string]any{"id": thread, "trigger": "submit-message", "messages": []any{map[string]any{
		"id": "u1", "role": "user", "parts": []any{map[string]any{"type": "text", "text": aisdktest.HandOverText(thread)}}}}})
	if err != nil {
		t.Fatal(err)
	}
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, dev.url+"/chat", bytes.NewReader(msg))
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Authorization", "Bearer "+dev.token)
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	body, err := io.ReadAll(res.Body)
	res.Body.Close()
	if err != nil || res.StatusCode != http.StatusOK {
		t.Fatalf("POST /chat: %d %v\n%s", res.StatusCode, err, body)
	}
	file := filepath.Join(t.TempDir(), "handover.sse")
	if err := os.WriteFile(file, body, 0o644); err != nil {
		t.Fatal(err)
	}
	for _, p := range aisdktest.CheckInputs(t, aisdktest.Input{File: file, HandOver: true}) {
		parts, err := p.Parts()
		if err != nil {
			t.Fatal(err)
		}
		if p.FinishReason != "" || len(parts) != 2 || parts[1].Type != "tool-add_note" || parts[1].State != agent.StateOutputAvailable {
			t.Fatalf("ai@%s made %s of the POST's stream (finish %q), want the first step's add_note call and its output", p.SDK,
				p.Message.Parts, p.FinishReason)
		}
	}

	chatScenarios(t, dev, aisdktest.ScenarioHandOver)
	dev.stop(t)
}
