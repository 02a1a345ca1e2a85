package dynamo

import (
	"context"
	"errors"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go"
	"github.com/aws/smithy-go/middleware"

	"github.com/agentloop/agentloop/lib/agent"
)

// Per-run metering (agent.StoreMeter): the Store's client carries two middlewares that count, for a request whose
// context carries a meter (agent.WithStoreMeter), every attempt on the wire (after the SDK's retries, as
// DynamoDB bills them; a throttled attempt is also counted as throttled) and the capacity units the response
// reports (the request asks for ReturnConsumedCapacity=INDEXES when it did not ask, which costs nothing): read
// units, and write units of the table and its indexes. A failed conditional write is billed by DynamoDB but
// reports no capacity, so it adds a request and no units. dynalite reports read and table write units but no
// index units, so under it WriteUnits leave the index writes out (Counter.MeasureIndexWrites computes them for
// benchmarks). A context without a meter costs nothing but a context lookup.

// withMiddleware returns a client like c with the Store's middlewares added (registerMeter here,
// registerWriteGate in gate.go).
func withMiddleware(c *dynamodb.Client, register ...func(*middleware.Stack) error) *dynamodb.Client {
	return dynamodb.New(c.Options(), func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, register...) })
}

func registerMeter(stack *middleware.Stack) error {
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("agentloop.dynamo.MeterUnits",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			m := agent.StoreMeterFrom(ctx)
			if m == nil {
				return next.HandleInitialize(ctx, in)
			}
			askCapacity(in.Parameters)
			out, md, err := next.HandleInitialize(ctx, in)
			if err == nil {
				u := reported(out.Result, true)
				m.AddUnits(u.read, u.tableWrite+u.indexWrite)
			}
			return out, md, err
		}), middleware.After)
	if err != nil {
		return err
	}
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("agentloop.dynamo.MeterRequests",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			m := agent.StoreMeterFrom(ctx)
			out, md, err := next.HandleFinalize(ctx, in)
			if m != nil && awsmiddleware.GetOperationName(ctx) != "" {
				m.Add(0, 0)
				if isThrottle(err) {
					m.Throttle()
				}
			}
			return out, md, err
		}), middleware.After)
}

// isThrottle reports whether err is DynamoDB refusing a request for throughput.
func isThrottle(err error) bool {
	var api smithy.APIError
	if !errors.As(err, &api) {
		return false
	}
	switch api.ErrorCode() {
	case "ProvisionedThroughputExceededException", "ThrottlingException", "RequestLimitExceeded":
		return true
	}
	return false
}
