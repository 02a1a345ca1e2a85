// Package lambdalaunch is the agent.RunLauncher of the chat Lambda: a run's continuation (a hand-over before the
// invocation's deadline, a background run) is an asynchronous invocation of the chat function itself
// (lambda:InvokeFunction with InvocationType Event), whose payload is an Event rather than a function URL request;
// the function's handler tells the two apart (IsEvent) and continues the run (engine.Engine.Continue).
//
// Why the function invokes itself, and not a separate function or a Step Functions task: the continuation is the
// same work as the request it continues (the same engine, model, tools, configuration, memory and timeout), so the
// same function runs it, and no second copy of the chat configuration can drift from the first; an asynchronous
// invocation is accepted in one request (202) and queued by Lambda, which retries a failed delivery, and a
// duplicate delivery is harmless (the continuation takes the claim with a conditional write, agent.HandOverStore:
// a second one finds it moved and does nothing). A Step Functions task would add a state machine, an execution per
// hand-over and a transition's latency to what one asynchronous Invoke does; the job state machine stays for jobs,
// whose contract (a timeout, retries, a failure path, delivery) a continuation does not need: a continuation that
// never starts leaves a claim the reaper finishes. The policy is least privilege: lambda:InvokeFunction on the chat
// function's own ARN only (template.yaml ChatSelfInvokePolicy).
//
// Lambda's asynchronous queue usually starts the invocation within a second; one that starts later than the
// claim's stale window (AGENT_STALE_AFTER, 30 s) finds the run reaped, failed with code stale, its reply kept.
// AGENT_RUN_TIMEOUT bounds how many hand-overs a run makes (its whole time over the invocation's less the margin).
// Should the account's recursive loop detection ever stop a long chain of self-invocations, the run's claim goes
// stale and the reaper finishes it as above; the function's RecursiveLoop setting (Allow) lifts that.
package lambdalaunch

import (
	"context"
	"encoding/json"
	"fmt"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/lambda"
	"github.com/aws/aws-sdk-go-v2/service/lambda/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// EventKind is the Event's kind field: it names a continuation event.
const EventKind = "agentloop.run.continue"

// Event is the payload of a continuation invocation. A function URL request has no "agentloop" field.
type Event struct {
	Kind         string             `json:"agentloop"`
	Continuation agent.Continuation `json:"continuation"`
}

// IsEvent decodes payload as a continuation event; false when it is anything else (a function URL request).
func IsEvent(payload []byte) (Event, bool) {
	var ev Event
	if json.Unmarshal(payload, &ev) != nil || ev.Kind != EventKind || ev.Continuation.RunID == "" || ev.Continuation.ThreadID == "" {
		return Event{}, false
	}
	return ev, true
}

// Invoker is the part of the Lambda client the launcher uses (*lambda.Client).
type Invoker interface {
	Invoke(ctx context.Context, in *lambda.InvokeInput, opts ...func(*lambda.Options)) (*lambda.InvokeOutput, error)
}

// Launcher invokes Function asynchronously with each continuation.
type Launcher struct {
	Client Invoker
	// Function is the chat function's name or ARN (its own AWS_LAMBDA_FUNCTION_NAME).
	Function string
}

// Launch sends c as an asynchronous invocation; accepted (202) means Lambda has queued it.
func (l Launcher) Launch(ctx context.Context, c agent.Continuation) error {
	if l.Client == nil || l.Function == "" {
		return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable, "no function to continue runs in")
	}
	payload, err := json.Marshal(Event{Kind: EventKind, Continuation: c})
	if err != nil {
		return fmt.Errorf("lambdalaunch: %w", err)
	}
	out, err := l.Client.Invoke(ctx, &lambda.InvokeInput{FunctionName: aws.String(l.Function),
		InvocationType: types.InvocationTypeEvent, Payload: payload})
	if err != nil {
		return agent.Wrap(err, agent.KindUnavailable, agent.CodeLaunchUnavailable, "invoke the continuation")
	}
	if out.StatusCode != 202 {
		return agent.E(agent.KindUnavailable, agent.CodeLaunchUnavailable, "invoke the continuation: status %d", out.StatusCode)
	}
	return nil
}
