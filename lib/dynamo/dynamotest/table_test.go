package dynamotest

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"reflect"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/dynamo"
)

// A template in the shape SAM templates take: short-form intrinsics everywhere, including inside the table's
// own properties where the translation ignores them.
const sample = `
AWSTemplateFormatVersion: "2010-09-09"
Transform: AWS::Serverless-2016-10-31
Parameters:
  Stage: {Type: String, Default: dev}
Conditions:
  IsProd: !Equals [!Ref Stage, prod]
Resources:
  Fn:
    Type: AWS::Serverless::Function
    Properties:
      Environment:
        Variables:
          TABLE: !Ref Table
          ARN: !GetAtt Table.Arn
          STREAM: !GetAtt [Table, StreamArn]
          NAME: !Sub "${AWS::StackName}-x"
          JOINED: !Join ["-", [a, !Ref Stage]]
  Table:
    Type: AWS::DynamoDB::Table
    Properties:
      TableName: !Sub "${AWS::StackName}-table"
      BillingMode: PAY_PER_REQUEST
      AttributeDefinitions:
        - {AttributeName: pk, AttributeType: S}
        - {AttributeName: sk, AttributeType: S}
        - {AttributeName: g, AttributeType: N}
      KeySchema:
        - {AttributeName: pk, KeyType: HASH}
        - {AttributeName: sk, KeyType: RANGE}
      GlobalSecondaryIndexes:
        - IndexName: byG
          KeySchema: [{AttributeName: g, KeyType: HASH}]
          Projection: {ProjectionType: INCLUDE, NonKeyAttributes: [a, b]}
        - IndexName: plain
          KeySchema: [{AttributeName: sk, KeyType: HASH}]
          Projection: {}
      TimeToLiveSpecification: {AttributeName: ttl, Enabled: true}
      PointInTimeRecoverySpecification: {PointInTimeRecoveryEnabled: !If [IsProd, true, false]}
`

func TestParseTable(t *testing.T) {
	t.Parallel()
	spec, err := ParseTable([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	in := spec.Input
	if in.BillingMode != types.BillingModePayPerRequest || in.ProvisionedThroughput != nil {
		t.Fatalf("billing = %s %+v, want PAY_PER_REQUEST without throughput", in.BillingMode, in.ProvisionedThroughput)
	}
	if len(in.AttributeDefinitions) != 3 || aws.ToString(in.AttributeDefinitions[2].AttributeName) != "g" ||
		in.AttributeDefinitions[2].AttributeType != types.ScalarAttributeTypeN {
		t.Fatalf("attribute definitions = %+v", in.AttributeDefinitions)
	}
	if len(in.KeySchema) != 2 || in.KeySchema[0].KeyType != types.KeyTypeHash || aws.ToString(in.KeySchema[1].AttributeName) != "sk" {
		t.Fatalf("key schema = %+v", in.KeySchema)
	}
	if len(in.GlobalSecondaryIndexes) != 2 {
		t.Fatalf("%d GSIs, want 2", len(in.GlobalSecondaryIndexes))
	}
	g := in.GlobalSecondaryIndexes[0]
	if aws.ToString(g.IndexName) != "byG" || g.Projection.ProjectionType != types.ProjectionTypeInclude ||
		strings.Join(g.Projection.NonKeyAttributes, ",") != "a,b" {
		t.Fatalf("GSI byG = %+v / %+v", g, g.Projection)
	}
	if p := in.GlobalSecondaryIndexes[1].Projection.ProjectionType; p != types.ProjectionTypeKeysOnly {
		t.Fatalf("GSI without ProjectionType = %s, want CloudFormation's default KEYS_ONLY", p)
	}
	if spec.TTLAttribute != "ttl" {
		t.Fatalf("TTL attribute = %q, want ttl", spec.TTLAttribute)
	}
	if in.TableName != nil {
		t.Fatalf("TableName = %q, want unset (the caller names test tables)", aws.ToString(in.TableName))
	}
}

func TestParseTableErrors(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name, template, want string
	}{
		{"no table", "Resources:\n  Other:\n    Type: AWS::SNS::Topic\n", "no \"Table\" resource"},
		{"wrong type", "Resources:\n  Table:\n    Type: AWS::S3::Bucket\n", "not an AWS::DynamoDB::Table"},
		{"no key schema", "Resources:\n  Table:\n    Type: AWS::DynamoDB::Table\n    Properties:\n      BillingMode: PAY_PER_REQUEST\n", "no KeySchema"},
		{"intrinsic where a name belongs", "Resources:\n  Table:\n    Type: AWS::DynamoDB::Table\n    Properties:\n      KeySchema:\n        - {AttributeName: !Ref X, KeyType: HASH}\n", "cannot unmarshal"},
		{"not yaml", "Resources: [", "template"},
	}
	for _, tc := range cases {
		_, err := ParseTable([]byte(tc.template))
		if err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%s: error = %v, want one mentioning %q", tc.name, err, tc.want)
		}
	}
}

