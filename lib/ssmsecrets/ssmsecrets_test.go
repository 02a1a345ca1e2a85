package ssmsecrets_test

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/ssm"

	"github.com/agentloop/agentloop/lib/agent"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
)

// fakeSSM speaks the SSM JSON protocol for GetParameters and GetParameter, so the tests exercise the real SDK
// client and see the request exactly as AWS would. (Real SSM cannot run here: no AWS account or credentials in
// the test environment, and no local SSM emulator; the protocol's request and error shapes are what this fakes.)
type fakeSSM struct {
	params map[string]param // by name
	status int              // non-zero: answer every request with this status

	mu       sync.Mutex
	requests []getParametersRequest
}

type param struct{ Value, Type string }

type getParametersRequest struct {
	Target         string   `json:"-"`
	Names          []string `json:"Names"`
	Name           string   `json:"Name"` // GetParameter's
	WithDecryption bool     `json:"WithDecryption"`
}

func (f *fakeSSM) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	var req getParametersRequest
	_ = json.Unmarshal(body, &req)
	req.Target = r.Header.Get("X-Amz-Target")
	f.mu.Lock()
	f.requests = append(f.requests, req)
	f.mu.Unlock()
	w.Header().Set("Content-Type", "application/x-amz-json-1.1")
	if f.status != 0 {
		w.WriteHeader(f.status)
		_, _ = io.WriteString(w, `{"__type":"AccessDeniedException","message":"denied"}`)
		return
	}
	type outParam struct{ Name, Value, Type string }
	if req.Target == "AmazonSSM.GetParameter" {
		p, ok := f.params[req.Name]
		if !ok {
			w.WriteHeader(http.StatusBadRequest)
			_, _ = io.WriteString(w, `{"__type":"ParameterNotFound","message":""}`)
			return
		}
		value := p.Value
		if p.Type == "SecureString" && !req.WithDecryption {
			value = "ciphertext"
		}
		_ = json.NewEncoder(w).Encode(struct{ Parameter outParam }{outParam{Name: req.Name, Value: value, Type: p.Type}})
		return
	}
	out := struct {
		Parameters        []outParam
		InvalidParameters []string
	}{Parameters: []outParam{}, InvalidParameters: []string{}}
	for _, n := range req.Names {
		p, ok := f.params[n]
		if !ok {
			out.InvalidParameters = append(out.InvalidParameters, n)
			continue
		}
		value := p.Value
		if p.Type == "SecureString" && !req.WithDecryption {
			value = "ciphertext" // what SSM returns for an undecrypted SecureString
		}
		out.Parameters = append(out.Parameters, outParam{Name: n, Value: value, Type: p.Type})
	}
	_ = json.NewEncoder(w).Encode(out)
}

func (f *fakeSSM) calls() []getParametersRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]getParametersRequest(nil), f.requests...)
}

func setup(t *testing.T, f *fakeSSM) *ssm.Client {
	t.Helper()
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return ssm.New(ssm.Options{
		Region:           "us-east-1",
		BaseEndpoint:     aws.String(srv.URL),
		Credentials:      credentials.NewStaticCredentialsProvider("test", "test", ""),
		RetryMaxAttempts: 1,
	})
}

func TestLoadFromSSM(t *testing.T) {
	t.Parallel()
	f := &fakeSSM{params: map[string]param{
		"/app/secret": {Value: "s3cret", Type: "SecureString"},
		"/app/openai": {Value: "sk-test", Type: "SecureString"},
	}}
	client := setup(t, f)
	got, err := ssmsecrets.Load(context.Background(), client,
		ssmsecrets.Secret{Label: "application secret", Param: "/app/secret", Fallback: "ignored"},
		ssmsecrets.Secret{Label: "OpenAI API key", Param: "/app/openai"},
		ssmsecrets.Secret{Label: "same secret again", Param: "/app/secret"},
	)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"s3cret", "sk-test", "s3cret"}; !slices.Equal(got, want) {
		t.Fatalf("values = %q, want %q (a set parameter wins over the fallback)", got, want)
	}
	calls := f.calls()
	// One request for all names, deduplicated, with decryption on: the cold start pays one round trip.
	if len(calls) != 1 {
		t.Fatalf("GetParameters calls = %d, want 1", len(calls))
	}
	c := calls[0]
	if c.Target != "AmazonSSM.GetParameters" || !c.WithDecryption || !slices.Equal(c.Names, []string{"/app/secret", "/app/openai"}) {
		t.Fatalf("request = %+v, want GetParameters of both names WithDecryption", c)
	}
}

func TestLoadErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		fake     *fakeSSM
		secrets  []ssmsecrets.Secret
		wantKind agent.Kind
		wantCode string
	}{
		{name: "missing parameter", fake: &fakeSSM{},
			secrets:  []ssmsecrets.Secret{{Label: "secret", Param: "/nope", Fallback: "never used"}},
			wantKind: agent.KindInternal, wantCode: ssmsecrets.CodeMissing},
		{name: "plain String parameter", fake: &fakeSSM{params: map[string]param{"/plain": {Value: "v", Type: "String"}}},
			secrets:  []ssmsecrets.Secret{{Label: "secret", Param: "/plain"}},
			wantKind: agent.KindInternal, wantCode: ssmsecrets.CodeNotSecure},
		{name: "empty parameter", fake: &fakeSSM{params: map[string]param{"/empty": {Value: "", Type: "SecureString"}}},
			secrets:  []ssmsecrets.Secret{{Label: "secret", Param: "/empty"}},
			wantKind: agent.KindInternal, wantCode: ssmsecrets.CodeMissing},
		{name: "access denied", fake: &fakeSSM{status: http.StatusBadRequest},
			secrets:  []ssmsecrets.Secret{{Label: "secret", Param: "/app/secret"}},
			wantKind: agent.KindUnavailable, wantCode: ssmsecrets.CodeUnavailable},
		{name: "required and unset", fake: &fakeSSM{},
			secrets:  []ssmsecrets.Secret{{Label: "secret"}},
			wantKind: agent.KindInternal, wantCode: ssmsecrets.CodeUnset},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			_, err := ssmsecrets.Load(context.Background(), setup(t, tt.fake), tt.secrets...)
			if agent.KindOf(err) != tt.wantKind || agent.CodeOf(err) != tt.wantCode {
				t.Fatalf("err = %v (kind %v, code %s), want kind %v code %s", err, agent.KindOf(err), agent.CodeOf(err), tt.wantKind, tt.wantCode)
			}
		})
	}
}

