// Command chat is the chat Lambda: POST /chat and GET /chat/{threadId}/stream behind a RESPONSE_STREAM function
// URL. It serves the same handler as `agentloop dev`, over DynamoDB, the configured OpenAI-compatible model and
// the job state machine (a job tool's call starts an execution; a run that leaves the queue full asks for a
// delivery pass).
package main

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/engine"
	"github.com/agentloop/agentloop/lib/httpapi"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

func main() { boot.StartContinuing(newHandler) }

// newHandler builds the chat handler from the environment (getenv) and the AWS configuration.
func newHandler(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (http.Handler, error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) boot.Secrets {
		return boot.Secrets{
			App:      &ssmsecrets.Secret{Param: cfg.SecretParam, Fallback: cfg.Secret},
			ModelKey: &ssmsecrets.Secret{Param: cfg.OpenAIAPIKeyParam, Fallback: cfg.OpenAIAPIKey},
			Webhook:  &ssmsecrets.Secret{Param: cfg.WebhookSecretParam, Fallback: cfg.WebhookSecret},
		}
	})
	if err != nil {
		return nil, err
	}
	cfg := b.Config
	jobs, err := b.StepFunctions(cfg.JobsStateMachineARN)
	if err != nil {
		return nil, err
	}
	// A run goes on in an asynchronous invocation of this function (lib/lambdalaunch says why): before the
	// invocation's deadline (AGENT_HANDOVER_MARGIN), and at once for a background run.
	a, err := boot.NewAgent(ctx, b, jobs, boot.WithLauncher(boot.SelfLauncher(getenv, awsCfg)))
	if err != nil {
		return nil, err
	}
	h := httpapi.NewChat(httpapi.Deps{Engine: a.Engine, Threads: a.Threads, Clock: b.Clock, Logger: log,
		Auth: b.Verifier, MaxBodyBytes: cfg.MaxBodyBytes, Refusals: b.Refusals})
	return chatFunction{Handler: h, Engine: a.Engine}, nil
}

// chatFunction serves the function URL and continues runs (boot.Continuer: the continuation events this function
// sends itself).
type chatFunction struct {
	http.Handler
	*engine.Engine
}
