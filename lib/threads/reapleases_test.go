package threads_test

import (
	"context"
	"errors"
	"fmt"
	"io"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/agentloop/agentloop/lib/reaper"
	"github.com/agentloop/agentloop/lib/segments"
	"github.com/agentloop/agentloop/lib/sqlite"
	"github.com/agentloop/agentloop/lib/threads"
)

// deadProcess is the store as a process that died sees it: its readers' renewals and releases never arrive.
type deadProcess struct{ agent.Store }

func (deadProcess) RenewLease(context.Context, agent.LeaseRequest) error {
	return errors.New("the process died")
}
func (deadProcess) ReleaseLease(context.Context, string, string) error {
	return errors.New("the process died")
}

// Issue 16 item 11: the reaper gives back the stream leases of a reaped run's readers at once, not after their
// TTL: a reader that died with its process held a lease in its user's scope and in the run's, which nobody else
// would give back. Only the reaped run's readers lose theirs: a live reader of another run of the same user keeps
// both of its leases. On both stores.
func TestReapGivesBackReaderLeases(t *testing.T) {
	t.Parallel()
	t.Run("sqlite", func(t *testing.T) {
		t.Parallel()
		st, err := sqlite.Open(context.Background(), filepath.Join(t.TempDir(), "db"))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { st.Close() })
		reapGivesBackReaderLeases(t, st)
	})
	t.Run("dynamo", func(t *testing.T) {
		t.Parallel()
		endpoint := dynamotest.Start(t)
		client := dynamotest.Client(endpoint)
		table := fmt.Sprintf("threads_%d", time.Now().UnixNano())
		if err := dynamotest.CreateTable(context.Background(), client, table); err != nil {
			t.Fatal(err)
		}
		reapGivesBackReaderLeases(t, dynamo.New(client, table))
	})
}

func reapGivesBackReaderLeases(t *testing.T, st agent.Store) {
	ctx := context.Background()
	// Near the wall clock: segments expire a day after it.
	clock := &manualClock{now: time.Now().UTC().Truncate(time.Millisecond)}
	cfg := threads.Config{StaleAfter: time.Hour, MaxStreamsPerUser: 2, MaxStreamsPerRun: 1, StreamLeaseTTL: time.Hour,
		Follow: segments.Follower{PollMin: 5 * time.Millisecond, PollMax: 20 * time.Millisecond}}
	dead := threads.New(threads.Deps{Store: deadProcess{st}, Clock: clock}, cfg)
	live := threads.New(threads.Deps{Store: st, Clock: clock}, cfg)
	runs := map[string]agent.Run{}
	for _, id := range []string{"dying", "other", "next"} {
		now := clock.Now()
		if _, _, err := st.CreateThread(ctx, agent.Thread{ID: id, Owner: "alice", CreatedAt: now, UpdatedAt: now}); err != nil {
			t.Fatal(err)
		}
		res, err := st.ClaimRun(ctx, agent.ClaimRequest{ThreadID: id, Owner: "alice", RunID: "run_" + id, AssistantMessageID: "msg_" + id, Now: now, Reserve: 2})
		if err != nil {
			t.Fatal(err)
		}
		runs[id] = res.Run
		if err := st.AppendSegment(ctx, agent.Segment{ThreadID: id, RunID: res.Run.ID, Data: []byte(step), CreatedAt: now, ExpiresAt: now.Add(agent.SegmentTTL)}); err != nil {
			t.Fatal(err)
		}
	}

	// attach starts a reader of thread id on svc and returns once it is tailing (or was refused); stop ends it.
	var wg sync.WaitGroup
	t.Cleanup(wg.Wait)
	attach := func(svc *threads.Service, id string) (stop func(), err error) {
		t.Helper()
		ctx, cancel := context.WithCancel(ctx)
		began, done := make(chan struct{}), make(chan error, 1)
		wg.Add(1)
		go func() {
			defer wg.Done()
			_, err := svc.Attach(ctx, "alice", id, func() { close(began) }, io.Discard, func() {})
			done <- err
		}()
		select {
		case <-began:
			return func() { cancel(); <-done }, nil
		case err := <-done:
			cancel()
			return nil, err
		}
	}

	// A reader of the dying run in the process that dies with it, and a live reader of another run elsewhere:
	// the user's two stream slots are taken.
	stopDead, err := attach(dead, "dying")
	if err != nil {
		t.Fatal(err)
	}
	stopDead() // its process dies: its leases stay
	stopOther, err := attach(live, "other")
	if err != nil {
		t.Fatal(err)
	}
	defer stopOther()
	if _, err := attach(live, "next"); !errors.Is(err, agent.ErrTooManyStreams) {
		t.Fatalf("a third reader before the reap: %v, want too_many_streams", err)
	}

	clock.add(2 * time.Minute)
	rp := reaper.New(reaper.Deps{Store: st, Clock: clock}, reaper.Config{StaleAfter: time.Minute})
	d := runs["dying"]
	if ok, err := rp.Reap(ctx, "dying", agent.Claim{RunID: d.ID, Epoch: d.Epoch, HeartbeatAt: d.CreatedAt}); err != nil || !ok {
		t.Fatalf("Reap: %v %v", ok, err)
	}

	// The dead reader's slot in the user's scope is free at once; the live reader's is not.
	stopNext, err := attach(live, "next")
	if err != nil {
		t.Fatalf("a reader after the reap: %v, want the dead reader's slot given back", err)
	}
	defer stopNext()
	if _, err := attach(live, "next"); !errors.Is(err, agent.ErrTooManyStreams) {
		t.Fatalf("a fourth reader: %v, want too_many_streams (the live reader of the other run keeps its slot)", err)
	}
	// The reaped run's own scope is empty; the live reader keeps its run's.
	got, err := st.AcquireLease(ctx, agent.LeaseRequest{Scope: agent.StreamRunScope(d.ID), Holder: "probe", Limit: 1, TTL: time.Minute, Now: clock.Now()})
	if err != nil || got != 0 {
		t.Fatalf("the reaped run's reader scope: retry after %v (%v), want its dead reader's lease given back", got, err)
	}
	got, err = st.AcquireLease(ctx, agent.LeaseRequest{Scope: agent.StreamRunScope(runs["other"].ID), Holder: "probe", Limit: 1, TTL: time.Minute, Now: clock.Now()})
	if err != nil || got == 0 {
		t.Fatalf("the live run's reader scope: retry after %v (%v), want its live reader's lease kept", got, err)
	}
}
