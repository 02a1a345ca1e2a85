package dynamo

import (
	"bytes"
	"compress/gzip"
	"context"
	"errors"
	"fmt"
	"io"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"

	"github.com/agentloop/agentloop/lib/agent"
)

// Large values (message bodies, segment data, KV values) go through one scheme, described in the package doc:
// inline when small, gzipped when larger, and split into chunk items written before the head that points at them
// when even the compressed form would not fit one item.

const (
	defaultCompressAbove = 32 * 1024
	defaultChunkBytes    = 300 * 1024
	// maxChunkBytes caps WithBlobLimits: a chunk item carries its keys and a few small attributes besides the
	// data, and the whole item must stay under MaxItemBytes.
	maxChunkBytes = 350 * 1024

	attrBody   = "body"   // inline payload: S (raw UTF-8 text) or B (bytes, or gzip when enc is set)
	attrEnc    = "enc"    // "gzip" or "deflate" when the payload (inline or chunked) is compressed; absent when raw
	attrVer    = "ver"    // chunked only: version id naming this payload's chunk items
	attrChunks = "chunks" // chunked only: number of chunk items
	attrData   = "data"   // on chunk items: one slice of the payload
	attrKind   = "kind"   // item type tag, for humans reading the table and for DeleteThread

	encGzip = "gzip"
	// encDeflate is a raw DEFLATE stream (RFC 1951) of a value at most maxInflated bytes long: stream segments
	// (segments.go's packSegment), compressed at any size where it makes the item smaller.
	encDeflate = "deflate"
	// maxInflated bounds what one deflate payload may inflate to: no writer deflates a longer value, so a payload
	// that inflates past it is corrupt (or hostile) and is refused before it can take more memory.
	maxInflated = MaxItemBytes
)

type blobLimits struct {
	compressAbove int
	chunkBytes    int
}

// chunkKeyFunc names chunk n of payload version ver.
type chunkKeyFunc func(ver string, n int) string

// packed is a value laid out for storage: attrs go on the head item, chunks (complete items) must be written
// before the head.
type packed struct {
	attrs  item
	chunks []item
	ver    string
}

// pack lays data out under partition pk. text stores small valid UTF-8 as a string attribute, readable in the
// console. extra attributes (the TTL) are copied onto every chunk item so chunks expire with their head.
func (s *Store) pack(data []byte, text bool, pk string, chunkSK chunkKeyFunc, extra item) (packed, error) {
	return s.packWith(s.blob, data, text, pk, chunkSK, extra)
}

// packWith is pack under other limits (an interrupt holds two values in one head, so each gets less room).
func (s *Store) packWith(lim blobLimits, data []byte, text bool, pk string, chunkSK chunkKeyFunc, extra item) (packed, error) {
	if len(data) <= lim.compressAbove {
		p := packed{attrs: item{}}
		if text && utf8.Valid(data) {
			p.attrs[attrBody] = avS(string(data))
		} else {
			p.attrs[attrBody] = avB(data)
		}
		return p, nil
	}
	var buf bytes.Buffer
	zw := gzip.NewWriter(&buf)
	if _, err := zw.Write(data); err != nil {
		return packed{}, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "gzip")
	}
	if err := zw.Close(); err != nil {
		return packed{}, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "gzip")
	}
	// Incompressible data (already compressed, random) is stored raw rather than grown by gzip framing.
	if buf.Len() < len(data) {
		return s.layout(lim, buf.Bytes(), encGzip, pk, chunkSK, extra), nil
	}
	return s.layout(lim, data, "", pk, chunkSK, extra), nil
}

