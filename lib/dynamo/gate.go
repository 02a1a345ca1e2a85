package dynamo

import (
	"context"
	"fmt"
	"net/http"
	"time"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go/middleware"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sdkhttp"
)

// The write gate (REVIEW D3, fence E). The SDK retries inside one call (three attempts with jittered backoff by
// default), so a write the engine checked against its claim's horizon could still leave seconds later. The
// Store's client carries a Finalize middleware, right after the SDK's retry middleware so it runs before every
// attempt, that asks the write gate the context carries (agent.WithWriteGate): a refused attempt is not sent, and
// the call fails with the gate's error (not retryable). A context without a gate costs a context lookup.

func registerWriteGate(stack *middleware.Stack) error {
	return stack.Finalize.Insert(middleware.FinalizeMiddlewareFunc("agentloop.dynamo.WriteGate",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			if err := agent.MayWrite(ctx); err != nil {
				return middleware.FinalizeOutput{}, middleware.Metadata{}, fmt.Errorf("write gate: attempt not sent: %w", err)
			}
			return next.HandleFinalize(ctx, in)
		}), "Retry", middleware.After)
}

// HTTP timeouts of the DynamoDB client (REVIEW D3): without them an attempt on a dead connection waits for the
// kernel, and a fenced write could leave, or hang, long past its claim's horizon.
const (
	// DefaultRequestTimeout bounds one attempt end to end (connect, send, the whole response).
	DefaultRequestTimeout = 10 * time.Second
	// DefaultResponseHeaderTimeout bounds the wait for the response's headers once the request is sent.
	DefaultResponseHeaderTimeout = 5 * time.Second
)

// HTTPClient is the HTTP client for production DynamoDB clients: the SDK's buildable client with a request
// timeout (zero: DefaultRequestTimeout) and a response-header timeout (DefaultResponseHeaderTimeout, never above
// the request timeout), sending through sdkhttp.Wrap (its doc says why). Set it as dynamodb.Options.HTTPClient.
func HTTPClient(timeout time.Duration) sdkhttp.Doer {
	if timeout <= 0 {
		timeout = DefaultRequestTimeout
	}
	header := min(DefaultResponseHeaderTimeout, timeout)
	return sdkhttp.Wrap(awshttp.NewBuildableClient().WithTimeout(timeout).WithTransportOptions(func(tr *http.Transport) {
		tr.ResponseHeaderTimeout = header
	}))
}
