// Command api is the thread API Lambda: /threads... and /healthz behind a RESPONSE_STREAM function URL (plain
// JSON replies). It needs the store and the application secret (to verify tokens) but no model: it never runs
// a turn, so it has no access to the OpenAI key.
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/threads"
	"github.com/agentloop/agentloop/lib/tools"
)

func main() { boot.Start(newHandler) }

// newHandler builds the API handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) []ssmsecrets.Secret {
		return []ssmsecrets.Secret{{Label: "application secret", Param: cfg.SecretParam, Fallback: cfg.Secret}}
	})
	if err != nil {
		return nil, err
	}
	cfg := b.Config
	// A thread read reaps a dead run lazily; the reaper asks the tools what they recorded, never a model.
	rp := reaper.New(reaper.Deps{Store: b.Store, Tools: tools.Demo(b.Store, b.Clock), Clock: b.Clock, Logger: log}, cfg.Reaper())
	th := threads.New(threads.Deps{Store: b.Store, Reaper: rp, Clock: b.Clock, Logger: log}, cfg.Threads())
	return httpapi.NewAPI(httpapi.Deps{Threads: th, Clock: b.Clock, Logger: log, Auth: b.Verifier, MaxBodyBytes: cfg.MaxBodyBytes}), nil
}
