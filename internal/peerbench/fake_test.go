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

	// How far behind its schedule the fake sent words (the oldest overdue word of each write): writes more than
	// lagLimit late, and the largest lag, since resetLag.
	lateWrites atomic.Int64
	maxLag     atomic.Int64 // ns

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
	// Open loop: word i is due at start + (i+1) × every, whatever the caller does with the words already sent (a
	// remote model does not slow down for a busy server). A fake that falls behind (the test process starved of
	// CPU) sends every overdue word at once, in one write, each stamped with that write's time; how far behind
	// it fell is counted (lag), so the table shows when the load generator itself could not keep the pace.
	start := time.Now()
	timer := time.NewTimer(f.every)
	defer timer.Stop()
	for sent := 0; sent < f.words; {
		select {
		case <-timer.C:
		case <-r.Context().Done():
			f.cut.Add(1)
			return
		}
		due := min(f.words, int(time.Since(start)/f.every)) // words due by now
		if due <= sent {
			due = sent + 1 // the timer fired a hair early
		}
		f.noteLag(time.Since(start) - time.Duration(sent+1)*f.every)
		now := since(f.epoch)
		buf = buf[:0]
		for ; sent < due; sent++ {
			buf = append(append(buf, prefix...), `{"content":"w`...)
			buf = strconv.AppendInt(buf, now, 36)
			buf = append(buf, ` "},"finish_reason":null}]}`+"\n\n"...)
		}
		if !write(buf) {
			f.cut.Add(1)
			return
		}
		timer.Reset(time.Until(start.Add(time.Duration(sent+1) * f.every)))
	}
	buf = append(append(buf[:0], prefix...), `{},"finish_reason":"stop"}]}`+"\n\n"...)
	if req.StreamOptions != nil && req.StreamOptions.IncludeUsage {
		buf = append(buf, `data: {"id":"chatcmpl-peerbench","object":"chat.completion.chunk","created":1700000000,"model":`+string(model)+
			`,"choices":[],"usage":{"prompt_tokens":20,"completion_tokens":`+strconv.Itoa(f.words)+`,"total_tokens":`+strconv.Itoa(f.words+20)+`}}`+"\n\n"...)
	}
	buf = append(buf, "data: [DONE]\n\n"...)
	write(buf)
}

// lagLimit is how late a write may be before it counts as the fake falling behind (two words' worth).
const lagLimit = 10 * time.Millisecond

func (f *fakeModel) noteLag(d time.Duration) {
	if d > lagLimit {
		f.lateWrites.Add(1)
	}
	for {
		old := f.maxLag.Load()
		if int64(d) <= old || f.maxLag.CompareAndSwap(old, int64(d)) {
			return
		}
	}
}

// lag returns the late writes and the largest lag since the last call, and starts counting afresh.
func (f *fakeModel) lag() (late int64, worst time.Duration) {
	return f.lateWrites.Swap(0), time.Duration(f.maxLag.Swap(0))
}
