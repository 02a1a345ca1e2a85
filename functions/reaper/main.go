// Command reaper is the EventBridge schedule target (every minute): one reaper sweep (lib/reaper Tick) that
// finishes runs whose Lambda died, expires old interrupts, and asks the job state machine for delivery passes
// of undelivered jobs and forgotten queues. It logs the sweep's counts as one line and fails only when the
// sweep itself fails (one bad claim is logged and the others go on).
//
// It also delivers the completion signals that are due (lib/signals: retries, and the ones a dead process left),
// and announces the runs it reaps.
//
// It continues the handed-over runs whose continuation never started (lib/reaper relaunch.go) by invoking the chat
// function asynchronously with the continuation (lib/lambdalaunch), as the chat function continues its own runs.
//
// Least privilege: it reads no secret but the completion webhook's, when AGENT_WEBHOOK_URL is set (it verifies no
// token, signs no approval and calls no model; the tools only tell it what a call recorded), starts executions of
// the job state machine only, puts events on the default bus only, and invokes the chat function only.
package main

import (
	"context"
	"log/slog"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

func main() { boot.StartTask(newTask) }

// newTask builds the scheduled sweep from the environment (getenv) and the AWS configuration.
func newTask(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (func(context.Context, events.EventBridgeEvent) (reaper.Stats, error), error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) boot.Secrets {
		return boot.Secrets{Webhook: &ssmsecrets.Secret{Param: cfg.WebhookSecretParam, Fallback: cfg.WebhookSecret}}
	})
	if err != nil {
		return nil, err
	}
	cfg := b.Config
	jobs, err := b.StepFunctions(cfg.JobsStateMachineARN)
	if err != nil {
		return nil, err
	}
	// A handed-over run whose continuation never started is continued by invoking the chat function
	// (AGENT_CHAT_FUNCTION), as the chat function continues its own runs.
	rp := b.Reaper(b.Tools(nil), jobs, boot.ChatLauncher(cfg.ChatFunction, awsCfg))
	return func(ctx context.Context, _ events.EventBridgeEvent) (reaper.Stats, error) {
		st, err := rp.Tick(ctx)
		level, attrs := slog.LevelInfo, []any{"nominated", st.Nominated, "reaped", st.Reaped, "continued", st.Continued, "expired", st.Expired,
			"redriven", st.Redriven, "swept", st.Swept, "signaled", st.Signaled}
		if err != nil {
			level, attrs = slog.LevelError, append(attrs, "err", err)
		}
		log.Log(ctx, level, "agent.reaper.tick", attrs...)
		return st, err
	}, nil
}
