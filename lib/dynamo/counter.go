package dynamo

import (
	"context"
	"maps"
	"sync"

	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// Counter counts the DynamoDB requests a client sends, per operation, split into reads and writes, and records
// the largest item any PutItem or BatchWriteItem put carried. Register it on a client:
//
//	var c dynamo.Counter
//	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
//		o.APIOptions = append(o.APIOptions, c.Register)
//	})
//
// Requests are counted in the Finalize step after the SDK's retry middleware, so every attempt that goes on the
// wire counts once (a throttled request retried twice counts three times), which is what DynamoDB bills.
// The zero value is ready to use; a Counter is safe for concurrent use.
type Counter struct {
	mu      sync.Mutex
	byOp    map[string]int64
	maxItem int
}

// Counts is a snapshot of a Counter.
type Counts struct {
	Reads  int64 // GetItem, BatchGetItem, Query, Scan, TransactGetItems
	Writes int64 // PutItem, UpdateItem, DeleteItem, BatchWriteItem, TransactWriteItems
	Other  int64 // control plane: CreateTable, DescribeTable, UpdateTimeToLive, ...
	// ByOperation counts requests per operation name.
	ByOperation map[string]int64
	// MaxPutItemBytes is the largest ItemSize seen in a PutItem or a BatchWriteItem put request.
	MaxPutItemBytes int
}

// Total is Reads+Writes+Other.
func (c Counts) Total() int64 { return c.Reads + c.Writes + c.Other }

// Sub returns c minus earlier, operation by operation; MaxPutItemBytes stays c's.
func (c Counts) Sub(earlier Counts) Counts {
	d := Counts{Reads: c.Reads - earlier.Reads, Writes: c.Writes - earlier.Writes, Other: c.Other - earlier.Other,
		ByOperation: map[string]int64{}, MaxPutItemBytes: c.MaxPutItemBytes}
	for op, n := range c.ByOperation {
		if n -= earlier.ByOperation[op]; n != 0 {
			d.ByOperation[op] = n
		}
	}
	return d
}

// OperationClass tells whether a DynamoDB operation reads ("read"), writes ("write") or neither ("other").
func OperationClass(op string) string {
	switch op {
	case "GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems", "ExecuteStatement":
		return "read"
	case "PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems", "BatchExecuteStatement",
		"ExecuteTransaction":
		return "write"
	default:
		return "other"
	}
}

// Register adds the counter to an operation's middleware stack; use it in dynamodb.Options.APIOptions.
func (c *Counter) Register(stack *middleware.Stack) error {
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("agentloop.dynamo.CounterItemSize",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			c.observe(in.Parameters)
			return next.HandleInitialize(ctx, in)
		}), middleware.After)
	if err != nil {
		return err
	}
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("agentloop.dynamo.CounterRequests",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.count(awsmiddleware.GetOperationName(ctx))
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

func (c *Counter) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byOp == nil {
		c.byOp = map[string]int64{}
	}
	c.byOp[op]++
}

func (c *Counter) observe(params any) {
	size := 0
	switch in := params.(type) {
	case *dynamodb.PutItemInput:
		size = ItemSize(in.Item)
	case *dynamodb.BatchWriteItemInput:
		for _, reqs := range in.RequestItems {
			for _, r := range reqs {
				if r.PutRequest != nil {
					size = max(size, ItemSize(r.PutRequest.Item))
				}
			}
		}
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxItem = max(c.maxItem, size)
}

// Counts returns a snapshot.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{ByOperation: maps.Clone(c.byOp), MaxPutItemBytes: c.maxItem}
	if out.ByOperation == nil {
		out.ByOperation = map[string]int64{}
	}
	for op, n := range c.byOp {
		switch OperationClass(op) {
		case "read":
			out.Reads += n
		case "write":
			out.Writes += n
		default:
			out.Other += n
		}
	}
	return out
}

// Reset zeroes the counter.
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byOp = nil
	c.maxItem = 0
}
