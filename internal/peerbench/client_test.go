package peerbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

// uiMessage is a UIMessage as useChat keeps it (text parts only: all this benchmark sends and receives).
type uiMessage struct {
	ID    string   `json:"id"`
	Role  string   `json:"role"`
	Parts []uiPart `json:"parts"`
}

type uiPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

// client is the load client: one http.Client for every stream of a load.
type client struct {
	http  *http.Client
	epoch time.Time
	words int // words a reply must carry
}

func newClient(epoch time.Time, words, streams int) *client {
	tr := &http.Transport{MaxIdleConnsPerHost: streams + 16, IdleConnTimeout: 90 * time.Second, DisableCompression: true}
	return &client{http: &http.Client{Transport: tr}, epoch: epoch, words: words}
}

func (c *client) close() { c.http.CloseIdleConnections() }

// turn is one stream's outcome.
type turn struct {
	reply uiMessage // the assistant message, for the next round's history
	words int
	lat   []int32       // receipt − send of each word, µs
	first time.Duration // POST → first word received (0: none)
	err   string        // "" when the stream was whole
}

// chunk is the part of a UI message stream chunk the client reads.
type chunk struct {
	Type      string `json:"type"`
	Delta     string `json:"delta"`
	MessageID string `json:"messageId"`
	ErrorText string `json:"errorText"`
}

// send posts history (whose newest message is the new user message) to thread and reads the reply to its end.
func (c *client) send(ctx context.Context, base, token, thread string, history []uiMessage) turn {
	body, _ := json.Marshal(map[string]any{"id": thread, "messages": history, "trigger": "submit-message"})
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, base+"/chat", bytes.NewReader(body))
	if err != nil {
		return turn{err: "request: " + err.Error()}
	}
	req.Header.Set("Content-Type", "application/json")
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	posted := time.Now()
	resp, err := c.http.Do(req)
	if err != nil {
		// The cause without the addresses: "connection error: connection reset by peer".
		msg := err.Error()
		if i := strings.LastIndex(msg, ": "); i >= 0 {
			msg = msg[i+2:]
		}
		return turn{err: "connection error: " + msg}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		var e struct {
			Error struct {
				Code string `json:"code"`
			} `json:"error"`
		}
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		_ = json.Unmarshal(b, &e)
		return turn{err: fmt.Sprintf("status %d %s", resp.StatusCode, e.Error.Code)}
	}
	t := turn{lat: make([]int32, 0, c.words), reply: uiMessage{Role: "assistant"}}
	var text, pending []byte
	var finished, done, malformed bool
	var errText string
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 0, 16<<10), 4<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			done = true
			continue
		}
		var ch chunk
		if err := json.Unmarshal(data, &ch); err != nil {
			malformed = true
			continue
		}
		switch ch.Type {
		case "start":
			t.reply.ID = ch.MessageID
		case "text-delta":
			now := since(c.epoch)
			text = append(text, ch.Delta...)
			pending = append(pending, ch.Delta...)
			for {
				i := bytes.IndexByte(pending, ' ')
				if i < 0 {
					break
				}
				word := pending[:i]
				pending = pending[i+1:]
				if len(word) < 2 || word[0] != 'w' {
					malformed = true
					continue
				}
				sent, err := strconv.ParseInt(string(word[1:]), 36, 64)
				if err != nil {
					malformed = true
					continue
				}
				if t.words == 0 {
					t.first = time.Since(posted)
				}
				t.words++
				t.lat = append(t.lat, int32(now-sent))
			}
			pending = append([]byte(nil), pending...) // the rest of a word split across deltas
		case "error":
			errText = ch.ErrorText
		case "finish":
			finished = true
		}
	}
	if t.reply.ID == "" {
		t.reply.ID = thread + "-reply-" + strconv.Itoa(len(history))
	}
	t.reply.Parts = []uiPart{{Type: "text", Text: string(text)}}
	switch {
	case errText != "":
		if len(errText) > 60 {
			errText = errText[:60] + "…"
		}
		t.err = "error chunk: " + errText
	case sc.Err() != nil || !finished || !done:
		t.err = "cut (no finish and [DONE])"
	case malformed:
		t.err = "malformed chunk or word"
	case t.words != c.words:
		t.err = fmt.Sprintf("%d words, not %d", t.words, c.words)
	}
	return t
}

// runInfo is what the benchmark reads of a stored run (GET /threads/{id}/runs).
type runInfo struct {
	Status string `json:"status"`
	Error  *struct {
		Code string `json:"code"`
	} `json:"error"`
	Store *struct {
		Requests int64 `json:"requests"`
	} `json:"store"`
	CreatedAt  time.Time `json:"createdAt"`
	FinishedAt time.Time `json:"finishedAt"`
}

// runs is the thread's stored runs (one page of up to 500: a thread here has at most a few).
func (c *client) runs(ctx context.Context, base, token, thread string) ([]runInfo, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, base+"/threads/"+thread+"/runs?limit=500", nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 4<<10))
		return nil, fmt.Errorf("GET runs of %s: %d %s", thread, resp.StatusCode, b)
	}
	var out struct {
		Runs []runInfo `json:"runs"`
	}
	err = json.NewDecoder(resp.Body).Decode(&out)
	return out.Runs, err
}

// outcomes is what the store kept of a load's runs.
type outcomes struct {
	runs       int
	byStatus   map[string]int // status, or "failed <code>"
	statements int64          // the runs' store.requests, summed
	runSeconds float64        // the runs' durations (createdAt → finishedAt), summed
	unmeasured int            // runs that recorded no store cost (reaped)
}

// storedOutcomes reads every thread's runs, waiting (at most a minute) until none is running.
func (c *client) storedOutcomes(ctx context.Context, base, token string, threads []string) (outcomes, error) {
	deadline := time.Now().Add(time.Minute)
	for {
		o := outcomes{byStatus: map[string]int{}}
		var mu sync.Mutex
		var firstErr error
		work := make(chan string)
		var wg sync.WaitGroup
		for range 16 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				for th := range work {
					runs, err := c.runs(ctx, base, token, th)
					mu.Lock()
					if err != nil && firstErr == nil {
						firstErr = err
					}
					for _, r := range runs {
						o.runs++
						key := r.Status
						if r.Error != nil && r.Error.Code != "" {
							key += " " + r.Error.Code
						}
						o.byStatus[key]++
						if r.Store != nil {
							o.statements += r.Store.Requests
						} else {
							o.unmeasured++
						}
						if !r.FinishedAt.IsZero() {
							o.runSeconds += r.FinishedAt.Sub(r.CreatedAt).Seconds()
						}
					}
					mu.Unlock()
				}
			}()
		}
		for _, th := range threads {
			work <- th
		}
		close(work)
		wg.Wait()
		if firstErr != nil {
			return o, firstErr
		}
		if o.byStatus["running"] == 0 || time.Now().After(deadline) {
			return o, nil
		}
		select {
		case <-ctx.Done():
			return o, ctx.Err()
		case <-time.After(500 * time.Millisecond):
		}
	}
}
