package sfn_test

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/jobstest"
	"github.com/agentloop/agentloop/lib/sfn"
	"github.com/agentloop/agentloop/lib/sfn/sfntest"
)

// One job's execution on sfnlocal, with tasks that return at once, so this is the local machinery's own cost
// (HTTP to Node, the interpreter, two HTTP callbacks into Go): "delivered" from Start until the delivery task
// ran; "sequential" and "parallel" (4 per core) until DescribeExecution, polled every 10 ms, sees it ended.
func BenchmarkExecution(b *testing.B) {
	local := sfntest.StartJobs(b, jobstest.Contract())
	const thread = "thr_bench"
	delivered := make(chan struct{}, 64)
	local.Route(b, thread,
		sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.JobTask, error) { return in, nil }),
		sfntest.Function(func(_ context.Context, in agent.JobTask) (agent.DeliveryResult, error) {
			select {
			case delivered <- struct{}{}:
			default:
			}
			return agent.DeliveryResult{ThreadID: in.ThreadID, JobID: in.JobID, Status: agent.DeliveredSteer}, nil
		}))
	jobs := sfn.New(local.Client, local.Server.StateMachineARN)
	var n atomic.Int64
	run := func() {
		id := agent.JobID(thread, "run_1", fmt.Sprint("call_", n.Add(1)))
		if err := jobs.Start(context.Background(), agent.Job{ID: id, ThreadID: thread}); err != nil {
			b.Fatal(err)
		}
		if err := local.Wait(context.Background(), id); err != nil {
			b.Fatal(err)
		}
	}
	b.Run("delivered", func(b *testing.B) {
		for b.Loop() {
			id := agent.JobID(thread, "run_1", fmt.Sprint("call_", n.Add(1)))
			if err := jobs.Start(context.Background(), agent.Job{ID: id, ThreadID: thread}); err != nil {
				b.Fatal(err)
			}
			<-delivered
		}
	})
	for len(delivered) > 0 {
		<-delivered
	}
	b.Run("sequential", func(b *testing.B) {
		for b.Loop() {
			run()
		}
	})
	b.Run("parallel", func(b *testing.B) {
		b.SetParallelism(4)
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				run()
			}
		})
	})
}
