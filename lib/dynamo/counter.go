package dynamo

import (
	"context"
	"maps"
	"math"
	"sync"

	"github.com/aws/aws-sdk-go-v2/aws"
	awsmiddleware "github.com/aws/aws-sdk-go-v2/aws/middleware"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go/middleware"
)

// Counter counts the DynamoDB requests a client sends, per operation, split into reads and writes, the capacity
// units they consume, and the largest item any PutItem or BatchWriteItem put carried. Register it on a client:
//
//	var c dynamo.Counter
//	client := dynamodb.NewFromConfig(cfg, func(o *dynamodb.Options) {
//		o.APIOptions = append(o.APIOptions, c.Register)
//	})
//
// Requests are counted in the Finalize step after the SDK's retry middleware, so every attempt that goes on the
// wire counts once (a throttled request retried twice counts three times), which is what DynamoDB bills.
//
// Capacity: the counter asks every item request for ReturnConsumedCapacity=INDEXES (when the caller did not ask)
// and adds up what the server reports: read units, table write units and index write units. DynamoDB reports all
// three. dynalite reports read units and table write units (1 per KB of the larger of the old and new item,
// rounded up) but no index write units; MeasureIndexWrites makes the counter compute those itself.
//
// The zero value is ready to use; a Counter is safe for concurrent use (MeasureIndexWrites is exact only while no
// other client writes the same items).
type Counter struct {
	mu      sync.Mutex
	byOp    map[string]int64
	maxItem int
	units   units
	measure *indexMeasure
}

type units struct {
	read, tableWrite, indexWrite float64
	indexWrites                  int64
}

// Counts is a snapshot of a Counter.
type Counts struct {
	Reads  int64 // GetItem, BatchGetItem, Query, Scan, TransactGetItems
	Writes int64 // PutItem, UpdateItem, DeleteItem, BatchWriteItem, TransactWriteItems
	Other  int64 // control plane: CreateTable, DescribeTable, UpdateTimeToLive, ...
	// ByOperation counts requests per operation name.
	ByOperation map[string]int64
	// MaxPutItemBytes is the largest ItemSize seen in a PutItem or a BatchWriteItem put request.
	MaxPutItemBytes int
	// ReadUnits are the read capacity units the server reported (tables and indexes).
	ReadUnits float64
	// TableWriteUnits are the write capacity units the table itself consumed, as the server reported them (or,
	// with MeasureIndexWrites, computed for a failed conditional write, which DynamoDB bills but reports nothing
	// for).
	TableWriteUnits float64
	// IndexWriteUnits are the write units the global secondary indexes consumed: reported by the server, or
	// computed (MeasureIndexWrites). IndexWrites counts the index entries written (a moved entry is a delete and
	// a put: 2).
	IndexWriteUnits float64
	IndexWrites     int64
}

// Total is Reads+Writes+Other.
func (c Counts) Total() int64 { return c.Reads + c.Writes + c.Other }

// WriteUnits is every write unit consumed: table and indexes.
func (c Counts) WriteUnits() float64 { return c.TableWriteUnits + c.IndexWriteUnits }

// Sub returns c minus earlier, operation by operation; MaxPutItemBytes stays c's.
func (c Counts) Sub(earlier Counts) Counts {
	d := Counts{Reads: c.Reads - earlier.Reads, Writes: c.Writes - earlier.Writes, Other: c.Other - earlier.Other,
		ByOperation: map[string]int64{}, MaxPutItemBytes: c.MaxPutItemBytes,
		ReadUnits: c.ReadUnits - earlier.ReadUnits, TableWriteUnits: c.TableWriteUnits - earlier.TableWriteUnits,
		IndexWriteUnits: c.IndexWriteUnits - earlier.IndexWriteUnits, IndexWrites: c.IndexWrites - earlier.IndexWrites}
	for op, n := range c.ByOperation {
		if n -= earlier.ByOperation[op]; n != 0 {
			d.ByOperation[op] = n
		}
	}
	return d
}

