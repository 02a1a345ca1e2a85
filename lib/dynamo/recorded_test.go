package dynamo_test

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// The path dynalite cannot exercise: DynamoDB sends the item a conditional write was checked against with the
// ConditionalCheckFailedException (ReturnValuesOnConditionCheckFailure=ALL_OLD), and the adapter must classify the
// failure from it without the GetItem it falls back to elsewhere. A replaying server answers the real SDK client
// with DynamoDB's JSON protocol bodies: the error body is the one DynamoDB (and dynalite) send,
// {"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request
// failed"}, plus the "Item" member DynamoDB adds (the ConditionalCheckFailedException shape of the API
// reference). Each case pins the operations sent: no GetItem.

const ccf = `{"__type":"com.amazonaws.dynamodb.v20120810#ConditionalCheckFailedException","message":"The conditional request failed"`

func failedWith(item string) answer { return answer{400, ccf + `,"Item":` + item + `}`} }

type answer struct {
	status int
	body   string
}

// replay answers each operation (X-Amz-Target) from its queue and records what was asked.
type replay struct {
	t       *testing.T
	mu      sync.Mutex
	answers map[string][]answer
	ops     []string
	bodies  []map[string]any
}

func newReplay(t *testing.T, answers map[string][]answer, opts ...dynamo.Option) (*dynamo.Store, *replay) {
	r := &replay{t: t, answers: answers}
	srv := httptest.NewServer(r)
	t.Cleanup(srv.Close)
	client := dynamotest.Client(srv.URL, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	return dynamo.New(client, "agentloop", opts...), r
}

func (r *replay) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	op := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	raw, _ := io.ReadAll(req.Body)
	var body map[string]any
	_ = json.Unmarshal(raw, &body)
	r.mu.Lock()
	r.ops = append(r.ops, op)
	r.bodies = append(r.bodies, body)
	q := r.answers[op]
	var a answer
	if len(q) > 0 {
		a, r.answers[op] = q[0], q[1:]
	}
	r.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.0")
	if a.status == 0 {
		r.t.Errorf("unexpected %s request: %s", op, raw)
		a = answer{500, `{"__type":"com.amazonaws.dynamodb.v20120810#InternalServerError","message":"not recorded"}`}
	}
	w.WriteHeader(a.status)
	_, _ = io.WriteString(w, a.body)
}

func (r *replay) want(t *testing.T, ops ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := strings.Join(r.ops, ","); got != strings.Join(ops, ",") {
		t.Fatalf("requests = %s, want %s", got, strings.Join(ops, ","))
	}
	// The write whose failure is classified (each case's first) asked for the item on failure: that is what
	// makes the GetItem unnecessary.
	if b := r.bodies[0]; b["ReturnValuesOnConditionCheckFailure"] != "ALL_OLD" {
		t.Errorf("%s did not ask for ReturnValuesOnConditionCheckFailure=ALL_OLD: %v", r.ops[0], b)
	}
}

const hb = "2031-05-06T07:08:09.123000000Z"

// thread items as DynamoDB stores them (the attribute names of infra/DYNAMODB.md).
func threadJSON(extra string) string {
	return `{"pk":{"S":"THREAD#th"},"sk":{"S":"THREAD"},"kind":{"S":"thread"},"id":{"S":"th"},"owner":{"S":"u-th"},` +
		`"recency":{"S":"` + hb + `#th"},"title":{"S":"hello"},"settings":{"M":{"reviewTools":{"BOOL":false}}},` +
		`"usageInput":{"N":"0"},"usageOutput":{"N":"0"},"usageTotal":{"N":"0"},"usageCached":{"N":"0"},` +
		`"createdAt":{"S":"` + hb + `"},"updatedAt":{"S":"` + hb + `"},"epoch":{"N":"3"},"nextSeq":{"N":"6"}` + extra + `}`
}

func claimJSON(run string) string {
	return `,"claimRunId":{"S":"` + run + `"},"claimHeartbeatAt":{"S":"` + hb + `"},"claimBucket":{"S":"2031-05-06T07:08:00.000000000Z"},` +
		`"runShard":{"S":"RUN#3"}`
}

