package agent

import (
	"context"
	"math"
	"sync/atomic"
)

// StoreMeter counts the store requests made under one context (one run): a store adapter adds every request it
// sends, with the capacity units it consumed, to the meter StoreMeterFrom(ctx) returns. It is safe for
// concurrent use; there is no package-level meter.
type StoreMeter struct {
	requests, throttled atomic.Int64
	// units in thousandths, so that DynamoDB's half read units add up exactly.
	readMilli, writeMilli atomic.Int64
}

// Add records one request and the units it consumed.
func (m *StoreMeter) Add(readUnits, writeUnits float64) {
	if m == nil {
		return
	}
	m.requests.Add(1)
	m.readMilli.Add(int64(math.Round(readUnits * 1000)))
	m.writeMilli.Add(int64(math.Round(writeUnits * 1000)))
}

// AddUnits records capacity units without counting a request (for adapters that learn a request's units once,
// after counting each of its attempts with Add(0, 0)).
func (m *StoreMeter) AddUnits(readUnits, writeUnits float64) {
	if m == nil {
		return
	}
	m.readMilli.Add(int64(math.Round(readUnits * 1000)))
	m.writeMilli.Add(int64(math.Round(writeUnits * 1000)))
}

// Throttle records one request the store refused for throughput (it is also counted by Add).
func (m *StoreMeter) Throttle() {
	if m != nil {
		m.throttled.Add(1)
	}
}

// Snapshot returns the counts so far.
func (m *StoreMeter) Snapshot() StoreUsage {
	if m == nil {
		return StoreUsage{}
	}
	return StoreUsage{Requests: m.requests.Load(), Throttled: m.throttled.Load(),
		ReadUnits: float64(m.readMilli.Load()) / 1000, WriteUnits: float64(m.writeMilli.Load()) / 1000}
}

// StoreUsage is what a run cost the store: requests sent (every attempt, retries included), capacity units
// consumed as the store reported them (DynamoDB: read and write units, indexes included; SQLite: 0), and how many
// requests were throttled.
type StoreUsage struct {
	Requests   int64   `json:"requests"`
	ReadUnits  float64 `json:"readUnits"`
	WriteUnits float64 `json:"writeUnits"`
	Throttled  int64   `json:"throttled,omitempty"`
}

type meterKey struct{}

// WithStoreMeter returns ctx carrying m: store requests made with the returned context are counted on m.
func WithStoreMeter(ctx context.Context, m *StoreMeter) context.Context {
	return context.WithValue(ctx, meterKey{}, m)
}

// StoreMeterFrom returns the meter ctx carries, or nil (a nil meter counts nothing).
func StoreMeterFrom(ctx context.Context) *StoreMeter {
	m, _ := ctx.Value(meterKey{}).(*StoreMeter)
	return m
}
