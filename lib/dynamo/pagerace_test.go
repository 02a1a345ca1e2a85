package dynamo_test

import (
	"context"
	"encoding/json"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// A page read (ListMessagesPage: a strongly consistent Query of the KEYS_ONLY local index messagesBySeq that
// fetches each head from the table) that overlaps new messages' first writes must neither fail nor take the
// server down. dynalite 4.0.0 writes an item's index entries before the item: a Query that met such an entry
// fetched no item and crashed the whole process with a TypeError (TestDeliveryRaces/dynalite failed on it as
// "connection refused"). infra/dynalite/patches fixes that in dynalite (the entry is skipped: the item is not
// written yet). The test runs on its own dynalite, so a crash fails this test alone, with the crash's output.
//
// Not timing-dependent in what it asserts: whatever the interleaving, every put and every read must succeed and
// the process must survive; how often the two meet only decides how likely the unpatched server is caught (every
// run here, and in well under a second).
func TestPageReadDuringFirstWrites(t *testing.T) {
	t.Parallel()
	if dynamotest.SkipRequested() && endpoint == "" {
		t.Skipf("dynalite unavailable (%s=1)", dynamotest.SkipEnv)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	srv, err := dynamotest.Launch(ctx)
	if err != nil {
		t.Fatalf("dynalite: %v", err)
	}
	t.Cleanup(func() {
		if err := srv.Close(); err != nil { // a crash after the last request
			t.Error(err)
		}
	})
	// One attempt per request: a dead server fails the next request at once instead of after the SDK's retries.
	client := dynamotest.Client(srv.Endpoint, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 })
	table := fmt.Sprintf("agentloop-pagerace-%d", time.Now().UnixNano())
	if err := dynamotest.CreateTable(ctx, client, table); err != nil {
		t.Fatal(err)
	}
	s := dynamo.New(client, table)
	th := thread(t, s, "th-pagerace")
	claim, err := s.ClaimRun(ctx, claimReq(th.ID, "r1", t0))
	if err != nil {
		t.Fatal(err)
	}

	const puts = 200
	var (
		wg      sync.WaitGroup
		putErr  error
		readErr error
		reads   int
	)
	done := make(chan struct{})
	wg.Add(2)
	go func() { // the writer: new messages, one after the other, the store's real PutMessage
		defer wg.Done()
		defer close(done)
		for i := range puts {
			m := agent.Message{ID: fmt.Sprintf("m%04d", i), Role: agent.RoleUser,
				Parts: []json.RawMessage{json.RawMessage(`{"type":"text","text":"hi"}`)}}
			if err := s.PutMessage(ctx, msgWrite(th.ID, int64(i), m, claim.Run.Fence(), true, t0)); err != nil {
				putErr = fmt.Errorf("PutMessage %d: %w", i, err)
				return
			}
		}
	}()
	go func() { // the reader: the newest page, over and over, until the writer is done
		defer wg.Done()
		for {
			select {
			case <-done:
				return
			default:
			}
			if _, err := s.ListMessagesPage(ctx, th.ID, agent.MessagePage{Limit: 3}); err != nil {
				readErr = fmt.Errorf("ListMessagesPage after %d reads: %w", reads, err)
				return
			}
			reads++
		}
	}()
	wg.Wait()
	if putErr != nil || readErr != nil {
		// Close tells whether the server died (and why, from its output) or only failed the requests.
		t.Fatalf("put: %v; read: %v; server: %v", putErr, readErr, srv.Close())
	}
	page, err := s.ListMessagesPage(ctx, th.ID, agent.MessagePage{Limit: 1})
	if err != nil || len(page.Items) != 1 || page.Items[0].Message.ID != fmt.Sprintf("m%04d", puts-1) {
		t.Fatalf("newest page after the writes = %+v, %v; want m%04d", page, err, puts-1)
	}
	t.Logf("%d puts, %d page reads", puts, reads)
}
