package cfn

import (
	"reflect"
	"testing"
)

func TestParseExpandsShortTags(t *testing.T) {
	t.Parallel()
	doc, err := Parse([]byte(`
A: !Ref Table
B: !GetAtt Table.Arn
C: !Sub "${Table.Arn}/index/*"
D: !Condition IsProd
E: !If [IsProd, 1, 2]
F: !!str plain
`))
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]any
	if err := doc.Decode(&got); err != nil {
		t.Fatal(err)
	}
	want := map[string]any{
		"A": map[string]any{"Ref": "Table"},
		"B": map[string]any{"Fn::GetAtt": []any{"Table", "Arn"}},
		"C": map[string]any{"Fn::Sub": "${Table.Arn}/index/*"},
		"D": map[string]any{"Condition": "IsProd"},
		"E": map[string]any{"Fn::If": []any{"IsProd", 1, 2}},
		"F": "plain",
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("got %#v\nwant %#v", got, want)
	}
}
