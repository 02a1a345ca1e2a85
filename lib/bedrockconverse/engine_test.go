package bedrockconverse_test

import (
	"encoding/json"
	"log/slog"
	"reflect"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/bedrockconverse"
	"github.com/agentloop/agentloop/lib/modeltest"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
)

// TestMatrix is the Converse column of the adapter matrix (lib/modeltest): the Stream cases and the engine's
// turns over the offline /model/{modelId}/converse-stream, which refuses every transcript Bedrock would. Over the
// reasoning turns it checks what is this adapter's own: the later requests carry the first step's reasoning with
// its signature (stored by the engine as ModelMessage.ReasoningData) as a reasoningContent block first in its
// assistant message, and the tool results go back as one user message.
func TestMatrix(t *testing.T) {
	t.Parallel()
	matrix.Run(t, modeltest.Adapter{
		Path: "/converse-stream",
		New: func(root string) agent.Model {
			return bedrockconverse.New(bedrockconverse.Config{BaseURL: root + "/", Model: "amazon.nova-pro-v1:0", Region: "us-east-1",
				AWS:         &aws.Config{Credentials: credentials.NewStaticCredentialsProvider("AKIDEXAMPLE", "secret", "")},
				BackoffBase: time.Millisecond, Logger: slog.New(slog.DiscardHandler)})
		},
		Check: func(t *testing.T, bodies [][]byte) {
			var requests [][]map[string]any
			for _, b := range bodies {
				var body struct {
					Messages []map[string]any `json:"messages"`
				}
				if err := json.Unmarshal(b, &body); err != nil {
					t.Fatal(err)
				}
				requests = append(requests, body.Messages)
			}
			// Reasoning blocks per request: none, then the tool round's (first in its assistant message), then both
			// steps' (each checked by the offline model against the signature it issued).
			reasoningBlocks := func(msgs []map[string]any) (n int) {
				for _, m := range msgs {
					blocks, _ := m["content"].([]any)
					for i, b := range blocks {
						if _, ok := b.(map[string]any)["reasoningContent"]; ok {
							if i != 0 {
								t.Errorf("reasoningContent block at %d of %v", i, blocks)
							}
							n++
						}
					}
				}
				return n
			}
			if got := []int{reasoningBlocks(requests[0]), reasoningBlocks(requests[1]), reasoningBlocks(requests[2])}; !reflect.DeepEqual(got, []int{0, 1, 2}) {
				t.Fatalf("reasoning blocks per request %v, want [0 1 2]", got)
			}
			// The tool results went back as one user message of two toolResult blocks after the toolUse turn.
			if r := requests[1]; len(r) != 3 || len(r[2]["content"].([]any)) != 2 {
				t.Errorf("tool round messages = %v", r)
			}
		},
	})
}