// OperationClass tells whether a DynamoDB operation reads ("read"), writes ("write") or neither ("other").
func OperationClass(op string) string {
	switch op {
	case "GetItem", "BatchGetItem", "Query", "Scan", "TransactGetItems", "ExecuteStatement":
		return "read"
	case "PutItem", "UpdateItem", "DeleteItem", "BatchWriteItem", "TransactWriteItems", "BatchExecuteStatement",
		"ExecuteTransaction":
		return "write"
	default:
		return "other"
	}
}

// MeasureIndexWrites makes the counter compute the index write units of every item write itself, for servers
// that do not report them (dynalite). Around each PutItem, UpdateItem, DeleteItem and BatchWriteItem it reads the
// items written, before and after, through raw (a client this counter is not registered on, so the reads are
// not counted), and applies DynamoDB's rules for what a table write costs an index (infra/DYNAMODB.md, "What a
// write costs an index"): an item entering or leaving the index is one index write, a change of an index key is
// two (delete and put), a change of a projected attribute alone is one, and anything else is none; each index
// write costs 1 WCU per KB of the index entry, rounded up. Server-reported index units are then ignored.
// tableKeys are the table's key attribute names; indexes are the table's secondary indexes (GSIs as in its
// CreateTable input, local ones in the same shape: TableSpec.Indexes).
func (c *Counter) MeasureIndexWrites(raw *dynamodb.Client, table string, tableKeys []string, indexes []types.GlobalSecondaryIndex) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.measure = &indexMeasure{client: raw, table: table, tableKeys: tableKeys, indexes: indexes}
}

// Register adds the counter to an operation's middleware stack; use it in dynamodb.Options.APIOptions.
func (c *Counter) Register(stack *middleware.Stack) error {
	err := stack.Initialize.Add(middleware.InitializeMiddlewareFunc("agentloop.dynamo.CounterUnits",
		func(ctx context.Context, in middleware.InitializeInput, next middleware.InitializeHandler) (middleware.InitializeOutput, middleware.Metadata, error) {
			c.observe(in.Parameters)
			askCapacity(in.Parameters)
			c.mu.Lock()
			m := c.measure
			c.mu.Unlock()
			var keys []item
			var before []item
			if m != nil {
				keys = writtenKeys(in.Parameters)
				before = m.read(ctx, keys)
			}
			out, md, err := next.HandleInitialize(ctx, in)
			var u units
			if err == nil {
				u = reported(out.Result, m == nil)
			}
			if m != nil && len(keys) > 0 {
				after := m.read(ctx, keys)
				for i := range keys {
					n, wcu := m.indexCost(before[i], after[i])
					u.indexWrites += n
					u.indexWrite += wcu
				}
				if isConditionFailed(err) {
					// DynamoDB bills a failed conditional write as a write of the item it was checked against.
					u.tableWrite += writeUnits(ItemSize(before[0]))
				}
			}
			c.mu.Lock()
			c.units.read += u.read
			c.units.tableWrite += u.tableWrite
			c.units.indexWrite += u.indexWrite
			c.units.indexWrites += u.indexWrites
			c.mu.Unlock()
			return out, md, err
		}), middleware.After)
	if err != nil {
		return err
	}
	return stack.Finalize.Add(middleware.FinalizeMiddlewareFunc("agentloop.dynamo.CounterRequests",
		func(ctx context.Context, in middleware.FinalizeInput, next middleware.FinalizeHandler) (middleware.FinalizeOutput, middleware.Metadata, error) {
			c.count(awsmiddleware.GetOperationName(ctx))
			return next.HandleFinalize(ctx, in)
		}), middleware.After)
}

// askCapacity sets ReturnConsumedCapacity=INDEXES on item requests that did not set it.
func askCapacity(params any) {
	switch in := params.(type) {
	case *dynamodb.GetItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.QueryInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.ScanInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.BatchGetItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.PutItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.UpdateItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.DeleteItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	case *dynamodb.BatchWriteItemInput:
		in.ReturnConsumedCapacity = cmpCapacity(in.ReturnConsumedCapacity)
	}
}

