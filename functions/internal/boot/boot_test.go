package boot

import (
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"

	"github.com/agentloop/agentloop/lib/config"
	"github.com/agentloop/agentloop/lib/dynamo"
	"github.com/agentloop/agentloop/lib/sdkhttp"
)

// The production DynamoDB client has HTTP timeouts (REVIEW D3): a request on a dead connection fails within
// them instead of waiting for the kernel, long past the claim's horizon. AGENT_STORE_TIMEOUT overrides the
// request timeout.
func TestDynamoClientHasTimeouts(t *testing.T) {
	for _, tc := range []struct {
		env  time.Duration
		want time.Duration
	}{{0, dynamo.DefaultRequestTimeout}, {3 * time.Second, 3 * time.Second}} {
		c := dynamoClient(aws.Config{Region: "eu-west-1"}, config.Config{StoreTimeout: tc.env})
		w, ok := c.Options().HTTPClient.(interface{ Unwrap() sdkhttp.Doer }) // sends through sdkhttp
		if !ok {
			t.Fatalf("HTTP client %T, want sdkhttp's wrapper", c.Options().HTTPClient)
		}
		hc, ok := w.Unwrap().(*awshttp.BuildableClient)
		if !ok {
			t.Fatalf("HTTP client %T, want the SDK's buildable client with timeouts", c.Options().HTTPClient)
		}
		if got := hc.GetTimeout(); got != tc.want {
			t.Fatalf("request timeout %s, want %s", got, tc.want)
		}
		if got := hc.GetTransport().ResponseHeaderTimeout; got <= 0 || got > tc.want {
			t.Fatalf("response header timeout %s, want within (0, %s]", got, tc.want)
		}
	}
}
