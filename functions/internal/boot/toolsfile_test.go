package boot

import (
	"context"
	"log/slog"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/aws-sdk-go-v2/service/ssm/types"
	"github.com/aws/smithy-go"

	"github.com/agentloop/agentloop/lib/toolsfile"
)

// fakeParams answers GetParameters from a map of SecureString values and records the names asked, and
// GetParameter (the tools file kept in SSM) from files, with the SDK's typed errors. Real SSM cannot run here
// (no AWS account or credentials in tests, no local emulator): lib/ssmsecrets' tests run the SDK client against
// a fake SSM endpoint, and TestSetupRejectsBadConfig in functions/chat a cold start against one.
type fakeParams struct {
	values map[string]string
	asked  [][]string
	files  map[string]string // GetParameter's, by name
	denied bool              // GetParameter is refused, as for a role without the grant
	read   []string          // the names GetParameter was asked
}

func (f *fakeParams) GetParameter(_ context.Context, in *ssm.GetParameterInput, _ ...func(*ssm.Options)) (*ssm.GetParameterOutput, error) {
	name := aws.ToString(in.Name)
	f.read = append(f.read, name)
	v, ok := f.files[name]
	switch {
	case f.denied:
		return nil, &smithy.GenericAPIError{Code: "AccessDeniedException", Message: "not authorized to perform: ssm:GetParameter"}
	case !ok:
		return nil, &types.ParameterNotFound{}
	case !aws.ToBool(in.WithDecryption):
		v = "ciphertext"
	}
	return &ssm.GetParameterOutput{Parameter: &types.Parameter{Name: in.Name, Value: aws.String(v), Type: types.ParameterTypeString}}, nil
}

func (f *fakeParams) GetParameters(_ context.Context, in *ssm.GetParametersInput, _ ...func(*ssm.Options)) (*ssm.GetParametersOutput, error) {
	f.asked = append(f.asked, in.Names)
	out := &ssm.GetParametersOutput{}
	for _, n := range in.Names {
		if v, ok := f.values[n]; ok {
			out.Parameters = append(out.Parameters, types.Parameter{Name: aws.String(n), Value: aws.String(v), Type: types.ParameterTypeSecureString})
		} else {
			out.InvalidParameters = append(out.InvalidParameters, n)
		}
	}
	return out, nil
}

// Issue 19: the tools file's ${ssm:…} references are read at cold start, SecureString parameters in one request,
// and a missing one fails the start naming it.
func TestToolsFileSSMReferences(t *testing.T) {
	t.Parallel()
	f, err := toolsfile.Parse("tools.yaml", []byte(`httpTools:
  - name: a
    description: A.
    url: https://api.example.com/a
    headers: {Authorization: "Bearer ${ssm:/agentloop/a}", X-Api-Key: "${ssm:/agentloop/b}"}
`), toolsfile.Options{})
	if err != nil {
		t.Fatal(err)
	}
	api := &fakeParams{values: map[string]string{"/agentloop/a": "tok-a", "/agentloop/b": "tok-b"}}
	secrets, err := f.Resolve(context.Background(), toolsfile.Resolvers{toolsfile.RefSSM: ssmRefs{api: api}})
	if err != nil {
		t.Fatal(err)
	}
	if got := secrets.Expand("Bearer ${ssm:/agentloop/a} ${ssm:/agentloop/b}"); got != "Bearer tok-a tok-b" {
		t.Errorf("expanded %q", got)
	}
	if len(api.asked) != 1 || !slices.Equal(api.asked[0], []string{"/agentloop/a", "/agentloop/b"}) {
		t.Errorf("GetParameters calls %v, want one for both names", api.asked)
	}
	_, err = f.Resolve(context.Background(), toolsfile.Resolvers{toolsfile.RefSSM: ssmRefs{api: &fakeParams{values: map[string]string{"/agentloop/a": "x"}}}})
	if err == nil || !strings.Contains(err.Error(), "/agentloop/b") {
		t.Errorf("a missing parameter: %v, want an error naming it", err)
	}
}

