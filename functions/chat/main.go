// Command chat is the chat Lambda: POST /chat and GET /chat/{threadId}/stream behind a RESPONSE_STREAM function
// URL. It serves the same handler as `agentloop dev`, over DynamoDB and the configured OpenAI-compatible model.
package main

import (
	"cmp"
	"context"
	"log/slog"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/interrupts"
	"github.com/agentloop/agentloop/lib/openai"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/tools"
)

func main() { boot.Start(newHandler) }

// newHandler builds the chat handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) []ssmsecrets.Secret {
		return []ssmsecrets.Secret{
			{Label: "application secret", Param: cfg.SecretParam, Fallback: cfg.Secret},
			{Label: "OpenAI API key", Param: cfg.OpenAIAPIKeyParam, Fallback: cfg.OpenAIAPIKey, Optional: true},
		}
	})
	if err != nil {
		return nil, err
	}
	cfg := b.Config
	model := cmp.Or(cfg.Model, config.DefaultModel)
	toolset := tools.Demo(b.Store, b.Clock)
	rp := reaper.New(reaper.Deps{Store: b.Store, Tools: toolset, Clock: b.Clock, Logger: log}, cfg.Reaper())
	signer, err := interrupts.NewSigner([]byte(b.Secrets[0]))
	if err != nil {
		return nil, err
	}
	eng := engine.New(engine.Deps{Store: b.Store, Model: openai.New(cfg.OpenAI(cfg.OpenAIBaseURL, b.Secrets[1], model, log)),
		Tools: toolset, Reaper: rp, Clock: b.Clock, Signer: signer, Logger: log}, cfg.Engine(model))
	th := threads.New(threads.Deps{Store: b.Store, Reaper: rp, Clock: b.Clock, Logger: log}, cfg.Threads())
	return httpapi.NewChat(httpapi.Deps{Engine: eng, Threads: th, Clock: b.Clock, Logger: log,
		Auth: b.Verifier, MaxBodyBytes: cfg.MaxBodyBytes}), nil
}
