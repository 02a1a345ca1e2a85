package boot

import (
	"context"
	"slices"
	"strings"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/ssm"
	"github.com/aws/aws-sdk-go-v2/service/ssm/types"

	"github.com/agentloop/agentloop/lib/toolsfile"
)

// fakeParams answers GetParameters from a map of SecureString values and records the names asked.
type fakeParams struct {
	values map[string]string
	asked  [][]string
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