// layout places an encoded payload (enc "" for raw bytes): inline in body when it is at most lim.chunkBytes, else
// in chunk items.
func (s *Store) layout(lim blobLimits, payload []byte, enc string, pk string, chunkSK chunkKeyFunc, extra item) packed {
	p := packed{attrs: item{}}
	if enc != "" {
		p.attrs[attrEnc] = avS(enc)
	}
	if len(payload) <= lim.chunkBytes {
		p.attrs[attrBody] = avB(payload)
		return p
	}
	p.ver = s.ids.New("v")
	n := 0
	for off := 0; off < len(payload); off += lim.chunkBytes {
		end := min(off+lim.chunkBytes, len(payload))
		c := key(pk, chunkSK(p.ver, n))
		c[attrKind] = avS("chunk")
		c[attrData] = avB(payload[off:end])
		for k, v := range extra {
			c[k] = v
		}
		p.chunks = append(p.chunks, c)
		n++
	}
	p.attrs[attrVer] = avS(p.ver)
	p.attrs[attrChunks] = avN(int64(n))
	return p
}

// writeChunks stores p's chunk items (a no-op for inline values).
func (s *Store) writeChunks(ctx context.Context, p packed) error {
	if len(p.chunks) == 0 {
		return nil
	}
	reqs := make([]types.WriteRequest, len(p.chunks))
	for i, c := range p.chunks {
		reqs[i] = putReq(c)
	}
	return s.batchWrite(ctx, reqs)
}

// chunkKeys lists the chunk item keys a head item points at; nil for inline values.
func chunkKeys(head item, pk string, chunkSK chunkKeyFunc) []item {
	ver := getS(head, attrVer)
	if ver == "" {
		return nil
	}
	n := int(getN(head, attrChunks))
	keys := make([]item, n)
	for i := range n {
		keys[i] = key(pk, chunkSK(ver, i))
	}
	return keys
}

// dropChunks deletes the chunks old pointed at unless they are the ones now current (ver). It runs after the
// head was switched, so readers never lose a payload they can reach; a failure only leaves garbage behind that
// DeleteThread (or the TTL, for segments) removes, so it is logged and not returned.
func (s *Store) dropChunks(ctx context.Context, old item, pk string, chunkSK chunkKeyFunc, ver string) {
	if len(old) == 0 || getS(old, attrVer) == "" || getS(old, attrVer) == ver {
		return
	}
	keys := chunkKeys(old, pk, chunkSK)
	reqs := make([]types.WriteRequest, len(keys))
	for i, k := range keys {
		reqs[i] = deleteReq(k)
	}
	if err := s.batchWrite(ctx, reqs); err != nil {
		s.log.WarnContext(ctx, "dynamo: dropping superseded chunks failed", "pk", pk, "ver", getS(old, attrVer), "err", err)
	}
}

// errTornRead says a head pointed at chunks that are gone: a writer replaced the value between our reads of the
// head and of its chunks. The caller re-reads the head; one that gives up returns it wrapped by tornRead. (A plain
// sentinel, not an *agent.Error: those match by code, and every unavailable error shares this one's.)
var errTornRead = errors.New("dynamo: value replaced while reading")

// tornRead is what a reader returns when the value kept changing under it: a retry may pass.
func tornRead(what string) error {
	return agent.Wrap(errTornRead, agent.KindUnavailable, agent.CodeStoreUnavailable, what+" kept changing while read")
}

