package main

import (
	"context"
	"log/slog"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
)

// The sub-agent task starts without the application secret (it verifies no token and signs nothing) and without
// a state machine (it starts no executions); it refuses to start without its table.
func TestNewTask(t *testing.T) {
	t.Parallel()
	build := func(env map[string]string) error {
		_, err := newTask(context.Background(), func(k string) string { return env[k] }, aws.Config{Region: "us-east-1"}, slog.New(slog.DiscardHandler))
		return err
	}
	if err := build(map[string]string{"TABLE_NAME": "t"}); err != nil {
		t.Fatalf("with a table only: %v", err)
	}
	if err := build(map[string]string{}); err == nil {
		t.Fatal("started without TABLE_NAME")
	}
	if err := build(map[string]string{"TABLE_NAME": "t", "AGENT_RUN_TIMEOUT": "forever"}); err == nil {
		t.Fatal("started with a bad bound")
	}
}
