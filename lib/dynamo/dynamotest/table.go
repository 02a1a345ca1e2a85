package dynamotest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/agentloop/agentloop/internal/cfn"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/aws/smithy-go"
	"gopkg.in/yaml.v3"
)

// TableResource is the logical id of the table in template.yaml.
const TableResource = "Table"

// TableSpec is the table definition read from the template: the CreateTable input (without a name) and the TTL
// attribute, if TTL is enabled.
type TableSpec struct {
	Input        dynamodb.CreateTableInput
	TTLAttribute string
}

// Indexes is every secondary index of the table, the local ones in the shape of global ones (a key schema and a
// projection: what dynamo.Counter's index accounting needs).
func (s TableSpec) Indexes() []types.GlobalSecondaryIndex {
	out := append([]types.GlobalSecondaryIndex{}, s.Input.GlobalSecondaryIndexes...)
	for _, l := range s.Input.LocalSecondaryIndexes {
		out = append(out, types.GlobalSecondaryIndex{IndexName: l.IndexName, KeySchema: l.KeySchema, Projection: l.Projection})
	}
	return out
}

// cfnTable is the subset of AWS::DynamoDB::Table properties that shape the data layout. The rest (PITR, SSE,
// tags, deletion policy) have no counterpart in dynalite and are ignored.
type cfnTable struct {
	BillingMode          string `yaml:"BillingMode"`
	AttributeDefinitions []struct {
		AttributeName string `yaml:"AttributeName"`
		AttributeType string `yaml:"AttributeType"`
	} `yaml:"AttributeDefinitions"`
	KeySchema              []cfnKey `yaml:"KeySchema"`
	GlobalSecondaryIndexes []struct {
		IndexName  string        `yaml:"IndexName"`
		KeySchema  []cfnKey      `yaml:"KeySchema"`
		Projection cfnProjection `yaml:"Projection"`
	} `yaml:"GlobalSecondaryIndexes"`
	LocalSecondaryIndexes []struct {
		IndexName  string        `yaml:"IndexName"`
		KeySchema  []cfnKey      `yaml:"KeySchema"`
		Projection cfnProjection `yaml:"Projection"`
	} `yaml:"LocalSecondaryIndexes"`
	TimeToLiveSpecification *struct {
		AttributeName string `yaml:"AttributeName"`
		Enabled       bool   `yaml:"Enabled"`
	} `yaml:"TimeToLiveSpecification"`
}

type cfnKey struct {
	AttributeName string `yaml:"AttributeName"`
	KeyType       string `yaml:"KeyType"`
}

type cfnProjection struct {
	ProjectionType   string   `yaml:"ProjectionType"`
	NonKeyAttributes []string `yaml:"NonKeyAttributes"`
}

// TemplatePath is template.yaml at the repository root.
func TemplatePath() (string, error) {
	root, err := RepoRoot()
	if err != nil {
		return "", err
	}
	return filepath.Join(root, "template.yaml"), nil
}

// LoadTable reads the Table resource from a CloudFormation/SAM template.
func LoadTable(path string) (TableSpec, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return TableSpec{}, err
	}
	return ParseTable(data)
}

// ParseTable translates the Table resource of a CloudFormation/SAM template into a CreateTable input. The
// template's intrinsic-function short tags (!Ref, !Sub, !GetAtt, ...) are rewritten to their long forms first,
// so templates that use them anywhere parse.
func ParseTable(template []byte) (TableSpec, error) {
	doc, err := cfn.Parse(template)
	if err != nil {
		return TableSpec{}, fmt.Errorf("dynamotest: template: %w", err)
	}
	var tmpl struct {
		Resources map[string]struct {
			Type       string    `yaml:"Type"`
			Properties yaml.Node `yaml:"Properties"`
		} `yaml:"Resources"`
	}
	if err := doc.Decode(&tmpl); err != nil {
		return TableSpec{}, fmt.Errorf("dynamotest: template: %w", err)
	}
	res, ok := tmpl.Resources[TableResource]
	if !ok {
		return TableSpec{}, fmt.Errorf("dynamotest: template has no %q resource", TableResource)
	}
	if res.Type != "AWS::DynamoDB::Table" {
		return TableSpec{}, fmt.Errorf("dynamotest: resource %q is a %s, not an AWS::DynamoDB::Table", TableResource, res.Type)
	}
	var t cfnTable
	if err := res.Properties.Decode(&t); err != nil {
		return TableSpec{}, fmt.Errorf("dynamotest: %s properties: %w", TableResource, err)
	}
	return t.spec()
}

