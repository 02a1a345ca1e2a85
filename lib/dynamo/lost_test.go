package dynamo_test

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/retry"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// lossy is an HTTP client that sends every request to the server, but answers the first one that lose picks
// with a 500 InternalServerError instead of the server's answer: the write applied and its answer was lost,
// which DynamoDB's own documentation names as a case for retries. The SDK then retries the request as it would
// in AWS.
type lossy struct {
	mu   sync.Mutex
	lose func(op string, body string) bool
	lost int
}

func (l *lossy) Do(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return res, err
	}
	op := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	l.mu.Lock()
	drop := l.lost == 0 && l.lose(op, string(body))
	if drop {
		l.lost++
	}
	l.mu.Unlock()
	if !drop {
		return res, nil
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	return &http.Response{
		StatusCode: http.StatusInternalServerError,
		Header:     http.Header{"Content-Type": {"application/x-amz-json-1.0"}},
		Body:       io.NopCloser(strings.NewReader(`{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"Internal server error"}`)),
		Request:    req,
	}, nil
}

// lossyStore is a store on f's table whose client loses the first answer lose picks (retries without backoff).
func lossyStore(t *testing.T, f *fixture, lose func(op, body string) bool) (*dynamo.Store, *lossy) {
	l := &lossy{lose: lose}
	client := dynamotest.Client(endpoint, func(o *dynamodb.Options) {
		o.HTTPClient = l
		o.Retryer = retry.NewStandard(func(so *retry.StandardOptions) {
			so.Backoff = retry.BackoffDelayerFunc(func(int, error) (time.Duration, error) { return 0, nil })
		})
	})
	return dynamo.New(client, f.table), l
}

