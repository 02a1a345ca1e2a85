package dynamo

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
)

// TableSpec is a table definition: the CreateTable input (without a name) and the TTL attribute, if TTL is
// enabled.
type TableSpec struct {
	Input        dynamodb.CreateTableInput
	TTLAttribute string
}

// Table is the table this adapter reads and writes, as template.yaml's Table resource declares it (the layout,
// not PITR, SSE or tags): on-demand billing, pk/sk strings, the local index IndexMessagesBySeq, the global
// indexes IndexByOwner, IndexRunning, IndexPending, IndexDueWork and IndexThreadJobs, all keys only, and TTL on
// AttrExpiresAt. It is the one definition in Go: `agentloop serve --create-table` creates it on a local endpoint,
// the tests create theirs from it (lib/dynamo/dynamotest), and a test there checks that template.yaml declares
// exactly this table, so the deployed layout and this one cannot drift apart.
func Table() TableSpec {
	keys := func(hash, rng string) []types.KeySchemaElement {
		return []types.KeySchemaElement{
			{AttributeName: aws.String(hash), KeyType: types.KeyTypeHash},
			{AttributeName: aws.String(rng), KeyType: types.KeyTypeRange},
		}
	}
	keysOnly := func() *types.Projection { return &types.Projection{ProjectionType: types.ProjectionTypeKeysOnly} }
	gsi := func(name, hash, rng string) types.GlobalSecondaryIndex {
		return types.GlobalSecondaryIndex{IndexName: aws.String(name), KeySchema: keys(hash, rng), Projection: keysOnly()}
	}
	var attrs []types.AttributeDefinition
	for _, name := range []string{AttrPK, AttrSK, AttrOwner, AttrRecency, AttrRunShard, AttrClaimBucket, AttrPendingShard,
		AttrPendingExpiry, AttrDueShard, AttrDueAt, AttrJobThread, AttrJobOrder, attrMsgOrder} {
		attrs = append(attrs, types.AttributeDefinition{AttributeName: aws.String(name), AttributeType: types.ScalarAttributeTypeS})
	}
	return TableSpec{
		Input: dynamodb.CreateTableInput{
			BillingMode:          types.BillingModePayPerRequest,
			AttributeDefinitions: attrs,
			KeySchema:            keys(AttrPK, AttrSK),
			LocalSecondaryIndexes: []types.LocalSecondaryIndex{
				{IndexName: aws.String(IndexMessagesBySeq), KeySchema: keys(AttrPK, attrMsgOrder), Projection: keysOnly()},
			},
			GlobalSecondaryIndexes: []types.GlobalSecondaryIndex{
				gsi(IndexByOwner, AttrOwner, AttrRecency),
				gsi(IndexRunning, AttrRunShard, AttrClaimBucket),
				gsi(IndexPending, AttrPendingShard, AttrPendingExpiry),
				gsi(IndexDueWork, AttrDueShard, AttrDueAt),
				gsi(IndexThreadJobs, AttrJobThread, AttrJobOrder),
			},
		},
		TTLAttribute: AttrExpiresAt,
	}
}

// Indexes is every secondary index of the table, the local ones in the shape of global ones (a key schema and a
// projection: what Counter.MeasureIndexWrites needs).
func (s TableSpec) Indexes() []types.GlobalSecondaryIndex {
	out := append([]types.GlobalSecondaryIndex{}, s.Input.GlobalSecondaryIndexes...)
	for _, l := range s.Input.LocalSecondaryIndexes {
		out = append(out, types.GlobalSecondaryIndex{IndexName: l.IndexName, KeySchema: l.KeySchema, Projection: l.Projection})
	}
	return out
}

