package benchmarks

import (
	"context"
	"sync"
	"time"

	"github.com/agentloop/agentloop/lib/agent"
)

// ledger is a store wrapper that counts every call by the benchmark's current phase and the method's name, and
// lets a benchmark watch calls (after they succeed) and hold GetJob (so a sub-agent waits until the turn that
// dispatched it has ended). It implements every method itself, so a method added to agent.Store is a compile
// error here rather than a call the ledger misses.
//
// With route set, each call goes to the store route returns for its (phase, method): on DynamoDB that is a store
// whose client has its own dynamo.Counter (meter), so requests and capacity are known per phase and method
// whatever runs concurrently.
type ledger struct {
	inner agent.Store
	route func(phase, method string) agent.Store
	// watch, when set, sees every call that succeeded with its main argument (set before the stack serves).
	watch func(method string, arg any)
	// tally, when set, is a running count (SQLite's statements) that setPhase attributes to the phase that ends:
	// exact while phases do not overlap.
	tally func() int64

	mu    sync.Mutex
	phase string
	calls map[[2]string]int64 // {phase, method} → calls
	gate  chan struct{}       // non-nil: GetJob waits until it is closed
	// tallied is tally's count per phase; last its value when the current phase began.
	tallied map[string]int64
	last    int64
}

var _ agent.Store = (*ledger)(nil)

func newLedger(inner agent.Store) *ledger {
	return &ledger{inner: inner, calls: map[[2]string]int64{}, tallied: map[string]int64{}}
}

// setPhase attributes the calls that start from now on to phase.
func (l *ledger) setPhase(phase string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.tally != nil {
		n := l.tally()
		l.tallied[l.phase] += n - l.last
		l.last = n
	}
	l.phase = phase
}

// hold makes GetJob wait until release.
func (l *ledger) hold() {
	l.mu.Lock()
	l.gate = make(chan struct{})
	l.mu.Unlock()
}

func (l *ledger) release() {
	l.mu.Lock()
	if l.gate != nil {
		close(l.gate)
		l.gate = nil
	}
	l.mu.Unlock()
}

// use counts one call and returns the store that serves it.
func (l *ledger) use(method string) agent.Store {
	l.mu.Lock()
	gate := l.gate
	l.mu.Unlock()
	if gate != nil && method == "GetJob" {
		<-gate
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.calls[[2]string{l.phase, method}]++
	if l.route != nil {
		return l.route(l.phase, method)
	}
	return l.inner
}

func (l *ledger) saw(method string, arg any, err error) {
	if err == nil && l.watch != nil {
		l.watch(method, arg)
	}
}

// byMethod returns the calls of phase by method.
func (l *ledger) byMethod(phase string) map[string]int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := map[string]int64{}
	for k, n := range l.calls {
		if k[0] == phase {
			out[k[1]] += n
		}
	}
	return out
}

func (l *ledger) total(phase string) int64 {
	var n int64
	for _, c := range l.byMethod(phase) {
		n += c
	}
	return n
}

func (l *ledger) reset() {
	l.mu.Lock()
	defer l.mu.Unlock()
	clear(l.calls)
	clear(l.tallied)
	if l.tally != nil {
		l.last = l.tally()
	}
}

func (l *ledger) tallyOf(phase string) int64 {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.tallied[phase]
}

