package openairesponses_test

import (
	"encoding/json"
	"log/slog"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modeltest"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
	"github.com/agentloop/agentloop/lib/openairesponses"
)

// TestMatrix is the Responses column of the adapter matrix (lib/modeltest): the Stream cases and the engine's
// turns over the offline /v1/responses, which refuses every transcript OpenAI would. Over the reasoning turns it
// checks what is this adapter's own: each step's encrypted reasoning, kept by the engine
// (ModelMessage.ReasoningData), is replayed as reasoning items carrying the encrypted content the offline model
// issued (and verified).
func TestMatrix(t *testing.T) {
	t.Parallel()
	matrix.Run(t, modeltest.Adapter{
		Path: "/responses",
		New: func(root string) agent.Model {
			return openairesponses.New(openairesponses.Config{BaseURL: root + "/v1/", Model: "offline", BackoffBase: time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
		},
		Check: func(t *testing.T, bodies [][]byte) {
			var got []int
			for _, b := range bodies {
				var body struct {
					Input []map[string]any `json:"input"`
				}
				if err := json.Unmarshal(b, &body); err != nil {
					t.Fatal(err)
				}
				n := 0
				for _, it := range body.Input {
					if it["type"] == "reasoning" {
						if enc, _ := it["encrypted_content"].(string); !strings.HasPrefix(enc, "offline1.") {
							t.Fatalf("reasoning item without the encrypted content issued: %v", it)
						}
						n++
					}
				}
				got = append(got, n)
			}
			if !reflect.DeepEqual(got, []int{0, 1, 2}) {
				t.Fatalf("reasoning items per request %v, want [0 1 2]", got)
			}
		},
	})
}