// TableAPI is the part of the DynamoDB client that creates tables.
type TableAPI interface {
	CreateTable(context.Context, *dynamodb.CreateTableInput, ...func(*dynamodb.Options)) (*dynamodb.CreateTableOutput, error)
	DescribeTable(context.Context, *dynamodb.DescribeTableInput, ...func(*dynamodb.Options)) (*dynamodb.DescribeTableOutput, error)
	UpdateTimeToLive(context.Context, *dynamodb.UpdateTimeToLiveInput, ...func(*dynamodb.Options)) (*dynamodb.UpdateTimeToLiveOutput, error)
}

// tablePoll is how often Create reads the table's status while it is being created.
const tablePoll = 50 * time.Millisecond

// EnsureTable creates the table under name from s unless it exists (DescribeTable finds it), and waits until it
// is active: created reports whether this call created it. A table that exists is taken as it is (its layout is
// not compared). `agentloop serve --create-table` calls it on a local endpoint (dynalite); several replicas
// starting at once converge on one table (Create's ResourceInUseException).
func (s TableSpec) EnsureTable(ctx context.Context, client TableAPI, name string) (created bool, err error) {
	_, err = client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
	var missing *types.ResourceNotFoundException
	switch {
	case err == nil:
		return false, waitActive(ctx, client, name)
	case !errors.As(err, &missing):
		return false, fmt.Errorf("dynamo: describe table %s: %w", name, err)
	}
	if _, err := s.Create(ctx, client, name); err != nil {
		return false, err
	}
	return true, nil
}

// Create creates the table under name, waits until it is active, then enables TTL when the spec asks for it. It
// reports whether TTL was enabled. dynalite implements no UpdateTimeToLive (and no TTL sweeper) and answers it
// with UnknownOperationException: that answer, and only that one, is tolerated (ttl false, no error), because the
// adapter never relies on the sweeper (reads drop expired segments themselves). Any other failure of
// UpdateTimeToLive is an error: against a real DynamoDB a TTL that does not switch on is a broken table.
func (s TableSpec) Create(ctx context.Context, client TableAPI, name string) (ttl bool, err error) {
	in := s.Input
	in.TableName = aws.String(name)
	// ResourceInUseException: the table exists already, because this call's own first attempt applied and the
	// SDK's retry (after an error of that attempt) found it (seen in a fresh-clone make test: lib/dynamo
	// TestEnqueueRacingARecreate), or because another process creating it at the same moment won (replicas of
	// `agentloop serve --create-table`). Either way it converges on waiting for the table, as any retried create
	// must.
	var inUse *types.ResourceInUseException
	if _, err := client.CreateTable(ctx, &in); err != nil && !errors.As(err, &inUse) {
		return false, fmt.Errorf("dynamo: create table %s: %w", name, err)
	}
	if err := waitActive(ctx, client, name); err != nil {
		return false, err
	}
	if s.TTLAttribute == "" {
		return false, nil
	}
	_, err = client.UpdateTimeToLive(ctx, &dynamodb.UpdateTimeToLiveInput{
		TableName: aws.String(name),
		TimeToLiveSpecification: &types.TimeToLiveSpecification{
			AttributeName: aws.String(s.TTLAttribute),
			Enabled:       aws.Bool(true),
		},
	})
	var api smithy.APIError
	if errors.As(err, &api) && api.ErrorCode() == "UnknownOperationException" {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("dynamo: enable TTL on %s: %w", name, err)
	}
	return true, nil
}

// waitActive polls until the table and its global indexes are active (a real DynamoDB may report the table
// ACTIVE while an index is still being created).
func waitActive(ctx context.Context, client TableAPI, name string) error {
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err != nil {
			return fmt.Errorf("dynamo: describe table %s: %w", name, err)
		}
		if out.Table.TableStatus == types.TableStatusActive && indexesActive(out.Table.GlobalSecondaryIndexes) {
			return nil
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(tablePoll):
		}
	}
}

func indexesActive(gsis []types.GlobalSecondaryIndexDescription) bool {
	for _, g := range gsis {
		if g.IndexStatus != "" && g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}
