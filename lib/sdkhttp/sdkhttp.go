// Package sdkhttp is the HTTP client wrapper every AWS SDK client here sends with (DynamoDB, Step Functions, SSM,
// Bedrock): it hides io.WriterTo on request bodies, which closes a race between smithy-go and net/http that
// breaks a response the caller has already begun to read.
//
// smithy-go (transport/http.ClientHandler) wraps a request body in a "safe" closer and closes it as soon as the
// HTTP client's Do returns the response headers. net/http's connection write loop may not have finished the
// request by then: after the ContentLength bytes it copies the rest of the body to io.Discard to check that
// nothing is left, and io.Copy uses the body's WriteTo, which smithy-go's closed body answers with io.EOF as an
// error (io.Copy passes WriteTo's error on as is). The write loop takes that for a failed request write and
// closes the connection, under the response: the caller's next read fails with "use of closed network
// connection". A server that answers as soon as it has the request (the offline model, dynalite) hits it about
// one request in fifty under load; it was seen as ConverseStream attempts failing before their first event.
// Through Read, the same closed body says io.EOF, which io.Copy takes as the end of the body, as it is.
package sdkhttp

import (
	"io"
	"net/http"
)

// Doer is the HTTP client an AWS SDK client sends with (the SDK's HTTPClient option).
type Doer interface {
	Do(*http.Request) (*http.Response, error)
}

// Wrap returns d sending every request with its body's io.WriterTo hidden (the package doc says why).
func Wrap(d Doer) Doer { return client{d} }

type client struct{ d Doer }

func (c client) Do(r *http.Request) (*http.Response, error) {
	if _, ok := r.Body.(io.WriterTo); ok {
		r = r.WithContext(r.Context()) // a shallow copy: the caller's request is not changed
		r.Body = readOnly{r.Body}
	}
	return c.d.Do(r)
}

// Unwrap is the client Wrap was given (to check its settings).
func (c client) Unwrap() Doer { return c.d }

// readOnly is a request body that offers Read and Close only.
type readOnly struct{ io.ReadCloser }
