package dynamo

import (
	"bytes"
	"compress/flate"
	"io"
	"sync"

	"github.com/agentloop/agentloop/lib/agent"
)

// Stream segments are deflated (encDeflate) when that makes their item smaller. A segment is flushed every 500 ms
// per running run, so the compressor state (1.2 MB for a flate.Writer, 40 KB for a reader) is pooled per Store
// rather than allocated per segment.

// deflaters pools flate writers and readers. The zero value is ready to use.
type deflaters struct {
	writers sync.Pool // *flate.Writer at flate.BestSpeed
	readers sync.Pool // io.ReadCloser that is a flate.Resetter
}

// deflate returns data as a raw DEFLATE stream at flate.BestSpeed: the fastest level, and on the repetitive SSE
// frames of a stream segment it already shrinks 2 KB to about a fifth.
func (s *Store) deflate(data []byte) ([]byte, error) {
	var buf bytes.Buffer
	buf.Grow(len(data)/2 + 64)
	zw, _ := s.zip.writers.Get().(*flate.Writer)
	if zw == nil {
		var err error
		if zw, err = flate.NewWriter(&buf, flate.BestSpeed); err != nil {
			return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "deflate")
		}
	} else {
		zw.Reset(&buf)
	}
	if _, err := zw.Write(data); err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "deflate")
	}
	if err := zw.Close(); err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeInternal, "deflate")
	}
	s.zip.writers.Put(zw)
	return buf.Bytes(), nil
}

// inflate reverses deflate, refusing a payload that inflates past maxInflated or is not a complete DEFLATE stream
// as corrupt (KindInternal: clients see "internal error", the log the cause). sk names the item in the error.
func (s *Store) inflate(payload []byte, sk string) ([]byte, error) {
	src := bytes.NewReader(payload)
	zr, _ := s.zip.readers.Get().(io.ReadCloser)
	if zr == nil {
		zr = flate.NewReader(src)
	} else if err := zr.(flate.Resetter).Reset(src, nil); err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "inflate "+sk)
	}
	var out bytes.Buffer
	out.Grow(min(8*len(payload), maxInflated) + bytes.MinRead)
	n, err := out.ReadFrom(io.LimitReader(zr, maxInflated+1))
	if err != nil {
		return nil, agent.Wrap(err, agent.KindInternal, agent.CodeStoreCorrupt, "inflate "+sk)
	}
	if n > maxInflated {
		return nil, agent.E(agent.KindInternal, agent.CodeStoreCorrupt, "inflate %s: more than %d bytes", sk, maxInflated)
	}
	s.zip.readers.Put(zr)
	return out.Bytes(), nil
}
