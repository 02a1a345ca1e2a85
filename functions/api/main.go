// Command api is the thread API Lambda: /threads... and /healthz behind a RESPONSE_STREAM function URL (plain
// JSON replies). It needs the store and the application secret (to verify tokens) but no model and no job
// state machine: it never runs a turn and never starts an execution, so it has no access to the OpenAI key and
// no states:StartExecution.
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
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/web"
)

func main() { boot.Start(newHandler) }

// newHandler builds the API handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) boot.Secrets {
		return boot.Secrets{App: &ssmsecrets.Secret{Param: cfg.SecretParam, Fallback: cfg.Secret},
			Webhook: &ssmsecrets.Secret{Param: cfg.WebhookSecretParam, Fallback: cfg.WebhookSecret}} // a lazy reap ends a run
	})
	if err != nil {
		return nil, err
	}
	cfg := b.Config
	// A thread read reaps a dead run lazily; the reaper asks the tools (job tools included) what they recorded,
	// never a model, and re-drives nothing (that is the scheduled reaper's work).
	rp := b.Reaper(b.Tools(nil), nil, nil)
	// The web app at the function URL's root; it calls the chat function's URL (AGENT_CHAT_URL) cross-origin.
	pages := web.Pages(web.Handler(web.Config{ChatURL: cfg.ChatURL,
		MaxMessageBytes: int64(cmp.Or(cfg.MaxMessageBytes, engine.DefaultMaxMessageBytes))}))
	return httpapi.NewAPI(httpapi.Deps{Threads: b.Threads(rp), Clock: b.Clock, Logger: log, Auth: b.Verifier, MaxBodyBytes: cfg.MaxBodyBytes,
		Refusals: b.Refusals, Pages: pages}), nil
}