// The repository's template parses, and TTL is on: stream segments rely on it.
func TestRepositoryTemplate(t *testing.T) {
	t.Parallel()
	path, err := TemplatePath()
	if err != nil {
		t.Fatal(err)
	}
	spec, err := LoadTable(path)
	if err != nil {
		t.Fatal(err)
	}
	if spec.TTLAttribute != "expiresAt" || len(spec.Input.GlobalSecondaryIndexes) != 5 {
		t.Fatalf("template table: TTL %q, %d GSIs; want expiresAt and 5", spec.TTLAttribute, len(spec.Input.GlobalSecondaryIndexes))
	}
}

// One table definition: the adapter's (dynamo.Table, what `agentloop serve --create-table` and every test create)
// is exactly template.yaml's Table resource, attribute for attribute and index for index, in the template's order.
func TestTemplateDeclaresTheAdaptersTable(t *testing.T) {
	t.Parallel()
	path, err := TemplatePath()
	if err != nil {
		t.Fatal(err)
	}
	fromTemplate, err := LoadTable(path)
	if err != nil {
		t.Fatal(err)
	}
	if want := dynamo.Table(); !reflect.DeepEqual(fromTemplate, want) {
		got, _ := json.MarshalIndent(fromTemplate, "", " ")
		w, _ := json.MarshalIndent(want, "", " ")
		t.Fatalf("template.yaml's table differs from dynamo.Table():\ntemplate: %s\ndynamo.Table: %s", got, w)
	}
}

// fakeDynamo answers the control-plane calls Create makes with bodies in the shape DynamoDB's JSON protocol uses
// (the API reference's response syntax), and records each request's target and body. ttlAnswer is what
// UpdateTimeToLive gets: status and body.
func fakeDynamo(t *testing.T, ttlStatus int, ttlBody string) (*httptest.Server, *[]string, *string) {
	t.Helper()
	var targets []string
	var ttlReq string
	var mu sync.Mutex
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		op := strings.TrimPrefix(r.Header.Get("X-Amz-Target"), "DynamoDB_20120810.")
		mu.Lock()
		targets = append(targets, op)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.0")
		table := `{"TableName":"t","TableStatus":"ACTIVE","KeySchema":[{"AttributeName":"pk","KeyType":"HASH"}],` +
			`"GlobalSecondaryIndexes":[{"IndexName":"running","IndexStatus":"ACTIVE"}]}`
		switch op {
		case "CreateTable":
			_, _ = io.WriteString(w, `{"TableDescription":`+strings.Replace(table, "ACTIVE", "CREATING", 1)+`}`)
		case "DescribeTable":
			_, _ = io.WriteString(w, `{"Table":`+table+`}`)
		case "UpdateTimeToLive":
			mu.Lock()
			ttlReq = string(body)
			mu.Unlock()
			w.WriteHeader(ttlStatus)
			_, _ = io.WriteString(w, ttlBody)
		default:
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"com.amazon.coral.service#UnknownOperationException"}`)
		}
	}))
	t.Cleanup(srv.Close)
	return srv, &targets, &ttlReq
}

// dynalite has no UpdateTimeToLive, so the TTL half of Create is checked here against DynamoDB's answers: a
// success switches TTL on (with the template's attribute, enabled), UnknownOperationException (dynalite's answer,
// byte for byte) is tolerated and reported as "no TTL", and any other error fails the create.
func TestCreateEnablesTTL(t *testing.T) {
	t.Parallel()
	spec, err := ParseTable([]byte(sample))
	if err != nil {
		t.Fatal(err)
	}
	cases := []struct {
		name    string
		status  int
		body    string
		wantTTL bool
		wantErr string
	}{
		{"DynamoDB", 200, `{"TimeToLiveSpecification":{"AttributeName":"ttl","Enabled":true}}`, true, ""},
		{"dynalite", 400, `{"__type":"com.amazon.coral.service#UnknownOperationException"}`, false, ""},
		{"refused", 400, `{"__type":"com.amazon.coral.validate#ValidationException","message":"TimeToLive is already enabled"}`, false, "enable TTL"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv, targets, ttlReq := fakeDynamo(t, tc.status, tc.body)
			ttl, err := spec.Create(context.Background(), Client(srv.URL, func(o *dynamodb.Options) { o.RetryMaxAttempts = 1 }), "t")
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("Create: %v, want an error mentioning %q", err, tc.wantErr)
				}
			} else if err != nil {
				t.Fatalf("Create: %v", err)
			}
			if ttl != tc.wantTTL {
				t.Fatalf("Create reported ttl=%v, want %v", ttl, tc.wantTTL)
			}
			if got := strings.Join(*targets, ","); got != "CreateTable,DescribeTable,UpdateTimeToLive" {
				t.Fatalf("requests = %s", got)
			}
			var sent struct {
				TableName               string
				TimeToLiveSpecification struct {
					AttributeName string
					Enabled       bool
				}
			}
			if err := json.Unmarshal([]byte(*ttlReq), &sent); err != nil {
				t.Fatal(err)
			}
			if sent.TableName != "t" || sent.TimeToLiveSpecification.AttributeName != "ttl" || !sent.TimeToLiveSpecification.Enabled {
				t.Fatalf("UpdateTimeToLive sent %s, want table t, attribute ttl, enabled", *ttlReq)
			}
		})
	}
}
