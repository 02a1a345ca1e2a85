package sfntest

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"

	"github.com/aws/aws-lambda-go/lambda"
	"github.com/aws/aws-lambda-go/lambda/messages"
)

// FunctionErrorHeader marks a reply that carries a function error, as the Lambda Invoke API does
// (X-Amz-Function-Error: Unhandled); the body is then the runtime's error document.
const FunctionErrorHeader = "X-Amz-Function-Error"

// Function serves a Go Lambda handler (any signature lambda.NewHandler takes, e.g.
// func(context.Context, agent.JobTask) (agent.DeliveryResult, error)) as a task callback of server.mjs: the
// request body is the event, and the reply is what the Lambda Invoke API would answer for the function running
// under the Go runtime (aws-lambda-go). The event and result go through lambda.NewHandler's own JSON decoding and
// encoding; an error, or a panic, is reported as the runtime reports it: 200 with FunctionErrorHeader and
// {"errorMessage": err.Error(), "errorType": ErrorType(err)}. The handler's context is the request's, which
// server.mjs cancels a grace period after the task's TimeoutSeconds.
func Function(handler any) http.Handler {
	h := lambda.NewHandler(handler)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		payload, err := io.ReadAll(r.Body)
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		out, fnErr := invoke(r.Context(), h, payload)
		w.Header().Set("Content-Type", "application/json")
		if fnErr != nil {
			w.Header().Set(FunctionErrorHeader, "Unhandled")
			out, _ = json.Marshal(fnErr)
		}
		_, _ = w.Write(out)
	})
}

// invoke runs h once, turning an error or a panic into the runtime's error document (aws-lambda-go
// lambda/invoke_loop.go callBytesHandlerFunc).
func invoke(ctx context.Context, h lambda.Handler, payload []byte) (out []byte, fnErr *messages.InvokeResponse_Error) {
	defer func() {
		if v := recover(); v != nil {
			fnErr = &messages.InvokeResponse_Error{Message: fmt.Sprintf("%v", v), Type: typeName(v)}
		}
	}()
	out, err := h.Invoke(ctx, payload)
	if err != nil {
		return nil, ErrorDocument(err)
	}
	return out, nil
}

// ErrorDocument is the error document the Go Lambda runtime reports for a handler's error: an
// InvokeResponse_Error as it is, any other error as its message and ErrorType (aws-lambda-go lambda/errors.go
// lambdaErrorResponse).
func ErrorDocument(err error) *messages.InvokeResponse_Error {
	if d, ok := err.(messages.InvokeResponse_Error); ok {
		return &d
	}
	return &messages.InvokeResponse_Error{Message: err.Error(), Type: ErrorType(err)}
}

// ErrorType is the errorType the Go Lambda runtime reports for err, which is what Step Functions matches in
// ErrorEquals: the name of err's dynamic type, without its package and with one pointer removed (*agent.
// TransientError is "TransientError"). Only the outermost type counts: fmt.Errorf("...: %w", transient) is a
// "wrapError", which no Retry names, so a task handler returns the named errors unwrapped.
func ErrorType(err error) string {
	if d, ok := err.(messages.InvokeResponse_Error); ok {
		return d.Type
	}
	return typeName(err)
}

func typeName(v any) string {
	t := reflect.TypeOf(v)
	if t.Kind() == reflect.Pointer {
		return t.Elem().Name()
	}
	return t.Name()
}
