// Package eventbridge is the agent.SignalSink of an Amazon EventBridge bus: every completion signal is one
// PutEvents entry on the default bus (aws-sdk-go-v2 service/eventbridge),
//
//	Source:       "agentloop" (Options.Source)
//	DetailType:   "agentloop.run.finished"
//	Detail:       agent.SignalDetail as JSON (infra/events/run-finished.schema.json): thread, run, owner, status,
//	              error code, usage, times; never any message text
//	Time:         the run's end
//	EventBusName: "default" (Options.Bus)
//
// A rule matches it with {"source": ["agentloop"], "detail-type": ["agentloop.run.finished"]}. A failed request,
// or an entry EventBridge did not take (FailedEntryCount), is a failed attempt that lib/signals retries; every
// attempt carries the same detail.signalId, so a consumer deduplicates by it.
//
// Log is the same event written as one log line instead (`agentloop dev`, `agentloop serve` without AWS).
package eventbridge

import (
	"cmp"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge"
	"github.com/aws/aws-sdk-go-v2/service/eventbridge/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Defaults, written once here.
const (
	DefaultBus    = "default"
	DefaultSource = "agentloop"
)

// API is the part of the EventBridge client the sink calls.
type API interface {
	PutEvents(ctx context.Context, in *eventbridge.PutEventsInput, opts ...func(*eventbridge.Options)) (*eventbridge.PutEventsOutput, error)
}

// Options name the bus and the events' source. Zero values take the defaults.
type Options struct {
	Bus    string
	Source string
}

// Bus puts signals on an EventBridge bus.
type Bus struct {
	api    API
	bus    string
	source string
}

var _ agent.SignalSink = (*Bus)(nil)

// New builds the sink over an EventBridge client.
func New(api API, o Options) *Bus {
	return &Bus{api: api, bus: cmp.Or(o.Bus, DefaultBus), source: cmp.Or(o.Source, DefaultSource)}
}

// Entry is the PutEvents entry of f.
func Entry(f agent.RunFinished, bus, source string) (types.PutEventsRequestEntry, error) {
	detail, err := json.Marshal(f.Detail())
	if err != nil {
		return types.PutEventsRequestEntry{}, err
	}
	e := types.PutEventsRequestEntry{Source: aws.String(source), DetailType: aws.String(agent.SignalEvent),
		Detail: aws.String(string(detail)), EventBusName: aws.String(bus)}
	if !f.FinishedAt.IsZero() {
		e.Time = aws.Time(f.FinishedAt)
	}
	return e, nil
}

// Send puts f on the bus; an entry EventBridge did not take is an error.
func (b *Bus) Send(ctx context.Context, f agent.RunFinished) error {
	e, err := Entry(f, b.bus, b.source)
	if err != nil {
		return err
	}
	out, err := b.api.PutEvents(ctx, &eventbridge.PutEventsInput{Entries: []types.PutEventsRequestEntry{e}})
	if err != nil {
		return fmt.Errorf("eventbridge: put events: %w", err)
	}
	if out.FailedEntryCount > 0 {
		code, msg := "", ""
		if len(out.Entries) > 0 {
			code, msg = aws.ToString(out.Entries[0].ErrorCode), aws.ToString(out.Entries[0].ErrorMessage)
		}
		return fmt.Errorf("eventbridge: entry not taken: %s: %s", code, msg)
	}
	return nil
}

// Log writes each signal as one log line ("agentloop.run.finished", with source, detail_type and the detail's
// JSON), where AWS would get the event: the local stack's sink.
type Log struct {
	Logger *slog.Logger
	Source string // DefaultSource when empty
}

var _ agent.SignalSink = Log{}

// Send logs f.
func (l Log) Send(ctx context.Context, f agent.RunFinished) error {
	detail, err := json.Marshal(f.Detail())
	if err != nil {
		return err
	}
	l.Logger.InfoContext(ctx, agent.SignalEvent, "source", cmp.Or(l.Source, DefaultSource), "detail_type", agent.SignalEvent,
		"detail", string(detail))
	return nil
}
