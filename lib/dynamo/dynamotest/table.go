package dynamotest

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/agentloop/agentloop/internal/cfn"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"gopkg.in/yaml.v3"
)

// TableResource is the logical id of the table in template.yaml.
const TableResource = "Table"

// TableSpec is a table definition (dynamo.TableSpec): the CreateTable input (without a name) and the TTL
// attribute, if TTL is enabled. ParseTable reads one from a template.
type TableSpec = dynamo.TableSpec

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

// CreateTable creates table name on client from the adapter's table definition (dynamo.Table, which
// TestTemplateDeclaresTheAdaptersTable checks against template.yaml's Table resource), waits until it is active
// and enables TTL as the template does (where the server can: see dynamo.TableSpec.Create).
func CreateTable(ctx context.Context, client *dynamodb.Client, name string) error {
	_, err := dynamo.Table().Create(ctx, client, name)
	return err
}
