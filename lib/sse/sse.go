// Package sse reads a text/event-stream body (server-sent events) one event's data at a time, for the model
// adapters whose providers stream that way (lib/openai, lib/openairesponses, lib/anthropic): lines split at \n
// (one \r before it dropped) as bufio.ScanLines splits them, data lines joined with newlines (each followed by
// one), an event ending at an empty line; comments, event names, ids and retry hints ignored; a last event
// without its empty line dropped. What a data line means (a [DONE] sentinel, JSON) is the adapter's to read.
//
// It reads through a small buffer of its own (ReadBuffer: most events are far shorter, a longer line is
// gathered, and a server holds one per streaming reply) and says whether the next event is already in it
// (Ready), so that an adapter can tell the engine more is at hand before it waits on the provider.
package sse

import (
	"bufio"
	"bytes"
	"io"
)

// MaxLine bounds one line of a stream (32 MB: a tool call's arguments can come whole in one event, and a
// reasoning item's encrypted content is long). A longer line ends the stream with bufio.ErrTooLong.
const MaxLine = 32 << 20

// ReadBuffer is the size of a Reader's read buffer.
const ReadBuffer = 1 << 10

// Reader reads the events of one body. It is not safe for concurrent use.
type Reader struct {
	body io.ReadCloser
	r    *bufio.Reader
	line []byte // a line longer than the read buffer, gathered
	data []byte // the event's data lines
	done bool
	err  error
}

// NewReader returns a Reader of body.
func NewReader(body io.ReadCloser) *Reader {
	return &Reader{body: body, r: bufio.NewReaderSize(body, ReadBuffer)}
}

// Next returns the next event's data, valid until the next call; ok is false at the end of the body or on an
// error (Err).
func (s *Reader) Next() (data []byte, ok bool) {
	if s.done {
		return nil, false
	}
	s.data = s.data[:0]
	for {
		line, err := s.readLine()
		if err != nil {
			s.done = true
			if err != io.EOF {
				s.err = err
			}
			return nil, false
		}
		if len(line) == 0 {
			if len(s.data) > 0 {
				return s.data, true
			}
			continue
		}
		name, value, _ := bytes.Cut(line, []byte(":"))
		if string(name) != "data" {
			continue // comments, event names, ids, retry hints
		}
		value = bytes.TrimPrefix(value, []byte(" "))
		s.data = append(append(s.data, value...), '\n')
	}
}

// readLine returns the next line without its \n (and one \r before it), valid until the next call, as
// bufio.ScanLines splits them (the last line of a body that does not end in \n too); io.EOF once the body has
// ended.
func (s *Reader) readLine() ([]byte, error) {
	line, err := s.r.ReadSlice('\n')
	if err == bufio.ErrBufferFull {
		s.line = append(s.line[:0], line...)
		for err == bufio.ErrBufferFull {
			line, err = s.r.ReadSlice('\n')
			if len(s.line)+len(line) > MaxLine {
				return nil, bufio.ErrTooLong
			}
			s.line = append(s.line, line...)
		}
		line = s.line
	}
	if err != nil && (err != io.EOF || len(line) == 0) {
		return nil, err
	}
	line = bytes.TrimSuffix(line, []byte("\n"))
	return bytes.TrimSuffix(line, []byte("\r")), nil
}

// Ready reports whether the next event with data is wholly in the read buffer (or the stream is over), so that
// Next will not wait for the provider.
func (s *Reader) Ready() bool {
	if s.done {
		return true
	}
	b, _ := s.r.Peek(s.r.Buffered())
	data := false
	for {
		i := bytes.IndexByte(b, '\n')
		if i < 0 {
			return false
		}
		line := bytes.TrimSuffix(b[:i], []byte("\r"))
		b = b[i+1:]
		if len(line) == 0 {
			if data {
				return true
			}
			continue
		}
		if name, _, _ := bytes.Cut(line, []byte(":")); string(name) == "data" {
			data = true
		}
	}
}

// Err is the error that ended the stream, nil at the end of the body.
func (s *Reader) Err() error { return s.err }

// Close closes the body.
func (s *Reader) Close() error { return s.body.Close() }
