package sdkhttp

import (
	"bytes"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
)

// closingBody behaves as smithy-go's safe body: once closed (the SDK closes it when Do returns), WriteTo says
// io.EOF as an error and Read says io.EOF. Its reads past the request's bytes wait for that close, so the
// transport's check for extra body bytes always comes after it, as it does in the race under load.
type closingBody struct {
	r      *bytes.Reader
	closed chan struct{}
	once   sync.Once
	after  chan struct{} // closed once a read or WriteTo past the end has answered
}

func (b *closingBody) Read(p []byte) (int, error) {
	if b.r.Len() > 0 {
		return b.r.Read(p)
	}
	<-b.closed
	b.answered()
	return 0, io.EOF
}

func (b *closingBody) WriteTo(w io.Writer) (int64, error) {
	<-b.closed
	b.answered()
	return 0, io.EOF
}

func (b *closingBody) answered() {
	select {
	case <-b.after:
	default:
		close(b.after)
	}
}

func (b *closingBody) Close() error { b.once.Do(func() { close(b.closed) }); return nil }

// TestResponseSurvivesBodyClosedAfterDo: the response is read whole although the request body was closed as
// soon as Do returned, before the transport finished writing the request. Without Wrap the transport's write
// loop gets io.EOF from WriteTo and closes the connection under the response.
func TestResponseSurvivesBodyClosedAfterDo(t *testing.T) {
	t.Parallel()
	for i := range 20 {
		proceed := make(chan struct{})
		srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if b, _ := io.ReadAll(io.LimitReader(r.Body, r.ContentLength)); string(b) != "hello" {
				t.Errorf("request body %q", b)
			}
			w.WriteHeader(http.StatusOK)
			w.(http.Flusher).Flush()
			select {
			case <-proceed:
				_, _ = io.WriteString(w, "the whole answer")
			case <-r.Context().Done():
			}
		}))
		body := &closingBody{r: bytes.NewReader([]byte("hello")), closed: make(chan struct{}), after: make(chan struct{})}
		req, _ := http.NewRequest(http.MethodPost, srv.URL, body)
		req.ContentLength = 5
		// Without Wrap this fails on the first request: "use of closed network connection".
		d := Wrap(&http.Client{Transport: &http.Transport{}})
		res, err := d.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		body.Close() // as smithy-go does once Do returns
		<-body.after // the transport's check for extra bytes has its answer
		close(proceed)
		got, err := io.ReadAll(res.Body)
		res.Body.Close()
		srv.Close()
		if err != nil || string(got) != "the whole answer" {
			t.Fatalf("request %d: response %q, %v", i, got, err)
		}
	}
}