func cmpCapacity(v types.ReturnConsumedCapacity) types.ReturnConsumedCapacity {
	if v == "" {
		return types.ReturnConsumedCapacityIndexes
	}
	return v
}

// reported adds up the capacity a response reports. Index write units are taken only when withIndexes (not
// measuring them).
func reported(result any, withIndexes bool) units {
	var u units
	var ccs []types.ConsumedCapacity
	read := false
	switch out := result.(type) {
	case *dynamodb.GetItemOutput:
		ccs, read = one(out.ConsumedCapacity), true
	case *dynamodb.QueryOutput:
		ccs, read = one(out.ConsumedCapacity), true
	case *dynamodb.ScanOutput:
		ccs, read = one(out.ConsumedCapacity), true
	case *dynamodb.BatchGetItemOutput:
		ccs, read = out.ConsumedCapacity, true
	case *dynamodb.PutItemOutput:
		ccs = one(out.ConsumedCapacity)
	case *dynamodb.UpdateItemOutput:
		ccs = one(out.ConsumedCapacity)
	case *dynamodb.DeleteItemOutput:
		ccs = one(out.ConsumedCapacity)
	case *dynamodb.BatchWriteItemOutput:
		ccs = out.ConsumedCapacity
	}
	for _, cc := range ccs {
		total := aws.ToFloat64(cc.CapacityUnits)
		if read {
			u.read += total
			continue
		}
		var idx float64
		for _, c := range cc.GlobalSecondaryIndexes {
			idx += aws.ToFloat64(c.CapacityUnits)
		}
		if cc.Table != nil {
			u.tableWrite += aws.ToFloat64(cc.Table.CapacityUnits)
		} else {
			u.tableWrite += total - idx
		}
		if withIndexes {
			u.indexWrite += idx
		}
	}
	return u
}

func one(cc *types.ConsumedCapacity) []types.ConsumedCapacity {
	if cc == nil {
		return nil
	}
	return []types.ConsumedCapacity{*cc}
}

// writeUnits is what writing an item (or an index entry) of n bytes costs: 1 WCU per KB, rounded up, at least 1.
func writeUnits(n int) float64 { return math.Max(1, math.Ceil(float64(n)/1024)) }

// writtenKeys lists the item keys a write request touches.
func writtenKeys(params any) []item {
	switch in := params.(type) {
	case *dynamodb.PutItemInput:
		return []item{in.Item}
	case *dynamodb.UpdateItemInput:
		return []item{in.Key}
	case *dynamodb.DeleteItemInput:
		return []item{in.Key}
	case *dynamodb.BatchWriteItemInput:
		var keys []item
		for _, reqs := range in.RequestItems {
			for _, r := range reqs {
				if r.PutRequest != nil {
					keys = append(keys, r.PutRequest.Item)
				} else if r.DeleteRequest != nil {
					keys = append(keys, r.DeleteRequest.Key)
				}
			}
		}
		return keys
	}
	return nil
}

type indexMeasure struct {
	client    *dynamodb.Client
	table     string
	tableKeys []string
	indexes   []types.GlobalSecondaryIndex
}

// read fetches the current items under keys (nil for missing ones), strongly consistent.
func (m *indexMeasure) read(ctx context.Context, keys []item) []item {
	out := make([]item, len(keys))
	for i, k := range keys {
		kk := item{}
		for _, a := range m.tableKeys {
			kk[a] = k[a]
		}
		res, err := m.client.GetItem(ctx, &dynamodb.GetItemInput{TableName: aws.String(m.table), Key: kk, ConsistentRead: aws.Bool(true)})
		if err == nil && len(res.Item) > 0 {
			out[i] = res.Item
		}
	}
	return out
}

// indexCost is what changing an item from before to after costs the indexes: entries written and write units.
func (m *indexMeasure) indexCost(before, after item) (int64, float64) {
	var n int64
	var wcu float64
	for _, g := range m.indexes {
		b, a := m.entry(g, before), m.entry(g, after)
		switch {
		case b == nil && a == nil:
		case b == nil:
			n, wcu = n+1, wcu+writeUnits(ItemSize(a))
		case a == nil:
			n, wcu = n+1, wcu+writeUnits(ItemSize(b))
		case !sameAttrs(b, a, keyNames(g.KeySchema)):
			n, wcu = n+2, wcu+writeUnits(ItemSize(b))+writeUnits(ItemSize(a))
		case !sameAttrs(b, a, nil):
			n, wcu = n+1, wcu+writeUnits(ItemSize(a))
		}
	}
	return n, wcu
}

