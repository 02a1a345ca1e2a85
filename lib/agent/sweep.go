package agent

import "context"

// Sweep names one reaper sweep (reaper.Tick). The store calls made with a context that carries it may share what
// they read: a store may let a later list of the sweep reuse an earlier one's read of the same index (DynamoDB:
// the orphan runs' list reuses the stale claims' list's reads of the running index, so an idle tick queries its
// shards once, not twice). Calls outside a sweep, or of two sweeps, share nothing.
type Sweep struct{ _ int }

type sweepKey struct{}

// WithSweep returns ctx carrying a new sweep.
func WithSweep(ctx context.Context) context.Context {
	return context.WithValue(ctx, sweepKey{}, &Sweep{})
}

// SweepOf returns the sweep ctx carries, or nil.
func SweepOf(ctx context.Context) *Sweep {
	s, _ := ctx.Value(sweepKey{}).(*Sweep)
	return s
}
