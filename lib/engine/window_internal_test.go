package engine

import (
	"fmt"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
)

// How the next page of a turn's window is sized: it reaches a message the window must reach (an edit's), it aims
// at what the budget still needs, and it never reads more than twice what was read, so that small newest
// messages (a thread's recent chit-chat) cannot make an estimate that reads a thousand large older ones.
func TestWindowNextPage(t *testing.T) {
	t.Parallel()
	recs := func(n int, seq0 int64, tokens int) *window {
		w := &window{first: 32}
		for i := range n {
			w.recs = append(w.recs, agent.MessageRecord{Seq: seq0 + int64(i), Message: agent.Message{ID: fmt.Sprintf("m%d", i)}})
			w.tokens = append(w.tokens, tokens)
		}
		return w
	}
	for _, c := range []struct {
		name   string
		w      *window
		budget int
		want   int
	}{
		{"small newest messages: at most twice what was read", recs(32, 1000, 10), 100_000, 64},
		{"what the budget still needs, a quarter more", recs(32, 1000, 1_000), 40_000, 11},
		{"budget met (the read goes on for a user message): the first page's size", recs(32, 1000, 5_000), 100_000, 32},
		{"an edit's message behind the window: the positions down to it", func() *window {
			w := recs(32, 1000, 10)
			w.reach = &agent.MessageCursor{Seq: 990, ID: "old"}
			return w
		}(), 100_000, 11},
		{"an edit's message far behind: at most MaxWindowPage", func() *window {
			w := recs(32, 100_000, 10)
			w.reach = &agent.MessageCursor{Seq: 3, ID: "old"}
			return w
		}(), 100_000, MaxWindowPage},
	} {
		t.Run(c.name, func(t *testing.T) {
			if got := c.w.nextPage(c.budget); got != c.want {
				t.Fatalf("nextPage = %d, want %d", got, c.want)
			}
		})
	}
}