// Every write whose first attempt applies and whose answer is lost converges when the SDK retries it (DESIGN
// principle 3, REVIEW L20): the claim's UpdateItem (its retry fails the condition on our own fresh claim), the
// run item's PutItem (insert-if-absent), a takeover (the previous claim is still reported), a final message
// write (finalized by the lost attempt) and FinishRun's compare-and-set (already applied). Each result is what a
// clean call would have returned, and nothing is applied twice.
func TestLostAnswersConverge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()

	t.Run("claim", func(t *testing.T) {
		f := setup(t)
		th := thread(t, f.store, "th-lost-claim")
		s, l := lossyStore(t, f, func(op, body string) bool { return op == "UpdateItem" && strings.Contains(body, "claimPrevRunId") })
		res, err := s.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		if err != nil || l.lost != 1 {
			t.Fatalf("ClaimRun with its answer lost: %v (lost %d)", err, l.lost)
		}
		if r := res.Run; r.Epoch != 1 || r.FirstSeq != 0 || r.Reserved != 2 || res.Previous != nil {
			t.Fatalf("result = %+v, want epoch 1, positions 0-1, no previous claim", res)
		}
		got, err := f.store.GetThread(ctx, th.ID)
		if err != nil || got.Epoch != 1 || got.ActiveRun == nil || got.ActiveRun.RunID != "r1" {
			t.Fatalf("thread = %+v (%v), want claimed once by r1 at epoch 1", got, err)
		}
		if run, err := f.store.GetRun(ctx, th.ID, "r1"); err != nil || !reflect.DeepEqual(run, res.Run) {
			t.Fatalf("stored run = %+v (%v), want %+v", run, err, res.Run)
		}
		// The positions were reserved once: the next claim starts after them.
		done := res.Run
		done.Status = agent.RunCompleted
		if err := f.store.FinishRun(ctx, done); err != nil {
			t.Fatal(err)
		}
		next, err := f.store.ClaimRun(ctx, claimReq(th.ID, "r2", t0.Add(time.Minute)))
		if err != nil || next.Run.FirstSeq != 2 || next.Run.Epoch != 2 {
			t.Fatalf("next claim = %+v (%v), want epoch 2 from position 2", next.Run, err)
		}
	})

	t.Run("run item", func(t *testing.T) {
		f := setup(t)
		th := thread(t, f.store, "th-lost-run")
		s, l := lossyStore(t, f, func(op, body string) bool { return op == "PutItem" && strings.Contains(body, `"RUN#`) })
		res, err := s.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		if err != nil || l.lost != 1 || res.Run.Epoch != 1 {
			t.Fatalf("ClaimRun with the run write's answer lost: %+v, %v (lost %d)", res.Run, err, l.lost)
		}
		if got, _ := f.store.GetThread(ctx, th.ID); got.ActiveRun == nil || got.ActiveRun.RunID != "r1" {
			t.Fatalf("claim = %+v, want r1's (not given back)", got.ActiveRun)
		}
	})

	t.Run("takeover", func(t *testing.T) {
		f := setup(t)
		th := thread(t, f.store, "th-lost-takeover")
		old, err := f.store.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		if err != nil {
			t.Fatal(err)
		}
		s, l := lossyStore(t, f, func(op, body string) bool { return op == "UpdateItem" && strings.Contains(body, "claimPrevRunId") })
		res, err := s.ClaimRun(ctx, claimReq(th.ID, "r2", t0.Add(time.Hour)))
		if err != nil || l.lost != 1 {
			t.Fatalf("takeover with its answer lost: %v (lost %d)", err, l.lost)
		}
		want := agent.Claim{RunID: "r1", Epoch: old.Run.Epoch, HeartbeatAt: t0}
		if res.Previous == nil || *res.Previous != want || res.Run.Epoch != 2 {
			t.Fatalf("takeover = %+v, previous %+v; want epoch 2 taking over %+v", res.Run, res.Previous, want)
		}
	})

	t.Run("final message", func(t *testing.T) {
		f := setup(t)
		th := thread(t, f.store, "th-lost-msg")
		claim, err := f.store.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		if err != nil {
			t.Fatal(err)
		}
		s, l := lossyStore(t, f, func(op, body string) bool { return op == "UpdateItem" && strings.Contains(body, `"MSG#`) })
		m := agent.Message{ID: "a1", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"done"}`)}}
		if err := s.PutMessage(ctx, msgWrite(th.ID, 1, m, claim.Run.Fence(), true, t0)); err != nil || l.lost != 1 {
			t.Fatalf("final PutMessage with its answer lost: %v (lost %d)", err, l.lost)
		}
		// Finalized for real: the same run cannot change it now.
		m2 := agent.Message{ID: "a1", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"changed"}`)}}
		if err := f.store.PutMessage(ctx, msgWrite(th.ID, 1, m2, claim.Run.Fence(), false, t0)); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("PutMessage after the final one: %v, want run_fenced", err)
		}
	})

	t.Run("finish", func(t *testing.T) {
		f := setup(t)
		th := thread(t, f.store, "th-lost-finish")
		claim, err := f.store.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
		if err != nil {
			t.Fatal(err)
		}
		s, l := lossyStore(t, f, func(op, body string) bool { return op == "UpdateItem" && strings.Contains(body, `"RUN#`) })
		run := claim.Run
		run.Status, run.Usage, run.FinishedAt = agent.RunCompleted, agent.Usage{InputTokens: 7, TotalTokens: 7}, t0.Add(time.Second)
		if err := s.FinishRun(ctx, run); err != nil || l.lost != 1 {
			t.Fatalf("FinishRun with its first answer lost: %v (lost %d)", err, l.lost)
		}
		got, err := f.store.GetThread(ctx, th.ID)
		if err != nil || got.ActiveRun != nil || got.Usage != run.Usage {
			t.Fatalf("thread = %+v (%v), want released with the usage added once", got, err)
		}
	})
}

