package sfntest_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
	"github.com/aws/aws-lambda-go/lambda/messages"
)

type valueError struct{}

func (valueError) Error() string { return "by value" }

// ErrorType names errors as aws-lambda-go's runtime does (lambda/errors.go): the dynamic type's name, one
// pointer removed, no package; an InvokeResponse_Error names itself.
func TestErrorType(t *testing.T) {
	t.Parallel()
	cases := []struct {
		err  error
		want string
	}{
		{&agent.TransientError{Err: errors.New("x")}, "TransientError"},
		{&agent.JobFailedError{Reason: "x"}, "JobFailedError"},
		{fmt.Errorf("wrapped: %w", &agent.TransientError{Err: errors.New("x")}), "wrapError"},
		{errors.New("x"), "errorString"},
		{valueError{}, "valueError"},
		{agent.E(agent.KindInternal, agent.CodeInternal, "x"), "Error"},
		{messages.InvokeResponse_Error{Type: "Custom.Named", Message: "x"}, "Custom.Named"},
	}
	for _, tc := range cases {
		if got := sfntest.ErrorType(tc.err); got != tc.want {
			t.Errorf("ErrorType(%T) = %q, want %q", tc.err, got, tc.want)
		}
	}
}

// Function answers as the Lambda Invoke API does for a Go function: the result's JSON, or the error document
// under X-Amz-Function-Error, for a returned error, a panic, and an event the handler cannot decode.
func TestFunction(t *testing.T) {
	t.Parallel()
	handler := func(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
		switch in.Wake {
		case "transient":
			return agent.DeliveryResult{}, &agent.TransientError{Err: errors.New("store busy")}
		case "panic":
			panic("boom")
		}
		return agent.DeliveryResult{ThreadID: in.ThreadID, Status: agent.DeliveredSteer, Turns: 1}, nil
	}
	cases := []struct {
		name, event string
		fnError     bool
		want        string
	}{
		{"result", `{"threadId":"t"}`, false, `{"threadId":"t","status":"delivered","turns":1}`},
		{"error", `{"threadId":"t","wake":"transient"}`, true, `{"errorMessage":"transient: store busy","errorType":"TransientError"}`},
		{"panic", `{"threadId":"t","wake":"panic"}`, true, `{"errorMessage":"boom","errorType":"string"}`},
		{"undecodable event", `{"threadId":1}`, true, `"errorType":"UnmarshalTypeError"}`},
	}
	h := sfntest.Function(handler)
	for _, tc := range cases {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("POST", "/", strings.NewReader(tc.event)))
		body, _ := io.ReadAll(rec.Body)
		if rec.Code != 200 || (rec.Header().Get(sfntest.FunctionErrorHeader) == "Unhandled") != tc.fnError ||
			!strings.HasSuffix(strings.TrimSpace(string(body)), tc.want) {
			t.Errorf("%s: %d %q %s, want 200, function error %v, body ending %s", tc.name, rec.Code,
				rec.Header().Get(sfntest.FunctionErrorHeader), body, tc.fnError, tc.want)
		}
	}
}
