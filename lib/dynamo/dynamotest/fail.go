package dynamotest

import (
	"context"
	"errors"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/smithy-go/middleware"
)

// FailBatchWrites is a client option under which every BatchWriteItem fails before it is sent: a process that
// dies half way through a multi-item operation (a thread delete) after its single-item writes went through.
func FailBatchWrites(o *dynamodb.Options) {
	o.APIOptions = append(o.APIOptions, func(stack *middleware.Stack) error {
		return stack.Initialize.Add(middleware.InitializeMiddlewareFunc("failBatchWrite",
			func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
				if _, ok := in.Parameters.(*dynamodb.BatchWriteItemInput); ok {
					return middleware.InitializeOutput{}, middleware.Metadata{}, errors.New("injected: the process dies here")
				}
				return next.HandleInitialize(ctx, in)
			}), middleware.Before)
	})
}
