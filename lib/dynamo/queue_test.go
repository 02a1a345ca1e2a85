package dynamo_test

import (
	"bytes"
	"context"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
)

// paused is an HTTP client that runs before() ahead of the first request pick chooses (a process that paused
// there) and after() once that request's answer came back.
type paused struct {
	once          sync.Once
	pick          func(op, body string) bool
	before, after func()
}

func (p *paused) Do(req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil {
		body, _ = io.ReadAll(req.Body)
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	op := strings.TrimPrefix(req.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
	hit := false
	if p.pick(op, string(body)) {
		p.once.Do(func() { hit = true })
	}
	if hit {
		p.before()
	}
	res, err := http.DefaultClient.Do(req)
	if hit && p.after != nil {
		p.after()
	}
	return res, err
}

// Issue 16 item 2, the queue: an enqueue checks the thread's incarnation in its seq write and puts its entry in a
// second request. A process that pauses between the two while the thread is deleted and created again on its id
// puts an entry of the deleted thread's incarnation into the new thread's partition. The insert's check of the
// thread after the put takes it back (not found); a process that dies before that check leaves it, and no reader
// of the new thread sees it: ListQueued leaves it out, and an enqueue of its id by the new thread is a new entry.
func TestEnqueueRacingARecreate(t *testing.T) {
	t.Parallel()
	for _, dies := range []bool{false, true} {
		name := "take-back"
		if dies {
			name = "dies before the check"
		}
		t.Run(name, func(t *testing.T) {
			t.Parallel()
			f := setup(t)
			ctx := context.Background()
			th, _, err := f.store.CreateThread(ctx, agent.Thread{ID: "th-q-race", Owner: "u-th-q-race", Title: "old", Epoch: 2,
				CreatedAt: t0, UpdatedAt: t0})
			if err != nil {
				t.Fatal(err)
			}
			var again agent.Thread
			cctx, die := context.WithCancel(ctx)
			defer die()
			p := &paused{
				pick: func(op, body string) bool { return op == "PutItem" && strings.Contains(body, `"S":"Q#`) },
				before: func() {
					if err := f.store.DeleteThread(ctx, th.ID); err != nil {
						t.Error(err)
					}
					var err error
					again, _, err = f.store.CreateThread(ctx, agent.Thread{ID: th.ID, Owner: "u-th-q-race", Title: "again", Epoch: 1,
						CreatedAt: t0, UpdatedAt: t0})
					if err != nil {
						t.Error(err)
					}
				},
			}
			if dies {
				p.after = die
			}
			s := dynamo.New(dynamotest.Client(endpoint, func(o *dynamodb.Options) { o.HTTPClient = p }), f.table)
			q := queued(th.ID, "q-old", t0)
			q.Epoch = th.Epoch
			_, _, err = s.Enqueue(cctx, q, 0)
			switch {
			case !dies && !agent.IsKind(err, agent.KindNotFound):
				t.Fatalf("Enqueue of the deleted thread's incarnation into the new thread: %v, want not found", err)
			case dies && err == nil:
				t.Fatal("Enqueue whose process died after its put: no error")
			}
			if again.Epoch <= th.Epoch {
				t.Fatalf("the new thread's epoch %d is not above the deleted one's %d", again.Epoch, th.Epoch)
			}
			if got, err := f.store.ListQueued(ctx, th.ID); err != nil || len(got) != 0 {
				t.Fatalf("queue of the new thread = %+v, %v; want none of the deleted one's", got, err)
			}
			mine := queued(th.ID, "q-old", t0)
			mine.Epoch = again.Epoch + 1 // a run of the new thread
			if _, err := f.store.ClaimRun(ctx, claimReq(th.ID, "run-new", t0)); err != nil {
				t.Fatal(err)
			}
			got, created, err := f.store.Enqueue(ctx, mine, 0)
			if err != nil || !created || got.Status != agent.QueueQueued {
				t.Fatalf("Enqueue of the id by the new thread = %+v, created %v, %v; want a new entry", got, created, err)
			}
			if list, err := f.store.ListQueued(ctx, th.ID); err != nil || len(list) != 1 || list[0].Seq != got.Seq {
				t.Fatalf("queue of the new thread = %+v, %v; want its own entry alone", list, err)
			}
		})
	}
}