func (t cfnTable) spec() (TableSpec, error) {
	var in dynamodb.CreateTableInput
	for _, a := range t.AttributeDefinitions {
		in.AttributeDefinitions = append(in.AttributeDefinitions, types.AttributeDefinition{
			AttributeName: aws.String(a.AttributeName),
			AttributeType: types.ScalarAttributeType(a.AttributeType),
		})
	}
	if len(t.KeySchema) == 0 {
		return TableSpec{}, errors.New("dynamotest: table has no KeySchema")
	}
	in.KeySchema = keySchema(t.KeySchema)
	switch t.BillingMode {
	case "", "PROVISIONED":
		// CloudFormation's default; dynalite needs numbers but ignores them.
		in.BillingMode = types.BillingModeProvisioned
		in.ProvisionedThroughput = throughput()
	case "PAY_PER_REQUEST":
		in.BillingMode = types.BillingModePayPerRequest
	default:
		return TableSpec{}, fmt.Errorf("dynamotest: unknown BillingMode %q", t.BillingMode)
	}
	for _, g := range t.GlobalSecondaryIndexes {
		gsi := types.GlobalSecondaryIndex{
			IndexName:  aws.String(g.IndexName),
			KeySchema:  keySchema(g.KeySchema),
			Projection: projection(g.Projection),
		}
		if in.BillingMode == types.BillingModeProvisioned {
			gsi.ProvisionedThroughput = throughput()
		}
		in.GlobalSecondaryIndexes = append(in.GlobalSecondaryIndexes, gsi)
	}
	for _, l := range t.LocalSecondaryIndexes {
		in.LocalSecondaryIndexes = append(in.LocalSecondaryIndexes, types.LocalSecondaryIndex{
			IndexName:  aws.String(l.IndexName),
			KeySchema:  keySchema(l.KeySchema),
			Projection: projection(l.Projection),
		})
	}
	spec := TableSpec{Input: in}
	if ttl := t.TimeToLiveSpecification; ttl != nil && ttl.Enabled {
		spec.TTLAttribute = ttl.AttributeName
	}
	return spec, nil
}

func keySchema(ks []cfnKey) []types.KeySchemaElement {
	out := make([]types.KeySchemaElement, len(ks))
	for i, k := range ks {
		out[i] = types.KeySchemaElement{AttributeName: aws.String(k.AttributeName), KeyType: types.KeyType(k.KeyType)}
	}
	return out
}

func projection(p cfnProjection) *types.Projection {
	typ := p.ProjectionType
	if typ == "" {
		typ = string(types.ProjectionTypeKeysOnly) // CloudFormation's default
	}
	return &types.Projection{ProjectionType: types.ProjectionType(typ), NonKeyAttributes: p.NonKeyAttributes}
}

func throughput() *types.ProvisionedThroughput {
	return &types.ProvisionedThroughput{ReadCapacityUnits: aws.Int64(5), WriteCapacityUnits: aws.Int64(5)}
}

// CreateTable creates table name on client from template.yaml's Table resource, waits until it is active and
// enables TTL as the template does (where the server can: see Create).
func CreateTable(ctx context.Context, client *dynamodb.Client, name string) error {
	path, err := TemplatePath()
	if err != nil {
		return err
	}
	spec, err := LoadTable(path)
	if err != nil {
		return err
	}
	_, err = spec.Create(ctx, client, name)
	return err
}

// Create creates the table under name, waits until it is active, then enables TTL when the spec asks for it. It
// reports whether TTL was enabled. dynalite implements no UpdateTimeToLive (and no TTL sweeper) and answers it
// with UnknownOperationException: that answer, and only that one, is tolerated (ttl false, no error), because the
// adapter never relies on the sweeper (reads drop expired segments themselves). Any other failure of
// UpdateTimeToLive is an error: against a real DynamoDB a TTL that does not switch on is a broken table.
func (s TableSpec) Create(ctx context.Context, client *dynamodb.Client, name string) (ttl bool, err error) {
	in := s.Input
	in.TableName = aws.String(name)
	// Every caller names a table no one else creates, so ResourceInUseException means this call's own first
	// attempt applied and the SDK's retry (after an error of that attempt) found the table: it converges on
	// waiting for it, as any retried create must. Seen in a fresh-clone make test on an idle machine
	// (lib/dynamo TestEnqueueRacingARecreate: "ResourceInUseException" for agentloop-test-<nanos>-41).
	var inUse *types.ResourceInUseException
	if _, err := client.CreateTable(ctx, &in); err != nil && !errors.As(err, &inUse) {
		return false, fmt.Errorf("dynamotest: create table %s: %w", name, err)
	}
	for {
		out, err := client.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(name)})
		if err != nil {
			return false, fmt.Errorf("dynamotest: describe table %s: %w", name, err)
		}
		if out.Table.TableStatus == types.TableStatusActive && indexesActive(out.Table.GlobalSecondaryIndexes) {
			break
		}
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(50 * time.Millisecond):
		}
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
		return false, fmt.Errorf("dynamotest: enable TTL on %s: %w", name, err)
	}
	return true, nil
}

// indexesActive: a real DynamoDB may report the table ACTIVE while an index is still being created.
func indexesActive(gsis []types.GlobalSecondaryIndexDescription) bool {
	for _, g := range gsis {
		if g.IndexStatus != "" && g.IndexStatus != types.IndexStatusActive {
			return false
		}
	}
	return true
}
