package agent

import "context"

// A write gate says whether a fenced write may still be sent. The engine puts one on the context of every fenced
// store call (DESIGN principle 8: a run whose claim is in doubt writes nothing), and a store adapter whose client
// retries on its own inside one call (the AWS SDK does) asks it before each attempt, so that no attempt leaves
// after the claim's horizon (REVIEW D3). A nil answer means "send"; an error means "do not", and the adapter
// returns it (wrapped) without sending.
type writeGateKey struct{}

// WithWriteGate returns ctx carrying gate (nil: none).
func WithWriteGate(ctx context.Context, gate func() error) context.Context {
	return context.WithValue(ctx, writeGateKey{}, gate)
}

// MayWrite asks the context's write gate: nil when there is none or it lets the write go.
func MayWrite(ctx context.Context) error {
	if gate, _ := ctx.Value(writeGateKey{}).(func() error); gate != nil {
		return gate()
	}
	return nil
}
