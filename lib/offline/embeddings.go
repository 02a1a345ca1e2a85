package offline

import (
	"encoding/json"
	"hash/fnv"
	"io"
	"math"
	"net/http"
	"strings"
	"unicode"
)

// EmbeddingDims is the length of the offline model's embeddings.
const EmbeddingDims = 512

// concept is the concept the offline embeddings give a word, so that tests can tell a router's embedding
// fallback from its keywords: "remove" and "erase" land where "delete" does, though no keyword matches. Words
// not listed are their own concept.
func concept(w string) string {
	switch w {
	case "remove", "erase", "trash", "wipe", "discard":
		return "delete"
	case "document", "doc", "paper":
		return "file"
	case "forecast", "temperature", "rain", "sunny", "umbrella":
		return "weather"
	case "mail", "inbox":
		return "email"
	case "picture", "photo", "photograph":
		return "image"
	case "purchase", "order":
		return "buy"
	case "money", "dollar", "euro", "exchange":
		return "currency"
	case "plane", "airplane", "fly":
		return "flight"
	case "database", "query", "table":
		return "sql"
	case "meeting", "appointment", "schedule":
		return "calendar"
	}
	return w
}

// embeddingRequest is the body of POST /v1/embeddings (input: one string or an array of them).
type embeddingRequest struct {
	Model string          `json:"model"`
	Input json.RawMessage `json:"input"`
}

// embeddings answers POST /v1/embeddings: each input's deterministic vector (the words' concepts hashed into
// EmbeddingDims signed buckets, normalised to length 1; an input with no words is the zero vector).
func (s *Server) embeddings(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, MaxRequestBytes))
	if err != nil {
		writeError(w, http.StatusBadRequest, "read request body: "+err.Error())
		return
	}
	var req embeddingRequest
	if err := json.Unmarshal(body, &req); err != nil || req.Model == "" {
		writeError(w, http.StatusBadRequest, "want {model, input}: a model and a string or an array of strings")
		return
	}
	var inputs []string
	if err := json.Unmarshal(req.Input, &inputs); err != nil {
		var one string
		if err := json.Unmarshal(req.Input, &one); err != nil {
			writeError(w, http.StatusBadRequest, "input: want a string or an array of strings")
			return
		}
		inputs = []string{one}
	}
	if len(inputs) == 0 {
		writeError(w, http.StatusBadRequest, "input: empty array")
		return
	}
	s.embeddingRequests.Add(1)
	s.embeddedInputs.Add(int64(len(inputs)))
	type datum struct {
		Object    string    `json:"object"`
		Index     int       `json:"index"`
		Embedding []float32 `json:"embedding"`
	}
	out := struct {
		Object string         `json:"object"`
		Data   []datum        `json:"data"`
		Model  string         `json:"model"`
		Usage  map[string]int `json:"usage"`
	}{Object: "list", Model: req.Model}
	tokens := 0
	for i, in := range inputs {
		out.Data = append(out.Data, datum{Object: "embedding", Index: i, Embedding: Embedding(in)})
		tokens += len(strings.Fields(in))
	}
	out.Usage = map[string]int{"prompt_tokens": tokens, "total_tokens": tokens}
	writeJSON(w, http.StatusOK, out)
}

// Embedding is the offline model's embedding of text (what POST /v1/embeddings answers for it).
func Embedding(text string) []float32 {
	v := make([]float64, EmbeddingDims)
	for _, w := range strings.FieldsFunc(strings.ToLower(text), func(r rune) bool { return !unicode.IsLetter(r) && !unicode.IsDigit(r) }) {
		if len(w) > 3 && strings.HasSuffix(w, "s") && !strings.HasSuffix(w, "ss") {
			w = w[:len(w)-1]
		}
		w = concept(w)
		h := fnv.New64a()
		h.Write([]byte(w))
		sum := h.Sum64()
		sign := 1.0
		if sum>>63 == 1 {
			sign = -1
		}
		v[sum%EmbeddingDims] += sign
	}
	var norm float64
	for _, x := range v {
		norm += x * x
	}
	out := make([]float32, EmbeddingDims)
	if norm == 0 {
		return out
	}
	norm = math.Sqrt(norm)
	for i, x := range v {
		out[i] = float32(x / norm)
	}
	return out
}
