package dynamo_test

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// flakyHTTP answers every request 500 InternalServerError (a retryable DynamoDB failure) and calls onSend
// first; it counts what was sent.
type flakyHTTP struct {
	mu     sync.Mutex
	sent   []string
	onSend func()
}

func (f *flakyHTTP) Do(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.sent = append(f.sent, strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810."))
	f.mu.Unlock()
	if f.onSend != nil {
		f.onSend()
	}
	body := `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"injected"}`
	return &http.Response{StatusCode: 500, Status: "500 Internal Server Error", Request: r,
		Header:        http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:          io.NopCloser(strings.NewReader(body)),
		ContentLength: int64(len(body))}, nil
}

func (f *flakyHTTP) requests() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.sent...)
}

// The AWS SDK retries inside one store call; a fenced write's later attempt must not leave once the claim's
// horizon has passed (REVIEW D3). The engine hands the store a write gate through the context
// (agent.WithWriteGate), and the adapter asks it before every attempt: here the first attempt fails retryably,
// the gate closes meanwhile, and the second attempt is never sent. A context without a gate retries as before.
func TestWriteGateStopsTheSDKsRetries(t *testing.T) {
	t.Parallel()
	refused := errors.New("the claim's horizon has passed")
	for _, tc := range []struct {
		name     string
		gated    bool
		attempts int
	}{{"gated", true, 1}, {"no gate", false, 3}} {
		t.Run(tc.name, func(t *testing.T) {
			var mu sync.Mutex
			open := true
			gate := func() error {
				mu.Lock()
				defer mu.Unlock()
				if !open {
					return refused
				}
				return nil
			}
			transport := &flakyHTTP{onSend: func() { mu.Lock(); open = false; mu.Unlock() }}
			client := dynamotest.Client("http://dynamodb.invalid", func(o *dynamodb.Options) {
				o.HTTPClient = transport
				o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
					so.MaxAttempts = 3
					so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
				})
			})
			s := dynamo.New(client, "agentloop")
			ctx := context.Background()
			if tc.gated {
				ctx = agent.WithWriteGate(ctx, gate)
			}
			err := s.Heartbeat(ctx, "th", agent.Fence{RunID: "r1", Epoch: 1}, time.Now())
			if got := transport.requests(); len(got) != tc.attempts {
				t.Fatalf("attempts sent %v, want %d", got, tc.attempts)
			}
			if tc.gated && !errors.Is(err, refused) {
				t.Fatalf("Heartbeat: %v, want the gate's refusal", err)
			}
		})
	}
}
