package transcript_test

import (
	"fmt"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/transcript"
)

// longThread is n stored messages: turns of a user question and a reply that calls a tool with a 4 KiB result
// (every tenth a list_notes snapshot) and says something.
func longThread(n int) []agent.Message {
	out := strings.Repeat("result ", 4096/7)
	msgs := make([]agent.Message, 0, n)
	for i := 0; len(msgs) < n; i++ {
		msgs = append(msgs, msg(fmt.Sprintf("u%d", i), agent.RoleUser, text(fmt.Sprintf("question %d about the notes", i))))
		tool := "search"
		if i%10 == 0 {
			tool = "list_notes"
		}
		msgs = append(msgs, msg(fmt.Sprintf("a%d", i), agent.RoleAssistant, stepStart(), reasoning("let me look that up"),
			done(tool, fmt.Sprintf("c%d", i), out), stepStart(), text("Here is what I found.")))
	}
	return msgs[:n]
}

// BenchmarkPrune is the pruning that runs before every step: a 10,000-message thread (40 MB of tool results
// against the default budget), converted once per run (not timed here), pruned per step (the target: under
// 10 ms, README "Numbers").
func BenchmarkPrune(b *testing.B) {
	for _, n := range []int{50, 10_000} {
		b.Run(fmt.Sprintf("messages=%d", n), func(b *testing.B) {
			h := transcript.NewHistory(longThread(n), transcript.Config{Snapshots: map[string]bool{"list_notes": true}})
			draft := []agent.Part{stepStart(), done("search", "d1", "draft result")}
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				h.Build(draft)
			}
			r := h.Last()
			b.ReportMetric(float64(r.EstimatedTokens), "tokens")
			b.ReportMetric(float64(r.PairsStubbed), "stubbed")
			b.ReportMetric(float64(r.MessagesDropped), "dropped")
		})
	}
}

// BenchmarkConvert is the once-per-run conversion of the stored messages (JSON decoding of every part).
func BenchmarkConvert(b *testing.B) {
	msgs := longThread(10_000)
	b.ReportAllocs()
	for b.Loop() {
		transcript.NewHistory(msgs, transcript.Config{})
	}
}
