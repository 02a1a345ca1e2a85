package httpapi_test

import (
	"bufio"
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/uistream/aisdktest"
)

// Streams captured from the real handler parse with the ai package's own schema and readUIMessageStream, under
// ai@6.0.0 and the newest ai@6 (Node 20) and ai@7 (Node 22), and reduce to the message the server persisted.
func TestProtocolConformance(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tok := token(t, "alice")
	cases := []struct {
		name, text string
		check      func(t *testing.T, p aisdktest.ParsedMessage)
	}{
		{"plain", "hello protocol", func(t *testing.T, p aisdktest.ParsedMessage) {
			if p.Message.Text() != "You said: hello protocol" || p.FinishReason != "stop" {
				t.Fatalf("%s: text %q finish %q", p.SDK, p.Message.Text(), p.FinishReason)
			}
		}},
		{"tool", `/tool add_note {"text":"conformance"}`, func(t *testing.T, p aisdktest.ParsedMessage) {
			parts, err := p.Parts()
			if err != nil {
				t.Fatal(err)
			}
			var tool *agent.Part
			for i := range parts {
				if parts[i].Type == "tool-add_note" {
					tool = &parts[i]
				}
			}
			if tool == nil || tool.State != agent.StateOutputAvailable || !strings.Contains(string(tool.Output), "conformance") {
				t.Fatalf("%s: tool part = %+v", p.SDK, tool)
			}
			if !strings.Contains(p.Message.Text(), "conformance") {
				t.Fatalf("%s: answer %q", p.SDK, p.Message.Text())
			}
		}},
		{"model-error", "/error 500 after 2", func(t *testing.T, p aisdktest.ParsedMessage) {
			if len(p.Errors) != 1 || p.FinishReason != "error" || !strings.Contains(p.Message.Text(), "word2") {
				t.Fatalf("%s: errors %v finish %q text %q", p.SDK, p.Errors, p.FinishReason, p.Message.Text())
			}
		}},
	}
	dir := t.TempDir()
	var files []string
	for _, c := range cases {
		resp := f.do(t, "POST", "/chat", tok, chatBody("conf-"+c.name, "u"+c.name, c.text))
		if resp.StatusCode != 200 {
			t.Fatalf("%s: status %d", c.name, resp.StatusCode)
		}
		file := filepath.Join(dir, c.name+".sse")
		if err := os.WriteFile(file, readAll(t, resp), 0o644); err != nil {
			t.Fatal(err)
		}
		files = append(files, file)
	}
	parsed := aisdktest.Check(t, files...)
	if len(parsed) != len(aisdktest.SDKs)*len(cases) {
		t.Fatalf("want %d results, got %d", len(aisdktest.SDKs)*len(cases), len(parsed))
	}
	for i, c := range cases {
		for _, p := range aisdktest.OfFile(parsed, i) {
			c.check(t, p)
			if md := p.Message.Meta(); md.RunID == "" || md.Usage == nil {
				t.Fatalf("%s/%s: finish metadata not merged: %s", c.name, p.SDK, p.Message.Metadata)
			}
		}
	}
}

// A resumed stream (GET /chat/{id}/stream while the run streams: the replay from the start, then the tail) and a
// stopped run's stream (finish "other", status canceled) parse with every SDK version, as the original does.
func TestProtocolConformanceResumeAndStop(t *testing.T) {
	t.Parallel()
	f := setup(t)
	tok := token(t, "alice")
	resp := f.do(t, "POST", "/chat", tok, chatBody("conf-resume", "u1", "/slow 200"))
	if resp.StatusCode != 200 {
		t.Fatalf("post: %d", resp.StatusCode)
	}
	// Wait for the first word on the wire (a signal, not a sleep): the run streams.
	orig := bufio.NewReader(resp.Body)
	var head bytes.Buffer
	for !bytes.Contains(head.Bytes(), []byte(`"text-delta"`)) {
		line, err := orig.ReadBytes('\n')
		head.Write(line)
		if err != nil {
			t.Fatalf("the run ended before its first word: %v\n%s", err, head.Bytes())
		}
	}
	attached := f.do(t, "GET", "/chat/conf-resume/stream", tok, nil)
	if attached.StatusCode != 200 {
		t.Fatalf("resume: %d", attached.StatusCode)
	}
	if stop := f.do(t, "POST", "/threads/conf-resume/stop", tok, nil); stop.StatusCode != 202 {
		t.Fatalf("stop: %d", stop.StatusCode)
	}
	rest, err := io.ReadAll(orig)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	original := append(head.Bytes(), rest...)
	resumed := readAll(t, attached)
	parsed := aisdktest.CheckStreams(t, original, resumed)
	for i, name := range []string{"original", "resumed"} {
		for _, p := range aisdktest.OfFile(parsed, i) {
			if p.FinishReason != "other" || p.Message.Meta().Status != agent.MessageCanceled || !strings.HasPrefix(p.Message.Text(), "word1") {
				t.Fatalf("%s under ai@%s: finish %q, metadata %s, text %q", name, p.SDK, p.FinishReason, p.Message.Metadata, p.Message.Text())
			}
		}
	}
}