// Without parameter names nothing talks to SSM (there is none locally): plain values and optional blanks resolve
// with a nil client.
func TestLoadFallbackWithoutSSM(t *testing.T) {
	t.Parallel()
	got, err := ssmsecrets.Load(context.Background(), nil,
		ssmsecrets.Secret{Label: "application secret", Fallback: "plain"},
		ssmsecrets.Secret{Label: "OpenAI API key", Optional: true},
	)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(got, []string{"plain", ""}) {
		t.Fatalf("values = %q", got)
	}
	if _, err := ssmsecrets.Load(context.Background(), nil, ssmsecrets.Secret{Label: "x", Param: "/p"}); err == nil {
		t.Fatal("a named parameter without a client must fail")
	}
}

// More than ten names take several requests (SSM's per-call limit).
func TestLoadBatches(t *testing.T) {
	t.Parallel()
	f := &fakeSSM{params: map[string]param{}}
	var secrets []ssmsecrets.Secret
	for i := range 12 {
		name := "/p/" + string(rune('a'+i))
		f.params[name] = param{Value: "v" + name, Type: "SecureString"}
		secrets = append(secrets, ssmsecrets.Secret{Label: name, Param: name})
	}
	got, err := ssmsecrets.Load(context.Background(), setup(t, f), secrets...)
	if err != nil {
		t.Fatal(err)
	}
	if got[11] != "v/p/l" {
		t.Fatalf("last value = %q", got[11])
	}
	calls := f.calls()
	if len(calls) != 2 || len(calls[0].Names) != 10 || len(calls[1].Names) != 2 {
		t.Fatalf("calls = %+v, want batches of 10 and 2", calls)
	}
}

// Issue 19: the tools file may live in one SSM parameter (AGENT_TOOLS_FILE=ssm:<name>): ReadParameter reads it
// whole with decryption, a String or a SecureString alike, in one GetParameter request; a missing parameter is
// CodeMissing naming it (the cold start says what to create), a refused read CodeUnavailable.
func TestReadParameter(t *testing.T) {
	t.Parallel()
	params := map[string]param{
		"/agentloop/tools":        {Value: "httpTools: []\n", Type: "String"},
		"/agentloop/tools-secure": {Value: `{"httpTools": []}`, Type: "SecureString"},
	}
	tests := []struct {
		name     string
		fake     *fakeSSM
		param    string
		want     string
		wantKind agent.Kind
		wantCode string // "" when it reads
	}{
		{name: "String", fake: &fakeSSM{params: params}, param: "/agentloop/tools", want: "httpTools: []\n"},
		{name: "SecureString decrypted", fake: &fakeSSM{params: params}, param: "/agentloop/tools-secure", want: `{"httpTools": []}`},
		{name: "missing", fake: &fakeSSM{params: params}, param: "/agentloop/gone", wantKind: agent.KindInternal, wantCode: ssmsecrets.CodeMissing},
		{name: "access denied", fake: &fakeSSM{status: http.StatusBadRequest}, param: "/agentloop/tools",
			wantKind: agent.KindUnavailable, wantCode: ssmsecrets.CodeUnavailable},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got, err := ssmsecrets.ReadParameter(context.Background(), setup(t, tt.fake), tt.param)
			if tt.wantCode == "" {
				if err != nil || got != tt.want {
					t.Fatalf("ReadParameter = %q, %v; want %q", got, err, tt.want)
				}
				calls := tt.fake.calls()
				if len(calls) != 1 || calls[0].Target != "AmazonSSM.GetParameter" || calls[0].Name != tt.param || !calls[0].WithDecryption {
					t.Fatalf("requests %+v, want one GetParameter of %s WithDecryption", calls, tt.param)
				}
				return
			}
			if agent.KindOf(err) != tt.wantKind || agent.CodeOf(err) != tt.wantCode || !strings.Contains(fmt.Sprint(err), tt.param) {
				t.Fatalf("err = %v (kind %v, code %s), want kind %v code %s naming %s", err, agent.KindOf(err), agent.CodeOf(err), tt.wantKind, tt.wantCode, tt.param)
			}
			var missing ssmsecrets.MissingParams
			if errors.As(err, &missing) != (tt.wantCode == ssmsecrets.CodeMissing) || (missing != nil && !slices.Equal(missing, ssmsecrets.MissingParams{tt.param})) {
				t.Fatalf("err = %v: MissingParams %v, want [%s] exactly when the parameter is missing", err, missing, tt.param)
			}
		})
	}
	if _, err := ssmsecrets.ReadParameter(context.Background(), nil, "/p"); err == nil {
		t.Fatal("a parameter without a client must fail")
	}
}
