package offline_test

import (
	"encoding/json"
	"math"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/agentloop/agentloop/lib/offline"
)

// POST /v1/embeddings answers deterministic unit vectors, one per input in order, in which the synonym table's
// words meet: "erase documents" is "delete file".
func TestEmbeddings(t *testing.T) {
	t.Parallel()
	srv := offline.New()
	hs := httptest.NewServer(srv)
	t.Cleanup(hs.Close)
	post := func(body string) (int, []([]float32)) {
		t.Helper()
		res, err := http.Post(hs.URL+"/v1/embeddings", "application/json", strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		defer res.Body.Close()
		var out struct {
			Data []struct {
				Index     int       `json:"index"`
				Embedding []float32 `json:"embedding"`
			} `json:"data"`
		}
		_ = json.NewDecoder(res.Body).Decode(&out)
		var vecs [][]float32
		for i, d := range out.Data {
			if d.Index != i {
				t.Fatalf("data[%d].index = %d", i, d.Index)
			}
			vecs = append(vecs, d.Embedding)
		}
		return res.StatusCode, vecs
	}
	status, vecs := post(`{"model":"m","input":["delete file","erase documents","weather"]}`)
	if status != http.StatusOK || len(vecs) != 3 || len(vecs[0]) != offline.EmbeddingDims {
		t.Fatalf("status %d, %d vectors", status, len(vecs))
	}
	dot := func(a, b []float32) (s float64) {
		for i := range a {
			s += float64(a[i]) * float64(b[i])
		}
		return s
	}
	if d := dot(vecs[0], vecs[1]); math.Abs(d-1) > 1e-6 {
		t.Errorf("delete file . erase documents = %v, want 1", d)
	}
	if d := dot(vecs[0], vecs[2]); d > 0.1 {
		t.Errorf("delete file . weather = %v, want about 0", d)
	}
	if _, again := post(`{"model":"m","input":"weather"}`); len(again) != 1 || dot(again[0], vecs[2]) < 1-1e-6 {
		t.Errorf("a string input: %v, want the same vector as before", again)
	}
	for _, bad := range []string{`{"input":["x"]}`, `{"model":"m","input":[]}`, `{"model":"m","input":3}`, `nope`} {
		if status, _ := post(bad); status != http.StatusBadRequest {
			t.Errorf("%s: status %d, want 400", bad, status)
		}
	}
	if req, in := srv.Embedded(); req != 2 || in != 4 {
		t.Errorf("Embedded() = %d, %d, want 2 requests of 4 inputs", req, in)
	}
}
