package main

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"testing"
	"time"
)

// kill -9 in the middle of a reply, then a restart on the same data: the new process holds the data directory's
// lock, so every earlier process is dead, and it reaps every claim before it serves. With AGENT_STALE_AFTER at
// 10 minutes the ticker cannot have done it: the user's one run slot is free for the first request after the
// banner, and the dead run's reply reads failed with its visible run error part.
func TestDevRestartReapsTheDeadRunAtOnce(t *testing.T) {
	bin, data := setup(t)
	env := []string{"AGENT_STALE_AFTER=10m", "AGENT_MAX_ACTIVE_RUNS_PER_USER=1"}
	first := startDev(t, bin, data, env...)
	req, _ := http.NewRequest("POST", first.url+"/chat", strings.NewReader(
		`{"id":"crash","trigger":"submit-message","messages":[{"id":"m1","role":"user","parts":[{"type":"text","text":"/slow 100"}]}]}`))
	req.Header.Set("Authorization", "Bearer "+first.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil || resp.StatusCode != 200 {
		t.Fatalf("post: %v %v", resp, err)
	}
	buf := make([]byte, 4096)
	got := 0
	for !bytes.Contains(buf[:got], []byte("word3")) {
		n, err := resp.Body.Read(buf[got:])
		if err != nil {
			t.Fatalf("stream ended early: %v", err)
		}
		got += n
	}
	// The one slot is the slow run's.
	if status, body := request(t, "POST", first.url+"/chat", first.token,
		`{"id":"other","trigger":"submit-message","messages":[{"id":"o1","role":"user","parts":[{"type":"text","text":"hi"}]}]}`); status != http.StatusTooManyRequests {
		t.Fatalf("second run while the slow one runs: %d %s, want 429", status, body)
	}
	_ = first.cmd.Process.Kill()
	_ = first.cmd.Wait()
	resp.Body.Close()

	second := startDev(t, bin, data, env...)
	status, stream := request(t, "POST", second.url+"/chat", second.token,
		`{"id":"other","trigger":"submit-message","messages":[{"id":"o2","role":"user","parts":[{"type":"text","text":"hi"}]}]}`)
	if status != 200 || !bytes.Contains(stream, []byte(`"finishReason":"stop"`)) {
		t.Fatalf("first run after the restart: %d %s, want the dead run's slot given back", status, stream)
	}
	status, body := request(t, "GET", second.url+"/threads/crash", second.token, "")
	var view struct {
		Thread struct {
			ActiveRun *struct{ RunID string } `json:"activeRun"`
		}
		Messages []struct {
			Role     string
			Parts    []struct{ Type string }
			Metadata struct{ Status string }
		}
	}
	if err := json.Unmarshal(body, &view); err != nil || status != 200 || len(view.Messages) == 0 {
		t.Fatalf("get thread: %d %s", status, body)
	}
	if view.Thread.ActiveRun != nil {
		t.Fatalf("claim of the dead run still held: %s", body)
	}
	last := view.Messages[len(view.Messages)-1]
	visible := false
	for _, p := range last.Parts {
		visible = visible || p.Type == "data-run-error"
	}
	if last.Role != "assistant" || last.Metadata.Status != "failed" || !visible {
		t.Fatalf("dead run's reply: %s, want failed with a data-run-error part", body)
	}
}

// A second `agentloop dev` on a data directory in use refuses to start, naming the directory and the process
// that holds it; the first keeps serving.
func TestSecondDevOnTheSameDataRefuses(t *testing.T) {
	bin, data := setup(t)
	first := startDev(t, bin, data)
	// Before the lock the second process served on: the bound only ends the test.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, bin, "dev", "--addr", "127.0.0.1:0", "--data", data)
	cmd.Env = append(cmd.Environ(), "OPENAI_API_KEY=", "AGENT_SECRET=")
	out, err := cmd.CombinedOutput()
	if err == nil {
		t.Fatalf("second dev on the same data started: %s", out)
	}
	if !bytes.Contains(out, []byte(data)) || !bytes.Contains(out, []byte("in use")) ||
		!bytes.Contains(out, []byte(strconv.Itoa(first.cmd.Process.Pid))) {
		t.Fatalf("second dev's refusal %q should name %s and pid %d", out, data, first.cmd.Process.Pid)
	}
	if status, _ := request(t, "GET", first.url+"/threads", first.token, ""); status != 200 {
		t.Fatalf("first dev after the refusal: %d", status)
	}
}
