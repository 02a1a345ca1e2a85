package openai_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/modeltest"
	"github.com/agentloop/agentloop/lib/modeltest/matrix"
	"github.com/agentloop/agentloop/lib/openai"
)

// TestMatrix is the Chat Completions column of the adapter matrix (lib/modeltest): the Stream cases and the
// engine's turns over the offline /v1/chat/completions, which refuses every transcript OpenAI would.
func TestMatrix(t *testing.T) {
	t.Parallel()
	matrix.Run(t, modeltest.Adapter{
		Path: "/chat/completions",
		New: func(root string) agent.Model {
			return openai.New(openai.Config{BaseURL: root + "/v1/", Model: "offline", BackoffBase: time.Millisecond,
				Logger: slog.New(slog.DiscardHandler)})
		},
	})
}
