package boot

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"

	"github.com/aws/aws-lambda-go/events"
	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambdaurl"
	"github.com/aws/aws-sdk-go-v2/aws"
	awslambda "github.com/aws/aws-sdk-go-v2/service/lambda"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/lambdalaunch"
)

// Continuer is a function URL handler that also continues runs (the chat function's: issue 21, runs longer than one
// invocation and background runs).
type Continuer interface {
	http.Handler
	Continue(ctx context.Context, c agent.Continuation) (agent.Run, error)
}

// StartContinuing runs the chat function: a function URL request is served through lambdaurl as Start serves it,
// and a continuation event (lib/lambdalaunch: the function's asynchronous invocation of itself) continues its run
// when the handler is a Continuer.
func StartContinuing(build Builder) { lambda.StartHandlerFunc(Dispatch(coldStart(build))) }

// Dispatch tells the two kinds of payload apart. A continuation runs to its end (or its next hand-over) inside the
// invocation and answers a small JSON summary; one whose run moved on (a duplicate delivery, a reaped run) is a
// success with nothing done, and any other error fails the invocation, so Lambda retries it (the retry's
// conditional claim decides again). Anything else is a function URL request, whose response streams (the
// RESPONSE_STREAM invoke mode).
func Dispatch(h http.Handler) func(ctx context.Context, payload json.RawMessage) (any, error) {
	serve := lambdaurl.Wrap(h)
	cont, _ := h.(Continuer)
	return func(ctx context.Context, payload json.RawMessage) (any, error) {
		if ev, ok := lambdalaunch.IsEvent(payload); ok && cont != nil {
			run, err := cont.Continue(ctx, ev.Continuation)
			if err != nil && !errors.Is(err, agent.ErrRunFenced) {
				return nil, err
			}
			return map[string]any{"threadId": ev.Continuation.ThreadID, "runId": ev.Continuation.RunID, "status": run.Status}, nil
		}
		var req events.LambdaFunctionURLRequest
		if err := json.Unmarshal(payload, &req); err != nil {
			return nil, err
		}
		return serve(ctx, &req)
	}
}

// ChatLauncher is the reaper function's launcher: an asynchronous invocation of the chat function (name:
// AGENT_CHAT_FUNCTION) with a continuation, which the chat function's handler continues (Dispatch). Without a name
// it is nil: the reaper then leaves handed-over runs to the chat function's lazy reaps until they are past their
// bounds.
func ChatLauncher(name string, awsCfg aws.Config) agent.RunLauncher {
	if name == "" {
		return nil
	}
	return lambdalaunch.Launcher{Client: awslambda.NewFromConfig(awsCfg), Function: name}
}

// SelfLauncher is the launcher of a function that continues its runs in itself: an asynchronous invocation of the
// function named by AWS_LAMBDA_FUNCTION_NAME (set by Lambda). Outside Lambda (no name) it launches nothing, and
// runs stay in their invocation.
func SelfLauncher(getenv func(string) string, awsCfg aws.Config) agent.RunLauncher {
	name := getenv("AWS_LAMBDA_FUNCTION_NAME")
	if name == "" {
		return nil
	}
	return lambdalaunch.Launcher{Client: awslambda.NewFromConfig(awsCfg), Function: name}
}