// unpack returns the value a head holds. chunks holds prefetched chunk items (see batchGet); nil fetches them.
func (s *Store) unpack(ctx context.Context, head item, pk string, chunkSK chunkKeyFunc, chunks map[string]item) ([]byte, error) {
	var payload []byte
	if keys := chunkKeys(head, pk, chunkSK); keys != nil {
		if chunks == nil {
			got, err := s.batchGet(ctx, keys)
			if err != nil {
				return nil, err
			}
			chunks = got
		}
		for _, k := range keys {
			c, ok := chunks[itemKey(k)]
			if !ok {
				return nil, errTornRead
			}
			b, _ := c[attrData].(*types.AttributeValueMemberB)
			if b == nil {
				return nil, agent.E(agent.KindInternal, agent.CodeStoreCorrupt, "chunk %s has no data", getS(k, AttrSK))
			}
			payload = append(payload, b.Value...)
		}
	} else {
		switch v := head[attrBody].(type) {
		case *types.AttributeValueMemberS:
			payload = []byte(v.Value)
		case *types.AttributeValueMemberB:
			payload = v.Value
		case nil:
			payload = []byte{}
		default:
			return nil, agent.E(agent.KindInternal, agent.CodeStoreCorrupt, "item %s: body has type %T", getS(head, AttrSK), v)
		}
	}
	switch getS(head, attrEnc) {
	case encGzip:
	case encDeflate:
		return s.inflate(payload, getS(head, AttrSK))
	default:
		return payload, nil
	}
	zr, err := gzip.NewReader(bytes.NewReader(payload))
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "gunzip "+getS(head, AttrSK))
	}
	out, err := io.ReadAll(zr)
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "gunzip "+getS(head, AttrSK))
	}
	return out, nil
}

// blobAttrs are the head attributes the scheme owns; an upsert removes the ones the new layout does not use.
var blobAttrs = [...]string{attrBody, attrEnc, attrVer, attrChunks}

// chunkSuffix is the common tail of every chunk sort key: "#<ver>#<n>". ver and n never contain '#', so the
// key parses unambiguously from the right whatever the id before it holds.
func chunkSuffix(ver string, n int) string {
	return "#" + ver + "#" + fmt.Sprintf("%04d", n)
}

func msgChunkSK(id string) chunkKeyFunc {
	return func(ver string, n int) string { return prefixMsgPart + id + chunkSuffix(ver, n) }
}

func segChunkSK(seq int64) chunkKeyFunc {
	return func(ver string, n int) string { return prefixSegPart + padSeq(seq) + chunkSuffix(ver, n) }
}

func intChunkSK(id string) chunkKeyFunc {
	return func(ver string, n int) string { return prefixIntPart + id + chunkSuffix(ver, n) }
}

func jobChunkSK(id string) chunkKeyFunc {
	return func(ver string, n int) string { return prefixJobPart + id + chunkSuffix(ver, n) }
}

func queueChunkSK(messageID string) chunkKeyFunc {
	return func(ver string, n int) string { return prefixQPart + messageID + chunkSuffix(ver, n) }
}

func valChunkSK(k string) chunkKeyFunc {
	return func(ver string, n int) string { return prefixValPart + k + chunkSuffix(ver, n) }
}

// readAll unpacks many heads of one partition with one batched read of all their chunks, re-reading (via
// reread) the heads whose chunks were replaced under us.
func (s *Store) readAll(ctx context.Context, heads []item, pk string, chunkSK func(head item) chunkKeyFunc,
	reread func(ctx context.Context, head item) (item, error)) ([][]byte, error) {
	var keys []item
	for _, h := range heads {
		keys = append(keys, chunkKeys(h, pk, chunkSK(h))...)
	}
	chunks := map[string]item{}
	if len(keys) > 0 {
		got, err := s.batchGet(ctx, keys)
		if err != nil {
			return nil, err
		}
		chunks = got
	}
	out := make([][]byte, len(heads))
	for i, h := range heads {
		b, err := s.unpack(ctx, h, pk, chunkSK(h), chunks)
		for attempt := 0; errors.Is(err, errTornRead) && attempt < 5; attempt++ {
			h, err = reread(ctx, h)
			if err != nil {
				return nil, err
			}
			if h == nil {
				// Deleted meanwhile: report it as empty; the caller drops nil heads.
				break
			}
			heads[i] = h
			b, err = s.unpack(ctx, h, pk, chunkSK(h), nil)
		}
		if errors.Is(err, errTornRead) {
			return nil, tornRead(getS(h, AttrSK))
		}
		if err != nil {
			return nil, err
		}
		if h == nil {
			heads[i] = nil
			continue
		}
		out[i] = b
	}
	return out, nil
}