func (l *ledger) CreateThread(ctx context.Context, t agent.Thread) (agent.Thread, bool, error) {
	th, ok, err := l.use("CreateThread").CreateThread(ctx, t)
	l.saw("CreateThread", t, err)
	return th, ok, err
}
func (l *ledger) GetThread(ctx context.Context, id string) (agent.Thread, error) {
	return l.use("GetThread").GetThread(ctx, id)
}
func (l *ledger) ListThreads(ctx context.Context, owner string, limit int) ([]agent.Thread, error) {
	return l.use("ListThreads").ListThreads(ctx, owner, limit)
}
func (l *ledger) ListThreadsPage(ctx context.Context, owner string, p agent.ThreadPage) (agent.Page[agent.Thread], error) {
	return l.use("ListThreadsPage").ListThreadsPage(ctx, owner, p)
}
func (l *ledger) UpdateThread(ctx context.Context, id string, p agent.ThreadPatch, now time.Time) (agent.Thread, error) {
	return l.use("UpdateThread").UpdateThread(ctx, id, p, now)
}
func (l *ledger) SetGeneratedTitle(ctx context.Context, g agent.GeneratedTitle) (agent.Thread, bool, error) {
	return l.use("SetGeneratedTitle").SetGeneratedTitle(ctx, g)
}
func (l *ledger) AddUsage(ctx context.Context, u agent.ThreadUsage) error {
	return l.use("AddUsage").AddUsage(ctx, u)
}
func (l *ledger) DeleteThread(ctx context.Context, id string) error {
	return l.use("DeleteThread").DeleteThread(ctx, id)
}
func (l *ledger) FinishDelete(ctx context.Context, id string) error {
	return l.use("FinishDelete").FinishDelete(ctx, id)
}
func (l *ledger) ClaimRun(ctx context.Context, r agent.ClaimRequest) (agent.ClaimResult, error) {
	res, err := l.use("ClaimRun").ClaimRun(ctx, r)
	l.saw("ClaimRun", res.Run, err)
	return res, err
}
func (l *ledger) Heartbeat(ctx context.Context, threadID string, f agent.Fence, now time.Time) error {
	return l.use("Heartbeat").Heartbeat(ctx, threadID, f, now)
}
func (l *ledger) KeepClaims(ctx context.Context, claims []agent.KeptClaim, now time.Time) []agent.KeepResult {
	return l.use("KeepClaims").KeepClaims(ctx, claims, now)
}
func (l *ledger) RequestCancel(ctx context.Context, threadID, runID string, now time.Time) (agent.Claim, error) {
	return l.use("RequestCancel").RequestCancel(ctx, threadID, runID, now)
}
func (l *ledger) MarkReader(ctx context.Context, threadID, runID string, until time.Time) error {
	return l.use("MarkReader").MarkReader(ctx, threadID, runID, until)
}
func (l *ledger) ReadersOf(ctx context.Context, threadIDs []string) ([]agent.ReaderMark, error) {
	return l.use("ReadersOf").ReadersOf(ctx, threadIDs)
}
func (l *ledger) FinishRun(ctx context.Context, run agent.Run) error {
	err := l.use("FinishRun").FinishRun(ctx, run)
	l.saw("FinishRun", run, err)
	return err
}
func (l *ledger) FenceMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return l.use("FenceMessage").FenceMessage(ctx, threadID, id, f)
}

func (l *ledger) TakeOver(ctx context.Context, r agent.TakeRequest) (agent.Fence, error) {
	return l.use("TakeOver").TakeOver(ctx, r)
}

func (l *ledger) NoteTakes(ctx context.Context, run agent.Run, ids []string) error {
	return l.use("NoteTakes").NoteTakes(ctx, run, ids)
}

func (l *ledger) RecordOutcome(ctx context.Context, run agent.Run, holder agent.Fence) error {
	return l.use("RecordOutcome").RecordOutcome(ctx, run, holder)
}

func (l *ledger) ReleaseClaim(ctx context.Context, r agent.ReleaseRequest) error {
	return l.use("ReleaseClaim").ReleaseClaim(ctx, r)
}
func (l *ledger) RecordLateUsage(ctx context.Context, late agent.LateUsage) error {
	return l.use("RecordLateUsage").RecordLateUsage(ctx, late)
}
func (l *ledger) ListDueSignals(ctx context.Context, before time.Time, limit int) ([]agent.Run, error) {
	return l.use("ListDueSignals").ListDueSignals(ctx, before, limit)
}
func (l *ledger) ClaimSignal(ctx context.Context, c agent.SignalClaim) error {
	return l.use("ClaimSignal").ClaimSignal(ctx, c)
}
func (l *ledger) SettleSignal(ctx context.Context, threadID, runID string, status agent.SignalStatus) error {
	return l.use("SettleSignal").SettleSignal(ctx, threadID, runID, status)
}
func (l *ledger) ListStaleClaims(ctx context.Context, before time.Time, limit int) ([]agent.StaleClaim, error) {
	return l.use("ListStaleClaims").ListStaleClaims(ctx, before, limit)
}
func (l *ledger) GetRun(ctx context.Context, threadID, runID string) (agent.Run, error) {
	return l.use("GetRun").GetRun(ctx, threadID, runID)
}
func (l *ledger) ListRuns(ctx context.Context, threadID string) ([]agent.Run, error) {
	return l.use("ListRuns").ListRuns(ctx, threadID)
}

