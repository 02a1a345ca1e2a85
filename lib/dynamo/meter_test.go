package dynamo_test

import (
	"context"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// The per-run meter against DynamoDB's own responses (dynalite reports no index units and never throttles):
// every request counts, the capacity the response reports is added (table and indexes), a throttled request is
// counted as such, and the requests ask for the capacity in the first place.
func TestMeterCountsReportedCapacityAndThrottling(t *testing.T) {
	t.Parallel()
	const throttled = `{"__type":"com.amazonaws.dynamodb.v20120810#ProvisionedThroughputExceededException",` +
		`"message":"The level of configured provisioned throughput for the table was exceeded."}`
	s, r := newReplay(t, map[string][]answer{
		"GetItem": {{400, throttled}, {200, `{"ConsumedCapacity":{"TableName":"agentloop","CapacityUnits":0.5}}`}},
		"UpdateItem": {{200, `{"ConsumedCapacity":{"TableName":"agentloop","CapacityUnits":3.2,"Table":{"CapacityUnits":1},` +
			`"GlobalSecondaryIndexes":{"running":{"CapacityUnits":2.2}}}}`}},
	})
	var m agent.StoreMeter
	ctx := agent.WithStoreMeter(context.Background(), &m)
	if _, err := s.GetThread(ctx, "th"); agent.KindOf(err) != agent.KindUnavailable {
		t.Fatalf("throttled GetThread: %v, want unavailable", err)
	}
	if _, err := s.GetThread(ctx, "th"); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("GetThread: %v, want not found", err)
	}
	if err := s.Heartbeat(ctx, "th", agent.Fence{RunID: "r1", Epoch: 3}, time.Now()); err != nil {
		t.Fatalf("Heartbeat: %v", err)
	}
	want := agent.StoreUsage{Requests: 3, ReadUnits: 0.5, WriteUnits: 3.2, Throttled: 1}
	if got := m.Snapshot(); got != want {
		t.Fatalf("meter = %+v, want %+v", got, want)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if len(r.ops) != 3 {
		t.Fatalf("requests %v, want GetItem, GetItem, UpdateItem", r.ops)
	}
	for i, b := range r.bodies {
		if b["ReturnConsumedCapacity"] != "INDEXES" {
			t.Fatalf("request %d (%s) did not ask for ReturnConsumedCapacity=INDEXES: %v", i, r.ops[i], b)
		}
	}
}

// Without a meter in the context nothing is asked for or counted.
func TestNoMeterAsksNothing(t *testing.T) {
	t.Parallel()
	s, r := newReplay(t, map[string][]answer{"GetItem": {{200, `{}`}}})
	if _, err := s.GetThread(context.Background(), "th"); !agent.IsKind(err, agent.KindNotFound) {
		t.Fatalf("GetThread: %v", err)
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	if _, asked := r.bodies[0]["ReturnConsumedCapacity"]; asked {
		t.Fatalf("an unmetered request asked for capacity: %v", r.bodies[0])
	}
}
