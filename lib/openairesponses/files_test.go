package openairesponses

import (
	"context"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// The file rules are lib/modelfiles's; these cases check that the Responses request carries them.

// A PDF named by https URL is downloaded once per run and sent as input_file data; the result says its size.
func TestPDFByURLDownloaded(t *testing.T) {
	t.Parallel()
	var gets atomic.Int32
	files := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gets.Add(1)
		w.Header().Set("Content-Type", "application/pdf")
		w.Write([]byte("%PDF-1.7 " + r.URL.Path))
	}))
	t.Cleanup(files.Close)
	f := setup(t)
	m := f.model(func(c *Config) { c.FileClient = files.Client() })
	req := agent.ModelRequest{Messages: []agent.ModelMessage{{Role: "user", Text: "/received",
		Files: []agent.ModelFile{{MediaType: "application/pdf", URL: files.URL + "/a.pdf", Filename: "x.pdf"}}}}}
	for range 2 {
		res, events, err := run(context.Background(), m, req)
		if err != nil {
			t.Fatal(err)
		}
		n := len("%PDF-1.7 /a.pdf")
		if got := textOf(events, agent.EventTextDelta); got != fmt.Sprintf("text\nfile application/pdf x.pdf %d bytes", n) {
			t.Fatalf("received %q", got)
		}
		if res.FileBytes[files.URL+"/a.pdf"] != int64(n) {
			t.Fatalf("file bytes %v", res.FileBytes)
		}
	}
	if gets.Load() != 1 {
		t.Fatalf("%d downloads of one file", gets.Load())
	}
	part := f.LastBody(t)["input"].([]any)[0].(map[string]any)["content"].([]any)[1].(map[string]any)
	if part["type"] != "input_file" || !strings.HasPrefix(part["file_data"].(string), "data:application/pdf;base64,") {
		t.Fatalf("part %v", part)
	}
}

// An older message's file that is gone becomes a line (it would otherwise fail every later turn); the newest
// message's own fails the call.
func TestOlderFileUnavailable(t *testing.T) {
	t.Parallel()
	files := httptest.NewTLSServer(http.NotFoundHandler())
	t.Cleanup(files.Close)
	f := setup(t)
	m := f.model(func(c *Config) { c.FileClient = files.Client() })
	gone := agent.ModelFile{MediaType: "application/pdf", URL: files.URL + "/expired.pdf?X-Amz-Signature=secret", Filename: "q3.pdf"}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "read this", Files: []agent.ModelFile{gone}},
		{Role: "assistant", Text: "done"},
		{Role: "user", Text: "and now?"},
	}}
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatalf("a turn over an older file that is gone: %v", err)
	}
	first := fmt.Sprint(f.LastBody(t)["input"].([]any)[0])
	if !strings.Contains(first, "[attachment q3.pdf (application/pdf) no longer available]") || strings.Contains(first, "secret") {
		t.Fatalf("the older message sent: %v", first)
	}
	req.Messages = append(req.Messages, agent.ModelMessage{Role: "assistant", Text: "ok"},
		agent.ModelMessage{Role: "user", Text: "/received", Files: []agent.ModelFile{gone}})
	_, _, err := run(context.Background(), m, req)
	requireError(t, err, agent.KindUnavailable, agent.CodeModelError, "a file could not be downloaded (HTTP 404)")
}

// One request carries at most MaxRequestFileBytes of files.
func TestRequestFileBytesBounded(t *testing.T) {
	t.Parallel()
	f := setup(t)
	m := f.model(func(c *Config) { c.MaxRequestFileBytes = 2500 })
	pdf := func(name string, n int) agent.ModelFile {
		return agent.ModelFile{MediaType: "application/pdf", URL: "data:application/pdf;base64," + strings.Repeat("QUFB", n/3), Filename: name}
	}
	req := agent.ModelRequest{Messages: []agent.ModelMessage{
		{Role: "user", Text: "one", Files: []agent.ModelFile{pdf("old.pdf", 999)}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "two", Files: []agent.ModelFile{pdf("mid.pdf", 999)}},
		{Role: "assistant", Text: "ok"},
		{Role: "user", Text: "/received", Files: []agent.ModelFile{pdf("new.pdf", 999)}},
	}}
	if _, _, err := run(context.Background(), m, req); err != nil {
		t.Fatal(err)
	}
	input := f.LastBody(t)["input"].([]any)
	if s := fmt.Sprint(input[0]); !strings.Contains(s, "[attachment old.pdf (application/pdf) not shown: the request's files are over") {
		t.Fatalf("the oldest file was sent: %.300s", s)
	}
	req.Messages[4].Files = append(req.Messages[4].Files, pdf("new2.pdf", 999), pdf("new3.pdf", 999))
	_, _, err := run(context.Background(), m, req)
	requireError(t, err, agent.KindTooLarge, agent.CodeMessageTooLarge, "the message's files are over 2500 bytes in all")
}
