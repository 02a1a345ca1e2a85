package agent

import (
	"context"
	"time"
)

// Runs longer than one invocation (issue 21 items 2 and 3). A run may stop at a step boundary in one process and
// go on in another under the same run id: the hand-over. The process that stops stores the run as it stands (its
// draft reply, its stream segments up to a boundary) and asks a RunLauncher to continue it; the continuation
// takes the claim at the next epoch (HandOverStore.HandOver, a conditional write), so every later write of the old
// holder is refused (DESIGN principle 8), and streams on into the same reply and the same segment sequence. A
// continuation that never starts leaves a claim that goes stale: the reaper continues the run from the reply the
// hand-over stored (MessageMetadata.HandedOver), or finishes it as any (no loss).

// Continuation names a run to go on with no client attached: the hand-over's event, carried by the launcher
// (in-process, or the chat function's asynchronous invocation of itself) to the process that continues the run.
type Continuation struct {
	ThreadID string `json:"threadId"`
	RunID    string `json:"runId"`
	// Epoch is the claim's epoch the run stopped at: the continuation takes the claim only from it.
	Epoch int64 `json:"epoch"`
	// Segment is the number of the run's next stream segment (every one before it is stored).
	Segment int64 `json:"segment"`
	// Steps is how many model steps the run has taken (the step cap and part ids go on from it).
	Steps int `json:"steps"`
	// HandOvers counts the hand-overs so far, this one included (logged; bounded by nothing but the run's time).
	HandOvers int `json:"handOvers"`
	// Relaunches counts the reaper's relaunches of this continuation since the run last took a step (lib/reaper:
	// bounded, so a continuation that never starts is reaped in the end).
	Relaunches int `json:"relaunches,omitempty"`
}

// RunLauncher starts the continuation of a run in a fresh invocation with no client attached. Launch returns
// once the continuation is on its way (queued: an asynchronous invocation accepted, a goroutine started); it
// does not wait for the run. An error means nothing was launched: the caller keeps the run.
type RunLauncher interface {
	Launch(ctx context.Context, c Continuation) error
}

// HandOverRequest asks for a run's claim at the next epoch.
type HandOverRequest struct {
	ThreadID string
	// Fence is the claim as the old holder left it: the hand-over applies only while the claim is still exactly it.
	Fence Fence
	Now   time.Time
}

// HandOverStore is the hand-over's store behaviour, beside RunStore.
type HandOverStore interface {
	// HandOver moves the thread's claim from req.Fence to the same run id at epoch req.Fence.Epoch+1 with a fresh
	// heartbeat at req.Now, in one conditional write on the thread (the decision: only while the claim still
	// names req.Fence; a cancel request and reader marks stay), then records the new epoch on the run item (from
	// running at req.Fence.Epoch). It returns the run and the thread as they stand after. A claim that no longer
	// names req.Fence (taken over, reaped, released, handed over already), or a thread that is gone, is
	// KindConflict/CodeRunFenced and nothing changes. A lost answer is not recognised: its retry is run_fenced,
	// and the claim it took goes stale and is reaped (a duplicate continuation must never run beside the first).
	// A store whose two writes are separate (DynamoDB) may be left, by a crash between them, with the claim at
	// the new epoch and the run item at the old one: the reaper finishes such a run at the run item's epoch.
	HandOver(ctx context.Context, req HandOverRequest) (ClaimResult, error)
}
