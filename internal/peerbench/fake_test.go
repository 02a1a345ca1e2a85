package peerbench

import (
	"encoding/json"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync/atomic"
	"time"
)

// fakeModel is the OpenAI-compatible streaming Chat Completions endpoint both servers call (see the package doc).
type fakeModel struct {
	epoch time.Time
	words int
	every time.Duration

	requests atomic.Int64 // chat completions streamed (or started)
	refused  atomic.Int64 // requests that were not a streaming chat completion
	cut      atomic.Int64 // streams whose caller went away before the last word

	srv *http.Server
	url string // base URL, ending in /v1
}

func startFakeModel(epoch time.Time, words int, every time.Duration) (*fakeModel, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	f := &fakeModel{epoch: epoch, words: words, every: every, url: "http://" + ln.Addr().String() + "/v1"}
	f.srv = &http.Server{Handler: f, ReadHeaderTimeout: 10 * time.Second}
	go func() { _ = f.srv.Serve(ln) }()
	return f, nil
}

func (f *fakeModel) close() { _ = f.srv.Close() }

// since is the benchmark clock: microseconds since the epoch (monotonic: the epoch is a time.Now()).
func since(epoch time.Time) int64 { return time.Since(epoch).Microseconds() }

func (f *fakeModel) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost || !strings.HasSuffix(r.URL.Path, "/chat/completions") {
		f.refused.Add(1)
		http.Error(w, `{"error":{"message":"peerbench fake model: only POST /v1/chat/completions","type":"invalid_request_error"}}`, http.StatusNotFound)
		return
	}
	var req struct {
		Model         string            `json:"model"`
		Stream        bool              `json:"stream"`
		Messages      []json.RawMessage `json:"messages"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
	}
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil || !req.Stream || len(req.Messages) == 0 {
		f.refused.Add(1)
		http.Error(w, `{"error":{"message":"peerbench fake model: want a streaming chat completion with messages","type":"invalid_request_error"}}`, http.StatusBadRequest)
		return
	}
	f.requests.Add(1)
	model, _ := json.Marshal(req.Model)
	prefix := []byte(`data: {"id":"chatcmpl-peerbench","object":"chat.completion.chunk","created":1700000000,"model":` + string(model) + `,"choices":[{"index":0,"delta":`)
	fl, _ := w.(http.Flusher)
	w.Header().Set("Content-Type", "text/event-stream")
	w.Header().Set("Cache-Control", "no-cache")
	w.WriteHeader(http.StatusOK)
	buf := make([]byte, 0, 512)
	write := func(b []byte) bool {
		if _, err := w.Write(b); err != nil {
			return false
		}
		if fl != nil {
			fl.Flush()
		}
		return true
	}
	buf = append(append(buf[:0], prefix...), `{"role":"assistant","content":""},"finish_reason":null}]}`+"\n\n"...)
	if !write(buf) {
		f.cut.Add(1)
		return
	}
	tick := time.NewTicker(f.every)
	defer tick.Stop()
	for range f.words {
		select {
		case <-tick.C:
		case <-r.Context().Done():
			f.cut.Add(1)
			return
		}
		buf = append(append(buf[:0], prefix...), `{"content":"w`...)
		buf = strconv.AppendInt(buf, since(f.epoch), 36)
		buf = append(buf, ` "},"finish_reason":null}]}`+"\n\n"...)
		if !write(buf) {
			f.cut.Add(1)
			return
		}
	}
	buf = append(append(buf[:0], prefix...), `{},"finish_reason":"stop"}]}`+"\n\n"...)
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		buf = append(buf, `data: {"id":"chatcmpl-peerbench","object":"chat.completion.chunk","created":1700000000,"model":`+string(model)+
			`,"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":`+strconv.Itoa(f.words)+`,"total_tokens":`+strconv.Itoa(f.words+20)+`}}`+"\n\n"...)
	}
	buf = append(buf, "data: [DONE]\n\n"...)
	write(buf)
}
