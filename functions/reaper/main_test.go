package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// The reaper starts with no secret at all, but not without its table or the state machine it re-drives jobs
// through.
func TestNewTask(t *testing.T) {
	t.Parallel()
	build := func(env map[string]string) error {
		_, err := newTask(context.Background(), func(k string) string { return env[k] }, aws.Config{Region: "us-east-1"}, slog.New(slog.DiscardHandler))
		return err
	}
	arn := "arn:aws:states:us-east-1:123456789012:stateMachine:agentloop-jobs"
	if err := build(map[string]string{"TABLE_NAME": "t", "JOBS_STATE_MACHINE_ARN": arn}); err != nil {
		t.Fatalf("with a table and a state machine: %v", err)
	}
	if err := build(map[string]string{"TABLE_NAME": "t"}); err == nil {
		t.Fatal("started without JOBS_STATE_MACHINE_ARN")
	}
	if err := build(map[string]string{"JOBS_STATE_MACHINE_ARN": arn}); err == nil {
		t.Fatal("started without TABLE_NAME")
	}
}
