package locallaunch_test

import (
	"context"
	"errors"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/locallaunch"
)

func TestLaunchRunsAndCloseRefuses(t *testing.T) {
	t.Parallel()
	ran := make(chan agent.Continuation, 1)
	release := make(chan struct{})
	l := locallaunch.New(func(_ context.Context, c agent.Continuation) (agent.Run, error) {
		ran <- c
		<-release
		return agent.Run{ID: c.RunID}, nil
	}, nil)
	want := agent.Continuation{ThreadID: "th", RunID: "run_1", Epoch: 3, Segment: 7, Steps: 2, HandOvers: 1}
	if err := l.Launch(context.Background(), want); err != nil {
		t.Fatal(err)
	}
	if got := <-ran; got != want {
		t.Fatalf("continued %+v, want %+v", got, want)
	}
	closed := make(chan error, 1)
	go func() { closed <- l.Close(context.Background()) }()
	close(release) // Close waits for the continuation in flight
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
	err := l.Launch(context.Background(), want)
	if !errors.Is(err, &agent.Error{Code: agent.CodeLaunchUnavailable}) {
		t.Fatalf("Launch after Close = %v, want launch_unavailable (the run goes on where it is)", err)
	}
}
