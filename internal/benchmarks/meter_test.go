package benchmarks

import (
	"flag"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/dynamo/dynamotest"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
)

// meter serves each (phase, method) from its own dynamo.Store over one table, each with a client carrying its own
// Counter that computes index write units (dynalite reports none), reading items through an uncounted client.
type meter struct {
	endpoint, table string
	mu              sync.Mutex
	stores          map[[2]string]*dynamo.Store
	counters        map[[2]string]*dynamo.Counter
	measure         func(*dynamo.Counter)
}

func newMeter(endpoint, table string) (*meter, error) {
	measure, err := indexWrites(endpoint, table)
	if err != nil {
		return nil, err
	}
	return &meter{endpoint: endpoint, table: table, stores: map[[2]string]*dynamo.Store{}, counters: map[[2]string]*dynamo.Counter{},
		measure: measure}, nil
}

// indexWrites makes a counter compute the index write units of each write (dynalite reports none), from the
// table's indexes as the SAM template declares them.
func indexWrites(endpoint, table string) (func(*dynamo.Counter), error) {
	path, err := dynamotest.TemplatePath()
	if err != nil {
		return nil, err
	}
	spec, err := dynamotest.LoadTable(path)
	if err != nil {
		return nil, err
	}
	raw := dynamotest.Client(endpoint)
	return func(c *dynamo.Counter) {
		c.MeasureIndexWrites(raw, table, []string{dynamo.AttrPK, dynamo.AttrSK}, spec.Indexes())
	}, nil
}

func (m *meter) route(phase, method string) agent.Store {
	k := [2]string{phase, method}
	m.mu.Lock()
	defer m.mu.Unlock()
	if s, ok := m.stores[k]; ok {
		return s
	}
	c := &dynamo.Counter{}
	m.measure(c)
	client := dynamotest.Client(m.endpoint, func(o *dynamodb.Options) { o.APIOptions = append(o.APIOptions, c.Register) })
	s := dynamo.New(client, m.table)
	m.stores[k], m.counters[k] = s, c
	return s
}

// counts returns what phase's calls sent, by method.
func (m *meter) counts(phase string) map[string]dynamo.Counts {
	m.mu.Lock()
	defer m.mu.Unlock()
	out := map[string]dynamo.Counts{}
	for k, c := range m.counters {
		if k[0] == phase {
			out[k[1]] = c.Counts()
		}
	}
	return out
}

func (m *meter) reset() {
	m.mu.Lock()
	defer m.mu.Unlock()
	for _, c := range m.counters {
		c.Reset()
	}
}

// sum adds counts up (ByOperation included).
func sum(cs map[string]dynamo.Counts) dynamo.Counts {
	t := dynamo.Counts{ByOperation: map[string]int64{}}
	for _, c := range cs {
		t.Reads, t.Writes, t.Other = t.Reads+c.Reads, t.Writes+c.Writes, t.Other+c.Other
		t.ReadUnits, t.TableWriteUnits, t.IndexWriteUnits = t.ReadUnits+c.ReadUnits, t.TableWriteUnits+c.TableWriteUnits, t.IndexWriteUnits+c.IndexWriteUnits
		t.IndexWrites += c.IndexWrites
		for op, n := range c.ByOperation {
			t.ByOperation[op] += n
		}
	}
	return t
}

// table renders a phase's calls per method on one line (with counts: the DynamoDB requests by operation and
// the capacity they consumed), each divided by n.
func table(calls map[string]int64, counts map[string]dynamo.Counts, n int) string {
	f := float64(n)
	var out []string
	for _, method := range slices.Sorted(maps.Keys(calls)) {
		s := fmt.Sprintf("%s %.3g", method, float64(calls[method])/f)
		if c, ok := counts[method]; ok {
			var ops []string
			for _, op := range slices.Sorted(maps.Keys(c.ByOperation)) {
				ops = append(ops, fmt.Sprintf("%s %.3g", op, float64(c.ByOperation[op])/f))
			}
			s += fmt.Sprintf(" [%s; %.3g RCU; %.3g WCU, %.3g of them index]", strings.Join(ops, " "), c.ReadUnits/f, c.WriteUnits()/f,
				c.IndexWriteUnits/f)
		}
		out = append(out, s)
	}
	return strings.Join(out, ", ")
}

// final reports whether this run of a benchmark function is the one whose figures are printed: with -benchtime
// Nx the function runs once with b.N = 1 first, then with N (and its log would appear twice).
func final(b *testing.B) bool {
	f := flag.Lookup("test.benchtime")
	return b.N > 1 || f == nil || f.Value.String() == "1x"
}
