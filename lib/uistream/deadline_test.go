package uistream_test

import (
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/uistream"
)

// The per-write deadline is set on the whole connection: once the stream is done it must not outlive it. A
// handler that goes on working after [DONE] (the run's outcome, its slot, the queue pass) for longer than the
// write timeout, and a keep-alive request on the same connection after that, must both still be answered.
func TestDeadlineEndsWithTheStream(t *testing.T) {
	t.Parallel()
	const timeout = 50 * time.Millisecond
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/plain" {
			io.WriteString(w, "plain")
			return
		}
		enc := uistream.NewEncoder(w, nil, uistream.WithClientWriteTimeout(timeout))
		if err := enc.Encode(uistream.TextDelta{ID: "t", Delta: "hi"}); err != nil {
			t.Error(err)
		}
		enc.Done()
		time.Sleep(3 * timeout) // work after the stream's end, before the handler returns
	}))
	defer srv.Close()
	get := func(path string) string {
		t.Helper()
		resp, err := srv.Client().Get(srv.URL + path)
		if err != nil {
			t.Fatalf("GET %s: %v", path, err)
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		if err != nil {
			t.Fatalf("GET %s: body: %v (read %q)", path, err, b)
		}
		return string(b)
	}
	if body := get("/stream"); !strings.HasSuffix(body, uistream.DoneFrame) {
		t.Fatalf("stream body %q", body)
	}
	time.Sleep(2 * timeout)
	if body := get("/plain"); body != "plain" { // the same keep-alive connection
		t.Fatalf("plain body %q", body)
	}
}