func (l *ledger) ListRunsPage(ctx context.Context, threadID string, p agent.RunPage) (agent.Page[agent.Run], error) {
	return l.use("ListRunsPage").ListRunsPage(ctx, threadID, p)
}
func (l *ledger) PutMessage(ctx context.Context, w agent.MessageWrite) error {
	err := l.use("PutMessage").PutMessage(ctx, w)
	l.saw("PutMessage", w, err)
	return err
}
func (l *ledger) GetMessage(ctx context.Context, threadID, id string) (agent.MessageRecord, error) {
	return l.use("GetMessage").GetMessage(ctx, threadID, id)
}
func (l *ledger) ListMessages(ctx context.Context, threadID string) ([]agent.MessageRecord, error) {
	return l.use("ListMessages").ListMessages(ctx, threadID)
}

func (l *ledger) ListMessagesPage(ctx context.Context, threadID string, p agent.MessagePage) (agent.Page[agent.MessageRecord], error) {
	return l.use("ListMessagesPage").ListMessagesPage(ctx, threadID, p)
}
func (l *ledger) DeleteMessage(ctx context.Context, threadID, id string, f agent.Fence) error {
	return l.use("DeleteMessage").DeleteMessage(ctx, threadID, id, f)
}
func (l *ledger) AppendSegment(ctx context.Context, s agent.Segment) error {
	return l.use("AppendSegment").AppendSegment(ctx, s)
}
func (l *ledger) ListSegments(ctx context.Context, runID string, from int64, now time.Time) ([]agent.Segment, error) {
	return l.use("ListSegments").ListSegments(ctx, runID, from, now)
}
func (l *ledger) PutValue(ctx context.Context, ns, key string, value []byte) error {
	return l.use("PutValue").PutValue(ctx, ns, key, value)
}
func (l *ledger) GetValue(ctx context.Context, ns, key string) ([]byte, error) {
	return l.use("GetValue").GetValue(ctx, ns, key)
}
func (l *ledger) ListValues(ctx context.Context, ns string) ([]agent.KV, error) {
	return l.use("ListValues").ListValues(ctx, ns)
}
func (l *ledger) DeleteValue(ctx context.Context, ns, key string) error {
	return l.use("DeleteValue").DeleteValue(ctx, ns, key)
}
func (l *ledger) CreateInterrupt(ctx context.Context, in agent.Interrupt) (agent.Interrupt, bool, error) {
	return l.use("CreateInterrupt").CreateInterrupt(ctx, in)
}
func (l *ledger) GetInterrupt(ctx context.Context, threadID, messageID, id string) (agent.Interrupt, error) {
	return l.use("GetInterrupt").GetInterrupt(ctx, threadID, messageID, id)
}
func (l *ledger) ListMessageInterrupts(ctx context.Context, threadID, messageID string) ([]agent.Interrupt, error) {
	return l.use("ListMessageInterrupts").ListMessageInterrupts(ctx, threadID, messageID)
}
func (l *ledger) ListInterrupts(ctx context.Context, threadID string) ([]agent.Interrupt, error) {
	return l.use("ListInterrupts").ListInterrupts(ctx, threadID)
}
func (l *ledger) ResolveInterrupt(ctx context.Context, r agent.ResolveRequest) (agent.Interrupt, error) {
	return l.use("ResolveInterrupt").ResolveInterrupt(ctx, r)
}
func (l *ledger) ListExpiredInterrupts(ctx context.Context, before time.Time, limit int) ([]agent.Interrupt, error) {
	return l.use("ListExpiredInterrupts").ListExpiredInterrupts(ctx, before, limit)
}
func (l *ledger) CreateJob(ctx context.Context, j agent.Job) (agent.Job, bool, error) {
	return l.use("CreateJob").CreateJob(ctx, j)
}
func (l *ledger) GetJob(ctx context.Context, threadID, id string) (agent.Job, error) {
	return l.use("GetJob").GetJob(ctx, threadID, id)
}
func (l *ledger) ListJobs(ctx context.Context, threadID string) ([]agent.Job, error) {
	return l.use("ListJobs").ListJobs(ctx, threadID)
}
func (l *ledger) ListJobsPage(ctx context.Context, threadID string, finished int) (agent.JobsPage, error) {
	return l.use("ListJobsPage").ListJobsPage(ctx, threadID, finished)
}
func (l *ledger) SetJobDue(ctx context.Context, threadID, id string, due, now time.Time) error {
	return l.use("SetJobDue").SetJobDue(ctx, threadID, id, due, now)
}
func (l *ledger) SetJobActivity(ctx context.Context, threadID, id, activity string, now time.Time) error {
	return l.use("SetJobActivity").SetJobActivity(ctx, threadID, id, activity, now)
}
func (l *ledger) FinishJob(ctx context.Context, r agent.JobResult) (agent.Job, bool, error) {
	j, ok, err := l.use("FinishJob").FinishJob(ctx, r)
	l.saw("FinishJob", r, err)
	return j, ok, err
}
func (l *ledger) MarkJobDelivered(ctx context.Context, threadID, id string, now time.Time) (agent.Job, error) {
	return l.use("MarkJobDelivered").MarkJobDelivered(ctx, threadID, id, now)
}
func (l *ledger) ListDueJobs(ctx context.Context, before time.Time, limit int) ([]agent.Job, error) {
	return l.use("ListDueJobs").ListDueJobs(ctx, before, limit)
}
func (l *ledger) Enqueue(ctx context.Context, q agent.QueuedMessage, max int) (agent.QueuedMessage, bool, error) {
	out, ok, err := l.use("Enqueue").Enqueue(ctx, q, max)
	l.saw("Enqueue", q, err)
	return out, ok, err
}
func (l *ledger) ListQueued(ctx context.Context, threadID string) ([]agent.QueuedMessage, error) {
	return l.use("ListQueued").ListQueued(ctx, threadID)
}
func (l *ledger) TakeQueued(ctx context.Context, threadID, messageID string, now time.Time) error {
	return l.use("TakeQueued").TakeQueued(ctx, threadID, messageID, now)
}
func (l *ledger) ListQueuedThreads(ctx context.Context, before time.Time, limit int) ([]string, error) {
	return l.use("ListQueuedThreads").ListQueuedThreads(ctx, before, limit)
}

func (l *ledger) AcquireLease(ctx context.Context, r agent.LeaseRequest) (time.Duration, error) {
	return l.use("AcquireLease").AcquireLease(ctx, r)
}
func (l *ledger) RenewLease(ctx context.Context, r agent.LeaseRequest) error {
	return l.use("RenewLease").RenewLease(ctx, r)
}
func (l *ledger) ReleaseLease(ctx context.Context, scope, holder string) error {
	return l.use("ReleaseLease").ReleaseLease(ctx, scope, holder)
}
func (l *ledger) ReleaseLeases(ctx context.Context, scope, prefix string) error {
	return l.use("ReleaseLeases").ReleaseLeases(ctx, scope, prefix)
}
func (l *ledger) Count(ctx context.Context, r agent.CountRequest) (time.Duration, error) {
	return l.use("Count").Count(ctx, r)
}

func (l *ledger) HandOver(ctx context.Context, req agent.HandOverRequest) (agent.ClaimResult, error) {
	return l.use("HandOver").HandOver(ctx, req)
}
