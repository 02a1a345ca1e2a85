// Command subagent is the job state machine's RunSubagent task (not a function URL): it runs one sub-agent job
// and stores its result (lib/jobs Tasks.Subagent). Input and output are the agent.JobTask. A failure is
// reported as the named error the state machine matches: TransientError is retried, JobFailedError (and every
// other error) takes the failure path to delivery.
//
// Least privilege: it reads the model key but not the application secret (it verifies no token and signs
// nothing), touches only the job's item, and starts no executions (delivery is the state machine's next state).
package main

import (
	"context"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"

	"github.com/agentloop/agentloop/functions/internal/boot"
	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/jobs"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

func main() { boot.StartTask(newTask) }

// newTask builds the sub-agent task from the environment (getenv) and the AWS configuration.
func newTask(ctx context.Context, getenv func(string) string, awsCfg aws.Config, log *slog.Logger) (func(context.Context, agent.JobTask) (agent.JobTask, error), error) {
	b, err := boot.Load(ctx, getenv, awsCfg, log, func(cfg config.Config) boot.Secrets {
		return boot.Secrets{ModelKey: &ssmsecrets.Secret{Param: cfg.OpenAIAPIKeyParam, Fallback: cfg.OpenAIAPIKey}}
	})
	if err != nil {
		return nil, err
	}
	model, err := b.Model(ctx)
	if err != nil {
		return nil, err
	}
	tasks := jobs.NewTasks(jobs.Deps{Store: b.Store, Model: model, Kinds: boot.JobKinds(), Clock: b.Clock, Logger: log},
		jobs.Config{Contract: boot.Contract(), ModelName: b.SubagentModelName()})
	return tasks.Subagent, nil
}