// Issue 19 item 1: AGENT_TOOLS_FILE=ssm:<name> reads the whole tools file from that parameter at cold start (one
// GetParameter, with decryption), YAML or JSON, checked with the parameter's name where a file's would be; its
// ${ssm:…} references still resolve through the scoped resolver. A parameter that does not exist fails the start
// saying what to create (region, name, the command, the size limits); one the role may not read names the
// template parameter that grants it.
func TestToolsFileFromSSM(t *testing.T) {
	t.Parallel()
	const yamlFile = `httpTools:
  - name: create_ticket
    description: Open a ticket.
    url: https://api.example.com/tickets
    headers: {Authorization: "Bearer ${ssm:/agentloop/tools/token}"}
`
	const jsonFile = `{"httpTools": [{"name": "create_ticket", "description": "Open a ticket.", "url": "https://api.example.com/tickets",
  "headers": {"Authorization": "Bearer ${ssm:/agentloop/tools/token}"}}]}`
	files := map[string]string{
		"/agentloop/tools":      yamlFile,
		"/agentloop/tools-json": jsonFile,
		"/agentloop/tools-bad":  "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n    method: FETCH\n",
		"/agentloop/tools-out":  "httpTools:\n  - name: t\n    description: d\n    url: https://api.example.com/x\n    headers: {X-Api-Key: \"${ssm:/agentloop/agent-secret}\"}\n",
	}
	tests := []struct {
		name    string
		source  string
		denied  bool
		wantErr []string // in the error, when it fails
	}{
		{name: "YAML", source: "ssm:/agentloop/tools"},
		{name: "JSON", source: "ssm:/agentloop/tools-json"},
		{name: "missing parameter", source: "ssm:/agentloop/gone", wantErr: []string{"/agentloop/gone does not exist", "region eu-west-1",
			"aws ssm put-parameter --region eu-west-1 --type String --name /agentloop/gone --value file://tools.yaml", "--tier Advanced"}},
		{name: "bad file names the parameter and line", source: "ssm:/agentloop/tools-bad",
			wantErr: []string{`/agentloop/tools-bad:5: httpTools[0].method: "FETCH" is not an HTTP method`}},
		{name: "reference outside the secrets path", source: "ssm:/agentloop/tools-out",
			wantErr: []string{"/agentloop/tools-out:5: httpTools[0].headers.X-Api-Key: ${ssm:/agentloop/agent-secret} is outside the SSM path"}},
		{name: "not granted", source: "ssm:/agentloop/tools", denied: true,
			wantErr: []string{"read SSM parameter /agentloop/tools", "AccessDenied", "ToolsFileParameterName"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			api := &fakeParams{values: map[string]string{"/agentloop/tools/token": "tok"}, files: files, denied: tt.denied}
			b := Base{getenv: func(string) string { return "" }, Log: slog.New(slog.DiscardHandler)}
			b.AWS.Region = "eu-west-1"
			b.Config.ToolsFile, b.Config.ToolsSecretsPath = tt.source, "/agentloop/tools/"
			f, secrets, err := b.toolsFile(context.Background(), api, []string{"add_note"})
			if name, _ := toolsfile.SSMParameter(tt.source); !slices.Equal(api.read, []string{name}) {
				t.Errorf("GetParameter asked %v, want %s once", api.read, name)
			}
			if tt.wantErr != nil {
				for _, want := range tt.wantErr {
					if err == nil || !strings.Contains(err.Error(), want) {
						t.Errorf("err = %v, want it to say %s", err, want)
					}
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(f.HTTPTools) != 1 || secrets.Expand(f.HTTPTools[0].Headers["Authorization"]) != "Bearer tok" {
				t.Errorf("read %+v with secrets %v, want create_ticket with its token resolved", f.HTTPTools, secrets)
			}
			if len(api.asked) != 1 || !slices.Equal(api.asked[0], []string{"/agentloop/tools/token"}) {
				t.Errorf("GetParameters asked %v, want the file's one reference", api.asked)
			}
		})
	}
}
