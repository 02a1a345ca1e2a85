package anthropic

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/aws/protocol/eventstream"
	awsconfig "github.com/aws/aws-sdk-go-v2/config"
)

// Bedrock's InvokeModelWithResponseStream, by hand: POST {endpoint}/model/{modelId}/invoke-with-response-stream,
// the Messages body with anthropic_version (no model, no stream), signed with SigV4 (service "bedrock") from
// the AWS configuration's credentials. The answer is AWS's event stream (application/vnd.amazon.eventstream):
// each "chunk" event's payload is {"bytes": base64 of one Messages event's JSON}; an exception message (a
// throttlingException, say) ends the stream as Anthropic's error event would.

// bedrockService is the SigV4 signing name of Bedrock's runtime.
const bedrockService = "bedrock"

// bedrockEndpoint is Bedrock's runtime endpoint in region.
func bedrockEndpoint(region string) string {
	return "https://bedrock-runtime." + region + ".amazonaws.com"
}

// loadAWS is Config.AWS, or the default AWS configuration, in Config.Region when set.
func loadAWS(cfg Config) (aws.Config, error) {
	if cfg.AWS != nil {
		c := cfg.AWS.Copy()
		if cfg.Region != "" {
			c.Region = cfg.Region
		}
		return c, nil
	}
	var load []func(*awsconfig.LoadOptions) error
	if cfg.Region != "" {
		load = append(load, awsconfig.WithRegion(cfg.Region))
	}
	return awsconfig.LoadDefaultConfig(context.Background(), load...)
}

// bedrockURL is the InvokeModelWithResponseStream URL of model at endpoint (a base URL; its path a prefix). The
// model id is escaped as the AWS SDK escapes a path label (every byte but the unreserved ones: "a:0" is
// "a%3A0", an inference profile's ARN keeps no slash).
func bedrockURL(endpoint, model string) (*url.URL, error) {
	u, err := url.Parse(endpoint)
	if err != nil {
		return nil, err
	}
	if u.Scheme == "" || u.Host == "" {
		return nil, fmt.Errorf("the Bedrock endpoint %q is not an absolute URL", endpoint)
	}
	prefix := strings.TrimSuffix(u.Path, "/")
	raw := strings.TrimSuffix(u.EscapedPath(), "/")
	u.Path = prefix + "/model/" + model + "/invoke-with-response-stream"
	u.RawPath = raw + "/model/" + escapeLabel(model) + "/invoke-with-response-stream"
	return u, nil
}

func escapeLabel(s string) string {
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '-' || c == '_' || c == '.' || c == '~' {
			b.WriteByte(c)
			continue
		}
		fmt.Fprintf(&b, "%%%02X", c)
	}
	return b.String()
}

// errNoCredentials is a Bedrock request without AWS credentials to sign it with.
var errNoCredentials = errors.New("no AWS credentials to sign the Bedrock request with")

// signBedrock signs req (whose body is body) with SigV4 for Bedrock in the configuration's region.
func (m *Model) signBedrock(ctx context.Context, req *http.Request, body []byte) error {
	if m.aws.Credentials == nil {
		return errNoCredentials
	}
	creds, err := m.aws.Credentials.Retrieve(ctx)
	if err != nil {
		return fmt.Errorf("%w: %w", errNoCredentials, err)
	}
	sum := sha256.Sum256(body)
	return m.signer.SignHTTP(ctx, creds, req, hex.EncodeToString(sum[:]), bedrockService, m.aws.Region, time.Now())
}

// openBedrock sends the request to Bedrock and returns its event stream, or its error answer (*apiError), or the
// transport's error.
func (m *Model) openBedrock(ctx context.Context, model string, body []byte) (eventReader, error) {
	u, err := bedrockURL(m.endpoint, model)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, u.String(), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.URL = u // keep the escaping of the model id (String and Parse would agree, but say it)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Amzn-Bedrock-Accept", "application/json")
	if err := m.signBedrock(ctx, req, body); err != nil {
		return nil, err
	}
	res, err := m.cfg.HTTPClient.Do(req)
	if err != nil {
		return nil, err
	}
	if res.StatusCode >= 400 {
		defer res.Body.Close()
		return nil, readAPIError(res)
	}
	return &bedrockStream{body: res.Body, dec: eventstream.NewDecoder()}, nil
}

// bedrockStream reads Bedrock's event stream: each chunk's Messages event JSON, in order.
type bedrockStream struct {
	body    io.ReadCloser
	dec     *eventstream.Decoder
	payload []byte
	data    []byte
	done    bool
	err     error
}

// maxChunk bounds one event-stream message's payload buffer kept between reads.
const maxChunk = 1 << 20

func (s *bedrockStream) Next() ([]byte, bool) {
	for !s.done {
		msg, err := s.dec.Decode(s.body, s.payload[:0])
		if err != nil {
			s.done = true
			if !errors.Is(err, io.EOF) {
				s.err = err
			}
			return nil, false
		}
		if cap(msg.Payload) <= maxChunk {
			s.payload = msg.Payload
		}
		switch header(msg, ":message-type") {
		case "event":
			if header(msg, ":event-type") != "chunk" {
				continue // an event this adapter does not read
			}
			var chunk struct {
				Bytes string `json:"bytes"`
			}
			if err := json.Unmarshal(msg.Payload, &chunk); err != nil {
				s.done, s.err = true, fmt.Errorf("a malformed Bedrock chunk: %w", err)
				return nil, false
			}
			n := base64.StdEncoding.DecodedLen(len(chunk.Bytes))
			if cap(s.data) < n {
				s.data = make([]byte, n)
			}
			n, err := base64.StdEncoding.Decode(s.data[:n], []byte(chunk.Bytes))
			if err != nil {
				s.done, s.err = true, fmt.Errorf("a malformed Bedrock chunk: %w", err)
				return nil, false
			}
			return s.data[:n], true
		case "exception":
			var body struct {
				Message string `json:"message"`
			}
			_ = json.Unmarshal(msg.Payload, &body)
			s.done, s.err = true, &streamError{Type: header(msg, ":exception-type"), Message: body.Message}
			return nil, false
		case "error":
			s.done, s.err = true, &streamError{Type: header(msg, ":error-code"), Message: header(msg, ":error-message")}
			return nil, false
		}
	}
	return nil, false
}

func header(msg eventstream.Message, name string) string {
	if v := msg.Headers.Get(name); v != nil {
		return v.String()
	}
	return ""
}

// Ready is false unless the stream is over: a message is read from the body whole, never from a buffer.
func (s *bedrockStream) Ready() bool { return s.done }

func (s *bedrockStream) Err() error   { return s.err }
func (s *bedrockStream) Close() error { return s.body.Close() }
