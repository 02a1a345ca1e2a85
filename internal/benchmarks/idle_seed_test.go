package benchmarks

import (
	"context"
	"encoding/json"
	"hash/fnv"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// The reaper benchmark's idle threads: written through the store's own methods (all of them on SQLite; the
// templates on dynalite), or put as BatchWriteItem copies of those templates (dynalite).

// shapeOf is the shape of idle thread i (see reaper_bench_test.go).
func shapeOf(i int) string {
	switch {
	case i%100 == 1:
		return shapeRunning
	case i%100 == 2:
		return shapePending
	case i%10 == 0:
		return shapeDelivered
	}
	return shapePlain
}

// seedIdle stores one idle thread of the given shape through the store's own methods.
func seedIdle(ctx context.Context, s agent.Store, id, shape string, now time.Time) error {
	if _, _, err := s.CreateThread(ctx, agent.Thread{ID: id, Owner: "o", Title: "an idle thread",
		CreatedAt: now, UpdatedAt: now}); err != nil {
		return err
	}
	job := agent.Job{ID: agent.JobID(id, "run_1", "call_1"), ThreadID: id, Owner: "o", Kind: "research", ToolCallID: "call_1",
		Input: json.RawMessage(`{"question":"q"}`), Status: agent.JobRunning, CreatedAt: now, UpdatedAt: now, DueAt: now.Add(31 * time.Minute)}
	switch shape {
	case shapeRunning:
		_, _, err := s.CreateJob(ctx, job)
		return err
	case shapePending:
		_, _, err := s.CreateInterrupt(ctx, agent.Interrupt{ID: "apr_" + id, ThreadID: id, RunID: "run_asked", Epoch: 1, MessageID: "msg_asked",
			Kind: agent.InterruptApproval, ToolCallID: "call_2", ToolName: "delete_note", Input: json.RawMessage(`{"id":"n1"}`),
			Status: agent.InterruptPending, CreatedAt: now, ExpiresAt: now.Add(agent.DefaultInterruptTTL)})
		return err
	case shapeDelivered:
		if _, _, err := s.CreateJob(ctx, job); err != nil {
			return err
		}
		if _, _, err := s.FinishJob(ctx, agent.JobResult{ThreadID: id, ID: job.ID, Result: json.RawMessage(`{"brief":"b","sources":[]}`),
			DueAt: now.Add(time.Minute), Now: now}); err != nil {
			return err
		}
		part, _ := json.Marshal(map[string]string{"type": "text", "text": "Research complete. " + strings.Repeat("brief ", 300)})
		steer := agent.Message{ID: agent.SteerMessageID(job.ID), Role: agent.RoleUser, Parts: []json.RawMessage{part}}
		if _, _, err := s.Enqueue(ctx, agent.QueuedMessage{ThreadID: id, Kind: agent.QueueSteer, Message: steer, JobID: job.ID,
			Status: agent.QueueQueued, CreatedAt: now}, 0); err != nil {
			return err
		}
		if err := s.TakeQueued(ctx, id, steer.ID, now); err != nil {
			return err
		}
		_, err := s.MarkJobDelivered(ctx, id, job.ID, now)
		return err
	}
	return nil
}

// cloneItem copies a template item for thread id: every string naming the template thread is rewritten, and the
// sparse indexes' shard keys are derived from the new id as the store derives them (fnv32a mod 16).
func cloneItem(it map[string]types.AttributeValue, from, to string) map[string]types.AttributeValue {
	out := make(map[string]types.AttributeValue, len(it))
	for k, v := range it {
		if s, ok := v.(*types.AttributeValueMemberS); ok && strings.Contains(s.Value, from) {
			v = &types.AttributeValueMemberS{Value: strings.ReplaceAll(s.Value, from, to)}
		}
		out[k] = v
	}
	for _, a := range []string{dynamo.AttrDueShard, dynamo.AttrPendingShard, dynamo.AttrRunShard} {
		if s, ok := out[a].(*types.AttributeValueMemberS); ok {
			prefix := strings.TrimRight(s.Value, "0123456789")
			h := fnv.New32a()
			_, _ = h.Write([]byte(to))
			out[a] = &types.AttributeValueMemberS{Value: prefix + strconv.Itoa(int(h.Sum32()%16))}
		}
	}
	return out
}

// batchPut writes items 25 a request, 4 requests at a time, resending what the server left unprocessed.
func batchPut(ctx context.Context, client *dynamodb.Client, table string, items []map[string]types.AttributeValue) error {
	var wg sync.WaitGroup
	errs := make(chan error, 1)
	sem := make(chan struct{}, 4)
	for start := 0; start < len(items); start += 25 {
		reqs := make([]types.WriteRequest, 0, 25)
		for _, it := range items[start:min(start+25, len(items))] {
			reqs = append(reqs, types.WriteRequest{PutRequest: &types.PutRequest{Item: it}})
		}
		sem <- struct{}{}
		wg.Go(func() {
			defer func() { <-sem }()
			pending := map[string][]types.WriteRequest{table: reqs}
			for len(pending[table]) > 0 {
				out, err := client.BatchWriteItem(ctx, &dynamodb.BatchWriteItemInput{RequestItems: pending})
				if err != nil {
					select {
					case errs <- err:
					default:
					}
					return
				}
				pending = out.UnprocessedItems
			}
		})
	}
	wg.Wait()
	select {
	case err := <-errs:
		return err
	default:
		return nil
	}
}