// An interrupt's create and resolve whose answers are lost converge too: the retry fails its condition on the
// call's own write (createId, resolveId) and answers as the clean call would have, created and resolved, so of
// concurrent resolves exactly one still succeeds.
func TestLostInterruptAnswersConverge(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	f := setup(t)
	th := thread(t, f.store, "th-lost-int")
	in := approval(th.ID, "i1", t0.Add(time.Hour))
	in.Input, _ = json.Marshal(map[string]string{"document": incompressible(200 << 10)}) // chunked: the chunks must survive
	s, l := lossyStore(t, f, func(op, body string) bool { return op == "PutItem" && strings.Contains(body, `"INT#`) })
	got, created, err := s.CreateInterrupt(ctx, in)
	if err != nil || !created || l.lost != 1 {
		t.Fatalf("CreateInterrupt with its answer lost: created %v, %v (lost %d)", created, err, l.lost)
	}
	if string(got.Input) != string(in.Input) {
		t.Fatal("CreateInterrupt with its answer lost: input differs")
	}
	if stored, err := f.store.GetInterrupt(ctx, th.ID, in.MessageID, in.ID); err != nil || string(stored.Input) != string(in.Input) {
		t.Fatalf("GetInterrupt after the lost create: %v (input kept: %v)", err, err == nil && string(stored.Input) == string(in.Input))
	}

	resp, _ := json.Marshal(map[string]string{"output": incompressible(200 << 10)})
	req := agent.ResolveRequest{ThreadID: th.ID, MessageID: in.MessageID, ID: in.ID, Status: agent.InterruptAnswered, Response: resp, Now: t0}
	s, l = lossyStore(t, f, func(op, body string) bool { return op == "UpdateItem" && strings.Contains(body, "resolveId") })
	got, err = s.ResolveInterrupt(ctx, req)
	if err != nil || l.lost != 1 || got.Status != agent.InterruptAnswered || string(got.Response) != string(resp) {
		t.Fatalf("ResolveInterrupt with its answer lost: %s, %v (lost %d); want our resolution, no error", got.Status, err, l.lost)
	}
	if _, err := f.store.ResolveInterrupt(ctx, req); !errors.Is(err, agent.ErrAlreadyResolved) {
		t.Fatalf("a second, separate resolve: %v, want already_resolved", err)
	}
	if stored, err := f.store.GetInterrupt(ctx, th.ID, in.MessageID, in.ID); err != nil || string(stored.Response) != string(resp) {
		t.Fatalf("GetInterrupt after the lost resolve: %v", err)
	}
}

// A thread written before the message counter existed (no nextSeq, messages numbered from 0 by the old engine)
// gets positions far above the old ones on its first claim, so new messages sort after the old transcript without
// the claim reading it.
func TestLegacyThreadPositions(t *testing.T) {
	t.Parallel()
	f := setup(t)
	ctx := context.Background()
	th := thread(t, f.store, "th-legacy")
	_, err := f.client.UpdateItem(ctx, &dynamodb.UpdateItemInput{
		TableName:        aws.String(f.table),
		Key:              map[string]types.AttributeValue{"pk": &types.AttributeValueMemberS{Value: "THREAD#" + th.ID}, "sk": &types.AttributeValueMemberS{Value: "THREAD"}},
		UpdateExpression: aws.String("REMOVE nextSeq"),
	})
	if err != nil {
		t.Fatal(err)
	}
	for i := range 3 {
		m := agent.Message{ID: fmt.Sprintf("old%d", i), Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"x"}`)}}
		if err := f.store.PutMessage(ctx, msgWrite(th.ID, int64(i), m, agent.Fence{}, false, t0)); err != nil {
			t.Fatal(err)
		}
	}
	res, err := f.store.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
	if err != nil {
		t.Fatal(err)
	}
	if res.Run.FirstSeq != 1<<40 {
		t.Fatalf("FirstSeq of a legacy thread's first claim = %d, want 2^40", res.Run.FirstSeq)
	}
	m := agent.Message{ID: "new", Role: agent.RoleUser, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"y"}`)}}
	if err := f.store.PutMessage(ctx, msgWrite(th.ID, res.Run.FirstSeq, m, res.Run.Fence(), true, t0)); err != nil {
		t.Fatal(err)
	}
	msgs, err := f.store.ListMessages(ctx, th.ID)
	if err != nil || len(msgs) != 4 || msgs[3].Message.ID != "new" {
		t.Fatalf("ListMessages = %d messages (%v), want the new one last", len(msgs), err)
	}
}
