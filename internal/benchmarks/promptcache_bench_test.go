package benchmarks

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/devserver"
	"github.com/agentloop/agentloop/lib/offline"
)

// Prompt caching that survives pruning (issue 20 item 3). One thread of cacheTurns turns runs through the whole
// local stack (engine, openai adapter, SQLite) against the offline model with its prefix cache on
// (offline.WithPromptCache: cached input is the longest prefix of whole messages a request with the same
// prompt_cache_key sent before). A turn is a 20-word message and its echo (about 70 estimated tokens), every
// third one a tool call with a 60-word result (two steps, about 280 tokens): the budget (cacheBudget tokens) is
// met after about 20 turns, a thread is some 2.5 budgets. Reported: the share of all input tokens that were
// cached, and of the second half's turns (all pruned), with pruning per step (AGENT_CONTEXT_BLOCK_TOKENS=1, the
// cutoff moves at every step), in blocks of the default (10% of the budget, about 2 turns here) and of 25%.
// Run with -benchtime 1x (make bench does).

const (
	cacheTurns  = 50
	cacheBudget = 1500
)

func BenchmarkPromptCache(b *testing.B) {
	for _, tc := range []struct {
		name  string
		block int
	}{{"per-step", 1}, {"blocks", 0}, {"blocks-25%", cacheBudget / 4}} {
		b.Run(tc.name, func(b *testing.B) {
			cfg := config.Config{Secret: "bench-secret-bench-secret-bench-secret", ThreadsPerMinute: -1,
				ContextTokens: cacheBudget, ContextBlockTokens: tc.block}
			st, err := devserver.New(context.Background(), devserver.Options{Data: b.TempDir(), Config: cfg,
				Offline: []offline.Option{offline.WithPromptCache(), offline.WithWordDelay(0), offline.WithReplyDelay(0)},
				Tools:   func(agent.ValueStore, agent.Clock) []agent.Tool { return []agent.Tool{lookupTool()} }})
			if err != nil {
				b.Fatal(err)
			}
			b.Cleanup(st.Close)
			srv := httptest.NewServer(st.Handler)
			b.Cleanup(srv.Close)
			tok, err := st.Token("bench", time.Hour)
			if err != nil {
				b.Fatal(err)
			}
			var all, late agent.Usage
			b.ResetTimer()
			for i := 0; i < b.N; i++ {
				thread := fmt.Sprintf("cache-%d", i)
				r := rand.New(rand.NewPCG(uint64(i), 3))
				var half agent.Usage
				for turn := range cacheTurns {
					text := cacheWords(r, 20)
					if turn%3 == 2 {
						text = fmt.Sprintf(`/tool lookup {"topic":%q}`, text)
					}
					cacheTurn(b, srv.URL, tok, chat(thread, fmt.Sprintf("m%d", turn), text))
					if turn == cacheTurns/2-1 {
						half = threadUsage(b, st, thread)
					}
				}
				u := threadUsage(b, st, thread)
				all, late = all.Add(u), late.Add(u.Sub(half))
			}
			b.StopTimer()
			b.ReportMetric(100*float64(all.CachedInputTokens)/float64(all.InputTokens), "cached-%")
			b.ReportMetric(100*float64(late.CachedInputTokens)/float64(late.InputTokens), "cached-%-second-half")
			b.ReportMetric(float64(all.InputTokens)/float64(b.N), "input-tokens/thread")
		})
	}
}

// lookupTool answers any topic with 60 words (a tool output worth pruning).
func lookupTool() agent.Tool {
	return agent.Tool{Name: "lookup", Description: "Look a topic up.", Kind: agent.ToolServer,
		InputSchema: json.RawMessage(`{"type":"object","properties":{"topic":{"type":"string"}},"required":["topic"]}`),
		Execute: func(_ context.Context, inv agent.ToolInvocation) (json.RawMessage, error) {
			r := rand.New(rand.NewPCG(uint64(len(inv.ToolCallID)), uint64(len(inv.Input))))
			return json.Marshal(cacheWords(r, 60))
		}}
}

func cacheWords(r *rand.Rand, n int) string {
	// About four chars a word with its space: the offline model's count (a token a word) is about the
	// transcript's chars/4 estimate, as a real provider's is, so pruning (not the window's read) decides the cut.
	words := []string{"ok", "go", "cache", "note", "up", "lambda", "in", "it", "we", "so"}
	out := make([]string, n)
	for i := range out {
		out[i] = words[r.IntN(len(words))]
	}
	return strings.Join(out, " ")
}

func cacheTurn(b *testing.B, url, tok, body string) {
	req, _ := http.NewRequest("POST", url+"/chat", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+tok)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		b.Fatal(err)
	}
	data, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil || resp.StatusCode != 200 || !bytes.HasSuffix(data, []byte("data: [DONE]\n\n")) {
		b.Fatalf("turn: %d %v %s", resp.StatusCode, err, data)
	}
}

func threadUsage(b *testing.B, st *devserver.Stack, thread string) agent.Usage {
	th, err := st.Store.GetThread(context.Background(), thread)
	if err != nil {
		b.Fatal(err)
	}
	return th.Usage
}
