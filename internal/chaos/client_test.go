package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// tally is what the clients saw, counted across all of them.
type tally struct {
	mu        sync.Mutex
	posts     int            // POST /chat requests
	attempted int            // distinct messages a client tried to send
	accepted  int            // distinct messages answered 200 at least once (or found stored: duplicate_message)
	completed int            // replies read to a finish with finishReason stop and [DONE], no error chunk
	failed    map[string]int // replies that carried an error chunk, by its text
	cut       int            // replies cut before their end (a kill)
	refused   map[string]int // answers other than 200, "status code"
	connErr   int            // requests that got no answer (the server was down or went down)
	resumed   map[string]int // GET /chat/{id}/stream after a cut, by outcome
}

func (t *tally) add(f func(t *tally)) {
	t.mu.Lock()
	defer t.mu.Unlock()
	f(t)
}

// sent is one message a client tried, as the check needs it.
type sent struct {
	id       string
	accepted bool
}

// client is one of the user's concurrent clients, in a thread of its own.
type client struct {
	base   func() string
	token  string
	thread string
	rng    *rand.Rand
	http   *http.Client
	tally  *tally
	msgs   []sent // in the order sent
}

// chatBody is the body DefaultChatTransport posts for a new user message.
func chatBody(thread, id, text string) []byte {
	b, _ := json.Marshal(map[string]any{"id": thread, "trigger": "submit-message", "messages": []any{
		map[string]any{"id": id, "role": "user", "parts": []any{map[string]any{"type": "text", "text": text}}},
	}})
	return b
}

// text is the next message's text: mostly a short echo, sometimes a tool call or a one-second reply.
func (c *client) text(n int) string {
	switch r := c.rng.IntN(100); {
	case r < 15:
		return "/tool list_notes {}"
	case r < 25:
		return "/slow 10"
	default:
		return fmt.Sprintf("hello %d from %s", n, c.thread)
	}
}

// run sends messages until ctx ends.
func (c *client) run(ctx context.Context) {
	for n := 1; ctx.Err() == nil; n++ {
		m := sent{id: fmt.Sprintf("%s-m%d", c.thread, n)}
		text := c.text(n)
		c.tally.add(func(t *tally) { t.attempted++ })
		m.accepted = c.deliver(ctx, m.id, text)
		c.msgs = append(c.msgs, m)
		pause(ctx, 100+c.rng.IntN(300))
	}
}

// deliver posts one message until it is accepted and its reply read (or cut and then found answered), or ctx
// ends; it reports whether the server accepted it.
func (c *client) deliver(ctx context.Context, id, text string) (accepted bool) {
	for ctx.Err() == nil {
		out := c.post(ctx, c.thread, id, text)
		if out.accepted && !accepted {
			accepted = true
			c.tally.add(func(t *tally) { t.accepted++ })
		}
		if out.done {
			return accepted
		}
		if out.reply == replyCut {
			// A reconnecting client reattaches to the run (useChat's resume) before it posts again.
			pause(ctx, 250+c.rng.IntN(500))
			c.resume(ctx)
		}
		pause(ctx, 250+c.rng.IntN(500))
	}
	return accepted
}

// outcome of one POST /chat.
type outcome struct {
	accepted bool // the server holds the message
	done     bool // nothing more to do for this message
	reply    replyResult
	status   int
	code     string
}

type replyResult int

const (
	replyNone replyResult = iota
	replyCompleted
	replyFailed
	replyCut
)

func (c *client) post(ctx context.Context, thread, id, text string) outcome {
	c.tally.add(func(t *tally) { t.posts++ })
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Minute)
	defer cancel()
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, c.base()+"/chat", bytes.NewReader(chatBody(thread, id, text)))
	req.Header.Set("Authorization", "Bearer "+c.token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		c.tally.add(func(t *tally) { t.connErr++ })
		return outcome{}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		code := errorCode(resp.Body)
		c.tally.add(func(t *tally) {
			t.refused[fmt.Sprintf("%d %s", resp.StatusCode, code)]++
		})
		// duplicate_message: the message is stored and answered (a re-post after a cut whose run was reaped).
		dup := code == agent.CodeDuplicateMessage
		return outcome{accepted: dup, done: dup, status: resp.StatusCode, code: code}
	}
	res, errText := readReply(resp.Body)
	c.tally.add(func(t *tally) {
		switch res {
		case replyCompleted:
			t.completed++
		case replyFailed:
			t.failed[errText]++
		case replyCut:
			t.cut++
		}
	})
	// A cut reply is posted again with the same id: the server runs it again, or says it was answered.
	return outcome{accepted: true, done: res != replyCut, reply: res, status: 200}
}

// resume reads the thread's active run's stream (GET /chat/{id}/stream) to its end: after a kill, the dead run's
// until the reaper ends it, holding a reader lease meanwhile.
func (c *client) resume(ctx context.Context) {
	req, _ := http.NewRequestWithContext(ctx, http.MethodGet, c.base()+"/chat/"+c.thread+"/stream", nil)
	req.Header.Set("Authorization", "Bearer "+c.token)
	resp, err := c.http.Do(req)
	if err != nil {
		if ctx.Err() == nil {
			c.tally.add(func(t *tally) { t.resumed["no answer"]++ })
		}
		return
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		what := fmt.Sprintf("%d %s", resp.StatusCode, errorCode(resp.Body))
		if resp.StatusCode == http.StatusNoContent {
			what = "204 (no active run)"
		}
		c.tally.add(func(t *tally) { t.resumed[what]++ })
		return
	}
	res, _ := readReply(resp.Body)
	if ctx.Err() != nil {
		return
	}
	c.tally.add(func(t *tally) { t.resumed["200 "+replyName(res)]++ })
}

// errorCode reads the code of an error body {"error": {"code": ...}}.
func errorCode(r io.Reader) string {
	var body struct {
		Error struct{ Code string }
	}
	data, _ := io.ReadAll(io.LimitReader(r, 64<<10))
	if json.Unmarshal(data, &body) != nil || body.Error.Code == "" {
		return "(no code)"
	}
	return body.Error.Code
}

// readReply reads a UI message stream to its end: completed (finish, finishReason stop, [DONE], no error
// chunk), failed (an error chunk; its text is returned) or cut (the body ended early).
func readReply(r io.Reader) (replyResult, string) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	var finish, errText string
	var sawError bool
	for sc.Scan() {
		line, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok {
			continue
		}
		if line == "[DONE]" {
			switch {
			case sawError:
				return replyFailed, errText
			case finish == "stop":
				return replyCompleted, ""
			default:
				return replyFailed, "finishReason " + finish
			}
		}
		var chunk struct{ Type, FinishReason, ErrorText string }
		if json.Unmarshal([]byte(line), &chunk) != nil {
			continue
		}
		switch chunk.Type {
		case "finish":
			finish = chunk.FinishReason
		case "error":
			sawError, errText = true, chunk.ErrorText
		}
	}
	return replyCut, ""
}

// pause waits ms milliseconds or until ctx ends.
func pause(ctx context.Context, ms int) {
	select {
	case <-ctx.Done():
	case <-time.After(time.Duration(ms) * time.Millisecond):
	}
}
