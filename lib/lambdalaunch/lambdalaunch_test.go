package lambdalaunch_test

import (
	"context"
	"errors"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/lambdalaunch"
)

type invoker struct {
	in     *lambda.InvokeInput
	status int32
	err    error
}

func (i *invoker) Invoke(_ context.Context, in *lambda.InvokeInput, _ ...func(*lambda.Options)) (*lambda.InvokeOutput, error) {
	i.in = in
	if i.err != nil {
		return nil, i.err
	}
	return &lambda.InvokeOutput{StatusCode: i.status}, nil
}

func TestLaunchInvokesItselfAsynchronously(t *testing.T) {
	t.Parallel()
	c := agent.Continuation{ThreadID: "th", RunID: "run_1", Epoch: 4, Segment: 9, Steps: 3, HandOvers: 2}
	inv := &invoker{status: 202}
	l := lambdalaunch.Launcher{Client: inv, Function: "agentloop-chat"}
	if err := l.Launch(context.Background(), c); err != nil {
		t.Fatal(err)
	}
	if aws.ToString(inv.in.FunctionName) != "agentloop-chat" || inv.in.InvocationType != types.InvocationTypeEvent {
		t.Fatalf("invoked %s as %s, want agentloop-chat as Event", aws.ToString(inv.in.FunctionName), inv.in.InvocationType)
	}
	ev, ok := lambdalaunch.IsEvent(inv.in.Payload)
	if !ok || ev.Continuation != c {
		t.Fatalf("payload %s read back as %+v (%v), want %+v", inv.in.Payload, ev, ok, c)
	}
}

func TestLaunchFailures(t *testing.T) {
	t.Parallel()
	c := agent.Continuation{ThreadID: "th", RunID: "run_1", Epoch: 1}
	for name, l := range map[string]lambdalaunch.Launcher{
		"invoke error": {Client: &invoker{err: errors.New("throttled")}, Function: "f"},
		"not accepted": {Client: &invoker{status: 200}, Function: "f"},
		"no function":  {Client: &invoker{status: 202}},
		"no client":    {Function: "f"},
	} {
		if err := l.Launch(context.Background(), c); !errors.Is(err, &agent.Error{Code: agent.CodeLaunchUnavailable}) {
			t.Errorf("%s: %v, want launch_unavailable (the run goes on where it is)", name, err)
		}
	}
}

func TestIsEventTellsAFunctionURLRequestApart(t *testing.T) {
	t.Parallel()
	for _, payload := range []string{
		`{"version":"2.0","rawPath":"/chat","requestContext":{"http":{"method":"POST"}},"body":"{}"}`,
		`{"agentloop":"something else","continuation":{"threadId":"th","runId":"r"}}`,
		`{"agentloop":"agentloop.run.continue","continuation":{"threadId":"th"}}`,
		`not json`,
	} {
		if _, ok := lambdalaunch.IsEvent([]byte(payload)); ok {
			t.Errorf("IsEvent(%s) = true", payload)
		}
	}
}
