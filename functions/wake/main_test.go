package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// The wake task runs turns: it refuses to start without its table, the application secret (approval
// signatures) or the state machine (follow-up delivery passes, job tools in steer turns).
func TestNewTask(t *testing.T) {
	t.Parallel()
	base := map[string]string{"TABLE_NAME": "t", "AGENT_SECRET": "wake-test-secret-0123456789abcdef0123",
		"JOBS_STATE_MACHINE_ARN": "arn:aws:states:us-east-1:123456789012:stateMachine:agentloop-jobs"}
	build := func(drop string) error {
		env := map[string]string{}
		for k, v := range base {
			if k != drop {
				env[k] = v
			}
		}
		_, err := newTask(context.Background(), func(k string) string { return env[k] }, aws.Config{Region: "us-east-1"}, slog.New(slog.DiscardHandler))
		return err
	}
	if err := build(""); err != nil {
		t.Fatalf("fully configured: %v", err)
	}
	for _, drop := range []string{"TABLE_NAME", "AGENT_SECRET", "JOBS_STATE_MACHINE_ARN"} {
		if err := build(drop); err == nil {
			t.Errorf("started without %s", drop)
		}
	}
}
