package dynamo

import (
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
)

// item is one DynamoDB item as the SDK represents it.
type item = map[string]types.AttributeValue

// tsLayout formats every stored timestamp: fixed width (nanoseconds always printed, always UTC), so string order is
// time order. That lets timestamps serve as GSI sort keys and in `<` conditions.
const tsLayout = "2006-01-02T15:04:05.000000000Z07:00"

func fmtTime(t time.Time) string { return t.UTC().Format(tsLayout) }

func parseTime(s string) time.Time {
	t, err := time.Parse(tsLayout, s)
	if err != nil {
		return time.Time{}
	}
	return t.UTC()
}

func avS(s string) types.AttributeValue  { return &types.AttributeValueMemberS{Value: s} }
func avB(b []byte) types.AttributeValue  { return &types.AttributeValueMemberB{Value: b} }
func avBool(b bool) types.AttributeValue { return &types.AttributeValueMemberBOOL{Value: b} }
func avN(n int64) types.AttributeValue {
	return &types.AttributeValueMemberN{Value: strconv.FormatInt(n, 10)}
}
func avT(t time.Time) types.AttributeValue { return avS(fmtTime(t)) }

func getS(it item, name string) string {
	if v, ok := it[name].(*types.AttributeValueMemberS); ok {
		return v.Value
	}
	return ""
}

func getN(it item, name string) int64 {
	if v, ok := it[name].(*types.AttributeValueMemberN); ok {
		n, err := strconv.ParseInt(v.Value, 10, 64)
		if err == nil {
			return n
		}
	}
	return 0
}

func getBool(it item, name string) bool {
	if v, ok := it[name].(*types.AttributeValueMemberBOOL); ok {
		return v.Value
	}
	return false
}

func getT(it item, name string) time.Time {
	s := getS(it, name)
	if s == "" {
		return time.Time{}
	}
	return parseTime(s)
}

func has(it item, name string) bool {
	_, ok := it[name]
	return ok
}

// ItemSize computes the size DynamoDB charges an item against its 400 KB limit: for every attribute the UTF-8
// length of its name plus the size of its value (strings by UTF-8 length, binaries by length, numbers by roughly
// one byte per two significant digits plus one, booleans and nulls one byte, maps and lists three bytes plus one
// per element plus their contents). It is an upper-bound estimate, close enough to guard writes and to assert in
// tests that no item comes near the limit.
func ItemSize(it map[string]types.AttributeValue) int {
	n := 0
	for name, v := range it {
		n += len(name) + valueSize(v)
	}
	return n
}

func valueSize(v types.AttributeValue) int {
	switch v := v.(type) {
	case *types.AttributeValueMemberS:
		return len(v.Value)
	case *types.AttributeValueMemberB:
		return len(v.Value)
	case *types.AttributeValueMemberN:
		return numberSize(v.Value)
	case *types.AttributeValueMemberBOOL, *types.AttributeValueMemberNULL:
		return 1
	case *types.AttributeValueMemberSS:
		n := 0
		for _, s := range v.Value {
			n += len(s)
		}
		return n
	case *types.AttributeValueMemberNS:
		n := 0
		for _, s := range v.Value {
			n += numberSize(s)
		}
		return n
	case *types.AttributeValueMemberBS:
		n := 0
		for _, b := range v.Value {
			n += len(b)
		}
		return n
	case *types.AttributeValueMemberM:
		n := 3
		for k, e := range v.Value {
			n += 1 + len(k) + valueSize(e)
		}
		return n
	case *types.AttributeValueMemberL:
		n := 3
		for _, e := range v.Value {
			n += 1 + valueSize(e)
		}
		return n
	default:
		return 0
	}
}

func numberSize(s string) int {
	digits := 0
	for _, r := range s {
		if r >= '0' && r <= '9' {
			digits++
		}
	}
	return (digits+1)/2 + 1
}

// truncateUTF8 cuts s to at most max bytes without splitting a rune.
func truncateUTF8(s string, max int) string {
	if len(s) <= max {
		return s
	}
	s = s[:max]
	// A cut inside a multi-byte rune leaves up to UTFMax-1 stray bytes at the end.
	for i := 0; i < utf8.UTFMax && len(s) > 0; i++ {
		r, size := utf8.DecodeLastRuneInString(s)
		if r != utf8.RuneError || size != 1 {
			break
		}
		s = s[:len(s)-1]
	}
	return s
}

// expr accumulates expression attribute names and values. Every attribute name goes through a placeholder, so
// DynamoDB's long list of reserved words (status, data, owner, role, ...) never bites.
type expr struct {
	names  map[string]string
	values map[string]types.AttributeValue
	byName map[string]string
}

func newExpr() *expr {
	return &expr{names: map[string]string{}, values: map[string]types.AttributeValue{}, byName: map[string]string{}}
}

// n returns the placeholder for attribute name a.
func (e *expr) n(a string) string {
	if p, ok := e.byName[a]; ok {
		return p
	}
	p := "#a" + strconv.Itoa(len(e.byName))
	e.byName[a] = p
	e.names[p] = a
	return p
}

// v returns a placeholder bound to value v.
func (e *expr) v(v types.AttributeValue) string {
	p := ":v" + strconv.Itoa(len(e.values))
	e.values[p] = v
	return p
}

func (e *expr) attrNames() map[string]string {
	if len(e.names) == 0 {
		return nil
	}
	return e.names
}

func (e *expr) attrValues() map[string]types.AttributeValue {
	if len(e.values) == 0 {
		return nil
	}
	return e.values
}