// entry is the index entry of it in g (table keys, index keys and projected attributes), nil when it is not
// in the index (sparse: an index key is missing).
func (m *indexMeasure) entry(g types.GlobalSecondaryIndex, it item) item {
	if it == nil {
		return nil
	}
	e := item{}
	for _, k := range keyNames(g.KeySchema) {
		v, ok := it[k]
		if !ok {
			return nil
		}
		e[k] = v
	}
	for _, k := range m.tableKeys {
		e[k] = it[k]
	}
	switch g.Projection.ProjectionType {
	case types.ProjectionTypeAll:
		return maps.Clone(it)
	case types.ProjectionTypeInclude:
		for _, a := range g.Projection.NonKeyAttributes {
			if v, ok := it[a]; ok {
				e[a] = v
			}
		}
	}
	return e
}

func keyNames(ks []types.KeySchemaElement) []string {
	out := make([]string, len(ks))
	for i, k := range ks {
		out[i] = aws.ToString(k.AttributeName)
	}
	return out
}

// sameAttrs compares the attributes names of a and b (all of them when names is nil).
func sameAttrs(a, b item, names []string) bool {
	if names == nil {
		if len(a) != len(b) {
			return false
		}
		for k := range a {
			names = append(names, k)
		}
	}
	for _, k := range names {
		if !sameValue(a[k], b[k]) {
			return false
		}
	}
	return true
}

func sameValue(a, b types.AttributeValue) bool {
	switch a := a.(type) {
	case *types.AttributeValueMemberS:
		b, ok := b.(*types.AttributeValueMemberS)
		return ok && a.Value == b.Value
	case *types.AttributeValueMemberN:
		b, ok := b.(*types.AttributeValueMemberN)
		return ok && a.Value == b.Value
	case *types.AttributeValueMemberB:
		b, ok := b.(*types.AttributeValueMemberB)
		return ok && string(a.Value) == string(b.Value)
	case *types.AttributeValueMemberBOOL:
		b, ok := b.(*types.AttributeValueMemberBOOL)
		return ok && a.Value == b.Value
	case nil:
		return b == nil
	}
	// Sets, lists, maps and nulls: no index here holds one; treat them as changed, the conservative answer.
	return false
}

func (c *Counter) count(op string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.byOp == nil {
		c.byOp = map[string]int64{}
	}
	c.byOp[op]++
}

func (c *Counter) observe(params any) {
	size := 0
	switch in := params.(type) {
	case *dynamodb.PutItemInput:
		size = ItemSize(in.Item)
	case *dynamodb.BatchWriteItemInput:
		for _, reqs := range in.RequestItems {
			for _, r := range reqs {
				if r.PutRequest != nil {
					size = max(size, ItemSize(r.PutRequest.Item))
				}
			}
		}
	default:
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	c.maxItem = max(c.maxItem, size)
}

// Counts returns a snapshot.
func (c *Counter) Counts() Counts {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := Counts{ByOperation: maps.Clone(c.byOp), MaxPutItemBytes: c.maxItem, ReadUnits: c.units.read,
		TableWriteUnits: c.units.tableWrite, IndexWriteUnits: c.units.indexWrite, IndexWrites: c.units.indexWrites}
	if out.ByOperation == nil {
		out.ByOperation = map[string]int64{}
	}
	for op, n := range c.byOp {
		switch OperationClass(op) {
		case "read":
			out.Reads += n
		case "write":
			out.Writes += n
		default:
			out.Other += n
		}
	}
	return out
}

// Reset zeroes the counter (MeasureIndexWrites stays on).
func (c *Counter) Reset() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.byOp = nil
	c.maxItem = 0
	c.units = units{}
}
