package boot

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/ssmsecrets"
	"github.com/agentloop/agentloop/lib/webhooks/webhookstest"
)

// A function that names the webhook secret gets completion signals; the secret's SSM parameter is read only when
// AGENT_WEBHOOK_URL is set (a stack without a webhook needs no such parameter), and a function that names no
// webhook secret (the sub-agent task) gets none.
func TestLoadSignals(t *testing.T) {
	var mu sync.Mutex
	var asked []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var in struct{ Names []string }
		body, _ := io.ReadAll(r.Body)
		_ = json.Unmarshal(body, &in)
		mu.Lock()
		asked = append(asked, in.Names...)
		mu.Unlock()
		w.Header().Set("Content-Type", "application/x-amz-json-1.1")
		var params []map[string]any
		for _, n := range in.Names {
			params = append(params, map[string]any{"Name": n, "Type": "SecureString", "Value": webhookstest.Secret})
		}
		_ = json.NewEncoder(w).Encode(map[string]any{"Parameters": params, "InvalidParameters": []string{}})
	}))
	defer srv.Close()
	awsCfg := aws.Config{Region: "eu-west-1", BaseEndpoint: aws.String(srv.URL),
		Credentials: credentials.NewStaticCredentialsProvider("k", "s", "")}
	load := func(env map[string]string, named bool) (Base, error) {
		return Load(context.Background(), func(k string) string { return env[k] }, awsCfg, slog.New(slog.DiscardHandler),
			func(cfg config.Config) Secrets {
				if !named {
					return Secrets{}
				}
				return Secrets{Webhook: &ssmsecrets.Secret{Param: cfg.WebhookSecretParam, Fallback: cfg.WebhookSecret}}
			})
	}
	base := map[string]string{"TABLE_NAME": "t", "AGENT_WEBHOOK_SECRET_PARAM": "/agentloop/webhook-secret"}
	b, err := load(base, true)
	if err != nil || b.Signals == nil || len(asked) != 0 {
		t.Fatalf("no webhook: signals %v, err %v, SSM asked for %v; want signals (EventBridge) and no SSM read", b.Signals, err, asked)
	}
	withURL := map[string]string{"AGENT_WEBHOOK_URL": "https://hooks.example.com/agentloop"}
	for k, v := range base {
		withURL[k] = v
	}
	if b, err = load(withURL, true); err != nil || b.Signals == nil || strings.Join(asked, ",") != "/agentloop/webhook-secret" {
		t.Fatalf("with a webhook: signals %v, err %v, SSM asked for %v; want the secret's parameter read", b.Signals, err, asked)
	}
	if b, err = load(withURL, false); err != nil || b.Signals != nil {
		t.Fatalf("a function naming no webhook secret: signals %v, err %v; want none", b.Signals, err)
	}
	off := map[string]string{"AGENT_SIGNALS": "off"}
	for k, v := range withURL {
		off[k] = v
	}
	if b, err = load(off, true); err != nil || b.Signals != nil {
		t.Fatalf("AGENT_SIGNALS=off: signals %v, err %v; want none", b.Signals, err)
	}
}
