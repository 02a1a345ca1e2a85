// Command wake is the job state machine's Deliver task (not a function URL): it delivers a finished job's
// result into its thread as a steer message and runs a delivery pass over the thread's queue, claiming an idle
// thread for server-side turns (lib/jobs Tasks.Deliver). Input is an agent.JobTask, output the
// agent.DeliveryResult. It runs turns, so it is composed like the chat function: the model, the demo and job
// tools (a steer turn may dispatch another job), approvals signed with the application secret, and the job
// state machine for follow-up delivery passes.
package main

import (
	"context"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

func main() { boot.StartTask(newTask) }

// newTask builds the delivery task from the environment (getenv) and the AWS configuration.
func newTask(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (func(context.Context, agent.JobTask) (agent.DeliveryResult, error), error) {
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
	a, err := boot.NewAgent(ctx, b, jobs)
	if err != nil {
		return nil, err
	}
	return a.Tasks.Deliver, nil
}