func TestFailuresClassifiedFromTheReturnedItem(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	now := t0.Add(time.Hour)
	req := claimReq("th", "r-mine", now)
	fenceMine := agent.Fence{RunID: "r-mine", Epoch: 3}

	t.Run("claim: another fresh claim is run_active", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(threadJSON(claimJSON("r-other")))}})
		_, err := s.ClaimRun(ctx, req)
		if !errors.Is(err, agent.ErrRunActive) {
			t.Fatalf("ClaimRun: %v, want run_active", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("claim: another owner's thread is not found", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(strings.Replace(threadJSON(""), "u-th", "mallory", 1))}})
		_, err := s.ClaimRun(ctx, req)
		if !agent.IsKind(err, agent.KindNotFound) {
			t.Fatalf("ClaimRun: %v, want not found", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("claim: a tombstone is thread_deleting", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(threadJSON(`,"deleting":{"BOOL":true}`))}})
		_, err := s.ClaimRun(ctx, req)
		if !errors.Is(err, agent.ErrThreadDeleting) {
			t.Fatalf("ClaimRun: %v, want thread_deleting", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("claim: our own claim, applied by a lost attempt, is recognised", func(t *testing.T) {
		prev := `,"claimPrevRunId":{"S":"r-old"},"claimPrevHeartbeatAt":{"S":"` + hb + `"},"claimPrevCancel":{"BOOL":true}`
		s, r := newReplay(t, map[string][]answer{
			"UpdateItem": {failedWith(threadJSON(claimJSON("r-mine") + prev)), {200, `{}`}},
			"PutItem":    {{200, `{}`}},
		})
		res, err := s.ClaimRun(ctx, req)
		if err != nil {
			t.Fatalf("ClaimRun: %v", err)
		}
		want := agent.Run{ID: "r-mine", ThreadID: "th", Trigger: req.Trigger, Status: agent.RunRunning,
			AssistantMessageID: req.AssistantMessageID, Epoch: 3, FirstSeq: 4, Reserved: 2, CreatedAt: now, UpdatedAt: now}
		if !reflect.DeepEqual(res.Run, want) {
			t.Fatalf("run = %+v\nwant %+v", res.Run, want)
		}
		if p := res.Previous; p == nil || *p != (agent.Claim{RunID: "r-old", Epoch: 2, HeartbeatAt: t0, CancelRequested: true}) {
			t.Fatalf("previous = %+v, want r-old at epoch 2", p)
		}
		if c := res.Thread.ActiveRun; c == nil || c.RunID != "r-mine" || res.Thread.Owner != "u-th" {
			t.Fatalf("thread = %+v", res.Thread)
		}
		// The second UpdateItem notes r-old, taken over without a release, for the orphan sweep (REVIEW D15).
		r.want(t, "UpdateItem", "UpdateItem", "PutItem")
	})
	t.Run("claim: the run item of a lost run write is recognised", func(t *testing.T) {
		runItem := `{"pk":{"S":"THREAD#th"},"sk":{"S":"RUN#r-mine"},"id":{"S":"r-mine"},"threadId":{"S":"th"},"status":{"S":"running"},` +
			`"epoch":{"N":"3"},"firstSeq":{"N":"4"},"reserved":{"N":"2"},"createdAt":{"S":"` + hb + `"},"updatedAt":{"S":"` + hb + `"}}`
		s, r := newReplay(t, map[string][]answer{
			"UpdateItem": {{200, `{"Attributes":` + threadJSON(claimJSON("r-mine")+`,"claimPrevRunId":{"S":""}`) + `}`}},
			"PutItem":    {failedWith(runItem)},
		})
		res, err := s.ClaimRun(ctx, req)
		if err != nil {
			t.Fatalf("ClaimRun: %v", err)
		}
		if res.Run.CreatedAt != t0 || res.Run.FirstSeq != 4 || res.Previous != nil {
			t.Fatalf("result = %+v, want the stored run (created at %v)", res, t0)
		}
		r.want(t, "UpdateItem", "PutItem")
	})
	t.Run("claim: a run id that ran at another epoch is fenced and the claim given back", func(t *testing.T) {
		runItem := `{"pk":{"S":"THREAD#th"},"sk":{"S":"RUN#r-mine"},"id":{"S":"r-mine"},"status":{"S":"completed"},"epoch":{"N":"1"}}`
		s, r := newReplay(t, map[string][]answer{
			"UpdateItem": {{200, `{"Attributes":` + threadJSON(claimJSON("r-mine")) + `}`}, {200, `{}`}},
			"PutItem":    {failedWith(runItem)},
		})
		if _, err := s.ClaimRun(ctx, req); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("ClaimRun: %v, want run_fenced", err)
		}
		r.want(t, "UpdateItem", "PutItem", "UpdateItem")
	})
	t.Run("cancel: an idle thread has no active run", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(threadJSON(""))}})
		if _, err := s.RequestCancel(ctx, "th", "", now); !errors.Is(err, agent.ErrNoActiveRun) {
			t.Fatalf("RequestCancel: %v, want no_active_run", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("delete: a held claim is run_active", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(threadJSON(claimJSON("r-other")))}})
		if err := s.DeleteThread(ctx, "th"); !errors.Is(err, agent.ErrRunActive) {
			t.Fatalf("DeleteThread: %v, want run_active", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("create: the existing thread comes back", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"PutItem": {failedWith(threadJSON(""))}})
		got, created, err := s.CreateThread(ctx, agent.Thread{ID: "th", Owner: "u-th", Title: "other"})
		if err != nil || created || got.Title != "hello" || got.Epoch != 3 {
			t.Fatalf("CreateThread = %+v, %v, %v; want the stored thread", got, created, err)
		}
		r.want(t, "PutItem")
	})
	t.Run("create: a tombstone is thread_deleting", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"PutItem": {failedWith(threadJSON(`,"deleting":{"BOOL":true}`))}})
		if _, _, err := s.CreateThread(ctx, agent.Thread{ID: "th"}); !errors.Is(err, agent.ErrThreadDeleting) {
			t.Fatalf("CreateThread: %v, want thread_deleting", err)
		}
		r.want(t, "PutItem")
	})
	msg := agent.Message{ID: "m1", Role: agent.RoleAssistant, Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"done"}`)}}
	head := func(epoch, extra string) string {
		return `{"pk":{"S":"THREAD#th"},"sk":{"S":"MSG#m1"},"id":{"S":"m1"},"threadId":{"S":"th"},"role":{"S":"assistant"},` +
			`"seq":{"N":"5"},"createdAt":{"S":"` + hb + `"},"updatedAt":{"S":"` + hb + `"},"writerRunId":{"S":"r-mine"},` +
			`"writerEpoch":{"N":"` + epoch + `"},"body":{"S":"{\"parts\":[{\"type\":\"text\",\"text\":\"done\"}]}"}` + extra + `}`
	}
	t.Run("message: our own final write, answered late, succeeds", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(head("3", `,"final":{"BOOL":true}`))}})
		if err := s.PutMessage(ctx, msgWrite("th", 5, msg, fenceMine, true, now)); err != nil {
			t.Fatalf("PutMessage: %v, want our own write recognised", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("message: a final message with other content is run_fenced", func(t *testing.T) {
		other := strings.Replace(head("3", `,"final":{"BOOL":true}`), "done", "else", 1)
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(other)}})
		if err := s.PutMessage(ctx, msgWrite("th", 5, msg, fenceMine, true, now)); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("PutMessage: %v, want run_fenced", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("message: a newer writer's message is run_fenced", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(head("4", ""))}})
		if err := s.DeleteMessage(ctx, "th", "m1", fenceMine); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("DeleteMessage: %v, want run_fenced", err)
		}
		r.want(t, "UpdateItem")
	})
	t.Run("finish: our own recorded outcome completes the release", func(t *testing.T) {
		runItem := `{"pk":{"S":"THREAD#th"},"sk":{"S":"RUN#r-mine"},"id":{"S":"r-mine"},"status":{"S":"completed"},"epoch":{"N":"3"}}`
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(runItem), {200, `{}`}}})
		run := agent.Run{ID: "r-mine", ThreadID: "th", Status: agent.RunCompleted, Epoch: 3, FinishedAt: now}
		if err := s.FinishRun(ctx, run); err != nil {
			t.Fatalf("FinishRun: %v", err)
		}
		r.want(t, "UpdateItem", "UpdateItem")
	})

	// The contrast: a failure without the item (an item that does not exist, or dynalite) costs one GetItem.
	t.Run("claim: no item in the failure is one GetItem", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {{400, ccf + `}`}}, "GetItem": {{200, `{}`}}})
		if _, err := s.ClaimRun(ctx, req); !agent.IsKind(err, agent.KindNotFound) {
			t.Fatalf("ClaimRun: %v, want not found", err)
		}
		r.want(t, "UpdateItem", "GetItem")
	})
}

// A heartbeat is recorded whatever the cancel flag says (a cancel request is not a fence: REVIEW D2); the item it
// wrote (ALL_NEW) carries the flag, and a failed condition is a lost claim with no read to classify it.
func TestHeartbeatReadsTheCancelFromTheWrittenItem(t *testing.T) {
	ctx := context.Background()
	now := t0.Add(time.Hour)
	fenceMine := agent.Fence{RunID: "r-mine", Epoch: 3}
	t.Run("heartbeat: a cancel on our claim is run_canceled, the heartbeat recorded", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {{200, `{"Attributes":` + threadJSON(claimJSON("r-mine")+`,"claimCancel":{"BOOL":true}`) + `}`}}})
		if err := s.Heartbeat(ctx, "th", fenceMine, now); !errors.Is(err, agent.ErrRunCanceled) {
			t.Fatalf("Heartbeat: %v, want run_canceled", err)
		}
		r.wantOnly(t, "UpdateItem")
	})
	t.Run("heartbeat: a failed condition is run_fenced", func(t *testing.T) {
		s, r := newReplay(t, map[string][]answer{"UpdateItem": {failedWith(threadJSON(claimJSON("r-other") + `,"claimCancel":{"BOOL":true}`))}})
		if err := s.Heartbeat(ctx, "th", fenceMine, now); !errors.Is(err, agent.ErrRunFenced) {
			t.Fatalf("Heartbeat: %v, want run_fenced", err)
		}
		r.wantOnly(t, "UpdateItem")
	})
}

// wantOnly checks the requests sent, and nothing about failure classification.
func (r *replay) wantOnly(t *testing.T, ops ...string) {
	t.Helper()
	r.mu.Lock()
	defer r.mu.Unlock()
	if got := strings.Join(r.ops, ","); got != strings.Join(ops, ",") {
		t.Fatalf("requests = %s, want %s", got, strings.Join(ops, ","))
	}
}

// REVIEW D12: the messagesBySeq local index caps a thread's partition (messages, chunks, runs, interrupts, jobs,
// queue) at 10 GB; past it DynamoDB refuses every write into the partition with
// ItemCollectionSizeLimitExceededException. That is a thread that is full, not a store failing: a stable
// client code of its own (thread_too_large, 413), never internal (500, an alarm) nor unavailable (a retry that
// cannot pass). dynalite cannot reach 10 GB, so the answer is replayed: DynamoDB's JSON protocol error body for
// that exception.
func TestFullThreadIsThreadTooLarge(t *testing.T) {
	t.Parallel()
	full := answer{400, `{"__type":"com.amazonaws.dynamodb.v20120810#ItemCollectionSizeLimitExceededException",` +
		`"message":"Item collection size limit exceeded: 10 GB"}`}
	s, r := newReplay(t, map[string][]answer{"UpdateItem": {full}})
	m := agent.Message{ID: "m1", Role: agent.RoleUser, Parts: []json.RawMessage{agent.EncodePart(agent.Part{Type: "text", Text: "hi"})}}
	err := s.PutMessage(context.Background(), agent.MessageWrite{ThreadID: "th", Seq: 7, Message: m,
		Fence: agent.Fence{RunID: "r1", Epoch: 3}, Final: true, Now: t0})
	if !errors.Is(err, agent.ErrThreadTooLarge) || agent.KindOf(err) != agent.KindTooLarge {
		t.Fatalf("PutMessage into a full thread: %v (kind %s), want thread_too_large (too_large)", err, agent.KindOf(err))
	}
	if code, msg := agent.Public(err); strings.Contains(msg, "dynamo") || strings.Contains(msg, "Exception") || code != agent.CodeThreadTooLarge {
		t.Fatalf("a client reads %s %q: want thread_too_large and no store text", code, msg)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if strings.Join(r.ops, ",") != "UpdateItem" {
		t.Fatalf("requests = %v, want one UpdateItem (no retry: it cannot pass)", r.ops)
	}
}
